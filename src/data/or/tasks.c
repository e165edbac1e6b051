/* data/or/tasks.c — builds one SFT sample or one CPT document from (seed, slot, attempt).
 *
 * Every number an answer states comes from a solve, and before a sample is accepted the answer's LP is
 * re-parsed from the exact text (GLPK's reader) and re-solved; its structural hash must equal the IR's.
 * Analysis claims (shadow prices, what-if optima, IIS, minimal repair, the effect of a missing
 * constraint) are re-derived by re-solving the modified models. */
#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <Cbc_C_Interface.h>

#include "tasks.h"

const char *const or_task_names[OR_NTASK] = {"formulate", "code", "solve", "analyze"};
const char *const or_doc_names[OR_NDOC] = {"modeling_report", "modeling_rationale", "solver_walkthrough",
                                           "infeasibility_case"};
const double or_task_share[OR_NTASK] = {0.25, 0.25, 0.30, 0.20};
const double or_doc_share[OR_NDOC] = {0.35, 0.30, 0.20, 0.15};
static const char *const tier_names[3] = {"small", "medium", "large"};

static const char *const systems[] = {
    "You are an operations research assistant. You build correct optimization models and solve them.",
    "You are an expert in linear and integer programming. Be precise and show the model you use.",
    "You help planners turn business problems into mathematical optimization models.",
    "You are a careful OR analyst: state decisions, objective and constraints, then give verified results.",
    "You are a modelling assistant that writes optimization models in CPLEX LP format.",
    "You are an optimization consultant. Answer with clear models and exact numbers.",
};

static const char *const ask_formulate[] = {
    "Formulate a mathematical optimization model for this problem: give the sets, parameters, decision "
    "variables, objective and constraints, then write the model as a CPLEX LP file.",
    "Write down the mathematical model (sets, parameters, variables, objective, constraints) and give it as an "
    "LP file.",
    "Build an optimization model for the situation above. Explain the formulation and end with the model in "
    "CPLEX LP format.",
};
static const char *const ask_code[] = {
    "Write a CPLEX LP file that models this problem. Reply with the file only, in one ```lp fence.",
    "Give an LP-format model (CPLEX LP syntax) for this problem, as a single ```lp code block and nothing else.",
    "Produce the solver input for this problem as a CPLEX LP file in one fenced ```lp block.",
};
static const char *const ask_solve[] = {
    "Solve this problem. Show your reasoning and end with the line `Optimal objective value: <number>`.",
    "What is the optimal plan and its objective value? Explain the model you use, then finish with "
    "`Optimal objective value: <number>`.",
    "Find the optimum. Give the model, the solution and, as the last line, `Optimal objective value: <number>`.",
};

void or_result_free(or_result *r)
{
    free(r->line);
    free(r->dedup_text);
    r->line = r->dedup_text = NULL;
}

static void hex16(char *buf, uint64_t h) { snprintf(buf, 20, "%016llx", (unsigned long long)h); }

static int pick_weighted(or_rng *r, const double *w, int n)
{
    double u = or_rng_unif(r), acc = 0;
    for (int k = 0; k < n; k++) {
        acc += w[k];
        if (u < acc)
            return k;
    }
    return n - 1;
}

void or_drop_rows(trex_or_model *m, const char *const *names, int n)
{
    for (int k = 0; k < n; k++) {
        int r = trex_or_find_row(m, names[k]);
        if (r >= 0)
            trex_or_del_row(m, r);
    }
}

/* The model exactly as a reader of its LP text sees it (column order follows first appearance), so
 * that values which depend on the order, such as degenerate duals, match what a verifier recomputes. */
static void as_read_back(const trex_or_model *m, trex_or_model *out)
{
    char *lp = trex_or_lp_write(m);
    trex_err err = {0};
    trex_code rc = trex_or_lp_read(lp, strlen(lp), out, &err);
    TREX_ASSERT(rc == TREX_OK); /* our own writer's output always parses */
    free(lp);
}

/* ---- instance ---- */
static bool make_instance(uint64_t iseed, int family, or_inst *in, trex_or_verdict *v, or_result *res)
{
    or_rng r = or_rng_make(iseed, 1);
    static const double tw[3] = {0.3, 0.5, 0.2};
    int tier = pick_weighted(&r, tw, 3);
    const or_family *fam = or_family_get(family);
    or_inst_init(in, family, tier, fam->name, TREX_OR_MIN);
    fam->build(in, tier, &r);
    res->family = family;
    res->tier = tier;
    res->skin = in->skin;
    res->mip = trex_or_is_mip(&in->m);
    res->maxsense = in->m.sense == TREX_OR_MAX;
    res->n_vars = in->m.ncols;
    res->n_rows = in->m.nrows;
    res->nnz = in->m.nnz;
    res->canon = trex_or_canon_hash(&in->m);
    trex_or_verify_model(&in->m, true, v);
    res->glpk_ms = v->glpk_ms;
    res->cbc_ms = v->cbc_ms;
    if (v->reject != TREX_OR_ACCEPT) {
        res->reject = v->reject;
        snprintf(res->why, sizeof res->why, "%s", v->why);
        return false;
    }
    if (!res->mip && v->binding < 1) {
        res->reject = TREX_OR_REJ_NO_BINDING;
        snprintf(res->why, sizeof res->why, "no binding constraint");
        return false;
    }
    /* contract: every required role is present among the rows */
    for (int k = 0; k < in->ncfam; k++) {
        if (!in->cfam[k].required)
            continue;
        bool found = false;
        for (int i = 0; i < in->m.nrows && !found; i++)
            found = in->m.role[i] && !strcmp(in->m.role[i], in->cfam[k].role);
        if (!found) {
            res->reject = TREX_OR_REJ_CONTRACT_MISSING;
            snprintf(res->why, sizeof res->why, "role %s has no rows", in->cfam[k].role);
            return false;
        }
    }
    res->unique = v->unique;
    res->int_gap = res->mip && !isnan(v->lp_relax_obj)
                       ? fabs(v->lp_relax_obj - v->obj) / fmax(1e-9, fabs(v->obj))
                       : NAN;
    return true;
}

