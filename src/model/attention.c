/* model/attention.c — the DeepSeek-V4 attention sub-layer (SWA / CSA / HCA), fp32 forward and backward.
 *
 * Implements trex_attn_forward / trex_attn_backward of model/layers.h exactly per MODEL_SPEC §3 and
 * docs/model-conventions.md; the math and the backward derivations are in docs/attention.md.
 *
 * Shape of the computation (N tokens, every document on its own):
 *   query    qr = RMSNorm_qnorm(x Wq_a^T); q = RoPE(rms_h(qr Wq_b^T))              [N, H, c]
 *   kv       kv = RoPE(RMSNorm_kvnorm(x Wkv^T))                                     [N, c]
 *   ratio>0  compressed entries C = RoPE(RMSNorm(pool(x Wc_kv^T, x Wc_gate^T + ape)))  [nc, c]
 *   ratio 4  indexer: iq = RoPE(qr Wi_q^T), hw = x Wi_w^T / sqrt(cI nI), K^I = own compressor;
 *            score I_ts = sum_h hw_th ReLU(iq_th . K^I_s); top-k in sparse mode
 *   core     per query: one softmax over window kv + compressed entries + sink (K = V); inverse RoPE
 *   output   y = (grouped wo_a) wo_b
 *
 * Memory stays O(N (window + k)) per layer: attention probabilities are never stored. The forward keeps
 * the log-sum-exp of each (query, head) and the backward recomputes the probabilities twice, once on
 * the query side (dq, d sink, indexer query gradients) and once on the key side (gradients of the
 * shared kv / compressed / indexer-key vectors), so that every shared gradient row is summed by one
 * thread in a fixed order (queries ascending, heads ascending): results are bitwise identical for any
 * thread count. In bf16 mode the key side runs inside the query side instead (one pass over the
 * scores), its rows summed by fixed chunks of queries and the chunks' sums added in chunk order
 * (QKCH below; docs/attention.md §4): also independent of the thread count. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "model/rope.h"

#define AM_REAL float
#define AM_SFX f
#include "model/attention_math.h"

#define QBLOCK 4  /* queries per work item of the query-side loops */
#define KTILE 16  /* window entries per work item of the key-side loop (fixed: independent of threads) */
/* compressed entries per tile of the key side: small, so that the split of the tiles between the
 * threads by work (kcmp_bounds) can be fine where few entries exist; a thread's run of tiles still
 * makes one call per query (kcmp_items), so small tiles cost no extra calls */
#define KCTILE 4
/* queries per call of bf16 mode's window key side (kwin_blocks): fixed, independent of threads */
#define KQB 4
/* bf16 mode: the backward's query side also does the key side (qbwd_chunks for CSA, qbwd_kchunks for
 * SWA and HCA), its query blocks split into QKCH fixed chunks of consecutive blocks (chunk_bounds),
 * each summed by one thread: the window rows from the chunk's first query on straight into dkv, the
 * rows before into the chunk's spill rows, the compressed rows into the chunk's copy of dC (and of
 * dK^I), spills and copies then added in chunk order: independent of the thread count */
#define QKCH 8

/* Sizes of one layer. */
typedef struct attn_dims {
    int64_t N, d, H, c, r, half, nope; /* nope = c - r: offset of the rotated dims in a head */
    int64_t dc, G, dg, nwin;
    int64_t m;          /* compress ratio, 0 for SWA */
    int64_t wm;         /* compressor width multiplier: 2 iff m == 4 (overlap), else 1 */
    bool csa;           /* m == 4: lightning indexer */
    int64_t nI, cI, topk;
    float eps;          /* rms_norm_eps */
    float scale;        /* c^-1/2 */
    float hscale;       /* (cI nI)^-1/2, indexer head weights */
} attn_dims;

/* Documents of the batch and their compressed entries. */
typedef struct attn_docs {
    int64_t nseg, maxlen, nc, maxnb;
    int64_t *start, *len; /* [nseg] copies of the seqinfo segments */
    int64_t *seg;         /* [N] document of each token */
    int64_t *tpos;        /* [N] position of each token inside its document */
    int64_t *cstart;      /* [nseg + 1] first compressed entry (global index) of each document */
    int64_t *cseg;        /* [nc] document of each compressed entry */
    int64_t *cpos;        /* [nc] RoPE position of each entry: i * m (local index i) */
} attn_docs;

/* One compressor (the layer's, or the indexer's) and what its backward needs. */
typedef struct cmp_state {
    int64_t cw;            /* output dims (c or cI) */
    float *kt, *zt;        /* [N, wm*cw] projections; zt with ape added */
    float *pooled, *rstd;  /* [nc, cw] before the norm, [nc] */
    float *out;            /* [nc, cw] normalised and rotated entries */
} cmp_state;

struct trex_attn_cache {
    attn_dims dm;
    attn_docs docs;
    bool sparse;          /* CSA top-k selection active */
    bool kl;              /* indexer KL terms computed (ilse, mass valid) */
    float *rcos, *rsin;   /* [maxlen, half] */
    float *qa, *qa_rstd, *qr;  /* [N, dc], [N], [N, dc] */
    float *q, *q_rstd;         /* [N, H*c] after RoPE, [N*H] */
    float *kva, *kv_rstd, *kv; /* [N, c], [N], [N, c] after RoPE */
    cmp_state cmp, icmp;
    float *iq, *hw;            /* [N, nI*cI] after RoPE, [N, nI] scaled */
    /* bf16 mode with fk->dots_bf16: the indexer keys icmp.out rounded to bf16 once per layer
     * [nc + 16, cI] (16 zero rows after the last: the leaf may read up to a multiple of 16) and the
     * entry that computes every indexer score (forward, and both KL backward passes); else NULL */
    uint16_t *ikb;
    trex_fused_dots_bf16_fn dots_bf16;
    /* bf16 attention core: kv [N, c] and the compressed entries cmp.out [nc, c] rounded to bf16 once
     * per layer (the core's entries copy them instead of rounding every entry for every query) */
    uint16_t *kvb, *cmpb;
    /* and kv again in the pair layout of kernels/fused.h (trex_fused_pairs; [N/2 + 17] pair rows, zero
     * past N), from which the core's output products read a query's window in place; NULL when c is
     * not a multiple of 32 */
    uint16_t *kvp;
    /* bf16 core with a cache: q [N, H*c] rounded to bf16 (the forward's copy, written by qprep_rows),
     * which the backward's query and key sides read instead of rounding q again (64 MiB at
     * dsv4-bench's N = 4096); NULL otherwise */
    uint16_t *qb;
    float *ilse, *mass;        /* [N] indexer log-sum-exp over the KL set, sum_s sum_h P */
    int32_t *sel, *nsel;       /* [N, topk] ascending local entry indices, [N] counts (sparse) */
    float *lse;                /* [N*H] including the sink */
    float *o;                  /* [N, H*c] attention output after the inverse RoPE; NULL in bf16 mode */
    /* bf16 mode: o rounded to bf16 instead [N, H*c], as wo_a's products would round it (the same bits;
     * half the bytes to write, keep and pack); the backward's D = g.o reads it too */
    uint16_t *ob;
    float *u;                  /* [N, G*dg] */
};

/* ---- section timers of a profiling build (make OPT="-O2 -g -DTREX_ATTN_PROF"; off by default) ----
 * Wall and process CPU time of each top-level section, and the CPU time of each thread inside the
 * per-query loops; tests/test_attention.c --bench prints them (trex_attn_prof_dump). */
#ifdef TREX_ATTN_PROF
#include <stdio.h>
#include <time.h>
enum {
    AP_F_QPROJ, AP_F_KVPROJ, AP_F_CMP_GEMM, AP_F_CMP_POOL, AP_F_IDXPROJ, AP_F_ICMP_GEMM,
    AP_F_ICMP_POOL, AP_F_CORE, AP_F_OUT, AP_B_OUT, AP_B_QSIDE, AP_B_KWIN, AP_B_KCMP, AP_B_QPATH,
    AP_B_KVPATH, AP_B_CMP_POOL, AP_B_CMP_GEMM, AP_B_IDX, AP_B_ICMP_POOL, AP_B_ICMP_GEMM,
    AP_B_GPREP, AP_F_QPREP, AP_T_GATHER, AP_T_CORE, AP_T_POST,
    AP_T_BQ_GATHER, AP_T_BQ_CORE, AP_T_BQ_QNORM, AP_T_BQ_KLD, AP_T_BQ_KL, AP_T_KC_CORE, AP_T_KC_KLD,
    AP_T_KC_KL,
    AP_N
};
static const char *const ap_name[AP_N] = {
    "fwd q proj+norm+rope", "fwd kv proj+norm+rope", "fwd compressor GEMMs+ape",
    "fwd compressor pool+norm+rope", "fwd indexer iq/hw proj", "fwd idx compressor GEMMs+ape",
    "fwd idx compressor pool+norm+rope", "fwd core loop (qfwd)", "fwd wo_a/wo_b",
    "bwd wo_b/wo_a + D", "bwd query side (qbwd)", "bwd key side window", "bwd key side compressed",
    "bwd q path (qnorm, wq_b, wq_a)", "bwd kv path", "bwd compressor pool+norm",
    "bwd compressor GEMMs", "bwd indexer projections", "bwd idx compressor pool+norm",
    "bwd idx compressor GEMMs", "bwd D + g RoPE/bf16 (+ q's bf16)",
    "fwd q per-head norm+RoPE+bf16 (qprep)",
    "  thr: fwd gather+indexer scores+topk", "  thr: fwd sattn_fwd", "  thr: fwd inv rope + KL",
    "  thr: bwd-q gather", "  thr: bwd-q sattn_bwd_query", "  thr: bwd-q RMS bwd + RoPE + dq bf16",
    "  thr: bwd-q KL indexer dots",
    "  thr: bwd-q KL (diq, dhw)", "  thr: bwd-k sattn_bwd_entries (cmp)", "  thr: bwd-k KL indexer dots",
    "  thr: bwd-k KL (dik)"};
static double ap_wall[AP_N], ap_cpu[AP_N], ap_thr[AP_N][16];
static double ap_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
typedef struct ap_mark {
    double w, c;
} ap_mark;
static ap_mark ap_now(void)
{
    return (ap_mark){ap_clock(CLOCK_MONOTONIC), ap_clock(CLOCK_PROCESS_CPUTIME_ID)};
}
static void ap_add(int k, ap_mark *m)
{
    ap_mark t = ap_now();
    ap_wall[k] += t.w - m->w;
    ap_cpu[k] += t.c - m->c;
    *m = t;
}
#define AP_START ap_mark ap_m_ = ap_now()
#define AP(k) ap_add((k), &ap_m_)
#define AP_SKIP (ap_m_ = ap_now())
#define AP_TSTART double ap_t_ = ap_clock(CLOCK_THREAD_CPUTIME_ID)
#define AP_T(k, tid)                                                      \
    do {                                                                  \
        double ap_u_ = ap_clock(CLOCK_THREAD_CPUTIME_ID);                 \
        ap_thr[(k)][(tid) & 15] += ap_u_ - ap_t_;                         \
        ap_t_ = ap_u_;                                                    \
    } while (0)
void trex_attn_prof_reset(void);
void trex_attn_prof_dump(double div);
void trex_attn_prof_reset(void)
{
    memset(ap_wall, 0, sizeof ap_wall);
    memset(ap_cpu, 0, sizeof ap_cpu);
    memset(ap_thr, 0, sizeof ap_thr);
}
void trex_attn_prof_dump(double div)
{
    for (int k = 0; k < AP_N; k++) {
        double th = 0.0;
        for (int i = 0; i < 16; i++)
            th += ap_thr[k][i];
        if (ap_wall[k] > 0.0 || th > 0.0)
            printf("    %-38s wall %8.1f ms  cpu %8.1f ms  (thr0 %7.1f thr1 %7.1f)\n", ap_name[k],
                   1e3 * ap_wall[k] / div, 1e3 * (ap_cpu[k] + th) / div, 1e3 * ap_thr[k][0] / div,
                   1e3 * ap_thr[k][1] / div);
    }
}
#else
#define AP_START (void)0
#define AP(k) (void)0
#define AP_SKIP (void)0
#define AP_TSTART (void)0
#define AP_T(k, tid) (void)0
#endif

/* ---- small helpers ---------------------------------------------------------------------------- */

static size_t lay(size_t *total, size_t bytes)
{
    size_t off = *total;
    *total += (bytes + TREX_ALIGN - 1) / TREX_ALIGN * TREX_ALIGN;
    return off;
}

/* Backward scratch that is written whole before it is read: not zeroed (aborts when out of memory,
 * as trex_arena_xalloc). */
static void *xalloc_uninit(trex_arena *ar, size_t bytes)
{
    void *p = trex_arena_alloc_uninit(ar, bytes);
    if (!p)
        TREX_ABORT("attention backward: out of memory in the activation arena allocating %zu bytes "
                   "(%zu in use)", bytes, trex_arena_used(ar));
    return p;
}

/* Work item k of n -> block index, alternating from both ends so that contiguous thread chunks get a
 * similar mix of cheap early and costly late queries. A bijection on [0, n). */
static int64_t zigzag(int64_t k, int64_t n)
{
    return (k % 2 == 0) ? k / 2 : n - 1 - k / 2;
}

/* mass[i] = sum over heads h (from 0, ascending) of P[h n + nw + i], i < ncs: the main attention's
 * probability on each of a query's compressed entries, summed over heads (P: the core's [H, n]
 * probabilities of one query, the ncs compressed entries after its nw window entries). */
static void head_mass(float *restrict mass, const float *restrict P, int64_t H, int64_t n, int64_t nw,
                      int64_t ncs)
{
    for (int64_t i = 0; i < ncs; i++)
        mass[i] = 0.0f;
    for (int64_t h = 0; h < H; h++) {
        const float *ph = P + h * n + nw;
        for (int64_t i = 0; i < ncs; i++)
            mass[i] += ph[i];
    }
}

/* The indexer score of each entry i < n from its head scores ia [nI][n]: score[i] = the fp32 sum from
 * +0, heads ascending, of hw_h ia_hi over the heads with ia_hi > 0 (a NaN head score counts as not
 * positive). Written as a max and an unconditional multiply-add (a non-positive head adds w * 0 = +-0,
 * which leaves the sum unchanged, as the sum is never -0), so that the compiler runs 8 entries per
 * step in vector lanes; the same bits as the per-entry loop with a branch per head that it replaced. */
static void idx_scores(float *restrict score, const float *restrict ia, int64_t n,
                       const float *restrict hw, int64_t nI)
{
    for (int64_t i = 0; i < n; i++)
        score[i] = 0.0f;
    for (int64_t h = 0; h < nI; h++) {
        const float w = hw[h], *row = ia + h * n;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            for (int k = 0; k < 8; k++) {
                const float v = row[i + k], r = v > 0.0f ? v : 0.0f; /* a NaN gives 0, as there */
                score[i + k] += w * r;
            }
        }
        for (; i < n; i++) {
            const float v = row[i], r = v > 0.0f ? v : 0.0f;
            score[i] += w * r;
        }
    }
}

/* "a ranks below b": a lower score, or an equal one at a higher index (topk_select's order). */
static bool topk_worse(const float *score, int64_t a, int64_t b)
{
    return score[a] < score[b] || (score[a] == score[b] && a > b);
}

static void topk_sift(int64_t *heap, int64_t size, int64_t i, const float *score)
{
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < size && topk_worse(score, heap[l], heap[w]))
            w = l;
        if (r < size && topk_worse(score, heap[r], heap[w]))
            w = r;
        if (w == i)
            return;
        int64_t tmp = heap[i];
        heap[i] = heap[w];
        heap[w] = tmp;
        i = w;
    }
}

/* The k-th largest of v[0..n) (1 <= k <= n, no NaN), by quickselect: each pass splits the candidates
 * around a pivot (median of three) into those above it (to the front of the other buffer) and those
 * below it (to its back) without a branch per element (every value is stored to both ends, and the
 * counts advance by the comparisons), then keeps the side that holds the k-th. v and w: n floats of
 * scratch each (v's values are destroyed). */
static float kth_largest(float *v, float *w, int64_t n, int64_t k)
{
    float *a = v, *b = w;
    while (n > 1) {
        const float x0 = a[0], x1 = a[n / 2], x2 = a[n - 1];
        const float p = (x0 > x1) ? ((x1 > x2) ? x1 : (x0 > x2 ? x2 : x0))
                                  : ((x0 > x2) ? x0 : (x1 > x2 ? x2 : x1));
        int64_t gt = 0, lt = 0;
        for (int64_t i = 0; i < n; i++) {
            const float x = a[i];
            b[gt] = x;
            gt += x > p;
            b[n - 1 - lt] = x;
            lt += x < p;
        }
        if (k <= gt) { /* among those above p */
            n = gt;
        } else if (k <= n - lt) { /* p itself (n - gt - lt copies of it) */
            return p;
        } else { /* among those below p: the (k - (n - lt))-th largest of them */
            k -= n - lt;
            b += n - lt;
            n = lt;
        }
        float *t = a;
        a = b;
        b = t;
    }
    return a[0];
}

/* Indices of the k largest of score[0..n) (equal scores: the lower index wins), ascending into out
 * (n + 1 slots: the pass below stores one past the k it keeps). Without NaNs: the k-th largest value
 * thr by quickselect (tmp: 2n floats of scratch), then one pass in index order takes every score
 * above thr and the first k - #(above) equal to it, which is that set. With a NaN somewhere (a broken
 * run), the heap below, as before. heap: k slots; mark: n bytes, zero on entry and on return. */
