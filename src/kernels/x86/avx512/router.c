/* kernels/x86/avx512/router.c — AVX-512 leaf of the router-logits entry (kernels/fused.h, gate_fwd).
 *
 * The experts are the lanes: for 8 rows at a time and 16 experts per register, per k one broadcast
 * of x[t][k], one load of the transposed gate's row k, then a separate multiply and add per lane: the
 * reference's sum s = s + fl(x_k g_k) in increasing k for every logit, so the same bits (and those of
 * the fp32 GEMM, trex_linear_forward). Compiled with this folder's flags and ISO C: no contraction. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/fused.h"

#define GATE_ROWS 8

void trex_fused_gate_fwd_avx512(float *z, const float *x, const float *gt, int64_t n, int64_t d,
                                int64_t E)
{
    for (int64_t e0 = 0; e0 < E; e0 += 32) {
        const int64_t ne = E - e0 < 32 ? E - e0 : 32;
        const __mmask16 m0 = ne >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << ne) - 1u);
        const __mmask16 m1 = ne > 16 ? (__mmask16)((1u << (ne - 16)) - 1u) : 0;
        int64_t t = 0;
        for (; t + GATE_ROWS <= n; t += GATE_ROWS) {
            __m512 a0[GATE_ROWS], a1[GATE_ROWS];
#pragma GCC unroll 8
            for (int r = 0; r < GATE_ROWS; r++)
                a0[r] = a1[r] = _mm512_setzero_ps();
            for (int64_t k = 0; k < d; k++) {
                const __m512 g0 = _mm512_maskz_loadu_ps(m0, gt + k * E + e0);
                const __m512 g1 = _mm512_maskz_loadu_ps(m1, gt + k * E + e0 + 16);
#pragma GCC unroll 8
                for (int r = 0; r < GATE_ROWS; r++) {
                    const __m512 xv = _mm512_set1_ps(x[(t + r) * d + k]);
                    a0[r] = _mm512_add_ps(a0[r], _mm512_mul_ps(xv, g0));
                    a1[r] = _mm512_add_ps(a1[r], _mm512_mul_ps(xv, g1));
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < GATE_ROWS; r++) {
                _mm512_mask_storeu_ps(z + (t + r) * E + e0, m0, a0[r]);
                _mm512_mask_storeu_ps(z + (t + r) * E + e0 + 16, m1, a1[r]);
            }
        }
        for (; t < n; t++) {
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
            for (int64_t k = 0; k < d; k++) {
                const __m512 xv = _mm512_set1_ps(x[t * d + k]);
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(xv, _mm512_maskz_loadu_ps(m0, gt + k * E + e0)));
                a1 = _mm512_add_ps(a1,
                                   _mm512_mul_ps(xv, _mm512_maskz_loadu_ps(m1, gt + k * E + e0 + 16)));
            }
            _mm512_mask_storeu_ps(z + t * E + e0, m0, a0);
            _mm512_mask_storeu_ps(z + t * E + e0 + 16, m1, a1);
        }
    }
}

/* dx[t][j] = s + dx[t][j], s = sum_e dz[t][e] gate[e][j] from +0, e increasing: 16 columns per
 * register, 4 registers of a row, GATE_DX_ROWS rows at a time (each gate load serves them all; the
 * rows left over one at a time). */
