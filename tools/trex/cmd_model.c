/* tools/trex/cmd_model.c — `trex model info | init | run`.
 *
 *   info  parameter counts (MODEL_SPEC §1.3 / §7.1 rules) by component, per attention layer type, and
 *         the memory the model would need; nothing is allocated, so it works for V4-Pro on a laptop.
 *   init  initialised weights (docs/model-conventions.md) written as safetensors with official names.
 *   run   forward/backward of one batch (cmd_model_run.c). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "commands.h"
#include "opts.h"
#include "trex/config.h"
#include "trex/params.h"

static int parse(const trex_opt *opts, int argc, char **argv, trex_cmd_info *info)
{
    int rc = trex_opts_parse(opts, argc, argv, info);
    return rc == TREX_OPTS_OK ? -1 : rc == TREX_OPTS_HELP ? 0 : 2;
}

/* 284332240471 -> "284.33B"; 106956352 -> "106.96M". */
static const char *fmt_count(char *buf, size_t size, int64_t n)
{
    if (n >= INT64_C(1000000000))
        snprintf(buf, size, "%.2fB", (double)n / 1e9);
    else if (n >= 1000000)
        snprintf(buf, size, "%.2fM", (double)n / 1e6);
    else if (n >= 1000)
        snprintf(buf, size, "%.2fK", (double)n / 1e3);
    else
        snprintf(buf, size, "%lld", (long long)n);
    return buf;
}

static const char *fmt_bytes(char *buf, size_t size, double bytes)
{
    const double gib = 1024.0 * 1024 * 1024;
    if (bytes >= gib)
        snprintf(buf, size, "%.2f GiB", bytes / gib);
    else
        snprintf(buf, size, "%.2f MiB", bytes / (1024.0 * 1024));
    return buf;
}

static const char *attn_type(int ratio)
{
    return ratio == 0 ? "SWA" : ratio == 4 ? "CSA" : "HCA";
}

typedef struct mem_need {
    double weights_fp32, grads_fp32, adamw_fp32, train_total, weights_bf16;
} mem_need;

/* Bytes of the whole layout (MTP included): fp32 master weights (+ int32 tid2eid), fp32 gradients and
 * AdamW moments of the trainable tensors, and a bf16 copy of the weights. */
static mem_need memory_need(const trex_layout *lay)
{
    mem_need m;
    m.weights_fp32 = 4.0 * (double)lay->n_float + 4.0 * (double)lay->n_int;
    m.grads_fp32 = 4.0 * (double)lay->n_trainable;
    m.adamw_fp32 = 8.0 * (double)lay->n_trainable;
    m.train_total = m.weights_fp32 + m.grads_fp32 + m.adamw_fp32;
    m.weights_bf16 = 2.0 * (double)lay->n_float + 4.0 * (double)lay->n_int;
    return m;
}

