/* tests/test_attn_bf16.c — the bf16 attention entries of kernels/fused.h (sattn_*_bf16) at every level
 * of the fused-kernel table, on awkward shapes (n = 0, 1, 2, 3, 7, 16, 17, 129, 257 entries scattered
 * in memory; H = 1, 2, 3, 13, 16, 20 heads; c = 20, 32, 48, 512 dims; a misaligned scratch with a guard
 * after it; n = 2 and 3 straddle the AMX key side's switch from its few-entries path to the tiles; and
 * four shapes with q scaled by 40, whose scores spread over hundreds: p underflows, the exp clamps).
 * A level with a twin (the avx2 level, whose operations are the avx512f level's in its order) must
 * give its twin's bits in every section: each output of sections 1, 4, 5, 7 and 8, with and without the
 * window in the pair layout, and the key product on its own.
 *
 * 1. Every level against the fp32 reference (model/attention_math.h) within first-order bounds of bf16
 *    rounding, element by element. With u = 2^-8 (the relative error of one product of two operands
 *    each rounded to bf16, 2^-9 each), Z_he = scale sum_k |q_hk v_ek|, G_he = sum_k |g_hk v_ek|,
 *    e_s = c 2^-23 (fp32 sums of c terms, either order) and a margin of 1.25 on each bound:
 *      z      |dz_he|    <= tz_he = (u + e_s) Z_he
 *      lse    |dlse_h|   <= max_e tz_he
 *      o      |do_hk|    <= sum_e p_he |v_ek| (2 max_e tz_he + u + n 2^-23)
 *      P      |dP_he|    <= p_he tz_he
 *      dq     |ddq_hk|   <= scale sum_e (d_he + u |dz_he|) |v_ek|,
 *             d_he = p_he (|dp_he - D_h| (tz_he + 2^-9) + (u + e_s) G_he)   (the error of bf16 dz)
 *      dV     |ddV_ek|   <= sum_h p_he (tz_he + u) |g_hk| + scale (d_he + u |dz_he|) |q_hk|
 *      psum   |dpsum_e|  <= sum_h p_he tz_he;  dsink exact (the same fp32 formula).
 *    An unrounded operand passes these; a wrong index, transpose, head or entry is off by O(1).
 * 2. Levels above the reference against the bf16 reference: the same products of the same bf16
 *    values, only the order of the fp32 sums and the exp (a vector polynomial, about 1 ulp) differ
 *    (and, through them, rare one-ulp flips when p or dz is rounded to bf16), so each error must be
 *    within a quarter of the bound above (measured: at most 0.06 of that), and the
 *    relative L2 distance of every output below 2e-3 (against fp32 the bf16 rounding alone gives
 *    about 1e-3 .. 1e-2).
 * 3. Two calls give the same bits (the second with the entries, q and g passed already rounded: Vb,
 *    part of it consecutive rows, which the tile leaves read in place, and qb, gb, with the backward's
 *    fp32 q and g NULL); the scratch guard is intact.
 * 4. The indexer scores dots_bf16 (rows rounded to bf16, bf16 keys, fp32 sums) at every level
 *    against an fp64 product of the rounded-on-entry keys and the unrounded rows: |err| <= 1.25
 *    (2^-9 + c 2^-23) sum_k |a_k K_k|, and against the reference within a quarter of that; with and
 *    without an index list, scratch guard intact. The top-k of scores sum_h w_h ReLU(.) computed in
 *    bf16 differs from the fp64 one only by entries whose fp64 score lies within twice the largest
 *    score bound of the k-th largest (docs/precision.md: the indexer's top-k in bf16 mode).
 * 5. The key side by blocks of queries (sattn_bwd_window_bf16) at every level against the fp32 key
 *    side called query by query (within section 1's dV bound, summed over the queries that see each
 *    entry), the optimised levels against the reference (a quarter of it), the entries split
 *    between two calls against one call (the same bits), the scratch guard (window_case below).
 * 6. copy_nt and cvt_bf16_nt (writes around the cache) at every table: memcpy's and
 *    trex_f32_to_bf16's bits at every misalignment, nothing written outside the range.
 * 7. The forward and the query side by blocks of queries (sattn_fwd_block_bf16,
 *    sattn_bwd_query_block_bf16) at every level against the same level's per-query entries on each
 *    query's visible entries: lse and dsink the same bits, o and dq within the fp32 rounding of a
 *    regrouped sum over the entries, the reference level the per-query bits exactly; with and
 *    without the window in the pair layout, a query that sees nothing, scratch guard (block_case).
 * 8. The query side and the key side in one call: per query (sattn_bwd_query_keys_bf16) at every
 *    level against the same level's two calls (sattn_bwd_query_bf16 over all entries, then
 *    sattn_bwd_entries_bf16 over the entries from n0 on): dq, dsink, P, the dV rows and psum the same
 *    bits; with and without the window in the pair layout, n0 = 0 and n0 = n, scratch guard
 *    (qkeys_case); per block (sattn_bwd_query_block_keys_bf16) against the block query side and two
 *    sattn_bwd_window_bf16 calls (the window ranges, the compressed ranges): the same bits (in
 *    block_case).
 *
 * `test_attn_bf16 --bench [reps]` instead times the fp32 entries of the best level and the bf16 entries
 * of every level on dsv4-bench's shapes (16 heads of 512, 256 entries per query in the forward and the
 * query side, 2, 4, 8, 16 and 128 per key-side call), in CPU time of the calling thread (medians;
 * docs/perf.md). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include "rand_fill.h"
#include "kernels/fused.h"
#include "fused_levels.h"
#include "trex/tensor.h"

/* worst ratio |x - r| / bound (bound + tiny), and relative L2 of x - r */
typedef struct cmp {
    double worst, rel;
} cmp;

static cmp compare(const float *x, const float *r, const double *bound, int64_t n)
{
    cmp c = {0.0, 0.0};
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)x[i] - (double)r[i]);
        const double q = d / (bound[i] + 1e-30);
        if (!(q <= c.worst)) /* NaN propagates as a failure */
            c.worst = q;
        num += d * d;
        den += (double)r[i] * r[i];
    }
    c.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return c;
}

typedef struct shape_data {
    int64_t n, H, c;
    float scale;
    float *pool, *q, *g, *sink, *D, *dpool0;
    const float **V;
    /* fp32 reference outputs */
    float *o, *lse, *z, *dq, *ds, *P, *ps, *dpool;
    /* bounds (section 1 of the file comment) */
    double *bz, *blse, *bo, *bP, *bdq, *bdV, *bps;
} shape_data;

