/* model/mhc.c — the mHC layer over N tokens in fp32: HC_pre, HC_post, hc_head, forward and backward.
 *
 * The per-token math (Sinkhorn and its unrolled backward, the sigmoid gates, the collapse and the rho
 * path) lives in model/mhc_real.h and is shared with the fp64 finite-difference test. This file adds
 * the batching: fn v for all tokens and the fn gradient are GEMMs (kernels.h), every per-token step
 * runs on one thread, and the sums over tokens (scale, base) run serially in token order, so results
 * are the same for any thread count. The Sinkhorn intermediates are recomputed in the backward from
 * the saved raw mixes mu (16 floats per step would otherwise be kept per token and sub-layer).
 *
 * The fn products are skinny (24 columns of a sub-layer, n of hc_head, against K = n*d): at the
 * AVX-512 (avx512f, avx512) and AMX levels they go through the router's entries (kernels/fused.h
 * gate_fwd / gate_bwd_dx / gate_bwd_dw), which give the fp32 GEMM's bits without padding the 24 columns to a 32-wide panel
 * or packing X on every call; the strided state / dstate rows are staged through small contiguous
 * buffers (ctx->arena scratch when there is one, else the heap). There the per-token passes run in
 * blocks of FN_BLOCK tokens next to the products (HC_pre's and hc_head's forward pass right after a
 * block's fn v, while its X is in L2; their backward pass right before the block's dX pass), so X
 * is read from memory once per call instead of twice; in the backward the per-token pass only reads
 * X (dpre, the gates, Sinkhorn, the rho coefficient c) and gate_bwd_dx_mhc adds all three dX terms
 * (w dx_in, -c X, dz fn) in one pass over the block's dX. At the ref and avx2 levels the blocked
 * trex_gemm runs the products and the passes run on their own: the same bits either way
 * (tests/test_mhc.c, tests/test_fused.c).
 * rho's sum of squares is the fused table's sumsq (16 fixed lanes, mhc_rho_f's bits at every level). */
#include "model/mhc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "trex/alloc.h"

#define MHC_REAL float
#define MHC_SUFFIX f
#define MHC_EXP expf
#define MHC_SQRT sqrtf
#include "model/mhc_real.h"

_Static_assert(TREX_MHC_MAX_N == MHC_MAX_N && TREX_MHC_MAX_ITERS == MHC_MAX_ITERS,
               "mhc.h and mhc_real.h limits differ");

trex_code trex_mhc_check(const trex_config *cfg, trex_err *err)
{
    if (cfg->hc_mult < 1 || cfg->hc_mult > TREX_MHC_MAX_N)
        return trex_err_set(err, TREX_EINVAL,
                            "config %s: hc_mult: %lld is outside 1..%d — use 4 (DeepSeek-V4)",
                            cfg->name, (long long)cfg->hc_mult, TREX_MHC_MAX_N);
    if (cfg->hc_sinkhorn_iters < 1 || cfg->hc_sinkhorn_iters > TREX_MHC_MAX_ITERS)
        return trex_err_set(err, TREX_EINVAL,
                            "config %s: hc_sinkhorn_iters: %lld is outside 1..%d — use 20 (DeepSeek-V4)",
                            cfg->name, (long long)cfg->hc_sinkhorn_iters, TREX_MHC_MAX_ITERS);
    if (!(cfg->hc_eps >= 0.0) || !(cfg->rms_norm_eps >= 0.0))
        return trex_err_set(err, TREX_EINVAL,
                            "config %s: hc_eps / rms_norm_eps must be >= 0 — use 1e-6", cfg->name);
    return TREX_OK;
}

typedef struct mhc_job {
    int n, iters;
    int64_t d, ss, ds; /* stream length, state and dstate stride (floats per token) */
    int64_t w_off;     /* the stream weights' offset in a state row (backward: pre, or hc_head's w) */
    float eps, norm_eps;
    float *out, *state, *dstate, *dX, *dy;
    /* backward at the gate level: the per-token pass leaves dX alone and writes c (mhc_rho_bwd_coef)
     * here; gate_bwd_dx_mhc then adds all three dX terms in one pass. NULL: the pass updates dX. */
    float *coef;
    const float *X, *y, *dXo, *dx_in;
    const float *scale, *base;
    const trex_fused_table *fk; /* collapse and HC_post on the widest ISA (same bits) */
} mhc_job;

