/* model/config.c — loads and validates a DeepSeek-V4 config.json (Hugging Face field names).
 *
 * Every field of the object is looked up in one table (MODEL_SPEC §1.1). Fields trex uses fill the
 * struct; known fields trex does not use are accepted, and checked where their value changes the
 * model (attention_bias, hidden_act, scoring_func, ...); any other field is an error that names it,
 * so that a misspelt field never silently falls back to a default. After parsing, the values are
 * checked against each other (layer schedule, head split, experts, ...). Every message names the
 * source (path or label), the field, and what to do. */
#include "trex/config.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "trex/io.h"

/* What a field holds and where it goes. */
typedef enum ftype {
    FT_INT,      /* exact integer -> int64_t at off, within [min, max] */
    FT_NUM,      /* finite number -> double at off */
    FT_BOOL,     /* true/false -> bool at off */
    FT_TOKEN,    /* integer token id or null -> int64_t at off (-1 for null) */
    FT_RATIOS,   /* compress_ratios */
    FT_ROPE,     /* rope_scaling: null or {"type": "yarn", ...} */
    FT_STR_EQ,   /* known, unused: a string that must equal `want` */
    FT_BOOL_EQ,  /* known, unused: a bool that must equal want_bool */
    FT_ZERO,     /* known, unused: a number that must be 0 */
    FT_STR,      /* known, unused: any string (or null) */
    FT_OBJ,      /* known, unused: any object (or null) */
    FT_STRLIST,  /* known, unused: an array of strings */
    FT_OPT_INT,  /* known, unused: an integer or null */
    FT_ANYBOOL,  /* known, unused: true or false */
} ftype;

typedef struct field {
    const char *name;
    ftype type;
    size_t off;
    bool required;
    int64_t min, max; /* FT_INT */
    const char *want; /* FT_STR_EQ; also the reason for FT_BOOL_EQ / FT_ZERO */
    bool want_bool;   /* FT_BOOL_EQ */
} field;

#define DIM_MAX INT64_C(2147483647)
#define OFF(m) offsetof(trex_config, m)
#define INT(n, m, lo, hi) {n, FT_INT, OFF(m), true, lo, hi, NULL, false}
#define NUM(n, m) {n, FT_NUM, OFF(m), true, 0, 0, NULL, false}
#define OPT_NUM(n, m) {n, FT_NUM, OFF(m), false, 0, 0, NULL, false}
#define BOOL(n, m) {n, FT_BOOL, OFF(m), true, 0, 0, NULL, false}
#define TOKEN(n, m) {n, FT_TOKEN, OFF(m), false, 0, 0, NULL, false}
#define KNOWN(n, t) {n, t, 0, false, 0, 0, NULL, false}
#define STR_EQ(n, w) {n, FT_STR_EQ, 0, false, 0, 0, w, false}
#define BOOL_EQ(n, b, why) {n, FT_BOOL_EQ, 0, false, 0, 0, why, b}

