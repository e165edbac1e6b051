/* model/moe.c — the DeepSeek-V4 MoE sub-layer (MODEL_SPEC §4, §10), fp32 reference, forward and backward.
 *
 * Router in fp32: z = gate x, s = sqrt(softplus(z)); hash layers take the experts from tid2eid[token],
 * other layers the top-K of s + gate_bias (ties: lower expert index; the bias selects only); mixing
 * weights g_k = route_scale * s_{I_k} / sum_k' s_{I_k'}. Experts are clamped SwiGLU FFNs; the shared
 * expert runs over every token with weight 1. Balance loss (non-hash layers): per row,
 * alpha * sum_i f_i P_i (docs/model-conventions.md), mean over rows.
 *
 * Layout of the work: tokens are permuted by expert with a counting sort that is stable in the slot
 * index t*K+k, so each expert sees its tokens in increasing token order; each expert then runs as
 * GEMMs over its group in chunks of at most MOE_CHUNK rows, and its outputs are scattered back (added)
 * into y. Every output element is produced by one thread in an order fixed by the routing alone
 * (shared expert first, then experts in index order; reductions over tokens in token order), so the
 * results are bitwise the same for any thread count. That is the fp32 path (ctx->compute TREX_F32, the
 * reference). In bf16 mode the experts run instead as grouped GEMMs (trex_gemm_grouped_mixed): the
 * permuted rows in passes of at most MOE_RANGE, each product one call over every expert of the pass, so
 * both cores share all experts and each weight is packed once per pass; each token then adds its rows
 * in expert order, which keeps y and dx in the per-expert order. The products' activation operands are
 * kept in bf16 (rounded as the packers would), the weights are read from their bf16 copies where the
 * trainer keeps them (trex_moe_w.wc, see moe_wb_get: as rows, where experts with few rows take them as
 * the A operand of the forward products, see swap_piece; or as the products' packed B panels, which no
 * call packs again, see wb_products), and SwiGLU runs through the fused-kernel table
 * (swiglu_*_bf16: vectorised, its own exp). Math, derivations and layout: docs/moe.md. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "trex/status.h"

#define MOE_REAL float
#define MOE_SFX _f
#include "model/moe_math.h"
#undef MOE_REAL
#undef MOE_SFX

#define MOE_MAX_K 64    /* largest num_experts_per_tok handled (per-token arrays live on the stack) */
#define MOE_CHUNK 1024  /* rows per expert GEMM: bounds the scratch, fixed so results do not vary */
#define MOE_RANGE 8192  /* bf16 mode: permuted rows per grouped pass (bounds the scratch; fixed) */
#define MOE_PAD 32      /* bf16 mode: padding (elements, 64 bytes) of the backward's bf16 rows */
#define MOE_PAD_AU 16   /* bf16 mode: padding (floats, 64 bytes) of the a | u rows */
#define MOE_SWAP_ROWS 192 /* bf16 mode: pieces of at most this many rows take the weight as A (swap_*) */
#define MOE_SWAP_MAX 256  /* bf16 mode: such pieces per pass, at most (the others run as usual) */

/* What backward needs, carved from ctx->arena by forward. */
struct trex_moe_cache {
    int64_t B, T, N, E, K, I, d;
    bool hash;
    int32_t *idx;      /* [N,K] chosen experts of each token, k order */
    float *gw;         /* [N,K] mixing weights g_k */
    float *z, *s;      /* [N,E] router logits and affinities */
    float *f;          /* [B,E] f_i of each row (non-hash layers; NULL otherwise) */
    int64_t *off;      /* [E+1] start of each expert's group in permuted order */
    int32_t *perm;     /* [N*K] permuted position -> slot t*K+k */
    int32_t *spos;     /* [N,K] bf16 mode: each token's permuted positions, ascending (else NULL) */
    float *a, *u;      /* [N*K, I] routed W1x and W3x before the clamp, permuted order, rows lau apart */
    float *sa, *su;    /* [N, I] the same for the shared expert */
    int64_t lau;       /* row stride of a, u, sa, su: I (fp32 mode, separate arrays); 2I + MOE_PAD_AU
                        * (bf16 mode: a | u side by side, u = a + I, one product's C) */
};

/* ---- elementwise helpers ------------------------------------------------------------------------- */

static inline float silu_f(float a)
{
    return a / (1.0f + expf(-a));
}

/* Clamped SwiGLU activation h = SiLU(min(a, L)) * clamp(u, -L, L); L <= 0 means no clamp. NaN passes
 * through the clamp (comparisons with NaN are false). */
static inline float swiglu_f(float a, float u, float L)
{
    if (L > 0.0f) {
        a = a > L ? L : a;
        u = u > L ? L : (u < -L ? -L : u);
    }
    return silu_f(a) * u;
}

/* ---- row tasks for the pool ---------------------------------------------------------------------- */

static int64_t grain_for(int64_t row_cost)
{
    return row_cost >= 16384 ? 1 : 16384 / (row_cost > 0 ? row_cost : 1);
}

typedef struct gate_args {
    const trex_fused_table *f;
    const float *x, *gt;
    float *z;
    int64_t d, E;
} gate_args;

/* bf16 mode: router logits of rows [t0, t1) through the fused table (the fp32 GEMM's bits). */
static void gate_rows(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const gate_args *g = arg;
    g->f->gate_fwd(g->z + t0 * g->E, g->x + t0 * g->d, g->gt, t1 - t0, g->d, g->E);
}

typedef struct gate_bwd_args {
    const trex_fused_table *f;
    const float *dz, *x, *gate;
    float *dx, *dg, *ws;
    int64_t N, d, E;
} gate_bwd_args;

/* bf16 mode: dx += dz W_g for rows [t0, t1) (the fp32 GEMM's bits). */
static void gate_bwd_dx_rows(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const gate_bwd_args *g = arg;
    g->f->gate_bwd_dx(g->dx + t0 * g->d, g->dz + t0 * g->E, g->gate, t1 - t0, g->d, g->E);
}

/* bf16 mode: dW_g += dz^T x for the columns of 16-wide units [u0, u1) (the fp32 GEMM's bits). */
static void gate_bwd_dw_cols(void *arg, int64_t u0, int64_t u1, int tid)
{
    (void)tid;
    const gate_bwd_args *g = arg;
    g->f->gate_bwd_dw(g->dg, g->ws, g->dz, g->x, g->N, g->d, g->E, u0 * 16,
                      u1 * 16 < g->d ? u1 * 16 : g->d);
}

typedef struct router_args {
    const float *z, *bias;
    float *s, *gw;
    int32_t *idx;
    const int32_t *tokens, *tid2eid; /* hash layers */
    int64_t E, K;
    float scale;
} router_args;

/* Affinities, selection and mixing weights of tokens [t0, t1). */
static void router_rows(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const router_args *r = arg;
    const int64_t E = r->E, K = r->K;
    for (int64_t t = t0; t < t1; t++) {
        const float *z = r->z + t * E;
        float *s = r->s + t * E;
        int32_t *idx = r->idx + t * K;
        for (int64_t i = 0; i < E; i++)
            s[i] = moe_sqrtsp_f(z[i]);
        if (r->tid2eid) {
            const int32_t *row = r->tid2eid + (int64_t)r->tokens[t] * K;
            for (int64_t k = 0; k < K; k++)
                idx[k] = row[k];
        } else {
            /* Top-K of s + b, best first. A candidate enters only if strictly greater than an entry,
             * and is placed after the entries it equals: among equal scores the lower index wins. */
            float best[MOE_MAX_K];
            int64_t n = 0;
            for (int64_t i = 0; i < E; i++) {
                const float v = s[i] + (r->bias ? r->bias[i] : 0.0f);
                if (n == K && !(v > best[K - 1]))
                    continue;
                int64_t p = n < K ? n : K - 1;
                while (p > 0 && v > best[p - 1]) {
                    best[p] = best[p - 1];
                    idx[p] = idx[p - 1];
                    p--;
                }
                best[p] = v;
                idx[p] = (int32_t)i;
                if (n < K)
                    n++;
            }
        }
        float ssel[MOE_MAX_K];
        for (int64_t k = 0; k < K; k++)
            ssel[k] = s[idx[k]];
        moe_mix_f(K, ssel, r->scale, r->gw + t * K);
    }
}

typedef struct gather_args {
    const int32_t *perm; /* slots; token = slot / K */
    int64_t K, d;
    const void *src1, *src2; /* rows of d elements of esize bytes (fp32 or bf16) */
    void *dst1, *dst2;
    size_t esize;
    int64_t ld;              /* gather_rows: row stride of sources and destinations (elements) */
} gather_args;

/* dst[r] = src[token of perm[r]] for one or two sources. */
static void gather_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const gather_args *g = arg;
    const size_t row = (size_t)g->d * g->esize, ld = (size_t)g->ld * g->esize;
    for (int64_t r = r0; r < r1; r++) {
        const size_t t = (size_t)(g->perm[r] / g->K);
        memcpy((char *)g->dst1 + (size_t)r * ld, (const char *)g->src1 + t * ld, row);
        if (g->src2)
            memcpy((char *)g->dst2 + (size_t)r * ld, (const char *)g->src2 + t * ld, row);
    }
}

/* dst[token of perm[r]] += src[r]. The tokens of one chunk are distinct, so rows never collide. */
static void scatter_add_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const gather_args *g = arg;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t t = g->perm[r] / g->K;
        float *dst = (float *)g->dst1 + t * g->d;
        const float *src = (const float *)g->src1 + r * g->d;
        for (int64_t j = 0; j < g->d; j++)
            dst[j] += src[j];
    }
}

/* bf16 mode: the routed rows of a pass are the permuted positions [p0, p1) (experts of consecutive
 * indices, each a contiguous group). spos [N,K] lists each token's K positions in increasing order, so
 * adding a token's rows in that order adds its experts in index order, as the fp32 path does. */
/* 16 floats as one value (GCC vector extension: SSE2 in the default build), element-wise adds. */
typedef float moe_v16 __attribute__((vector_size(64)));

typedef struct combine_args {
    const int32_t *spos;
    const float *src;      /* [p1 - p0, d] rows of the pass */
    float *dst;            /* [N, d], added to */
    int64_t K, d, p0, p1;
} combine_args;

/* dst[t] += src[r - p0] for each position r of token t inside [p0, p1), r ascending. Tokens are
 * independent, so the pool may split them any way. Each element is ((dst + s_0) + s_1) + ..., the
 * order of adding the rows one by one, summed in registers 16 columns at a time and stored once. */
