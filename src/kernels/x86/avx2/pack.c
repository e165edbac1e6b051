/* kernels/x86/avx2/pack.c — AVX2 panel packing and fp32 <-> bf16 conversion.
 *
 * Compiled with AVX2 and FMA flags; reached only through the dispatch table. The packed formats are
 * those of kernels/gemm_panels.h, and every byte is the reference's (tests/test_kernels.c compares
 * each level's packers with kernels/ref/bf16.c on every edge). fp32 is rounded to bf16 in integers,
 * exactly as trex_f32_to_bf16: nearest even, subnormals kept, NaN quieted (AVX2 has no conversion
 * instruction).
 *
 * The unit of work is a tile of 8 rows x 16 k held as 8 registers of 8 dwords, each dword a pair of
 * consecutive k of one row. A source with k contiguous (ks == 1) loads a tile "by rows" (register i =
 * row i's 8 pairs: the A format); a source with rows contiguous (rs == 1) loads it "by pairs" (register
 * p = pair p over the 8 rows, two source rows interleaved: the VNNI format). An 8 x 8 dword transpose
 * turns one into the other. A tile that runs past the source's rows or k is built through a small
 * zero-filled buffer instead (the panel's edges). The A format from a source with k contiguous needs no
 * tile: each row's 32 k of a step are a copy (fp32 rounded). */
#include <immintrin.h>
#include <string.h>

#include "kernels/gemm_panels.h"
#include "kernels/x86/avx2/bf16.h"
#include "kernels/x86/avx2/transpose.h"
#include "trex/tensor.h"

enum { TR = 8, TK = 16 }; /* a tile's rows and k */

/* ---- rounding (round_hi and round8v: kernels/x86/avx2/bf16.h) ----------------------------------------- */

/* 16 floats at p to 16 bf16, in order. */
static inline __m256i round16(const float *p)
{
    const __m256i lo = _mm256_srli_epi32(round_hi(_mm256_loadu_ps(p)), 16);
    const __m256i hi = _mm256_srli_epi32(round_hi(_mm256_loadu_ps(p + 8)), 16);
    /* packus works within 128-bit lanes: lo 0-3, hi 0-3, lo 4-7, hi 4-7; the permute puts them in order */
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
}

/* 8 floats at p to 8 bf16. */
static inline __m128i round8(const float *p)
{
    return round8v(_mm256_loadu_ps(p));
}

/* ---- tiles ------------------------------------------------------------------------------------------ */

typedef trex_pack_view view;

static inline uint16_t elem(const view *x, int64_t r, int64_t k)
{
    const int64_t i = r * x->rs + k * x->ks;
    return x->f32 ? trex_f32_to_bf16(((const float *)(const void *)x->src)[i])
                  : ((const uint16_t *)(const void *)x->src)[i];
}

static inline const char *at(const view *x, int64_t r, int64_t k)
{
    return x->src + (size_t)(r * x->rs + k * x->ks) * x->esz;
}

/* The tile at rows rr.., k kk.. of the view, by rows (want_rows) or by pairs. */
static void load_tile(const view *x, int64_t rr, int64_t kk, bool want_rows, __m256i v[TR])
{
    if (rr + TR > x->rows || kk + TK > x->kc) {
        /* an edge: through a zero-filled buffer, by rows */
        uint16_t buf[TR][TK] = {{0}};
        for (int64_t i = 0; i < TR && rr + i < x->rows; i++)
            for (int64_t k = 0; k < TK && kk + k < x->kc; k++)
                buf[i][k] = elem(x, rr + i, kk + k);
        for (int i = 0; i < TR; i++)
            v[i] = _mm256_loadu_si256((const __m256i *)(const void *)buf[i]);
        if (!want_rows)
            transpose8(v);
        return;
    }
    if (x->ks == 1) {
        for (int i = 0; i < TR; i++) {
            const char *p = at(x, rr + i, kk);
            v[i] = x->f32 ? round16((const float *)(const void *)p)
                          : _mm256_loadu_si256((const __m256i *)(const void *)p);
        }
        if (!want_rows)
            transpose8(v);
        return;
    }
    /* rs == 1: source rows k and k+1 (8 values of r each) interleaved into dword pairs */
    for (int p = 0; p < TR; p++) {
        const char *e = at(x, rr, kk + 2 * p), *o = at(x, rr, kk + 2 * p + 1);
        const __m128i a = x->f32 ? round8((const float *)(const void *)e)
                                 : _mm_loadu_si128((const __m128i *)(const void *)e);
        const __m128i b = x->f32 ? round8((const float *)(const void *)o)
                                 : _mm_loadu_si128((const __m128i *)(const void *)o);
        v[p] = _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b));
    }
    if (want_rows)
        transpose8(v);
}

