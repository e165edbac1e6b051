/* tests/test_params.c — parameter layout, counts and weights.
 *
 * - V4-Flash and V4-Pro counts equal MODEL_SPEC §1.3 (exact integers, and the printed two-decimal
 *   figures); layout sizes, order, kinds, flags and offsets; name lookup of every tensor;
 * - the tiny config's names and shapes (MODEL_SPEC §7.1 with tiny sizes);
 * - initialisation values and determinism; save -> load round trip bit-exact;
 * - load rejects a missing tensor, a wrong shape, a wrong dtype, a repeated or out-of-range expert in a
 *   tid2eid row, an extra tensor and a quantisation scale, each with the tensor named;
 * - bf16 compute copies of the experts' weights: the packers' rounding of every routed and shared
 *   expert tensor, padded rows, [W1; W3] one matrix, as panels also the attention's projections but
 *   wo_a, nothing else copied; stale after a change of the
 *   weights until rewritten (reading a stale copy aborts); the optimizer's step writes them fresh
 *   (AdamW and Muon), and refuses copies it would not update. Run from the repository root. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "kernels/kernels.h"
#include "trex/config.h"
#include "trex/io.h"
#include "trex/optim.h"
#include "trex/params.h"
#include "trex/safetensors.h"
#include "trex/tensor.h"

static char tmpdir[256];
static bool verbose; /* TREX_TEST_VERBOSE=1 prints the load errors */

static bool load_cfg(trex_config *c, const char *path)
{
    trex_err err = {0};
    trex_code rc = trex_config_load(c, path, &err);
    CHECK(rc == TREX_OK, "%s: %s", path, err.msg);
    return rc == TREX_OK;
}

static const char *two(char *buf, size_t n, double v, double unit)
{
    snprintf(buf, n, "%.2f", v / unit);
    return buf;
}

static void check_shape(const trex_layout *lay, const char *name, int64_t s0, int64_t s1)
{
    const trex_param *p = trex_layout_find(lay, name);
    CHECK(p != NULL, "%s missing", name);
    if (!p)
        return;
    const int ndim = s1 < 0 ? 1 : 2;
    CHECK(p->ndim == ndim && p->shape[0] == s0 && (ndim == 1 || p->shape[1] == s1),
          "%s: shape [%" PRId64 ", %" PRId64 "] ndim %d, want [%" PRId64 ", %" PRId64 "]", name, p->shape[0],
          p->shape[1], p->ndim, s0, s1);
}

/* Structural invariants of any layout. */
static void check_layout_invariants(const trex_layout *lay, const trex_config *c)
{
    CHECK(lay->count > 0 && !strcmp(lay->params[0].name, "embed.weight"), "first tensor is embed.weight");
    CHECK(!strcmp(lay->params[lay->count - 1].name, "head.weight"), "last tensor is head.weight");
    int64_t nf = 0, ni = 0, ntr = 0, bad_off = 0, bad_find = 0, bad_flag = 0, prev_layer = -1;
    bool order_ok = true;
    for (int64_t k = 0; k < lay->count; k++) {
        const trex_param *p = &lay->params[k];
        int64_t *next = p->is_int ? &ni : &nf;
        if (p->offset < *next || p->offset % TREX_PARAM_ALIGN)
            bad_off++;
        *next = p->offset + p->numel;
        if (p->trainable)
            ntr += p->numel;
        if (trex_layout_find(lay, p->name) != p)
            bad_find++;
        const bool is_tid = strstr(p->name, "tid2eid") != NULL, is_bias = strstr(p->name, "gate.bias") != NULL;
        if (p->is_int != is_tid || p->trainable == (is_tid || is_bias) ||
            (is_tid && !trex_config_is_hash(c, p->layer)) || (is_bias && trex_config_is_hash(c, p->layer)))
            bad_flag++;
        if (p->layer >= 0) {
            if (p->layer < prev_layer)
                order_ok = false;
            prev_layer = p->layer;
        }
        if (p->expert >= 0 && (p->kind != TREX_P_EXPERT || p->expert >= c->n_routed_experts))
            bad_flag++;
    }
    CHECK(bad_off == 0 && nf <= lay->n_float && ni <= lay->n_int, "%" PRId64 " offsets out of order", bad_off);
    CHECK(lay->n_float - nf < TREX_PARAM_ALIGN && lay->n_int - ni < TREX_PARAM_ALIGN, "buffer sizes");
    CHECK(ntr == lay->n_trainable, "n_trainable %" PRId64 " vs %" PRId64, lay->n_trainable, ntr);
    CHECK(bad_find == 0, "%" PRId64 " tensors not found by name", bad_find);
    CHECK(bad_flag == 0, "%" PRId64 " tensors with wrong flags", bad_flag);
    CHECK(order_ok, "blocks in layer order");
    CHECK(trex_layout_find(lay, "layers.0.attn.nothing") == NULL, "absent name");
    CHECK(trex_layout_find(lay, "") == NULL, "empty name");
    const int64_t L = c->num_hidden_layers;
    char name[128];
    snprintf(name, sizeof name, "layers.%" PRId64 ".attn_norm.weight", L);
    CHECK(trex_layout_find(lay, name) == NULL, "no layer L");
    CHECK(trex_layout_find(lay, "mtp.0.attn.compressor.wkv.weight") == NULL, "MTP has no compressor");
    CHECK(trex_layout_find(lay, "mtp.0.attn.indexer.wq_b.weight") == NULL, "MTP has no indexer");
    CHECK(trex_layout_find(lay, "mtp.0.ffn.gate.tid2eid") == NULL, "MTP has no tid2eid");
    CHECK(trex_layout_find(lay, "mtp.0.ffn.gate.bias") != NULL, "MTP has gate.bias");
}