static int64_t token_grain(int64_t nd)
{
    return nd >= 65536 ? 1 : 65536 / (nd > 0 ? nd : 1);
}

static mhc_job job_make(const trex_config *cfg)
{
    mhc_job j;
    memset(&j, 0, sizeof j);
    j.n = (int)cfg->hc_mult;
    j.iters = (int)cfg->hc_sinkhorn_iters;
    j.d = cfg->hidden_size;
    j.eps = (float)cfg->hc_eps;
    j.norm_eps = (float)cfg->rms_norm_eps;
    j.ss = trex_mhc_state_size(j.n);
    j.ds = trex_mhc_dstate_size(j.n);
    j.fk = trex_fused();
    return j;
}

/* ---- the fn products ---------------------------------------------------------------------------- */

/* The fused gate entries at the AVX-512 and AMX levels (the reference entries are plain loops, slower
 * than the blocked GEMM at the ref and avx2 levels). */
static const trex_fused_table *gate_table(void)
{
    const trex_fused_table *f = trex_fused();
    return f->isa >= TREX_ISA_AVX512F ? f : NULL;
}

typedef struct fn_job {
    /* the table's entries, or their _fma variants in bf16 mode (gate_entries) */
    trex_fused_gate_fwd_fn gate_fwd;
    trex_fused_gate_bwd_dw_fn gate_bwd_dw;
    trex_fused_gate_bwd_dx_mhc_fn gate_bwd_dx_mhc;
    const float *X, *fn, *fnT; /* X [N, nd], fn [E, nd], fnT [nd, E] */
    float *fnTw;               /* fnT while it is being written */
    float *rows;               /* state (forward) or dstate (backward) rows, stride ld, E floats used */
    float *z;                  /* contiguous [N, E] staging */
    float *dX, *dfn, *ws;
    int64_t N, nd, E, ld;
    mhc_job *mj; /* backward: the layer's job (dx_in, the stream weights, coef) */
    /* The per-token pass of the layer, run on each block of FN_BLOCK rows right after the forward
     * product (it reads the same X rows, still in cache) or right before the backward's dX pass
     * (which reads the same X rows and the dz and c it wrote). Its results depend on the token
     * alone. Forward: tok(tok_arg) (NULL: none); backward: tok(mj). */
    trex_task_fn tok;
    void *tok_arg;
} fn_job;

/* The products' entries of table f: in bf16 mode the _fma variants (each term of a sum one fused
 * multiply-add: fp32 still, one rounding per term instead of two; docs/precision.md), in fp32 mode the
 * fp32 GEMM's bits. */
static void gate_entries(fn_job *j, const trex_ctx *ctx, const trex_fused_table *f)
{
    const bool fma = ctx->compute == TREX_BF16;
    j->gate_fwd = fma ? f->gate_fwd_fma : f->gate_fwd;
    j->gate_bwd_dw = fma ? f->gate_bwd_dw_fma : f->gate_bwd_dw;
    j->gate_bwd_dx_mhc = fma ? f->gate_bwd_dx_mhc_fma : f->gate_bwd_dx_mhc;
}

/* Rows per block of the fused product + per-token pass: 16 tokens of n d = 4096 floats are 256 KiB
 * of X, which stays in L2 between the two. */
#define FN_BLOCK 16

/* Scratch of `floats` floats: from the arena (released by the caller's rewind) or the heap. */
static float *fn_scratch(const trex_ctx *ctx, int64_t floats)
{
    const size_t bytes = (size_t)(floats > 0 ? floats : 1) * sizeof(float);
    if (!ctx->arena)
        return trex_xmalloc(bytes);
    float *p = trex_arena_alloc_uninit(ctx->arena, bytes);
    if (!p)
        TREX_ABORT("mhc: out of activation memory for %zu bytes of scratch", bytes);
    return p;
}

/* fnT[k][e] = fn[e][k] for k in [k0, k1) */
static void fn_transpose_cols(void *arg, int64_t k0, int64_t k1, int tid)
{
    (void)tid;
    const fn_job *j = arg;
    for (int64_t kb = k0; kb < k1; kb += 64) {
        const int64_t ke = kb + 64 < k1 ? kb + 64 : k1;
        for (int64_t e = 0; e < j->E; e++)
            for (int64_t k = kb; k < ke; k++)
                j->fnTw[k * j->E + e] = j->fn[e * j->nd + k];
    }
}

