/* bench/gemm_f32.c — CPU seconds of the fp32 trex_gemm (the model's fp32 GEMM) on one thread, at three
 * LM-head-like shapes in the model's three layouts: y = x W^T (tb), dx = dy W, dW = dy^T x (ta).
 * Best of 3 runs, FLOPs per CPU-second of the process (stable on a shared machine). Build and run:
 *   make BUILD=/tmp/b all && cc -O2 -Iinclude -Isrc bench/gemm_f32.c /tmp/b/libtrex.a \
 *     -lcjson -lglpk -lCbcSolver -lCbc -lpcre2-8 -lm -pthread -o /tmp/gemm_f32 && /tmp/gemm_f32
 * TREX_ISA=ref runs the plain-C micro-kernel. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/kernels.h"

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void)
{
    const int64_t shapes[3][5] = {{1024, 8192, 1024, 0, 1}, {1024, 1024, 8192, 0, 0}, {8192, 1024, 1024, 1, 0}};
    for (int s = 0; s < 3; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        const int ta = (int)shapes[s][3], tb = (int)shapes[s][4];
        float *A = malloc((size_t)(M * K) * sizeof *A), *B = malloc((size_t)(N * K) * sizeof *B);
        float *C = malloc((size_t)(M * N) * sizeof *C);
        if (!A || !B || !C) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        for (int64_t i = 0; i < M * K; i++)
            A[i] = (float)(i % 7) * 0.1f;
        for (int64_t i = 0; i < N * K; i++)
            B[i] = (float)(i % 5) * 0.1f;
        double best = 1e30;
        for (int r = 0; r < 3; r++) {
            const double t0 = cpu_s();
            trex_gemm(NULL, ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C, N);
            const double t = cpu_s() - t0;
            best = t < best ? t : best;
        }
        printf("%lldx%lldx%lld ta=%d tb=%d: %.3f CPU-s, %.1f GFLOP/s per CPU-s\n", (long long)M,
               (long long)N, (long long)K, ta, tb, best, 2.0 * (double)(M * N * K) / best / 1e9);
        free(A);
        free(B);
        free(C);
    }
    return 0;
}
