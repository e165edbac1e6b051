/* kernels/ref/norm.c — reference entries of RMSNorm and the fixed-lane sum of squares (kernels/fused.h).
 *
 * Every sum over a row runs in TREX_SUMSQ_LANES = 16 double lanes (element k in lane k mod 16, k
 * ascending, from +0), combined in the tree of trex_sumsq (kernels.h): s_j = l_j + l_{j+8},
 * t_j = s_j + s_{j+4}, u_j = t_j + t_{j+2}, u_0 + u_1. The AVX-512 leaves (kernels/x86/avx512/norm.c)
 * keep the 16 lanes in two registers of 8 doubles and do the same IEEE operations per lane, so every
 * level gives these bits, and a row's result depends on that row alone (not on the thread count).
 * The element-wise parts are float operations in a fixed order, written here one element at a time. */
#include <math.h>

#include "kernels/fused.h"
#include "kernels/kernels.h"

#define L TREX_SUMSQ_LANES

/* the optimizer's lane sum (kernels/ref/optim.c), without its NaN/Inf count */
double trex_fused_sumsq_ref(const float *x, int64_t n)
{
    int64_t nonfinite;
    return trex_sumsq_ref(x, n, &nonfinite);
}

void trex_fused_rmsnorm_fwd_ref(float *y, float *rstd, const float *x, const float *w, int64_t n,
                                int64_t dim, float eps)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        const float rs = trex_rmsnorm_rstd(trex_fused_sumsq_ref(xr, dim), dim, eps);
        if (rstd)
            rstd[r] = rs;
        if (w)
            for (int64_t i = 0; i < dim; i++)
                yr[i] = xr[i] * rs * w[i];
        else
            for (int64_t i = 0; i < dim; i++)
                yr[i] = xr[i] * rs;
    }
}

/* sum_i ((double)dy_i w_i) x_i over the lanes (w NULL: (double)dy_i x_i) */
static double bwd_dot(const float *dy, const float *x, const float *w, int64_t dim)
{
    double l[L] = {0};
    for (int64_t k = 0; k < dim; k++) {
        const double g = w ? (double)dy[k] * (double)w[k] : (double)dy[k];
        l[k % L] += g * (double)x[k];
    }
    return trex_lanes_sum16(l);
}

void trex_fused_rmsnorm_bwd_ref(float *dx, const float *dy, const float *x, const float *w,
                                const float *rstd, int64_t n, int64_t dim, int acc)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim, *dyr = dy + r * dim;
        float *dxr = dx + r * dim;
        const float rs = rstd[r];
        const float c = (float)(bwd_dot(dyr, xr, w, dim) / (double)dim) * rs * rs;
        for (int64_t i = 0; i < dim; i++) {
            const float g = w ? dyr[i] * w[i] : dyr[i];
            const float v = rs * (g - xr[i] * c);
            dxr[i] = acc ? dxr[i] + v : v;
        }
    }
}

void trex_fused_rmsnorm_dw_ref(float *dw, const float *dy, const float *x, const float *rstd,
                               int64_t n, int64_t dim, int64_t j0, int64_t j1)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim, *dyr = dy + r * dim;
        for (int64_t i = j0; i < j1; i++)
            dw[i] += dyr[i] * xr[i] * rstd[r];
    }
}