static const field fields[] = {
    INT("vocab_size", vocab_size, 1, DIM_MAX),
    INT("hidden_size", hidden_size, 1, DIM_MAX),
    INT("num_hidden_layers", num_hidden_layers, 1, TREX_MAX_LAYERS - 1),
    INT("num_attention_heads", num_attention_heads, 1, DIM_MAX),
    INT("num_key_value_heads", num_key_value_heads, 1, DIM_MAX),
    INT("head_dim", head_dim, 1, DIM_MAX),
    INT("qk_rope_head_dim", qk_rope_head_dim, 1, DIM_MAX),
    INT("q_lora_rank", q_lora_rank, 1, DIM_MAX),
    INT("o_groups", o_groups, 1, DIM_MAX),
    INT("o_lora_rank", o_lora_rank, 1, DIM_MAX),
    INT("sliding_window", sliding_window, 1, DIM_MAX),
    {"compress_ratios", FT_RATIOS, 0, true, 0, 0, NULL, false},
    NUM("rope_theta", rope_theta),
    NUM("compress_rope_theta", compress_rope_theta),
    {"rope_scaling", FT_ROPE, 0, false, 0, 0, NULL, false},
    INT("max_position_embeddings", max_position_embeddings, 1, INT64_C(1) << 40),
    INT("index_n_heads", index_n_heads, 1, DIM_MAX),
    INT("index_head_dim", index_head_dim, 1, DIM_MAX),
    INT("index_topk", index_topk, 1, DIM_MAX),
    INT("n_routed_experts", n_routed_experts, 1, 4096),
    INT("n_shared_experts", n_shared_experts, 0, DIM_MAX),
    INT("num_experts_per_tok", num_experts_per_tok, 1, 4096),
    INT("moe_intermediate_size", moe_intermediate_size, 1, DIM_MAX),
    NUM("routed_scaling_factor", routed_scaling_factor),
    INT("num_hash_layers", num_hash_layers, 0, TREX_MAX_LAYERS),
    NUM("swiglu_limit", swiglu_limit),
    INT("hc_mult", hc_mult, 1, 64),
    INT("hc_sinkhorn_iters", hc_sinkhorn_iters, 1, 100000),
    NUM("hc_eps", hc_eps),
    NUM("rms_norm_eps", rms_norm_eps),
    INT("num_nextn_predict_layers", num_nextn_predict_layers, 0, DIM_MAX),
    BOOL("tie_word_embeddings", tie_word_embeddings),
    TOKEN("bos_token_id", bos_token_id),
    TOKEN("eos_token_id", eos_token_id),
    OPT_NUM("initializer_range", initializer_range),
    /* known fields trex does not use; checked where the value changes the model */
    STR_EQ("model_type", "deepseek_v4"),
    KNOWN("architectures", FT_STRLIST),
    STR_EQ("hidden_act", "silu"),
    STR_EQ("scoring_func", "sqrtsoftplus"),
    STR_EQ("topk_method", "noaux_tc"),
    BOOL_EQ("norm_topk_prob", true, "trex renormalises the top-k affinities (MODEL_SPEC §4)"),
    BOOL_EQ("attention_bias", false, "DeepSeek-V4 projections have no bias"),
    {"attention_dropout", FT_ZERO, 0, false, 0, 0, "trex has no attention dropout", false},
    KNOWN("torch_dtype", FT_STR),
    KNOWN("dtype", FT_STR),
    KNOWN("expert_dtype", FT_STR),
    KNOWN("transformers_version", FT_STR),
    KNOWN("_name_or_path", FT_STR),
    KNOWN("quantization_config", FT_OBJ),
    KNOWN("auto_map", FT_OBJ),
    KNOWN("use_cache", FT_ANYBOOL),
    KNOWN("pad_token_id", FT_OPT_INT),
};
#define NFIELDS (sizeof fields / sizeof fields[0])

static const char *json_type_name(const cJSON *j)
{
    if (cJSON_IsNull(j))
        return "null";
    if (cJSON_IsBool(j))
        return "a boolean";
    if (cJSON_IsNumber(j))
        return "a number";
    if (cJSON_IsString(j))
        return "a string";
    if (cJSON_IsArray(j))
        return "an array";
    if (cJSON_IsObject(j))
        return "an object";
    return "an invalid value";
}

/* An exact integer in [min, max]; `what` names the field (e.g. "compress_ratios[3]"). */
static trex_code get_int(const cJSON *j, const char *label, const char *what, int64_t min, int64_t max,
                         int64_t *out, trex_err *err)
{
    if (!cJSON_IsNumber(j))
        return trex_err_set(err, TREX_EINVAL, "%s: field '%s' must be an integer, got %s", label, what,
                            json_type_name(j));
    double v = j->valuedouble;
    /* |v| <= 2^53: every such double that equals its floor is an exact integer */
    if (!isfinite(v) || v != floor(v) || fabs(v) > 9007199254740992.0)
        return trex_err_set(err, TREX_EINVAL, "%s: field '%s' must be an exact integer, got %.17g", label,
                            what, v);
    int64_t iv = (int64_t)v;
    if (iv < min || iv > max)
        return trex_err_set(err, TREX_ERANGE, "%s: field '%s' = %lld is out of range [%lld, %lld]", label,
                            what, (long long)iv, (long long)min, (long long)max);
    *out = iv;
    return TREX_OK;
}

static trex_code get_num(const cJSON *j, const char *label, const char *what, double *out, trex_err *err)
{
    if (!cJSON_IsNumber(j))
        return trex_err_set(err, TREX_EINVAL, "%s: field '%s' must be a number, got %s", label, what,
                            json_type_name(j));
    if (!isfinite(j->valuedouble))
        return trex_err_set(err, TREX_EINVAL, "%s: field '%s' must be finite", label, what);
    *out = j->valuedouble;
    return TREX_OK;
}

