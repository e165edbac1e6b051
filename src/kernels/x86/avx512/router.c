/* kernels/x86/avx512/router.c — AVX-512 leaf of the router-logits entry (kernels/fused.h, gate_fwd).
 *
 * The experts are the lanes: for 8 rows at a time and 16 experts per register, per k one broadcast
 * of x[t][k], one load of the transposed gate's row k, then a separate multiply and add per lane: the
 * reference's sum s = s + fl(x_k g_k) in increasing k for every logit, so the same bits (and those of
 * the fp32 GEMM, trex_linear_forward). Compiled with this folder's flags and ISO C: no contraction.
 * The _fma entries (bf16 mode's mHC products, kernels/fused.h) run the same loops with one fused
 * multiply-add per term instead (gate_madd below). */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/fused.h"
#include "kernels/x86/avx512/mask.h"

#define GATE_ROWS 8

/* s + a b: a separate multiply and add (the fp32 GEMM's bits), or with fma one fused multiply-add */
static inline __attribute__((always_inline)) __m512 gate_madd(int fma, __m512 s, __m512 a, __m512 b)
{
    return fma ? _mm512_fmadd_ps(a, b, s) : _mm512_add_ps(s, _mm512_mul_ps(a, b));
}

static inline __attribute__((always_inline)) void gate_fwd(int fma, float *z, const float *x,
                                                           const float *gt, int64_t n, int64_t d,
                                                           int64_t E)
{
    for (int64_t e0 = 0; e0 < E; e0 += 32) {
        const int64_t ne = E - e0 < 32 ? E - e0 : 32;
        const __mmask16 m0 = tail_mask(ne);
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
                    a0[r] = gate_madd(fma, a0[r], xv, g0);
                    a1[r] = gate_madd(fma, a1[r], xv, g1);
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
                a0 = gate_madd(fma, a0, xv, _mm512_maskz_loadu_ps(m0, gt + k * E + e0));
                a1 = gate_madd(fma, a1, xv, _mm512_maskz_loadu_ps(m1, gt + k * E + e0 + 16));
            }
            _mm512_mask_storeu_ps(z + t * E + e0, m0, a0);
            _mm512_mask_storeu_ps(z + t * E + e0 + 16, m1, a1);
        }
    }
}

void trex_fused_gate_fwd_avx512(float *z, const float *x, const float *gt, int64_t n, int64_t d,
                                int64_t E)
{
    gate_fwd(0, z, x, gt, n, d, E);
}

void trex_fused_gate_fwd_fma_avx512(float *z, const float *x, const float *gt, int64_t n, int64_t d,
                                    int64_t E)
{
    gate_fwd(1, z, x, gt, n, d, E);
}

/* The sums s[r][q] = sum_e dz[r][e] gate[e][j + 16 q] from +0, e increasing, of R rows (dz rows E
 * apart, gate rows ldg apart), 4 registers of 16 columns each (masks m): each gate load serves all R
 * rows. */
#define GATE_DX_ROWS 4
static inline __attribute__((always_inline)) void gate_dx_sums(int fma, int R,
                                                               __m512 s[GATE_DX_ROWS][4],
                                                               const float *dz, const float *gate,
                                                               int64_t ldg, int64_t E, int64_t j,
                                                               const __mmask16 *m)
{
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            s[r][q] = _mm512_setzero_ps();
    for (int64_t e = 0; e < E; e++) {
        __m512 gv[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            gv[q] = _mm512_maskz_loadu_ps(m[q], gate + e * ldg + j + 16 * q);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 zv = _mm512_set1_ps(dz[r * E + e]);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                s[r][q] = gate_madd(fma, s[r][q], zv, gv[q]);
        }
    }
}

/* The masks of the 4 registers of 64 columns starting at column j of d. */
static inline __attribute__((always_inline)) void cols64_masks(__mmask16 *m, int64_t d, int64_t j)
{
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        const int64_t left = d - j - 16 * q;
        m[q] = tail_mask(left);
    }
}

/* dx[t][j] = s + dx[t][j] for R rows at columns [j, j + 64) (gate_dx_sums' s). */
static inline __attribute__((always_inline)) void gate_dx_rows(int R, float *dx, const float *dz,
                                                               const float *gate, int64_t d, int64_t E,
                                                               int64_t j, const __mmask16 *m)
{
    __m512 s[GATE_DX_ROWS][4];
    gate_dx_sums(0, R, s, dz, gate, d, E, j, m);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float *o = dx + r * d + j;
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            _mm512_mask_storeu_ps(o + 16 * q, m[q],
                                  _mm512_add_ps(s[r][q], _mm512_maskz_loadu_ps(m[q], o + 16 * q)));
    }
}

