/* tests/test_ce.c — the cross-entropy entries of the LM head in bf16 mode (kernels/fused.h
 * "Cross-entropy"): every level against the reference bit for bit, and the reference against double
 * precision with stated bounds, on awkward shapes (1 row, 1 column, odd counts, columns not a
 * multiple of 16, -inf / large / NaN logits, subnormal results), the gradient written in place; and
 * the head's bf16x3 split (split3, trex_split_bf16x3_rows) bit for bit against its definition.
 *
 * `test_ce --bench [reps]` instead times ce_fwd + ce_grad of each level on one chunk of the dsv4-bench
 * head (129 280 x 512, in the model's vocabulary blocks), one thread. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "fused_levels.h"
#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "trex/pool.h"
#include "trex/tensor.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}
static double nrand(void)
{
    const double u = urand() + 1e-300, v = urand();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
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

/* ce_exp against libm's double exp: ulp of the result for normal results, absolute error in units of
 * 2^-149 for subnormal ones; every level's bits equal the reference's. */
static void test_exp(const trex_fused_table *const *lv, int nl)
{
    const trex_fused_table *ref = lv[0];
    double worst = 0.0, worst_sub = 0.0, worst_x = 0.0;
    int64_t count = 0, diff = 0;
    /* every 997th float in [-104, -0] (bit patterns 0x80000000 .. 0xc2d00000), plus the ends */
    for (uint64_t u = 0x80000000u; u <= 0xc2d00000u; u += 997) {
        const float x = bits_f32((uint32_t)u);
        const float e = ref->ce_exp(x);
        const double t = exp((double)x);
        if (t >= 0x1p-126) {
            const double ulp = ldexp(1.0, ilogb(t) - 23);
            const double err = fabs((double)e - t) / ulp;
            if (err > worst) {
                worst = err;
                worst_x = x;
            }
        } else {
            const double err = fabs((double)e - t) / 0x1p-149;
            worst_sub = err > worst_sub ? err : worst_sub;
        }
        for (int k = 1; k < nl; k++)
            diff += f32_bits(lv[k]->ce_exp(x)) != f32_bits(e);
        count++;
    }
    printf("ce_exp: %lld arguments in [-104, 0]: max error %.3f ulp (at x = %.9g), subnormal results %.3f x "
           "2^-149\n",
           (long long)count, worst, worst_x, worst_sub);
    CHECK(worst <= TREX_CE_EXP_ULP, "ce_exp error %.3f ulp > %d", worst, TREX_CE_EXP_ULP);
    CHECK(worst_sub <= 1.0, "ce_exp subnormal error %.3f x 2^-149", worst_sub);
    CHECK(diff == 0, "ce_exp: %lld arguments where a level differs from the reference", (long long)diff);
    const float special[] = {0.0f, -0.0f, -1e-30f, -0x1p-149f, -87.3365f, -103.27893f, -103.97f, -104.0f,
                             -104.5f, -200.0f, -INFINITY};
    for (size_t s = 0; s < sizeof special / sizeof *special; s++) {
        const float x = special[s], e = ref->ce_exp(x);
        const double t = exp((double)x);
        CHECK(fabs((double)e - t) <= (t >= 0x1p-126 ? TREX_CE_EXP_ULP * ldexp(1.0, ilogb(t) - 23) : 0x1p-149),
              "ce_exp(%g) = %.9g, exp = %.9g", (double)x, (double)e, t);
        for (int k = 1; k < nl; k++)
            CHECK(f32_bits(lv[k]->ce_exp(x)) == f32_bits(e), "%s ce_exp(%g)", lv[k]->name, (double)x);
    }
    CHECK(ref->ce_exp(0.0f) == 1.0f, "exp(0) = %.9g", (double)ref->ce_exp(0.0f));
    CHECK(isnan(ref->ce_exp(NAN)), "exp(NaN) is NaN");
    for (int k = 1; k < nl; k++)
        CHECK(isnan(lv[k]->ce_exp(NAN)), "%s exp(NaN) is NaN", lv[k]->name);
}

/* Logits [n, ld] of cols columns: normal N(0, 4) with a few large ones; kind 1 adds -inf entries and a
 * column of equal values; kind 2 puts a NaN in column 0. */
static void fill_logits(float *L, int64_t n, int64_t ld, int64_t cols, int kind)
{
    for (int64_t v = 0; v < n; v++)
        for (int64_t i = 0; i < ld; i++) {
            double x = 4.0 * nrand();
            if (urand() < 0.01)
                x = (urand() < 0.5 ? 60.0 : -90.0) + 10.0 * urand();
            L[v * ld + i] = i < cols ? (float)x : 1e30f; /* columns beyond cols must not be touched */
        }
    if (kind == 1) {
        for (int64_t v = 0; v < n; v++) {
            if (urand() < 0.2)
                L[v * ld + (v % cols)] = -INFINITY;
            L[v * ld + cols - 1] = 2.5f;
        }
    }
    if (kind == 2)
        L[(n / 2) * ld] = NAN;
}

