/* tests/test_attention.c — the DeepSeek-V4 attention sub-layer (model/attention.c, model/rope.c).
 *
 *  1. the scalar core (model/attention_math.h, double build) against central differences in double:
 *     compressor pooling and sink attention (query side and key side);
 *  2. RoPE / YaRN tables and the rotation;
 *  3. trex_attn_forward against a naive double implementation written straight from MODEL_SPEC §3
 *     (SWA, CSA dense and sparse, HCA with ratios 3 and 8, two documents in a row);
 *  4. trex_attn_backward against central differences of trex_attn_forward in fp32 (random directions),
 *     the LM path and the indexer KL path separately (each must leave the other's parameters alone);
 *  5. visibility: with a window of 1, query p depends on compressed block i iff i < floor((p+1)/m);
 *  6. a packed row equals each document run alone; sparse with top-k >= visible equals dense; in bf16,
 *     the projections read from bf16 panels (trex_attn_w.wc) give the bits of packing the weights per
 *     call, and the products do read the panels;
 *  7. bitwise identical results with no pool and with a 2-thread pool, in fp32 and in bf16 mode (the
 *     bf16 attention core and indexer scores of the kernel level, AMX where the machine has it);
 *  8. the fused axpy entry (kernels/fused.h) gives y + a x, element by element, at every level, and
 *     axpy_rows the bits of one axpy per active term; the fused rope entry gives trex_rope_rotate's
 *     bits and rms_head_bwd those of the per-head RMS backward written out in scalar code; kl_qgrad
 *     and kl_kgrad (the indexer KL's gradient loops) the bits of those loops written out.
 *
 * `test_attention --bench N [reps] [fp32|bf16] [threads]` instead times trex_attn_forward and
 * trex_attn_backward of one layer of each kind (SWA, CSA with the sparse indexer and its KL, HCA) at
 * dsv4-bench's attention shapes, one document of N tokens: median wall and process CPU time over reps
 * (after one warm-up call), and a hash of y, dx and the weight gradients (which accumulate over all the
 * calls: compare hashes at equal reps). A build with -DTREX_ATTN_PROF also prints the time of each
 * section of the layer (model/attention.c). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "fused_levels.h"
#include "kernels/dispatch.h"
#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "model/rope.h"
#include "trex/alloc.h"
#include "trex/params.h"
#include "trex/pool.h"

#define AM_REAL double
#define AM_SFX d
#include "model/attention_math.h"

static int verbose;

/* ---- random numbers --------------------------------------------------------------------------- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unif(rng *r)
{
    return ((double)(rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double rng_norm(rng *r)
{
    double u = rng_unif(r), v = rng_unif(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void fill_d(double *a, int64_t n, double s, rng *r)
{
    for (int64_t i = 0; i < n; i++)
        a[i] = s * rng_norm(r);
}

static void fill_f(float *a, int64_t n, double s, rng *r)
{
    for (int64_t i = 0; i < n; i++)
        a[i] = (float)(s * rng_norm(r));
}

/* |a - b| <= tol (1 + |b|) */
static int near_rel(double a, double b, double tol)
{
    return fabs(a - b) <= tol * (1.0 + fabs(b));
}

/* ---- 1. the double build of the scalar core against central differences --------------------- */

#define PN 8 /* candidates */
#define PC 5 /* features */

static double pool_loss(double K[PN][PC], double Z[PN][PC], const double *R, int n, int off)
{
    const double *kp[PN], *zp[PN];
    double C[PC], ws[3 * PC];
    for (int j = 0; j < n; j++) {
        kp[j] = K[off + j];
        zp[j] = Z[off + j];
    }
    am_pool_forward_d(C, kp, zp, n, PC, ws);
    double L = 0.0;
    for (int f = 0; f < PC; f++)
        L += R[f] * C[f];
    return L;
}

static void test_pool_fd(void)
{
    rng r = {11};
    double K[PN][PC], Z[PN][PC], R[PC], dK[PN][PC], dZ[PN][PC], ws[3 * PC];
    fill_d(&K[0][0], PN * PC, 1.0, &r);
    fill_d(&Z[0][0], PN * PC, 2.0, &r);
    fill_d(R, PC, 1.0, &r);
    for (int n = 1; n <= PN; n += 3) {
        memset(dK, 0, sizeof dK);
        memset(dZ, 0, sizeof dZ);
        const double *kp[PN], *zp[PN];
        double *dkp[PN], *dzp[PN];
        for (int j = 0; j < n; j++) {
            kp[j] = K[j];
            zp[j] = Z[j];
            dkp[j] = dK[j];
            dzp[j] = dZ[j];
        }
        am_pool_backward_d(dkp, dzp, R, kp, zp, n, PC, ws);
        const double h = 1e-6;
        int bad = 0;
        for (int j = 0; j < n; j++) {
            for (int f = 0; f < PC; f++) {
                double *vars[2] = {&K[j][f], &Z[j][f]};
                double an[2] = {dK[j][f], dZ[j][f]};
                for (int k = 0; k < 2; k++) {
                    double v0 = *vars[k];
                    *vars[k] = v0 + h;
                    double lp = pool_loss(K, Z, R, n, 0);
                    *vars[k] = v0 - h;
                    double lm = pool_loss(K, Z, R, n, 0);
                    *vars[k] = v0;
                    double fd = (lp - lm) / (2 * h);
                    if (!near_rel(an[k], fd, 1e-7)) {
                        bad++;
                        fprintf(stderr, "pool n=%d %s[%d][%d]: %.12g vs fd %.12g\n", n,
                                k ? "Z" : "K", j, f, an[k], fd);
                    }
                }
            }
        }
        CHECK(bad == 0, "pool backward (n=%d) disagrees with central differences at %d points", n,
              bad);
    }
    /* the overlap's block 0: previous candidates with K = 0, Z = -inf carry exactly zero weight */
    double K2[PN][PC], Z2[PN][PC];
    memcpy(K2, K, sizeof K);
    memcpy(Z2, Z, sizeof Z);
    for (int j = 0; j < PN / 2; j++)
        for (int f = 0; f < PC; f++) {
            K2[j][f] = 0.0;
            Z2[j][f] = -INFINITY;
        }
    double a = pool_loss(K2, Z2, R, PN, 0), b = pool_loss(K2, Z2, R, PN / 2, PN / 2);
    CHECK(a == b, "pooling with K=0, Z=-inf candidates %.17g != without them %.17g", a, b);
}

#define SH 2 /* heads */
#define SC 6 /* dims */
#define SN 5 /* entries */

static double sattn_loss(const double *q, double V[SN][SC], const double *sink, const double *R,
                         int n, double *o, double *lse)
{
    const double *vp[SN];
    double z[SH * SN], ob[SH * SC], lb[SH];
    if (!o)
        o = ob;
    if (!lse)
        lse = lb;
    for (int e = 0; e < n; e++)
        vp[e] = V[e];
    am_sattn_forward_d(o, lse, z, q, vp, n, SH, SC, sink, 1.0 / sqrt((double)SC));
    double L = 0.0;
    for (int i = 0; i < SH * SC; i++)
        L += R[i] * o[i];
    return L;
}

static void test_sattn_fd(void)
{
    rng r = {12};
    double q[SH * SC], V[SN][SC], sink[SH], R[SH * SC];
    fill_d(q, SH * SC, 1.5, &r);
    fill_d(&V[0][0], SN * SC, 1.0, &r);
    fill_d(sink, SH, 1.0, &r);
    fill_d(R, SH * SC, 1.0, &r);
    const double scale = 1.0 / sqrt((double)SC);
    for (int n = 0; n <= SN; n += SN) {
        double o[SH * SC], lse[SH], D[SH], dq[SH * SC], dsink[SH], dV[SN][SC], P[SH * SN];
        sattn_loss(q, V, sink, R, n, o, lse);
        am_sattn_delta_d(D, R, o, SH, SC);
        const double *vp[SN];
        for (int e = 0; e < n; e++)
            vp[e] = V[e];
        am_sattn_backward_query_d(dq, dsink, P, R, q, vp, n, SH, SC, sink, scale, lse, D);
        memset(dV, 0, sizeof dV);
        double *dvp[SN], psum[SN];
        for (int e = 0; e < n; e++)
            dvp[e] = dV[e];
        am_sattn_backward_entries_d(dvp, psum, vp, n, q, R, SH, SC, scale, lse, D);
        int bad_psum = 0;
        for (int e = 0; e < n; e++)
            if (fabs(psum[e] - (P[e] + P[SN + e])) > 1e-15)
                bad_psum++;
        CHECK(bad_psum == 0, "entry gradient's head-summed probability disagrees with the query side");
        const double h = 1e-6;
        int bad = 0;
        double *vars[SH * SC + SN * SC + SH], an[SH * SC + SN * SC + SH];
        int nv = 0;
        for (int i = 0; i < SH * SC; i++) {
            vars[nv] = &q[i];
            an[nv++] = dq[i];
        }
        for (int e = 0; e < n; e++)
            for (int i = 0; i < SC; i++) {
                vars[nv] = &V[e][i];
                an[nv++] = dV[e][i];
            }
        for (int hh = 0; hh < SH; hh++) {
            vars[nv] = &sink[hh];
            an[nv++] = dsink[hh];
        }
        for (int k = 0; k < nv; k++) {
            double v0 = *vars[k];
            *vars[k] = v0 + h;
            double lp = sattn_loss(q, V, sink, R, n, NULL, NULL);
            *vars[k] = v0 - h;
            double lm = sattn_loss(q, V, sink, R, n, NULL, NULL);
            *vars[k] = v0;
            double fd = (lp - lm) / (2 * h);
            if (!near_rel(an[k], fd, 1e-7)) {
                bad++;
                fprintf(stderr, "sink attention n=%d var %d: %.12g vs fd %.12g\n", n, k, an[k], fd);
            }
        }
        CHECK(bad == 0, "sink attention backward (n=%d) disagrees with central differences at %d "
              "points", n, bad);
        if (n == 0)
            CHECK(lse[0] == sink[0] && o[0] == 0.0, "no entries: lse is the sink, output is 0");
    }
}

/* ---- 2. RoPE ---------------------------------------------------------------------------------- */

