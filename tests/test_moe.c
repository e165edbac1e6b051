/* tests/test_moe.c — the MoE sub-layer (model/moe.c) and its router math (model/moe_math.h).
 *
 * 1. The double instance of the router math against central differences (sqrt-softplus down to very
 *    negative z, normalised mixing weights, balance shares), and the float instance against it.
 * 2. The layer against a naive double implementation written here from MODEL_SPEC §4: outputs,
 *    balance loss, load; hash routing from tid2eid; top-K ties to the lower index; the bias selects but
 *    does not weight; the clamp is active and has zero gradient.
 * 3. Whole-layer gradients (dx and every weight, balance loss included, loss = sum y*R + balance)
 *    against central differences of the naive double forward (tight) and of the layer's own fp32
 *    forward (loose); coordinates whose perturbation changes the routing or a clamp are skipped.
 * 4. Bitwise identical results with no pool and with 2 threads, on a batch large enough to split the
 *    expert GEMMs into chunks; backward writes dx and accumulates weight gradients; bad hash input.
 * 5. bf16 mode (grouped expert GEMMs): bitwise identical for no pool and 2 threads, on a batch whose
 *    permuted rows span two grouped passes with an expert cut between them and on one with 20
 *    experts in a pass (the backward's weight copies in waves); outputs and every gradient within
 *    bf16 bounds of the fp32 path; the same routing and balance loss; dx written, weight gradients
 *    accumulated; a hash layer and an empty batch.
 *
 * 6. bf16 mode from bf16 copies of the weights (trex_wcopy, as the trainer runs it), as rows and as
 *    packed panels: the same bits as from the fp32 weights (also where experts with few rows take the
 *    row copies as the A operand of the forward's products and others do not, in one call); after a
 *    change of the weights the copies are stale until rewritten, and the rewritten copies give the new
 *    weights' bits.
 *
 * `test_moe --bench T [REPS [THREADS [copies|panels|fp32]]]` instead times one bf16 layer at dsv4-bench's
 * shapes (forward with a cache, then backward) and prints wall and CPU seconds and a hash of the
 * outputs (docs/perf.md, "MoE class, round 4" and "round 7"). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "trex/alloc.h"
#include "trex/pool.h"

#define MOE_REAL double
#define MOE_SFX _d
#include "model/moe_math.h"
#undef MOE_REAL
#undef MOE_SFX
#define MOE_REAL float
#define MOE_SFX _f
#include "model/moe_math.h"
#undef MOE_REAL
#undef MOE_SFX

/* ---- small helpers ------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *st)
{
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unif(uint64_t *st)
{
    return ((double)(rng_next(st) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_normal(uint64_t *st)
{
    double u1 = rng_unif(st), u2 = rng_unif(st);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* Fourth-order central difference from f(v+2h), f(v+h), f(v-h), f(v-2h). */
static double fd5(const double f[4], double h)
{
    return (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * h);
}

static const double fd5_step[4] = {2, 1, -1, -2};

/* ---- 1. router math in double -------------------------------------------------------------------- */

static void test_math(void)
{
    /* sqrt-softplus against the textbook formula where that is exact enough, and its tail. */
    const double zs[] = {-30, -5, -1, -1e-3, 0, 1e-3, 0.7, 3, 19, 40};
    for (size_t i = 0; i < sizeof zs / sizeof zs[0]; i++) {
        double z = zs[i], want = sqrt(log1p(exp(z)));
        CHECK_NEAR(moe_sqrtsp_d(z) / want, 1.0, 1e-14, "sqrtsp vs sqrt(log1p(exp(z)))");
    }
    CHECK_NEAR(moe_sqrtsp_d(-700.0) / exp(-350.0), 1.0, 1e-14, "sqrtsp tail at -700");
    CHECK_NEAR(moe_sqrtsp_d(-1200.0) / exp(-600.0), 1.0, 1e-14, "sqrtsp tail at -1200 (e^z underflows)");
    CHECK(moe_sqrtsp_d(-INFINITY) == 0.0, "sqrtsp(-inf) = 0");
    CHECK(isnan(moe_sqrtsp_d(NAN)), "sqrtsp(nan) is nan");

    /* ds/dz against central differences, including very negative z. */
    const double zg[] = {-1200, -700, -100, -50, -20, -5, -1, -1e-3, 0, 1e-3, 1, 5, 20, 50, 100};
    for (size_t i = 0; i < sizeof zg / sizeof zg[0]; i++) {
        double z = zg[i], h = 1e-3, f[4];
        for (int q = 0; q < 4; q++)
            f[q] = moe_sqrtsp_d(z + fd5_step[q] * h);
        double fd = fd5(f, h);
        double an = moe_sqrtsp_grad_d(z);
        char what[64];
        snprintf(what, sizeof what, "ds/dz at z=%g (relative)", z);
        CHECK(an > 0 && isfinite(an), "ds/dz(%g) = %g", z, an);
        CHECK_NEAR(an / fd, 1.0, 1e-8, what);
    }
    CHECK_NEAR(moe_sqrtsp_grad_d(-1200.0) / (0.5 * exp(-600.0)), 1.0, 1e-14, "ds/dz tail e^{z/2}/2");

    /* Float instance agrees with the double one where fp32 has normal numbers. */
    double worst = 0, worst_g = 0;
    for (double z = -80; z <= 80; z += 0.37) {
        worst = fmax(worst, fabs(moe_sqrtsp_f((float)z) / moe_sqrtsp_d((float)z) - 1));
        worst_g = fmax(worst_g, fabs(moe_sqrtsp_grad_f((float)z) / moe_sqrtsp_grad_d((float)z) - 1));
    }
    CHECK(worst < 1e-6, "float sqrtsp relative error %g", worst);
    CHECK(worst_g < 1e-6, "float ds/dz relative error %g", worst_g);

    /* Mixing weights: loss = sum_k dg_k g_k(s); FD over s. */
    uint64_t st = 42;
    for (int rep = 0; rep < 5; rep++) {
        enum { KK = 4 };
        double s[KK], dg[KK], g[KK], ds[KK];
        for (int k = 0; k < KK; k++) {
            s[k] = rep == 4 && k == 1 ? exp(-40.0) : 0.05 + rng_unif(&st); /* one tiny affinity */
            dg[k] = rng_normal(&st);
        }
        double S = moe_mix_d(KK, s, 2.5, g), sum = 0;
        for (int k = 0; k < KK; k++)
            sum += g[k];
        CHECK_NEAR(sum, 2.5, 1e-14, "mixing weights sum to route_scale");
        CHECK_NEAR(S, s[0] + s[1] + s[2] + s[3], 1e-14, "mix returns S");
        moe_mix_backward_d(KK, s, 2.5, dg, ds);
        for (int j = 0; j < KK; j++) {
            double h = 1e-3 * fmax(s[j], 0.05), l[4], sp[KK], gp[KK];
            for (int q = 0; q < 4; q++) {
                memcpy(sp, s, sizeof sp);
                sp[j] = s[j] + fd5_step[q] * h;
                moe_mix_d(KK, sp, 2.5, gp);
                l[q] = 0;
                for (int k = 0; k < KK; k++)
                    l[q] += dg[k] * gp[k];
            }
            double fd = fd5(l, h);
            CHECK(fabs(ds[j] - fd) <= 1e-8 * fmax(fabs(fd), 1e-3), "mix ds[%d] %.12g vs fd %.12g", j,
                  ds[j], fd);
        }
    }

    /* Balance shares: loss = sum_i c_i q_i(s); FD over s; ds accumulates. */
    for (int rep = 0; rep < 5; rep++) {
        enum { EE = 6 };
        double s[EE], c[EE], q0[EE], ds[EE];
        for (int i = 0; i < EE; i++) {
            s[i] = 0.05 + rng_unif(&st);
            c[i] = rng_normal(&st);
            ds[i] = 1.0;
        }
        moe_share_d(EE, s, q0);
        moe_share_backward_d(EE, s, c, ds);
        for (int j = 0; j < EE; j++) {
            double h = 1e-3 * s[j], l[4], sp[EE], qp[EE];
            for (int q = 0; q < 4; q++) {
                memcpy(sp, s, sizeof sp);
                sp[j] = s[j] + fd5_step[q] * h;
                moe_share_d(EE, sp, qp);
                l[q] = 0;
                for (int i = 0; i < EE; i++)
                    l[q] += c[i] * qp[i];
            }
            double fd = fd5(l, h);
            CHECK(fabs(ds[j] - 1.0 - fd) <= 1e-8 * fmax(fabs(fd), 1e-3), "share ds[%d] %.12g vs %.12g",
                  j, ds[j] - 1.0, fd);
        }
    }

    /* The whole router chain z -> s -> g (fixed selection), one logit far below the others. (At
     * z = -60 the loss would move by ~1e-18 per step, below double rounding of the O(1) weights; the
     * pieces are checked there separately above.) */
    {
        enum { KK = 3 };
        double z[KK] = {-15.0, -0.3, 2.0}, dg[KK] = {0.7, -1.1, 0.4};
        double s[KK], g[KK], ds[KK];
        for (int k = 0; k < KK; k++)
            s[k] = moe_sqrtsp_d(z[k]);
        moe_mix_d(KK, s, 1.5, g);
        moe_mix_backward_d(KK, s, 1.5, dg, ds);
        for (int j = 0; j < KK; j++) {
            double an = ds[j] * moe_sqrtsp_grad_d(z[j]), h = 1e-3, l[4];
            for (int q = 0; q < 4; q++) {
                double zp[KK], sp[KK], gp[KK];
                memcpy(zp, z, sizeof zp);
                zp[j] += fd5_step[q] * h;
                for (int k = 0; k < KK; k++)
                    sp[k] = moe_sqrtsp_d(zp[k]);
                moe_mix_d(KK, sp, 1.5, gp);
                l[q] = 0;
                for (int k = 0; k < KK; k++)
                    l[q] += dg[k] * gp[k];
            }
            double fd = fd5(l, h);
            CHECK(fabs(an - fd) <= 1e-8 * fabs(fd), "router chain dz[%d] %.12g vs %.12g", j, an, fd);
        }
    }
}