/* rows [t0, t1) by blocks: z = X fn^T, into the strided rows, then the per-token pass */
static void fn_fwd_rows(void *arg, int64_t t0, int64_t t1, int tid)
{
    const fn_job *j = arg;
    for (int64_t a = t0; a < t1; a += FN_BLOCK) {
        const int64_t b = a + FN_BLOCK < t1 ? a + FN_BLOCK : t1;
        j->gate_fwd(j->z + a * j->E, j->X + a * j->nd, j->fnT, b - a, j->nd, j->E);
        for (int64_t t = a; t < b; t++)
            memcpy(j->rows + t * j->ld, j->z + t * j->E, (size_t)j->E * sizeof(float));
        if (j->tok)
            j->tok(j->tok_arg, a, b, tid);
    }
}

/* rows [t0, t1) by blocks: the per-token pass (dz and c; dX untouched), stage dz from the strided
 * rows, then dX = dz fn + ((dX + w dx_in) - c X) in one pass over the block */
static void fn_bwd_dx_rows(void *arg, int64_t t0, int64_t t1, int tid)
{
    const fn_job *j = arg;
    mhc_job *m = j->mj;
    for (int64_t a = t0; a < t1; a += FN_BLOCK) {
        const int64_t b = a + FN_BLOCK < t1 ? a + FN_BLOCK : t1;
        j->tok(m, a, b, tid);
        for (int64_t t = a; t < b; t++)
            memcpy(j->z + t * j->E, j->rows + t * j->ld, (size_t)j->E * sizeof(float));
        j->gate_bwd_dx_mhc(j->dX + a * j->nd, j->z + a * j->E, j->fn, b - a, m->n, m->d, j->E,
                           j->X + a * j->nd, m->dx_in + a * m->d, m->state + a * m->ss + m->w_off,
                           m->ss, m->coef + a);
    }
}

/* columns of the 16-wide units [u0, u1): dfn += dz^T X */
static void fn_bwd_dw_cols(void *arg, int64_t u0, int64_t u1, int tid)
{
    (void)tid;
    const fn_job *j = arg;
    j->gate_bwd_dw(j->dfn, j->ws, j->z, j->X, j->N, j->nd, j->E, u0 * 16,
                      u1 * 16 < j->nd ? u1 * 16 : j->nd);
}

/* rows[t][0..E) = X[t] fn^T (stride ld), the bits of trex_gemm(.., beta 0); then tok(tok_arg) over
 * the tokens (each block of tokens right after its product at the gate level, else a pass of its own
 * after the GEMM). */
static void fn_forward(const trex_ctx *ctx, int64_t N, int64_t E, int64_t nd, const float *X,
                       const float *fn, float *rows, int64_t ld, trex_task_fn tok, void *tok_arg)
{
    const trex_fused_table *f = gate_table();
    if (!f || N == 0) {
        trex_gemm(ctx->pool, false, true, N, E, nd, 1.0f, X, nd, fn, nd, 0.0f, rows, ld);
        trex_pool_for(ctx->pool, N, token_grain(nd), tok, tok_arg);
        return;
    }
    trex_arena_mark mk = {0};
    if (ctx->arena)
        mk = trex_arena_mark_get(ctx->arena);
    float *fnT = fn_scratch(ctx, nd * E + N * E);
    fn_job j = {.X = X, .fn = fn, .fnT = fnT, .fnTw = fnT, .rows = rows, .z = fnT + nd * E,
                .N = N, .nd = nd, .E = E, .ld = ld, .tok = tok, .tok_arg = tok_arg};
    gate_entries(&j, ctx, f);
    trex_pool_for(ctx->pool, nd, 1024, fn_transpose_cols, &j);
    trex_pool_for(ctx->pool, N, FN_BLOCK, fn_fwd_rows, &j);
    if (ctx->arena)
        trex_arena_rewind(ctx->arena, mk);
    else
        free(fnT);
}