/* Parses the ```lp block of text, re-solves it and compares with z and the structural hash. */
static bool reparse_check(const char *text, double z, uint64_t canon, or_result *res)
{
    int n = 0;
    char *lp = or_fence_extract(text, "lp", &n);
    trex_or_model m;
    trex_err err = {0};
    bool ok = false;
    if (!lp || trex_or_lp_read(lp, strlen(lp), &m, &err) != TREX_OK) {
        res->reject = TREX_OR_REJ_REPARSE_FAIL;
        snprintf(res->why, sizeof res->why, "answer LP does not parse: %.200s", err.msg);
        free(lp);
        return false;
    }
    trex_or_solution s;
    trex_or_solve_glpk(&m, NULL, &s, NULL);
    if (s.status != TREX_OR_OPTIMAL || !trex_or_obj_close(s.obj, z) || trex_or_canon_hash(&m) != canon) {
        res->reject = TREX_OR_REJ_REPARSE_MISMATCH;
        snprintf(res->why, sizeof res->why, "answer LP re-solves to %s %.10g, want %.10g", trex_or_status_str(s.status),
                 s.obj, z);
    } else
        ok = true;
    trex_or_solution_free(&s);
    trex_or_model_free(&m);
    free(lp);
    return ok;
}

static void meta_common(or_sb *b, const or_inst *in, const trex_or_verdict *v, double z, const char *status,
                        uint64_t iseed, int64_t slot, int attempt, uint64_t canon)
{
    const trex_or_model *m = &in->m;
    int nint = 0;
    for (int j = 0; j < m->ncols; j++)
        nint += m->kind[j] != TREX_OR_CONT;
    char h[20], zs[40];
    or_sb_printf(b, "\"family\":\"%s\",\"skin\":\"%s\",\"difficulty\":\"%s\",\"model_type\":\"%s\",\"sense\":\"%s\","
                    "\"n_vars\":%d,\"n_int\":%d,\"n_rows\":%d,\"nnz\":%lld,",
                 or_family_get(in->family)->name, in->skin, tier_names[in->tier], nint ? "MILP" : "LP",
                 m->sense == TREX_OR_MAX ? "max" : "min", m->ncols, nint, m->nrows, (long long)m->nnz);
    if (isnan(z))
        or_sb_put(b, "\"objective\":null,");
    else {
        snprintf(zs, sizeof zs, "%.12g", or_snap(z));
        or_sb_printf(b, "\"objective\":%s,", zs);
    }
    or_sb_printf(b, "\"status\":\"%s\",\"unique_optimum\":%s,", status, v && v->unique ? "true" : "false");
    if (v && !isnan(v->lp_relax_obj))
        or_sb_printf(b, "\"lp_relaxation\":%.12g,", or_snap(v->lp_relax_obj));
    hex16(h, iseed);
    or_sb_printf(b, "\"instance_seed\":\"0x%s\",\"slot\":%lld,\"attempt\":%d,", h, (long long)slot, attempt);
    hex16(h, canon);
    or_sb_printf(b, "\"ir_hash\":\"%s\",\"gen_version\":\"%s\",\"glpk\":\"%s\",\"cbc\":\"%s\"", h, OR_GEN_VERSION,
                 glp_version(), Cbc_getVersion());
}

/* ---- analyses ---- */
typedef struct analysis {
    char kind[24];
    or_sb meta;   /* JSON members (no braces) */
    or_sb answer; /* explanation text */
    char *user_lp;      /* LP shown to the user (owned) */
    bool infeasible;    /* the user's model is infeasible */
    double z_claim;     /* the number the answer ends with (NAN when none) */
} analysis;

static void analysis_free(analysis *a)
{
    or_sb_free(&a->meta);
    or_sb_free(&a->answer);
    free(a->user_lp);
}

static double solve_z(const trex_or_model *m, trex_or_status *st)
{
    trex_or_solution s;
    trex_or_solve_glpk(m, NULL, &s, NULL);
    double z = s.status == TREX_OR_OPTIMAL ? s.obj : NAN;
    if (st)
        *st = s.status;
    trex_or_solution_free(&s);
    return z;
}