static void test_fwd(const trex_fused_table *const *lv, int nl, int64_t n, int64_t cols, int64_t ld, int kind)
{
    const size_t sz = (size_t)(n * ld);
    float *L0 = malloc(sz * sizeof(float)), *L = malloc(sz * sizeof(float)), *Lr = malloc(sz * sizeof(float));
    float *mx = malloc((size_t)cols * sizeof(float)), *mxr = malloc((size_t)cols * sizeof(float));
    double *sum = malloc((size_t)cols * sizeof(double)), *sumr = malloc((size_t)cols * sizeof(double));
    fill_logits(L0, n, ld, cols, kind);
    for (int keep = 0; keep <= 1; keep++) {
        memcpy(Lr, L0, sz * sizeof(float));
        lv[0]->ce_fwd(Lr, ld, n, cols, keep, mxr, sumr);
        /* the reference against double precision */
        int bad_max = 0, bad_sum = 0, bad_e = 0, untouched = 1;
        double worst = 0.0;
        for (int64_t i = 0; i < cols; i++) {
            double m = -INFINITY;
            bool nan = false;
            for (int64_t v = 0; v < n; v++) {
                const double x = L0[v * ld + i];
                nan |= isnan(x);
                m = x > m ? x : m;
            }
            if (nan) {
                bad_sum += !isnan(sumr[i]);
                continue;
            }
            bad_max += (double)mxr[i] != m;
            /* each term: the float subtraction (|x| 2^-24), the exp (TREX_CE_EXP_ULP ulp), the float
             * value's own rounding; the double sum adds n 2^-53 */
            double s = 0.0, tol = 0.0;
            for (int64_t v = 0; v < n; v++) {
                const double x = (double)L0[v * ld + i] - m, e = exp(x);
                s += e;
                const double te = (e > 0.0 ? e * (fabs(x) + TREX_CE_EXP_ULP + 1.0) * 0x1p-24 : 0.0) + 0x1p-149;
                tol += te;
                if (keep)
                    bad_e += !(fabs((double)Lr[v * ld + i] - e) <= te);
            }
            tol += s * (double)n * 0x1p-53;
            const double err = fabs(sumr[i] - s);
            worst = err / s > worst ? err / s : worst;
            bad_sum += !(err <= tol);
        }
        for (int64_t v = 0; v < n; v++)
            for (int64_t i = cols; i < ld; i++)
                untouched &= Lr[v * ld + i] == 1e30f;
        CHECK(bad_max == 0, "n %lld cols %lld kind %d: %d column maxima wrong", (long long)n, (long long)cols, kind,
              bad_max);
        CHECK(bad_sum == 0, "n %lld cols %lld kind %d keep %d: %d column sums outside the bound (worst rel %.3g)",
              (long long)n, (long long)cols, kind, keep, bad_sum, worst);
        CHECK(bad_e == 0, "n %lld cols %lld kind %d: %d kept exp values outside the bound", (long long)n,
              (long long)cols, kind, bad_e);
        CHECK(untouched, "n %lld cols %lld: columns beyond cols were written", (long long)n, (long long)cols);
        if (!keep)
            CHECK(!memcmp(Lr, L0, sz * sizeof(float)), "keep 0 left L unchanged");
        /* every level gives the reference's bits */
        for (int k = 1; k < nl; k++) {
            memcpy(L, L0, sz * sizeof(float));
            lv[k]->ce_fwd(L, ld, n, cols, keep, mx, sum);
            int same = !memcmp(L, Lr, sz * sizeof(float)) || kind == 2; /* NaN payloads may differ */
            for (int64_t i = 0; i < cols; i++) {
                same &= f32_bits(mx[i]) == f32_bits(mxr[i]) || (isnan(mx[i]) && isnan(mxr[i]));
                same &= memcmp(&sum[i], &sumr[i], sizeof(double)) == 0 || (isnan(sum[i]) && isnan(sumr[i]));
            }
            CHECK(same, "%s ce_fwd n %lld cols %lld ld %lld kind %d keep %d differs from the reference",
                  lv[k]->name, (long long)n, (long long)cols, (long long)ld, kind, keep);
        }
    }
    free(L0), free(L), free(Lr), free(mx), free(mxr), free(sum), free(sumr);
}

