/* train/eval_or.c — `trex eval or`: generate answers to OR problems with a run's checkpoint and score
 * them with GLPK (trex/eval.h describes the rows, the prompts and the scoring rules).
 *
 * Every row of the set is read and checked first, so a malformed row or a missing run fails before any
 * generation. Answers come from trex_generate (captured through a memory stream) or from an answers
 * file (the oracle path used to test the scoring). Results go to the output file through the atomic
 * writer, one JSON object per row. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "trex/checkpoint.h"
#include "trex/eval.h"
#include "trex/io.h"
#include "trex/or.h"
#include "trex/train.h"

/* The instruction after an eval row's question; it mirrors or-gen's SOLVE phrasing (data/or/tasks.c). */
static const char eval_ask[] = "Formulate this problem as an optimization model and solve it. Give the model as a "
                               "CPLEX LP file in one ```lp block, then finish with the line `Optimal objective "
                               "value: <number>`.";
static const char value_prefix[] = "Optimal objective value:";

enum { CAT_EVAL_LP = 0, CAT_EVAL_VALUE, CAT_FORMULATE, CAT_CODE, CAT_SOLVE, CAT_ANALYZE };
static const char *const cat_names[TREX_EVAL_OR_NCAT] = {"eval-lp", "eval-value", "formulate",
                                                         "code",    "solve",      "analyze"};

const char *trex_eval_or_category(int c)
{
    TREX_ASSERT(c >= 0 && c < TREX_EVAL_OR_NCAT);
    return cat_names[c];
}

typedef struct row {
    char id[160];
    int64_t line;
    bool gen;           /* an or-gen SFT row */
    int task;           /* CAT_FORMULATE.. for or-gen rows */
    char *system;       /* owned; NULL: none */
    char *prompt;       /* owned */
    bool want_lp, want_value;
    double z;           /* the LP must solve to this (NaN: infeasible) */
    double v;           /* the final line must give this (NaN: "infeasible") */
} row;

static void rows_free(row *r, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        free(r[i].system);
        free(r[i].prompt);
    }
    free(r);
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    TREX_ASSERT(p);
    memcpy(p, s, n);
    return p;
}

/* The body of the first "```lp\n ... \n```" fence that starts a line; malloc'ed, or NULL. */
static char *lp_block(const char *text)
{
    for (const char *p = strstr(text, "```lp\n"); p; p = strstr(p + 6, "```lp\n")) {
        if (p != text && p[-1] != '\n')
            continue;
        const char *s = p + 6, *e = strstr(s, "\n```");
        if (!e)
            return NULL;
        size_t n = (size_t)(e - s) + 1;
        char *b = malloc(n + 1);
        TREX_ASSERT(b);
        memcpy(b, s, n);
        b[n] = '\0';
        return b;
    }
    return NULL;
}

/* The last line that starts with "Optimal objective value:" or "New optimal objective value:" (the
 * what-if form of ANALYZE answers), after optional spaces, '*' or '`':
 * *v receives its number; returns false when there is no such line or no number on it. */
static bool final_value(const char *text, double *v)
{
    bool found = false;
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        const char *q = p;
        while (*q == ' ' || *q == '*' || *q == '`')
            q++;
        if (!strncmp(q, "New optimal objective value:", 28))
            q += 28;
        else if (!strncmp(q, value_prefix, sizeof value_prefix - 1))
            q += sizeof value_prefix - 1;
        else
            continue;
        while (*q == ' ' || *q == '*' || *q == '`' || *q == '$')
            q++;
        char *end;
        double x = strtod(q, &end);
        if (end != q && isfinite(x)) {
            *v = x;
            found = true;
        }
    }
    return found;
}

/* Whether some line of text states infeasibility (the answer form or-gen uses for infeasible cases). */
static bool says_infeasible(const char *text) { return strstr(text, "infeasible") != NULL; }

static trex_code bad_row(trex_err *err, const char *set, const row *r, const char *what)
{
    return trex_err_set(err, TREX_EINVAL, "%s line %" PRId64 "%s%s%s: malformed row: %s", set, r->line,
                        r->id[0] ? " (id " : "", r->id, r->id[0] ? ")" : "", what);
}

