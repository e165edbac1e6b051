/* tests/test_config.c — config.json loading: every shipped config loads with the right values; every
 * kind of bad config (missing, unknown, mistyped, fractional, inconsistent fields) fails with a message
 * naming the field. Bad configs are the tiny config with one change applied, plus the fixture files
 * under tests/data/configs/. Run from the repository root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "trex/config.h"
#include "trex/io.h"

static void test_shipped(void)
{
    static const struct {
        const char *path, *name;
        int64_t d, L, E, K, csa;
    } cases[] = {
        {"configs/deepseek-v4-flash.json", "deepseek-v4-flash", 4096, 43, 256, 6, 21},
        {"configs/deepseek-v4-pro.json", "deepseek-v4-pro", 7168, 61, 384, 6, 30},
        {"configs/dsv4-bench.json", "dsv4-bench", 1024, 12, 24, 6, 5},
        {"configs/dsv4-tiny.json", "dsv4-tiny", 256, 6, 8, 2, 3},
        {"configs/dsv4-tiny-strict.json", "dsv4-tiny-strict", 256, 6, 8, 2, 3},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        trex_config c;
        trex_err err = {0};
        trex_code rc = trex_config_load(&c, cases[k].path, &err);
        CHECK(rc == TREX_OK, "%s: %s", cases[k].path, err.msg);
        if (rc != TREX_OK)
            continue;
        CHECK(!strcmp(c.name, cases[k].name), "%s: name %s", cases[k].path, c.name);
        CHECK(c.hidden_size == cases[k].d && c.num_hidden_layers == cases[k].L, "%s: d/L", cases[k].path);
        CHECK(c.n_routed_experts == cases[k].E && c.num_experts_per_tok == cases[k].K, "%s: E/K", cases[k].path);
        CHECK(c.n_compress_ratios == c.num_hidden_layers + 1 && trex_config_n_blocks(&c) == c.n_compress_ratios,
              "%s: ratios %lld", cases[k].path, (long long)c.n_compress_ratios);
        int64_t csa = 0;
        for (int64_t i = 0; i < c.num_hidden_layers; i++)
            csa += trex_config_ratio(&c, i) == 4;
        CHECK(csa == cases[k].csa, "%s: %lld CSA layers", cases[k].path, (long long)csa);
        CHECK(trex_config_ratio(&c, c.num_hidden_layers) == 0, "%s: MTP is SWA", cases[k].path);
        CHECK(c.yarn && c.rope_factor == 16 && c.rope_original_max_pos == 65536 && c.rope_beta_fast == 32 &&
                  c.rope_beta_slow == 1,
              "%s: yarn", cases[k].path);
        CHECK(c.rope_theta == 10000 && c.compress_rope_theta == 160000, "%s: theta", cases[k].path);
        CHECK(c.hc_mult == 4 && c.hc_sinkhorn_iters == 20 && c.hc_eps == 1e-6 && c.rms_norm_eps == 1e-6,
              "%s: hc", cases[k].path);
        CHECK(c.num_hash_layers >= 2 && trex_config_is_hash(&c, 0) && !trex_config_is_hash(&c, c.num_hidden_layers),
              "%s: hash layers", cases[k].path);
        CHECK(c.initializer_range == 0.02 && c.bos_token_id == 0 && c.eos_token_id == 1, "%s: misc", cases[k].path);
    }
    trex_config c;
    if (trex_config_load(&c, "configs/deepseek-v4-pro.json", NULL) == TREX_OK)
        CHECK(c.compress_ratios[0] == 128 && c.compress_ratios[1] == 128 && c.compress_ratios[2] == 4 &&
                  c.compress_ratios[3] == 128 && c.compress_ratios[60] == 4 && c.routed_scaling_factor == 2.5 &&
                  c.index_topk == 1024 && c.o_groups == 16 && c.q_lora_rank == 1536,
              "pro values");
    if (trex_config_load(&c, "configs/dsv4-tiny-strict.json", NULL) == TREX_OK)
        CHECK(c.sliding_window == 128 && c.compress_ratios[2] == 128 && c.compress_ratios[4] == 128,
              "strict values");
}

/* One change to the tiny config. value: JSON text to set (NULL deletes the field); key may be
 * "rope_scaling.x" for one level of nesting; op 'd' appends a duplicate of the key instead. */
