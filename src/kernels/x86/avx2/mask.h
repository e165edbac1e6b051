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

/* v's lanes i < k to p (k >= 8: all of them, by a plain store; k <= 0: none). A VMASKMOV store costs
 * about six plain ones on Zen 4 (3.3 against 0.55 ns per 8 floats, measured in L1), a masked load no
 * more than a plain one: whole steps store plainly, and only a partial last step under its mask. */
static inline void store_first8(float *p, __m256 v, int64_t k)
{
    if (k >= 8)
        _mm256_storeu_ps(p, v);
    else if (k > 0)
        _mm256_maskstore_ps(p, lanes8(k), v);
}

#endif
