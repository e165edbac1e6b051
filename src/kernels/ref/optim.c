/* kernels/ref/optim.c — the optimizer's element-wise kernels (kernels/kernels.h): the reference
 * entries, and the table of each level.
 *
 * sumsq (gradient norm and NaN/Inf count) sums in TREX_SUMSQ_LANES fixed lanes, so the AVX-512 leaf
 * (two registers of 8 doubles) gives the same bits and no sum is one long dependency chain (here: SSE2
 * pairs of lanes where the compiler targets x86-64, scalar lanes elsewhere and for the tail). adamw is the
 * fused AdamW pass: in SSE2 lanes of 2 doubles where the compiler targets x86-64 (SSE2 is part of
 * every x86-64: no ISA flag), in scalar code elsewhere and for the tail; every lane does the scalar
 * code's IEEE double operations in its order (no FMA contraction under -std=c11), so the bits are the
 * same wherever the lanes fall. Its cost is the double divider (two divisions and a square root per
 * element); the AVX-512 leaf runs the same operations 8 wide. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

double trex_sumsq_ref(const float *x, int64_t n, int64_t *nonfinite)
{
    double lane[TREX_SUMSQ_LANES] = {0};
    int64_t bad = 0, k = 0;
#if defined(__SSE2__)
    /* lanes 2i, 2i+1 in acc[i]; the NaN/Inf test on the float bits (exponent all ones) */
    __m128d acc[TREX_SUMSQ_LANES / 2];
    for (int i = 0; i < TREX_SUMSQ_LANES / 2; i++)
        acc[i] = _mm_setzero_pd();
    const __m128i EXP = _mm_set1_epi32(0x7f800000);
    for (; k + TREX_SUMSQ_LANES <= n; k += TREX_SUMSQ_LANES)
        for (int q = 0; q < TREX_SUMSQ_LANES / 4; q++) {
            const __m128 v = _mm_loadu_ps(x + k + 4 * q);
            const int nf = _mm_movemask_ps(
                _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(v), EXP), EXP)));
            if (nf)
                bad += (nf & 1) + (nf >> 1 & 1) + (nf >> 2 & 1) + (nf >> 3 & 1);
            const __m128d lo = _mm_cvtps_pd(v), hi = _mm_cvtps_pd(_mm_movehl_ps(v, v));
            acc[2 * q] = _mm_add_pd(acc[2 * q], _mm_mul_pd(lo, lo));
            acc[2 * q + 1] = _mm_add_pd(acc[2 * q + 1], _mm_mul_pd(hi, hi));
        }
    for (int i = 0; i < TREX_SUMSQ_LANES / 2; i++)
        _mm_storeu_pd(lane + 2 * i, acc[i]);
#endif
    for (; k + TREX_SUMSQ_LANES <= n; k += TREX_SUMSQ_LANES)
        for (int j = 0; j < TREX_SUMSQ_LANES; j++) {
            const double v = x[k + j];
            bad += !isfinite(v);
            lane[j] += v * v;
        }
    for (int j = 0; k < n; k++, j++) {
        const double v = x[k];
        bad += !isfinite(v);
        lane[j] += v * v;
    }
    *nonfinite = bad;
    return trex_lanes_sum16(lane);
}

#if defined(__SSE2__)
/* Two floats widened to two doubles, and two floats stored (any alignment). */
static inline __m128d load2(const float *p)
{
    double d;
    memcpy(&d, p, sizeof d);
    return _mm_cvtps_pd(_mm_castpd_ps(_mm_set_sd(d)));
}

static inline void store2(float *p, __m128 x)
{
    const double d = _mm_cvtsd_f64(_mm_castps_pd(x));
    memcpy(p, &d, sizeof d);
}

/* Two floats times a float scale (one float multiply each), widened to two doubles. */
static inline __m128d load2_scaled(const float *p, __m128 s)
{
    double d;
    memcpy(&d, p, sizeof d);
    return _mm_cvtps_pd(_mm_mul_ps(_mm_castpd_ps(_mm_set_sd(d)), s));
}
#endif

