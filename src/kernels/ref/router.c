/* kernels/ref/router.c — the reference of the router-logits entry (kernels/fused.h, gate_fwd).
 *
 * z = x W_g^T for the MoE router, which stays fp32 in every precision mode (MODEL_SPEC §12): each
 * logit is the fp32 GEMM's sum (kernels/ref/gemm.c's contract: s = +0, then s = s + fl(x_k g_k) for k
 * increasing, no fused multiply-add), so the entry gives the bits of trex_linear_forward on the same
 * operands. The AVX-512 leaf (kernels/x86/avx512/router.c) runs the experts in vector lanes with the
 * same per-lane operations; a skinny product (E = 24 columns) that the blocked GEMM pads to 32 and
 * packs per call. gate_bwd_dx_mhc is gate_bwd_dx with the mHC backward's other two dX terms in the
 * same pass (model/mhc.c), each rounded as the separate passes did. The _fma entries (bf16 mode's
 * mHC products) take each term of a sum with one fused multiply-add, fmaf. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/fused.h"

/* One term of a sum: s + fl(a b) (the fp32 GEMM's contract), or one fused multiply-add (the _fma
 * entries). */
static inline float madd(bool fma, float a, float b, float s)
{
    return fma ? fmaf(a, b, s) : s + a * b;
}

static inline void gate_fwd(bool fma, float *z, const float *x, const float *gt, int64_t n, int64_t d,
                            int64_t E)
{
    for (int64_t t = 0; t < n; t++)
        for (int64_t e = 0; e < E; e++) {
            float s = 0.0f;
            for (int64_t k = 0; k < d; k++)
                s = madd(fma, x[t * d + k], gt[k * E + e], s);
            z[t * E + e] = s;
        }
}

static inline void gate_bwd_dw(bool fma, float *dg, const float *dz, const float *x, int64_t d,
                               int64_t n, int64_t E, int64_t j0, int64_t j1)
{
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = j0; j < j1; j++) {
            float s = 0.0f;
            for (int64_t t = 0; t < n; t++)
                s = madd(fma, dz[t * E + e], x[t * d + j], s);
            dg[e * d + j] = s + dg[e * d + j];
        }
}

static inline void gate_bwd_dx_mhc(bool fma, float *dX, const float *dz, const float *gate, int64_t n,
                                   int ns, int64_t d, int64_t E, const float *X, const float *dx,
                                   const float *w, int64_t wld, const float *c)
{
    const int64_t nd = (int64_t)ns * d;
    for (int64_t t = 0; t < n; t++)
        for (int k = 0; k < ns; k++)
            for (int64_t i = 0; i < d; i++) {
                const int64_t j = (int64_t)k * d + i;
                float s = 0.0f;
                for (int64_t e = 0; e < E; e++)
                    s = madd(fma, dz[t * E + e], gate[e * nd + j], s);
                const float u = dX[t * nd + j] + w[t * wld + k] * dx[t * d + i];
                const float v = u - c[t] * X[t * nd + j];
                dX[t * nd + j] = s + v;
            }
}

void trex_fused_gate_fwd_ref(float *z, const float *x, const float *gt, int64_t n, int64_t d,
                             int64_t E)
{
    gate_fwd(false, z, x, gt, n, d, E);
}

void trex_fused_gate_bwd_dx_ref(float *dx, const float *dz, const float *gate, int64_t n, int64_t d,
                                int64_t E)
{
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < d; j++) {
            float s = 0.0f;
            for (int64_t e = 0; e < E; e++)
                s = s + dz[t * E + e] * gate[e * d + j];
            dx[t * d + j] = s + dx[t * d + j];
        }
}

void trex_fused_gate_bwd_dw_ref(float *dg, float *ws, const float *dz, const float *x, int64_t n,
                                int64_t d, int64_t E, int64_t j0, int64_t j1)
{
    (void)ws;
    gate_bwd_dw(false, dg, dz, x, d, n, E, j0, j1);
}

void trex_fused_gate_bwd_dx_mhc_ref(float *dX, const float *dz, const float *gate, int64_t n, int ns,
                                    int64_t d, int64_t E, const float *X, const float *dx,
                                    const float *w, int64_t wld, const float *c)
{
    gate_bwd_dx_mhc(false, dX, dz, gate, n, ns, d, E, X, dx, w, wld, c);
}

void trex_fused_gate_fwd_fma_ref(float *z, const float *x, const float *gt, int64_t n, int64_t d,
                                 int64_t E)
{
    gate_fwd(true, z, x, gt, n, d, E);
}

void trex_fused_gate_bwd_dw_fma_ref(float *dg, float *ws, const float *dz, const float *x, int64_t n,
                                    int64_t d, int64_t E, int64_t j0, int64_t j1)
{
    (void)ws;
    gate_bwd_dw(true, dg, dz, x, d, n, E, j0, j1);
}

void trex_fused_gate_bwd_dx_mhc_fma_ref(float *dX, const float *dz, const float *gate, int64_t n,
                                        int ns, int64_t d, int64_t E, const float *X,
                                        const float *dx, const float *w, int64_t wld,
                                        const float *c)
{
    gate_bwd_dx_mhc(true, dX, dz, gate, n, ns, d, E, X, dx, w, wld, c);
}
