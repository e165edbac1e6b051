/* src/plan/engine.c — the local fp32 reference engine (`trex model run`, `trex train` in one process):
 * memory and time of one forward + backward pass, from a replay of what the engine allocates and
 * computes.
 *
 * The replay walks the same sequence as src/model/model.c, attention.c, moe.c and mhc.c for a batch of
 * B rows of T tokens (one document per row, no doc_ids): every activation-arena request (its size,
 * rounded to 64 bytes as trex_arena_alloc does), the arena marks and rewinds (each sub-layer's backward
 * gives its scratch back; the recompute policies give back whole blocks (full) or sub-layer caches
 * (attention, moe)), and the arena's chunking (64 MiB chunks, a request that
 * does not fit the current chunk opens a new one and leaves the tail untouched). So it predicts what
 * `trex model run` prints: the arena's bytes in use after the backward, the bytes it reserved (the
 * "acts" region's peak), and also the highest bytes in use and the pages touched (what peak RSS sees).
 * Parameters and gradients are trex_layout_build's n_float / n_int (the runtime allocates exactly
 * that); optimizer state is trex_optimizer_state_bytes.
 *
 * The same walk lists every kernel call: each GEMM with its shape (trex_gemm's M, N, K and transposes),
 * the attention core's work per (query, entry, head), the indexer scores, exp() calls of the
 * softmaxes and the cross-entropy, the mHC per-token work and the element-wise passes. Times come from
 * rates measured on the machine (cluster field "fp32_ref", bench/plan_local.sh): GEMMs by a model of
 * the reference kernel's blocking (src/kernels/ref/gemm.c: 64-column panels over the threads, 4x8
 * micro-tiles, A re-packed per panel), the rest by measured per-unit costs. docs/planner.md
 * ("The local fp32 engine") documents the rules and the measurements.
 *
 * This mirrors code owned elsewhere: tests/test_plan_local.sh runs the engine and compares, so a
 * change in the engine's allocation that the replay does not follow fails a test. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trex/optim.h"
#include "trex/params.h"
#include "trex/plan.h"

#define ALIGN 64
#define ARENA_CHUNK ((size_t)64 << 20) /* trex_model_create's arena chunk */
#define HEAD_CHUNK_FLOATS ((int64_t)16 << 20)
#define MOE_CHUNK 1024
#define QBLOCK 4
#define KTILE 16
#define PAGE 4096
/* sizeof(struct trex_attn_cache) and sizeof(struct trex_moe_cache) on LP64, counted from their
 * definitions; both round up to whole 64-byte blocks, so a few bytes off change nothing. */
#define ATTN_CACHE_BYTES 496
#define ATTN_CORE_BYTES 112 /* struct trex_attn_core */
#define MOE_CACHE_BYTES 144

static size_t r64(size_t b)
{
    return (b + ALIGN - 1) / ALIGN * ALIGN;
}

/* ---- a replay of trex_arena (src/core/alloc.c) ---------------------------------------------------- */

typedef struct sim_chunk {
    size_t size, used, dirty;
} sim_chunk;

typedef struct sim_arena {
    sim_chunk *c;
    int64_t n, cap, cur; /* cur = -1: no chunk yet */
    size_t used, reserved, peak_used, peak_reserved;
    size_t touched_new;  /* bytes first touched (page faults) since the last read */
    bool oom;
} sim_arena;

typedef struct sim_mark {
    int64_t chunk;
    size_t chunk_used, used;
} sim_mark;

static void ar_alloc(sim_arena *a, size_t bytes)
{
    size_t need = r64(bytes);
    if (need == 0)
        need = ALIGN;
    while (a->cur >= 0) {
        sim_chunk *c = &a->c[a->cur];
        if (need <= c->size - c->used) {
            c->used += need;
            if (c->used > c->dirty) {
                a->touched_new += c->used - c->dirty;
                c->dirty = c->used;
            }
            a->used += need;
            if (a->used > a->peak_used)
                a->peak_used = a->used;
            return;
        }
        if (a->cur + 1 >= a->n)
            break;
        a->cur++;
    }
    if (a->n == a->cap) {
        int64_t cap = a->cap ? 2 * a->cap : 64;
        sim_chunk *c = realloc(a->c, (size_t)cap * sizeof *c);
        if (!c) {
            a->oom = true;
            return;
        }
        a->c = c, a->cap = cap;
    }
    sim_chunk *c = &a->c[a->n];
    const size_t grow = a->reserved > ARENA_CHUNK ? a->reserved : ARENA_CHUNK; /* as core/alloc.c */
    c->size = need > grow ? need : grow;
    c->used = need;
    c->dirty = need;
    a->touched_new += need;
    a->cur = a->n++;
    a->reserved += c->size;
    if (a->reserved > a->peak_reserved)
        a->peak_reserved = a->reserved;
    a->used += need;
    if (a->used > a->peak_used)
        a->peak_used = a->used;
}

static sim_mark ar_mark(const sim_arena *a)
{
    sim_mark m = {a->cur, a->cur >= 0 ? a->c[a->cur].used : 0, a->used};
    return m;
}

static void ar_rewind(sim_arena *a, sim_mark m)
{
    if (a->n == 0)
        return;
    int64_t c = m.chunk >= 0 ? m.chunk : 0;
    a->c[c].used = m.chunk >= 0 ? m.chunk_used : 0;
    for (int64_t i = c + 1; i < a->n; i++)
        a->c[i].used = 0;
    a->cur = c;
    a->used = m.used;
}

static void ar_reset(sim_arena *a)
{
    a->used = 0; /* the chunks stay (core/alloc.c): the next pass starts again at the first */
    for (int64_t i = 0; i < a->n; i++)
        a->c[i].used = 0;
    a->cur = a->n ? 0 : -1;
}

/* bytes of touched pages of every chunk */
static size_t ar_resident(const sim_arena *a)
{
    size_t s = 0;
    for (int64_t i = 0; i < a->n; i++)
        s += (a->c[i].dirty + PAGE - 1) / PAGE * PAGE;
    return s;
}

/* ---- the walk ------------------------------------------------------------------------------------ */