static void test_rope(void)
{
    float f[32], f0[32];
    trex_rope_freqs(f0, 64, 160000.0, false, 16.0, 65536, 32.0, 1.0);
    trex_rope_freqs(f, 64, 160000.0, true, 16.0, 65536, 32.0, 1.0);
    int bad = 0;
    for (int i = 0; i < 32; i++) {
        double ref = 1.0 / pow(160000.0, 2.0 * i / 64.0);
        if (fabs(f0[i] - ref) > 2e-6 * ref)
            bad++;
        if (i <= 15 && f[i] != f0[i])
            bad++;
        if (i >= 25 && f[i] != f0[i] / 16.0f)
            bad++;
        if (i > 15 && i < 25 && !(f[i] < f0[i] && f[i] > f0[i] / 16.0f))
            bad++;
    }
    CHECK(bad == 0, "YaRN frequencies for theta 160000: pairs 0-15 kept, 25-31 divided by 16 "
          "(%d wrong)", bad);
    float ct[4 * 32], st[4 * 32];
    trex_rope_table(ct, st, f, 32, 4);
    bad = 0;
    for (int p = 0; p < 4; p++)
        for (int i = 0; i < 32; i++)
            if (fabs(ct[p * 32 + i] - cos(p * (double)f[i])) > 1e-6 ||
                fabs(st[p * 32 + i] - sin(p * (double)f[i])) > 1e-6)
                bad++;
    CHECK(bad == 0, "cos/sin table");
    rng r = {13};
    float v[64], v0[64];
    fill_f(v, 64, 1.0, &r);
    memcpy(v0, v, sizeof v);
    trex_rope_rotate(v, ct + 3 * 32, st + 3 * 32, 32, false);
    double n0 = 0, n1 = 0;
    for (int i = 0; i < 64; i++) {
        n0 += (double)v0[i] * v0[i];
        n1 += (double)v[i] * v[i];
    }
    CHECK(fabs(n0 - n1) < 1e-5 * n0, "rotation keeps the norm");
    /* pair 0 at position 3 rotates by 3 rad: (a, b) -> (a cos - b sin, a sin + b cos) */
    CHECK(fabs(v[0] - (v0[0] * cos(3.0) - v0[1] * sin(3.0))) < 1e-5 &&
              fabs(v[1] - (v0[0] * sin(3.0) + v0[1] * cos(3.0))) < 1e-5,
          "interleaved pair rotation");
    trex_rope_rotate(v, ct + 3 * 32, st + 3 * 32, 32, true);
    double md = 0;
    for (int i = 0; i < 64; i++)
        md = fmax(md, fabs(v[i] - v0[i]));
    CHECK(md < 1e-6, "inverse rotation undoes the rotation (%.3g)", md);
}

/* ---- layer fixtures --------------------------------------------------------------------------- */

static trex_config small_cfg(void)
{
    trex_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 64;
    c.hidden_size = 32;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 16;
    c.qk_rope_head_dim = 8;
    c.q_lora_rank = 16;
    c.o_groups = 2;
    c.o_lora_rank = 8;
    c.sliding_window = 4;
    c.n_compress_ratios = 4;
    c.compress_ratios[0] = 0;
    c.compress_ratios[1] = 4;
    c.compress_ratios[2] = 3;
    c.compress_ratios[3] = 8;
    c.rope_theta = 10000.0;
    c.compress_rope_theta = 160000.0;
    c.yarn = true;
    c.rope_factor = 16.0;
    c.rope_original_max_pos = 65536;
    c.rope_beta_fast = 32.0;
    c.rope_beta_slow = 1.0;
    c.max_position_embeddings = 1 << 20;
    c.index_n_heads = 2;
    c.index_head_dim = 16;
    c.index_topk = 2;
    c.n_routed_experts = 4;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 16;
    c.routed_scaling_factor = 1.5;
    c.swiglu_limit = 10.0;
    c.hc_mult = 4;
    c.hc_sinkhorn_iters = 20;
    c.hc_eps = 1e-6;
    c.rms_norm_eps = 1e-6;
    c.initializer_range = 0.02;
    snprintf(c.name, sizeof c.name, "attn-test");
    return c;
}

#define MAXN 512
#define MAXS 16

typedef struct tseq {
    trex_seqinfo s;
    int32_t tok[MAXN], pos[MAXN];
    int64_t st[MAXS], ln[MAXS];
} tseq;

/* B rows of T tokens; lens lists the documents row after row (each row's lengths sum to T). */
static void make_seq(tseq *q, int64_t B, int64_t T, const int64_t *lens, int64_t nseg)
{
    TREX_ASSERT(B * T <= MAXN && nseg <= MAXS);
    memset(q, 0, sizeof *q);
    int64_t at = 0;
    for (int64_t s = 0; s < nseg; s++) {
        q->st[s] = at;
        q->ln[s] = lens[s];
        for (int64_t t = 0; t < lens[s]; t++) {
            q->pos[at + t] = (int32_t)t;
            q->tok[at + t] = (int32_t)((at + t) % 64);
        }
        at += lens[s];
    }
    TREX_ASSERT(at == B * T);
    q->s.B = B;
    q->s.T = T;
    q->s.tokens = q->tok;
    q->s.pos = q->pos;
    q->s.nseg = nseg;
    q->s.seg_start = q->st;
    q->s.seg_len = q->ln;
}

enum { K_LIN, K_NORM, K_SINK, K_APE };

typedef struct wdesc {
    const char *name;
    size_t off;
    int64_t n, fanin;
    int kind;
    bool indexer;
} wdesc;

static int weight_list(wdesc *L, const trex_config *cfg, int layer)
{
    const int64_t d = cfg->hidden_size, H = cfg->num_attention_heads, c = cfg->head_dim;
    const int64_t dc = cfg->q_lora_rank, G = cfg->o_groups, dg = cfg->o_lora_rank;
    const int64_t m = cfg->compress_ratios[layer], wm = m == 4 ? 2 : 1;
    const int64_t nI = cfg->index_n_heads, cI = cfg->index_head_dim;
    int n = 0;
#define W(field, count, fin, kd, idx) \
    L[n++] = (wdesc){#field, offsetof(trex_attn_w, field), (count), (fin), (kd), (idx)}
    W(wq_a, dc * d, d, K_LIN, false);
    W(q_norm, dc, 0, K_NORM, false);
    W(wq_b, H * c * dc, dc, K_LIN, false);
    W(wkv, c * d, d, K_LIN, false);
    W(kv_norm, c, 0, K_NORM, false);
    W(wo_a, G * dg * (H / G) * c, (H / G) * c, K_LIN, false);
    W(wo_b, d * G * dg, G * dg, K_LIN, false);
    W(attn_sink, H, 0, K_SINK, false);
    if (m > 0) {
        W(cmp_wkv, wm * c * d, d, K_LIN, false);
        W(cmp_wgate, wm * c * d, d, K_LIN, false);
        W(cmp_ape, m * wm * c, 0, K_APE, false);
        W(cmp_norm, c, 0, K_NORM, false);
    }
    if (m == 4) {
        W(idx_wq_b, nI * cI * dc, dc, K_LIN, true);
        W(idx_weights_proj, nI * d, d, K_LIN, true);
        W(idx_cmp_wkv, 2 * cI * d, d, K_LIN, true);
        W(idx_cmp_wgate, 2 * cI * d, d, K_LIN, true);
        W(idx_cmp_ape, 4 * 2 * cI, 0, K_APE, true);
        W(idx_cmp_norm, cI, 0, K_NORM, true);
    }
#undef W
    return n;
}

static float **wfield(trex_attn_w *w, const wdesc *d)
{
    return (float **)((char *)w + d->off);
}

/* Allocates every tensor of the layer; random values, or zeros when rnd is NULL. */
static void weights_make(trex_attn_w *w, const trex_config *cfg, int layer, rng *rnd)
{
    wdesc L[32];
    int n = weight_list(L, cfg, layer);
    memset(w, 0, sizeof *w);
    for (int i = 0; i < n; i++) {
        float *p = calloc((size_t)L[i].n, sizeof(float));
        TREX_ASSERT(p);
        if (rnd) {
            for (int64_t k = 0; k < L[i].n; k++) {
                double v = rng_norm(rnd);
                switch (L[i].kind) {
                case K_LIN: v *= 1.3 / sqrt((double)L[i].fanin); break;
                case K_NORM: v = 1.0 + 0.2 * v; break;
                case K_SINK: v *= 1.0; break;
                default: v *= 0.7; break;
                }
                p[k] = (float)v;
            }
        }
        *wfield(w, &L[i]) = p;
    }
}

static void weights_free(trex_attn_w *w, const trex_config *cfg, int layer)
{
    wdesc L[32];
    int n = weight_list(L, cfg, layer);
    for (int i = 0; i < n; i++)
        free(*wfield(w, &L[i]));
    memset(w, 0, sizeof *w);
}

static void weights_zero(trex_attn_w *w, const trex_config *cfg, int layer)
{
    wdesc L[32];
    int n = weight_list(L, cfg, layer);
    for (int i = 0; i < n; i++)
        memset(*wfield(w, &L[i]), 0, (size_t)L[i].n * sizeof(float));
}

static trex_ctx make_ctx(trex_pool *pool, trex_arena *ar)
{
    trex_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.pool = pool;
    ctx.arena = ar;
    ctx.par.tp_size = ctx.par.ep_size = ctx.par.pp_size = ctx.par.cp_size = ctx.par.dp_size = 1;
    return ctx;
}

/* ---- 3. a naive double reference, straight from MODEL_SPEC §3 --------------------------------- */

static void ref_linear(double *y, const double *x, const float *W, int64_t in, int64_t out)
{
    for (int64_t o = 0; o < out; o++) {
        double s = 0.0;
        for (int64_t i = 0; i < in; i++)
            s += (double)W[o * in + i] * x[i];
        y[o] = s;
    }
}

static void ref_rms(double *v, int64_t n, const float *w, double eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += v[i] * v[i];
    double rs = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++)
        v[i] = v[i] * rs * (w ? (double)w[i] : 1.0);
}

/* frequencies in double from the formulas of MODEL_SPEC §3.3 */
static void ref_freqs(double *f, const trex_config *cfg, int64_t m)
{
    const int64_t r = cfg->qk_rope_head_dim, half = r / 2;
    const double th = m == 0 ? cfg->rope_theta : cfg->compress_rope_theta;
    for (int64_t i = 0; i < half; i++)
        f[i] = 1.0 / pow(th, 2.0 * (double)i / (double)r);
    if (m == 0 || !cfg->yarn)
        return;
    double L0 = (double)cfg->rope_original_max_pos, pi = 3.14159265358979323846;
    double lo = floor(r * log(L0 / (2 * pi * cfg->rope_beta_fast)) / (2 * log(th)));
    double hi = ceil(r * log(L0 / (2 * pi * cfg->rope_beta_slow)) / (2 * log(th)));
    lo = fmax(lo, 0.0);
    hi = fmin(hi, (double)(r - 1));
    if (hi == lo)
        hi += 0.001;
    for (int64_t i = 0; i < half; i++) {
        double ramp = fmin(fmax(((double)i - lo) / (hi - lo), 0.0), 1.0);
        f[i] = f[i] * (ramp / cfg->rope_factor + (1.0 - ramp));
    }
}

static void ref_rope(double *v, const double *f, int64_t half, double pos, double sign)
{
    for (int64_t i = 0; i < half; i++) {
        double a = v[2 * i], b = v[2 * i + 1], an = sign * pos * f[i];
        v[2 * i] = a * cos(an) - b * sin(an);
        v[2 * i + 1] = a * sin(an) + b * cos(an);
    }
}