/* First tok(mj) over the tokens (it writes the dz rows; with mj->coef NULL it also adds the collapse
 * and rho terms to dX), then dX += dz fn and dfn += dz^T X with dz = rows[t][0..E) (stride ld): the
 * bits of trex_gemm(.., beta 1). At the gate level each block of tokens gets its dX pass right after
 * its per-token pass: gate_bwd_dx_mhc adds the three terms (collapse, rho, dz fn) in one pass over
 * the block's dX, the same operations in the same order as the separate passes. */
static void fn_backward(const trex_ctx *ctx, int64_t N, int64_t E, int64_t nd, float *dX, float *dfn,
                        const float *rows, int64_t ld, const float *X, const float *fn,
                        trex_task_fn tok, mhc_job *mj)
{
    const trex_fused_table *f = gate_table();
    if (!f || N == 0) {
        mj->coef = NULL;
        trex_pool_for(ctx->pool, N, token_grain(nd), tok, mj);
        trex_gemm(ctx->pool, false, false, N, nd, E, 1.0f, rows, ld, fn, nd, 1.0f, dX, nd);
        trex_gemm(ctx->pool, true, false, E, nd, N, 1.0f, rows, ld, X, nd, 1.0f, dfn, nd);
        return;
    }
    trex_arena_mark mk = {0};
    if (ctx->arena)
        mk = trex_arena_mark_get(ctx->arena);
    float *ws = fn_scratch(ctx, E * nd + N * E + N);
    mj->coef = ws + E * nd + N * E;
    fn_job j = {.X = X, .fn = fn, .rows = (float *)rows, .z = ws + E * nd, .dX = dX,
                .dfn = dfn, .ws = ws, .N = N, .nd = nd, .E = E, .ld = ld, .tok = tok, .mj = mj};
    gate_entries(&j, ctx, f);
    trex_pool_for(ctx->pool, N, FN_BLOCK, fn_bwd_dx_rows, &j);
    trex_pool_for(ctx->pool, (nd + 15) / 16, 1, fn_bwd_dw_cols, &j);
    mj->coef = NULL;
    if (ctx->arena)
        trex_arena_rewind(ctx->arena, mk);
    else
        free(ws);
}

/* ---- HC_pre ------------------------------------------------------------------------------------ */

/* Tokens in groups of SK_LANES run their Sinkhorn side by side, one token per SSE2 lane (n = 4 only;
 * mhc_sinkhorn4x_* in mhc_real.h: each lane the scalar loops' operations, so the same bits); the
 * rest one at a time. The Sinkhorn of one token is a chain of 2 iters - 1 dependent divisions; four
 * tokens in lanes fill the divider instead of waiting on it. */
#if defined(__SSE2__)
#define SK_LANES 4
#define SK4_SCRATCH MHC_SK_SCRATCH(4, MHC_MAX_ITERS)

/* Four tokens' comb logits L[q] -> comb[q] (mhc_sinkhorn_fwd_f's bits); sk4: the lanes' scratch. */
static void sinkhorn4x_fwd(int iters, float eps, float L[SK_LANES][16], float *const comb[SK_LANES],
                           __m128 *sk4)
{
    __m128 Lv[16], Mv[16];
    for (int i = 0; i < 16; i++)
        Lv[i] = _mm_setr_ps(L[0][i], L[1][i], L[2][i], L[3][i]);
    mhc_sinkhorn4x_fwd(iters, eps, Lv, Mv, sk4);
    for (int i = 0; i < 16; i++) {
        float v[4];
        _mm_storeu_ps(v, Mv[i]);
        for (int q = 0; q < 4; q++)
            comb[q][i] = v[q];
    }
}

/* Four tokens' Sinkhorn VJP: the forward again from L[q], then dL[q] from dM[q] (mhc_sinkhorn_bwd_f's
 * bits). */
static void sinkhorn4x_bwd(int iters, float eps, float L[SK_LANES][16],
                           const float *const dM[SK_LANES], float *const dL[SK_LANES], __m128 *sk4)
{
    __m128 Lv[16], Mv[16], G[16];
    for (int i = 0; i < 16; i++) {
        Lv[i] = _mm_setr_ps(L[0][i], L[1][i], L[2][i], L[3][i]);
        G[i] = _mm_setr_ps(dM[0][i], dM[1][i], dM[2][i], dM[3][i]);
    }
    mhc_sinkhorn4x_fwd(iters, eps, Lv, Mv, sk4);
    mhc_sinkhorn4x_bwd(iters, sk4, G, G);
    for (int i = 0; i < 16; i++) {
        float v[4];
        _mm_storeu_ps(v, G[i]);
        for (int q = 0; q < 4; q++)
            dL[q][i] = v[q];
    }
}
#else
#define SK_LANES 1
#endif

