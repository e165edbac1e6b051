/* kernels/x86/avx512/gemm_bf16.c — the AVX512_BF16 GEMM micro-kernel (VDPBF16PS) and peak loops.
 *
 * The 32x32 block of C is done as four bands of 8 rows; a band keeps 8 x 2 zmm accumulators (16 fp32
 * each) while it walks all of k in pairs: two 64-byte loads of the VNNI B panel (32 columns x one k-pair) and,
 * per row, a broadcast of that row's k-pair from the A panel, then one VDPBF16PS per accumulator.
 * The B panel is read once per band; bands wholly below the rows the caller uses (c->rows: the padding
 * of a problem's last A panel) are skipped. Alongside, the next B slice is prefetched into L2 over the
 * call's steps, as the AMX level does (x86/prefetch_l2.h; 2048^3 5-9% faster, docs/kernels.md
 * "Round 17"). Also a block's transpose (the symmetric products' mirror tiles).
 * Compiled with AVX-512 flags; reached only through the dispatch table. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/gemm_panels.h"
#include "kernels/x86/avx512/mask.h"
#include "kernels/x86/avx512/transpose.h"
#include "kernels/x86/prefetch_l2.h"

static inline __m512bh bcast_pair(const uint16_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return (__m512bh)_mm512_set1_epi32(v);
}

#define ROW_INIT(r)                                                                         \
    __m512 c##r##a = accumulate ? _mm512_loadu_ps(in + (rb + r) * ldi) : _mm512_setzero_ps(), \
           c##r##b = accumulate ? _mm512_loadu_ps(in + (rb + r) * ldi + 16) : _mm512_setzero_ps()
#define ROW_STEP(r)                                                    \
    do {                                                               \
        const __m512bh a = bcast_pair(ar + (r) * 32 + 2 * q);          \
        c##r##a = _mm512_dpbf16_ps(c##r##a, a, b0);                    \
        c##r##b = _mm512_dpbf16_ps(c##r##b, a, b1);                    \
    } while (0)
#define ROW_STORE(r)                                               \
    do {                                                           \
        if (stream) {                                              \
            _mm512_stream_ps(out + (rb + r) * ldo, c##r##a);       \
            _mm512_stream_ps(out + (rb + r) * ldo + 16, c##r##b);  \
        } else {                                                   \
            _mm512_storeu_ps(out + (rb + r) * ldo, c##r##a);       \
            _mm512_storeu_ps(out + (rb + r) * ldo + 16, c##r##b);  \
        }                                                          \
    } while (0)

void trex_gemm_end_avx512(void)
{
    _mm_sfence(); /* order streamed stores of C before the caller hands the results on */
}

/* A block's transpose by 16 x 16 quarters in registers: 16 row loads, transpose16, masked row stores
 * (the scalar copy's strided loads took about 12% of a symmetric product's time; docs/kernels.md). */
void trex_gemm_tile_t_avx512(float *dst, int64_t ldd, const float *t, int64_t rows, int64_t cols)
{
    for (int64_t i0 = 0; i0 < rows; i0 += 16) {
        const __mmask16 m = tail_mask(rows - i0);
        for (int64_t j0 = 0; j0 < cols; j0 += 16) {
            __m512i r[16];
            for (int64_t i = 0; i < 16; i++)
                r[i] = i0 + i < rows ? _mm512_loadu_si512(t + (i0 + i) * TREX_GEMM_NR + j0) : _mm512_setzero_si512();
            transpose16(r);
            for (int64_t j = 0; j < 16 && j0 + j < cols; j++)
                _mm512_mask_storeu_epi32(dst + (j0 + j) * ldd + i0, m, r[j]);
        }
    }
}

void trex_gemm_ukr_avx512(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                          unsigned flags)
{
    float *const out = c->out;
    const float *const in = c->in;
    const int64_t ldo = c->ldo, ldi = c->ldi;
    const bool accumulate = flags & TREX_UKR_ACCUMULATE;
    const bool stream = (flags & TREX_UKR_STREAM) && ((uintptr_t)out % 64) == 0 && ldo % 16 == 0;
    /* bands of 8 rows that hold rows the caller uses (c->rows; the rest is the A panel's padding) */
    const int64_t mr = c->rows > 0 && c->rows < TREX_GEMM_MR ? (c->rows + 7) / 8 * 8 : TREX_GEMM_MR;
    l2_prefetch pf = l2_prefetch_plan(c->prefetch, c->prefetch_lines, mr / 8 * (kp / 32));
    for (int64_t rb = 0; rb < mr; rb += 8) {
        ROW_INIT(0);
        ROW_INIT(1);
        ROW_INIT(2);
        ROW_INIT(3);
        ROW_INIT(4);
        ROW_INIT(5);
        ROW_INIT(6);
        ROW_INIT(7);
        for (int64_t k0 = 0; k0 < kp; k0 += 32) {
            const uint16_t *ar = ap + k0 * TREX_GEMM_MR + rb * 32; /* step k0/32, row rb */
            const uint16_t *bb = bp + k0 * TREX_GEMM_NR;
            l2_prefetch_step(&pf);
            for (int q = 0; q < 16; q++) {
                const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bb + q * 2 * TREX_GEMM_NR);
                const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bb + q * 2 * TREX_GEMM_NR + 32);
                ROW_STEP(0);
                ROW_STEP(1);
                ROW_STEP(2);
                ROW_STEP(3);
                ROW_STEP(4);
                ROW_STEP(5);
                ROW_STEP(6);
                ROW_STEP(7);
            }
        }
        ROW_STORE(0);
        ROW_STORE(1);
        ROW_STORE(2);
        ROW_STORE(3);
        ROW_STORE(4);
        ROW_STORE(5);
        ROW_STORE(6);
        ROW_STORE(7);
    }
}

