/* tests/test_norm.c — RMSNorm and the fixed-lane sum of squares of the fused table (kernels/fused.h,
 * kernels/ref/norm.c, kernels/x86/avx512/norm.c):
 *   - every level available against the reference, bit for bit: sumsq, rmsnorm_fwd (weighted,
 *     weightless, in place), rmsnorm_bwd (weighted, weightless, accumulating or not), rmsnorm_dw (whole
 *     and split columns), on dims 1, 7, 16, 17, 31, 256, 512, 513, 1024 and 0 or more rows;
 *   - sumsq is the optimizer's trex_sumsq (the same lanes and tree) at every level;
 *   - the reference against double precision, with the bounds stated at each check;
 *   - trex_rmsnorm_forward / _backward (the model's entry points) give the same bits with 1 and 3
 *     threads, and the bits of the entries row by row.
 * `test_norm --bench [reps]` times one call of each at dsv4-bench's shapes (N = 4096 rows of 1024, 256
 * and 512, and 65536 rows of 512 for the per-head norm), the old scalar code (HEAD before round 5, kept
 * here for the comparison only) against the entries, one thread, CPU seconds (docs/perf.md). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#define TEST_RNG_SEED 0x243f6a8885a308d3ull
#include "rand_fill.h"
#include "fused_levels.h"
#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "trex/pool.h"

#define U 0x1p-24 /* unit roundoff of fp32 */

/* Level t against the reference r on n rows of dim: every entry bit for bit. */
static void check_level(const trex_fused_table *t, const trex_fused_table *r, int64_t n, int64_t dim)
{
    const int64_t nd = n * dim;
    float *x = xmalloc_f(nd), *w = xmalloc_f(dim), *dy = xmalloc_f(nd), *dx0 = xmalloc_f(nd);
    float *y1 = xmalloc_f(nd), *y2 = xmalloc_f(nd), *s1 = xmalloc_f(n), *s2 = xmalloc_f(n);
    float *dx1 = xmalloc_f(nd), *dx2 = xmalloc_f(nd), *dw1 = xmalloc_f(dim), *dw2 = xmalloc_f(dim);
    fill(x, nd, 3.0f);
    fill(w, dim, 1.5f);
    fill(dy, nd, 1.0f);
    fill(dx0, nd, 1.0f);
    if (nd > 5)
        x[nd - 3] = 0.0f, x[2] = 1e-20f, dy[1] = -0.0f;
    for (int64_t i = 0; i < n; i++) {
        double a = r->sumsq(x + i * dim, dim), b = t->sumsq(x + i * dim, dim);
        CHECK(memcmp(&a, &b, sizeof a) == 0, "%s sumsq dim %lld: %.17g vs %.17g", t->name,
              (long long)dim, a, b);
        int64_t bad = 0;
        double c = trex_sumsq_ref(x + i * dim, dim, &bad);
        CHECK(memcmp(&a, &c, sizeof a) == 0, "sumsq is trex_sumsq (dim %lld)", (long long)dim);
    }
    for (int wl = 0; wl < 2; wl++) {
        const float *wp = wl ? NULL : w;
        r->rmsnorm_fwd(y1, s1, x, wp, n, dim, 1e-6f);
        t->rmsnorm_fwd(y2, s2, x, wp, n, dim, 1e-6f);
        CHECK(same_bits(y1, y2, nd) && same_bits(s1, s2, n), "%s rmsnorm_fwd %s n %lld dim %lld",
              t->name, wl ? "weightless" : "weighted", (long long)n, (long long)dim);
        memcpy(y2, x, (size_t)nd * sizeof(float));
        t->rmsnorm_fwd(y2, NULL, y2, wp, n, dim, 1e-6f);
        CHECK(same_bits(y1, y2, nd), "%s rmsnorm_fwd in place, no rstd, dim %lld", t->name,
              (long long)dim);
        for (int acc = 0; acc < 2; acc++) {
            memcpy(dx1, dx0, (size_t)nd * sizeof(float));
            memcpy(dx2, dx0, (size_t)nd * sizeof(float));
            r->rmsnorm_bwd(dx1, dy, x, wp, s1, n, dim, acc);
            t->rmsnorm_bwd(dx2, dy, x, wp, s1, n, dim, acc);
            CHECK(same_bits(dx1, dx2, nd), "%s rmsnorm_bwd %s acc %d n %lld dim %lld", t->name,
                  wl ? "weightless" : "weighted", acc, (long long)n, (long long)dim);
        }
    }
    fill(dw1, dim, 1.0f);
    memcpy(dw2, dw1, (size_t)dim * sizeof(float));
    r->rmsnorm_dw(dw1, dy, x, s1, n, dim, 0, dim);
    const int64_t cut = dim / 3; /* split at an odd column, as threads might not */
    t->rmsnorm_dw(dw2, dy, x, s1, n, dim, 0, cut);
    t->rmsnorm_dw(dw2, dy, x, s1, n, dim, cut, dim);
    CHECK(same_bits(dw1, dw2, dim), "%s rmsnorm_dw n %lld dim %lld", t->name, (long long)n,
          (long long)dim);
    free(x), free(w), free(dy), free(dx0), free(y1), free(y2), free(s1), free(s2);
    free(dx1), free(dx2), free(dw1), free(dw2);
}

