/* kernels/x86/avx2/transpose.h — the 8 x 8 transpose of 32-bit words in AVX2 registers, shared by the
 * level's packers (pack.c) and the attention tiles' 16 x 16 transposes (vec16.h). Only for files of
 * this folder (AVX2 flags). */
#ifndef TREX_KERNELS_X86_AVX2_TRANSPOSE_H
#define TREX_KERNELS_X86_AVX2_TRANSPOSE_H

#include <immintrin.h>

/* r[i] word j -> r[j] word i: pairs within 128-bit lanes, then 64-bit pairs, then the 128-bit halves */
static inline void transpose8(__m256i r[8])
{
    __m256i a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        a[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
        b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
        b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
        b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2x128_si256(b[j], b[4 + j], 0x20);
        r[4 + j] = _mm256_permute2x128_si256(b[j], b[4 + j], 0x31);
    }
}

#endif
