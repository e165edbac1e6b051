/* model/attention_math.h — the scalar core of the attention sub-layer, written once for a `real` type.
 *
 * Include it after defining AM_REAL (float or double) and AM_SFX (f or d); every function is named
 * <name>_<AM_SFX>, e.g. am_pool_forward_f. The layer (attention.c) uses the float build; tests build the
 * double one and check each forward/backward pair against central differences. There is deliberately
 * no include guard: a file may include it once per type. AM_REAL and AM_SFX are undefined at the end.
 *
 * Contents (math in docs/attention.md):
 *   am_dot, am_dot2      dot products with fixed-order partial sums
 *   am_axpy, am_axpy2    y += a x (+ b z)
 *   am_pool_forward      compressor pooling of one block: per-feature softmax over n candidates
 *   am_pool_backward     its vector-Jacobian product
 *   am_sattn_forward     attention of one query (H heads sharing n key=value entries) with a sink
 *   am_sattn_delta       D_h = g_h . o_h
 *   am_sattn_backward_query   dq and d sink of one query (the query side of the backward)
 *   am_sattn_backward_entries gradients of entries from one query (the key side of the backward) */
#if !defined(AM_REAL) || !defined(AM_SFX)
#error "define AM_REAL and AM_SFX before including model/attention_math.h"
#endif

#include <math.h>
#include <stdint.h>

#define AM_CAT_(a, b) a##_##b
#define AM_CAT(a, b) AM_CAT_(a, b)
#define AM(name) AM_CAT(name, AM_SFX)
#define AM_EXP(x) _Generic((x), float: expf, default: exp)(x)
#define AM_LOG(x) _Generic((x), float: logf, default: log)(x)

/* sum_i a_i b_i over 16 interleaved partial sums combined in a fixed tree: deterministic, and the
 * independent sums (named scalars, which compilers keep in vector registers; a local array is not)
 * let the compiler use vector lanes without reassociation (no -ffast-math). */
#ifndef AM_L16
#define AM_L16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#endif
#define AM_DOT_DECL(k) AM_REAL s##k = 0;
#define AM_DOT_STEP(k) s##k += a[i + k] * b[i + k];
static inline AM_REAL AM(am_dot)(const AM_REAL *a, const AM_REAL *b, int64_t n)
{
    AM_L16(AM_DOT_DECL)
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        AM_L16(AM_DOT_STEP)
    }
    AM_REAL t = 0;
    for (; i < n; i++)
        t += a[i] * b[i];
    return ((((s0 + s8) + (s4 + s12)) + ((s1 + s9) + (s5 + s13))) +
            (((s2 + s10) + (s6 + s14)) + ((s3 + s11) + (s7 + s15)))) + t;
}
#undef AM_DOT_DECL
#undef AM_DOT_STEP

/* *sa = a . v and *sb = b . v, each exactly as am_dot computes it (v is hot in cache for the second). */
static inline void AM(am_dot2)(AM_REAL *sa, AM_REAL *sb, const AM_REAL *a, const AM_REAL *b,
                               const AM_REAL *v, int64_t n)
{
    *sa = AM(am_dot)(a, v, n);
    *sb = AM(am_dot)(b, v, n);
}

/* y += a x (y and x do not overlap). Written in blocks of 8 independent lanes so that the compiler
 * vectorises it without alias checks or a cost model that allows loop versioning. */
static inline void AM(am_axpy)(AM_REAL *restrict y, AM_REAL a, const AM_REAL *restrict x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            y[i + k] += a * x[i + k];
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* y += a x + b z (no overlap with y), vectorised like am_axpy. */
static inline void AM(am_axpy2)(AM_REAL *restrict y, AM_REAL a, const AM_REAL *restrict x, AM_REAL b,
                                const AM_REAL *restrict z, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            y[i + k] += a * x[i + k] + b * z[i + k];
    for (; i < n; i++)
        y[i] += a * x[i] + b * z[i];
}

/* Softmax pooling of one compressed block, independently for every feature f = 0..c-1:
 *   S_j[f] = softmax_j(Z_j[f]),   C[f] = sum_j S_j[f] K_j[f],   j = 0..n-1 (n >= 1 candidates).
 * K[j], Z[j] point at candidate j's c features (Z already includes the positional bias ape).
 * ws: scratch of 2c. */
static inline void AM(am_pool_forward)(AM_REAL *C, const AM_REAL *const *K, const AM_REAL *const *Z,
                                       int64_t n, int64_t c, AM_REAL *ws)
{
    AM_REAL *mx = ws, *den = ws + c;
    for (int64_t f = 0; f < c; f++) {
        mx[f] = Z[0][f];
        den[f] = 0;
        C[f] = 0;
    }
    for (int64_t j = 1; j < n; j++)
        for (int64_t f = 0; f < c; f++)
            mx[f] = Z[j][f] > mx[f] ? Z[j][f] : mx[f];
    for (int64_t j = 0; j < n; j++) {
        for (int64_t f = 0; f < c; f++) {
            AM_REAL e = AM_EXP(Z[j][f] - mx[f]);
            den[f] += e;
            C[f] += e * K[j][f];
        }
    }
    for (int64_t f = 0; f < c; f++)
        C[f] /= den[f];
}

/* VJP of am_pool_forward given dC: dK_j[f] += S_j[f] dC[f], dZ_j[f] += S_j[f] (K_j[f] - C[f]) dC[f]
 * (accumulates). S and C are recomputed from K and Z. ws: scratch of 3c. */
static inline void AM(am_pool_backward)(AM_REAL *const *dK, AM_REAL *const *dZ, const AM_REAL *dC,
                                        const AM_REAL *const *K, const AM_REAL *const *Z, int64_t n,
                                        int64_t c, AM_REAL *ws)
{
    AM_REAL *mx = ws, *den = ws + c, *C = ws + 2 * c;
    AM(am_pool_forward)(C, K, Z, n, c, ws);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t f = 0; f < c; f++) {
            AM_REAL s = AM_EXP(Z[j][f] - mx[f]) / den[f];
            AM_REAL sg = s * dC[f];
            dK[j][f] += sg;
            dZ[j][f] += sg * (K[j][f] - C[f]);
        }
    }
}