static double *xmalloc_d(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static void shape_init(shape_data *s, int64_t n, int64_t H, int64_t c, float qamp)
{
    const trex_fused_table *r = trex_fused_for(TREX_ISA_REF);
    s->n = n, s->H = H, s->c = c;
    s->scale = 1.0f / sqrtf((float)c);
    const int64_t rows = n + 5;
    s->pool = xmalloc_f(rows * c), s->q = xmalloc_f(H * c), s->g = xmalloc_f(H * c);
    s->sink = xmalloc_f(H), s->D = xmalloc_f(H), s->dpool0 = xmalloc_f(n * c);
    s->V = malloc((size_t)(n + 1) * sizeof *s->V);
    if (!s->V)
        exit(2);
    fill(s->pool, rows * c, 2.0f);
    fill(s->q, H * c, 1.5f * qamp);
    fill(s->g, H * c, 1.0f);
    fill(s->sink, H, 1.0f);
    fill(s->dpool0, n * c, 0.5f);
    for (int64_t e = 0; e < n; e++) /* scattered, shuffled */
        s->V[e] = s->pool + ((e * 7 + 2) % rows) * c;
    s->o = xmalloc_f(H * c), s->lse = xmalloc_f(H), s->z = xmalloc_f(H * n);
    s->dq = xmalloc_f(H * c), s->ds = xmalloc_f(H), s->P = xmalloc_f(H * n), s->ps = xmalloc_f(n);
    s->dpool = xmalloc_f(n * c);
    float *ws = xmalloc_f(TREX_FUSED_SATTN_WS(n, H));
    r->sattn_fwd(s->o, s->lse, s->z, ws, s->q, s->V, n, H, c, s->sink, s->scale);
    for (int64_t h = 0; h < H; h++)
        s->D[h] = r->dot(s->g + h * c, s->o + h * c, c);
    r->sattn_bwd_query(s->dq, s->ds, s->P, ws, s->g, s->q, s->V, n, H, c, s->sink, s->scale,
                       s->lse, s->D);
    memcpy(s->dpool, s->dpool0, (size_t)(n * c) * sizeof(float));
    float **dV = malloc((size_t)(n + 1) * sizeof *dV);
    if (!dV)
        exit(2);
    for (int64_t e = 0; e < n; e++)
        dV[e] = s->dpool + e * c;
    r->sattn_bwd_entries(dV, s->ps, ws, s->V, n, s->q, s->g, H, c, s->scale, s->lse, s->D);
    free(dV);
    free(ws);

    /* the bounds, in double from the fp32 reference's values */
    const double u = 1.0 / 256.0, es = (double)c / 8388608.0, m = 1.25, sc = s->scale;
    s->bz = xmalloc_d(H * n), s->blse = xmalloc_d(H), s->bo = xmalloc_d(H * c);
    s->bP = xmalloc_d(H * n), s->bdq = xmalloc_d(H * c), s->bdV = xmalloc_d(n * c);
    s->bps = xmalloc_d(n);
    double *dz = xmalloc_d(H * n), *dd = xmalloc_d(H * n);
    for (int64_t h = 0; h < H; h++) {
        const float *qh = s->q + h * c, *gh = s->g + h * c;
        double tzmax = 0.0;
        for (int64_t e = 0; e < n; e++) {
            double za = 0.0, ga = 0.0, dp = 0.0;
            for (int64_t k = 0; k < c; k++) {
                za += fabs((double)qh[k] * s->V[e][k]);
                ga += fabs((double)gh[k] * s->V[e][k]);
                dp += (double)gh[k] * s->V[e][k];
            }
            const double tz = (u + es) * sc * za * m;
            const double p = s->P[h * n + e];
            s->bz[h * n + e] = tz + 1e-6 * fabs(s->z[h * n + e]);
            s->bP[h * n + e] = p * tz * m + 1e-7 * p + 1e-37; /* exp's clamp at -88 */
            tzmax = tz > tzmax ? tz : tzmax;
            dz[h * n + e] = p * (dp - s->D[h]);
            dd[h * n + e] = p * (fabs(dp - s->D[h]) * (tz + u / 2) + (u + es) * ga) * m;
        }
        s->blse[h] = tzmax + 1e-6 * (1.0 + fabs(s->lse[h]));
        for (int64_t k = 0; k < c; k++) {
            double bo = 0.0, bq = 0.0;
            for (int64_t e = 0; e < n; e++) {
                const double av = fabs((double)s->V[e][k]);
                bo += s->P[h * n + e] * av;
                bq += (dd[h * n + e] + u * fabs(dz[h * n + e])) * av;
            }
            s->bo[h * c + k] = bo * (2 * tzmax + u + (double)n / 8388608.0) * m + 1e-6 *
                               fabs(s->o[h * c + k]);
            s->bdq[h * c + k] = sc * bq * m + 1e-6 * fabs(s->dq[h * c + k]);
        }
    }
    for (int64_t e = 0; e < n; e++) {
        double bp = 0.0;
        for (int64_t h = 0; h < H; h++)
            bp += s->P[h * n + e] * (s->bz[h * n + e]);
        s->bps[e] = bp * m + 1e-6 * fabs(s->ps[e]);
        for (int64_t k = 0; k < c; k++) {
            double b = 0.0;
            for (int64_t h = 0; h < H; h++) {
                const double p = s->P[h * n + e];
                b += p * (s->bz[h * n + e] + u) * fabs((double)s->g[h * c + k]) +
                     sc * (dd[h * n + e] + u * fabs(dz[h * n + e])) * fabs((double)s->q[h * c + k]);
            }
            s->bdV[e * c + k] = b * m + 2e-7 * fabs(s->dpool[e * c + k]);
        }
    }
    free(dz), free(dd);
}

static void shape_free(shape_data *s)
{
    free(s->pool), free(s->q), free(s->g), free(s->sink), free(s->D), free(s->dpool0), free(s->V);
    free(s->o), free(s->lse), free(s->z), free(s->dq), free(s->ds), free(s->P), free(s->ps);
    free(s->dpool), free(s->bz), free(s->blse), free(s->bo), free(s->bP), free(s->bdq);
    free(s->bdV), free(s->bps);
}

/* The outputs of one level's bf16 entries on one shape. */
typedef struct outs {
    float *o, *lse, *z, *dq, *ds, *P, *ps, *dpool;
} outs;

static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static const float GUARD = -12345.678f;

/* The index in lv of the level whose bits level l must give, -1 for none (or where this CPU does not
 * run it): avx2's tile products and 16-lane vectors are the avx512f level's operations in its order
 * (kernels/x86/avx2/attn.c). */
static int twin(const trex_fused_table *const *lv, int nl, int l)
{
    if (lv[l]->isa != TREX_ISA_AVX2)
        return -1;
    for (int j = 0; j < nl; j++)
        if (lv[j]->isa == TREX_ISA_AVX512F)
            return j;
    return -1;
}

static bool outs_same(const outs *x, const outs *r, int64_t n, int64_t H, int64_t c)
{
    return same_bits(x->o, r->o, H * c) && same_bits(x->lse, r->lse, H) && same_bits(x->z, r->z, H * n) &&
           same_bits(x->P, r->P, H * n) && same_bits(x->dq, r->dq, H * c) && same_bits(x->ds, r->ds, H) &&
           same_bits(x->ps, r->ps, n) && same_bits(x->dpool, r->dpool, n * c);
}

/* len floats of x at *dst, which moves past them (a level's outputs kept one after another) */
static void keep_append(float **dst, const float *x, int64_t len)
{
    memcpy(*dst, x, (size_t)len * sizeof *x);
    *dst += len;
}

/* Each level with a twin whose kept outputs (len floats; NULL where a level has none) are its twin's
 * bits; then frees them. what: the entry and the shape. */
static void check_twins(const trex_fused_table *const *lv, int nl, float **keep, int64_t len, const char *what)
{
    for (int l = 0; l < nl; l++) {
        const int tw = twin(lv, nl, l);
        if (tw >= 0 && keep[l] && keep[tw])
            CHECK(same_bits(keep[l], keep[tw], len), "%s %s: not the %s level's bits", lv[l]->sattn_bf16_name,
                  what, lv[tw]->sattn_bf16_name);
    }
    for (int l = 0; l < nl; l++)
        free(keep[l]);
}

/* One level's outputs into x; with `pairs`, the forward and the query side also get the first
 * entries as a window in the pair layout (their output products then read it in place). */
static void run_level(const trex_fused_table *t, const shape_data *s, outs *x, int *guard_ok,
                      int *repeat_ok, bool pairs)
{
    const int64_t n = s->n, H = s->H, c = s->c, wsn = TREX_FUSED_SATTN_BF16_WS(n, H, c);
    /* misaligned by one float, 64 guard floats after it */
    float *wbuf = xmalloc_f(wsn + 1 + 64), *ws = wbuf + 1;
    for (int64_t i = 0; i < 64; i++)
        ws[wsn + i] = GUARD;
    x->o = xmalloc_f(H * c), x->lse = xmalloc_f(H), x->z = xmalloc_f(H * n);
    x->dq = xmalloc_f(H * c), x->ds = xmalloc_f(H), x->P = xmalloc_f(H * n), x->ps = xmalloc_f(n);
    x->dpool = xmalloc_f(n * c);
    float *o2 = xmalloc_f(H * c), *lse2 = xmalloc_f(H), *z2 = xmalloc_f(H * n);
    float *dq2 = xmalloc_f(H * c), *ds2 = xmalloc_f(H), *ps2 = xmalloc_f(n), *dp2 = xmalloc_f(n * c);
    float *pf = xmalloc_f(H * n), *pf3 = xmalloc_f(H * n), *o3 = xmalloc_f(H * c), *lse3 = xmalloc_f(H);
    float **dV = malloc((size_t)(n + 1) * sizeof *dV);
    uint16_t *vrows = malloc((size_t)(n * c + 1) * sizeof(uint16_t));
    const uint16_t **Vb = malloc((size_t)(n + 1) * sizeof *Vb);
    uint16_t *qb = malloc((size_t)(H * c) * sizeof(uint16_t)), *gb = malloc((size_t)(H * c) * 2);
    if (!dV || !vrows || !Vb || !qb || !gb)
        exit(2);
    /* the rounded entries: consecutive rows for the first 16 * (n / 32) entries (the tile leaves read
     * full blocks of such rows in place), the rest in reverse order (copied) */
    const int64_t ncons = 16 * (n / 32);
    for (int64_t e = 0; e < n; e++) {
        const int64_t row = e < ncons ? e : n - 1 - (e - ncons);
        for (int64_t i = 0; i < c; i++)
            vrows[row * c + i] = to_bf16(s->V[e][i]);
        Vb[e] = vrows + row * c;
    }
    for (int64_t i = 0; i < H * c; i++) {
        qb[i] = to_bf16(s->q[i]);
        gb[i] = to_bf16(s->g[i]);
    }
    /* the first nw entries also as rows first .. first + nw - 1 of an array in the pair layout
     * (kernels/fused.h trex_fused_pairs), the other rows (before, and 32 past the last) finite values
     * that must get weight 0; first odd for odd n, so that entry 0 is the second of its pair. The
     * in-place window moves the entries inside the output product's 32-entry steps, whose sums the
     * tile unit does not add in entry order: the same values within fp32 rounding, not the same bits
     * (main checks them against the bounds) */
    const int64_t nw = n % 3 == 0 ? n : n - n / 4, first = n % 2, prow = first + nw + 33;
    uint16_t *prow_buf = malloc((size_t)((prow + 1) / 2 * 2 * c + 1) * sizeof(uint16_t));
    if (!prow_buf)
        exit(2);
    for (int64_t r = 0; r < (prow + 1) / 2 * 2; r++) {
        const int64_t e = r - first;
        const bool in = e >= 0 && e < nw;
        const float *src = n == 0 ? NULL : in ? s->V[e] : s->V[(r * 7 + 3) % n];
        for (int64_t i = 0; i < c; i++) /* row r: dims chunk i / 16, half r % 2 of each word */
            prow_buf[(r / 2) * 2 * c + (i / 16) * 32 + 2 * (i % 16) + r % 2] =
                src ? to_bf16(src[i] * (in ? 1.0f : 3.0f)) : 0;
    }
    const trex_fused_pairs win = {prow_buf, first, nw};
    *repeat_ok = 1;
    for (int rep = 0; rep < 2; rep++) {
        float *o = rep ? o2 : x->o, *lse = rep ? lse2 : x->lse, *z = rep ? z2 : x->z;
        float *dq = rep ? dq2 : x->dq, *ds = rep ? ds2 : x->ds, *ps = rep ? ps2 : x->ps;
        float *dpool = rep ? dp2 : x->dpool;
        /* the second time: the entries, q and g pre-rounded */
        const uint16_t *const *vb = rep ? Vb : NULL;
        const uint16_t *qr = rep ? qb : NULL, *gr = rep ? gb : NULL;
        const trex_fused_pairs *wp = pairs ? &win : NULL;
        /* the second time also the probabilities P */
        t->sattn_fwd_bf16(o, lse, z, rep ? pf : NULL, ws, s->q, qr, s->V, vb, wp, n, H, c, s->sink,
                          s->scale);
        /* the backward takes the fp32 reference's lse and D, so each entry is checked on its own */
        t->sattn_bwd_query_bf16(dq, ds, rep ? NULL : x->P, ws, rep ? NULL : s->g, gr, s->q, qr,
                                s->V, vb, wp, n, H, c, s->sink, s->scale, s->lse, s->D);
        memcpy(dpool, s->dpool0, (size_t)(n * c) * sizeof(float));
        for (int64_t e = 0; e < n; e++)
            dV[e] = dpool + e * c;
        t->sattn_bwd_entries_bf16(dV, ps, ws, s->V, vb, n, rep ? NULL : s->q, qr,
                                  rep ? NULL : s->g, gr, H, c, s->scale, s->lse, s->D);
    }
    /* and once more without z: the same o, lse and P */
    t->sattn_fwd_bf16(o3, lse3, NULL, pf3, ws, s->q, qb, s->V, Vb, pairs ? &win : NULL, n, H, c,
                      s->sink, s->scale);
    *repeat_ok = same_bits(o2, x->o, H * c) && same_bits(lse2, x->lse, H) &&
                 same_bits(z2, x->z, H * n) && same_bits(dq2, x->dq, H * c) &&
                 same_bits(ds2, x->ds, H) && same_bits(ps2, x->ps, n) &&
                 same_bits(dp2, x->dpool, n * c) && same_bits(o3, x->o, H * c) &&
                 same_bits(lse3, x->lse, H) && same_bits(pf3, pf, H * n);
    /* the forward's P against the fp32 reference's exp(z - lse): the error of its z and of its own
     * lse (each within their bounds), with a factor 2 for the exp */
    int pbad = 0;
    for (int64_t h = 0; h < H; h++)
        for (int64_t e = 0; e < n; e++) {
            const int64_t k = h * n + e;
            const double p = s->P[k], b = 2.0 * p * (s->bz[k] + s->blse[h]) + 1e-7 * p + 1e-37;
            pbad += !(fabs((double)pf[k] - p) <= b);
        }
    CHECK(pbad == 0, "%s forward P: %d of %lld outside the bound n=%lld H=%lld c=%lld", t->name, pbad,
          (long long)(H * n), (long long)n, (long long)H, (long long)c);
    free(pf), free(pf3), free(o3), free(lse3);
    free(prow_buf);
    *guard_ok = 1;
    for (int64_t i = 0; i < 64; i++)
        *guard_ok &= ws[wsn + i] == GUARD;
    free(wbuf), free(o2), free(lse2), free(z2), free(dq2), free(ds2), free(ps2), free(dp2), free(dV);
    free(vrows), free(Vb), free(qb), free(gb);
}

static void outs_free(outs *x)
{
    free(x->o), free(x->lse), free(x->z), free(x->dq), free(x->ds), free(x->P), free(x->ps);
    free(x->dpool);
}

static double worst_seen[2]; /* largest error / bound: against fp32, against the bf16 reference */

/* Every output against reference r within bound * frac; rel: the L2 limit (0: none). */
static void check_outputs(const char *lvl, const char *what, const shape_data *s, const outs *x,
                          const outs *r, double frac, double rel, int slot)
{
    const int64_t n = s->n, H = s->H, c = s->c;
    struct {
        const char *name;
        const float *a, *b;
        const double *bound;
        int64_t len;
    } items[] = {
        {"o", x->o, r->o, s->bo, H * c},       {"lse", x->lse, r->lse, s->blse, H},
        {"z", x->z, r->z, s->bz, H * n},       {"P", x->P, r->P, s->bP, H * n},
        {"dq", x->dq, r->dq, s->bdq, H * c},   {"psum", x->ps, r->ps, s->bps, n},
        {"dV", x->dpool, r->dpool, s->bdV, n * c},
    };
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        cmp cm = compare(items[i].a, items[i].b, items[i].bound, items[i].len);
        const double w = cm.worst / frac;
        if (w > worst_seen[slot])
            worst_seen[slot] = w;
        CHECK(w <= 1.0, "%s %s %s n=%lld H=%lld c=%lld: error / bound %.3g", lvl, what,
              items[i].name, (long long)n, (long long)H, (long long)c, w);
        /* the dV rows carry their random starting values: compare the change, not the sum */
        if (rel > 0 && strcmp(items[i].name, "dV") != 0)
            CHECK(cm.rel <= rel, "%s %s %s n=%lld H=%lld c=%lld: relative L2 %.3g", lvl, what,
                  items[i].name, (long long)n, (long long)H, (long long)c, cm.rel);
    }
    CHECK(same_bits(x->ds, r->ds, H), "%s %s dsink n=%lld H=%lld c=%lld", lvl, what,
          (long long)n, (long long)H, (long long)c);
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
        printf("%-12s %-24s %10.2f us  %7.1f GFLOP/s\n", name, (label), 1e6 * tm_[reps / 2], \
               (flops) / tm_[reps / 2] * 1e-9);                                              \
    } while (0)

