/* kernels/x86/avx512/bf16.h — fp32 -> bf16 rounding of whole registers, bit for bit trex_f32_to_bf16
 * (round to nearest even, subnormals kept, NaN quieted), shared by the AVX-512 leaves. Only for files
 * of the AVX-512 folders.
 *
 * The conversion instructions VCVTNEPS2BF16 and VCVTNE2PS2BF16 round to nearest even and quiet NaN
 * exactly as trex_f32_to_bf16 does, but read subnormal inputs as zero (checked over all 2^32 inputs on
 * the AMD VM, docs/kernels.md "Round 19"). Registers holding a subnormal therefore take the integer
 * rounding instead: two lane tests and a branch that is not taken on real data, against the eight
 * integer operations per register the integer rounding costs.
 *
 * The files that round through this header are compiled twice: in kernels/x86/avx512 with AVX512_BF16
 * (their leaves named by AVX512_LEAF and AVX512_SFX: trex_..._avx512) and, through kernels/x86/avx512f, without it
 * (trex_..._avx512f), for the CPUs that have AVX-512 but not its bf16 instructions (Skylake-SP to Ice
 * Lake). There the integer rounding is taken for every register: the same bits. */
#ifndef TREX_KERNELS_AVX512_BF16_H
#define TREX_KERNELS_AVX512_BF16_H

#include <immintrin.h>

#ifdef __AVX512BF16__
#define AVX512_SFX avx512
#else
#define AVX512_SFX avx512f
#endif
#define AVX512_PASTE_(name, sfx) name##_##sfx
#define AVX512_PASTE(name, sfx) AVX512_PASTE_(name, sfx)
#define AVX512_LEAF(name) AVX512_PASTE(name, AVX512_SFX) /* trex_..._avx512 or trex_..._avx512f */

/* Lanes of x that are subnormal: exponent field zero, fraction not. */
static inline __mmask16 bf16_subnormals(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __mmask16 zexp = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_test_epi32_mask(zexp, u, _mm512_set1_epi32(0x007fffff));
}

/* The integer rounding: the upper half of each dword is trex_f32_to_bf16 of the lane (the lower half
 * is garbage). */
static inline __m512i bf16_round_int(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
}

/* 16 floats to 16 bf16. */
static inline __m256i bf16_round16(__m512 x)
{
#ifdef __AVX512BF16__
    if (__builtin_expect(bf16_subnormals(x) == 0, 1))
        return (__m256i)_mm512_cvtneps_pbh(x);
#endif
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_round_int(x), 16));
}

/* 32 floats (lo: elements 0-15, hi: 16-31) to 32 bf16 in order. */
static inline __m512i bf16_round32(__m512 lo, __m512 hi)
{
#ifdef __AVX512BF16__
    if (__builtin_expect((bf16_subnormals(lo) | bf16_subnormals(hi)) == 0, 1))
        return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
#endif
    const __m512i up = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29,
                                        27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(bf16_round_int(lo), up, bf16_round_int(hi));
}

/* The k-pairs (a, b) of 16 columns in VNNI order: dword j = bf16(b[j]) << 16 | bf16(a[j]). */
static inline __m512i bf16_pairs16(__m512 a, __m512 b)
{
    const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                         22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(zip, bf16_round32(a, b));
}

#endif