static void topk_select(int64_t *out, const float *score, int64_t n, int64_t k, int64_t *heap,
                        unsigned char *mark, float *tmp)
{
    TREX_ASSERT(k <= n);
    if (k == n) {
        for (int64_t i = 0; i < n; i++)
            out[i] = i;
        return;
    }
    if (k == 0)
        return;
    bool nan = false;
    for (int64_t i = 0; i < n; i++) {
        tmp[i] = score[i];
        nan |= score[i] != score[i];
    }
    if (!nan) {
        const float thr = kth_largest(tmp, tmp + n, n, k);
        int64_t above = 0;
        for (int64_t i = 0; i < n; i++)
            above += score[i] > thr;
        int64_t eq = k - above, j = 0;
        for (int64_t i = 0; i < n; i++) { /* without a branch per score (about k / n are taken) */
            const int64_t same = score[i] == thr, take = (score[i] > thr) | (same & (eq > 0));
            out[j] = i;
            j += take;
            eq -= same & take;
        }
        TREX_ASSERT(j == k);
        return;
    }
    /* a min-heap on "better": the root is the worst of the k best seen so far */
    for (int64_t i = 0; i < k; i++)
        heap[i] = i;
    for (int64_t i = k / 2 - 1; i >= 0; i--)
        topk_sift(heap, k, i, score);
    for (int64_t i = k; i < n; i++) {
        if (topk_worse(score, heap[0], i)) {
            heap[0] = i;
            topk_sift(heap, k, 0, score);
        }
    }
    for (int64_t i = 0; i < k; i++)
        mark[heap[i]] = 1;
    int64_t j = 0;
    for (int64_t i = 0; i < n; i++) {
        if (mark[i]) {
            out[j++] = i;
            mark[i] = 0;
        }
    }
    TREX_ASSERT(j == k);
}

/* ---- RoPE over rows --------------------------------------------------------------------------- */

typedef struct rope_task {
    float *v;
    int64_t nh, dim, off, half;
    const int64_t *pos;
    const float *ct, *st;
    bool inverse;
    uint16_t *vb;      /* NULL, or [rows, nh * dim]: each rotated row rounded to bf16 */
    trex_fused_cvt_bf16_nt_fn cvt_nt; /* with vb: NULL, or vb's rows written around the cache */
} rope_task;

static void rope_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const rope_task *a = arg;
    const int64_t w = a->nh * a->dim;
    const trex_fused_rope_fn rope = trex_fused()->rope; /* trex_rope_rotate's bits */
    for (int64_t r = r0; r < r1; r++) {
        const float *cs = a->ct + a->pos[r] * a->half, *sn = a->st + a->pos[r] * a->half;
        rope(a->v + r * w + a->off, a->nh, a->dim, cs, sn, a->half, a->inverse);
        if (a->vb && a->cvt_nt) /* while the row is in the cache */
            a->cvt_nt(a->vb + r * w, a->v + r * w, w);
        else if (a->vb)
            trex_cvt_f32_bf16(a->vb + r * w, a->v + r * w, w);
    }
}

/* Rotates the last r dims of every vector of v [rows, nh, dim]; row i at table position pos[i]. vb
 * (may be NULL) receives the rotated rows rounded to bf16 in the same pass. */
static void rope_apply_bf16(trex_pool *pool, float *v, uint16_t *vb, int64_t rows, int64_t nh,
                            int64_t dim, const attn_dims *dm, const int64_t *pos, const float *ct,
                            const float *st, bool inverse)
{
    rope_task a = {v, nh, dim, dim - dm->r, dm->half, pos, ct, st, inverse, vb, NULL};
    int64_t work = nh * dm->r;
    trex_pool_for(pool, rows, work >= 4096 ? 1 : 4096 / work, rope_rows, &a);
}

static void rope_apply(trex_pool *pool, float *v, int64_t rows, int64_t nh, int64_t dim,
                       const attn_dims *dm, const int64_t *pos, const float *ct, const float *st,
                       bool inverse)
{
    rope_apply_bf16(pool, v, NULL, rows, nh, dim, dm, pos, ct, st, inverse);
}

/* The query's per-head weightless RMSNorm and RoPE in one pass, a few tokens at a time while they are
 * in the cache (the same per-row kernels as two passes, so the same bits), and in bf16 mode the result
 * rounded to bf16 for the attention core (qb, may be NULL). */
typedef struct qprep_task {
    float *q, *rstd;   /* [N, H*c] in place, [N*H] */
    uint16_t *qb;      /* NULL or [N, H*c] */
    const attn_dims *dm;
    const int64_t *pos;
    const float *ct, *st;
} qprep_task;

#define QPREP_TOKENS 4 /* tokens per step: 4 x 32 KiB at dsv4-bench's shapes */

static void qprep_rows(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const qprep_task *a = arg;
    const attn_dims *dm = a->dm;
    const int64_t H = dm->H, c = dm->c, hc = H * c;
    for (int64_t t = t0; t < t1; t += QPREP_TOKENS) {
        const int64_t nt = t1 - t < QPREP_TOKENS ? t1 - t : QPREP_TOKENS;
        float *q = a->q + t * hc;
        trex_rmsnorm_forward(NULL, q, a->rstd + t * H, q, NULL, nt * H, c, dm->eps);
        rope_task r = {a->q, H, c, c - dm->r, dm->half, a->pos, a->ct, a->st, false, a->qb,
                       trex_fused()->cvt_bf16_nt}; /* qb around the cache: read in the core loop */
        rope_rows(&r, t, t + nt, tid);
    }
}

/* Rows of src [rows, w] rounded to bf16 into dst, over the pool; nt: written around the cache (a
 * layer-wide copy that a later pass reads), else kept in it. */
typedef struct cvt_task {
    uint16_t *dst;
    const float *src;
    int64_t w;
    trex_fused_cvt_bf16_nt_fn cvt_nt; /* NULL, or the rows written around the cache */
} cvt_task;

static void cvt_rows_task(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const cvt_task *a = arg;
    if (a->cvt_nt)
        a->cvt_nt(a->dst + r0 * a->w, a->src + r0 * a->w, (r1 - r0) * a->w);
    else
        trex_cvt_f32_bf16(a->dst + r0 * a->w, a->src + r0 * a->w, (r1 - r0) * a->w);
}

static void cvt_rows_pool(trex_pool *pool, uint16_t *dst, const float *src, int64_t rows, int64_t w,
                          bool nt)
{
    cvt_task a = {dst, src, w, nt ? trex_fused()->cvt_bf16_nt : NULL};
    trex_pool_for(pool, rows, w >= 16384 ? 1 : 16384 / (w > 0 ? w : 1), cvt_rows_task, &a);
}

/* Pair rows k0 .. k1-1 of the pair layout (kernels/fused.h trex_fused_pairs) of src [rows, c] bf16:
 * pair row k holds rows 2k and 2k + 1 as 32-bit words (x[i], y[i]) per dim, in 16-dim chunks; rows at
 * or past `rows` read as zeros. */
typedef struct pairs_task {
    uint16_t *dst;
    const uint16_t *src;
    int64_t rows, c;
} pairs_task;

static void pairs_rows(void *arg, int64_t k0, int64_t k1, int tid)
{
    (void)tid;
    const pairs_task *a = arg;
    const int64_t c = a->c;
    for (int64_t k = k0; k < k1; k++) {
        uint32_t *d = (uint32_t *)(a->dst + 2 * k * c);
        const uint16_t *x = 2 * k < a->rows ? a->src + 2 * k * c : NULL;
        const uint16_t *y = 2 * k + 1 < a->rows ? a->src + (2 * k + 1) * c : NULL;
        for (int64_t i = 0; i < c; i++) /* word i: dims chunk i / 16, position i % 16 */
            d[i] = (uint32_t)(x ? x[i] : 0) | (uint32_t)(y ? y[i] : 0) << 16;
    }
}

/* ---- compressor (MODEL_SPEC §3.4) ------------------------------------------------------------- */

/* Row offsets into kt/zt ([N, wm*cw]) of the candidates of compressed entry e, in softmax order:
 * with overlap (wm = 2) the previous block's tokens, first half of their features, then the block's
 * own tokens, second half; block 0 has no previous part (its K = 0, Z = -inf candidates carry exactly
 * zero weight, so they are left out). Without overlap the block's own tokens, all features. */
static int64_t cmp_block_offsets(int64_t *off, const attn_docs *docs, int64_t m, int64_t wm,
                                 int64_t cw, int64_t e)
{
    const int64_t s = docs->cseg[e], i = e - docs->cstart[s], s0 = docs->start[s];
    const int64_t wc = wm * cw;
    int64_t n = 0;
    if (wm == 2 && i > 0)
        for (int64_t j = 0; j < m; j++)
            off[n++] = (s0 + (i - 1) * m + j) * wc;
    for (int64_t j = 0; j < m; j++)
        off[n++] = (s0 + i * m + j) * wc + (wm == 2 ? cw : 0);
    return n;
}

typedef struct cmp_task {
    const attn_docs *docs;
    const cmp_state *s;
    int64_t m, wm;
    const float *dpooled;  /* backward: dL/dpooled [nc, cw] */
    float *dkt, *dzt;      /* backward: [N, wm*cw], accumulated (rows are disjoint per block) */
    char *scr;
    size_t stride;
    const trex_fused_table *fz; /* bf16 mode: its pool_fwd / pool_bwd; NULL: am_pool_* (libm's exp) */
} cmp_task;

static size_t cmp_scratch_bytes(int64_t m, int64_t cw)
{
    size_t t = 0;
    lay(&t, (size_t)(2 * m) * sizeof(int64_t));
    for (int k = 0; k < 4; k++)
        lay(&t, (size_t)(2 * m) * sizeof(float *));
    lay(&t, (size_t)(3 * cw) * sizeof(float));
    return t;
}

/* The pooling's entries in bf16 mode (an exp of their own, 16 features at a time at the AVX-512
 * levels; kernels/fused.h pool_fwd); fp32 mode keeps the scalar am_pool_* with libm's expf. */
static const trex_fused_table *pool_table(const trex_ctx *ctx)
{
    return ctx->compute == TREX_BF16 ? trex_fused() : NULL;
}

static void cmp_blocks(void *arg, int64_t e0, int64_t e1, int tid)
{
    const cmp_task *a = arg;
    const int64_t m = a->m, cw = a->s->cw;
    size_t t = 0;
    char *w = a->scr + (size_t)tid * a->stride;
    int64_t *off = (int64_t *)(w + lay(&t, (size_t)(2 * m) * sizeof(int64_t)));
    const float **K = (const float **)(w + lay(&t, (size_t)(2 * m) * sizeof(float *)));
    const float **Z = (const float **)(w + lay(&t, (size_t)(2 * m) * sizeof(float *)));
    float **dK = (float **)(w + lay(&t, (size_t)(2 * m) * sizeof(float *)));
    float **dZ = (float **)(w + lay(&t, (size_t)(2 * m) * sizeof(float *)));
    float *ws = (float *)(w + lay(&t, (size_t)(3 * cw) * sizeof(float)));
    for (int64_t e = e0; e < e1; e++) {
        int64_t n = cmp_block_offsets(off, a->docs, m, a->wm, cw, e);
        for (int64_t j = 0; j < n; j++) {
            K[j] = a->s->kt + off[j];
            Z[j] = a->s->zt + off[j];
        }
        if (a->dpooled) {
            for (int64_t j = 0; j < n; j++) {
                dK[j] = a->dkt + off[j];
                dZ[j] = a->dzt + off[j];
            }
            if (a->fz)
                a->fz->pool_bwd(dK, dZ, a->dpooled + e * cw, K, Z, n, cw);
            else
                am_pool_backward_f(dK, dZ, a->dpooled + e * cw, K, Z, n, cw, ws);
        } else if (a->fz) {
            a->fz->pool_fwd(a->s->pooled + e * cw, K, Z, n, cw);
        } else {
            am_pool_forward_f(a->s->pooled + e * cw, K, Z, n, cw, ws);
        }
    }
}

static int64_t nthreads(const trex_ctx *ctx)
{
    return trex_pool_size(ctx->pool);
}

/* Projections, pooling, norm and RoPE of one compressor. Returns false when out of memory. */
/* bf16 mode's compressor products kt = x wkv^T, zt = x wgate^T in bf16x2, as the LM head's logits: the
 * weight's bf16 rounding (what the checkpoint stores, MODEL_SPEC §7.2) against x at fp32 level, one bf16
 * GEMM over K = 2d (x as [hi | lo], each weight as [hi | hi]: kernels.h trex_split_bf16x2_rows) with fp32
 * sums, so the compressor is computed in fp32 on its bf16 weights (MODEL_SPEC §3.4, §12 item 9 keeps it
 * out of plain bf16) on the AMX GEMM; docs/precision.md "The compressor". The splits are scratch. */
static bool compressor_products_x2(const trex_ctx *ctx, cmp_state *s, const float *x, const float *wkv,
                                   const float *wgate, int64_t N, int64_t d, int64_t wc)
{
    const trex_arena_mark mk = trex_arena_mark_get(ctx->arena);
    uint16_t *x2 = trex_arena_alloc_uninit(ctx->arena, (size_t)(N * 2 * d) * sizeof *x2);
    uint16_t *w2 = trex_arena_alloc_uninit(ctx->arena, (size_t)(wc * 2 * d) * sizeof *w2);
    if (!x2 || !w2) {
        trex_arena_rewind(ctx->arena, mk);
        return false;
    }
    trex_split_bf16x2_rows(ctx->pool, x2, x, N, d, false);
    const float *W[2] = {wkv, wgate};
    float *Y[2] = {s->kt, s->zt};
    for (int k = 0; k < 2; k++) {
        trex_split_bf16x2_rows(ctx->pool, w2, W[k], wc, d, true);
        trex_gemm_bf16(ctx->pool, ctx->ws, false, true, N, wc, 2 * d, 1.0f, x2, 2 * d, w2, 2 * d, 0.0f,
                       Y[k], wc);
    }
    trex_arena_rewind(ctx->arena, mk);
    return true;
}

static bool compressor_forward(const trex_ctx *ctx, cmp_state *s, const attn_dims *dm,
                               const attn_docs *docs, int64_t m, int64_t wm, int64_t cw,
                               const float *x, const float *wkv, const float *wgate,
                               const float *ape, const float *norm, const float *ct,
                               const float *st)
{
    const int64_t N = dm->N, wc = wm * cw, nc = docs->nc;
    s->cw = cw;
    /* not zeroed: kt, zt by the products (beta 0), pooled by cmp_blocks (every entry), rstd and out
     * by the norm */
    s->kt = trex_arena_alloc_uninit(ctx->arena, (size_t)(N * wc) * sizeof(float));
    s->zt = trex_arena_alloc_uninit(ctx->arena, (size_t)(N * wc) * sizeof(float));
    s->pooled = trex_arena_alloc_uninit(ctx->arena, (size_t)(nc * cw + 1) * sizeof(float));
    s->rstd = trex_arena_alloc_uninit(ctx->arena, (size_t)(nc + 1) * sizeof(float));
    s->out = trex_arena_alloc_uninit(ctx->arena, (size_t)(nc * cw + 1) * sizeof(float));
    size_t stride = cmp_scratch_bytes(m, cw);
    char *scr = trex_arena_alloc(ctx->arena, stride * (size_t)nthreads(ctx));
    if (!s->kt || !s->zt || !s->pooled || !s->rstd || !s->out || !scr)
        return false;
    AP_START;
    if (ctx->compute == TREX_BF16) {
        if (!compressor_products_x2(ctx, s, x, wkv, wgate, N, dm->d, wc))
            return false;
    } else {
        trex_linear_forward(ctx->pool, s->kt, x, wkv, N, dm->d, wc);
        trex_linear_forward(ctx->pool, s->zt, x, wgate, N, dm->d, wc);
    }
    /* positional bias by offset inside the block, on every token of a complete block */
    for (int64_t sg = 0; sg < docs->nseg; sg++) {
        const int64_t nb = docs->cstart[sg + 1] - docs->cstart[sg];
        for (int64_t l = 0; l < nb * m; l++) {
            float *z = s->zt + (docs->start[sg] + l) * wc;
            const float *ap = ape + (l % m) * wc;
            for (int64_t f = 0; f < wc; f++)
                z[f] += ap[f];
        }
    }
    AP(cw == dm->c ? AP_F_CMP_GEMM : AP_F_ICMP_GEMM);
    if (nc == 0)
        return true;
    cmp_task a = {docs, s, m, wm, NULL, NULL, NULL, scr, stride, pool_table(ctx)};
    int64_t work = 2 * m * cw;
    trex_pool_for(ctx->pool, nc, work >= 16384 ? 1 : 16384 / work, cmp_blocks, &a);
    trex_rmsnorm_forward(ctx->pool, s->out, s->rstd, s->pooled, norm, nc, cw, dm->eps);
    rope_apply(ctx->pool, s->out, nc, 1, cw, dm, docs->cpos, ct, st, false);
    AP(cw == dm->c ? AP_F_CMP_POOL : AP_F_ICMP_POOL);
    return true;
}

/* Backward of compressor_forward given dout = dL/d(out) [nc, cw] (overwritten). Weight gradients
 * accumulate (wkv's and wgate's are written instead under ctx->grads_zero: one product each); dx
 * accumulates when not NULL (the indexer's compressor sees a detached x). */
static void compressor_backward(const trex_ctx *ctx, const cmp_state *s, const attn_dims *dm,
                                const attn_docs *docs, int64_t m, int64_t wm, float *dout,
                                float *dx, const float *x, const float *wkv, const float *wgate,
                                const float *norm, float *gwkv, float *gwgate, float *gape,
                                float *gnorm, const float *ct, const float *st)
{
    const int64_t N = dm->N, cw = s->cw, wc = wm * cw, nc = docs->nc;
    if (nc == 0)
        return;
    AP_START;
    rope_apply(ctx->pool, dout, nc, 1, cw, dm, docs->cpos, ct, st, true);
    float *dpooled = xalloc_uninit(ctx->arena, (size_t)(nc * cw) * sizeof(float)); /* acc false */
    trex_rmsnorm_backward(ctx->pool, dpooled, gnorm, dout, s->pooled, norm, s->rstd, nc, cw, false);
    float *dkt = trex_arena_xalloc(ctx->arena, (size_t)(N * wc) * sizeof(float));
    float *dzt = trex_arena_xalloc(ctx->arena, (size_t)(N * wc) * sizeof(float));
    size_t stride = cmp_scratch_bytes(m, cw);
    char *scr = trex_arena_xalloc(ctx->arena, stride * (size_t)nthreads(ctx));
    cmp_task a = {docs, s, m, wm, dpooled, dkt, dzt, scr, stride, pool_table(ctx)};
    int64_t work = 2 * m * cw;
    trex_pool_for(ctx->pool, nc, work >= 16384 ? 1 : 16384 / work, cmp_blocks, &a);
    /* ape[j] collects the Z gradients of every token at offset j (documents, then tokens, in order) */
    for (int64_t sg = 0; sg < docs->nseg; sg++) {
        const int64_t nb = docs->cstart[sg + 1] - docs->cstart[sg];
        for (int64_t l = 0; l < nb * m; l++) {
            const float *dz = dzt + (docs->start[sg] + l) * wc;
            float *ga = gape + (l % m) * wc;
            for (int64_t f = 0; f < wc; f++)
                ga[f] += dz[f];
        }
    }
    AP(cw == dm->c ? AP_B_CMP_POOL : AP_B_ICMP_POOL);
    /* bf16 mode: the gradient products 1-term bf16, as every gradient of that mode (docs/precision.md) */
    const bool dw_acc = !ctx->grads_zero;
    trex_linear_backward_ex(ctx->pool, ctx->ws, ctx->compute, dx, gwkv, dkt, x, wkv, N, dm->d, wc, true, dw_acc);
    trex_linear_backward_ex(ctx->pool, ctx->ws, ctx->compute, dx, gwgate, dzt, x, wgate, N, dm->d, wc, true,
                            dw_acc);
    AP(cw == dm->c ? AP_B_CMP_GEMM : AP_B_ICMP_GEMM);
}