static int bench(int reps)
{
    const int64_t H = 16, c = 512, n = 256, nk = 16, nw = 128;
    float *pool = xmalloc_f(n * c), *q = xmalloc_f(H * c), *g = xmalloc_f(H * c), *sink = xmalloc_f(H);
    float *ws = xmalloc_f(TREX_FUSED_SATTN_BF16_WS(n, H, c)), *o = xmalloc_f(H * c);
    float *lse = xmalloc_f(H), *z = xmalloc_f(H * n), *D = xmalloc_f(H), *dq = xmalloc_f(H * c);
    float *ds = xmalloc_f(H), *P = xmalloc_f(H * n), *ps = xmalloc_f(n), *dpool = xmalloc_f(nw * c);
    const float *V[256];
    float *dV[16], *dVw[128];
    fill(pool, n * c, 2.0f), fill(q, H * c, 1.5f), fill(g, H * c, 1.0f), fill(sink, H, 1.0f);
    fill(dpool, nw * c, 0.1f);
    for (int64_t e = 0; e < n; e++)
        V[e] = pool + e * c;
    for (int64_t e = 0; e < nk; e++)
        dV[e] = dpool + e * c;
    for (int64_t e = 0; e < nw; e++)
        dVw[e] = dpool + e * c;
    const float scale = 1.0f / sqrtf((float)c);
    printf("median CPU time per call, %d repetitions (H %lld, c %lld, n %lld; key side 2 .. %lld "
           "entries); GFLOP/s counts the products (2 per multiply-add)\n",
           reps, (long long)H, (long long)c, (long long)n, (long long)nw);
    /* the fp32 entries of the best level, then the bf16 entries of each distinct bf16 core */
    const trex_fused_table *best = trex_fused_for(TREX_ISA_AMX), *lv[TREX_ISA_COUNT];
    const int nlv = fused_levels(trex_fused_for(TREX_ISA_REF), lv);
    for (int k = -1; k < nlv; k++) {
        const trex_fused_table *t = k < 0 ? best : lv[k];
        bool seen = k >= 0 && !t->sattn_fwd_bf16;
        for (int i = 0; i < k; i++)
            seen |= lv[i]->sattn_fwd_bf16 == t->sattn_fwd_bf16;
        if (seen)
            continue;
        const bool b16 = k >= 0;
        char name[32];
        snprintf(name, sizeof name, "%s %s", b16 ? t->sattn_bf16_name : best->name,
                 b16 ? "bf16" : "fp32");
        /* the fp32 entries, or the bf16 ones with the entries rounded per call (Vb NULL) */
#define f(o, lse, z, ws, q, V, ...)                                                           \
    (b16 ? t->sattn_fwd_bf16(o, lse, z, NULL, ws, q, NULL, V, NULL, NULL, __VA_ARGS__)        \
         : best->sattn_fwd(o, lse, z, ws, q, V, __VA_ARGS__))
#define bq(dq, ds, P, ws, g, q, V, ...)                                                       \
    (b16 ? t->sattn_bwd_query_bf16(dq, ds, P, ws, g, NULL, q, NULL, V, NULL, NULL,          \
                                   __VA_ARGS__)                                               \
         : best->sattn_bwd_query(dq, ds, P, ws, g, q, V, __VA_ARGS__))
#define be(dV, ps, ws, V, n_, q_, g_, ...)                                                    \
    (b16 ? t->sattn_bwd_entries_bf16(dV, ps, ws, V, NULL, n_, q_, NULL, g_, NULL, __VA_ARGS__)  \
         : best->sattn_bwd_entries(dV, ps, ws, V, n_, q_, g_, __VA_ARGS__))
        f(o, lse, z, ws, q, V, n, H, c, sink, scale);
        for (int64_t h = 0; h < H; h++)
            D[h] = best->dot(g + h * c, o + h * c, c);
        double flops = 4.0 * H * n * c;
        BENCH("sattn_fwd n=256", 10, f(o, lse, z, ws, q, V, n, H, c, sink, scale));
        flops = 6.0 * H * n * c;
        BENCH("sattn_bwd_query n=256", 10,
              bq(dq, ds, P, ws, g, q, V, n, H, c, sink, scale, lse, D));
        flops = 8.0 * H * nk * c;
        flops = 8.0 * H * 2 * c;
        BENCH("sattn_bwd_entries n=2", 100, be(dV, ps, ws, V, 2, q, g, H, c, scale, lse, D));
        flops = 8.0 * H * 4 * c;
        BENCH("sattn_bwd_entries n=4", 100, be(dV, ps, ws, V, 4, q, g, H, c, scale, lse, D));
        flops = 8.0 * H * 8 * c;
        BENCH("sattn_bwd_entries n=8", 100, be(dV, ps, ws, V, 8, q, g, H, c, scale, lse, D));
        flops = 8.0 * H * nk * c;
        BENCH("sattn_bwd_entries n=16", 100, be(dV, ps, ws, V, nk, q, g, H, c, scale, lse, D));
        flops = 8.0 * H * nw * c;
        BENCH("sattn_bwd_entries n=128", 20, be(dVw, ps, ws, V, nw, q, g, H, c, scale, lse, D));
    }
#undef f
#undef bq
#undef be
    free(pool), free(q), free(g), free(sink), free(ws), free(o), free(lse), free(z), free(D);
    free(dq), free(ds), free(P), free(ps), free(dpool);
    return 0;
}


/* ---- 4. indexer scores ---------------------------------------------------------------------- */