/* ---- a test model: flat parameters in double, an fp32 mirror, and a naive reference ------------ */

typedef struct model {
    int64_t B, T, N, d, E, K, I, V;
    int layer;
    double alpha;
    trex_config cfg;
    int32_t *tokens, *tid2eid;
    /* Expert e's w1 at o_w1 + e ew, its w3 at o_w3 + e ew: with the trex layout (w1, w3 of each expert
     * side by side, [W1; W3] one matrix in place) o_w3 = o_w1 + I d and ew = 2 I d; split (every
     * expert's w1, then every expert's w3, and the shared expert's w1, w2, w3) exercises bf16 mode's
     * other path. The routed w1 and w3 fill [o_w1, o_w2) in both. */
    int64_t o_x, o_gate, o_w1, o_w3, o_w2, o_sw1, o_sw3, o_sw2, P, ew;
    double *th;   /* [P] x then every weight */
    float *thf;   /* fp32 copy */
    double *bias; /* [E] */
    float *biasf;
    double *R;    /* [N*d] loss weights */
    /* bf16 copies of w1, w3, w2 (model_copies; NULL: none) and their source's version counter */
    trex_wcopy *wc;
    uint64_t ver;
} model;

static void model_init_split(model *m, int64_t B, int64_t T, int64_t d, int64_t E, int64_t K,
                             int64_t I, int layer, double alpha, double wstd, double limit,
                             uint64_t seed, bool split)
{
    memset(m, 0, sizeof *m);
    m->B = B, m->T = T, m->N = B * T, m->d = d, m->E = E, m->K = K, m->I = I, m->V = 50;
    m->layer = layer, m->alpha = alpha;
    trex_config *c = &m->cfg;
    strcpy(c->name, "moe-test");
    c->vocab_size = m->V;
    c->hidden_size = d;
    c->num_hidden_layers = 2;
    c->num_nextn_predict_layers = 1;
    c->n_routed_experts = E;
    c->n_shared_experts = 1;
    c->num_experts_per_tok = K;
    c->moe_intermediate_size = I;
    c->routed_scaling_factor = 1.5;
    c->num_hash_layers = 1;
    c->swiglu_limit = limit;
    m->o_x = 0;
    m->o_gate = m->o_x + m->N * d;
    m->o_w1 = m->o_gate + E * d;
    m->o_w3 = m->o_w1 + (split ? E : 1) * I * d;
    m->ew = split ? I * d : 2 * I * d;
    m->o_w2 = m->o_w1 + 2 * E * I * d;
    m->o_sw1 = m->o_w2 + E * d * I;
    m->o_sw3 = m->o_sw1 + (split ? 2 : 1) * I * d;
    m->o_sw2 = split ? m->o_sw1 + I * d : m->o_sw3 + I * d;
    m->P = m->o_sw1 + 3 * I * d;
    m->th = xcalloc((size_t)m->P, sizeof(double));
    m->thf = xcalloc((size_t)m->P, sizeof(float));
    m->bias = xcalloc((size_t)E, sizeof(double));
    m->biasf = xcalloc((size_t)E, sizeof(float));
    m->R = xcalloc((size_t)(m->N * d), sizeof(double));
    m->tokens = xcalloc((size_t)m->N, sizeof(int32_t));
    m->tid2eid = xcalloc((size_t)(m->V * K), sizeof(int32_t));
    uint64_t st = seed;
    for (int64_t p = 0; p < m->P; p++) {
        double v = rng_normal(&st) * (p < m->o_gate ? 1.0 : wstd);
        m->thf[p] = (float)v;
        m->th[p] = m->thf[p]; /* exactly representable: both models see the same numbers */
    }
    for (int64_t q = 0; q < m->N * d; q++)
        m->R[q] = (float)rng_normal(&st);
    for (int64_t t = 0; t < m->N; t++)
        m->tokens[t] = (int32_t)(rng_next(&st) % (uint64_t)m->V);
    for (int64_t v = 0; v < m->V; v++)
        for (int64_t k = 0; k < K; k++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(rng_next(&st) % (uint64_t)E);
                dup = false;
                for (int64_t j = 0; j < k; j++)
                    dup = dup || m->tid2eid[v * K + j] == e;
            } while (dup);
            m->tid2eid[v * K + k] = e;
        }
}

static void model_init(model *m, int64_t B, int64_t T, int64_t d, int64_t E, int64_t K, int64_t I,
                       int layer, double alpha, double wstd, double limit, uint64_t seed)
{
    model_init_split(m, B, T, d, E, K, I, layer, alpha, wstd, limit, seed, false);
}

/* bf16 copies of every expert's w1, w3, w2 and the shared expert's (in that order: each [W1; W3] copy is
 * one matrix, whatever the fp32 layout), written from thf; views() hands them to the layer. */
static void model_copies(model *m, trex_wcopy_layout layout)
{
    const int64_t E = m->E, I = m->I, d = m->d, n = 3 * E + 3;
    trex_wcopy_tensor *list = xcalloc((size_t)n, sizeof *list);
    for (int64_t e = 0; e <= E; e++) { /* e == E: the shared expert */
        const bool sh = e == E;
        list[3 * e] = (trex_wcopy_tensor){.src = m->thf + (sh ? m->o_sw1 : m->o_w1 + e * m->ew), .rows = I, .cols = d};
        list[3 * e + 1] = (trex_wcopy_tensor){.src = m->thf + (sh ? m->o_sw3 : m->o_w3 + e * m->ew), .rows = I,
                                              .cols = d, .join = true};
        list[3 * e + 2] = (trex_wcopy_tensor){.src = m->thf + (sh ? m->o_sw2 : m->o_w2 + e * d * I), .rows = d,
                                              .cols = I};
    }
    trex_err err = {0};
    trex_wcopy_destroy(m->wc);
    m->wc = NULL;
    CHECK(trex_wcopy_create(&m->wc, list, n, layout, &m->ver, NULL, &err) == TREX_OK, "weight copies: %s",
          err.msg);
    free(list);
    if (m->wc) {
        CHECK(!trex_wcopy_fresh(m->wc), "weight copies: stale until written");
        trex_wcopy_refresh(NULL, m->wc);
        CHECK(trex_wcopy_fresh(m->wc), "weight copies: fresh once written");
    }
}

static void model_free(model *m)
{
    trex_wcopy_destroy(m->wc);
    free(m->th), free(m->thf), free(m->bias), free(m->biasf), free(m->R), free(m->tokens),
        free(m->tid2eid);
}

static void model_set_bias(model *m, int64_t e, double b)
{
    m->biasf[e] = (float)b;
    m->bias[e] = m->biasf[e];
}

/* Sets parameter p in both copies. */
static void model_set(model *m, int64_t p, double v)
{
    m->thf[p] = (float)v;
    m->th[p] = m->thf[p];
}

/* Naive double forward. y [N*d]; returns the balance loss. idx [N*K] and mask (1 where a clamp is
 * active: per token, for the shared expert then each chosen expert, I entries of a then I of u) may
 * be NULL. */
