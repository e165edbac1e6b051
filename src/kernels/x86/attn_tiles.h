/* kernels/x86/attn_tiles.h — the bf16 attention entries of kernels/fused.h on 16 x 16 fp32 tiles, one
 * body for four product back-ends: AMX's tile unit (TDPBF16PS, kernels/x86/amx/attn.c), AVX-512's
 * VDPBF16PS on the same tile layouts (kernels/x86/avx512/attn.c) and, on CPUs without AVX512_BF16,
 * fp32 FMAs on the tiles' bf16 pairs, on AVX-512 (kernels/x86/avx512f/attn.c) or AVX2 registers
 * (kernels/x86/avx2/attn.c). Included once by each of those files, which first include their level's
 * 16-lane vector operations (vec16, mask16, wide16 and the v16_ / w16_ functions of
 * kernels/x86/avx512/vec16.h or kernels/x86/avx2/vec16.h) and define the tile operations and the
 * leaves' names:
 *   TILES_DECL             the tile state of one product function (AMX: none, the tile registers)
 *   TILE_ZERO(t)           C tile t (0..3) = 0
 *   TILE_LOAD(t, p, ld)    A or B tile t (4..7): 16 rows of 64 bytes from p, ld bytes apart
 *   TILE_DP(c, a, b)       C tile c += A tile a (16 rows x 32 bf16) times B tile b (16 pairs of rows x
 *                          16 columns, pair-interleaved: the "VNNI" layout), fp32 sums
 *   TILE_STORE(t, p, ld)   C tile t's 16 rows of 16 floats to p, ld bytes apart
 *   TILES_BEGIN(), TILES_END()   around each entry's products (AMX: the tile configuration)
 *   ATTN_LEAF(name)        the leaf's function name, trex_fused_<name>_<isa>
 *
 * One query, H heads of c dims sharing n entries (key = value). Heads are padded to Hp (a multiple of
 * 16), dims to cp (32), entries to np (32), with zeros in scratch, so every tile is a full 16 x 64-byte
 * tile and one tile shape serves every product:
 *   scores   S^T [np x Hp] = Vb [np x cp] (A tiles: 16 entries x 32 dims, rows of the entries rounded to
 *            bf16 in scratch) times Q^T (B tiles in the pair-interleaved "VNNI" layout, packed once
 *            per call); the backward computes dP^T = Vb G^T in the same pass over the A tiles;
 *   output   O [Hp x cp] = P (A tiles: 16 heads x 32 entries, bf16) times V (VNNI B tiles: 16 entry
 *            pairs x 16 dims), the query side's dq = scale (dZ V) the same way; a window given in the
 *            pair layout (Wp, kernels/fused.h) is read in place, the other entries interleaved here;
 *   key side dV[e] += [P^T | scale dZ^T] [np x 2Hp] (A) times [G ; Q] [2Hp x cp] (VNNI B): for H = 16
 *            one tile product per 16 x 16 output tile, then the tile is added to the fp32 dV rows; for
 *            a block of nq queries (sattn_bwd_window_bf16) the queries' columns and rows side by side,
 *            K = 2 Hp nq, and one add per block.
 * Softmax, exp, log, lse, psum, dsink and D stay fp32 as in kernels/ref/attn_bf16.c, which defines the
 * semantics; the sums inside the tiles follow the back-end's order and exp is a vector polynomial
 * (v16_exp, about 1 ulp) instead of libm's expf, so results agree with the reference within fp32
 * rounding (tests/test_attn_bf16.c), and are the same bits on every call (no state, a fixed order),
 * whatever the thread count of the caller or the other entries of the call.
 *
 * Each entry brackets its products with TILES_BEGIN / TILES_END; at AMX these load the GEMM
 * micro-kernel's tile configuration (trex_gemm_begin_amx: 8 tiles of 16 rows x 64 bytes) and release
 * the tiles on return, so an entry can run between the GEMM's brackets on any thread. GCC 12's tile
 * intrinsics are asm statements that see only an address: a compiler barrier separates C stores into a
 * buffer from tile loads of it, and tile stores from C loads. Reached only through the fused-kernel
 * table (kernels/ref/fused.c), after the dispatch has checked the CPU and the OS (and, for AMX, Linux's
 * tile permission). */
#ifndef TILE_DP
#error "define the tile operations (kernels/x86/<level>/attn.c) before including"
#endif
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/gemm_panels.h"

#define BARRIER() __asm__ volatile("" : : : "memory")

/* ---- scratch ---------------------------------------------------------------------------------- */

typedef struct attn_ws {
    int64_t Hp, cp, np;
    uint16_t *qb, *gb;   /* [Hp][cp] row-major bf16 q, g (zero padded) */
    const uint16_t *qr, *gr; /* the rows the products read: qb, gb, or the caller's rounded q, g */
    uint16_t *qv, *gv;   /* Q^T, G^T as VNNI B tiles: [Hp/16][cp/32] tiles of [16 pairs][16 heads][2] */
    uint16_t *vb;        /* [np][cp] row-major bf16 entries */
    uint16_t *vv;        /* V as VNNI B tiles: [np/32][cp/16] tiles of [16 pairs][16 dims][2] */
    float *st, *dt;      /* [np][Hp] S^T, dP^T */
    uint16_t *pb;        /* [Hp][npb] P or dZ (bf16), the A operand of the output product */
    /* the output product's K columns: entries e < nw (the window, read in place from its pair rows
     * wv when given) at column wl + e, the others (interleaved into vv) at kw + e - nw; npb columns,
     * a multiple of 32; without wv: nw = wl = kw = 0 and npb = np */
    const uint16_t *wv;
    int64_t wl, nw, kw, npb;
    uint16_t *zr;        /* [cp] zeros: the pair partner past the last entry */
    float *ot;           /* [Hp][cp] output tiles (also the key side's [16][cp] block) */
    uint16_t *a2;        /* [np][2Hp] the key side's [P^T | scale dZ^T] rows */
    uint16_t *b2;        /* [G ; Q] as VNNI B tiles: [2Hp/32][cp/16] tiles */
    float *ex;           /* [np] the forward's exp(z - mx) of one head */
    char *end;           /* past the layout (sattn_bwd_window_bf16 carves more from there) */
} attn_ws;

static char *carve(char **p, size_t bytes)
{
    char *r = (char *)(((uintptr_t)*p + 63) & ~(uintptr_t)63);
    *p = r + bytes;
    return r;
}

/* The layout fits in TREX_FUSED_SATTN_BF16_WS(n, H, c) floats (its 16*16 slack covers the alignment). */
static attn_ws ws_layout(float *ws, int64_t n, int64_t H, int64_t c, bool bwd, bool key)
{
    attn_ws w;
    w.Hp = TREX_FUSED_SATTN_HP(H);
    w.cp = TREX_FUSED_SATTN_CP(c);
    w.np = TREX_FUSED_SATTN_NP(n);
    const size_t hc = (size_t)(w.Hp * w.cp), nc = (size_t)(w.np * w.cp), nh = (size_t)(w.np * w.Hp);
    char *p = (char *)ws;
    w.qb = (uint16_t *)carve(&p, 2 * hc);
    w.gb = bwd ? (uint16_t *)carve(&p, 2 * hc) : NULL;
    w.qv = (uint16_t *)carve(&p, 2 * hc);
    w.gv = bwd ? (uint16_t *)carve(&p, 2 * hc) : NULL;
    w.vb = (uint16_t *)carve(&p, 2 * nc);
    w.vv = key ? NULL : (uint16_t *)carve(&p, 2 * nc);
    w.st = (float *)carve(&p, 4 * nh);
    w.dt = bwd ? (float *)carve(&p, 4 * nh) : NULL;
    w.pb = key ? NULL : (uint16_t *)carve(&p, 2 * (nh + 32 * (size_t)w.Hp)); /* npb <= np + 32 */
    w.ot = (float *)carve(&p, 4 * hc);
    w.a2 = key ? (uint16_t *)carve(&p, 4 * nh) : NULL;
    w.b2 = key ? (uint16_t *)carve(&p, 4 * hc) : NULL;
    w.ex = (bwd || key) ? NULL : (float *)carve(&p, 4 * (size_t)w.np);
    w.zr = key ? NULL : (uint16_t *)carve(&p, 2 * (size_t)w.cp);
    w.end = p;
    w.wv = NULL;
    w.wl = w.nw = w.kw = 0;
    w.npb = w.np;
    return w;
}

