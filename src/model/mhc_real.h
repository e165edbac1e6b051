/* model/mhc_real.h — the per-token mHC math over a `real` type (MODEL_SPEC §2.3–2.5, §10).
 *
 * This header has no include guard: it is included once per precision, with
 *   #define MHC_REAL   float | double
 *   #define MHC_SUFFIX f | d          (function names get _f / _d)
 *   #define MHC_EXP    expf | exp
 *   #define MHC_SQRT   sqrtf | sqrt
 * model/mhc.c includes it for float (the layer); tests/test_mhc.c includes it for double and checks the
 * double functions against central finite differences. The same source therefore serves both.
 *
 * Sizes: n = hc_mult streams of d values; mix = (2+n)*n raw mixes per token, laid out as
 * [pre (n) | post (n) | comb (n*n, row j = source stream, column k = destination)]. Sums over d are
 * accumulated in double in both precisions (rho's in 16 fixed lanes); one token is handled by one
 * call, so results do not depend on how tokens are split across threads. The derivations are in
 * docs/mhc.md. */
#include <math.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "trex/status.h"

#if !defined(MHC_REAL) || !defined(MHC_SUFFIX) || !defined(MHC_EXP) || !defined(MHC_SQRT)
#error "define MHC_REAL, MHC_SUFFIX, MHC_EXP and MHC_SQRT before including model/mhc_real.h"
#endif

#ifndef MHC_REAL_ONCE
#define MHC_REAL_ONCE
#define MHC_CAT_(a, b) a##_##b
#define MHC_CAT(a, b) MHC_CAT_(a, b)
/* Largest hc_mult and hc_sinkhorn_iters the per-token code handles (stack scratch below). */
#define MHC_MAX_N 8
#define MHC_MAX_ITERS 100
/* Reals of Sinkhorn scratch: the softmax, then per normalisation step its output and denominators. */
#define MHC_SK_SCRATCH(n, iters) ((n) * (n) + (2 * (iters) - 1) * ((n) * (n) + (n)))
#define MHC_SK_SCRATCH_MAX MHC_SK_SCRATCH(MHC_MAX_N, MHC_MAX_ITERS)

#if defined(__SSE2__)
#include <emmintrin.h>
/* Sinkhorn of four tokens at once for n = 4 in float (SSE2, part of x86-64): lane l holds token l,
 * element i (row j = i / 4, column k = i % 4) of every array is one __m128. Each lane runs exactly
 * the operations of the scalar loops of mhc_sinkhorn_fwd / _bwd below, in their order (the max as
 * maxps, whose (a > b ? a : b) is the loops' comparison; expf per lane), so each token gets the
 * scalar code's bits, while the divisions of a step are 16 independent ones instead of one token's
 * dependent chain. scratch: MHC_SK_SCRATCH(4, iters) vectors in the scalar scratch's layout. */
static inline void mhc_sinkhorn4x_fwd(int iters, float eps, const __m128 *L, __m128 *M,
                                      __m128 *scratch)
{
    const __m128 ev = _mm_set1_ps(eps);
    __m128 *S = scratch;
    for (int j = 0; j < 4; j++) {
        __m128 mx = L[j * 4];
        for (int k = 1; k < 4; k++)
            mx = _mm_max_ps(L[j * 4 + k], mx);
        __m128 s = _mm_setzero_ps();
        for (int k = 0; k < 4; k++) {
            float a[4];
            _mm_storeu_ps(a, _mm_sub_ps(L[j * 4 + k], mx));
            for (int l = 0; l < 4; l++)
                a[l] = expf(a[l]);
            S[j * 4 + k] = _mm_loadu_ps(a);
            s = _mm_add_ps(s, S[j * 4 + k]);
        }
        for (int k = 0; k < 4; k++) {
            S[j * 4 + k] = _mm_div_ps(S[j * 4 + k], s);
            M[j * 4 + k] = _mm_add_ps(S[j * 4 + k], ev);
        }
    }
    __m128 *st = scratch + 16;
    for (int s = 0; s < 2 * iters - 1; s++, st += 20) {
        __m128 *den = st + 16;
        for (int a = 0; a < 4; a++) { /* column step: line a = column k; row step: row j */
            const int stride = s % 2 == 0 ? 4 : 1, first = s % 2 == 0 ? a : 4 * a;
            __m128 c = _mm_setzero_ps();
            for (int b = 0; b < 4; b++)
                c = _mm_add_ps(c, M[first + b * stride]);
            den[a] = _mm_add_ps(c, ev);
            for (int b = 0; b < 4; b++)
                M[first + b * stride] = _mm_div_ps(M[first + b * stride], den[a]);
        }
        for (int i = 0; i < 16; i++)
            st[i] = M[i];
    }
}