static void test_big(const char *path, int64_t want_count, int64_t total, int64_t active, int64_t mtp,
                     int64_t routed, int64_t attn, const char *s_total, const char *s_active,
                     const char *s_routed, const char *s_mtp, const int *ratios, const int64_t *per_layer,
                     int nratios, int64_t mtp_attn)
{
    trex_config c;
    trex_layout lay;
    trex_err err = {0};
    if (!load_cfg(&c, path))
        return;
    trex_code rc = trex_layout_build(&lay, &c, &err);
    CHECK(rc == TREX_OK, "%s: %s", path, err.msg);
    if (rc != TREX_OK)
        return;
    CHECK(lay.count == want_count, "%s: %" PRId64 " tensors, want %" PRId64, path, lay.count, want_count);
    trex_param_counts *n = malloc(sizeof *n);
    trex_layout_count(&lay, &c, n);
    char buf[32];
    CHECK(n->total == total, "%s: total %" PRId64, path, n->total);
    CHECK(n->active == active, "%s: active %" PRId64, path, n->active);
    CHECK(n->mtp == mtp, "%s: mtp %" PRId64, path, n->mtp);
    CHECK(n->routed == routed, "%s: routed %" PRId64, path, n->routed);
    CHECK(n->attn == attn, "%s: attention %" PRId64, path, n->attn);
    CHECK(!strcmp(two(buf, sizeof buf, (double)n->total, 1e9), s_total), "%s: total prints %s", path, buf);
    CHECK(!strcmp(two(buf, sizeof buf, (double)n->active, 1e9), s_active), "%s: active prints %s", path, buf);
    CHECK(!strcmp(two(buf, sizeof buf, (double)n->routed, 1e9), s_routed), "%s: routed prints %s", path, buf);
    CHECK(!strcmp(two(buf, sizeof buf, (double)n->mtp, 1e9), s_mtp), "%s: mtp prints %s", path, buf);
    CHECK(n->total_with_mtp == total + mtp, "%s: total with MTP", path);
    CHECK(n->embed == c.vocab_size * c.hidden_size && n->head == n->embed, "%s: embed/head", path);
    CHECK(n->routed_active * c.n_routed_experts == n->routed * c.num_experts_per_tok, "%s: routed active", path);
    CHECK(n->not_counted == c.num_hash_layers * c.vocab_size * c.num_experts_per_tok, "%s: tid2eid", path);
    CHECK(n->n_attn == nratios, "%s: %d attention types", path, n->n_attn);
    for (int k = 0; k < nratios && k < n->n_attn; k++) {
        CHECK(n->attn_by_ratio[k].ratio == ratios[k], "%s: ratio %d", path, n->attn_by_ratio[k].ratio);
        CHECK(n->attn_by_ratio[k].per_layer == per_layer[k], "%s: ratio %d: %" PRId64 " per layer", path, ratios[k],
              n->attn_by_ratio[k].per_layer);
    }
    CHECK(n->mtp_attn == mtp_attn, "%s: MTP attention %" PRId64, path, n->mtp_attn);
    int64_t sum = 0;
    for (int64_t k = 0; k < lay.count; k++)
        if (lay.params[k].kind != TREX_P_TID2EID)
            sum += lay.params[k].numel;
    CHECK(sum == n->total_with_mtp, "%s: components add up", path);
    check_layout_invariants(&lay, &c);
    free(n);
    trex_layout_free(&lay);
}

static void test_flash_pro(void)
{
    /* Flash tensors: per block 21 + 3E (hc 6, norms 2, attn 8, gate 2, shared 3), + 4 compressor (ratio > 0),
     * + 6 indexer (ratio 4); MTP + 8; global 6.  2*789 + 21*799 + 20*793 + 797 + 6 = 35020. */
    const int fr[3] = {0, 4, 128};
    const int64_t fp[3] = {106956352, 126098624, 111216704};
    test_big("configs/deepseek-v4-flash.json", 35020, 284332240471, 13270101591, 6610048891, 277025390592,
             5086317888, "284.33", "13.27", "277.03", "6.61", fr, fp, 3, 106956352);
    /* Pro: 30*(1173+10) + 31*(1173+4) + 1181 + 6 = 73164; the SWA figure 299.89M is the MTP block's. */
    const int pr[2] = {4, 128};
    const int64_t pp[2] = {331292416, 307300992};
    test_big("configs/deepseek-v4-pro.json", 73164, 1572997201763, 48852402019, 25840145979, 1547396186112,
             19465103232, "1573.00", "48.85", "1547.40", "25.84", pr, pp, 2, 299894912);
    char buf[32];
    CHECK(!strcmp(two(buf, sizeof buf, 106956352, 1e6), "106.96"), "SWA prints %s", buf);
    CHECK(!strcmp(two(buf, sizeof buf, 126098624, 1e6), "126.10"), "CSA prints %s", buf);
    CHECK(!strcmp(two(buf, sizeof buf, 111216704, 1e6), "111.22"), "HCA prints %s", buf);
    CHECK(!strcmp(two(buf, sizeof buf, 299894912, 1e6), "299.89"), "Pro SWA prints %s", buf);
}

