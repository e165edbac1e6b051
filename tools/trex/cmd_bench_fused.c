/* tools/trex/cmd_bench_fused.c — `trex bench fused`: the memory-bound entries of the fused-kernel table
 * (kernels/fused.h) and the optimizer's AdamW pass against the memory roofline.
 *
 * Each case runs one entry over dsv4-bench's shapes for --tokens tokens, split over the pool's threads in
 * row ranges as the model splits it, at the level's leaf and at the reference (the same operands, side by
 * side in time). These kernels do a few operations per element, so memory bounds them: the figure is the
 * rate at which they move the bytes they must read and write (GB/s), against the copy bandwidth measured
 * in the run (memcpy over 256 MiB buffers, read + written bytes per second, as `trex bench peak`). A case
 * whose operands stay in the caches, or that writes around them, can pass 100% of it. For each: median
 * time, GB/s, % of the copy bandwidth, the reference's median and the speed-up over it. Operands are
 * filled again before each timing (job_fill); a case that accumulates keeps accumulating across its
 * runs, the in-place ones (RoPE, the per-head RMS backward) keep their scale. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "commands.h"
#include "kernels/dispatch.h"
#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "opts.h"
#include "trex/pool.h"
#include "trex/prof.h"

/* dsv4-bench: d, heads x head dim, rope pairs, experts per token x inter, mHC streams, the compressor's
 * candidates per block (ratio 4, overlapped: 8) */
enum { D = 1024, H = 16, HD = 512, NOPE = 448, HALF = 32, TOPK = 6, INTER = 512, NS = 4, PN = 8, RATIO = 4 };

/* The operands every case draws from (each sized for the largest case) and the table in use. */
typedef struct fused_job {
    const trex_fused_table *f;
    const trex_optim_kernels *o;
    int64_t T;
    float *a, *b, *c, *d, *e; /* [T H HD] floats each */
    uint16_t *h, *k;          /* [T H HD] bf16 each */
    const float **K, **Z;     /* the pooling's candidate rows */
    float **dK, **dZ;
    float *par;               /* per-token small operands (par_floats) */
} fused_job;

typedef struct fused_case {
    const char *name, *what;
    int64_t (*rows)(int64_t T);   /* the pool's range: tokens, experts' rows, blocks, columns */
    int64_t grain;
    double (*bytes)(int64_t T);   /* bytes the entry must read and write over the whole range */
    trex_task_fn run;
    void (*prep)(fused_job *j);   /* operands set before the timing, or NULL */
} fused_case;

static int64_t rows_tokens(int64_t T) { return T; }
static int64_t rows_experts(int64_t T) { return T * TOPK; }
static int64_t rows_blocks(int64_t T) { return T / RATIO; } /* --tokens >= RATIO */
static int64_t rows_dim(int64_t T) { (void)T; return D; }
static int64_t rows_heads(int64_t T) { return T * H; }

/* cos, then sin (T HALF each) */
static const float *rope_tables(const fused_job *j) { return j->par + j->T * (NS + NS * NS); }

/* ---- the cases: each runs its entry over rows [r0, r1) ----------------------------------------------- */

static void run_norm_fwd(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    j->f->rmsnorm_fwd(j->b + r0 * D, j->par + r0, j->a + r0 * D, j->c, r1 - r0, D, 1e-6f);
}
static double bytes_norm_fwd(int64_t T) { return 8.0 * T * D; }

static void run_norm_bwd(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    j->f->rmsnorm_bwd(j->d + r0 * D, j->b + r0 * D, j->a + r0 * D, j->c, j->par + r0, r1 - r0, D, 1);
}
static double bytes_norm_bwd(int64_t T) { return 16.0 * T * D; }

static void run_norm_dw(void *arg, int64_t j0, int64_t j1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    j->f->rmsnorm_dw(j->e, j->b, j->a, j->par, j->T, D, j0, j1);
}
static double bytes_norm_dw(int64_t T) { return 8.0 * T * D; }

static void run_sumsq(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    for (int64_t r = r0; r < r1; r++) /* a call through the table: not dropped for its unused result */
        (void)j->f->sumsq(j->a + r * NS * D, NS * D);
}
static double bytes_sumsq(int64_t T) { return 4.0 * T * NS * D; }

