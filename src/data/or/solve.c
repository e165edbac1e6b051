/* data/or/solve.c — GLPK and CBC backends over the IR, the long-double solution audit, the verification
 * ladder (OR_PIPELINE 5.7 steps 2-6) and the analysis tools (IIS by deletion filter, elastic repair).
 *
 * Solver policy (measured facts in OR_PIPELINE 4.4): GLPK with tol_int = 1e-7 and mip_gap = 0 is the
 * primary; an infeasible/unbounded LP is classified by re-running the simplex with presolve off. CBC is
 * an independent cross-check built from the same IR through its C API; its LP statuses do not tell
 * infeasible from unbounded, so only its optimal objective is compared. */
#include <Cbc_C_Interface.h>
#include <float.h>
#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "or_internal.h"
#include "trex/prof.h"

const char *trex_or_status_str(trex_or_status s)
{
    switch (s) {
    case TREX_OR_OPTIMAL: return "optimal";
    case TREX_OR_INFEASIBLE: return "infeasible";
    case TREX_OR_UNBOUNDED: return "unbounded";
    case TREX_OR_TIMELIMIT: return "time_limit";
    case TREX_OR_NUMERIC: return "numeric";
    }
    return "?";
}

const char *trex_or_reject_str(trex_or_reject r)
{
    static const char *const names[TREX_OR_REJ_COUNT] = {
        [TREX_OR_ACCEPT] = "ACCEPT",
        [TREX_OR_REJ_SELF_CHECK] = "SELF_CHECK",
        [TREX_OR_REJ_NOT_OPTIMAL] = "SOLVER_NOT_OPTIMAL",
        [TREX_OR_REJ_TIME_LIMIT] = "TIME_LIMIT",
        [TREX_OR_REJ_NUMERIC] = "NUMERIC",
        [TREX_OR_REJ_DISAGREE] = "SOLVER_DISAGREE",
        [TREX_OR_REJ_AUDIT] = "AUDIT_FAIL",
        [TREX_OR_REJ_DEGENERATE_ZERO] = "DEGENERATE_ZERO",
        [TREX_OR_REJ_NO_BINDING] = "NO_BINDING",
        [TREX_OR_REJ_DUP_INSTANCE] = "DUP_INSTANCE",
        [TREX_OR_REJ_NEAR_DUP_TEXT] = "NEAR_DUP_TEXT",
        [TREX_OR_REJ_DUP_TEXT] = "DUP_TEXT",
        [TREX_OR_REJ_CONTAM] = "CONTAM",
        [TREX_OR_REJ_REPARSE_FAIL] = "REPARSE_FAIL",
        [TREX_OR_REJ_REPARSE_MISMATCH] = "REPARSE_MISMATCH",
        [TREX_OR_REJ_TOO_LONG] = "TOO_LONG",
        [TREX_OR_REJ_NUMBER_COVERAGE] = "NUMBER_COVERAGE",
        [TREX_OR_REJ_LEAK] = "LEAK",
        [TREX_OR_REJ_DEBRIS] = "TEMPLATE_DEBRIS",
        [TREX_OR_REJ_CONTRACT_MISSING] = "CONTRACT_MISSING",
        [TREX_OR_REJ_ANALYSIS] = "ANALYSIS_CHECK",
    };
    return (r >= 0 && r < TREX_OR_REJ_COUNT) ? names[r] : "?";
}

bool trex_or_obj_close(double a, double b) { return fabs(a - b) <= 1e-6 * fmax(1.0, fabs(b)); }

void trex_or_solution_free(trex_or_solution *s)
{
    free(s->x);
    free(s->dual);
    free(s->rcost);
    memset(s, 0, sizeof *s);
}