/* ---- register-only peak loops (trex bench peak) ---------------------------------------------------- */

/* Twenty-four named accumulators (an array would live in memory at -O2), twenty-four independent
 * chains: enough to cover a latency of up to 12 cycles on two ports. Twelve covered the 4-cycle FMA,
 * but VDPBF16PS is slower on some cores: on an AMD EPYC (Zen 5 by its CPU flags) twelve chains
 * reached 0.38 TFLOP/s per core and twenty-four 0.42 (two instructions per cycle), so twelve
 * understated the peak and overstated MFU by a tenth. OP(x) updates one; the empty asm keeps them in
 * registers and stops the compiler from folding iterations. */
#define PEAK_LOOP(OP)                                                                               \
    for (int64_t it = 0; it < iters; it++) {                                                        \
        OP(x0); OP(x1); OP(x2); OP(x3); OP(x4); OP(x5); OP(x6); OP(x7);                             \
        OP(x8); OP(x9); OP(x10); OP(x11); OP(y0); OP(y1); OP(y2); OP(y3);                           \
        OP(y4); OP(y5); OP(y6); OP(y7); OP(y8); OP(y9); OP(y10); OP(y11);                           \
        __asm__ volatile("" : "+v"(x0), "+v"(x1), "+v"(x2), "+v"(x3), "+v"(x4), "+v"(x5),          \
                         "+v"(x6), "+v"(x7), "+v"(x8), "+v"(x9), "+v"(x10), "+v"(x11));             \
        __asm__ volatile("" : "+v"(y0), "+v"(y1), "+v"(y2), "+v"(y3), "+v"(y4), "+v"(y5),          \
                         "+v"(y6), "+v"(y7), "+v"(y8), "+v"(y9), "+v"(y10), "+v"(y11));             \
    }
#define PEAK_CHAINS 24
/* the accumulators, each chain started from its own value (equal starts would let the compiler
 * compute one chain for two) */
#define PEAK_INIT(v0)                                                                               \
    __m512 x0 = _mm512_set1_ps(v0), x1 = _mm512_set1_ps(v0 + 0.01f),                               \
           x2 = _mm512_set1_ps(v0 + 0.02f), x3 = _mm512_set1_ps(v0 + 0.03f),                       \
           x4 = _mm512_set1_ps(v0 + 0.04f),                                                        \
           x5 = _mm512_set1_ps(v0 + 0.05f), x6 = _mm512_set1_ps(v0 + 0.06f),                       \
           x7 = _mm512_set1_ps(v0 + 0.07f), x8 = _mm512_set1_ps(v0 + 0.08f),                       \
           x9 = _mm512_set1_ps(v0 + 0.09f), x10 = _mm512_set1_ps(v0 + 0.10f),                      \
           x11 = _mm512_set1_ps(v0 + 0.11f), y0 = _mm512_set1_ps(v0 + 0.12f),                      \
           y1 = _mm512_set1_ps(v0 + 0.13f), y2 = _mm512_set1_ps(v0 + 0.14f),                       \
           y3 = _mm512_set1_ps(v0 + 0.15f), y4 = _mm512_set1_ps(v0 + 0.16f),                       \
           y5 = _mm512_set1_ps(v0 + 0.17f), y6 = _mm512_set1_ps(v0 + 0.18f),                       \
           y7 = _mm512_set1_ps(v0 + 0.19f), y8 = _mm512_set1_ps(v0 + 0.20f),                       \
           y9 = _mm512_set1_ps(v0 + 0.21f), y10 = _mm512_set1_ps(v0 + 0.22f),                      \
           y11 = _mm512_set1_ps(v0 + 0.23f)
#define PEAK_SINK()                                                                                 \
    do {                                                                                            \
        __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x0, x1), _mm512_add_ps(x2, x3)),      \
                                 _mm512_add_ps(_mm512_add_ps(x4, x5), _mm512_add_ps(x6, x7)));     \
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(x8, x9), _mm512_add_ps(x10, x11)));       \
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(y0, y1), _mm512_add_ps(y2, y3)));         \
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(y4, y5), _mm512_add_ps(y6, y7)));         \
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(y8, y9), _mm512_add_ps(y10, y11)));       \
        volatile float sink = _mm512_reduce_add_ps(s);                                              \
        (void)sink;                                                                                 \
    } while (0)

double trex_peak_f32_fma_avx512(int64_t iters)
{
    PEAK_INIT(1.0f);
    const __m512 m = _mm512_set1_ps(0.999999f), d = _mm512_set1_ps(1e-7f);
#define FMA(x) x = _mm512_fmadd_ps(x, m, d)
    PEAK_LOOP(FMA)
#undef FMA
    PEAK_SINK();
    return (double)iters * PEAK_CHAINS * 16 * 2;
}

double trex_peak_bf16_dp_avx512(int64_t iters)
{
    PEAK_INIT(0.0f);
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80); /* (1.0, 1.0) */
    const __m512bh b = (__m512bh)_mm512_set1_epi32(0x33d633d6); /* (1e-7, 1e-7) approximately */
#define DP(x) x = _mm512_dpbf16_ps(x, a, b)
    PEAK_LOOP(DP)
#undef DP
    PEAK_SINK();
    return (double)iters * PEAK_CHAINS * 16 * 4;
}
