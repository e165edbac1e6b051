/* data/shard.c — token shards: greedy packing into fixed-length sequences, the shard writer (temporary
 * names, rename, manifest last) and the reader the trainer uses (random access by sequence number,
 * tokenizer check). The byte layout is in docs/formats.md. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "data/data_internal.h"
#include "trex/io.h"

#define SHARD_MAGIC "TRXSHARD"
#define SHARD_VERSION 1u
#define SHARD_HEADER 128
#define MANIFEST_FORMAT "trex-token-shards"
#define DEFAULT_SHARD_TOKENS ((int64_t)1 << 24)

/* --- little-endian fields ----------------------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

typedef struct shard_header {
    trex_shard_meta meta;
    uint64_t n_seqs, first_seq, n_docs, n_tokens;
} shard_header;

static void header_pack(const shard_header *h, uint8_t out[SHARD_HEADER])
{
    memset(out, 0, SHARD_HEADER);
    memcpy(out, SHARD_MAGIC, 8);
    put32(out + 8, SHARD_VERSION);
    put32(out + 12, SHARD_HEADER);
    put32(out + 16, (uint32_t)h->meta.format);
    put32(out + 20, (uint32_t)h->meta.seq_len);
    put32(out + 24, (uint32_t)h->meta.vocab_size);
    put32(out + 28, (uint32_t)h->meta.pad_id);
    put64(out + 32, h->meta.tokenizer_hash);
    put64(out + 40, h->n_seqs);
    put64(out + 48, h->first_seq);
    put64(out + 56, h->n_docs);
    put64(out + 64, h->n_tokens);
    put64(out + 72, td_fnv1a(out, 72, TD_FNV_OFFSET));
}

static trex_code header_unpack(const uint8_t in[SHARD_HEADER], const char *path, shard_header *h, trex_err *err)
{
    if (memcmp(in, SHARD_MAGIC, 8) != 0)
        return trex_err_set(err, TREX_EFORMAT, "%s: not a trex token shard (bad magic)", path);
    if (get32(in + 8) != SHARD_VERSION || get32(in + 12) != SHARD_HEADER)
        return trex_err_set(err, TREX_EFORMAT, "%s: shard version %u (header %u bytes); this trex reads version %u",
                            path, get32(in + 8), get32(in + 12), SHARD_VERSION);
    if (get64(in + 72) != td_fnv1a(in, 72, TD_FNV_OFFSET))
        return trex_err_set(err, TREX_EFORMAT, "%s: the header checksum does not match (corrupt file)", path);
    uint32_t fmt = get32(in + 16), L = get32(in + 20), V = get32(in + 24), pad = get32(in + 28);
    if (fmt > 1 || L == 0 || L > INT32_MAX || V == 0 || V > INT32_MAX || pad >= V)
        return trex_err_set(err, TREX_EFORMAT, "%s: header values out of range (format %u, seq_len %u, vocab %u, pad %u)",
                            path, fmt, L, V, pad);
    h->meta.format = (trex_data_format)fmt;
    h->meta.seq_len = (int32_t)L;
    h->meta.vocab_size = (int32_t)V;
    h->meta.pad_id = (int32_t)pad;
    h->meta.tokenizer_hash = get64(in + 32);
    h->n_seqs = get64(in + 40);
    h->first_seq = get64(in + 48);
    h->n_docs = get64(in + 56);
    h->n_tokens = get64(in + 64);
    return TREX_OK;
}

static int64_t row_bytes(int32_t seq_len)
{
    return ((int64_t)seq_len + 7) / 8;
}

static const char *format_name(trex_data_format f)
{
    return f == TREX_DATA_SFT ? "sft" : "cpt";
}

/* --- writer ------------------------------------------------------------------------------------- */

struct trex_shard_writer {
    char *dir;
    trex_shard_meta meta;
    int64_t seqs_per_shard, rowb;
    /* the sequence being filled */
    int32_t *ids;
    uint8_t *mask, *start;
    int32_t fill;
    int64_t pieces_here;
    /* the shard being filled */
    uint8_t *tok_le, *mask_bits, *start_bits;
    int64_t nseq, shard_docs, shard_tokens;
    /* shards written */
    int64_t *shard_seqs;
    int nshards, shard_cap;
    trex_shard_stats st;
};

