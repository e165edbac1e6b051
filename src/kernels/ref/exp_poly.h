/* kernels/ref/exp_poly.h — the core our fp32 exps share (the LM head's cross-entropy, kernels/ref/ce.c,
 * and bf16 mode's SwiGLU, kernels/ref/swiglu.c): e^r for r = x - n ln 2, with n an integer-valued float
 * the caller chose (|r| <= ln 2 / 2 or so). r is taken in two steps (Cody-Waite: C1 = 0.693359375 has 9
 * bits, so n C1 and x - n C1 are exact for |n| < 2^15), then Cephes' degree-6 polynomial for e^r - 1 -
 * r, by separate multiplies and adds. The caller clamps x, rounds n and applies 2^n its own way. The
 * AVX-512 twin (kernels/x86/avx512/exp_poly.h) does the same IEEE operations in the same order, so
 * each level gives the same bits (ISO C: the compiler contracts nothing into fused multiply-adds). */
#ifndef TREX_KERNELS_REF_EXP_POLY_H
#define TREX_KERNELS_REF_EXP_POLY_H

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

#endif
