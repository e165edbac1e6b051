/* train/train_internal.h — pieces of the trainer shared between its files: the data loader over token
 * shards (train_data.c), target counting, the metrics files and the progress line (metrics.c). */
#ifndef TREX_TRAIN_INTERNAL_H
#define TREX_TRAIN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "trex/alloc.h"
#include "trex/config.h"
#include "trex/data.h"
#include "trex/train.h"

/* ---- settings (train_settings.c) ---------------------------------------------------------------- */

/* The first of the settings a resumed run must keep that differs between a and b (its JSON name, with
 * both values as JSON text in va / vb), or NULL. */
const char *trex_train_settings_fixed_diff(const trex_train_settings *a, const trex_train_settings *b,
                                           char *va, char *vb, size_t cap);

/* ---- data (train_data.c) ------------------------------------------------------------------------ */

/* Sequences of a shard folder in a fixed order: position p (counted from the start of the run) is
 * sequence order_e[p mod n] of epoch e = p / n, where order_e is the identity (sequential) or a
 * Fisher–Yates permutation drawn from the Philox stream (seed, e) (shuffle). */
typedef struct train_loader {
    trex_shard_reader *r;
    const char *dir;
    int64_t n;          /* sequences in the folder */
    int64_t seq;
    bool shuffle;
    uint64_t seed;
    int64_t *perm;      /* [n] when shuffle */
    int64_t perm_epoch; /* the epoch perm holds, -1 for none */
    int64_t pos;
    trex_mem *mem;
} train_loader;

/* Opens dir with the tokenizer's hash check; seq must match the shards' (0 takes theirs, returned in
 * *seq); their vocab must fit vocab_size. Messages name dir, the field and the fix. */
trex_code train_loader_open(train_loader *L, const char *dir, const trex_tokenizer *tok, int64_t *seq,
                            int64_t vocab_size, const char *flag, bool shuffle, uint64_t seed, trex_mem *mem,
                            trex_err *err);
void train_loader_close(train_loader *L);
/* Reads `count` sequences from the position on (advancing it) into [count, seq] arrays. */
trex_code train_loader_fill(train_loader *L, int64_t count, int32_t *tokens, uint8_t *mask, int32_t *docs,
                            trex_err *err);
/* What the position refers to, for the checkpoint ("shards n=.. seq=.. tokenizer=.. order=.."). */
void train_loader_source(const train_loader *L, char *buf, size_t cap);

/* Targets of the main head and of the MTP head in a [B, T] batch, by the rule of
 * docs/model-conventions.md (the model's own count, which the trainer asserts equal). */
void train_count_targets(const uint8_t *mask, const int32_t *docs, int64_t B, int64_t T, bool mtp,
                         int64_t *main_targets, int64_t *mtp_targets);

/* ---- metrics (metrics.c) ------------------------------------------------------------------------ */

typedef struct train_metrics {
    int64_t step, steps;
    double loss, main, mtp, balance, indexer; /* NaN when not finite */
    double mtp_weight;
    int64_t main_targets, mtp_targets, tokens;
    double lr, grad_norm, clip_scale;
    bool skipped;
    int64_t nonfinite, skipped_total, bad_streak;
    double step_s, tokens_per_s, tflops, mfu; /* mfu < 0: unknown peak */
    double peak_rss_mib, mem_mib;
    bool sparse, warmup;
    bool have_eval;
    double eval_main, eval_mtp;
    int64_t eval_targets;
    double eta_s;
} train_metrics;

/* Opens RUN/<name> for appending after dropping every line whose "step" exceeds keep_step (and any
 * line that does not parse, e.g. one cut by a crash), so that a resumed run continues the file as if
 * it had never stopped. keep_step 0 starts the file empty. */
trex_code train_jsonl_open(FILE **out, const char *run, const char *name, int64_t keep_step, trex_err *err);
/* One line of metrics.jsonl (reals as %.17g, non-finite as null), flushed. */
trex_code train_metrics_write(FILE *f, const train_metrics *m, trex_err *err);
/* The progress line: redrawn in place when tty, else one line. */
void train_progress(FILE *out, bool tty, const train_metrics *m);

#endif
