/* kernels/x86/avx512f/pairs.h — bf16 as fp32 on AVX-512 F/BW, for the avx512f level's products (the
 * GEMM micro-kernel, the attention's tile product). A bf16 value is the upper half of an fp32 one: a
 * dword holding the pair (k, k+1) gives k's value with one shift and k+1's with one mask, and 16
 * consecutive bf16 values widen to 16 floats with one zero extension and one shift. Only for files of
 * this folder. */
#ifndef TREX_KERNELS_X86_AVX512F_PAIRS_H
#define TREX_KERNELS_X86_AVX512F_PAIRS_H

#include <immintrin.h>
#include <stdint.h>

/* The even (first) and the odd (second) bf16 of each dword of v, as fp32. */
static inline __m512 pair_even16(__m512i v)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

static inline __m512 pair_odd16(__m512i v)
{
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

/* dst[0 .. 32) (64-byte aligned) = the 32 bf16 values at src (any alignment) as floats. */
static inline void widen32(float *dst, const uint16_t *src)
{
    const __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)src);
    const __m256i hi = _mm256_loadu_si256((const __m256i *)(const void *)(src + 16));
    _mm512_store_ps(dst, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(lo), 16)));
    _mm512_store_ps(dst + 16, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16)));
}

#endif