/* The output product's column plan (attn_ws): the window in place when Wp gives its pair rows and c
 * needs no padding (so a pair row's 16-dim chunks are the tiles' rows). */
static void window_setup(attn_ws *w, const trex_fused_pairs *Wp, int64_t n, int64_t c)
{
    if (!Wp || !Wp->rows || Wp->n <= 0 || c != w->cp)
        return;
    w->nw = Wp->n < n ? Wp->n : n;
    w->wl = Wp->first & 1;
    w->wv = Wp->rows + (Wp->first - w->wl) * c; /* pair row first / 2 */
    w->kw = (w->wl + w->nw + 31) / 32 * 32;
    w->npb = w->kw + TREX_FUSED_SATTN_NP(n - w->nw);
}

/* pb column of entry e */
static inline int64_t pcol(const attn_ws *w, int64_t e)
{
    return e < w->nw ? w->wl + e : w->kw + e - w->nw;
}

/* Zeros in the columns of pb that hold no entry (rows h < H) and in the padded heads' rows. */
static void pb_pads(const attn_ws *w, int64_t H, int64_t n)
{
    const int64_t npb = w->npb, ce = w->kw + n - w->nw;
    for (int64_t h = 0; h < H; h++) {
        uint16_t *r = w->pb + h * npb;
        if (w->wv) {
            memset(r, 0, (size_t)w->wl * 2);
            memset(r + w->wl + w->nw, 0, (size_t)(w->kw - w->wl - w->nw) * 2);
        }
        memset(r + ce, 0, (size_t)(npb - ce) * 2);
    }
    memset(w->pb + H * npb, 0, (size_t)((w->Hp - H) * npb) * 2);
}

/* ---- packing ---------------------------------------------------------------------------------- */

/* dst [cp] bf16 = src [c] rounded, zero padded; src NULL: zeros. */
static void cvt_row(uint16_t *dst, const float *src, int64_t c, int64_t cp)
{
    for (int64_t k = 0; k < cp; k += 32) {
        w16_store(dst + k, (src && k < c) ? w16_bf16(src + k, c - k) : w16_zero());
    }
}

/* rows [R] of c floats at src (stride c) into dst [Rp][cp] bf16, zero rows past R */
static void cvt_rows(uint16_t *dst, const float *src, int64_t R, int64_t Rp, int64_t c, int64_t cp)
{
    for (int64_t r = 0; r < Rp; r++)
        cvt_row(dst + r * cp, r < R ? src + r * c : NULL, c, cp);
}

/* X^T as VNNI B tiles from X [Rp][cp] bf16 at a row stride of ld bf16 (Rp rows: heads, a multiple of
 * 16): the tile of head group hg and dim step s holds, at row kp and column h, the bf16 pair
 * X[16 hg + h][32 s + 2 kp + {0, 1}] (the 32-bit word 16 s + kp of that row): a 16 x 16 transpose of
 * 32-bit words per tile, in registers (one 64-byte load per row and tile, instead of 16 gathers of
 * 4-byte words). */
static void pack_xt_vnni(uint16_t *dst, const uint16_t *X, int64_t ld, int64_t Rp, int64_t cp)
{
    uint16_t *d = dst;
    for (int64_t hg = 0; hg < Rp / 16; hg++) {
        const uint16_t *x = X + hg * 16 * ld;
        for (int64_t s = 0; s < cp / 32; s++, d += 512) {
            wide16 r[16];
            for (int h = 0; h < 16; h++)
                r[h] = w16_load(x + h * ld + 32 * s);
            w16_transpose(r);
            for (int kp = 0; kp < 16; kp++)
                w16_store(d + 32 * kp, r[kp]);
        }
    }
}

/* The bf16 rows [Hp x cp] of x [H x c] in scr: x rounded, or the caller's rounded xb copied (zero
 * padded). A copy even when xb needs no padding: the transposes that follow load 64 bytes of 16 rows
 * 1 KiB apart at a time, which measured slower from the caller's rows (L2 or memory) than one
 * sequential copy into the first-level cache first (docs/perf.md "Attention class, round 7"). */
static const uint16_t *query_rows(uint16_t *scr, const float *x, const uint16_t *xb, int64_t H,
                                  int64_t Hp, int64_t c, int64_t cp)
{
    if (!xb) {
        cvt_rows(scr, x, H, Hp, c, cp);
        return scr;
    }
    if (H == Hp && c == cp) {
        memcpy(scr, xb, (size_t)(H * c) * 2);
        return scr;
    }
    for (int64_t r = 0; r < Hp; r++) {
        uint16_t *d = scr + r * cp;
        const int64_t k = r < H ? c : 0;
        if (k)
            memcpy(d, xb + r * c, (size_t)c * 2);
        memset(d + k, 0, (size_t)(cp - k) * 2);
    }
    return scr;
}

/* q (and g, when g or gb is not NULL) as bf16 rows [Hp x cp] (w->qr, w->gr; qb, gb: already
 * rounded, or NULL; q or g may be NULL when its rounded copy is given) and packed as VNNI B tiles of
 * Q^T (G^T). */
static void pack_query(attn_ws *w, const float *q, const uint16_t *qb, const float *g,
                       const uint16_t *gb, int64_t H, int64_t c)
{
    w->qr = query_rows(w->qb, q, qb, H, w->Hp, c, w->cp);
    pack_xt_vnni(w->qv, w->qr, w->cp, w->Hp, w->cp);
    w->gr = NULL;
    if (g || gb) {
        w->gr = query_rows(w->gb, g, gb, H, w->Hp, c, w->cp);
        pack_xt_vnni(w->gv, w->gr, w->cp, w->Hp, w->cp);
    }
}

/* Entries e0 .. e0+15 are 16 consecutive rows of one rounded array (Vb[e] = Vb[e0] + (e - e0) c) with
 * no padding (c == cp): the score product then loads its A tile straight from there (stride c), and
 * pack_entries does not copy them. The same answer in both places (a function of the pointers). */
static bool direct_block(const uint16_t *const *Vb, int64_t n, int64_t e0, int64_t c, int64_t cp)
{
    if (!Vb || c != cp || e0 + 16 > n)
        return false;
    for (int64_t k = 1; k < 16; k++)
        if (Vb[e0 + k] != Vb[e0] + k * c)
            return false;
    return true;
}

/* Row e of the rounded entries as the products read it: the caller's Vb[e] (e < n, no padding) or
 * the scratch row of vb. */
static inline const uint16_t *entry_row(const attn_ws *w, const uint16_t *const *Vb, int64_t n,
                                        int64_t e, int64_t c)
{
    return (Vb && e < n && c == w->cp) ? Vb[e] : w->vb + e * w->cp;
}

/* The entries rounded into vb [n16][cp] (zero rows past n) and, when vv is not NULL, the entries from
 * w->nw on (all of them without an in-place window) also as VNNI B tiles for the output product:
 * tile (b, j) = those entries 32b .. 32b+31, dims 16j .. 16j+15. Vb (may be NULL): the entries already
 * rounded, read (or copied) instead of rounded again; rows of a direct_block are not copied (the score
 * product reads them in place). */
static void pack_entries(const attn_ws *w, const float *const *V, const uint16_t *const *Vb,
                         int64_t n, int64_t c)
{
    const int64_t cp = w->cp, nj = cp / 16;
    /* the score product runs over 16-row blocks */
    const int64_t rows = (n + 15) / 16 * 16;
    for (int64_t e0 = 0; e0 < rows; e0 += 16) {
        if (direct_block(Vb, n, e0, c, cp))
            continue;
        for (int64_t e = e0; e < e0 + 16; e++) {
            if (Vb && e < n) { /* already rounded: a copy */
                memcpy(w->vb + e * cp, Vb[e], (size_t)c * 2);
                memset(w->vb + e * cp + c, 0, (size_t)(cp - c) * 2);
            } else {
                cvt_row(w->vb + e * cp, e < n ? V[e] : NULL, c, cp);
            }
        }
    }
    if (!w->vv)
        return;
    memset(w->zr, 0, (size_t)cp * 2);
    for (int64_t r = 0; r < w->npb - w->kw; r += 2) {
        const int64_t e = w->nw + r, b = r / 32, kp = (r % 32) / 2;
        w16_interleave(w->vv + (b * nj) * 512 + kp * 32, 512,
                        e < n ? entry_row(w, Vb, n, e, c) : w->zr,
                        e + 1 < n ? entry_row(w, Vb, n, e + 1, c) : w->zr, cp);
    }
}

