/* model/mhc.h — manifold-constrained hyper-connections (mHC): HC_pre, HC_post and the output
 * collapse hc_head, forward and backward, over N tokens (MODEL_SPEC §2, §10; docs/mhc.md).
 *
 * The residual state of N tokens is X [N, n, d] fp32 (n = hc_mult streams, stream-major per token).
 * A sub-layer is wrapped as
 *     trex_mhc_pre_forward   X -> x_in [N, d] and a per-token state (rho, mu, pre, post, comb)
 *     (norm + attention or MoE: x_in -> y)
 *     trex_mhc_post_forward  (y, X, state) -> X' [N, n, d]
 * and its backward runs trex_mhc_post_backward (dX' -> dy, the residual part of dX, dpost/dcomb),
 * then after the sub-layer's backward trex_mhc_pre_backward (dx_in -> adds the rest into dX and the
 * fn/scale/base gradients). Everything is fp32; each token is computed by one thread, and reductions
 * over tokens run in a fixed order, so results do not depend on the thread count. */
#ifndef TREX_MODEL_MHC_H
#define TREX_MODEL_MHC_H

#include <stdint.h>

#include "model/layers.h"
#include "trex/config.h"
#include "trex/status.h"

/* Limits of the per-token code; trex_mhc_check rejects configs beyond them. */
#define TREX_MHC_MAX_N 8
#define TREX_MHC_MAX_ITERS 100

/* The parameters of one HC site: fn [rows, n*d], scale [3] (hc_head: [1]), base [rows], with
 * rows = (2+n)*n for a sub-layer and n for hc_head. The same struct carries gradients. */
typedef struct trex_mhc_w {
    float *fn, *scale, *base;
} trex_mhc_w;

/* Raw mixes per token of a sub-layer: (2+n)*n. */
static inline int64_t trex_mhc_mix(int64_t n)
{
    return (2 + n) * n;
}
/* Floats per token of the state HC_pre saves: rho, mu [mix], then [pre (n) | post (n) | comb (n*n)]. */
static inline int64_t trex_mhc_state_size(int64_t n)
{
    return 1 + 2 * trex_mhc_mix(n);
}
/* Floats per token of the backward work buffer of a sub-layer: [dpre | dpost | dcomb] (mix), then
 * scratch (mix + 3). */
static inline int64_t trex_mhc_dstate_size(int64_t n)
{
    return 2 * trex_mhc_mix(n) + 3;
}
/* Floats per token of the hc_head state: rho, mu [n], w [n]; and of its backward work: 2n + 1. */
static inline int64_t trex_mhc_head_state_size(int64_t n)
{
    return 1 + 2 * n;
}
static inline int64_t trex_mhc_head_dstate_size(int64_t n)
{
    return 2 * n + 1;
}

/* TREX_EINVAL (naming the config field) when hc_mult or hc_sinkhorn_iters is outside what this code
 * handles, or hc_eps / rms_norm_eps is negative. */
trex_code trex_mhc_check(const trex_config *cfg, trex_err *err);

/* x_in [N, d] = sum_k pre_k X_k, state [N, state_size] (MODEL_SPEC §2.3). */
void trex_mhc_pre_forward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *x_in,
                          float *state, const float *X, const trex_mhc_w *w);
/* x_in [N, d] again from a saved state and X, bit for bit as trex_mhc_pre_forward made it (the
 * backward recomputes it instead of keeping it). */
void trex_mhc_pre_collapse(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *x_in,
                           const float *state, const float *X);
/* Xo [N, n, d] = post_k y + sum_j comb_jk X_j (§2.4). Xo may not alias X. */
void trex_mhc_post_forward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *Xo,
                           const float *y, const float *X, const float *state);
/* Given dXo: writes dy [N, d], the residual gradient dX [N, n, d] = comb dXo, and dpost/dcomb into
 * dstate [N, dstate_size]. dX may alias neither dXo nor X. */
void trex_mhc_post_backward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *dX,
                            float *dy, float *dstate, const float *dXo, const float *y,
                            const float *X, const float *state);
/* Given dx_in [N, d] and the dstate filled by trex_mhc_post_backward: ADDS the pre path and the
 * fn/rho path into dX, and the parameter gradients into g (fn, scale, base). dstate is clobbered. */
void trex_mhc_pre_backward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *dX,
                           const trex_mhc_w *g, float *dstate, const float *dx_in, const float *X,
                           const trex_mhc_w *w, const float *state);

/* hc_head (§2.5): h [N, d] = sum_k w_k X_k, state [N, head_state_size]. */
void trex_mhc_head_forward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *h,
                           float *state, const float *X, const trex_mhc_w *w);
/* Given dh: ADDS into dX and g; dstate [N, head_dstate_size] is scratch. */
void trex_mhc_head_backward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *dX,
                            const trex_mhc_w *g, float *dstate, const float *dh, const float *X,
                            const trex_mhc_w *w, const float *state);

#endif
