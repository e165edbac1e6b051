/* tests/test_mhc.c — mHC: Sinkhorn, HC_pre, HC_post and hc_head, forward and backward.
 *
 * The per-token math of model/mhc_real.h is compiled here in double and checked against central
 * finite differences with tight tolerances (Sinkhorn alone, then a whole pre -> sub-layer -> post
 * chain, then hc_head). The fp32 layer (model/mhc.c) is checked against the double math, against
 * fp32 finite differences (loosely), and for bitwise equality across thread counts. The fn products
 * (the fused gate entries at AVX-512 and AMX) are checked bit for bit against trex_gemm (N = 1, 7, 33,
 * 70: blocks of 16 tokens per thread), and the layer's rho (the fused table's sumsq) against
 * mhc_rho_f at every level.
 *
 * `test_mhc --bench [reps [threads [call|all [fp32|bf16]]]]` times each layer call at dsv4-bench's
 * shapes (N = 4096 tokens, n = 4 streams of d = 1024) on a pool of `threads` (default 2): wall and
 * process CPU seconds, medians (docs/perf.md "mHC and fixed passes, round 6"); `call` (pre_forward,
 * ..., head_backward) times that call alone, for a profiler; bf16: the context of bf16 mode (the
 * products' _fma entries). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "check.h"
#include "kernels/fused.h"
#include "model/mhc.h"
#include "kernels/kernels.h"
#include "trex/alloc.h"
#include "trex/pool.h"

#define MHC_REAL double
#define MHC_SUFFIX d
#define MHC_EXP exp
#define MHC_SQRT sqrt
#include "model/mhc_real.h"

#define MHC_REAL float
#define MHC_SUFFIX f
#define MHC_EXP expf
#define MHC_SQRT sqrtf
#include "model/mhc_real.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double urand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void fill(double *v, int64_t n, double s)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = s * urand();
}

static double sk_buf_d[MHC_SK_SCRATCH_MAX];

/* ---- Sinkhorn in double ------------------------------------------------------------------------ */

static double sinkhorn_loss(int n, int iters, double eps, const double *L, const double *W)
{
    double M[64], s = 0.0;
    mhc_sinkhorn_fwd_d(n, iters, eps, L, M, sk_buf_d);
    for (int i = 0; i < n * n; i++)
        s += W[i] * M[i];
    return s;
}

static void test_sinkhorn(double logit_scale)
{
    const int n = 4, iters = 20;
    const double eps = 1e-6;
    double L[16], W[16], M[16], dL[16];
    fill(L, 16, logit_scale);
    fill(W, 16, 1.0);
    mhc_sinkhorn_fwd_d(n, iters, eps, L, M, sk_buf_d);
    for (int k = 0; k < n; k++) {
        double c = 0.0;
        for (int j = 0; j < n; j++)
            c += M[j * n + k];
        CHECK_NEAR(c, 1.0, 1e-5, "double Sinkhorn column sum");
    }
    mhc_sinkhorn_bwd_d(n, iters, sk_buf_d, W, dL);
    double maxerr = 0.0;
    for (int i = 0; i < 16; i++) {
        double save = L[i], h = 1e-5;
        L[i] = save + h;
        double lp = sinkhorn_loss(n, iters, eps, L, W);
        L[i] = save - h;
        double lm = sinkhorn_loss(n, iters, eps, L, W);
        L[i] = save;
        double fd = (lp - lm) / (2 * h);
        double e = fabs(fd - dL[i]) / (fabs(fd) + 1e-6);
        maxerr = e > maxerr ? e : maxerr;
        CHECK(fabs(fd - dL[i]) <= 1e-8 + 1e-6 * fabs(fd), "Sinkhorn dL[%d] (scale %g): fd %.12g vs %.12g",
              i, logit_scale, fd, dL[i]);
    }
    printf("sinkhorn scale %g: max rel err vs fd %.3g\n", logit_scale, maxerr);

    /* float: column sums too */
    float Lf[16], Mf[16];
    static float skf[MHC_SK_SCRATCH_MAX];
    for (int i = 0; i < 16; i++)
        Lf[i] = (float)L[i];
    mhc_sinkhorn_fwd_f(n, iters, (float)eps, Lf, Mf, skf);
    for (int k = 0; k < n; k++) {
        double c = 0.0;
        for (int j = 0; j < n; j++)
            c += Mf[j * n + k];
        CHECK_NEAR(c, 1.0, 1e-5, "float Sinkhorn column sum");
    }
}

/* The SSE2 Sinkhorn of four tokens in lanes (n = 4; the layer's, model/mhc.c) against the scalar
 * float loops token by token, bit for bit: outputs, saved steps and denominators, and the backward
 * (also in place, dL = dM). The four tokens get different logit scales. */
