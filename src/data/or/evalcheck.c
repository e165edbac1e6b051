/* data/or/evalcheck.c — the eval adapter: each JSONL row's reference LP is parsed, solved with GLPK
 * (and cross-checked with CBC from the same parsed model) and compared with the row's answer.
 *
 * Bench4Opt reference files were written by Gurobi; two text fixes make them readable for GLPK
 * (eval/SOURCES.md): '[' / ']' in names become '(' / ')', and a row with no variable term gets a
 * "0 zz_dummy" term. The fixes live here, never in the strict reader. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "or_internal.h"

/* Applies the two B4O fixes; returns a malloc'ed string. */
static char *b4o_fix(const char *lp)
{
    or_sb b = {0};
    bool in_rows = false;
    const char *p = lp;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char *line = trex_xmalloc(n + 1);
        memcpy(line, p, n);
        line[n] = '\0';
        for (size_t k = 0; k < n; k++)
            line[k] = line[k] == '[' ? '(' : line[k] == ']' ? ')' : line[k];
        const char *t = line;
        while (*t == ' ')
            t++;
        if (!strncasecmp(t, "subject to", 10) || !strncasecmp(t, "such that", 9) || !strcasecmp(t, "st") ||
            !strcasecmp(t, "s.t."))
            in_rows = true;
        else if (!strncasecmp(t, "bounds", 6) || !strncasecmp(t, "general", 7) || !strncasecmp(t, "binar", 5) ||
                 !strncasecmp(t, "end", 3))
            in_rows = false;
        const char *colon = in_rows ? strchr(line, ':') : NULL;
        if (colon) {
            const char *q = colon + 1;
            while (*q == ' ')
                q++;
            if (*q == '<' || *q == '>' || *q == '=') {
                or_sb_putn(&b, line, (size_t)(colon + 1 - line));
                or_sb_put(&b, " 0 zz_dummy ");
                or_sb_put(&b, q);
                or_sb_putc(&b, '\n');
                free(line);
                p = e ? e + 1 : p + n;
                continue;
            }
        }
        or_sb_put(&b, line);
        if (e)
            or_sb_putc(&b, '\n');
        free(line);
        p = e ? e + 1 : p + n;
    }
    return or_sb_take(&b);
}

/* One row: returns true when it passes; msg receives the reason otherwise. */
static bool check_row(const char *line, int64_t lineno, bool quiet)
{
    char idbuf[160];
    snprintf(idbuf, sizeof idbuf, "line %lld", (long long)lineno);
    cJSON *j = cJSON_Parse(line);
    bool ok = false;
    char why[512] = "";
    char *fixed = NULL;
    trex_or_model m;
    bool have_m = false;
    trex_or_solution g = {0}, c = {0};
    if (!j) {
        snprintf(why, sizeof why, "not valid JSON");
        goto out;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
    if (cJSON_IsString(id))
        snprintf(idbuf, sizeof idbuf, "%s", id->valuestring);
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(j, "reference_lp");
    const cJSON *ans = cJSON_GetObjectItemCaseSensitive(j, "answer");
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(j, "source");
    if (!cJSON_IsString(id) || !cJSON_IsString(lp) || !cJSON_IsNumber(ans)) {
        snprintf(why, sizeof why, "malformed row: needs string fields \"id\" and \"reference_lp\" and a number "
                                  "\"answer\"");
        goto out;
    }
    bool b4o = (cJSON_IsString(src) && !strncmp(src->valuestring, "bench4opt", 9)) ||
               !strncmp(id->valuestring, "b4o", 3);
    fixed = b4o ? b4o_fix(lp->valuestring) : or_xstrdup(lp->valuestring);
    trex_err err = {0};
    if (trex_or_lp_read(fixed, strlen(fixed), &m, &err) != TREX_OK) {
        snprintf(why, sizeof why, "reference_lp: %.400s", err.msg);
        goto out;
    }
    have_m = true;
    trex_or_solve_opts so = {.tm_lim_ms = 60000};
    trex_or_solve_glpk(&m, &so, &g, NULL);
    if (g.status != TREX_OR_OPTIMAL) {
        snprintf(why, sizeof why, "GLPK status %s", trex_or_status_str(g.status));
        goto out;
    }
    if (!trex_or_obj_close(g.obj, ans->valuedouble)) {
        snprintf(why, sizeof why, "GLPK optimum %.12g differs from the answer %.12g", g.obj, ans->valuedouble);
        goto out;
    }
    /* CBC cross-check with a short limit: a proven CBC optimum must agree; a CBC time-out (e.g. the
     * MIPLIB "ej" variant, an equality knapsack CBC's C API does not close in seconds) is reported but
     * does not fail the row, since GLPK's optimum already matches the answer. */
    trex_or_solve_opts co = {.tm_lim_ms = 2000};
    trex_or_solve_cbc(&m, &co, &c, NULL);
    if (c.status == TREX_OR_OPTIMAL && !trex_or_obj_close(c.obj, ans->valuedouble)) {
        snprintf(why, sizeof why, "CBC optimum %.12g differs from the answer %.12g", c.obj, ans->valuedouble);
        goto out;
    }
    if (c.status != TREX_OR_OPTIMAL && c.status != TREX_OR_TIMELIMIT) {
        snprintf(why, sizeof why, "CBC status %s on a model GLPK solves", trex_or_status_str(c.status));
        goto out;
    }
    ok = true;
    if (!quiet)
        printf("ok   %s  %.12g (glpk %.1f ms, cbc %s %.1f ms)\n", idbuf, g.obj, g.ms,
               c.status == TREX_OR_OPTIMAL ? "agrees" : "timed out,", c.ms);
out:
    if (!ok)
        printf("FAIL %s: %s\n", idbuf, why);
    trex_or_solution_free(&g);
    trex_or_solution_free(&c);
    if (have_m)
        trex_or_model_free(&m);
    free(fixed);
    cJSON_Delete(j);
    return ok;
}

trex_code trex_or_evalcheck(const char *path, int64_t *n_ok, int64_t *n_bad, bool quiet, trex_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return trex_err_set(err, TREX_EIO, "%s: cannot open; pass an eval JSONL file (e.g. ../shared/or/eval/"
                                           "nl4opt_glpk.jsonl)", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int64_t lineno = 0;
    *n_ok = *n_bad = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        lineno++;
        bool blank = true;
        for (ssize_t k = 0; k < n; k++)
            if (!isspace((unsigned char)line[k]))
                blank = false;
        if (blank)
            continue;
        if (check_row(line, lineno, quiet))
            (*n_ok)++;
        else
            (*n_bad)++;
    }
    free(line);
    fclose(f);
    if (*n_ok + *n_bad == 0) {
        (*n_bad)++;
        printf("FAIL %s: no rows\n", path);
    }
    return TREX_OK;
}
