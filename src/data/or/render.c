/* data/or/render.c — renders an instance as problem text (DP prose, DT Markdown tables, DPS prose plus
 * a data.json block), formulation, LP block and solution; and the text gates (number coverage, answer
 * leakage, template debris, length). Rendering is a pure function of (instance, rng). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "render.h"

const char *const or_rep_names[3] = {"DP", "DT", "DPS"};

/* {i} {j} {v} {u} substitution. */
static void fill(or_sb *b, const char *t, const char *li, const char *lj, double v, const char *unit)
{
    for (const char *p = t; *p; p++) {
        if (p[0] == '{' && p[1] && p[2] == '}') {
            char k = p[1];
            if (k == 'i' && li) {
                or_sb_put(b, li);
                p += 2;
                continue;
            }
            if (k == 'j' && lj) {
                or_sb_put(b, lj);
                p += 2;
                continue;
            }
            if (k == 'v') {
                or_sb_num(b, v);
                p += 2;
                continue;
            }
            if (k == 'u') {
                or_sb_put(b, unit ? unit : "");
                p += 2;
                continue;
            }
        }
        or_sb_putc(b, *p);
    }
}

static void put_cap(or_sb *b, const char *s)
{
    size_t at = b->len;
    or_sb_put(b, s);
    if (b->len > at)
        b->s[at] = (char)toupper((unsigned char)b->s[at]);
}

static void join_sep(or_sb *b, int k, int n)
{
    if (k)
        or_sb_put(b, k == n - 1 ? (n > 2 ? ", and " : " and ") : ", ");
}

static void dp_param(const or_inst *in, const or_param *p, or_rng *r, or_sb *b)
{
    if (p->dims == 0) {
        or_sb_putc(b, ' ');
        fill(b, p->sent, NULL, NULL, p->v[0], p->unit);
        return;
    }
    const or_set *s0 = &in->sets[p->set[0]];
    if (p->dims == 1) {
        bool sentences = s0->n <= 3 ? or_rng_unif(r) < 0.6 : or_rng_unif(r) < 0.25;
        if (sentences || !p->list_pre[0]) {
            for (int i = 0; i < s0->n; i++) {
                or_sb_putc(b, ' ');
                size_t at = b->len;
                fill(b, p->sent, s0->label[i], NULL, p->v[i], p->unit);
                b->s[at] = (char)toupper((unsigned char)b->s[at]);
            }
        } else {
            or_sb_putc(b, ' ');
            or_sb_put(b, p->list_pre);
            for (int i = 0; i < s0->n; i++) {
                join_sep(b, i, s0->n);
                fill(b, p->list_elem, s0->label[i], NULL, p->v[i], p->unit);
            }
            or_sb_putc(b, '.');
        }
        return;
    }
    const or_set *s1 = &in->sets[p->set[1]];
    for (int i = 0; i < s0->n; i++) {
        int n = 0;
        for (int j = 0; j < s1->n; j++)
            if (!(p->sparse && isnan(OR_P2(p, i, j))) && !(p->incidence && OR_P2(p, i, j) == 0))
                n++;
        if (n == 0)
            continue;
        or_sb_putc(b, ' ');
        size_t at = b->len;
        fill(b, p->row_pre, s0->label[i], NULL, 0, p->unit);
        b->s[at] = (char)toupper((unsigned char)b->s[at]);
        int k = 0;
        for (int j = 0; j < s1->n; j++) {
            double v = OR_P2(p, i, j);
            if ((p->sparse && isnan(v)) || (p->incidence && v == 0))
                continue;
            join_sep(b, k++, n);
            fill(b, p->row_elem, s0->label[i], s1->label[j], v, p->unit);
        }
        or_sb_putc(b, '.');
    }
}

