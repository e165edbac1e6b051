/* tests/test_or_core.c — the OR model IR, the strict LP writer and its round-trips through GLPK's and
 * CBC's readers, the solver table with known answers (optimal, infeasible, unbounded, MILP with a gap,
 * the big-M trap of OR_PIPELINE 4.4 #7), the audit, the canonical hash, IIS and elastic repair. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data/or/or_internal.h"
#include "trex/or.h"

static int row2(trex_or_model *m, const char *name, int a, double ca, int b, double cb, char s, double rhs)
{
    int c[2] = {a, b};
    double v[2] = {ca, cb};
    return trex_or_add_row(m, name, "test", b < 0 ? 1 : 2, c, v, s, rhs);
}

/* max 3x + 2y; x + y <= 4; x + 3y <= 6; x <= 3  ->  x=3, y=1, z=11 */
static void build_lp(trex_or_model *m)
{
    trex_or_model_init(m, "product_mix", TREX_OR_MAX);
    int x = trex_or_add_col(m, "x", 0, 3, 3, TREX_OR_CONT);
    int y = trex_or_add_col(m, "y", 0, INFINITY, 2, TREX_OR_CONT);
    row2(m, "cap_1", x, 1, y, 1, 'L', 4);
    row2(m, "cap_2", x, 1, y, 3, 'L', 6);
}

static void test_writer_golden(void)
{
    trex_or_model m;
    build_lp(&m);
    char *lp = trex_or_lp_write(&m);
    const char *want = "\\ product_mix\nMaximize\n obj: 3 x + 2 y\nSubject To\n cap_1: x + y <= 4\n"
                       " cap_2: x + 3 y <= 6\nBounds\n x <= 3\nEnd\n";
    CHECK(!strcmp(lp, want), "golden LP differs:\n%s", lp);
    free(lp);
    /* every bound form, integers, binaries, negative coefficients */
    trex_or_model g;
    trex_or_model_init(&g, "forms", TREX_OR_MIN);
    int a = trex_or_add_col(&g, "a", -5, 5, -1, TREX_OR_CONT);
    int b = trex_or_add_col(&g, "b", -INFINITY, INFINITY, 0.5, TREX_OR_CONT);
    int c = trex_or_add_col(&g, "c", 2, INFINITY, 1, TREX_OR_INT);
    int d = trex_or_add_col(&g, "d", 0, 1, 7, TREX_OR_BIN);
    int e = trex_or_add_col(&g, "e", 3, 3, 1, TREX_OR_CONT);
    int cols[5] = {a, b, c, d, e};
    double v[5] = {1, -1, 2.5, -4, 1};
    trex_or_add_row(&g, "r_1", "t", 5, cols, v, 'G', -3);
    row2(&g, "r_2", b, 1, -1, 0, 'G', -10);
    row2(&g, "r_3", c, 1, d, 1, 'E', 3);
    lp = trex_or_lp_write(&g);
    const char *want2 = "\\ forms\nMinimize\n obj: - a + 0.5 b + c + 7 d + e\nSubject To\n"
                        " r_1: a - b + 2.5 c - 4 d + e >= -3\n r_2: b >= -10\n r_3: c + d = 3\nBounds\n"
                        " -5 <= a <= 5\n b free\n c >= 2\n e = 3\nGeneral\n c\nBinary\n d\nEnd\n";
    CHECK(!strcmp(lp, want2), "golden LP (forms) differs:\n%s", lp);
    trex_or_model back;
    trex_err err = {0};
    CHECK(trex_or_lp_read(lp, strlen(lp), &back, &err) == TREX_OK, "read: %s", err.msg);
    if (back.ncols) {
        char *again = trex_or_lp_write(&back);
        /* GLPK's reader keeps names, order and bounds: writing the read-back model gives the same bytes
         * except the comment line (problem name) */
        const char *p1 = strchr(lp, '\n'), *p2 = strchr(again, '\n');
        CHECK(!strcmp(p1, p2), "write(read(lp)) differs:\n%s", again);
        CHECK(trex_or_canon_hash(&back) == trex_or_canon_hash(&g), "hash changed by the round-trip");
        free(again);
        trex_or_model_free(&back);
    }
    trex_or_solution s1, s2;
    trex_or_solve_glpk(&g, NULL, &s1, NULL);
    CHECK(trex_or_cbc_read_solve(lp, strlen(lp), &s2, &err) == TREX_OK, "cbc read: %s", err.msg);
    CHECK(s1.status == TREX_OR_OPTIMAL && s2.status == TREX_OR_OPTIMAL, "forms: %s / %s",
          trex_or_status_str(s1.status), trex_or_status_str(s2.status));
    CHECK_NEAR(s1.obj, s2.obj, 1e-6, "forms objective GLPK vs CBC-from-text");
    trex_or_solution_free(&s1);
    trex_or_solution_free(&s2);
    free(lp);
    trex_or_model_free(&g);
    trex_or_model_free(&m);
}

