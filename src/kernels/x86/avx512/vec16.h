/* kernels/x86/avx512/vec16.h — the 16-lane vectors of kernels/x86/attn_tiles.h on AVX-512 registers,
 * for its back-ends in the AVX-512 folders (amx, avx512, avx512f); kernels/x86/avx2/vec16.h gives the
 * same operations on pairs of AVX2 registers. Each is one instruction or a few here:
 *   vec16     16 floats: one head group's scores, probabilities, lse
 *   mask16    which of the 16 lanes are real (a group's heads past H are padding)
 *   wide16    16 words (32 bf16): rows of tiles being packed or transposed
 * and a group's 16 bf16 values are an __m256i on both. Only for files of the AVX-512 folders. */
#ifndef TREX_KERNELS_X86_AVX512_VEC16_H
#define TREX_KERNELS_X86_AVX512_VEC16_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/x86/avx512/bf16.h"
#include "kernels/x86/avx512/transpose.h"

typedef __m512 vec16;
typedef __mmask16 mask16;
typedef __m512i wide16;

/* the lanes below k (k >= 16: all) */
static inline mask16 m16_first(int64_t k)
{
    return k >= 16 ? (mask16)0xffffu : (mask16)((1u << k) - 1u);
}

static inline vec16 v16_load(const float *p) { return _mm512_loadu_ps(p); }
static inline vec16 v16_loadz(mask16 m, const float *p) { return _mm512_maskz_loadu_ps(m, p); }
static inline void v16_store(float *p, vec16 v) { _mm512_storeu_ps(p, v); }
static inline vec16 v16_set1(float x) { return _mm512_set1_ps(x); }
static inline vec16 v16_zero(void) { return _mm512_setzero_ps(); }
static inline vec16 v16_add(vec16 a, vec16 b) { return _mm512_add_ps(a, b); }
static inline vec16 v16_sub(vec16 a, vec16 b) { return _mm512_sub_ps(a, b); }
static inline vec16 v16_mul(vec16 a, vec16 b) { return _mm512_mul_ps(a, b); }
static inline vec16 v16_div(vec16 a, vec16 b) { return _mm512_div_ps(a, b); }
static inline vec16 v16_max(vec16 a, vec16 b) { return _mm512_max_ps(a, b); }
/* v in the lanes of m, zero elsewhere */
static inline vec16 v16_keep(mask16 m, vec16 v) { return _mm512_maskz_mov_ps(m, v); }
/* the lanes' sum in GCC's _mm512_reduce_add_ps tree (kernels/x86/avx2/vec16.h follows it) */
static inline float v16_sum(vec16 v) { return _mm512_reduce_add_ps(v); }
/* 16 floats to 16 bf16 (nearest even, trex_f32_to_bf16's bits) */
static inline __m256i v16_bf16(vec16 v) { return bf16_round16(v); }

/* exp of 16 floats: Cody-Waite reduction by ln 2 and a degree-7 polynomial; within 1.3 ulp of the
 * exact exp on [-87, 10] (checked on every 97th float), inputs clamped to [-88, 88] (exp(-88) is
 * 6e-39: such probabilities round to bf16 subnormals, which the bf16 instructions read as zero and the
 * FMA levels take as they are, below 1e-37 in any sum). */
static inline vec16 v16_exp(vec16 x)
{
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

static inline wide16 w16_load(const void *p) { return _mm512_loadu_si512(p); }
static inline void w16_store(void *p, wide16 x) { _mm512_storeu_si512(p, x); }
static inline wide16 w16_zero(void) { return _mm512_setzero_si512(); }

/* 32 floats at src (fewer when left < 32: the rest read as zero) to 32 bf16, nearest even */
static inline wide16 w16_bf16(const float *src, int64_t left)
{
    if (left >= 32)
        return bf16_round32(_mm512_loadu_ps(src), _mm512_loadu_ps(src + 16));
    return bf16_round32(_mm512_maskz_loadu_ps(m16_first(left), src),
                        _mm512_maskz_loadu_ps(left > 16 ? m16_first(left - 16) : 0, src + 16));
}

/* word k = lo[k] | hi[k] << 16 (the bf16 values of two entries side by side) */
static inline wide16 w16_zip(__m256i lo, __m256i hi)
{
    return _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
}

/* the first m (<= 32) bf16 of x to p */
static inline void w16_store_u16(uint16_t *p, wide16 x, int64_t m)
{
    _mm512_mask_storeu_epi16(p, m >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << m) - 1u), x);
}

/* the first m (<= 16) words of x to p */
static inline void w16_store_u32(void *p, wide16 x, int64_t m)
{
    _mm512_mask_storeu_epi32(p, m16_first(m), x);
}

/* r[i] word j -> r[j] word i */
static inline void w16_transpose(wide16 r[16])
{
    transpose16(r);
}

/* Two bf16 rows r0, r1 of cp into VNNI pair rows: for each 16-dim chunk j, 32 bf16 (r0[16j + i],
 * r1[16j + i]) for i < 16, written at dst + j * jstride (in bf16). */
static inline void w16_interleave(uint16_t *dst, int64_t jstride, const uint16_t *r0, const uint16_t *r1,
                                  int64_t cp)
{
    static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i ilo = _mm512_loadu_si512((const void *)lo_idx);
    const __m512i ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
    for (int64_t k = 0; k < cp; k += 32) {
        const __m512i a = _mm512_loadu_si512((const void *)(r0 + k));
        const __m512i b = _mm512_loadu_si512((const void *)(r1 + k));
        _mm512_storeu_si512((void *)(dst + (k / 16) * jstride), _mm512_permutex2var_epi16(a, ilo, b));
        _mm512_storeu_si512((void *)(dst + (k / 16 + 1) * jstride), _mm512_permutex2var_epi16(a, ihi, b));
    }
}

#endif
