/* tests/test_kernels.c — the kernel dispatch and the bf16 GEMM leaves (kernels/dispatch.c,
 * kernels/ref/gemm_blocked.c, kernels/ref/bf16.c, kernels/x86/...).
 *
 * 1. Dispatch: the detected level follows from the features; tables for each cap never exceed it;
 *    TREX_ISA caps the level and a bad value is an error, TREX_VERBOSE logs the choice (both in a child
 *    process, since the table is chosen once per process).
 * 2. fp32 <-> bf16 bulk conversion of every level against the scalar core conversion, bit for bit
 *    (ties, subnormals, infinities, NaNs, random bit patterns).
 * 3. Packing: every level's four packers against the reference packers, bit for bit, both source
 *    layouts (k contiguous / rows contiguous), all row counts 1..32, awkward k counts.
 * 4. Micro-kernels of every level against an fp64 sum over the packed panels.
 * 5. The whole GEMM of every level available here, bf16 and fp32 inputs, all four transposes, alpha and
 *    beta (beta 0 over NaN), padded leading dimensions (the padding must stay untouched), on awkward
 *    shapes (1, primes, non-multiples of 32 and of the 256 blocks, K not a multiple of 2 or 32, K past
 *    the 512 block, empty), against an fp64 product of the bf16-rounded inputs. The bound is fp32
 *    accumulation: |err| <= 2 (K + 4) 2^-24 (|alpha| sum_k |a_k b_k| + |beta c|) + 1e-30.
 * 6. Grouped GEMM: each problem against the fp64 product and bit-identical to a call of its own; a
 *    problem large enough to be cut into chunks.
 * 7. Determinism: bit-identical C with no pool and with 1, 2 and 3 threads, for every level.
 * 8. C streamed (non-temporal stores: written once, any size, or summed over K slices with beta 1, over
 *    8 MiB), bit-identical to the same product stored normally (rows not 64-byte aligned).
 * Calls alternate between a shared workspace (reused across sizes) and none (allocated per call).
 * A level this machine cannot run is skipped with a line saying so. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/dispatch.h"
#include "kernels/gemm_panels.h"
#include "kernels/kernels.h"
#include "trex/pool.h"
#include "trex/tensor.h"

/* ---- helpers ------------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *st)
{
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), never tiny (so no subnormal products). */
static float rnd(uint64_t *st)
{
    double u = ((double)(rng_next(st) >> 11) + 0.5) / 9007199254740992.0;
    double v = 2.0 * u - 1.0;
    if (fabs(v) < 1e-3)
        v = v < 0 ? -1e-3 : 1e-3;
    return (float)v;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The levels this machine can run, lowest first. */
static int levels(const trex_kernel_table *out[TREX_ISA_COUNT])
{
    const trex_cpu_features *f = trex_cpu_features_get();
    int n = 0;
    for (int i = 0; i < TREX_ISA_COUNT; i++) {
        if ((trex_isa)i > f->best) {
            printf("skip: level %s is not available on this machine (best: %s)\n",
                   trex_isa_name((trex_isa)i), trex_isa_name(f->best));
            continue;
        }
        out[n++] = trex_kernels_table_for((trex_isa)i);
    }
    return n;
}

/* ---- 1. dispatch ----------------------------------------------------------------------------------- */

/* Runs this program as a child with an environment prefix and a mode (--child, --child-f32b); returns
 * its exit status, output in buf. */
static int run_child(const char *env, const char *self, const char *mode, char *buf, size_t size)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env %s '%s' %s 2>&1", env, self, mode);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = fread(buf, 1, size - 1, p);
    buf[n] = '\0';
    int st = pclose(p);
    return st;
}

static int child_main(void)
{
    trex_err err = {0};
    trex_code rc = trex_kernels_init(&err);
    if (rc != TREX_OK) {
        printf("child: error: %s\n", err.msg);
        return 3;
    }
    printf("child: level %s\n", trex_isa_name(trex_kernels_isa()));
    return 0;
}

/* One bf16 x fp32 product on the level TREX_ISA gives: 1.5 x 2 + 2 x 0.25 = 3.5, or the abort of a level
 * without the product. */
static int child_f32b(void)
{
    const uint16_t A[4] = {trex_f32_to_bf16(1.5f), trex_f32_to_bf16(1.5f), trex_f32_to_bf16(2.0f),
                           trex_f32_to_bf16(2.0f)};
    const float B[2] = {2.0f, 0.25f};
    float C[1] = {0};
    trex_gemm_bf16_f32b(NULL, NULL, 1, 1, 2, 1.0f, A, 4, B, 2, 0.0f, C, 1);
    printf("child: f32b %g\n", (double)C[0]);
    return 0;
}

static void test_dispatch(const char *self)
{
    const trex_cpu_features *f = trex_cpu_features_get();
    trex_err err = {0};
    /* The suite may run under any TREX_ISA; only a bad value would fail here. */
    CHECK(trex_kernels_init(&err) == TREX_OK, "trex_kernels_init: %s", err.msg);
    printf("detected: best level %s, active %s; avx512_bf16=%d amx_tile=%d amx_bf16=%d xcr0=0x%llx "
           "amx permission=%d%s\n",
           trex_isa_name(f->best), trex_isa_name(trex_kernels_isa()), f->cpu_avx512bf16,
           f->cpu_amx_tile, f->cpu_amx_bf16, (unsigned long long)f->xcr0, f->amx_perm,
           f->amx_emulated ? " (AMX emulated: an AMX_EMU build)" : "");
    if (f->best >= TREX_ISA_AVX2)
        CHECK(f->cpu_avx2 && f->cpu_fma && f->os_avx, "avx2 level needs AVX2, FMA and OS AVX state");
    if (f->best >= TREX_ISA_AVX512F)
        CHECK(f->cpu_avx512f && f->cpu_avx512bw && f->cpu_avx512vl && f->os_avx512,
              "avx512f level needs AVX-512 F/BW/VL and OS ZMM state");
    if (f->best >= TREX_ISA_AVX512)
        CHECK(f->cpu_avx512bf16, "avx512 level needs AVX512_BF16 as well");
    if (f->best >= TREX_ISA_AMX)
        CHECK(f->amx_emulated || (f->cpu_amx_tile && f->cpu_amx_bf16 && f->os_amx && f->amx_perm),
              "amx level needs AMX-TILE/BF16, OS tile state and the permission (or an AMX_EMU build)");
    CHECK(trex_kernels_isa() <= f->best, "active level above the best available");
    for (int i = 0; i < TREX_ISA_COUNT; i++) {
        const trex_kernel_table *t = trex_kernels_table_for((trex_isa)i);
        CHECK(t && t->isa <= (trex_isa)i && t->isa <= f->best, "table for cap %d has level %d", i,
              t ? (int)t->isa : -1);
        CHECK(t->gemm_ukr && t->pack_a_bf16 && t->pack_a_f32 && t->pack_b_bf16 && t->pack_b_f32 &&
                  t->cvt_f32_bf16 && t->cvt_bf16_f32,
              "table %d has every GEMM entry", i);
        CHECK(t->isa == (i < (int)f->best ? (trex_isa)i : f->best), "cap %d gives level %d", i,
              (int)t->isa);
    }
    trex_isa parsed;
    CHECK(trex_isa_parse("amx", &parsed) && parsed == TREX_ISA_AMX, "parse amx");
    CHECK(!trex_isa_parse("AVX512", &parsed) && !trex_isa_parse("", &parsed), "bad names rejected");

    /* TREX_ISA caps, TREX_VERBOSE logs, a bad TREX_ISA is an error: in child processes. */
    char out[8192];
    for (int i = 0; i < TREX_ISA_COUNT; i++) {
        char env[128], want[64];
        snprintf(env, sizeof env, "TREX_ISA=%s TREX_VERBOSE=1", trex_isa_name((trex_isa)i));
        int st = run_child(env, self, "--child", out, sizeof out);
        trex_isa expect = (trex_isa)i < f->best ? (trex_isa)i : f->best;
        snprintf(want, sizeof want, "child: level %s\n", trex_isa_name(expect));
        CHECK(st == 0 && strstr(out, want), "TREX_ISA=%s: status %d, output:\n%s",
              trex_isa_name((trex_isa)i), st, out);
        CHECK(strstr(out, "trex: kernels: level") && strstr(out, "gemm_bf16 micro-kernel"),
              "TREX_VERBOSE=1 logs the choice; output:\n%s", out);
    }
    int st = run_child("TREX_ISA=sse9 TREX_VERBOSE=0", self, "--child", out, sizeof out);
    CHECK(st != 0 && strstr(out, "TREX_ISA='sse9'") && strstr(out, "ref, avx2, avx512f, avx512 or amx"),
          "bad TREX_ISA is an error that names the fix; status %d, output:\n%s", st, out);
    st = run_child("-u TREX_ISA TREX_VERBOSE=0", self, "--child", out, sizeof out);
    CHECK(st == 0 && !strstr(out, "trex: kernels:"), "quiet without TREX_VERBOSE; output:\n%s", out);
    /* trex_gemm_bf16_f32b runs where the level has its micro-kernel and stops with a message elsewhere */
    for (int i = 0; i < TREX_ISA_COUNT; i++) {
        char env[128];
        snprintf(env, sizeof env, "TREX_ISA=%s TREX_VERBOSE=0", trex_isa_name((trex_isa)i));
        const trex_kernel_table *t = trex_kernels_table_for((trex_isa)i);
        st = run_child(env, self, "--child-f32b", out, sizeof out);
        if (t->gemm_ukr_f32b)
            CHECK(st == 0 && strstr(out, "child: f32b 3.5\n"),
                  "TREX_ISA=%s: bf16 x fp32 product; status %d, output:\n%s", trex_isa_name((trex_isa)i), st, out);
        else
            CHECK(st != 0 && strstr(out, "multiplies bf16 values only"),
                  "TREX_ISA=%s: bf16 x fp32 product refused with a message; status %d, output:\n%s",
                  trex_isa_name((trex_isa)i), st, out);
    }
}

/* ---- 2. conversion ---------------------------------------------------------------------------------- */

static void test_convert(const trex_kernel_table *t)
{
    enum { N = 4099 };
    float *src = xmalloc(N * sizeof *src), *back = xmalloc(N * sizeof *back);
    uint16_t *dst = xmalloc(N * sizeof *dst), *h = xmalloc(N * sizeof *h);
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u,
                                0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f817fffu, 0x7f7fffffu,
                                0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                0x7f800001u, 0xff810000u, 0x7fffffffu, 0x00008000u, 0x00018000u};
    const int ns = (int)(sizeof special / sizeof special[0]);
    uint64_t st = 7;
    for (int i = 0; i < N; i++)
        src[i] = bits_f32(i < ns ? special[i] : (uint32_t)rng_next(&st));
    t->cvt_f32_bf16(dst, src, N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += dst[i] != trex_f32_to_bf16(src[i]);
    CHECK(bad == 0, "%s: f32->bf16 differs from trex_f32_to_bf16 on %d of %d values", t->cvt_name,
          bad, N);
    for (int i = 0; i < N; i++)
        h[i] = (uint16_t)rng_next(&st);
    t->cvt_bf16_f32(back, h, N);
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += f32_bits(back[i]) != f32_bits(trex_bf16_to_f32(h[i]));
    CHECK(bad == 0, "%s: bf16->f32 differs on %d values", t->cvt_name, bad);
    /* Every length below 40 (tails of the vector loops), sentinel past the end. */
    for (int n = 0; n < 40; n++) {
        dst[n] = 0xdead;
        t->cvt_f32_bf16(dst, src + 20, n);
        CHECK(dst[n] == 0xdead, "%s: f32->bf16 of %d values wrote past the end", t->cvt_name, n);
        for (int i = 0; i < n; i++)
            CHECK(dst[i] == trex_f32_to_bf16(src[20 + i]), "%s: n=%d i=%d", t->cvt_name, n, i);
    }
    free(src);
    free(back);
    free(dst);
    free(h);
}

/* ---- 3. packing ------------------------------------------------------------------------------------- */

static void test_pack(const trex_kernel_table *t, const trex_kernel_table *ref)
{
    enum { LD = 1100, KMAX = 1056 };
    uint64_t st = 11;
    float *f = xmalloc((size_t)LD * KMAX * sizeof *f);
    uint16_t *b = xmalloc((size_t)LD * KMAX * sizeof *b);
    /* Every 23rd value a special bit pattern (ties, NaNs, infinities, subnormals, the largest finite
     * values), so that the packers' fp32 rounding is compared with the reference on all of them. */
    const uint32_t special[] = {0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x3f808000u,
                                0x3f818000u, 0x3f80ffffu, 0x3f817fffu, 0x7f7fffffu, 0xff7fffffu,
                                0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                                0xff810000u, 0x7fffffffu, 0x00008000u, 0x007fffffu};
    const size_t ns = sizeof special / sizeof special[0];
    for (size_t i = 0; i < (size_t)LD * KMAX; i++) {
        f[i] = i % 23 == 5 ? bits_f32(special[(i / 23) % ns]) : rnd(&st) * 3.0f;
        b[i] = trex_f32_to_bf16(f[i]);
    }
    uint16_t *got = xmalloc(32 * KMAX * sizeof *got), *want = xmalloc(32 * KMAX * sizeof *want);
    const int64_t kcs[] = {1, 2, 3, 31, 32, 33, 64, 100, 511, 512, 1000};
    int bad = 0, cases = 0;
    for (int which = 0; which < 4; which++) {
        trex_pack_fn fn = which == 0 ? t->pack_a_bf16 : which == 1 ? t->pack_a_f32
                          : which == 2 ? t->pack_b_bf16 : t->pack_b_f32;
        trex_pack_fn rf = which == 0 ? ref->pack_a_bf16 : which == 1 ? ref->pack_a_f32
                          : which == 2 ? ref->pack_b_bf16 : ref->pack_b_f32;
        const void *src = which % 2 ? (const void *)f : (const void *)b;
        for (int trans = 0; trans < 2; trans++)
            for (int64_t rows = 1; rows <= 32; rows++)
                for (size_t ki = 0; ki < sizeof kcs / sizeof kcs[0]; ki++) {
                    const int64_t kc = kcs[ki], kcp = (kc + 31) / 32 * 32;
                    const int64_t rs = trans ? 1 : LD, ks = trans ? LD : 1;
                    memset(got, 0xab, 32 * kcp * sizeof *got);
                    fn(got, src, rs, ks, rows, kc, kcp);
                    rf(want, src, rs, ks, rows, kc, kcp);
                    cases++;
                    if (memcmp(got, want, 32 * kcp * sizeof *got) != 0) {
                        if (bad++ < 5)
                            fprintf(stderr, "pack %s #%d trans=%d rows=%lld kc=%lld differs\n",
                                    t->pack_name, which, trans, (long long)rows, (long long)kc);
                    }
                }
    }
    CHECK(bad == 0, "%s: %d of %d pack cases differ from the reference", t->pack_name, bad, cases);
    free(f);
    free(b);
    free(got);
    free(want);
}

