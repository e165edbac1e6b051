/* kernels/x86/avx512/attn_kl.c — the AVX-512 leaves of the indexer KL's gradient entries of
 * kernels/fused.h (kl_qgrad, kl_kgrad): one call per query instead of one axpy call per active head
 * and entry (model/attention.c). The bits of kernels/ref/attn_kl.c: per output element the same
 * terms in the same order, each a rounded product, then the add (no fused multiply-add).
 *
 * Per entry, the heads' scores of one 16-head group are gathered from ia's column (a 16-float stride
 * of n), compared with 0 (the active heads, a mask) and the active heads visited in ascending order
 * from the mask's bits, so no head costs a branch of its own; the entry's K row (kl_qgrad) or the
 * dK row (kl_kgrad) stays in registers 128 floats at a time. Reached only through the fused-kernel
 * table (kernels/ref/fused.c); compiled with AVX-512 flags. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/x86/avx512/mask.h"

/* heads h0 .. h0 + 15 of ia's column i (masked by hm), as a vector; idx: 16 lanes of h * n */
static inline __m512 head_col(const float *ia, int64_t h0, int64_t n, int64_t i, __m512i idx,
                              __mmask16 hm)
{
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), hm, idx, ia + h0 * n + i, 4);
}

/* the first min(left, 16) lanes */
/* kl_kgrad: the heads of group h0 active for entry i (score > 0) as a mask, and every head's
 * coefficient d * hw[h] into cf */
static inline __mmask16 group_coefs(float *cf, const float *ia, const float *hw, __m512 d, int64_t h0,
                                    int64_t nI, int64_t n, int64_t i, __m512i idx)
{
    const __mmask16 hm = tail_mask(nI - h0);
    const __m512 a = head_col(ia, h0, n, i, idx, hm);
    _mm512_store_ps(cf, _mm512_mul_ps(d, _mm512_maskz_loadu_ps(hm, hw + h0)));
    return _mm512_mask_cmp_ps_mask(hm, a, _mm512_setzero_ps(), _CMP_GT_OQ);
}

void trex_fused_kl_qgrad_avx512(float *diq, float *dhw, const float *ia, const float *dI,
                                const float *hw, const float *const *K, int64_t n, int64_t nI,
                                int64_t cI)
{
    if (n > INT32_MAX / 16) { /* the gather's 32-bit offsets */
        trex_fused_kl_qgrad_ref(diq, dhw, ia, dI, hw, K, n, nI, cI);
        return;
    }
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32((int32_t)n));
    float cf[16] __attribute__((aligned(64)));
    for (int64_t h0 = 0; h0 < nI; h0 += 16) {
        const __mmask16 hm = tail_mask(nI - h0);
        const __m512 hv = _mm512_maskz_loadu_ps(hm, hw + h0);
        __m512 dh = _mm512_maskz_loadu_ps(hm, dhw + h0);
        float *Y = diq + h0 * cI;
        for (int64_t i = 0; i < n; i++) {
            if (i + 2 < n)
                for (int64_t f = 0; f < cI; f += 16)
                    _mm_prefetch((const char *)(K[i + 2] + f), _MM_HINT_T0);
            const __m512 a = head_col(ia, h0, n, i, idx, hm);
            const __mmask16 on = _mm512_mask_cmp_ps_mask(hm, a, _mm512_setzero_ps(), _CMP_GT_OQ);
            const __m512 d = _mm512_set1_ps(dI[i]);
            dh = _mm512_add_ps(dh, _mm512_maskz_mul_ps(on, d, a)); /* inactive heads add +0 */
            if (!on)
                continue;
            _mm512_store_ps(cf, _mm512_mul_ps(d, hv)); /* dI[i] * hw[h] */
            const float *k = K[i];
            int64_t f = 0;
            for (; f + 128 <= cI; f += 128) {
                __m512 kv[8];
                _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                    kv[j] = _mm512_loadu_ps(k + f + 16 * j);
                for (unsigned m = on; m; m &= m - 1) {
                    const int h = __builtin_ctz(m);
                    const __m512 va = _mm512_set1_ps(cf[h]);
                    float *y = Y + h * cI + f;
                    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                        _mm512_storeu_ps(y + 16 * j, _mm512_add_ps(_mm512_loadu_ps(y + 16 * j),
                                                                   _mm512_mul_ps(va, kv[j])));
                }
            }
            for (; f < cI; f += 16) {
                const __mmask16 fm = tail_mask(cI - f);
                const __m512 kx = _mm512_maskz_loadu_ps(fm, k + f);
                for (unsigned m = on; m; m &= m - 1) {
                    const int h = __builtin_ctz(m);
                    float *y = Y + h * cI + f;
                    _mm512_mask_storeu_ps(y, fm, _mm512_add_ps(_mm512_maskz_loadu_ps(fm, y),
                                                               _mm512_mul_ps(_mm512_set1_ps(cf[h]), kx)));
                }
            }
        }
        _mm512_mask_storeu_ps(dhw + h0, hm, dh);
    }
}

void trex_fused_kl_kgrad_avx512(float *const *dK, const float *ia, const float *dI,
                                const float *hw, const float *X, int64_t n, int64_t nI, int64_t cI)
{
    if (n > INT32_MAX / 16) {
        trex_fused_kl_kgrad_ref(dK, ia, dI, hw, X, n, nI, cI);
        return;
    }
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32((int32_t)n));
    float cf[16] __attribute__((aligned(64)));
    for (int64_t i = 0; i < n; i++) {
        if (i + 2 < n)
            for (int64_t f = 0; f < cI; f += 16)
                _mm_prefetch((const char *)(dK[i + 2] + f), _MM_HINT_T0);
        float *y = dK[i];
        const __m512 d = _mm512_set1_ps(dI[i]);
        int64_t f = 0;
        for (; f + 128 <= cI; f += 128) {
            __m512 acc[8];
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                acc[j] = _mm512_loadu_ps(y + f + 16 * j);
            for (int64_t h0 = 0; h0 < nI; h0 += 16) {
                const __mmask16 on = group_coefs(cf, ia, hw, d, h0, nI, n, i, idx);
                for (unsigned m = on; m; m &= m - 1) {
                    const int h = __builtin_ctz(m);
                    const __m512 va = _mm512_set1_ps(cf[h]);
                    const float *x = X + (h0 + h) * cI + f;
                    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                        acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(va, _mm512_loadu_ps(x + 16 * j)));
                }
            }
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                _mm512_storeu_ps(y + f + 16 * j, acc[j]);
        }
        for (; f < cI; f += 16) {
            const __mmask16 fm = tail_mask(cI - f);
            __m512 acc = _mm512_maskz_loadu_ps(fm, y + f);
            for (int64_t h0 = 0; h0 < nI; h0 += 16) {
                const __mmask16 on = group_coefs(cf, ia, hw, d, h0, nI, n, i, idx);
                for (unsigned m = on; m; m &= m - 1) {
                    const int h = __builtin_ctz(m);
                    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(cf[h]),
                                                           _mm512_maskz_loadu_ps(fm, X + (h0 + h) * cI + f)));
                }
            }
            _mm512_mask_storeu_ps(y + f, fm, acc);
        }
    }
}
