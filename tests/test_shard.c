/* tests/test_shard.c — token shards: the packer against an independent reference packer (greedy, input
 * order, SFT samples never split, CPT documents longer than a sequence split, EOS padding as its own
 * document), the round trip through files and the reader (tokens, masks, per-sequence document ids,
 * position and seek), several shard files, the tokenizer check, and damaged or partial folders. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "trex/data.h"
#include "trex/rng.h"

#define FIXTURE "tests/tokenizer/fixture_dsv3.json"
#define L 16
#define V 100
#define PAD 1

typedef struct doc {
    int32_t ids[64];
    uint8_t mask[64];
    int n;
} doc;

/* The reference layout: seq[s][t] tokens, masks and document ids. */
typedef struct layout {
    int32_t tok[256][L], docid[256][L];
    uint8_t mask[256][L];
    int nseq;
} layout;

static void ref_flush(layout *o, int *fill, int *d)
{
    if (*fill == 0)
        return;
    if (*fill < L) {
        (*d)++;
        for (int t = *fill; t < L; t++) {
            o->tok[o->nseq][t] = PAD;
            o->mask[o->nseq][t] = 0;
            o->docid[o->nseq][t] = *d;
        }
    }
    o->nseq++;
    *fill = 0;
    *d = -1;
}

static void ref_put(layout *o, const doc *x, int from, int n, int *fill, int *d)
{
    (*d)++;
    for (int i = 0; i < n; i++) {
        o->tok[o->nseq][*fill] = x->ids[from + i];
        o->mask[o->nseq][*fill] = x->mask[from + i];
        o->docid[o->nseq][*fill] = *d;
        (*fill)++;
    }
    if (*fill == L)
        ref_flush(o, fill, d);
}

static void ref_pack(const doc *docs, int ndocs, bool splittable, layout *o)
{
    memset(o, 0, sizeof *o);
    int fill = 0, d = -1;
    for (int k = 0; k < ndocs; k++) {
        const doc *x = &docs[k];
        if (x->n > L && !splittable)
            continue;
        if (x->n <= L) {
            if (fill + x->n > L)
                ref_flush(o, &fill, &d);
            ref_put(o, x, 0, x->n, &fill, &d);
        } else {
            for (int off = 0; off < x->n;) {
                int take = x->n - off < L - fill ? x->n - off : L - fill;
                ref_put(o, x, off, take, &fill, &d);
                off += take;
            }
        }
    }
    ref_flush(o, &fill, &d);
}

static void make_docs(doc *docs, int n, int maxlen, uint64_t seed)
{
    trex_rng r = trex_rng_make(seed, 0);
    for (int k = 0; k < n; k++) {
        docs[k].n = 1 + (int)trex_rng_below(&r, (uint64_t)maxlen);
        for (int i = 0; i < docs[k].n; i++) {
            docs[k].ids[i] = 2 + (int32_t)trex_rng_below(&r, V - 2);
            docs[k].mask[i] = (uint8_t)trex_rng_below(&r, 2);
        }
    }
}

static int count_files(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, suffix))
            n++;
    closedir(d);
    return n;
}