static void test_tiny_layout(void)
{
    trex_config c;
    trex_layout lay;
    trex_err err = {0};
    if (!load_cfg(&c, "configs/dsv4-tiny.json"))
        return;
    CHECK(trex_layout_build(&lay, &c, &err) == TREX_OK, "%s", err.msg);
    check_layout_invariants(&lay, &c);
    /* d 256, H 4, c 128, dc 128, G 2, dg 128, nI 4, cI 128, E 8, K 2, inter 256, V 4096, n 4 */
    check_shape(&lay, "embed.weight", 4096, 256);
    check_shape(&lay, "head.weight", 4096, 256);
    check_shape(&lay, "norm.weight", 256, -1);
    check_shape(&lay, "hc_head_fn", 4, 1024);
    check_shape(&lay, "hc_head_base", 4, -1);
    check_shape(&lay, "hc_head_scale", 1, -1);
    check_shape(&lay, "layers.0.hc_attn_fn", 24, 1024);
    check_shape(&lay, "layers.0.hc_attn_base", 24, -1);
    check_shape(&lay, "layers.0.hc_ffn_scale", 3, -1);
    check_shape(&lay, "layers.0.attn_norm.weight", 256, -1);
    check_shape(&lay, "layers.0.attn.wq_a.weight", 128, 256);
    check_shape(&lay, "layers.0.attn.q_norm.weight", 128, -1);
    check_shape(&lay, "layers.0.attn.wq_b.weight", 512, 128);
    check_shape(&lay, "layers.0.attn.wkv.weight", 128, 256);
    check_shape(&lay, "layers.0.attn.kv_norm.weight", 128, -1);
    check_shape(&lay, "layers.0.attn.wo_a.weight", 256, 256);
    check_shape(&lay, "layers.0.attn.wo_b.weight", 256, 256);
    check_shape(&lay, "layers.0.attn.attn_sink", 4, -1);
    CHECK(!trex_layout_find(&lay, "layers.0.attn.compressor.wkv.weight"), "SWA layer 0 has no compressor");
    check_shape(&lay, "layers.1.attn.compressor.wkv.weight", 256, 256);
    check_shape(&lay, "layers.1.attn.compressor.wgate.weight", 256, 256);
    check_shape(&lay, "layers.1.attn.compressor.ape", 4, 256);
    check_shape(&lay, "layers.1.attn.compressor.norm.weight", 128, -1);
    check_shape(&lay, "layers.1.attn.indexer.wq_b.weight", 512, 128);
    check_shape(&lay, "layers.1.attn.indexer.weights_proj.weight", 4, 256);
    check_shape(&lay, "layers.1.attn.indexer.compressor.wkv.weight", 256, 256);
    check_shape(&lay, "layers.1.attn.indexer.compressor.ape", 4, 256);
    check_shape(&lay, "layers.1.attn.indexer.compressor.norm.weight", 128, -1);
    check_shape(&lay, "layers.2.attn.compressor.wkv.weight", 128, 256);
    check_shape(&lay, "layers.2.attn.compressor.ape", 16, 128);
    CHECK(!trex_layout_find(&lay, "layers.2.attn.indexer.wq_b.weight"), "HCA layer has no indexer");
    check_shape(&lay, "layers.0.ffn.gate.weight", 8, 256);
    check_shape(&lay, "layers.0.ffn.gate.tid2eid", 4096, 2);
    check_shape(&lay, "layers.1.ffn.gate.tid2eid", 4096, 2);
    CHECK(!trex_layout_find(&lay, "layers.2.ffn.gate.tid2eid"), "layer 2 is not hash-routed");
    CHECK(!trex_layout_find(&lay, "layers.1.ffn.gate.bias"), "hash layer has no bias");
    check_shape(&lay, "layers.2.ffn.gate.bias", 8, -1);
    check_shape(&lay, "layers.5.ffn.experts.7.w1.weight", 256, 256);
    check_shape(&lay, "layers.5.ffn.experts.7.w2.weight", 256, 256);
    CHECK(!trex_layout_find(&lay, "layers.5.ffn.experts.8.w1.weight"), "only 8 experts");
    check_shape(&lay, "layers.3.ffn.shared_experts.w3.weight", 256, 256);
    check_shape(&lay, "mtp.0.e_proj.weight", 256, 256);
    check_shape(&lay, "mtp.0.h_proj.weight", 256, 256);
    check_shape(&lay, "mtp.0.enorm.weight", 256, -1);
    check_shape(&lay, "mtp.0.hnorm.weight", 256, -1);
    check_shape(&lay, "mtp.0.norm.weight", 256, -1);
    check_shape(&lay, "mtp.0.hc_head_fn", 4, 1024);
    check_shape(&lay, "mtp.0.attn.wq_a.weight", 128, 256);
    check_shape(&lay, "mtp.0.ffn.experts.0.w3.weight", 256, 256);
    /* the documented order inside a block and at the end */
    static const char *const order[] = {
        "layers.1.hc_attn_fn", "layers.1.hc_attn_base", "layers.1.hc_attn_scale", "layers.1.attn_norm.weight",
        "layers.1.attn.wq_a.weight", "layers.1.attn.q_norm.weight", "layers.1.attn.wq_b.weight",
        "layers.1.attn.wkv.weight", "layers.1.attn.kv_norm.weight", "layers.1.attn.wo_a.weight",
        "layers.1.attn.wo_b.weight", "layers.1.attn.attn_sink", "layers.1.attn.compressor.wkv.weight",
        "layers.1.attn.compressor.wgate.weight", "layers.1.attn.compressor.ape",
        "layers.1.attn.compressor.norm.weight", "layers.1.attn.indexer.wq_b.weight",
        "layers.1.attn.indexer.weights_proj.weight", "layers.1.attn.indexer.compressor.wkv.weight",
        "layers.1.attn.indexer.compressor.wgate.weight", "layers.1.attn.indexer.compressor.ape",
        "layers.1.attn.indexer.compressor.norm.weight", "layers.1.hc_ffn_fn", "layers.1.hc_ffn_base",
        "layers.1.hc_ffn_scale", "layers.1.ffn_norm.weight", "layers.1.ffn.gate.weight",
        "layers.1.ffn.gate.tid2eid", "layers.1.ffn.experts.0.w1.weight", "layers.1.ffn.experts.0.w3.weight",
        "layers.1.ffn.experts.0.w2.weight", "layers.1.ffn.experts.1.w1.weight"};
    const trex_param *first = trex_layout_find(&lay, order[0]);
    for (size_t k = 0; first && k < sizeof order / sizeof order[0]; k++)
        CHECK(first + k < lay.params + lay.count && !strcmp(first[k].name, order[k]), "order: %s at %zu",
              order[k], k);
    static const char *const tail[] = {"mtp.0.ffn.shared_experts.w2.weight", "mtp.0.e_proj.weight",
                                       "mtp.0.h_proj.weight", "mtp.0.enorm.weight", "mtp.0.hnorm.weight",
                                       "mtp.0.norm.weight", "mtp.0.hc_head_fn", "mtp.0.hc_head_base",
                                       "mtp.0.hc_head_scale", "hc_head_fn", "hc_head_base", "hc_head_scale",
                                       "norm.weight", "head.weight"};
    const int64_t nt = (int64_t)(sizeof tail / sizeof tail[0]);
    for (int64_t k = 0; k < nt; k++)
        CHECK(!strcmp(lay.params[lay.count - nt + k].name, tail[k]), "tail order: %s", tail[k]);
    /* every expert's (and shared expert's) w3 starts where its w1 ends: [W1; W3] is one matrix in
     * place (bf16 mode's MoE products rely on it where they can, docs/params.md) */
    int64_t n_w1 = 0, bad_w13 = 0;
    for (int64_t k = 0; k < lay.count; k++) {
        const trex_param *w1 = &lay.params[k];
        const size_t len = strlen(w1->name);
        if (len < 10 || strcmp(w1->name + len - 10, ".w1.weight") != 0)
            continue;
        char name3[256];
        snprintf(name3, sizeof name3, "%.*s.w3.weight", (int)(len - 10), w1->name);
        const trex_param *w3 = trex_layout_find(&lay, name3);
        n_w1++;
        bad_w13 += !w3 || w3->offset != w1->offset + w1->numel || w3 != w1 + 1;
    }
    CHECK(n_w1 == 7 * 9 && bad_w13 == 0, "%" PRId64 " of %" PRId64 " w3 tensors not right after their w1",
          bad_w13, n_w1);
    const trex_param *p = trex_layout_find(&lay, "layers.4.ffn.experts.3.w2.weight");
    CHECK(p && p->expert == 3 && p->layer == 4 && p->kind == TREX_P_EXPERT && p->trainable, "expert fields");
    p = trex_layout_find(&lay, "mtp.0.attn.wkv.weight");
    CHECK(p && p->layer == 6 && p->kind == TREX_P_ATTN, "MTP layer index");
    p = trex_layout_find(&lay, "hc_head_fn");
    CHECK(p && p->layer == -1 && p->kind == TREX_P_HC_FN, "global hc_head_fn");
    /* counts: ~16M main, ~18M with MTP (MODEL_SPEC §11.1) */
    trex_param_counts *n = malloc(sizeof *n);
    trex_layout_count(&lay, &c, n);
    CHECK(n->total > 15000000 && n->total < 17000000, "tiny total %" PRId64, n->total);
    CHECK(n->total_with_mtp > 17000000 && n->total_with_mtp < 19000000, "tiny with MTP %" PRId64,
          n->total_with_mtp);
    free(n);
    trex_layout_free(&lay);
}

