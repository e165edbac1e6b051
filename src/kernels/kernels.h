/* kernels/kernels.h — numerical kernels shared by the model layers.
 *
 * Every entry has a plain-C reference (kernels/ref/); optimized variants (kernels/x86/) will be chosen
 * by a dispatch table filled once at start. All matrices are row-major float32 with explicit leading
 * dimensions. Results are deterministic: each output element is computed by one thread in a fixed
 * order, so they do not depend on the number of threads. */
#ifndef TREX_KERNELS_H
#define TREX_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/dispatch.h"
#include "trex/pool.h"
#include "trex/tensor.h"

/* C[M,N] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
 * A is [M,K] (lda >= K) or, with ta, stored as [K,M] (lda >= M); B is [K,N] (ldb >= N) or, with tb,
 * stored as [N,K] (ldb >= K). beta == 0 ignores the old C (NaNs included). pool may be NULL. */
void trex_gemm(trex_pool *pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
               int64_t ldc);

/* Linear layer, torch convention W = [out, in]:
 *   forward   y[n,out]  = x[n,in] W^T            (beta 0: y is overwritten)
 *   backward  dx[n,in] (+)= dy[n,out] W          (accumulate when acc is true)
 *             dW[out,in] += dy^T x               (always accumulates into dW) */
void trex_linear_forward(trex_pool *pool, float *y, const float *x, const float *W, int64_t n,
                         int64_t in, int64_t out);
void trex_linear_backward(trex_pool *pool, float *dx, float *dW, const float *dy, const float *x,
                          const float *W, int64_t n, int64_t in, int64_t out, bool acc);

/* RMSNorm over rows of length dim: y = x / sqrt(mean(x^2) + eps) * w (w NULL: weightless).
 * rstd[n] (may be NULL in forward) receives 1/sqrt(mean(x^2)+eps) for the backward pass.
 * Backward: dx (+)= d/dx (acc selects accumulate), dw += d/dw (dw NULL when w is NULL).
 * y may alias x in forward; dx may not alias dy. */
void trex_rmsnorm_forward(trex_pool *pool, float *y, float *rstd, const float *x, const float *w,
                          int64_t n, int64_t dim, float eps);
void trex_rmsnorm_backward(trex_pool *pool, float *dx, float *dw, const float *dy, const float *x,
                           const float *w, const float *rstd, int64_t n, int64_t dim, bool acc);

/* ---- bf16 mixed precision (kernels/ref/gemm_blocked.c, dispatched to AVX-512 / AMX leaves) ------------
 * bf16 values are uint16_t bit patterns (the top half of an fp32). The GEMMs below take bf16 inputs, or
 * fp32 inputs that are rounded to bf16 (nearest even, as trex_f32_to_bf16) while being packed, and sum
 * in fp32 into an fp32 C. Subnormal bf16 inputs count as zero on every ISA (as AMX does). Each element
 * of C is summed by one thread over the whole of K in an order fixed by the ISA (not by the thread count
 * or the schedule), so results are bit-identical for any pool; they may differ between ISAs by fp32
 * rounding. Every thread of the pool works on large products. The packed panels live in a workspace:
 * pass one (trex_gemm_ws_create) to keep its memory between calls, or NULL to allocate and free it per
 * call. Design and measured speed: docs/kernels.md, docs/perf.md. */

/* A growable workspace for the bf16 GEMMs: packed panels (about 24 MiB of B at most, plus about 1 MiB
 * of A per pool thread) and a few small arrays, kept between calls. One per thread that calls GEMMs
 * concurrently. Create returns NULL when out of memory; a GEMM that cannot grow it aborts with a
 * message. */
typedef struct trex_gemm_ws trex_gemm_ws;
trex_gemm_ws *trex_gemm_ws_create(void);
void trex_gemm_ws_destroy(trex_gemm_ws *ws);
size_t trex_gemm_ws_bytes(const trex_gemm_ws *ws); /* bytes held now */

/* n values, bit-exact with trex_f32_to_bf16 / trex_bf16_to_f32 (subnormals and NaNs included). */
void trex_cvt_f32_bf16(uint16_t *dst, const float *src, int64_t n);
void trex_cvt_bf16_f32(float *dst, const uint16_t *src, int64_t n);