static void run_rope(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    const float *cs = rope_tables(j), *sn = cs + j->T * HALF;
    for (int64_t t = r0; t < r1; t++)
        j->f->rope(j->a + t * H * HD + NOPE, H, HD, cs + t * HALF, sn + t * HALF, HALF, 0);
}
static double bytes_rope(int64_t T) { return 8.0 * T * H * 2 * HALF + 8.0 * T * HALF; }

static void run_head_bwd(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    for (int64_t t = r0; t < r1; t++)
        j->f->rms_head_bwd(j->a + t * H * HD, j->b + t * H * HD, j->par + t * H, H, HD);
}
static double bytes_head_bwd(int64_t T) { return 12.0 * T * H * HD; }

static void run_swiglu_fwd(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    for (int64_t r = r0; r < r1; r++)
        j->f->swiglu_fwd_bf16(j->h + r * INTER, j->a + r * INTER, j->b + r * INTER, INTER, 0.5f, 10.0f);
}
static double bytes_swiglu_fwd(int64_t T) { return 10.0 * T * TOPK * INTER; }

static void run_swiglu_bwd(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    for (int64_t r = r0; r < r1; r++)
        (void)j->f->swiglu_bwd_bf16(NULL, j->h + r * INTER, j->k + r * INTER, j->a + r * INTER,
                                    j->b + r * INTER, j->c + r * INTER, INTER, 0.5f, 10.0f);
}
static double bytes_swiglu_bwd(int64_t T) { return 16.0 * T * TOPK * INTER; }

/* per token: post (NS), comb (NS x NS) */
static const float *mixes(const fused_job *j, int64_t t) { return j->par + t * (NS + NS * NS); }

static void run_post_fwd(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    for (int64_t t = r0; t < r1; t++)
        j->f->mhc_post_fwd(NS, D, mixes(j, t), mixes(j, t) + NS, j->a + t * D, j->b + t * NS * D,
                           j->c + t * NS * D);
}
static double bytes_post_fwd(int64_t T) { return 4.0 * T * D * (1 + 2 * NS); }

static void run_post_bwd(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    float dpost[NS], dcomb[NS * NS];
    for (int64_t t = r0; t < r1; t++)
        j->f->mhc_post_bwd(NS, D, mixes(j, t), mixes(j, t) + NS, j->a + t * D, j->b + t * NS * D,
                           j->c + t * NS * D, j->e + t * D, j->d + t * NS * D, dpost, dcomb);
}
static double bytes_post_bwd(int64_t T) { return 4.0 * T * D * (1 + 2 * NS + 1 + NS); }

static void run_collapse(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    for (int64_t t = r0; t < r1; t++)
        j->f->mhc_collapse(NS, D, mixes(j, t), j->b + t * NS * D, j->e + t * D);
}
static double bytes_collapse(int64_t T) { return 4.0 * T * D * (NS + 1); }

static void run_collapse_bwd(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    float dw[NS];
    for (int64_t t = r0; t < r1; t++)
        j->f->mhc_collapse_bwd(NS, D, mixes(j, t), j->b + t * NS * D, j->a + t * D, dw, j->d + t * NS * D);
}
static double bytes_collapse_bwd(int64_t T) { return 4.0 * T * D * (3 * NS + 1); }

static void run_pool_fwd(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    for (int64_t b = r0; b < r1; b++)
        j->f->pool_fwd(j->e + b * HD, j->K + b * PN, j->Z + b * PN, PN, HD);
}
static double bytes_pool_fwd(int64_t T) { return 4.0 * rows_blocks(T) * HD * (2 * PN + 1); }

static void run_pool_bwd(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    for (int64_t b = r0; b < r1; b++)
        j->f->pool_bwd(j->dK + b * PN, j->dZ + b * PN, j->e + b * HD, j->K + b * PN, j->Z + b * PN, PN, HD);
}
static double bytes_pool_bwd(int64_t T) { return 4.0 * rows_blocks(T) * HD * (6 * PN + 1); }

