/* kernels/ref/gemm_blocked.c — the blocked bf16 GEMM framework (portable C): chunking, packing,
 * blocking, threading and the alpha/beta epilogue, around the ISA leaves of the dispatch table.
 *
 * A call is a list of problems (one for trex_gemm_bf16, one per expert for a grouped call). Each problem
 * is cut along N into sub-problems whose packed B fits a bounded workspace (never along K);
 * consecutive sub-problems form a batch. For each batch:
 *   1. pack: every 32-column panel of op(B) (VNNI format, kernels/gemm_panels.h), shared by all blocks;
 *   2. compute: C is cut into blocks of mb x NB (mb <= 256, fewer rows when K is over 16 384, so that a
 *      packed A block stays within 8 MiB). The rows of blocks of every problem of the batch form one
 *      list; each pool thread takes the next row from it (an atomic counter), packs that row's A block
 *      (A format) into its own buffer (slice by slice during the first block when it exceeds 1 MiB) and
 *      computes the row's blocks from it while it is hot; a thread that the OS descheduled simply takes
 *      fewer rows (fewer rows than threads: each row is cut into groups of column blocks, col_groups).
 *      Inside a block, K is cut into slices of at most KSLICE (512) k; for each slice, each B panel's slice
 *      (32 x 512 bf16, 32 KiB: it stays in L1) meets the block's A panels' slices in the micro-kernel, which
 *      keeps its 32x32 block in registers for the slice. Between slices the block's sums wait in the thread's
 *      buffer (fp32, exactly as the registers held them); the first slice starts from C (beta 1) or zero, the
 *      last writes C. Each call also names the B slice the thread reads next, which the AMX level prefetches
 *      into L2: B comes from L3 or memory, and the hardware prefetchers stop at each 4 KiB page of the panels
 *      (docs/kernels.md "Round 14": 2048^3 +14%, the head's forward +31%; without the prefetch the slices
 *      measured no faster than whole K, rounds 5, 10 and 13). C is written with non-temporal stores where
 *      nothing reads it first, which saves reading its lines for ownership: written once (alpha 1, beta 0),
 *      whatever its size (in a training step such a C is rarely in cache when it is written; round 16), or
 *      summed over several slices (beta 1) when it exceeds ADD_STREAM_LIMIT: the first slice read C long
 *      before, and a smaller C is still in cache then, for this call's stores and for the caller that sums
 *      into it again (d hn over vocabulary blocks; round 14).
 * fp32 sources are rounded to bf16 while packed, except trex_gemm_bf16_f32b's B, whose values are
 * packed as they are (the fp32-pair format, for the micro-kernels of the FMA levels that take it: b_pairs
 * below; its K counts each value twice, so that its panels and steps are the bf16 ones). A pre-packed B
 * (trex_gemm_pack_b: the same panels, packed once by the caller) skips step 1; a pre-packed A
 * (trex_gemm_pack_a) is read in place instead of being packed per block row. Everything else is the
 * same, so are the bits.
 * Which thread computes a block varies from run to run, but each element of C is owned by one block and
 * summed over all of K by one thread in a fixed order (slice after slice: the bits of one micro-kernel
 * call over all of K), then combined with alpha and beta once: the bits of C never depend on the
 * thread count or on the schedule. (The atomic counter hands out work; no floating-point value is ever
 * reduced across threads.)
 *
 * This file is the framework shared by every level; it lives in ref/ because it is plain C. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/gemm_panels.h"
#include "trex/prof.h"
#include "trex/status.h"
#include "trex/tensor.h"

#define MB_MAX 256               /* rows of C per block, at most: a multiple of TREX_GEMM_MR */
#define NB 256                   /* columns of C per block: a multiple of TREX_GEMM_NR */
#define ABLOCK_LIMIT (8l << 20)  /* bytes of a packed A block (MB x Kp), at most, above 32 rows */
#define ABLOCK_L2 (1l << 20)     /* bytes of a packed A block above which it is packed slice by slice */
#define OPERAND_LIMIT (12l << 20) /* packed bytes of B of one sub-problem, at most */
#define BATCH_LIMIT (24l << 20)  /* packed bytes of B of a batch, unless one sub-problem is larger */
#define PACK_UNIT 4              /* B panels per unit of packing work */
#define PACK_STEPS 256           /* panel steps (32 k x 32 n) per unit when B is stored by rows of k */
#define KSLICE 512               /* k per slice of a block, at most (compute_block) */
#define ADD_STREAM_LIMIT (8l << 20) /* bytes of a beta-1 C in a call above which its last slice streams it */

/* alpha 1 beta 0: tiles stored into C | alpha 1, any other beta: the sums start from beta * D (D's tiles
 * loaded as they are for beta 1, else scaled into a 32x32 buffer; D is C unless the problem names one),
 * then stored into C | alpha != 1: the sum goes through a 32x32 buffer, then C = alpha * sum + beta * D. */
enum { MODE_SET, MODE_ADD, MODE_GENERAL };

typedef struct sub {
    int64_t M, N, K, Kp;
    const char *A, *B;       /* op(A)[m][k] = A[m*a_rs + k*a_ks]; op(B)[k][n] = B[n*b_rs + k*b_ks] */
    int64_t a_rs, a_ks, b_rs, b_ks;
    float *C;
    int64_t ldc;
    const float *D;          /* beta's term (the problem's D, or C) */
    int64_t ldd;
    int64_t mb;              /* rows per block of C (and per packed A block) */
    int64_t npan;            /* 32-column panels of B */
    int64_t mblk, nblk;      /* mb x NB blocks of C */
    int64_t b_off;           /* packed B panels, in bf16 elements from the batch workspace */
    const uint16_t *bpan;    /* its first packed B panel (workspace, or a pre-packed operand) */
    const uint16_t *apan;    /* pre-packed A: its first panel (NULL: A packed per block row) */
    /* Operands read through row lists (trex_gemm_grouped_rows): row j of the stored A (B) is row
     * arow[j] (brow[j]) of the buffer at A (B), lda (ldb) apart; a_byr / b_byr: those stored rows are
     * the panels' rows (A not transposed, B transposed), else their k; B is then the problem's, not
     * offset to the sub's first column n0. NULL: the operand as stored. */
    const int32_t *arow, *brow;
    bool a_byr, b_byr;
    bool b_pairs;            /* B's fp32 values as they are, in the fp32-pair format, met by gemm_ukr_f32b
                              * (trex_gemm_bf16_f32b): K counts each value twice */
    int64_t lda, ldb;
    int64_t n0;              /* the sub's first column in its problem (of C, and of B when read by rows) */
} sub;

typedef struct item {        /* a unit of work handed to whichever thread asks next */
    int32_t s;               /* sub-problem, relative to the batch's first */
    int32_t i, n;            /* pack: B panels i..i+n-1, or with b_ksteps its k steps i..i+n-1 of every
                              * panel; compute: the row of blocks i, its column blocks j0..j1-1 */
    int32_t j0, j1;
} item;

typedef struct run {
    const trex_kernel_table *t;
    trex_pool *pool;
    bool a_f32, b_f32;       /* source types of A and of B (B unused when pre-packed) */
    size_t a_esz, b_esz;
    int mode;
    bool sym;                /* a symmetric C (trex_gemm_syrk_*): tiles on and below the diagonal only */
    bool stream_add;         /* MODE_ADD with a C over ADD_STREAM_LIMIT: its last slice streams C */
    float alpha, beta;
    const sub *subs;         /* the batch's sub-problems */
    uint16_t *bpack;         /* packed B panels of the batch */
    uint16_t *apack;         /* nslots packed A blocks of ablock elements */
    int64_t ablock;
    float *sums;             /* nslots buffers of sblock floats: a block's sums between K slices */
    int64_t sblock;
    const item *items;
    int64_t nitems;
    atomic_llong *next;      /* the next item to hand out */
    int nslots;
} run;

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* The next unit of work, or -1 when none is left. Which thread runs a unit changes from run to run;
 * what a unit computes, and in which order, does not. */
static int64_t next_item(const run *r)
{
    const long long i = atomic_fetch_add_explicit(r->next, 1, memory_order_relaxed);
    return i < r->nitems ? (int64_t)i : -1;
}

/* Operands read through a row list (trex_gemm_grouped_rows): the stored matrix's row j is at base +
 * idx[j] * ld, and the pieces of the listed rows are copied into the thread's slab (in cache) and
 * packed from there with the level's packer. When the listed rows are the operand's rows (X[r][k] =
 * stored[idx[r]][k]), pack_gathered_rows does one panel (rows [r0, r0 + rows)) GATHER_SLAB k at a
 * time; when they are its k (X[r][k] = stored[idx[k]][r]), pack_gathered_steps (below) does a block of
 * panels a step of 32 k at a time. A and B steps have the same size (32 x 32), so a slab of k goes to
 * step k / 32 of either format. */
#define GATHER_SLAB 256
static _Thread_local _Alignas(64) float gather_slab[TREX_GEMM_MR * GATHER_SLAB];

