/* trex/optim.h — optimizers over a parameter layout: AdamW, Muon (hybrid Newton–Schulz), LR schedules,
 * global gradient-norm clipping, non-finite gradient detection, and the aux-loss-free bias update.
 *
 * Parameters and gradients are the fp32 buffers of a trex_layout (trex_weights.f and a gradient
 * buffer of the same n_float elements; gradients of non-trainable tensors are ignored). The split of
 * parameters into groups follows MODEL_SPEC §9 and is documented with its reasons in docs/optim.md:
 *   AdamW: embed, head, every RMSNorm weight, hc_*_base, hc_*_scale, attn_sink, compressor ape;
 *   Muon:  every other trainable 2-D matrix (hc_*_fn included); a routed expert's w1/w2/w3 are each
 *          their own matrix; attn.wo_a [G*d_g, (H/G)*c] is G matrices of [d_g, (H/G)*c];
 *   frozen: ffn.gate.bias (rule-updated, trex_optim_bias_update) and ffn.gate.tid2eid.
 * With kind TREX_OPTIM_ADAMW every trainable tensor uses AdamW.
 *
 * Plan, then allocate once: trex_optimizer_create sizes every buffer (state in TREX_REGION_OPTIM,
 * Newton–Schulz workspace in TREX_REGION_BUFFERS) from the layout; a step allocates nothing.
 * Results are bitwise the same whatever the thread count. */
#ifndef TREX_OPTIM_H
#define TREX_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "trex/alloc.h"
#include "trex/config.h"
#include "trex/params.h"
#include "trex/pool.h"
#include "trex/status.h"

typedef enum trex_optim_kind {
    TREX_OPTIM_MUON = 0,  /* MODEL_SPEC §9: Muon for matrices, AdamW for the rest */
    TREX_OPTIM_ADAMW = 1, /* AdamW for every trainable tensor */
} trex_optim_kind;

typedef enum trex_lr_kind {
    TREX_LR_CONSTANT = 0, /* linear warmup (if any), then lr */
    TREX_LR_COSINE = 1,   /* linear warmup, then cosine from lr down to min_lr at total_steps */
} trex_lr_kind;

/* Precision of the products inside Muon's Newton–Schulz iteration (the iterate itself stays fp32). */
typedef enum trex_muon_ns {
    TREX_NS_BF16 = 0, /* operands rounded to bf16, fp32 accumulation (trex_gemm_f32_bf16: AMX where present) */
    TREX_NS_FP32 = 1, /* the fp32 reference GEMM (trex_gemm) */
} trex_muon_ns;

typedef enum trex_optim_group {
    TREX_GROUP_FROZEN = 0, /* not trainable: never touched by a step */
    TREX_GROUP_ADAMW,
    TREX_GROUP_MUON,
} trex_optim_group;

typedef struct trex_optimizer_settings {
    trex_optim_kind kind;
    double lr;                /* peak learning rate, shared by AdamW and Muon */
    double beta1, beta2, eps; /* AdamW moments and epsilon */
    double weight_decay;      /* decoupled: p <- p (1 - lr wd), AdamW and Muon alike */
    bool decay_1d;            /* also decay 1-D AdamW tensors (norm weights, hc_base/scale, attn_sink) */
    double muon_momentum;     /* mu */
    bool nesterov;            /* Muon orthogonalises mu M + G (true) or M (false) */
    double update_rms;        /* Muon update RMS: O = NS(.) * sqrt(max(n, m)) * update_rms */
    trex_lr_kind schedule;
    int64_t warmup_steps;     /* lr rises linearly over steps 0..warmup_steps-1 */
    int64_t total_steps;      /* cosine: the step where lr reaches min_lr (then stays there) */
    double min_lr;            /* cosine floor */
    double clip_norm;         /* global gradient-norm clip; 0 turns clipping off */
    double bias_update_speed; /* gamma of the aux-loss-free bias update (MODEL_SPEC §4) */
    /* Scheduling only (results are identical whatever its value): Muon matrices with at least this
     * many elements are orthogonalised one at a time with a threaded GEMM, smaller ones side by side,
     * one per thread. 0 picks the default (2^20). */
    int64_t muon_large_numel;
    /* Newton–Schulz products in bf16 (the default, what published Muon implementations do) or fp32.
     * Either is bitwise the same whatever the thread count; bf16 results may differ between ISAs. */
    trex_muon_ns muon_ns;
} trex_optimizer_settings;

/* The defaults of MODEL_SPEC §9: kind muon, lr 2.7e-4, betas (0.9, 0.95), eps 1e-20, weight decay 0.1
 * without decay of 1-D tensors, momentum 0.95 with Nesterov, update RMS 0.18, constant schedule
 * without warmup (min_lr 2.7e-5 for cosine), clip_norm 1.0, bias update speed 0.001; Newton–Schulz
 * products in bf16. */
