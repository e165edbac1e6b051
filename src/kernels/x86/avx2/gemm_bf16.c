/* kernels/x86/avx2/gemm_bf16.c — the bf16 GEMM micro-kernel on AVX2 + FMA, for x86-64 machines without
 * AVX-512 (with AVX-512 but not its bf16 instructions they run kernels/x86/avx512f), which otherwise run
 * the plain-C reference (17-19 GFLOP/s per core on the AMD VM, against about 100 for this kernel with
 * its operands in L1; docs/kernels.md "Micro-kernels").
 *
 * AVX2 has no bf16 arithmetic: a dword holding a pair (k, k+1) of B gives both as fp32 with one shift
 * and one mask (pairs.h), and the products are fp32 FMAs: exact (bf16 x bf16 fits fp32's mantissa), one
 * rounding per sum, even k then odd k, as in every level. Each sum is a chain of two dependent FMAs per
 * k-pair, so the FMA units stay busy only with at least as many chains as their latency times their
 * number (4 cycles x 2 units on the cores measured: pieces of 4 rows x 16 columns had exactly 8, and
 * ran at 80-83% of the peak in L1, 86-90% now): the 32x32 block is done in pieces of 6 rows x 16 columns
 * (twelve accumulators, two B vectors and one A broadcast: 15 of the 16 registers), five per 16
 * columns, and one of the last 2 rows x 32 columns (eight), each over the whole kp. Per k-pair a piece
 * does the even k's products of all its rows, then the odd k's, loading B's pair row again for those
 * rather than holding it. Per 32-k panel step a piece first widens its A (its rows x 32 k, contiguous
 * in the panel) into floats, so that each A value is one broadcast load for two FMAs, with no shift or
 * mask per row; a piece's B (16 columns x kp, 16 KiB for kp = 512) stays in L1 across the five row
 * groups that read it. Unlike the reference and the bf16 instructions, bf16 subnormal inputs are
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

/* A piece of the block: 6 rows x 16 columns (12 accumulators), or the block's last 2 rows x 32 columns
 * (8). Accumulator s<i><j> holds row r0 + i, columns c0 + 8j .. c0 + 8j + 7. */
enum { ROWS = 6, COLS = 16, TAIL = TREX_GEMM_MR - TREX_GEMM_MR / ROWS * ROWS };

#define ACC_INIT(i, j)                                                                             \
    __m256 s##i##j = _mm256_setzero_ps();                                                          \
    if (acc && r0 + i < nrows)                                                                     \
        s##i##j = _mm256_loadu_ps(c->in + (r0 + i) * c->ldi + c0 + 8 * j);
