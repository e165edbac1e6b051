/* kernels/x86/amx/attn.c — the bf16 attention entries on AMX tiles: kernels/x86/attn_tiles.h with
 * its tile operations as the tile unit's own instructions (TDPBF16PS on the GEMM micro-kernel's tile
 * configuration, trex_gemm_begin_amx: 8 tiles of 16 rows x 64 bytes). Compiled with AMX flags. */
#include <immintrin.h>
#ifdef TREX_AMX_EMU
#include "kernels/x86/amx/emu.h" /* test builds without the tile unit */
#endif

#include "kernels/fused.h"
#include "kernels/gemm_panels.h"
#include "kernels/x86/avx512/vec16.h"

#define TILES_DECL ((void)0)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, p, ld) _tile_loadd(t, p, ld)
#define TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define TILE_STORE(t, p, ld) _tile_stored(t, p, ld)
#define TILES_BEGIN() trex_gemm_begin_amx()
#define TILES_END() trex_gemm_end_amx()
#define ATTN_LEAF(name) trex_fused_##name##_amx

#include "kernels/x86/attn_tiles.h"
