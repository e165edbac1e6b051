/* tests/test_amx_emu.c — the AMX emulator of test builds (kernels/x86/amx/emu.c, make AMX_EMU=1), on
 * its own: the AMX leaves' tests (test_kernels, test_attn_bf16, test_model at the amx level) trust it
 * to be the instructions, so it is checked against what the Intel SDM says they do.
 *
 * 1. TDPBF16PS on full 16 x 64-byte tiles against an fp64 product (A rows of bf16 pairs, B in the
 *    pair-interleaved "VNNI" layout, C summed onto), within fp32 rounding.
 * 2. The SDM's order: a pair's even and odd products go to two fp32 sums over k, added to C at the end
 *    (a case whose bits tell that order from one running sum); bf16 subnormal inputs read as zero.
 * 3. A configuration smaller than the palette's tiles: loads copy only the configured rows and bytes
 *    and zero the rest, stores write only those, TDPBF16PS takes its sizes from the configuration.
 * 4. What the hardware faults on aborts the process (in a child): no configuration, a repeated tile,
 *    shapes that do not match, a palette other than 0 and 1, a tile past the eighth, TILERELEASE then use.
 * 5. Each thread has its own tiles: a configuration on one thread leaves another unconfigured.
 * In a build without AMX_EMU there is no emulator: the test says so and checks nothing. */
#include <stdio.h>

#include "check.h"

#ifndef TREX_AMX_EMU
int main(void)
{
    printf("skip: not an AMX_EMU build (make AMX_EMU=1): no emulator to test\n");
    return check_summary();
}
#else

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/x86/amx/emu.h"
#include "trex/tensor.h"

/* A palette-1 configuration with tiles 0..n-1 of rows x colsb. */
static void config(uint8_t cfg[64], int n, int rows, int colsb)
{
    memset(cfg, 0, 64);
    cfg[0] = 1;
    for (int t = 0; t < n; t++) {
        const uint16_t c = (uint16_t)colsb;
        memcpy(cfg + 16 + 2 * t, &c, 2);
        cfg[48 + t] = (uint8_t)rows;
    }
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint16_t bf(float x)
{
    return trex_f32_to_bf16(x);
}

static void test_product(void)
{
    uint8_t cfg[64];
    config(cfg, 8, 16, 64);
    trex_amx_emu_loadconfig(cfg);
    uint16_t a[16][32], b[16][32]; /* A: 16 rows x 16 pairs; B: 16 pair rows x 16 columns x 2 */
    float c[16][16], out[16][16];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 32; j++) {
            a[i][j] = bf(rnd());
            b[i][j] = bf(rnd());
        }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            c[i][j] = rnd();
    trex_amx_emu_load(0, c, sizeof c[0]);
    trex_amx_emu_load(4, a, sizeof a[0]);
    trex_amx_emu_load(6, b, sizeof b[0]);
    trex_amx_emu_dpbf16ps(0, 4, 6);
    trex_amx_emu_store(0, out, sizeof out[0]);
    double worst = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            double s = c[m][n], mag = fabs(c[m][n]);
            for (int k = 0; k < 16; k++)
                for (int j = 0; j < 2; j++) {
                    const double p = (double)trex_bf16_to_f32(a[m][2 * k + j]) * trex_bf16_to_f32(b[k][2 * n + j]);
                    s += p;
                    mag += fabs(p);
                }
            const double err = fabs(out[m][n] - s) / (20 * 0x1p-24 * mag + 1e-30);
            worst = err > worst ? err : worst;
        }
    CHECK(worst <= 1.0, "16x16x32 product against fp64: worst error %.3f of the fp32 bound", worst);
    printf("TDPBF16PS 16x16x32 against fp64: worst error %.3f of the bound\n", worst);
    trex_amx_emu_release();
}

