/* tests/test_plan.c — the planner: cluster files, the FLOP convention, memory accounting, layout
 * rules, search, and the validation cases of PLANNER.md §6 (V1, V2, V3, V7, V8).
 *
 * Runs from the repository root (configs/ paths). Each validation case prints its prediction, the
 * published value and the relative error, whatever the outcome; docs/planner.md records them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "trex/optim.h"
#include "trex/params.h"
#include "trex/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static trex_plan_model *load_model(const char *path, int64_t seq)
{
    trex_plan_model *m = malloc(sizeof *m);
    trex_err err = {0};
    TREX_ASSERT(m);
    trex_code rc = trex_plan_model_load(m, path, seq, &err);
    CHECK(rc == TREX_OK, "loading %s: %s", path, err.msg);
    if (rc != TREX_OK) {
        free(m);
        return NULL;
    }
    return m;
}

static bool load_cluster(trex_cluster *cl, const char *name)
{
    char path[256];
    trex_err err = {0};
    snprintf(path, sizeof path, "configs/clusters/%s.json", name);
    trex_code rc = trex_plan_cluster_load(cl, path, &err);
    CHECK(rc == TREX_OK, "loading %s: %s", path, err.msg);
    return rc == TREX_OK;
}

/* Evaluates one layout string; returns false (and records a failed check) on error. */
static bool eval(const trex_plan_model *m, const trex_cluster *cl, const trex_plan_run *run,
                 const char *layout, trex_plan_result *res)
{
    trex_plan_layout l;
    trex_err err = {0};
    trex_plan_layout_unset(&l);
    l.first = l.last = -1;
    trex_code rc = trex_plan_layout_parse(&l, layout, &err);
    CHECK(rc == TREX_OK, "parse %s: %s", layout, err.msg);
    if (rc != TREX_OK)
        return false;
    if (l.schedule < 0)
        l.schedule = l.vpp > 1 ? TREX_SCHED_INTERLEAVED : TREX_SCHED_1F1B;
    if (l.a2a_overlap < 0)
        l.a2a_overlap = 0;
    if (l.dedup < 0)
        l.dedup = 1;
    if (l.swap_optimizer < 0)
        l.swap_optimizer = 0;
    rc = trex_plan_evaluate(m, cl, run, &l, res, &err);
    CHECK(rc == TREX_OK, "evaluate %s: %s", layout, err.msg);
    return rc == TREX_OK;
}

static void report(const char *name, double pred, double ref, double tol)
{
    double e = pred / ref - 1.0;
    printf("  %-44s predicted %9.3f  published %9.3f  error %+6.1f%%  (tolerance %.0f%%)\n", name,
           pred, ref, 100.0 * e, 100.0 * tol);
    CHECK(fabs(e) <= tol, "%s: predicted %.3f vs published %.3f (%+.1f%%)", name, pred, ref, 100.0 * e);
}

