/* trex/plan.h — the planner: cluster descriptions, a cost description of a model, and the
 * evaluation and search of parallel layouts (memory per device, step time, MFU).
 *
 * Units: memory in bytes inside the library and GiB (2^30 bytes) in reports ("gb" in JSON keys);
 * FLOPs are counted 2 per multiply-add; times in seconds; bandwidths in GB/s = 1e9 bytes/s; peaks
 * in TFLOPS = 1e12 FLOP/s (dense, no 2:4 sparsity). docs/planner.md explains the model, its
 * conventions and its calibration constants. Nothing here allocates beyond the structs the caller
 * owns, and nothing keeps global state. */
#ifndef TREX_PLAN_H
#define TREX_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "trex/config.h"
#include "trex/status.h"

/* ---------------------------------------------------------------------------------------------- */
/* Clusters (configs/clusters/NAME.json)                                                              */

/* Efficiency factors of one device kind: achieved fraction of a peak, calibratable per cluster. */
typedef struct trex_plan_eff {
    double gemm;              /* large dense BF16 GEMMs, fraction of peak_bf16 */
    double gemm_fp8;          /* FP8 GEMMs, fraction of peak_fp8 (when the run uses fp8) */
    double grouped_gemm;      /* routed-expert GEMMs with many rows per expert, fraction of peak */
    double gemm_half_rows;    /* rows per expert at which grouped GEMMs reach half that efficiency */
    double attention;         /* fused (flash) attention kernels, fraction of peak_bf16 */
    double memory;            /* element-wise kernels, fraction of hbm_bw */
    double collective;        /* all-gather / reduce-scatter / p2p, fraction of link bandwidth */
    double a2a_scaleup;       /* expert all-to-all inside the scale-up domain, fraction of link bw */
    double a2a_scaleout;      /* expert all-to-all across domains, fraction of scale-out bw */
    double overlap;           /* fraction of overlappable communication that really hides */
    double a2a_hide;          /* fraction of the EP all-to-all hidden by overlap schedules */
    double layer_overhead_us; /* host/launch/synchronisation time per block per forward pass */
} trex_plan_eff;

/* Rates of the fp32 reference engine (src/kernels/ref, src/model) on one machine: the "fp32_ref"
 * object of a cluster file, measured by bench/plan_local.sh (docs/planner.md, "The local fp32
 * engine"). Per-thread figures unless stated. */
typedef struct trex_plan_fp32_rates {
    double threads;           /* pool threads of the runs the rates describe */
    double serial_share;      /* one thread's wall-clock speed / its CPU-time speed (a shared machine
                               * gives less than 1) */
    double speedup;           /* wall-clock speed of `threads` threads / one thread's CPU-time speed */
    /* the rest are CPU time of one thread */
    double gemm_gflops;       /* ref GEMM 4x8 micro-tiles, K <= gemm_k_l1 */
    double gemm_gflops_long;  /* K > gemm_k_l1: a micro-tile's [K][8] B slice leaves L1 */
    double gemm_gflops_l3;    /* K x 64 floats > l2_kib: the packed B panel leaves L2 */
    double gemm_gflops_mem;   /* K x 64 floats > l3_kib: it leaves the core's share of L3 too */
    double gemm_mr, gemm_nr;  /* the reference GEMM's micro-tile (rows x columns of C) */
    double gemm_nc;           /* its column panels (the unit of work of a thread) */
    double gemm_k_l1;         /* K up to which a micro-tile's A and B slices stay in L1 */
    double l2_kib;            /* per-core L2 (thresholds of the B panel and of A) */
    double l3_kib;            /* one core's share of L3 (threshold of the B panel) */
    double pack_a_ns;         /* packing one element of A (re-packed for every 64-column panel) */
    double pack_a_t_ns;       /* the same when A is transposed (dy^T x: strided reads) */
    double pack_a_mem_ns;     /* packing one element of A when A (M x K floats) exceeds l2_kib */
    double pack_a_t_mem_ns;   /* the same, transposed */
    double pack_b_ns;         /* packing one element of B (once per panel) */
    double pack_b_t_ns;       /* the same when B is transposed (x W^T: strided reads) */
    double store_ns;          /* per element of C: micro-tile set-up and the C update */
    double call_us;           /* fixed cost per GEMM call */
    double direct_gflops;     /* products with M*N*K < 32768 (unpacked loop, one thread) */
    double attn_gflops;       /* attention core kernels (am_sattn_*, am_dot: dots and axpys) */
    double exp_ns;            /* one exp/expf inside its loop (softmax, cross-entropy, SiLU) */
    double mem_gbs;           /* streaming element-wise passes (norms, RoPE, mHC mixing, copies) */
    double mhc_fwd_ns;        /* mHC per token and sub-layer, forward (Sinkhorn, gates) */
    double mhc_bwd_ns;        /* the same, backward (Sinkhorn recomputed and differentiated) */
    double touch_gbs;         /* first touch of fresh pages (page fault + zeroing) */
    double adam_ns;           /* AdamW arithmetic per element (besides its memory traffic) */
    double baseline_mib;      /* peak RSS of a trex process that allocates nothing (trex model info) */
} trex_plan_fp32_rates;

