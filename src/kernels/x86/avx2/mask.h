/* kernels/x86/avx2/mask.h — lane masks for AVX2's masked loads and stores (VMASKMOV, VPMASKMOV: a lane
 * left out is neither read nor written, so a partial last step may end at the end of a buffer). Only
 * for files of this folder (AVX2 flags). */
#ifndef TREX_KERNELS_X86_AVX2_MASK_H
#define TREX_KERNELS_X86_AVX2_MASK_H

#include <immintrin.h>
#include <stdint.h>

/* all-ones in lanes i < k of 8 (k may be negative or past 8) */
static inline __m256i lanes8(int64_t k)
{
    const int32_t n = k < 0 ? 0 : k > 8 ? 8 : (int32_t)k;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#endif
