/* kernels/x86/avx2/mhc.c — the mHC entries of the fused table (kernels/fused.h: HC_post forward and
 * backward, the pre-mix's collapse and its backward) on AVX2, with the reference's bits
 * (model/mhc_real.h, float; tests/test_fused.c compares them):
 *   - the element-wise sums over streams: 8 elements per register, the reference's order (from +0, or
 *     from its first product), a multiply, then an add; the last partial step under a mask;
 *   - the sums over d (mhc_lane_dot): 16 double lanes, value i in lane i mod 16, as four registers of 4
 *     doubles; a product of two floats is exact in double, so a fused multiply-add per lane rounds
 *     once, as the reference's product then add; the last d % 16 values are added in C, to their lanes,
 *     and the lanes combine in trex_lanes_sum16's tree.
 * Compiled with this folder's flags and ISO C, so nothing else is contracted into a fused
 * multiply-add. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "kernels/x86/avx2/mask.h"
#include "trex/status.h"

/* sum_i (double)a[i] (double)b[i] in mhc_lane_dot's lanes and tree */
static double lane_dot(const float *a, const float *b, int64_t d)
{
    __m256d l[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 16 <= d; i += 16)
        for (int h = 0; h < 2; h++) {
            const __m256 x = _mm256_loadu_ps(a + i + 8 * h), y = _mm256_loadu_ps(b + i + 8 * h);
            l[2 * h] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)),
                                       _mm256_cvtps_pd(_mm256_castps256_ps128(y)), l[2 * h]);
            l[2 * h + 1] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)),
                                           _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)), l[2 * h + 1]);
        }
    double lane[16];
    for (int k = 0; k < 4; k++)
        _mm256_storeu_pd(lane + 4 * k, l[k]);
    for (int j = 0; i < d; i++, j++)
        lane[j] += (double)a[i] * (double)b[i];
    return trex_lanes_sum16(lane);
}

void trex_fused_mhc_post_fwd_avx2(int n, int64_t d, const float *post, const float *comb, const float *y,
                                  const float *X, float *Xo)
{
    TREX_ASSERT(n >= 1 && n <= 8);
    for (int64_t i = 0; i < d; i += 8) {
        const __m256i m = lanes8(d - i);
        const __m256 yv = _mm256_maskload_ps(y + i, m);
        __m256 xj[8]; /* the streams' values, loaded once for the n outputs */
        for (int j = 0; j < n; j++)
            xj[j] = _mm256_maskload_ps(X + (int64_t)j * d + i, m);
        for (int k = 0; k < n; k++) {
            __m256 s = _mm256_mul_ps(_mm256_set1_ps(post[k]), yv);
            for (int j = 0; j < n; j++)
                s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(comb[j * n + k]), xj[j]));
            store_first8(Xo + (int64_t)k * d + i, s, d - i);
        }
    }
}

void trex_fused_mhc_collapse_avx2(int n, int64_t d, const float *w, const float *X, float *x)
{
    for (int64_t i = 0; i < d; i += 8) {
        const __m256i m = lanes8(d - i);
        __m256 s = _mm256_setzero_ps();
        for (int k = 0; k < n; k++)
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(w[k]),
                                               _mm256_maskload_ps(X + (int64_t)k * d + i, m)));
        store_first8(x + i, s, d - i);
    }
}

void trex_fused_mhc_post_bwd_avx2(int n, int64_t d, const float *post, const float *comb, const float *y,
                                  const float *X, const float *dXo, float *dy, float *dX, float *dpost,
                                  float *dcomb)
{
    TREX_ASSERT(n >= 1 && n <= 8);
    /* dy and dX: element-wise, k ascending from +0 */
    for (int64_t i = 0; i < d; i += 8) {
        const __m256i m = lanes8(d - i);
        __m256 g[8];
        for (int k = 0; k < n; k++)
            g[k] = _mm256_maskload_ps(dXo + (int64_t)k * d + i, m);
        __m256 s = _mm256_setzero_ps();
        for (int k = 0; k < n; k++)
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(post[k]), g[k]));
        store_first8(dy + i, s, d - i);
        for (int j = 0; j < n; j++) {
            __m256 t = _mm256_setzero_ps();
            for (int k = 0; k < n; k++)
                t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_set1_ps(comb[j * n + k]), g[k]));
            store_first8(dX + (int64_t)j * d + i, t, d - i);
        }
    }
    for (int k = 0; k < n; k++) {
        const float *gk = dXo + (int64_t)k * d;
        dpost[k] = (float)lane_dot(gk, y, d);
        for (int j = 0; j < n; j++)
            dcomb[j * n + k] = (float)lane_dot(X + (int64_t)j * d, gk, d);
    }
}

void trex_fused_mhc_collapse_bwd_avx2(int n, int64_t d, const float *w, const float *X, const float *dx,
                                      float *dw, float *dX)
{
    for (int k = 0; k < n; k++) {
        const float *Xk = X + (int64_t)k * d;
        if (dX) {
            float *o = dX + (int64_t)k * d;
            const __m256 wk = _mm256_set1_ps(w[k]);
            for (int64_t i = 0; i < d; i += 8) {
                const __m256i m = lanes8(d - i);
                store_first8(o + i, _mm256_add_ps(_mm256_maskload_ps(o + i, m),
                                                  _mm256_mul_ps(wk, _mm256_maskload_ps(dx + i, m))), d - i);
            }
        }
        dw[k] = (float)lane_dot(Xk, dx, d);
    }
}