static void pack_gathered_rows(trex_pack_fn fn, uint16_t *dst, const char *base, int64_t ld, const int32_t *idx,
                               size_t esz, int64_t r0, int64_t rows, int64_t k0, int64_t k1)
{
    char *slab = (char *)gather_slab;
    for (int64_t k = k0; k < k1; k += GATHER_SLAB) {
        const int64_t kc = min64(GATHER_SLAB, k1 - k), kcp = ceil_div(kc, TREX_GEMM_KU) * TREX_GEMM_KU;
        for (int64_t i = 0; i < rows; i++)
            memcpy(slab + (size_t)(i * kc) * esz, base + (size_t)((int64_t)idx[r0 + i] * ld + k) * esz,
                   (size_t)kc * esz);
        fn(dst + (k / TREX_GEMM_KU) * (TREX_GEMM_KU * TREX_GEMM_MR), slab, kc, 1, rows, kc, kcp);
    }
}

/* Panels [p0, p1) of an operand whose packed rows are contiguous in its storage (A stored [K, M], B
 * stored [K, N]; A and B panels are both 32 wide), steps [k0, k1) of k (multiples of 32; k1 may be K),
 * step by step across the panels: the operand's row r (op(A)'s row, op(B)'s column) and k at
 * src + (r + k ks) esz, R rows in all; panel p at panels + p 32 Kp. A panel's step reads 32 source rows
 * a page or more apart, 64 or 128 bytes of each: panel by panel over all of K, a row's next piece is
 * read only when the next panel comes round, and the hardware prefetchers (which follow a page's lines)
 * never get ahead. Step by step across the panels, each source row is read front to back, 32 rows at a
 * time (docs/kernels.md "Round 11": packing a 4 096 x 4 096 operand from memory twice as fast). The
 * same bytes either way. */
static void pack_steps(trex_pack_fn fn, uint16_t *panels, int64_t Kp, const char *src, size_t esz, int64_t ks,
                       int64_t R, int64_t K, int64_t p0, int64_t p1, int64_t k0, int64_t k1)
{
    for (int64_t k = k0; k < k1; k += TREX_GEMM_KU)
        for (int64_t p = p0; p < p1; p++)
            fn(panels + p * TREX_GEMM_NR * Kp + k * TREX_GEMM_NR,
               src + (size_t)(p * TREX_GEMM_NR + k * ks) * esz, 1, ks, min64(TREX_GEMM_NR, R - p * TREX_GEMM_NR),
               min64(TREX_GEMM_KU, K - k), TREX_GEMM_KU);
}

/* A row-listed operand whose listed rows are its k (X[r][k] = stored[idx[k]][r]): its rows [r0, r0 + R)
 * (R <= 256, a block of A or a unit of B panels) a step of 32 k at a time across their panels, as
 * pack_steps does for an operand stored by rows of k: each step copies the 32 listed rows' R-element
 * pieces into the slab (one contiguous piece per row, not one per row and panel: docs/kernels.md
 * "Round 11"), then packs every panel's step from there. */
static void pack_gathered_steps(trex_pack_fn fn, uint16_t *dst, int64_t Kp, const char *base, int64_t ld,
                                const int32_t *idx, size_t esz, int64_t r0, int64_t R, int64_t k0, int64_t k1)
{
    char *slab = (char *)gather_slab;
    TREX_ASSERT((size_t)R * TREX_GEMM_KU * esz <= sizeof gather_slab);
    for (int64_t k = k0; k < k1; k += TREX_GEMM_KU) {
        const int64_t kc = min64(TREX_GEMM_KU, k1 - k);
        for (int64_t j = 0; j < kc; j++)
            memcpy(slab + (size_t)(j * R) * esz, base + (size_t)((int64_t)idx[k + j] * ld + r0) * esz,
                   (size_t)R * esz);
        for (int64_t p = 0; p * TREX_GEMM_NR < R; p++)
            fn(dst + p * TREX_GEMM_NR * Kp + k * TREX_GEMM_NR, slab + (size_t)(p * TREX_GEMM_NR) * esz, 1, R,
               min64(TREX_GEMM_NR, R - p * TREX_GEMM_NR), kc, TREX_GEMM_KU);
    }
}

/* ---- phase 1: B panels, shared by every block ------------------------------------------------------- */

/* Whether B's panels are packed in units of k steps across all of them (pack_steps): B stored by rows
 * of k ([K, N], not through a row list) in more than one panel. */
static bool b_ksteps(const sub *s)
{
    return !s->brow && !s->b_pairs && s->b_rs == 1 && s->npan > 1;
}

/* The fp32-pair packer (kernels/gemm_panels.h), with trex_pack_fn's arguments: kc and kcp count each of
 * the rows x kc / 2 source values twice, as the A operand it meets does. Plain C for every level that
 * has gemm_ukr_f32b: B is an activation of a few thousand rows, packed once per call and read by every
 * block of C, so its packing is a small part of the product. */
static void pack_b_f32_pairs(uint16_t *dst, const void *src, int64_t rs, int64_t ks, int64_t rows, int64_t kc,
                             int64_t kcp)
{
    float *d = (float *)(void *)dst;
    const float *x = src;
    const int64_t kv = kc / 2;
    for (int64_t q = 0; q < kcp / 2; q++)
        for (int64_t r = 0; r < TREX_GEMM_NR; r++)
            d[q * TREX_GEMM_NR + r] = r < rows && q < kv ? x[r * rs + q * ks] : 0.0f;
}

/* Every slot takes units (PACK_UNIT panels, or PACK_STEPS / panels steps of every panel: b_ksteps)
 * until none is left (the slot index does not matter). */
static void pack_slots(void *arg, int64_t w0, int64_t w1, int tid)
{
    (void)w0, (void)w1, (void)tid;
    const run *r = arg;
    for (int64_t i; (i = next_item(r)) >= 0;) {
        const sub *s = &r->subs[r->items[i].s];
        const trex_pack_fn fn = s->b_pairs ? pack_b_f32_pairs : r->b_f32 ? r->t->pack_b_f32 : r->t->pack_b_bf16;
        const int64_t u0 = r->items[i].i, un = r->items[i].n;
        if (b_ksteps(s)) { /* steps [u0, u0 + un) of every panel */
            pack_steps(fn, r->bpack + s->b_off, s->Kp, s->B, r->b_esz, s->b_ks, s->N, s->K, 0, s->npan,
                       u0 * TREX_GEMM_KU, min64(s->K, (u0 + un) * TREX_GEMM_KU));
            continue;
        }
        if (s->brow && !s->b_byr) { /* the unit's panels step by step */
            pack_gathered_steps(fn, r->bpack + s->b_off + u0 * TREX_GEMM_NR * s->Kp, s->Kp, s->B, s->ldb,
                                s->brow, r->b_esz, s->n0 + u0 * TREX_GEMM_NR,
                                min64(un * TREX_GEMM_NR, s->N - u0 * TREX_GEMM_NR), 0, s->K);
            continue;
        }
        for (int64_t p = u0; p < u0 + un; p++)
            if (s->brow)
                pack_gathered_rows(fn, r->bpack + s->b_off + p * TREX_GEMM_NR * s->Kp, s->B, s->ldb, s->brow,
                                   r->b_esz, s->n0 + p * TREX_GEMM_NR, min64(TREX_GEMM_NR, s->N - p * TREX_GEMM_NR),
                                   0, s->K);
            else
                fn(r->bpack + s->b_off + p * TREX_GEMM_NR * s->Kp,
                   s->B + (size_t)(p * TREX_GEMM_NR * s->b_rs) * r->b_esz, s->b_rs, s->b_ks,
                   min64(TREX_GEMM_NR, s->N - p * TREX_GEMM_NR), s->K, s->Kp);
    }
}

/* ---- phase 2: compute, A packed per block row on the thread that uses it ---------------------------- */

/* Steps [k0, k1) of the A block of row of blocks bi (k0 and k1 multiples of 32, k1 <= Kp; the panels'
 * steps past K are zeros), packed where the block's panels are (dst, 32 Kp apart): compute_block packs
 * each K slice just before its first use, so a block used once never has to fit L2 whole. */
static void pack_a_slice(const run *r, const sub *s, int64_t bi, uint16_t *dst, int64_t k0, int64_t k1)
{
    const trex_pack_fn fn = r->a_f32 ? r->t->pack_a_f32 : r->t->pack_a_bf16;
    const int64_t m0 = bi * s->mb, mb = min64(s->mb, s->M - m0), kend = min64(k1, s->K);
    if (s->arow && !s->a_byr) {
        pack_gathered_steps(fn, dst, s->Kp, s->A, s->lda, s->arow, r->a_esz, m0, mb, k0, kend);
        return;
    }
    if (s->arow) {
        for (int64_t ip = 0; ip * TREX_GEMM_MR < mb; ip++)
            pack_gathered_rows(fn, dst + ip * TREX_GEMM_MR * s->Kp, s->A, s->lda, s->arow, r->a_esz,
                               m0 + ip * TREX_GEMM_MR, min64(TREX_GEMM_MR, mb - ip * TREX_GEMM_MR), k0, kend);
        return;
    }
    if (s->a_rs == 1 && mb > TREX_GEMM_MR) { /* A stored [K, M], more than one panel */
        pack_steps(fn, dst, s->Kp, s->A + (size_t)m0 * r->a_esz, r->a_esz, s->a_ks, mb, s->K, 0,
                   ceil_div(mb, TREX_GEMM_MR), k0, kend);
        return;
    }
    for (int64_t ip = 0; ip * TREX_GEMM_MR < mb; ip++)
        fn(dst + ip * TREX_GEMM_MR * s->Kp + k0 * TREX_GEMM_MR,
           s->A + (size_t)((m0 + ip * TREX_GEMM_MR) * s->a_rs + k0 * s->a_ks) * r->a_esz, s->a_rs, s->a_ks,
           min64(TREX_GEMM_MR, mb - ip * TREX_GEMM_MR), kend - k0, k1 - k0);
}

