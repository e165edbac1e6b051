/* tools/trex/cmd_bench_step.c — `trex bench step`: the speed of a full training step.
 *
 * Builds the model of --config from random initial weights (trex model init's initialiser), draws one
 * batch of random tokens, runs --warmup untimed and --steps timed training steps through the training
 * library's own step (trex_train_bench: forward, backward, gradient check and clipping, optimizer,
 * bias update), and prints tokens/s, the median step time, MFU, the model FLOPs per token of the
 * planner's convention (docs/mfu.md), the peak used, wall seconds per op class (trex/prof.h), the peak
 * RSS and the memory per region. With --json, one JSON object; the fields tokens_per_s, mfu,
 * peak_flops, model_flops_per_token and step_s are an interface scripts rely on (bench/compare.sh).
 *
 * The peak, unless --peak-tflops gives it, is measured just before the steps, as `trex bench peak`
 * measures its "all threads" figure, for the chosen precision (AMX bf16 for bf16, AVX-512 fp32 FMA for
 * fp32) on the threads the steps use. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "commands.h"
#include "kernels/dispatch.h"
#include "opts.h"
#include "trex/config.h"
#include "trex/pool.h"
#include "trex/prof.h"
#include "trex/train.h"

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmp_gemm_seconds(const void *a, const void *b)
{
    const double x = ((const trex_prof_gemm *)a)->seconds, y = ((const trex_prof_gemm *)b)->seconds;
    return x > y ? -1 : x < y;
}

/* The rows of the --gemm-profile table (the first `rows` shapes by wall time; the rest summed). */
#define GEMM_TABLE_ROWS 30

static double mib(size_t bytes)
{
    return (double)bytes / 1048576.0;
}

