/* kernels/x86/avx512/gemm_bf16.c — the AVX512_BF16 GEMM micro-kernel (VDPBF16PS) and peak loops.
 *
 * The 32x32 block of C is done as four bands of 8 rows; a band keeps 8 x 2 zmm accumulators (16 fp32
 * each) while it walks all of k in pairs: two 64-byte loads of the VNNI B panel (32 columns x one k-pair) and,
 * per row, a broadcast of that row's k-pair from the A panel, then one VDPBF16PS per accumulator.
 * The B panel is read once per band; bands wholly below the rows the caller uses (c->rows: the padding
 * of a problem's last A panel) are skipped. Alongside, the next B slice is prefetched into L2 over the
 * call's steps, as the AMX level does (x86/prefetch_l2.h; 2048^3 5-9% faster, docs/kernels.md
 * "Round 17"). Compiled with AVX-512 and AVX512_BF16 flags; reached only through the dispatch table
 * (CPUs without AVX512_BF16 run kernels/x86/avx512f/gemm_bf16.c). */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/gemm_panels.h"
#include "kernels/x86/avx512/peak.h"
#include "kernels/x86/avx512/ukr_band.h"

static inline __m512bh bcast_pair(const uint16_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return (__m512bh)_mm512_set1_epi32(v);
}

#define ROW_STEP(r)                                                    \
    do {                                                               \
        const __m512bh a = bcast_pair(ar + (r) * 32 + 2 * q);          \
        c##r##a = _mm512_dpbf16_ps(c##r##a, a, b0);                    \
        c##r##b = _mm512_dpbf16_ps(c##r##b, a, b1);                    \
    } while (0)

void trex_gemm_ukr_avx512(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                          unsigned flags)
{
    ukr_frame f = ukr_frame_of(kp, c, flags);
    for (int64_t rb = 0; rb < f.mr; rb += 8) {
        BAND_INIT();
        for (int64_t k0 = 0; k0 < kp; k0 += 32) {
            const uint16_t *ar = ap + k0 * TREX_GEMM_MR + rb * 32; /* step k0/32, row rb */
            const uint16_t *bb = bp + k0 * TREX_GEMM_NR;
            l2_prefetch_step(&f.pf);
            for (int q = 0; q < 16; q++) {
                const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bb + q * 2 * TREX_GEMM_NR);
                const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bb + q * 2 * TREX_GEMM_NR + 32);
                BAND_STEP();
            }
        }
        BAND_STORE();
    }
}

/* ---- register-only peak loop (trex bench peak; the fp32 FMA one is in gemm_f32.c) ---------------- */

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