void trex_adamw_ref(float *restrict w, float *restrict m, float *restrict v, const float *restrict g, int64_t n,
                    const trex_adamw_consts *c)
{
    const double b1 = c->b1, b2 = c->b2, eps = c->eps, step_size = c->step_size, bc2_sqrt = c->bc2_sqrt,
                 decay = c->decay;
    const float gs = c->gscale;
    int64_t k = 0;
#if defined(__SSE2__)
    const __m128d B1 = _mm_set1_pd(b1), C1 = _mm_set1_pd(1.0 - b1), B2 = _mm_set1_pd(b2), C2 = _mm_set1_pd(1.0 - b2),
                  EPS = _mm_set1_pd(eps), SS = _mm_set1_pd(step_size), Q = _mm_set1_pd(bc2_sqrt),
                  D = _mm_set1_pd(decay);
    const __m128 GS = _mm_set1_ps(gs);
    for (; k + 2 <= n; k += 2) {
        const __m128d gk = load2_scaled(g + k, GS), mk = load2(m + k), vk = load2(v + k), wk = load2(w + k);
        const __m128 mf = _mm_cvtpd_ps(_mm_add_pd(_mm_mul_pd(B1, mk), _mm_mul_pd(C1, gk)));
        const __m128 vf = _mm_cvtpd_ps(_mm_add_pd(_mm_mul_pd(B2, vk), _mm_mul_pd(_mm_mul_pd(C2, gk), gk)));
        store2(m + k, mf);
        store2(v + k, vf);
        const __m128d den = _mm_add_pd(_mm_div_pd(_mm_sqrt_pd(_mm_cvtps_pd(vf)), Q), EPS);
        const __m128d up = _mm_div_pd(_mm_mul_pd(SS, _mm_cvtps_pd(mf)), den);
        store2(w + k, _mm_cvtpd_ps(_mm_sub_pd(_mm_mul_pd(wk, D), up)));
    }
#endif
    for (; k < n; k++) {
        const double gk = (float)(g[k] * gs);
        const float mk = (float)(b1 * (double)m[k] + (1.0 - b1) * gk);
        const float vk = (float)(b2 * (double)v[k] + (1.0 - b2) * gk * gk);
        m[k] = mk;
        v[k] = vk;
        const double denom = sqrt((double)vk) / bc2_sqrt + eps;
        w[k] = (float)((double)w[k] * decay - step_size * (double)mk / denom);
    }
}

/* ---- the tables -------------------------------------------------------------------------------- */

static const trex_optim_kernels table_ref = {
    .isa = TREX_ISA_REF,
    .name = "ref",
    .sumsq = trex_sumsq_ref,
    .adamw = trex_adamw_ref,
};

#if defined(__x86_64__) || defined(__i386__)
static const trex_optim_kernels table_avx512 = {
    .isa = TREX_ISA_AVX512,
    .name = "avx512",
    .sumsq = trex_sumsq_avx512,
    .adamw = trex_adamw_avx512,
};
#endif

const trex_optim_kernels *trex_optim_kernels_for(trex_isa cap)
{
    /* trex_kernels_table_for applies the machine's limits (CPU and OS) under the cap; amx has no
     * optimizer leaf of its own and uses the AVX-512 ones */
    const trex_isa isa = trex_kernels_table_for(cap)->isa;
#if defined(__x86_64__) || defined(__i386__)
    if (isa >= TREX_ISA_AVX512)
        return &table_avx512;
#endif
    (void)isa;
    return &table_ref;
}

static const trex_optim_kernels *active;
static pthread_once_t active_once = PTHREAD_ONCE_INIT;

static void active_init(void)
{
    active = trex_optim_kernels_for(trex_kernels_isa());
    const char *v = getenv("TREX_VERBOSE");
    if (v && v[0] && v[0] != '0')
        fprintf(stderr, "trex: kernels: optimizer (gradient norm, AdamW): %s\n", active->name);
}

const trex_optim_kernels *trex_optim_kernels_get(void)
{
    pthread_once(&active_once, active_init);
    return active;
}