static void print_info_text(const trex_config *c, const char *path, const trex_layout *lay,
                            const trex_param_counts *n)
{
    char a[32], b[32];
    const int64_t L = c->num_hidden_layers;
    printf("model %s (%s)\n", c->name, path);
    printf("  hidden %lld, %lld layers%s, %lld heads x %lld (rope %lld), vocab %lld\n", (long long)c->hidden_size,
           (long long)L, c->num_nextn_predict_layers ? " + 1 MTP block" : "", (long long)c->num_attention_heads,
           (long long)c->head_dim, (long long)c->qk_rope_head_dim, (long long)c->vocab_size);
    printf("  MoE: %lld routed experts (%lld per token) + %lld shared, inter %lld, %lld hash layers\n",
           (long long)c->n_routed_experts, (long long)c->num_experts_per_tok, (long long)c->n_shared_experts,
           (long long)c->moe_intermediate_size, (long long)c->num_hash_layers);
    printf("  layers:");
    for (int k = 0; k < n->n_attn; k++)
        printf("%s %lld %s (ratio %d)", k ? "," : "", (long long)n->attn_by_ratio[k].layers,
               attn_type(n->attn_by_ratio[k].ratio), n->attn_by_ratio[k].ratio);
    if (c->num_nextn_predict_layers)
        printf("; MTP block %s", attn_type(trex_config_ratio(c, L)));
    printf("\n\nparameters (every tensor except .scale and tid2eid; MODEL_SPEC §7.1)\n");
    printf("  %-34s %10s  %16lld\n", "total (main model, no MTP)", fmt_count(a, sizeof a, n->total),
           (long long)n->total);
    printf("  %-34s %10s  %16lld\n", "active per token", fmt_count(a, sizeof a, n->active), (long long)n->active);
    printf("    (head counted, embedding lookup not, %lld of %lld routed experts per layer, no MTP)\n",
           (long long)c->num_experts_per_tok, (long long)c->n_routed_experts);
    printf("  %-34s %10s  %16lld\n", "active incl. embedding", fmt_count(a, sizeof a, n->active + n->embed),
           (long long)(n->active + n->embed));
    printf("  %-34s %10s  %16lld\n", "active excl. embedding and head",
           fmt_count(a, sizeof a, n->active - n->head), (long long)(n->active - n->head));
    printf("  %-34s %10s  %16lld\n", "MTP block (embed/head shared)", fmt_count(a, sizeof a, n->mtp),
           (long long)n->mtp);
    printf("  %-34s %10s  %16lld\n", "total incl. MTP", fmt_count(a, sizeof a, n->total_with_mtp),
           (long long)n->total_with_mtp);
    printf("\nby component (main model)\n");
    const struct {
        const char *name;
        int64_t v;
    } comp[] = {
        {"embedding", n->embed},   {"head", n->head},           {"attention", n->attn},
        {"routed experts", n->routed}, {"shared experts", n->shared}, {"router gates", n->gate},
        {"mHC", n->hc},            {"norms", n->norm},
    };
    for (size_t k = 0; k < sizeof comp / sizeof comp[0]; k++)
        printf("  %-34s %10s  %16lld\n", comp[k].name, fmt_count(a, sizeof a, comp[k].v), (long long)comp[k].v);
    printf("  %-34s %10s  %16lld\n", "routed experts active per token", fmt_count(a, sizeof a, n->routed_active),
           (long long)n->routed_active);
    printf("  %-34s %10s  %16lld\n", "MTP block active per token", fmt_count(a, sizeof a, n->mtp_active),
           (long long)n->mtp_active);
    printf("  %-34s %10s  %16lld\n", "not counted (tid2eid entries)", fmt_count(a, sizeof a, n->not_counted),
           (long long)n->not_counted);
    printf("\nattention parameters per layer\n");
    for (int k = 0; k < n->n_attn; k++) {
        char label[48];
        snprintf(label, sizeof label, "%s (ratio %d) x %lld", attn_type(n->attn_by_ratio[k].ratio),
                 n->attn_by_ratio[k].ratio, (long long)n->attn_by_ratio[k].layers);
        printf("  %-34s %10s  %16lld\n", label, fmt_count(a, sizeof a, n->attn_by_ratio[k].per_layer),
               (long long)n->attn_by_ratio[k].per_layer);
    }
    if (c->num_nextn_predict_layers)
        printf("  %-34s %10s  %16lld\n", "MTP block", fmt_count(a, sizeof a, n->mtp_attn), (long long)n->mtp_attn);
    const mem_need m = memory_need(lay);
    printf("\nmemory for every tensor incl. MTP (%lld tensors; not allocated)\n", (long long)lay->count);
    printf("  %-34s %14s\n", "fp32 weights", fmt_bytes(a, sizeof a, m.weights_fp32));
    printf("  %-34s %14s\n", "fp32 gradients", fmt_bytes(a, sizeof a, m.grads_fp32));
    printf("  %-34s %14s\n", "AdamW state (2 x fp32)", fmt_bytes(a, sizeof a, m.adamw_fp32));
    printf("  %-34s %14s\n", "training total (no activations)", fmt_bytes(a, sizeof a, m.train_total));
    printf("  %-34s %14s\n", "bf16 weights", fmt_bytes(b, sizeof b, m.weights_bf16));
}