/* The reference against double precision on n rows of dim (weighted or not), with stated bounds. */
static void check_accuracy(const trex_fused_table *r, int64_t n, int64_t dim, bool weighted)
{
    const int64_t nd = n * dim;
    const float eps = 1e-6f;
    float *x = xmalloc_f(nd), *w = xmalloc_f(dim), *dy = xmalloc_f(nd), *y = xmalloc_f(nd);
    float *rs = xmalloc_f(n), *dx = xmalloc_f(nd), *dw = xmalloc_f(dim);
    fill(x, nd, 2.0f);
    fill(w, dim, 1.5f);
    fill(dy, nd, 1.0f);
    const float *wp = weighted ? w : NULL;
    r->rmsnorm_fwd(y, rs, x, wp, n, dim, eps);
    r->rmsnorm_bwd(dx, dy, x, wp, rs, n, dim, 0);
    memset(dw, 0, (size_t)dim * sizeof(float));
    r->rmsnorm_dw(dw, dy, x, rs, n, dim, 0, dim);
    double worst_y = 0.0, worst_dx = 0.0, worst_dw = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * dim, *dyr = dy + i * dim;
        double ss = 0.0, dot = 0.0;
        for (int64_t k = 0; k < dim; k++) {
            const double wk = wp ? w[k] : 1.0;
            ss += (double)xr[k] * xr[k];
            dot += (double)dyr[k] * wk * xr[k];
        }
        /* sumsq: the double lanes against a sequential double sum, each within dim 2^-53: (2 dim + 4) 2^-53 */
        const double s = r->sumsq(xr, dim);
        CHECK(fabs(s - ss) <= (double)(2 * dim + 4) * 0x1p-53 * ss, "sumsq dim %lld: %.17g vs %.17g",
              (long long)dim, s, ss);
        /* rstd: one rounding of a double to fp32 (the double error is ~dim 2^-53): 2^-24 relative
         * plus slack, bound 2 U |r64| */
        const double r64 = 1.0 / sqrt(ss / (double)dim + (double)eps);
        CHECK(fabs(rs[i] - r64) <= 2.0 * U * r64, "rstd dim %lld: %.9g vs %.17g", (long long)dim,
              (double)rs[i], r64);
        /* y = (x r) w: r's rounding plus two products, 3 U relative; bound 4 U |y64| */
        for (int64_t k = 0; k < dim; k++) {
            const double y64 = (double)xr[k] * r64 * (wp ? w[k] : 1.0);
            const double e = fabs(y[i * dim + k] - y64) / (4.0 * U * fabs(y64) + 1e-300);
            worst_y = e > worst_y ? e : worst_y;
        }
        /* dx = r (g - x c), c = r^2 dot / dim with the fp32 rstd given: the terms g and x c carry a
         * few roundings each (g: 1, c: 3 plus the double dot, x c: 1 more, the difference and r: 2);
         * bound 8 U r (|g| + |x c|) + U |dx64| */
        const double rr = rs[i], c64 = rr * rr * dot / (double)dim;
        for (int64_t k = 0; k < dim; k++) {
            const double g = (double)dyr[k] * (wp ? w[k] : 1.0);
            const double dx64 = rr * (g - xr[k] * c64);
            const double bound = 8.0 * U * rr * (fabs(g) + fabs(xr[k] * c64)) + U * fabs(dx64);
            const double e = fabs(dx[i * dim + k] - dx64) / (bound + 1e-300);
            worst_dx = e > worst_dx ? e : worst_dx;
        }
    }
    /* dw: n fp32 additions in order of terms with two roundings each: bound (n + 2) U sum |terms| */
    for (int64_t k = 0; k < dim; k++) {
        double s = 0.0, a = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double tk = (double)dy[i * dim + k] * x[i * dim + k] * rs[i];
            s += tk;
            a += fabs(tk);
        }
        const double e = fabs(dw[k] - s) / ((double)(n + 2) * U * a + 1e-300);
        worst_dw = e > worst_dw ? e : worst_dw;
    }
    CHECK(worst_y <= 1.0, "y vs double, dim %lld: %.3g of the bound", (long long)dim, worst_y);
    CHECK(worst_dx <= 1.0, "dx vs double, dim %lld: %.3g of the bound", (long long)dim, worst_dx);
    CHECK(worst_dw <= 1.0, "dw vs double, dim %lld: %.3g of the bound", (long long)dim, worst_dw);
    printf("  dim %4lld %s: worst y %.3f, dx %.3f, dw %.3f of the bound\n", (long long)dim,
           weighted ? "weighted  " : "weightless", worst_y, worst_dx, worst_dw);
    free(x), free(w), free(dy), free(y), free(rs), free(dx), free(dw);
}