/* ---- GLPK ---- */
static glp_prob *to_glpk(const trex_or_model *m)
{
    glp_prob *P = glp_create_prob();
    glp_set_obj_dir(P, m->sense == TREX_OR_MAX ? GLP_MAX : GLP_MIN);
    if (m->ncols)
        glp_add_cols(P, m->ncols);
    for (int j = 0; j < m->ncols; j++) {
        double lo = m->lb[j], hi = m->ub[j];
        int t = (lo == -INFINITY && hi == INFINITY) ? GLP_FR
                : hi == INFINITY                    ? GLP_LO
                : lo == -INFINITY                   ? GLP_UP
                : lo == hi                          ? GLP_FX
                                                    : GLP_DB;
        glp_set_col_bnds(P, j + 1, t, isfinite(lo) ? lo : 0, isfinite(hi) ? hi : 0);
        glp_set_obj_coef(P, j + 1, m->obj[j]);
        if (m->kind[j] != TREX_OR_CONT)
            glp_set_col_kind(P, j + 1, GLP_IV);
    }
    if (m->nrows)
        glp_add_rows(P, m->nrows);
    int *ind = trex_xmalloc((size_t)(m->ncols + 1) * sizeof *ind);
    double *val = trex_xmalloc((size_t)(m->ncols + 1) * sizeof *val);
    for (int i = 0; i < m->nrows; i++) {
        char s = m->row_sense[i];
        glp_set_row_bnds(P, i + 1, s == 'L' ? GLP_UP : s == 'G' ? GLP_LO : GLP_FX, m->rhs[i], m->rhs[i]);
        int n = 0;
        for (int64_t q = m->row_start[i]; q < m->row_start[i + 1]; q++) {
            n++;
            ind[n] = m->idx[q] + 1;
            val[n] = m->val[q];
        }
        glp_set_mat_row(P, i + 1, n, ind, val);
    }
    free(ind);
    free(val);
    return P;
}

static trex_or_status glpk_lp(glp_prob *P, int tm_lim)
{
    glp_smcp p;
    glp_init_smcp(&p);
    p.msg_lev = GLP_MSG_OFF;
    p.presolve = GLP_ON;
    p.tm_lim = tm_lim;
    int rc = glp_simplex(P, &p);
    if (rc == GLP_ENOPFS || rc == GLP_ENODFS) {
        p.presolve = GLP_OFF; /* presolve leaves the status undefined: classify without it */
        glp_std_basis(P);
        rc = glp_simplex(P, &p);
    }
    if (rc == GLP_ETMLIM || rc == GLP_EITLIM)
        return TREX_OR_TIMELIMIT;
    if (rc != 0)
        return TREX_OR_NUMERIC;
    switch (glp_get_status(P)) {
    case GLP_OPT: return TREX_OR_OPTIMAL;
    case GLP_NOFEAS: return TREX_OR_INFEASIBLE;
    case GLP_UNBND: return TREX_OR_UNBOUNDED;
    default:
        if (glp_get_prim_stat(P) == GLP_NOFEAS)
            return TREX_OR_INFEASIBLE;
        return TREX_OR_NUMERIC;
    }
}

static trex_or_status glpk_mip(glp_prob *P, const trex_or_solve_opts *o, int tm_lim)
{
    trex_or_status st = glpk_lp(P, tm_lim); /* the relaxation first: classifies and gives the basis */
    if (st != TREX_OR_OPTIMAL)
        return st;
    glp_iocp q;
    glp_init_iocp(&q);
    q.msg_lev = GLP_MSG_OFF;
    q.presolve = GLP_OFF;
    q.tol_int = o && o->tol_int > 0 ? o->tol_int : 1e-7;
    q.mip_gap = 0;
    q.tm_lim = tm_lim;
    int rc = glp_intopt(P, &q);
    if (rc == GLP_ETMLIM)
        return TREX_OR_TIMELIMIT;
    if (rc == GLP_ENOPFS)
        return TREX_OR_INFEASIBLE;
    if (rc != 0)
        return TREX_OR_NUMERIC;
    switch (glp_mip_status(P)) {
    case GLP_OPT: return TREX_OR_OPTIMAL;
    case GLP_NOFEAS: return TREX_OR_INFEASIBLE;
    default: return TREX_OR_NUMERIC;
    }
}

/* Rational-arithmetic simplex (glp_exact) on an LP: certifies the floating-point optimum. Returns NAN
 * when it does not finish with an optimal basis. */
static double glpk_exact_obj(const trex_or_model *m, int tm_lim)
{
    int prev = or_glpk_quiet();
    glp_prob *P = to_glpk(m);
    double z = NAN;
    if (glpk_lp(P, tm_lim) == TREX_OR_OPTIMAL) { /* warm start from the floating-point basis */
        glp_smcp p;
        glp_init_smcp(&p);
        p.msg_lev = GLP_MSG_OFF;
        p.tm_lim = tm_lim;
        if (glp_exact(P, &p) == 0 && glp_get_status(P) == GLP_OPT)
            z = glp_get_obj_val(P);
    }
    glp_delete_prob(P);
    or_glpk_restore(prev);
    return z;
}

