/* tools/trex/cmd_train.c — `trex train`: CPT/SFT of a DeepSeek-V4 model on token shards.
 *
 * Settings come, in this order, from the defaults, the run being resumed (--resume RUN: its
 * settings.json), a JSON run file (--run-file F) and the flags; each later source overrides the
 * earlier ones field by field. Every flag is parsed by the library's field table
 * (trex_train_settings_set), so a flag and the JSON field of the same name behave the same. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "opts.h"
#include "trex/io.h"
#include "trex/train.h"

#define MAX_FAULT_STEPS 64

/* TREX_FAULT_NAN_STEPS="3,4,5" and TREX_FAULT_KILL_AFTER_STEP=N: fault injection for tests. */
static int read_faults(trex_train_faults *f, int64_t *steps)
{
    memset(f, 0, sizeof *f);
    const char *nan = getenv("TREX_FAULT_NAN_STEPS");
    if (nan && *nan) {
        const char *p = nan;
        while (*p) {
            char *end;
            errno = 0;
            long long v = strtoll(p, &end, 10);
            if (errno || end == p || v < 1 || f->n_nan_steps >= MAX_FAULT_STEPS || (*end && *end != ','))
                return trex_cli_error("TREX_FAULT_NAN_STEPS='%s': give up to %d step numbers >= 1, separated by commas",
                                      nan, MAX_FAULT_STEPS);
            steps[f->n_nan_steps++] = v;
            p = *end ? end + 1 : end;
        }
        f->nan_steps = steps;
    }
    const char *kill = getenv("TREX_FAULT_KILL_AFTER_STEP");
    if (kill && *kill) {
        char *end;
        errno = 0;
        long long v = strtoll(kill, &end, 10);
        if (errno || end == kill || *end || v < 1)
            return trex_cli_error("TREX_FAULT_KILL_AFTER_STEP='%s': give a step number >= 1", kill);
        f->kill_after_step = v;
    }
    if (f->n_nan_steps || f->kill_after_step)
        fprintf(stderr, "trex train: FAULT INJECTION active (TREX_FAULT_NAN_STEPS=%s TREX_FAULT_KILL_AFTER_STEP=%s)\n",
                nan ? nan : "", kill ? kill : "");
    return 0;
}

/* The flags that set a settings field: name (JSON, '_') -> --flag ('-'). */
typedef struct flag {
    const char *field;
    const char *metavar;
    const char *help;
    const char *value; /* what was given, NULL when absent */
} flag;