static void test_grad(const trex_fused_table *const *lv, int nl, int64_t n, int64_t cols, int64_t lde)
{
    const size_t sz = (size_t)(n * lde);
    float *E = malloc(sz * sizeof(float)), *Ein = malloc(sz * sizeof(float)), *c = malloc((size_t)cols * sizeof(float));
    uint16_t *ref = malloc((size_t)(n * cols) * sizeof(uint16_t)), *out = malloc((size_t)(n * cols) * sizeof(uint16_t));
    for (int64_t v = 0; v < n; v++)
        for (int64_t i = 0; i < lde; i++)
            E[v * lde + i] = i < cols ? (float)urand() : NAN; /* padding beyond cols: never read */
    E[0] = 0x1p-140f;                                         /* a subnormal product below */
    for (int64_t i = 0; i < cols; i++)
        c[i] = urand() < 0.2 ? 0.0f : (float)(urand() * 1e-3);
    c[0] = 0x1p-10f;
    if (cols > 2) { /* a zero factor hides a NaN (a token without a target); a NaN factor propagates */
        E[2] = NAN;
        c[2] = 0.0f;
    }
    /* the reference's definition */
    lv[0]->ce_grad(ref, cols, E, lde, n, cols, c);
    int bad = 0;
    for (int64_t v = 0; v < n; v++)
        for (int64_t i = 0; i < cols; i++) {
            const uint16_t want = c[i] != 0.0f ? trex_f32_to_bf16(E[v * lde + i] * c[i]) : 0;
            bad += ref[v * cols + i] != want;
        }
    CHECK(bad == 0, "ce_grad ref n %lld cols %lld: %d values differ from bf16(e c)", (long long)n, (long long)cols,
          bad);
    for (int k = 0; k < nl; k++) {
        lv[k]->ce_grad(out, cols, E, lde, n, cols, c);
        CHECK(!memcmp(out, ref, (size_t)(n * cols) * sizeof(uint16_t)), "%s ce_grad n %lld cols %lld differs",
              lv[k]->name, (long long)n, (long long)cols);
        /* in place: dst row v over E row v (ldd = 2 lde) */
        memcpy(Ein, E, sz * sizeof(float));
        uint16_t *dst = (uint16_t *)(void *)Ein;
        lv[k]->ce_grad(dst, 2 * lde, Ein, lde, n, cols, c);
        int same = 1;
        for (int64_t v = 0; v < n; v++)
            same &= !memcmp(dst + v * 2 * lde, ref + v * cols, (size_t)cols * sizeof(uint16_t));
        CHECK(same, "%s ce_grad in place n %lld cols %lld differs", lv[k]->name, (long long)n, (long long)cols);
    }
    free(E), free(Ein), free(c), free(ref), free(out);
}

/* split3 (the head's bf16x3 operands) at every level against its definition bit for bit, both plane
 * orders, with and without streaming stores, on 64-byte aligned and unaligned rows, and the model's
 * entry point (kernels.h trex_split_bf16x3_rows, over a pool) against trex_split_bf16; the values
 * include NaNs with payloads, infinities, signed zeros, subnormals, bf16 ties and overflow to inf. */
static void test_split(const trex_fused_table *const *lv, int nl, trex_pool *pool, int64_t rows, int64_t n)
{
    const int64_t cnt = rows * n;
    float *x = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof(float));
    const size_t dbytes = (size_t)(3 * cnt + 64) * sizeof(uint16_t);
    uint16_t *want = malloc(dbytes), *base = aligned_alloc(64, (dbytes + 63) / 64 * 64), *hl = malloc((size_t)(n + 1) * 4);
    static const uint32_t special[] = {0x7fc00001u, 0xff800123u, 0x7f800000u, 0xff800000u, 0x80000000u, 0x00000001u,
                                       0x807fffffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x00800000u, 0x3f7fffffu};
    for (int64_t i = 0; i < cnt; i++)
        x[i] = (i * 7) % 11 == 3 ? bits_f32(special[(i / 11) % 12]) : (float)(nrand() * pow(2.0, 40 * urand() - 20));
    static const int64_t order[2][3] = {{0, 1, 2}, {0, 2, 1}}; /* [hi | lo | hi], [hi | hi | lo] (in units of n) */
    for (int o = 0; o < 2; o++) {
        const int64_t hi0 = order[o][0] * n, lo0 = order[o][1] * n, hi1 = order[o][2] * n;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < n; i++) {
                const float v = x[r * n + i];
                const uint16_t h = trex_f32_to_bf16(v);
                want[r * 3 * n + hi0 + i] = want[r * 3 * n + hi1 + i] = h;
                want[r * 3 * n + lo0 + i] = trex_f32_to_bf16(v - bits_f32((uint32_t)h << 16));
            }
        for (int k = 0; k < nl; k++)
            for (int nt = 0; nt < 2; nt++)
                for (int off = 0; off < 2; off++) { /* off: the rows start 2 bytes past a 64-byte line */
                    uint16_t *d = base + off;
                    memset(base, 0xab, dbytes);
                    lv[k]->split3(d, x, rows, n, hi0, lo0, hi1, nt);
                    CHECK(!memcmp(d, want, (size_t)(3 * cnt) * sizeof(uint16_t)) && base[3 * cnt + off] == 0xabab &&
                              (off == 0 || base[0] == 0xabab),
                          "%s split3 rows %lld n %lld order %d nt %d offset %d differs", lv[k]->name, (long long)rows,
                          (long long)n, o, nt, off);
                }
        trex_split_bf16x3_rows(pool, base, x, rows, n, hi0, lo0, hi1);
        int same = !memcmp(base, want, (size_t)(3 * cnt) * sizeof(uint16_t));
        for (int64_t r = 0; r < rows && same; r++) { /* and the two-plane split of the kernels' table */
            trex_split_bf16(hl, hl + n, x + r * n, n);
            same = !memcmp(hl, want + r * 3 * n + hi0, (size_t)n * 2) && !memcmp(hl + n, want + r * 3 * n + lo0, (size_t)n * 2);
        }
        CHECK(same, "trex_split_bf16x3_rows / trex_split_bf16 rows %lld n %lld order %d differ", (long long)rows,
              (long long)n, o);
    }
    free(x), free(want), free(base), free(hl);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One chunk of the dsv4-bench head: [129 280, 512] logits, vocabulary blocks of 256 rows. */
