/* kernels/fused.h — fused element-wise and attention kernels of the model (issue 4, items 3 and 5).
 *
 * The model's non-GEMM work (attention over the window, the compressed entries and the sink; the mHC
 * residual mixes) runs through one small table of entry points, chosen once per process from the
 * level of the kernel dispatch (trex_kernels_isa(), so TREX_ISA caps it too): the plain-C reference
 * (kernels/ref/fused.c, the scalar code of model/attention_math.h and model/mhc_real.h) or the AVX-512
 * leaves (kernels/x86/avx512/fused.c, reached only through this table); the amx level is the AVX-512
 * table plus the bf16 attention core on AMX tiles (sattn_*_bf16 below, bf16 compute mode only), the
 * avx512f level the AVX-512 leaves compiled without AVX512_BF16 and a bf16 attention core on tiles of
 * fp32 FMAs (kernels/x86/avx512f/), and the avx2 level leaves of its own (kernels/x86/avx2/: the
 * reference's bits) but for the fp32 attention core, the router's and mHC's skinny products, the
 * cross-entropy's scalar exp and the bf16x3 split, which are the reference's, and the bf16 attention
 * core on tiles of fp32 FMAs (kernels/x86/avx2/attn.c: the avx512f level's bits).
 *
 * Every fp32 variant gives the reference's bits. The leaves vectorise across the independent sums (16
 * partial sums of a dot product are one 512-bit register; several dot products run at once) and keep,
 * per output element, the reference's order of operations and its separate multiply and add (no fused
 * multiply-add: the build is ISO C, so the compiler never contracts either). exp and log stay libm's
 * scalar expf / logf calls. So a model run gives the same output files at every level and for any
 * thread count, and the fp32 model's agreement with the PyTorch reference is unchanged.
 * tests/test_fused.c checks every level against the reference bit for bit on awkward shapes.
 *
 * Attention (one query, H heads q_h = q[h*c ..], n entries V[e] of c floats that serve as key and
 * value; docs/attention.md): the functions are exactly am_sattn_forward_f, am_sattn_backward_query_f,
 * am_sattn_backward_entries_f and am_dot_f of model/attention_math.h, plus a scratch argument ws of
 * TREX_FUSED_SATTN_WS(n, H) floats (the reference ignores it). */
#ifndef TREX_KERNELS_FUSED_H
#define TREX_KERNELS_FUSED_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/dispatch.h"

/* Floats of scratch the attention entries need for n entries and H heads. */
#define TREX_FUSED_SATTN_WS(n, H) (4 * (int64_t)(H) * (int64_t)(n) + 16)

/* Floats of scratch the bf16 attention entries (sattn_*_bf16 below) need for n entries, H heads of c
 * dims: bf16 copies of q, g and the entries (row-major and pair-interleaved), the score tiles, P and dZ
 * in bf16, the key side's [P | scale dZ] rows and [G ; Q] panel, and 64-byte alignment slack. Covers the
 * reference's needs too. Heads round up to 16, c to 32, n to 32. */
#define TREX_FUSED_SATTN_HP(H) (((int64_t)(H) + 15) / 16 * 16)
#define TREX_FUSED_SATTN_CP(c) (((int64_t)(c) + 31) / 32 * 32)
#define TREX_FUSED_SATTN_NP(n) (((int64_t)(n) + 31) / 32 * 32)
#define TREX_FUSED_SATTN_BF16_WS(n, H, c)                                                       \
    (5 * TREX_FUSED_SATTN_HP(H) * TREX_FUSED_SATTN_CP(c) +                                      \
     2 * TREX_FUSED_SATTN_NP(n) * TREX_FUSED_SATTN_CP(c) +                                      \
     4 * TREX_FUSED_SATTN_NP(n) * TREX_FUSED_SATTN_HP(H) + 2 * (int64_t)(H) * (int64_t)(c) +    \
     2 * (int64_t)(H) * (int64_t)(n) + 3 * (int64_t)(c) + 4 * (int64_t)(H) + 16 * 16)

/* sum_i a_i b_i over 16 interleaved partial sums combined in a fixed tree (am_dot_f). */
typedef float (*trex_fused_dot_fn)(const float *a, const float *b, int64_t n);
/* y[i] += a * x[i] for i < n (a multiply, then an add: am_axpy_f's bits; the indexer KL gradients). */
typedef void (*trex_fused_axpy_fn)(float *y, float a, const float *x, int64_t n);
/* Many axpys at once: for r < R, j < J ascending, with k = r*sr + j*sj: when on[k] != 0,
 * Y_r[i] += A[k] * X[j][i] for i < c (Y_r = Y + r*ldy), each term exactly as the axpy above (so the
 * bits of those R*J axpy calls in that order per row); terms with on[k] == 0 are skipped. The rows
 * Y_r stay in registers over the J terms (the indexer KL gradients: diq_h += sum_s a_sh K_s, and
 * dK_s += sum_h a_sh iq_h). */
typedef void (*trex_fused_axpy_rows_fn)(float *Y, int64_t ldy, int64_t R, const float *A,
                                        const unsigned char *on, int64_t sr, int64_t sj,
                                        const float *const *X, int64_t J, int64_t c);
/* The indexer KL's gradients of one query through its n entries (model/attention.c, docs/attention.md
 * §3), with a = ia[h*n + i] (head h's score of entry i) and "active" meaning a > 0 (a NaN is not):
 *   kl_qgrad  for i < n ascending, h < nI ascending: dhw[h] += active ? dI[i] * a : +0, and when
 *             active diq[h*cI + f] += (dI[i] * hw[h]) * K[i][f] for f < cI;
 *   kl_kgrad  for i < n, h < nI ascending, when active: dK[i][f] += (dI[i] * hw[h]) * X[h*cI + f];
 * each product rounded, then the add (am_axpy_f's bits; the rows of dK are distinct). Every level
 * gives the bits of those loops (one call per query instead of one axpy per active head and entry). */
typedef void (*trex_fused_kl_qgrad_fn)(float *diq, float *dhw, const float *ia, const float *dI,
                                       const float *hw, const float *const *K, int64_t n, int64_t nI,
                                       int64_t cI);
typedef void (*trex_fused_kl_kgrad_fn)(float *const *dK, const float *ia, const float *dI,
                                       const float *hw, const float *X, int64_t n, int64_t nI,
                                       int64_t cI);
/* dst[0..n) = src[0..n) (floats, not overlapping); the stores may bypass the cache (a destination
 * that is read back only much later: the attention output rows, model/attention.c), and are complete
 * (fenced) when the call returns. */
typedef void (*trex_fused_copy_nt_fn)(float *dst, const float *src, int64_t n);
/* dst[0..n) = src[0..n) rounded to bf16 (trex_cvt_f32_bf16's bits: nearest even, NaN quieted), the
 * stores as copy_nt's (model/attention.c's layer-wide bf16 copies of q, g and dq, read in a later
 * pass). */
typedef void (*trex_fused_cvt_bf16_nt_fn)(uint16_t *dst, const float *src, int64_t n);
/* RoPE of nv vectors v + k*ld (k < nv), each rotated on its 2 half floats from v + k*ld: pair i =
 * (x[2i], x[2i+1]) becomes (x[2i] c_i - x[2i+1] s_i, x[2i] s_i + x[2i+1] c_i) with c_i = cs[i], s_i =
 * sn[i] (inverse: -sn[i]), each product rounded, then the difference (sum): the bits of
 * model/rope.c's trex_rope_rotate (model/attention.c: a token's heads of q, g, dq and o). */
typedef void (*trex_fused_rope_fn)(float *v, int64_t nv, int64_t ld, const float *cs,
                                   const float *sn, int64_t half, int inverse);