/* ---- 4. micro-kernel -------------------------------------------------------------------------------- */

/* gemm_tile_t: a 32x32 block's rows x cols corner transposed into a wider C, bit for bit (random words,
 * NaN patterns among them), nothing written outside the corner's transpose. */
static void test_tile_t(const trex_kernel_table *t)
{
    enum { LDD = 45 };
    const int64_t sizes[] = {0, 1, 5, 15, 16, 17, 31, 32};
    uint32_t blk[32 * 32], dst[32 * LDD];
    uint64_t st = 77;
    int64_t bad = 0, runs = 0;
    for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++)
        for (size_t b = 0; b < sizeof sizes / sizeof sizes[0]; b++) {
            const int64_t rows = sizes[a], cols = sizes[b];
            for (int i = 0; i < 32 * 32; i++)
                blk[i] = (uint32_t)rng_next(&st);
            memset(dst, 0xa5, sizeof dst);
            t->gemm_tile_t((float *)(void *)dst, LDD, (const float *)(const void *)blk, rows, cols);
            for (int64_t j = 0; j < 32; j++)
                for (int64_t i = 0; i < LDD; i++) {
                    const uint32_t want = j < cols && i < rows ? blk[i * 32 + j] : 0xa5a5a5a5u;
                    bad += dst[j * LDD + i] != want;
                }
            runs++;
        }
    CHECK(bad == 0, "%s: %" PRId64 " corners of a block transposed bit for bit, nothing else written (%" PRId64
                    " wrong words)", t->gemm_name, runs, bad);
}

/* Element (r, k) of an A-format panel (steps of [32 rows][32 k]). */
static uint16_t panel_a(const uint16_t *ap, int64_t r, int64_t k)
{
    return ap[(k / 32) * 1024 + r * 32 + k % 32];
}

static void test_ukr(const trex_kernel_table *t)
{
    uint64_t st = 5;
    const int64_t kcs[] = {32, 64, 96, 512, 544, 1056};
    for (size_t ki = 0; ki < sizeof kcs / sizeof kcs[0]; ki++) {
        const int64_t kc = kcs[ki];
        uint16_t *ap = xmalloc(32 * kc * sizeof *ap), *bp = xmalloc(32 * kc * sizeof *bp);
        for (int64_t i = 0; i < 32 * kc; i++) {
            ap[i] = trex_f32_to_bf16(rnd(&st));
            bp[i] = trex_f32_to_bf16(rnd(&st));
        }
        enum { LDC = 48 }; /* a multiple of 16: the streaming path is taken where the ISA has one */
        float c[32 * LDC] __attribute__((aligned(64))), c0[32 * LDC];
        for (int i = 0; i < 32 * LDC; i++)
            c0[i] = rnd(&st);
        /* rows: all 32 (0), or the first `rows` in use, which a level may compute alone (the others
         * then either untouched or right) */
        const int row_cases[] = {0, 1, 15, 16, 17, 31};
        for (int ri = 0; ri < (int)(sizeof row_cases / sizeof row_cases[0]); ri++) {
            for (int acc = 0; acc < 2; acc++) {
                const int used = row_cases[ri] ? row_cases[ri] : 32;
                memcpy(c, c0, sizeof c);
                if (t->gemm_begin)
                    t->gemm_begin();
                const trex_ukr_c io = {.out = c, .ldo = LDC, .in = c, .ldi = LDC, .rows = row_cases[ri]};
                t->gemm_ukr(kc, ap, bp, &io, acc ? TREX_UKR_ACCUMULATE : TREX_UKR_STREAM);
                if (t->gemm_end)
                    t->gemm_end();
                double worst = 0;
                int bad = 0;
                for (int i = 0; i < 32; i++)
                    for (int j = 0; j < LDC; j++) {
                        const bool same = f32_bits(c[i * LDC + j]) == f32_bits(c0[i * LDC + j]);
                        if (j >= 32) {
                            bad += !same;
                            continue;
                        }
                        if (i >= used && same)
                            continue; /* a row not in use, left alone */
                        double s = acc ? c0[i * LDC + j] : 0.0, sa = fabs(s);
                        for (int64_t k = 0; k < kc; k++) {
                            double a = trex_bf16_to_f32(panel_a(ap, i, k));
                            double b = trex_bf16_to_f32(bp[(k / 2) * 64 + j * 2 + k % 2]);
                            s += a * b;
                            sa += fabs(a * b);
                        }
                        double err = fabs(c[i * LDC + j] - s), tol = 2.0 * (kc + 4) * 0x1p-24 * sa;
                        worst = fmax(worst, err / tol);
                        bad += err > tol;
                    }
                CHECK(bad == 0,
                      "%s micro-kernel kc=%lld acc=%d rows=%d: %d bad elements (worst err/tol %.3g)",
                      t->gemm_name, (long long)kc, acc, row_cases[ri], bad, worst);
            }
        }
        free(ap);
        free(bp);
    }
}

/* The avx2 and avx512f micro-kernels do the same fp32 FMAs on the same values in the same order per
 * element (even k, then odd k, k ascending): the same bits, which a change of either's order breaks. */
static void test_ukr_fma_levels(void)
{
    const trex_kernel_table *a = trex_kernels_table_for(TREX_ISA_AVX2),
                            *b = trex_kernels_table_for(TREX_ISA_AVX512F);
    if (a->isa != TREX_ISA_AVX2 || b->isa != TREX_ISA_AVX512F) {
        printf("skip: the avx2 and avx512f micro-kernels are not both on this machine\n");
        return;
    }
    uint64_t st = 9;
    enum { KMAX = 1056, LDC = 48 };
    uint16_t *ap = xmalloc(32 * KMAX * sizeof *ap), *bp = xmalloc(32 * KMAX * sizeof *bp);
    for (int64_t i = 0; i < 32 * KMAX; i++) {
        ap[i] = trex_f32_to_bf16(rnd(&st) * (i % 97 == 3 ? 1e-30f : 1.0f));
        bp[i] = trex_f32_to_bf16(rnd(&st));
    }
    float c0[32 * LDC], ca[32 * LDC], cb[32 * LDC];
    for (int i = 0; i < 32 * LDC; i++)
        c0[i] = rnd(&st);
    const int64_t kcs[] = {32, 96, 544, 1056};
    int bad = 0, runs = 0;
    for (size_t ki = 0; ki < sizeof kcs / sizeof kcs[0]; ki++)
        for (int acc = 0; acc < 2; acc++) {
            const unsigned fl = acc ? TREX_UKR_ACCUMULATE : 0;
            memcpy(ca, c0, sizeof ca);
            memcpy(cb, c0, sizeof cb);
            const trex_ukr_c ia = {.out = ca, .ldo = LDC, .in = ca, .ldi = LDC};
            const trex_ukr_c ib = {.out = cb, .ldo = LDC, .in = cb, .ldi = LDC};
            a->gemm_ukr(kcs[ki], ap, bp, &ia, fl);
            b->gemm_ukr(kcs[ki], ap, bp, &ib, fl);
            if (b->gemm_end)
                b->gemm_end();
            bad += memcmp(ca, cb, sizeof ca) != 0;
            runs++;
        }
    CHECK(bad == 0, "avx2 and avx512f micro-kernels: %d of %d runs not bit-identical", bad, runs);
    free(ap);
    free(bp);
}

/* ---- 5. GEMM against fp64 ------------------------------------------------------------------------- */

typedef struct mats {
    int64_t M, N, K, lda, ldb, ldc;
    bool ta, tb;
    float *Af, *Bf;       /* fp32 sources */
    uint16_t *Ab, *Bb;    /* their bf16 roundings */
    float *C0;            /* C before the call */
    double *S, *SA;       /* mats_gold */
} mats;

static mats mats_make(int64_t M, int64_t N, int64_t K, bool ta, bool tb, uint64_t seed)
{
    mats m = {.M = M, .N = N, .K = K, .ta = ta, .tb = tb};
    m.lda = (ta ? M : K) + 3;
    m.ldb = (tb ? K : N) + 5;
    m.ldc = N + 2;
    const int64_t na = (ta ? K : M) * m.lda, nb = (tb ? N : K) * m.ldb, nc = M * m.ldc;
    m.Af = xmalloc((size_t)na * sizeof *m.Af);
    m.Bf = xmalloc((size_t)nb * sizeof *m.Bf);
    m.Ab = xmalloc((size_t)na * sizeof *m.Ab);
    m.Bb = xmalloc((size_t)nb * sizeof *m.Bb);
    m.C0 = xmalloc((size_t)nc * sizeof *m.C0);
    uint64_t st = seed;
    for (int64_t i = 0; i < na; i++) {
        m.Af[i] = rnd(&st);
        m.Ab[i] = trex_f32_to_bf16(m.Af[i]);
    }
    for (int64_t i = 0; i < nb; i++) {
        m.Bf[i] = rnd(&st);
        m.Bb[i] = trex_f32_to_bf16(m.Bf[i]);
    }
    for (int64_t i = 0; i < nc; i++)
        m.C0[i] = rnd(&st);
    return m;
}

static void mats_free(mats *m)
{
    free(m->Af);
    free(m->Bf);
    free(m->Ab);
    free(m->Bb);
    free(m->C0);
    free(m->S);
    free(m->SA);
}

/* The exact products: S = sum_k a_k b_k and SA = sum_k |a_k b_k| in fp64, for the bound. */
static void mats_gold(mats *m)
{
    if (m->S)
        return;
    m->S = xmalloc((size_t)(m->M * m->N) * sizeof *m->S);
    m->SA = xmalloc((size_t)(m->M * m->N) * sizeof *m->SA);
    for (int64_t i = 0; i < m->M; i++)
        for (int64_t j = 0; j < m->N; j++) {
            double s = 0, sa = 0;
            for (int64_t k = 0; k < m->K; k++) {
                uint16_t a = m->ta ? m->Ab[k * m->lda + i] : m->Ab[i * m->lda + k];
                uint16_t b = m->tb ? m->Bb[j * m->ldb + k] : m->Bb[k * m->ldb + j];
                double p = (double)trex_bf16_to_f32(a) * trex_bf16_to_f32(b);
                s += p;
                sa += fabs(p);
            }
            m->S[i * m->N + j] = s;
            m->SA[i * m->N + j] = sa;
        }
}

/* Counts elements of C (rows r0..r1) outside the fp32-accumulation bound, and changed padding. */
static int64_t check_rows(mats *m, int64_t r0, int64_t r1, const float *C, float alpha, float beta,
                          bool nan_c0, double *worst)
{
    mats_gold(m);
    int64_t bad = 0;
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j = 0; j < m->ldc; j++) {
            const float got = C[i * m->ldc + j], c0 = m->C0[i * m->ldc + j];
            if (j >= m->N) {
                bad += f32_bits(got) != f32_bits(c0);
                continue;
            }
            const double s = m->S[i * m->N + j], sa = m->SA[i * m->N + j];
            const double old = beta == 0.0f || nan_c0 ? 0.0 : (double)beta * c0;
            const double want = (double)alpha * s + old;
            const double tol =
                2.0 * (m->K + 4) * 0x1p-24 * (fabs((double)alpha) * sa + fabs(old)) + 1e-30;
            const double err = fabs((double)got - want);
            if (!(err <= tol))
                bad++;
            else
                *worst = fmax(*worst, err / tol);
        }
    return bad;
}

static int64_t check_c(mats *m, const float *C, float alpha, float beta, bool nan_c0, double *worst)
{
    return check_rows(m, 0, m->M, C, alpha, beta, nan_c0, worst);
}

/* One workspace shared by every call of the test that does not pass its own (it grows and shrinks
 * never; calls of every size reuse it), and NULL (per-call allocation) for every other call. */
static trex_gemm_ws *shared_ws;
static int ws_toggle;

static void run_one(const trex_kernel_table *t, trex_pool *pool, const mats *m, bool f32, float alpha,
                    float beta, bool nan_c0, float *C)
{
    memcpy(C, m->C0, (size_t)(m->M * m->ldc) * sizeof *C);
    if (nan_c0)
        for (int64_t i = 0; i < m->M; i++)
            for (int64_t j = 0; j < m->N; j++)
                C[i * m->ldc + j] = NAN;
    const trex_gemm_problem p = {m->M, m->N, m->K, f32 ? (const void *)m->Af : (const void *)m->Ab,
                                 m->lda, f32 ? (const void *)m->Bf : (const void *)m->Bb, m->ldb, C,
                                 m->ldc, NULL, 0};
    trex_gemm_grouped_with(t, pool, (ws_toggle++ & 1) ? shared_ws : NULL, f32 ? TREX_F32 : TREX_BF16,
                           m->ta, m->tb, alpha, beta, &p, 1);
}

static void test_gemm(const trex_kernel_table *t, trex_pool *pool)
{
    const int64_t shapes[][3] = {{1, 1, 1},     {1, 17, 3},    {2, 1, 2},      {5, 3, 0},
                                 {0, 4, 3},     {4, 0, 3},     {31, 33, 65},   {37, 29, 41},
                                 {32, 32, 32},  {64, 96, 64},  {100, 7, 513},  {13, 300, 33},
                                 {257, 263, 97}, {300, 270, 1100}, {45, 70, 96},  {100, 33, 128},
                                 {1, 5, 32}};
    const float ab[][2] = {{1, 0}, {1, 1}, {0.5f, -2}, {2, 0}, {-1, 0.25f}};
    int64_t bad_total = 0, runs = 0;
    double worst = 0;
    uint64_t seed = 100;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tr = 0; tr < 4; tr++) {
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            mats m = mats_make(M, N, K, tr & 1, tr & 2, seed++);
            float *C = xmalloc((size_t)(M * m.ldc) * sizeof *C);
            const bool big = M * N * K > 2000000;
            for (int f32 = 0; f32 < 2; f32++)
                for (size_t a = 0; a < sizeof ab / sizeof ab[0]; a++) {
                    if (big && a >= 2 && f32)
                        continue; /* the largest shape: the main modes only */
                    const float alpha = ab[a][0], beta = ab[a][1];
                    const bool nan_c0 = beta == 0.0f && a == 3;
                    run_one(t, pool, &m, f32, alpha, beta, nan_c0, C);
                    int64_t bad = check_c(&m, C, alpha, beta, nan_c0, &worst);
                    runs++;
                    if (bad && bad_total < 1000)
                        fprintf(stderr,
                                "%s: M=%lld N=%lld K=%lld ta=%d tb=%d %s alpha=%g beta=%g: %lld bad\n",
                                t->gemm_name, (long long)M, (long long)N, (long long)K, tr & 1,
                                (tr & 2) >> 1, f32 ? "f32" : "bf16", alpha, beta, (long long)bad);
                    bad_total += bad;
                }
            free(C);
            mats_free(&m);
        }
    CHECK(bad_total == 0, "%s/%s: %lld elements outside the bound over %lld runs", t->gemm_name,
          t->pack_name, (long long)bad_total, (long long)runs);
    printf("%s/%s: %lld GEMM runs, worst error %.3f of the bound\n", t->gemm_name, t->pack_name,
           (long long)runs, worst);
}

