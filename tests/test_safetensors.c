/* tests/test_safetensors.c — safetensors: a round trip of every dtype through the writer and both
 * readers, the read helpers and their messages, writer errors, and a table of hostile files that must
 * each be refused with TREX_EFORMAT and a message naming the file (and the tensor at fault). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fuzz/st_exercise.h"
#include "trex/io.h"
#include "trex/safetensors.h"

#define LABEL "hostile.safetensors"

/* --- helpers ------------------------------------------------------------------------------------ */

/* An image: 8-byte length (hlen_override when not UINT64_MAX), the header text, data_len bytes. */
static uint8_t *make_image(const char *header, size_t header_len, uint64_t hlen_override, size_t data_len,
                           size_t *len)
{
    *len = 8 + header_len + data_len;
    uint8_t *b = calloc(1, *len ? *len : 1);
    if (!b)
        return NULL;
    uint64_t h = hlen_override != UINT64_MAX ? hlen_override : header_len;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(h >> (8 * i));
    memcpy(b + 8, header, header_len);
    for (size_t i = 0; i < data_len; i++)
        b[8 + header_len + i] = (uint8_t)(i * 37 + 1);
    return b;
}

static int read_file_bytes(const char *path, uint8_t **out, size_t *len)
{
    trex_err err;
    char *buf = NULL;
    if (trex_file_read(path, (size_t)1 << 30, &buf, len, &err) != TREX_OK)
        return 0;
    *out = (uint8_t *)buf;
    return 1;
}

/* --- round trip --------------------------------------------------------------------------------- */

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 131u + seed * 17u + (i >> 3)) & 0xff);
}

