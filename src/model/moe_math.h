/* model/moe_math.h — the router's scalar math (sqrt-softplus affinity, normalised mixing weights,
 * affinity shares of the balance loss) and their backward, written once over a `real` type.
 *
 * A template by inclusion: define MOE_REAL (float or double) and MOE_SFX (a name suffix, e.g. _f) and
 * include this file; it may be included again for another type. model/moe.c uses the float instance;
 * tests/test_moe.c checks the double instance against central differences. Everything is static
 * inline, so an instance that a file does not use costs nothing. Derivations: docs/moe.md. */
#if !defined(MOE_REAL) || !defined(MOE_SFX)
#error "define MOE_REAL and MOE_SFX before including model/moe_math.h"
#endif

#include <math.h>
#include <stdint.h>

#ifndef MOE_MATH_COMMON_
#define MOE_MATH_COMMON_
#define MOE_CAT2_(a, b) a##b
#define MOE_CAT_(a, b) MOE_CAT2_(a, b)
/* libm by argument type, without <tgmath.h>'s effect on the rest of the including file. */
#define MOE_EXP_(x) _Generic((x), float: expf, default: exp)(x)
#define MOE_LOG1P_(x) _Generic((x), float: log1pf, default: log1p)(x)
#define MOE_SQRT_(x) _Generic((x), float: sqrtf, default: sqrt)(x)
#endif

#define MOE_FN_(name) MOE_CAT_(name, MOE_SFX)

/* softplus(z) = log(1 + e^z), without overflow for large z. */
static inline MOE_REAL MOE_FN_(moe_softplus)(MOE_REAL z)
{
    return z > 0 ? z + MOE_LOG1P_(MOE_EXP_(-z)) : MOE_LOG1P_(MOE_EXP_(z));
}

/* Affinity s = sqrt(softplus(z)). For z <= 0 it is written with h = e^{z/2} and w = h^2 = e^z as
 * s = h * sqrt(log1p(w)/w): full relative precision down to where e^{z/2} itself underflows, whereas
 * sqrt(log1p(e^z)) is 0 as soon as e^z does. NaN in, NaN out. */
static inline MOE_REAL MOE_FN_(moe_sqrtsp)(MOE_REAL z)
{
    if (z > 0)
        return MOE_SQRT_(z + MOE_LOG1P_(MOE_EXP_(-z)));
    const MOE_REAL h = MOE_EXP_(z * (MOE_REAL)0.5), w = h * h;
    return w > 0 ? h * MOE_SQRT_(MOE_LOG1P_(w) / w) : h;
}

/* ds/dz = sigma(z) / (2 sqrt(softplus(z))). For z <= 0: sigma = w/(1+w) and s = h*r with
 * r = sqrt(log1p(w)/w), so ds/dz = h / (2 (1+w) r), which tends to e^{z/2}/2 as z -> -inf. */
static inline MOE_REAL MOE_FN_(moe_sqrtsp_grad)(MOE_REAL z)
{
    if (z > 0) {
        const MOE_REAL e = MOE_EXP_(-z);
        return (MOE_REAL)1 / (((MOE_REAL)1 + e) * (MOE_REAL)2 * MOE_SQRT_(z + MOE_LOG1P_(e)));
    }
    const MOE_REAL h = MOE_EXP_(z * (MOE_REAL)0.5), w = h * h;
    const MOE_REAL r = w > 0 ? MOE_SQRT_(MOE_LOG1P_(w) / w) : (MOE_REAL)1;
    return h / ((MOE_REAL)2 * ((MOE_REAL)1 + w) * r);
}

/* Mixing weights of one token: g_k = scale * s_k / S with S = sum_k s_k (k in order) over the K
 * selected affinities s[0..K-1]. Returns S. */
static inline MOE_REAL MOE_FN_(moe_mix)(int64_t K, const MOE_REAL *s, MOE_REAL scale, MOE_REAL *g)
{
    MOE_REAL S = 0;
    for (int64_t k = 0; k < K; k++)
        S += s[k];
    for (int64_t k = 0; k < K; k++)
        g[k] = s[k] / S * scale;
    return S;
}

/* Backward of moe_mix: dg/ds_j = scale (delta_kj S - s_k) / S^2, so
 * ds_j = (scale / S) * (dg_j - sum_k dg_k s_k / S). Writes ds[0..K-1]. */
static inline void MOE_FN_(moe_mix_backward)(int64_t K, const MOE_REAL *s, MOE_REAL scale,
                                             const MOE_REAL *dg, MOE_REAL *ds)
{
    MOE_REAL S = 0, dot = 0;
    for (int64_t k = 0; k < K; k++)
        S += s[k];
    for (int64_t k = 0; k < K; k++)
        dot += dg[k] * s[k];
    const MOE_REAL mean = dot / S, c = scale / S;
    for (int64_t k = 0; k < K; k++)
        ds[k] = c * (dg[k] - mean);
}

/* Shares of one token's affinity over all E experts: q_i = s_i / sum_j s_j (j in order), the
 * summand of P_i in the balance loss. Returns the sum. */
static inline MOE_REAL MOE_FN_(moe_share)(int64_t E, const MOE_REAL *s, MOE_REAL *q)
{
    MOE_REAL sum = 0;
    for (int64_t i = 0; i < E; i++)
        sum += s[i];
    for (int64_t i = 0; i < E; i++)
        q[i] = s[i] / sum;
    return sum;
}

/* Backward of moe_share given c_i = dL/dq_i: ds_j += (c_j - sum_i c_i q_i) / sum.
 * ACCUMULATES into ds[0..E-1]. */
static inline void MOE_FN_(moe_share_backward)(int64_t E, const MOE_REAL *s, const MOE_REAL *c,
                                               MOE_REAL *ds)
{
    MOE_REAL sum = 0, dot = 0;
    for (int64_t i = 0; i < E; i++)
        sum += s[i];
    for (int64_t i = 0; i < E; i++)
        dot += c[i] * s[i];
    const MOE_REAL mean = dot / sum;
    for (int64_t j = 0; j < E; j++)
        ds[j] += (c[j] - mean) / sum;
}

#undef MOE_FN_
