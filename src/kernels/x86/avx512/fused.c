/* kernels/x86/avx512/fused.c — AVX-512 leaves of the fused-kernel table (kernels/fused.h).
 *
 * Each entry gives the bits of its reference (model/attention_math.h, model/mhc_real.h):
 *   - a dot product's 16 interleaved partial sums are the 16 lanes of one register, updated with a
 *     separate multiply and add, and combined in the reference's tree; the tail (n mod 16) is summed
 *     after, sequentially, as there. Several dot products run at once (4 vectors x 4 entries) for
 *     independent chains; V's block of entries stays in L1 while every head passes over it;
 *   - a weighted sum of vectors (o_h = sum_e p_he v_e, dq_h, dV_e) keeps each element's additions in
 *     the reference's order (entries ascending, heads ascending), 16 elements per register and up to
 *     16 sums in registers at once;
 *   - exp / log are libm's scalar expf / logf on the same arguments.
 * Compiled with -mavx512f -mavx512bw -mavx512vl (Makefile rule for this folder) and ISO C, so the
 * compiler does not contract multiplies and adds into FMAs. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "trex/status.h"

#define TREX_FUSED_ASSERT_N(n) TREX_ASSERT((n) >= 1 && (n) <= 8)

/* ((b0 + b1) + (b2 + b3)) with b_k = (s_k + s_{k+8}) + (s_{k+4} + s_{k+12}): am_dot's tree. */
static inline float tree16(__m512 v)
{
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 a = _mm256_add_ps(lo, hi);                               /* s_k + s_{k+8} */
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    float t[4];
    _mm_storeu_ps(t, b);
    return (t[0] + t[1]) + (t[2] + t[3]);
}

static inline float tail_dot(const float *a, const float *b, int64_t i, int64_t n)
{
    float t = 0.0f;
    for (; i < n; i++)
        t += a[i] * b[i];
    return t;
}

float trex_fused_dot_avx512(const float *a, const float *b, int64_t n)
{
    __m512 s = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    return tree16(s) + tail_dot(a, b, i, n);
}

/* out[r*ldo + e*lde] = alpha * dot(A + r*lda, V[e], c) for r < R, e < n (alpha applied after the dot,
 * as "scale * am_dot(...)"; alpha 1 leaves the dot as it is). Blocks of 4 rows x 4 entries. */
#define DOTS_BODY(RB, EB)                                                                          \
    do {                                                                                          \
        __m512 acc[RB][EB];                                                                       \
        _Pragma("GCC unroll 16") for (int r_ = 0; r_ < (RB); r_++)                                                         \
            _Pragma("GCC unroll 16") for (int e_ = 0; e_ < (EB); e_++)                                                     \
                acc[r_][e_] = _mm512_setzero_ps();                                                \
        int64_t i = 0;                                                                            \
        for (; i + 16 <= c; i += 16) {                                                            \
            __m512 v[EB];                                                                         \
            _Pragma("GCC unroll 16") for (int e_ = 0; e_ < (EB); e_++)                                                     \
                v[e_] = _mm512_loadu_ps(V[e0 + e_] + i);                                          \
            _Pragma("GCC unroll 16") for (int r_ = 0; r_ < (RB); r_++) {                                                   \
                const __m512 a_ = _mm512_loadu_ps(A + (r0 + r_) * lda + i);                       \
                _Pragma("GCC unroll 16") for (int e_ = 0; e_ < (EB); e_++)                                                 \
                    acc[r_][e_] = _mm512_add_ps(acc[r_][e_], _mm512_mul_ps(a_, v[e_]));           \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 16") for (int r_ = 0; r_ < (RB); r_++)                                                         \
            _Pragma("GCC unroll 16") for (int e_ = 0; e_ < (EB); e_++) {                                                   \
                const float *ar_ = A + (r0 + r_) * lda;                                           \
                float d_ = tree16(acc[r_][e_]) + tail_dot(ar_, V[e0 + e_], i, c);                 \
                out[(r0 + r_) * ldo + (e0 + e_) * lde] = scaled ? alpha * d_ : d_;                \
            }                                                                                     \
    } while (0)

static void dots(float *out, int64_t ldo, int64_t lde, const float *A, int64_t lda, int64_t R,
                 const float *const *V, int64_t n, int64_t c, float alpha, int scaled)
{
    int64_t e0 = 0;
    for (; e0 + 4 <= n; e0 += 4) {
        int64_t r0 = 0;
        for (; r0 + 4 <= R; r0 += 4)
            DOTS_BODY(4, 4);
        for (; r0 < R; r0++)
            DOTS_BODY(1, 4);
    }
    for (; e0 < n; e0++) {
        int64_t r0 = 0;
        for (; r0 + 4 <= R; r0 += 4)
            DOTS_BODY(4, 1);
        for (; r0 < R; r0++)
            DOTS_BODY(1, 1);
    }
}

/* y += a x: per element the multiply, then the add, as am_axpy_f (so its bits), 16 lanes at a time. */
void trex_fused_axpy_avx512(float *y, float a, const float *x, int64_t n)
{
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i),
                                              _mm512_mul_ps(va, _mm512_loadu_ps(x + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        const __m512 ax = _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x + i));
        _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), ax));
    }
}

