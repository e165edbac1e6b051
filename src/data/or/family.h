/* data/or/family.h — what a problem-family generator produces (not exported).
 *
 * A family builds, from (tier, rng), one instance: the typed description (sets, parameters, variable
 * and constraint families with role tags, objective) used by every renderer, and the flattened model
 * that the solvers see. All numbers the text shows are parameter values; the story sentences carry no
 * numbers of their own, so that the number-coverage gate can hold at 1.0. */
#ifndef TREX_DATA_OR_FAMILY_H
#define TREX_DATA_OR_FAMILY_H

#include "or_internal.h"

#define OR_MAX_SETS 4
#define OR_MAX_PARAMS 10
#define OR_MAX_VFAM 4
#define OR_MAX_CFAM 8
#define OR_MAX_MEMBERS 40
#define OR_LABEL 40

typedef struct or_set {
    char sym[4];        /* index symbol, e.g. "i" */
    char name[8];       /* set symbol, e.g. "I" */
    char noun_sg[40], noun_pl[40];
    int n;
    char label[OR_MAX_MEMBERS][OR_LABEL];
} or_set;

/* A parameter over 0, 1 or 2 sets. Templates use {i}, {j} (member labels), {v} (value), {u} (unit). */
typedef struct or_param {
    char sym[12];       /* math symbol, e.g. "c" */
    char key[24];       /* JSON key, e.g. "cost" */
    char desc[160];     /* formulation text, e.g. "cost of shipping one bag from i to j" */
    char header[48];    /* table column header */
    char unit[32];
    int dims, set[2];
    double v[OR_MAX_MEMBERS * OR_MAX_MEMBERS];
    char sent[200];     /* one sentence per element (0-D: the only sentence) */
    char list_pre[160]; /* 1-D list form: prefix, then elements "{v} for {i}" joined */
    char list_elem[80];
    char row_pre[160];  /* 2-D: per row i, prefix; then row_elem per j */
    char row_elem[80];
    bool sparse;    /* 2-D: NaN entries are absent (e.g. no arc) */
    bool incidence; /* 2-D 0/1: shown as lists of set-1 members per set-0 member */
} or_param;

typedef struct or_vfam {
    char sym[8], idx[12], domain[40], desc[200];
} or_vfam;

typedef struct or_cfam {
    const char *role;   /* contract role tag, also the row-name prefix family */
    char math[240];     /* LaTeX-lite */
    char desc[240];     /* why it is there, in the skin's words */
    bool required;      /* part of the family contract */
} or_cfam;

typedef struct or_inst {
    int family, tier;
    const char *skin;
    trex_or_model m;
    int nsets, nparams, nvfam, ncfam;
    or_set sets[OR_MAX_SETS];
    or_param params[OR_MAX_PARAMS];
    or_vfam vfam[OR_MAX_VFAM];
    or_cfam cfam[OR_MAX_CFAM];
    char obj_math[240], obj_desc[240];
    char intro[600];     /* context paragraph, no numbers */
    char rules[900];     /* decisions, rules and goal in words, no numbers */
    char integrality[240];
    char ask[240];       /* the final question sentence (what to optimise) */
    char obj_noun[80];   /* e.g. "total weekly cost (dollars)" */
    char (*col_desc)[96]; /* per column, e.g. "bags shipped from Ashford to Brookvale" */
    char (*row_desc)[96]; /* per row */
} or_inst;

typedef struct or_family {
    const char *name;
    const char *model_type; /* "LP", "MILP" or "LP/MILP" */
    void (*build)(or_inst *in, int tier, or_rng *r);
} or_family;

extern const or_family or_families_a_tab[], or_families_b_tab[], or_families_c_tab[];
extern const int or_families_a_n, or_families_b_n, or_families_c_n;
/* The registry: family f in [0, trex_or_family_count()). */
const or_family *or_family_get(int f);

void or_inst_init(or_inst *in, int family, int tier, const char *name, trex_or_sense sense);
void or_inst_free(or_inst *in);
/* Helpers for family builders. */
or_set *or_add_set(or_inst *in, const char *sym, const char *name, const char *sg, const char *pl, int n);
/* Fills labels of set s from a pool of names (distinct, shuffled), or "<prefix> k" when pool is NULL. */
void or_set_labels(or_set *s, or_rng *r, const char *const *pool, int npool, const char *prefix);
/* Labels from a NULL-terminated list; a list shorter than the set shrinks the set. Returns the size. */
int or_set_from_list(or_set *s, or_rng *r, const char *const *list);
/* A size drawn uniformly from [a_t, b_t] of the instance's tier t (0, 1 or 2). */
int or_tier_n(or_rng *r, int tier, int a0, int b0, int a1, int b1, int a2, int b2);
or_param *or_add_param(or_inst *in, const char *sym, const char *key, int dims, int s0, int s1);
or_vfam *or_add_vfam(or_inst *in, const char *sym, const char *idx, const char *domain, const char *desc);
or_cfam *or_add_cfam(or_inst *in, const char *role, bool required, const char *math, const char *desc);
int or_col(or_inst *in, const char *name, double lb, double ub, double obj, trex_or_kind k, const char *desc);
int or_row(or_inst *in, const char *name, const char *role, int n, const int *cols, const double *co, char sense,
           double rhs, const char *desc);
double or_pv(const or_param *p, int i, int j);
#define OR_P2(p, i, j) ((p)->v[(i) * OR_MAX_MEMBERS + (j)])
/* snprintf into a fixed buffer; truncation is acceptable for display strings. */
void or_strf(char *dst, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define STRF(buf, ...) or_strf((buf), sizeof(buf), __VA_ARGS__)
/* "A, B and C" from the labels of set s. */
void or_join_labels(const or_set *s, char *dst, size_t n);
/* Rounds to a given number of decimals (0, 1 or 2) exactly as printed. */
double or_round(double v, int decimals);

/* Skin-independent name pools. */
extern const char *const or_place_names[];
extern const int or_nplace_names;
extern const char *const or_person_names[];
extern const int or_nperson_names;

#endif
