/* kernels/gemm_panels.h — the packed-panel contract between the blocked GEMM framework
 * (kernels/ref/gemm_blocked.c, portable C) and the micro-kernels and packing routines of each ISA.
 *
 * Every operand is seen as a "rows x K" matrix X[r][k]: op(A) with r = m, and op(B)^T with r = n. Each
 * is packed into panels of TREX_GEMM_MR (= TREX_GEMM_NR = 32) rows; K is padded with zeros to Kp, a
 * multiple of TREX_GEMM_KU (32). Panel p of an operand holds 32 * Kp bf16 values from p*32*Kp on, as
 * Kp/32 consecutive steps of 32 k, each step 1024 values (2 KiB):
 *
 *   A format (A operands):    step [32 rows][32 k]         element (r, k) at (k/32)*1024 + r*32 + k%32
 *   VNNI format (B operands): step [16 k-pairs][32][2]     element (r, k) at (k/2)*64 + r*2 + k%2
 *
 * One step of the A format is two AMX A tiles (rows 0-15 and 16-31, 64-byte rows, contiguous); one step
 * of the VNNI format is two AMX B tiles (columns 0-15 and 16-31: 16 k-pairs at a stride of 128 bytes)
 * and what VDPBF16PS multiplies. A micro-kernel thus reads 4 KiB of consecutive memory per step of k,
 * which the hardware prefetchers stream well (rows of A a long stride apart measured 5-13% slower).
 * Rows past the operand's end and k past K are zero, so every micro-kernel call computes a full 32x32
 * block, and padding contributes exact zeros.
 *
 * The micro-kernel contract (trex_gemm_ukr_fn in kernels/dispatch.h): over a panel pair's first kp k,
 *   out[0:32, 0:32] (ldo floats apart) = (flags & ACCUMULATE ? in : 0) + sum over k < kp of A[:, k] B[:, k]^T
 * kp a positive multiple of 32 (a slice of longer panels starts at their step k0/32). The block stays in
 * registers for the whole sum (in loaded and out stored once). Sums are fp32; bf16 inputs are exact in
 * fp32, so every product is exact. Subnormal bf16 inputs count as zero at the levels of bf16 instructions
 * (AMX and AVX512_BF16 do so; the reference micro-kernel copies them); the FMA levels (avx2, avx512f) take
 * them as they are, a difference below 1e-37 per product. Each output element is summed in
 * increasing k in a fixed order that depends only on kp, and the block between two calls is that fp32
 * sum: a call over k [0, k1) followed by one over [k1, kp) starting from its out gives the bits of one
 * call over kp (the framework's K slices rely on it). With TREX_UKR_STREAM (and out 64-byte aligned,
 * ldo a multiple of 16) out may be written with non-temporal stores, which the level's gemm_end fences.
 *
 * The fp32-pair format (B operands of trex_gemm_bf16_f32b, at the levels whose products are fp32 FMAs)
 * is the VNNI format's layout with each pair's dword holding one fp32 value: B's k-th value at the pair
 * of k-pair index k, i.e. element (r, k) of the fp32 operand at float (k/16)*512 + (k%16)*32 + r. Its K
 * counts pairs as two, as the A operand it meets does: that A holds each bf16 value twice (k-pair q of A
 * is value q twice: trex_spread_bf16_rows), and the micro-kernel (gemm_ukr_f32b) multiplies the first of
 * each pair of A by the fp32 value in one FMA. Sums still run in increasing k, one rounding each.
 *
 * A pre-packed B (trex_gemm_pack_b in kernels/kernels.h) is exactly these VNNI panels, ceil(N/32) of
 * them one after the other, packed once by the caller with the level's pack_b; every level packs the
 * same bytes, so a packed operand can be used by any level. A pre-packed A (trex_gemm_pack_a) is likewise
 * ceil(M/32) A-format panels one after the other; a block of C rows reads its panels in place.
 *
 * The leaf entry points below are reached only through the dispatch table (kernels/dispatch.c). */