static void run_cvt(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    j->f->cvt_bf16_nt(j->h + r0 * HD, j->a + r0 * HD, (r1 - r0) * HD);
}
static double bytes_cvt(int64_t T) { return 6.0 * T * H * HD; }

static void run_copy(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    j->f->copy_nt(j->b + r0 * HD, j->a + r0 * HD, (r1 - r0) * HD);
}
static double bytes_copy(int64_t T) { return 8.0 * T * H * HD; }

/* The LM head's cross-entropy over logits held transposed (model/model.c): blocks of CE_ROWS vocabulary
 * rows of a chunk's columns, min(T, 1 024) tokens (the model's chunk), as many blocks as the operands
 * hold: T / 32 at 1 024 columns and more (a quarter of the vocabulary at 4 096 tokens), else 32. */
enum { CE_ROWS = 256 };
static int64_t ce_cols(int64_t T) { return T < 1024 ? T : 1024; }
static int64_t rows_ce(int64_t T) { return T * H * HD / CE_ROWS / ce_cols(T); }

static void run_ce_fwd(void *arg, int64_t b0, int64_t b1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    const int64_t cols = ce_cols(j->T);
    for (int64_t b = b0; b < b1; b++) /* with keep: exp(l - max) replaces each logit, as the model's */
        j->f->ce_fwd(j->a + b * CE_ROWS * cols, cols, CE_ROWS, cols, 1, j->b + b * cols,
                     (double *)(void *)j->c + b * cols);
}
static double bytes_ce_fwd(int64_t T) { return 8.0 * rows_ce(T) * CE_ROWS * ce_cols(T); }

static void run_ce_grad(void *arg, int64_t b0, int64_t b1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    const int64_t cols = ce_cols(j->T);
    for (int64_t b = b0; b < b1; b++) /* the columns' scales: par's ones */
        j->f->ce_grad(j->h + b * CE_ROWS * cols, cols, j->a + b * CE_ROWS * cols, cols, CE_ROWS, cols,
                      j->par);
}
static double bytes_ce_grad(int64_t T) { return 6.0 * rows_ce(T) * CE_ROWS * ce_cols(T); }

static void run_adamw(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const fused_job *j = arg;
    const trex_adamw_consts k = {.b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .step_size = 1e-4, .bc2_sqrt = 0.3,
                                 .decay = 1.0 - 1e-5, .gscale = 1.0f};
    j->o->adamw(j->a + r0 * HD, j->b + r0 * HD, j->c + r0 * HD, j->d + r0 * HD, (r1 - r0) * HD, &k);
}
static double bytes_adamw(int64_t T) { return 28.0 * T * H * HD; }

/* AdamW's second moments are not negative */
static void prep_adamw(fused_job *j)
{
    for (int64_t i = 0; i < j->T * H * HD; i++)
        j->c[i] = fabsf(j->c[i]);
}

