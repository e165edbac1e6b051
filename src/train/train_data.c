/* train/train_data.c — the trainer's view of a token shard folder: a fixed order of its sequences per
 * epoch (file order, or a seeded permutation), a position that checkpoints save, and the count of
 * targets of a batch (docs/train.md "Data order"). */
#include <inttypes.h>
#include <string.h>

#include "trex/rng.h"
#include "train/train_internal.h"

/* A stream id for the data order that no other user of the run's seed draws from. */
#define DATA_SEED_SALT 0x6461746120726e67ull /* "data rng" */

trex_code train_loader_open(train_loader *L, const char *dir, const trex_tokenizer *tok, int64_t *seq,
                            int64_t vocab_size, const char *flag, bool shuffle, uint64_t seed, trex_mem *mem,
                            trex_err *err)
{
    memset(L, 0, sizeof *L);
    L->perm_epoch = -1;
    L->dir = dir;
    L->mem = mem;
    trex_code rc = trex_shard_open(&L->r, dir, tok, err);
    if (rc != TREX_OK) {
        trex_err_prefix(err, "%s %s", flag, dir);
        return rc;
    }
    const trex_shard_info *in = trex_shard_reader_info(L->r);
    if (*seq == 0)
        *seq = in->meta.seq_len;
    if (in->meta.seq_len != *seq) {
        rc = trex_err_set(err, TREX_EINVAL,
                          "%s %s: the shards hold sequences of %d tokens (manifest.json seq_len) but --seq is %" PRId64
                          ": pass --seq %d, or tokenize the data again with --seq %" PRId64,
                          flag, dir, (int)in->meta.seq_len, *seq, (int)in->meta.seq_len, *seq);
        goto fail;
    }
    if (in->meta.vocab_size > vocab_size) {
        rc = trex_err_set(err, TREX_EINVAL,
                          "%s %s: the shards' vocabulary has %d ids (manifest.json vocab_size) but the model config "
                          "has vocab_size %" PRId64 ": train with a config whose vocab_size is at least %d",
                          flag, dir, (int)in->meta.vocab_size, vocab_size, (int)in->meta.vocab_size);
        goto fail;
    }
    if (in->n_seqs < 1) {
        rc = trex_err_set(err, TREX_EINVAL, "%s %s: the folder holds no sequences", flag, dir);
        goto fail;
    }
    L->n = in->n_seqs;
    L->seq = *seq;
    L->shuffle = shuffle;
    L->seed = seed;
    if (shuffle) {
        L->perm = trex_mem_alloc(mem, TREX_REGION_BUFFERS, (size_t)L->n * sizeof *L->perm);
        if (!L->perm) {
            rc = trex_err_set(err, TREX_ENOMEM, "%s %s: out of memory for the order of %" PRId64 " sequences",
                              flag, dir, L->n);
            goto fail;
        }
    }
    return TREX_OK;
fail:
    trex_shard_close(L->r);
    L->r = NULL;
    return rc;
}

void train_loader_close(train_loader *L)
{
    if (!L)
        return;
    trex_shard_close(L->r);
    trex_mem_free(L->mem, TREX_REGION_BUFFERS, L->perm);
    memset(L, 0, sizeof *L);
}

static void build_perm(train_loader *L, int64_t epoch)
{
    trex_rng r = trex_rng_make(L->seed ^ DATA_SEED_SALT, (uint64_t)epoch);
    for (int64_t i = 0; i < L->n; i++)
        L->perm[i] = i;
    for (int64_t i = L->n - 1; i > 0; i--) {
        int64_t j = (int64_t)trex_rng_below(&r, (uint64_t)i + 1);
        int64_t t = L->perm[i];
        L->perm[i] = L->perm[j];
        L->perm[j] = t;
    }
    L->perm_epoch = epoch;
}

trex_code train_loader_fill(train_loader *L, int64_t count, int32_t *tokens, uint8_t *mask, int32_t *docs,
                            trex_err *err)
{
    for (int64_t k = 0; k < count; k++) {
        const int64_t epoch = L->pos / L->n, at = L->pos % L->n;
        int64_t idx = at;
        if (L->shuffle) {
            if (L->perm_epoch != epoch)
                build_perm(L, epoch);
            idx = L->perm[at];
        }
        trex_code rc = trex_shard_read(L->r, idx, tokens + k * L->seq, mask + k * L->seq, docs + k * L->seq, err);
        if (rc != TREX_OK) {
            trex_err_prefix(err, "%s", L->dir);
            return rc;
        }
        L->pos++;
    }
    return TREX_OK;
}

void train_loader_source(const train_loader *L, char *buf, size_t cap)
{
    const trex_shard_info *in = trex_shard_reader_info(L->r);
    snprintf(buf, cap, "shards sequences=%" PRId64 " seq_len=%d tokens=%" PRId64 " tokenizer=fnv1a64:%016" PRIx64
             " order=%s",
             in->n_seqs, (int)in->meta.seq_len, in->n_tokens, in->meta.tokenizer_hash,
             L->shuffle ? "shuffle" : "sequential");
}

void train_count_targets(const uint8_t *mask, const int32_t *docs, int64_t B, int64_t T, bool mtp,
                         int64_t *main_targets, int64_t *mtp_targets)
{
    int64_t nm = 0, nt = 0;
    for (int64_t r = 0; r < B; r++)
        for (int64_t t = 0; t + 1 < T; t++) {
            const int64_t i = r * T + t;
            if (mask[i + 1] && docs[i + 1] == docs[i])
                nm++;
            if (mtp && t + 2 < T && mask[i + 2] && docs[i] == docs[i + 1] && docs[i + 1] == docs[i + 2])
                nt++;
        }
    *main_targets = nm;
    *mtp_targets = nt;
}