static trex_code parse_ratios(trex_config *cfg, const cJSON *j, const char *label, trex_err *err)
{
    if (!cJSON_IsArray(j))
        return trex_err_set(err, TREX_EINVAL,
                            "%s: field 'compress_ratios' must be an array of integers (one per layer, "
                            "then one per MTP block), got %s",
                            label, json_type_name(j));
    int n = cJSON_GetArraySize(j);
    if (n < 1 || n > TREX_MAX_LAYERS)
        return trex_err_set(err, TREX_ERANGE, "%s: field 'compress_ratios' has %d entries; it needs 1 to %d",
                            label, n, TREX_MAX_LAYERS);
    int i = 0;
    for (const cJSON *e = j->child; e; e = e->next, i++) {
        char what[48];
        int64_t v;
        snprintf(what, sizeof what, "compress_ratios[%d]", i);
        TREX_TRY(get_int(e, label, what, 0, 1 << 20, &v, err));
        if (v == 1)
            return trex_err_set(err, TREX_EINVAL,
                                "%s: field '%s' = 1; a ratio is 0 (sliding window only), 4 (CSA) or >= 2 "
                                "(HCA)",
                                label, what);
        cfg->compress_ratios[i] = (int32_t)v;
    }
    cfg->n_compress_ratios = n;
    return TREX_OK;
}

static trex_code parse_rope(trex_config *cfg, const cJSON *j, const char *label, trex_err *err)
{
    cfg->yarn = false;
    if (cJSON_IsNull(j))
        return TREX_OK;
    if (!cJSON_IsObject(j))
        return trex_err_set(err, TREX_EINVAL,
                            "%s: field 'rope_scaling' must be null or an object {\"type\": \"yarn\", ...}, got %s",
                            label, json_type_name(j));
    bool seen[5] = {false};
    static const char *const names[5] = {"factor", "original_max_position_embeddings", "beta_fast",
                                         "beta_slow", "type"};
    for (const cJSON *e = j->child; e; e = e->next) {
        char what[96];
        snprintf(what, sizeof what, "rope_scaling.%s", e->string);
        int k;
        if (!strcmp(e->string, "rope_type"))
            k = 4;
        else
            for (k = 0; k < 5 && strcmp(e->string, names[k]); k++)
                ;
        if (k == 5)
            return trex_err_set(err, TREX_EINVAL,
                                "%s: unknown field '%s' (rope_scaling takes type, factor, "
                                "original_max_position_embeddings, beta_fast, beta_slow)",
                                label, what);
        if (seen[k])
            return trex_err_set(err, TREX_EINVAL, "%s: field '%s' is given twice", label, what);
        seen[k] = true;
        switch (k) {
        case 0:
            TREX_TRY(get_num(e, label, what, &cfg->rope_factor, err));
            break;
        case 1:
            TREX_TRY(get_int(e, label, what, 1, INT64_C(1) << 40, &cfg->rope_original_max_pos, err));
            break;
        case 2:
            TREX_TRY(get_num(e, label, what, &cfg->rope_beta_fast, err));
            break;
        case 3:
            TREX_TRY(get_num(e, label, what, &cfg->rope_beta_slow, err));
            break;
        default:
            if (!cJSON_IsString(e) || strcmp(e->valuestring, "yarn"))
                return trex_err_set(err, TREX_EUNSUPPORTED,
                                    "%s: field '%s' must be \"yarn\" (the only RoPE scaling DeepSeek-V4 uses); "
                                    "remove rope_scaling for plain RoPE",
                                    label, what);
        }
    }
    for (int k = 0; k < 5; k++)
        if (!seen[k])
            return trex_err_set(err, TREX_EINVAL, "%s: missing field 'rope_scaling.%s'", label,
                                k == 4 ? "type" : names[k]);
    cfg->yarn = true;
    if (!(cfg->rope_factor >= 1.0))
        return trex_err_set(err, TREX_EINVAL, "%s: field 'rope_scaling.factor' = %g must be >= 1", label,
                            cfg->rope_factor);
    if (!(cfg->rope_beta_slow > 0.0) || !(cfg->rope_beta_fast > cfg->rope_beta_slow))
        return trex_err_set(err, TREX_EINVAL,
                            "%s: fields 'rope_scaling.beta_fast' = %g and 'rope_scaling.beta_slow' = %g need "
                            "beta_fast > beta_slow > 0",
                            label, cfg->rope_beta_fast, cfg->rope_beta_slow);
    return TREX_OK;
}

