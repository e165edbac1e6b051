/* core/safetensors.c — safetensors reader (for untrusted files) and streaming writer.
 *
 * Reader: the file is validated completely before any entry is handed out (see docs/safetensors.md):
 *   - 8-byte little-endian header length N with N <= TREX_ST_MAX_HEADER and N <= file size - 8;
 *   - the header is valid UTF-8 JSON (trailing whitespace allowed), without \u0000 escapes, whose numbers
 *     are plain non-negative decimal integers (no sign, fraction, exponent or leading zero, below
 *     2^53 so that the double cJSON parses them into is exact);
 *   - the root is an object; "__metadata__" (at most once) is an object of string values; every other
 *     value is an object with exactly "dtype" (a known name), "shape" (<= TREX_MAX_DIMS integers) and
 *     "data_offsets" ([begin, end], begin <= end <= data size);
 *   - numel and numel * dtype size do not overflow, and end - begin equals that byte length;
 *   - names are unique; sorted by (begin, end), the ranges tile the data area exactly: no overlap, no
 *     hole, nothing after the last tensor (as the reference implementation requires).
 * Every violation is TREX_EFORMAT with "<file>: ..." naming the tensor. Tensor data may be unaligned.
 *
 * Writer: keeps references to the caller's buffers; writes the header (tensors in insertion order,
 * data offsets consecutive, padded with spaces so the data area starts at a multiple of 8), then each
 * tensor's bytes straight from the caller's buffer into the temporary file, fsync, rename. */
#include "trex/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "trex/io.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define JSON_EXACT_LIMIT 9007199254740992.0 /* 2^53: integers from here on may have been rounded */
#define NAME_SHOWN 80                      /* characters of a name quoted in a message */

typedef struct meta_kv {
    char *key;
    char *value;
} meta_kv;

struct trex_st_file {
    char *label;
    const unsigned char *data; /* the data area */
    uint64_t data_len;
    void *map; /* whole-file mapping (trex_st_open), else NULL */
    size_t map_len;
    int64_t count;
    trex_st_entry *entries;         /* header order */
    const trex_st_entry **by_name;  /* sorted by name, for trex_st_find */
    char *names;                    /* storage of every entry name */
    int64_t nmeta;
    meta_kv *meta; /* sorted by key; strings in metastr */
    char *metastr;
};

/* --- small helpers ------------------------------------------------------------------------------ */

/* A printable, bounded copy of a name for messages. */
static const char *shown(const char *s, char buf[NAME_SHOWN + 4])
{
    size_t k = 0;
    for (; s[k] && k < NAME_SHOWN; k++)
        buf[k] = ((unsigned char)s[k] >= 0x20 && (unsigned char)s[k] != 0x7f) ? s[k] : '?';
    if (s[k]) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = '\0';
    return buf;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t k = 0;
    int n = snprintf(buf, cap, "[");
    k = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < ndim && k < cap; i++) {
        n = snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", shape[i]);
        if (n < 0)
            break;
        k += (size_t)n;
    }
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
}

/* Valid UTF-8 (no overlong forms, surrogates or code points above U+10FFFF). On failure *at is the
 * offset of the first bad byte. */
static bool utf8_valid(const unsigned char *s, size_t n, size_t *at)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07;
        } else {
            *at = i;
            return false;
        }
        if (n - i < len) {
            *at = i;
            return false;
        }
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                *at = i;
                return false;
            }
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
            *at = i;
            return false;
        }
        i += len;
    }
    return true;
}

/* Scans JSON text already accepted by cJSON: every number must be a plain decimal integer (no sign,
 * fraction, exponent or leading zero, at most 16 digits) and no string may hold a \u0000 escape. */
static bool scan_tokens(const char *s, size_t n, size_t *at, const char **why)
{
    size_t i = 0;
    while (i < n) {
        char c = s[i];
        if (c == '"') {
            i++;
            while (i < n && s[i] != '"') {
                if (s[i] == '\\') {
                    if (i + 5 < n && s[i + 1] == 'u' && !memcmp(s + i + 2, "0000", 4)) {
                        *at = i;
                        *why = "a \\u0000 escape in a string";
                        return false;
                    }
                    i += 2;
                } else {
                    i++;
                }
            }
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i;
            bool digits = true;
            while (j < n && strchr("0123456789+-.eE", s[j]) && s[j] != '\0') {
                if (s[j] < '0' || s[j] > '9')
                    digits = false;
                j++;
            }
            if (!digits) {
                *at = i;
                *why = "a number that is not a non-negative integer (sign, fraction or exponent)";
                return false;
            }
            if (j - i > 1 && s[i] == '0') {
                *at = i;
                *why = "an integer with a leading zero";
                return false;
            }
            if (j - i > 16) {
                *at = i;
                *why = "an integer too large to be exact (2^53 or more)";
                return false;
            }
            i = j;
        } else {
            i++;
        }
    }
    return true;
}