/* ---- products --------------------------------------------------------------------------------- */

/* S^T (and dP^T when w->dt): st[e][h] = sum_k vb[e][k] qv.., for the 16-row blocks of the n entries,
 * two blocks at a time (one in the tail); a direct_block's A tile is read from Vb in place. */
static void scores_t(const attn_ws *w, const uint16_t *const *Vb, int64_t n, int64_t c)
{
    TILES_DECL;
    const int64_t n16 = (n + 15) / 16 * 16;
    const int64_t cp = w->cp, Hp = w->Hp, ns = cp / 32;
    const size_t so = (size_t)Hp * 4;
    for (int64_t hg = 0; hg < Hp / 16; hg++) {
        const uint16_t *bq = w->qv + hg * ns * 512;
        const uint16_t *bg = w->dt ? w->gv + hg * ns * 512 : NULL;
        int64_t e = 0;
        for (; e + 32 <= n16; e += 32) {
            const bool d0 = direct_block(Vb, n, e, c, cp), d1 = direct_block(Vb, n, e + 16, c, cp);
            const uint16_t *a0 = d0 ? Vb[e] : w->vb + e * cp;
            const uint16_t *a1 = d1 ? Vb[e + 16] : w->vb + (e + 16) * cp;
            const size_t sa = (size_t)cp * 2; /* c == cp for a direct block */
            TILE_ZERO(0);
            TILE_ZERO(1);
            if (bg) {
                TILE_ZERO(2);
                TILE_ZERO(3);
            }
            for (int64_t s = 0; s < ns; s++) {
                TILE_LOAD(4, a0 + 32 * s, sa);
                TILE_LOAD(5, a1 + 32 * s, sa);
                TILE_LOAD(6, bq + s * 512, 64);
                TILE_DP(0, 4, 6);
                TILE_DP(1, 5, 6);
                if (bg) {
                    TILE_LOAD(7, bg + s * 512, 64);
                    TILE_DP(2, 4, 7);
                    TILE_DP(3, 5, 7);
                }
            }
            TILE_STORE(0, w->st + e * Hp + hg * 16, so);
            TILE_STORE(1, w->st + (e + 16) * Hp + hg * 16, so);
            if (bg) {
                TILE_STORE(2, w->dt + e * Hp + hg * 16, so);
                TILE_STORE(3, w->dt + (e + 16) * Hp + hg * 16, so);
            }
        }
        if (e < n16) {
            const uint16_t *a0 = direct_block(Vb, n, e, c, cp) ? Vb[e] : w->vb + e * cp;
            const size_t sa = (size_t)cp * 2;
            TILE_ZERO(0);
            if (bg)
                TILE_ZERO(2);
            for (int64_t s = 0; s < ns; s++) {
                TILE_LOAD(4, a0 + 32 * s, sa);
                TILE_LOAD(6, bq + s * 512, 64);
                TILE_DP(0, 4, 6);
                if (bg) {
                    TILE_LOAD(7, bg + s * 512, 64);
                    TILE_DP(2, 4, 7);
                }
            }
            TILE_STORE(0, w->st + e * Hp + hg * 16, so);
            if (bg)
                TILE_STORE(2, w->dt + e * Hp + hg * 16, so);
        }
    }
    BARRIER();
}

/* The B tile of step b (32 entries) and dims chunk j of the output product, its row stride (bytes)
 * and the distance to chunk j + 1 (bf16): the window's pair rows in place, or vv. */
static inline const uint16_t *pv_btile(const attn_ws *w, int64_t b, int64_t j, size_t *sb,
                                       int64_t *jd)
{
    const int64_t kb = w->kw / 32;
    if (b < kb) {
        *sb = (size_t)w->cp * 4; /* one pair row: 2 cp bf16 */
        *jd = 32;
        return w->wv + 32 * b * w->cp + 32 * j;
    }
    *sb = 64;
    *jd = 512;
    return w->vv + ((b - kb) * (w->cp / 16) + j) * 512;
}

/* ot [Hp][cp] = pb [Hp][npb] (A) times V (pair-row or vv tiles): four 16-dim chunks at a time (two in
 * the tail), the 32-entry steps in column order. */
static void pv_product(const attn_ws *w, float *out, int64_t ldo)
{
    TILES_DECL;
    const int64_t cp = w->cp, np = w->npb, nj = cp / 16;
    const size_t sa = (size_t)np * 2, so = (size_t)ldo * 4;
    BARRIER();
    for (int64_t hg = 0; hg < w->Hp / 16; hg++) {
        const uint16_t *pa = w->pb + hg * 16 * np;
        float *oo = out + hg * 16 * ldo;
        int64_t j = 0;
        for (; j + 4 <= nj; j += 4) {
            TILE_ZERO(0);
            TILE_ZERO(1);
            TILE_ZERO(2);
            TILE_ZERO(3);
            for (int64_t b = 0; b < np / 32; b++) {
                size_t sb;
                int64_t jd;
                const uint16_t *bv = pv_btile(w, b, j, &sb, &jd);
                TILE_LOAD(4, pa + 32 * b, sa);
                TILE_LOAD(5, bv, sb);
                TILE_LOAD(6, bv + jd, sb);
                TILE_DP(0, 4, 5);
                TILE_LOAD(7, bv + 2 * jd, sb);
                TILE_DP(1, 4, 6);
                TILE_LOAD(5, bv + 3 * jd, sb);
                TILE_DP(2, 4, 7);
                TILE_DP(3, 4, 5);
            }
            TILE_STORE(0, oo + 16 * j, so);
            TILE_STORE(1, oo + 16 * (j + 1), so);
            TILE_STORE(2, oo + 16 * (j + 2), so);
            TILE_STORE(3, oo + 16 * (j + 3), so);
        }
        for (; j < nj; j += 2) {
            TILE_ZERO(0);
            TILE_ZERO(1);
            for (int64_t b = 0; b < np / 32; b++) {
                size_t sb;
                int64_t jd;
                const uint16_t *bv = pv_btile(w, b, j, &sb, &jd);
                TILE_LOAD(4, pa + 32 * b, sa);
                TILE_LOAD(5, bv, sb);
                TILE_LOAD(6, bv + jd, sb);
                TILE_DP(0, 4, 5);
                TILE_DP(1, 4, 6);
            }
            TILE_STORE(0, oo + 16 * j, so);
            TILE_STORE(1, oo + 16 * (j + 1), so);
        }
    }
    BARRIER();
}

/* out [H][c] = mul * (the product), straight into out when the shapes allow, else through ot. */
static void pv_out(const attn_ws *w, float *out, int64_t H, int64_t c, float mul)
{
    const bool direct = H == w->Hp && c == w->cp && mul == 1.0f;
    float *dst = direct ? out : w->ot;
    const int64_t ld = direct ? c : w->cp;
    pv_product(w, dst, ld);
    if (direct)
        return;
    /* through the scratch: out is written once, with plain stores (the query side's dq goes to the
     * caller's per-thread row, which model/attention.c reads right away: the q path's first pass) */
    for (int64_t h = 0; h < H; h++) {
        const float *src = dst + h * ld;
        float *o = out + h * c;
        int64_t k = 0;
        for (; k + 16 <= c; k += 16)
            v16_store(o + k, v16_mul(v16_load(src + k), v16_set1(mul)));
        for (; k < c; k++)
            o[k] = src[k] * mul;
    }
}

/* P (dZ) into pb by runs: the bf16 values (one 16-head vector per entry) of up to 32 entries whose
 * pb columns are consecutive are held, then written as the group's rows of up to 32 columns through
 * a 16 x 16 transpose of 32-bit words (entry pairs), instead of 16 two-byte stores per entry. */
typedef struct pb_run {
    __m256i v[32];
    int64_t col, m; /* the first column, the entries held */
} pb_run;

