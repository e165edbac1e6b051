/* kernels/x86/avx2/norm.c — AVX2 leaves of RMSNorm and the fixed-lane sum of squares (kernels/fused.h),
 * giving the bits of kernels/ref/norm.c as the AVX-512 leaves (kernels/x86/avx512/norm.c) do.
 *
 * A row sum's 16 double lanes are four registers of 4 doubles (element k of a 16-float block in lane
 * k); the sum of squares is the optimizer's (trex_sumsq_avx2, optim.c: x*x + lane as one fused
 * multiply-add, exact as the reference's product then add). The backward's ((double)dy w) x is not
 * exact in double and stays a multiply, a multiply and an add; its partial last block is a masked load
 * whose zeros add +0 to lanes that are never -0 (they start at +0), which changes nothing. The lanes
 * combine in trex_lanes_sum16's tree. The element-wise passes are the reference's float operations, 8
 * elements per register, the partial last step under a mask. Compiled with this folder's flags and
 * ISO C (nothing contracted); reached only through the fused table. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "kernels/x86/avx2/mask.h"

double trex_fused_sumsq_avx2(const float *x, int64_t n)
{
    int64_t nonfinite;
    return trex_sumsq_avx2(x, n, &nonfinite);
}

void trex_fused_rmsnorm_fwd_avx2(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t dim,
                                 float eps)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        const float rs = trex_rmsnorm_rstd(trex_fused_sumsq_avx2(xr, dim), dim, eps);
        if (rstd)
            rstd[r] = rs;
        const __m256 R = _mm256_set1_ps(rs);
        for (int64_t i = 0; i < dim; i += 8) {
            const __m256i m = lanes8(dim - i);
            __m256 v = _mm256_mul_ps(_mm256_maskload_ps(xr + i, m), R);
            if (w)
                v = _mm256_mul_ps(v, _mm256_maskload_ps(w + i, m));
            store_first8(yr + i, v, dim - i);
        }
    }
}

static inline __m256d lo_pd(__m256 v)
{
    return _mm256_cvtps_pd(_mm256_castps256_ps128(v));
}

static inline __m256d hi_pd(__m256 v)
{
    return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}

/* lanes (lo, hi) += ((double)g w) x for 8 floats (w NULL: (double)g x); the products rounded, then added */
static inline void bwd_lanes(__m256d *lo, __m256d *hi, __m256 g, __m256 x, const __m256 *w)
{
    __m256d g0 = lo_pd(g), g1 = hi_pd(g);
    if (w) {
        g0 = _mm256_mul_pd(g0, lo_pd(*w));
        g1 = _mm256_mul_pd(g1, hi_pd(*w));
    }
    *lo = _mm256_add_pd(*lo, _mm256_mul_pd(g0, lo_pd(x)));
    *hi = _mm256_add_pd(*hi, _mm256_mul_pd(g1, hi_pd(x)));
}

/* sum_i ((double)dy_i w_i) x_i (w NULL: (double)dy_i x_i) in the reference's lanes and tree: whole
 * 16-float blocks with plain loads, the partial last one with masked loads */
static inline __attribute__((always_inline)) double bwd_dot(const float *dy, const float *x, const float *w,
                                                            int64_t dim)
{
    __m256d l0 = _mm256_setzero_pd(), l1 = _mm256_setzero_pd(), l2 = _mm256_setzero_pd(), l3 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= dim; i += 16) {
        __m256 w0, w1;
        if (w)
            w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + i + 8);
        bwd_lanes(&l0, &l1, _mm256_loadu_ps(dy + i), _mm256_loadu_ps(x + i), w ? &w0 : NULL);
        bwd_lanes(&l2, &l3, _mm256_loadu_ps(dy + i + 8), _mm256_loadu_ps(x + i + 8), w ? &w1 : NULL);
    }
    if (i < dim) {
        const __m256i m0 = lanes8(dim - i), m1 = lanes8(dim - i - 8);
        __m256 w0, w1;
        if (w)
            w0 = _mm256_maskload_ps(w + i, m0), w1 = _mm256_maskload_ps(w + i + 8, m1);
        bwd_lanes(&l0, &l1, _mm256_maskload_ps(dy + i, m0), _mm256_maskload_ps(x + i, m0), w ? &w0 : NULL);
        bwd_lanes(&l2, &l3, _mm256_maskload_ps(dy + i + 8, m1), _mm256_maskload_ps(x + i + 8, m1), w ? &w1 : NULL);
    }
    double lane[TREX_SUMSQ_LANES];
    _mm256_storeu_pd(lane, l0);
    _mm256_storeu_pd(lane + 4, l1);
    _mm256_storeu_pd(lane + 8, l2);
    _mm256_storeu_pd(lane + 12, l3);
    return trex_lanes_sum16(lane);
}