/* An exact non-negative integer JSON number below 2^53 (the text scan has excluded signs, fractions
 * and exponents; strtod rounds any integer text >= 2^53 to a double >= 2^53). */
static bool json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d >= JSON_EXACT_LIMIT || d != (double)(uint64_t)d)
        return false;
    *out = (uint64_t)d;
    return true;
}

static int cmp_entry_name(const void *a, const void *b)
{
    const trex_st_entry *x = *(const trex_st_entry *const *)a, *y = *(const trex_st_entry *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_entry_range(const void *a, const void *b)
{
    const trex_st_entry *x = *(const trex_st_entry *const *)a, *y = *(const trex_st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_meta(const void *a, const void *b)
{
    return strcmp(((const meta_kv *)a)->key, ((const meta_kv *)b)->key);
}

/* --- header validation -------------------------------------------------------------------------- */

/* Validates one tensor description `v` named `name`, filling e (except e->name). */
static trex_code parse_entry(const trex_st_file *f, const char *name, const cJSON *v, trex_st_entry *e,
                             trex_err *err)
{
    char nb[NAME_SHOWN + 4];
    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
    if (!cJSON_IsObject(v))
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: tensor '%s': description is not an object with dtype, shape and "
                            "data_offsets",
                            f->label, shown(name, nb));
    for (const cJSON *c = v->child; c; c = c->next) {
        const cJSON **slot = NULL;
        if (c->string && !strcmp(c->string, "dtype"))
            slot = &dtype;
        else if (c->string && !strcmp(c->string, "shape"))
            slot = &shape;
        else if (c->string && !strcmp(c->string, "data_offsets"))
            slot = &offsets;
        else {
            char kb[NAME_SHOWN + 4];
            return trex_err_set(err, TREX_EFORMAT,
                                "%s: tensor '%s': unknown field '%s' (only dtype, shape and "
                                "data_offsets are allowed)",
                                f->label, shown(name, nb), c->string ? shown(c->string, kb) : "");
        }
        if (*slot)
            return trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s': field '%s' appears twice",
                                f->label, shown(name, nb), c->string);
        *slot = c;
    }
    if (!dtype || !shape || !offsets)
        return trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s': missing field '%s'", f->label,
                            shown(name, nb), !dtype ? "dtype" : !shape ? "shape" : "data_offsets");

    if (!cJSON_IsString(dtype) || !dtype->valuestring)
        return trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s': dtype is not a string", f->label,
                            shown(name, nb));
    if (trex_dtype_parse(dtype->valuestring, &e->dtype) != TREX_OK) {
        char db[NAME_SHOWN + 4];
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: tensor '%s': unknown dtype '%s' (known: F32 F64 BF16 F16 I64 I32 U8 "
                            "I8 F8_E4M3 F8_E8M0)",
                            f->label, shown(name, nb), shown(dtype->valuestring, db));
    }

    if (!cJSON_IsArray(shape))
        return trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s': shape is not an array", f->label,
                            shown(name, nb));
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > TREX_MAX_DIMS)
        return trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s': shape has %d dims, at most %d supported",
                            f->label, shown(name, nb), ndim, TREX_MAX_DIMS);
    e->ndim = 0;
    for (const cJSON *d = shape->child; d; d = d->next) {
        uint64_t dim;
        if (!json_uint(d, &dim))
            return trex_err_set(err, TREX_EFORMAT,
                                "%s: tensor '%s': shape dim %d is not an integer in [0, 2^53)", f->label,
                                shown(name, nb), e->ndim);
        e->shape[e->ndim++] = (int64_t)dim;
    }
    TREX_ASSERT(e->ndim == ndim);
    char sb[256];
    if (!trex_shape_numel(e->ndim, e->shape, &e->numel)) {
        shape_str(sb, sizeof sb, e->ndim, e->shape);
        return trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s': shape %s has more than 2^63 elements",
                            f->label, shown(name, nb), sb);
    }
    size_t esize = trex_dtype_size(e->dtype);
    if (e->numel > INT64_MAX / (int64_t)esize) {
        shape_str(sb, sizeof sb, e->ndim, e->shape);
        return trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s': %s %s is more than 2^63 bytes",
                            f->label, shown(name, nb), trex_dtype_name(e->dtype), sb);
    }
    uint64_t bytes = (uint64_t)e->numel * esize;

    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2)
        return trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s': data_offsets is not [begin, end]",
                            f->label, shown(name, nb));
    if (!json_uint(offsets->child, &e->begin) || !json_uint(offsets->child->next, &e->end))
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: tensor '%s': data_offsets are not integers in [0, 2^53)", f->label,
                            shown(name, nb));
    if (e->begin > e->end)
        return trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            "] end before they begin",
                            f->label, shown(name, nb), e->begin, e->end);
    if (e->end > f->data_len)
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            "] run past the end of the data area (%" PRIu64 " bytes); truncated file?",
                            f->label, shown(name, nb), e->begin, e->end, f->data_len);
    if (e->end - e->begin != bytes) {
        shape_str(sb, sizeof sb, e->ndim, e->shape);
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: tensor '%s': %s %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64
                            ", %" PRIu64 "] hold %" PRIu64,
                            f->label, shown(name, nb), trex_dtype_name(e->dtype), sb, bytes, e->begin,
                            e->end, e->end - e->begin);
    }
    return TREX_OK;
}