/* ---- weightless per-head RMS backward (q) ----------------------------------------------------- */

typedef struct qnorm_task {
    float *dq;             /* in: dL/dq after RoPE; out: dL/d(q before the norm) */
    const float *q, *rstd; /* q after RoPE, 1/rms per (token, head) */
    const attn_dims *dm;
    const int64_t *tpos;
    const float *ct, *st;
    uint16_t *dqb;         /* NULL, or [N, H*c]: the result rounded to bf16 for the products */
} qnorm_task;

/* q = R(y), y = u * rs. With g = dL/dq, rotation-invariance of dot products gives
 * dL/du = rs (R^-1 g - y mean(g.q)) = R^-1 [rs (g - q mean(g.q))] on the rotated dims.
 * g: token t's [H*c] row of dL/dq, in place (a row of a->dq, or bf16 mode's per-thread row of the
 * query-side loop, qbwd_one: the same operations, so the same bits). */
static void qnorm_token(const qnorm_task *a, float *g, int64_t t)
{
    const attn_dims *dm = a->dm;
    const int64_t H = dm->H, c = dm->c;
    const trex_fused_table *fk = trex_fused();
    /* per head: mean = dot(g, q) / c; g = rs (g - q mean); then the inverse RoPE */
    fk->rms_head_bwd(g, a->q + t * H * c, a->rstd + t * H, H, c);
    fk->rope(g + dm->nope, dm->H, dm->c, a->ct + a->tpos[t] * dm->half,
             a->st + a->tpos[t] * dm->half, dm->half, 1);
}

static void qnorm_rows(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const qnorm_task *a = arg;
    const int64_t hc = a->dm->H * a->dm->c;
    for (int64_t t = t0; t < t1; t++) {
        qnorm_token(a, a->dq + t * hc, t);
        if (a->dqb) /* while the token's row is in the cache */
            trex_fused()->cvt_bf16_nt(a->dqb + t * hc, a->dq + t * hc, hc);
    }
}

/* ---- per-query attention (forward and query-side backward) ------------------------------------ */

/* Per-thread scratch of the query loops. */
typedef struct qscr {
    size_t V, Vb, cidx, heap, z, o, scores, ps, mark, ws, kp, ia, dws, dq, dV, psum, dIk, wa2, wb2,
        total;
} qscr;

static qscr qscr_layout(const attn_dims *dm, const attn_docs *docs, bool sparse, bool bf16)
{
    qscr L = {0};
    const int64_t maxset = (dm->csa && sparse) ? (dm->topk < docs->maxnb ? dm->topk : docs->maxnb)
                                               : docs->maxnb;
    const int64_t ne = dm->nwin + maxset + 1;
    /* bf16 mode, SWA and HCA: the forward and the query side by blocks of QBLOCK queries
     * (qblock): the union of their windows and compressed sets */
    const bool blk = bf16 && !dm->csa;
    const int64_t neb = ne + QBLOCK - 1;
    size_t t = 0;
    L.V = lay(&t, (size_t)neb * sizeof(float *));
    L.Vb = lay(&t, (size_t)neb * sizeof(uint16_t *));
    L.cidx = lay(&t, (size_t)(docs->maxnb + 1) * sizeof(int64_t));
    L.heap = lay(&t, (size_t)(dm->topk + 1) * sizeof(int64_t));
    L.z = lay(&t, (size_t)(dm->H * ne) * sizeof(float));
    L.o = lay(&t, (size_t)((blk ? QBLOCK : 1) * dm->H * dm->c) * sizeof(float));
    L.scores = lay(&t, (size_t)(docs->maxnb + 1) * sizeof(float));
    L.ps = lay(&t, (size_t)(docs->maxnb + 1) * sizeof(float));
    L.mark = lay(&t, (size_t)(docs->maxnb + 1));
    int64_t wsf = bf16 ? TREX_FUSED_SATTN_BF16_WS(ne, dm->H, dm->c) : TREX_FUSED_SATTN_WS(ne, dm->H);
    if (blk && TREX_FUSED_SATTN_BLOCK_BF16_WS(neb, dm->H, dm->c, QBLOCK) > wsf)
        wsf = TREX_FUSED_SATTN_BLOCK_BF16_WS(neb, dm->H, dm->c, QBLOCK);
    if (bf16 && dm->csa && TREX_FUSED_SATTN_QK_BF16_WS(ne, dm->H, dm->c) > wsf)
        wsf = TREX_FUSED_SATTN_QK_BF16_WS(ne, dm->H, dm->c);
    if (blk && TREX_FUSED_SATTN_BLOCK_KEYS_BF16_WS(neb, dm->H, dm->c, QBLOCK) > wsf)
        wsf = TREX_FUSED_SATTN_BLOCK_KEYS_BF16_WS(neb, dm->H, dm->c, QBLOCK);
    L.ws = lay(&t, (size_t)wsf * sizeof(float));
    L.kp = lay(&t, (size_t)(docs->maxnb + 1) * sizeof(float *));
    L.ia = lay(&t, (size_t)((dm->nI + 1) * (docs->maxnb + 1)) * sizeof(float));
    const int64_t dws = dm->csa && bf16 ? TREX_FUSED_DOTS_BF16_WS(docs->maxnb, dm->nI, dm->cI) : 1;
    L.dws = lay(&t, (size_t)dws * sizeof(float));
    /* bf16 core, query side: one query's dq [H*c] (qbwd_one), QBLOCK of them (qblock) */
    L.dq = lay(&t, (size_t)(bf16 ? (blk ? QBLOCK : 1) * dm->H * dm->c : 1) * sizeof(float));
    /* bf16 CSA, the compressed key side in the query side: the rows of dC (then dK^I) of a query's
     * compressed entries, their head-summed probabilities, the KL key-side dI */
    const int64_t nk = bf16 ? neb + 1 : 1;
    L.dV = lay(&t, (size_t)nk * sizeof(float *));
    L.psum = lay(&t, (size_t)nk * sizeof(float));
    L.dIk = lay(&t, (size_t)nk * sizeof(float));
    /* bf16 CSA: a block's window key-side operands (qbwd_chunks) */
    const int64_t kq = 2 * TREX_FUSED_SATTN_HP(dm->H) * QBLOCK;
    const int64_t nu16 = (dm->nwin + QBLOCK + 15) / 16 * 16;
    L.wa2 = lay(&t, (size_t)(bf16 && dm->csa ? nu16 * kq : 1) * 2);
    L.wb2 = lay(&t, (size_t)(bf16 && dm->csa ? kq * TREX_FUSED_SATTN_CP(dm->c) : 1) * 2);
    L.total = t;
    return L;
}

typedef struct qtask {
    const attn_dims *dm;
    const attn_docs *docs;
    const trex_attn_cache *c; /* q, kv, compressed entries, indexer, selections */
    const trex_fused_table *fk;
    /* the core attention entries of the run's precision (fk's fp32 or bf16 variants) */
    trex_fused_sattn_fwd_fn sattn_fwd;
    trex_fused_sattn_bwd_query_fn sattn_bwd_query;
    trex_fused_sattn_fwd_bf16_fn sattn_fwd_bf16;             /* bf16 mode: these two instead */
    trex_fused_sattn_bwd_query_bf16_fn sattn_bwd_query_bf16;
    /* bf16 mode, SWA and HCA layers: the forward and the query side by blocks of consecutive
     * queries (qblock) */
    trex_fused_sattn_fwd_block_bf16_fn sattn_fwd_block_bf16;
    trex_fused_sattn_bwd_query_block_bf16_fn sattn_bwd_query_block_bf16; /* with dqb */
    const uint16_t *qb, *gb;  /* bf16 mode: q and gO rounded once per layer [N, H*c] (gb: backward) */
    const float *sink;
    bool select;              /* forward: choose top-k (CSA sparse) */
    bool kl;                  /* KL terms (forward) / KL gradient (backward) */
    /* forward outputs (o, or in bf16 mode its rounding ob) */
    float *lse, *o, *ilse, *mass;
    uint16_t *ob;
    int32_t *sel, *nsel;
    double *kl_t;
    /* backward */
    const float *gO, *D;
    float *dq, *dsink_t, *diq, *dhw;
    /* bf16 core: dq is not written; each query's dq goes through the per-head RMS backward and the
     * inverse RoPE (qn) in the thread's scratch and leaves rounded to bf16 into dqb [N, H*c], the only
     * form the q path's products read */
    const qnorm_task *qn;
    uint16_t *dqb;
    /* bf16 CSA: the query side and the compressed key side in one call per query; chunk j (QKCH)
     * sums into dC, dik (j = 0) or row block j - 1 of dCp, dikp ([QKCH - 1][nc, c], [.., cI]) */
    trex_fused_sattn_bwd_query_keys_bf16_fn sattn_bwd_query_keys_bf16;
    float *dC, *dik, *dCp, *dikp;
    /* bf16 SWA and HCA: the query side and the key side of the window and compressed entries in one
     * call per query block (qbwd_kchunks); chunk j = the query blocks bstart[j] .. bstart[j+1] - 1,
     * its window terms into dkv for the entries from its first query on and into its spill rows
     * (spill + j (nwin - 1) c, the nwin - 1 entries before) for the others, its compressed terms as
     * the CSA chunks' (dC, dCp) */
    trex_fused_sattn_bwd_query_block_keys_bf16_fn sattn_bwd_query_block_keys_bf16;
    trex_fused_sattn_bwd_window_bf16_fn sattn_bwd_window_bf16;
    float *dkv, *spill;
    int64_t bstart[QKCH + 1];
    float il_scale;
    int64_t nqb;
    char *scr;
    size_t stride;
    qscr L;
} qtask;

/* Gathers the entries of query t: the window (same document) then the compressed set. Returns n and
 * sets *nw (window count) and *ncs (compressed count); cidx receives the local entry indices. With
 * scores (CSA), also the indexer score of every visible entry (idx_scores), through the scratch
 * kp (visible key pointers) and ia (head scores [nI][vis]). */
static int64_t gather_entries(const qtask *a, int64_t t, const float **V, const uint16_t **Vb,
                              int64_t *cidx,
                              float *scores, const float **kp, float *ia, float *dws, int64_t *heap,
                              unsigned char *mark, int64_t *nw_out, int64_t *ncs_out)
{
    const attn_dims *dm = a->dm;
    const attn_docs *docs = a->docs;
    const trex_attn_cache *c = a->c;
    const int64_t s = docs->seg[t], s0 = docs->start[s], p = t - s0;
    const int64_t jlo = (t - dm->nwin + 1 > s0) ? t - dm->nwin + 1 : s0;
    const int64_t nw = t - jlo + 1;
    for (int64_t k = 0; k < nw; k++)
        V[k] = c->kv + (jlo + k) * dm->c;
    if (c->kvb)
        for (int64_t k = 0; k < nw; k++)
            Vb[k] = c->kvb + (jlo + k) * dm->c;
    int64_t ncs = 0;
    if (dm->m > 0) {
        const int64_t vis = (p + 1) / dm->m, cb = docs->cstart[s];
        if (dm->csa && scores) {
            /* the score of every visible entry: the nI x vis head scores as one batch of dots */
            const int64_t nI = dm->nI, cI = dm->cI;
            const float *hw = c->hw + t * nI;
            if (c->dots_bf16) {
                c->dots_bf16(ia, dws, c->iq + t * nI * cI, cI, nI, c->ikb + cb * cI, NULL, vis, cI);
            } else {
                for (int64_t i = 0; i < vis; i++)
                    kp[i] = c->icmp.out + (cb + i) * cI;
                a->fk->dots(ia, c->iq + t * nI * cI, cI, nI, kp, vis, cI);
            }
            idx_scores(scores, ia, vis, hw, nI);
        }
        if (dm->csa && c->sparse) {
            if (a->select) {
                ncs = dm->topk < vis ? dm->topk : vis;
                topk_select(cidx, scores, vis, ncs, heap, mark, ia); /* ia: free here, 2 vis floats */
                for (int64_t i = 0; i < ncs; i++)
                    a->sel[t * dm->topk + i] = (int32_t)cidx[i];
                a->nsel[t] = (int32_t)ncs;
            } else {
                ncs = c->nsel[t];
                for (int64_t i = 0; i < ncs; i++)
                    cidx[i] = c->sel[t * dm->topk + i];
            }
        } else {
            ncs = vis;
            for (int64_t i = 0; i < vis; i++)
                cidx[i] = i;
        }
        for (int64_t i = 0; i < ncs; i++)
            V[nw + i] = c->cmp.out + (cb + cidx[i]) * dm->c;
        if (c->cmpb)
            for (int64_t i = 0; i < ncs; i++)
                Vb[nw + i] = c->cmpb + (cb + cidx[i]) * dm->c;
    }
    *nw_out = nw;
    *ncs_out = ncs;
    return nw + ncs;
}

/* Query t's output, from the thread's scratch opre where the core wrote it (first-level cache): the
 * inverse RoPE at its position, then one copy out (bf16 mode: rounded to bf16), around the cache (o is
 * read again only by the output projection, after the loop). */
static void qfwd_out(const qtask *a, float *opre, int64_t t)
{
    const attn_dims *dm = a->dm;
    const trex_attn_cache *c = a->c;
    const int64_t pos = a->docs->tpos[t], hc = dm->H * dm->c;
    a->fk->rope(opre + dm->nope, dm->H, dm->c, c->rcos + pos * dm->half, c->rsin + pos * dm->half,
                dm->half, 1);
    if (a->ob)
        a->fk->cvt_bf16_nt(a->ob + t * hc, opre, hc);
    else
        a->fk->copy_nt(a->o + t * hc, opre, hc);
}

/* Query t's dq (bf16 core), from the thread's scratch: the q path's first pass while the row is in
 * the cache (per-head RMS backward, inverse RoPE: qnorm_token), rounded to bf16 into dqb. */
static void qbwd_out(const qtask *a, float *dq, int64_t t)
{
    const int64_t hc = a->dm->H * a->dm->c;
    qnorm_token(a->qn, dq, t);
    a->fk->cvt_bf16_nt(a->dqb + t * hc, dq, hc);
}

static void qfwd_one(const qtask *a, int64_t t, char *w, int tid)
{
    (void)tid;
    AP_TSTART;
    const attn_dims *dm = a->dm;
    const trex_attn_cache *c = a->c;
    const int64_t H = dm->H, hc = dm->H * dm->c;
    const float **V = (const float **)(w + a->L.V);
    int64_t *cidx = (int64_t *)(w + a->L.cidx), *heap = (int64_t *)(w + a->L.heap);
    float *z = (float *)(w + a->L.z), *opre = (float *)(w + a->L.o);
    float *scores = (float *)(w + a->L.scores), *ps = (float *)(w + a->L.ps);
    unsigned char *mark = (unsigned char *)(w + a->L.mark);
    const bool need_scores = dm->csa && (c->sparse || a->kl);
    int64_t nw, ncs;
    const uint16_t **Vb = (const uint16_t **)(w + a->L.Vb);
    int64_t n = gather_entries(a, t, V, Vb, cidx, need_scores ? scores : NULL,
                               (const float **)(w + a->L.kp), (float *)(w + a->L.ia),
                               (float *)(w + a->L.dws), heap, mark,
                               &nw, &ncs);
    AP_T(AP_T_GATHER, tid);
    const trex_fused_pairs win = {c->kvp, t - nw + 1, nw}; /* the window: rows t - nw + 1 .. t */
    const bool klt = a->kl && dm->csa && ncs > 0; /* this query's KL term */
    /* bf16 mode: no scores z (only the KL used them), and the KL's attention mass from the core's
     * probabilities P (into z's scratch) instead of expf(z - lse) per head and entry here */
    if (a->sattn_fwd_bf16)
        a->sattn_fwd_bf16(opre, a->lse + t * H, NULL, klt ? z : NULL, (float *)(w + a->L.ws),
                          a->qb ? NULL : c->q + t * hc, a->qb ? a->qb + t * hc : NULL, V,
                          c->kvb ? Vb : NULL,
                          c->kvp ? &win : NULL, n, H, dm->c, a->sink, dm->scale);
    else
        a->sattn_fwd(opre, a->lse + t * H, z, (float *)(w + a->L.ws), c->q + t * hc, V, n, H,
                     dm->c, a->sink, dm->scale);
    AP_T(AP_T_CORE, tid);
    qfwd_out(a, opre, t);
    if (!(a->kl && dm->csa))
        return;
    a->ilse[t] = 0.0f;
    a->mass[t] = 0.0f;
    a->kl_t[t] = 0.0;
    if (ncs == 0)
        return;
    /* p: the main attention's mass on each compressed entry, summed over heads (from 0, heads
     * ascending); q: softmax of I */
    const float *lse = a->lse + t * H;
    if (a->sattn_fwd_bf16) { /* z holds P */
        head_mass(ps, z, H, n, nw, ncs);
    } else {
        for (int64_t i = 0; i < ncs; i++) {
            float s = 0.0f;
            for (int64_t h = 0; h < H; h++)
                s += expf(z[h * n + nw + i] - lse[h]);
            ps[i] = s;
        }
    }
    float msum = 0.0f;
    for (int64_t i = 0; i < ncs; i++)
        msum += ps[i];
    float mx = -INFINITY;
    for (int64_t i = 0; i < ncs; i++)
        mx = scores[cidx[i]] > mx ? scores[cidx[i]] : mx;
    double den = 0.0;
    for (int64_t i = 0; i < ncs; i++)
        den += exp((double)scores[cidx[i]] - mx);
    const float ilse = (float)((double)mx + log(den));
    a->ilse[t] = ilse;
    a->mass[t] = msum;
    double kl = 0.0;
    if (msum > 0.0f) {
        for (int64_t i = 0; i < ncs; i++) {
            if (ps[i] > 0.0f) {
                double pp = (double)ps[i] / (double)msum;
                kl += pp * (log(pp) - ((double)scores[cidx[i]] - (double)ilse));
            }
        }
    }
    a->kl_t[t] = kl;
    AP_T(AP_T_POST, tid);
}