static void pb_flush(const attn_ws *w, pb_run *r, int64_t row0, int64_t hn)
{
    if (r->m == 0)
        return;
    const __m256i z = _mm256_setzero_si256();
    wide16 x[16];
    for (int64_t k = 0; k < 16; k++)
        x[k] = w16_zip(2 * k < r->m ? r->v[2 * k] : z, 2 * k + 1 < r->m ? r->v[2 * k + 1] : z);
    w16_transpose(x); /* x[h], word k: head h of entries 2k, 2k + 1 */
    for (int64_t h = 0; h < hn; h++)
        w16_store_u16(w->pb + (row0 + h) * w->npb + r->col, x[h], r->m);
    r->m = 0;
}

static inline void pb_push(const attn_ws *w, pb_run *r, int64_t row0, int64_t hn, int64_t e,
                           __m256i v)
{
    const int64_t col = pcol(w, e);
    if (r->m > 0 && (r->m == 32 || col != r->col + r->m))
        pb_flush(w, r, row0, hn);
    if (r->m == 0)
        r->col = col;
    r->v[r->m++] = v;
}

/* The forward's softmax numerators of head group hg over entries [e0, e1): exp(s - mx) over the scores
 * in w->st (in place); returns den plus their sum, entry by entry. */
static inline vec16 exp_entries(const attn_ws *w, int64_t hg, int64_t e0, int64_t e1, vec16 mx, vec16 den)
{
    for (int64_t e = e0; e < e1; e++) {
        float *sr = w->st + e * w->Hp + 16 * hg;
        const vec16 ex = v16_exp(v16_sub(v16_load(sr), mx));
        v16_store(sr, ex);
        den = v16_add(den, ex);
    }
    return den;
}

/* lse[h] = mx_h + log(den_h) for the hn heads of a group. */
static inline void store_lse(float *lse, vec16 mx, vec16 den, int64_t hn)
{
    float mxs[16] __attribute__((aligned(64))), dens[16] __attribute__((aligned(64)));
    v16_store(mxs, mx);
    v16_store(dens, den);
    for (int64_t h = 0; h < hn; h++)
        lse[h] = mxs[h] + logf(dens[h]);
}

static inline mask16 head_mask(int64_t H, int64_t hg)
{
    return m16_first(H - 16 * hg);
}

/* ---- entries ---------------------------------------------------------------------------------- */

void ATTN_LEAF(sattn_fwd_bf16)(float *o, float *lse, float *z, float *P, float *ws,
                               const float *q, const uint16_t *qb, const float *const *V,
                               const uint16_t *const *Vb, const trex_fused_pairs *Wp, int64_t n,
                               int64_t H, int64_t c, const float *sink, float scale)
{
    if (n == 0) {
        for (int64_t h = 0; h < H; h++) {
            lse[h] = sink[h]; /* log(exp(sink - sink)) is exactly 0 */
            for (int64_t i = 0; i < c; i++)
                o[h * c + i] = 0.0f;
        }
        return;
    }
    attn_ws w = ws_layout(ws, n, H, c, false, false);
    window_setup(&w, Wp, n, c);
    const int64_t Hp = w.Hp;
    pack_query(&w, q, qb, NULL, NULL, H, c);
    pack_entries(&w, V, Vb, n, c);
    BARRIER();
    TILES_BEGIN(); /* the GEMM's tile configuration: 8 tiles of 16 rows x 64 bytes */
    scores_t(&w, Vb, n, c);
    /* softmax, 16 heads at a time (a row of S^T), exp and the divide vectorised */
    const vec16 vs = v16_set1(scale);
    for (int64_t hg = 0; hg < Hp / 16; hg++) {
        const mask16 hm = head_mask(H, hg);
        const int64_t hn = H - 16 * hg < 16 ? H - 16 * hg : 16;
        const vec16 sk = v16_loadz(hm, sink + 16 * hg);
        vec16 mx = sk;
        float zt[16] __attribute__((aligned(64)));
        for (int64_t e = 0; e < n; e++) {
            float *sr = w.st + e * Hp + 16 * hg;
            const vec16 zv = v16_mul(vs, v16_load(sr));
            v16_store(sr, zv);
            if (z) {
                v16_store(zt, zv);
                for (int64_t h = 0; h < hn; h++)
                    z[(16 * hg + h) * n + e] = zt[h];
            }
            mx = v16_max(mx, zv);
        }
        const vec16 den = exp_entries(&w, hg, 0, n, mx, v16_exp(v16_sub(sk, mx)));
        store_lse(lse + 16 * hg, mx, den, hn);
        pb_run run;
        run.m = 0;
        for (int64_t e = 0; e < n; e++) {
            const vec16 p = v16_div(v16_load(w.st + e * Hp + 16 * hg), den);
            if (P) {
                v16_store(zt, p);
                for (int64_t h = 0; h < hn; h++)
                    P[(16 * hg + h) * n + e] = zt[h];
            }
            pb_push(&w, &run, 16 * hg, hn, e, v16_bf16(p));
        }
        pb_flush(&w, &run, 16 * hg, hn);
    }
    pb_pads(&w, H, n);
    pv_out(&w, o, H, c, 1.0f);
    TILES_END();
}

/* The block entries' common start, once q (and g) are packed: the entries packed, P cleared (columns
 * a query does not see stay zero), the tile configuration loaded, the scores of every row. */
static void block_scores(attn_ws *w, const uint16_t *const *Vb, int64_t n, int64_t c)
{
    pack_entries(w, NULL, Vb, n, c);
    memset(w->pb, 0, (size_t)(w->Hp * w->npb) * 2);
    BARRIER();
    TILES_BEGIN(); /* the GEMM's tile configuration: 8 tiles of 16 rows x 64 bytes */
    scores_t(w, Vb, n, c);
}

/* Rows 16 hg .. 16 hg + 15 of a block call (Hq rows per query): their query b, its first head h0 there,
 * the hn real heads and their mask; false where the group holds padding rows only. */
static bool block_group(int64_t hg, int64_t Hq, int64_t H, int64_t *b, int64_t *h0, int64_t *hn,
                        mask16 *hm)
{
    *b = 16 * hg / Hq;
    *h0 = 16 * hg - *b * Hq;
    if (*h0 >= H)
        return false;
    *hn = H - *h0 < 16 ? H - *h0 : 16;
    *hm = m16_first(*hn);
    return true;
}

/* sattn_fwd_block_bf16: the nq queries side by side as the heads of one call (query b's heads in rows
 * b Hq .. b Hq + H - 1 of Q, Hq = H rounded up to 16, zero rows after them), so every entry's A tiles
 * (scores) and B tiles (output product) are loaded once for all of them; each query's softmax runs
 * over its own ranges only, in the per-query entry's order (the same mx, den, lse and bf16 P bits),
 * and P is zero in the columns of the entries it does not see. */
void ATTN_LEAF(sattn_fwd_block_bf16)(float *o, float *lse, float *ws, const uint16_t *qb,
                                     int64_t nq, const int64_t *vis, const uint16_t *const *Vb,
                                     const trex_fused_pairs *Wp, int64_t n, int64_t H, int64_t c,
                                     const float *sink, float scale)
{
    if (nq <= 0)
        return;
    if (n == 0) {
        for (int64_t h = 0; h < nq * H; h++) {
            lse[h] = sink[h % H]; /* log(exp(sink - sink)) is exactly 0 */
            for (int64_t i = 0; i < c; i++)
                o[h * c + i] = 0.0f;
        }
        return;
    }
    const int64_t Hq = TREX_FUSED_SATTN_HP(H);
    attn_ws w = ws_layout(ws, n, nq * Hq, c, false, false);
    window_setup(&w, Wp, n, c);
    const int64_t Hp = w.Hp, cp = w.cp;
    for (int64_t b = 0; b < nq; b++)
        query_rows(w.qb + b * Hq * cp, NULL, qb + b * H * c, H, Hq, c, cp);
    pack_xt_vnni(w.qv, w.qb, cp, Hp, cp);
    block_scores(&w, Vb, n, c);
    const vec16 vs = v16_set1(scale);
    for (int64_t hg = 0; hg < Hp / 16; hg++) {
        int64_t b, h0, hn;
        mask16 hm;
        if (!block_group(hg, Hq, H, &b, &h0, &hn, &hm))
            continue; /* padding rows only: P stays zero */
        const int64_t *rg = vis + 4 * b;
        const vec16 sk = v16_loadz(hm, sink + h0);
        vec16 mx = sk;
        for (int r = 0; r < 2; r++)
            for (int64_t e = rg[2 * r]; e < rg[2 * r + 1]; e++) {
                float *sr = w.st + e * Hp + 16 * hg;
                const vec16 zv = v16_mul(vs, v16_load(sr));
                v16_store(sr, zv);
                mx = v16_max(mx, zv);
            }
        vec16 den = v16_exp(v16_sub(sk, mx));
        for (int r = 0; r < 2; r++)
            den = exp_entries(&w, hg, rg[2 * r], rg[2 * r + 1], mx, den);
        store_lse(lse + b * H + h0, mx, den, hn);
        pb_run run;
        run.m = 0;
        for (int r = 0; r < 2; r++)
            for (int64_t e = rg[2 * r]; e < rg[2 * r + 1]; e++) {
                const vec16 p = v16_div(v16_load(w.st + e * Hp + 16 * hg), den);
                pb_push(&w, &run, 16 * hg, hn, e, v16_bf16(p));
            }
        pb_flush(&w, &run, 16 * hg, hn);
    }
    if (H == Hq && c == cp) { /* the rows of o are the rows of the product */
        pv_out(&w, o, Hp, c, 1.0f);
    } else {
        pv_product(&w, w.ot, cp);
        for (int64_t b = 0; b < nq; b++)
            for (int64_t h = 0; h < H; h++)
                memcpy(o + (b * H + h) * c, w.ot + (b * Hq + h) * cp, (size_t)c * 4);
    }
    TILES_END();
}

