/* kernels/x86/avx2/gemm_bf16.c — the bf16 GEMM micro-kernel on AVX2 + FMA, for x86-64 machines without
 * AVX-512 (with AVX-512 but not its bf16 instructions they run kernels/x86/avx512f), which otherwise run
 * the plain-C reference (17-19 GFLOP/s per core on the AMD VM, against about 90 for this kernel with its
 * operands in L1; docs/kernels.md "Micro-kernels").
 *
 * AVX2 has no bf16 arithmetic: a dword holding a pair (k, k+1) of B gives both as fp32 with one shift
 * and one mask (pairs.h), and the products are fp32 FMAs: exact (bf16 x bf16 fits fp32's mantissa), one
 * rounding per sum, even k then odd k, as in every level. The 32x32 block is done in sixteen 4-row x
 * 16-column pieces (eight accumulators, four B vectors and two A broadcasts: 14 of the 16 registers),
 * each over the whole kp. Per 32-k panel step a piece first widens its A (4 rows x 32 k, contiguous in
 * the panel) into 512 bytes of floats, so that each A value is one broadcast load for two FMAs, with no
 * shift or mask per row; a piece's B (16 columns x kp, 16 KiB for kp = 512) stays in L1 across the eight
 * row groups that read it. Unlike the reference and the bf16 instructions, bf16 subnormal inputs are
 * not read as zero and products below fp32's normal range are not rounded apart from the sum (an FMA
 * takes them as they are): differences below 1e-38 per product. TREX_UKR_STREAM and the prefetch hint
 * are not taken (measured: nothing to gain at this level's rate, docs/kernels.md). A second kernel
 * takes B's pairs as fp32 values (trex_gemm_bf16_f32b, below). Compiled with AVX2 and FMA flags;
 * reached only through the dispatch table. */
#include <immintrin.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/gemm_panels.h"
#include "kernels/x86/avx2/pairs.h"

enum { ROWS = 4, COLS = 16 };

/* Row i of a piece: its accumulators, set up from C; one k-pair; stored to C (rows below nrows). */
#define ROW_INIT(i)                                                                                \
    __m256 s##i##a = _mm256_setzero_ps(), s##i##b = _mm256_setzero_ps();                           \
    if (acc && r0 + i < nrows) {                                                                   \
        s##i##a = _mm256_loadu_ps(c->in + (r0 + i) * c->ldi + c0);                                 \
        s##i##b = _mm256_loadu_ps(c->in + (r0 + i) * c->ldi + c0 + 8);                             \
    }
#define ROW_STEP(i)                                                                                \
    do {                                                                                           \
        const __m256 a0 = _mm256_broadcast_ss(&aw[i][2 * q]);                                      \
        const __m256 a1 = _mm256_broadcast_ss(&aw[i][2 * q + 1]);                                  \
        s##i##a = _mm256_fmadd_ps(a1, o0, _mm256_fmadd_ps(a0, e0, s##i##a));                       \
        s##i##b = _mm256_fmadd_ps(a1, o1, _mm256_fmadd_ps(a0, e1, s##i##b));                       \
    } while (0)
#define ROW_STORE(i)                                                                               \
    if (r0 + i < nrows) {                                                                          \
        _mm256_storeu_ps(c->out + (r0 + i) * c->ldo + c0, s##i##a);                                \
        _mm256_storeu_ps(c->out + (r0 + i) * c->ldo + c0 + 8, s##i##b);                            \
    }
/* The piece's four rows: set up, one k-pair (the includer's ROW_STEP), stored. */
#define PIECE_INIT() ROW_INIT(0) ROW_INIT(1) ROW_INIT(2) ROW_INIT(3)
#define PIECE_STEP() \
    do {             \
        ROW_STEP(0); \
        ROW_STEP(1); \
        ROW_STEP(2); \
        ROW_STEP(3); \
    } while (0)
#define PIECE_STORE() ROW_STORE(0) ROW_STORE(1) ROW_STORE(2) ROW_STORE(3)

typedef void piece_fn(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c, bool acc, int r0,
                      int c0, int nrows);

/* The 32x32 block as pieces, those of rows below c->rows only (always inlined: piece is a constant). */
static inline void block(piece_fn *piece, int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                         unsigned flags)
{
    const bool acc = flags & TREX_UKR_ACCUMULATE;
    const int nrows = c->rows > 0 && c->rows < TREX_GEMM_MR ? (int)c->rows : TREX_GEMM_MR;
    for (int c0 = 0; c0 < TREX_GEMM_NR; c0 += COLS)
        for (int r0 = 0; r0 < nrows; r0 += ROWS)
            piece(kp, ap, bp, c, acc, r0, c0, nrows);
}

/* Rows r0 .. r0+3 (those below nrows) x columns c0 .. c0+15 of the block, over kp k. The accumulators
 * are named variables, not an array, so that GCC keeps them in registers. */
static inline void piece(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c, bool acc,
                         int r0, int c0, int nrows)
{
    PIECE_INIT()
    alignas(32) float aw[ROWS][32]; /* the piece's A over one panel step, as floats */
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
        /* A's rows r0 .. r0+3 of the panel step k0/32 (32 contiguous k each) */
        const uint16_t *ar = ap + k0 * TREX_GEMM_MR + r0 * 32;
        for (int i = 0; i < ROWS; i++)
            widen32(aw[i], ar + i * 32);
        /* B's pairs (k, k+1) of columns c0 .. c0+15: 16 dwords of the VNNI panel's row k/2 */
        const uint16_t *bb = bp + k0 * TREX_GEMM_NR + 2 * c0;
        for (int q = 0; q < 16; q++) {
            const uint16_t *bk = bb + q * (2 * TREX_GEMM_NR);
            const __m256i b0 = _mm256_loadu_si256((const __m256i *)(const void *)bk);
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)(const void *)(bk + 16));
            const __m256 e0 = pair_even(b0), o0 = pair_odd(b0), e1 = pair_even(b1), o1 = pair_odd(b1);
            PIECE_STEP();
        }
    }
    PIECE_STORE()
}