/* Compressor of one document of L tokens (rows of xd): C [L/m, cw]. */
static int64_t ref_compress(double *C, const double *xd, int64_t L, int64_t d, int64_t m,
                            int64_t cw, const float *wkv, const float *wgate, const float *ape,
                            const float *norm, const double *f, int64_t r, double eps)
{
    const int64_t wm = m == 4 ? 2 : 1, wc = wm * cw, nb = L / m;
    double *Kt = calloc((size_t)(L * wc), sizeof(double)), *Zt = calloc((size_t)(L * wc), sizeof(double));
    double *kk = calloc((size_t)(2 * m), sizeof(double)), *zz = calloc((size_t)(2 * m), sizeof(double));
    for (int64_t t = 0; t < L; t++) {
        ref_linear(Kt + t * wc, xd + t * d, wkv, d, wc);
        ref_linear(Zt + t * wc, xd + t * d, wgate, d, wc);
    }
    for (int64_t i = 0; i < nb; i++) {
        for (int64_t f2 = 0; f2 < cw; f2++) {
            int64_t n = 0;
            if (wm == 2) {
                for (int64_t j = 0; j < m; j++) { /* previous block, first half; K=0, Z=-inf at i=0 */
                    int64_t tok = (i - 1) * m + j;
                    kk[n] = i > 0 ? Kt[tok * wc + f2] : 0.0;
                    zz[n++] = i > 0 ? Zt[tok * wc + f2] + ape[j * wc + f2] : -INFINITY;
                }
            }
            for (int64_t j = 0; j < m; j++) {
                int64_t tok = i * m + j, ff = (wm == 2 ? cw : 0) + f2;
                kk[n] = Kt[tok * wc + ff];
                zz[n++] = Zt[tok * wc + ff] + ape[j * wc + ff];
            }
            double mx = -INFINITY, den = 0.0, acc = 0.0;
            for (int64_t j = 0; j < n; j++)
                mx = fmax(mx, zz[j]);
            for (int64_t j = 0; j < n; j++) {
                den += exp(zz[j] - mx);
                acc += exp(zz[j] - mx) * kk[j];
            }
            C[i * cw + f2] = acc / den;
        }
        ref_rms(C + i * cw, cw, norm, eps);
        ref_rope(C + i * cw + cw - r, f, r / 2, (double)(i * m), 1.0);
    }
    free(Kt);
    free(Zt);
    free(kk);
    free(zz);
    return nb;
}

/* y [N, d] in double; *kl and *count as trex_indexer_loss. ambiguous[t] is set where the double
 * top-k has a near tie at its cut (float and double may then legitimately select differently). */
static void ref_forward(double *y, double *kl, int64_t *count, bool *ambiguous, const trex_config *cfg,
                        int layer, const tseq *sq, const float *x, const trex_attn_w *w, bool sparse)
{
    const int64_t d = cfg->hidden_size, H = cfg->num_attention_heads, c = cfg->head_dim;
    const int64_t r = cfg->qk_rope_head_dim, half = r / 2, dc = cfg->q_lora_rank;
    const int64_t G = cfg->o_groups, dg = cfg->o_lora_rank, nwin = cfg->sliding_window;
    const int64_t m = cfg->compress_ratios[layer], nI = cfg->index_n_heads, cI = cfg->index_head_dim;
    const double eps = cfg->rms_norm_eps;
    double f[64];
    ref_freqs(f, cfg, m);
    *kl = 0.0;
    *count = 0;
    for (int64_t sg = 0; sg < sq->s.nseg; sg++) {
        const int64_t s0 = sq->st[sg], L = sq->ln[sg];
        double *xd = calloc((size_t)(L * d), sizeof(double));
        double *qr = calloc((size_t)(L * dc), sizeof(double));
        double *q = calloc((size_t)(L * H * c), sizeof(double));
        double *kv = calloc((size_t)(L * c), sizeof(double));
        double *C = calloc((size_t)(L * c + 1), sizeof(double));
        double *KI = calloc((size_t)(L * cI + 1), sizeof(double));
        double *iq = calloc((size_t)(L * nI * cI + 1), sizeof(double));
        double *hw = calloc((size_t)(L * nI + 1), sizeof(double));
        double *sc = calloc((size_t)(L + 1), sizeof(double));
        int64_t *set = calloc((size_t)(L + 1), sizeof(int64_t));
        bool *chosen = calloc((size_t)(L + 1), sizeof(bool));
        double *z = calloc((size_t)(H * (nwin + L + 1)), sizeof(double));
        double *o = calloc((size_t)(H * c), sizeof(double)), *u = calloc((size_t)(G * dg), sizeof(double));
        double *tmp = calloc((size_t)(H * c + d), sizeof(double));
        for (int64_t i = 0; i < L * d; i++)
            xd[i] = x[s0 * d + i];
        for (int64_t t = 0; t < L; t++) {
            ref_linear(qr + t * dc, xd + t * d, w->wq_a, d, dc);
            ref_rms(qr + t * dc, dc, w->q_norm, eps);
            ref_linear(q + t * H * c, qr + t * dc, w->wq_b, dc, H * c);
            for (int64_t h = 0; h < H; h++) {
                ref_rms(q + (t * H + h) * c, c, NULL, eps);
                ref_rope(q + (t * H + h) * c + c - r, f, half, (double)t, 1.0);
            }
            ref_linear(kv + t * c, xd + t * d, w->wkv, d, c);
            ref_rms(kv + t * c, c, w->kv_norm, eps);
            ref_rope(kv + t * c + c - r, f, half, (double)t, 1.0);
        }
        if (m > 0)
            ref_compress(C, xd, L, d, m, c, w->cmp_wkv, w->cmp_wgate, w->cmp_ape, w->cmp_norm,
                              f, r, eps);
        if (m == 4) {
            ref_compress(KI, xd, L, d, 4, cI, w->idx_cmp_wkv, w->idx_cmp_wgate, w->idx_cmp_ape,
                         w->idx_cmp_norm, f, r, eps);
            for (int64_t t = 0; t < L; t++) {
                ref_linear(iq + t * nI * cI, qr + t * dc, w->idx_wq_b, dc, nI * cI);
                for (int64_t h = 0; h < nI; h++)
                    ref_rope(iq + (t * nI + h) * cI + cI - r, f, half, (double)t, 1.0);
                ref_linear(hw + t * nI, xd + t * d, w->idx_weights_proj, d, nI);
                for (int64_t h = 0; h < nI; h++)
                    hw[t * nI + h] *= 1.0 / sqrt((double)cI) / sqrt((double)nI);
            }
        }
        for (int64_t t = 0; t < L; t++) {
            const int64_t vis = m > 0 ? (t + 1) / m : 0;
            int64_t ns = 0;
            ambiguous[s0 + t] = false;
            if (m == 4) {
                for (int64_t s = 0; s < vis; s++) {
                    double a = 0.0;
                    for (int64_t h = 0; h < nI; h++) {
                        double dot = 0.0;
                        for (int64_t i = 0; i < cI; i++)
                            dot += iq[(t * nI + h) * cI + i] * KI[s * cI + i];
                        a += hw[t * nI + h] * fmax(dot, 0.0);
                    }
                    sc[s] = a;
                }
            }
            if (m == 4 && sparse) {
                int64_t k = cfg->index_topk < vis ? cfg->index_topk : vis;
                for (int64_t s = 0; s < vis; s++)
                    chosen[s] = false;
                for (int64_t it = 0; it < k; it++) { /* best remaining; ties keep the lower index */
                    int64_t b = -1;
                    for (int64_t s = 0; s < vis; s++)
                        if (!chosen[s] && (b < 0 || sc[s] > sc[b]))
                            b = s;
                    chosen[b] = true;
                }
                double lo_in = INFINITY, hi_out = -INFINITY;
                for (int64_t s = 0; s < vis; s++) {
                    if (chosen[s]) {
                        set[ns++] = s;
                        lo_in = fmin(lo_in, sc[s]);
                    } else {
                        hi_out = fmax(hi_out, sc[s]);
                    }
                }
                if (lo_in != hi_out && fabs(lo_in - hi_out) < 1e-4)
                    ambiguous[s0 + t] = true;
            } else {
                for (int64_t s = 0; s < vis; s++)
                    set[ns++] = s;
            }
            const int64_t jlo = t - nwin + 1 > 0 ? t - nwin + 1 : 0, nw = t - jlo + 1, n = nw + ns;
            double Psum[MAXN] = {0}, lse[8];
            for (int64_t h = 0; h < H; h++) {
                const double *qh = q + (t * H + h) * c;
                double mx = w->attn_sink[h];
                for (int64_t e = 0; e < n; e++) {
                    const double *v = e < nw ? kv + (jlo + e) * c : C + set[e - nw] * c;
                    double dot = 0.0;
                    for (int64_t i = 0; i < c; i++)
                        dot += qh[i] * v[i];
                    z[h * n + e] = dot / sqrt((double)c);
                    mx = fmax(mx, z[h * n + e]);
                }
                double den = exp(w->attn_sink[h] - mx);
                for (int64_t e = 0; e < n; e++)
                    den += exp(z[h * n + e] - mx);
                lse[h] = mx + log(den);
                double *oh = o + h * c;
                for (int64_t i = 0; i < c; i++)
                    oh[i] = 0.0;
                for (int64_t e = 0; e < n; e++) {
                    const double *v = e < nw ? kv + (jlo + e) * c : C + set[e - nw] * c;
                    double p = exp(z[h * n + e] - lse[h]);
                    if (e >= nw)
                        Psum[e - nw] += p;
                    for (int64_t i = 0; i < c; i++)
                        oh[i] += p * v[i];
                }
                ref_rope(oh + c - r, f, half, (double)t, -1.0);
            }
            for (int64_t gi = 0; gi < G; gi++)
                ref_linear(u + gi * dg, o + gi * (H / G) * c, w->wo_a + gi * dg * (H / G) * c,
                           (H / G) * c, dg);
            ref_linear(tmp, u, w->wo_b, G * dg, d);
            for (int64_t i = 0; i < d; i++)
                y[(s0 + t) * d + i] = tmp[i];
            if (m == 4 && ns > 0) {
                double mass = 0.0, mx = -INFINITY, den = 0.0, k1 = 0.0;
                for (int64_t i = 0; i < ns; i++) {
                    mass += Psum[i];
                    mx = fmax(mx, sc[set[i]]);
                }
                for (int64_t i = 0; i < ns; i++)
                    den += exp(sc[set[i]] - mx);
                for (int64_t i = 0; i < ns; i++) {
                    double p = Psum[i] / mass, lq = sc[set[i]] - mx - log(den);
                    if (p > 0)
                        k1 += p * (log(p) - lq);
                }
                *kl += k1;
                (*count)++;
            }
        }
        free(xd); free(qr); free(q); free(kv); free(C); free(KI); free(iq); free(hw); free(sc);
        free(set); free(chosen); free(z); free(o); free(u); free(tmp);
    }
}

typedef struct lcase {
    int layer;
    bool sparse;
    const char *name;
} lcase;