static void test_order(void)
{
    uint8_t cfg[64];
    config(cfg, 8, 16, 64);
    trex_amx_emu_loadconfig(cfg);
    uint16_t a[16][32], b[16][32];
    float out[16][16];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    /* row 0 of A: pairs (1, 1) at k = 0, 1; column 0 of B: k = 0 pair (2^24, 1), k = 1 pair (1, 1).
     * SDM order: even = 2^24 + 1 -> 2^24 (a tie, to even), odd = 1 + 1 = 2, C = 2^24 + 2.
     * One running sum over the products in k order would give 2^24 + 1 + 1 + 1 -> 2^24. */
    a[0][0] = a[0][1] = a[0][2] = a[0][3] = bf(1.0f);
    b[0][0] = bf(16777216.0f);
    b[0][1] = b[1][0] = b[1][1] = bf(1.0f);
    /* row 1: a subnormal bf16 (0x0001, 9.2e-41) times 2^100 reads as zero */
    a[1][0] = 0x0001;
    b[0][2] = bf(0x1p100f); /* column 1, even element of pair 0 */
    trex_amx_emu_zero(0);
    trex_amx_emu_load(4, a, sizeof a[0]);
    trex_amx_emu_load(6, b, sizeof b[0]);
    trex_amx_emu_dpbf16ps(0, 4, 6);
    trex_amx_emu_store(0, out, sizeof out[0]);
    CHECK(out[0][0] == 16777218.0f, "even and odd sums apart, then C: got %.1f, want 16777218", out[0][0]);
    CHECK(out[1][1] == 0.0f && out[1][0] == 0.0f, "a subnormal bf16 input reads as zero: got %g, %g",
          out[1][1], out[1][0]);
    CHECK(out[0][1] == 0x1p100f, "row 0 times column 1 is 2^100: got %g", out[0][1]);
    trex_amx_emu_release();
}

static void test_small_config(void)
{
    uint8_t cfg[64];
    /* C 4 rows x 8 floats (32 B); A 4 rows x 3 pairs (12 B); B 3 pair rows x 8 columns (32 B) */
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;
    const uint16_t cc = 32, ca = 12, cb = 32;
    memcpy(cfg + 16 + 0, &cc, 2);
    memcpy(cfg + 16 + 2 * 4, &ca, 2);
    memcpy(cfg + 16 + 2 * 6, &cb, 2);
    cfg[48 + 0] = 4;
    cfg[48 + 4] = 4;
    cfg[48 + 6] = 3;
    trex_amx_emu_loadconfig(cfg);
    uint16_t a[16][32], b[16][32];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 32; j++) {
            a[i][j] = bf((float)((i + j) % 5) - 2.0f);
            b[i][j] = bf((float)((2 * i + j) % 7) - 3.0f);
        }
    float out[16][16];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            out[i][j] = -7.0f;
    trex_amx_emu_zero(0);
    trex_amx_emu_load(4, a, sizeof a[0]);
    trex_amx_emu_load(6, b, sizeof b[0]);
    trex_amx_emu_dpbf16ps(0, 4, 6);
    trex_amx_emu_store(0, out, sizeof out[0]);
    int bad = 0, outside = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            if (m >= 4 || n >= 8) {
                outside += out[m][n] != -7.0f;
                continue;
            }
            float s = 0; /* small integers: exact in any order */
            for (int k = 0; k < 3; k++)
                for (int j = 0; j < 2; j++)
                    s += trex_bf16_to_f32(a[m][2 * k + j]) * trex_bf16_to_f32(b[k][2 * n + j]);
            bad += out[m][n] != s;
        }
    CHECK(bad == 0, "4x8x6 product from a small configuration: %d of 32 sums wrong", bad);
    CHECK(outside == 0, "the store wrote %d floats outside the configured 4 rows x 32 bytes", outside);
    /* a load of the small A tile then a store through a 64-byte configuration sees the zeroed rest */
    trex_amx_emu_load(4, a, sizeof a[0]);
    uint8_t big[64];
    config(big, 8, 16, 64);
    trex_amx_emu_loadconfig(big); /* LDTILECFG zeroes every tile */
    uint16_t back[16][32];
    memset(back, 0xff, sizeof back);
    trex_amx_emu_store(4, back, sizeof back[0]);
    int nonzero = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 32; j++)
            nonzero += back[i][j] != 0;
    CHECK(nonzero == 0, "LDTILECFG zeroes the tiles: %d elements left", nonzero);
    trex_amx_emu_release();
}