static char *shard_path(const char *dir, int k)
{
    size_t n = strlen(dir) + 32;
    char *p = trex_xmalloc(n);
    snprintf(p, n, "%s/shard-%05d.bin", dir, k);
    return p;
}

static char *manifest_path(const char *dir)
{
    size_t n = strlen(dir) + 32;
    char *p = trex_xmalloc(n);
    snprintf(p, n, "%s/manifest.json", dir);
    return p;
}

static trex_code check_dir_free(const char *dir, trex_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return trex_err_set(err, TREX_EIO, "%s: cannot open the folder: %s", dir, strerror(errno));
    trex_code rc = TREX_OK;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, "manifest.json") ||
            (!strncmp(e->d_name, "shard-", 6) && strlen(e->d_name) > 10 &&
             !strcmp(e->d_name + strlen(e->d_name) - 4, ".bin"))) {
            rc = trex_err_set(err, TREX_EINVAL, "%s already holds token shards (%s); remove them or choose another "
                                                "output folder", dir, e->d_name);
            break;
        }
    }
    closedir(d);
    return rc;
}

trex_code trex_shard_writer_open(trex_shard_writer **out, const char *dir, const trex_shard_meta *meta,
                                 int64_t seqs_per_shard, trex_err *err)
{
    TREX_ASSERT(out && dir && meta);
    *out = NULL;
    if (meta->seq_len < 1 || meta->vocab_size < 1 || meta->pad_id < 0 || meta->pad_id >= meta->vocab_size)
        return trex_err_set(err, TREX_EINVAL, "shard writer: seq_len %d, vocab %d, pad id %d: need seq_len >= 1 and "
                                              "0 <= pad id < vocab", meta->seq_len, meta->vocab_size, meta->pad_id);
    if (seqs_per_shard < 0)
        return trex_err_set(err, TREX_EINVAL, "shard writer: sequences per shard must be >= 0 (0 = default)");
    TREX_TRY(trex_mkdirs(dir, err));
    TREX_TRY(check_dir_free(dir, err));
    trex_shard_writer *w = trex_xcalloc(1, sizeof *w);
    w->dir = td_xstrndup(dir, strlen(dir));
    w->meta = *meta;
    w->seqs_per_shard = seqs_per_shard ? seqs_per_shard
                                       : (DEFAULT_SHARD_TOKENS / meta->seq_len > 0 ? DEFAULT_SHARD_TOKENS / meta->seq_len
                                                                                    : 1);
    w->rowb = row_bytes(meta->seq_len);
    size_t L = (size_t)meta->seq_len;
    w->ids = trex_xmalloc(L * sizeof *w->ids);
    w->mask = trex_xcalloc(L, 1);
    w->start = trex_xcalloc(L, 1);
    *out = w;
    return TREX_OK;
}

static trex_code write_shard(trex_shard_writer *w, trex_err *err)
{
    if (w->nseq == 0)
        return TREX_OK;
    shard_header h = {w->meta, (uint64_t)w->nseq, (uint64_t)(w->st.sequences - w->nseq), (uint64_t)w->shard_docs,
                      (uint64_t)w->shard_tokens};
    uint8_t hb[SHARD_HEADER];
    header_pack(&h, hb);
    char *path = shard_path(w->dir, w->nshards);
    trex_atomic_file *f = NULL;
    trex_code rc = trex_file_atomic_open(&f, path, err);
    if (rc == TREX_OK)
        rc = trex_file_atomic_write(f, hb, sizeof hb, err);
    if (rc == TREX_OK)
        rc = trex_file_atomic_write(f, w->tok_le, (size_t)(w->nseq * w->meta.seq_len * 4), err);
    if (rc == TREX_OK)
        rc = trex_file_atomic_write(f, w->mask_bits, (size_t)(w->nseq * w->rowb), err);
    if (rc == TREX_OK)
        rc = trex_file_atomic_write(f, w->start_bits, (size_t)(w->nseq * w->rowb), err);
    if (rc == TREX_OK)
        rc = trex_file_atomic_commit(f, err); /* frees f, also on failure */
    else
        trex_file_atomic_abort(f);
    free(path);
    if (rc != TREX_OK)
        return rc;
    if (w->nshards == w->shard_cap) {
        int64_t c = w->shard_cap;
        td_grow((void **)&w->shard_seqs, &c, w->nshards + 1, sizeof *w->shard_seqs);
        w->shard_cap = (int)c;
    }
    w->shard_seqs[w->nshards++] = w->nseq;
    w->st.shards = w->nshards;
    w->nseq = w->shard_docs = w->shard_tokens = 0;
    return TREX_OK;
}