/* Fills r from one JSON line. */
static trex_code parse_row(const char *set, const char *line, row *r, trex_err *err)
{
    cJSON *j = cJSON_Parse(line);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return bad_row(err, set, r, "not a JSON object");
    }
    trex_code rc = TREX_OK;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
    if (cJSON_IsString(id))
        snprintf(r->id, sizeof r->id, "%s", id->valuestring);
    else
        snprintf(r->id, sizeof r->id, "line-%" PRId64, r->line);
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!msgs) {
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "question");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "answer");
        if (!cJSON_IsString(id) || !cJSON_IsString(q) || !cJSON_IsNumber(a) || !isfinite(a->valuedouble)) {
            rc = bad_row(err, set, r, "an eval row needs string \"id\" and \"question\" and a number \"answer\" "
                                      "(an or-gen row needs \"messages\" and \"metadata\")");
            goto out;
        }
        size_t n = strlen(q->valuestring) + sizeof eval_ask + 4;
        r->prompt = malloc(n);
        TREX_ASSERT(r->prompt);
        snprintf(r->prompt, n, "%s\n\n%s", q->valuestring, eval_ask);
        r->want_lp = r->want_value = true;
        r->z = r->v = a->valuedouble;
        goto out;
    }
    r->gen = true;
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(j, "metadata");
    const cJSON *task = meta ? cJSON_GetObjectItemCaseSensitive(meta, "task") : NULL;
    const cJSON *obj = meta ? cJSON_GetObjectItemCaseSensitive(meta, "objective") : NULL;
    const cJSON *st = meta ? cJSON_GetObjectItemCaseSensitive(meta, "status") : NULL;
    const char *user = NULL, *sys = NULL, *asst = NULL;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *ro = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(ro) || !cJSON_IsString(ct)) {
            rc = bad_row(err, set, r, "a message without string \"role\" and \"content\"");
            goto out;
        }
        if (!strcmp(ro->valuestring, "system"))
            sys = ct->valuestring;
        else if (!strcmp(ro->valuestring, "user"))
            user = ct->valuestring;
        else if (!strcmp(ro->valuestring, "assistant"))
            asst = ct->valuestring;
    }
    if (!cJSON_IsArray(msgs) || !user || !asst || !cJSON_IsString(task) || !cJSON_IsString(st) || !obj ||
        !(cJSON_IsNumber(obj) || cJSON_IsNull(obj))) {
        rc = bad_row(err, set, r, "an or-gen row needs user and assistant messages and metadata task, objective, "
                                  "status");
        goto out;
    }
    const char *t = task->valuestring;
    r->task = !strcmp(t, "formulate") ? CAT_FORMULATE
              : !strcmp(t, "code")    ? CAT_CODE
              : !strcmp(t, "solve")   ? CAT_SOLVE
              : !strcmp(t, "analyze") ? CAT_ANALYZE
                                      : -1;
    if (r->task < 0) {
        rc = bad_row(err, set, r, "metadata.task must be formulate, code, solve or analyze");
        goto out;
    }
    bool infeasible = !strcmp(st->valuestring, "infeasible");
    if (!infeasible && !cJSON_IsNumber(obj)) {
        rc = bad_row(err, set, r, "metadata.objective must be a number unless status is \"infeasible\"");
        goto out;
    }
    r->z = r->v = infeasible ? NAN : obj->valuedouble;
    r->system = sys ? xstrdup(sys) : NULL;
    r->prompt = xstrdup(user);
    if (r->task == CAT_FORMULATE || r->task == CAT_CODE)
        r->want_lp = true;
    else if (r->task == CAT_SOLVE)
        r->want_value = true;
    else {
        /* analyze: score what the verified reference answer states */
        char *ref_lp = lp_block(asst);
        r->want_lp = ref_lp != NULL;
        free(ref_lp);
        double v;
        if (final_value(asst, &v)) {
            r->want_value = true;
            r->v = v;
        }
    }
out:
    cJSON_Delete(j);
    return rc;
}