/* ---- 6. grouped --------------------------------------------------------------------------------- */

static void test_grouped(const trex_kernel_table *t, trex_pool *pool)
{
    /* Experts of different sizes (one empty), same N and K: forward-like y_e = x_e W_e^T. */
    enum { G = 7 };
    const int64_t Ms[G] = {45, 0, 1, 300, 33, 128, 7}, N = 70, K = 130;
    mats m[G];
    trex_gemm_problem p[G];
    float *C[G];
    for (int g = 0; g < G; g++) {
        m[g] = mats_make(Ms[g], N, K, false, true, 900 + g);
        C[g] = xmalloc((size_t)(Ms[g] * m[g].ldc + 1) * sizeof *C[g]);
        memcpy(C[g], m[g].C0, (size_t)(Ms[g] * m[g].ldc) * sizeof *C[g]);
        p[g] = (trex_gemm_problem){Ms[g], N, K, m[g].Ab, m[g].lda, m[g].Bb, m[g].ldb, C[g], m[g].ldc, NULL, 0};
    }
    trex_gemm_grouped_with(t, pool, shared_ws, TREX_BF16, false, true, 1.0f, 1.0f, p, G);
    double worst = 0;
    int64_t bad = 0, diff = 0;
    for (int g = 0; g < G; g++) {
        bad += check_c(&m[g], C[g], 1.0f, 1.0f, false, &worst);
        float *one = xmalloc((size_t)(Ms[g] * m[g].ldc + 1) * sizeof *one);
        run_one(t, pool, &m[g], false, 1.0f, 1.0f, false, one);
        diff += memcmp(one, C[g], (size_t)(Ms[g] * m[g].ldc) * sizeof *one) != 0;
        free(one);
    }
    CHECK(bad == 0, "%s grouped: %lld bad elements", t->gemm_name, (long long)bad);
    CHECK(diff == 0, "%s grouped: %lld problems differ from their own call", t->gemm_name,
          (long long)diff);
    for (int g = 0; g < G; g++) {
        free(C[g]);
        mats_free(&m[g]);
    }

    /* Backward-like dW_e = dy_e^T x_e: K (tokens) differs per problem, fp32 inputs, alpha/beta. */
    const int64_t Ks[4] = {3, 0, 257, 64};
    mats w[4];
    trex_gemm_problem q[4];
    float *D[4];
    for (int g = 0; g < 4; g++) {
        w[g] = mats_make(40, 33, Ks[g], true, false, 950 + g);
        D[g] = xmalloc((size_t)(40 * w[g].ldc) * sizeof *D[g]);
        memcpy(D[g], w[g].C0, (size_t)(40 * w[g].ldc) * sizeof *D[g]);
        q[g] = (trex_gemm_problem){40, 33, Ks[g], w[g].Af, w[g].lda, w[g].Bf, w[g].ldb, D[g], w[g].ldc, NULL, 0};
    }
    trex_gemm_grouped_with(t, pool, NULL, TREX_F32, true, false, 0.5f, 1.0f, q, 4);
    bad = 0;
    for (int g = 0; g < 4; g++)
        bad += check_c(&w[g], D[g], 0.5f, 1.0f, false, &worst);
    CHECK(bad == 0, "%s grouped (ta, fp32, K per problem): %lld bad elements", t->gemm_name,
          (long long)bad);
    for (int g = 0; g < 4; g++) {
        free(D[g]);
        mats_free(&w[g]);
    }
}

/* A problem cut into chunks along N (more than 12 MiB of packed B: chunks of 1536 columns at K = 4096),
 * with A blocks over 1 MiB (256 rows at long K, packed slice by slice): against fp64 on a sample of
 * columns on both sides of the chunk boundary. */
static void test_chunked(const trex_kernel_table *t, trex_pool *pool)
{
    const int64_t M = 300, N = 1600, K = 4096;
    mats m = mats_make(M, N, K, false, true, 77);
    float *C = xmalloc((size_t)(M * m.ldc) * sizeof *C);
    run_one(t, pool, &m, false, 1.0f, 0.0f, false, C);
    const int64_t cols[] = {0, 1, 31, 32, 255, 256, 700, 1023, 1534, 1535, 1536, 1537, 1567, 1568, 1599};
    int64_t bad = 0;
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
        for (int64_t i = 0; i < M; i++) {
            const int64_t j = cols[c];
            double s = 0, sa = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)trex_bf16_to_f32(m.Ab[i * m.lda + k]) *
                           trex_bf16_to_f32(m.Bb[j * m.ldb + k]);
                s += p;
                sa += fabs(p);
            }
            bad += !(fabs(C[i * m.ldc + j] - s) <= 2.0 * (K + 4) * 0x1p-24 * sa);
        }
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < m.ldc; j++)
            bad += f32_bits(C[i * m.ldc + j]) != f32_bits(m.C0[i * m.ldc + j]);
    CHECK(bad == 0, "%s chunked (N=%lld K=%lld): %lld bad elements", t->gemm_name, (long long)N,
          (long long)K, (long long)bad);
    free(C);
    mats_free(&m);
}

/* A product cut along K at multiples of 32 into calls chained with beta 1 (the LM head's d hn over
 * vocabulary blocks) has the bits of one call: the fp32 sums are exact in C between calls. Also with
 * each piece's B pre-packed, and with A stored [K, M] (packed step by step across its panels). The
 * framework's own K slices are checked the same way: one call of K = 1 100 is summed in slices of 384,
 * 384 and 352 k through the thread's buffer, one of K = 2 100 in five slices with its A block (over
 * 1 MiB) packed slice by slice, and with 64 rows of C (one row of blocks, cut into column groups on two
 * or more threads) the second column group packs its own A slices; each cut call is at most 512 k,
 * one slice with its A block packed whole. Two column blocks, edge tiles, bf16 and fp32 sources, C from
 * zero (beta 0) and from C (beta 1). */
static void test_ksplit(const trex_kernel_table *t, trex_pool *pool)
{
    static const struct {
        int64_t M, N, K, cuts[8];
        int ncuts;
        bool f32;
    } cases[] = {{70, 100, 305, {0, 96, 160, 305}, 3, false},
                 {70, 300, 1100, {0, 480, 992, 1100}, 3, false},
                 {64, 300, 2100, {0, 512, 1024, 1536, 2048, 2100}, 5, false},
                 {64, 300, 2100, {0, 320, 832, 1344, 1856, 2100}, 5, true}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int layout = 0; layout < 2; layout++)
            for (int beta0 = 0; beta0 < 2; beta0++) {
                const int64_t M = cases[ci].M, N = cases[ci].N, K = cases[ci].K, *cuts = cases[ci].cuts;
                const bool f32 = cases[ci].f32;
                const trex_dtype in = f32 ? TREX_F32 : TREX_BF16;
                const size_t esz = f32 ? sizeof(float) : sizeof(uint16_t);
                mats m = mats_make(M, N, K, layout == 1, false, 91 + (uint64_t)layout);
                const char *Ab = f32 ? (const char *)m.Af : (const char *)m.Ab;
                const char *Bb = f32 ? (const char *)m.Bf : (const char *)m.Bb;
                const size_t bytes = (size_t)(M * m.ldc) * sizeof(float);
                float *C1 = xmalloc(bytes), *C2 = xmalloc(bytes), *C3 = xmalloc(bytes);
                run_one(t, pool, &m, f32, 1.0f, (float)beta0, false, C1);
                memcpy(C2, m.C0, bytes);
                memcpy(C3, m.C0, bytes);
                for (int c = 0; c < cases[ci].ncuts; c++) {
                    const int64_t k0 = cuts[c], kn = cuts[c + 1] - k0;
                    const float beta = c || beta0 ? 1.0f : 0.0f;
                    const char *A = Ab + (size_t)(m.ta ? k0 * m.lda : k0) * esz, *B = Bb + (size_t)(k0 * m.ldb) * esz;
                    trex_gemm_problem p = {M, N, kn, A, m.lda, B, m.ldb, C2, m.ldc, NULL, 0};
                    trex_gemm_grouped_with(t, pool, NULL, in, m.ta, false, 1.0f, beta, &p, 1);
                    trex_gemm_packed *Bp = trex_gemm_pack_b_with(t, pool, in, false, N, kn, B, m.ldb);
                    CHECK(Bp != NULL, "ksplit pack");
                    p.B = Bp;
                    p.C = C3;
                    trex_gemm_grouped_prepacked_with(t, pool, NULL, in, m.ta, 1.0f, beta, &p, 1);
                    trex_gemm_packed_free(Bp);
                }
                CHECK(!memcmp(C1, C2, bytes) && !memcmp(C1, C3, bytes),
                      "%s: %s product (K %lld, %s, beta %d) in K blocks (packed per call / pre-packed) = one "
                      "call, bit for bit",
                      t->gemm_name, m.ta ? "A^T B" : "A B", (long long)K, f32 ? "fp32" : "bf16", beta0);
                free(C1);
                free(C2);
                free(C3);
                mats_free(&m);
            }
}

/* C is stored with non-temporal stores where nothing reads it first and its rows are 64-byte aligned:
 * written once (beta 0) whatever its size, or summed over K slices (beta 1, K > 512: the first slice reads
 * C, the last writes it back) when it exceeds 8 MiB. The bits must equal those of the same product into
 * rows one float apart (not aligned: stored normally), and stay within the bound of the fp64 sum. */
static void stream_case(const trex_kernel_table *t, trex_pool *pool, int64_t M, int beta)
{
    const int64_t N = 2048, K = beta ? 544 : 40, L = N + 1; /* L: the unaligned rows' stride */
    uint64_t st = 31 + (uint64_t)beta;
    uint16_t *A = xmalloc((size_t)(M * K) * sizeof *A), *B = xmalloc((size_t)(N * K) * sizeof *B);
    for (int64_t i = 0; i < M * K; i++)
        A[i] = trex_f32_to_bf16(rnd(&st));
    for (int64_t i = 0; i < N * K; i++)
        B[i] = trex_f32_to_bf16(rnd(&st));
    float *C0 = xmalloc((size_t)(M * N) * sizeof *C0);
    float *C1 = aligned_alloc(64, (size_t)(M * N) * sizeof *C1);
    float *C2 = aligned_alloc(64, ((size_t)(M * L) * sizeof *C2 + 63) / 64 * 64); /* a multiple of 64 */
    if (!C1 || !C2) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (int64_t i = 0; i < M * N; i++)
        C0[i] = beta ? rnd(&st) : 0.0f;
    memcpy(C1, C0, (size_t)(M * N) * sizeof *C1);
    for (int64_t i = 0; i < M; i++)
        memcpy(C2 + i * L, C0 + i * N, (size_t)N * sizeof *C2);
    const trex_gemm_problem streamed = {M, N, K, A, K, B, K, C1, N, NULL, 0};
    const trex_gemm_problem plain = {M, N, K, A, K, B, K, C2, L, NULL, 0};
    trex_gemm_grouped_with(t, pool, shared_ws, TREX_BF16, false, true, 1.0f, (float)beta, &streamed, 1);
    trex_gemm_grouped_with(t, pool, NULL, TREX_BF16, false, true, 1.0f, (float)beta, &plain, 1);
    int64_t diff = 0;
    for (int64_t i = 0; i < M; i++)
        diff += memcmp(C1 + i * N, C2 + i * L, (size_t)N * sizeof *C1) != 0;
    CHECK(diff == 0, "%s: streamed C (M %lld, beta %d, K %lld) differs from normally stored C in %lld rows",
          t->gemm_name, (long long)M, beta, (long long)K, (long long)diff);
    int64_t bad = 0;
    for (int64_t i = 0; i < M; i += 37)
        for (int64_t j = 0; j < N; j++) {
            double sum = C0[i * N + j], sa = fabs(sum);
            for (int64_t k = 0; k < K; k++) {
                double p = (double)trex_bf16_to_f32(A[i * K + k]) * trex_bf16_to_f32(B[j * K + k]);
                sum += p;
                sa += fabs(p);
            }
            bad += !(fabs(C1[i * N + j] - sum) <= 2.0 * (K + 4) * 0x1p-24 * sa);
        }
    CHECK(bad == 0, "%s streamed C (M %lld, beta %d): %lld bad elements", t->gemm_name, (long long)M, beta,
          (long long)bad);
    free(A);
    free(B);
    free(C0);
    free(C1);
    free(C2);
}

static void test_stream(const trex_kernel_table *t, trex_pool *pool)
{
    for (int beta = 0; beta < 2; beta++) {
        stream_case(t, pool, 1100, beta);
        stream_case(t, pool, 45, beta);
    }
}

/* ---- 6b. pre-packed B ------------------------------------------------------------------------------ */

/* C after a pre-packed call: A of type a_f32 ? fp32 : bf16, B packed from the fp32 or bf16 source with
 * the packer of table tp (the panels are the same bytes on every level), run on table t. */
static void run_prepacked(const trex_kernel_table *t, const trex_kernel_table *tp, trex_pool *pool,
                          const mats *m, bool a_f32, bool b_f32, float alpha, float beta, float *C)
{
    memcpy(C, m->C0, (size_t)(m->M * m->ldc) * sizeof *C);
    trex_gemm_packed *pk =
        trex_gemm_pack_b_with(tp, pool, b_f32 ? TREX_F32 : TREX_BF16, m->tb, m->N, m->K,
                              b_f32 ? (const void *)m->Bf : (const void *)m->Bb, m->ldb);
    CHECK(pk != NULL && trex_gemm_packed_n(pk) == m->N && trex_gemm_packed_k(pk) == m->K,
          "pack_b %lldx%lld", (long long)m->N, (long long)m->K);
    CHECK(trex_gemm_packed_bytes(pk) >= trex_gemm_pack_b_bytes(m->N, m->K), "packed bytes");
    const trex_gemm_problem p = {m->M, m->N, m->K, a_f32 ? (const void *)m->Af : (const void *)m->Ab,
                                 m->lda, pk, 0, C, m->ldc, NULL, 0};
    trex_gemm_grouped_prepacked_with(t, pool, (ws_toggle++ & 1) ? shared_ws : NULL,
                                     a_f32 ? TREX_F32 : TREX_BF16, m->ta, alpha, beta, &p, 1);
    trex_gemm_packed_free(pk);
}

