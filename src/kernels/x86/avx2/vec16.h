/* kernels/x86/avx2/vec16.h — the 16-lane vectors of kernels/x86/attn_tiles.h on AVX2: each is a pair of
 * 8-lane registers (lo: lanes 0-7, hi: 8-15), with kernels/x86/avx512/vec16.h's operations and, lane
 * for lane, its bits:
 *   - a mask16 holds all-ones lanes where AVX-512 holds mask bits (masked loads and stores use
 *     VMASKMOV, which does not touch the lanes left out);
 *   - v16_sum adds in the tree of GCC's _mm512_reduce_add_ps;
 *   - v16_exp is the same polynomial with the same fused multiply-adds; 2^n, which AVX-512 applies
 *     with VSCALEFPS, is applied as 2^(n - h) 2^h (h = floor(n / 2), both factors normal for the
 *     clamped inputs), exact but for the one rounding of a subnormal result, as there;
 *   - bf16 rounding is the integer rounding of kernels/x86/avx2/bf16.h (trex_f32_to_bf16's bits).
 * Only for files of this folder (AVX2 and FMA flags). */
#ifndef TREX_KERNELS_X86_AVX2_VEC16_H
#define TREX_KERNELS_X86_AVX2_VEC16_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/x86/avx2/bf16.h"
#include "kernels/x86/avx2/mask.h"
#include "kernels/x86/avx2/transpose.h"

typedef struct vec16 {
    __m256 lo, hi;
} vec16;
typedef struct mask16 {
    __m256i lo, hi;
} mask16;
typedef struct wide16 {
    __m256i lo, hi;
} wide16;

/* the lanes below k (k >= 16: all) */
static inline mask16 m16_first(int64_t k)
{
    return (mask16){lanes8(k), lanes8(k - 8)};
}

static inline vec16 v16_load(const float *p) { return (vec16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline vec16 v16_loadz(mask16 m, const float *p)
{
    return (vec16){_mm256_maskload_ps(p, m.lo), _mm256_maskload_ps(p + 8, m.hi)};
}
static inline void v16_store(float *p, vec16 v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
static inline vec16 v16_set1(float x) { return (vec16){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
static inline vec16 v16_zero(void) { return (vec16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline vec16 v16_add(vec16 a, vec16 b)
{
    return (vec16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
}
static inline vec16 v16_sub(vec16 a, vec16 b)
{
    return (vec16){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)};
}
static inline vec16 v16_mul(vec16 a, vec16 b)
{
    return (vec16){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
}
static inline vec16 v16_div(vec16 a, vec16 b)
{
    return (vec16){_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)};
}
static inline vec16 v16_max(vec16 a, vec16 b)
{
    return (vec16){_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)};
}
/* v in the lanes of m, zero elsewhere */
static inline vec16 v16_keep(mask16 m, vec16 v)
{
    return (vec16){_mm256_and_ps(_mm256_castsi256_ps(m.lo), v.lo), _mm256_and_ps(_mm256_castsi256_ps(m.hi), v.hi)};
}
/* the lanes' sum: halves, then quarters, then ((0 + 2) + (1 + 3)) as GCC's _mm512_reduce_add_ps */
static inline float v16_sum(vec16 v)
{
    const __m256 h = _mm256_add_ps(v.hi, v.lo);
    const __m128 q = _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
    const __m128 s = _mm_add_ps(q, _mm_permute_ps(q, 0x4e));
    return _mm_cvtss_f32(s) + _mm_cvtss_f32(_mm_movehdup_ps(s));
}
/* 16 floats to 16 bf16 (nearest even, trex_f32_to_bf16's bits) */
static inline __m256i v16_bf16(vec16 v) { return _mm256_set_m128i(round8v(v.hi), round8v(v.lo)); }

/* 8 lanes of kernels/x86/avx512/vec16.h's v16_exp */
static inline __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* n in [-127, 127]: 2^h and 2^(n - h) with h = floor(n / 2) in [-64, 63] are normal floats */
    const __m256i ni = _mm256_cvtps_epi32(n), h = _mm256_srai_epi32(ni, 1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
}
static inline vec16 v16_exp(vec16 x) { return (vec16){exp8(x.lo), exp8(x.hi)}; }

static inline wide16 w16_load(const void *p)
{
    const __m256i *q = (const __m256i *)p;
    return (wide16){_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)};
}
static inline void w16_store(void *p, wide16 x)
{
    __m256i *q = (__m256i *)p;
    _mm256_storeu_si256(q, x.lo);
    _mm256_storeu_si256(q + 1, x.hi);
}
static inline wide16 w16_zero(void) { return (wide16){_mm256_setzero_si256(), _mm256_setzero_si256()}; }

/* 32 floats at src (fewer when left < 32: the rest read as zero) to 32 bf16, nearest even */
static inline wide16 w16_bf16(const float *src, int64_t left)
{
    __m128i b[4];
    for (int j = 0; j < 4; j++)
        b[j] = round8v(left >= 32 ? _mm256_loadu_ps(src + 8 * j)
                                  : _mm256_maskload_ps(src + 8 * j, lanes8(left - 8 * j)));
    return (wide16){_mm256_set_m128i(b[1], b[0]), _mm256_set_m128i(b[3], b[2])};
}

/* word k = lo[k] | hi[k] << 16 (the bf16 values of two entries side by side) */
static inline wide16 w16_zip(__m256i lo, __m256i hi)
{
    const __m256i a = _mm256_unpacklo_epi16(lo, hi), b = _mm256_unpackhi_epi16(lo, hi);
    return (wide16){_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31)};
}

/* the first m (<= 32) bf16 of x to p */
static inline void w16_store_u16(uint16_t *p, wide16 x, int64_t m)
{
    if (m >= 32) {
        w16_store(p, x);
        return;
    }
    uint16_t t[32];
    w16_store(t, x);
    memcpy(p, t, (size_t)m * 2);
}

/* the first m (<= 16) words of x to p: each half by mask.h's store_first8 (a plain store when whole) */
static inline void w16_store_u32(void *p, wide16 x, int64_t m)
{
    float *q = (float *)p;
    store_first8(q, _mm256_castsi256_ps(x.lo), m);
    store_first8(q + 8, _mm256_castsi256_ps(x.hi), m - 8);
}

/* r[i] word j -> r[j] word i: the four 8 x 8 blocks transposed, the off-diagonal two trading places */
static inline void w16_transpose(wide16 r[16])
{
    __m256i q[4][8];
    for (int i = 0; i < 8; i++) {
        q[0][i] = r[i].lo, q[1][i] = r[i].hi, q[2][i] = r[8 + i].lo, q[3][i] = r[8 + i].hi;
    }
    for (int k = 0; k < 4; k++)
        transpose8(q[k]);
    for (int i = 0; i < 8; i++) {
        r[i] = (wide16){q[0][i], q[2][i]};
        r[8 + i] = (wide16){q[1][i], q[3][i]};
    }
}

/* Two bf16 rows r0, r1 of cp into VNNI pair rows: for each 16-dim chunk j, 32 bf16 (r0[16j + i],
 * r1[16j + i]) for i < 16, written at dst + j * jstride (in bf16). */
static inline void w16_interleave(uint16_t *dst, int64_t jstride, const uint16_t *r0, const uint16_t *r1,
                                  int64_t cp)
{
    for (int64_t k = 0; k < cp; k += 16) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(r0 + k));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(r1 + k));
        w16_store(dst + (k / 16) * jstride, w16_zip(a, b));
    }
}

#endif