/* The weightless per-head RMS backward of one token's H heads of c floats, in place (model/attention.c,
 * the q path): per head h, with g_h = g + h c, q_h = q + h c: m = dot(g_h, q_h, c) / (float)c (the dot
 * above), then g_h[i] = rs[h] (g_h[i] - q_h[i] m) (a multiply, a subtract, a multiply). */
typedef void (*trex_fused_rms_head_bwd_fn)(float *g, const float *q, const float *rs, int64_t H,
                                           int64_t c);
/* out[r*n + e] = dot(A + r*lda, V[e], c) for r < R, e < n, each exactly as the dot above. */
typedef void (*trex_fused_dots_fn)(float *out, const float *A, int64_t lda, int64_t R,
                                   const float *const *V, int64_t n, int64_t c);

/* am_sattn_forward_f: z_he = scale q_h.v_e, lse_h = log(sum_e exp z_he + exp sink_h),
 * o_h = sum_e exp(z_he - lse_h) v_e. Writes o [H*c], lse [H], z [H*n] (row h). n may be 0. */
typedef void (*trex_fused_sattn_fwd_fn)(float *o, float *lse, float *z, float *ws, const float *q,
                                        const float *const *V, int64_t n, int64_t H, int64_t c,
                                        const float *sink, float scale);

/* am_sattn_backward_query_f: given g = dL/do [H*c], lse and D (= g.o per head): p_e = exp(scale
 * q.v_e - lse), dz_e = p_e (g.v_e - D), dq = scale sum_e dz_e v_e, dsink = -exp(sink - lse) D.
 * Writes dq [H*c], dsink [H] and, when P is not NULL, p into P [H*n] (row h). */
typedef void (*trex_fused_sattn_bwd_query_fn)(float *dq, float *dsink, float *P, float *ws,
                                              const float *g, const float *q,
                                              const float *const *V, int64_t n, int64_t H,
                                              int64_t c, const float *sink, float scale,
                                              const float *lse, const float *D);

/* am_sattn_backward_entries_f: dV[e] += sum_h (p_he g_h + scale dz_he q_h), heads ascending
 * (accumulates); psum[e] = sum_h p_he (written). */
typedef void (*trex_fused_sattn_bwd_entries_fn)(float *const *dV, float *psum, float *ws,
                                                const float *const *V, int64_t n, const float *q,
                                                const float *g, int64_t H, int64_t c, float scale,
                                                const float *lse, const float *D);

/* bf16 variants of the three attention entries (bf16 compute mode, docs/precision.md): the same
 * contracts and arguments as the three above, except that ws holds TREX_FUSED_SATTN_BF16_WS(n, H, c)
 * floats and every matrix product takes bf16-rounded operands (round to nearest even) with fp32 sums:
 * q, g and the entries V[e] are rounded to bf16; scores z = scale (q.v) and dP = g.v are fp32 sums of
 * exact bf16 products; the softmax, exp, log and lse stay fp32; the forward's o = sum_e bf(p_e) v_e
 * with p_e = exp(z_e - mx) / den (den = exp(sink - mx) + sum_e exp(z_e - mx), lse = mx + log den);
 * the query side's dq = scale sum_e bf(dz_e) v_e; the key side's dV[e] += sum_h bf(p_he) g_h +
 * bf(scale dz_he) q_h (summed in fp32 over the 2H terms, then added to dV[e]). P, psum, dsink and z
 * are fp32 as in the fp32 entries. kernels/ref/attn_bf16.c defines the semantics (a fixed order of
 * the fp32 sums); the tile leaves (kernels/x86/attn_tiles.h: AMX's tile unit, or VDPBF16PS on
 * AVX-512) sum in their own order and use a vector exp (about 1 ulp), so they agree with the reference within fp32 rounding (and rare one-ulp
 * flips of a bf16-rounded p or dz); tests/test_attn_bf16.c states the bounds. Each entry's results
 * depend only on that entry and the query, not on which other entries share the call.
 * One more argument than the fp32 entries, Vb after V: NULL, or the entries already rounded, Vb[e] =
 * bf(V[e]) (c bf16 values each; model/attention.c rounds kv and the compressed entries once per
 * layer), which the leaves then copy instead of rounding V[e] again (the same results). Likewise qb
 * after q and gb after g: NULL, or q (g) already rounded, qb = bf(q) [H*c] (model/attention.c rounds q
 * and the output gradient once per layer), which the leaves read instead of rounding q (g) on every
 * call (the same results); q (g) may then be NULL.
 * The forward's z may be NULL (not written), and it takes P after z: NULL, or [H*n] (row h) the
 * probabilities p_he = exp(z_he - mx_h) / den_h in fp32 (before the rounding of the output product;
 * the indexer KL terms' attention mass, model/attention.c).
 * The forward and the query side take one more, Wp after Vb: NULL, or the first Wp->n entries as
 * consecutive rows of a layer-wide copy in the pair layout below (the window of a query: rows of kv),
 * which the output product then reads in place instead of interleaving them per call (the same
 * results: every entry still enters each sum in its place, with exact zero terms around them). */
/* Pair layout of bf16 rows of c dims (c a multiple of 32): pair row k = rows + 2k c holds rows 2k and
 * 2k + 1 interleaved per 16 dims (32 values (x[16j + i], y[16j + i]), i < 16, for dims chunk j), the
 * B-tile layout of TDPBF16PS. Entry e < n is row first + e. Pair rows up to row first + n + 31 must be
 * readable and finite (the leaf may read up to a 32-entry step past the last one with weight 0).
 * model/attention.c keeps such a copy of kv per layer (kvp). Ignored when c is not a multiple of 32. */
typedef struct trex_fused_pairs {
    const uint16_t *rows;
    int64_t first, n;
} trex_fused_pairs;
typedef void (*trex_fused_sattn_fwd_bf16_fn)(float *o, float *lse, float *z, float *P, float *ws,
                                             const float *q, const uint16_t *qb,
                                             const float *const *V,
                                             const uint16_t *const *Vb,
                                             const trex_fused_pairs *Wp, int64_t n, int64_t H,
                                             int64_t c, const float *sink, float scale);
typedef void (*trex_fused_sattn_bwd_query_bf16_fn)(float *dq, float *dsink, float *P, float *ws,
                                                   const float *g, const uint16_t *gb,
                                                   const float *q, const uint16_t *qb,
                                                   const float *const *V,
                                                   const uint16_t *const *Vb,
                                                   const trex_fused_pairs *Wp, int64_t n,
                                                   int64_t H, int64_t c, const float *sink,
                                                   float scale, const float *lse, const float *D);
typedef void (*trex_fused_sattn_bwd_entries_bf16_fn)(float *const *dV, float *psum, float *ws,
                                                     const float *const *V,
                                                     const uint16_t *const *Vb, int64_t n,
                                                     const float *q, const uint16_t *qb,
                                                     const float *g, const uint16_t *gb, int64_t H,
                                                     int64_t c, float scale, const float *lse,
                                                     const float *D);
/* A key side's operands written for a later product (sattn_key_product_bf16): the coefficient rows
 * a2 [rows][K] bf16 and the B operand b2, K rows of cp = TREX_FUSED_SATTN_CP(c) bf16 in the VNNI tile
 * layout (row k, column i at b2[((k / 32) (cp / 16) + i / 16) 512 + ((k % 32) / 2) 32 + 2 (i % 16) +
 * k % 2]). A query writes its part: Hp = TREX_FUSED_SATTN_HP(H) columns from col (bf(p_he), zero
 * for padded heads), Hp more (bf(scale dz_he)), in the rows row + e of its entries e; and rows col ..
 * col + 2 Hp of b2: its bf(g) then bf(q) rows (zero rows for padded heads, zero columns past c). */