/* The runtime a cluster runs: frameworks on accelerators (BF16 weights, the generic cost model), or
 * this repository's fp32 reference engine in one process (memory and time from src/plan/engine.c). */
typedef enum trex_plan_engine { TREX_ENGINE_GENERIC = 0, TREX_ENGINE_FP32_REF = 1 } trex_plan_engine;

typedef struct trex_cluster {
    char name[64];
    char device[96];          /* what one device is, e.g. "Ascend 910C die" */
    double peak_bf16_tflops;  /* dense BF16 peak per device: the MFU denominator */
    double peak_fp8_tflops;   /* 0 when the device has no FP8 */
    double hbm_gib;           /* device memory */
    double hbm_bw_gbs;
    int64_t devices_per_node;
    int64_t scaleup_domain;   /* devices joined by the scale-up fabric (NVLink, HCCS/UB) */
    double scaleup_bw_gbs;    /* unidirectional, per device */
    double scaleup_latency_us;
    double scaleout_bw_gbs;   /* unidirectional, per device (RDMA NIC share) */
    double scaleout_latency_us;
    double host_mem_gib;      /* host memory per node, for swapped optimizer state */
    double host_bw_gbs;       /* host<->device, per device, each direction */
    double reserved_gib;      /* per device: runtime context, allocator slack, workspace */
    bool measured;            /* values measured on the machine rather than taken from specs */
    trex_plan_eff eff;
    int engine;               /* trex_plan_engine: "engine" field ("generic" or "fp32-ref") */
    trex_plan_fp32_rates fp32; /* "fp32_ref" object (required with engine fp32-ref) */
} trex_cluster;

/* Loads and validates a cluster file: every required field present with the right type, no unknown
 * field, values in range. Messages name the file and the field. */
trex_code trex_plan_cluster_load(trex_cluster *cl, const char *path, trex_err *err);
trex_code trex_plan_cluster_from_json(trex_cluster *cl, const cJSON *json, const char *label,
                                      trex_err *err);

/* ---------------------------------------------------------------------------------------------- */
/* Model cost description                                                                         */

typedef enum trex_plan_attn {
    TREX_PLAN_ATTN_GQA, /* grouped-query attention (Qwen3) */
    TREX_PLAN_ATTN_MLA, /* multi-head latent attention (DeepSeek-V3, Kimi K2) */
    TREX_PLAN_ATTN_SWA, /* DeepSeek-V4 sliding window only */
    TREX_PLAN_ATTN_CSA, /* DeepSeek-V4 compressed sparse (ratio 4, indexer) */
    TREX_PLAN_ATTN_HCA, /* DeepSeek-V4 heavily compressed (ratio 128) */
} trex_plan_attn;

/* One block (transformer layer or MTP block) of the model. Parameter counts are elements; FLOPs
 * and bytes are per token of the forward pass at the model's sequence length. */
