/* trex/train.h — the training loop (CPT and SFT of a DeepSeek-V4 model on token shards), its metrics
 * (progress line, RUN/metrics.jsonl, per-expert loads, MFU) and generation from a run's checkpoint.
 *
 * A run directory RUN holds (docs/train.md):
 *   settings.json      the effective settings (trex_train_settings_to_json), rewritten on resume
 *   config.json        a copy of the model config;  tokenizer.json  a copy of the tokenizer
 *   metrics.jsonl      one JSON object per step;    expert_load.jsonl  per-expert loads every N steps
 *   step-N/ latest     checkpoints (trex/checkpoint.h)
 *
 * Losses and gradients of a step are means over the global batch (gbs sequences, gbs/mbs micro-batches
 * of mbs sequences): the main and MTP losses are token means over every target of the global batch,
 * the balance and indexer losses the mean of their micro-batch values. docs/train.md derives how the
 * model's per-micro-batch means are reweighted to give exactly that.
 *
 * Plan, then allocate once: weights, gradients, optimizer state, the global batch and the loader's
 * order are allocated before the first step; the model's activation arena grows on the first step and
 * is reused. Nothing here keeps global state. */
#ifndef TREX_TRAIN_H
#define TREX_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "trex/alloc.h"
#include "trex/config.h"
#include "trex/model.h"
#include "trex/optim.h"
#include "trex/pool.h"
#include "trex/prof.h"
#include "trex/status.h"
#include "trex/tensor.h"

#define TREX_TRAIN_PATH 1024

typedef struct trex_train_settings {
    /* inputs and outputs (paths) */
    char config[TREX_TRAIN_PATH];    /* model config.json */
    char data[TREX_TRAIN_PATH];      /* token shard folder (trex data tokenize) */
    char eval_data[TREX_TRAIN_PATH]; /* held-out shard folder ("" = none) */
    char tokenizer[TREX_TRAIN_PATH]; /* tokenizer.json the shards were made with */
    char init[TREX_TRAIN_PATH];      /* initial weights (safetensors); "" = initialise from seed */
    char out[TREX_TRAIN_PATH];       /* run directory */
    bool resume;                     /* continue the run in `out` from its newest checkpoint */
    /* batch */
    int64_t steps;   /* optimizer steps (skipped steps count) */
    int64_t seq;     /* tokens per sequence: must equal the shards' */
    int64_t gbs;     /* sequences per step */
    int64_t mbs;     /* sequences per forward/backward (gbs % mbs == 0) */
    bool shuffle;    /* a fresh seeded permutation of the sequences each epoch (else file order) */
    /* optimizer: kind, lr, min_lr, warmup_steps, schedule, weight_decay, clip_norm, betas, eps,
     * bias_update_speed (total_steps is set to steps) */
    trex_optimizer_settings opt;
    /* losses and routing */
    double mtp_weight;       /* lambda before the switch (0.3, MODEL_SPEC §5) */
    double mtp_weight_late;  /* lambda from the switch on (0.1) */
    int64_t mtp_switch;      /* step of the switch; -1: when the lr decay starts (cosine: warmup_steps) */
    double balance_weight;   /* alpha of the sequence-wise balance loss (1e-4) */
    double indexer_weight;   /* w_I of the indexer KL loss (1.0) */
    int64_t indexer_warmup;  /* first steps: dense attention, only the indexer trains (MODEL_SPEC §3.11) */
    bool sparse;             /* attention after the warm-up: indexer top-k (true) or every entry */
    /* evaluation, checkpoints, logging */
    int64_t eval_every;      /* steps between evaluations on eval_data (0: only after the last step) */
    int64_t eval_batches;    /* micro-batches of the held-out set per evaluation (0: all of it) */
    int64_t save_every;      /* steps between checkpoints (0: only after the last step) */
    int64_t keep;            /* checkpoints kept (0: all) */
    int64_t expert_load_every; /* steps between lines of expert_load.jsonl (0: never) */
    int64_t max_bad_steps;   /* this many non-finite steps in a row stop the run */
    /* machine */
    uint64_t seed;           /* weights (when not --init) and data order */
    bool deterministic;      /* fixed reduction orders; resume refuses another kernel level */
    trex_dtype compute;      /* large matrix products: TREX_F32 (default) or TREX_BF16 (docs/precision.md);
                              * JSON/flag "precision": "fp32" | "bf16"; a resumed run keeps it */
    bool weight_copies;      /* bf16: keep bf16 copies of the experts' weights, rewritten by each optimizer step
                              * (docs/params.md "bf16 compute copies"; faster MoE products, same results,
                              * ~4 bytes per expert weight as packed panels, which also hold the attention's
                              * projections, ~2 as rows under --recompute attention, attention-keep-core and
                              * moe); JSON/flag "weight_copies"; default true */
    trex_model_recompute recompute; /* what the forward keeps: "none" (default), "attention" / "moe" (that
                               * sub-layer's forward runs again in the backward) or "full" (the blocks'
                               * forward runs again in the backward); same results, less memory */
    int64_t threads;         /* 0: TREX_THREADS, else every core */
    double peak_tflops;      /* MFU denominator; 0: fp32: peak_bf16_tflops of `cluster`; bf16: the AMX bf16
                              * peak measured at start (docs/mfu.md) */
    char cluster[TREX_TRAIN_PATH]; /* cluster file giving the peak (configs/clusters/local.json) */
} trex_train_settings;

