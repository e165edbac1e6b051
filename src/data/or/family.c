/* data/or/family.c — instance helpers shared by the family generators, and the name pools. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family.h"

const char *const or_place_names[] = {
    "Ashford", "Brookvale", "Cedar Bay", "Dunmore", "Eastwick", "Fairhaven", "Glenrock", "Harlow",
    "Ironbridge", "Juniper Falls", "Kingsford", "Lakemont", "Millbrook", "Northgate", "Oakridge",
    "Pinecrest", "Queensbury", "Riverton", "Stonebridge", "Thornbury", "Upton", "Valemont", "Westfield",
    "Yarrow", "Zephyr Point", "Alder Creek", "Bellmont", "Clearwater", "Driftwood", "Elmstead",
    "Foxhollow", "Greystone", "Hollowell", "Ivywood", "Larkspur", "Marlow", "Newhaven", "Orchard Hill",
    "Redcliff", "Silverlake", "Tamarind", "Willowby"};
const int or_nplace_names = (int)(sizeof or_place_names / sizeof or_place_names[0]);

const char *const or_person_names[] = {
    "Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kavya",
    "Luis", "Maya", "Nils", "Olga", "Pedro", "Quinn", "Rosa", "Samir", "Tara", "Umar", "Vera", "Wei",
    "Ximena", "Yusuf", "Zoe", "Amara", "Bjorn", "Carmen", "Dario"};
const int or_nperson_names = (int)(sizeof or_person_names / sizeof or_person_names[0]);

void or_inst_init(or_inst *in, int family, int tier, const char *name, trex_or_sense sense)
{
    memset(in, 0, sizeof *in);
    in->family = family;
    in->tier = tier;
    trex_or_model_init(&in->m, name, sense);
}

void or_inst_free(or_inst *in)
{
    trex_or_model_free(&in->m);
    free(in->col_desc);
    free(in->row_desc);
    in->col_desc = NULL;
    in->row_desc = NULL;
}

or_set *or_add_set(or_inst *in, const char *sym, const char *name, const char *sg, const char *pl, int n)
{
    TREX_ASSERT(in->nsets < OR_MAX_SETS && n > 0 && n <= OR_MAX_MEMBERS);
    or_set *s = &in->sets[in->nsets++];
    snprintf(s->sym, sizeof s->sym, "%s", sym);
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->noun_sg, sizeof s->noun_sg, "%s", sg);
    snprintf(s->noun_pl, sizeof s->noun_pl, "%s", pl);
    s->n = n;
    return s;
}

void or_set_labels(or_set *s, or_rng *r, const char *const *pool, int npool, const char *prefix)
{
    if (pool) {
        TREX_ASSERT(npool >= s->n);
        int *perm = trex_xmalloc((size_t)npool * sizeof *perm);
        for (int k = 0; k < npool; k++)
            perm[k] = k;
        or_rng_shuffle(r, perm, npool);
        for (int k = 0; k < s->n; k++)
            snprintf(s->label[k], OR_LABEL, "%s%s%s", prefix ? prefix : "", prefix ? " " : "", pool[perm[k]]);
        free(perm);
    } else {
        static const char letters[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
        for (int k = 0; k < s->n; k++) {
            if (k < 26)
                snprintf(s->label[k], OR_LABEL, "%s %c", prefix, letters[k]);
            else
                snprintf(s->label[k], OR_LABEL, "%s %c%c", prefix, letters[k / 26 - 1], letters[k % 26]);
        }
    }
}

or_param *or_add_param(or_inst *in, const char *sym, const char *key, int dims, int s0, int s1)
{
    TREX_ASSERT(in->nparams < OR_MAX_PARAMS);
    or_param *p = &in->params[in->nparams++];
    memset(p, 0, sizeof *p);
    snprintf(p->sym, sizeof p->sym, "%s", sym);
    snprintf(p->key, sizeof p->key, "%s", key);
    p->dims = dims;
    p->set[0] = s0;
    p->set[1] = s1;
    return p;
}

or_vfam *or_add_vfam(or_inst *in, const char *sym, const char *idx, const char *domain, const char *desc)
{
    TREX_ASSERT(in->nvfam < OR_MAX_VFAM);
    or_vfam *v = &in->vfam[in->nvfam++];
    snprintf(v->sym, sizeof v->sym, "%s", sym);
    snprintf(v->idx, sizeof v->idx, "%s", idx);
    snprintf(v->domain, sizeof v->domain, "%s", domain);
    snprintf(v->desc, sizeof v->desc, "%s", desc);
    return v;
}

or_cfam *or_add_cfam(or_inst *in, const char *role, bool required, const char *math, const char *desc)
{
    TREX_ASSERT(in->ncfam < OR_MAX_CFAM);
    or_cfam *c = &in->cfam[in->ncfam++];
    c->role = role;
    c->required = required;
    snprintf(c->math, sizeof c->math, "%s", math);
    snprintf(c->desc, sizeof c->desc, "%s", desc);
    return c;
}

int or_col(or_inst *in, const char *name, double lb, double ub, double obj, trex_or_kind k, const char *desc)
{
    int j = trex_or_add_col(&in->m, name, lb, ub, obj, k);
    in->col_desc = trex_xrealloc(in->col_desc, (size_t)in->m.cap_cols * sizeof *in->col_desc);
    snprintf(in->col_desc[j], sizeof in->col_desc[j], "%s", desc);
    return j;
}

int or_row(or_inst *in, const char *name, const char *role, int n, const int *cols, const double *co, char sense,
           double rhs, const char *desc)
{
    int r = trex_or_add_row(&in->m, name, role, n, cols, co, sense, rhs);
    in->row_desc = trex_xrealloc(in->row_desc, (size_t)in->m.cap_rows * sizeof *in->row_desc);
    snprintf(in->row_desc[r], sizeof in->row_desc[r], "%s", desc);
    return r;
}

double or_pv(const or_param *p, int i, int j)
{
    if (p->dims == 0)
        return p->v[0];
    if (p->dims == 1)
        return p->v[i];
    return p->v[i * OR_MAX_MEMBERS + j];
}

void or_strf(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
}

void or_join_labels(const or_set *s, char *dst, size_t n)
{
    or_sb b = {0};
    for (int k = 0; k < s->n; k++) {
        if (k)
            or_sb_put(&b, k == s->n - 1 ? " and " : ", ");
        or_sb_put(&b, s->label[k]);
    }
    or_strf(dst, n, "%s", b.s ? b.s : "");
    or_sb_free(&b);
}

double or_round(double v, int decimals)
{
    double f = decimals == 0 ? 1 : decimals == 1 ? 10 : 100;
    char t[48];
    snprintf(t, sizeof t, "%.*f", decimals, nearbyint(v * f) / f);
    return strtod(t, NULL);
}

int or_set_from_list(or_set *s, or_rng *r, const char *const *list)
{
    int n = 0;
    while (list[n])
        n++;
    if (s->n > n)
        s->n = n;
    or_set_labels(s, r, list, n, NULL);
    return s->n;
}

int or_tier_n(or_rng *r, int tier, int a0, int b0, int a1, int b1, int a2, int b2)
{
    return tier == 0 ? or_rng_int(r, a0, b0) : tier == 1 ? or_rng_int(r, a1, b1) : or_rng_int(r, a2, b2);
}