static void test_sinkhorn4(void)
{
#if defined(__SSE2__)
    static float sa[MHC_SK_SCRATCH_MAX];
    static __m128 sb[MHC_SK_SCRATCH(4, MHC_MAX_ITERS)];
    const double scales[4] = {1.0, 5.0, 20.0, 80.0};
    const int iters[] = {1, 2, 3, 20};
    bool ok = true;
    for (int b = 0; b < 4; b++)
        for (int rep = 0; rep < 8; rep++) {
            const int it = iters[b], used = MHC_SK_SCRATCH(4, it);
            float L[4][16], dM[4][16];
            __m128 Lv[16], Mv[16], G[16], dLv[16];
            for (int q = 0; q < 4; q++)
                for (int i = 0; i < 16; i++)
                    L[q][i] = (float)(scales[(q + rep) % 4] * urand()), dM[q][i] = (float)urand();
            for (int i = 0; i < 16; i++) {
                Lv[i] = _mm_setr_ps(L[0][i], L[1][i], L[2][i], L[3][i]);
                G[i] = _mm_setr_ps(dM[0][i], dM[1][i], dM[2][i], dM[3][i]);
            }
            mhc_sinkhorn4x_fwd(it, 1e-6f, Lv, Mv, sb);
            mhc_sinkhorn4x_bwd(it, sb, G, dLv);
            for (int q = 0; q < 4; q++) {
                float M[16], dL[16];
                mhc_sinkhorn_fwd_f(4, it, 1e-6f, L[q], M, sa);
                mhc_sinkhorn_bwd_f(4, it, sa, dM[q], dL);
                for (int i = 0; i < used; i++) {
                    float v[4];
                    _mm_storeu_ps(v, sb[i]);
                    ok = ok && !memcmp(&v[q], &sa[i], sizeof(float));
                }
                for (int i = 0; i < 16; i++) {
                    float m[4], g[4];
                    _mm_storeu_ps(m, Mv[i]);
                    _mm_storeu_ps(g, dLv[i]);
                    ok = ok && !memcmp(&m[q], &M[i], sizeof(float)) && !memcmp(&g[q], &dL[i], sizeof(float));
                }
            }
            mhc_sinkhorn4x_bwd(it, sb, G, G); /* in place */
            ok = ok && !memcmp(G, dLv, sizeof G);
        }
    CHECK(ok, "SSE2 Sinkhorn of 4 tokens in lanes = the scalar float loops per token, bit for bit");
#else
    printf("SSE2 Sinkhorn: skipped (no SSE2 in this build)\n");
#endif
}

/* ---- one token through pre -> tanh -> post, in double ----------------------------------------- */

enum { TN = 4, TD = 6, TMIX = (2 + TN) * TN };

typedef struct chain {
    double X[TN * TD], fn[TMIX * TN * TD], scale[3], base[TMIX], W[TN * TD];
} chain;

static double chain_loss(const chain *c)
{
    double x_in[TD], out[TMIX], mu[TMIX], rho, y[TD], Xo[TN * TD], s = 0.0;
    mhc_pre_tok_fwd_d(TN, TD, 20, 1e-6, 1e-6, c->X, c->fn, c->scale, c->base, x_in, out, mu, &rho,
                      sk_buf_d);
    for (int i = 0; i < TD; i++)
        y[i] = tanh(x_in[i]);
    mhc_post_tok_fwd_d(TN, TD, out + TN, out + 2 * TN, y, c->X, Xo);
    for (int i = 0; i < TN * TD; i++)
        s += c->W[i] * Xo[i];
    return s;
}

static void chain_grad(const chain *c, double *dX, double *dfn, double *dscale, double *dbase)
{
    double x_in[TD], out[TMIX], mu[TMIX], rho, y[TD], dy[TD], dpost[TN], dcomb[TN * TN];
    mhc_pre_tok_fwd_d(TN, TD, 20, 1e-6, 1e-6, c->X, c->fn, c->scale, c->base, x_in, out, mu, &rho,
                      sk_buf_d);
    for (int i = 0; i < TD; i++)
        y[i] = tanh(x_in[i]);
    mhc_post_tok_bwd_d(TN, TD, out + TN, out + 2 * TN, y, c->X, c->W, dy, dX, dpost, dcomb);
    for (int i = 0; i < TD; i++)
        dy[i] *= 1.0 - y[i] * y[i];
    memset(dfn, 0, sizeof(double) * TMIX * TN * TD);
    memset(dscale, 0, sizeof(double) * 3);
    memset(dbase, 0, sizeof(double) * TMIX);
    mhc_pre_tok_bwd_d(TN, TD, 20, 1e-6, c->X, c->fn, c->scale, c->base, out, mu, rho, dy, dpost,
                      dcomb, dX, dfn, dscale, dbase, sk_buf_d);
}

static double fd_at(chain *c, double *p, double h)
{
    double save = *p;
    *p = save + h;
    double lp = chain_loss(c);
    *p = save - h;
    double lm = chain_loss(c);
    *p = save;
    return (lp - lm) / (2 * h);
}

static void check_vec(chain *c, double *p, const double *g, int64_t n, int64_t stride, const char *what)
{
    double maxerr = 0.0;
    for (int64_t i = 0; i < n; i += stride) {
        double fd = fd_at(c, p + i, 1e-5);
        double err = fabs(fd - g[i]);
        maxerr = err > maxerr ? err : maxerr;
        CHECK(err <= 1e-8 + 1e-6 * fabs(fd), "%s[%lld]: fd %.12g vs analytic %.12g", what, (long long)i,
              fd, g[i]);
    }
    printf("double chain %s: max abs err vs fd %.3g\n", what, maxerr);
}

static void test_chain_double(void)
{
    static chain c;
    fill(c.X, TN * TD, 1.0);
    fill(c.fn, TMIX * TN * TD, 0.5);
    c.scale[0] = 0.7, c.scale[1] = -0.4, c.scale[2] = 1.3;
    fill(c.base, TMIX, 1.0);
    fill(c.W, TN * TD, 1.0);
    static double dX[TN * TD], dfn[TMIX * TN * TD], dscale[3], dbase[TMIX];
    chain_grad(&c, dX, dfn, dscale, dbase);
    check_vec(&c, c.X, dX, TN * TD, 1, "dX");
    check_vec(&c, c.fn, dfn, TMIX * TN * TD, 7, "dfn");
    check_vec(&c, c.scale, dscale, 3, 1, "dscale");
    check_vec(&c, c.base, dbase, TMIX, 1, "dbase");
}

