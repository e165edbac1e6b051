/* model/layers.h — the contracts between the model's layers (internal to src/model).
 *
 * Every layer works on local shards under a parallel context (all sizes 1 in a single process, see
 * DESIGN.md "Shard-aware from day one"), on fp32 activations laid out as [N, ...] with N = B*T tokens
 * in row-major (b, t) order. Forward functions save what their backward needs in an opaque cache carved
 * from ctx->arena; backward functions ACCUMULATE (+=) into the gradient structs (zeroed by the caller at
 * the start of a step) and WRITE (=) the input gradient dx. */
#ifndef TREX_MODEL_LAYERS_H
#define TREX_MODEL_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

#include "trex/alloc.h"
#include "trex/config.h"
#include "trex/params.h"
#include "trex/pool.h"
#include "trex/status.h"
#include "trex/tensor.h"

/* Ranks and sizes of the process mesh; a single process has every size 1. */
typedef struct trex_par {
    int tp_rank, tp_size;
    int ep_rank, ep_size;
    int pp_rank, pp_size;
    int cp_rank, cp_size;
    int dp_rank, dp_size;
} trex_par;

typedef struct trex_gemm_ws trex_gemm_ws; /* kernels/kernels.h */

typedef struct trex_ctx {
    trex_pool *pool;   /* may be NULL: serial */
    trex_par par;
    trex_arena *arena; /* activations saved for backward and scratch; reset once per step */
    /* Precision of the large products (docs/precision.md): TREX_F32 (0, the reference) or TREX_BF16
     * (bf16 inputs, fp32 accumulation) for the attention projections, indexer wq_b/weights_proj,
     * experts, shared expert and MTP projections; router and mHC stay fp32, the compressor's forward
     * and the head's logits run in bf16x3 (fp32-level accuracy). */
    trex_dtype compute;
    trex_gemm_ws *ws; /* the bf16 GEMMs' workspace (NULL: allocated per call) */
    /* The pass sets every gradient (trex_model_opts.grads_zero): a weight gradient's first product
     * writes it (beta 0), and the gradients that are sums start from zeros the forward wrote
     * (model.c grads_clear_summed). */
    bool grads_zero;
} trex_ctx;

/* The tokens of a batch and their documents. A document is a maximal run of equal doc ids inside one
 * row; it behaves exactly like a sequence of its own (docs/model-conventions.md). */
typedef struct trex_seqinfo {
    int64_t B, T;             /* rows, tokens per row; N = B*T */
    const int32_t *tokens;    /* [N] token ids (hash routing) */
    const int32_t *pos;       /* [N] position inside the document, from 0 */
    int64_t nseg;             /* documents in the batch */
    const int64_t *seg_start; /* [nseg] flat index b*T+t of each document's first token */
    const int64_t *seg_len;   /* [nseg] its length (>= 1); segments never cross rows */
} trex_seqinfo;

/* ---- attention (model/attention.c) --------------------------------------------------------------
 * Weights of one attention sub-layer; the same struct carries gradients. Shapes follow MODEL_SPEC §7.1:
 *   wq_a [d_c, d], q_norm [d_c], wq_b [H*c, d_c], wkv [c, d], kv_norm [c], wo_a [G*d_g, (H/G)*c],
 *   wo_b [d, G*d_g], attn_sink [H];
 *   ratio > 0:  cmp_wkv, cmp_wgate [w*c, d], cmp_ape [m, w*c], cmp_norm [c]   (w = 2 iff m == 4);
 *   ratio == 4: idx_wq_b [n_I*c_I, d_c], idx_weights_proj [n_I, d], idx_cmp_wkv, idx_cmp_wgate
 *               [2*c_I, d], idx_cmp_ape [4, 2*c_I], idx_cmp_norm [c_I].
 * Pointers of absent parts are NULL. */
typedef struct trex_attn_w {
    float *wq_a, *q_norm, *wq_b, *wkv, *kv_norm, *wo_a, *wo_b, *attn_sink;
    float *cmp_wkv, *cmp_wgate, *cmp_ape, *cmp_norm;
    float *idx_wq_b, *idx_weights_proj, *idx_cmp_wkv, *idx_cmp_wgate, *idx_cmp_ape, *idx_cmp_norm;
    const trex_wcopy *wc; /* bf16 panels of the projections read by bf16 mode (NULL: none; docs/params.md) */
} trex_attn_w;

typedef struct trex_attn_cache trex_attn_cache;

/* Indexer loss of one CSA layer: the sum over queries of KL(p_t || q_t) and the number of queries that
 * see at least one compressed entry (docs/model-conventions.md). Zero for other layers. */
typedef struct trex_indexer_loss {
    double kl_sum;
    int64_t count;
} trex_indexer_loss;

