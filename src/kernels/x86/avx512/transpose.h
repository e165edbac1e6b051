/* kernels/x86/avx512/transpose.h — the 16 x 16 transpose of 32-bit words in registers, shared by the
 * AVX-512 and AMX leaves (packing, the attention tiles, a symmetric product's mirror tiles). Only for
 * files compiled with AVX-512 flags. */
#ifndef TREX_KERNELS_AVX512_TRANSPOSE_H
#define TREX_KERNELS_AVX512_TRANSPOSE_H

#include <immintrin.h>

/* r[i] word j -> r[j] word i: pairs within 128-bit lanes, then 64-bit pairs, then the 4 x 4 grid of
 * 128-bit lanes in two shuffles. */
static inline void transpose16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* u[4k + j], lane L: word 4L + j of rows 4k .. 4k+3 */
    for (int k = 0; k < 16; k += 4) {
        u[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    /* word 4L + j of every row: lane k from u[4k + j], lane L */
    for (int j = 0; j < 4; j++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
        const __m512i v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
        r[j] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
        r[4 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
    }
}

#endif