static void combine_rows(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const combine_args *c = arg;
    const int64_t d = c->d;
    for (int64_t t = t0; t < t1; t++) {
        float *dst = c->dst + t * d;
        const float *src[MOE_MAX_K];
        int64_t n = 0;
        for (int64_t k = 0; k < c->K; k++) {
            const int64_t r = c->spos[t * c->K + k];
            if (r >= c->p0 && r < c->p1)
                src[n++] = c->src + (r - c->p0) * d;
        }
        int64_t j = 0;
        for (; j + 16 <= d; j += 16) {
            moe_v16 acc, v;
            memcpy(&acc, dst + j, sizeof acc);
            for (int64_t i = 0; i < n; i++) {
                memcpy(&v, src[i] + j, sizeof v);
                acc += v;
            }
            memcpy(dst + j, &acc, sizeof acc);
        }
        for (; j < d; j++) {
            float v = dst[j];
            for (int64_t i = 0; i < n; i++)
                v += src[i][j];
            dst[j] = v;
        }
    }
}

/* The experts of a pass [p0, p1) of permuted rows: expert e's piece is its group cut to the pass
 * (empty pieces are left out). Rows of the pass buffers are relative to p0. */
typedef struct piece_list {
    const int64_t *off;
    int64_t E, p0, p1;
} piece_list;

/* bf16 mode, the forward products of routed experts with few rows (T = 512: about 128 rows per expert).
 * With the weight as B (C = X W^T, a row of C per token, as everywhere else) the GEMM packs each weight
 * into its shared workspace (batches of up to 24 MiB, out of the cores' caches) and reads it back for
 * blocks of C of at most 256 rows: at 128 rows, packing the weights costs about as much as the product.
 * With the weight as A (C^T = W X^T: the same call flags, A as stored, B transposed) each thread packs
 * 256-row blocks of the weight into its own A buffer, in cache while it uses them, and X is packed once.
 * The price is C^T: a scratch [N, rows] per piece, transposed into place (swap_back) before SwiGLU and
 * before the combine, about 1 us per row and product at dsv4-bench's shapes. Measured (docs/perf.md
 * "MoE class, round 8"): the products of 24 experts of R rows, a | u (N = 2I = 1024, K = d = 1024) and
 * W2's (N = d = 1024, K = I = 512), fall by 41% and 29% at R = 128, 27% and 18% at R = 256, and W2's
 * rises by 41% at R = 512; the layer's forward at T = 512 fell by 13-21%, and at T = 1024 (256 rows
 * per expert) a limit of 256 rows cost 5% where 192 broke even. So pieces of at most MOE_SWAP_ROWS rows
 * run swapped, the others as before, in the same grouped call. Each element of C is the same sum of the
 * same exact bf16 products in the same k order whichever operand holds the weight (the micro-kernels'
 * order depends on k only), so C has the same bits (test_moe --bench hashes at every level; part 6 of
 * tests/test_moe.c). Only with the weights' bf16 copies: then both operands are bf16, as one call needs.
 * The backward's dh = dy W2 and dx = [da du] [W1; W3] swapped (A = W transposed) measured -6% on the
 * products but +0.004 CPU-s per call for the transposes at T = 512: not done. */
typedef struct swap_piece {
    int64_t r0, rows; /* rows [r0, r0 + rows) of the pass */
    float *t;         /* [N, rows]: the piece's C^T */
} swap_piece;

typedef struct swap_set {
    swap_piece p[MOE_SWAP_MAX];
    int64_t n, rows;  /* pieces, their rows in all */
    int64_t N;        /* columns of C */
    float *c0;        /* C of the pass (row r0 at c0 + r0 ldc) */
    int64_t ldc;
} swap_set;

/* A product over each piece's rows: probs[i] = {M = rows, N, K = Kd, A = a0 + (lo - p0) lda (bf16),
 * B = Bs[e] (ldb; fp32 weights or their bf16 copies), C = c0 + (lo - p0) ldc}; but with t0 (bf16
 * copies only), a piece of at most MOE_SWAP_ROWS rows as C^T = B op(A)^T into t0 (pieces one after
 * the other, recorded in sw for swap_back). Returns the count. */
static int64_t pieces_fwd(trex_gemm_problem *probs, const piece_list *pl, const void *const *Bs,
                          int64_t N, int64_t Kd, const uint16_t *a0, int64_t lda, int64_t ldb,
                          float *c0, int64_t ldc, float *t0, swap_set *sw)
{
    int64_t n = 0;
    if (t0)
        *sw = (swap_set){.N = N, .c0 = c0, .ldc = ldc};
    for (int64_t e = 0; e < pl->E; e++) {
        const int64_t lo = pl->off[e] > pl->p0 ? pl->off[e] : pl->p0;
        const int64_t hi = pl->off[e + 1] < pl->p1 ? pl->off[e + 1] : pl->p1, rows = hi - lo;
        if (rows <= 0)
            continue;
        const uint16_t *a = a0 + (lo - pl->p0) * lda;
        if (t0 && rows <= MOE_SWAP_ROWS && sw->n < MOE_SWAP_MAX) {
            float *t = t0 + sw->rows * N;
            sw->p[sw->n++] = (swap_piece){lo - pl->p0, rows, t};
            sw->rows += rows;
            probs[n++] = (trex_gemm_problem){N, rows, Kd, Bs[e], ldb, a, lda, t, rows, NULL, 0};
        } else {
            probs[n++] = (trex_gemm_problem){rows, N, Kd, a, lda, Bs[e], ldb,
                                             c0 + (lo - pl->p0) * ldc, ldc, NULL, 0};
        }
    }
    return n;
}

/* Weight gradients over each piece's rows (K = rows): problems {M, Nn, A = a0 + (lo - p0) lda (to be
 * used transposed), B = b0 + (lo - p0) ldb, C = dW[e] (ldc Nn)}, A and B bf16, written from probs[*nw]
 * on: with zero (dW holds zeros before each expert's first rows) the pieces that start an expert's
 * rows first, *nw advanced past them (they write their C: wgrad_products), then the piece that
 * continues an expert begun in an earlier pass (only the first expert of a pass can), at the end.
 * Returns the new count. The order of a call's problems changes no bit of any C. */
static int64_t pieces_wgrad(trex_gemm_problem *probs, int64_t n, int64_t *nw, const piece_list *pl,
                            float *const *dW, int64_t M, int64_t Nn, const uint16_t *a0, int64_t lda,
                            const uint16_t *b0, int64_t ldb, bool zero)
{
    for (int64_t e = 0; e < pl->E; e++) {
        const int64_t lo = pl->off[e] > pl->p0 ? pl->off[e] : pl->p0;
        const int64_t hi = pl->off[e + 1] < pl->p1 ? pl->off[e + 1] : pl->p1;
        if (hi <= lo)
            continue;
        const trex_gemm_problem p = {M, Nn, hi - lo, a0 + (lo - pl->p0) * lda, lda,
                                     b0 + (lo - pl->p0) * ldb, ldb, dW[e], Nn, NULL, 0};
        if (zero && lo == pl->off[e]) { /* ahead of the summing ones: probs [nw, n) */
            memmove(probs + *nw + 1, probs + *nw, (size_t)(n - *nw) * sizeof *probs);
            probs[(*nw)++] = p;
            n++;
        } else {
            probs[n++] = p;
        }
    }
    return n;
}

/* dW += A^T B for problems [0, np) (pieces_wgrad), of which the first nw write their C instead (beta
 * 0: their dW held zeros); arl / brl: the problems' row lists (trex_gemm_grouped_rows), or NULL. */
static void wgrad_products(trex_pool *pool, trex_gemm_ws *gws, trex_gemm_problem *probs,
                           const int32_t **arl, const int32_t **brl, int64_t np, int64_t nw)
{
    for (int part = 0; part < 2; part++) {
        const int64_t i0 = part ? nw : 0, n = part ? np - nw : nw;
        if (n <= 0)
            continue;
        const float beta = part ? 1.0f : 0.0f;
        if (arl || brl)
            trex_gemm_grouped_rows(pool, gws, TREX_BF16, true, false, 1.0f, beta, probs + i0,
                                   arl ? arl + i0 : NULL, brl ? brl + i0 : NULL, n);
        else
            trex_gemm_grouped(pool, gws, TREX_BF16, true, false, 1.0f, beta, probs + i0, n);
    }
}

typedef struct swiglu_args {
    const float *a, *u;    /* [n, I] pre-activations */
    float *h;              /* forward: [n, I] out (weighted); backward: [n, I] in, holds g*h0 */
    float *dh;             /* backward: [n, I] dL/d(weighted h) in, dL/da out */
    float *du;             /* backward: [n, I] dL/du out */
    const int32_t *perm;   /* routed: slot of each row; NULL for the shared expert */
    const float *gw;       /* [N*K] mixing weights by slot (routed) */
    float *dg;             /* [N*K] dL/dg by slot (routed backward) */
    int64_t I;
    float L;
} swiglu_args;

/* Forward: h[r] = g_r * SwiGLU(a[r], u[r]) (g_r = 1 for the shared expert). */
static void swiglu_fwd_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const swiglu_args *s = arg;
    const int64_t I = s->I;
    for (int64_t r = r0; r < r1; r++) {
        const float *a = s->a + r * I, *u = s->u + r * I;
        float *h = s->h + r * I;
        if (s->perm) {
            const float g = s->gw[s->perm[r]];
            for (int64_t j = 0; j < I; j++)
                h[j] = swiglu_f(a[j], u[j], s->L) * g;
        } else {
            for (int64_t j = 0; j < I; j++)
                h[j] = swiglu_f(a[j], u[j], s->L);
        }
    }
}

/* Backward of h = g * SiLU(ac) * uc with ac = min(a, L), uc = clamp(u, -L, L):
 * dg = sum_j dh_j h0_j (h0 = SiLU(ac) uc), da = g dh uc SiLU'(ac) [a < L], du = g dh SiLU(ac) [|u| < L].
 * At the clamp boundary the unclamped derivative is used (any subgradient is acceptable). */
static void swiglu_bwd_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const swiglu_args *s = arg;
    const int64_t I = s->I;
    const float L = s->L;
    for (int64_t r = r0; r < r1; r++) {
        const float *a = s->a + r * I, *u = s->u + r * I;
        float *dh = s->dh + r * I, *du = s->du + r * I;
        const float g = s->perm ? s->gw[s->perm[r]] : 1.0f;
        float dot = 0.0f; /* dg, summed in j order; h0 below has the bits of swiglu_f */
        for (int64_t j = 0; j < I; j++) {
            float ac = a[j], uc = u[j], ka, ku;
            trex_swiglu_clamp(&ac, &uc, &ka, &ku, L);
            const float ex = expf(-ac);
            const float sig = 1.0f / (1.0f + ex);
            const float sl = ac * sig;
            const float dsl = sig * (1.0f + ac * (1.0f - sig));
            dot += dh[j] * ((ac / (1.0f + ex)) * uc);
            const float d0 = dh[j] * g;
            du[j] = ku * d0 * sl;
            dh[j] = ka * d0 * uc * dsl;
        }
        if (s->perm)
            s->dg[s->perm[r]] = dot;
    }
}

typedef struct router_bwd_args {
    const float *z, *s, *dg, *cbal; /* cbal: [B,E] dL/dq_i per row, NULL without balance loss */
    const int32_t *idx;
    float *dz;
    int64_t E, K, T;
    float scale;
} router_bwd_args;