static const lcase CASES[] = {
    {0, false, "SWA"}, {1, false, "CSA dense"}, {1, true, "CSA sparse"},
    {2, false, "HCA m=3"}, {3, false, "HCA m=8"},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static void test_forward_reference(trex_arena *ar)
{
    trex_config cfg = small_cfg();
    const int64_t lens[] = {13, 7, 9, 11}; /* B=2, T=20: row 0 = 13 + 7, row 1 = 9 + 11 */
    tseq sq;
    make_seq(&sq, 2, 20, lens, 4);
    const int64_t N = 40, d = cfg.hidden_size;
    rng r = {21};
    float *x = malloc(sizeof(float) * N * d), *y = malloc(sizeof(float) * N * d);
    double *yr = malloc(sizeof(double) * N * d);
    bool amb[MAXN];
    fill_f(x, N * d, 1.0, &r);
    /* the cases, then once more CSA sparse with every indexer score exactly 0 (head weights 0):
     * the selection is then decided by the tie rule alone (lower index wins) */
    for (int kk = 0; kk <= NCASES; kk++) {
        const int k = kk < NCASES ? kk : 2;
        trex_attn_w w;
        weights_make(&w, &cfg, CASES[k].layer, &r);
        if (kk == NCASES)
            memset(w.idx_weights_proj, 0,
                   sizeof(float) * (size_t)(cfg.index_n_heads * cfg.hidden_size));
        trex_ctx ctx = make_ctx(NULL, ar);
        trex_arena_reset(ar);
        trex_indexer_loss il;
        trex_err err = {0};
        trex_code rc = trex_attn_forward(&ctx, &cfg, CASES[k].layer, &sq.s, y, x, &w, CASES[k].sparse,
                                         NULL, &il, &err);
        CHECK(rc == TREX_OK, "%s forward: %s", CASES[k].name, err.msg);
        double kl;
        int64_t count;
        ref_forward(yr, &kl, &count, amb, &cfg, CASES[k].layer, &sq, x, &w, CASES[k].sparse);
        double ymax = 0.0, err_max = 0.0;
        int namb = 0;
        for (int64_t t = 0; t < N; t++) {
            namb += amb[t];
            for (int64_t i = 0; i < d; i++) {
                ymax = fmax(ymax, fabs(yr[t * d + i]));
                if (!amb[t])
                    err_max = fmax(err_max, fabs(y[t * d + i] - yr[t * d + i]));
            }
        }
        if (verbose)
            printf("forward %-11s max|y| %.3g  max err %.3g  kl %.9g vs %.9g  count %lld  ambiguous %d\n",
                   CASES[k].name, ymax, err_max, il.kl_sum, kl, (long long)il.count, namb);
        CHECK(ymax > 0.1 && err_max <= 2e-5 * ymax, "%s: forward differs from the double reference "
              "by %.3g (max |y| %.3g)", CASES[k].name, err_max, ymax);
        CHECK(namb <= 2, "%s: too many near ties at the top-k cut (%d)", CASES[k].name, namb);
        CHECK(il.count == count, "%s: indexer loss count %lld vs %lld", CASES[k].name,
              (long long)il.count, (long long)count);
        if (namb == 0)
            CHECK(fabs(il.kl_sum - kl) <= 1e-4 * (1.0 + fabs(kl)), "%s: kl_sum %.9g vs reference "
                  "%.9g", CASES[k].name, il.kl_sum, kl);
        if (CASES[k].layer == 1 && kk < NCASES)
            CHECK(count > 0 && kl > 0.0, "%s: the indexer loss is exercised", CASES[k].name);
        weights_free(&w, &cfg, CASES[k].layer);
    }
    free(x);
    free(y);
    free(yr);
}

/* ---- 4. whole-layer gradients against central differences (fp32) ------------------------------ */

typedef struct fixture {
    trex_config cfg;
    int layer;
    bool sparse;
    tseq sq;
    int64_t N, d;
    float *x, *R, *y;
    trex_attn_w w;
} fixture;

/* sum_i y_i R_i (double); *kl receives kl_sum. */
static double fx_loss(fixture *f, trex_ctx *ctx, double *kl)
{
    trex_arena_reset(ctx->arena);
    trex_indexer_loss il;
    trex_err err = {0};
    trex_code rc = trex_attn_forward(ctx, &f->cfg, f->layer, &f->sq.s, f->y, f->x, &f->w, f->sparse,
                                     NULL, &il, &err);
    TREX_ASSERT(rc == TREX_OK);
    double L = 0.0;
    for (int64_t i = 0; i < f->N * f->d; i++)
        L += (double)f->y[i] * f->R[i];
    if (kl)
        *kl = il.kl_sum;
    return L;
}

/* Runs forward + backward; gradients into g (zeroed first) and dx. Returns the forward's count. */
static int64_t fx_grad(fixture *f, trex_ctx *ctx, trex_attn_w *g, float *dx, const float *dy,
                       double il_scale)
{
    trex_arena_reset(ctx->arena);
    weights_zero(g, &f->cfg, f->layer);
    trex_attn_cache *cache = NULL;
    trex_indexer_loss il;
    trex_err err = {0};
    trex_code rc = trex_attn_forward(ctx, &f->cfg, f->layer, &f->sq.s, f->y, f->x, &f->w, f->sparse,
                                     &cache, &il, &err);
    TREX_ASSERT(rc == TREX_OK && cache);
    trex_attn_backward(ctx, &f->cfg, f->layer, &f->sq.s, dx, dy, f->x, &f->w, g, cache, il_scale);
    return il.count;
}

static void fx_init(fixture *f, const trex_config *cfg, int layer, bool sparse, int64_t B, int64_t T,
                    const int64_t *lens, int64_t nseg, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    f->cfg = *cfg;
    f->layer = layer;
    f->sparse = sparse;
    make_seq(&f->sq, B, T, lens, nseg);
    f->N = B * T;
    f->d = cfg->hidden_size;
    rng r = {seed};
    f->x = malloc(sizeof(float) * f->N * f->d);
    f->R = malloc(sizeof(float) * f->N * f->d);
    f->y = malloc(sizeof(float) * f->N * f->d);
    fill_f(f->x, f->N * f->d, 1.0, &r);
    fill_f(f->R, f->N * f->d, 1.0, &r);
    weights_make(&f->w, cfg, layer, &r);
}

static void fx_free(fixture *f)
{
    weights_free(&f->w, &f->cfg, f->layer);
    free(f->x);
    free(f->R);
    free(f->y);
}

/* Directional check of one tensor p[n] with analytic gradient gp: for random unit-RMS directions U,
 * (L(p + hU) - L(p - hU)) / 2h against sum gp U. kl selects the objective (kl_sum or sum y R).
 * Two step sizes are tried and the better kept: a top-k flip or a ReLU kink of the indexer inside
 * the wider stencil must not fail the check, and the narrower one alone is too noisy in fp32.
 * Returns the worst error relative to max(|fd|, |an|, 1e-3 |gp| sqrt(n)). */
static double fd_tensor(fixture *f, trex_ctx *ctx, float *p, const float *gp, int64_t n, bool kl,
                        int ndir, rng *r)
{
    float *save = malloc(sizeof(float) * n), *U = malloc(sizeof(float) * n);
    memcpy(save, p, sizeof(float) * n);
    double gn = 0.0;
    for (int64_t i = 0; i < n; i++)
        gn += (double)gp[i] * gp[i];
    gn = sqrt(gn);
    double worst = 0.0;
    const double hs[2] = {4e-3, 2e-3};
    for (int k = 0; k < ndir; k++) {
        fill_f(U, n, 1.0, r);
        double an = 0.0;
        for (int64_t i = 0; i < n; i++)
            an += (double)gp[i] * U[i];
        double best = INFINITY;
        for (int hi = 0; hi < 2; hi++) {
            const double h = hs[hi];
            double lp, lm, kp, km;
            for (int64_t i = 0; i < n; i++)
                p[i] = save[i] + (float)h * U[i];
            lp = fx_loss(f, ctx, &kp);
            for (int64_t i = 0; i < n; i++)
                p[i] = save[i] - (float)h * U[i];
            lm = fx_loss(f, ctx, &km);
            memcpy(p, save, sizeof(float) * n);
            double fd = kl ? (kp - km) / (2 * h) : (lp - lm) / (2 * h);
            double den = fmax(fmax(fabs(fd), fabs(an)), 1e-3 * gn * sqrt((double)n) + 1e-6);
            double e = fabs(fd - an) / den;
            if (verbose > 1)
                printf("      dir %d h %.0e: an %.6g fd %.6g rel %.3g\n", k, h, an, fd, e);
            best = fmin(best, e);
        }
        worst = fmax(worst, best);
    }
    free(save);
    free(U);
    return worst;
}

static bool all_zero(const float *a, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (a[i] != 0.0f)
            return false;
    return true;
}

static void test_gradients(trex_arena *ar)
{
    trex_config cfg = small_cfg();
    const int64_t lens[] = {13, 7};
    for (int k = 0; k < NCASES; k++) {
        fixture f;
        fx_init(&f, &cfg, CASES[k].layer, CASES[k].sparse, 1, 20, lens, 2, 100 + (uint64_t)k);
        trex_ctx ctx = make_ctx(NULL, ar);
        trex_attn_w g;
        weights_make(&g, &cfg, f.layer, NULL);
        float *dx = malloc(sizeof(float) * f.N * f.d), *zero = calloc((size_t)(f.N * f.d), sizeof(float));
        wdesc L[32];
        int nt = weight_list(L, &cfg, f.layer);
        rng r = {200 + (uint64_t)k};
        const double tol = 2e-2;
        /* (a) the LM path: L = sum y R, il_scale 0; the indexer must get nothing */
        fx_grad(&f, &ctx, &g, dx, f.R, 0.0);
        for (int i = 0; i < nt; i++) {
            float *p = *wfield(&f.w, &L[i]), *gp = *wfield(&g, &L[i]);
            if (L[i].indexer) {
                CHECK(all_zero(gp, L[i].n), "%s: %s has a gradient from the LM path", CASES[k].name,
                      L[i].name);
                continue;
            }
            double e = fd_tensor(&f, &ctx, p, gp, L[i].n, false, 3, &r);
            if (verbose)
                printf("grad %-11s %-17s rel err %.3g\n", CASES[k].name, L[i].name, e);
            CHECK(e <= tol, "%s: d/d%s off by %.3g (relative)", CASES[k].name, L[i].name, e);
            fx_grad(&f, &ctx, &g, dx, f.R, 0.0); /* fd_tensor used the arena */
        }
        double e = fd_tensor(&f, &ctx, f.x, dx, f.N * f.d, false, 3, &r);
        if (verbose)
            printf("grad %-11s %-17s rel err %.3g\n", CASES[k].name, "x", e);
        CHECK(e <= tol, "%s: dL/dx off by %.3g (relative)", CASES[k].name, e);
        /* (b) the indexer KL path: dy = 0, il_scale 1; only the indexer learns */
        if (cfg.compress_ratios[f.layer] == 4) {
            int64_t count = fx_grad(&f, &ctx, &g, dx, zero, 1.0);
            CHECK(count > 0, "%s: no query sees a compressed entry", CASES[k].name);
            CHECK(all_zero(dx, f.N * f.d), "%s: the indexer loss reaches dx", CASES[k].name);
            for (int i = 0; i < nt; i++) {
                float *gp = *wfield(&g, &L[i]);
                if (!L[i].indexer) {
                    CHECK(all_zero(gp, L[i].n), "%s: %s has a gradient from the indexer loss",
                          CASES[k].name, L[i].name);
                    continue;
                }
                CHECK(!all_zero(gp, L[i].n), "%s: %s gets no indexer-loss gradient", CASES[k].name,
                      L[i].name);
            }
            for (int i = 0; i < nt; i++) {
                if (!L[i].indexer)
                    continue;
                fx_grad(&f, &ctx, &g, dx, zero, 1.0);
                float *p = *wfield(&f.w, &L[i]), *gp = *wfield(&g, &L[i]);
                e = fd_tensor(&f, &ctx, p, gp, L[i].n, true, 3, &r);
                if (verbose)
                    printf("kl   %-11s %-17s rel err %.3g\n", CASES[k].name, L[i].name, e);
                CHECK(e <= tol, "%s: dKL/d%s off by %.3g (relative)", CASES[k].name, L[i].name, e);
            }
        }
        weights_free(&g, &cfg, f.layer);
        free(dx);
        free(zero);
        fx_free(&f);
    }
}

/* ---- 5. visibility ---------------------------------------------------------------------------- */

/* With a window of one token, y_t depends on another token u only through compressed entries that
 * pool u and that t can see. Entry i of a document is visible to position p iff i < floor((p+1)/m). */
static void test_visibility(trex_arena *ar)
{
    trex_config cfg = small_cfg();
    cfg.sliding_window = 1;
    const int64_t lens[] = {14, 6}, T = 20, d = cfg.hidden_size;
    const int layers[] = {1, 2};
    for (int li = 0; li < 2; li++) {
        const int layer = layers[li];
        const int64_t m = cfg.compress_ratios[layer];
        fixture f;
        fx_init(&f, &cfg, layer, false, 1, T, lens, 2, 300 + (uint64_t)li);
        trex_ctx ctx = make_ctx(NULL, ar);
        float *y0 = malloc(sizeof(float) * T * d);
        fx_loss(&f, &ctx, NULL);
        memcpy(y0, f.y, sizeof(float) * T * d);
        int bad = 0;
        for (int64_t u = 0; u < T; u++) {
            float keep[64];
            memcpy(keep, f.x + u * d, sizeof(float) * d);
            for (int64_t i = 0; i < d; i++)
                f.x[u * d + i] += 0.5f;
            fx_loss(&f, &ctx, NULL);
            memcpy(f.x + u * d, keep, sizeof(float) * d);
            const int64_t su = u < lens[0] ? 0 : 1, s0 = su ? lens[0] : 0, Ls = lens[su];
            const int64_t pu = u - s0, nb = Ls / m, b = pu / m; /* u pools into entry b (and b+1) */
            for (int64_t t = 0; t < T; t++) {
                const int64_t st = t < lens[0] ? 0 : 1, pt = t - (st ? lens[0] : 0);
                bool changed = memcmp(f.y + t * d, y0 + t * d, sizeof(float) * d) != 0;
                bool expect = t == u || (st == su && b < nb && b < (pt + 1) / m);
                if (changed != expect) {
                    bad++;
                    if (verbose)
                        printf("visibility m=%lld: x[%lld] -> y[%lld] changed %d expected %d\n",
                               (long long)m, (long long)u, (long long)t, changed, expect);
                }
            }
        }
        CHECK(bad == 0, "ratio %lld: %d (token, query) pairs break i < floor((p+1)/m)", (long long)m,
              bad);
        free(y0);
        fx_free(&f);
    }
}

/* ---- 6. documents; sparse with k >= visible -------------------------------------------------- */

/* A case's inputs, drawn from r in this order: x and dy (n floats each, unit-scale normals; the
 * caller frees them) and the layer's weights. */
static void case_inputs(const trex_config *cfg, int layer, int64_t n, rng *r, float **x, float **dy,
                        trex_attn_w *w)
{
    *x = malloc(sizeof(float) * (size_t)n);
    *dy = malloc(sizeof(float) * (size_t)n);
    TREX_ASSERT(*x && *dy);
    fill_f(*x, n, 1.0, r);
    fill_f(*dy, n, 1.0, r);
    weights_make(w, cfg, layer, r);
}

typedef struct run_out {
    float *y, *dx;
    trex_attn_w g;
    double kl;
    int64_t count;
} run_out;

static trex_dtype run_dtype = TREX_F32; /* precision of run_full */

static void run_full(run_out *o, const trex_config *cfg, int layer, bool sparse, const tseq *sq,
                     const float *x, const float *dy, const trex_attn_w *w, trex_pool *pool,
                     trex_arena *ar, double il_scale)
{
    const int64_t n = sq->s.B * sq->s.T * cfg->hidden_size;
    o->y = malloc(sizeof(float) * n);
    o->dx = malloc(sizeof(float) * n);
    weights_make(&o->g, cfg, layer, NULL);
    trex_ctx ctx = make_ctx(pool, ar);
    ctx.compute = run_dtype;
    trex_arena_reset(ar);
    trex_attn_cache *cache = NULL;
    trex_indexer_loss il;
    trex_err err = {0};
    trex_code rc = trex_attn_forward(&ctx, cfg, layer, &sq->s, o->y, x, w, sparse, &cache, &il, &err);
    TREX_ASSERT(rc == TREX_OK);
    trex_attn_backward(&ctx, cfg, layer, &sq->s, o->dx, dy, x, w, &o->g, cache, il_scale);
    o->kl = il.kl_sum;
    o->count = il.count;
}

static void run_free(run_out *o, const trex_config *cfg, int layer)
{
    free(o->y);
    free(o->dx);
    weights_free(&o->g, cfg, layer);
}

/* max |a - b| over the weight gradients, relative to max |b| */
static double grads_diff(const trex_attn_w *a, const trex_attn_w *b, const trex_config *cfg,
                         int layer, bool *bitwise)
{
    wdesc L[32];
    int n = weight_list(L, cfg, layer);
    double md = 0.0, mx = 0.0;
    *bitwise = true;
    for (int i = 0; i < n; i++) {
        const float *pa = *wfield((trex_attn_w *)a, &L[i]), *pb = *wfield((trex_attn_w *)b, &L[i]);
        if (memcmp(pa, pb, sizeof(float) * (size_t)L[i].n) != 0)
            *bitwise = false;
        for (int64_t k = 0; k < L[i].n; k++) {
            md = fmax(md, fabs((double)pa[k] - pb[k]));
            mx = fmax(mx, fabs((double)pb[k]));
        }
    }
    return md / (mx > 0 ? mx : 1.0);
}

static void test_documents(trex_arena *ar)
{
    trex_config cfg = small_cfg();
    /* B = 2, T = 14: row 0 = documents of 9 and 5 tokens, row 1 = one of 14 */
    const int64_t lens[] = {9, 5, 14}, T = 14, d = cfg.hidden_size;
    for (int k = 0; k < NCASES; k++) {
        const int layer = CASES[k].layer;
        rng r = {400 + (uint64_t)k};
        tseq packed;
        make_seq(&packed, 2, T, lens, 3);
        float *x = malloc(sizeof(float) * 2 * T * d), *dy = malloc(sizeof(float) * 2 * T * d);
        fill_f(x, 2 * T * d, 1.0, &r);
        fill_f(dy, 2 * T * d, 1.0, &r);
        trex_attn_w w;
        weights_make(&w, &cfg, layer, &r);
        run_out P;
        run_full(&P, &cfg, layer, CASES[k].sparse, &packed, x, dy, &w, NULL, ar, 0.25);
        trex_attn_w gsum;
        weights_make(&gsum, &cfg, layer, NULL);
        wdesc L[32];
        int nt = weight_list(L, &cfg, layer);
        bool y_same = true, dx_same = true;
        double kl = 0.0;
        int64_t count = 0, at = 0;
        for (int s = 0; s < 3; s++) {
            tseq one;
            const int64_t l1[] = {lens[s]};
            make_seq(&one, 1, lens[s], l1, 1);
            run_out A;
            run_full(&A, &cfg, layer, CASES[k].sparse, &one, x + at * d, dy + at * d, &w, NULL, ar,
                     0.25);
            y_same &= memcmp(A.y, P.y + at * d, sizeof(float) * (size_t)(lens[s] * d)) == 0;
            dx_same &= memcmp(A.dx, P.dx + at * d, sizeof(float) * (size_t)(lens[s] * d)) == 0;
            kl += A.kl;
            count += A.count;
            for (int i = 0; i < nt; i++) {
                float *gs = *wfield(&gsum, &L[i]), *ga = *wfield(&A.g, &L[i]);
                for (int64_t j = 0; j < L[i].n; j++)
                    gs[j] += ga[j];
            }
            run_free(&A, &cfg, layer);
            at += lens[s];
        }
        bool bw;
        double gd = grads_diff(&P.g, &gsum, &cfg, layer, &bw);
        CHECK(y_same, "%s: a packed batch's output differs from its documents run alone",
              CASES[k].name);
        CHECK(dx_same, "%s: a packed batch's dx differs from its documents run alone", CASES[k].name);
        CHECK(gd < 1e-5, "%s: packed weight gradients differ from the sum over documents (%.3g)",
              CASES[k].name, gd);
        CHECK(count == P.count && fabs(kl - P.kl) <= 1e-12 * (1 + fabs(kl)),
              "%s: indexer loss packed (%.12g, %lld) vs alone (%.12g, %lld)", CASES[k].name, P.kl,
              (long long)P.count, kl, (long long)count);
        run_free(&P, &cfg, layer);
        weights_free(&gsum, &cfg, layer);
        weights_free(&w, &cfg, layer);
        free(x);
        free(dy);
    }
}

static void test_sparse_is_dense(trex_arena *ar)
{
    trex_config cfg = small_cfg();
    cfg.index_topk = 1000; /* >= every visible count */
    const int64_t lens[] = {13, 7}, N = 20, d = cfg.hidden_size;
    rng r = {500};
    tseq sq;
    make_seq(&sq, 1, N, lens, 2);
    float *x, *dy;
    trex_attn_w w;
    case_inputs(&cfg, 1, N * d, &r, &x, &dy, &w);
    run_out S, D;
    run_full(&S, &cfg, 1, true, &sq, x, dy, &w, NULL, ar, 0.5);
    run_full(&D, &cfg, 1, false, &sq, x, dy, &w, NULL, ar, 0.5);
    bool bw;
    grads_diff(&S.g, &D.g, &cfg, 1, &bw);
    CHECK(memcmp(S.y, D.y, sizeof(float) * N * d) == 0, "sparse with top-k >= visible: y != dense");
    CHECK(memcmp(S.dx, D.dx, sizeof(float) * N * d) == 0, "sparse with top-k >= visible: dx != dense");
    CHECK(bw, "sparse with top-k >= visible: weight gradients != dense");
    CHECK(S.kl == D.kl && S.count == D.count, "sparse with top-k >= visible: indexer loss != dense");
    run_free(&S, &cfg, 1);
    run_free(&D, &cfg, 1);
    weights_free(&w, &cfg, 1);
    free(x);
    free(dy);
}

/* The small config with a window of 6 and top-k 3, and a batch of two rows of WINDOW_T tokens (documents
 * of 30 and 20, then 50), for the tests of the pass's variants (kept core, weight panels). */
#define WINDOW_T 50
static trex_config window_cfg(tseq *sq)
{
    trex_config cfg = small_cfg();
    cfg.sliding_window = 6;
    cfg.index_topk = 3;
    const int64_t lens[] = {30, 20, 50};
    make_seq(sq, 2, WINDOW_T, lens, 3);
    return cfg;
}

/* A kept core (trex_attn_forward_core, recompute full-keep-core): the forward that makes it gives the
 * plain forward's y and indexer loss; a second forward that takes it, and the backward from that pass,
 * give the plain pass's bits; and the second forward really reads the core: on another input it still
 * gives the first input's y (the output projections of the kept o), where running the loop would not. */
static void test_kept_core(trex_arena *ar, trex_pool *pool)
{
    tseq sq;
    const trex_config cfg = window_cfg(&sq);
    const int64_t N = 2 * WINDOW_T, d = cfg.hidden_size;
    const char *md = run_dtype == TREX_BF16 ? "bf16" : "fp32";
    for (int k = 0; k < NCASES; k++) {
        const int layer = CASES[k].layer;
        rng r = {700 + (uint64_t)k};
        float *x = malloc(sizeof(float) * N * d), *x2 = malloc(sizeof(float) * N * d);
        float *dy = malloc(sizeof(float) * N * d), *y1 = malloc(sizeof(float) * N * d);
        float *y2 = malloc(sizeof(float) * N * d), *dx = malloc(sizeof(float) * N * d);
        fill_f(x, N * d, 1.0, &r);
        fill_f(x2, N * d, 1.0, &r);
        fill_f(dy, N * d, 1.0, &r);
        trex_attn_w w, g;
        weights_make(&w, &cfg, layer, &r);
        weights_make(&g, &cfg, layer, NULL);
        run_out A;
        run_full(&A, &cfg, layer, CASES[k].sparse, &sq, x, dy, &w, pool, ar, 0.1);

        trex_ctx ctx = make_ctx(pool, ar);
        ctx.compute = run_dtype;
        trex_arena_reset(ar);
        trex_err err = {0};
        trex_attn_core *core = trex_attn_core_reserve(&ctx, &cfg, layer, N, CASES[k].sparse, true, &err);
        CHECK(core && trex_attn_core_bytes(core) >= sizeof(float) * (size_t)(N * cfg.num_attention_heads),
              "%s %s: a core is reserved (%s)", md, CASES[k].name, core ? "" : err.msg);
        if (core) {
            trex_indexer_loss il1, il2;
            const trex_arena_mark mk = trex_arena_mark_get(ar);
            trex_code rc = trex_attn_forward_core(&ctx, &cfg, layer, &sq.s, y1, x, &w, CASES[k].sparse, NULL,
                                                  &il1, core, &err);
            CHECK(rc == TREX_OK && memcmp(y1, A.y, sizeof(float) * N * d) == 0 && il1.kl_sum == A.kl &&
                      il1.count == A.count,
                  "%s %s: the forward that keeps the core gives the plain forward's y and indexer loss", md,
                  CASES[k].name);
            trex_arena_rewind(ar, mk);
            trex_attn_cache *cache = NULL;
            rc = trex_attn_forward_core(&ctx, &cfg, layer, &sq.s, y2, x, &w, CASES[k].sparse, &cache, &il2,
                                        core, &err);
            TREX_ASSERT(rc == TREX_OK);
            trex_attn_backward(&ctx, &cfg, layer, &sq.s, dx, dy, x, &w, &g, cache, 0.1);
            bool bw;
            grads_diff(&g, &A.g, &cfg, layer, &bw);
            CHECK(memcmp(y2, A.y, sizeof(float) * N * d) == 0 && memcmp(dx, A.dx, sizeof(float) * N * d) == 0 &&
                      bw && il2.kl_sum == A.kl && il2.count == A.count,
                  "%s %s: the pass that takes the kept core gives the plain pass's y, dx, gradients and "
                  "indexer loss", md, CASES[k].name);
            trex_arena_rewind(ar, mk);
            rc = trex_attn_forward_core(&ctx, &cfg, layer, &sq.s, y2, x2, &w, CASES[k].sparse, NULL, &il2,
                                        core, &err);
            CHECK(rc == TREX_OK && memcmp(y2, A.y, sizeof(float) * N * d) == 0,
                  "%s %s: a forward given the kept core reads it instead of running the core loop", md,
                  CASES[k].name);
        }
        run_free(&A, &cfg, layer);
        weights_free(&w, &cfg, layer);
        weights_free(&g, &cfg, layer);
        free(x);
        free(x2);
        free(dy);
        free(y1);
        free(y2);
        free(dx);
    }
}

/* ---- 6. the projections from bf16 panels -------------------------------------------------------- */

/* bf16 training keeps the projections' weights as packed bf16 panels (trex_attn_w.wc; docs/params.md
 * "bf16 compute copies"): the pass that reads them gives the bits of the one that packs the fp32 weights
 * per call, and it does read them (a copy left holding other values than the weights shows in y). */
static void test_weight_panels(trex_arena *ar, trex_pool *pool)
{
    tseq sq;
    const trex_config cfg = window_cfg(&sq);
    const int64_t N = 2 * WINDOW_T, d = cfg.hidden_size;
    const size_t proj[] = {offsetof(trex_attn_w, wq_a), offsetof(trex_attn_w, wq_b), offsetof(trex_attn_w, wkv),
                           offsetof(trex_attn_w, wo_b), offsetof(trex_attn_w, idx_wq_b),
                           offsetof(trex_attn_w, idx_weights_proj)};
    for (int k = 0; k < NCASES; k++) {
        const int layer = CASES[k].layer;
        rng r = {900 + (uint64_t)k};
        float *x, *dy;
        trex_attn_w w;
        case_inputs(&cfg, layer, N * d, &r, &x, &dy, &w);
        wdesc L[32];
        const int nl = weight_list(L, &cfg, layer);
        trex_wcopy_tensor list[8];
        int64_t n = 0;
        for (int i = 0; i < nl; i++)
            for (size_t q = 0; q < sizeof proj / sizeof proj[0]; q++)
                if (L[i].off == proj[q])
                    list[n++] = (trex_wcopy_tensor){.src = *wfield(&w, &L[i]), .rows = L[i].n / L[i].fanin,
                                                    .cols = L[i].fanin};
        run_out A, B, C;
        run_full(&A, &cfg, layer, CASES[k].sparse, &sq, x, dy, &w, pool, ar, 0.1);
        uint64_t version = 0;
        trex_mem mem = {0};
        trex_err err = {0};
        trex_wcopy *wc = NULL;
        CHECK(trex_wcopy_create(&wc, list, n, TREX_WCOPY_PANELS, &version, &mem, &err) == TREX_OK,
              "%s: panels of %lld projections: %s", CASES[k].name, (long long)n, err.msg);
        if (!wc) {
            run_free(&A, &cfg, layer);
            weights_free(&w, &cfg, layer);
            free(x);
            free(dy);
            continue;
        }
        trex_wcopy_refresh(pool, wc);
        w.wc = wc;
        run_full(&B, &cfg, layer, CASES[k].sparse, &sq, x, dy, &w, pool, ar, 0.1);
        bool bw;
        grads_diff(&B.g, &A.g, &cfg, layer, &bw);
        CHECK(memcmp(B.y, A.y, sizeof(float) * N * d) == 0 && memcmp(B.dx, A.dx, sizeof(float) * N * d) == 0 &&
                  bw && B.kl == A.kl && B.count == A.count,
              "%s: from the panels, the bits of the pass that packs the weights (y, dx, gradients, indexer "
              "loss)", CASES[k].name);
        /* wo_b's fp32 values change (no norm follows it), its copy is not rewritten: the forward reads the
         * copy */
        for (int64_t q = 0; q < d * cfg.o_groups * cfg.o_lora_rank; q++)
            w.wo_b[q] += 0.01f;
        run_full(&C, &cfg, layer, CASES[k].sparse, &sq, x, dy, &w, pool, ar, 0.1);
        CHECK(memcmp(C.y, A.y, sizeof(float) * N * d) == 0, "%s: the products read the panels, not the weights",
              CASES[k].name);
        run_free(&C, &cfg, layer);
        w.wc = NULL;
        run_full(&C, &cfg, layer, CASES[k].sparse, &sq, x, dy, &w, pool, ar, 0.1);
        CHECK(memcmp(C.y, A.y, sizeof(float) * N * d) != 0, "%s: without them, the changed weights show in y",
              CASES[k].name);
        run_free(&A, &cfg, layer);
        run_free(&B, &cfg, layer);
        run_free(&C, &cfg, layer);
        trex_wcopy_destroy(wc);
        weights_free(&w, &cfg, layer);
        free(x);
        free(dy);
    }
}

/* ---- 7. threads ------------------------------------------------------------------------------- */

static void test_threads(trex_arena *ar)
{
    trex_pool *pool = trex_pool_create(2);
    CHECK(pool != NULL, "cannot start a 2-thread pool");
    if (!pool)
        return;
    trex_config cfg = small_cfg();
    cfg.sliding_window = 6;
    cfg.index_topk = 3;
    if (run_dtype == TREX_BF16) {
        /* wider heads: sums long enough for a grouping-dependent order to show in the bits */
        cfg.num_attention_heads = 4;
        cfg.head_dim = 128;
        cfg.index_head_dim = 64;
    }
    /* 13 key-side tiles of 16: the 2-thread split (token 112) falls inside a document */
    const int64_t lens[] = {70, 30, 40, 60}, T = 100, N = 200, d = cfg.hidden_size;
    tseq sq;
    make_seq(&sq, 2, T, lens, 4);
    const char *md = run_dtype == TREX_BF16 ? "bf16" : "fp32";
    for (int k = 0; k < NCASES; k++) {
        const int layer = CASES[k].layer;
        rng r = {600 + (uint64_t)k};
        float *x, *dy;
        trex_attn_w w;
        case_inputs(&cfg, layer, N * d, &r, &x, &dy, &w);
        run_out A, B;
        run_full(&A, &cfg, layer, CASES[k].sparse, &sq, x, dy, &w, NULL, ar, 0.1);
        run_full(&B, &cfg, layer, CASES[k].sparse, &sq, x, dy, &w, pool, ar, 0.1);
        bool bw;
        grads_diff(&B.g, &A.g, &cfg, layer, &bw);
        CHECK(memcmp(A.y, B.y, sizeof(float) * N * d) == 0, "%s %s: y differs with 2 threads",
              md, CASES[k].name);
        CHECK(memcmp(A.dx, B.dx, sizeof(float) * N * d) == 0, "%s %s: dx differs with 2 threads",
              md, CASES[k].name);
        CHECK(bw, "%s %s: weight gradients differ with 2 threads", md, CASES[k].name);
        CHECK(A.kl == B.kl && A.count == B.count, "%s %s: indexer loss differs with 2 threads",
              md, CASES[k].name);
        run_free(&A, &cfg, layer);
        run_free(&B, &cfg, layer);
        weights_free(&w, &cfg, layer);
        free(x);
        free(dy);
    }
    trex_pool_destroy(pool);
}

/* The fused axpy entry (the indexer KL gradients) gives am_axpy_f's bits at every level. */
static void test_axpy_levels(void)
{
    const trex_isa caps[] = {TREX_ISA_REF, TREX_ISA_AVX2, TREX_ISA_AVX512F, TREX_ISA_AVX512, TREX_ISA_AMX};
    float x[133], y0[133], y[133], ye[133];
    rng r = {901};
    fill_f(x, 133, 1.0, &r);
    fill_f(y0, 133, 1.0, &r);
    for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
        const trex_fused_table *t = trex_fused_for(caps[k]);
        for (int64_t n = 0; n <= 133; n += (n < 40 ? 1 : 31)) {
            memcpy(y, y0, sizeof y);
            memcpy(ye, y0, sizeof ye);
            t->axpy(y, -0.37f, x, n);
            for (int64_t i = 0; i < n; i++) {
                const float ax = -0.37f * x[i];
                ye[i] = ye[i] + ax;
            }
            CHECK(memcmp(y, ye, sizeof y) == 0, "fused axpy at level %s, n = %lld: not y + a x "
                  "element by element (or wrote past n)", t->name, (long long)n);
        }
    }
}

