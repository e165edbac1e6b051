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
#include "kernels/x86/avx512/bf16.h"
#include "kernels/x86/avx512/mask.h"
#include "trex/status.h"

#define AM_REAL float
#define AM_SFX f
#include "model/attention_math.h" /* am_sink_lse_f: the softmax's normalizer, scalar as there */

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

float AVX512_LEAF(trex_fused_dot)(const float *a, const float *b, int64_t n)
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
void AVX512_LEAF(trex_fused_axpy)(float *y, float a, const float *x, int64_t n)
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

/* copy_nt: streaming stores from the first 64-byte boundary of dst on, plain ones around them */
void AVX512_LEAF(trex_fused_copy_nt)(float *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i < n && ((uintptr_t)(dst + i) & 63) != 0; i++)
        dst[i] = src[i];
    for (; i + 16 <= n; i += 16)
        _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
    for (; i < n; i++)
        dst[i] = src[i];
    _mm_sfence();
}

/* cvt_bf16_nt: 16 floats to 16 bf16 as trex_f32_to_bf16 (avx512/bf16.h), streaming 32-byte stores
 * from the first 32-byte boundary of dst on */
void AVX512_LEAF(trex_fused_cvt_bf16_nt)(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    const int64_t lead = (int64_t)((32 - ((uintptr_t)dst & 31)) & 31) / 2;
    if (((uintptr_t)dst & 1) == 0 && lead > 0) {
        const int64_t k = lead < n ? lead : n;
        const __mmask16 m = (__mmask16)((1u << k) - 1u);
        _mm256_mask_storeu_epi16(dst, m, bf16_round16(_mm512_maskz_loadu_ps(m, src)));
        i = k;
    }
    if (((uintptr_t)(dst + i) & 31) == 0)
        for (; i + 16 <= n; i += 16)
            _mm256_stream_si256((__m256i *)(dst + i), bf16_round16(_mm512_loadu_ps(src + i)));
    for (; i < n; i += 16) {
        const int64_t k = n - i < 16 ? n - i : 16;
        const __mmask16 m = (__mmask16)((1u << k) - 1u);
        _mm256_mask_storeu_epi16(dst + i, m, bf16_round16(_mm512_maskz_loadu_ps(m, src + i)));
    }
    _mm_sfence();
}

/* rope: 16 pairs per step, split into their first and second members, rotated with a separate
 * multiply per product and one subtract (add), as trex_rope_rotate; the pairs past the last multiple
 * of 16 with masks. */
void AVX512_LEAF(trex_fused_rope)(float *v, int64_t nv, int64_t ld, const float *cs, const float *sn,
                            int64_t half, int inverse)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512i flip = _mm512_set1_epi32(inverse ? (int)0x80000000u : 0);
    for (int64_t k = 0; k < nv; k++) {
        float *x = v + k * ld;
        for (int64_t i = 0; i < half; i += 16) {
            const int64_t np = half - i < 16 ? half - i : 16;
            const __mmask16 m = (__mmask16)((1u << np) - 1u);
            const __mmask16 m0 = (__mmask16)(np >= 8 ? 0xffffu : (1u << (2 * np)) - 1u);
            const __mmask16 m1 = (__mmask16)(np <= 8 ? 0u : (1u << (2 * (np - 8))) - 1u);
            const __m512 x0 = _mm512_maskz_loadu_ps(m0, x + 2 * i);
            const __m512 x1 = _mm512_maskz_loadu_ps(m1, x + 2 * i + 16);
            const __m512 a = _mm512_permutex2var_ps(x0, ev, x1), b = _mm512_permutex2var_ps(x0, od, x1);
            const __m512 c = _mm512_maskz_loadu_ps(m, cs + i);
            const __m512 sv = _mm512_castsi512_ps(
                _mm512_xor_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, sn + i)), flip));
            const __m512 r0 = _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, sv));
            const __m512 r1 = _mm512_add_ps(_mm512_mul_ps(a, sv), _mm512_mul_ps(b, c));
            _mm512_mask_storeu_ps(x + 2 * i, m0, _mm512_permutex2var_ps(r0, lo, r1));
            _mm512_mask_storeu_ps(x + 2 * i + 16, m1, _mm512_permutex2var_ps(r0, hi, r1));
        }
    }
}

