/* kernels/x86/avx512/ce.c — AVX-512 leaves of the LM head's cross-entropy entries (kernels/fused.h
 * "Cross-entropy") and of the bf16x3 split of its operands (split3), reached only through the
 * fused-kernel table.
 *
 * They give the bits of the reference (kernels/ref/ce.c): 16 columns per register, the same float
 * operations in the same order (separate multiplies and adds: the build is ISO C and the intrinsics
 * are explicit, so nothing is contracted), the max as MAXPS (which is exactly `l > m ? l : m`, NaN
 * and signed zeros included), 2^n applied by VSCALEFPS (one rounding, subnormal results included, as
 * the reference's two-step product), the per-column sums in double lanes over the rows in order, and
 * the bf16 rounding of trex_f32_to_bf16 (avx512/bf16.h; split3 takes its integer form, whose fp32
 * upper halves give x - hi).
 *
 * Prefetches (hints only: they change no value, never fault, and their addresses, which may lie past
 * the block or the buffer, are computed as integers): ce_fwd's exp pass, which reads its block from L2
 * and is bound by the exp's arithmetic, asks for the n rows after the block (the head's next vocabulary
 * block of the same chunk, which this thread takes next) into L2, so that the next call's max pass, the
 * one that reads from memory, finds them there; ce_grad asks for the row two rows ahead into L1. On a
 * [129 280, 1 024] chunk in blocks of 256 rows on 2 threads: ce_fwd 112 -> 92, ce_grad 37 -> 29 CPU ms
 * (docs/perf.md "LM head in bf16 mode", round 8). */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/x86/avx512/bf16.h"
#include "kernels/x86/avx512/exp_poly.h"
#include "kernels/x86/avx512/mask.h"

float AVX512_LEAF(trex_fused_ce_exp)(float x)
{
    return _mm_cvtss_f32(_mm512_castps512_ps128(trex_exp_nonpos16(_mm512_set1_ps(x))));
}

void AVX512_LEAF(trex_fused_ce_fwd)(float *L, int64_t ld, int64_t n, int64_t cols, int keep, float *mx,
                              double *sum)
{
    /* column maxima: row 0, then l > m ? l : m down the rows */
    for (int64_t i = 0; i < cols; i += 16) {
        const __mmask16 m = tail_mask(cols - i);
        _mm512_mask_storeu_ps(mx + i, m, _mm512_maskz_loadu_ps(m, L + i));
    }
    for (int64_t v = 1; v < n; v++) {
        const float *l = L + v * ld;
        int64_t i = 0;
        for (; i + 64 <= cols; i += 64) {
            _mm512_storeu_ps(mx + i, _mm512_max_ps(_mm512_loadu_ps(l + i), _mm512_loadu_ps(mx + i)));
            _mm512_storeu_ps(mx + i + 16,
                             _mm512_max_ps(_mm512_loadu_ps(l + i + 16), _mm512_loadu_ps(mx + i + 16)));
            _mm512_storeu_ps(mx + i + 32,
                             _mm512_max_ps(_mm512_loadu_ps(l + i + 32), _mm512_loadu_ps(mx + i + 32)));
            _mm512_storeu_ps(mx + i + 48,
                             _mm512_max_ps(_mm512_loadu_ps(l + i + 48), _mm512_loadu_ps(mx + i + 48)));
        }
        for (; i < cols; i += 16) {
            const __mmask16 m = tail_mask(cols - i);
            _mm512_mask_storeu_ps(mx + i, m,
                                  _mm512_max_ps(_mm512_maskz_loadu_ps(m, l + i), _mm512_maskz_loadu_ps(m, mx + i)));
        }
    }
    /* exp(l - max), summed per column in double, rows in order (the block is in cache from above);
     * meanwhile the next block's rows are fetched into L2, one line per 16 columns */
    for (int64_t i = 0; i < cols; i++)
        sum[i] = 0.0;
    for (int64_t v = 0; v < n; v++) {
        float *l = L + v * ld;
        const char *next = hint_addr(l, n * ld);
        for (int64_t i = 0; i < cols; i += 16) {
            _mm_prefetch(next + 4 * i, _MM_HINT_T1);
            const __mmask16 m = tail_mask(cols - i);
            const __mmask8 mlo = (__mmask8)m, mhi = (__mmask8)(m >> 8);
            const __m512 e = trex_exp_nonpos16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, l + i), _mm512_maskz_loadu_ps(m, mx + i)));
            if (keep)
                _mm512_mask_storeu_ps(l + i, m, e);
            const __m512d elo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
            const __m512d ehi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
            _mm512_mask_storeu_pd(sum + i, mlo, _mm512_add_pd(_mm512_maskz_loadu_pd(mlo, sum + i), elo));
            if (mhi)
                _mm512_mask_storeu_pd(sum + i + 8, mhi, _mm512_add_pd(_mm512_maskz_loadu_pd(mhi, sum + i + 8), ehi));
        }
    }
}

