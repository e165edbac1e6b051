/* kernels/x86/avx512/optim.c — AVX-512 leaves of the optimizer kernels (kernels/kernels.h).
 *
 * Each gives the bits of its reference (kernels/ref/optim.c):
 *   - sumsq: lanes 0-7 and 8-15 of the reference are the 8 doubles of two registers; a square of a
 *     float is exact in double, so the fused multiply-add x*x + acc rounds once, exactly as the
 *     reference's product-then-add; the lanes are combined in the reference's tree. The tail is a
 *     masked load (zeros add nothing to a lane);
 *   - adamw: the reference's per-element double operations, 8 elements per register, each operation
 *     a separate IEEE-rounded instruction (the build is ISO C: the compiler contracts nothing); the
 *     tail runs masked. When bc2_sqrt is exactly 1 (from step ~730 on with beta2 0.95), x / 1 = x
 *     for every x, so that division is skipped.
 * Compiled with the flags of this folder (Makefile), reached only through the table. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/kernels.h"

double trex_sumsq_avx512(const float *x, int64_t n, int64_t *nonfinite)
{
    const __m512i EXP = _mm512_set1_epi32(0x7f800000);
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int64_t bad = 0, k = 0;
    for (; k < n; k += 16) {
        const __mmask16 mk = n - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - k)) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(mk, x + k);
        const __mmask16 nf = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), EXP), EXP);
        if (nf)
            bad += __builtin_popcount((unsigned)nf);
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    const __m512d s = _mm512_add_pd(a0, a1);                                                 /* s_j, j < 8 */
    const __m256d t = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1)); /* t_j, j < 4 */
    const __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));    /* u_j, j < 2 */
    *nonfinite = bad;
    return _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)));
}

/* Eight elements (mask mk) of the AdamW pass; div_q: divide sqrt(v) by bc2_sqrt (else it is 1). */
static inline void adamw8(float *w, float *m, float *v, const float *g, __mmask8 mk, __m256 GS, __m512d B1,
                          __m512d C1, __m512d B2, __m512d C2, __m512d EPS, __m512d SS, __m512d Q, __m512d D,
                          int div_q)
{
    const __m512d gk = _mm512_cvtps_pd(_mm256_mul_ps(_mm256_maskz_loadu_ps(mk, g), GS));
    const __m512d mk0 = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mk, m));
    const __m512d vk0 = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mk, v));
    const __m512d wk = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mk, w));
    const __m256 mf = _mm512_cvtpd_ps(_mm512_add_pd(_mm512_mul_pd(B1, mk0), _mm512_mul_pd(C1, gk)));
    const __m256 vf = _mm512_cvtpd_ps(_mm512_add_pd(_mm512_mul_pd(B2, vk0), _mm512_mul_pd(_mm512_mul_pd(C2, gk), gk)));
    _mm256_mask_storeu_ps(m, mk, mf);
    _mm256_mask_storeu_ps(v, mk, vf);
    __m512d r = _mm512_sqrt_pd(_mm512_cvtps_pd(vf));
    if (div_q)
        r = _mm512_div_pd(r, Q);
    const __m512d den = _mm512_add_pd(r, EPS);
    const __m512d up = _mm512_div_pd(_mm512_mul_pd(SS, _mm512_cvtps_pd(mf)), den);
    _mm256_mask_storeu_ps(w, mk, _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_mul_pd(wk, D), up)));
}

static inline void adamw_run(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                             int64_t n, const trex_adamw_consts *c, int div_q)
{
    const __m512d B1 = _mm512_set1_pd(c->b1), C1 = _mm512_set1_pd(1.0 - c->b1), B2 = _mm512_set1_pd(c->b2),
                  C2 = _mm512_set1_pd(1.0 - c->b2), EPS = _mm512_set1_pd(c->eps), SS = _mm512_set1_pd(c->step_size),
                  Q = _mm512_set1_pd(c->bc2_sqrt), D = _mm512_set1_pd(c->decay);
    const __m256 GS = _mm256_set1_ps(c->gscale);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        adamw8(w + k, m + k, v + k, g + k, (__mmask8)0xff, GS, B1, C1, B2, C2, EPS, SS, Q, D, div_q);
    if (k < n)
        adamw8(w + k, m + k, v + k, g + k, (__mmask8)((1u << (n - k)) - 1u), GS, B1, C1, B2, C2, EPS, SS, Q, D,
               div_q);
}

void trex_adamw_avx512(float *w, float *m, float *v, const float *g, int64_t n, const trex_adamw_consts *c)
{
    if (c->bc2_sqrt == 1.0)
        adamw_run(w, m, v, g, n, c, 0);
    else
        adamw_run(w, m, v, g, n, c, 1);
}
