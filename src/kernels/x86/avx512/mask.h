/* kernels/x86/avx512/mask.h — the lane mask of a vector's tail, shared by the AVX-512 leaves (and, for
 * them, hint_addr of kernels/x86/prefetch_l2.h). Only for files of this folder (AVX-512 flags). */
#ifndef TREX_KERNELS_AVX512_MASK_H
#define TREX_KERNELS_AVX512_MASK_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/x86/prefetch_l2.h"

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

#endif