/* K slices of a block: at most KSLICE k each, as even as whole steps allow (kernels/x86/amx/gemm_bf16.c:
 * a B slice of 32 x 512 bf16 stays in L1 while the block's A panels stream past it). */
static int64_t slice_k(int64_t Kp)
{
    const int64_t ns = ceil_div(Kp, KSLICE);
    return ceil_div(Kp / TREX_GEMM_KU, ns) * TREX_GEMM_KU;
}

/* One row of MODE_GENERAL's epilogue into t: t = alpha t (+ beta d). A whole row is a loop of 32 that
 * the compiler vectorizes (-O2 does only loops without a remainder); a tile at C's right edge runs the
 * same operations element by element. */
static inline void general_row(float *restrict t, const float *restrict d, int64_t cols, float alpha, float beta)
{
    if (cols == TREX_GEMM_NR && beta == 0.0f)
        for (int64_t j = 0; j < TREX_GEMM_NR; j++)
            t[j] = alpha * t[j];
    else if (cols == TREX_GEMM_NR)
        for (int64_t j = 0; j < TREX_GEMM_NR; j++)
            t[j] = alpha * t[j] + beta * d[j];
    else
        for (int64_t j = 0; j < cols; j++)
            t[j] = beta == 0.0f ? alpha * t[j] : alpha * t[j] + beta * d[j];
}

/* MODE_ADD's starting sums for the rows x cols corner of a tile: t = beta d (a copy for beta 1), 32 floats
 * apart; whole rows in loops of 32, as general_row. */
static void start_tile(float *restrict t, const float *restrict d, int64_t ldd, float beta, int64_t rows,
                       int64_t cols)
{
    for (int64_t i = 0; i < rows; i++, t += TREX_GEMM_NR, d += ldd)
        if (beta == 1.0f)
            memcpy(t, d, (size_t)cols * sizeof *t);
        else if (cols == TREX_GEMM_NR)
            for (int64_t j = 0; j < TREX_GEMM_NR; j++)
                t[j] = beta * d[j];
        else
            for (int64_t j = 0; j < cols; j++)
                t[j] = beta * d[j];
}

/* C = alpha t + beta D (or C = t for MODE_SET and MODE_ADD, whose sum already holds D) for the rows x
 * cols corner of a 32x32 sum t (the thread's buffer, never C or D), which then holds what was stored
 * (mirror_tile reads it): edge tiles, MODE_GENERAL and symmetric products go through here. d is D's
 * tile (C's, unless the problem names a D). */
static void store_tile(const run *r, float *c, int64_t ldc, const float *d, int64_t ldd, float *t, int64_t rows,
                       int64_t cols)
{
    const float alpha = r->alpha, beta = r->beta; /* in registers: c may alias r as far as C knows */
    for (int64_t i = 0; i < rows; i++, c += ldc, d += ldd, t += TREX_GEMM_NR) {
        if (r->mode == MODE_GENERAL)
            general_row(t, d, cols, alpha, beta);
        memcpy(c, t, (size_t)cols * sizeof *c);
    }
}

/* A symmetric C (trex_gemm_syrk): the finished tile t (32 floats apart) of rows [i0, i0 + rows) x
 * columns [j0, j0 + cols) of C (j0 <= i0) copied to its mirror above the diagonal, C[j][i] = t[i][j]
 * for j < i: a tile wholly below the diagonal by the level's transpose, one that the diagonal crosses
 * element by element. Each element above the diagonal is written by the one thread that finished its
 * mirror tile. */
static void mirror_tile(const run *r, float *C, int64_t ldc, const float *t, int64_t i0, int64_t j0, int64_t rows,
                        int64_t cols)
{
    if (i0 >= j0 + cols) {
        r->t->gemm_tile_t(C + j0 * ldc + i0, ldc, t, rows, cols);
        return;
    }
    for (int64_t j = 0; j < cols; j++)
        for (int64_t i = i0 > j0 + j + 1 ? 0 : j0 + j + 1 - i0; i < rows; i++)
            C[(j0 + j) * ldc + i0 + i] = t[i * TREX_GEMM_NR + j];
}

/* The block (bi, bj) of C, K slice by K slice: for each slice, each B panel's slice meets the block's A
 * panels' slices in turn. Between slices a 32x32 tile's sums wait in `sums` (the thread's buffer, tile
 * (ip, jp) at (ip np + jp) 1024, 32 floats apart), exact fp32 as the micro-kernel keeps them: the bits
 * are those of one call over all of K. The first slice starts from C (beta 1) or zero, the last writes
 * C. Each call also names the B slice that comes next (the next panel's, the next slice's first, or
 * next_b: the next block's first), a share of it per A panel, for the level to prefetch. pack_a (not
 * NULL: ablk itself) asks for each slice of the A block to be packed just before the slice. */
static void compute_block(const run *r, const sub *s, int64_t bi, int64_t bj, const uint16_t *ablk,
                          uint16_t *pack_a, float *sums, const uint16_t *next_b)
{
    enum { R = TREX_GEMM_MR, Q = TREX_GEMM_NR };
    const int64_t m0 = bi * s->mb, n0 = bj * NB, Kp = s->Kp, kc = slice_k(Kp);
    const int64_t mp = ceil_div(min64(s->mb, s->M - m0), R), np = ceil_div(min64(NB, s->N - n0), Q);
    const trex_gemm_ukr_fn ukr = s->b_pairs ? r->t->gemm_ukr_f32b : r->t->gemm_ukr;
    const uint16_t *const bblk = s->bpan + (n0 / Q) * Q * Kp;
    float tmp[R * Q] = {0};
    for (int64_t k0 = 0; k0 < Kp; k0 += kc) {
        const int64_t kl = min64(kc, Kp - k0);
        const bool first = k0 == 0, last = k0 + kl == Kp;
        if (pack_a)
            pack_a_slice(r, s, bi, pack_a, k0, k0 + kl);
        for (int64_t jp = 0; jp < np; jp++) {
            const uint16_t *bsl = bblk + jp * Q * Kp + k0 * Q;
            /* What this thread reads next, and its length in k (a slice's 64-byte lines) */
            const uint16_t *next = jp + 1 < np ? bsl + Q * Kp : !last ? bblk + (k0 + kl) * Q : next_b;
            const int64_t lines = jp + 1 < np ? kl : !last ? min64(kc, Kp - k0 - kl) : kc;
            const int64_t share = ceil_div(lines, mp);
            for (int64_t ip = 0; ip < mp; ip++) {
                const int64_t i0 = m0 + ip * R, j0 = n0 + jp * Q;
                if (r->sym && s->n0 + j0 > i0)
                    continue; /* above the diagonal: the mirror of a tile below it */
                const int64_t rows = min64(R, s->M - i0), cols = min64(Q, s->N - j0);
                /* a symmetric C's tiles go through tmp, which the mirror reads */
                const bool direct = !r->sym && r->mode != MODE_GENERAL && rows == R && cols == Q;
                float *c = s->C + i0 * s->ldc + j0;
                const float *d = s->D + i0 * s->ldd + j0;
                float *part = first && last ? NULL : sums + (ip * np + jp) * R * Q; /* one slice: unused */
                trex_ukr_c io = {.out = part, .ldo = Q, .in = part, .ldi = Q, .rows = rows};
                if (next && ip * share < lines) {
                    io.prefetch = (const char *)next + ip * share * 64;
                    io.prefetch_lines = min64(share, lines - ip * share);
                }
                unsigned flags = first ? 0 : TREX_UKR_ACCUMULATE;
                if (first && r->mode == MODE_ADD) {
                    flags = TREX_UKR_ACCUMULATE;
                    io.in = d, io.ldi = s->ldd;
                    if (!direct || r->beta != 1.0f) {
                        start_tile(tmp, d, s->ldd, r->beta, rows, cols);
                        io.in = tmp, io.ldi = Q;
                    }
                }
                if (last) {
                    io.out = direct ? c : tmp, io.ldo = direct ? s->ldc : Q;
                    if (direct && (r->mode == MODE_SET || (!first && r->stream_add))) /* nothing reads C first */
                        flags |= TREX_UKR_STREAM;
                }
                ukr(kl, ablk + ip * R * Kp + k0 * R, bsl, &io, flags);
                if (last && !direct)
                    store_tile(r, c, s->ldc, d, s->ldd, tmp, rows, cols);
                if (last && r->sym)
                    mirror_tile(r, s->C - s->n0, s->ldc, tmp, i0, s->n0 + j0, rows, cols);
            }
        }
    }
}

/* Slot w (one per pool thread) takes rows of blocks until none is left: packs the row's A block into
 * its own buffer (or points at the pre-packed A), then computes the row's blocks from it. A block larger
 * than ABLOCK_L2 (K over 2 048) is packed slice by slice during the row's first block instead, each
 * slice while it is needed: whole, it would not stay in L2 between its packing and its use (round 14:
 * the T = 4096 step's long-K products 0.25 s faster, docs/perf.md). */