/* trex_rmsnorm_forward / _backward: the entries' bits row by row, with 1 and 3 threads. */
static void check_pool(trex_pool *p1, trex_pool *p3, int64_t n, int64_t dim, bool weighted)
{
    const int64_t nd = n * dim;
    const trex_fused_table *f = trex_fused();
    float *x = xmalloc_f(nd), *w = xmalloc_f(dim), *dy = xmalloc_f(nd);
    float *y[3], *s[3], *dx[3], *dw[3];
    for (int k = 0; k < 3; k++)
        y[k] = xmalloc_f(nd), s[k] = xmalloc_f(n), dx[k] = xmalloc_f(nd), dw[k] = xmalloc_f(dim);
    fill(x, nd, 1.0f);
    fill(w, dim, 1.0f);
    fill(dy, nd, 1.0f);
    const float *wp = weighted ? w : NULL;
    for (int64_t i = 0; i < n; i++)
        f->rmsnorm_fwd(y[0] + i * dim, s[0] + i, x + i * dim, wp, 1, dim, 1e-6f);
    trex_rmsnorm_forward(p1, y[1], s[1], x, wp, n, dim, 1e-6f);
    trex_rmsnorm_forward(p3, y[2], s[2], x, wp, n, dim, 1e-6f);
    for (int k = 1; k < 3; k++)
        CHECK(same_bits(y[0], y[k], nd) && same_bits(s[0], s[k], n),
              "trex_rmsnorm_forward, %d thread(s), n %lld dim %lld", k == 1 ? 1 : 3, (long long)n,
              (long long)dim);
    for (int k = 0; k < 3; k++) {
        for (int64_t i = 0; i < nd; i++)
            dx[k][i] = 0.25f;
        for (int64_t i = 0; i < dim; i++)
            dw[k][i] = 0.5f;
    }
    f->rmsnorm_bwd(dx[0], dy, x, wp, s[0], n, dim, 1);
    if (weighted)
        f->rmsnorm_dw(dw[0], dy, x, s[0], n, dim, 0, dim);
    trex_rmsnorm_backward(p1, dx[1], weighted ? dw[1] : NULL, dy, x, wp, s[0], n, dim, true);
    trex_rmsnorm_backward(p3, dx[2], weighted ? dw[2] : NULL, dy, x, wp, s[0], n, dim, true);
    for (int k = 1; k < 3; k++)
        CHECK(same_bits(dx[0], dx[k], nd) && same_bits(dw[0], dw[k], dim),
              "trex_rmsnorm_backward, %d thread(s), n %lld dim %lld", k == 1 ? 1 : 3,
              (long long)n, (long long)dim);
    free(x), free(w), free(dy);
    for (int k = 0; k < 3; k++)
        free(y[k]), free(s[k]), free(dx[k]), free(dw[k]);
}

