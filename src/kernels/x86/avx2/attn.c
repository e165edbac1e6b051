/* kernels/x86/avx2/attn.c — the bf16 attention entries on AVX2: kernels/x86/attn_tiles.h with its
 * 16-lane vectors as pairs of AVX2 registers (vec16.h) and its 16 x 16 tile products done by fp32 FMAs
 * on the tiles' bf16 values, as at the avx512f level (kernels/x86/avx512f/attn.c), on 8-lane registers.
 *
 * The tile state is kernels/x86/tile_frame.h's (C tiles in the frame, A and B tiles where their rows
 * are) plus, per A tile, its 16 rows of 32 bf16 widened into 2 KiB of floats by its first product after
 * its load, which the next products on the same A tile reuse. AVX2 has 16 registers, too few for a
 * C tile's 32 halves of rows, so tile_dp walks the tile in pieces of 6, 6 and 4 rows: twelve (eight)
 * sums in registers, and for each of the 16 k-pairs two 32-byte loads of B's pair row (its even values
 * by a shift), the even products of every row with A's values broadcast from the widened rows, then the
 * same loads again (the odd values by a mask: pairs.h) and the odd products. Each element is summed in
 * k order, even then odd, one rounding per product added: the avx512f level's order, and with vec16.h's
 * bits the same results as that level (tests/test_attn_bf16.c checks both against the reference within
 * its bounds, and the two levels' bits against each other). Like the avx512f level it takes bf16
 * subnormals as they are. Compiled with AVX2 and FMA flags; reached only through the fused table. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/x86/avx2/vec16.h"
#include "kernels/x86/avx2/pairs.h"
#define TILE_FRAME_WIDE
#include "kernels/x86/tile_frame.h"

/* Rows r0 .. r0 + R - 1 (R <= 6, a constant where inlined) of C tile c, all 16 columns, += the widened
 * A rows aw times B tile b: per k-pair the even k's products of the rows, then the odd k's, B's pair
 * row loaded again for those. */
static inline void tile_rows_dp(float (*c)[16], float (*aw)[32], const tile_rows *b, int r0, int R)
{
    __m256 acc[6][2];
    _Pragma("GCC unroll 6") for (int m = 0; m < R; m++) {
        acc[m][0] = _mm256_loadu_ps(c[r0 + m]);
        acc[m][1] = _mm256_loadu_ps(c[r0 + m] + 8);
    }
    for (int k = 0; k < 16; k++) {
        const __m256i *bk = (const __m256i *)(const void *)(b->p + k * b->ld);
        __m256 x0 = pair_even(_mm256_loadu_si256(bk)), x1 = pair_even(_mm256_loadu_si256(bk + 1));
        _Pragma("GCC unroll 6") for (int m = 0; m < R; m++) {
            const __m256 a = _mm256_broadcast_ss(&aw[r0 + m][2 * k]);
            acc[m][0] = _mm256_fmadd_ps(a, x0, acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(a, x1, acc[m][1]);
        }
        x0 = pair_odd(_mm256_loadu_si256(bk)), x1 = pair_odd(_mm256_loadu_si256(bk + 1));
        _Pragma("GCC unroll 6") for (int m = 0; m < R; m++) {
            const __m256 a = _mm256_broadcast_ss(&aw[r0 + m][2 * k + 1]);
            acc[m][0] = _mm256_fmadd_ps(a, x0, acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(a, x1, acc[m][1]);
        }
    }
    _Pragma("GCC unroll 6") for (int m = 0; m < R; m++) {
        _mm256_storeu_ps(c[r0 + m], acc[m][0]);
        _mm256_storeu_ps(c[r0 + m] + 8, acc[m][1]);
    }
}

/* C tile tc += A tile ta (16 rows x 16 bf16 pairs, widened first unless it is) times B tile tb (16 pair
 * rows x 16 columns), in pieces of 6, 6 and 4 rows (twelve, twelve and eight chains of FMAs: the
 * micro-kernel's reason, kernels/x86/avx2/gemm_bf16.c) */
static inline void tile_dp(tile_set *s, int tc, int ta, int tb)
{
    float(*c)[16] = s->c[tc], (*aw)[32] = tile_wide(s, ta);
    const tile_rows *b = &s->ab[tb];
    tile_rows_dp(c, aw, b, 0, 6);
    tile_rows_dp(c, aw, b, 6, 6);
    tile_rows_dp(c, aw, b, 12, 4);
}

#define ATTN_LEAF(name) trex_fused_##name##_avx2

#include "kernels/x86/attn_tiles.h"
