/* kernels/x86/avx2/gemm_f32.c — the AVX2 micro-kernel of the fp32 reference GEMM (trex_gemm).
 *
 * Same contract and same bits as trex_gemm_f32_ukr_ref (kernels/dispatch.h): each element of the 8 x 32
 * block is summed over k in increasing order, each product rounded to fp32 and then added — a multiply
 * and an add, never a fused multiply-add (the build is ISO C, so GCC does not contract them; the test
 * compares every level bit for bit). The block is done in four pieces of 4 rows x 16 columns, each over
 * the whole K: eight accumulators, two B vectors and one broadcast of A in the sixteen registers.
 * Compiled with AVX2 flags; reached only through the dispatch table. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/dispatch.h"
#include "kernels/gemm_panels.h"

_Static_assert(TREX_F32_MR == 8 && TREX_F32_NR == 32, "the kernel is written for 8 x 32 blocks");

enum { ROWS = 4, COLS = 16 };

static inline void piece(int64_t K, const float *ap, const float *bp, float *acc, int r0, int c0)
{
    __m256 s[ROWS][2]; /* in registers: the loops that update them are unrolled */
    _Pragma("GCC unroll 4") for (int i = 0; i < ROWS; i++)
        s[i][0] = s[i][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m256 b0 = _mm256_loadu_ps(bp + k * TREX_F32_NR + c0);
        const __m256 b1 = _mm256_loadu_ps(bp + k * TREX_F32_NR + c0 + 8);
        _Pragma("GCC unroll 4") for (int i = 0; i < ROWS; i++) {
            const __m256 a = _mm256_broadcast_ss(ap + k * TREX_F32_MR + r0 + i);
            s[i][0] = _mm256_add_ps(s[i][0], _mm256_mul_ps(a, b0));
            s[i][1] = _mm256_add_ps(s[i][1], _mm256_mul_ps(a, b1));
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < ROWS; i++) {
        _mm256_storeu_ps(acc + (r0 + i) * TREX_F32_NR + c0, s[i][0]);
        _mm256_storeu_ps(acc + (r0 + i) * TREX_F32_NR + c0 + 8, s[i][1]);
    }
}

void trex_gemm_f32_ukr_avx2(int64_t K, const float *ap, const float *bp, float *acc)
{
    for (int c0 = 0; c0 < TREX_F32_NR; c0 += COLS)
        for (int r0 = 0; r0 < TREX_F32_MR; r0 += ROWS)
            piece(K, ap, bp, acc, r0, c0);
}