void trex_optimizer_defaults(trex_optimizer_settings *s);
/* TREX_EINVAL naming the setting and its allowed range. */
trex_code trex_optimizer_settings_check(const trex_optimizer_settings *s, trex_err *err);
/* Settings as a JSON object (every field, names as in the struct; kind "muon"|"adamw", schedule
 * "constant"|"cosine", muon_ns "bf16"|"fp32") and back. from_json starts from the defaults: absent fields keep them, unknown
 * fields and wrong types are TREX_EINVAL naming label and the field. */
cJSON *trex_optimizer_settings_to_json(const trex_optimizer_settings *s);
trex_code trex_optimizer_settings_from_json(trex_optimizer_settings *s, const cJSON *json, const char *label,
                                            trex_err *err);
const char *trex_optim_kind_name(trex_optim_kind k);
const char *trex_optim_group_name(trex_optim_group g);
const char *trex_muon_ns_name(trex_muon_ns p); /* "bf16", "fp32" */
/* "bf16" or "fp32" to *out; TREX_EINVAL naming the value otherwise (for a command-line flag). */
trex_code trex_muon_ns_parse(const char *text, trex_muon_ns *out, trex_err *err);

/* Learning rate of 0-based step `step` under the settings' schedule. */
double trex_lr_at(const trex_optimizer_settings *s, int64_t step);

/* The group of one parameter under an optimizer kind. */
trex_optim_group trex_optim_group_of(const trex_param *p, trex_optim_kind kind);

/* Bytes of optimizer state for a layout (what trex_optimizer_create charges to TREX_REGION_OPTIM):
 * two fp32 moments per AdamW element, one fp32 momentum per Muon element, each tensor 64-byte aligned. */
size_t trex_optimizer_state_bytes(const trex_layout *lay, trex_optim_kind kind);

/* Aux-loss-free balancing (MODEL_SPEC §4): bias[i] += gamma * sign(mean(load) - load[i]) for the n
 * experts of one layer, from this step's per-expert token counts. Equal loads leave the bias as is. */
void trex_optim_bias_update(float *bias, const int64_t *load, int64_t n, double gamma);

/* One logical Muon matrix: rows x cols elements at element `offset` of the parameter buffer, part of
 * layout tensor `param` (a whole tensor, or one group of wo_a). */
typedef struct trex_muon_matrix {
    int64_t param;
    int64_t offset;
    int64_t rows, cols;
} trex_muon_matrix;

typedef struct trex_optimizer trex_optimizer;

/* Plans and allocates an optimizer for layout `lay` (which must outlive it). cfg gives o_groups for
 * wo_a. nthreads (>= 1, normally the size of the pool passed to step) is the number of workers the
 * small Muon matrices are divided among, each with its own Newton–Schulz workspace; any pool works
 * with any nthreads and gives the same bits. Settings are checked (TREX_EINVAL) and copied.
 * TREX_ENOMEM names the bytes wanted. */
trex_code trex_optimizer_create(trex_optimizer **out, const trex_layout *lay, const trex_config *cfg,
                                const trex_optimizer_settings *s, int nthreads, trex_mem *mem,
                                trex_err *err);
void trex_optimizer_destroy(trex_optimizer *o); /* NULL is a no-op */

/* Makes every later step write the bf16 copies c (trex/params.h, e.g. trex_weights.bf16) of the tensors
 * it updates in params, in the same pass, from the new values (the chunk just written is still in
 * cache: no pass over the weights of its own); after such a step the caller records that the copies
 * are fresh (trex_weights_changed(pool, w, true)). Later steps must be given this params buffer. Every
 * copy must be of a whole 2-D tensor of the layout that the optimizer updates: TREX_EINVAL otherwise.
 * c NULL stops it. TREX_ENOMEM for the table (one pointer and two sizes per tensor). */
trex_code trex_optimizer_set_copies(trex_optimizer *o, const float *params, const trex_wcopy *c, trex_err *err);

const trex_optimizer_settings *trex_optimizer_settings_get(const trex_optimizer *o);
/* Changes settings that do not change the state's shape (everything but kind); TREX_EINVAL otherwise. */
trex_code trex_optimizer_settings_set(trex_optimizer *o, const trex_optimizer_settings *s, trex_err *err);
int64_t trex_optimizer_step_count(const trex_optimizer *o); /* steps applied (AdamW's t) */
trex_optim_group trex_optimizer_group(const trex_optimizer *o, int64_t param_index);
bool trex_optimizer_decays(const trex_optimizer *o, int64_t param_index); /* weight decay applies */
int64_t trex_optimizer_muon_count(const trex_optimizer *o);
const trex_muon_matrix *trex_optimizer_muon_at(const trex_optimizer *o, int64_t i);
/* The state of one tensor (NULL when it has none): AdamW's m and v, Muon's momentum (which = 0). */
const float *trex_optimizer_state(const trex_optimizer *o, int64_t param_index, int which);

