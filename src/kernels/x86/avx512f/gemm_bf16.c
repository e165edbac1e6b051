/* kernels/x86/avx512f/gemm_bf16.c — the bf16 GEMM micro-kernel on AVX-512 without AVX512_BF16
 * (Skylake-SP to Ice Lake): fp32 FMAs on bf16 values, as the avx2 level's kernel but on 512-bit vectors.
 *
 * The block's layout and walk are the avx512 kernel's (kernels/x86/avx512/gemm_bf16.c): four bands of 8
 * rows, 8 x 2 accumulators of 16 columns each over all of k, B's VNNI pair rows read once per band,
 * bands below c->rows skipped, the next B slice prefetched into L2, C streamed when asked. Where that
 * kernel broadcasts A's pair into one VDPBF16PS per accumulator, this one first widens the band's A
 * (8 rows x 32 k, 512 contiguous bytes of the panel step) into 1 KiB of floats in L1, so that each A
 * value is one broadcast load (a load port's work) for two FMAs; B's pair row gives its even and odd values with one shift
 * and one mask (pairs.h). Per k-pair and band: 32 FMAs against 4 widening operations, and the A
 * widening adds one per 16 FMAs. Each product of two bf16 values is exact in fp32, and each sum rounds
 * once, even k then odd k; unlike VDPBF16PS, bf16 subnormal inputs are not read as zero (differences
 * below 1e-38 per product, as at the avx2 level). A second kernel takes B's pairs as fp32 values
 * (trex_gemm_bf16_f32b, below). Compiled with AVX-512 F/BW/VL flags; reached only through the dispatch
 * table. */
#include <immintrin.h>
#include <stdalign.h>
#include <stdint.h>

#include "kernels/gemm_panels.h"
#include "kernels/x86/avx512/ukr_band.h"
#include "kernels/x86/avx512f/pairs.h"
#include "kernels/x86/prefetch_l2.h"

#define ROW_STEP(r)                                                              \
    do {                                                                         \
        const __m512 a0 = _mm512_set1_ps(aw[r][2 * q]);                          \
        const __m512 a1 = _mm512_set1_ps(aw[r][2 * q + 1]);                      \
        c##r##a = _mm512_fmadd_ps(a1, o0, _mm512_fmadd_ps(a0, e0, c##r##a));     \
        c##r##b = _mm512_fmadd_ps(a1, o1, _mm512_fmadd_ps(a0, e1, c##r##b));     \
    } while (0)

void trex_gemm_ukr_avx512f(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                           unsigned flags)
{
    ukr_frame f = ukr_frame_of(kp, c, flags);
    alignas(64) float aw[8][32]; /* the band's A over one panel step, as floats */
    for (int64_t rb = 0; rb < f.mr; rb += 8) {
        BAND_INIT();
        for (int64_t k0 = 0; k0 < kp; k0 += 32) {
            const uint16_t *ar = ap + k0 * TREX_GEMM_MR + rb * 32; /* step k0/32, row rb */
            const uint16_t *bb = bp + k0 * TREX_GEMM_NR;
            l2_prefetch_step(&f.pf);
            for (int r = 0; r < 8; r++)
                widen32(aw[r], ar + r * 32);
            for (int q = 0; q < 16; q++) {
                const __m512i b0 = _mm512_loadu_si512(bb + q * 2 * TREX_GEMM_NR);
                const __m512i b1 = _mm512_loadu_si512(bb + q * 2 * TREX_GEMM_NR + 32);
                const __m512 e0 = pair_even16(b0), o0 = pair_odd16(b0);
                const __m512 e1 = pair_even16(b1), o1 = pair_odd16(b1);
                BAND_STEP();
            }
        }
        BAND_STORE();
    }
}

/* The fp32-pair kernel (trex_gemm_bf16_f32b; kernels/gemm_panels.h "fp32-pair format"): each k-pair of
 * B is one fp32 value, met by the first of A's pair in one FMA, so a k-pair costs half the FMAs of the
 * kernel above and no widening of B. The band's A goes to floats once per panel step as above, only
 * the first of each pair (16 per row and step). */
#undef ROW_STEP
#define ROW_STEP(r)                                               \
    do {                                                          \
        const __m512 a = _mm512_set1_ps(aw[r][q]);                \
        c##r##a = _mm512_fmadd_ps(a, b0, c##r##a);                \
        c##r##b = _mm512_fmadd_ps(a, b1, c##r##b);                \
    } while (0)

void trex_gemm_ukr_f32b_avx512f(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                                unsigned flags)
{
    ukr_frame f = ukr_frame_of(kp, c, flags);
    alignas(64) float aw[8][16]; /* the first of each of the band's A pairs over one panel step */
    for (int64_t rb = 0; rb < f.mr; rb += 8) {
        BAND_INIT();
        for (int64_t k0 = 0; k0 < kp; k0 += 32) {
            const uint16_t *ar = ap + k0 * TREX_GEMM_MR + rb * 32;
            const float *bb = (const float *)(const void *)(bp + k0 * TREX_GEMM_NR);
            l2_prefetch_step(&f.pf);
            for (int r = 0; r < 8; r++)
                _mm512_store_ps(aw[r], pair_even16(_mm512_loadu_si512(ar + r * 32)));
            for (int q = 0; q < 16; q++) {
                const __m512 b0 = _mm512_loadu_ps(bb + q * TREX_GEMM_NR);
                const __m512 b1 = _mm512_loadu_ps(bb + q * TREX_GEMM_NR + 16);
                BAND_STEP();
            }
        }
        BAND_STORE();
    }
}