static trex_code read_set(const char *set, int64_t limit, row **out, int64_t *n_out, trex_err *err)
{
    FILE *f = fopen(set, "r");
    if (!f)
        return trex_err_set(err, TREX_EIO, "--set %s: cannot open (give a JSONL problem set)", set);
    row *rows = NULL;
    int64_t n = 0, cap = 0, lineno = 0;
    char *line = NULL;
    size_t lcap = 0;
    trex_code rc = TREX_OK;
    while ((limit <= 0 || n < limit) && getline(&line, &lcap, f) >= 0) {
        lineno++;
        const char *p = line;
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
            p++;
        if (!*p)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            row *g = realloc(rows, (size_t)cap * sizeof *g);
            TREX_ASSERT(g);
            rows = g;
        }
        memset(&rows[n], 0, sizeof rows[n]);
        rows[n].line = lineno;
        rc = parse_row(set, line, &rows[n], err);
        n++;
        if (rc != TREX_OK)
            break;
    }
    free(line);
    fclose(f);
    if (rc == TREX_OK && n == 0)
        rc = trex_err_set(err, TREX_EINVAL, "--set %s has no rows", set);
    if (rc != TREX_OK) {
        rows_free(rows, n);
        return rc;
    }
    *out = rows;
    *n_out = n;
    return TREX_OK;
}

