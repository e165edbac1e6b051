/* kernels/ref/gemm.c — reference fp32 GEMM, linear layers and RMSNorm.
 *
 * The GEMM is the portable baseline every optimized kernel is tested against. It follows the BLIS
 * structure in plain C: C is cut into column panels of NC columns, handed to threads; inside a panel
 * op(B) is packed once into [K][NR] micro-panels and op(A) into [K][MR] micro-panels, and the level's
 * micro-kernel (dispatch table: the plain-C one below, or AVX-512) sums an MR x NR block over k.
 * Every element of C is summed by one thread over k in increasing order, a rounded product then a
 * rounded add, so results do not depend on the number of threads, the panel sizes or the level.
 * RMSNorm (at the end) hands its rows to the fused table's entries (kernels/ref/norm.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dispatch.h"
#include "kernels/fused.h"
#include "kernels/gemm_panels.h"
#include "kernels/kernels.h"
#include "trex/status.h"

#define MR TREX_F32_MR
#define NR TREX_F32_NR
#define NC 256 /* columns of C per task; a multiple of NR */
#define VR 4  /* the reference micro-kernel works in sub-blocks of VR rows x VN columns */
#define VN 8

typedef float vnr __attribute__((vector_size(VN * sizeof(float))));

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

/* The reference micro-kernel (dispatch.h, trex_gemm_f32_ukr_fn): the MR x NR block in sub-blocks of
 * VR x VN, each summed over the whole of K (the order of each element is the same for any sub-block
 * size; only register use differs). */
void trex_gemm_f32_ukr_ref(int64_t K, const float *ap, const float *bp, float *acc)
{
    for (int64_t i0 = 0; i0 < MR; i0 += VR)
        for (int64_t j0 = 0; j0 < NR; j0 += VN) {
            vnr c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
            for (int64_t k = 0; k < K; k++) {
                vnr b;
                memcpy(&b, bp + k * NR + j0, sizeof b);
                const float *a = ap + k * MR + i0;
                c0 += a[0] * b;
                c1 += a[1] * b;
                c2 += a[2] * b;
                c3 += a[3] * b;
            }
            memcpy(acc + (i0 + 0) * NR + j0, &c0, sizeof c0);
            memcpy(acc + (i0 + 1) * NR + j0, &c1, sizeof c1);
            memcpy(acc + (i0 + 2) * NR + j0, &c2, sizeof c2);
            memcpy(acc + (i0 + 3) * NR + j0, &c3, sizeof c3);
        }
}

static void gemm_panels(void *arg, int64_t p0, int64_t p1, int tid)
{
    (void)tid;
    const gemm_args *g = arg;
    const int64_t K = g->K;
    const trex_gemm_f32_ukr_fn ukr = trex_kernels_table()->gemm_f32_ukr;
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
                float acc[MR * NR];
                ukr(K, ap, bp + jp * K, acc);
                const int64_t w = nc - jp < NR ? nc - jp : NR;
                for (int64_t i = 0; i < mr; i++) {
                    float *c = g->C + (i0 + i) * g->ldc + j0 + jp;
                    const float *s = acc + i * NR;
                    for (int64_t j = 0; j < w; j++)
                        c[j] = g->beta == 0.0f ? g->alpha * s[j] : g->alpha * s[j] + g->beta * c[j];
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

/* ---- RMSNorm: rows over the pool, each row by the fused table's entries (kernels/ref/norm.c and its
 * AVX-512 leaves), whose sums run in fixed lanes: the same bits at every level and any thread count. */

typedef struct norm_args {
    const trex_fused_table *f;
    float *y, *rstd, *dx, *dw;
    const float *x, *w, *dy, *crstd;
    int64_t n, dim;
    float eps;
    bool acc;
} norm_args;

/* rows per task: about 4096 floats of work at least */
static int64_t norm_grain(int64_t dim)
{
    return dim >= 4096 ? 1 : 4096 / (dim > 0 ? dim : 1);
}

static void rmsnorm_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const norm_args *a = arg;
    a->f->rmsnorm_fwd(a->y + r0 * a->dim, a->rstd ? a->rstd + r0 : NULL, a->x + r0 * a->dim, a->w,
                      r1 - r0, a->dim, a->eps);
}

void trex_rmsnorm_forward(trex_pool *pool, float *y, float *rstd, const float *x, const float *w,
                          int64_t n, int64_t dim, float eps)
{
    norm_args a = {.f = trex_fused(), .y = y, .rstd = rstd, .x = x, .w = w, .dim = dim, .eps = eps};
    trex_pool_for(pool, n, norm_grain(dim), rmsnorm_rows, &a);
}

/* y_i = x_i r w_i, r = (mean x^2 + eps)^-1/2:
 * dx_i = r (g_i - x_i r^2 mean_j(g_j x_j)), with g = dy * w. */
static void rmsnorm_bwd_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const norm_args *a = arg;
    a->f->rmsnorm_bwd(a->dx + r0 * a->dim, a->dy + r0 * a->dim, a->x + r0 * a->dim, a->w,
                      a->crstd + r0, r1 - r0, a->dim, a->acc);
}

/* dw over the columns of the 16-wide units [u0, u1): each column summed over all rows in order */
static void rmsnorm_dw_cols(void *arg, int64_t u0, int64_t u1, int tid)
{
    (void)tid;
    const norm_args *a = arg;
    a->f->rmsnorm_dw(a->dw, a->dy, a->x, a->crstd, a->n, a->dim, u0 * 16,
                     u1 * 16 < a->dim ? u1 * 16 : a->dim);
}

void trex_rmsnorm_backward(trex_pool *pool, float *dx, float *dw, const float *dy, const float *x,
                           const float *w, const float *rstd, int64_t n, int64_t dim, bool acc)
{
    norm_args a = {.f = trex_fused(), .dx = dx, .dw = dw, .x = x, .w = w, .dy = dy, .crstd = rstd,
                   .n = n, .dim = dim, .acc = acc};
    if (dx)
        trex_pool_for(pool, n, norm_grain(dim), rmsnorm_bwd_rows, &a);
    /* dw_i = sum_r dy_ri x_ri rstd_r, each column over the rows in order by one thread; a unit of
     * 16 columns costs about n*16 multiply-adds, give a thread at least ~64K of them */
    if (dw && n > 0)
        trex_pool_for(pool, (dim + 15) / 16, n >= 4096 ? 1 : 4096 / n, rmsnorm_dw_cols, &a);
}
