/* kernels/x86/avx512/optim.c — AVX-512 leaves of the optimizer kernels (kernels/kernels.h).
 *
 * Each gives the bits of its reference (kernels/ref/optim.c):
 *   - sumsq: lanes 0-7 and 8-15 of the reference are the 8 doubles of two registers; a square of a
 *     float is exact in double, so the fused multiply-add x*x + acc rounds once, exactly as the
 *     reference's product-then-add; the lanes are combined in the reference's tree. The tail is a
 *     masked load (zeros add nothing to a lane);
 *   - adamw: the reference's per-element float operations, 16 elements per register, each operation a
 *     separate IEEE-rounded instruction (the build is ISO C: the compiler contracts nothing); the tail
 *     runs masked. When bc2_sqrt is exactly 1 as a float (from step ~330 with beta2 0.95), x / 1 = x
 *     for every x, so that division is skipped.
 *   - scale: one multiply per element, 16 per register, the tail masked;
 *   - muon_momentum and muon_update: the reference's float (16 wide) and double (8 wide, each float
 *     widened exactly, the result rounded once) operations in its order, the streams prefetched as in
 *     adamw (the gradient, the momentum and the weights come from memory, one matrix after another).
 * Compiled with the flags of this folder (Makefile), reached only through the table. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/x86/avx512/mask.h"

/* Both passes stream gigabytes (the gradients; weights, gradients and both moments) with a line per
 * 16 elements per stream, and ask for the line PREFETCH_AHEAD floats ahead of each: on both threads, in
 * 64 Ki-element chunks, the gradient norm over 2 GiB went from 18.0-18.4 to 21.7-22.8 GB/s, the float
 * AdamW pass over 64 Mi elements from 0.63-0.68 to 0.58 ns per element (256 floats ahead: 0.59-0.66;
 * docs/optim.md). Hints only: they change no value and never fault. */
#define PREFETCH_AHEAD 512

double trex_sumsq_avx512(const float *x, int64_t n, int64_t *nonfinite)
{
    const __m512i EXP = _mm512_set1_epi32(0x7f800000);
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int64_t bad = 0, k = 0;
    for (; k < n; k += 16) {
        _mm_prefetch(hint_addr(x + k, PREFETCH_AHEAD), _MM_HINT_T0);
        const __mmask16 mk = tail_mask(n - k);
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

/* Sixteen elements (mask mk) of the AdamW pass; div_q: divide sqrt(v) by bc2_sqrt (else it is 1). */
static inline void adamw16(float *w, float *m, float *v, const float *g, __mmask16 mk, __m512 GS, __m512 B1,
                           __m512 C1, __m512 B2, __m512 C2, __m512 EPS, __m512 SS, __m512 Q, __m512 D, int div_q)
{
    _mm_prefetch(hint_addr(g, PREFETCH_AHEAD), _MM_HINT_T0);
    _mm_prefetch(hint_addr(m, PREFETCH_AHEAD), _MM_HINT_T0);
    _mm_prefetch(hint_addr(v, PREFETCH_AHEAD), _MM_HINT_T0);
    _mm_prefetch(hint_addr(w, PREFETCH_AHEAD), _MM_HINT_T0);
    const __m512 gk = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, g), GS);
    const __m512 mf = _mm512_add_ps(_mm512_mul_ps(B1, _mm512_maskz_loadu_ps(mk, m)), _mm512_mul_ps(C1, gk));
    const __m512 vf =
        _mm512_add_ps(_mm512_mul_ps(B2, _mm512_maskz_loadu_ps(mk, v)), _mm512_mul_ps(_mm512_mul_ps(C2, gk), gk));
    _mm512_mask_storeu_ps(m, mk, mf);
    _mm512_mask_storeu_ps(v, mk, vf);
    __m512 r = _mm512_sqrt_ps(vf);
    if (div_q)
        r = _mm512_div_ps(r, Q);
    const __m512 up = _mm512_div_ps(_mm512_mul_ps(SS, mf), _mm512_add_ps(r, EPS));
    _mm512_mask_storeu_ps(w, mk, _mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, w), D), up));
}