static double ref_forward(const model *m, const double *th, double *y, int32_t *idx,
                          unsigned char *mask)
{
    const int64_t N = m->N, d = m->d, E = m->E, K = m->K, I = m->I, T = m->T;
    const double L = m->cfg.swiglu_limit;
    const bool hash = trex_config_is_hash(&m->cfg, m->layer);
    double *s = xcalloc((size_t)(N * E), sizeof(double));
    int32_t *sel = xcalloc((size_t)(N * K), sizeof(int32_t));
    double *h = xcalloc((size_t)I, sizeof(double));
    for (int64_t t = 0; t < N; t++) {
        const double *x = th + m->o_x + t * d;
        for (int64_t e = 0; e < E; e++) {
            double z = 0;
            for (int64_t j = 0; j < d; j++)
                z += th[m->o_gate + e * d + j] * x[j];
            s[t * E + e] = sqrt(log1p(exp(z)));
        }
        int32_t *it = sel + t * K;
        for (int64_t k = 0; k < K; k++) {
            if (hash) {
                it[k] = m->tid2eid[m->tokens[t] * K + k];
                continue;
            }
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool taken = false;
                for (int64_t j = 0; j < k; j++)
                    taken = taken || it[j] == e;
                if (taken)
                    continue;
                if (best < 0 || s[t * E + e] + m->bias[e] > s[t * E + best] + m->bias[best])
                    best = e;
            }
            it[k] = (int32_t)best;
        }
        double S = 0;
        for (int64_t k = 0; k < K; k++)
            S += s[t * E + it[k]];
        for (int64_t j = 0; j < d; j++)
            y[t * d + j] = 0;
        for (int64_t k = -1; k < K; k++) { /* k = -1: the shared expert */
            const double *w1, *w3, *w2;
            double g = 1.0;
            if (k < 0) {
                w1 = th + m->o_sw1, w3 = th + m->o_sw3, w2 = th + m->o_sw2;
            } else {
                const int64_t e = it[k];
                w1 = th + m->o_w1 + e * m->ew, w3 = th + m->o_w3 + e * m->ew;
                w2 = th + m->o_w2 + e * d * I;
                g = m->cfg.routed_scaling_factor * s[t * E + e] / S;
            }
            unsigned char *mk = mask ? mask + (t * (K + 1) + k + 1) * 2 * I : NULL;
            for (int64_t i = 0; i < I; i++) {
                double a = 0, u = 0;
                for (int64_t j = 0; j < d; j++) {
                    a += w1[i * d + j] * x[j];
                    u += w3[i * d + j] * x[j];
                }
                if (mk) {
                    mk[i] = a > L;
                    mk[I + i] = fabs(u) > L;
                }
                a = fmin(a, L);
                u = fmax(fmin(u, L), -L);
                h[i] = a / (1 + exp(-a)) * u * g;
            }
            for (int64_t j = 0; j < d; j++) {
                double o = 0;
                for (int64_t i = 0; i < I; i++)
                    o += w2[j * I + i] * h[i];
                y[t * d + j] += o;
            }
        }
    }
    double bal = 0;
    if (!hash) {
        for (int64_t b = 0; b < m->B; b++) {
            double row = 0;
            for (int64_t i = 0; i < E; i++) {
                double cnt = 0, P = 0;
                for (int64_t t = b * T; t < (b + 1) * T; t++) {
                    double sum = 0;
                    for (int64_t j = 0; j < E; j++)
                        sum += s[t * E + j];
                    P += s[t * E + i] / sum;
                    for (int64_t k = 0; k < K; k++)
                        cnt += sel[t * K + k] == i;
                }
                row += (double)E / (double)(K * T) * cnt * (P / (double)T);
            }
            bal += m->alpha * row;
        }
        bal /= (double)m->B;
    }
    if (idx)
        memcpy(idx, sel, (size_t)(N * K) * sizeof *idx);
    free(s), free(sel), free(h);
    return bal;
}

static double ref_loss(const model *m, const double *th, double *ybuf, int32_t *idx,
                       unsigned char *mask)
{
    double bal = ref_forward(m, th, ybuf, idx, mask), l = bal;
    for (int64_t q = 0; q < m->N * m->d; q++)
        l += ybuf[q] * m->R[q];
    return l;
}

/* The layer's weight views over a flat fp32 parameter vector (gate_bias, tid2eid from m). */
typedef struct wviews {
    float *w1[64], *w2[64], *w3[64];
    trex_moe_w w;
} wviews;

static void views(wviews *v, const model *m, float *flat, bool grads)
{
    TREX_ASSERT(m->E <= 64);
    for (int64_t e = 0; e < m->E; e++) {
        v->w1[e] = flat + m->o_w1 + e * m->ew;
        v->w3[e] = flat + m->o_w3 + e * m->ew;
        v->w2[e] = flat + m->o_w2 + e * m->d * m->I;
    }
    v->w = (trex_moe_w){.gate = flat + m->o_gate,
                        .gate_bias = grads ? NULL : m->biasf,
                        .tid2eid = grads ? NULL : m->tid2eid,
                        .w1 = v->w1, .w2 = v->w2, .w3 = v->w3,
                        .sw1 = flat + m->o_sw1, .sw2 = flat + m->o_sw2, .sw3 = flat + m->o_sw3,
                        .wc = grads ? NULL : m->wc};
}

static trex_seqinfo seqinfo(const model *m)
{
    return (trex_seqinfo){.B = m->B, .T = m->T, .tokens = m->tokens};
}

/* Layer forward on fp32 parameters thf (x inside), y [N*d]; returns the status. */
static trex_code layer_forward(const model *m, const trex_ctx *ctx, float *thf, float *y,
                               trex_moe_cache **cache, trex_moe_stats *st)
{
    wviews v;
    views(&v, m, thf, false);
    trex_seqinfo seq = seqinfo(m);
    trex_err err = {0};
    trex_code rc = trex_moe_forward(ctx, &m->cfg, m->layer, &seq, y, thf + m->o_x, &v.w, m->alpha,
                                    cache, st, &err);
    if (rc != TREX_OK)
        fprintf(stderr, "  (forward: %s)\n", err.msg);
    return rc;
}

/* Forward + backward with dy = R, bal_scale 1: y [N*d], grad [P] (dx in the x part, weights added). */
static void layer_grad(const model *m, const trex_ctx *ctx, float *y, float *grad, double *bal,
                       int64_t *load)
{
    trex_moe_cache *cache = NULL;
    trex_moe_stats st = {0, load};
    trex_arena_reset(ctx->arena);
    CHECK(layer_forward(m, ctx, m->thf, y, &cache, &st) == TREX_OK && cache, "forward ok");
    if (!cache)
        return;
    *bal = st.balance_loss;
    float *dy = xcalloc((size_t)(m->N * m->d), sizeof(float));
    for (int64_t q = 0; q < m->N * m->d; q++)
        dy[q] = (float)m->R[q];
    wviews v, gv;
    views(&v, m, m->thf, false);
    views(&gv, m, grad, true);
    trex_seqinfo seq = seqinfo(m);
    trex_moe_backward(ctx, &m->cfg, m->layer, &seq, grad + m->o_x, dy, m->thf + m->o_x, &v.w, &gv.w,
                      cache, m->alpha, 1.0);
    free(dy);
}

/* The tensors of the flat vector as ranges [o0, o1) (the routed w1 and w3 as one): x, gate, w1+w3,
 * w2, sw1, sw3, sw2. */
typedef struct prange {
    const char *name;
    int64_t o0, o1;
} prange;
#define N_RANGES 7

static void model_ranges(const model *m, prange r[N_RANGES])
{
    const int64_t Id = m->I * m->d;
    r[0] = (prange){"x", 0, m->o_gate};
    r[1] = (prange){"gate", m->o_gate, m->o_w1};
    r[2] = (prange){"w1+w3", m->o_w1, m->o_w2};
    r[3] = (prange){"w2", m->o_w2, m->o_sw1};
    r[4] = (prange){"sw1", m->o_sw1, m->o_sw1 + Id};
    r[5] = (prange){"sw3", m->o_sw3, m->o_sw3 + Id};
    r[6] = (prange){"sw2", m->o_sw2, m->o_sw2 + Id};
}

static const char *param_name(const model *m, int64_t p)
{
    prange r[N_RANGES];
    model_ranges(m, r);
    for (int k = 0; k < N_RANGES; k++)
        if (p >= r[k].o0 && p < r[k].o1)
            return r[k].name;
    return "?";
}

/* ---- 2. forward against the naive reference ------------------------------------------------------ */

/* Compares the layer's y, balance loss and load with the naive forward; returns max |dy|. */
static double compare_forward(const model *m, const trex_ctx *ctx, const char *label)
{
    const int64_t n = m->N * m->d;
    float *y = xcalloc((size_t)n, sizeof(float));
    double *yr = xcalloc((size_t)n, sizeof(double));
    int32_t *idx = xcalloc((size_t)(m->N * m->K), sizeof(int32_t));
    int64_t load[64] = {0}, want[64] = {0};
    trex_moe_stats st = {-1.0, load};
    trex_arena_reset(ctx->arena);
    CHECK(layer_forward(m, ctx, m->thf, y, NULL, &st) == TREX_OK, "%s: forward", label);
    double bal = ref_forward(m, m->th, yr, idx, NULL), worst = 0, ymax = 0;
    for (int64_t q = 0; q < n; q++) {
        worst = fmax(worst, fabs(y[q] - yr[q]));
        ymax = fmax(ymax, fabs(yr[q]));
    }
    CHECK(worst <= 1e-5 * fmax(ymax, 1.0), "%s: max |y - ref| %g (max |y| %g)", label, worst, ymax);
    CHECK(fabs(st.balance_loss - bal) <= 1e-6 * fmax(fabs(bal), 1e-6), "%s: balance %.9g vs %.9g",
          label, st.balance_loss, bal);
    for (int64_t q = 0; q < m->N * m->K; q++)
        want[idx[q]]++;
    bool same = true;
    for (int64_t e = 0; e < m->E; e++)
        same = same && load[e] == want[e];
    CHECK(same, "%s: load matches the reference routing", label);
    free(y), free(yr), free(idx);
    return worst;
}