trex_code trex_or_solve_glpk(const trex_or_model *m, const trex_or_solve_opts *o, trex_or_solution *s,
                             trex_err *err)
{
    (void)err;
    memset(s, 0, sizeof *s);
    int prev = or_glpk_quiet();
    double t0 = 1e3 * trex_wall_s();
    int tm = o && o->tm_lim_ms > 0 ? o->tm_lim_ms : 2000;
    glp_prob *P = to_glpk(m);
    bool mip = trex_or_is_mip(m);
    s->status = mip ? glpk_mip(P, o, tm) : glpk_lp(P, tm);
    s->obj = NAN;
    if (s->status == TREX_OR_OPTIMAL) {
        s->x = trex_xmalloc((size_t)(m->ncols + 1) * sizeof *s->x);
        s->obj = mip ? glp_mip_obj_val(P) : glp_get_obj_val(P);
        for (int j = 0; j < m->ncols; j++)
            s->x[j] = mip ? glp_mip_col_val(P, j + 1) : glp_get_col_prim(P, j + 1);
        if (!mip && o && o->want_duals) {
            s->dual = trex_xmalloc((size_t)(m->nrows + 1) * sizeof *s->dual);
            s->rcost = trex_xmalloc((size_t)(m->ncols + 1) * sizeof *s->rcost);
            bool uniq = true;
            for (int i = 0; i < m->nrows; i++) {
                s->dual[i] = glp_get_row_dual(P, i + 1);
                if (glp_get_row_stat(P, i + 1) != GLP_BS && fabs(s->dual[i]) < 1e-9)
                    uniq = false;
            }
            for (int j = 0; j < m->ncols; j++) {
                s->rcost[j] = glp_get_col_dual(P, j + 1);
                int cs = glp_get_col_stat(P, j + 1);
                if (cs != GLP_BS && cs != GLP_NS && fabs(s->rcost[j]) < 1e-9)
                    uniq = false;
            }
            s->basic_unique = uniq;
        }
    }
    glp_delete_prob(P);
    s->ms = 1e3 * trex_wall_s() - t0;
    or_glpk_restore(prev);
    return TREX_OK;
}

/* ---- CBC ---- */
static void cbc_finish(Cbc_Model *c, int ncols, trex_or_solution *s)
{
    if (Cbc_isProvenOptimal(c)) {
        s->status = TREX_OR_OPTIMAL;
        s->obj = Cbc_getObjValue(c);
        const double *x = Cbc_getColSolution(c);
        if (x && ncols > 0) {
            s->x = trex_xmalloc((size_t)ncols * sizeof *s->x);
            memcpy(s->x, x, (size_t)ncols * sizeof *s->x);
        }
    } else if (Cbc_isSecondsLimitReached(c))
        s->status = TREX_OR_TIMELIMIT;
    else if (Cbc_isContinuousUnbounded(c))
        s->status = TREX_OR_UNBOUNDED;
    else if (Cbc_isProvenInfeasible(c))
        s->status = TREX_OR_INFEASIBLE; /* for a pure LP this may also mean unbounded (4.4 #8) */
    else
        s->status = TREX_OR_NUMERIC;
}

static void cbc_params(Cbc_Model *c, const trex_or_solve_opts *o)
{
    int tm = o && o->tm_lim_ms > 0 ? o->tm_lim_ms : 2000;
    Cbc_setLogLevel(c, 0);
    Cbc_setMaximumSeconds(c, tm / 1000.0);
}