int trex_cmd_train(int argc, char **argv)
{
    flag fl[] = {
        {"config", "FILE", "model config.json (its vocab_size >= the tokenizer's)", NULL},
        {"data", "DIR", "token shards (trex data tokenize --out DIR)", NULL},
        {"tokenizer", "FILE", "tokenizer.json the shards were made with (copied into RUN)", NULL},
        {"out", "RUN", "run directory to create (settings, metrics, checkpoints)", NULL},
        {"init", "W", "initial weights (safetensors) [initialise from --seed]", NULL},
        {"eval_data", "DIR", "held-out shards, evaluated every --eval-every steps and at the end", NULL},
        {"steps", "N", "optimizer steps [100]", NULL},
        {"seq", "N", "tokens per sequence; must equal the shards' [theirs]", NULL},
        {"gbs", "N", "global batch: sequences per step [8]", NULL},
        {"mbs", "N", "micro-batch: sequences per forward/backward; gbs/mbs micro-batches per step [1]", NULL},
        {"data_order", "shuffle|sequential", "a seeded permutation per epoch, or file order [shuffle]", NULL},
        {"optimizer", "adamw|muon", "AdamW everywhere, or Muon for matrices (Newton-Schulz precision: --muon-ns) [adamw]",
         NULL},
        {"lr", "X", "peak learning rate [3e-4]", NULL},
        {"min_lr", "X", "learning rate at the end of the cosine decay [3e-5]", NULL},
        {"warmup", "N", "linear warmup steps [0]", NULL},
        {"schedule", "cosine|constant", "after the warmup [cosine]", NULL},
        {"weight_decay", "X", "decoupled weight decay of matrices [0.1]", NULL},
        {"clip", "X", "global gradient-norm clip, 0 = off [1]", NULL},
        {"beta1", "X", "AdamW beta1 [0.9]", NULL},
        {"beta2", "X", "AdamW beta2 [0.95]", NULL},
        {"eps", "X", "AdamW epsilon [1e-20]", NULL},
        {"mtp_weight", "X", "MTP loss weight before the switch [0.3]", NULL},
        {"mtp_weight_late", "X", "MTP loss weight from the switch on [0.1]", NULL},
        {"mtp_switch", "N", "optimizer step of the MTP weight switch, -1 = when the lr decay starts [-1]", NULL},
        {"balance_weight", "X", "sequence-wise balance loss weight alpha [1e-4]", NULL},
        {"bias_update_speed", "X", "aux-loss-free bias update speed gamma [1e-3]", NULL},
        {"indexer_weight", "X", "indexer KL loss weight [1]", NULL},
        {"indexer_warmup", "N", "first N steps: dense attention, only the indexer trains [0]", NULL},
        {"attention", "sparse|dense", "CSA attention after the indexer warm-up [sparse]", NULL},
        {"eval_every", "N", "steps between evaluations, 0 = at the end only [0]", NULL},
        {"eval_batches", "N", "micro-batches per evaluation, 0 = the whole held-out set [8]", NULL},
        {"save_every", "N", "steps between checkpoints RUN/step-N, 0 = at the end only [0]", NULL},
        {"keep", "N", "checkpoints kept, 0 = all [3]", NULL},
        {"expert_load_every", "N", "steps between lines of RUN/expert_load.jsonl, 0 = never [10]", NULL},
        {"max_bad_steps", "K", "stop after K NaN/Inf steps in a row [5]", NULL},
        {"seed", "S", "weights (without --init) and data order [1]", NULL},
        {"precision", "fp32|bf16", "large matrix products: fp32 (reference) or bf16 (bf16 inputs, fp32 sums; "
         "docs/precision.md); a resumed run keeps it [fp32]", NULL},
        {"weight_copies", "true|false", "bf16 mode: keep bf16 copies of the experts' weights, rewritten by each "
         "optimizer step (faster products, the same results, about 4 bytes per expert weight more memory as "
         "packed panels, which then hold the attention's projections too, 2 as rows under --recompute attention, "
         "attention-keep-core and moe; docs/params.md) [true]",
         NULL},
        {"muon_ns", "bf16|fp32", "precision of Muon's Newton-Schulz products: bf16 (bf16 operands, fp32 sums, "
         "on AMX) or fp32 (the reference); docs/optim.md [bf16]", NULL},
        {"recompute", "none|attention|moe|full|full-keep-core|attention-keep-core", "activations kept for the backward (same "
         "results, less memory, more compute; docs/perf.md): none keeps every block's; attention (moe) drops "
         "the attention (MoE) sub-layers' internals and runs that sub-layer's forward again before its "
         "backward; full keeps only each block's input and runs the block's forward again in the backward; "
         "full-keep-core and attention-keep-core as full and attention, also keeping each block's attention "
         "core output and wo_a's products of it (the attention forward run again in the backward skips the "
         "core loop and those products) [none]", NULL},
        {"threads", "N", "threads, 0 = TREX_THREADS or every core [0]", NULL},
        {"peak_tflops", "X", "MFU denominator, 0 = the --cluster file's peak (fp32) or the AMX bf16 peak measured "
         "at start (bf16) [0]", NULL},
        {"cluster", "FILE", "cluster file whose peak_bf16_tflops is the MFU peak [configs/clusters/local.json]", NULL},
    };
    enum { NFL = sizeof fl / sizeof fl[0] };
    char names[NFL][40];
    trex_opt opts[NFL + 4];
    const char *resume = NULL, *run_file = NULL;
    bool deterministic = false;
    int no = 0;
    for (int i = 0; i < NFL; i++) {
        size_t k = 0;
        for (const char *c = fl[i].field; *c && k + 1 < sizeof names[i]; c++)
            names[i][k++] = *c == '_' ? '-' : *c;
        names[i][k] = 0;
        opts[no++] = (trex_opt){names[i], TREX_OPT_STR, &fl[i].value, fl[i].metavar, fl[i].help, false};
    }
    opts[no++] = (trex_opt){"resume", TREX_OPT_STR, &resume, "RUN", "continue RUN from its newest checkpoint", false};
    opts[no++] = (trex_opt){"run-file", TREX_OPT_STR, &run_file, "F", "JSON settings (the flags' names with '_'); flags "
                            "override it", false};
    opts[no++] = (trex_opt){"deterministic", TREX_OPT_FLAG, &deterministic, NULL,
                            "fixed reduction orders; a resume must use the same kernel level", false};
    opts[no] = (trex_opt){0};
    trex_cmd_info info = {
        .usage = "trex train --config C --data DIR --tokenizer T --out RUN [options] | trex train --resume RUN [options]",
        .summary = "Trains a DeepSeek-V4 model on token shards (CPT or SFT: the loss is on the shards' target tokens), "
                   "with gradient accumulation, warmup + cosine lr, clipping, AdamW or Muon, the MTP weight schedule, "
                   "the aux-loss-free bias update and an optional indexer warm-up. Prints a progress line per step "
                   "and writes RUN/settings.json, RUN/metrics.jsonl, RUN/expert_load.jsonl and RUN/step-N "
                   "checkpoints. docs/train.md explains every setting."};
    int prc = trex_opts_parse(opts, argc, argv, &info);
    if (prc != TREX_OPTS_OK)
        return prc == TREX_OPTS_HELP ? 0 : 2;

    trex_train_settings s;
    trex_err err = {0};
    trex_train_defaults(&s);
    if (resume && trex_train_resume_settings(&s, resume, &err) != TREX_OK)
        return trex_cli_error("%s", err.msg);
    if (run_file) {
        cJSON *j = NULL;
        if (trex_json_load(run_file, &j, &err) != TREX_OK)
            return trex_cli_error("--run-file %s", err.msg);
        trex_code rc = trex_train_settings_from_json(&s, j, run_file, &err);
        cJSON_Delete(j);
        if (rc != TREX_OK)
            return trex_cli_error("--run-file %s", err.msg);
    }
    for (int i = 0; i < NFL; i++)
        if (fl[i].value && trex_train_settings_set(&s, fl[i].field, fl[i].value, &err) != TREX_OK)
            return trex_cli_error("%s", err.msg);
    if (deterministic)
        s.deterministic = true;
    if (resume) {
        const char *out = fl[3].value;
        if (out && strcmp(out, resume))
            return trex_cli_error("--out %s and --resume %s name different runs: a resumed run writes into its own "
                                  "directory (drop --out)", out, resume);
        snprintf(s.out, sizeof s.out, "%s", resume);
        s.resume = true;
    }
    int64_t fault_steps[MAX_FAULT_STEPS];
    trex_train_faults faults;
    if (read_faults(&faults, fault_steps))
        return 1;
    trex_code rc = trex_train_run(&s, &faults, &err);
    if (rc != TREX_OK)
        return trex_cli_error("%s", err.msg);
    return 0;
}
