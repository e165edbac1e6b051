/* data/or/verify.c — `trex data or-verify` and `trex data or-stats`.
 *
 * or-verify is independent of the generator: it reads only the JSONL text, parses every LP with GLPK's
 * reader, re-solves with GLPK and CBC, and checks each stated number against a fresh solve (objective,
 * final answer line, stated decisions through the long-double audit, shadow prices, what-if optima,
 * IIS irreducibility, minimal relaxation, the effect of dropped constraints, LP relaxations). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tasks.h"

typedef struct vctx {
    char why[512];
} vctx;

static bool fail(vctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(vctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    return false;
}

static const cJSON *jget(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static bool parse_lp_in(const char *text, trex_or_model *m, int *nfence, vctx *c)
{
    char *lp = or_fence_extract(text, "lp", nfence);
    if (!lp)
        return fail(c, "no ```lp block");
    trex_err err = {0};
    trex_code rc = trex_or_lp_read(lp, strlen(lp), m, &err);
    free(lp);
    if (rc != TREX_OK)
        return fail(c, "LP block: %s", err.msg);
    return true;
}

/* GLPK and CBC both solve m to z (or both say infeasible when z is NaN and want_infeasible). */
static bool check_solve(const trex_or_model *m, double z, bool want_infeasible, vctx *c)
{
    trex_or_solution g, b;
    trex_or_solve_glpk(m, NULL, &g, NULL);
    trex_or_solve_cbc(m, NULL, &b, NULL);
    bool ok;
    if (want_infeasible)
        ok = g.status == TREX_OR_INFEASIBLE && b.status != TREX_OR_OPTIMAL
                 ? true
                 : fail(c, "expected infeasible, GLPK %s CBC %s", trex_or_status_str(g.status),
                        trex_or_status_str(b.status));
    else if (g.status != TREX_OR_OPTIMAL || !trex_or_obj_close(g.obj, z))
        ok = fail(c, "GLPK gives %s %.10g, metadata %.10g", trex_or_status_str(g.status), g.obj, z);
    else if (b.status != TREX_OR_OPTIMAL || !trex_or_obj_close(b.obj, z))
        ok = fail(c, "CBC gives %s %.10g, metadata %.10g", trex_or_status_str(b.status), b.obj, z);
    else
        ok = true;
    trex_or_solution_free(&g);
    trex_or_solution_free(&b);
    return ok;
}

static double solve1(const trex_or_model *m, trex_or_status *st)
{
    trex_or_solution g;
    trex_or_solve_glpk(m, NULL, &g, NULL);
    double z = g.status == TREX_OR_OPTIMAL ? g.obj : NAN;
    *st = g.status;
    trex_or_solution_free(&g);
    return z;
}

static bool check_hash(const trex_or_model *m, const cJSON *meta, vctx *c)
{
    const cJSON *h = jget(meta, "ir_hash");
    char mine[20];
    snprintf(mine, sizeof mine, "%016llx", (unsigned long long)trex_or_canon_hash(m));
    if (!cJSON_IsString(h) || strcmp(h->valuestring, mine))
        return fail(c, "structural hash %s differs from ir_hash", mine);
    return true;
}

/* The last line "<prefix><number>" of text must equal want. */
static bool check_final_line(const char *text, const char *prefix, double want, vctx *c)
{
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n')
        n--;
    const char *p = text + n;
    while (p > text && p[-1] != '\n')
        p--;
    size_t pl = strlen(prefix);
    if (strncmp(p, prefix, pl))
        return fail(c, "last line is not '%s<number>'", prefix);
    double v = strtod(p + pl, NULL);
    if (!trex_or_obj_close(v, want))
        return fail(c, "final line says %.10g, re-solve gives %.10g", v, want);
    return true;
}

/* "- `name` = value" lines: the stated plan must be feasible and reach the optimum. */
static bool check_decisions(const trex_or_model *m, const char *text, double z, vctx *c)
{
    double *x = trex_xcalloc((size_t)m->ncols + 1, sizeof *x);
    int n = 0;
    for (const char *p = strstr(text, "\n- `"); p; p = strstr(p + 1, "\n- `")) {
        char name[64];
        double v;
        if (sscanf(p + 4, "%63[A-Za-z0-9_]` = %lf", name, &v) != 2)
            continue;
        int j = trex_or_find_col(m, name);
        if (j < 0)
            continue; /* rows are listed the same way in analyses */
        x[j] = v;
        n++;
    }
    char why[256];
    bool ok = n > 0 && trex_or_audit(m, x, z, why, sizeof why);
    free(x);
    return ok ? true : fail(c, "stated decisions: %s", n ? why : "none found");
}