void trex_fused_dots_avx512(float *out, const float *A, int64_t lda, int64_t R,
                            const float *const *V, int64_t n, int64_t c)
{
    dots(out, n, 1, A, lda, R, V, n, c, 1.0f, 0);
}

/* out_h[i] = sum over e ascending of coef[e*H + h] * V[e][i], from +0, for h < H, i < c
 * (o_h[i] = 0; then am_axpy per entry). HB sums of one 16-float column stay in registers. */
#define WSUM_BODY(HB)                                                                              \
    do {                                                                                          \
        __m512 acc[HB];                                                                           \
        _Pragma("GCC unroll 16") for (int h_ = 0; h_ < (HB); h_++)                                                         \
            acc[h_] = _mm512_setzero_ps();                                                        \
        for (int64_t e = 0; e < n; e++) {                                                         \
            const __m512 v = _mm512_maskz_loadu_ps(m, V[e] + i);                                  \
            const float *ce = coef + e * H + h0;                                                  \
            _Pragma("GCC unroll 16") for (int h_ = 0; h_ < (HB); h_++)                                                     \
                acc[h_] = _mm512_add_ps(acc[h_], _mm512_mul_ps(_mm512_set1_ps(ce[h_]), v));       \
        }                                                                                         \
        _Pragma("GCC unroll 16") for (int h_ = 0; h_ < (HB); h_++)                                                         \
            _mm512_mask_storeu_ps(out + (h0 + h_) * c + i, m, acc[h_]);                           \
    } while (0)

static void wsum(float *out, const float *coef, const float *const *V, int64_t n, int64_t H,
                 int64_t c)
{
    for (int64_t i = 0; i < c; i += 16) {
        const __mmask16 m = c - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c - i)) - 1u);
        int64_t h0 = 0;
        for (; h0 + 16 <= H; h0 += 16)
            WSUM_BODY(16);
        for (; h0 + 4 <= H; h0 += 4)
            WSUM_BODY(4);
        for (; h0 < H; h0++)
            WSUM_BODY(1);
    }
}

void trex_fused_sattn_fwd_avx512(float *o, float *lse, float *z, float *ws, const float *q,
                                 const float *const *V, int64_t n, int64_t H, int64_t c,
                                 const float *sink, float scale)
{
    float *p = ws; /* [n][H] */
    dots(z, n, 1, q, c, H, V, n, c, scale, 1);
    for (int64_t h = 0; h < H; h++) {
        const float *zh = z + h * n;
        float mx = sink[h];
        for (int64_t e = 0; e < n; e++)
            mx = zh[e] > mx ? zh[e] : mx;
        float den = expf(sink[h] - mx);
        for (int64_t e = 0; e < n; e++)
            den += expf(zh[e] - mx);
        lse[h] = mx + logf(den);
        for (int64_t e = 0; e < n; e++)
            p[e * H + h] = expf(zh[e] - lse[h]);
    }
    wsum(o, p, V, n, H, c);
}

