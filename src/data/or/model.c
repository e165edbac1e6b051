/* data/or/model.c — the flattened model IR, its self-check, the strict LP writer (OR_PIPELINE 4.5),
 * LP reading through GLPK's reader, and the canonical structural hash. */
#include <ctype.h>
#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "or_internal.h"

void trex_or_model_init(trex_or_model *m, const char *name, trex_or_sense sense)
{
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name ? name : "model");
    m->sense = sense;
    m->row_start = trex_xcalloc(1, sizeof *m->row_start);
}

void trex_or_model_free(trex_or_model *m)
{
    free(m->col_name);
    free(m->lb);
    free(m->ub);
    free(m->obj);
    free(m->kind);
    free(m->row_name);
    free(m->row_sense);
    free(m->rhs);
    free(m->role);
    free(m->row_start);
    free(m->idx);
    free(m->val);
    memset(m, 0, sizeof *m);
}

static void grow_cols(trex_or_model *m, int need)
{
    if (need <= m->cap_cols)
        return;
    int cap = m->cap_cols ? m->cap_cols * 2 : 16;
    while (cap < need)
        cap *= 2;
    m->col_name = trex_xrealloc(m->col_name, (size_t)cap * sizeof *m->col_name);
    m->lb = trex_xrealloc(m->lb, (size_t)cap * sizeof *m->lb);
    m->ub = trex_xrealloc(m->ub, (size_t)cap * sizeof *m->ub);
    m->obj = trex_xrealloc(m->obj, (size_t)cap * sizeof *m->obj);
    m->kind = trex_xrealloc(m->kind, (size_t)cap * sizeof *m->kind);
    m->cap_cols = cap;
}

static void grow_rows(trex_or_model *m, int need_rows, int64_t need_nnz)
{
    if (need_rows > m->cap_rows) {
        int cap = m->cap_rows ? m->cap_rows * 2 : 16;
        while (cap < need_rows)
            cap *= 2;
        m->row_name = trex_xrealloc(m->row_name, (size_t)cap * sizeof *m->row_name);
        m->row_sense = trex_xrealloc(m->row_sense, (size_t)cap);
        m->rhs = trex_xrealloc(m->rhs, (size_t)cap * sizeof *m->rhs);
        m->role = trex_xrealloc(m->role, (size_t)cap * sizeof *m->role);
        m->row_start = trex_xrealloc(m->row_start, (size_t)(cap + 1) * sizeof *m->row_start);
        m->cap_rows = cap;
    }
    if (need_nnz > m->cap_nnz) {
        int64_t cap = m->cap_nnz ? m->cap_nnz * 2 : 64;
        while (cap < need_nnz)
            cap *= 2;
        m->idx = trex_xrealloc(m->idx, (size_t)cap * sizeof *m->idx);
        m->val = trex_xrealloc(m->val, (size_t)cap * sizeof *m->val);
        m->cap_nnz = cap;
    }
}

void trex_or_model_copy(trex_or_model *dst, const trex_or_model *src)
{
    trex_or_model_init(dst, src->name, src->sense);
    grow_cols(dst, src->ncols);
    grow_rows(dst, src->nrows, src->nnz);
    dst->ncols = src->ncols;
    dst->nrows = src->nrows;
    dst->nnz = src->nnz;
    size_t nc = (size_t)src->ncols, nr = (size_t)src->nrows, nz = (size_t)src->nnz;
    if (nc) {
        memcpy(dst->col_name, src->col_name, nc * sizeof *src->col_name);
        memcpy(dst->lb, src->lb, nc * sizeof *src->lb);
        memcpy(dst->ub, src->ub, nc * sizeof *src->ub);
        memcpy(dst->obj, src->obj, nc * sizeof *src->obj);
        memcpy(dst->kind, src->kind, nc);
    }
    if (nr) {
        memcpy(dst->row_name, src->row_name, nr * sizeof *src->row_name);
        memcpy(dst->row_sense, src->row_sense, nr);
        memcpy(dst->rhs, src->rhs, nr * sizeof *src->rhs);
        memcpy(dst->role, src->role, nr * sizeof *src->role);
    }
    memcpy(dst->row_start, src->row_start, (nr + 1) * sizeof *src->row_start);
    if (nz) {
        memcpy(dst->idx, src->idx, nz * sizeof *src->idx);
        memcpy(dst->val, src->val, nz * sizeof *src->val);
    }
}

