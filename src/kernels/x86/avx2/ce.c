/* kernels/x86/avx2/ce.c — the avx2 level's cross-entropy entries (kernels/fused.h "Cross-entropy"),
 * reached only through the fused-kernel table: the LM head's passes over each block of its logits,
 * the largest of the passes the avx2 level ran in plain C (ce_fwd alone 1.1% of a dsv4-bench T = 512
 * step's samples; docs/kernels.md "The avx2 cross-entropy").
 *
 * The bits of the reference (kernels/ref/ce.c), 8 columns per register. ce_fwd: the max as MAXPS (exactly
 * `l > m ? l : m`, NaN and signed zeros included), the exp by the reference's IEEE operations in its
 * order (separate multiplies and adds: the intrinsics are explicit and the build contracts nothing), 2^n
 * applied as the reference does it (p 2^n, or (p 2^(n+64)) 2^-64 below the normal range), the sums in
 * double lanes over the rows in order. ce_grad: the product, then trex_f32_to_bf16's rounding in
 * integers (bf16.h), +0 where c is 0. Columns past the last 8 take the reference's scalar code. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/ref/exp_poly.h"
#include "kernels/x86/avx2/bf16.h"
#include "kernels/x86/avx2/exp_poly.h"
#include "trex/tensor.h"

void trex_fused_ce_fwd_avx2(float *L, int64_t ld, int64_t n, int64_t cols, int keep, float *mx, double *sum)
{
    const int64_t cv = cols / 8 * 8; /* columns in whole registers; the rest as the reference */
    for (int64_t i = 0; i < cols; i++)
        mx[i] = L[i];
    for (int64_t v = 1; v < n; v++) {
        const float *l = L + v * ld;
        int64_t i = 0;
        for (; i < cv; i += 8)
            _mm256_storeu_ps(mx + i, _mm256_max_ps(_mm256_loadu_ps(l + i), _mm256_loadu_ps(mx + i)));
        for (; i < cols; i++)
            mx[i] = l[i] > mx[i] ? l[i] : mx[i];
    }
    for (int64_t i = 0; i < cols; i++)
        sum[i] = 0.0;
    for (int64_t v = 0; v < n; v++) {
        float *l = L + v * ld;
        int64_t i = 0;
        for (; i < cv; i += 8) {
            const __m256 e = exp_nonpos8(_mm256_sub_ps(_mm256_loadu_ps(l + i), _mm256_loadu_ps(mx + i)));
            if (keep)
                _mm256_storeu_ps(l + i, e);
            const __m256d elo = _mm256_cvtps_pd(_mm256_castps256_ps128(e));
            const __m256d ehi = _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1));
            _mm256_storeu_pd(sum + i, _mm256_add_pd(_mm256_loadu_pd(sum + i), elo));
            _mm256_storeu_pd(sum + i + 4, _mm256_add_pd(_mm256_loadu_pd(sum + i + 4), ehi));
        }
        for (; i < cols; i++) {
            const float e = trex_exp_nonpos(l[i] - mx[i]);
            sum[i] += (double)e;
            if (keep)
                l[i] = e;
        }
    }
}

void trex_fused_ce_grad_avx2(uint16_t *dst, int64_t ldd, const float *E, int64_t lde, int64_t n, int64_t cols,
                             const float *c)
{
    const int64_t cv = cols / 8 * 8;
    for (int64_t v = 0; v < n; v++) {
        const float *e = E + v * lde;
        uint16_t *o = dst + v * ldd;
        int64_t i = 0;
        /* loads e[i..i+8) before o[i..i+8) (bytes 2i..2i+16, over e's first i/2 + 4 floats) is written */
        for (; i < cv; i += 8) {
            const __m256 cw = _mm256_loadu_ps(c + i);
            const __m256 nz = _mm256_cmp_ps(cw, _mm256_setzero_ps(), _CMP_NEQ_UQ); /* c != 0 */
            const __m256 x = _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(e + i), cw), nz);
            _mm_storeu_si128((__m128i *)(void *)(o + i), round8v(x));
        }
        for (; i < cols; i++)
            o[i] = c[i] != 0.0f ? trex_f32_to_bf16(e[i] * c[i]) : 0;
    }
}
