/* tools/trex/cmd_bench.c — `trex bench peak | kernels`: the machine's peaks and each kernel against its
 * roofline, with oneDNN side by side.
 *
 *   peak     register-only loops of the dispatch table (AMX TDPBF16PS, AVX-512 VDPBF16PS, AVX-512 or AVX2
 *            fp32 FMA): TFLOP/s of one core and of every pool thread at once; and the copy bandwidth.
 *   kernels  the bf16 GEMM (all three layouts, bf16 and fp32 inputs) at 2048^3 and at dsv4-bench's
 *            transformer shapes, and the grouped expert GEMM at dsv4-bench's expert shapes; for each the
 *            median time, TFLOP/s, the share of the measured peak and of the roofline
 *            min(peak, bandwidth x FLOP/byte), and oneDNN's bf16 matmul (plain layouts, and with its
 *            weights pre-packed in its own layout outside the timing) on the same operands; for fp32
 *            inputs, oneDNN's fp32 dnnl_sgemm.
 *
 * oneDNN is loaded at run time (dlopen of libdnnl.so.2) so that the trex binary does not depend on it;
 * without it the oneDNN columns say "n/a". It runs on OpenMP threads (as many as the pool), trex on the
 * pool. Medians of --reps runs after one warm-up; the machine may be shared, so figures are noisy. */
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#include <cjson/cJSON.h>

#include "commands.h"
#include "kernels/dispatch.h"
#include "kernels/gemm_panels.h"
#include "kernels/kernels.h"
#include "opts.h"
#include "trex/pool.h"
#include "trex/rng.h"
#include "trex/tensor.h"
#include "trex/prof.h"

#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#define HAVE_DNNL_HEADER 1
#endif

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double trex_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void trex_bench_today(char *buf, size_t size)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, size, "%Y-%m-%d", &tm);
}

typedef struct bench_common {
    int64_t threads, reps;
    const char *isa;
    bool json;
    trex_pool *pool;
    const trex_kernel_table *t;
    int nthreads;
} bench_common;

/* Checks the environment and the common options, creates the pool. Returns 0 or an exit status (2 for
 * a bad option value). */
static int common_setup(bench_common *c)
{
    trex_err err = {0};
    if (trex_kernels_init(&err) != TREX_OK)
        return trex_cli_error("%s", err.msg);
    c->t = trex_kernels_table();
    if (c->isa) {
        trex_isa cap;
        if (!trex_isa_parse(c->isa, &cap))
            return trex_cli_error("--isa %s: use ref, avx2, avx512f, avx512 or amx", c->isa) + 1;
        c->t = trex_kernels_table_for(cap);
    }
    if (c->reps < 1 || c->reps > 1000)
        return trex_cli_error("--reps must be in [1, 1000] (got %lld)", (long long)c->reps) + 1;
    if (c->threads < 0 || c->threads > 1024)
        return trex_cli_error("--threads must be in [0, 1024] (got %lld)", (long long)c->threads) + 1;
    if (trex_pool_create_checked(&c->pool, (int)c->threads, &err) != TREX_OK)
        return trex_cli_error("%s", err.msg);
    c->nthreads = trex_pool_size(c->pool);
    return 0;
}

/* ---- peaks ------------------------------------------------------------------------------------------- */

typedef struct peak_job {
    trex_peak_fn fn;
    int64_t iters;
    double flops[1024];
} peak_job;

static void peak_slots(void *arg, int64_t b, int64_t e, int tid)
{
    (void)tid;
    peak_job *j = arg;
    for (int64_t w = b; w < e; w++)
        j->flops[w] = j->fn(j->iters);
}

/* TFLOP/s of fn on `threads` threads at once (1: the calling thread), median of reps runs of ~secs;
 * *per_cpu: FLOPs per CPU-second of the caller and the pool's workers (trex_pool_cpu_s: the rate while on
 * a core, whatever else runs). */
static double measure_peak(trex_pool *pool, int threads, trex_peak_fn fn, double secs, int reps,
                           double *per_cpu)
{
    peak_job j = {.fn = fn, .iters = 1000};
    /* Calibrate on one thread: grow until a run takes 20 ms. */
    for (;;) {
        double t0 = trex_wall_s();
        fn(j.iters);
        double dt = trex_wall_s() - t0;
        if (dt > 0.02) {
            j.iters = (int64_t)((double)j.iters * secs / dt) + 1;
            break;
        }
        j.iters *= 4;
    }
    double v[1000], u[1000];
    for (int r = 0; r < reps; r++) {
        double t0 = trex_wall_s(), c0 = trex_pool_cpu_s(pool), total = 0;
        if (threads == 1) {
            total = fn(j.iters);
        } else {
            trex_pool_for(pool, threads, 1, peak_slots, &j);
            for (int w = 0; w < threads; w++)
                total += j.flops[w];
        }
        v[r] = total / (trex_wall_s() - t0) / 1e12;
        u[r] = total / (trex_pool_cpu_s(pool) - c0) / 1e12;
    }
    *per_cpu = trex_bench_median(u, reps);
    return trex_bench_median(v, reps);
}

typedef struct copy_job {
    char *dst;
    const char *src;
    size_t bytes;
    int n;
} copy_job;

static void copy_slots(void *arg, int64_t b, int64_t e, int tid)
{
    (void)tid;
    const copy_job *j = arg;
    for (int64_t w = b; w < e; w++) {
        size_t lo = j->bytes * (size_t)w / (size_t)j->n, hi = j->bytes * (size_t)(w + 1) / (size_t)j->n;
        memcpy(j->dst + lo, j->src + lo, hi - lo);
    }
}

/* memcpy bandwidth (bytes read + written per second) over two 256 MiB buffers, all threads. */
double trex_bench_copy_gbs(trex_pool *pool, int threads, int reps)
{
    const size_t bytes = (size_t)256 << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    copy_job j = {b, a, bytes, threads};
    double v[1000];
    for (int r = 0; r < reps; r++) {
        double t0 = trex_wall_s();
        trex_pool_for(pool, threads, 1, copy_slots, &j);
        v[r] = 2.0 * (double)bytes / (trex_wall_s() - t0) / 1e9;
    }
    free(a);
    free(b);
    return trex_bench_median(v, reps);
}

typedef struct peaks {
    double amx[3], dp[3], fma[3]; /* [0] one core, [1] all threads, [2] per CPU-second; 0: n/a */
    double copy_gbs;
} peaks;

static void measure_peaks(const bench_common *c, double secs, peaks *p)
{
    memset(p, 0, sizeof *p);
    const trex_peak_fn fns[3] = {c->t->peak_bf16_amx, c->t->peak_bf16_dp, c->t->peak_f32_fma};
    double *out[3] = {p->amx, p->dp, p->fma};
    for (int k = 0; k < 3; k++) {
        if (!fns[k])
            continue;
        double unused;
        out[k][0] = measure_peak(c->pool, 1, fns[k], secs, (int)c->reps, &out[k][2]);
        out[k][1] = measure_peak(c->pool, c->nthreads, fns[k], secs, (int)c->reps, &unused);
    }
    p->copy_gbs = trex_bench_copy_gbs(c->pool, c->nthreads, (int)c->reps);
}