static void dt_tables(const or_inst *in, or_sb *b)
{
    bool done[OR_MAX_PARAMS] = {0};
    for (int k = 0; k < in->nparams; k++) {
        const or_param *p = &in->params[k];
        if (done[k])
            continue;
        if (p->dims == 0) {
            or_sb_put(b, "\n\n");
            fill(b, p->sent, NULL, NULL, p->v[0], p->unit);
            done[k] = true;
            continue;
        }
        const or_set *s0 = &in->sets[p->set[0]];
        if (p->dims == 1) {
            int group[OR_MAX_PARAMS], ng = 0;
            for (int q = k; q < in->nparams; q++)
                if (!done[q] && in->params[q].dims == 1 && in->params[q].set[0] == p->set[0]) {
                    group[ng++] = q;
                    done[q] = true;
                }
            or_sb_put(b, "\n\n| ");
            put_cap(b, s0->noun_sg);
            for (int g = 0; g < ng; g++)
                or_sb_printf(b, " | %s", in->params[group[g]].header);
            or_sb_put(b, " |\n|---");
            for (int g = 0; g < ng; g++)
                or_sb_put(b, "|---");
            or_sb_put(b, "|");
            for (int i = 0; i < s0->n; i++) {
                or_sb_printf(b, "\n| %s", s0->label[i]);
                for (int g = 0; g < ng; g++) {
                    or_sb_put(b, " | ");
                    or_sb_num(b, in->params[group[g]].v[i]);
                }
                or_sb_put(b, " |");
            }
            continue;
        }
        done[k] = true;
        const or_set *s1 = &in->sets[p->set[1]];
        or_sb_put(b, "\n\n");
        put_cap(b, p->desc);
        if (p->incidence) {
            or_sb_put(b, ":\n\n| ");
            put_cap(b, s0->noun_sg);
            or_sb_printf(b, " | %s |\n|---|---|", p->header);
            for (int i = 0; i < s0->n; i++) {
                or_sb_printf(b, "\n| %s | ", s0->label[i]);
                int n = 0;
                for (int j = 0; j < s1->n; j++)
                    if (OR_P2(p, i, j) != 0)
                        or_sb_printf(b, "%s%s", n++ ? ", " : "", s1->label[j]);
                or_sb_put(b, n ? " |" : "none |");
            }
            continue;
        }
        or_sb_printf(b, " (rows: %s; columns: %s):\n\n| ", s0->noun_pl, s1->noun_pl);
        if (p->set[0] == p->set[1] || !strcmp(in->sets[p->set[0]].name, in->sets[p->set[1]].name))
            or_sb_put(b, "from \\ to");
        else
            put_cap(b, s0->noun_sg);
        for (int j = 0; j < s1->n; j++)
            or_sb_printf(b, " | %s", s1->label[j]);
        or_sb_put(b, " |\n|---");
        for (int j = 0; j < s1->n; j++)
            or_sb_put(b, "|---");
        or_sb_put(b, "|");
        for (int i = 0; i < s0->n; i++) {
            or_sb_printf(b, "\n| %s", s0->label[i]);
            for (int j = 0; j < s1->n; j++) {
                double v = OR_P2(p, i, j);
                or_sb_put(b, " | ");
                if (p->sparse && isnan(v))
                    or_sb_put(b, "-");
                else
                    or_sb_num(b, v);
            }
            or_sb_put(b, " |");
        }
        if (p->sparse)
            or_sb_put(b, "\n\nA dash means there is no direct connection.");
    }
}

static void dps_block(const or_inst *in, or_sb *b)
{
    or_sb_put(b, "\n\nThe data are supplied in the file below. Fields:");
    for (int k = 0; k < in->nparams; k++)
        or_sb_printf(b, "\n- `%s`: %s", in->params[k].key, in->params[k].desc);
    or_sb_put(b, "\n\n### data.json\n```json\n{");
    bool firstk = true;
    for (int s = 0; s < in->nsets; s++) {
        if (s > 0 && !strcmp(in->sets[s].name, in->sets[s - 1].name))
            continue;
        or_sb_put(b, firstk ? "\n  " : ",\n  ");
        firstk = false;
        char key[48];
        STRF(key, "%s", in->sets[s].noun_pl);
        for (char *c = key; *c; c++)
            *c = (*c == ' ' || *c == '-') ? '_' : *c;
        or_sb_json_str(b, key);
        or_sb_put(b, ": [");
        for (int i = 0; i < in->sets[s].n; i++) {
            if (i)
                or_sb_put(b, ", ");
            or_sb_json_str(b, in->sets[s].label[i]);
        }
        or_sb_put(b, "]");
    }
    for (int k = 0; k < in->nparams; k++) {
        const or_param *p = &in->params[k];
        or_sb_put(b, ",\n  ");
        or_sb_json_str(b, p->key);
        or_sb_put(b, ": ");
        if (p->dims == 0) {
            or_sb_num(b, p->v[0]);
            continue;
        }
        const or_set *s0 = &in->sets[p->set[0]];
        or_sb_putc(b, '{');
        for (int i = 0; i < s0->n; i++) {
            or_sb_put(b, i ? ", " : "");
            or_sb_json_str(b, s0->label[i]);
            or_sb_put(b, ": ");
            if (p->dims == 1) {
                or_sb_num(b, p->v[i]);
                continue;
            }
            const or_set *s1 = &in->sets[p->set[1]];
            or_sb_putc(b, p->incidence ? '[' : '{');
            int n = 0;
            for (int j = 0; j < s1->n; j++) {
                double v = OR_P2(p, i, j);
                if ((p->sparse && isnan(v)) || (p->incidence && v == 0))
                    continue;
                or_sb_put(b, n++ ? ", " : "");
                or_sb_json_str(b, s1->label[j]);
                if (!p->incidence) {
                    or_sb_put(b, ": ");
                    or_sb_num(b, v);
                }
            }
            or_sb_putc(b, p->incidence ? ']' : '}');
        }
        or_sb_putc(b, '}');
    }
    or_sb_put(b, "\n}\n```");
}

