/* trex/checkpoint.h — crash-safe training checkpoints and SHA-256.
 *
 * A run directory RUN holds one directory per checkpoint, RUN/step-N/:
 *   model.safetensors   the weights, official tensor names, F32 (tid2eid I64), as trex_weights_save
 *   optim.safetensors   the optimizer state, as trex_optimizer_save
 *   trainer.json        step, RNG state, data position, config name + SHA-256 + fields, settings
 *   manifest.json       byte size and SHA-256 of each of the three files
 * and RUN/latest, a one-line file "step-N" naming the newest checkpoint written.
 *
 * A save writes everything into RUN/.step-N.tmp/ (each file through a temporary name, fsynced,
 * renamed, the directory fsynced), then renames the directory to RUN/step-N, fsyncs RUN, updates
 * RUN/latest atomically, and only then deletes checkpoints beyond the last K (each first renamed to
 * RUN/.step-M.del, so that no step-M directory is ever half-deleted). A crash at any point leaves every
 * step-M that existed before complete; a step-N directory exists only once all its files are durable.
 * One writer per run directory. Details and the reasons in docs/checkpoints.md. */
#ifndef TREX_CHECKPOINT_H
#define TREX_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "trex/alloc.h"
#include "trex/config.h"
#include "trex/optim.h"
#include "trex/params.h"
#include "trex/rng.h"
#include "trex/status.h"
#include "trex/tensor.h"

/* ---- SHA-256 (FIPS 180-4) --------------------------------------------------------------------- */

typedef struct trex_sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t buf[64];
    size_t fill;
} trex_sha256;

void trex_sha256_init(trex_sha256 *s);
void trex_sha256_update(trex_sha256 *s, const void *data, size_t len);
void trex_sha256_final(trex_sha256 *s, uint8_t digest[32]);
void trex_sha256_hex(const uint8_t digest[32], char hex[65]); /* lower case, NUL-terminated */
/* Digest of a whole file (hex) and its size in bytes. TREX_ENOTFOUND / TREX_EIO name the file. */
trex_code trex_sha256_file(const char *path, char hex[65], uint64_t *bytes, trex_err *err);

/* ---- checkpoints ------------------------------------------------------------------------------ */

/* SHA-256 of the config's canonical text: one "field=value" line per trex_config field except name
 * (integers in decimal, reals as %.17g, compress_ratios as a comma list). */
void trex_ckpt_config_hash(const trex_config *cfg, char hex[65]);

#define TREX_CKPT_SOURCE 256

/* What the trainer needs besides weights and optimizer state to continue a run exactly. */
typedef struct trex_ckpt_state {
    int64_t step;              /* training steps done; the checkpoint directory is step-<step> */
    trex_rng rng;              /* the trainer's generator (key and counter) */
    int64_t data_epoch;        /* data position, as the data loader defines it */
    int64_t data_shard;
    int64_t data_offset;
    char data_source[TREX_CKPT_SOURCE]; /* what the position refers to (e.g. the shard list), free text */
    trex_optimizer_settings settings; /* read/load fill it; save writes the optimizer's own settings */
    char config_name[64];      /* read/load fill it; save writes the config's name */
    trex_dtype compute;        /* the run's compute precision (TREX_F32 or TREX_BF16; trainer.json
                                * "precision", absent in older checkpoints = fp32) */
} trex_ckpt_state;

/* Points of a save, in order, reported to on_stage (for progress logs, and for crash tests). path is
 * the file or directory the stage just finished. */
typedef enum trex_ckpt_stage {
    TREX_CKPT_BEGIN = 0,        /* RUN/.step-N.tmp created, nothing written */
    TREX_CKPT_MODEL_WRITTEN,
    TREX_CKPT_OPTIM_WRITTEN,
    TREX_CKPT_TRAINER_WRITTEN,
    TREX_CKPT_MANIFEST_WRITTEN, /* everything durable in RUN/.step-N.tmp */
    TREX_CKPT_RENAMED,          /* RUN/step-N exists */
    TREX_CKPT_LATEST_UPDATED,   /* RUN/latest names step-N */
    TREX_CKPT_PRUNED,           /* older checkpoints beyond keep_last deleted */
    TREX_CKPT_STAGE_COUNT
} trex_ckpt_stage;

typedef struct trex_ckpt_save_opts {
    int keep_last; /* keep the newest K complete checkpoints (the one just written always); 0 keeps all */
    void (*on_stage)(void *ctx, trex_ckpt_stage stage, const char *path); /* may be NULL */
    void *ctx;
} trex_ckpt_save_opts;

/* Writes RUN/step-<st->step> from weights w (its config is the run's config), optimizer opt (state
 * and settings) and the trainer state st (st->settings and st->config_name are not used). RUN is created if missing; a leftover
 * RUN/.step-N.tmp is replaced; an existing RUN/step-N is replaced only after the new one is complete.
 * opts may be NULL (keep all, no callback). Errors name the path and the failing operation. */
trex_code trex_ckpt_save(const char *run_dir, const trex_weights *w, const trex_optimizer *opt,
                         const trex_ckpt_state *st, const trex_ckpt_save_opts *opts, trex_err *err);

/* The newest complete checkpoint of RUN: the step-N directory with the highest N that holds a
 * manifest.json (leftover .step-N.tmp directories are ignored). Writes its path into dir (size bytes)
 * and N into *step (either may be NULL). TREX_ENOTFOUND when RUN has none. */
trex_code trex_ckpt_latest(const char *run_dir, char *dir, size_t size, int64_t *step, trex_err *err);

/* Checks a checkpoint directory against its manifest: every listed file present, of the listed size
 * (shorter: "truncated"), with the listed SHA-256. The message names the file and what is wrong. */
trex_code trex_ckpt_verify(const char *dir, trex_err *err);

/* Reads trainer.json (without hashing the large files) and, unless cfg is NULL, checks it against cfg:
 * a different config is TREX_EINVAL naming the first differing field with both values (the config's
 * name alone may differ). */
trex_code trex_ckpt_read_state(const char *dir, const trex_config *cfg, trex_ckpt_state *st, trex_err *err);

/* verify + read_state, then loads the weights into w (allocated here, as trex_weights_load; cfg must
 * outlive w) and, when opt is not NULL, the optimizer state into opt (created by the caller for the
 * same layout and kind, e.g. from st->settings after trex_ckpt_read_state). */
trex_code trex_ckpt_load(const char *dir, const trex_config *cfg, trex_mem *mem, trex_weights *w,
                         trex_optimizer *opt, trex_ckpt_state *st, trex_err *err);

#endif
