/* tests/test_fused.c — every level of the fused-kernel table (kernels/fused.h) against the reference
 * entries, bit for bit, on awkward shapes (1, primes, lengths that are not multiples of 16, n = 0,
 * entries scattered in memory and given in any order), plus a check that the reference entries are
 * the model's scalar code (model/attention_math.h, model/mhc_real.h) and not something else. The
 * bf16-mode SwiGLU entries (not the model's libm code: an exp of their own) are checked against the
 * formulas in double instead.
 *
 * `test_fused --bench [reps]` instead times each entry of the reference and of the level the dispatch
 * picks (`TREX_ISA` caps it) on dsv4-bench's shapes (16 heads of 512, 256 entries per query in the
 * forward and the query side, 16 per key-side tile; mHC 4 x 1024) in CPU time of the calling thread,
 * and prints the medians (docs/perf.md). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#include "rand_fill.h"
#include "fused_levels.h"
#include "kernels/fused.h"
#include "kernels/kernels.h"

#define AM_REAL float
#define AM_SFX f
#include "model/attention_math.h"

#define MHC_REAL float
#define MHC_SUFFIX f
#define MHC_EXP expf
#define MHC_SQRT sqrtf
#include "model/mhc_real.h"

/* The attention entries of table t against the reference on one shape. */
static void check_sattn(const trex_fused_table *t, const trex_fused_table *r, int64_t n, int64_t H,
                        int64_t c)
{
    const int64_t pool_rows = n + 7;
    float *pool = xmalloc_f(pool_rows * c), *q = xmalloc_f(H * c), *g = xmalloc_f(H * c);
    float *sink = xmalloc_f(H), *ws = xmalloc_f(TREX_FUSED_SATTN_WS(n, H));
    const float **V = malloc((size_t)(n + 1) * sizeof *V);
    float **dV1 = malloc((size_t)(n + 1) * sizeof *dV1), **dV2 = malloc((size_t)(n + 1) * sizeof *dV2);
    float *dpool1 = xmalloc_f(n * c), *dpool2 = xmalloc_f(n * c);
    if (!V || !dV1 || !dV2) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    fill(pool, pool_rows * c, 2.0f);
    fill(q, H * c, 1.5f);
    fill(g, H * c, 1.0f);
    fill(sink, H, 1.0f);
    /* entries scattered over the pool in a shuffled order (rows may not be adjacent or ascending) */
    for (int64_t e = 0; e < n; e++)
        V[e] = pool + ((e * 5 + 3) % pool_rows) * c;
    const float scale = 1.0f / sqrtf((float)c);
    float *o1 = xmalloc_f(H * c), *o2 = xmalloc_f(H * c), *lse1 = xmalloc_f(H), *lse2 = xmalloc_f(H);
    float *z1 = xmalloc_f(H * n), *z2 = xmalloc_f(H * n);
    r->sattn_fwd(o1, lse1, z1, ws, q, V, n, H, c, sink, scale);
    t->sattn_fwd(o2, lse2, z2, ws, q, V, n, H, c, sink, scale);
    CHECK(same_bits(o1, o2, H * c) && same_bits(lse1, lse2, H) && same_bits(z1, z2, H * n),
          "%s sattn_fwd n=%lld H=%lld c=%lld", t->name, (long long)n, (long long)H, (long long)c);

    float *D = xmalloc_f(H), *dq1 = xmalloc_f(H * c), *dq2 = xmalloc_f(H * c);
    float *ds1 = xmalloc_f(H), *ds2 = xmalloc_f(H), *P1 = xmalloc_f(H * n), *P2 = xmalloc_f(H * n);
    for (int64_t h = 0; h < H; h++)
        D[h] = r->dot(g + h * c, o1 + h * c, c);
    r->sattn_bwd_query(dq1, ds1, P1, ws, g, q, V, n, H, c, sink, scale, lse1, D);
    t->sattn_bwd_query(dq2, ds2, P2, ws, g, q, V, n, H, c, sink, scale, lse1, D);
    CHECK(same_bits(dq1, dq2, H * c) && same_bits(ds1, ds2, H) && same_bits(P1, P2, H * n),
          "%s sattn_bwd_query n=%lld H=%lld c=%lld", t->name, (long long)n, (long long)H,
          (long long)c);
    t->sattn_bwd_query(dq2, ds2, NULL, ws, g, q, V, n, H, c, sink, scale, lse1, D);
    CHECK(same_bits(dq1, dq2, H * c), "%s sattn_bwd_query without P", t->name);

    float *ps1 = xmalloc_f(n), *ps2 = xmalloc_f(n);
    fill(dpool1, n * c, 0.5f);
    memcpy(dpool2, dpool1, (size_t)(n * c) * sizeof(float));
    for (int64_t e = 0; e < n; e++) {
        dV1[e] = dpool1 + e * c;
        dV2[e] = dpool2 + e * c;
    }
    r->sattn_bwd_entries(dV1, ps1, ws, V, n, q, g, H, c, scale, lse1, D);
    t->sattn_bwd_entries(dV2, ps2, ws, V, n, q, g, H, c, scale, lse1, D);
    CHECK(same_bits(dpool1, dpool2, n * c) && same_bits(ps1, ps2, n),
          "%s sattn_bwd_entries n=%lld H=%lld c=%lld", t->name, (long long)n, (long long)H,
          (long long)c);
    free(pool), free(q), free(g), free(sink), free(ws), free(V), free(dV1), free(dV2);
    free(dpool1), free(dpool2), free(o1), free(o2), free(lse1), free(lse2), free(z1), free(z2);
    free(D), free(dq1), free(dq2), free(ds1), free(ds2), free(P1), free(P2), free(ps1), free(ps2);
}