void trex_fused_sattn_bwd_query_avx512(float *dq, float *dsink, float *P, float *ws, const float *g,
                                       const float *q, const float *const *V, int64_t n, int64_t H,
                                       int64_t c, const float *sink, float scale, const float *lse,
                                       const float *D)
{
    float *qv = ws, *gv = ws + H * n, *coef = ws + 2 * H * n; /* [H][n], [H][n], [n][H] */
    dots(qv, n, 1, q, c, H, V, n, c, 1.0f, 0);
    dots(gv, n, 1, g, c, H, V, n, c, 1.0f, 0);
    for (int64_t h = 0; h < H; h++) {
        for (int64_t e = 0; e < n; e++) {
            const float p = expf(scale * qv[h * n + e] - lse[h]);
            const float dz = p * (gv[h * n + e] - D[h]);
            coef[e * H + h] = scale * dz;
            if (P)
                P[h * n + e] = p;
        }
        dsink[h] = -expf(sink[h] - lse[h]) * D[h];
    }
    wsum(dq, coef, V, n, H, c);
}

/* dV[e][i] += sum over h ascending of (p_he g_h[i] + sdz_he q_h[i]); EB entries in registers. */
#define ENT_BODY(EB)                                                                               \
    do {                                                                                          \
        __m512 acc[EB];                                                                           \
        _Pragma("GCC unroll 16") for (int e_ = 0; e_ < (EB); e_++)                                                         \
            acc[e_] = _mm512_maskz_loadu_ps(m, dV[e0 + e_] + i);                                  \
        for (int64_t h = 0; h < H; h++) {                                                         \
            const __m512 gq = _mm512_maskz_loadu_ps(m, g + h * c + i);                            \
            const __m512 qq = _mm512_maskz_loadu_ps(m, q + h * c + i);                            \
            _Pragma("GCC unroll 16") for (int e_ = 0; e_ < (EB); e_++) {                                                   \
                const __m512 t_ = _mm512_add_ps(                                                  \
                    _mm512_mul_ps(_mm512_set1_ps(pp[(e0 + e_) * H + h]), gq),                     \
                    _mm512_mul_ps(_mm512_set1_ps(sdz[(e0 + e_) * H + h]), qq));                   \
                acc[e_] = _mm512_add_ps(acc[e_], t_);                                             \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 16") for (int e_ = 0; e_ < (EB); e_++)                                                         \
            _mm512_mask_storeu_ps(dV[e0 + e_] + i, m, acc[e_]);                                   \
    } while (0)

void trex_fused_sattn_bwd_entries_avx512(float *const *dV, float *psum, float *ws,
                                         const float *const *V, int64_t n, const float *q,
                                         const float *g, int64_t H, int64_t c, float scale,
                                         const float *lse, const float *D)
{
    float *qv = ws, *gv = ws + H * n, *pp = ws + 2 * H * n, *sdz = ws + 3 * H * n;
    dots(qv, n, 1, q, c, H, V, n, c, 1.0f, 0);
    dots(gv, n, 1, g, c, H, V, n, c, 1.0f, 0);
    for (int64_t e = 0; e < n; e++)
        psum[e] = 0.0f;
    for (int64_t h = 0; h < H; h++) {
        for (int64_t e = 0; e < n; e++) {
            const float p = expf(scale * qv[h * n + e] - lse[h]);
            pp[e * H + h] = p;
            sdz[e * H + h] = scale * (p * (gv[h * n + e] - D[h]));
            psum[e] += p;
        }
    }
    for (int64_t i = 0; i < c; i += 16) {
        const __mmask16 m = c - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c - i)) - 1u);
        int64_t e0 = 0;
        for (; e0 + 4 <= n; e0 += 4)
            ENT_BODY(4);
        for (; e0 < n; e0++)
            ENT_BODY(1);
    }
}

void trex_fused_mhc_post_fwd_avx512(int n, int64_t d, const float *post, const float *comb,
                                    const float *y, const float *X, float *Xo)
{
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - i)) - 1u);
        const __m512 yv = _mm512_maskz_loadu_ps(m, y + i);
        __m512 xj[8];
        for (int j = 0; j < n && j < 8; j++)
            xj[j] = _mm512_maskz_loadu_ps(m, X + (int64_t)j * d + i);
        for (int k = 0; k < n; k++) {
            __m512 s = _mm512_mul_ps(_mm512_set1_ps(post[k]), yv);
            for (int j = 0; j < n; j++) {
                const __m512 x = j < 8 ? xj[j] : _mm512_maskz_loadu_ps(m, X + (int64_t)j * d + i);
                s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(comb[j * n + k]), x));
            }
            _mm512_mask_storeu_ps(Xo + (int64_t)k * d + i, m, s);
        }
    }
}