/* the tokens of the next group at t of [t, t1) */
static int sk_group(int n, int64_t t, int64_t t1)
{
    return n == 4 && t1 - t >= SK_LANES ? SK_LANES : 1;
}

static void pre_fwd_tokens(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const mhc_job *j = arg;
    const int n = j->n, mix = (2 + n) * n;
    const int64_t nd = n * j->d;
    float sk[MHC_SK_SCRATCH_MAX];
#if SK_LANES > 1
    __m128 sk4[SK4_SCRATCH];
#endif
    for (int64_t t = t0; t < t1;) {
        const int g = sk_group(n, t, t1);
        float L[SK_LANES][16], *comb[SK_LANES];
        for (int q = 0; q < g; q++) {
            float *st = j->state + (t + q) * j->ss, *mu = st + 1, *mixes = st + 1 + mix;
            const float *X = j->X + (t + q) * nd;
            st[0] = mhc_rho_ss_f(j->fk->sumsq(X, nd), nd, j->norm_eps); /* = mhc_rho_f's bits */
            for (int m = 0; m < mix; m++)
                mu[m] *= st[0];
            if (g == 1) {
                mhc_mix_fwd_f(n, j->iters, j->eps, j->scale, j->base, mu, mixes, sk);
            } else {
                mhc_mix_gates_f(n, j->eps, j->scale, j->base, mu, mixes, L[q]);
                comb[q] = mixes + 2 * n;
            }
        }
#if SK_LANES > 1
        if (g > 1)
            sinkhorn4x_fwd(j->iters, j->eps, L, comb, sk4);
#endif
        for (int q = 0; q < g; q++)
            j->fk->mhc_collapse(n, j->d, j->state + (t + q) * j->ss + 1 + mix, j->X + (t + q) * nd,
                                j->out + (t + q) * j->d);
        t += g;
    }
}

void trex_mhc_pre_forward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *x_in,
                          float *state, const float *X, const trex_mhc_w *w)
{
    mhc_job j = job_make(cfg);
    const int64_t mix = trex_mhc_mix(j.n), nd = j.n * j.d;
    j.out = x_in;
    j.state = state;
    j.X = X;
    j.scale = w->scale;
    j.base = w->base;
    /* fn v of every token, straight into the mu slot of its state row, then the per-token pass */
    fn_forward(ctx, N, mix, nd, X, w->fn, state + 1, j.ss, pre_fwd_tokens, &j);
}

static void collapse_tokens(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const mhc_job *j = arg;
    const int mix = (2 + j->n) * j->n;
    const int64_t nd = j->n * j->d;
    for (int64_t t = t0; t < t1; t++)
        j->fk->mhc_collapse(j->n, j->d, j->state + t * j->ss + 1 + mix, j->X + t * nd,
                            j->out + t * j->d);
}

void trex_mhc_pre_collapse(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *x_in,
                           const float *state, const float *X)
{
    mhc_job j = job_make(cfg);
    j.out = x_in;
    j.state = (float *)state;
    j.X = X;
    trex_pool_for(ctx->pool, N, token_grain(j.n * j.d), collapse_tokens, &j);
}