/* dz of tokens [t0, t1): through the mixing weights into the K chosen s, through the balance shares
 * into all E, then through ds/dz. */
static void router_bwd_rows(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const router_bwd_args *r = arg;
    const int64_t E = r->E, K = r->K;
    for (int64_t t = t0; t < t1; t++) {
        const float *z = r->z + t * E, *s = r->s + t * E;
        const int32_t *idx = r->idx + t * K;
        float *dz = r->dz + t * E;
        float ssel[MOE_MAX_K], dsel[MOE_MAX_K];
        for (int64_t k = 0; k < K; k++)
            ssel[k] = s[idx[k]];
        moe_mix_backward_f(K, ssel, r->scale, r->dg + t * K, dsel);
        memset(dz, 0, (size_t)E * sizeof *dz);
        for (int64_t k = 0; k < K; k++)
            dz[idx[k]] += dsel[k];
        if (r->cbal)
            moe_share_backward_f(E, s, r->cbal + (t / r->T) * E, dz);
        for (int64_t i = 0; i < E; i++)
            dz[i] = dz[i] != 0.0f ? dz[i] * moe_sqrtsp_grad_f(z[i]) : 0.0f;
    }
}

/* ---- bf16 mode: the experts as grouped GEMMs ----------------------------------------------------- */

/* bf16 mode keeps every operand of the experts' products that is not a weight in bf16 (x and dy once per
 * call, the gathered rows, SwiGLU's output and its gradients), rounded as trex_f32_to_bf16: the bytes
 * the GEMM's packers would have made of the fp32 values, at half the bytes to gather and to pack. The
 * pre-activations a, u and the products' outputs stay fp32. */

typedef struct cvt_args {
    const float *src;
    uint16_t *dst;
    int64_t d, ld;
} cvt_args;

/* dst rows [r0, r1) (ld apart) = bf16(src rows). */
static void cvt_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const cvt_args *c = arg;
    if (c->ld == c->d) {
        trex_cvt_f32_bf16(c->dst + r0 * c->d, c->src + r0 * c->d, (r1 - r0) * c->d);
        return;
    }
    for (int64_t r = r0; r < r1; r++)
        trex_cvt_f32_bf16(c->dst + r * c->ld, c->src + r * c->d, c->d);
}

static void to_bf16_rows(trex_pool *pool, uint16_t *dst, const float *src, int64_t n, int64_t d,
                         int64_t ld)
{
    cvt_args ca = {src, dst, d, ld};
    trex_pool_for(pool, n, grain_for(d), cvt_rows, &ca);
}

typedef struct swiglu16_args {
    const trex_fused_table *f;
    const float *a, *u;    /* [n, I] pre-activations, rows lau apart */
    uint16_t *h;           /* forward: [n, I] out, g * SwiGLU; backward: the same, also written */
    const float *dh;       /* backward: [n, I] dL/d(weighted h) */
    uint16_t *da, *du;     /* backward: [n, I] out, rows la apart (side by side) */
    const int32_t *perm;   /* routed: slot of each row; NULL for the shared expert (g = 1) */
    const float *gw;       /* [N*K] mixing weights by slot */
    float *dg;             /* [N*K] dL/dg by slot (routed backward) */
    int64_t I, la, lau;    /* la: row stride of da and du (backward); lau: of a and u */
    float L;
} swiglu16_args;

/* Asks for the n floats at p in cache (one prefetch per 64-byte line). */
static inline void prefetch_f(const float *p, int64_t n)
{
    for (int64_t j = 0; j < n; j += 16)
        __builtin_prefetch(p + j, 0, 3);
}

/* a and u of a row lie side by side (one product's C), two streams in each 4 KiB page, which the
 * hardware prefetcher follows poorly: the next row's a and u are asked for while this row runs. */
static void swiglu16_fwd_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const swiglu16_args *s = arg;
    const int64_t I = s->I;
    for (int64_t r = r0; r < r1; r++) {
        if (r + 1 < r1) {
            prefetch_f(s->a + (r + 1) * s->lau, I);
            prefetch_f(s->u + (r + 1) * s->lau, I);
        }
        s->f->swiglu_fwd_bf16(s->h + r * I, s->a + r * s->lau, s->u + r * s->lau, I,
                              s->perm ? s->gw[s->perm[r]] : 1.0f, s->L);
    }
}

/* The backward of rows [r0, r1), with h recomputed in the same pass (one exp per element). */
static void swiglu16_bwd_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const swiglu16_args *s = arg;
    const int64_t I = s->I;
    for (int64_t r = r0; r < r1; r++) {
        if (r + 1 < r1) {
            prefetch_f(s->a + (r + 1) * s->lau, I);
            prefetch_f(s->u + (r + 1) * s->lau, I);
        }
        const float dot = s->f->swiglu_bwd_bf16(s->h + r * I, s->da + r * s->la, s->du + r * s->la,
                                                s->a + r * s->lau, s->u + r * s->lau, s->dh + r * I, I,
                                                s->perm ? s->gw[s->perm[r]] : 1.0f, s->L);
        if (s->perm)
            s->dg[s->perm[r]] = dot;
    }
}

/* bf16 mode: whether [W1; W3] of every routed expert and of the shared expert is one [2I, d] matrix in
 * place (W3 right after W1, rows d apart): the parameter layout puts w3 right after w1 and has no gap
 * between them when I d is a multiple of 16 (docs/params.md); weights and gradients are checked
 * separately. Then the two products in which W1 and W3 share the other operand run as one product
 * each: a | u = x [W1; W3]^T of N = 2I and [dW1; dW3] += [da du]^T x of M = 2I (x packed once, not
 * twice). Otherwise (matrices built elsewhere, odd shapes) W1 and W3 run as two problems each. Both
 * forms give the same bits (each element of C sums its k in the same order). */
static bool w13_adjacent(const trex_moe_w *w, int64_t E, int64_t I, int64_t d)
{
    bool adj = w->sw3 == w->sw1 + I * d;
    for (int64_t e = 0; e < E && adj; e++)
        adj = w->w3[e] == w->w1[e] + I * d;
    return adj;
}

/* bf16 mode: the expert weights as the products read them. With bf16 copies (trex_moe_w.wc, kept by the
 * trainer: docs/params.md "bf16 compute copies") of every routed and shared w1, w3, w2, in which each
 * [W1; W3] is one [2I, d] matrix (rows d + TREX_WCOPY_PAD apart, W2's I + TREX_WCOPY_PAD): the products
 * read those (half the bytes, no rounding per call; the copies hold the packers' rounding, so the bits
 * are those of the fp32 path). Otherwise the fp32 weights, rounded while packed. */
typedef struct moe_wb {
    trex_dtype dt;                    /* TREX_BF16: the copies; TREX_F32: the fp32 weights */
    const void **w1, **w3, **w2;      /* [E] */
    const void *sw1, *sw3, *sw2;
    int64_t ld13, ld2;                /* row strides of W1 and W3, of W2 */
    bool adj;                         /* [W1; W3] one matrix (always with the copies) */
    /* With the copies as packed panels (TREX_WCOPY_PANELS): w1 and sw1 are the forward's [W1; W3]^T
     * operands (trex_gemm_packed views), w2 and sw2 the forward's W2^T; b13, sb13 the backward's
     * [W1; W3], b2, sb2 its W2 (w3, sw3 unused). Every product with a weight then runs from them. */
    bool packed;
    const void **b13, **b2;           /* [E] */
    const void *sb13, *sb2;
} moe_wb;

/* Fills wb (arrays of E pointers from ar, which the caller rewinds) for weights w; false when out of
 * activation memory. */
static bool moe_wb_get(moe_wb *wb, trex_arena *ar, const trex_moe_w *w, int64_t E, int64_t I,
                       int64_t d)
{
    const void **p = trex_arena_alloc_uninit(ar, (size_t)(5 * E) * sizeof *p);
    if (!p)
        return false;
    *wb = (moe_wb){.w1 = p, .w3 = p + E, .w2 = p + 2 * E, .b13 = p + 3 * E, .b2 = p + 4 * E};
    if (w->wc && w->wc->layout == TREX_WCOPY_PANELS) {
        bool ok = true;
        for (int64_t e = -1; e < E && ok; e++) {
            const float *s1 = e < 0 ? w->sw1 : w->w1[e], *s2 = e < 0 ? w->sw2 : w->w2[e];
            const float *s3 = e < 0 ? w->sw3 : w->w3[e];
            const trex_gemm_packed *f13 = trex_wcopy_find_packed(w->wc, s1, false);
            const trex_gemm_packed *b13 = trex_wcopy_find_packed(w->wc, s1, true);
            const trex_gemm_packed *f2 = trex_wcopy_find_packed(w->wc, s2, false);
            const trex_gemm_packed *b2 = trex_wcopy_find_packed(w->wc, s2, true);
            /* [W1; W3] one matrix of the copies: w3 stacked under w1 */
            const int64_t k1 = trex_wcopy_index(w->wc, s1), k3 = trex_wcopy_index(w->wc, s3);
            ok = f13 && b13 && f2 && b2 && trex_gemm_packed_n(f13) == 2 * I && trex_gemm_packed_k(f13) == d &&
                 trex_gemm_packed_n(f2) == d && trex_gemm_packed_k(f2) == I && k3 >= 0 &&
                 w->wc->t[k3].fwd == w->wc->t[k1].fwd && w->wc->t[k3].row0 == I;
            if (e < 0)
                wb->sw1 = f13, wb->sb13 = b13, wb->sw2 = f2, wb->sb2 = b2;
            else
                wb->w1[e] = f13, wb->b13[e] = b13, wb->w2[e] = f2, wb->b2[e] = b2;
        }
        if (ok) {
            wb->dt = TREX_BF16, wb->adj = true, wb->packed = true;
            return true;
        }
    }
    bool ok = w->wc != NULL && w->wc->layout == TREX_WCOPY_ROWS;
    if (ok) {
        int64_t l1, l3, l2;
        const uint16_t *b1 = trex_wcopy_find(w->wc, w->sw1, &l1);
        const uint16_t *b3 = trex_wcopy_find(w->wc, w->sw3, &l3);
        const uint16_t *b2 = trex_wcopy_find(w->wc, w->sw2, &l2);
        const int64_t ld13 = d + TREX_WCOPY_PAD, ld2 = I + TREX_WCOPY_PAD;
        ok = b1 && b3 && b2 && l1 == ld13 && l3 == ld13 && l2 == ld2 && b3 == b1 + I * ld13;
        wb->sw1 = b1, wb->sw3 = b3, wb->sw2 = b2;
        for (int64_t e = 0; e < E && ok; e++) {
            b1 = trex_wcopy_find(w->wc, w->w1[e], &l1);
            b3 = trex_wcopy_find(w->wc, w->w3[e], &l3);
            b2 = trex_wcopy_find(w->wc, w->w2[e], &l2);
            ok = b1 && b3 && b2 && l1 == ld13 && l3 == ld13 && l2 == ld2 && b3 == b1 + I * ld13;
            wb->w1[e] = b1, wb->w3[e] = b3, wb->w2[e] = b2;
        }
        if (ok) {
            wb->dt = TREX_BF16, wb->ld13 = ld13, wb->ld2 = ld2, wb->adj = true;
            return true;
        }
    }
    for (int64_t e = 0; e < E; e++)
        wb->w1[e] = w->w1[e], wb->w3[e] = w->w3[e], wb->w2[e] = w->w2[e];
    wb->sw1 = w->sw1, wb->sw3 = w->sw3, wb->sw2 = w->sw2;
    wb->dt = TREX_F32, wb->ld13 = d, wb->ld2 = I, wb->adj = w13_adjacent(w, E, I, d);
    return true;
}

