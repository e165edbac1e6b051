/* kernels/x86/avx512/peak.h — the register-only peak loops' frame (trex bench peak), shared by the fp32
 * FMA peak (gemm_f32.c) and the VDPBF16PS one (gemm_bf16.c). Only for files of the AVX-512 folders. */
#ifndef TREX_KERNELS_X86_AVX512_PEAK_H
#define TREX_KERNELS_X86_AVX512_PEAK_H

#include <immintrin.h>
#include <stdint.h>

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

#endif
