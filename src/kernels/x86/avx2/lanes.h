/* kernels/x86/avx2/lanes.h — the fixed-lane sums of the reference kernels on AVX2 registers: the 16
 * float partial sums of am_dot (model/attention_math.h) as two registers (lanes 0-7, 8-15) and their
 * combining tree. Only for files of this folder (AVX2 flags). */
#ifndef TREX_KERNELS_X86_AVX2_LANES_H
#define TREX_KERNELS_X86_AVX2_LANES_H

#include <immintrin.h>

/* ((b0 + b1) + (b2 + b3)) with b_k = (s_k + s_{k+8}) + (s_{k+4} + s_{k+12}): am_dot's tree of the
 * partial sums s_0..7 (lo) and s_8..15 (hi). */
static inline float am_tree16(__m256 lo, __m256 hi)
{
    const __m256 t = _mm256_add_ps(lo, hi);
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    float x[4];
    _mm_storeu_ps(x, b);
    return (x[0] + x[1]) + (x[2] + x[3]);
}

#endif