void trex_fused_mhc_collapse_avx512(int n, int64_t d, const float *w, const float *X, float *x)
{
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - i)) - 1u);
        __m512 s = _mm512_setzero_ps();
        for (int k = 0; k < n; k++)
            s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(w[k]),
                                               _mm512_maskz_loadu_ps(m, X + (int64_t)k * d + i)));
        _mm512_mask_storeu_ps(x + i, m, s);
    }
}

/* The n values v[k*d + i] (k < n <= 8) of column i, widened to doubles in lanes k (others 0). */
static inline __m512d column_pd(const float *v, __m256i idx, __mmask8 m, int64_t i)
{
    const __m256 f = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), m, idx, v + i, 4);
    return _mm512_cvtps_pd(f);
}

/* The sums over i of mhc_post_tok_bwd_f, each in double and in order of i, run in the lanes of a few
 * registers at once: dcomb[j*n + k] in lane k of acc[j], dpost[k] in lane k of accp. */
void trex_fused_mhc_post_bwd_avx512(int n, int64_t d, const float *post, const float *comb,
                                    const float *y, const float *X, const float *dXo, float *dy,
                                    float *dX, float *dpost, float *dcomb)
{
    TREX_FUSED_ASSERT_N(n);
    /* dy and dX: element-wise, k ascending from +0 */
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - i)) - 1u);
        __m512 g[8];
        for (int k = 0; k < n; k++)
            g[k] = _mm512_maskz_loadu_ps(m, dXo + (int64_t)k * d + i);
        __m512 s = _mm512_setzero_ps();
        for (int k = 0; k < n; k++)
            s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(post[k]), g[k]));
        _mm512_mask_storeu_ps(dy + i, m, s);
        for (int j = 0; j < n; j++) {
            __m512 t = _mm512_setzero_ps();
            for (int k = 0; k < n; k++)
                t = _mm512_add_ps(t, _mm512_mul_ps(_mm512_set1_ps(comb[j * n + k]), g[k]));
            _mm512_mask_storeu_ps(dX + (int64_t)j * d + i, m, t);
        }
    }
    const __mmask8 m8 = (__mmask8)((1u << n) - 1u);
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm256_set1_epi32((int)d));
    __m512d acc[8], accp = _mm512_setzero_pd();
    for (int j = 0; j < 8; j++)
        acc[j] = _mm512_setzero_pd();
    for (int64_t i = 0; i < d; i++) {
        const __m512d g = column_pd(dXo, idx, m8, i);
        accp = _mm512_add_pd(accp, _mm512_mul_pd(g, _mm512_set1_pd((double)y[i])));
        for (int j = 0; j < n; j++)
            acc[j] = _mm512_add_pd(acc[j],
                                   _mm512_mul_pd(_mm512_set1_pd((double)X[(int64_t)j * d + i]), g));
    }
    double t[8];
    _mm512_storeu_pd(t, accp);
    for (int k = 0; k < n; k++)
        dpost[k] = (float)t[k];
    for (int j = 0; j < n; j++) {
        _mm512_storeu_pd(t, acc[j]);
        for (int k = 0; k < n; k++)
            dcomb[j * n + k] = (float)t[k];
    }
}

void trex_fused_mhc_collapse_bwd_avx512(int n, int64_t d, const float *w, const float *X,
                                        const float *dx, float *dw, float *dX)
{
    TREX_FUSED_ASSERT_N(n);
    const __mmask8 m8 = (__mmask8)((1u << n) - 1u);
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm256_set1_epi32((int)d));
    __m512d acc = _mm512_setzero_pd();
    for (int64_t i = 0; i < d; i++)
        acc = _mm512_add_pd(acc, _mm512_mul_pd(column_pd(X, idx, m8, i),
                                               _mm512_set1_pd((double)dx[i])));
    double t[8];
    _mm512_storeu_pd(t, acc);
    for (int k = 0; k < n; k++)
        dw[k] = (float)t[k];
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - i)) - 1u);
        const __m512 g = _mm512_maskz_loadu_ps(m, dx + i);
        for (int k = 0; k < n; k++) {
            float *o = dX + (int64_t)k * d + i;
            _mm512_mask_storeu_ps(o, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, o),
                                                      _mm512_mul_ps(_mm512_set1_ps(w[k]), g)));
        }
    }
}
