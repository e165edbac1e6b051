/* kernels/ref/attn_bf16.c — the reference of the bf16 attention entries (kernels/fused.h, bf16 mode).
 *
 * Plain C that defines what the bf16 attention core computes: the operands of every product rounded to
 * bf16 (nearest even, trex_f32_to_bf16), each product exact in fp32 (8-bit by 8-bit significands), the
 * sums in fp32 in the fixed orders written below, softmax / exp / log in fp32. The tile leaves
 * (kernels/x86/attn_tiles.h, for AMX and AVX-512) compute the same quantities with the sums in their
 * tile products' order.
 *
 *   scores   z_he = scale * dot(bf(q_h), bf(v_e))          dot: am_dot_f (16 partial sums, fixed tree)
 *   softmax  mx_h = max(sink_h, z_h.), x_he = exp(z_he - mx_h), den_h = exp(sink_h - mx_h) + sum_e x_he
 *            (e ascending), lse_h = mx_h + log(den_h), p_he = x_he / den_h
 *   output   o_h[k] = sum_e bf(p_he) bf(v_e)[k]             (e ascending)
 *   query    p_he = exp(z_he - lse_h), dp_he = dot(bf(g_h), bf(v_e)), dz_he = p_he (dp_he - D_h),
 *            dq_h[k] = scale * (sum_e bf(dz_he) bf(v_e)[k]), dsink_h = -exp(sink_h - lse_h) D_h
 *   key      dV[e][k] += (sum_h bf(p_he) bf(g_h)[k]) + sum_h bf(scale dz_he) bf(q_h)[k]  (h ascending,
 *            one fp32 sum started at the first term, then one add into dV), psum[e] = sum_h p_he
 *
 * ws (floats): bf(q), bf(g) [H*c each]; the rounded entries [n*c] (one [c] and its c sums on the key
 * side); one entry's dot products with the heads of q and g [2H]; the forward's bf(p) [H*n], and the
 * scores [H*n] when the caller passes no z, and its mx, den [2H]; the query side's bf(dz) [H*n]; the key
 * side's coefficients [2H]. TREX_FUSED_SATTN_BF16_WS covers it.
 */
#include "kernels/fused.h"

#define ATTN_LEAF(name) trex_fused_##name##_ref

#include <math.h>
#include <string.h>

#define AM_REAL float
#define AM_SFX f
#include "model/attention_math.h"
#include "trex/status.h"
#include "trex/tensor.h"