void or_render_problem(const or_inst *in, int rep, or_rng *r, or_sb *b)
{
    or_sb_put(b, in->intro);
    bool rules_first = or_rng_unif(r) < 0.5;
    if (rules_first) {
        or_sb_putc(b, ' ');
        or_sb_put(b, in->rules);
    }
    if (rep == OR_REP_DP) {
        or_sb_put(b, "\n\n");
        size_t at = b->len;
        for (int k = 0; k < in->nparams; k++)
            dp_param(in, &in->params[k], r, b);
        if (b->len > at && b->s[at] == ' ') { /* drop the data paragraph's leading space */
            memmove(b->s + at, b->s + at + 1, b->len - at);
            b->len--;
        }
    } else if (rep == OR_REP_DT)
        dt_tables(in, b);
    else
        dps_block(in, b);
    or_sb_put(b, "\n\n");
    if (!rules_first) {
        or_sb_put(b, in->rules);
        or_sb_putc(b, ' ');
    }
    or_sb_put(b, in->integrality);
    or_sb_putc(b, ' ');
    or_sb_put(b, in->ask);
}

static void sym_idx(or_sb *b, const char *sym, const char *idx)
{
    or_sb_put(b, sym);
    if (idx && idx[0]) {
        or_sb_put(b, "_{");
        for (const char *c = idx; *c; c++)
            if (*c != ',')
                or_sb_putc(b, *c);
        or_sb_putc(b, '}');
    }
}

void or_render_formulation(const or_inst *in, or_sb *b)
{
    or_sb_put(b, "**Sets**\n");
    for (int s = 0; s < in->nsets; s++) {
        if (s > 0 && !strcmp(in->sets[s].name, in->sets[s - 1].name)) {
            or_sb_printf(b, "- $%s$ also indexes $%s$\n", in->sets[s].sym, in->sets[s].name);
            continue;
        }
        or_sb_printf(b, "- $%s \\in %s$: %s (", in->sets[s].sym, in->sets[s].name, in->sets[s].noun_pl);
        for (int i = 0; i < in->sets[s].n; i++)
            or_sb_printf(b, "%s%s", i ? ", " : "", in->sets[s].label[i]);
        or_sb_put(b, ")\n");
    }
    or_sb_put(b, "\n**Parameters**\n");
    for (int k = 0; k < in->nparams; k++) {
        const or_param *p = &in->params[k];
        char idx[8] = "";
        if (p->dims >= 1)
            STRF(idx, "%s%s", in->sets[p->set[0]].sym, p->dims == 2 ? in->sets[p->set[1]].sym : "");
        or_sb_put(b, "- $");
        sym_idx(b, p->sym, idx);
        or_sb_printf(b, "$: %s\n", p->desc);
    }
    or_sb_put(b, "\n**Decision variables**\n");
    for (int k = 0; k < in->nvfam; k++) {
        or_sb_put(b, "- $");
        sym_idx(b, in->vfam[k].sym, in->vfam[k].idx);
        or_sb_printf(b, "$ (%s): %s\n", in->vfam[k].domain, in->vfam[k].desc);
    }
    or_sb_printf(b, "\n**Objective** (%s)\n$$%s$$\n\n**Constraints**\n", in->obj_desc, in->obj_math);
    for (int k = 0; k < in->ncfam; k++)
        or_sb_printf(b, "- %s: $%s$ (%s)\n", in->cfam[k].role, in->cfam[k].math, in->cfam[k].desc);
    or_sb_put(b, "\nIn the LP file, indices are 1-based positions in the lists above (for example `x_2_3` is "
                 "the second member of the first index set with the third of the second) and each constraint "
                 "is named after its family.\n");
}