/* (a) shadow price of a binding row, confirmed by a re-solve with a changed right-hand side. */
static bool an_sensitivity(const or_inst *in, const trex_or_verdict *v, or_rng *r, analysis *a)
{
    const trex_or_model *m = &in->m;
    if (trex_or_is_mip(m))
        return false;
    trex_or_solve_opts so = {.want_duals = true};
    trex_or_solution s;
    trex_or_model rb;
    as_read_back(m, &rb);
    trex_or_solve_glpk(&rb, &so, &s, NULL);
    bool ok = false;
    int cand[256], nc = 0;
    for (int i = 0; i < m->nrows && nc < 256; i++)
        if (s.dual && fabs(s.dual[i]) > 1e-7 && m->row_sense[i] != 'E')
            cand[nc++] = i;
    if (s.status != TREX_OR_OPTIMAL || nc == 0)
        goto out;
    int row = cand[or_rng_int(r, 0, nc - 1)];
    double b = m->rhs[row];
    static const double steps[] = {10, 5, 2, 1};
    for (size_t k = 0; k < sizeof steps / sizeof steps[0] && !ok; k++) {
        double d = steps[k] * (m->row_sense[row] == 'G' ? -1 : 1);
        if (b + d < 0 && b >= 0)
            continue;
        trex_or_model w;
        trex_or_model_copy(&w, m);
        w.rhs[row] = b + d;
        double z2 = solve_z(&w, NULL);
        trex_or_model_free(&w);
        if (isnan(z2) || !trex_or_obj_close(z2, v->obj + s.dual[row] * d))
            continue;
        char ys[40], zs[40], z2s[40], bs[40], b2s[40], ds[40];
        or_fmt_value(ys, sizeof ys, s.dual[row]);
        or_fmt_value(zs, sizeof zs, v->obj);
        or_fmt_value(z2s, sizeof z2s, z2);
        or_fmt_value(bs, sizeof bs, b);
        or_fmt_value(b2s, sizeof b2s, b + d);
        or_fmt_value(ds, sizeof ds, d);
        snprintf(a->kind, sizeof a->kind, "sensitivity");
        or_sb_printf(&a->meta, "\"kind\":\"sensitivity\",\"row\":\"%s\",\"delta\":%s,\"shadow_price\":%s,"
                               "\"new_objective\":%.12g,\"question_row_rhs\":%s",
                     m->row_name[row], ds, ys, or_snap(z2), b2s);
        a->user_lp = trex_or_lp_write(m);
        or_sb_printf(&a->answer,
                     "At the optimum (objective %s) the constraint `%s` (%s) is binding. Its shadow price (the dual "
                     "value GLPK reports) is %s: each extra unit of its right-hand side changes the optimal "
                     "objective by %s while the optimal basis stays the same.\n\nChanging the right-hand side "
                     "from %s to %s (a change of %s) therefore moves the optimum to %s + (%s) * (%s) = %s. "
                     "Re-solving the modified model confirms this value.\n",
                     zs, m->row_name[row], in->row_desc[row], ys, ys, bs, b2s, ds, zs, ys, ds, z2s);
        /* the validity range, stated only when re-solves inside and just outside confirm it */
        double lo, hi;
        if (trex_or_rhs_range(&rb, row, &lo, &hi, NULL) == TREX_OK &&
            trex_or_range_holds(&rb, row, v->obj, s.dual[row], lo, hi)) {
            char los[40], his[40];
            or_fmt_value(los, sizeof los, lo);
            or_fmt_value(his, sizeof his, hi);
            or_sb_printf(&a->meta, ",\"range_lo\":%s,\"range_hi\":%s", isfinite(lo) ? los : "null",
                         isfinite(hi) ? his : "null");
            if (isfinite(lo) && isfinite(hi))
                or_sb_printf(&a->answer, "\nRanging (GLPK's glp_analyze_bound) shows that this shadow price holds "
                                         "while the right-hand side of `%s` stays between %s and %s; re-solving "
                                         "inside that interval confirms the linear change, and beyond either end "
                                         "the rate changes.\n",
                             m->row_name[row], los, his);
            else if (isfinite(lo) || isfinite(hi))
                or_sb_printf(&a->answer, "\nRanging (GLPK's glp_analyze_bound) shows that this shadow price holds "
                                         "while the right-hand side of `%s` stays %s %s; re-solving inside that "
                                         "range confirms the linear change, and beyond %s the rate changes.\n",
                             m->row_name[row], isfinite(lo) ? "at least" : "at most", isfinite(lo) ? los : his,
                             isfinite(lo) ? los : his);
            else
                or_sb_printf(&a->answer, "\nRanging (GLPK's glp_analyze_bound) shows that this shadow price holds "
                                         "for every value of the right-hand side of `%s`.\n",
                             m->row_name[row]);
        }
        or_sb_printf(&a->answer, "\nNew optimal objective value: %s\n", z2s);
        a->z_claim = z2;
        ok = true;
    }
out:
    trex_or_solution_free(&s);
    trex_or_model_free(&rb);
    return ok;
}

/* (b) what-if: one right-hand side (or, when no right-hand side is a usable number, one objective
 * coefficient) changes; the new optimum comes from a re-solve, confirmed by CBC. */
static bool an_whatif(const or_inst *in, const trex_or_verdict *v, or_rng *r, analysis *a)
{
    const trex_or_model *m = &in->m;
    int cand[512], nc = 0;
    for (int i = 0; i < m->nrows && nc < 512; i++)
        if (m->rhs[i] >= 2)
            cand[nc++] = i;
    bool use_obj = nc == 0 || or_rng_unif(r) < 0.3;
    int ccand[512], ncc = 0;
    for (int j = 0; j < m->ncols && ncc < 512; j++)
        if (m->obj[j] >= 2)
            ccand[ncc++] = j;
    if (use_obj && ncc == 0)
        use_obj = false;
    if (!use_obj && nc == 0)
        return false;
    static const double f[] = {0.5, 0.8, 0.9, 1.1, 1.25, 1.5};
    int idx = use_obj ? ccand[or_rng_int(r, 0, ncc - 1)] : cand[or_rng_int(r, 0, nc - 1)];
    double b = use_obj ? m->obj[idx] : m->rhs[idx], b2 = nearbyint(b * f[or_rng_int(r, 0, 5)]);
    if (b2 == b)
        b2 = b + 1;
    trex_or_model w;
    trex_or_model_copy(&w, m);
    if (use_obj)
        w.obj[idx] = b2;
    else
        w.rhs[idx] = b2;
    trex_or_status st;
    double z2 = solve_z(&w, &st);
    trex_or_solution cs;
    trex_or_solve_cbc(&w, NULL, &cs, NULL);
    bool agree = st == TREX_OR_OPTIMAL ? (cs.status == TREX_OR_OPTIMAL && trex_or_obj_close(cs.obj, z2))
                                       : (st == TREX_OR_INFEASIBLE && cs.status == TREX_OR_INFEASIBLE);
    trex_or_solution_free(&cs);
    trex_or_model_free(&w);
    if (!agree)
        return false;
    char zs[40], z2s[40], bs[40], b2s[40], dz[40], what[200];
    or_fmt_value(zs, sizeof zs, v->obj);
    or_fmt_value(bs, sizeof bs, b);
    or_fmt_value(b2s, sizeof b2s, b2);
    snprintf(a->kind, sizeof a->kind, "whatif");
    a->user_lp = trex_or_lp_write(m);
    if (use_obj) {
        or_sb_printf(&a->meta, "\"kind\":\"whatif\",\"col\":\"%s\",\"new_obj_coef\":%s,\"new_status\":\"%s\"",
                     m->col_name[idx], b2s, trex_or_status_str(st));
        snprintf(what, sizeof what, "The objective coefficient of `%s` (%s) is %s; with %s instead", m->col_name[idx],
                 in->col_desc[idx], bs, b2s);
    } else {
        or_sb_printf(&a->meta, "\"kind\":\"whatif\",\"row\":\"%s\",\"new_rhs\":%s,\"new_status\":\"%s\"",
                     m->row_name[idx], b2s, trex_or_status_str(st));
        snprintf(what, sizeof what, "The constraint `%s` (%s) has right-hand side %s; with %s instead",
                 m->row_name[idx], in->row_desc[idx], bs, b2s);
    }
    if (st == TREX_OR_OPTIMAL) {
        or_fmt_value(z2s, sizeof z2s, z2);
        or_fmt_value(dz, sizeof dz, z2 - v->obj);
        or_sb_printf(&a->meta, ",\"new_objective\":%.12g", or_snap(z2));
        or_sb_printf(&a->answer,
                     "The original optimum is %s. %s, the model has to be solved again, since the change may alter "
                     "which constraints bind%s. Re-solving the modified model gives an optimum of %s, a change of "
                     "%s.\n\nNew optimal objective value: %s\n",
                     zs, what, trex_or_is_mip(m) ? " and, for an integer model, which integer solution is best" : "",
                     z2s, dz, z2s);
        a->z_claim = z2;
    } else {
        or_sb_printf(&a->answer,
                     "The original optimum is %s. %s, no plan satisfies all constraints any more: re-solving reports "
                     "the modified model infeasible (GLPK and CBC agree).\n\nThe modified problem is "
                     "infeasible.\n",
                     zs, what);
        a->z_claim = NAN;
    }
    return true;
}

