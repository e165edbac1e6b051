/* kernels/x86/avx512/ukr_band.h — a band of 8 rows x 32 columns of the bf16 GEMM micro-kernels' C block
 * in 16 zmm accumulators (c<r>a, c<r>b: columns 0-15 and 16-31 of row rb + r), shared by the VDPBF16PS
 * kernel (kernels/x86/avx512/gemm_bf16.c) and the FMA one (kernels/x86/avx512f/gemm_bf16.c). The
 * includer's function has out, in, ldo, ldi, accumulate, stream and rb in scope. Only for files of the
 * AVX-512 folders. */
#ifndef TREX_KERNELS_X86_AVX512_UKR_BAND_H
#define TREX_KERNELS_X86_AVX512_UKR_BAND_H

#include <immintrin.h>

/* row r's accumulators: zero, or the block at in when accumulating */
#define ROW_INIT(r)                                                                         \
    __m512 c##r##a = accumulate ? _mm512_loadu_ps(in + (rb + r) * ldi) : _mm512_setzero_ps(), \
           c##r##b = accumulate ? _mm512_loadu_ps(in + (rb + r) * ldi + 16) : _mm512_setzero_ps()
/* row r to out, streamed (non-temporal) when asked */
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
#define BAND_INIT() \
    ROW_INIT(0);    \
    ROW_INIT(1);    \
    ROW_INIT(2);    \
    ROW_INIT(3);    \
    ROW_INIT(4);    \
    ROW_INIT(5);    \
    ROW_INIT(6);    \
    ROW_INIT(7)
#define BAND_STORE()  \
    do {              \
        ROW_STORE(0); \
        ROW_STORE(1); \
        ROW_STORE(2); \
        ROW_STORE(3); \
        ROW_STORE(4); \
        ROW_STORE(5); \
        ROW_STORE(6); \
        ROW_STORE(7); \
    } while (0)

#endif