/* The fused axpy_rows entry gives, at every level, the bits of one axpy per active term (terms in
 * order per row), on awkward shapes, with both coefficient layouts the model uses (row-major: the
 * query side's diq; column-major: the key side's dK^I), and leaves the rows' other columns alone. */
static void test_axpy_rows_levels(void)
{
    const trex_isa caps[] = {TREX_ISA_REF, TREX_ISA_AVX2, TREX_ISA_AVX512F, TREX_ISA_AVX512, TREX_ISA_AMX};
    const int64_t Rs[] = {1, 3, 4, 5, 16, 17}, Js[] = {0, 1, 5, 33}, cs[] = {1, 16, 63, 64, 128, 133};
    enum { RM = 17, JM = 33, CM = 133, LD = CM + 3 };
    static float X[JM][CM], Y0[RM * LD], Y[RM * LD], Ye[RM * LD], A[RM * JM];
    static unsigned char on[RM * JM];
    const float *xp[JM];
    rng r = {907};
    for (int j = 0; j < JM; j++) {
        fill_f(X[j], CM, 1.0, &r);
        xp[j] = X[j];
    }
    fill_f(Y0, RM * LD, 1.0, &r);
    fill_f(A, RM * JM, 1.0, &r);
    for (int k = 0; k < RM * JM; k++)
        on[k] = A[k] > -0.3f; /* about two thirds on, in no pattern */
    int bad = 0;
    for (size_t l = 0; l < sizeof caps / sizeof caps[0]; l++) {
        const trex_fused_table *t = trex_fused_for(caps[l]);
        for (size_t ir = 0; ir < sizeof Rs / sizeof Rs[0]; ir++)
            for (size_t ij = 0; ij < sizeof Js / sizeof Js[0]; ij++)
                for (size_t ic = 0; ic < sizeof cs / sizeof cs[0]; ic++)
                    for (int cm = 0; cm < 2; cm++) {
                        const int64_t R = Rs[ir], J = Js[ij], c = cs[ic];
                        const int64_t sr = cm ? 1 : J, sj = cm ? R : 1;
                        memcpy(Y, Y0, sizeof Y);
                        memcpy(Ye, Y0, sizeof Ye);
                        t->axpy_rows(Y, LD, R, A, on, sr, sj, xp, J, c);
                        for (int64_t rr = 0; rr < R; rr++)
                            for (int64_t j = 0; j < J; j++)
                                if (on[rr * sr + j * sj])
                                    for (int64_t i = 0; i < c; i++) {
                                        const float ax = A[rr * sr + j * sj] * X[j][i];
                                        Ye[rr * LD + i] = Ye[rr * LD + i] + ax;
                                    }
                        if (memcmp(Y, Ye, sizeof Y) != 0 && bad++ < 5)
                            CHECK(0, "fused axpy_rows at level %s, R %lld J %lld c %lld %s: not one "
                                  "axpy per active term", t->name, (long long)R, (long long)J,
                                  (long long)c, cm ? "column-major" : "row-major");
                    }
    }
    CHECK(bad == 0, "fused axpy_rows: %d cases differ", bad);
}

