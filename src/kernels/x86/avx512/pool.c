/* kernels/x86/avx512/pool.c — AVX-512 leaves of the compressor's softmax pooling in bf16 mode
 * (kernels/fused.h pool_fwd / pool_bwd), reached only through the fused-kernel table.
 *
 * They give the bits of the reference (kernels/ref/pool.c): 16 features per register, the candidates
 * in order, the same float operations (separate multiplies and adds, the max as MAXPS, which is
 * exactly `z > m ? z : m`) and the same exp (trex_exp_nonpos16). The reference's libm-free exp is what
 * lets this run 16 lanes at a time: the fp32 mode's pooling calls libm's expf per element. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/x86/avx512/exp_poly.h"
#include "kernels/x86/avx512/mask.h"

/* Features [f, f + 16) under mask m: their max and denominator, and the pooled values. */
static inline __m512 pool16(const float *const *K, const float *const *Z, int64_t n, int64_t f, __mmask16 m,
                            __m512 *mx, __m512 *den)
{
    __m512 mv = _mm512_maskz_loadu_ps(m, Z[0] + f);
    for (int64_t j = 1; j < n; j++)
        mv = _mm512_max_ps(_mm512_maskz_loadu_ps(m, Z[j] + f), mv);
    __m512 d = _mm512_setzero_ps(), s = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        const __m512 e = trex_exp_nonpos16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, Z[j] + f), mv));
        d = _mm512_add_ps(d, e);
        s = _mm512_add_ps(s, _mm512_mul_ps(e, _mm512_maskz_loadu_ps(m, K[j] + f)));
    }
    *mx = mv;
    *den = d;
    /* masked-off lanes hold zeros: n exps of 0, so they divide 0 by n */
    return _mm512_div_ps(s, d);
}

void trex_fused_pool_fwd_avx512(float *C, const float *const *K, const float *const *Z, int64_t n,
                                int64_t c)
{
    for (int64_t f = 0; f < c; f += 16) {
        const __mmask16 m = tail_mask(c - f);
        __m512 mx, den;
        _mm512_mask_storeu_ps(C + f, m, pool16(K, Z, n, f, m, &mx, &den));
    }
}

void trex_fused_pool_bwd_avx512(float *const *dK, float *const *dZ, const float *dC, const float *const *K,
                                const float *const *Z, int64_t n, int64_t c)
{
    for (int64_t f = 0; f < c; f += 16) {
        const __mmask16 m = tail_mask(c - f);
        __m512 mx, den;
        const __m512 C = pool16(K, Z, n, f, m, &mx, &den), dc = _mm512_maskz_loadu_ps(m, dC + f);
        for (int64_t j = 0; j < n; j++) {
            const __m512 e = trex_exp_nonpos16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, Z[j] + f), mx));
            const __m512 g = _mm512_mul_ps(_mm512_div_ps(e, den), dc);
            _mm512_mask_storeu_ps(dK[j] + f, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dK[j] + f), g));
            const __m512 k = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, K[j] + f), C);
            _mm512_mask_storeu_ps(dZ[j] + f, m,
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(m, dZ[j] + f), _mm512_mul_ps(g, k)));
        }
    }
}
