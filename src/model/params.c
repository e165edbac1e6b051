/* model/params.c — the parameter layout of a DeepSeek-V4 model, its counts, and its weights
 * (initialise, load from and save to safetensors).
 *
 * The layout is a pure function of the config: every tensor of MODEL_SPEC §7.1 under its official
 * name, in the order documented in trex/params.h, with its kind, trainable flag and offset in one
 * fp32 buffer (tid2eid in an int32 buffer). Names are found through an open-addressing hash table,
 * so that V4-Pro's ~70K tensors are built and looked up in linear time.
 *
 * Initialisation follows docs/model-conventions.md. Every value is a pure function of (seed, tensor
 * name, element index) through the counter-based RNG, so results never depend on thread count or
 * on the order in which tensors are filled.
 *
 * The bf16 compute copies (trex_wcopy, trex_weights_bf16_enable; docs/params.md "bf16 compute copies")
 * are bf16 matrices with padded rows next to chosen fp32 tensors (the experts' w1, w3, w2), found by
 * the fp32 tensor's address (a sorted table), and tied to a version counter of their source so that a
 * reader can tell a stale copy. */
#include "trex/params.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "trex/rng.h"
#include "trex/safetensors.h"
#include "trex/tensor.h"

/* ---- layout ------------------------------------------------------------------------------------ */

typedef struct name_index {
    uint64_t mask;  /* capacity - 1, capacity a power of two >= 2 * count */
    int32_t *slot;  /* param index, or -1 */
} name_index;

