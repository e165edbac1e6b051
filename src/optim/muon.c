/* optim/muon.c — hybrid Newton–Schulz orthogonalisation (MODEL_SPEC §9) on the reference fp32 GEMM.
 *
 * X0 = M / ||M||_F, then X <- aX + b(XX^T)X + c(XX^T)^2 X: 8 iterations with (3.4445, -4.7750, 2.0315),
 * which push every singular value above ~1e-4 of the norm into roughly [0.7, 1.2] quickly, then 2 with
 * (2, -1.5, 0.5), which converge them to 1 (p(1) = 1, p'(1) = 0). The Gram matrix is taken on the
 * small side: for a wide X [n, m] (n <= m) A = XX^T [n, n] and X <- aX + BX; for a tall one A = X^TX
 * [m, m] and X <- aX + XB (B = bA + cA^2 is symmetric, so this is the transpose of the wide form).
 * Every GEMM sums in a fixed order, so the result does not depend on the pool.
 *
 * Precision: with TREX_NS_FP32 every product is the fp32 reference GEMM; with TREX_NS_BF16 (the default
 * of the optimizer) every product rounds its operands to bf16 and sums in fp32 (the bf16 GEMM with fp32
 * operands, AMX where present), while X, A, B and the aX + ... sums stay fp32; the two symmetric
 * products (A and A^2) compute only their lower triangle and mirror it (trex_gemm_syrk), which cuts a
 * 512 x 1024 matrix's FLOPs by 28%, and aX and bA are the products' beta terms (a problem's D), so no
 * pass writes them first. Measured accuracy and speed: docs/optim.md. */
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "trex/optim.h"
#include "trex/status.h"

#define NS_ITERS 10
#define NS_FAST 8 /* iterations with the fast (non-convergent) coefficients */

static const float ns_fast[3] = {3.4445f, -4.7750f, 2.0315f};
static const float ns_final[3] = {2.0f, -1.5f, 0.5f};

static size_t align16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

size_t trex_muon_workspace(int64_t n, int64_t m)
{
    TREX_ASSERT(n >= 0 && m >= 0);
    const size_t r = (size_t)(n < m ? n : m);
    return align16((size_t)n * (size_t)m) + 2 * align16(r * r);
}

/* The products below write C[M, N] (contiguous) = alpha (product) + beta D, D another contiguous
 * [M, N] or NULL (beta 0). The bf16 GEMMs read D in their epilogue; the fp32 reference GEMM has no D,
 * so there C = beta D comes first (the scale kernel) and the product is added with beta 1. */
static float beta_first(trex_muon_ns prec, float *C, const float *D, int64_t numel, float beta)
{
    if (prec == TREX_NS_BF16 || !D)
        return beta;
    trex_optim_kernels_get()->scale(C, D, beta, numel);
    return 1.0f;
}

/* C = alpha op(A) op(B) + beta D in the chosen precision. */
static void mm(trex_pool *pool, trex_muon_ns prec, trex_gemm_ws *gws, bool ta, bool tb, int64_t M, int64_t N,
               int64_t K, float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
               const float *D, float *C)
{
    beta = beta_first(prec, C, D, M * N, beta);
    if (prec == TREX_NS_BF16) {
        const trex_gemm_problem p = {M, N, K, A, lda, B, ldb, C, N, D, N};
        trex_gemm_grouped(pool, gws, TREX_F32, ta, tb, alpha, beta, &p, 1);
    } else {
        trex_gemm(pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
    }
}

/* A symmetric product C[r,r] = alpha op(X) op(X)^T + beta D, op(X) = X [r, k] or (trans) X^T of an X
 * stored [k, r] (row stride ldx): the Gram matrix X X^T or X^T X, and A^2 = A A^T. In bf16 only its
 * lower triangle is computed (trex_gemm_syrk): half the FLOPs. */
static void gram(trex_pool *pool, trex_muon_ns prec, trex_gemm_ws *gws, bool trans, int64_t r, int64_t k,
                 float alpha, const float *X, int64_t ldx, float beta, const float *D, float *C)
{
    beta = beta_first(prec, C, D, r * r, beta);
    if (prec == TREX_NS_BF16)
        trex_gemm_syrk(pool, gws, TREX_F32, trans, r, k, alpha, X, ldx, beta, C, r, D, r);
    else
        trex_gemm(pool, trans, !trans, r, r, k, alpha, X, ldx, X, ldx, beta, C, r);
}

void trex_muon_orthogonalize(trex_pool *pool, float *x, int64_t n, int64_t m, float *ws)
{
    trex_muon_orthogonalize_ex(pool, x, n, m, ws, TREX_NS_FP32, NULL);
}

void trex_muon_orthogonalize_ex(trex_pool *pool, float *x, int64_t n, int64_t m, float *ws, trex_muon_ns prec,
                                trex_gemm_ws *gws)
{
    TREX_ASSERT(x && ws && n >= 0 && m >= 0);
    TREX_ASSERT(prec == TREX_NS_BF16 || prec == TREX_NS_FP32);
    const int64_t numel = n * m;
    const trex_optim_kernels *ok = trex_optim_kernels_get();
    int64_t nonfinite; /* not needed: a NaN or Inf makes ss NaN or Inf, and the step checked the gradients */
    const double ss = ok->sumsq(x, numel, &nonfinite);
    if (!(ss > 0.0))
        return; /* zero (or empty) stays as it is */
    ok->muon_normalize(x, numel, sqrt(ss));

    const bool tall = n > m;
    const int64_t r = tall ? m : n;
    float *y = ws;
    float *A = y + align16((size_t)numel);
    float *B = A + align16((size_t)(r * r));
    float *cur = x, *nxt = y;
    for (int it = 0; it < NS_ITERS; it++) {
        const float *c3 = it < NS_FAST ? ns_fast : ns_final;
        gram(pool, prec, gws, tall, r, tall ? n : m, 1.0f, cur, m, 0.0f, NULL, A); /* A = X X^T or X^T X */
        gram(pool, prec, gws, false, r, r, c3[2], A, r, c3[1], A, B); /* B = bA + cA^2, A^2 = A A^T */
        if (tall) /* Y = aX + X B */
            mm(pool, prec, gws, false, false, n, m, m, 1.0f, cur, m, B, r, c3[0], cur, nxt);
        else /* Y = aX + B X */
            mm(pool, prec, gws, false, false, n, m, n, 1.0f, B, r, cur, m, c3[0], cur, nxt);
        float *t = cur;
        cur = nxt;
        nxt = t;
    }
    TREX_ASSERT(cur == x); /* an even number of iterations ends in x */
}