/* The backward's d sink of one query, and with no entries its dq (zero): true when that is all. */
static bool query_sink(float *dq, float *dsink, int64_t n, int64_t H, int64_t c, const float *sink,
                       const float *lse, const float *D)
{
    for (int64_t h = 0; h < H; h++)
        dsink[h] = -expf(sink[h] - lse[h]) * D[h];
    if (n > 0)
        return false;
    for (int64_t i = 0; i < H * c; i++)
        dq[i] = 0.0f;
    return true;
}

/* The key side's coefficients that the query side writes in its pass over the scores (NULL a2: none):
 * for entries e >= n0 the rows of a2 (K = 2 Hp bf16 each, row e - n0) and psv (16 lanes of psum per
 * entry), and with wk every entry's row into wk's operands (trex_fused_keys_out). */
typedef struct key_rows {
    uint16_t *a2;
    float *psv;
    int64_t n0, K;
    const trex_fused_keys_out *wk;
} key_rows;

/* The query side's pass over the scores of one query: p = exp(scale s - lse), dZ = p (dp - D) into the
 * P-block runs (pb_push), P (when not NULL, [H, n]) and, as key_coefs computes them (the same bits),
 * the key side's coefficients of kr (padded heads p = 0, then scale p (dp - D)). */
static void query_dz(attn_ws *w, float *P, int64_t n, int64_t H, float scale, const float *lse,
                     const float *D, const key_rows *kr)
{
    const int64_t Hp = w->Hp;
    const vec16 vs = v16_set1(scale);
    for (int64_t hg = 0; hg < Hp / 16; hg++) {
        const mask16 hm = head_mask(H, hg);
        const int64_t hn = H - 16 * hg < 16 ? H - 16 * hg : 16;
        const vec16 vl = v16_loadz(hm, lse + 16 * hg);
        const vec16 vd = v16_loadz(hm, D + 16 * hg);
        float pt[16] __attribute__((aligned(64)));
        pb_run run;
        run.m = 0;
        for (int64_t e = 0; e < n; e++) {
            const int64_t i = e * Hp + 16 * hg;
            const vec16 p = v16_exp(v16_sub(v16_mul(vs, v16_load(w->st + i)), vl));
            const vec16 dz = v16_mul(p, v16_sub(v16_load(w->dt + i), vd));
            pb_push(w, &run, 16 * hg, hn, e, v16_bf16(dz));
            if (P) {
                v16_store(pt, p);
                for (int64_t h = 0; h < hn; h++)
                    P[(16 * hg + h) * n + e] = pt[h];
            }
            if (kr && (e >= kr->n0 || kr->wk)) {
                const vec16 pk = v16_keep(hm, p);
                const vec16 sdz =
                    v16_mul(vs, v16_mul(pk, v16_sub(v16_load(w->dt + i), vd)));
                uint16_t *row = e >= kr->n0 ? kr->a2 + (e - kr->n0) * kr->K
                                            : kr->wk->a2 + (kr->wk->row + e) * kr->wk->K + kr->wk->col;
                _mm256_storeu_si256((__m256i *)(row + 16 * hg), v16_bf16(pk));
                _mm256_storeu_si256((__m256i *)(row + Hp + 16 * hg), v16_bf16(sdz));
                if (e >= kr->n0) {
                    float *ps = kr->psv + 16 * (e - kr->n0);
                    v16_store(ps, v16_add(hg ? v16_load(ps) : v16_zero(), pk));
                }
            }
        }
        pb_flush(w, &run, 16 * hg, hn);
    }
}

void ATTN_LEAF(sattn_bwd_query_bf16)(float *dq, float *dsink, float *P, float *ws,
                                     const float *g, const uint16_t *gb, const float *q,
                                     const uint16_t *qb, const float *const *V,
                                     const uint16_t *const *Vb, const trex_fused_pairs *Wp,
                                     int64_t n, int64_t H, int64_t c, const float *sink,
                                     float scale, const float *lse, const float *D)
{
    if (query_sink(dq, dsink, n, H, c, sink, lse, D))
        return;
    attn_ws w = ws_layout(ws, n, H, c, true, false);
    window_setup(&w, Wp, n, c);
    pack_query(&w, q, qb, g, gb, H, c);
    pack_entries(&w, V, Vb, n, c);
    BARRIER();
    TILES_BEGIN(); /* the GEMM's tile configuration: 8 tiles of 16 rows x 64 bytes */
    scores_t(&w, Vb, n, c);
    query_dz(&w, P, n, H, scale, lse, D, NULL);
    pb_pads(&w, H, n);
    pv_out(&w, dq, H, c, scale);
    TILES_END();
}

/* The backward's d sink of a block of nq queries, and with no entries their dq (zero): true when that
 * is all (nq <= 0 too). */
static bool block_sink(float *dq, float *dsink, int64_t nq, int64_t n, int64_t H, int64_t c,
                       const float *sink, const float *lse, const float *D)
{
    if (nq <= 0)
        return true;
    for (int64_t b = 0; b < nq; b++)
        for (int64_t h = 0; h < H; h++)
            dsink[b * H + h] = -expf(sink[h] - lse[b * H + h]) * D[b * H + h];
    if (n > 0)
        return false;
    for (int64_t i = 0; i < nq * H * c; i++)
        dq[i] = 0.0f;
    return true;
}

/* The queries of a block side by side (q and g rows of query b at b Hq), as VNNI B operands. */
static void block_query(attn_ws *w, const uint16_t *qb, const uint16_t *gb, int64_t nq, int64_t H,
                        int64_t Hq, int64_t c)
{
    const int64_t cp = w->cp;
    for (int64_t b = 0; b < nq; b++) {
        query_rows(w->qb + b * Hq * cp, NULL, qb + b * H * c, H, Hq, c, cp);
        query_rows(w->gb + b * Hq * cp, NULL, gb + b * H * c, H, Hq, c, cp);
    }
    w->qr = w->qb;
    w->gr = w->gb;
    pack_xt_vnni(w->qv, w->qb, cp, w->Hp, cp);
    pack_xt_vnni(w->gv, w->gb, cp, w->Hp, cp);
}

/* The block's pass over its scores: each query's dZ over its own ranges of vis (zero elsewhere) into
 * the P-block runs, and with a2 (else NULL) the key side's coefficients of query b in columns
 * 2 Hq b .. of rows e of a2 (K bf16 each; as key_coefs: padded heads p = 0, then scale p (dp - D)). */
