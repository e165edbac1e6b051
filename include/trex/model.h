/* trex/model.h — the whole DeepSeek-V4 model: forward, losses and backward over a batch.
 *
 * The model is embedding -> hc_mult residual streams -> num_hidden_layers blocks (each an attention
 * and a MoE sub-layer wrapped in mHC) -> hc_head -> norm -> head, plus the MTP block (MODEL_SPEC §2, §5,
 * §6). Batches, documents, positions, the four losses and their weights follow
 * docs/model-conventions.md exactly. Everything runs in fp32 on local shards (a single process today).
 *
 * Usage:
 *   trex_model *m;  trex_model_create(&m, &weights, pool, &mem, &err);
 *   trex_model_forward(m, &batch, &opts, grads, NULL, NULL, &losses, &err);
 *   trex_model_backward(m);   // grads: fp32 [layout.n_float], same offsets as weights.f; added to
 *   trex_model_destroy(m);
 * Activations live in one arena (region "acts") that grows on the first step and is reused after.
 * Results are bitwise the same for any number of threads. */
#ifndef TREX_MODEL_H
#define TREX_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "trex/alloc.h"
#include "trex/config.h"
#include "trex/params.h"
#include "trex/pool.h"
#include "trex/status.h"
#include "trex/tensor.h"

/* A batch of B rows of T tokens, row-major [B, T]. loss_mask marks target tokens (NULL: all 1);
 * doc_ids splits rows into documents, maximal runs of equal ids (NULL: one document per row). */
typedef struct trex_batch {
    int64_t B, T;
    const int32_t *tokens;
    const uint8_t *loss_mask;
    const int32_t *doc_ids;
} trex_batch;

/* Precision of the two LM heads (main and MTP; docs/precision.md "The LM head"). */
typedef enum trex_head_precision {
    TREX_HEAD_AUTO = 0,  /* fp32 under fp32 compute, bf16x2g1 under bf16 compute */
    TREX_HEAD_FP32,      /* the fp32 GEMM (the reference) */
    TREX_HEAD_BF16X3,    /* 3-term bf16 split on the bf16 GEMM: hi*hi + hi*lo + lo*hi, fp32 sums; the
                            logits and both gradient products (d head.weight, d hn) */
    TREX_HEAD_BF16X3_G1, /* the logits as BF16X3; the two gradient products 1-term (hi*hi, fp32 sums),
                            as every other gradient product of bf16 compute */
    TREX_HEAD_BF16X2_G1, /* the logits of the bf16 weight (W_hi, as every other weight of bf16 compute)
                            and the fp32 activation: W_hi*hn_hi + W_hi*hn_lo, fp32 sums (MODEL_SPEC §6);
                            the gradient products as BF16X3_G1 */
} trex_head_precision;

/* What the forward keeps for the backward (docs/perf.md "Recompute policies"). Every policy gives the
 * same bits as NONE; they trade memory for the time of running parts of the forward again. */
typedef enum trex_model_recompute {
    TREX_MODEL_RECOMPUTE_NONE = 0, /* every block keeps its activations: fastest, most memory */
    TREX_MODEL_RECOMPUTE_FULL,     /* the main blocks keep only their input streams and run their forward
                                      again, block by block, in the backward */
    TREX_MODEL_RECOMPUTE_ATTENTION, /* every block (MTP included) drops its attention sub-layer's saved
                                       internals (trex_attn_cache) and runs that sub-layer's forward
                                       again right before its backward; mHC state and output stay */
    TREX_MODEL_RECOMPUTE_MOE,       /* the same for the MoE sub-layer (trex_moe_cache) */
    TREX_MODEL_RECOMPUTE_FULL_KEEP_CORE, /* FULL, but each main block also keeps its attention core's
                                            results (the output o, lse, the top-k selection, wo_a's
                                            products of o): the backward's forward skips the core loop
                                            and those products */
    TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE, /* ATTENTION, but every block also keeps its attention
                                                 core's results: the attention forward run again before
                                                 the backward skips the core loop */
} trex_model_recompute;
/* "none" / "attention" / "moe" / "full" / "full-keep-core" / "attention-keep-core" -> *out; false for
 * any other name. */
bool trex_model_recompute_parse(const char *name, trex_model_recompute *out);
const char *trex_model_recompute_name(trex_model_recompute r);