static uint64_t hash_name(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Builder state: the growing array and the next free offsets. */
typedef struct builder {
    trex_layout *lay;
    int64_t cap;
    const trex_config *cfg;
    trex_err *err;
} builder;

static int64_t align_up(int64_t x)
{
    return (x + TREX_PARAM_ALIGN - 1) / TREX_PARAM_ALIGN * TREX_PARAM_ALIGN;
}

static bool trainable_kind(trex_param_kind k)
{
    return k != TREX_P_GATE_BIAS && k != TREX_P_TID2EID;
}

/* Appends one tensor; s1 < 0 makes it 1-D. `fmt` builds the name. */
static trex_code add(builder *b, trex_param_kind kind, int64_t layer, int64_t expert, int64_t s0, int64_t s1,
                     const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static trex_code add(builder *b, trex_param_kind kind, int64_t layer, int64_t expert, int64_t s0, int64_t s1,
                     const char *fmt, ...)
{
    trex_layout *lay = b->lay;
    if (lay->count == b->cap) {
        int64_t ncap = b->cap ? 2 * b->cap : 1024;
        trex_param *np = realloc(lay->params, (size_t)ncap * sizeof *np);
        if (!np)
            return trex_err_set(b->err, TREX_ENOMEM, "config %s: out of memory building the parameter layout",
                                b->cfg->name);
        lay->params = np;
        b->cap = ncap;
    }
    trex_param *p = &lay->params[lay->count];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    TREX_ASSERT(n > 0 && (size_t)n < sizeof p->name);
    p->ndim = s1 < 0 ? 1 : 2;
    p->shape[0] = s0;
    p->shape[1] = s1 < 0 ? 0 : s1;
    if (!trex_shape_numel(p->ndim, p->shape, &p->numel) || p->numel > (INT64_C(1) << 50))
        return trex_err_set(b->err, TREX_ERANGE, "config %s: tensor '%s' would have too many elements; check "
                            "the sizes in the config",
                            b->cfg->name, p->name);
    p->layer = layer;
    p->expert = expert;
    p->kind = kind;
    p->trainable = trainable_kind(kind);
    p->is_int = kind == TREX_P_TID2EID;
    int64_t *next = p->is_int ? &lay->n_int : &lay->n_float;
    p->offset = *next;
    *next = align_up(*next + p->numel);
    if (*next > (INT64_C(1) << 58))
        return trex_err_set(b->err, TREX_ERANGE, "config %s: the model has too many parameters to address",
                            b->cfg->name);
    if (p->trainable)
        lay->n_trainable += p->numel;
    lay->count++;
    return TREX_OK;
}

#define ADD(...) TREX_TRY(add(b, __VA_ARGS__))

/* One block: layers.{i} or mtp.0 (`pre`); i = its layer index (L for the MTP block). */
static trex_code add_block(builder *b, const char *pre, int64_t i)
{
    const trex_config *c = b->cfg;
    const int64_t d = c->hidden_size, n = c->hc_mult, H = c->num_attention_heads, hd = c->head_dim;
    const int64_t dc = c->q_lora_rank, G = c->o_groups, dg = c->o_lora_rank, E = c->n_routed_experts;
    const int64_t nI = c->index_n_heads, cI = c->index_head_dim, inter = c->moe_intermediate_size;
    const int64_t nmix = (2 + n) * n;
    const int m = trex_config_ratio(c, i);
    static const char *const sub[2] = {"attn", "ffn"};

    for (int s = 0; s < 2; s++) {
        ADD(TREX_P_HC_FN, i, -1, nmix, n * d, "%s.hc_%s_fn", pre, sub[s]);
        ADD(TREX_P_HC_BASE, i, -1, nmix, -1, "%s.hc_%s_base", pre, sub[s]);
        ADD(TREX_P_HC_SCALE, i, -1, 3, -1, "%s.hc_%s_scale", pre, sub[s]);
        ADD(TREX_P_NORM, i, -1, d, -1, "%s.%s_norm.weight", pre, sub[s]);
        if (s == 0) {
            ADD(TREX_P_ATTN, i, -1, dc, d, "%s.attn.wq_a.weight", pre);
            ADD(TREX_P_NORM, i, -1, dc, -1, "%s.attn.q_norm.weight", pre);
            ADD(TREX_P_ATTN, i, -1, H * hd, dc, "%s.attn.wq_b.weight", pre);
            ADD(TREX_P_ATTN, i, -1, hd, d, "%s.attn.wkv.weight", pre);
            ADD(TREX_P_NORM, i, -1, hd, -1, "%s.attn.kv_norm.weight", pre);
            ADD(TREX_P_ATTN, i, -1, G * dg, (H / G) * hd, "%s.attn.wo_a.weight", pre);
            ADD(TREX_P_ATTN, i, -1, d, G * dg, "%s.attn.wo_b.weight", pre);
            ADD(TREX_P_ATTN_SINK, i, -1, H, -1, "%s.attn.attn_sink", pre);
            if (m > 0) {
                const int64_t w = m == 4 ? 2 : 1;
                ADD(TREX_P_COMPRESSOR, i, -1, w * hd, d, "%s.attn.compressor.wkv.weight", pre);
                ADD(TREX_P_COMPRESSOR, i, -1, w * hd, d, "%s.attn.compressor.wgate.weight", pre);
                ADD(TREX_P_APE, i, -1, m, w * hd, "%s.attn.compressor.ape", pre);
                ADD(TREX_P_NORM, i, -1, hd, -1, "%s.attn.compressor.norm.weight", pre);
            }
            if (m == 4) {
                ADD(TREX_P_INDEXER, i, -1, nI * cI, dc, "%s.attn.indexer.wq_b.weight", pre);
                ADD(TREX_P_INDEXER, i, -1, nI, d, "%s.attn.indexer.weights_proj.weight", pre);
                ADD(TREX_P_COMPRESSOR, i, -1, 2 * cI, d, "%s.attn.indexer.compressor.wkv.weight", pre);
                ADD(TREX_P_COMPRESSOR, i, -1, 2 * cI, d, "%s.attn.indexer.compressor.wgate.weight", pre);
                ADD(TREX_P_APE, i, -1, 4, 2 * cI, "%s.attn.indexer.compressor.ape", pre);
                ADD(TREX_P_NORM, i, -1, cI, -1, "%s.attn.indexer.compressor.norm.weight", pre);
            }
        }
    }
    ADD(TREX_P_GATE, i, -1, E, d, "%s.ffn.gate.weight", pre);
    if (trex_config_is_hash(c, i))
        ADD(TREX_P_TID2EID, i, -1, c->vocab_size, c->num_experts_per_tok, "%s.ffn.gate.tid2eid", pre);
    else
        ADD(TREX_P_GATE_BIAS, i, -1, E, -1, "%s.ffn.gate.bias", pre);
    /* w1 then w3 then w2: when inter * d is a multiple of 16 (no alignment gap), an expert's
     * [W1; W3] is one [2 inter, d] matrix in place, which bf16 mode's MoE products use (docs/moe.md). */
    for (int64_t e = 0; e < E; e++) {
        ADD(TREX_P_EXPERT, i, e, inter, d, "%s.ffn.experts.%" PRId64 ".w1.weight", pre, e);
        ADD(TREX_P_EXPERT, i, e, inter, d, "%s.ffn.experts.%" PRId64 ".w3.weight", pre, e);
        ADD(TREX_P_EXPERT, i, e, d, inter, "%s.ffn.experts.%" PRId64 ".w2.weight", pre, e);
    }
    ADD(TREX_P_SHARED_EXPERT, i, -1, inter, d, "%s.ffn.shared_experts.w1.weight", pre);
    ADD(TREX_P_SHARED_EXPERT, i, -1, inter, d, "%s.ffn.shared_experts.w3.weight", pre);
    ADD(TREX_P_SHARED_EXPERT, i, -1, d, inter, "%s.ffn.shared_experts.w2.weight", pre);
    return TREX_OK;
}

static trex_code add_head_collapse(builder *b, const char *pre, int64_t layer)
{
    const int64_t d = b->cfg->hidden_size, n = b->cfg->hc_mult;
    ADD(TREX_P_HC_FN, layer, -1, n, n * d, "%shc_head_fn", pre);
    ADD(TREX_P_HC_BASE, layer, -1, n, -1, "%shc_head_base", pre);
    ADD(TREX_P_HC_SCALE, layer, -1, 1, -1, "%shc_head_scale", pre);
    return TREX_OK;
}

static trex_code add_all(builder *b)
{
    const trex_config *c = b->cfg;
    const int64_t d = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;
    ADD(TREX_P_EMBED, -1, -1, V, d, "embed.weight");
    for (int64_t i = 0; i < L; i++) {
        char pre[32];
        snprintf(pre, sizeof pre, "layers.%" PRId64, i);
        TREX_TRY(add_block(b, pre, i));
    }
    if (c->num_nextn_predict_layers == 1) {
        TREX_TRY(add_block(b, "mtp.0", L));
        ADD(TREX_P_MTP_PROJ, L, -1, d, d, "mtp.0.e_proj.weight");
        ADD(TREX_P_MTP_PROJ, L, -1, d, d, "mtp.0.h_proj.weight");
        ADD(TREX_P_NORM, L, -1, d, -1, "mtp.0.enorm.weight");
        ADD(TREX_P_NORM, L, -1, d, -1, "mtp.0.hnorm.weight");
        ADD(TREX_P_NORM, L, -1, d, -1, "mtp.0.norm.weight");
        TREX_TRY(add_head_collapse(b, "mtp.0.", L));
    }
    TREX_TRY(add_head_collapse(b, "", -1));
    ADD(TREX_P_NORM, -1, -1, d, -1, "norm.weight");
    ADD(TREX_P_HEAD, -1, -1, V, d, "head.weight");
    return TREX_OK;
}

static trex_code build_index(trex_layout *lay, trex_err *err)
{
    TREX_ASSERT(lay->count < INT32_MAX / 4);
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)lay->count)
        cap *= 2;
    name_index *ix = malloc(sizeof *ix);
    int32_t *slot = malloc(cap * sizeof *slot);
    if (!ix || !slot) {
        free(ix);
        free(slot);
        return trex_err_set(err, TREX_ENOMEM, "out of memory building the parameter name index");
    }
    memset(slot, 0xff, cap * sizeof *slot); /* -1 */
    ix->mask = cap - 1;
    ix->slot = slot;
    for (int64_t k = 0; k < lay->count; k++) {
        uint64_t h = hash_name(lay->params[k].name) & ix->mask;
        while (slot[h] >= 0) {
            TREX_ASSERT(strcmp(lay->params[slot[h]].name, lay->params[k].name) != 0); /* unique names */
            h = (h + 1) & ix->mask;
        }
        slot[h] = (int32_t)k;
    }
    lay->index = ix;
    return TREX_OK;
}