/* The common entries of queries t0 .. t1 - 1 (at most QBLOCK, one document): their windows' union
 * [jlo, t1) then the compressed entries the last one sees, as bf16 rows in Vb; each query's two
 * ranges inside that list in vis [4 (t1 - t0)] (kernels/fused.h sattn_fwd_block_bf16); the window's
 * pair rows in win. Returns the number of entries. */
static int64_t block_entries(const qtask *a, int64_t t0, int64_t t1, const uint16_t **Vb,
                             int64_t *vis, trex_fused_pairs *win)
{
    const attn_dims *dm = a->dm;
    const attn_docs *docs = a->docs;
    const trex_attn_cache *c = a->c;
    const int64_t s = docs->seg[t0], s0 = docs->start[s], cb = docs->cstart[s];
    const int64_t jlo = (t0 - dm->nwin + 1 > s0) ? t0 - dm->nwin + 1 : s0, nw = t1 - jlo;
    const int64_t ncs = dm->m > 0 ? (t1 - 1 - s0 + 1) / dm->m : 0;
    for (int64_t k = 0; k < nw; k++)
        Vb[k] = c->kvb + (jlo + k) * dm->c;
    for (int64_t i = 0; i < ncs; i++)
        Vb[nw + i] = c->cmpb + (cb + i) * dm->c;
    for (int64_t b = 0; b < t1 - t0; b++) {
        const int64_t t = t0 + b, lo = (t - dm->nwin + 1 > s0) ? t - dm->nwin + 1 : s0;
        vis[4 * b] = lo - jlo;
        vis[4 * b + 1] = t + 1 - jlo;
        vis[4 * b + 2] = nw;
        vis[4 * b + 3] = nw + (dm->m > 0 ? (t - s0 + 1) / dm->m : 0);
    }
    *win = (trex_fused_pairs){c->kvp, jlo, nw};
    return nw + ncs;
}

/* Queries t0 .. t1 - 1 (at most QBLOCK, one document; SWA or HCA, bf16 core) in one call of the block
 * entries: the forward (sattn_fwd_block_bf16, then each query's output out: qfwd_out) or the query
 * side (sattn_bwd_query_block_bf16, then each query's dq into dqb: qbwd_out). The same lse, bf16 P
 * and d sink bits as query by query; o and dq within fp32 rounding of their sums (kernels/fused.h). */
static void qblock(const qtask *a, int64_t t0, int64_t t1, char *w, int tid, bool fwd)
{
    (void)tid;
    AP_TSTART;
    const attn_dims *dm = a->dm;
    const trex_attn_cache *c = a->c;
    const int64_t H = dm->H, hc = H * dm->c, nq = t1 - t0;
    const uint16_t **Vb = (const uint16_t **)(w + a->L.Vb);
    float *ws = (float *)(w + a->L.ws);
    int64_t vis[4 * QBLOCK];
    trex_fused_pairs win;
    const int64_t n = block_entries(a, t0, t1, Vb, vis, &win);
    const trex_fused_pairs *wp = c->kvp ? &win : NULL;
    if (fwd) {
        float *opre = (float *)(w + a->L.o);
        AP_T(AP_T_GATHER, tid);
        a->sattn_fwd_block_bf16(opre, a->lse + t0 * H, ws, a->qb + t0 * hc, nq, vis, Vb, wp, n, H,
                                dm->c, a->sink, dm->scale);
        AP_T(AP_T_CORE, tid);
        for (int64_t b = 0; b < nq; b++)
            qfwd_out(a, opre + b * hc, t0 + b);
        AP_T(AP_T_POST, tid);
    } else {
        float *dq = (float *)(w + a->L.dq);
        AP_T(AP_T_BQ_GATHER, tid);
        a->sattn_bwd_query_block_bf16(dq, a->dsink_t + t0 * H, ws, a->gb + t0 * hc, a->qb + t0 * hc,
                                      nq, vis, Vb, wp, n, H, dm->c, a->sink, dm->scale,
                                      c->lse + t0 * H, a->D + t0 * H);
        AP_T(AP_T_BQ_CORE, tid);
        for (int64_t b = 0; b < nq; b++)
            qbwd_out(a, dq + b * hc, t0 + b);
        AP_T(AP_T_BQ_QNORM, tid);
    }
}

/* Query t's side of the backward: dq (bf16 core: dqb), d sink, and with KL terms the indexer's
 * query-side gradients. With sattn_bwd_query_keys_bf16 (bf16 CSA) also the key side of its compressed
 * entries and their KL key-side terms, into chunk's copies of dC and dK^I (qtask). */
static void qbwd_one(const qtask *a, int64_t t, char *w, int tid, int64_t chunk,
                     const trex_fused_keys_out *wk)
{
    (void)tid;
    AP_TSTART;
    const attn_dims *dm = a->dm;
    const trex_attn_cache *c = a->c;
    const int64_t H = dm->H, hc = dm->H * dm->c;
    const float **V = (const float **)(w + a->L.V);
    int64_t *cidx = (int64_t *)(w + a->L.cidx);
    float *P = (float *)(w + a->L.z);
    int64_t nw, ncs;
    const uint16_t **Vb = (const uint16_t **)(w + a->L.Vb);
    int64_t n = gather_entries(a, t, V, Vb, cidx, NULL, NULL, NULL, NULL, NULL, NULL, &nw, &ncs);
    AP_T(AP_T_BQ_GATHER, tid);
    const bool kl = a->kl && dm->csa && ncs > 0 && c->mass[t] > 0.0f;
    const trex_fused_pairs win = {c->kvp, t - nw + 1, nw}; /* the window: rows t - nw + 1 .. t */
    const int64_t cb = a->docs->cstart[a->docs->seg[t]];
    float *dCb = NULL, *dikb = NULL; /* this chunk's copies of dC and dK^I */
    float **dV = (float **)(w + a->L.dV), *psum = (float *)(w + a->L.psum);
    if (a->sattn_bwd_query_keys_bf16) {
        TREX_ASSERT(chunk >= 0 && chunk < QKCH && a->dqb);
        const int64_t nc = a->docs->nc;
        dCb = chunk ? a->dCp + (chunk - 1) * nc * dm->c : a->dC;
        if (a->dik)
            dikb = chunk ? a->dikp + (chunk - 1) * nc * dm->cI : a->dik;
        for (int64_t i = 0; i < ncs; i++)
            dV[i] = dCb + (cb + cidx[i]) * dm->c;
        float *dq = (float *)(w + a->L.dq);
        a->sattn_bwd_query_keys_bf16(dq, a->dsink_t + t * H, kl ? P : NULL, dV, psum,
                                     (float *)(w + a->L.ws), a->gb + t * hc, a->qb + t * hc, Vb,
                                     c->kvp ? &win : NULL, n, nw, H, dm->c, a->sink, dm->scale,
                                     c->lse + t * H, a->D + t * H, wk);
        AP_T(AP_T_BQ_CORE, tid);
        qbwd_out(a, dq, t);
        AP_T(AP_T_BQ_QNORM, tid);
    } else if (a->sattn_bwd_query_bf16) {
        float *dq = a->dqb ? (float *)(w + a->L.dq) : a->dq + t * hc;
        a->sattn_bwd_query_bf16(dq, a->dsink_t + t * H, kl ? P : NULL,
                                (float *)(w + a->L.ws), a->gb ? NULL : a->gO + t * hc,
                                a->gb ? a->gb + t * hc : NULL, a->qb ? NULL : c->q + t * hc,
                                a->qb ? a->qb + t * hc : NULL, V,
                                c->kvb ? Vb : NULL, c->kvp ? &win : NULL, n, H, dm->c, a->sink,
                                dm->scale, c->lse + t * H, a->D + t * H);
        AP_T(AP_T_BQ_CORE, tid);
        if (a->dqb) {
            qbwd_out(a, dq, t);
            AP_T(AP_T_BQ_QNORM, tid);
        }
    } else {
        a->sattn_bwd_query(a->dq + t * hc, a->dsink_t + t * H, kl ? P : NULL,
                           (float *)(w + a->L.ws), a->gO + t * hc, c->q + t * hc, V, n, H, dm->c,
                           a->sink, dm->scale, c->lse + t * H, a->D + t * H);
        AP_T(AP_T_BQ_CORE, tid);
    }
    if (!kl)
        return;
    /* dKL/dI_s = il_scale (q_s - p_s); through the head weights and the ReLU into iq and hw */
    const int64_t nI = dm->nI, cI = dm->cI;
    const float *iq = c->iq + t * nI * cI, *hw = c->hw + t * nI;
    float *diq = a->diq + t * nI * cI, *dhw = a->dhw + t * nI;
    const float **kp = (const float **)(w + a->L.kp);
    float *ia = (float *)(w + a->L.ia);
    for (int64_t i = 0; i < ncs; i++)
        kp[i] = c->icmp.out + (cb + cidx[i]) * cI;
    if (c->dots_bf16)
        c->dots_bf16(ia, (float *)(w + a->L.dws), iq, cI, nI, c->ikb + cb * cI, cidx, ncs, cI);
    else
        a->fk->dots(ia, iq, cI, nI, kp, ncs, cI);
    AP_T(AP_T_BQ_KLD, tid);
    /* dI of every entry first, in vector-friendly loops over the entries that keep each element's
     * operations and order (the head-summed mass from 0 with heads ascending, the score by
     * idx_scores, then expf): the same bits as entry by entry, without a serial chain per entry */
    float *dI = (float *)(w + a->L.ps), *sc = (float *)(w + a->L.scores);
    head_mass(dI, P, H, n, nw, ncs);
    idx_scores(sc, ia, ncs, hw, nI);
    const float mass = c->mass[t], ilse = c->ilse[t];
    for (int64_t i = 0; i < ncs; i++)
        dI[i] = a->il_scale * (expf(sc[i] - ilse) - dI[i] / mass);
    /* dhw_h += dI a_h over the ReLU-active heads and diq_h += (dI hw_h) K^I_s, entry by entry (one
     * call: kernels/fused.h kl_qgrad, the bits of one axpy per active head and entry) */
    a->fk->kl_qgrad(diq, dhw, ia, dI, hw, kp, ncs, nI, cI);
    if (dikb) { /* the key side's KL terms (as kcmp_query: p from the key side's psum) */
        float *dIk = (float *)(w + a->L.dIk);
        for (int64_t i = 0; i < ncs; i++) {
            const float pp = psum[i] / mass;
            dIk[i] = a->il_scale * (expf(sc[i] - ilse) - pp);
            dV[i] = dikb + (cb + cidx[i]) * cI;
        }
        a->fk->kl_kgrad(dV, ia, dIk, hw, iq, ncs, nI, cI);
    }
    AP_T(AP_T_BQ_KL, tid);
}

static void qloop(void *arg, int64_t k0, int64_t k1, int tid, bool fwd)
{
    const qtask *a = arg;
    char *w = a->scr + (size_t)tid * a->stride;
    for (int64_t k = k0; k < k1; k++) {
        const int64_t b = zigzag(k, a->nqb);
        const int64_t t1 = (b + 1) * QBLOCK < a->dm->N ? (b + 1) * QBLOCK : a->dm->N;
        if (a->docs->seg[b * QBLOCK] == a->docs->seg[t1 - 1] && /* one document */
            (fwd ? a->sattn_fwd_block_bf16 != NULL : a->sattn_bwd_query_block_bf16 != NULL)) {
            qblock(a, b * QBLOCK, t1, w, tid, fwd);
            continue;
        }
        for (int64_t t = b * QBLOCK; t < t1; t++) {
            if (fwd)
                qfwd_one(a, t, w, tid);
            else
                qbwd_one(a, t, w, tid, -1, NULL);
        }
    }
}

static void qfwd_items(void *arg, int64_t k0, int64_t k1, int tid)
{
    qloop(arg, k0, k1, tid, true);
}

static void qbwd_items(void *arg, int64_t k0, int64_t k1, int tid)
{
    qloop(arg, k0, k1, tid, false);
}

static float *kwin_row(const qtask *a, int64_t j, int64_t r);

/* bf16 CSA's backward by chunks of consecutive query blocks (qtask bstart), blocks ascending: each
 * query's query side and the key side of its compressed entries in one call (qbwd_one), which also
 * writes its window entries' key-side operands into the block's (trex_fused_keys_out: the layout of
 * sattn_bwd_window_bf16, query b of the block in the columns 2 Hp b ..); then one product per block
 * into the window rows (kwin_row): each window entry gets, per block, the bits kwin_blocks gives it. */
static void qbwd_chunks(void *arg, int64_t j0, int64_t j1, int tid)
{
    const qtask *a = arg;
    const attn_dims *dm = a->dm;
    const attn_docs *docs = a->docs;
    char *w = a->scr + (size_t)tid * a->stride;
    const int64_t N = dm->N, Hp = TREX_FUSED_SATTN_HP(dm->H);
    uint16_t *a2 = (uint16_t *)(w + a->L.wa2), *b2 = (uint16_t *)(w + a->L.wb2);
    float **dV = (float **)(w + a->L.dV), *ws = (float *)(w + a->L.ws);
    for (int64_t it = j0; it < j1; it++) {
        const int64_t j = zigzag(it, QKCH); /* a thread's run of items: early and late chunks */
        for (int64_t b = a->bstart[j]; b < a->bstart[j + 1]; b++) {
            const int64_t t0 = b * QBLOCK, t1 = t0 + QBLOCK < N ? t0 + QBLOCK : N;
            const int64_t K = 2 * Hp * (t1 - t0);
            int64_t ulo = t1;
            for (int64_t t = t0; t < t1; t++) {
                const int64_t s0 = docs->start[docs->seg[t]];
                const int64_t lo = t - dm->nwin + 1 > s0 ? t - dm->nwin + 1 : s0;
                ulo = lo < ulo ? lo : ulo;
            }
            const int64_t nu = t1 - ulo;
            memset(a2, 0, (size_t)((nu + 15) / 16 * 16 * K) * 2);
            for (int64_t t = t0; t < t1; t++) {
                const int64_t s0 = docs->start[docs->seg[t]];
                const int64_t lo = t - dm->nwin + 1 > s0 ? t - dm->nwin + 1 : s0;
                const trex_fused_keys_out wk = {a2, b2, K, 2 * Hp * (t - t0), lo - ulo};
                qbwd_one(a, t, w, tid, j, &wk);
            }
            AP_TSTART;
            for (int64_t r = ulo; r < t1; r++)
                dV[r - ulo] = kwin_row(a, j, r);
            a->fk->sattn_key_product_bf16(dV, ws, a2, b2, K, nu, dm->c);
            AP_T(AP_T_KC_CORE, tid);
        }
    }
}

/* Chunk bounds bstart[0 .. QKCH] (qtask) of the nqb query blocks: consecutive blocks of about equal
 * work (each query's window and compressed entries, its selection in sparse mode), fixed by the
 * batch and the selections alone, never by the thread count. */
static void chunk_bounds(qtask *a)
{
    const attn_dims *dm = a->dm;
    const attn_docs *docs = a->docs;
    double total = 0.0;
    for (int pass = 0; pass < 2; pass++) {
        double cum = 0.0;
        int64_t j = 1;
        a->bstart[0] = 0;
        for (int64_t b = 0; b < a->nqb; b++) {
            if (pass == 1)
                while (j < QKCH && cum >= total * (double)j / QKCH)
                    a->bstart[j++] = b;
            for (int64_t t = b * QBLOCK; t < (b + 1) * QBLOCK && t < dm->N; t++) {
                const int64_t p = docs->tpos[t], nw = p + 1 < dm->nwin ? p + 1 : dm->nwin;
                int64_t ncs = dm->m > 0 ? (p + 1) / dm->m : 0;
                if (dm->csa && a->c->sparse)
                    ncs = a->c->nsel[t];
                /* a compressed entry costs about twice a window entry (its key side and KL terms
                 * run per query, the window's per block) */
                cum += (double)(nw + 2 * ncs);
            }
        }
        if (pass == 0)
            total = cum;
        else
            for (; j <= QKCH; j++)
                a->bstart[j] = a->nqb;
    }
}

/* The dkv row of window entry r for chunk j's terms (qtask: its own entries, or its spill rows). */
static float *kwin_row(const qtask *a, int64_t j, int64_t r)
{
    const int64_t own = a->bstart[j] * QBLOCK, c = a->dm->c;
    if (r >= own)
        return a->dkv + r * c;
    const int64_t lo = own - (a->dm->nwin - 1);
    TREX_ASSERT(r >= lo && r >= 0);
    return a->spill + (j * (a->dm->nwin - 1) + (r - lo)) * c;
}

/* The key side of queries t0 .. t1 - 1 (a block of chunk j that spans documents, whose query side
 * ran query by query): as kwin_blocks and kcmp_blocks give it for this block (the window union in
 * one sattn_bwd_window_bf16 call, each query's window in its own document; then, document by
 * document, the compressed entries the block's queries of that document see). */