typedef struct mutation {
    const char *key;
    const char *value;
    const char *expect1, *expect2; /* substrings the message must contain (expect2 may be NULL) */
    char op;
} mutation;

static const mutation bad[] = {
    {"hidden_size", NULL, "missing required field 'hidden_size'", NULL, 0},
    {"compress_ratios", NULL, "'compress_ratios'", "missing", 0},
    {"num_hash_layers", NULL, "'num_hash_layers'", "missing", 0},
    {"hiden_size", "256", "unknown field 'hiden_size'", NULL, 0},
    {"max_batch_size", "4", "unknown field 'max_batch_size'", NULL, 0},
    {"hidden_size", "\"256\"", "'hidden_size'", "integer", 0},
    {"hidden_size", "256.5", "'hidden_size'", "exact integer", 0},
    {"hidden_size", "1e300", "'hidden_size'", "exact integer", 0},
    {"hidden_size", "true", "'hidden_size'", "integer", 0},
    {"hidden_size", "null", "'hidden_size'", "integer", 0},
    {"vocab_size", "0", "'vocab_size'", "out of range", 0},
    {"vocab_size", "4294967296", "'vocab_size'", "range", 0},
    {"rope_theta", "\"10000\"", "'rope_theta'", "number", 0},
    {"rope_theta", "1", "'rope_theta'", NULL, 0},
    {"hidden_size", "256", "'hidden_size'", "twice", 'd'},
    {"compress_ratios", "[0, 4, 16, 4, 16, 4]", "'compress_ratios'", "6 entries", 0},
    {"compress_ratios", "[0, 4, 16, 4, 16, 4, 0, 0]", "'compress_ratios'", "8 entries", 0},
    {"compress_ratios", "4", "'compress_ratios'", "array", 0},
    {"compress_ratios", "[0, 1, 16, 4, 16, 4, 0]", "'compress_ratios[1]'", NULL, 0},
    {"compress_ratios", "[0, -4, 16, 4, 16, 4, 0]", "'compress_ratios[1]'", NULL, 0},
    {"compress_ratios", "[0, 4, 16.5, 4, 16, 4, 0]", "'compress_ratios[2]'", "exact integer", 0},
    {"compress_ratios", "[0, 4, 16, 4, 16, 4, 4]", "'compress_ratios[6]'", "MTP", 0},
    {"num_attention_heads", "5", "'num_attention_heads'", "'o_groups'", 0},
    {"o_groups", "3", "'o_groups'", NULL, 0},
    {"num_key_value_heads", "2", "'num_key_value_heads'", NULL, 0},
    {"n_shared_experts", "2", "'n_shared_experts'", NULL, 0},
    {"num_experts_per_tok", "9", "'num_experts_per_tok'", "'n_routed_experts'", 0},
    {"num_hash_layers", "7", "'num_hash_layers'", NULL, 0},
    {"hc_mult", "0", "'hc_mult'", NULL, 0},
    {"hc_sinkhorn_iters", "0", "'hc_sinkhorn_iters'", NULL, 0},
    {"hc_eps", "0", "'hc_eps'", NULL, 0},
    {"rms_norm_eps", "-1e-6", "'rms_norm_eps'", NULL, 0},
    {"initializer_range", "0", "'initializer_range'", NULL, 0},
    {"num_nextn_predict_layers", "2", "'num_nextn_predict_layers'", NULL, 0},
    {"tie_word_embeddings", "true", "'tie_word_embeddings'", "false", 0},
    {"tie_word_embeddings", "0", "'tie_word_embeddings'", "true or false", 0},
    {"head_dim", "64", "'head_dim'", "'qk_rope_head_dim'", 0},
    {"qk_rope_head_dim", "63", "'qk_rope_head_dim'", "even", 0},
    {"index_head_dim", "64", "'index_head_dim'", NULL, 0},
    {"bos_token_id", "4096", "'bos_token_id'", "vocab_size", 0},
    {"attention_bias", "true", "'attention_bias'", NULL, 0},
    {"attention_dropout", "0.1", "'attention_dropout'", NULL, 0},
    {"hidden_act", "\"gelu\"", "'hidden_act'", "silu", 0},
    {"scoring_func", "\"sigmoid\"", "'scoring_func'", "sqrtsoftplus", 0},
    {"topk_method", "\"greedy\"", "'topk_method'", "noaux_tc", 0},
    {"norm_topk_prob", "false", "'norm_topk_prob'", NULL, 0},
    {"model_type", "\"deepseek_v3\"", "'model_type'", "deepseek_v4", 0},
    {"architectures", "\"DeepseekV4ForCausalLM\"", "'architectures'", NULL, 0},
    {"quantization_config", "7", "'quantization_config'", NULL, 0},
    {"rope_scaling", "[1]", "'rope_scaling'", NULL, 0},
    {"rope_scaling.type", "\"linear\"", "'rope_scaling.type'", "yarn", 0},
    {"rope_scaling.factor", NULL, "'rope_scaling.factor'", "missing", 0},
    {"rope_scaling.mscale", "1.0", "'rope_scaling.mscale'", "unknown", 0},
    {"rope_scaling.beta_fast", "0.5", "'rope_scaling.beta_fast'", NULL, 0},
    {"rope_scaling.factor", "0.5", "'rope_scaling.factor'", NULL, 0},
    {"rope_scaling.original_max_position_embeddings", "65536.5",
     "'rope_scaling.original_max_position_embeddings'", "exact integer", 0},
};