/* A small config for the weights tests: the tiny config with smaller sizes. */
static bool micro_config(trex_config *c)
{
    cJSON *j = NULL;
    trex_err err = {0};
    if (trex_json_load("configs/dsv4-tiny.json", &j, &err) != TREX_OK) {
        CHECK(0, "%s", err.msg);
        return false;
    }
    static const struct {
        const char *k;
        double v;
    } set[] = {{"vocab_size", 64},     {"hidden_size", 32},      {"num_hidden_layers", 4},
               {"head_dim", 16},       {"qk_rope_head_dim", 8},  {"q_lora_rank", 16},
               {"o_lora_rank", 16},    {"index_head_dim", 16},   {"moe_intermediate_size", 16},
               {"n_routed_experts", 5}, {"num_experts_per_tok", 3}, {"num_hash_layers", 2}};
    for (size_t k = 0; k < sizeof set / sizeof set[0]; k++)
        cJSON_ReplaceItemInObjectCaseSensitive(j, set[k].k, cJSON_CreateNumber(set[k].v));
    cJSON_ReplaceItemInObjectCaseSensitive(j, "compress_ratios", cJSON_Parse("[0, 4, 8, 4, 0]"));
    trex_code rc = trex_config_from_json(c, j, "micro.json", &err);
    CHECK(rc == TREX_OK, "micro: %s", err.msg);
    cJSON_Delete(j);
    return rc == TREX_OK;
}

static bool same_weights(const trex_weights *a, const trex_weights *b)
{
    return a->layout.n_float == b->layout.n_float && a->layout.n_int == b->layout.n_int &&
           !memcmp(a->f, b->f, (size_t)a->layout.n_float * sizeof(float)) &&
           !memcmp(a->i, b->i, (size_t)a->layout.n_int * sizeof(int32_t));
}

static void test_init(void)
{
    trex_config c, cs;
    trex_weights w, w2, ws;
    trex_mem mem = {0};
    trex_err err = {0};
    if (!load_cfg(&c, "configs/dsv4-tiny.json") || !load_cfg(&cs, "configs/dsv4-tiny-strict.json"))
        return;
    CHECK(trex_weights_init(&w, &c, 7, &mem, &err) == TREX_OK, "init: %s", err.msg);
    CHECK(mem.live[TREX_REGION_PARAMS] >= (size_t)w.layout.n_float * 4, "charged to PARAMS");
    CHECK(trex_weights_init(&w2, &c, 7, &mem, &err) == TREX_OK, "init: %s", err.msg);
    CHECK(same_weights(&w, &w2), "same seed, same weights");
    trex_weights_free(&w2);
    for (int threads = 2; threads <= 3; threads++) { /* pairs split between threads: the same values */
        trex_pool *pool = trex_pool_create(threads);
        CHECK(pool && trex_weights_init_pool(pool, &w2, &c, 7, &mem, &err) == TREX_OK, "init, %d threads: %s",
              threads, err.msg);
        CHECK(pool && same_weights(&w, &w2), "%d threads, same weights", threads);
        if (pool)
            trex_weights_free(&w2);
        trex_pool_destroy(pool);
    }
    CHECK(trex_weights_init(&w2, &c, 8, &mem, &err) == TREX_OK, "init: %s", err.msg);
    CHECK(memcmp(w.f, w2.f, 4096 * sizeof(float)) != 0, "another seed, other weights");
    trex_weights_free(&w2);
    /* values depend on (seed, name, index) only: the strict config shares embed.weight and layer 1 */
    CHECK(trex_weights_init(&ws, &cs, 7, &mem, &err) == TREX_OK, "init strict: %s", err.msg);
    static const char *const shared_names[] = {"embed.weight", "layers.1.attn.wq_b.weight",
                                               "layers.3.ffn.experts.5.w2.weight", "head.weight"};
    for (size_t k = 0; k < sizeof shared_names / sizeof shared_names[0]; k++) {
        const trex_param *p = trex_layout_find(&w.layout, shared_names[k]);
        float *a = trex_weights_get(&w, shared_names[k]), *b = trex_weights_get(&ws, shared_names[k]);
        CHECK(p && a && b && !memcmp(a, b, (size_t)p->numel * sizeof(float)), "%s independent of layout",
              shared_names[k]);
    }
    trex_weights_free(&ws);
    /* conventions: norms 1, hc scale 0.01, base/sink/bias 0, linear N(0, 0.02) */
    const float *x = trex_weights_get(&w, "layers.2.attn.kv_norm.weight");
    CHECK(x && x[0] == 1.0f && x[127] == 1.0f, "norm = 1");
    x = trex_weights_get(&w, "layers.2.hc_ffn_scale");
    CHECK(x && x[0] == 0.01f && x[2] == 0.01f, "hc scale = 0.01");
    x = trex_weights_get(&w, "layers.2.hc_ffn_base");
    CHECK(x && x[0] == 0.0f && x[23] == 0.0f, "hc base = 0");
    x = trex_weights_get(&w, "layers.2.attn.attn_sink");
    CHECK(x && x[0] == 0.0f && x[3] == 0.0f, "sink = 0");
    x = trex_weights_get(&w, "layers.2.ffn.gate.bias");
    CHECK(x && x[0] == 0.0f && x[7] == 0.0f, "gate bias = 0");
    CHECK(trex_weights_get(&w, "layers.0.ffn.gate.tid2eid") == NULL, "tid2eid is not a float tensor");
    static const char *const normal[] = {"embed.weight", "layers.0.hc_attn_fn", "layers.1.attn.compressor.ape",
                                         "layers.4.ffn.experts.2.w1.weight", "layers.4.ffn.gate.weight"};
    for (size_t k = 0; k < sizeof normal / sizeof normal[0]; k++) {
        const trex_param *p = trex_layout_find(&w.layout, normal[k]);
        const float *v = w.f + p->offset;
        double s = 0, s2 = 0;
        for (int64_t e = 0; e < p->numel; e++) {
            s += v[e];
            s2 += (double)v[e] * v[e];
        }
        const double mean = s / (double)p->numel, sd = sqrt(s2 / (double)p->numel - mean * mean);
        CHECK(fabs(mean) < 5 * 0.02 / sqrt((double)p->numel) + 1e-12 && fabs(sd - 0.02) < 0.1 * 0.02,
              "%s: mean %g sd %g", normal[k], mean, sd);
    }
    /* tid2eid: K distinct experts in [0, E) per row, every expert used */
    const trex_param *t = trex_layout_find(&w.layout, "layers.1.ffn.gate.tid2eid");
    int64_t bad = 0, used[8] = {0};
    for (int64_t v = 0; t && v < t->shape[0]; v++) {
        const int32_t *row = w.i + t->offset + v * 2;
        bad += row[0] < 0 || row[0] >= 8 || row[1] < 0 || row[1] >= 8 || row[0] == row[1];
        for (int q = 0; q < 2; q++)
            if (row[q] >= 0 && row[q] < 8)
                used[row[q]]++;
    }
    CHECK(t && bad == 0, "%" PRId64 " bad tid2eid rows", bad);
    for (int e = 0; e < 8; e++)
        CHECK(used[e] > 700 && used[e] < 1350, "expert %d in %" PRId64 " of 4096 rows (expect ~1024)", e, used[e]);
    const trex_param *t0 = trex_layout_find(&w.layout, "layers.0.ffn.gate.tid2eid");
    CHECK(t0 && memcmp(w.i + t0->offset, w.i + t->offset, 4096 * 2 * sizeof(int32_t)), "layers differ");
    /* round trip through a file, bit-exact */
    char path[512];
    snprintf(path, sizeof path, "%s/tiny.safetensors", tmpdir);
    CHECK(trex_weights_save(&w, path, &err) == TREX_OK, "save: %s", err.msg);
    CHECK(trex_weights_load(&w2, &c, path, &mem, &err) == TREX_OK, "load: %s", err.msg);
    CHECK(same_weights(&w, &w2), "round trip bit-exact");
    trex_weights_free(&w2);
    /* the file has F32 tensors and an I64 tid2eid, in layout order */
    trex_st_file *f = NULL;
    if (trex_st_open(&f, path, &err) == TREX_OK) {
        CHECK(trex_st_count(f) == w.layout.count, "tensor count");
        int64_t bad_order = 0;
        for (int64_t k = 0; k < trex_st_count(f) && k < w.layout.count; k++) {
            const trex_st_entry *e = trex_st_entry_at(f, k);
            bad_order += strcmp(e->name, w.layout.params[k].name) != 0 ||
                         e->dtype != (w.layout.params[k].is_int ? TREX_I64 : TREX_F32);
        }
        CHECK(bad_order == 0, "%" PRId64 " tensors out of order or of the wrong dtype", bad_order);
        trex_st_close(f);
    } else {
        CHECK(0, "reopen: %s", err.msg);
    }
    /* the file does not fit the strict config (its HCA compressor ape has 128 rows) */
    CHECK(trex_weights_load(&ws, &cs, path, &mem, &err) != TREX_OK &&
              strstr(err.msg, "layers.2.attn.compressor.ape") && strstr(err.msg, "[16, 128]"),
          "wrong config: %s", err.msg);
    unlink(path);
    trex_weights_free(&w);
    CHECK(mem.live[TREX_REGION_PARAMS] == 0, "everything freed (%zu bytes live)", mem.live[TREX_REGION_PARAMS]);
}