/* A known field that trex does not use: check its type, and its value where it matters. */
static trex_code check_known(const field *f, const cJSON *j, const char *label, trex_err *err)
{
    switch (f->type) {
    case FT_STR_EQ:
        if (!cJSON_IsString(j) || strcmp(j->valuestring, f->want))
            return trex_err_set(err, TREX_EUNSUPPORTED,
                                "%s: field '%s' must be \"%s\" (the only value trex implements), got %s%s%s",
                                label, f->name, f->want, cJSON_IsString(j) ? "\"" : "",
                                cJSON_IsString(j) ? j->valuestring : json_type_name(j),
                                cJSON_IsString(j) ? "\"" : "");
        return TREX_OK;
    case FT_BOOL_EQ:
        if (!cJSON_IsBool(j) || cJSON_IsTrue(j) != f->want_bool)
            return trex_err_set(err, TREX_EUNSUPPORTED, "%s: field '%s' must be %s (%s)", label, f->name,
                                f->want_bool ? "true" : "false", f->want);
        return TREX_OK;
    case FT_ZERO:
        if (!cJSON_IsNumber(j) || j->valuedouble != 0.0)
            return trex_err_set(err, TREX_EUNSUPPORTED, "%s: field '%s' must be 0 (%s)", label, f->name,
                                f->want);
        return TREX_OK;
    case FT_STR:
        if (!cJSON_IsString(j) && !cJSON_IsNull(j))
            return trex_err_set(err, TREX_EINVAL, "%s: field '%s' must be a string, got %s", label, f->name,
                                json_type_name(j));
        return TREX_OK;
    case FT_OBJ:
        if (!cJSON_IsObject(j) && !cJSON_IsNull(j))
            return trex_err_set(err, TREX_EINVAL, "%s: field '%s' must be an object, got %s", label, f->name,
                                json_type_name(j));
        return TREX_OK;
    case FT_ANYBOOL:
        if (!cJSON_IsBool(j))
            return trex_err_set(err, TREX_EINVAL, "%s: field '%s' must be true or false, got %s", label,
                                f->name, json_type_name(j));
        return TREX_OK;
    case FT_STRLIST:
        if (!cJSON_IsArray(j))
            return trex_err_set(err, TREX_EINVAL, "%s: field '%s' must be an array of strings, got %s", label,
                                f->name, json_type_name(j));
        for (const cJSON *e = j->child; e; e = e->next)
            if (!cJSON_IsString(e))
                return trex_err_set(err, TREX_EINVAL, "%s: field '%s' must be an array of strings", label,
                                    f->name);
        return TREX_OK;
    case FT_OPT_INT: {
        int64_t v;
        return cJSON_IsNull(j) ? TREX_OK : get_int(j, label, f->name, INT64_MIN, INT64_MAX, &v, err);
    }
    default:
        TREX_ABORT("field %s: type %d is not a known-unused type", f->name, (int)f->type);
    }
}

static trex_code parse_field(trex_config *cfg, const field *f, const cJSON *j, const char *label,
                             trex_err *err)
{
    char *base = (char *)cfg;
    switch (f->type) {
    case FT_INT:
        return get_int(j, label, f->name, f->min, f->max, (int64_t *)(base + f->off), err);
    case FT_NUM:
        return get_num(j, label, f->name, (double *)(base + f->off), err);
    case FT_BOOL:
        if (!cJSON_IsBool(j))
            return trex_err_set(err, TREX_EINVAL, "%s: field '%s' must be true or false, got %s", label,
                                f->name, json_type_name(j));
        *(bool *)(base + f->off) = cJSON_IsTrue(j);
        return TREX_OK;
    case FT_TOKEN:
        if (cJSON_IsNull(j)) {
            *(int64_t *)(base + f->off) = -1;
            return TREX_OK;
        }
        return get_int(j, label, f->name, 0, DIM_MAX, (int64_t *)(base + f->off), err);
    case FT_RATIOS:
        return parse_ratios(cfg, j, label, err);
    case FT_ROPE:
        return parse_rope(cfg, j, label, err);
    default:
        return check_known(f, j, label, err);
    }
}