static void block_dz(attn_ws *w, const int64_t *vis, int64_t H, int64_t Hq, float scale,
                     const float *lse, const float *D, uint16_t *a2, int64_t K)
{
    const int64_t Hp = w->Hp;
    const vec16 vs = v16_set1(scale);
    for (int64_t hg = 0; hg < Hp / 16; hg++) {
        int64_t b, h0, hn;
        mask16 hm;
        if (!block_group(hg, Hq, H, &b, &h0, &hn, &hm))
            continue; /* padding rows only: dZ and the coefficients stay zero */
        const int64_t *rg = vis + 4 * b;
        const vec16 vl = v16_loadz(hm, lse + b * H + h0);
        const vec16 vd = v16_loadz(hm, D + b * H + h0);
        uint16_t *ap = a2 ? a2 + 2 * Hq * b + h0 : NULL;
        pb_run run;
        run.m = 0;
        for (int r = 0; r < 2; r++)
            for (int64_t e = rg[2 * r]; e < rg[2 * r + 1]; e++) {
                const int64_t i = e * Hp + 16 * hg;
                const vec16 p = v16_exp(v16_sub(v16_mul(vs, v16_load(w->st + i)), vl));
                const vec16 dt = v16_sub(v16_load(w->dt + i), vd);
                pb_push(w, &run, 16 * hg, hn, e, v16_bf16(v16_mul(p, dt)));
                if (ap) {
                    const vec16 pk = v16_keep(hm, p);
                    _mm256_storeu_si256((__m256i *)(ap + e * K), v16_bf16(pk));
                    _mm256_storeu_si256((__m256i *)(ap + Hq + e * K),
                                        v16_bf16(v16_mul(vs, v16_mul(pk, dt))));
                }
            }
        pb_flush(w, &run, 16 * hg, hn);
    }
}

/* dq of the block's queries from the P-block runs: rows b Hq + h of the product, scaled. */
static void block_dq(attn_ws *w, float *dq, int64_t nq, int64_t H, int64_t Hq, int64_t c, float scale)
{
    const int64_t cp = w->cp;
    if (H == Hq && c == cp) { /* the rows of dq are the rows of the product */
        pv_out(w, dq, w->Hp, c, scale);
        return;
    }
    pv_product(w, w->ot, cp);
    const vec16 sc = v16_set1(scale);
    for (int64_t b = 0; b < nq; b++)
        for (int64_t h = 0; h < H; h++) { /* as pv_out: a multiply per element */
            const float *src = w->ot + (b * Hq + h) * cp;
            float *d = dq + (b * H + h) * c;
            int64_t k = 0;
            for (; k + 16 <= c; k += 16)
                v16_store(d + k, v16_mul(v16_load(src + k), sc));
            for (; k < c; k++)
                d[k] = src[k] * scale;
        }
}

/* sattn_bwd_query_block_bf16: the queries side by side as in sattn_fwd_block_bf16 (q and g rows of
 * query b at b Hq); each query's dZ over its own ranges, zero elsewhere. */
void ATTN_LEAF(sattn_bwd_query_block_bf16)(float *dq, float *dsink, float *ws,
                                           const uint16_t *gb, const uint16_t *qb, int64_t nq,
                                           const int64_t *vis, const uint16_t *const *Vb,
                                           const trex_fused_pairs *Wp, int64_t n, int64_t H,
                                           int64_t c, const float *sink, float scale,
                                           const float *lse, const float *D)
{
    if (block_sink(dq, dsink, nq, n, H, c, sink, lse, D))
        return;
    const int64_t Hq = TREX_FUSED_SATTN_HP(H);
    attn_ws w = ws_layout(ws, n, nq * Hq, c, true, false);
    window_setup(&w, Wp, n, c);
    block_query(&w, qb, gb, nq, H, Hq, c);
    block_scores(&w, Vb, n, c);
    block_dz(&w, vis, H, Hq, scale, lse, D, NULL, 0);
    block_dq(&w, dq, nq, H, Hq, c, scale);
    TILES_END();
}

/* Row e < n of a2 (K bf16 per row), columns col0 .. col0 + 2Hp: the key side's coefficients of one
 * query, [bf(p_he) | bf(scale dz_he)] over the heads (zero for padded heads), from its S^T and dP^T
 * in w->st, w->dt, for lo <= e < hi, and zeros for the other entries; psum[e] = sum_h p_he (psum may
 * be NULL). */
static void key_coefs(const attn_ws *w, uint16_t *a2, int64_t K, float *psum, int64_t col0,
                      int64_t lo, int64_t hi, int64_t n, int64_t H, float scale, const float *lse,
                      const float *D)
{
    const int64_t Hp = w->Hp;
    const vec16 vs = v16_set1(scale);
    for (int64_t e = 0; e < n; e++) {
        uint16_t *row = a2 + e * K + col0;
        if (e < lo || e >= hi) {
            memset(row, 0, (size_t)(2 * Hp) * 2);
            continue;
        }
        vec16 ps = v16_zero();
        for (int64_t hg = 0; hg < Hp / 16; hg++) {
            const mask16 hm = head_mask(H, hg);
            const int64_t i = e * Hp + 16 * hg;
            const vec16 vl = v16_loadz(hm, lse + 16 * hg);
            const vec16 vd = v16_loadz(hm, D + 16 * hg);
            /* padded heads: p = 0 */
            const vec16 p = v16_keep(
                hm, v16_exp(v16_sub(v16_mul(vs, v16_load(w->st + i)), vl)));
            const vec16 sdz =
                v16_mul(vs, v16_mul(p, v16_sub(v16_load(w->dt + i), vd)));
            _mm256_storeu_si256((__m256i *)(row + 16 * hg), v16_bf16(p));
            _mm256_storeu_si256((__m256i *)(row + Hp + 16 * hg), v16_bf16(sdz));
            ps = v16_add(ps, p);
        }
        if (psum)
            psum[e] = v16_sum(ps);
    }
}

/* [G ; Q] of one query (w->gr, w->qr rows) as rows r0 .. r0 + 2Hp of the key side's VNNI B operand b2
 * (K index 32 s + 2 kp (+1) is row r of the stack, cp/16 chunks per step; r0 a multiple of 32). */
static void key_stack(const attn_ws *w, uint16_t *b2, int64_t r0)
{
    const int64_t Hp = w->Hp, cp = w->cp, nj = cp / 16;
    for (int64_t r = 0; r < 2 * Hp; r += 2) {
        const uint16_t *x0 = r < Hp ? w->gr + r * cp : w->qr + (r - Hp) * cp;
        const int64_t s = (r0 + r) / 32, kp = ((r0 + r) % 32) / 2;
        w16_interleave(b2 + (s * nj) * 512 + kp * 32, 512, x0, x0 + cp, cp);
    }
}

/* The key side's product for the n entries: dV[e] += row e of a2 [n16][K] (A) times b2 [K][cp] (VNNI
 * B tiles, K/32 steps of cp/16 chunks), 16 entries x 64 dims of output tiles at a time, each added to
 * the fp32 dV rows (through w->ot). */
static void key_product(const attn_ws *w, float *const *dV, const uint16_t *a2, const uint16_t *b2,
                        int64_t K, int64_t n, int64_t c)
{
    TILES_DECL;
    const int64_t cp = w->cp, nj = cp / 16;
    const size_t sa = (size_t)K * 2, so = (size_t)cp * 4;
    for (int64_t e0 = 0; e0 < n; e0 += 16) {
        const uint16_t *a = a2 + e0 * K;
        int64_t j = 0;
        for (; j + 4 <= nj; j += 4) {
            TILE_ZERO(0);
            TILE_ZERO(1);
            TILE_ZERO(2);
            TILE_ZERO(3);
            for (int64_t s = 0; s < K / 32; s++) {
                const uint16_t *bv = b2 + (s * nj + j) * 512;
                TILE_LOAD(4, a + 32 * s, sa);
                TILE_LOAD(5, bv, 64);
                TILE_LOAD(6, bv + 512, 64);
                TILE_DP(0, 4, 5);
                TILE_LOAD(7, bv + 1024, 64);
                TILE_DP(1, 4, 6);
                TILE_LOAD(5, bv + 1536, 64);
                TILE_DP(2, 4, 7);
                TILE_DP(3, 4, 5);
            }
            TILE_STORE(0, w->ot + 16 * j, so);
            TILE_STORE(1, w->ot + 16 * (j + 1), so);
            TILE_STORE(2, w->ot + 16 * (j + 2), so);
            TILE_STORE(3, w->ot + 16 * (j + 3), so);
        }
        for (; j < nj; j += 2) {
            TILE_ZERO(0);
            TILE_ZERO(1);
            for (int64_t s = 0; s < K / 32; s++) {
                const uint16_t *bv = b2 + (s * nj + j) * 512;
                TILE_LOAD(4, a + 32 * s, sa);
                TILE_LOAD(5, bv, 64);
                TILE_LOAD(6, bv + 512, 64);
                TILE_DP(0, 4, 5);
                TILE_DP(1, 4, 6);
            }
            TILE_STORE(0, w->ot + 16 * j, so);
            TILE_STORE(1, w->ot + 16 * (j + 1), so);
        }
        BARRIER();
        const int64_t e1 = e0 + 16 < n ? e0 + 16 : n;
        for (int64_t e = e0; e < e1; e++) {
            const float *src = w->ot + (e - e0) * cp;
            float *dv = dV[e];
            int64_t k = 0;
            for (; k + 16 <= c; k += 16)
                v16_store(dv + k,
                                 v16_add(v16_load(dv + k), v16_load(src + k)));
            for (; k < c; k++)
                dv[k] += src[k];
        }
        BARRIER();
    }
}