static void compute_slots(void *arg, int64_t w0, int64_t w1, int tid)
{
    (void)tid;
    const run *r = arg;
    for (int64_t w = w0; w < w1; w++) {
        uint16_t *const own = r->apack + w * r->ablock;
        float *const sums = r->sums + w * r->sblock;
        bool begun = false;
        for (int64_t i; (i = next_item(r)) >= 0;) {
            const item *it = &r->items[i];
            const sub *s = &r->subs[it->s];
            if (!begun && r->t->gemm_begin)
                r->t->gemm_begin();
            begun = true;
            const uint16_t *ablk = s->apan ? s->apan + it->i * s->mb * s->Kp : own;
            const bool by_slice = !s->apan && s->mb * s->Kp * 2 > ABLOCK_L2;
            if (!s->apan && !by_slice)
                pack_a_slice(r, s, it->i, own, 0, s->Kp);
            for (int64_t bj = it->j0; bj < it->j1; bj++)
                compute_block(r, s, it->i, bj, ablk, by_slice && bj == it->j0 ? own : NULL, sums,
                              bj + 1 < it->j1 ? s->bpan + (bj + 1) * NB * s->Kp : NULL);
        }
        if (begun && r->t->gemm_end)
            r->t->gemm_end();
    }
}

/* Compute items per row of blocks of a batch with `rows` rows of blocks on nslots threads: 1 (the row's
 * blocks computed from one packed A block), unless there are fewer rows than threads: then each row is
 * cut into nslots / rows groups of column blocks, each of which packs the row's A block again. With a
 * thread per item that is never slower (the A block's packing plus a part of the row, against all of
 * it); small weight gradients at short sequences (d wo_a: 256 rows of C, one row of blocks) take
 * 0.65-0.75x the time on two threads. With more rows than threads the extra packing can cost more
 * than the balance gains (d hn at T = 512: 7 rows of blocks, its A packed transposed, took 0.235
 * against 0.164 s per step in column halves), so those rows are left whole. The bits of C do not
 * change: a block is still one thread's, summed over all of K. */
static int64_t col_groups(int64_t rows, int nslots)
{
    return rows > 0 && rows < nslots ? nslots / rows : 1;
}

/* Column blocks of row of blocks i of s that hold a tile to compute: all of them, or for a symmetric C
 * those that reach the diagonal (possibly none). */
static int64_t row_blocks(const sub *s, int64_t i, bool sym)
{
    if (!sym)
        return s->nblk;
    const int64_t end = min64(s->M, (i + 1) * s->mb) - s->n0; /* past the row's last diagonal column */
    return end <= 0 ? 0 : min64(s->nblk, ceil_div(end, NB));
}

/* The compute items of subs [b, e) (items NULL: only count them). A symmetric C's rows of blocks grow
 * with their index: they are handed out last first, and when there are fewer than two per thread
 * (sym_block_rows makes that rare: small n) each block is an item of its own (its row's A block
 * packed again for it), so that the threads' shares even out. */
static int64_t compute_items(item *items, const sub *subs, int64_t b, int64_t e, int nslots, bool sym)
{
    int64_t rows = 0, n = 0;
    for (int64_t s = b; s < e; s++)
        for (int64_t i = 0; i < subs[s].mblk; i++)
            rows += row_blocks(&subs[s], i, sym) > 0;
    const int64_t groups = sym ? (rows < 2 * nslots ? INT64_MAX : 1) : col_groups(rows, nslots);
    for (int64_t s = b; s < e; s++)
        for (int64_t q = 0; q < subs[s].mblk; q++) {
            const int64_t i = sym ? subs[s].mblk - 1 - q : q;
            const int64_t nb = row_blocks(&subs[s], i, sym), g = groups < nb ? groups : nb;
            for (int64_t k = 0; k < g; k++, n++)
                if (items)
                    items[n] = (item){(int32_t)(s - b), (int32_t)i, 0, (int32_t)(k * nb / g),
                                      (int32_t)((k + 1) * nb / g)};
        }
    return n;
}

/* ---- workspace ---------------------------------------------------------------------------------------- */

struct trex_gemm_ws {
    void *pack, *subs, *items; /* 64-byte aligned, grown on demand, kept between calls */
    size_t pack_cap, subs_cap, items_cap;
};

/* At least `need` bytes at *p (64-byte aligned); the old contents are not kept. */
static void *ws_grow(void **p, size_t *cap, size_t need)
{
    need = (need + 63) / 64 * 64;
    if (need <= *cap && *p)
        return *p;
    free(*p);
    *p = aligned_alloc(64, need ? need : 64);
    if (!*p)
        TREX_ABORT("bf16 GEMM: out of memory for %zu bytes of workspace", need);
    *cap = need;
    return *p;
}

static void ws_free_buffers(trex_gemm_ws *w)
{
    free(w->pack);
    free(w->subs);
    free(w->items);
    memset(w, 0, sizeof *w);
}

trex_gemm_ws *trex_gemm_ws_create(void)
{
    return calloc(1, sizeof(trex_gemm_ws));
}

void trex_gemm_ws_destroy(trex_gemm_ws *ws)
{
    if (!ws)
        return;
    ws_free_buffers(ws);
    free(ws);
}

size_t trex_gemm_ws_bytes(const trex_gemm_ws *ws)
{
    return ws ? ws->pack_cap + ws->subs_cap + ws->items_cap : 0;
}

/* ---- driver ------------------------------------------------------------------------------------------ */

/* C = beta * D for an empty sum (K == 0); beta == 0 writes zeros. */
static void scale_c(float *C, int64_t M, int64_t N, int64_t ldc, float beta, const float *D, int64_t ldd)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * D[i * ldd + j];
}

/* Columns of a chunk: as many whole panels of packed B as fit OPERAND_LIMIT, at least one. */
static int64_t chunk_cols(int64_t Kp)
{
    int64_t pan = OPERAND_LIMIT / (TREX_GEMM_NR * Kp * 2);
    int64_t cols = (pan > 0 ? pan : 1) * TREX_GEMM_NR;
    return cols >= NB ? cols / NB * NB : cols;
}

/* Rows of an A block: MB_MAX, fewer (whole panels, at least one) when K is very long. Every row of blocks
 * reads all of B, so taller blocks read B less often; a block's calls need only its current K slice
 * in cache (256 x 512 bf16, 256 KiB), so the whole block need not fit L2: with a 1 MiB cap (mb 160 at
 * K = 3 072, 32 at 16 384) the products with long K ran 1.1-2.1x slower than with 256 rows
 * (docs/kernels.md "Round 14"). The cap bounds the per-thread buffer: K up to 16 384 gets 256 rows. */
static int64_t block_rows(int64_t Kp)
{
    int64_t pan = ABLOCK_LIMIT / (TREX_GEMM_MR * Kp * 2);
    pan = pan < 1 ? 1 : pan > MB_MAX / TREX_GEMM_MR ? MB_MAX / TREX_GEMM_MR : pan;
    return pan * TREX_GEMM_MR;
}

/* Rows of an A block of a symmetric C (trex_gemm_syrk) of M rows on nslots threads: block_rows, or
 * fewer (whole panels) so that there are at least two rows of blocks per thread, which then even out
 * (a 256-row Gram matrix, one block, would be one thread's; in four blocks of 64 rows, 3, 7, 11 and 15
 * tiles, two threads get 18 each). */
static int64_t sym_block_rows(int64_t M, int64_t Kp, int nslots)
{
    const int64_t want = ceil_div(ceil_div(M, 2 * (int64_t)nslots), TREX_GEMM_MR) * TREX_GEMM_MR;
    return min64(block_rows(Kp), want);
}

static int64_t sub_packed(const sub *s)
{
    return s->npan * TREX_GEMM_NR * s->Kp;
}

/* What B packing units of s are counted in: k steps of every panel (b_ksteps), else panels. */
static int64_t pack_span(const sub *s)
{
    return b_ksteps(s) ? s->Kp / TREX_GEMM_KU : s->npan;
}

/* A unit of B packing work of s: PACK_UNIT panels, or (b_ksteps) about PACK_STEPS panel steps' worth
 * of k steps of every panel. */
static int64_t pack_unit(const sub *s)
{
    if (!b_ksteps(s))
        return PACK_UNIT;
    const int64_t u = PACK_STEPS / (s->npan > 0 ? s->npan : 1);
    return u > 0 ? u : 1;
}

/* Units of B packing work of s. */
static int64_t pack_items(const sub *s)
{
    return ceil_div(pack_span(s), pack_unit(s));
}

/* Bytes of B panels a sub-problem needs in the workspace: none when B is pre-packed. */
static int64_t sub_ws_packed(const sub *s, bool prepacked)
{
    return prepacked ? 0 : sub_packed(s);
}

/* ---- pre-packed B operands --------------------------------------------------------------------------- */

struct trex_gemm_packed {
    bool a;                  /* an A operand (trex_gemm_pack_a), else a B operand */
    int64_t N, K, Kp;        /* B: op(B) is [K, N]; A: op(A) is [N = M rows, K]. K padded to Kp */
    trex_dtype src;          /* the source type it was packed from */
    bool trans;              /* B: the source was stored [N, K] (tb); A: stored [K, M] (ta) */
    uint16_t *panels;        /* ceil(N/32) panels of 32 x Kp, VNNI format (B) or A format
                              * (kernels/gemm_panels.h) */
    size_t bytes;            /* of panels */
    bool view;               /* panels are the caller's (trex_gemm_packed_view_b): not freed here */
};

typedef struct pack_job {
    const trex_kernel_table *t;
    const trex_gemm_packed *p;
    const char *B;
    int64_t ldb;
} pack_job;

