/* model/mhc.c — the mHC layer over N tokens in fp32: HC_pre, HC_post, hc_head, forward and backward.
 *
 * The per-token math (Sinkhorn and its unrolled backward, the sigmoid gates, the collapse and the rho
 * path) lives in model/mhc_real.h and is shared with the fp64 finite-difference test. This file adds
 * the batching: fn v for all tokens and the fn gradient are GEMMs (kernels.h), every per-token step
 * runs on one thread, and the sums over tokens (scale, base) run serially in token order, so results
 * are the same for any thread count. The Sinkhorn intermediates are recomputed in the backward from
 * the saved raw mixes mu (16 floats per step would otherwise be kept per token and sub-layer). */
#include "model/mhc.h"

#include <math.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/kernels.h"

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
    float eps, norm_eps;
    float *out, *state, *dstate, *dX, *dy;
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

/* ---- HC_pre ------------------------------------------------------------------------------------ */

static void pre_fwd_tokens(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const mhc_job *j = arg;
    const int mix = (2 + j->n) * j->n;
    const int64_t nd = j->n * j->d;
    float sk[MHC_SK_SCRATCH_MAX];
    for (int64_t t = t0; t < t1; t++) {
        float *st = j->state + t * j->ss, *mu = st + 1, *mixes = st + 1 + mix;
        const float *X = j->X + t * nd;
        st[0] = mhc_rho_f(nd, X, j->norm_eps);
        for (int m = 0; m < mix; m++)
            mu[m] *= st[0];
        mhc_mix_fwd_f(j->n, j->iters, j->eps, j->scale, j->base, mu, mixes, sk);
        j->fk->mhc_collapse(j->n, j->d, mixes, X, j->out + t * j->d);
    }
}

void trex_mhc_pre_forward(const trex_ctx *ctx, const trex_config *cfg, int64_t N, float *x_in,
                          float *state, const float *X, const trex_mhc_w *w)
{
    mhc_job j = job_make(cfg);
    const int64_t mix = trex_mhc_mix(j.n), nd = j.n * j.d;
    /* fn v of every token, straight into the mu slot of its state row */
    trex_gemm(ctx->pool, false, true, N, mix, nd, 1.0f, X, nd, w->fn, nd, 0.0f, state + 1, j.ss);
    j.out = x_in;
    j.state = state;
    j.X = X;
    j.scale = w->scale;
    j.base = w->base;
    trex_pool_for(ctx->pool, N, token_grain(nd), pre_fwd_tokens, &j);
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
    for (int64_t t = t0; t < t1; t++) {
        const float *st = j->state + t * j->ss, *mu = st + 1, *mixes = st + 1 + mix;
        const float *X = j->X + t * nd;
        float *dX = j->dX + t * nd;
        float *dout = j->dstate + t * j->ds, *dz = dout + mix, *dscale = dz + mix;
        /* dpre_k = X_k . dx_in; dX_k += pre_k dx_in */
        j->fk->mhc_collapse_bwd(n, j->d, mixes, X, j->dx_in + t * j->d, dout, dX);
        mhc_mix_bwd_f(n, j->iters, j->eps, j->scale, j->base, mu, dout, dz, dout, dscale, sk);
        mhc_rho_bwd_f(mix, nd, st[0], mu, dout, X, dX);
        for (int m = 0; m < mix; m++)
            dout[m] *= st[0]; /* rho dmu: the row the fn GEMMs below consume */
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
    j.scale = w->scale;
    j.base = w->base;
    trex_pool_for(ctx->pool, N, token_grain(nd), pre_bwd_tokens, &j);
    /* dX += (rho dmu) fn;  dfn += (rho dmu)^T X */
    trex_gemm(ctx->pool, false, false, N, nd, mix, 1.0f, dstate, j.ds, w->fn, nd, 1.0f, dX, nd);
    trex_gemm(ctx->pool, true, false, mix, nd, N, 1.0f, dstate, j.ds, X, nd, 1.0f, g->fn, nd);
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
        st[0] = mhc_rho_f(nd, X, j->norm_eps);
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
    trex_gemm(ctx->pool, false, true, N, j.n, nd, 1.0f, X, nd, w->fn, nd, 0.0f, state + 1, j.ss);
    j.out = h;
    j.state = state;
    j.X = X;
    j.scale = w->scale;
    j.base = w->base;
    trex_pool_for(ctx->pool, N, token_grain(nd), head_fwd_tokens, &j);
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
        j->fk->mhc_collapse_bwd(n, j->d, w, X, j->dx_in + t * j->d, dw, dX);
        work[2 * n] = mhc_head_w_bwd_f(n, j->scale, j->base, mu, dw, dz, work);
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
    j.dX = dX;
    j.dstate = dstate;
    j.dx_in = dh;
    j.X = X;
    j.state = (float *)state;
    j.scale = w->scale;
    j.base = w->base;
    trex_pool_for(ctx->pool, N, token_grain(nd), head_bwd_tokens, &j);
    trex_gemm(ctx->pool, false, false, N, nd, j.n, 1.0f, dstate, j.ds, w->fn, nd, 1.0f, dX, nd);
    trex_gemm(ctx->pool, true, false, j.n, nd, N, 1.0f, dstate, j.ds, X, nd, 1.0f, g->fn, nd);
    sum_scale_base(g, dstate, N, j.ds, j.n, j.n, 2 * j.n, 1);
}