trex_code trex_or_solve_cbc(const trex_or_model *m, const trex_or_solve_opts *o, trex_or_solution *s,
                            trex_err *err)
{
    (void)err;
    memset(s, 0, sizeof *s);
    s->obj = NAN;
    double t0 = 1e3 * trex_wall_s();
    int nc = m->ncols, nr = m->nrows;
    CoinBigIndex *start = trex_xcalloc((size_t)nc + 1, sizeof *start);
    int *rows = trex_xmalloc((size_t)(m->nnz + 1) * sizeof *rows);
    double *vals = trex_xmalloc((size_t)(m->nnz + 1) * sizeof *vals);
    double *clb = trex_xmalloc((size_t)(nc + 1) * sizeof *clb), *cub = trex_xmalloc((size_t)(nc + 1) * sizeof *cub);
    double *rlb = trex_xmalloc((size_t)(nr + 1) * sizeof *rlb), *rub = trex_xmalloc((size_t)(nr + 1) * sizeof *rub);
    int *fill = trex_xmalloc((size_t)(nc + 1) * sizeof *fill);
    for (int64_t q = 0; q < m->nnz; q++)
        start[m->idx[q] + 1]++;
    for (int j = 0; j < nc; j++)
        start[j + 1] += start[j];
    for (int j = 0; j < nc; j++) {
        fill[j] = start[j];
        clb[j] = m->lb[j] == -INFINITY ? -DBL_MAX : m->lb[j];
        cub[j] = m->ub[j] == INFINITY ? DBL_MAX : m->ub[j];
    }
    for (int i = 0; i < nr; i++) {
        for (int64_t q = m->row_start[i]; q < m->row_start[i + 1]; q++) {
            int p = fill[m->idx[q]]++;
            rows[p] = i;
            vals[p] = m->val[q];
        }
        rlb[i] = m->row_sense[i] == 'L' ? -DBL_MAX : m->rhs[i];
        rub[i] = m->row_sense[i] == 'G' ? DBL_MAX : m->rhs[i];
    }
    Cbc_Model *c = Cbc_newModel();
    Cbc_loadProblem(c, nc, nr, start, rows, vals, clb, cub, m->obj, rlb, rub);
    Cbc_setObjSense(c, m->sense == TREX_OR_MAX ? -1 : 1);
    for (int j = 0; j < nc; j++)
        if (m->kind[j] != TREX_OR_CONT)
            Cbc_setInteger(c, j);
    cbc_params(c, o);
    Cbc_solve(c);
    cbc_finish(c, nc, s);
    Cbc_deleteModel(c);
    free(start);
    free(rows);
    free(vals);
    free(clb);
    free(cub);
    free(rlb);
    free(rub);
    free(fill);
    s->ms = 1e3 * trex_wall_s() - t0;
    return TREX_OK;
}

trex_code trex_or_cbc_read_solve(const char *text, size_t len, trex_or_solution *s, trex_err *err)
{
    memset(s, 0, sizeof *s);
    s->obj = NAN;
    /* Cbc_readLp asserts (aborts the process) on text it cannot parse, and it only reads files whose
     * name ends in ".lp": so GLPK's reader vets the text first, and it goes through a real temp file. */
    trex_or_model vet;
    trex_code rc = trex_or_lp_read(text, len, &vet, err);
    if (rc != TREX_OK)
        return rc;
    trex_or_model_free(&vet);
    const char *dir = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/trex-or-XXXXXX.lp", dir && *dir ? dir : "/tmp");
    int fd = mkstemps(path, 3);
    if (fd < 0)
        return trex_err_set(err, TREX_EIO, "cannot create a temporary file %s; set TMPDIR to a writable folder",
                            path);
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    close(fd);
    Cbc_Model *c = Cbc_newModel();
    if (off < len) {
        rc = trex_err_set(err, TREX_EIO, "cannot write the temporary file %s", path);
        goto out;
    }
    Cbc_setLogLevel(c, 0);
    if (Cbc_readLp(c, path) != 0) {
        rc = trex_err_set(err, TREX_EFORMAT, "CBC's LP reader rejected the text");
        goto out;
    }
    cbc_params(c, NULL);
    Cbc_solve(c);
    cbc_finish(c, Cbc_getNumCols(c), s);
out:
    Cbc_deleteModel(c);
    unlink(path);
    return rc;
}