#ifndef TREX_KERNELS_GEMM_PANELS_H
#define TREX_KERNELS_GEMM_PANELS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/dispatch.h"
#include "kernels/kernels.h"

#define TREX_GEMM_MR 32
#define TREX_GEMM_NR 32
#define TREX_GEMM_KU 32

/* The framework with an explicit table (tests and benchmarks run each variant through it). */
void trex_gemm_grouped_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws,
                            trex_dtype in, bool ta, bool tb, float alpha, float beta,
                            const trex_gemm_problem *probs, int64_t count);
trex_gemm_packed *trex_gemm_pack_b_with(const trex_kernel_table *t, trex_pool *pool, trex_dtype in,
                                        bool tb, int64_t N, int64_t K, const void *B, int64_t ldb);
trex_gemm_packed *trex_gemm_pack_a_with(const trex_kernel_table *t, trex_pool *pool, trex_dtype in,
                                        bool ta, int64_t M, int64_t K, const void *A, int64_t lda);
void trex_gemm_prepacked_a_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws,
                                const trex_gemm_packed *A, trex_dtype b_in, bool tb, int64_t N,
                                float alpha, const void *B, int64_t ldb, float beta, float *C,
                                int64_t ldc);
void trex_gemm_grouped_prepacked_rows_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws,
                                           trex_dtype a_in, float alpha, float beta,
                                           const trex_gemm_problem *probs, const int32_t *const *arows,
                                           int64_t count);
void trex_gemm_grouped_rows_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws, trex_dtype in,
                                 bool ta, bool tb, float alpha, float beta, const trex_gemm_problem *probs,
                                 const int32_t *const *arows, const int32_t *const *brows, int64_t count);
void trex_gemm_syrk_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws, trex_dtype in, bool trans,
                         int64_t n, int64_t k, float alpha, const void *X, int64_t ldx, float beta, float *C,
                         int64_t ldc, const float *D, int64_t ldd);
void trex_gemm_pack_b_range_with(const trex_kernel_table *t, uint16_t *panels, int64_t N, int64_t K,
                                 trex_dtype in, bool tb, const void *B, int64_t ldb, int64_t n0,
                                 int64_t n1, int64_t k0, int64_t k1);
void trex_gemm_bf16_f32b_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws, int64_t M, int64_t N,
                              int64_t K, float alpha, const uint16_t *A, int64_t lda, const float *B, int64_t ldb,
                              float beta, float *C, int64_t ldc);
void trex_gemm_grouped_prepacked_with(const trex_kernel_table *t, trex_pool *pool, trex_gemm_ws *ws,
                                      trex_dtype a_in, bool ta, float alpha, float beta,
                                      const trex_gemm_problem *probs, int64_t count);

/* ---- leaves ---------------------------------------------------------------------------------------- */

/* Every level's micro-kernels, packers and conversions (the reference's in kernels/ref/bf16.c and
 * kernels/ref/gemm.c, the others in kernels/x86/<isa>/): trex_<name>_<isa>. The packers and
 * conversions alone: TREX_GEMM_PACK_LEAVES (the avx512f level has its own, and the avx512 level's fp32
 * micro-kernel). */
#define TREX_GEMM_PACK_LEAVES(isa)                                                                    \
    void trex_pack_a_bf16_##isa(uint16_t *dst, const void *src, int64_t rs, int64_t ks, int64_t rows, \
                                int64_t kc, int64_t kcp);                                             \
    void trex_pack_a_f32_##isa(uint16_t *dst, const void *src, int64_t rs, int64_t ks, int64_t rows,  \
                               int64_t kc, int64_t kcp);                                              \
    void trex_pack_b_bf16_##isa(uint16_t *dst, const void *src, int64_t rs, int64_t ks, int64_t rows, \
                                int64_t kc, int64_t kcp);                                             \
    void trex_pack_b_f32_##isa(uint16_t *dst, const void *src, int64_t rs, int64_t ks, int64_t rows,  \
                               int64_t kc, int64_t kcp);                                              \
    void trex_cvt_f32_bf16_##isa(uint16_t *dst, const float *src, int64_t n);                         \
    void trex_cvt_bf16_f32_##isa(float *dst, const uint16_t *src, int64_t n);
