/* tools/trex/opts.c — table-driven option parsing and --help for every subcommand. */
#include "opts.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void trex_opts_usage(const trex_opt *opts, const trex_cmd_info *info, FILE *out)
{
    fprintf(out, "usage: %s\n", info->usage);
    if (info->summary)
        fprintf(out, "\n%s\n", info->summary);
    if (opts && opts[0].name)
        fprintf(out, "\noptions:\n");
    for (const trex_opt *o = opts; o && o->name; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
        fprintf(out, "  %-26s %s", left, o->help);
        if (o->required)
            fprintf(out, " (required)");
        else if (o->type == TREX_OPT_I64)
            fprintf(out, " [%lld]", (long long)*(int64_t *)o->dst);
        else if (o->type == TREX_OPT_F64)
            fprintf(out, " [%g]", *(double *)o->dst);
        else if (o->type == TREX_OPT_STR && *(const char **)o->dst)
            fprintf(out, " [%s]", *(const char **)o->dst);
        fputc('\n', out);
    }
    fprintf(out, "  %-26s %s\n", "-h, --help", "show this help");
}

static int fail(const trex_opt *opts, const trex_cmd_info *info, const char *fmt, const char *a)
{
    fprintf(stderr, "trex: error: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n\n");
    trex_opts_usage(opts, info, stderr);
    return TREX_OPTS_ERROR;
}

static bool parse_i64(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return false;
    *out = v;
    return true;
}

static bool parse_f64(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

int trex_opts_parse(const trex_opt *opts, int argc, char **argv, trex_cmd_info *info)
{
    size_t nopts = 0;
    while (opts && opts[nopts].name)
        nopts++;
    bool seen[64] = {0};
    if (nopts > 64)
        return fail(opts, info, "%s: option table too long", info->usage);
    info->npositional = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            trex_opts_usage(opts, info, stdout);
            return TREX_OPTS_HELP;
        }
        if (strncmp(arg, "--", 2) != 0) {
            if (info->npositional >= info->max_positional || info->npositional >= 16)
                return fail(opts, info, "unexpected argument '%s'", arg);
            info->positional[info->npositional++] = arg;
            continue;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const trex_opt *o = NULL;
        size_t k;
        for (k = 0; k < nopts; k++)
            if (strlen(opts[k].name) == nlen && !strncmp(opts[k].name, name, nlen)) {
                o = &opts[k];
                break;
            }
        if (!o)
            return fail(opts, info, "unknown option '%s'", arg);
        seen[k] = true;
        if (o->type == TREX_OPT_FLAG) {
            if (eq)
                return fail(opts, info, "option '%s' takes no value", arg);
            *(bool *)o->dst = true;
            continue;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (i + 1 >= argc)
                return fail(opts, info, "option '%s' needs a value", arg);
            val = argv[++i];
        }
        switch (o->type) {
        case TREX_OPT_STR:
            *(const char **)o->dst = val;
            break;
        case TREX_OPT_I64:
            if (!parse_i64(val, (int64_t *)o->dst))
                return fail(opts, info, "option '%s' needs a whole number", arg);
            break;
        case TREX_OPT_F64:
            if (!parse_f64(val, (double *)o->dst))
                return fail(opts, info, "option '%s' needs a finite number", arg);
            break;
        case TREX_OPT_FLAG:
            break;
        }
    }
    for (size_t k = 0; k < nopts; k++)
        if (opts[k].required && !seen[k])
            return fail(opts, info, "missing required option --%s", opts[k].name);
    return TREX_OPTS_OK;
}

static void subcmd_usage(FILE *out, const char *prog, const char *about, const trex_subcmd *subs,
                         size_t n, const char *word)
{
    fprintf(out, "usage: %s <%s> [options]\n\n", prog, word);
    if (about)
        fprintf(out, "%s\n\n", about);
    fprintf(out, "%ss:\n", word);
    int width = 0;
    for (size_t i = 0; i < n; i++)
        if ((int)strlen(subs[i].name) > width)
            width = (int)strlen(subs[i].name);
    for (size_t i = 0; i < n; i++)
        fprintf(out, "  %-*s  %s\n", width, subs[i].name, subs[i].summary);
    fprintf(out, "\n`%s <%s> --help` explains each one.\n", prog, word);
}

int trex_subcmd_dispatch(const char *prog, const char *about, const trex_subcmd *subs, size_t n,
                         int argc, char **argv)
{
    /* "trex" takes commands; "trex model", "trex data", ... take subcommands. */
    const char *word = strchr(prog, ' ') ? "subcommand" : "command";
    if (argc < 2) {
        subcmd_usage(stderr, prog, about, subs, n, word);
        return TREX_OPTS_ERROR;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        subcmd_usage(stdout, prog, about, subs, n, word);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (!strcmp(argv[1], subs[i].name))
            return subs[i].run(argc - 1, argv + 1);
    const char *sp = strchr(prog, ' '); /* "trex model" -> "model frobnicate" */
    if (sp)
        fprintf(stderr, "trex: error: unknown %s '%s %s'\n\n", word, sp + 1, argv[1]);
    else
        fprintf(stderr, "trex: error: unknown %s '%s'\n\n", word, argv[1]);
    subcmd_usage(stderr, prog, about, subs, n, word);
    return TREX_OPTS_ERROR;
}
