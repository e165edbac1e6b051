/* trex/or.h — the OR data workflow: a linear model IR, a strict CPLEX-LP writer, GLPK and CBC
 * backends with a verification ladder, problem-family generators, renderers, and the or-gen /
 * or-verify / or-stats / or-evalcheck jobs behind `trex data`.
 *
 * Ownership: every `*_init` / `*_free` pair owns the memory of the struct it is given; strings returned
 * through `char **out` are malloc'ed and freed by the caller. Errors: bad input (an LP file that does not
 * parse, a malformed JSONL row, a wrong flag) returns a trex_code and a message in err; solver outcomes
 * (infeasible, time limit, disagreement) are results, not errors.
 *
 * GLPK keeps its environment (terminal output switch, error hook) per thread. Every call into GLPK here
 * goes through one wrapper that turns terminal output off and restores the previous setting before
 * returning, so nothing is printed and nothing is left changed for other code in the process. */
#ifndef TREX_OR_H
#define TREX_OR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trex/status.h"

#define TREX_OR_NAME_MAX 33 /* 32 characters plus the NUL (OR_PIPELINE 4.5) */

typedef enum trex_or_sense { TREX_OR_MIN = 1, TREX_OR_MAX = -1 } trex_or_sense;
typedef enum trex_or_kind { TREX_OR_CONT = 0, TREX_OR_INT = 1, TREX_OR_BIN = 2 } trex_or_kind;

/* A flattened linear model: columns, rows in CSR order, objective. Row `role` is a static string tag
 * from the family contract (e.g. "demand_meet"), or NULL for rows read from a file. */
typedef struct trex_or_model {
    char name[TREX_OR_NAME_MAX];
    trex_or_sense sense;
    int ncols, nrows;
    int64_t nnz;
    char (*col_name)[TREX_OR_NAME_MAX];
    double *lb, *ub, *obj; /* bounds use -INFINITY / INFINITY */
    uint8_t *kind;         /* trex_or_kind */
    char (*row_name)[TREX_OR_NAME_MAX];
    char *row_sense; /* 'L', 'G' or 'E' */
    double *rhs;
    const char **role;
    int64_t *row_start; /* nrows + 1 */
    int *idx;           /* column of each nonzero */
    double *val;
    int cap_cols, cap_rows;
    int64_t cap_nnz;
} trex_or_model;

void trex_or_model_init(trex_or_model *m, const char *name, trex_or_sense sense);
void trex_or_model_free(trex_or_model *m);
/* Deep copy (dst uninitialised). */
void trex_or_model_copy(trex_or_model *dst, const trex_or_model *src);
/* Adds a column; returns its index. */
int trex_or_add_col(trex_or_model *m, const char *name, double lb, double ub, double obj, trex_or_kind k);
/* Adds a row (terms with equal columns are summed; zero terms dropped); returns its index. */
int trex_or_add_row(trex_or_model *m, const char *name, const char *role, int n, const int *cols,
                    const double *coefs, char sense, double rhs);
int trex_or_find_col(const trex_or_model *m, const char *name);
int trex_or_find_row(const trex_or_model *m, const char *name);
/* Removes row r (keeps the order of the others). */
void trex_or_del_row(trex_or_model *m, int r);
bool trex_or_is_mip(const trex_or_model *m);

/* IR self-check (OR_PIPELINE 5.7-1): names valid and unique, no empty rows, finite data, bounds sane,
 * coefficient range <= 1e6. Names the offending row or column in err. */
trex_code trex_or_model_check(const trex_or_model *m, trex_err *err);

/* The strict LP subset (OR_PIPELINE 4.5). *out is malloc'ed, NUL-terminated. */
char *trex_or_lp_write(const trex_or_model *m);
/* Parses LP text with GLPK's reader (text goes through an anonymous in-memory file) into m
 * (uninitialised on entry; initialised on success). */
trex_code trex_or_lp_read(const char *text, size_t len, trex_or_model *m, trex_err *err);

/* A structural hash, invariant under row and column permutation and names (WL refinement). */
uint64_t trex_or_canon_hash(const trex_or_model *m);