/* The answers file: texts by id, in the order of the set. */
static trex_code read_answers(const char *path, const row *rows, int64_t n, char **texts, trex_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return trex_err_set(err, TREX_EIO, "--answers %s: cannot open", path);
    char *line = NULL;
    size_t lcap = 0;
    int64_t lineno = 0;
    trex_code rc = TREX_OK;
    while (getline(&line, &lcap, f) >= 0) {
        lineno++;
        if (line[0] == '\n' || !line[0])
            continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *id = j ? cJSON_GetObjectItemCaseSensitive(j, "id") : NULL;
        const cJSON *o = j ? cJSON_GetObjectItemCaseSensitive(j, "output") : NULL;
        if (!cJSON_IsString(id) || !cJSON_IsString(o)) {
            cJSON_Delete(j);
            rc = trex_err_set(err, TREX_EINVAL, "--answers %s line %" PRId64 ": need string fields \"id\" and \"output\"",
                              path, lineno);
            break;
        }
        for (int64_t i = 0; i < n; i++)
            if (!strcmp(rows[i].id, id->valuestring) && !texts[i])
                texts[i] = xstrdup(o->valuestring);
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    for (int64_t i = 0; rc == TREX_OK && i < n; i++)
        if (!texts[i])
            rc = trex_err_set(err, TREX_EINVAL, "--answers %s has no answer for id %s (set line %" PRId64 ")", path,
                              rows[i].id, rows[i].line);
    return rc;
}

/* Scores one answer; adds its fields to res and its counts to rep. */
static void score(const row *r, const char *text, int solver_ms, cJSON *res, trex_eval_or_report *rep)
{
    bool unparsable = false;
    if (r->want_lp || strstr(text, "```lp\n")) {
        char *lp = lp_block(text);
        bool lp_ok = false;
        if (!lp) {
            cJSON_AddStringToObject(res, "lp", "missing");
            unparsable |= r->want_lp;
        } else {
            trex_or_model m;
            trex_err e = {0};
            if (trex_or_lp_read(lp, strlen(lp), &m, &e) != TREX_OK) {
                cJSON_AddStringToObject(res, "lp", "parse_error");
                cJSON_AddStringToObject(res, "lp_error", e.msg);
                unparsable |= r->want_lp;
            } else {
                trex_or_solve_opts so = {.tm_lim_ms = solver_ms};
                trex_or_solution s;
                trex_or_solve_glpk(&m, &so, &s, NULL);
                cJSON_AddStringToObject(res, "lp", "parsed");
                cJSON_AddStringToObject(res, "lp_status", trex_or_status_str(s.status));
                if (s.status == TREX_OR_OPTIMAL)
                    cJSON_AddNumberToObject(res, "lp_objective", s.obj);
                if (r->want_lp) {
                    rep->solver_failures += s.status == TREX_OR_NUMERIC;
                    rep->timeouts += s.status == TREX_OR_TIMELIMIT;
                }
                lp_ok = isnan(r->z) ? s.status == TREX_OR_INFEASIBLE
                                    : s.status == TREX_OR_OPTIMAL && trex_or_obj_close(s.obj, r->z);
                trex_or_solution_free(&s);
                trex_or_model_free(&m);
            }
            free(lp);
        }
        if (r->want_lp)
            cJSON_AddBoolToObject(res, "lp_correct", lp_ok);
        if (r->want_lp && !r->gen) {
            rep->n[CAT_EVAL_LP]++;
            rep->correct[CAT_EVAL_LP] += lp_ok;
        }
    }
    double v = NAN;
    bool have_v = final_value(text, &v);
    if (have_v)
        cJSON_AddNumberToObject(res, "value", v);
    else
        cJSON_AddNullToObject(res, "value");
    if (r->want_value) {
        bool v_ok = isnan(r->v) ? says_infeasible(text) : have_v && trex_or_obj_close(v, r->v);
        unparsable |= isnan(r->v) ? false : !have_v;
        cJSON_AddBoolToObject(res, "value_correct", v_ok);
        if (!r->gen) {
            rep->n[CAT_EVAL_VALUE]++;
            rep->correct[CAT_EVAL_VALUE] += v_ok;
        }
    }
    if (r->gen) {
        cJSON *lc = cJSON_GetObjectItemCaseSensitive(res, "lp_correct");
        cJSON *vc = cJSON_GetObjectItemCaseSensitive(res, "value_correct");
        bool scored = r->want_lp || r->want_value;
        bool ok = (!r->want_lp || cJSON_IsTrue(lc)) && (!r->want_value || cJSON_IsTrue(vc));
        if (scored) {
            cJSON_AddBoolToObject(res, "correct", ok);
            rep->n[r->task]++;
            rep->correct[r->task] += ok;
        } else {
            cJSON_AddNullToObject(res, "correct");
            rep->unscored++;
        }
    }
    cJSON_AddBoolToObject(res, "unparsable", unparsable);
    rep->unparsable += unparsable;
}

/* Checks the run before any row is generated: its config, and the checkpoint asked for. */
static trex_code check_run(const trex_eval_or_opts *o, int64_t *step, trex_err *err)
{
    char p[TREX_TRAIN_PATH + 64];
    struct stat sb;
    if (stat(o->run, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return trex_err_set(err, TREX_ENOTFOUND, "--run %s: no such run directory (trex train --out RUN makes one)",
                            o->run);
    snprintf(p, sizeof p, "%s/config.json", o->run);
    if (stat(p, &sb) != 0)
        return trex_err_set(err, TREX_ENOTFOUND, "--run %s is not a training run: no config.json", o->run);
    if (o->step < 0) {
        trex_code rc = trex_ckpt_latest(o->run, NULL, 0, step, err);
        if (rc != TREX_OK)
            trex_err_prefix(err, "--run %s has no checkpoint to evaluate", o->run);
        return rc;
    }
    snprintf(p, sizeof p, "%s/step-%" PRId64 "/manifest.json", o->run, o->step);
    if (stat(p, &sb) != 0)
        return trex_err_set(err, TREX_ENOTFOUND, "--run %s has no checkpoint step-%" PRId64 " (see ls %s)", o->run,
                            o->step, o->run);
    *step = o->step;
    return TREX_OK;
}

trex_code trex_eval_or(const trex_eval_or_opts *o, trex_eval_or_report *rep, FILE *log, trex_err *err)
{
    TREX_ASSERT(o && o->set && rep);
    memset(rep, 0, sizeof *rep);
    rep->step = -1;
    if (!o->answers && !o->run)
        return trex_err_set(err, TREX_EINVAL, "give --run RUN (or --answers FILE to score given answers)");
    if (!o->answers && o->run) {
        if (o->max_new < 1)
            return trex_err_set(err, TREX_EINVAL, "--max-new %" PRId64 " must be >= 1", o->max_new);
        TREX_TRY(check_run(o, &rep->step, err));
    }
    row *rows = NULL;
    int64_t n = 0;
    TREX_TRY(read_set(o->set, o->limit, &rows, &n, err));
    char **texts = calloc((size_t)n, sizeof *texts);
    TREX_ASSERT(texts);
    trex_atomic_file *af = NULL;
    trex_code rc = TREX_OK;
    if (o->answers && (rc = read_answers(o->answers, rows, n, texts, err)) != TREX_OK)
        goto out;
    if (o->out && (rc = trex_file_atomic_open(&af, o->out, err)) != TREX_OK)
        goto out;
    const int solver_ms = o->solver_ms > 0 ? o->solver_ms : 10000;
    for (int64_t i = 0; i < n; i++) {
        const row *r = &rows[i];
        cJSON *res = cJSON_CreateObject();
        cJSON_AddStringToObject(res, "id", r->id);
        cJSON_AddNumberToObject(res, "line", (double)r->line);
        cJSON_AddStringToObject(res, "category", r->gen ? cat_names[r->task] : "eval");
        if (isnan(r->z))
            cJSON_AddStringToObject(res, "reference", "infeasible");
        else
            cJSON_AddNumberToObject(res, "reference", r->z);
        if (!texts[i]) {
            char *buf = NULL;
            size_t len = 0;
            FILE *ms = open_memstream(&buf, &len);
            if (!ms) {
                cJSON_Delete(res);
                rc = trex_err_set(err, TREX_ENOMEM, "cannot open a memory stream for the answer");
                goto out;
            }
            trex_generate_opts go = {.run = o->run,
                                     .step = rep->step,
                                     .system = r->system,
                                     .prompt = r->prompt,
                                     .mode = 1,
                                     .temperature = o->temperature,
                                     .max_new = o->max_new,
                                     .seed = o->seed,
                                     .threads = o->threads,
                                     .attention = -1};
            trex_generate_result gr;
            rc = trex_generate(&go, ms, &gr, err);
            fclose(ms);
            if (rc != TREX_OK) {
                free(buf);
                cJSON_Delete(res);
                trex_err_prefix(err, "row %s (line %" PRId64 ")", r->id, r->line);
                goto out;
            }
            if (len && buf[len - 1] == '\n') /* trex_generate ends the answer with a newline */
                buf[--len] = '\0';
            texts[i] = buf;
            cJSON_AddNumberToObject(res, "new_tokens", (double)gr.new_tokens);
            cJSON_AddBoolToObject(res, "stopped_at_eos", gr.stopped_at_eos);
            rep->truncated += !gr.stopped_at_eos;
        }
        score(r, texts[i], solver_ms, res, rep);
        cJSON_AddStringToObject(res, "output", texts[i]);
        rep->rows++;
        char *s = cJSON_PrintUnformatted(res);
        cJSON_Delete(res);
        TREX_ASSERT(s);
        if (af && ((rc = trex_file_atomic_write(af, s, strlen(s), err)) != TREX_OK ||
                   (rc = trex_file_atomic_write(af, "\n", 1, err)) != TREX_OK)) {
            free(s);
            goto out;
        }
        free(s);
        if (log && !o->quiet)
            fprintf(log, "trex eval or: %" PRId64 "/%" PRId64 " %s\n", i + 1, n, r->id);
    }
    if (af) {
        rc = trex_file_atomic_commit(af, err);
        af = NULL;
    }
out:
    if (af)
        trex_file_atomic_abort(af);
    for (int64_t i = 0; i < n; i++)
        free(texts[i]);
    free(texts);
    rows_free(rows, n);
    return rc;
}

void trex_eval_or_report_print(const trex_eval_or_report *r, FILE *out)
{
    fprintf(out, "%-11s %6s %8s %9s\n", "category", "rows", "correct", "accuracy");
    for (int c = 0; c < TREX_EVAL_OR_NCAT; c++) {
        if (!r->n[c])
            continue;
        fprintf(out, "%-11s %6" PRId64 " %8" PRId64 " %8.1f%%\n", cat_names[c], r->n[c], r->correct[c],
                100.0 * (double)r->correct[c] / (double)r->n[c]);
    }
    fprintf(out, "rows %" PRId64 "  unscored %" PRId64 "  unparsable %" PRId64 "  solver_failures %" PRId64
                 "  timeouts %" PRId64 "  truncated %" PRId64 "\n",
            r->rows, r->unscored, r->unparsable, r->solver_failures, r->timeouts, r->truncated);
}
