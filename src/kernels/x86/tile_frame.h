/* kernels/x86/tile_frame.h — the tile state and operations of kernels/x86/attn_tiles.h for the
 * back-ends that keep tiles in memory (kernels/x86/avx512/attn.c with VDPBF16PS, kernels/x86/avx512f/
 * attn.c and kernels/x86/avx2/attn.c with fp32 FMAs). A product function's tile state (TILES_DECL)
 * lives in its stack frame: four C tiles of 16 x 16 floats and, for the A and B tiles, only where their
 * rows are (an A or B tile is read by the product right after its load, from the same memory, so
 * nothing is copied). The includer
 * defines the state's type, tile_set (with at least float c[4][16][16] and tile_rows ab[4]; a back-end
 * may keep more per tile), and its operations on slot t = tile - 4 of the A and B tiles:
 *   tile_load(s, t, p, ld)   A or B tile t's rows are at p, ld bytes apart
 *   tile_dp(s, c, a, b)      C tile c += A tile a (16 rows x 16 bf16 pairs) times B tile b (16 pair rows
 *                            x 16 columns)
 * and ATTN_LEAF, then includes attn_tiles.h. The includer's level's vec16.h comes first (tile_store's
 * rows are its 16-float vectors). A back-end whose products widen bf16 to fp32 (avx512f, avx2) defines
 * TILE_FRAME_WIDE and its widen32 (its folder's pairs.h) first, and takes tile_set and tile_load from
 * here, with each A tile's rows as floats (tile_wide). */
#ifndef TREX_KERNELS_X86_TILE_FRAME_H
#define TREX_KERNELS_X86_TILE_FRAME_H

#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct tile_rows {
    const char *p; /* row 0 */
    size_t ld;     /* bytes between rows */
} tile_rows;

#ifdef TILE_FRAME_WIDE
/* The tile frame's state, and each A tile's rows widened to floats by its first product after its load
 * (a product function runs two to four products on one A tile in a row): aw[t], valid while wide[t]. */
typedef struct tile_set {
    float c[4][16][16]; /* C tiles 0..3 */
    tile_rows ab[4];    /* A and B tiles 4..7, at ab[t - 4] */
    alignas(64) float aw[4][16][32];
    bool wide[4];
} tile_set;

static inline void tile_load(tile_set *s, int t, const void *p, size_t ld)
{
    s->ab[t] = (tile_rows){(const char *)p, ld};
    s->wide[t] = false;
}

/* A tile t's 16 rows of 32 values as floats, widened unless they already are */
static inline float (*tile_wide(tile_set *s, int t))[32]
{
    if (!s->wide[t]) {
        const tile_rows *a = &s->ab[t];
        for (int m = 0; m < 16; m++)
            widen32(s->aw[t][m], (const uint16_t *)(const void *)(a->p + m * a->ld));
        s->wide[t] = true;
    }
    return s->aw[t];
}
#endif

static inline void tile_store(const float c[16][16], void *p, size_t ld)
{
    _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
        v16_store((float *)(void *)((char *)p + m * ld), v16_load(c[m]));
}

#define TILES_DECL tile_set tiles_
#define TILE_ZERO(tc) memset(tiles_.c[tc], 0, sizeof tiles_.c[tc])
#define TILE_LOAD(tab, p, ld) tile_load(&tiles_, (tab) - 4, (p), (size_t)(ld))
#define TILE_DP(tc, ta, tb) tile_dp(&tiles_, (tc), (ta) - 4, (tb) - 4)
#define TILE_STORE(tc, p, ld) tile_store(tiles_.c[tc], (p), (size_t)(ld))
#define TILES_BEGIN() ((void)0)
#define TILES_END() ((void)0)

#endif