static int cmp_desc(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

/* fp64 dot of row a (unrounded) with the bf16 key k, and the bound of section 4 */
static double dot_bound(double *mag, const float *a, const uint16_t *k, int64_t c)
{
    double ex = 0.0, m = 0.0;
    for (int64_t i = 0; i < c; i++) {
        ex += (double)a[i] * from_bf16(k[i]);
        m += fabs((double)a[i] * from_bf16(k[i]));
    }
    *mag = 1.25 * (ldexp(1.0, -9) + (double)c * ldexp(1.0, -23)) * m;
    return ex;
}

/* One shape of dots_bf16 at every level: the error bound against fp64, a quarter of it against the
 * reference (level 0), the scratch guard. Keeps the largest ratios in worst[0..1]. */
static void dots_case(const trex_fused_table *const *lv, int nl, int64_t n, int64_t R, int64_t c,
                      int use_idx, double *worst)
{
    const int64_t lda = c + 3, nrows = (n + 15) / 16 * 16 + 7, wsn = TREX_FUSED_DOTS_BF16_WS(n, R, c);
    float *A = xmalloc_f(R * lda), *out = xmalloc_f(R * n), *out0 = xmalloc_f(R * n);
    float *ws = xmalloc_f(wsn + 17), *wsm = ws + 1; /* misaligned, 16 guard floats after it */
    uint16_t *Kb = malloc((size_t)(nrows * c) * sizeof(uint16_t));
    int64_t *idx = malloc((size_t)(n + 1) * sizeof(int64_t));
    if (!Kb || !idx)
        exit(2);
    fill(A, R * lda, 1.0f);
    for (int64_t i = 0; i < nrows * c; i++)
        Kb[i] = to_bf16(2.0f * frand());
    for (int64_t e = 0; e < n; e++)
        idx[e] = (e * 7 + 3) % nrows; /* scattered, repeats allowed */
    for (int l = 0; l < nl; l++) {
        const trex_fused_table *t = lv[l];
        for (int64_t i = 0; i < 16; i++)
            wsm[wsn + i] = GUARD;
        t->dots_bf16(out, wsm, A, lda, R, Kb, use_idx ? idx : NULL, n, c);
        int guard = 1;
        for (int64_t i = 0; i < 16; i++)
            guard &= wsm[wsn + i] == GUARD;
        CHECK(guard, "dots_bf16 %s scratch overrun n=%lld R=%lld c=%lld", t->name, (long long)n,
              (long long)R, (long long)c);
        int bad = 0, bad_ref = 0;
        for (int64_t r = 0; r < R; r++)
            for (int64_t e = 0; e < n; e++) {
                double b;
                const double ex = dot_bound(&b, A + r * lda, Kb + (use_idx ? idx[e] : e) * c, c);
                const double q = fabs(out[r * n + e] - ex) / (b + 1e-30);
                const double qr = l > 0 ? fabs(out[r * n + e] - out0[r * n + e]) / (b + 1e-30) : 0;
                worst[0] = q > worst[0] ? q : worst[0];
                worst[1] = qr > worst[1] ? qr : worst[1];
                bad += !(q <= 1.0);
                bad_ref += !(qr <= 0.25);
            }
        CHECK(bad == 0 && bad_ref == 0, "dots_bf16 %s n=%lld R=%lld c=%lld idx=%d: %d scores out of "
              "the bound, %d out of a quarter of it against the reference", t->name, (long long)n,
              (long long)R, (long long)c, use_idx, bad, bad_ref);
        const int tw = twin(lv, nl, l);
        if (tw >= 0) {
            float *o2 = xmalloc_f(R * n);
            lv[tw]->dots_bf16(o2, wsm, A, lda, R, Kb, use_idx ? idx : NULL, n, c);
            CHECK(same_bits(out, o2, R * n), "dots_bf16 %s n=%lld R=%lld c=%lld idx=%d: not the %s "
                  "level's bits", t->name, (long long)n, (long long)R, (long long)c, use_idx,
                  lv[tw]->name);
            free(o2);
        }
        if (l == 0)
            memcpy(out0, out, (size_t)(R * n) * sizeof(float));
    }
    free(A), free(out), free(out0), free(Kb), free(idx), free(ws);
}

static void test_dots_bf16(const trex_fused_table *const *lv, int nl)
{
    const int64_t ns[] = {0, 1, 15, 16, 17, 63, 64, 65, 200}, Rs[] = {1, 3, 16, 20},
                  cs[] = {20, 32, 48, 128};
    double worst[2] = {0.0, 0.0};
    for (size_t ic = 0; ic < sizeof cs / sizeof cs[0]; ic++)
        for (size_t ir = 0; ir < sizeof Rs / sizeof Rs[0]; ir++)
            for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++)
                for (int use_idx = 0; use_idx < 2; use_idx++)
                    dots_case(lv, nl, ns[in], Rs[ir], cs[ic], use_idx, worst);
    printf("dots_bf16: largest error / bound %.3f against fp64, %.3f against the reference\n",
           worst[0], worst[1]);

    /* top-k of the indexer scores: 16 heads of 128, 300 entries, k 64 */
    const int64_t R = 16, c = 128, n = 300, k = 64;
    float *A = xmalloc_f(R * c), *out = xmalloc_f(R * n);
    float *ws = xmalloc_f(TREX_FUSED_DOTS_BF16_WS(n, R, c));
    uint16_t *Kb = malloc((size_t)((n + 16) * c) * sizeof(uint16_t));
    double *s64 = xmalloc_d(n), *sb = xmalloc_d(n), *bnd = xmalloc_d(n), *srt = xmalloc_d(n);
    float hw[16];
    fill(A, R * c, 1.0f);
    for (int64_t h = 0; h < R; h++)
        hw[h] = 0.5f + 0.5f * frand();
    for (int64_t i = 0; i < (n + 16) * c; i++)
        Kb[i] = to_bf16(frand());
    for (int64_t e = 1; e < n; e += 2) { /* near ties: each odd key is its predecessor, one ulp off */
        memcpy(Kb + e * c, Kb + (e - 1) * c, (size_t)c * sizeof(uint16_t));
        Kb[e * c + e % c] ^= 1;
    }
    const trex_fused_table *t = lv[nl - 1];
    if (t->dots_bf16) {
        t->dots_bf16(out, ws, A, c, R, Kb, NULL, n, c);
        double bmax = 0.0;
        for (int64_t e = 0; e < n; e++) {
            s64[e] = sb[e] = bnd[e] = 0.0;
            for (int64_t h = 0; h < R; h++) {
                double b;
                const double ex = dot_bound(&b, A + h * c, Kb + e * c, c);
                s64[e] += ex > 0 ? hw[h] * ex : 0.0;
                sb[e] += out[h * n + e] > 0 ? hw[h] * (double)out[h * n + e] : 0.0;
                bnd[e] += fabs(hw[h]) * b;
            }
            bmax = bnd[e] > bmax ? bnd[e] : bmax;
        }
        memcpy(srt, s64, (size_t)n * sizeof(double));
        qsort(srt, (size_t)n, sizeof(double), cmp_desc);
        const double kth64 = srt[k - 1];
        memcpy(srt, sb, (size_t)n * sizeof(double));
        qsort(srt, (size_t)n, sizeof(double), cmp_desc);
        const double kthb = srt[k - 1];
        int swaps = 0, bad = 0;
        for (int64_t e = 0; e < n; e++) {
            const int in64 = s64[e] >= kth64, inb = sb[e] >= kthb;
            if (in64 != inb) {
                swaps++;
                bad += fabs(s64[e] - kth64) > 2.0 * bmax;
            }
        }
        CHECK(bad == 0, "indexer top-k in bf16: %d of %d changed entries lie farther than twice the "
              "score bound (%.3g) from the k-th score", bad, swaps, bmax);
        printf("indexer top-k (%lld of %lld) in bf16 (%s): %d entries changed, each within %.3g of the "
               "k-th score %.4g\n", (long long)k, (long long)n, t->name, swaps, 2.0 * bmax, kth64);
    }
    free(A), free(out), free(ws), free(Kb), free(s64), free(sb), free(bnd), free(srt);
}

/* 5. The key side by blocks of nq queries (sattn_bwd_window_bf16) on n consecutive entries, query b at
 * row n - nq + b seeing the W rows up to its own (query 1 none at all when nq >= 3): every level
 * against the fp32 reference entry called query by query, within 2^-7 M + 1e-6 |dV| where M =
 * sum over the visible terms of |p_bhe g_bhk| + scale |dz_bhe q_bhk| (q, g and the entries are
 * bf16 values here, so only the coefficients p and scale dz are rounded: 2^-9 each, a margin of 2 on
 * the sum of the two), the optimised levels against the reference level within a quarter of that;
 * the entries split between two calls at s give the same bits as one call (an entry's result depends
 * only on the entry and the block); the scratch guard stays intact. */
static double win_worst[2]; /* as worst_seen, for the window key side */