#define GATE_DX_ROWS 4
void trex_fused_gate_bwd_dx_avx512(float *dx, const float *dz, const float *gate, int64_t n,
                                   int64_t d, int64_t E)
{
    for (int64_t j = 0; j < d; j += 64) {
        __mmask16 m[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            const int64_t left = d - j - 16 * q;
            m[q] = left >= 16 ? (__mmask16)0xffff
                              : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
        }
        int64_t t = 0;
        for (; t + GATE_DX_ROWS <= n; t += GATE_DX_ROWS) {
            __m512 s[GATE_DX_ROWS][4];
#pragma GCC unroll 4
            for (int r = 0; r < GATE_DX_ROWS; r++)
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++)
                    s[r][q] = _mm512_setzero_ps();
            for (int64_t e = 0; e < E; e++) {
                __m512 gv[4];
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++)
                    gv[q] = _mm512_maskz_loadu_ps(m[q], gate + e * d + j + 16 * q);
#pragma GCC unroll 4
                for (int r = 0; r < GATE_DX_ROWS; r++) {
                    const __m512 zv = _mm512_set1_ps(dz[(t + r) * E + e]);
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++)
                        s[r][q] = _mm512_add_ps(s[r][q], _mm512_mul_ps(zv, gv[q]));
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < GATE_DX_ROWS; r++) {
                float *o = dx + (t + r) * d + j;
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++)
                    _mm512_mask_storeu_ps(o + 16 * q, m[q],
                                          _mm512_add_ps(s[r][q], _mm512_maskz_loadu_ps(m[q], o + 16 * q)));
            }
        }
        for (; t < n; t++) {
            const float *zr = dz + t * E;
            float *o = dx + t * d + j;
            __m512 s[4];
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                s[q] = _mm512_setzero_ps();
            for (int64_t e = 0; e < E; e++) {
                const __m512 zv = _mm512_set1_ps(zr[e]);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++)
                    s[q] = _mm512_add_ps(
                        s[q], _mm512_mul_ps(zv, _mm512_maskz_loadu_ps(m[q], gate + e * d + j + 16 * q)));
            }
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                _mm512_mask_storeu_ps(o + 16 * q, m[q],
                                      _mm512_add_ps(s[q], _mm512_maskz_loadu_ps(m[q], o + 16 * q)));
        }
    }
}

/* dg[e][j] = s + dg[e][j], s = sum_t dz[t][e] x[t][j] from +0, t increasing, for j in [j0, j1): one
 * block of 16 columns at a time with up to 24 rows' sums in registers (more rows: in groups), over
 * chunks of GATE_DW_T rows of x (which stay in L2 while every column block passes over them); a sum
 * goes to ws between chunks (stored and reloaded exactly, so the order of its additions is kept). */
#define GATE_DW_ROWS 24
#define GATE_DW_T 64
void trex_fused_gate_bwd_dw_avx512(float *dg, float *ws, const float *dz, const float *x, int64_t n,
                                   int64_t d, int64_t E, int64_t j0, int64_t j1)
{
    for (int64_t e0 = 0; e0 < E; e0 += GATE_DW_ROWS) {
        const int64_t ne = E - e0 < GATE_DW_ROWS ? E - e0 : GATE_DW_ROWS;
        int64_t tc = 0;
        do {
            const int64_t tn = n - tc < GATE_DW_T ? n - tc : GATE_DW_T;
            const bool last = tc + tn >= n;
            for (int64_t j = j0; j < j1; j += 16) {
                const int64_t left = j1 - j;
                const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
                __m512 s[GATE_DW_ROWS];
#pragma GCC unroll 24
                for (int r = 0; r < GATE_DW_ROWS; r++)
                    s[r] = tc == 0 || r >= ne ? _mm512_setzero_ps()
                                              : _mm512_maskz_loadu_ps(m, ws + (e0 + r) * d + j);
                for (int64_t t = tc; t < tc + tn; t++) {
                    const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * d + j);
                    const float *zr = dz + t * E + e0;
#pragma GCC unroll 24
                    for (int r = 0; r < GATE_DW_ROWS; r++)
                        if (r < ne)
                            s[r] = _mm512_add_ps(s[r], _mm512_mul_ps(_mm512_set1_ps(zr[r]), xv));
                }
                for (int64_t r = 0; r < ne; r++) {
                    if (last) {
                        float *o = dg + (e0 + r) * d + j;
                        _mm512_mask_storeu_ps(o, m, _mm512_add_ps(s[r], _mm512_maskz_loadu_ps(m, o)));
                    } else {
                        _mm512_mask_storeu_ps(ws + (e0 + r) * d + j, m, s[r]);
                    }
                }
            }
            tc += tn;
        } while (tc < n);
    }
}