/* x rounded to bf16 and back: trex_f32_to_bf16 (nearest even; NaN kept, quieted) inlined */
static inline float bf(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u |= 0x00400000u;
    else
        u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* a bf16 value widened to fp32 (exact) */
static inline float bf16_value(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static void round_into(float *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = bf(src[i]);
}

/* q (or g) rounded: widened from xb when given (the same values, xb = bf(x)), else rounded from x */
static void query_into(float *dst, const float *x, const uint16_t *xb, int64_t n)
{
    if (!xb) {
        round_into(dst, x, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)xb[i] << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

/* entry e rounded: widened from Vb[e] when given (the same values), else rounded from V[e] */
static void entry_into(float *dst, const float *const *V, const uint16_t *const *Vb, int64_t e,
                       int64_t c)
{
    if (!Vb) {
        round_into(dst, V[e], c);
        return;
    }
    for (int64_t i = 0; i < c; i++) {
        const uint32_t u = (uint32_t)Vb[e][i] << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

/* The row products every entry below is made of. */
/* out[r] = am_dot_f(A + r c, v, c) for r < R */
static void dots_rows(float *out, const float *A, int64_t R, const float *v, int64_t c)
{
    for (int64_t r = 0; r < R; r++)
        out[r] = am_dot_f(A + r * c, v, c);
}

/* O_r[i] += w[r ldw + e] V_e[i] for e < n ascending (each product rounded, then added), r < R, i < c;
 * O_r = O + r c, V_e = V + e c */
static void wsum_rows(float *O, int64_t R, const float *w, int64_t ldw, const float *V, int64_t n,
                      int64_t c)
{
    for (int64_t e = 0; e < n; e++)
        for (int64_t r = 0; r < R; r++) {
            const float a = w[r * ldw + e];
            float *o = O + r * c;
            for (int64_t i = 0; i < c; i++)
                o[i] += a * V[e * c + i];
        }
}

/* The terms a[k] X_k[i] for k < 2H ascending (X_k = G + k c for k < H, then Q + (k - H) c), each
 * product rounded, then added into acc[i] (i < c); with first, the sum starts at the first term (+0
 * when there is none, H = 0). */
static void combine_rows(float *acc, bool first, const float *a, const float *G, const float *Q,
                         int64_t H, int64_t c)
{
    if (first && H == 0)
        memset(acc, 0, (size_t)c * sizeof *acc);
    for (int64_t k = 0; k < 2 * H; k++) {
        const float ak = a[k], *x = k < H ? G + k * c : Q + (k - H) * c;
        if (first && k == 0)
            for (int64_t i = 0; i < c; i++)
                acc[i] = ak * x[i];
        else
            for (int64_t i = 0; i < c; i++)
                acc[i] += ak * x[i];
    }
}

void ATTN_LEAF(sattn_fwd_bf16)(float *o, float *lse, float *z, float *P, float *ws,
                               const float *q, const uint16_t *qb, const float *const *V,
                               const uint16_t *const *Vb, const trex_fused_pairs *Wp, int64_t n,
                               int64_t H, int64_t c, const float *sink, float scale)
{
    (void)Wp; /* the same rows as Vb / V: only a layout for the AMX leaf */
    float *rq = ws, *mxs = ws + H * c, *dens = mxs + H, *sd = dens + H, *rv = sd + H;
    float *pb = rv + n * c; /* bf(p) [H*n], then the scores when the caller keeps none */
    if (!z)
        z = pb + H * n;
    query_into(rq, q, qb, H * c);
    for (int64_t e = 0; e < n; e++) {
        entry_into(rv + e * c, V, Vb, e, c);
        dots_rows(sd, rq, H, rv + e * c, c);
        for (int64_t h = 0; h < H; h++)
            z[h * n + e] = scale * sd[h];
    }
    for (int64_t h = 0; h < H; h++) {
        lse[h] = am_sink_lse_f(z + h * n, n, sink[h], mxs + h, dens + h);
        for (int64_t i = 0; i < c; i++)
            o[h * c + i] = 0.0f;
    }
    for (int64_t h = 0; h < H; h++)
        for (int64_t e = 0; e < n; e++) {
            const float pf = expf(z[h * n + e] - mxs[h]) / dens[h];
            pb[h * n + e] = bf(pf);
            if (P)
                P[h * n + e] = pf;
        }
    wsum_rows(o, H, pb, n, rv, n, c);
}

void ATTN_LEAF(sattn_bwd_query_bf16)(float *dq, float *dsink, float *P, float *ws,
                                     const float *g, const uint16_t *gb, const float *q,
                                     const uint16_t *qb, const float *const *V,
                                     const uint16_t *const *Vb, const trex_fused_pairs *Wp,
                                     int64_t n, int64_t H, int64_t c, const float *sink,
                                     float scale, const float *lse, const float *D)
{
    (void)Wp;
    float *rq = ws, *rg = ws + H * c, *dzb = ws + 2 * H * c, *sd = dzb + H * n, *gd = sd + H;
    float *rv = gd + H;
    query_into(rq, q, qb, H * c);
    query_into(rg, g, gb, H * c);
    for (int64_t e = 0; e < n; e++) {
        entry_into(rv + e * c, V, Vb, e, c);
        dots_rows(sd, rq, H, rv + e * c, c);
        dots_rows(gd, rg, H, rv + e * c, c);
        for (int64_t h = 0; h < H; h++) {
            const float s = scale * sd[h], dp = gd[h];
            const float p = expf(s - lse[h]);
            dzb[h * n + e] = bf(p * (dp - D[h]));
            if (P)
                P[h * n + e] = p;
        }
    }
    for (int64_t i = 0; i < H * c; i++)
        dq[i] = 0.0f;
    wsum_rows(dq, H, dzb, n, rv, n, c);
    for (int64_t i = 0; i < H * c; i++)
        dq[i] *= scale;
    for (int64_t h = 0; h < H; h++)
        dsink[h] = -expf(sink[h] - lse[h]) * D[h];
}

void ATTN_LEAF(sattn_bwd_entries_bf16)(float *const *dV, float *psum, float *ws,
                                       const float *const *V, const uint16_t *const *Vb,
                                       int64_t n, const float *q, const uint16_t *qb,
                                       const float *g, const uint16_t *gb, int64_t H, int64_t c,
                                       float scale, const float *lse, const float *D)
{
    float *rq = ws, *rg = ws + H * c, *rv = ws + 2 * H * c, *ab = ws + 2 * H * c + c, *acc = ab + 2 * H;
    float *sd = acc + c, *gd = sd + H;
    query_into(rq, q, qb, H * c);
    query_into(rg, g, gb, H * c);
    for (int64_t e = 0; e < n; e++) {
        entry_into(rv, V, Vb, e, c);
        dots_rows(sd, rq, H, rv, c);
        dots_rows(gd, rg, H, rv, c);
        float ps = 0.0f;
        for (int64_t h = 0; h < H; h++) {
            const float s = scale * sd[h], dp = gd[h];
            const float p = expf(s - lse[h]);
            ab[h] = bf(p);
            ab[H + h] = bf(scale * (p * (dp - D[h])));
            ps += p;
        }
        psum[e] = ps;
        /* per column i: one sum over h ascending (the g rows, then the q rows) from the first term,
         * then one add into dV */
        combine_rows(acc, true, ab, rg, rq, H, c);
        float *dv = dV[e];
        for (int64_t i = 0; i < c; i++)
            dv[i] += acc[i];
    }
}

/* dots_bf16 (kernels/fused.h): out[r*n + e] = am_dot_f(bf(A_r), K_e), the entries K_e given in bf16
 * (exact in fp32). ws: the rounded rows [R*c], one widened entry [c] and its R dot products. */
void ATTN_LEAF(dots_bf16)(float *out, float *ws, const float *A, int64_t lda, int64_t R,
                          const uint16_t *Kb, const int64_t *idx, int64_t n, int64_t c)
{
    float *ra = ws, *rv = ws + R * c, *sd = rv + c;
    for (int64_t r = 0; r < R; r++)
        round_into(ra + r * c, A + r * lda, c);
    for (int64_t e = 0; e < n; e++) {
        const uint16_t *k = Kb + (idx ? idx[e] : e) * c;
        for (int64_t i = 0; i < c; i++) {
            const uint32_t u = (uint32_t)k[i] << 16;
            memcpy(rv + i, &u, sizeof u);
        }
        dots_rows(sd, ra, R, rv, c);
        for (int64_t r = 0; r < R; r++)
            out[r * n + e] = sd[r];
    }
}

/* The block entries' per-query list: after the per-query entry's scratch in ws, 8-byte aligned. */
static const uint16_t **block_list_at(float *ws, int64_t n, int64_t H, int64_t c)
{
    const uintptr_t at = (uintptr_t)(ws + TREX_FUSED_SATTN_BF16_WS(n, H, c));
    return (const uint16_t **)(at + 7 - (at + 7) % 8);
}

/* A query's visible entries, its ranges rg[0] .. rg[1] and rg[2] .. rg[3] of Vb in order, into list;
 * returns their number. */
static int64_t block_list(const uint16_t **list, const int64_t *rg, const uint16_t *const *Vb)
{
    int64_t k = 0;
    for (int r = 0; r < 2; r++)
        for (int64_t e = rg[2 * r]; e < rg[2 * r + 1]; e++)
            list[k++] = Vb[e];
    return k;
}

/* sattn_fwd_block_bf16 (kernels/fused.h): each query by the forward above on its visible entries
 * (their rows listed after the forward's scratch), so the reference gives the per-query bits. */
void ATTN_LEAF(sattn_fwd_block_bf16)(float *o, float *lse, float *ws, const uint16_t *qb,
                                     int64_t nq, const int64_t *vis, const uint16_t *const *Vb,
                                     const trex_fused_pairs *Wp, int64_t n, int64_t H, int64_t c,
                                     const float *sink, float scale)
{
    (void)Wp;
    const uint16_t **list = block_list_at(ws, n, H, c);
    for (int64_t b = 0; b < nq; b++) {
        const int64_t k = block_list(list, vis + 4 * b, Vb);
        ATTN_LEAF(sattn_fwd_bf16)(o + b * H * c, lse + b * H, NULL, NULL, ws, NULL,
                                  qb + b * H * c, NULL, list, NULL, k, H, c, sink, scale);
    }
}

/* sattn_bwd_query_block_bf16 (kernels/fused.h): each query by the query side below on its visible
 * entries, so the per-query bits. */
void ATTN_LEAF(sattn_bwd_query_block_bf16)(float *dq, float *dsink, float *ws,
                                           const uint16_t *gb, const uint16_t *qb, int64_t nq,
                                           const int64_t *vis, const uint16_t *const *Vb,
                                           const trex_fused_pairs *Wp, int64_t n, int64_t H,
                                           int64_t c, const float *sink, float scale,
                                           const float *lse, const float *D)
{
    (void)Wp;
    const uint16_t **list = block_list_at(ws, n, H, c);
    for (int64_t b = 0; b < nq; b++) {
        const int64_t k = block_list(list, vis + 4 * b, Vb);
        ATTN_LEAF(sattn_bwd_query_bf16)(dq + b * H * c, dsink + b * H, NULL, ws, NULL,
                                        gb + b * H * c, NULL, qb + b * H * c, NULL, list, NULL,
                                        k, H, c, sink, scale, lse + b * H, D + b * H);
    }
}

/* sattn_bwd_window_bf16 (kernels/fused.h): the key side of nq consecutive queries, one fp32 sum per
 * entry over the terms of every query that sees it (b ascending; per query the g terms, heads
 * ascending, then the q terms), started at the first term, then one add into dV[e].
 * ws: bf(q), bf(g) of the nq queries [nq*H*c each], one widened entry [c], the coefficients [2H*nq],
 * the entry's sums [c], its dot products with one query's heads of q and g [2H]. */
void ATTN_LEAF(sattn_bwd_window_bf16)(float *const *dV, float *ws, const uint16_t *const *Vb,
                                      int64_t n, int64_t nq, const int64_t *vis,
                                      const uint16_t *qb, const uint16_t *gb, int64_t H,
                                      int64_t c, float scale, const float *lse, const float *D)
{
    const int64_t hc = H * c;
    float *rq = ws, *rg = ws + nq * hc, *rv = ws + 2 * nq * hc, *ab = rv + c, *acc = ab + 2 * H * nq;
    float *sd = acc + c, *gd = sd + H;
    query_into(rq, NULL, qb, nq * hc);
    query_into(rg, NULL, gb, nq * hc);
    for (int64_t e = 0; e < n; e++) {
        entry_into(rv, NULL, Vb, e, c);
        bool any = false;
        for (int64_t b = 0; b < nq; b++) {
            if (e < vis[2 * b] || e >= vis[2 * b + 1])
                continue;
            any = true;
            dots_rows(sd, rq + b * hc, H, rv, c);
            dots_rows(gd, rg + b * hc, H, rv, c);
            for (int64_t h = 0; h < H; h++) {
                const float s = scale * sd[h], dp = gd[h];
                const float p = expf(s - lse[b * H + h]);
                ab[2 * H * b + h] = bf(p);
                ab[2 * H * b + H + h] = bf(scale * (p * (dp - D[b * H + h])));
            }
        }
        if (!any)
            continue;
        /* per column i: one sum over the visible queries b, then h ascending (g rows, then q rows),
         * from the first term, then one add into dV; the c sums advance together, rows read in order */
        bool first = true;
        for (int64_t b = 0; b < nq; b++) {
            if (e < vis[2 * b] || e >= vis[2 * b + 1])
                continue;
            combine_rows(acc, first, ab + 2 * H * b, rg + b * hc, rq + b * hc, H, c);
            first = false;
        }
        float *dv = dV[e];
        for (int64_t i = 0; i < c; i++)
            dv[i] += acc[i];
    }
}

/* Element (k, i) of a VNNI B operand of cp columns (kernels/fused.h trex_fused_keys_out) */
static inline int64_t vnni_at(int64_t k, int64_t i, int64_t cp)
{
    return ((k / 32) * (cp / 16) + i / 16) * 512 + ((k % 32) / 2) * 32 + 2 * (i % 16) + k % 2;
}

/* The key side's operands of the entries e < n0 written for a later product (trex_fused_keys_out):
 * the coefficients as trex_fused_sattn_bwd_entries_bf16_ref computes them, the rows bf(g), bf(q).
 * ws: the rounded q, g [H*c each] and one entry [c]. */
static void keys_out(const trex_fused_keys_out *wk, float *ws, const uint16_t *gb, const uint16_t *qb,
                     const uint16_t *const *Vb, int64_t n0, int64_t H, int64_t c, float scale,
                     const float *lse, const float *D)
{
    const int64_t Hp = TREX_FUSED_SATTN_HP(H), cp = TREX_FUSED_SATTN_CP(c);
    float *rq = ws, *rg = ws + H * c, *rv = ws + 2 * H * c, *sd = rv + c, *gd = sd + H;
    query_into(rq, NULL, qb, H * c);
    query_into(rg, NULL, gb, H * c);
    for (int64_t e = 0; e < n0; e++) {
        entry_into(rv, NULL, Vb, e, c);
        dots_rows(sd, rq, H, rv, c);
        dots_rows(gd, rg, H, rv, c);
        uint16_t *row = wk->a2 + (wk->row + e) * wk->K + wk->col;
        for (int64_t h = 0; h < Hp; h++) {
            float p = 0.0f, sdz = 0.0f;
            if (h < H) {
                const float sc = scale * sd[h], dp = gd[h];
                p = expf(sc - lse[h]);
                sdz = scale * (p * (dp - D[h]));
            }
            row[h] = trex_f32_to_bf16(p);
            row[Hp + h] = trex_f32_to_bf16(sdz);
        }
    }
    for (int64_t r = 0; r < 2 * Hp; r++) {
        const int64_t h = r < Hp ? r : r - Hp, k = wk->col + r;
        const uint16_t *x = h < H ? (r < Hp ? gb : qb) + h * c : NULL;
        for (int64_t i = 0; i < cp; i++)
            wk->b2[vnni_at(k, i, cp)] = x && i < c ? x[i] : 0;
    }
}

/* sattn_bwd_query_keys_bf16 (kernels/fused.h): its definition, the two calls (and keys_out). The key
 * side's scratch (2 H c + 2 c + 4 H floats: the rounded q and g, one entry, its coefficients, its sums,
 * its dot products) fits in TREX_FUSED_SATTN_BF16_WS, as the query side's does; the query side's is
 * free once that call has returned. */
void ATTN_LEAF(sattn_bwd_query_keys_bf16)(float *dq, float *dsink, float *P, float *const *dV,
                                          float *psum, float *ws, const uint16_t *gb,
                                          const uint16_t *qb, const uint16_t *const *Vb,
                                          const trex_fused_pairs *Wp, int64_t n, int64_t n0,
                                          int64_t H, int64_t c, const float *sink, float scale,
                                          const float *lse, const float *D,
                                          const trex_fused_keys_out *wk)
{
    ATTN_LEAF(sattn_bwd_query_bf16)(dq, dsink, P, ws, NULL, gb, NULL, qb, NULL, Vb, Wp, n, H, c,
                                    sink, scale, lse, D);
    if (n > n0)
        ATTN_LEAF(sattn_bwd_entries_bf16)(dV, psum, ws, NULL, Vb + n0, n - n0, NULL, qb, NULL,
                                          gb, H, c, scale, lse, D);
    if (wk)
        keys_out(wk, ws, gb, qb, Vb, n0, H, c, scale, lse, D);
}

/* sattn_key_product_bf16 (kernels/fused.h): per entry and column one fp32 sum over k ascending from
 * the first term, then one add. The sums of an entry's c columns advance together, k by k (ws holds
 * them), so that B is read along its rows: 16 columns of a row k are 16 values two apart. */
void ATTN_LEAF(sattn_key_product_bf16)(float *const *dV, float *ws, const uint16_t *a2,
                                       const uint16_t *b2, int64_t K, int64_t n, int64_t c)
{
    const int64_t cp = TREX_FUSED_SATTN_CP(c);
    float *acc = ws;
    for (int64_t e = 0; e < n; e++) {
        for (int64_t k = 0; k < K; k++) {
            const float a = bf16_value(a2[e * K + k]);
            for (int64_t i0 = 0; i0 < c; i0 += 16) {
                const uint16_t *bk = b2 + vnni_at(k, i0, cp);
                const int64_t m = c - i0 < 16 ? c - i0 : 16;
                for (int64_t i = 0; i < m; i++) {
                    const float t = a * bf16_value(bk[2 * i]);
                    acc[i0 + i] = k ? acc[i0 + i] + t : t;
                }
            }
        }
        for (int64_t i = 0; i < c; i++)
            dV[e][i] += K ? acc[i] : 0.0f;
    }
}

/* sattn_bwd_query_block_keys_bf16 (kernels/fused.h): its definition, the three calls (nq <= 16). The
 * key side's scratch fits in the query side's, free once that call has returned. */
void ATTN_LEAF(sattn_bwd_query_block_keys_bf16)(
    float *dq, float *dsink, float *const *dV, float *ws, const uint16_t *gb, const uint16_t *qb,
    int64_t nq, const int64_t *vis, const uint16_t *const *Vb, const trex_fused_pairs *Wp,
    int64_t n, int64_t H, int64_t c, const float *sink, float scale, const float *lse,
    const float *D)
{
    if (nq <= 0)
        return;
    TREX_ASSERT(nq <= 16);
    ATTN_LEAF(sattn_bwd_query_block_bf16)(dq, dsink, ws, gb, qb, nq, vis, Vb, Wp, n, H, c, sink,
                                          scale, lse, D);
    int64_t v2[32];
    const int64_t m = vis[2];
    for (int64_t b = 0; b < nq; b++)
        v2[2 * b] = vis[4 * b], v2[2 * b + 1] = vis[4 * b + 1];
    ATTN_LEAF(sattn_bwd_window_bf16)(dV, ws, Vb, m, nq, v2, qb, gb, H, c, scale, lse, D);
    for (int64_t b = 0; b < nq; b++)
        v2[2 * b] = vis[4 * b + 2] - m, v2[2 * b + 1] = vis[4 * b + 3] - m;
    ATTN_LEAF(sattn_bwd_window_bf16)(dV + m, ws, Vb + m, n - m, nq, v2, qb, gb, H, c, scale, lse,
                                     D);
}