static void check_mhc(const trex_fused_table *t, const trex_fused_table *r, int n, int64_t d)
{
    float *X = xmalloc_f(n * d), *y = xmalloc_f(d), *post = xmalloc_f(n), *comb = xmalloc_f(n * n);
    float *o1 = xmalloc_f(n * d), *o2 = xmalloc_f(n * d);
    fill(X, n * d, 3.0f);
    fill(y, d, 2.0f);
    fill(post, n, 1.0f);
    fill(comb, n * n, 1.0f);
    r->mhc_post_fwd(n, d, post, comb, y, X, o1);
    t->mhc_post_fwd(n, d, post, comb, y, X, o2);
    CHECK(same_bits(o1, o2, n * d), "%s mhc_post_fwd n=%d d=%lld", t->name, n, (long long)d);
    r->mhc_collapse(n, d, post, X, o1);
    t->mhc_collapse(n, d, post, X, o2);
    CHECK(same_bits(o1, o2, d), "%s mhc_collapse n=%d d=%lld", t->name, n, (long long)d);
    float *dXo = xmalloc_f(n * d), *dy1 = xmalloc_f(d), *dy2 = xmalloc_f(d);
    float p1[8], p2[8], c1[64], c2[64];
    fill(dXo, n * d, 1.0f);
    r->mhc_post_bwd(n, d, post, comb, y, X, dXo, dy1, o1, p1, c1);
    t->mhc_post_bwd(n, d, post, comb, y, X, dXo, dy2, o2, p2, c2);
    CHECK(same_bits(dy1, dy2, d) && same_bits(o1, o2, n * d) && same_bits(p1, p2, n) &&
          same_bits(c1, c2, n * n), "%s mhc_post_bwd n=%d d=%lld", t->name, n, (long long)d);
    fill(o1, n * d, 1.0f);
    memcpy(o2, o1, (size_t)(n * d) * sizeof(float));
    r->mhc_collapse_bwd(n, d, post, X, y, p1, o1);
    t->mhc_collapse_bwd(n, d, post, X, y, p2, o2);
    CHECK(same_bits(o1, o2, n * d) && same_bits(p1, p2, n), "%s mhc_collapse_bwd n=%d d=%lld",
          t->name, n, (long long)d);
    free(X), free(y), free(post), free(comb), free(o1), free(o2), free(dXo), free(dy1), free(dy2);
}

/* The compressor's pooling entries of table t against the reference: n candidates of c features whose
 * rows are scattered over a buffer in a shuffled order, pooled values and accumulated gradients bit for
 * bit, nothing written past c in any row. Scores of amplitude amp (large ones push exp into its
 * clamp). */
static void check_pool(const trex_fused_table *t, const trex_fused_table *r, int64_t n, int64_t c, float amp)
{
    const int64_t rows = n + 3, ld = c + 5;
    float *kbuf = xmalloc_f(rows * ld), *zbuf = xmalloc_f(rows * ld), *dC = xmalloc_f(c);
    float *g1 = xmalloc_f(2 * rows * ld), *g2 = xmalloc_f(2 * rows * ld), *C1 = xmalloc_f(c + 1), *C2 = xmalloc_f(c + 1);
    const float **K = malloc((size_t)n * sizeof *K), **Z = malloc((size_t)n * sizeof *Z);
    float **dK1 = malloc((size_t)n * sizeof *dK1), **dZ1 = malloc((size_t)n * sizeof *dZ1);
    float **dK2 = malloc((size_t)n * sizeof *dK2), **dZ2 = malloc((size_t)n * sizeof *dZ2);
    if (!K || !Z || !dK1 || !dZ1 || !dK2 || !dZ2) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    fill(kbuf, rows * ld, 2.0f);
    fill(zbuf, rows * ld, amp);
    fill(dC, c, 1.0f);
    fill(g1, 2 * rows * ld, 1.0f);
    memcpy(g2, g1, (size_t)(2 * rows * ld) * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        const int64_t rk = (j * 5 + 2) % rows, rz = (j * 3 + 1) % rows;
        K[j] = kbuf + rk * ld;
        Z[j] = zbuf + rz * ld;
        dK1[j] = g1 + rk * ld, dZ1[j] = g1 + (rows + rz) * ld;
        dK2[j] = g2 + rk * ld, dZ2[j] = g2 + (rows + rz) * ld;
    }
    C1[c] = C2[c] = 7.0f;
    r->pool_fwd(C1, K, Z, n, c);
    t->pool_fwd(C2, K, Z, n, c);
    CHECK(same_bits(C1, C2, c + 1) && C1[c] == 7.0f, "%s pool_fwd n=%lld c=%lld amp %g", t->name, (long long)n,
          (long long)c, (double)amp);
    r->pool_bwd(dK1, dZ1, dC, K, Z, n, c);
    t->pool_bwd(dK2, dZ2, dC, K, Z, n, c);
    CHECK(same_bits(g1, g2, 2 * rows * ld), "%s pool_bwd n=%lld c=%lld amp %g", t->name, (long long)n,
          (long long)c, (double)amp);
    free(kbuf), free(zbuf), free(dC), free(g1), free(g2), free(C1), free(C2);
    free(K), free(Z), free(dK1), free(dZ1), free(dK2), free(dZ2);
}

/* The reference pooling against the formulas in double (the softmax over the candidates per feature and
 * its vector-Jacobian product), and against the fp32 mode's am_pool_* (libm's exp): relative errors in
 * units of 2^-24 of each output's scale, bounded. */