/* Gradient health over the trainable tensors: the global L2 norm (fp64 sums over fixed chunks, each in
 * 16 fixed lanes, the chunks added in layout order: the same bits whatever the thread count and ISA),
 * the number of NaN/Inf elements and the first tensor (layout index, -1 when none) holding one. */
typedef struct trex_grad_report {
    double norm;
    int64_t nonfinite;
    int64_t first_bad;
} trex_grad_report;

void trex_optimizer_grad_check(trex_optimizer *o, trex_pool *pool, const float *grads, trex_grad_report *out);
/* Scales the trainable gradients by clip_norm / norm when norm > clip_norm > 0; returns the factor
 * applied (1 when none). norm is the value trex_optimizer_grad_check reported. */
double trex_optimizer_clip(trex_optimizer *o, trex_pool *pool, float *grads, double norm);

/* One optimizer step at learning rate lr: every AdamW and Muon tensor of params is updated from grads,
 * and the step count advances. pool may be NULL. The optimizer allocates nothing here except, at the
 * first bf16 Newton–Schulz, the growth of each worker's bf16 GEMM workspace (kept afterwards); the fp32
 * reference GEMM allocates its packing panels per call. AdamW is one fused pass per element, split
 * over the pool in contiguous 64 Ki-element chunks; its bits do not depend on the thread count. */
void trex_optimizer_step(trex_optimizer *o, trex_pool *pool, float *params, const float *grads, double lr);

/* What a trainer calls once per step: check the gradients; when any is NaN/Inf, skip (nothing
 * changes, not even the step count); else clip, take lr from the schedule at the step count, step.
 * Clipping is folded into the step: each gradient is read as (float)(g * clip_scale), the bits of
 * trex_optimizer_clip followed by trex_optimizer_step, and grads is left unchanged (unclipped). */
typedef struct trex_step_report {
    double grad_norm;   /* before clipping */
    double clip_scale;  /* 1 when not clipped */
    double lr;          /* 0 when skipped */
    int64_t nonfinite;
    int64_t first_bad;  /* layout index of the first tensor with a NaN/Inf gradient, or -1 */
    bool skipped;
} trex_step_report;

void trex_optimizer_update(trex_optimizer *o, trex_pool *pool, float *params, float *grads,
                           trex_step_report *rep);

/* Optimizer state to safetensors: F32 tensors `adam_m.<param>`, `adam_v.<param>`, `muon_m.<param>` with
 * the parameter's shape, metadata format "trex-optim", kind, step. Written atomically. */
trex_code trex_optimizer_save(const trex_optimizer *o, const char *path, trex_err *err);
/* Loads state written by trex_optimizer_save for the same layout and kind. Every expected tensor must
 * be present with its shape, nothing else; messages name the file and the tensor or field. On error
 * the optimizer's state is unspecified (load again or recreate). */
trex_code trex_optimizer_load(trex_optimizer *o, const char *path, trex_err *err);

/* Hybrid Newton–Schulz (MODEL_SPEC §9) in place on x [n, m] (row-major, contiguous):
 * X0 = x / ||x||_F, then X <- aX + b(XX^T)X + c(XX^T)^2 X, 8 times with (3.4445, -4.7750, 2.0315) and
 * twice with (2, -1.5, 0.5), computing with the min(n, m)-sized Gram matrix. A zero x stays zero.
 * ws holds trex_muon_workspace(n, m) floats. pool threads the GEMMs (may be NULL). The GEMMs are fp32
 * (trex_gemm). */
size_t trex_muon_workspace(int64_t n, int64_t m);
void trex_muon_orthogonalize(trex_pool *pool, float *x, int64_t n, int64_t m, float *ws);
/* The same with the products in precision prec; for TREX_NS_BF16, gws is the bf16 GEMM workspace of the
 * calling thread (kernels/kernels.h; NULL: allocated per GEMM). docs/optim.md gives the accuracy. */
typedef struct trex_gemm_ws trex_gemm_ws;
void trex_muon_orthogonalize_ex(trex_pool *pool, float *x, int64_t n, int64_t m, float *ws, trex_muon_ns prec,
                                trex_gemm_ws *gws);

#endif
