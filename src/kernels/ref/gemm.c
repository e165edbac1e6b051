/* kernels/ref/gemm.c — reference fp32 GEMM, linear layers and RMSNorm.
 *
 * The GEMM is the portable baseline every optimized kernel is tested against. It follows the BLIS
 * structure in plain C: C is cut into column panels of NC columns, handed to threads; inside a panel
 * op(B) is packed once into [K][NR] micro-panels and op(A) into [K][MR] micro-panels, and a register
 * block of MR x NR accumulators (GCC/Clang vector extensions: portable, no ISA flags) sums over k.
 * Every element of C is summed by one thread over k in increasing order, so results do not depend on
 * the number of threads or on the panel sizes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "trex/status.h"

#define MR 4
#define NR 8
#define NC 64 /* columns of C per task; a multiple of NR */

typedef float vnr __attribute__((vector_size(NR * sizeof(float))));

typedef struct gemm_args {
    bool ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    const float *A, *B;
    int64_t lda, ldb, ldc;
    float *C;
} gemm_args;

/* Packs op(B)[0:K, j0:j0+nc] into ceil(nc/NR) micro-panels of [K][NR], zero-padded. */
static void pack_b(const gemm_args *g, int64_t j0, int64_t nc, float *bp)
{
    const int64_t K = g->K;
    for (int64_t jp = 0; jp < nc; jp += NR) {
        float *dst = bp + jp * K;
        int64_t w = nc - jp < NR ? nc - jp : NR;
        for (int64_t k = 0; k < K; k++) {
            for (int64_t j = 0; j < w; j++) {
                int64_t col = j0 + jp + j;
                dst[k * NR + j] = g->tb ? g->B[col * g->ldb + k] : g->B[k * g->ldb + col];
            }
            for (int64_t j = w; j < NR; j++)
                dst[k * NR + j] = 0.0f;
        }
    }
}

/* Packs op(A)[i0:i0+mr, 0:K] into [K][MR], zero-padded. */
static void pack_a(const gemm_args *g, int64_t i0, int64_t mr, float *ap)
{
    const int64_t K = g->K;
    for (int64_t k = 0; k < K; k++) {
        for (int64_t i = 0; i < mr; i++) {
            int64_t row = i0 + i;
            ap[k * MR + i] = g->ta ? g->A[k * g->lda + row] : g->A[row * g->lda + k];
        }
        for (int64_t i = mr; i < MR; i++)
            ap[k * MR + i] = 0.0f;
    }
}

/* acc[MR] (one NR-vector per row) = sum over k of ap[k][i] * bp[k][:]. */
static void micro_kernel(int64_t K, const float *ap, const float *bp, vnr acc[MR])
{
    vnr c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
    for (int64_t k = 0; k < K; k++) {
        vnr b;
        memcpy(&b, bp + k * NR, sizeof b);
        const float *a = ap + k * MR;
        c0 += a[0] * b;
        c1 += a[1] * b;
        c2 += a[2] * b;
        c3 += a[3] * b;
    }
    acc[0] = c0;
    acc[1] = c1;
    acc[2] = c2;
    acc[3] = c3;
}

static void gemm_panels(void *arg, int64_t p0, int64_t p1, int tid)
{
    (void)tid;
    const gemm_args *g = arg;
    const int64_t K = g->K;
    float *bp = malloc((size_t)(K > 0 ? K : 1) * NC * sizeof *bp);
    float *ap = malloc((size_t)(K > 0 ? K : 1) * MR * sizeof *ap);
    TREX_ASSERT(bp != NULL && ap != NULL);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t j0 = p * NC;
        const int64_t nc = g->N - j0 < NC ? g->N - j0 : NC;
        pack_b(g, j0, nc, bp);
        for (int64_t i0 = 0; i0 < g->M; i0 += MR) {
            const int64_t mr = g->M - i0 < MR ? g->M - i0 : MR;
            pack_a(g, i0, mr, ap);
            for (int64_t jp = 0; jp < nc; jp += NR) {
                vnr acc[MR];
                micro_kernel(K, ap, bp + jp * K, acc);
                const int64_t w = nc - jp < NR ? nc - jp : NR;
                for (int64_t i = 0; i < mr; i++) {
                    float *c = g->C + (i0 + i) * g->ldc + j0 + jp;
                    for (int64_t j = 0; j < w; j++)
                        c[j] = g->beta == 0.0f ? g->alpha * acc[i][j]
                                               : g->alpha * acc[i][j] + g->beta * c[j];
                }
            }
        }
    }
    free(ap);
    free(bp);
}

/* Small products (a few rows, or a short inner dimension) skip packing. */
static void gemm_rows_direct(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const gemm_args *g = arg;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = 0; j < g->N; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < g->K; k++) {
                float a = g->ta ? g->A[k * g->lda + i] : g->A[i * g->lda + k];
                float b = g->tb ? g->B[j * g->ldb + k] : g->B[k * g->ldb + j];
                s += a * b;
            }
            float *c = g->C + i * g->ldc + j;
            *c = g->beta == 0.0f ? g->alpha * s : g->alpha * s + g->beta * *c;
        }
}

void trex_gemm(trex_pool *pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
               int64_t ldc)
{
    TREX_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0)
        return;
    gemm_args g = {ta, tb, M, N, K, alpha, beta, A, B, lda, ldb, ldc, C};
    if (M * N * (K > 0 ? K : 1) < 32768) {
        gemm_rows_direct(&g, 0, M, 0);
        return;
    }
    const int64_t panels = (N + NC - 1) / NC;
    /* A panel costs about M*NC*K multiply-adds; give a thread at least ~1M of them. */
    int64_t per = M * NC * (K > 0 ? K : 1);
    trex_pool_for(pool, panels, per >= (1 << 20) ? 1 : (1 << 20) / per, gemm_panels, &g);
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