/* (c) an infeasible variant: IIS by deletion filter and the minimal total relaxation. */
static bool make_infeasible(const trex_or_model *m, trex_or_model *w, char *what, size_t what_len)
{
    static const double fl[] = {0.3, 0.1}, fg[] = {3, 10};
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < m->nrows; i++) {
            const char *role = m->role[i];
            if (!role || m->rhs[i] == 0)
                continue;
            bool lrow = m->row_sense[i] == 'L';
            if (pass == 0 && !lrow)
                continue;
            if (pass == 1 && lrow)
                continue;
            /* scale every row of this role the same way */
            trex_or_model_copy(w, m);
            for (int k = 0; k < w->nrows; k++)
                if (w->role[k] == role && w->rhs[k] != 0)
                    w->rhs[k] = nearbyint(w->rhs[k] * (lrow ? fl[0] : fg[0]));
            trex_or_status st;
            solve_z(w, &st);
            if (st == TREX_OR_INFEASIBLE) {
                snprintf(what, what_len, "%s", role);
                return true;
            }
            trex_or_model_free(w);
            break; /* one role per sense class is enough to try */
        }
    return false;
}

static bool an_infeasible(const or_inst *in, analysis *a, trex_or_model *wout, double *total_out)
{
    const trex_or_model *m = &in->m;
    trex_or_model w;
    char role[64];
    if (!make_infeasible(m, &w, role, sizeof role))
        return false;
    trex_or_verdict vd;
    trex_or_verify_model(&w, false, &vd);
    bool ok = vd.reject == TREX_OR_ACCEPT;
    trex_or_verdict_free(&vd);
    int *iis = trex_xmalloc((size_t)(w.nrows + 1) * sizeof *iis), n = 0;
    double total = 0, *relax = trex_xcalloc((size_t)w.nrows + 1, sizeof *relax);
    trex_err err = {0};
    if (!ok || trex_or_iis(&w, iis, &n, &err) != TREX_OK || trex_or_elastic(&w, &total, relax, &err) != TREX_OK ||
        n == 0 || n > 12) {
        ok = false;
        goto out;
    }
    /* the repaired model must be feasible */
    trex_or_model rep;
    trex_or_model_copy(&rep, &w);
    for (int i = 0; i < rep.nrows; i++)
        rep.rhs[i] += relax[i];
    trex_or_status st;
    solve_z(&rep, &st);
    trex_or_model_free(&rep);
    if (st != TREX_OR_OPTIMAL) {
        ok = false;
        goto out;
    }
    snprintf(a->kind, sizeof a->kind, "infeasible");
    a->user_lp = trex_or_lp_write(&w);
    a->infeasible = true;
    char ts[40];
    or_fmt_value(ts, sizeof ts, total);
    or_sb_put(&a->meta, "\"kind\":\"infeasible\",\"iis\":[");
    for (int k = 0; k < n; k++)
        or_sb_printf(&a->meta, "%s\"%s\"", k ? "," : "", w.row_name[iis[k]]);
    or_sb_printf(&a->meta, "],\"relaxation\":%.12g", or_snap(total));
    or_sb_printf(&a->answer, "The model has no feasible solution. A deletion filter (drop one constraint at a "
                             "time and keep it dropped whenever the rest is still infeasible) leaves this "
                             "irreducible infeasible subset of %d constraint%s:\n",
                 n, n > 1 ? "s" : "");
    for (int k = 0; k < n; k++)
        or_sb_printf(&a->answer, "- `%s` (%s)\n", w.row_name[iis[k]], in->row_desc[iis[k]]);
    or_sb_printf(&a->answer, "\nThese constraints cannot hold together, while removing any one of them makes the "
                             "rest feasible. The likely data error is in the %s constraints.\n\nTo find the "
                             "smallest repair, add an elastic variable to every right-hand side and minimise their "
                             "sum. The minimum total relaxation is %s:\n",
                 role, ts);
    for (int i = 0; i < w.nrows; i++)
        if (relax[i] != 0) {
            char a1[40], a2[40], a3[40];
            or_fmt_value(a1, sizeof a1, w.rhs[i]);
            or_fmt_value(a2, sizeof a2, w.rhs[i] + relax[i]);
            or_fmt_value(a3, sizeof a3, relax[i]);
            or_sb_printf(&a->answer, "- `%s`: right-hand side %s -> %s (change %s)\n", w.row_name[i], a1, a2, a3);
        }
    or_sb_printf(&a->answer, "\nWith these changes GLPK finds a feasible plan again.\n\nMinimum total relaxation: %s\n",
                 ts);
    a->z_claim = NAN;
    *total_out = total;
out:
    if (ok && wout)
        trex_or_model_copy(wout, &w);
    trex_or_model_free(&w);
    free(iis);
    free(relax);
    return ok;
}

