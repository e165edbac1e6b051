/* kernels/ref/swiglu.c — the reference of the bf16-mode clamped SwiGLU entries (kernels/fused.h).
 *
 * The MoE experts of bf16 mode (model/moe.c) run SwiGLU through these entries: fp32 pre-activations in,
 * bf16 out (the operands of the next products, rounded as trex_f32_to_bf16, exactly what the GEMM's
 * packers would do to fp32 values), with an exp of our own (swiglu_exp_ref below) instead of libm's
 * expf so that the AVX-512 leaves (kernels/x86/avx512/swiglu.c) can give the same bits: every operation
 * here is one IEEE-rounded float operation (the build is ISO C: no contraction into fused
 * multiply-adds), and the leaves do the same operations in the same order, 16 elements at a time.
 * fp32 mode keeps the scalar libm code of model/moe.c; these entries are bf16 mode's only. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/ref/exp_poly.h"
#include "trex/tensor.h"

/* exp(x) in float: x clamped to [-87, 88] (a NaN becomes 88: the callers carry NaN through their
 * other factor), n = nearest-even(x log2 e), r = (x - n ln2_hi) - n ln2_lo, Cephes' degree-6
 * polynomial in r, times 2^n. Relative error a few ulp over the range (tests/test_fused.c bounds the
 * SwiGLU outputs it feeds). */
static float swiglu_exp_ref(float x)
{
    x = x < 88.0f ? x : 88.0f;
    x = x > -87.0f ? x : -87.0f;
    const float n = nearbyintf(x * 1.44269504088896341f);
    const float p = trex_exp_reduced(x, n);
    const uint32_t sb = (uint32_t)((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &sb, sizeof s);
    return p * s;
}

void trex_fused_swiglu_fwd_bf16_ref(uint16_t *h, const float *a, const float *u, int64_t n,
                                    float g, float L)
{
    for (int64_t j = 0; j < n; j++) {
        float ac = a[j], uc = u[j];
        if (L > 0.0f) {
            ac = ac > L ? L : ac;
            uc = uc > L ? L : (uc < -L ? -L : uc);
        }
        const float ex = swiglu_exp_ref(-ac);
        const float s = ac / (1.0f + ex);
        h[j] = trex_f32_to_bf16((s * uc) * g);
    }
}

float trex_fused_swiglu_bwd_bf16_ref(uint16_t *h, uint16_t *da, uint16_t *du, const float *a,
                                     const float *u, const float *dh, int64_t n, float g, float L)
{
    float part[16] = {0};
    for (int64_t j = 0; j < n; j++) {
        float ac = a[j], uc = u[j], ka, ku;
        trex_swiglu_clamp(&ac, &uc, &ka, &ku, L);
        const float ex = swiglu_exp_ref(-ac);
        const float sig = 1.0f / (1.0f + ex);
        const float sl = ac * sig;
        const float dsl = sig * (1.0f + ac * (1.0f - sig));
        const float h0 = (ac / (1.0f + ex)) * uc; /* swiglu_fwd's (s * uc) */
        part[j % 16] += dh[j] * h0;
        if (h)
            h[j] = trex_f32_to_bf16(h0 * g);
        const float d0 = dh[j] * g;
        du[j] = trex_f32_to_bf16((ku * d0) * sl);
        da[j] = trex_f32_to_bf16(((ka * d0) * uc) * dsl);
    }
    float b[4];
    for (int k = 0; k < 4; k++)
        b[k] = (part[k] + part[k + 8]) + (part[k + 4] + part[k + 12]);
    return (b[0] + b[1]) + (b[2] + b[3]);
}