/* Pre-packed B gives the bits of the unpacked call (same level) on awkward shapes, every layout, fp32
 * and bf16 A, B packed from fp32 or bf16 and by another level's packer; and stays within the bound. */
static void test_prepacked(const trex_kernel_table *t, const trex_kernel_table *ref, trex_pool *pool)
{
    const int64_t shapes[][3] = {{1, 1, 1},   {1, 17, 3},  {5, 3, 0},    {0, 4, 3},   {4, 0, 3},
                                 {31, 33, 65}, {37, 29, 41}, {100, 7, 513}, {13, 300, 33},
                                 {257, 263, 97}, {70, 45, 96}};
    const float ab[][2] = {{1, 0}, {1, 1}, {0.5f, -2}};
    int64_t diff = 0, bad = 0, runs = 0;
    double worst = 0;
    uint64_t seed = 4000;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tr = 0; tr < 4; tr++) {
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            mats m = mats_make(M, N, K, tr & 1, tr & 2, seed++);
            const size_t nc = (size_t)(M * m.ldc);
            float *C1 = xmalloc((nc + 1) * sizeof *C1), *C2 = xmalloc((nc + 1) * sizeof *C2);
            for (size_t a = 0; a < sizeof ab / sizeof ab[0]; a++)
                for (int v = 0; v < 4; v++) {
                    /* v: 0 fp32 A, fp32 B | 1 bf16 A, bf16 B | 2 bf16 A, B packed from fp32 |
                     * 3 fp32 A, B packed by the reference level */
                    const bool a_f32 = v == 0 || v == 3, b_f32 = v != 1;
                    const float alpha = ab[a][0], beta = ab[a][1];
                    run_one(t, pool, &m, a_f32, alpha, beta, false, C1);
                    run_prepacked(t, v == 3 ? ref : t, pool, &m, a_f32, b_f32, alpha, beta, C2);
                    const bool d = memcmp(C1, C2, nc * sizeof *C1) != 0;
                    if (d && diff < 5)
                        fprintf(stderr, "%s prepacked: M=%lld N=%lld K=%lld ta=%d tb=%d v=%d "
                                "alpha=%g beta=%g differs from the unpacked call\n", t->gemm_name,
                                (long long)M, (long long)N, (long long)K, tr & 1, (tr & 2) >> 1,
                                v, alpha, beta);
                    diff += d;
                    bad += check_c(&m, C2, alpha, beta, false, &worst);
                    runs++;
                }
            free(C1);
            free(C2);
            mats_free(&m);
        }
    CHECK(diff == 0, "%s prepacked: %lld of %lld runs differ from the unpacked call", t->gemm_name,
          (long long)diff, (long long)runs);
    CHECK(bad == 0, "%s prepacked: %lld elements outside the bound", t->gemm_name, (long long)bad);

    /* Grouped (experts of different sizes, one empty), and the same call on 1-3 threads. */
    enum { G = 5 };
    const int64_t Ms[G] = {45, 0, 1, 300, 70}, N = 70, K = 130;
    mats g[G];
    trex_gemm_problem pu[G], pp[G];
    trex_gemm_packed *pk[G];
    float *Cu[G], *Cp[G];
    for (int e = 0; e < G; e++) {
        g[e] = mats_make(Ms[e], N, K, false, e % 2 == 0, 4500 + e);
        Cu[e] = xmalloc((size_t)(Ms[e] * g[e].ldc + 1) * sizeof *Cu[e]);
        Cp[e] = xmalloc((size_t)(Ms[e] * g[e].ldc + 1) * sizeof *Cp[e]);
        memcpy(Cu[e], g[e].C0, (size_t)(Ms[e] * g[e].ldc) * sizeof *Cu[e]);
        pk[e] = trex_gemm_pack_b_with(t, pool, TREX_F32, g[e].tb, N, K, g[e].Bf, g[e].ldb);
        pu[e] = (trex_gemm_problem){Ms[e], N, K, g[e].Af, g[e].lda, g[e].Bf, g[e].ldb, Cu[e], g[e].ldc, NULL, 0};
        pp[e] = (trex_gemm_problem){Ms[e], N, K, g[e].Af, g[e].lda, pk[e], 0, Cp[e], g[e].ldc, NULL, 0};
    }
    /* The unpacked call takes one tb for all: run each problem alone with its own. */
    for (int e = 0; e < G; e++)
        trex_gemm_grouped_with(t, pool, NULL, TREX_F32, false, g[e].tb, 1.0f, 1.0f, &pu[e], 1);
    trex_pool *pools[3] = {NULL, trex_pool_create(1), trex_pool_create(3)};
    CHECK(pools[1] && pools[2], "pools of 1 and 3 threads");
    for (int pi = 0; pi < 4; pi++) {
        for (int e = 0; e < G; e++)
            memcpy(Cp[e], g[e].C0, (size_t)(Ms[e] * g[e].ldc) * sizeof *Cp[e]);
        trex_gemm_grouped_prepacked_with(t, pi < 3 ? pools[pi] : pool, shared_ws, TREX_F32, false,
                                         1.0f, 1.0f, pp, G);
        int64_t gd = 0;
        for (int e = 0; e < G; e++)
            gd += memcmp(Cu[e], Cp[e], (size_t)(Ms[e] * g[e].ldc) * sizeof *Cu[e]) != 0;
        CHECK(gd == 0, "%s grouped prepacked (pool %d): %lld experts differ from unpacked calls",
              t->gemm_name, pi, (long long)gd);
    }
    for (int i = 1; i < 3; i++)
        trex_pool_destroy(pools[i]);
    for (int e = 0; e < G; e++) {
        trex_gemm_packed_free(pk[e]);
        free(Cu[e]);
        free(Cp[e]);
        mats_free(&g[e]);
    }
    printf("%s: %lld prepacked runs bit-identical to unpacked, worst error %.3f of the bound\n",
           t->gemm_name, (long long)runs, worst);
}

/* ---- 6b'. packed B over the caller's memory ------------------------------------------------------------- */

/* trex_gemm_pack_b_range over a grid of parts (cut at random points, in both orders, over a buffer
 * of garbage) leaves exactly trex_gemm_pack_b's bytes, from fp32 and bf16, either layout; a part writes
 * nothing outside its elements but its edges' padding; a trex_gemm_packed_view_b over those panels gives
 * the bits of the unpacked call. */
static void test_pack_range(const trex_kernel_table *t, trex_pool *pool)
{
    const int64_t shapes[][3] = {{1, 1, 1},    {3, 1, 70},   {5, 33, 1},  {9, 64, 64},
                                 {17, 45, 100}, {40, 130, 37}, {2, 7, 513}};
    uint64_t st = 6100;
    int64_t diff = 0, leak = 0, pdiff = 0, runs = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tr = 0; tr < 4; tr++) {
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            const bool tb = tr & 1, f32 = tr & 2;
            mats m = mats_make(M, N, K, false, tb, st++);
            const void *B = f32 ? (const void *)m.Bf : (const void *)m.Bb;
            const size_t es = f32 ? 4 : 2, bytes = trex_gemm_pack_b_bytes(N, K);
            trex_gemm_packed *pk = trex_gemm_pack_b_with(t, NULL, f32 ? TREX_F32 : TREX_BF16, tb, N, K, B, m.ldb);
            uint16_t *pan = aligned_alloc(64, (bytes + 63) / 64 * 64);
            CHECK(pk && pan, "pack_range %lldx%lld: allocations", (long long)N, (long long)K);
            if (!pk || !pan) {
                free(pan);
                trex_gemm_packed_free(pk);
                mats_free(&m);
                continue;
            }
            /* cut points: 0, up to three random ones, the end */
            int64_t nc[5] = {0}, kc[5] = {0}, nn = 1, nk = 1;
            for (int i = 0; i < 3; i++) {
                const int64_t a = (int64_t)(rng_next(&st) % (uint64_t)(N + 1));
                const int64_t b = (int64_t)(rng_next(&st) % (uint64_t)(K + 1));
                if (a > nc[nn - 1])
                    nc[nn++] = a;
                if (b > kc[nk - 1])
                    kc[nk++] = b;
            }
            if (nc[nn - 1] < N)
                nc[nn++] = N;
            if (kc[nk - 1] < K)
                kc[nk++] = K;
            for (int order = 0; order < 2; order++) {
                memset(pan, 0xA5, bytes);
                const int64_t cells = (nn - 1) * (nk - 1);
                for (int64_t c = 0; c < cells; c++) {
                    const int64_t q = order ? cells - 1 - c : c, i = q / (nk - 1), j = q % (nk - 1);
                    const int64_t n0 = nc[i], n1 = nc[i + 1], k0 = kc[j], k1 = kc[j + 1];
                    const char *src = (const char *)B + (size_t)(tb ? n0 * m.ldb + k0 : k0 * m.ldb + n0) * es;
                    trex_gemm_pack_b_range_with(t, pan, N, K, f32 ? TREX_F32 : TREX_BF16, tb, src, m.ldb, n0, n1,
                                                k0, k1);
                }
                diff += memcmp(pan, trex_gemm_packed_panels(pk), bytes) != 0;
                runs++;
            }
            /* one inner part alone: nothing written outside its elements */
            if (N > 2 && K > 2) {
                const int64_t n0 = 1, n1 = N - 1, k0 = 1, k1 = K - 1, kp = (K + 31) / 32 * 32;
                memset(pan, 0xA5, bytes);
                const char *src = (const char *)B + (size_t)(tb ? n0 * m.ldb + k0 : k0 * m.ldb + n0) * es;
                trex_gemm_pack_b_range_with(t, pan, N, K, f32 ? TREX_F32 : TREX_BF16, tb, src, m.ldb, n0, n1, k0, k1);
                for (int64_t n = 0; n < (N + 31) / 32 * 32; n++)
                    for (int64_t k = 0; k < kp; k++) {
                        const size_t at = (size_t)((n / 32) * 32 * kp + (k / 2) * 64 + (n % 32) * 2 + k % 2);
                        const bool in = n >= n0 && n < n1 && k >= k0 && k < k1;
                        leak += in ? pan[at] != trex_gemm_packed_panels(pk)[at] : pan[at] != 0xA5A5;
                    }
            }
            /* a product from a view over the panels */
            if (M > 0) {
                trex_gemm_pack_b_range_with(t, pan, N, K, f32 ? TREX_F32 : TREX_BF16, tb, B, m.ldb, 0, N, 0, K);
                trex_gemm_packed *v = trex_gemm_packed_view_b(N, K, pan);
                const size_t ncm = (size_t)(M * m.ldc);
                float *C1 = xmalloc((ncm + 1) * sizeof *C1), *C2 = xmalloc((ncm + 1) * sizeof *C2);
                run_one(t, pool, &m, false, 1.0f, 1.0f, false, C1);
                memcpy(C2, m.C0, ncm * sizeof *C2);
                const trex_gemm_problem p = {M, N, K, m.Ab, m.lda, v, 0, C2, m.ldc, NULL, 0};
                CHECK(v && trex_gemm_packed_n(v) == N && trex_gemm_packed_k(v) == K &&
                          trex_gemm_packed_panels(v) == pan && trex_gemm_packed_bytes(v) < bytes + 1024,
                      "view %lldx%lld", (long long)N, (long long)K);
                if (v)
                    trex_gemm_grouped_prepacked_with(t, pool, shared_ws, TREX_BF16, false, 1.0f, 1.0f, &p, 1);
                pdiff += !v || memcmp(C1, C2, ncm * sizeof *C1) != 0;
                trex_gemm_packed_free(v); /* the header only: pan is still ours */
                free(C1);
                free(C2);
            }
            free(pan);
            trex_gemm_packed_free(pk);
            mats_free(&m);
        }
    CHECK(diff == 0, "%s pack_b_range: %lld of %lld tilings differ from pack_b", t->pack_name, (long long)diff,
          (long long)runs);
    CHECK(leak == 0, "%s pack_b_range: %lld bytes wrong around one part", t->pack_name, (long long)leak);
    CHECK(pdiff == 0, "%s packed view: %lld products differ from the unpacked call", t->gemm_name,
          (long long)pdiff);
}

/* trex_gemm_grouped_prepacked_rows: the bits of gathering the rows first, fp32 and bf16 A, K within one
 * slab and over several (not a multiple of 32), rows repeated, an empty problem, alpha/beta pairs. */
