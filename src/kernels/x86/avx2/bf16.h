/* kernels/x86/avx2/bf16.h — fp32 -> bf16 rounding of whole AVX2 registers, bit for bit trex_f32_to_bf16
 * (round to nearest even, subnormals kept, NaN quieted), in integers: AVX2 has no conversion
 * instruction. Shared by the avx2 packers (pack.c), the cross-entropy's gradient (ce.c), SwiGLU
 * (swiglu.c) and the conversions of fused.c. Only for files of this folder (AVX2 flags). */
#ifndef TREX_KERNELS_X86_AVX2_BF16_H
#define TREX_KERNELS_X86_AVX2_BF16_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* trex_f32_to_bf16 of each lane, in the dword's upper half (the lower half is garbage). */
static inline __m256i round_hi(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000)); /* both non-negative */
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
}

/* 8 floats to 8 bf16, in order. */
static inline __m128i round8v(__m256 x)
{
    const __m256i r = _mm256_srli_epi32(round_hi(x), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* The first n of 8 bf16 (n >= 8: all) to p: AVX2 has no masked store of 16-bit elements. */
static inline void store_bf16x8(uint16_t *p, __m128i v, int64_t n)
{
    if (n >= 8) {
        _mm_storeu_si128((__m128i *)(void *)p, v);
        return;
    }
    uint16_t t[8];
    _mm_storeu_si128((__m128i *)(void *)t, v);
    memcpy(p, t, (size_t)n * sizeof *p);
}

#endif
