/* tools/trex/cmd_generate.c — `trex generate`: answer a chat prompt with a training run's checkpoint. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "opts.h"
#include "trex/train.h"

int trex_cmd_generate(int argc, char **argv)
{
    const char *run = NULL, *prompt = NULL, *system = NULL, *mode = "chat", *attention = NULL;
    int64_t step = -1, max_new = 64, seed = 1, top_k = 0, threads = 0;
    double temperature = 0.0;
    bool echo = false;
    const trex_opt opts[] = {
        {"run", TREX_OPT_STR, &run, "RUN", "training run directory (trex train --out RUN)", true},
        {"prompt", TREX_OPT_STR, &prompt, "TEXT", "the user message", true},
        {"step", TREX_OPT_I64, &step, "N", "checkpoint RUN/step-N (-1: the newest)", false},
        {"system", TREX_OPT_STR, &system, "TEXT", "a system message before the prompt", false},
        {"mode", TREX_OPT_STR, &mode, "chat|think|open", "prompt ends with <｜Assistant｜></think>, <think>, or nothing",
         false},
        {"temperature", TREX_OPT_F64, &temperature, "T", "sampling temperature (0: greedy)", false},
        {"top-k", TREX_OPT_I64, &top_k, "K", "sample among the K most likely tokens (0: all)", false},
        {"max-new", TREX_OPT_I64, &max_new, "N", "new tokens at most (stops earlier at end of sentence)", false},
        {"seed", TREX_OPT_I64, &seed, "S", "sampling seed", false},
        {"attention", TREX_OPT_STR, &attention, "sparse|dense", "CSA attention mode [the run's]", false},
        {"threads", TREX_OPT_I64, &threads, "N", "threads (0: TREX_THREADS or every core)", false},
        {"echo", TREX_OPT_FLAG, &echo, NULL, "print the rendered prompt before the answer", false},
        {0}};
    trex_cmd_info info = {
        .usage = "trex generate --run RUN [--step N] --prompt TEXT [--temperature T --max-new N --seed S]",
        .summary = "Renders the prompt with the DeepSeek-V4 chat template and the run's tokenizer, then generates "
                   "the answer token by token from the run's checkpoint (a whole forward pass per token), printing "
                   "it as it grows. Temperature 0 is greedy."};
    int prc = trex_opts_parse(opts, argc, argv, &info);
    if (prc != TREX_OPTS_OK)
        return prc == TREX_OPTS_HELP ? 0 : 2;
    trex_generate_opts o = {.run = run,
                            .step = step,
                            .system = system,
                            .prompt = prompt,
                            .temperature = temperature,
                            .top_k = top_k,
                            .max_new = max_new,
                            .seed = (uint64_t)seed,
                            .threads = threads,
                            .attention = -1,
                            .echo_prompt = echo};
    if (!strcmp(mode, "open"))
        o.mode = 0;
    else if (!strcmp(mode, "chat"))
        o.mode = 1;
    else if (!strcmp(mode, "think"))
        o.mode = 2;
    else
        return trex_cli_error("--mode '%s': use chat, think or open", mode);
    if (attention) {
        if (!strcmp(attention, "sparse"))
            o.attention = 1;
        else if (!strcmp(attention, "dense"))
            o.attention = 0;
        else
            return trex_cli_error("--attention '%s': use sparse or dense", attention);
    }
    if (step < -1)
        return trex_cli_error("--step %" PRId64 ": give a checkpoint step >= 0, or -1 for the newest", step);
    if (seed < 0)
        return trex_cli_error("--seed %" PRId64 " must be >= 0", seed);
    if (threads < 0)
        return trex_cli_error("--threads %" PRId64 " must be >= 0", threads);
    trex_generate_result res;
    trex_err err = {0};
    trex_code rc = trex_generate(&o, stdout, &res, &err);
    if (rc != TREX_OK)
        return trex_cli_error("%s", err.msg);
    fprintf(stderr, "trex generate: %s/step-%" PRId64 ": %" PRId64 " prompt tokens, %" PRId64 " new tokens%s, %.1f s\n",
            run, res.step, res.prompt_tokens, res.new_tokens, res.stopped_at_eos ? " (stopped at end of sentence)" : "",
            res.seconds);
    return 0;
}