static const fused_case cases[] = {
    {"rmsnorm.fwd", "T x 1024, weighted", rows_tokens, 16, bytes_norm_fwd, run_norm_fwd, NULL},
    {"rmsnorm.bwd", "T x 1024, weighted, accumulating", rows_tokens, 16, bytes_norm_bwd, run_norm_bwd, NULL},
    {"rmsnorm.dw", "T x 1024, columns split", rows_dim, 64, bytes_norm_dw, run_norm_dw, NULL},
    {"sumsq", "T x 4096 (mHC's rho)", rows_tokens, 16, bytes_sumsq, run_sumsq, NULL},
    {"rope", "T x 16 heads x 32 pairs", rows_tokens, 16, bytes_rope, run_rope, NULL},
    {"rms_head_bwd", "T x 16 heads x 512", rows_tokens, 16, bytes_head_bwd, run_head_bwd, NULL},
    {"swiglu.fwd", "6T x 512 -> bf16", rows_experts, 64, bytes_swiglu_fwd, run_swiglu_fwd, NULL},
    {"swiglu.bwd", "6T x 512 -> bf16", rows_experts, 64, bytes_swiglu_bwd, run_swiglu_bwd, NULL},
    {"mhc.post_fwd", "T x 4 x 1024", rows_tokens, 16, bytes_post_fwd, run_post_fwd, NULL},
    {"mhc.post_bwd", "T x 4 x 1024", rows_tokens, 16, bytes_post_bwd, run_post_bwd, NULL},
    {"mhc.collapse", "T x 4 x 1024", rows_tokens, 16, bytes_collapse, run_collapse, NULL},
    {"mhc.collapse_bwd", "T x 4 x 1024", rows_tokens, 16, bytes_collapse_bwd, run_collapse_bwd, NULL},
    {"pool.fwd", "T/4 blocks x 8 own rows x 512", rows_blocks, 16, bytes_pool_fwd, run_pool_fwd, NULL},
    {"pool.bwd", "T/4 blocks x 8 own rows x 512", rows_blocks, 16, bytes_pool_bwd, run_pool_bwd, NULL},
    {"ce.fwd", "logits^T, 256-row blocks", rows_ce, 1, bytes_ce_fwd, run_ce_fwd, NULL},
    {"ce.grad", "logits^T, 256-row blocks -> bf16", rows_ce, 1, bytes_ce_grad, run_ce_grad, NULL},
    {"cvt_bf16_nt", "T x 16 x 512 -> bf16", rows_heads, 64, bytes_cvt, run_cvt, NULL},
    {"copy_nt", "T x 16 x 512", rows_heads, 64, bytes_copy, run_copy, NULL},
    {"adamw", "T x 16 x 512 parameters", rows_heads, 64, bytes_adamw, run_adamw, prep_adamw},
};

/* ---- operands ------------------------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static void fill(float *p, int64_t n, float lo, float hi, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * (float)(mix64(&seed) >> 40) * 0x1p-24f;
}

static void job_free(fused_job *j)
{
    free(j->a), free(j->b), free(j->c), free(j->d), free(j->e);
    free(j->h), free(j->k), free(j->par);
    free(j->K), free(j->Z), free(j->dK), free(j->dZ);
}

/* The per-token small operands, two regions: from par[0], T (NS + NS^2) ones read as RMSNorm's rstd
 * (T), the per-head rstd (T H), mHC's mixes (T (NS + NS^2)) and the cross-entropy's column scales
 * alike, all 1 so that the in-place cases neither grow nor shrink over --reps runs; then the rope
 * tables, cos and sin of random angles (T HALF each), which keep a pair's norm. */
static int64_t par_floats(int64_t T)
{
    _Static_assert(H <= NS + NS * NS, "the per-head rstd fits in the first region");
    return T * (NS + NS * NS) + 2 * T * HALF;
}

/* Allocates the operands for T tokens (job_fill sets them); false when out of memory. */
static bool job_init(fused_job *j, int64_t T)
{
    memset(j, 0, sizeof *j);
    j->T = T;
    const int64_t n = T * H * HD, par = par_floats(T);
    const int64_t nk = rows_blocks(T) * PN; /* the pooling's candidate rows, PN of its own per block */
    float **f[5] = {&j->a, &j->b, &j->c, &j->d, &j->e};
    for (int i = 0; i < 5; i++)
        if (!(*f[i] = malloc((size_t)n * sizeof(float))))
            return false;
    j->h = malloc((size_t)n * 2), j->k = malloc((size_t)n * 2), j->par = malloc((size_t)par * sizeof(float));
    j->K = malloc((size_t)nk * sizeof *j->K), j->Z = malloc((size_t)nk * sizeof *j->Z);
    j->dK = malloc((size_t)nk * sizeof *j->dK), j->dZ = malloc((size_t)nk * sizeof *j->dZ);
    if (!j->h || !j->k || !j->par || !j->K || !j->Z || !j->dK || !j->dZ)
        return false;
    for (int64_t r = 0; r < nk; r++) { /* candidates in c (K) and d (Z, scores), gradients in a and b */
        j->K[r] = j->c + r * HD, j->Z[r] = j->d + r * HD;
        j->dK[r] = j->a + r * HD, j->dZ[r] = j->b + r * HD;
    }
    return true;
}

/* The operands' values, the same before every timing (so that a figure depends neither on the cases
 * run before it nor on --filter, and the level and the reference start from the same values): random
 * in [-1, 1); the small per-token operands as par_floats says; the bf16 outputs zero. */