/* ---- hc_head in double ------------------------------------------------------------------------- */

typedef struct headc {
    double X[TN * TD], fn[TN * TN * TD], scale[1], base[TN], W[TD];
} headc;

static double head_loss(const headc *c)
{
    double h[TD], w[TN], mu[TN], rho, s = 0.0;
    mhc_head_tok_fwd_d(TN, TD, 1e-6, 1e-6, c->X, c->fn, c->scale, c->base, h, w, mu, &rho);
    for (int i = 0; i < TD; i++)
        s += c->W[i] * h[i];
    return s;
}

static void test_head_double(void)
{
    static headc c;
    fill(c.X, TN * TD, 1.0);
    fill(c.fn, TN * TN * TD, 0.5);
    c.scale[0] = 0.9;
    fill(c.base, TN, 1.0);
    fill(c.W, TD, 1.0);
    double h[TD], w[TN], mu[TN], rho;
    static double dX[TN * TD], dfn[TN * TN * TD];
    double dscale[1] = {0}, dbase[TN] = {0};
    mhc_head_tok_fwd_d(TN, TD, 1e-6, 1e-6, c.X, c.fn, c.scale, c.base, h, w, mu, &rho);
    mhc_head_tok_bwd_d(TN, TD, c.X, c.fn, c.scale, c.base, w, mu, rho, c.W, dX, dfn, dscale, dbase);
    struct {
        double *p;
        const double *g;
        int64_t n;
        const char *what;
    } v[] = {{c.X, dX, TN * TD, "head dX"},
             {c.fn, dfn, TN * TN * TD, "head dfn"},
             {c.scale, dscale, 1, "head dscale"},
             {c.base, dbase, TN, "head dbase"}};
    for (int k = 0; k < 4; k++) {
        double maxerr = 0.0;
        for (int64_t i = 0; i < v[k].n; i++) {
            double save = v[k].p[i], hh = 1e-5;
            v[k].p[i] = save + hh;
            double lp = head_loss(&c);
            v[k].p[i] = save - hh;
            double lm = head_loss(&c);
            v[k].p[i] = save;
            double fd = (lp - lm) / (2 * hh), err = fabs(fd - v[k].g[i]);
            maxerr = err > maxerr ? err : maxerr;
            CHECK(err <= 1e-8 + 1e-6 * fabs(fd), "%s[%lld]: fd %.12g vs %.12g", v[k].what, (long long)i, fd,
                  v[k].g[i]);
        }
        printf("double %s: max abs err vs fd %.3g\n", v[k].what, maxerr);
    }
}

/* ---- the fp32 layer over N tokens ---------------------------------------------------------------- */

enum { LN = 5, LD = 16, LNS = 4, LMIX = (2 + LNS) * LNS };

typedef struct layer_case {
    trex_config cfg;
    float X[LN * LNS * LD], fn[LMIX * LNS * LD], scale[3], base[LMIX], W[LN * LNS * LD];
    float hfn[LNS * LNS * LD], hscale[1], hbase[LNS], Wh[LN * LD];
} layer_case;

/* loss = sum W . HC_post(tanh(HC_pre(X)), X) + sum Wh . hc_head(X), accumulated in double. */
static double layer_loss(const trex_ctx *ctx, layer_case *c)
{
    static float x_in[LN * LD], y[LN * LD], Xo[LN * LNS * LD], h[LN * LD];
    static float state[LN * (1 + 2 * LMIX)], hstate[LN * (1 + 2 * LNS)];
    trex_mhc_w w = {c->fn, c->scale, c->base}, hw = {c->hfn, c->hscale, c->hbase};
    trex_mhc_pre_forward(ctx, &c->cfg, LN, x_in, state, c->X, &w);
    for (int i = 0; i < LN * LD; i++)
        y[i] = tanhf(x_in[i]);
    trex_mhc_post_forward(ctx, &c->cfg, LN, Xo, y, c->X, state);
    trex_mhc_head_forward(ctx, &c->cfg, LN, h, hstate, c->X, &hw);
    double s = 0.0;
    for (int i = 0; i < LN * LNS * LD; i++)
        s += (double)c->W[i] * Xo[i];
    for (int i = 0; i < LN * LD; i++)
        s += (double)c->Wh[i] * h[i];
    return s;
}

typedef struct layer_grads {
    float dX[LN * LNS * LD], dfn[LMIX * LNS * LD], dscale[3], dbase[LMIX];
    float dhfn[LNS * LNS * LD], dhscale[1], dhbase[LNS];
    float x_in[LN * LD];
} layer_grads;