static void test_clusters(void)
{
    const char *names[] = {"ascend-910b-a2", "ascend-910c-a3", "h800", "h100", "h200", "b200",
                           "gb200-nvl72", "gb300-nvl72", "local"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        trex_cluster cl;
        if (load_cluster(&cl, names[i]))
            CHECK(cl.peak_bf16_tflops > 0 && cl.hbm_gib > 0 && cl.scaleup_domain >= cl.devices_per_node,
                  "%s values", names[i]);
    }
    trex_cluster a3;
    if (load_cluster(&a3, "ascend-910c-a3")) {
        CHECK_NEAR(a3.peak_bf16_tflops, 376.0, 1e-9, "910C die peak = 752 / 2");
        CHECK(a3.scaleup_domain == 768, "CloudMatrix384 UB domain is 768 dies");
    }
    /* unknown, missing and out-of-range fields are refused with the field named */
    const char *good = "{\"name\":\"x\",\"device\":\"d\",\"peak_bf16_tflops\":100,\"peak_fp8_tflops\":0,"
                       "\"hbm_gib\":64,\"hbm_bw_gbs\":1000,\"devices_per_node\":8,\"scaleup_domain\":8,"
                       "\"scaleup_bw_gbs\":100,\"scaleup_latency_us\":2,\"scaleout_bw_gbs\":25,"
                       "\"scaleout_latency_us\":5,\"host_mem_gib\":512,\"host_bw_gbs\":20,"
                       "\"reserved_gib\":2%s}";
    struct {
        const char *extra, *expect;
        trex_code code;
    } cases[] = {
        {"", NULL, TREX_OK},
        {",\"hbm_gb\":64", "\"hbm_gb\"", TREX_EFORMAT},
        {",\"efficiency\":{\"gemm\":0.5,\"gem\":1}", "efficiency.gem", TREX_EFORMAT},
        {",\"efficiency\":{\"gemm\":1.5}", "efficiency.gemm", TREX_ERANGE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[1024];
        snprintf(buf, sizeof buf, good, cases[i].extra);
        cJSON *j = cJSON_Parse(buf);
        TREX_ASSERT(j);
        trex_cluster cl;
        trex_err err = {0};
        trex_code rc = trex_plan_cluster_from_json(&cl, j, "test.json", &err);
        CHECK(rc == cases[i].code, "case %zu: code %d (%s)", i, (int)rc, err.msg);
        if (cases[i].expect)
            CHECK(strstr(err.msg, cases[i].expect) && strstr(err.msg, "test.json"),
                  "message names file and field: %s", err.msg);
        cJSON_Delete(j);
    }
    cJSON *j = cJSON_Parse("{\"name\":\"x\",\"device\":\"d\"}");
    trex_cluster cl;
    trex_err err = {0};
    CHECK(trex_plan_cluster_from_json(&cl, j, "t.json", &err) == TREX_ENOTFOUND &&
              strstr(err.msg, "peak_bf16_tflops"), "missing field named: %s", err.msg);
    cJSON_Delete(j);
}

static void test_flops_convention(void)
{
    printf("FLOP convention (PLANNER.md §3.1):\n");
    trex_plan_model *q = load_model("configs/hf/qwen3-235b-a22b.json", 4096);
    if (q) {
        CHECK_NEAR(q->model_flops_per_token / 1.4803e11, 1.0, 2e-4, "Qwen3-235B FLOPs/token 1.48e11");
        CHECK_NEAR(q->p_total / 1e9, 235.09, 0.05, "Qwen3-235B parameters");
        CHECK_NEAR(q->p_active / 1e9, 21.6, 0.3, "Qwen3-235B active parameters (22B)");
        /* the published TFLOPS follow from the published step times exactly */
        const double steps[4] = {19.7, 17.6, 24.2, 29.0}, tf[4] = {245, 276, 200, 167};
        for (int i = 0; i < 4; i++) {
            double t = q->model_flops_per_token * 2048.0 * 4096.0 / 256.0 / steps[i] / 1e12;
            printf("  V1 variant %c: %.1f TFLOPS from %.1f s (published %.0f)\n", 'a' + i, t, steps[i], tf[i]);
            /* published step times are rounded to 0.1 s; (a) is 0.5% off even after that
             * (PLANNER.md §0.2 found the same 246 vs 245): allow 0.6% */
            double slack = fmax(t * 0.05 / steps[i] + 0.5, 0.006 * tf[i]);
            CHECK(fabs(t - tf[i]) <= slack, "V1 %c TFLOPS %.1f vs %.0f", 'a' + i, t, tf[i]);
        }
        free(q);
    }
    trex_plan_model *v3 = load_model("configs/hf/deepseek-v3.json", 4096);
    if (v3) {
        CHECK_NEAR(v3->model_flops_per_token / 2.5999e11, 1.0, 2e-4, "DeepSeek-V3 FLOPs/token 2.60e11");
        CHECK_NEAR(v3->p_total / 1e9, 671.0, 1.0, "DeepSeek-V3 parameters (671B)");
        CHECK_NEAR(v3->p_active / 1e9, 37.0, 1.0, "DeepSeek-V3 active parameters (37B)");
        free(v3);
    }
    trex_plan_model *f = load_model("configs/deepseek-v4-flash.json", 4096);
    if (f) { /* parameters come from trex_layout_build: MODEL_SPEC §1.3 */
        CHECK_NEAR(f->p_total / 1e9, 284.33, 0.01, "V4-Flash total parameters");
        CHECK_NEAR(f->p_mtp / 1e9, 6.61, 0.01, "V4-Flash MTP parameters");
        CHECK_NEAR(f->p_active / 1e9, 13.27, 0.01, "V4-Flash active parameters");
        CHECK(f->blocks[0].attn == TREX_PLAN_ATTN_SWA && f->blocks[2].attn == TREX_PLAN_ATTN_CSA &&
                  f->blocks[3].attn == TREX_PLAN_ATTN_HCA && f->blocks[43].mtp,
              "V4-Flash layer schedule");
        /* sparse attention costs less than dense causal attention at 64K */
        trex_plan_model *f64 = load_model("configs/deepseek-v4-flash.json", 65536);
        if (f64) {
            double dense = 2.0 * 64 * 2.0 * 512 * 65536 / 2.0;
            CHECK(f64->blocks[2].f_core < 0.1 * dense, "CSA core %.3g vs dense %.3g",
                  f64->blocks[2].f_core, dense);
            free(f64);
        }
        printf("  V4-Flash: %.4g model FLOPs/token at 4K (6 x active = %.4g)\n",
               f->model_flops_per_token, 6.0 * f->p_active);
        free(f);
    }
    trex_plan_model *p = load_model("configs/deepseek-v4-pro.json", 4096);
    if (p) {
        CHECK_NEAR(p->p_total / 1e9, 1572.997, 0.01, "V4-Pro total parameters");
        CHECK_NEAR(p->p_active / 1e9, 48.85, 0.01, "V4-Pro active parameters");
        free(p);
    }
}

static void test_layout_rules(void)
{
    trex_plan_layout l;
    trex_err err = {0};
    trex_plan_layout_unset(&l);
    CHECK(trex_plan_layout_parse(&l, "tp=1,pp=4,vpp=1,ep=32,cp=1,zero=1,recompute=full,"
                                     "swap_optimizer=1,mbs=1", &err) == TREX_OK, "%s", err.msg);
    CHECK(l.tp == 1 && l.pp == 4 && l.ep == 32 && l.recompute == TREX_RECOMPUTE_FULL &&
              l.swap_optimizer == 1 && l.dp == -1 && l.schedule == -1, "parsed fields");
    CHECK(trex_plan_layout_parse(&l, "tp=1,bogus=3", &err) == TREX_EINVAL && strstr(err.msg, "bogus"),
          "unknown key: %s", err.msg);
    CHECK(trex_plan_layout_parse(&l, "tp=-1", &err) == TREX_EINVAL, "negative value");
    CHECK(trex_plan_layout_parse(&l, "recompute=most", &err) == TREX_EINVAL, "bad recompute");

    trex_plan_model *m = load_model("configs/deepseek-v4-flash.json", 4096);
    trex_cluster cl;
    if (!m || !load_cluster(&cl, "ascend-910c-a3")) {
        free(m);
        return;
    }
    trex_plan_run run;
    trex_plan_run_defaults(&run);
    run.devices = 130, run.gbs = 128;
    trex_plan_layout x;
    trex_plan_layout_unset(&x);
    trex_plan_layout_parse(&x, "tp=1,pp=4,vpp=1,ep=32,cp=1,zero=1,recompute=full,swap_optimizer=1,"
                               "mbs=1,schedule=1f1b,a2a_overlap=0,dispatcher=deepep", &err);
    trex_plan_result *r = malloc(sizeof *r);
    TREX_ASSERT(r);
    CHECK(trex_plan_evaluate(m, &cl, &run, &x, r, &err) == TREX_EINVAL &&
              strstr(err.msg, "not divisible"), "130 devices: %s", err.msg);
    run.devices = 128, run.gbs = 100;
    CHECK(trex_plan_evaluate(m, &cl, &run, &x, r, &err) == TREX_EINVAL && strstr(err.msg, "--gbs"),
          "gbs: %s", err.msg);
    run.gbs = 128;
    x.ep = 3;
    CHECK(trex_plan_evaluate(m, &cl, &run, &x, r, &err) == TREX_EINVAL && strstr(err.msg, "ep=3"),
          "ep: %s", err.msg);
    x.ep = 32;
    CHECK(trex_plan_evaluate(m, &cl, &run, &x, r, &err) == TREX_OK, "%s", err.msg);
    /* the runtime's per-region memory agrees with the evaluation's worst rank */
    double bytes[TREX_MEM_COUNT], total = 0;
    CHECK(trex_plan_memory(m, &cl, &run, &x, -1, bytes, &err) == TREX_OK, "%s", err.msg);
    for (int i = 0; i < TREX_MEM_COUNT; i++)
        total += bytes[i];
    CHECK_NEAR(total, r->mem_total, 1.0, "trex_plan_memory total");
    CHECK(r->mem[TREX_MEM_RESERVED] == cl.reserved_gib * GIB, "reserved region");
    /* monotonic: less recompute keeps more activations; ZeRO-1 shards the optimizer; swap frees it */
    double act_full = r->mem[TREX_MEM_ACTIVATIONS], opt_swap = r->mem[TREX_MEM_OPTIMIZER];
    double step_full = r->step_s;
    x.recompute = TREX_RECOMPUTE_NONE;
    trex_plan_evaluate(m, &cl, &run, &x, r, &err);
    CHECK(r->mem[TREX_MEM_ACTIVATIONS] > 2.0 * act_full, "recompute none %.3g vs full %.3g",
          r->mem[TREX_MEM_ACTIVATIONS], act_full);
    CHECK(r->step_s < step_full, "no recompute is faster");
    x.swap_optimizer = 0;
    trex_plan_evaluate(m, &cl, &run, &x, r, &err);
    double opt_z1 = r->mem[TREX_MEM_OPTIMIZER];
    CHECK(opt_z1 > 10.0 * opt_swap, "swap moves the optimizer state to the host");
    x.zero = 0;
    trex_plan_evaluate(m, &cl, &run, &x, r, &err);
    CHECK(r->mem[TREX_MEM_OPTIMIZER] > opt_z1, "ZeRO-0 keeps the whole optimizer state");
    free(r);
    free(m);
}

static void test_search(void)
{
    trex_plan_model *m = load_model("configs/deepseek-v4-flash.json", 4096);
    trex_cluster cl;
    if (!m || !load_cluster(&cl, "ascend-910c-a3")) {
        free(m);
        return;
    }
    trex_plan_run run;
    trex_plan_run_defaults(&run);
    run.devices = 128, run.gbs = 128, run.optimizer = TREX_OPT_MUON;
    trex_plan_layout fixed;
    trex_plan_layout_unset(&fixed);
    fixed.tp = 1; /* keep the test short */
    trex_plan_search_out so;
    trex_err err = {0};
    CHECK(trex_plan_search(m, &cl, &run, &fixed, 50, &so, &err) == TREX_OK, "%s", err.msg);
    if (so.n_best > 0) {
        CHECK(so.best[0].feasible, "V4-Flash fits 128 dies");
        bool sorted = true;
        for (int64_t i = 1; i < so.n_best; i++)
            if (so.best[i].feasible && so.best[i].step_s < so.best[i - 1].step_s)
                sorted = false;
        CHECK(sorted, "feasible layouts ranked by step time");
        CHECK(so.best[0].lay.tp == 1, "fixed key kept");
        CHECK(so.n_points > 100, "search space has %lld points", (long long)so.n_points);
        for (int64_t i = 0; i < so.n_best; i++)
            CHECK(!so.best[i].feasible || so.best[i].mem_total <= cl.hbm_gib * GIB, "feasible fits");
    }
    trex_plan_search_free(&so);
    free(m);
    /* V4-Pro on 8 dies fits nowhere: every candidate infeasible, smallest reported */
    m = load_model("configs/deepseek-v4-pro.json", 4096);
    if (!m)
        return;
    run.devices = 8, run.gbs = 8;
    trex_plan_layout_unset(&fixed);
    CHECK(trex_plan_search(m, &cl, &run, &fixed, 10, &so, &err) == TREX_OK, "%s", err.msg);
    CHECK(so.n_best > 0 && !so.best[0].feasible, "V4-Pro does not fit 8 dies");
    CHECK(so.smallest.mem_total > 64.0 * GIB && so.smallest.mem[TREX_MEM_WEIGHTS] > 0, "smallest");
    trex_plan_search_free(&so);
    free(m);
}

/* PLANNER.md §6. The H100 efficiency constants (layer_overhead_us, a2a_hide, gemm_half_rows) were
 * fitted on V1 (docs/planner.md "Calibration"); V2 and V3 use the same software constants on other
 * hardware, so they are predictions. */
static void test_validation(void)
{
    printf("Validation against published runs (PLANNER.md §6):\n");
    trex_plan_result *r = malloc(sizeof *r);
    TREX_ASSERT(r);
    trex_plan_run run;
    trex_cluster cl;
    trex_plan_model *q = load_model("configs/hf/qwen3-235b-a22b.json", 4096);
    if (q && load_cluster(&cl, "h100")) {
        trex_plan_run_defaults(&run);
        run.devices = 256, run.gbs = 2048;
        const char *lays[4] = {
            "tp=2,pp=8,vpp=4,ep=32,cp=1,zero=1,recompute=selective,mbs=1,a2a_overlap=0",
            "tp=2,pp=8,vpp=4,ep=32,cp=1,zero=1,recompute=selective,mbs=1,a2a_overlap=1",
            "tp=2,pp=32,vpp=3,ep=8,cp=1,zero=1,recompute=selective,mbs=1,a2a_overlap=0,"
            "dispatcher=alltoall",
            "tp=4,pp=8,vpp=4,ep=8,cp=1,zero=1,recompute=none,mbs=1,a2a_overlap=0"};
        const double ref[4] = {19.7, 17.6, 24.2, 29.0};
        double got[4] = {0};
        const char *names[4] = {"V1a Qwen3-235B TP2 PP8 VPP4 EP32 step s", "V1b + 1F1B A2A overlap step s",
                                "V1c A2A dispatcher PP32 VPP3 step s", "V1d TP4 PP8 EP8 no recompute step s"};
        for (int i = 0; i < 4; i++) {
            if (!eval(q, &cl, &run, lays[i], r))
                continue;
            got[i] = r->step_s;
            report(names[i], r->step_s, ref[i], 0.15);
            CHECK(r->feasible, "V1 %c fits 80 GB (%.1f GiB)", 'a' + i, r->mem_total / GIB);
        }
        CHECK(got[1] < got[0] && got[0] < got[2] && got[2] < got[3],
              "V1 order b < a < c < d: %.2f %.2f %.2f %.2f", got[1], got[0], got[2], got[3]);
    }
    free(q);
    trex_plan_model *v3 = load_model("configs/hf/deepseek-v3.json", 4096);
    if (v3 && load_cluster(&cl, "gb200-nvl72")) {
        trex_plan_run_defaults(&run);
        run.devices = 256, run.gbs = 2048, run.fp8 = true;
        /* Megatron pipeline layout Et|(tt|)*30L: 1 layer with the embedding, the loss (and MTP)
         * alone in the last chunk */
        if (eval(v3, &cl, &run, "tp=1,pp=8,vpp=4,ep=32,cp=1,zero=1,recompute=selective,mbs=1,"
                                "a2a_overlap=0,first=1,last=0", r)) {
            report("V2 DeepSeek-V3 on 256 GB200 step s (970 TF)", r->step_s,
                   r->model_flops_step / 256.0 / 970e12, 0.15);
            CHECK(r->feasible, "V2 fits (%.1f GiB)", r->mem_total / GIB);
        }
    }
    if (v3 && load_cluster(&cl, "h800")) {
        trex_plan_run_defaults(&run);
        run.devices = 2048, run.gbs = 15360, run.fp8 = true;
        if (eval(v3, &cl, &run, "tp=1,pp=16,vpp=1,ep=64,cp=1,zero=1,recompute=selective,mbs=1,"
                                "schedule=dualpipe", r)) {
            /* 180K H800-hours per trillion tokens -> 1,543 tokens/s/GPU -> 19.9 s per step */
            double ref = 15360.0 * 4096.0 / (1e12 / (180e3 * 3600.0)) / 2048.0;
            report("V3 DeepSeek-V3 on 2048 H800 step s", r->step_s, ref, 0.15);
            printf("  V3 memory per device %.1f GiB (H800: 80 GiB; see docs/planner.md)\n",
                   r->mem_total / GIB);
        }
    }
    free(v3);
    trex_plan_model *f = load_model("configs/deepseek-v4-flash.json", 4096);
    if (f && load_cluster(&cl, "ascend-910c-a3")) {
        trex_plan_run_defaults(&run);
        run.devices = 256, run.gbs = 1024, run.optimizer = TREX_OPT_ADAMW;
        if (eval(f, &cl, &run, "tp=2,pp=2,vpp=2,ep=128,cp=1,zero=1,recompute=full,swap_optimizer=1,"
                               "mbs=1,a2a_overlap=1", r)) {
            printf("  V7 V4-Flash recipe (256 dies, TP2 PP2 VPP2 EP128): %.1f GiB per die, %.2f s, "
                   "MFU %.1f%%\n", r->mem_total / GIB, r->step_s, 100.0 * r->mfu);
            CHECK(r->feasible && r->mem_total <= 64.0 * GIB, "V7 fits 64 GB per die");
        }
        run.devices = 128, run.gbs = 128;
        if (eval(f, &cl, &run, "tp=1,pp=4,vpp=1,ep=32,cp=1,zero=1,recompute=full,swap_optimizer=1,mbs=1", r)) {
            printf("  V7 fine-tune recipe (128 dies, TP1 PP4 EP32): %.1f GiB per die\n", r->mem_total / GIB);
            CHECK(r->feasible, "V7 fine-tune recipe fits 64 GB per die");
        }
    }
    free(f);
    trex_plan_model *k2 = load_model("configs/hf/kimi-k2.json", 4096);
    if (k2 && load_cluster(&cl, "gb300-nvl72")) {
        trex_plan_run_defaults(&run);
        run.devices = 256, run.gbs = 4096; /* seq and batch not published: assumed */
        const char *lay = "tp=1,pp=4,vpp=1,ep=64,cp=1,zero=1,recompute=selective,mbs=1";
        double tf[2] = {0, 0};
        for (int o = 0; o < 2; o++) {
            run.optimizer = o ? TREX_OPT_MUON : TREX_OPT_ADAMW;
            if (eval(k2, &cl, &run, lay, r))
                tf[o] = r->tflops_per_device;
        }
        printf("  V8 Kimi K2 on 256 GB300: AdamW %.0f TF, Muon %.0f TF (published 1051 / 1080)\n", tf[0],
               tf[1]);
        if (tf[0] > 0)
            report("V8 Muon / AdamW TFLOPS ratio", tf[1] / tf[0], 1080.0 / 1051.0, 0.05);
    }
    free(k2);
    free(r);
}

/* The fp32 reference engine (src/plan/engine.c): parameters and gradients are the layout's buffers,
 * optimizer state is trex_optimizer_state_bytes, the arena replay behaves (monotone in the batch,
 * chunks of 64 MiB, the used bytes 64-byte granular), the cluster's "engine"/"fp32_ref" fields are
 * validated, and trex_plan_evaluate on the local cluster takes the engine's path. The comparison with
 * real runs is tests/test_plan_local.sh. */
static void test_fp32_engine(void)
{
    trex_config cfg;
    trex_err err = {0};
    if (trex_config_load(&cfg, "configs/dsv4-tiny.json", &err) != TREX_OK) {
        CHECK(false, "loading dsv4-tiny: %s", err.msg);
        return;
    }
    trex_layout lay;
    TREX_ASSERT(trex_layout_build(&lay, &cfg, &err) == TREX_OK);
    trex_plan_fp32_run r;
    trex_plan_fp32_run_defaults(&r);
    r.B = 1, r.T = 128;
    trex_plan_fp32_result a, b;
    CHECK(trex_plan_fp32_evaluate(&cfg, NULL, &r, &a, &err) == TREX_OK, "evaluate: %s", err.msg);
    CHECK(a.params == (double)lay.n_float * 4.0 + (double)lay.n_int * 4.0, "params = the layout's buffers");
    CHECK(a.grads == (double)lay.n_float * 4.0, "grads = n_float floats");
    CHECK(a.optim == (double)trex_optimizer_state_bytes(&lay, TREX_OPTIM_ADAMW), "AdamW state bytes");
    r.optimizer = TREX_OPT_MUON;
    CHECK(trex_plan_fp32_evaluate(&cfg, NULL, &r, &b, &err) == TREX_OK, "evaluate muon: %s", err.msg);
    CHECK(b.optim == (double)trex_optimizer_state_bytes(&lay, TREX_OPTIM_MUON) && b.optim < a.optim,
          "Muon state bytes (%.0f) below AdamW (%.0f)", b.optim, a.optim);
    CHECK(fmod(a.acts_end, 64.0) == 0 && fmod(a.acts_peak, 64.0) == 0, "arena bytes are 64-byte blocks");
    CHECK(a.acts_kept <= a.acts_end && a.acts_end <= a.acts_peak && a.acts_peak <= a.acts_reserved,
          "kept %.0f <= end %.0f <= peak %.0f <= reserved %.0f", a.acts_kept, a.acts_end, a.acts_peak,
          a.acts_reserved);
    CHECK(fmod(a.acts_reserved, 64.0 * 1048576.0) == 0, "a small pass reserves whole 64 MiB chunks");
    CHECK(a.head_chunk == 128.0 * 4096.0 * 4.0, "head chunk: all 128 rows of 4096 logits (%.0f)",
          a.head_chunk);
    r.optimizer = TREX_OPT_ADAMW;
    r.T = 256;
    CHECK(trex_plan_fp32_evaluate(&cfg, NULL, &r, &b, &err) == TREX_OK, "evaluate T=256");
    CHECK(b.acts_kept > 1.8 * a.acts_kept - 4e6 && b.acts_kept < 2.2 * a.acts_kept,
          "activations about linear in T: %.0f at 128, %.0f at 256", a.acts_kept, b.acts_kept);
    r.backward = false;
    r.T = 128;
    CHECK(trex_plan_fp32_evaluate(&cfg, NULL, &r, &b, &err) == TREX_OK, "evaluate forward only");
    CHECK(b.grads == 0 && b.acts_peak < a.acts_peak, "a forward pass keeps less and has no gradients");
    r.backward = true;
    r.T = 1;
    CHECK(trex_plan_fp32_evaluate(&cfg, NULL, &r, &b, &err) == TREX_EINVAL, "T=1 refused");

    /* cluster fields */
    trex_cluster local;
    if (load_cluster(&local, "local")) {
        CHECK(local.engine == TREX_ENGINE_FP32_REF, "local.json runs the fp32 engine");
        CHECK(local.fp32.threads >= 1 && local.fp32.gemm_gflops > 0 && local.fp32.baseline_mib > 0,
              "local.json has measured fp32_ref rates");
        /* with rates: times are positive and the GEMMs dominate dsv4-tiny */
        r.T = 128;
        CHECK(trex_plan_fp32_evaluate(&cfg, &local.fp32, &r, &b, &err) == TREX_OK, "with rates");
        CHECK(b.fwd_s > 0 && b.bwd_s > 0 && b.t[0][TREX_FP32_GEMM] > 0.5 * b.fwd_s,
              "times: forward %.3f s (GEMM %.3f s), backward %.3f s", b.fwd_s, b.t[0][TREX_FP32_GEMM],
              b.bwd_s);
        CHECK(b.rss_peak > b.params + b.grads_resident + b.acts_resident, "RSS includes the baseline");
    }
    const char *base = "{\"name\":\"x\",\"device\":\"d\",\"peak_bf16_tflops\":1,\"peak_fp8_tflops\":0,"
                       "\"hbm_gib\":20,\"hbm_bw_gbs\":5,\"devices_per_node\":1,\"scaleup_domain\":1,"
                       "\"scaleup_bw_gbs\":1,\"scaleup_latency_us\":1,\"scaleout_bw_gbs\":1,"
                       "\"scaleout_latency_us\":1,\"host_mem_gib\":0,\"host_bw_gbs\":1,"
                       "\"reserved_gib\":0.01%s}";
    struct {
        const char *extra, *expect;
        trex_code code;
    } cases[] = {
        {",\"engine\":\"fp32-ref\"", "fp32_ref", TREX_ENOTFOUND},
        {",\"engine\":\"cuda\"", "\"engine\"", TREX_EFORMAT},
        {",\"fp32_ref\":{\"threads\":2}", "fp32_ref.serial_share", TREX_ENOTFOUND},
        {",\"fp32_ref\":{\"threadz\":2}", "fp32_ref.threadz", TREX_EFORMAT},
        {",\"engine\":\"generic\"", NULL, TREX_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[1024];
        snprintf(buf, sizeof buf, base, cases[i].extra);
        cJSON *j = cJSON_Parse(buf);
        TREX_ASSERT(j);
        trex_cluster cl;
        trex_err e = {0};
        trex_code rc = trex_plan_cluster_from_json(&cl, j, "t.json", &e);
        CHECK(rc == cases[i].code, "case %zu: code %d, want %d (%s)", i, rc, cases[i].code, e.msg);
        if (cases[i].expect)
            CHECK(strstr(e.msg, cases[i].expect) != NULL, "case %zu: message names %s: %s", i,
                  cases[i].expect, e.msg);
        cJSON_Delete(j);
    }

    /* the planner on the local cluster: the engine's regions; one process only */
    trex_plan_model *m = load_model("configs/dsv4-tiny.json", 128);
    if (m && local.engine == TREX_ENGINE_FP32_REF) {
        trex_plan_run run;
        trex_plan_run_defaults(&run);
        run.devices = 1, run.seq = 128, run.gbs = 4;
        trex_plan_result res;
        if (eval(m, &local, &run, "tp=1,pp=1,vpp=1,ep=1,cp=1,zero=0,recompute=none,mbs=2", &res)) {
            CHECK(res.has_fp32 && res.m == 2, "fp32 path, 2 micro-batches");
            CHECK(res.mem[TREX_MEM_WEIGHTS] == (double)lay.n_float * 4.0 + (double)lay.n_int * 4.0,
                  "weights region = params");
            CHECK(res.mem[TREX_MEM_OPTIMIZER] == (double)trex_optimizer_state_bytes(&lay, TREX_OPTIM_ADAMW),
                  "optimizer region");
            CHECK(fabs(res.step_s - (2.0 * (res.fp32.fwd_s + res.fp32.bwd_s) + res.t_optimizer)) < 1e-9,
                  "step = 2 micro-batches + optimizer");
            double bytes[TREX_MEM_COUNT];
            trex_plan_layout l;
            trex_plan_layout_unset(&l);
            TREX_ASSERT(trex_plan_layout_parse(&l, "tp=1,pp=1,vpp=1,ep=1,cp=1,zero=0,recompute=none,"
                                                   "swap_optimizer=0,mbs=2,schedule=1f1b,a2a_overlap=0",
                                               &err) == TREX_OK);
            l.dedup = 1;
            CHECK(trex_plan_memory(m, &local, &run, &l, -1, bytes, &err) == TREX_OK, "memory: %s", err.msg);
            for (int i = 0; i < TREX_MEM_COUNT; i++)
                CHECK(bytes[i] == res.mem[i], "trex_plan_memory region %s agrees", trex_plan_mem_name(i));
        }
        trex_plan_result full;
        if (eval(m, &local, &run, "tp=1,pp=1,vpp=1,ep=1,cp=1,zero=0,recompute=full,mbs=2", &full))
            CHECK(full.mem[TREX_MEM_ACTIVATIONS] < res.mem[TREX_MEM_ACTIVATIONS] &&
                      full.fp32.bwd_s > res.fp32.bwd_s && full.fp32.fwd_s == res.fp32.fwd_s,
                  "recompute=full: fewer activations (%.0f < %.0f bytes), a longer backward",
                  full.mem[TREX_MEM_ACTIVATIONS], res.mem[TREX_MEM_ACTIVATIONS]);
        trex_plan_result bad;
        trex_plan_layout l;
        trex_plan_layout_unset(&l);
        TREX_ASSERT(trex_plan_layout_parse(&l, "tp=1,pp=1,vpp=1,ep=1,cp=1,zero=0,recompute=selective,"
                                               "swap_optimizer=0,mbs=2,schedule=1f1b,a2a_overlap=0",
                                           &err) == TREX_OK);
        l.dedup = 1;
        CHECK(trex_plan_evaluate(m, &local, &run, &l, &bad, &err) == TREX_EINVAL &&
                  strstr(err.msg, "recompute=none, attention, moe"),
              "recompute=selective refused: %s", err.msg);
        run.devices = 2;
        l.recompute = TREX_RECOMPUTE_NONE;
        CHECK(trex_plan_evaluate(m, &local, &run, &l, &bad, &err) == TREX_EINVAL &&
                  strstr(err.msg, "--devices 1"),
              "two devices refused: %s", err.msg);
    }
    free(m);
    trex_plan_model *q = load_model("configs/hf/qwen3-235b-a22b.json", 4096);
    if (q && local.engine == TREX_ENGINE_FP32_REF) {
        trex_plan_run run;
        trex_plan_run_defaults(&run);
        run.devices = 1, run.seq = 4096, run.gbs = 1;
        trex_plan_layout l;
        trex_plan_layout_unset(&l);
        TREX_ASSERT(trex_plan_layout_parse(&l, "tp=1,pp=1,vpp=1,ep=1,cp=1,zero=0,recompute=none,"
                                               "swap_optimizer=0,mbs=1,schedule=1f1b,a2a_overlap=0",
                                           &err) == TREX_OK);
        l.dedup = 1;
        trex_plan_result bad;
        CHECK(trex_plan_evaluate(q, &local, &run, &l, &bad, &err) == TREX_EUNSUPPORTED,
              "a Hugging Face model on the fp32 engine is refused: %s", err.msg);
    }
    free(q);
    trex_layout_free(&lay);
}

/* Checks one simulated timeline: per rank the ops do not overlap, every (chunk, micro-batch) has one
 * forward and one backward (a split backward: an input part and a later weight part), every op starts
 * after its inputs (the previous stage's forward, the next stage's backward). Returns the makespan. */
static double check_timeline(const trex_plan_timeline *tl, const char *what)
{
    int64_t p = tl->ranks, v = tl->chunks, m = tl->m, S = p * v;
    double *fe = calloc((size_t)(S * m), sizeof *fe), *be = calloc((size_t)(S * m), sizeof *be);
    int *nf = calloc((size_t)(S * m), sizeof *nf), *nb = calloc((size_t)(S * m), sizeof *nb);
    TREX_ASSERT(fe && be && nf && nb);
    bool dpv = tl->schedule == TREX_SCHED_DUALPIPEV;
#define STAGE(r, c) (dpv ? ((c) == 0 ? (r) : 2 * p - 1 - (r)) : (c) * p + (r))
    int bad_overlap = 0, bad_dep = 0;
    for (int64_t r = 0; r < p; r++)
        for (int64_t i = tl->rank_first[r]; i < tl->rank_first[r + 1]; i++) {
            const trex_plan_op *o = &tl->ops[i];
            if (i > tl->rank_first[r] && o->start < tl->ops[i - 1].end - 1e-12)
                bad_overlap++;
            int64_t st = STAGE(r, o->chunk);
            if (o->kind == TREX_OP_F || o->kind == TREX_OP_FB) {
                nf[st * m + o->mb]++;
                fe[st * m + o->mb] = o->end;
            }
            if (o->kind == TREX_OP_B || o->kind == TREX_OP_BI || o->kind == TREX_OP_FB) {
                int64_t sb = o->kind == TREX_OP_FB ? STAGE(r, o->chunk_b) : st;
                int64_t mb = o->kind == TREX_OP_FB ? o->mb_b : o->mb;
                nb[sb * m + mb]++;
                be[sb * m + mb] = o->end;
            }
        }
    /* dependencies, from the recorded end times */
    for (int64_t r = 0; r < p; r++)
        for (int64_t i = tl->rank_first[r]; i < tl->rank_first[r + 1]; i++) {
            const trex_plan_op *o = &tl->ops[i];
            int64_t st = STAGE(r, o->chunk);
            if ((o->kind == TREX_OP_F || o->kind == TREX_OP_FB) && st > 0 &&
                o->start < fe[(st - 1) * m + o->mb] - 1e-12)
                bad_dep++;
            if (o->kind == TREX_OP_B || o->kind == TREX_OP_BI || o->kind == TREX_OP_FB) {
                int64_t sb = o->kind == TREX_OP_FB ? STAGE(r, o->chunk_b) : st;
                int64_t mb = o->kind == TREX_OP_FB ? o->mb_b : o->mb;
                double need = sb == S - 1 ? fe[sb * m + mb] : be[(sb + 1) * m + mb];
                if (o->start < need - 1e-12 || o->start < fe[sb * m + mb] - 1e-12 - (o->kind == TREX_OP_FB ? 1e30 : 0))
                    bad_dep++;
            }
            if (o->kind == TREX_OP_W && o->start < be[st * m + o->mb] - 1e-12)
                bad_dep++;
        }
#undef STAGE
    int bad_count = 0;
    for (int64_t i = 0; i < S * m; i++)
        bad_count += nf[i] != 1 || nb[i] != 1;
    CHECK(bad_overlap == 0, "%s: %d ops overlap on their rank", what, bad_overlap);
    CHECK(bad_dep == 0, "%s: %d ops start before their inputs", what, bad_dep);
    CHECK(bad_count == 0, "%s: %d (stage, micro-batch) pairs without exactly one F and one B", what, bad_count);
    free(fe), free(be), free(nf), free(nb);
    return tl->makespan;
}

/* The schedule simulator against the cost model's bubble formulas (uniform ranks): 1F1B (p-1)(F+B),
 * interleaved (p-1)(F+B)/v, DualPipeV (p-1)(F+B/2)/2 with F, B per rank over both chunks; and the
 * picture's timeline against the cost model's step on V1a (even stages, nothing hidden). */
static void test_schedule_sim(void)
{
    double f[64], b[64], c[64];
    trex_err err = {0};
    trex_plan_timeline tl;
    struct {
        int sched;
        int64_t p, v, m;
        double F, B, comm;
    } cases[] = {{TREX_SCHED_1F1B, 4, 1, 8, 1.3, 2.9, 0.25}, {TREX_SCHED_1F1B, 8, 1, 3, 1.3, 2.9, 0},
                 {TREX_SCHED_1F1B, 1, 1, 5, 1.3, 2.9, 0}, {TREX_SCHED_INTERLEAVED, 4, 2, 8, 1.3, 2.9, 0.25},
                 {TREX_SCHED_INTERLEAVED, 8, 3, 16, 1.3, 2.9, 0}, {TREX_SCHED_INTERLEAVED, 4, 4, 4, 1.3, 2.9, 0},
                 {TREX_SCHED_DUALPIPEV, 4, 2, 8, 1.3, 2.6, 0}, {TREX_SCHED_DUALPIPEV, 8, 2, 40, 1.3, 2.6, 0},
                 {TREX_SCHED_DUALPIPEV, 5, 2, 10, 1.3, 2.6, 0}, {TREX_SCHED_DUALPIPEV, 1, 2, 3, 1.3, 2.6, 0},
                 {TREX_SCHED_DUALPIPEV, 4, 2, 8, 1.3, 2.9, 0}, {TREX_SCHED_DUALPIPEV, 6, 2, 12, 1.0, 3.5, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t p = cases[k].p, v = cases[k].v, m = cases[k].m;
        double F = cases[k].F, B = cases[k].B, C = cases[k].comm;
        for (int64_t r = 0; r < p; r++)
            f[r] = F, b[r] = B, c[r] = C;
        trex_code rc = trex_plan_timeline_simulate(&tl, cases[k].sched, p, v, m, f, b, c, &err);
        CHECK(rc == TREX_OK, "simulate case %zu: %s", k, err.msg);
        if (rc != TREX_OK)
            continue;
        char what[128];
        snprintf(what, sizeof what, "schedule %d p=%lld v=%lld m=%lld F=%g B=%g", cases[k].sched, (long long)p,
                 (long long)v, (long long)m, F, B);
        double span = check_timeline(&tl, what);
        double Fx = F + C / 2, Bx = B + C / 2, bubble;
        if (cases[k].sched == TREX_SCHED_1F1B)
            bubble = (double)(p - 1) * (Fx + Bx);
        else if (cases[k].sched == TREX_SCHED_INTERLEAVED)
            bubble = (double)(p - 1) * (Fx + Bx) / (double)v;
        else if (B == 2 * F)
            bubble = (double)(p - 1) * (Fx + Bx / 2) / 2; /* the cost model's (DualPipe README) formula */
        else
            bubble = -1; /* B != 2F: the formula is an approximation (docs/planner.md); report both */
        if (bubble < 0) {
            double formula = (double)(p - 1) * (Fx + Bx / 2) / 2, sim_b = span - (double)m * (Fx + Bx);
            printf("  %s: simulated bubble %.4g, cost model formula %.4g (%+.1f%%)\n", what, sim_b, formula,
                   100.0 * (formula / sim_b - 1.0));
            CHECK(sim_b > 0 && sim_b < 2 * formula, "%s: simulated bubble %.4g", what, sim_b);
        } else {
            CHECK_NEAR(span, (double)m * (Fx + Bx) + bubble, 1e-9 * span, what);
        }
        CHECK_NEAR(tl.work_max, (double)m * (Fx + Bx), 1e-9 * span, what);
        trex_plan_timeline_free(&tl);
    }
    /* uneven ranks: never shorter than the busiest rank plus the fill of the others */
    for (int r = 0; r < 4; r++)
        f[r] = 1.0 + r, b[r] = 2.0 + 0.5 * r, c[r] = 0.1;
    if (trex_plan_timeline_simulate(&tl, TREX_SCHED_1F1B, 4, 1, 8, f, b, c, &err) == TREX_OK) {
        double span = check_timeline(&tl, "1F1B uneven");
        CHECK(span >= 8 * (4.0 + 3.5 + 0.1) + 1.0 + 2.0 + 3.0 - 1e-9, "1F1B uneven: makespan %.3f", span);
        trex_plan_timeline_free(&tl);
    }
    /* what the simulator refuses */
    CHECK(trex_plan_timeline_simulate(&tl, TREX_SCHED_DUALPIPEV, 4, 2, 7, f, b, c, &err) == TREX_EINVAL &&
          strstr(err.msg, "DualPipeV needs"), "DualPipeV with m < 2p: %s", err.msg);
    CHECK(trex_plan_timeline_simulate(&tl, TREX_SCHED_INTERLEAVED, 4, 2, 6, f, b, c, &err) == TREX_EINVAL,
          "interleaved with m not a multiple of p");
    CHECK(trex_plan_timeline_simulate(&tl, TREX_SCHED_DUALPIPE, 4, 1, 8, f, b, c, &err) == TREX_EINVAL,
          "DualPipe is not simulated");

    /* V1a (Qwen3-235B, 256 H100, TP2 PP8 VPP4, 128 micro-batches): the simulated pipeline plus the
     * end of the step equals the cost model's step (even stages, no hidden all-to-all) */
    trex_plan_result *res = malloc(sizeof *res);
    trex_plan_model *q = load_model("configs/hf/qwen3-235b-a22b.json", 4096);
    trex_cluster cl;
    if (res && q && load_cluster(&cl, "h100")) {
        trex_plan_run run;
        trex_plan_run_defaults(&run);
        run.devices = 256, run.gbs = 2048;
        if (eval(q, &cl, &run, "tp=2,pp=8,vpp=4,ep=32,cp=1,zero=1,recompute=selective,mbs=1,a2a_overlap=0", res)) {
            trex_code rc = trex_plan_timeline_simulate(&tl, (int)res->lay.schedule, res->n_stages, res->lay.vpp,
                                                       res->m, res->stage_f, res->stage_b, res->stage_comm, &err);
            CHECK(rc == TREX_OK, "V1a timeline: %s", err.msg);
            if (rc == TREX_OK) {
                double step = check_timeline(&tl, "V1a") + res->t_pp + res->t_dp + res->t_optimizer + res->t_swap;
                printf("  V1a timeline: simulated step %.3f s, cost model %.3f s (%+.2f%%)\n", step, res->step_s,
                       100.0 * (step / res->step_s - 1.0));
                CHECK_NEAR(step / res->step_s, 1.0, 0.01, "V1a simulated step / cost model step");
                trex_plan_timeline_free(&tl);
            }
        }
    }
    free(q);
    free(res);
}

int main(void)
{
    test_clusters();
    test_flops_convention();
    test_layout_rules();
    test_search();
    test_validation();
    test_fp32_engine();
    test_schedule_sim();
    return check_summary();
}
