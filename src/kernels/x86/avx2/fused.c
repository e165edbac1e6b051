/* kernels/x86/avx2/fused.c — AVX2 leaves of the fused table's vector entries (kernels/fused.h): dot,
 * dots, axpy, axpy_rows, copy_nt, cvt_bf16_nt, rope, rms_head_bwd and the indexer KL's gradients.
 *
 * Each gives the bits of its reference (kernels/ref/fused.c: model/attention_math.h, model/rope.c;
 * kernels/ref/attn_kl.c), as the AVX-512 leaves of kernels/x86/avx512/fused.c do at twice the width:
 *   - a dot product's 16 interleaved partial sums are two registers (lanes 0-7, 8-15), each updated
 *     with a multiply and then an add, combined in am_dot's tree (lanes.h); the last n mod 16 products
 *     are summed after, in order, as there. dots runs 2 rows x 2 entries at once (8 chains);
 *   - axpy and axpy_rows: per element the multiply, then the add; a term of axpy_rows that is off is
 *     blended out (the row's bits are those of skipping it);
 *   - rope: 8 pairs per step, split into first and second members, rotated with the reference's
 *     multiplies, subtract and add, and interleaved back;
 *   - cvt_bf16_nt: the integer rounding of bf16.h (trex_f32_to_bf16's bits).
 * Whole steps store plainly, a partial last one under its mask (mask.h: masked loads cost no more than
 * plain ones, so some whole steps load under a mask too). Compiled with this
 * folder's flags and ISO C, so nothing is contracted into a fused multiply-add (tests/test_fused.c,
 * test_attention.c and test_attn_bf16.c compare every level with the reference). */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/x86/avx2/bf16.h"
#include "kernels/x86/avx2/lanes.h"
#include "kernels/x86/avx2/mask.h"

static inline float tail_dot(const float *a, const float *b, int64_t i, int64_t n)
{
    float t = 0.0f;
    for (; i < n; i++)
        t += a[i] * b[i];
    return t;
}

static inline __m256 mul_add(__m256 acc, __m256 a, __m256 b)
{
    return _mm256_add_ps(acc, _mm256_mul_ps(a, b));
}

float trex_fused_dot_avx2(const float *a, const float *b, int64_t n)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        lo = mul_add(lo, _mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
        hi = mul_add(hi, _mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
    }
    return am_tree16(lo, hi) + tail_dot(a, b, i, n);
}

/* out[r n + e] = dot(A_r, V[e]) for RB rows from r0 and EB entries from e0: RB x EB dot products at
 * once, each with its two registers of partial sums. */
static inline __attribute__((always_inline)) void dots_block(float *out, const float *A, int64_t lda,
                                                             int64_t r0, const float *const *V, int64_t n,
                                                             int64_t e0, int64_t c, int RB, int EB)
{
    __m256 acc[2][2][2];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < RB; r++)
        _Pragma("GCC unroll 8")
        for (int e = 0; e < EB; e++)
            acc[r][e][0] = acc[r][e][1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= c; i += 16)
        _Pragma("GCC unroll 8")
        for (int h = 0; h < 2; h++) {
            __m256 v[2];
            _Pragma("GCC unroll 8")
            for (int e = 0; e < EB; e++)
                v[e] = _mm256_loadu_ps(V[e0 + e] + i + 8 * h);
            _Pragma("GCC unroll 8")
            for (int r = 0; r < RB; r++) {
                const __m256 a = _mm256_loadu_ps(A + (r0 + r) * lda + i + 8 * h);
                _Pragma("GCC unroll 8")
                for (int e = 0; e < EB; e++)
                    acc[r][e][h] = mul_add(acc[r][e][h], a, v[e]);
            }
        }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < RB; r++)
        _Pragma("GCC unroll 8")
        for (int e = 0; e < EB; e++)
            out[(r0 + r) * n + e0 + e] =
                am_tree16(acc[r][e][0], acc[r][e][1]) + tail_dot(A + (r0 + r) * lda, V[e0 + e], i, c);
}

void trex_fused_dots_avx2(float *out, const float *A, int64_t lda, int64_t R, const float *const *V, int64_t n,
                          int64_t c)
{
    int64_t e0 = 0;
    for (; e0 + 2 <= n; e0 += 2) {
        int64_t r0 = 0;
        for (; r0 + 2 <= R; r0 += 2)
            dots_block(out, A, lda, r0, V, n, e0, c, 2, 2);
        for (; r0 < R; r0++)
            dots_block(out, A, lda, r0, V, n, e0, c, 1, 2);
    }
    for (; e0 < n; e0++) {
        int64_t r0 = 0;
        for (; r0 + 2 <= R; r0 += 2)
            dots_block(out, A, lda, r0, V, n, e0, c, 2, 1);
        for (; r0 < R; r0++)
            dots_block(out, A, lda, r0, V, n, e0, c, 1, 1);
    }
}