/* ---- audit ---- */
bool trex_or_audit(const trex_or_model *m, const double *x, double claimed_obj, char *why, size_t why_len)
{
    long double z = 0;
    for (int j = 0; j < m->ncols; j++) {
        double tol = 1e-7 * fmax(1.0, fabs(x[j]));
        if (x[j] < m->lb[j] - tol || x[j] > m->ub[j] + tol) {
            snprintf(why, why_len, "column %s = %.10g outside [%g, %g]", m->col_name[j], x[j], m->lb[j], m->ub[j]);
            return false;
        }
        if (m->kind[j] != TREX_OR_CONT && fabs(x[j] - nearbyint(x[j])) > 1e-6) {
            snprintf(why, why_len, "integer column %s = %.10g is fractional", m->col_name[j], x[j]);
            return false;
        }
        z += (long double)m->obj[j] * x[j];
    }
    for (int i = 0; i < m->nrows; i++) {
        long double a = 0, mag = 0;
        for (int64_t q = m->row_start[i]; q < m->row_start[i + 1]; q++) {
            a += (long double)m->val[q] * x[m->idx[q]];
            mag += fabsl((long double)m->val[q] * x[m->idx[q]]);
        }
        /* relative to the row's scale: values printed with 12 digits still pass, a big-M leak does not
         * (integrality is checked separately above) */
        double tol = 1e-7 * fmax(1.0, fmax(fabs(m->rhs[i]), (double)mag));
        double d = (double)(a - m->rhs[i]);
        char s = m->row_sense[i];
        if ((s == 'L' && d > tol) || (s == 'G' && d < -tol) || (s == 'E' && fabs(d) > tol)) {
            snprintf(why, why_len, "row %s violated: activity %.12g vs rhs %.12g", m->row_name[i], (double)a,
                     m->rhs[i]);
            return false;
        }
    }
    if (!trex_or_obj_close((double)z, claimed_obj)) {
        snprintf(why, why_len, "objective recomputed as %.12g, solver said %.12g", (double)z, claimed_obj);
        return false;
    }
    return true;
}

/* ---- verification ladder ---- */
void trex_or_verdict_free(trex_or_verdict *v)
{
    free(v->x);
    v->x = NULL;
}

static int count_binding(const trex_or_model *m, const double *x)
{
    int n = 0;
    for (int i = 0; i < m->nrows; i++) {
        long double a = 0;
        for (int64_t q = m->row_start[i]; q < m->row_start[i + 1]; q++)
            a += (long double)m->val[q] * x[m->idx[q]];
        if (fabs((double)(a - m->rhs[i])) <= 1e-7 * fmax(1.0, fabs(m->rhs[i])))
            n++;
    }
    return n;
}

/* Integer part unique? (all integer columns binary): forbid the found 0/1 pattern at the same objective. */
static bool binary_part_unique(const trex_or_model *m, const double *x, double z)
{
    for (int j = 0; j < m->ncols; j++)
        if (m->kind[j] == TREX_OR_INT && !(m->lb[j] == 0 && m->ub[j] == 1))
            return false; /* general integers: not tested, claim nothing */
    trex_or_model w;
    trex_or_model_copy(&w, m);
    int *cols = trex_xmalloc((size_t)m->ncols * sizeof *cols);
    double *co = trex_xmalloc((size_t)m->ncols * sizeof *co);
    int n = 0, ones = 0;
    for (int j = 0; j < m->ncols; j++)
        if (m->kind[j] != TREX_OR_CONT) {
            bool one = x[j] > 0.5;
            cols[n] = j;
            co[n++] = one ? -1 : 1;
            ones += one;
        }
    trex_or_add_row(&w, "nogood_cut", NULL, n, cols, co, 'G', 1 - ones);
    n = 0;
    for (int j = 0; j < m->ncols; j++)
        if (m->obj[j] != 0) {
            cols[n] = j;
            co[n++] = m->obj[j];
        }
    double tol = 1e-6 * fmax(1.0, fabs(z));
    if (n)
        trex_or_add_row(&w, "same_objective", NULL, n, cols, co, m->sense == TREX_OR_MIN ? 'L' : 'G',
                        m->sense == TREX_OR_MIN ? z + tol : z - tol);
    trex_or_solution s;
    trex_or_solve_glpk(&w, NULL, &s, NULL);
    bool unique = s.status == TREX_OR_INFEASIBLE;
    trex_or_solution_free(&s);
    trex_or_model_free(&w);
    free(cols);
    free(co);
    return unique;
}

