/* kernels/x86/avx512/norm.c — AVX-512 leaves of RMSNorm and the fixed-lane sum of squares
 * (kernels/fused.h), giving the bits of kernels/ref/norm.c.
 *
 * The 16 double lanes of a row sum are two registers of 8 doubles: element k of a 16-float block is
 * lane k (lanes 0-7 in the low register, 8-15 in the high one), the reference's lane k mod 16. A
 * square of a float is exact in double, so x*x + lane as one fused multiply-add rounds once, exactly
 * like the reference's product then add; the backward's ((double)dy w) x is not exact and stays a
 * multiply, a multiply and an add. The tail is a masked load: zeros add +0 to a lane, which changes
 * nothing. The lanes are combined in the reference's tree. The element-wise passes are the
 * reference's float operations, 16 elements per register, the tail under a mask.
 * Compiled with the flags of this folder (Makefile), reached only through the fused table. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/x86/avx512/mask.h"

static inline __m512d lo_pd(__m512 v)
{
    return _mm512_cvtps_pd(_mm512_castps512_ps256(v));
}

static inline __m512d hi_pd(__m512 v)
{
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* (a0 lanes 0-7, a1 lanes 8-15) combined as the reference's tree */
static inline double tree(__m512d a0, __m512d a1)
{
    /* s_j (j < 8), t_j (j < 4), u_j (j < 2), then u_0 + u_1 */
    const __m512d s = _mm512_add_pd(a0, a1);
    const __m256d t = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));
    const __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
    return _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)));
}

double trex_fused_sumsq_avx512(const float *x, int64_t n)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m512 v = _mm512_loadu_ps(x + k);
        const __m512d lo = lo_pd(v), hi = hi_pd(v);
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    if (k < n) {
        const __m512 v = _mm512_maskz_loadu_ps(tail_mask(n - k), x + k);
        const __m512d lo = lo_pd(v), hi = hi_pd(v);
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    return tree(a0, a1);
}

void trex_fused_rmsnorm_fwd_avx512(float *y, float *rstd, const float *x, const float *w, int64_t n,
                                   int64_t dim, float eps)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        const float rs = trex_rmsnorm_rstd(trex_fused_sumsq_avx512(xr, dim), dim, eps);
        if (rstd)
            rstd[r] = rs;
        const __m512 R = _mm512_set1_ps(rs);
        for (int64_t i = 0; i < dim; i += 16) {
            const __mmask16 m = tail_mask(dim - i);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), R);
            if (w)
                v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
            _mm512_mask_storeu_ps(yr + i, m, v);
        }
    }
}

void trex_fused_rmsnorm_bwd_avx512(float *dx, const float *dy, const float *x, const float *w,
                                   const float *rstd, int64_t n, int64_t dim, int acc)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim, *dyr = dy + r * dim;
        float *dxr = dx + r * dim;
        __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
        for (int64_t i = 0; i < dim; i += 16) {
            const __mmask16 m = tail_mask(dim - i);
            const __m512 g = _mm512_maskz_loadu_ps(m, dyr + i);
            const __m512 v = _mm512_maskz_loadu_ps(m, xr + i);
            __m512d g0 = lo_pd(g), g1 = hi_pd(g);
            if (w) {
                const __m512 wv = _mm512_maskz_loadu_ps(m, w + i);
                g0 = _mm512_mul_pd(g0, lo_pd(wv));
                g1 = _mm512_mul_pd(g1, hi_pd(wv));
            }
            a0 = _mm512_add_pd(a0, _mm512_mul_pd(g0, lo_pd(v)));
            a1 = _mm512_add_pd(a1, _mm512_mul_pd(g1, hi_pd(v)));
        }
        const float rs = rstd[r];
        const float c = (float)(tree(a0, a1) / (double)dim) * rs * rs;
        const __m512 R = _mm512_set1_ps(rs), C = _mm512_set1_ps(c);
        for (int64_t i = 0; i < dim; i += 16) {
            const __mmask16 m = tail_mask(dim - i);
            __m512 g = _mm512_maskz_loadu_ps(m, dyr + i);
            if (w)
                g = _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, w + i));
            const __m512 xc = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), C);
            __m512 v = _mm512_mul_ps(R, _mm512_sub_ps(g, xc));
            if (acc)
                v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, dxr + i), v);
            _mm512_mask_storeu_ps(dxr + i, m, v);
        }
    }
}

/* Rows in chunks of DW_ROWS (so that a chunk's rows stay in cache while every column block passes over
 * them), 4 registers of columns at a time: each dw element is loaded, summed over the chunk's rows in
 * order and stored back exactly, so its additions keep the reference's order. */
#define DW_ROWS 32

/* (dy x) rstd for 16 columns */
static inline __m512 dw_term(const float *dy, const float *x, __m512 R)
{
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(dy), _mm512_loadu_ps(x)), R);
}

void trex_fused_rmsnorm_dw_avx512(float *dw, const float *dy, const float *x, const float *rstd,
                                  int64_t n, int64_t dim, int64_t j0, int64_t j1)
{
    for (int64_t r0 = 0; r0 < n; r0 += DW_ROWS) {
        const int64_t r1 = r0 + DW_ROWS < n ? r0 + DW_ROWS : n;
        int64_t i = j0;
        for (; i + 64 <= j1; i += 64) {
            __m512 s0 = _mm512_loadu_ps(dw + i), s1 = _mm512_loadu_ps(dw + i + 16);
            __m512 s2 = _mm512_loadu_ps(dw + i + 32), s3 = _mm512_loadu_ps(dw + i + 48);
            for (int64_t r = r0; r < r1; r++) {
                const float *xr = x + r * dim + i, *dyr = dy + r * dim + i;
                const __m512 R = _mm512_set1_ps(rstd[r]);
                s0 = _mm512_add_ps(s0, dw_term(dyr, xr, R));
                s1 = _mm512_add_ps(s1, dw_term(dyr + 16, xr + 16, R));
                s2 = _mm512_add_ps(s2, dw_term(dyr + 32, xr + 32, R));
                s3 = _mm512_add_ps(s3, dw_term(dyr + 48, xr + 48, R));
            }
            _mm512_storeu_ps(dw + i, s0);
            _mm512_storeu_ps(dw + i + 16, s1);
            _mm512_storeu_ps(dw + i + 32, s2);
            _mm512_storeu_ps(dw + i + 48, s3);
        }
        for (; i < j1; i += 16) {
            const __mmask16 m = tail_mask(j1 - i);
            __m512 s = _mm512_maskz_loadu_ps(m, dw + i);
            for (int64_t r = r0; r < r1; r++) {
                const __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dy + r * dim + i),
                                               _mm512_maskz_loadu_ps(m, x + r * dim + i));
                s = _mm512_add_ps(s, _mm512_mul_ps(p, _mm512_set1_ps(rstd[r])));
            }
            _mm512_mask_storeu_ps(dw + i, m, s);
        }
    }
}