#define ACC_STORE(i, j)                                                                            \
    if (r0 + i < nrows)                                                                            \
        _mm256_storeu_ps(c->out + (r0 + i) * c->ldo + c0 + 8 * j, s##i##j);
#define ACC_FMA(i, j, a, x) s##i##j = _mm256_fmadd_ps(a, x, s##i##j)
/* row i times A's value aw[i][k] into its two (x0, x1) or four (.. x3) column groups */
#define ROW2(i, k)                                                                                 \
    do {                                                                                           \
        const __m256 a = _mm256_broadcast_ss(&aw[i][k]);                                           \
        ACC_FMA(i, 0, a, x0);                                                                      \
        ACC_FMA(i, 1, a, x1);                                                                      \
    } while (0)
#define ROW4(i, k)                                                                                 \
    do {                                                                                           \
        const __m256 a = _mm256_broadcast_ss(&aw[i][k]);                                           \
        ACC_FMA(i, 0, a, x0);                                                                      \
        ACC_FMA(i, 1, a, x1);                                                                      \
        ACC_FMA(i, 2, a, x2);                                                                      \
        ACC_FMA(i, 3, a, x3);                                                                      \
    } while (0)
#define PIECE_INIT()                                                                               \
    ACC_INIT(0, 0) ACC_INIT(0, 1) ACC_INIT(1, 0) ACC_INIT(1, 1) ACC_INIT(2, 0) ACC_INIT(2, 1)      \
    ACC_INIT(3, 0) ACC_INIT(3, 1) ACC_INIT(4, 0) ACC_INIT(4, 1) ACC_INIT(5, 0) ACC_INIT(5, 1)
#define PIECE_STORE()                                                                              \
    ACC_STORE(0, 0) ACC_STORE(0, 1) ACC_STORE(1, 0) ACC_STORE(1, 1) ACC_STORE(2, 0) ACC_STORE(2, 1) \
    ACC_STORE(3, 0) ACC_STORE(3, 1) ACC_STORE(4, 0) ACC_STORE(4, 1) ACC_STORE(5, 0) ACC_STORE(5, 1)
#define PIECE_ROWS(k)                                                                              \
    do {                                                                                           \
        ROW2(0, k);                                                                                \
        ROW2(1, k);                                                                                \
        ROW2(2, k);                                                                                \
        ROW2(3, k);                                                                                \
        ROW2(4, k);                                                                                \
        ROW2(5, k);                                                                                \
    } while (0)
#define TAIL_INIT()                                                                                \
    ACC_INIT(0, 0) ACC_INIT(0, 1) ACC_INIT(0, 2) ACC_INIT(0, 3)                                    \
    ACC_INIT(1, 0) ACC_INIT(1, 1) ACC_INIT(1, 2) ACC_INIT(1, 3)
#define TAIL_STORE()                                                                               \
    ACC_STORE(0, 0) ACC_STORE(0, 1) ACC_STORE(0, 2) ACC_STORE(0, 3)                                \
    ACC_STORE(1, 0) ACC_STORE(1, 1) ACC_STORE(1, 2) ACC_STORE(1, 3)

/* A's rows r0 .. r0 + rows - 1 over the panel step at k0 (32 contiguous k each) as floats: all 32
 * values, or with f32b the first of each pair (aw[i][q], q < 16) */
static inline void widen_a(float (*aw)[32], const uint16_t *ap, int64_t k0, int r0, int rows, bool f32b)
{
    const uint16_t *ar = ap + k0 * TREX_GEMM_MR + r0 * 32;
    for (int i = 0; i < rows; i++) {
        if (!f32b) {
            widen32(aw[i], ar + i * 32);
            continue;
        }
        const __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)(ar + i * 32));
        const __m256i hi = _mm256_loadu_si256((const __m256i *)(const void *)(ar + i * 32 + 16));
        _mm256_store_ps(aw[i], pair_even(lo));
        _mm256_store_ps(aw[i] + 8, pair_even(hi));
    }
}

/* 8 columns of B's row of k-pair q at p: the even values of its pairs, the odd ones, or with f32b its
 * fp32 values */
static inline __m256 b_even(const char *p, bool f32b)
{
    return f32b ? _mm256_loadu_ps((const float *)(const void *)p)
                : pair_even(_mm256_loadu_si256((const __m256i *)(const void *)p));
}

static inline __m256 b_odd(const char *p)
{
    return pair_odd(_mm256_loadu_si256((const __m256i *)(const void *)p));
}

/* Rows r0 .. r0+5 (those below nrows) x columns c0 .. c0+15 of the block, over kp k. Per k-pair the even
 * k's products, then the odd k's: each sum in k order (with f32b one product per pair). The
 * accumulators are named variables, not an array, so that GCC keeps them in registers; B's pair row is
 * loaded again for the odd values rather than held, which would leave too few of the 16 registers. */