/* dL from dM and the scratch of mhc_sinkhorn4x_fwd, four tokens in lanes (dL may alias dM). */
static inline void mhc_sinkhorn4x_bwd(int iters, const __m128 *scratch, const __m128 *dM,
                                      __m128 *dL)
{
    __m128 g[16];
    for (int i = 0; i < 16; i++)
        g[i] = dM[i];
    for (int s = 2 * iters - 2; s >= 0; s--) {
        const __m128 *out = scratch + 16 + 20 * s, *den = out + 16;
        for (int a = 0; a < 4; a++) {
            const int stride = s % 2 == 0 ? 4 : 1, first = s % 2 == 0 ? a : 4 * a;
            __m128 dot = _mm_setzero_ps();
            for (int b = 0; b < 4; b++)
                dot = _mm_add_ps(dot, _mm_mul_ps(g[first + b * stride], out[first + b * stride]));
            for (int b = 0; b < 4; b++)
                g[first + b * stride] = _mm_div_ps(_mm_sub_ps(g[first + b * stride], dot), den[a]);
        }
    }
    const __m128 *S = scratch;
    for (int j = 0; j < 4; j++) {
        __m128 dot = _mm_setzero_ps();
        for (int k = 0; k < 4; k++)
            dot = _mm_add_ps(dot, _mm_mul_ps(g[j * 4 + k], S[j * 4 + k]));
        for (int k = 0; k < 4; k++)
            dL[j * 4 + k] = _mm_mul_ps(S[j * 4 + k], _mm_sub_ps(g[j * 4 + k], dot));
    }
}
#endif
#endif

#define MHC(name) MHC_CAT(name, MHC_SUFFIX)
#define real MHC_REAL

static inline real MHC(mhc_sigmoid)(real z)
{
    return (real)1 / ((real)1 + MHC_EXP(-z));
}

/* rho from the sum of squares ss of the len values: 1 / sqrt(ss / len + norm_eps). */
static inline real MHC(mhc_rho_ss)(double ss, int64_t len, real norm_eps)
{
    return (real)1 / MHC_SQRT((real)(ss / (double)len) + norm_eps);
}

/* sum_i a_i b_i over len values in double, in 16 lanes (value i in lane i mod 16, i ascending, from
 * +0; each product rounded, then added: for float the products are exact) and trex_lanes_sum16's tree
 * (kernels/kernels.h). Every sum over d of this file runs so, and the AVX-512 leaves (kernels/fused.h)
 * give its bits. */
static inline double MHC(mhc_lane_dot)(int64_t len, const real *a, const real *b)
{
    double l[16] = {0};
    for (int64_t i = 0; i < len; i++)
        l[i % 16] += (double)a[i] * (double)b[i];
    return trex_lanes_sum16(l);
}

/* rho = 1 / sqrt(mean(v^2) + norm_eps) over the len values of v (the flattened streams); for float,
 * the sum of squares is exactly the fused table's sumsq (kernels/fused.h), which the layer calls. */
static inline real MHC(mhc_rho)(int64_t len, const real *v, real norm_eps)
{
    return MHC(mhc_rho_ss)(MHC(mhc_lane_dot)(len, v, v), len, norm_eps);
}

/* Sinkhorn–Knopp projection of the n x n logits L (MODEL_SPEC §2.3 step 5):
 *   M = softmax_row(L) + eps; M /= colsum(M) + eps; then (iters-1) x (row-normalise, column-normalise).
 * M receives the result. scratch (MHC_SK_SCRATCH(n, iters) reals) receives what the backward needs:
 * the softmax S, then for each of the 2*iters-1 normalisation steps its output and its denominators. */