/* The softmax normalizer of one head's n logits z beside its sink s: *mx = max(s, z_e) and *den =
 * exp(s - mx) + sum_e exp(z_e - mx), e ascending; returns lse = mx + log(den). n may be 0. */
static inline AM_REAL AM(am_sink_lse)(const AM_REAL *z, int64_t n, AM_REAL s, AM_REAL *mx, AM_REAL *den)
{
    AM_REAL m = s;
    for (int64_t e = 0; e < n; e++)
        m = z[e] > m ? z[e] : m;
    AM_REAL d = AM_EXP(s - m);
    for (int64_t e = 0; e < n; e++)
        d += AM_EXP(z[e] - m);
    *mx = m;
    *den = d;
    return m + AM_LOG(d);
}

/* One query, H heads q_h = q[h*c..], n entries V[e] of c dims serving as key and value (MQA):
 *   z_he = scale q_h . v_e,   lse_h = log(sum_e exp z_he + exp sink_h),
 *   o_h  = sum_e exp(z_he - lse_h) v_e.
 * Writes o [H*c], lse [H] and the logits z [H*n] (row h, entry e at z[h*n + e]). n may be 0. */
static inline void AM(am_sattn_forward)(AM_REAL *o, AM_REAL *lse, AM_REAL *z, const AM_REAL *q,
                                        const AM_REAL *const *V, int64_t n, int64_t H, int64_t c,
                                        const AM_REAL *sink, AM_REAL scale)
{
    /* head by head: q_h and o_h stay in the first-level cache while the entries stream past */
    for (int64_t h = 0; h < H; h++) {
        AM_REAL *zh = z + h * n, *oh = o + h * c, mx, den;
        for (int64_t e = 0; e < n; e++)
            zh[e] = scale * AM(am_dot)(q + h * c, V[e], c);
        lse[h] = AM(am_sink_lse)(zh, n, sink[h], &mx, &den);
        for (int64_t i = 0; i < c; i++)
            oh[i] = 0;
        for (int64_t e = 0; e < n; e++)
            AM(am_axpy)(oh, AM_EXP(zh[e] - lse[h]), V[e], c);
    }
}

/* D_h = g_h . o_h for the H heads of one query. */
static inline void AM(am_sattn_delta)(AM_REAL *D, const AM_REAL *g, const AM_REAL *o, int64_t H,
                                      int64_t c)
{
    for (int64_t h = 0; h < H; h++)
        D[h] = AM(am_dot)(g + h * c, o + h * c, c);
}

/* Query side of the backward of am_sattn_forward, given g = dL/do [H*c], the saved lse and D:
 *   p_e = exp(z_e - lse), dz_e = p_e (g.v_e - D),  dq = scale sum_e dz_e v_e,
 *   dsink = -exp(sink - lse) D.
 * Writes dq [H*c] and dsink [H]; P (may be NULL) receives p [H*n] laid out like z. */
static inline void AM(am_sattn_backward_query)(AM_REAL *dq, AM_REAL *dsink, AM_REAL *P,
                                               const AM_REAL *g, const AM_REAL *q,
                                               const AM_REAL *const *V, int64_t n, int64_t H,
                                               int64_t c, const AM_REAL *sink, AM_REAL scale,
                                               const AM_REAL *lse, const AM_REAL *D)
{
    for (int64_t h = 0; h < H; h++) {
        AM_REAL *dqh = dq + h * c;
        for (int64_t i = 0; i < c; i++)
            dqh[i] = 0;
        for (int64_t e = 0; e < n; e++) {
            AM_REAL qv, gv;
            AM(am_dot2)(&qv, &gv, q + h * c, g + h * c, V[e], c);
            AM_REAL p = AM_EXP(scale * qv - lse[h]);
            AM_REAL dz = p * (gv - D[h]);
            AM(am_axpy)(dqh, scale * dz, V[e], c);
            if (P)
                P[h * n + e] = p;
        }
        dsink[h] = -AM_EXP(sink[h] - lse[h]) * D[h];
    }
}

/* Key side: the gradient that each of the n entries V[e] receives from one query (all H heads), in
 * both its key and its value role: dV[e] += sum_h p_he g_h + scale dz_he q_h (accumulates, heads in
 * ascending order). psum[e] receives sum_h p_he. */
static inline void AM(am_sattn_backward_entries)(AM_REAL *const *dV, AM_REAL *psum,
                                                 const AM_REAL *const *V, int64_t n,
                                                 const AM_REAL *q, const AM_REAL *g, int64_t H,
                                                 int64_t c, AM_REAL scale, const AM_REAL *lse,
                                                 const AM_REAL *D)
{
    for (int64_t e = 0; e < n; e++)
        psum[e] = 0;
    for (int64_t h = 0; h < H; h++) {
        const AM_REAL *qh = q + h * c, *gh = g + h * c;
        for (int64_t e = 0; e < n; e++) {
            AM_REAL qv, gv;
            AM(am_dot2)(&qv, &gv, qh, gh, V[e], c);
            AM_REAL p = AM_EXP(scale * qv - lse[h]);
            AM_REAL sdz = scale * (p * (gv - D[h]));
            AM(am_axpy2)(dV[e], p, gh, sdz, qh, c);
            psum[e] += p;
        }
    }
}

#undef AM_REAL
#undef AM_SFX