/* Writes the weights with one change: skip `skip`; replace tensor `repl` by (dt, shape, data);
 * add an extra tensor `extra`. */
typedef struct variant {
    const char *label;
    const char *skip;
    const char *repl;
    trex_dtype dt;
    int ndim;
    int64_t shape[2];
    const void *data;
    const char *extra;
    const char *expect; /* substring of the message besides the tensor name (NULL: load must succeed) */
} variant;

static trex_code write_variant(const trex_weights *w, const variant *v, const int64_t *ints, const char *path,
                               trex_err *err)
{
    trex_st_writer *wr = trex_st_writer_create();
    trex_code rc = TREX_OK;
    for (int64_t k = 0; k < w->layout.count && rc == TREX_OK; k++) {
        const trex_param *p = &w->layout.params[k];
        if (v->skip && !strcmp(p->name, v->skip))
            continue;
        if (v->repl && !strcmp(p->name, v->repl))
            rc = trex_st_writer_add(wr, p->name, v->dt, v->ndim, v->shape, v->data, err);
        else if (p->is_int)
            rc = trex_st_writer_add(wr, p->name, TREX_I64, p->ndim, p->shape, ints + p->offset, err);
        else
            rc = trex_st_writer_add(wr, p->name, TREX_F32, p->ndim, p->shape, w->f + p->offset, err);
    }
    static const float one[2] = {1, 2};
    const int64_t two_shape[1] = {2};
    if (rc == TREX_OK && v->extra)
        rc = trex_st_writer_add(wr, v->extra, TREX_F32, 1, two_shape, one, err);
    if (rc == TREX_OK)
        rc = trex_st_writer_write(wr, path, err);
    trex_st_writer_destroy(wr);
    return rc;
}

/* Writes the weights with every expert's (and shared expert's) tensors in the order w1, w2, w3: the
 * layout's order before the sixth sitting of issue 4 (now w1, w3, w2). */
static trex_code write_old_order(const trex_weights *w, const int64_t *ints, const char *path, trex_err *err)
{
    trex_st_writer *wr = trex_st_writer_create();
    trex_code rc = TREX_OK;
    const trex_param *held = NULL; /* a w3 waiting for its w2 */
    for (int64_t k = 0; k < w->layout.count && rc == TREX_OK; k++) {
        const trex_param *p = &w->layout.params[k];
        const size_t len = strlen(p->name);
        if (len > 10 && !strcmp(p->name + len - 10, ".w3.weight")) {
            held = p;
            continue;
        }
        for (int q = 0; q < 2 && rc == TREX_OK; q++) {
            const trex_param *t = q == 0 ? p : held;
            if (!t)
                continue;
            rc = t->is_int ? trex_st_writer_add(wr, t->name, TREX_I64, t->ndim, t->shape, ints + t->offset, err)
                           : trex_st_writer_add(wr, t->name, TREX_F32, t->ndim, t->shape, w->f + t->offset, err);
        }
        held = NULL;
    }
    if (rc == TREX_OK)
        rc = trex_st_writer_write(wr, path, err);
    trex_st_writer_destroy(wr);
    return rc;
}