static inline void MHC(mhc_sinkhorn_fwd)(int n, int iters, real eps, const real *L, real *M,
                                         real *scratch)
{
    TREX_ASSERT(n >= 1 && n <= MHC_MAX_N && iters >= 1 && iters <= MHC_MAX_ITERS);
    const int nn = n * n;
    real *S = scratch;
    for (int j = 0; j < n; j++) {
        real mx = L[j * n];
        for (int k = 1; k < n; k++)
            mx = L[j * n + k] > mx ? L[j * n + k] : mx;
        real s = 0;
        for (int k = 0; k < n; k++) {
            S[j * n + k] = MHC_EXP(L[j * n + k] - mx);
            s += S[j * n + k];
        }
        for (int k = 0; k < n; k++) {
            S[j * n + k] /= s;
            M[j * n + k] = S[j * n + k] + eps;
        }
    }
    const int steps = 2 * iters - 1;
    real *st = scratch + nn;
    for (int s = 0; s < steps; s++, st += nn + n) {
        real *out = st, *den = st + nn;
        if (s % 2 == 0) { /* column step: divide column k by its sum */
            for (int k = 0; k < n; k++) {
                real c = 0;
                for (int j = 0; j < n; j++)
                    c += M[j * n + k];
                den[k] = c + eps;
                for (int j = 0; j < n; j++)
                    M[j * n + k] /= den[k];
            }
        } else { /* row step */
            for (int j = 0; j < n; j++) {
                real r = 0;
                for (int k = 0; k < n; k++)
                    r += M[j * n + k];
                den[j] = r + eps;
                for (int k = 0; k < n; k++)
                    M[j * n + k] /= den[j];
            }
        }
        for (int i = 0; i < nn; i++)
            out[i] = M[i];
    }
}

/* dL = dL/dL given dM = dL/dM, from the scratch a forward call filled. dL may alias dM. */
static inline void MHC(mhc_sinkhorn_bwd)(int n, int iters, const real *scratch, const real *dM,
                                         real *dL)
{
    const int nn = n * n, steps = 2 * iters - 1;
    real g[MHC_MAX_N * MHC_MAX_N];
    for (int i = 0; i < nn; i++)
        g[i] = dM[i];
    for (int s = steps - 1; s >= 0; s--) {
        const real *out = scratch + nn + (int64_t)s * (nn + n), *den = out + nn;
        /* M' = M / den: dM = (dM' - sum over the normalised line of dM' * M') / den */
        if (s % 2 == 0) {
            for (int k = 0; k < n; k++) {
                real dot = 0;
                for (int j = 0; j < n; j++)
                    dot += g[j * n + k] * out[j * n + k];
                for (int j = 0; j < n; j++)
                    g[j * n + k] = (g[j * n + k] - dot) / den[k];
            }
        } else {
            for (int j = 0; j < n; j++) {
                real dot = 0;
                for (int k = 0; k < n; k++)
                    dot += g[j * n + k] * out[j * n + k];
                for (int k = 0; k < n; k++)
                    g[j * n + k] = (g[j * n + k] - dot) / den[j];
            }
        }
    }
    /* softmax VJP per row (the + eps after it has no gradient) */
    const real *S = scratch;
    for (int j = 0; j < n; j++) {
        real dot = 0;
        for (int k = 0; k < n; k++)
            dot += g[j * n + k] * S[j * n + k];
        for (int k = 0; k < n; k++)
            dL[j * n + k] = S[j * n + k] * (g[j * n + k] - dot);
    }
}

/* L[n*n] = scale2 mu[2n..mix) + base[2n..mix): the comb slots' Sinkhorn logits. */
static inline void MHC(mhc_mix_logits)(int n, const real *scale, const real *base, const real *mu,
                                       real *L)
{
    for (int i = 0; i < n * n; i++)
        L[i] = scale[2] * mu[2 * n + i] + base[2 * n + i];
}

/* mhc_mix_fwd without the Sinkhorn: out[0..2n) = [pre | post], L[n*n] the comb logits. */
static inline void MHC(mhc_mix_gates)(int n, real eps, const real *scale, const real *base,
                                      const real *mu, real *out, real *L)
{
    for (int k = 0; k < n; k++) {
        out[k] = MHC(mhc_sigmoid)(scale[0] * mu[k] + base[k]) + eps;
        out[n + k] = 2 * MHC(mhc_sigmoid)(scale[1] * mu[n + k] + base[n + k]);
    }
    MHC(mhc_mix_logits)(n, scale, base, mu, L);
}

/* The constrained mixes from the raw mixes mu[mix] (MODEL_SPEC §2.3 step 4–5):
 *   pre_k = sigmoid(scale0 mu_k + base_k) + eps, post_k = 2 sigmoid(scale1 mu_{n+k} + base_{n+k}),
 *   comb = Sinkhorn(scale2 mu_{2n+..} + base_{2n+..}).
 * out[mix] receives [pre | post | comb]; sk (MHC_SK_SCRATCH reals) the Sinkhorn intermediates. */