/* bf16x3 operands (docs/precision.md "The LM head"): x = hi + lo, hi = bf16(x), lo = bf16(x - hi), and
 * x y ~ hi_x hi_y + hi_x lo_y + lo_x hi_y as one bf16 GEMM over K = 3 k with the terms side by side.
 * trex_split_bf16 writes hi and lo of n values (bit-exact with the scalar conversions);
 * trex_split_bf16x3_rows writes, for each of `rows` rows of n floats (src row stride n), a dst row of
 * 3n bf16 with hi at offsets hi0 and hi1 and lo at lo0 (a permutation of 0, n, 2n), rows over the pool. */
void trex_split_bf16(uint16_t *hi, uint16_t *lo, const float *x, int64_t n);
void trex_split_bf16x3_rows(trex_pool *pool, uint16_t *dst, const float *src, int64_t rows, int64_t n,
                            int64_t hi0, int64_t lo0, int64_t hi1);
/* bf16x2 operands (docs/precision.md "bf16x2g1"): a bf16 weight against an fp32-level activation,
 * W_hi x = W_hi x_hi + W_hi x_lo as one bf16 GEMM over K = 2k. Rows of n floats of src (row stride n) to
 * rows of 2n bf16 of dst: [hi | lo] (trex_split_bf16's bits) or, with weight, [hi | hi] (the bf16
 * rounding twice; written around the cache when the output is 64 MiB or more); rows over the pool. */
void trex_split_bf16x2_rows(trex_pool *pool, uint16_t *dst, const float *src, int64_t rows, int64_t n,
                            bool weight);

/* C[M,N] = alpha * op(A) op(B) + beta * C with the conventions of trex_gemm (ta: A stored [K,M];
 * tb: B stored [N,K]; beta == 0 ignores the old C, NaNs included), A and B bf16. */
void trex_gemm_bf16(trex_pool *pool, trex_gemm_ws *ws, bool ta, bool tb, int64_t M, int64_t N,
                    int64_t K, float alpha, const uint16_t *A, int64_t lda, const uint16_t *B,
                    int64_t ldb, float beta, float *C, int64_t ldc);
/* The same with fp32 A and B, rounded to bf16 while packed (what fp32 activations need). */
void trex_gemm_f32_bf16(trex_pool *pool, trex_gemm_ws *ws, bool ta, bool tb, int64_t M, int64_t N,
                        int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                        int64_t ldb, float beta, float *C, int64_t ldc);

/* A bf16 weight against fp32 activations taken as they are, at the levels whose products are fp32 FMAs
 * (avx2, avx512f; trex_gemm_f32b_native): C[M,N] = alpha A B^T + beta C with the conventions of
 * trex_gemm (beta == 0 ignores the old C), A [M, K] bf16 stored spread, its value k of row i at
 * A[i lda + 2k] and again at 2k + 1 (lda >= 2K; trex_spread_bf16_rows writes it), and B [N, K] fp32
 * (ldb >= K). Each product of a bf16 and an fp32 value is exact in one FMA, and each element's sum
 * rounds once per k in increasing k: the bits of c = fmaf(a_k, b_k, c) from the start the framework
 * gives every product (zero, or beta C when alpha is 1; with another alpha, alpha c + beta C after the
 * sum from zero: docs/kernels.md "alpha, beta and D"), the same at both levels and for any pool.
 * That is half the FMAs of the bf16x2 split (W x = W x_hi + W x_lo over K = 2k, above) and closer to
 * W x. The other levels (ref, and avx512 and amx, whose products are bf16 instructions) do not have it:
 * calling it there aborts; their callers split x. */
bool trex_gemm_f32b_native(void);
void trex_gemm_bf16_f32b(trex_pool *pool, trex_gemm_ws *ws, int64_t M, int64_t N, int64_t K, float alpha,
                         const uint16_t *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                         int64_t ldc);
/* Rows of n floats of src (row stride n) to rows of 2n bf16 of dst, each value's bf16 rounding twice in
 * a row ([r(x0), r(x0), r(x1), r(x1), ...]: trex_gemm_bf16_f32b's A); rows over the pool. */
void trex_spread_bf16_rows(trex_pool *pool, uint16_t *dst, const float *src, int64_t rows, int64_t n);