/* dx[t][j] = s + dx[t][j], s = sum_e dz[t][e] gate[e][j] from +0, e increasing: 16 columns per
 * register, 4 registers of a row, GATE_DX_ROWS rows at a time (each gate load serves them all; the
 * rows left over one at a time). */
void trex_fused_gate_bwd_dx_avx512(float *dx, const float *dz, const float *gate, int64_t n,
                                   int64_t d, int64_t E)
{
    for (int64_t j = 0; j < d; j += 64) {
        __mmask16 m[4];
        cols64_masks(m, d, j);
        int64_t t = 0;
        for (; t + GATE_DX_ROWS <= n; t += GATE_DX_ROWS)
            gate_dx_rows(GATE_DX_ROWS, dx + t * d, dz + t * E, gate, d, E, j, m);
        for (; t < n; t++)
            gate_dx_rows(1, dx + t * d, dz + t * E, gate, d, E, j, m);
    }
}

/* gate_bwd_dx_mhc: gate_bwd_dx's sum s for R rows at a time, 64 columns of one stream k per step,
 * then per element dX = s + ((dX + w_k dx) - c X), each operation rounded on its own (separate
 * multiply and add, as the passes it replaces: mhc_collapse_bwd, mhc_rho_bwd, gate_bwd_dx). */
static inline __attribute__((always_inline)) void gate_dx_mhc_rows(
    int fma, int R, float *dX, const float *dz, const float *gate, int64_t nd, int64_t E, const float *X,
    const float *dx, const float *w, int64_t wld, const float *c, int64_t d, int k, int64_t i,
    const __mmask16 *m)
{
    const int64_t j = (int64_t)k * d + i;
    __m512 s[GATE_DX_ROWS][4];
    gate_dx_sums(fma, R, s, dz, gate, nd, E, j, m);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m512 wv = _mm512_set1_ps(w[r * wld + k]), cv = _mm512_set1_ps(c[r]);
        float *o = dX + r * nd + j;
        const float *xr = X + r * nd + j, *g = dx + r * d + i;
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            const __m512 u = _mm512_add_ps(_mm512_maskz_loadu_ps(m[q], o + 16 * q),
                                           _mm512_mul_ps(wv, _mm512_maskz_loadu_ps(m[q], g + 16 * q)));
            const __m512 v = _mm512_sub_ps(u, _mm512_mul_ps(cv, _mm512_maskz_loadu_ps(m[q], xr + 16 * q)));
            _mm512_mask_storeu_ps(o + 16 * q, m[q], _mm512_add_ps(s[r][q], v));
        }
    }
}

static inline __attribute__((always_inline)) void gate_dx_mhc(int fma, float *dX, const float *dz,
                                                              const float *gate, int64_t n, int ns,
                                                              int64_t d, int64_t E, const float *X,
                                                              const float *dx, const float *w,
                                                              int64_t wld, const float *c)
{
    const int64_t nd = (int64_t)ns * d;
    for (int k = 0; k < ns; k++)
        for (int64_t i = 0; i < d; i += 64) {
            __mmask16 m[4];
            cols64_masks(m, d, i);
            int64_t t = 0;
            for (; t + GATE_DX_ROWS <= n; t += GATE_DX_ROWS)
                gate_dx_mhc_rows(fma, GATE_DX_ROWS, dX + t * nd, dz + t * E, gate, nd, E, X + t * nd,
                                 dx + t * d, w + t * wld, wld, c + t, d, k, i, m);
            for (; t < n; t++)
                gate_dx_mhc_rows(fma, 1, dX + t * nd, dz + t * E, gate, nd, E, X + t * nd, dx + t * d,
                                 w + t * wld, wld, c + t, d, k, i, m);
        }
}

void trex_fused_gate_bwd_dx_mhc_avx512(float *dX, const float *dz, const float *gate, int64_t n,
                                       int ns, int64_t d, int64_t E, const float *X,
                                       const float *dx, const float *w, int64_t wld, const float *c)
{
    gate_dx_mhc(0, dX, dz, gate, n, ns, d, E, X, dx, w, wld, c);
}

void trex_fused_gate_bwd_dx_mhc_fma_avx512(float *dX, const float *dz, const float *gate, int64_t n,
                                           int ns, int64_t d, int64_t E, const float *X,
                                           const float *dx, const float *w, int64_t wld,
                                           const float *c)
{
    gate_dx_mhc(1, dX, dz, gate, n, ns, d, E, X, dx, w, wld, c);
}