trex_code trex_layout_build(trex_layout *lay, const trex_config *cfg, trex_err *err)
{
    TREX_ASSERT(lay && cfg);
    memset(lay, 0, sizeof *lay);
    TREX_ASSERT(cfg->n_compress_ratios == trex_config_n_blocks(cfg));
    builder b = {lay, 0, cfg, err};
    trex_code rc = add_all(&b);
    if (rc == TREX_OK)
        rc = build_index(lay, err);
    if (rc != TREX_OK)
        trex_layout_free(lay);
    return rc;
}

void trex_layout_free(trex_layout *lay)
{
    if (!lay)
        return;
    name_index *ix = lay->index;
    if (ix)
        free(ix->slot);
    free(ix);
    free(lay->params);
    memset(lay, 0, sizeof *lay);
}

const trex_param *trex_layout_find(const trex_layout *lay, const char *name)
{
    TREX_ASSERT(lay && name);
    const name_index *ix = lay->index;
    if (!ix)
        return NULL;
    for (uint64_t h = hash_name(name) & ix->mask; ix->slot[h] >= 0; h = (h + 1) & ix->mask)
        if (!strcmp(lay->params[ix->slot[h]].name, name))
            return &lay->params[ix->slot[h]];
    return NULL;
}

/* ---- counts ------------------------------------------------------------------------------------ */

void trex_layout_count(const trex_layout *lay, const trex_config *cfg, trex_param_counts *out)
{
    TREX_ASSERT(lay && cfg && out);
    memset(out, 0, sizeof *out);
    const int64_t L = cfg->num_hidden_layers, K = cfg->num_experts_per_tok;
    int64_t attn_layer[TREX_MAX_LAYERS] = {0};
    int64_t mtp_routed = 0, mtp_routed_active = 0;
    for (int64_t k = 0; k < lay->count; k++) {
        const trex_param *p = &lay->params[k];
        if (p->kind == TREX_P_TID2EID) {
            out->not_counted += p->numel;
            continue;
        }
        const bool in_attn = p->layer >= 0 && strstr(p->name, ".attn.") != NULL;
        if (p->layer == L) { /* the MTP block */
            out->mtp += p->numel;
            if (in_attn)
                out->mtp_attn += p->numel;
            if (p->kind == TREX_P_EXPERT) {
                mtp_routed += p->numel;
                if (p->expert < K)
                    mtp_routed_active += p->numel;
            }
            continue;
        }
        if (in_attn) {
            TREX_ASSERT(p->layer >= 0 && p->layer < L);
            out->attn += p->numel;
            attn_layer[p->layer] += p->numel;
            continue;
        }
        switch (p->kind) {
        case TREX_P_EMBED:
            out->embed += p->numel;
            break;
        case TREX_P_HEAD:
            out->head += p->numel;
            break;
        case TREX_P_NORM:
            out->norm += p->numel;
            break;
        case TREX_P_HC_FN:
        case TREX_P_HC_BASE:
        case TREX_P_HC_SCALE:
            out->hc += p->numel;
            break;
        case TREX_P_GATE:
        case TREX_P_GATE_BIAS:
            out->gate += p->numel;
            break;
        case TREX_P_EXPERT:
            out->routed += p->numel;
            if (p->expert < K)
                out->routed_active += p->numel;
            break;
        case TREX_P_SHARED_EXPERT:
            out->shared += p->numel;
            break;
        default:
            TREX_ABORT("tensor %s of kind %d outside attention", p->name, (int)p->kind);
        }
    }
    out->total = out->embed + out->head + out->attn + out->routed + out->shared + out->gate + out->hc + out->norm;
    out->active = out->total - out->embed - out->routed + out->routed_active;
    out->mtp_active = out->mtp - mtp_routed + mtp_routed_active;
    out->total_with_mtp = out->total + out->mtp;
    /* group main layers by ratio, ascending */
    for (int64_t i = 0; i < L; i++) {
        const int m = trex_config_ratio(cfg, i);
        int j = 0;
        while (j < out->n_attn && out->attn_by_ratio[j].ratio < m)
            j++;
        if (j == out->n_attn || out->attn_by_ratio[j].ratio != m) {
            memmove(&out->attn_by_ratio[j + 1], &out->attn_by_ratio[j],
                    (size_t)(out->n_attn - j) * sizeof out->attn_by_ratio[0]);
            out->attn_by_ratio[j] = (trex_attn_count){m, 0, attn_layer[i]};
            out->n_attn++;
        }
        TREX_ASSERT(out->attn_by_ratio[j].per_layer == attn_layer[i]);
        out->attn_by_ratio[j].layers++;
    }
}