/* One grouped call of products with the weights as B (bf16 A, not transposed; tb: B stored [N, K]):
 * from the packed panels when wb has them (probs' B are then their views), else from the copies or the
 * fp32 weights. */
static void wb_products(trex_pool *pool, trex_gemm_ws *gws, const moe_wb *wb, bool tb,
                        const trex_gemm_problem *probs, int64_t np)
{
    if (wb->packed)
        trex_gemm_grouped_prepacked(pool, gws, TREX_BF16, false, 1.0f, 0.0f, probs, np);
    else
        trex_gemm_grouped_mixed(pool, gws, TREX_BF16, wb->dt, false, tb, 1.0f, 0.0f, probs, np);
}

/* The problems of a | u = x [W1; W3]^T over the pieces of pl: C = au (rows lau apart, a in columns
 * [0, I), u in [I, 2I)), A = xg (bf16, lda), B = w1, w3 (ldb). Returns the count. */
static int64_t pieces_w13_fwd(trex_gemm_problem *probs, const piece_list *pl, const void *const *w1,
                              const void *const *w3, bool adj, int64_t I, int64_t d, const uint16_t *xg,
                              int64_t lda, int64_t ldb, float *au, int64_t lau, float *t0, swap_set *sw)
{
    if (adj)
        return pieces_fwd(probs, pl, w1, 2 * I, d, xg, lda, ldb, au, lau, t0, sw);
    TREX_ASSERT(!t0); /* the swapped pieces take [W1; W3] as one matrix (the bf16 copies) */
    const int64_t np = pieces_fwd(probs, pl, w1, I, d, xg, lda, ldb, au, lau, NULL, NULL);
    return np + pieces_fwd(probs + np, pl, w3, I, d, xg, lda, ldb, au + I, lau, NULL, NULL);
}

/* The problems of [dW1; dW3] += [da du]^T x over the pieces of pl (dadu rows la apart, xg rows lx
 * apart, both bf16), those that write their C first (*nw of them; pieces_wgrad). Returns the count. */
static int64_t pieces_w13_wgrad(trex_gemm_problem *probs, int64_t *nw, const piece_list *pl,
                                float *const *g1, float *const *g3, bool adj, int64_t I, int64_t d,
                                const uint16_t *dadu, int64_t la, const uint16_t *xg, int64_t lx, bool zero)
{
    *nw = 0;
    if (adj)
        return pieces_wgrad(probs, 0, nw, pl, g1, 2 * I, d, dadu, la, xg, lx, zero);
    const int64_t np = pieces_wgrad(probs, 0, nw, pl, g1, I, d, dadu, la, xg, lx, zero);
    return pieces_wgrad(probs, np, nw, pl, g3, I, d, dadu + I, la, xg, lx, zero);
}

/* Problems built over a pass's gathered rows at g ([n, ld]: row r of the pass at g + r ld) made to read
 * the rows of base instead, through the tokens of the pass's permuted rows (tok, from the pass's first
 * row): in each problem the operand that points into g (A, or B for the few-rows swap's x^T) becomes
 * base and its row list tok + r goes to arl or brl, the other list's entry NULL
 * (trex_gemm_grouped_rows, trex_gemm_grouped_prepacked_rows). */
static void rows_rebase(trex_gemm_problem *probs, int64_t np, const uint16_t *g, int64_t n, int64_t ld,
                        const uint16_t *base, const int32_t *tok, const int32_t **arl, const int32_t **brl)
{
    const uintptr_t g0 = (uintptr_t)g, g1 = (uintptr_t)(g + n * ld);
    for (int64_t i = 0; i < np; i++) {
        const bool a = (uintptr_t)probs[i].A >= g0 && (uintptr_t)probs[i].A < g1;
        const uintptr_t at = (uintptr_t)(a ? probs[i].A : probs[i].B);
        TREX_ASSERT(at >= g0 && at < g1);
        const int32_t *list = tok + (int64_t)((at - g0) / sizeof *g) / ld;
        arl[i] = a ? list : NULL;
        brl[i] = a ? NULL : list;
        if (a)
            probs[i].A = base;
        else
            probs[i].B = base;
    }
}

/* tok[p] = perm[p] / K for the N K permuted rows, and two row-list arrays of 2E, from ar; false (nothing
 * kept) when the arena has no room. */
static bool rows_tokens(trex_arena *ar, const trex_moe_cache *c, int32_t **tok, const int32_t ***arl,
                        const int32_t ***brl)
{
    const int64_t n = c->N * c->K;
    *tok = trex_arena_alloc_uninit(ar, (size_t)(n > 0 ? n : 1) * sizeof **tok);
    *arl = trex_arena_alloc_uninit(ar, (size_t)(4 * c->E) * sizeof **arl);
    if (!*tok || !*arl)
        return false;
    *brl = *arl + 2 * c->E;
    for (int64_t p = 0; p < n; p++)
        (*tok)[p] = c->perm[p] / (int32_t)c->K;
    return true;
}

/* wb_products with operands read through row lists (arl for A, brl for B; rows_rebase): from packed
 * panels (only A lists), else from the bf16 copies. */
static void wb_products_rows(trex_pool *pool, trex_gemm_ws *gws, const moe_wb *wb, bool tb,
                             const trex_gemm_problem *probs, const int32_t *const *arl,
                             const int32_t *const *brl, int64_t np)
{
    TREX_ASSERT(wb->dt == TREX_BF16);
    if (wb->packed)
        trex_gemm_grouped_prepacked_rows(pool, gws, TREX_BF16, 1.0f, 0.0f, probs, arl, np);
    else
        trex_gemm_grouped_rows(pool, gws, TREX_BF16, false, tb, 1.0f, 0.0f, probs, arl, brl, np);
}


/* 4 floats as one value and its lane indices (GCC vector extensions: SSE2 in the default build). */
typedef float moe_v4 __attribute__((vector_size(16)));
typedef int32_t moe_i4 __attribute__((vector_size(16)));

/* C rows [r0, r1) of one swapped piece from its C^T: 4 x 4 blocks transposed in registers. */
static void swap_piece_rows(const swap_set *sw, const swap_piece *p, int64_t r0, int64_t r1)
{
    const int64_t N = sw->N, R = p->rows, ldc = sw->ldc;
    const moe_i4 lo = {0, 4, 1, 5}, hi = {2, 6, 3, 7}, lo2 = {0, 1, 4, 5}, hi2 = {2, 3, 6, 7};
    float *c = sw->c0 + p->r0 * ldc;
    const float *t = p->t;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        int64_t j = 0;
        for (; j + 4 <= N; j += 4) {
            moe_v4 a0, a1, a2, a3;
            memcpy(&a0, t + j * R + r, sizeof a0);
            memcpy(&a1, t + (j + 1) * R + r, sizeof a1);
            memcpy(&a2, t + (j + 2) * R + r, sizeof a2);
            memcpy(&a3, t + (j + 3) * R + r, sizeof a3);
            const moe_v4 t0 = __builtin_shuffle(a0, a1, lo), t1 = __builtin_shuffle(a0, a1, hi);
            const moe_v4 t2 = __builtin_shuffle(a2, a3, lo), t3 = __builtin_shuffle(a2, a3, hi);
            const moe_v4 o0 = __builtin_shuffle(t0, t2, lo2), o1 = __builtin_shuffle(t0, t2, hi2);
            const moe_v4 o2 = __builtin_shuffle(t1, t3, lo2), o3 = __builtin_shuffle(t1, t3, hi2);
            memcpy(c + r * ldc + j, &o0, sizeof o0);
            memcpy(c + (r + 1) * ldc + j, &o1, sizeof o1);
            memcpy(c + (r + 2) * ldc + j, &o2, sizeof o2);
            memcpy(c + (r + 3) * ldc + j, &o3, sizeof o3);
        }
        for (; j < N; j++)
            for (int64_t q = r; q < r + 4; q++)
                c[q * ldc + j] = t[j * R + q];
    }
    for (; r < r1; r++)
        for (int64_t j = 0; j < N; j++)
            c[r * ldc + j] = t[j * R + r];
}

/* Rows [q0, q1) of the swapped pieces (counted over the pieces in order): C rows from C^T. */
static void swap_rows(void *arg, int64_t q0, int64_t q1, int tid)
{
    (void)tid;
    const swap_set *sw = arg;
    int64_t base = 0;
    for (int64_t i = 0; i < sw->n && q0 < q1; base += sw->p[i].rows, i++) {
        const swap_piece *p = &sw->p[i];
        if (q0 >= base + p->rows)
            continue;
        const int64_t r1 = q1 - base < p->rows ? q1 - base : p->rows;
        swap_piece_rows(sw, p, q0 - base, r1);
        q0 = base + r1;
    }
}

static void swap_back(trex_pool *pool, swap_set *sw)
{
    if (sw->rows > 0)
        trex_pool_for(pool, sw->rows, 16, swap_rows, sw);
}

/* Rows of the largest sum over a pass of C rows of the pieces of at most MOE_SWAP_ROWS rows. */
static int64_t swap_rows_max(const int64_t *off, int64_t E, int64_t total, int64_t C)
{
    int64_t best = 0;
    for (int64_t p0 = 0; p0 < total; p0 += C) {
        const int64_t p1 = total - p0 < C ? total : p0 + C;
        int64_t sum = 0, n = 0;
        for (int64_t e = 0; e < E; e++) {
            const int64_t lo = off[e] > p0 ? off[e] : p0, hi = off[e + 1] < p1 ? off[e + 1] : p1;
            if (hi > lo && hi - lo <= MOE_SWAP_ROWS && n++ < MOE_SWAP_MAX)
                sum += hi - lo;
        }
        best = sum > best ? sum : best;
    }
    return best;
}

/* [W1; W3] of up to MOE_WAVE experts in bf16 ([2I, d] each, W1's rows then W3's, rows d + MOE_PAD
 * apart): the B of the backward's dx = [da du] [W1; W3], one product of K = 2I per expert. A copy
 * even where [W1; W3] is one matrix in place: packing the fp32 weights for this product (B not
 * transposed: pairs of rows 4 KiB apart, the slowest packer path) measured 7-14% slower than this copy
 * plus packing its padded bf16 rows (docs/perf.md "MoE class, round 6"). Rounded as trex_f32_to_bf16,
 * i.e. exactly what the packers make of the fp32 weights, and the one product sums k in the order of
 * two products of K = I (the second continued from the first's C), so dx has the bits of those. */