int trex_cmd_bench_step(int argc, char **argv)
{
    const char *config = NULL, *precision = "fp32", *optimizer = "adamw", *recompute = "none";
    int64_t seq = 0, mbs = 1, steps = 3, warmup = 1, threads = 0, seed = 1;
    double peak_tflops = 0;
    bool json = false, no_weight_copies = false, gemm_profile = false;
    static const char summary[] =
        "Times full training steps (forward, backward, gradient clipping, optimizer, bias update: the "
        "training library's step) of the model of --config, from random initial weights on one batch of "
        "random tokens, after --warmup untimed steps. Prints tokens/s, the median step time, MFU "
        "(model FLOPs of docs/mfu.md over the peak), the model FLOPs per token, the peak used, wall "
        "seconds per op class (embed, attention, moe, mhc, head, mtp, optimizer, other), the peak RSS and "
        "the memory per region. With --json: one JSON object (tokens_per_s, mfu, peak_flops, "
        "model_flops_per_token, step_s, peak_rss_mib, ops, ...). docs/perf.md records measurements.";
    const trex_opt opts[] = {
        {"config", TREX_OPT_STR, &config, "C", "model config.json", true},
        {"seq", TREX_OPT_I64, &seq, "T", "tokens per sequence", true},
        {"mbs", TREX_OPT_I64, &mbs, "B", "sequences per step (one micro-batch)", false},
        {"steps", TREX_OPT_I64, &steps, "N", "timed steps; the median is reported", false},
        {"warmup", TREX_OPT_I64, &warmup, "W", "untimed steps first (the activation arena grows in the first)",
         false},
        {"precision", TREX_OPT_STR, &precision, "P", "fp32 or bf16 (docs/precision.md)", false},
        {"optimizer", TREX_OPT_STR, &optimizer, "O", "adamw or muon", false},
        {"recompute", TREX_OPT_STR, &recompute, "R",
         "none (keep every block's activations), attention or moe (drop that sub-layer's internals, run its "
         "forward again before its backward), full (keep block inputs, run each block's forward again in "
         "the backward), full-keep-core or attention-keep-core (full or attention, keeping each block's "
         "attention core output and wo_a's products of it too: about H*c*2 + G*d_g*4 bytes per token and "
         "block more in bf16, H*c*4 + G*d_g*4 in fp32; no core loop in the backward)", false},
        {"no-weight-copies", TREX_OPT_FLAG, &no_weight_copies, NULL,
         "bf16: without the bf16 copies of the experts' weights (and, as panels, of the attention's projections) "
         "that training keeps by default (less memory, slower products, the same results; docs/params.md)", false},
        {"threads", TREX_OPT_I64, &threads, "N", "threads (0: TREX_THREADS, else every core)", false},
        {"peak-tflops", TREX_OPT_F64, &peak_tflops, "X",
         "MFU denominator in TFLOP/s (0: measure the precision's peak loop on the threads used)", false},
        {"gemm-profile", TREX_OPT_FLAG, &gemm_profile, NULL,
         "also print the matrix products of the bf16 GEMM per op class and by shape and layout: calls, wall "
         "seconds and TFLOP/s per step (with --json: gemm_ops and the array gemm; docs/kernels.md)", false},
        {"seed", TREX_OPT_I64, &seed, "S", "weights and tokens", false},
        {"json", TREX_OPT_FLAG, &json, NULL, "print one JSON object", false},
        {0}};
    trex_cmd_info info = {
        .usage = "trex bench step --config C --seq T [--mbs B] [--steps N] [--warmup W] [--precision fp32|bf16] "
                 "[--optimizer adamw|muon] [--recompute none|attention|moe|full|full-keep-core|attention-keep-core] [--no-weight-copies] [--threads N] [--peak-tflops X] [--gemm-profile] [--seed S] [--json]",
        .summary = summary};
    int prc = trex_opts_parse(opts, argc, argv, &info);
    if (prc != TREX_OPTS_OK)
        return prc == TREX_OPTS_HELP ? 0 : 2;

    trex_train_bench_opts bo = {0};
    if (!strcmp(precision, "fp32"))
        bo.compute = TREX_F32;
    else if (!strcmp(precision, "bf16"))
        bo.compute = TREX_BF16;
    else
        return trex_cli_error("--precision '%s': use fp32 or bf16", precision) + 1;
    if (!strcmp(optimizer, "adamw"))
        bo.optimizer = TREX_OPTIM_ADAMW;
    else if (!strcmp(optimizer, "muon"))
        bo.optimizer = TREX_OPTIM_MUON;
    else
        return trex_cli_error("--optimizer '%s': use adamw or muon", optimizer) + 1;
    bo.no_weight_copies = no_weight_copies;
    if (!trex_model_recompute_parse(recompute, &bo.recompute))
        return trex_cli_error("--recompute '%s': use none, attention, moe, full, full-keep-core or attention-keep-core",
                              recompute) + 1;
    if (seq < 2 || seq > (1 << 24))
        return trex_cli_error("--seq %lld: must be in [2, 16777216]", (long long)seq) + 1;
    if (mbs < 1 || mbs > 65536)
        return trex_cli_error("--mbs %lld: must be in [1, 65536]", (long long)mbs) + 1;
    if (steps < 1 || steps > TREX_TRAIN_BENCH_MAX_STEPS)
        return trex_cli_error("--steps %lld: must be in [1, %d]", (long long)steps, TREX_TRAIN_BENCH_MAX_STEPS) + 1;
    if (warmup < 0 || warmup > 1000)
        return trex_cli_error("--warmup %lld: must be in [0, 1000]", (long long)warmup) + 1;
    if (threads < 0 || threads > 1024)
        return trex_cli_error("--threads %lld: must be in [0, 1024] (0: TREX_THREADS or every core)",
                              (long long)threads) + 1;
    if (!(peak_tflops >= 0 && peak_tflops < 1e6))
        return trex_cli_error("--peak-tflops %g: must be >= 0 (0: measure it)", peak_tflops) + 1;
    if (seed < 0)
        return trex_cli_error("--seed %lld: must be >= 0", (long long)seed) + 1;

    trex_err err = {0};
    trex_config cfg;
    if (trex_config_load(&cfg, config, &err) != TREX_OK)
        return trex_cli_error("--config %s", err.msg);
    if (trex_kernels_init(&err) != TREX_OK)
        return trex_cli_error("%s", err.msg);

    /* the peak, on a pool of the threads the steps will use */
    const char *peak_src = "--peak-tflops";
    double peak = peak_tflops * 1e12, peak_per_cpu = 0;
    int nthreads;
    {
        trex_pool *pool = NULL;
        if (trex_pool_create_checked(&pool, (int)threads, &err) != TREX_OK)
            return trex_cli_error("%s", err.msg);
        nthreads = trex_pool_size(pool);
        if (peak <= 0) {
            peak = 1e12 * trex_train_measure_peak(pool, bo.compute, 0.2, 5, &peak_per_cpu, &peak_src);
            peak_per_cpu *= 1e12;
        }
        trex_pool_destroy(pool);
    }
    if (!(peak > 0))
        fprintf(stderr, "trex bench step: warning: kernel level %s has no %s peak loop: MFU unknown (give "
                        "--peak-tflops)\n", trex_isa_name(trex_kernels_isa()), precision);
    /* the layout of the bf16 weight copies the trainer keeps (NULL: none) */
    const char *copies = bo.compute != TREX_BF16 || no_weight_copies ? NULL
                         : trex_train_copies_as_panels(bo.recompute) ? "panels"
                                                                     : "rows";
    if (!json) {
        printf("trex bench step: %s, seq %lld, mbs %lld, precision %s%s, optimizer %s, recompute %s, %d threads, "
               "kernels %s; %lld warm-up + %lld timed steps\n",
               cfg.name, (long long)seq, (long long)mbs, precision,
               copies == NULL ? (bo.compute == TREX_BF16 ? " (no weight copies)" : "")
               : !strcmp(copies, "panels") ? " (expert and attention weight copies as panels)"
                                           : " (expert weight copies as rows)",
               optimizer, recompute, nthreads,
               trex_isa_label(trex_kernels_isa()), (long long)warmup, (long long)steps);
        fflush(stdout);
    }

    bo.cfg = &cfg;
    bo.seq = seq;
    bo.mbs = mbs;
    bo.warmup = warmup;
    bo.steps = steps;
    bo.threads = threads;
    bo.seed = (uint64_t)seed;
    trex_prof prof;
    bo.prof = &prof;
    trex_train_bench_result *res = calloc(1, sizeof *res);
    if (!res)
        return trex_cli_error("out of memory");
    if (trex_train_bench(&bo, res, &err) != TREX_OK) {
        free(res);
        return trex_cli_error("%s", err.msg);
    }

    double sorted[TREX_TRAIN_BENCH_MAX_STEPS], cpu[TREX_TRAIN_BENCH_MAX_STEPS], mean = 0;
    for (int64_t i = 0; i < steps; i++) {
        sorted[i] = res->step_s[i];
        cpu[i] = res->step_cpu_s[i];
        mean += res->step_s[i];
    }
    qsort(cpu, (size_t)steps, sizeof *cpu, cmp_double);
    const double step_cpu = steps % 2 ? cpu[steps / 2] : 0.5 * (cpu[steps / 2 - 1] + cpu[steps / 2]);
    mean /= (double)steps;
    qsort(sorted, (size_t)steps, sizeof *sorted, cmp_double);
    const double step_s = steps % 2 ? sorted[steps / 2] : 0.5 * (sorted[steps / 2 - 1] + sorted[steps / 2]);
    const double tokens = (double)(seq * mbs);
    const double tps = tokens / step_s;
    const double fpt = res->flops_per_token;
    const double mfu = peak > 0 ? tps * fpt / peak : NAN;
    const double ns_flops = res->flops_step - tokens * fpt; /* Newton–Schulz of Muon, else 0 */
    const double mfu_all = peak > 0 ? res->flops_step / step_s / peak : NAN;
    /* on a shared machine: model FLOPs per CPU-second of the step against one core's peak per CPU-second */
    const double mfu_cpu = peak_per_cpu > 0 && step_cpu > 0 ? tokens * fpt / step_cpu / (peak_per_cpu / nthreads) : NAN;
    /* op classes: seconds per timed step (mean); "other" also takes what no class covered */
    double ops[TREX_PROF_COUNT], ops_cpu[TREX_PROF_COUNT], timed = 0, timed_cpu = 0, mean_cpu = 0;
    for (int64_t i = 0; i < steps; i++)
        mean_cpu += res->step_cpu_s[i] / (double)steps;
    for (int c = 0; c < TREX_PROF_COUNT; c++) {
        ops[c] = prof.seconds[c] / (double)steps;
        ops_cpu[c] = prof.cpu_seconds[c] / (double)steps;
        if (c != TREX_PROF_OTHER) {
            timed += ops[c];
            timed_cpu += ops_cpu[c];
        }
    }
    ops[TREX_PROF_OTHER] = mean - timed > 0 ? mean - timed : 0;
    ops_cpu[TREX_PROF_OTHER] = mean_cpu - timed_cpu > 0 ? mean_cpu - timed_cpu : 0;
    /* matrix products by shape, slowest first; their sums */
    qsort(prof.gemm, (size_t)prof.ngemm, sizeof *prof.gemm, cmp_gemm_seconds);
    double gemm_s = 0, gemm_flops = 0;
    for (int i = 0; i < prof.ngemm; i++) {
        gemm_s += prof.gemm[i].seconds / (double)steps;
        gemm_flops += prof.gemm[i].flops / (double)steps;
    }
    const char *region_key[TREX_REGION_COUNT] = {"params", "grads", "optimizer", "activations", "buffers", "other"};
    const double rss = mib(res->peak_rss);

    if (json) {
        cJSON *root = cJSON_CreateObject();
        char date[32];
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
        cJSON_AddStringToObject(root, "date", date);
        cJSON_AddStringToObject(root, "config", config);
        cJSON_AddStringToObject(root, "model", cfg.name);
        cJSON_AddNumberToObject(root, "seq", (double)seq);
        cJSON_AddNumberToObject(root, "mbs", (double)mbs);
        cJSON_AddStringToObject(root, "precision", precision);
        cJSON_AddStringToObject(root, "recompute", trex_model_recompute_name(bo.recompute));
        cJSON_AddBoolToObject(root, "weight_copies", copies != NULL);
        if (copies)
            cJSON_AddStringToObject(root, "weight_copies_layout", copies);
        else
            cJSON_AddNullToObject(root, "weight_copies_layout");
        cJSON_AddStringToObject(root, "optimizer", optimizer);
        cJSON_AddNumberToObject(root, "threads", nthreads);
        cJSON_AddStringToObject(root, "kernels", trex_isa_name(trex_kernels_isa()));
        cJSON_AddBoolToObject(root, "kernels_emulated", trex_cpu_features_get()->amx_emulated &&
                                                            trex_kernels_isa() == TREX_ISA_AMX);
        cJSON_AddNumberToObject(root, "warmup", (double)warmup);
        cJSON_AddNumberToObject(root, "steps", (double)steps);
        cJSON_AddNumberToObject(root, "tokens_per_step", tokens);
        cJSON_AddNumberToObject(root, "tokens_per_s", tps);
        cJSON_AddNumberToObject(root, "step_s", step_s);
        cJSON_AddNumberToObject(root, "step_mean_s", mean);
        cJSON_AddNumberToObject(root, "step_min_s", sorted[0]);
        cJSON_AddNumberToObject(root, "step_max_s", sorted[steps - 1]);
        cJSON_AddNumberToObject(root, "step_cpu_s", step_cpu);
        cJSON_AddNumberToObject(root, "tokens_per_cpu_s", tokens / step_cpu);
        cJSON *all = cJSON_AddArrayToObject(root, "steps_s");
        for (int64_t i = 0; i < steps; i++)
            cJSON_AddItemToArray(all, cJSON_CreateNumber(res->step_s[i]));
        cJSON_AddNumberToObject(root, "model_flops_per_token", fpt);
        cJSON_AddNumberToObject(root, "optimizer_flops_per_step", ns_flops);
        if (peak > 0) {
            cJSON_AddNumberToObject(root, "peak_flops", peak);
            cJSON_AddNumberToObject(root, "mfu", mfu);
            cJSON_AddNumberToObject(root, "mfu_with_optimizer", mfu_all);
        } else {
            cJSON_AddNullToObject(root, "peak_flops");
            cJSON_AddNullToObject(root, "mfu");
            cJSON_AddNullToObject(root, "mfu_with_optimizer");
        }
        cJSON_AddStringToObject(root, "peak_source", peak_src);
        if (peak_per_cpu > 0) {
            cJSON_AddNumberToObject(root, "peak_flops_per_cpu_second", peak_per_cpu);
            cJSON_AddNumberToObject(root, "mfu_per_cpu_second", mfu_cpu);
        }
        cJSON *o = cJSON_AddObjectToObject(root, "ops");
        for (int c = 0; c < TREX_PROF_COUNT; c++)
            cJSON_AddNumberToObject(o, trex_prof_name((trex_prof_class)c), ops[c]);
        cJSON *ou = cJSON_AddObjectToObject(root, "ops_cpu");
        for (int c = 0; c < TREX_PROF_COUNT; c++)
            cJSON_AddNumberToObject(ou, trex_prof_name((trex_prof_class)c), ops_cpu[c]);
        cJSON_AddNumberToObject(root, "step_cpu_mean_s", mean_cpu);
        cJSON *oc = cJSON_AddObjectToObject(root, "ops_calls");
        for (int c = 0; c < TREX_PROF_COUNT; c++)
            cJSON_AddNumberToObject(oc, trex_prof_name((trex_prof_class)c), (double)prof.calls[c] / (double)steps);
        if (gemm_profile) {
            cJSON *gm = cJSON_AddArrayToObject(root, "gemm");
            for (int i = 0; i < prof.ngemm; i++) {
                const trex_prof_gemm *g = &prof.gemm[i];
                char lay[64];
                cJSON *e = cJSON_CreateObject();
                cJSON_AddNumberToObject(e, "m", (double)g->m / (double)g->calls); /* rows per call */
                cJSON_AddNumberToObject(e, "n", (double)g->n);
                cJSON_AddNumberToObject(e, "k", (double)g->k);
                cJSON_AddNumberToObject(e, "groups", (double)g->groups);
                cJSON_AddStringToObject(e, "layout", trex_prof_gemm_layout(g->layout, lay, sizeof lay));
                cJSON_AddNumberToObject(e, "calls", (double)g->calls / (double)steps);
                cJSON_AddNumberToObject(e, "seconds", g->seconds / (double)steps);
                cJSON_AddNumberToObject(e, "flops", g->flops / (double)steps);
                cJSON_AddItemToArray(gm, e);
            }
            cJSON_AddNumberToObject(root, "gemm_s", gemm_s);
            cJSON_AddNumberToObject(root, "gemm_flops", gemm_flops);
            cJSON *gc = cJSON_AddObjectToObject(root, "gemm_ops");
            for (int c = 0; c < TREX_PROF_COUNT; c++)
                cJSON_AddNumberToObject(gc, trex_prof_name((trex_prof_class)c), prof.gemm_seconds[c] / (double)steps);
        }
        cJSON_AddNumberToObject(root, "peak_rss_mib", rss);
        cJSON *mem = cJSON_AddObjectToObject(root, "memory_mib");
        for (int r = 0; r < TREX_REGION_COUNT; r++)
            cJSON_AddNumberToObject(mem, region_key[r], mib(res->region_peak[r]));
        cJSON_AddNumberToObject(mem, "activations_used", mib(res->acts_used));
        cJSON_AddNumberToObject(root, "loss_first", res->loss_first);
        cJSON_AddNumberToObject(root, "loss_last", res->loss_last);
        char *text = cJSON_Print(root);
        printf("%s\n", text ? text : "{}");
        free(text);
        cJSON_Delete(root);
    } else {
        if (peak > 0)
            printf("peak            %.4g TFLOP/s (%s%s)", peak / 1e12, peak_src,
                   peak_tflops > 0 ? "" : ", measured now on the threads used");
        else
            printf("peak            unknown");
        if (peak_per_cpu > 0)
            printf("; per CPU-second x threads %.4g", peak_per_cpu / 1e12);
        printf("\nmodel FLOPs     %.4g per token (docs/mfu.md), %.4g per step", fpt, res->flops_step);
        if (ns_flops > 0)
            printf(" incl. %.4g of Newton-Schulz", ns_flops);
        printf("\nstep            median %.4f s (mean %.4f, min %.4f, max %.4f) over %lld steps\n", step_s, mean,
               sorted[0], sorted[steps - 1], (long long)steps);
        printf("tokens/s        %.1f (%.1f per CPU-second; %.2f CPU-s per step)\n", tps, tokens / step_cpu, step_cpu);
        if (peak > 0)
            printf("MFU             %.2f%%%s\n", 100 * mfu, ns_flops > 0 ? " (model FLOPs only)" : "");
        else
            printf("MFU             ? (no peak)\n");
        if (peak_per_cpu > 0)
            printf("MFU per CPU-s   %.2f%% (model FLOPs per CPU-second of the step / one core's peak per CPU-second)\n",
                   100 * mfu_cpu);
        if (ns_flops > 0 && peak > 0)
            printf("MFU with Muon's Newton-Schulz %.2f%%\n", 100 * mfu_all);
        printf("loss            %.4f (first step) -> %.4f (last)\n", res->loss_first, res->loss_last);
        printf("time per op class (per step, mean of the timed steps):   wall          CPU (all threads)\n");
        for (int c = 0; c < TREX_PROF_COUNT; c++)
            printf("  %-10s %9.4f s %6.1f%%   %9.4f s %6.1f%%\n", trex_prof_name((trex_prof_class)c), ops[c],
                   mean > 0 ? 100 * ops[c] / mean : 0.0, ops_cpu[c], mean_cpu > 0 ? 100 * ops_cpu[c] / mean_cpu : 0.0);
        if (gemm_profile) {
            printf("matrix products (bf16 GEMM) per step: %.4f s wall (%.1f%% of the step), %.4g FLOPs, %.2f TFLOP/s",
                   gemm_s, mean > 0 ? 100 * gemm_s / mean : 0.0, gemm_flops, gemm_s > 0 ? gemm_flops / gemm_s / 1e12 : 0.0);
            if (peak > 0 && gemm_s > 0)
                printf(" (%.1f%% of the peak)", 100 * gemm_flops / gemm_s / peak);
            printf("\n  by op class (wall s, TFLOP/s):");
            for (int c = 0; c < TREX_PROF_COUNT; c++)
                if (prof.gemm_seconds[c] > 0)
                    printf(" %s %.3f (%.2f)", trex_prof_name((trex_prof_class)c), prof.gemm_seconds[c] / (double)steps,
                           prof.gemm_flops[c] / prof.gemm_seconds[c] / 1e12);
            printf("\n  (M: rows per call, summed over the problems of a grouped call, whose rows vary: the mean)\n");
            printf("  %8s %6s %6s %6s  %-24s %7s %9s %8s %7s\n", "M", "N", "K", "groups", "layout",
                   "calls", "wall s", "TFLOP/s", "% peak");
            double rest_s = 0, rest_f = 0;
            for (int i = 0; i < prof.ngemm; i++) {
                const trex_prof_gemm *g = &prof.gemm[i];
                const double gs = g->seconds / (double)steps, gf = g->flops / (double)steps;
                if (i >= GEMM_TABLE_ROWS) {
                    rest_s += gs;
                    rest_f += gf;
                    continue;
                }
                char lay[64];
                printf("  %8.0f %6lld %6lld %6lld  %-24s %7.1f %9.4f %8.2f %7.1f\n", (double)g->m / (double)g->calls,
                       (long long)g->n, (long long)g->k, (long long)g->groups,
                       g->groups ? trex_prof_gemm_layout(g->layout, lay, sizeof lay) : "(other shapes)",
                       (double)g->calls / (double)steps, gs, gs > 0 ? gf / gs / 1e12 : 0.0,
                       gs > 0 && peak > 0 ? 100 * gf / gs / peak : 0.0);
            }
            if (prof.ngemm > GEMM_TABLE_ROWS)
                printf("  (%d more shapes: %.4f s, %.2f TFLOP/s)\n", prof.ngemm - GEMM_TABLE_ROWS, rest_s,
                       rest_s > 0 ? rest_f / rest_s / 1e12 : 0.0);
        }
        printf("memory          peak RSS %.0f MiB; by region (peak):", rss);
        for (int r = 0; r < TREX_REGION_COUNT; r++)
            printf(" %s %.0f", region_key[r], mib(res->region_peak[r]));
        printf(" MiB\n");
    }
    free(res);
    return 0;
}