static void rm_rf(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char p[512];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Writes docs into dir and compares every sequence read back with the reference layout. */
static void pack_and_compare(const char *dir, const doc *docs, int ndocs, bool splittable, int64_t per_shard,
                             uint64_t hash, const char *what)
{
    trex_shard_meta meta = {splittable ? TREX_DATA_CPT : TREX_DATA_SFT, L, V, PAD, hash};
    trex_shard_writer *w = NULL;
    trex_err err = {0};
    CHECK(trex_shard_writer_open(&w, dir, &meta, per_shard, &err) == TREX_OK, "%s: open: %s", what, err.msg);
    if (!w)
        return;
    int64_t rejected = 0, ntok = 0, nsplit = 0;
    for (int k = 0; k < ndocs; k++) {
        trex_code rc = trex_shard_writer_add(w, docs[k].ids, docs[k].mask, docs[k].n, splittable, &err);
        if (docs[k].n > L && !splittable) {
            CHECK(rc == TREX_ERANGE && strstr(err.msg, "longer than the sequence length"), "%s: too long: %s", what,
                  err.msg);
            rejected++;
        } else {
            CHECK(rc == TREX_OK, "%s: add: %s", what, err.msg);
            ntok += docs[k].n;
            nsplit += docs[k].n > L;
        }
    }
    trex_shard_stats st = {0};
    CHECK(trex_shard_writer_close(w, &st, &err) == TREX_OK, "%s: close: %s", what, err.msg);
    static layout ref;
    ref_pack(docs, ndocs, splittable, &ref);
    CHECK(st.sequences == ref.nseq && st.tokens == ntok && st.documents == ndocs - rejected &&
              st.split_docs == nsplit && st.padding == st.sequences * L - ntok,
          "%s: stats: %lld sequences (want %d), %lld tokens (want %lld), %lld docs, %lld split, %lld padding", what,
          (long long)st.sequences, ref.nseq, (long long)st.tokens, (long long)ntok, (long long)st.documents,
          (long long)st.split_docs, (long long)st.padding);
    CHECK(st.shards == (st.sequences + per_shard - 1) / per_shard && count_files(dir, ".bin") == st.shards &&
              count_files(dir, ".tmp") == 0,
          "%s: %lld shard files, no temporary files left", what, (long long)st.shards);

    trex_shard_reader *r = NULL;
    CHECK(trex_shard_open(&r, dir, NULL, &err) == TREX_OK, "%s: reader: %s", what, err.msg);
    if (!r)
        return;
    const trex_shard_info *info = trex_shard_reader_info(r);
    CHECK(info->n_seqs == ref.nseq && info->meta.seq_len == L && info->meta.pad_id == PAD &&
              info->meta.tokenizer_hash == hash && info->n_tokens == ntok && info->nshards == st.shards &&
              info->n_docs == st.pieces,
          "%s: reader info", what);
    int32_t tok[L], docid[L];
    uint8_t mask[L];
    bool same = true;
    int64_t k = 0;
    for (bool eof = false;; k++) {
        CHECK(trex_shard_tell(r) == k, "%s: position %lld", what, (long long)k);
        if (trex_shard_next(r, tok, mask, docid, &eof, &err) != TREX_OK) {
            CHECK(0, "%s: next: %s", what, err.msg);
            break;
        }
        if (eof)
            break;
        if (k >= ref.nseq || memcmp(tok, ref.tok[k], sizeof tok) || memcmp(mask, ref.mask[k], sizeof mask) ||
            memcmp(docid, ref.docid[k], sizeof docid)) {
            same = false;
            break;
        }
    }
    CHECK(same && k == ref.nseq, "%s: every sequence equals the reference packing (stopped at %lld of %d)", what,
          (long long)k, ref.nseq);
    /* resume from a saved position */
    if (ref.nseq > 3) {
        bool eof = false;
        CHECK(trex_shard_seek(r, 3, &err) == TREX_OK && trex_shard_next(r, tok, mask, docid, &eof, &err) == TREX_OK &&
                  !eof && !memcmp(tok, ref.tok[3], sizeof tok) && trex_shard_tell(r) == 4,
              "%s: seek(3) then next reads sequence 3", what);
        CHECK(trex_shard_read(r, ref.nseq - 1, tok, NULL, docid, &err) == TREX_OK &&
                  !memcmp(docid, ref.docid[ref.nseq - 1], sizeof docid),
              "%s: random access to the last sequence", what);
    }
    CHECK(trex_shard_seek(r, info->n_seqs + 1, &err) == TREX_ERANGE, "%s: seek past the end", what);
    CHECK(trex_shard_read(r, -1, tok, mask, docid, &err) == TREX_ERANGE, "%s: read(-1)", what);
    trex_shard_close(r);
}

/* SFT: each sample appears whole, as one document of one sequence, in input order. */
static void check_sft_unsplit(const char *dir, const doc *docs, int ndocs)
{
    trex_shard_reader *r = NULL;
    trex_err err = {0};
    if (trex_shard_open(&r, dir, NULL, &err) != TREX_OK) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int32_t tok[L], docid[L];
    uint8_t mask[L];
    int next = 0;
    bool ok = true;
    while (next < ndocs && docs[next].n > L)
        next++;
    for (int64_t s = 0; s < trex_shard_reader_info(r)->n_seqs && ok; s++) {
        ok = trex_shard_read(r, s, tok, mask, docid, &err) == TREX_OK;
        for (int t = 0; t < L && ok;) {
            int e = t;
            while (e < L && docid[e] == docid[t])
                e++;
            bool pad = true;
            for (int i = t; i < e; i++)
                pad &= tok[i] == PAD && mask[i] == 0;
            if (pad && e == L) {
                t = e;
                continue;
            }
            ok = next < ndocs && e - t == docs[next].n && !memcmp(tok + t, docs[next].ids, (size_t)(e - t) * 4) &&
                 !memcmp(mask + t, docs[next].mask, (size_t)(e - t));
            next++;
            while (next < ndocs && docs[next].n > L)
                next++;
            t = e;
        }
    }
    CHECK(ok && next == ndocs, "SFT: every sample is one whole document, in order (got to %d of %d)", next, ndocs);
    trex_shard_close(r);
}

static void test_packing(const char *base)
{
    static doc docs[200];
    char dir[512];
    make_docs(docs, 120, 40, 7); /* CPT: many documents longer than L */
    snprintf(dir, sizeof dir, "%s/cpt", base);
    pack_and_compare(dir, docs, 120, true, 5, 0x1234, "cpt");
    rm_rf(dir);

    make_docs(docs, 200, 18, 11); /* SFT: a few longer than L (rejected) */
    int too_long = 0;
    for (int k = 0; k < 200; k++)
        too_long += docs[k].n > L;
    CHECK(too_long > 3 && too_long < 40, "the SFT set has some samples longer than L (%d)", too_long);
    snprintf(dir, sizeof dir, "%s/sft", base);
    pack_and_compare(dir, docs, 200, false, 7, 0x5678, "sft");
    check_sft_unsplit(dir, docs, 200);
    rm_rf(dir);

    /* exact sizes: a document of exactly L, then one that fills the rest exactly */
    doc d3[3] = {{{0}, {0}, L}, {{0}, {0}, 5}, {{0}, {0}, L - 5}};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < d3[k].n; i++)
            d3[k].ids[i] = 2 + k, d3[k].mask[i] = 1;
    snprintf(dir, sizeof dir, "%s/exact", base);
    pack_and_compare(dir, d3, 3, false, 100, 1, "exact fit");
    rm_rf(dir);
}

