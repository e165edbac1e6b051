/* kernels/x86/amx/emu.c — the AMX tile instructions in C for test builds without the tile unit
 * (kernels/x86/amx/emu.h says what is emulated and why). Empty unless TREX_AMX_EMU is defined.
 *
 * The tile file is thread-local: it stands for the tile registers, which each hardware thread has of
 * its own, and is the one piece of mutable global state outside the dispatch table (STYLE.md rule 10),
 * in test builds only. */
#ifdef TREX_AMX_EMU

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/x86/amx/emu.h"
#include "trex/status.h"

enum { TILES = 8, MAX_ROWS = 16, MAX_COLSB = 64 }; /* palette 1 */

typedef struct tile_file {
    int palette; /* 0: no configuration (the state after TILERELEASE) */
    uint8_t rows[TILES];
    uint16_t colsb[TILES];
    uint8_t data[TILES][MAX_ROWS][MAX_COLSB];
} tile_file;

static _Thread_local tile_file tf;

void trex_amx_emu_loadconfig(const void *cfg)
{
    const uint8_t *b = cfg;
    memset(&tf, 0, sizeof tf);
    if (b[0] == 0) /* palette 0: the initial state */
        return;
    if (b[0] != 1)
        TREX_ABORT("amx emu: LDTILECFG palette %d (only 0 and 1 exist) would fault (#GP)", b[0]);
    for (int i = 2; i < 16; i++)
        if (b[i])
            TREX_ABORT("amx emu: LDTILECFG reserved byte %d is %d, not 0 (#GP)", i, b[i]);
    for (int t = 0; t < 16; t++) {
        uint16_t colsb;
        memcpy(&colsb, b + 16 + 2 * t, sizeof colsb);
        const uint8_t rows = b[48 + t];
        if (t >= TILES) {
            if (colsb || rows)
                TREX_ABORT("amx emu: LDTILECFG configures tile %d; palette 1 has 8 tiles (#GP)", t);
            continue;
        }
        if (rows > MAX_ROWS || colsb > MAX_COLSB || (rows == 0) != (colsb == 0))
            TREX_ABORT("amx emu: LDTILECFG tile %d as %d rows x %d bytes; palette 1 allows 1..16 x 1..64, "
                       "or 0 x 0 for an unused tile (#GP)",
                       t, rows, colsb);
        tf.rows[t] = rows;
        tf.colsb[t] = colsb;
    }
    tf.palette = 1;
}

void trex_amx_emu_release(void)
{
    memset(&tf, 0, sizeof tf);
}

/* A tile instruction's operand: configured, and a tile of the palette (else the hardware's #UD). */
static void check_tile(int t, const char *insn)
{
    if (!tf.palette)
        TREX_ABORT("amx emu: %s without a tile configuration (LDTILECFG) on this thread (#UD)", insn);
    if (t < 0 || t >= TILES)
        TREX_ABORT("amx emu: %s names tile %d; palette 1 has tiles 0..7", insn, t);
    if (!tf.rows[t])
        TREX_ABORT("amx emu: %s on tile %d, which the configuration leaves unused (#UD)", insn, t);
}

void trex_amx_emu_zero(int t)
{
    check_tile(t, "TILEZERO");
    memset(tf.data[t], 0, sizeof tf.data[t]);
}

void trex_amx_emu_load(int t, const void *base, size_t stride)
{
    check_tile(t, "TILELOADD");
    memset(tf.data[t], 0, sizeof tf.data[t]);
    for (int r = 0; r < tf.rows[t]; r++)
        memcpy(tf.data[t][r], (const char *)base + (size_t)r * stride, tf.colsb[t]);
}

void trex_amx_emu_store(int t, void *base, size_t stride)
{
    check_tile(t, "TILESTORED");
    for (int r = 0; r < tf.rows[t]; r++)
        memcpy((char *)base + (size_t)r * stride, tf.data[t][r], tf.colsb[t]);
}

/* The tile unit's number handling: subnormal inputs read as zero, subnormal results flushed to zero. */
static inline float flush(float x)
{
    return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x;
}

/* Element i of a row of bf16 values, as fp32 (subnormals read as zero). */
static float bf16_at(const uint8_t *row, int i)
{
    uint16_t h;
    memcpy(&h, row + 2 * i, sizeof h);
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return flush(x);
}

void trex_amx_emu_dpbf16ps(int c, int a, int b)
{
    check_tile(c, "TDPBF16PS");
    check_tile(a, "TDPBF16PS");
    check_tile(b, "TDPBF16PS");
    if (c == a || c == b || a == b)
        TREX_ABORT("amx emu: TDPBF16PS tmm%d, tmm%d, tmm%d repeats a tile (#UD)", c, a, b);
    const int M = tf.rows[c], N = tf.colsb[c] / 4, K = tf.colsb[a] / 4;
    if (tf.colsb[c] % 4 || tf.colsb[a] % 4 || tf.rows[a] != M || tf.rows[b] != K || tf.colsb[b] != tf.colsb[c])
        TREX_ABORT("amx emu: TDPBF16PS shapes do not match (#UD): C tmm%d %d x %d B, A tmm%d %d x %d B, "
                   "B tmm%d %d x %d B",
                   c, tf.rows[c], tf.colsb[c], a, tf.rows[a], tf.colsb[a], b, tf.rows[b], tf.colsb[b]);
    enum { NP = MAX_COLSB / 4 }; /* pairs per row */
    float be[NP][NP], bo[NP][NP]; /* B's even and odd elements: [k][n] */
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            be[k][n] = bf16_at(tf.data[b][k], 2 * n);
            bo[k][n] = bf16_at(tf.data[b][k], 2 * n + 1);
        }
    for (int m = 0; m < M; m++) {
        float even[NP] = {0}, odd[NP] = {0}, cm[NP];
        for (int k = 0; k < K; k++) {
            const float a0 = bf16_at(tf.data[a][m], 2 * k), a1 = bf16_at(tf.data[a][m], 2 * k + 1);
            /* each product of two bf16 values is exact in fp32: one rounding per sum */
            for (int n = 0; n < N; n++) {
                even[n] = flush(even[n] + a0 * be[k][n]);
                odd[n] = flush(odd[n] + a1 * bo[k][n]);
            }
        }
        memcpy(cm, tf.data[c][m], (size_t)N * sizeof(float));
        for (int n = 0; n < N; n++)
            cm[n] = flush(flush(cm[n]) + flush(even[n] + odd[n]));
        memcpy(tf.data[c][m], cm, (size_t)N * sizeof(float));
    }
}

#endif /* TREX_AMX_EMU */