#define MOE_WAVE 8
typedef struct w13_args {
    const float *w1[MOE_WAVE], *w3[MOE_WAVE];
    uint16_t *dst;
    int64_t I, d;
} w13_args;

/* Rows [r0, r1) of the wave's [n * 2I, d] bf16 matrix (rows d + MOE_PAD apart). */
static void w13_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const w13_args *w = arg;
    const int64_t I = w->I, d = w->d;
    for (int64_t r = r0; r < r1;) {
        const int64_t e = r / (2 * I), k = r - e * 2 * I;
        const int64_t bound = e * 2 * I + (k < I ? I : 2 * I), end = bound < r1 ? bound : r1;
        const float *src = k < I ? w->w1[e] + k * d : w->w3[e] + (k - I) * d;
        for (int64_t q = r; q < end; q++)
            trex_cvt_f32_bf16(w->dst + q * (d + MOE_PAD), src + (q - r) * d, d);
        r = end;
    }
}

static void w13_bf16(trex_pool *pool, uint16_t *dst, const void *const *w1, const void *const *w3,
                     const int64_t *es, int64_t n, int64_t I, int64_t d)
{
    TREX_ASSERT(n <= MOE_WAVE);
    w13_args wa = {.dst = dst, .I = I, .d = d};
    for (int64_t j = 0; j < n; j++) {
        wa.w1[j] = w1[es[j]];
        wa.w3[j] = w3[es[j]];
    }
    trex_pool_for(pool, n * 2 * I, grain_for(d), w13_rows, &wa);
}

/* The pieces of a pass: expert e[i]'s group cut to [lo[i], hi[i]) inside [p0, p1), empty ones left
 * out; n of them (arrays of E entries from the caller). */
typedef struct pass_pieces {
    int64_t n;
    int64_t *e, *lo, *hi;
} pass_pieces;

static void pass_pieces_of(pass_pieces *pp, const piece_list *pl)
{
    pp->n = 0;
    for (int64_t e = 0; e < pl->E; e++) {
        const int64_t lo = pl->off[e] > pl->p0 ? pl->off[e] : pl->p0;
        const int64_t hi = pl->off[e + 1] < pl->p1 ? pl->off[e + 1] : pl->p1;
        if (hi <= lo)
            continue;
        pp->e[pp->n] = e, pp->lo[pp->n] = lo, pp->hi[pp->n] = hi;
        pp->n++;
    }
}

/* Scratch of bf16 mode's expert products beyond the row buffers: the [W1; W3] bf16 copies of a wave
 * of experts and the pieces of a pass. */
typedef struct w13_scratch {
    uint16_t *wb;     /* [MOE_WAVE or fewer][2I, d + MOE_PAD] */
    pass_pieces pp;   /* arrays of E */
} w13_scratch;

/* Backward dx = [da du] [W1; W3] of the pieces of pl (one product of K = 2I per expert, written over
 * dxg, row p0 first); dadu holds da and du side by side (rows la apart). With the weights' bf16 copies
 * one call over every piece; otherwise from bf16 copies of [W1; W3] made here per wave of experts. */
static void w13_backward_dx(trex_pool *pool, trex_gemm_ws *gws, const moe_wb *wb,
                            const piece_list *pl, w13_scratch *ws, trex_gemm_problem *probs,
                            const uint16_t *dadu, int64_t la, float *dxg, int64_t I, int64_t d)
{
    if (wb->dt == TREX_BF16) {
        const int64_t np = pieces_fwd(probs, pl, wb->packed ? wb->b13 : wb->w1, d, 2 * I, dadu, la, wb->ld13,
                                      dxg, d, NULL, NULL);
        wb_products(pool, gws, wb, false, probs, np);
        return;
    }
    pass_pieces *pp = &ws->pp;
    pass_pieces_of(pp, pl);
    const int64_t nw = (pp->n + MOE_WAVE - 1) / MOE_WAVE;
    for (int64_t v = 0; v < nw; v++) {
        const int64_t j0 = v * pp->n / nw, j1 = (v + 1) * pp->n / nw;
        w13_bf16(pool, ws->wb, wb->w1, wb->w3, pp->e + j0, j1 - j0, I, d);
        for (int64_t j = j0; j < j1; j++) {
            const int64_t r = pp->lo[j] - pl->p0;
            probs[j - j0] = (trex_gemm_problem){pp->hi[j] - pp->lo[j], d, 2 * I, dadu + r * la, la,
                                                ws->wb + (j - j0) * 2 * I * (d + MOE_PAD),
                                                d + MOE_PAD, dxg + r * d, d, NULL, 0};
        }
        trex_gemm_grouped(pool, gws, TREX_BF16, false, false, 1.0f, 0.0f, probs, j1 - j0);
    }
}

/* The shared expert's [W1; W3] in bf16 (a one-expert list for w13_bf16), without the weights' copies. */
static void w13_shared_bf16(trex_pool *pool, uint16_t *dst, const moe_wb *wb, int64_t I, int64_t d)
{
    const void *w1 = wb->sw1, *w3 = wb->sw3;
    const int64_t e0 = 0;
    w13_bf16(pool, dst, &w1, &w3, &e0, 1, I, d);
}

/* x to bf16 (xb), then the shared expert in passes of Cs tokens (y written), then the routed experts in
 * passes of C permuted rows: gather xb, one grouped call for a | u = x [W1; W3]^T of every expert of
 * the pass, SwiGLU into bf16, one grouped call for W2, then each token adds its rows of the pass in
 * expert order (y summed as in the per-expert path: shared, then experts by index). With the weights'
 * bf16 copies, an expert with few rows in the pass takes its weight as A in both products (swap_*,
 * from ar's scratch). With keep, a | u go to the cache (else to the pass-sized c->a and sa), rows lau
 * apart. og [C, d] holds the experts' outputs; its first C*d bf16 hold the gathered inputs until W2
 * overwrites them. */
static void experts_forward_grouped(trex_pool *pool, trex_gemm_ws *gws, trex_arena *ar,
                                    trex_moe_cache *c, float *y, const float *x, uint16_t *xb,
                                    const moe_wb *wb, bool keep, float *sa, float *og, uint16_t *hg,
                                    trex_gemm_problem *probs, int64_t C, int64_t Cs, float L)
{
    const int64_t N = c->N, K = c->K, I = c->I, d = c->d, E = c->E, lau = c->lau;
    const trex_fused_table *f = trex_fused();
    const trex_dtype bt = wb->dt;
    uint16_t *xg = (uint16_t *)og;
    /* C^T of the swapped pieces (a | u, then W2's outputs): only with the weights' bf16 copies; none
     * when the arena has no room (the products then run as usual, with the same bits). */
    float *st = NULL;
    if (bt == TREX_BF16 && !wb->packed) { /* (from packed panels the weights need no packing) */
        const int64_t rs = swap_rows_max(c->off, E, N * K, C);
        st = rs > 0 ? trex_arena_alloc_uninit(ar, (size_t)(rs * (2 * I > d ? 2 * I : d)) * sizeof(float))
                    : NULL;
    }
    swap_set sw;
    to_bf16_rows(pool, xb, x, N, d, d);
    for (int64_t r0 = 0; r0 < N; r0 += Cs) {
        const int64_t n = N - r0 < Cs ? N - r0 : Cs, soff[2] = {0, n};
        const piece_list sp = {soff, 1, 0, n};
        float *a = keep ? c->sa + r0 * lau : sa;
        int64_t np = pieces_w13_fwd(probs, &sp, &wb->sw1, &wb->sw3, wb->adj, I, d, xb + r0 * d, d,
                                    wb->ld13, a, lau, NULL, NULL);
        wb_products(pool, gws, wb, true, probs, np);
        swiglu16_args sg = {.f = f, .a = a, .u = a + I, .h = hg, .I = I, .lau = lau, .L = L};
        trex_pool_for(pool, n, grain_for(I * 4), swiglu16_fwd_rows, &sg);
        probs[0] = (trex_gemm_problem){n, d, I, hg, I, wb->sw2, wb->ld2, y + r0 * d, d, NULL, 0};
        wb_products(pool, gws, wb, true, probs, 1);
    }
    /* With the bf16 copies, a | u reads x's rows through the tokens of the permuted rows (no gathered
     * copy; trex_gemm_grouped_rows); from the fp32 weights they are gathered into xg. */
    int32_t *tok = NULL;
    const int32_t **arl = NULL, **brl = NULL;
    if (bt == TREX_BF16 && !rows_tokens(ar, c, &tok, &arl, &brl))
        tok = NULL;
    for (int64_t p0 = 0; p0 < N * K; p0 += C) {
        const int64_t n = N * K - p0 < C ? N * K - p0 : C;
        const piece_list pl = {c->off, E, p0, p0 + n};
        const int32_t *perm = c->perm + p0;
        float *a = keep ? c->a + p0 * lau : c->a;
        int64_t np;
        if (tok) {
            np = pieces_w13_fwd(probs, &pl, wb->w1, wb->w3, wb->adj, I, d, xg, d, wb->ld13, a, lau, st, &sw);
            rows_rebase(probs, np, xg, n, d, xb, tok + p0, arl, brl);
            wb_products_rows(pool, gws, wb, true, probs, arl, brl, np);
        } else {
            gather_args ga = {perm, K, d, xb, NULL, xg, NULL, sizeof(uint16_t), d};
            trex_pool_for(pool, n, grain_for(d / 2), gather_rows, &ga);
            np = pieces_w13_fwd(probs, &pl, wb->w1, wb->w3, wb->adj, I, d, xg, d, wb->ld13, a, lau, st, &sw);
            wb_products(pool, gws, wb, true, probs, np);
        }
        if (st)
            swap_back(pool, &sw);
        swiglu16_args sg = {.f = f, .a = a, .u = a + I, .h = hg, .perm = perm, .gw = c->gw, .I = I,
                            .lau = lau, .L = L};
        trex_pool_for(pool, n, grain_for(I * 4), swiglu16_fwd_rows, &sg);
        /* outputs over the inputs */
        np = pieces_fwd(probs, &pl, wb->w2, d, I, hg, I, wb->ld2, og, d, st, &sw);
        wb_products(pool, gws, wb, true, probs, np);
        if (st)
            swap_back(pool, &sw);
        combine_args cb = {c->spos, og, y, K, d, p0, p0 + n};
        trex_pool_for(pool, N, grain_for(K * d), combine_rows, &cb);
    }
}

/* ---- forward ------------------------------------------------------------------------------------- */

/* bf16 mode's router products go through the fused table's skinny kernels (gate_*: the fp32 GEMM's
 * bits) where it has vector leaves; the reference table's plain loops are slower than the GEMM. */
static bool skinny_gate(void)
{
    return trex_fused()->isa >= TREX_ISA_AVX512F;
}

static void *arena_get(trex_arena *a, size_t bytes, bool *ok)
{
    void *p = trex_arena_alloc(a, bytes > 0 ? bytes : 1);
    if (!p)
        *ok = false;
    return p;
}