/* Variants that must load. */
static const mutation good[] = {
    {"rope_scaling", NULL, NULL, NULL, 0},
    {"rope_scaling", "null", NULL, NULL, 0},
    {"hidden_size", "256.0", NULL, NULL, 0},
    {"bos_token_id", "null", NULL, NULL, 0},
    {"initializer_range", NULL, NULL, NULL, 0},
    {"transformers_version", "\"4.57.1\"", NULL, NULL, 0},
    {"use_cache", "true", NULL, NULL, 0},
    {"expert_dtype", "\"fp4\"", NULL, NULL, 0},
    {"attention_dropout", "0.0", NULL, NULL, 0},
    {"num_hash_layers", "0", NULL, NULL, 0},
    {"num_experts_per_tok", "8", NULL, NULL, 0},
};

static cJSON *mutated(const cJSON *base, const mutation *m)
{
    cJSON *j = cJSON_Duplicate(base, 1);
    cJSON *obj = j;
    char key[96];
    snprintf(key, sizeof key, "%s", m->key);
    char *dot = strchr(key, '.');
    if (dot) {
        *dot = '\0';
        obj = cJSON_GetObjectItemCaseSensitive(j, key);
        memmove(key, dot + 1, strlen(dot + 1) + 1);
    }
    if (m->op == 'd') {
        cJSON_AddItemToObject(obj, key, cJSON_Parse(m->value));
        return j;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    if (m->value)
        cJSON_AddItemToObject(obj, key, cJSON_Parse(m->value));
    return j;
}

static void test_mutations(void)
{
    cJSON *base = NULL;
    trex_err err = {0};
    CHECK(trex_json_load("configs/dsv4-tiny.json", &base, &err) == TREX_OK, "%s", err.msg);
    if (!base)
        return;
    trex_config c;
    CHECK(trex_config_from_json(&c, base, "x/bad.json", &err) == TREX_OK, "%s", err.msg);
    CHECK(!strcmp(c.name, "bad"), "name from label: %s", c.name);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const mutation *m = &bad[k];
        cJSON *j = mutated(base, m);
        memset(&err, 0, sizeof err);
        trex_code rc = trex_config_from_json(&c, j, "x/bad.json", &err);
        CHECK(rc != TREX_OK, "%s = %s was accepted", m->key, m->value ? m->value : "(deleted)");
        CHECK(err.code == rc, "%s: err.code", m->key);
        CHECK(strstr(err.msg, m->expect1) != NULL, "%s = %s: message lacks \"%s\": %s", m->key,
              m->value ? m->value : "(deleted)", m->expect1, err.msg);
        if (m->expect2)
            CHECK(strstr(err.msg, m->expect2) != NULL, "%s = %s: message lacks \"%s\": %s", m->key,
                  m->value ? m->value : "(deleted)", m->expect2, err.msg);
        CHECK(!strncmp(err.msg, "x/bad.json: ", 12), "message starts with the label: %s", err.msg);
        CHECK(strchr(err.msg, '\n') == NULL, "one line: %s", err.msg);
        cJSON_Delete(j);
    }
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
        cJSON *j = mutated(base, &good[k]);
        trex_code rc = trex_config_from_json(&c, j, "good.json", &err);
        CHECK(rc == TREX_OK, "%s = %s rejected: %s", good[k].key, good[k].value ? good[k].value : "(deleted)",
              err.msg);
        cJSON_Delete(j);
    }
    /* details of the accepted variants */
    cJSON *j = mutated(base, &good[0]);
    if (trex_config_from_json(&c, j, "good.json", NULL) == TREX_OK)
        CHECK(!c.yarn, "no rope_scaling: no YaRN");
    cJSON_Delete(j);
    j = mutated(base, &good[3]);
    if (trex_config_from_json(&c, j, "good.json", NULL) == TREX_OK)
        CHECK(c.bos_token_id == -1, "null bos -> -1");
    cJSON_Delete(j);
    /* without an MTP block the ratios have one entry per layer */
    j = cJSON_Duplicate(base, 1);
    cJSON_ReplaceItemInObjectCaseSensitive(j, "num_nextn_predict_layers", cJSON_CreateNumber(0));
    cJSON_ReplaceItemInObjectCaseSensitive(j, "compress_ratios", cJSON_Parse("[0, 4, 16, 4, 16, 4]"));
    CHECK(trex_config_from_json(&c, j, "nomtp.json", &err) == TREX_OK, "no MTP: %s", err.msg);
    CHECK(trex_config_n_blocks(&c) == 6, "no MTP: 6 blocks");
    cJSON_Delete(j);
    /* rope_type (newer HF spelling) is the same as type */
    j = cJSON_Duplicate(base, 1);
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    cJSON_DeleteItemFromObjectCaseSensitive(rs, "type");
    cJSON_AddStringToObject(rs, "rope_type", "yarn");
    CHECK(trex_config_from_json(&c, j, "rt.json", &err) == TREX_OK && c.yarn, "rope_type: %s", err.msg);
    cJSON_Delete(j);
    /* not an object */
    j = cJSON_Parse("[1, 2]");
    CHECK(trex_config_from_json(&c, j, "arr.json", &err) != TREX_OK && strstr(err.msg, "arr.json"),
          "array config: %s", err.msg);
    cJSON_Delete(j);
    cJSON_Delete(base);
}