static void check_pool_accuracy(const trex_fused_table *r)
{
    const int64_t c = 37, ns[] = {1, 2, 8, 128};
    double worst_f = 0.0, worst_b = 0.0, worst_am = 0.0;
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        const int64_t n = ns[i];
        float *kb = xmalloc_f(n * c), *zb = xmalloc_f(n * c), *dC = xmalloc_f(c), *C = xmalloc_f(c);
        float *Cam = xmalloc_f(c), *ws = xmalloc_f(3 * c), *g = xmalloc_f(2 * n * c);
        const float **K = malloc((size_t)n * sizeof *K), **Z = malloc((size_t)n * sizeof *Z);
        float **dK = malloc((size_t)n * sizeof *dK), **dZ = malloc((size_t)n * sizeof *dZ);
        if (!K || !Z || !dK || !dZ) {
            fprintf(stderr, "out of memory\n");
            exit(2);
        }
        fill(kb, n * c, 2.0f);
        fill(zb, n * c, 6.0f);
        fill(dC, c, 1.0f);
        memset(g, 0, (size_t)(2 * n * c) * sizeof(float));
        for (int64_t j = 0; j < n; j++)
            K[j] = kb + j * c, Z[j] = zb + j * c, dK[j] = g + j * c, dZ[j] = g + (n + j) * c;
        r->pool_fwd(C, K, Z, n, c);
        r->pool_bwd(dK, dZ, dC, K, Z, n, c);
        am_pool_forward_f(Cam, K, Z, n, c, ws);
        for (int64_t f = 0; f < c; f++) {
            double mx = zb[f], den = 0.0, s = 0.0, kmax = 0.0;
            for (int64_t j = 1; j < n; j++)
                mx = zb[j * c + f] > mx ? zb[j * c + f] : mx;
            for (int64_t j = 0; j < n; j++) {
                const double e = exp((double)zb[j * c + f] - mx);
                den += e, s += e * kb[j * c + f];
                kmax = fabs(kb[j * c + f]) > kmax ? fabs(kb[j * c + f]) : kmax;
            }
            const double Cd = s / den, u = 0x1p-24 * (kmax > 0.0 ? kmax : 1.0);
            worst_f = fmax(worst_f, fabs((double)C[f] - Cd) / u);
            worst_am = fmax(worst_am, fabs((double)C[f] - (double)Cam[f]) / u);
            for (int64_t j = 0; j < n; j++) {
                const double p = exp((double)zb[j * c + f] - mx) / den, gd = p * dC[f];
                const double dz = gd * ((double)kb[j * c + f] - Cd), ub = 0x1p-24 * (fabs(dC[f]) + 1e-30);
                worst_b = fmax(worst_b, fabs((double)dK[j][f] - gd) / ub);
                worst_b = fmax(worst_b, fabs((double)dZ[j][f] - dz) / (ub * 4.0 * (kmax > 0.0 ? kmax : 1.0)));
            }
        }
        free(kb), free(zb), free(dC), free(C), free(Cam), free(ws), free(g), free(K), free(Z), free(dK), free(dZ);
    }
    printf("pool: error against double: forward %.1f, backward %.1f; against am_pool_forward (libm exp) %.1f "
           "(units of 2^-24 of the scale)\n", worst_f, worst_b, worst_am);
    CHECK(worst_f <= 512.0 && worst_b <= 512.0 && worst_am <= 512.0,
          "pool error: forward %.1f backward %.1f vs libm %.1f units of 2^-24", worst_f, worst_b, worst_am);
}

/* bf16 values bit for bit, except that two NaNs count as equal: which NaN operand of a product
 * propagates follows the operand order, which the compiler may swap in scalar code (as in
 * tests/test_kernels.c). */
static bool same_bf16(const uint16_t *a, const uint16_t *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i] && !((a[i] & 0x7fff) > 0x7f80 && (b[i] & 0x7fff) > 0x7f80))
            return false;
    return true;
}

/* The bf16 SwiGLU entries of table t against the reference on n elements with clamp L: every output
 * bit for bit (the dot product's bits too; NaNs as above), nothing written past n; the backward's h
 * equals the forward's, and its other outputs do not depend on whether h is asked for. Inputs of
 * amplitude amp, with special values (NaN, infinities, zeros, values on the clamp, past exp's range)
 * mixed in. */
static void check_swiglu(const trex_fused_table *t, const trex_fused_table *r, int64_t n, float L,
                         float amp)
{
    const int64_t m = n + 16;
    float *a = xmalloc_f(m), *u = xmalloc_f(m), *dh = xmalloc_f(m);
    uint16_t *o[9];
    for (int k = 0; k < 9; k++) {
        o[k] = malloc((size_t)m * sizeof(uint16_t));
        if (!o[k])
            exit(2);
        for (int64_t j = 0; j < m; j++)
            o[k][j] = 0xabcd;
    }
    fill(a, m, amp), fill(u, m, amp), fill(dh, m, 1.0f);
    const float sp[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, L, -L, 95.0f, -95.0f, 88.5f, -87.5f,
                        1e-40f, -1e-40f, 3.4e38f};
    for (int64_t j = 0; j < n; j += 7) {
        a[j] = sp[(j / 7) % 14];
        if (j + 3 < n)
            u[j + 3] = sp[(j / 7 + 5) % 14];
    }
    const float g = 0.37f + 0.5f * frand();
    r->swiglu_fwd_bf16(o[0], a, u, n, g, L);
    t->swiglu_fwd_bf16(o[1], a, u, n, g, L);
    const float d1 = r->swiglu_bwd_bf16(NULL, o[2], o[3], a, u, dh, n, g, L);
    const float d2 = t->swiglu_bwd_bf16(o[6], o[4], o[5], a, u, dh, n, g, L);
    const float d3 = t->swiglu_bwd_bf16(NULL, o[7], o[8], a, u, dh, n, g, L);
    bool tail = true;
    for (int k = 0; k < 9; k++)
        for (int64_t j = n; j < m; j++)
            tail = tail && o[k][j] == 0xabcd;
    CHECK(same_bf16(o[0], o[1], n) && same_bf16(o[2], o[4], n) && same_bf16(o[3], o[5], n) &&
              same_bf16(o[0], o[6], n) && same_bf16(o[4], o[7], n) && same_bf16(o[5], o[8], n) &&
              (memcmp(&d1, &d2, sizeof d1) == 0 || (isnan(d1) && isnan(d2))) &&
              (memcmp(&d2, &d3, sizeof d2) == 0 || (isnan(d2) && isnan(d3))) && tail,
          "%s swiglu_fwd/bwd_bf16 n=%lld L=%g: same bits as the reference (the backward's h as the "
          "forward's), nothing past n", t->name, (long long)n, (double)L);
    /* the NaN at a[0] makes every dot above NaN: the dot's bits again on finite values */
    fill(a, m, amp), fill(u, m, amp);
    const float f1 = r->swiglu_bwd_bf16(NULL, o[2], o[3], a, u, dh, n, g, L);
    const float f2 = t->swiglu_bwd_bf16(NULL, o[4], o[5], a, u, dh, n, g, L);
    CHECK(memcmp(&f1, &f2, sizeof f1) == 0, "%s swiglu_bwd_bf16 n=%lld L=%g: the dot %.9g, the reference's "
          "%.9g", t->name, (long long)n, (double)L, (double)f2, (double)f1);
    free(a), free(u), free(dh);
    for (int k = 0; k < 9; k++)
        free(o[k]);
}