/* A symmetric product (BLAS's syrk, both triangles written): C[n,n] = alpha op(X) op(X)^T + beta C with
 * op(X) = X stored [n, k] (ldx >= k) or, with trans, X^T of an X stored [k, n] (ldx >= n), X of type in
 * (TREX_BF16, or TREX_F32 rounded to bf16 while packed). Only the 32x32 tiles of C on and below the
 * diagonal are computed (about half the FLOPs of trex_gemm_f32_bf16 for large n), each bit-identical
 * to that tile of trex_gemm_bf16 / trex_gemm_f32_bf16 (op(A) = op(X), op(B) = op(X)^T) on the same ISA,
 * and the elements above the diagonal are then copied from below: C comes out exactly symmetric. With
 * beta != 0 only the old C's lower triangle (diagonal included) matters. D (not NULL, ldd >= n) stands
 * for the old C as in trex_gemm_problem: C = alpha op(X) op(X)^T + beta D, D's lower triangle read.
 * Newton–Schulz's Gram matrices X X^T and B = bA + cA^2 (optim/muon.c). */
void trex_gemm_syrk(trex_pool *pool, trex_gemm_ws *ws, trex_dtype in, bool trans, int64_t n, int64_t k,
                    float alpha, const void *X, int64_t ldx, float beta, float *C, int64_t ldc, const float *D,
                    int64_t ldd);

/* One problem of a grouped GEMM: C[M,N] = alpha * op(A) op(B) + beta * C, A/B/C as in trex_gemm_bf16
 * (A and B of the call's input type). M, N or K may be 0. With D not NULL, beta's term reads D [M,N]
 * (ldd >= N) instead: C = alpha * op(A) op(B) + beta * D, each element with the operations it would
 * have with D's value in C (so D = C is the plain problem); D must not overlap C unless D == C.
 * Newton–Schulz's aX + XB without a pass that writes aX first.
 * The operations (every bf16 GEMM entry): with alpha = 1 each element's fp32 sum starts from beta * D
 * (rounded once; beta 0: from zero, D not read) and adds the products in the order of kernels/
 * gemm_panels.h, so beta * D stored into C first and a call with beta 1 give the same bits; with
 * alpha != 1 it starts from zero and C = alpha * sum + beta * D. */
typedef struct trex_gemm_problem {
    int64_t M, N, K;
    const void *A;
    int64_t lda;
    const void *B;
    int64_t ldb;
    float *C;
    int64_t ldc;
    const float *D;
    int64_t ldd;
} trex_gemm_problem;

/* Every problem of the list in one call (MoE experts over tokens permuted by expert), with shared
 * input type (TREX_BF16, or TREX_F32 rounded to bf16 while packing), transposes, alpha and beta. The
 * rows of blocks of C of all problems form one list that the pool's threads take from as they become
 * free, so large and small problems share every thread. The C matrices must not overlap. */
void trex_gemm_grouped(trex_pool *pool, trex_gemm_ws *ws, trex_dtype in, bool ta, bool tb,
                       float alpha, float beta, const trex_gemm_problem *probs, int64_t count);

/* trex_gemm_grouped with A of type a_in and B of type b_in (each TREX_BF16, or TREX_F32 rounded to bf16
 * while packing): bf16 activations against fp32 weights. Each operand is packed to the same bytes as
 * in trex_gemm_grouped, so the results are bit-identical to it on the same values. */
void trex_gemm_grouped_mixed(trex_pool *pool, trex_gemm_ws *ws, trex_dtype a_in, trex_dtype b_in,
                             bool ta, bool tb, float alpha, float beta,
                             const trex_gemm_problem *probs, int64_t count);

/* ---- pre-packed B operands (weights packed once, used by many GEMMs) ----------------------------------
 * A trex_gemm_packed holds op(B) of a bf16 GEMM ([K, N]) rounded to bf16 and packed once into the panel
 * format every micro-kernel reads (kernels/gemm_panels.h; the same bytes on every ISA). GEMMs with it
 * skip packing B, and their results are bit-identical to trex_gemm_bf16 / trex_gemm_f32_bf16 (and the
 * grouped call) on the same operands and ISA: the same panels meet the same micro-kernel in the same
 * order. Typical use: pack the bf16 compute copy of each weight once per optimizer step, then run every
 * forward and input-gradient product of the step from it.
 *
 * trex_gemm_pack_b: B of type in (TREX_F32, rounded to bf16 as trex_f32_to_bf16, or TREX_BF16) stored
 * [K, N] (ldb >= N) or, with tb, [N, K] (ldb >= K), exactly the B of trex_gemm_f32_bf16 with that tb.
 * Packs on the pool's threads. NULL when out of memory. N or K may be 0. */