static trex_code finish_seq(trex_shard_writer *w, trex_err *err)
{
    int32_t L = w->meta.seq_len;
    if (w->fill == 0)
        return TREX_OK;
    if (w->fill < L) {
        w->start[w->fill] = 1;
        for (int32_t t = w->fill; t < L; t++) {
            w->ids[t] = w->meta.pad_id;
            w->mask[t] = 0;
        }
        w->st.padding += L - w->fill;
    }
    if (!w->tok_le) {
        size_t n = (size_t)w->seqs_per_shard;
        w->tok_le = trex_xmalloc(n * (size_t)L * 4);
        w->mask_bits = trex_xmalloc(n * (size_t)w->rowb);
        w->start_bits = trex_xmalloc(n * (size_t)w->rowb);
    }
    uint8_t *tk = w->tok_le + (size_t)w->nseq * (size_t)L * 4;
    uint8_t *mb = w->mask_bits + (size_t)w->nseq * (size_t)w->rowb;
    uint8_t *sb = w->start_bits + (size_t)w->nseq * (size_t)w->rowb;
    memset(mb, 0, (size_t)w->rowb);
    memset(sb, 0, (size_t)w->rowb);
    for (int32_t t = 0; t < L; t++) {
        put32(tk + 4 * (size_t)t, (uint32_t)w->ids[t]);
        mb[t >> 3] |= (uint8_t)((w->mask[t] ? 1u : 0u) << (t & 7));
        sb[t >> 3] |= (uint8_t)((w->start[t] ? 1u : 0u) << (t & 7));
    }
    memset(w->start, 0, (size_t)L);
    w->fill = 0;
    w->nseq++;
    w->st.sequences++;
    if (w->nseq == w->seqs_per_shard)
        return write_shard(w, err);
    return TREX_OK;
}

static trex_code place(trex_shard_writer *w, const int32_t *ids, const uint8_t *mask, int32_t n, trex_err *err)
{
    TREX_ASSERT(n > 0 && w->fill + n <= w->meta.seq_len);
    w->start[w->fill] = 1;
    memcpy(w->ids + w->fill, ids, (size_t)n * sizeof *ids);
    for (int32_t i = 0; i < n; i++) {
        w->mask[w->fill + i] = mask ? (mask[i] != 0) : 1;
        w->st.targets += w->mask[w->fill + i];
    }
    w->fill += n;
    w->st.tokens += n;
    w->st.pieces++;
    w->shard_docs++;
    w->shard_tokens += n;
    if (w->fill == w->meta.seq_len)
        return finish_seq(w, err);
    return TREX_OK;
}

trex_code trex_shard_writer_add(trex_shard_writer *w, const int32_t *ids, const uint8_t *mask, int64_t n,
                                bool splittable, trex_err *err)
{
    TREX_ASSERT(w && (ids || n == 0));
    int32_t L = w->meta.seq_len;
    if (n <= 0)
        return trex_err_set(err, TREX_EINVAL, "an empty document cannot be packed");
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->meta.vocab_size)
            return trex_err_set(err, TREX_ERANGE, "token id %d at position %lld is outside the vocabulary (%d ids)",
                                ids[i], (long long)i, w->meta.vocab_size);
    if (n > L && !splittable)
        return trex_err_set(err, TREX_ERANGE, "a sample of %lld tokens is longer than the sequence length %d",
                            (long long)n, L);
    if (n <= L) {
        if (w->fill + n > L)
            TREX_TRY(finish_seq(w, err));
        TREX_TRY(place(w, ids, mask, (int32_t)n, err));
    } else {
        for (int64_t off = 0; off < n;) {
            int32_t take = (int32_t)(n - off < L - w->fill ? n - off : L - w->fill);
            TREX_TRY(place(w, ids + off, mask ? mask + off : NULL, take, err));
            off += take;
        }
        w->st.split_docs++;
    }
    w->st.documents++;
    return TREX_OK;
}