/* y[N,d] = Attention(x[N,d]) for block `layer` (x is already attn_norm'ed). sparse selects the
 * indexer's top-k in CSA layers (else every visible compressed entry). cache: NULL for forward only,
 * else receives the saved state. il receives this layer's indexer loss terms (may be NULL). */
trex_code trex_attn_forward(const trex_ctx *ctx, const trex_config *cfg, int layer,
                            const trex_seqinfo *seq, float *y, const float *x, const trex_attn_w *w,
                            bool sparse, trex_attn_cache **cache, trex_indexer_loss *il,
                            trex_err *err);
/* The attention core's results of one layer, kept from one forward for a second forward of the same
 * layer on the same input (recompute full-keep-core and attention-keep-core, model/model.c): lse, the
 * output o (bf16 mode: its bf16 copy), u = the grouped products of o with wo_a, and in CSA layers the
 * top-k selection and the indexer's KL terms. The core loop and the products are deterministic, so
 * taking them gives the bits of running them again. trex_attn_core_reserve carves them
 * from ctx's arena for N tokens (kl: the forward gets an il), or returns NULL with err set (out of memory,
 * with nothing left carved; a bad layer). trex_attn_forward_core with a core whose made is false runs the core loop and wo_a's
 * products into it and sets made; with made true it skips both and reads the core instead (wo_b's
 * product runs either way: y is written). core NULL: trex_attn_forward. */
typedef struct trex_attn_core trex_attn_core;
trex_attn_core *trex_attn_core_reserve(const trex_ctx *ctx, const trex_config *cfg, int layer, int64_t N,
                                       bool sparse, bool kl, trex_err *err);
size_t trex_attn_core_bytes(const trex_attn_core *core); /* what it holds (0 for NULL) */
trex_code trex_attn_forward_core(const trex_ctx *ctx, const trex_config *cfg, int layer,
                                 const trex_seqinfo *seq, float *y, const float *x, const trex_attn_w *w,
                                 bool sparse, trex_attn_cache **cache, trex_indexer_loss *il,
                                 trex_attn_core *core, trex_err *err);
/* dx[N,d] = dL/dx given dy[N,d]; adds weight gradients into g. il_scale = dL/d(kl_sum) for this layer
 * (indexer_weight / count, or 0). */
void trex_attn_backward(const trex_ctx *ctx, const trex_config *cfg, int layer,
                        const trex_seqinfo *seq, float *dx, const float *dy, const float *x,
                        const trex_attn_w *w, trex_attn_w *g, const trex_attn_cache *cache,
                        double il_scale);

/* ---- MoE (model/moe.c) --------------------------------------------------------------------------
 * Weights of one MoE sub-layer (MODEL_SPEC §4, §7.1): gate [E, d]; gate_bias [E] (non-hash layers,
 * selection only, never a gradient); tid2eid [V, K] (hash layers); per expert e: w1[e], w3[e]
 * [inter, d], w2[e] [d, inter]; shared expert sw1, sw3 [inter, d], sw2 [d, inter]. The same struct
 * carries gradients (gate_bias and tid2eid NULL there). */
typedef struct trex_moe_w {
    float *gate;
    float *gate_bias;
    const int32_t *tid2eid;
    float **w1, **w2, **w3; /* arrays of n_routed_experts pointers */
    float *sw1, *sw2, *sw3;
    const trex_wcopy *wc;   /* bf16 copies of w1, w3, w2 read by bf16 mode (NULL: none; docs/moe.md) */
} trex_moe_w;

typedef struct trex_moe_cache trex_moe_cache;

/* Per-layer routing statistics of a forward pass. */
typedef struct trex_moe_stats {
    double balance_loss; /* mean over rows of alpha * sum_i f_i P_i (0 for hash layers) */
    int64_t *load;       /* [E] tokens routed to each expert (caller-owned, may be NULL; added to) */
} trex_moe_stats;

/* y[N,d] = MoE(x[N,d]) for block `layer` (x is ffn_norm'ed); alpha = balance-loss weight. */
trex_code trex_moe_forward(const trex_ctx *ctx, const trex_config *cfg, int layer,
                           const trex_seqinfo *seq, float *y, const float *x, const trex_moe_w *w,
                           double alpha, trex_moe_cache **cache, trex_moe_stats *stats,
                           trex_err *err);
/* dx = dL/dx given dy; bal_scale = dL/d(balance_loss) (1 normally). */
void trex_moe_backward(const trex_ctx *ctx, const trex_config *cfg, int layer,
                       const trex_seqinfo *seq, float *dx, const float *dy, const float *x,
                       const trex_moe_w *w, trex_moe_w *g, const trex_moe_cache *cache,
                       double alpha, double bal_scale);

#endif