static int print_info_json(const trex_config *c, const char *path, const trex_layout *lay,
                           const trex_param_counts *n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *comp = cJSON_CreateObject(), *attn = cJSON_CreateArray(), *mem = cJSON_CreateObject();
    if (!o || !comp || !attn || !mem) {
        cJSON_Delete(o);
        cJSON_Delete(comp);
        cJSON_Delete(attn);
        cJSON_Delete(mem);
        return trex_cli_error("model info: out of memory");
    }
    bool ok = cJSON_AddStringToObject(o, "config", c->name) && cJSON_AddStringToObject(o, "path", path) &&
              cJSON_AddNumberToObject(o, "tensors", (double)lay->count) &&
              cJSON_AddNumberToObject(o, "total", (double)n->total) &&
              cJSON_AddNumberToObject(o, "active", (double)n->active) &&
              cJSON_AddNumberToObject(o, "active_with_embedding", (double)(n->active + n->embed)) &&
              cJSON_AddNumberToObject(o, "mtp", (double)n->mtp) &&
              cJSON_AddNumberToObject(o, "mtp_active", (double)n->mtp_active) &&
              cJSON_AddNumberToObject(o, "total_with_mtp", (double)n->total_with_mtp) &&
              cJSON_AddNumberToObject(o, "not_counted", (double)n->not_counted);
    /* attached whatever happened above, so that deleting o frees them */
    cJSON_AddItemToObject(o, "components", comp);
    cJSON_AddItemToObject(o, "attention_per_layer", attn);
    cJSON_AddItemToObject(o, "memory_bytes", mem);
    const struct {
        const char *name;
        int64_t v;
    } cv[] = {{"embedding", n->embed},         {"head", n->head},         {"attention", n->attn},
              {"routed_experts", n->routed},   {"routed_experts_active", n->routed_active},
              {"shared_experts", n->shared},   {"router_gates", n->gate}, {"mhc", n->hc},
              {"norms", n->norm},              {"mtp_attention", n->mtp_attn}};
    for (size_t k = 0; ok && k < sizeof cv / sizeof cv[0]; k++)
        ok = cJSON_AddNumberToObject(comp, cv[k].name, (double)cv[k].v) != NULL;
    for (int k = 0; ok && k < n->n_attn; k++) {
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToArray(attn, e) &&
             cJSON_AddStringToObject(e, "type", attn_type(n->attn_by_ratio[k].ratio)) &&
             cJSON_AddNumberToObject(e, "ratio", n->attn_by_ratio[k].ratio) &&
             cJSON_AddNumberToObject(e, "layers", (double)n->attn_by_ratio[k].layers) &&
             cJSON_AddNumberToObject(e, "params", (double)n->attn_by_ratio[k].per_layer);
    }
    const mem_need m = memory_need(lay);
    ok = ok && cJSON_AddNumberToObject(mem, "weights_fp32", m.weights_fp32) &&
         cJSON_AddNumberToObject(mem, "grads_fp32", m.grads_fp32) &&
         cJSON_AddNumberToObject(mem, "adamw_fp32", m.adamw_fp32) &&
         cJSON_AddNumberToObject(mem, "train_total", m.train_total) &&
         cJSON_AddNumberToObject(mem, "weights_bf16", m.weights_bf16);
    char *s = ok ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!s)
        return trex_cli_error("model info: out of memory");
    printf("%s\n", s);
    cJSON_free(s);
    return 0;
}