/* The key side always runs on the tiles, whatever n: each entry's result is then a function of that
 * entry and the query alone (its row of every product), so callers may group the entries of a query
 * in any way (model/attention.c groups them by thread-runs of tiles) and get the same bits. A separate
 * path for a few entries (an AVX-512 loop on rounded values, faster for n < 3) summed the scores in
 * another order and so made the bits depend on the grouping, hence on the thread count. */
void ATTN_LEAF(sattn_bwd_entries_bf16)(float *const *dV, float *psum, float *ws,
                                       const float *const *V, const uint16_t *const *Vb,
                                       int64_t n, const float *q, const uint16_t *qb,
                                       const float *g, const uint16_t *gb, int64_t H, int64_t c,
                                       float scale, const float *lse, const float *D)
{
    if (n == 0)
        return;
    attn_ws w = ws_layout(ws, n, H, c, true, true);
    const int64_t K = 2 * w.Hp;
    pack_query(&w, q, qb, g, gb, H, c);
    key_stack(&w, w.b2, 0); /* [G ; Q] as VNNI B */
    pack_entries(&w, V, Vb, n, c);
    BARRIER();
    TILES_BEGIN(); /* the GEMM's tile configuration: 8 tiles of 16 rows x 64 bytes */
    scores_t(&w, Vb, n, c);
    key_coefs(&w, w.a2, K, psum, 0, 0, n, n, H, scale, lse, D);
    for (int64_t e = n; e < (n + 15) / 16 * 16; e++)
        memset(w.a2 + e * K, 0, (size_t)K * 2);
    BARRIER();
    key_product(&w, dV, w.a2, w.b2, K, n, c);
    TILES_END();
}

/* sattn_bwd_query_keys_bf16: the query side as the sattn_bwd_query_bf16 leaf, and, for the
 * entries n0 .. n - 1, the key side's coefficients written from the same scores in the same pass (as
 * key_coefs computes them: the same bits), then [G ; Q] and the key side's product as
 * the sattn_bwd_entries_bf16 leaf. One packing of q, g and the entries, one score product. */
void ATTN_LEAF(sattn_bwd_query_keys_bf16)(float *dq, float *dsink, float *P, float *const *dV,
                                          float *psum, float *ws, const uint16_t *gb,
                                          const uint16_t *qb, const uint16_t *const *Vb,
                                          const trex_fused_pairs *Wp, int64_t n, int64_t n0,
                                          int64_t H, int64_t c, const float *sink, float scale,
                                          const float *lse, const float *D,
                                          const trex_fused_keys_out *wk)
{
    if (query_sink(dq, dsink, n, H, c, sink, lse, D))
        return;
    attn_ws w = ws_layout(ws, n, H, c, true, false);
    window_setup(&w, Wp, n, c);
    const int64_t Hp = w.Hp, cp = w.cp, nk = n - n0, K = 2 * Hp, nk16 = (nk + 15) / 16 * 16;
    char *p = w.end;
    uint16_t *a2 = (uint16_t *)carve(&p, (size_t)(nk16 * K) * 2);
    uint16_t *b2 = (uint16_t *)carve(&p, (size_t)(K * cp) * 2);
    float *psv = (float *)carve(&p, (size_t)(16 * nk) * 4); /* psum's 16 lanes per entry */
    pack_query(&w, NULL, qb, NULL, gb, H, c);
    if (nk > 0 || wk) {
        key_stack(&w, b2, 0); /* [G ; Q] as VNNI B */
        if (wk) /* rows col .. col + 2 Hp of wk->b2: the same tiles (col a multiple of 32) */
            memcpy(wk->b2 + (wk->col / 32) * (cp / 16) * 512, b2, (size_t)(K * cp) * 2);
    }
    pack_entries(&w, NULL, Vb, n, c);
    BARRIER();
    TILES_BEGIN(); /* the GEMM's tile configuration: 8 tiles of 16 rows x 64 bytes */
    scores_t(&w, Vb, n, c);
    const key_rows kr = {a2, psv, n0, K, wk};
    query_dz(&w, P, n, H, scale, lse, D, &kr);
    pb_pads(&w, H, n);
    pv_out(&w, dq, H, c, scale);
    if (nk > 0) {
        for (int64_t e = 0; e < nk; e++)
            psum[e] = v16_sum(v16_load(psv + 16 * e));
        for (int64_t e = nk; e < nk16; e++)
            memset(a2 + e * K, 0, (size_t)K * 2);
        BARRIER();
        key_product(&w, dV, a2, b2, K, nk, c);
    }
    TILES_END();
}