/* The reference SwiGLU entries against the formulas in double on finite inputs: h, da and du within
 * bf16 rounding (2^-8 relative, plus 2^-18 for the fp32 work before it and a tiny absolute term where
 * exp's clamp meets underflow); the dot product within fp32 rounding of its terms; and, through the
 * dot product of one element with dh = 1 (which is SiLU(ac) uc in fp32, not rounded to bf16), the exp
 * at fp32 accuracy: within 2^-20 (8 ulp). A wrong exp, clamp or rounding fails this. */
static void check_swiglu_accuracy(const trex_fused_table *r)
{
    const int64_t n = 4099;
    const float L = 10.0f;
    float *a = xmalloc_f(n), *u = xmalloc_f(n), *dh = xmalloc_f(n);
    uint16_t *h = malloc((size_t)n * 2), *da = malloc((size_t)n * 2), *du = malloc((size_t)n * 2);
    if (!h || !da || !du)
        exit(2);
    fill(a, n, 1.0f), fill(u, n, 12.0f), fill(dh, n, 1.0f);
    for (int64_t j = 0; j < n; j++) /* a from -100 to 15: exp's clamps, the SwiGLU clamp, and 0 */
        a[j] = -100.0f + 115.0f * (float)j / (float)(n - 1);
    const float g = 0.8125f;
    r->swiglu_fwd_bf16(h, a, u, n, g, L);
    const float dot = r->swiglu_bwd_bf16(NULL, da, du, a, u, dh, n, g, L);
    double worst = 0, dot64 = 0, dabs = 0, w32 = 0;
    for (int64_t j = 0; j < n; j++) {
        const double ac = a[j] > L ? L : a[j], uc = u[j] > L ? L : (u[j] < -L ? -L : u[j]);
        const double sig = 1.0 / (1.0 + exp(-ac)), sl = ac * sig;
        const double dsl = sig * (1.0 + ac * (1.0 - sig));
        const double w[3] = {g * sl * uc, (a[j] > L ? 0.0 : 1.0) * dh[j] * g * uc * dsl,
                             (u[j] > L || u[j] < -L ? 0.0 : 1.0) * dh[j] * g * sl};
        const uint16_t got[3] = {h[j], da[j], du[j]};
        for (int k = 0; k < 3; k++) {
            const uint32_t bits = (uint32_t)got[k] << 16;
            float f;
            memcpy(&f, &bits, sizeof f);
            const double e = fabs((double)f - w[k]) / (fabs(w[k]) * (0x1p-8 + 0x1p-18) + 1e-35);
            worst = e > worst ? e : worst;
        }
        uint16_t t1, t2;
        const float one = 1.0f, h0 = r->swiglu_bwd_bf16(NULL, &t1, &t2, a + j, u + j, &one, 1, g, L);
        const double e32 = fabs((double)h0 - sl * uc) / (fabs(sl * uc) * 0x1p-20 + 1e-35);
        w32 = e32 > w32 ? e32 : w32;
        dot64 += dh[j] * sl * uc;
        dabs += fabs(dh[j] * sl * uc);
    }
    const double edot = fabs(dot - dot64) / (dabs * 1e-6);
    CHECK(worst <= 1.0 && edot <= 1.0 && w32 <= 1.0,
          "ref swiglu_*_bf16 against double: worst error / bound %.3f (h, da, du), dot %.3f, "
          "fp32 SiLU(a) u %.3f", worst, edot, w32);
    free(a), free(u), free(dh), free(h), free(da), free(du);
}

/* The router-logits entry of table t against the reference and the fp32 GEMM (trex_linear_forward
 * with W = gt^T), bit for bit, on n rows of d against E experts. */