/* The fused KL gradient entries kl_qgrad and kl_kgrad give, at every level, the bits of the loops
 * they replaced (kernels/fused.h: one axpy per active head and entry, a head active iff its score
 * a > 0, so not for 0, -0 or NaN; dhw += (a > 0 ? dI a : +0)), on awkward shapes (n 0 .. 40, nI 1 ..
 * 33 across the 16-head groups, cI 1 .. 256 across the 128-float chunks and 16-float tails), the
 * key rows and the dK rows scattered, and leave the other floats alone. */
static void test_kl_grad_levels(void)
{
    const trex_isa caps[] = {TREX_ISA_REF, TREX_ISA_AVX2, TREX_ISA_AVX512F, TREX_ISA_AVX512, TREX_ISA_AMX};
    const int64_t ns[] = {0, 1, 2, 5, 17, 40}, nIs[] = {1, 3, 16, 17, 33}, cs[] = {1, 15, 16, 100,
                                                                                   128, 133, 256};
    enum { NM = 40, IM = 33, CM = 256 };
    static float K[NM][CM], X[IM * CM], ia[IM * NM], dI[NM], hw[IM];
    static float Q0[IM * CM + 7], Q[IM * CM + 7], Qe[IM * CM + 7], W0[IM + 3], Wd[IM + 3], We[IM + 3];
    static float G0[NM][CM + 5], G[NM][CM + 5], Ge[NM][CM + 5];
    const float *kp[NM];
    float *gp[NM];
    rng r = {911};
    for (int i = 0; i < NM; i++) {
        fill_f(K[i], CM, 1.0, &r);
        kp[i] = K[(i * 7) % NM]; /* scattered */
    }
    fill_f(X, IM * CM, 1.0, &r);
    fill_f(dI, NM, 1.0, &r);
    fill_f(hw, IM, 1.0, &r);
    fill_f(Q0, IM * CM + 7, 1.0, &r);
    fill_f(W0, IM + 3, 1.0, &r);
    fill_f(G0[0], NM * (CM + 5), 1.0, &r);
    int bad = 0, cases = 0;
    for (size_t l = 0; l < sizeof caps / sizeof caps[0]; l++) {
        const trex_fused_table *t = trex_fused_for(caps[l]);
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++)
            for (size_t ih = 0; ih < sizeof nIs / sizeof nIs[0]; ih++)
                for (size_t ic = 0; ic < sizeof cs / sizeof cs[0]; ic++) {
                    const int64_t n = ns[in], nI = nIs[ih], cI = cs[ic];
                    fill_f(ia, nI * n, 1.0, &r);
                    for (int64_t k = 0; k < nI * n; k++) /* zeros, -0 and NaN are not active */
                        ia[k] = k % 7 == 3 ? 0.0f : k % 11 == 5 ? -0.0f : k % 13 == 8 ? NAN : ia[k];
                    for (int64_t i = 0; i < n; i++)
                        gp[i] = G[(i * 3 + 1) % NM];
                    memcpy(Q, Q0, sizeof Q);
                    memcpy(Qe, Q0, sizeof Qe);
                    memcpy(Wd, W0, sizeof Wd);
                    memcpy(We, W0, sizeof We);
                    memcpy(G, G0, sizeof G);
                    memcpy(Ge, G0, sizeof Ge);
                    t->kl_qgrad(Q, Wd, ia, dI, hw, kp, n, nI, cI);
                    t->kl_kgrad(gp, ia, dI, hw, X, n, nI, cI);
                    for (int64_t i = 0; i < n; i++)
                        for (int64_t h = 0; h < nI; h++) {
                            const float a = ia[h * n + i];
                            const float dw = a > 0.0f ? dI[i] * a : 0.0f;
                            We[h] = We[h] + dw;
                            if (!(a > 0.0f))
                                continue;
                            const float cq = dI[i] * hw[h];
                            float *ge = Ge[(i * 3 + 1) % NM];
                            for (int64_t f = 0; f < cI; f++) {
                                const float tq = cq * kp[i][f], tk = cq * X[h * cI + f];
                                Qe[h * cI + f] = Qe[h * cI + f] + tq;
                                ge[f] = ge[f] + tk;
                            }
                        }
                    cases++;
                    if ((memcmp(Q, Qe, sizeof Q) || memcmp(Wd, We, sizeof Wd) ||
                         memcmp(G, Ge, sizeof G)) &&
                        bad++ < 5)
                        CHECK(0, "fused kl_qgrad / kl_kgrad at level %s, n %lld nI %lld cI %lld: "
                              "not the reference loops' bits", t->name, (long long)n,
                              (long long)nI, (long long)cI);
                }
    }
    CHECK(bad == 0, "fused kl_qgrad / kl_kgrad: %d of %d cases differ", bad, cases);
}

