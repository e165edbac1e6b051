/* kernels/ref/gemm_mixed.c — the precision switch of the model's linear layers.
 *
 * fp32 runs the reference trex_gemm unchanged (the fp32 mode is bit-identical to the engine that the
 * PyTorch comparison checks); bf16 runs the dispatched bf16 GEMM on fp32 operands, which rounds both
 * to bf16 while packing them and sums in fp32 (docs/precision.md). Portable C: it only chooses. */
#include "kernels/kernels.h"
#include "trex/status.h"

void trex_gemm_ex(trex_pool *pool, trex_gemm_ws *ws, trex_dtype compute, bool ta, bool tb, int64_t M,
                  int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc)
{
    switch (compute) {
    case TREX_F32:
        trex_gemm(pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    case TREX_BF16:
        trex_gemm_f32_bf16(pool, ws, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    default:
        TREX_ABORT("trex_gemm_ex: compute dtype %d — only TREX_F32 and TREX_BF16", (int)compute);
    }
}

void trex_linear_forward_ex(trex_pool *pool, trex_gemm_ws *ws, trex_dtype compute, float *y,
                            const float *x, const float *W, int64_t n, int64_t in, int64_t out)
{
    trex_gemm_ex(pool, ws, compute, false, true, n, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
}

void trex_linear_backward_ex(trex_pool *pool, trex_gemm_ws *ws, trex_dtype compute, float *dx,
                             float *dW, const float *dy, const float *x, const float *W, int64_t n,
                             int64_t in, int64_t out, bool acc, bool dw_acc)
{
    if (dx)
        trex_gemm_ex(pool, ws, compute, false, false, n, in, out, 1.0f, dy, out, W, in,
                     acc ? 1.0f : 0.0f, dx, in);
    if (dW)
        trex_gemm_ex(pool, ws, compute, true, false, out, in, n, 1.0f, dy, out, x, in, dw_acc ? 1.0f : 0.0f,
                     dW, in);
}