void trex_or_verify_model(const trex_or_model *m, bool expect_feasible, trex_or_verdict *v)
{
    memset(v, 0, sizeof *v);
    v->obj = v->cbc_obj = v->exact_obj = v->lp_relax_obj = NAN;
    trex_err e = {0};
    trex_or_solution g = {0}, c = {0}, f = {0};
    trex_or_model fixed = {0};
    bool have_fixed = false;
    trex_or_solve_opts so = {.want_duals = true};
    if (trex_or_model_check(m, &e) != TREX_OK) {
        v->reject = TREX_OR_REJ_SELF_CHECK;
        snprintf(v->why, sizeof v->why, "%.250s", e.msg);
        goto out;
    }
    trex_or_solve_glpk(m, &so, &g, NULL);
    v->status = g.status;
    v->glpk_ms = g.ms;
    if (!expect_feasible) {
        trex_or_solve_cbc(m, &so, &c, NULL);
        v->cbc_ms = c.ms;
        if (g.status != TREX_OR_INFEASIBLE) {
            v->reject = g.status == TREX_OR_TIMELIMIT ? TREX_OR_REJ_TIME_LIMIT : TREX_OR_REJ_NOT_OPTIMAL;
            snprintf(v->why, sizeof v->why, "expected infeasible, GLPK says %s", trex_or_status_str(g.status));
        } else if (c.status != TREX_OR_INFEASIBLE) {
            v->reject = TREX_OR_REJ_DISAGREE;
            snprintf(v->why, sizeof v->why, "GLPK infeasible, CBC %s", trex_or_status_str(c.status));
        }
        goto out;
    }
    if (g.status != TREX_OR_OPTIMAL) {
        v->reject = g.status == TREX_OR_TIMELIMIT ? TREX_OR_REJ_TIME_LIMIT
                    : g.status == TREX_OR_NUMERIC ? TREX_OR_REJ_NUMERIC
                                                  : TREX_OR_REJ_NOT_OPTIMAL;
        snprintf(v->why, sizeof v->why, "GLPK status %s", trex_or_status_str(g.status));
        goto out;
    }
    v->obj = g.obj;
    trex_or_solve_cbc(m, &so, &c, NULL);
    v->cbc_ms = c.ms;
    v->cbc_obj = c.obj;
    if (c.status != TREX_OR_OPTIMAL || !trex_or_obj_close(c.obj, g.obj)) {
        v->reject = c.status == TREX_OR_TIMELIMIT ? TREX_OR_REJ_TIME_LIMIT : TREX_OR_REJ_DISAGREE;
        snprintf(v->why, sizeof v->why, "GLPK %.12g vs CBC %s %.12g", g.obj, trex_or_status_str(c.status), c.obj);
        goto out;
    }
    if (!trex_or_audit(m, g.x, g.obj, v->why, sizeof v->why)) {
        v->reject = TREX_OR_REJ_AUDIT;
        goto out;
    }
    bool mip = trex_or_is_mip(m);
    v->exact_obj = NAN;
    if (!mip) { /* LPs: certify with the rational simplex too */
        v->exact_obj = glpk_exact_obj(m, 2000);
        if (!trex_or_obj_close(v->exact_obj, g.obj)) {
            v->reject = TREX_OR_REJ_DISAGREE;
            snprintf(v->why, sizeof v->why, "glp_exact gives %.12g, simplex %.12g", v->exact_obj, g.obj);
            goto out;
        }
    }
    v->unique = g.basic_unique;
    if (mip) {
        /* round and fix the integers, re-solve the LP, recompute the objective */
        trex_or_model_copy(&fixed, m);
        have_fixed = true;
        for (int j = 0; j < m->ncols; j++)
            if (m->kind[j] != TREX_OR_CONT) {
                double r = nearbyint(g.x[j]);
                fixed.lb[j] = fixed.ub[j] = r;
                fixed.kind[j] = TREX_OR_CONT;
            }
        trex_or_solve_glpk(&fixed, &so, &f, NULL);
        if (f.status != TREX_OR_OPTIMAL || !trex_or_obj_close(f.obj, g.obj)) {
            v->reject = TREX_OR_REJ_AUDIT;
            snprintf(v->why, sizeof v->why, "fixed-integer re-solve gives %s %.12g, not %.12g",
                     trex_or_status_str(f.status), f.obj, g.obj);
            goto out;
        }
        trex_or_model relax;
        trex_or_model_copy(&relax, m);
        memset(relax.kind, 0, (size_t)relax.ncols);
        trex_or_solution rs;
        trex_or_solve_glpk(&relax, NULL, &rs, NULL);
        v->lp_relax_obj = rs.status == TREX_OR_OPTIMAL ? rs.obj : NAN;
        trex_or_solution_free(&rs);
        trex_or_model_free(&relax);
        v->unique = f.basic_unique && binary_part_unique(m, g.x, g.obj);
    }
    bool allzero = true;
    for (int j = 0; j < m->ncols; j++)
        if (fabs(g.x[j]) > 1e-9)
            allzero = false;
    if (allzero || fabs(g.obj) < 1e-9) {
        v->reject = TREX_OR_REJ_DEGENERATE_ZERO;
        snprintf(v->why, sizeof v->why, "objective %g with %s solution", g.obj, allzero ? "an all-zero" : "a");
        goto out;
    }
    v->binding = count_binding(m, g.x);
    v->x = g.x;
    g.x = NULL;
out:
    trex_or_solution_free(&g);
    trex_or_solution_free(&c);
    trex_or_solution_free(&f);
    if (have_fixed)
        trex_or_model_free(&fixed);
}