static void pack_panels(void *arg, int64_t p0, int64_t p1, int tid)
{
    (void)tid;
    const pack_job *j = arg;
    const trex_gemm_packed *p = j->p;
    const bool f32 = p->src == TREX_F32;
    const trex_pack_fn fn = p->a ? (f32 ? j->t->pack_a_f32 : j->t->pack_a_bf16)
                                 : (f32 ? j->t->pack_b_f32 : j->t->pack_b_bf16);
    /* Rows of the packed operand (op(A)'s rows, op(B)'s columns) are contiguous when A is stored
     * [K, M] or B is stored [K, N]. */
    const bool rows_contig = p->a ? p->trans : !p->trans;
    const int64_t rs = rows_contig ? 1 : j->ldb, ks = rows_contig ? j->ldb : 1;
    if (rows_contig && p1 - p0 > 1) {
        pack_steps(fn, p->panels, p->Kp, j->B, f32 ? 4 : 2, ks, p->N, p->K, p0, p1, 0, p->K);
        return;
    }
    for (int64_t q = p0; q < p1; q++)
        fn(p->panels + q * TREX_GEMM_NR * p->Kp,
           j->B + (size_t)(q * TREX_GEMM_NR * rs) * (f32 ? 4 : 2), rs, ks,
           min64(TREX_GEMM_NR, p->N - q * TREX_GEMM_NR), p->K, p->Kp);
}

size_t trex_gemm_pack_b_bytes(int64_t N, int64_t K)
{
    TREX_ASSERT(N >= 0 && K >= 0);
    return (size_t)(ceil_div(N, TREX_GEMM_NR) * TREX_GEMM_NR * ceil_div(K, TREX_GEMM_KU) *
                    TREX_GEMM_KU) * 2;
}

static void repack_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_packed *p,
                        const void *B, int64_t ldb)
{
    if (p->N == 0 || p->K == 0)
        return;
    TREX_ASSERT(B != NULL && ldb >= ((p->a ? !p->trans : p->trans) ? p->K : p->N));
    const pack_job j = {t, p, B, ldb};
    trex_pool_for(pool, ceil_div(p->N, TREX_GEMM_NR), 4, pack_panels, (void *)&j);
}

static trex_gemm_packed *pack_with(const trex_kernel_table *t, trex_pool *pool, bool a,
                                   trex_dtype in, bool trans, int64_t N, int64_t K, const void *B,
                                   int64_t ldb)
{
    TREX_ASSERT(t != NULL && (in == TREX_BF16 || in == TREX_F32) && N >= 0 && K >= 0);
    trex_gemm_packed *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->a = a;
    p->N = N;
    p->K = K;
    p->Kp = ceil_div(K, TREX_GEMM_KU) * TREX_GEMM_KU;
    p->src = in;
    p->trans = trans;
    p->bytes = trex_gemm_pack_b_bytes(N, K);
    p->panels = aligned_alloc(64, p->bytes ? (p->bytes + 63) / 64 * 64 : 64);
    if (!p->panels) {
        free(p);
        return NULL;
    }
    repack_with(t, pool, p, B, ldb);
    return p;
}

trex_gemm_packed *trex_gemm_pack_b_with(const trex_kernel_table *t, trex_pool *pool, trex_dtype in,
                                        bool tb, int64_t N, int64_t K, const void *B, int64_t ldb)
{
    return pack_with(t, pool, false, in, tb, N, K, B, ldb);
}

trex_gemm_packed *trex_gemm_pack_a_with(const trex_kernel_table *t, trex_pool *pool, trex_dtype in,
                                        bool ta, int64_t M, int64_t K, const void *A, int64_t lda)
{
    return pack_with(t, pool, true, in, ta, M, K, A, lda);
}

trex_gemm_packed *trex_gemm_pack_a(trex_pool *pool, trex_dtype in, bool ta, int64_t M, int64_t K,
                                   const void *A, int64_t lda)
{
    return trex_gemm_pack_a_with(trex_kernels_table(), pool, in, ta, M, K, A, lda);
}

void trex_gemm_repack_a(trex_pool *pool, trex_gemm_packed *p, const void *A, int64_t lda)
{
    TREX_ASSERT(p != NULL && p->a);
    repack_with(trex_kernels_table(), pool, p, A, lda);
}

bool trex_gemm_packed_is_a(const trex_gemm_packed *p)
{
    TREX_ASSERT(p != NULL);
    return p->a;
}

trex_gemm_packed *trex_gemm_pack_b(trex_pool *pool, trex_dtype in, bool tb, int64_t N, int64_t K,
                                   const void *B, int64_t ldb)
{
    return trex_gemm_pack_b_with(trex_kernels_table(), pool, in, tb, N, K, B, ldb);
}

void trex_gemm_repack_b(trex_pool *pool, trex_gemm_packed *p, const void *B, int64_t ldb)
{
    TREX_ASSERT(p != NULL && !p->a && !p->view);
    repack_with(trex_kernels_table(), pool, p, B, ldb);
}

trex_gemm_packed *trex_linear_pack_weight(trex_pool *pool, trex_linear_use use, const float *W,
                                          int64_t out, int64_t in)
{
    TREX_ASSERT(use == TREX_LINEAR_FWD || use == TREX_LINEAR_DX);
    /* forward y = x W^T: op(B) = W^T, [K = in, N = out], stored [N, K] (tb);
     * input gradient dx = dy W: op(B) = W, [K = out, N = in], stored [K, N]. */
    return use == TREX_LINEAR_FWD ? trex_gemm_pack_b(pool, TREX_F32, true, out, in, W, in)
                                  : trex_gemm_pack_b(pool, TREX_F32, false, in, out, W, in);
}

size_t trex_gemm_packed_bytes(const trex_gemm_packed *p)
{
    return p ? sizeof *p + (p->view ? 0 : p->bytes) : 0;
}

int64_t trex_gemm_packed_n(const trex_gemm_packed *p)
{
    TREX_ASSERT(p != NULL);
    return p->N;
}

int64_t trex_gemm_packed_k(const trex_gemm_packed *p)
{
    TREX_ASSERT(p != NULL);
    return p->K;
}

void trex_gemm_packed_free(trex_gemm_packed *p)
{
    if (!p)
        return;
    if (!p->view)
        free(p->panels);
    free(p);
}

/* ---- packed B over the caller's memory -------------------------------------------------------------- */

trex_gemm_packed *trex_gemm_packed_view_b(int64_t N, int64_t K, const uint16_t *panels)
{
    TREX_ASSERT(N >= 0 && K >= 0 && (panels != NULL || N == 0 || K == 0) &&
                (uintptr_t)panels % 64 == 0);
    trex_gemm_packed *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->N = N;
    p->K = K;
    p->Kp = ceil_div(K, TREX_GEMM_KU) * TREX_GEMM_KU;
    p->src = TREX_BF16;
    p->panels = (uint16_t *)panels;
    p->bytes = trex_gemm_pack_b_bytes(N, K);
    p->view = true;
    return p;
}

const uint16_t *trex_gemm_packed_panels(const trex_gemm_packed *p)
{
    TREX_ASSERT(p != NULL);
    return p->panels;
}

/* Element (n, k) of op(B)^T in the VNNI panels of an operand with Kp = kp (kernels/gemm_panels.h). */
static size_t vnni_at(int64_t n, int64_t k, int64_t kp)
{
    return (size_t)((n / TREX_GEMM_NR) * TREX_GEMM_NR * kp + (k / 2) * (2 * TREX_GEMM_NR) +
                    (n % TREX_GEMM_NR) * 2 + k % 2);
}

/* trex_gemm_pack_b_range packs whole steps RANGE_SLAB k at a time into the calling thread's slab, then
 * copies them to the panels with the fused table's copy_nt (non-temporal stores where the level has
 * them): the panels are written once per weight update and read by products much later, so ordinary
 * stores would first read every line of them into the cache (twice the memory traffic). */
#define RANGE_SLAB 256
static _Thread_local _Alignas(64) uint16_t range_slab[RANGE_SLAB * TREX_GEMM_NR];

/* The interior of [lo, hi) on 32-element boundaries (end == the operand's end counts as one):
 * [*a, *b), empty (a == b) when there is none. */
static void aligned_part(int64_t lo, int64_t hi, int64_t end, int64_t *a, int64_t *b)
{
    const int64_t u = TREX_GEMM_KU;
    *a = lo % u == 0 ? lo : min64((lo / u + 1) * u, hi);
    *b = hi == end ? hi : hi / u * u;
    if (*b < *a)
        *b = *a;
}