typedef struct sim {
    const trex_config *cfg;
    const trex_plan_fp32_run *run;
    const trex_plan_fp32_rates *rt; /* NULL: no times */
    sim_arena ar;
    int phase;                      /* 0 forward, 1 backward */
    trex_plan_fp32_result *out;
    int64_t L, nblocks, d, n, nd, V;
    bool mtp;
} sim;

static int64_t imin(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* pool chunks of trex_pool_for (src/core/pool.c): 1 when n <= grain, else min(threads, n / grain) */
static int64_t pool_chunks(int64_t threads, int64_t n, int64_t grain)
{
    if (threads <= 1 || n <= grain)
        return 1;
    return imin(threads, n / grain);
}

/* Wall-clock speed of c threads at once relative to one thread's CPU-time speed: serial_share for one
 * (other jobs take turns on the core), the measured speedup for all `threads`, linear between. */
static double par_speedup(const trex_plan_fp32_rates *r, int64_t c)
{
    if (c <= 1 || r->threads <= 1)
        return r->serial_share;
    double f = ((double)c - 1.0) / (r->threads - 1.0);
    return r->serial_share + (r->speedup - r->serial_share) * (f > 1 ? 1 : f);
}

/* CPU time of the busiest thread of trex_gemm(M, N, K) (src/kernels/ref/gemm.c), and in *chunks_out
 * the number of threads it runs on:
 *   - M*N*K < 32768: an unpacked triple loop on the calling thread (direct_gflops);
 *   - else column panels of gemm_nc are shared over the threads (a thread gets at least ~1M
 *     multiply-adds); in each panel op(B) is packed once, then for every gemm_mr rows op(A) is packed
 *     and gemm_nc / gemm_nr micro-tiles run over K. Per thread: the micro-tiles (padded to whole
 *     tiles) at gemm_gflops, or gemm_gflops_long when a tile's A and B slices leave L1 (K > gemm_k_l1),
 *     gemm_gflops_l3 when the packed [K][gemm_nc] B panel leaves L2, gemm_gflops_mem when it leaves
 *     the core's share of L3; packing A once per panel (per element; transposed or not, A within L2 or
 *     not); packing B (per element, transposed or not); a cost per element of C (tile set-up and
 *     update) and per call.
 * bench/plan_local.sh fits these constants to timings of trex_gemm. */
static double gemm_cpu(const trex_plan_fp32_rates *r, int64_t threads, bool ta, bool tb, int64_t M,
                       int64_t N, int64_t K, int64_t *chunks_out)
{
    *chunks_out = 1;
    if (M <= 0 || N <= 0)
        return 0;
    double Kd = (double)(K > 0 ? K : 1);
    if (M * N * (K > 0 ? K : 1) < 32768)
        return r->call_us * 1e-6 + 2.0 * (double)M * (double)N * Kd / (r->direct_gflops * 1e9);
    const int64_t MR = (int64_t)r->gemm_mr, NR = (int64_t)r->gemm_nr, NC = (int64_t)r->gemm_nc;
    int64_t panels = ceil_div(N, NC);
    int64_t per = M * NC * (K > 0 ? K : 1);
    int64_t chunks = pool_chunks(threads, panels, per >= (1 << 20) ? 1 : (1 << 20) / per);
    /* columns of the busiest thread (the first chunks are one panel longer), NR per micro-tile; the
     * last panel may be partial */
    int64_t mine = ceil_div(panels, chunks);
    double cols = (double)(mine * NC);
    if (mine == panels)
        cols = (double)((panels - 1) * NC + ceil_div(N - (panels - 1) * NC, NR) * NR);
    double rows = (double)(ceil_div(M, MR) * MR), l2 = r->l2_kib * 1024.0, l3 = r->l3_kib * 1024.0;
    double bpanel = Kd * (double)NC * 4.0;
    double uk = bpanel > l3  ? r->gemm_gflops_mem
                : bpanel > l2 ? r->gemm_gflops_l3
                : Kd > r->gemm_k_l1 ? r->gemm_gflops_long
                                    : r->gemm_gflops;
    double t = 2.0 * rows * cols * Kd / (uk * 1e9);
    bool big = (double)M * Kd * 4.0 > l2;
    double pa = ta ? (big ? r->pack_a_t_mem_ns : r->pack_a_t_ns) : (big ? r->pack_a_mem_ns : r->pack_a_ns);
    t += (double)mine * (double)M * Kd * pa * 1e-9; /* A is re-packed for every panel */
    t += cols * Kd * (tb ? r->pack_b_t_ns : r->pack_b_ns) * 1e-9;
    t += rows * cols * r->store_ns * 1e-9;
    *chunks_out = chunks;
    return r->call_us * 1e-6 + t;
}

enum { K_GEMM = TREX_FP32_GEMM, K_ATTN = TREX_FP32_ATTN, K_EXP = TREX_FP32_EXP, K_MHC = TREX_FP32_MHC,
       K_ELEM = TREX_FP32_ELEM, K_TOUCH = TREX_FP32_TOUCH, K_COUNT = TREX_FP32_KINDS };

static void add_time(sim *s, int kind, double t)
{
    s->out->t[s->phase][kind] += t;
}

/* cpu seconds of work spread over the pool (parallel) or on the calling thread */
static void add_cpu(sim *s, int kind, double cpu, bool parallel)
{
    int64_t c = parallel ? s->run->threads : 1;
    s->out->cpu_s[s->phase] += cpu;
    add_time(s, kind, cpu / par_speedup(s->rt, c));
}

static void gemm(sim *s, bool ta, bool tb, int64_t M, int64_t N, int64_t K)
{
    trex_plan_fp32_result *o = s->out;
    o->gemm_flops[s->phase] += 2.0 * (double)M * (double)N * (double)K;
    o->gemm_calls[s->phase] += 1;
    if (s->run->gemm_cb)
        s->run->gemm_cb(s->run->cb_ctx, s->phase, ta, tb, M, N, K);
    if (s->rt) {
        int64_t c;
        double busiest = gemm_cpu(s->rt, s->run->threads, ta, tb, M, N, K, &c);
        /* the busiest thread's CPU time; `c` threads at once run at par_speedup(c) / c each */
        add_time(s, K_GEMM, busiest * (double)c / par_speedup(s->rt, c));
        o->cpu_s[s->phase] += busiest * (double)c;
    }
}

/* linear layers (src/kernels/ref/gemm.c) */
static void lin_fwd(sim *s, int64_t n, int64_t in, int64_t out)
{
    gemm(s, false, true, n, out, in);
}

static void lin_bwd(sim *s, bool dx, bool dW, int64_t n, int64_t in, int64_t out)
{
    if (dx)
        gemm(s, false, false, n, in, out);
    if (dW)
        gemm(s, true, false, out, in, n);
}

/* FLOPs of the attention core kernels (am_sattn_*, am_dot, idx_score), run by `threads` threads */
static void attn_work(sim *s, double flops)
{
    s->out->attn_flops[s->phase] += flops;
    if (s->rt)
        add_cpu(s, K_ATTN, flops / (s->rt->attn_gflops * 1e9), true);
}

static void exps(sim *s, double count, bool parallel)
{
    s->out->exps[s->phase] += count;
    if (s->rt)
        add_cpu(s, K_EXP, count * s->rt->exp_ns * 1e-9, parallel);
}

/* streaming element-wise passes: bytes read + written */
static void elem(sim *s, double bytes, bool parallel)
{
    s->out->elem_bytes[s->phase] += bytes;
    if (s->rt)
        add_cpu(s, K_ELEM, bytes / (s->rt->mem_gbs * 1e9), parallel);
}

/* mHC per-token work (Sinkhorn and gates; the streams' mixing is in elem) */
static void mhc_tokens(sim *s, double tokens, double ns_per_token)
{
    if (s->rt)
        add_cpu(s, K_MHC, tokens * ns_per_token * 1e-9, true);
}

static void A(sim *s, double bytes)
{
    ar_alloc(&s->ar, bytes > 0 ? (size_t)bytes : 1);
}

/* ---- mHC (src/model/mhc.c) ---- */

static int64_t mhc_mix(int64_t n)
{
    return (2 + n) * n;
}

static void mhc_pre_fwd(sim *s, int64_t N)
{
    gemm(s, false, true, N, mhc_mix(s->n), s->nd);
    elem(s, (double)N * (double)s->nd * 4.0 + (double)N * (double)s->d * 4.0, true);
    if (s->rt)
        mhc_tokens(s, (double)N, s->rt->mhc_fwd_ns);
}

static void mhc_post_fwd(sim *s, int64_t N)
{
    elem(s, (double)N * (2.0 * (double)s->nd + (double)s->d) * 4.0, true);
}

static void mhc_bwd(sim *s, int64_t N)
{
    /* post backward, collapse, pre backward (+ its two GEMMs) */
    elem(s, (double)N * (4.0 * (double)s->nd + 2.0 * (double)s->d) * 4.0, true);
    elem(s, (double)N * ((double)s->nd + (double)s->d) * 4.0, true);
    elem(s, (double)N * (2.0 * (double)s->nd + (double)s->d) * 4.0, true);
    gemm(s, false, false, N, s->nd, mhc_mix(s->n));
    gemm(s, true, false, mhc_mix(s->n), s->nd, N);
    if (s->rt)
        mhc_tokens(s, (double)N, s->rt->mhc_bwd_ns);
}

static void rms(sim *s, int64_t rows, int64_t dim, bool bwd)
{
    elem(s, (double)rows * (double)dim * 4.0 * (bwd ? 3.0 : 2.0), true);
}

/* ---- attention (src/model/attention.c) ---- */

typedef struct adims {
    int64_t N, Bs, Ts, d, H, c, r, half, dc, G, dg, nwin, m, wm, nI, cI, topk, nc, maxnb, hc;
    bool csa, sparse, kl;
} adims;

static adims adims_of(const sim *s, int64_t l, int64_t Bs, int64_t Ts)
{
    const trex_config *c = s->cfg;
    adims a;
    memset(&a, 0, sizeof a);
    a.Bs = Bs, a.Ts = Ts, a.N = Bs * Ts, a.d = c->hidden_size, a.H = c->num_attention_heads;
    a.c = c->head_dim, a.r = c->qk_rope_head_dim, a.half = a.r / 2, a.dc = c->q_lora_rank;
    a.G = c->o_groups, a.dg = c->o_lora_rank, a.nwin = c->sliding_window;
    a.m = trex_config_ratio(c, l);
    a.wm = a.m == 4 ? 2 : 1;
    a.csa = a.m == 4;
    a.nI = a.csa ? c->index_n_heads : 0;
    a.cI = a.csa ? c->index_head_dim : 0;
    a.topk = a.csa ? c->index_topk : 0;
    a.maxnb = a.m > 0 ? Ts / a.m : 0;
    a.nc = Bs * a.maxnb;
    a.hc = a.H * a.c;
    a.sparse = a.csa && s->run->sparse;
    a.kl = a.csa; /* model.c always passes the indexer-loss terms */
    return a;
}

static size_t cmp_scratch(int64_t m, int64_t cw)
{
    return 5 * r64((size_t)(2 * m) * 8) + r64((size_t)(3 * cw) * 4);
}

static size_t qscr_bytes(const adims *a)
{
    int64_t maxset = a->sparse ? imin(a->topk, a->maxnb) : a->maxnb;
    int64_t ne = a->nwin + maxset + 1;
    return r64((size_t)ne * 8) + r64((size_t)(a->maxnb + 1) * 8) + r64((size_t)(a->topk + 1) * 8) +
           r64((size_t)(a->H * ne) * 4) + r64((size_t)(a->H * a->c) * 4) +
           2 * r64((size_t)(a->maxnb + 1) * 4) + r64((size_t)(a->maxnb + 1)) +
           r64((size_t)(a->nI + 1) * 4);
}

static size_t kscr_bytes(const adims *a)
{
    return 2 * r64(KTILE * 8) + r64(KTILE * 4) + r64((size_t)(a->nI + 1) * 4) + r64(KTILE * 8);
}

#define F(count) A(s, ((double)(count) + 1.0) * 4.0)

/* per query position p (0..Ts-1) of a row: window entries, visible compressed entries, attended
 * compressed entries */
static void attn_counts(const adims *a, double *win, double *vis, double *att, double *kl_q)
{
    *win = *vis = *att = *kl_q = 0;
    for (int64_t p = 0; p < a->Ts; p++) {
        int64_t w = p + 1 < a->nwin ? p + 1 : a->nwin;
        int64_t v = a->m > 0 ? (p + 1) / a->m : 0;
        int64_t t = a->sparse ? imin(v, a->topk) : v;
        *win += (double)w;
        *vis += (double)v;
        *att += (double)t;
        if (a->kl && t > 0)
            *kl_q += (double)t;
    }
    *win *= (double)a->Bs, *vis *= (double)a->Bs, *att *= (double)a->Bs, *kl_q *= (double)a->Bs;
}

static void compressor_fwd(sim *s, const adims *a, int64_t m, int64_t wm, int64_t cw)
{
    int64_t N = a->N, wc = wm * cw, nc = a->nc;
    A(s, (double)(N * wc) * 4.0);
    A(s, (double)(N * wc) * 4.0);
    F(nc * cw);
    F(nc);
    F(nc * cw);
    A(s, (double)(cmp_scratch(m, cw) * (size_t)s->run->threads));
    lin_fwd(s, N, a->d, wc);
    lin_fwd(s, N, a->d, wc);
    elem(s, (double)(N * wc) * 8.0, false); /* ape, serial */
    if (nc == 0)
        return;
    /* pooling: softmax over the block's 2m (m) candidates per feature */
    double cand = (double)(wm == 2 ? 2 * m : m);
    exps(s, (double)nc * (double)cw * cand, true);
    elem(s, (double)nc * (double)cw * cand * 8.0, true);
    rms(s, nc, cw, false);
}

static void compressor_bwd(sim *s, const adims *a, int64_t m, int64_t wm, int64_t cw, bool dx)
{
    int64_t N = a->N, wc = wm * cw, nc = a->nc;
    if (nc == 0)
        return;
    A(s, (double)(nc * cw) * 4.0);
    A(s, (double)(N * wc) * 4.0);
    A(s, (double)(N * wc) * 4.0);
    A(s, (double)(cmp_scratch(m, cw) * (size_t)s->run->threads));
    rms(s, nc, cw, true);
    double cand = (double)(wm == 2 ? 2 * m : m);
    exps(s, (double)nc * (double)cw * cand, true);
    elem(s, (double)nc * (double)cw * cand * 16.0, true);
    elem(s, (double)(N * wc) * 8.0, false);
    lin_bwd(s, dx, true, N, a->d, wc);
    lin_bwd(s, dx, true, N, a->d, wc);
}

/* What a forward does with the attention core's results (trex_attn_forward_core): carves and makes them
 * (CORE_OWN), makes them in a core reserved before (CORE_MAKE), or takes a made core (CORE_TAKE: no
 * core loop). */
enum { CORE_OWN, CORE_MAKE, CORE_TAKE };

/* core_carve's outputs (a reserved core adds u: core_reserve). */
static void core_carve(sim *s, const adims *a)
{
    const int64_t N = a->N;
    F(N * a->H);
    F(N * a->hc);
    if (a->kl) {
        F(N);
        F(N);
    }
    if (a->sparse) {
        F(N * a->topk);
        F(N);
    }
}

/* trex_attn_core_reserve for layer l: the struct, core_carve's outputs, then u. */
static void core_reserve(sim *s, int64_t l, int64_t Bs, int64_t Ts)
{
    adims a = adims_of(s, l, Bs, Ts);
    A(s, ATTN_CORE_BYTES);
    core_carve(s, &a);
    F(a.N * a.G * a.dg);
}

static void attn_fwd(sim *s, int64_t l, int64_t Bs, int64_t Ts, int core)
{
    adims a = adims_of(s, l, Bs, Ts);
    int64_t N = a.N, ns = Bs;
    A(s, ATTN_CACHE_BYTES);
    /* docs_init */
    A(s, (double)ns * 8.0);
    A(s, (double)ns * 8.0);
    A(s, (double)N * 8.0);
    A(s, (double)N * 8.0);
    A(s, (double)(ns + 1) * 8.0);
    A(s, (double)(a.nc + 1) * 8.0);
    A(s, (double)(a.nc + 1) * 8.0);
    F(a.half);
    F(Ts * a.half);
    F(Ts * a.half);
    /* query path */
    F(N * a.dc);
    F(N);
    F(N * a.dc);
    lin_fwd(s, N, a.d, a.dc);
    rms(s, N, a.dc, false);
    F(N * a.hc);
    F(N * a.H);
    lin_fwd(s, N, a.dc, a.hc);
    rms(s, N * a.H, a.c, false);
    elem(s, (double)(N * a.H * a.r) * 8.0, true);
    /* kv */
    F(N * a.c);
    F(N);
    F(N * a.c);
    lin_fwd(s, N, a.d, a.c);
    rms(s, N, a.c, false);
    if (a.m > 0)
        compressor_fwd(s, &a, a.m, a.wm, a.c);
    if (a.csa) {
        F(N * a.nI * a.cI);
        F(N * a.nI);
        lin_fwd(s, N, a.dc, a.nI * a.cI);
        lin_fwd(s, N, a.d, a.nI);
        compressor_fwd(s, &a, 4, 2, a.cI);
    }
    /* the core's outputs, then the KL terms per query */
    if (core == CORE_OWN)
        core_carve(s, &a);
    if (a.kl && core != CORE_TAKE)
        A(s, ((double)N + 1.0) * 8.0);
    if (core == CORE_OWN) /* else u is the core's */
        F(N * a.G * a.dg); /* u, before the core loop's scratch, which goes back after the loop */
    sim_mark core_mark = ar_mark(&s->ar);
    if (core != CORE_TAKE) {
        A(s, (double)(qscr_bytes(&a) * (size_t)s->run->threads) + 1.0);
        /* the core: per (query, entry, head) a dot and an axpy of c; the indexer scores every visible
         * compressed entry (nI dots of cI); the KL terms an exp per (attended entry, head) */
        double win, vis, att, klq;
        attn_counts(&a, &win, &vis, &att, &klq);
        double ent = win + att + (double)N; /* + the sink */
        attn_work(s, ent * (double)a.H * 4.0 * (double)a.c);
        exps(s, 2.0 * ent * (double)a.H, true);
        if (a.csa) {
            attn_work(s, vis * 2.0 * (double)(a.nI * a.cI));
            exps(s, klq * ((double)a.H + 1.0), true);
        }
    }
    ar_rewind(&s->ar, core_mark);
    elem(s, (double)(N * a.hc) * 8.0, true);
    /* grouped output projection (a taken core holds u) */
    for (int64_t g = 0; g < a.G && core != CORE_TAKE; g++)
        gemm(s, false, true, N, a.dg, (a.H / a.G) * a.c);
    lin_fwd(s, N, a.G * a.dg, a.d);
}

static void attn_bwd(sim *s, int64_t l, int64_t Bs, int64_t Ts)
{
    adims a = adims_of(s, l, Bs, Ts);
    int64_t N = a.N, gin = (a.H / a.G) * a.c;
    bool kl = a.kl && s->run->indexer_weight != 0 && Ts >= 4;
    sim_mark mk = ar_mark(&s->ar);
    F(N * a.G * a.dg);
    lin_bwd(s, true, true, N, a.G * a.dg, a.d);
    F(N * a.hc);
    for (int64_t g = 0; g < a.G; g++) {
        gemm(s, false, false, N, gin, a.dg);
        gemm(s, true, false, a.dg, gin, N);
    }
    F(N * a.H);
    elem(s, (double)(N * a.hc) * 8.0, false);
    F(N * a.hc);
    F(N * a.H);
    if (kl) {
        F(N * a.nI * a.cI);
        F(N * a.nI);
    }
    A(s, (double)(qscr_bytes(&a) * (size_t)s->run->threads));
    double win, vis, att, klq;
    attn_counts(&a, &win, &vis, &att, &klq);
    double ent = win + att + (double)N;
    /* query side and key side each recompute the probabilities: per (query, entry, head) two dots
     * and an axpy of c on the query side, two dots and a double axpy on the key side: 14c FLOPs */
    attn_work(s, ent * (double)a.H * 14.0 * (double)a.c);
    exps(s, 2.0 * ent * (double)a.H, true);
    if (kl) /* the KL gradient, on both sides: an index score (nI dots of cI) per attended entry and
             * an axpy of cI per head with a positive score (about half of them) */
        attn_work(s, 2.0 * klq * 3.0 * (double)(a.nI * a.cI));
    F(N * a.c);
    A(s, (double)(kscr_bytes(&a) * (size_t)s->run->threads));
    bool dC = a.m > 0 && a.nc > 0;
    if (dC) {
        F(a.nc * a.c);
        if (kl)
            F(a.nc * a.cI);
        int64_t nt = Bs * ceil_div(a.maxnb, KTILE);
        A(s, (double)(3 * nt) * 8.0);
    }
    rms(s, N * a.H, a.c, true);
    F(N * a.dc);
    F(N * a.dc);
    lin_bwd(s, true, true, N, a.dc, a.hc);
    rms(s, N, a.dc, true);
    lin_bwd(s, true, true, N, a.d, a.dc);
    F(N * a.c);
    rms(s, N, a.c, true);
    lin_bwd(s, true, true, N, a.d, a.c);
    if (dC)
        compressor_bwd(s, &a, a.m, a.wm, a.c, true);
    if (kl) {
        lin_bwd(s, false, true, N, a.dc, a.nI * a.cI);
        lin_bwd(s, false, true, N, a.d, a.nI);
        if (dC)
            compressor_bwd(s, &a, 4, 2, a.cI, false);
    }
    ar_rewind(&s->ar, mk);
}

/* ---- MoE (src/model/moe.c) ---- */

static void moe_fwd(sim *s, int64_t l, int64_t Bs, int64_t Ts)
{
    const trex_config *c = s->cfg;
    int64_t N = Bs * Ts, d = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    int64_t I = c->moe_intermediate_size, C = imin(N, MOE_CHUNK);
    bool hash = trex_config_is_hash(c, l), cache = s->run->backward;
    A(s, MOE_CACHE_BYTES);
    A(s, (double)(N * K) * 4.0);
    A(s, (double)(N * K) * 4.0);
    A(s, (double)(N * E) * 4.0);
    A(s, (double)(N * E) * 4.0);
    A(s, (double)(E + 1) * 8.0);
    A(s, (double)(N * K) * 4.0);
    if (!hash)
        A(s, (double)(Bs * E) * 4.0);
    if (cache) {
        A(s, (double)(N * K * I) * 4.0);
        A(s, (double)(N * K * I) * 4.0);
        A(s, (double)(N * I) * 4.0);
        A(s, (double)(N * I) * 4.0);
    } else {
        A(s, (double)(C * I) * 4.0);
        A(s, (double)(C * I) * 4.0);
    }
    A(s, (double)(C * d) * 4.0);
    A(s, (double)(C * d) * 4.0);
    A(s, (double)(C * I) * 4.0);
    if (!hash && N > 0)
        A(s, (double)E * 8.0);
    lin_fwd(s, N, d, E);
    exps(s, (double)(N * E), true); /* softplus */
    for (int64_t r0 = 0; r0 < N; r0 += C) {
        int64_t n = imin(C, N - r0);
        lin_fwd(s, n, d, I);
        lin_fwd(s, n, d, I);
        exps(s, (double)(n * I), true);
        lin_fwd(s, n, I, d);
    }
    /* routed experts: the planner assumes balanced routing (N K / E rows per expert) */
    int64_t rows = N * K, base = rows / E, extra = rows % E;
    for (int64_t e = 0; e < E; e++) {
        int64_t ne = base + (e < extra ? 1 : 0);
        for (int64_t p0 = 0; p0 < ne; p0 += C) {
            int64_t n = imin(C, ne - p0);
            lin_fwd(s, n, d, I);
            lin_fwd(s, n, d, I);
            lin_fwd(s, n, I, d);
        }
    }
    exps(s, (double)(rows * I), true);
    elem(s, (double)rows * (double)d * 16.0 + (double)rows * (double)I * 12.0, true);
}

static void moe_bwd(sim *s, int64_t l, int64_t Bs, int64_t Ts)
{
    const trex_config *c = s->cfg;
    int64_t N = Bs * Ts, d = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    int64_t I = c->moe_intermediate_size, C = imin(N, MOE_CHUNK);
    bool hash = trex_config_is_hash(c, l);
    if (N == 0)
        return;
    for (int i = 0; i < 3; i++)
        A(s, (double)(C * d) * 4.0);
    for (int i = 0; i < 3; i++)
        A(s, (double)(C * I) * 4.0);
    A(s, (double)(N * K) * 4.0);
    A(s, (double)(N * E) * 4.0);
    if (!hash && s->run->balance_weight != 0)
        A(s, (double)(Bs * E) * 4.0);
    for (int64_t r0 = 0; r0 < N; r0 += C) {
        int64_t n = imin(C, N - r0);
        exps(s, (double)(n * I) * 2.0, true);
        lin_bwd(s, true, true, n, I, d);
        lin_bwd(s, true, true, n, d, I);
        lin_bwd(s, true, true, n, d, I);
    }
    int64_t rows = N * K, base = rows / E, extra = rows % E;
    for (int64_t e = 0; e < E; e++) {
        int64_t ne = base + (e < extra ? 1 : 0);
        for (int64_t p0 = 0; p0 < ne; p0 += C) {
            int64_t n = imin(C, ne - p0);
            lin_bwd(s, true, true, n, I, d);
            lin_bwd(s, true, true, n, d, I);
            lin_bwd(s, true, true, n, d, I);
        }
    }
    exps(s, (double)(rows * I) * 2.0 + (double)(N * E), true);
    elem(s, (double)rows * (double)d * 24.0 + (double)rows * (double)I * 24.0, true);
    lin_bwd(s, true, true, N, d, E);
}

/* ---- blocks, head, model (src/model/model.c) ---- */

/* Whether sub-layer sub (0 attention, 1 MoE) of every block drops its cache after its forward and runs
 * that forward again in the backward (recompute attention / moe). */
static bool sub_dropped(const sim *s, int sub)
{
    return s->run->backward && (sub == 0 ? s->run->recompute_attn : s->run->recompute_moe);
}

static void block_fwd(sim *s, int64_t l, int64_t Bs, int64_t Ts, int core)
{
    int64_t N = Bs * Ts;
    for (int sub = 0; sub < 2; sub++) {
        if (s->run->backward) {
            A(s, (double)(N * (1 + 2 * mhc_mix(s->n))) * 4.0);
            A(s, (double)(N * s->d) * 4.0);
        }
        mhc_pre_fwd(s, N);
        int sub_core = core;
        if (sub == 0 && sub_dropped(s, 0) && s->run->recompute_keep_core) { /* attention-keep-core */
            core_reserve(s, l, Bs, Ts); /* below the mark: it outlives the dropped cache */
            sub_core = CORE_MAKE;
        }
        rms(s, N, s->d, false);
        sim_mark mk = ar_mark(&s->ar);
        if (sub == 0)
            attn_fwd(s, l, Bs, Ts, sub_core);
        else
            moe_fwd(s, l, Bs, Ts);
        mhc_post_fwd(s, N);
        if (sub_dropped(s, sub)) /* only the mHC state and the output y stay */
            ar_rewind(&s->ar, mk);
    }
}

static void block_bwd(sim *s, int64_t l, int64_t Bs, int64_t Ts)
{
    int64_t N = Bs * Ts;
    mhc_post_fwd(s, N); /* Xmid again */
    for (int sub = 1; sub >= 0; sub--) {
        rms(s, N, s->d, false);
        sim_mark mk = ar_mark(&s->ar);
        if (sub_dropped(s, sub)) { /* the sub-layer's forward again, for its cache */
            if (sub == 1) {
                A(s, (double)s->cfg->n_routed_experts * 8.0); /* its expert counts (thrown away) */
                moe_fwd(s, l, Bs, Ts);
            } else {
                attn_fwd(s, l, Bs, Ts, s->run->recompute_keep_core ? CORE_TAKE : CORE_OWN);
            }
        }
        if (sub == 1)
            moe_bwd(s, l, Bs, Ts);
        else
            attn_bwd(s, l, Bs, Ts);
        ar_rewind(&s->ar, mk); /* the backward's scratch and a recomputed cache */
        rms(s, N, s->d, true);
        mhc_bwd(s, N);
    }
}

static int64_t head_rows(const sim *s, int64_t R)
{
    int64_t rc = s->run->head_chunk_rows > 0 ? s->run->head_chunk_rows : HEAD_CHUNK_FLOATS / s->V;
    rc = rc < 1 ? 1 : rc;
    return rc < R ? rc : R;
}

static void head_pass_alloc(sim *s, int64_t R)
{
    A(s, (double)R * 4.0);
    A(s, (double)(R * (1 + 2 * s->n)) * 4.0);
    A(s, (double)(R * s->d) * 4.0);
    A(s, (double)R * 4.0);
    A(s, (double)(R * s->d) * 4.0);
    A(s, (double)R * 8.0);
}

static void head_run(sim *s, int64_t R)
{
    int64_t d = s->d, V = s->V;
    gemm(s, false, true, R, s->n, s->nd); /* hc_head */
    elem(s, (double)(R * s->nd) * 4.0, true);
    rms(s, R, d, false);
    A(s, (double)R * 8.0);
    if (s->run->backward)
        A(s, (double)(R * d) * 4.0);
    int64_t rc = head_rows(s, R);
    for (int64_t r0 = 0; r0 < R; r0 += rc) {
        int64_t rows = imin(rc, R - r0);
        lin_fwd(s, rows, d, V);
        exps(s, (double)(rows * V), true); /* log-sum-exp (double exp) */
        if (s->run->backward) {
            exps(s, (double)(rows * V), true); /* softmax for the gradient */
            lin_bwd(s, true, true, rows, d, V);
        }
    }
}

static void head_bwd(sim *s, int64_t R)
{
    rms(s, R, s->d, true);
    gemm(s, false, false, R, s->nd, s->n);
    gemm(s, true, false, s->n, s->nd, R);
    elem(s, (double)(R * s->nd) * 8.0, true);
}

static void model_fwd(sim *s)
{
    const trex_plan_fp32_run *run = s->run;
    int64_t B = run->B, T = run->T, N = B * T, Nm = B * (T - 1), d = s->d, n = s->n, nd = s->nd;
    ar_reset(&s->ar);
    A(s, (double)N * 4.0);
    A(s, (double)N * 4.0);
    A(s, (double)N * 8.0);
    A(s, (double)N * 8.0);
    head_pass_alloc(s, N);
    if (s->mtp) {
        A(s, (double)Nm * 4.0);
        A(s, (double)Nm * 4.0);
        A(s, (double)Nm * 8.0);
        A(s, (double)Nm * 8.0);
        head_pass_alloc(s, Nm);
    }
    if (run->backward || !run->logits) {
        A(s, (double)(head_rows(s, N) * s->V) * 4.0);
        s->out->head_chunk = (double)r64((size_t)(head_rows(s, N) * s->V) * 4);
    }
    A(s, (double)(N * d) * 4.0);
    A(s, (double)(N * d) * 4.0);
    if (!run->backward) {
        A(s, (double)(N * d) * 4.0);
        A(s, (double)(N * (1 + 2 * mhc_mix(n))) * 4.0);
    }
    A(s, (double)(N * nd) * 4.0);
    elem(s, (double)(N * nd) * 4.0, false);
    A(s, (double)(N * nd) * 4.0);
    for (int64_t l = 0; l < s->L; l++) {
        if (run->backward)
            A(s, (double)(N * nd) * 4.0);
        const bool keep_core = run->backward && run->recompute_full && run->recompute_keep_core;
        if (keep_core)
            core_reserve(s, l, B, T);
        sim_mark mk = ar_mark(&s->ar);
        block_fwd(s, l, B, T, keep_core ? CORE_MAKE : CORE_OWN);
        if (run->backward && run->recompute_full) /* only the block's input (and core) stays */
            ar_rewind(&s->ar, mk);
    }
    head_run(s, N);
    if (s->mtp) {
        A(s, (double)(Nm * nd) * 4.0);
        A(s, (double)(Nm * nd) * 4.0);
        A(s, (double)(Nm * n) * 4.0);
        A(s, (double)(Nm * d) * 4.0);
        A(s, (double)(Nm * d) * 4.0);
        A(s, (double)Nm * 4.0);
        A(s, (double)(Nm * nd) * 4.0);
        A(s, (double)(Nm * d) * 4.0);
        rms(s, Nm * n, d, false);
        rms(s, Nm, d, false);
        lin_fwd(s, Nm * n, d, d);
        lin_fwd(s, Nm, d, d);
        elem(s, (double)(Nm * nd) * 12.0, false);
        A(s, (double)(Nm * nd) * 4.0);
        block_fwd(s, s->L, B, T - 1, CORE_OWN);
        head_run(s, Nm);
    }
}

static void model_bwd(sim *s)
{
    int64_t B = s->run->B, T = s->run->T, N = B * T, Nm = B * (T - 1), d = s->d, n = s->n, nd = s->nd;
    A(s, (double)(N * nd) * 4.0);
    A(s, (double)(N * nd) * 4.0);
    for (int i = 0; i < 5; i++)
        A(s, (double)(N * d) * 4.0);
    A(s, (double)N * 4.0);
    A(s, (double)(N * (2 * mhc_mix(n) + 3)) * 4.0);
    A(s, (double)(N * nd) * 4.0);
    A(s, (double)(N * nd) * 4.0);
    if (s->mtp) {
        head_bwd(s, Nm);
        block_bwd(s, s->L, B, T - 1);
        lin_bwd(s, true, true, Nm, d, d);
        lin_bwd(s, true, true, Nm * n, d, d);
        rms(s, Nm * n, d, true);
        rms(s, Nm, d, true);
        elem(s, (double)(Nm * nd) * 12.0, false);
    }
    head_bwd(s, N);
    if (s->run->recompute_full) {
        A(s, (double)(N * nd) * 4.0);                           /* the recomputed block's output */
        A(s, (double)s->cfg->n_routed_experts * 8.0);           /* its expert counts (thrown away) */
        for (int64_t l = s->L - 1; l >= 0; l--) {
            sim_mark mk = ar_mark(&s->ar);
            block_fwd(s, l, B, T, s->run->recompute_keep_core ? CORE_TAKE : CORE_OWN);
            block_bwd(s, l, B, T);
            ar_rewind(&s->ar, mk);
        }
    } else {
        for (int64_t l = s->L - 1; l >= 0; l--)
            block_bwd(s, l, B, T);
    }
    elem(s, (double)(N * nd) * 8.0, false); /* embedding gradient, serial */
}

void trex_plan_fp32_run_recompute(trex_plan_fp32_run *r, int64_t recompute)
{
    r->recompute_full = recompute == TREX_RECOMPUTE_FULL || recompute == TREX_RECOMPUTE_FULL_KEEP_CORE;
    r->recompute_attn = recompute == TREX_RECOMPUTE_ATTENTION || recompute == TREX_RECOMPUTE_ATTENTION_KEEP_CORE;
    r->recompute_moe = recompute == TREX_RECOMPUTE_MOE;
    r->recompute_keep_core =
        recompute == TREX_RECOMPUTE_FULL_KEEP_CORE || recompute == TREX_RECOMPUTE_ATTENTION_KEEP_CORE;
}

void trex_plan_fp32_run_defaults(trex_plan_fp32_run *r)
{
    memset(r, 0, sizeof *r);
    r->B = 1;
    r->T = 4096;
    r->backward = true;
    r->threads = 2;
    r->balance_weight = 1e-4;
    r->indexer_weight = 1.0;
    r->optimizer = TREX_OPT_ADAMW;
    r->grads_all_touched = true;
}

/* Pages of the embedding gradient a pass touches: rows of the tokens it sees (uniform tokens:
 * a page of r rows is touched with probability 1 - (1 - r/V)^tokens). */
static double embed_touched(int64_t V, int64_t d, double tokens)
{
    double row = (double)d * 4.0, bytes = (double)V * row;
    if (row >= PAGE)
        return (double)V * (1.0 - pow(1.0 - 1.0 / (double)V, tokens)) * ceil(row / PAGE) * PAGE;
    double per = floor(PAGE / row), pages = ceil(bytes / PAGE);
    return pages * (1.0 - pow(1.0 - fmin(1.0, per / (double)V), tokens)) * PAGE;
}

trex_code trex_plan_fp32_evaluate(const trex_config *cfg, const trex_plan_fp32_rates *rates,
                                  const trex_plan_fp32_run *run, trex_plan_fp32_result *out,
                                  trex_err *err)
{
    memset(out, 0, sizeof *out);
    if (run->B < 1 || run->T < 2)
        return trex_err_set(err, TREX_EINVAL,
                            "fp32 engine: a micro-batch needs B >= 1 rows of T >= 2 tokens (got %lld x %lld)",
                            (long long)run->B, (long long)run->T);
    if (run->threads < 1)
        return trex_err_set(err, TREX_EINVAL, "fp32 engine: threads must be >= 1");
    if (cfg->num_nextn_predict_layers > 1)
        return trex_err_set(err, TREX_EINVAL,
                            "config %s: num_nextn_predict_layers %lld — the engine supports 0 or 1",
                            cfg->name, (long long)cfg->num_nextn_predict_layers);
    trex_layout lay;
    TREX_TRY(trex_layout_build(&lay, cfg, err));
    /* parameters and gradients: exactly the runtime's buffers */
    out->params = (double)lay.n_float * 4.0 + (double)lay.n_int * 4.0;
    out->grads = run->backward ? (double)lay.n_float * 4.0 : 0;
    out->optim = (double)trex_optimizer_state_bytes(
        &lay, run->optimizer == TREX_OPT_MUON ? TREX_OPTIM_MUON : TREX_OPTIM_ADAMW);
    double embed = 0, frozen = 0, file = 8.0;
    for (int64_t i = 0; i < lay.count; i++) {
        const trex_param *p = &lay.params[i];
        if (p->kind == TREX_P_EMBED)
            embed = (double)p->numel * 4.0;
        if (!p->trainable && !p->is_int)
            frozen += (double)p->numel * 4.0;
        file += (double)p->numel * (p->is_int ? 8.0 : 4.0) + 96.0; /* data + header entry */
    }
    trex_layout_free(&lay);

    sim s;
    memset(&s, 0, sizeof s);
    s.cfg = cfg, s.run = run, s.rt = rates, s.out = out;
    s.ar.cur = -1;
    s.L = cfg->num_hidden_layers, s.nblocks = trex_config_n_blocks(cfg), s.mtp = s.nblocks > s.L;
    s.d = cfg->hidden_size, s.n = cfg->hc_mult, s.nd = s.n * s.d, s.V = cfg->vocab_size;
    /* a steady-state pass is the second: the first grows the arena in chunks and touches their pages,
     * the reset keeps them, and the second lands at the same places and touches nothing new */
    int passes = run->warm ? 2 : 1;
    double resident = 0;
    for (int p = 0; p < passes; p++) {
        memset(out->t, 0, sizeof out->t);
        memset(out->gemm_flops, 0, sizeof out->gemm_flops);
        memset(out->gemm_calls, 0, sizeof out->gemm_calls);
        memset(out->attn_flops, 0, sizeof out->attn_flops);
        memset(out->exps, 0, sizeof out->exps);
        memset(out->elem_bytes, 0, sizeof out->elem_bytes);
        memset(out->cpu_s, 0, sizeof out->cpu_s);
        s.ar.touched_new = 0;
        s.phase = 0;
        model_fwd(&s);
        out->acts_kept = (double)s.ar.used;
        double touch_f = (double)s.ar.touched_new;
        s.ar.touched_new = 0;
        if (run->backward) {
            s.phase = 1;
            model_bwd(&s);
        }
        out->touched[0] = touch_f;
        out->touched[1] = (double)s.ar.touched_new;
        /* RSS keeps the high-water mark of the pages touched */
        resident = fmax(resident, (double)ar_resident(&s.ar));
    }
    if (s.ar.oom) {
        free(s.ar.c);
        return trex_err_set(err, TREX_ENOMEM, "fp32 engine: out of memory replaying the arena");
    }
    out->acts_end = (double)s.ar.used;
    out->acts_peak = (double)s.ar.peak_used;
    out->acts_reserved = (double)s.ar.peak_reserved;
    out->acts_resident = resident;
    free(s.ar.c);

    /* resident gradients: a training step zeroes (touches) them all; a single pass touches what the
     * backward writes: not the frozen tensors, and of the embedding only the rows of its tokens */
    double tokens = (double)(run->B * run->T) + (s.mtp ? (double)(run->B * (run->T - 1)) : 0.0);
    out->grads_resident = out->grads;
    if (run->backward && !run->grads_all_touched)
        out->grads_resident = out->grads - frozen - embed + embed_touched(s.V, s.d, tokens);
    out->file = file;
    out->baseline = rates ? rates->baseline_mib * 1048576.0 : 0;
    double opt = run->with_optimizer ? out->optim : 0;
    double step = out->baseline + out->params + out->grads_resident + opt + out->acts_resident;
    out->load_peak = run->load_file ? out->baseline + out->params + file : 0;
    out->rss_peak = fmax(step, out->load_peak);

    /* times */
    if (rates) {
        for (int ph = 0; ph < 2; ph++) {
            double t = 0;
            double touch = out->touched[ph];
            if (ph == 1 && !run->warm) /* the gradients: zeroed (step) or written (pass) first */
                touch += out->grads_resident;
            out->t[ph][K_TOUCH] = touch / (rates->touch_gbs * 1e9) / rates->serial_share;
            out->cpu_s[ph] += touch / (rates->touch_gbs * 1e9);
            for (int k = 0; k < K_COUNT; k++)
                t += out->t[ph][k];
            if (ph == 0)
                out->fwd_s = t;
            else
                out->bwd_s = t;
        }
        if (run->with_optimizer) {
            /* a memory-bound update: AdamW reads/writes parameter, gradient and two moments (and
             * zeroes the gradient for the next step); Muon's Newton–Schulz GEMMs are not modelled */
            /* trex_optimizer_update (gradient check, clip, AdamW) and zeroing the gradients, per
             * element, measured; Muon's element-wise part taken as the same */
            double n = out->grads / 4.0;
            out->opt_s = n * rates->adam_ns * 1e-9 / par_speedup(rates, run->threads);
            out->opt_cpu_s = n * rates->adam_ns * 1e-9;
        }
    }
    return TREX_OK;
}