static cJSON *manifest_json(const trex_shard_writer *w)
{
    char hash[40];
    snprintf(hash, sizeof hash, "fnv1a64:%016" PRIx64, w->meta.tokenizer_hash);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", MANIFEST_FORMAT);
    cJSON_AddNumberToObject(j, "version", SHARD_VERSION);
    cJSON_AddStringToObject(j, "data", format_name(w->meta.format));
    cJSON_AddNumberToObject(j, "seq_len", w->meta.seq_len);
    cJSON_AddNumberToObject(j, "vocab_size", w->meta.vocab_size);
    cJSON_AddNumberToObject(j, "pad_id", w->meta.pad_id);
    cJSON_AddStringToObject(j, "tokenizer_hash", hash);
    cJSON_AddNumberToObject(j, "sequences", (double)w->st.sequences);
    cJSON_AddNumberToObject(j, "documents", (double)w->st.documents);
    cJSON_AddNumberToObject(j, "pieces", (double)w->st.pieces);
    cJSON_AddNumberToObject(j, "split_documents", (double)w->st.split_docs);
    cJSON_AddNumberToObject(j, "tokens", (double)w->st.tokens);
    cJSON_AddNumberToObject(j, "targets", (double)w->st.targets);
    cJSON_AddNumberToObject(j, "padding", (double)w->st.padding);
    cJSON *arr = cJSON_AddArrayToObject(j, "shards");
    int64_t first = 0;
    for (int k = 0; k < w->nshards; k++) {
        char name[32];
        snprintf(name, sizeof name, "shard-%05d.bin", k);
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "file", name);
        cJSON_AddNumberToObject(s, "first", (double)first);
        cJSON_AddNumberToObject(s, "sequences", (double)w->shard_seqs[k]);
        cJSON_AddItemToArray(arr, s);
        first += w->shard_seqs[k];
    }
    return j;
}

static void writer_free(trex_shard_writer *w)
{
    free(w->dir);
    free(w->ids);
    free(w->mask);
    free(w->start);
    free(w->tok_le);
    free(w->mask_bits);
    free(w->start_bits);
    free(w->shard_seqs);
    free(w);
}

trex_code trex_shard_writer_close(trex_shard_writer *w, trex_shard_stats *st, trex_err *err)
{
    TREX_ASSERT(w);
    trex_code rc = finish_seq(w, err);
    if (rc == TREX_OK)
        rc = write_shard(w, err);
    if (rc == TREX_OK) {
        cJSON *j = manifest_json(w);
        char *mp = manifest_path(w->dir);
        rc = trex_json_save(mp, j, err);
        free(mp);
        cJSON_Delete(j);
    }
    if (st)
        *st = w->st;
    if (rc != TREX_OK) {
        trex_shard_writer_abort(w);
        return rc;
    }
    writer_free(w);
    return TREX_OK;
}

void trex_shard_writer_abort(trex_shard_writer *w)
{
    if (!w)
        return;
    for (int k = 0; k < w->nshards; k++) { /* the files this writer made; no manifest points at them */
        char *p = shard_path(w->dir, k);
        unlink(p);
        free(p);
    }
    writer_free(w);
}

/* --- reader ------------------------------------------------------------------------------------- */

typedef struct shard_file {
    int fd;
    int64_t first, nseq;
} shard_file;

struct trex_shard_reader {
    char *dir;
    trex_shard_info info;
    shard_file *files;
    int64_t pos, rowb;
    uint8_t *buf; /* one sequence's tokens (LE) */
    uint8_t *mrow, *srow;
};