void trex_gemm_pack_b_range_with(const trex_kernel_table *t, uint16_t *panels, int64_t N, int64_t K,
                                 trex_dtype in, bool tb, const void *B, int64_t ldb, int64_t n0,
                                 int64_t n1, int64_t k0, int64_t k1)
{
    TREX_ASSERT(t != NULL && (in == TREX_BF16 || in == TREX_F32) && 0 <= n0 && n0 <= n1 && n1 <= N &&
                0 <= k0 && k0 <= k1 && k1 <= K);
    if (n0 == n1 || k0 == k1)
        return;
    TREX_ASSERT(panels != NULL && B != NULL && ldb >= (tb ? k1 - k0 : n1 - n0));
    const bool f32 = in == TREX_F32;
    const size_t es = f32 ? 4 : 2;
    const int64_t kp = ceil_div(K, TREX_GEMM_KU) * TREX_GEMM_KU;
    const int64_t np = ceil_div(N, TREX_GEMM_NR) * TREX_GEMM_NR;
    const int64_t rs = tb ? ldb : 1, ks = tb ? 1 : ldb; /* op(B)^T[n][k] = B[(n-n0)*rs + (k-k0)*ks] */
    const char *src = B;
    int64_t na, nb, ka, kb;
    aligned_part(n0, n1, N, &na, &nb);
    aligned_part(k0, k1, K, &ka, &kb);
    /* Whole 32 x 32 steps (and the operand's last, zero-padded ones) with the level's packer, into a
     * slab of the thread's that is then streamed to the panels. */
    if (na < nb && ka < kb) {
        const trex_pack_fn fn = f32 ? t->pack_b_f32 : t->pack_b_bf16;
        for (int64_t n = na; n < nb; n += TREX_GEMM_NR)
            for (int64_t k = ka; k < kb; k += RANGE_SLAB) {
                const int64_t kc = min64(RANGE_SLAB, kb - k), kcp = ceil_div(kc, TREX_GEMM_KU) * TREX_GEMM_KU;
                fn(range_slab, src + (size_t)((n - n0) * rs + (k - k0) * ks) * es, rs, ks,
                   min64(TREX_GEMM_NR, nb - n), kc, kcp);
                /* a whole number of steps (32 x 32 bf16): an even count, copied as floats */
                trex_fused()->copy_nt((float *)(void *)(panels + vnni_at(n, k, kp)),
                                      (const float *)(const void *)range_slab, kcp * TREX_GEMM_NR / 2);
            }
    }
    /* The rest element by element, rounded as the packers round. */
    for (int64_t n = n0; n < n1; n++) {
        const bool inner = n >= na && n < nb && ka < kb;
        for (int64_t k = k0; k < k1; k++) {
            if (inner && k >= ka && k < kb)
                k = kb;
            if (k >= k1)
                break;
            const size_t at = (size_t)((n - n0) * rs + (k - k0) * ks);
            panels[vnni_at(n, k, kp)] = f32 ? trex_f32_to_bf16(((const float *)B)[at])
                                            : ((const uint16_t *)B)[at];
        }
        if (k1 == K)
            for (int64_t k = K; k < kp; k++)
                panels[vnni_at(n, k, kp)] = 0;
    }
    /* Rows past N in the last panel are zeros. */
    if (n1 == N)
        for (int64_t n = N; n < np; n++)
            for (int64_t k = k0; k < (k1 == K ? kp : k1); k++)
                panels[vnni_at(n, k, kp)] = 0;
}

void trex_gemm_pack_b_range(uint16_t *panels, int64_t N, int64_t K, trex_dtype in, bool tb,
                            const void *B, int64_t ldb, int64_t n0, int64_t n1, int64_t k0, int64_t k1)
{
    trex_gemm_pack_b_range_with(trex_kernels_table(), panels, N, K, in, tb, B, ldb, n0, n1, k0, k1);
}

/* ---- the driver ------------------------------------------------------------------------------------- */

/* a_in: type of every A, or a_prepacked: every A is a trex_gemm_packed A operand whose rows and K
 * match the problem (lda and ta unused); b_in: type of every B, or prepacked: every B is a
 * trex_gemm_packed B operand whose N and K match the problem (ldb and tb unused). */
static void gemm_exec(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws, trex_dtype a_in,
                      bool a_prepacked, trex_dtype b_in, bool prepacked, bool b_pairs, bool ta, bool tb,
                      float alpha, float beta, const trex_gemm_problem *probs, int64_t count,
                      const int32_t *const *arows, const int32_t *const *brows, bool sym)
{
    TREX_ASSERT(t != NULL && count >= 0 && (count == 0 || probs != NULL));
    TREX_ASSERT((!arows || !a_prepacked) && (!brows || !prepacked));
    TREX_ASSERT(a_prepacked || a_in == TREX_BF16 || a_in == TREX_F32);
    TREX_ASSERT(prepacked || b_in == TREX_BF16 || b_in == TREX_F32);
    TREX_ASSERT(!sym || (count == 1 && probs[0].M == probs[0].N && !arows && !brows));
    TREX_ASSERT(!b_pairs || (t->gemm_ukr_f32b && b_in == TREX_F32 && tb && !prepacked && !brows && !sym));
    const size_t a_esz = a_in == TREX_F32 ? 4 : 2, b_esz = b_in == TREX_F32 ? 4 : 2;

    /* Count the sub-problems (problems cut along N); empty sums are done here. */
    int64_t nsubs = 0;
    for (int64_t p = 0; p < count; p++) {
        const trex_gemm_problem *q = &probs[p];
        TREX_ASSERT(q->M >= 0 && q->N >= 0 && q->K >= 0);
        if (prepacked) {
            const trex_gemm_packed *pk = q->B;
            TREX_ASSERT(pk != NULL && !pk->a && pk->N == q->N && pk->K == q->K);
        }
        if (a_prepacked) {
            const trex_gemm_packed *pk = q->A;
            TREX_ASSERT(pk != NULL && pk->a && pk->N == q->M && pk->K == q->K);
        }
        if (q->M == 0 || q->N == 0)
            continue;
        TREX_ASSERT(q->C != NULL && q->ldc >= q->N && (!q->D || q->ldd >= q->N));
        if (q->K == 0) {
            scale_c(q->C, q->M, q->N, q->ldc, beta, q->D ? q->D : q->C, q->D ? q->ldd : q->ldc);
            for (int64_t i = 0; sym && i < q->M; i++) /* above the diagonal: the mirror, as for K > 0 */
                for (int64_t j = 0; j < i; j++)
                    q->C[j * q->ldc + i] = q->C[i * q->ldc + j];
            continue;
        }
        TREX_ASSERT(q->A != NULL && q->B != NULL);
        TREX_ASSERT((a_prepacked || q->lda >= (ta ? q->M : q->K)) &&
                    (prepacked || q->ldb >= (tb ? (b_pairs ? q->K / 2 : q->K) : q->N)));
        TREX_ASSERT(!b_pairs || q->K % 2 == 0);
        nsubs += ceil_div(q->N, chunk_cols(ceil_div(q->K, TREX_GEMM_KU) * TREX_GEMM_KU));
    }
    if (nsubs == 0)
        return;

    const int nslots = trex_pool_size(pool);
    trex_gemm_ws local = {0};
    trex_gemm_ws *w = ws ? ws : &local;
    sub *subs = ws_grow(&w->subs, &w->subs_cap, (size_t)nsubs * sizeof *subs);
    int64_t ns = 0, ablock = 0, sblock = 0;
    double cbytes = 0;
    for (int64_t p = 0; p < count; p++) {
        const trex_gemm_problem *q = &probs[p];
        if (q->M == 0 || q->N == 0 || q->K == 0)
            continue;
        const int64_t Kp = ceil_div(q->K, TREX_GEMM_KU) * TREX_GEMM_KU;
        const int64_t cols = chunk_cols(Kp), mb = sym ? sym_block_rows(q->M, Kp, nslots) : block_rows(Kp);
        const int64_t b_rs = tb ? q->ldb : 1, b_ks = tb ? 1 : q->ldb;
        for (int64_t n0 = 0; n0 < q->N; n0 += cols) {
            sub *s = &subs[ns++];
            memset(s, 0, sizeof *s);
            s->M = q->M;
            s->N = min64(cols, q->N - n0);
            s->K = q->K;
            s->Kp = Kp;
            if (a_prepacked) {
                s->apan = ((const trex_gemm_packed *)q->A)->panels;
            } else {
                s->A = q->A;
                s->a_rs = ta ? 1 : q->lda;
                s->a_ks = ta ? q->lda : 1;
                s->arow = arows ? arows[p] : NULL;
                s->a_byr = !ta;
                s->lda = q->lda;
            }
            if (prepacked) {
                const trex_gemm_packed *pk = q->B;
                s->bpan = pk->panels + (n0 / TREX_GEMM_NR) * TREX_GEMM_NR * Kp;
            } else {
                s->brow = brows ? brows[p] : NULL;
                s->b_byr = tb;
                s->ldb = q->ldb;
                s->B = (const char *)q->B + (s->brow ? 0 : (size_t)(n0 * b_rs) * b_esz);
                s->b_rs = b_rs;
                s->b_ks = b_ks;
                s->b_pairs = b_pairs;
            }
            s->C = q->C + n0;
            s->D = (q->D ? q->D : q->C) + n0;
            s->ldd = q->D ? q->ldd : q->ldc;
            s->n0 = n0;
            s->ldc = q->ldc;
            s->mb = mb;
            s->npan = ceil_div(s->N, TREX_GEMM_NR);
            s->mblk = ceil_div(s->M, mb);
            s->nblk = ceil_div(s->N, NB);
            if (!a_prepacked)
                ablock = mb * Kp > ablock ? mb * Kp : ablock;
            if (Kp > KSLICE)
                sblock = mb * NB > sblock ? mb * NB : sblock;
            cbytes += 4.0 * (double)s->M * (double)s->N;
        }
    }
    TREX_ASSERT(ns == nsubs);

    /* Batches: consecutive sub-problems while their B panels fit BATCH_LIMIT (at least one). Size
     * the workspace for the largest. */
    int64_t max_pack = 0, max_items = 0;
    for (int64_t b = 0; b < nsubs;) {
        int64_t e = b, pack = 0, items_p = 0;
        while (e < nsubs &&
               (e == b || 2 * (pack + sub_ws_packed(&subs[e], prepacked)) <= BATCH_LIMIT)) {
            pack += sub_ws_packed(&subs[e], prepacked);
            items_p += prepacked ? 0 : pack_items(&subs[e]);
            e++;
        }
        const int64_t items_c = compute_items(NULL, subs, b, e, nslots, sym);
        max_pack = pack > max_pack ? pack : max_pack;
        max_items = items_p > max_items ? items_p : max_items;
        max_items = items_c > max_items ? items_c : max_items;
        b = e;
    }
    const int mode = alpha != 1.0f ? MODE_GENERAL : beta == 0.0f ? MODE_SET : MODE_ADD;
    const size_t bbytes = ((size_t)max_pack * 2 + 63) / 64 * 64;
    const size_t abytes = ((size_t)ablock * 2 + 63) / 64 * 64, sbytes = (size_t)sblock * sizeof(float);
    char *packed = ws_grow(&w->pack, &w->pack_cap, bbytes + (size_t)nslots * (abytes + sbytes));
    item *items = ws_grow(&w->items, &w->items_cap, (size_t)max_items * sizeof(item));
    atomic_llong next;

    run r = {.t = t, .pool = pool, .a_f32 = a_in == TREX_F32, .b_f32 = b_in == TREX_F32,
             .a_esz = a_esz, .b_esz = b_esz, .mode = mode, .sym = sym,
             .stream_add = mode == MODE_ADD && cbytes > (double)ADD_STREAM_LIMIT, .alpha = alpha, .beta = beta,
             .bpack = (uint16_t *)packed, .apack = (uint16_t *)(packed + bbytes),
             .ablock = (int64_t)(abytes / 2), .sums = (float *)(packed + bbytes + (size_t)nslots * abytes),
             .sblock = sblock, .items = items, .next = &next, .nslots = nslots};
    for (int64_t b = 0; b < nsubs;) {
        int64_t e = b, off = 0;
        while (e < nsubs &&
               (e == b || 2 * (off + sub_ws_packed(&subs[e], prepacked)) <= BATCH_LIMIT)) {
            if (!prepacked) {
                subs[e].b_off = off;
                subs[e].bpan = r.bpack + off;
            }
            off += sub_ws_packed(&subs[e], prepacked);
            e++;
        }
        r.subs = subs + b;

        int64_t n = 0;
        if (!prepacked) {
            for (int64_t s = b; s < e; s++) {
                const int64_t span = pack_span(&subs[s]), u = pack_unit(&subs[s]);
                for (int64_t p = 0; p < span; p += u)
                    items[n++] = (item){(int32_t)(s - b), (int32_t)p, (int32_t)min64(u, span - p), 0, 0};
            }
            r.nitems = n;
            atomic_init(&next, 0);
            trex_pool_for(pool, nslots, 1, pack_slots, &r);
        }

        r.nitems = compute_items(items, subs, b, e, nslots, sym);
        atomic_init(&next, 0);
        trex_pool_for(pool, nslots, 1, compute_slots, &r);
        b = e;
    }
    if (!ws)
        ws_free_buffers(&local);
}