static int bench(int reps)
{
    const int64_t V = 129280, cols = 512, blk = 256, nb = (V + blk - 1) / blk;
    float *L0 = malloc((size_t)(V * cols) * sizeof(float)), *L = malloc((size_t)(V * cols) * sizeof(float));
    float *mx = malloc((size_t)(nb * cols) * sizeof(float)), *c = malloc((size_t)cols * sizeof(float));
    double *sum = malloc((size_t)(nb * cols) * sizeof(double));
    for (int64_t i = 0; i < V * cols; i++)
        L0[i] = (float)(0.6 * nrand());
    for (int64_t i = 0; i < cols; i++)
        c[i] = 1e-7f;
    const trex_fused_table *lv[TREX_ISA_COUNT];
    const int nl = fused_levels(trex_fused_for(TREX_ISA_REF), lv);
    for (int k = 0; k < nl; k++)
        for (int r = 0; r < reps; r++) {
            memcpy(L, L0, (size_t)(V * cols) * sizeof(float));
            const double t0 = now();
            for (int64_t b = 0; b < nb; b++) {
                const int64_t v0 = b * blk, vn = V - v0 < blk ? V - v0 : blk;
                lv[k]->ce_fwd(L + v0 * cols, cols, vn, cols, 1, mx + b * cols, sum + b * cols);
            }
            const double t1 = now();
            lv[k]->ce_grad((uint16_t *)(void *)L, 2 * cols, L, cols, V, cols, c);
            const double t2 = now();
            printf("%-7s ce_fwd %7.1f ms  ce_grad %7.1f ms  (%.2f + %.2f GB/s of fp32 logits)\n", lv[k]->name,
                   1e3 * (t1 - t0), 1e3 * (t2 - t1), 4e-9 * (double)(V * cols) / (t1 - t0),
                   4e-9 * (double)(V * cols) / (t2 - t1));
        }
    free(L0), free(L), free(mx), free(c), free(sum);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--bench"))
        return bench(argc >= 3 ? atoi(argv[2]) : 3);
    const trex_fused_table *lv[TREX_ISA_COUNT];
    const int nl = fused_levels(trex_fused_for(TREX_ISA_REF), lv);
    CHECK(lv[0]->isa == TREX_ISA_REF, "the first table is the reference");
    test_exp(lv, nl);
    const int64_t shapes[][3] = {{1, 1, 1}, {1, 17, 19}, {3, 5, 5}, {7, 33, 40}, {2, 16, 16},
                                 {256, 64, 66}, {257, 31, 32}, {100, 513, 514}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int kind = 0; kind < 3; kind++)
            test_fwd(lv, nl, shapes[s][0], shapes[s][1], shapes[s][2], kind);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        test_grad(lv, nl, shapes[s][0], shapes[s][1], shapes[s][2]);
    trex_pool *pool = trex_pool_create(2);
    const int64_t split_shapes[][2] = {{0, 8}, {1, 1}, {3, 17}, {2, 31}, {5, 32}, {4, 33}, {3, 64}, {9, 100}, {2, 1024}};
    for (size_t s = 0; s < sizeof split_shapes / sizeof *split_shapes; s++)
        test_split(lv, nl, pool, split_shapes[s][0], split_shapes[s][1]);
    trex_pool_destroy(pool);
    return check_summary();
}
