/* kernels/ref/attn_bf16.c — the reference of the bf16 attention entries (kernels/fused.h, bf16 mode).
 *
 * Plain C that defines what the bf16 attention core computes: the operands of every product rounded to
 * bf16 (nearest even, trex_f32_to_bf16), each product exact in fp32 (8-bit by 8-bit significands), the
 * sums in fp32 in the fixed orders written below, softmax / exp / log in fp32. The AMX leaves
 * (kernels/x86/amx/attn.c) compute the same quantities with the sums in the tile unit's order.
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
 * ws (floats): bf(q), bf(g) [H*c each], the rounded entries [n*c] (one [c] on the key side) and, in
 * the forward when the caller passes no z, the scores [H*n]; bf(dz)
 * [H*n], the key side's coefficients or the forward's mx and den [2H]; TREX_FUSED_SATTN_BF16_WS
 * covers it. */
#include "kernels/fused.h"

#include <math.h>
#include <string.h>

#define AM_REAL float
#define AM_SFX f
#include "model/attention_math.h"

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

void trex_fused_sattn_fwd_bf16_ref(float *o, float *lse, float *z, float *P, float *ws,
                                   const float *q, const uint16_t *qb, const float *const *V,
                                   const uint16_t *const *Vb, const trex_fused_pairs *Wp, int64_t n,
                                   int64_t H, int64_t c, const float *sink, float scale)
{
    (void)Wp; /* the same rows as Vb / V: only a layout for the AMX leaf */
    float *rq = ws, *mxs = ws + H * c, *dens = mxs + H, *rv = dens + H;
    if (!z) /* the scores in scratch after the rounded entries */
        z = rv + n * c;
    query_into(rq, q, qb, H * c);
    for (int64_t e = 0; e < n; e++) {
        entry_into(rv + e * c, V, Vb, e, c);
        for (int64_t h = 0; h < H; h++)
            z[h * n + e] = scale * am_dot_f(rq + h * c, rv + e * c, c);
    }
    for (int64_t h = 0; h < H; h++) {
        const float *zh = z + h * n;
        float mx = sink[h];
        for (int64_t e = 0; e < n; e++)
            mx = zh[e] > mx ? zh[e] : mx;
        float den = expf(sink[h] - mx);
        for (int64_t e = 0; e < n; e++)
            den += expf(zh[e] - mx);
        lse[h] = mx + logf(den);
        mxs[h] = mx;
        dens[h] = den;
        for (int64_t i = 0; i < c; i++)
            o[h * c + i] = 0.0f;
    }
    for (int64_t e = 0; e < n; e++) {
        const float *re = rv + e * c;
        for (int64_t h = 0; h < H; h++) {
            const float pf = expf(z[h * n + e] - mxs[h]) / dens[h], p = bf(pf);
            if (P)
                P[h * n + e] = pf;
            float *oh = o + h * c;
            for (int64_t i = 0; i < c; i++)
                oh[i] += p * re[i];
        }
    }
}

void trex_fused_sattn_bwd_query_bf16_ref(float *dq, float *dsink, float *P, float *ws,
                                         const float *g, const uint16_t *gb, const float *q,
                                         const uint16_t *qb, const float *const *V,
                                         const uint16_t *const *Vb, const trex_fused_pairs *Wp,
                                         int64_t n, int64_t H, int64_t c, const float *sink,
                                         float scale, const float *lse, const float *D)
{
    (void)Wp;
    float *rq = ws, *rg = ws + H * c, *dzb = ws + 2 * H * c, *rv = dzb + H * n;
    query_into(rq, q, qb, H * c);
    query_into(rg, g, gb, H * c);
    for (int64_t e = 0; e < n; e++) {
        entry_into(rv + e * c, V, Vb, e, c);
        for (int64_t h = 0; h < H; h++) {
            const float s = scale * am_dot_f(rq + h * c, rv + e * c, c);
            const float dp = am_dot_f(rg + h * c, rv + e * c, c);
            const float p = expf(s - lse[h]);
            dzb[h * n + e] = bf(p * (dp - D[h]));
            if (P)
                P[h * n + e] = p;
        }
    }
    for (int64_t i = 0; i < H * c; i++)
        dq[i] = 0.0f;
    for (int64_t e = 0; e < n; e++) {
        const float *re = rv + e * c;
        for (int64_t h = 0; h < H; h++) {
            const float a = dzb[h * n + e];
            float *dqh = dq + h * c;
            for (int64_t i = 0; i < c; i++)
                dqh[i] += a * re[i];
        }
    }
    for (int64_t i = 0; i < H * c; i++)
        dq[i] *= scale;
    for (int64_t h = 0; h < H; h++)
        dsink[h] = -expf(sink[h] - lse[h]) * D[h];
}

void trex_fused_sattn_bwd_entries_bf16_ref(float *const *dV, float *psum, float *ws,
                                           const float *const *V, const uint16_t *const *Vb,
                                           int64_t n, const float *q, const uint16_t *qb,
                                           const float *g, const uint16_t *gb, int64_t H, int64_t c,
                                           float scale, const float *lse, const float *D)
{
    float *rq = ws, *rg = ws + H * c, *rv = ws + 2 * H * c, *ab = ws + 2 * H * c + c;
    query_into(rq, q, qb, H * c);
    query_into(rg, g, gb, H * c);
    for (int64_t e = 0; e < n; e++) {
        entry_into(rv, V, Vb, e, c);
        float ps = 0.0f;
        for (int64_t h = 0; h < H; h++) {
            const float s = scale * am_dot_f(rq + h * c, rv, c);
            const float dp = am_dot_f(rg + h * c, rv, c);
            const float p = expf(s - lse[h]);
            ab[h] = bf(p);
            ab[H + h] = bf(scale * (p * (dp - D[h])));
            ps += p;
        }
        psum[e] = ps;
        float *dv = dV[e];
        for (int64_t i = 0; i < c; i++) {
            float acc = ab[0] * rg[i];
            for (int64_t h = 1; h < H; h++)
                acc += ab[h] * rg[h * c + i];
            for (int64_t h = 0; h < H; h++)
                acc += ab[H + h] * rq[h * c + i];
            dv[i] += acc;
        }
    }
}