static void job_fill(fused_job *j)
{
    const int64_t n = j->T * H * HD, ones = j->T * (NS + NS * NS), half = j->T * HALF;
    float *f[5] = {j->a, j->b, j->c, j->d, j->e};
    for (int i = 0; i < 5; i++)
        fill(f[i], n, -1.0f, 1.0f, 0x51 + (uint64_t)i);
    for (int64_t i = 0; i < ones; i++)
        j->par[i] = 1.0f;
    float *cs = j->par + ones, *sn = cs + half;
    fill(cs, half, -3.14159265f, 3.14159265f, 0x77); /* angles, then their cos and sin */
    for (int64_t i = 0; i < half; i++)
        sn[i] = sinf(cs[i]), cs[i] = cosf(cs[i]);
    memset(j->h, 0, (size_t)n * 2), memset(j->k, 0, (size_t)n * 2);
}

/* Median wall seconds of reps runs of case k with table f (optimizer table o) after one warm-up, from
 * freshly filled operands. */
static double time_case(trex_pool *pool, fused_job *j, const fused_case *k, const trex_fused_table *f,
                        const trex_optim_kernels *o, int reps)
{
    double v[1000];
    job_fill(j);
    if (k->prep)
        k->prep(j);
    j->f = f, j->o = o;
    const int64_t rows = k->rows(j->T);
    for (int r = -1; r < reps; r++) {
        const double t0 = trex_wall_s();
        trex_pool_for(pool, rows, k->grain, k->run, j);
        if (r >= 0)
            v[r] = trex_wall_s() - t0;
    }
    return trex_bench_median(v, reps);
}