static int bench_peak(int argc, char **argv)
{
    bench_common c = {.reps = 5};
    double secs = 0.3;
    static const char summary[] =
        "Register-only peak loops of the kernel table's level, on one core and on every thread of "
        "the pool at once: AMX bf16 (TDPBF16PS 16x16x32 tiles, 4 independent accumulators), AVX-512 "
        "bf16 (VDPBF16PS) and fp32 FMA (AVX-512: 24 independent chains; AVX2: 12, the unit of that "
        "level's bf16 products); and memcpy bandwidth over 256 MiB buffers (bytes read + written). "
        "Medians of --reps runs. 'per CPU-second' divides the FLOPs of the one-core run by the CPU time "
        "it got: the rate while on a core, which stays meaningful when other processes share the "
        "machine.";
    const trex_opt opts[] = {
        {"threads", TREX_OPT_I64, &c.threads, "N", "threads (0: TREX_THREADS, else every core)", false},
        {"reps", TREX_OPT_I64, &c.reps, "R", "runs per figure; the median is printed", false},
        {"seconds", TREX_OPT_F64, &secs, "S", "length of one run", false},
        {"isa", TREX_OPT_STR, &c.isa, "L", "level: ref, avx2, avx512f, avx512, amx (default: TREX_ISA cap)",
         false},
        {"json", TREX_OPT_FLAG, &c.json, NULL, "print one JSON object", false},
        {0}};
    trex_cmd_info info = {.usage = "trex bench peak [options]", .summary = summary};
    int prc = trex_opts_parse(opts, argc, argv, &info);
    if (prc != TREX_OPTS_OK)
        return prc == TREX_OPTS_HELP ? 0 : 2;
    if (!(secs > 0 && secs <= 60))
        return trex_cli_error("--seconds must be in (0, 60] (got %g)", secs) + 1;
    int rc = common_setup(&c);
    if (rc)
        return rc;
    if (!c.json)
        printf("trex bench peak: level %s, %d threads, median of %lld runs of %.2f s\n",
               trex_isa_label(c.t->isa), c.nthreads, (long long)c.reps, secs);
    peaks p;
    measure_peaks(&c, secs, &p);
    char date[32];
    trex_bench_today(date, sizeof date);
    const char *fma = c.t->peak_f32_fma_name ? c.t->peak_f32_fma_name : "fp32_fma";
    const char *names[3] = {"amx_bf16", "avx512_bf16", fma};
    const char *desc[3] = {"AMX bf16 (TDPBF16PS)", "AVX-512 bf16 (VDPBF16PS)",
                           !strcmp(fma, "avx2_fp32_fma") ? "AVX2 fp32 FMA" : "AVX-512 fp32 FMA"};
    const double *vals[3] = {p.amx, p.dp, p.fma};
    if (c.json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "date", date);
        cJSON_AddStringToObject(root, "level", trex_isa_name(c.t->isa));
        cJSON_AddNumberToObject(root, "threads", c.nthreads);
        cJSON_AddNumberToObject(root, "reps", (double)c.reps);
        cJSON *pk = cJSON_AddObjectToObject(root, "peak_tflops");
        for (int k = 0; k < 3; k++) {
            if (vals[k][0] <= 0)
                continue;
            cJSON *o = cJSON_AddObjectToObject(pk, names[k]);
            cJSON_AddNumberToObject(o, "per_core", vals[k][0]);
            cJSON_AddNumberToObject(o, "all_threads", vals[k][1]);
            cJSON_AddNumberToObject(o, "per_cpu_second", vals[k][2]);
        }
        cJSON_AddNumberToObject(root, "copy_gbs", p.copy_gbs);
        char *s = cJSON_Print(root);
        printf("%s\n", s ? s : "{}");
        free(s);
        cJSON_Delete(root);
    } else {
        printf("%-26s %14s %18s %18s\n", "TFLOP/s", "one core", "all threads", "per CPU-second");
        for (int k = 0; k < 3; k++) {
            if (vals[k][0] <= 0)
                printf("%-26s %14s %18s %18s\n", desc[k], "n/a", "n/a", "n/a");
            else
                printf("%-26s %14.3f %18.3f %18.3f\n", desc[k], vals[k][0], vals[k][1], vals[k][2]);
        }
        printf("%-26s %14s %15.1f GB/s\n", "memcpy (read + write)", "", p.copy_gbs);
    }
    trex_pool_destroy(c.pool);
    return 0;
}

/* ---- oneDNN, loaded at run time ---------------------------------------------------------------------- */

#ifdef HAVE_DNNL_HEADER
typedef struct dnnl_api {
    void *lib;
    __typeof__(&dnnl_engine_create) engine_create;
    __typeof__(&dnnl_engine_destroy) engine_destroy;
    __typeof__(&dnnl_stream_create) stream_create;
    __typeof__(&dnnl_stream_destroy) stream_destroy;
    __typeof__(&dnnl_stream_wait) stream_wait;
    __typeof__(&dnnl_memory_desc_init_by_strides) md_strides;
    __typeof__(&dnnl_memory_desc_init_by_tag) md_tag;
    __typeof__(&dnnl_memory_desc_get_size) md_size;
    __typeof__(&dnnl_matmul_desc_init) matmul_desc;
    __typeof__(&dnnl_primitive_desc_create) pd_create;
    __typeof__(&dnnl_primitive_desc_destroy) pd_destroy;
    __typeof__(&dnnl_primitive_desc_query_md) pd_query_md;
    __typeof__(&dnnl_reorder_primitive_desc_create) reorder_pd;
    __typeof__(&dnnl_primitive_create) prim_create;
    __typeof__(&dnnl_primitive_destroy) prim_destroy;
    __typeof__(&dnnl_primitive_execute) execute;
    __typeof__(&dnnl_memory_create) mem_create;
    __typeof__(&dnnl_memory_destroy) mem_destroy;
    __typeof__(&dnnl_sgemm) sgemm;
    void (*omp_set_num_threads)(int);
    dnnl_engine_t eng;
    dnnl_stream_t stream;
} dnnl_api;

static bool dnnl_load(dnnl_api *d, int threads)
{
    memset(d, 0, sizeof *d);
    d->lib = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!d->lib)
        return false;
#define SYM(field, name)                                                 \
    do {                                                                 \
        *(void **)&d->field = dlsym(d->lib, name);                       \
        if (!d->field)                                                   \
            goto fail;                                                   \
    } while (0)
    SYM(engine_create, "dnnl_engine_create");
    SYM(engine_destroy, "dnnl_engine_destroy");
    SYM(stream_create, "dnnl_stream_create");
    SYM(stream_destroy, "dnnl_stream_destroy");
    SYM(stream_wait, "dnnl_stream_wait");
    SYM(md_strides, "dnnl_memory_desc_init_by_strides");
    SYM(md_tag, "dnnl_memory_desc_init_by_tag");
    SYM(md_size, "dnnl_memory_desc_get_size");
    SYM(matmul_desc, "dnnl_matmul_desc_init");
    SYM(pd_create, "dnnl_primitive_desc_create");
    SYM(pd_destroy, "dnnl_primitive_desc_destroy");
    SYM(pd_query_md, "dnnl_primitive_desc_query_md");
    SYM(reorder_pd, "dnnl_reorder_primitive_desc_create");
    SYM(prim_create, "dnnl_primitive_create");
    SYM(prim_destroy, "dnnl_primitive_destroy");
    SYM(execute, "dnnl_primitive_execute");
    SYM(mem_create, "dnnl_memory_create");
    SYM(mem_destroy, "dnnl_memory_destroy");
    SYM(sgemm, "dnnl_sgemm");
#undef SYM
    *(void **)&d->omp_set_num_threads = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (d->omp_set_num_threads)
        d->omp_set_num_threads(threads);
    if (d->engine_create(&d->eng, dnnl_cpu, 0) != dnnl_success)
        goto fail;
    if (d->stream_create(&d->stream, d->eng, dnnl_stream_default_flags) != dnnl_success) {
        d->engine_destroy(d->eng);
        goto fail;
    }
    return true;
fail:
    dlclose(d->lib);
    memset(d, 0, sizeof *d);
    return false;
}

static void dnnl_unload(dnnl_api *d)
{
    if (!d->lib)
        return;
    d->stream_destroy(d->stream);
    d->engine_destroy(d->eng);
    /* libgomp's threads stay alive: do not dlclose under them. */
}