static void test_load_errors(void)
{
    trex_config c;
    trex_weights w, w2;
    trex_mem mem = {0};
    trex_err err = {0};
    if (!micro_config(&c))
        return;
    CHECK(trex_weights_init(&w, &c, 3, &mem, &err) == TREX_OK, "micro init: %s", err.msg);
    int64_t *ints = calloc((size_t)w.layout.n_int, sizeof *ints);
    for (int64_t k = 0; k < w.layout.n_int; k++)
        ints[k] = w.i[k];
    const trex_param *tid = trex_layout_find(&w.layout, "layers.1.ffn.gate.tid2eid"); /* [64, 3] */
    const trex_param *norm = trex_layout_find(&w.layout, "layers.0.attn_norm.weight"); /* [32] */
    const trex_param *ape = trex_layout_find(&w.layout, "layers.2.attn.compressor.ape"); /* [8, 16] */
    const trex_param *emb = trex_layout_find(&w.layout, "embed.weight");               /* [64, 32] */
    CHECK(tid && tid->shape[0] == 64 && tid->shape[1] == 3, "micro tid2eid");
    CHECK(ape && ape->shape[0] == 8 && ape->shape[1] == 16, "micro ape");
    if (!tid || !norm || !ape || !emb)
        return;
    int64_t *dup = malloc((size_t)tid->numel * sizeof *dup), *oor = malloc((size_t)tid->numel * sizeof *dup);
    int32_t *i32 = malloc((size_t)tid->numel * sizeof *i32);
    memcpy(dup, ints + tid->offset, (size_t)tid->numel * sizeof *dup);
    memcpy(oor, dup, (size_t)tid->numel * sizeof *dup);
    for (int64_t k = 0; k < tid->numel; k++)
        i32[k] = (int32_t)dup[k];
    dup[17 * 3 + 2] = dup[17 * 3 + 0];
    oor[9 * 3 + 1] = 5;
    double f64[32];
    for (int k = 0; k < 32; k++)
        f64[k] = 1.0;
    uint16_t *bf = malloc((size_t)emb->numel * sizeof *bf);
    for (int64_t k = 0; k < emb->numel; k++)
        bf[k] = trex_f32_to_bf16(w.f[emb->offset + k]);
    uint8_t fp8[32] = {0};
    const variant vars[] = {
        {"missing", "layers.3.attn.wkv.weight", NULL, 0, 0, {0}, NULL, NULL, "missing"},
        {"shape", NULL, "layers.2.attn.compressor.ape", TREX_F32, 2, {16, 8}, w.f + ape->offset, NULL, "[16, 8]"},
        {"rank", NULL, "layers.0.attn_norm.weight", TREX_F32, 2, {1, 32}, w.f + norm->offset, NULL, "shape"},
        {"dtype f64", NULL, "layers.0.attn_norm.weight", TREX_F64, 1, {32}, f64, NULL, "F64"},
        {"dtype fp8", NULL, "layers.0.attn_norm.weight", TREX_F8_E4M3, 1, {32}, fp8, NULL, "F8_E4M3"},
        {"dtype tid f32", NULL, "layers.1.ffn.gate.tid2eid", TREX_F32, 2, {64, 3}, w.f, NULL, "I64"},
        {"repeated expert", NULL, "layers.1.ffn.gate.tid2eid", TREX_I64, 2, {64, 3}, dup, NULL, "row 17"},
        {"expert out of range", NULL, "layers.1.ffn.gate.tid2eid", TREX_I64, 2, {64, 3}, oor, NULL, "row 9"},
        {"extra", NULL, NULL, 0, 0, {0}, NULL, "layers.0.attn.extra", "unexpected"},
        {"scale", NULL, NULL, 0, 0, {0}, NULL, "layers.0.attn.wq_a.scale", "dequantis"},
        {"bf16 ok", NULL, "embed.weight", TREX_BF16, 2, {64, 32}, bf, NULL, NULL},
        {"i32 tid ok", NULL, "layers.1.ffn.gate.tid2eid", TREX_I32, 2, {64, 3}, i32, NULL, NULL},
    };
    char path[512];
    snprintf(path, sizeof path, "%s/micro.safetensors", tmpdir);
    for (size_t k = 0; k < sizeof vars / sizeof vars[0]; k++) {
        const variant *v = &vars[k];
        trex_code rc = write_variant(&w, v, ints, path, &err);
        CHECK(rc == TREX_OK, "%s: write: %s", v->label, err.msg);
        if (rc != TREX_OK)
            continue;
        memset(&err, 0, sizeof err);
        rc = trex_weights_load(&w2, &c, path, &mem, &err);
        if (verbose)
            printf("%-20s -> %s\n", v->label, rc == TREX_OK ? "ok" : err.msg);
        if (!v->expect) {
            CHECK(rc == TREX_OK, "%s: %s", v->label, err.msg);
            if (rc == TREX_OK) {
                const trex_param *p = trex_layout_find(&w2.layout, v->repl);
                bool eq = true;
                for (int64_t e = 0; e < p->numel; e++)
                    eq &= p->is_int ? w2.i[p->offset + e] == w.i[p->offset + e]
                                    : w2.f[p->offset + e] == trex_bf16_to_f32(bf[e]);
                CHECK(eq, "%s: values", v->label);
                trex_weights_free(&w2);
            }
            continue;
        }
        const char *tensor = v->skip ? v->skip : v->repl ? v->repl : v->extra;
        CHECK(rc != TREX_OK, "%s: accepted", v->label);
        CHECK(strstr(err.msg, tensor) != NULL, "%s: message lacks the tensor %s: %s", v->label, tensor, err.msg);
        CHECK(strstr(err.msg, path) != NULL, "%s: message lacks the file: %s", v->label, err.msg);
        CHECK(strstr(err.msg, v->expect) != NULL, "%s: message lacks \"%s\": %s", v->label, v->expect, err.msg);
        CHECK(w2.f == NULL && w2.layout.params == NULL, "%s: nothing left allocated", v->label);
    }
    /* A file in the old tensor order (w1, w2, w3 per expert) loads by name: the same weights. */
    CHECK(write_old_order(&w, ints, path, &err) == TREX_OK, "old order: write: %s", err.msg);
    trex_st_file *f = NULL;
    if (trex_st_open(&f, path, &err) == TREX_OK) {
        int64_t moved = 0;
        for (int64_t k = 0; k < trex_st_count(f) && k < w.layout.count; k++)
            moved += strcmp(trex_st_entry_at(f, k)->name, w.layout.params[k].name) != 0;
        CHECK(trex_st_count(f) == w.layout.count && moved > 0, "old order: %" PRId64 " tensors at other places",
              moved);
        trex_st_close(f);
    }
    CHECK(trex_weights_load(&w2, &c, path, &mem, &err) == TREX_OK, "old order: load: %s", err.msg);
    if (w2.f) {
        CHECK(same_weights(&w, &w2), "old order: the same weights by name");
        trex_weights_free(&w2);
    }
    /* not a file */
    snprintf(path, sizeof path, "%s/none.safetensors", tmpdir);
    CHECK(trex_weights_load(&w2, &c, path, &mem, &err) != TREX_OK && strstr(err.msg, "none.safetensors"),
          "missing file: %s", err.msg);
    snprintf(path, sizeof path, "%s/micro.safetensors", tmpdir);
    unlink(path);
    free(dup);
    free(oor);
    free(i32);
    free(bf);
    free(ints);
    trex_weights_free(&w);
    CHECK(mem.live[TREX_REGION_PARAMS] == 0, "everything freed");
}

/* Whether every expert tensor's bf16 copy holds the rounding of its fp32 values (pads zero, w3's copy
 * right after w1's); counts the copied tensors in *n. */
static bool copies_match(const trex_weights *w, int64_t *n)
{
    bool ok = true;
    *n = 0;
    const float *w1 = NULL;
    const uint16_t *c1 = NULL;
    for (int64_t k = 0; k < w->layout.count; k++) {
        const trex_param *p = &w->layout.params[k];
        const bool expert = p->kind == TREX_P_EXPERT || p->kind == TREX_P_SHARED_EXPERT;
        int64_t ld = 0;
        const uint16_t *c = p->is_int ? NULL : trex_wcopy_find(w->bf16, w->f + p->offset, &ld);
        if (!expert || !c) {
            ok = ok && !expert && !c;
            continue;
        }
        (*n)++;
        const int64_t rows = p->shape[0], cols = p->shape[1];
        ok = ok && ld == cols + TREX_WCOPY_PAD;
        for (int64_t r = 0; r < rows && ok; r++)
            for (int64_t j = 0; j < ld && ok; j++)
                ok = c[r * ld + j] == (j < cols ? trex_f32_to_bf16(w->f[p->offset + r * cols + j]) : 0);
        const size_t len = strlen(p->name);
        if (len > 9 && !strcmp(p->name + len - 9, "w1.weight"))
            w1 = w->f + p->offset, c1 = c;
        else if (len > 9 && !strcmp(p->name + len - 9, "w3.weight"))
            ok = ok && w1 && c == c1 + rows * ld; /* [W1; W3] one matrix */
    }
    return ok;
}