void or_render_lp_block(const trex_or_model *m, or_sb *b)
{
    char *lp = trex_or_lp_write(m);
    or_sb_put(b, "```lp\n");
    or_sb_put(b, lp);
    or_sb_put(b, "```\n");
    free(lp);
}

double or_snap(double v)
{
    double r = nearbyint(v);
    return fabs(v - r) < 1e-9 * fmax(1, fabs(v)) ? r : v;
}

void or_fmt_value(char *buf, size_t n, double v)
{
    v = or_snap(v);
    if (v == 0)
        v = 0;
    snprintf(buf, n, "%.10g", v);
}

void or_render_solution(const or_inst *in, const trex_or_verdict *v, or_sb *b)
{
    const trex_or_model *m = &in->m;
    char z[40];
    or_fmt_value(z, sizeof z, v->obj);
    or_sb_printf(b, "**Solution.** GLPK proves optimality and CBC reaches the same value. The optimal %s is %s.\n\n",
                 in->obj_noun, z);
    or_sb_put(b, v->unique ? "The optimal plan is unique; its non-zero decisions are:\n"
                           : "One optimal plan (other plans with the same value may exist) has these non-zero "
                             "decisions:\n");
    for (int j = 0; j < m->ncols; j++) {
        if (fabs(v->x[j]) < 1e-9)
            continue;
        char t[40];
        double xv = or_snap(v->x[j]);
        snprintf(t, sizeof t, "%.12g", xv == 0 ? 0 : xv);
        or_sb_printf(b, "- `%s` = %s (%s)\n", m->col_name[j], t, in->col_desc[j]);
    }
    int nb = 0;
    for (int i = 0; i < m->nrows; i++) {
        long double a = 0;
        for (int64_t q = m->row_start[i]; q < m->row_start[i + 1]; q++)
            a += (long double)m->val[q] * v->x[m->idx[q]];
        if (m->row_sense[i] == 'E' || fabs((double)(a - m->rhs[i])) > 1e-7 * fmax(1, fabs(m->rhs[i])))
            continue;
        or_sb_printf(b, "%s`%s` (%s)", nb++ ? ", " : "\nBinding inequality constraints: ", m->row_name[i],
                     in->row_desc[i]);
    }
    if (nb)
        or_sb_put(b, ".\n");
    if (!isnan(v->lp_relax_obj)) {
        char t[40];
        or_fmt_value(t, sizeof t, v->lp_relax_obj);
        or_sb_printf(b, "\nThe LP relaxation gives %s, so integrality %s.\n", t,
                     trex_or_obj_close(v->lp_relax_obj, v->obj) ? "costs nothing here" : "changes the optimum");
    }
}

void or_render_think(const or_inst *in, or_rng *r, or_sb *b)
{
    static const char *const openers[] = {"Let me identify the decisions, the objective and the constraints.",
                                          "First, the modelling choices.", "Breaking the problem down:",
                                          "Plan: decisions, objective, then each constraint family."};
    or_sb_printf(b, "<think>\n%s\nDecisions:", OR_PICK(r, openers));
    for (int k = 0; k < in->nvfam; k++) {
        or_sb_printf(b, " %s", k ? "and " : "");
        sym_idx(b, in->vfam[k].sym, in->vfam[k].idx);
        or_sb_printf(b, " = %s (%s)%s", in->vfam[k].desc, in->vfam[k].domain, k + 1 < in->nvfam ? ";" : ".");
    }
    or_sb_printf(b, "\nObjective: %s the %s.\nConstraints:\n",
                 in->m.sense == TREX_OR_MAX ? "maximise" : "minimise", in->obj_desc);
    for (int k = 0; k < in->ncfam; k++)
        or_sb_printf(b, "- %s: %s.\n", in->cfam[k].role, in->cfam[k].desc);
    or_sb_printf(b, "The model is %s with %d variables and %d constraints.\n</think>\n\n",
                 trex_or_is_mip(&in->m) ? "a MILP" : "an LP", in->m.ncols, in->m.nrows);
}

