/* trex/eval.h — task evaluation of a training run: `trex eval or` scores a run's answers to OR problems
 * with the solver (docs/or.md "Evaluation").
 *
 * A set is JSONL; each line is either a shared eval row (fields id, question, answer, reference_lp) or an
 * SFT row written by `trex data or-gen` (messages + metadata with task, family, objective, status). For
 * each row the prompt is built (eval rows: the question and an instruction asking for one ```lp block and
 * the final line `Optimal objective value: <number>`; or-gen rows: their own system and user messages),
 * the answer is generated with trex_generate (or taken from an answers file), then scored:
 *   - LP: the first ```lp block is read with GLPK's reader and solved with GLPK; correct when the status
 *     is optimal and |z - z*| <= 1e-6 * max(1, |z*|) (trex_or_obj_close, the tolerance of or-evalcheck),
 *     or, for an infeasible reference, when GLPK proves the LP infeasible;
 *   - value: the last line starting with `Optimal objective value:` gives a number compared the same way
 *     (an infeasible reference wants a line containing "infeasible").
 * Categories: "eval" rows score both (two accuracies); or-gen rows: formulate and code score the LP,
 * solve scores the value, analyze scores what its reference answer states (its final value line, its
 * corrected LP), and is counted as unscored when the reference states neither.
 *
 * Errors: a missing run, a run without a checkpoint, an unreadable set and a malformed row (named by
 * line and id) are returned before anything is generated; the per-row results file is written
 * atomically (nothing under its name unless complete). */
#ifndef TREX_EVAL_H
#define TREX_EVAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "trex/status.h"

typedef struct trex_eval_or_opts {
    const char *run;      /* training run directory (NULL only with answers) */
    int64_t step;         /* checkpoint step; -1: the newest */
    const char *set;      /* JSONL problem set */
    const char *answers;  /* JSONL {"id": ..., "output": TEXT}: score these instead of generating; NULL */
    const char *out;      /* per-row results JSONL (NULL: none) */
    int64_t limit;        /* first N rows (0: all) */
    int64_t max_new;      /* tokens per answer */
    double temperature;   /* 0: greedy */
    uint64_t seed;
    int64_t threads;
    int solver_ms;        /* GLPK time limit per answer LP (0: 10000) */
    bool quiet;           /* no progress line per row */
} trex_eval_or_opts;

enum { TREX_EVAL_OR_NCAT = 6 }; /* eval-lp, eval-value, formulate, code, solve, analyze */

typedef struct trex_eval_or_report {
    int64_t rows;
    int64_t step;                          /* checkpoint used (-1 with answers) */
    int64_t n[TREX_EVAL_OR_NCAT];          /* scored rows per category */
    int64_t correct[TREX_EVAL_OR_NCAT];
    int64_t unscored;                      /* analyze rows whose reference states nothing checkable */
    int64_t unparsable;                    /* rows where a wanted LP block or value line is missing or unreadable */
    int64_t solver_failures;               /* answer LPs GLPK could not solve (numerical failure) */
    int64_t timeouts;                      /* answer LPs that hit the solver time limit */
    int64_t truncated;                     /* generations that reached max_new without end of sentence */
} trex_eval_or_report;

/* Name of category c (0 <= c < TREX_EVAL_OR_NCAT). */
const char *trex_eval_or_category(int c);

/* Runs the evaluation; log (may be NULL) receives a progress line per row unless quiet. */
trex_code trex_eval_or(const trex_eval_or_opts *o, trex_eval_or_report *rep, FILE *log, trex_err *err);

/* The report as a small table: per category rows, correct and accuracy, then the failure counts. */
void trex_eval_or_report_print(const trex_eval_or_report *r, FILE *out);

#endif