int trex_cmd_bench_fused(int argc, char **argv)
{
    int64_t threads = 0, reps = 5, tokens = 4096;
    const char *filter = NULL, *isa = NULL;
    bool json = false;
    static const char summary[] =
        "The memory-bound entries of the fused-kernel table (RMSNorm forward, backward and weight "
        "gradient, the sum of squares, RoPE, the per-head RMS backward, SwiGLU in bf16, mHC's post and "
        "collapse with their backward, the compressor's pooling, the LM head's cross-entropy (its forward "
        "over blocks of 256 vocabulary rows of a chunk of min(tokens, 1024) columns, and its bf16 "
        "gradient), the bf16 conversion and the copy written "
        "around the cache) and the optimizer's AdamW pass, at dsv4-bench's shapes for --tokens tokens, "
        "split over the threads in row ranges as the model splits them; at the level's leaf and at the "
        "reference, side by side. Memory bounds them: for each case, median time, the rate at which it "
        "moves the bytes it must read and write (GB/s), % of the copy bandwidth measured in the run "
        "(memcpy over 256 MiB buffers, read + written bytes; operands that stay in the caches, or "
        "writes around them, can pass 100%), the reference's median and the speed-up over it. Operands "
        "take about tokens x 192 KiB (770 MiB at 4096 tokens), and the copy 512 MiB.";
    const trex_opt opts[] = {
        {"threads", TREX_OPT_I64, &threads, "N", "threads (0: TREX_THREADS, else every core)", false},
        {"reps", TREX_OPT_I64, &reps, "R", "runs per figure; the median is printed", false},
        {"tokens", TREX_OPT_I64, &tokens, "T", "tokens of the dsv4-bench shapes", false},
        {"filter", TREX_OPT_STR, &filter, "S", "only cases whose name contains S", false},
        {"isa", TREX_OPT_STR, &isa, "L",
         "level: ref, avx2, avx512f, avx512, amx (default: TREX_ISA cap; above the machine's: its best)", false},
        {"json", TREX_OPT_FLAG, &json, NULL, "print one JSON object", false},
        {0}};
    trex_cmd_info info = {.usage = "trex bench fused [options]", .summary = summary};
    int prc = trex_opts_parse(opts, argc, argv, &info);
    if (prc != TREX_OPTS_OK)
        return prc == TREX_OPTS_HELP ? 0 : 2;
    if (tokens < RATIO || tokens > (1 << 16))
        return trex_cli_error("--tokens must be in [%d, 65536] (got %lld)", RATIO, (long long)tokens) + 1;
    if (reps < 1 || reps > 1000)
        return trex_cli_error("--reps must be in [1, 1000] (got %lld)", (long long)reps) + 1;
    if (threads < 0 || threads > 1024)
        return trex_cli_error("--threads must be in [0, 1024] (got %lld)", (long long)threads) + 1;
    bool any = !filter;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        any |= filter && strstr(cases[i].name, filter) != NULL;
    if (!any)
        return trex_cli_error("--filter %s matches no case", filter);
    trex_err err = {0};
    if (trex_kernels_init(&err) != TREX_OK)
        return trex_cli_error("%s", err.msg);
    trex_isa cap = trex_kernels_isa();
    if (isa && !trex_isa_parse(isa, &cap))
        return trex_cli_error("--isa %s: use ref, avx2, avx512f, avx512 or amx", isa) + 1;
    const trex_fused_table *f = trex_fused_for(cap), *fr = trex_fused_for(TREX_ISA_REF);
    const trex_optim_kernels *o = trex_optim_kernels_for(cap), *orf = trex_optim_kernels_for(TREX_ISA_REF);
    trex_pool *pool;
    if (trex_pool_create_checked(&pool, (int)threads, &err) != TREX_OK)
        return trex_cli_error("%s", err.msg);
    const int nthreads = trex_pool_size(pool);
    fused_job j;
    if (!job_init(&j, tokens)) {
        job_free(&j);
        trex_pool_destroy(pool);
        return trex_cli_error("out of memory for the operands of %lld tokens", (long long)tokens);
    }
    const double copy_gbs = trex_bench_copy_gbs(pool, nthreads, (int)reps);
    char date[32];
    trex_bench_today(date, sizeof date);
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    if (!json) {
        printf("trex bench fused: %s, level %s, %d thread(s), %lld tokens, median of %lld; copy bandwidth "
               "%.1f GB/s\n",
               date, f->name, nthreads, (long long)tokens, (long long)reps, copy_gbs);
        printf("%-18s %-32s %9s %8s %6s | %9s %6s\n", "case", "shape", "ms", "GB/s", "%copy", "ref ms", "x ref");
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const fused_case *k = &cases[i];
        if (filter && !strstr(k->name, filter))
            continue;
        const double s = time_case(pool, &j, k, f, o, (int)reps);
        const double sr = f == fr && o == orf ? s : time_case(pool, &j, k, fr, orf, (int)reps);
        const double bytes = k->bytes(tokens), gbs = bytes / s / 1e9;
        const double pct = copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0;
        if (json) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "name", k->name);
            cJSON_AddStringToObject(c, "shape", k->what);
            cJSON_AddNumberToObject(c, "mbytes", bytes / 1e6);
            cJSON_AddNumberToObject(c, "ms", 1e3 * s);
            cJSON_AddNumberToObject(c, "gbs", gbs);
            cJSON_AddNumberToObject(c, "pct_copy_bw", pct);
            cJSON_AddNumberToObject(c, "ref_ms", 1e3 * sr);
            cJSON_AddNumberToObject(c, "speedup_vs_ref", sr / s);
            cJSON_AddItemToArray(arr, c);
        } else {
            printf("%-18s %-32s %9.3f %8.2f %5.1f%% | %9.3f %6.2f\n", k->name, k->what, 1e3 * s, gbs, pct,
                   1e3 * sr, sr / s);
            fflush(stdout);
        }
    }
    if (json) {
        cJSON_AddStringToObject(root, "date", date);
        cJSON_AddStringToObject(root, "level", f->name);
        cJSON_AddNumberToObject(root, "threads", nthreads);
        cJSON_AddNumberToObject(root, "reps", (double)reps);
        cJSON_AddNumberToObject(root, "tokens", (double)tokens);
        cJSON_AddNumberToObject(root, "copy_gbs", copy_gbs);
        cJSON_AddItemToObject(root, "cases", arr);
        char *out = cJSON_Print(root);
        printf("%s\n", out ? out : "{}");
        free(out);
    } else {
        cJSON_Delete(arr);
    }
    cJSON_Delete(root);
    job_free(&j);
    trex_pool_destroy(pool);
    return 0;
}