static void test_gathered(const trex_kernel_table *t, trex_pool *pool)
{
    enum { G = 4, R = 97 };
    const int64_t Ms[G] = {45, 0, 300, 33}, Ks[2] = {130, 601}, N = 70;
    uint64_t st = 6900;
    int64_t diff = 0, runs = 0;
    for (int ki = 0; ki < 2; ki++)
        for (int f32 = 0; f32 < 2; f32++)
            for (int ab = 0; ab < 2; ab++) {
                const int64_t K = Ks[ki], lda = K + 5;
                const size_t es = f32 ? 4 : 2;
                char *X = xmalloc((size_t)(R * lda) * es);
                for (int64_t q = 0; q < R * lda; q++) {
                    const float v = (float)((double)(rng_next(&st) >> 11) / 9007199254740992.0 - 0.5);
                    if (f32)
                        ((float *)X)[q] = v;
                    else
                        ((uint16_t *)X)[q] = trex_f32_to_bf16(v);
                }
                float *Bf = xmalloc((size_t)(N * K) * sizeof *Bf);
                for (int64_t q = 0; q < N * K; q++)
                    Bf[q] = (float)((double)(rng_next(&st) >> 11) / 9007199254740992.0 - 0.5);
                trex_gemm_packed *pk = trex_gemm_pack_b_with(t, pool, TREX_F32, true, N, K, Bf, K);
                trex_gemm_problem pg[G], pr[G];
                int32_t *idx[G];
                char *Ag[G];
                float *C1[G], *C2[G];
                for (int e = 0; e < G; e++) {
                    idx[e] = xmalloc((size_t)(Ms[e] + 1) * sizeof *idx[e]);
                    Ag[e] = xmalloc((size_t)(Ms[e] * K + 1) * es);
                    C1[e] = xmalloc((size_t)(Ms[e] * N + 1) * sizeof *C1[e]);
                    C2[e] = xmalloc((size_t)(Ms[e] * N + 1) * sizeof *C2[e]);
                    for (int64_t m = 0; m < Ms[e]; m++) {
                        idx[e][m] = (int32_t)(rng_next(&st) % R);
                        memcpy(Ag[e] + (size_t)(m * K) * es, X + (size_t)(idx[e][m] * lda) * es, (size_t)K * es);
                    }
                    for (int64_t q = 0; q < Ms[e] * N; q++)
                        C1[e][q] = C2[e][q] = (float)q * 0.25f;
                    pg[e] = (trex_gemm_problem){Ms[e], N, K, Ag[e], K, pk, 0, C1[e], N, NULL, 0};
                    pr[e] = (trex_gemm_problem){Ms[e], N, K, X, lda, pk, 0, C2[e], N, NULL, 0};
                }
                const float alpha = ab ? 0.5f : 1.0f, beta = ab ? 1.0f : 0.0f;
                const trex_dtype in = f32 ? TREX_F32 : TREX_BF16;
                trex_gemm_grouped_prepacked_with(t, pool, shared_ws, in, false, alpha, beta, pg, G);
                trex_gemm_grouped_prepacked_rows_with(t, pool, (ws_toggle++ & 1) ? shared_ws : NULL, in, alpha,
                                                      beta, pr, (const int32_t *const *)idx, G);
                for (int e = 0; e < G; e++) {
                    diff += memcmp(C1[e], C2[e], (size_t)(Ms[e] * N) * sizeof(float)) != 0;
                    runs++;
                    free(idx[e]), free(Ag[e]), free(C1[e]), free(C2[e]);
                }
                trex_gemm_packed_free(pk);
                free(Bf);
                free(X);
            }
    CHECK(diff == 0, "%s gathered A: %lld of %lld problems differ from gathering first", t->gemm_name,
          (long long)diff, (long long)runs);

    /* trex_gemm_grouped_rows: A or B (or both) read through rows, every layout, against gathering the
     * stored rows first (problem 1 reads both as stored: a NULL list) */
    diff = runs = 0;
    for (int lay = 0; lay < 4; lay++)
        for (int which = 1; which < 4; which++) { /* 1: A listed, 2: B listed, 3: both */
            const bool ta = lay & 1, tb = lay & 2, f32 = which == 2;
            const int64_t Kx = lay == 3 ? 601 : 130, Mx[3] = {37, 20, 65}, Nx = 45;
            const size_t es = f32 ? 4 : 2;
            int64_t dff = 0;
            char *As[3], *Bs[3], *Ag[3], *Bg[3];
            int32_t *ai[3], *bi[3];
            float *C1[3], *C2[3];
            trex_gemm_problem pg[3], pr[3];
            for (int e = 0; e < 3; e++) {
                const int64_t M = Mx[e], ar = ta ? Kx : M, ac = ta ? M : Kx, br = tb ? Nx : Kx, bc = tb ? Kx : Nx;
                const int64_t RA = ar + 7, RB = br + 7; /* buffer rows: every stored row fits unlisted too */
                As[e] = xmalloc((size_t)(RA * (ac + 3)) * es), Bs[e] = xmalloc((size_t)(RB * (bc + 2)) * es);
                Ag[e] = xmalloc((size_t)(ar * ac) * es), Bg[e] = xmalloc((size_t)(br * bc) * es);
                ai[e] = xmalloc((size_t)ar * sizeof *ai[e]), bi[e] = xmalloc((size_t)br * sizeof *bi[e]);
                C1[e] = xmalloc((size_t)(M * Nx) * sizeof *C1[e]), C2[e] = xmalloc((size_t)(M * Nx) * sizeof *C2[e]);
                for (int64_t q = 0; q < RA * (ac + 3); q++) {
                    const float v = (float)((double)(rng_next(&st) >> 11) / 9007199254740992.0 - 0.5);
                    f32 ? (void)(((float *)As[e])[q] = v) : (void)(((uint16_t *)As[e])[q] = trex_f32_to_bf16(v));
                }
                for (int64_t q = 0; q < RB * (bc + 2); q++) {
                    const float v = (float)((double)(rng_next(&st) >> 11) / 9007199254740992.0 - 0.5);
                    f32 ? (void)(((float *)Bs[e])[q] = v) : (void)(((uint16_t *)Bs[e])[q] = trex_f32_to_bf16(v));
                }
                const bool la = (which & 1) && e != 1, lb = (which & 2) && e != 1;
                for (int64_t j = 0; j < ar; j++) {
                    ai[e][j] = la ? (int32_t)(rng_next(&st) % (uint64_t)RA) : (int32_t)j;
                    memcpy(Ag[e] + (size_t)(j * ac) * es, As[e] + (size_t)(ai[e][j] * (ac + 3)) * es, (size_t)ac * es);
                }
                for (int64_t j = 0; j < br; j++) {
                    bi[e][j] = lb ? (int32_t)(rng_next(&st) % (uint64_t)RB) : (int32_t)j;
                    memcpy(Bg[e] + (size_t)(j * bc) * es, Bs[e] + (size_t)(bi[e][j] * (bc + 2)) * es, (size_t)bc * es);
                }
                for (int64_t q = 0; q < M * Nx; q++)
                    C1[e][q] = C2[e][q] = (float)q;
                pg[e] = (trex_gemm_problem){M, Nx, Kx, Ag[e], ac, Bg[e], bc, C1[e], Nx, NULL, 0};
                pr[e] = (trex_gemm_problem){M, Nx, Kx, As[e], ac + 3, Bs[e], bc + 2, C2[e], Nx, NULL, 0};
            }
            /* problem 1 as stored: its lists NULL (its buffers' first rows are what Ag / Bg hold) */
            const int32_t *al[3] = {ai[0], NULL, ai[2]}, *bl[3] = {bi[0], NULL, bi[2]};
            const trex_dtype in = f32 ? TREX_F32 : TREX_BF16;
            trex_gemm_grouped_with(t, pool, shared_ws, in, ta, tb, 1.0f, 1.0f, pg, 3);
            trex_gemm_grouped_rows_with(t, pool, (ws_toggle++ & 1) ? shared_ws : NULL, in, ta, tb, 1.0f, 1.0f, pr,
                                        (which & 1) ? al : NULL, (which & 2) ? bl : NULL, 3);
            for (int e = 0; e < 3; e++) {
                dff += memcmp(C1[e], C2[e], (size_t)(Mx[e] * Nx) * sizeof(float)) != 0;
                free(As[e]), free(Bs[e]), free(Ag[e]), free(Bg[e]), free(ai[e]), free(bi[e]), free(C1[e]), free(C2[e]);
            }
            if (dff && diff == 0)
                fprintf(stderr, "%s rows: ta %d tb %d which %d differs\n", t->gemm_name, ta, tb, which);
            diff += dff;
            runs += 3;
        }
    CHECK(diff == 0, "%s operands through row lists: %lld of %lld problems differ from gathering first",
          t->gemm_name, (long long)diff, (long long)runs);
}

/* ---- 6c. pre-packed A ------------------------------------------------------------------------------ */

/* Pre-packed A gives the bits of the unpacked call (same level) on awkward shapes, every layout, A
 * packed from fp32 or bf16 (the same bytes for the same values) and by the reference level's packer, B
 * fp32 or bf16; within the bound; the same bits on pools of 1-3 threads. */
static void test_prepacked_a(const trex_kernel_table *t, const trex_kernel_table *ref, trex_pool *pool)
{
    const int64_t shapes[][3] = {{1, 1, 1},   {1, 17, 3},  {5, 3, 0},    {0, 4, 3},   {4, 0, 3},
                                 {31, 33, 65}, {37, 29, 41}, {100, 7, 513}, {13, 300, 33},
                                 {257, 263, 97}, {70, 45, 96}, {300, 40, 1100}};
    const float ab[][2] = {{1, 0}, {1, 1}, {0.5f, -2}};
    trex_pool *pools[2] = {trex_pool_create(1), trex_pool_create(3)};
    CHECK(pools[0] && pools[1], "pools of 1 and 3 threads");
    int64_t diff = 0, bad = 0, runs = 0;
    double worst = 0;
    uint64_t seed = 6000;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tr = 0; tr < 4; tr++) {
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            mats m = mats_make(M, N, K, tr & 1, tr & 2, seed++);
            const size_t nc = (size_t)(M * m.ldc);
            float *C1 = xmalloc((nc + 1) * sizeof *C1), *C2 = xmalloc((nc + 1) * sizeof *C2);
            for (int v = 0; v < 4; v++) {
                /* v: 0 A from fp32, B fp32 | 1 A from bf16, B bf16 | 2 A from bf16, B fp32 |
                 * 3 A from fp32 by the reference level's packer, B bf16. The unpacked call takes A
                 * of B's type: bf16(A) packs to the same bytes as A. */
                const bool a_f32 = v == 0 || v == 3, b_f32 = v == 0 || v == 2;
                trex_gemm_packed *pk = trex_gemm_pack_a_with(
                    v == 3 ? ref : t, pool, a_f32 ? TREX_F32 : TREX_BF16, m.ta, M, K,
                    a_f32 ? (const void *)m.Af : (const void *)m.Ab, m.lda);
                CHECK(pk != NULL && trex_gemm_packed_is_a(pk) && trex_gemm_packed_n(pk) == M &&
                          trex_gemm_packed_k(pk) == K &&
                          trex_gemm_packed_bytes(pk) >= trex_gemm_pack_b_bytes(M, K),
                      "pack_a %lldx%lld", (long long)M, (long long)K);
                for (size_t a = 0; a < sizeof ab / sizeof ab[0]; a++)
                    for (int pi = 0; pi < (s == 9 ? 3 : 1); pi++) {
                        const float alpha = ab[a][0], beta = ab[a][1];
                        run_one(t, pool, &m, b_f32, alpha, beta, false, C1);
                        memcpy(C2, m.C0, nc * sizeof *C2);
                        trex_gemm_prepacked_a_with(
                            t, pi == 0 ? pool : pools[pi - 1], (ws_toggle++ & 1) ? shared_ws : NULL,
                            pk, b_f32 ? TREX_F32 : TREX_BF16, m.tb, N, alpha,
                            b_f32 ? (const void *)m.Bf : (const void *)m.Bb, m.ldb, beta, C2, m.ldc);
                        const bool d = memcmp(C1, C2, nc * sizeof *C1) != 0;
                        if (d && diff < 5)
                            fprintf(stderr, "%s prepacked A: M=%lld N=%lld K=%lld ta=%d tb=%d v=%d "
                                    "alpha=%g beta=%g pool %d differs from the unpacked call\n",
                                    t->gemm_name, (long long)M, (long long)N, (long long)K, tr & 1,
                                    (tr & 2) >> 1, v, alpha, beta, pi);
                        diff += d;
                        bad += check_c(&m, C2, alpha, beta, false, &worst);
                        runs++;
                    }
                trex_gemm_packed_free(pk);
            }
            free(C1);
            free(C2);
            mats_free(&m);
        }
    for (int i = 0; i < 2; i++)
        trex_pool_destroy(pools[i]);
    CHECK(diff == 0, "%s prepacked A: %lld of %lld runs differ from the unpacked call", t->gemm_name,
          (long long)diff, (long long)runs);
    CHECK(bad == 0, "%s prepacked A: %lld elements outside the bound", t->gemm_name, (long long)bad);
    printf("%s: %lld prepacked-A runs bit-identical to unpacked, worst error %.3f of the bound\n",
           t->gemm_name, (long long)runs, worst);
}

/* The public pre-packed A entries: a weight W [V, k] as the A of logits^T = W h^T (h [n, k], tb),
 * packed, repacked with new values; against trex_gemm_bf16 bit for bit. */
static void test_prepacked_a_public(trex_pool *pool)
{
    const int64_t V = 133, k = 97, n = 41;
    uint64_t st = 7;
    uint16_t *W = xmalloc((size_t)(V * k) * sizeof *W), *h = xmalloc((size_t)(n * k) * sizeof *h);
    for (int64_t i = 0; i < n * k; i++)
        h[i] = trex_f32_to_bf16(rnd(&st));
    float *l1 = xmalloc((size_t)(V * n) * sizeof *l1), *l2 = xmalloc((size_t)(V * n) * sizeof *l2);
    trex_gemm_packed *wp = NULL;
    for (int round = 0; round < 2; round++) {
        for (int64_t i = 0; i < V * k; i++)
            W[i] = trex_f32_to_bf16(rnd(&st));
        if (round == 0)
            wp = trex_gemm_pack_a(pool, TREX_BF16, false, V, k, W, k);
        else /* an optimizer step: new values, packed into the same buffer */
            trex_gemm_repack_a(pool, wp, W, k);
        CHECK(wp != NULL && trex_gemm_packed_is_a(wp) && trex_gemm_packed_n(wp) == V &&
                  trex_gemm_packed_k(wp) == k,
              "pack_a shape");
        trex_gemm_bf16(pool, shared_ws, false, true, V, n, k, 1.0f, W, k, h, k, 0.0f, l1, n);
        trex_gemm_prepacked_a(pool, shared_ws, wp, TREX_BF16, true, n, 1.0f, h, k, 0.0f, l2, n);
        CHECK(memcmp(l1, l2, (size_t)(V * n) * sizeof *l1) == 0,
              "prepacked A logits = trex_gemm_bf16 (round %d)", round);
    }
    trex_gemm_packed *bp = trex_gemm_pack_b(pool, TREX_BF16, true, n, k, h, k);
    CHECK(bp != NULL && !trex_gemm_packed_is_a(bp), "a packed B is not an A");
    trex_gemm_packed_free(bp);
    trex_gemm_packed_free(wp);
    free(W);
    free(h);
    free(l1);
    free(l2);
}

/* The public pre-packed entries: linear-layer packing of W [out, in] for y = x W^T and dx = dy W, repack
 * with new values, sizes; against trex_gemm_f32_bf16 bit for bit. */