void trex_fused_rmsnorm_bwd_avx2(float *dx, const float *dy, const float *x, const float *w, const float *rstd,
                                 int64_t n, int64_t dim, int acc)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim, *dyr = dy + r * dim;
        float *dxr = dx + r * dim;
        const float rs = rstd[r];
        const float c = (float)(bwd_dot(dyr, xr, w, dim) / (double)dim) * rs * rs;
        const __m256 R = _mm256_set1_ps(rs), C = _mm256_set1_ps(c);
        for (int64_t i = 0; i < dim; i += 8) {
            const __m256i m = lanes8(dim - i);
            __m256 g = _mm256_maskload_ps(dyr + i, m);
            if (w)
                g = _mm256_mul_ps(g, _mm256_maskload_ps(w + i, m));
            const __m256 xc = _mm256_mul_ps(_mm256_maskload_ps(xr + i, m), C);
            __m256 v = _mm256_mul_ps(R, _mm256_sub_ps(g, xc));
            if (acc)
                v = _mm256_add_ps(_mm256_maskload_ps(dxr + i, m), v);
            store_first8(dxr + i, v, dim - i);
        }
    }
}

/* Rows in chunks of DW_ROWS (a chunk's rows stay in cache while every column block passes over them),
 * 8 registers of columns at a time: each dw element is loaded, summed over the chunk's rows in order
 * and stored back exactly, so its additions keep the reference's order. */
#define DW_ROWS 32
#define DW_REGS 8

void trex_fused_rmsnorm_dw_avx2(float *dw, const float *dy, const float *x, const float *rstd, int64_t n,
                                int64_t dim, int64_t j0, int64_t j1)
{
    for (int64_t r0 = 0; r0 < n; r0 += DW_ROWS) {
        const int64_t r1 = r0 + DW_ROWS < n ? r0 + DW_ROWS : n;
        int64_t i = j0;
        for (; i + 8 * DW_REGS <= j1; i += 8 * DW_REGS) {
            __m256 s[DW_REGS];
            _Pragma("GCC unroll 8")
            for (int k = 0; k < DW_REGS; k++)
                s[k] = _mm256_loadu_ps(dw + i + 8 * k);
            for (int64_t r = r0; r < r1; r++) {
                const float *xr = x + r * dim + i, *dyr = dy + r * dim + i;
                const __m256 R = _mm256_set1_ps(rstd[r]);
                _Pragma("GCC unroll 8")
                for (int k = 0; k < DW_REGS; k++) {
                    const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(dyr + 8 * k), _mm256_loadu_ps(xr + 8 * k));
                    s[k] = _mm256_add_ps(s[k], _mm256_mul_ps(p, R));
                }
            }
            _Pragma("GCC unroll 8")
            for (int k = 0; k < DW_REGS; k++)
                _mm256_storeu_ps(dw + i + 8 * k, s[k]);
        }
        for (; i < j1; i += 8) {
            const __m256i m = lanes8(j1 - i);
            __m256 s = _mm256_maskload_ps(dw + i, m);
            for (int64_t r = r0; r < r1; r++) {
                const __m256 p = _mm256_mul_ps(_mm256_maskload_ps(dy + r * dim + i, m),
                                               _mm256_maskload_ps(x + r * dim + i, m));
                s = _mm256_add_ps(s, _mm256_mul_ps(p, _mm256_set1_ps(rstd[r])));
            }
            store_first8(dw + i, s, j1 - i);
        }
    }
}
