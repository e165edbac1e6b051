/* kernels/x86/avx512/ukr_band.h — a band of 8 rows x 32 columns of the bf16 GEMM micro-kernels' C block
 * in 16 zmm accumulators (c<r>a, c<r>b: columns 0-15 and 16-31 of row rb + r), shared by the VDPBF16PS
 * kernel (kernels/x86/avx512/gemm_bf16.c) and the FMA one (kernels/x86/avx512f/gemm_bf16.c), with the
 * call's frame (ukr_frame_of: the flags, the bands in use, the prefetch plan). The macros need the frame
 * f and the band's first row rb in scope. Only for files of the AVX-512 folders. */
#ifndef TREX_KERNELS_X86_AVX512_UKR_BAND_H
#define TREX_KERNELS_X86_AVX512_UKR_BAND_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/gemm_panels.h"
#include "kernels/x86/prefetch_l2.h"

typedef struct ukr_frame {
    float *out;
    const float *in;
    int64_t ldo, ldi;
    bool accumulate, stream;
    int64_t mr;     /* rows in bands of 8 that hold rows the caller uses (c->rows; the rest is padding) */
    l2_prefetch pf; /* the next B slice, one share per band and 32-k step */
} ukr_frame;

static inline ukr_frame ukr_frame_of(int64_t kp, const trex_ukr_c *c, unsigned flags)
{
    ukr_frame f = {c->out, c->in, c->ldo, c->ldi, flags & TREX_UKR_ACCUMULATE, false, TREX_GEMM_MR, {0}};
    f.stream = (flags & TREX_UKR_STREAM) && ((uintptr_t)f.out % 64) == 0 && f.ldo % 16 == 0;
    if (c->rows > 0 && c->rows < TREX_GEMM_MR)
        f.mr = (c->rows + 7) / 8 * 8;
    f.pf = l2_prefetch_plan(c->prefetch, c->prefetch_lines, f.mr / 8 * (kp / 32));
    return f;
}

/* row r's accumulators: zero, or the block at in when accumulating */
#define ROW_INIT(r)                                                                                     \
    __m512 c##r##a = f.accumulate ? _mm512_loadu_ps(f.in + (rb + r) * f.ldi) : _mm512_setzero_ps(),     \
           c##r##b = f.accumulate ? _mm512_loadu_ps(f.in + (rb + r) * f.ldi + 16) : _mm512_setzero_ps()
/* row r to out, streamed (non-temporal) when asked */
#define ROW_STORE(r)                                                  \
    do {                                                              \
        if (f.stream) {                                               \
            _mm512_stream_ps(f.out + (rb + r) * f.ldo, c##r##a);      \
            _mm512_stream_ps(f.out + (rb + r) * f.ldo + 16, c##r##b); \
        } else {                                                      \
            _mm512_storeu_ps(f.out + (rb + r) * f.ldo, c##r##a);      \
            _mm512_storeu_ps(f.out + (rb + r) * f.ldo + 16, c##r##b); \
        }                                                             \
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
/* one k-pair for the band: the includer's ROW_STEP(r) on each row */
#define BAND_STEP()  \
    do {             \
        ROW_STEP(0);  \
        ROW_STEP(1);  \
        ROW_STEP(2);  \
        ROW_STEP(3);  \
        ROW_STEP(4);  \
        ROW_STEP(5);  \
        ROW_STEP(6);  \
        ROW_STEP(7);  \
    } while (0)
/* the band to out */
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