static bool verify_infeasible(const trex_or_model *m, const cJSON *an, const char *answer, vctx *c)
{
    if (!check_solve(m, NAN, true, c))
        return false;
    const cJSON *iis = jget(an, "iis"), *rel = jget(an, "relaxation");
    if (!cJSON_IsArray(iis) || !cJSON_IsNumber(rel))
        return fail(c, "analysis needs iis and relaxation");
    /* the IIS: only its rows -> infeasible; each one removed -> feasible */
    int k = cJSON_GetArraySize(iis);
    trex_or_model sub;
    trex_or_model_copy(&sub, m);
    for (int i = sub.nrows - 1; i >= 0; i--) {
        bool keep = false;
        for (int q = 0; q < k; q++)
            keep |= !strcmp(cJSON_GetArrayItem(iis, q)->valuestring, sub.row_name[i]);
        if (!keep)
            trex_or_del_row(&sub, i);
    }
    bool ok = sub.nrows == k;
    trex_or_status st;
    solve1(&sub, &st);
    ok = ok && st == TREX_OR_INFEASIBLE;
    for (int q = 0; ok && q < k; q++) {
        trex_or_model w;
        trex_or_model_copy(&w, &sub);
        trex_or_del_row(&w, q);
        solve1(&w, &st);
        ok = st == TREX_OR_OPTIMAL || st == TREX_OR_UNBOUNDED;
        trex_or_model_free(&w);
    }
    trex_or_model_free(&sub);
    if (!ok)
        return fail(c, "the stated IIS is not an irreducible infeasible subset");
    double total = 0, *relax = trex_xcalloc((size_t)m->nrows + 1, sizeof *relax);
    trex_err err = {0};
    ok = trex_or_elastic(m, &total, relax, &err) == TREX_OK && trex_or_obj_close(total, rel->valuedouble);
    free(relax);
    if (!ok)
        return fail(c, "minimal relaxation re-computed as %.10g, stated %.10g", total, rel->valuedouble);
    return check_final_line(answer, "Minimum total relaxation: ", total, c);
}

