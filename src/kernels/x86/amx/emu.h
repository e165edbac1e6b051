/* kernels/x86/amx/emu.h — the AMX tile instructions as C functions, for test builds on machines
 * without AMX (`make AMX_EMU=1`, which defines TREX_AMX_EMU and compiles this folder without the AMX
 * flags; tests/run.sh runs the kernel and model tests in such a tree). Included by the folder's files
 * after <immintrin.h>: the intrinsics they use (_tile_loadd, _tile_stream_loadd, _tile_stored,
 * _tile_zero, _tile_dpbf16ps, _tile_release) become calls of kernels/x86/amx/emu.c, and
 * TREX_TILE_CONFIG_LOAD(cfg) stands for LDTILECFG.
 *
 * The emulation is the instructions' architectural behaviour, not their speed: each thread has its own
 * eight tiles and configuration (as each hardware thread has its own tile registers); a load copies
 * the configured rows and bytes at that moment and zeroes the rest of the tile; TDPBF16PS sums as the
 * Intel SDM's pseudo-code does (even and odd products of each pair in two fp32 sums over k, added to C
 * at the end; bf16 subnormal inputs read as zero, subnormal results flushed; the Intrinsics Guide's
 * shorter pseudo-code sums straight into C, which rounds differently). What the hardware would
 * fault on (#UD) aborts with a message instead: a tile instruction without a configuration, a tile
 * number past the palette, TDPBF16PS on shapes that do not match or on repeated tiles, a configuration
 * the palette does not allow. So the AMX leaves' tile layouts, strides and configuration are tested on
 * any x86-64 machine; their speed needs the real unit. */
#ifndef TREX_KERNELS_X86_AMX_EMU_H
#define TREX_KERNELS_X86_AMX_EMU_H

#include <stddef.h>

void trex_amx_emu_loadconfig(const void *cfg);  /* LDTILECFG: the 64-byte palette-1 configuration */
void trex_amx_emu_release(void);                 /* TILERELEASE */
void trex_amx_emu_zero(int t);                   /* TILEZERO */
void trex_amx_emu_load(int t, const void *base, size_t stride);  /* TILELOADD, TILELOADDT1 */
void trex_amx_emu_store(int t, void *base, size_t stride);       /* TILESTORED */
void trex_amx_emu_dpbf16ps(int c, int a, int b);                 /* TDPBF16PS */

#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#undef _tile_release
#define _tile_loadd(t, base, stride) trex_amx_emu_load((t), (base), (size_t)(stride))
#define _tile_stream_loadd(t, base, stride) trex_amx_emu_load((t), (base), (size_t)(stride))
#define _tile_stored(t, base, stride) trex_amx_emu_store((t), (base), (size_t)(stride))
#define _tile_zero(t) trex_amx_emu_zero(t)
#define _tile_dpbf16ps(c, a, b) trex_amx_emu_dpbf16ps((c), (a), (b))
#define _tile_release() trex_amx_emu_release()
#define TREX_TILE_CONFIG_LOAD(cfg) trex_amx_emu_loadconfig(cfg)

#endif
