/* kernels/ref/ce.c — the reference of the cross-entropy entries of the LM head in bf16 mode
 * (kernels/fused.h "Cross-entropy"; model/model.c head_forward3; docs/precision.md "The LM head"), and
 * of the bf16x3 split of its operands (split3).
 *
 * The head holds a chunk of logits transposed ([V, rows]: row v = vocabulary entry v, column i =
 * token i), so these entries walk rows (contiguous) and keep one running value per column. The exp is
 * our own (trex_exp_nonpos, kernels/ref/exp_poly.h) instead of libm's, so that the AVX-512 leaves (kernels/x86/avx512/ce.c)
 * give the same bits: every step here is one IEEE-rounded float operation (the build is ISO C: no
 * contraction into fused multiply-adds) and the leaves do the same operations in the same order, 16
 * columns at a time. The per-column sums are double and run over the rows in order at every level. */
#include <stdint.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/ref/exp_poly.h"
#include "trex/tensor.h"

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float trex_fused_ce_exp_ref(float x)
{
    return trex_exp_nonpos(x);
}

void trex_fused_ce_fwd_ref(float *L, int64_t ld, int64_t n, int64_t cols, int keep, float *mx,
                           double *sum)
{
    memcpy(mx, L, (size_t)cols * sizeof *mx);
    for (int64_t v = 1; v < n; v++) {
        const float *l = L + v * ld;
        for (int64_t i = 0; i < cols; i++)
            mx[i] = l[i] > mx[i] ? l[i] : mx[i];
    }
    for (int64_t i = 0; i < cols; i++)
        sum[i] = 0.0;
    for (int64_t v = 0; v < n; v++) {
        float *l = L + v * ld;
        for (int64_t i = 0; i < cols; i++) {
            const float e = trex_exp_nonpos(l[i] - mx[i]);
            sum[i] += (double)e;
            if (keep)
                l[i] = e;
        }
    }
}

void trex_fused_ce_grad_ref(uint16_t *dst, int64_t ldd, const float *E, int64_t lde, int64_t n,
                            int64_t cols, const float *c)
{
    for (int64_t v = 0; v < n; v++) {
        const float *e = E + v * lde;
        uint16_t *o = dst + v * ldd;
        for (int64_t i = 0; i < cols; i++) /* reads e[i] before o[i] (bytes 2i..) may overwrite it */
            o[i] = c[i] != 0.0f ? trex_f32_to_bf16(e[i] * c[i]) : 0;
    }
}

void trex_fused_split3_ref(uint16_t *dst, const float *src, int64_t rows, int64_t n, int64_t hi0,
                           int64_t lo0, int64_t hi1, int nt)
{
    (void)nt;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * n;
        uint16_t *row = dst + r * 3 * n;
        for (int64_t i = 0; i < n; i++) {
            const uint16_t hi = trex_f32_to_bf16(x[i]);
            row[hi0 + i] = hi;
            row[hi1 + i] = hi;
            row[lo0 + i] = trex_f32_to_bf16(x[i] - bits_f32((uint32_t)hi << 16));
        }
    }
}