/* One oneDNN bf16 matmul C[M,N] (f32) = op(A) op(B) on our buffers; packed: weights in oneDNN's chosen
 * layout, reordered once before timing. */
typedef struct dnnl_mm {
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst, wei_user;
    void *wei_buf;
} dnnl_mm;

static bool dnnl_mm_create(dnnl_api *d, dnnl_mm *mm, bool packed, bool ta, bool tb, int64_t M,
                           int64_t N, int64_t K, void *A, int64_t lda, void *B, int64_t ldb, float *C,
                           int64_t ldc)
{
    memset(mm, 0, sizeof *mm);
    dnnl_memory_desc_t src_md, wei_md, wei_any, dst_md;
    dnnl_dims_t sd = {M, K}, ss = {ta ? 1 : lda, ta ? lda : 1};
    dnnl_dims_t wd = {K, N}, ws = {tb ? 1 : ldb, tb ? ldb : 1};
    dnnl_dims_t dd = {M, N}, ds = {ldc, 1};
    if (d->md_strides(&src_md, 2, sd, dnnl_bf16, ss) != dnnl_success ||
        d->md_strides(&wei_md, 2, wd, dnnl_bf16, ws) != dnnl_success ||
        d->md_strides(&dst_md, 2, dd, dnnl_f32, ds) != dnnl_success ||
        d->md_tag(&wei_any, 2, wd, dnnl_bf16, dnnl_format_tag_any) != dnnl_success)
        return false;
    dnnl_matmul_desc_t desc;
    if (d->matmul_desc(&desc, &src_md, packed ? &wei_any : &wei_md, NULL, &dst_md) != dnnl_success)
        return false;
    dnnl_primitive_desc_t pd;
    if (d->pd_create(&pd, &desc, NULL, d->eng, NULL) != dnnl_success)
        return false;
    bool ok = d->prim_create(&mm->prim, pd) == dnnl_success;
    const dnnl_memory_desc_t *wmd = packed ? d->pd_query_md(pd, dnnl_query_weights_md, 0) : &wei_md;
    ok = ok && d->mem_create(&mm->src, &src_md, d->eng, A) == dnnl_success;
    ok = ok && d->mem_create(&mm->dst, &dst_md, d->eng, C) == dnnl_success;
    if (ok && packed) {
        mm->wei_buf = aligned_alloc(64, (d->md_size(wmd) + 63) / 64 * 64);
        ok = mm->wei_buf && d->mem_create(&mm->wei, wmd, d->eng, mm->wei_buf) == dnnl_success &&
             d->mem_create(&mm->wei_user, &wei_md, d->eng, B) == dnnl_success;
        dnnl_primitive_desc_t rpd;
        if (ok && d->reorder_pd(&rpd, &wei_md, d->eng, wmd, d->eng, NULL) == dnnl_success) {
            dnnl_primitive_t r;
            if (d->prim_create(&r, rpd) == dnnl_success) {
                dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mm->wei_user}, {DNNL_ARG_TO, mm->wei}};
                ok = d->execute(r, d->stream, 2, args) == dnnl_success;
                d->stream_wait(d->stream);
                d->prim_destroy(r);
            } else {
                ok = false;
            }
            d->pd_destroy(rpd);
        } else {
            ok = false;
        }
    } else if (ok) {
        ok = d->mem_create(&mm->wei, &wei_md, d->eng, B) == dnnl_success;
    }
    d->pd_destroy(pd);
    return ok;
}

static bool dnnl_mm_run(dnnl_api *d, dnnl_mm *mm)
{
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, mm->src}, {DNNL_ARG_WEIGHTS, mm->wei},
                               {DNNL_ARG_DST, mm->dst}};
    bool ok = d->execute(mm->prim, d->stream, 3, args) == dnnl_success;
    return d->stream_wait(d->stream) == dnnl_success && ok;
}

static void dnnl_mm_destroy(dnnl_api *d, dnnl_mm *mm)
{
    if (mm->prim)
        d->prim_destroy(mm->prim);
    dnnl_memory_t ms[4] = {mm->src, mm->wei, mm->dst, mm->wei_user};
    for (int i = 0; i < 4; i++)
        if (ms[i])
            d->mem_destroy(ms[i]);
    free(mm->wei_buf);
    memset(mm, 0, sizeof *mm);
}
#else
typedef struct dnnl_api {
    void *lib;
} dnnl_api;
static bool dnnl_load(dnnl_api *d, int threads)
{
    (void)threads;
    d->lib = NULL;
    return false;
}
static void dnnl_unload(dnnl_api *d)
{
    (void)d;
}
#endif

/* ---- kernels ----------------------------------------------------------------------------------------- */

typedef struct kcase {
    const char *name;
    const char *what;   /* where the shape comes from */
    bool ta, tb, f32;
    int64_t M, N, K;    /* M = 0 with groups > 0: grouped, rows per group in gm[] */
    int groups;
    bool grouped_k;     /* grouped over K (weight gradients: K = tokens of the expert) */
    int prepacked;      /* PRE_B: B (the weight) packed once outside the timing (trex_gemm_pack_b);
                         * PRE_A: A packed once (trex_gemm_pack_a, one problem); ROWS: A and B read
                         * through row lists, a random permutation of each operand's stored rows
                         * (trex_gemm_grouped_rows, as the MoE reads tokens); SYM: C = A A^T
                         * (trex_gemm_syrk, one problem, M = N; FLOPs counted for its distinct
                         * elements, M (M + 1) K); F32B: a bf16 A of [M, 2K] read as spread against
                         * fp32 B values as they are (trex_gemm_bf16_f32b; only at the levels that have
                         * it; A's random values need not come in pairs: the kernels read the first of
                         * each, and the timing is the same); 0: none of these */
    bool accumulate;    /* C += op(A) op(B) (beta 1, as the model's weight gradients); else beta 0 */
} kcase;
enum { PRE_B = 1, PRE_A = 2, ROWS = 3, SYM = 4, F32B = 5 };

typedef struct kresult {
    double ms, tflops, dnnl_ms, dnnl_tflops, dnnlp_ms, dnnlp_tflops, roofline;
    double cpu_tflops, dnnl_cpu_tflops, dnnlp_cpu_tflops; /* FLOPs per CPU-second */
    double flops, bytes;
    double prepack_ms;  /* prepacked cases: packing every B (or A) once (not in ms) */
} kresult;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill(void *p, size_t n, bool f32, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        float v = (float)((double)(splitmix(&seed) >> 40) / 16777216.0 - 0.5);
        if (f32)
            ((float *)p)[i] = v;
        else
            ((uint16_t *)p)[i] = trex_f32_to_bf16(v);
    }
}

/* Rows per expert of a routed batch: `rows` slots over E experts with a fixed uneven load
 * (weights 0.5..1.5), so that the per-thread balance of the grouped GEMM is exercised. */
static void expert_rows(int64_t rows, int E, int64_t *out)
{
    double w[256], sum = 0;
    for (int e = 0; e < E; e++)
        sum += w[e] = 0.5 + (double)((e * 7) % E) / (double)(E - 1);
    int64_t given = 0;
    for (int e = 0; e < E; e++) {
        out[e] = e == E - 1 ? rows - given : (int64_t)floor((double)rows * w[e] / sum);
        given += out[e];
    }
}

/* A GEMM operand of `bytes` (64-byte aligned, freed with free). huge: whole 2 MiB pages, with Linux asked
 * for transparent huge pages before any is touched (where THP is in madvise mode, nothing else gets
 * them: docs/kernels.md "Round 6"). */
