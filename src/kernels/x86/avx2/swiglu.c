/* kernels/x86/avx2/swiglu.c — the bf16-mode clamped SwiGLU entries (kernels/fused.h) on AVX2, 8 elements
 * per register, the last partial step under a mask.
 *
 * Each element gets exactly the operations of the reference (kernels/ref/swiglu.c) in its order, as the
 * AVX-512 leaves (kernels/x86/avx512/swiglu.c) do: the clamps as compare-and-blend (a NaN fails the
 * compare and passes), the exp's clamp, rounding to nearest even, reduction and polynomial (exp_poly.h),
 * 2^n built in the exponent field, IEEE division, the integer bf16 rounding (bf16.h). The backward's
 * dot product keeps the reference's 16 partial sums (element j in lane j mod 16: two registers) and
 * its combining tree. Compiled with this folder's flags and ISO C, so nothing is contracted into a
 * fused multiply-add: the reference's bits (tests/test_fused.c). */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/x86/avx2/mask.h"
#include "kernels/x86/avx2/bf16.h"
#include "kernels/x86/avx2/exp_poly.h"
#include "kernels/x86/avx2/lanes.h"

/* kernels/ref/swiglu.c's swiglu_exp_ref in 8 lanes (x clamped to [-87, 88]) */
static inline __m256 swiglu_exp8(__m256 x)
{
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));  /* x < 88 ? x : 88 (NaN -> 88) */
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f)); /* x > -87 ? x : -87 */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(exp_reduced8(x, n), _mm256_castsi256_ps(e));
}

/* x > L ? L : x, and for u also x < -L ? -L : x (where not above L); ka, ku: 0 where clamped, else 1 */
static inline void clamp(__m256 *ac, __m256 *uc, __m256 *ka, __m256 *ku, float L)
{
    const __m256 vL = _mm256_set1_ps(L), vnL = _mm256_set1_ps(-L), one = _mm256_set1_ps(1.0f);
    const __m256 ahi = _mm256_cmp_ps(*ac, vL, _CMP_GT_OQ);
    *ac = _mm256_blendv_ps(*ac, vL, ahi);
    const __m256 hi = _mm256_cmp_ps(*uc, vL, _CMP_GT_OQ);
    const __m256 lo = _mm256_andnot_ps(hi, _mm256_cmp_ps(*uc, vnL, _CMP_LT_OQ));
    *uc = _mm256_blendv_ps(_mm256_blendv_ps(*uc, vL, hi), vnL, lo);
    *ka = _mm256_andnot_ps(ahi, one);
    *ku = _mm256_andnot_ps(_mm256_or_ps(hi, lo), one);
}

void trex_fused_swiglu_fwd_bf16_avx2(uint16_t *h, const float *a, const float *u, int64_t n, float g, float L)
{
    const __m256 vg = _mm256_set1_ps(g), one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t j = 0; j < n; j += 8) {
        const __m256i m = lanes8(n - j);
        __m256 ac = _mm256_maskload_ps(a + j, m), uc = _mm256_maskload_ps(u + j, m), ka, ku;
        if (L > 0.0f)
            clamp(&ac, &uc, &ka, &ku, L);
        const __m256 ex = swiglu_exp8(_mm256_xor_ps(ac, sign));
        const __m256 s = _mm256_div_ps(ac, _mm256_add_ps(one, ex));
        store_bf16x8(h + j, round8v(_mm256_mul_ps(_mm256_mul_ps(s, uc), vg)), n - j);
    }
}

float trex_fused_swiglu_bwd_bf16_avx2(uint16_t *h, uint16_t *da, uint16_t *du, const float *a, const float *u,
                                      const float *dh, int64_t n, float g, float L)
{
    const __m256 vg = _mm256_set1_ps(g), one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 dot[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}; /* partial sums 0-7 and 8-15 */
    for (int64_t j = 0; j < n; j += 8) {
        const __m256i m = lanes8(n - j);
        __m256 ac = _mm256_maskload_ps(a + j, m), uc = _mm256_maskload_ps(u + j, m);
        const __m256 d = _mm256_maskload_ps(dh + j, m);
        __m256 ka = one, ku = one;
        if (L > 0.0f)
            clamp(&ac, &uc, &ka, &ku, L);
        const __m256 ex = swiglu_exp8(_mm256_xor_ps(ac, sign));
        const __m256 den = _mm256_add_ps(one, ex);
        const __m256 sig = _mm256_div_ps(one, den);
        const __m256 sl = _mm256_mul_ps(ac, sig);
        const __m256 dsl = _mm256_mul_ps(sig, _mm256_add_ps(one, _mm256_mul_ps(ac, _mm256_sub_ps(one, sig))));
        const __m256 h0 = _mm256_mul_ps(_mm256_div_ps(ac, den), uc);
        __m256 *s = &dot[(j / 8) & 1];
        *s = _mm256_blendv_ps(*s, _mm256_add_ps(*s, _mm256_mul_ps(d, h0)), _mm256_castsi256_ps(m));
        if (h)
            store_bf16x8(h + j, round8v(_mm256_mul_ps(h0, vg)), n - j);
        const __m256 d0 = _mm256_mul_ps(d, vg);
        store_bf16x8(du + j, round8v(_mm256_mul_ps(_mm256_mul_ps(ku, d0), sl)), n - j);
        store_bf16x8(da + j, round8v(_mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(ka, d0), uc), dsl)), n - j);
    }
    return am_tree16(dot[0], dot[1]);
}
