/* kernels/x86/avx512/gemm_f32.c — the AVX-512 micro-kernel of the fp32 reference GEMM (trex_gemm), and
 * the GEMM's other F-only leaves: a block's transpose, the fence after streamed stores and the fp32 FMA
 * peak. Both AVX-512 levels (avx512f and avx512) run them.
 *
 * Same contract and same bits as trex_gemm_f32_ukr_ref (kernels/dispatch.h): each element of the 8 x 32
 * block is summed over k in increasing order, each product rounded to fp32 and then added — a multiply
 * and an add, never a fused multiply-add (the build is ISO C, so GCC does not contract them; the test
 * compares every level bit for bit). Only the vector width differs from the reference: 8 rows x 2 zmm =
 * 16 accumulators, per k two loads of B, eight broadcasts of A. Compiled with AVX-512 F/BW/VL flags (no
 * AVX512_BF16); reached only through the dispatch table. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/dispatch.h"
#include "kernels/gemm_panels.h"
#include "kernels/x86/avx512/mask.h"
#include "kernels/x86/avx512/peak.h"
#include "kernels/x86/avx512/transpose.h"

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

/* ---- the F-only helpers of the bf16 GEMM ------------------------------------------------------------ */

void trex_gemm_end_avx512(void)
{
    _mm_sfence(); /* order streamed stores of C before the caller hands the results on */
}

/* A block's transpose by 16 x 16 quarters in registers: 16 row loads, transpose16, masked row stores
 * (the scalar copy's strided loads took about 12% of a symmetric product's time; docs/kernels.md). */
void trex_gemm_tile_t_avx512(float *dst, int64_t ldd, const float *t, int64_t rows, int64_t cols)
{
    for (int64_t i0 = 0; i0 < rows; i0 += 16) {
        const __mmask16 m = tail_mask(rows - i0);
        for (int64_t j0 = 0; j0 < cols; j0 += 16) {
            __m512i r[16];
            for (int64_t i = 0; i < 16; i++)
                r[i] = i0 + i < rows ? _mm512_loadu_si512(t + (i0 + i) * TREX_GEMM_NR + j0) : _mm512_setzero_si512();
            transpose16(r);
            for (int64_t j = 0; j < 16 && j0 + j < cols; j++)
                _mm512_mask_storeu_epi32(dst + (j0 + j) * ldd + i0, m, r[j]);
        }
    }
}

/* ---- register-only peak loop (trex bench peak) ----------------------------------------------------- */

double trex_peak_f32_fma_avx512(int64_t iters)
{
    PEAK_INIT(1.0f);
    const __m512 m = _mm512_set1_ps(0.999999f), d = _mm512_set1_ps(1e-7f);
#define FMA(x) x = _mm512_fmadd_ps(x, m, d)
    PEAK_LOOP(FMA)
#undef FMA
    PEAK_SINK();
    return (double)iters * PEAK_CHAINS * 16 * 2;
}