static void *operand_alloc(size_t bytes, bool huge)
{
    const size_t H = (size_t)2 << 20;
    if (!huge)
        return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    const size_t n = (bytes + 64 + H - 1) / H * H;
    void *p = aligned_alloc(H, n);
#ifdef MADV_HUGEPAGE
    if (p)
        (void)madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

/* The packer paths' cases, in bench_packing's order */
static const char *const pack_names[8] = {"pack.a.rows.f32", "pack.a.rows.bf16", "pack.a.pairs.f32",
                                          "pack.a.pairs.bf16", "pack.b.rows.f32", "pack.b.rows.bf16",
                                          "pack.b.pairs.f32", "pack.b.pairs.bf16"};

/* Packing throughput of each packer path of the level, on the calling thread: a 1024 x 1024 operand
 * packed as the GEMM packs it, either cycling over 32 operands (128 MiB of fp32, 64 MiB of bf16:
 * mostly from memory) or over one (4 or 2 MiB: from L2/L3). "rows": k contiguous in the source (x of
 * x W^T, W of x W^T), packed panel by panel (32 rows or columns over all k); "pairs": rows contiguous,
 * k-pairs interleaved from two source rows (dy and W of dy W, both operands of the weight gradient
 * dy^T x), packed a step of 32 k at a time across all panels (the framework's order for these
 * layouts, docs/kernels.md "Round 11"). Figures: GB of source per CPU-second, median of reps. */
static void bench_packing(const bench_common *c, const char *filter, bool huge, cJSON *arr)
{
    enum { R = 1024, K = 1024, NOPS = 32 };
    const char *const *names = pack_names;
    int any = 0;
    for (int v = 0; v < 8; v++)
        any += !filter || strstr(names[v], filter) != NULL;
    if (!any)
        return;
    float *f = operand_alloc((size_t)NOPS * R * K * sizeof(float), huge);
    uint16_t *b = operand_alloc((size_t)NOPS * R * K * sizeof(uint16_t), huge);
    uint16_t *dst = aligned_alloc(64, (size_t)32 * K * sizeof(uint16_t));
    if (!f || !b || !dst) {
        fprintf(stderr, "trex: bench: packing: out of memory, skipped\n");
        free(f);
        free(b);
        free(dst);
        return;
    }
    fill(f, (size_t)NOPS * R * K, true, 77);
    fill(b, (size_t)NOPS * R * K, false, 78);
    if (!c->json)
        printf("\npacking, 1 thread, %dx%d operands, GB of source per CPU-second (median of %lld): "
               "cycling over %d operands | one operand\n",
               R, K, (long long)c->reps, NOPS);
    for (int v = 0; v < 8; v++) {
        if (filter && !strstr(names[v], filter))
            continue;
        const bool is_b = v >= 4, pairs = (v / 2) % 2 == 1, f32 = v % 2 == 0;
        const trex_pack_fn fn = is_b ? (f32 ? c->t->pack_b_f32 : c->t->pack_b_bf16)
                                     : (f32 ? c->t->pack_a_f32 : c->t->pack_a_bf16);
        const size_t esz = f32 ? 4 : 2;
        const char *src = f32 ? (const char *)f : (const char *)b;
        double gbs[2];
        for (int cyc = 0; cyc < 2; cyc++) {
            const int nops = cyc == 0 ? NOPS : 1;
            double u[1000];
            for (int r = -1; r < c->reps; r++) {
                const double c0 = trex_pool_cpu_s(NULL);
                for (int o = 0; o < nops; o++) {
                    const char *s0 = src + (size_t)o * R * K * esz;
                    if (pairs) {
                        for (int64_t k = 0; k < K; k += 32)
                            for (int64_t p = 0; p < R; p += 32)
                                fn(dst + k * 32, s0 + (size_t)(p + k * R) * esz, 1, R, 32, 32, 32);
                    } else {
                        for (int64_t p = 0; p < R; p += 32)
                            fn(dst, s0 + (size_t)p * K * esz, K, 1, 32, K, K);
                    }
                }
                if (r >= 0)
                    u[r] = trex_pool_cpu_s(NULL) - c0;
            }
            gbs[cyc] = (double)nops * R * K * (double)esz / trex_bench_median(u, (int)c->reps) / 1e9;
        }
        if (c->json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", names[v]);
            cJSON_AddNumberToObject(o, "gbs_cycled", gbs[0]);
            cJSON_AddNumberToObject(o, "gbs_one_operand", gbs[1]);
            cJSON_AddItemToArray(arr, o);
        } else {
            printf("%-20s %7.2f | %7.2f\n", names[v], gbs[0], gbs[1]);
            fflush(stdout);
        }
    }
    free(f);
    free(b);
    free(dst);
}

static int bench_kernels(int argc, char **argv)
{
    bench_common c = {.reps = 5};
    int64_t tokens = 4096;
    const char *filter = NULL;
    bool no_dnnl = false, quick = false, huge = false;
    static const char summary[] =
        "The bf16 GEMM (C = A B^T, A B and A^T B; bf16 inputs, and fp32 inputs rounded while "
        "packed) at 2048^3 and at dsv4-bench shapes (d 1024, 16 heads of 512, q/o LoRA 256, "
        "2 o-groups, experts: inter 512, E 24, K 6; --tokens tokens), and the grouped expert GEMM "
        "over the routed tokens (uneven load), and the bf16x3 LM head's three products per chunk of "
        "512 rows (head3.*) and bf16x2g1's (head2.*; at the avx2 and avx512f levels also its logits "
        "on fp32 hn over min(tokens, 1024) rows, head2.fwd.f32b), and each packer path alone (pack.*); "
        "cases ending in "
        ".prepacked take "
        "B (the weight) packed once outside the timing (trex_gemm_pack_b), .prepacked_a its A "
        "(trex_gemm_pack_a), .rows read both operands through row lists (a random permutation of "
        "their rows, as the MoE reads its tokens; trex_gemm_grouped_rows). For each: median time, "
        "TFLOP/s, % of the measured "
        "peak of the level on the threads used, the roofline min(peak, copy bandwidth x FLOP/byte) "
        "and %, and oneDNN's bf16 matmul (fp32 output) on the same operands, with plain layouts and "
        "with its weights pre-packed outside the timing (for fp32 inputs: dnnl_sgemm, fp32 "
        "arithmetic). Weight-gradient cases marked beta 1 accumulate into C (as the model does); "
        "oneDNN computes them with beta 0. --huge-pages puts the operands (A, B, C) in transparent "
        "huge pages (2 MiB), the packer cases' sources too.";
    const trex_opt opts[] = {
        {"threads", TREX_OPT_I64, &c.threads, "N", "threads (0: TREX_THREADS, else every core)", false},
        {"reps", TREX_OPT_I64, &c.reps, "R", "runs per figure; the median is printed", false},
        {"tokens", TREX_OPT_I64, &tokens, "T", "tokens of the dsv4-bench shapes", false},
        {"filter", TREX_OPT_STR, &filter, "S",
         "only cases whose name contains S (pack.: only the packer paths)", false},
        {"isa", TREX_OPT_STR, &c.isa, "L", "level: ref, avx2, avx512f, avx512, amx (default: TREX_ISA cap)",
         false},
        {"no-onednn", TREX_OPT_FLAG, &no_dnnl, NULL, "skip oneDNN", false},
        {"quick", TREX_OPT_FLAG, &quick, NULL, "short peak measurement (0.1 s runs)", false},
        {"huge-pages", TREX_OPT_FLAG, &huge, NULL,
         "operands in transparent huge pages (madvise; default: 4 KiB pages as malloc gives)", false},
        {"json", TREX_OPT_FLAG, &c.json, NULL, "print one JSON object", false},
        {0}};
    trex_cmd_info info = {.usage = "trex bench kernels [options]", .summary = summary};
    int prc = trex_opts_parse(opts, argc, argv, &info);
    if (prc != TREX_OPTS_OK)
        return prc == TREX_OPTS_HELP ? 0 : 2;
    if (tokens < 1 || tokens > (1 << 20))
        return trex_cli_error("--tokens must be in [1, 1048576] (got %lld)", (long long)tokens) + 1;
    int rc = common_setup(&c);
    if (rc)
        return rc;

    const int64_t T = tokens, d = 1024, H = 16, hd = 512, qr = 256, orank = 256, G = 2, I = 512;
    const int E = 24, topk = 6;
    const int64_t hc = H * hd, og = H * hd / G, head_rows = T < 1024 ? T : 1024;
    /* Cases ending in .prepacked follow their plain case (side by side in time on a shared machine):
     * the same product with B (the weight) packed once outside the timing (trex_gemm_pack_b; the
     * kernels' equivalent of oneDNN's pre-packed weights); .prepacked_a: A packed once instead
     * (trex_gemm_pack_a; the LM head's W3). f32in: fp32 A, and B from fp32 rounded when packed (what
     * the model's bf16 mode multiplies). */
    const kcase cases[] = {
        {"square.nt", "2048^3, C = A B^T", false, true, false, 2048, 2048, 2048, 0, false, false, false},
        {"square.nt.prepacked", "2048^3, B packed once", false, true, false, 2048, 2048, 2048, 0,
         false, PRE_B, false},
        {"square.nt.prepacked_a", "2048^3, A packed once", false, true, false, 2048, 2048, 2048, 0,
         false, PRE_A, false},
        {"square.nn", "2048^3, C = A B", false, false, false, 2048, 2048, 2048, 0, false, false, false},
        {"square.tn", "2048^3, C = A^T B", true, false, false, 2048, 2048, 2048, 0, false, false, false},
        {"square.nt.f32in", "2048^3, fp32 inputs", false, true, true, 2048, 2048, 2048, 0,
         false, false, false},
        {"square.nt.f32in.prepacked", "2048^3, fp32 A, B packed once", false, true, true, 2048,
         2048, 2048, 0, false, PRE_B, false},
        {"square.nt.f32in.prepacked_a", "2048^3, fp32 A packed once, fp32 B", false, true, true, 2048,
         2048, 2048, 0, false, PRE_A, false},
        {"attn.wq_a.fwd", "x W^T, d -> q_lora", false, true, false, T, qr, d, 0, false, false, false},
        {"attn.wq_a.fwd.prepacked", "x W^T, W packed once", false, true, false, T, qr, d, 0, false,
         PRE_B, false},
        {"attn.wq_b.fwd", "q W^T, q_lora -> H*hd", false, true, false, T, hc, qr, 0, false, false, false},
        {"attn.wkv.fwd", "x W^T, d -> hd", false, true, false, T, hd, d, 0, false, false, false},
        {"attn.wo_a.fwd", "o W^T per group, H*hd/G -> o_lora", false, true, false, T, orank, og, 0,
         false, false, false},
        {"attn.wo_b.fwd", "u W^T, G*o_lora -> d", false, true, false, T, d, G * orank, 0,
         false, false, false},
        {"attn.wo_b.fwd.prepacked", "u W^T, W packed once", false, true, false, T, d, G * orank, 0,
         false, PRE_B, false},
        {"attn.wq_b.bwd_dx", "dq W, H*hd -> q_lora", false, false, false, T, qr, hc, 0, false, false, false},
        {"attn.wq_b.bwd_dw", "dq^T q, over tokens", true, false, false, hc, qr, T, 0, false, false, false},
        {"shared.w1.fwd", "x W1^T, d -> inter", false, true, false, T, I, d, 0, false, false, false},
        {"shared.w1.fwd.f32in", "x W1^T, fp32 inputs", false, true, true, T, I, d, 0, false, false, false},
        {"shared.w2.fwd", "h W2^T, inter -> d", false, true, false, T, d, I, 0, false, false, false},
        {"shared.w2.fwd.prepacked", "h W2^T, W2 packed once", false, true, false, T, d, I, 0, false,
         PRE_B, false},
        {"head.fwd", "h W^T, d -> vocab 129280 (<= 1024 tokens)", false, true, false, head_rows,
         129280, d, 0, false, false, false},
        /* The bf16x3 head of the bf16 step (model.c head_forward3), per chunk of 512 rows (bf16x3's
         * chunk; bf16x3g1 runs 1 024-row chunks since round 6): logits^T =
         * W3 hnF^T (K = 3d), dW += dl hnB (K = 3 rows), and one vocabulary block of d hn = dl^T W3
         * (K = 3 x 256; the model runs V / 256 of them per chunk, beta 1). */
        {"head3.fwd", "logits^T = W3 hn^T, K = 3d, 512 rows", false, true, false, 129280, 512, 3 * d,
         0, false, false, false},
        {"head3.fwd.prepacked_a", "logits^T, W3 (A) packed once", false, true, false, 129280, 512,
         3 * d, 0, false, PRE_A, false},
        {"head3.bwd_dw", "dW += dl hnB, K = 3 x 512 rows", false, false, false, 129280, d, 3 * 512, 0,
         false, false, true},
        {"head3.bwd_dhn", "dhn += dl^T W3, one block of 256 vocab", true, false, false, 512, d, 3 * 256,
         0, false, false, true},
        /* bf16x2g1, the bf16 default since the ninth sitting: logits^T = W2 hnF^T with W2 = [W_hi |
         * W_hi], hnF = [hn_hi | hn_lo] (K = 2d), per chunk of 1 024 rows; its gradient products are
         * bf16x3g1's (docs/precision.md "bf16x2g1"). */
        {"head2.fwd", "logits^T = W2 hn^T, K = 2d, 1024 rows", false, true, false, 129280, 1024, 2 * d,
         0, false, false, false},
        /* ... which the FMA levels (avx2, avx512f) compute as one product with K = d: W_hi spread
         * against hn's fp32 values (trex_gemm_bf16_f32b; docs/precision.md "bf16x2g1"), on min(tokens,
         * 1 024) rows (the chunk at the default tokens; few rows keep a test short) */
        {"head2.fwd.f32b", "logits^T = W_hi hn^T, fp32 hn, K = d", false, true, false, 129280, head_rows, d, 0,
         false, F32B, false},
        /* ... and its gradient products, per pair of 1 024-row chunks (model.c head3_grad1): dW += dl
         * hn_hi (K = 2 048 rows) and one vocabulary block of d hn = dl^T W_hi (6 144 rows, W_hi packed
         * once per forward; the model runs V / 6 144 of them per pair, beta 1 after the first). */
        {"head2.bwd_dw", "dW += dl hn_hi, K = 2048 rows", false, false, false, 129280, d, 2 * head_rows, 0,
         false, false, true},
        {"head2.bwd_dhn", "dhn += dl^T W_hi, one block of 6144 vocab, W_hi packed once", true, false, false,
         2 * head_rows, d, 6144, 0, false, PRE_B, true},
        /* Muon's Gram matrices (fp32 X, rounded while packed) as symmetric products, each followed by
         * the full product it replaced (optim/muon.c): X X^T of a 512 x 1024 expert matrix, X^T X of
         * wq_b (8192 x 256, the large-matrix path, threaded by the pool). */
        {"muon.gram", "X X^T, 512x1024 X, lower tiles + mirror", false, true, true, 512, 512, 1024, 0, false,
         SYM, false},
        {"muon.gram.full", "X X^T as a full product", false, true, true, 512, 512, 1024, 0, false, false,
         false},
        {"muon.gram_t", "X^T X, 8192x256 X (wq_b), symmetric", true, false, true, 256, 256, 8192, 0, false,
         SYM, false},
        {"muon.gram_t.full", "X^T X as a full product", true, false, true, 256, 256, 8192, 0, false, false,
         false},
        {"experts.w1.fwd", "grouped x_e W1_e^T, d -> inter", false, true, false, 0, I, d, E,
         false, false, false},
        {"experts.w1.fwd.prepacked", "grouped, W1_e packed once", false, true, false, 0, I, d, E,
         false, PRE_B, false},
        {"experts.w2.fwd", "grouped h_e W2_e^T, inter -> d", false, true, false, 0, d, I, E,
         false, false, false},
        {"experts.w2.fwd.prepacked", "grouped, W2_e packed once", false, true, false, 0, d, I, E,
         false, PRE_B, false},
        {"experts.w1.bwd_dx", "grouped da_e W1_e, inter -> d", false, false, false, 0, d, I, E,
         false, false, false},
        {"experts.w1.bwd_dx.prepacked", "grouped da_e W1_e, W1_e packed once", false, false, false, 0,
         d, I, E, false, PRE_B, false},
        {"experts.w1.bwd_dw", "grouped da_e^T x_e, over tokens", true, false, false, I, d, 0, E,
         true, false, false},
        {"experts.w1.bwd_dw.rows", "grouped da_e^T x_e, both through row lists", true, false, false, I, d,
         0, E, true, ROWS, false},
        {"experts.w1.fwd.f32in", "grouped, fp32 inputs", false, true, true, 0, I, d, E, false, false, false},
        {"experts.w1.fwd.f32in.prepacked", "grouped, fp32 A, W1_e packed once", false, true, true, 0,
         I, d, E, false, PRE_B, false},
        /* What the model's bf16 mode runs (moe.c): fp32 operands rounded while packed. */
        {"experts.w2.fwd.f32in", "grouped h_e W2_e^T, fp32 inputs", false, true, true, 0, d, I, E, false,
         false, false},
        {"experts.w1.bwd_dx.f32in", "grouped da_e W1_e, fp32 inputs", false, false, true, 0, d, I, E,
         false, false, false},
        {"experts.w1.bwd_dw.f32in", "grouped dW_e += da_e^T x_e, fp32 inputs", true, false, true, I, d, 0,
         E, true, false, true},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    bool any = !filter;
    for (int ci = 0; ci < ncases; ci++)
        any |= filter && strstr(cases[ci].name, filter) != NULL;
    for (int v = 0; v < 8; v++)
        any |= filter && strstr(pack_names[v], filter) != NULL;
    if (!any) /* before the peaks are measured */
        return trex_cli_error("--filter %s matches no case", filter);

    peaks pk;
    measure_peaks(&c, quick ? 0.1 : 0.3, &pk);
    const double peak = pk.amx[1] > 0 ? pk.amx[1] : pk.dp[1] > 0 ? pk.dp[1] : pk.fma[1];
    const double core_peak = pk.amx[2] > 0 ? pk.amx[2] : pk.dp[2] > 0 ? pk.dp[2] : pk.fma[2];
    const char *peak_kind = pk.amx[1] > 0 ? "amx_bf16" : pk.dp[1] > 0 ? "avx512_bf16"
                            : pk.fma[1] > 0 ? c.t->peak_f32_fma_name : "none";
    dnnl_api dn;
    const bool have_dnnl = !no_dnnl && dnnl_load(&dn, c.nthreads);
    int64_t erows[256];
    expert_rows(T * topk, E, erows);

    char date[32];
    trex_bench_today(date, sizeof date);
    if (!c.json) {
        printf("trex bench kernels: %s, level %s (gemm %s, pack %s), %d threads, median of %lld runs; "
               "peak %s %.2f TFLOP/s (%d threads), copy %.1f GB/s; operands in %s pages; oneDNN %s\n",
               date, trex_isa_name(c.t->isa), c.t->gemm_name, c.t->pack_name, c.nthreads,
               (long long)c.reps, peak_kind, peak, c.nthreads, pk.copy_gbs, huge ? "2 MiB" : "4 KiB",
               have_dnnl ? "bf16 matmul, sgemm for f32in (libdnnl.so.2)" : "n/a");
        printf("per-core peak %.2f TFLOP/s per CPU-second. cpu-TF: FLOPs per CPU-second of the pool's "
               "threads (oneDNN's: of the process, which may miss up to a scheduler tick of its threads' time); "
               "%%core: that / (per-core peak); both stay meaningful on a shared machine\n",
               core_peak);
        printf("%-30s %-18s %8s %7s %6s %7s %6s %7s %6s | %8s %7s %7s | %8s %7s %7s | %s\n", "case",
               "MxNxK", "ms", "TFLOP/s", "%peak", "roofl.", "%roof", "cpu-TF", "%core", "dnnl ms",
               "TFLOP/s", "cpu-TF", "pack ms", "TFLOP/s", "cpu-TF", "faster");
    }
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    trex_gemm_ws *ws = trex_gemm_ws_create(); /* kept across calls, as a training step would */
    if (!ws)
        return trex_cli_error("out of memory");
    for (int ci = 0; ci < ncases; ci++) {
        const kcase *k = &cases[ci];
        if (filter && !strstr(k->name, filter))
            continue;
        if (k->prepacked == F32B && !c.t->gemm_ukr_f32b)
            continue; /* the level multiplies bf16 values only */
        const int ng = k->groups > 0 ? k->groups : 1;
        /* F32B: A holds 2K bf16 values a row, B fp32: 4 bytes per element of either */
        const size_t esz = k->f32 || k->prepacked == F32B ? 4 : 2;
        trex_gemm_problem probs[256];
        void *A[256], *B[256];
        float *C[256];
        kresult res = {0};
        bool ok = true;
        for (int g = 0; g < ng; g++) {
            int64_t M = k->M, N = k->N, K = k->K;
            if (k->groups > 0 && !k->grouped_k)
                M = erows[g];
            if (k->grouped_k)
                K = erows[g];
            const int64_t lda = k->ta ? M : K, ldb = k->tb ? K : N;
            const size_t na = (size_t)(M * K), nb = (size_t)(N * K), nc = (size_t)(M * N);
            A[g] = operand_alloc(na * esz, huge);
            B[g] = operand_alloc(nb * esz, huge);
            C[g] = operand_alloc(nc * 4, huge);
            if (!A[g] || !B[g] || !C[g]) {
                ok = false;
                for (int h = 0; h <= g; h++) {
                    free(A[h]);
                    free(B[h]);
                    free(C[h]);
                }
                break;
            }
            fill(A[g], k->prepacked == F32B ? 2 * na : na, k->f32, 1000 + (uint64_t)g);
            fill(B[g], nb, k->f32 || k->prepacked == F32B, 2000 + (uint64_t)g);
            memset(C[g], 0, nc * 4);
            probs[g] = (trex_gemm_problem){M, N, K, A[g], lda, B[g], ldb, C[g], N, NULL, 0};
            const bool sym = k->prepacked == SYM; /* one operand, half the products */
            res.flops += (sym ? (double)M + 1.0 : 2.0 * (double)N) * (double)M * (double)K;
            res.bytes += (double)(sym ? na : na + nb) * (double)esz + (k->accumulate ? 8.0 : 4.0) * (double)nc;
        }
        if (!ok) {
            fprintf(stderr, "trex: bench: %s: out of memory, skipped\n", k->name);
            continue;
        }
        const trex_dtype in = k->f32 ? TREX_F32 : TREX_BF16;
        double v[1000], u[1000];
        trex_gemm_packed *packs[256] = {0};
        trex_gemm_problem pprobs[256];
        int32_t *arows[256] = {0}, *brows[256] = {0};
        for (int g = 0; g < ng && k->prepacked == ROWS && ok; g++) { /* each operand's rows, shuffled */
            const int64_t ra = k->ta ? probs[g].K : probs[g].M, rb = k->tb ? probs[g].N : probs[g].K;
            arows[g] = malloc((size_t)(ra > 0 ? ra : 1) * sizeof **arows);
            brows[g] = malloc((size_t)(rb > 0 ? rb : 1) * sizeof **brows);
            ok = arows[g] && brows[g];
            for (int q = 0; q < 2 && ok; q++) {
                int32_t *l = q ? brows[g] : arows[g];
                const int64_t n = q ? rb : ra;
                trex_rng rng = trex_rng_make(3000 + (uint64_t)g, (uint64_t)q);
                for (int64_t i = 0; i < n; i++)
                    l[i] = (int32_t)i;
                for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
                    const int64_t j = (int64_t)trex_rng_below(&rng, (uint64_t)(i + 1));
                    const int32_t t = l[i];
                    l[i] = l[j], l[j] = t;
                }
            }
        }
        if (k->prepacked == PRE_A) { /* one problem: its A packed once */
            const double t0 = trex_wall_s();
            packs[0] = trex_gemm_pack_a_with(c.t, c.pool, in, k->ta, probs[0].M, probs[0].K,
                                             probs[0].A, probs[0].lda);
            ok = packs[0] != NULL;
            res.prepack_ms = 1e3 * (trex_wall_s() - t0);
        }
        if (k->prepacked == PRE_B) {
            const double t0 = trex_wall_s();
            for (int g = 0; g < ng && ok; g++) {
                packs[g] = trex_gemm_pack_b_with(c.t, c.pool, in, k->tb, probs[g].N, probs[g].K,
                                                 probs[g].B, probs[g].ldb);
                ok = packs[g] != NULL;
                pprobs[g] = probs[g];
                pprobs[g].B = packs[g];
                pprobs[g].ldb = 0;
            }
            res.prepack_ms = 1e3 * (trex_wall_s() - t0);
        }
        for (int r = -1; r < c.reps && ok; r++) {
            double t0 = trex_wall_s(), c0 = trex_pool_cpu_s(c.pool);
            const float beta = k->accumulate ? 1.0f : 0.0f;
            if (k->prepacked == PRE_A)
                trex_gemm_prepacked_a_with(c.t, c.pool, ws, packs[0], in, k->tb, probs[0].N, 1.0f,
                                           probs[0].B, probs[0].ldb, beta, probs[0].C, probs[0].ldc);
            else if (k->prepacked == PRE_B)
                trex_gemm_grouped_prepacked_with(c.t, c.pool, ws, in, k->ta, 1.0f, beta, pprobs, ng);
            else if (k->prepacked == SYM)
                trex_gemm_syrk_with(c.t, c.pool, ws, in, k->ta, probs[0].M, probs[0].K, 1.0f, probs[0].A,
                                    probs[0].lda, beta, probs[0].C, probs[0].ldc, NULL, 0);
            else if (k->prepacked == F32B)
                trex_gemm_bf16_f32b_with(c.t, c.pool, ws, probs[0].M, probs[0].N, probs[0].K, 1.0f, probs[0].A,
                                         2 * probs[0].K, probs[0].B, probs[0].ldb, beta, probs[0].C, probs[0].ldc);
            else if (k->prepacked == ROWS)
                trex_gemm_grouped_rows_with(c.t, c.pool, ws, in, k->ta, k->tb, 1.0f, beta, probs,
                                            (const int32_t *const *)arows, (const int32_t *const *)brows, ng);
            else
                trex_gemm_grouped_with(c.t, c.pool, ws, in, k->ta, k->tb, 1.0f, beta, probs, ng);
            if (r >= 0) {
                v[r] = trex_wall_s() - t0;
                u[r] = trex_pool_cpu_s(c.pool) - c0;
            }
        }
        for (int g = 0; g < ng; g++) {
            trex_gemm_packed_free(packs[g]);
            free(arows[g]);
            free(brows[g]);
        }
        if (!ok) {
            fprintf(stderr, "trex: bench: %s: out of memory, skipped\n", k->name);
            for (int g = 0; g < ng; g++) {
                free(A[g]);
                free(B[g]);
                free(C[g]);
            }
            continue;
        }
        res.ms = 1e3 * trex_bench_median(v, (int)c.reps);
        res.tflops = res.flops / (res.ms * 1e-3) / 1e12;
        res.cpu_tflops = res.flops / trex_bench_median(u, (int)c.reps) / 1e12;
        res.roofline = peak;
        if (pk.copy_gbs > 0 && res.flops / res.bytes * pk.copy_gbs * 1e9 / 1e12 < res.roofline)
            res.roofline = res.flops / res.bytes * pk.copy_gbs * 1e9 / 1e12;
#ifdef HAVE_DNNL_HEADER
        if (have_dnnl && k->f32 && k->prepacked != ROWS && k->prepacked != SYM && k->prepacked != F32B) {
            /* fp32 inputs: oneDNN's fp32 GEMM (dnnl_sgemm, full fp32 arithmetic) on the same data. */
            bool ran = true;
            for (int r = -1; r < c.reps && ran; r++) {
                double t0 = trex_wall_s(), c0 = trex_cpu_s();
                for (int g = 0; g < ng && ran; g++)
                    ran = dn.sgemm(k->ta ? 'T' : 'N', k->tb ? 'T' : 'N', probs[g].M, probs[g].N,
                                   probs[g].K, 1.0f, A[g], probs[g].lda, B[g], probs[g].ldb, 0.0f,
                                   C[g], probs[g].ldc) == dnnl_success;
                if (r >= 0) {
                    v[r] = trex_wall_s() - t0;
                    u[r] = trex_cpu_s() - c0;
                }
            }
            if (ran) {
                res.dnnl_ms = 1e3 * trex_bench_median(v, (int)c.reps);
                res.dnnl_tflops = res.flops / (res.dnnl_ms * 1e-3) / 1e12;
                res.dnnl_cpu_tflops = res.flops / trex_bench_median(u, (int)c.reps) / 1e12;
            }
            struct timespec pause = {0, 20 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        if (have_dnnl && !k->f32 && k->prepacked != ROWS && k->prepacked != SYM && k->prepacked != F32B) {
            for (int packed = 0; packed < 2; packed++) {
                dnnl_mm mm[256];
                bool created = true;
                int made = 0;
                for (int g = 0; g < ng && created; g++, made++)
                    created = dnnl_mm_create(&dn, &mm[g], packed, k->ta, k->tb, probs[g].M, probs[g].N,
                                             probs[g].K, A[g], probs[g].lda, B[g], probs[g].ldb, C[g],
                                             probs[g].ldc);
                bool ran = created;
                for (int r = -1; r < c.reps && ran; r++) {
                    double t0 = trex_wall_s(), c0 = trex_cpu_s();
                    for (int g = 0; g < ng && ran; g++)
                        ran = dnnl_mm_run(&dn, &mm[g]);
                    if (r >= 0) {
                        v[r] = trex_wall_s() - t0;
                        u[r] = trex_cpu_s() - c0;
                    }
                }
                for (int g = 0; g < made; g++)
                    dnnl_mm_destroy(&dn, &mm[g]);
                if (ran) {
                    double ms = 1e3 * trex_bench_median(v, (int)c.reps);
                    *(packed ? &res.dnnlp_ms : &res.dnnl_ms) = ms;
                    *(packed ? &res.dnnlp_tflops : &res.dnnl_tflops) = res.flops / (ms * 1e-3) / 1e12;
                    *(packed ? &res.dnnlp_cpu_tflops : &res.dnnl_cpu_tflops) =
                        res.flops / trex_bench_median(u, (int)c.reps) / 1e12;
                }
            }
            struct timespec pause = {0, 20 * 1000 * 1000}; /* let OpenMP's spinning threads sleep */
            nanosleep(&pause, NULL);
        }
#endif
        char shape[64];
        if (k->groups > 0 && k->grouped_k)
            snprintf(shape, sizeof shape, "%lldx%lldx[%d]", (long long)k->M, (long long)k->N, ng);
        else if (k->groups > 0)
            snprintf(shape, sizeof shape, "[%d]x%lldx%lld", ng, (long long)k->N, (long long)k->K);
        else
            snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)k->M, (long long)k->N,
                     (long long)k->K);
        const double best_dnnl = fmax(res.dnnl_tflops, res.dnnlp_tflops);
        const char *faster = best_dnnl <= 0 ? "-" : res.tflops >= best_dnnl ? "trex" : "onednn";
        if (c.json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", k->name);
            cJSON_AddStringToObject(o, "what", k->what);
            cJSON_AddStringToObject(o, "shape", shape);
            cJSON_AddNumberToObject(o, "groups", ng);
            cJSON_AddStringToObject(o, "layout", k->ta ? "tn" : k->tb ? "nt" : "nn");
            cJSON_AddStringToObject(o, "input", k->f32 ? "f32" : "bf16");
            cJSON_AddBoolToObject(o, "prepacked", k->prepacked == PRE_B);
            cJSON_AddBoolToObject(o, "prepacked_a", k->prepacked == PRE_A);
            cJSON_AddBoolToObject(o, "rows", k->prepacked == ROWS);
            cJSON_AddBoolToObject(o, "sym", k->prepacked == SYM);
            cJSON_AddNumberToObject(o, "beta", k->accumulate ? 1 : 0);
            if (k->prepacked == PRE_A || k->prepacked == PRE_B)
                cJSON_AddNumberToObject(o, "prepack_ms", res.prepack_ms);
            cJSON_AddNumberToObject(o, "gflop", res.flops / 1e9);
            cJSON_AddNumberToObject(o, "ms", res.ms);
            cJSON_AddNumberToObject(o, "tflops", res.tflops);
            cJSON_AddNumberToObject(o, "pct_peak", peak > 0 ? 100 * res.tflops / peak : 0);
            cJSON_AddNumberToObject(o, "roofline_tflops", res.roofline);
            cJSON_AddNumberToObject(o, "pct_roofline", res.roofline > 0 ? 100 * res.tflops / res.roofline : 0);
            cJSON_AddNumberToObject(o, "cpu_tflops", res.cpu_tflops);
            cJSON_AddNumberToObject(o, "pct_core_peak", core_peak > 0 ? 100 * res.cpu_tflops / core_peak : 0);
            if (res.dnnl_ms > 0) {
                cJSON_AddStringToObject(o, "onednn_kind", k->f32 ? "sgemm (fp32)" : "matmul bf16");
                cJSON_AddNumberToObject(o, "onednn_ms", res.dnnl_ms);
                cJSON_AddNumberToObject(o, "onednn_tflops", res.dnnl_tflops);
                cJSON_AddNumberToObject(o, "onednn_cpu_tflops", res.dnnl_cpu_tflops);
            }
            if (res.dnnlp_ms > 0) {
                cJSON_AddNumberToObject(o, "onednn_packed_ms", res.dnnlp_ms);
                cJSON_AddNumberToObject(o, "onednn_packed_tflops", res.dnnlp_tflops);
                cJSON_AddNumberToObject(o, "onednn_packed_cpu_tflops", res.dnnlp_cpu_tflops);
            }
            cJSON_AddStringToObject(o, "faster", faster);
            cJSON_AddItemToArray(arr, o);
        } else {
            char dcol[6][16] = {"n/a", "n/a", "n/a", "n/a", "n/a", "n/a"};
            if (res.dnnl_ms > 0) {
                snprintf(dcol[0], sizeof dcol[0], "%.2f", res.dnnl_ms);
                snprintf(dcol[1], sizeof dcol[1], "%.3f", res.dnnl_tflops);
                snprintf(dcol[2], sizeof dcol[2], "%.3f", res.dnnl_cpu_tflops);
            }
            if (res.dnnlp_ms > 0) {
                snprintf(dcol[3], sizeof dcol[3], "%.2f", res.dnnlp_ms);
                snprintf(dcol[4], sizeof dcol[4], "%.3f", res.dnnlp_tflops);
                snprintf(dcol[5], sizeof dcol[5], "%.3f", res.dnnlp_cpu_tflops);
            }
            printf("%-30s %-18s %8.2f %7.3f %5.1f%% %7.3f %5.1f%% %7.3f %5.1f%% | %8s %7s %7s | %8s %7s "
                   "%7s | %s\n",
                   k->name, shape, res.ms, res.tflops, peak > 0 ? 100 * res.tflops / peak : 0.0,
                   res.roofline, res.roofline > 0 ? 100 * res.tflops / res.roofline : 0.0,
                   res.cpu_tflops, core_peak > 0 ? 100 * res.cpu_tflops / core_peak : 0.0, dcol[0], dcol[1],
                   dcol[2], dcol[3], dcol[4], dcol[5], faster);
            fflush(stdout);
        }
        for (int g = 0; g < ng; g++) {
            free(A[g]);
            free(B[g]);
            free(C[g]);
        }
    }
    cJSON *packs = cJSON_CreateArray();
    bench_packing(&c, filter, huge, packs);
    if (c.json) {
        cJSON_AddItemToObject(root, "packing", packs);
        cJSON_AddStringToObject(root, "date", date);
        cJSON_AddStringToObject(root, "level", trex_isa_name(c.t->isa));
        cJSON_AddStringToObject(root, "gemm", c.t->gemm_name);
        cJSON_AddNumberToObject(root, "threads", c.nthreads);
        cJSON_AddNumberToObject(root, "reps", (double)c.reps);
        cJSON_AddNumberToObject(root, "tokens", (double)tokens);
        cJSON_AddStringToObject(root, "peak_kind", peak_kind);
        cJSON_AddNumberToObject(root, "peak_tflops", peak);
        cJSON_AddNumberToObject(root, "core_peak_tflops_per_cpu_second", core_peak);
        cJSON_AddNumberToObject(root, "copy_gbs", pk.copy_gbs);
        cJSON_AddBoolToObject(root, "onednn", have_dnnl);
        cJSON_AddBoolToObject(root, "huge_pages", huge);
        cJSON_AddItemToObject(root, "kernels", arr);
        char *s = cJSON_Print(root);
        printf("%s\n", s ? s : "{}");
        free(s);
    } else {
        cJSON_Delete(arr);
        cJSON_Delete(packs);
    }
    cJSON_Delete(root);
    trex_gemm_ws_destroy(ws);
    if (have_dnnl)
        dnnl_unload(&dn);
    trex_pool_destroy(c.pool);
    return 0;
}

int trex_cmd_bench(int argc, char **argv)
{
    static const char usage[] =
        "usage: trex bench <peak|kernels|fused|step> [options]\n\n"
        "  peak     register-only AMX / AVX-512 peaks of one core and of all threads, copy bandwidth\n"
        "  kernels  bf16 GEMM and grouped expert GEMM against the roofline, oneDNN side by side\n"
        "  fused    the memory-bound fused kernels and AdamW against the copy bandwidth, and the reference\n"
        "  step     full training steps: tokens/s, MFU, time per op class, memory (cmd_bench_step.c)\n\n"
        "`trex bench <sub> --help` lists the options. TREX_ISA caps the kernel level.\n";
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(argv[1], "peak"))
        return bench_peak(argc - 1, argv + 1);
    if (!strcmp(argv[1], "kernels"))
        return bench_kernels(argc - 1, argv + 1);
    if (!strcmp(argv[1], "fused"))
        return trex_cmd_bench_fused(argc - 1, argv + 1);
    if (!strcmp(argv[1], "step"))
        return trex_cmd_bench_step(argc - 1, argv + 1);
    fprintf(stderr, "trex: error: unknown bench '%s'\n\n%s", argv[1], usage);
    return 2;
}
