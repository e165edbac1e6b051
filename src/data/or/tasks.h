/* data/or/tasks.h — SFT task builders (FORMULATE, CODE, SOLVE, ANALYZE) and CPT document builders
 * (not exported). Each builder is a pure function of (seed, slot, attempt): it draws an instance, runs
 * the verification ladder, renders, re-parses its own answer from the exact text and re-solves it. */
#ifndef TREX_DATA_OR_TASKS_H
#define TREX_DATA_OR_TASKS_H

#include "render.h"

enum { OR_TASK_FORMULATE, OR_TASK_CODE, OR_TASK_SOLVE, OR_TASK_ANALYZE, OR_NTASK };
enum { OR_DOC_REPORT, OR_DOC_RATIONALE, OR_DOC_WALKTHROUGH, OR_DOC_INFEASIBLE, OR_NDOC };
extern const char *const or_task_names[OR_NTASK];
extern const char *const or_doc_names[OR_NDOC];
extern const double or_task_share[OR_NTASK];
extern const double or_doc_share[OR_NDOC];

#define OR_GEN_VERSION "0.1.0"

typedef struct or_result {
    trex_or_reject reject;
    char why[256];
    char *line;       /* the JSONL record, no newline (owned) */
    char *dedup_text; /* SFT: the user message; CPT: the document text (owned) */
    uint64_t canon;   /* structural hash of the instance */
    int family, task, rep, tier;
    bool mip, unique, infeasible, maxsense;
    double int_gap; /* NAN when not a MILP */
    int n_vars, n_rows;
    int64_t nnz;
    double glpk_ms, cbc_ms;
    int64_t user_len, asst_len;
    const char *skin;
    char analysis_kind[24];
} or_result;

void or_result_free(or_result *r);
void or_make_sft(uint64_t seed, int64_t slot, int attempt, int task, int family, bool no_system, or_result *res);
void or_make_cpt(uint64_t seed, int64_t slot, int attempt, int doc, int family, or_result *res);

/* Shared by the generator and the verifier: removes the rows named in names (comma-free list). */
void or_drop_rows(trex_or_model *m, const char *const *names, int n);

#endif
