/* kernels/x86/avx512f/attn.c — the bf16 attention entries on AVX-512 without AVX512_BF16:
 * kernels/x86/attn_tiles.h with its 16 x 16 tile products done by fp32 FMAs on the tiles' bf16 values.
 *
 * The tile state is kernels/x86/tile_frame.h's with TILE_FRAME_WIDE (C tiles in the frame, A and B
 * tiles where their rows are, and per A tile its 16 rows of 32 bf16 widened into 2 KiB of floats by
 * pairs.h's widen32 at its first product after its load), which the next products on it reuse (the
 * tile body runs two to four per A tile; docs/kernels.md). Like the avx512 back-end, this relies on the body not
 * writing a tile's rows between its load and its products. TILE_DP holds C in 16 registers and walks the
 * 16 k-pairs: a 64-byte load of B's pair row gives its even and odd values (a shift, a mask), then per
 * row of C two FMAs whose A values are broadcast from the widened rows. Each element is summed in
 * k order, even then odd, one rounding per product added; the products of bf16 values are exact in
 * fp32, so this differs from the other back-ends only in the order of fp32 sums (within the bounds of
 * tests/test_attn_bf16.c), and in taking bf16 subnormals as they are where the bf16 instructions read
 * them as zero. Compiled with AVX-512 F/BW/VL flags. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/x86/avx512/vec16.h"
#include "kernels/x86/avx512f/pairs.h"
#define TILE_FRAME_WIDE
#include "kernels/x86/tile_frame.h"

/* C tile tc += A tile ta (16 rows x 16 bf16 pairs, widened first unless it is) times B tile tb (16 pair
 * rows x 16 columns) */
static inline void tile_dp(tile_set *s, int tc, int ta, int tb)
{
    float(*c)[16] = s->c[tc], (*aw)[32] = tile_wide(s, ta);
    const tile_rows *b = &s->ab[tb];
    __m512 acc[16];
    _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
        acc[m] = _mm512_loadu_ps(c[m]);
    for (int k = 0; k < 16; k++) {
        const __m512i bk = _mm512_loadu_si512((const void *)(b->p + k * b->ld));
        const __m512 e = pair_even16(bk), o = pair_odd16(bk);
        _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
            acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(aw[m][2 * k + 1]), o,
                                     _mm512_fmadd_ps(_mm512_set1_ps(aw[m][2 * k]), e, acc[m]));
    }
    _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
        _mm512_storeu_ps(c[m], acc[m]);
}

#define ATTN_LEAF(name) trex_fused_##name##_avx512f

#include "kernels/x86/attn_tiles.h"
