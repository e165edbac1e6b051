/* tools/trex/main.c — the trex program: one binary, one subcommand per job. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "opts.h"

static const trex_subcmd commands[] = {
    {"model", trex_cmd_model, "inspect, initialise and run a DeepSeek-V4 model (info, init, run)"},
    {"data", trex_cmd_data, "build training data: tokenizer, token shards, solver-verified OR problems"},
    {"train", trex_cmd_train, "train a DeepSeek-V4 model on token shards (CPT/SFT), with checkpoints and resume"},
    {"generate", trex_cmd_generate, "answer a chat prompt with a training run's checkpoint"},
    {"eval", trex_cmd_eval, "score a run's answers to OR problems with the solver (eval or)"},
    {"plan", trex_cmd_plan, "predict memory, step time and MFU of parallel layouts on a cluster"},
    {"bench", trex_cmd_bench, "measure the machine, the kernels and training steps (peak, kernels, fused, step)"},
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


int main(int argc, char **argv)
{
    return trex_subcmd_dispatch("trex", "Full-parameter post-training of DeepSeek-V4-family MoE models.", commands,
                                sizeof commands / sizeof commands[0], argc, argv);
}