static void test_long_rows(void)
{
    trex_or_model m;
    trex_or_model_init(&m, "long", TREX_OR_MIN);
    int cols[60];
    double v[60];
    char nm[32];
    for (int j = 0; j < 60; j++) {
        snprintf(nm, sizeof nm, "ship_%d_%d", j / 7, j % 7);
        cols[j] = trex_or_add_col(&m, nm, 0, INFINITY, 1.25 + j, TREX_OR_CONT);
        v[j] = 1 + (j % 5);
    }
    trex_or_add_row(&m, "total", "t", 60, cols, v, 'G', 1234.5);
    char *lp = trex_or_lp_write(&m);
    int maxline = 0, cur = 0;
    for (const char *p = lp; *p; p++) {
        if (*p == '\n') {
            maxline = cur > maxline ? cur : maxline;
            cur = 0;
        } else
            cur++;
    }
    CHECK(maxline <= 100, "longest LP line %d chars", maxline);
    trex_or_solution a, b;
    trex_or_verdict vd;
    trex_or_verify_model(&m, true, &vd);
    trex_err err = {0};
    CHECK(trex_or_cbc_read_solve(lp, strlen(lp), &b, &err) == TREX_OK, "cbc read");
    trex_or_model back;
    CHECK(trex_or_lp_read(lp, strlen(lp), &back, &err) == TREX_OK, "glpk read: %s", err.msg);
    trex_or_solve_glpk(&back, NULL, &a, NULL);
    CHECK(vd.reject == TREX_OR_ACCEPT, "verify: %s %s", trex_or_reject_str(vd.reject), vd.why);
    CHECK_NEAR(a.obj, vd.obj, 1e-6, "long row GLPK read-back");
    CHECK_NEAR(b.obj, vd.obj, 1e-6, "long row CBC read-back");
    trex_or_verdict_free(&vd);
    trex_or_solution_free(&a);
    trex_or_solution_free(&b);
    trex_or_model_free(&back);
    trex_or_model_free(&m);
    free(lp);
}

static void test_reader_rejects(void)
{
    const char *bad[] = {
        "Minimize\n obj: x[1] + y\nSubject To\n c: x[1] + y >= 1\nEnd\n",      /* brackets */
        "Minimize\n obj: 3 x + 2 y + 10\nSubject To\n c: x + y >= 1\nEnd\n",   /* objective constant */
        "Minimize\n obj: x + y\nSubject To\n c: -2 <= x - y <= 2\nEnd\n",      /* ranged row */
        "Minimize\n obj: x + y\nSubject To\n c: x + y >= 1\n c: x >= 0.5\nEnd\n", /* duplicate row */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        trex_or_model m;
        trex_err err = {0};
        trex_code rc = trex_or_lp_read(bad[k], strlen(bad[k]), &m, &err);
        CHECK(rc == TREX_EFORMAT, "bad LP %zu accepted", k);
        if (rc == TREX_OK)
            trex_or_model_free(&m);
    }
}