/* Whether the panels at got equal trex_gemm_pack_b of B (fp32, tb, N, K, ldb), byte for byte. */
static bool panels_equal(const uint16_t *got, bool tb, int64_t N, int64_t K, const float *B, int64_t ldb)
{
    trex_gemm_packed *p = trex_gemm_pack_b(NULL, TREX_F32, tb, N, K, B, ldb);
    const bool ok = p && memcmp(trex_gemm_packed_panels(p), got, trex_gemm_pack_b_bytes(N, K)) == 0;
    trex_gemm_packed_free(p);
    return ok;
}

/* Whether PANELS copies p besides the experts: the attention's projections except wo_a, and the
 * indexer's (docs/params.md "bf16 compute copies"). */
static bool proj_copied(const trex_param *p)
{
    const size_t len = strlen(p->name);
    const bool wo_a = len > 12 && !strcmp(p->name + len - 12, ".wo_a.weight");
    return p->ndim == 2 && ((p->kind == TREX_P_ATTN && !wo_a) || p->kind == TREX_P_INDEXER);
}

/* PANELS: whether every copied matrix ([W1; W3] and W2 of each expert, the projections) holds the packed
 * panels of its fp32 values in both orientations and nothing else is copied; *n counts the tensors (an
 * expert's w1 and w3 share one matrix). */
static bool panels_match(const trex_weights *w, int64_t *n)
{
    bool ok = true;
    *n = 0;
    for (int64_t k = 0; k < w->layout.count; k++) {
        const trex_param *p = &w->layout.params[k];
        const bool copied = p->kind == TREX_P_EXPERT || p->kind == TREX_P_SHARED_EXPERT || proj_copied(p);
        const float *src = w->f + p->offset;
        const int64_t i = p->is_int ? -1 : trex_wcopy_index(w->bf16, src);
        if (!copied || i < 0) {
            ok = ok && !copied && i < 0;
            continue;
        }
        (*n)++;
        const trex_wcopy_tensor *t = &w->bf16->t[i];
        const size_t len = strlen(p->name);
        const bool w3 = len > 9 && !strcmp(p->name + len - 9, "w3.weight");
        if (w3) {
            ok = ok && t->row0 == t->mrows - p->shape[0] && !t->pf && !t->pb; /* under its w1 */
            continue;
        }
        const int64_t rows = t->mrows, cols = p->shape[1]; /* the matrix: w1 and w3 adjacent in f */
        ok = ok && t->row0 == 0 && t->pf && t->pb && trex_wcopy_find_packed(w->bf16, src, false) == t->pf &&
             trex_wcopy_find_packed(w->bf16, src, true) == t->pb;
        ok = ok && panels_equal(t->fwd, true, rows, cols, src, cols) &&
             panels_equal(t->bwd, false, cols, rows, src, cols);
    }
    return ok;
}

/* A child process that reads a stale copy must abort. */
static bool stale_read_aborts(const trex_weights *w, const float *src)
{
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(3);
        int64_t ld;
        if (w->bf16->layout == TREX_WCOPY_PANELS)
            (void)trex_wcopy_find_packed(w->bf16, src, false);
        else
            (void)trex_wcopy_find(w->bf16, src, &ld);
        _exit(0);
    }
    int st = 0;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static bool layout_match(const trex_weights *w, int64_t *n)
{
    return w->bf16->layout == TREX_WCOPY_ROWS ? copies_match(w, n) : panels_match(w, n);
}

static void test_bf16_copies(trex_wcopy_layout layout)
{
    trex_config c;
    trex_weights w;
    trex_mem mem = {0};
    trex_err err = {0};
    if (!load_cfg(&c, "configs/dsv4-tiny.json"))
        return;
    trex_pool *pool = trex_pool_create(2);
    CHECK(pool && trex_weights_init(&w, &c, 5, &mem, &err) == TREX_OK, "init: %s", err.msg);
    if (!pool)
        return;
    CHECK(w.bf16 == NULL, "no copies unless asked for");
    const size_t before = mem.live[TREX_REGION_PARAMS];
    CHECK(trex_weights_bf16_enable(pool, &w, layout, &err) == TREX_OK && w.bf16, "enable: %s", err.msg);
    if (!w.bf16)
        goto out;
    const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size, d = c.hidden_size;
    const int64_t nb = trex_config_n_blocks(&c);
    size_t want =
        layout == TREX_WCOPY_ROWS
            ? (size_t)(nb * (E + 1)) * (size_t)(2 * I * (d + TREX_WCOPY_PAD) + d * (I + TREX_WCOPY_PAD)) * 2
            : (size_t)(nb * (E + 1)) * (2 * trex_gemm_pack_b_bytes(2 * I, d) + 2 * trex_gemm_pack_b_bytes(d, I));
    int64_t nproj = 0; /* PANELS: the projections' two panel sets, one tensor each */
    size_t pbytes = 0;
    for (int64_t k = 0; k < w.layout.count; k++) {
        const trex_param *p = &w.layout.params[k];
        if (layout == TREX_WCOPY_PANELS && proj_copied(p)) {
            nproj++;
            pbytes += trex_gemm_pack_b_bytes(p->shape[0], p->shape[1]) +
                      trex_gemm_pack_b_bytes(p->shape[1], p->shape[0]);
        }
    }
    CHECK(layout == TREX_WCOPY_ROWS || nproj >= 4 * nb, "PANELS: wq_a, wq_b, wkv, wo_b of %lld blocks copied",
          (long long)nb);
    want += pbytes;
    const int64_t ntensors = nb * (E + 1) * 3 + nproj;
    CHECK(w.bf16->bytes == want && mem.live[TREX_REGION_PARAMS] - before == want,
          "copies: %zu bytes charged to params, want %zu", mem.live[TREX_REGION_PARAMS] - before, want);
    int64_t n = 0;
    CHECK(layout_match(&w, &n) && n == ntensors, "copies: the packers' rounding of %lld tensors",
          (long long)n);
    CHECK(trex_weights_bf16_enable(pool, &w, layout, &err) == TREX_OK &&
              mem.live[TREX_REGION_PARAMS] - before == want,
          "enable twice: nothing more");
    CHECK(trex_wcopy_find(w.bf16, trex_weights_get(&w, "embed.weight"), NULL) == NULL, "embed not copied");

    /* a change of the weights: stale until rewritten */
    float *w2 = trex_weights_get(&w, "layers.1.ffn.experts.2.w2.weight");
    for (int64_t q = 0; q < d * I; q++)
        w2[q] = w2[q] * -3.0f + 0.25f;
    CHECK(!layout_match(&w, &n), "copies: the old values until rewritten");
    w.version++;
    CHECK(!trex_wcopy_fresh(w.bf16), "copies: stale after the version moved");
    CHECK(stale_read_aborts(&w, w2), "reading a stale copy aborts");
    w.version--;
    trex_weights_changed(pool, &w, false);
    CHECK(trex_wcopy_fresh(w.bf16) && layout_match(&w, &n), "copies: rewritten by trex_weights_changed");

    /* the optimizer writes the copies in its step */
    for (int kind = 0; kind < 2; kind++) {
        trex_optimizer_settings s;
        trex_optimizer_defaults(&s);
        s.kind = kind ? TREX_OPTIM_MUON : TREX_OPTIM_ADAMW;
        s.lr = 1e-2;
        trex_optimizer *o = NULL;
        CHECK(trex_optimizer_create(&o, &w.layout, &c, &s, 2, &mem, &err) == TREX_OK, "optimizer: %s",
              err.msg);
        float *g = calloc((size_t)w.layout.n_float, sizeof *g);
        if (!o || !g) {
            trex_optimizer_destroy(o);
            free(g);
            break;
        }
        CHECK(trex_optimizer_set_copies(o, w.f, w.bf16, &err) == TREX_OK, "set copies: %s", err.msg);
        uint64_t r = 88172645463325252ull + (uint64_t)kind;
        for (int step = 0; step < 2; step++) {
            for (int64_t q = 0; q < w.layout.n_float; q++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                g[q] = (float)((double)(r >> 11) / 9007199254740992.0 - 0.5) * 1e-2f;
            }
            trex_step_report rep;
            trex_optimizer_update(o, pool, w.f, g, &rep);
            CHECK(!rep.skipped, "%s step %d", trex_optim_kind_name(s.kind), step);
            trex_weights_changed(pool, &w, true);
            CHECK(trex_wcopy_fresh(w.bf16) && layout_match(&w, &n) && n == ntensors,
                  "%s step %d: the step wrote every copy", trex_optim_kind_name(s.kind), step);
        }
        /* copies of a tensor the step does not update are refused */
        trex_wcopy *bad = NULL;
        uint64_t ver = 0;
        const trex_param *bp = trex_layout_find(&w.layout, "layers.2.ffn.gate.bias");
        const trex_wcopy_tensor bt = {.src = w.f + (bp ? bp->offset : 0), .rows = 1, .cols = E};
        CHECK(bp && trex_wcopy_create(&bad, &bt, 1, layout, &ver, NULL, &err) == TREX_OK, "a copy of gate.bias");
        CHECK(bad && trex_optimizer_set_copies(o, w.f, bad, &err) == TREX_EINVAL && strstr(err.msg, "gate.bias"),
              "set copies: gate.bias refused: %s", err.msg);
        trex_wcopy_destroy(bad);
        free(g);
        trex_optimizer_destroy(o);
    }
out:
    trex_weights_free(&w);
    trex_pool_destroy(pool);
    CHECK(mem.live[TREX_REGION_PARAMS] == 0, "copies freed with the weights");
}

