/* kernels/x86/avx512/pack.c — AVX-512 (F/BW/VL/BF16) panel packing and fp32 <-> bf16 conversion.
 *
 * Compiled with AVX-512 flags; reached only through the dispatch table. The packed formats are those of
 * kernels/gemm_panels.h. A panel block is built from 16-row x 32-k tiles held as 16 vectors of 16 dwords,
 * each dword a pair of consecutive k of one row. A source with k contiguous (ks == 1) loads a tile "by
 * rows" (vector i = row i, which is the A format); a source with rows contiguous (rs == 1) loads it "by
 * pairs" (vector p = k-pair p over 16 rows, made by interleaving two source rows: the VNNI format). A
 * 16x16 dword transpose turns one into the other. The A format from a source with k contiguous needs no
 * tile at all: it is a copy of 64-byte row pieces, done row by row (each source row one sequential
 * stream: fp32 sources packed ~30% faster from L2 than by 16-row tiles, docs/kernels.md). fp32
 * sources are rounded to bf16 exactly as trex_f32_to_bf16 does (avx512/bf16.h: the conversion
 * instructions, subnormals by the integer rounding), so every level packs the same bits. The fp32 packers
 * prefetch the next step of their source rows: rows far apart (one page each) defeat the hardware
 * prefetchers, and the packers then wait on memory (docs/kernels.md, "Packing"). */
#include <immintrin.h>
#include <string.h>

#include "kernels/gemm_panels.h"
#include "kernels/x86/avx512/bf16.h"
#include "kernels/x86/avx512/mask.h"
#include "kernels/x86/avx512/transpose.h"

static inline __mmask32 mask32(int64_t n)
{
    return n >= 32 ? 0xffffffffu : n <= 0 ? 0u : (__mmask32)((1u << n) - 1u);
}


/* n (<= 16) values from p as 16 bf16, zeros past n. */
static inline __m256i load16(const void *p, bool f32, int64_t n)
{
    if (f32)
        return bf16_round16(_mm512_maskz_loadu_ps(tail_mask(n), p));
    return _mm256_maskz_loadu_epi16(tail_mask(n), p);
}

/* n (<= 32) values from p as 32 bf16, zeros past n. */
static inline __m512i load32(const void *p, bool f32, int64_t n)
{
    if (!f32)
        return _mm512_maskz_loadu_epi16(mask32(n), p);
    const float *q = p;
    return bf16_round32(_mm512_maskz_loadu_ps(tail_mask(n), q),
                        n > 16 ? _mm512_maskz_loadu_ps(tail_mask(n - 16), q + 16) : _mm512_setzero_ps());
}

typedef trex_pack_view view;

/* The 16 x 32 tile at rows rr.., k kk.. of the view, by rows (want_rows) or by pairs. */
static inline void load_tile(const view *x, int64_t rr, int64_t kk, bool want_rows, __m512i v[16])
{
    if (x->ks == 1) {
        /* fp32: the same rows' next step of 32 k, into L2 (16 streams, rows far apart). Measured
         * +10% from memory for fp32, nothing for bf16 (docs/kernels.md). */
        if (x->f32 && kk + 32 < x->kc)
            for (int i = 0; i < 16 && rr + i < x->rows; i++) {
                const char *q = x->src + (size_t)((rr + i) * x->rs + kk + 32) * 4;
                _mm_prefetch(q, _MM_HINT_T2);
                _mm_prefetch(q + 64, _MM_HINT_T2);
            }
        for (int i = 0; i < 16; i++)
            v[i] = rr + i < x->rows
                       ? load32(x->src + (size_t)((rr + i) * x->rs + kk) * x->esz, x->f32, x->kc - kk)
                       : _mm512_setzero_si512();
        if (!want_rows)
            transpose16(v);
        return;
    }
    /* rs == 1: interleave source rows k and k+1 (16 values of r each) into dword pairs. */
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                         39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const int64_t nr = x->rows - rr;
    /* fp32: the next step's 32 source rows (both 16-row halves of the panel, 128 bytes each), into
     * L1. Each source row is a different page, which the hardware prefetchers do not run ahead into;
     * measured +40-50% from memory for fp32, a loss for bf16 (docs/kernels.md). */
    if (x->f32 && rr == 0)
        for (int64_t k = kk + 32; k < kk + 64 && k < x->kc; k++) {
            const char *q = x->src + (size_t)(k * x->ks) * 4;
            _mm_prefetch(q, _MM_HINT_T0);
            _mm_prefetch(q + 64, _MM_HINT_T0);
        }
    if (x->f32) {
        const __mmask16 m = tail_mask(nr);
        for (int p = 0; p < 16; p++) {
            const int64_t k = kk + 2 * p;
            const float *e = (const float *)(const void *)x->src + k * x->ks + rr;
            const __m512 a = k < x->kc ? _mm512_maskz_loadu_ps(m, e) : _mm512_setzero_ps();
            const __m512 b = k + 1 < x->kc ? _mm512_maskz_loadu_ps(m, e + x->ks) : _mm512_setzero_ps();
            v[p] = bf16_pairs16(a, b);
        }
        if (want_rows)
            transpose16(v);
        return;
    }
    for (int p = 0; p < 16; p++) {
        const int64_t k = kk + 2 * p;
        __m256i e = k < x->kc ? load16(x->src + (size_t)(k * x->ks + rr) * x->esz, x->f32, nr)
                              : _mm256_setzero_si256();
        __m256i o = k + 1 < x->kc
                        ? load16(x->src + (size_t)((k + 1) * x->ks + rr) * x->esz, x->f32, nr)
                        : _mm256_setzero_si256();
        v[p] = _mm512_permutex2var_epi16(_mm512_castsi256_si512(e), idx, _mm512_castsi256_si512(o));
    }
    if (want_rows)
        transpose16(v);
}