static void test_prepacked_public(trex_pool *pool)
{
    const int64_t n = 77, in = 131, out = 45;
    uint64_t st = 5;
    float *W = xmalloc((size_t)(out * in) * sizeof *W), *x = xmalloc((size_t)(n * in) * sizeof *x);
    float *dy = xmalloc((size_t)(n * out) * sizeof *dy);
    for (int64_t i = 0; i < out * in; i++)
        W[i] = rnd(&st);
    for (int64_t i = 0; i < n * in; i++)
        x[i] = rnd(&st);
    for (int64_t i = 0; i < n * out; i++)
        dy[i] = rnd(&st);
    float *y1 = xmalloc((size_t)(n * out) * sizeof *y1), *y2 = xmalloc((size_t)(n * out) * sizeof *y2);
    float *d1 = xmalloc((size_t)(n * in) * sizeof *d1), *d2 = xmalloc((size_t)(n * in) * sizeof *d2);
    trex_gemm_packed *wf = trex_linear_pack_weight(pool, TREX_LINEAR_FWD, W, out, in);
    trex_gemm_packed *wd = trex_linear_pack_weight(pool, TREX_LINEAR_DX, W, out, in);
    CHECK(wf && wd, "linear pack");
    CHECK(trex_gemm_packed_n(wf) == out && trex_gemm_packed_k(wf) == in &&
              trex_gemm_packed_n(wd) == in && trex_gemm_packed_k(wd) == out,
          "linear pack shapes");
    CHECK(trex_gemm_pack_b_bytes(out, in) == 64 * 160 * 2 && trex_gemm_pack_b_bytes(0, 5) == 0,
          "pack_b_bytes");
    for (int round = 0; round < 2; round++) {
        if (round == 1) { /* an optimizer step: new values, packed into the same buffers */
            for (int64_t i = 0; i < out * in; i++)
                W[i] = rnd(&st);
            trex_gemm_repack_b(pool, wf, W, in);
            trex_gemm_repack_b(pool, wd, W, in);
        }
        trex_gemm_f32_bf16(pool, shared_ws, false, true, n, out, in, 1.0f, x, in, W, in, 0.0f, y1, out);
        trex_gemm_prepacked(pool, shared_ws, TREX_F32, false, n, 1.0f, x, in, wf, 0.0f, y2, out);
        CHECK(memcmp(y1, y2, (size_t)(n * out) * sizeof *y1) == 0,
              "prepacked forward = trex_gemm_f32_bf16 (round %d)", round);
        for (int64_t i = 0; i < n * in; i++)
            d1[i] = d2[i] = (float)i * 1e-3f;
        trex_gemm_f32_bf16(pool, NULL, false, false, n, in, out, 1.0f, dy, out, W, in, 1.0f, d1, in);
        trex_gemm_prepacked(pool, NULL, TREX_F32, false, n, 1.0f, dy, out, wd, 1.0f, d2, in);
        CHECK(memcmp(d1, d2, (size_t)(n * in) * sizeof *d1) == 0,
              "prepacked input gradient = trex_gemm_f32_bf16 (round %d)", round);
    }
    trex_gemm_packed_free(wf);
    trex_gemm_packed_free(wd);
    trex_gemm_packed_free(NULL);
    CHECK(trex_gemm_packed_bytes(NULL) == 0, "bytes of NULL");
    free(W);
    free(x);
    free(dy);
    free(y1);
    free(y2);
    free(d1);
    free(d2);
}

/* ---- 7. determinism over thread counts --------------------------------------------------------- */

static void test_determinism(const trex_kernel_table *t)
{
    /* Several rows and columns of blocks; smaller for the (slow) plain-C micro-kernel. */
    const bool fast = t->isa >= TREX_ISA_AVX512F;
    const int64_t M = fast ? 520 : 300, N = fast ? 600 : 290, K = fast ? 700 : 100;
    trex_pool *pools[4] = {NULL, trex_pool_create(1), trex_pool_create(2), trex_pool_create(3)};
    for (int i = 1; i < 4; i++)
        CHECK(pools[i] != NULL, "pool of %d threads", i);
    for (int mode = 0; mode < 3; mode++) {
        const bool ta = mode == 2, tb = mode != 1;
        const float alpha = mode == 1 ? 0.75f : 1.0f, beta = mode == 0 ? 0.0f : 1.0f;
        mats m = mats_make(M, N, K, ta, tb, 300 + mode);
        float *C[4];
        for (int i = 0; i < 4; i++) {
            C[i] = xmalloc((size_t)(M * m.ldc) * sizeof *C[i]);
            run_one(t, pools[i], &m, mode == 1, alpha, beta, false, C[i]);
        }
        for (int i = 1; i < 4; i++)
            CHECK(memcmp(C[0], C[i], (size_t)(M * m.ldc) * sizeof *C[0]) == 0,
                  "%s mode %d: %d threads differ from no pool", t->gemm_name, mode, i);
        /* Rows of blocks go to whichever thread asks first: the schedule changes between runs. */
        for (int rep = 0; rep < 3; rep++) {
            run_one(t, pools[2], &m, mode == 1, alpha, beta, false, C[1]);
            CHECK(memcmp(C[0], C[1], (size_t)(M * m.ldc) * sizeof *C[0]) == 0,
                  "%s mode %d: 2 threads, run %d differs", t->gemm_name, mode, rep);
        }
        for (int i = 0; i < 4; i++)
            free(C[i]);
        mats_free(&m);
    }
    for (int i = 1; i < 4; i++)
        trex_pool_destroy(pools[i]);
}

/* A problem's D (trex_gemm_problem, trex_gemm_syrk): C = alpha op(A) op(B) + beta D must be, bit for bit,
 * the plain problem run on a C that holds D's values, in every mode (set, add, general), on edge tiles,
 * K = 0 and long K (slices), two problems in one call, and symmetric products; C's old contents (NaN
 * here) are never read and its columns past N never written. With alpha 1 it must also be beta D
 * stored into C and then a call with beta 1 (Newton–Schulz's aX + XB relies on it). */
static int64_t d_compare(const float *plain, const float *got, int64_t M, int64_t N, int64_t ldc)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldc; j++)
            bad += j < N ? memcmp(&plain[i * ldc + j], &got[i * ldc + j], sizeof(float)) != 0
                         : !isnan(got[i * ldc + j]);
    return bad;
}

static void test_gemm_d(const trex_kernel_table *t, trex_pool *pool)
{
    const int64_t shapes[][3] = {{1, 1, 1}, {33, 65, 17}, {64, 96, 0}, {97, 130, 600}, {300, 70, 1100}};
    const float ab[][2] = {{1, 0}, {1, 1}, {0.5f, -2}, {1, 3.4445f}, {-1.5f, 1}};
    enum { NS = sizeof shapes / sizeof shapes[0] };
    int64_t bad = 0, runs = 0;
    uint64_t seed = 9400;
    for (size_t a = 0; a < sizeof ab / sizeof ab[0]; a++) {
        const float alpha = ab[a][0], beta = ab[a][1];
        mats m[NS];
        float *D[NS], *C1[NS], *C2[NS];
        trex_gemm_problem plain[NS], withd[NS];
        for (int s = 0; s < NS; s++) {
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            m[s] = mats_make(M, N, K, false, true, seed++);
            const int64_t ldd = N + 7, nc = M * m[s].ldc;
            D[s] = xmalloc((size_t)(M * ldd) * sizeof(float));
            C1[s] = xmalloc((size_t)nc * sizeof(float));
            C2[s] = xmalloc((size_t)nc * sizeof(float));
            for (int64_t i = 0; i < M; i++)
                memcpy(D[s] + i * ldd, m[s].C0 + i * m[s].ldc, (size_t)N * sizeof(float));
            plain[s] = (trex_gemm_problem){M, N, K, m[s].Af, m[s].lda, m[s].Bf, m[s].ldb, C1[s], m[s].ldc, NULL, 0};
            withd[s] = (trex_gemm_problem){M, N, K, m[s].Af, m[s].lda, m[s].Bf, m[s].ldb, C2[s], m[s].ldc, D[s], ldd};
        }
        /* each problem alone, then all in one call */
        for (int s = 0; s <= NS; s++) {
            const int first = s < NS ? s : 0, count = s < NS ? 1 : NS;
            for (int q = first; q < first + count; q++) {
                memcpy(C1[q], m[q].C0, (size_t)(m[q].M * m[q].ldc) * sizeof(float));
                for (int64_t e = 0; e < m[q].M * m[q].ldc; e++)
                    C2[q][e] = NAN;
            }
            trex_gemm_grouped_with(t, pool, NULL, TREX_F32, false, true, alpha, beta, plain + first, count);
            trex_gemm_grouped_with(t, pool, shared_ws, TREX_F32, false, true, alpha, beta, withd + first, count);
            for (int q = first; q < first + count; q++)
                bad += d_compare(C1[q], C2[q], m[q].M, m[q].N, m[q].ldc);
            runs++;
            /* alpha 1: the sums start from beta D, so beta D stored first and beta 1 give the same bits */
            if (alpha != 1.0f || beta == 0.0f)
                continue;
            for (int q = first; q < first + count; q++)
                for (int64_t e = 0; e < m[q].M * m[q].ldc; e++)
                    C1[q][e] = beta * m[q].C0[e];
            trex_gemm_grouped_with(t, pool, NULL, TREX_F32, false, true, 1.0f, 1.0f, plain + first, count);
            for (int q = first; q < first + count; q++)
                bad += d_compare(C1[q], C2[q], m[q].M, m[q].N, m[q].ldc);
        }
        /* symmetric: X = A [M, K] of the square shapes' rows, C [M, M] */
        for (int s = 0; s < NS; s++) {
            const int64_t n = shapes[s][0], k = shapes[s][2], ldc = n + 2, ldd = n + 5;
            float *S1 = xmalloc((size_t)(n * ldc) * sizeof(float)), *S2 = xmalloc((size_t)(n * ldc) * sizeof(float));
            float *SD = xmalloc((size_t)(n * ldd) * sizeof(float));
            uint64_t st = seed++;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < ldc; j++) {
                    S1[i * ldc + j] = j < n ? rnd(&st) : NAN;
                    S2[i * ldc + j] = NAN;
                    if (j < n)
                        SD[i * ldd + j] = S1[i * ldc + j];
                }
            trex_gemm_syrk_with(t, pool, NULL, TREX_F32, false, n, k, alpha, m[s].Af, m[s].lda, beta, S1, ldc, NULL, 0);
            trex_gemm_syrk_with(t, pool, shared_ws, TREX_F32, false, n, k, alpha, m[s].Af, m[s].lda, beta, S2, ldc, SD,
                                ldd);
            bad += d_compare(S1, S2, n, n, ldc);
            runs++;
            free(S1);
            free(S2);
            free(SD);
        }
        for (int s = 0; s < NS; s++) {
            mats_free(&m[s]);
            free(D[s]);
            free(C1[s]);
            free(C2[s]);
        }
    }
    CHECK(bad == 0, "%s: %" PRId64 " calls with a D equal the plain problem on C = D (%" PRId64 " elements differ)",
          t->gemm_name, runs, bad);
}

/* Symmetric products (trex_gemm_syrk_with): C = alpha op(X) op(X)^T + beta C on and below the diagonal
 * bit for bit the full product of the same level (op(A) = op(X), op(B) = op(X)^T), above it the exact
 * mirror, the padding past n untouched, the same bits for any pool. The old C is symmetric where beta
 * != 0, except one run with NaN above the diagonal, which must not reach the result. The fast levels
 * also take a K long enough to cut C into two column chunks with 224-row blocks (the diagonal crosses
 * blocks unevenly). */
static void test_syrk(const trex_kernel_table *t, trex_pool *pool)
{
    const int64_t shapes[][2] = {{1, 1},  {1, 5},   {5, 0},    {0, 3},    {31, 65},  {32, 32},
                                 {33, 17}, {64, 96}, {257, 97}, {300, 1100}, {300, 16400}};
    const float ab[][2] = {{1, 0}, {1, 1}, {0.5f, -2}, {-1.5f, 1}};
    trex_pool *pools[2] = {trex_pool_create(1), trex_pool_create(3)};
    CHECK(pools[0] && pools[1], "pools of 1 and 3 threads");
    int64_t bad = 0, runs = 0;
    uint64_t seed = 9100;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tr = 0; tr < 2; tr++) {
            const int64_t n = shapes[s][0], k = shapes[s][1];
            const bool big = k > 10000;
            if (big && (t->isa < TREX_ISA_AVX512F || tr))
                continue; /* 3 GFLOP a run: the fast levels, one layout */
            mats m = mats_make(n, n, k, tr, !tr, seed++);
            const int64_t ldc = m.ldc, nc = n * ldc;
            for (int64_t i = 0; i < n; i++) /* a symmetric old C */
                for (int64_t j = 0; j < i; j++)
                    m.C0[j * ldc + i] = m.C0[i * ldc + j];
            float *C1 = xmalloc((size_t)nc * sizeof *C1), *C2 = xmalloc((size_t)nc * sizeof *C2);
            for (int f32 = 0; f32 < 2; f32++)
                for (size_t a = 0; a < sizeof ab / sizeof ab[0]; a++)
                    for (int pi = 0; pi < (big ? 1 : 3); pi++) {
                        if (big && (f32 || a == 2))
                            continue;
                        const float alpha = ab[a][0], beta = ab[a][1];
                        const void *X = f32 ? (const void *)m.Af : (const void *)m.Ab;
                        const trex_dtype in = f32 ? TREX_F32 : TREX_BF16;
                        const bool nan_above = a == 3; /* beta 1: C above the diagonal is never read */
                        memcpy(C1, m.C0, (size_t)nc * sizeof *C1);
                        const trex_gemm_problem p = {n, n, k, X, m.lda, X, m.lda, C1, ldc, NULL, 0};
                        trex_gemm_grouped_with(t, pool, NULL, in, tr, !tr, alpha, beta, &p, 1);
                        memcpy(C2, m.C0, (size_t)nc * sizeof *C2);
                        if (nan_above)
                            for (int64_t i = 0; i < n; i++)
                                for (int64_t j = i + 1; j < n; j++)
                                    C2[i * ldc + j] = NAN;
                        trex_gemm_syrk_with(t, pi == 0 ? pool : pools[pi - 1], (ws_toggle++ & 1) ? shared_ws : NULL,
                                            in, tr, n, k, alpha, X, m.lda, beta, C2, ldc, NULL, 0);
                        int64_t b = 0;
                        for (int64_t i = 0; i < n; i++)
                            for (int64_t j = 0; j < ldc; j++) {
                                const float got = C2[i * ldc + j];
                                const float want = j >= n ? m.C0[i * ldc + j] : j <= i ? C1[i * ldc + j]
                                                                                       : C2[j * ldc + i];
                                b += f32_bits(got) != f32_bits(want) || (j < n && isnan(got));
                            }
                        if (b && bad < 5)
                            fprintf(stderr, "%s syrk n=%lld k=%lld trans=%d %s alpha=%g beta=%g pool %d: %lld "
                                    "elements wrong\n", t->gemm_name, (long long)n, (long long)k, tr,
                                    f32 ? "f32" : "bf16", alpha, beta, pi, (long long)b);
                        bad += b;
                        runs++;
                    }
            free(C1);
            free(C2);
            mats_free(&m);
        }
    for (int i = 0; i < 2; i++)
        trex_pool_destroy(pools[i]);
    CHECK(bad == 0, "%s syrk: %lld elements differ from the full product's lower triangle or its mirror",
          t->gemm_name, (long long)bad);
    printf("%s: %lld symmetric products bit-identical to the full product below the diagonal, mirrored above\n",
           t->gemm_name, (long long)runs);
}