/* dots_bf16 (kernels/fused.h): out[r*n + e] = am_dot_f(bf(A_r), K_e), the entries K_e given in bf16
 * (exact in fp32). ws: the rounded rows [R*c] and one widened entry [c]. */
void trex_fused_dots_bf16_ref(float *out, float *ws, const float *A, int64_t lda, int64_t R,
                              const uint16_t *Kb, const int64_t *idx, int64_t n, int64_t c)
{
    float *ra = ws, *rv = ws + R * c;
    for (int64_t r = 0; r < R; r++)
        round_into(ra + r * c, A + r * lda, c);
    for (int64_t e = 0; e < n; e++) {
        const uint16_t *k = Kb + (idx ? idx[e] : e) * c;
        for (int64_t i = 0; i < c; i++) {
            const uint32_t u = (uint32_t)k[i] << 16;
            memcpy(rv + i, &u, sizeof u);
        }
        for (int64_t r = 0; r < R; r++)
            out[r * n + e] = am_dot_f(ra + r * c, rv, c);
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
void trex_fused_sattn_fwd_block_bf16_ref(float *o, float *lse, float *ws, const uint16_t *qb,
                                         int64_t nq, const int64_t *vis, const uint16_t *const *Vb,
                                         const trex_fused_pairs *Wp, int64_t n, int64_t H, int64_t c,
                                         const float *sink, float scale)
{
    (void)Wp;
    const uint16_t **list = block_list_at(ws, n, H, c);
    for (int64_t b = 0; b < nq; b++) {
        const int64_t k = block_list(list, vis + 4 * b, Vb);
        trex_fused_sattn_fwd_bf16_ref(o + b * H * c, lse + b * H, NULL, NULL, ws, NULL,
                                      qb + b * H * c, NULL, list, NULL, k, H, c, sink, scale);
    }
}

/* sattn_bwd_query_block_bf16 (kernels/fused.h): each query by the query side below on its visible
 * entries, so the per-query bits. */
void trex_fused_sattn_bwd_query_block_bf16_ref(float *dq, float *dsink, float *ws,
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
        trex_fused_sattn_bwd_query_bf16_ref(dq + b * H * c, dsink + b * H, NULL, ws, NULL,
                                            gb + b * H * c, NULL, qb + b * H * c, NULL, list, NULL,
                                            k, H, c, sink, scale, lse + b * H, D + b * H);
    }
}

/* sattn_bwd_window_bf16 (kernels/fused.h): the key side of nq consecutive queries, one fp32 sum per
 * entry over the terms of every query that sees it (b ascending; per query the g terms, heads
 * ascending, then the q terms), started at the first term, then one add into dV[e].
 * ws: bf(q), bf(g) of the nq queries [nq*H*c each], one widened entry [c], the coefficients [2H*nq]. */
void trex_fused_sattn_bwd_window_bf16_ref(float *const *dV, float *ws, const uint16_t *const *Vb,
                                          int64_t n, int64_t nq, const int64_t *vis,
                                          const uint16_t *qb, const uint16_t *gb, int64_t H,
                                          int64_t c, float scale, const float *lse, const float *D)
{
    const int64_t hc = H * c;
    float *rq = ws, *rg = ws + nq * hc, *rv = ws + 2 * nq * hc, *ab = rv + c;
    query_into(rq, NULL, qb, nq * hc);
    query_into(rg, NULL, gb, nq * hc);
    for (int64_t e = 0; e < n; e++) {
        entry_into(rv, NULL, Vb, e, c);
        bool any = false;
        for (int64_t b = 0; b < nq; b++) {
            if (e < vis[2 * b] || e >= vis[2 * b + 1])
                continue;
            any = true;
            const float *q = rq + b * hc, *g = rg + b * hc;
            for (int64_t h = 0; h < H; h++) {
                const float s = scale * am_dot_f(q + h * c, rv, c);
                const float dp = am_dot_f(g + h * c, rv, c);
                const float p = expf(s - lse[b * H + h]);
                ab[2 * H * b + h] = bf(p);
                ab[2 * H * b + H + h] = bf(scale * (p * (dp - D[b * H + h])));
            }
        }
        if (!any)
            continue;
        float *dv = dV[e];
        for (int64_t i = 0; i < c; i++) {
            float acc = 0.0f;
            bool first = true;
            for (int64_t b = 0; b < nq; b++) {
                if (e < vis[2 * b] || e >= vis[2 * b + 1])
                    continue;
                const float *q = rq + b * hc, *g = rg + b * hc, *a = ab + 2 * H * b;
                for (int64_t h = 0; h < 2 * H; h++) {
                    const float t = a[h] * (h < H ? g[h * c + i] : q[(h - H) * c + i]);
                    acc = first ? t : acc + t;
                    first = false;
                }
            }
            dv[i] += acc;
        }
    }
}