/* ---- weights ----------------------------------------------------------------------------------- */

static trex_code alloc_weights(trex_weights *w, const trex_config *cfg, trex_mem *mem, trex_err *err)
{
    memset(w, 0, sizeof *w);
    w->cfg = cfg;
    w->mem = mem;
    TREX_TRY(trex_layout_build(&w->layout, cfg, err));
    const trex_layout *lay = &w->layout;
    w->f = trex_mem_alloc(mem, TREX_REGION_PARAMS, (size_t)lay->n_float * sizeof(float));
    w->i = trex_mem_alloc(mem, TREX_REGION_PARAMS, (size_t)lay->n_int * sizeof(int32_t));
    if (!w->f || !w->i) {
        double gib = ((double)lay->n_float * 4 + (double)lay->n_int * 4) / (1024.0 * 1024 * 1024);
        trex_weights_free(w);
        return trex_err_set(err, TREX_ENOMEM,
                            "config %s: out of memory allocating %.2f GiB of fp32 weights; use a smaller config "
                            "or a machine with more memory",
                            cfg->name, gib);
    }
    return TREX_OK;
}

/* A generator whose key depends on the seed and the tensor name only. */
static trex_rng tensor_rng(uint64_t seed, const char *name)
{
    return trex_rng_make(seed, hash_name(name));
}

/* Element pair p of a tensor comes from counter block p, whatever else was drawn: the values do not
 * depend on how the pairs are split between threads. */
typedef struct normal_job {
    float *dst;
    int64_t n;
    double std;
    trex_rng r;
} normal_job;

static void normal_pairs(void *arg, int64_t p0, int64_t p1, int tid)
{
    (void)tid;
    const normal_job *j = arg;
    trex_rng r = j->r;
    for (int64_t p = p0; p < p1; p++) {
        double z[2];
        r.counter = (uint64_t)p;
        trex_rng_normal2(&r, z);
        j->dst[2 * p] = (float)(j->std * z[0]);
        if (2 * p + 1 < j->n)
            j->dst[2 * p + 1] = (float)(j->std * z[1]);
    }
}

static void fill_normal(trex_pool *pool, float *dst, int64_t n, double std, uint64_t seed, const char *name)
{
    normal_job j = {dst, n, std, tensor_rng(seed, name)};
    trex_pool_for(pool, (n + 1) / 2, 1 << 14, normal_pairs, &j);
}

static void fill_const(float *dst, int64_t n, float v)
{
    for (int64_t k = 0; k < n; k++)
        dst[k] = v;
}

/* Row v holds K distinct experts of [0, E) (Floyd's sampling); row v draws from counters v << 32. */
static void fill_tid2eid(int32_t *dst, int64_t V, int64_t K, int64_t E, uint64_t seed, const char *name)
{
    trex_rng r = tensor_rng(seed, name);
    for (int64_t v = 0; v < V; v++) {
        int32_t *row = dst + v * K;
        r.counter = (uint64_t)v << 32;
        for (int64_t k = 0, j = E - K; k < K; k++, j++) {
            int32_t t = (int32_t)trex_rng_below(&r, (uint64_t)j + 1);
            for (int64_t q = 0; q < k; q++)
                if (row[q] == t) {
                    t = (int32_t)j;
                    break;
                }
            row[k] = t;
        }
    }
}

trex_code trex_weights_init(trex_weights *w, const trex_config *cfg, uint64_t seed, trex_mem *mem,
                            trex_err *err)
{
    return trex_weights_init_pool(NULL, w, cfg, seed, mem, err);
}