/* ---- benchmark ---------------------------------------------------------------------------------- */

/* HEAD's scalar RMSNorm before round 5 (kernels/ref/gemm.c), for the comparison only. */
static void old_fwd(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t dim,
                    float eps)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        double ss = 0.0;
        for (int64_t i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float rs = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        if (rstd)
            rstd[r] = rs;
        for (int64_t i = 0; i < dim; i++)
            yr[i] = xr[i] * rs * (w ? w[i] : 1.0f);
    }
}

static void old_bwd(float *dx, const float *dy, const float *x, const float *w, const float *rstd,
                    int64_t n, int64_t dim, int acc)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim, *dyr = dy + r * dim;
        float *dxr = dx + r * dim;
        const float rs = rstd[r];
        double dot = 0.0;
        for (int64_t i = 0; i < dim; i++)
            dot += (double)dyr[i] * (w ? w[i] : 1.0f) * xr[i];
        const float c = (float)(dot / (double)dim) * rs * rs;
        for (int64_t i = 0; i < dim; i++) {
            float v = rs * (dyr[i] * (w ? w[i] : 1.0f) - xr[i] * c);
            dxr[i] = acc ? dxr[i] + v : v;
        }
    }
}

static void old_dw(float *dw, const float *dy, const float *x, const float *rstd, int64_t n,
                   int64_t dim)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim, *dyr = dy + r * dim;
        for (int64_t i = 0; i < dim; i++)
            dw[i] += dyr[i] * xr[i] * rstd[r];
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

#define BENCH_MAX_REPS 101