typedef struct trex_fused_keys_out {
    uint16_t *a2, *b2;
    int64_t K, col, row;
} trex_fused_keys_out;
/* The query side and the key side of one query in one call (bf16 mode, CSA layers of
 * model/attention.c): exactly sattn_bwd_query_bf16(dq, dsink, P, ws, NULL, gb, NULL, qb, NULL, Vb, Wp,
 * n, ...) and then sattn_bwd_entries_bf16(dV, psum, ws, NULL, Vb + n0, n - n0, NULL, qb, NULL, gb, ...)
 * for the entries n0 .. n - 1 (0 <= n0 <= n): the same bits as those two calls, while the scores, the
 * packed q and g and the packed entries serve both (dV, psum: n - n0 rows, ascending). wk (NULL:
 * none): the key side of the entries e < n0 written for a later product (trex_fused_keys_out; the
 * coefficients as sattn_bwd_entries_bf16 and sattn_bwd_window_bf16 compute them). ws:
 * TREX_FUSED_SATTN_QK_BF16_WS(n, H, c) floats. */
typedef void (*trex_fused_sattn_bwd_query_keys_bf16_fn)(float *dq, float *dsink, float *P,
                                                        float *const *dV, float *psum, float *ws,
                                                        const uint16_t *gb, const uint16_t *qb,
                                                        const uint16_t *const *Vb,
                                                        const trex_fused_pairs *Wp, int64_t n,
                                                        int64_t n0, int64_t H, int64_t c,
                                                        const float *sink, float scale,
                                                        const float *lse, const float *D,
                                                        const trex_fused_keys_out *wk);
/* The key side's product of operands written by queries (trex_fused_keys_out): for e < n, dV[e][i] +=
 * the fp32 sum over k < K of a2[e K + k] B(k, i) (exact products; K ascending from the first term at
 * the reference, the tile unit's order at AMX: the bits sattn_bwd_window_bf16 gives the same
 * operands), then one add; a2's rows n .. n rounded up to 16 must be zero. ws: 16 cp + 16 floats. */
typedef void (*trex_fused_sattn_key_product_bf16_fn)(float *const *dV, float *ws,
                                                     const uint16_t *a2, const uint16_t *b2,
                                                     int64_t K, int64_t n, int64_t c);
#define TREX_FUSED_SATTN_QK_BF16_WS(n, H, c)                                                    \
    (TREX_FUSED_SATTN_BF16_WS(n, H, c) + 2 * TREX_FUSED_SATTN_NP(n) * TREX_FUSED_SATTN_HP(H) +  \
     TREX_FUSED_SATTN_HP(H) * TREX_FUSED_SATTN_CP(c) + 16 * TREX_FUSED_SATTN_NP(n) + 64)
/* The key side of a block of nq consecutive queries over n consecutive entries (bf16 mode, the window
 * of model/attention.c): query b (its rounded qb + b H c, gb + b H c, lse + b H, D + b H) sees the
 * entries vis[2b] <= e < vis[2b+1] (an empty range: none); for every entry,
 *   dV[e][k] += sum over b seeing e, h of bf(p_bhe) bf(g_bh)[k] + bf(scale dz_bhe) bf(q_bh)[k]
 * with p, dz as sattn_bwd_entries_bf16 computes them, summed in fp32 over the block's 2 H nq terms
 * (b ascending, then as there), then added to dV[e] once: one read-modify-write of each dV row per
 * block instead of one per query. Vb[e]: the entries' bf16 rows. Each entry's result depends only on
 * that entry and the block's queries (not on which other entries share the call), so a caller that
 * fixes the blocks by query index gets the same bits for any grouping of the entries. ws holds
 * TREX_FUSED_SATTN_WIN_BF16_WS(n, H, c, nq) floats. */
typedef void (*trex_fused_sattn_bwd_window_bf16_fn)(float *const *dV, float *ws,
                                                    const uint16_t *const *Vb, int64_t n,
                                                    int64_t nq, const int64_t *vis,
                                                    const uint16_t *qb, const uint16_t *gb,
                                                    int64_t H, int64_t c, float scale,
                                                    const float *lse, const float *D);
/* The forward of nq consecutive queries that share their entries (bf16 mode, the SWA and HCA layers
 * of model/attention.c): query b (its rounded q at qb + b H c) attends the entries e in the two
 * ranges [vis[4b], vis[4b+1]) and [vis[4b+2], vis[4b+3]) (the first before the second; either may be
 * empty) and gets o + b H c and lse + b H as sattn_fwd_bf16 on those entries alone gives them (z, P
 * not written), except that the output product sums each query's terms in the columns of the
 * block's common entry list, so its fp32 sums may group differently (o within fp32 rounding of the
 * per-query call; lse the same bits at the AMX level). Vb[e]: the entries' bf16 rows; Wp: NULL, or the
 * first Wp->n entries as pair rows (as above). One call loads each entry's tiles once for all nq
 * queries. ws: TREX_FUSED_SATTN_BF16_WS(n, nq * TREX_FUSED_SATTN_HP(H), c) floats plus n pointers. */
typedef void (*trex_fused_sattn_fwd_block_bf16_fn)(float *o, float *lse, float *ws,
                                                   const uint16_t *qb, int64_t nq,
                                                   const int64_t *vis, const uint16_t *const *Vb,
                                                   const trex_fused_pairs *Wp, int64_t n,
                                                   int64_t H, int64_t c, const float *sink,
                                                   float scale);
/* The query side of nq consecutive queries that share their entries (as sattn_fwd_block_bf16): query
 * b (qb + b H c, gb + b H c, lse + b H, D + b H) attends the entries of its two ranges and gets
 * dq + b H c and dsink + b H as sattn_bwd_query_bf16 on those entries alone gives them (P not
 * written), except that dq's sums over the entries are grouped by the block's columns (within fp32
 * rounding; dsink the same bits). ws: TREX_FUSED_SATTN_BLOCK_BF16_WS(n, H, c, nq) floats. */
typedef void (*trex_fused_sattn_bwd_query_block_bf16_fn)(
    float *dq, float *dsink, float *ws, const uint16_t *gb, const uint16_t *qb, int64_t nq,
    const int64_t *vis, const uint16_t *const *Vb, const trex_fused_pairs *Wp, int64_t n, int64_t H,
    int64_t c, const float *sink, float scale, const float *lse, const float *D);
#define TREX_FUSED_SATTN_BLOCK_BF16_WS(n, H, c, nq)                                                \
    (TREX_FUSED_SATTN_BF16_WS(n, (int64_t)(nq) * TREX_FUSED_SATTN_HP(H), c) +                    \
     2 * (int64_t)(n) + 16)
/* The query side of a block (as sattn_bwd_query_block_bf16, the same bits) and the key side of all
 * its n entries in one call (bf16 mode, SWA and HCA layers of model/attention.c): every query's
 * window range lies before vis[2] and its compressed range from vis[2] on, and the key side is
 * sattn_bwd_window_bf16(dV, .., Vb, vis[2], nq, (each query's window range), ..) over the entries
 * e < vis[2], then sattn_bwd_window_bf16(dV + vis[2], .., Vb + vis[2], n - vis[2], nq, (each
 * query's compressed range, from vis[2]), ..) over the others: the same bits as those three calls,
 * with one packing of q, g and the entries and one score product (nq <= 16). ws:
 * TREX_FUSED_SATTN_BLOCK_KEYS_BF16_WS(n, H, c, nq) floats. */
typedef void (*trex_fused_sattn_bwd_query_block_keys_bf16_fn)(
    float *dq, float *dsink, float *const *dV, float *ws, const uint16_t *gb, const uint16_t *qb,
    int64_t nq, const int64_t *vis, const uint16_t *const *Vb, const trex_fused_pairs *Wp,
    int64_t n, int64_t H, int64_t c, const float *sink, float scale, const float *lse,
    const float *D);