static void layer_grad(const trex_ctx *ctx, layer_case *c, layer_grads *g)
{
    static float x_in[LN * LD], y[LN * LD], Xo[LN * LNS * LD], h[LN * LD], dy[LN * LD];
    static float state[LN * (1 + 2 * LMIX)], hstate[LN * (1 + 2 * LNS)];
    static float dstate[LN * (2 * LMIX + 3)], hdstate[LN * (2 * LNS + 1)];
    memset(g, 0, sizeof *g);
    trex_mhc_w w = {c->fn, c->scale, c->base}, hw = {c->hfn, c->hscale, c->hbase};
    trex_mhc_w gw = {g->dfn, g->dscale, g->dbase}, ghw = {g->dhfn, g->dhscale, g->dhbase};
    trex_mhc_pre_forward(ctx, &c->cfg, LN, x_in, state, c->X, &w);
    memcpy(g->x_in, x_in, sizeof x_in);
    static float again[LN * LD];
    trex_mhc_pre_collapse(ctx, &c->cfg, LN, again, state, c->X);
    CHECK(memcmp(again, x_in, sizeof x_in) == 0, "pre_collapse recomputes x_in bit for bit");
    for (int t = 0; t < LN; t++)
        for (int k = 0; k < LNS; k++) {
            double cs = 0.0;
            for (int j = 0; j < LNS; j++)
                cs += state[t * (1 + 2 * LMIX) + 1 + LMIX + 2 * LNS + j * LNS + k];
            CHECK_NEAR(cs, 1.0, 1e-5, "layer comb column sum");
        }
    for (int i = 0; i < LN * LD; i++)
        y[i] = tanhf(x_in[i]);
    trex_mhc_post_forward(ctx, &c->cfg, LN, Xo, y, c->X, state);
    trex_mhc_head_forward(ctx, &c->cfg, LN, h, hstate, c->X, &hw);
    trex_mhc_post_backward(ctx, &c->cfg, LN, g->dX, dy, dstate, c->W, y, c->X, state);
    for (int i = 0; i < LN * LD; i++)
        dy[i] *= 1.0f - y[i] * y[i];
    trex_mhc_pre_backward(ctx, &c->cfg, LN, g->dX, &gw, dstate, dy, c->X, &w, state);
    trex_mhc_head_backward(ctx, &c->cfg, LN, g->dX, &ghw, hdstate, c->Wh, c->X, &hw, hstate);
}

static void check_layer_fd(const trex_ctx *ctx, layer_case *c, float *p, const float *g, int64_t n,
                           int64_t stride, const char *what)
{
    double maxerr = 0.0;
    for (int64_t i = 0; i < n; i += stride) {
        float save = p[i], h = 1e-2f;
        p[i] = save + h;
        double lp = layer_loss(ctx, c);
        p[i] = save - h;
        double lm = layer_loss(ctx, c);
        p[i] = save;
        double fd = (lp - lm) / (2.0 * h);
        double err = fabs(fd - g[i]);
        maxerr = err > maxerr ? err : maxerr;
        CHECK(err <= 2e-3 + 2e-2 * fabs(fd), "fp32 layer %s[%lld]: fd %.7g vs analytic %.7g", what,
              (long long)i, fd, g[i]);
    }
    printf("fp32 layer %s: max abs err vs fp32 fd %.3g\n", what, maxerr);
}

static void test_layer(void)
{
    static layer_case c;
    memset(&c, 0, sizeof c);
    c.cfg.hidden_size = LD;
    c.cfg.hc_mult = LNS;
    c.cfg.hc_sinkhorn_iters = 20;
    c.cfg.hc_eps = 1e-6;
    c.cfg.rms_norm_eps = 1e-6;
    CHECK(trex_mhc_check(&c.cfg, NULL) == TREX_OK, "config accepted");
    trex_config bad = c.cfg;
    bad.hc_mult = 9;
    trex_err err;
    CHECK(trex_mhc_check(&bad, &err) == TREX_EINVAL && strstr(err.msg, "hc_mult"), "hc_mult 9 rejected");
    static double tmp[LMIX * LNS * LD];
#define FILLF(arr, s)                                       \
    do {                                                    \
        int64_t n_ = (int64_t)(sizeof(arr) / sizeof(arr[0])); \
        fill(tmp, n_, s);                                   \
        for (int64_t i_ = 0; i_ < n_; i_++)                 \
            arr[i_] = (float)tmp[i_];                       \
    } while (0)
    FILLF(c.X, 1.0);
    FILLF(c.fn, 0.3);
    c.scale[0] = 0.7f, c.scale[1] = -0.4f, c.scale[2] = 1.3f;
    FILLF(c.base, 1.0);
    FILLF(c.W, 1.0);
    FILLF(c.hfn, 0.3);
    c.hscale[0] = 0.8f;
    FILLF(c.hbase, 1.0);
    FILLF(c.Wh, 1.0);

    trex_pool *p1 = trex_pool_create(1), *p3 = trex_pool_create(3);
    CHECK(p1 && p3, "pools");
    trex_ctx ctx1 = {.pool = p1}, ctx3 = {.pool = p3};
    static layer_grads g1, g3;
    layer_grad(&ctx1, &c, &g1);
    layer_grad(&ctx3, &c, &g3);
    CHECK(memcmp(&g1, &g3, sizeof g1) == 0, "fp32 layer: 1 and 3 threads give identical bits");

    /* forward and backward against the double per-token math */
    double maxf = 0.0, maxb = 0.0;
    static double gfn[LMIX * LNS * LD];
    double gscale[3] = {0}, gbase[LMIX] = {0};
    memset(gfn, 0, sizeof gfn);
    for (int t = 0; t < LN; t++) {
        double X[LNS * LD], fn[LMIX * LNS * LD], scale[3], base[LMIX];
        double x_in[LD], out[LMIX], mu[LMIX], rho, y[LD], dy[LD], dpost[LNS], dcomb[LNS * LNS];
        double W[LNS * LD], dX[LNS * LD];
        for (int i = 0; i < LNS * LD; i++)
            X[i] = c.X[t * LNS * LD + i], W[i] = c.W[t * LNS * LD + i];
        for (int i = 0; i < LMIX * LNS * LD; i++)
            fn[i] = c.fn[i];
        for (int i = 0; i < 3; i++)
            scale[i] = c.scale[i];
        for (int i = 0; i < LMIX; i++)
            base[i] = c.base[i];
        mhc_pre_tok_fwd_d(LNS, LD, 20, 1e-6, 1e-6, X, fn, scale, base, x_in, out, mu, &rho, sk_buf_d);
        for (int i = 0; i < LD; i++) {
            double e = fabs(x_in[i] - g1.x_in[t * LD + i]);
            maxf = e > maxf ? e : maxf;
            y[i] = tanh(x_in[i]);
        }
        mhc_post_tok_bwd_d(LNS, LD, out + LNS, out + 2 * LNS, y, X, W, dy, dX, dpost, dcomb);
        for (int i = 0; i < LD; i++)
            dy[i] *= 1.0 - y[i] * y[i];
        mhc_pre_tok_bwd_d(LNS, LD, 20, 1e-6, X, fn, scale, base, out, mu, rho, dy, dpost, dcomb, dX, gfn,
                          gscale, gbase, sk_buf_d);
        /* the head part of dX is left out here: compare dX only through fn, scale, base below */
    }
    for (int i = 0; i < LMIX * LNS * LD; i++) {
        double e = fabs(gfn[i] - g1.dfn[i]);
        maxb = e > maxb ? e : maxb;
    }
    for (int i = 0; i < 3; i++)
        CHECK_NEAR(g1.dscale[i], gscale[i], 1e-4 + 1e-4 * fabs(gscale[i]), "fp32 vs fp64 dscale");
    for (int i = 0; i < LMIX; i++)
        CHECK_NEAR(g1.dbase[i], gbase[i], 1e-4 + 1e-4 * fabs(gbase[i]), "fp32 vs fp64 dbase");
    CHECK(maxf < 1e-5, "fp32 vs fp64 x_in: max err %.3g", maxf);
    CHECK(maxb < 1e-4, "fp32 vs fp64 dfn: max err %.3g", maxb);
    printf("fp32 layer vs fp64 math: x_in max err %.3g, dfn max err %.3g\n", maxf, maxb);

    check_layer_fd(&ctx3, &c, c.X, g1.dX, LN * LNS * LD, 3, "dX");
    check_layer_fd(&ctx3, &c, c.fn, g1.dfn, LMIX * LNS * LD, 37, "dfn");
    check_layer_fd(&ctx3, &c, c.scale, g1.dscale, 3, 1, "dscale");
    check_layer_fd(&ctx3, &c, c.base, g1.dbase, LMIX, 1, "dbase");
    check_layer_fd(&ctx3, &c, c.hfn, g1.dhfn, LNS * LNS * LD, 5, "head dfn");
    check_layer_fd(&ctx3, &c, c.hscale, g1.dhscale, 1, 1, "head dscale");
    check_layer_fd(&ctx3, &c, c.hbase, g1.dhbase, LNS, 1, "head dbase");
    trex_pool_destroy(p1);
    trex_pool_destroy(p3);
}