/* The same, not zeroed when raw (bf16 mode's large buffers, each written in full before it is read:
 * zeroing them was a pass over 60 MiB per forward at T = 1024). */
static void *arena_get_as(trex_arena *a, size_t bytes, bool raw, bool *ok)
{
    const size_t n = bytes > 0 ? bytes : 1;
    void *p = raw ? trex_arena_alloc_uninit(a, n) : trex_arena_alloc(a, n);
    if (!p)
        *ok = false;
    return p;
}

/* bf16 mode's backward scratch: not zeroed (written before read), aborts when out of memory. */
static void *scratch_x(trex_arena *a, size_t bytes)
{
    void *p = trex_arena_alloc_uninit(a, bytes > 0 ? bytes : 1);
    if (!p)
        TREX_ABORT("moe backward: out of activation memory for %zu bytes of scratch", bytes);
    return p;
}

/* Checks the hash table rows the batch uses: tokens in range, experts in range and distinct. */
static trex_code check_hash(const trex_config *cfg, int layer, const trex_seqinfo *seq,
                            const int32_t *tid2eid, int64_t N, int64_t K, int64_t E, trex_err *err)
{
    for (int64_t t = 0; t < N; t++) {
        const int32_t tok = seq->tokens[t];
        if (tok < 0 || tok >= cfg->vocab_size)
            return trex_err_set(err, TREX_ERANGE,
                                "moe layer %d: token id %d at position %lld is outside the vocabulary "
                                "[0, %lld); check the token data",
                                layer, (int)tok, (long long)t, (long long)cfg->vocab_size);
        const int32_t *row = tid2eid + (int64_t)tok * K;
        for (int64_t k = 0; k < K; k++) {
            bool bad = row[k] < 0 || row[k] >= E;
            for (int64_t j = 0; j < k && !bad; j++)
                bad = row[j] == row[k];
            if (bad)
                return trex_err_set(err, TREX_EINVAL,
                                    "moe layer %d: tid2eid row %d must hold %lld distinct experts in "
                                    "[0, %lld); fix or regenerate the hash table",
                                    layer, (int)tok, (long long)K, (long long)E);
        }
    }
    return TREX_OK;
}

trex_code trex_moe_forward(const trex_ctx *ctx, const trex_config *cfg, int layer,
                           const trex_seqinfo *seq, float *y, const float *x, const trex_moe_w *w,
                           double alpha, trex_moe_cache **cache, trex_moe_stats *stats,
                           trex_err *err)
{
    TREX_ASSERT(ctx && ctx->arena && cfg && seq && w && y && x);
    TREX_ASSERT(ctx->par.ep_size <= 1 && ctx->par.tp_size <= 1); /* single-shard reference */
    TREX_ASSERT(layer >= 0 && layer < trex_config_n_blocks(cfg));
    const int64_t B = seq->B, T = seq->T, N = B * T;
    const int64_t d = cfg->hidden_size, E = cfg->n_routed_experts, K = cfg->num_experts_per_tok;
    const int64_t I = cfg->moe_intermediate_size;
    const bool hash = trex_config_is_hash(cfg, layer);
    const float L = (float)cfg->swiglu_limit;
    trex_pool *pool = ctx->pool;
    trex_gemm_ws *gws = ctx->ws;  /* experts and shared expert: precision of the run; gate: fp32 */
    const trex_dtype gdt = ctx->compute;
    TREX_ASSERT(B >= 0 && T >= 0 && d > 0 && I > 0);
    if (cache)
        *cache = NULL;
    if (K < 1 || K > E || K > MOE_MAX_K)
        return trex_err_set(err, TREX_EUNSUPPORTED,
                            "moe layer %d: num_experts_per_tok %lld must be in [1, min(%lld, %d)]",
                            layer, (long long)K, (long long)E, MOE_MAX_K);
    if (N * K > INT32_MAX)
        return trex_err_set(err, TREX_ERANGE,
                            "moe layer %d: %lld tokens x %lld experts exceeds the int32 slot index; "
                            "use smaller micro-batches", layer, (long long)N, (long long)K);
    TREX_ASSERT(w->gate && w->w1 && w->w2 && w->w3 && w->sw1 && w->sw2 && w->sw3);
    if (hash) {
        TREX_ASSERT(w->tid2eid && seq->tokens);
        TREX_TRY(check_hash(cfg, layer, seq, w->tid2eid, N, K, E, err));
    }

    /* Saved state (cache) or plain scratch (forward only): the same arrays. */
    bool ok = true;
    trex_arena *ar = ctx->arena;
    trex_moe_cache *c = arena_get(ar, sizeof *c, &ok);
    if (!ok)
        goto oom;
    *c = (trex_moe_cache){.B = B, .T = T, .N = N, .E = E, .K = K, .I = I, .d = d, .hash = hash};
    c->idx = arena_get(ar, (size_t)(N * K) * sizeof(int32_t), &ok);
    c->gw = arena_get(ar, (size_t)(N * K) * sizeof(float), &ok);
    c->z = arena_get(ar, (size_t)(N * E) * sizeof(float), &ok);
    c->s = arena_get(ar, (size_t)(N * E) * sizeof(float), &ok);
    c->off = arena_get(ar, (size_t)(E + 1) * sizeof(int64_t), &ok);
    c->perm = arena_get(ar, (size_t)(N * K) * sizeof(int32_t), &ok);
    if (!hash)
        c->f = arena_get(ar, (size_t)(B * E) * sizeof(float), &ok);
    /* fp32: experts one by one in chunks of C rows; bf16: grouped passes of up to C rows. */
    const bool grouped = gdt != TREX_F32;
    const int64_t cmax = grouped ? MOE_RANGE : MOE_CHUNK;
    const int64_t C = (grouped ? N * K : N) < cmax ? (grouped ? N * K : N) : cmax;
    const int64_t Cs = N < cmax ? N : cmax; /* shared expert rows per pass */
    /* fp32 mode: a, u (sa, su) separate arrays; bf16 mode: a | u side by side, one product's C. */
    c->lau = grouped ? 2 * I + MOE_PAD_AU : I;
    if (grouped)
        c->spos = arena_get_as(ar, (size_t)(N * K) * sizeof(int32_t), true, &ok);
    if (cache && grouped) {
        c->a = arena_get_as(ar, (size_t)(N * K * c->lau) * sizeof(float), true, &ok);
        c->sa = arena_get_as(ar, (size_t)(N * c->lau) * sizeof(float), true, &ok);
        c->u = c->a ? c->a + I : NULL, c->su = c->sa ? c->sa + I : NULL;
    } else if (cache) {
        c->a = arena_get(ar, (size_t)(N * K * I) * sizeof(float), &ok);
        c->u = arena_get(ar, (size_t)(N * K * I) * sizeof(float), &ok);
        c->sa = arena_get(ar, (size_t)(N * I) * sizeof(float), &ok);
        c->su = arena_get(ar, (size_t)(N * I) * sizeof(float), &ok);
    }
    if (!ok)
        goto oom;
    /* Scratch from here on (bf16 mode: given back before returning). */
    const trex_arena_mark mk = trex_arena_mark_get(ar);
    float *sa = NULL;
    if (!cache && grouped) {
        c->a = arena_get_as(ar, (size_t)(C * c->lau) * sizeof(float), true, &ok);
        c->u = c->a ? c->a + I : NULL;
        sa = arena_get_as(ar, (size_t)(Cs * c->lau) * sizeof(float), true, &ok);
    } else if (!cache) {
        c->a = arena_get(ar, (size_t)(C * I) * sizeof(float), &ok);
        c->u = arena_get(ar, (size_t)(C * I) * sizeof(float), &ok);
    }
    /* xg holds the gathered inputs, then (bf16) the experts' outputs of the same rows. bf16 mode: hg
     * is bf16, xb the bf16 copy of x. */
    float *xg = arena_get_as(ar, (size_t)(C * d) * sizeof(float), grouped, &ok);
    float *og = grouped ? xg : arena_get(ar, (size_t)(C * d) * sizeof(float), &ok);
    float *hg = arena_get_as(ar, (size_t)((C > Cs ? C : Cs) * I) *
                                     (grouped ? sizeof(uint16_t) : sizeof(float)), grouped, &ok);
    uint16_t *xb = grouped ? arena_get_as(ar, (size_t)(N * d) * sizeof(uint16_t), true, &ok) : NULL;
    trex_gemm_problem *probs =
        grouped ? arena_get(ar, (size_t)(2 * E) * sizeof(trex_gemm_problem), &ok) : NULL;
    float *gt = grouped ? arena_get_as(ar, (size_t)(d * E) * sizeof(float), true, &ok) : NULL;
    moe_wb wb;
    if (!ok || (grouped && !moe_wb_get(&wb, ar, w, E, I, d)))
        goto oom;

    /* Router logits, fp32 in both modes. bf16 mode: a skinny kernel with the same bits (the gate
     * transposed to [d, E] once per call), instead of the blocked GEMM padding E to 32, where the
     * fused table has vector leaves (below AVX-512 its plain loops are slower than the GEMM). */
    if (grouped && skinny_gate()) {
        for (int64_t e = 0; e < E; e++)
            for (int64_t k = 0; k < d; k++)
                gt[k * E + e] = w->gate[e * d + k];
        gate_args gg = {trex_fused(), x, gt, c->z, d, E};
        trex_pool_for(pool, N, 4, gate_rows, &gg);
    } else {
        trex_linear_forward(pool, c->z, x, w->gate, N, d, E);
    }
    router_args ra = {c->z, hash ? NULL : w->gate_bias, c->s, c->gw, c->idx, seq->tokens,
                      hash ? w->tid2eid : NULL, E, K, (float)cfg->routed_scaling_factor};
    trex_pool_for(pool, N, grain_for(E * 8), router_rows, &ra);

    /* Counting sort of the slots by expert, stable in slot order. */
    memset(c->off, 0, (size_t)(E + 1) * sizeof(int64_t));
    for (int64_t q = 0; q < N * K; q++)
        c->off[c->idx[q] + 1]++;
    for (int64_t e = 0; e < E; e++)
        c->off[e + 1] += c->off[e];
    for (int64_t q = 0; q < N * K; q++)
        c->perm[c->off[c->idx[q]]++] = (int32_t)q;
    for (int64_t e = E; e > 0; e--)
        c->off[e] = c->off[e - 1];
    c->off[0] = 0;
    if (grouped) { /* each token's positions, ascending: walk the positions in order */
        int32_t *fill = arena_get(ar, (size_t)(N > 0 ? N : 1) * sizeof(int32_t), &ok);
        if (!ok)
            goto oom;
        memset(fill, 0, (size_t)N * sizeof(int32_t));
        for (int64_t r = 0; r < N * K; r++) {
            const int64_t t = c->perm[r] / K;
            c->spos[t * K + fill[t]++] = (int32_t)r;
        }
    }

    /* Statistics and the balance loss: per row, in token order, in double. */
    if (stats) {
        stats->balance_loss = 0.0;
        if (stats->load)
            for (int64_t e = 0; e < E; e++)
                stats->load[e] += c->off[e + 1] - c->off[e];
    }
    if (!hash && N > 0) {
        double *P = trex_arena_alloc(ar, (size_t)E * sizeof(double));
        if (!P)
            goto oom;
        double loss = 0.0;
        for (int64_t b = 0; b < B; b++) {
            float *f = c->f + b * E;
            memset(f, 0, (size_t)E * sizeof *f);
            memset(P, 0, (size_t)E * sizeof *P);
            for (int64_t t = b * T; t < (b + 1) * T; t++) {
                const float *s = c->s + t * E;
                double sum = 0.0;
                for (int64_t j = 0; j < E; j++)
                    sum += s[j];
                for (int64_t i = 0; i < E; i++)
                    P[i] += s[i] / sum;
                for (int64_t k = 0; k < K; k++)
                    f[c->idx[t * K + k]] += 1.0f;
            }
            double row = 0.0;
            for (int64_t i = 0; i < E; i++) {
                f[i] = (float)((double)f[i] * (double)E / ((double)K * (double)T));
                row += (double)f[i] * (P[i] / (double)T);
            }
            loss += alpha * row;
        }
        if (stats)
            stats->balance_loss = loss / (double)B;
    }

    if (grouped) {
        experts_forward_grouped(pool, gws, ar, c, y, x, xb, &wb, cache != NULL, sa, og, (uint16_t *)hg,
                                probs, C, Cs, L);
        goto done;
    }

    /* Shared expert over all tokens: y = W2 SwiGLU(W1 x, W3 x). */
    for (int64_t r0 = 0; r0 < N; r0 += C) {
        const int64_t n = N - r0 < C ? N - r0 : C;
        float *a = cache ? c->sa + r0 * I : c->a, *u = cache ? c->su + r0 * I : c->u;
        trex_linear_forward_ex(pool, gws, gdt, a, x + r0 * d, w->sw1, n, d, I);
        trex_linear_forward_ex(pool, gws, gdt, u, x + r0 * d, w->sw3, n, d, I);
        swiglu_args sg = {.a = a, .u = u, .h = hg, .I = I, .L = L};
        trex_pool_for(pool, n, grain_for(I * 8), swiglu_fwd_rows, &sg);
        trex_linear_forward_ex(pool, gws, gdt, y + r0 * d, hg, w->sw2, n, I, d);
    }

    /* Routed experts in index order, each over its group in chunks; outputs added into y. */
    for (int64_t e = 0; e < E; e++) {
        TREX_ASSERT(w->w1[e] && w->w2[e] && w->w3[e]);
        for (int64_t p0 = c->off[e]; p0 < c->off[e + 1]; p0 += C) {
            const int64_t n = c->off[e + 1] - p0 < C ? c->off[e + 1] - p0 : C;
            const int32_t *perm = c->perm + p0;
            float *a = cache ? c->a + p0 * I : c->a, *u = cache ? c->u + p0 * I : c->u;
            gather_args ga = {perm, K, d, x, NULL, xg, NULL, sizeof(float), d};
            trex_pool_for(pool, n, grain_for(d), gather_rows, &ga);
            trex_linear_forward_ex(pool, gws, gdt, a, xg, w->w1[e], n, d, I);
            trex_linear_forward_ex(pool, gws, gdt, u, xg, w->w3[e], n, d, I);
            swiglu_args sg = {.a = a, .u = u, .h = hg, .perm = perm, .gw = c->gw, .I = I, .L = L};
            trex_pool_for(pool, n, grain_for(I * 8), swiglu_fwd_rows, &sg);
            trex_linear_forward_ex(pool, gws, gdt, og, hg, w->w2[e], n, I, d);
            gather_args sc = {perm, K, d, og, NULL, y, NULL, sizeof(float), d};
            trex_pool_for(pool, n, grain_for(d), scatter_add_rows, &sc);
        }
    }

done:
    /* bf16 mode gives its (pass-sized but larger) scratch back here; fp32 mode leaves it to the
     * caller's rewind, the sequence src/plan/engine.c replays. */
    if (grouped) {
        trex_arena_rewind(ar, mk);
        if (!cache)
            c->a = c->u = NULL;
    }
    if (cache)
        *cache = c;
    return TREX_OK;
oom:
    return trex_err_set(err, TREX_ENOMEM,
                        "moe layer %d: out of activation memory for %lld tokens; use smaller "
                        "micro-batches or a larger activation arena", layer, (long long)N);
}