int trex_or_add_col(trex_or_model *m, const char *name, double lb, double ub, double obj, trex_or_kind k)
{
    grow_cols(m, m->ncols + 1);
    int j = m->ncols++;
    snprintf(m->col_name[j], TREX_OR_NAME_MAX, "%s", name);
    if (k == TREX_OR_BIN) {
        lb = 0;
        ub = 1;
    }
    m->lb[j] = lb;
    m->ub[j] = ub;
    m->obj[j] = obj;
    m->kind[j] = (uint8_t)k;
    return j;
}

int trex_or_add_row(trex_or_model *m, const char *name, const char *role, int n, const int *cols,
                    const double *coefs, char sense, double rhs)
{
    TREX_ASSERT(sense == 'L' || sense == 'G' || sense == 'E');
    grow_rows(m, m->nrows + 1, m->nnz + n);
    int r = m->nrows;
    snprintf(m->row_name[r], TREX_OR_NAME_MAX, "%s", name);
    m->row_sense[r] = sense;
    m->rhs[r] = rhs;
    m->role[r] = role;
    int64_t start = m->row_start[r], end = start;
    for (int t = 0; t < n; t++) {
        TREX_ASSERT(cols[t] >= 0 && cols[t] < m->ncols);
        int64_t q;
        for (q = start; q < end; q++)
            if (m->idx[q] == cols[t])
                break;
        if (q < end) {
            m->val[q] += coefs[t];
            continue;
        }
        m->idx[end] = cols[t];
        m->val[end] = coefs[t];
        end++;
    }
    int64_t w = start; /* drop zeros */
    for (int64_t q = start; q < end; q++)
        if (m->val[q] != 0) {
            m->idx[w] = m->idx[q];
            m->val[w] = m->val[q];
            w++;
        }
    m->nrows++;
    m->row_start[r + 1] = w;
    m->nnz = w;
    return r;
}

void trex_or_del_row(trex_or_model *m, int r)
{
    TREX_ASSERT(r >= 0 && r < m->nrows);
    int64_t s = m->row_start[r], e = m->row_start[r + 1], k = e - s;
    memmove(m->idx + s, m->idx + e, (size_t)(m->nnz - e) * sizeof *m->idx);
    memmove(m->val + s, m->val + e, (size_t)(m->nnz - e) * sizeof *m->val);
    for (int i = r; i < m->nrows - 1; i++) {
        memcpy(m->row_name[i], m->row_name[i + 1], TREX_OR_NAME_MAX);
        m->row_sense[i] = m->row_sense[i + 1];
        m->rhs[i] = m->rhs[i + 1];
        m->role[i] = m->role[i + 1];
        m->row_start[i + 1] = m->row_start[i + 2] - k;
    }
    m->nrows--;
    m->nnz -= k;
}

int trex_or_find_col(const trex_or_model *m, const char *name)
{
    for (int j = 0; j < m->ncols; j++)
        if (!strcmp(m->col_name[j], name))
            return j;
    return -1;
}

int trex_or_find_row(const trex_or_model *m, const char *name)
{
    for (int i = 0; i < m->nrows; i++)
        if (!strcmp(m->row_name[i], name))
            return i;
    return -1;
}

bool trex_or_is_mip(const trex_or_model *m)
{
    for (int j = 0; j < m->ncols; j++)
        if (m->kind[j] != TREX_OR_CONT)
            return true;
    return false;
}