static trex_code parse_metadata(trex_st_file *f, const cJSON *v, trex_err *err)
{
    if (!cJSON_IsObject(v))
        return trex_err_set(err, TREX_EFORMAT, "%s: __metadata__ is not an object of strings", f->label);
    size_t bytes = 0;
    int64_t n = 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        char kb[NAME_SHOWN + 4];
        if (!c->string || !cJSON_IsString(c) || !c->valuestring)
            return trex_err_set(err, TREX_EFORMAT, "%s: __metadata__ value '%s' is not a string",
                                f->label, c->string ? shown(c->string, kb) : "");
        bytes += strlen(c->string) + 1 + strlen(c->valuestring) + 1;
        n++;
    }
    f->meta = calloc(n ? (size_t)n : 1, sizeof *f->meta);
    f->metastr = malloc(bytes ? bytes : 1);
    if (!f->meta || !f->metastr)
        return trex_err_set(err, TREX_ENOMEM, "%s: out of memory for __metadata__", f->label);
    char *p = f->metastr;
    for (const cJSON *c = v->child; c; c = c->next) {
        size_t kl = strlen(c->string) + 1, vl = strlen(c->valuestring) + 1;
        f->meta[f->nmeta].key = memcpy(p, c->string, kl);
        p += kl;
        f->meta[f->nmeta].value = memcpy(p, c->valuestring, vl);
        p += vl;
        f->nmeta++;
    }
    qsort(f->meta, (size_t)f->nmeta, sizeof *f->meta, cmp_meta);
    for (int64_t i = 1; i < f->nmeta; i++) {
        char kb[NAME_SHOWN + 4];
        if (!strcmp(f->meta[i - 1].key, f->meta[i].key))
            return trex_err_set(err, TREX_EFORMAT, "%s: __metadata__ key '%s' appears twice", f->label,
                                shown(f->meta[i].key, kb));
    }
    return TREX_OK;
}

