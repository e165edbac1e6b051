/* trex/config.h — the DeepSeek-V4 model configuration (Hugging Face config.json field names).
 *
 * Field names follow MODEL_SPEC §1.1. trex_config_load rejects unknown fields, wrong types and
 * inconsistent values with a message naming the file and the field. */
#ifndef TREX_CONFIG_H
#define TREX_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "trex/status.h"

#define TREX_MAX_LAYERS 256 /* num_hidden_layers + num_nextn_predict_layers */

typedef struct trex_config {
    int64_t vocab_size;
    int64_t hidden_size;                /* d */
    int64_t num_hidden_layers;          /* main layers; the MTP block is layer num_hidden_layers */
    int64_t num_attention_heads;        /* H */
    int64_t num_key_value_heads;        /* must be 1 (shared K=V head) */
    int64_t head_dim;                   /* c */
    int64_t qk_rope_head_dim;           /* r: the last r dims of a head are rotated */
    int64_t q_lora_rank;                /* d_c */
    int64_t o_groups;                   /* G */
    int64_t o_lora_rank;                /* d_g */
    int64_t sliding_window;             /* n_win */
    int64_t n_compress_ratios;          /* num_hidden_layers + num_nextn_predict_layers */
    int32_t compress_ratios[TREX_MAX_LAYERS];
    double rope_theta;
    double compress_rope_theta;
    bool yarn;                          /* rope_scaling.type == "yarn" */
    double rope_factor;                 /* rope_scaling.factor */
    int64_t rope_original_max_pos;      /* rope_scaling.original_max_position_embeddings */
    double rope_beta_fast, rope_beta_slow;
    int64_t max_position_embeddings;
    int64_t index_n_heads;              /* n_I */
    int64_t index_head_dim;             /* c_I */
    int64_t index_topk;
    int64_t n_routed_experts;           /* E */
    int64_t n_shared_experts;           /* must be 1 */
    int64_t num_experts_per_tok;        /* K */
    int64_t moe_intermediate_size;
    double routed_scaling_factor;
    int64_t num_hash_layers;
    double swiglu_limit;
    int64_t hc_mult;                    /* n */
    int64_t hc_sinkhorn_iters;
    double hc_eps;
    double rms_norm_eps;
    int64_t num_nextn_predict_layers;   /* 0 or 1 */
    bool tie_word_embeddings;           /* must be false */
    int64_t bos_token_id, eos_token_id;
    double initializer_range;
    char name[64];                      /* from the file name, for messages and reports */
} trex_config;

/* Loads and validates a config.json. */
trex_code trex_config_load(trex_config *cfg, const char *path, trex_err *err);
/* Same from parsed JSON; label names the source in messages. */
trex_code trex_config_from_json(trex_config *cfg, const cJSON *json, const char *label, trex_err *err);

/* Number of layers with weights: num_hidden_layers + num_nextn_predict_layers. */
static inline int64_t trex_config_n_blocks(const trex_config *c)
{
    return c->num_hidden_layers + c->num_nextn_predict_layers;
}
/* compress ratio of block `layer` (0..n_blocks-1; layer num_hidden_layers is the MTP block). */
static inline int trex_config_ratio(const trex_config *c, int64_t layer)
{
    return c->compress_ratios[layer];
}
/* Hash-routed MoE: main layers below num_hash_layers (never the MTP block). */
static inline bool trex_config_is_hash(const trex_config *c, int64_t layer)
{
    return layer < c->num_hash_layers && layer < c->num_hidden_layers;
}

#endif