typedef struct table_case {
    const char *name;
    const char *lp;
    trex_or_status want;
    double z;
} table_case;

static void test_solver_table(void)
{
    static const table_case cases[] = {
        {"lp_opt", "Maximize\n obj: 3 x + 2 y\nSubject To\n c1: x + y <= 4\n c2: x + 3 y <= 6\nBounds\n x <= 3\nEnd\n",
         TREX_OR_OPTIMAL, 11},
        {"lp_infeasible", "Minimize\n obj: x + y\nSubject To\n c1: x + y >= 5\n c2: x + y <= 3\nEnd\n",
         TREX_OR_INFEASIBLE, NAN},
        {"lp_unbounded", "Maximize\n obj: x + y\nSubject To\n c1: x - y <= 2\nEnd\n", TREX_OR_UNBOUNDED, NAN},
        {"milp_gap", "Maximize\n obj: 5 x + 4 y\nSubject To\n c1: 6 x + 4 y <= 24\n c2: x + 2 y <= 6\nGeneral\n x y\nEnd\n",
         TREX_OR_OPTIMAL, 20},
        {"milp_infeasible", "Minimize\n obj: x\nSubject To\n c1: 2 x = 3\nGeneral\n x\nEnd\n", TREX_OR_INFEASIBLE, NAN},
        {"knapsack", "Maximize\n obj: 10 a + 13 b + 7 c\nSubject To\n w: 4 a + 6 b + 3 c <= 9\nBinary\n a b c\nEnd\n",
         TREX_OR_OPTIMAL, 20},
        /* the B4O CFL pattern: y pays a fixed cost, x <= 1e6 y. tol_int 1e-5 would accept y = 5e-6. */
        {"bigm_trap", "Minimize\n obj: 5000 y + x\nSubject To\n dem: x >= 5\n link: x - 1000000 y <= 0\nBinary\n y\nEnd\n",
         TREX_OR_OPTIMAL, 5005},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const table_case *t = &cases[k];
        trex_or_model m;
        trex_err err = {0};
        if (trex_or_lp_read(t->lp, strlen(t->lp), &m, &err) != TREX_OK) {
            CHECK(0, "%s: %s", t->name, err.msg);
            continue;
        }
        trex_or_solution g, c, ct;
        trex_or_solve_glpk(&m, NULL, &g, NULL);
        trex_or_solve_cbc(&m, NULL, &c, NULL);
        trex_or_cbc_read_solve(t->lp, strlen(t->lp), &ct, &err);
        CHECK(g.status == t->want, "%s: GLPK %s, want %s", t->name, trex_or_status_str(g.status),
              trex_or_status_str(t->want));
        if (t->want == TREX_OR_OPTIMAL) {
            CHECK_NEAR(g.obj, t->z, 1e-6, t->name);
            CHECK(c.status == TREX_OR_OPTIMAL, "%s: CBC %s", t->name, trex_or_status_str(c.status));
            CHECK_NEAR(c.obj, t->z, 1e-6, t->name);
            CHECK(ct.status == TREX_OR_OPTIMAL, "%s: CBC (text) %s", t->name, trex_or_status_str(ct.status));
            CHECK_NEAR(ct.obj, t->z, 1e-6, t->name);
            char why[256];
            CHECK(trex_or_audit(&m, g.x, g.obj, why, sizeof why), "%s audit: %s", t->name, why);
        } else {
            CHECK(c.status != TREX_OR_OPTIMAL, "%s: CBC claims optimal", t->name);
        }
        if (!strcmp(t->name, "bigm_trap")) {
            /* the trap is real: GLPK with its default tolerance is wrong, and the audit catches it */
            trex_or_solve_opts loose = {.tol_int = 1e-5};
            trex_or_solution w;
            trex_or_solve_glpk(&m, &loose, &w, NULL);
            CHECK(w.status == TREX_OR_OPTIMAL && w.obj < 100, "trap not reproduced: %s %g",
                  trex_or_status_str(w.status), w.obj);
            char why[256];
            if (w.x)
                CHECK(!trex_or_audit(&m, w.x, w.obj, why, sizeof why), "audit passed a fractional y");
            trex_or_solution_free(&w);
            trex_or_verdict vd;
            trex_or_verify_model(&m, true, &vd);
            CHECK(vd.reject == TREX_OR_ACCEPT && fabs(vd.obj - 5005) < 1e-6, "trap ladder: %s %s",
                  trex_or_reject_str(vd.reject), vd.why);
            trex_or_verdict_free(&vd);
        }
        if (!strcmp(t->name, "milp_gap")) {
            trex_or_verdict vd;
            trex_or_verify_model(&m, true, &vd);
            CHECK(vd.reject == TREX_OR_ACCEPT, "milp_gap ladder: %s", vd.why);
            CHECK_NEAR(vd.lp_relax_obj, 21, 1e-6, "milp_gap LP relaxation");
            trex_or_verdict_free(&vd);
        }
        if (!strcmp(t->name, "lp_infeasible")) {
            trex_or_verdict vd;
            trex_or_verify_model(&m, false, &vd);
            CHECK(vd.reject == TREX_OR_ACCEPT, "infeasible ladder: %s", vd.why);
            trex_or_verdict_free(&vd);
            int iis[8], n = 0;
            CHECK(trex_or_iis(&m, iis, &n, &err) == TREX_OK && n == 2, "IIS size %d", n);
            double total = 0, relax[8];
            CHECK(trex_or_elastic(&m, &total, relax, &err) == TREX_OK, "elastic: %s", err.msg);
            CHECK_NEAR(total, 2, 1e-9, "elastic total relaxation");
        }
        trex_or_solution_free(&g);
        trex_or_solution_free(&c);
        trex_or_solution_free(&ct);
        trex_or_model_free(&m);
    }
}