/* Checks unique names and that the ranges tile [0, data_len). Fills f->by_name. */
static trex_code check_layout(trex_st_file *f, trex_err *err)
{
    trex_code rc = TREX_OK;
    char nb[NAME_SHOWN + 4], nb2[NAME_SHOWN + 4];
    size_t n = (size_t)f->count;
    const trex_st_entry **by_range = NULL;
    f->by_name = malloc((n ? n : 1) * sizeof *f->by_name);
    by_range = malloc((n ? n : 1) * sizeof *by_range);
    if (!f->by_name || !by_range) {
        rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory for %zu tensors", f->label, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        f->by_name[i] = by_range[i] = &f->entries[i];
    qsort(f->by_name, n, sizeof *f->by_name, cmp_entry_name);
    for (size_t i = 1; i < n; i++) {
        if (!strcmp(f->by_name[i - 1]->name, f->by_name[i]->name)) {
            rc = trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s' appears twice in the header", f->label,
                              shown(f->by_name[i]->name, nb));
            goto out;
        }
    }
    qsort(by_range, n, sizeof *by_range, cmp_entry_range);
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const trex_st_entry *e = by_range[i];
        if (e->begin < pos) {
            rc = trex_err_set(err, TREX_EFORMAT,
                              "%s: tensor '%s' [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' (which "
                              "ends at %" PRIu64 ")",
                              f->label, shown(e->name, nb), e->begin, e->end,
                              shown(by_range[i - 1]->name, nb2), pos);
            goto out;
        }
        if (e->begin > pos) {
            rc = trex_err_set(err, TREX_EFORMAT,
                              "%s: hole in the data area: bytes [%" PRIu64 ", %" PRIu64
                              ") before tensor '%s' belong to no tensor",
                              f->label, pos, e->begin, shown(e->name, nb));
            goto out;
        }
        pos = e->end;
    }
    if (pos != f->data_len)
        rc = trex_err_set(err, TREX_EFORMAT,
                          "%s: the data area has %" PRIu64 " bytes after the last tensor (ends at %" PRIu64
                          ", data area is %" PRIu64 " bytes)",
                          f->label, f->data_len - pos, pos, f->data_len);
out:
    free(by_range);
    return rc;
}

static trex_code parse_header(trex_st_file *f, const unsigned char *base, size_t len, trex_err *err)
{
    trex_code rc = TREX_OK;
    char *text = NULL;
    cJSON *root = NULL;
    if (len < 8)
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: file is %zu bytes, too short for the 8-byte header length; truncated or "
                            "not a safetensors file",
                            f->label, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | base[i];
    if (hlen > TREX_ST_MAX_HEADER)
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: header length %" PRIu64 " exceeds the %u-byte limit; not a safetensors "
                            "file?",
                            f->label, hlen, (unsigned)TREX_ST_MAX_HEADER);
    if (hlen > len - 8)
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes); "
                            "truncated?",
                            f->label, hlen, len);
    if (hlen < 2)
        return trex_err_set(err, TREX_EFORMAT, "%s: header length %" PRIu64 " is too short for a JSON "
                            "object", f->label, hlen);
    size_t n = (size_t)hlen;
    f->data = base + 8 + n;
    f->data_len = (uint64_t)(len - 8 - n);

    size_t bad = 0;
    if (!utf8_valid(base + 8, n, &bad)) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: header is not valid UTF-8 (byte %zu of the header)",
                          f->label, bad);
        goto out;
    }
    text = malloc(n + 1);
    if (!text) {
        rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory for a %zu-byte header", f->label, n);
        goto out;
    }
    memcpy(text, base + 8, n);
    text[n] = '\0';
    if (strlen(text) != n) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: header holds a NUL byte (byte %zu of the header)",
                          f->label, strlen(text));
        goto out;
    }
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!root) {
        size_t at = (end && end >= text && end <= text + n) ? (size_t)(end - text) : n;
        rc = trex_err_set(err, TREX_EFORMAT, "%s: header is not valid JSON (byte %zu of the header)",
                          f->label, at);
        goto out;
    }
    size_t parsed = (end && end >= text && end <= text + n) ? (size_t)(end - text) : n;
    for (size_t i = parsed; i < n; i++) {
        if (!strchr(" \t\r\n", text[i])) {
            rc = trex_err_set(err, TREX_EFORMAT,
                              "%s: header has bytes after the JSON object (byte %zu of the header)",
                              f->label, i);
            goto out;
        }
    }
    const char *why = NULL;
    if (!scan_tokens(text, parsed, &bad, &why)) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: header holds %s (byte %zu of the header)", f->label,
                          why, bad);
        goto out;
    }
    if (!cJSON_IsObject(root)) {
        rc = trex_err_set(err, TREX_EFORMAT,
                          "%s: header is not a JSON object mapping tensor names to descriptions", f->label);
        goto out;
    }

    /* Count tensors and size the name storage. */
    int64_t count = 0;
    size_t name_bytes = 0;
    const cJSON *meta = NULL;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (!c->string) {
            rc = trex_err_set(err, TREX_EFORMAT, "%s: header object has a member without a name", f->label);
            goto out;
        }
        if (!strcmp(c->string, "__metadata__")) {
            if (meta) {
                rc = trex_err_set(err, TREX_EFORMAT, "%s: __metadata__ appears twice", f->label);
                goto out;
            }
            meta = c;
            continue;
        }
        count++;
        name_bytes += strlen(c->string) + 1;
    }
    if (meta) {
        rc = parse_metadata(f, meta, err);
        if (rc != TREX_OK)
            goto out;
    }
    f->entries = calloc(count ? (size_t)count : 1, sizeof *f->entries);
    f->names = malloc(name_bytes ? name_bytes : 1);
    if (!f->entries || !f->names) {
        rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory for %" PRId64 " tensors", f->label, count);
        goto out;
    }
    char *p = f->names;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c == meta)
            continue;
        trex_st_entry *e = &f->entries[f->count];
        rc = parse_entry(f, c->string, c, e, err);
        if (rc != TREX_OK)
            goto out;
        size_t l = strlen(c->string) + 1;
        e->name = memcpy(p, c->string, l);
        p += l;
        f->count++;
    }
    rc = check_layout(f, err);
