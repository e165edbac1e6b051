/* kernels/ref/fused.c — the reference entries of the fused-kernel table and the table choice.
 *
 * The reference entries are the model's own scalar code (model/attention_math.h, model/mhc_real.h,
 * float instances), wrapped to the table's signatures; the AVX-512 leaves (kernels/x86/avx512/fused.c)
 * must give the same bits. The table follows the kernel dispatch level (trex_kernels_isa), read once. */
#include "kernels/fused.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trex/tensor.h"

#define AM_REAL float
#define AM_SFX f
#include "model/attention_math.h"

#define MHC_REAL float
#define MHC_SUFFIX f
#define MHC_EXP expf
#define MHC_SQRT sqrtf
#include "model/mhc_real.h"

static float dot_ref(const float *a, const float *b, int64_t n)
{
    return am_dot_f(a, b, n);
}

static void axpy_ref(float *y, float a, const float *x, int64_t n)
{
    am_axpy_f(y, a, x, n);
}

static void axpy_rows_ref(float *Y, int64_t ldy, int64_t R, const float *A, const unsigned char *on,
                          int64_t sr, int64_t sj, const float *const *X, int64_t J, int64_t c)
{
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < J; j++)
            if (on[r * sr + j * sj])
                am_axpy_f(Y + r * ldy, A[r * sr + j * sj], X[j], c);
}

static void copy_nt_ref(float *dst, const float *src, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof *dst);
}

static void cvt_bf16_nt_ref(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = trex_f32_to_bf16(src[i]);
}

static void rope_ref(float *v, int64_t nv, int64_t ld, const float *cs, const float *sn,
                     int64_t half, int inverse)
{
    for (int64_t k = 0; k < nv; k++) {
        float *x = v + k * ld;
        for (int64_t i = 0; i < half; i++) { /* model/rope.c trex_rope_rotate */
            const float a = x[2 * i], b = x[2 * i + 1];
            const float c = cs[i], s = inverse ? -sn[i] : sn[i];
            x[2 * i] = a * c - b * s;
            x[2 * i + 1] = a * s + b * c;
        }
    }
}

static void rms_head_bwd_ref(float *g, const float *q, const float *rs, int64_t H, int64_t c)
{
    for (int64_t h = 0; h < H; h++) {
        float *gh = g + h * c;
        const float *qh = q + h * c, r = rs[h];
        const float m = am_dot_f(gh, qh, c) / (float)c;
        for (int64_t i = 0; i < c; i++)
            gh[i] = r * (gh[i] - qh[i] * m);
    }
}

static void dots_ref(float *out, const float *A, int64_t lda, int64_t R, const float *const *V,
                     int64_t n, int64_t c)
{
    for (int64_t r = 0; r < R; r++)
        for (int64_t e = 0; e < n; e++)
            out[r * n + e] = am_dot_f(A + r * lda, V[e], c);
}

static void sattn_fwd_ref(float *o, float *lse, float *z, float *ws, const float *q,
                          const float *const *V, int64_t n, int64_t H, int64_t c, const float *sink,
                          float scale)
{
    (void)ws;
    am_sattn_forward_f(o, lse, z, q, V, n, H, c, sink, scale);
}

static void sattn_bwd_query_ref(float *dq, float *dsink, float *P, float *ws, const float *g,
                                const float *q, const float *const *V, int64_t n, int64_t H,
                                int64_t c, const float *sink, float scale, const float *lse,
                                const float *D)
{
    (void)ws;
    am_sattn_backward_query_f(dq, dsink, P, g, q, V, n, H, c, sink, scale, lse, D);
}

static void sattn_bwd_entries_ref(float *const *dV, float *psum, float *ws, const float *const *V,
                                  int64_t n, const float *q, const float *g, int64_t H, int64_t c,
                                  float scale, const float *lse, const float *D)
{
    (void)ws;
    am_sattn_backward_entries_f(dV, psum, V, n, q, g, H, c, scale, lse, D);
}

static void mhc_post_fwd_ref(int n, int64_t d, const float *post, const float *comb,
                             const float *y, const float *X, float *Xo)
{
    mhc_post_tok_fwd_f(n, d, post, comb, y, X, Xo);
}

