/* tests/test_fused.c — every level of the fused-kernel table (kernels/fused.h) against the reference
 * entries, bit for bit, on awkward shapes (1, primes, lengths that are not multiples of 16, n = 0,
 * entries scattered in memory and given in any order), plus a check that the reference entries are
 * the model's scalar code (model/attention_math.h, model/mhc_real.h) and not something else.
 *
 * `test_fused --bench [reps]` instead times each entry of each level on dsv4-bench's shapes (16 heads of
 * 512, 256 entries per query in the forward and the query side, 16 per key-side tile; mHC 4 x 1024) in
 * CPU time of the calling thread, and prints the medians (docs/perf.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "kernels/fused.h"

#define AM_REAL float
#define AM_SFX f
#include "model/attention_math.h"

#define MHC_REAL float
#define MHC_SUFFIX f
#define MHC_EXP expf
#define MHC_SQRT sqrtf
#include "model/mhc_real.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fill(float *v, int64_t n, float amp)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = amp * frand();
}

static int same_bits(const float *a, const float *b, int64_t n)
{
    return n == 0 || memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

static float *xmalloc_f(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* The attention entries of table t against the reference on one shape. */
static void check_sattn(const trex_fused_table *t, const trex_fused_table *r, int64_t n, int64_t H,
                        int64_t c)
{
    const int64_t pool_rows = n + 7;
    float *pool = xmalloc_f(pool_rows * c), *q = xmalloc_f(H * c), *g = xmalloc_f(H * c);
    float *sink = xmalloc_f(H), *ws = xmalloc_f(TREX_FUSED_SATTN_WS(n, H));
    const float **V = malloc((size_t)(n + 1) * sizeof *V);
    float **dV1 = malloc((size_t)(n + 1) * sizeof *dV1), **dV2 = malloc((size_t)(n + 1) * sizeof *dV2);
    float *dpool1 = xmalloc_f(n * c), *dpool2 = xmalloc_f(n * c);
    if (!V || !dV1 || !dV2) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    fill(pool, pool_rows * c, 2.0f);
    fill(q, H * c, 1.5f);
    fill(g, H * c, 1.0f);
    fill(sink, H, 1.0f);
    /* entries scattered over the pool in a shuffled order (rows may not be adjacent or ascending) */
    for (int64_t e = 0; e < n; e++)
        V[e] = pool + ((e * 5 + 3) % pool_rows) * c;
    const float scale = 1.0f / sqrtf((float)c);
    float *o1 = xmalloc_f(H * c), *o2 = xmalloc_f(H * c), *lse1 = xmalloc_f(H), *lse2 = xmalloc_f(H);
    float *z1 = xmalloc_f(H * n), *z2 = xmalloc_f(H * n);
    r->sattn_fwd(o1, lse1, z1, ws, q, V, n, H, c, sink, scale);
    t->sattn_fwd(o2, lse2, z2, ws, q, V, n, H, c, sink, scale);
    CHECK(same_bits(o1, o2, H * c) && same_bits(lse1, lse2, H) && same_bits(z1, z2, H * n),
          "%s sattn_fwd n=%lld H=%lld c=%lld", t->name, (long long)n, (long long)H, (long long)c);

    float *D = xmalloc_f(H), *dq1 = xmalloc_f(H * c), *dq2 = xmalloc_f(H * c);
    float *ds1 = xmalloc_f(H), *ds2 = xmalloc_f(H), *P1 = xmalloc_f(H * n), *P2 = xmalloc_f(H * n);
    for (int64_t h = 0; h < H; h++)
        D[h] = r->dot(g + h * c, o1 + h * c, c);
    r->sattn_bwd_query(dq1, ds1, P1, ws, g, q, V, n, H, c, sink, scale, lse1, D);
    t->sattn_bwd_query(dq2, ds2, P2, ws, g, q, V, n, H, c, sink, scale, lse1, D);
    CHECK(same_bits(dq1, dq2, H * c) && same_bits(ds1, ds2, H) && same_bits(P1, P2, H * n),
          "%s sattn_bwd_query n=%lld H=%lld c=%lld", t->name, (long long)n, (long long)H,
          (long long)c);
    t->sattn_bwd_query(dq2, ds2, NULL, ws, g, q, V, n, H, c, sink, scale, lse1, D);
    CHECK(same_bits(dq1, dq2, H * c), "%s sattn_bwd_query without P", t->name);

    float *ps1 = xmalloc_f(n), *ps2 = xmalloc_f(n);
    fill(dpool1, n * c, 0.5f);
    memcpy(dpool2, dpool1, (size_t)(n * c) * sizeof(float));
    for (int64_t e = 0; e < n; e++) {
        dV1[e] = dpool1 + e * c;
        dV2[e] = dpool2 + e * c;
    }
    r->sattn_bwd_entries(dV1, ps1, ws, V, n, q, g, H, c, scale, lse1, D);
    t->sattn_bwd_entries(dV2, ps2, ws, V, n, q, g, H, c, scale, lse1, D);
    CHECK(same_bits(dpool1, dpool2, n * c) && same_bits(ps1, ps2, n),
          "%s sattn_bwd_entries n=%lld H=%lld c=%lld", t->name, (long long)n, (long long)H,
          (long long)c);
    free(pool), free(q), free(g), free(sink), free(ws), free(V), free(dV1), free(dV2);
    free(dpool1), free(dpool2), free(o1), free(o2), free(lse1), free(lse2), free(z1), free(z2);
    free(D), free(dq1), free(dq2), free(ds1), free(ds2), free(P1), free(P2), free(ps1), free(ps2);
}