out:
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* --- reader API --------------------------------------------------------------------------------- */

static trex_st_file *file_new(const char *label)
{
    trex_st_file *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    if (!label)
        label = "<memory>";
    size_t n = strlen(label) + 1;
    f->label = malloc(n);
    if (!f->label) {
        free(f);
        return NULL;
    }
    memcpy(f->label, label, n);
    return f;
}

void trex_st_close(trex_st_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_len);
    free(f->entries);
    free(f->by_name);
    free(f->names);
    free(f->meta);
    free(f->metastr);
    free(f->label);
    free(f);
}

trex_code trex_st_open_mem(trex_st_file **out, const void *buf, size_t len, const char *label,
                           trex_err *err)
{
    TREX_ASSERT(out);
    TREX_ASSERT(buf || len == 0);
    *out = NULL;
    trex_st_file *f = file_new(label);
    if (!f)
        return trex_err_set(err, TREX_ENOMEM, "%s: out of memory", label ? label : "<memory>");
    trex_code rc = parse_header(f, buf, len, err);
    if (rc != TREX_OK) {
        trex_st_close(f);
        return rc;
    }
    *out = f;
    return TREX_OK;
}

trex_code trex_st_open(trex_st_file **out, const char *path, trex_err *err)
{
    TREX_ASSERT(out && path);
    *out = NULL;
    trex_code rc = TREX_OK;
    trex_st_file *f = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return trex_err_set(err, errno == ENOENT ? TREX_ENOTFOUND : TREX_EIO, "%s: cannot open: %s",
                            path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = trex_err_set(err, TREX_EIO, "%s: cannot stat: %s", path, strerror(errno));
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = trex_err_set(err, TREX_EIO, "%s: not a regular file", path);
        goto out_close;
    }
    f = file_new(path);
    if (!f) {
        rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory", path);
        goto out_close;
    }
    size_t size = (size_t)st.st_size;
    if (size < 8) { /* too short to map usefully: let the validator phrase the error */
        static const unsigned char none[8];
        rc = parse_header(f, none, size, err);
        TREX_ASSERT(rc != TREX_OK);
        goto out_close;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = trex_err_set(err, TREX_EIO, "%s: cannot map %zu bytes: %s", path, size, strerror(errno));
        goto out_close;
    }
    f->map = map;
    f->map_len = size;
    rc = parse_header(f, map, size, err);
out_close:
    close(fd);
    if (rc != TREX_OK) {
        trex_st_close(f);
        return rc;
    }
    *out = f;
    return TREX_OK;
}

const char *trex_st_label(const trex_st_file *f)
{
    TREX_ASSERT(f);
    return f->label;
}

int64_t trex_st_count(const trex_st_file *f)
{
    TREX_ASSERT(f);
    return f->count;
}

const trex_st_entry *trex_st_entry_at(const trex_st_file *f, int64_t i)
{
    TREX_ASSERT(f && i >= 0 && i < f->count);
    return &f->entries[i];
}

const trex_st_entry *trex_st_find(const trex_st_file *f, const char *name)
{
    TREX_ASSERT(f && name);
    size_t lo = 0, hi = (size_t)f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0)
            return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const void *trex_st_data(const trex_st_file *f, const trex_st_entry *e)
{
    TREX_ASSERT(f && e && e >= f->entries && e < f->entries + f->count);
    return f->data + e->begin;
}