void trex_fused_axpy_avx2(float *y, float a, const float *x, int64_t n)
{
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, mul_add(_mm256_loadu_ps(y + i), va, _mm256_loadu_ps(x + i)));
    if (i < n) {
        const __m256i m = lanes8(n - i);
        store_first8(y + i, mul_add(_mm256_maskload_ps(y + i, m), va, _mm256_maskload_ps(x + i, m)), n - i);
    }
}

/* 64 floats of a row Y_r (8 registers) at a time over all J terms; the rest of the row by axpy per
 * term that is on. */
void trex_fused_axpy_rows_avx2(float *Y, int64_t ldy, int64_t R, const float *A, const unsigned char *on,
                               int64_t sr, int64_t sj, const float *const *X, int64_t J, int64_t c)
{
    for (int64_t r = 0; r < R; r++) {
        float *y = Y + r * ldy;
        const float *a = A + r * sr;
        const unsigned char *o = on + r * sr;
        int64_t i = 0;
        for (; i + 64 <= c; i += 64) {
            __m256 acc[8];
            _Pragma("GCC unroll 8")
            for (int k = 0; k < 8; k++)
                acc[k] = _mm256_loadu_ps(y + i + 8 * k);
            for (int64_t j = 0; j < J; j++) {
                const __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32(o[j * sj] ? -1 : 0));
                const __m256 va = _mm256_set1_ps(a[j * sj]);
                const float *x = X[j] + i;
                _Pragma("GCC unroll 8")
                for (int k = 0; k < 8; k++)
                    acc[k] = _mm256_blendv_ps(acc[k], mul_add(acc[k], va, _mm256_loadu_ps(x + 8 * k)), keep);
            }
            _Pragma("GCC unroll 8")
            for (int k = 0; k < 8; k++)
                _mm256_storeu_ps(y + i + 8 * k, acc[k]);
        }
        if (i < c)
            for (int64_t j = 0; j < J; j++)
                if (o[j * sj])
                    trex_fused_axpy_avx2(y + i, a[j * sj], X[j] + i, c - i);
    }
}

/* streaming stores from the first 32-byte boundary of dst on, plain ones around them */
void trex_fused_copy_nt_avx2(float *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i < n && ((uintptr_t)(dst + i) & 31) != 0; i++)
        dst[i] = src[i];
    for (; i + 8 <= n; i += 8)
        _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
    for (; i < n; i++)
        dst[i] = src[i];
    _mm_sfence();
}

/* 8 floats to 8 bf16 per step, streaming 16-byte stores from the first 16-byte boundary of dst on
 * (when dst is 2-byte aligned: else every store is a plain one) */
void trex_fused_cvt_bf16_nt_avx2(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    if (((uintptr_t)dst & 1) == 0) {
        const int64_t lead = (int64_t)((16 - ((uintptr_t)dst & 15)) & 15) / 2;
        if (lead > 0) {
            i = lead < n ? lead : n;
            store_bf16x8(dst, round8v(_mm256_maskload_ps(src, lanes8(i))), i);
        }
        for (; i + 8 <= n; i += 8)
            _mm_stream_si128((__m128i *)(void *)(dst + i), round8v(_mm256_loadu_ps(src + i)));
    }
    for (; i < n; i += 8)
        store_bf16x8(dst + i, round8v(_mm256_maskload_ps(src + i, lanes8(n - i))), n - i);
    _mm_sfence();
}

/* 8 pairs rotated: x0, x1 hold pairs 0-3 and 4-7 (first member, second member, ...); r0, r1 get them
 * back in the same layout. The shuffles give, per 128-bit half, two members of x0 and then two of x1;
 * the 64-bit permute 0xd8 orders them as pairs 0-3 and 4-7. */
static inline void rotate8(__m256 x0, __m256 x1, __m256 c, __m256 s, __m256 *r0, __m256 *r1)
{
    const __m256d ea = _mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0x88));
    const __m256d eb = _mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0xdd));
    const __m256 a = _mm256_castpd_ps(_mm256_permute4x64_pd(ea, 0xd8));
    const __m256 b = _mm256_castpd_ps(_mm256_permute4x64_pd(eb, 0xd8));
    const __m256 u = _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s));
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(a, s), _mm256_mul_ps(b, c));
    const __m256 lo = _mm256_unpacklo_ps(u, v), hi = _mm256_unpackhi_ps(u, v);
    *r0 = _mm256_permute2f128_ps(lo, hi, 0x20);
    *r1 = _mm256_permute2f128_ps(lo, hi, 0x31);
}

