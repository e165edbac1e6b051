/* kernels/ref/router.c — the reference of the router-logits entry (kernels/fused.h, gate_fwd).
 *
 * z = x W_g^T for the MoE router, which stays fp32 in every precision mode (MODEL_SPEC §12): each
 * logit is the fp32 GEMM's sum (kernels/ref/gemm.c's contract: s = +0, then s = s + fl(x_k g_k) for k
 * increasing, no fused multiply-add), so the entry gives the bits of trex_linear_forward on the same
 * operands. The AVX-512 leaf (kernels/x86/avx512/router.c) runs the experts in vector lanes with the
 * same per-lane operations; a skinny product (E = 24 columns) that the blocked GEMM pads to 32 and
 * packs per call. */
#include <stdint.h>

#include "kernels/fused.h"

void trex_fused_gate_fwd_ref(float *z, const float *x, const float *gt, int64_t n, int64_t d,
                             int64_t E)
{
    for (int64_t t = 0; t < n; t++)
        for (int64_t e = 0; e < E; e++) {
            float s = 0.0f;
            for (int64_t k = 0; k < d; k++)
                s = s + x[t * d + k] * gt[k * E + e];
            z[t * E + e] = s;
        }
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
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = j0; j < j1; j++) {
            float s = 0.0f;
            for (int64_t t = 0; t < n; t++)
                s = s + dz[t * E + e] * x[t * d + j];
            dg[e * d + j] = s + dg[e * d + j];
        }
}
