/* kernels/x86/avx512/swiglu.c — AVX-512 leaves of the bf16-mode clamped SwiGLU entries
 * (kernels/fused.h), 16 elements per step, the last partial step under a mask.
 *
 * Each element gets exactly the operations of the reference (kernels/ref/swiglu.c) in the same order,
 * so the bits are the same: the clamps as compare-and-blend (a NaN fails the compare and passes), the
 * exp as there (min/max clamp, round to nearest even, two-step reduction, the same polynomial by
 * separate multiplies and adds, 2^n built in the exponent field), IEEE division, the bf16 rounding of
 * trex_f32_to_bf16 (avx512/bf16.h). The backward's dot product keeps the
 * reference's 16 partial sums (element j in lane j mod 16) and its combining tree. Compiled with this
 * folder's flags and ISO C, so nothing is contracted into a fused multiply-add. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/x86/avx512/bf16.h"
#include "kernels/x86/avx512/exp_poly.h"
#include "kernels/x86/avx512/mask.h"

/* kernels/ref/swiglu.c's swiglu_exp_ref in 16 lanes (x clamped to [-87, 88]) */
static inline __m512 swiglu_exp16(__m512 x)
{
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));  /* x < 88 ? x : 88 (NaN -> 88) */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f)); /* x > -87 ? x : -87 */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 p = trex_exp_reduced16(x, n);
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

void AVX512_LEAF(trex_fused_swiglu_fwd_bf16)(uint16_t *h, const float *a, const float *u, int64_t n,
                                       float g, float L)
{
    const __m512 vL = _mm512_set1_ps(L), vnL = _mm512_set1_ps(-L), vg = _mm512_set1_ps(g);
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = tail_mask(n - j);
        __m512 ac = _mm512_maskz_loadu_ps(m, a + j), uc = _mm512_maskz_loadu_ps(m, u + j);
        if (L > 0.0f) {
            ac = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ac, vL, _CMP_GT_OQ), ac, vL);
            const __mmask16 hi = _mm512_cmp_ps_mask(uc, vL, _CMP_GT_OQ);
            const __mmask16 lo = _mm512_cmp_ps_mask(uc, vnL, _CMP_LT_OQ);
            uc = _mm512_mask_blend_ps(lo & (__mmask16)~hi, _mm512_mask_blend_ps(hi, uc, vL), vnL);
        }
        const __m512 ex = swiglu_exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(ac), sign)));
        const __m512 s = _mm512_div_ps(ac, _mm512_add_ps(one, ex));
        _mm256_mask_storeu_epi16(h + j, m, bf16_round16(_mm512_mul_ps(_mm512_mul_ps(s, uc), vg)));
    }
}

/* ((b0 + b1) + (b2 + b3)) with b_k = (s_k + s_{k+8}) + (s_{k+4} + s_{k+12}). */
static inline float tree16(__m512 v)
{
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 s = _mm256_add_ps(lo, hi);
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    float t[4];
    _mm_storeu_ps(t, b);
    return (t[0] + t[1]) + (t[2] + t[3]);
}

float AVX512_LEAF(trex_fused_swiglu_bwd_bf16)(uint16_t *h, uint16_t *da, uint16_t *du, const float *a,
                                        const float *u, const float *dh, int64_t n, float g, float L)
{
    const __m512 vL = _mm512_set1_ps(L), vnL = _mm512_set1_ps(-L), vg = _mm512_set1_ps(g);
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512 dot = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = tail_mask(n - j);
        __m512 ac = _mm512_maskz_loadu_ps(m, a + j), uc = _mm512_maskz_loadu_ps(m, u + j);
        const __m512 d = _mm512_maskz_loadu_ps(m, dh + j);
        __m512 ka = one, ku = one;
        if (L > 0.0f) {
            const __mmask16 ahi = _mm512_cmp_ps_mask(ac, vL, _CMP_GT_OQ);
            ac = _mm512_mask_blend_ps(ahi, ac, vL);
            ka = _mm512_mask_blend_ps(ahi, one, zero);
            const __mmask16 hi = _mm512_cmp_ps_mask(uc, vL, _CMP_GT_OQ);
            const __mmask16 lo = _mm512_cmp_ps_mask(uc, vnL, _CMP_LT_OQ) & (__mmask16)~hi;
            uc = _mm512_mask_blend_ps(lo, _mm512_mask_blend_ps(hi, uc, vL), vnL);
            ku = _mm512_mask_blend_ps(hi | lo, one, zero);
        }
        const __m512 ex = swiglu_exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(ac), sign)));
        const __m512 den = _mm512_add_ps(one, ex);
        const __m512 sig = _mm512_div_ps(one, den);
        const __m512 sl = _mm512_mul_ps(ac, sig);
        const __m512 dsl = _mm512_mul_ps(
            sig, _mm512_add_ps(one, _mm512_mul_ps(ac, _mm512_sub_ps(one, sig))));
        const __m512 h0 = _mm512_mul_ps(_mm512_div_ps(ac, den), uc);
        dot = _mm512_mask_add_ps(dot, m, dot, _mm512_mul_ps(d, h0));
        if (h)
            _mm256_mask_storeu_epi16(h + j, m, bf16_round16(_mm512_mul_ps(h0, vg)));
        const __m512 d0 = _mm512_mul_ps(d, vg);
        _mm256_mask_storeu_epi16(du + j, m, bf16_round16(_mm512_mul_ps(_mm512_mul_ps(ku, d0), sl)));
        _mm256_mask_storeu_epi16(
            da + j, m, bf16_round16(_mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(ka, d0), uc), dsl)));
    }
    return tree16(dot);
}