static void test_forward(trex_arena *arena)
{
    trex_ctx ctx = {.pool = NULL, .arena = arena};
    model m;

    /* Non-hash layer; the clamp must be active somewhere, for a and for u. */
    model_init(&m, 2, 7, 16, 6, 2, 8, 1, 0.3, 0.3, 1.5, 1);
    compare_forward(&m, &ctx, "non-hash");
    {
        double *y = xcalloc((size_t)(m.N * m.d), sizeof(double));
        const int64_t nm = m.N * (m.K + 1) * 2 * m.I;
        unsigned char *mask = xcalloc((size_t)nm, 1);
        ref_forward(&m, m.th, y, NULL, mask);
        int64_t na = 0, nu = 0;
        for (int64_t q = 0; q < nm; q++)
            (q / m.I) % 2 ? (nu += mask[q]) : (na += mask[q]);
        CHECK(na > 0 && nu > 0, "clamp active: %lld a, %lld u", (long long)na, (long long)nu);
        free(y), free(mask);
    }

    /* The bias changes the selection but not the weights: expert 4 takes every token, and y still
     * matches the reference, whose weights use the unbiased s. A reference that weighted with s + b
     * would differ (checked, so that this test can fail). */
    model_set_bias(&m, 4, 10.0);
    {
        int64_t load[64] = {0};
        float *y = xcalloc((size_t)(m.N * m.d), sizeof(float));
        trex_moe_stats st = {0, load};
        trex_arena_reset(arena);
        CHECK(layer_forward(&m, &ctx, m.thf, y, NULL, &st) == TREX_OK, "bias forward");
        CHECK(load[4] == m.N, "bias 10 on expert 4: it serves %lld of %lld tokens", (long long)load[4],
              (long long)m.N);
        free(y);
    }
    compare_forward(&m, &ctx, "bias");
    {
        /* The bias does reach the output (through the selection), so the match above means something. */
        model mb = m;
        mb.bias = xcalloc((size_t)m.E, sizeof(double));
        double *y0 = xcalloc((size_t)(m.N * m.d), sizeof(double));
        double *y1 = xcalloc((size_t)(m.N * m.d), sizeof(double));
        ref_forward(&m, m.th, y1, NULL, NULL);
        ref_forward(&mb, m.th, y0, NULL, NULL);
        double diff = 0;
        for (int64_t q = 0; q < m.N * m.d; q++)
            diff = fmax(diff, fabs(y1[q] - y0[q]));
        CHECK(diff > 1e-3, "the bias changes the output (through selection) by %g", diff);
        free(mb.bias), free(y0), free(y1);
    }
    model_set_bias(&m, 4, 0.0);

    /* Ties: all gate rows equal -> all affinities equal -> experts 0 and 1. */
    {
        model mt = m;
        mt.th = xcalloc((size_t)m.P, sizeof(double));
        mt.thf = xcalloc((size_t)m.P, sizeof(float));
        memcpy(mt.th, m.th, (size_t)m.P * sizeof(double));
        memcpy(mt.thf, m.thf, (size_t)m.P * sizeof(float));
        for (int64_t e = 1; e < m.E; e++)
            for (int64_t j = 0; j < m.d; j++)
                model_set(&mt, m.o_gate + e * m.d + j, m.th[m.o_gate + j]);
        int64_t load[64] = {0};
        float *y = xcalloc((size_t)(m.N * m.d), sizeof(float));
        trex_moe_stats st = {0, load};
        trex_arena_reset(arena);
        CHECK(layer_forward(&mt, &ctx, mt.thf, y, NULL, &st) == TREX_OK, "tie forward");
        CHECK(load[0] == m.N && load[1] == m.N, "all tied: experts 0,1 chosen (%lld, %lld)",
              (long long)load[0], (long long)load[1]);
        /* A tie at the cut: bias 20 on expert 1, gate rows 3 and 5 equal with bias 10 on both. */
        memcpy(mt.th, m.th, (size_t)m.P * sizeof(double));
        memcpy(mt.thf, m.thf, (size_t)m.P * sizeof(float));
        for (int64_t j = 0; j < m.d; j++)
            model_set(&mt, m.o_gate + 5 * m.d + j, m.th[m.o_gate + 3 * m.d + j]);
        mt.biasf = xcalloc((size_t)m.E, sizeof(float));
        mt.bias = xcalloc((size_t)m.E, sizeof(double));
        model_set_bias(&mt, 1, 20.0);
        model_set_bias(&mt, 3, 10.0);
        model_set_bias(&mt, 5, 10.0);
        memset(load, 0, sizeof load);
        trex_arena_reset(arena);
        CHECK(layer_forward(&mt, &ctx, mt.thf, y, NULL, &st) == TREX_OK, "tie forward 2");
        CHECK(load[1] == m.N && load[3] == m.N && load[5] == 0,
              "tie at the cut goes to expert 3 (loads %lld %lld %lld)", (long long)load[1],
              (long long)load[3], (long long)load[5]);
        compare_forward(&mt, &ctx, "tie at the cut");
        free(mt.th), free(mt.thf), free(mt.bias), free(mt.biasf), free(y);
    }
    model_free(&m);

    /* Hash layer: experts from tid2eid[token], no balance loss, the bias plays no part. */
    model_init(&m, 2, 7, 16, 6, 2, 8, 0, 0.3, 0.3, 1.5, 2);
    compare_forward(&m, &ctx, "hash");
    {
        int64_t load[64] = {0}, want[64] = {0};
        float *y0 = xcalloc((size_t)(m.N * m.d), sizeof(float));
        float *y1 = xcalloc((size_t)(m.N * m.d), sizeof(float));
        trex_moe_stats st = {-1.0, load};
        trex_arena_reset(arena);
        CHECK(layer_forward(&m, &ctx, m.thf, y0, NULL, &st) == TREX_OK, "hash forward");
        CHECK(st.balance_loss == 0.0, "hash layer: balance loss %g", st.balance_loss);
        for (int64_t t = 0; t < m.N; t++)
            for (int64_t k = 0; k < m.K; k++)
                want[m.tid2eid[m.tokens[t] * m.K + k]]++;
        bool same = true;
        for (int64_t e = 0; e < m.E; e++)
            same = same && load[e] == want[e];
        CHECK(same, "hash layer: load is the tid2eid count");
        model_set_bias(&m, 2, 50.0);
        trex_arena_reset(arena);
        CHECK(layer_forward(&m, &ctx, m.thf, y1, NULL, NULL) == TREX_OK, "hash forward, bias");
        CHECK(memcmp(y0, y1, (size_t)(m.N * m.d) * sizeof(float)) == 0, "hash layer ignores the bias");
        model_set_bias(&m, 2, 0.0);

        /* Bad input: token out of range, repeated expert in a row. */
        trex_err err = {0};
        wviews v;
        views(&v, &m, m.thf, false);
        trex_seqinfo seq = seqinfo(&m);
        m.tokens[3] = (int32_t)m.V;
        trex_arena_reset(arena);
        CHECK(trex_moe_forward(&ctx, &m.cfg, 0, &seq, y1, m.thf, &v.w, 0.0, NULL, NULL, &err) ==
                  TREX_ERANGE,
              "token out of range is rejected");
        CHECK(strstr(err.msg, "vocabulary") != NULL, "message: %s", err.msg);
        m.tokens[3] = 7;
        int32_t keep = m.tid2eid[7 * m.K + 1];
        m.tid2eid[7 * m.K + 1] = m.tid2eid[7 * m.K];
        CHECK(trex_moe_forward(&ctx, &m.cfg, 0, &seq, y1, m.thf, &v.w, 0.0, NULL, NULL, &err) ==
                  TREX_EINVAL,
              "repeated expert in tid2eid is rejected");
        m.tid2eid[7 * m.K + 1] = keep;
        free(y0), free(y1);
    }
    model_free(&m);
}

/* ---- 3. whole-layer gradients ----------------------------------------------------------------------- */

static bool same_sig(const int32_t *i0, const unsigned char *m0, const int32_t *i1,
                     const unsigned char *m1, int64_t ni, int64_t nm)
{
    return memcmp(i0, i1, (size_t)ni * sizeof *i0) == 0 && memcmp(m0, m1, (size_t)nm) == 0;
}

