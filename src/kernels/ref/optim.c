/* kernels/ref/optim.c — the optimizer's element-wise kernels (kernels/kernels.h): the reference
 * entries, and the table of each level.
 *
 * sumsq (gradient norm and NaN/Inf count) sums in TREX_SUMSQ_LANES fixed lanes, so the AVX-512 leaf
 * (two registers of 8 doubles) gives the same bits and no sum is one long dependency chain (here: SSE2
 * pairs of lanes where the compiler targets x86-64, scalar lanes elsewhere and for the tail). adamw is the
 * fused AdamW pass in float arithmetic on the fp32 state (as PyTorch's and Megatron's AdamW compute it):
 * each element a fixed sequence of IEEE float operations (no FMA contraction under -std=c11), which the
 * AVX-512 leaf runs 16 wide, so every level gives the same bits (docs/optim.md). scale (y = a x, Muon's
 * Newton–Schulz) is one float multiply per element at every level (SSE2 here, 16 wide in the leaf); Muon's
 * momentum (float), update and normalization (double) passes are the optimizer's loops as they were, which
 * the leaf runs 16, 8 and 8 wide (the AVX2 leaves, kernels/x86/avx2/optim.c: 8, 4 and 4). */
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

void trex_adamw_ref(float *restrict w, float *restrict m, float *restrict v, const float *restrict g, int64_t n,
                    const trex_adamw_consts *c)
{
    trex_adamw_f32 k;
    trex_adamw_consts_f32(&k, c);
    for (int64_t i = 0; i < n; i++) {
        const float gk = g[i] * k.gscale;
        const float mk = k.b1 * m[i] + k.c1 * gk;
        const float vk = k.b2 * v[i] + (k.c2 * gk) * gk;
        m[i] = mk;
        v[i] = vk;
        const float den = sqrtf(vk) / k.bc2_sqrt + k.eps;
        w[i] = w[i] * k.decay - (k.step_size * mk) / den;
    }
}

void trex_scale_ref(float *y, const float *x, float a, int64_t n)
{
    int64_t k = 0;
#if defined(__SSE2__)
    const __m128 A = _mm_set1_ps(a);
    for (; k + 4 <= n; k += 4)
        _mm_storeu_ps(y + k, _mm_mul_ps(A, _mm_loadu_ps(x + k)));
#endif
    for (; k < n; k++)
        y[k] = a * x[k];
}

void trex_muon_momentum_ref(float *restrict mom, float *restrict x, const float *restrict g, int64_t n, float mu,
                            float gscale, bool nesterov)
{
    for (int64_t k = 0; k < n; k++) {
        const float gk = g[k] * gscale;
        const float mk = mu * mom[k] + gk;
        mom[k] = mk;
        x[k] = nesterov ? mu * mk + gk : mk;
    }
}

void trex_muon_update_ref(float *restrict w, const float *restrict x, int64_t n, double decay, double scale)
{
    for (int64_t k = 0; k < n; k++)
        w[k] = (float)((double)w[k] * decay - scale * (double)x[k]);
}

void trex_muon_normalize_ref(float *x, int64_t n, double norm)
{
    for (int64_t k = 0; k < n; k++)
        x[k] = (float)((double)x[k] / norm);
}

/* ---- the tables -------------------------------------------------------------------------------- */

/* The table of a level from its leaves' names (TREX_OPTIM_LEAVES in kernels/kernels.h). */
#define OPTIM_TABLE(level, sfx)                                                                       \
    {                                                                                                 \
        .isa = level, .name = #sfx, .sumsq = trex_sumsq_##sfx, .adamw = trex_adamw_##sfx,             \
        .scale = trex_scale_##sfx, .muon_momentum = trex_muon_momentum_##sfx,                         \
        .muon_update = trex_muon_update_##sfx, .muon_normalize = trex_muon_normalize_##sfx,           \
    }

static const trex_optim_kernels table_ref = OPTIM_TABLE(TREX_ISA_REF, ref);
#if defined(__x86_64__) || defined(__i386__)
static const trex_optim_kernels table_avx2 = OPTIM_TABLE(TREX_ISA_AVX2, avx2);
/* the AVX-512 leaves use F/BW/VL only: the avx512f level runs them too, and amx has none of its own */
static const trex_optim_kernels table_avx512f = OPTIM_TABLE(TREX_ISA_AVX512F, avx512);
static const trex_optim_kernels table_avx512 = OPTIM_TABLE(TREX_ISA_AVX512, avx512);
#endif

/* Each level's table, by level (elsewhere than x86 the dispatch never picks a level above ref) */
static const trex_optim_kernels *const tables[TREX_ISA_COUNT] = {
    [TREX_ISA_REF] = &table_ref,
#if defined(__x86_64__) || defined(__i386__)
    [TREX_ISA_AVX2] = &table_avx2,
    [TREX_ISA_AVX512F] = &table_avx512f,
    [TREX_ISA_AVX512] = &table_avx512,
    [TREX_ISA_AMX] = &table_avx512,
#endif
};

const trex_optim_kernels *trex_optim_kernels_for(trex_isa cap)
{
    /* trex_kernels_table_for applies the machine's limits (CPU and OS) under the cap */
    return tables[trex_kernels_table_for(cap)->isa];
}

static const trex_optim_kernels *active;
static pthread_once_t active_once = PTHREAD_ONCE_INIT;

static void active_init(void)
{
    active = trex_optim_kernels_for(trex_kernels_isa());
    if (trex_kernels_verbose())
        fprintf(stderr, "trex: kernels: optimizer (gradient norm, AdamW, Muon passes): %s\n", active->name);
}

const trex_optim_kernels *trex_optim_kernels_get(void)
{
    pthread_once(&active_once, active_init);
    return active;
}
