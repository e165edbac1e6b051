/* kernels/kernels.h — numerical kernels shared by the model layers.
 *
 * Every entry has a plain-C reference (kernels/ref/); optimized variants (kernels/x86/) will be chosen
 * by a dispatch table filled once at start. All matrices are row-major float32 with explicit leading
 * dimensions. Results are deterministic: each output element is computed by one thread in a fixed
 * order, so they do not depend on the number of threads. */
#ifndef TREX_KERNELS_H
#define TREX_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "trex/pool.h"

/* C[M,N] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
 * A is [M,K] (lda >= K) or, with ta, stored as [K,M] (lda >= M); B is [K,N] (ldb >= N) or, with tb,
 * stored as [N,K] (ldb >= K). beta == 0 ignores the old C (NaNs included). pool may be NULL. */
void trex_gemm(trex_pool *pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
               int64_t ldc);

/* Linear layer, torch convention W = [out, in]:
 *   forward   y[n,out]  = x[n,in] W^T            (beta 0: y is overwritten)
 *   backward  dx[n,in] (+)= dy[n,out] W          (accumulate when acc is true)
 *             dW[out,in] += dy^T x               (always accumulates into dW) */
void trex_linear_forward(trex_pool *pool, float *y, const float *x, const float *W, int64_t n,
                         int64_t in, int64_t out);
void trex_linear_backward(trex_pool *pool, float *dx, float *dW, const float *dy, const float *x,
                          const float *W, int64_t n, int64_t in, int64_t out, bool acc);

/* RMSNorm over rows of length dim: y = x / sqrt(mean(x^2) + eps) * w (w NULL: weightless).
 * rstd[n] (may be NULL in forward) receives 1/sqrt(mean(x^2)+eps) for the backward pass.
 * Backward: dx (+)= d/dx (acc selects accumulate), dw += d/dw (dw NULL when w is NULL).
 * y may alias x in forward; dx may not alias dy. */
void trex_rmsnorm_forward(trex_pool *pool, float *y, float *rstd, const float *x, const float *w,
                          int64_t n, int64_t dim, float eps);
void trex_rmsnorm_backward(trex_pool *pool, float *dx, float *dw, const float *dy, const float *x,
                           const float *w, const float *rstd, int64_t n, int64_t dim, bool acc);

#endif
