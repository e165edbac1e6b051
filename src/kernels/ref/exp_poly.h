/* kernels/ref/exp_poly.h — the core our fp32 exps share (the LM head's cross-entropy, kernels/ref/ce.c,
 * and bf16 mode's SwiGLU, kernels/ref/swiglu.c): e^r for r = x - n ln 2, with n an integer-valued float
 * the caller chose (|r| <= ln 2 / 2 or so). r is taken in two steps (Cody-Waite: C1 = 0.693359375 has 9
 * bits, so n C1 and x - n C1 are exact for |n| < 2^15), then Cephes' degree-6 polynomial for e^r - 1 -
 * r, by separate multiplies and adds. The caller clamps x, rounds n and applies 2^n its own way. The
 * AVX-512 twin (kernels/x86/avx512/exp_poly.h) does the same IEEE operations in the same order, so
 * each level gives the same bits (ISO C: the compiler contracts nothing into fused multiply-adds). */
#ifndef TREX_KERNELS_REF_EXP_POLY_H
#define TREX_KERNELS_REF_EXP_POLY_H

#include <stdint.h>
#include <string.h>

static inline float trex_exp_reduced(float x, float n)
{
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r;
    return p + 1.0f;
}

/* exp(x) for x <= 0 (an argument minus the max of its set: the cross-entropy's logits, the
 * compressor's pooling scores): x clamped to [-104, 0] (a NaN passes through), n = nearest-even(x
 * log2 e) by adding and subtracting 1.5 * 2^23, trex_exp_reduced, then p * 2^n rounded once: for
 * n < -126 (a subnormal result) as (p * 2^(n+64)) * 2^-64, whose first product is exact. This is the
 * fused table's ce_exp (kernels/fused.h); tests/test_ce.c bounds its error against libm's double exp
 * over the whole range (TREX_CE_EXP_ULP for normal results). */
static inline float trex_exp_nonpos(float x)
{
    if (x != x)
        return x;
    x = x < -104.0f ? -104.0f : x;
    x = x > 0.0f ? 0.0f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float p = trex_exp_reduced(x, n);
    const int ni = (int)n;
    const uint32_t scale = (uint32_t)(ni >= -126 ? ni + 127 : ni + 64 + 127) << 23;
    float s;
    memcpy(&s, &scale, sizeof s);
    return ni >= -126 ? p * s : (p * s) * 0x1p-64f;
}

#endif