static bool verify_sft(const cJSON *j, vctx *c)
{
    const cJSON *msgs = jget(j, "messages"), *meta = jget(j, "metadata");
    if (!cJSON_IsArray(msgs) || !cJSON_IsObject(meta))
        return fail(c, "needs messages and metadata");
    const char *user = NULL, *asst = NULL;
    const cJSON *mm;
    cJSON_ArrayForEach(mm, msgs)
    {
        const cJSON *r = jget(mm, "role"), *ct = jget(mm, "content");
        if (!cJSON_IsString(r) || !cJSON_IsString(ct))
            return fail(c, "message without role/content");
        if (!strcmp(r->valuestring, "user"))
            user = ct->valuestring;
        else if (!strcmp(r->valuestring, "assistant"))
            asst = ct->valuestring;
    }
    const cJSON *task = jget(meta, "task"), *obj = jget(meta, "objective"), *fam = jget(meta, "family"),
                *status = jget(meta, "status");
    if (!user || !asst || !cJSON_IsString(task) || !cJSON_IsString(fam) || !cJSON_IsString(status) || !obj)
        return fail(c, "metadata needs task, family, objective, status; messages need user and assistant");
    const char *t = task->valuestring;
    double z = cJSON_IsNumber(obj) ? obj->valuedouble : NAN;
    trex_or_model m;
    int nf = 0;
    bool ok = false;
    if (!strcmp(t, "formulate") || !strcmp(t, "code") || !strcmp(t, "solve")) {
        if (!parse_lp_in(asst, &m, &nf, c))
            return false;
        ok = check_solve(&m, z, false, c) && check_hash(&m, meta, c);
        if (ok && !strcmp(t, "code")) {
            size_t n = strlen(asst);
            ok = nf == 1 && !strncmp(asst, "```lp\n", 6) && n >= 4 && !strcmp(asst + n - 4, "```\n")
                     ? true
                     : fail(c, "a CODE answer must be exactly one ```lp fence");
        }
        if (ok && !strcmp(t, "solve"))
            ok = check_final_line(asst, "Optimal objective value: ", z, c) && check_decisions(&m, asst, z, c);
        trex_or_model_free(&m);
        return ok;
    }
    if (strcmp(t, "analyze"))
        return fail(c, "unknown task '%s'", t);
    const cJSON *an = jget(meta, "analysis"), *kind = an ? jget(an, "kind") : NULL;
    if (!cJSON_IsString(kind))
        return fail(c, "analyze sample without analysis.kind");
    const char *k = kind->valuestring;
    if (!parse_lp_in(user, &m, &nf, c))
        return false;
    if (!strcmp(k, "infeasible")) {
        ok = verify_infeasible(&m, an, asst, c);
    } else if (!strcmp(k, "debug")) {
        const cJSON *bs = jget(an, "buggy_status"), *bo = jget(an, "buggy_objective");
        trex_or_status st;
        double zb = solve1(&m, &st);
        trex_or_model fixed;
        if (!cJSON_IsString(bs) || strcmp(bs->valuestring, trex_or_status_str(st)))
            ok = fail(c, "buggy model status %s, stated %s", trex_or_status_str(st),
                      cJSON_IsString(bs) ? bs->valuestring : "?");
        else if (st == TREX_OR_OPTIMAL && (!cJSON_IsNumber(bo) || !trex_or_obj_close(zb, bo->valuedouble)))
            ok = fail(c, "buggy model optimum %.10g differs from the stated one", zb);
        else if (parse_lp_in(asst, &fixed, &nf, c)) {
            ok = check_solve(&fixed, z, false, c) && check_hash(&fixed, meta, c) &&
                 check_final_line(asst, "Optimal objective value: ", z, c);
            trex_or_model_free(&fixed);
        }
    } else if (!strcmp(k, "sensitivity") || !strcmp(k, "whatif")) {
        const cJSON *row = jget(an, "row"), *col = jget(an, "col");
        int r = cJSON_IsString(row) ? trex_or_find_row(&m, row->valuestring) : -1;
        int cidx = cJSON_IsString(col) ? trex_or_find_col(&m, col->valuestring) : -1;
        if (r < 0 && cidx < 0)
            ok = fail(c, "analysis row/column not in the user's LP");
        else if (r < 0 && strcmp(k, "whatif"))
            ok = fail(c, "sensitivity needs a row");
        else if (check_solve(&m, z, false, c)) {
            trex_or_model w;
            trex_or_model_copy(&w, &m);
            if (!strcmp(k, "sensitivity")) {
                const cJSON *d = jget(an, "delta"), *y = jget(an, "shadow_price"), *nz = jget(an, "new_objective");
                if (!cJSON_IsNumber(d) || !cJSON_IsNumber(y) || !cJSON_IsNumber(nz))
                    ok = fail(c, "sensitivity needs delta, shadow_price, new_objective");
                else {
                    w.rhs[r] += d->valuedouble;
                    trex_or_solve_opts so = {.want_duals = true};
                    trex_or_solution s;
                    trex_or_solve_glpk(&m, &so, &s, NULL);
                    bool dual_ok = s.dual && fabs(s.dual[r] - y->valuedouble) <= 1e-6 * fmax(1, fabs(s.dual[r]));
                    trex_or_solution_free(&s);
                    ok = dual_ok ? check_solve(&w, nz->valuedouble, false, c)
                                 : fail(c, "shadow price re-computed differs from %.10g", y->valuedouble);
                    ok = ok && (trex_or_obj_close(nz->valuedouble, z + y->valuedouble * d->valuedouble)
                                    ? true
                                    : fail(c, "new optimum is not z + y * delta"));
                    ok = ok && check_final_line(asst, "New optimal objective value: ", nz->valuedouble, c);
                    const cJSON *rl = jget(an, "range_lo"), *rh = jget(an, "range_hi");
                    if (ok && (rl || rh)) {
                        double lo = cJSON_IsNumber(rl) ? rl->valuedouble : -INFINITY;
                        double hi = cJSON_IsNumber(rh) ? rh->valuedouble : INFINITY;
                        if (!trex_or_range_holds(&m, r, z, y->valuedouble, lo, hi))
                            ok = fail(c, "the stated range [%g, %g] does not hold on re-solving", lo, hi);
                    }
                }
            } else {
                const cJSON *nr = jget(an, r >= 0 ? "new_rhs" : "new_obj_coef"), *ns = jget(an, "new_status"),
                            *nz = jget(an, "new_objective");
                if (!cJSON_IsNumber(nr) || !cJSON_IsString(ns))
                    ok = fail(c, "whatif needs new_rhs (or new_obj_coef) and new_status");
                else {
                    if (r >= 0)
                        w.rhs[r] = nr->valuedouble;
                    else
                        w.obj[cidx] = nr->valuedouble;
                    if (!strcmp(ns->valuestring, "optimal"))
                        ok = cJSON_IsNumber(nz) && check_solve(&w, nz->valuedouble, false, c) &&
                             check_final_line(asst, "New optimal objective value: ", nz->valuedouble, c);
                    else
                        ok = check_solve(&w, NAN, true, c) && (strstr(asst, "The modified problem is infeasible.")
                                                                   ? true
                                                                   : fail(c, "answer does not say infeasible"));
                }
            }
            trex_or_model_free(&w);
        }
    } else
        ok = fail(c, "unknown analysis kind '%s'", k);
    trex_or_model_free(&m);
    return ok;
}