typedef struct trex_gemm_packed trex_gemm_packed;
trex_gemm_packed *trex_gemm_pack_b(trex_pool *pool, trex_dtype in, bool tb, int64_t N, int64_t K,
                                   const void *B, int64_t ldb);
/* Packs new values of the same shape, source type and layout into p (after an optimizer step). */
void trex_gemm_repack_b(trex_pool *pool, trex_gemm_packed *p, const void *B, int64_t ldb);
/* Bytes of packed panels for op(B) of N columns and K rows: 2 * ceil(N/32)*32 * ceil(K/32)*32. */
size_t trex_gemm_pack_b_bytes(int64_t N, int64_t K);
size_t trex_gemm_packed_bytes(const trex_gemm_packed *p); /* bytes held by p (0 for NULL) */
int64_t trex_gemm_packed_n(const trex_gemm_packed *p);
int64_t trex_gemm_packed_k(const trex_gemm_packed *p);
void trex_gemm_packed_free(trex_gemm_packed *p);      /* NULL is a no-op */

/* Packed B in memory the caller owns (docs/kernels.md "Packed B over the caller's memory"): the panels
 * of a weight can then live in a block of the caller's (the experts' bf16 copies) and be written a few
 * rows at a time by whoever updates the weight (the optimizer, while the rows are in its cache).
 * trex_gemm_packed_view_b: a trex_gemm_packed for op(B) of N columns and K rows over panels (64-byte
 * aligned, trex_gemm_pack_b_bytes(N, K) bytes, the format of kernels/gemm_panels.h), which the caller
 * fills and keeps alive; the GEMMs take it as any packed B, trex_gemm_packed_free frees only the header,
 * trex_gemm_repack_b does not take it. NULL when out of memory.
 * trex_gemm_pack_b_range: writes the part columns [n0, n1) x rows [k0, k1) of op(B) ([K, N]) into such
 * panels, B pointing at that part's first element op(B)[k0][n0]: stored by rows of op(B) ([k][n] at
 * B[(k - k0) * ldb + n - n0]) or, with tb, by its columns ([n][k] at B[(n - n0) * ldb + k - k0]); type
 * in (TREX_F32, rounded as trex_f32_to_bf16, or TREX_BF16). It also writes the padding of the part's
 * edges: the zeros past K of columns [n0, n1) when k1 == K, and of the panel's columns past N when
 * n1 == N. So parts that tile [0, K) x [0, N) leave exactly the bytes of trex_gemm_pack_b, and disjoint
 * parts write disjoint bytes (threads may write disjoint parts at once). Runs on the calling thread. */
trex_gemm_packed *trex_gemm_packed_view_b(int64_t N, int64_t K, const uint16_t *panels);
/* The panels of a packed operand (trex_gemm_pack_b_bytes(N, K) bytes), for comparisons. */
const uint16_t *trex_gemm_packed_panels(const trex_gemm_packed *p);
void trex_gemm_pack_b_range(uint16_t *panels, int64_t N, int64_t K, trex_dtype in, bool tb,
                            const void *B, int64_t ldb, int64_t n0, int64_t n1, int64_t k0, int64_t k1);

/* The two uses of a linear layer's fp32 weight W [out, in] (torch layout, ldw = in):
 *   TREX_LINEAR_FWD  forward y[n,out] = x W^T: op(B) = W^T (N = out, K = in);
 *   TREX_LINEAR_DX   input gradient dx[n,in] = dy W: op(B) = W (N = in, K = out).
 * Each use is its own packed copy (2 bytes per weight each); the weight gradient dW = dy^T x has no
 * weight operand. */
typedef enum trex_linear_use { TREX_LINEAR_FWD, TREX_LINEAR_DX } trex_linear_use;
trex_gemm_packed *trex_linear_pack_weight(trex_pool *pool, trex_linear_use use, const float *W,
                                          int64_t out, int64_t in);