/* ---- analysis ---- */
trex_code trex_or_rhs_range(const trex_or_model *m, int row, double *lo, double *hi, trex_err *err)
{
    TREX_ASSERT(row >= 0 && row < m->nrows);
    trex_code rc = TREX_OK;
    int prev = or_glpk_quiet();
    glp_prob *P = to_glpk(m);
    glp_smcp p;
    glp_init_smcp(&p);
    p.msg_lev = GLP_MSG_OFF;
    p.presolve = GLP_OFF; /* ranging needs the final basis of the original problem */
    if (trex_or_is_mip(m)) {
        rc = trex_err_set(err, TREX_EINVAL, "model %s is a MILP; right-hand-side ranging is for LPs", m->name);
        goto out;
    }
    if (glp_simplex(P, &p) != 0 || glp_get_status(P) != GLP_OPT) {
        rc = trex_err_set(err, TREX_ESOLVER, "model %s: no optimal basis for ranging", m->name);
        goto out;
    }
    if (!glp_bf_exists(P) && glp_factorize(P) != 0) {
        rc = trex_err_set(err, TREX_ESOLVER, "model %s: basis factorization failed", m->name);
        goto out;
    }
    if (glp_get_row_stat(P, row + 1) == GLP_BS) {
        rc = trex_err_set(err, TREX_EINVAL, "row %s is basic (not binding): its shadow price is 0", m->row_name[row]);
        goto out;
    }
    double v1, v2;
    int k1, k2;
    glp_analyze_bound(P, row + 1, &v1, &k1, &v2, &k2);
    *lo = v1 <= -DBL_MAX ? -INFINITY : v1;
    *hi = v2 >= DBL_MAX ? INFINITY : v2;
out:
    glp_delete_prob(P);
    or_glpk_restore(prev);
    return rc;
}

static bool is_infeasible(const trex_or_model *m)
{
    trex_or_solution s;
    trex_or_solve_glpk(m, NULL, &s, NULL);
    bool inf = s.status == TREX_OR_INFEASIBLE;
    trex_or_solution_free(&s);
    return inf;
}

trex_code trex_or_iis(const trex_or_model *m, int *iis, int *n, trex_err *err)
{
    if (!is_infeasible(m))
        return trex_err_set(err, TREX_EINVAL, "model %s is not infeasible; no IIS to find", m->name);
    trex_or_model w;
    trex_or_model_copy(&w, m);
    int *orig = trex_xmalloc((size_t)(m->nrows + 1) * sizeof *orig); /* w's row -> m's row */
    for (int i = 0; i < m->nrows; i++)
        orig[i] = i;
    for (int r = w.nrows - 1; r >= 0; r--) {
        trex_or_model t;
        trex_or_model_copy(&t, &w);
        trex_or_del_row(&t, r);
        if (is_infeasible(&t)) { /* row r is not needed for infeasibility: drop it for good */
            trex_or_model_free(&w);
            w = t;
            memmove(orig + r, orig + r + 1, (size_t)(w.nrows - r) * sizeof *orig);
        } else
            trex_or_model_free(&t);
    }
    *n = w.nrows;
    memcpy(iis, orig, (size_t)w.nrows * sizeof *iis);
    trex_or_model_free(&w);
    free(orig);
    return TREX_OK;
}