#define TREX_FUSED_SATTN_BLOCK_KEYS_BF16_WS(n, H, c, nq)                                           \
    (TREX_FUSED_SATTN_BLOCK_BF16_WS(n, H, c, nq) +                                                \
     TREX_FUSED_SATTN_WIN_BF16_WS(n, H, c, nq) +                                                  \
     (int64_t)(nq) * TREX_FUSED_SATTN_HP(H) * (TREX_FUSED_SATTN_NP(n) + TREX_FUSED_SATTN_CP(c)) + 64)
#define TREX_FUSED_SATTN_WIN_BF16_WS(n, H, c, nq)                                                  \
    (TREX_FUSED_SATTN_BF16_WS(n, H, c) +                                                          \
     (int64_t)(nq) * (2 * TREX_FUSED_SATTN_HP(H) * TREX_FUSED_SATTN_CP(c) +                       \
                      TREX_FUSED_SATTN_HP(H) * TREX_FUSED_SATTN_NP(n) + 2 * (int64_t)(H)) +        \
     16 * 16)

/* Lightning-indexer head scores of bf16 mode (docs/precision.md): out[r*n + e] = bf(A_r) . K_e for
 * r < R, e < n, A_r = A + r*lda (c floats, rounded to bf16 nearest even), K_e the bf16 row
 * Kb + i*c with i = idx[e] (idx NULL: i = e); products exact, fp32 sums (kernels/ref/attn_bf16.c:
 * am_dot_f's order; the AMX leaf: the tiles' order, so the two agree within fp32 rounding of the
 * sums). With idx NULL, rows up to n rounded up to 16 must be readable (their results are unused).
 * Each out element depends only on its row and entry. ws: TREX_FUSED_DOTS_BF16_WS(n, R, c) floats. */
typedef void (*trex_fused_dots_bf16_fn)(float *out, float *ws, const float *A, int64_t lda,
                                        int64_t R, const uint16_t *Kb, const int64_t *idx,
                                        int64_t n, int64_t c);
#define TREX_FUSED_DOTS_BF16_WS(n, R, c)                                                        \
    (TREX_FUSED_SATTN_HP(R) * TREX_FUSED_SATTN_CP(c) +                                          \
     TREX_FUSED_SATTN_NP(n) * (TREX_FUSED_SATTN_CP(c) / 2 + TREX_FUSED_SATTN_HP(R)) + 16 * 16)

/* mHC, one token of n <= 8 streams of d floats (model/mhc_real.h):
 *   post_fwd      Xo_k = post_k y + sum_j comb_jk X_j (mhc_post_tok_fwd_f);
 *   post_bwd      its backward: dy, dX written, dpost [n], dcomb [n*n] written, the sums over d in
 *                 double, element by element in order (mhc_post_tok_bwd_f);
 *   collapse      x = sum_k w_k X_k (mhc_collapse_f);
 *   collapse_bwd  dw_k = X_k . dx in double (written), dX_k += w_k dx (mhc_collapse_bwd_f; dX NULL:
 *                 dw only). */
typedef void (*trex_fused_mhc_post_fwd_fn)(int n, int64_t d, const float *post, const float *comb,
                                           const float *y, const float *X, float *Xo);
typedef void (*trex_fused_mhc_post_bwd_fn)(int n, int64_t d, const float *post, const float *comb,
                                           const float *y, const float *X, const float *dXo,
                                           float *dy, float *dX, float *dpost, float *dcomb);
typedef void (*trex_fused_mhc_collapse_fn)(int n, int64_t d, const float *w, const float *X,
                                           float *x);
typedef void (*trex_fused_mhc_collapse_bwd_fn)(int n, int64_t d, const float *w, const float *X,
                                               const float *dx, float *dw, float *dX);

/* Clamped SwiGLU of bf16 mode (model/moe.c's experts; fp32 mode keeps its scalar libm code), one row
 * of n elements, in the order of kernels/ref/swiglu.c (every level gives its bits):
 *   ac = min(a, L), uc = clamp(u, -L, L) (L <= 0: no clamp; a NaN passes), e = exp(-ac) with the
 *   reference's own exp (clamped to [-87, 88], a polynomial: a few ulp, not libm's bits),
 *   swiglu_fwd  h = bf16((ac / (1 + e) * uc) * g);
 *   swiglu_bwd  with d = dh: du = bf16(ku (d g) sl), da = bf16(ka (d g) uc dsl), sig = 1 / (1 + e),
 *               sl = ac sig, dsl = sig (1 + ac (1 - sig)), ka = [a <= L], ku = [|u| <= L] (0 where the
 *               clamp is active); returns sum_j d_j h0_j (h0 = ac / (1 + e) uc) in 16 partial sums
 *               (element j in sum j mod 16, j ascending) combined as ((b0+b1)+(b2+b3)), b_k =
 *               (s_k+s_{k+8})+(s_{k+4}+s_{k+12}); h not NULL: also writes h = bf16(h0 g), the bits
 *               of swiglu_fwd (the backward's recomputed h without a second exp).
 * bf16(x) is trex_f32_to_bf16: what the bf16 GEMMs' packers do to an fp32 operand. n may be 0. */
typedef void (*trex_fused_swiglu_fwd_fn)(uint16_t *h, const float *a, const float *u, int64_t n,
                                         float g, float L);
typedef float (*trex_fused_swiglu_bwd_fn)(uint16_t *h, uint16_t *da, uint16_t *du, const float *a,
                                          const float *u, const float *dh, int64_t n, float g,
                                          float L);
/* SwiGLU's clamp with limit L > 0 (L <= 0: none): ac = min(a, L), uc = clamp(u, -L, L); *ka, *ku are
 * 1, or 0 where the clamp cut (the backward's masks). The scalar backwards share it. */
static inline void trex_swiglu_clamp(float *ac, float *uc, float *ka, float *ku, float L)
{
    *ka = 1.0f;
    *ku = 1.0f;
    if (L > 0.0f) {
        if (*ac > L) {
            *ac = L;
            *ka = 0.0f;
        }
        if (*uc > L) {
            *uc = L;
            *ku = 0.0f;
        } else if (*uc < -L) {
            *uc = -L;
            *ku = 0.0f;
        }
    }
}

/* Cross-entropy of the LM head in bf16 mode (model/model.c head_forward3; docs/precision.md "The LM
 * head"), over a chunk of logits held transposed: L [n, ld] fp32, row v = vocabulary entry v, column
 * i = token i (cols columns, contiguous in a row). kernels/ref/ce.c defines the bits; every level
 * gives them.
 *   ce_fwd   for each column i < cols: mx[i] = the max over the rows (row 0, then l > m ? l : m),
 *            sum[i] = sum over the rows, in order, in double of e = exp(l - mx[i]), e in fp32 from
 *            ce_exp below; with keep, e replaces l in L. n >= 1; mx [cols] and sum [cols] written.
 *   ce_grad  dst[v*ldd + i] = c[i] != 0 ? bf16(E[v*lde + i] * c[i]) : +0 for v < n, i < cols
 *            (bf16 as trex_f32_to_bf16). dst may overlay E row by row (dst row v starting where E
 *            row v starts, ldd = 2 lde): each row is read before it is overwritten.
 *   ce_exp   exp(x) for x <= 0: x clamped to [-104, 0] (NaN passes), a Cody-Waite reduction by ln 2,
 *            Cephes' degree-6 polynomial and 2^n applied with one rounding (subnormal results
 *            included); error bounded in tests/test_ce.c (TREX_CE_EXP_ULP ulp for normal results). */
typedef void (*trex_fused_ce_fwd_fn)(float *L, int64_t ld, int64_t n, int64_t cols, int keep,
                                     float *mx, double *sum);
typedef void (*trex_fused_ce_grad_fn)(uint16_t *dst, int64_t ldd, const float *E, int64_t lde,
                                      int64_t n, int64_t cols, const float *c);