typedef enum trex_or_status {
    TREX_OR_OPTIMAL = 0,
    TREX_OR_INFEASIBLE,
    TREX_OR_UNBOUNDED,
    TREX_OR_TIMELIMIT,
    TREX_OR_NUMERIC, /* solver failure or numerical trouble */
} trex_or_status;
const char *trex_or_status_str(trex_or_status s);

typedef struct trex_or_solution {
    trex_or_status status;
    double obj;
    double *x;      /* ncols; valid when OPTIMAL */
    double *dual;   /* nrows row duals (LP only, GLPK) or NULL */
    double *rcost;  /* ncols reduced costs (LP only, GLPK) or NULL */
    bool basic_unique; /* LP: no non-basic variable with a zero reduced cost (optimum unique) */
    double ms;
} trex_or_solution;

void trex_or_solution_free(trex_or_solution *s);

typedef struct trex_or_solve_opts {
    int tm_lim_ms;   /* per solve; 0 = 2000 */
    double tol_int;  /* 0 = 1e-7 */
    bool want_duals; /* LP: fill dual / rcost and the uniqueness flag */
} trex_or_solve_opts;

/* GLPK: LP by glp_simplex (presolve on; re-run without presolve to classify infeasible vs unbounded),
 * MILP by glp_intopt (tol_int 1e-7, mip_gap 0). Returns non-OK only on a bug-like API failure. */
trex_code trex_or_solve_glpk(const trex_or_model *m, const trex_or_solve_opts *o, trex_or_solution *s,
                             trex_err *err);
/* CBC, built through the C API from the same IR. CBC's LP statuses are not used to tell infeasible from
 * unbounded (OR_PIPELINE 4.4 #8): only OPTIMAL is meaningful for the cross-check. */
trex_code trex_or_solve_cbc(const trex_or_model *m, const trex_or_solve_opts *o, trex_or_solution *s,
                            trex_err *err);
/* Reads LP text with Cbc_readLp and solves it (for round-trip tests): status and objective. */
trex_code trex_or_cbc_read_solve(const char *text, size_t len, trex_or_solution *s, trex_err *err);

/* Solution audit in long double: row feasibility within 1e-7*max(1,|rhs|), bounds, integrality within
 * 1e-6, and the objective recomputed; returns false and a reason when any check fails. */
bool trex_or_audit(const trex_or_model *m, const double *x, double claimed_obj, char *why, size_t why_len);

/* The verification ladder's solver part (5.7 steps 2-4 and 6): GLPK primary, CBC cross-check, glp_exact
 * certification for LPs, audit, fix-integers-and-resolve for MILPs, and uniqueness of the optimum. */
typedef enum trex_or_reject {
    TREX_OR_ACCEPT = 0,
    TREX_OR_REJ_SELF_CHECK,
    TREX_OR_REJ_NOT_OPTIMAL,
    TREX_OR_REJ_TIME_LIMIT,
    TREX_OR_REJ_NUMERIC,
    TREX_OR_REJ_DISAGREE,
    TREX_OR_REJ_AUDIT,
    TREX_OR_REJ_DEGENERATE_ZERO,
    TREX_OR_REJ_NO_BINDING,
    TREX_OR_REJ_DUP_INSTANCE,
    TREX_OR_REJ_NEAR_DUP_TEXT,
    TREX_OR_REJ_DUP_TEXT,
    TREX_OR_REJ_CONTAM,
    TREX_OR_REJ_REPARSE_FAIL,
    TREX_OR_REJ_REPARSE_MISMATCH,
    TREX_OR_REJ_TOO_LONG,
    TREX_OR_REJ_NUMBER_COVERAGE,
    TREX_OR_REJ_LEAK,
    TREX_OR_REJ_DEBRIS,
    TREX_OR_REJ_CONTRACT_MISSING,
    TREX_OR_REJ_ANALYSIS,
    TREX_OR_REJ_COUNT
} trex_or_reject;
const char *trex_or_reject_str(trex_or_reject r);

typedef struct trex_or_verdict {
    trex_or_reject reject;
    trex_or_status status; /* GLPK's classification */
    double obj;            /* GLPK optimum when OPTIMAL */
    double cbc_obj;
    double exact_obj;      /* LP: glp_exact's optimum (rational simplex); NAN for MILPs */
    double lp_relax_obj;   /* MILP: LP relaxation optimum (NAN for LPs) */
    bool unique;           /* the optimal solution is unique (conservative: false when unsure) */
    int binding;           /* binding rows at the optimum */
    double glpk_ms, cbc_ms;
    double *x;             /* ncols, the audited GLPK solution (owned) */
    char why[256];
} trex_or_verdict;