static void mhc_post_bwd_ref(int n, int64_t d, const float *post, const float *comb,
                             const float *y, const float *X, const float *dXo, float *dy, float *dX,
                             float *dpost, float *dcomb)
{
    mhc_post_tok_bwd_f(n, d, post, comb, y, X, dXo, dy, dX, dpost, dcomb);
}

static void mhc_collapse_ref(int n, int64_t d, const float *w, const float *X, float *x)
{
    mhc_collapse_f(n, d, w, X, x);
}

static void mhc_collapse_bwd_ref(int n, int64_t d, const float *w, const float *X, const float *dx,
                                 float *dw, float *dX)
{
    mhc_collapse_bwd_f(n, d, w, X, dx, dw, dX);
}

/* The bf16 attention core of a level isa (kernels/fused.h, TREX_FUSED_ATTN_BF16_LEAVES). */
#define ATTN_BF16_ENTRIES(isa)                                                                \
    .sattn_fwd_bf16 = trex_fused_sattn_fwd_bf16_##isa,                                        \
    .sattn_bwd_query_bf16 = trex_fused_sattn_bwd_query_bf16_##isa,                            \
    .sattn_bwd_entries_bf16 = trex_fused_sattn_bwd_entries_bf16_##isa,                        \
    .sattn_bwd_window_bf16 = trex_fused_sattn_bwd_window_bf16_##isa,                          \
    .sattn_fwd_block_bf16 = trex_fused_sattn_fwd_block_bf16_##isa,                            \
    .sattn_bwd_query_block_bf16 = trex_fused_sattn_bwd_query_block_bf16_##isa,                \
    .sattn_bwd_query_keys_bf16 = trex_fused_sattn_bwd_query_keys_bf16_##isa,                  \
    .sattn_bwd_query_block_keys_bf16 = trex_fused_sattn_bwd_query_block_keys_bf16_##isa,      \
    .sattn_key_product_bf16 = trex_fused_sattn_key_product_bf16_##isa,                        \
    .sattn_bf16_name = #isa,                                                                  \
    .dots_bf16 = trex_fused_dots_bf16_##isa

/* The reference entries that the avx2 level shares: the fp32 attention core, the router's products, the
 * cross-entropy's exp and the head's bf16x3 split. */
#define REF_ENTRIES_SHARED                                      \
    .sattn_fwd = sattn_fwd_ref,                                 \
    .sattn_bwd_query = sattn_bwd_query_ref,                     \
    .sattn_bwd_entries = sattn_bwd_entries_ref,                 \
    .gate_fwd = trex_fused_gate_fwd_ref,                        \
    .gate_bwd_dx = trex_fused_gate_bwd_dx_ref,                  \
    .gate_bwd_dw = trex_fused_gate_bwd_dw_ref,                  \
    .gate_bwd_dx_mhc = trex_fused_gate_bwd_dx_mhc_ref,          \
    .gate_fwd_fma = trex_fused_gate_fwd_fma_ref,                \
    .gate_bwd_dw_fma = trex_fused_gate_bwd_dw_fma_ref,          \
    .gate_bwd_dx_mhc_fma = trex_fused_gate_bwd_dx_mhc_fma_ref,  \
    .ce_exp = trex_fused_ce_exp_ref,                            \
    .split3 = trex_fused_split3_ref

static const trex_fused_table table_ref = {
    .isa = TREX_ISA_REF,
    .name = "ref",
    REF_ENTRIES_SHARED,
    .dot = dot_ref,
    .dots = dots_ref,
    .axpy = axpy_ref,
    .axpy_rows = axpy_rows_ref,
    .copy_nt = copy_nt_ref,
    .cvt_bf16_nt = cvt_bf16_nt_ref,
    .rope = rope_ref,
    .rms_head_bwd = rms_head_bwd_ref,
    .kl_qgrad = trex_fused_kl_qgrad_ref,
    .kl_kgrad = trex_fused_kl_kgrad_ref,
    .pool_fwd = trex_fused_pool_fwd_ref,
    .pool_bwd = trex_fused_pool_bwd_ref,
    .sumsq = trex_fused_sumsq_ref,
    .rmsnorm_fwd = trex_fused_rmsnorm_fwd_ref,
    .rmsnorm_bwd = trex_fused_rmsnorm_bwd_ref,
    .rmsnorm_dw = trex_fused_rmsnorm_dw_ref,
    .ce_fwd = trex_fused_ce_fwd_ref,
    .ce_grad = trex_fused_ce_grad_ref,
    .swiglu_fwd_bf16 = trex_fused_swiglu_fwd_bf16_ref,
    .swiglu_bwd_bf16 = trex_fused_swiglu_bwd_bf16_ref,
    .mhc_post_fwd = mhc_post_fwd_ref,
    .mhc_post_bwd = mhc_post_bwd_ref,
    .mhc_collapse = mhc_collapse_ref,
    .mhc_collapse_bwd = mhc_collapse_bwd_ref,
    ATTN_BF16_ENTRIES(ref),
};