/* ---- packers ------------------------------------------------------------------------------------------ */

/* A format from a source with k contiguous, row by row (each source row one sequential stream). */
static void pack_a_rows(uint16_t *dst, const view *x, int64_t kcp)
{
    for (int64_t r = 0; r < TREX_GEMM_MR; r++) {
        uint16_t *d = dst + r * 32;
        if (r >= x->rows) {
            for (int64_t kk = 0; kk < kcp; kk += 32)
                memset(d + kk * TREX_GEMM_MR, 0, 64);
            continue;
        }
        const char *src = x->src + (size_t)(r * x->rs) * x->esz;
        int64_t kk = 0;
        for (; kk + 32 <= x->kc; kk += 32) {
            __m256i *q = (__m256i *)(void *)(d + kk * TREX_GEMM_MR);
            if (x->f32) {
                const float *s = (const float *)(const void *)src + kk;
                _mm256_storeu_si256(q, round16(s));
                _mm256_storeu_si256(q + 1, round16(s + 16));
            } else {
                const __m256i *s = (const __m256i *)(const void *)((const uint16_t *)(const void *)src + kk);
                _mm256_storeu_si256(q, _mm256_loadu_si256(s));
                _mm256_storeu_si256(q + 1, _mm256_loadu_si256(s + 1));
            }
        }
        for (; kk < kcp; kk += 32)
            for (int64_t k = 0; k < 32; k++)
                d[kk * TREX_GEMM_MR + k] = kk + k < x->kc ? elem(x, r, kk + k) : 0;
    }
}

static void pack_a(uint16_t *dst, const view *x, int64_t kcp)
{
    if (x->ks == 1) {
        pack_a_rows(dst, x, kcp);
        return;
    }
    __m256i v[TR];
    for (int64_t kk = 0; kk < kcp; kk += TK)
        for (int64_t rr = 0; rr < TREX_GEMM_MR; rr += TR) {
            /* step kk/32, rows rr.., its k kk%32.. */
            uint16_t *d = dst + (kk / 32) * (32 * TREX_GEMM_MR) + rr * 32 + kk % 32;
            if (rr >= x->rows || kk >= x->kc)
                for (int i = 0; i < TR; i++)
                    v[i] = _mm256_setzero_si256();
            else
                load_tile(x, rr, kk, true, v);
            for (int i = 0; i < TR; i++)
                _mm256_storeu_si256((__m256i *)(void *)(d + i * 32), v[i]);
        }
}

static void pack_b(uint16_t *dst, const view *x, int64_t kcp)
{
    __m256i v[TR];
    for (int64_t kk = 0; kk < kcp; kk += TK)
        for (int64_t rr = 0; rr < TREX_GEMM_NR; rr += TR) {
            if (rr >= x->rows || kk >= x->kc)
                for (int p = 0; p < TR; p++)
                    v[p] = _mm256_setzero_si256();
            else
                load_tile(x, rr, kk, false, v);
            uint16_t *d = dst + (kk / 2) * 2 * TREX_GEMM_NR + rr * 2; /* pair kk/2, rows rr.. */
            for (int p = 0; p < TR; p++)
                _mm256_storeu_si256((__m256i *)(void *)(d + p * 2 * TREX_GEMM_NR), v[p]);
        }
}

TREX_PACK_ENTRIES(avx2, pack_a, pack_b)

/* ---- bulk conversion ------------------------------------------------------------------------------- */

void trex_cvt_f32_bf16_avx2(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), round16(src + i));
    for (; i < n; i++)
        dst[i] = trex_f32_to_bf16(src[i]);
}

void trex_cvt_bf16_f32_avx2(float *dst, const uint16_t *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++)
        dst[i] = trex_bf16_to_f32(src[i]);
}