/* The fused rope entry gives trex_rope_rotate's bits (both directions) at every level, on nv vectors
 * at a stride ld, for every half 1 .. 37 (the masked tails), with signed zeros among the values, and
 * leaves the floats around the rotated ones alone. */
static void test_rope_levels(void)
{
    const trex_fused_table *lv[TREX_ISA_COUNT];
    const int nl = fused_levels(trex_fused_for(TREX_ISA_REF), lv);
    enum { HM = 37, NV = 5, LD = 2 * HM + 3, TOT = NV * LD + 8 };
    static float v0[TOT], v[TOT], ve[TOT], cs[HM], sn[HM];
    rng r = {911};
    fill_f(v0, TOT, 2.0, &r);
    fill_f(cs, HM, 1.0, &r);
    fill_f(sn, HM, 1.0, &r);
    v0[3] = -0.0f;
    v0[4] = 0.0f;
    sn[1] = -0.0f;
    int bad = 0;
    for (int l = 0; l < nl; l++)
        for (int64_t half = 1; half <= HM; half++)
            for (int64_t nv = 0; nv <= NV; nv += 2)
                for (int inv = 0; inv < 2; inv++) {
                    const int64_t off = 1 + half % 3; /* unaligned starts */
                    memcpy(v, v0, sizeof v);
                    memcpy(ve, v0, sizeof ve);
                    lv[l]->rope(v + off, nv, LD, cs, sn, half, inv);
                    for (int64_t k = 0; k < nv; k++)
                        trex_rope_rotate(ve + off + k * LD, cs, sn, half, inv != 0);
                    if (memcmp(v, ve, sizeof v) != 0 && bad++ < 5)
                        CHECK(0, "fused rope at level %s, half %lld nv %lld %s: not "
                              "trex_rope_rotate's bits", lv[l]->name, (long long)half,
                              (long long)nv, inv ? "inverse" : "forward");
                }
    CHECK(bad == 0, "fused rope: %d cases differ", bad);
}

/* The fused rms_head_bwd entry gives, at every level, the bits of the per-head RMS backward written
 * out here (the reference dot, then a multiply, a subtract and a multiply per element), for H 1-17
 * and c 1-133 (the masked tails), and writes nothing past its H c floats. */