/* C[M,N] = alpha * op(A) B + beta * C with B pre-packed (N, K from B), A of type a_in (TREX_F32,
 * rounded while packed, or TREX_BF16), [M,K] (lda >= K) or with ta stored [K,M] (lda >= M). So
 * y = x W^T is trex_gemm_prepacked(pool, ws, TREX_F32, false, n, 1, x, in, Wfwd, 0, y, out) and
 * dx (+)= dy W is trex_gemm_prepacked(pool, ws, TREX_F32, false, n, 1, dy, out, Wdx, acc, dx, in). */
void trex_gemm_prepacked(trex_pool *pool, trex_gemm_ws *ws, trex_dtype a_in, bool ta, int64_t M,
                         float alpha, const void *A, int64_t lda, const trex_gemm_packed *B,
                         float beta, float *C, int64_t ldc);
/* trex_gemm_grouped with every B a const trex_gemm_packed * (whose N and K must equal the problem's;
 * ldb unused): the experts' forward and input-gradient products from pre-packed expert weights. */
void trex_gemm_grouped_prepacked(trex_pool *pool, trex_gemm_ws *ws, trex_dtype a_in, bool ta,
                                 float alpha, float beta, const trex_gemm_problem *probs,
                                 int64_t count);

/* Operands read through row lists, with no gathered copy of them (docs/kernels.md "Operands read through
 * a row list"): with arows (brows) non-NULL and arows[i] (brows[i]) non-NULL, row j of problem i's A (B)
 * as stored (A: [M, K], or with ta [K, M]; B: [K, N], or with tb [N, K]) is row arows[i][j] (brows[i][j])
 * of the buffer at A_i (B_i), lda (ldb) apart; any rows, repeats allowed. The listed rows are copied
 * into the packing thread's cache as they are packed. Bit-identical to gathering the rows first and
 * calling trex_gemm_grouped (trex_gemm_grouped_prepacked). For the experts' products over tokens
 * permuted by expert: the tokens' rows of x and dy straight from x and dy.
 * trex_gemm_grouped_prepacked_rows: A read through rows (not transposed), B pre-packed. */
void trex_gemm_grouped_rows(trex_pool *pool, trex_gemm_ws *ws, trex_dtype in, bool ta, bool tb, float alpha,
                            float beta, const trex_gemm_problem *probs, const int32_t *const *arows,
                            const int32_t *const *brows, int64_t count);
void trex_gemm_grouped_prepacked_rows(trex_pool *pool, trex_gemm_ws *ws, trex_dtype a_in, float alpha,
                                      float beta, const trex_gemm_problem *probs,
                                      const int32_t *const *arows, int64_t count);

/* ---- pre-packed A operands (a large A packed once, used by many GEMMs) ----------------------------------
 * trex_gemm_pack_a: A of type in (TREX_F32, rounded to bf16 as trex_f32_to_bf16, or TREX_BF16) stored
 * [M, K] (lda >= K) or, with ta, [K, M] (lda >= M), rounded and packed once into the A panel format
 * (kernels/gemm_panels.h; the same bytes on every ISA), on the pool's threads. It is a trex_gemm_packed
 * like a packed B (same size, trex_gemm_pack_b_bytes(M, K); trex_gemm_packed_n gives M, _k gives K;
 * trex_gemm_packed_free frees it), but only the entries below take it. NULL when out of memory.
 * trex_gemm_repack_a packs new values of the same shape, type and layout into it.
 *
 * trex_gemm_prepacked_a: C[M,N] = alpha * op(A) op(B) + beta * C with A pre-packed (M, K from A), B of
 * type b_in (TREX_F32, rounded while packed per call, or TREX_BF16) [K,N] (ldb >= N) or with tb stored
 * [N,K] (ldb >= K). Bit-identical to trex_gemm_bf16 / trex_gemm_f32_bf16 / trex_gemm_grouped_mixed on
 * the same operands and ISA (the same panels meet the same micro-kernel in the same order), for any
 * pool. The A panels are read in place (no per-call A packing, no workspace for A); B is packed per call
 * into ws. Intended for the bf16 LM head's logits^T [V, rows] = W3 [V, 3d] hn^T: W3 packed once per
 * optimizer step (trex_gemm_repack_a), then trex_gemm_prepacked_a(pool, ws, W3p, TREX_BF16, true, rows,
 * 1, hn3, 3d, 0, logitsT, ldl) per chunk. Measured against packing W3 per call: docs/kernels.md. */