/* (d) a bug: one required constraint family is missing from the LP; the answer restores it. */
static bool an_debug(const or_inst *in, const trex_or_verdict *v, or_rng *r, analysis *a)
{
    const trex_or_model *m = &in->m;
    int order[OR_MAX_CFAM];
    for (int k = 0; k < in->ncfam; k++)
        order[k] = k;
    or_rng_shuffle(r, order, in->ncfam);
    for (int t = 0; t < in->ncfam; t++) {
        const or_cfam *cf = &in->cfam[order[t]];
        if (!cf->required)
            continue;
        trex_or_model w;
        trex_or_model_copy(&w, m);
        for (int i = w.nrows - 1; i >= 0; i--)
            if (w.role[i] == cf->role)
                trex_or_del_row(&w, i);
        if (w.nrows == 0 || w.nrows == m->nrows) {
            trex_or_model_free(&w);
            continue;
        }
        trex_or_status st;
        double zb = solve_z(&w, &st);
        if (st == TREX_OR_OPTIMAL && trex_or_obj_close(zb, v->obj)) {
            trex_or_model_free(&w);
            continue;
        }
        if (st != TREX_OR_OPTIMAL && st != TREX_OR_UNBOUNDED) {
            trex_or_model_free(&w);
            continue;
        }
        snprintf(a->kind, sizeof a->kind, "debug");
        a->user_lp = trex_or_lp_write(&w);
        char zs[40], zbs[40];
        or_fmt_value(zs, sizeof zs, v->obj);
        or_sb_printf(&a->meta, "\"kind\":\"debug\",\"missing_role\":\"%s\",\"buggy_status\":\"%s\"", cf->role,
                     trex_or_status_str(st));
        if (st == TREX_OR_OPTIMAL) {
            or_fmt_value(zbs, sizeof zbs, zb);
            or_sb_printf(&a->meta, ",\"buggy_objective\":%.12g", or_snap(zb));
            or_sb_printf(&a->answer, "The LP leaves out the %s constraints: %s. Without them the solver returns %s, "
                                     "which is not the optimum of the stated problem.",
                         cf->role, cf->desc, zbs);
        } else
            or_sb_printf(&a->answer, "The LP leaves out the %s constraints: %s. Without them the model is "
                                     "unbounded, so the solver cannot return a plan.",
                         cf->role, cf->desc);
        or_sb_printf(&a->answer, " In the formulation this family reads $%s$. Adding the missing rows gives the "
                                 "corrected model:\n\n",
                     cf->math);
        or_render_lp_block(m, &a->answer);
        or_sb_printf(&a->answer, "\nThe corrected model solves to %s (GLPK, confirmed by CBC).\n\nOptimal objective "
                                 "value: %s\n",
                     zs, zs);
        a->z_claim = v->obj;
        trex_or_model_free(&w);
        return true;
    }
    return false;
}

/* ---- SFT ---- */
static void put_msg(or_sb *b, const char *role, const char *content, bool first)
{
    or_sb_printf(b, "%s{\"role\":\"%s\",\"content\":", first ? "" : ",", role);
    or_sb_json_str(b, content);
    or_sb_putc(b, '}');
}