typedef struct trex_plan_block {
    trex_plan_attn attn;
    bool moe;                 /* routed experts (else a dense FFN) */
    bool mtp;                 /* the multi-token-prediction block */
    double p_attn;            /* attention weights, sharded by TP */
    double p_mlp;             /* dense FFN or shared expert (+ MTP projections), sharded by TP */
    double p_expert;          /* all routed experts of the block, sharded by EP */
    double p_repl;            /* replicated small tensors: norms, router, mHC, sinks */
    double p_adam;            /* of the above, elements that stay on AdamW under Muon */
    double p_frozen;          /* of the above, non-trainable elements (gate bias, hash table) */
    double ns_flops_dense;    /* Newton–Schulz FLOPs per iteration of its Muon matrices, non-expert */
    double ns_flops_expert;   /* same for its routed experts (all experts) */
    double f_attn;            /* attention projection GEMMs (incl. compressor, indexer GEMMs) */
    double f_core;            /* attention core: QK and PV (and indexer scoring), as computed */
    double f_mlp;             /* dense FFN / shared expert GEMMs (+ MTP projections) */
    double f_expert;          /* routed expert GEMMs of the k chosen experts */
    double f_router;          /* router GEMM (time only, not in model FLOPs) */
    double f_model;           /* forward model FLOPs per token under the planner's convention */
    double mem_bytes;         /* element-wise HBM traffic per token, forward */
    double act_none;          /* bytes saved for backward per token, no recompute */
    double act_sel;           /* with selective recompute (norms, activation functions) */
    double act_in;            /* block input only (full recompute) */
    double tp_msgs;           /* h-wide all-gathers + reduce-scatters per token in forward (TP>1) */
    double kv_width;          /* elements per token exchanged by context parallelism */
} trex_plan_block;

typedef struct trex_plan_model {
    char name[64];
    char family[32];          /* "qwen3_moe", "deepseek_v3", "deepseek_v4", ... */
    int64_t seq;              /* sequence length the per-token costs were built for */
    int64_t hidden, vocab, n_layers, n_mtp, n_blocks;
    int64_t n_experts, topk, moe_ffn;
    int64_t hc_mult;          /* residual streams (mHC); 1 for ordinary models */
    trex_plan_block blocks[TREX_MAX_LAYERS]; /* n_layers main blocks then n_mtp MTP blocks */
    double p_embed, p_head, p_global_other;  /* global tensors */
    double f_head;            /* forward FLOPs per token of the LM head (incl. MTP's use of it) */
    double p_total, p_active, p_mtp;          /* totals (main model; MTP separately) */
    double model_flops_per_token;             /* training (3 x forward) model FLOPs per token */
    int64_t ns_iters;         /* Newton–Schulz iterations of the model's Muon recipe */
    bool has_cfg;             /* DeepSeek-V4: cfg holds the config (the fp32 engine replays it) */
    trex_config cfg;
} trex_plan_model;

/* Builds the cost description from a config file: a DeepSeek-V4 config.json (parameters taken from
 * trex_layout_build, so planner and runtime agree) or a Hugging Face config of model_type
 * deepseek_v3 / kimi_k2 (MLA + MoE) or qwen3_moe (GQA + MoE). */
trex_code trex_plan_model_load(trex_plan_model *m, const char *path, int64_t seq, trex_err *err);
trex_code trex_plan_model_from_json(trex_plan_model *m, const cJSON *json, const char *label,
                                    int64_t seq, trex_err *err);
/* From an already loaded DeepSeek-V4 config. */
trex_code trex_plan_model_from_config(trex_plan_model *m, const trex_config *cfg, int64_t seq,
                                      trex_err *err);

/* ---------------------------------------------------------------------------------------------- */
/* Layouts and runs                                                                               */

typedef enum trex_plan_recompute {
    TREX_RECOMPUTE_NONE,
    TREX_RECOMPUTE_SELECTIVE, /* norms and activation functions (Megatron "norm, act") */
    TREX_RECOMPUTE_FULL,      /* keep block inputs only; recompute the whole block */
    TREX_RECOMPUTE_ATTENTION, /* fp32_ref engine only: drop the attention sub-layers' internals and run
                               * their forward again in the backward (trex train --recompute attention) */
    TREX_RECOMPUTE_MOE,       /* fp32_ref engine only: the same for the MoE sub-layers */
    TREX_RECOMPUTE_FULL_KEEP_CORE, /* fp32_ref engine only: FULL, each block also keeping its attention
                                    * core's results (trex train --recompute full-keep-core) */
    TREX_RECOMPUTE_ATTENTION_KEEP_CORE, /* fp32_ref engine only: ATTENTION, each block also keeping its
                                         * attention core's results (--recompute attention-keep-core) */
} trex_plan_recompute;