/* trex_wcopy_put in pieces that start and end inside rows (as the optimizer's chunks may), PANELS, odd
 * shapes: a [13 + 7, 45] matrix of two joined tensors and a [45, 20] one; the pieces' result equals one
 * refresh's and the GEMM's own packing of the matrices (trex_gemm_pack_b); a piece changes only the
 * bytes of its elements. */
static void test_wcopy_put(void)
{
    enum { R1 = 13, R3 = 7, C = 45, R2 = 45, C2 = 20 };
    float *f = malloc((size_t)((R1 + R3) * C + R2 * C2) * sizeof *f);
    if (!f)
        return;
    for (int64_t q = 0; q < (R1 + R3) * C + R2 * C2; q++)
        f[q] = (float)((q * 7919) % 1000) / 997.0f - 0.5f + 1e-4f * (float)q;
    const trex_wcopy_tensor list[3] = {{.src = f, .rows = R1, .cols = C},
                                       {.src = f + R1 * C, .rows = R3, .cols = C, .join = true},
                                       {.src = f + (R1 + R3) * C, .rows = R2, .cols = C2}};
    uint64_t ver = 1;
    trex_wcopy *a = NULL, *b = NULL;
    trex_err err = {0};
    CHECK(trex_wcopy_create(&a, list, 3, TREX_WCOPY_PANELS, &ver, NULL, &err) == TREX_OK &&
              trex_wcopy_create(&b, list, 3, TREX_WCOPY_PANELS, &ver, NULL, &err) == TREX_OK,
          "put: create: %s", err.msg);
    const trex_wcopy_tensor bad[2] = {{.src = f, .rows = R1, .cols = C},
                                      {.src = f + R1 * C, .rows = R3, .cols = 44, .join = true}};
    trex_wcopy *x = NULL;
    CHECK(trex_wcopy_create(&x, bad, 2, TREX_WCOPY_PANELS, &ver, NULL, &err) == TREX_EINVAL && !x,
          "put: a join of other columns refused");
    if (a && b) {
        trex_wcopy_refresh(NULL, a);
        /* b: 17-element pieces (every piece crosses or sits inside rows), tensors in list order */
        for (int64_t k = 0; k < 3; k++) {
            const int64_t i = trex_wcopy_index(b, list[k].src), n = list[k].rows * list[k].cols;
            CHECK(i >= 0, "put: tensor %lld listed", (long long)k);
            for (int64_t rel = 0; rel < n && i >= 0; rel += 17)
                trex_wcopy_put(b, i, list[k].src + rel, rel, n - rel < 17 ? n - rel : 17);
        }
        CHECK(a->bytes == b->bytes && memcmp(a->b, b->b, a->bytes) == 0, "put: pieces equal one refresh");
        CHECK(panels_equal(a->t[0].fwd, true, R1 + R3, C, f, C) && panels_equal(a->t[0].bwd, false, C, R1 + R3, f, C) &&
                  panels_equal(a->t[2].fwd, true, R2, C2, f + (R1 + R3) * C, C2) &&
                  panels_equal(a->t[2].bwd, false, C2, R2, f + (R1 + R3) * C, C2),
              "put: the panels of trex_gemm_pack_b");
        /* one piece of new values changes exactly its elements: compare with a refresh of them */
        const int64_t i3 = trex_wcopy_index(b, list[1].src);
        f[R1 * C + 50] = 3.0f, f[R1 * C + 51] = -2.5f;
        trex_wcopy_put(b, i3, f + R1 * C + 50, 50, 2);
        CHECK(memcmp(a->b, b->b, a->bytes) != 0, "put: the new values written");
        trex_wcopy_refresh(NULL, a);
        CHECK(memcmp(a->b, b->b, a->bytes) == 0, "put: only the new values changed");
    }
    trex_wcopy_destroy(a);
    trex_wcopy_destroy(b);
    free(f);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    verbose = getenv("TREX_TEST_VERBOSE") != NULL;
    snprintf(tmpdir, sizeof tmpdir, "%s/trex-test-params-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_flash_pro();
    test_tiny_layout();
    test_init();
    test_load_errors();
    test_bf16_copies(TREX_WCOPY_ROWS);
    test_bf16_copies(TREX_WCOPY_PANELS);
    test_wcopy_put();
    rmdir(tmpdir);
    return check_summary();
}