static void check_gate(const trex_fused_table *t, const trex_fused_table *r, int64_t n, int64_t d,
                       int64_t E)
{
    float *x = xmalloc_f(n * d), *gt = xmalloc_f(d * E), *W = xmalloc_f(E * d);
    float *z1 = xmalloc_f(n * E + 16), *z2 = xmalloc_f(n * E + 16), *z3 = xmalloc_f(n * E);
    fill(x, n * d, 2.0f), fill(gt, d * E, 0.1f);
    for (int64_t e = 0; e < E; e++)
        for (int64_t k = 0; k < d; k++)
            W[e * d + k] = gt[k * E + e];
    for (int64_t q = 0; q < n * E + 16; q++)
        z1[q] = z2[q] = -7.0f;
    r->gate_fwd(z1, x, gt, n, d, E);
    t->gate_fwd(z2, x, gt, n, d, E);
    if (n > 0)
        trex_linear_forward(NULL, z3, x, W, n, d, E);
    bool tail = true;
    for (int64_t q = n * E; q < n * E + 16; q++)
        tail = tail && z2[q] == -7.0f;
    CHECK(same_bits(z1, z2, n * E) && same_bits(z1, z3, n * E) && tail,
          "%s gate_fwd n=%lld d=%lld E=%lld: the reference's and the fp32 GEMM's bits", t->name,
          (long long)n, (long long)d, (long long)E);
    free(x), free(gt), free(W), free(z1), free(z2), free(z3);
}

/* The router's backward entries of table t against the reference and trex_linear_backward (acc), bit
 * for bit: dx += dz gate, dg += dz^T x, the latter also in two column ranges split at an odd column. */
static void check_gate_bwd(const trex_fused_table *t, const trex_fused_table *r, int64_t n,
                           int64_t d, int64_t E)
{
    float *dz = xmalloc_f(n * E), *x = xmalloc_f(n * d), *gate = xmalloc_f(E * d);
    float *dx[3], *dg[3];
    fill(dz, n * E, 0.3f), fill(x, n * d, 2.0f), fill(gate, E * d, 0.1f);
    for (int k = 0; k < 3; k++) {
        dx[k] = xmalloc_f(n * d), dg[k] = xmalloc_f(E * d);
        rng_state = 77; /* the same old values in each copy */
        fill(dx[k], n * d, 1.0f), fill(dg[k], E * d, 1.0f);
    }
    r->gate_bwd_dx(dx[0], dz, gate, n, d, E);
    float *ws = xmalloc_f(E * d);
    r->gate_bwd_dw(dg[0], ws, dz, x, n, d, E, 0, d);
    t->gate_bwd_dx(dx[1], dz, gate, n, d, E);
    const int64_t js = d / 2 | 1;
    t->gate_bwd_dw(dg[1], ws, dz, x, n, d, E, 0, js < d ? js : d);
    t->gate_bwd_dw(dg[1], ws, dz, x, n, d, E, js < d ? js : d, d);
    free(ws);
    if (n > 0)
        trex_linear_backward(NULL, dx[2], dg[2], dz, x, gate, n, d, E, true);
    CHECK(same_bits(dx[0], dx[1], n * d) && same_bits(dg[0], dg[1], E * d) &&
              (n == 0 || (same_bits(dx[0], dx[2], n * d) && same_bits(dg[0], dg[2], E * d))),
          "%s gate_bwd_dx/dw n=%lld d=%lld E=%lld: the reference's and the fp32 GEMM's bits", t->name,
          (long long)n, (long long)d, (long long)E);
    free(dz), free(x), free(gate);
    for (int k = 0; k < 3; k++)
        free(dx[k]), free(dg[k]);
}

/* gate_bwd_dx_mhc of table t and of the reference against the passes it fuses, bit for bit: the
 * reference's mhc_collapse_bwd (its dX update), dX -= c X as mhc_rho_bwd, then gate_bwd_dx; ns
 * streams of d, the weights w with a row stride wider than ns. */
static void check_gate_bwd_mhc(const trex_fused_table *t, const trex_fused_table *r, int64_t n,
                               int ns, int64_t d, int64_t E)
{
    const int64_t nd = ns * d, wld = ns + 3;
    float *dz = xmalloc_f(n * E), *X = xmalloc_f(n * nd), *gate = xmalloc_f(E * nd);
    float *dx = xmalloc_f(n * d), *w = xmalloc_f(n * wld), *c = xmalloc_f(n), dw[8];
    fill(dz, n * E, 0.3f), fill(X, n * nd, 2.0f), fill(gate, E * nd, 0.1f), fill(dx, n * d, 1.0f);
    fill(w, n * wld, 1.0f), fill(c, n, 0.01f);
    float *dX[3];
    for (int k = 0; k < 3; k++) {
        dX[k] = xmalloc_f(n * nd);
        rng_state = 91; /* the same old values in each copy */
        fill(dX[k], n * nd, 1.0f);
    }
    for (int64_t q = 0; q < n; q++) {
        r->mhc_collapse_bwd(ns, d, w + q * wld, X + q * nd, dx + q * d, dw, dX[0] + q * nd);
        for (int64_t i = 0; i < nd; i++)
            dX[0][q * nd + i] -= c[q] * X[q * nd + i];
    }
    r->gate_bwd_dx(dX[0], dz, gate, n, nd, E);
    r->gate_bwd_dx_mhc(dX[1], dz, gate, n, ns, d, E, X, dx, w, wld, c);
    t->gate_bwd_dx_mhc(dX[2], dz, gate, n, ns, d, E, X, dx, w, wld, c);
    CHECK(same_bits(dX[0], dX[1], n * nd) && same_bits(dX[0], dX[2], n * nd),
          "%s gate_bwd_dx_mhc n=%lld ns=%d d=%lld E=%lld: the separate passes' bits", t->name,
          (long long)n, ns, (long long)d, (long long)E);
    free(dz), free(X), free(gate), free(dx), free(w), free(c);
    for (int k = 0; k < 3; k++)
        free(dX[k]);
}

/* The _fma gate entries (bf16 mode's mHC products) of table t against the reference's (fmaf), bit for
 * bit: forward, dg (in two column ranges) and the mHC dX pass; and, where the sums are long enough to
 * round differently (9 rows, 68 columns), not the bits of the plain entries (the fused multiply-add
 * is what runs). */
