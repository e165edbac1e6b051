/* kernels/x86/avx2/attn.c — the bf16 attention entries on AVX2: kernels/x86/attn_tiles.h with its
 * 16-lane vectors as pairs of AVX2 registers (vec16.h) and its 16 x 16 tile products done by fp32 FMAs
 * on the tiles' bf16 values, as at the avx512f level (kernels/x86/avx512f/attn.c), on 8-lane registers.
 *
 * The tile state is kernels/x86/tile_frame.h's (C tiles in the frame, A and B tiles where their rows
 * are) plus, per A tile, its 16 rows of 32 bf16 widened into 2 KiB of floats by its first product after
 * its load, which the next products on the same A tile reuse. AVX2 has 16 registers, too few for a
 * C tile's 32 halves of rows, so TILE_DP walks the tile in four 8 x 8 quarters: eight sums in registers,
 * and for each of the 16 k-pairs one 32-byte load of B's pair row (its even values by a shift, its odd
 * ones by a mask: pairs.h), then per row two FMAs with A's values broadcast from the widened rows. Each
 * element is summed in k order, even then odd, one rounding per product added: the avx512f level's
 * order, and with vec16.h's bits the same results as that level (tests/test_attn_bf16.c checks both
 * against the reference within its bounds). Like the avx512f level it takes bf16 subnormals as they
 * are. Compiled with AVX2 and FMA flags; reached only through the fused table. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/x86/avx2/vec16.h"
#include "kernels/x86/avx2/pairs.h"
#define TILE_FRAME_WIDE
#include "kernels/x86/tile_frame.h"

/* C tile tc += A tile ta (16 rows x 16 bf16 pairs, widened first unless it is) times B tile tb (16 pair
 * rows x 16 columns) */
static inline void tile_dp(tile_set *s, int tc, int ta, int tb)
{
    float(*c)[16] = s->c[tc], (*aw)[32] = tile_wide(s, ta);
    const tile_rows *b = &s->ab[tb];
    for (int r0 = 0; r0 < 16; r0 += 8)
        for (int c0 = 0; c0 < 16; c0 += 8) {
            __m256 acc[8];
            _Pragma("GCC unroll 8") for (int m = 0; m < 8; m++)
                acc[m] = _mm256_loadu_ps(c[r0 + m] + c0);
            for (int k = 0; k < 16; k++) {
                const __m256i bk = _mm256_loadu_si256((const __m256i *)(const void *)(b->p + k * b->ld + 4 * c0));
                const __m256 e = pair_even(bk), o = pair_odd(bk);
                _Pragma("GCC unroll 8") for (int m = 0; m < 8; m++)
                    acc[m] = _mm256_fmadd_ps(_mm256_broadcast_ss(&aw[r0 + m][2 * k + 1]), o,
                                             _mm256_fmadd_ps(_mm256_broadcast_ss(&aw[r0 + m][2 * k]), e, acc[m]));
            }
            _Pragma("GCC unroll 8") for (int m = 0; m < 8; m++)
                _mm256_storeu_ps(c[r0 + m] + c0, acc[m]);
        }
}

#define ATTN_LEAF(name) trex_fused_##name##_avx2

#include "kernels/x86/attn_tiles.h"