static bool valid_name(const char *s)
{
    if (!(isalpha((unsigned char)s[0]) || s[0] == '_'))
        return false;
    size_t n = 0;
    for (; s[n]; n++)
        if (!(isalnum((unsigned char)s[n]) || s[n] == '_'))
            return false;
    return n <= 32;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

trex_code trex_or_model_check(const trex_or_model *m, trex_err *err)
{
    trex_code rc = TREX_OK;
    const char **names = trex_xmalloc((size_t)(m->ncols + m->nrows + 1) * sizeof *names);
    int nn = 0;
    double amin = INFINITY, amax = 0;
    if (m->ncols == 0) {
        rc = trex_err_set(err, TREX_EINVAL, "model %s: no columns; add at least one variable", m->name);
        goto out;
    }
    for (int j = 0; j < m->ncols; j++) {
        const char *n = m->col_name[j];
        if (!valid_name(n) || !strcmp(n, "obj")) {
            rc = trex_err_set(err, TREX_EINVAL,
                              "model %s: column name '%s' is not in [A-Za-z_][A-Za-z0-9_]{0,31}", m->name, n);
            goto out;
        }
        if (!isfinite(m->obj[j]) || isnan(m->lb[j]) || isnan(m->ub[j]) || m->lb[j] > m->ub[j] ||
            m->lb[j] == INFINITY || m->ub[j] == -INFINITY || (m->lb[j] == -INFINITY && isfinite(m->ub[j]))) {
            rc = trex_err_set(err, TREX_EINVAL,
                              "model %s: column %s has bad data (obj %g, bounds [%g, %g]); bounds must be "
                              "finite-or-infinite with lb <= ub and lb finite when ub is",
                              m->name, n, m->obj[j], m->lb[j], m->ub[j]);
            goto out;
        }
        names[nn++] = n;
    }
    for (int i = 0; i < m->nrows; i++) {
        const char *n = m->row_name[i];
        if (!valid_name(n) || !strcmp(n, "obj")) {
            rc = trex_err_set(err, TREX_EINVAL, "model %s: row name '%s' is not a valid LP name", m->name, n);
            goto out;
        }
        if (m->row_start[i + 1] == m->row_start[i]) {
            rc = trex_err_set(err, TREX_EINVAL, "model %s: row %s is empty; drop or fold it", m->name, n);
            goto out;
        }
        if (!isfinite(m->rhs[i])) {
            rc = trex_err_set(err, TREX_EINVAL, "model %s: row %s has a non-finite rhs", m->name, n);
            goto out;
        }
        for (int64_t q = m->row_start[i]; q < m->row_start[i + 1]; q++) {
            double a = fabs(m->val[q]);
            if (!isfinite(a)) {
                rc = trex_err_set(err, TREX_EINVAL, "model %s: row %s has a non-finite coefficient", m->name, n);
                goto out;
            }
            amin = fmin(amin, a);
            amax = fmax(amax, a);
        }
        names[nn++] = n;
    }
    if (amax > 0 && amax / amin > 1e6) {
        rc = trex_err_set(err, TREX_EINVAL, "model %s: coefficient range %g..%g exceeds 1e6; rescale the data",
                          m->name, amin, amax);
        goto out;
    }
    qsort(names, (size_t)nn, sizeof *names, cmp_str);
    for (int k = 1; k < nn; k++)
        if (!strcmp(names[k - 1], names[k])) {
            rc = trex_err_set(err, TREX_EINVAL, "model %s: name '%s' is used twice; names must be unique",
                              m->name, names[k]);
            goto out;
        }
out:
    free(names);
    return rc;
}

/* ---- LP writer ---- */
typedef struct lp_line {
    or_sb *b;
    size_t line_start;
} lp_line;

static void lp_token(lp_line *l, const char *tok)
{
    size_t cur = l->b->len - l->line_start;
    if (cur + strlen(tok) > 96) {
        or_sb_put(l->b, "\n   ");
        l->line_start = l->b->len - 3;
    }
    or_sb_put(l->b, tok);
}

static void lp_term(lp_line *l, double c, const char *name, bool first)
{
    char t[80], num[40];
    const char *sign = c < 0 ? "-" : "+";
    double a = fabs(c);
    if (a == 1)
        num[0] = '\0';
    else {
        or_fmt_num(num, sizeof num, a);
        strcat(num, " ");
    }
    if (first)
        snprintf(t, sizeof t, "%s%s%s", c < 0 ? "- " : "", num, name);
    else
        snprintf(t, sizeof t, " %s %s%s", sign, num, name);
    lp_token(l, t);
}

char *trex_or_lp_write(const trex_or_model *m)
{
    or_sb b = {0};
    or_sb_printf(&b, "\\ %s\n%s\n", m->name, m->sense == TREX_OR_MAX ? "Maximize" : "Minimize");
    lp_line l = {&b, b.len};
    or_sb_put(&b, " obj:");
    bool first = true;
    for (int j = 0; j < m->ncols; j++) {
        if (m->obj[j] == 0)
            continue;
        if (first)
            or_sb_putc(&b, ' ');
        lp_term(&l, m->obj[j], m->col_name[j], first);
        first = false;
    }
    if (first) /* an all-zero objective still needs a term for the readers */
        or_sb_printf(&b, " 0 %s", m->col_name[0]);
    or_sb_put(&b, "\nSubject To\n");
    for (int i = 0; i < m->nrows; i++) {
        size_t start = b.len;
        or_sb_printf(&b, " %s:", m->row_name[i]);
        l.line_start = start;
        for (int64_t q = m->row_start[i]; q < m->row_start[i + 1]; q++) {
            if (q == m->row_start[i])
                or_sb_putc(&b, ' ');
            lp_term(&l, m->val[q], m->col_name[m->idx[q]], q == m->row_start[i]);
        }
        char t[64], num[40];
        or_fmt_num(num, sizeof num, m->rhs[i]);
        snprintf(t, sizeof t, " %s %s", m->row_sense[i] == 'L' ? "<=" : m->row_sense[i] == 'G' ? ">=" : "=",
                 num);
        lp_token(&l, t);
        or_sb_putc(&b, '\n');
    }
    bool any_bound = false;
    for (int j = 0; j < m->ncols; j++) {
        if (m->kind[j] == TREX_OR_BIN)
            continue;
        double lo = m->lb[j], hi = m->ub[j];
        char a[40], c[40];
        or_fmt_num(a, sizeof a, lo);
        or_fmt_num(c, sizeof c, hi);
        const char *nm = m->col_name[j];
        if (lo == 0 && hi == INFINITY)
            continue;
        if (!any_bound)
            or_sb_put(&b, "Bounds\n");
        any_bound = true;
        if (lo == -INFINITY && hi == INFINITY)
            or_sb_printf(&b, " %s free\n", nm);
        else if (lo == hi)
            or_sb_printf(&b, " %s = %s\n", nm, a);
        else if (lo == 0)
            or_sb_printf(&b, " %s <= %s\n", nm, c);
        else if (hi == INFINITY)
            or_sb_printf(&b, " %s >= %s\n", nm, a);
        else
            or_sb_printf(&b, " %s <= %s <= %s\n", a, nm, c);
    }
    for (int pass = 0; pass < 2; pass++) {
        trex_or_kind want = pass == 0 ? TREX_OR_INT : TREX_OR_BIN;
        bool any = false;
        size_t ls = 0;
        for (int j = 0; j < m->ncols; j++) {
            if (m->kind[j] != want)
                continue;
            if (!any) {
                or_sb_put(&b, pass == 0 ? "General\n" : "Binary\n");
                ls = b.len;
                or_sb_putc(&b, ' ');
            } else if (b.len - ls + strlen(m->col_name[j]) > 96) {
                or_sb_put(&b, "\n ");
                ls = b.len - 1;
            } else
                or_sb_putc(&b, ' ');
            or_sb_put(&b, m->col_name[j]);
            any = true;
        }
        if (any)
            or_sb_putc(&b, '\n');
    }
    or_sb_put(&b, "End\n");
    return or_sb_take(&b);
}

/* ---- LP reading through GLPK ---- */
trex_code trex_or_lp_read(const char *text, size_t len, trex_or_model *m, trex_err *err)
{
    trex_code rc = TREX_OK;
    char path[64];
    int prev = or_glpk_quiet();
    glp_prob *P = glp_create_prob();
    int fd = or_memfile(text, len, path, sizeof path);
    int *ind = NULL;
    double *val = NULL;
    if (fd < 0) {
        rc = trex_err_set(err, TREX_EIO, "cannot create an in-memory file for the LP text");
        goto out;
    }
    if (glp_read_lp(P, NULL, path) != 0) {
        rc = trex_err_set(err, TREX_EFORMAT,
                          "GLPK's LP reader rejected the text; it must follow the CPLEX LP subset "
                          "(names [A-Za-z_][A-Za-z0-9_]*, constant right-hand sides, no objective constant)");
        goto out;
    }
    int nc = glp_get_num_cols(P), nr = glp_get_num_rows(P);
    trex_or_model_init(m, glp_get_prob_name(P) ? glp_get_prob_name(P) : "lp",
                       glp_get_obj_dir(P) == GLP_MAX ? TREX_OR_MAX : TREX_OR_MIN);
    if (glp_get_obj_coef(P, 0) != 0) {
        trex_or_model_free(m);
        rc = trex_err_set(err, TREX_EFORMAT, "the objective has a constant term; move it out of the LP");
        goto out;
    }
    for (int j = 1; j <= nc; j++) {
        int t = glp_get_col_type(P, j);
        double lo = (t == GLP_FR || t == GLP_UP) ? -INFINITY : glp_get_col_lb(P, j);
        double hi = (t == GLP_FR || t == GLP_LO) ? INFINITY : glp_get_col_ub(P, j);
        int k = glp_get_col_kind(P, j);
        trex_or_kind kk = k == GLP_BV ? TREX_OR_BIN : k == GLP_IV ? TREX_OR_INT : TREX_OR_CONT;
        const char *nm = glp_get_col_name(P, j);
        trex_or_add_col(m, nm ? nm : "c", lo, hi, glp_get_obj_coef(P, j), kk);
    }
    ind = trex_xmalloc((size_t)(nc + 1) * sizeof *ind);
    val = trex_xmalloc((size_t)(nc + 1) * sizeof *val);
    for (int i = 1; i <= nr; i++) {
        int t = glp_get_row_type(P, i);
        int n = glp_get_mat_row(P, i, ind, val);
        for (int q = 1; q <= n; q++)
            ind[q]--;
        const char *nm = glp_get_row_name(P, i);
        char sense;
        double rhs;
        if (t == GLP_UP) {
            sense = 'L';
            rhs = glp_get_row_ub(P, i);
        } else if (t == GLP_LO) {
            sense = 'G';
            rhs = glp_get_row_lb(P, i);
        } else if (t == GLP_FX) {
            sense = 'E';
            rhs = glp_get_row_lb(P, i);
        } else {
            trex_or_model_free(m);
            rc = trex_err_set(err, TREX_EFORMAT, "row %s is free or ranged; write each bound as its own row",
                              nm ? nm : "?");
            goto out;
        }
        trex_or_add_row(m, nm ? nm : "r", NULL, n, ind + 1, val + 1, sense, rhs);
    }
out:
    free(ind);
    free(val);
    if (fd >= 0)
        close(fd);
    glp_delete_prob(P);
    or_glpk_restore(prev);
    return rc;
}

/* ---- canonical hash ---- */
static uint64_t hnum(double v)
{
    char t[40];
    if (v == 0)
        v = 0;
    snprintf(t, sizeof t, "%.10g", v);
    return or_hash_bytes(t, strlen(t), 7);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t trex_or_canon_hash(const trex_or_model *m)
{
    int nc = m->ncols, nr = m->nrows;
    uint64_t *cl = trex_xmalloc((size_t)(nc + 1) * sizeof *cl), *rl = trex_xmalloc((size_t)(nr + 1) * sizeof *rl);
    uint64_t *tmp = trex_xmalloc((size_t)(m->nnz + nc + nr + 1) * sizeof *tmp);
    double *sgn = trex_xmalloc((size_t)(nr + 1) * sizeof *sgn);
    /* CSC view for the column refinement */
    int64_t *cs = trex_xcalloc((size_t)nc + 1, sizeof *cs);
    int *ri = trex_xmalloc((size_t)(m->nnz + 1) * sizeof *ri);
    double *rv = trex_xmalloc((size_t)(m->nnz + 1) * sizeof *rv);
    for (int64_t q = 0; q < m->nnz; q++)
        cs[m->idx[q] + 1]++;
    for (int j = 0; j < nc; j++)
        cs[j + 1] += cs[j];
    int64_t *fill = trex_xmalloc((size_t)(nc + 1) * sizeof *fill);
    memcpy(fill, cs, (size_t)(nc + 1) * sizeof *fill);
    for (int i = 0; i < nr; i++) {
        /* normalise: G rows become L rows; E rows get a non-negative rhs */
        sgn[i] = (m->row_sense[i] == 'G' || (m->row_sense[i] == 'E' && m->rhs[i] < 0)) ? -1 : 1;
        for (int64_t q = m->row_start[i]; q < m->row_start[i + 1]; q++) {
            int64_t p = fill[m->idx[q]]++;
            ri[p] = i;
            rv[p] = m->val[q] * sgn[i];
        }
    }
    for (int j = 0; j < nc; j++) {
        int k = m->kind[j];
        double lo = m->lb[j], hi = m->ub[j];
        if (k == TREX_OR_INT && lo == 0 && hi == 1)
            k = TREX_OR_BIN;
        cl[j] = or_hash2(or_hash2(or_hash2((uint64_t)k, hnum(lo)), hnum(hi)), hnum(m->obj[j]));
    }
    for (int i = 0; i < nr; i++)
        rl[i] = or_hash2(m->row_sense[i] == 'E' ? 2 : 1, hnum(m->rhs[i] * sgn[i]));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < nr; i++) {
            int n = 0;
            for (int64_t q = m->row_start[i]; q < m->row_start[i + 1]; q++)
                tmp[n++] = or_hash2(cl[m->idx[q]], hnum(m->val[q] * sgn[i]));
            qsort(tmp, (size_t)n, sizeof *tmp, cmp_u64);
            uint64_t h = rl[i];
            for (int t = 0; t < n; t++)
                h = or_hash2(h, tmp[t]);
            rl[i] = h;
        }
        for (int j = 0; j < nc; j++) {
            int n = 0;
            for (int64_t p = cs[j]; p < cs[j + 1]; p++)
                tmp[n++] = or_hash2(rl[ri[p]], hnum(rv[p]));
            qsort(tmp, (size_t)n, sizeof *tmp, cmp_u64);
            uint64_t h = cl[j];
            for (int t = 0; t < n; t++)
                h = or_hash2(h, tmp[t]);
            cl[j] = h;
        }
    }
    int n = 0;
    for (int i = 0; i < nr; i++)
        tmp[n++] = rl[i];
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_u64);
    uint64_t h = or_hash2((uint64_t)(m->sense + 5), (uint64_t)nr * 1000003u + (uint64_t)nc);
    for (int t = 0; t < n; t++)
        h = or_hash2(h, tmp[t]);
    qsort(cl, (size_t)nc, sizeof *cl, cmp_u64);
    for (int j = 0; j < nc; j++)
        h = or_hash2(h, cl[j]);
    free(cl);
    free(rl);
    free(tmp);
    free(sgn);
    free(cs);
    free(ri);
    free(rv);
    free(fill);
    return h;
}
