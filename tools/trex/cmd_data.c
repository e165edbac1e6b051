/* tools/trex/cmd_data.c — `trex data <sub>`: one table row per subcommand, each with its own option
 * table. New subcommands (the tokenizer ones) are added as rows of `subs[]`. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cmd_data_tok.h"
#include "commands.h"
#include "opts.h"
#include "trex/or.h"

static int parse(const trex_opt *opts, int argc, char **argv, trex_cmd_info *info)
{
    int rc = trex_opts_parse(opts, argc, argv, info);
    return rc == TREX_OPTS_OK ? -1 : rc == TREX_OPTS_HELP ? 0 : 2;
}

static int or_gen(int argc, char **argv)
{
    int64_t seed = 1, sft = 0, cpt = 0, workers = 2, max_chars = 0;
    const char *out = NULL, *eval = NULL, *tasks = NULL, *families = NULL;
    bool no_system = false, quiet = false;
    const trex_opt opts[] = {
        {"seed", TREX_OPT_I64, &seed, "S", "global seed (output bytes are a function of it)", false},
        {"sft", TREX_OPT_I64, &sft, "N", "number of SFT samples", false},
        {"cpt", TREX_OPT_I64, &cpt, "M", "number of CPT documents", false},
        {"out", TREX_OPT_STR, &out, "DIR", "output folder (sft.jsonl, cpt.jsonl, manifest.json)", true},
        {"workers", TREX_OPT_I64, &workers, "N", "worker processes (does not change the output)", false},
        {"eval-dir", TREX_OPT_STR, &eval, "DIR", "eval sets to decontaminate against [../shared/or/eval]", false},
        {"tasks", TREX_OPT_STR, &tasks, "LIST",
         "SFT tasks to make, comma-separated, from formulate,code,solve,analyze (shares renormalised) [all]", false},
        {"families", TREX_OPT_STR, &families, "LIST",
         "problem families to use, comma-separated (names as in the manifest; both streams) [all]", false},
        {"max-chars", TREX_OPT_I64, &max_chars, "N",
         "reject SFT samples whose messages exceed N characters (OVER_MAX_CHARS; the slot tries its next "
         "instance); CPT documents are not bounded; 0: no bound", false},
        {"no-system", TREX_OPT_FLAG, &no_system, NULL, "leave out the system message", false},
        {"quiet", TREX_OPT_FLAG, &quiet, NULL, "no progress lines", false},
        {0}};
    trex_cmd_info info = {.usage = "trex data or-gen --out DIR [--seed S] [--sft N] [--cpt M] [options]",
                          .summary = "Generates solver-verified OR problems and renders SFT samples (formulate, "
                                     "code, solve, analyze) and CPT documents."};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    if (sft < 0 || cpt < 0 || sft + cpt == 0 || workers < 1 || workers > 64 || seed < 0 || max_chars < 0)
        return trex_cli_error("or-gen: need --sft N and/or --cpt M >= 0 (not both 0), 1 <= --workers <= 64, "
                              "--seed >= 0, --max-chars >= 0");
    trex_or_gen_opts o = {.seed = (uint64_t)seed, .n_sft = sft, .n_cpt = cpt, .out_dir = out,
                          .workers = (int)workers, .no_system = no_system, .eval_dir = eval, .quiet = quiet,
                          .tasks = tasks, .families = families, .max_chars = max_chars};
    if (!quiet)
        fprintf(stderr, "trex data or-gen: seed=%lld sft=%lld cpt=%lld workers=%lld tasks=%s families=%s "
                        "max_chars=%lld out=%s\n", (long long)seed, (long long)sft, (long long)cpt,
                (long long)workers, tasks ? tasks : "all", families ? families : "all", (long long)max_chars, out);
    trex_err err = {0};
    if (trex_or_gen(&o, &err) != TREX_OK)
        return trex_cli_error("or-gen: %s", err.msg);
    return 0;
}

static int or_verify(int argc, char **argv)
{
    bool quiet = false;
    const trex_opt opts[] = {{"quiet", TREX_OPT_FLAG, &quiet, NULL, "print failures only", false}, {0}};
    trex_cmd_info info = {.usage = "trex data or-verify FILE...",
                          .summary = "Re-verifies every sample of or-gen output (SFT or CPT JSONL) from its text "
                                     "alone: parses each LP, re-solves with GLPK and CBC, checks every claim.",
                          .max_positional = 16};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    if (info.npositional == 0)
        return trex_cli_error("or-verify: give at least one JSONL file");
    int64_t tok = 0, tbad = 0;
    for (int k = 0; k < info.npositional; k++) {
        int64_t ok = 0, bad = 0;
        trex_err err = {0};
        if (trex_or_verify_file(info.positional[k], &ok, &bad, quiet, &err) != TREX_OK)
            return trex_cli_error("or-verify: %s", err.msg);
        printf("%s: %lld verified, %lld rejected\n", info.positional[k], (long long)ok, (long long)bad);
        tok += ok;
        tbad += bad;
    }
    printf("or-verify: %lld passed, %lld failed\n", (long long)tok, (long long)tbad);
    return tbad ? 1 : 0;
}

static int or_stats(int argc, char **argv)
{
    trex_cmd_info info = {.usage = "trex data or-stats DIR",
                          .summary = "Prints DIR/manifest.json (written by or-gen) as Markdown tables.",
                          .max_positional = 1};
    const trex_opt opts[] = {{0}};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    if (info.npositional != 1)
        return trex_cli_error("or-stats: give the or-gen output folder");
    trex_err err = {0};
    if (trex_or_stats(info.positional[0], &err) != TREX_OK)
        return trex_cli_error("or-stats: %s", err.msg);
    return 0;
}

static int or_evalcheck(int argc, char **argv)
{
    bool quiet = false;
    const trex_opt opts[] = {{"quiet", TREX_OPT_FLAG, &quiet, NULL, "print failures only", false}, {0}};
    trex_cmd_info info = {.usage = "trex data or-evalcheck FILE...",
                          .summary = "Parses each eval row's reference LP, solves it with GLPK (cross-checked "
                                     "with CBC) and compares with its answer. Exit 0 only if every row passes.",
                          .max_positional = 16};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    if (info.npositional == 0)
        return trex_cli_error("or-evalcheck: give at least one eval JSONL file");
    int64_t tok = 0, tbad = 0;
    for (int k = 0; k < info.npositional; k++) {
        int64_t ok = 0, bad = 0;
        trex_err err = {0};
        if (trex_or_evalcheck(info.positional[k], &ok, &bad, quiet, &err) != TREX_OK)
            return trex_cli_error("or-evalcheck: %s", err.msg);
        printf("%s: %lld passed, %lld failed\n", info.positional[k], (long long)ok, (long long)bad);
        tok += ok;
        tbad += bad;
    }
    printf("or-evalcheck: %lld passed, %lld failed\n", (long long)tok, (long long)tbad);
    return tbad ? 1 : 0;
}

static const trex_subcmd subs[] = {
    {"or-gen", or_gen, "generate solver-verified OR SFT samples and CPT documents"},
    {"or-verify", or_verify, "re-verify every sample of an or-gen output file"},
    {"or-stats", or_stats, "print an or-gen manifest as Markdown tables"},
    {"or-evalcheck", or_evalcheck, "solve each eval row's reference LP and compare with its answer"},
    {"train-tokenizer", trex_cmd_data_train_tokenizer, "train a byte-level BPE tokenizer.json (DeepSeek-V4 specials)"},
    {"tokenize", trex_cmd_data_tokenize, "tokenize CPT/SFT JSONL and pack it into token shards"},
    {"encode", trex_cmd_data_encode, "print the token ids of texts"},
    {"decode", trex_cmd_data_decode, "print token ids decoded to text"},
    {"shard-info", trex_cmd_data_shard_info, "check a shard folder and print its header or sequences"},
};


int trex_cmd_data(int argc, char **argv)
{
    return trex_subcmd_dispatch("trex data", "Training data: tokenizer, token shards, solver-verified OR problems.", subs, sizeof subs / sizeof subs[0], argc, argv);
}