typedef enum trex_plan_schedule {
    TREX_SCHED_1F1B,
    TREX_SCHED_INTERLEAVED,   /* interleaved 1F1B with vpp chunks per rank */
    TREX_SCHED_DUALPIPE,      /* DualPipe: two mirrored stages per rank (2x parameters) */
    TREX_SCHED_DUALPIPEV,     /* DualPipeV: 2 chunks per rank in a V */
} trex_plan_schedule;

/* A layout. Any field < 0 means "the planner's choice" (search). */
typedef struct trex_plan_layout {
    int64_t tp, pp, vpp, ep, cp, dp;
    int64_t zero;             /* 0..3: distributed optimizer stage */
    int64_t recompute;        /* trex_plan_recompute */
    int64_t swap_optimizer;   /* 0/1: optimizer state lives on the host between steps */
    int64_t mbs;
    int64_t schedule;         /* trex_plan_schedule */
    int64_t a2a_overlap;      /* 0/1: EP all-to-all overlapped with another micro-batch's compute */
    int64_t dedup;            /* 0/1: dispatcher sends a token once per remote domain (DeepEP) */
    int64_t first, last;      /* main layers in the first / last pipeline chunk (-1: even) */
} trex_plan_layout;

/* Sets every field to -1 (all "planner's choice"). */
void trex_plan_layout_unset(trex_plan_layout *l);
/* Parses "tp=1,pp=4,vpp=1,ep=32,cp=1,zero=1,recompute=full,swap_optimizer=1,mbs=1" into l (keys
 * left out keep their value). Also: dp, schedule=1f1b|interleaved|dualpipe|dualpipev,
 * a2a_overlap=0|1, dispatcher=deepep|alltoall, first=N, last=N. */
trex_code trex_plan_layout_parse(trex_plan_layout *l, const char *text, trex_err *err);
/* Writes the canonical "tp=..,pp=.." form. */
void trex_plan_layout_str(const trex_plan_layout *l, char *buf, size_t len);
/* The layout name of a trex_plan_recompute ("none", ..., "attention-keep-core"; "?" for any other). */
const char *trex_plan_recompute_name(int64_t r);

typedef enum trex_plan_optimizer { TREX_OPT_ADAMW, TREX_OPT_MUON } trex_plan_optimizer;

typedef struct trex_plan_run {
    int64_t devices;
    int64_t seq;
    int64_t gbs;              /* global batch in sequences */
    int optimizer;            /* trex_plan_optimizer */
    int64_t ns_iters;         /* Newton–Schulz iterations per Muon step (0: the model's recipe) */
    bool fp8;                 /* GEMMs in FP8 (peak_fp8 x eff.gemm_fp8) */
    double mem_limit_gib;     /* 0: hbm_gib - reserved_gib */
    /* bytes per element of each state (defaults: 2 weights, 4 gradients, 4 per fp32 optimizer
     * tensor, 2 activations) — the CPU runtime holds fp32 weights, so it passes 4 */
    double weight_bytes, grad_bytes, state_bytes, act_bytes;
    double imbalance;         /* most-loaded EP rank / mean (1: forced balance) */
    bool dense_attention;     /* fp32 engine: CSA over every visible entry (trex train
                               * --attention dense); default false: the indexer's top-k */
} trex_plan_run;

void trex_plan_run_defaults(trex_plan_run *r);

/* ---- the local fp32 reference engine (src/plan/engine.c) ----
 * A replay of what `trex model run` / `trex train` allocate and compute for one micro-batch of B rows
 * of T tokens (one document per row), on the reference kernels, in one process. */
