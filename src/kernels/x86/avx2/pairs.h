/* kernels/x86/avx2/pairs.h — bf16 pairs as fp32 on AVX2, shared by the level's bf16 products (the GEMM
 * micro-kernel, the attention's tile products). AVX2 has no bf16 arithmetic; a bf16 value is the
 * upper half of an fp32 one, so a dword holding the pair (k, k+1) gives k's value with one shift (the
 * low half moved up) and k+1's with one mask (the upper half kept). Only for files of this folder (AVX2
 * flags). */
#ifndef TREX_KERNELS_X86_AVX2_PAIRS_H
#define TREX_KERNELS_X86_AVX2_PAIRS_H

#include <immintrin.h>
#include <stdint.h>

/* The even (first) and the odd (second) bf16 of each dword of v, as fp32. */
static inline __m256 pair_even(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static inline __m256 pair_odd(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* dst[0 .. 32) (32-byte aligned) = the 32 bf16 values at src (any alignment) as floats. */
static inline void widen32(float *dst, const uint16_t *src)
{
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + 8 * j));
        _mm256_store_ps(dst + 8 * j, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
}

#endif