static void test_uniqueness_and_hash(void)
{
    trex_or_model m;
    build_lp(&m);
    trex_or_verdict vd;
    trex_or_verify_model(&m, true, &vd);
    CHECK(vd.reject == TREX_OR_ACCEPT && vd.unique && vd.binding == 2, "lp ladder: %s unique %d binding %d",
          vd.why, vd.unique, vd.binding);
    trex_or_verdict_free(&vd);
    /* a tie: max x + y with x + y <= 4 has many optima */
    trex_or_model t;
    trex_or_model_init(&t, "tie", TREX_OR_MAX);
    int x = trex_or_add_col(&t, "x", 0, INFINITY, 1, TREX_OR_CONT);
    int y = trex_or_add_col(&t, "y", 0, INFINITY, 1, TREX_OR_CONT);
    row2(&t, "c", x, 1, y, 1, 'L', 4);
    trex_or_verify_model(&t, true, &vd);
    CHECK(vd.reject == TREX_OR_ACCEPT && !vd.unique, "tie reported unique");
    trex_or_verdict_free(&vd);
    /* binary tie */
    trex_or_model k;
    const char *lp = "Maximize\n obj: 5 a + 5 b\nSubject To\n w: a + b <= 1\nBinary\n a b\nEnd\n";
    trex_err err;
    trex_or_lp_read(lp, strlen(lp), &k, &err);
    trex_or_verify_model(&k, true, &vd);
    CHECK(vd.reject == TREX_OR_ACCEPT && !vd.unique, "binary tie reported unique");
    trex_or_verdict_free(&vd);
    /* hash: invariant under row/column order and names, sensitive to a coefficient */
    const char *p1 = "Minimize\n obj: 2 a + 3 b\nSubject To\n r1: a + b >= 4\n r2: a - b <= 1\nEnd\n";
    const char *p2 = "Minimize\n obj: 3 q + 2 p\nSubject To\n s2: - q + p <= 1\n s1: q + p >= 4\nEnd\n";
    const char *p3 = "Minimize\n obj: 2 a + 3 b\nSubject To\n r1: a + b >= 4\n r2: a - 2 b <= 1\nEnd\n";
    const char *p4 = "Minimize\n obj: 2 a + 3 b\nSubject To\n r1: - a - b <= -4\n r2: a - b <= 1\nEnd\n";
    trex_or_model h1, h2, h3, h4;
    trex_or_lp_read(p1, strlen(p1), &h1, &err);
    trex_or_lp_read(p2, strlen(p2), &h2, &err);
    trex_or_lp_read(p3, strlen(p3), &h3, &err);
    trex_or_lp_read(p4, strlen(p4), &h4, &err);
    CHECK(trex_or_canon_hash(&h1) == trex_or_canon_hash(&h2), "hash not permutation invariant");
    CHECK(trex_or_canon_hash(&h1) != trex_or_canon_hash(&h3), "hash ignores a coefficient");
    CHECK(trex_or_canon_hash(&h1) == trex_or_canon_hash(&h4), "hash depends on the row sign");
    trex_or_model_free(&h1);
    trex_or_model_free(&h2);
    trex_or_model_free(&h3);
    trex_or_model_free(&h4);
    trex_or_model_free(&k);
    trex_or_model_free(&t);
    trex_or_model_free(&m);
}

