/* kernels/x86/avx2/attn.c — the bf16 attention's key-side product on AVX2 (sattn_key_product_bf16 of
 * kernels/fused.h), the one hand-written entry of the avx2 level's attention core; the others are the
 * reference's C compiled for AVX2 (attn_ref.c).
 *
 * dV[e][i] += sum over k of a2[e][k] B(k, i), with the reference's operations in its order: each product
 * rounded, then added, k ascending from the first term, then one add into dV. (A product of two bf16
 * values is exact in fp32 unless it falls below fp32's normal range, where a fused multiply-add would
 * round differently: a review found 36 501 of 51 200 sums different with operands near 1e-30 and 1e-9,
 * so there is none here.) So this leaf gives the reference's bits, which the level's window pass (the
 * reference's C) must match. As in the GEMM's AVX2 micro-kernel (gemm_bf16.c), a dword of B's VNNI rows
 * holds the pair (k, k+1) of one column, widened by one shift and one mask (pairs.h); pieces of 4 entries x 16
 * columns keep eight sums in registers over the whole K. a2's rows past n up to a multiple of 16 are
 * zero (the contract), so a piece may read them. Compiled with AVX2 flags; reached only through the
 * fused table. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/x86/avx2/pairs.h"

enum { ROWS = 4, COLS = 16 };

/* B's 16 columns i0.. of the pair (k, k+1) (i0 a multiple of 16): 32 consecutive bf16 of b2. */
static inline const uint16_t *b_pair(const uint16_t *b2, int64_t k, int64_t i0, int64_t cp)
{
    return b2 + ((k / 32) * (cp / 16) + i0 / 16) * 512 + ((k % 32) / 2) * 32;
}

void trex_fused_sattn_key_product_bf16_avx2(float *const *dV, float *ws, const uint16_t *a2,
                                            const uint16_t *b2, int64_t K, int64_t n, int64_t c)
{
    (void)ws;
    const int64_t cp = TREX_FUSED_SATTN_CP(c);
    for (int64_t e0 = 0; e0 < n; e0 += ROWS)
        for (int64_t i0 = 0; i0 < c; i0 += COLS) {
            __m256 s[ROWS][2];
            _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; r++)
                s[r][0] = s[r][1] = _mm256_setzero_ps();
            for (int64_t k = 0; k < K; k += 2) {
                const bool odd_too = k + 1 < K;
                const uint16_t *bk = b_pair(b2, k, i0, cp);
                const __m256i b0 = _mm256_loadu_si256((const __m256i *)(const void *)bk);
                const __m256i b1 = _mm256_loadu_si256((const __m256i *)(const void *)(bk + 16));
                const __m256 ev0 = pair_even(b0), ev1 = pair_even(b1), od0 = pair_odd(b0), od1 = pair_odd(b1);
                _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; r++) {
                    const __m256i p = pair_bcast(a2 + (e0 + r) * K + k, !odd_too);
                    const __m256 a0 = pair_even(p), a1 = pair_odd(p);
                    if (k == 0) { /* the first term is the sum, not 0 + it (the sign of a zero) */
                        s[r][0] = _mm256_mul_ps(a0, ev0);
                        s[r][1] = _mm256_mul_ps(a0, ev1);
                    } else {
                        s[r][0] = _mm256_add_ps(s[r][0], _mm256_mul_ps(a0, ev0));
                        s[r][1] = _mm256_add_ps(s[r][1], _mm256_mul_ps(a0, ev1));
                    }
                    if (odd_too) {
                        s[r][0] = _mm256_add_ps(s[r][0], _mm256_mul_ps(a1, od0));
                        s[r][1] = _mm256_add_ps(s[r][1], _mm256_mul_ps(a1, od1));
                    }
                }
            }
            const int64_t m = c - i0 < COLS ? c - i0 : COLS;
            for (int r = 0; r < ROWS && e0 + r < n; r++) {
                float sum[COLS];
                _mm256_storeu_ps(sum, s[r][0]);
                _mm256_storeu_ps(sum + 8, s[r][1]);
                float *d = dV[e0 + r] + i0;
                for (int64_t i = 0; i < m; i++)
                    d[i] += sum[i];
            }
        }
}