/* ---- backward ------------------------------------------------------------------------------------ */

/* fp32 mode (the reference): each expert's products over its group in chunks of MOE_CHUNK rows. */
static void experts_backward_chunked(const trex_ctx *ctx, const trex_moe_cache *c, float *dx,
                                     float *dg, const float *dy, const float *x, const trex_moe_w *w,
                                     trex_moe_w *g, float L)
{
    const int64_t N = c->N, E = c->E, K = c->K, I = c->I, d = c->d;
    trex_pool *pool = ctx->pool;
    trex_gemm_ws *gws = ctx->ws;
    const trex_dtype gdt = ctx->compute;
    trex_arena *ar = ctx->arena;
    const int64_t C = N < MOE_CHUNK ? N : MOE_CHUNK;
    float *xg = trex_arena_xalloc(ar, (size_t)(C * d) * sizeof(float));
    float *dyg = trex_arena_xalloc(ar, (size_t)(C * d) * sizeof(float));
    float *dxg = trex_arena_xalloc(ar, (size_t)(C * d) * sizeof(float));
    float *hg = trex_arena_xalloc(ar, (size_t)(C * I) * sizeof(float));
    float *dhg = trex_arena_xalloc(ar, (size_t)(C * I) * sizeof(float));
    float *dug = trex_arena_xalloc(ar, (size_t)(C * I) * sizeof(float));

    /* Shared expert: writes dx. */
    for (int64_t r0 = 0; r0 < N; r0 += C) {
        const int64_t n = N - r0 < C ? N - r0 : C;
        const float *xr = x + r0 * d, *dyr = dy + r0 * d;
        swiglu_args sg = {.a = c->sa + r0 * I, .u = c->su + r0 * I, .h = hg, .dh = dhg, .du = dug,
                          .I = I, .L = L};
        trex_pool_for(pool, n, grain_for(I * 8), swiglu_fwd_rows, &sg);
        trex_linear_backward_ex(pool, gws, gdt, dhg, g->sw2, dyr, hg, w->sw2, n, I, d, false, true);
        trex_pool_for(pool, n, grain_for(I * 16), swiglu_bwd_rows, &sg);
        trex_linear_backward_ex(pool, gws, gdt, dx + r0 * d, g->sw1, dhg, xr, w->sw1, n, d, I, false, true);
        trex_linear_backward_ex(pool, gws, gdt, dx + r0 * d, g->sw3, dug, xr, w->sw3, n, d, I, true, true);
    }

    /* Routed experts in index order: dx += scatter, dg per slot. */
    for (int64_t e = 0; e < E; e++) {
        for (int64_t p0 = c->off[e]; p0 < c->off[e + 1]; p0 += C) {
            const int64_t n = c->off[e + 1] - p0 < C ? c->off[e + 1] - p0 : C;
            const int32_t *perm = c->perm + p0;
            gather_args ga = {perm, K, d, x, dy, xg, dyg, sizeof(float), d};
            trex_pool_for(pool, n, grain_for(2 * d), gather_rows, &ga);
            swiglu_args sg = {.a = c->a + p0 * I, .u = c->u + p0 * I, .h = hg, .dh = dhg,
                              .du = dug, .perm = perm, .gw = c->gw, .dg = dg, .I = I, .L = L};
            trex_pool_for(pool, n, grain_for(I * 8), swiglu_fwd_rows, &sg);
            trex_linear_backward_ex(pool, gws, gdt, dhg, g->w2[e], dyg, hg, w->w2[e], n, I, d, false, true);
            trex_pool_for(pool, n, grain_for(I * 24), swiglu_bwd_rows, &sg);
            trex_linear_backward_ex(pool, gws, gdt, dxg, g->w1[e], dhg, xg, w->w1[e], n, d, I, false, true);
            trex_linear_backward_ex(pool, gws, gdt, dxg, g->w3[e], dug, xg, w->w3[e], n, d, I, true, true);
            gather_args sc = {perm, K, d, dxg, NULL, dx, NULL, sizeof(float), d};
            trex_pool_for(pool, n, grain_for(d), scatter_add_rows, &sc);
        }
    }
}

/* bf16 mode: x and dy to bf16, the shared expert in passes of MOE_RANGE tokens, then the routed experts
 * in passes of MOE_RANGE permuted rows, each product one grouped call over the experts of the pass. dx
 * gets the shared expert's part (written), then each token adds its rows of every pass in expert
 * order. Operands other than weights are bf16 (see above); dh and dx are fp32 products. Per pass:
 * dh = dy W2; SwiGLU's backward, which also recomputes h (one exp); dW2 += dy^T h;
 * [dW1; dW3] += [da du]^T x (one product per expert where [W1; W3] is one matrix in place, see
 * w13_adjacent); dx = [da du] [W1; W3] (one product of K = 2I per expert, from the weights' bf16 copies
 * or from copies of [W1; W3] made per wave, see w13_backward_dx). */