#if defined(__x86_64__) || defined(__i386__)
/* AVX2: the shared reference entries; the vector entries, the indexer KL's, RMSNorm's, the pooling's,
 * the cross-entropy's, SwiGLU's and mHC's of kernels/x86/avx2 (the reference's bits); the bf16 attention
 * core on tiles of fp32 FMAs (kernels/x86/avx2/attn.c: the avx512f level's bits). */
static const trex_fused_table table_avx2 = {
    .isa = TREX_ISA_AVX2,
    .name = "avx2",
    REF_ENTRIES_SHARED,
    .dot = trex_fused_dot_avx2,
    .dots = trex_fused_dots_avx2,
    .axpy = trex_fused_axpy_avx2,
    .axpy_rows = trex_fused_axpy_rows_avx2,
    .copy_nt = trex_fused_copy_nt_avx2,
    .cvt_bf16_nt = trex_fused_cvt_bf16_nt_avx2,
    .rope = trex_fused_rope_avx2,
    .rms_head_bwd = trex_fused_rms_head_bwd_avx2,
    .kl_qgrad = trex_fused_kl_qgrad_avx2,
    .kl_kgrad = trex_fused_kl_kgrad_avx2,
    .pool_fwd = trex_fused_pool_fwd_avx2,
    .pool_bwd = trex_fused_pool_bwd_avx2,
    .sumsq = trex_fused_sumsq_avx2,
    .rmsnorm_fwd = trex_fused_rmsnorm_fwd_avx2,
    .rmsnorm_bwd = trex_fused_rmsnorm_bwd_avx2,
    .rmsnorm_dw = trex_fused_rmsnorm_dw_avx2,
    .ce_fwd = trex_fused_ce_fwd_avx2,
    .ce_grad = trex_fused_ce_grad_avx2,
    .swiglu_fwd_bf16 = trex_fused_swiglu_fwd_bf16_avx2,
    .swiglu_bwd_bf16 = trex_fused_swiglu_bwd_bf16_avx2,
    .mhc_post_fwd = trex_fused_mhc_post_fwd_avx2,
    .mhc_post_bwd = trex_fused_mhc_post_bwd_avx2,
    .mhc_collapse = trex_fused_mhc_collapse_avx2,
    .mhc_collapse_bwd = trex_fused_mhc_collapse_bwd_avx2,
    ATTN_BF16_ENTRIES(avx2),
};

/* The AVX-512 leaves of a level sfx (avx512 or avx512f): those of the files that round to bf16
 * (TREX_FUSED_AVX512_LEVEL_LEAVES) by the level's name, the F/BW/VL ones (norm, router, pool,
 * attn_kl) shared. */
