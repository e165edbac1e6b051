/* kernels/x86/avx512/exp_poly.h — trex_exp_reduced and trex_exp_nonpos (kernels/ref/exp_poly.h) in 16
 * lanes: the same IEEE operations in the same order, hence the same bits. Only for files of this folder
 * (AVX-512 flags). */
#ifndef TREX_KERNELS_AVX512_EXP_POLY_H
#define TREX_KERNELS_AVX512_EXP_POLY_H

#include <immintrin.h>

static inline __m512 trex_exp_reduced16(__m512 x, __m512 n)
{
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r);
    return _mm512_add_ps(p, _mm512_set1_ps(1.0f));
}

/* trex_exp_nonpos (kernels/ref/exp_poly.h) of 16 lanes (x <= 0 or NaN): the clamps as MAXPS / MINPS
 * (the second operand passes when unordered, so NaN stays), 2^n applied by VSCALEFPS (one rounding,
 * subnormal results included, as the reference's two-step product). */
static inline __m512 trex_exp_nonpos16(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    x = _mm512_min_ps(_mm512_setzero_ps(), x);
    const __m512 big = _mm512_set1_ps(12582912.0f);
    const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), big),
                                   big);
    return _mm512_scalef_ps(trex_exp_reduced16(x, n), n);
}

#endif