static void experts_backward_grouped(const trex_ctx *ctx, const trex_moe_cache *c, float *dx,
                                     float *dg, const float *dy, const float *x, const trex_moe_w *w,
                                     trex_moe_w *g, float L)
{
    const int64_t N = c->N, E = c->E, K = c->K, I = c->I, d = c->d, lau = c->lau;
    trex_pool *pool = ctx->pool;
    trex_gemm_ws *gws = ctx->ws;
    trex_arena *ar = ctx->arena;
    const trex_fused_table *f = trex_fused();
    const bool gadj = w13_adjacent(g, E, I, d);
    const int64_t C = N * K < MOE_RANGE ? N * K : MOE_RANGE, Cs = N < MOE_RANGE ? N : MOE_RANGE;
    const int64_t Ch = C > Cs ? C : Cs;
    /* bf16 rows that the packers read by pairs (32 rows, 64 bytes each, per tile: the operands of the
     * weight gradients and the B of dx) lie lx = d + MOE_PAD and la = 2I + MOE_PAD apart: at 2 KiB
     * (a power of two) the 32 rows fall into 2 sets of the L1 cache and evict each other. Measured
     * at T = 4096: the backward's CPU time -3 to -5% (docs/perf.md "MoE class, round 5"). */
    const int64_t lx = d + MOE_PAD, la = 2 * I + MOE_PAD;
    uint16_t *xb = scratch_x(ar, (size_t)(N * lx) * sizeof(uint16_t));
    uint16_t *dyb = scratch_x(ar, (size_t)(N * lx) * sizeof(uint16_t));
    /* [C, lx] fp32: the gathered bf16 x and dy rows side by side, then the rows' dx ([C, d]) */
    float *dxg = scratch_x(ar, (size_t)(C * lx) * sizeof(float));
    uint16_t *xg = (uint16_t *)dxg, *dyg = xg + C * lx;
    uint16_t *hg = scratch_x(ar, (size_t)(Ch * I) * sizeof(uint16_t));
    uint16_t *dadu = scratch_x(ar, (size_t)(Ch * la) * sizeof(uint16_t)); /* da, du side by side */
    float *dhg = scratch_x(ar, (size_t)(Ch * I) * sizeof(float));
    trex_gemm_problem *probs = trex_arena_xalloc(ar, (size_t)(2 * E) * sizeof(trex_gemm_problem));
    moe_wb wb;
    if (!moe_wb_get(&wb, ar, w, E, I, d))
        TREX_ABORT("moe backward: out of activation memory for the weight views");
    const bool copies = wb.dt == TREX_BF16;
    w13_scratch ws = {NULL, {0, NULL, NULL, NULL}};
    if (!copies) { /* the per-wave [W1; W3] copies of w13_backward_dx */
        int64_t *pa = scratch_x(ar, (size_t)(3 * E) * sizeof(int64_t));
        ws = (w13_scratch){scratch_x(ar, (size_t)((E < MOE_WAVE ? E : MOE_WAVE) * 2 * I * lx) *
                                             sizeof(uint16_t)),
                           {0, pa, pa + E, pa + 2 * E}};
    }
    to_bf16_rows(pool, xb, x, N, d, lx);
    to_bf16_rows(pool, dyb, dy, N, d, lx);

    if (!copies)
        w13_shared_bf16(pool, ws.wb, &wb, I, d);
    for (int64_t r0 = 0; r0 < N; r0 += Cs) {
        const int64_t n = N - r0 < Cs ? N - r0 : Cs, soff[2] = {0, n};
        const piece_list sp = {soff, 1, 0, n};
        const uint16_t *xr = xb + r0 * lx, *dyr = dyb + r0 * lx;
        swiglu16_args sg = {.f = f, .a = c->sa + r0 * lau, .u = c->su + r0 * lau, .h = hg, .dh = dhg,
                            .da = dadu, .du = dadu + I, .I = I, .la = la, .lau = lau, .L = L};
        /* dh = dy W2 (W2 [d, I]); SwiGLU backward and h; dW2 += dy^T h */
        probs[0] = (trex_gemm_problem){n, I, d, dyr, lx, wb.packed ? wb.sb2 : wb.sw2, wb.ld2, dhg, I, NULL, 0};
        wb_products(pool, gws, &wb, false, probs, 1);
        trex_pool_for(pool, n, grain_for(I * 8), swiglu16_bwd_rows, &sg);
        const bool zero = ctx->grads_zero && r0 == 0; /* the shared expert's first rows */
        probs[0] = (trex_gemm_problem){d, I, n, dyr, lx, hg, I, g->sw2, I, NULL, 0};
        wgrad_products(pool, gws, probs, NULL, NULL, 1, zero ? 1 : 0);
        int64_t nw, np = pieces_w13_wgrad(probs, &nw, &sp, &g->sw1, &g->sw3, gadj, I, d, dadu, la, xr, lx,
                                          zero);
        wgrad_products(pool, gws, probs, NULL, NULL, np, nw);
        probs[0] = copies ? (trex_gemm_problem){n, d, 2 * I, dadu, la, wb.packed ? wb.sb13 : wb.sw1, wb.ld13,
                                                dx + r0 * d, d, NULL, 0}
                          : (trex_gemm_problem){n, d, 2 * I, dadu, la, ws.wb, lx, dx + r0 * d, d, NULL, 0};
        if (copies)
            wb_products(pool, gws, &wb, false, probs, 1);
        else
            trex_gemm_grouped(pool, gws, TREX_BF16, false, false, 1.0f, 0.0f, probs, 1);
    }

    /* With the bf16 copies the products read x's and dy's rows through the tokens of the permuted rows
     * (trex_gemm_grouped_rows: no gathered copies); from the fp32 weights they are gathered into xg and
     * dyg. */
    int32_t *tok = NULL;
    const int32_t **arl = NULL, **brl = NULL;
    if (copies && !rows_tokens(ar, c, &tok, &arl, &brl))
        tok = NULL;
    for (int64_t p0 = 0; p0 < N * K; p0 += C) {
        const int64_t n = N * K - p0 < C ? N * K - p0 : C;
        const piece_list pl = {c->off, E, p0, p0 + n};
        const int32_t *perm = c->perm + p0;
        if (!tok) {
            gather_args ga = {perm, K, d, xb, dyb, xg, dyg, sizeof(uint16_t), lx};
            trex_pool_for(pool, n, grain_for(d), gather_rows, &ga);
        }
        swiglu16_args sg = {.f = f, .a = c->a + p0 * lau, .u = c->u + p0 * lau, .h = hg, .dh = dhg,
                            .da = dadu, .du = dadu + I, .perm = perm, .gw = c->gw, .dg = dg,
                            .I = I, .la = la, .lau = lau, .L = L};
        /* dh = dy W2 (W2 [d, I] is op(B) as stored); SwiGLU backward and h; dW2 += dy^T h. */
        int64_t np = pieces_fwd(probs, &pl, wb.packed ? wb.b2 : wb.w2, I, d, dyg, lx, wb.ld2, dhg, I, NULL, NULL);
        if (tok) {
            rows_rebase(probs, np, dyg, n, lx, dyb, tok + p0, arl, brl);
            wb_products_rows(pool, gws, &wb, false, probs, arl, brl, np);
        } else {
            wb_products(pool, gws, &wb, false, probs, np);
        }
        trex_pool_for(pool, n, grain_for(I * 8), swiglu16_bwd_rows, &sg);
        /* dW2 += dy^T h; an expert's first rows write it when the gradients start at zero */
        int64_t nw = 0;
        np = pieces_wgrad(probs, 0, &nw, &pl, g->w2, d, I, dyg, lx, hg, I, ctx->grads_zero);
        if (tok)
            rows_rebase(probs, np, dyg, n, lx, dyb, tok + p0, arl, brl);
        wgrad_products(pool, gws, probs, tok ? arl : NULL, NULL, np, nw);
        /* [dW1; dW3] += [da du]^T x; dx = [da du] [W1; W3] (over xg and dyg, spent). */
        np = pieces_w13_wgrad(probs, &nw, &pl, g->w1, g->w3, gadj, I, d, dadu, la, xg, lx,
                              ctx->grads_zero);
        if (tok)
            rows_rebase(probs, np, xg, n, lx, xb, tok + p0, arl, brl);
        wgrad_products(pool, gws, probs, NULL, tok ? brl : NULL, np, nw);
        w13_backward_dx(pool, gws, &wb, &pl, &ws, probs, dadu, la, dxg, I, d);
        combine_args cb = {c->spos, dxg, dx, K, d, p0, p0 + n};
        trex_pool_for(pool, N, grain_for(K * d), combine_rows, &cb);
    }
}

/* bf16 mode with grads_zero: each expert's weight gradients are written by the product of its first
 * rows (pieces_wgrad), the shared expert's by its first pass; those of an expert without rows in this
 * pass (all of them, the shared expert too, with no token) are cleared here instead. */
static void clear_idle_experts(const trex_moe_cache *c, trex_moe_w *g)
{
    const size_t bytes = (size_t)(c->I * c->d) * sizeof(float);
    for (int64_t e = 0; e < c->E; e++)
        if (c->N == 0 || c->off[e + 1] == c->off[e]) {
            memset(g->w1[e], 0, bytes);
            memset(g->w2[e], 0, bytes);
            memset(g->w3[e], 0, bytes);
        }
    if (c->N == 0) {
        memset(g->sw1, 0, bytes);
        memset(g->sw2, 0, bytes);
        memset(g->sw3, 0, bytes);
    }
}

void trex_moe_backward(const trex_ctx *ctx, const trex_config *cfg, int layer,
                       const trex_seqinfo *seq, float *dx, const float *dy, const float *x,
                       const trex_moe_w *w, trex_moe_w *g, const trex_moe_cache *cache,
                       double alpha, double bal_scale)
{
    TREX_ASSERT(ctx && ctx->arena && cfg && seq && dx && dy && x && w && g && cache);
    const trex_moe_cache *c = cache;
    const int64_t B = c->B, T = c->T, N = c->N, E = c->E, K = c->K, d = c->d;
    TREX_ASSERT(seq->B == B && seq->T == T && cfg->hidden_size == d && cfg->n_routed_experts == E);
    TREX_ASSERT(c->hash == trex_config_is_hash(cfg, layer));
    TREX_ASSERT(g->gate && g->w1 && g->w2 && g->w3 && g->sw1 && g->sw2 && g->sw3);
    /* The cache's layout follows the forward's precision: the backward must run in the same one. */
    TREX_ASSERT((c->spos != NULL) == (ctx->compute != TREX_F32));
    const float L = (float)cfg->swiglu_limit;
    trex_pool *pool = ctx->pool;
    trex_arena *ar = ctx->arena;
    if (ctx->grads_zero && ctx->compute == TREX_BF16)
        clear_idle_experts(c, g);
    if (N == 0)
        return;

    float *dg = trex_arena_xalloc(ar, (size_t)(N * K) * sizeof(float));
    float *dz = trex_arena_xalloc(ar, (size_t)(N * E) * sizeof(float));
    if (c->spos)
        experts_backward_grouped(ctx, c, dx, dg, dy, x, w, g, L);
    else
        experts_backward_chunked(ctx, c, dx, dg, dy, x, w, g, L);

    /* Router: dz from the mixing weights and the balance loss, then gate and dx. The balance loss is
     * (1/B) sum_b alpha sum_i f_bi (1/T) sum_t q_ti, so dL/dq_ti = bal_scale alpha f_bi / (B T). */
    float *cbal = NULL;
    if (!c->hash && alpha != 0.0 && bal_scale != 0.0) {
        cbal = trex_arena_xalloc(ar, (size_t)(B * E) * sizeof(float));
        const double k = bal_scale * alpha / ((double)B * (double)T);
        for (int64_t q = 0; q < B * E; q++)
            cbal[q] = (float)(k * (double)c->f[q]);
    }
    router_bwd_args rb = {c->z, c->s, dg, cbal, c->idx, dz, E, K, T,
                          (float)cfg->routed_scaling_factor};
    trex_pool_for(pool, N, grain_for(E * 8), router_bwd_rows, &rb);
    if (c->spos && skinny_gate()) { /* bf16 mode: skinny kernels with the fp32 GEMM's bits */
        float *ws = scratch_x(ar, (size_t)(E * d) * sizeof(float));
        gate_bwd_args gb = {trex_fused(), dz, x, w->gate, dx, g->gate, ws, N, d, E};
        trex_pool_for(pool, N, 4, gate_bwd_dx_rows, &gb);
        trex_pool_for(pool, (d + 15) / 16, 1, gate_bwd_dw_cols, &gb);
    } else {
        trex_linear_backward(pool, dx, g->gate, dz, x, w->gate, N, d, E, true);
    }
}