static inline void adamw_run(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                             int64_t n, const trex_adamw_f32 *c, int div_q)
{
    const __m512 B1 = _mm512_set1_ps(c->b1), C1 = _mm512_set1_ps(c->c1), B2 = _mm512_set1_ps(c->b2),
                 C2 = _mm512_set1_ps(c->c2), EPS = _mm512_set1_ps(c->eps), SS = _mm512_set1_ps(c->step_size),
                 Q = _mm512_set1_ps(c->bc2_sqrt), D = _mm512_set1_ps(c->decay), GS = _mm512_set1_ps(c->gscale);
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        adamw16(w + k, m + k, v + k, g + k, (__mmask16)0xffff, GS, B1, C1, B2, C2, EPS, SS, Q, D, div_q);
    if (k < n)
        adamw16(w + k, m + k, v + k, g + k, tail_mask(n - k), GS, B1, C1, B2, C2, EPS, SS, Q, D,
                div_q);
}

void trex_adamw_avx512(float *w, float *m, float *v, const float *g, int64_t n, const trex_adamw_consts *c)
{
    trex_adamw_f32 k;
    trex_adamw_consts_f32(&k, c);
    if (k.bc2_sqrt == 1.0f)
        adamw_run(w, m, v, g, n, &k, 0);
    else
        adamw_run(w, m, v, g, n, &k, 1);
}

void trex_scale_avx512(float *y, const float *x, float a, int64_t n)
{
    const __m512 A = _mm512_set1_ps(a);
    for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 mk = tail_mask(n - k);
        _mm512_mask_storeu_ps(y + k, mk, _mm512_mul_ps(A, _mm512_maskz_loadu_ps(mk, x + k)));
    }
}

void trex_muon_momentum_avx512(float *mom, float *x, const float *g, int64_t n, float mu, float gscale,
                               bool nesterov)
{
    const __m512 MU = _mm512_set1_ps(mu), GS = _mm512_set1_ps(gscale);
    for (int64_t k = 0; k < n; k += 16) {
        _mm_prefetch(hint_addr(g + k, PREFETCH_AHEAD), _MM_HINT_T0);
        _mm_prefetch(hint_addr(mom + k, PREFETCH_AHEAD), _MM_HINT_T0);
        const __mmask16 mk = tail_mask(n - k);
        const __m512 gk = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, g + k), GS);
        const __m512 m = _mm512_add_ps(_mm512_mul_ps(MU, _mm512_maskz_loadu_ps(mk, mom + k)), gk);
        _mm512_mask_storeu_ps(mom + k, mk, m);
        _mm512_mask_storeu_ps(x + k, mk, nesterov ? _mm512_add_ps(_mm512_mul_ps(MU, m), gk) : m);
    }
}

void trex_muon_update_avx512(float *w, const float *x, int64_t n, double decay, double scale)
{
    const __m512d D = _mm512_set1_pd(decay), S = _mm512_set1_pd(scale);
    for (int64_t k = 0; k < n; k += 8) {
        _mm_prefetch(hint_addr(w + k, PREFETCH_AHEAD), _MM_HINT_T0);
        const __mmask8 mk = tail_mask8(n - k);
        const __m512d wd = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mk, w + k));
        const __m512d xd = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mk, x + k));
        _mm256_mask_storeu_ps(w + k, mk, _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_mul_pd(wd, D), _mm512_mul_pd(S, xd))));
    }
}

void trex_muon_normalize_avx512(float *x, int64_t n, double norm)
{
    const __m512d N = _mm512_set1_pd(norm);
    for (int64_t k = 0; k < n; k += 8) {
        const __mmask8 mk = tail_mask8(n - k);
        const __m512d xd = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mk, x + k));
        _mm256_mask_storeu_ps(x + k, mk, _mm512_cvtpd_ps(_mm512_div_pd(xd, N)));
    }
}