/* Whether fn, run in a child process, dies with SIGABRT (the emulator's stand-in for #UD and #GP). */
static int aborts(void (*fn)(void))
{
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        fn();
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return 0;
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void use_unconfigured(void)
{
    trex_amx_emu_release();
    trex_amx_emu_zero(0);
}

static void repeat_tile(void)
{
    uint8_t cfg[64];
    config(cfg, 8, 16, 64);
    trex_amx_emu_loadconfig(cfg);
    trex_amx_emu_dpbf16ps(0, 4, 4);
}

static void mismatched(void)
{
    uint8_t cfg[64];
    config(cfg, 8, 16, 64);
    cfg[48 + 6] = 8; /* B with 8 pair rows against A's 16 pairs */
    trex_amx_emu_loadconfig(cfg);
    trex_amx_emu_dpbf16ps(0, 4, 6);
}

static void bad_palette(void)
{
    uint8_t cfg[64];
    config(cfg, 8, 16, 64);
    cfg[0] = 2;
    trex_amx_emu_loadconfig(cfg);
}

static void ninth_tile(void)
{
    uint8_t cfg[64];
    config(cfg, 9, 16, 64);
    trex_amx_emu_loadconfig(cfg);
}

static void too_wide(void)
{
    uint8_t cfg[64];
    config(cfg, 8, 16, 128);
    trex_amx_emu_loadconfig(cfg);
}

static void unused_tile(void)
{
    uint8_t cfg[64];
    config(cfg, 4, 16, 64); /* tiles 4..7 unused */
    trex_amx_emu_loadconfig(cfg);
    float x[16][16] = {{0}};
    trex_amx_emu_load(5, x, sizeof x[0]);
}

static void no_fault(void)
{
    uint8_t cfg[64];
    config(cfg, 8, 16, 64);
    trex_amx_emu_loadconfig(cfg);
    trex_amx_emu_zero(0);
    trex_amx_emu_zero(4);
    trex_amx_emu_zero(6);
    trex_amx_emu_dpbf16ps(0, 4, 6);
}

static void test_faults(void)
{
    CHECK(!aborts(no_fault), "a valid sequence runs to the end");
    CHECK(aborts(use_unconfigured), "a tile instruction without a configuration aborts");
    CHECK(aborts(repeat_tile), "TDPBF16PS with a repeated tile aborts");
    CHECK(aborts(mismatched), "TDPBF16PS on shapes that do not match aborts");
    CHECK(aborts(bad_palette), "a palette other than 0 and 1 aborts");
    CHECK(aborts(ninth_tile), "configuring a ninth tile aborts");
    CHECK(aborts(too_wide), "a tile wider than 64 bytes aborts");
    CHECK(aborts(unused_tile), "loading a tile the configuration leaves unused aborts");
}

static void zero0(void)
{
    trex_amx_emu_zero(0);
}

/* A thread of its own: it has no configuration until it loads one (aborts forks from this thread). */
static void *fresh_thread(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)aborts(zero0);
}

static void *release_thread(void *arg)
{
    (void)arg;
    uint8_t cfg[64];
    config(cfg, 8, 16, 64);
    trex_amx_emu_loadconfig(cfg);
    trex_amx_emu_release();
    return NULL;
}

static void test_threads(void)
{
    uint8_t cfg[64];
    config(cfg, 8, 16, 64);
    trex_amx_emu_loadconfig(cfg);
    pthread_t th;
    void *res = NULL;
    CHECK(pthread_create(&th, NULL, fresh_thread, NULL) == 0 && pthread_join(th, &res) == 0, "thread");
    CHECK(res == (void *)1, "a thread that loaded no configuration has no tiles");
    CHECK(pthread_create(&th, NULL, release_thread, NULL) == 0 && pthread_join(th, NULL) == 0, "thread");
    CHECK(!aborts(zero0), "a release on another thread leaves this thread's configuration");
    trex_amx_emu_release();
}

int main(void)
{
    test_product();
    test_order();
    test_small_config();
    test_faults();
    test_threads();
    return check_summary();
}
#endif