/* ---- the fn products against trex_gemm -------------------------------------------------------- */

enum { GNS = 4, GMIX = (2 + GNS) * GNS };

static float *randf(int64_t n, double s)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)(s * urand());
    return p;
}

static float *copyf(const float *v, int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(p, v, (size_t)n * sizeof(float));
    return p;
}

static bool same_bits(const float *a, const float *b, int64_t n)
{
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* The fn products of a sub-layer (rows = GMIX) or of hc_head (rows = GNS) on N tokens, bit for bit
 * against trex_gemm: forward mu = rho (X fn^T); backward dfn += dz^T X and dX += dz fn with dz the
 * rho dmu rows left in dstate. fn is read only by the products, so a run with fn = 0 gives the dX of
 * the per-token part alone, to which the expected product is added. */
static void check_fn_products(const trex_ctx *ctx, const trex_config *cfg, int64_t N, bool head)
{
    const int64_t d = cfg->hidden_size, nd = GNS * d, rows = head ? GNS : GMIX;
    const int64_t ss = head ? trex_mhc_head_state_size(GNS) : trex_mhc_state_size(GNS);
    const int64_t ds = head ? trex_mhc_head_dstate_size(GNS) : trex_mhc_dstate_size(GNS);
    const char *what = head ? "hc_head" : "HC_pre";
    float *X = randf(N * nd, 1.0), *fn = randf(rows * nd, 0.02), *fn0 = calloc((size_t)(rows * nd), 4);
    float scale[3] = {0.7f, -0.4f, 1.3f}, *base = randf(rows, 1.0);
    float *x_in = randf(N * d, 1.0), *state = randf(N * ss + 1, 1.0), *z = randf(N * rows + 1, 1.0);
    trex_mhc_w w = {fn, scale, base}, w0 = {fn0, scale, base};

    /* forward */
    if (head)
        trex_mhc_head_forward(ctx, cfg, N, x_in, state, X, &w);
    else
        trex_mhc_pre_forward(ctx, cfg, N, x_in, state, X, &w);
    trex_gemm(NULL, false, true, N, rows, nd, 1.0f, X, nd, fn, nd, 0.0f, z, rows);
    bool ok = true;
    for (int64_t t = 0; t < N; t++)
        for (int64_t m = 0; m < rows; m++) {
            const float want = z[t * rows + m] * state[t * ss];
            ok = ok && memcmp(&want, state + t * ss + 1 + m, sizeof want) == 0;
        }
    CHECK(ok, "%s N=%lld: fn v = trex_gemm's bits", what, (long long)N);

    /* backward: dstate from HC_post's backward (sub-layer) or scratch (hc_head) */
    float *dstate = randf(N * ds + 1, 1.0), *dy = randf(N * d, 1.0), *dX0 = randf(N * nd, 1.0);
    if (!head) {
        float *Xo_grad = randf(N * nd, 1.0), *y = randf(N * d, 1.0), *dXp = randf(N * nd, 1.0);
        trex_mhc_post_backward(ctx, cfg, N, dXp, dy, dstate, Xo_grad, y, X, state);
        free(Xo_grad), free(y), free(dXp);
    }
    float *dsa = copyf(dstate, N * ds), *dsb = copyf(dstate, N * ds);
    float *dXa = copyf(dX0, N * nd), *dXb = copyf(dX0, N * nd);
    float *gfn0 = randf(rows * nd, 1.0), *gfa = copyf(gfn0, rows * nd), *gfb = copyf(gfn0, rows * nd);
    float gsa[3 + GMIX] = {0}, gsb[3 + GMIX] = {0};
    trex_mhc_w ga = {gfa, gsa, gsa + 3}, gb = {gfb, gsb, gsb + 3};
    if (head) {
        trex_mhc_head_backward(ctx, cfg, N, dXa, &ga, dsa, dy, X, &w, state);
        trex_mhc_head_backward(ctx, cfg, N, dXb, &gb, dsb, dy, X, &w0, state);
    } else {
        trex_mhc_pre_backward(ctx, cfg, N, dXa, &ga, dsa, dy, X, &w, state);
        trex_mhc_pre_backward(ctx, cfg, N, dXb, &gb, dsb, dy, X, &w0, state);
    }
    CHECK(same_bits(dsa, dsb, N * ds), "%s N=%lld: the per-token backward does not read fn", what,
          (long long)N);
    trex_gemm(NULL, true, false, rows, nd, N, 1.0f, dsa, ds, X, nd, 1.0f, gfn0, nd);
    CHECK(same_bits(gfa, gfn0, rows * nd), "%s N=%lld: dfn += dz^T X = trex_gemm's bits", what,
          (long long)N);
    trex_gemm(NULL, false, false, N, nd, rows, 1.0f, dsa, ds, fn, nd, 1.0f, dXb, nd);
    CHECK(same_bits(dXa, dXb, N * nd), "%s N=%lld: dX += dz fn = trex_gemm's bits", what, (long long)N);
    free(X), free(fn), free(fn0), free(base), free(x_in), free(state), free(z);
    free(dstate), free(dy), free(dX0), free(dsa), free(dsb), free(dXa), free(dXb);
    free(gfn0), free(gfa), free(gfb);
}

/* The layer of the fn-product tests: nd = 4 x 1030 = 4120, longer than the blocked GEMM's K blocks and
 * not a multiple of 16 or 64. */
static trex_config fn_config(void)
{
    trex_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.hidden_size = 1030;
    cfg.hc_mult = GNS;
    cfg.hc_sinkhorn_iters = 20;
    cfg.hc_eps = 1e-6;
    cfg.rms_norm_eps = 1e-6;
    return cfg;
}

static void test_fn_products(void)
{
    const trex_config cfg = fn_config();
    printf("fn products: %s vs trex_gemm\n", trex_fused()->isa >= TREX_ISA_AVX512F
                                                  ? "fused gate entries (AVX-512)"
                                                  : "trex_gemm (no AVX-512 here)");
    trex_pool *p2 = trex_pool_create(2), *p3 = trex_pool_create(3);
    trex_arena *ar = trex_arena_create(NULL, TREX_REGION_ACTS, 1 << 20);
    CHECK(p2 && p3 && ar, "pools and arena");
    const trex_ctx ctxs[4] = {{.pool = NULL}, {.pool = p2, .arena = ar}, {.pool = p3},
                              {.pool = p2, .arena = ar}};
    const int64_t Ns[4] = {1, 7, 33, 70};
    for (int q = 0; q < 4; q++)
        for (int h = 0; h < 2; h++) {
            const size_t used = trex_arena_used(ar);
            check_fn_products(&ctxs[q], &cfg, Ns[q], h == 1);
            CHECK(trex_arena_used(ar) == used, "N=%lld: the fn products give their scratch back",
                  (long long)Ns[q]);
        }
    trex_arena_destroy(ar);
    trex_pool_destroy(p2);
    trex_pool_destroy(p3);
}

/* max |a - b| / max |b| over n floats */
static double rel_diff(const float *a, const float *b, int64_t n)
{
    double md = 0.0, mb = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double dd = fabs((double)a[i] - (double)b[i]), bb = fabs((double)b[i]);
        md = dd > md ? dd : md;
        mb = bb > mb ? bb : mb;
    }
    return mb > 0.0 ? md / mb : md;
}