/* Defaults (docs/train.md): steps 100, seq 0 (= the shards'), gbs 8, mbs 1, shuffle, AdamW lr 3e-4
 * cosine to 3e-5 after 0 warmup steps, wd 0.1, clip 1.0, MTP 0.3 -> 0.1 at the decay start, balance
 * 1e-4, bias speed 1e-3, indexer weight 1, no indexer warm-up, sparse, eval after the last step over
 * 8 micro-batches, save after the last step, keep 3, expert loads every 10 steps, 5 bad steps, seed 1. */
void trex_train_defaults(trex_train_settings *s);

/* Settings as JSON (every field; optimizer fields flat: "optimizer", "lr", "min_lr", "warmup",
 * "schedule", "weight_decay", "clip", "beta1", "beta2", "eps", "bias_update_speed"; "attention":
 * "sparse"|"dense"; "data_order": "shuffle"|"sequential"; "resume" is not written) and back: from_json
 * overwrites only the fields present; unknown fields and wrong types are TREX_EINVAL naming label and
 * the field. */
cJSON *trex_train_settings_to_json(const trex_train_settings *s);
trex_code trex_train_settings_from_json(trex_train_settings *s, const cJSON *json, const char *label,
                                        trex_err *err);
/* Sets one field from text, as a flag gives it: name is the JSON name ("eval_data"), text is parsed
 * with full checks by the field's type. TREX_EINVAL names the flag (--eval-data) and what is expected. */
trex_code trex_train_settings_set(trex_train_settings *s, const char *name, const char *text, trex_err *err);
/* The settings of an existing run, for --resume: RUN/settings.json, with config and tokenizer pointing
 * at the run's own copies (RUN/config.json, RUN/tokenizer.json) and resume = true. Flags given with
 * --resume are applied on top by the caller; trex_train_run refuses changes to seq, gbs, mbs,
 * data_order, optimizer, seed, deterministic and precision, and a config that differs from the
 * checkpoint's. */
trex_code trex_train_resume_settings(trex_train_settings *s, const char *run, trex_err *err);
/* One block of "name=value" lines, as `trex train` prints the effective settings at start. */
void trex_train_settings_print(const trex_train_settings *s, FILE *out);
/* Ranges and relations (gbs % mbs, warmup < steps, ...); TREX_EINVAL naming the flag and the fix.
 * Paths are checked when the run opens them. */
trex_code trex_train_settings_check(const trex_train_settings *s, trex_err *err);

/* Fault injection, for tests only (docs/train.md "Fault injection"): never set in normal use. */
typedef struct trex_train_faults {
    const int64_t *nan_steps;  /* 1-based steps whose gradient gets a NaN after the backward */
    int64_t n_nan_steps;
    int64_t kill_after_step;   /* > 0: SIGKILL this process right after that step's metrics line */
} trex_train_faults;

/* Runs (or, with s->resume, continues) a training run. Prints the effective settings, then a progress
 * line per step to stdout (redrawn in place on a terminal). Returns TREX_OK after the last step;
 * TREX_ERANGE when max_bad_steps non-finite steps in a row stopped the run (the message says which
 * checkpoint is intact); other codes for bad input, with messages naming the file, field and fix.
 * faults may be NULL. */
trex_code trex_train_run(const trex_train_settings *s, const trex_train_faults *faults, trex_err *err);

/* bf16 training keeps the experts' bf16 weight copies (settings weight_copies) as the products' packed
 * panels of both orientations (true: ~4 bytes per expert weight, no per-call packing; the attention's
 * projections get panels too) or as rows (~2 bytes, the experts only): panels under recompute none, full
 * and full-keep-core, rows under attention, attention-keep-core and moe, whose dsv4-bench T = 4096 peaks
 * have no room for the panels (docs/params.md "bf16 compute copies"). */
bool trex_train_copies_as_panels(trex_model_recompute recompute);

/* Model FLOPs of one training step of gbs sequences of seq tokens under the planner's convention
 * (trex/plan.h, docs/mfu.md): gbs * seq * model_flops_per_token, plus Newton–Schulz under Muon. */
trex_code trex_train_step_flops(const trex_config *cfg, int64_t seq, int64_t gbs, trex_optim_kind kind,
                                double *flops, trex_err *err);