static void test_round_trip(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/all.safetensors", dir);
    trex_err err = {0};
    trex_st_writer *w = trex_st_writer_create();
    CHECK(w != NULL, "writer");
    if (!w)
        return;
    /* one tensor per dtype with an odd shape, a scalar, an empty tensor, and an awkward name */
    static const int64_t shape3[] = {3, 5, 7};
    static const int64_t shape_empty[] = {4, 0};
    uint8_t *bufs[TREX_DTYPE_COUNT];
    char names[TREX_DTYPE_COUNT][32];
    for (int d = 0; d < TREX_DTYPE_COUNT; d++) {
        size_t bytes = 105 * trex_dtype_size((trex_dtype)d);
        bufs[d] = malloc(bytes);
        if (!bufs[d])
            return;
        fill(bufs[d], bytes, (unsigned)d);
        if (d == TREX_F32) { /* whole finite floats, so read_f32 can be compared exactly */
            for (int i = 0; i < 105; i++) {
                float v = (float)(i - 50) * 0.25f;
                memcpy(bufs[d] + 4 * i, &v, 4);
            }
        }
        if (d == TREX_I64) { /* small values, so read_i32 succeeds */
            for (int i = 0; i < 105; i++) {
                int64_t v = (int64_t)i * 1000 - 7;
                memcpy(bufs[d] + 8 * i, &v, 8);
            }
        }
        snprintf(names[d], sizeof names[d], "model.layers.%d.%s", d, trex_dtype_name((trex_dtype)d));
        CHECK(trex_st_writer_add(w, names[d], (trex_dtype)d, 3, shape3, bufs[d], &err) == TREX_OK, "%s",
              err.msg);
    }
    double scalar = 3.5;
    CHECK(trex_st_writer_add(w, "scalar", TREX_F64, 0, NULL, &scalar, &err) == TREX_OK, "%s", err.msg);
    CHECK(trex_st_writer_add(w, "empty", TREX_BF16, 2, shape_empty, NULL, &err) == TREX_OK, "%s", err.msg);
    uint8_t odd[3] = {1, 2, 3};
    const int64_t shape_odd[] = {3};
    CHECK(trex_st_writer_add(w, "we\"ird\\na\xc3\xa9me\n", TREX_U8, 1, shape_odd, odd, &err) == TREX_OK,
          "%s", err.msg);
    CHECK(trex_st_writer_metadata(w, "format", "pt", &err) == TREX_OK, "%s", err.msg);
    CHECK(trex_st_writer_metadata(w, "note", "first", &err) == TREX_OK, "%s", err.msg);
    CHECK(trex_st_writer_metadata(w, "note", "quote \" and \\ and \x01", &err) == TREX_OK, "%s", err.msg);
    CHECK(trex_st_writer_write(w, path, &err) == TREX_OK, "write: %s", err.msg);

    uint8_t *img = NULL;
    size_t img_len = 0;
    CHECK(read_file_bytes(path, &img, &img_len), "read back the file");
    if (img) {
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = (hlen << 8) | img[i];
        CHECK((8 + hlen) % 8 == 0, "data area starts at a multiple of 8 (%llu)", (unsigned long long)hlen);
        CHECK(img[8 + hlen - 1] == ' ' || img[8 + hlen - 1] == '}', "header padded with spaces");
    }

    for (int mode = 0; mode < 2; mode++) {
        trex_st_file *f = NULL;
        trex_code rc = mode == 0 ? trex_st_open(&f, path, &err)
                                 : trex_st_open_mem(&f, img, img_len, "in-memory", &err);
        CHECK(rc == TREX_OK && f, "open (%s): %s", mode ? "mem" : "file", err.msg);
        if (!f)
            continue;
        CHECK(!strcmp(trex_st_label(f), mode ? "in-memory" : path), "label");
        CHECK(trex_st_count(f) == TREX_DTYPE_COUNT + 3, "count %lld", (long long)trex_st_count(f));
        int order_ok = 1, data_ok = 1;
        for (int d = 0; d < TREX_DTYPE_COUNT; d++) {
            const trex_st_entry *e = trex_st_entry_at(f, d);
            order_ok &= !strcmp(e->name, names[d]) && e->dtype == (trex_dtype)d && e->ndim == 3 &&
                        e->shape[0] == 3 && e->shape[1] == 5 && e->shape[2] == 7 && e->numel == 105;
            data_ok &= trex_st_find(f, names[d]) == e &&
                       !memcmp(trex_st_data(f, e), bufs[d], 105 * trex_dtype_size((trex_dtype)d));
        }
        CHECK(order_ok, "entries in insertion order with dtype and shape");
        CHECK(data_ok, "every dtype's bytes survive");
        const trex_st_entry *s = trex_st_find(f, "scalar");
        CHECK(s && s->ndim == 0 && s->numel == 1 && !memcmp(trex_st_data(f, s), &scalar, 8), "scalar");
        const trex_st_entry *em = trex_st_find(f, "empty");
        CHECK(em && em->numel == 0 && em->begin == em->end, "empty tensor");
        const trex_st_entry *od = trex_st_find(f, "we\"ird\\na\xc3\xa9me\n");
        CHECK(od && !memcmp(trex_st_data(f, od), odd, 3), "escaped name survives");
        CHECK(trex_st_find(f, "nope") == NULL, "absent name");
        CHECK(trex_st_metadata(f, "format") && !strcmp(trex_st_metadata(f, "format"), "pt"), "metadata");
        CHECK(trex_st_metadata(f, "note") && !strcmp(trex_st_metadata(f, "note"), "quote \" and \\ and \x01"),
              "metadata set twice keeps the last value, escapes survive");
        CHECK(trex_st_metadata(f, "absent") == NULL && trex_st_metadata_count(f) == 2, "metadata count");

        /* read helpers */
        float fv[105];
        CHECK(trex_st_read_f32(f, names[TREX_F32], fv, 3, shape3, &err) == TREX_OK && fv[0] == -12.5f &&
                  fv[104] == 13.5f,
              "read_f32 F32: %s", err.msg);
        for (int d = 0; d < TREX_DTYPE_COUNT; d++) {
            float want[105];
            int32_t iv[105];
            trex_dtype dt = (trex_dtype)d;
            if (trex_dtype_is_float(dt)) {
                trex_convert_to_f32(want, bufs[d], dt, 105);
                CHECK(trex_st_read_f32(f, names[d], fv, 3, shape3, &err) == TREX_OK &&
                          !memcmp(fv, want, sizeof fv),
                      "read_f32 %s: %s", trex_dtype_name(dt), err.msg);
                CHECK(trex_st_read_i32(f, names[d], iv, 3, shape3, &err) == TREX_EFORMAT &&
                          strstr(err.msg, names[d]) && strstr(err.msg, trex_dtype_name(dt)),
                      "read_i32 refuses %s: %s", trex_dtype_name(dt), err.msg);
            } else {
                CHECK(trex_st_read_f32(f, names[d], fv, 3, shape3, &err) == TREX_EFORMAT &&
                          strstr(err.msg, names[d]) && strstr(err.msg, trex_st_label(f)),
                      "read_f32 refuses %s: %s", trex_dtype_name(dt), err.msg);
                if (dt != TREX_I64) {
                    CHECK(trex_st_read_i32(f, names[d], iv, 3, shape3, &err) == TREX_OK, "read_i32 %s: %s",
                          trex_dtype_name(dt), err.msg);
                }
            }
        }
        int32_t iv[105];
        CHECK(trex_st_read_i32(f, names[TREX_I64], iv, 3, shape3, &err) == TREX_OK && iv[0] == -7 &&
                  iv[104] == 103993,
              "read_i32 I64: %s", err.msg);
        CHECK(trex_st_read_i32(f, names[TREX_I8], iv, 3, shape3, &err) == TREX_OK &&
                  iv[1] == (int8_t)bufs[TREX_I8][1],
              "I8 sign-extends");
        const int64_t wrong[] = {3, 7, 5};
        CHECK(trex_st_read_f32(f, names[TREX_F32], fv, 3, wrong, &err) == TREX_EFORMAT &&
                  strstr(err.msg, "[3, 5, 7]") && strstr(err.msg, "[3, 7, 5]") &&
                  strstr(err.msg, names[TREX_F32]) && strstr(err.msg, trex_st_label(f)),
              "shape mismatch message: %s", err.msg);
        CHECK(trex_st_read_f32(f, names[TREX_F32], fv, 2, wrong, &err) == TREX_EFORMAT, "ndim mismatch");
        CHECK(trex_st_read_f32(f, "missing.weight", fv, 3, shape3, &err) == TREX_ENOTFOUND &&
                  strstr(err.msg, "missing.weight") && strstr(err.msg, trex_st_label(f)),
              "missing tensor: %s", err.msg);
        trex_st_close(f);
    }

    /* I64 outside int32 */
    snprintf(path, sizeof path, "%s/big.safetensors", dir);
    trex_st_writer *w2 = trex_st_writer_create();
    int64_t big[2] = {1, (int64_t)1 << 40};
    const int64_t two[] = {2};
    CHECK(w2 && trex_st_writer_add(w2, "ids", TREX_I64, 1, two, big, &err) == TREX_OK &&
              trex_st_writer_write(w2, path, &err) == TREX_OK,
          "%s", err.msg);
    trex_st_file *f2 = NULL;
    CHECK(trex_st_open(&f2, path, &err) == TREX_OK, "%s", err.msg);
    if (f2) {
        int32_t iv[2];
        CHECK(trex_st_read_i32(f2, "ids", iv, 1, two, &err) == TREX_ERANGE && strstr(err.msg, "ids"),
              "I64 out of int32 range: %s", err.msg);
        trex_st_close(f2);
    }
    trex_st_writer_destroy(w2);
    unlink(path);

    /* An empty writer makes a valid empty file. */
    trex_st_writer *w3 = trex_st_writer_create();
    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    CHECK(w3 && trex_st_writer_write(w3, path, &err) == TREX_OK, "%s", err.msg);
    trex_st_file *f3 = NULL;
    CHECK(trex_st_open(&f3, path, &err) == TREX_OK && trex_st_count(f3) == 0, "empty file: %s", err.msg);
    trex_st_close(f3);
    trex_st_writer_destroy(w3);
    unlink(path);

    snprintf(path, sizeof path, "%s/all.safetensors", dir);
    unlink(path);
    free(img);
    trex_st_writer_destroy(w);
    for (int d = 0; d < TREX_DTYPE_COUNT; d++)
        free(bufs[d]);
}

