/* kernels/ref/bf16.c — plain-C reference leaves of the bf16 GEMM: panel packing (kernels/gemm_panels.h
 * formats), the 32x32 micro-kernel, a block's transpose, and bulk fp32 <-> bf16 conversion.
 *
 * These are the entries of the `ref` dispatch level and the baseline the ISA leaves are tested against.
 * The micro-kernel sums each element over k in increasing order, one fp32 add per product (products of
 * two bf16 values are exact in fp32), and treats subnormal bf16 inputs as zero, as AMX does. */
#include <string.h>

#include "kernels/gemm_panels.h"
#include "trex/tensor.h"

/* bf16 -> fp32 with subnormals as (signed) zero. */
static inline float bf16_daz(uint16_t h)
{
    uint32_t u = (h & 0x7f80u) == 0 ? (uint32_t)(h & 0x8000u) << 16 : (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void trex_gemm_ukr_ref(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                       unsigned flags)
{
    /* TREX_UKR_STREAM: plain stores here; the prefetch hint is not taken */
    const bool accumulate = flags & TREX_UKR_ACCUMULATE;
    enum { M = TREX_GEMM_MR, N = TREX_GEMM_NR };
    float acc[M][N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            acc[i][j] = accumulate ? c->in[i * c->ldi + j] : 0.0f;
    for (int64_t k = 0; k < kp; k++) {
        float b[N];
        const uint16_t *bk = bp + (k / 2) * (2 * N) + (k % 2);
        for (int j = 0; j < N; j++)
            b[j] = bf16_daz(bk[2 * j]);
        const uint16_t *ak = ap + (k / 32) * (32 * M) + k % 32;
        for (int i = 0; i < M; i++) {
            const float a = bf16_daz(ak[i * 32]);
            for (int j = 0; j < N; j++)
                acc[i][j] += a * b[j];
        }
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            c->out[i * c->ldo + j] = acc[i][j];
}

void trex_gemm_tile_t_ref(float *dst, int64_t ldd, const float *t, int64_t rows, int64_t cols)
{
    for (int64_t j = 0; j < cols; j++)
        for (int64_t i = 0; i < rows; i++)
            dst[j * ldd + i] = t[i * TREX_GEMM_NR + j];
}

static inline uint16_t load_bf16(const void *src, int64_t idx)
{
    return ((const uint16_t *)src)[idx];
}

static inline uint16_t load_f32(const void *src, int64_t idx)
{
    return trex_f32_to_bf16(((const float *)src)[idx]);
}

/* The four packers share one loop each, instantiated for the two source types. */
#define PACK_A(name, load)                                                                          \
    void name(uint16_t *dst, const void *src, int64_t rs, int64_t ks, int64_t rows, int64_t kc,    \
              int64_t kcp)                                                                          \
    {                                                                                               \
        for (int64_t r = 0; r < TREX_GEMM_MR; r++)                                                 \
            for (int64_t k = 0; k < kcp; k++)                                                       \
                dst[(k / 32) * (32 * TREX_GEMM_MR) + r * 32 + k % 32] =                             \
                    r < rows && k < kc ? load(src, r * rs + k * ks) : 0;                            \
    }
#define PACK_B(name, load)                                                                          \
    void name(uint16_t *dst, const void *src, int64_t rs, int64_t ks, int64_t rows, int64_t kc,    \
              int64_t kcp)                                                                          \
    {                                                                                               \
        for (int64_t k = 0; k < kcp; k++)                                                           \
            for (int64_t r = 0; r < TREX_GEMM_NR; r++)                                             \
                dst[(k / 2) * (2 * TREX_GEMM_NR) + r * 2 + (k % 2)] =                               \
                    r < rows && k < kc ? load(src, r * rs + k * ks) : 0;                            \
    }

PACK_A(trex_pack_a_bf16_ref, load_bf16)
PACK_A(trex_pack_a_f32_ref, load_f32)
PACK_B(trex_pack_b_bf16_ref, load_bf16)
PACK_B(trex_pack_b_f32_ref, load_f32)

void trex_cvt_f32_bf16_ref(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = trex_f32_to_bf16(src[i]);
}

void trex_cvt_bf16_f32_ref(float *dst, const uint16_t *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = trex_bf16_to_f32(src[i]);
}