static void kblock_split(const qtask *a, int64_t j, int64_t t0, int64_t t1, char *w)
{
    const attn_dims *dm = a->dm;
    const attn_docs *docs = a->docs;
    const trex_attn_cache *c = a->c;
    const int64_t nq = t1 - t0, H = dm->H, hc = H * dm->c;
    const uint16_t **Vb = (const uint16_t **)(w + a->L.Vb);
    float **dV = (float **)(w + a->L.dV), *ws = (float *)(w + a->L.ws);
    int64_t vis[2 * QBLOCK], ulo = t1, uhi = 0;
    for (int64_t b = 0; b < nq; b++) {
        const int64_t t = t0 + b, s0 = docs->start[docs->seg[t]];
        const int64_t lo = t - dm->nwin + 1 > s0 ? t - dm->nwin + 1 : s0;
        vis[2 * b] = lo, vis[2 * b + 1] = t + 1;
        ulo = lo < ulo ? lo : ulo;
        uhi = t + 1 > uhi ? t + 1 : uhi;
    }
    for (int64_t r = ulo; r < uhi; r++) {
        Vb[r - ulo] = c->kvb + r * dm->c;
        dV[r - ulo] = kwin_row(a, j, r);
    }
    for (int64_t b = 0; b < nq; b++)
        vis[2 * b] -= ulo, vis[2 * b + 1] -= ulo;
    a->sattn_bwd_window_bf16(dV, ws, Vb, uhi - ulo, nq, vis, a->qb + t0 * hc, a->gb + t0 * hc, H,
                             dm->c, dm->scale, c->lse + t0 * H, a->D + t0 * H);
    if (dm->m <= 0)
        return;
    float *dCb = j ? a->dCp + (j - 1) * docs->nc * dm->c : a->dC;
    for (int64_t s = docs->seg[t0]; s <= docs->seg[t1 - 1]; s++) {
        const int64_t s0 = docs->start[s], cb = docs->cstart[s];
        int64_t hmax = 0;
        for (int64_t b = 0; b < nq; b++) {
            const int64_t t = t0 + b, hi = docs->seg[t] == s ? (t - s0 + 1) / dm->m : 0;
            vis[2 * b] = 0, vis[2 * b + 1] = hi;
            hmax = hi > hmax ? hi : hmax;
        }
        if (hmax == 0)
            continue;
        for (int64_t i = 0; i < hmax; i++) {
            Vb[i] = c->cmpb + (cb + i) * dm->c;
            dV[i] = dCb + (cb + i) * dm->c;
        }
        a->sattn_bwd_window_bf16(dV, ws, Vb, hmax, nq, vis, a->qb + t0 * hc, a->gb + t0 * hc, H,
                                 dm->c, dm->scale, c->lse + t0 * H, a->D + t0 * H);
    }
}

/* bf16 SWA and HCA: the backward's query side and its whole key side by fixed chunks of consecutive
 * query blocks (qtask bstart), blocks ascending inside a chunk: a block in one document in one call of
 * sattn_bwd_query_block_keys_bf16, else query by query (qbwd_one) and its key side by kblock_split. */
static void qbwd_kchunks(void *arg, int64_t j0, int64_t j1, int tid)
{
    const qtask *a = arg;
    const attn_dims *dm = a->dm;
    const trex_attn_cache *c = a->c;
    char *w = a->scr + (size_t)tid * a->stride;
    const int64_t N = dm->N, H = dm->H, hc = H * dm->c;
    const uint16_t **Vb = (const uint16_t **)(w + a->L.Vb);
    float **dV = (float **)(w + a->L.dV), *ws = (float *)(w + a->L.ws);
    for (int64_t it = j0; it < j1; it++) {
        const int64_t j = zigzag(it, QKCH); /* a thread's run of items: early and late chunks */
        float *dCb = dm->m > 0 ? (j ? a->dCp + (j - 1) * a->docs->nc * dm->c : a->dC) : NULL;
        for (int64_t b = a->bstart[j]; b < a->bstart[j + 1]; b++) {
            const int64_t t0 = b * QBLOCK, t1 = t0 + QBLOCK < N ? t0 + QBLOCK : N;
            if (a->docs->seg[t0] != a->docs->seg[t1 - 1]) {
                for (int64_t t = t0; t < t1; t++)
                    qbwd_one(a, t, w, tid, -1, NULL);
                kblock_split(a, j, t0, t1, w);
                continue;
            }
            AP_TSTART;
            int64_t vis[4 * QBLOCK];
            trex_fused_pairs win;
            const int64_t n = block_entries(a, t0, t1, Vb, vis, &win);
            const int64_t nw = vis[2], jlo = win.first, cb = a->docs->cstart[a->docs->seg[t0]];
            for (int64_t k = 0; k < nw; k++)
                dV[k] = kwin_row(a, j, jlo + k);
            for (int64_t i = 0; i < n - nw; i++)
                dV[nw + i] = dCb + (cb + i) * dm->c;
            float *dq = (float *)(w + a->L.dq);
            AP_T(AP_T_BQ_GATHER, tid);
            a->sattn_bwd_query_block_keys_bf16(dq, a->dsink_t + t0 * H, dV, ws, a->gb + t0 * hc,
                                               a->qb + t0 * hc, t1 - t0, vis, Vb,
                                               c->kvp ? &win : NULL, n, H, dm->c, a->sink,
                                               dm->scale, c->lse + t0 * H, a->D + t0 * H);
            AP_T(AP_T_BQ_CORE, tid);
            for (int64_t q = t0; q < t1; q++)
                qbwd_out(a, dq + (q - t0) * hc, q);
            AP_T(AP_T_BQ_QNORM, tid);
        }
    }
}

/* dst[e] += the QKCH - 1 copies src[j][e] (j ascending) for the rows e of [r0, r1) of width w: the
 * chunks' sums of bf16 CSA's compressed key side (qbwd_chunks) added in chunk order. */
typedef struct qk_reduce_task {
    float *dst;
    const float *src;
    int64_t rows, w;
} qk_reduce_task;

static void qk_reduce_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const qk_reduce_task *a = arg;
    for (int64_t j = 0; j < QKCH - 1; j++) {
        const float *s = a->src + j * a->rows * a->w;
        for (int64_t i = r0 * a->w; i < r1 * a->w; i++)
            a->dst[i] += s[i];
    }
}

/* ---- key-side backward ------------------------------------------------------------------------ */

typedef struct ktask {
    const attn_dims *dm;
    const attn_docs *docs;
    const trex_attn_cache *c;
    const trex_fused_table *fk;
    trex_fused_sattn_bwd_entries_fn sattn_bwd_entries; /* fp32 mode */
    trex_fused_sattn_bwd_entries_bf16_fn sattn_bwd_entries_bf16; /* bf16 mode: this one instead */
    /* bf16 mode with q, g and kv rounded: the window by blocks of KQB queries (kwin_blocks) */
    trex_fused_sattn_bwd_window_bf16_fn sattn_bwd_window_bf16;
    bool bf16;              /* scratch sized for the bf16 entries */
    const float *gO, *D;
    const uint16_t *qb, *gb; /* bf16 mode: q and gO rounded [N, H*c] */
    float *dkv;             /* [N, c] */
    float *dC, *dik;        /* [nc, c], [nc, cI] */
    bool kl;
    float il_scale;
    const int64_t *tiles;   /* compressed tiles: (document, i0, i1) triples */
    int64_t ntiles;
    const int64_t *bounds;  /* [threads + 1]: work item p = tiles bounds[p] .. bounds[p+1] - 1 */
    int64_t kmax;           /* most entries of one key-side call (kscr_max) */
    char *scr;              /* per thread: entry lists, psum, indexer head scores, run marks */
    size_t stride;
} ktask;

typedef struct kscr {
    const float **V;
    const uint16_t **Vb;
    float **dV;
    float *psum, *sc, *ws, *ia, *dws;
    const float **kp;
    int64_t *ent;
    unsigned char *mine;    /* [nc] compressed entries of the thread's run (zero between runs) */
} kscr;

/* Entries of one key-side call: the window entries of a run of tiles that one query sees (at most
 * nwin), or the compressed entries of a run of tiles that one query attends (at most its selection,
 * or every visible entry of the longest document). */
static int64_t kscr_max(const attn_dims *dm, const attn_docs *docs, bool sparse)
{
    int64_t cm = 0;
    if (dm->m > 0)
        cm = (dm->csa && sparse && dm->topk < docs->maxnb) ? dm->topk : docs->maxnb;
    const int64_t nw = dm->nwin + KQB - 1; /* a block of KQB queries (kwin_blocks) */
    const int64_t km = nw > cm ? nw : cm;
    return km > 1 ? km : 1;
}

/* Byte offsets of the per-thread key-side scratch. */
typedef struct kscr_lay {
    size_t V, Vb, dV, psum, sc, ent, ws, ia, kp, mine, dws, total;
} kscr_lay;

static kscr_lay kscr_layout(const attn_dims *dm, int64_t km, int64_t nc, bool bf16)
{
    kscr_lay L;
    size_t t = 0;
    const int64_t wb = TREX_FUSED_SATTN_BF16_WS(km, dm->H, dm->c);
    const int64_t wk = TREX_FUSED_SATTN_WIN_BF16_WS(km, dm->H, dm->c, KQB);
    const int64_t wsf = bf16 ? (wk > wb ? wk : wb) : TREX_FUSED_SATTN_WS(km, dm->H);
    L.V = lay(&t, (size_t)km * sizeof(float *));
    L.Vb = lay(&t, (size_t)km * sizeof(uint16_t *));
    L.dV = lay(&t, (size_t)km * sizeof(float *));
    L.psum = lay(&t, (size_t)km * sizeof(float));
    L.sc = lay(&t, (size_t)km * sizeof(float));
    L.ent = lay(&t, (size_t)km * sizeof(int64_t));
    L.ws = lay(&t, (size_t)wsf * sizeof(float));
    L.ia = lay(&t, (size_t)((dm->nI + 1) * km) * sizeof(float));
    L.kp = lay(&t, (size_t)km * sizeof(float *));
    L.mine = lay(&t, (size_t)nc + 1);
    const int64_t dws = dm->csa && bf16 ? TREX_FUSED_DOTS_BF16_WS(km, dm->nI, dm->cI) : 1;
    L.dws = lay(&t, (size_t)dws * sizeof(float));
    L.total = t;
    return L;
}

static kscr kscr_get(const ktask *a, int tid)
{
    char *w = a->scr + (size_t)tid * a->stride;
    const kscr_lay L = kscr_layout(a->dm, a->kmax, a->docs->nc, a->bf16);
    kscr k;
    k.V = (const float **)(w + L.V);
    k.Vb = (const uint16_t **)(w + L.Vb);
    k.dV = (float **)(w + L.dV);
    k.psum = (float *)(w + L.psum);
    k.sc = (float *)(w + L.sc);
    k.ent = (int64_t *)(w + L.ent);
    k.ws = (float *)(w + L.ws);
    k.ia = (float *)(w + L.ia);
    k.kp = (const float **)(w + L.kp);
    k.mine = (unsigned char *)(w + L.mine);
    k.dws = (float *)(w + L.dws);
    return k;
}

/* bf16 mode's window key side by blocks of KQB queries (kernels/fused.h sattn_bwd_window_bf16): the
 * blocks are fixed by query index (queries KQB k .. KQB k + KQB - 1, all of them in every call of the
 * block, also those that see none of the run's entries), and a call takes the run's entries that some
 * query of the block sees (consecutive rows: the union of consecutive queries' windows). An entry's
 * sum for a block then depends only on the entry and the block, and the blocks reach it in ascending
 * order, whatever the runs are: the same bits for any thread count. */
static void kwin_blocks(const ktask *a, const kscr *ks, int64_t j0, int64_t j1, int64_t tmax)
{
    const attn_dims *dm = a->dm;
    const int64_t N = dm->N, H = dm->H, c = dm->c, hc = H * c;
    int64_t vis[2 * KQB];
    for (int64_t tb = j0 / KQB * KQB; tb <= tmax; tb += KQB) {
        const int64_t nq = N - tb < KQB ? N - tb : KQB;
        int64_t ulo = N, uhi = 0;
        for (int64_t b = 0; b < nq; b++) { /* query t sees rows lo .. hi - 1 of the run */
            const int64_t t = tb + b, s0 = a->docs->start[a->docs->seg[t]];
            int64_t lo = t - dm->nwin + 1;
            lo = lo > s0 ? lo : s0;
            lo = lo > j0 ? lo : j0;
            const int64_t hi = t + 1 < j1 ? t + 1 : j1;
            vis[2 * b] = lo;
            vis[2 * b + 1] = hi > lo ? hi : lo;
            if (hi > lo) {
                ulo = lo < ulo ? lo : ulo;
                uhi = hi > uhi ? hi : uhi;
            }
        }
        if (uhi <= ulo)
            continue;
        const int64_t n = uhi - ulo;
        for (int64_t i = 0; i < n; i++) {
            ks->Vb[i] = a->c->kvb + (ulo + i) * c;
            ks->dV[i] = a->dkv + (ulo + i) * c;
        }
        for (int64_t b = 0; b < nq; b++) {
            vis[2 * b] -= ulo;
            vis[2 * b + 1] -= ulo;
        }
        a->sattn_bwd_window_bf16(ks->dV, ks->ws, ks->Vb, n, nq, vis, a->qb + tb * hc,
                                 a->gb + tb * hc, H, c, dm->scale, a->c->lse + tb * H,
                                 a->D + tb * H);
    }
}

/* Window entries: the work items are tiles of KTILE consecutive tokens; a thread's run of tiles
 * [k0, k1) gathers, query by query ascending, the entries of the run that each query sees (same
 * document, t - nwin < j <= t) in one call, heads ascending inside it. Each entry row gets its terms in
 * query order whatever the runs are (every entry's result in a call depends only on that entry), so
 * the sums are the same for any thread count, and one call per query amortises the per-query work. */
static void kwin_items(void *arg, int64_t k0, int64_t k1, int tid)
{
    const ktask *a = arg;
    const attn_dims *dm = a->dm;
    const int64_t N = dm->N, H = dm->H, c = dm->c, hc = H * c;
    kscr ks = kscr_get(a, tid);
    const int64_t j0 = k0 * KTILE, j1 = (k1 * KTILE < N) ? k1 * KTILE : N;
    if (j0 >= j1)
        return;
    const int64_t tmax = (j1 - 1 + dm->nwin - 1 < N - 1) ? j1 - 1 + dm->nwin - 1 : N - 1;
    if (a->sattn_bwd_window_bf16) {
        kwin_blocks(a, &ks, j0, j1, tmax);
        return;
    }
    for (int64_t t = j0; t <= tmax; t++) {
        const int64_t jlo = (t - dm->nwin + 1 > j0) ? t - dm->nwin + 1 : j0;
        const int64_t jhi = (t < j1 - 1) ? t : j1 - 1;
        int64_t n = 0;
        for (int64_t j = jlo; j <= jhi; j++) {
            if (a->docs->seg[j] != a->docs->seg[t])
                continue;
            ks.V[n] = a->c->kv + j * c;
            if (a->c->kvb)
                ks.Vb[n] = a->c->kvb + j * c;
            ks.dV[n++] = a->dkv + j * c;
        }
        if (a->sattn_bwd_entries_bf16)
            a->sattn_bwd_entries_bf16(ks.dV, ks.psum, ks.ws, ks.V, a->c->kvb ? ks.Vb : NULL, n,
                                      a->qb ? NULL : a->c->q + t * hc,
                                      a->qb ? a->qb + t * hc : NULL,
                                      a->gb ? NULL : a->gO + t * hc,
                                      a->gb ? a->gb + t * hc : NULL, H, c,
                                      dm->scale, a->c->lse + t * H, a->D + t * H);
        else
            a->sattn_bwd_entries(ks.dV, ks.psum, ks.ws, ks.V, n, a->c->q + t * hc, a->gO + t * hc,
                                 H, c, dm->scale, a->c->lse + t * H, a->D + t * H);
    }
}

/* The key side of query t for the n compressed entries ks->ent (global indices, ascending). Also the
 * KL gradient into the indexer keys of the same entries (the KL set is the attended set):
 * dK^I_s += sum_h dI_ts hw_th [a_ths > 0] iq_th. */
static void kcmp_query(const ktask *a, int64_t t, const kscr *ks, int64_t n, int tid)
{
    (void)tid;
    AP_TSTART;
    const attn_dims *dm = a->dm;
    const trex_attn_cache *c = a->c;
    const int64_t H = dm->H, hc = H * dm->c;
    for (int64_t i = 0; i < n; i++) {
        ks->V[i] = c->cmp.out + ks->ent[i] * dm->c;
        if (c->cmpb)
            ks->Vb[i] = c->cmpb + ks->ent[i] * dm->c;
        ks->dV[i] = a->dC + ks->ent[i] * dm->c;
    }
    if (a->sattn_bwd_entries_bf16)
        a->sattn_bwd_entries_bf16(ks->dV, ks->psum, ks->ws, ks->V, c->cmpb ? ks->Vb : NULL, n,
                                  a->qb ? NULL : c->q + t * hc, a->qb ? a->qb + t * hc : NULL,
                                  a->gb ? NULL : a->gO + t * hc, a->gb ? a->gb + t * hc : NULL, H,
                                  dm->c, dm->scale,
                                  c->lse + t * H, a->D + t * H);
    else
        a->sattn_bwd_entries(ks->dV, ks->psum, ks->ws, ks->V, n, c->q + t * hc, a->gO + t * hc, H,
                             dm->c, dm->scale, c->lse + t * H, a->D + t * H);
    AP_T(AP_T_KC_CORE, tid);
    if (!a->kl || !(c->mass[t] > 0.0f))
        return;
    const int64_t nI = dm->nI, cI = dm->cI;
    const float *iq = c->iq + t * nI * cI, *hw = c->hw + t * nI;
    if (c->dots_bf16) {
        c->dots_bf16(ks->ia, ks->dws, iq, cI, nI, c->ikb, ks->ent, n, cI);
    } else {
        for (int64_t i = 0; i < n; i++)
            ks->kp[i] = c->icmp.out + ks->ent[i] * cI;
        a->fk->dots(ks->ia, iq, cI, nI, ks->kp, n, cI);
    }
    AP_T(AP_T_KC_KLD, tid);
    idx_scores(ks->sc, ks->ia, n, hw, nI); /* the scores of all entries at once */
    for (int64_t i = 0; i < n; i++) { /* sc[i] becomes dI of entry i */
        const float pp = ks->psum[i] / c->mass[t];
        ks->sc[i] = a->il_scale * (expf(ks->sc[i] - c->ilse[t]) - pp);
        ks->dV[i] = a->dik + ks->ent[i] * cI;
    }
    /* dK^I_s += sum over the ReLU-active heads (ascending) of (dI hw_h) iq_h (kernels/fused.h
     * kl_kgrad) */
    a->fk->kl_kgrad(ks->dV, ks->ia, ks->sc, hw, iq, n, nI, cI);
    AP_T(AP_T_KC_KL, tid);
}