void or_make_sft(uint64_t seed, int64_t slot, int attempt, int task, int family, bool no_system, or_result *res)
{
    memset(res, 0, sizeof *res);
    res->task = task;
    res->int_gap = NAN;
    uint64_t iseed = or_hash2(or_hash2(seed, 0x5f7), (uint64_t)slot * 64 + (uint64_t)attempt);
    or_rng r = or_rng_make(iseed, 2);
    or_inst *in = trex_xcalloc(1, sizeof *in);
    trex_or_verdict v = {0};
    or_sb user = {0}, asst = {0}, meta = {0}, line = {0};
    analysis an = {0};
    an.z_claim = NAN;
    bool have_v = false;
    if (!make_instance(iseed, family, in, &v, res))
        goto out;
    have_v = true;
    res->rep = pick_weighted(&r, (const double[]){0.5, 0.25, 0.25}, 3);
    or_render_problem(in, res->rep, &r, &user);
    char why[256];
    trex_or_reject g = or_text_gates(in, user.s, v.obj, why, sizeof why);
    if (g != TREX_OR_ACCEPT) {
        res->reject = g;
        snprintf(res->why, sizeof res->why, "%s", why);
        goto out;
    }
    double z = v.obj;
    const char *status = "optimal";
    char zs[40];
    or_fmt_value(zs, sizeof zs, z);
    if (task == OR_TASK_FORMULATE) {
        or_sb_printf(&user, "\n\n%s", OR_PICK(&r, ask_formulate));
        or_render_think(in, &r, &asst);
        or_render_formulation(in, &asst);
        or_sb_put(&asst, "\nThe same model as a CPLEX LP file:\n\n");
        or_render_lp_block(&in->m, &asst);
        if (!reparse_check(asst.s, z, res->canon, res))
            goto out;
    } else if (task == OR_TASK_CODE) {
        or_sb_printf(&user, "\n\n%s", OR_PICK(&r, ask_code));
        or_render_lp_block(&in->m, &asst);
        if (!reparse_check(asst.s, z, res->canon, res))
            goto out;
    } else if (task == OR_TASK_SOLVE) {
        or_sb_printf(&user, "\n\n%s", OR_PICK(&r, ask_solve));
        or_render_think(in, &r, &asst);
        or_render_formulation(in, &asst);
        or_sb_put(&asst, "\nAs an LP file:\n\n");
        or_render_lp_block(&in->m, &asst);
        or_sb_put(&asst, "\n");
        or_render_solution(in, &v, &asst);
        or_sb_printf(&asst, "\nOptimal objective value: %s", zs);
        if (!reparse_check(asst.s, z, res->canon, res))
            goto out;
    } else {
        /* ANALYZE: the kind follows the model type; fall back in a fixed order */
        int pref = or_rng_int(&r, 0, 3);
        bool ok = false;
        double total = 0;
        for (int t = 0; t < 4 && !ok; t++) {
            int k = (pref + t) % 4;
            analysis_free(&an);
            memset(&an, 0, sizeof an);
            an.z_claim = NAN;
            ok = k == 0   ? an_sensitivity(in, &v, &r, &an)
                 : k == 1 ? an_whatif(in, &v, &r, &an)
                 : k == 2 ? an_infeasible(in, &an, NULL, &total)
                          : an_debug(in, &v, &r, &an);
        }
        if (!ok) {
            res->reject = TREX_OR_REJ_ANALYSIS;
            snprintf(res->why, sizeof res->why, "no analysis question could be verified");
            goto out;
        }
        snprintf(res->analysis_kind, sizeof res->analysis_kind, "%s", an.kind);
        char ts[40];
        const char *rn = strstr(an.meta.s, "\"row\":\"");
        char rowname[TREX_OR_NAME_MAX] = "";
        if (rn)
            sscanf(rn + 7, "%32[A-Za-z0-9_]", rowname);
        if (!strcmp(an.kind, "sensitivity")) {
            const char *d = strstr(an.meta.s, "\"question_row_rhs\":");
            snprintf(ts, sizeof ts, "%s", d ? d + 19 : "?");
            or_sb_printf(&user, "\n\nA correct LP model of this problem is:\n\n```lp\n%s```\n\nWhat is the shadow "
                                "price of constraint `%s`, and what would the optimal objective value be if its "
                                "right-hand side were changed to %s? End with `New optimal objective value: "
                                "<number>`.",
                         an.user_lp, rowname, ts);
        } else if (!strcmp(an.kind, "whatif")) {
            const char *d = strstr(an.meta.s, "\"new_rhs\":"), *dc = strstr(an.meta.s, "\"new_obj_coef\":");
            const char *cn = strstr(an.meta.s, "\"col\":\"");
            char colname[TREX_OR_NAME_MAX] = "";
            if (cn)
                sscanf(cn + 7, "%32[A-Za-z0-9_]", colname);
            double nb = d ? strtod(d + 10, NULL) : dc ? strtod(dc + 15, NULL) : 0;
            or_fmt_value(ts, sizeof ts, nb);
            if (dc)
                or_sb_printf(&user, "\n\nA correct LP model of this problem is:\n\n```lp\n%s```\n\nWhat happens to "
                                    "the optimum if the objective coefficient of `%s` becomes %s? Give the new optimal "
                                    "objective value (`New optimal objective value: <number>`) or say that the "
                                    "modified problem is infeasible.",
                             an.user_lp, colname, ts);
            else
                or_sb_printf(&user, "\n\nA correct LP model of this problem is:\n\n```lp\n%s```\n\nWhat happens to "
                                    "the optimum if the right-hand side of `%s` becomes %s? Give the new optimal "
                                    "objective value (`New optimal objective value: <number>`) or say that the "
                                    "modified problem is infeasible.",
                             an.user_lp, rowname, ts);
        } else if (!strcmp(an.kind, "infeasible")) {
            or_sb_free(&user); /* the data changed: the question shows the intro and the LP only */
            or_sb_put(&user, in->intro);
            or_sb_put(&user, "\n\n");
            or_sb_printf(&user, "GLPK reports that the following LP model, written for the problem above after a "
                                "data update, is infeasible:\n\n```lp\n%s```\n\nExplain which constraints conflict "
                                "and give the smallest total change of right-hand sides that restores feasibility "
                                "(end with `Minimum total relaxation: <number>`).",
                         an.user_lp);
            z = NAN;
            status = "infeasible";
        } else {
            or_sb_printf(&user, "\n\nA colleague wrote this LP for it, but the result looks wrong:\n\n```lp\n%s```"
                                "\n\nFind the modelling error, give the corrected LP file and its optimal objective "
                                "value (`Optimal objective value: <number>`).",
                         an.user_lp);
        }
        or_sb_put(&asst, an.answer.s);
        if (!strcmp(an.kind, "debug") && !reparse_check(asst.s, z, res->canon, res))
            goto out;
        res->infeasible = an.infeasible;
    }
    /* the final-line check for SOLVE: the number printed is the verified optimum */
    if (task == OR_TASK_SOLVE) {
        const char *p = strrchr(asst.s, '\n');
        double zz = p ? strtod(p + 1 + strlen("Optimal objective value: "), NULL) : NAN;
        if (!p || strncmp(p + 1, "Optimal objective value: ", 25) || !trex_or_obj_close(zz, z)) {
            res->reject = TREX_OR_REJ_REPARSE_MISMATCH;
            snprintf(res->why, sizeof res->why, "final line does not state the optimum");
            goto out;
        }
    }
    /* assemble the JSONL record */
    char id[20];
    hex16(id, or_hash2(iseed, (uint64_t)task));
    or_sb_printf(&line, "{\"id\":\"or-sft-%s\",\"messages\":[", id);
    bool first = true;
    if (!no_system) {
        put_msg(&line, "system", OR_PICK(&r, systems), true);
        first = false;
    }
    put_msg(&line, "user", user.s, first);
    put_msg(&line, "assistant", asst.s, false);
    or_sb_printf(&line, "],\"metadata\":{\"task\":\"%s\",\"representation\":\"%s\",", or_task_names[task],
                 or_rep_names[res->rep]);
    meta_common(&line, in, &v, z, status, iseed, slot, attempt, res->canon);
    or_sb_printf(&line, ",\"verify\":{\"glpk\":\"OPT\",\"cbc\":\"agree\",\"exact\":%s,\"reparse\":\"ok\","
                        "\"number_coverage\":1.0}",
                 res->mip ? "null" : "\"agree\"");
    if (an.kind[0])
        or_sb_printf(&line, ",\"analysis\":{%s}", an.meta.s);
    or_sb_put(&line, "}}");
    res->line = or_sb_take(&line);
    res->user_len = (int64_t)user.len;
    res->asst_len = (int64_t)asst.len;
    res->dedup_text = or_sb_take(&user);
    res->reject = TREX_OR_ACCEPT;
out:
    analysis_free(&an);
    if (have_v)
        trex_or_verdict_free(&v);
    or_inst_free(in);
    free(in);
    or_sb_free(&user);
    or_sb_free(&asst);
    or_sb_free(&meta);
    or_sb_free(&line);
}