static void window_case(const trex_fused_table *const *lv, int nl, int64_t n, int64_t nq, int64_t H,
                        int64_t c, int64_t W)
{
    const trex_fused_table *r = trex_fused_for(TREX_ISA_REF);
    const int64_t hc = H * c;
    const float scale = 1.0f / sqrtf((float)c);
    float *V = xmalloc_f(n * c), *q = xmalloc_f(nq * hc), *g = xmalloc_f(nq * hc);
    float *sink = xmalloc_f(H), *lse = xmalloc_f(nq * H), *D = xmalloc_f(nq * H);
    float *dp0 = xmalloc_f(n * c), *dref = xmalloc_f(n * c), *o = xmalloc_f(hc);
    float *ps = xmalloc_f(n + 1), *zs = xmalloc_f(H * (n + 1));
    float *wsr = xmalloc_f(TREX_FUSED_SATTN_WS(n + 1, H));
    double *M = xmalloc_d(n * c), *bound = xmalloc_d(n * c);
    uint16_t *vrows = malloc((size_t)(n * c + 1) * 2), *qb = malloc((size_t)(nq * hc) * 2);
    uint16_t *gb = malloc((size_t)(nq * hc) * 2);
    const uint16_t **Vb = malloc((size_t)(n + 1) * sizeof *Vb);
    const float **Vp = malloc((size_t)(n + 1) * sizeof *Vp);
    float **dV = malloc((size_t)(n + 1) * sizeof *dV);
    int64_t *vis = malloc((size_t)(2 * nq) * sizeof *vis), *vis2 = malloc((size_t)(2 * nq) * sizeof *vis2);
    if (!vrows || !qb || !gb || !Vb || !Vp || !dV || !vis || !vis2)
        exit(2);
    fill(V, n * c, 2.0f);
    fill(q, nq * hc, 1.5f);
    fill(g, nq * hc, 1.0f);
    fill(sink, H, 1.0f);
    fill(dp0, n * c, 0.5f);
    for (int64_t i = 0; i < n * c; i++) { /* bf16 values: the rounding on entry is exact */
        vrows[i] = to_bf16(V[i]);
        V[i] = from_bf16(vrows[i]);
    }
    for (int64_t i = 0; i < nq * hc; i++) {
        qb[i] = to_bf16(q[i]), q[i] = from_bf16(qb[i]);
        gb[i] = to_bf16(g[i]), g[i] = from_bf16(gb[i]);
    }
    for (int64_t e = 0; e < n; e++)
        Vb[e] = vrows + e * c, Vp[e] = V + e * c;
    memcpy(dref, dp0, (size_t)(n * c) * sizeof(float));
    for (int64_t b = 0; b < nq; b++) {
        const int64_t t = n - nq + b, lo = t - W + 1 > 0 ? t - W + 1 : 0;
        const bool none = nq >= 3 && b == 1;
        vis[2 * b] = none ? 0 : lo;
        vis[2 * b + 1] = none ? 0 : t + 1 > lo ? t + 1 : lo;
        const int64_t m = vis[2 * b + 1] - vis[2 * b];
        const float *qq = q + b * hc, *gg = g + b * hc;
        float *lb = lse + b * H, *db = D + b * H;
        /* the query's lse and D from the fp32 forward over its entries, then its fp32 key side */
        r->sattn_fwd(o, lb, zs, wsr, qq, Vp + vis[2 * b], m, H, c, sink, scale);
        for (int64_t h = 0; h < H; h++)
            db[h] = r->dot(gg + h * c, o + h * c, c);
        for (int64_t e = 0; e < m; e++)
            dV[e] = dref + (vis[2 * b] + e) * c;
        r->sattn_bwd_entries(dV, ps, wsr, Vp + vis[2 * b], m, qq, gg, H, c, scale, lb, db);
        /* section 1's dV bound, term by term over the queries that see each entry */
        const double u = 1.0 / 256.0, es = (double)c / 8388608.0, mg = 1.25;
        for (int64_t e = vis[2 * b]; e < vis[2 * b + 1]; e++)
            for (int64_t h = 0; h < H; h++) {
                double z = 0.0, dp = 0.0, za = 0.0, ga = 0.0;
                for (int64_t k = 0; k < c; k++) {
                    z += (double)qq[h * c + k] * V[e * c + k];
                    dp += (double)gg[h * c + k] * V[e * c + k];
                    za += fabs((double)qq[h * c + k] * V[e * c + k]);
                    ga += fabs((double)gg[h * c + k] * V[e * c + k]);
                }
                const double p = exp(scale * z - lb[h]), tz = (u + es) * scale * za * mg;
                const double dz = fabs(p * (dp - db[h]));
                const double dd = p * (fabs(dp - db[h]) * (tz + u / 2) + (u + es) * ga) * mg;
                for (int64_t k = 0; k < c; k++)
                    M[e * c + k] += p * (tz + u) * fabs((double)gg[h * c + k]) +
                                    scale * (dd + u * dz) * fabs((double)qq[h * c + k]);
            }
    }
    for (int64_t i = 0; i < n * c; i++)
        bound[i] = 1.25 * M[i] + 2e-7 * fabs(dref[i]) + 1e-30;
    const int64_t wsn = TREX_FUSED_SATTN_WIN_BF16_WS(n, H, c, nq);
    float *wbuf = xmalloc_f(wsn + 1 + 64), *ws = wbuf + 1; /* misaligned, 64 guard floats after */
    float *out[TREX_ISA_COUNT] = {NULL}, *split = xmalloc_f(n * c);
    for (int l = 0; l < nl; l++) {
        const trex_fused_table *t = lv[l];
        if (!t->sattn_bwd_window_bf16)
            continue;
        for (int64_t i = 0; i < 64; i++)
            ws[wsn + i] = GUARD;
        out[l] = xmalloc_f(n * c);
        memcpy(out[l], dp0, (size_t)(n * c) * sizeof(float));
        for (int64_t e = 0; e < n; e++)
            dV[e] = out[l] + e * c;
        t->sattn_bwd_window_bf16(dV, ws, Vb, n, nq, vis, qb, gb, H, c, scale, lse, D);
        const cmp x = compare(out[l], dref, bound, n * c);
        CHECK(x.worst <= 1.0, "%s window key side vs fp32: error %.3g of the bound n=%lld nq=%lld "
              "H=%lld c=%lld", t->sattn_bf16_name, x.worst, (long long)n, (long long)nq,
              (long long)H, (long long)c);
        win_worst[0] = x.worst > win_worst[0] ? x.worst : win_worst[0];
        if (l > 0 && out[0]) {
            double *b4 = xmalloc_d(n * c);
            for (int64_t i = 0; i < n * c; i++)
                b4[i] = 0.25 * bound[i];
            const cmp y = compare(out[l], out[0], b4, n * c);
            CHECK(y.worst <= 1.0, "%s window key side vs the bf16 reference: error %.3g of the "
                  "quarter bound n=%lld nq=%lld H=%lld c=%lld", t->sattn_bf16_name, y.worst,
                  (long long)n, (long long)nq, (long long)H, (long long)c);
            win_worst[1] = y.worst > win_worst[1] ? y.worst : win_worst[1];
            free(b4);
        }
        /* the same entries in two calls, split at s */
        const int64_t sp = n / 3 + 1 < n ? n / 3 + 1 : n;
        memcpy(split, dp0, (size_t)(n * c) * sizeof(float));
        for (int part = 0; part < 2; part++) {
            const int64_t s0 = part ? sp : 0, s1 = part ? n : sp;
            for (int64_t b = 0; b < nq; b++) {
                int64_t lo = vis[2 * b] > s0 ? vis[2 * b] : s0;
                int64_t hi = vis[2 * b + 1] < s1 ? vis[2 * b + 1] : s1;
                lo = lo < s1 ? lo : s1;
                vis2[2 * b] = lo - s0;
                vis2[2 * b + 1] = (hi > lo ? hi : lo) - s0;
            }
            for (int64_t e = s0; e < s1; e++)
                dV[e - s0] = split + e * c;
            t->sattn_bwd_window_bf16(dV, ws, Vb + s0, s1 - s0, nq, vis2, qb, gb, H, c, scale, lse,
                                     D);
        }
        CHECK(same_bits(split, out[l], n * c), "%s window key side: the entries in two calls give "
              "other bits n=%lld nq=%lld H=%lld c=%lld", t->sattn_bf16_name, (long long)n,
              (long long)nq, (long long)H, (long long)c);
        int guard_ok = 1;
        for (int64_t i = 0; i < 64; i++)
            guard_ok &= ws[wsn + i] == GUARD;
        CHECK(guard_ok, "%s window key side: scratch overrun n=%lld nq=%lld H=%lld c=%lld",
              t->sattn_bf16_name, (long long)n, (long long)nq, (long long)H, (long long)c);
    }
    char what[96];
    snprintf(what, sizeof what, "window key side n=%lld nq=%lld H=%lld c=%lld", (long long)n,
             (long long)nq, (long long)H, (long long)c);
    check_twins(lv, nl, out, n * c, what);
    free(split), free(wbuf);
    free(V), free(q), free(g), free(sink), free(lse), free(D), free(dp0), free(dref), free(o);
    free(ps), free(zs), free(wsr), free(M), free(bound), free(vrows), free(qb), free(gb);
    free(Vb), free(Vp), free(dV), free(vis), free(vis2);
}