/* One HC_pre forward and backward and one hc_head forward and backward on N tokens with context ctx;
 * out receives x_in, state, dX, dfn (sub-layer), then h, head state, dX, dfn (hc_head). */
enum { BF_N = 70 };
static void run_layer_once(const trex_ctx *ctx, const trex_config *cfg, float *out)
{
    const int64_t N = BF_N, d = cfg->hidden_size, nd = GNS * d;
    const int64_t ss = trex_mhc_state_size(GNS), ds = trex_mhc_dstate_size(GNS);
    const int64_t hss = trex_mhc_head_state_size(GNS), hds = trex_mhc_head_dstate_size(GNS);
    rng_state = 0x5eedull;
    float *X = randf(N * nd, 1.0), *fn = randf(GMIX * nd, 0.02), *hfn = randf(GNS * nd, 0.02);
    float scale[3] = {0.7f, -0.4f, 1.3f}, *base = randf(GMIX, 1.0);
    float *dXo = randf(N * nd, 1.0), *y = randf(N * d, 1.0), *dx_in = randf(N * d, 1.0);
    float *dstate = randf(N * ds, 1.0), *hdstate = randf(N * hds, 1.0), *dy = randf(N * d, 1.0);
    float gs[3 + GMIX] = {0}, hgs[1 + GNS] = {0};
    float *o = out;
    float *x_in = o, *state = (o += N * d), *dX = (o += N * ss), *gfn = (o += N * nd);
    float *h = (o += GMIX * nd), *hstate = (o += N * d), *hdX = (o += N * hss), *hgfn = (o += N * nd);
    trex_mhc_w w = {fn, scale, base}, hw = {hfn, scale, base};
    trex_mhc_w g = {gfn, gs, gs + 3}, hg = {hgfn, hgs, hgs + 1};
    memset(gfn, 0, (size_t)(GMIX * nd) * sizeof(float));
    memset(hgfn, 0, (size_t)(GNS * nd) * sizeof(float));
    trex_mhc_pre_forward(ctx, cfg, N, x_in, state, X, &w);
    trex_mhc_post_backward(ctx, cfg, N, dX, dy, dstate, dXo, y, X, state);
    trex_mhc_pre_backward(ctx, cfg, N, dX, &g, dstate, dx_in, X, &w, state);
    trex_mhc_head_forward(ctx, cfg, N, h, hstate, X, &hw);
    memcpy(hdX, dXo, (size_t)(N * nd) * sizeof(float));
    trex_mhc_head_backward(ctx, cfg, N, hdX, &hg, hdstate, dy, X, &hw, hstate);
    free(X), free(fn), free(hfn), free(base), free(dXo), free(y), free(dx_in), free(dstate);
    free(hdstate), free(dy);
}