/* Splits the nt compressed tiles (document order) into `parts` runs of consecutive tiles of about
 * equal work, run p = tiles bounds[p] .. bounds[p+1] - 1. The work of an entry is the number of
 * queries that attend it: its selections in sparse mode (counted into cnt [nc]), else every query of
 * its document from the first that sees it. Only the speed depends on the split (kcmp_items). */
static void kcmp_bounds(int64_t *bounds, int64_t parts, const int64_t *tiles, int64_t nt,
                        const attn_dims *dm, const attn_docs *docs, const trex_attn_cache *C,
                        int64_t *cnt)
{
    const int64_t nc = docs->nc;
    if (dm->csa && C->sparse) {
        memset(cnt, 0, (size_t)nc * sizeof *cnt);
        for (int64_t t = 0; t < dm->N; t++) {
            const int64_t cb = docs->cstart[docs->seg[t]];
            for (int64_t q = 0; q < C->nsel[t]; q++)
                cnt[cb + C->sel[t * dm->topk + q]]++;
        }
    } else {
        for (int64_t e = 0; e < nc; e++) {
            const int64_t sg = docs->cseg[e], i = e - docs->cstart[sg];
            const int64_t v = docs->len[sg] - ((i + 1) * dm->m - 1);
            cnt[e] = v > 0 ? v : 0;
        }
    }
    double total = 0.0;
    for (int64_t e = 0; e < nc; e++)
        total += (double)cnt[e];
    bounds[0] = 0;
    double cum = 0.0;
    int64_t p = 1;
    for (int64_t j = 0; j < nt && p < parts; j++) {
        while (p < parts && cum >= total * (double)p / (double)parts)
            bounds[p++] = j;
        const int64_t e0 = docs->cstart[tiles[3 * j]];
        for (int64_t i = tiles[3 * j + 1]; i < tiles[3 * j + 2]; i++)
            cum += (double)cnt[e0 + i];
    }
    for (; p <= parts; p++)
        bounds[p] = nt;
}

/* bf16 mode's compressed key side without a selection and without KL terms (HCA layers) by blocks of
 * KQB queries, as kwin_blocks: the run's entries imin .. imax - 1 of document s (consecutive rows of
 * cmpb; query t sees those below (t - s0 + 1) / m), blocks fixed by query index, every query of a
 * block in each of its calls (one of another document sees none), so the same bits for any runs. */
static void kcmp_blocks(const ktask *a, const kscr *ks, int64_t s, int64_t imin, int64_t imax,
                        int tid)
{
    (void)tid;
    AP_TSTART;
    const attn_dims *dm = a->dm;
    const attn_docs *docs = a->docs;
    const int64_t N = dm->N, H = dm->H, c = dm->c, hc = H * c;
    const int64_t s0 = docs->start[s], L = docs->len[s], cb = docs->cstart[s];
    int64_t vis[2 * KQB];
    const int64_t t0 = s0 + (imin + 1) * dm->m - 1; /* the first query that sees entry imin */
    for (int64_t tb = t0 / KQB * KQB; tb < s0 + L; tb += KQB) {
        const int64_t nq = N - tb < KQB ? N - tb : KQB;
        int64_t uhi = imin;
        for (int64_t b = 0; b < nq; b++) { /* query t sees entries imin .. hi - 1 */
            const int64_t t = tb + b;
            int64_t hi = imin;
            if (docs->seg[t] == s) {
                const int64_t v = (t - s0 + 1) / dm->m;
                hi = v < imax ? v : imax;
                hi = hi > imin ? hi : imin;
            }
            vis[2 * b] = 0;
            vis[2 * b + 1] = hi - imin;
            uhi = hi > uhi ? hi : uhi;
        }
        if (uhi <= imin)
            continue;
        const int64_t n = uhi - imin;
        for (int64_t i = 0; i < n; i++) {
            ks->Vb[i] = a->c->cmpb + (cb + imin + i) * c;
            ks->dV[i] = a->dC + (cb + imin + i) * c;
        }
        a->sattn_bwd_window_bf16(ks->dV, ks->ws, ks->Vb, n, nq, vis, a->qb + tb * hc,
                                 a->gb + tb * hc, H, c, dm->scale, a->c->lse + tb * H,
                                 a->D + tb * H);
    }
    AP_T(AP_T_KC_CORE, tid);
}

/* The thread's run of work items [k0, k1) covers the tiles bounds[k0] .. bounds[k1] - 1 (kcmp_bounds:
 * consecutive tiles of about equal work per thread); document by document
 * (ascending), every query that attends an entry of the run's tiles makes one call with all those
 * entries (ascending), queries ascending. Each entry's result in a call depends only on that entry
 * and the query (kernels/fused.h), and each entry gets its terms in query order, so the sums are the
 * same for any thread count, while one call per query and run (instead of one per query and tile)
 * amortises the per-call work: a sparse query selects only a few entries of each tile. */
static void kcmp_items(void *arg, int64_t k0, int64_t k1, int tid)
{
    const ktask *a = arg;
    const attn_dims *dm = a->dm;
    const attn_docs *docs = a->docs;
    const trex_attn_cache *c = a->c;
    const bool sel_mode = dm->csa && c->sparse;
    kscr ks = kscr_get(a, tid);
    int64_t j = 0;
    while (j < a->ntiles) {
        /* the tiles of one document, ascending; mark those of the run */
        const int64_t s = a->tiles[3 * j];
        int64_t jend = j, imin = -1, imax = 0;
        for (; jend < a->ntiles && a->tiles[3 * jend] == s; jend++) {
            if (jend < a->bounds[k0] || jend >= a->bounds[k1])
                continue;
            const int64_t i0 = a->tiles[3 * jend + 1], i1 = a->tiles[3 * jend + 2];
            if (imin < 0)
                imin = i0;
            imax = i1;
            memset(ks.mine + docs->cstart[s] + i0, 1, (size_t)(i1 - i0));
        }
        j = jend;
        if (imin < 0)
            continue;
        const int64_t s0 = docs->start[s], L = docs->len[s], cb = docs->cstart[s];
        const unsigned char *mine = ks.mine + cb;
        if (a->sattn_bwd_window_bf16 && !sel_mode && !a->kl) {
            kcmp_blocks(a, &ks, s, imin, imax, tid);
            memset(ks.mine + cb + imin, 0, (size_t)(imax - imin));
            continue;
        }
        for (int64_t t = s0 + (imin + 1) * dm->m - 1; t < s0 + L; t++) {
            int64_t n = 0;
            if (sel_mode) {
                const int32_t *sel = c->sel + t * dm->topk;
                const int64_t ns = c->nsel[t];
                for (int64_t q = 0; q < ns && sel[q] < imax; q++)
                    if (mine[sel[q]])
                        ks.ent[n++] = cb + sel[q];
            } else {
                const int64_t vis = (t - s0 + 1) / dm->m;
                const int64_t ib = vis < imax ? vis : imax;
                for (int64_t i = imin; i < ib; i++)
                    if (mine[i])
                        ks.ent[n++] = cb + i;
            }
            if (n > 0) {
                kcmp_query(a, t, &ks, n, tid);
            }
        }
        memset(ks.mine + cb + imin, 0, (size_t)(imax - imin));
    }
}

/* ---- D = g.o per (token, head) ------------------------------------------------------------------ */

/* The backward's pass over the output gradient g [N, H, c], token by token: D = g.o per head (as
 * am_sattn_delta, one dot per (token, head)), then g rotated back by RoPE (as rope_apply), in place;
 * in bf16 mode, where nothing reads the fp32 g again, g is rotated in the thread's row instead (the
 * same operations: the same bits) and only its bf16 rounding is written, into gb. */
typedef struct gprep_task {
    float *D, *g;
    uint16_t *gb;          /* NULL or [N, H*c] */
    float *row;            /* with gb or ob: [threads, H*c] scratch */
    const float *o;
    const uint16_t *ob;    /* bf16 mode: o's rounding instead of o (D = g.o of the rounded o) */
    const attn_dims *dm;
    const int64_t *pos;
    const float *ct, *st;
    trex_fused_dot_fn dot;
} gprep_task;

static void gprep_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    const gprep_task *a = arg;
    const attn_dims *dm = a->dm;
    const int64_t H = dm->H, c = dm->c, hc = H * c;
    for (int64_t t = r0; t < r1; t++) {
        const float *o = a->o + t * hc;
        if (a->ob) { /* the row widened in the thread's scratch, which the loop below reuses */
            float *row = a->row + (int64_t)tid * hc;
            trex_cvt_bf16_f32(row, a->ob + t * hc, hc);
            o = row;
        }
        for (int64_t h = 0; h < H; h++)
            a->D[t * H + h] = a->dot(a->g + t * hc + h * c, o + h * c, c);
    }
    if (!a->gb) {
        rope_task rt = {a->g, H, c, c - dm->r, dm->half, a->pos, a->ct, a->st, false, NULL, NULL};
        rope_rows(&rt, r0, r1, tid);
        return;
    }
    /* g is rotated in the thread's row: gO's lines stay clean (they leave the cache without a
     * write-back); gb around the cache: read by the later loops */
    float *row = a->row + (int64_t)tid * hc;
    for (int64_t t = r0; t < r1; t++) {
        memcpy(row, a->g + t * hc, (size_t)hc * sizeof(float));
        trex_fused()->rope(row + dm->nope, H, c, a->ct + a->pos[t] * dm->half,
                           a->st + a->pos[t] * dm->half, dm->half, 0); /* as rope_rows */
        trex_fused()->cvt_bf16_nt(a->gb + t * hc, row, hc);
    }
}

/* ---- validation ------------------------------------------------------------------------------- */

static trex_code dims_init(attn_dims *dm, const trex_config *cfg, int layer, int64_t N,
                           trex_err *err)
{
    if (layer < 0 || layer >= trex_config_n_blocks(cfg) || layer >= cfg->n_compress_ratios)
        return trex_err_set(err, TREX_EINVAL, "attention: layer %d out of range (config has %lld)",
                            layer, (long long)trex_config_n_blocks(cfg));
    memset(dm, 0, sizeof *dm);
    dm->N = N;
    dm->d = cfg->hidden_size;
    dm->H = cfg->num_attention_heads;
    dm->c = cfg->head_dim;
    dm->r = cfg->qk_rope_head_dim;
    dm->half = dm->r / 2;
    dm->nope = dm->c - dm->r;
    dm->dc = cfg->q_lora_rank;
    dm->G = cfg->o_groups;
    dm->dg = cfg->o_lora_rank;
    dm->nwin = cfg->sliding_window;
    dm->m = trex_config_ratio(cfg, layer);
    dm->wm = dm->m == 4 ? 2 : 1;
    dm->csa = dm->m == 4;
    dm->nI = dm->csa ? cfg->index_n_heads : 0;
    dm->cI = dm->csa ? cfg->index_head_dim : 0;
    dm->topk = dm->csa ? cfg->index_topk : 0;
    dm->eps = (float)cfg->rms_norm_eps;
    dm->scale = (float)(1.0 / sqrt((double)dm->c));
    dm->hscale = dm->csa ? (float)(1.0 / sqrt((double)dm->cI * (double)dm->nI)) : 0.0f;
    if (dm->d < 1 || dm->H < 1 || dm->c < 1 || dm->dc < 1 || dm->G < 1 || dm->dg < 1)
        return trex_err_set(err, TREX_EINVAL, "attention: hidden_size, num_attention_heads, "
                            "head_dim, q_lora_rank, o_groups and o_lora_rank must be >= 1");
    if (dm->r < 2 || dm->r % 2 != 0 || dm->r > dm->c)
        return trex_err_set(err, TREX_EINVAL, "attention: qk_rope_head_dim %lld must be even, >= 2 "
                            "and <= head_dim %lld", (long long)dm->r, (long long)dm->c);
    if (dm->H % dm->G != 0)
        return trex_err_set(err, TREX_EINVAL, "attention: num_attention_heads %lld is not a "
                            "multiple of o_groups %lld", (long long)dm->H, (long long)dm->G);
    if (dm->nwin < 1)
        return trex_err_set(err, TREX_EINVAL, "attention: sliding_window must be >= 1");
    if (dm->m < 0)
        return trex_err_set(err, TREX_EINVAL, "attention: compress_ratios[%d] = %lld is negative",
                            layer, (long long)dm->m);
    if (cfg->num_key_value_heads != 1)
        return trex_err_set(err, TREX_EINVAL, "attention: num_key_value_heads must be 1 (one shared "
                            "K=V head)");
    if (!(cfg->rms_norm_eps >= 0.0))
        return trex_err_set(err, TREX_EINVAL, "attention: rms_norm_eps must be >= 0");
    if (dm->m > 0 && !(cfg->compress_rope_theta > 0.0))
        return trex_err_set(err, TREX_EINVAL, "attention: compress_rope_theta must be > 0");
    if (dm->m == 0 && !(cfg->rope_theta > 0.0))
        return trex_err_set(err, TREX_EINVAL, "attention: rope_theta must be > 0");
    if (dm->m > 0 && cfg->yarn &&
        !(cfg->rope_factor > 0.0 && cfg->rope_original_max_pos > 0 && cfg->rope_beta_fast > 0.0 &&
          cfg->rope_beta_slow > 0.0))
        return trex_err_set(err, TREX_EINVAL, "attention: rope_scaling (yarn) needs factor, "
                            "original_max_position_embeddings, beta_fast and beta_slow > 0");
    if (dm->csa && (dm->nI < 1 || dm->cI < dm->r || dm->topk < 1))
        return trex_err_set(err, TREX_EINVAL, "attention: a ratio-4 layer needs index_n_heads >= 1, "
                            "index_head_dim >= qk_rope_head_dim and index_topk >= 1");
    return TREX_OK;
}