static void test_window_bf16(const trex_fused_table *const *lv, int nl)
{
    static const int64_t cases[][5] = {
        /* n, nq, H, c, W */
        {1, 1, 1, 32, 4},    {5, 4, 3, 48, 2},    {17, 4, 16, 32, 14}, {40, 3, 20, 48, 38},
        {131, 4, 16, 512, 128}, {70, 5, 16, 64, 66}, {33, 2, 1, 512, 32}, {8, 8, 3, 32, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        window_case(lv, nl, cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4]);
    printf("window key side by query blocks: %zu shapes at %d level(s); largest error / bound %.3f "
           "against fp32, %.3f (of the quarter bound) against the bf16 reference\n",
           sizeof cases / sizeof cases[0], nl, win_worst[0], win_worst[1]);
}

/* 6. copy_nt and cvt_bf16_nt (the layer-wide copies written around the cache) at every table: the
 * bits of memcpy and of trex_f32_to_bf16 (ties, NaN, infinities, subnormals among the values), at
 * every misalignment of 0-17 elements and lengths 0-70, nothing written outside [0, n). */
static void test_nt_entries(const trex_fused_table *const *all, int na)
{
    enum { MAXN = 70, PAD = 24 };
    float src[MAXN + PAD];
    uint16_t hdst[MAXN + 2 * PAD] __attribute__((aligned(64)));
    float fal[MAXN + 2 * PAD] __attribute__((aligned(64)));
    fill(src, MAXN + PAD, 3.0f);
    const uint32_t special[] = {0x7fc00001u, 0xff800000u, 0x7f800000u, 0x00000001u, 0x3f808000u,
                                0x3f818000u, 0x80000000u, 0x7f7fffffu};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        memcpy(&src[5 * i + 1], &special[i], 4);
    int bad = 0;
    for (int l = 0; l < na; l++) {
        const trex_fused_table *t = all[l];
        for (int64_t off = 0; off < 18; off++)
            for (int64_t n = 0; n <= MAXN; n++) {
                for (int64_t i = 0; i < MAXN + 2 * PAD; i++) {
                    fal[i] = GUARD;
                    hdst[i] = 0xabcd;
                }
                t->copy_nt(fal + off, src + (off % 5), n);
                t->cvt_bf16_nt(hdst + off, src + (off % 5), n);
                for (int64_t i = 0; i < MAXN + 2 * PAD; i++) {
                    const bool in = i >= off && i < off + n;
                    const float *sv = src + (off % 5) + (i - off);
                    bad += in ? memcmp(&fal[i], sv, 4) != 0 : memcmp(&fal[i], &GUARD, 4) != 0;
                    bad += in ? hdst[i] != trex_f32_to_bf16(*sv) : hdst[i] != 0xabcd;
                }
            }
    }
    CHECK(bad == 0, "copy_nt / cvt_bf16_nt: %d wrong or stray elements", bad);
    printf("copy_nt, cvt_bf16_nt: %d table(s), lengths 0-%d at 18 offsets\n", na, (int)MAXN);
}

/* 7. Blocks of nq queries over n = nw + ncs entries: nw window rows (consecutive bf16 rows, and the
 * same rows in the pair layout from an odd first row when pairs), then ncs scattered compressed
 * rows; query b sees the window rows [max(0, hi - W), hi), hi = nw - nq + 1 + b, and the first
 * ncs - (nq - 1 - b) compressed ones (query 1 nothing when nq >= 3). Each level's block entries
 * against its own per-query entries (the rows each query sees, listed): lse and dsink the same
 * bits; o and dq within (n + 64) 2^-23 of sum_e |p_he v_ek| (scale sum_e |p_he (dp_he - D_h)| |v_ek|),
 * the fp32 rounding of a sum over the n entries grouped otherwise (the block's columns); the
 * reference level exactly the per-query bits; the scratch guard intact. */
static double blk_worst;

static void block_case(const trex_fused_table *const *lv, int nl, int64_t nw, int64_t ncs,
                       int64_t nq, int64_t H, int64_t c, int64_t W, bool pairs)
{
    const int64_t n = nw + ncs, hc = H * c;
    const float scale = 1.0f / sqrtf((float)c);
    float *V = xmalloc_f(n * c + 1), *q = xmalloc_f(nq * hc), *g = xmalloc_f(nq * hc);
    float *sink = xmalloc_f(H), *D = xmalloc_f(nq * H);
    uint16_t *wrows = malloc((size_t)(nw * c + 1) * 2), *crows = malloc((size_t)(ncs * c + 1) * 2);
    uint16_t *qb = malloc((size_t)(nq * hc) * 2), *gb = malloc((size_t)(nq * hc) * 2);
    const uint16_t **Vb = malloc((size_t)(n + 1) * sizeof *Vb);
    const uint16_t **list = malloc((size_t)(n + 1) * sizeof *list);
    int64_t *vis = malloc((size_t)(4 * nq) * sizeof *vis);
    const int64_t first = 1, prow = first + nw + 33;
    uint16_t *pbuf = malloc((size_t)((prow + 1) / 2 * 2 * c + 1) * 2);
    if (!wrows || !crows || !qb || !gb || !Vb || !list || !vis || !pbuf)
        exit(2);
    fill(V, n * c, 2.0f);
    fill(q, nq * hc, 1.5f);
    fill(g, nq * hc, 1.0f);
    fill(sink, H, 1.0f);
    fill(D, nq * H, 0.5f);
    for (int64_t e = 0; e < n; e++) { /* the compressed rows in reverse order: not consecutive */
        uint16_t *row = e < nw ? wrows + e * c : crows + (ncs - 1 - (e - nw)) * c;
        for (int64_t i = 0; i < c; i++)
            row[i] = to_bf16(V[e * c + i]), V[e * c + i] = from_bf16(row[i]);
        Vb[e] = row;
    }
    for (int64_t i = 0; i < nq * hc; i++)
        qb[i] = to_bf16(q[i]), gb[i] = to_bf16(g[i]);
    for (int64_t r = 0; r < (prow + 1) / 2 * 2; r++) { /* garbage around the window: weight 0 */
        const int64_t e = r - first;
        const bool in = e >= 0 && e < nw;
        for (int64_t i = 0; i < c; i++)
            pbuf[(r / 2) * 2 * c + (i / 16) * 32 + 2 * (i % 16) + r % 2] =
                in ? wrows[e * c + i] : to_bf16(3.0f * V[((r * 7 + 3) % n) * c + i]);
    }
    const trex_fused_pairs win = {pbuf, first, nw};
    for (int64_t b = 0; b < nq; b++) {
        const bool none = nq >= 3 && b == 1;
        const int64_t hi = nw - nq + 1 + b, lo = hi - W > 0 ? hi - W : 0;
        const int64_t cv = ncs - (nq - 1 - b) > 0 ? ncs - (nq - 1 - b) : 0;
        vis[4 * b] = none ? 0 : lo;
        vis[4 * b + 1] = none ? 0 : hi;
        vis[4 * b + 2] = nw;
        vis[4 * b + 3] = none ? nw : nw + cv;
    }
    const int64_t wsn = TREX_FUSED_SATTN_BLOCK_BF16_WS(n, H, c, nq);
    int64_t wsq = TREX_FUSED_SATTN_BF16_WS(n, H, c);
    if (TREX_FUSED_SATTN_WIN_BF16_WS(n, H, c, nq) > wsq) /* section 8's window calls */
        wsq = TREX_FUSED_SATTN_WIN_BF16_WS(n, H, c, nq);
    float *wbuf = xmalloc_f(wsn + 1 + 64), *ws = wbuf + 1, *wq = xmalloc_f(wsq + 1);
    float *o = xmalloc_f(nq * hc), *lse = xmalloc_f(nq * H), *dq = xmalloc_f(nq * hc);
    float *ds = xmalloc_f(nq * H), *o1 = xmalloc_f(nq * hc), *lse1 = xmalloc_f(nq * H);
    float *dq1 = xmalloc_f(nq * hc), *ds1 = xmalloc_f(nq * H), *P = xmalloc_f(H * (n + 1));
    double *bo = xmalloc_d(nq * hc), *bq = xmalloc_d(nq * hc);
    /* each level's o, lse, dq, dsink and (with the keys entry) dV, for the twin check */
    const int64_t nkeep = 2 * nq * hc + 2 * nq * H + n * c;
    float *keep[TREX_ISA_COUNT] = {0};
    const uint64_t rng0 = rng_state; /* every level draws the same dV starting values */
    for (int l = 0; l < nl; l++) {
        const trex_fused_table *t = lv[l];
        if (!t->sattn_fwd_block_bf16 || !t->sattn_bwd_query_block_bf16)
            continue;
        rng_state = rng0;
        for (int64_t i = 0; i < 64; i++)
            ws[wsn + i] = GUARD;
        const trex_fused_pairs *wp = pairs ? &win : NULL;
        t->sattn_fwd_block_bf16(o, lse, ws, qb, nq, vis, Vb, wp, n, H, c, sink, scale);
        t->sattn_bwd_query_block_bf16(dq, ds, ws, gb, qb, nq, vis, Vb, wp, n, H, c, sink, scale, lse,
                                      D);
        float *kp = keep[l] = xmalloc_f(nkeep);
        keep_append(&kp, o, nq * hc);
        keep_append(&kp, dq, nq * hc);
        keep_append(&kp, lse, nq * H);
        keep_append(&kp, ds, nq * H);
        for (int64_t b = 0; b < nq; b++) { /* query by query, the same level */
            int64_t k = 0;
            for (int r = 0; r < 2; r++)
                for (int64_t e = vis[4 * b + 2 * r]; e < vis[4 * b + 2 * r + 1]; e++)
                    list[k++] = Vb[e];
            t->sattn_fwd_bf16(o1 + b * hc, lse1 + b * H, NULL, P, wq, NULL, qb + b * hc, NULL,
                              list, NULL, k, H, c, sink, scale);
            t->sattn_bwd_query_bf16(dq1 + b * hc, ds1 + b * H, NULL, wq, NULL, gb + b * hc, NULL,
                                    qb + b * hc, NULL, list, NULL, k, H, c, sink, scale,
                                    lse + b * H, D + b * H);
            int64_t j = 0;
            for (int r = 0; r < 2; r++)
                for (int64_t e = vis[4 * b + 2 * r]; e < vis[4 * b + 2 * r + 1]; e++, j++)
                    for (int64_t h = 0; h < H; h++) {
                        double dp = 0.0;
                        for (int64_t i = 0; i < c; i++)
                            dp += (double)from_bf16(gb[b * hc + h * c + i]) * V[e * c + i];
                        const double p = P[h * k + j], dz = fabs(p * (dp - D[b * H + h]));
                        for (int64_t i = 0; i < c; i++) {
                            const double v = fabs((double)V[e * c + i]);
                            bo[b * hc + h * c + i] += p * v;
                            bq[b * hc + h * c + i] += scale * dz * v;
                        }
                    }
        }
        const double u = (double)(n + 64) / 8388608.0;
        for (int64_t i = 0; i < nq * hc; i++)
            bo[i] = u * bo[i] + 1e-30, bq[i] = u * bq[i] + 1e-30;
        const cmp xo = compare(o, o1, bo, nq * hc), xq = compare(dq, dq1, bq, nq * hc);
        char what[96];
        snprintf(what, sizeof what, "nw=%lld ncs=%lld nq=%lld H=%lld c=%lld%s", (long long)nw,
                 (long long)ncs, (long long)nq, (long long)H, (long long)c, pairs ? " pairs" : "");
        CHECK(same_bits(lse, lse1, nq * H), "%s block forward: lse differs from per query, %s",
              t->sattn_bf16_name, what);
        CHECK(same_bits(ds, ds1, nq * H), "%s block query side: dsink differs from per query, %s",
              t->sattn_bf16_name, what);
        CHECK(xo.worst <= 1.0 && xq.worst <= 1.0, "%s blocks vs per query: o %.3g, dq %.3g of the "
              "bound, %s", t->sattn_bf16_name, xo.worst, xq.worst, what);
        if (l == 0)
            CHECK(same_bits(o, o1, nq * hc) && same_bits(dq, dq1, nq * hc), "ref blocks: not the "
                  "per-query bits, %s", what);
        blk_worst = xo.worst > blk_worst ? xo.worst : blk_worst;
        blk_worst = xq.worst > blk_worst ? xq.worst : blk_worst;
        int guard_ok = 1;
        for (int64_t i = 0; i < 64; i++)
            guard_ok &= ws[wsn + i] == GUARD;
        CHECK(guard_ok, "%s blocks: scratch overrun, %s", t->sattn_bf16_name, what);
        if (t->sattn_bwd_query_block_keys_bf16 && t->sattn_bwd_window_bf16) {
            /* section 8: the block query side and the key side of all its entries in one call
             * against the block query side and two window key-side calls: the same bits */
            const int64_t wsk = TREX_FUSED_SATTN_BLOCK_KEYS_BF16_WS(n, H, c, nq);
            float *wk = xmalloc_f(wsk + 64), *dVm = xmalloc_f(n * c), *dVs = xmalloc_f(n * c);
            float **pm = malloc((size_t)(n + 1) * sizeof *pm), **pv = malloc((size_t)(n + 1) * sizeof *pv);
            int64_t v2[2 * 16];
            if (!pm || !pv)
                exit(2);
            fill(dVm, n * c, 0.25f);
            memcpy(dVs, dVm, (size_t)(n * c) * sizeof *dVs);
            for (int64_t e = 0; e < n; e++) /* the rows in reverse order */
                pm[e] = dVm + (n - 1 - e) * c, pv[e] = dVs + (n - 1 - e) * c;
            for (int64_t i = 0; i < 64; i++)
                wk[wsk + i] = GUARD;
            t->sattn_bwd_query_block_keys_bf16(dq1, ds1, pm, wk, gb, qb, nq, vis, Vb, wp, n, H, c,
                                               sink, scale, lse, D);
            for (int64_t b = 0; b < nq; b++)
                v2[2 * b] = vis[4 * b], v2[2 * b + 1] = vis[4 * b + 1];
            t->sattn_bwd_window_bf16(pv, wq, Vb, nw, nq, v2, qb, gb, H, c, scale, lse, D);
            for (int64_t b = 0; b < nq; b++)
                v2[2 * b] = vis[4 * b + 2] - nw, v2[2 * b + 1] = vis[4 * b + 3] - nw;
            t->sattn_bwd_window_bf16(pv + nw, wq, Vb + nw, ncs, nq, v2, qb, gb, H, c, scale, lse, D);
            CHECK(same_bits(dq, dq1, nq * hc) && same_bits(ds, ds1, nq * H), "%s block query side "
                  "with keys: dq or dsink differ from the block query side, %s", t->sattn_bf16_name,
                  what);
            CHECK(same_bits(dVm, dVs, n * c), "%s block query side with keys: dV differs from the "
                  "window key side, %s", t->sattn_bf16_name, what);
            keep_append(&kp, dVm, n * c);
            guard_ok = 1;
            for (int64_t i = 0; i < 64; i++)
                guard_ok &= wk[wsk + i] == GUARD;
            CHECK(guard_ok, "%s block query side with keys: scratch overrun, %s", t->sattn_bf16_name,
                  what);
            free(wk), free(dVm), free(dVs), free(pm), free(pv);
        }
        memset(bo, 0, (size_t)(nq * hc) * sizeof *bo);
        memset(bq, 0, (size_t)(nq * hc) * sizeof *bq);
    }
    char what[128];
    snprintf(what, sizeof what, "blocks (o, dq, lse, dsink, dV) nw=%lld ncs=%lld nq=%lld H=%lld c=%lld%s",
             (long long)nw, (long long)ncs, (long long)nq, (long long)H, (long long)c, pairs ? " pairs" : "");
    check_twins(lv, nl, keep, nkeep, what);
    free(V), free(q), free(g), free(sink), free(D), free(wrows), free(crows), free(qb), free(gb);
    free(Vb), free(list), free(vis), free(pbuf), free(wbuf), free(wq), free(o), free(lse);
    free(dq), free(ds), free(o1), free(lse1), free(dq1), free(ds1), free(P), free(bo), free(bq);
}

static void test_block_bf16(const trex_fused_table *const *lv, int nl)
{
    static const int64_t cases[][6] = {
        /* nw, ncs, nq, H, c, W */
        {1, 0, 1, 1, 32, 4},     {4, 0, 4, 3, 48, 2},    {19, 2, 4, 16, 32, 16},
        {40, 5, 3, 20, 48, 38},  {131, 0, 4, 16, 512, 128}, {131, 31, 4, 16, 512, 128},
        {36, 70, 4, 16, 64, 33}, {8, 3, 2, 3, 32, 1},     {23, 4, 3, 13, 48, 20},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int pw = 0; pw < 2; pw++)
            block_case(lv, nl, cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4],
                       cases[i][5], pw == 1);
    printf("forward and query side by query blocks: %zu shapes x 2 at %d level(s); largest o / dq "
           "error of the regrouping bound %.3f\n", sizeof cases / sizeof cases[0], nl, blk_worst);
}

