/* kernels/ref/attn_kl.c — the reference of the indexer KL's gradient entries of kernels/fused.h
 * (kl_qgrad, kl_kgrad): the loops model/attention.c ran itself before, one axpy (am_axpy_f: each
 * product rounded, then the add) per active head and entry. The AVX-512 leaves
 * (kernels/x86/avx512/attn_kl.c) give the same bits; the avx2 level runs kl_qgrad's loop
 * (trex_fused_kl_qgrad_axpy) with its own axpy. */
#include "kernels/fused.h"

#define AM_REAL float
#define AM_SFX f
#include "model/attention_math.h"

void trex_fused_kl_qgrad_axpy(trex_fused_axpy_fn axpy, float *diq, float *dhw, const float *ia,
                              const float *dI, const float *hw, const float *const *K, int64_t n,
                              int64_t nI, int64_t cI)
{
    for (int64_t i = 0; i < n; i++) {
        const float d = dI[i];
        for (int64_t h = 0; h < nI; h++) {
            const float a = ia[h * n + i];
            dhw[h] += a > 0.0f ? d * a : 0.0f;
            if (a > 0.0f)
                axpy(diq + h * cI, d * hw[h], K[i], cI);
        }
    }
}

static void axpy_ref(float *y, float a, const float *x, int64_t n)
{
    am_axpy_f(y, a, x, n);
}

void trex_fused_kl_qgrad_ref(float *diq, float *dhw, const float *ia, const float *dI,
                             const float *hw, const float *const *K, int64_t n, int64_t nI,
                             int64_t cI)
{
    trex_fused_kl_qgrad_axpy(axpy_ref, diq, dhw, ia, dI, hw, K, n, nI, cI);
}

void trex_fused_kl_kgrad_ref(float *const *dK, const float *ia, const float *dI, const float *hw,
                             const float *X, int64_t n, int64_t nI, int64_t cI)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < nI; h++)
            if (ia[h * n + i] > 0.0f)
                am_axpy_f(dK[i], dI[i] * hw[h], X + h * cI, cI);
}