/* gemm_exec, charged by shape to the calling thread's profiler when one is attached (trex/prof.h;
 * `trex bench step --gemm-profile`). */
static void gemm_run(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws, trex_dtype a_in,
                     bool a_prepacked, trex_dtype b_in, bool prepacked, bool b_pairs, bool ta, bool tb,
                     float alpha, float beta, const trex_gemm_problem *probs, int64_t count,
                     const int32_t *const *arows, const int32_t *const *brows, bool sym)
{
    if (!trex_prof_gemm_on()) {
        gemm_exec(t, pool, ws, a_in, a_prepacked, b_in, prepacked, b_pairs, ta, tb, alpha, beta, probs, count,
                  arows, brows, sym);
        return;
    }
    const double t0 = trex_wall_s();
    gemm_exec(t, pool, ws, a_in, a_prepacked, b_in, prepacked, b_pairs, ta, tb, alpha, beta, probs, count, arows,
              brows, sym);
    trex_prof_gemm g = {.groups = count, .seconds = trex_wall_s() - t0};
    const int64_t kv = b_pairs ? 2 : 1; /* the fp32-pair format counts each k twice */
    for (int64_t p = 0; p < count; p++) {
        g.m += probs[p].M;
        g.flops += (sym ? (double)probs[p].M + 1.0 : 2.0 * (double)probs[p].N) * (double)probs[p].M *
                   (double)(probs[p].K / kv);
    }
    if (count > 0) {
        g.n = probs[0].N;
        g.k = probs[0].K / kv;
    }
    g.layout = (ta ? TREX_PROF_GEMM_TA : 0u) | (tb ? TREX_PROF_GEMM_TB : 0u) |
               (a_prepacked ? TREX_PROF_GEMM_A_PACKED : a_in == TREX_F32 ? TREX_PROF_GEMM_A_F32 : 0u) |
               (prepacked  ? TREX_PROF_GEMM_B_PACKED
                : b_pairs  ? TREX_PROF_GEMM_B_EXACT
                : b_in == TREX_F32 ? TREX_PROF_GEMM_B_F32
                                   : 0u) |
               (arows ? TREX_PROF_GEMM_A_ROWS : 0u) | (brows ? TREX_PROF_GEMM_B_ROWS : 0u) |
               (beta != 0.0f ? TREX_PROF_GEMM_ACCUMULATE : 0u) |
               (alpha != 1.0f || (beta != 0.0f && beta != 1.0f) ? TREX_PROF_GEMM_SCALED : 0u) |
               (sym ? TREX_PROF_GEMM_SYM : 0u);
    trex_prof_gemm_add(&g);
}

void trex_gemm_grouped_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws,
                            trex_dtype in, bool ta, bool tb, float alpha, float beta,
                            const trex_gemm_problem *probs, int64_t count)
{
    gemm_run(t, pool, ws, in, false, in, false, false, ta, tb, alpha, beta, probs, count, NULL, NULL, false);
}

void trex_gemm_grouped_prepacked_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws,
                                      trex_dtype a_in, bool ta, float alpha, float beta,
                                      const trex_gemm_problem *probs, int64_t count)
{
    gemm_run(t, pool, ws, a_in, false, TREX_BF16, true, false, ta, false, alpha, beta, probs, count, NULL, NULL,
             false);
}

void trex_gemm_grouped_prepacked_rows_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws,
                                           trex_dtype a_in, float alpha, float beta,
                                           const trex_gemm_problem *probs, const int32_t *const *arows,
                                           int64_t count)
{
    TREX_ASSERT(arows != NULL || count == 0);
    gemm_run(t, pool, ws, a_in, false, TREX_BF16, true, false, false, false, alpha, beta, probs, count, arows, NULL,
             false);
}

void trex_gemm_grouped_prepacked_rows(trex_pool *pool, trex_gemm_ws *ws, trex_dtype a_in, float alpha,
                                      float beta, const trex_gemm_problem *probs,
                                      const int32_t *const *arows, int64_t count)
{
    trex_gemm_grouped_prepacked_rows_with(trex_kernels_table(), pool, ws, a_in, alpha, beta, probs, arows,
                                          count);
}

void trex_gemm_grouped_rows_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws, trex_dtype in,
                                 bool ta, bool tb, float alpha, float beta, const trex_gemm_problem *probs,
                                 const int32_t *const *arows, const int32_t *const *brows, int64_t count)
{
    gemm_run(t, pool, ws, in, false, in, false, false, ta, tb, alpha, beta, probs, count, arows, brows, false);
}

void trex_gemm_grouped_rows(trex_pool *pool, trex_gemm_ws *ws, trex_dtype in, bool ta, bool tb, float alpha,
                            float beta, const trex_gemm_problem *probs, const int32_t *const *arows,
                            const int32_t *const *brows, int64_t count)
{
    trex_gemm_grouped_rows_with(trex_kernels_table(), pool, ws, in, ta, tb, alpha, beta, probs, arows, brows,
                                count);
}

void trex_gemm_grouped(trex_pool *pool, trex_gemm_ws *ws, trex_dtype in, bool ta, bool tb,
                       float alpha, float beta, const trex_gemm_problem *probs, int64_t count)
{
    trex_gemm_grouped_with(trex_kernels_table(), pool, ws, in, ta, tb, alpha, beta, probs, count);
}

void trex_gemm_grouped_mixed(trex_pool *pool, trex_gemm_ws *ws, trex_dtype a_in, trex_dtype b_in,
                             bool ta, bool tb, float alpha, float beta,
                             const trex_gemm_problem *probs, int64_t count)
{
    gemm_run(trex_kernels_table(), pool, ws, a_in, false, b_in, false, false, ta, tb, alpha, beta, probs,
             count, NULL, NULL, false);
}

void trex_gemm_grouped_prepacked(trex_pool *pool, trex_gemm_ws *ws, trex_dtype a_in, bool ta,
                                 float alpha, float beta, const trex_gemm_problem *probs,
                                 int64_t count)
{
    trex_gemm_grouped_prepacked_with(trex_kernels_table(), pool, ws, a_in, ta, alpha, beta, probs,
                                     count);
}

void trex_gemm_prepacked(trex_pool *pool, trex_gemm_ws *ws, trex_dtype a_in, bool ta, int64_t M,
                         float alpha, const void *A, int64_t lda, const trex_gemm_packed *B,
                         float beta, float *C, int64_t ldc)
{
    TREX_ASSERT(B != NULL && !B->a);
    const trex_gemm_problem p = {M, B->N, B->K, A, lda, B, 0, C, ldc, NULL, 0};
    trex_gemm_grouped_prepacked_with(trex_kernels_table(), pool, ws, a_in, ta, alpha, beta, &p, 1);
}