#define AVX512_ENTRIES(sfx)                                        \
    .dot = trex_fused_dot_##sfx,                                   \
    .dots = trex_fused_dots_##sfx,                                 \
    .axpy = trex_fused_axpy_##sfx,                                 \
    .axpy_rows = trex_fused_axpy_rows_##sfx,                       \
    .kl_qgrad = trex_fused_kl_qgrad_avx512,                        \
    .kl_kgrad = trex_fused_kl_kgrad_avx512,                        \
    .copy_nt = trex_fused_copy_nt_##sfx,                           \
    .cvt_bf16_nt = trex_fused_cvt_bf16_nt_##sfx,                   \
    .rope = trex_fused_rope_##sfx,                                 \
    .rms_head_bwd = trex_fused_rms_head_bwd_##sfx,                 \
    .sattn_fwd = trex_fused_sattn_fwd_##sfx,                       \
    .sattn_bwd_query = trex_fused_sattn_bwd_query_##sfx,           \
    .sattn_bwd_entries = trex_fused_sattn_bwd_entries_##sfx,       \
    .mhc_post_fwd = trex_fused_mhc_post_fwd_##sfx,                 \
    .mhc_post_bwd = trex_fused_mhc_post_bwd_##sfx,                 \
    .mhc_collapse = trex_fused_mhc_collapse_##sfx,                 \
    .mhc_collapse_bwd = trex_fused_mhc_collapse_bwd_##sfx,         \
    .swiglu_fwd_bf16 = trex_fused_swiglu_fwd_bf16_##sfx,           \
    .swiglu_bwd_bf16 = trex_fused_swiglu_bwd_bf16_##sfx,           \
    .gate_fwd = trex_fused_gate_fwd_avx512,                        \
    .gate_bwd_dx = trex_fused_gate_bwd_dx_avx512,                  \
    .gate_bwd_dw = trex_fused_gate_bwd_dw_avx512,                  \
    .gate_bwd_dx_mhc = trex_fused_gate_bwd_dx_mhc_avx512,          \
    .gate_fwd_fma = trex_fused_gate_fwd_fma_avx512,                \
    .gate_bwd_dw_fma = trex_fused_gate_bwd_dw_fma_avx512,          \
    .gate_bwd_dx_mhc_fma = trex_fused_gate_bwd_dx_mhc_fma_avx512,  \
    .ce_fwd = trex_fused_ce_fwd_##sfx,                             \
    .ce_grad = trex_fused_ce_grad_##sfx,                           \
    .ce_exp = trex_fused_ce_exp_##sfx,                             \
    .pool_fwd = trex_fused_pool_fwd_avx512,                        \
    .pool_bwd = trex_fused_pool_bwd_avx512,                        \
    .split3 = trex_fused_split3_##sfx,                             \
    .sumsq = trex_fused_sumsq_avx512,                              \
    .rmsnorm_fwd = trex_fused_rmsnorm_fwd_avx512,                  \
    .rmsnorm_bwd = trex_fused_rmsnorm_bwd_avx512,                  \
    .rmsnorm_dw = trex_fused_rmsnorm_dw_avx512

/* AVX-512 without AVX512_BF16: the bf16 attention core on tiles of fp32 FMAs (kernels/x86/avx512f/attn.c) */
static const trex_fused_table table_avx512f = {
    .isa = TREX_ISA_AVX512F,
    .name = "avx512f",
    AVX512_ENTRIES(avx512f),
    ATTN_BF16_ENTRIES(avx512f),
};

static const trex_fused_table table_avx512 = {
    .isa = TREX_ISA_AVX512,
    .name = "avx512",
    AVX512_ENTRIES(avx512),
    ATTN_BF16_ENTRIES(avx512),
};

/* AMX: the avx512 table with the bf16 attention core on the tile unit (kernels/x86/amx/attn.c) */
static const trex_fused_table table_amx = {
    .isa = TREX_ISA_AMX,
    .name = "amx",
    AVX512_ENTRIES(avx512),
    ATTN_BF16_ENTRIES(amx),
};
#endif

/* Each level's table, by level (elsewhere than x86 the dispatch never picks a level above ref) */
static const trex_fused_table *const tables[TREX_ISA_COUNT] = {
    [TREX_ISA_REF] = &table_ref,
#if defined(__x86_64__) || defined(__i386__)
    [TREX_ISA_AVX2] = &table_avx2,
    [TREX_ISA_AVX512F] = &table_avx512f,
    [TREX_ISA_AVX512] = &table_avx512,
    [TREX_ISA_AMX] = &table_amx,
#endif
};

const trex_fused_table *trex_fused_for(trex_isa cap)
{
    /* trex_kernels_table_for applies the machine's limits (CPU and OS) under the cap */
    return tables[trex_kernels_table_for(cap)->isa];
}

static const trex_fused_table *active;
static pthread_once_t active_once = PTHREAD_ONCE_INIT;

static void active_init(void)
{
    active = trex_fused_for(trex_kernels_isa());
    if (trex_kernels_verbose())
        fprintf(stderr,
                "trex: kernels: fused attention / mHC / RMSNorm kernels: %s (bf16 attention core: %s)\n",
                active->name, active->sattn_bf16_name);
}

const trex_fused_table *trex_fused(void)
{
    pthread_once(&active_once, active_init);
    return active;
}