static void test_files(void)
{
    static const struct {
        const char *path, *expect;
    } cases[] = {
        {"tests/data/configs/bad-unknown-field.json", "'hiden_size'"},
        {"tests/data/configs/bad-missing-field.json", "'vocab_size'"},
        {"tests/data/configs/bad-fractional.json", "'moe_intermediate_size'"},
        {"tests/data/configs/bad-ratios-length.json", "'compress_ratios'"},
        {"tests/data/configs/bad-groups.json", "'o_groups'"},
        {"tests/data/configs/bad-syntax.json", "bad-syntax.json"},
        {"tests/data/configs/does-not-exist.json", "does-not-exist.json"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        trex_config c;
        trex_err err = {0};
        trex_code rc = trex_config_load(&c, cases[k].path, &err);
        CHECK(rc != TREX_OK, "%s accepted", cases[k].path);
        CHECK(strstr(err.msg, cases[k].expect) != NULL, "%s: message lacks %s: %s", cases[k].path,
              cases[k].expect, err.msg);
        CHECK(strstr(err.msg, cases[k].path) != NULL || k >= 5, "%s: message names the file: %s",
              cases[k].path, err.msg);
    }
}

int main(void)
{
    test_shipped();
    test_mutations();
    test_files();
    return check_summary();
}