/* bf16 mode (ctx.compute TREX_BF16): the fn products take the _fma entries at the AVX-512 and AMX
 * levels. The layer stays fp32: within 1e-5 (relative to the largest value) of fp32 mode, the same
 * bits for any thread count, and other bits than fp32 mode where the _fma entries run. */
static void test_bf16_products(void)
{
    const trex_config cfg = fn_config();
    const int64_t N = BF_N, d = cfg.hidden_size, nd = GNS * d;
    const int64_t parts[8] = {N * d, N * trex_mhc_state_size(GNS), N * nd, GMIX * nd,
                              N * d, N * trex_mhc_head_state_size(GNS), N * nd, GNS * nd};
    static const char *names[8] = {"x_in", "state", "dX", "dfn", "h", "head state", "head dX",
                                   "head dfn"};
    int64_t total = 0;
    for (int k = 0; k < 8; k++)
        total += parts[k];
    trex_pool *p3 = trex_pool_create(3);
    CHECK(p3 != NULL, "pool");
    float *f32 = calloc((size_t)total, sizeof(float)), *b1 = calloc((size_t)total, sizeof(float));
    float *b3 = calloc((size_t)total, sizeof(float));
    const trex_ctx c32 = {.pool = p3}, cb1 = {.pool = NULL, .compute = TREX_BF16},
                   cb3 = {.pool = p3, .compute = TREX_BF16};
    run_layer_once(&c32, &cfg, f32);
    run_layer_once(&cb1, &cfg, b1);
    run_layer_once(&cb3, &cfg, b3);
    CHECK(same_bits(b1, b3, total), "bf16 mode: the mHC layer gives the same bits with 1 and 3 threads");
    const bool fma = trex_fused()->isa >= TREX_ISA_AVX512F;
    CHECK(same_bits(b1, f32, total) != fma, "bf16 mode: %s bits than fp32 mode at the %s level",
          fma ? "other" : "the same", trex_fused()->name);
    int64_t off = 0;
    double worst = 0.0;
    int wk = 0;
    for (int k = 0; k < 8; k++) {
        const double r = rel_diff(b1 + off, f32 + off, parts[k]);
        CHECK(r < 1e-5, "bf16 mode vs fp32 mode, %s: relative difference %.3g", names[k], r);
        if (r > worst)
            worst = r, wk = k;
        off += parts[k];
    }
    printf("mHC layer, bf16 mode vs fp32 mode (%s level): largest relative difference %.3g (%s)\n",
           trex_fused()->name, worst, names[wk]);
    free(f32), free(b1), free(b3);
    trex_pool_destroy(p3);
}

/* The layer's rho is mhc_rho_ss_f of the fused table's sumsq: mhc_rho_f's bits at every level. */
static void test_rho_levels(void)
{
    const int64_t lens[] = {1, 17, 4096, 4120};
    const trex_isa caps[] = {TREX_ISA_REF, TREX_ISA_AVX512F, TREX_ISA_AVX512, TREX_ISA_AMX};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        float *v = randf(lens[i], 3.0);
        const float want = mhc_rho_f(lens[i], v, 1e-6f);
        for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
            const trex_fused_table *t = trex_fused_for(caps[k]);
            const float got = mhc_rho_ss_f(t->sumsq(v, lens[i]), lens[i], 1e-6f);
            CHECK(memcmp(&got, &want, sizeof got) == 0, "rho via %s sumsq, len %lld: %.9g vs %.9g",
                  t->name, (long long)lens[i], (double)got, (double)want);
        }
        free(v);
    }
}

/* ---- benchmark ---------------------------------------------------------------------------------- */

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void) /* user + system seconds of the process (every thread) */
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define BENCH_CALLS 6
#define BENCH_MAX_REPS 51