static void grad_check(model *m, trex_arena *arena, const char *label)
{
    trex_ctx ctx = {.pool = NULL, .arena = arena};
    const int64_t P = m->P, n = m->N * m->d, ni = m->N * m->K, nm = m->N * (m->K + 1) * 2 * m->I;
    float *grad = xcalloc((size_t)P, sizeof(float));
    float *y = xcalloc((size_t)n, sizeof(float));
    double *yr = xcalloc((size_t)n, sizeof(double));
    int32_t *i0 = xcalloc((size_t)ni, sizeof(int32_t)), *i1 = xcalloc((size_t)ni, sizeof(int32_t));
    unsigned char *m0 = xcalloc((size_t)nm, 1), *m1 = xcalloc((size_t)nm, 1);
    double bal = 0;
    layer_grad(m, &ctx, y, grad, &bal, NULL);
    ref_loss(m, m->th, yr, i0, m0);

    int64_t skipped = 0, bad_d = 0, bad_f = 0;
    double worst_d = 0, worst_f = 0;
    for (int64_t p = 0; p < P; p++) {
        /* (a) central differences of the naive double forward. */
        const double v = m->th[p], h = 1e-6;
        double l[2];
        bool ok = true;
        for (int sgn = 0; sgn < 2 && ok; sgn++) {
            m->th[p] = v + (sgn ? -h : h);
            l[sgn] = ref_loss(m, m->th, yr, i1, m1);
            ok = same_sig(i0, m0, i1, m1, ni, nm);
        }
        m->th[p] = v;
        /* (b) central differences of the layer's own fp32 forward, step hf. */
        const float vf = m->thf[p], hf = 3e-3f;
        double lf[2];
        float step[2] = {vf + hf, vf - hf};
        for (int sgn = 0; sgn < 2 && ok; sgn++) {
            m->th[p] = step[sgn]; /* the same perturbation must keep the routing and the clamps */
            ref_loss(m, m->th, yr, i1, m1);
            ok = same_sig(i0, m0, i1, m1, ni, nm);
            m->thf[p] = step[sgn];
            trex_moe_stats st = {0, NULL};
            trex_arena_reset(arena);
            layer_forward(m, &ctx, m->thf, y, NULL, &st);
            lf[sgn] = st.balance_loss;
            for (int64_t q = 0; q < n; q++)
                lf[sgn] += (double)y[q] * m->R[q];
        }
        m->th[p] = v;
        m->thf[p] = vf;
        if (!ok) {
            skipped++;
            continue;
        }
        const double fd = (l[0] - l[1]) / (2 * h), an = grad[p];
        const double fdf = (lf[0] - lf[1]) / ((double)step[0] - (double)step[1]);
        const double ed = fabs(an - fd), ef = fabs(an - fdf);
        worst_d = fmax(worst_d, ed / (1e-4 + 1e-3 * fabs(fd)));
        worst_f = fmax(worst_f, ef / (2e-3 + 2e-2 * fabs(fd)));
        if (ed > 1e-4 + 1e-3 * fabs(fd) && bad_d++ < 5)
            fprintf(stderr, "  %s: %s[%lld] analytic %.8g vs double fd %.8g\n", label,
                    param_name(m, p), (long long)p, an, fd);
        if (ef > 2e-3 + 2e-2 * fabs(fd) && bad_f++ < 5)
            fprintf(stderr, "  %s: %s[%lld] analytic %.8g vs fp32 fd %.8g\n", label,
                    param_name(m, p), (long long)p, an, fdf);
    }
    printf("%s: %lld coordinates, %lld skipped (routing or clamp flips), worst error / tolerance: "
           "double fd %.3f, fp32 fd %.3f\n",
           label, (long long)P, (long long)skipped, worst_d, worst_f);
    CHECK(bad_d == 0, "%s: %lld gradients disagree with double central differences", label,
          (long long)bad_d);
    CHECK(bad_f == 0, "%s: %lld gradients disagree with fp32 central differences", label,
          (long long)bad_f);
    CHECK(skipped * 20 < P, "%s: %lld of %lld coordinates skipped", label, (long long)skipped,
          (long long)P);
    free(grad), free(y), free(yr), free(i0), free(i1), free(m0), free(m1);
}

static void test_grads(trex_arena *arena)
{
    model m;
    model_init(&m, 2, 7, 16, 6, 2, 8, 1, 0.3, 0.3, 1.5, 1);
    grad_check(&m, arena, "non-hash layer (balance loss, alpha 0.3)");
    model_free(&m);
    model_init(&m, 2, 7, 16, 6, 2, 8, 0, 0.3, 0.3, 1.5, 2);
    grad_check(&m, arena, "hash layer");
    model_free(&m);

    /* Zero gradient where clamped: w3 of the shared expert and of expert 2 scaled so that every |u|
     * exceeds L; their gradients must be exactly 0, while w1's are not. */
    model_init(&m, 2, 7, 16, 6, 2, 8, 1, 0.3, 0.3, 1.5, 3);
    for (int64_t q = 0; q < m.I * m.d; q++) {
        model_set(&m, m.o_sw3 + q, m.th[m.o_sw3 + q] * 400.0);
        model_set(&m, m.o_w3 + 2 * m.ew + q, m.th[m.o_w3 + 2 * m.ew + q] * 400.0);
    }
    {
        trex_ctx ctx = {.pool = NULL, .arena = arena};
        const int64_t nm = m.N * (m.K + 1) * 2 * m.I;
        unsigned char *mask = xcalloc((size_t)nm, 1);
        int32_t *idx = xcalloc((size_t)(m.N * m.K), sizeof(int32_t));
        double *yr = xcalloc((size_t)(m.N * m.d), sizeof(double));
        ref_forward(&m, m.th, yr, idx, mask);
        /* Rows i of sw3 / w3[2] whose u is clamped for every token that uses the expert. */
        unsigned char full[2][64];
        int64_t uses2 = 0;
        memset(full, 1, sizeof full);
        for (int64_t t = 0; t < m.N; t++)
            for (int64_t k = -1; k < m.K; k++)
                if (k < 0 || idx[t * m.K + k] == 2) {
                    uses2 += k >= 0;
                    for (int64_t i = 0; i < m.I; i++)
                        full[k >= 0][i] &= mask[(t * (m.K + 1) + k + 1) * 2 * m.I + m.I + i];
                }
        float *grad = xcalloc((size_t)m.P, sizeof(float));
        float *y = xcalloc((size_t)(m.N * m.d), sizeof(float));
        double bal;
        layer_grad(&m, &ctx, y, grad, &bal, NULL);
        int64_t nfull = 0, bad = 0;
        for (int w = 0; w < 2; w++)
            for (int64_t i = 0; i < m.I; i++) {
                const float *row = grad + (w ? m.o_w3 + 2 * m.ew : m.o_sw3) + i * m.d;
                int64_t nz = 0;
                for (int64_t j = 0; j < m.d; j++)
                    nz += row[j] != 0.0f;
                nfull += full[w][i];
                bad += full[w][i] ? nz != 0 : nz == 0; /* clamped rows 0, others not */
            }
        CHECK(uses2 > 0 && nfull >= m.I, "%lld fully clamped rows of w3 (%lld tokens on expert 2)",
              (long long)nfull, (long long)uses2);
        CHECK(bad == 0, "%lld w3 gradient rows break: zero iff u is clamped for every token",
              (long long)bad);
        free(mask), free(idx), free(yr), free(grad), free(y);
    }
    model_free(&m);

    /* Very negative router logits: gradients stay finite. */
    model_init(&m, 2, 7, 16, 6, 2, 8, 1, 0.3, 0.3, 1.5, 4);
    for (int64_t j = 0; j < m.d; j++)
        model_set(&m, m.o_gate + 3 * m.d + j, m.th[m.o_gate + 3 * m.d + j] * 60.0);
    {
        trex_ctx ctx = {.pool = NULL, .arena = arena};
        float *grad = xcalloc((size_t)m.P, sizeof(float));
        float *y = xcalloc((size_t)(m.N * m.d), sizeof(float));
        double bal;
        layer_grad(&m, &ctx, y, grad, &bal, NULL);
        bool fin = isfinite(bal);
        for (int64_t p = 0; p < m.P; p++)
            fin = fin && isfinite(grad[p]);
        CHECK(fin, "gradients finite with logits of magnitude ~100");
        free(grad), free(y);
    }
    grad_check(&m, arena, "large router logits");
    model_free(&m);
}

/* ---- 4. threads, chunking, accumulation ---------------------------------------------------------- */