static void check_gate_fma(const trex_fused_table *t, const trex_fused_table *r, int64_t n, int64_t d,
                           int64_t E)
{
    const int ns = 4, dd = d / ns > 0 ? d / ns : 1;
    const int64_t nd = ns * dd; /* the mHC pass: ns streams of dd */
    float *x = xmalloc_f(n * nd), *gt = xmalloc_f(nd * E), *gate = xmalloc_f(E * nd);
    float *dz = xmalloc_f(n * E), *ws = xmalloc_f(E * nd), *dx = xmalloc_f(n * dd);
    float *w = xmalloc_f(n * ns), *c = xmalloc_f(n);
    float *z[3], *dg[3], *dX[3];
    fill(x, n * nd, 2.0f), fill(gt, nd * E, 0.1f), fill(gate, E * nd, 0.1f), fill(dz, n * E, 0.3f);
    fill(dx, n * dd, 1.0f), fill(w, n * ns, 1.0f), fill(c, n, 0.01f);
    for (int k = 0; k < 3; k++) {
        z[k] = xmalloc_f(n * E), dg[k] = xmalloc_f(E * nd), dX[k] = xmalloc_f(n * nd);
        rng_state = 93; /* the same old values in each copy */
        fill(dg[k], E * nd, 1.0f), fill(dX[k], n * nd, 1.0f);
    }
    r->gate_fwd_fma(z[0], x, gt, n, nd, E);
    t->gate_fwd_fma(z[1], x, gt, n, nd, E);
    r->gate_fwd(z[2], x, gt, n, nd, E);
    r->gate_bwd_dw_fma(dg[0], ws, dz, x, n, nd, E, 0, nd);
    const int64_t js = nd / 2 | 1;
    t->gate_bwd_dw_fma(dg[1], ws, dz, x, n, nd, E, 0, js < nd ? js : nd);
    t->gate_bwd_dw_fma(dg[1], ws, dz, x, n, nd, E, js < nd ? js : nd, nd);
    r->gate_bwd_dw(dg[2], ws, dz, x, n, nd, E, 0, nd);
    r->gate_bwd_dx_mhc_fma(dX[0], dz, gate, n, ns, dd, E, x, dx, w, ns, c);
    t->gate_bwd_dx_mhc_fma(dX[1], dz, gate, n, ns, dd, E, x, dx, w, ns, c);
    r->gate_bwd_dx_mhc(dX[2], dz, gate, n, ns, dd, E, x, dx, w, ns, c);
    CHECK(same_bits(z[0], z[1], n * E) && same_bits(dg[0], dg[1], E * nd) &&
              same_bits(dX[0], dX[1], n * nd),
          "%s gate _fma entries n=%lld d=%lld E=%lld: the reference's (fmaf) bits", t->name,
          (long long)n, (long long)nd, (long long)E);
    if (n >= 9 && nd >= 68)
        CHECK(!same_bits(z[0], z[2], n * E) && !same_bits(dg[0], dg[2], E * nd) &&
                  !same_bits(dX[0], dX[2], n * nd),
              "gate _fma entries n=%lld d=%lld E=%lld: other bits than the plain entries",
              (long long)n, (long long)nd, (long long)E);
    free(x), free(gt), free(gate), free(dz), free(ws), free(dx), free(w), free(c);
    for (int k = 0; k < 3; k++)
        free(z[k]), free(dg[k]), free(dX[k]);
}