static inline void MHC(mhc_mix_fwd)(int n, int iters, real eps, const real *scale, const real *base,
                                    const real *mu, real *out, real *sk)
{
    real L[MHC_MAX_N * MHC_MAX_N];
    MHC(mhc_mix_gates)(n, eps, scale, base, mu, out, L);
    MHC(mhc_sinkhorn_fwd)(n, iters, eps, L, out + 2 * n, sk);
}

/* The rest of mhc_mix_bwd once dz[2n..mix) (the Sinkhorn VJP) is written: the gates' dz, dscale,
 * dmu (dmu may alias dout). */
static inline void MHC(mhc_mix_bwd_gates)(int n, const real *scale, const real *base, const real *mu,
                                          const real *dout, real *dz, real *dmu, real *dscale)
{
    const int nn = n * n;
    for (int k = 0; k < n; k++) {
        real sp = MHC(mhc_sigmoid)(scale[0] * mu[k] + base[k]);
        real sq = MHC(mhc_sigmoid)(scale[1] * mu[n + k] + base[n + k]);
        dz[k] = dout[k] * sp * (1 - sp);
        dz[n + k] = dout[n + k] * 2 * sq * (1 - sq);
    }
    dscale[0] = dscale[1] = dscale[2] = 0;
    for (int m = 0; m < 2 * n + nn; m++) {
        const int g = m < n ? 0 : m < 2 * n ? 1 : 2;
        dscale[g] += dz[m] * mu[m];
        dmu[m] = dz[m] * scale[g];
    }
}

/* Backward of mhc_mix_fwd given dout[mix] = d/d[pre | post | comb]:
 * dz[mix] receives d/d(scale*mu + base) (= the base gradient), dmu[mix] d/dmu, and dscale[3] this
 * token's scale gradient (written). Recomputes the forward; sk is scratch. dmu may alias dout. */
static inline void MHC(mhc_mix_bwd)(int n, int iters, real eps, const real *scale, const real *base,
                                    const real *mu, const real *dout, real *dz, real *dmu,
                                    real *dscale, real *sk)
{
    real L[MHC_MAX_N * MHC_MAX_N], M[MHC_MAX_N * MHC_MAX_N];
    MHC(mhc_mix_logits)(n, scale, base, mu, L);
    MHC(mhc_sinkhorn_fwd)(n, iters, eps, L, M, sk);
    MHC(mhc_sinkhorn_bwd)(n, iters, sk, dout + 2 * n, dz + 2 * n);
    MHC(mhc_mix_bwd_gates)(n, scale, base, mu, dout, dz, dmu, dscale);
}

/* a[m] = sum_i fn[m, i] v[i] for m < rows, over len values (double accumulation). */
static inline void MHC(mhc_fn_dot)(int rows, int64_t len, const real *fn, const real *v, real *a)
{
    for (int m = 0; m < rows; m++) {
        double s = 0.0;
        const real *f = fn + (int64_t)m * len;
        for (int64_t i = 0; i < len; i++)
            s += (double)f[i] * (double)v[i];
        a[m] = (real)s;
    }
}

/* The rho part of dv for mu = rho (fn v): dv -= c v with c = (sum_m dmu_m mu_m) rho^2 / len
 * (mhc_rho_bwd_coef). The fn part, dv += rho fn^T dmu, is added by the caller (mhc_pre_tok_bwd below,
 * or a GEMM in the layer; at the gate level both in one pass, kernels/fused.h gate_bwd_dx_mhc). */
static inline real MHC(mhc_rho_bwd_coef)(int rows, int64_t len, real rho, const real *mu,
                                         const real *dmu)
{
    real c = 0;
    for (int m = 0; m < rows; m++)
        c += dmu[m] * mu[m];
    return c * rho * rho / (real)len;
}

static inline void MHC(mhc_rho_bwd)(int rows, int64_t len, real rho, const real *mu, const real *dmu,
                                    const real *v, real *dv)
{
    const real c = MHC(mhc_rho_bwd_coef)(rows, len, rho, mu, dmu);
    for (int64_t i = 0; i < len; i++)
        dv[i] -= c * v[i];
}

