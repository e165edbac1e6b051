/* kernels/x86/avx512/mask.h — the lane mask of a vector's tail, and the address of a prefetch hint,
 * shared by the AVX-512 leaves. Only for files of this folder (AVX-512 flags). */
#ifndef TREX_KERNELS_AVX512_MASK_H
#define TREX_KERNELS_AVX512_MASK_H

#include <immintrin.h>
#include <stdint.h>

/* The first `left` of 16 lanes: all for left >= 16, none for left <= 0. */
static inline __mmask16 tail_mask(int64_t left)
{
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

/* The same for 8 lanes (a register of 8 doubles, or a masked 8-float load). */
static inline __mmask8 tail_mask8(int64_t left)
{
    return left >= 8 ? (__mmask8)0xff : left <= 0 ? (__mmask8)0 : (__mmask8)((1u << left) - 1u);
}

/* The address `floats` floats past p, for a prefetch hint only (it may lie past p's buffer: computed as
 * an integer, and a prefetch never faults). */
static inline const char *hint_addr(const float *p, int64_t floats)
{
    return (const char *)((uintptr_t)p + (uintptr_t)floats * sizeof(float));
}

#endif