/* The public entries use the active table. */
static void test_public(trex_pool *pool)
{
    const trex_kernel_table *t = trex_kernels_table();
    mats m = mats_make(45, 67, 89, false, true, 55);
    float *C1 = xmalloc((size_t)(m.M * m.ldc) * sizeof *C1), *C2 = xmalloc((size_t)(m.M * m.ldc) * sizeof *C2);
    run_one(t, pool, &m, false, 1.0f, 0.0f, false, C1);
    memcpy(C2, m.C0, (size_t)(m.M * m.ldc) * sizeof *C2);
    trex_gemm_bf16(pool, shared_ws, false, true, m.M, m.N, m.K, 1.0f, m.Ab, m.lda, m.Bb, m.ldb, 0.0f,
                   C2, m.ldc);
    CHECK(memcmp(C1, C2, (size_t)(m.M * m.ldc) * sizeof *C1) == 0, "trex_gemm_bf16 uses the table");
    run_one(t, pool, &m, true, 1.0f, 1.0f, false, C1);
    memcpy(C2, m.C0, (size_t)(m.M * m.ldc) * sizeof *C2);
    trex_gemm_f32_bf16(pool, NULL, false, true, m.M, m.N, m.K, 1.0f, m.Af, m.lda, m.Bf, m.ldb, 1.0f,
                       C2, m.ldc);
    CHECK(memcmp(C1, C2, (size_t)(m.M * m.ldc) * sizeof *C1) == 0, "trex_gemm_f32_bf16 uses the table");
    uint16_t h[5];
    float back[5];
    const float v[5] = {1.0f, -2.5f, 3.14159f, 1e-40f, INFINITY};
    trex_cvt_f32_bf16(h, v, 5);
    trex_cvt_bf16_f32(back, h, 5);
    for (int i = 0; i < 5; i++)
        CHECK(h[i] == trex_f32_to_bf16(v[i]) && f32_bits(back[i]) == f32_bits(trex_bf16_to_f32(h[i])),
              "public conversion of %g", v[i]);
    free(C1);
    free(C2);
    mats_free(&m);
}

/* The fp32 GEMM (trex_gemm): every level's micro-kernel gives the reference's bits on random, special
 * (inf, NaN, subnormal, -0; NaNs compare as NaN) and long-K panels, and the framework with the active one gives, on awkward
 * shapes in all layouts, exactly the naive loop "s = 0; s += a*b for k increasing; alpha s + beta c". */
static void test_gemm_f32(const trex_kernel_table *const *lv, int nlv, trex_pool *pool)
{
    const int64_t MRr = TREX_F32_MR, NRr = TREX_F32_NR, Ks[] = {0, 1, 2, 7, 33, 257};
    uint64_t st = 99;
    float *ap = xmalloc((size_t)(257 * MRr) * sizeof *ap), *bp = xmalloc((size_t)(257 * NRr) * sizeof *bp);
    float *want = xmalloc((size_t)(MRr * NRr) * sizeof *want), *got = xmalloc((size_t)(MRr * NRr) * sizeof *got);
    const float specials[] = {INFINITY, -INFINITY, NAN, 1e-41f, -0.0f, 3e38f};
    for (int sp = 0; sp < 2; sp++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
            const int64_t K = Ks[ki];
            for (int64_t i = 0; i < K * MRr; i++)
                ap[i] = sp && i % 37 == 5 ? specials[i % 6] : rnd(&st);
            for (int64_t i = 0; i < K * NRr; i++)
                bp[i] = sp && i % 41 == 7 ? specials[i % 6] : rnd(&st) * (i % 5 == 0 ? 1e-3f : 1.0f);
            trex_gemm_f32_ukr_ref(K, ap, bp, want);
            for (int l = 0; l < nlv; l++) {
                memset(got, 0xff, (size_t)(MRr * NRr) * sizeof *got);
                lv[l]->gemm_f32_ukr(K, ap, bp, got);
                int64_t bad = 0; /* bits equal, or both NaN (which NaN operand propagates is the ISA's) */
                for (int64_t i = 0; i < MRr * NRr; i++)
                    bad += f32_bits(want[i]) != f32_bits(got[i]) && !(isnan(want[i]) && isnan(got[i]));
                CHECK(bad == 0, "fp32 micro-kernel %s, K=%lld, specials %d: %lld elements differ from the reference",
                      lv[l]->gemm_f32_name, (long long)K, sp, (long long)bad);
            }
        }
    free(ap);
    free(bp);
    free(want);
    free(got);
    const int64_t shapes[][3] = {{1, 1, 1}, {37, 71, 13}, {9, 33, 300}, {64, 200, 64}, {129, 97, 3}, {5, 1000, 40}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int lay = 0; lay < 4; lay++) {
            const bool ta = lay & 1, tb = lay & 2;
            const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            const int64_t lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 3;
            float *A = xmalloc((size_t)((ta ? K : M) * lda) * sizeof *A);
            float *B = xmalloc((size_t)((tb ? N : K) * ldb) * sizeof *B);
            float *C = xmalloc((size_t)(M * ldc) * sizeof *C), *R = xmalloc((size_t)(M * ldc) * sizeof *R);
            for (int64_t i = 0; i < (ta ? K : M) * lda; i++)
                A[i] = rnd(&st);
            for (int64_t i = 0; i < (tb ? N : K) * ldb; i++)
                B[i] = rnd(&st);
            for (int64_t i = 0; i < M * ldc; i++)
                C[i] = R[i] = rnd(&st);
            const float alpha = lay == 3 ? 0.75f : 1.0f, beta = (si & 1) ? 1.0f : 0.0f;
            trex_gemm(pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    float sum = 0.0f;
                    for (int64_t k = 0; k < K; k++) {
                        const float p = (ta ? A[k * lda + i] : A[i * lda + k]) *
                                        (tb ? B[j * ldb + k] : B[k * ldb + j]);
                        sum += p;
                    }
                    R[i * ldc + j] = beta == 0.0f ? alpha * sum : alpha * sum + beta * R[i * ldc + j];
                }
            CHECK(!memcmp(C, R, (size_t)(M * ldc) * sizeof *C),
                  "trex_gemm %lldx%lldx%lld ta=%d tb=%d: bits differ from the naive k-ordered loop",
                  (long long)M, (long long)N, (long long)K, ta, tb);
            free(A);
            free(B);
            free(C);
            free(R);
        }
}

/* The model's precision switch (trex_linear_*_ex, trex_gemm_ex): F32 is bit for bit the reference
 * trex_linear_* / trex_gemm; BF16 is bit for bit trex_gemm_f32_bf16 in the three layouts of a linear
 * layer (y = x W^T, dx (+)= dy W, dW += dy^T x), and within a bf16-input bound of fp32. */
static void test_linear_ex(trex_pool *pool)
{
    const int64_t n = 37, in = 45, out = 29;
    uint64_t st = 77;
    float *x = xmalloc((size_t)(n * in) * sizeof *x), *W = xmalloc((size_t)(out * in) * sizeof *W);
    float *dy = xmalloc((size_t)(n * out) * sizeof *dy);
    float *y[3], *dx[3], *dW[3]; /* 0: reference fp32, 1: _ex, 2: the direct bf16 GEMM */
    for (int64_t i = 0; i < n * in; i++)
        x[i] = rnd(&st);
    for (int64_t i = 0; i < out * in; i++)
        W[i] = rnd(&st);
    for (int64_t i = 0; i < n * out; i++)
        dy[i] = rnd(&st);
    for (int v = 0; v < 3; v++) {
        y[v] = xmalloc((size_t)(n * out) * sizeof *y[v]);
        dx[v] = xmalloc((size_t)(n * in) * sizeof *dx[v]);
        dW[v] = xmalloc((size_t)(out * in) * sizeof *dW[v]);
    }
    const size_t by = (size_t)(n * out) * sizeof(float), bx = (size_t)(n * in) * sizeof(float),
                 bw = (size_t)(out * in) * sizeof(float);
    for (int acc = 0; acc < 2; acc++) {
        /* fp32: the reference entries */
        for (int v = 0; v < 2; v++) {
            for (int64_t i = 0; i < n * in; i++)
                dx[v][i] = 0.5f * x[i];
            for (int64_t i = 0; i < out * in; i++)
                dW[v][i] = 0.25f * W[i];
        }
        trex_linear_forward(pool, y[0], x, W, n, in, out);
        trex_linear_backward(pool, dx[0], dW[0], dy, x, W, n, in, out, acc);
        trex_linear_forward_ex(pool, shared_ws, TREX_F32, y[1], x, W, n, in, out);
        trex_linear_backward_ex(pool, NULL, TREX_F32, dx[1], dW[1], dy, x, W, n, in, out, acc, true);
        CHECK(!memcmp(y[0], y[1], by) && !memcmp(dx[0], dx[1], bx) && !memcmp(dW[0], dW[1], bw),
              "linear_*_ex F32 (acc %d) is bit for bit trex_linear_*", acc);
        /* bf16: the same as the bf16 GEMM called directly */
        for (int v = 1; v < 3; v++) {
            for (int64_t i = 0; i < n * in; i++)
                dx[v][i] = 0.5f * x[i];
            for (int64_t i = 0; i < out * in; i++)
                dW[v][i] = 0.25f * W[i];
        }
        trex_linear_forward_ex(pool, shared_ws, TREX_BF16, y[1], x, W, n, in, out);
        trex_linear_backward_ex(pool, shared_ws, TREX_BF16, dx[1], dW[1], dy, x, W, n, in, out, acc, true);
        trex_gemm_f32_bf16(pool, NULL, false, true, n, out, in, 1.0f, x, in, W, in, 0.0f, y[2], out);
        trex_gemm_f32_bf16(pool, NULL, false, false, n, in, out, 1.0f, dy, out, W, in, acc ? 1.0f : 0.0f,
                           dx[2], in);
        trex_gemm_f32_bf16(pool, NULL, true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dW[2], in);
        CHECK(!memcmp(y[1], y[2], by) && !memcmp(dx[1], dx[2], bx) && !memcmp(dW[1], dW[2], bw),
              "linear_*_ex BF16 (acc %d) is bit for bit trex_gemm_f32_bf16", acc);
        /* ... and within |err| <= 2^-7 sum |a b| of fp32 (rounding both inputs costs <= 2^-8 relative
         * per product, fp32 sums far less at these K), but not equal to it */
        int64_t bad = 0, differ = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t o = 0; o < out; o++) {
                double sa = 0;
                for (int64_t k = 0; k < in; k++)
                    sa += fabs((double)x[r * in + k] * W[o * in + k]);
                const double e = fabs((double)y[1][r * out + o] - y[0][r * out + o]);
                bad += !(e <= 0x1p-7 * sa);
                differ += y[1][r * out + o] != y[0][r * out + o];
            }
        for (int64_t r = 0; r < n; r++)
            for (int64_t k = 0; k < in; k++) {
                double sa = acc ? fabs(0.5 * x[r * in + k]) * 0x1p-7 : 0.0;
                for (int64_t o = 0; o < out; o++)
                    sa += fabs((double)dy[r * out + o] * W[o * in + k]);
                bad += !(fabs((double)dx[1][r * in + k] - dx[0][r * in + k]) <= 0x1p-7 * sa);
            }
        for (int64_t o = 0; o < out; o++)
            for (int64_t k = 0; k < in; k++) {
                double sa = fabs(0.25 * W[o * in + k]) * 0x1p-7;
                for (int64_t r = 0; r < n; r++)
                    sa += fabs((double)dy[r * out + o] * x[r * in + k]);
                bad += !(fabs((double)dW[1][o * in + k] - dW[0][o * in + k]) <= 0x1p-7 * sa);
            }
        CHECK(bad == 0, "linear_*_ex BF16 (acc %d): %lld elements farther than 2^-7 sum|ab| from fp32",
              acc, (long long)bad);
        CHECK(differ > 0, "linear_*_ex BF16 (acc %d): equal to fp32: were the inputs rounded?", acc);
    }
    /* without dw_acc dW is written, not added to: NaN before, the bits of adding to zeros after */
    for (int bf = 0; bf < 2; bf++) {
        const trex_dtype dt = bf ? TREX_BF16 : TREX_F32;
        for (int64_t i = 0; i < out * in; i++) {
            dW[0][i] = 0.0f;
            dW[1][i] = NAN;
        }
        trex_linear_backward_ex(pool, shared_ws, dt, NULL, dW[0], dy, x, W, n, in, out, false, true);
        trex_linear_backward_ex(pool, shared_ws, dt, NULL, dW[1], dy, x, W, n, in, out, false, false);
        CHECK(!memcmp(dW[0], dW[1], bw), "linear_backward_ex %s without dw_acc: the bits of += on zeros",
              trex_dtype_name(dt));
    }
    for (int v = 0; v < 3; v++) {
        free(y[v]);
        free(dx[v]);
        free(dW[v]);
    }
    free(x);
    free(W);
    free(dy);
}

/* Inputs of the split tests: values of many magnitudes, tiny ones (1e-30 added) every fifth. */
static void split_fill(float *x, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        x[i] = (float)((i * 7919 % 1999) - 999) / 37.0f + (i % 5 == 0 ? 1e-30f : 0.0f);
}

/* The two bf16 terms of v that both splits write: hi = bf16(v), lo = bf16(v - hi). */
static void split_ref(float v, uint16_t *hi, uint16_t *lo)
{
    *hi = trex_f32_to_bf16(v);
    *lo = trex_f32_to_bf16(v - trex_bf16_to_f32(*hi));
}

/* trex_split_bf16x3_rows: each dst row holds hi = bf16(x) at hi0 and hi1 and lo = bf16(x - hi) at lo0,
 * for any row count and length (the bf16x3 operands of the LM head and the compressor). */
static void test_split3(trex_pool *pool)
{
    const int64_t shapes[][2] = {{1, 1}, {3, 5}, {7, 300}, {2, 1031}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], n = shapes[si][1];
        float *x = malloc((size_t)(rows * n) * sizeof *x);
        uint16_t *d = malloc((size_t)(rows * 3 * n) * sizeof *d);
        split_fill(x, rows * n);
        trex_split_bf16x3_rows(pool, d, x, rows, n, 0, n, 2 * n); /* [hi | lo | hi] */
        int64_t bad = 0;
        double worst = 0.0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t k = 0; k < n; k++) {
                const float v = x[r * n + k];
                uint16_t hi, lo;
                split_ref(v, &hi, &lo);
                const uint16_t *row = d + r * 3 * n;
                bad += row[k] != hi || row[2 * n + k] != hi || row[n + k] != lo;
                const double e = fabs((double)trex_bf16_to_f32(row[k]) + trex_bf16_to_f32(row[n + k]) - v);
                worst = e / (fabs(v) + 1e-300) > worst ? e / (fabs(v) + 1e-300) : worst;
            }
        CHECK(bad == 0, "split3 %" PRId64 "x%" PRId64 ": hi, lo, hi in place (%" PRId64 " wrong)", rows, n, bad);
        CHECK(worst <= 0x1p-16, "split3 %" PRId64 "x%" PRId64 ": hi + lo within 2^-16 of x (%.3g)", rows, n, worst);
        free(x);
        free(d);
    }
}