/* x_in = sum_k w_k X_k over n streams of d values. */
static inline void MHC(mhc_collapse)(int n, int64_t d, const real *w, const real *X, real *x)
{
    for (int64_t i = 0; i < d; i++) {
        real s = 0;
        for (int k = 0; k < n; k++)
            s += w[k] * X[(int64_t)k * d + i];
        x[i] = s;
    }
}

/* dw_k = X_k . dx (written; mhc_lane_dot) and dX_k += w_k dx (dX NULL: dw only). */
static inline void MHC(mhc_collapse_bwd)(int n, int64_t d, const real *w, const real *X,
                                         const real *dx, real *dw, real *dX)
{
    for (int k = 0; k < n; k++) {
        const real *Xk = X + (int64_t)k * d;
        if (dX) {
            real *dXk = dX + (int64_t)k * d;
            for (int64_t i = 0; i < d; i++)
                dXk[i] += w[k] * dx[i];
        }
        dw[k] = (real)MHC(mhc_lane_dot)(d, Xk, dx);
    }
}

/* HC_post of one token (MODEL_SPEC §2.4): Xo_k = post_k y + sum_j comb_jk X_j. Xo may not alias X. */
static inline void MHC(mhc_post_tok_fwd)(int n, int64_t d, const real *post, const real *comb,
                                         const real *y, const real *X, real *Xo)
{
    for (int k = 0; k < n; k++) {
        real *o = Xo + (int64_t)k * d;
        for (int64_t i = 0; i < d; i++) {
            real s = post[k] * y[i];
            for (int j = 0; j < n; j++)
                s += comb[j * n + k] * X[(int64_t)j * d + i];
            o[i] = s;
        }
    }
}

/* Backward of HC_post given dXo: dy and dX (the residual path) are written; dpost[n] and
 * dcomb[n*n] are written (sums over d: mhc_lane_dot). */
static inline void MHC(mhc_post_tok_bwd)(int n, int64_t d, const real *post, const real *comb,
                                         const real *y, const real *X, const real *dXo, real *dy,
                                         real *dX, real *dpost, real *dcomb)
{
    for (int64_t i = 0; i < d; i++) {
        real s = 0;
        for (int k = 0; k < n; k++)
            s += post[k] * dXo[(int64_t)k * d + i];
        dy[i] = s;
    }
    for (int j = 0; j < n; j++)
        for (int64_t i = 0; i < d; i++) {
            real s = 0;
            for (int k = 0; k < n; k++)
                s += comb[j * n + k] * dXo[(int64_t)k * d + i];
            dX[(int64_t)j * d + i] = s;
        }
    for (int k = 0; k < n; k++) {
        dpost[k] = (real)MHC(mhc_lane_dot)(d, dXo + (int64_t)k * d, y);
        for (int j = 0; j < n; j++)
            dcomb[j * n + k] = (real)MHC(mhc_lane_dot)(d, X + (int64_t)j * d, dXo + (int64_t)k * d);
    }
}

/* The whole HC_pre of one token (MODEL_SPEC §2.3): X [n*d] (stream-major), fn [mix, n*d],
 * scale [3], base [mix] -> x_in [d], out [mix] = [pre | post | comb], mu [mix], *rho. sk: scratch.
 * The layer (mhc.c) computes fn v with a GEMM and then uses the same pieces. */
static inline void MHC(mhc_pre_tok_fwd)(int n, int64_t d, int iters, real eps, real norm_eps,
                                        const real *X, const real *fn, const real *scale,
                                        const real *base, real *x_in, real *out, real *mu,
                                        real *rho, real *sk)
{
    const int mix = (2 + n) * n;
    const int64_t nd = (int64_t)n * d;
    *rho = MHC(mhc_rho)(nd, X, norm_eps);
    MHC(mhc_fn_dot)(mix, nd, fn, X, mu);
    for (int m = 0; m < mix; m++)
        mu[m] *= *rho;
    MHC(mhc_mix_fwd)(n, iters, eps, scale, base, mu, out, sk);
    MHC(mhc_collapse)(n, d, out, X, x_in);
}

/* Backward of mhc_pre_tok_fwd given dx_in [d] and dpost [n], dcomb [n*n] (from HC_post): adds into
 * dX [n*d], dfn [mix, n*d], dscale [3], dbase [mix]. */
