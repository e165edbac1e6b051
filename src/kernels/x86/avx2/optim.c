/* kernels/x86/avx2/optim.c — AVX2 leaves of the optimizer kernels (kernels/kernels.h).
 *
 * Each gives the bits of its reference (kernels/ref/optim.c), as the AVX-512 leaves do, at half their
 * width:
 *   - sumsq: the reference's 16 lanes are the 4 doubles of four registers; a square of a float is exact
 *     in double, so the fused multiply-add x*x + acc rounds once, as the reference's product-then-add;
 *     the lanes are combined by the reference's tree (trex_lanes_sum16), and the last n % 16 elements
 *     go to their lanes in C as in the reference;
 *   - adamw, scale, muon_momentum: the reference's float operations 8 elements per register, each a
 *     separate IEEE-rounded instruction (ISO C: the compiler contracts nothing); muon_update and
 *     muon_normalize its double operations 4 per register (each float widened exactly, the result
 *     rounded once). The elements past the last whole register are the reference's own loop.
 * The streams are prefetched PREFETCH_AHEAD floats ahead, as in the AVX-512 leaves (which measured it).
 * Compiled with AVX2 and FMA flags, reached only through the table. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/x86/prefetch_l2.h"

#define PREFETCH_AHEAD 512

double trex_sumsq_avx2(const float *x, int64_t n, int64_t *nonfinite)
{
    const __m256i EXP = _mm256_set1_epi32(0x7f800000);
    __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t bad = 0, k = 0;
    for (; k + 16 <= n; k += 16) {
        _mm_prefetch(hint_addr(x + k, PREFETCH_AHEAD), _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            const __m256 v = _mm256_loadu_ps(x + k + 8 * h);
            const int nf = _mm256_movemask_ps(_mm256_castsi256_ps(
                _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), EXP), EXP)));
            if (nf)
                bad += __builtin_popcount((unsigned)nf);
            const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
            const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
            a[2 * h] = _mm256_fmadd_pd(lo, lo, a[2 * h]);
            a[2 * h + 1] = _mm256_fmadd_pd(hi, hi, a[2 * h + 1]);
        }
    }
    double lane[TREX_SUMSQ_LANES];
    for (int i = 0; i < 4; i++)
        _mm256_storeu_pd(lane + 4 * i, a[i]);
    for (int j = 0; k < n; k++, j++) {
        const double v = x[k];
        bad += !isfinite(v);
        lane[j] += v * v;
    }
    *nonfinite = bad;
    return trex_lanes_sum16(lane);
}

/* Eight elements of the AdamW pass; div_q: divide sqrt(v) by bc2_sqrt (else it is 1, and x / 1 = x). */
static inline void adamw8(float *w, float *m, float *v, const float *g, const trex_adamw_f32 *c, int div_q)
{
    const __m256 gk = _mm256_mul_ps(_mm256_loadu_ps(g), _mm256_set1_ps(c->gscale));
    const __m256 mf = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c->b1), _mm256_loadu_ps(m)),
                                    _mm256_mul_ps(_mm256_set1_ps(c->c1), gk));
    const __m256 vf = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c->b2), _mm256_loadu_ps(v)),
                                    _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(c->c2), gk), gk));
    _mm256_storeu_ps(m, mf);
    _mm256_storeu_ps(v, vf);
    __m256 r = _mm256_sqrt_ps(vf);
    if (div_q)
        r = _mm256_div_ps(r, _mm256_set1_ps(c->bc2_sqrt));
    const __m256 up = _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(c->step_size), mf),
                                    _mm256_add_ps(r, _mm256_set1_ps(c->eps)));
    _mm256_storeu_ps(w, _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(w), _mm256_set1_ps(c->decay)), up));
}

/* The whole registers of the pass: a line (16 floats) of each stream per step, its prefetches once. */
static inline int64_t adamw_run(float *w, float *m, float *v, const float *g, int64_t n, const trex_adamw_f32 *c,
                                int div_q)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm_prefetch(hint_addr(g + i, PREFETCH_AHEAD), _MM_HINT_T0);
        _mm_prefetch(hint_addr(m + i, PREFETCH_AHEAD), _MM_HINT_T0);
        _mm_prefetch(hint_addr(v + i, PREFETCH_AHEAD), _MM_HINT_T0);
        _mm_prefetch(hint_addr(w + i, PREFETCH_AHEAD), _MM_HINT_T0);
        adamw8(w + i, m + i, v + i, g + i, c, div_q);
        adamw8(w + i + 8, m + i + 8, v + i + 8, g + i + 8, c, div_q);
    }
    if (i + 8 <= n) {
        adamw8(w + i, m + i, v + i, g + i, c, div_q);
        i += 8;
    }
    return i;
}

void trex_adamw_avx2(float *w, float *m, float *v, const float *g, int64_t n, const trex_adamw_consts *c)
{
    trex_adamw_f32 k;
    trex_adamw_consts_f32(&k, c);
    const int64_t i = k.bc2_sqrt == 1.0f ? adamw_run(w, m, v, g, n, &k, 0) : adamw_run(w, m, v, g, n, &k, 1);
    trex_adamw_ref(w + i, m + i, v + i, g + i, n - i, c);
}

void trex_scale_avx2(float *y, const float *x, float a, int64_t n)
{
    const __m256 A = _mm256_set1_ps(a);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(y + k, _mm256_mul_ps(A, _mm256_loadu_ps(x + k)));
    trex_scale_ref(y + k, x + k, a, n - k);
}

void trex_muon_momentum_avx2(float *mom, float *x, const float *g, int64_t n, float mu, float gscale,
                             bool nesterov)
{
    const __m256 MU = _mm256_set1_ps(mu), GS = _mm256_set1_ps(gscale);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        _mm_prefetch(hint_addr(g + k, PREFETCH_AHEAD), _MM_HINT_T0);
        _mm_prefetch(hint_addr(mom + k, PREFETCH_AHEAD), _MM_HINT_T0);
        const __m256 gk = _mm256_mul_ps(_mm256_loadu_ps(g + k), GS);
        const __m256 m = _mm256_add_ps(_mm256_mul_ps(MU, _mm256_loadu_ps(mom + k)), gk);
        _mm256_storeu_ps(mom + k, m);
        _mm256_storeu_ps(x + k, nesterov ? _mm256_add_ps(_mm256_mul_ps(MU, m), gk) : m);
    }
    trex_muon_momentum_ref(mom + k, x + k, g + k, n - k, mu, gscale, nesterov);
}

void trex_muon_update_avx2(float *w, const float *x, int64_t n, double decay, double scale)
{
    const __m256d D = _mm256_set1_pd(decay), S = _mm256_set1_pd(scale);
    int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        _mm_prefetch(hint_addr(w + k, PREFETCH_AHEAD), _MM_HINT_T0);
        const __m256d wd = _mm256_cvtps_pd(_mm_loadu_ps(w + k)), xd = _mm256_cvtps_pd(_mm_loadu_ps(x + k));
        _mm_storeu_ps(w + k, _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_mul_pd(wd, D), _mm256_mul_pd(S, xd))));
    }
    trex_muon_update_ref(w + k, x + k, n - k, decay, scale);
}

void trex_muon_normalize_avx2(float *x, int64_t n, double norm)
{
    const __m256d N = _mm256_set1_pd(norm);
    int64_t k = 0;
    for (; k + 4 <= n; k += 4)
        _mm_storeu_ps(x + k, _mm256_cvtpd_ps(_mm256_div_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + k)), N)));
    trex_muon_normalize_ref(x + k, n - k, norm);
}