typedef struct trex_model_opts {
    bool sparse;           /* CSA layers attend the indexer's top-k (else every visible entry) */
    double mtp_weight;     /* lambda of loss_mtp in loss */
    double balance_weight; /* alpha of the sequence-wise balance loss */
    double indexer_weight; /* w_I of loss_indexer in loss */
    int64_t head_chunk_rows; /* rows of logits the head holds at once (0: about 64 MiB worth) */
    /* Precision of the large matrix products: TREX_F32 (the reference, default) or TREX_BF16 (bf16
     * inputs, fp32 accumulation; router, compressor and mHC stay fp32, the LM head follows
     * head_precision). docs/precision.md */
    trex_dtype compute;
    /* The LM heads' products: fp32, bf16x3 (fp32-level accuracy on the bf16 GEMM), bf16x3g1 (bf16x3
     * logits, bf16 gradient products) or bf16x2g1 (logits of the bf16 weight and the fp32 activation,
     * bf16 gradient products); AUTO follows compute. With the split heads head_chunk_rows counts rows
     * of logits (0: 512 for bf16x3, 1 024 for the others; docs/precision.md "The LM head"). */
    trex_head_precision head_precision;
    trex_model_recompute recompute;
    /* The pass sets every gradient, as if the buffer given to trex_model_forward had been cleared
     * first; what it holds before is never read (the trainer's first micro-batch of a step). The split
     * heads write d head.weight with their first product, bf16 mode's MoE each expert's weight
     * gradients with its first rows, and the attention (its projections, the compressors' and the
     * indexer's) and the MTP block (e_proj, h_proj) theirs with their one product each, instead of
     * adding to zeros read back (530 MB, 1.9 GB and 0.38 GB at dsv4-bench); the forward clears only
     * the gradients that are sums (the embedding's, the norms', mHC's, the router's, ...: 0.64 GB of
     * the 3.5 GB at dsv4-bench in bf16 mode), and those that no product wrote (d head.weight without
     * a target, the experts without rows). The same values as adding to a cleared buffer: 0 + x = x
     * (only a sum of negative zeros alone would keep its sign). */
    bool grads_zero;
} trex_model_opts;

/* The head that options o run: the bf16 terms of its logits' split product (0: the fp32 head; 3:
 * BF16X3, BF16X3_G1; 2: BF16X2_G1, and AUTO under bf16 compute); its logits in bf16x3 (terms 3); its gradient
 * products in three terms too (BF16X3 only); its name ("fp32", "bf16x3", "bf16x3g1", "bf16x2g1"). */
int trex_model_head_terms(const trex_model_opts *o);
bool trex_model_head_bf16x3(const trex_model_opts *o);
bool trex_model_head_grad3(const trex_model_opts *o);
const char *trex_model_head_name(const trex_model_opts *o);

/* dense, mtp_weight 0.3, balance_weight 1e-4, indexer_weight 1.0 (docs/model-conventions.md),
 * automatic head chunks, fp32 compute, head precision following compute, no recomputation, gradients
 * not known to be zero. */
trex_model_opts trex_model_opts_default(void);

/* The losses of one forward pass (token means over the batch; see docs/model-conventions.md). */
typedef struct trex_losses {
    double loss;                        /* main + mtp_weight*mtp + balance + indexer_weight*indexer */
    double main, mtp, balance, indexer; /* mtp is unweighted */
    int64_t main_targets, mtp_targets;  /* number of targets each mean runs over */
} trex_losses;

typedef struct trex_model trex_model;

/* A model over loaded or initialised weights (kept by pointer, not copied; must outlive the model).
 * pool may be NULL (serial); mem receives the activation accounting (may be NULL).
 * TREX_EINVAL when the config holds values the engine does not handle (the message names the field). */
trex_code trex_model_create(trex_model **out, const trex_weights *w, trex_pool *pool, trex_mem *mem,
                            trex_err *err);
void trex_model_destroy(trex_model *m);

/* Checks a batch against the config: B >= 1, T >= 2, every token id in [0, vocab_size), loss_mask
 * values 0 or 1. label names the batch's source in messages (e.g. its file), which name the tensor,
 * the position [b, t] and the value. */
trex_code trex_model_check_batch(const trex_config *cfg, const trex_batch *b, const char *label,
                                 trex_err *err);

/* Runs the forward pass and the losses. The batch is checked first.
 * grads: NULL for a forward pass only; else an fp32 buffer of layout.n_float elements at the weights'
 * offsets into which this pass and the following trex_model_backward ADD d loss / d param (the head's
 * gradient is already added here, while its logits are at hand). Non-trainable tensors (ffn.gate.bias)
 * receive nothing.
 * logits [B, T, V] and mtp_logits [B, T-1, V] receive the logits when not NULL (the head otherwise
 * runs in row chunks and never holds them whole). */
trex_code trex_model_forward(trex_model *m, const trex_batch *b, const trex_model_opts *opts,
                             float *grads, float *logits, float *mtp_logits, trex_losses *out,
                             trex_err *err);

/* The rest of the backward pass of the last forward, which must have been given grads (once per
 * forward). The batch passed to the forward must still be alive. */
void trex_model_backward(trex_model *m);

/* Tokens routed to each of the n_routed_experts experts of block `block` (0..num_hidden_layers-1, then
 * the MTP block) by the last forward pass, hash layers included: [n_routed_experts] int64, valid until
 * the next forward. The trainer sums them over a step's micro-batches for the bias update. */
const int64_t *trex_model_expert_load(const trex_model *m, int64_t block);

/* Bytes of the activation arena: in use now (what the last pass left: its backward's kept blocks), the
 * most in use at once since the last forward began (its high-water mark), and reserved. */
size_t trex_model_arena_used(const trex_model *m);
size_t trex_model_arena_peak(const trex_model *m);
size_t trex_model_arena_reserved(const trex_model *m);

#endif