trex_code trex_weights_init_pool(trex_pool *pool, trex_weights *w, const trex_config *cfg, uint64_t seed,
                                 trex_mem *mem, trex_err *err)
{
    TREX_ASSERT(w && cfg);
    TREX_TRY(alloc_weights(w, cfg, mem, err));
    const double std = cfg->initializer_range;
    for (int64_t k = 0; k < w->layout.count; k++) {
        const trex_param *p = &w->layout.params[k];
        if (p->is_int) {
            fill_tid2eid(w->i + p->offset, p->shape[0], p->shape[1], cfg->n_routed_experts, seed, p->name);
            continue;
        }
        float *dst = w->f + p->offset;
        switch (p->kind) {
        case TREX_P_NORM:
            fill_const(dst, p->numel, 1.0f);
            break;
        case TREX_P_HC_SCALE:
            fill_const(dst, p->numel, 0.01f);
            break;
        case TREX_P_HC_BASE:
        case TREX_P_ATTN_SINK:
        case TREX_P_GATE_BIAS:
            break; /* zero from the allocator */
        default: /* embed, head, projections, experts, gate, hc_*_fn, ape */
            fill_normal(pool, dst, p->numel, std, seed, p->name);
        }
    }
    return TREX_OK;
}

static void shape_str(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "[");
    for (int k = 0; k < ndim && used < size; k++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, k ? ", " : "", shape[k]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

/* Checks that every tid2eid row holds K distinct experts in [0, E). */
static trex_code check_tid2eid(const int32_t *t, const trex_param *p, int64_t E, const char *path,
                               int32_t *stamp, trex_err *err)
{
    const int64_t V = p->shape[0], K = p->shape[1];
    for (int64_t e = 0; e < E; e++)
        stamp[e] = -1;
    for (int64_t v = 0; v < V; v++)
        for (int64_t k = 0; k < K; k++) {
            const int32_t x = t[v * K + k];
            if (x < 0 || x >= E)
                return trex_err_set(err, TREX_ERANGE,
                                    "%s: tensor '%s' row %" PRId64 " holds expert id %d, outside [0, %" PRId64
                                    "); every id must name a routed expert",
                                    path, p->name, v, (int)x, E);
            if (stamp[x] == (int32_t)v)
                return trex_err_set(err, TREX_EFORMAT,
                                    "%s: tensor '%s' row %" PRId64 " names expert %d twice; each row needs %" PRId64
                                    " distinct experts (MODEL_SPEC §12a.3)",
                                    path, p->name, v, (int)x, K);
            stamp[x] = (int32_t)v;
        }
    return TREX_OK;
}

static trex_code load_from(trex_weights *w, const trex_st_file *f, const char *path, trex_err *err)
{
    const trex_layout *lay = &w->layout;
    const char *cname = w->cfg->name;
    /* tensors the layout does not have */
    for (int64_t k = 0; k < trex_st_count(f); k++) {
        const trex_st_entry *e = trex_st_entry_at(f, k);
        if (trex_layout_find(lay, e->name))
            continue;
        size_t n = strlen(e->name);
        if (n > 6 && !strcmp(e->name + n - 6, ".scale"))
            return trex_err_set(err, TREX_EUNSUPPORTED,
                                "%s: tensor '%s' is a block-quantisation scale; trex loads dequantised weights "
                                "(F32, BF16 or F16): convert the checkpoint first",
                                path, e->name);
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: unexpected tensor '%s' (not in the layout of config %s); remove it or use the "
                            "config the file was written for",
                            path, e->name, cname);
    }
    int32_t *stamp = NULL;
    trex_code rc = TREX_OK;
    for (int64_t k = 0; k < lay->count && rc == TREX_OK; k++) {
        const trex_param *p = &lay->params[k];
        const trex_st_entry *e = trex_st_find(f, p->name);
        char want[64], got[64];
        if (!e) {
            rc = trex_err_set(err, TREX_ENOTFOUND,
                              "%s: tensor '%s' is missing (config %s needs it); use the config the file was "
                              "written for",
                              path, p->name, cname);
            break;
        }
        shape_str(want, sizeof want, p->ndim, p->shape);
        shape_str(got, sizeof got, e->ndim, e->shape);
        if (strcmp(want, got)) {
            rc = trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s' has shape %s; config %s needs %s", path, p->name,
                              got, cname, want);
            break;
        }
        if (p->is_int) {
            if (e->dtype != TREX_I64 && e->dtype != TREX_I32) {
                rc = trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s' has dtype %s; it must be I64 or I32", path,
                                  p->name, trex_dtype_name(e->dtype));
                break;
            }
            rc = trex_st_read_i32(f, p->name, w->i + p->offset, p->ndim, p->shape, err);
            if (rc != TREX_OK)
                break;
            if (!stamp && !(stamp = malloc((size_t)w->cfg->n_routed_experts * sizeof *stamp))) {
                rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory checking '%s'", path, p->name);
                break;
            }
            rc = check_tid2eid(w->i + p->offset, p, w->cfg->n_routed_experts, path, stamp, err);
        } else {
            if (e->dtype != TREX_F32 && e->dtype != TREX_BF16 && e->dtype != TREX_F16) {
                rc = trex_err_set(err, TREX_EFORMAT,
                                  "%s: tensor '%s' has dtype %s; trex loads F32, BF16 or F16 (dequantise FP8/FP4 "
                                  "checkpoints first)",
                                  path, p->name, trex_dtype_name(e->dtype));
                break;
            }
            rc = trex_st_read_f32(f, p->name, w->f + p->offset, p->ndim, p->shape, err);
        }
    }
    free(stamp);
    return rc;
}