static void check_mhc(const trex_fused_table *t, const trex_fused_table *r, int n, int64_t d)
{
    float *X = xmalloc_f(n * d), *y = xmalloc_f(d), *post = xmalloc_f(n), *comb = xmalloc_f(n * n);
    float *o1 = xmalloc_f(n * d), *o2 = xmalloc_f(n * d);
    fill(X, n * d, 3.0f);
    fill(y, d, 2.0f);
    fill(post, n, 1.0f);
    fill(comb, n * n, 1.0f);
    r->mhc_post_fwd(n, d, post, comb, y, X, o1);
    t->mhc_post_fwd(n, d, post, comb, y, X, o2);
    CHECK(same_bits(o1, o2, n * d), "%s mhc_post_fwd n=%d d=%lld", t->name, n, (long long)d);
    r->mhc_collapse(n, d, post, X, o1);
    t->mhc_collapse(n, d, post, X, o2);
    CHECK(same_bits(o1, o2, d), "%s mhc_collapse n=%d d=%lld", t->name, n, (long long)d);
    float *dXo = xmalloc_f(n * d), *dy1 = xmalloc_f(d), *dy2 = xmalloc_f(d);
    float p1[8], p2[8], c1[64], c2[64];
    fill(dXo, n * d, 1.0f);
    r->mhc_post_bwd(n, d, post, comb, y, X, dXo, dy1, o1, p1, c1);
    t->mhc_post_bwd(n, d, post, comb, y, X, dXo, dy2, o2, p2, c2);
    CHECK(same_bits(dy1, dy2, d) && same_bits(o1, o2, n * d) && same_bits(p1, p2, n) &&
          same_bits(c1, c2, n * n), "%s mhc_post_bwd n=%d d=%lld", t->name, n, (long long)d);
    fill(o1, n * d, 1.0f);
    memcpy(o2, o1, (size_t)(n * d) * sizeof(float));
    r->mhc_collapse_bwd(n, d, post, X, y, p1, o1);
    t->mhc_collapse_bwd(n, d, post, X, y, p2, o2);
    CHECK(same_bits(o1, o2, n * d) && same_bits(p1, p2, n), "%s mhc_collapse_bwd n=%d d=%lld",
          t->name, n, (long long)d);
    free(X), free(y), free(post), free(comb), free(o1), free(o2), free(dXo), free(dy1), free(dy2);
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { BENCH_MAX_REPS = 101 };

/* Median CPU seconds of one call of `what` over reps repetitions of `inner` calls. */
#define BENCH(label, inner, call)                                                            \
    do {                                                                                     \
        double tm_[BENCH_MAX_REPS];                                                          \
        for (int r_ = 0; r_ < reps; r_++) {                                                  \
            double t0_ = cpu_now();                                                          \
            for (int i_ = 0; i_ < (inner); i_++)                                             \
                call;                                                                        \
            tm_[r_] = (cpu_now() - t0_) / (inner);                                           \
        }                                                                                    \
        qsort(tm_, (size_t)reps, sizeof tm_[0], cmp_double);                                 \
        printf("%-8s %-22s %10.2f us\n", t->name, (label), 1e6 * tm_[reps / 2]);            \
    } while (0)

static int bench(int reps)
{
    const int64_t H = 16, c = 512, n = 256, nk = 16, d = 1024;
    const int mh = 4;
    float *pool = xmalloc_f(n * c), *q = xmalloc_f(H * c), *g = xmalloc_f(H * c), *sink = xmalloc_f(H);
    float *ws = xmalloc_f(TREX_FUSED_SATTN_WS(n, H)), *o = xmalloc_f(H * c), *lse = xmalloc_f(H);
    float *z = xmalloc_f(H * n), *D = xmalloc_f(H), *dq = xmalloc_f(H * c), *ds = xmalloc_f(H);
    float *P = xmalloc_f(H * n), *ps = xmalloc_f(n), *dpool = xmalloc_f(nk * c);
    float *X = xmalloc_f(mh * d), *y = xmalloc_f(d), *Xo = xmalloc_f(mh * d), *dX = xmalloc_f(mh * d);
    float post[4], comb[16], dpost[4], dcomb[16];
    const float *V[256];
    float *dV[16];
    fill(pool, n * c, 2.0f), fill(q, H * c, 1.5f), fill(g, H * c, 1.0f), fill(sink, H, 1.0f);
    fill(X, mh * d, 1.0f), fill(y, d, 1.0f), fill(post, 4, 1.0f), fill(comb, 16, 1.0f);
    fill(dpool, nk * c, 0.1f);
    for (int64_t e = 0; e < n; e++)
        V[e] = pool + e * c;
    for (int64_t e = 0; e < nk; e++)
        dV[e] = dpool + e * c;
    const float scale = 1.0f / sqrtf((float)c);
    const trex_isa caps[] = {TREX_ISA_REF, TREX_ISA_AMX};
    printf("median CPU time per call, %d repetitions (H %lld, c %lld, n %lld; key side %lld entries)\n",
           reps, (long long)H, (long long)c, (long long)n, (long long)nk);
    for (int k = 0; k < 2; k++) {
        const trex_fused_table *t = trex_fused_for(caps[k]);
        if (k == 1 && t == trex_fused_for(TREX_ISA_REF))
            break;
        t->sattn_fwd(o, lse, z, ws, q, V, n, H, c, sink, scale);
        for (int64_t h = 0; h < H; h++)
            D[h] = t->dot(g + h * c, o + h * c, c);
        BENCH("sattn_fwd n=256", 20, t->sattn_fwd(o, lse, z, ws, q, V, n, H, c, sink, scale));
        BENCH("sattn_bwd_query n=256", 20,
              t->sattn_bwd_query(dq, ds, P, ws, g, q, V, n, H, c, sink, scale, lse, D));
        BENCH("sattn_bwd_entries n=16", 200,
              t->sattn_bwd_entries(dV, ps, ws, V, nk, q, g, H, c, scale, lse, D));
        BENCH("mhc_post_fwd 4x1024", 2000, t->mhc_post_fwd(mh, d, post, comb, y, X, Xo));
        BENCH("mhc_post_bwd 4x1024", 1000,
              t->mhc_post_bwd(mh, d, post, comb, y, X, Xo, dq, dX, dpost, dcomb));
        BENCH("mhc_collapse 4x1024", 2000, t->mhc_collapse(mh, d, post, X, y));
        BENCH("mhc_collapse_bwd 4x1024", 2000, t->mhc_collapse_bwd(mh, d, post, X, y, dpost, dX));
    }
    free(pool), free(q), free(g), free(sink), free(ws), free(o), free(lse), free(z), free(D);
    free(dq), free(ds), free(P), free(ps), free(dpool), free(X), free(y), free(Xo), free(dX);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--bench")) {
        int reps = argc >= 3 ? atoi(argv[2]) : 11;
        return bench(reps < 1 ? 1 : reps > BENCH_MAX_REPS ? BENCH_MAX_REPS : reps);
    }
    const trex_fused_table *ref = trex_fused_for(TREX_ISA_REF);
    CHECK(ref->isa == TREX_ISA_REF, "the ref cap gives the reference table");

    /* The reference entries are the model's scalar code. */
    {
        float a[37], b[37];
        fill(a, 37, 1.0f);
        fill(b, 37, 1.0f);
        float x = ref->dot(a, b, 37), y = am_dot_f(a, b, 37);
        CHECK(memcmp(&x, &y, sizeof x) == 0, "ref dot is am_dot_f");
        float X[3 * 5], w[3], o1[5], o2[5];
        fill(X, 15, 1.0f);
        fill(w, 3, 1.0f);
        ref->mhc_collapse(3, 5, w, X, o1);
        mhc_collapse_f(3, 5, w, X, o2);
        CHECK(same_bits(o1, o2, 5), "ref collapse is mhc_collapse_f");
    }

    const trex_isa caps[] = {TREX_ISA_AVX2, TREX_ISA_AVX512, TREX_ISA_AMX};
    const trex_fused_table *seen[4] = {ref};
    int nseen = 1;
    for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
        const trex_fused_table *t = trex_fused_for(caps[k]);
        int dup = 0;
        for (int i = 0; i < nseen; i++)
            dup |= seen[i] == t;
        if (!dup)
            seen[nseen++] = t;
    }
    if (nseen == 1)
        printf("note: only the reference level is available on this machine; comparing it with itself\n");
    for (int k = 0; k < nseen; k++) {
        const trex_fused_table *t = seen[k];
        printf("level %s\n", t->name);
        const int64_t lens[] = {0, 1, 2, 15, 16, 17, 31, 33, 100, 513};
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            const int64_t n = lens[i];
            float *a = xmalloc_f(n), *b = xmalloc_f(n);
            fill(a, n, 1.0f);
            fill(b, n, 1.0f);
            float x = ref->dot(a, b, n), y = t->dot(a, b, n);
            CHECK(memcmp(&x, &y, sizeof x) == 0, "%s dot n=%lld: %.9g vs %.9g", t->name,
                  (long long)n, (double)x, (double)y);
            free(a), free(b);
        }
        {
            const int64_t R = 7, n = 9, c = 37, lda = 41;
            float A[7 * 41], pool[9 * 37], o1[63], o2[63];
            const float *V[9];
            fill(A, 7 * 41, 1.0f);
            fill(pool, 9 * 37, 1.0f);
            for (int e = 0; e < 9; e++)
                V[e] = pool + ((e * 4) % 9) * c;
            for (int64_t rr = 1; rr <= R; rr += 3) {
                ref->dots(o1, A, lda, rr, V, n, c);
                t->dots(o2, A, lda, rr, V, n, c);
                CHECK(same_bits(o1, o2, rr * n), "%s dots R=%lld", t->name, (long long)rr);
            }
        }
        const int64_t ns[] = {0, 1, 3, 4, 5, 13, 37};
        const int64_t Hs[] = {1, 3, 4, 5, 16, 17};
        const int64_t cs[] = {1, 7, 16, 17, 33, 64};
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (size_t j = 0; j < sizeof Hs / sizeof Hs[0]; j++)
                for (size_t l = 0; l < sizeof cs / sizeof cs[0]; l++)
                    check_sattn(t, ref, ns[i], Hs[j], cs[l]);
        check_sattn(t, ref, 131, 16, 512); /* dsv4-bench's head size, a window-sized set */
        const int mn[] = {1, 3, 4, 8};
        const int64_t md[] = {1, 15, 16, 33, 1024};
        for (size_t i = 0; i < sizeof mn / sizeof mn[0]; i++)
            for (size_t j = 0; j < sizeof md / sizeof md[0]; j++)
                check_mhc(t, ref, mn[i], md[j]);
    }
    return check_summary();
}