#define TREX_GEMM_LEAVES(isa)                                                                         \
    TREX_GEMM_PACK_LEAVES(isa)                                                                        \
    void trex_gemm_ukr_##isa(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,  \
                             unsigned flags);                                                         \
    void trex_gemm_f32_ukr_##isa(int64_t K, const float *ap, const float *bp, float *acc);

/* plain C reference */
TREX_GEMM_LEAVES(ref)
void trex_gemm_tile_t_ref(float *dst, int64_t ldd, const float *t, int64_t rows, int64_t cols);

/* AVX-512 F/BW/VL + BF16 (the fp32 micro-kernel, the transpose, the fence and the FMA peak use F/BW/VL
 * only, kernels/x86/avx512/gemm_f32.c: the avx512f level runs them too) */
TREX_GEMM_LEAVES(avx512)
void trex_gemm_tile_t_avx512(float *dst, int64_t ldd, const float *t, int64_t rows, int64_t cols);
void trex_gemm_end_avx512(void);
double trex_peak_f32_fma_avx512(int64_t iters);
double trex_peak_bf16_dp_avx512(int64_t iters);

/* AVX-512 F/BW/VL without BF16: the avx512 packers compiled again, a micro-kernel of fp32 FMAs */
TREX_GEMM_PACK_LEAVES(avx512f)
void trex_gemm_ukr_avx512f(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                           unsigned flags);
void trex_gemm_ukr_f32b_avx512f(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                                unsigned flags);

/* AVX2 + FMA */
TREX_GEMM_LEAVES(avx2)
void trex_gemm_ukr_f32b_avx2(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                             unsigned flags);
double trex_peak_f32_fma_avx2(int64_t iters);

/* AMX-TILE + AMX-BF16 (with the AVX-512 packers) */
void trex_gemm_ukr_amx(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                       unsigned flags);
void trex_gemm_begin_amx(void);
void trex_gemm_end_amx(void);
double trex_peak_bf16_amx(int64_t iters);

/* ---- the ISA packers' common frame (kernels/x86/<isa>/pack.c) --------------------------------------- */

/* A packer's source, X[r][k] = src[(r*rs + k*ks) * esz bytes], rs or ks 1, rows x kc. */
typedef struct trex_pack_view {
    const char *src;
    size_t esz; /* 4 (fp32, rounded to bf16 while packed) or 2 (bf16) */
    bool f32;
    int64_t rs, ks, rows, kc;
} trex_pack_view;

/* The four packer entries of a level, trex_pack_{a,b}_{bf16,f32}_<isa>, from its two functions
 * pack_a(dst, view, kcp) and pack_b(...) (static in the level's pack.c). Sources with neither stride
 * 1 (only a degenerate caller makes them) take the reference path. */
#define TREX_PACK_ENTRY(isa, ab, type, is_f32, fn)                                                  \
    void trex_pack_##ab##_##type##_##isa(uint16_t *dst, const void *src, int64_t rs, int64_t ks,     \
                                         int64_t rows, int64_t kc, int64_t kcp)                     \
    {                                                                                               \
        if (rs != 1 && ks != 1) {                                                                   \
            trex_pack_##ab##_##type##_ref(dst, src, rs, ks, rows, kc, kcp);                         \
            return;                                                                                 \
        }                                                                                           \
        const trex_pack_view x = {src, is_f32 ? 4 : 2, is_f32, rs, ks, rows, kc};                   \
        fn(dst, &x, kcp);                                                                           \
    }
#define TREX_PACK_ENTRIES(isa, pack_a, pack_b)                                                      \
    TREX_PACK_ENTRY(isa, a, bf16, false, pack_a)                                                    \
    TREX_PACK_ENTRY(isa, a, f32, true, pack_a)                                                      \
    TREX_PACK_ENTRY(isa, b, bf16, false, pack_b)                                                    \
    TREX_PACK_ENTRY(isa, b, f32, true, pack_b)

#endif