typedef float (*trex_fused_ce_exp_fn)(float x);
/* The bf16x3 split of the LM head's operands (kernels.h trex_split_bf16x3_rows): for r < rows, the n
 * floats x of src row r (stride n) give dst row r (stride 3n bf16) hi = bf16(x) at columns hi0 + i and
 * hi1 + i and lo = bf16(x - hi) at lo0 + i (trex_split_bf16's bits). nt != 0: stores may bypass the
 * cache (outputs far larger than it); they are complete (fenced) when the call returns. */
typedef void (*trex_fused_split3_fn)(uint16_t *dst, const float *src, int64_t rows, int64_t n,
                                     int64_t hi0, int64_t lo0, int64_t hi1, int nt);
/* The bound tests/test_ce.c checks: ce_exp's error in ulp of the result, for results >= 2^-126. */
#define TREX_CE_EXP_ULP 1

/* Softmax pooling of the compressor in bf16 mode (model/attention.c; MODEL_SPEC §2; fp32 mode keeps
 * am_pool_* of model/attention_math.h, whose exp is libm's): one compressed entry from n >= 1
 * candidates, rows K[j] and Z[j] of c floats, independently for every feature f < c. kernels/ref/pool.c
 * defines the bits (every step one IEEE float operation, nothing contracted); every level gives them.
 *   pool_fwd  mx = Z_0[f], then mx = z > mx ? z : mx for z = Z_j[f], j ascending; e_j = ce_exp(Z_j[f] -
 *             mx); den = +0 + e_0 + e_1 + ..., s = +0 + e_0 K_0[f] + e_1 K_1[f] + ... (rounded products,
 *             j ascending); C[f] = s / den;
 *   pool_bwd  with mx, den and C[f] as pool_fwd's: g = (e_j / den) dC[f], dK_j[f] = dK_j[f] + g,
 *             dZ_j[f] = dZ_j[f] + g (K_j[f] - C[f]) for j ascending (the rows dK, dZ do not overlap
 *             K, Z or each other). */
typedef void (*trex_fused_pool_fwd_fn)(float *C, const float *const *K, const float *const *Z, int64_t n,
                                       int64_t c);
typedef void (*trex_fused_pool_bwd_fn)(float *const *dK, float *const *dZ, const float *dC,
                                       const float *const *K, const float *const *Z, int64_t n, int64_t c);

/* Router logits (the MoE router stays fp32 in every mode, MODEL_SPEC §12) of n rows of x [n, d]
 * against the gate transposed, gt [d, E]: z[t*E + e] = s with s = +0, then s = s + fl(x[t][k] gt[k][e])
 * for k increasing (no fused multiply-add): the fp32 GEMM's contract, so the bits of
 * trex_linear_forward(z, x, W_g) with W_g = gt^T. n may be 0. */
typedef void (*trex_fused_gate_fwd_fn)(float *z, const float *x, const float *gt, int64_t n,
                                       int64_t d, int64_t E);
/* The router's backward products in the same contract (sum from +0 in increasing order, then added to
 * the old value: the bits of trex_linear_backward(dx, dg, dz, x, gate, n, d, E, true)):
 *   gate_bwd_dx  dx[t][j] = s + dx[t][j], s = sum_e dz[t][e] gate[e][j], rows t < n (gate [E, d]);
 *   gate_bwd_dw  dg[e][j] = s + dg[e][j], s = sum_t dz[t][e] x[t][j] for t < n, columns j0 <= j < j1
 *                (callers split the columns between threads); ws: scratch of E*d floats, of which
 *                the columns [j0, j1) are used (threads with disjoint columns may share it);
 *   gate_bwd_dx_mhc  the mHC backward's dX (model/mhc.c): rows t < n of X, dX [n, ns*d] (ns streams
 *                of d), dx [n, d], w [n, wld] (the stream weights, w[t*wld + k]), c [n]; for column
 *                j = k*d + i: dX[t][j] = s + ((dX[t][j] + fl(w_tk dx[t][i])) - fl(c_t X[t][j])), s as
 *                gate_bwd_dx's (gate [E, ns*d]): the bits of mhc_collapse_bwd's dX update, then
 *                mhc_rho_bwd's, then gate_bwd_dx, in one pass;
 *   gate_fwd_fma, gate_bwd_dw_fma, gate_bwd_dx_mhc_fma  the same with each term of the sums s taken
 *                by one fused multiply-add, s = fmaf(a, b, s) (the rest as above): bf16 mode's mHC
 *                products (still fp32, one rounding per term instead of two; docs/precision.md). */
typedef void (*trex_fused_gate_bwd_dx_fn)(float *dx, const float *dz, const float *gate, int64_t n,
                                          int64_t d, int64_t E);
typedef void (*trex_fused_gate_bwd_dw_fn)(float *dg, float *ws, const float *dz, const float *x,
                                          int64_t n, int64_t d, int64_t E, int64_t j0, int64_t j1);
typedef void (*trex_fused_gate_bwd_dx_mhc_fn)(float *dX, const float *dz, const float *gate,
                                              int64_t n, int ns, int64_t d, int64_t E,
                                              const float *X, const float *dx, const float *w,
                                              int64_t wld, const float *c);

/* RMSNorm over rows and the fixed-lane sum of squares (kernels/ref/norm.c defines the bits; every level
 * gives them; docs/precision.md "RMSNorm and the mHC rho"). A sum over a row runs in TREX_SUMSQ_LANES
 * = 16 double lanes, element k in lane k mod 16 in increasing order from +0, combined as trex_sumsq's
 * tree (kernels.h): s_j = l_j + l_{j+8}, t_j = s_j + s_{j+4}, u_j = t_j + t_{j+2}, result u_0 + u_1.
 *   sumsq        that sum of (double)x_k (double)x_k (exact squares), k < n (n may be 0: +0);
 *   rmsnorm_fwd  n rows of dim floats: r = trex_rmsnorm_rstd(sumsq(x_row)), rstd[row] = r (rstd may
 *                be NULL), y_i = (x_i r) w_i (w NULL: x_i r), float multiplies; y may alias x;
 *   rmsnorm_bwd  dot = the lane sum of ((double)dy_i w_i) x_i (w NULL: (double)dy_i x_i), each product
 *                rounded then added; c = ((float)(dot / dim) r) r with r = rstd[row];
 *                v_i = r (g_i - x_i c), g_i = dy_i w_i (w NULL: dy_i); dx_i = acc ? dx_i + v_i : v_i;
 *   rmsnorm_dw   dw_i += (dy_ri x_ri) rstd_r for rows r < n in increasing order, columns j0 <= i < j1
 *                (callers split the columns between threads). */
typedef double (*trex_fused_sumsq_fn)(const float *x, int64_t n);
typedef void (*trex_fused_rmsnorm_fwd_fn)(float *y, float *rstd, const float *x, const float *w,
                                          int64_t n, int64_t dim, float eps);
typedef void (*trex_fused_rmsnorm_bwd_fn)(float *dx, const float *dy, const float *x, const float *w,
                                          const float *rstd, int64_t n, int64_t dim, int acc);
typedef void (*trex_fused_rmsnorm_dw_fn)(float *dw, const float *dy, const float *x,
                                         const float *rstd, int64_t n, int64_t dim, int64_t j0,
                                         int64_t j1);
