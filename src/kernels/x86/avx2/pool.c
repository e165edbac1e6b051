/* kernels/x86/avx2/pool.c — AVX2 leaves of the compressor's softmax pooling in bf16 mode (kernels/fused.h
 * pool_fwd / pool_bwd), reached only through the fused-kernel table.
 *
 * The bits of the reference (kernels/ref/pool.c), as the AVX-512 leaves (kernels/x86/avx512/pool.c)
 * give them: 8 features per register, the candidates in order, the same float operations (separate
 * multiplies and adds; the max as MAXPS, exactly `z > m ? z : m`) and the same exp (exp_nonpos8). */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/x86/avx2/exp_poly.h"
#include "kernels/x86/avx2/mask.h"

/* Features [f, f + 8) under mask m: their max and denominator, and the pooled values. */
static inline __m256 pool8(const float *const *K, const float *const *Z, int64_t n, int64_t f, __m256i m,
                           __m256 *mx, __m256 *den)
{
    __m256 mv = _mm256_maskload_ps(Z[0] + f, m);
    for (int64_t j = 1; j < n; j++)
        mv = _mm256_max_ps(_mm256_maskload_ps(Z[j] + f, m), mv);
    __m256 d = _mm256_setzero_ps(), s = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        const __m256 e = exp_nonpos8(_mm256_sub_ps(_mm256_maskload_ps(Z[j] + f, m), mv));
        d = _mm256_add_ps(d, e);
        s = _mm256_add_ps(s, _mm256_mul_ps(e, _mm256_maskload_ps(K[j] + f, m)));
    }
    *mx = mv;
    *den = d;
    /* masked-off lanes hold zeros: n exps of 0, so they divide 0 by n */
    return _mm256_div_ps(s, d);
}

void trex_fused_pool_fwd_avx2(float *C, const float *const *K, const float *const *Z, int64_t n, int64_t c)
{
    for (int64_t f = 0; f < c; f += 8) {
        const __m256i m = lanes8(c - f);
        __m256 mx, den;
        store_first8(C + f, pool8(K, Z, n, f, m, &mx, &den), c - f);
    }
}

void trex_fused_pool_bwd_avx2(float *const *dK, float *const *dZ, const float *dC, const float *const *K,
                              const float *const *Z, int64_t n, int64_t c)
{
    for (int64_t f = 0; f < c; f += 8) {
        const __m256i m = lanes8(c - f);
        __m256 mx, den;
        const __m256 C = pool8(K, Z, n, f, m, &mx, &den), dc = _mm256_maskload_ps(dC + f, m);
        for (int64_t j = 0; j < n; j++) {
            const __m256 e = exp_nonpos8(_mm256_sub_ps(_mm256_maskload_ps(Z[j] + f, m), mx));
            const __m256 g = _mm256_mul_ps(_mm256_div_ps(e, den), dc);
            store_first8(dK[j] + f, _mm256_add_ps(_mm256_maskload_ps(dK[j] + f, m), g), c - f);
            const __m256 k = _mm256_sub_ps(_mm256_maskload_ps(K[j] + f, m), C);
            store_first8(dZ[j] + f, _mm256_add_ps(_mm256_maskload_ps(dZ[j] + f, m), _mm256_mul_ps(g, k)), c - f);
        }
    }
}