static void test_threads(trex_arena *arena)
{
    trex_pool *pool = trex_pool_create(2);
    CHECK(pool != NULL && trex_pool_size(pool) == 2, "pool of 2 threads");
    if (!pool)
        return;
    model m;
    /* 1400 tokens; bias on expert 0 gives it every token, so its GEMMs run in two chunks. */
    model_init(&m, 2, 700, 64, 8, 3, 32, 1, 0.3, 0.15, 1.5, 5);
    model_set_bias(&m, 0, 10.0);
    const int64_t P = m.P, n = m.N * m.d;
    float *g1 = xcalloc((size_t)P, sizeof(float)), *g2 = xcalloc((size_t)P, sizeof(float));
    float *y1 = xcalloc((size_t)n, sizeof(float)), *y2 = xcalloc((size_t)n, sizeof(float));
    int64_t load[64] = {0};
    double b1 = 0, b2 = 0;
    trex_ctx c1 = {.pool = NULL, .arena = arena}, c2 = {.pool = pool, .arena = arena};
    layer_grad(&m, &c1, y1, g1, &b1, load);
    CHECK(load[0] == m.N, "expert 0 serves all %lld tokens", (long long)m.N);
    for (int64_t p = 0; p < m.o_gate; p++)
        g2[p] = NAN; /* dx is written, not accumulated */
    layer_grad(&m, &c2, y2, g2, &b2, NULL);
    CHECK(memcmp(y1, y2, (size_t)n * sizeof(float)) == 0, "y bitwise equal, 1 vs 2 threads");
    CHECK(memcmp(g1, g2, (size_t)P * sizeof(float)) == 0, "gradients bitwise equal, 1 vs 2 threads");
    CHECK(b1 == b2, "balance loss equal");
    compare_forward(&m, &c2, "1400 tokens, 2 threads");

    /* Directional derivative of the naive double loss along a random direction. */
    {
        uint64_t st = 77;
        double *dir = xcalloc((size_t)P, sizeof(double)), *th = xcalloc((size_t)P, sizeof(double));
        double *yr = xcalloc((size_t)n, sizeof(double)), an = 0, l[2];
        for (int64_t p = 0; p < P; p++) {
            dir[p] = rng_normal(&st);
            an += dir[p] * g1[p];
        }
        const double h = 1e-6;
        for (int sgn = 0; sgn < 2; sgn++) {
            for (int64_t p = 0; p < P; p++)
                th[p] = m.th[p] + (sgn ? -h : h) * dir[p];
            l[sgn] = ref_loss(&m, th, yr, NULL, NULL);
        }
        double fd = (l[0] - l[1]) / (2 * h);
        CHECK(fabs(an - fd) <= 1e-3 * fabs(fd), "directional derivative %.8g vs fd %.8g", an, fd);
        free(dir), free(th), free(yr);
    }

    /* Weight gradients accumulate: a second backward doubles them exactly; dx is rewritten. */
    {
        trex_moe_cache *cache = NULL;
        trex_arena_reset(arena);
        CHECK(layer_forward(&m, &c2, m.thf, y2, &cache, NULL) == TREX_OK, "forward");
        float *dy = xcalloc((size_t)n, sizeof(float));
        for (int64_t q = 0; q < n; q++)
            dy[q] = (float)m.R[q];
        wviews v, gv;
        views(&v, &m, m.thf, false);
        views(&gv, &m, g2, true);
        trex_seqinfo seq = seqinfo(&m);
        trex_moe_backward(&c2, &m.cfg, m.layer, &seq, g2 + m.o_x, dy, m.thf + m.o_x, &v.w, &gv.w,
                          cache, m.alpha, 1.0);
        /* Exact doubling but for expert 0, whose two chunks add in another order: compare with the
         * largest gradient of the same tensor. */
        bool dx = true;
        double gmax[N_RANGES] = {0}, err[N_RANGES] = {0};
        prange r[N_RANGES];
        model_ranges(&m, r);
        for (int64_t p = 0; p < m.o_gate; p++)
            dx = dx && g2[p] == g1[p];
        for (int w = 1; w < N_RANGES; w++)
            for (int64_t p = r[w].o0; p < r[w].o1; p++) {
                gmax[w] = fmax(gmax[w], fabs(g1[p]));
                err[w] = fmax(err[w], fabs(g2[p] - 2.0 * g1[p]));
            }
        CHECK(dx, "dx is written (=)");
        for (int w = 1; w < N_RANGES; w++)
            CHECK(gmax[w] > 0 && err[w] <= 1e-6 * gmax[w], "%s gradients accumulate (+=): error %g "
                  "of max %g", r[w].name, err[w], gmax[w]);
        free(dy);
    }
    free(g1), free(g2), free(y1), free(y2);
    model_free(&m);
    trex_pool_destroy(pool);
}

/* ---- 5. bf16 mode --------------------------------------------------------------------------------- */

/* Max |b - a| over [o0, o1) relative to max |a|. */
static double rel_err(const float *a, const float *b, int64_t o0, int64_t o1, double *amax)
{
    double err = 0, mx = 0;
    for (int64_t p = o0; p < o1; p++) {
        err = fmax(err, fabs((double)b[p] - (double)a[p]));
        mx = fmax(mx, fabs((double)a[p]));
    }
    if (amax)
        *amax = mx;
    return mx > 0 ? err / mx : err;
}

static int64_t tensor_at(const model *m, int64_t q, int64_t *n);

/* The layer with its gradients known to start at zero (trex_ctx.grads_zero, as the trainer's first
 * micro-batch): each expert's first rows write its weight gradients (beta 0) and the part of an expert
 * cut between passes adds to them, so the values are those of g_ref and y_ref (computed by adding to
 * zeros). The weight gradients of every expert with rows (load) and of the shared expert start as NaN
 * here: a product that added instead of writing would leave them NaN. */
static void grads_zero_case(model *m, const trex_ctx *ctx, const char *label, const float *g_ref,
                            const float *y_ref, const int64_t *load)
{
    const int64_t P = m->P, n = m->N * m->d;
    float *g = xcalloc((size_t)P, sizeof(float)), *y = xcalloc((size_t)n, sizeof(float));
    double b = 0;
    for (int64_t p = 0; p < m->o_gate; p++)
        g[p] = NAN;
    for (int64_t q = 2; q < 2 + 3 * m->E + 3; q++) {
        const int64_t e = q < 2 + 3 * m->E ? (q - 2) % m->E : -1; /* -1: the shared expert */
        if (e >= 0 && load[e] == 0)
            continue;
        int64_t len;
        const int64_t o = tensor_at(m, q, &len);
        for (int64_t p = o; p < o + len; p++)
            g[p] = NAN;
    }
    trex_ctx c = *ctx;
    c.grads_zero = true;
    layer_grad(m, &c, y, g, &b, NULL);
    int64_t bad = 0;
    for (int64_t p = 0; p < P; p++)
        bad += g[p] != g_ref[p];
    CHECK(bad == 0 && memcmp(y, y_ref, (size_t)n * sizeof(float)) == 0,
          "%s: gradients starting at zero, written by each expert's first rows: the same values (%lld of %lld "
          "differ)",
          label, (long long)bad, (long long)P);
    free(g);
    free(y);
}

/* One layer in fp32 (no pool), bf16 with no pool and bf16 with 2 threads. tol: the bound on every
 * output and gradient tensor, relative to its largest fp32 element. */
