/* tools/trex/main.c — the trex program: one binary, one subcommand per job. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"model", trex_cmd_model, "inspect, initialise and run a DeepSeek-V4 model (info, init, run)"},
    {"data", trex_cmd_data, "build training data: tokenizer, token shards, solver-verified OR problems"},
    {"train", trex_cmd_train, "train a DeepSeek-V4 model on token shards (CPT/SFT), with checkpoints and resume"},
    {"generate", trex_cmd_generate, "answer a chat prompt with a training run's checkpoint"},
    {"eval", trex_cmd_eval, "score a run's answers to OR problems with the solver (eval or)"},
    {"plan", trex_cmd_plan, "predict memory, step time and MFU of parallel layouts on a cluster"},
    {"bench", trex_cmd_bench, "measure the machine and the kernels (peak, kernels)"},
};

int trex_cli_error(const char *fmt, ...)
{
    va_list ap;
    fputs("trex: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: trex <command> [options]\n\n"
                 "Full-parameter post-training of DeepSeek-V4-family MoE models.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`trex <command> --help` explains each one.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "trex: error: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