static trex_code json_count(const cJSON *j, const char *key, const char *path, int64_t *out, trex_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return trex_err_set(err, TREX_EFORMAT, "%s: field \"%s\" is missing or not a count", path, key);
    *out = (int64_t)v->valuedouble;
    return TREX_OK;
}

void trex_shard_close(trex_shard_reader *r)
{
    if (!r)
        return;
    if (r->files)
        for (int k = 0; k < r->info.nshards; k++)
            if (r->files[k].fd >= 0)
                close(r->files[k].fd);
    free(r->files);
    free(r->buf);
    free(r->mrow);
    free(r->srow);
    free(r->dir);
    free(r);
}

static trex_code open_shard_file(trex_shard_reader *r, int k, const char *name, int64_t first, int64_t nseq,
                                 trex_err *err)
{
    size_t n = strlen(r->dir) + strlen(name) + 2;
    char *path = trex_xmalloc(n);
    snprintf(path, n, "%s/%s", r->dir, name);
    trex_code rc = TREX_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    r->files[k].fd = fd;
    r->files[k].first = first;
    r->files[k].nseq = nseq;
    uint8_t hb[SHARD_HEADER];
    shard_header h = {0};
    struct stat st;
    if (fd < 0) {
        rc = trex_err_set(err, errno == ENOENT ? TREX_ENOTFOUND : TREX_EIO, "%s: cannot open: %s", path,
                          strerror(errno));
        goto out;
    }
    if (pread(fd, hb, sizeof hb, 0) != (ssize_t)sizeof hb) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: shorter than a shard header (truncated file)", path);
        goto out;
    }
    if ((rc = header_unpack(hb, path, &h, err)) != TREX_OK)
        goto out;
    const trex_shard_meta *m = &r->info.meta;
    if (h.meta.format != m->format || h.meta.seq_len != m->seq_len || h.meta.vocab_size != m->vocab_size ||
        h.meta.pad_id != m->pad_id || h.meta.tokenizer_hash != m->tokenizer_hash || (int64_t)h.n_seqs != nseq ||
        (int64_t)h.first_seq != first) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: the header does not match manifest.json (a file from another run?)",
                          path);
        goto out;
    }
    int64_t want = SHARD_HEADER + nseq * ((int64_t)m->seq_len * 4 + 2 * r->rowb);
    if (fstat(fd, &st) != 0 || st.st_size != want) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: %lld bytes, expected %lld (truncated or corrupt)", path,
                          (long long)st.st_size, (long long)want);
        goto out;
    }
    r->info.n_docs += (int64_t)h.n_docs;
out:
    free(path);
    return rc;
}