const char *trex_st_metadata(const trex_st_file *f, const char *key)
{
    TREX_ASSERT(f && key);
    meta_kv probe = {.key = (char *)key, .value = NULL};
    const meta_kv *m = f->nmeta ? bsearch(&probe, f->meta, (size_t)f->nmeta, sizeof *f->meta, cmp_meta)
                                : NULL;
    return m ? m->value : NULL;
}

int64_t trex_st_metadata_count(const trex_st_file *f)
{
    TREX_ASSERT(f);
    return f->nmeta;
}

void trex_st_metadata_at(const trex_st_file *f, int64_t i, const char **key, const char **value)
{
    TREX_ASSERT(f && i >= 0 && i < f->nmeta);
    if (key)
        *key = f->meta[i].key;
    if (value)
        *value = f->meta[i].value;
}

/* Finds name and checks its shape against (ndim, shape). */
static trex_code find_shaped(const trex_st_file *f, const char *name, int ndim, const int64_t *shape,
                             const trex_st_entry **out, trex_err *err)
{
    char nb[NAME_SHOWN + 4];
    const trex_st_entry *e = trex_st_find(f, name);
    if (!e)
        return trex_err_set(err, TREX_ENOTFOUND, "%s: tensor '%s' not found (the file holds %" PRId64
                            " tensors); is this the right checkpoint?",
                            f->label, shown(name, nb), f->count);
    bool same = e->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = e->shape[i] == shape[i];
    if (!same) {
        char want[256], got[256];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, e->ndim, e->shape);
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: tensor '%s' has shape %s, expected %s (does the config match the "
                            "checkpoint?)",
                            f->label, shown(name, nb), got, want);
    }
    *out = e;
    return TREX_OK;
}

trex_code trex_st_read_f32(const trex_st_file *f, const char *name, float *dst, int ndim,
                           const int64_t *shape, trex_err *err)
{
    TREX_ASSERT(f && name && (ndim == 0 || shape));
    TREX_ASSERT(ndim >= 0 && ndim <= TREX_MAX_DIMS);
    const trex_st_entry *e = NULL;
    trex_code rc = find_shaped(f, name, ndim, shape, &e, err);
    if (rc != TREX_OK)
        return rc;
    if (!trex_dtype_is_float(e->dtype)) {
        char nb[NAME_SHOWN + 4];
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: tensor '%s' has dtype %s, expected a float dtype (F32, F64, BF16, F16, "
                            "F8_E4M3, F8_E8M0)",
                            f->label, shown(name, nb), trex_dtype_name(e->dtype));
    }
    TREX_ASSERT(e->numel == 0 || dst);
    trex_convert_to_f32(dst, trex_st_data(f, e), e->dtype, e->numel);
    return TREX_OK;
}

trex_code trex_st_read_i32(const trex_st_file *f, const char *name, int32_t *dst, int ndim,
                           const int64_t *shape, trex_err *err)
{
    TREX_ASSERT(f && name && (ndim == 0 || shape));
    TREX_ASSERT(ndim >= 0 && ndim <= TREX_MAX_DIMS);
    char nb[NAME_SHOWN + 4];
    const trex_st_entry *e = NULL;
    trex_code rc = find_shaped(f, name, ndim, shape, &e, err);
    if (rc != TREX_OK)
        return rc;
    TREX_ASSERT(e->numel == 0 || dst);
    const unsigned char *src = trex_st_data(f, e);
    switch (e->dtype) {
    case TREX_I64:
        for (int64_t i = 0; i < e->numel; i++) {
            int64_t v;
            memcpy(&v, src + i * 8, sizeof v);
            if (v < INT32_MIN || v > INT32_MAX)
                return trex_err_set(err, TREX_ERANGE,
                                    "%s: tensor '%s' element %" PRId64 " is %" PRId64
                                    ", outside the int32 range",
                                    f->label, shown(name, nb), i, v);
            dst[i] = (int32_t)v;
        }
        break;
    case TREX_I32:
        if (e->numel > 0)
            memcpy(dst, src, (size_t)e->numel * 4);
        break;
    case TREX_U8:
        for (int64_t i = 0; i < e->numel; i++)
            dst[i] = src[i];
        break;
    case TREX_I8:
        for (int64_t i = 0; i < e->numel; i++)
            dst[i] = (int8_t)src[i];
        break;
    default:
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: tensor '%s' has dtype %s, expected an integer dtype (I64, I32, U8, I8)",
                            f->label, shown(name, nb), trex_dtype_name(e->dtype));
    }
    return TREX_OK;
}