static bool docs_init(attn_docs *dc, trex_arena *ar, const trex_seqinfo *seq, int64_t m)
{
    const int64_t N = seq->B * seq->T, ns = seq->nseg;
    TREX_ASSERT(seq->B >= 1 && seq->T >= 1 && ns >= 1 && seq->seg_start && seq->seg_len);
    dc->nseg = ns;
    dc->start = trex_arena_alloc(ar, (size_t)ns * sizeof(int64_t));
    dc->len = trex_arena_alloc(ar, (size_t)ns * sizeof(int64_t));
    dc->seg = trex_arena_alloc(ar, (size_t)N * sizeof(int64_t));
    dc->tpos = trex_arena_alloc(ar, (size_t)N * sizeof(int64_t));
    dc->cstart = trex_arena_alloc(ar, (size_t)(ns + 1) * sizeof(int64_t));
    if (!dc->start || !dc->len || !dc->seg || !dc->tpos || !dc->cstart)
        return false;
    int64_t next = 0, nc = 0;
    dc->maxlen = 0;
    dc->maxnb = 0;
    for (int64_t s = 0; s < ns; s++) {
        const int64_t st = seq->seg_start[s], ln = seq->seg_len[s];
        /* segments tile the batch in order and never cross a row */
        TREX_ASSERT(st == next && ln >= 1 && st + ln <= N && st / seq->T == (st + ln - 1) / seq->T);
        dc->start[s] = st;
        dc->len[s] = ln;
        for (int64_t t = st; t < st + ln; t++) {
            dc->seg[t] = s;
            dc->tpos[t] = t - st;
            TREX_ASSERT(!seq->pos || seq->pos[t] == t - st);
        }
        const int64_t nb = m > 0 ? ln / m : 0;
        dc->cstart[s] = nc;
        nc += nb;
        dc->maxlen = ln > dc->maxlen ? ln : dc->maxlen;
        dc->maxnb = nb > dc->maxnb ? nb : dc->maxnb;
        next = st + ln;
    }
    TREX_ASSERT(next == N);
    dc->cstart[ns] = nc;
    dc->nc = nc;
    dc->cseg = trex_arena_alloc(ar, (size_t)(nc + 1) * sizeof(int64_t));
    dc->cpos = trex_arena_alloc(ar, (size_t)(nc + 1) * sizeof(int64_t));
    if (!dc->cseg || !dc->cpos)
        return false;
    for (int64_t s = 0; s < ns; s++) {
        for (int64_t e = dc->cstart[s]; e < dc->cstart[s + 1]; e++) {
            dc->cseg[e] = s;
            dc->cpos[e] = (e - dc->cstart[s]) * m;
        }
    }
    return true;
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* p = count + 1 elements of the layer's arena from alloc (zeroed or not), or on to oom: */
#define FALLOC_FROM(alloc, p, count)                                                      \
    do {                                                                                  \
        (p) = alloc(ar, (size_t)((count) + 1) * sizeof *(p));                             \
        if (!(p))                                                                         \
            goto oom;                                                                     \
    } while (0)
#define FALLOC(p, count) FALLOC_FROM(trex_arena_alloc, p, count)
/* As FALLOC, not zeroed: for blocks that are written whole before anything reads them (every block
 * allocated with it says which pass writes it). The arena's zeroing was a pass over about 300 MiB
 * per dsv4-bench layer at T = 4096, mostly q and o (128 MiB each). */
#define FALLOC_W(p, count) FALLOC_FROM(trex_arena_alloc_uninit, p, count)

struct trex_attn_core {
    int layer;
    int64_t N;
    bool sparse, kl, bf16;
    bool made;             /* written by a forward: the next one reads it */
    float *lse;            /* [N*H] */
    float *o;              /* [N, H*c] fp32 mode */
    uint16_t *ob;          /* [N, H*c] bf16 mode */
    float *ilse, *mass;    /* [N] (kl) */
    int32_t *sel, *nsel;   /* [N, topk] (zeroed: a query writes its first nsel), [N] (sparse) */
    float *u;              /* [N, G*dg]: wo_a's products of o (reserved cores only; the cache's u) */
    trex_indexer_loss il;  /* the forward's KL sum and count (kl) */
    size_t bytes;
};

/* Carves the core loop's outputs for dm's N tokens into k (not zeroed: the loop writes lse, o, and (kl)
 * ilse, mass, and (sparse) nsel of every query; sel is zeroed: a query writes only its first nsel). */
static bool core_carve(trex_arena *ar, const attn_dims *dm, bool sparse, bool kl, bool bf16,
                       trex_attn_core *k)
{
    const int64_t N = dm->N, nh = N * dm->H, nhc = nh * dm->c;
    memset(k, 0, sizeof *k);
    k->N = N;
    k->sparse = sparse;
    k->kl = kl;
    k->bf16 = bf16;
    k->lse = trex_arena_alloc_uninit(ar, (size_t)(nh + 1) * sizeof(float));
    if (bf16)
        k->ob = trex_arena_alloc_uninit(ar, (size_t)(nhc + 1) * sizeof(uint16_t));
    else
        k->o = trex_arena_alloc_uninit(ar, (size_t)(nhc + 1) * sizeof(float));
    if (!k->lse || !(k->ob || k->o))
        return false;
    if (kl) {
        k->ilse = trex_arena_alloc_uninit(ar, (size_t)(N + 1) * sizeof(float));
        k->mass = trex_arena_alloc_uninit(ar, (size_t)(N + 1) * sizeof(float));
        if (!k->ilse || !k->mass)
            return false;
    }
    if (sparse) {
        k->sel = trex_arena_alloc(ar, (size_t)(N * dm->topk + 1) * sizeof(int32_t));
        k->nsel = trex_arena_alloc_uninit(ar, (size_t)(N + 1) * sizeof(int32_t));
        if (!k->sel || !k->nsel)
            return false;
    }
    return true;
}

/* ---- the projections' products ------------------------------------------------------------------
 * y = x W^T and dx (+)= dy W of a projection W [out, in]: from the bf16 panels that bf16 training keeps
 * of W (trex_attn_w.wc, docs/params.md "bf16 compute copies") when there are any, else packing W per
 * call. The panels hold the bytes the packers make of W, so the bits are the same either way. */
static const trex_gemm_packed *w_panels(const trex_attn_w *w, trex_dtype dt, const float *W, bool bwd)
{
    return dt == TREX_BF16 && w->wc ? trex_wcopy_find_packed(w->wc, W, bwd) : NULL;
}

static void proj_forward(trex_pool *pool, trex_gemm_ws *ws, trex_dtype dt, const trex_attn_w *w, float *y,
                         const float *x, const float *W, int64_t n, int64_t in, int64_t out)
{
    const trex_gemm_packed *pf = w_panels(w, dt, W, false);
    if (pf)
        trex_gemm_prepacked(pool, ws, TREX_F32, false, n, 1.0f, x, in, pf, 0.0f, y, out);
    else
        trex_linear_forward_ex(pool, ws, dt, y, x, W, n, in, out);
}

/* dx (+)= dy W from W's backward panels, dy [n, out] of type dy_in (fp32, or bf16 already rounded);
 * false, doing nothing, when W has none. */
static bool proj_dx_panels(trex_pool *pool, trex_gemm_ws *ws, trex_dtype dt, const trex_attn_w *w,
                           trex_dtype dy_in, float *dx, const void *dy, const float *W, int64_t n, int64_t in,
                           int64_t out, bool acc)
{
    const trex_gemm_packed *pb = w_panels(w, dt, W, true);
    if (pb)
        trex_gemm_prepacked(pool, ws, dy_in, false, n, 1.0f, dy, out, pb, acc ? 1.0f : 0.0f, dx, in);
    return pb != NULL;
}

/* trex_linear_backward_ex (dx NULL: only dW), dx from the panels when there are any. */
static void proj_backward(trex_pool *pool, trex_gemm_ws *ws, trex_dtype dt, const trex_attn_w *w, float *dx,
                          float *dW, const float *dy, const float *x, const float *W, int64_t n, int64_t in,
                          int64_t out, bool acc, bool dw_acc)
{
    if (dx && proj_dx_panels(pool, ws, dt, w, TREX_F32, dx, dy, W, n, in, out, acc))
        dx = NULL;
    trex_linear_backward_ex(pool, ws, dt, dx, dW, dy, x, W, n, in, out, acc, dw_acc);
}

trex_attn_core *trex_attn_core_reserve(const trex_ctx *ctx, const trex_config *cfg, int layer, int64_t N,
                                       bool sparse, bool kl, trex_err *err)
{
    attn_dims dm;
    if (dims_init(&dm, cfg, layer, N, err) != TREX_OK)
        return NULL;
    trex_arena *ar = ctx->arena;
    const trex_arena_mark mk = trex_arena_mark_get(ar);
    const size_t before = trex_arena_used(ar);
    trex_attn_core *k = trex_arena_alloc(ar, sizeof *k);
    bool ok = k && core_carve(ar, &dm, dm.csa && sparse, dm.csa && kl, ctx->compute == TREX_BF16, k);
    /* and u, which the forward that takes the core reads instead of running wo_a's products again
     * (written whole by the forward that makes it) */
    if (ok)
        ok = (k->u = trex_arena_alloc_uninit(ar, (size_t)(N * dm.G * dm.dg + 1) * sizeof(float))) != NULL;
    if (!ok) {
        trex_arena_rewind(ar, mk);
        trex_err_set(err, TREX_ENOMEM,
                     "attention layer %d: out of memory keeping the attention core for %" PRId64
                     " tokens (%zu bytes in use)", layer, N, trex_arena_used(ar));
        return NULL;
    }
    k->layer = layer;
    k->bytes = trex_arena_used(ar) - before;
    return k;
}

size_t trex_attn_core_bytes(const trex_attn_core *core)
{
    return core ? core->bytes : 0;
}

trex_code trex_attn_forward(const trex_ctx *ctx, const trex_config *cfg, int layer,
                            const trex_seqinfo *seq, float *y, const float *x, const trex_attn_w *w,
                            bool sparse, trex_attn_cache **cache, trex_indexer_loss *il,
                            trex_err *err)
{
    return trex_attn_forward_core(ctx, cfg, layer, seq, y, x, w, sparse, cache, il, NULL, err);
}

trex_code trex_attn_forward_core(const trex_ctx *ctx, const trex_config *cfg, int layer,
                                 const trex_seqinfo *seq, float *y, const float *x, const trex_attn_w *w,
                                 bool sparse, trex_attn_cache **cache, trex_indexer_loss *il,
                                 trex_attn_core *core, trex_err *err)
{
    TREX_ASSERT(ctx && ctx->arena && cfg && seq && y && x && w);
    TREX_ASSERT(ctx->par.tp_size <= 1 && ctx->par.cp_size <= 1); /* no sharded attention yet */
    if (cache)
        *cache = NULL;
    if (il) {
        il->kl_sum = 0.0;
        il->count = 0;
    }
    trex_arena *ar = ctx->arena;
    trex_pool *pool = ctx->pool;
    trex_gemm_ws *gws = ctx->ws;  /* the large products: precision of the run */
    const trex_dtype gdt = ctx->compute;
    trex_attn_cache *C = trex_arena_alloc(ar, sizeof *C);
    if (!C)
        goto oom;
    attn_dims *dm = &C->dm;
    TREX_TRY(dims_init(dm, cfg, layer, seq->B * seq->T, err));
    TREX_ASSERT(w->wq_a && w->q_norm && w->wq_b && w->wkv && w->kv_norm && w->wo_a && w->wo_b &&
                w->attn_sink);
    TREX_ASSERT(dm->m == 0 || (w->cmp_wkv && w->cmp_wgate && w->cmp_ape && w->cmp_norm));
    TREX_ASSERT(!dm->csa || (w->idx_wq_b && w->idx_weights_proj && w->idx_cmp_wkv &&
                             w->idx_cmp_wgate && w->idx_cmp_ape && w->idx_cmp_norm));
    attn_docs *docs = &C->docs;
    if (!docs_init(docs, ar, seq, dm->m))
        goto oom;
    const int64_t N = dm->N, d = dm->d, H = dm->H, c = dm->c, hc = H * c, dc = dm->dc;
    C->sparse = dm->csa && sparse;
    C->kl = dm->csa && il != NULL;
    const bool run_indexer = C->sparse || C->kl;

    /* RoPE table up to the longest document */
    float *freq;
    FALLOC(freq, dm->half);
    trex_rope_layer_freqs(freq, cfg, (int)dm->m);
    FALLOC_W(C->rcos, docs->maxlen * dm->half); /* both written whole by trex_rope_table */
    FALLOC_W(C->rsin, docs->maxlen * dm->half);
    trex_rope_table(C->rcos, C->rsin, freq, dm->half, docs->maxlen);

    AP_START;
    /* query path */
    /* not zeroed: qa by its product (beta 0), qa_rstd and qr by the norm, q by its product, q_rstd by
     * qprep_rows */
    FALLOC_W(C->qa, N * dc);
    FALLOC_W(C->qa_rstd, N);
    FALLOC_W(C->qr, N * dc);
    proj_forward(pool, gws, gdt, w, C->qa, x, w->wq_a, N, d, dc);
    trex_rmsnorm_forward(pool, C->qr, C->qa_rstd, C->qa, w->q_norm, N, dc, dm->eps);
    FALLOC_W(C->q, N * hc);
    FALLOC_W(C->q_rstd, N * H);
    proj_forward(pool, gws, gdt, w, C->q, C->qr, w->wq_b, N, dc, hc);
    AP(AP_F_QPROJ); /* its per-head norm and RoPE run right before the core loop (qprep_rows) */

    /* window kv path */
    FALLOC_W(C->kva, N * c); /* written by the product, the norm */
    FALLOC_W(C->kv_rstd, N);
    FALLOC_W(C->kv, N * c);
    proj_forward(pool, gws, gdt, w, C->kva, x, w->wkv, N, d, c);
    trex_rmsnorm_forward(pool, C->kv, C->kv_rstd, C->kva, w->kv_norm, N, c, dm->eps);
    rope_apply(pool, C->kv, N, 1, c, dm, docs->tpos, C->rcos, C->rsin, false);
    AP(AP_F_KVPROJ);

    /* compressed entries */
    if (dm->m > 0 &&
        !compressor_forward(ctx, &C->cmp, dm, docs, dm->m, dm->wm, c, x, w->cmp_wkv, w->cmp_wgate,
                            w->cmp_ape, w->cmp_norm, C->rcos, C->rsin))
        goto oom;
    AP_SKIP;

    /* lightning indexer */
    if (run_indexer) {
        const int64_t nI = dm->nI, cI = dm->cI;
        FALLOC_W(C->iq, N * nI * cI); /* written by the products */
        FALLOC_W(C->hw, N * nI);
        proj_forward(pool, gws, gdt, w, C->iq, C->qr, w->idx_wq_b, N, dc, nI * cI);
        rope_apply(pool, C->iq, N, nI, cI, dm, docs->tpos, C->rcos, C->rsin, false);
        proj_forward(pool, gws, gdt, w, C->hw, x, w->idx_weights_proj, N, d, nI);
        for (int64_t i = 0; i < N * nI; i++)
            C->hw[i] *= dm->hscale;
        AP(AP_F_IDXPROJ);
        if (!compressor_forward(ctx, &C->icmp, dm, docs, 4, 2, cI, x, w->idx_cmp_wkv,
                                w->idx_cmp_wgate, w->idx_cmp_ape, w->idx_cmp_norm, C->rcos,
                                C->rsin))
            goto oom;
        /* bf16 mode: the indexer scores take bf16 keys (docs/precision.md), rounded once here */
        if (gdt == TREX_BF16 && trex_fused()->dots_bf16) {
            const int64_t nk = (docs->nc + 16) * cI;
            C->ikb = trex_arena_alloc_uninit(ar, (size_t)nk * sizeof(uint16_t));
            if (!C->ikb)
                goto oom;
            cvt_rows_pool(pool, C->ikb, C->icmp.out, docs->nc, cI, false);
            memset(C->ikb + docs->nc * cI, 0, (size_t)(16 * cI) * sizeof(uint16_t));
            /* the per-thread scratch holds dots_bf16's workspace only beside the bf16 core (qscr_layout,
             * kscr_layout): every table has both or neither */
            TREX_ASSERT(trex_fused()->sattn_fwd_bf16 && trex_fused()->sattn_bwd_entries_bf16);
            C->dots_bf16 = trex_fused()->dots_bf16;
        }
    }

    AP_SKIP;
    /* core attention, query by query: its outputs in a core of this call's or the caller's */
    const bool reuse = core && core->made; /* the core's results are there: no core loop */
    trex_attn_core own;
    if (core)
        TREX_ASSERT(core->layer == layer && core->N == N && core->sparse == C->sparse &&
                    core->kl == C->kl && core->bf16 == (gdt == TREX_BF16));
    else if (!core_carve(ar, dm, C->sparse, C->kl, gdt == TREX_BF16, &own))
        goto oom;
    const trex_attn_core *kc = core ? core : &own;
    C->lse = kc->lse;
    C->o = kc->o;
    C->ob = kc->ob;
    C->ilse = kc->ilse;
    C->mass = kc->mass;
    C->sel = kc->sel;
    C->nsel = kc->nsel;
    double *kl_t = NULL;
    if (C->kl && !reuse)
        FALLOC_W(kl_t, N);
    qtask qa = {0};
    qa.dm = dm;
    qa.docs = docs;
    qa.c = C;
    qa.fk = trex_fused();
    /* bf16 mode: the attention core on bf16 operands where the level has it (kernels/fused.h,
     * docs/precision.md); otherwise the fp32 core */
    const bool core_bf16 = gdt == TREX_BF16 && qa.fk->sattn_fwd_bf16;
    qa.sattn_fwd = qa.fk->sattn_fwd;
    qa.sattn_fwd_bf16 = core_bf16 ? qa.fk->sattn_fwd_bf16 : NULL;
    qa.sattn_fwd_block_bf16 = core_bf16 && !dm->csa ? qa.fk->sattn_fwd_block_bf16 : NULL;
    if (core_bf16) { /* the entries rounded once (see kvb), written whole: not zeroed first */
        C->kvb = trex_arena_alloc_uninit(ar, (size_t)(N * c) * sizeof *C->kvb);
        if (!C->kvb)
            goto oom;
        cvt_rows_pool(pool, C->kvb, C->kv, N, c, false);
        if (c % 32 == 0) { /* the window's pair rows: 4 MiB at N 4096, c 512 */
            const int64_t npair = N / 2 + 17;
            C->kvp = trex_arena_alloc_uninit(ar, (size_t)(npair * 2 * c) * sizeof *C->kvp);
            if (!C->kvp)
                goto oom;
            pairs_task pt = {C->kvp, C->kvb, N, c};
            trex_pool_for(pool, npair, 64, pairs_rows, &pt);
        }
        if (dm->m > 0 && docs->nc > 0) {
            C->cmpb = trex_arena_alloc_uninit(ar, (size_t)(docs->nc * c) * sizeof *C->cmpb);
            if (!C->cmpb)
                goto oom;
            cvt_rows_pool(pool, C->cmpb, C->cmp.out, docs->nc, c, false);
        }
    }
    qa.sink = w->attn_sink;
    qa.select = C->sparse;
    qa.kl = C->kl;
    qa.lse = C->lse;
    qa.o = C->o;
    qa.ob = C->ob;
    qa.ilse = C->ilse;
    qa.mass = C->mass;
    qa.sel = C->sel;
    qa.nsel = C->nsel;
    qa.kl_t = kl_t;
    qa.nqb = (N + QBLOCK - 1) / QBLOCK;
    qa.L = qscr_layout(dm, docs, C->sparse, core_bf16);
    qa.stride = qa.L.total;
    const int64_t G = dm->G, dg = dm->dg, gin = (H / G) * c;
    if (core)
        C->u = core->u; /* made below, or (reuse) taken */
    else
        FALLOC_W(C->u, N * G * dg); /* written whole by the G products (beta 0) */
    /* the bf16 copy of q (written whole by qprep_rows): in the cache when there is one (the backward
     * reads it), else scratch like the threads' scratch, from here to the end of the core loop */
    uint16_t *qb = NULL;
    if (core_bf16 && cache) {
        qb = C->qb = trex_arena_alloc_uninit(ar, (size_t)(N * hc) * sizeof *qb);
        if (!qb)
            goto oom;
    }
    const trex_arena_mark core_mark = trex_arena_mark_get(ar);
    if (core_bf16 && !qb) {
        qb = trex_arena_alloc_uninit(ar, (size_t)(N * hc) * sizeof *qb);
        if (!qb)
            goto oom;
    }
    AP(AP_F_CORE);
    /* q's per-head norm and RoPE, and its bf16 copy, in one pass */
    qprep_task qp = {C->q, C->q_rstd, qb, dm, docs->tpos, C->rcos, C->rsin};
    trex_pool_for(pool, N, QPREP_TOKENS, qprep_rows, &qp);
    AP(AP_F_QPREP);
    qa.qb = qb;
    if (!reuse) {
        FALLOC(qa.scr, qa.stride * (size_t)nthreads(ctx));
        trex_pool_for(pool, qa.nqb, 1, qfwd_items, &qa);
    }
    trex_arena_rewind(ar, core_mark);
    AP(AP_F_CORE);

    /* grouped low-rank output projection (u from a made core: its products ran in the forward that
     * made it, on the same o) */
    for (int64_t gi = 0; gi < G && !reuse; gi++) {
        if (C->ob) {
            const trex_gemm_problem pa = {N, dg, gin, C->ob + gi * gin, hc, w->wo_a + gi * dg * gin, gin,
                                          C->u + gi * dg, G * dg, NULL, 0};
            trex_gemm_grouped_mixed(pool, gws, TREX_BF16, TREX_F32, false, true, 1.0f, 0.0f, &pa, 1);
        } else {
            trex_gemm_ex(pool, gws, gdt, false, true, N, dg, gin, 1.0f, C->o + gi * gin, hc,
                         w->wo_a + gi * dg * gin, gin, 0.0f, C->u + gi * dg, G * dg);
        }
    }
    proj_forward(pool, gws, gdt, w, y, C->u, w->wo_b, N, G * dg, d);
    AP(AP_F_OUT);

    if (C->kl) {
        trex_indexer_loss sum = {0.0, 0};
        if (reuse) {
            sum = core->il;
        } else {
            /* queries ascending: a fixed order whatever the thread count */
            for (int64_t t = 0; t < N; t++) {
                sum.kl_sum += kl_t[t];
                if (docs->tpos[t] + 1 >= 4)
                    sum.count++;
            }
        }
        if (il)
            *il = sum;
        if (core)
            core->il = sum;
    }
    if (core)
        core->made = true;
    if (cache)
        *cache = C;
    return TREX_OK;
oom:
    return trex_err_set(err, TREX_ENOMEM, "attention layer %d: out of memory in the activation "
                        "arena (%zu bytes in use); shorten the sequence or add memory",
                        layer, trex_arena_used(ar));
}

/* ---- backward --------------------------------------------------------------------------------- */

#define XALLOC(count) trex_arena_xalloc(ctx->arena, (size_t)((count) + 1) * sizeof(float))

void trex_attn_backward(const trex_ctx *ctx, const trex_config *cfg, int layer,
                        const trex_seqinfo *seq, float *dx, const float *dy, const float *x,
                        const trex_attn_w *w, trex_attn_w *g, const trex_attn_cache *cache,
                        double il_scale)
{
    TREX_ASSERT(ctx && ctx->arena && cfg && seq && dx && dy && x && w && g && cache);
    const trex_attn_cache *C = cache;
    const attn_dims *dm = &C->dm;
    const attn_docs *docs = &C->docs;
    TREX_ASSERT(dm->N == seq->B * seq->T && dm->m == trex_config_ratio(cfg, layer));
    TREX_ASSERT(il_scale == 0.0 || C->kl || !dm->csa); /* KL gradient: needs the forward's KL terms */
    trex_pool *pool = ctx->pool;
    trex_gemm_ws *gws = ctx->ws;  /* the large products: precision of the run */
    const trex_dtype gdt = ctx->compute;
    const int64_t N = dm->N, d = dm->d, H = dm->H, c = dm->c, hc = H * c, dc = dm->dc;
    const int64_t G = dm->G, dg = dm->dg, gin = (H / G) * c;
    const bool kl = C->kl && il_scale != 0.0;
    /* each weight gradient below is one product's (or one per group): with ctx->grads_zero it writes
     * the gradient instead of adding to the zeros it holds (a streamed C, nothing read back) */
    const bool dw_acc = !ctx->grads_zero;
    const float dw_beta = dw_acc ? 1.0f : 0.0f;
    /* Everything this call carves from the arena is scratch: give it back on the way out. */
    const trex_arena_mark scratch = trex_arena_mark_get(ctx->arena);

    AP_START;
    /* output projections */
    float *du = xalloc_uninit(ctx->arena, (size_t)(N * G * dg) * sizeof(float)); /* acc false below */
    proj_backward(pool, gws, gdt, w, du, g->wo_b, dy, C->u, w->wo_b, N, G * dg, d, false, dw_acc);
    float *gO = xalloc_uninit(ctx->arena, (size_t)(N * hc) * sizeof(float)); /* beta 0 below */
    for (int64_t gi = 0; gi < G; gi++) {
        trex_gemm_ex(pool, gws, gdt, false, false, N, gin, dg, 1.0f, du + gi * dg, G * dg,
                     w->wo_a + gi * dg * gin, gin, 0.0f, gO + gi * gin, hc);
        if (C->ob) {
            const trex_gemm_problem pw = {dg, gin, N, du + gi * dg, G * dg, C->ob + gi * gin, hc,
                                          g->wo_a + gi * dg * gin, gin, NULL, 0};
            trex_gemm_grouped_mixed(pool, gws, TREX_F32, TREX_BF16, true, false, 1.0f, dw_beta, &pw, 1);
        } else {
            trex_gemm_ex(pool, gws, gdt, true, false, dg, gin, N, 1.0f, du + gi * dg, G * dg,
                         C->o + gi * gin, hc, dw_beta, g->wo_a + gi * dg * gin, gin);
        }
    }
    AP(AP_B_OUT);
    /* D = g.o is rotation-invariant: take it in the output frame, then rotate g back to the frame
     * of the attention output before its inverse RoPE (the backward of R^-1 is R). */
    /* bf16 mode: the attention core reads g rounded once here (gb in the pass over gO) and q's bf16
     * copy from the forward (C->qb) */
    const bool core_bf16 = gdt == TREX_BF16 && trex_fused()->sattn_bwd_query_bf16; /* as the forward */
    uint16_t *qb = NULL, *gb = NULL, *dqb = NULL;
    float *grow = NULL;
    if (core_bf16)
        gb = xalloc_uninit(ctx->arena, (size_t)(N * hc) * sizeof *gb);
    if (core_bf16 || C->ob)
        grow = xalloc_uninit(ctx->arena, (size_t)(nthreads(ctx) * hc) * sizeof *grow);
    float *D = xalloc_uninit(ctx->arena, (size_t)(N * H) * sizeof(float)); /* gprep_rows writes it */
    gprep_task gp = {D, gO, gb, grow, C->o, C->ob, dm, docs->tpos, C->rcos, C->rsin, trex_fused()->dot};
    trex_pool_for(pool, N, 1, gprep_rows, &gp);
    if (core_bf16) {
        /* the core reads gb, never the fp32 gO again: its block (N H c floats) holds q's bf16 copy
         * when the forward did not keep one (first half) and dq's bf16 rounding (second half) */
        qb = C->qb;
        if (!qb) {
            qb = (uint16_t *)gO;
            cvt_rows_pool(pool, qb, C->q, N, hc, true);
        }
        dqb = (uint16_t *)gO + N * hc;
    }
    AP(AP_B_GPREP);

    /* query side: dq (written whole by the core; bf16 mode: dqb, see qtask), d sink, indexer
     * query-side gradients */
    float *dq = dqb ? NULL : xalloc_uninit(ctx->arena, (size_t)(N * hc) * sizeof(float));
    qnorm_task qn = {dq, C->q, C->q_rstd, dm, docs->tpos, C->rcos, C->rsin, NULL};
    float *dsink_t = xalloc_uninit(ctx->arena, (size_t)(N * H) * sizeof(float)); /* every query */
    float *diq = NULL, *dhw = NULL;
    if (kl) {
        diq = XALLOC(N * dm->nI * dm->cI);
        dhw = XALLOC(N * dm->nI);
    }
    qtask qa = {0};
    qa.dm = dm;
    qa.docs = docs;
    qa.c = C;
    qa.fk = trex_fused();
    qa.qb = qb;
    qa.gb = gb;
    qa.sattn_bwd_query = qa.fk->sattn_bwd_query;
    qa.sattn_bwd_query_bf16 = core_bf16 ? qa.fk->sattn_bwd_query_bf16 : NULL;
    qa.sattn_bwd_query_block_bf16 = core_bf16 && !dm->csa && gb && qb && C->kvb
                                         ? qa.fk->sattn_bwd_query_block_bf16
                                         : NULL;
    qa.sink = w->attn_sink;
    qa.kl = kl;
    qa.gO = gO;
    qa.D = D;
    qa.dq = dq;
    qa.qn = &qn;
    qa.dqb = dqb;
    qa.dsink_t = dsink_t;
    qa.diq = diq;
    qa.dhw = dhw;
    qa.il_scale = (float)il_scale;
    qa.nqb = (N + QBLOCK - 1) / QBLOCK;
    qa.L = qscr_layout(dm, docs, C->sparse, core_bf16);
    qa.stride = qa.L.total;
    qa.scr = trex_arena_xalloc(ctx->arena, qa.stride * (size_t)nthreads(ctx));
    /* bf16 mode: the key side inside the query side, by QKCH chunks of consecutive query blocks
     * (chunk_bounds; results independent of the thread count). The window rows go straight into
     * dkv from a chunk's first query on and into its spill rows before (QKCH (nwin - 1) c floats,
     * 2 MiB at dsv4-bench's shapes), added in chunk order after the loop; the compressed rows into
     * dC (chunk 0) or the chunk's own copy (QKCH - 1 copies, added in chunk order: CSA at N = 4096
     * 7 x 2 MiB, and 7 x 0.5 MiB for dK^I; HCA 7 x 64 KiB). All scratch until the end of this call.
     *   CSA (qkeys): per query the query side and the compressed key side (qbwd_chunks), the
     *   window's key side per block of queries from the operands they wrote;
     *   SWA and HCA (kblocks): per block the query side and the whole key side (qbwd_kchunks). */
    float *dC = NULL, *dik = NULL, *dkv = NULL;
    const bool qkeys = core_bf16 && dm->csa && docs->nc > 0 && qb && gb && C->kvb && C->cmpb &&
                       qa.fk->sattn_bwd_query_keys_bf16 && qa.fk->sattn_key_product_bf16;
    const bool kblocks = !qkeys && core_bf16 && !dm->csa && qb && gb && C->kvb &&
                         (dm->m == 0 || C->cmpb) && qa.fk->sattn_bwd_query_block_keys_bf16 &&
                         qa.fk->sattn_bwd_window_bf16 && qa.sattn_bwd_query_block_bf16;
    if (qkeys || kblocks) {
        const int64_t nc = docs->nc;
        dkv = XALLOC(N * c);
        qa.dkv = dkv;
        qa.spill = XALLOC(QKCH * (dm->nwin - 1) * c);
        if (dm->m > 0 && nc > 0) {
            dC = XALLOC(nc * c);
            qa.dC = dC;
            qa.dCp = XALLOC((QKCH - 1) * nc * c);
        }
        if (qkeys && kl) {
            dik = XALLOC(nc * dm->cI);
            qa.dik = dik;
            qa.dikp = XALLOC((QKCH - 1) * nc * dm->cI);
        }
        chunk_bounds(&qa);
        if (qkeys) {
            qa.sattn_bwd_query_keys_bf16 = qa.fk->sattn_bwd_query_keys_bf16;
            trex_pool_for(pool, QKCH, 1, qbwd_chunks, &qa);
        } else {
            qa.sattn_bwd_query_block_keys_bf16 = qa.fk->sattn_bwd_query_block_keys_bf16;
            qa.sattn_bwd_window_bf16 = qa.fk->sattn_bwd_window_bf16;
            trex_pool_for(pool, QKCH, 1, qbwd_kchunks, &qa);
        }
        for (int64_t j = 1; j < QKCH; j++) { /* each chunk's spill rows, chunks in order */
            const int64_t own = qa.bstart[j] * QBLOCK, lo = own - (dm->nwin - 1);
            for (int64_t r = lo > 0 ? lo : 0; r < own && r < N; r++) {
                const float *sp = qa.spill + (j * (dm->nwin - 1) + (r - lo)) * c;
                for (int64_t i = 0; i < c; i++)
                    dkv[r * c + i] += sp[i];
            }
        }
        if (dC) {
            qk_reduce_task rt = {dC, qa.dCp, nc, c};
            trex_pool_for(pool, nc, 1, qk_reduce_rows, &rt);
        }
        if (dik) {
            qk_reduce_task ri = {dik, qa.dikp, nc, dm->cI};
            trex_pool_for(pool, nc, 1, qk_reduce_rows, &ri);
        }
    } else {
        trex_pool_for(pool, qa.nqb, 1, qbwd_items, &qa);
    }
    for (int64_t h = 0; h < H; h++) {
        double s = 0.0;
        for (int64_t t = 0; t < N; t++)
            s += dsink_t[t * H + h];
        g->attn_sink[h] += (float)s;
    }
    AP(AP_B_QSIDE);

    /* key side: window kv, compressed entries, indexer keys */
    if (!dkv)
        dkv = XALLOC(N * c);
    ktask ka = {0};
    ka.dm = dm;
    ka.docs = docs;
    ka.c = C;
    ka.fk = trex_fused();
    ka.sattn_bwd_entries = ka.fk->sattn_bwd_entries;
    ka.sattn_bwd_entries_bf16 = core_bf16 ? ka.fk->sattn_bwd_entries_bf16 : NULL;
    ka.sattn_bwd_window_bf16 = core_bf16 && qb && gb && C->kvb ? ka.fk->sattn_bwd_window_bf16 : NULL;
    ka.bf16 = core_bf16;
    ka.gO = gO;
    ka.qb = qb;
    ka.gb = gb;
    ka.D = D;
    ka.dkv = dkv;
    ka.kl = kl;
    ka.il_scale = (float)il_scale;
    ka.kmax = kscr_max(dm, docs, C->sparse);
    ka.stride = kscr_layout(dm, ka.kmax, docs->nc, core_bf16).total;
    ka.scr = trex_arena_xalloc(ctx->arena, ka.stride * (size_t)nthreads(ctx));
    for (int64_t i = 0; i < nthreads(ctx); i++) /* the run marks start clear */
        memset(ka.scr + (size_t)i * ka.stride + kscr_layout(dm, ka.kmax, docs->nc, core_bf16).mine,
               0, (size_t)docs->nc + 1);
    if (!kblocks && !qkeys)
        trex_pool_for(pool, (N + KTILE - 1) / KTILE, 1, kwin_items, &ka);
    AP(AP_B_KWIN);
    if (dm->m > 0 && docs->nc > 0 && !qkeys && !kblocks) {
        dC = XALLOC(docs->nc * c);
        if (kl)
            dik = XALLOC(docs->nc * dm->cI);
        int64_t nt = 0;
        for (int64_t s = 0; s < docs->nseg; s++)
            nt += (docs->cstart[s + 1] - docs->cstart[s] + KCTILE - 1) / KCTILE;
        int64_t *tiles = trex_arena_xalloc(ctx->arena, (size_t)(3 * nt) * sizeof(int64_t));
        int64_t k = 0;
        for (int64_t s = 0; s < docs->nseg; s++) {
            const int64_t nb = docs->cstart[s + 1] - docs->cstart[s];
            for (int64_t i0 = 0; i0 < nb; i0 += KCTILE) {
                tiles[3 * k] = s;
                tiles[3 * k + 1] = i0;
                tiles[3 * k + 2] = i0 + KCTILE < nb ? i0 + KCTILE : nb;
                k++;
            }
        }
        ka.dC = dC;
        ka.dik = dik;
        ka.tiles = tiles;
        ka.ntiles = nt;
        const int64_t parts = nthreads(ctx);
        int64_t *bounds = trex_arena_xalloc(ctx->arena, (size_t)(parts + 1) * sizeof *bounds);
        int64_t *cnt = trex_arena_xalloc(ctx->arena, (size_t)docs->nc * sizeof *cnt);
        kcmp_bounds(bounds, parts, tiles, nt, dm, docs, C, cnt);
        ka.bounds = bounds;
        trex_pool_for(pool, parts, 1, kcmp_items, &ka);
    }
    AP(AP_B_KCMP);

    /* q path: per-head RMS and RoPE, wq_b, q_norm, wq_a (dx is written here) */
    /* bf16 mode: done by the query side, which wrote the result rounded to bf16 (dqb: its two
     * products pack 2-byte rows, the same bits as rounding while packing) */
    if (!dqb)
        trex_pool_for(pool, N, (4096 / (hc > 0 ? hc : 1)) + 1, qnorm_rows, &qn);
    /* written whole: dqr by its product (beta 0), dqa by the norm's backward (acc false) */
    float *dqr = xalloc_uninit(ctx->arena, (size_t)(N * dc) * sizeof(float));
    float *dqa = xalloc_uninit(ctx->arena, (size_t)(N * dc) * sizeof(float));
    if (dqb) {
        TREX_ASSERT(gdt == TREX_BF16);
        if (!proj_dx_panels(pool, gws, gdt, w, TREX_BF16, dqr, dqb, w->wq_b, N, dc, hc, false)) {
            const trex_gemm_problem px = {N, dc, hc, dqb, hc, w->wq_b, dc, dqr, dc, NULL, 0};
            trex_gemm_grouped_mixed(pool, gws, TREX_BF16, TREX_F32, false, false, 1.0f, 0.0f, &px, 1);
        }
        const trex_gemm_problem pw = {hc, dc, N, dqb, hc, C->qr, dc, g->wq_b, dc, NULL, 0};
        trex_gemm_grouped_mixed(pool, gws, TREX_BF16, TREX_F32, true, false, 1.0f, dw_beta, &pw, 1);
    } else {
        proj_backward(pool, gws, gdt, w, dqr, g->wq_b, dq, C->qr, w->wq_b, N, dc, hc, false, dw_acc);
    }
    trex_rmsnorm_backward(pool, dqa, g->q_norm, dqr, C->qa, w->q_norm, C->qa_rstd, N, dc, false);
    proj_backward(pool, gws, gdt, w, dx, g->wq_a, dqa, x, w->wq_a, N, d, dc, false, dw_acc);
    AP(AP_B_QPATH);

    /* kv path */
    rope_apply(pool, dkv, N, 1, c, dm, docs->tpos, C->rcos, C->rsin, true);
    float *dkva = xalloc_uninit(ctx->arena, (size_t)(N * c) * sizeof(float)); /* acc false below */
    trex_rmsnorm_backward(pool, dkva, g->kv_norm, dkv, C->kva, w->kv_norm, C->kv_rstd, N, c, false);
    proj_backward(pool, gws, gdt, w, dx, g->wkv, dkva, x, w->wkv, N, d, c, true, dw_acc);
    AP(AP_B_KVPATH);

    /* compressor */
    if (dC)
        compressor_backward(ctx, &C->cmp, dm, docs, dm->m, dm->wm, dC, dx, x, w->cmp_wkv,
                            w->cmp_wgate, w->cmp_norm, g->cmp_wkv, g->cmp_wgate, g->cmp_ape,
                            g->cmp_norm, C->rcos, C->rsin);
    AP_SKIP;

    /* indexer (KL only; its inputs x and qr are detached) */
    if (kl) {
        const int64_t nI = dm->nI, cI = dm->cI;
        rope_apply(pool, diq, N, nI, cI, dm, docs->tpos, C->rcos, C->rsin, true);
        proj_backward(pool, gws, gdt, w, NULL, g->idx_wq_b, diq, C->qr, w->idx_wq_b, N, dc, nI * cI, false,
                      dw_acc);
        for (int64_t i = 0; i < N * nI; i++)
            dhw[i] *= dm->hscale;
        proj_backward(pool, gws, gdt, w, NULL, g->idx_weights_proj, dhw, x, w->idx_weights_proj, N, d, nI,
                      false, dw_acc);
        AP(AP_B_IDX);
        if (dik)
            compressor_backward(ctx, &C->icmp, dm, docs, 4, 2, dik, NULL, x, w->idx_cmp_wkv,
                                w->idx_cmp_wgate, w->idx_cmp_norm, g->idx_cmp_wkv,
                                g->idx_cmp_wgate, g->idx_cmp_ape, g->idx_cmp_norm, C->rcos,
                                C->rsin);
    }
    trex_arena_rewind(ctx->arena, scratch);
}