static void test_folder_errors(const char *base)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/err", base);
    static doc docs[40];
    make_docs(docs, 40, 10, 3);
    trex_tokenizer *tok = NULL;
    trex_err err = {0};
    CHECK(trex_tok_load(&tok, FIXTURE, &err) == TREX_OK, "%s", err.msg);
    if (!tok)
        return;
    trex_shard_meta meta = {TREX_DATA_SFT, L, trex_tok_vocab_size(tok), PAD, trex_tok_hash(tok)};
    trex_shard_writer *w = NULL;
    CHECK(trex_shard_writer_open(&w, dir, &meta, 2, &err) == TREX_OK, "%s", err.msg);
    for (int k = 0; k < 40; k++)
        trex_shard_writer_add(w, docs[k].ids, docs[k].mask, docs[k].n, false, &err);
    CHECK(trex_shard_writer_close(w, NULL, &err) == TREX_OK, "%s", err.msg);

    /* the right tokenizer opens, another one is refused with both hashes */
    trex_shard_reader *r = NULL;
    CHECK(trex_shard_open(&r, dir, tok, &err) == TREX_OK, "open with the tokenizer that made the shards: %s", err.msg);
    trex_shard_close(r);
    r = NULL;
    FILE *f = fopen(FIXTURE, "rb");
    static char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf - 2, f) : 0;
    if (f)
        fclose(f);
    buf[n++] = '\n'; /* same tokenizer, other bytes: another hash */
    trex_tokenizer *other = NULL;
    CHECK(trex_tok_load_mem(&other, buf, n, "other.json", &err) == TREX_OK, "%s", err.msg);
    CHECK(other && trex_shard_open(&r, dir, other, &err) == TREX_EINVAL && strstr(err.msg, "was tokenized with") &&
              strstr(err.msg, "fnv1a64:"),
          "a shard from another tokenizer is an error: %s", err.msg);
    trex_tok_free(other);

    /* writing into a folder that holds shards is refused */
    w = NULL;
    CHECK(trex_shard_writer_open(&w, dir, &meta, 2, &err) == TREX_EINVAL && strstr(err.msg, "already holds"),
          "%s", err.msg);

    /* damage: a header byte, a truncated file, a token outside the vocabulary, no manifest */
    snprintf(path, sizeof path, "%s/shard-00001.bin", dir);
    int fd = open(path, O_RDWR);
    unsigned char c = 0;
    CHECK(fd >= 0 && pread(fd, &c, 1, 20) == 1, "open shard 1");
    unsigned char c2 = c ^ 1;
    CHECK(pwrite(fd, &c2, 1, 20) == 1, "write");
    CHECK(trex_shard_open(&r, dir, NULL, &err) == TREX_EFORMAT && strstr(err.msg, "checksum") &&
              strstr(err.msg, "shard-00001.bin"),
          "a damaged header: %s", err.msg);
    CHECK(pwrite(fd, &c, 1, 20) == 1, "restore");
    struct stat st;
    fstat(fd, &st);
    CHECK(ftruncate(fd, st.st_size - 1) == 0, "truncate");
    CHECK(trex_shard_open(&r, dir, NULL, &err) == TREX_EFORMAT && strstr(err.msg, "truncated"), "a short file: %s",
          err.msg);
    CHECK(ftruncate(fd, st.st_size) == 0, "restore size");
    unsigned char big[4] = {0xff, 0xff, 0, 0};
    CHECK(pwrite(fd, big, 4, 128) == 4, "poke a token");
    CHECK(trex_shard_open(&r, dir, NULL, &err) == TREX_OK, "opens (the payload is read lazily): %s", err.msg);
    int32_t t[L];
    CHECK(r && trex_shard_read(r, 2, t, NULL, NULL, &err) == TREX_EFORMAT && strstr(err.msg, "outside the vocabulary"),
          "a token outside the vocabulary: %s", err.msg);
    trex_shard_close(r);
    close(fd);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    unlink(path);
    CHECK(trex_shard_open(&r, dir, NULL, &err) == TREX_ENOTFOUND && strstr(err.msg, "did not finish"),
          "no manifest: %s", err.msg);
    rm_rf(dir);

    /* abort removes what the writer wrote; no manifest */
    CHECK(trex_shard_writer_open(&w, dir, &meta, 1, &err) == TREX_OK, "%s", err.msg);
    for (int k = 0; k < 10; k++)
        trex_shard_writer_add(w, docs[k].ids, docs[k].mask, docs[k].n, false, &err);
    CHECK(count_files(dir, ".bin") > 0, "full shards are written as they fill");
    trex_shard_writer_abort(w);
    CHECK(count_files(dir, ".bin") == 0 && count_files(dir, "manifest") == 0, "abort leaves no shard and no manifest");
    /* bad arguments */
    trex_shard_meta bad = meta;
    bad.pad_id = bad.vocab_size;
    CHECK(trex_shard_writer_open(&w, dir, &bad, 0, &err) == TREX_EINVAL, "pad id outside the vocabulary");
    CHECK(trex_shard_writer_open(&w, dir, &meta, 0, &err) == TREX_OK, "%s", err.msg);
    int32_t outside[2] = {5, 999999};
    CHECK(trex_shard_writer_add(w, outside, NULL, 2, false, &err) == TREX_ERANGE, "ids outside the vocabulary");
    CHECK(trex_shard_writer_add(w, outside, NULL, 0, false, &err) == TREX_EINVAL, "an empty document");
    trex_shard_writer_abort(w);
    rm_rf(dir);
    trex_tok_free(tok);
}

int main(void)
{
    char base[] = "/tmp/trex-test-shard-XXXXXX";
    if (!mkdtemp(base)) {
        CHECK(0, "mkdtemp");
        return check_summary();
    }
    test_packing(base);
    test_folder_errors(base);
    rmdir(base);
    return check_summary();
}
