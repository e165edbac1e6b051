/* tools/trex/cmd_plan.c — `trex plan`: predict memory per device, step time and MFU of parallel
 * layouts of a model on a cluster; search them, or evaluate one given with --layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "opts.h"
#include "trex/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

int trex_cmd_plan(int argc, char **argv)
{
    const char *model_path = NULL, *cluster_path = NULL, *layout = NULL, *svg = NULL;
    const char *optimizer = NULL;
    int64_t devices = 0, seq = 4096, gbs = 0, top = -1, ns_iters = 0;
    double mem_limit = 0, imbalance = 1.0;
    bool json = false, explain = false, fp8 = false;
    static const char summary[] =
        "Predicts memory per device, step time, tokens/s and MFU of parallel layouts (TP, PP with "
        "1F1B/interleaved/DualPipeV, EP, CP, DP with ZeRO, recompute, optimizer swap, micro-batch) of "
        "a model on a cluster. Without --layout it searches every layout and ranks those that fit by "
        "step time; --layout evaluates one (keys left out are searched). MFU is against the "
        "cluster's dense BF16 peak; FLOPs follow docs/planner.md.";
    const trex_opt opts[] = {
        {"model", TREX_OPT_STR, &model_path, "FILE",
         "model config.json: DeepSeek-V4, or a Hugging Face deepseek_v3 / kimi_k2 / qwen3_moe config",
         true},
        {"cluster", TREX_OPT_STR, &cluster_path, "FILE", "cluster description (configs/clusters/NAME.json)",
         true},
        {"devices", TREX_OPT_I64, &devices, "N", "number of devices", true},
        {"seq", TREX_OPT_I64, &seq, "S", "sequence length (default 4096)", false},
        {"gbs", TREX_OPT_I64, &gbs, "B", "global batch in sequences", true},
        {"layout", TREX_OPT_STR, &layout, "L",
         "evaluate this layout, e.g. \"tp=1,pp=4,vpp=1,ep=32,cp=1,zero=1,recompute=full,"
         "swap_optimizer=1,mbs=1\" (also schedule=, a2a_overlap=, dispatcher=, first=, last=)",
         false},
        {"optimizer", TREX_OPT_STR, &optimizer, "O",
         "adamw or muon (default: muon for DeepSeek-V4, adamw otherwise)", false},
        {"ns-iters", TREX_OPT_I64, &ns_iters, "N", "Newton-Schulz iterations (default: the model's)",
         false},
        {"fp8", TREX_OPT_FLAG, &fp8, NULL, "GEMMs in FP8 (MFU stays against the BF16 peak)", false},
        {"mem-limit", TREX_OPT_F64, &mem_limit, "GIB", "memory limit per device (default: hbm_gib)",
         false},
        {"imbalance", TREX_OPT_F64, &imbalance, "X",
         "tokens on the most-loaded EP rank / mean (default 1: balanced)", false},
        {"top", TREX_OPT_I64, &top, "N", "layouts to print (default 10; 1 with --layout)", false},
        {"json", TREX_OPT_FLAG, &json, NULL, "print {\"layouts\": [...]}, best first", false},
        {"explain", TREX_OPT_FLAG, &explain, NULL,
         "print the time and memory breakdown of the best layout", false},
        {"svg", TREX_OPT_STR, &svg, "FILE",
         "draw the search space (and with --explain the pipeline timeline) into FILE", false},
        {0}};
    trex_cmd_info info = {.usage = "trex plan --model FILE --cluster FILE --devices N --gbs B [options]",
                          .summary = summary};
    int prc = trex_opts_parse(opts, argc, argv, &info);
    if (prc != TREX_OPTS_OK)
        return prc == TREX_OPTS_HELP ? 0 : 2;
    if (devices < 1)
        return trex_cli_error("--devices must be at least 1 (got %lld)", (long long)devices);
    if (gbs < 1)
        return trex_cli_error("--gbs must be at least 1 (got %lld)", (long long)gbs);
    if (seq < 1)
        return trex_cli_error("--seq must be at least 1 (got %lld)", (long long)seq);
    if (imbalance < 1.0)
        return trex_cli_error("--imbalance must be at least 1 (got %g)", imbalance);

    trex_err err = {0};
    trex_cluster cl;
    if (trex_plan_cluster_load(&cl, cluster_path, &err) != TREX_OK)
        return trex_cli_error("%s", err.msg);
    trex_plan_model *m = malloc(sizeof *m);
    if (!m)
        return trex_cli_error("out of memory");
    int rc = 1;
    trex_plan_search_out so = {0};
    if (trex_plan_model_load(m, model_path, seq, &err) != TREX_OK) {
        trex_cli_error("%s", err.msg);
        goto out;
    }
    trex_plan_run run;
    trex_plan_run_defaults(&run);
    run.devices = devices, run.seq = seq, run.gbs = gbs, run.fp8 = fp8, run.ns_iters = ns_iters;
    run.mem_limit_gib = mem_limit, run.imbalance = imbalance;
    run.optimizer = !strcmp(m->family, "deepseek_v4") ? TREX_OPT_MUON : TREX_OPT_ADAMW;
    if (optimizer) {
        if (!strcmp(optimizer, "adamw"))
            run.optimizer = TREX_OPT_ADAMW;
        else if (!strcmp(optimizer, "muon"))
            run.optimizer = TREX_OPT_MUON;
        else {
            trex_cli_error("--optimizer %s: use adamw or muon", optimizer);
            rc = 2;
            goto out;
        }
    }
    if (fp8 && cl.peak_fp8_tflops <= 0) {
        trex_cli_error("--fp8: %s has no FP8 peak (peak_fp8_tflops is 0 in %s)", cl.name, cluster_path);
        goto out;
    }
    trex_plan_layout fixed;
    trex_plan_layout_unset(&fixed);
    if (layout && trex_plan_layout_parse(&fixed, layout, &err) != TREX_OK) {
        trex_cli_error("%s", err.msg);
        rc = 2;
        goto out;
    }
    if (top < 0)
        top = layout ? 1 : 10;
    if (trex_plan_search(m, &cl, &run, &fixed, top > 64 ? top : 64, &so, &err) != TREX_OK) {
        trex_cli_error("%s", err.msg);
        goto out;
    }
    double limit = mem_limit > 0 ? mem_limit : cl.hbm_gib;
    const trex_plan_result *best = &so.best[0];
    bool any = best->feasible;
    int64_t nshow = so.n_best < top ? so.n_best : top;
    if (!layout && any) { /* a search shows only layouts that fit */
        int64_t k = 0;
        while (k < nshow && so.best[k].feasible)
            k++;
        nshow = k;
    }
    if (json) {
        cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "layouts");
        for (int64_t i = 0; i < nshow; i++)
            cJSON_AddItemToArray(arr, trex_plan_result_json(&so.best[i], explain && i == 0));
        cJSON_AddStringToObject(root, "model", m->name);
        cJSON_AddStringToObject(root, "cluster", cl.name);
        cJSON_AddNumberToObject(root, "devices", (double)devices);
        cJSON_AddNumberToObject(root, "seq", (double)seq);
        cJSON_AddNumberToObject(root, "gbs", (double)gbs);
        cJSON_AddStringToObject(root, "optimizer", run.optimizer == TREX_OPT_MUON ? "muon" : "adamw");
        cJSON_AddNumberToObject(root, "peak_bf16_tflops", cl.peak_bf16_tflops);
        cJSON_AddNumberToObject(root, "mem_limit_gb", limit);
        cJSON_AddNumberToObject(root, "evaluated", (double)so.n_points);
        char *s = cJSON_Print(root);
        if (s)
            printf("%s\n", s);
        free(s);
        cJSON_Delete(root);
    } else {
        printf("model %s: %.2f B parameters, %.2f B active, %.3g FLOPs/token; %lld x %s (%s), "
               "seq %lld, gbs %lld, %s; %lld layouts evaluated\n",
               m->name, m->p_total / 1e9, m->p_active / 1e9, m->model_flops_per_token,
               (long long)devices, cl.device, cl.name, (long long)seq, (long long)gbs,
               run.optimizer == TREX_OPT_MUON ? "Muon" : "AdamW", (long long)so.n_points);
        trex_plan_print_row(stdout, NULL);
        for (int64_t i = 0; i < nshow; i++)
            trex_plan_print_row(stdout, &so.best[i]);
        if (explain) {
            printf("\n");
            trex_plan_print_explain(stdout, m, &cl, &run, best);
        }
    }
    if (svg && trex_plan_svg(svg, so.points, so.n_points, limit, any ? best : NULL,
                             explain ? best : NULL, &err) != TREX_OK) {
        trex_cli_error("%s", err.msg);
        goto out;
    }
    if (!any && !layout) {
        const trex_plan_result *s = &so.smallest;
        int big = 0;
        for (int i = 1; i < TREX_MEM_COUNT; i++)
            if (s->mem[i] > s->mem[big])
                big = i;
        char buf[256];
        trex_plan_layout_str(&s->lay, buf, sizeof buf);
        trex_cli_error("%s fits no layout on %lld devices of %.0f GiB: the smallest needs %.1f GiB "
                       "per device (%s), dominated by %s (%.1f GiB); add devices, or use a cluster "
                       "with more memory",
                       m->name, (long long)devices, limit, s->mem_total / GIB, buf,
                       trex_plan_mem_name(big), s->mem[big] / GIB);
        goto out;
    }
    if (layout && !best->feasible)
        fprintf(stderr, "trex: warning: this layout does not fit: %s\n", best->why);
    rc = 0;
out:
    trex_plan_search_free(&so);
    free(m);
    return rc;
}