static void test_rms_head_bwd_levels(void)
{
    const trex_fused_table *lv[TREX_ISA_COUNT];
    const trex_fused_table *ref = trex_fused_for(TREX_ISA_REF);
    const int nl = fused_levels(ref, lv);
    const int64_t Hs[] = {1, 2, 3, 16, 17}, cs[] = {1, 15, 16, 17, 64, 133};
    enum { TOT = 17 * 133 + 16 };
    static float g0[TOT], g[TOT], ge[TOT], q[TOT], rs[17];
    rng r = {913};
    fill_f(g0, TOT, 1.0, &r);
    fill_f(q, TOT, 1.0, &r);
    fill_f(rs, 17, 2.0, &r);
    int bad = 0;
    for (int l = 0; l < nl; l++)
        for (size_t ih = 0; ih < sizeof Hs / sizeof Hs[0]; ih++)
            for (size_t ic = 0; ic < sizeof cs / sizeof cs[0]; ic++) {
                const int64_t H = Hs[ih], c = cs[ic];
                memcpy(g, g0, sizeof g);
                memcpy(ge, g0, sizeof ge);
                lv[l]->rms_head_bwd(g, q, rs, H, c);
                for (int64_t h = 0; h < H; h++) {
                    float *gh = ge + h * c;
                    const float *qh = q + h * c;
                    const float m = ref->dot(gh, qh, c) / (float)c;
                    for (int64_t i = 0; i < c; i++) {
                        const float qm = qh[i] * m, d = gh[i] - qm;
                        gh[i] = rs[h] * d;
                    }
                }
                if (memcmp(g, ge, sizeof g) != 0 && bad++ < 5)
                    CHECK(0, "fused rms_head_bwd at level %s, H %lld c %lld: not the scalar bits",
                          lv[l]->name, (long long)H, (long long)c);
            }
    CHECK(bad == 0, "fused rms_head_bwd: %d cases differ", bad);
}

static void test_bad_config(trex_arena *ar)
{
    trex_config good = small_cfg(), cfg = good;
    cfg.o_groups = 3; /* 2 heads cannot form 3 groups */
    const int64_t lens[] = {4};
    tseq sq;
    make_seq(&sq, 1, 4, lens, 1);
    float x[4 * 32] = {0}, y[4 * 32];
    trex_attn_w w;
    weights_make(&w, &good, 0, NULL);
    trex_ctx ctx = make_ctx(NULL, ar);
    trex_arena_reset(ar);
    trex_err err = {0};
    trex_code rc = trex_attn_forward(&ctx, &cfg, 0, &sq.s, y, x, &w, false, NULL, NULL, &err);
    CHECK(rc == TREX_EINVAL && strstr(err.msg, "o_groups") != NULL,
          "a bad config is refused with a message naming the field (%d: %s)", (int)rc, err.msg);
    weights_free(&w, &good, 0);
}

/* ---- --bench: one layer of each kind at dsv4-bench's shapes ---------------------------------- */

#ifdef TREX_ATTN_PROF
void trex_attn_prof_reset(void);
void trex_attn_prof_dump(double div);
#endif

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_dbl(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return v[n / 2];
}

static uint64_t fnv(uint64_t h, const void *p, size_t bytes)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int bench(int64_t N, int reps, bool bf16, int threads)
{
    trex_config cfg = small_cfg(); /* dsv4-bench's attention (configs/dsv4-bench.json) */
    cfg.hidden_size = 1024;
    cfg.num_hidden_layers = 3;
    cfg.num_attention_heads = 16;
    cfg.head_dim = 512;
    cfg.qk_rope_head_dim = 64;
    cfg.q_lora_rank = 256;
    cfg.o_groups = 2;
    cfg.o_lora_rank = 256;
    cfg.sliding_window = 128;
    cfg.n_compress_ratios = 3;
    cfg.compress_ratios[0] = 0;
    cfg.compress_ratios[1] = 4;
    cfg.compress_ratios[2] = 128;
    cfg.index_n_heads = 16;
    cfg.index_head_dim = 128;
    cfg.index_topk = 128;
    trex_err err = {0};
    if (trex_kernels_init(&err) != TREX_OK) {
        fprintf(stderr, "test_attention: %s\n", err.msg);
        return 1;
    }
    const int64_t d = cfg.hidden_size;
    int32_t *tok = calloc((size_t)N, sizeof *tok), *pos = calloc((size_t)N, sizeof *pos);
    int64_t st = 0, ln = N;
    for (int64_t t = 0; t < N; t++)
        pos[t] = (int32_t)t;
    trex_seqinfo seq = {1, N, tok, pos, 1, &st, &ln};
    trex_pool *pool = threads > 1 ? trex_pool_create(threads) : NULL;
    trex_arena *ar = trex_arena_create(NULL, TREX_REGION_ACTS, (size_t)64 << 20);
    trex_ctx ctx = make_ctx(pool, ar);
    ctx.compute = bf16 ? TREX_BF16 : TREX_F32;
    ctx.ws = trex_gemm_ws_create();
    float *x = malloc(sizeof(float) * N * d), *dy = malloc(sizeof(float) * N * d);
    float *y = malloc(sizeof(float) * N * d), *dx = malloc(sizeof(float) * N * d);
    TREX_ASSERT(tok && pos && ar && ctx.ws && x && dy && y && dx);
    rng r = {77};
    fill_f(x, N * d, 1.0, &r);
    fill_f(dy, N * d, 1.0 / sqrt((double)N), &r);
    printf("attention layer, dsv4-bench shapes, N %lld, %s, %d thread(s), kernels %s; median of %d "
           "(after 1 warm-up)\n", (long long)N, bf16 ? "bf16" : "fp32", threads,
           trex_isa_name(trex_kernels_isa()), reps);
    static const char *const kind[3] = {"SWA (ratio 0)", "CSA (ratio 4, sparse indexer + KL)",
                                        "HCA (ratio 128)"};
    double tot[4] = {0};
    for (int layer = 0; layer < 3; layer++) {
        trex_attn_w w, g;
        weights_make(&w, &cfg, layer, &r);
        weights_make(&g, &cfg, layer, NULL);
        double fw[64], fc[64], bw[64], bc[64];
        for (int k = -1; k < reps; k++) {
#ifdef TREX_ATTN_PROF
            if (k == 0)
                trex_attn_prof_reset();
#endif
            trex_arena_reset(ar);
            trex_attn_cache *cache = NULL;
            trex_indexer_loss il;
            double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            trex_code rc = trex_attn_forward(&ctx, &cfg, layer, &seq, y, x, &w, true, &cache, &il,
                                             &err);
            double w1 = clock_s(CLOCK_MONOTONIC), c1 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            if (rc != TREX_OK) {
                fprintf(stderr, "test_attention: %s\n", err.msg);
                return 1;
            }
            const double il_scale = il.count > 0 ? 0.01 / (double)il.count : 0.0;
            trex_attn_backward(&ctx, &cfg, layer, &seq, dx, dy, x, &w, &g, cache, il_scale);
            double w2 = clock_s(CLOCK_MONOTONIC), c2 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            if (k >= 0) {
                fw[k] = w1 - w0, fc[k] = c1 - c0, bw[k] = w2 - w1, bc[k] = c2 - c1;
            }
        }
        /* a hash of y, dx and the weight gradients (all accumulated over the calls): a changed
         * implementation that must keep the bits keeps this line */
        uint64_t hs = fnv(0xcbf29ce484222325ull, y, sizeof(float) * (size_t)(N * d));
        hs = fnv(hs, dx, sizeof(float) * (size_t)(N * d));
        {
            wdesc L[32];
            const int nl = weight_list(L, &cfg, layer);
            for (int i = 0; i < nl; i++)
                hs = fnv(hs, *wfield(&g, &L[i]), sizeof(float) * (size_t)L[i].n);
        }
        const double mfw = median(fw, reps), mfc = median(fc, reps);
        const double mbw = median(bw, reps), mbc = median(bc, reps);
        tot[0] += mfw, tot[1] += mfc, tot[2] += mbw, tot[3] += mbc;
        printf("  %-36s forward %8.1f ms wall %8.1f ms cpu | backward %8.1f ms wall %8.1f ms cpu "
               "| arena %.0f MiB | hash %016llx\n", kind[layer], 1e3 * mfw, 1e3 * mfc, 1e3 * mbw,
               1e3 * mbc, (double)trex_arena_used(ar) / 1048576.0, (unsigned long long)hs);
#ifdef TREX_ATTN_PROF
        trex_attn_prof_dump((double)reps);
#endif
        weights_free(&w, &cfg, layer);
        weights_free(&g, &cfg, layer);
    }
    printf("  %-36s forward %8.1f ms wall %8.1f ms cpu | backward %8.1f ms wall %8.1f ms cpu\n",
           "sum of the three", 1e3 * tot[0], 1e3 * tot[1], 1e3 * tot[2], 1e3 * tot[3]);
    trex_gemm_ws_destroy(ctx.ws);
    trex_arena_destroy(ar);
    if (pool)
        trex_pool_destroy(pool);
    free(tok), free(pos), free(x), free(dy), free(y), free(dx);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--bench")) {
        const long long n = argc >= 3 ? atoll(argv[2]) : 1024;
        const int reps = argc >= 4 ? atoi(argv[3]) : 3;
        const bool b16 = argc >= 5 && !strcmp(argv[4], "bf16");
        const int th = argc >= 6 ? atoi(argv[5]) : 2;
        if (n < 1 || n > (1 << 20) || reps < 1 || reps > 64 || th < 1 || th > 64 ||
            (argc >= 5 && strcmp(argv[4], "bf16") && strcmp(argv[4], "fp32"))) {
            fprintf(stderr, "usage: test_attention --bench N [reps 1..64] [fp32|bf16] [threads]\n");
            return 2;
        }
        return bench((int64_t)n, reps, b16, th);
    }

    const char *v = getenv("TEST_VERBOSE");
    verbose = v ? (int)strtol(v, NULL, 10) : 0;
    test_pool_fd();
    test_sattn_fd();
    test_rope();
    trex_arena *ar = trex_arena_create(NULL, TREX_REGION_ACTS, (size_t)1 << 20);
    CHECK(ar != NULL, "arena");
    if (ar) {
        test_forward_reference(ar);
        test_gradients(ar);
        test_visibility(ar);
        test_documents(ar);
        test_sparse_is_dense(ar);
        test_threads(ar);
        run_dtype = TREX_BF16;
        test_threads(ar);
        trex_pool *p2 = trex_pool_create(2);
        for (int dt = 0; dt < 2; dt++) {
            run_dtype = dt ? TREX_BF16 : TREX_F32;
            test_kept_core(ar, NULL);
            test_kept_core(ar, p2);
        }
        run_dtype = TREX_BF16;
        test_weight_panels(ar, p2);
        trex_pool_destroy(p2);
        run_dtype = TREX_F32;
        test_axpy_levels();
        test_axpy_rows_levels();
        test_kl_grad_levels();
        test_rope_levels();
        test_rms_head_bwd_levels();
        test_bad_config(ar);
        trex_arena_destroy(ar);
    }
    return check_summary();
}
