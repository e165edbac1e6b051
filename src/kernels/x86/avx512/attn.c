/* kernels/x86/avx512/attn.c — the bf16 attention entries on AVX-512: kernels/x86/attn_tiles.h with its
 * 16 x 16 tile products done by VDPBF16PS, for machines with AVX512_BF16 and no AMX.
 *
 * The tile state and operations are kernels/x86/tile_frame.h's (C tiles in the stack frame, A and
 * B tiles where their rows are). TILE_DP holds the C tile in 16 registers, one
 * row each, and walks the 16 k-pairs: a 64-byte load of B's pair row, then per row of C one VDPBF16PS
 * with that row's pair of A broadcast by the instruction itself (dp_bcast). Each element is then
 * summed in k-pair order, two products per step (the instruction's order), where the tile unit sums in
 * its own; both are fp32 sums of exact products, within the bounds of tests/test_attn_bf16.c. Like
 * TDPBF16PS, VDPBF16PS reads bf16 subnormals as zero and flushes subnormal results. Compiled with
 * AVX-512 flags. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/x86/avx512/vec16.h"
#include "kernels/x86/tile_frame.h"

/* acc + VDPBF16PS(b, the pair at p broadcast): the broadcast is the instruction's memory operand
 * ({1to16}), which GCC 12 does not fold for this intrinsic, so one instruction replaces a VPBROADCASTD
 * and a VDPBF16PS (docs/kernels.md "Round 20"). b and the pair trade places in the instruction: the
 * products of bf16 pairs are exact in fp32, so the sums are the same bits. */
static inline __m512 dp_bcast(__m512 acc, __m512bh b, const char *p)
{
    /* the operand as 4 bytes, which need not be 4-byte aligned */
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(b), "m"(*(const char(*)[4])p));
    return acc;
}

typedef struct tile_set {
    float c[4][16][16]; /* C tiles 0..3 */
    tile_rows ab[4];    /* A and B tiles 4..7, at ab[t - 4] */
} tile_set;

static inline void tile_load(tile_set *s, int t, const void *p, size_t ld)
{
    s->ab[t] = (tile_rows){(const char *)p, ld};
}

/* C tile tc += A tile ta (16 rows x 16 bf16 pairs) times B tile tb (16 pair rows x 16 columns) */
static inline void tile_dp(tile_set *s, int tc, int ta, int tb)
{
    float(*c)[16] = s->c[tc];
    const tile_rows *a = &s->ab[ta], *b = &s->ab[tb];
    __m512 acc[16];
    _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
        acc[m] = _mm512_loadu_ps(c[m]);
    for (int k = 0; k < 16; k++) {
        const __m512bh bk = (__m512bh)_mm512_loadu_si512((const void *)(b->p + k * b->ld));
        const char *ak = a->p + 4 * k;
        _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
            acc[m] = dp_bcast(acc[m], bk, ak + m * a->ld);
    }
    _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
        _mm512_storeu_ps(c[m], acc[m]);
}

#define ATTN_LEAF(name) trex_fused_##name##_avx512

#include "kernels/x86/attn_tiles.h"