void trex_or_verdict_free(trex_or_verdict *v);
/* expect_feasible: true for a normal instance (anything but OPTIMAL is a rejection); false for an
 * infeasible variant (INFEASIBLE is the accepted outcome, checked with presolve off). */
void trex_or_verify_model(const trex_or_model *m, bool expect_feasible, trex_or_verdict *v);

/* Objective agreement used everywhere: |a - b| <= 1e-6 * max(1, |b|). */
bool trex_or_obj_close(double a, double b);

/* ---- analysis (5.7-7) ---- */
/* LP right-hand-side ranging (glp_analyze_bound): [lo, hi] is the interval of row's right-hand side over
 * which the optimal basis stays primal feasible, i.e. where the row's shadow price is valid (ends may be
 * infinite). The row must be non-basic (binding) at the optimum. */
trex_code trex_or_rhs_range(const trex_or_model *m, int row, double *lo, double *hi, trex_err *err);
/* Checks a ranging claim by re-solving: halfway inside each end the optimum moves by y per unit of
 * right-hand side; just beyond each finite end it does not (or the model turns infeasible). */
bool trex_or_range_holds(const trex_or_model *m, int row, double z, double y, double lo, double hi);
/* Deletion filter over rows: on return iis[0..*n) are row indices of an irreducible infeasible subset
 * (the model must be infeasible). iis has room for m->nrows. */
trex_code trex_or_iis(const trex_or_model *m, int *iis, int *n, trex_err *err);
/* Elastic repair: the least total relaxation of row right-hand sides that makes the model feasible;
 * relax[r] receives the amount by which row r's rhs must move (0 for most rows). */
trex_code trex_or_elastic(const trex_or_model *m, double *total, double *relax, trex_err *err);

/* ---- jobs behind `trex data or-*` ---- */
typedef struct trex_or_gen_opts {
    uint64_t seed;
    int64_t n_sft, n_cpt;
    const char *out_dir;
    int workers;      /* processes; 0 = 2 */
    bool no_system;   /* leave out the system message */
    const char *eval_dir; /* for decontamination; NULL = ../shared/or/eval if present */
    bool quiet;
    /* Restrictions, for small corpora such as the `make demo` one (all off by default; the output of a
     * run without them is unchanged). tasks: comma-separated SFT task names (formulate, code, solve,
     * analyze), the shares of the others renormalised; families: comma-separated family names, for both
     * streams (infeasibility_case documents are left out when none of them admits an infeasible variant);
     * NULL = all. max_chars: an SFT sample whose message contents (system, user, assistant) are longer is
     * rejected as OVER_MAX_CHARS and its slot moves on to its next attempt; 0 = no bound. CPT documents
     * are not bounded (the tokenizer splits them across sequences). */
    const char *tasks, *families;
    int64_t max_chars;
} trex_or_gen_opts;

/* Bad input (TREX_EINVAL): an unknown task or family name, an empty list, max_chars < 0. A slot that no
 * attempt can fill (e.g. max_chars too small for a family) fails the run with TREX_ESOLVER and writes
 * nothing. */
trex_code trex_or_gen(const trex_or_gen_opts *o, trex_err *err);
/* Re-verifies every row of an SFT JSONL file (or a CPT file: lines with "text"). Prints one line per
 * failure and a summary; *n_ok / *n_bad receive counts. */
trex_code trex_or_verify_file(const char *path, int64_t *n_ok, int64_t *n_bad, bool quiet, trex_err *err);
/* Prints DIR/manifest.json as Markdown tables. */
trex_code trex_or_stats(const char *dir, trex_err *err);
/* Runs eval rows (JSONL with reference_lp and answer) through LP read + solve; *n_bad counts rows that
 * fail or are malformed (each reported with its id). */
trex_code trex_or_evalcheck(const char *path, int64_t *n_ok, int64_t *n_bad, bool quiet, trex_err *err);

/* Number of problem families and their names (stable order). */
int trex_or_family_count(void);
const char *trex_or_family_name(int f);

#endif