/* ---- CPT ---- */
static const char *const audiences[] = {"OR practitioner", "implementation engineer", "data-science trainee",
                                        "planning executive"};
static const char *const styles[] = {"analyst memo", "modelling notebook", "solver validation note",
                                     "implementation walkthrough"};

static void doc_title(or_sb *b, const or_inst *in, const char *kind)
{
    const char *fam = or_family_get(in->family)->name;
    or_sb_printf(b, "# %s: %s (%s)\n\n", kind, fam, in->skin);
}

/* Drops each required role in turn and reports the measured effect; checks go into meta. */
static void doc_mistakes(const or_inst *in, const trex_or_verdict *v, or_sb *b, or_sb *meta)
{
    const trex_or_model *m = &in->m;
    char zs[40];
    or_fmt_value(zs, sizeof zs, v->obj);
    or_sb_put(b, "## Common mistakes and their measured effect\n\n");
    or_sb_put(meta, ",\"checks\":[");
    int n = 0;
    for (int k = 0; k < in->ncfam && n < 3; k++) {
        const or_cfam *cf = &in->cfam[k];
        trex_or_model w;
        trex_or_model_copy(&w, m);
        or_sb names = {0};
        for (int i = w.nrows - 1; i >= 0; i--)
            if (w.role[i] == cf->role) {
                or_sb_printf(&names, "%s\"%s\"", names.len ? "," : "", w.row_name[i]);
                trex_or_del_row(&w, i);
            }
        if (w.nrows == m->nrows || w.nrows == 0) {
            trex_or_model_free(&w);
            or_sb_free(&names);
            continue;
        }
        trex_or_status st;
        double zb = solve_z(&w, &st);
        trex_or_model_free(&w);
        if (st != TREX_OR_OPTIMAL && st != TREX_OR_UNBOUNDED) {
            or_sb_free(&names);
            continue;
        }
        if (st == TREX_OR_UNBOUNDED)
            or_sb_printf(b, "- Leaving out the %s constraints (%s) makes the model unbounded: the solver has "
                            "nothing to stop the objective from improving forever.\n",
                         cf->role, cf->desc);
        else if (trex_or_obj_close(zb, v->obj))
            or_sb_printf(b, "- Leaving out the %s constraints (%s) happens not to change the optimum here (%s): "
                            "on this instance they are implied by the others, but that is luck, not a "
                            "modelling rule.\n",
                         cf->role, cf->desc, zs);
        else {
            char zbs[40];
            or_fmt_value(zbs, sizeof zbs, zb);
            or_sb_printf(b, "- Leaving out the %s constraints (%s) changes the optimum from %s to %s.\n", cf->role,
                         cf->desc, zs, zbs);
        }
        or_sb_printf(meta, "%s{\"drop\":[%s],\"status\":\"%s\"", n ? "," : "", names.s, trex_or_status_str(st));
        if (st == TREX_OR_OPTIMAL)
            or_sb_printf(meta, ",\"objective\":%.12g", or_snap(zb));
        or_sb_putc(meta, '}');
        or_sb_free(&names);
        n++;
    }
    or_sb_put(meta, "]");
    or_sb_put(b, "\nEach number above comes from re-solving the model with that constraint family removed.\n\n");
}