static void test_writer_errors(const char *dir)
{
    char path[512];
    trex_err err = {0};
    float x[4] = {0};
    const int64_t s4[] = {4}, sneg[] = {-1}, shuge[] = {INT64_MAX / 2, 4};
    trex_st_writer *w = trex_st_writer_create();
    if (!w)
        return;
    CHECK(trex_st_writer_add(w, "", TREX_F32, 1, s4, x, &err) == TREX_EINVAL, "empty name");
    CHECK(trex_st_writer_add(w, "__metadata__", TREX_F32, 1, s4, x, &err) == TREX_EINVAL, "reserved name");
    CHECK(trex_st_writer_add(w, "bad\xff", TREX_F32, 1, s4, x, &err) == TREX_EINVAL, "invalid UTF-8 name");
    CHECK(trex_st_writer_add(w, "neg", TREX_F32, 1, sneg, x, &err) == TREX_EINVAL && strstr(err.msg, "neg"),
          "negative dim: %s", err.msg);
    CHECK(trex_st_writer_add(w, "huge", TREX_F32, 2, shuge, x, &err) == TREX_EINVAL, "overflowing shape");
    CHECK(trex_st_writer_add(w, "nodata", TREX_F32, 1, s4, NULL, &err) == TREX_EINVAL, "no data");
    CHECK(trex_st_writer_add(w, "dims", TREX_F32, TREX_MAX_DIMS + 1, s4, x, &err) == TREX_EINVAL, "ndim");
    CHECK(trex_st_writer_add(w, "a", TREX_F32, 1, s4, x, &err) == TREX_OK, "a");
    CHECK(trex_st_writer_add(w, "b", TREX_F32, 1, s4, x, &err) == TREX_OK, "b");
    CHECK(trex_st_writer_add(w, "a", TREX_F32, 1, s4, x, &err) == TREX_OK, "a again (caught at write)");
    snprintf(path, sizeof path, "%s/dup.safetensors", dir);
    CHECK(trex_st_writer_write(w, path, &err) == TREX_EINVAL && strstr(err.msg, "'a'") &&
              access(path, F_OK) != 0,
          "duplicate name refused, nothing written: %s", err.msg);
    trex_st_writer_destroy(w);
    w = trex_st_writer_create();
    if (!w)
        return;
    snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", dir);
    CHECK(trex_st_writer_add(w, "a", TREX_F32, 1, s4, x, &err) == TREX_OK &&
              trex_st_writer_write(w, path, &err) != TREX_OK && strstr(err.msg, path),
          "unwritable path: %s", err.msg);
    trex_st_writer_destroy(w);
}