/* dg[e][j] = s + dg[e][j], s = sum_t dz[t][e] x[t][j] from +0, t increasing, for j in [j0, j1): one
 * block of 16 columns at a time with up to 24 rows' sums in registers (more rows: in groups), over
 * chunks of GATE_DW_T rows of x (which stay in L2 while every column block passes over them); a sum
 * goes to ws between chunks (stored and reloaded exactly, so the order of its additions is kept).
 * Groups of 24 rows (and 16, 8, 4) get a loop of their own with the row count a constant, so the
 * sums stay in registers (a run-time count spilled them to the stack). x is read one line per row
 * at a time, GATE_DW_T rows apart (16 KiB at the mHC's shapes): 32 rows stay within what the L2
 * streamer follows (64 did not), and each row's line GATE_DW_PF floats ahead is prefetched. mHC's
 * dfn (N = 4096, n d = 4096, E = 24), one thread: 34-36 -> 11.7-12.9 ms (docs/perf.md, round 6). */
#define GATE_DW_ROWS 24
#define GATE_DW_T 32
#define GATE_DW_PF 64
static inline __attribute__((always_inline)) void gate_dw_chunk(int fma, int ne, float *dg,
                                                                float *ws, const float *dz,
                                                                const float *x, int64_t d, int64_t E,
                                                                int64_t e0, int64_t tc, int64_t tn,
                                                                bool last, int64_t j0, int64_t j1)
{
    for (int64_t j = j0; j < j1; j += 16) {
        const int64_t left = j1 - j;
        const __mmask16 m = tail_mask(left);
        __m512 s[GATE_DW_ROWS];
#pragma GCC unroll 24
        for (int r = 0; r < ne; r++)
            s[r] = tc == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, ws + (e0 + r) * d + j);
        for (int64_t t = tc; t < tc + tn; t++) {
            _mm_prefetch((const char *)(x + t * d + j + GATE_DW_PF), _MM_HINT_T0);
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * d + j);
            const float *zr = dz + t * E + e0;
#pragma GCC unroll 24
            for (int r = 0; r < ne; r++)
                s[r] = gate_madd(fma, s[r], _mm512_set1_ps(zr[r]), xv);
        }
#pragma GCC unroll 24
        for (int r = 0; r < ne; r++) {
            if (last) {
                float *o = dg + (e0 + r) * d + j;
                _mm512_mask_storeu_ps(o, m, _mm512_add_ps(s[r], _mm512_maskz_loadu_ps(m, o)));
            } else {
                _mm512_mask_storeu_ps(ws + (e0 + r) * d + j, m, s[r]);
            }
        }
    }
}

static inline __attribute__((always_inline)) void gate_dw(int fma, float *dg, float *ws,
                                                          const float *dz, const float *x, int64_t n,
                                                          int64_t d, int64_t E, int64_t j0, int64_t j1)
{
    for (int64_t e0 = 0; e0 < E; e0 += GATE_DW_ROWS) {
        const int64_t ne = E - e0 < GATE_DW_ROWS ? E - e0 : GATE_DW_ROWS;
        int64_t tc = 0;
        do {
            const int64_t tn = n - tc < GATE_DW_T ? n - tc : GATE_DW_T;
            const bool last = tc + tn >= n;
            switch (ne) {
            case 24: gate_dw_chunk(fma, 24, dg, ws, dz, x, d, E, e0, tc, tn, last, j0, j1); break;
            case 16: gate_dw_chunk(fma, 16, dg, ws, dz, x, d, E, e0, tc, tn, last, j0, j1); break;
            case 8: gate_dw_chunk(fma, 8, dg, ws, dz, x, d, E, e0, tc, tn, last, j0, j1); break;
            case 4: gate_dw_chunk(fma, 4, dg, ws, dz, x, d, E, e0, tc, tn, last, j0, j1); break;
            default: gate_dw_chunk(fma, (int)ne, dg, ws, dz, x, d, E, e0, tc, tn, last, j0, j1); break;
            }
            tc += tn;
        } while (tc < n);
    }
}

void trex_fused_gate_bwd_dw_avx512(float *dg, float *ws, const float *dz, const float *x, int64_t n,
                                   int64_t d, int64_t E, int64_t j0, int64_t j1)
{
    gate_dw(0, dg, ws, dz, x, n, d, E, j0, j1);
}

void trex_fused_gate_bwd_dw_fma_avx512(float *dg, float *ws, const float *dz, const float *x,
                                       int64_t n, int64_t d, int64_t E, int64_t j0, int64_t j1)
{
    gate_dw(1, dg, ws, dz, x, n, d, E, j0, j1);
}