static int model_info(int argc, char **argv)
{
    const char *config = NULL;
    bool json = false;
    const trex_opt opts[] = {
        {"config", TREX_OPT_STR, &config, "FILE", "model config.json", true},
        {"json", TREX_OPT_FLAG, &json, NULL, "print one JSON object instead of text", false},
        {0}};
    trex_cmd_info info = {.usage = "trex model info --config FILE [--json]",
                          .summary = "Prints the parameter counts of a DeepSeek-V4 config (total, active per "
                                     "token, MTP, by component and per attention layer type) and the memory "
                                     "its weights, gradients and AdamW state would need. Allocates nothing."};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    trex_config cfg;
    trex_layout lay;
    trex_err err = {0};
    if (trex_config_load(&cfg, config, &err) != TREX_OK)
        return trex_cli_error("%s", err.msg);
    if (trex_layout_build(&lay, &cfg, &err) != TREX_OK)
        return trex_cli_error("%s", err.msg);
    trex_param_counts *n = malloc(sizeof *n);
    if (!n) {
        trex_layout_free(&lay);
        return trex_cli_error("model info: out of memory");
    }
    trex_layout_count(&lay, &cfg, n);
    rc = 0;
    if (json)
        rc = print_info_json(&cfg, config, &lay, n);
    else
        print_info_text(&cfg, config, &lay, n);
    free(n);
    trex_layout_free(&lay);
    return rc;
}

static int model_init(int argc, char **argv)
{
    const char *config = NULL, *out = NULL;
    int64_t seed = 0;
    const trex_opt opts[] = {
        {"config", TREX_OPT_STR, &config, "FILE", "model config.json", true},
        {"seed", TREX_OPT_I64, &seed, "S", "random seed (>= 0); the weights are a function of it", false},
        {"out", TREX_OPT_STR, &out, "FILE", "output .safetensors file", true},
        {0}};
    trex_cmd_info info = {.usage = "trex model init --config FILE --out W.safetensors [--seed S]",
                          .summary = "Initialises a model as docs/model-conventions.md describes and writes every "
                                     "tensor under its official name (F32; tid2eid I64). The result does not "
                                     "depend on the thread count."};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    if (seed < 0)
        return trex_cli_error("model init: --seed must be >= 0, got %lld", (long long)seed);
    trex_config cfg;
    trex_weights w;
    trex_mem mem = {0};
    trex_err err = {0};
    if (trex_config_load(&cfg, config, &err) != TREX_OK)
        return trex_cli_error("%s", err.msg);
    fprintf(stderr, "trex model init: config=%s (%s) seed=%lld out=%s\n", cfg.name, config, (long long)seed, out);
    if (trex_weights_init(&w, &cfg, (uint64_t)seed, &mem, &err) != TREX_OK)
        return trex_cli_error("%s", err.msg);
    if (trex_weights_save(&w, out, &err) != TREX_OK) {
        trex_weights_free(&w);
        return trex_cli_error("%s", err.msg);
    }
    int64_t numel = 0;
    for (int64_t k = 0; k < w.layout.count; k++)
        numel += w.layout.params[k].numel;
    char a[32], b[32];
    printf("wrote %s: %lld tensors, %s values (%lld), %s, F32 (tid2eid I64), config %s, seed %lld\n", out,
           (long long)w.layout.count, fmt_count(a, sizeof a, numel), (long long)numel,
           fmt_bytes(b, sizeof b, 4.0 * (double)numel), cfg.name, (long long)seed);
    trex_weights_free(&w);
    return 0;
}

static const trex_subcmd subs[] = {
    {"info", model_info, "parameter counts and memory needs of a config (allocates nothing)"},
    {"init", model_init, "write initialised weights as safetensors"},
    {"run", trex_cmd_model_run, "forward (and backward) of one batch; writes logits, losses, gradients"},
};


int trex_cmd_model(int argc, char **argv)
{
    return trex_subcmd_dispatch("trex model", "DeepSeek-V4 models.", subs, sizeof subs / sizeof subs[0], argc, argv);
}