void trex_gemm_prepacked_a_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws,
                                const trex_gemm_packed *A, trex_dtype b_in, bool tb, int64_t N,
                                float alpha, const void *B, int64_t ldb, float beta, float *C,
                                int64_t ldc)
{
    TREX_ASSERT(A != NULL && A->a && (b_in == TREX_BF16 || b_in == TREX_F32));
    const trex_gemm_problem p = {A->N, N, A->K, A, 0, B, ldb, C, ldc, NULL, 0};
    gemm_run(t, pool, ws, TREX_BF16, true, b_in, false, false, false, tb, alpha, beta, &p, 1, NULL, NULL, false);
}

void trex_gemm_prepacked_a(trex_pool *pool, trex_gemm_ws *ws, const trex_gemm_packed *A,
                           trex_dtype b_in, bool tb, int64_t N, float alpha, const void *B,
                           int64_t ldb, float beta, float *C, int64_t ldc)
{
    trex_gemm_prepacked_a_with(trex_kernels_table(), pool, ws, A, b_in, tb, N, alpha, B, ldb, beta,
                               C, ldc);
}

void trex_gemm_bf16(trex_pool *pool, trex_gemm_ws *ws, bool ta, bool tb, int64_t M, int64_t N,
                    int64_t K, float alpha, const uint16_t *A, int64_t lda, const uint16_t *B,
                    int64_t ldb, float beta, float *C, int64_t ldc)
{
    const trex_gemm_problem p = {M, N, K, A, lda, B, ldb, C, ldc, NULL, 0};
    trex_gemm_grouped_with(trex_kernels_table(), pool, ws, TREX_BF16, ta, tb, alpha, beta, &p, 1);
}

void trex_gemm_f32_bf16(trex_pool *pool, trex_gemm_ws *ws, bool ta, bool tb, int64_t M, int64_t N,
                        int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                        int64_t ldb, float beta, float *C, int64_t ldc)
{
    const trex_gemm_problem p = {M, N, K, A, lda, B, ldb, C, ldc, NULL, 0};
    trex_gemm_grouped_with(trex_kernels_table(), pool, ws, TREX_F32, ta, tb, alpha, beta, &p, 1);
}

void trex_gemm_bf16_f32b_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws, int64_t M, int64_t N,
                              int64_t K, float alpha, const uint16_t *A, int64_t lda, const float *B, int64_t ldb,
                              float beta, float *C, int64_t ldc)
{
    if (!t->gemm_ukr_f32b)
        TREX_ABORT("trex_gemm_bf16_f32b: level %s multiplies bf16 values only (trex_gemm_f32b_native is false)",
                   trex_isa_name(t->isa));
    TREX_ASSERT(K >= 0 && (M == 0 || N == 0 || K == 0 || lda >= 2 * K));
    const trex_gemm_problem p = {M, N, 2 * K, A, lda, B, ldb, C, ldc, NULL, 0};
    gemm_run(t, pool, ws, TREX_BF16, false, TREX_F32, false, true, false, true, alpha, beta, &p, 1, NULL, NULL,
             false);
}

bool trex_gemm_f32b_native(void)
{
    return trex_kernels_table()->gemm_ukr_f32b != NULL;
}

void trex_gemm_bf16_f32b(trex_pool *pool, trex_gemm_ws *ws, int64_t M, int64_t N, int64_t K, float alpha,
                         const uint16_t *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                         int64_t ldc)
{
    trex_gemm_bf16_f32b_with(trex_kernels_table(), pool, ws, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void trex_gemm_syrk_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws, trex_dtype in, bool trans,
                         int64_t n, int64_t k, float alpha, const void *X, int64_t ldx, float beta, float *C,
                         int64_t ldc, const float *D, int64_t ldd)
{
    TREX_ASSERT(in == TREX_BF16 || in == TREX_F32);
    const trex_gemm_problem p = {n, n, k, X, ldx, X, ldx, C, ldc, D, ldd};
    gemm_run(t, pool, ws, in, false, in, false, false, trans, !trans, alpha, beta, &p, 1, NULL, NULL, true);
}

void trex_gemm_syrk(trex_pool *pool, trex_gemm_ws *ws, trex_dtype in, bool trans, int64_t n, int64_t k,
                    float alpha, const void *X, int64_t ldx, float beta, float *C, int64_t ldc, const float *D,
                    int64_t ldd)
{
    trex_gemm_syrk_with(trex_kernels_table(), pool, ws, in, trans, n, k, alpha, X, ldx, beta, C, ldc, D, ldd);
}

void trex_cvt_f32_bf16(uint16_t *dst, const float *src, int64_t n)
{
    TREX_ASSERT(n >= 0);
    trex_kernels_table()->cvt_f32_bf16(dst, src, n);
}

void trex_cvt_bf16_f32(float *dst, const uint16_t *src, int64_t n)
{
    TREX_ASSERT(n >= 0);
    trex_kernels_table()->cvt_bf16_f32(dst, src, n);
}

void trex_split_bf16(uint16_t *hi, uint16_t *lo, const float *x, int64_t n)
{
    float back[256], rest[256];
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        const int64_t k = n - i0 < 256 ? n - i0 : 256;
        trex_cvt_f32_bf16(hi + i0, x + i0, k);
        trex_cvt_bf16_f32(back, hi + i0, k);
        for (int64_t i = 0; i < k; i++)
            rest[i] = x[i0 + i] - back[i];
        trex_cvt_f32_bf16(lo + i0, rest, k);
    }
}

typedef struct split_job {
    const float *src;
    uint16_t *dst;
    int64_t n, hi0, lo0, hi1;
    int nt;
    const trex_fused_table *fz;
} split_job;

static void split_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const split_job *j = arg;
    j->fz->split3(j->dst + i0 * 3 * j->n, j->src + i0 * j->n, i1 - i0, j->n, j->hi0, j->lo0, j->hi1, j->nt);
}

/* Outputs of at least this many bytes are written around the cache (the fused split3's nt): the LM
 * head's W3 (794 MB at dsv4-bench) is read again only by the next GEMM's packing, long after the cache
 * has turned over, and streaming stores skip the read for ownership of every line. */
#define SPLIT_STREAM_BYTES ((int64_t)64 << 20)

/* Rows per unit of the pool for the row splits: about 4096 values each. */
static int64_t split_grain(int64_t n)
{
    return n >= 4096 ? 1 : 4096 / (n > 0 ? n : 1);
}

typedef struct split2_job {
    uint16_t *dst;
    const float *src;
    int64_t n;
    bool weight;
    trex_fused_cvt_bf16_nt_fn cvt_nt; /* weight: NULL, or the streaming conversion */
} split2_job;

static void split2_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const split2_job *j = arg;
    const int64_t n = j->n;
    for (int64_t i = i0; i < i1; i++) {
        uint16_t *row = j->dst + i * 2 * n;
        const float *x = j->src + i * n;
        if (!j->weight) {
            trex_split_bf16(row, row + n, x, n);
        } else if (j->cvt_nt) {
            j->cvt_nt(row, x, n);
            j->cvt_nt(row + n, x, n);
        } else {
            trex_cvt_f32_bf16(row, x, n);
            memcpy(row + n, row, (size_t)n * sizeof *row);
        }
    }
}

void trex_split_bf16x2_rows(trex_pool *pool, uint16_t *dst, const float *src, int64_t rows, int64_t n,
                            bool weight)
{
    TREX_ASSERT(rows >= 0 && n >= 0);
    split2_job j = {dst, src, n, weight,
                    weight && rows * 2 * n * 2 >= SPLIT_STREAM_BYTES ? trex_fused()->cvt_bf16_nt : NULL};
    trex_pool_for(pool, rows, split_grain(n), split2_rows, &j);
}

typedef struct spread_job {
    uint16_t *dst;
    const float *src;
    int64_t n;
} spread_job;

static void spread_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const spread_job *j = arg;
    uint16_t h[256];
    for (int64_t i = i0; i < i1; i++) {
        uint16_t *row = j->dst + i * 2 * j->n;
        for (int64_t k0 = 0; k0 < j->n; k0 += 256) {
            const int64_t kn = j->n - k0 < 256 ? j->n - k0 : 256;
            trex_cvt_f32_bf16(h, j->src + i * j->n + k0, kn);
            for (int64_t k = 0; k < kn; k++)
                row[2 * (k0 + k)] = row[2 * (k0 + k) + 1] = h[k];
        }
    }
}

void trex_spread_bf16_rows(trex_pool *pool, uint16_t *dst, const float *src, int64_t rows, int64_t n)
{
    TREX_ASSERT(rows >= 0 && n >= 0);
    spread_job j = {dst, src, n};
    trex_pool_for(pool, rows, split_grain(n), spread_rows, &j);
}

/* One pass of the fused table's split3 per block of rows (hi, x - hi and lo in registers; the same bits
 * as trex_split_bf16), rows over the pool. */
void trex_split_bf16x3_rows(trex_pool *pool, uint16_t *dst, const float *src, int64_t rows, int64_t n,
                            int64_t hi0, int64_t lo0, int64_t hi1)
{
    TREX_ASSERT(rows >= 0 && n >= 0);
    split_job j = {src, dst, n, hi0, lo0, hi1, rows * 3 * n * 2 >= SPLIT_STREAM_BYTES, trex_fused()};
    trex_pool_for(pool, rows, split_grain(n), split_rows, &j);
}