/* --- hostile files ------------------------------------------------------------------------------ */

typedef struct hostile {
    const char *what;
    const char *header; /* NULL: use raw/raw_len instead */
    size_t data_len;
    uint64_t hlen;      /* UINT64_MAX: the real header length */
    const char *names;  /* a name the message must contain, or NULL */
} hostile;

#define H(what, header, data_len, names) {what, header, data_len, UINT64_MAX, names}

static const hostile hostiles[] = {
    H("offsets past end", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "'w'"),
    H("offsets far past end", "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[999,999]}}", 8, "'w'"),
    H("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlaps"),
    H("same range twice", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "overlaps"),
    H("empty tensor inside another", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                     "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, "'z'"),
    H("hole", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "hole"),
    H("hole at start", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "hole"),
    H("bytes after last tensor", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "after"),
    H("data with no tensors", "{}", 4, NULL),
    H("wrong byte length", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "'w'"),
    H("wrong dtype size", "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "'w'"),
    H("begin after end", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, "'w'"),
    H("duplicate names", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "'a'"),
    H("negative dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, NULL),
    H("fractional dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, NULL),
    H("exponent dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}", 4, NULL),
    H("huge dim 1e30", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1e30],\"data_offsets\":[0,4]}}", 4, NULL),
    H("dim 2^64", "{\"w\":{\"dtype\":\"U8\",\"shape\":[18446744073709551616,0],\"data_offsets\":[0,0]}}", 0,
      NULL),
    H("dim 2^53+1 (rounds in a double)",
      "{\"w\":{\"dtype\":\"U8\",\"shape\":[9007199254740993,0],\"data_offsets\":[0,0]}}", 0, "'w'"),
    H("dim leading zero", "{\"w\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, NULL),
    H("dim as string", "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "'w'"),
    H("dim null", "{\"w\":{\"dtype\":\"F32\",\"shape\":[null],\"data_offsets\":[0,4]}}", 4, "'w'"),
    H("shape not array", "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16, "'w'"),
    H("too many dims", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
      4, "'w'"),
    H("numel overflow",
      "{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0, "'w'"),
    H("byte length overflow",
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,0]}}", 0, "'w'"),
    H("unknown dtype", "{\"w\":{\"dtype\":\"F4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "'w'"),
    H("dtype lower case", "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'"),
    H("dtype not a string", "{\"w\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'"),
    H("negative offset", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, NULL),
    H("fractional offset", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1, NULL),
    H("one offset", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 4, "'w'"),
    H("three offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "'w'"),
    H("offsets not array", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 4, "'w'"),
    H("missing field", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets"),
    H("extra field", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "'x'"),
    H("field twice", "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
      4, "twice"),
    H("entry not an object", "{\"w\":[1,2]}", 0, "'w'"),
    H("entry is a string", "{\"w\":\"F32\"}", 0, "'w'"),
    H("non-object header (array)", "[]", 0, NULL),
    H("non-object header (string)", "\"abc\"", 0, NULL),
    H("non-object header (number)", "12", 0, NULL),
    H("non-object header (null)", "null", 0, NULL),
    H("metadata value not a string", "{\"__metadata__\":{\"a\":1}}", 0, "'a'"),
    H("metadata value an object", "{\"__metadata__\":{\"a\":{}}}", 0, NULL),
    H("metadata not an object", "{\"__metadata__\":\"x\"}", 0, NULL),
    H("metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, NULL),
    H("metadata key twice", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "'k'"),
    H("invalid JSON", "{\"w\":", 0, NULL),
    H("invalid JSON (open)", "{", 0, NULL),
    H("trailing garbage", "{}  x", 0, NULL),
    H("second object", "{}{}", 0, NULL),
    H("invalid UTF-8", "{\"\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, NULL),
    H("overlong UTF-8", "{\"\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, NULL),
    H("surrogate UTF-8", "{\"\xed\xa0\x80\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, NULL),
    H("\\u0000 in a name", "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, NULL),
    H("empty header", "", 0, NULL),
    H("header of one space", " ", 0, NULL),
    H("header of spaces", "        ", 0, NULL),
};

static void test_hostile(void)
{
    trex_err err;
    int n_cases = (int)(sizeof hostiles / sizeof hostiles[0]);
    for (int i = 0; i < n_cases; i++) {
        const hostile *h = &hostiles[i];
        size_t len = 0;
        uint8_t *img = make_image(h->header, strlen(h->header), h->hlen, h->data_len, &len);
        if (!img)
            continue;
        memset(&err, 0, sizeof err);
        trex_st_file *f = NULL;
        trex_code rc = trex_st_open_mem(&f, img, len, LABEL, &err);
        CHECK(rc == TREX_EFORMAT && !f, "%s: accepted or wrong code %d", h->what, (int)rc);
        CHECK(!strncmp(err.msg, LABEL ": ", strlen(LABEL) + 2), "%s: message must name the file: %s", h->what,
              err.msg);
        if (h->names)
            CHECK(strstr(err.msg, h->names) != NULL, "%s: message must mention %s: %s", h->what, h->names,
                  err.msg);
        trex_st_close(f);
        free(img);
    }

    /* Damage done to the length field and the byte stream. */
    static const char ok_header[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    size_t hl = strlen(ok_header), len = 0;
    struct {
        const char *what;
        uint64_t hlen;
        size_t cut; /* bytes removed from the end */
    } damage[] = {
        {"valid (control)", UINT64_MAX, 0},
        {"truncated data", UINT64_MAX, 1},
        {"truncated header", UINT64_MAX, 8 + 5},
        {"header length past the end", hl + 9, 0},
        {"header length huge", UINT64_MAX - 1, 0},
        {"header length 2^63", (uint64_t)1 << 63, 0},
        {"header length over the limit", (uint64_t)TREX_ST_MAX_HEADER + 1, 0},
        {"header length zero", 0, 0},
        {"header length one short", hl - 1, 0},
        {"header length one long", hl + 1, 0},
    };
    for (size_t i = 0; i < sizeof damage / sizeof damage[0]; i++) {
        uint8_t *img = make_image(ok_header, hl, damage[i].hlen, 8, &len);
        if (!img)
            continue;
        memset(&err, 0, sizeof err);
        trex_st_file *f = NULL;
        trex_code rc = trex_st_open_mem(&f, img, len - damage[i].cut, LABEL, &err);
        if (i == 0) {
            CHECK(rc == TREX_OK && f, "control file accepted: %s", err.msg);
        } else {
            CHECK(rc == TREX_EFORMAT && !f, "%s: code %d", damage[i].what, (int)rc);
            CHECK(!strncmp(err.msg, LABEL ": ", strlen(LABEL) + 2), "%s: %s", damage[i].what, err.msg);
        }
        trex_st_close(f);
        free(img);
    }
    for (size_t cut = 0; cut < 8; cut++) {
        uint8_t small[8] = {2, 0, 0, 0, 0, 0, 0, 0};
        trex_st_file *f = NULL;
        memset(&err, 0, sizeof err);
        CHECK(trex_st_open_mem(&f, cut ? small : NULL, cut, LABEL, &err) == TREX_EFORMAT && !f &&
                  !strncmp(err.msg, LABEL ": ", strlen(LABEL) + 2),
              "%zu-byte file: %s", cut, err.msg);
    }

    /* Valid edge cases that must be accepted. */
    static const struct {
        const char *what, *header;
        size_t data_len;
        int64_t count;
    } valid[] = {
        {"empty object", "{}", 0, 0},
        {"padded with spaces", "{}      ", 0, 0},
        {"whitespace around", " \n{ } \t\r\n", 0, 0},
        {"metadata only", "{\"__metadata__\":{\"format\":\"pt\"}}", 0, 0},
        {"out of data order", "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                              "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 4, 2},
        {"zero-size tensors at the ends", "{\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[0,0]},"
                                          "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                                          "\"y\":{\"dtype\":\"I64\",\"shape\":[7,0],\"data_offsets\":[3,3]}}", 3, 3},
        {"scalar", "{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}", 8, 1},
        {"big zero-size dims", "{\"z\":{\"dtype\":\"F64\",\"shape\":[9007199254740991,0],\"data_offsets\":[0,0]}}",
         0, 1},
        {"eight dims", "{\"s\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,2]}}", 2, 1},
        {"unicode name", "{\"\xc3\xa9\\u00e9\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
         1, 1},
        {"fields in any order", "{\"w\":{\"data_offsets\":[0,2],\"shape\":[1],\"dtype\":\"BF16\"}}", 2, 1},
    };
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        uint8_t *img = make_image(valid[i].header, strlen(valid[i].header), UINT64_MAX, valid[i].data_len, &len);
        if (!img)
            continue;
        memset(&err, 0, sizeof err);
        trex_st_file *f = NULL;
        trex_code rc = trex_st_open_mem(&f, img, len, "valid", &err);
        CHECK(rc == TREX_OK && f && trex_st_count(f) == valid[i].count, "%s: %s", valid[i].what, err.msg);
        int violations = 0;
        CHECK(st_exercise(img, len, "valid", &violations) == TREX_OK && violations == 0,
              "%s: exercise found %d violations", valid[i].what, violations);
        trex_st_close(f);
        free(img);
    }
}

static void test_open_errors(const char *dir)
{
    char path[512];
    trex_err err = {0};
    trex_st_file *f = NULL;
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    CHECK(trex_st_open(&f, path, &err) == TREX_ENOTFOUND && !f && strstr(err.msg, path), "missing: %s",
          err.msg);
    CHECK(trex_st_open(&f, dir, &err) != TREX_OK && !f && strstr(err.msg, dir), "directory: %s", err.msg);
    snprintf(path, sizeof path, "%s/short.safetensors", dir);
    for (size_t n = 0; n < 8; n++) {
        CHECK(trex_file_write_atomic(path, "\x02\0\0\0\0\0\0", n, &err) == TREX_OK, "%s", err.msg);
        CHECK(trex_st_open(&f, path, &err) == TREX_EFORMAT && !f && strstr(err.msg, path),
              "%zu-byte file on disk: %s", n, err.msg);
    }
    static const char hdr[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    size_t len = 0;
    uint8_t *img = make_image(hdr, strlen(hdr), UINT64_MAX, 12, &len);
    if (img) {
        CHECK(trex_file_write_atomic(path, img, len, &err) == TREX_OK, "%s", err.msg);
        CHECK(trex_st_open(&f, path, &err) == TREX_EFORMAT && !f && strstr(err.msg, path) &&
                  strstr(err.msg, "'w'"),
              "truncated data on disk: %s", err.msg);
        free(img);
    }
    unlink(path);
}

int main(void)
{
    char dir[] = "/tmp/trex-test-st-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return check_summary();
    }
    test_round_trip(dir);
    test_writer_errors(dir);
    test_hostile();
    test_open_errors(dir);
    CHECK(rmdir(dir) == 0, "scratch directory left clean: %s", strerror(errno));
    return check_summary();
}