static bool verify_cpt(const cJSON *j, vctx *c)
{
    const cJSON *text = jget(j, "text"), *meta = jget(j, "metadata");
    if (!cJSON_IsString(text) || !cJSON_IsObject(meta))
        return fail(c, "needs text and metadata");
    const char *t = text->valuestring;
    if (strlen(t) < 400)
        return fail(c, "document shorter than 400 characters");
    static const char *const forbidden[] = {"User:", "Assistant:", "ChatML", "let me think", "<|"};
    for (size_t k = 0; k < sizeof forbidden / sizeof forbidden[0]; k++)
        if (strstr(t, forbidden[k]))
            return fail(c, "forbidden marker '%s'", forbidden[k]);
    const cJSON *obj = jget(meta, "objective"), *an = jget(meta, "analysis");
    trex_or_model m;
    int nf = 0;
    if (!parse_lp_in(t, &m, &nf, c))
        return false;
    bool ok;
    if (cJSON_IsObject(an))
        ok = verify_infeasible(&m, an, t, c);
    else {
        double z = cJSON_IsNumber(obj) ? obj->valuedouble : NAN;
        ok = check_solve(&m, z, false, c) && check_hash(&m, meta, c);
        const cJSON *checks = jget(meta, "checks"), *ck;
        cJSON_ArrayForEach(ck, checks)
        {
            if (!ok)
                break;
            const cJSON *drop = jget(ck, "drop"), *st = jget(ck, "status"), *oz = jget(ck, "objective"), *nm;
            trex_or_model w;
            trex_or_model_copy(&w, &m);
            cJSON_ArrayForEach(nm, drop)
            {
                int r = cJSON_IsString(nm) ? trex_or_find_row(&w, nm->valuestring) : -1;
                if (r >= 0)
                    trex_or_del_row(&w, r);
            }
            trex_or_status s2;
            double z2 = solve1(&w, &s2);
            if (!cJSON_IsString(st) || strcmp(st->valuestring, trex_or_status_str(s2)))
                ok = fail(c, "dropped-constraint check: status %s", trex_or_status_str(s2));
            else if (s2 == TREX_OR_OPTIMAL && (!cJSON_IsNumber(oz) || !trex_or_obj_close(z2, oz->valuedouble)))
                ok = fail(c, "dropped-constraint check: %.10g vs stated", z2);
            trex_or_model_free(&w);
        }
        const cJSON *duals = jget(meta, "duals"), *d;
        if (ok && cJSON_IsObject(duals)) {
            trex_or_solve_opts so = {.want_duals = true};
            trex_or_solution s;
            trex_or_solve_glpk(&m, &so, &s, NULL);
            cJSON_ArrayForEach(d, duals)
            {
                int r = trex_or_find_row(&m, d->string);
                if (r < 0 || !s.dual || fabs(s.dual[r] - d->valuedouble) > 1e-6 * fmax(1, fabs(d->valuedouble))) {
                    ok = fail(c, "dual of %s differs", d->string);
                    break;
                }
            }
            trex_or_solution_free(&s);
        }
        const cJSON *lr = jget(meta, "lp_relaxation");
        if (ok && cJSON_IsNumber(lr)) {
            trex_or_model w;
            trex_or_model_copy(&w, &m);
            memset(w.kind, 0, (size_t)w.ncols);
            trex_or_status s2;
            double z2 = solve1(&w, &s2);
            if (s2 != TREX_OR_OPTIMAL || !trex_or_obj_close(z2, lr->valuedouble))
                ok = fail(c, "LP relaxation re-solves to %.10g", z2);
            trex_or_model_free(&w);
        }
    }
    trex_or_model_free(&m);
    return ok;
}