static void bf16_case(model *m, trex_arena *arena, trex_pool *pool, const char *label, double tol)
{
    trex_gemm_ws *ws1 = trex_gemm_ws_create(), *ws2 = trex_gemm_ws_create();
    CHECK(ws1 && ws2, "%s: gemm workspaces", label);
    if (!ws1 || !ws2)
        return;
    const int64_t P = m->P, n = m->N * m->d;
    float *g32 = xcalloc((size_t)P, sizeof(float)), *g1 = xcalloc((size_t)P, sizeof(float));
    float *g2 = xcalloc((size_t)P, sizeof(float));
    float *y32 = xcalloc((size_t)n, sizeof(float)), *y1 = xcalloc((size_t)n, sizeof(float));
    float *y2 = xcalloc((size_t)n, sizeof(float));
    int64_t load32[64] = {0}, load1[64] = {0};
    double b32 = 0, b1 = 0, b2 = 0;
    trex_ctx c32 = {.pool = NULL, .arena = arena};
    trex_ctx c1 = {.pool = NULL, .arena = arena, .compute = TREX_BF16, .ws = ws1};
    trex_ctx c2 = {.pool = pool, .arena = arena, .compute = TREX_BF16, .ws = ws2};
    layer_grad(m, &c32, y32, g32, &b32, load32);
    for (int64_t p = 0; p < m->o_gate; p++)
        g1[p] = g2[p] = NAN; /* dx is written, not accumulated */
    layer_grad(m, &c1, y1, g1, &b1, load1);
    layer_grad(m, &c2, y2, g2, &b2, NULL);
    CHECK(memcmp(y1, y2, (size_t)n * sizeof(float)) == 0, "%s: y bitwise equal, 1 vs 2 threads",
          label);
    CHECK(memcmp(g1, g2, (size_t)P * sizeof(float)) == 0,
          "%s: gradients bitwise equal, 1 vs 2 threads", label);
    CHECK(b1 == b2 && b1 == b32, "%s: balance loss %.9g (bf16) vs %.9g (fp32)", label, b1, b32);
    CHECK(memcmp(load1, load32, sizeof load1) == 0, "%s: the same routing as fp32", label);
    double mx;
    const double ey = rel_err(y32, y1, 0, n, &mx);
    CHECK(mx > 0 && ey <= tol, "%s: y within %g of fp32: %.3g", label, tol, ey);
    prange r[N_RANGES];
    model_ranges(m, r);
    for (int w = 0; w < N_RANGES; w++) {
        const double e = rel_err(g32, g1, r[w].o0, r[w].o1, &mx);
        CHECK(mx > 0 && e <= tol, "%s: %s gradient within %g of fp32: %.3g", label,
              w ? r[w].name : "dx", tol, e);
    }

    grads_zero_case(m, &c2, label, g1, y1, load1);

    /* A second backward from a fresh forward: dx rewritten, weight gradients doubled (up to the
     * order in which an expert cut between passes adds its two parts). */
    {
        trex_moe_cache *cache = NULL;
        trex_arena_reset(arena);
        CHECK(layer_forward(m, &c2, m->thf, y2, &cache, NULL) == TREX_OK && cache, "%s: forward",
              label);
        float *dy = xcalloc((size_t)n, sizeof(float));
        for (int64_t q = 0; q < n; q++)
            dy[q] = (float)m->R[q];
        wviews v, gv;
        views(&v, m, m->thf, false);
        views(&gv, m, g2, true);
        trex_seqinfo seq = seqinfo(m);
        if (cache)
            trex_moe_backward(&c2, &m->cfg, m->layer, &seq, g2 + m->o_x, dy, m->thf + m->o_x, &v.w,
                              &gv.w, cache, m->alpha, 1.0);
        CHECK(memcmp(g1, g2, (size_t)m->o_gate * sizeof(float)) == 0, "%s: dx is written (=)",
              label);
        double worst = 0;
        for (int w = 1; w < N_RANGES; w++) {
            double gmax = 0, err = 0;
            for (int64_t p = r[w].o0; p < r[w].o1; p++) {
                gmax = fmax(gmax, fabs(g1[p]));
                err = fmax(err, fabs(g2[p] - 2.0 * g1[p]));
            }
            worst = fmax(worst, gmax > 0 ? err / gmax : err);
        }
        CHECK(worst <= 1e-5, "%s: weight gradients accumulate (+=): relative error %g", label, worst);
        free(dy);
    }

    /* The products from bf16 copies of the weights (as in the trainer's bf16 runs): the same bits as
     * rounding the fp32 weights while packing. Then new expert weights (the routing does not move):
     * the copies, rewritten, follow them; copies that were not rewritten would give other bits. */
    for (int lo = 0; lo < 2; lo++) { /* the copies as rows, then as packed panels */
        const char *ln = lo ? "panels" : "rows";
        float *g3 = xcalloc((size_t)P, sizeof(float)), *y3 = xcalloc((size_t)n, sizeof(float));
        double b3 = 0;
        model_copies(m, lo ? TREX_WCOPY_PANELS : TREX_WCOPY_ROWS);
        for (int64_t p = 0; p < m->o_gate; p++)
            g3[p] = NAN;
        layer_grad(m, &c2, y3, g3, &b3, NULL);
        CHECK(memcmp(y1, y3, (size_t)n * sizeof(float)) == 0, "%s: y from the weight copies (%s) bitwise equal",
              label, ln);
        CHECK(memcmp(g1, g3, (size_t)P * sizeof(float)) == 0,
              "%s: gradients from the weight copies (%s) bitwise equal", label, ln);
        grads_zero_case(m, &c2, label, g1, y1, load1); /* the products through row lists */
        for (int64_t p = m->o_w1; p < m->P; p++)
            m->thf[p] = -0.75f * m->thf[p] + 1e-3f;
        m->ver++;
        CHECK(!trex_wcopy_fresh(m->wc), "%s: copies (%s) stale after a change of the weights", label, ln);
        trex_wcopy_refresh(pool, m->wc);
        memset(g3, 0, (size_t)P * sizeof(float));
        layer_grad(m, &c2, y3, g3, &b3, NULL);
        trex_wcopy *wc = m->wc;
        m->wc = NULL;
        memset(g1, 0, (size_t)P * sizeof(float));
        layer_grad(m, &c1, y1, g1, &b1, NULL);
        m->wc = wc;
        CHECK(memcmp(y1, y3, (size_t)n * sizeof(float)) == 0 &&
                  memcmp(g1, g3, (size_t)P * sizeof(float)) == 0,
              "%s: new weights: results from the rewritten copies (%s) bitwise equal", label, ln);
        free(g3), free(y3);
    }
    free(g32), free(g1), free(g2), free(y32), free(y1), free(y2);
    trex_gemm_ws_destroy(ws1);
    trex_gemm_ws_destroy(ws2);
}

/* Tensor q of m (0 x, 1 gate, 2 + e w1[e], 2 + E + e w3[e], 2 + 2E + e w2[e], 2 + 3E sw1, sw3, sw2):
 * offset and size in the flat vector. */
static int64_t tensor_at(const model *m, int64_t q, int64_t *n)
{
    const int64_t E = m->E, Id = m->I * m->d;
    *n = q == 0 ? m->o_gate : q == 1 ? E * m->d : Id;
    return q == 0              ? 0
           : q == 1            ? m->o_gate
           : q < 2 + E         ? m->o_w1 + (q - 2) * m->ew
           : q < 2 + 2 * E     ? m->o_w3 + (q - 2 - E) * m->ew
           : q < 2 + 3 * E     ? m->o_w2 + (q - 2 - 2 * E) * Id
           : q == 2 + 3 * E    ? m->o_sw1
           : q == 3 + 3 * E    ? m->o_sw3
                               : m->o_sw2;
}

/* One layer with [W1; W3] in place and the same values with W1 and W3 apart: bf16 mode runs a | u and
 * [dW1; dW3] as one product or as two, with the same bits. */
static void test_bf16_layouts(trex_arena *arena, trex_pool *pool)
{
    model a, b;
    model_init(&a, 1, 300, 40, 6, 2, 24, 1, 0.3, 0.15, 10.0, 31);
    model_init_split(&b, 1, 300, 40, 6, 2, 24, 1, 0.3, 0.15, 10.0, 31, true);
    const int64_t nt = 5 + 3 * a.E;
    for (int64_t q = 0; q < nt; q++) {
        int64_t n, oa = tensor_at(&a, q, &n), ob = tensor_at(&b, q, &n);
        memcpy(b.th + ob, a.th + oa, (size_t)n * sizeof *b.th);
        memcpy(b.thf + ob, a.thf + oa, (size_t)n * sizeof *b.thf);
    }
    trex_gemm_ws *ws = trex_gemm_ws_create();
    float *ga = xcalloc((size_t)a.P, sizeof(float)), *gb = xcalloc((size_t)b.P, sizeof(float));
    float *ya = xcalloc((size_t)(a.N * a.d), sizeof(float)), *yb = xcalloc((size_t)(b.N * b.d), sizeof(float));
    double ba = 0, bb = 0;
    trex_ctx c = {.pool = pool, .arena = arena, .compute = TREX_BF16, .ws = ws};
    layer_grad(&a, &c, ya, ga, &ba, NULL);
    layer_grad(&b, &c, yb, gb, &bb, NULL);
    CHECK(memcmp(ya, yb, (size_t)(a.N * a.d) * sizeof(float)) == 0, "bf16 layouts: y bitwise equal");
    int64_t bad = 0;
    for (int64_t q = 0; q < nt; q++) {
        int64_t n, oa = tensor_at(&a, q, &n), ob = tensor_at(&b, q, &n);
        bad += memcmp(ga + oa, gb + ob, (size_t)n * sizeof(float)) != 0;
    }
    CHECK(bad == 0 && ba == bb, "bf16 layouts: %lld of %lld gradient tensors differ", (long long)bad,
          (long long)nt);
    free(ga), free(gb), free(ya), free(yb);
    trex_gemm_ws_destroy(ws);
    model_free(&a);
    model_free(&b);
}

