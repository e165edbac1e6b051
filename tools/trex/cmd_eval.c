/* tools/trex/cmd_eval.c — `trex eval or`: score a training run's answers to OR problems with the solver. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "opts.h"
#include "trex/eval.h"

static int eval_or(int argc, char **argv)
{
    const char *run = NULL, *set = NULL, *out = NULL, *answers = NULL;
    int64_t step = -1, limit = 0, max_new = 256, seed = 1, threads = 0, solver_ms = 10000;
    double temperature = 0.0;
    bool quiet = false;
    const trex_opt opts[] = {
        {"run", TREX_OPT_STR, &run, "RUN", "training run directory (trex train --out RUN)", false},
        {"set", TREX_OPT_STR, &set, "FILE", "problems: shared eval rows or or-gen sft.jsonl rows (JSONL)", true},
        {"step", TREX_OPT_I64, &step, "N", "checkpoint RUN/step-N (-1: the newest)", false},
        {"limit", TREX_OPT_I64, &limit, "N", "evaluate the first N rows (0: all)", false},
        {"max-new", TREX_OPT_I64, &max_new, "N", "new tokens per answer at most", false},
        {"temperature", TREX_OPT_F64, &temperature, "T", "sampling temperature (0: greedy)", false},
        {"seed", TREX_OPT_I64, &seed, "S", "sampling seed", false},
        {"threads", TREX_OPT_I64, &threads, "N", "threads (0: TREX_THREADS or every core)", false},
        {"solver-ms", TREX_OPT_I64, &solver_ms, "MS", "GLPK time limit per answer LP, milliseconds", false},
        {"answers", TREX_OPT_STR, &answers, "FILE",
         "score these answers (JSONL: id, output) instead of generating; --run is then not needed", false},
        {"out", TREX_OPT_STR, &out, "FILE", "per-row results (JSONL, written atomically)", false},
        {"quiet", TREX_OPT_FLAG, &quiet, NULL, "no progress line per row", false},
        {0}};
    trex_cmd_info info = {
        .usage = "trex eval or --run RUN [--step N] --set FILE [--limit N] [--max-new N] [--temperature T --seed S] "
                 "[--out RESULTS.jsonl]",
        .summary = "Generates an answer to each problem of FILE with the run's checkpoint, extracts its ```lp block "
                   "(solved with GLPK, optimum compared with the reference within 1e-6 relative) and its final "
                   "`Optimal objective value:` line, and reports accuracy per category with counts of unparsable "
                   "answers, solver failures and time-outs."};
    int prc = trex_opts_parse(opts, argc, argv, &info);
    if (prc != TREX_OPTS_OK)
        return prc == TREX_OPTS_HELP ? 0 : 2;
    if (!run && !answers)
        return trex_cli_error("eval or: give --run RUN (or --answers FILE to score given answers)");
    if (step < -1)
        return trex_cli_error("--step %" PRId64 ": give a checkpoint step >= 0, or -1 for the newest", step);
    if (limit < 0 || seed < 0 || threads < 0)
        return trex_cli_error("--limit, --seed and --threads must be >= 0");
    if (max_new < 1 || max_new > (1 << 20))
        return trex_cli_error("--max-new %" PRId64 " must be in [1, 2^20]", max_new);
    if (solver_ms < 1 || solver_ms > 3600000)
        return trex_cli_error("--solver-ms %" PRId64 " must be in [1, 3600000]", solver_ms);
    if (!(temperature >= 0))
        return trex_cli_error("--temperature %g must be >= 0 (0: greedy)", temperature);
    printf("trex eval or: set=%s run=%s step=%" PRId64 " limit=%" PRId64 " max_new=%" PRId64
           " temperature=%g seed=%" PRId64 " solver_ms=%" PRId64 " answers=%s out=%s\n",
           set, run ? run : "-", step, limit, max_new, temperature, seed, solver_ms, answers ? answers : "-",
           out ? out : "-");
    fflush(stdout);
    trex_eval_or_opts o = {.run = run,
                           .step = step,
                           .set = set,
                           .answers = answers,
                           .out = out,
                           .limit = limit,
                           .max_new = max_new,
                           .temperature = temperature,
                           .seed = (uint64_t)seed,
                           .threads = threads,
                           .solver_ms = (int)solver_ms,
                           .quiet = quiet};
    trex_eval_or_report rep;
    trex_err err = {0};
    trex_code rc = trex_eval_or(&o, &rep, stderr, &err);
    if (rc != TREX_OK)
        return trex_cli_error("eval or: %s", err.msg);
    if (rep.step >= 0)
        printf("trex eval or: %s/step-%" PRId64 ", %" PRId64 " rows\n", run, rep.step, rep.rows);
    else
        printf("trex eval or: answers %s, %" PRId64 " rows\n", answers, rep.rows);
    trex_eval_or_report_print(&rep, stdout);
    return 0;
}

int trex_cmd_eval(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "or"))
        return eval_or(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: trex eval or [options]\n\n  or   score a run's answers to OR problems with the solver\n");
        return 0;
    }
    fprintf(stderr, "usage: trex eval or [options]   (`trex eval or --help` explains it)\n");
    return 2;
}