static trex_code fail(trex_err *err, trex_code code, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static trex_code fail(trex_err *err, trex_code code, const char *label, const char *fmt, ...)
{
    char msg[TREX_ERR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return trex_err_set(err, code, "%s: %s", label, msg);
}

/* Values checked against each other, once every field is in. */
static trex_code check_consistency(const trex_config *c, const char *label, trex_err *err)
{
    const int64_t L = c->num_hidden_layers;
    if (c->num_nextn_predict_layers > 1)
        return fail(err, TREX_EUNSUPPORTED, label,
                    "field 'num_nextn_predict_layers' = %lld; trex supports 0 or 1 MTP block (DeepSeek-V4 "
                    "uses 1)",
                    (long long)c->num_nextn_predict_layers);
    if (c->n_compress_ratios != L + c->num_nextn_predict_layers)
        return fail(err, TREX_EINVAL, label,
                    "field 'compress_ratios' has %lld entries but num_hidden_layers + "
                    "num_nextn_predict_layers = %lld; give one ratio per layer, then one for the MTP block",
                    (long long)c->n_compress_ratios, (long long)(L + c->num_nextn_predict_layers));
    bool any_csa = false;
    for (int64_t i = 0; i < L; i++)
        any_csa |= c->compress_ratios[i] == 4;
    if (c->num_nextn_predict_layers == 1 && c->compress_ratios[L] != 0)
        return fail(err, TREX_EUNSUPPORTED, label,
                    "field 'compress_ratios[%lld]' (the MTP block) = %d; the MTP block is a sliding-window "
                    "layer (ratio 0) and has no compressor in the checkpoint",
                    (long long)L, (int)c->compress_ratios[L]);
    if (c->num_key_value_heads != 1)
        return fail(err, TREX_EUNSUPPORTED, label,
                    "field 'num_key_value_heads' = %lld; DeepSeek-V4 uses one shared K=V head, set it to 1",
                    (long long)c->num_key_value_heads);
    if (c->qk_rope_head_dim % 2)
        return fail(err, TREX_EINVAL, label,
                    "field 'qk_rope_head_dim' = %lld must be even (RoPE rotates pairs)",
                    (long long)c->qk_rope_head_dim);
    if (c->head_dim <= c->qk_rope_head_dim)
        return fail(err, TREX_EINVAL, label,
                    "field 'head_dim' = %lld must be larger than 'qk_rope_head_dim' = %lld", (long long)c->head_dim,
                    (long long)c->qk_rope_head_dim);
    if (c->num_attention_heads % c->o_groups)
        return fail(err, TREX_EINVAL, label,
                    "field 'num_attention_heads' = %lld is not divisible by 'o_groups' = %lld; the output "
                    "projection groups heads evenly",
                    (long long)c->num_attention_heads, (long long)c->o_groups);
    if (any_csa && c->index_head_dim <= c->qk_rope_head_dim)
        return fail(err, TREX_EINVAL, label,
                    "field 'index_head_dim' = %lld must be larger than 'qk_rope_head_dim' = %lld (the "
                    "indexer of ratio-4 layers rotates its last qk_rope_head_dim dims)",
                    (long long)c->index_head_dim, (long long)c->qk_rope_head_dim);
    if (c->n_shared_experts != 1)
        return fail(err, TREX_EUNSUPPORTED, label,
                    "field 'n_shared_experts' = %lld; trex supports exactly 1 shared expert (as DeepSeek-V4)",
                    (long long)c->n_shared_experts);
    if (c->num_experts_per_tok > c->n_routed_experts)
        return fail(err, TREX_EINVAL, label,
                    "field 'num_experts_per_tok' = %lld exceeds 'n_routed_experts' = %lld",
                    (long long)c->num_experts_per_tok, (long long)c->n_routed_experts);
    if (c->num_hash_layers > L)
        return fail(err, TREX_EINVAL, label,
                    "field 'num_hash_layers' = %lld exceeds 'num_hidden_layers' = %lld",
                    (long long)c->num_hash_layers, (long long)L);
    if (c->tie_word_embeddings)
        return fail(err, TREX_EUNSUPPORTED, label,
                    "field 'tie_word_embeddings' must be false (DeepSeek-V4 has separate embed and head)");
    if (c->vocab_size > INT32_MAX)
        return fail(err, TREX_ERANGE, label, "field 'vocab_size' = %lld does not fit int32 token ids",
                    (long long)c->vocab_size);
    const struct {
        const char *name;
        double v, min;
    } pos[] = {
        {"rope_theta", c->rope_theta, 1.0},
        {"compress_rope_theta", c->compress_rope_theta, 1.0},
        {"routed_scaling_factor", c->routed_scaling_factor, 0.0},
        {"swiglu_limit", c->swiglu_limit, 0.0},
        {"hc_eps", c->hc_eps, 0.0},
        {"rms_norm_eps", c->rms_norm_eps, 0.0},
        {"initializer_range", c->initializer_range, 0.0},
    };
    for (size_t k = 0; k < sizeof pos / sizeof pos[0]; k++)
        if (!(pos[k].v > pos[k].min))
            return fail(err, TREX_EINVAL, label, "field '%s' = %g must be greater than %g", pos[k].name,
                        pos[k].v, pos[k].min);
    if (c->bos_token_id >= c->vocab_size || c->eos_token_id >= c->vocab_size)
        return fail(err, TREX_ERANGE, label, "field '%s' = %lld is not below vocab_size = %lld",
                    c->bos_token_id >= c->vocab_size ? "bos_token_id" : "eos_token_id",
                    (long long)(c->bos_token_id >= c->vocab_size ? c->bos_token_id : c->eos_token_id),
                    (long long)c->vocab_size);
    /* products that size tensors must fit comfortably in int64 (shapes are [out, in]) */
    const int64_t lim = INT64_C(1) << 40;
    if (c->num_attention_heads * c->head_dim > lim || c->hc_mult * c->hidden_size > lim ||
        c->index_n_heads * c->index_head_dim > lim || c->o_groups * c->o_lora_rank > lim ||
        (c->num_attention_heads / c->o_groups) * c->head_dim > lim)
        return fail(err, TREX_ERANGE, label,
                    "sizes too large: a projection dimension (heads x head_dim, hc_mult x hidden_size, "
                    "o_groups x o_lora_rank, ...) exceeds 2^40");
    return TREX_OK;
}

/* name = base name of label without ".json" (at most 63 chars). */
static void set_name(trex_config *cfg, const char *label)
{
    const char *b = strrchr(label, '/');
    b = b ? b + 1 : label;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".json"))
        n -= 5;
    if (n >= sizeof cfg->name)
        n = sizeof cfg->name - 1;
    memcpy(cfg->name, b, n);
    cfg->name[n] = '\0';
}