trex_code trex_shard_open(trex_shard_reader **out, const char *dir, const trex_tokenizer *tok, trex_err *err)
{
    TREX_ASSERT(out && dir);
    *out = NULL;
    char *mp = manifest_path(dir);
    cJSON *j = NULL;
    trex_code rc = trex_json_load(mp, &j, err);
    if (rc == TREX_ENOTFOUND) {
        rc = trex_err_set(err, TREX_ENOTFOUND, "%s has no manifest.json: not a shard folder, or the tokenize run that "
                                               "made it did not finish (run `trex data tokenize` again)", dir);
    }
    if (rc != TREX_OK) {
        free(mp);
        return rc;
    }
    trex_shard_reader *r = trex_xcalloc(1, sizeof *r);
    r->dir = td_xstrndup(dir, strlen(dir));
    trex_shard_meta *m = &r->info.meta;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
    const cJSON *hash = cJSON_GetObjectItemCaseSensitive(j, "tokenizer_hash");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(j, "shards");
    int64_t version = 0, L = 0, V = 0, pad = 0, nseq = 0, ntok = 0;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, MANIFEST_FORMAT) != 0) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: \"format\" is not \"%s\"", mp, MANIFEST_FORMAT);
        goto fail;
    }
    if ((rc = json_count(j, "version", mp, &version, err)) || (rc = json_count(j, "seq_len", mp, &L, err)) ||
        (rc = json_count(j, "vocab_size", mp, &V, err)) || (rc = json_count(j, "pad_id", mp, &pad, err)) ||
        (rc = json_count(j, "sequences", mp, &nseq, err)) || (rc = json_count(j, "tokens", mp, &ntok, err)))
        goto fail;
    if (version != SHARD_VERSION) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: version %lld; this trex reads version %u", mp, (long long)version,
                          SHARD_VERSION);
        goto fail;
    }
    if (L < 1 || L > INT32_MAX || V < 1 || V > INT32_MAX || pad >= V) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: seq_len, vocab_size or pad_id out of range", mp);
        goto fail;
    }
    if (!cJSON_IsString(data) || (strcmp(data->valuestring, "cpt") && strcmp(data->valuestring, "sft"))) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: \"data\" must be \"cpt\" or \"sft\"", mp);
        goto fail;
    }
    unsigned long long hv = 0;
    int used = 0;
    if (!cJSON_IsString(hash) || sscanf(hash->valuestring, "fnv1a64:%16llx%n", &hv, &used) != 1 ||
        used != (int)strlen(hash->valuestring) || used != 24) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: \"tokenizer_hash\" must be \"fnv1a64:<16 hex digits>\"", mp);
        goto fail;
    }
    m->format = !strcmp(data->valuestring, "sft") ? TREX_DATA_SFT : TREX_DATA_CPT;
    m->seq_len = (int32_t)L;
    m->vocab_size = (int32_t)V;
    m->pad_id = (int32_t)pad;
    m->tokenizer_hash = hv;
    r->info.n_seqs = nseq;
    r->info.n_tokens = ntok;
    r->rowb = row_bytes(m->seq_len);
    if (tok && trex_tok_hash(tok) != m->tokenizer_hash) {
        rc = trex_err_set(err, TREX_EINVAL, "%s was tokenized with tokenizer fnv1a64:%016llx, but the tokenizer given is "
                                            "fnv1a64:%016llx; use the tokenizer.json the shards were made with, or "
                                            "re-run `trex data tokenize` with this one",
                          dir, (unsigned long long)m->tokenizer_hash, (unsigned long long)trex_tok_hash(tok));
        goto fail;
    }
    if (tok && trex_tok_vocab_size(tok) != m->vocab_size) {
        rc = trex_err_set(err, TREX_EINVAL, "%s: vocabulary of %d ids, but the tokenizer has %d", dir, m->vocab_size,
                          trex_tok_vocab_size(tok));
        goto fail;
    }
    if (!cJSON_IsArray(shards)) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: \"shards\" must be an array", mp);
        goto fail;
    }
    int ns = cJSON_GetArraySize(shards);
    r->files = trex_xmalloc((size_t)(ns ? ns : 1) * sizeof *r->files);
    for (int k = 0; k < ns; k++)
        r->files[k].fd = -1;
    r->info.nshards = ns;
    int64_t first = 0;
    int k = 0;
    for (const cJSON *s = shards->child; s; s = s->next, k++) {
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(s, "file");
        int64_t sf = 0, sn = 0;
        if (!cJSON_IsString(file) || strchr(file->valuestring, '/') || (rc = json_count(s, "first", mp, &sf, err)) ||
            (rc = json_count(s, "sequences", mp, &sn, err)) || sf != first || sn < 1) {
            if (rc == TREX_OK)
                rc = trex_err_set(err, TREX_EFORMAT, "%s: shards[%d] is malformed (file, first, sequences)", mp, k);
            goto fail;
        }
        if ((rc = open_shard_file(r, k, file->valuestring, sf, sn, err)) != TREX_OK)
            goto fail;
        first += sn;
    }
    if (first != nseq) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: the shards hold %lld sequences, \"sequences\" says %lld", mp,
                          (long long)first, (long long)nseq);
        goto fail;
    }
    r->buf = trex_xmalloc((size_t)m->seq_len * 4);
    r->mrow = trex_xmalloc((size_t)r->rowb);
    r->srow = trex_xmalloc((size_t)r->rowb);
    cJSON_Delete(j);
    free(mp);
    *out = r;
    return TREX_OK;