static inline __attribute__((always_inline)) void piece(bool f32b, int64_t kp, const uint16_t *ap,
                                                        const uint16_t *bp, const trex_ukr_c *c, bool acc,
                                                        int r0, int c0, int nrows)
{
    PIECE_INIT()
    alignas(32) float aw[ROWS][32]; /* the piece's A over one panel step, as floats */
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
        widen_a(aw, ap, k0, r0, ROWS, f32b);
        /* the VNNI panel's row of k-pair q: 32 dwords, those of columns c0 .. c0+15 from byte 4 c0 */
        const char *bb = (const char *)(const void *)(bp + k0 * TREX_GEMM_NR) + 4 * c0;
        for (int q = 0; q < 16; q++) {
            const char *bk = bb + q * 4 * TREX_GEMM_NR;
            __m256 x0 = b_even(bk, f32b), x1 = b_even(bk + 32, f32b);
            if (f32b) {
                PIECE_ROWS(q);
                continue;
            }
            PIECE_ROWS(2 * q);
            x0 = b_odd(bk), x1 = b_odd(bk + 32);
            PIECE_ROWS(2 * q + 1);
        }
    }
    PIECE_STORE()
}

/* Rows r0, r0+1 (those below nrows) x all 32 columns, as piece does. */
static inline __attribute__((always_inline)) void tail(bool f32b, int64_t kp, const uint16_t *ap,
                                                       const uint16_t *bp, const trex_ukr_c *c, bool acc,
                                                       int r0, int nrows)
{
    const int c0 = 0;
    TAIL_INIT()
    alignas(32) float aw[TAIL][32];
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
        widen_a(aw, ap, k0, r0, TAIL, f32b);
        const char *bb = (const char *)(const void *)(bp + k0 * TREX_GEMM_NR);
        for (int q = 0; q < 16; q++) {
            const char *bk = bb + q * 4 * TREX_GEMM_NR;
            __m256 x0 = b_even(bk, f32b), x1 = b_even(bk + 32, f32b);
            __m256 x2 = b_even(bk + 64, f32b), x3 = b_even(bk + 96, f32b);
            if (f32b) {
                ROW4(0, q);
                ROW4(1, q);
                continue;
            }
            ROW4(0, 2 * q);
            ROW4(1, 2 * q);
            x0 = b_odd(bk), x1 = b_odd(bk + 32), x2 = b_odd(bk + 64), x3 = b_odd(bk + 96);
            ROW4(0, 2 * q + 1);
            ROW4(1, 2 * q + 1);
        }
    }
    TAIL_STORE()
}

/* The 32x32 block: for each 16 columns, five 6-row pieces (those with a row below c->rows), then the
 * last 2 rows x 32 columns. f32b: B in the fp32-pair format (below). The pieces are inlined into each
 * entry, so that f32b is a constant in them. */
static inline __attribute__((always_inline)) void block(bool f32b, int64_t kp, const uint16_t *ap,
                                                        const uint16_t *bp, const trex_ukr_c *c, unsigned flags)
{
    const bool acc = flags & TREX_UKR_ACCUMULATE;
    const int nrows = c->rows > 0 && c->rows < TREX_GEMM_MR ? (int)c->rows : TREX_GEMM_MR;
    for (int c0 = 0; c0 < TREX_GEMM_NR; c0 += COLS)
        for (int r0 = 0; r0 < nrows && r0 + ROWS <= TREX_GEMM_MR; r0 += ROWS)
            piece(f32b, kp, ap, bp, c, acc, r0, c0, nrows);
    if (nrows > TREX_GEMM_MR - TAIL)
        tail(f32b, kp, ap, bp, c, acc, TREX_GEMM_MR - TAIL, nrows);
}

void trex_gemm_ukr_avx2(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c, unsigned flags)
{
    block(false, kp, ap, bp, c, flags);
}

/* The fp32-pair kernel (trex_gemm_bf16_f32b; kernels/gemm_panels.h "fp32-pair format"): each k-pair of
 * B is one fp32 value, met by the first of A's pair in one FMA: half the FMAs of the kernel above, and
 * B needs no widening. The same pieces; A goes to floats once per panel step, only the first of each
 * pair. */
void trex_gemm_ukr_f32b_avx2(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                             unsigned flags)
{
    block(true, kp, ap, bp, c, flags);
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