/* The machine's peak for the MFU denominator, measured as `trex bench peak` does: the register-only
 * loop of the kernel table in use for `compute` (TREX_BF16: AMX TDPBF16PS, or AVX-512 VDPBF16PS when
 * the level has no AMX; TREX_F32: AVX-512 fp32 FMA) run on every thread of pool at once (NULL: the
 * calling thread), the median of reps runs of about secs seconds each. Returns the wall-clock TFLOP/s
 * of all threads together (0 when the level has no such loop, e.g. TREX_ISA=ref); *per_cpu (may be
 * NULL) receives the one-thread rate per CPU-second times the thread count (what a loaded machine
 * would give while on its cores); *what (may be NULL) the loop's name: "amx_bf16", "avx512_bf16",
 * "avx512_fp32_fma" or "none". */
double trex_train_measure_peak(trex_pool *pool, trex_dtype compute, double secs, int reps, double *per_cpu,
                               const char **what);

/* ---- the training step on a synthetic batch (`trex bench step`) ---------------------------------- */

#define TREX_TRAIN_BENCH_MAX_STEPS 1000

typedef struct trex_train_bench_opts {
    const trex_config *cfg;   /* model; weights from trex_weights_init(seed), as `trex model init` */
    int64_t seq, mbs;         /* one micro-batch of mbs rows of seq tokens per step (gbs = mbs) */
    int64_t warmup, steps;    /* untimed steps, then timed ones (steps in [1, TREX_TRAIN_BENCH_MAX_STEPS]) */
    trex_optim_kind optimizer;
    trex_dtype compute;       /* TREX_F32 or TREX_BF16 */
    trex_model_recompute recompute; /* TREX_MODEL_RECOMPUTE_NONE, _ATTENTION, _MOE, _FULL, _FULL_KEEP_CORE or
                                     * _ATTENTION_KEEP_CORE */
    bool no_weight_copies;    /* bf16: run without the bf16 weight copies (trex_train_settings.weight_copies) */
    int64_t threads;          /* 0: TREX_THREADS, else every core */
    uint64_t seed;            /* weights and tokens */
    trex_prof *prof;          /* when not NULL: reset, then attached to this thread for the timed steps */
} trex_train_bench_opts;

typedef struct trex_train_bench_result {
    double step_s[TREX_TRAIN_BENCH_MAX_STEPS]; /* wall seconds of each timed step */
    double step_cpu_s[TREX_TRAIN_BENCH_MAX_STEPS]; /* CPU seconds of the process (all threads) in each */
    double loss_first, loss_last;  /* main loss of the first and last step (warm-up included) */
    double flops_step;             /* model FLOPs of one step (trex_train_step_flops) */
    double flops_per_token;        /* model_flops_per_token of the planner's convention (no Newton–Schulz) */
    int threads;
    size_t region_peak[TREX_REGION_COUNT]; /* most bytes held per region (trex/alloc.h) */
    size_t acts_used;              /* the activation arena's high-water mark of the last step */
    size_t peak_rss;               /* process peak RSS after the steps (bytes) */
} trex_train_bench_result;

/* Runs opts->warmup + opts->steps full training steps on one fixed batch of uniformly random tokens
 * (every position a target, one document per row) through the same step as trex_train_run: forward and
 * backward of the model, the gradient check, clipping, the optimizer step (AdamW or Muon at lr 3e-4,
 * constant schedule) and the bias update. Nothing is written to disk. TREX_EINVAL for bad options
 * (the message names the field); the config must already have passed trex_config_load's checks. */
trex_code trex_train_bench(const trex_train_bench_opts *opts, trex_train_bench_result *res, trex_err *err);

/* ---- generation --------------------------------------------------------------------------------- */

typedef struct trex_generate_opts {
    const char *run;         /* run directory (config.json, tokenizer.json, step-N/) */
    int64_t step;            /* checkpoint step; -1: the newest complete one */
    const char *system;      /* system message (NULL: none) */
    const char *prompt;      /* the user message */
    int mode;                /* trex_chat_gen: 0 open, 1 chat (</think>), 2 think (<think>) */
    double temperature;      /* 0: greedy (ties to the lower id) */
    int64_t top_k;           /* sample among the k most likely (0: all) */
    int64_t max_new;         /* tokens to generate at most (stops earlier at EOS) */
    uint64_t seed;           /* sampling */
    int64_t threads;
    int attention;           /* -1: the run's setting (settings.json), 0: dense, 1: sparse */
    bool echo_prompt;        /* print the rendered prompt first */
} trex_generate_opts;

typedef struct trex_generate_result {
    int64_t prompt_tokens, new_tokens;
    bool stopped_at_eos;
    int64_t step;            /* checkpoint used */
    double seconds;
} trex_generate_result;

/* Renders the chat prompt, then samples token by token (recomputing the whole forward for each new
 * token), writing the decoded answer to `out` as it grows. */
trex_code trex_generate(const trex_generate_opts *o, FILE *out, trex_generate_result *res, trex_err *err);

#endif
