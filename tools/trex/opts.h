/* tools/trex/opts.h — one option table per subcommand drives both parsing and --help.
 *
 *   static const char *config = NULL; static int64_t seed = 0; static bool backward = false;
 *   static const trex_opt opts[] = {
 *       {"config", TREX_OPT_STR, &config, "FILE", "model config.json (required)", true},
 *       {"seed", TREX_OPT_I64, &seed, "S", "random seed", false},
 *       {"backward", TREX_OPT_FLAG, &backward, NULL, "also run the backward pass", false},
 *       {0}};
 *   int rc = trex_opts_parse(opts, argc, argv, &cmd);   // argv[0] is the subcommand name
 *   if (rc != TREX_OPTS_OK) return rc == TREX_OPTS_HELP ? 0 : 2;
 *
 * Options are `--name value` or `--name=value`; numbers are parsed with full checks (no atoi); a
 * missing required option, an unknown option or a bad number prints `trex: error: ...` and the usage. */
#ifndef TREX_TOOLS_OPTS_H
#define TREX_TOOLS_OPTS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum trex_opt_type {
    TREX_OPT_STR,  /* const char ** */
    TREX_OPT_I64,  /* int64_t * */
    TREX_OPT_F64,  /* double * */
    TREX_OPT_FLAG, /* bool *: present = true */
} trex_opt_type;

typedef struct trex_opt {
    const char *name;   /* without the leading -- */
    trex_opt_type type;
    void *dst;          /* receives the value; holds the default beforehand */
    const char *metavar;
    const char *help;
    bool required;
} trex_opt;

typedef struct trex_cmd_info {
    const char *usage;       /* e.g. "trex model run [options]" */
    const char *summary;     /* one paragraph printed by --help */
    int npositional;         /* positional arguments found (stored in positional[]) */
    const char *positional[16];
    int max_positional;      /* how many are allowed (0: none) */
} trex_cmd_info;

enum { TREX_OPTS_OK = 0, TREX_OPTS_HELP = 1, TREX_OPTS_ERROR = 2 };

/* Parses argv[1..argc) against the table. Prints help (and returns TREX_OPTS_HELP) for -h/--help. */
int trex_opts_parse(const trex_opt *opts, int argc, char **argv, trex_cmd_info *info);
void trex_opts_usage(const trex_opt *opts, const trex_cmd_info *info, FILE *out);

/* A table of (sub)commands: `trex <name>` or `trex model <name>`, say. */
typedef struct trex_subcmd {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand's name */
    const char *summary;
} trex_subcmd;

/* Runs the entry named by argv[1] with argv shifted by one. With no argument, or -h/--help/help,
 * prints `usage: <prog> <command> [options]`, `about` (may be NULL) and the table. An unknown name
 * is an error that shows the table. Returns the entry's exit status, or 0/2 for help/usage. */
int trex_subcmd_dispatch(const char *prog, const char *about, const trex_subcmd *subs, size_t n,
                         int argc, char **argv);

#endif