trex_gemm_packed *trex_gemm_pack_a(trex_pool *pool, trex_dtype in, bool ta, int64_t M, int64_t K,
                                   const void *A, int64_t lda);
void trex_gemm_repack_a(trex_pool *pool, trex_gemm_packed *p, const void *A, int64_t lda);
bool trex_gemm_packed_is_a(const trex_gemm_packed *p); /* packed by trex_gemm_pack_a */
void trex_gemm_prepacked_a(trex_pool *pool, trex_gemm_ws *ws, const trex_gemm_packed *A,
                           trex_dtype b_in, bool tb, int64_t N, float alpha, const void *B,
                           int64_t ldb, float beta, float *C, int64_t ldc);

/* ---- precision-aware entries of the model (kernels/ref/gemm_mixed.c) ------------------------------
 * The model's linear layers call these with the precision of the run (docs/precision.md):
 *   compute TREX_F32   exactly trex_gemm / trex_linear_* (the fp32 reference; ws unused, may be NULL);
 *   compute TREX_BF16  trex_gemm_f32_bf16: both operands rounded to bf16 while packed (fp32 master
 *                      weights and fp32 activations stay as they are), fp32 accumulation, fp32 C.
 * Forward y = x W^T, input gradient dx = dy W (dx += with acc) and weight gradient dW += dy^T x (dW =
 * without dw_acc: a gradient that starts at zero, written instead of read back) all follow compute.
 * Any other compute value is a bug (abort). ws: the caller's workspace (NULL allocates per call). */
void trex_gemm_ex(trex_pool *pool, trex_gemm_ws *ws, trex_dtype compute, bool ta, bool tb, int64_t M,
                  int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc);
void trex_linear_forward_ex(trex_pool *pool, trex_gemm_ws *ws, trex_dtype compute, float *y,
                            const float *x, const float *W, int64_t n, int64_t in, int64_t out);
void trex_linear_backward_ex(trex_pool *pool, trex_gemm_ws *ws, trex_dtype compute, float *dx,
                             float *dW, const float *dy, const float *x, const float *W, int64_t n,
                             int64_t in, int64_t out, bool acc, bool dw_acc);

/* ---- optimizer kernels (kernels/ref/optim.c; AVX-512 and AVX2 leaves in kernels/x86/<isa>/optim.c) ------
 * The element-wise passes of the optimizer step (docs/optim.md), one table per level like the fused
 * kernels. Every level gives the same bits (tests/test_optim.c checks them on awkward lengths).
 *
 * sumsq: the sum of x[k]^2 over k < n in double, in TREX_SUMSQ_LANES fixed lanes: lane j sums
 *   (double)x[k] * (double)x[k] (exact) for k = j mod 16, k ascending, from +0; then
 *   s_j = lane_j + lane_{j+8}, t_j = s_j + s_{j+4}, u_j = t_j + t_{j+2}, result u_0 + u_1.
 *   *nonfinite gets the count of NaN/Inf elements. n may be 0 (result +0).
 * adamw: one fused AdamW pass over n elements in float arithmetic, g' = g gscale (a float multiply:
 *   exactly a gradient clipped in place beforehand), with the constants as floats (trex_adamw_f32):
 *     m = b1 m + c1 g';  v = b2 v + (c2 g') g';  w = w decay - (step_size m) / (sqrt(v) / bc2_sqrt + eps)
 *   each operation one IEEE-rounded float operation, no fused multiply-add. */
#define TREX_SUMSQ_LANES 16
/* The lanes' tree above (l[TREX_SUMSQ_LANES] is overwritten): s_j, t_j, u_j, then u_0 + u_1. Every
 * fixed-lane sum of the kernels and of mHC combines its lanes with it. */
static inline double trex_lanes_sum16(double *l)
{
    for (int j = 0; j < 8; j++)
        l[j] = l[j] + l[j + 8];
    for (int j = 0; j < 4; j++)
        l[j] = l[j] + l[j + 4];
    for (int j = 0; j < 2; j++)
        l[j] = l[j] + l[j + 2];
    return l[0] + l[1];
}
typedef struct trex_adamw_consts {
    double b1, b2, eps;
    double step_size; /* lr / (1 - beta1^t) */
    double bc2_sqrt;  /* sqrt(1 - beta2^t) */
    double decay;     /* 1 - lr wd, or 1 */
    float gscale;     /* clip factor of the gradients, 1 when not clipped */
} trex_adamw_consts;
/* The constants of trex_adamw_consts as the kernels use them: floats (1 - b1 and 1 - b2 taken in
 * double, then rounded). Per element, with gk = g gscale:
 *   m = b1 m + c1 gk,   v = b2 v + (c2 gk) gk,   w = w decay - (step_size m) / (sqrt(v) / bc2_sqrt + eps)
 * each operation one IEEE float operation in this order (docs/optim.md). */