/* sattn_key_product_bf16: key_product on operands written by queries (trex_fused_keys_out) */
void ATTN_LEAF(sattn_key_product_bf16)(float *const *dV, float *ws, const uint16_t *a2,
                                       const uint16_t *b2, int64_t K, int64_t n, int64_t c)
{
    if (n == 0 || K == 0)
        return;
    attn_ws w;
    memset(&w, 0, sizeof w);
    w.cp = TREX_FUSED_SATTN_CP(c);
    w.ot = (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    BARRIER();
    TILES_BEGIN();
    key_product(&w, dV, a2, b2, K, n, c);
    TILES_END();
}

/* [G ; Q] of query b of a block call (its Hq rows of w->gr, w->qr from row b Hq) as rows r0 ..
 * r0 + 2 Hq of b2 (VNNI B tiles as key_stack; r0 a multiple of 32) */
static void key_stack_block(const attn_ws *w, uint16_t *b2, int64_t r0, int64_t b, int64_t Hq)
{
    const int64_t cp = w->cp, nj = cp / 16;
    const uint16_t *gr = w->gr + b * Hq * cp, *qr = w->qr + b * Hq * cp;
    for (int64_t r = 0; r < 2 * Hq; r += 2) {
        const uint16_t *x0 = r < Hq ? gr + r * cp : qr + (r - Hq) * cp;
        const int64_t s = (r0 + r) / 32, kp = ((r0 + r) % 32) / 2;
        w16_interleave(b2 + (s * nj) * 512 + kp * 32, 512, x0, x0 + cp, cp);
    }
}

/* sattn_bwd_query_block_keys_bf16: the block query side as the sattn_bwd_query_block_bf16 leaf,
 * and from the same scores, in the same pass, the key side's coefficients of every query on its two
 * ranges (as key_coefs, in the columns 2 Hq b .. of sattn_bwd_window_bf16's layout, zero elsewhere),
 * so that each entry's row of the key product is the row the window entry gives it: the same bits. */
void ATTN_LEAF(sattn_bwd_query_block_keys_bf16)(
    float *dq, float *dsink, float *const *dV, float *ws, const uint16_t *gb, const uint16_t *qb,
    int64_t nq, const int64_t *vis, const uint16_t *const *Vb, const trex_fused_pairs *Wp,
    int64_t n, int64_t H, int64_t c, const float *sink, float scale, const float *lse,
    const float *D)
{
    if (block_sink(dq, dsink, nq, n, H, c, sink, lse, D))
        return;
    const int64_t Hq = TREX_FUSED_SATTN_HP(H);
    attn_ws w = ws_layout(ws, n, nq * Hq, c, true, false);
    window_setup(&w, Wp, n, c);
    const int64_t cp = w.cp, K = 2 * Hq * nq, n16 = (n + 15) / 16 * 16;
    char *p = w.end;
    uint16_t *a2 = (uint16_t *)carve(&p, (size_t)(n16 * K) * 2);
    uint16_t *b2 = (uint16_t *)carve(&p, (size_t)(K * cp) * 2);
    block_query(&w, qb, gb, nq, H, Hq, c);
    for (int64_t b = 0; b < nq; b++)
        key_stack_block(&w, b2, 2 * Hq * b, b, Hq);
    memset(a2, 0, (size_t)(n16 * K) * 2);
    block_scores(&w, Vb, n, c);
    block_dz(&w, vis, H, Hq, scale, lse, D, a2, K);
    block_dq(&w, dq, nq, H, Hq, c, scale);
    BARRIER();
    key_product(&w, dV, a2, b2, K, n, c);
    TILES_END();
}

/* The key side of a block of nq queries (kernels/fused.h sattn_bwd_window_bf16): per query, its scores
 * and coefficients as in the entry above (zero columns for the entries it does not see), into one A
 * row per entry of K = 2 Hp nq columns, and its [G ; Q] into rows 2 Hp b .. of one B operand; then one
 * product over K per 16 entries and one add into dV. Each entry's row of every product depends only on
 * that entry and the block (scores_t and key_product are row by row), whatever else shares the call. */
void ATTN_LEAF(sattn_bwd_window_bf16)(float *const *dV, float *ws, const uint16_t *const *Vb,
                                      int64_t n, int64_t nq, const int64_t *vis,
                                      const uint16_t *qb, const uint16_t *gb, int64_t H,
                                      int64_t c, float scale, const float *lse, const float *D)
{
    if (n == 0 || nq == 0)
        return;
    attn_ws w = ws_layout(ws, n, H, c, true, true);
    const int64_t Hp = w.Hp, cp = w.cp, K = 2 * Hp * nq, n16 = (n + 15) / 16 * 16;
    char *p = w.end;
    uint16_t *a2 = (uint16_t *)carve(&p, (size_t)(w.np * K) * 2);
    uint16_t *b2 = (uint16_t *)carve(&p, (size_t)(K * cp) * 2);
    pack_entries(&w, NULL, Vb, n, c);
    TILES_BEGIN(); /* the GEMM's tile configuration: 8 tiles of 16 rows x 64 bytes */
    for (int64_t b = 0; b < nq; b++) {
        pack_query(&w, NULL, qb + b * H * c, NULL, gb + b * H * c, H, c);
        key_stack(&w, b2, 2 * Hp * b);
        if (vis[2 * b] < vis[2 * b + 1]) {
            BARRIER();
            scores_t(&w, Vb, n, c);
        }
        /* a query that sees none of the entries: zero coefficients (key_coefs reads no score) */
        key_coefs(&w, a2, K, NULL, 2 * Hp * b, vis[2 * b], vis[2 * b + 1], n, H, scale,
                  lse + b * H, D + b * H);
    }
    for (int64_t e = n; e < n16; e++)
        memset(a2 + e * K, 0, (size_t)K * 2);
    BARRIER();
    key_product(&w, dV, a2, b2, K, n, c);
    TILES_END();
}

/* ---- indexer scores ------------------------------------------------------------------------- */

/* out[r*n + e] = bf(A_r) . Kb[e'] (kernels/fused.h, dots_bf16): S^T [n16 x Hp] = K (A tiles: 16 entry
 * rows x 32 dims, straight from Kb when its rows are consecutive and c is a multiple of 32, else
 * gathered into scratch) times A^T (VNNI B tiles, packed once per call), four 16-entry blocks at a
 * time so that each B tile is loaded once per four products; then S^T is written out transposed. */
void ATTN_LEAF(dots_bf16)(float *out, float *ws, const float *A, int64_t lda, int64_t R,
                          const uint16_t *Kb, const int64_t *idx, int64_t n, int64_t c)
{
    if (n == 0 || R == 0)
        return;
    const int64_t Hp = TREX_FUSED_SATTN_HP(R), cp = TREX_FUSED_SATTN_CP(c), ns = cp / 32;
    const int64_t n16 = (n + 15) / 16 * 16;
    char *p = (char *)ws;
    uint16_t *qb = (uint16_t *)carve(&p, (size_t)(Hp * cp) * 2);
    uint16_t *qv = (uint16_t *)carve(&p, (size_t)(Hp * cp) * 2);
    float *st = (float *)carve(&p, (size_t)(n16 * Hp) * 4);
    const bool direct = idx == NULL && c == cp;
    const uint16_t *rows = Kb;
    if (!direct) {
        uint16_t *g = (uint16_t *)carve(&p, (size_t)(n16 * cp) * 2);
        for (int64_t e = 0; e < n16; e++) {
            uint16_t *d = g + e * cp;
            if (e < n) {
                memcpy(d, Kb + (idx ? idx[e] : e) * c, (size_t)c * 2);
                memset(d + c, 0, (size_t)(cp - c) * 2);
            } else {
                memset(d, 0, (size_t)cp * 2);
            }
        }
        rows = g;
    }
    for (int64_t r = 0; r < Hp; r++) {
        uint16_t *d = qb + r * cp;
        for (int64_t k = 0; k < cp; k += 32) {
            w16_store(d + k, (r < R && k < c) ? w16_bf16(A + r * lda + k, c - k) : w16_zero());
        }
    }
    pack_xt_vnni(qv, qb, cp, Hp, cp);
    BARRIER();
    TILES_DECL;
    TILES_BEGIN(); /* the GEMM's tile configuration: 8 tiles of 16 rows x 64 bytes */
    const size_t sa = (size_t)cp * 2, so = (size_t)Hp * 4;
    for (int64_t hg = 0; hg < Hp / 16; hg++) {
        const uint16_t *bq = qv + hg * ns * 512;
        int64_t e = 0;
        for (; e + 64 <= n16; e += 64) {
            const uint16_t *a0 = rows + e * cp;
            TILE_ZERO(0);
            TILE_ZERO(1);
            TILE_ZERO(2);
            TILE_ZERO(3);
            for (int64_t s = 0; s < ns; s++) {
                TILE_LOAD(6, bq + s * 512, 64);
                TILE_LOAD(4, a0 + 32 * s, sa);
                TILE_LOAD(5, a0 + 16 * cp + 32 * s, sa);
                TILE_DP(0, 4, 6);
                TILE_LOAD(4, a0 + 32 * cp + 32 * s, sa);
                TILE_DP(1, 5, 6);
                TILE_LOAD(5, a0 + 48 * cp + 32 * s, sa);
                TILE_DP(2, 4, 6);
                TILE_DP(3, 5, 6);
            }
            TILE_STORE(0, st + e * Hp + hg * 16, so);
            TILE_STORE(1, st + (e + 16) * Hp + hg * 16, so);
            TILE_STORE(2, st + (e + 32) * Hp + hg * 16, so);
            TILE_STORE(3, st + (e + 48) * Hp + hg * 16, so);
        }
        for (; e < n16; e += 16) {
            const uint16_t *a0 = rows + e * cp;
            TILE_ZERO(0);
            for (int64_t s = 0; s < ns; s++) {
                TILE_LOAD(6, bq + s * 512, 64);
                TILE_LOAD(4, a0 + 32 * s, sa);
                TILE_DP(0, 4, 6);
            }
            TILE_STORE(0, st + e * Hp + hg * 16, so);
        }
    }
    TILES_END();
    BARRIER();
    /* out [R][n] = S^T transposed, 16 entries x 16 rows at a time through the registers */
    for (int64_t hg = 0; hg < Hp / 16; hg++) {
        const int64_t rn = R - 16 * hg < 16 ? R - 16 * hg : 16;
        for (int64_t e0 = 0; e0 < n; e0 += 16) {
            wide16 x[16];
            for (int64_t k = 0; k < 16; k++) /* st has n16 rows */
                x[k] = w16_load(st + (e0 + k) * Hp + 16 * hg);
            w16_transpose(x); /* x[r], word k: row 16 hg + r of entry e0 + k */
            const int64_t m = n - e0 < 16 ? n - e0 : 16;
            for (int64_t r = 0; r < rn; r++)
                w16_store_u32(out + (16 * hg + r) * n + e0, x[r], m);
        }
    }
}