trex_code trex_weights_load(trex_weights *w, const trex_config *cfg, const char *path, trex_mem *mem,
                            trex_err *err)
{
    TREX_ASSERT(w && cfg && path);
    trex_st_file *f = NULL;
    trex_code rc = alloc_weights(w, cfg, mem, err);
    if (rc != TREX_OK)
        return rc;
    rc = trex_st_open(&f, path, err);
    if (rc != TREX_OK)
        goto out_free;
    rc = load_from(w, f, path, err);
    trex_st_close(f);
    if (rc == TREX_OK)
        return TREX_OK;
out_free:
    trex_weights_free(w);
    return rc;
}

trex_code trex_weights_save(const trex_weights *w, const char *path, trex_err *err)
{
    TREX_ASSERT(w && w->cfg && path);
    const trex_layout *lay = &w->layout;
    int64_t *ints = NULL;
    trex_code rc = TREX_OK;
    trex_st_writer *wr = trex_st_writer_create();
    if (!wr)
        return trex_err_set(err, TREX_ENOMEM, "%s: out of memory starting the safetensors writer", path);
    if (lay->n_int > 0 && !(ints = malloc((size_t)lay->n_int * sizeof *ints))) {
        rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory converting tid2eid to I64", path);
        goto out;
    }
    for (int64_t k = 0; k < lay->n_int; k++)
        ints[k] = w->i[k];
    rc = trex_st_writer_metadata(wr, "format", "pt", err);
    if (rc == TREX_OK)
        rc = trex_st_writer_metadata(wr, "trex_config", w->cfg->name, err);
    for (int64_t k = 0; k < lay->count && rc == TREX_OK; k++) {
        const trex_param *p = &lay->params[k];
        if (p->is_int)
            rc = trex_st_writer_add(wr, p->name, TREX_I64, p->ndim, p->shape, ints + p->offset, err);
        else
            rc = trex_st_writer_add(wr, p->name, TREX_F32, p->ndim, p->shape, w->f + p->offset, err);
    }
    if (rc == TREX_OK)
        rc = trex_st_writer_write(wr, path, err);
out:
    free(ints);
    trex_st_writer_destroy(wr);
    return rc;
}

void trex_weights_free(trex_weights *w)
{
    if (!w)
        return;
    trex_wcopy_destroy(w->bf16);
    trex_mem_free(w->mem, TREX_REGION_PARAMS, w->f);
    trex_mem_free(w->mem, TREX_REGION_PARAMS, w->i);
    trex_layout_free(&w->layout);
    memset(w, 0, sizeof *w);
}

/* ---- bf16 compute copies ----------------------------------------------------------------------- */

static bool name_ends(const char *name, const char *suffix)
{
    const size_t n = strlen(name), m = strlen(suffix);
    return n >= m && strcmp(name + n - m, suffix) == 0;
}

static int cmp_src(const void *a, const void *b)
{
    const uintptr_t x = (uintptr_t)((const trex_wcopy_tensor *)a)->src;
    const uintptr_t y = (uintptr_t)((const trex_wcopy_tensor *)b)->src;
    return x < y ? -1 : x > y;
}

/* Elements of the copy of list[k] in a layout: ROWS its rows; PANELS both panel sets of the matrix it
 * starts (0 for a joined tensor). mrows: the rows of that matrix. */
static size_t wcopy_elems(const trex_wcopy_tensor *list, int64_t n, int64_t k, trex_wcopy_layout layout,
                          int64_t *mrows)
{
    *mrows = list[k].rows;
    if (layout == TREX_WCOPY_ROWS)
        return (size_t)(list[k].rows * (list[k].cols + TREX_WCOPY_PAD));
    if (list[k].join && k > 0)
        return 0;
    for (int64_t j = k + 1; j < n && list[j].join; j++)
        *mrows += list[j].rows;
    return (trex_gemm_pack_b_bytes(*mrows, list[k].cols) + trex_gemm_pack_b_bytes(list[k].cols, *mrows)) / 2;
}

size_t trex_wcopy_bytes(const trex_wcopy_tensor *list, int64_t n, trex_wcopy_layout layout)
{
    size_t elems = 0;
    int64_t mrows;
    for (int64_t k = 0; k < n; k++)
        elems += wcopy_elems(list, n, k, layout, &mrows);
    return elems * sizeof(uint16_t);
}