/* ---- 8. the query side and the compressed key side in one call --------------------------------- */

static void qkeys_case(const trex_fused_table *const *lv, int nl, int64_t n, int64_t n0, int64_t H,
                       int64_t c, bool pairs)
{
    const int64_t nk = n - n0, hc = H * c;
    const float scale = 1.0f / sqrtf((float)c);
    float *V = xmalloc_f(n * c + 1), *sink = xmalloc_f(H), *D = xmalloc_f(H), *lse = xmalloc_f(H);
    float *o = xmalloc_f(hc), *q = xmalloc_f(hc), *g = xmalloc_f(hc);
    uint16_t *rows = malloc((size_t)(n * c + 1) * 2), *qb = malloc((size_t)hc * 2);
    uint16_t *gb = malloc((size_t)hc * 2);
    const uint16_t **Vb = malloc((size_t)(n + 1) * sizeof *Vb);
    const int64_t first = 3, prow = first + n0 + 33; /* the tiles read up to 32 rows past */
    uint16_t *pbuf = malloc((size_t)((prow + 1) / 2 * 2 * c + 1) * 2);
    if (!rows || !qb || !gb || !Vb || !pbuf)
        exit(2);
    fill(V, n * c, 2.0f);
    fill(q, hc, 1.5f);
    fill(g, hc, 1.0f);
    fill(sink, H, 1.0f);
    fill(D, H, 0.5f);
    for (int64_t e = 0; e < n; e++) { /* window rows consecutive, the others in reverse order */
        uint16_t *row = rows + (e < n0 ? e : n0 + (nk - 1 - (e - n0))) * c;
        for (int64_t i = 0; i < c; i++)
            row[i] = to_bf16(V[e * c + i]);
        Vb[e] = row;
    }
    for (int64_t i = 0; i < hc; i++)
        qb[i] = to_bf16(q[i]), gb[i] = to_bf16(g[i]);
    for (int64_t r = 0; r < (prow + 1) / 2 * 2; r++) { /* the window's pair rows, garbage around */
        const int64_t e = r - first;
        for (int64_t i = 0; i < c; i++)
            pbuf[(r / 2) * 2 * c + (i / 16) * 32 + 2 * (i % 16) + r % 2] =
                e >= 0 && e < n0 ? rows[e * c + i] : to_bf16(-7.0f);
    }
    const trex_fused_pairs win = {pbuf, first, n0};
    const int64_t wsn = TREX_FUSED_SATTN_QK_BF16_WS(n, H, c);
    float *wbuf = xmalloc_f(wsn + 1 + 64), *ws = wbuf + 1, *wq = xmalloc_f(wsn + 1);
    float *dq = xmalloc_f(hc), *ds = xmalloc_f(H), *P = xmalloc_f(H * n + 1);
    float *dq1 = xmalloc_f(hc), *ds1 = xmalloc_f(H), *P1 = xmalloc_f(H * n + 1);
    float *dVm = xmalloc_f(nk * c + 1), *dVs = xmalloc_f(nk * c + 1), *dV0 = xmalloc_f(nk * c + 1);
    float *ps = xmalloc_f(nk + 1), *ps1 = xmalloc_f(nk + 1);
    float **pm = malloc((size_t)(nk + 1) * sizeof *pm), **pv = malloc((size_t)(nk + 1) * sizeof *pv);
    if (!pm || !pv)
        exit(2);
    fill(dV0, nk * c, 0.25f);
    for (int64_t e = 0; e < nk; e++) /* the rows in reverse order */
        pm[e] = dVm + (nk - 1 - e) * c, pv[e] = dVs + (nk - 1 - e) * c;
    /* each level's dq, dsink, P, dV, psum and window key side, for the twin check */
    const int64_t nkeep = hc + H + H * n + nk * c + nk + n0 * c;
    float *keep[TREX_ISA_COUNT] = {0};
    const uint64_t rng0 = rng_state; /* every level draws the same window dV starting values */
    for (int l = 0; l < nl; l++) {
        const trex_fused_table *t = lv[l];
        if (!t->sattn_bwd_query_keys_bf16)
            continue;
        rng_state = rng0;
        const trex_fused_pairs *wp = pairs && n0 > 0 ? &win : NULL;
        t->sattn_fwd_bf16(o, lse, NULL, NULL, wq, NULL, qb, NULL, Vb, NULL, n, H, c, sink, scale);
        for (int64_t i = 0; i < 64; i++)
            ws[wsn + i] = GUARD;
        memcpy(dVm, dV0, (size_t)(nk * c) * sizeof *dVm);
        memcpy(dVs, dV0, (size_t)(nk * c) * sizeof *dVs);
        /* with the window entries' key-side operands written too (trex_fused_keys_out), as one
         * query of a block of 2 in the columns of query 1, rows from 3 */
        const int64_t Hp = TREX_FUSED_SATTN_HP(H), cp = TREX_FUSED_SATTN_CP(c), K = 4 * Hp;
        const int64_t rows16 = (n0 + 3 + 15) / 16 * 16;
        uint16_t *a2 = calloc((size_t)(rows16 * K), 2), *b2 = calloc((size_t)(K * cp), 2);
        float *dW = xmalloc_f(n0 * c + 1), *dW1 = xmalloc_f(n0 * c + 1);
        float **pw = malloc((size_t)(n0 + 3) * sizeof *pw), **pw1 = malloc((size_t)(n0 + 1) * sizeof *pw1);
        float *wsk = xmalloc_f(16 * cp + 16), *wwin = xmalloc_f(TREX_FUSED_SATTN_WIN_BF16_WS(n0, H, c, 1));
        if (!a2 || !b2 || !pw || !pw1)
            exit(2);
        fill(dW, n0 * c, 0.125f);
        memcpy(dW1, dW, (size_t)(n0 * c) * sizeof *dW);
        for (int64_t e = 0; e < n0 + 3; e++) /* rows 0 .. 2: zero coefficients, + 0 into row 0 */
            pw[e] = e < 3 ? dW : dW + (e - 3) * c;
        for (int64_t e = 0; e < n0; e++)
            pw1[e] = dW1 + e * c;
        const trex_fused_keys_out wk = {a2, b2, K, 2 * Hp, 3};
        t->sattn_bwd_query_keys_bf16(dq, ds, P, pm, ps, ws, gb, qb, Vb, wp, n, n0, H, c, sink, scale,
                                     lse, D, &wk);
        if (n0 > 0) {
            t->sattn_key_product_bf16(pw, wsk, a2, b2, K, n0 + 3, c);
            const int64_t v1[2] = {0, n0};
            t->sattn_bwd_window_bf16(pw1, wwin, Vb, n0, 1, v1, qb, gb, H, c, scale, lse, D);
        }
        int wsame = 1;
        for (int64_t i = 0; i < n0 * c; i++)
            wsame &= dW[i] == dW1[i];
        CHECK(wsame, "%s query and keys in one call: the window's key-side operands do not give "
              "the window key side (by value), n=%lld n0=%lld H=%lld c=%lld", t->sattn_bf16_name,
              (long long)n, (long long)n0, (long long)H, (long long)c);
        float *kp = keep[l] = xmalloc_f(nkeep);
        keep_append(&kp, dq, hc);
        keep_append(&kp, ds, H);
        keep_append(&kp, P, H * n);
        keep_append(&kp, dVm, nk * c);
        keep_append(&kp, ps, nk);
        keep_append(&kp, dW, n0 * c);
        free(a2), free(b2), free(dW), free(dW1), free(pw), free(pw1), free(wsk), free(wwin);
        t->sattn_bwd_query_bf16(dq1, ds1, P1, wq, NULL, gb, NULL, qb, NULL, Vb, wp, n, H, c, sink,
                                scale, lse, D);
        if (nk > 0)
            t->sattn_bwd_entries_bf16(pv, ps1, wq, NULL, Vb + n0, nk, NULL, qb, NULL, gb, H, c,
                                      scale, lse, D);
        char what[96];
        snprintf(what, sizeof what, "n=%lld n0=%lld H=%lld c=%lld%s", (long long)n, (long long)n0,
                 (long long)H, (long long)c, wp ? " pairs" : "");
        CHECK(same_bits(dq, dq1, hc) && same_bits(ds, ds1, H) && same_bits(P, P1, H * n),
              "%s query and keys in one call: dq, dsink or P differ from the query side, %s",
              t->sattn_bf16_name, what);
        CHECK(same_bits(dVm, dVs, nk * c) && same_bits(ps, ps1, nk),
              "%s query and keys in one call: dV or psum differ from the key side, %s",
              t->sattn_bf16_name, what);
        CHECK(nk == 0 || !same_bits(dVm, dV0, nk * c), "%s query and keys: dV unchanged, %s",
              t->sattn_bf16_name, what);
        int guard_ok = 1;
        for (int64_t i = 0; i < 64; i++)
            guard_ok &= ws[wsn + i] == GUARD;
        CHECK(guard_ok, "%s query and keys: scratch overrun, %s", t->sattn_bf16_name, what);
    }
    char what[128];
    snprintf(what, sizeof what, "query and keys (dq, dsink, P, dV, psum, window dV) n=%lld n0=%lld H=%lld "
             "c=%lld%s", (long long)n, (long long)n0, (long long)H, (long long)c, pairs ? " pairs" : "");
    check_twins(lv, nl, keep, nkeep, what);
    free(V), free(sink), free(D), free(lse), free(o), free(q), free(g), free(rows), free(qb);
    free(gb), free(Vb), free(pbuf), free(wbuf), free(wq), free(dq), free(ds), free(P), free(dq1);
    free(ds1), free(P1), free(dVm), free(dVs), free(dV0), free(ps), free(ps1), free(pm), free(pv);
}