void or_make_cpt(uint64_t seed, int64_t slot, int attempt, int doc, int family, or_result *res)
{
    memset(res, 0, sizeof *res);
    res->task = doc;
    res->int_gap = NAN;
    uint64_t iseed = or_hash2(or_hash2(seed, 0xc97), (uint64_t)slot * 64 + (uint64_t)attempt);
    or_rng r = or_rng_make(iseed, 2);
    or_inst *in = trex_xcalloc(1, sizeof *in);
    trex_or_verdict v = {0};
    or_sb text = {0}, meta = {0}, line = {0}, prob = {0};
    analysis an = {0};
    bool have_v = false;
    if (!make_instance(iseed, family, in, &v, res))
        goto out;
    have_v = true;
    res->rep = pick_weighted(&r, (const double[]){0.5, 0.25, 0.25}, 3);
    or_render_problem(in, res->rep, &r, &prob);
    char why[256];
    trex_or_reject g = or_text_gates(in, prob.s, v.obj, why, sizeof why);
    if (g != TREX_OR_ACCEPT) {
        res->reject = g;
        snprintf(res->why, sizeof res->why, "%s", why);
        goto out;
    }
    const char *aud = OR_PICK(&r, audiences), *sty = OR_PICK(&r, styles);
    bool sol_first = or_rng_unif(&r) < 0.3;
    double z = v.obj;
    const char *status = "optimal";
    char zs[40];
    or_fmt_value(zs, sizeof zs, z);
    if (doc == OR_DOC_INFEASIBLE) {
        double total = 0;
        an.z_claim = NAN;
        if (!an_infeasible(in, &an, NULL, &total)) {
            res->reject = TREX_OR_REJ_ANALYSIS;
            snprintf(res->why, sizeof res->why, "no verified infeasible variant");
            goto out;
        }
        doc_title(&text, in, "Infeasibility case");
        or_sb_printf(&text, "%s\n\nAfter a data update the model below no longer has a feasible solution.\n\n"
                            "```lp\n%s```\n\n## Diagnosis\n\n%s",
                     in->intro, an.user_lp, an.answer.s);
        or_sb_printf(&meta, ",\"analysis\":{%s}", an.meta.s);
        z = NAN;
        status = "infeasible";
    } else {
        const char *kind = doc == OR_DOC_REPORT ? "Model report" : doc == OR_DOC_RATIONALE ? "Modelling rationale"
                                                                                           : "Solver walkthrough";
        doc_title(&text, in, kind);
        or_sb_printf(&text, "*A %s for a %s.*\n\n## Problem\n\n%s\n\n", sty, aud, prob.s);
        if (sol_first && doc == OR_DOC_REPORT) {
            or_sb_put(&text, "## Result first\n\n");
            or_render_solution(in, &v, &text);
            or_sb_put(&text, "\n");
        }
        or_sb_put(&text, "## Modelling rationale\n\n");
        for (int k = 0; k < in->ncfam; k++)
            or_sb_printf(&text, "- **%s**: %s.\n", in->cfam[k].role, in->cfam[k].desc);
        or_sb_put(&text, "\n## Formulation\n\n");
        or_render_formulation(in, &text);
        or_sb_put(&text, "\n## LP model\n\n");
        or_render_lp_block(&in->m, &text);
        or_sb_put(&text, "\n");
        if (doc == OR_DOC_RATIONALE)
            doc_mistakes(in, &v, &text, &meta);
        if (doc == OR_DOC_WALKTHROUGH) {
            or_sb_put(&text, "## Reading the solver output\n\n");
            if (!isnan(v.lp_relax_obj)) {
                char lz[40];
                or_fmt_value(lz, sizeof lz, v.lp_relax_obj);
                or_sb_printf(&text, "Branch and bound starts from the LP relaxation, whose optimum is %s. The best "
                                    "integer solution is worth %s, so the relative integrality gap at the root is "
                                    "%.4g%%. GLPK closes it with tol_int = 1e-7 and a zero MIP gap; a looser "
                                    "integrality tolerance can accept a nearly-integer point of a big-M model and "
                                    "report a wrong optimum, which the audit below would catch.\n\n",
                             lz, zs, 100 * fabs(v.lp_relax_obj - v.obj) / fmax(1e-9, fabs(v.obj)));
            } else {
                trex_or_solve_opts so = {.want_duals = true};
                trex_or_solution s;
                trex_or_model rb;
                as_read_back(&in->m, &rb);
                trex_or_solve_glpk(&rb, &so, &s, NULL);
                trex_or_model_free(&rb);
                or_sb_put(&text, "The simplex method also returns dual values. For each binding constraint, the "
                                 "shadow price is the change of the optimum per unit of right-hand side (when the "
                                 "optimum is degenerate other dual solutions exist; these are the ones GLPK's "
                                 "simplex returns for the LP file above):\n\n");
                or_sb_put(&meta, ",\"duals\":{");
                int n = 0;
                for (int i = 0; s.dual && i < in->m.nrows && n < 6; i++)
                    if (fabs(s.dual[i]) > 1e-7) {
                        char ds[40];
                        or_fmt_value(ds, sizeof ds, s.dual[i]);
                        or_sb_printf(&text, "- `%s` (%s): %s\n", in->m.row_name[i], in->row_desc[i], ds);
                        or_sb_printf(&meta, "%s\"%s\":%.12g", n ? "," : "", in->m.row_name[i], or_snap(s.dual[i]));
                        n++;
                    }
                or_sb_put(&meta, "}");
                if (n == 0)
                    or_sb_put(&text, "- (every dual value is zero at this optimum)\n");
                or_sb_put(&text, "\n");
                trex_or_solution_free(&s);
            }
        }
        if (!(sol_first && doc == OR_DOC_REPORT)) {
            or_sb_put(&text, "## Verified solution\n\n");
            or_render_solution(in, &v, &text);
        }
        char cz[40];
        or_fmt_value(cz, sizeof cz, v.cbc_obj);
        or_sb_printf(&text, "\n## Validation\n\nGLPK %s (simplex%s) gives %s; CBC %s, solving the same model "
                            "independently, gives %s. Recomputing every constraint and the objective from the "
                            "reported values in extended precision confirms feasibility and the objective.\n",
                     glp_version(), trex_or_is_mip(&in->m) ? ", then branch and bound with tol_int = 1e-7" : "", zs,
                     Cbc_getVersion(), cz);
        if (!reparse_check(text.s, z, res->canon, res))
            goto out;
    }
    if (text.len < 400) {
        res->reject = TREX_OR_REJ_TOO_LONG;
        snprintf(res->why, sizeof res->why, "document shorter than 400 characters");
        goto out;
    }
    char id[20], src[20];
    hex16(id, or_hash2(iseed, 0xd0c + (uint64_t)doc));
    hex16(src, iseed);
    or_sb_printf(&line, "{\"id\":\"or-cpt-%s\",\"text\":", id);
    or_sb_json_str(&line, text.s);
    or_sb_printf(&line, ",\"source_id\":\"or-inst-%s\",\"metadata\":{\"doc_type\":\"%s\",\"representation\":\"%s\","
                        "\"style\":{\"writing\":\"%s\",\"audience\":\"%s\",\"order\":\"%s\"},",
                 src, or_doc_names[doc], or_rep_names[res->rep], sty, aud,
                 sol_first && doc == OR_DOC_REPORT ? "solution-first" : "problem-first");
    meta_common(&line, in, &v, z, status, iseed, slot, attempt, res->canon);
    if (meta.len)
        or_sb_put(&line, meta.s);
    or_sb_put(&line, "}}");
    res->line = or_sb_take(&line);
    res->asst_len = (int64_t)text.len;
    res->dedup_text = or_sb_take(&text);
    res->infeasible = doc == OR_DOC_INFEASIBLE;
    res->reject = TREX_OR_ACCEPT;
out:
    analysis_free(&an);
    if (have_v)
        trex_or_verdict_free(&v);
    or_inst_free(in);
    free(in);
    or_sb_free(&text);
    or_sb_free(&meta);
    or_sb_free(&line);
    or_sb_free(&prob);
}