typedef struct trex_plan_fp32_run {
    int64_t B, T;
    bool sparse;              /* CSA attends the indexer's top-k (trex train's default; model run:
                               * --indexer-mode sparse); else every visible entry */
    bool backward;            /* gradients wanted (else a forward only) */
    bool recompute_full;      /* the main blocks keep only their inputs and run their forward again in
                               * the backward (trex_model_opts.recompute full) */
    bool recompute_attn;      /* every block drops its attention cache after the forward and runs the
                               * attention forward again in the backward (recompute attention) */
    bool recompute_moe;       /* the same for the MoE sub-layer (recompute moe); at most one of the
                               * three recompute flags is set */
    bool recompute_keep_core; /* with recompute_full (recompute_attn): each main block (every block) also
                               * keeps its attention core's results, which its second (attention)
                               * forward takes (recompute full-keep-core, attention-keep-core) */
    bool logits;              /* the caller takes the whole logits (model run without --no-logits) */
    int threads;              /* pool threads (per-thread scratch, GEMM panel split) */
    int64_t head_chunk_rows;  /* 0: about 64 MiB of logits, as the engine chooses */
    double balance_weight, indexer_weight;
    bool warm;                /* steady state: the arena already grown and merged (a training
                               * step after the first micro-batches); no first-touch cost */
    bool grads_all_touched;   /* a training step zeroes every gradient; a single `model run` pass
                               * touches only what the backward writes */
    bool with_optimizer;      /* count the optimizer state (memory) and its step (time) */
    bool load_file;           /* weights copied from a mapped safetensors file (model run) */
    int optimizer;            /* trex_plan_optimizer */
    /* called for every GEMM of the pass, in order (phase 0 forward, 1 backward); may be NULL */
    void (*gemm_cb)(void *ctx, int phase, bool ta, bool tb, int64_t M, int64_t N, int64_t K);
    void *cb_ctx;
} trex_plan_fp32_run;

/* Kinds of work in trex_plan_fp32_result.t */
enum { TREX_FP32_GEMM, TREX_FP32_ATTN, TREX_FP32_EXP, TREX_FP32_MHC, TREX_FP32_ELEM, TREX_FP32_TOUCH,
       TREX_FP32_KINDS };

typedef struct trex_plan_fp32_result {
    /* bytes */
    double params;            /* TREX_REGION_PARAMS: n_float + n_int 4-byte elements */
    double grads;             /* TREX_REGION_GRADS: n_float floats */
    double optim;             /* TREX_REGION_OPTIM: trex_optimizer_state_bytes */
    double file;              /* the safetensors file of the weights */
    double acts_kept;         /* arena in use at the end of the forward (kept for the backward) */
    double acts_peak;         /* highest arena use in the pass */
    double acts_end;          /* arena in use after the backward ("activations used") */
    double acts_reserved;     /* arena chunks ("acts" region peak, "reserved") */
    double acts_resident;     /* arena pages touched (what RSS sees) */
    double head_chunk;        /* of the arena: the head's logits chunk */
    double grads_resident;    /* gradient pages touched */
    double baseline;          /* process baseline (rates.baseline_mib) */
    double load_peak;         /* RSS while the weights are copied from the mapped file (load_file) */
    double rss_peak;          /* predicted peak RSS */
    /* work, [0] forward, [1] backward */
    double gemm_flops[2], gemm_calls[2], attn_flops[2], exps[2], elem_bytes[2], touched[2];
    double t[2][TREX_FP32_KINDS]; /* seconds by kind (with rates) */
    double fwd_s, bwd_s, opt_s;   /* wall seconds (with rates) */
    double opt_cpu_s;             /* CPU seconds of the optimizer step (all threads; with Muon, once
                                   * trex_plan_evaluate has added Newton–Schulz) */
    double cpu_s[2];              /* CPU seconds of the forward and the backward, all threads */
} trex_plan_fp32_result;

/* B 1, T 4096, backward, 2 threads, dense, balance 1e-4, indexer 1, AdamW, all gradients touched. */
void trex_plan_fp32_run_defaults(trex_plan_fp32_run *r);
/* Sets r's recompute flags (recompute_full, _attn, _moe, _keep_core) for a trex_plan_recompute; the
 * Megatron-style none / selective set none of them. */
void trex_plan_fp32_run_recompute(trex_plan_fp32_run *r, int64_t recompute);

/* Memory (always) and times (when rates is not NULL) of one micro-batch of a DeepSeek-V4 config on
 * the fp32 reference engine. */
trex_code trex_plan_fp32_evaluate(const trex_config *cfg, const trex_plan_fp32_rates *rates,
                                  const trex_plan_fp32_run *run, trex_plan_fp32_result *out,
                                  trex_err *err);