static void test_self_check(void)
{
    trex_or_model m;
    trex_err err = {0};
    trex_or_model_init(&m, "bad", TREX_OR_MIN);
    int x = trex_or_add_col(&m, "x_1", 0, INFINITY, 1, TREX_OR_CONT);
    row2(&m, "c_1", x, 1, -1, 0, 'G', 1);
    CHECK(trex_or_model_check(&m, &err) == TREX_OK, "good model rejected: %s", err.msg);
    row2(&m, "x_1", x, 1, -1, 0, 'G', 1);
    CHECK(trex_or_model_check(&m, &err) == TREX_EINVAL && strstr(err.msg, "x_1"), "duplicate name: %s", err.msg);
    trex_or_model_free(&m);
    trex_or_model_init(&m, "bad2", TREX_OR_MIN);
    trex_or_add_col(&m, "x(1)", 0, INFINITY, 1, TREX_OR_CONT);
    CHECK(trex_or_model_check(&m, &err) == TREX_EINVAL, "bad name accepted");
    trex_or_model_free(&m);
}

static void test_util(void)
{
    or_sb b = {0};
    or_sb_json_str(&b, "a\"b\\c\nd\x01\xc3\xa9");
    CHECK(!strcmp(b.s, "\"a\\\"b\\\\c\\nd\\u0001\xc3\xa9\""), "json escape: %s", b.s);
    or_sb_free(&b);
    or_rng r1 = or_rng_make(42, 7), r2 = or_rng_make(42, 7), r3 = or_rng_make(42, 8);
    uint64_t a = or_rng_u64(&r1), c = or_rng_u64(&r3);
    CHECK(a == or_rng_u64(&r2) && a != c, "rng streams");
    int hist[3] = {0};
    for (int i = 0; i < 3000; i++)
        hist[or_rng_int(&r1, 0, 2)]++;
    CHECK(hist[0] > 900 && hist[1] > 900 && hist[2] > 900, "rng_int spread %d %d %d", hist[0], hist[1], hist[2]);
    char t[40];
    or_fmt_num(t, sizeof t, -0.0);
    CHECK(!strcmp(t, "0"), "-0 printed as %s", t);
    or_fmt_num(t, sizeof t, 0.1 + 0.2);
    CHECK(!strcmp(t, "0.3"), "0.1+0.2 printed as %s", t);
    int n = 0;
    char *body = or_fence_extract("x\n```lp\nMinimize\n```\ny\n", "lp", &n);
    CHECK(n == 1 && body && !strcmp(body, "Minimize\n"), "fence extract");
    free(body);
}

int main(void)
{
    test_util();
    test_writer_golden();
    test_long_rows();
    test_reader_rejects();
    test_solver_table();
    test_uniqueness_and_hash();
    test_self_check();
    return check_summary();
}
