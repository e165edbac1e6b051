/* src/plan/cluster.c — cluster descriptions (configs/clusters/NAME.json): loading and validation.
 *
 * Every field is required except "efficiency" members (documented defaults), "notes"/"sources"
 * (free text) and "measured". Unknown fields are an error naming the file and the field, so a typo
 * never silently falls back to a default. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "trex/io.h"
#include "trex/plan.h"

typedef struct field {
    const char *name;
    size_t off;      /* offset of a double or int64_t in trex_cluster / trex_plan_eff */
    int is_int;
    int required;
    double lo, hi;   /* allowed range (inclusive) */
} field;

#define CF(n, req, lo, hi) {#n, offsetof(trex_cluster, n), 0, req, lo, hi}
#define CI(n, req, lo, hi) {#n, offsetof(trex_cluster, n), 1, req, lo, hi}
#define EF(n, lo, hi) {#n, offsetof(trex_plan_eff, n), 0, 0, lo, hi}

static const field cluster_fields[] = {
    CF(peak_bf16_tflops, 1, 1e-6, 1e6),  CF(peak_fp8_tflops, 1, 0, 1e6),
    CF(hbm_gib, 1, 1e-3, 1e5),           CF(hbm_bw_gbs, 1, 1e-3, 1e6),
    CI(devices_per_node, 1, 1, 1e6),     CI(scaleup_domain, 1, 1, 1e7),
    CF(scaleup_bw_gbs, 1, 1e-3, 1e6),    CF(scaleup_latency_us, 1, 0, 1e6),
    CF(scaleout_bw_gbs, 1, 1e-3, 1e6),   CF(scaleout_latency_us, 1, 0, 1e6),
    CF(host_mem_gib, 1, 0, 1e7),         CF(host_bw_gbs, 1, 1e-3, 1e6),
    CF(reserved_gib, 1, 0, 1e4),
};

static const field eff_fields[] = {
    EF(gemm, 0.01, 1),         EF(gemm_fp8, 0.01, 1),    EF(grouped_gemm, 0.01, 1),
    EF(gemm_half_rows, 0, 1e6), EF(attention, 0.01, 1),  EF(memory, 0.01, 1),
    EF(collective, 0.01, 1),   EF(a2a_scaleup, 0.01, 1), EF(a2a_scaleout, 0.01, 1.5),
    EF(overlap, 0, 1),         EF(a2a_hide, 0, 1),      EF(layer_overhead_us, 0, 1e6),
};

#define RF(n, lo, hi) {#n, offsetof(trex_plan_fp32_rates, n), 0, 1, lo, hi}

/* "fp32_ref": every field required (bench/plan_local.sh writes them all) */
static const field fp32_fields[] = {
    RF(threads, 1, 4096),          RF(serial_share, 0.01, 1.5),   RF(speedup, 0.01, 4096),
    RF(gemm_gflops, 1e-3, 1e6),    RF(gemm_gflops_long, 1e-3, 1e6), RF(gemm_gflops_l3, 1e-3, 1e6),
    RF(gemm_gflops_mem, 1e-3, 1e6), RF(l3_kib, 1, 1e9),          RF(gemm_mr, 1, 1024),
    RF(gemm_nr, 1, 1024),          RF(gemm_nc, 1, 1 << 20),
    RF(gemm_k_l1, 1, 1e9),         RF(l2_kib, 1, 1e9),            RF(pack_a_ns, 0, 1e6),
    RF(pack_a_t_ns, 0, 1e6),       RF(pack_a_mem_ns, 0, 1e6),     RF(pack_a_t_mem_ns, 0, 1e6),
    RF(pack_b_ns, 0, 1e6),         RF(pack_b_t_ns, 0, 1e6),       RF(store_ns, 0, 1e6),
    RF(call_us, 0, 1e6),           RF(direct_gflops, 1e-3, 1e6),  RF(attn_gflops, 1e-3, 1e6),
    RF(exp_ns, 0, 1e6),            RF(mem_gbs, 1e-3, 1e6),        RF(mhc_fwd_ns, 0, 1e9),
    RF(mhc_bwd_ns, 0, 1e9),        RF(touch_gbs, 1e-3, 1e6),      RF(adam_ns, 0, 1e6),
    RF(baseline_mib, 0, 1e7),
};