/* --- writer ------------------------------------------------------------------------------------- */

typedef struct wentry {
    char *name;
    trex_dtype dtype;
    int ndim;
    int64_t shape[TREX_MAX_DIMS];
    const void *data;
    uint64_t bytes;
} wentry;

struct trex_st_writer {
    wentry *e;
    size_t n, cap;
    meta_kv *meta;
    size_t nmeta, mcap;
};

/* A growable string for the header. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (n > SIZE_MAX - b->len - 1) {
        b->oom = true;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_json_string(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static void sb_u64(sbuf *b, uint64_t v)
{
    char num[24];
    int n = snprintf(num, sizeof num, "%" PRIu64, v);
    sb_put(b, num, (size_t)n);
}

trex_st_writer *trex_st_writer_create(void)
{
    return calloc(1, sizeof(trex_st_writer));
}

void trex_st_writer_destroy(trex_st_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        free(w->e[i].name);
    for (size_t i = 0; i < w->nmeta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->e);
    free(w->meta);
    free(w);
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

/* A name or metadata string the reader will accept: valid UTF-8 and no NUL (guaranteed by C). */
static bool writable_string(const char *s)
{
    size_t at;
    return utf8_valid((const unsigned char *)s, strlen(s), &at);
}

trex_code trex_st_writer_add(trex_st_writer *w, const char *name, trex_dtype dt, int ndim,
                             const int64_t *shape, const void *data, trex_err *err)
{
    TREX_ASSERT(w);
    char nb[NAME_SHOWN + 4];
    if (!name || !*name)
        return trex_err_set(err, TREX_EINVAL, "safetensors writer: empty tensor name");
    if (!strcmp(name, "__metadata__") || !writable_string(name))
        return trex_err_set(err, TREX_EINVAL,
                            "safetensors writer: tensor name '%s' is reserved or not valid UTF-8",
                            shown(name, nb));
    if ((int)dt < 0 || dt >= TREX_DTYPE_COUNT)
        return trex_err_set(err, TREX_EINVAL, "safetensors writer: tensor '%s': bad dtype %d",
                            shown(name, nb), (int)dt);
    if (ndim < 0 || ndim > TREX_MAX_DIMS || (ndim > 0 && !shape))
        return trex_err_set(err, TREX_EINVAL, "safetensors writer: tensor '%s': %d dims (0 to %d allowed)",
                            shown(name, nb), ndim, TREX_MAX_DIMS);
    int64_t numel = 0;
    if (!trex_shape_numel(ndim, shape, &numel) || numel > INT64_MAX / (int64_t)trex_dtype_size(dt))
        return trex_err_set(err, TREX_EINVAL,
                            "safetensors writer: tensor '%s': shape has a negative dim or is too large",
                            shown(name, nb));
    uint64_t bytes = (uint64_t)numel * trex_dtype_size(dt);
    if (bytes > 0 && !data)
        return trex_err_set(err, TREX_EINVAL, "safetensors writer: tensor '%s': no data", shown(name, nb));
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        wentry *e = realloc(w->e, cap * sizeof *e);
        if (!e)
            return trex_err_set(err, TREX_ENOMEM, "safetensors writer: out of memory");
        w->e = e;
        w->cap = cap;
    }
    wentry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = dup_str(name);
    if (!e->name)
        return trex_err_set(err, TREX_ENOMEM, "safetensors writer: out of memory");
    e->dtype = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->data = data;
    e->bytes = bytes;
    w->n++;
    return TREX_OK;
}

trex_code trex_st_writer_metadata(trex_st_writer *w, const char *key, const char *value, trex_err *err)
{
    TREX_ASSERT(w && key && value);
    char kb[NAME_SHOWN + 4];
    if (!writable_string(key) || !writable_string(value))
        return trex_err_set(err, TREX_EINVAL, "safetensors writer: metadata '%s' is not valid UTF-8",
                            shown(key, kb));
    char *v = dup_str(value);
    if (!v)
        return trex_err_set(err, TREX_ENOMEM, "safetensors writer: out of memory");
    for (size_t i = 0; i < w->nmeta; i++) {
        if (!strcmp(w->meta[i].key, key)) { /* setting a key again replaces its value */
            free(w->meta[i].value);
            w->meta[i].value = v;
            return TREX_OK;
        }
    }
    if (w->nmeta == w->mcap) {
        size_t cap = w->mcap ? w->mcap * 2 : 8;
        meta_kv *m = realloc(w->meta, cap * sizeof *m);
        if (!m) {
            free(v);
            return trex_err_set(err, TREX_ENOMEM, "safetensors writer: out of memory");
        }
        w->meta = m;
        w->mcap = cap;
    }
    char *k = dup_str(key);
    if (!k) {
        free(v);
        return trex_err_set(err, TREX_ENOMEM, "safetensors writer: out of memory");
    }
    w->meta[w->nmeta].key = k;
    w->meta[w->nmeta].value = v;
    w->nmeta++;
    return TREX_OK;
}