trex_code trex_config_from_json(trex_config *cfg, const cJSON *json, const char *label, trex_err *err)
{
    TREX_ASSERT(cfg && label);
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_token_id = -1;
    cfg->eos_token_id = -1;
    cfg->initializer_range = 0.02; /* Hugging Face default; DeepSeek-V4 ships 0.02 */
    set_name(cfg, label);
    if (!cJSON_IsObject(json))
        return trex_err_set(err, TREX_EFORMAT, "%s: a config must be a JSON object, got %s", label,
                            json ? json_type_name(json) : "nothing");
    bool seen[NFIELDS] = {false};
    for (const cJSON *e = json->child; e; e = e->next) {
        size_t k;
        for (k = 0; k < NFIELDS && strcmp(fields[k].name, e->string); k++)
            ;
        if (k == NFIELDS)
            return trex_err_set(err, TREX_EINVAL,
                                "%s: unknown field '%s' (not a DeepSeek-V4 config.json field, MODEL_SPEC §1.1); "
                                "remove it or fix its spelling",
                                label, e->string);
        if (seen[k])
            return trex_err_set(err, TREX_EINVAL, "%s: field '%s' is given twice; keep one", label,
                                e->string);
        seen[k] = true;
        TREX_TRY(parse_field(cfg, &fields[k], e, label, err));
    }
    for (size_t k = 0; k < NFIELDS; k++)
        if (fields[k].required && !seen[k])
            return trex_err_set(err, TREX_EINVAL,
                                "%s: missing required field '%s' (see MODEL_SPEC §1.1 or configs/ for an example)",
                                label, fields[k].name);
    return check_consistency(cfg, label, err);
}

trex_code trex_config_load(trex_config *cfg, const char *path, trex_err *err)
{
    TREX_ASSERT(cfg && path);
    cJSON *json = NULL;
    trex_code rc = trex_json_load(path, &json, err);
    if (rc != TREX_OK) {
        memset(cfg, 0, sizeof *cfg);
        return rc;
    }
    rc = trex_config_from_json(cfg, json, path, err);
    cJSON_Delete(json);
    return rc;
}