typedef struct trex_adamw_f32 {
    float b1, c1, b2, c2, eps, step_size, bc2_sqrt, decay, gscale;
} trex_adamw_f32;
static inline void trex_adamw_consts_f32(trex_adamw_f32 *k, const trex_adamw_consts *c)
{
    k->b1 = (float)c->b1;
    k->c1 = (float)(1.0 - c->b1);
    k->b2 = (float)c->b2;
    k->c2 = (float)(1.0 - c->b2);
    k->eps = (float)c->eps;
    k->step_size = (float)c->step_size;
    k->bc2_sqrt = (float)c->bc2_sqrt;
    k->decay = (float)c->decay;
    k->gscale = c->gscale;
}
typedef double (*trex_sumsq_fn)(const float *x, int64_t n, int64_t *nonfinite);
/* scale: y[k] = a x[k] for k < n, one IEEE float multiply each (y may be x): Newton–Schulz's aX and bA on its
 * fp32 path (the bf16 GEMMs take them as their beta terms). */
typedef void (*trex_scale_fn)(float *y, const float *x, float a, int64_t n);
/* muon_normalize: x[k] = (float)((double)x[k] / norm), one IEEE double division each: Newton–Schulz's
 * X / ||X||_F (norm from sumsq).
 * muon_momentum: Muon's momentum and the matrix it orthogonalises, per element, in float (no FMA):
 *   gk = g gscale;  mom = mu mom + gk;  x = nesterov ? mu mom + gk : mom.
 * muon_update: the step, in double: w = (float)((double)w decay - scale (double)x). */
typedef void (*trex_muon_momentum_fn)(float *mom, float *x, const float *g, int64_t n, float mu, float gscale,
                                      bool nesterov);
typedef void (*trex_muon_update_fn)(float *w, const float *x, int64_t n, double decay, double scale);
typedef void (*trex_muon_normalize_fn)(float *x, int64_t n, double norm);
typedef void (*trex_adamw_fn)(float *w, float *m, float *v, const float *g, int64_t n,
                              const trex_adamw_consts *c);
typedef struct trex_optim_kernels {
    trex_isa isa;
    const char *name;
    trex_sumsq_fn sumsq;
    trex_adamw_fn adamw;
    trex_scale_fn scale;
    trex_muon_momentum_fn muon_momentum;
    trex_muon_update_fn muon_update;
    trex_muon_normalize_fn muon_normalize;
} trex_optim_kernels;
/* The table of the level in use (trex_kernels_isa(); TREX_VERBOSE=1 logs it once), and the table a
 * cap would choose on this machine (never NULL). */
const trex_optim_kernels *trex_optim_kernels_get(void);
const trex_optim_kernels *trex_optim_kernels_for(trex_isa cap);
/* The entries of a level isa, trex_<name>_<isa> (the leaves are reached only through the table). */
#define TREX_OPTIM_LEAVES(isa)                                                                        \
    double trex_sumsq_##isa(const float *x, int64_t n, int64_t *nonfinite);                           \
    void trex_adamw_##isa(float *w, float *m, float *v, const float *g, int64_t n,                    \
                          const trex_adamw_consts *c);                                                \
    void trex_scale_##isa(float *y, const float *x, float a, int64_t n);                              \
    void trex_muon_momentum_##isa(float *mom, float *x, const float *g, int64_t n, float mu,          \
                                  float gscale, bool nesterov);                                       \
    void trex_muon_update_##isa(float *w, const float *x, int64_t n, double decay, double scale);     \
    void trex_muon_normalize_##isa(float *x, int64_t n, double norm);
TREX_OPTIM_LEAVES(ref)
TREX_OPTIM_LEAVES(avx512)
TREX_OPTIM_LEAVES(avx2)

#endif
