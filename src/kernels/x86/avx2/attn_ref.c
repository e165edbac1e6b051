/* kernels/x86/avx2/attn_ref.c — the avx2 level's bf16 attention entries: the reference
 * (kernels/ref/attn_bf16.c) compiled again with this folder's AVX2 and FMA flags and -O3 (Makefile),
 * under the names trex_fused_<name>_avx2, with its three row products written here on AVX2 registers
 * (ATTN_ROW_PRODUCTS_ELSEWHERE) and the key product in kernels/x86/avx2/attn.c.
 *
 * Every operation is the reference's, in its order, so these are the reference's bits
 * (tests/test_attn_bf16.c compares the levels): the build is ISO C with -ffp-contract=off, so no
 * multiply and add is fused, and the products below are a multiply, then an add. What changes is which
 * values stay in registers:
 *   dots_rows     four rows' dot products with one entry at once, am_dot_f's 16 partial sums of each as
 *                 two registers, so each 16 floats of the entry are loaded once for four rows;
 *   wsum_rows     a 4-row x 16-column piece of the output sums in eight registers over all the entries
 *                 (the reference walks the entries outermost and reads and writes each output row once
 *                 per entry);
 *   combine_rows  64 columns of the key side's sums in eight registers over all 2H terms.
 * The columns past the last whole piece (c not a multiple of 16) take the reference's scalar loops.
 * Measured on the AMD VM (`TREX_ISA=avx2 test_attn_bf16 --bench 3`, H 16, c 512, n 256): docs/kernels.md
 * "The avx2 attention core". A tile form, as the AVX-512 and AMX leaves have, would be faster still, at
 * the cost of the reference's bits. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define ATTN_LEAF(name) trex_fused_##name##_avx2
#define ATTN_LEAF_KEY_PRODUCT_ELSEWHERE
#define ATTN_ROW_PRODUCTS_ELSEWHERE

static inline __m256 mul_add(__m256 s, __m256 a, __m256 b)
{
    return _mm256_add_ps(s, _mm256_mul_ps(a, b));
}

/* am_dot_f's result from one dot's 16 partial sums (lo: sums 0-7, hi: 8-15) and its tail's sum t:
 * ((((s0 + s8) + (s4 + s12)) + ((s1 + s9) + (s5 + s13))) + (((s2 + s10) + (s6 + s14)) + ((s3 + s11) +
 * (s7 + s15)))) + t */
static inline float dot_tree(__m256 lo, __m256 hi, float t)
{
    const __m256 u = _mm256_add_ps(lo, hi); /* s_k + s_{k+8} */
    const __m128 w = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    float x[4];
    _mm_storeu_ps(x, w); /* x_k = u_k + u_{k+4} */
    return ((x[0] + x[1]) + (x[2] + x[3])) + t;
}

/* out[r] = am_dot_f(A + r c, v, c) for r < R */
static void dots_rows(float *out, const float *A, int64_t R, const float *v, int64_t c)
{
    const int64_t c16 = c / 16 * 16;
    for (int64_t r0 = 0; r0 < R; r0 += 4) {
        const int64_t nr = R - r0 < 4 ? R - r0 : 4;
        /* rows past R repeat row r0: computed, not stored */
        const float *a0 = A + r0 * c, *a1 = nr > 1 ? a0 + c : a0, *a2 = nr > 2 ? a0 + 2 * c : a0,
                    *a3 = nr > 3 ? a0 + 3 * c : a0;
        __m256 l0 = _mm256_setzero_ps(), l1 = l0, l2 = l0, l3 = l0, h0 = l0, h1 = l0, h2 = l0, h3 = l0;
        for (int64_t i = 0; i < c16; i += 16) {
            const __m256 vl = _mm256_loadu_ps(v + i), vh = _mm256_loadu_ps(v + i + 8);
            l0 = mul_add(l0, _mm256_loadu_ps(a0 + i), vl), h0 = mul_add(h0, _mm256_loadu_ps(a0 + i + 8), vh);
            l1 = mul_add(l1, _mm256_loadu_ps(a1 + i), vl), h1 = mul_add(h1, _mm256_loadu_ps(a1 + i + 8), vh);
            l2 = mul_add(l2, _mm256_loadu_ps(a2 + i), vl), h2 = mul_add(h2, _mm256_loadu_ps(a2 + i + 8), vh);
            l3 = mul_add(l3, _mm256_loadu_ps(a3 + i), vl), h3 = mul_add(h3, _mm256_loadu_ps(a3 + i + 8), vh);
        }
        float t[4] = {0};
        const float *rows[4] = {a0, a1, a2, a3};
        for (int j = 0; j < nr; j++)
            for (int64_t i = c16; i < c; i++)
                t[j] += rows[j][i] * v[i];
        const __m256 lo[4] = {l0, l1, l2, l3}, hi[4] = {h0, h1, h2, h3};
        for (int j = 0; j < nr; j++)
            out[r0 + j] = dot_tree(lo[j], hi[j], t[j]);
    }
}