static int bench(int reps, int threads, const char *only, trex_dtype compute)
{
    const int64_t N = 4096, d = 1024, n = 4, nd = n * d, mix = (2 + n) * n;
    trex_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.hidden_size = d;
    cfg.hc_mult = n;
    cfg.hc_sinkhorn_iters = 20;
    cfg.hc_eps = 1e-6;
    cfg.rms_norm_eps = 1e-6;
    trex_pool *pool = trex_pool_create(threads);
    trex_arena *ar = trex_arena_create(NULL, TREX_REGION_ACTS, 16 << 20);
    if (!pool || !ar) {
        fprintf(stderr, "pool or arena\n");
        return 2;
    }
    const trex_ctx ctx = {.pool = pool, .arena = ar, .compute = compute};
    const int64_t ss = trex_mhc_state_size(n), ds = trex_mhc_dstate_size(n);
    const int64_t hss = trex_mhc_head_state_size(n), hds = trex_mhc_head_dstate_size(n);
    float *X = randf(N * nd, 1.0), *fn = randf(mix * nd, 0.02), *hfn = randf(n * nd, 0.02);
    float scale[3] = {0.7f, -0.4f, 1.3f}, *base = randf(mix, 1.0);
    float *x_in = randf(N * d, 1.0), *y = randf(N * d, 1.0), *dy = randf(N * d, 1.0);
    float *state = randf(N * ss, 1.0), *hstate = randf(N * hss, 1.0);
    float *dstate = randf(N * ds, 1.0), *hdstate = randf(N * hds, 1.0);
    float *Xo = randf(N * nd, 1.0), *dXo = randf(N * nd, 1.0), *dX = randf(N * nd, 1.0);
    float *gfn = randf(mix * nd, 0.0), *gs = randf(3 + mix, 0.0);
    trex_mhc_w w = {fn, scale, base}, hw = {hfn, scale, base}, g = {gfn, gs, gs + 3};
    static const char *names[BENCH_CALLS] = {"pre_forward", "post_forward", "post_backward",
                                             "pre_backward", "head_forward", "head_backward"};
    double tw[BENCH_CALLS][BENCH_MAX_REPS], tc[BENCH_CALLS][BENCH_MAX_REPS];
    int sel = -1;
    if (only && !strcmp(only, "all"))
        only = NULL;
    for (int c = 0; only && c < BENCH_CALLS; c++)
        if (!strcmp(only, names[c]))
            sel = c;
    if (only && sel < 0) {
        fprintf(stderr, "test_mhc --bench: unknown call '%s'\n", only);
        return 2;
    }
    if (sel > 0) /* the state the later calls read */
        trex_mhc_pre_forward(&ctx, &cfg, N, x_in, state, X, &w);
    if (sel > 3)
        trex_mhc_head_forward(&ctx, &cfg, N, y, hstate, X, &hw);
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < BENCH_CALLS; c++) {
            if (sel >= 0 && c != sel) {
                tw[c][r] = tc[c][r] = 0.0;
                continue;
            }
            const double w0 = wall_now(), c0 = cpu_now();
            switch (c) {
            case 0: trex_mhc_pre_forward(&ctx, &cfg, N, x_in, state, X, &w); break;
            case 1: trex_mhc_post_forward(&ctx, &cfg, N, Xo, y, X, state); break;
            case 2: trex_mhc_post_backward(&ctx, &cfg, N, dX, dy, dstate, dXo, y, X, state); break;
            case 3: trex_mhc_pre_backward(&ctx, &cfg, N, dX, &g, dstate, x_in, X, &w, state); break;
            case 4: trex_mhc_head_forward(&ctx, &cfg, N, y, hstate, X, &hw); break;
            default: trex_mhc_head_backward(&ctx, &cfg, N, dX, &g, hdstate, dy, X, &hw, hstate); break;
            }
            tw[c][r] = wall_now() - w0;
            tc[c][r] = cpu_now() - c0;
        }
    printf("mHC layer, N %lld, n %lld, d %lld, %d thread(s), fused level %s, %s mode, median of %d\n",
           (long long)N, (long long)n, (long long)d, threads, trex_fused()->name,
           compute == TREX_BF16 ? "bf16" : "fp32", reps);
    double sw = 0.0, sc = 0.0;
    for (int c = 0; c < BENCH_CALLS; c++) {
        qsort(tw[c], (size_t)reps, sizeof(double), cmp_double);
        qsort(tc[c], (size_t)reps, sizeof(double), cmp_double);
        printf("  %-14s wall %8.4f s  cpu %8.4f s\n", names[c], tw[c][reps / 2], tc[c][reps / 2]);
        sw += tw[c][reps / 2], sc += tc[c][reps / 2];
    }
    printf("  %-14s wall %8.4f s  cpu %8.4f s\n", "sum", sw, sc);
    free(X), free(fn), free(hfn), free(base), free(x_in), free(y), free(dy), free(state);
    free(hstate), free(dstate), free(hdstate), free(Xo), free(dXo), free(dX), free(gfn), free(gs);
    trex_arena_destroy(ar);
    trex_pool_destroy(pool);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--bench")) {
        char *e1 = NULL, *e2 = NULL;
        const long reps = argc >= 3 ? strtol(argv[2], &e1, 10) : 5;
        const long threads = argc >= 4 ? strtol(argv[3], &e2, 10) : 2;
        const char *prec = argc >= 6 ? argv[5] : "fp32";
        if ((argc >= 3 && *e1) || (argc >= 4 && *e2) || threads < 1 || threads > 256 ||
            (strcmp(prec, "fp32") && strcmp(prec, "bf16"))) {
            fprintf(stderr, "usage: test_mhc --bench [reps [threads [call|all [fp32|bf16]]]]\n");
            return 2;
        }
        return bench(reps < 1 ? 1 : reps > BENCH_MAX_REPS ? BENCH_MAX_REPS : (int)reps, (int)threads,
                     argc >= 5 ? argv[4] : NULL, strcmp(prec, "bf16") ? TREX_F32 : TREX_BF16);
    }
    test_sinkhorn(1.0);
    test_sinkhorn(5.0);
    test_sinkhorn(20.0);
    test_sinkhorn4();
    test_chain_double();
    test_head_double();
    test_layer();
    test_fn_products();
    test_rho_levels();
    test_bf16_products();
    return check_summary();
}