fail:
    cJSON_Delete(j);
    free(mp);
    trex_shard_close(r);
    return rc;
}

const trex_shard_info *trex_shard_reader_info(const trex_shard_reader *r)
{
    return &r->info;
}

static trex_code pread_all(int fd, void *buf, size_t n, off_t off, const char *dir, trex_err *err)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return trex_err_set(err, TREX_EIO, "%s: read failed: %s", dir, k < 0 ? strerror(errno) : "unexpected end");
        got += (size_t)k;
    }
    return TREX_OK;
}

trex_code trex_shard_read(trex_shard_reader *r, int64_t index, int32_t *tokens, uint8_t *mask, int32_t *doc_ids,
                          trex_err *err)
{
    TREX_ASSERT(r);
    if (index < 0 || index >= r->info.n_seqs)
        return trex_err_set(err, TREX_ERANGE, "%s: sequence %lld does not exist (%lld sequences)", r->dir,
                            (long long)index, (long long)r->info.n_seqs);
    int lo = 0, hi = r->info.nshards - 1;
    while (lo < hi) { /* last file with first <= index */
        int mid = (lo + hi + 1) / 2;
        if (r->files[mid].first <= index)
            lo = mid;
        else
            hi = mid - 1;
    }
    const shard_file *f = &r->files[lo];
    int64_t L = r->info.meta.seq_len, i = index - f->first;
    off_t tok_off = SHARD_HEADER + (off_t)(i * L * 4);
    off_t mask_off = SHARD_HEADER + (off_t)(f->nseq * L * 4 + i * r->rowb);
    off_t start_off = SHARD_HEADER + (off_t)(f->nseq * L * 4 + f->nseq * r->rowb + i * r->rowb);
    TREX_TRY(pread_all(f->fd, r->buf, (size_t)L * 4, tok_off, r->dir, err));
    TREX_TRY(pread_all(f->fd, r->mrow, (size_t)r->rowb, mask_off, r->dir, err));
    TREX_TRY(pread_all(f->fd, r->srow, (size_t)r->rowb, start_off, r->dir, err));
    if (!(r->srow[0] & 1))
        return trex_err_set(err, TREX_EFORMAT, "%s: sequence %lld does not start a document (corrupt shard)", r->dir,
                            (long long)index);
    int32_t doc = -1;
    for (int64_t t = 0; t < L; t++) {
        uint32_t id = get32(r->buf + 4 * t);
        if (id >= (uint32_t)r->info.meta.vocab_size)
            return trex_err_set(err, TREX_EFORMAT, "%s: sequence %lld, position %lld: token %u is outside the "
                                                   "vocabulary (corrupt shard)", r->dir, (long long)index, (long long)t,
                                id);
        doc += (r->srow[t >> 3] >> (t & 7)) & 1;
        if (tokens)
            tokens[t] = (int32_t)id;
        if (mask)
            mask[t] = (r->mrow[t >> 3] >> (t & 7)) & 1;
        if (doc_ids)
            doc_ids[t] = doc;
    }
    return TREX_OK;
}

trex_code trex_shard_next(trex_shard_reader *r, int32_t *tokens, uint8_t *mask, int32_t *doc_ids, bool *eof,
                          trex_err *err)
{
    *eof = r->pos >= r->info.n_seqs;
    if (*eof)
        return TREX_OK;
    TREX_TRY(trex_shard_read(r, r->pos, tokens, mask, doc_ids, err));
    r->pos++;
    return TREX_OK;
}

int64_t trex_shard_tell(const trex_shard_reader *r)
{
    return r->pos;
}

trex_code trex_shard_seek(trex_shard_reader *r, int64_t position, trex_err *err)
{
    if (position < 0 || position > r->info.n_seqs)
        return trex_err_set(err, TREX_ERANGE, "%s: position %lld is outside 0..%lld", r->dir, (long long)position,
                            (long long)r->info.n_seqs);
    r->pos = position;
    return TREX_OK;
}