/* A format from a source with k contiguous: each step's row is 32 consecutive k of one source row, a
 * plain copy (fp32 rounded). Row by row, so that each source row is read as one sequential stream. */
static void pack_a_rows(uint16_t *dst, const view *x, int64_t kcp)
{
    for (int64_t r = 0; r < TREX_GEMM_MR; r++) {
        uint16_t *d = dst + r * 32;
        if (r >= x->rows) {
            for (int64_t kk = 0; kk < kcp; kk += 32)
                _mm512_storeu_si512(d + kk * TREX_GEMM_MR, _mm512_setzero_si512());
            continue;
        }
        const char *src = x->src + (size_t)(r * x->rs) * x->esz;
        int64_t kk = 0;
        if (x->f32)
            for (; kk + 32 <= x->kc; kk += 32) {
                const float *q = (const float *)src + kk;
                _mm512_storeu_si512(d + kk * TREX_GEMM_MR,
                                    bf16_round32(_mm512_loadu_ps(q), _mm512_loadu_ps(q + 16)));
            }
        else
            for (; kk + 32 <= x->kc; kk += 32)
                _mm512_storeu_si512(d + kk * TREX_GEMM_MR,
                                    _mm512_loadu_si512((const uint16_t *)src + kk));
        for (; kk < kcp; kk += 32)
            _mm512_storeu_si512(d + kk * TREX_GEMM_MR,
                                kk < x->kc ? load32(src + (size_t)kk * x->esz, x->f32, x->kc - kk)
                                           : _mm512_setzero_si512());
    }
}

static void pack_a(uint16_t *dst, const view *x, int64_t kcp)
{
    if (x->ks == 1) {
        pack_a_rows(dst, x, kcp);
        return;
    }
    __m512i v[16];
    for (int64_t kk = 0; kk < kcp; kk += 32)
        for (int64_t rr = 0; rr < TREX_GEMM_MR; rr += 16) {
            uint16_t *d = dst + kk * TREX_GEMM_MR + rr * 32; /* step kk/32, row rr */
            if (rr >= x->rows || kk >= x->kc) {
                for (int i = 0; i < 16; i++)
                    _mm512_storeu_si512(d + i * 32, _mm512_setzero_si512());
                continue;
            }
            load_tile(x, rr, kk, true, v);
            for (int i = 0; i < 16; i++)
                _mm512_storeu_si512(d + i * 32, v[i]);
        }
}

static void pack_b(uint16_t *dst, const view *x, int64_t kcp)
{
    __m512i v[16];
    for (int64_t kk = 0; kk < kcp; kk += 32)
        for (int64_t rr = 0; rr < TREX_GEMM_NR; rr += 16) {
            if (rr >= x->rows || kk >= x->kc) {
                for (int p = 0; p < 16; p++)
                    _mm512_storeu_si512(dst + (kk / 2 + p) * 2 * TREX_GEMM_NR + rr * 2,
                                        _mm512_setzero_si512());
                continue;
            }
            load_tile(x, rr, kk, false, v);
            for (int p = 0; p < 16; p++)
                _mm512_storeu_si512(dst + (kk / 2 + p) * 2 * TREX_GEMM_NR + rr * 2, v[p]);
        }
}

TREX_PACK_ENTRIES(AVX512_SFX, pack_a, pack_b)

void AVX512_LEAF(trex_cvt_f32_bf16)(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        _mm256_mask_storeu_epi16(dst + i, m, bf16_round16(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

void AVX512_LEAF(trex_cvt_bf16_f32)(float *dst, const uint16_t *src, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
}