trex_code trex_or_elastic(const trex_or_model *m, double *total, double *relax, trex_err *err)
{
    trex_code rc = TREX_OK;
    trex_or_model w;
    trex_or_model_copy(&w, m);
    memset(w.obj, 0, (size_t)w.ncols * sizeof *w.obj);
    w.sense = TREX_OR_MIN;
    int base = w.ncols;
    int *sp = trex_xmalloc((size_t)(m->nrows + 1) * sizeof *sp), *sm = trex_xmalloc((size_t)(m->nrows + 1) * sizeof *sm);
    for (int i = 0; i < m->nrows; i++) {
        char nm[TREX_OR_NAME_MAX];
        sp[i] = sm[i] = -1;
        char s = m->row_sense[i];
        if (s != 'G') { /* L or E: rhs may grow */
            snprintf(nm, sizeof nm, "elastic_up_%d", i);
            sp[i] = trex_or_add_col(&w, nm, 0, INFINITY, 1, TREX_OR_CONT);
        }
        if (s != 'L') {
            snprintf(nm, sizeof nm, "elastic_dn_%d", i);
            sm[i] = trex_or_add_col(&w, nm, 0, INFINITY, 1, TREX_OR_CONT);
        }
    }
    (void)base;
    /* rebuild rows with the elastic columns: a x - up + dn (sense) rhs */
    trex_or_model e;
    trex_or_model_init(&e, m->name, TREX_OR_MIN);
    for (int j = 0; j < w.ncols; j++)
        trex_or_add_col(&e, w.col_name[j], w.lb[j], w.ub[j], w.obj[j], (trex_or_kind)w.kind[j]);
    int *cols = trex_xmalloc((size_t)(w.ncols + 1) * sizeof *cols);
    double *co = trex_xmalloc((size_t)(w.ncols + 1) * sizeof *co);
    for (int i = 0; i < m->nrows; i++) {
        int n = 0;
        for (int64_t q = m->row_start[i]; q < m->row_start[i + 1]; q++) {
            cols[n] = m->idx[q];
            co[n++] = m->val[q];
        }
        if (sp[i] >= 0) {
            cols[n] = sp[i];
            co[n++] = -1;
        }
        if (sm[i] >= 0) {
            cols[n] = sm[i];
            co[n++] = 1;
        }
        trex_or_add_row(&e, m->row_name[i], m->role[i], n, cols, co, m->row_sense[i], m->rhs[i]);
    }
    trex_or_solution s;
    trex_or_solve_glpk(&e, NULL, &s, NULL);
    if (s.status != TREX_OR_OPTIMAL) {
        rc = trex_err_set(err, TREX_ESOLVER, "elastic model of %s not solved to optimality (%s)", m->name,
                          trex_or_status_str(s.status));
        goto out;
    }
    *total = s.obj;
    for (int i = 0; i < m->nrows; i++) {
        double up = sp[i] >= 0 ? s.x[sp[i]] : 0, dn = sm[i] >= 0 ? s.x[sm[i]] : 0;
        relax[i] = fabs(up - dn) < 1e-9 ? 0 : up - dn;
    }
out:
    trex_or_solution_free(&s);
    trex_or_model_free(&e);
    trex_or_model_free(&w);
    free(sp);
    free(sm);
    free(cols);
    free(co);
    return rc;
}

/* z(rhs = t) by a fresh GLPK solve; NAN when not optimal. */
static double z_at(const trex_or_model *m, int row, double t)
{
    trex_or_model w;
    trex_or_model_copy(&w, m);
    w.rhs[row] = t;
    trex_or_solution s;
    trex_or_solve_glpk(&w, NULL, &s, NULL);
    double z = s.status == TREX_OR_OPTIMAL ? s.obj : NAN;
    trex_or_solution_free(&s);
    trex_or_model_free(&w);
    return z;
}

bool trex_or_range_holds(const trex_or_model *m, int row, double z, double y, double lo, double hi)
{
    double b = m->rhs[row];
    if (!(lo <= b + 1e-9 * fmax(1, fabs(b)) && b - 1e-9 * fmax(1, fabs(b)) <= hi))
        return false;
    double ends[2] = {lo, hi};
    for (int k = 0; k < 2; k++) {
        double e = ends[k], dir = k ? 1 : -1;
        /* inside: halfway to the end (or 10 units when the end is infinite) the change is linear */
        double t_in = isfinite(e) ? b + 0.5 * (e - b) : b + dir * 10;
        if (fabs(t_in - b) > 1e-9) {
            double zi = z_at(m, row, t_in);
            if (isnan(zi) || !trex_or_obj_close(zi, z + y * (t_in - b)))
                return false;
        }
        /* outside: beyond a finite end the linear prediction no longer holds */
        if (isfinite(e)) {
            double t_out = e + dir * fmax(1.0, 0.1 * fabs(e - b));
            double zo = z_at(m, row, t_out);
            if (!isnan(zo) && trex_or_obj_close(zo, z + y * (t_out - b)))
                return false;
        }
    }
    return true;
}