trex_code trex_or_verify_file(const char *path, int64_t *n_ok, int64_t *n_bad, bool quiet, trex_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return trex_err_set(err, TREX_EIO, "%s: cannot open; pass sft.jsonl or cpt.jsonl written by or-gen", path);
    char *line = NULL;
    size_t cap = 0;
    int64_t lineno = 0;
    *n_ok = *n_bad = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        if (line[0] == '\n')
            continue;
        vctx c = {{0}};
        cJSON *j = cJSON_Parse(line);
        bool ok;
        const char *id = "?";
        if (!j)
            ok = fail(&c, "not valid JSON");
        else {
            const cJSON *jid = jget(j, "id");
            if (cJSON_IsString(jid))
                id = jid->valuestring;
            ok = jget(j, "messages") ? verify_sft(j, &c) : verify_cpt(j, &c);
        }
        if (ok)
            (*n_ok)++;
        else {
            (*n_bad)++;
            printf("REJECT %s:%lld %s: %s\n", path, (long long)lineno, id, c.why);
        }
        if (!quiet && lineno % 1000 == 0)
            fprintf(stderr, "or-verify: %lld rows\n", (long long)lineno);
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    return TREX_OK;
}

/* ---- or-stats ---- */
static void table_obj(const char *title, const cJSON *o)
{
    if (!cJSON_IsObject(o))
        return;
    printf("\n### %s\n\n| key | count |\n|---|---|\n", title);
    const cJSON *it;
    cJSON_ArrayForEach(it, o) if (cJSON_IsNumber(it)) printf("| %s | %g |\n", it->string, it->valuedouble);
}

trex_code trex_or_stats(const char *dir, trex_err *err)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return trex_err_set(err, TREX_EIO, "%s: cannot open; run `trex data or-gen --out %s` first", path, dir);
    or_sb b = {0};
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        or_sb_putn(&b, buf, n);
    fclose(f);
    cJSON *j = cJSON_Parse(b.s ? b.s : "");
    or_sb_free(&b);
    if (!j)
        return trex_err_set(err, TREX_EFORMAT, "%s: not valid JSON", path);
    const cJSON *seed = jget(j, "seed"), *cnt = jget(j, "counts");
    printf("# OR data manifest (%s)\n\nseed %s, generator %s, config %s\n", dir,
           cJSON_IsString(seed) ? seed->valuestring : "?", cJSON_GetStringValue(jget(j, "gen_version")),
           cJSON_GetStringValue(jget(j, "config_hash")));
    table_obj("Counts", cnt);
    static const char *const streams[] = {"sft", "cpt"};
    for (int s = 0; s < 2; s++) {
        const cJSON *k = jget(j, streams[s]);
        if (!k)
            continue;
        char t[64];
        static const char *const parts[] = {"by_task", "by_doc_type", "by_family", "by_representation",
                                            "by_difficulty", "analysis_kinds"};
        for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
            snprintf(t, sizeof t, "%s %s", streams[s], parts[p]);
            table_obj(t, jget(k, parts[p]));
        }
        const cJSON *fu = jget(k, "funnel");
        snprintf(t, sizeof t, "%s funnel: rejections by code", streams[s]);
        if (fu) {
            printf("\n%s funnel: attempted %g, rejected %g, written %g\n", streams[s],
                   cJSON_GetNumberValue(jget(fu, "attempted")), cJSON_GetNumberValue(jget(fu, "rejected_total")),
                   cJSON_GetNumberValue(jget(fu, "written")));
            table_obj(t, jget(fu, "rejected"));
        }
    }
    const cJSON *fams = jget(j, "families"), *fm;
    printf("\n### Families\n\n| family | instances | MILP share | vars p50 | rows p50 | nnz p50 | max vars |\n"
           "|---|---|---|---|---|---|---|\n");
    cJSON_ArrayForEach(fm, fams)
    {
        printf("| %s | %g | %g | %g | %g | %g | %g |\n", fm->string, cJSON_GetNumberValue(jget(fm, "instances")),
               cJSON_GetNumberValue(jget(fm, "milp_share")), cJSON_GetNumberValue(jget(jget(fm, "vars"), "p50")),
               cJSON_GetNumberValue(jget(jget(fm, "rows"), "p50")), cJSON_GetNumberValue(jget(jget(fm, "nnz"), "p50")),
               cJSON_GetNumberValue(jget(jget(fm, "vars"), "max")));
    }
    table_obj("Integrality gap (instances)", jget(j, "integrality_gap_histogram"));
    printf("\nunique optimum rate: %g\n", cJSON_GetNumberValue(jget(j, "unique_optimum_rate")));
    table_obj("Dedup", jget(j, "dedup"));
    table_obj("Decontamination", jget(j, "decontamination"));
    cJSON_Delete(j);
    return TREX_OK;
}