/* rms_head_bwd: the dot as trex_fused_dot above, then 16 elements per step (a multiply, a subtract,
 * a multiply, as the reference), the tail with a mask. */
void AVX512_LEAF(trex_fused_rms_head_bwd)(float *g, const float *q, const float *rs, int64_t H, int64_t c)
{
    for (int64_t h = 0; h < H; h++) {
        float *gh = g + h * c;
        const float *qh = q + h * c;
        const __m512 m = _mm512_set1_ps(AVX512_LEAF(trex_fused_dot)(gh, qh, c) / (float)c);
        const __m512 r = _mm512_set1_ps(rs[h]);
        for (int64_t i = 0; i < c; i += 16) {
            const __mmask16 k = tail_mask(c - i);
            const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, gh + i),
                                           _mm512_mul_ps(_mm512_maskz_loadu_ps(k, qh + i), m));
            _mm512_mask_storeu_ps(gh + i, k, _mm512_mul_ps(r, d));
        }
    }
}

/* trex_fused_axpy_rows_fn: 128 floats of a row Y_r (8 registers) at a time over all J terms, each
 * term a multiply then an add as above, so the same bits as one axpy call per term; a term that is
 * off is masked out of the add (no branch per term: the flags follow the data, about half on in the
 * indexer's KL gradients), which leaves the row exactly as skipping it. */
void AVX512_LEAF(trex_fused_axpy_rows)(float *Y, int64_t ldy, int64_t R, const float *A,
                                 const unsigned char *on, int64_t sr, int64_t sj,
                                 const float *const *X, int64_t J, int64_t c)
{
    for (int64_t r = 0; r < R; r++) {
        float *y = Y + r * ldy;
        const float *a = A + r * sr;
        const unsigned char *o = on + r * sr;
        int64_t i = 0;
        for (; i + 128 <= c; i += 128) {
            __m512 acc[8];
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
                acc[k] = _mm512_loadu_ps(y + i + 16 * k);
            for (int64_t j = 0; j < J; j++) {
                const __mmask16 m = (__mmask16)(o[j * sj] ? 0xffffu : 0u);
                const __m512 va = _mm512_set1_ps(a[j * sj]);
                const float *x = X[j] + i;
                _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
                    acc[k] = _mm512_mask_add_ps(acc[k], m, acc[k],
                                                _mm512_mul_ps(va, _mm512_loadu_ps(x + 16 * k)));
            }
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
                _mm512_storeu_ps(y + i + 16 * k, acc[k]);
        }
        if (i < c)
            for (int64_t j = 0; j < J; j++)
                if (o[j * sj])
                    AVX512_LEAF(trex_fused_axpy)(y + i, a[j * sj], X[j] + i, c - i);
    }
}

void AVX512_LEAF(trex_fused_dots)(float *out, const float *A, int64_t lda, int64_t R,
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
        const __mmask16 m = tail_mask(c - i);
        int64_t h0 = 0;
        for (; h0 + 16 <= H; h0 += 16)
            WSUM_BODY(16);
        for (; h0 + 4 <= H; h0 += 4)
            WSUM_BODY(4);
        for (; h0 < H; h0++)
            WSUM_BODY(1);
    }
}

void AVX512_LEAF(trex_fused_sattn_fwd)(float *o, float *lse, float *z, float *ws, const float *q,
                                 const float *const *V, int64_t n, int64_t H, int64_t c,
                                 const float *sink, float scale)
{
    float *p = ws; /* [n][H] */
    dots(z, n, 1, q, c, H, V, n, c, scale, 1);
    for (int64_t h = 0; h < H; h++) {
        const float *zh = z + h * n;
        float mx, den;
        lse[h] = am_sink_lse_f(zh, n, sink[h], &mx, &den);
        for (int64_t e = 0; e < n; e++)
            p[e * H + h] = expf(zh[e] - lse[h]);
    }
    wsum(o, p, V, n, H, c);
}

