/* kernels/ref/pool.c — the reference of the compressor's softmax pooling in bf16 mode (kernels/fused.h
 * pool_fwd / pool_bwd; model/attention.c). One feature at a time, every step one IEEE float operation
 * (the build is ISO C: nothing is contracted into fused multiply-adds) with the exp of
 * kernels/ref/exp_poly.h, so that the AVX-512 leaves (kernels/x86/avx512/pool.c), which take 16
 * features per register through the same operations in the same order, give the same bits. */
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/ref/exp_poly.h"

/* Feature f of the pooling: its max and denominator, and the pooled value. */
static float pool_feature(const float *const *K, const float *const *Z, int64_t n, int64_t f, float *mx,
                          float *den)
{
    float m = Z[0][f];
    for (int64_t j = 1; j < n; j++)
        m = Z[j][f] > m ? Z[j][f] : m;
    float d = 0.0f, s = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float e = trex_exp_nonpos(Z[j][f] - m);
        d = d + e;
        s = s + e * K[j][f];
    }
    *mx = m;
    *den = d;
    return s / d;
}

void trex_fused_pool_fwd_ref(float *C, const float *const *K, const float *const *Z, int64_t n, int64_t c)
{
    float mx, den;
    for (int64_t f = 0; f < c; f++)
        C[f] = pool_feature(K, Z, n, f, &mx, &den);
}

void trex_fused_pool_bwd_ref(float *const *dK, float *const *dZ, const float *dC, const float *const *K,
                             const float *const *Z, int64_t n, int64_t c)
{
    float mx, den;
    for (int64_t f = 0; f < c; f++) {
        const float C = pool_feature(K, Z, n, f, &mx, &den);
        for (int64_t j = 0; j < n; j++) {
            const float g = (trex_exp_nonpos(Z[j][f] - mx) / den) * dC[f];
            dK[j][f] = dK[j][f] + g;
            dZ[j][f] = dZ[j][f] + g * (K[j][f] - C);
        }
    }
}
