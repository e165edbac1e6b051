/* kernels/x86/avx512/gemm_f32.c — the AVX-512 micro-kernel of the fp32 reference GEMM (trex_gemm).
 *
 * Same contract and same bits as trex_gemm_f32_ukr_ref (kernels/dispatch.h): each element of the 8 x 32
 * block is summed over k in increasing order, each product rounded to fp32 and then added — a multiply
 * and an add, never a fused multiply-add (the build is ISO C, so GCC does not contract them; the test
 * compares every level bit for bit). Only the vector width differs from the reference: 8 rows x 2 zmm =
 * 16 accumulators, per k two loads of B, eight broadcasts of A. Compiled with AVX-512 flags; reached
 * only through the dispatch table. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/dispatch.h"
#include "kernels/gemm_panels.h"

_Static_assert(TREX_F32_MR == 8 && TREX_F32_NR == 32, "the kernel is written for 8 x 32 blocks");

#define ROW(r)                                                              \
    do {                                                                    \
        const __m512 a = _mm512_set1_ps(ak[r]);                             \
        c##r##a = _mm512_add_ps(c##r##a, _mm512_mul_ps(a, b0));             \
        c##r##b = _mm512_add_ps(c##r##b, _mm512_mul_ps(a, b1));             \
    } while (0)
#define STORE(r)                                                            \
    do {                                                                    \
        _mm512_storeu_ps(acc + (r) * 32, c##r##a);                          \
        _mm512_storeu_ps(acc + (r) * 32 + 16, c##r##b);                     \
    } while (0)

void trex_gemm_f32_ukr_avx512(int64_t K, const float *ap, const float *bp, float *acc)
{
    __m512 c0a = _mm512_setzero_ps(), c0b = c0a, c1a = c0a, c1b = c0a, c2a = c0a, c2b = c0a,
           c3a = c0a, c3b = c0a, c4a = c0a, c4b = c0a, c5a = c0a, c5b = c0a, c6a = c0a, c6b = c0a,
           c7a = c0a, c7b = c0a;
    for (int64_t k = 0; k < K; k++) {
        const __m512 b0 = _mm512_loadu_ps(bp + k * 32), b1 = _mm512_loadu_ps(bp + k * 32 + 16);
        const float *ak = ap + k * 8;
        ROW(0);
        ROW(1);
        ROW(2);
        ROW(3);
        ROW(4);
        ROW(5);
        ROW(6);
        ROW(7);
    }
    STORE(0);
    STORE(1);
    STORE(2);
    STORE(3);
    STORE(4);
    STORE(5);
    STORE(6);
    STORE(7);
}