/* RMSNorm's 1 / sqrt(mean + eps) from the sum of squares of a row of dim values, in double. */
static inline float trex_rmsnorm_rstd(double ss, int64_t dim, float eps)
{
    return (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
}

typedef struct trex_fused_table {
    trex_isa isa;
    const char *name;
    trex_fused_dot_fn dot;
    trex_fused_dots_fn dots;
    trex_fused_axpy_fn axpy;
    trex_fused_axpy_rows_fn axpy_rows;
    trex_fused_kl_qgrad_fn kl_qgrad;
    trex_fused_kl_kgrad_fn kl_kgrad;
    trex_fused_copy_nt_fn copy_nt;
    trex_fused_cvt_bf16_nt_fn cvt_bf16_nt;
    trex_fused_rope_fn rope;
    trex_fused_rms_head_bwd_fn rms_head_bwd;
    trex_fused_sattn_fwd_fn sattn_fwd;
    trex_fused_sattn_bwd_query_fn sattn_bwd_query;
    trex_fused_sattn_bwd_entries_fn sattn_bwd_entries;
    /* bf16 variants (ws of TREX_FUSED_SATTN_BF16_WS floats, 64-byte alignment not required): the
     * reference in the ref table, the tile leaves at avx2, avx512f, avx512 and amx
     * (kernels/x86/attn_tiles.h); NULL in a table whose level keeps the fp32 entries in bf16 mode */
    trex_fused_sattn_fwd_bf16_fn sattn_fwd_bf16;
    trex_fused_sattn_bwd_query_bf16_fn sattn_bwd_query_bf16;
    trex_fused_sattn_bwd_entries_bf16_fn sattn_bwd_entries_bf16;
    trex_fused_sattn_bwd_window_bf16_fn sattn_bwd_window_bf16; /* NULL where the others are */
    trex_fused_sattn_fwd_block_bf16_fn sattn_fwd_block_bf16;   /* likewise */
    trex_fused_sattn_bwd_query_block_bf16_fn sattn_bwd_query_block_bf16; /* likewise */
    trex_fused_sattn_bwd_query_keys_bf16_fn sattn_bwd_query_keys_bf16;   /* likewise */
    trex_fused_sattn_bwd_query_block_keys_bf16_fn sattn_bwd_query_block_keys_bf16; /* likewise */
    trex_fused_sattn_key_product_bf16_fn sattn_key_product_bf16;                   /* likewise */
    const char *sattn_bf16_name;
    /* bf16 indexer scores: the reference in the ref table, the tile leaves at avx2, avx512f, avx512
     * and amx; NULL where the bf16 attention entries are (bf16 mode then keeps the fp32
     * dots, as it keeps the fp32 attention core) */
    trex_fused_dots_bf16_fn dots_bf16;
    trex_fused_mhc_post_fwd_fn mhc_post_fwd;
    trex_fused_mhc_post_bwd_fn mhc_post_bwd;
    trex_fused_mhc_collapse_fn mhc_collapse;
    trex_fused_mhc_collapse_bwd_fn mhc_collapse_bwd;
    trex_fused_swiglu_fwd_fn swiglu_fwd_bf16;
    trex_fused_swiglu_bwd_fn swiglu_bwd_bf16;
    trex_fused_gate_fwd_fn gate_fwd;
    trex_fused_gate_bwd_dx_fn gate_bwd_dx;
    trex_fused_gate_bwd_dw_fn gate_bwd_dw;
    trex_fused_gate_bwd_dx_mhc_fn gate_bwd_dx_mhc;
    trex_fused_gate_fwd_fn gate_fwd_fma;
    trex_fused_gate_bwd_dw_fn gate_bwd_dw_fma;
    trex_fused_gate_bwd_dx_mhc_fn gate_bwd_dx_mhc_fma;
    trex_fused_ce_fwd_fn ce_fwd;
    trex_fused_ce_grad_fn ce_grad;
    trex_fused_ce_exp_fn ce_exp;
    trex_fused_pool_fwd_fn pool_fwd;
    trex_fused_pool_bwd_fn pool_bwd;
    trex_fused_split3_fn split3;
    trex_fused_sumsq_fn sumsq;
    trex_fused_rmsnorm_fwd_fn rmsnorm_fwd;
    trex_fused_rmsnorm_bwd_fn rmsnorm_bwd;
    trex_fused_rmsnorm_dw_fn rmsnorm_dw;
} trex_fused_table;

/* The table of the level in use (trex_kernels_isa()); TREX_VERBOSE=1 logs the choice once. */
const trex_fused_table *trex_fused(void);
/* The table a cap would choose on this machine (tests run every level with it). Never NULL. */
const trex_fused_table *trex_fused_for(trex_isa cap);

/* ---- leaves (reached only through the tables) ---- */
/* The AVX-512 leaves of kernels/x86/avx512/fused.c, ce.c and swiglu.c, the files that include the bf16
 * rounding of kernels/x86/avx512/bf16.h (for some of their leaves): each AVX-512 level has its own copy,
 * with AVX512_BF16's conversions (trex_fused_<name>_avx512) and without (trex_fused_<name>_avx512f,
 * kernels/x86/avx512f/). */
#define TREX_FUSED_AVX512_LEVEL_LEAVES(isa)                                                             \
    float trex_fused_dot_##isa(const float *a, const float *b, int64_t n);                              \
    void trex_fused_axpy_##isa(float *y, float a, const float *x, int64_t n);                           \
    void trex_fused_copy_nt_##isa(float *dst, const float *src, int64_t n);                             \
    void trex_fused_cvt_bf16_nt_##isa(uint16_t *dst, const float *src, int64_t n);                      \
    void trex_fused_rope_##isa(float *v, int64_t nv, int64_t ld, const float *cs, const float *sn,      \
        int64_t half, int inverse);                                                                     \
    void trex_fused_rms_head_bwd_##isa(float *g, const float *q, const float *rs, int64_t H,            \
        int64_t c);                                                                                     \
    void trex_fused_axpy_rows_##isa(float *Y, int64_t ldy, int64_t R, const float *A,                   \
        const unsigned char *on, int64_t sr, int64_t sj, const float *const *X, int64_t J,              \
        int64_t c);                                                                                     \
    void trex_fused_dots_##isa(float *out, const float *A, int64_t lda, int64_t R,                      \
        const float *const *V, int64_t n, int64_t c);                                                   \
    void trex_fused_sattn_fwd_##isa(float *o, float *lse, float *z, float *ws, const float *q,          \
        const float *const *V, int64_t n, int64_t H, int64_t c, const float *sink, float scale);        \
    void trex_fused_sattn_bwd_query_##isa(float *dq, float *dsink, float *P, float *ws,                 \
        const float *g, const float *q, const float *const *V, int64_t n, int64_t H, int64_t c,         \
        const float *sink, float scale, const float *lse, const float *D);                              \
    void trex_fused_sattn_bwd_entries_##isa(float *const *dV, float *psum, float *ws,                   \
        const float *const *V, int64_t n, const float *q, const float *g, int64_t H, int64_t c,         \
        float scale, const float *lse, const float *D);                                                 \
    void trex_fused_mhc_post_fwd_##isa(int n, int64_t d, const float *post, const float *comb,          \
        const float *y, const float *X, float *Xo);                                                     \
    void trex_fused_mhc_post_bwd_##isa(int n, int64_t d, const float *post, const float *comb,          \
        const float *y, const float *X, const float *dXo, float *dy, float *dX, float *dpost,           \
        float *dcomb);                                                                                  \
    void trex_fused_mhc_collapse_##isa(int n, int64_t d, const float *w, const float *X, float *x);     \
    void trex_fused_mhc_collapse_bwd_##isa(int n, int64_t d, const float *w, const float *X,            \
        const float *dx, float *dw, float *dX);                                                         \
    void trex_fused_swiglu_fwd_bf16_##isa(uint16_t *h, const float *a, const float *u, int64_t n,       \
        float g, float L);                                                                              \
    float trex_fused_swiglu_bwd_bf16_##isa(uint16_t *h, uint16_t *da, uint16_t *du, const float *a,     \
        const float *u, const float *dh, int64_t n, float g, float L);                                  \
    void trex_fused_ce_fwd_##isa(float *L, int64_t ld, int64_t n, int64_t cols, int keep,               \
        float *mx, double *sum);                                                                        \
    void trex_fused_ce_grad_##isa(uint16_t *dst, int64_t ldd, const float *E, int64_t lde,              \
        int64_t n, int64_t cols, const float *c);                                                       \
    float trex_fused_ce_exp_##isa(float x);                                                             \
    void trex_fused_split3_##isa(uint16_t *dst, const float *src, int64_t rows, int64_t n,              \
        int64_t hi0, int64_t lo0, int64_t hi1, int nt);
