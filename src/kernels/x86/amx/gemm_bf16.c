/* kernels/x86/amx/gemm_bf16.c — the AMX GEMM micro-kernel (TDPBF16PS) and its peak loop.
 *
 * Eight tiles, all 16 rows x 64 bytes: tmm0-3 hold the 32x32 fp32 block of C as 2x2 16x16 tiles, tmm4-5
 * the two 16-row halves of a step of the A panel (16 x 32 bf16, 64-byte rows), tmm6-7 the two 16-column
 * halves of the VNNI B panel (16 k-pairs x 16 columns, stride 128 bytes). Each step of 32 in k does four
 * tile loads and four TDPBF16PS (each 16x16x32: 16384 FLOP); for a block whose caller uses 16 rows or
 * fewer (c->rows: an expert's last rows, a problem's bottom edge), three loads and two TDPBF16PS.
 * trex_gemm_begin_amx loads the tile configuration on the calling thread and trex_gemm_end_amx releases
 * the tiles; the framework brackets
 * every run of micro-kernel calls with them. Linux must have granted the process XTILEDATA (the
 * dispatch does that before choosing this level). Compiled with AMX flags; reached only through the
 * dispatch table.
 *
 * GCC 12's tile load/store intrinsics are asm statements that take only the address: the compiler does
 * not see them read or write memory. Buffers filled or read by C code around them in one function are
 * fenced with a compiler barrier (the micro-kernel only touches memory through tile instructions, and
 * its callers reach it through a function pointer, a barrier of its own). */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/gemm_panels.h"
#include "kernels/x86/prefetch_l2.h"
#ifdef TREX_AMX_EMU
#include "kernels/x86/amx/emu.h" /* test builds without the tile unit */
#endif

typedef struct tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

void trex_gemm_begin_amx(void)
{
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
#ifdef TREX_AMX_EMU
    TREX_TILE_CONFIG_LOAD(&cfg);
#else
    /* Not _tile_loadconfig: GCC 12 declares its operand as 8 bytes, so the stores of the other 56
     * bytes can be dropped as dead. The whole struct is the operand here. */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
#endif
}

void trex_gemm_end_amx(void)
{
    _tile_release();
    _mm_sfence(); /* order streamed stores of C before the caller hands the results on */
}

/* The k of a B panel that fits L1 (32 x 512 bf16 = 32 KiB of the 48 KiB L1d) beside the A tiles. */
#define L1_KP 512

/* The sums of a 32x32 block over kp k into tiles 0-3: per step of 32 k, A rows 0-15 and 16-31 (1 KiB
 * each) and B columns 0-15 and 16-31. The framework passes a block's A panels one after the other
 * against one B panel (of at most L1_KP k when K is sliced), so with a B panel that fits L1 (a_hint:
 * kp <= L1_KP), A is loaded with the non-temporal hint (TILELOADDT1) and streams past without evicting
 * B: 4096 x 1024 x 512 went from 27-28% to 35-39% of the peak on two threads. A longer B panel streams
 * from L2 either way, and there the hint measured up to 14% slower (docs/kernels.md "Round 13").
 * Alongside, the pf_lines lines at pf (the next B slice; pf NULL: none) are prefetched into L2, spread
 * over the steps (x86/prefetch_l2.h): B comes from L3 or memory. a_hint is a constant at each call, so
 * the compiler makes two loops. Without lower (the caller uses rows 0-15 only: c->rows), tiles 2-3 and
 * A's rows 16-31 are left out, half the products. */
static inline __attribute__((always_inline)) void products(int64_t kp, const uint16_t *ap, const uint16_t *bp,
                                                           bool a_hint, bool lower, const char *pf,
                                                           int64_t pf_lines)
{
    l2_prefetch pfs = l2_prefetch_plan(pf, pf_lines, kp / 32);
    const size_t sa = 64, sb = 2 * TREX_GEMM_NR * 2;
    for (int64_t k = 0; k < kp; k += 32, ap += 32 * TREX_GEMM_MR, bp += 32 * TREX_GEMM_NR) {
        l2_prefetch_step(&pfs);
        if (a_hint)
            _tile_stream_loadd(4, ap, sa);
        else
            _tile_loadd(4, ap, sa);
        _tile_loadd(6, bp, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, bp + 32, sb);
        _tile_dpbf16ps(1, 4, 7);
        if (!lower)
            continue;
        if (a_hint)
            _tile_stream_loadd(5, ap + 16 * 32, sa);
        else
            _tile_loadd(5, ap + 16 * 32, sa);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
}

void trex_gemm_ukr_amx(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c, unsigned flags)
{
    float *const out = c->out;
    const int64_t ldo = c->ldo;
    /* rows 16-31 of the block in use (c->rows 0: all); without them the lower tiles are skipped */
    const bool lower = c->rows <= 0 || c->rows > 16;
    if (flags & TREX_UKR_ACCUMULATE) {
        const float *in = c->in;
        const size_t si = (size_t)c->ldi * sizeof(float);
        _tile_loadd(0, in, si);
        _tile_loadd(1, in + 16, si);
        if (lower) {
            _tile_loadd(2, in + 16 * c->ldi, si);
            _tile_loadd(3, in + 16 * c->ldi + 16, si);
        }
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    if (kp <= L1_KP && lower)
        products(kp, ap, bp, true, true, c->prefetch, c->prefetch_lines);
    else if (kp <= L1_KP)
        products(kp, ap, bp, true, false, c->prefetch, c->prefetch_lines);
    else if (lower)
        products(kp, ap, bp, false, true, c->prefetch, c->prefetch_lines);
    else
        products(kp, ap, bp, false, false, c->prefetch, c->prefetch_lines);
    const int rows = lower ? 32 : 16;
    if ((flags & TREX_UKR_STREAM) && ((uintptr_t)out % 64) == 0 && ldo % 16 == 0) {
        /* An output not in cache (the framework's choice): through an L1 buffer, then non-temporal
         * stores (no read for ownership of C's lines, no eviction of the packed operands). */
        float t[32 * 32] __attribute__((aligned(64)));
        _tile_stored(0, t, 128);
        _tile_stored(1, t + 16, 128);
        if (lower) {
            _tile_stored(2, t + 16 * 32, 128);
            _tile_stored(3, t + 16 * 32 + 16, 128);
        }
        __asm__ volatile("" : : : "memory");
        for (int i = 0; i < rows; i++) {
            _mm512_stream_ps(out + i * ldo, _mm512_load_ps(t + i * 32));
            _mm512_stream_ps(out + i * ldo + 16, _mm512_load_ps(t + i * 32 + 16));
        }
        return;
    }
    const size_t so = (size_t)ldo * sizeof(float);
    _tile_stored(0, out, so);
    _tile_stored(1, out + 16, so);
    if (lower) {
        _tile_stored(2, out + 16 * ldo, so);
        _tile_stored(3, out + 16 * ldo + 16, so);
    }
}

/* Register-only: four independent accumulators, operands loaded once. */
double trex_peak_bf16_amx(int64_t iters)
{
    uint16_t ones[16 * 32];
    for (int i = 0; i < 16 * 32; i++)
        ones[i] = 0x3a80 + (uint16_t)(i % 7); /* about 1e-3: sums stay finite */
    __asm__ volatile("" : : : "memory");
    trex_gemm_begin_amx();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    for (int64_t it = 0; it < iters; it++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float out[16 * 16];
    _tile_stored(0, out, 64);
    __asm__ volatile("" : : : "memory");
    trex_gemm_end_amx();
    volatile float sink = out[0];
    (void)sink;
    return (double)iters * 4 * 16 * 16 * 32 * 2;
}
