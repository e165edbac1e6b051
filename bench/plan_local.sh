#!/usr/bin/env bash
# bench/plan_local.sh — measures the rates of trex's fp32 reference engine on this machine, for the
# planner's "fp32_ref" object in configs/clusters/local.json (docs/planner.md, "The local fp32 engine").
#
#   bench/plan_local.sh [BUILD] [--write] [--out FILE]
#     BUILD       a build directory with libtrex.a and trex (default: build)
#     --write     also store the rates in configs/clusters/local.json (fp32_ref, measured date, load)
#     --out FILE  store them in a copy of local.json at FILE instead (bench/plan_local_validate.sh
#                 calibrates this way without touching the repository)
#
# What it measures (one process; CPU time of the measuring thread, CLOCK_THREAD_CPUTIME_ID, which other
# jobs on a shared machine disturb little; the load average before and after is printed and stored):
#   - the reference GEMM (src/kernels/ref/gemm.c, trex_gemm, whatever micro-kernel the dispatch picks)
#     on one thread over a grid of shapes in the three layouts the engine uses (x W^T, dy W, dy^T x),
#     with short and long K, small and large A and B panels, and dsv4-bench's LM-head shapes; the
#     constants of the planner's GEMM model (src/plan/engine.c gemm_cpu: micro-tile rates by where the
#     operands live, packing per element of A and B, a cost per element of C and per call, the unpacked
#     small products) are a non-negative least-squares fit of the model to these timings, each weighted
#     by 1/time (relative error); the kernel's blocking (micro-tile, panel width) is read from
#     kernels/dispatch.h and src/kernels/ref/gemm.c;
#   - the load factors: over 10 s of alternating 0.5 s slices on one thread and on the pool (a
#     256 x 4096 x 1024 product), one thread's wall speed / its CPU speed (serial_share) and the pool's
#     wall speed / one thread's CPU speed (speedup);
#   - the attention core kernels as the engine runs them (the fused table of src/kernels/fused.h at the
#     dispatch's level: forward and both sides of the backward) at c = 128 and 512, FLOPs counted as the
#     planner counts them (the mean is kept);
#   - exp() / expf() inside a loop; a streaming pass (RMSNorm, bytes read + written); the mHC per-token
#     work (trex_mhc_* on a 16-wide copy of dsv4-tiny, so the width-proportional part is negligible);
#     first touch of fresh pages (a 256 MiB calloc written twice); one AdamW update
#     (trex_optimizer_update + zeroing the gradients) per element on dsv4-tiny's layout;
#   - the peak RSS of a trex process that allocates nothing (`trex model info`): the process baseline;
#   - `trex bench peak`: the AVX-512 fp32 FMA peak per CPU-second x threads, local.json's
#     peak_bf16_tflops (the MFU denominator).
set -euo pipefail
build=build
write=0
out=configs/clusters/local.json
while [ $# -gt 0 ]; do
  case $1 in
    --write) write=1 ;;
    --out) write=1; out=$2; shift ;;
    -h|--help) awk 'NR > 1 && /^set -euo/ { exit } NR > 1' "$0"; exit 0 ;;
    *) build=$1 ;;
  esac
  shift
done
[ -f "$build/libtrex.a" ] && [ -x "$build/trex" ] || {
  echo "bench/plan_local.sh: $build has no libtrex.a / trex (build it: make BUILD=$build)" >&2; exit 2; }
threads=${TREX_THREADS:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/rates.c" <<'EOF'
/* The calibration program of bench/plan_local.sh (see there). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/dispatch.h"
#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "model/mhc.h"
#include "trex/alloc.h"
#include "trex/config.h"
#include "trex/optim.h"
#include "trex/params.h"
#include "trex/pool.h"

#define AM_REAL float
#define AM_SFX f
#include "model/attention_math.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CPU time of the calling thread: what one thread's work costs, whatever else runs on the machine */
static double cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static float *randf(size_t n, unsigned seed)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    return p;
}

/* ---- GEMM ---- */