void AVX512_LEAF(trex_fused_ce_grad)(uint16_t *dst, int64_t ldd, const float *E, int64_t lde, int64_t n,
                               int64_t cols, const float *c)
{
    for (int64_t v = 0; v < n; v++) {
        const float *e = E + v * lde;
        const char *ahead = hint_addr(e, 2 * lde);
        uint16_t *o = dst + v * ldd;
        for (int64_t i = 0; i < cols; i += 16) { /* loads e[i..] before o[i..] may overwrite it */
            _mm_prefetch(ahead + 4 * i, _MM_HINT_T0);
            const __mmask16 m = tail_mask(cols - i);
            const __m512 cv = _mm512_maskz_loadu_ps(m, c + i);
            const __mmask16 nz = _mm512_mask_cmp_ps_mask(m, cv, _mm512_setzero_ps(), _CMP_NEQ_UQ);
            const __m512 x = _mm512_maskz_mul_ps(nz, _mm512_maskz_loadu_ps(m, e + i), cv);
            _mm256_mask_storeu_epi16(o + i, m, bf16_round16(x));
        }
    }
}

static inline __mmask32 tail_mask32(int64_t left)
{
    return left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1u);
}

/* One pass per row: 32 floats in two registers give hi (rounded in the upper halves), x - hi in fp32
 * (the lower halves cleared: exactly bf16 hi widened), lo the same way, and one permute per plane
 * packs the upper halves into 32 bf16 for a 64-byte store. With nt and every plane's row 64-byte
 * aligned and a whole number of 32 values, the stores are non-temporal (no read for ownership). */
void AVX512_LEAF(trex_fused_split3)(uint16_t *dst, const float *src, int64_t rows, int64_t n, int64_t hi0,
                              int64_t lo0, int64_t hi1, int nt)
{
    const __m512i up = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31,
                                        29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    int fence = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * n;
        uint16_t *ph = dst + r * 3 * n + hi0, *ph1 = dst + r * 3 * n + hi1, *pl = dst + r * 3 * n + lo0;
        const int stream = nt && n % 32 == 0 && ((uintptr_t)ph | (uintptr_t)ph1 | (uintptr_t)pl) % 64 == 0;
        fence |= stream;
        for (int64_t i = 0; i < n; i += 32) {
            const __mmask16 m0 = tail_mask(n - i), m1 = n - i > 16 ? tail_mask(n - i - 16) : 0;
            const __m512 x0 = _mm512_maskz_loadu_ps(m0, x + i), x1 = _mm512_maskz_loadu_ps(m1, x + i + 16);
            const __m512i h0 = bf16_round_int(x0), h1 = bf16_round_int(x1);
            const __m512i l0 = bf16_round_int(_mm512_sub_ps(x0, _mm512_castsi512_ps(_mm512_and_si512(h0, top))));
            const __m512i l1 = bf16_round_int(_mm512_sub_ps(x1, _mm512_castsi512_ps(_mm512_and_si512(h1, top))));
            const __m512i H = _mm512_permutex2var_epi16(h0, up, h1), L = _mm512_permutex2var_epi16(l0, up, l1);
            if (stream) {
                _mm512_stream_si512((void *)(ph + i), H);
                _mm512_stream_si512((void *)(ph1 + i), H);
                _mm512_stream_si512((void *)(pl + i), L);
            } else {
                const __mmask32 m = tail_mask32(n - i);
                _mm512_mask_storeu_epi16(ph + i, m, H);
                _mm512_mask_storeu_epi16(ph1 + i, m, H);
                _mm512_mask_storeu_epi16(pl + i, m, L);
            }
        }
    }
    if (fence)
        _mm_sfence();
}