/* whole steps of 8 pairs with plain loads and stores, a partial last one under masks */
void trex_fused_rope_avx2(float *v, int64_t nv, int64_t ld, const float *cs, const float *sn, int64_t half,
                          int inverse)
{
    const __m256 flip = _mm256_castsi256_ps(_mm256_set1_epi32(inverse ? (int)0x80000000u : 0));
    for (int64_t k = 0; k < nv; k++) {
        float *x = v + k * ld;
        int64_t i = 0;
        __m256 r0, r1;
        for (; i + 8 <= half; i += 8) {
            const __m256 s = _mm256_xor_ps(_mm256_loadu_ps(sn + i), flip);
            const __m256 c = _mm256_loadu_ps(cs + i);
            rotate8(_mm256_loadu_ps(x + 2 * i), _mm256_loadu_ps(x + 2 * i + 8), c, s, &r0, &r1);
            _mm256_storeu_ps(x + 2 * i, r0);
            _mm256_storeu_ps(x + 2 * i + 8, r1);
        }
        if (i < half) {
            const int64_t np = half - i;
            const __m256i m = lanes8(np), m0 = lanes8(2 * np), m1 = lanes8(2 * np - 8);
            const __m256 s = _mm256_xor_ps(_mm256_maskload_ps(sn + i, m), flip);
            rotate8(_mm256_maskload_ps(x + 2 * i, m0), _mm256_maskload_ps(x + 2 * i + 8, m1),
                    _mm256_maskload_ps(cs + i, m), s, &r0, &r1);
            store_first8(x + 2 * i, r0, 2 * np);
            store_first8(x + 2 * i + 8, r1, 2 * np - 8);
        }
    }
}

/* the dot as trex_fused_dot_avx2, then per element a multiply, a subtract and a multiply */
void trex_fused_rms_head_bwd_avx2(float *g, const float *q, const float *rs, int64_t H, int64_t c)
{
    for (int64_t h = 0; h < H; h++) {
        float *gh = g + h * c;
        const float *qh = q + h * c;
        const __m256 m = _mm256_set1_ps(trex_fused_dot_avx2(gh, qh, c) / (float)c);
        const __m256 r = _mm256_set1_ps(rs[h]);
        for (int64_t i = 0; i < c; i += 8) {
            const __m256i k = lanes8(c - i);
            const __m256 qm = _mm256_mul_ps(_mm256_maskload_ps(qh + i, k), m);
            const __m256 d = _mm256_sub_ps(_mm256_maskload_ps(gh + i, k), qm);
            store_first8(gh + i, _mm256_mul_ps(r, d), c - i);
        }
    }
}

/* The indexer KL's gradients (kernels/ref/attn_kl.c): kl_qgrad is the reference's loop with this file's
 * axpy; kl_kgrad keeps 64 floats of the entry's dK row in registers over all of its active heads. */
void trex_fused_kl_qgrad_avx2(float *diq, float *dhw, const float *ia, const float *dI, const float *hw,
                              const float *const *K, int64_t n, int64_t nI, int64_t cI)
{
    trex_fused_kl_qgrad_axpy(trex_fused_axpy_avx2, diq, dhw, ia, dI, hw, K, n, nI, cI);
}

void trex_fused_kl_kgrad_avx2(float *const *dK, const float *ia, const float *dI, const float *hw, const float *X,
                              int64_t n, int64_t nI, int64_t cI)
{
    for (int64_t i = 0; i < n; i++) {
        float *y = dK[i];
        int64_t f = 0;
        for (; f + 64 <= cI; f += 64) {
            __m256 acc[8];
            _Pragma("GCC unroll 8")
            for (int j = 0; j < 8; j++)
                acc[j] = _mm256_loadu_ps(y + f + 8 * j);
            for (int64_t h = 0; h < nI; h++)
                if (ia[h * n + i] > 0.0f) {
                    const __m256 va = _mm256_set1_ps(dI[i] * hw[h]);
                    const float *x = X + h * cI + f;
                    _Pragma("GCC unroll 8")
                    for (int j = 0; j < 8; j++)
                        acc[j] = mul_add(acc[j], va, _mm256_loadu_ps(x + 8 * j));
                }
            _Pragma("GCC unroll 8")
            for (int j = 0; j < 8; j++)
                _mm256_storeu_ps(y + f + 8 * j, acc[j]);
        }
        if (f < cI)
            for (int64_t h = 0; h < nI; h++)
                if (ia[h * n + i] > 0.0f)
                    trex_fused_axpy_avx2(y + f, dI[i] * hw[h], X + h * cI + f, cI - f);
    }
}