#define NFIELDS(a) (sizeof(a) / sizeof((a)[0]))

/* Defaults for the efficiency block: generic values, see docs/planner.md "Calibration". */
static void eff_defaults(trex_plan_eff *e)
{
    e->gemm = 0.70;
    e->gemm_fp8 = 0.55;
    e->grouped_gemm = 0.65;
    e->gemm_half_rows = 128;
    e->attention = 0.45;
    e->memory = 0.70;
    e->collective = 0.75;
    e->a2a_scaleup = 0.60;
    e->a2a_scaleout = 0.85;
    e->overlap = 0.70;
    e->a2a_hide = 0.70;
    e->layer_overhead_us = 50;
}

static trex_code read_fields(void *base, const field *fs, size_t n, const cJSON *obj,
                             const char *label, const char *prefix, trex_err *err)
{
    for (size_t i = 0; i < n; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, fs[i].name);
        if (!it) {
            if (fs[i].required)
                return trex_err_set(err, TREX_ENOTFOUND,
                                    "%s: missing field \"%s%s\" (see docs/planner.md, cluster files)",
                                    label, prefix, fs[i].name);
            continue;
        }
        if (!cJSON_IsNumber(it))
            return trex_err_set(err, TREX_EFORMAT, "%s: field \"%s%s\" must be a number", label,
                                prefix, fs[i].name);
        double v = it->valuedouble;
        if (!isfinite(v) || v < fs[i].lo || v > fs[i].hi)
            return trex_err_set(err, TREX_ERANGE, "%s: field \"%s%s\" = %g is outside [%g, %g]",
                                label, prefix, fs[i].name, v, fs[i].lo, fs[i].hi);
        if (fs[i].is_int) {
            if (v != floor(v))
                return trex_err_set(err, TREX_EFORMAT, "%s: field \"%s%s\" must be an integer",
                                    label, prefix, fs[i].name);
            *(int64_t *)((char *)base + fs[i].off) = (int64_t)v;
        } else {
            *(double *)((char *)base + fs[i].off) = v;
        }
    }
    return TREX_OK;
}

static bool known(const field *fs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(fs[i].name, name))
            return true;
    return false;
}

static trex_code copy_string(char *dst, size_t len, const cJSON *obj, const char *key,
                             const char *label, trex_err *err)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it)
        return trex_err_set(err, TREX_ENOTFOUND, "%s: missing field \"%s\"", label, key);
    if (!cJSON_IsString(it) || !it->valuestring[0])
        return trex_err_set(err, TREX_EFORMAT, "%s: field \"%s\" must be a non-empty string", label,
                            key);
    snprintf(dst, len, "%s", it->valuestring);
    return TREX_OK;
}