/* Memory regions of one device. */
typedef enum trex_plan_mem {
    TREX_MEM_WEIGHTS,
    TREX_MEM_GRADS,
    TREX_MEM_OPTIMIZER,
    TREX_MEM_ACTIVATIONS,
    TREX_MEM_HEAD,            /* logits and loss workspace of the last stage */
    TREX_MEM_COMM,            /* all-to-all, TP and gradient buckets */
    TREX_MEM_RESERVED,        /* runtime context and allocator slack (cluster reserved_gib) */
    TREX_MEM_COUNT
} trex_plan_mem;

const char *trex_plan_mem_name(int region);

#define TREX_PLAN_MAX_STAGES 128

/* Everything the evaluation of one layout produces. */
typedef struct trex_plan_result {
    trex_plan_layout lay;     /* fully resolved */
    bool feasible;
    char why[256];            /* why infeasible (memory, host memory, divisibility) */
    int64_t m;                /* micro-batches per step per pipeline */
    int64_t edp;              /* expert data-parallel size */
    double mem[TREX_MEM_COUNT];   /* bytes on the worst device */
    double mem_total;             /* bytes, worst device */
    double mem_host_node;         /* swapped optimizer bytes per node */
    int64_t worst_stage;
    double step_s, tokens_per_s, mfu, tflops_per_device;
    /* step-time breakdown (seconds, critical path) */
    double t_compute;         /* forward + backward compute, m micro-batches, slowest stage */
    double t_recompute;
    double t_tp, t_cp;        /* exposed TP / CP communication */
    double t_a2a, t_a2a_hidden; /* exposed / hidden EP all-to-all */
    double t_a2a_up, t_a2a_out;  /* of the total: scale-up and scale-out parts */
    double t_overhead;        /* host/launch overhead */
    double t_bubble;          /* pipeline fill and drain */
    double t_pp;              /* exposed PP point-to-point */
    double t_dp;              /* exposed DP gradient reduce-scatter / parameter all-gather */
    double t_optimizer;       /* optimizer step (incl. Newton–Schulz and Muon communication) */
    double t_swap;            /* host<->device optimizer-state transfer */
    double model_flops_step;  /* model FLOPs of one step, all devices */
    /* per rank of the pipeline, one micro-batch: forward and backward (incl. recompute and exposed
     * TP/CP communication) time, and the exposed EP all-to-all (for the timeline) */
    int64_t n_stages;
    double stage_f[TREX_PLAN_MAX_STAGES], stage_b[TREX_PLAN_MAX_STAGES];
    double stage_comm[TREX_PLAN_MAX_STAGES];
    int64_t stage_layers[TREX_PLAN_MAX_STAGES];
    /* cluster engine fp32-ref: the engine's replay of one micro-batch (steady-state training) */
    bool has_fp32;
    trex_plan_fp32_result fp32;
} trex_plan_result;

/* Evaluates one fully specified layout (every field >= 0 except first/last, which may be -1).
 * Divisibility and range problems return TREX_EINVAL with a message; a layout that does not fit
 * in memory returns TREX_OK with res->feasible = false and res->why set. */
trex_code trex_plan_evaluate(const trex_plan_model *m, const trex_cluster *cl,
                             const trex_plan_run *run, const trex_plan_layout *lay,
                             trex_plan_result *res, trex_err *err);

/* Per-region bytes of one device of pipeline rank `stage` (or the worst one for stage < 0): what the
 * runtime allocates for (config, layout, batch). */
trex_code trex_plan_memory(const trex_plan_model *m, const trex_cluster *cl,
                           const trex_plan_run *run, const trex_plan_layout *lay, int64_t stage,
                           double bytes[TREX_MEM_COUNT], trex_err *err);

/* One evaluated layout, small enough to keep for every candidate (for the search-space picture). */
typedef struct trex_plan_point {
    bool feasible;
    double mem_gib, step_s;
} trex_plan_point;

typedef struct trex_plan_search_out {
    trex_plan_result *best;   /* up to cap results: feasible by step time, then infeasible by memory */
    int64_t n_best;
    trex_plan_point *points;  /* every valid layout evaluated */
    int64_t n_points;
    int64_t n_invalid;        /* combinations rejected by divisibility rules */
    trex_plan_result smallest; /* the layout with the least memory per device (valid when n_points) */
} trex_plan_search_out;