static void test_bf16(trex_arena *arena)
{
    trex_pool *pool = trex_pool_create(2);
    CHECK(pool != NULL, "pool of 2 threads");
    if (!pool)
        return;
    model m;
    /* 3000 tokens x 3 = 9000 permuted rows: two grouped passes (8192 rows each at most). The bias
     * gives expert 0 every token, so expert 1 starts at row 3000 and the pass boundary cuts one of
     * the later experts in two. I = 48 and d = 72 are not multiples of the 32-wide panels. Limit 10
     * (dsv4's): a clamp whose boundary lies within bf16 rounding of a pre-activation switches that
     * element's gradient on or off, an O(1) difference from fp32 that no bound on rounding covers. */
    model_init(&m, 2, 1500, 72, 8, 3, 48, 1, 0.3, 0.15, 10.0, 21);
    model_set_bias(&m, 0, 10.0);
    bf16_case(&m, arena, pool, "bf16, two passes", 2e-2);
    model_free(&m);
    /* 8 500 tokens: the shared expert's rows in two passes too (8 192 rows each at most), the routed
     * 17 000 in three. */
    model_init(&m, 1, 8500, 24, 4, 2, 16, 1, 0.3, 0.15, 10.0, 27);
    bf16_case(&m, arena, pool, "bf16, the shared expert in two passes", 2e-2);
    model_free(&m);
    /* 20 experts in one pass: the backward's dx runs over three waves of [W1; W3] copies (at most 8
     * experts each); d = 40 and I = 24 leave partial panels. */
    model_init(&m, 1, 700, 40, 20, 3, 24, 1, 0.3, 0.15, 10.0, 24);
    bf16_case(&m, arena, pool, "bf16, 20 experts in waves", 2e-2);
    model_free(&m);
    /* The same with W1 and W3 apart (every expert's w1, then every w3; the shared expert's w1, w2,
     * w3): bf16 mode runs a | u and [dW1; dW3] as two problems each. */
    model_init_split(&m, 1, 700, 40, 20, 3, 24, 1, 0.3, 0.15, 10.0, 24, true);
    bf16_case(&m, arena, pool, "bf16, 20 experts, [W1; W3] apart", 2e-2);
    model_free(&m);
    /* ... in two passes (9 000 rows): [dW1; dW3] as two lists of problems, each with an expert cut by
     * the pass boundary */
    model_init_split(&m, 1, 3000, 40, 20, 3, 24, 1, 0.3, 0.15, 10.0, 25, true);
    bf16_case(&m, arena, pool, "bf16, 20 experts, [W1; W3] apart, two passes", 2e-2);
    model_free(&m);
    test_bf16_layouts(arena, pool);
    /* Expert 0 takes every token (500 rows), the other four about 125 each: with the weight copies,
     * the forward's products run expert 0 as usual and the others with the weight as A (C transposed
     * into place, moe.c swap_piece) in one call; d = 38 and 2I = 26 are not multiples of the 4 x 4
     * blocks of that transposition. */
    model_init(&m, 1, 500, 38, 5, 2, 13, 1, 0.3, 0.15, 10.0, 25);
    model_set_bias(&m, 0, 10.0);
    bf16_case(&m, arena, pool, "bf16, few and many rows per expert", 2e-2);
    model_free(&m);
    /* Hash layer, no clamp (limit 0), a small batch. */
    model_init(&m, 1, 37, 40, 6, 2, 24, 0, 0.0, 0.2, 0.0, 22);
    bf16_case(&m, arena, pool, "bf16, hash layer", 2e-2);
    model_free(&m);
    /* An empty batch is fine in bf16 mode too. */
    {
        model_init(&m, 1, 0, 16, 4, 2, 8, 1, 0.3, 0.2, 1.5, 23);
        trex_gemm_ws *ws = trex_gemm_ws_create();
        trex_ctx c = {.pool = pool, .arena = arena, .compute = TREX_BF16, .ws = ws};
        trex_moe_cache *cache = NULL;
        float y[1];
        trex_arena_reset(arena);
        CHECK(layer_forward(&m, &c, m.thf, y, &cache, NULL) == TREX_OK && cache,
              "bf16: empty batch forward");
        trex_gemm_ws_destroy(ws);
        model_free(&m);
    }
    trex_pool_destroy(pool);
}

/* ---- benchmark (not part of the test) ----------------------------------------------------------- */

static double now_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_dbl(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* `test_moe --bench T [REPS [THREADS [copies|panels|fp32]]]`: one non-hash layer at dsv4-bench's shapes
 * (d 1024, 24 experts, 6 per token, inter 512, swiglu_limit 10, random weights, bias 0) in bf16 mode,
 * forward with a cache then backward, REPS times (default 5) on a pool of THREADS (default 2), the
 * products reading bf16 copies of the weights as rows (copies, the default; as the trainer runs under
 * --recompute attention), as packed panels (panels: as it runs otherwise) or the fp32 weights. Prints each
 * repetition and the medians over all but the first: wall seconds and process CPU seconds (all
 * threads); with copies also the time to write them (once per optimizer step in training). */
static int bench(int argc, char **argv)
{
    const long T = argc > 2 ? strtol(argv[2], NULL, 10) : 1024;
    const int reps = argc > 3 ? (int)strtol(argv[3], NULL, 10) : 5;
    const int threads = argc > 4 ? (int)strtol(argv[4], NULL, 10) : 2;
    const char *mode = argc > 5 ? argv[5] : "copies";
    if (T < 1 || reps < 2 || reps > 100 || threads < 1 || threads > 64 ||
        (strcmp(mode, "copies") && strcmp(mode, "panels") && strcmp(mode, "fp32"))) {
        fprintf(stderr, "usage: test_moe --bench T [REPS (2-100) [THREADS (1-64) [copies|panels|fp32]]]\n");
        return 2;
    }
    model m;
    model_init(&m, 1, T, 1024, 24, 6, 512, 1, 1e-4, 0.02, 10.0, 99);
    trex_arena *arena = trex_arena_create(NULL, TREX_REGION_ACTS, (size_t)1 << 20);
    trex_pool *pool = trex_pool_create(threads);
    trex_gemm_ws *ws = trex_gemm_ws_create();
    float *y = xcalloc((size_t)(m.N * m.d), sizeof(float)), *g = xcalloc((size_t)m.P, sizeof(float));
    float *dy = xcalloc((size_t)(m.N * m.d), sizeof(float));
    if (!arena || !pool || !ws) {
        fprintf(stderr, "bench: out of memory\n");
        return 1;
    }
    for (int64_t q = 0; q < m.N * m.d; q++)
        dy[q] = (float)m.R[q];
    trex_ctx ctx = {.pool = pool, .arena = arena, .compute = TREX_BF16, .ws = ws};
    if (strcmp(mode, "fp32")) {
        model_copies(&m, strcmp(mode, "panels") ? TREX_WCOPY_ROWS : TREX_WCOPY_PANELS);
        if (!m.wc)
            return 1;
        double cw[5], cc[5];
        for (int r = 0; r < 5; r++) {
            const double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
            m.ver++;
            trex_wcopy_refresh(pool, m.wc);
            cw[r] = now_s(CLOCK_MONOTONIC) - w0, cc[r] = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        }
        printf("copies: %.1f MiB, written in %.4f s wall %.4f s cpu (median of 5)\n",
               (double)m.wc->bytes / 1048576.0, median(cw, 5), median(cc, 5));
    }
    wviews v, gv;
    views(&v, &m, m.thf, false);
    views(&gv, &m, g, true);
    trex_seqinfo seq = seqinfo(&m);
    double fw[100], fc[100], bw[100], bc[100];
    for (int r = 0; r < reps; r++) {
        trex_moe_cache *cache = NULL;
        trex_err err = {0};
        trex_arena_reset(arena);
        const double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        if (trex_moe_forward(&ctx, &m.cfg, m.layer, &seq, y, m.thf + m.o_x, &v.w, m.alpha, &cache,
                             NULL, &err) != TREX_OK) {
            fprintf(stderr, "bench: %s\n", err.msg);
            return 1;
        }
        const double w1 = now_s(CLOCK_MONOTONIC), c1 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        trex_moe_backward(&ctx, &m.cfg, m.layer, &seq, g + m.o_x, dy, m.thf + m.o_x, &v.w, &gv.w,
                          cache, m.alpha, 1.0);
        const double w2 = now_s(CLOCK_MONOTONIC), c2 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        fw[r] = w1 - w0, fc[r] = c1 - c0, bw[r] = w2 - w1, bc[r] = c2 - c1;
        printf("rep %d: forward %.4f s wall %.4f s cpu, backward %.4f s wall %.4f s cpu\n", r, fw[r],
               fc[r], bw[r], bc[r]);
    }
    uint64_t hy = 14695981039346656037ull, hg = hy; /* FNV-1a of the bytes, to compare builds */
    for (size_t q = 0; q < (size_t)(m.N * m.d) * sizeof(float); q++)
        hy = (hy ^ ((const unsigned char *)y)[q]) * 1099511628211ull;
    for (size_t q = 0; q < (size_t)m.P * sizeof(float); q++)
        hg = (hg ^ ((const unsigned char *)g)[q]) * 1099511628211ull;
    printf("T %ld, %d threads, %s: forward %.4f s wall %.4f s cpu, backward %.4f s wall %.4f s cpu "
           "(medians of %d); hash y %016llx, hash grads %016llx\n",
           T, threads, mode, median(fw + 1, reps - 1), median(fc + 1, reps - 1), median(bw + 1, reps - 1),
           median(bc + 1, reps - 1), reps - 1, (unsigned long long)hy, (unsigned long long)hg);
    free(y), free(g), free(dy);
    trex_gemm_ws_destroy(ws);
    trex_pool_destroy(pool);
    trex_arena_destroy(arena);
    model_free(&m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--bench") == 0)
        return bench(argc, argv);
    trex_arena *arena = trex_arena_create(NULL, TREX_REGION_ACTS, (size_t)1 << 20);
    CHECK(arena != NULL, "arena");
    if (!arena)
        return check_summary();
    test_math();
    test_forward(arena);
    test_grads(arena);
    test_threads(arena);
    test_bf16(arena);
    trex_arena_destroy(arena);
    return check_summary();
}