/* ---- gates ---- */
static bool text_has_number(const char *text, double v)
{
    char want[40];
    or_fmt_num(want, sizeof want, v);
    size_t wl = strlen(want);
    for (const char *p = text; (p = strstr(p, want)) != NULL; p++) {
        bool left_ok = p == text || !(isdigit((unsigned char)p[-1]) || p[-1] == '.' || p[-1] == '-');
        if (want[0] == '-' && p != text && isdigit((unsigned char)p[-1]))
            left_ok = false;
        char c = p[wl];
        bool right_ok = !(isdigit((unsigned char)c) || (c == '.' && isdigit((unsigned char)p[wl + 1])));
        if (left_ok && right_ok)
            return true;
    }
    return false;
}

double or_number_coverage(const or_inst *in, const char *text)
{
    int n = 0, hit = 0;
    for (int k = 0; k < in->nparams; k++) {
        const or_param *p = &in->params[k];
        if (p->incidence)
            continue;
        int n0 = p->dims == 0 ? 1 : in->sets[p->set[0]].n, n1 = p->dims == 2 ? in->sets[p->set[1]].n : 1;
        for (int i = 0; i < n0; i++)
            for (int j = 0; j < n1; j++) {
                double v = p->dims == 2 ? OR_P2(p, i, j) : p->dims == 1 ? p->v[i] : p->v[0];
                if (isnan(v))
                    continue;
                n++;
                hit += text_has_number(text, v);
            }
    }
    return n ? (double)hit / n : 1.0;
}

static bool is_data_number(const or_inst *in, double z)
{
    for (int k = 0; k < in->nparams; k++)
        for (int i = 0; i < OR_MAX_MEMBERS * OR_MAX_MEMBERS; i++)
            if (in->params[k].v[i] == z)
                return true;
    return false;
}

trex_or_reject or_text_gates(const or_inst *in, const char *user, double z, char *why, size_t why_len)
{
    size_t len = strlen(user);
    if (len < 160 || len > 6000) {
        snprintf(why, why_len, "question length %zu outside 160..6000", len);
        return TREX_OR_REJ_TOO_LONG;
    }
    double cov = or_number_coverage(in, user);
    if (cov < 1.0) {
        snprintf(why, why_len, "number coverage %.3f < 1", cov);
        return TREX_OR_REJ_NUMBER_COVERAGE;
    }
    if (!isnan(z) && !is_data_number(in, or_snap(z)) && text_has_number(user, or_snap(z))) {
        snprintf(why, why_len, "the question contains the optimum %g", z);
        return TREX_OR_REJ_LEAK;
    }
    static const char *const leak_words[] = {"optimal value is", "optimal objective", "Optimal objective value"};
    for (size_t k = 0; k < sizeof leak_words / sizeof leak_words[0]; k++)
        if (strstr(user, leak_words[k])) {
            snprintf(why, why_len, "the question says '%s'", leak_words[k]);
            return TREX_OR_REJ_LEAK;
        }
    /* debris outside fenced blocks */
    bool in_fence = false;
    for (const char *p = user; *p; p++) {
        if ((p == user || p[-1] == '\n') && !strncmp(p, "```", 3))
            in_fence = !in_fence;
        if (in_fence)
            continue;
        bool word_start = p == user || !isalpha((unsigned char)p[-1]);
        bool bad = *p == '{' || *p == '}' || *p == '%' || (p[0] == ' ' && p[1] == ' ') || !strncmp(p, "NULL", 4) ||
                   !strncmp(p, "(null)", 6) || (p[0] == '.' && p[1] == '.') ||
                   (word_start && (!strncmp(p, "nan", 3) || !strncmp(p, "inf", 3)) && !isalpha((unsigned char)p[3]));
        if (bad) {
            snprintf(why, why_len, "template debris near \"%.20s\"", p);
            return TREX_OR_REJ_DEBRIS;
        }
    }
    return TREX_OR_ACCEPT;
}