TREX_FUSED_AVX512_LEVEL_LEAVES(avx512)
TREX_FUSED_AVX512_LEVEL_LEAVES(avx512f)

/* kl_qgrad's reference loop with a given axpy (the reference's am_axpy_f, or a level's own axpy with
 * the same bits) */
void trex_fused_kl_qgrad_axpy(trex_fused_axpy_fn axpy, float *diq, float *dhw, const float *ia,
                              const float *dI, const float *hw, const float *const *K, int64_t n,
                              int64_t nI, int64_t cI);
void trex_fused_kl_qgrad_ref(float *diq, float *dhw, const float *ia, const float *dI,
                             const float *hw, const float *const *K, int64_t n, int64_t nI,
                             int64_t cI);
void trex_fused_kl_kgrad_ref(float *const *dK, const float *ia, const float *dI, const float *hw,
                             const float *X, int64_t n, int64_t nI, int64_t cI);
void trex_fused_kl_qgrad_avx512(float *diq, float *dhw, const float *ia, const float *dI,
                                const float *hw, const float *const *K, int64_t n, int64_t nI,
                                int64_t cI);
void trex_fused_kl_kgrad_avx512(float *const *dK, const float *ia, const float *dI,
                                const float *hw, const float *X, int64_t n, int64_t nI, int64_t cI);

void trex_fused_swiglu_fwd_bf16_ref(uint16_t *h, const float *a, const float *u, int64_t n,
                                    float g, float L);
float trex_fused_swiglu_bwd_bf16_ref(uint16_t *h, uint16_t *da, uint16_t *du, const float *a,
                                     const float *u, const float *dh, int64_t n, float g, float L);
void trex_fused_gate_fwd_ref(float *z, const float *x, const float *gt, int64_t n, int64_t d,
                             int64_t E);
void trex_fused_gate_fwd_avx512(float *z, const float *x, const float *gt, int64_t n, int64_t d,
                                int64_t E);
void trex_fused_gate_bwd_dx_ref(float *dx, const float *dz, const float *gate, int64_t n, int64_t d,
                                int64_t E);
void trex_fused_gate_bwd_dw_ref(float *dg, float *ws, const float *dz, const float *x, int64_t n,
                                int64_t d, int64_t E, int64_t j0, int64_t j1);
void trex_fused_gate_bwd_dx_avx512(float *dx, const float *dz, const float *gate, int64_t n,
                                   int64_t d, int64_t E);
void trex_fused_gate_bwd_dw_avx512(float *dg, float *ws, const float *dz, const float *x, int64_t n,
                                   int64_t d, int64_t E, int64_t j0, int64_t j1);
void trex_fused_gate_bwd_dx_mhc_ref(float *dX, const float *dz, const float *gate, int64_t n, int ns,
                                    int64_t d, int64_t E, const float *X, const float *dx,
                                    const float *w, int64_t wld, const float *c);
void trex_fused_gate_bwd_dx_mhc_avx512(float *dX, const float *dz, const float *gate, int64_t n,
                                       int ns, int64_t d, int64_t E, const float *X,
                                       const float *dx, const float *w, int64_t wld, const float *c);
void trex_fused_gate_fwd_fma_ref(float *z, const float *x, const float *gt, int64_t n, int64_t d,
                                 int64_t E);
void trex_fused_gate_bwd_dw_fma_ref(float *dg, float *ws, const float *dz, const float *x, int64_t n,
                                    int64_t d, int64_t E, int64_t j0, int64_t j1);
void trex_fused_gate_bwd_dx_mhc_fma_ref(float *dX, const float *dz, const float *gate, int64_t n,
                                        int ns, int64_t d, int64_t E, const float *X,
                                        const float *dx, const float *w, int64_t wld,
                                        const float *c);
void trex_fused_gate_fwd_fma_avx512(float *z, const float *x, const float *gt, int64_t n, int64_t d,
                                    int64_t E);
void trex_fused_gate_bwd_dw_fma_avx512(float *dg, float *ws, const float *dz, const float *x,
                                       int64_t n, int64_t d, int64_t E, int64_t j0, int64_t j1);
void trex_fused_gate_bwd_dx_mhc_fma_avx512(float *dX, const float *dz, const float *gate, int64_t n,
                                           int ns, int64_t d, int64_t E, const float *X,
                                           const float *dx, const float *w, int64_t wld,
                                           const float *c);
void trex_fused_ce_fwd_ref(float *L, int64_t ld, int64_t n, int64_t cols, int keep, float *mx,
                           double *sum);
void trex_fused_ce_grad_ref(uint16_t *dst, int64_t ldd, const float *E, int64_t lde, int64_t n,
                            int64_t cols, const float *c);
float trex_fused_ce_exp_ref(float x);
void trex_fused_pool_fwd_ref(float *C, const float *const *K, const float *const *Z, int64_t n, int64_t c);
void trex_fused_pool_bwd_ref(float *const *dK, float *const *dZ, const float *dC, const float *const *K,
                             const float *const *Z, int64_t n, int64_t c);
void trex_fused_pool_fwd_avx512(float *C, const float *const *K, const float *const *Z, int64_t n,
                                int64_t c);
void trex_fused_pool_bwd_avx512(float *const *dK, float *const *dZ, const float *dC, const float *const *K,
                                const float *const *Z, int64_t n, int64_t c);
void trex_fused_split3_ref(uint16_t *dst, const float *src, int64_t rows, int64_t n, int64_t hi0,
                           int64_t lo0, int64_t hi1, int nt);

/* RMSNorm and the sum of squares: the reference (kernels/ref/norm.c) and the AVX-512 leaves. */
double trex_fused_sumsq_ref(const float *x, int64_t n);
void trex_fused_rmsnorm_fwd_ref(float *y, float *rstd, const float *x, const float *w, int64_t n,
                                int64_t dim, float eps);
void trex_fused_rmsnorm_bwd_ref(float *dx, const float *dy, const float *x, const float *w,
                                const float *rstd, int64_t n, int64_t dim, int acc);
void trex_fused_rmsnorm_dw_ref(float *dw, const float *dy, const float *x, const float *rstd,
                               int64_t n, int64_t dim, int64_t j0, int64_t j1);
double trex_fused_sumsq_avx512(const float *x, int64_t n);
void trex_fused_rmsnorm_fwd_avx512(float *y, float *rstd, const float *x, const float *w, int64_t n,
                                   int64_t dim, float eps);
void trex_fused_rmsnorm_bwd_avx512(float *dx, const float *dy, const float *x, const float *w,
                                   const float *rstd, int64_t n, int64_t dim, int acc);
void trex_fused_rmsnorm_dw_avx512(float *dw, const float *dy, const float *x, const float *rstd,
                                  int64_t n, int64_t dim, int64_t j0, int64_t j1);

/* The bf16 attention leaves of a level, trex_fused_<name>_<isa>: the reference (kernels/ref/attn_bf16.c)
 * and the tile leaves (kernels/x86/attn_tiles.h, one body) for AMX tiles (kernels/x86/amx/attn.c),
 * AVX-512 VDPBF16PS (kernels/x86/avx512/attn.c) and fp32 FMAs on AVX-512 (kernels/x86/avx512f/attn.c)
 * or AVX2 registers (kernels/x86/avx2/attn.c). */