typedef struct shape {
    long M, N, K;
    int ta, tb;
} shape;

/* Mean CPU seconds of one call (pool NULL: the calling thread) over at least `secs` of calls. */
static double time_gemm(const shape *s, double secs)
{
    float *A = randf((size_t)(s->M * s->K), 1), *B = randf((size_t)(s->K * s->N), 2);
    float *C = calloc((size_t)(s->M * s->N), sizeof *C);
    long lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    trex_gemm(NULL, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N); /* warm-up */
    double c0 = cpu();
    int n = 0;
    while (n < 3 || cpu() - c0 < secs) {
        trex_gemm(NULL, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N);
        n++;
    }
    double t = (cpu() - c0) / n;
    free(A), free(B), free(C);
    return t;
}

/* The load factors: alternating slices of `slice` seconds with the calling thread alone and with the
 * pool, `rounds` times, so that both see the same (changing) load; returns the mean CPU and wall
 * seconds of one call alone and the mean wall seconds of one call with the pool. */
static void time_par(trex_pool *pool, const shape *s, int rounds, double slice, double *cpu1,
                     double *wall1, double *walln)
{
    float *A = randf((size_t)(s->M * s->K), 1), *B = randf((size_t)(s->K * s->N), 2);
    float *C = calloc((size_t)(s->M * s->N), sizeof *C);
    double c1 = 0, w1 = 0, wn = 0;
    long n1 = 0, nn = 0;
    trex_gemm(pool, false, true, s->M, s->N, s->K, 1.0f, A, s->K, B, s->K, 0.0f, C, s->N);
    for (int r = 0; r < rounds; r++) {
        for (int pass = 0; pass < 2; pass++) {
            trex_pool *p = pass ? pool : NULL;
            double w0 = now(), c0 = cpu();
            long n = 0;
            while (n < 1 || now() - w0 < slice) {
                trex_gemm(p, false, true, s->M, s->N, s->K, 1.0f, A, s->K, B, s->K, 0.0f, C, s->N);
                n++;
            }
            if (pass) {
                wn += now() - w0, nn += n;
            } else {
                c1 += cpu() - c0, w1 += now() - w0, n1 += n;
            }
        }
    }
    *cpu1 = c1 / (double)n1;
    *wall1 = w1 / (double)n1;
    *walln = wn / (double)nn;
    free(A), free(B), free(C);
}

#define NF 13 /* model terms; the order is the output's */

static long cdiv(long a, long b)
{
    return (a + b - 1) / b;
}

/* the planner's GEMM model (src/plan/engine.c gemm_cpu), one thread: its terms for a shape */
/* the reference GEMM's blocking: micro-tile GEMM_MR x GEMM_NR (kernels/dispatch.h), panels of GEMM_NC
 * columns (kernels/ref/gemm.c, passed in by the script) */
#ifdef TREX_F32_MR
#define GEMM_MR TREX_F32_MR
#define GEMM_NR TREX_F32_NR
#else
#define GEMM_MR 4
#define GEMM_NR 8
#endif

static void features(const shape *s, double f[NF], double l2_kib, double l3_kib, double k_l1)
{
    memset(f, 0, sizeof(double) * NF);
    f[10] = 1.0; /* call_us */
    long panels = cdiv(s->N, GEMM_NC);
    double cols = (double)((panels - 1) * GEMM_NC + cdiv(s->N - (panels - 1) * GEMM_NC, GEMM_NR) * GEMM_NR);
    double rows = (double)(cdiv(s->M, GEMM_MR) * GEMM_MR), K = (double)s->K;
    double l2 = l2_kib * 1024.0, l3 = l3_kib * 1024.0, bpanel = K * GEMM_NC * 4.0;
    if (s->M * s->N * s->K < 32768) {
        f[11] = 2.0 * (double)s->M * (double)s->N * K; /* 1 / direct_gflops */
        return;
    }
    double uk = 2.0 * rows * cols * K;
    if (bpanel > l3)
        f[12] = uk; /* 1 / gemm_gflops_mem: the packed B panel is beyond the L3 share */
    else if (bpanel > l2)
        f[2] = uk; /* 1 / gemm_gflops_l3: the packed B panel is beyond L2 */
    else if (K > k_l1)
        f[1] = uk; /* 1 / gemm_gflops_long: a micro-tile's B slice is beyond L1 */
    else
        f[0] = uk; /* 1 / gemm_gflops */
    double na = (double)panels * (double)s->M * K;
    bool big = (double)s->M * K * 4.0 > l2;
    f[(s->ta ? 4 : 3) + (big ? 2 : 0)] = na; /* pack_a_ns, pack_a_t_ns, pack_a_mem_ns, pack_a_t_mem_ns */
    f[s->tb ? 8 : 7] = cols * K;             /* pack_b_ns / pack_b_t_ns */
    f[9] = rows * cols;                      /* store_ns: micro-tile set-up and the C update */
}