static int cmp_wentry_name(const void *a, const void *b)
{
    return strcmp((*(const wentry *const *)a)->name, (*(const wentry *const *)b)->name);
}

/* Builds the padded header text into b. */
static trex_code build_header(const trex_st_writer *w, const char *path, sbuf *b, trex_err *err)
{
    char nb[NAME_SHOWN + 4];
    trex_code rc = TREX_OK;
    const wentry **sorted = malloc((w->n ? w->n : 1) * sizeof *sorted);
    if (!sorted)
        return trex_err_set(err, TREX_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < w->n; i++)
        sorted[i] = &w->e[i];
    qsort(sorted, w->n, sizeof *sorted, cmp_wentry_name);
    for (size_t i = 1; i < w->n; i++) {
        if (!strcmp(sorted[i - 1]->name, sorted[i]->name)) {
            rc = trex_err_set(err, TREX_EINVAL, "%s: tensor '%s' was added twice", path,
                              shown(sorted[i]->name, nb));
            goto out;
        }
    }
    sb_str(b, "{");
    bool first = true;
    if (w->nmeta > 0) {
        sb_str(b, "\"__metadata__\":{");
        for (size_t i = 0; i < w->nmeta; i++) {
            if (i)
                sb_str(b, ",");
            sb_json_string(b, w->meta[i].key);
            sb_str(b, ":");
            sb_json_string(b, w->meta[i].value);
        }
        sb_str(b, "}");
        first = false;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        const wentry *e = &w->e[i];
        if (!first)
            sb_str(b, ",");
        first = false;
        sb_json_string(b, e->name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, trex_dtype_name(e->dtype));
        sb_str(b, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            if (d)
                sb_str(b, ",");
            sb_u64(b, (uint64_t)e->shape[d]);
        }
        sb_str(b, "],\"data_offsets\":[");
        sb_u64(b, off);
        sb_str(b, ",");
        if (e->bytes > UINT64_MAX - off) {
            rc = trex_err_set(err, TREX_EINVAL, "%s: total tensor size overflows", path);
            goto out;
        }
        off += e->bytes;
        sb_u64(b, off);
        sb_str(b, "]}");
    }
    sb_str(b, "}");
    while (!b->oom && (8 + b->len) % 8 != 0)
        sb_str(b, " ");
    if (b->oom) {
        rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory building the header", path);
        goto out;
    }
    if (b->len > TREX_ST_MAX_HEADER)
        rc = trex_err_set(err, TREX_EINVAL,
                          "%s: header of %zu bytes exceeds the %u-byte limit; split the tensors over "
                          "several files",
                          path, b->len, (unsigned)TREX_ST_MAX_HEADER);
out:
    free(sorted);
    return rc;
}

trex_code trex_st_writer_write(trex_st_writer *w, const char *path, trex_err *err)
{
    TREX_ASSERT(w && path);
    sbuf b = {0};
    trex_atomic_file *af = NULL;
    trex_code rc = build_header(w, path, &b, err);
    if (rc != TREX_OK)
        goto out;
    unsigned char lenbuf[8];
    uint64_t hlen = b.len;
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (unsigned char)(hlen >> (8 * i));
    rc = trex_file_atomic_open(&af, path, err);
    if (rc != TREX_OK)
        goto out;
    rc = trex_file_atomic_write(af, lenbuf, sizeof lenbuf, err);
    if (rc == TREX_OK)
        rc = trex_file_atomic_write(af, b.p, b.len, err);
    for (size_t i = 0; rc == TREX_OK && i < w->n; i++)
        rc = trex_file_atomic_write(af, w->e[i].data, (size_t)w->e[i].bytes, err);
    if (rc != TREX_OK) {
        trex_file_atomic_abort(af);
        goto out;
    }
    rc = trex_file_atomic_commit(af, err);
out:
    free(b.p);
    return rc;
}