trex_code trex_wcopy_create(trex_wcopy **out, const trex_wcopy_tensor *list, int64_t n,
                            trex_wcopy_layout layout, const uint64_t *source, trex_mem *mem,
                            trex_err *err)
{
    TREX_ASSERT(out && (list || n == 0) && n >= 0 && source &&
                (layout == TREX_WCOPY_ROWS || layout == TREX_WCOPY_PANELS));
    *out = NULL;
    for (int64_t k = 0; k < n; k++) {
        TREX_ASSERT(list[k].src && list[k].rows >= 0 && list[k].cols >= 0);
        if (layout == TREX_WCOPY_PANELS && list[k].join && (k == 0 || list[k - 1].cols != list[k].cols))
            return trex_err_set(err, TREX_EINVAL,
                                "bf16 weight copies: tensor %" PRId64 " of the list is joined to %s", k,
                                k == 0 ? "nothing (it is the first)" : "a tensor of other columns");
    }
    const size_t bytes = trex_wcopy_bytes(list, n, layout);
    trex_wcopy *c = calloc(1, sizeof *c);
    trex_wcopy_tensor *t = calloc((size_t)(n > 0 ? n : 1), sizeof *t);
    uint16_t *b = c && t ? trex_mem_alloc(mem, TREX_REGION_PARAMS, bytes) : NULL;
    bool ok = b != NULL;
    size_t at = 0;
    for (int64_t k = 0; k < n && ok; k++) { /* copies in list order */
        int64_t mrows;
        const size_t e = wcopy_elems(list, n, k, layout, &mrows);
        t[k] = list[k];
        t[k].dst = NULL, t[k].fwd = t[k].bwd = NULL, t[k].pf = t[k].pb = NULL;
        t[k].mrows = mrows, t[k].row0 = 0;
        if (layout == TREX_WCOPY_ROWS) {
            t[k].dst = b + at;
        } else if (!list[k].join) { /* a matrix starts here: panels 64-byte aligned */
            t[k].fwd = b + at;
            t[k].bwd = b + at + trex_gemm_pack_b_bytes(mrows, list[k].cols) / 2;
            t[k].pf = trex_gemm_packed_view_b(mrows, list[k].cols, t[k].fwd);
            t[k].pb = trex_gemm_packed_view_b(list[k].cols, mrows, t[k].bwd);
            ok = t[k].pf && t[k].pb;
        } else {
            t[k].fwd = t[k - 1].fwd, t[k].bwd = t[k - 1].bwd, t[k].mrows = t[k - 1].mrows;
            t[k].row0 = t[k - 1].row0 + t[k - 1].rows;
        }
        at += e;
    }
    if (!ok) {
        for (int64_t k = 0; t && k < n; k++)
            trex_gemm_packed_free(t[k].pf), trex_gemm_packed_free(t[k].pb);
        trex_mem_free(mem, TREX_REGION_PARAMS, b);
        free(c);
        free(t);
        return trex_err_set(err, TREX_ENOMEM, "out of memory allocating %.2f GiB of bf16 weight copies; use "
                            "a smaller config or a machine with more memory",
                            (double)bytes / (1024.0 * 1024 * 1024));
    }
    qsort(t, (size_t)n, sizeof *t, cmp_src);
    for (int64_t k = 0; k + 1 < n; k++)
        TREX_ASSERT(t[k].src + t[k].rows * t[k].cols <= t[k + 1].src); /* no overlaps */
    *c = (trex_wcopy){n, t, layout, b, bytes, mem, source, UINT64_MAX};
    *out = c;
    return TREX_OK;
}

void trex_wcopy_destroy(trex_wcopy *c)
{
    if (!c)
        return;
    for (int64_t k = 0; k < c->n; k++)
        trex_gemm_packed_free(c->t[k].pf), trex_gemm_packed_free(c->t[k].pb);
    trex_mem_free(c->mem, TREX_REGION_PARAMS, c->b);
    free(c->t);
    free(c);
}

/* Rows [r0, r1) of tensor t, at their columns [c0, c1) (from w = element (r0, c0); rows t->cols
 * apart), into both panel sets of its matrix. */
static void wcopy_put_panels(const trex_wcopy_tensor *t, const float *w, int64_t r0, int64_t r1, int64_t c0,
                             int64_t c1)
{
    const int64_t m0 = t->row0 + r0, m1 = t->row0 + r1;
    /* fwd: op(B)^T = M, [n = matrix row][k = column], stored by n (tb) */
    trex_gemm_pack_b_range(t->fwd, t->mrows, t->cols, TREX_F32, true, w, t->cols, m0, m1, c0, c1);
    /* bwd: op(B) = M, [k = matrix row][n = column], stored by k */
    trex_gemm_pack_b_range(t->bwd, t->cols, t->mrows, TREX_F32, false, w, t->cols, c0, c1, m0, m1);
}

void trex_wcopy_put(const trex_wcopy *c, int64_t k, const float *w, int64_t rel, int64_t len)
{
    TREX_ASSERT(c && k >= 0 && k < c->n && rel >= 0 && len >= 0);
    const trex_wcopy_tensor *t = &c->t[k];
    const int64_t cols = t->cols;
    TREX_ASSERT(rel + len <= t->rows * cols);
    if (len == 0)
        return;
    int64_t r = rel / cols, col = rel - r * cols;
    if (c->layout == TREX_WCOPY_ROWS) {
        for (int64_t done = 0; done < len; r++, col = 0) {
            const int64_t m = cols - col < len - done ? cols - col : len - done;
            trex_cvt_f32_bf16(t->dst + r * (cols + TREX_WCOPY_PAD) + col, w + done, m);
            done += m;
        }
        return;
    }
    const int64_t end = rel + len, re = end / cols, ce = end - re * cols;
    if (col > 0) { /* the first row's tail (or a part inside one row) */
        const int64_t c1 = r == re ? ce : cols;
        wcopy_put_panels(t, w, r, r + 1, col, c1);
        w += c1 - col;
        if (r == re)
            return;
        r++;
    }
    if (re > r) /* whole rows */
        wcopy_put_panels(t, w, r, re, 0, cols);
    w += (re - r) * cols;
    if (ce > 0) /* the last row's head */
        wcopy_put_panels(t, w, re, re + 1, 0, ce);
}