/* Non-negative least squares by coordinate descent, rows weighted by 1/t. */
static void nnls(double (*X)[NF], const double *y, int n, double *beta)
{
    double XtX[NF][NF] = {{0}}, Xty[NF] = {0};
    for (int i = 0; i < n; i++) {
        double w = 1.0 / y[i];
        for (int a = 0; a < NF; a++) {
            Xty[a] += X[i][a] * w * y[i] * w;
            for (int b = 0; b < NF; b++)
                XtX[a][b] += X[i][a] * w * X[i][b] * w;
        }
    }
    for (int a = 0; a < NF; a++)
        beta[a] = 0;
    for (int it = 0; it < 200000; it++) {
        double change = 0;
        for (int a = 0; a < NF; a++) {
            if (XtX[a][a] <= 0)
                continue;
            double r = Xty[a];
            for (int b = 0; b < NF; b++)
                if (b != a)
                    r -= XtX[a][b] * beta[b];
            double v = r / XtX[a][a];
            v = v < 0 ? 0 : v;
            change += fabs(v - beta[a]) / (fabs(v) + 1e-30);
            beta[a] = v;
        }
        if (change < 1e-12)
            break;
    }
}

/* ---- attention core ---- */

static double attn_rate(int64_t H, int64_t c, int64_t n, int reps)
{
    float *q = randf((size_t)(H * c), 3), *g = randf((size_t)(H * c), 4), *kv = randf((size_t)(n * c), 5);
    float *o = calloc((size_t)(H * c), 4), *dq = calloc((size_t)(H * c), 4), *z = calloc((size_t)(H * n), 4);
    float *lse = calloc((size_t)H, 4), *D = calloc((size_t)H, 4), *sink = calloc((size_t)H, 4);
    float *dsink = calloc((size_t)H, 4), *psum = calloc((size_t)n, 4), *dkv = calloc((size_t)(n * c), 4);
    const float **V = malloc((size_t)n * sizeof *V);
    float **dV = malloc((size_t)n * sizeof *dV);
    for (int64_t e = 0; e < n; e++)
        V[e] = kv + e * c, dV[e] = dkv + e * c;
    float scale = 1.0f / sqrtf((float)c);
    const trex_fused_table *ft = trex_fused();
    float *ws = malloc((size_t)TREX_FUSED_SATTN_WS(n, H) * sizeof *ws);
    double t[32];
    int inner = (int)(2e7 / (double)(H * n * c)) + 1;
    for (int r = 0; r < reps; r++) {
        double a = cpu();
        for (int i = 0; i < inner; i++) {
            ft->sattn_fwd(o, lse, z, ws, q, V, n, H, c, sink, scale);
            am_sattn_delta_f(D, g, o, H, c);
            ft->sattn_bwd_query(dq, dsink, NULL, ws, g, q, V, n, H, c, sink, scale, lse, D);
            ft->sattn_bwd_entries(dV, psum, ws, V, n, q, g, H, c, scale, lse, D);
        }
        t[r] = (cpu() - a) / inner;
    }
    /* the planner's count: forward 4c, backward 14c per (entry, head) */
    double flops = (double)(H * n) * 18.0 * (double)c;
    free(q), free(g), free(kv), free(o), free(dq), free(z), free(lse), free(D), free(sink), free(dsink);
    free(psum), free(dkv), free(V), free(dV), free(ws);
    return flops / median(t, reps) / 1e9;
}

