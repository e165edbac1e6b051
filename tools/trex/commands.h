/* tools/trex/commands.h — the subcommands of the trex program. Each takes argv with argv[0] = its
 * own name and returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef TREX_TOOLS_COMMANDS_H
#define TREX_TOOLS_COMMANDS_H

int trex_cmd_model(int argc, char **argv);  /* model info | init | run   (cmd_model.c) */
int trex_cmd_model_run(int argc, char **argv); /* model run (cmd_model_run.c) */
int trex_cmd_data(int argc, char **argv);   /* data or-gen | or-verify | ... (cmd_data.c) */
int trex_cmd_plan(int argc, char **argv);   /* plan                      (cmd_plan.c) */

/* Prints `trex: error: <msg>` to stderr; returns 1 for `return trex_cli_error(...)`. */
int trex_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