/* Tensors [k0, k1) of the copy set. */
static void wcopy_tensors(void *arg, int64_t k0, int64_t k1, int tid)
{
    (void)tid;
    const trex_wcopy *c = arg;
    for (int64_t k = k0; k < k1; k++)
        trex_wcopy_put(c, k, c->t[k].src, 0, c->t[k].rows * c->t[k].cols);
}

void trex_wcopy_refresh(trex_pool *pool, trex_wcopy *c)
{
    TREX_ASSERT(c);
    trex_pool_for(pool, c->n, 1, wcopy_tensors, c);
    c->version = *c->source;
}

bool trex_wcopy_fresh(const trex_wcopy *c)
{
    return c && c->version == *c->source;
}

int64_t trex_wcopy_index(const trex_wcopy *c, const float *src)
{
    if (!c)
        return -1;
    int64_t lo = 0, hi = c->n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)c->t[mid].src < (uintptr_t)src)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->n && c->t[lo].src == src ? lo : -1;
}

static void wcopy_check_fresh(const trex_wcopy *c)
{
    if (c->version != *c->source)
        TREX_ABORT("bf16 weight copies are stale (they hold version %llu of their source, which is at "
                   "%llu): whoever changed the weights must call trex_weights_changed",
                   (unsigned long long)c->version, (unsigned long long)*c->source);
}

const uint16_t *trex_wcopy_find(const trex_wcopy *c, const float *src, int64_t *ld)
{
    if (!c || c->layout != TREX_WCOPY_ROWS)
        return NULL;
    wcopy_check_fresh(c);
    const int64_t k = trex_wcopy_index(c, src);
    if (k < 0)
        return NULL;
    if (ld)
        *ld = c->t[k].cols + TREX_WCOPY_PAD;
    return c->t[k].dst;
}

const struct trex_gemm_packed *trex_wcopy_find_packed(const trex_wcopy *c, const float *src, bool bwd)
{
    if (!c || c->layout != TREX_WCOPY_PANELS)
        return NULL;
    wcopy_check_fresh(c);
    const int64_t k = trex_wcopy_index(c, src);
    if (k < 0)
        return NULL;
    return bwd ? c->t[k].pb : c->t[k].pf;
}

/* Whether bf16 mode keeps a copy of p in the layout: the experts' matrices always; with PANELS also the
 * attention's and the indexer's projections that trex_attention multiplies through its weight helpers
 * (wq_a, wq_b, wkv, wo_b, the indexer's wq_b and weights_proj: not wo_a, whose grouped products read it
 * in place), so that no product packs them per call. As rows they would save only the rounding. */
static bool copied(const trex_param *p, trex_wcopy_layout layout)
{
    if (p->kind == TREX_P_EXPERT || p->kind == TREX_P_SHARED_EXPERT)
        return true;
    if (layout != TREX_WCOPY_PANELS || p->ndim != 2)
        return false;
    return (p->kind == TREX_P_ATTN && !name_ends(p->name, ".wo_a.weight")) || p->kind == TREX_P_INDEXER;
}

trex_code trex_weights_bf16_enable(trex_pool *pool, trex_weights *w, trex_wcopy_layout layout,
                                   trex_err *err)
{
    TREX_ASSERT(w && w->f);
    if (w->bf16)
        return TREX_OK;
    const trex_layout *lay = &w->layout;
    int64_t n = 0;
    for (int64_t k = 0; k < lay->count; k++)
        n += copied(&lay->params[k], layout);
    trex_wcopy_tensor *list = calloc((size_t)(n > 0 ? n : 1), sizeof *list);
    if (!list)
        return trex_err_set(err, TREX_ENOMEM, "config %s: out of memory listing the bf16 weight copies",
                            w->cfg->name);
    n = 0;
    for (int64_t k = 0; k < lay->count; k++) {
        const trex_param *p = &lay->params[k];
        if (!copied(p, layout))
            continue;
        TREX_ASSERT(p->ndim == 2 && !p->is_int);
        /* an expert's w3 right after its w1 (layout order): one [W1; W3] matrix */
        const bool join = n > 0 && list[n - 1].src + list[n - 1].rows * list[n - 1].cols == w->f + p->offset &&
                          list[n - 1].cols == p->shape[1] && name_ends(lay->params[k - 1].name, ".w1.weight") &&
                          name_ends(p->name, ".w3.weight");
        list[n++] = (trex_wcopy_tensor){
            .src = w->f + p->offset, .rows = p->shape[0], .cols = p->shape[1], .join = join};
    }
    trex_code rc = trex_wcopy_create(&w->bf16, list, n, layout, &w->version, w->mem, err);
    free(list);
    if (rc != TREX_OK) {
        trex_err_prefix(err, "config %s", w->cfg->name);
        return rc;
    }
    trex_wcopy_refresh(pool, w->bf16);
    return TREX_OK;
}

void trex_weights_changed(trex_pool *pool, trex_weights *w, bool copies_written)
{
    TREX_ASSERT(w);
    w->version++;
    if (w->bf16 && copies_written)
        w->bf16->version = w->version;
    else if (w->bf16)
        trex_wcopy_refresh(pool, w->bf16);
}