trex_code trex_plan_cluster_from_json(trex_cluster *cl, const cJSON *json, const char *label,
                                      trex_err *err)
{
    memset(cl, 0, sizeof *cl);
    if (!cJSON_IsObject(json))
        return trex_err_set(err, TREX_EFORMAT, "%s: a cluster file is one JSON object", label);
    static const char *const text_fields[] = {"name", "device", "notes", "sources", "measured",
                                              "engine", "fp32_ref"};
    const cJSON *it;
    cJSON_ArrayForEach(it, json) {
        bool ok = known(cluster_fields, NFIELDS(cluster_fields), it->string) ||
                  !strcmp(it->string, "efficiency");
        for (size_t i = 0; i < NFIELDS(text_fields); i++)
            ok = ok || !strcmp(it->string, text_fields[i]);
        if (!ok)
            return trex_err_set(err, TREX_EFORMAT,
                                "%s: unknown field \"%s\" (fields: name, device, peak_bf16_tflops, "
                                "peak_fp8_tflops, hbm_gib, hbm_bw_gbs, devices_per_node, "
                                "scaleup_domain, scaleup_bw_gbs, scaleup_latency_us, scaleout_bw_gbs, "
                                "scaleout_latency_us, host_mem_gib, host_bw_gbs, reserved_gib, "
                                "efficiency, measured, notes, sources, engine, fp32_ref)",
                                label, it->string);
    }
    TREX_TRY(copy_string(cl->name, sizeof cl->name, json, "name", label, err));
    TREX_TRY(copy_string(cl->device, sizeof cl->device, json, "device", label, err));
    TREX_TRY(read_fields(cl, cluster_fields, NFIELDS(cluster_fields), json, label, "", err));
    const cJSON *meas = cJSON_GetObjectItemCaseSensitive(json, "measured");
    if (meas) {
        if (!cJSON_IsBool(meas))
            return trex_err_set(err, TREX_EFORMAT, "%s: field \"measured\" must be true or false",
                                label);
        cl->measured = cJSON_IsTrue(meas);
    }
    eff_defaults(&cl->eff);
    const cJSON *eff = cJSON_GetObjectItemCaseSensitive(json, "efficiency");
    if (eff) {
        if (!cJSON_IsObject(eff))
            return trex_err_set(err, TREX_EFORMAT, "%s: field \"efficiency\" must be an object",
                                label);
        cJSON_ArrayForEach(it, eff) {
            if (!known(eff_fields, NFIELDS(eff_fields), it->string) && strcmp(it->string, "notes"))
                return trex_err_set(err, TREX_EFORMAT,
                                    "%s: unknown field \"efficiency.%s\" (fields: gemm, gemm_fp8, "
                                    "grouped_gemm, gemm_half_rows, attention, memory, collective, "
                                    "a2a_scaleup, a2a_scaleout, overlap, a2a_hide, layer_overhead_us, notes)",
                                    label, it->string);
        }
        TREX_TRY(read_fields(&cl->eff, eff_fields, NFIELDS(eff_fields), eff, label, "efficiency.",
                             err));
    }
    const cJSON *eng = cJSON_GetObjectItemCaseSensitive(json, "engine");
    cl->engine = TREX_ENGINE_GENERIC;
    if (eng) {
        if (cJSON_IsString(eng) && !strcmp(eng->valuestring, "fp32-ref"))
            cl->engine = TREX_ENGINE_FP32_REF;
        else if (!cJSON_IsString(eng) || strcmp(eng->valuestring, "generic"))
            return trex_err_set(err, TREX_EFORMAT,
                                "%s: field \"engine\" must be \"generic\" or \"fp32-ref\"", label);
    }
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(json, "fp32_ref");
    if (fr) {
        if (!cJSON_IsObject(fr))
            return trex_err_set(err, TREX_EFORMAT, "%s: field \"fp32_ref\" must be an object", label);
        cJSON_ArrayForEach(it, fr) {
            if (!known(fp32_fields, NFIELDS(fp32_fields), it->string) && strcmp(it->string, "notes"))
                return trex_err_set(err, TREX_EFORMAT,
                                    "%s: unknown field \"fp32_ref.%s\" (see docs/planner.md, \"The local "
                                    "fp32 engine\")", label, it->string);
        }
        TREX_TRY(read_fields(&cl->fp32, fp32_fields, NFIELDS(fp32_fields), fr, label, "fp32_ref.", err));
    } else if (cl->engine == TREX_ENGINE_FP32_REF) {
        return trex_err_set(err, TREX_ENOTFOUND,
                            "%s: engine \"fp32-ref\" needs the \"fp32_ref\" rates (bench/plan_local.sh "
                            "measures them)", label);
    }
    if (cl->scaleup_domain < cl->devices_per_node)
        return trex_err_set(err, TREX_ERANGE,
                            "%s: scaleup_domain (%lld) must be at least devices_per_node (%lld)",
                            label, (long long)cl->scaleup_domain, (long long)cl->devices_per_node);
    if (cl->reserved_gib >= cl->hbm_gib)
        return trex_err_set(err, TREX_ERANGE, "%s: reserved_gib (%g) must be below hbm_gib (%g)",
                            label, cl->reserved_gib, cl->hbm_gib);
    return TREX_OK;
}

trex_code trex_plan_cluster_load(trex_cluster *cl, const char *path, trex_err *err)
{
    cJSON *json = NULL;
    TREX_TRY(trex_json_load(path, &json, err));
    trex_code rc = trex_plan_cluster_from_json(cl, json, path, err);
    cJSON_Delete(json);
    return rc;
}