/* Search: enumerates every layout compatible with `fixed` (fields >= 0 are kept), evaluates it, and
 * fills *out (caller frees with trex_plan_search_free). An empty search space (nothing valid) is
 * TREX_EINVAL naming the constraint that failed last. */
trex_code trex_plan_search(const trex_plan_model *m, const trex_cluster *cl, const trex_plan_run *run,
                           const trex_plan_layout *fixed, int64_t cap, trex_plan_search_out *out,
                           trex_err *err);
void trex_plan_search_free(trex_plan_search_out *out);

/* ---------------------------------------------------------------------------------------------- */
/* Pipeline schedule simulation (src/plan/schedule.c): the timeline of one step                   */

typedef enum trex_plan_op_kind {
    TREX_OP_F,   /* forward of one chunk and micro-batch */
    TREX_OP_B,   /* backward (input and weight gradients) */
    TREX_OP_BI,  /* backward, input gradient only (zero-bubble split; its W follows later) */
    TREX_OP_W,   /* weight gradient of an earlier BI */
    TREX_OP_FB,  /* a forward and a backward of two micro-batches overlapped (DualPipeV) */
} trex_plan_op_kind;

typedef struct trex_plan_op {
    int32_t rank, kind;       /* kind: trex_plan_op_kind */
    int32_t chunk, mb;        /* the rank's chunk (0..chunks-1) and the micro-batch; FB: its forward */
    int32_t chunk_b, mb_b;    /* FB: its backward */
    double start, end;        /* seconds from the start of the step */
    double comm;              /* of end - start: exposed communication (EP all-to-all) */
} trex_plan_op;

typedef struct trex_plan_timeline {
    int schedule;             /* trex_plan_schedule */
    int64_t ranks, chunks, m; /* pipeline ranks, chunks per rank, micro-batches */
    trex_plan_op *ops;        /* each rank's ops in its order; rank r: [rank_first[r], rank_first[r+1]) */
    int64_t n_ops;
    int64_t *rank_first;      /* [ranks + 1] */
    double makespan;          /* end of the last op */
    double work_max;          /* the busiest rank's op time */
} trex_plan_timeline;

/* Places every op of one step: rank r spends f[r] (forward) and b[r] (backward) seconds per
 * micro-batch over all its chunks, plus comm[r] of exposed communication (half in the forward, half
 * in the backward); a chunk takes 1/chunks of it; DualPipeV's split backward is half input, half weight
 * gradient (the cost model's W = B/2). Schedules 1F1B, interleaved (chunks = vpp; m a multiple of
 * ranks) and DualPipeV (chunks = 2; m >= 2 ranks); DualPipe and unsupported shapes are TREX_EINVAL.
 * For uniform ranks the makespan is m (f + b + comm) plus the cost model's bubble (tests/test_plan.c).
 * The caller frees with trex_plan_timeline_free. */
trex_code trex_plan_timeline_simulate(trex_plan_timeline *tl, int schedule, int64_t ranks,
                                      int64_t chunks, int64_t m, const double *f, const double *b,
                                      const double *comm, trex_err *err);
void trex_plan_timeline_free(trex_plan_timeline *tl);

/* ---------------------------------------------------------------------------------------------- */
/* Reports                                                                                        */

/* One JSON object per result: tp pp vpp ep cp dp zero recompute mbs feasible mem_per_device_gb
 * step_s tokens_per_s mfu tflops_per_device and more. Caller cJSON_Delete's. */
cJSON *trex_plan_result_json(const trex_plan_result *r, bool explain);
/* Table rows (header when r == NULL). */
void trex_plan_print_row(FILE *out, const trex_plan_result *r);
/* The breakdown of one result: compute, exposed communication by kind, bubble, optimizer, and each
 * memory item. */
void trex_plan_print_explain(FILE *out, const trex_plan_model *m, const trex_cluster *cl,
                             const trex_plan_run *run, const trex_plan_result *r);
/* SVG: the search space (step time against memory per device) and, when `timeline` is not NULL,
 * the pipeline timeline of one step of that result. */
trex_code trex_plan_svg(const char *path, const trex_plan_point *pts, int64_t n, double mem_limit_gib,
                        const trex_plan_result *best, const trex_plan_result *timeline, trex_err *err);

#endif