/* trex_split_bf16x2_rows: [hi | lo] rows with trex_split_bf16's bits, or with weight [hi | hi]; the last
 * shape's weight output is 64 MiB, which takes the streaming stores. */
static void test_split2(trex_pool *pool)
{
    const int64_t shapes[][2] = {{1, 1}, {3, 5}, {7, 300}, {2, 1031}, {2048, 8192}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], n = shapes[si][1];
        float *x = malloc((size_t)(rows * n) * sizeof *x);
        uint16_t *d = malloc((size_t)(rows * 2 * n) * sizeof *d);
        TREX_ASSERT(x && d);
        split_fill(x, rows * n);
        for (int weight = 0; weight < 2; weight++) {
            memset(d, 0xff, (size_t)(rows * 2 * n) * sizeof *d);
            trex_split_bf16x2_rows(pool, d, x, rows, n, weight);
            int64_t bad = 0;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t k = 0; k < n; k++) {
                    uint16_t hi, lo;
                    split_ref(x[r * n + k], &hi, &lo);
                    const uint16_t *row = d + r * 2 * n;
                    bad += row[k] != hi || row[n + k] != (weight ? hi : lo);
                }
            CHECK(bad == 0, "split2 %" PRId64 "x%" PRId64 " %s: %" PRId64 " values wrong", rows, n,
                  weight ? "[hi | hi]" : "[hi | lo]", bad);
        }
        free(x);
        free(d);
    }
}

/* ---- 10. bf16 x fp32 products (trex_gemm_bf16_f32b: the levels whose products are fp32 FMAs) ------- */

/* s, then fmaf(a_k, b_k, s) for k = 0 .. K-1: the bits every level with gemm_ukr_f32b must give (each
 * product of a bf16 and an fp32 value exact, one rounding per sum, increasing k). a_k is the first of
 * A's pair k (a + 2k as, b + k bs). */
static float fma_chain(float s, const uint16_t *a, int64_t as, const float *b, int64_t bs, int64_t K)
{
    for (int64_t k = 0; k < K; k++)
        s = fmaf(trex_bf16_to_f32(a[2 * k * as]), b[k * bs], s);
    return s;
}

/* fp32 values with all 24 bits of mantissa in use (no bf16 value is), of both signs. */
static float rnd_full(uint64_t *st)
{
    return rnd(st) * (1.0f + 0x1p-23f * (float)(rng_next(st) & 0x7fffff)) * 0.75f;
}

/* The micro-kernel on one panel pair, against fma_chain bit for bit: A's pairs hold each value twice
 * (its contract), B's dwords fp32 values; rows in use and accumulation as test_ukr. */
static void test_ukr_f32b(const trex_kernel_table *t)
{
    uint64_t st = 17;
    const int64_t kcs[] = {32, 64, 544, 1056};
    for (size_t ki = 0; ki < sizeof kcs / sizeof kcs[0]; ki++) {
        const int64_t kc = kcs[ki], kv = kc / 2;
        uint16_t *ap = xmalloc(32 * kc * sizeof *ap);
        float *bp = xmalloc(32 * kv * sizeof *bp);
        for (int64_t i = 0; i < 32 * kc; i += 2)
            ap[i] = ap[i + 1] = trex_f32_to_bf16(rnd(&st));
        for (int64_t i = 0; i < 32 * kv; i++)
            bp[i] = rnd_full(&st);
        enum { LDC = 48 };
        float c[32 * LDC] __attribute__((aligned(64))), c0[32 * LDC];
        for (int i = 0; i < 32 * LDC; i++)
            c0[i] = rnd(&st);
        const int row_cases[] = {0, 1, 15, 16, 17, 31};
        int64_t bad = 0, runs = 0;
        for (int ri = 0; ri < (int)(sizeof row_cases / sizeof row_cases[0]); ri++)
            for (int acc = 0; acc < 2; acc++, runs++) {
                const int used = row_cases[ri] ? row_cases[ri] : 32;
                memcpy(c, c0, sizeof c);
                const trex_ukr_c io = {.out = c, .ldo = LDC, .in = c, .ldi = LDC, .rows = row_cases[ri]};
                t->gemm_ukr_f32b(kc, ap, (const uint16_t *)(const void *)bp, &io,
                                 acc ? TREX_UKR_ACCUMULATE : TREX_UKR_STREAM);
                if (t->gemm_end)
                    t->gemm_end();
                for (int i = 0; i < 32; i++)
                    for (int j = 0; j < LDC; j++) {
                        const bool same = f32_bits(c[i * LDC + j]) == f32_bits(c0[i * LDC + j]);
                        if (j >= 32 || (i >= used && same)) {
                            bad += !same;
                            continue;
                        }
                        /* A (r, k) of the A format; B (r, q) at float q 32 + r */
                        float want = acc ? c0[i * LDC + j] : 0.0f;
                        for (int64_t q = 0; q < kv; q++)
                            want = fmaf(trex_bf16_to_f32(panel_a(ap, i, 2 * q)), bp[q * 32 + j], want);
                        bad += f32_bits(c[i * LDC + j]) != f32_bits(want);
                    }
            }
        CHECK(bad == 0, "%s fp32-pair micro-kernel kc=%lld: %lld runs, the fmaf chain's bits (%lld words wrong)",
              t->gemm_name, (long long)kc, (long long)runs, (long long)bad);
        free(ap);
        free(bp);
    }
}

/* The whole product on awkward shapes (1, primes, K odd and past the 512-k slice, empty, B cut into
 * column chunks and batches by the 12 MiB operand limit: 1 700 x 4 000), padded
 * leading dimensions, alpha and beta (beta 0 over NaN): every element is the fmaf chain's bits, then
 * alpha and beta as the framework applies them (sums from beta C when alpha is 1; else alpha s + beta
 * C), the padding untouched; with no pool and with the pool of 2 alike. */
static void test_gemm_f32b(const trex_kernel_table *t, trex_pool *pool)
{
    const int64_t shapes[][3] = {{1, 1, 1},    {1, 17, 3},   {5, 3, 0},     {0, 4, 3},    {4, 0, 3},
                                 {31, 33, 65}, {37, 29, 41}, {100, 7, 513}, {45, 70, 300}, {257, 263, 97},
                                 {70, 40, 1100}, {3, 1700, 4000}};
    const float ab[][2] = {{1, 0}, {1, 1}, {0.5f, -2}, {2, 0}, {1, -0.5f}};
    uint64_t st = 23;
    int64_t bad = 0, runs = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        const int64_t lda = 2 * K + 4, ldb = K + 3, ldc = N + 2;
        uint16_t *A = xmalloc((size_t)(M * lda) * sizeof *A);
        float *B = xmalloc((size_t)(N * ldb) * sizeof *B), *C0 = xmalloc((size_t)(M * ldc) * sizeof *C0);
        float *C = xmalloc((size_t)(M * ldc) * sizeof *C);
        for (int64_t i = 0; i < M * lda; i += 2)
            A[i] = A[i + 1] = trex_f32_to_bf16(rnd(&st));
        for (int64_t i = 0; i < N * ldb; i++)
            B[i] = rnd_full(&st);
        for (int64_t i = 0; i < M * ldc; i++)
            C0[i] = rnd(&st);
        for (size_t ai = 0; ai < sizeof ab / sizeof ab[0]; ai++)
            for (int pi = 0; pi < 2; pi++, runs++) {
                const float alpha = ab[ai][0], beta = ab[ai][1];
                memcpy(C, C0, (size_t)(M * ldc) * sizeof *C);
                for (int64_t i = 0; beta == 0.0f && i < M; i++)
                    for (int64_t j = 0; j < N; j++)
                        C[i * ldc + j] = NAN;
                trex_gemm_bf16_f32b_with(t, pi ? pool : NULL, (ws_toggle++ & 1) ? shared_ws : NULL, M, N, K, alpha,
                                         A, lda, B, ldb, beta, C, ldc);
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = 0; j < ldc; j++) {
                        const float c0 = C0[i * ldc + j], got = C[i * ldc + j];
                        if (j >= N) {
                            bad += f32_bits(got) != f32_bits(c0);
                            continue;
                        }
                        float want;
                        if (alpha == 1.0f) {
                            const float s0 = beta == 0.0f ? 0.0f : beta == 1.0f ? c0 : beta * c0;
                            want = fma_chain(s0, A + i * lda, 1, B + j * ldb, 1, K);
                        } else {
                            const float s = fma_chain(0.0f, A + i * lda, 1, B + j * ldb, 1, K);
                            want = beta == 0.0f ? alpha * s : alpha * s + beta * c0;
                        }
                        bad += f32_bits(got) != f32_bits(want);
                    }
            }
        free(A);
        free(B);
        free(C0);
        free(C);
    }
    CHECK(bad == 0, "%s bf16 x fp32 GEMM: %lld runs over %zu shapes, the fmaf chain's bits (%lld words wrong)",
          t->gemm_name, (long long)runs, sizeof shapes / sizeof shapes[0], (long long)bad);
}

/* trex_spread_bf16_rows: each value's bf16 rounding twice, for any row count and length; the public
 * product on the level in use reads it (where that level has the product). */
static void test_spread(trex_pool *pool)
{
    const int64_t shapes[][2] = {{1, 1}, {3, 5}, {7, 300}, {2, 1031}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], n = shapes[si][1];
        float *x = xmalloc((size_t)(rows * n) * sizeof *x);
        uint16_t *d = xmalloc((size_t)(rows * 2 * n) * sizeof *d);
        split_fill(x, rows * n);
        memset(d, 0xff, (size_t)(rows * 2 * n) * sizeof *d);
        trex_spread_bf16_rows(pool, d, x, rows, n);
        int64_t bad = 0;
        for (int64_t i = 0; i < rows * n; i++)
            bad += d[2 * i] != trex_f32_to_bf16(x[i]) || d[2 * i + 1] != d[2 * i];
        CHECK(bad == 0, "spread %" PRId64 "x%" PRId64 ": %" PRId64 " values wrong", rows, n, bad);
        free(x);
        free(d);
    }
    if (!trex_gemm_f32b_native()) {
        printf("skip: level %s has no bf16 x fp32 product (its callers split the fp32 operand)\n",
               trex_isa_name(trex_kernels_isa()));
        return;
    }
    enum { M = 40, N = 9, K = 77 };
    float *W = xmalloc(M * K * sizeof *W), *X = xmalloc(N * K * sizeof *X), *C = xmalloc(M * N * sizeof *C);
    uint16_t *A = xmalloc(M * 2 * K * sizeof *A);
    uint64_t st = 29;
    for (int i = 0; i < M * K; i++)
        W[i] = rnd_full(&st);
    for (int i = 0; i < N * K; i++)
        X[i] = rnd_full(&st);
    trex_spread_bf16_rows(pool, A, W, M, K);
    trex_gemm_bf16_f32b(pool, NULL, M, N, K, 1.0f, A, 2 * K, X, K, 0.0f, C, N);
    int64_t bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            bad += f32_bits(C[i * N + j]) != f32_bits(fma_chain(0.0f, A + i * 2 * K, 1, X + j * K, 1, K));
    CHECK(bad == 0, "trex_gemm_bf16_f32b on the spread weight (level %s): %lld of %d wrong",
          trex_isa_name(trex_kernels_isa()), (long long)bad, M * N);
    free(W);
    free(X);
    free(C);
    free(A);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--child"))
        return child_main();
    if (argc > 1 && !strcmp(argv[1], "--child-f32b"))
        return child_f32b();
    test_dispatch(argc > 0 ? argv[0] : "/proc/self/exe");
    const trex_kernel_table *lv[TREX_ISA_COUNT];
    const int n = levels(lv);
    trex_pool *pool = trex_pool_create(2);
    CHECK(pool != NULL, "pool of 2 threads");
    shared_ws = trex_gemm_ws_create();
    CHECK(shared_ws != NULL && trex_gemm_ws_bytes(shared_ws) == 0, "empty workspace");
    for (int i = 0; i < n; i++) {
        printf("level %s: gemm %s, pack %s, cvt %s\n", trex_isa_name(lv[i]->isa), lv[i]->gemm_name,
               lv[i]->pack_name, lv[i]->cvt_name);
        const trex_kernel_table *a = lv[i], *b = i > 0 ? lv[i - 1] : NULL;
        if (b && a->gemm_ukr == b->gemm_ukr && a->gemm_tile_t == b->gemm_tile_t && a->pack_a_bf16 == b->pack_a_bf16 &&
            a->pack_a_f32 == b->pack_a_f32 && a->pack_b_bf16 == b->pack_b_bf16 &&
            a->pack_b_f32 == b->pack_b_f32 && a->cvt_f32_bf16 == b->cvt_f32_bf16 &&
            a->cvt_bf16_f32 == b->cvt_bf16_f32 && a->gemm_ukr_f32b == b->gemm_ukr_f32b) {
            printf("skip: level %s has the same entries as level %s (no leaf of its own yet): "
                   "tested above\n", trex_isa_name(a->isa), trex_isa_name(b->isa));
            continue;
        }
        test_convert(lv[i]);
        test_pack(lv[i], lv[0]);
        test_ukr(lv[i]);
        test_tile_t(lv[i]);
        test_gemm(lv[i], pool);
        test_grouped(lv[i], pool);
        test_prepacked(lv[i], lv[0], pool);
        test_prepacked_a(lv[i], lv[0], pool);
        test_syrk(lv[i], pool);
        test_gemm_d(lv[i], pool);
        test_pack_range(lv[i], pool);
        test_gathered(lv[i], pool);
        test_ksplit(lv[i], pool);
        test_determinism(lv[i]);
        if (lv[i]->gemm_ukr_f32b) {
            test_ukr_f32b(lv[i]);
            test_gemm_f32b(lv[i], pool);
        }
    }
    test_ukr_fma_levels();
    test_chunked(lv[n - 1], pool);
    for (int i = 0; i < n; i++)
        if (lv[i]->isa >= TREX_ISA_AVX512F)
            test_stream(lv[i], pool);
    test_public(pool);
    test_prepacked_public(pool);
    test_prepacked_a_public(pool);
    test_linear_ex(pool);
    test_split3(pool);
    test_split2(pool);
    test_spread(pool);
    test_gemm_f32(lv, n, pool);
    CHECK(trex_gemm_ws_bytes(shared_ws) > 0, "the shared workspace was used");
    trex_gemm_ws_destroy(shared_ws);
    trex_gemm_ws_destroy(NULL);
    trex_pool_destroy(pool);
    return check_summary();
}