void AVX512_LEAF(trex_fused_sattn_bwd_query)(float *dq, float *dsink, float *P, float *ws, const float *g,
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

void AVX512_LEAF(trex_fused_sattn_bwd_entries)(float *const *dV, float *psum, float *ws,
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
        const __mmask16 m = tail_mask(c - i);
        int64_t e0 = 0;
        for (; e0 + 4 <= n; e0 += 4)
            ENT_BODY(4);
        for (; e0 < n; e0++)
            ENT_BODY(1);
    }
}

void AVX512_LEAF(trex_fused_mhc_post_fwd)(int n, int64_t d, const float *post, const float *comb,
                                    const float *y, const float *X, float *Xo)
{
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = tail_mask(d - i);
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

void AVX512_LEAF(trex_fused_mhc_collapse)(int n, int64_t d, const float *w, const float *X, float *x)
{
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = tail_mask(d - i);
        __m512 s = _mm512_setzero_ps();
        for (int k = 0; k < n; k++)
            s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(w[k]),
                                               _mm512_maskz_loadu_ps(m, X + (int64_t)k * d + i)));
        _mm512_mask_storeu_ps(x + i, m, s);
    }
}

/* mhc_lane_dot (model/mhc_real.h) of float rows: 16 double lanes, value i in lane i mod 16, as two
 * registers of 8 doubles (lanes 0-7, 8-15); a product of two floats is exact in double, so one fused
 * multiply-add per lane rounds once, as the reference's product then add; the tail is a masked load
 * (zeros add +0); the lanes combine in trex_lanes_sum16's tree. */
static inline double lanes_tree(__m512d a0, __m512d a1)
{
    const __m512d s = _mm512_add_pd(a0, a1);
    const __m256d t = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));
    const __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
    return _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)));
}

static inline __m512d lo_pd(__m512 v)
{
    return _mm512_cvtps_pd(_mm512_castps512_ps256(v));
}

static inline __m512d hi_pd(__m512 v)
{
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* The sums over i of mhc_post_tok_bwd_f: for each destination stream k, dpost[k] = dXo_k . y and
 * dcomb[j*n + k] = X_j . dXo_k for every j, n + 1 lane sums side by side (2 registers each). */
static inline __attribute__((always_inline)) void post_sums(int n, int64_t d, const float *y,
                                                            const float *X, const float *dXo,
                                                            float *dpost, float *dcomb)
{
    for (int k = 0; k < n; k++) {
        const float *gk = dXo + (int64_t)k * d;
        __m512d ap0 = _mm512_setzero_pd(), ap1 = _mm512_setzero_pd();
        __m512d a0[8], a1[8];
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
            a0[j] = a1[j] = _mm512_setzero_pd();
        for (int64_t i = 0; i < d; i += 16) {
            const __mmask16 m = tail_mask(d - i);
            const __m512 gv = _mm512_maskz_loadu_ps(m, gk + i), yv = _mm512_maskz_loadu_ps(m, y + i);
            const __m512d g0 = lo_pd(gv), g1 = hi_pd(gv);
            ap0 = _mm512_fmadd_pd(g0, lo_pd(yv), ap0);
            ap1 = _mm512_fmadd_pd(g1, hi_pd(yv), ap1);
            _Pragma("GCC unroll 8") for (int j = 0; j < n; j++) {
                const __m512 xv = _mm512_maskz_loadu_ps(m, X + (int64_t)j * d + i);
                a0[j] = _mm512_fmadd_pd(lo_pd(xv), g0, a0[j]);
                a1[j] = _mm512_fmadd_pd(hi_pd(xv), g1, a1[j]);
            }
        }
        dpost[k] = (float)lanes_tree(ap0, ap1);
        _Pragma("GCC unroll 8") for (int j = 0; j < n; j++)
            dcomb[j * n + k] = (float)lanes_tree(a0[j], a1[j]);
    }
}

/* A masked 8-float load widened to 8 doubles (VCVTPS2PD from memory: no shuffle for the upper half). */
static inline __m512d wide8(const float *p, __mmask8 m)
{
    return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p));
}

/* post_sums for n = 4 (dsv4's hc_mult), two destination streams per pass over i: each float is widened
 * once per pair of streams instead of once per stream, straight from memory, and the pair's 20 sums stay
 * in registers. The same lanes (value i in lane i mod 16: 8-element halves in two registers) and order,
 * so the same bits as post_sums. */