/* A level with a twin (twin: avx2 and avx512f) must give its twin's key product bits on any operands:
 * random a2 (zero past n, up to a multiple of 16) and b2, awkward n and c, K from 0; and operands near
 * 1e-30 and 1e-9, whose products fall below fp32's normal range. */
static void test_key_product_bits(const trex_fused_table *const *lv, int nl)
{
    static const int64_t cases[][4] = {{1, 32, 0, 0}, {1, 32, 32, 0}, {5, 17, 64, 0}, {16, 48, 96, 0},
                                       {37, 130, 64, 0}, {3, 512, 160, 0}, {20, 64, 64, 1}}; /* n, c, K, tiny */
    int runs = 0;
    for (int l = 1; l < nl; l++) {
        const trex_fused_table *t = lv[l];
        const int tw = twin(lv, nl, l);
        if (tw < 0)
            continue;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const int64_t n = cases[i][0], c = cases[i][1], K = cases[i][2];
            const float sa = cases[i][3] ? 1e-30f : 1.0f, sb = cases[i][3] ? 1e-9f : 1.0f;
            const int64_t cp = TREX_FUSED_SATTN_CP(c), rows = (n + 15) / 16 * 16;
            uint16_t *a2 = calloc((size_t)(rows * K + 1), 2), *b2 = malloc((size_t)(K * cp + 1) * 2);
            float *r = xmalloc_f(n * c), *x = xmalloc_f(n * c), *ws = xmalloc_f(16 * cp + 16);
            float **pr = malloc((size_t)n * sizeof *pr), **px = malloc((size_t)n * sizeof *px);
            if (!a2 || !b2 || !pr || !px)
                exit(2);
            float *tmp = xmalloc_f(n * K + K * cp + 1);
            fill(tmp, n * K + K * cp, 3.0f);
            for (int64_t k = 0; k < n * K; k++)
                a2[k] = to_bf16(sa * tmp[k]);
            for (int64_t k = 0; k < K * cp; k++)
                b2[k] = to_bf16(sb * tmp[n * K + k]);
            fill(r, n * c, cases[i][3] ? 0.0f : 0.5f); /* tiny sums would vanish into 0.5 */
            memcpy(x, r, (size_t)(n * c) * sizeof *r);
            for (int64_t e = 0; e < n; e++)
                pr[e] = r + e * c, px[e] = x + e * c;
            lv[tw]->sattn_key_product_bf16(pr, ws, a2, b2, K, n, c);
            t->sattn_key_product_bf16(px, ws, a2, b2, K, n, c);
            CHECK(same_bits(r, x, n * c), "%s key product: the %s level's bits, n=%lld c=%lld K=%lld",
                  t->sattn_bf16_name, lv[tw]->sattn_bf16_name, (long long)n, (long long)c, (long long)K);
            runs++;
            free(a2), free(b2), free(r), free(x), free(ws), free(pr), free(px), free(tmp);
        }
    }
    printf("key product, avx2 bit for bit with avx512f: %d runs\n", runs);
}

/* Sections 1-3 on one shape at every level, each optimised level also with the window in the pair
 * layout, and a level with a twin against its twin's bits in both runs. qamp scales q: at 40 the
 * scores spread over hundreds, p underflows and the exp meets its clamps. */
static void shape_case(const trex_fused_table *const *lv, int nl, int64_t n, int64_t H, int64_t c,
                       float qamp)
{
    shape_data s;
    shape_init(&s, n, H, c, qamp);
    const outs f32 = {s.o, s.lse, s.z, s.dq, s.ds, s.P, s.ps, s.dpool};
    outs x[2][TREX_ISA_COUNT]; /* [the pair-layout window][level] */
    for (int l = 0; l < nl; l++) {
        for (int pw = 0; pw < (l > 0 ? 2 : 1); pw++) {
            outs *xl = &x[pw][l];
            char name[80];
            snprintf(name, sizeof name, "%s%s%s", lv[l]->sattn_bf16_name,
                     pw ? " (pair-layout window)" : "", qamp != 1.0f ? " (large scores)" : "");
            int guard_ok, repeat_ok;
            run_level(lv[l], &s, xl, &guard_ok, &repeat_ok, pw == 1);
            CHECK(guard_ok, "%s scratch overrun n=%lld H=%lld c=%lld", name, (long long)n, (long long)H,
                  (long long)c);
            CHECK(repeat_ok, "%s repeated calls differ n=%lld H=%lld c=%lld", name, (long long)n,
                  (long long)H, (long long)c);
            check_outputs(name, "vs fp32", &s, xl, &f32, 1.0, 0.0, 0);
            if (l > 0)
                check_outputs(name, "vs bf16 ref", &s, xl, &x[0][0], 0.25, 2e-3, 1);
        }
    }
    for (int l = 0; l < nl; l++) {
        const int tw = twin(lv, nl, l);
        for (int pw = 0; tw >= 0 && pw < 2; pw++)
            CHECK(outs_same(&x[pw][l], &x[pw][tw], n, H, c), "%s%s: not the %s level's bits n=%lld H=%lld "
                  "c=%lld amp=%g", lv[l]->sattn_bf16_name, pw ? " (pair-layout window)" : "",
                  lv[tw]->sattn_bf16_name, (long long)n, (long long)H, (long long)c, (double)qamp);
    }
    for (int l = 0; l < nl; l++)
        for (int pw = 0; pw < (l > 0 ? 2 : 1); pw++)
            outs_free(&x[pw][l]);
    shape_free(&s);
}

static void test_qkeys_bf16(const trex_fused_table *const *lv, int nl)
{
    static const int64_t cases[][4] = {
        /* n, n0, H, c */
        {1, 0, 1, 32},    {1, 1, 3, 48},     {17, 5, 16, 32},  {40, 40, 20, 48},
        {259, 131, 16, 512}, {200, 70, 3, 64}, {33, 0, 16, 512}, {7, 3, 20, 48}, {45, 20, 13, 48},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int pw = 0; pw < 2; pw++)
            qkeys_case(lv, nl, cases[i][0], cases[i][1], cases[i][2], cases[i][3], pw == 1);
    printf("query side and compressed key side in one call: %zu shapes x 2 at %d level(s)\n",
           sizeof cases / sizeof cases[0], nl);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--bench")) {
        int reps = argc >= 3 ? atoi(argv[2]) : 11;
        return bench(reps < 1 ? 1 : reps > BENCH_MAX_REPS ? BENCH_MAX_REPS : reps);
    }
    const trex_fused_table *ref = trex_fused_for(TREX_ISA_REF);
    CHECK(ref->sattn_fwd_bf16 == trex_fused_sattn_fwd_bf16_ref, "the ref level has the bf16 reference");
    /* the distinct bf16 implementations among the tables (tests/fused_levels.h), reference first */
    const trex_fused_table *all[TREX_ISA_COUNT], *lv[TREX_ISA_COUNT];
    const int na = fused_levels(ref, all);
    int nl = 0;
    for (int k = 0; k < na; k++) {
        const trex_fused_table *t = all[k];
        int dup = !t->sattn_fwd_bf16 || !t->sattn_bwd_query_bf16 || !t->sattn_bwd_entries_bf16 ||
                  !t->sattn_bwd_window_bf16;
        if (dup && !t->sattn_fwd_bf16 && !t->sattn_bwd_query_bf16 && !t->sattn_bwd_entries_bf16 &&
            !t->sattn_bwd_window_bf16)
            printf("level %s: no bf16 attention core (%s)\n", t->name, t->sattn_bf16_name);
        else
            CHECK(!dup, "level %s has all four bf16 attention entries or none", t->name);
        for (int i = 0; i < nl; i++)
            dup |= lv[i]->sattn_fwd_bf16 == t->sattn_fwd_bf16;
        if (!dup)
            lv[nl++] = t;
    }
    for (int i = 0; i < nl; i++)
        printf("bf16 attention core at level %s: %s\n", lv[i]->name, lv[i]->sattn_bf16_name);
    if (nl == 1)
        printf("note: no AVX2 on this machine: only the reference bf16 entries are checked\n");

    /* c = 20: dims that are not a whole number of 16-float registers; H = 2: a group of two real heads,
     * H = 13: a group with more than half its heads real */
    const int64_t ns[] = {0, 1, 2, 3, 7, 16, 17, 129, 257}, Hs[] = {1, 2, 3, 13, 16, 20},
                  cs[] = {20, 32, 48, 512};
    for (size_t ic = 0; ic < sizeof cs / sizeof cs[0]; ic++)
        for (size_t ih = 0; ih < sizeof Hs / sizeof Hs[0]; ih++)
            for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
                const int64_t n = ns[in], H = Hs[ih], c = cs[ic];
                if (c == 512 && ((H == 20 && n == 257) || H == 2))
                    continue; /* the largest cases add seconds and no new path */
                shape_case(lv, nl, n, H, c, 1.0f);
            }
    static const int64_t big[][3] = {{7, 3, 32}, {129, 13, 48}, {257, 16, 20}, {40, 20, 512}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        shape_case(lv, nl, big[i][0], big[i][1], big[i][2], 40.0f);
    printf("largest error / bound: %.3f against fp32, %.3f (of the quarter bound) against the bf16 "
           "reference\n", worst_seen[0], worst_seen[1]);
    test_dots_bf16(lv, nl);
    test_window_bf16(lv, nl);
    test_block_bf16(lv, nl);
    test_qkeys_bf16(lv, nl);
    test_key_product_bits(lv, nl);
    test_nt_entries(all, na);
    return check_summary();
}