/* The bf16-mode SwiGLU as fp32 mode runs it (model/moe.c: libm expf, fp32 out), for the benchmark. */
static void swiglu_libm(float *h, const float *a, const float *u, int64_t n, float g, float L)
{
    for (int64_t j = 0; j < n; j++) {
        const float ac = a[j] > L ? L : a[j], uc = u[j] > L ? L : (u[j] < -L ? -L : u[j]);
        h[j] = ac / (1.0f + expf(-ac)) * uc * g;
    }
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { BENCH_MAX_REPS = 101 };

/* Median CPU seconds of one call of `what` over reps repetitions of `inner` calls. */
#define BENCH(label, inner, call)                                                            \
    do {                                                                                     \
        double tm_[BENCH_MAX_REPS];                                                          \
        for (int r_ = 0; r_ < reps; r_++) {                                                  \
            double t0_ = cpu_now();                                                          \
            for (int i_ = 0; i_ < (inner); i_++)                                             \
                call;                                                                        \
            tm_[r_] = (cpu_now() - t0_) / (inner);                                           \
        }                                                                                    \
        qsort(tm_, (size_t)reps, sizeof tm_[0], cmp_double);                                 \
        printf("%-8s %-22s %10.2f us\n", t->name, (label), 1e6 * tm_[reps / 2]);            \
    } while (0)

static int bench(int reps)
{
    const int64_t H = 16, c = 512, n = 256, nk = 16, d = 1024;
    const int mh = 4;
    float *pool = xmalloc_f(n * c), *q = xmalloc_f(H * c), *g = xmalloc_f(H * c), *sink = xmalloc_f(H);
    float *ws = xmalloc_f(TREX_FUSED_SATTN_WS(n, H)), *o = xmalloc_f(H * c), *lse = xmalloc_f(H);
    float *z = xmalloc_f(H * n), *D = xmalloc_f(H), *dq = xmalloc_f(H * c), *ds = xmalloc_f(H);
    float *P = xmalloc_f(H * n), *ps = xmalloc_f(n), *dpool = xmalloc_f(nk * c);
    float *X = xmalloc_f(mh * d), *y = xmalloc_f(d), *Xo = xmalloc_f(mh * d), *dX = xmalloc_f(mh * d);
    float post[4], comb[16], dpost[4], dcomb[16];
    float *gdx = xmalloc_f(64 * d), *gdw = xmalloc_f(24 * d), *gws = xmalloc_f(24 * d);
    fill(gdx, 64 * d, 1.0f), fill(gdw, 24 * d, 1.0f);
    const float *V[256];
    float *dV[16];
    fill(pool, n * c, 2.0f), fill(q, H * c, 1.5f), fill(g, H * c, 1.0f), fill(sink, H, 1.0f);
    fill(X, mh * d, 1.0f), fill(y, d, 1.0f), fill(post, 4, 1.0f), fill(comb, 16, 1.0f);
    fill(dpool, nk * c, 0.1f);
    for (int64_t e = 0; e < n; e++)
        V[e] = pool + e * c;
    for (int64_t e = 0; e < nk; e++)
        dV[e] = dpool + e * c;
    const float scale = 1.0f / sqrtf((float)c);
    /* the reference, then the level the dispatch picks (TREX_ISA caps it) */
    const trex_fused_table *levels[2] = {trex_fused_for(TREX_ISA_REF), trex_fused()};
    printf("median CPU time per call, %d repetitions (H %lld, c %lld, n %lld; key side %lld entries)\n",
           reps, (long long)H, (long long)c, (long long)n, (long long)nk);
    for (int k = 0; k < 2; k++) {
        const trex_fused_table *t = levels[k];
        if (k == 1 && t == levels[0])
            break;
        t->sattn_fwd(o, lse, z, ws, q, V, n, H, c, sink, scale);
        for (int64_t h = 0; h < H; h++)
            D[h] = t->dot(g + h * c, o + h * c, c);
        BENCH("sattn_fwd n=256", 20, t->sattn_fwd(o, lse, z, ws, q, V, n, H, c, sink, scale));
        BENCH("sattn_bwd_query n=256", 20,
              t->sattn_bwd_query(dq, ds, P, ws, g, q, V, n, H, c, sink, scale, lse, D));
        BENCH("sattn_bwd_entries n=16", 200,
              t->sattn_bwd_entries(dV, ps, ws, V, nk, q, g, H, c, scale, lse, D));
        BENCH("mhc_post_fwd 4x1024", 2000, t->mhc_post_fwd(mh, d, post, comb, y, X, Xo));
        BENCH("mhc_post_bwd 4x1024", 1000,
              t->mhc_post_bwd(mh, d, post, comb, y, X, Xo, dq, dX, dpost, dcomb));
        BENCH("mhc_collapse 4x1024", 2000, t->mhc_collapse(mh, d, post, X, y));
        BENCH("mhc_collapse_bwd 4x1024", 2000, t->mhc_collapse_bwd(mh, d, post, X, y, dpost, dX));
        uint16_t hb[512], hb2[512], hb3[512];
        float sink_ = 0;
        BENCH("swiglu_fwd_bf16 512", 20000, t->swiglu_fwd_bf16(hb, X, X + 512, 512, 0.7f, 10.0f));
        BENCH("swiglu_bwd_bf16 512", 20000,
              sink_ += t->swiglu_bwd_bf16(NULL, hb, hb2, X, X + 512, y, 512, 0.7f, 10.0f));
        BENCH("swiglu_bwd_bf16 512 with h", 20000,
              sink_ += t->swiglu_bwd_bf16(hb3, hb, hb2, X, X + 512, y, 512, 0.7f, 10.0f));
        if (k == 0)
            BENCH("swiglu libm fp32 512", 20000, swiglu_libm(Xo, X, X + 512, 512, 0.7f, 10.0f));
        if (sink_ == 1.2345f)
            printf("(unlikely)\n");
        /* router logits of 64 rows: x and the gate are the two halves of the entries' pool */
        BENCH("gate_fwd 64x1024x24", 200, t->gate_fwd(ws, pool, pool + 65536, 64, 1024, 24));
        if (k == 0)
            BENCH("linear_forward 64x1024x24", 200,
                  trex_linear_forward(NULL, ws, pool, pool + 65536, 64, 1024, 24));
        /* the router's backward products of 64 rows (dz: the pool's first 64x24 floats) */
        BENCH("gate_bwd_dx 64x1024x24", 200, t->gate_bwd_dx(gdx, pool, pool + 65536, 64, 1024, 24));
        BENCH("gate_bwd_dw 64x1024x24", 200,
              t->gate_bwd_dw(gdw, gws, pool, pool + 65536, 64, 1024, 24, 0, 1024));
        if (k == 0)
            BENCH("linear_backward 64x1024x24", 200,
                  trex_linear_backward(NULL, gdx, gdw, pool, pool + 65536, pool + 65536, 64, 1024,
                                       24, true));
    }
    free(gdx), free(gdw), free(gws);
    free(pool), free(q), free(g), free(sink), free(ws), free(o), free(lse), free(z), free(D);
    free(dq), free(ds), free(P), free(ps), free(dpool), free(X), free(y), free(Xo), free(dX);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--bench")) {
        int reps = argc >= 3 ? atoi(argv[2]) : 11;
        return bench(reps < 1 ? 1 : reps > BENCH_MAX_REPS ? BENCH_MAX_REPS : reps);
    }
    const trex_fused_table *ref = trex_fused_for(TREX_ISA_REF);
    CHECK(ref->isa == TREX_ISA_REF, "the ref cap gives the reference table");

    /* The reference entries are the model's scalar code. */
    {
        float a[37], b[37];
        fill(a, 37, 1.0f);
        fill(b, 37, 1.0f);
        float x = ref->dot(a, b, 37), y = am_dot_f(a, b, 37);
        CHECK(memcmp(&x, &y, sizeof x) == 0, "ref dot is am_dot_f");
        float X[3 * 5], w[3], o1[5], o2[5];
        fill(X, 15, 1.0f);
        fill(w, 3, 1.0f);
        ref->mhc_collapse(3, 5, w, X, o1);
        mhc_collapse_f(3, 5, w, X, o2);
        CHECK(same_bits(o1, o2, 5), "ref collapse is mhc_collapse_f");
    }

    const trex_fused_table *seen[TREX_ISA_COUNT];
    const int nseen = fused_levels(ref, seen);
    for (int k = 0; k < nseen; k++) {
        const trex_fused_table *t = seen[k];
        printf("level %s\n", t->name);
        const int64_t lens[] = {0, 1, 2, 15, 16, 17, 31, 33, 100, 513};
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            const int64_t n = lens[i];
            float *a = xmalloc_f(n), *b = xmalloc_f(n);
            fill(a, n, 1.0f);
            fill(b, n, 1.0f);
            float x = ref->dot(a, b, n), y = t->dot(a, b, n);
            CHECK(memcmp(&x, &y, sizeof x) == 0, "%s dot n=%lld: %.9g vs %.9g", t->name,
                  (long long)n, (double)x, (double)y);
            free(a), free(b);
        }
        {
            const int64_t R = 7, n = 9, c = 37, lda = 41;
            float A[7 * 41], pool[9 * 37], o1[63], o2[63];
            const float *V[9];
            fill(A, 7 * 41, 1.0f);
            fill(pool, 9 * 37, 1.0f);
            for (int e = 0; e < 9; e++)
                V[e] = pool + ((e * 4) % 9) * c;
            for (int64_t rr = 1; rr <= R; rr += 3) {
                ref->dots(o1, A, lda, rr, V, n, c);
                t->dots(o2, A, lda, rr, V, n, c);
                CHECK(same_bits(o1, o2, rr * n), "%s dots R=%lld", t->name, (long long)rr);
            }
        }
        const int64_t ns[] = {0, 1, 3, 4, 5, 13, 37};
        const int64_t Hs[] = {1, 3, 4, 5, 16, 17};
        const int64_t cs[] = {1, 7, 16, 17, 33, 64};
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (size_t j = 0; j < sizeof Hs / sizeof Hs[0]; j++)
                for (size_t l = 0; l < sizeof cs / sizeof cs[0]; l++)
                    check_sattn(t, ref, ns[i], Hs[j], cs[l]);
        check_sattn(t, ref, 131, 16, 512); /* dsv4-bench's head size, a window-sized set */
        const int mn[] = {1, 3, 4, 8};
        const int64_t md[] = {1, 8, 15, 16, 24, 33, 1024, 1039}; /* 1039: a partial last step after many */
        for (size_t i = 0; i < sizeof mn / sizeof mn[0]; i++)
            for (size_t j = 0; j < sizeof md / sizeof md[0]; j++)
                check_mhc(t, ref, mn[i], md[j]);
        const int64_t sl[] = {0, 1, 7, 15, 16, 17, 31, 33, 100, 512, 513};
        for (size_t i = 0; i < sizeof sl / sizeof sl[0]; i++) {
            check_swiglu(t, ref, sl[i], 10.0f, 14.0f);
            check_swiglu(t, ref, sl[i], 0.0f, 100.0f);
        }
        const int64_t gn[] = {0, 1, 3, 4, 5, 9}, gd[] = {1, 17, 64}, gE[] = {1, 7, 16, 17, 24, 33};
        for (size_t i = 0; i < sizeof gn / sizeof gn[0]; i++)
            for (size_t j = 0; j < sizeof gd / sizeof gd[0]; j++)
                for (size_t l = 0; l < sizeof gE / sizeof gE[0]; l++)
                    check_gate(t, ref, gn[i], gd[j], gE[l]), check_gate_bwd(t, ref, gn[i], gd[j], gE[l]);
        check_gate(t, ref, 37, 1024, 24); /* dsv4-bench's router */
        check_gate_bwd(t, ref, 37, 1024, 24);
        check_gate_bwd(t, ref, 200, 40, 24); /* rows in several chunks of the AVX-512 leaf */
        check_gate_bwd(t, ref, 5, 70, 50); /* more than 24 experts: two groups of rows */
        check_gate_bwd(t, ref, 70, 40, 8); /* the dw leaf's 8- and 4-row groups (hc_head: n = 4) */
        check_gate_bwd(t, ref, 70, 40, 4);
        const int64_t hn[] = {1, 5, 9}, hd[] = {1, 17, 64, 100};
        for (size_t i = 0; i < sizeof hn / sizeof hn[0]; i++) /* mHC: n = 4 streams, 24 or 4 mixes */
            for (size_t j = 0; j < sizeof hd / sizeof hd[0]; j++)
                check_gate_bwd_mhc(t, ref, hn[i], 4, hd[j], 24),
                    check_gate_bwd_mhc(t, ref, hn[i], 4, hd[j], 4);
        check_gate_bwd_mhc(t, ref, 6, 3, 33, 15); /* other stream and mix counts */
        const int64_t fn_[] = {1, 9, 37, 70}, fd[] = {4, 68, 400}, fE[] = {4, 7, 24, 33};
        for (size_t i = 0; i < sizeof fn_ / sizeof fn_[0]; i++)
            for (size_t j = 0; j < sizeof fd / sizeof fd[0]; j++)
                for (size_t l = 0; l < sizeof fE / sizeof fE[0]; l++)
                    check_gate_fma(t, ref, fn_[i], fd[j], fE[l]);
        const int64_t pn[] = {1, 2, 3, 8, 17, 128}, pc[] = {1, 15, 16, 17, 33, 128, 512};
        for (size_t i = 0; i < sizeof pn / sizeof pn[0]; i++)
            for (size_t j = 0; j < sizeof pc / sizeof pc[0]; j++)
                check_pool(t, ref, pn[i], pc[j], 4.0f);
        check_pool(t, ref, 8, 40, 200.0f); /* exp clamped at -104 and subnormal */
    }
    check_swiglu_accuracy(ref);
    check_pool_accuracy(ref);
    return check_summary();
}