static void post_sums4(int64_t d, const float *y, const float *X, const float *dXo, float *dpost,
                       float *dcomb)
{
    for (int k0 = 0; k0 < 4; k0 += 2) {
        const float *ga = dXo + (int64_t)k0 * d, *gb = ga + d;
        __m512d pa[2], pb[2], aa[4][2], ab[4][2];
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            pa[h] = pb[h] = _mm512_setzero_pd();
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
                aa[j][h] = ab[j][h] = _mm512_setzero_pd();
        }
        for (int64_t i = 0; i < d; i += 16) {
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const int64_t o = i + 8 * h, left = d - o;
                const __mmask8 m = tail_mask8(left);
                const __m512d yv = wide8(y + o, m), va = wide8(ga + o, m), vb = wide8(gb + o, m);
                pa[h] = _mm512_fmadd_pd(va, yv, pa[h]);
                pb[h] = _mm512_fmadd_pd(vb, yv, pb[h]);
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                    const __m512d xv = wide8(X + (int64_t)j * d + o, m);
                    aa[j][h] = _mm512_fmadd_pd(xv, va, aa[j][h]);
                    ab[j][h] = _mm512_fmadd_pd(xv, vb, ab[j][h]);
                }
            }
        }
        dpost[k0] = (float)lanes_tree(pa[0], pa[1]);
        dpost[k0 + 1] = (float)lanes_tree(pb[0], pb[1]);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            dcomb[j * 4 + k0] = (float)lanes_tree(aa[j][0], aa[j][1]);
            dcomb[j * 4 + k0 + 1] = (float)lanes_tree(ab[j][0], ab[j][1]);
        }
    }
}

void AVX512_LEAF(trex_fused_mhc_post_bwd)(int n, int64_t d, const float *post, const float *comb,
                                    const float *y, const float *X, const float *dXo, float *dy,
                                    float *dX, float *dpost, float *dcomb)
{
    TREX_FUSED_ASSERT_N(n);
    /* dy and dX: element-wise, k ascending from +0 */
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = tail_mask(d - i);
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
    if (n == 4) /* dsv4's hc_mult */
        post_sums4(d, y, X, dXo, dpost, dcomb);
    else
        post_sums(n, d, y, X, dXo, dpost, dcomb);
}

static inline __attribute__((always_inline)) void collapse_bwd(int n, int64_t d, const float *w,
                                                               const float *X, const float *dx,
                                                               float *dw, float *dX)
{
    __m512d a0[8], a1[8];
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
        a0[k] = a1[k] = _mm512_setzero_pd();
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = tail_mask(d - i);
        const __m512 g = _mm512_maskz_loadu_ps(m, dx + i);
        const __m512d g0 = lo_pd(g), g1 = hi_pd(g);
        _Pragma("GCC unroll 8") for (int k = 0; k < n; k++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, X + (int64_t)k * d + i);
            a0[k] = _mm512_fmadd_pd(lo_pd(xv), g0, a0[k]);
            a1[k] = _mm512_fmadd_pd(hi_pd(xv), g1, a1[k]);
            if (dX) {
                float *o = dX + (int64_t)k * d + i;
                _mm512_mask_storeu_ps(o, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, o),
                                                          _mm512_mul_ps(_mm512_set1_ps(w[k]), g)));
            }
        }
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < n; k++)
        dw[k] = (float)lanes_tree(a0[k], a1[k]);
}

/* dw_k = mhc_lane_dot(X_k, dx) and dX_k += w_k dx in one pass over X and dx (dX NULL: dw only). */
void AVX512_LEAF(trex_fused_mhc_collapse_bwd)(int n, int64_t d, const float *w, const float *X,
                                        const float *dx, float *dw, float *dX)
{
    TREX_FUSED_ASSERT_N(n);
    if (n == 4 && dX)
        collapse_bwd(4, d, w, X, dx, dw, dX);
    else if (n == 4)
        collapse_bwd(4, d, w, X, dx, dw, NULL);
    else
        collapse_bwd(n, d, w, X, dx, dw, dX);
}
