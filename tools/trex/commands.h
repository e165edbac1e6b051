/* tools/trex/commands.h — the subcommands of the trex program. Each takes argv with argv[0] = its
 * own name and returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef TREX_TOOLS_COMMANDS_H
#define TREX_TOOLS_COMMANDS_H

#include <stddef.h>

int trex_cmd_model(int argc, char **argv);  /* model info | init | run   (cmd_model.c) */
int trex_cmd_model_run(int argc, char **argv); /* model run (cmd_model_run.c) */
int trex_cmd_data(int argc, char **argv);   /* data or-gen | or-verify | ... (cmd_data.c) */
int trex_cmd_train(int argc, char **argv);  /* train                     (cmd_train.c) */
int trex_cmd_generate(int argc, char **argv); /* generate               (cmd_generate.c) */
int trex_cmd_eval(int argc, char **argv);     /* eval or                   (cmd_eval.c) */
int trex_cmd_plan(int argc, char **argv);   /* plan                      (cmd_plan.c) */
int trex_cmd_bench(int argc, char **argv);  /* bench peak | kernels | ... (cmd_bench.c) */
int trex_cmd_bench_step(int argc, char **argv); /* bench step              (cmd_bench_step.c) */
int trex_cmd_bench_fused(int argc, char **argv); /* bench fused            (cmd_bench_fused.c) */

/* Shared by the bench commands (cmd_bench.c): the median of v[0..n) (v is sorted in place); today's UTC
 * date as YYYY-MM-DD; memcpy bandwidth (bytes read + written per second, GB/s) over two 256 MiB buffers
 * on `threads` pool threads, the median of reps runs. */
struct trex_pool;
double trex_bench_median(double *v, int n);
void trex_bench_today(char *buf, size_t size);
double trex_bench_copy_gbs(struct trex_pool *pool, int threads, int reps);

/* Prints `trex: error: <msg>` to stderr; returns 1 for `return trex_cli_error(...)`. */
int trex_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