static void pre_bwd_tokens(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const mhc_job *j = arg;
    const int n = j->n, mix = (2 + n) * n;
    const int64_t nd = n * j->d;
    float sk[MHC_SK_SCRATCH_MAX];
#if SK_LANES > 1
    __m128 sk4[SK4_SCRATCH];
#endif
    for (int64_t t = t0; t < t1;) {
        const int g = sk_group(n, t, t1);
        float L[SK_LANES][16], *dL[SK_LANES];
        const float *dM[SK_LANES];
        for (int q = 0; q < g; q++) {
            const float *st = j->state + (t + q) * j->ss, *mu = st + 1, *mixes = st + 1 + mix;
            float *dout = j->dstate + (t + q) * j->ds, *dz = dout + mix, *dscale = dz + mix;
            float *dX = j->coef ? NULL : j->dX + (t + q) * nd;
            /* dpre_k = X_k . dx_in; dX_k += pre_k dx_in (with coef: added later by gate_bwd_dx_mhc) */
            j->fk->mhc_collapse_bwd(n, j->d, mixes, j->X + (t + q) * nd, j->dx_in + (t + q) * j->d,
                                    dout, dX);
            if (g == 1) {
                mhc_mix_bwd_f(n, j->iters, j->eps, j->scale, j->base, mu, dout, dz, dout, dscale, sk);
            } else {
                mhc_mix_logits_f(n, j->scale, j->base, mu, L[q]);
                dM[q] = dout + 2 * n;
                dL[q] = dz + 2 * n;
            }
        }
#if SK_LANES > 1
        if (g > 1)
            sinkhorn4x_bwd(j->iters, j->eps, L, dM, dL, sk4);
#endif
        for (int q = 0; q < g; q++) {
            const float *st = j->state + (t + q) * j->ss, *mu = st + 1;
            float *dout = j->dstate + (t + q) * j->ds, *dz = dout + mix, *dscale = dz + mix;
            if (g > 1)
                mhc_mix_bwd_gates_f(n, j->scale, j->base, mu, dout, dz, dout, dscale);
            if (j->coef)
                j->coef[t + q] = mhc_rho_bwd_coef_f(mix, nd, st[0], mu, dout);
            else
                mhc_rho_bwd_f(mix, nd, st[0], mu, dout, j->X + (t + q) * nd, j->dX + (t + q) * nd);
            for (int m = 0; m < mix; m++)
                dout[m] *= st[0]; /* rho dmu: the row the fn GEMMs below consume */
        }
        t += g;
    }
}

/* g->scale[0..ngroups) and g->base[0..rows) += the per-token sums in dstate, in token order. */
static void sum_scale_base(const trex_mhc_w *g, const float *dstate, int64_t N, int64_t ds,
                           int rows, int64_t dz_off, int64_t dscale_off, int ngroups)
{
    for (int m = 0; m < rows; m++) {
        double s = 0.0;
        for (int64_t t = 0; t < N; t++)
            s += dstate[t * ds + dz_off + m];
        g->base[m] += (float)s;
    }
    for (int k = 0; k < ngroups; k++) {
        double s = 0.0;
        for (int64_t t = 0; t < N; t++)
            s += dstate[t * ds + dscale_off + k];
        g->scale[k] += (float)s;
    }
}

void trex_mhc_pre_backward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *dX,
                           const trex_mhc_w *g, float *dstate, const float *dx_in, const float *X,
                           const trex_mhc_w *w, const float *state)
{
    mhc_job j = job_make(cfg);
    const int64_t mix = trex_mhc_mix(j.n), nd = j.n * j.d;
    j.dX = dX;
    j.dstate = dstate;
    j.dx_in = dx_in;
    j.X = X;
    j.state = (float *)state;
    j.w_off = 1 + mix;
    j.scale = w->scale;
    j.base = w->base;
    /* the per-token pass, then dX += (rho dmu) fn;  dfn += (rho dmu)^T X */
    fn_backward(ctx, N, mix, nd, dX, g->fn, dstate, j.ds, X, w->fn, pre_bwd_tokens, &j);
    sum_scale_base(g, dstate, N, j.ds, (int)mix, mix, 2 * mix, 3);
}

/* ---- HC_post ----------------------------------------------------------------------------------- */

static void post_fwd_tokens(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const mhc_job *j = arg;
    const int n = j->n, mix = (2 + n) * n;
    const int64_t nd = n * j->d;
    for (int64_t t = t0; t < t1; t++) {
        const float *mixes = j->state + t * j->ss + 1 + mix;
        j->fk->mhc_post_fwd(n, j->d, mixes + n, mixes + 2 * n, j->y + t * j->d, j->X + t * nd,
                            j->out + t * nd);
    }
}

void trex_mhc_post_forward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *Xo,
                           const float *y, const float *X, const float *state)
{
    mhc_job j = job_make(cfg);
    TREX_ASSERT(Xo != X);
    j.out = Xo;
    j.y = y;
    j.X = X;
    j.state = (float *)state;
    trex_pool_for(ctx->pool, N, token_grain(j.n * j.d), post_fwd_tokens, &j);
}