static inline void MHC(mhc_pre_tok_bwd)(int n, int64_t d, int iters, real eps, const real *X,
                                        const real *fn, const real *scale, const real *base,
                                        const real *out, const real *mu, real rho,
                                        const real *dx_in, const real *dpost, const real *dcomb,
                                        real *dX, real *dfn, real *dscale, real *dbase, real *sk)
{
    const int mix = (2 + n) * n;
    const int64_t nd = (int64_t)n * d;
    real dout[(2 + MHC_MAX_N) * MHC_MAX_N], dz[(2 + MHC_MAX_N) * MHC_MAX_N];
    real dmu[(2 + MHC_MAX_N) * MHC_MAX_N], ds[3];
    MHC(mhc_collapse_bwd)(n, d, out, X, dx_in, dout, dX);
    for (int k = 0; k < n; k++)
        dout[n + k] = dpost[k];
    for (int i = 0; i < n * n; i++)
        dout[2 * n + i] = dcomb[i];
    MHC(mhc_mix_bwd)(n, iters, eps, scale, base, mu, dout, dz, dmu, ds, sk);
    for (int g = 0; g < 3; g++)
        dscale[g] += ds[g];
    for (int m = 0; m < mix; m++)
        dbase[m] += dz[m];
    MHC(mhc_rho_bwd)(mix, nd, rho, mu, dmu, X, dX);
    for (int m = 0; m < mix; m++) {
        const real c = rho * dmu[m];
        const real *f = fn + (int64_t)m * nd;
        real *df = dfn + (int64_t)m * nd;
        for (int64_t i = 0; i < nd; i++) {
            dX[i] += c * f[i];
            df[i] += c * X[i];
        }
    }
}

/* hc_head of one token (MODEL_SPEC §2.5): fn [n, n*d], scale [1], base [n] -> h [d], w [n],
 * mu [n], *rho. */
static inline void MHC(mhc_head_tok_fwd)(int n, int64_t d, real eps, real norm_eps, const real *X,
                                         const real *fn, const real *scale, const real *base,
                                         real *h, real *w, real *mu, real *rho)
{
    const int64_t nd = (int64_t)n * d;
    *rho = MHC(mhc_rho)(nd, X, norm_eps);
    MHC(mhc_fn_dot)(n, nd, fn, X, mu);
    for (int k = 0; k < n; k++) {
        mu[k] *= *rho;
        w[k] = MHC(mhc_sigmoid)(scale[0] * mu[k] + base[k]) + eps;
    }
    MHC(mhc_collapse)(n, d, w, X, h);
}

/* Backward of the per-token head weights: given dw[n] = d/dw, writes dz[n] (= base gradient),
 * dmu[n], and returns this token's scale gradient. */
static inline real MHC(mhc_head_w_bwd)(int n, const real *scale, const real *base, const real *mu,
                                       const real *dw, real *dz, real *dmu)
{
    real ds = 0;
    for (int k = 0; k < n; k++) {
        real s = MHC(mhc_sigmoid)(scale[0] * mu[k] + base[k]);
        dz[k] = dw[k] * s * (1 - s);
        ds += dz[k] * mu[k];
        dmu[k] = dz[k] * scale[0];
    }
    return ds;
}

/* Backward of mhc_head_tok_fwd given dh [d]: adds into dX, dfn, dscale [1], dbase [n]. */
static inline void MHC(mhc_head_tok_bwd)(int n, int64_t d, const real *X, const real *fn,
                                         const real *scale, const real *base, const real *w,
                                         const real *mu, real rho, const real *dh, real *dX,
                                         real *dfn, real *dscale, real *dbase)
{
    const int64_t nd = (int64_t)n * d;
    real dw[MHC_MAX_N], dz[MHC_MAX_N], dmu[MHC_MAX_N];
    MHC(mhc_collapse_bwd)(n, d, w, X, dh, dw, dX);
    dscale[0] += MHC(mhc_head_w_bwd)(n, scale, base, mu, dw, dz, dmu);
    for (int k = 0; k < n; k++)
        dbase[k] += dz[k];
    MHC(mhc_rho_bwd)(n, nd, rho, mu, dmu, X, dX);
    for (int k = 0; k < n; k++) {
        const real c = rho * dmu[k];
        const real *f = fn + (int64_t)k * nd;
        real *df = dfn + (int64_t)k * nd;
        for (int64_t i = 0; i < nd; i++) {
            dX[i] += c * f[i];
            df[i] += c * X[i];
        }
    }
}

#undef real
#undef MHC
#undef MHC_REAL
#undef MHC_SUFFIX
#undef MHC_EXP
#undef MHC_SQRT
