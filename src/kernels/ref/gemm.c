/* kernels/ref/gemm.c — reference fp32 GEMM, linear layers and RMSNorm.
 *
 * The GEMM is the portable baseline every optimized kernel is tested against: rows of C are split
 * across threads; each C element sums over k in increasing order, so results do not depend on the
 * thread count. Operands are copied into a transposed/contiguous panel when that turns the inner loop
 * into a unit-stride dot product or axpy the compiler can vectorize. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "trex/status.h"

typedef struct gemm_args {
    bool ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    const float *A, *B;
    int64_t lda, ldb, ldc;
    float *C;
} gemm_args;

/* Rows [i0, i1) of C. For op(B) = B (B is [K,N]) the inner loop is an axpy over a row of B;
 * for op(B) = B^T (B is [N,K]) it is a dot product of two K-vectors. */
static void gemm_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const gemm_args *g = arg;
    const int64_t N = g->N, K = g->K;
    float *arow = NULL;
    if (g->ta) {
        arow = malloc((size_t)(K > 0 ? K : 1) * sizeof *arow);
        TREX_ASSERT(arow != NULL);
    }
    float *acc = NULL;
    if (!g->tb) {
        acc = malloc((size_t)(N > 0 ? N : 1) * sizeof *acc);
        TREX_ASSERT(acc != NULL);
    }
    for (int64_t i = i0; i < i1; i++) {
        const float *a;
        if (g->ta) {
            for (int64_t k = 0; k < K; k++)
                arow[k] = g->A[k * g->lda + i];
            a = arow;
        } else {
            a = g->A + i * g->lda;
        }
        float *c = g->C + i * g->ldc;
        if (g->tb) {
            for (int64_t j = 0; j < N; j++) {
                const float *b = g->B + j * g->ldb;
                float s = 0.0f;
                for (int64_t k = 0; k < K; k++)
                    s += a[k] * b[k];
                c[j] = g->beta == 0.0f ? g->alpha * s : g->alpha * s + g->beta * c[j];
            }
        } else {
            memset(acc, 0, (size_t)N * sizeof *acc);
            for (int64_t k = 0; k < K; k++) {
                const float av = a[k];
                const float *b = g->B + k * g->ldb;
                for (int64_t j = 0; j < N; j++)
                    acc[j] += av * b[j];
            }
            for (int64_t j = 0; j < N; j++)
                c[j] = g->beta == 0.0f ? g->alpha * acc[j] : g->alpha * acc[j] + g->beta * c[j];
        }
    }
    free(arow);
    free(acc);
}

void trex_gemm(trex_pool *pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
               int64_t ldc)
{
    TREX_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0)
        return;
    gemm_args g = {ta, tb, M, N, K, alpha, beta, A, B, lda, ldb, ldc, C};
    /* A row of C costs about N*K multiply-adds; aim for chunks of at least ~256K of them. */
    int64_t work = N * (K > 0 ? K : 1);
    int64_t grain = work >= 262144 ? 1 : 262144 / work;
    trex_pool_for(pool, M, grain, gemm_rows, &g);
}

void trex_linear_forward(trex_pool *pool, float *y, const float *x, const float *W, int64_t n,
                         int64_t in, int64_t out)
{
    trex_gemm(pool, false, true, n, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
}

void trex_linear_backward(trex_pool *pool, float *dx, float *dW, const float *dy, const float *x,
                          const float *W, int64_t n, int64_t in, int64_t out, bool acc)
{
    if (dx)
        trex_gemm(pool, false, false, n, in, out, 1.0f, dy, out, W, in, acc ? 1.0f : 0.0f, dx, in);
    if (dW)
        trex_gemm(pool, true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dW, in);
}

typedef struct norm_args {
    float *y, *rstd;
    const float *x, *w;
    int64_t dim;
    float eps;
} norm_args;

static void rmsnorm_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const norm_args *a = arg;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = a->x + r * a->dim;
        float *y = a->y + r * a->dim;
        double ss = 0.0;
        for (int64_t i = 0; i < a->dim; i++)
            ss += (double)x[i] * x[i];
        float rs = (float)(1.0 / sqrt(ss / (double)a->dim + (double)a->eps));
        if (a->rstd)
            a->rstd[r] = rs;
        for (int64_t i = 0; i < a->dim; i++)
            y[i] = x[i] * rs * (a->w ? a->w[i] : 1.0f);
    }
}

void trex_rmsnorm_forward(trex_pool *pool, float *y, float *rstd, const float *x, const float *w,
                          int64_t n, int64_t dim, float eps)
{
    norm_args a = {y, rstd, x, w, dim, eps};
    trex_pool_for(pool, n, dim >= 4096 ? 1 : 4096 / (dim > 0 ? dim : 1), rmsnorm_rows, &a);
}

typedef struct norm_bwd_args {
    float *dx;
    const float *dy, *x, *w, *rstd;
    int64_t dim;
    bool acc;
} norm_bwd_args;

/* y_i = x_i r w_i, r = (mean x^2 + eps)^-1/2:
 * dx_i = r (g_i - x_i r^2 mean_j(g_j x_j)), with g = dy * w. */
static void rmsnorm_bwd_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const norm_bwd_args *a = arg;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = a->x + r * a->dim, *dy = a->dy + r * a->dim;
        float *dx = a->dx + r * a->dim;
        const float rs = a->rstd[r];
        double dot = 0.0;
        for (int64_t i = 0; i < a->dim; i++)
            dot += (double)dy[i] * (a->w ? a->w[i] : 1.0f) * x[i];
        const float c = (float)(dot / (double)a->dim) * rs * rs;
        for (int64_t i = 0; i < a->dim; i++) {
            float v = rs * (dy[i] * (a->w ? a->w[i] : 1.0f) - x[i] * c);
            dx[i] = a->acc ? dx[i] + v : v;
        }
    }
}

void trex_rmsnorm_backward(trex_pool *pool, float *dx, float *dw, const float *dy, const float *x,
                           const float *w, const float *rstd, int64_t n, int64_t dim, bool acc)
{
    if (dx) {
        norm_bwd_args a = {dx, dy, x, w, rstd, dim, acc};
        trex_pool_for(pool, n, dim >= 4096 ? 1 : 4096 / (dim > 0 ? dim : 1), rmsnorm_bwd_rows, &a);
    }
    if (dw) {
        /* dw_i = sum_r dy_ri x_ri rstd_r, summed over rows in order (one thread per column block). */
        for (int64_t r = 0; r < n; r++) {
            const float *xr = x + r * dim, *dyr = dy + r * dim;
            for (int64_t i = 0; i < dim; i++)
                dw[i] += dyr[i] * xr[i] * rstd[r];
        }
    }
}