/* O_r[i] += w[r ldw + e] V_e[i] for e < n ascending (each product rounded, then added), r < R, i < c;
 * O_r = O + r c, V_e = V + e c */
static void wsum_rows(float *O, int64_t R, const float *w, int64_t ldw, const float *V, int64_t n,
                      int64_t c)
{
    const int64_t c16 = c / 16 * 16;
    for (int64_t r0 = 0; r0 < R; r0 += 4) {
        const int64_t nr = R - r0 < 4 ? R - r0 : 4;
        /* rows past R: row r0's weights into sums that are not stored */
        const float *w0 = w + r0 * ldw, *w1 = nr > 1 ? w0 + ldw : w0, *w2 = nr > 2 ? w0 + 2 * ldw : w0,
                    *w3 = nr > 3 ? w0 + 3 * ldw : w0;
        float *o0 = O + r0 * c, *o1 = nr > 1 ? o0 + c : o0, *o2 = nr > 2 ? o0 + 2 * c : o0,
              *o3 = nr > 3 ? o0 + 3 * c : o0;
        for (int64_t i = 0; i < c16; i += 16) {
            __m256 l0 = _mm256_loadu_ps(o0 + i), h0 = _mm256_loadu_ps(o0 + i + 8);
            __m256 l1 = _mm256_loadu_ps(o1 + i), h1 = _mm256_loadu_ps(o1 + i + 8);
            __m256 l2 = _mm256_loadu_ps(o2 + i), h2 = _mm256_loadu_ps(o2 + i + 8);
            __m256 l3 = _mm256_loadu_ps(o3 + i), h3 = _mm256_loadu_ps(o3 + i + 8);
            for (int64_t e = 0; e < n; e++) {
                const __m256 vl = _mm256_loadu_ps(V + e * c + i), vh = _mm256_loadu_ps(V + e * c + i + 8);
                const __m256 b0 = _mm256_broadcast_ss(w0 + e), b1 = _mm256_broadcast_ss(w1 + e);
                l0 = mul_add(l0, b0, vl), h0 = mul_add(h0, b0, vh);
                l1 = mul_add(l1, b1, vl), h1 = mul_add(h1, b1, vh);
                const __m256 b2 = _mm256_broadcast_ss(w2 + e), b3 = _mm256_broadcast_ss(w3 + e);
                l2 = mul_add(l2, b2, vl), h2 = mul_add(h2, b2, vh);
                l3 = mul_add(l3, b3, vl), h3 = mul_add(h3, b3, vh);
            }
            /* a repeated row (R not a multiple of 4) computed row r0's sums from the same loads: its
             * store writes the same bits */
            _mm256_storeu_ps(o3 + i, l3), _mm256_storeu_ps(o3 + i + 8, h3);
            _mm256_storeu_ps(o2 + i, l2), _mm256_storeu_ps(o2 + i + 8, h2);
            _mm256_storeu_ps(o1 + i, l1), _mm256_storeu_ps(o1 + i + 8, h1);
            _mm256_storeu_ps(o0 + i, l0), _mm256_storeu_ps(o0 + i + 8, h0);
        }
        for (int64_t r = r0; r < r0 + nr; r++)
            for (int64_t i = c16; i < c; i++) {
                float s = O[r * c + i];
                for (int64_t e = 0; e < n; e++)
                    s += w[r * ldw + e] * V[e * c + i];
                O[r * c + i] = s;
            }
    }
}

/* The terms a[k] X_k[i] for k < 2H ascending (X_k = G + k c for k < H, then Q + (k - H) c), each
 * product rounded, then added into acc[i] (i < c); with first, the sum starts at the first term (+0
 * when there is none, H = 0). */
static void combine_rows(float *acc, bool first, const float *a, const float *G, const float *Q,
                         int64_t H, int64_t c)
{
    if (H <= 0) {
        if (first)
            memset(acc, 0, (size_t)c * sizeof *acc);
        return;
    }
    const int64_t K = 2 * H, c64 = c / 64 * 64, k0 = first ? 1 : 0;
    for (int64_t i = 0; i < c64; i += 64) {
        __m256 s[8];
        if (first) {
            const __m256 a0 = _mm256_broadcast_ss(a);
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                s[j] = _mm256_mul_ps(a0, _mm256_loadu_ps(G + i + 8 * j));
        } else {
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                s[j] = _mm256_loadu_ps(acc + i + 8 * j);
        }
        for (int64_t k = k0; k < K; k++) {
            const float *x = (k < H ? G + k * c : Q + (k - H) * c) + i;
            const __m256 ak = _mm256_broadcast_ss(a + k);
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                s[j] = mul_add(s[j], ak, _mm256_loadu_ps(x + 8 * j));
        }
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
            _mm256_storeu_ps(acc + i + 8 * j, s[j]);
    }
    for (int64_t i = c64; i < c; i++) {
        float s = first ? a[0] * G[i] : acc[i];
        for (int64_t k = k0; k < K; k++)
            s += a[k] * (k < H ? G + k * c : Q + (k - H) * c)[i];
        acc[i] = s;
    }
}

#include "kernels/ref/attn_bf16.c"
