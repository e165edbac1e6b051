/* kernels/x86/avx2/exp_poly.h — trex_exp_reduced and trex_exp_nonpos (kernels/ref/exp_poly.h) in 8
 * lanes: the same IEEE operations in the same order, hence the same bits (the AVX-512 twin is
 * kernels/x86/avx512/exp_poly.h). Only for files of this folder (AVX2 flags). */
#ifndef TREX_KERNELS_X86_AVX2_EXP_POLY_H
#define TREX_KERNELS_X86_AVX2_EXP_POLY_H

#include <immintrin.h>

/* trex_exp_reduced (kernels/ref/exp_poly.h) in 8 lanes */
static inline __m256 exp_reduced8(__m256 x, __m256 n)
{
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r);
    return _mm256_add_ps(p, _mm256_set1_ps(1.0f));
}

/* trex_exp_nonpos in 8 lanes (x <= 0 or NaN): the clamps as MAXPS / MINPS, whose second operand passes
 * when unordered, so a NaN stays NaN through every step (its payload may differ from the reference's,
 * which returns x itself: no caller reads a NaN's payload). */
static inline __m256 exp_nonpos8(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(-104.0f), x);
    x = _mm256_min_ps(_mm256_setzero_ps(), x);
    const __m256 big = _mm256_set1_ps(12582912.0f);
    const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), big), big);
    const __m256 p = exp_reduced8(x, n);
    const __m256i ni = _mm256_cvttps_epi32(n); /* n is integer-valued */
    const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), ni); /* n < -126: a subnormal result */
    const __m256i bias = _mm256_blendv_epi8(_mm256_set1_epi32(127), _mm256_set1_epi32(64 + 127), sub);
    const __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, bias), 23));
    const __m256 ps = _mm256_mul_ps(p, s);
    return _mm256_blendv_ps(ps, _mm256_mul_ps(ps, _mm256_set1_ps(0x1p-64f)), _mm256_castsi256_ps(sub));
}

#endif