/* ---- exp ---- */

static double exp_ns(int reps)
{
    size_t n = 1 << 20;
    float *x = randf(n, 6), *y = malloc(n * sizeof *y);
    double t[32], s = 0;
    for (int r = 0; r < reps; r++) {
        double a = cpu();
        for (size_t i = 0; i < n; i++)
            s += exp((double)x[i] - 0.25);
        for (size_t i = 0; i < n; i++)
            y[i] = expf(x[i] - 0.25f);
        t[r] = (cpu() - a) / (2.0 * (double)n);
    }
    if (s == 42.0)
        printf("%g", (double)y[1]);
    free(x), free(y);
    return median(t, reps) * 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: rates THREADS TINY_CONFIG\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    const char *tiny = argv[2];
    const int reps = 7;
    /* 2 MiB L2 and 48 KiB L1d per core: a micro-tile's A and B slices, (MR + NR) floats per k, stay in
     * L1 up to k_l1; the L3 share of one core of this shared VM: taken as 16 MiB (B panels of the grid
     * from 1 to 128 MiB: up to 8 MiB they run near the L2 rate, from 32 MiB at the memory rate; 16 MiB
     * panels fall either way, depending on the other jobs) */
    const double l2_kib = 2048, l3_kib = 16384, k_l1 = floor(49152.0 / (4.0 * (GEMM_MR + GEMM_NR)));
    trex_pool *pool = trex_pool_create(threads);

    /* GEMM grid, one thread; (M, N, K, ta, tb) */
    static const shape grid[] = {
        /* x W^T (forward) */
        {256, 256, 256, 0, 1},   {256, 256, 1024, 0, 1},  {256, 256, 4096, 0, 1},  {64, 512, 256, 0, 1},
        {1024, 256, 256, 0, 1},  {4096, 256, 256, 0, 1},  {129, 8192, 1024, 0, 1}, {512, 64, 1024, 0, 1},
        {512, 24, 4096, 0, 1},   {512, 1536, 256, 0, 1},  {512, 4096, 24, 0, 1},   {256, 256, 16384, 0, 1},
        /* dy W (data gradient) */
        {256, 256, 256, 0, 0},   {256, 1024, 4096, 0, 0}, {129, 1024, 16384, 0, 0}, {64, 512, 32768, 0, 0},
        {512, 256, 1024, 0, 0},  {512, 4096, 24, 0, 0},   {1024, 128, 64, 0, 0},   {4096, 512, 512, 0, 0},
        /* dy^T x (weight gradient) */
        {256, 256, 256, 1, 0},   {1024, 1024, 512, 1, 0}, {8192, 1024, 129, 1, 0}, {512, 1024, 512, 1, 0},
        {24, 4096, 512, 1, 0},   {256, 128, 512, 1, 0},   {4096, 256, 64, 1, 0},   {4096, 512, 512, 1, 0},
        {16384, 256, 64, 1, 0},
        /* dsv4-bench's LM head (V = 129280, d = 1024, 129-row chunks): x W^T, dy W, dy^T x */
        {129, 129280, 1024, 0, 1}, {129, 1024, 129280, 0, 0}, {129280, 1024, 129, 1, 0},
        /* small (unpacked) */
        {16, 16, 64, 0, 1},      {8, 32, 64, 1, 0},       {4, 24, 128, 0, 0},
    };
    int ng = (int)(sizeof grid / sizeof grid[0]);
    double X[64][NF], y[64], beta[NF];
    if (ng > 64)
        return 2;
    for (int i = 0; i < ng; i++) {
        y[i] = time_gemm(&grid[i], 0.3);
        features(&grid[i], X[i], l2_kib, l3_kib, k_l1);
    }
    nnls(X, y, ng, beta);
    double worst = 0;
    for (int i = 0; i < ng; i++) {
        double p = 0;
        for (int a = 0; a < NF; a++)
            p += X[i][a] * beta[a];
        double e = p / y[i] - 1.0;
        worst = fabs(e) > fabs(worst) ? e : worst;
        fprintf(stderr, "gemm %5ld x %5ld x %6ld %s%s: %9.3f ms %6.2f GFLOPS (CPU), model %+5.1f%%\n",
                grid[i].M, grid[i].N, grid[i].K, grid[i].ta ? "T" : "N", grid[i].tb ? "T" : "N",
                y[i] * 1e3, 2.0 * (double)grid[i].M * (double)grid[i].N * (double)grid[i].K / y[i] / 1e9,
                100.0 * e);
    }
    /* the machine as the runs see it: one thread's wall speed against its CPU time (other jobs take
     * turns on the cores), and the pool's speed-up over one thread's CPU time, on a large product,
     * over 10 s of alternating slices */
    shape big = {256, 4096, 1024, 0, 1};
    double c1, w1, wn;
    time_par(pool, &big, 10, 0.5, &c1, &w1, &wn);
    double serial_share = c1 / w1, speedup = c1 / wn;

    double attn_c128 = attn_rate(4, 128, 96, reps), attn_c512 = attn_rate(16, 512, 256, reps);

    /* streaming: RMSNorm over 32 MiB, read + write */
    int64_t rows = 8192, dim = 1024;
    float *x = randf((size_t)(rows * dim), 7), *yy = calloc((size_t)(rows * dim), 4), *w = randf((size_t)dim, 8);
    float *rstd = calloc((size_t)rows, 4);
    double tm[32];
    for (int r = 0; r < reps; r++) {
        double a = cpu();
        trex_rmsnorm_forward(NULL, yy, rstd, x, w, rows, dim, 1e-6f);
        tm[r] = cpu() - a;
    }
    double mem_gbs = 2.0 * (double)(rows * dim) * 4.0 / median(tm, reps) / 1e9;

    /* mHC per token on a 16-wide copy of dsv4-tiny */
    trex_config cfg;
    trex_err err = {0};
    if (trex_config_load(&cfg, tiny, &err) != TREX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    trex_config c16 = cfg;
    c16.hidden_size = 16;
    int64_t n = c16.hc_mult, d = 16, nd = n * d, N = 4096, mix = (2 + n) * n;
    trex_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    float *fn = randf((size_t)(mix * nd), 9), *hs = randf(3, 10), *hb = randf((size_t)mix, 11);
    float *gfn = calloc((size_t)(mix * nd), 4), *ghs = calloc(3, 4), *ghb = calloc((size_t)mix, 4);
    for (int64_t i = 0; i < mix * nd; i++)
        fn[i] *= 0.1f;
    trex_mhc_w mw = {fn, hs, hb}, mg = {gfn, ghs, ghb};
    float *Xs = randf((size_t)(N * nd), 12), *Xo = calloc((size_t)(N * nd), 4), *xin = calloc((size_t)(N * d), 4);
    float *st = calloc((size_t)(N * trex_mhc_state_size(n)), 4), *ds = calloc((size_t)(N * trex_mhc_dstate_size(n)), 4);
    float *yv = randf((size_t)(N * d), 13), *dy = calloc((size_t)(N * d), 4), *dX = calloc((size_t)(N * nd), 4);
    double tf[32], tb[32];
    for (int r = 0; r < reps; r++) {
        double a = cpu();
        trex_mhc_pre_forward(&ctx, &c16, N, xin, st, Xs, &mw);
        trex_mhc_post_forward(&ctx, &c16, N, Xo, yv, Xs, st);
        double b = cpu();
        trex_mhc_post_backward(&ctx, &c16, N, dX, dy, ds, Xo, yv, Xs, st);
        trex_mhc_pre_collapse(&ctx, &c16, N, xin, st, Xs);
        trex_mhc_pre_backward(&ctx, &c16, N, dX, &mg, ds, yv, Xs, &mw, st);
        double e = cpu();
        tf[r] = (b - a) / (double)N;
        tb[r] = (e - b) / (double)N;
    }
    double mhc_fwd = median(tf, reps) * 1e9, mhc_bwd = median(tb, reps) * 1e9;

    /* first touch: a fresh 256 MiB block written once, then again */
    size_t tbytes = (size_t)256 << 20;
    double touch[8];
    for (int r = 0; r < 3; r++) {
        char *p = calloc(1, tbytes);
        double a = cpu();
        memset(p, 1, tbytes);
        __asm__ volatile("" : : "r"(p) : "memory"); /* keep the stores */
        double b = cpu();
        memset(p, 2, tbytes);
        __asm__ volatile("" : : "r"(p) : "memory");
        double e = cpu();
        touch[r] = (b - a) - (e - b);
        free(p);
    }
    double touch_gbs = (double)tbytes / median(touch, 3) / 1e9;

    /* AdamW: trex_optimizer_update + zeroing the gradients, per element, dsv4-tiny, one thread */
    trex_layout lay;
    if (trex_layout_build(&lay, &cfg, &err) != TREX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    trex_optimizer_settings os;
    trex_optimizer_defaults(&os);
    os.kind = TREX_OPTIM_ADAMW;
    trex_optimizer *opt = NULL;
    trex_mem mem;
    memset(&mem, 0, sizeof mem);
    if (trex_optimizer_create(&opt, &lay, &cfg, &os, threads, &mem, &err) != TREX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    float *P = randf((size_t)lay.n_float, 14), *G = randf((size_t)lay.n_float, 15);
    double ta[32];
    for (int r = 0; r < 5; r++) {
        trex_step_report rep;
        double a = cpu();
        trex_optimizer_update(opt, NULL, P, G, &rep);
        memset(G, 0, (size_t)lay.n_float * sizeof *G);
        ta[r] = (cpu() - a) / (double)lay.n_float;
        G[r] = 1e-3f;
    }
    double adam_ns = median(ta, 5) * 1e9;
    trex_optimizer_destroy(opt);
    trex_layout_free(&lay);

    printf("{\n");
    printf("  \"threads\": %d,\n  \"serial_share\": %.3f,\n  \"speedup\": %.3f,\n", threads, serial_share,
           speedup);
#define RATE(b) ((b) > 0 ? 1.0 / (b) / 1e9 : 1e6)
    printf("  \"gemm_gflops\": %.3f,\n  \"gemm_gflops_long\": %.3f,\n  \"gemm_gflops_l3\": %.3f,\n",
           RATE(beta[0]), RATE(beta[1]), RATE(beta[2]));
    printf("  \"gemm_gflops_mem\": %.3f,\n", RATE(beta[12]));
    printf("  \"gemm_mr\": %d,\n  \"gemm_nr\": %d,\n  \"gemm_nc\": %d,\n", GEMM_MR, GEMM_NR, GEMM_NC);
    printf("  \"gemm_k_l1\": %.0f,\n  \"l2_kib\": %.0f,\n  \"l3_kib\": %.0f,\n", k_l1, l2_kib, l3_kib);
    printf("  \"pack_a_ns\": %.4f,\n  \"pack_a_t_ns\": %.4f,\n  \"pack_a_mem_ns\": %.4f,\n"
           "  \"pack_a_t_mem_ns\": %.4f,\n", beta[3] * 1e9, beta[4] * 1e9, beta[5] * 1e9, beta[6] * 1e9);
    printf("  \"pack_b_ns\": %.4f,\n  \"pack_b_t_ns\": %.4f,\n", beta[7] * 1e9, beta[8] * 1e9);
    printf("  \"store_ns\": %.4f,\n  \"call_us\": %.3f,\n", beta[9] * 1e9, beta[10] * 1e6);
    printf("  \"direct_gflops\": %.3f,\n", RATE(beta[11]));
    printf("  \"attn_gflops\": %.3f,\n", 0.5 * (attn_c128 + attn_c512));
    printf("  \"exp_ns\": %.3f,\n  \"mem_gbs\": %.3f,\n", exp_ns(reps), mem_gbs);
    printf("  \"mhc_fwd_ns\": %.1f,\n  \"mhc_bwd_ns\": %.1f,\n", mhc_fwd, mhc_bwd);
    printf("  \"touch_gbs\": %.3f,\n  \"adam_ns\": %.3f,\n", touch_gbs, adam_ns);
    printf("  \"gemm_fit_worst\": %.4f,\n  \"attn_gflops_c128\": %.3f,\n  \"attn_gflops_c512\": %.3f\n}\n",
           worst, attn_c128, attn_c512);
    trex_pool_destroy(pool);
    return 0;
}
EOF

# the panel width of the reference GEMM is private to src/kernels/ref/gemm.c
nc=$(sed -n 's/^#define NC \([0-9]*\).*/\1/p' src/kernels/ref/gemm.c | head -n 1)
[ -n "$nc" ] || { echo "bench/plan_local.sh: no '#define NC' in src/kernels/ref/gemm.c" >&2; exit 1; }
cc -O2 -std=c11 -Iinclude -Isrc -D_GNU_SOURCE -DGEMM_NC="$nc" -pthread "$work/rates.c" "$build/libtrex.a" \
   -lcjson -lm -pthread -o "$work/rates"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "plan_local: load before: $load_before (threads $threads)" >&2
"$work/rates" "$threads" configs/dsv4-tiny.json >"$work/rates.json"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "plan_local: load after: $load_after" >&2
# process baseline: the peak RSS of a trex run that allocates nothing
base_kb=$(/usr/bin/time -f %M "$build/trex" model info --config configs/dsv4-tiny.json 2>&1 >/dev/null | tail -n 1)
# the machine's fp32 peak (MFU denominator of local.json): AVX-512 (else AVX2) fp32 FMA per CPU-second x threads
"$build/trex" bench peak --reps 3 --json --threads "$threads" >"$work/peak.json"
/usr/bin/python3 - "$work/rates.json" "$base_kb" "$load_before" "$load_after" "$write" "$work/peak.json" "$out" <<'PY'
import json, sys, datetime, collections
r = json.load(open(sys.argv[1]), object_pairs_hook=collections.OrderedDict)
peak = json.load(open(sys.argv[6]))
pt = peak["peak_tflops"]
fma = (pt.get("avx512_fp32_fma") or pt["avx2_fp32_fma"])["per_cpu_second"] * peak["threads"]
r["baseline_mib"] = round(int(sys.argv[2]) / 1024.0, 1)
extra = {k: r.pop(k) for k in ("gemm_fit_worst", "attn_gflops_c128", "attn_gflops_c512")}
date = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
r["notes"] = ("measured by bench/plan_local.sh on %s, load average %s before, %s after; GEMM fit: worst "
              "shape %+.1f%%; attention core %.2f GFLOPS at c=128, %.2f at c=512 (the mean is kept)"
              % (date, sys.argv[3], sys.argv[4], 100 * extra["gemm_fit_worst"], extra["attn_gflops_c128"],
                 extra["attn_gflops_c512"]))
print(json.dumps(r, indent=2))
print("fp32 FMA peak: %.4f TFLOPS (%d threads x %.4f per CPU-second)" % (fma, peak["threads"], fma / peak["threads"]))
if sys.argv[5] == "1":
    path = sys.argv[7]
    c = json.load(open("configs/clusters/local.json"), object_pairs_hook=collections.OrderedDict)
    c["engine"] = "fp32-ref"
    c["fp32_ref"] = r
    c["reserved_gib"] = round(r["baseline_mib"] / 1024.0, 4)
    c["peak_bf16_tflops"] = round(fma, 4)
    open(path, "w").write(json.dumps(c, indent=2) + "\n")
    print("wrote", path, file=sys.stderr)
PY