void trex_gemm_ukr_avx2(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c, unsigned flags)
{
    block(piece, kp, ap, bp, c, flags);
}

/* The fp32-pair kernel (trex_gemm_bf16_f32b; kernels/gemm_panels.h "fp32-pair format"): each k-pair of
 * B is one fp32 value, met by the first of A's pair in one FMA: half the FMAs of the kernel above, and
 * B needs no widening. The same pieces; a piece's A goes to floats once per panel step, only the first
 * of each pair (16 per row and step). */
#undef ROW_STEP
#define ROW_STEP(i)                                                                                \
    do {                                                                                           \
        const __m256 a = _mm256_broadcast_ss(&aw[i][q]);                                           \
        s##i##a = _mm256_fmadd_ps(a, b0, s##i##a);                                                 \
        s##i##b = _mm256_fmadd_ps(a, b1, s##i##b);                                                 \
    } while (0)

static inline void piece_f32b(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c, bool acc,
                              int r0, int c0, int nrows)
{
    PIECE_INIT()
    alignas(32) float aw[ROWS][16]; /* the first of each of the piece's A pairs over one panel step */
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
        const uint16_t *ar = ap + k0 * TREX_GEMM_MR + r0 * 32;
        for (int i = 0; i < ROWS; i++) {
            const __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)(ar + i * 32));
            const __m256i hi = _mm256_loadu_si256((const __m256i *)(const void *)(ar + i * 32 + 16));
            _mm256_store_ps(aw[i], pair_even(lo));
            _mm256_store_ps(aw[i] + 8, pair_even(hi));
        }
        /* B's values of columns c0 .. c0+15: 16 floats of the panel's row of k-pair q */
        const float *bb = (const float *)(const void *)(bp + k0 * TREX_GEMM_NR) + c0;
        for (int q = 0; q < 16; q++) {
            const __m256 b0 = _mm256_loadu_ps(bb + q * TREX_GEMM_NR);
            const __m256 b1 = _mm256_loadu_ps(bb + q * TREX_GEMM_NR + 8);
            PIECE_STEP();
        }
    }
    PIECE_STORE()
}

void trex_gemm_ukr_f32b_avx2(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                             unsigned flags)
{
    block(piece_f32b, kp, ap, bp, c, flags);
}

/* The level's peak: 256-bit fp32 FMAs, the unit its bf16 products run on (`trex bench peak`, and the
 * MFU denominator of bf16 steps at this level, docs/mfu.md). Twelve named accumulators (an array would
 * live in memory at -O2) in twelve independent chains cover a 4-cycle FMA latency on two ports with
 * room to spare, in 14 of the 16 registers; the empty asm keeps them in registers and stops the compiler
 * from folding iterations. */
double trex_peak_f32_fma_avx2(int64_t iters)
{
    __m256 x0 = _mm256_set1_ps(1.00f), x1 = _mm256_set1_ps(1.01f), x2 = _mm256_set1_ps(1.02f),
           x3 = _mm256_set1_ps(1.03f), x4 = _mm256_set1_ps(1.04f), x5 = _mm256_set1_ps(1.05f),
           x6 = _mm256_set1_ps(1.06f), x7 = _mm256_set1_ps(1.07f), x8 = _mm256_set1_ps(1.08f),
           x9 = _mm256_set1_ps(1.09f), x10 = _mm256_set1_ps(1.10f), x11 = _mm256_set1_ps(1.11f);
    const __m256 m = _mm256_set1_ps(0.999999f), d = _mm256_set1_ps(1e-7f);
#define FMA(x) x = _mm256_fmadd_ps(x, m, d)
    for (int64_t it = 0; it < iters; it++) {
        FMA(x0); FMA(x1); FMA(x2); FMA(x3); FMA(x4); FMA(x5);
        FMA(x6); FMA(x7); FMA(x8); FMA(x9); FMA(x10); FMA(x11);
        __asm__ volatile("" : "+x"(x0), "+x"(x1), "+x"(x2), "+x"(x3), "+x"(x4), "+x"(x5));
        __asm__ volatile("" : "+x"(x6), "+x"(x7), "+x"(x8), "+x"(x9), "+x"(x10), "+x"(x11));
    }
#undef FMA
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)),
                                   _mm256_add_ps(_mm256_add_ps(x4, x5), _mm256_add_ps(x6, x7)));
    const __m256 t = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(x8, x9), _mm256_add_ps(x10, x11)));
    float lanes[8];
    _mm256_storeu_ps(lanes, t);
    volatile float sink = lanes[0] + lanes[7];
    (void)sink;
    return (double)iters * 12 * 8 * 2;
}