#define TREX_FUSED_ATTN_BF16_LEAVES(isa)                                                            \
    void trex_fused_sattn_fwd_block_bf16_##isa(float *o, float *lse, float *ws,                     \
        const uint16_t *qb, int64_t nq, const int64_t *vis, const uint16_t *const *Vb,              \
        const trex_fused_pairs *Wp, int64_t n, int64_t H, int64_t c, const float *sink,             \
        float scale);                                                                               \
    void trex_fused_sattn_bwd_query_block_bf16_##isa(float *dq, float *dsink, float *ws,            \
        const uint16_t *gb, const uint16_t *qb, int64_t nq, const int64_t *vis,                     \
        const uint16_t *const *Vb, const trex_fused_pairs *Wp, int64_t n, int64_t H, int64_t c,     \
        const float *sink, float scale, const float *lse, const float *D);                          \
    void trex_fused_sattn_bwd_query_keys_bf16_##isa(float *dq, float *dsink, float *P,              \
        float *const *dV, float *psum, float *ws, const uint16_t *gb, const uint16_t *qb,           \
        const uint16_t *const *Vb, const trex_fused_pairs *Wp, int64_t n, int64_t n0, int64_t H,    \
        int64_t c, const float *sink, float scale, const float *lse, const float *D,                \
        const trex_fused_keys_out *wk);                                                             \
    void trex_fused_sattn_key_product_bf16_##isa(float *const *dV, float *ws,                       \
        const uint16_t *a2, const uint16_t *b2, int64_t K, int64_t n, int64_t c);                   \
    void trex_fused_sattn_bwd_query_block_keys_bf16_##isa(float *dq, float *dsink,                  \
        float *const *dV, float *ws, const uint16_t *gb, const uint16_t *qb, int64_t nq,            \
        const int64_t *vis, const uint16_t *const *Vb, const trex_fused_pairs *Wp, int64_t n,       \
        int64_t H, int64_t c, const float *sink, float scale, const float *lse, const float *D);    \
    void trex_fused_sattn_bwd_window_bf16_##isa(float *const *dV, float *ws,                        \
        const uint16_t *const *Vb, int64_t n, int64_t nq, const int64_t *vis,                       \
        const uint16_t *qb, const uint16_t *gb, int64_t H, int64_t c, float scale,                  \
        const float *lse, const float *D);                                                          \
    void trex_fused_dots_bf16_##isa(float *out, float *ws, const float *A, int64_t lda,             \
        int64_t R, const uint16_t *Kb, const int64_t *idx, int64_t n, int64_t c);                   \
    void trex_fused_sattn_fwd_bf16_##isa(float *o, float *lse, float *z, float *P, float *ws,       \
        const float *q, const uint16_t *qb, const float *const *V, const uint16_t *const *Vb,       \
        const trex_fused_pairs *Wp, int64_t n, int64_t H, int64_t c, const float *sink,             \
        float scale);                                                                               \
    void trex_fused_sattn_bwd_query_bf16_##isa(float *dq, float *dsink, float *P, float *ws,        \
        const float *g, const uint16_t *gb, const float *q, const uint16_t *qb,                     \
        const float *const *V, const uint16_t *const *Vb, const trex_fused_pairs *Wp, int64_t n,    \
        int64_t H, int64_t c, const float *sink, float scale, const float *lse, const float *D);    \
    void trex_fused_sattn_bwd_entries_bf16_##isa(float *const *dV, float *psum, float *ws,          \
        const float *const *V, const uint16_t *const *Vb, int64_t n, const float *q,                \
        const uint16_t *qb, const float *g, const uint16_t *gb, int64_t H, int64_t c,               \
        float scale, const float *lse, const float *D);
TREX_FUSED_ATTN_BF16_LEAVES(ref)
TREX_FUSED_ATTN_BF16_LEAVES(avx2)
/* the avx2 level's own cross-entropy entries (kernels/x86/avx2/ce.c; the reference's bits) */
void trex_fused_ce_fwd_avx2(float *L, int64_t ld, int64_t n, int64_t cols, int keep, float *mx, double *sum);
void trex_fused_ce_grad_avx2(uint16_t *dst, int64_t ldd, const float *E, int64_t lde, int64_t n, int64_t cols,
                             const float *c);
/* its vector and indexer KL entries (kernels/x86/avx2/fused.c), RMSNorm's (norm.c) and the pooling's
 * (pool.c; the reference's bits) */
float trex_fused_dot_avx2(const float *a, const float *b, int64_t n);
void trex_fused_dots_avx2(float *out, const float *A, int64_t lda, int64_t R, const float *const *V, int64_t n,
                          int64_t c);
void trex_fused_axpy_avx2(float *y, float a, const float *x, int64_t n);
void trex_fused_axpy_rows_avx2(float *Y, int64_t ldy, int64_t R, const float *A, const unsigned char *on,
                               int64_t sr, int64_t sj, const float *const *X, int64_t J, int64_t c);
void trex_fused_copy_nt_avx2(float *dst, const float *src, int64_t n);
void trex_fused_cvt_bf16_nt_avx2(uint16_t *dst, const float *src, int64_t n);
void trex_fused_rope_avx2(float *v, int64_t nv, int64_t ld, const float *cs, const float *sn, int64_t half,
                          int inverse);
void trex_fused_rms_head_bwd_avx2(float *g, const float *q, const float *rs, int64_t H, int64_t c);
double trex_fused_sumsq_avx2(const float *x, int64_t n);
void trex_fused_rmsnorm_fwd_avx2(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t dim,
                                 float eps);
void trex_fused_rmsnorm_bwd_avx2(float *dx, const float *dy, const float *x, const float *w, const float *rstd,
                                 int64_t n, int64_t dim, int acc);
void trex_fused_rmsnorm_dw_avx2(float *dw, const float *dy, const float *x, const float *rstd, int64_t n,
                                int64_t dim, int64_t j0, int64_t j1);
void trex_fused_kl_qgrad_avx2(float *diq, float *dhw, const float *ia, const float *dI, const float *hw,
                              const float *const *K, int64_t n, int64_t nI, int64_t cI);
void trex_fused_kl_kgrad_avx2(float *const *dK, const float *ia, const float *dI, const float *hw, const float *X,
                              int64_t n, int64_t nI, int64_t cI);
void trex_fused_pool_fwd_avx2(float *C, const float *const *K, const float *const *Z, int64_t n, int64_t c);
void trex_fused_pool_bwd_avx2(float *const *dK, float *const *dZ, const float *dC, const float *const *K,
                              const float *const *Z, int64_t n, int64_t c);
/* and its SwiGLU and mHC entries (kernels/x86/avx2/swiglu.c, mhc.c; the reference's bits) */
void trex_fused_swiglu_fwd_bf16_avx2(uint16_t *h, const float *a, const float *u, int64_t n, float g, float L);
float trex_fused_swiglu_bwd_bf16_avx2(uint16_t *h, uint16_t *da, uint16_t *du, const float *a, const float *u,
                                      const float *dh, int64_t n, float g, float L);
void trex_fused_mhc_post_fwd_avx2(int n, int64_t d, const float *post, const float *comb, const float *y,
                                  const float *X, float *Xo);
void trex_fused_mhc_post_bwd_avx2(int n, int64_t d, const float *post, const float *comb, const float *y,
                                  const float *X, const float *dXo, float *dy, float *dX, float *dpost,
                                  float *dcomb);
void trex_fused_mhc_collapse_avx2(int n, int64_t d, const float *w, const float *X, float *x);
void trex_fused_mhc_collapse_bwd_avx2(int n, int64_t d, const float *w, const float *X, const float *dx,
                                      float *dw, float *dX);
TREX_FUSED_ATTN_BF16_LEAVES(amx)
TREX_FUSED_ATTN_BF16_LEAVES(avx512)
TREX_FUSED_ATTN_BF16_LEAVES(avx512f)

#endif