static int bench(int reps)
{
    const trex_fused_table *f = trex_fused();
    const struct { int64_t n, dim; const char *what; bool w; } shapes[] = {
        {4096, 1024, "attn/ffn norm (d)", true},
        {4096, 256, "q_norm (q_lora_rank)", true},
        {4096, 512, "kv_norm (head_dim)", true},
        {65536, 512, "per-head q norm", false},
        {4096, 4096, "mHC rho (n d), sumsq", false},
    };
    printf("one thread, CPU seconds per call (median of %d), fused level %s\n", reps, f->name);
    printf("%-24s %6s %5s | %9s %9s %6s | %9s %9s %6s | %9s %9s %6s\n", "shape", "rows", "dim",
           "fwd old", "fwd new", "x", "bwd old", "bwd new", "x", "dw old", "dw new", "x");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t n = shapes[s].n, dim = shapes[s].dim, nd = n * dim;
        float *x = xmalloc_f(nd), *w = xmalloc_f(dim), *dy = xmalloc_f(nd), *y = xmalloc_f(nd);
        float *rs = xmalloc_f(n), *dx = xmalloc_f(nd), *dw = xmalloc_f(dim);
        fill(x, nd, 1.0f), fill(w, dim, 1.0f), fill(dy, nd, 1.0f), fill(dx, nd, 1.0f);
        memset(dw, 0, (size_t)dim * sizeof(float));
        const float *wp = shapes[s].w ? w : NULL;
        double t[6][BENCH_MAX_REPS];
        volatile double sink = 0.0;
        for (int k = 0; k < reps; k++) {
            double t0 = cpu_now();
            if (dim == 4096) { /* the rho: one sum of squares per token */
                double a = 0.0;
                for (int64_t i = 0; i < n; i++) {
                    double ss = 0.0;
                    const float *xr = x + i * dim;
                    for (int64_t j = 0; j < dim; j++)
                        ss += (double)xr[j] * (double)xr[j];
                    a += ss;
                }
                sink = sink + a;
            } else
                old_fwd(y, rs, x, wp, n, dim, 1e-6f);
            double t1 = cpu_now();
            if (dim == 4096) {
                double a = 0.0;
                for (int64_t i = 0; i < n; i++)
                    a += f->sumsq(x + i * dim, dim);
                sink = sink + a;
            } else
                f->rmsnorm_fwd(y, rs, x, wp, n, dim, 1e-6f);
            double t2 = cpu_now();
            if (dim != 4096) {
                old_bwd(dx, dy, x, wp, rs, n, dim, 1);
            }
            double t3 = cpu_now();
            if (dim != 4096)
                f->rmsnorm_bwd(dx, dy, x, wp, rs, n, dim, 1);
            double t4 = cpu_now();
            if (wp)
                old_dw(dw, dy, x, rs, n, dim);
            double t5 = cpu_now();
            if (wp)
                f->rmsnorm_dw(dw, dy, x, rs, n, dim, 0, dim);
            double t6 = cpu_now();
            t[0][k] = t1 - t0, t[1][k] = t2 - t1, t[2][k] = t3 - t2, t[3][k] = t4 - t3;
            t[4][k] = t5 - t4, t[5][k] = t6 - t5;
        }
        for (int j = 0; j < 6; j++)
            qsort(t[j], (size_t)reps, sizeof(double), cmp_double);
        double m[6];
        for (int j = 0; j < 6; j++)
            m[j] = t[j][reps / 2];
        printf("%-24s %6lld %5lld", shapes[s].what, (long long)n, (long long)dim);
        const bool ran[3] = {true, dim != 4096, wp != NULL}; /* the rho: sumsq only; dw: weighted */
        for (int j = 0; j < 3; j++)
            if (ran[j])
                printf(" | %9.5f %9.5f %6.2f", m[2 * j], m[2 * j + 1], m[2 * j] / m[2 * j + 1]);
            else
                printf(" | %9s %9s %6s", "-", "-", "-");
        printf("\n");
        free(x), free(w), free(dy), free(y), free(rs), free(dx), free(dw);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--bench")) {
        char *end = NULL;
        long reps = argc >= 3 ? strtol(argv[2], &end, 10) : 7;
        if (argc >= 3 && (!end || *end)) {
            fprintf(stderr, "test_norm --bench [reps]: reps must be a number\n");
            return 2;
        }
        return bench(reps < 1 ? 1 : reps > BENCH_MAX_REPS ? BENCH_MAX_REPS : (int)reps);
    }
    const trex_fused_table *ref = trex_fused_for(TREX_ISA_REF);
    CHECK(ref->isa == TREX_ISA_REF, "the ref cap gives the reference table");
    const trex_fused_table *seen[TREX_ISA_COUNT];
    const int nseen = fused_levels(ref, seen);
    const int64_t dims[] = {1, 7, 16, 17, 31, 256, 512, 513, 1024};
    const int64_t rows[] = {0, 1, 3, 37};
    for (int k = 0; k < nseen; k++) {
        printf("level %s\n", seen[k]->name);
        double z = seen[k]->sumsq(NULL, 0);
        CHECK(z == 0.0 && !signbit(z), "%s sumsq of nothing is +0", seen[k]->name);
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
            for (size_t j = 0; j < sizeof rows / sizeof rows[0]; j++)
                check_level(seen[k], ref, rows[j], dims[i]);
        check_level(seen[k], ref, 70, 4096); /* the mHC rho's n d; dw rows in several chunks */
    }
    /* a NaN or infinity in a row reaches that row only */
    for (int k = 0; k < nseen; k++) {
        float x[3 * 17], y[3 * 17], rs[3];
        fill(x, 51, 1.0f);
        x[17 + 5] = NAN;
        seen[k]->rmsnorm_fwd(y, rs, x, NULL, 3, 17, 1e-6f);
        CHECK(isfinite(rs[0]) && isnan(rs[1]) && isfinite(rs[2]), "%s: a NaN stays in its row",
              seen[k]->name);
    }
    printf("reference vs double\n");
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        check_accuracy(ref, 9, dims[i], true);
        check_accuracy(ref, 9, dims[i], false);
    }
    check_accuracy(ref, 300, 64, true); /* dw over many rows */
    trex_pool *p1 = trex_pool_create(1), *p3 = trex_pool_create(3);
    CHECK(p1 && p3, "pools");
    if (p1 && p3) {
        check_pool(p1, p3, 37, 17, true);
        check_pool(p1, p3, 37, 17, false);
        check_pool(p1, p3, 300, 513, true);
        check_pool(p1, p3, 5000, 8, true); /* more rows than one task's grain */
        check_pool(p1, p3, 40, 1024, false);
    }
    trex_pool_destroy(p1);
    trex_pool_destroy(p3);
    return check_summary();
}