static void post_bwd_tokens(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const mhc_job *j = arg;
    const int n = j->n, mix = (2 + n) * n;
    const int64_t nd = n * j->d;
    for (int64_t t = t0; t < t1; t++) {
        const float *mixes = j->state + t * j->ss + 1 + mix;
        float *dout = j->dstate + t * j->ds;
        j->fk->mhc_post_bwd(n, j->d, mixes + n, mixes + 2 * n, j->y + t * j->d, j->X + t * nd,
                            j->dXo + t * nd, j->dy + t * j->d, j->dX + t * nd, dout + n,
                            dout + 2 * n);
    }
}

void trex_mhc_post_backward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *dX,
                            float *dy, float *dstate, const float *dXo, const float *y,
                            const float *X, const float *state)
{
    mhc_job j = job_make(cfg);
    TREX_ASSERT(dX != dXo && dX != X);
    j.dX = dX;
    j.dy = dy;
    j.dstate = dstate;
    j.dXo = dXo;
    j.y = y;
    j.X = X;
    j.state = (float *)state;
    trex_pool_for(ctx->pool, N, token_grain(j.n * j.d), post_bwd_tokens, &j);
}

/* ---- hc_head ----------------------------------------------------------------------------------- */

static void head_fwd_tokens(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const mhc_job *j = arg;
    const int n = j->n;
    const int64_t nd = n * j->d;
    for (int64_t t = t0; t < t1; t++) {
        float *st = j->state + t * j->ss, *mu = st + 1, *w = st + 1 + n;
        const float *X = j->X + t * nd;
        st[0] = mhc_rho_ss_f(j->fk->sumsq(X, nd), nd, j->norm_eps);
        for (int k = 0; k < n; k++) {
            mu[k] *= st[0];
            w[k] = mhc_sigmoid_f(j->scale[0] * mu[k] + j->base[k]) + j->eps;
        }
        j->fk->mhc_collapse(n, j->d, w, X, j->out + t * j->d);
    }
}

void trex_mhc_head_forward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *h,
                           float *state, const float *X, const trex_mhc_w *w)
{
    mhc_job j = job_make(cfg);
    const int64_t nd = j.n * j.d;
    j.ss = trex_mhc_head_state_size(j.n);
    j.out = h;
    j.state = state;
    j.X = X;
    j.scale = w->scale;
    j.base = w->base;
    fn_forward(ctx, N, j.n, nd, X, w->fn, state + 1, j.ss, head_fwd_tokens, &j);
}

static void head_bwd_tokens(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const mhc_job *j = arg;
    const int n = j->n;
    const int64_t nd = n * j->d;
    for (int64_t t = t0; t < t1; t++) {
        const float *st = j->state + t * j->ss, *mu = st + 1, *w = st + 1 + n;
        const float *X = j->X + t * nd;
        float *dX = j->dX + t * nd;
        float *work = j->dstate + t * j->ds, *dz = work + n;
        float dw[MHC_MAX_N];
        j->fk->mhc_collapse_bwd(n, j->d, w, X, j->dx_in + t * j->d, dw, j->coef ? NULL : dX);
        work[2 * n] = mhc_head_w_bwd_f(n, j->scale, j->base, mu, dw, dz, work);
        if (j->coef)
            j->coef[t] = mhc_rho_bwd_coef_f(n, nd, st[0], mu, work);
        else
            mhc_rho_bwd_f(n, nd, st[0], mu, work, X, dX);
        for (int k = 0; k < n; k++)
            work[k] *= st[0];
    }
}

void trex_mhc_head_backward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *dX,
                            const trex_mhc_w *g, float *dstate, const float *dh, const float *X,
                            const trex_mhc_w *w, const float *state)
{
    mhc_job j = job_make(cfg);
    const int64_t nd = j.n * j.d;
    j.ss = trex_mhc_head_state_size(j.n);
    j.ds = trex_mhc_head_dstate_size(j.n);
    j.w_off = 1 + j.n;
    j.dX = dX;
    j.dstate = dstate;
    j.dx_in = dh;
    j.X = X;
    j.state = (float *)state;
    j.scale = w->scale;
    j.base = w->base;
    fn_backward(ctx, N, j.n, nd, dX, g->fn, dstate, j.ds, X, w->fn, head_bwd_tokens, &j);
    sum_scale_base(g, dstate, N, j.ds, j.n, j.n, 2 * j.n, 1);
}
