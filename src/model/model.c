/* model/model.c — the whole DeepSeek-V4 model: embedding, blocks, hc_head, head, MTP, the four losses,
 * and the backward pass (MODEL_SPEC §2, §5, §6; docs/model-conventions.md).
 *
 * Data flow of a forward pass over N = B*T tokens (all fp32):
 *   X_0 [N, n, d] = E[token] copied into the n streams
 *   block l: X_l -> (HC_pre, attn_norm, attention, HC_post) -> Xmid_l -> (HC_pre, ffn_norm, MoE, HC_post)
 *            -> X_{l+1}
 *   hc_head(X_L) -> norm -> head -> cross-entropy against token t+1 (in row chunks)
 *   MTP over Nm = B*(T-1) positions i: Z_k = e_proj enorm(E[token i+1]) + h_proj hnorm(X_L[i, k]),
 *            the MTP block (layer index num_hidden_layers), mtp.0.hc_head -> mtp.0.norm -> head,
 *            cross-entropy against token i+2.
 * With backward, every block keeps its input streams, the per-token mHC state and the sub-layer
 * outputs y; the normed sub-layer inputs are recomputed in the backward. With recompute full the main
 * blocks keep only their input streams: the forward rewinds the arena after each block, and the
 * backward runs each block's forward again (into scratch losses and expert counts) right before its
 * backward, with the same bits. With recompute attention (moe) every block, the MTP block included,
 * gives its attention (MoE) sub-layer's cache back to the arena as soon as the sub-layer's output is
 * made, and the backward runs that sub-layer's forward again on the recomputed normed input right
 * before its backward. The head never holds the
 * [N, V] logits unless the caller asks for them: it runs in row chunks, and when gradients are wanted
 * the forward takes the cross-entropy gradient of each chunk while its logits are at hand (the head's
 * weight gradient and d loss/d hn are ready before the backward starts). Every reduction over tokens (embedding gradient,
 * norm weights, head) runs in a fixed order, so results do not depend on the thread count. */
#include "trex/model.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/fused.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "model/mhc.h"
#include "trex/prof.h"

/* Logits held at once by the chunked head: about this many floats (64 MiB). */
#define HEAD_CHUNK_FLOATS ((int64_t)16 << 20)

/* ---- weight views ------------------------------------------------------------------------------ */

typedef struct block_w {
    trex_mhc_w hc[2]; /* attn, ffn */
    float *norm[2];   /* attn_norm, ffn_norm */
    trex_attn_w attn;
    trex_moe_w moe;
} block_w;

typedef struct model_w {
    float *embed, *head, *norm;
    trex_mhc_w hc_head;
    float *e_proj, *h_proj, *enorm, *hnorm, *mtp_norm; /* MTP (NULL without it) */
    trex_mhc_w mtp_hc_head;
    block_w *blk; /* [nblocks] */
} model_w;

typedef struct binder {
    const trex_layout *lay;
    float *f;
    int32_t *i;
    const char *cfgname;
    trex_err *err;
    trex_code rc;
} binder;

static const trex_param *bind_find(binder *b, const char *name)
{
    const trex_param *p = trex_layout_find(b->lay, name);
    if (!p && b->rc == TREX_OK)
        b->rc = trex_err_set(b->err, TREX_ENOTFOUND,
                             "config %s: tensor '%s' is missing from the parameter layout — the layout and "
                             "the model disagree (a bug: report it)", b->cfgname, name);
    return p;
}

static float *bind_f(binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static float *bind_f(binder *b, const char *fmt, ...)
{
    char name[TREX_PARAM_NAME + 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const trex_param *p = bind_find(b, name);
    if (!p || !b->f)
        return NULL;
    TREX_ASSERT(!p->is_int);
    return b->f + p->offset;
}

static const int32_t *bind_i(binder *b, const char *name)
{
    const trex_param *p = bind_find(b, name);
    if (!p || !b->i)
        return NULL;
    TREX_ASSERT(p->is_int);
    return b->i + p->offset;
}

/* Fills the views of block l (prefix "layers.l" or "mtp.0"). grads: no gate_bias, no tid2eid. */
static void bind_block(binder *b, const trex_config *cfg, int64_t l, block_w *bw, float **eptr,
                       bool grads)
{
    char p[32];
    if (l < cfg->num_hidden_layers)
        snprintf(p, sizeof p, "layers.%" PRId64, l);
    else
        snprintf(p, sizeof p, "mtp.0");
    static const char *const sub[2] = {"attn", "ffn"};
    for (int s = 0; s < 2; s++) {
        bw->hc[s].fn = bind_f(b, "%s.hc_%s_fn", p, sub[s]);
        bw->hc[s].scale = bind_f(b, "%s.hc_%s_scale", p, sub[s]);
        bw->hc[s].base = bind_f(b, "%s.hc_%s_base", p, sub[s]);
        bw->norm[s] = bind_f(b, "%s.%s_norm.weight", p, sub[s]);
    }
    trex_attn_w *a = &bw->attn;
    memset(a, 0, sizeof *a);
    a->wq_a = bind_f(b, "%s.attn.wq_a.weight", p);
    a->q_norm = bind_f(b, "%s.attn.q_norm.weight", p);
    a->wq_b = bind_f(b, "%s.attn.wq_b.weight", p);
    a->wkv = bind_f(b, "%s.attn.wkv.weight", p);
    a->kv_norm = bind_f(b, "%s.attn.kv_norm.weight", p);
    a->wo_a = bind_f(b, "%s.attn.wo_a.weight", p);
    a->wo_b = bind_f(b, "%s.attn.wo_b.weight", p);
    a->attn_sink = bind_f(b, "%s.attn.attn_sink", p);
    const int ratio = trex_config_ratio(cfg, l);
    if (ratio > 0) {
        a->cmp_wkv = bind_f(b, "%s.attn.compressor.wkv.weight", p);
        a->cmp_wgate = bind_f(b, "%s.attn.compressor.wgate.weight", p);
        a->cmp_ape = bind_f(b, "%s.attn.compressor.ape", p);
        a->cmp_norm = bind_f(b, "%s.attn.compressor.norm.weight", p);
    }
    if (ratio == 4) {
        a->idx_wq_b = bind_f(b, "%s.attn.indexer.wq_b.weight", p);
        a->idx_weights_proj = bind_f(b, "%s.attn.indexer.weights_proj.weight", p);
        a->idx_cmp_wkv = bind_f(b, "%s.attn.indexer.compressor.wkv.weight", p);
        a->idx_cmp_wgate = bind_f(b, "%s.attn.indexer.compressor.wgate.weight", p);
        a->idx_cmp_ape = bind_f(b, "%s.attn.indexer.compressor.ape", p);
        a->idx_cmp_norm = bind_f(b, "%s.attn.indexer.compressor.norm.weight", p);
    }
    trex_moe_w *m = &bw->moe;
    memset(m, 0, sizeof *m);
    const int64_t E = cfg->n_routed_experts;
    m->gate = bind_f(b, "%s.ffn.gate.weight", p);
    if (!grads) {
        if (trex_config_is_hash(cfg, l)) {
            char name[64];
            snprintf(name, sizeof name, "%s.ffn.gate.tid2eid", p);
            m->tid2eid = bind_i(b, name);
        } else {
            m->gate_bias = bind_f(b, "%s.ffn.gate.bias", p);
        }
    }
    m->w1 = eptr;
    m->w2 = eptr + E;
    m->w3 = eptr + 2 * E;
    for (int64_t e = 0; e < E; e++) {
        m->w1[e] = bind_f(b, "%s.ffn.experts.%" PRId64 ".w1.weight", p, e);
        m->w2[e] = bind_f(b, "%s.ffn.experts.%" PRId64 ".w2.weight", p, e);
        m->w3[e] = bind_f(b, "%s.ffn.experts.%" PRId64 ".w3.weight", p, e);
    }
    m->sw1 = bind_f(b, "%s.ffn.shared_experts.w1.weight", p);
    m->sw2 = bind_f(b, "%s.ffn.shared_experts.w2.weight", p);
    m->sw3 = bind_f(b, "%s.ffn.shared_experts.w3.weight", p);
}

static trex_code bind_model(model_w *mw, const trex_config *cfg, const trex_layout *lay, float *f,
                            int32_t *ip, float **eptrs, bool grads, trex_err *err)
{
    binder b = {lay, f, ip, cfg->name, err, TREX_OK};
    const int64_t L = cfg->num_hidden_layers, nb = trex_config_n_blocks(cfg);
    mw->embed = bind_f(&b, "embed.weight");
    mw->head = bind_f(&b, "head.weight");
    mw->norm = bind_f(&b, "norm.weight");
    mw->hc_head.fn = bind_f(&b, "hc_head_fn");
    mw->hc_head.scale = bind_f(&b, "hc_head_scale");
    mw->hc_head.base = bind_f(&b, "hc_head_base");
    if (nb > L) {
        mw->e_proj = bind_f(&b, "mtp.0.e_proj.weight");
        mw->h_proj = bind_f(&b, "mtp.0.h_proj.weight");
        mw->enorm = bind_f(&b, "mtp.0.enorm.weight");
        mw->hnorm = bind_f(&b, "mtp.0.hnorm.weight");
        mw->mtp_norm = bind_f(&b, "mtp.0.norm.weight");
        mw->mtp_hc_head.fn = bind_f(&b, "mtp.0.hc_head_fn");
        mw->mtp_hc_head.scale = bind_f(&b, "mtp.0.hc_head_scale");
        mw->mtp_hc_head.base = bind_f(&b, "mtp.0.hc_head_base");
    }
    for (int64_t l = 0; l < nb; l++)
        bind_block(&b, cfg, l, &mw->blk[l], eptrs + l * 3 * cfg->n_routed_experts, grads);
    return b.rc;
}

/* ---- the model and the state of the last forward ----------------------------------------------- */

typedef struct sub_saved {
    const float *X;       /* input streams [N, n, d] (for the ffn sub-layer: recomputed, see below) */
    float *state;         /* [N, mhc state] */
    float *y;             /* sub-layer output [N, d] */
    trex_attn_cache *ac;
    trex_moe_cache *mc;
} sub_saved;

typedef struct block_saved {
    sub_saved s[2];
    trex_indexer_loss il;
    trex_attn_core *core; /* recompute full-keep-core (main blocks) or attention-keep-core (every block):
                           * the attention core's results */
} block_saved;

typedef struct seq_buf {
    trex_seqinfo info;
    int32_t *tokens, *pos;
    int64_t *seg_start, *seg_len;
} seq_buf;

/* The head + cross-entropy of one predictor (main or MTP) over R rows. */
typedef struct head_pass {
    int64_t R;
    int32_t *tgt;    /* [R] target token, -1 for none */
    int64_t count;   /* rows with a target */
    float *hstate;   /* [R, head state] */
    float *h, *rstd; /* [R, d] collapsed streams, [R] their norm factor */
    float *hn;       /* [R, d] normed */
    double *lse;     /* [R] log-sum-exp of the logits */
    float *dhn;      /* [R, d] d loss / d hn, made by the forward when gradients are wanted */
} head_pass;


struct trex_model {
    const trex_config *cfg;
    const trex_weights *weights;
    trex_ctx ctx;
    trex_mem *mem;
    trex_arena *arena;
    int64_t nblocks;
    bool mtp;
    model_w w, g;
    block_w *blk_w, *blk_g;
    float **eptr_w, **eptr_g;

    /* the last forward */
    bool have_pass; /* a backward may follow */
    float *grads;   /* where the backward adds (NULL: forward only) */
    trex_model_opts opts;
    const int32_t *tokens;
    int64_t B, T, N, Nm;
    seq_buf seq, seqm;
    block_saved *bs; /* [nblocks] */
    int64_t *load;   /* [nblocks, n_routed_experts] tokens routed to each expert (trex_model_expert_load) */
    float *X0, *XL;
    head_pass hp, hpm;
    float *chunk; /* [head chunk rows, V] logits of one chunk, shared by both heads and the backward */
    bool head3;   /* the heads run split on the bf16 GEMM (bf16x3, bf16x3g1, bf16x2g1) */
    int head_kt;  /* split heads: the terms of the logits' product, 3 or 2 (bf16x2g1) */
    bool head_f32b; /* bf16x2g1 where the level has trex_gemm_bf16_f32b: the logits are one exact product */
    uint16_t *w3; /* split heads: [V, kt d] split head weight of this forward (NULL until the first head) */
    /* 1-term split heads with gradients: W_hi as d hn's B operand, packed with W3 once per forward, one
     * trex_gemm_packed view per block of HEAD3_DHN_VOCAB1 vocabulary rows over panels in the arena
     * (head3_dhn_weight); NULL when not made */
    trex_gemm_packed **dhn_w;
    int64_t dhn_nb;
    uint16_t *hnB; /* bf16x3: [3 pw, d] planes of one chunk's hn */
    bool head_g3;  /* bf16x3: the gradient products in three terms too (else hi x hi) */
    bool head_dw_set; /* d head.weight holds zeros this forward: its next product writes it (beta 0) */
    float *ce_max; /* bf16x3: [vocabulary blocks + 1, pw] partial and final column maxima */
    double *ce_sum; /* bf16x3: [vocabulary blocks + 2, pw] partial sums, 1 / sum, target logits */
    /* MTP inputs */
    float *Xm, *hh, *hh_rstd, *ein, *ee, *ee_rstd, *Z0, *ZL;
};

trex_model_opts trex_model_opts_default(void)
{
    trex_model_opts o = {false, 0.3, 1e-4, 1.0, 0, TREX_F32, TREX_HEAD_AUTO, TREX_MODEL_RECOMPUTE_NONE,
                         false};
    return o;
}

bool trex_model_recompute_parse(const char *name, trex_model_recompute *out)
{
    if (strcmp(name, "none") == 0)
        *out = TREX_MODEL_RECOMPUTE_NONE;
    else if (strcmp(name, "attention") == 0)
        *out = TREX_MODEL_RECOMPUTE_ATTENTION;
    else if (strcmp(name, "moe") == 0)
        *out = TREX_MODEL_RECOMPUTE_MOE;
    else if (strcmp(name, "full") == 0)
        *out = TREX_MODEL_RECOMPUTE_FULL;
    else if (strcmp(name, "full-keep-core") == 0)
        *out = TREX_MODEL_RECOMPUTE_FULL_KEEP_CORE;
    else if (strcmp(name, "attention-keep-core") == 0)
        *out = TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE;
    else
        return false;
    return true;
}

const char *trex_model_recompute_name(trex_model_recompute r)
{
    switch (r) {
    case TREX_MODEL_RECOMPUTE_FULL:
        return "full";
    case TREX_MODEL_RECOMPUTE_FULL_KEEP_CORE:
        return "full-keep-core";
    case TREX_MODEL_RECOMPUTE_ATTENTION:
        return "attention";
    case TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE:
        return "attention-keep-core";
    case TREX_MODEL_RECOMPUTE_MOE:
        return "moe";
    default:
        return "none";
    }
}

/* Whether the main blocks keep only their input streams and run their forward again in the backward. */
static bool blocks_recomputed(trex_model_recompute r)
{
    return r == TREX_MODEL_RECOMPUTE_FULL || r == TREX_MODEL_RECOMPUTE_FULL_KEEP_CORE;
}

/* Whether sub-layer s (0 attention, 1 MoE) of every block drops its saved internals under policy r. */
static bool sub_dropped(trex_model_recompute r, int s)
{
    return (s == 0 && (r == TREX_MODEL_RECOMPUTE_ATTENTION || r == TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE)) ||
           (s == 1 && r == TREX_MODEL_RECOMPUTE_MOE);
}

trex_code trex_model_create(trex_model **out, const trex_weights *w, trex_pool *pool, trex_mem *mem,
                            trex_err *err)
{
    *out = NULL;
    const trex_config *cfg = w->cfg;
    TREX_TRY(trex_kernels_init(err)); /* a bad TREX_ISA is the caller's error here, not an abort later */
    TREX_TRY(trex_mhc_check(cfg, err));
    if (cfg->num_nextn_predict_layers < 0 || cfg->num_nextn_predict_layers > 1)
        return trex_err_set(err, TREX_EINVAL,
                            "config %s: num_nextn_predict_layers: %" PRId64 " — trex supports 0 or 1",
                            cfg->name, cfg->num_nextn_predict_layers);
    trex_code rc = TREX_ENOMEM;
    trex_model *m = calloc(1, sizeof *m);
    if (!m)
        goto oom;
    m->cfg = cfg;
    m->weights = w;
    m->mem = mem;
    m->nblocks = trex_config_n_blocks(cfg);
    m->mtp = m->nblocks > cfg->num_hidden_layers;
    m->ctx.pool = pool;
    m->ctx.par = (trex_par){0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
    m->arena = trex_arena_create(mem, TREX_REGION_ACTS, (size_t)64 << 20);
    m->ctx.arena = m->arena;
    m->ctx.compute = TREX_F32;
    m->ctx.ws = trex_gemm_ws_create();
    const size_t ne = (size_t)(m->nblocks * 3 * cfg->n_routed_experts);
    m->blk_w = calloc((size_t)m->nblocks, sizeof *m->blk_w);
    m->blk_g = calloc((size_t)m->nblocks, sizeof *m->blk_g);
    m->eptr_w = calloc(ne ? ne : 1, sizeof *m->eptr_w);
    m->eptr_g = calloc(ne ? ne : 1, sizeof *m->eptr_g);
    m->bs = calloc((size_t)m->nblocks, sizeof *m->bs);
    m->load = calloc((size_t)(m->nblocks * cfg->n_routed_experts) + 1, sizeof *m->load);
    if (!m->arena || !m->ctx.ws || !m->blk_w || !m->blk_g || !m->eptr_w || !m->eptr_g || !m->bs ||
        !m->load)
        goto oom;
    m->w.blk = m->blk_w;
    m->g.blk = m->blk_g;
    rc = bind_model(&m->w, cfg, &w->layout, w->f, w->i, m->eptr_w, false, err);
    if (rc != TREX_OK)
        goto fail;
    for (int64_t l = 0; l < m->nblocks; l++) { /* the bf16 copies, if any (docs/params.md) */
        m->blk_w[l].moe.wc = w->bf16;
        m->blk_w[l].attn.wc = w->bf16;
    }
    *out = m;
    return TREX_OK;
oom:
    rc = trex_err_set(err, TREX_ENOMEM, "config %s: out of memory creating the model", cfg->name);
fail:
    trex_model_destroy(m);
    return rc;
}

/* Frees the views of d hn's packed weight (their panels are the arena's). */
static void head3_dhn_weight_free(trex_model *m)
{
    for (int64_t i = 0; m->dhn_w && i < m->dhn_nb; i++)
        trex_gemm_packed_free(m->dhn_w[i]);
    free(m->dhn_w);
    m->dhn_w = NULL;
    m->dhn_nb = 0;
}

void trex_model_destroy(trex_model *m)
{
    if (!m)
        return;
    if (m->arena)
        trex_arena_destroy(m->arena);
    trex_gemm_ws_destroy(m->ctx.ws);
    free(m->blk_w);
    free(m->blk_g);
    free(m->eptr_w);
    free(m->eptr_g);
    free(m->bs);
    free(m->load);
    head3_dhn_weight_free(m);
    free(m);
}

const int64_t *trex_model_expert_load(const trex_model *m, int64_t block)
{
    TREX_ASSERT(block >= 0 && block < m->nblocks);
    return m->load + block * m->cfg->n_routed_experts;
}

size_t trex_model_arena_used(const trex_model *m)
{
    return trex_arena_used(m->arena);
}

size_t trex_model_arena_peak(const trex_model *m)
{
    return trex_arena_peak(m->arena);
}

size_t trex_model_arena_reserved(const trex_model *m)
{
    return trex_arena_reserved(m->arena);
}

trex_code trex_model_check_batch(const trex_config *cfg, const trex_batch *b, const char *label,
                                 trex_err *err)
{
    if (b->B < 1 || b->T < 2)
        return trex_err_set(err, TREX_EINVAL,
                            "%s: tokens: shape [%" PRId64 ", %" PRId64 "] — a batch needs B >= 1 rows of "
                            "T >= 2 tokens (the model predicts token t+1 from tokens 0..t)",
                            label, b->B, b->T);
    if (b->B > INT32_MAX / b->T)
        return trex_err_set(err, TREX_ERANGE,
                            "%s: tokens: shape [%" PRId64 ", %" PRId64 "] holds more than 2^31-1 tokens — "
                            "split the batch", label, b->B, b->T);
    const int64_t N = b->B * b->T;
    for (int64_t i = 0; i < N; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= cfg->vocab_size)
            return trex_err_set(err, TREX_ERANGE,
                                "%s: tokens: token id %" PRId32 " at [%" PRId64 ", %" PRId64 "] (flat index %"
                                PRId64 ") is outside [0, %" PRId64 ") — the batch does not match config %s "
                                "(vocab_size)", label, b->tokens[i], i / b->T, i % b->T, i, cfg->vocab_size,
                                cfg->name);
    if (b->loss_mask)
        for (int64_t i = 0; i < N; i++)
            if (b->loss_mask[i] > 1)
                return trex_err_set(err, TREX_ERANGE,
                                    "%s: loss_mask: value %u at [%" PRId64 ", %" PRId64 "] — loss_mask "
                                    "holds 0 or 1", label, (unsigned)b->loss_mask[i], i / b->T, i % b->T);
    return TREX_OK;
}

/* Documents of rows of Tr tokens taken from positions 0..Tr-1 of each source row of T tokens; the
 * token of flat row position (b, t) is tokens[b*T + t + tok_shift]. */
static void seq_build(seq_buf *s, int64_t B, int64_t Tr, int64_t T, const int32_t *tokens,
                      const int32_t *doc, int64_t tok_shift)
{
    int64_t nseg = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tr; t++) {
            const int64_t src = b * T + t, flat = b * Tr + t;
            s->tokens[flat] = tokens[src + tok_shift];
            if (t == 0 || (doc && doc[src] != doc[src - 1])) {
                s->seg_start[nseg] = flat;
                s->seg_len[nseg] = 0;
                nseg++;
            }
            s->seg_len[nseg - 1]++;
            s->pos[flat] = (int32_t)(flat - s->seg_start[nseg - 1]);
        }
    s->info.B = B;
    s->info.T = Tr;
    s->info.tokens = s->tokens;
    s->info.pos = s->pos;
    s->info.nseg = nseg;
    s->info.seg_start = s->seg_start;
    s->info.seg_len = s->seg_len;
}

/* ---- head and cross-entropy in row chunks ------------------------------------------------------ */

int trex_model_head_terms(const trex_model_opts *o)
{
    switch (o->head_precision) {
    case TREX_HEAD_BF16X3:
    case TREX_HEAD_BF16X3_G1:
        return 3;
    case TREX_HEAD_BF16X2_G1:
        return 2;
    case TREX_HEAD_AUTO:
        return o->compute == TREX_BF16 ? 2 : 0; /* bf16x2g1: docs/precision.md "bf16x2g1" */
    default:
        return 0;
    }
}

bool trex_model_head_bf16x3(const trex_model_opts *o)
{
    return trex_model_head_terms(o) == 3;
}

bool trex_model_head_grad3(const trex_model_opts *o)
{
    return o->head_precision == TREX_HEAD_BF16X3;
}

const char *trex_model_head_name(const trex_model_opts *o)
{
    const int kt = trex_model_head_terms(o);
    return kt == 0 ? "fp32" : kt == 2 ? "bf16x2g1" : trex_model_head_grad3(o) ? "bf16x3" : "bf16x3g1";
}

static int64_t head_chunk_rows(const trex_model *m, int64_t R)
{
    int64_t rc = m->opts.head_chunk_rows > 0 ? m->opts.head_chunk_rows : HEAD_CHUNK_FLOATS / m->cfg->vocab_size;
    rc = rc < 1 ? 1 : rc;
    return rc < R ? rc : R;
}

typedef struct ce_job {
    const float *logits; /* rows of the chunk */
    float *dlogits;      /* backward: receives scale * (softmax - onehot) (may equal logits) */
    int64_t V, r0;
    const int32_t *tgt;
    double *lse, *nll;
    float scale;
} ce_job;

static void ce_fwd_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const ce_job *j = arg;
    for (int64_t i = i0; i < i1; i++) {
        const float *l = j->logits + i * j->V;
        float mx = l[0];
        for (int64_t v = 1; v < j->V; v++)
            mx = l[v] > mx ? l[v] : mx;
        double s = 0.0;
        for (int64_t v = 0; v < j->V; v++)
            s += exp((double)l[v] - (double)mx);
        const double lse = (double)mx + log(s);
        const int64_t r = j->r0 + i;
        j->lse[r] = lse;
        j->nll[r] = j->tgt[r] >= 0 ? lse - (double)l[j->tgt[r]] : 0.0;
    }
}

static void ce_bwd_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const ce_job *j = arg;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t r = j->r0 + i;
        const float *l = j->logits + i * j->V;
        float *dl = j->dlogits + i * j->V;
        const int32_t t = j->tgt[r];
        if (t < 0) {
            memset(dl, 0, (size_t)j->V * sizeof *dl);
            continue;
        }
        const double lse = j->lse[r];
        for (int64_t v = 0; v < j->V; v++)
            dl[v] = j->scale * (float)exp((double)l[v] - lse);
        dl[t] -= j->scale;
    }
}

/* Logits of rows [0, R) of hn, their log-sum-exp and the summed loss over rows with a target.
 * out [R, V] receives the logits when not NULL. chunk [rc, V] holds one chunk of logits (or, when out
 * is given, of their gradient). With dW (gradients wanted), the loss gradient is taken right here,
 * chunk by chunk, while the logits are at hand: hp->dhn = d(scale * sum nll)/d hn and dW += the
 * head's gradient — the [R, V] logits are never needed again. */
static double head_forward(trex_model *m, head_pass *hp, const float *W, float *out, float *chunk,
                           double *nll, float *dW, float scale)
{
    const int64_t V = m->cfg->vocab_size, d = m->cfg->hidden_size, R = hp->R;
    const int64_t rc = head_chunk_rows(m, R);
    for (int64_t r0 = 0; r0 < R; r0 += rc) {
        const int64_t rows = R - r0 < rc ? R - r0 : rc;
        float *L = out ? out + r0 * V : chunk;
        trex_linear_forward(m->ctx.pool, L, hp->hn + r0 * d, W, rows, d, V);
        ce_job j = {L, chunk, V, r0, hp->tgt, hp->lse, nll, scale};
        trex_pool_for(m->ctx.pool, rows, 1, ce_fwd_rows, &j);
        if (!dW)
            continue;
        bool any = false;
        for (int64_t r = r0; r < r0 + rows && !any; r++)
            any = hp->tgt[r] >= 0;
        if (!any || scale == 0.0f) {
            memset(hp->dhn + r0 * d, 0, (size_t)(rows * d) * sizeof(float));
            continue;
        }
        trex_pool_for(m->ctx.pool, rows, 1, ce_bwd_rows, &j);
        trex_linear_backward(m->ctx.pool, hp->dhn + r0 * d, dW, chunk, hp->hn + r0 * d, W, rows, d, V, false);
    }
    double s = 0.0;
    for (int64_t r = 0; r < R; r++)
        s += nll[r];
    return s;
}

/* ---- the head in bf16x3 (docs/precision.md "The LM head") ---------------------------------------
 * Every fp32 operand x of the head's three products is split x = hi + lo, hi = bf16(x),
 * lo = bf16(x - hi), and x*y is taken as hi_x*hi_y + hi_x*lo_y + lo_x*hi_y on the bf16 GEMM: each
 * product of two bf16 values is exact in fp32 and the sums are fp32, so the result carries about
 * 2^-16 relative error per product instead of bf16's 2^-8. Each of the head's products is one GEMM
 * whose K is three times as long, the three terms side by side in these layouts:
 *   W3 [V, 3d]    rows [W_hi | W_hi | W_lo] of head.weight, made once per forward (both heads use it);
 *   hnF [R, 3d]   rows [hn_hi | hn_lo | hn_hi]:  logits^T [V, rows] = W3 hnF^T          (K = 3d)
 *   dl [V, 3pw]   rows [dl_hi | dl_lo | dl_hi] of the chunk's d logits^T (pw = rows rounded up to
 *                 even, padding zero), written over the logits^T it came from (ldc 1.5 pw floats);
 *   hnB [3pw, d]  planes [hn_hi ; hn_hi ; hn_lo]:   dW [V, d] += dl hnB                    (K = 3pw)
 *   dhn [rows, d] = dl^T W: dl read as [3V, pw] rows (dl_hi, dl_lo, dl_hi) of each v against W3 read
 *                 as [3V, d] rows (W_hi, W_hi, W_lo), summed over blocks of the vocabulary  (K = 3V)
 * The chunk is held transposed ([V, rows]) so that both d W and d hn read it in place.
 * With 1-term gradients (TREX_HEAD_BF16X3_G1: the logits as above, the two gradient products as
 * bf16 hi x hi like every other gradient of bf16 mode) dl is the hi part of the chunk's d logits^T in
 * place (rows of 2 ldc bf16), dW += dl hn_hi (K = rows, hn_hi read from hnF with ldb 3d) and
 * dhn = dl^T W_hi, W_hi read from W3 with ldb 3d (K = V, in blocks). With gradients and more than one
 * chunk, two chunks of pw rows share one buffer of [V, 3 pw / 2] floats (ldc 3 pw / 2): the first
 * chunk's logits at column 0, its d logits (bf16) then in the first pw bf16 columns of each row, i.e.
 * the first pw / 2 floats; the second chunk's logits at float column pw / 2, its d logits in place next
 * to the first's. Both gradient products then run once over the pair (dW with K = 2 pw, dhn with 2 pw
 * rows): dW [V, d] fp32, read and written per product, is streamed half as often (docs/perf.md "LM head
 * in bf16 mode", round 5). Chunks of an odd row count (a padding column) do not pair; a chunk without
 * targets ends the pair before it (whose first chunk then runs its products alone).
 * bf16x2g1 (TREX_HEAD_BF16X2_G1) is bf16x3g1 with two terms in the logits' product: the weight is
 * taken as its bf16 rounding W_hi, as every other weight of bf16 mode (MODEL_SPEC §6: the logits are
 * the fp32 product of a bf16 weight and the fp32 activation), and hn keeps its fp32 level as
 * hn_hi + hn_lo: W3 is then [V, 2d] rows [W_hi | W_hi], hnF [R, 2d] rows [hn_hi | hn_lo], the logits'
 * GEMM has K = 2d, and the gradient products read W_hi and hn_hi at offset 0 of those rows (ldb 2d).
 * kt (m->head_kt, 3 or 2) is the number of terms, the rows' width in units of d.
 * At the levels whose products are fp32 FMAs (avx2, avx512f: m->head_f32b) bf16x2g1's logits need no
 * split: trex_gemm_bf16_f32b multiplies W_hi by hn's fp32 values as they are, with half the FMAs of
 * K = 2d. The buffers keep their sizes and change their contents: W3 rows are W_hi spread
 * ([w0, w0, w1, w1, ...], trex_spread_bf16_rows), hnF rows hold hn's d floats, which d head.weight's
 * product rounds to hn_hi while packing them (the bits of the split's hn_hi), and d hn reads the
 * packed W_hi (head3_dhn_weight), never W3. */

/* Rows of logits per chunk by default, bf16x3 and bf16x3g1 / bf16x2g1: large enough that the weight
 * streamed per chunk is paid by rows*V*d products (docs/perf.md "LM head in bf16 mode"). The logits
 * GEMM of 1 024 rows measured 11-34% less CPU time per row than of 512 (round 6): each block of W3 rows
 * it packs meets twice the columns; bf16x3 keeps 512 (its 3-term chunk is 1.5x as large, and the
 * chunking sets the order of its d head.weight sums, whose bits it keeps). */
#define HEAD3_CHUNK_ROWS 512
#define HEAD3G1_CHUNK_ROWS 1024
/* At most this many rows per chunk (one row of the chunk's d logits sits on the stack). */
#define HEAD3_MAX_ROWS 2048
/* Vocabulary rows per d hn GEMM: the GEMM sums each block of C over the whole of K before the next, so
 * one call over K = 3V would stream both operands' panels from memory for every block of C; blocks of
 * 256 (K = 768) measured 15-30x faster than K = 3V (docs/perf.md "LM head in bf16 mode"). */
#define HEAD3_DHN_VOCAB 256
/* Vocabulary rows per d hn GEMM with 1-term gradients, whose W_hi operand is packed once per forward
 * (head3_dhn_weight): d hn of a pair of chunks (2 048 x 1 024 over a quarter of the vocabulary, both
 * threads) ran at 1.29 TFLOP/s in blocks of 768 rows with W_hi packed per call, 1.53 with it pre-packed,
 * 1.71 pre-packed in blocks of 3 072 (1.67 at 1 536, 1.53 at 6 144): the fp32 C [rows, d] is read and
 * written once per block (docs/perf.md "dsv4-bench, T = 4096, bf16: the eleventh sitting"). Since the
 * GEMM cuts K into slices of 512 (round 14) a block no longer has to fit the caches whole, and 6 144
 * rows (C read and written half as often) measured 0.92-0.94 s per T = 4096 step (and one slow run)
 * against 0.96-1.00 s for 3 072 (docs/kernels.md "Round 15"). The sums are the same bits for any block
 * size: each block's product continues C's fp32 sums in k order. */
#define HEAD3_DHN_VOCAB1 6144

/* Vocabulary rows of d hn's block starting at v0. */
static int64_t dhn_block_rows(int64_t V, int64_t v0)
{
    return V - v0 < HEAD3_DHN_VOCAB1 ? V - v0 : HEAD3_DHN_VOCAB1;
}

/* Vocabulary rows per block of the cross-entropy (the fused table's ce_fwd / ce_grad): a task walks its
 * block of the transposed chunk row by row (contiguous reads) and leaves per-column block maxima and
 * sums of exp(l - block max), which are combined per column in block order: the results do not depend
 * on the thread count. 256 rows of 1 024 columns (1 MiB) stay in L2 between ce_fwd's max and exp (the
 * AVX-512 ce_fwd fetches the next block into L2 meanwhile: kernels/x86/avx512/ce.c). */
#define HEAD3_CE_VOCAB 256

static int64_t head3_chunk_rows(const trex_model *m, int64_t R)
{
    int64_t rc = m->opts.head_chunk_rows > 0 ? m->opts.head_chunk_rows
                 : m->head_g3                ? HEAD3_CHUNK_ROWS
                                             : HEAD3G1_CHUNK_ROWS;
    rc = rc < 1 ? 1 : rc > HEAD3_MAX_ROWS ? HEAD3_MAX_ROWS : rc;
    return rc < R ? rc : R;
}

typedef struct ce3_job {
    float *L;            /* logits^T [V, ldc]; exp(l - block max) in place (keep); d logits^T in place */
    int64_t V, rows, pw, ldc, r0, nb;
    const int32_t *tgt;  /* of the head pass (index r0 + i) */
    float scale, scale2; /* d loss / d nll of rows < rs of the head pass, of the rows from rs on */
    int64_t rs;
    bool keep;           /* write exp(l - block max) over the logits (the gradient follows) */
    float *bmax;         /* [nb, pw] block maxima per column; with keep, then the gradient factors */
    double *bsum;        /* [nb, pw] block sums of exp(l - block max) per column */
    const double *lt;    /* [pw] the target's logit (0 without a target) */
    const float *et;     /* [pw] (1-term gradient) its exp, read before the gradient overwrites it */
    double *lse, *nll;   /* of the head pass (index r0 + i) */
    const trex_fused_table *fz;
} ce3_job;

/* d loss / d nll of row r of the head pass. */
static float ce3_scale(const ce3_job *j, int64_t r)
{
    return r < j->rs ? j->scale : j->scale2;
}

static int64_t ce3_block_rows(const ce3_job *j, int64_t b)
{
    const int64_t v0 = b * HEAD3_CE_VOCAB;
    return j->V - v0 < HEAD3_CE_VOCAB ? j->V - v0 : HEAD3_CE_VOCAB;
}

/* Vocabulary blocks [b0, b1): per column the block max, the block sum of exp(l - block max), and with
 * keep those exp values over the logits (kernels/fused.h ce_fwd). */
static void ce3_fwd_blocks(void *arg, int64_t b0, int64_t b1, int tid)
{
    (void)tid;
    const ce3_job *j = arg;
    for (int64_t b = b0; b < b1; b++)
        j->fz->ce_fwd(j->L + b * HEAD3_CE_VOCAB * j->ldc, j->ldc, ce3_block_rows(j, b), j->rows, j->keep,
                      j->bmax + b * j->pw, j->bsum + b * j->pw);
}

/* Columns [i0, i1) (of pw): the max M over the blocks, S = sum_b exp(m_b - M) s_b in block order,
 * lse = M + log S and the loss; with keep, bmax[b] becomes the gradient's factor of block b,
 * scale exp(m_b - M) / S (0 for columns without a target and the padding column), so that
 * d logit = factor * exp(l - m_b) - scale [target]. A block whose max is -inf adds nothing. */
static void ce3_comb_cols(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const ce3_job *j = arg;
    const int64_t pw = j->pw;
    for (int64_t i = i0; i < i1; i++) {
        if (i >= j->rows) {
            for (int64_t b = 0; b < j->nb && j->keep; b++)
                j->bmax[b * pw + i] = 0.0f;
            continue;
        }
        float M = j->bmax[i];
        for (int64_t b = 1; b < j->nb; b++)
            M = j->bmax[b * pw + i] > M ? j->bmax[b * pw + i] : M;
        double S = 0.0;
        for (int64_t b = 0; b < j->nb; b++) {
            const float mb = j->bmax[b * pw + i];
            const double w = mb == -INFINITY ? 0.0 : exp((double)mb - (double)M);
            if (w != 0.0)
                S += w * j->bsum[b * pw + i];
            if (j->keep)
                j->bsum[b * pw + i] = w;
        }
        const int64_t r = j->r0 + i;
        const double lse = (double)M + log(S);
        j->lse[r] = lse;
        j->nll[r] = j->tgt[r] >= 0 ? lse - j->lt[i] : 0.0;
        if (j->keep) {
            const double k = j->tgt[r] >= 0 ? (double)ce3_scale(j, r) / S : 0.0;
            for (int64_t b = 0; b < j->nb; b++)
                j->bmax[b * pw + i] = (float)(k * j->bsum[b * pw + i]);
        }
    }
}

/* d logits^T of vocabulary blocks [b0, b1), 1-term: factor * exp(l - m_b) rounded to bf16 in place
 * (kernels/fused.h ce_grad; the target's -scale is added afterwards by head_forward3). */
static void ce3_grad_blocks(void *arg, int64_t b0, int64_t b1, int tid)
{
    (void)tid;
    const ce3_job *j = arg;
    for (int64_t b = b0; b < b1; b++) {
        float *E = j->L + b * HEAD3_CE_VOCAB * j->ldc;
        j->fz->ce_grad((uint16_t *)(void *)E, 2 * j->ldc, E, j->ldc, ce3_block_rows(j, b), j->pw,
                       j->bmax + b * j->pw);
    }
}

/* d logits^T of vocabulary rows [v0, v1), 3-term: factor * exp(l - m_b) - scale [v = target], split in
 * place into [hi | lo | hi] (factors 0 for rows without a target and the padding column). */
static void ce3_bwd3_rows(void *arg, int64_t v0, int64_t v1, int tid)
{
    (void)tid;
    const ce3_job *j = arg;
    float dl[HEAD3_MAX_ROWS];
    TREX_ASSERT(j->pw <= HEAD3_MAX_ROWS);
    for (int64_t v = v0; v < v1; v++) {
        const float *e = j->L + v * j->ldc, *c = j->bmax + v / HEAD3_CE_VOCAB * j->pw;
        for (int64_t i = 0; i < j->pw; i++) {
            dl[i] = c[i] != 0.0f ? e[i] * c[i] : 0.0f;
            if (i < j->rows && j->tgt[j->r0 + i] == v)
                dl[i] -= ce3_scale(j, j->r0 + i);
        }
        uint16_t *row = (uint16_t *)(void *)(j->L + v * j->ldc);
        trex_split_bf16(row, row + j->pw, dl, j->pw);
        memcpy(row + 2 * j->pw, row, (size_t)j->pw * sizeof *row);
    }
}

typedef struct tr_job {
    const float *L;
    float *out;
    int64_t V, ldc, rows;
} tr_job;

/* out[i, v] = L[v, i] for rows i in [i0, i1) (the caller asked for the logits). */
static void transpose_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const tr_job *j = arg;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t v = 0; v < j->V; v++)
            j->out[i * j->V + v] = j->L[v * j->ldc + i];
}

/* beta of the next product into d head.weight: 0 for the first one of a forward whose gradients start
 * at zero (trex_model_opts.grads_zero), which then writes them instead of reading zeros back. */
static float head_dw_beta(trex_model *m)
{
    const bool set = m->head_dw_set;
    m->head_dw_set = false;
    return set ? 0.0f : 1.0f;
}

/* The one-hot part of the chunk's d logits^T at the targets in vocabulary rows [v0, v1): the target's
 * d logit, factor * exp(l_t - m_b) - scale, from its exp j->et[i]. */
static void ce3_onehot(const ce3_job *j, int64_t v0, int64_t v1)
{
    for (int64_t i = 0; i < j->rows; i++) {
        const int32_t t = j->tgt[j->r0 + i];
        if (t < v0 || t >= v1)
            continue;
        const float c = j->bmax[t / HEAD3_CE_VOCAB * j->pw + i];
        const float x = (c != 0.0f ? j->et[i] * c : 0.0f) - ce3_scale(j, j->r0 + i);
        ((uint16_t *)(void *)(j->L + (int64_t)t * j->ldc))[i] = trex_f32_to_bf16(x);
    }
}

/* The chunk's 1-term d logits^T (bf16, in place) of vocabulary rows [v0, v1), whole CE blocks. */
static void ce3_grad_range(trex_pool *pool, const ce3_job *j, int64_t v0, int64_t v1)
{
    _Static_assert(HEAD3_DHN_VOCAB1 % HEAD3_CE_VOCAB == 0, "d hn's vocabulary blocks are whole CE blocks");
    TREX_ASSERT(v0 % HEAD3_CE_VOCAB == 0 && (v1 % HEAD3_CE_VOCAB == 0 || v1 == j->V));
    ce3_job jb = *j;
    jb.L = j->L + v0 * j->ldc;
    jb.bmax = j->bmax + v0 / HEAD3_CE_VOCAB * j->pw;
    jb.V = v1 - v0;
    trex_pool_for(pool, (v1 - v0 + HEAD3_CE_VOCAB - 1) / HEAD3_CE_VOCAB, 1, ce3_grad_blocks, &jb);
    ce3_onehot(j, v0, v1);
}

/* The 1-term gradient products of rows [r0, r0 + rows) of the head pass, whose d logits^T are the bf16
 * columns [0, rows) of dl (row stride ldl bf16): dhn = dl^T W_hi (K = V in vocabulary blocks of
 * HEAD3_DHN_VOCAB1, each a sum over the whole block per element) and dW += dl hn_hi (K = rows); hn_hi
 * and W_hi at offset 0 of the kt d-wide rows of hnF and W3 (with m->head_f32b: hn's floats in hnF,
 * rounded while packed, and d hn always on the pre-packed W_hi, as W3 holds W_hi spread). With ce, the
 * d logits of ce's chunk are made here, block by block, just before the block's d hn product reads
 * them, while the block (12 MiB at 1 024 rows) can still be in the last-level cache (docs/kernels.md
 * "Round 19"). */
static void head3_grad1(trex_model *m, head_pass *hp, const uint16_t *W3, const uint16_t *hnF,
                        const uint16_t *dl, int64_t ldl, int64_t r0, int64_t rows, float *dW, const ce3_job *ce)
{
    const int64_t V = m->cfg->vocab_size, d = m->cfg->hidden_size, kd = m->head_kt * d;
    trex_pool *pool = m->ctx.pool;
    TREX_ASSERT(m->dhn_w || !m->head_f32b); /* W3 holds W_hi spread */
    for (int64_t v0 = 0, b = 0; v0 < V; v0 += HEAD3_DHN_VOCAB1, b++) {
        const int64_t vn = dhn_block_rows(V, v0);
        if (ce)
            ce3_grad_range(pool, ce, v0, v0 + vn);
        if (m->dhn_w)
            trex_gemm_prepacked(pool, m->ctx.ws, TREX_BF16, true, rows, 1.0f, dl + v0 * ldl, ldl, m->dhn_w[b],
                                v0 ? 1.0f : 0.0f, hp->dhn + r0 * d, d);
        else
            trex_gemm_bf16(pool, m->ctx.ws, true, false, rows, d, vn, 1.0f, dl + v0 * ldl, ldl, W3 + v0 * kd,
                           kd, v0 ? 1.0f : 0.0f, hp->dhn + r0 * d, d);
    }
    if (m->head_f32b) { /* hn's floats, rounded to hn_hi while packed */
        const trex_gemm_problem p = {V, d, rows, dl, ldl, hnF + r0 * kd, d, dW, d, NULL, 0};
        trex_gemm_grouped_mixed(pool, m->ctx.ws, TREX_BF16, TREX_F32, false, false, 1.0f, head_dw_beta(m), &p, 1);
    } else {
        trex_gemm_bf16(pool, m->ctx.ws, false, false, V, d, rows, 1.0f, dl, ldl, hnF + r0 * kd, kd,
                       head_dw_beta(m), dW, d);
    }
}

/* Whether the 1-term head pairs its chunks (see above): gradients, more than one chunk of R rows, and
 * an even number of rows per chunk, at most the default. The default 1 024-row chunks pair since the
 * eighth sitting: d head.weight with K = 2 048 and d hn over 2 048 rows measured 8-13% less CPU time than
 * twice 1 024 (docs/perf.md "LM head in bf16 mode", round 8), for a buffer of [V, 1 536] floats instead
 * of [V, 1 024] that heads_run3 releases before the backward. */
static bool head3_pairs(const trex_model *m, int64_t R, bool grads)
{
    const int64_t rc = head3_chunk_rows(m, R);
    return grads && !m->head_g3 && rc < R && rc % 2 == 0 && rc <= HEAD3G1_CHUNK_ROWS;
}

/* head_forward in bf16x3: the same contract, with W3 (see above) and hnF [R, kt d] made by head_run,
 * except that the loss of rows from rs on is scaled by scale2 (rs = R: one head; both heads as one
 * pass: heads_run3). chunk holds V * ldc floats for pw = head3_chunk_rows rounded up to even,
 * ldc = 3 pw / 2 (3-term gradients, or pairs of 1-term chunks: head3_pairs) or pw; hnB 3 * pw * d
 * (3-term gradients only); m->ce_max and m->ce_sum as sized by trex_model_forward. */
static double head_forward3(trex_model *m, head_pass *hp, const uint16_t *W3, const uint16_t *hnF,
                            uint16_t *hnB, float *out, float *chunk, double *nll, float *dW, float scale,
                            int64_t rs, float scale2)
{
    const int64_t V = m->cfg->vocab_size, d = m->cfg->hidden_size, R = hp->R, kd = m->head_kt * d;
    const int64_t rc = head3_chunk_rows(m, R), nb = (V + HEAD3_CE_VOCAB - 1) / HEAD3_CE_VOCAB;
    const bool g3 = m->head_g3, pairs = head3_pairs(m, R, dW != NULL);
    trex_pool *pool = m->ctx.pool;
    /* pairs: rows [held_r0, held_r0 + held) whose d logits^T wait in the first held bf16 columns of the
     * chunk for the second chunk of their pair (held is even: a whole number of floats) */
    int64_t held = 0, held_r0 = 0;
    for (int64_t r0 = 0; r0 < R; r0 += rc) {
        const int64_t rows = R - r0 < rc ? R - r0 : rc, pw = rows + (rows & 1);
        const int64_t ldc = g3 ? 3 * pw / 2 : pairs ? 3 * rc / 2 : pw;
        float *L = chunk + held / 2; /* this chunk's logits^T [V, rows] (ldc) */
        if (m->head_f32b) /* hnF's rows hold hn's floats */
            trex_gemm_bf16_f32b(pool, m->ctx.ws, V, rows, d, 1.0f, W3, kd,
                                (const float *)(const void *)(hnF + r0 * kd), d, 0.0f, L, ldc);
        else
            trex_gemm_bf16(pool, m->ctx.ws, false, true, V, rows, kd, 1.0f, W3, kd, hnF + r0 * kd, kd, 0.0f, L,
                           ldc);
        if (out) {
            tr_job t = {L, out + r0 * V, V, ldc, rows};
            trex_pool_for(pool, rows, 1, transpose_rows, &t);
        }
        bool any = false; /* a row with a target and a loss weight */
        for (int64_t r = r0; r < r0 + rows && !any; r++)
            any = hp->tgt[r] >= 0 && (r < rs ? scale : scale2) != 0.0f;
        const bool grad = dW && any;
        /* per column: block maxima and sums of exp(l - block max) (exp kept over the logits for the
         * gradient), combined in block order into the log-sum-exp and the gradient's factors; the
         * target's logit is read before the logits are overwritten, its exp before the gradient is */
        double *lt = m->ce_sum + nb * pw;
        float *et = m->ce_max + nb * pw;
        for (int64_t i = 0; i < rows; i++) {
            const int32_t t = hp->tgt[r0 + i];
            lt[i] = t >= 0 ? (double)L[(int64_t)t * ldc + i] : 0.0;
        }
        ce3_job j = {.L = L, .V = V, .rows = rows, .pw = pw, .ldc = ldc, .r0 = r0, .nb = nb, .tgt = hp->tgt,
                     .scale = scale, .scale2 = scale2, .rs = rs, .keep = grad, .bmax = m->ce_max,
                     .bsum = m->ce_sum, .lt = lt, .et = et, .lse = hp->lse, .nll = nll, .fz = trex_fused()};
        trex_pool_for(pool, nb, 1, ce3_fwd_blocks, &j);
        trex_pool_for(pool, pw, 16, ce3_comb_cols, &j);
        if (!dW)
            continue;
        if (!grad) {
            memset(hp->dhn + r0 * d, 0, (size_t)(rows * d) * sizeof(float));
            if (held) /* the held chunk goes alone */
                head3_grad1(m, hp, W3, hnF, (const uint16_t *)(const void *)chunk, 2 * ldc, held_r0, held, dW,
                            NULL);
            held = 0;
            continue;
        }
        if (g3) {
            trex_pool_for(pool, V, 64, ce3_bwd3_rows, &j);
        } else {
            for (int64_t i = 0; i < rows; i++) { /* the exp at the target, before the gradient is written */
                const int32_t t = hp->tgt[r0 + i];
                et[i] = t >= 0 ? L[(int64_t)t * ldc + i] : 0.0f;
            }
        }
        const uint16_t *dl = (const uint16_t *)(const void *)chunk;
        if (g3) {
            /* hnB: planes hn_hi, hn_hi, hn_lo of the chunk's rows (hnF rows are [hi | lo | hi]) */
            memset(hnB, 0, (size_t)(3 * pw * d) * sizeof *hnB);
            for (int64_t i = 0; i < rows; i++) {
                const uint16_t *f = hnF + (r0 + i) * 3 * d;
                memcpy(hnB + i * d, f, (size_t)d * sizeof *hnB);
                memcpy(hnB + (pw + i) * d, f, (size_t)d * sizeof *hnB);
                memcpy(hnB + (2 * pw + i) * d, f + d, (size_t)d * sizeof *hnB);
            }
            trex_gemm_bf16(pool, m->ctx.ws, false, false, V, d, 3 * pw, 1.0f, dl, 3 * pw, hnB, d,
                           head_dw_beta(m), dW, d);
            for (int64_t v0 = 0; v0 < V; v0 += HEAD3_DHN_VOCAB) { /* K in short blocks (see above) */
                const int64_t vn = V - v0 < HEAD3_DHN_VOCAB ? V - v0 : HEAD3_DHN_VOCAB;
                trex_gemm_bf16(pool, m->ctx.ws, true, false, rows, d, 3 * vn, 1.0f, dl + v0 * 3 * pw, pw,
                               W3 + v0 * 3 * d, d, v0 ? 1.0f : 0.0f, hp->dhn + r0 * d, d);
            }
        } else if (pairs && !held && rows == pw && r0 + rows < R) {
            held = rows, held_r0 = r0; /* the first of a pair: its products wait for the second */
            ce3_grad_range(pool, &j, 0, V);
        } else {
            head3_grad1(m, hp, W3, hnF, dl, 2 * ldc, held ? held_r0 : r0, held + rows, dW, &j);
            held = 0;
        }
    }
    TREX_ASSERT(held == 0);
    double s = 0.0;
    for (int64_t r = 0; r < R; r++)
        s += nll[r];
    return s;
}

/* ---- blocks ------------------------------------------------------------------------------------ */

typedef struct fwd_tmp {
    float *x_in, *xn, *y, *state; /* [N, d] x3, [N, mhc state] (used when nothing is kept) */
} fwd_tmp;

/* One block over N tokens: Xin -> Xmid -> Xout. bs: where to keep what the backward needs (NULL:
 * forward only, then y and state come from tmp). Adds the balance loss into *bal. core: the attention
 * core's results to make or to take (trex_attn_forward_core), or NULL. */
static trex_code block_forward(trex_model *m, int64_t l, const trex_seqinfo *seq, int64_t N,
                               const float *Xin, float *Xmid, float *Xout, block_saved *bs,
                               const fwd_tmp *tmp, double *bal, trex_indexer_loss *il, int64_t *load,
                               trex_attn_core *core, trex_err *err)
{
    const trex_config *cfg = m->cfg;
    const block_w *w = &m->w.blk[l];
    const int64_t d = cfg->hidden_size;
    for (int s = 0; s < 2; s++) {
        const float *Xs = s == 0 ? Xin : Xmid;
        float *Xo = s == 0 ? Xmid : Xout;
        float *state = tmp->state, *y = tmp->y;
        if (bs) {
            sub_saved *ss = &bs->s[s];
            ss->X = s == 0 ? Xs : NULL;
            /* written before read: state by HC_pre, y by the sub-layer */
            ss->state = trex_arena_alloc_uninit(m->arena,
                                                (size_t)(N * trex_mhc_state_size(cfg->hc_mult)) * sizeof(float));
            ss->y = trex_arena_alloc_uninit(m->arena, (size_t)(N * d) * sizeof(float));
            if (!ss->state || !ss->y)
                return trex_err_set(err, TREX_ENOMEM,
                                    "block %" PRId64 ": out of memory keeping activations for %" PRId64
                                    " tokens — use a smaller batch", l, N);
            state = ss->state;
            y = ss->y;
        }
        trex_prof_begin(TREX_PROF_MHC);
        trex_mhc_pre_forward(&m->ctx, cfg, N, tmp->x_in, state, Xs, &w->hc[s]);
        trex_prof_end(TREX_PROF_MHC);
        /* a dropped sub-layer (recompute attention / moe) gives its cache back to the arena once its
         * output y is made; block_backward runs its forward again */
        const bool drop = bs && sub_dropped(m->opts.recompute, s);
        if (drop && s == 0 && m->opts.recompute == TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE) {
            /* the core outlives the dropped cache: carved below the sub-layer's mark; it keeps the KL
             * terms (kl true), so both forwards get an il, as under full-keep-core */
            TREX_ASSERT(il != NULL);
            if (!(bs->core = trex_attn_core_reserve(&m->ctx, cfg, (int)l, N, m->opts.sparse, true, err)))
                return err ? err->code : TREX_ENOMEM;
            core = bs->core;
        }
        const trex_arena_mark mk = trex_arena_mark_get(m->arena);
        trex_prof_begin(s == 0 ? TREX_PROF_ATTENTION : TREX_PROF_MOE);
        trex_rmsnorm_forward(m->ctx.pool, tmp->xn, NULL, tmp->x_in, w->norm[s], N, d,
                             (float)cfg->rms_norm_eps);
        if (s == 0) {
            TREX_TRY(trex_attn_forward_core(&m->ctx, cfg, (int)l, seq, y, tmp->xn, &w->attn,
                                            m->opts.sparse, bs ? &bs->s[0].ac : NULL, il, core, err));
        } else {
            trex_moe_stats st = {0.0, load};
            TREX_TRY(trex_moe_forward(&m->ctx, cfg, (int)l, seq, y, tmp->xn, &w->moe,
                                      m->opts.balance_weight, bs ? &bs->s[1].mc : NULL, &st, err));
            if (!trex_config_is_hash(cfg, l))
                *bal += st.balance_loss;
        }
        trex_prof_end(s == 0 ? TREX_PROF_ATTENTION : TREX_PROF_MOE);
        trex_prof_begin(TREX_PROF_MHC);
        trex_mhc_post_forward(&m->ctx, cfg, N, Xo, y, Xs, state);
        trex_prof_end(TREX_PROF_MHC);
        if (drop) {
            trex_arena_rewind(m->arena, mk);
            bs->s[s].ac = NULL;
            bs->s[s].mc = NULL;
        }
    }
    return TREX_OK;
}

typedef struct bwd_tmp {
    float *dA, *dB;                    /* [N, n, d] */
    float *dy, *dxn, *dx_in, *x_in, *xn; /* [N, d] */
    float *rstd;                       /* [N] */
    float *dstate;                     /* [N, mhc dstate] */
    float *Xmid;                       /* [N, n, d] the block's middle streams, recomputed */
} bwd_tmp;

/* Sub-layer s (0 attention, 1 MoE) of block l run forward again on t->xn (recompute attention / moe),
 * as block_forward ran it, for its cache (*ac or *mc, carved from the arena: the caller rewinds; under
 * attention-keep-core the attention takes the block's kept core instead of running its core loop). Its
 * output goes to t->dxn (free until the sub-layer's backward writes it); the indexer loss, balance loss
 * and expert counts it makes go to scratch: the first forward counted them. */
static void sub_again(trex_model *m, int64_t l, int s, const trex_seqinfo *seq, const bwd_tmp *t,
                      const trex_attn_cache **ac, const trex_moe_cache **mc)
{
    const trex_config *cfg = m->cfg;
    const block_w *w = &m->w.blk[l];
    trex_err err = {0};
    trex_code rc;
    if (s == 0) {
        trex_attn_cache *c = NULL;
        trex_indexer_loss il; /* not NULL: the cache then holds the KL terms, as in the first forward */
        rc = trex_attn_forward_core(&m->ctx, cfg, (int)l, seq, t->dxn, t->xn, &w->attn, m->opts.sparse, &c,
                                    &il, m->bs[l].core, &err); /* a kept core (attention-keep-core) is taken */
        *ac = c;
    } else {
        trex_moe_cache *c = NULL;
        int64_t *load = trex_arena_xalloc(m->arena, (size_t)cfg->n_routed_experts * sizeof *load);
        trex_moe_stats st = {0.0, load};
        rc = trex_moe_forward(&m->ctx, cfg, (int)l, seq, t->dxn, t->xn, &w->moe, m->opts.balance_weight, &c,
                              &st, &err);
        *mc = c;
    }
    if (rc != TREX_OK) {
        fprintf(stderr, "trex: recomputing the %s of block %" PRId64 " in the backward: %s\n",
                s == 0 ? "attention" : "MoE", l, err.msg);
        abort(); /* the same forward fitted a moment ago: only a broken invariant gets here */
    }
}

/* Backward of block l: t->dA holds dL/dXout on entry and dL/dXin on return. */
static void block_backward(trex_model *m, int64_t l, const trex_seqinfo *seq, int64_t N,
                           const bwd_tmp *t)
{
    const trex_config *cfg = m->cfg;
    const block_w *w = &m->w.blk[l];
    block_w *g = &m->g.blk[l];
    const block_saved *bs = &m->bs[l];
    const int64_t d = cfg->hidden_size;
    double il_scale = 0.0;
    if (bs->il.count > 0)
        il_scale = m->opts.indexer_weight / (double)bs->il.count;
    /* Xmid = HC_post(y_attn, Xin) again, bit for bit as the forward made it (it is not kept) */
    trex_prof_begin(TREX_PROF_MHC);
    trex_mhc_post_forward(&m->ctx, cfg, N, t->Xmid, bs->s[0].y, bs->s[0].X, bs->s[0].state);
    trex_prof_end(TREX_PROF_MHC);
    for (int s = 1; s >= 0; s--) {
        const sub_saved *ss = &bs->s[s];
        const float *Xs = s == 1 ? t->Xmid : ss->X;
        float *dXo = s == 1 ? t->dA : t->dB, *dX = s == 1 ? t->dB : t->dA;
        trex_prof_begin(TREX_PROF_MHC);
        trex_mhc_post_backward(&m->ctx, cfg, N, dX, t->dy, t->dstate, dXo, ss->y, Xs, ss->state);
        trex_mhc_pre_collapse(&m->ctx, cfg, N, t->x_in, ss->state, Xs);
        trex_prof_end(TREX_PROF_MHC);
        trex_prof_begin(s == 1 ? TREX_PROF_MOE : TREX_PROF_ATTENTION);
        trex_rmsnorm_forward(m->ctx.pool, t->xn, t->rstd, t->x_in, w->norm[s], N, d,
                             (float)cfg->rms_norm_eps);
        const trex_arena_mark mk = trex_arena_mark_get(m->arena);
        const trex_attn_cache *ac = ss->ac;
        const trex_moe_cache *mc = ss->mc;
        if (sub_dropped(m->opts.recompute, s))
            sub_again(m, l, s, seq, t, &ac, &mc);
        if (s == 1)
            trex_moe_backward(&m->ctx, cfg, (int)l, seq, t->dxn, t->dy, t->xn, &w->moe, &g->moe, mc,
                              m->opts.balance_weight, 1.0);
        else
            trex_attn_backward(&m->ctx, cfg, (int)l, seq, t->dxn, t->dy, t->xn, &w->attn, &g->attn, ac,
                               il_scale);
        trex_arena_rewind(m->arena, mk); /* the recomputed cache, if any, and the backward's scratch */
        trex_rmsnorm_backward(m->ctx.pool, t->dx_in, g->norm[s], t->dxn, t->x_in, w->norm[s], t->rstd, N,
                              d, false);
        trex_prof_end(s == 1 ? TREX_PROF_MOE : TREX_PROF_ATTENTION);
        trex_prof_begin(TREX_PROF_MHC);
        trex_mhc_pre_backward(&m->ctx, cfg, N, dX, &g->hc[s], t->dstate, t->dx_in, Xs, &w->hc[s],
                              ss->state);
        trex_prof_end(TREX_PROF_MHC);
    }
}

/* ---- forward ----------------------------------------------------------------------------------- */

/* ALLOC gives a zeroed block; ALLOC_W one with unspecified contents (trex_arena_alloc_uninit), for a
 * block whose every element is written before any is read. The arena zeroes with memset whatever an
 * earlier pass of it wrote: in a dsv4-bench T = 4096 step's forward that was ~3 GB (the streams of every
 * block, W3, the head's chunk) on the driving thread alone (docs/perf.md "Fixed passes, round 7"). */
#define ALLOC_Z(ptr, count, zero)                                                                  \
    do {                                                                                           \
        size_t bytes_ = (size_t)(count) * sizeof *(ptr);                                           \
        bytes_ = bytes_ ? bytes_ : 1;                                                              \
        (ptr) = (zero) ? trex_arena_alloc(m->arena, bytes_) : trex_arena_alloc_uninit(m->arena, bytes_); \
        if (!(ptr)) {                                                                              \
            rc = trex_err_set(err, TREX_ENOMEM,                                                    \
                              "out of memory for the activations of %" PRId64 " x %" PRId64        \
                              " tokens — use a smaller batch", b->B, b->T);                        \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)
#define ALLOC(ptr, count) ALLOC_Z(ptr, count, true)
#define ALLOC_W(ptr, count) ALLOC_Z(ptr, count, false)

/* The MTP block's inputs, rows [i0, i1) of its Nm = B (T - 1) positions: Xm = the streams X_L of
 * position t < T - 1 of each sequence (mtp_xm_rows); Z0 += e_proj's output Pe added to each of the n
 * streams (mtp_z0_rows). On the pool: the same bits as one loop. */
typedef struct mtp_fwd_job {
    float *Xm, *Z0;
    const float *XL, *Pe;
    int64_t T, n, d;
} mtp_fwd_job;

static void mtp_xm_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const mtp_fwd_job *j = arg;
    const int64_t nd = j->n * j->d;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t r = i / (j->T - 1), t = i % (j->T - 1);
        memcpy(j->Xm + i * nd, j->XL + (r * j->T + t) * nd, (size_t)nd * sizeof(float));
    }
}

static void mtp_z0_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const mtp_fwd_job *j = arg;
    const int64_t n = j->n, d = j->d;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t k = 0; k < n; k++) {
            float *z = j->Z0 + (i * n + k) * d;
            const float *pe = j->Pe + i * d;
            for (int64_t c = 0; c < d; c++)
                z[c] += pe[c];
        }
}

/* Targets of the main head (position t predicts t+1) and the MTP head (position i predicts i+2). */
static void build_targets(trex_model *m, const trex_batch *b)
{
    const int64_t B = b->B, T = b->T;
    m->hp.count = m->hpm.count = 0;
    for (int64_t r = 0; r < B; r++)
        for (int64_t t = 0; t < T; t++) {
            const int64_t i = r * T + t;
            const int32_t *doc = b->doc_ids;
            bool ok = t + 1 < T && (!b->loss_mask || b->loss_mask[i + 1]) && (!doc || doc[i + 1] == doc[i]);
            m->hp.tgt[i] = ok ? b->tokens[i + 1] : -1;
            m->hp.count += ok;
            if (m->mtp && t + 1 < T) {
                const int64_t k = r * (T - 1) + t;
                bool okm = t + 2 < T && (!b->loss_mask || b->loss_mask[i + 2]) &&
                           (!doc || (doc[i] == doc[i + 1] && doc[i + 1] == doc[i + 2]));
                m->hpm.tgt[k] = okm ? b->tokens[i + 2] : -1;
                m->hpm.count += okm;
            }
        }
}

static trex_code head_pass_alloc(trex_model *m, head_pass *hp, int64_t R, const trex_batch *b,
                                 trex_err *err)
{
    trex_code rc = TREX_OK;
    const int64_t d = m->cfg->hidden_size;
    hp->R = R;
    ALLOC(hp->tgt, R);
    ALLOC(hp->hstate, R * trex_mhc_head_state_size(m->cfg->hc_mult));
    ALLOC_W(hp->h, R * d);
    ALLOC(hp->rstd, R);
    ALLOC_W(hp->hn, R * d);
    ALLOC(hp->lse, R);
fail:
    return rc;
}

/* hc_head -> norm over the streams X of hp->R rows: hp->h, hp->rstd, hp->hn. */
static void head_collapse(trex_model *m, head_pass *hp, const float *X, const trex_mhc_w *hcw, const float *normw)
{
    const int64_t d = m->cfg->hidden_size, R = hp->R;
    trex_mhc_head_forward(&m->ctx, m->cfg, R, hp->h, hp->hstate, X, hcw);
    trex_rmsnorm_forward(m->ctx.pool, hp->hn, hp->rstd, hp->h, normw, R, d, (float)m->cfg->rms_norm_eps);
}

typedef struct dhn_pack_job {
    trex_gemm_packed *const *blk;
    const float *W;      /* head.weight [V, d] */
    int64_t V, d;
} dhn_pack_job;

/* Steps [s0, s1) of 32 vocabulary rows, each across all d columns of its block's panels: W's rows are
 * then read front to back, 32 at a time (as the GEMM packs a B stored by rows of k: docs/kernels.md
 * round 11). Blocks are whole steps (HEAD3_DHN_VOCAB1 is a multiple of 32). */
static void dhn_pack_steps(void *arg, int64_t s0, int64_t s1, int tid)
{
    (void)tid;
    const dhn_pack_job *j = arg;
    for (int64_t s = s0; s < s1; s++) {
        const int64_t v = s * 32, b = v / HEAD3_DHN_VOCAB1, v0 = b * HEAD3_DHN_VOCAB1;
        const int64_t vn = dhn_block_rows(j->V, v0), k1 = v - v0 + 32 < vn ? v - v0 + 32 : vn;
        trex_gemm_pack_b_range((uint16_t *)trex_gemm_packed_panels(j->blk[b]), j->d, vn, TREX_F32, false,
                               j->W + v * j->d, j->d, 0, j->d, v - v0, k1);
    }
}

/* d hn's weight operand for 1-term gradients: W_hi [V, d] (the bf16 rounding of head.weight, the bits
 * of W3's W_hi) as packed B blocks of HEAD3_DHN_VOCAB1 rows, made once per forward: every pair of
 * chunks then reads the panels instead of packing W_hi from W3 per product (by pairs of rows, the
 * slowest packer path). V d bf16 (253 MiB at dsv4-bench) in the arena, with W3. */
static trex_code head3_dhn_weight(trex_model *m, const trex_batch *b, trex_err *err)
{
    trex_code rc = TREX_OK;
    const int64_t V = m->cfg->vocab_size, d = m->cfg->hidden_size;
    const int64_t nb = (V + HEAD3_DHN_VOCAB1 - 1) / HEAD3_DHN_VOCAB1;
    /* the blocks, whole steps of 32 rows but the last, laid end to end: the panels of [V, d] in bytes */
    _Static_assert(HEAD3_DHN_VOCAB1 % 32 == 0, "d hn's blocks are whole steps of the packed panels");
    const int64_t blk = (int64_t)(trex_gemm_pack_b_bytes(d, HEAD3_DHN_VOCAB1) / sizeof(uint16_t));
    uint16_t *panels;
    ALLOC_W(panels, trex_gemm_pack_b_bytes(d, V) / sizeof *panels);
    m->dhn_w = calloc((size_t)nb, sizeof *m->dhn_w);
    if (!m->dhn_w) {
        rc = trex_err_set(err, TREX_ENOMEM, "out of memory for the head's packed weight");
        goto fail;
    }
    m->dhn_nb = nb;
    for (int64_t i = 0; i < nb; i++) {
        m->dhn_w[i] = trex_gemm_packed_view_b(d, dhn_block_rows(V, i * HEAD3_DHN_VOCAB1), panels + i * blk);
        if (!m->dhn_w[i]) {
            rc = trex_err_set(err, TREX_ENOMEM, "out of memory for the head's packed weight");
            goto fail;
        }
    }
    dhn_pack_job j = {m->dhn_w, m->w.head, V, d};
    trex_pool_for(m->ctx.pool, (V + 31) / 32, 8, dhn_pack_steps, &j);
    return rc;
fail:
    head3_dhn_weight_free(m);
    return rc;
}

/* The split heads: W3, the split head weight, made once per forward by the first head (the MTP head
 * shares the weight), with d hn's packed weight when 1-term gradients follow (head3_dhn_weight), and
 * hp->hn's split into rows [r0, r0 + R) of hnF: with 3 terms W3 [V, 3d] = [W_hi | W_hi | W_lo],
 * hnF [R, 3d] = [hn_hi | hn_lo | hn_hi]; with 2 (bf16x2g1) W3 [V, 2d] = [W_hi | W_hi],
 * hnF [R, 2d] = [hn_hi | hn_lo], or with m->head_f32b W3 = W_hi spread ([w0, w0, w1, w1, ...]) and
 * hnF's rows hn's d floats (the same bytes). */
static trex_code head3_split(trex_model *m, const head_pass *hp, uint16_t *hnF, int64_t r0, const trex_batch *b,
                             trex_err *err)
{
    trex_code rc = TREX_OK;
    const int64_t V = m->cfg->vocab_size, d = m->cfg->hidden_size, kt = m->head_kt;
    if (!m->w3) {
        ALLOC_W(m->w3, V * kt * d);
        if (m->head_f32b)
            trex_spread_bf16_rows(m->ctx.pool, m->w3, m->w.head, V, d); /* [w0, w0, w1, w1, ...] */
        else if (kt == 3)
            trex_split_bf16x3_rows(m->ctx.pool, m->w3, m->w.head, V, d, 0, 2 * d, d); /* [hi | hi | lo] */
        else
            trex_split_bf16x2_rows(m->ctx.pool, m->w3, m->w.head, V, d, true); /* [hi | hi] */
        if (m->grads && !m->head_g3)
            TREX_TRY(head3_dhn_weight(m, b, err));
    }
    if (m->head_f32b)
        memcpy(hnF + r0 * kt * d, hp->hn, (size_t)(hp->R * d) * sizeof *hp->hn); /* hn's floats */
    else if (kt == 3)
        trex_split_bf16x3_rows(m->ctx.pool, hnF + r0 * 3 * d, hp->hn, hp->R, d, 0, d, 2 * d); /* [hi | lo | hi] */
    else
        trex_split_bf16x2_rows(m->ctx.pool, hnF + r0 * 2 * d, hp->hn, hp->R, d, false); /* [hi | lo] */
fail:
    return rc;
}

/* bf16x3: the transposed chunk (or pair of chunks: head3_pairs) with its d logits in place, hn's planes
 * (3-term gradients), the cross-entropy's partials, for head passes of at most Rh rows. */
static trex_code head3_buffers(trex_model *m, int64_t Rh, bool backward, const trex_batch *b, trex_err *err)
{
    trex_code rc = TREX_OK;
    const int64_t V = m->cfg->vocab_size, d = m->cfg->hidden_size;
    const int64_t pw = head3_chunk_rows(m, Rh) + (head3_chunk_rows(m, Rh) & 1);
    const int64_t nb = (V + HEAD3_CE_VOCAB - 1) / HEAD3_CE_VOCAB;
    ALLOC_W(m->chunk, V * (m->head_g3 || head3_pairs(m, Rh, backward) ? 3 * pw / 2 : pw));
    if (backward && m->head_g3)
        ALLOC_W(m->hnB, 3 * pw * d);
    ALLOC(m->ce_max, (nb + 1) * pw);
    ALLOC(m->ce_sum, (nb + 1) * pw);
fail:
    return rc;
}

/* hc_head -> norm -> head over the streams X of hp->R rows; returns the summed loss in *sum. */
static trex_code head_run(trex_model *m, head_pass *hp, const float *X, const trex_mhc_w *hcw,
                          const float *normw, float *logits, float scale, const trex_batch *b,
                          double *sum, trex_err *err)
{
    trex_code rc = TREX_OK;
    const int64_t d = m->cfg->hidden_size, R = hp->R;
    double *nll;
    head_collapse(m, hp, X, hcw, normw);
    ALLOC(nll, R);
    if (m->grads)
        ALLOC_W(hp->dhn, R * d);
    if (m->head3) {
        uint16_t *hnF;
        ALLOC_W(hnF, R * m->head_kt * d);
        TREX_TRY(head3_split(m, hp, hnF, 0, b, err));
        *sum = head_forward3(m, hp, m->w3, hnF, m->hnB, logits, m->chunk, nll, m->grads ? m->g.head : NULL,
                             scale, R, 0.0f);
    } else {
        *sum = head_forward(m, hp, m->w.head, logits, m->chunk, nll, m->grads ? m->g.head : NULL, scale);
    }
fail:
    return rc;
}

/* Whether the two heads run as one pass (heads_run3): bf16x3g1 or bf16x2g1 with the MTP head and no
 * logits asked for. Their rows are independent but for the sums of d head.weight, so the losses, the
 * logits' log-sum-exp and d hn are the same bits as with a pass per head; d head.weight changes in the
 * order of its sums only. At T = 512 the two heads of 512 and 511 rows then make one chunk of 1 023
 * rows (the logits GEMM streams W3 once instead of twice, d head.weight runs once with K = 1 023;
 * docs/perf.md "LM head in bf16 mode", round 6). */
static bool heads_merged(const trex_model *m, const float *logits, const float *mtp_logits)
{
    return m->head3 && !m->head_g3 && m->mtp && !logits && !mtp_logits;
}

/* Both heads as one pass (heads_merged): the main head's rows, then the MTP head's, whose hn
 * head_collapse made; the summed losses in *sum_main and *sum_mtp. hp->dhn and hpm->dhn point into one
 * [R + Rm, d] buffer. Every other buffer of the pass (W3, the chunk, hn's split, the partials: 1.6 GB
 * at dsv4-bench T = 4096) is carved after an arena mark and released when the pass ends: the head's
 * gradient products have run by then, and the backward's scratch reuses those pages (trex_model_forward
 * does not allocate them in this case). */
static trex_code heads_run3(trex_model *m, float scale_main, float scale_mtp, const trex_batch *b,
                            double *sum_main, double *sum_mtp, trex_err *err)
{
    trex_code rc = TREX_OK;
    const int64_t d = m->cfg->hidden_size, R1 = m->hp.R, R = R1 + m->hpm.R;
    head_pass hc = {.R = R};
    double *nll;
    uint16_t *hnF;
    if (m->grads) {
        ALLOC_W(hc.dhn, R * d);
        m->hp.dhn = hc.dhn;
        m->hpm.dhn = hc.dhn + R1 * d;
    }
    const trex_arena_mark mark = trex_arena_mark_get(m->arena);
    ALLOC(hc.tgt, R);
    ALLOC(hc.lse, R);
    ALLOC(nll, R);
    ALLOC_W(hnF, R * m->head_kt * d);
    TREX_TRY(head3_buffers(m, R, m->grads, b, err));
    memcpy(hc.tgt, m->hp.tgt, (size_t)R1 * sizeof *hc.tgt);
    memcpy(hc.tgt + R1, m->hpm.tgt, (size_t)(R - R1) * sizeof *hc.tgt);
    TREX_TRY(head3_split(m, &m->hp, hnF, 0, b, err));
    TREX_TRY(head3_split(m, &m->hpm, hnF, R1, b, err));
    head_forward3(m, &hc, m->w3, hnF, m->hnB, NULL, m->chunk, nll, m->grads ? m->g.head : NULL, scale_main, R1,
                  scale_mtp);
    memcpy(m->hp.lse, hc.lse, (size_t)R1 * sizeof *hc.lse);
    memcpy(m->hpm.lse, hc.lse + R1, (size_t)(R - R1) * sizeof *hc.lse);
    double s1 = 0.0, s2 = 0.0; /* each head's sum in row order, as head_forward3 sums one head */
    for (int64_t r = 0; r < R1; r++)
        s1 += nll[r];
    for (int64_t r = R1; r < R; r++)
        s2 += nll[r];
    *sum_main = s1;
    *sum_mtp = s2;
    trex_arena_rewind(m->arena, mark);
    head3_dhn_weight_free(m);
    m->w3 = NULL;
    m->chunk = NULL;
    m->ce_max = NULL;
    m->ce_sum = NULL;
fail:
    return rc;
}

/* ---- the gradients of a grads_zero pass ------------------------------------------------------- */

/* n floats at p = +0 with non-temporal stores (SSE2, part of x86-64): each line is written without
 * first being read into the cache (ordinary stores, memset's at these sizes, read every line before
 * writing it: twice the memory traffic), then an sfence, so the zeros are globally visible before the
 * pool's join publishes them. Elsewhere memset. */
static void zero_stream(float *p, int64_t n)
{
#if defined(__SSE2__)
    int64_t i = 0;
    for (; i < n && ((uintptr_t)(p + i) & 15u); i++)
        p[i] = 0.0f;
    const __m128 z = _mm_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        _mm_stream_ps(p + i, z);
        _mm_stream_ps(p + i + 4, z);
        _mm_stream_ps(p + i + 8, z);
        _mm_stream_ps(p + i + 12, z);
    }
    for (; i + 4 <= n; i += 4)
        _mm_stream_ps(p + i, z);
    for (; i < n; i++)
        p[i] = 0.0f;
    _mm_sfence();
#else
    memset(p, 0, (size_t)n * sizeof *p);
#endif
}

/* Runs of the gradient buffer to clear: run r is [at[r], at[r] + len[r]), and the runs laid end to
 * end are the index space [0, total) that the pool's threads split. */
typedef struct clear_job {
    float *g;
    const int64_t *at, *len;
    int64_t nruns;
} clear_job;

static void clear_runs(void *arg, int64_t b, int64_t e, int tid)
{
    (void)tid;
    const clear_job *j = arg;
    int64_t base = 0;
    for (int64_t r = 0; r < j->nruns && base < e; base += j->len[r], r++) {
        const int64_t lo = b > base ? b : base, hi = e < base + j->len[r] ? e : base + j->len[r];
        if (lo < hi)
            zero_stream(j->g + j->at[r] + (lo - base), hi - lo);
    }
}

/* Clears the gradient buffer's floats [at, at + n) by every pool thread. */
static void grads_clear_run(trex_model *m, int64_t at, int64_t n)
{
    clear_job j = {m->grads, &at, &n, 1};
    trex_pool_for(m->ctx.pool, n, 1 << 16, clear_runs, &j);
}

/* Whether a grads_zero pass writes param p's whole gradient with products (beta 0), so that it need
 * not be cleared first: the attention's projections and the MTP block's e_proj / h_proj always; d
 * head.weight with the split heads (fp32's adds to it; with no target at all no product runs and the
 * forward clears it then: head_dw_set); the experts' in bf16 mode (fp32's add to theirs; trex_moe_backward
 * clears those of experts that get no rows). Every other gradient is a sum into the buffer: the
 * embedding's scatter, the norms', mHC's, the router's, the sinks', the compressors' and the indexer's
 * (whose products run only with compressed entries and a KL term). */
static bool grad_written(const trex_model *m, const trex_param *p)
{
    switch (p->kind) {
    case TREX_P_ATTN:
    case TREX_P_MTP_PROJ:
        return true;
    case TREX_P_HEAD:
        return m->head3;
    case TREX_P_EXPERT:
    case TREX_P_SHARED_EXPERT:
        return m->ctx.compute == TREX_BF16;
    default:
        return false;
    }
}

/* A grads_zero pass's start: clears the gradients that the pass sums into (grad_written), adjacent
 * tensors as one run, by every pool thread. At dsv4-bench in bf16 mode that is 636 MB (the embedding's
 * 530, the compressors' 73, the rest small) of the buffer's 3 505 (docs/perf.md "The twenty-sixth
 * sitting"). */
static trex_code grads_clear_summed(trex_model *m, trex_err *err)
{
    const trex_layout *lay = &m->weights->layout;
    int64_t *at = malloc(2 * (size_t)lay->count * sizeof *at);
    if (!at)
        return trex_err_set(err, TREX_ENOMEM, "model: out of memory for %lld gradient runs",
                            (long long)lay->count);
    int64_t *len = at + lay->count, nruns = 0, total = 0;
    for (int64_t i = 0; i < lay->count; i++) {
        const trex_param *p = &lay->params[i];
        if (grad_written(m, p) || p->numel == 0)
            continue;
        if (nruns > 0 && at[nruns - 1] + len[nruns - 1] == p->offset) {
            len[nruns - 1] += p->numel;
        } else {
            at[nruns] = p->offset;
            len[nruns++] = p->numel;
        }
        total += p->numel;
    }
    clear_job j = {m->grads, at, len, nruns};
    trex_pool_for(m->ctx.pool, total, 1 << 16, clear_runs, &j);
    free(at);
    return TREX_OK;
}

trex_code trex_model_forward(trex_model *m, const trex_batch *b, const trex_model_opts *opts,
                             float *grads, float *logits, float *mtp_logits, trex_losses *out,
                             trex_err *err)
{
    const trex_config *cfg = m->cfg;
    const bool backward = grads != NULL;
    trex_code rc = trex_model_check_batch(cfg, b, "batch", err);
    if (rc != TREX_OK)
        return rc;
    if (opts && opts->compute != TREX_F32 && opts->compute != TREX_BF16)
        return trex_err_set(err, TREX_EINVAL, "model options: compute: %s — use F32 or BF16",
                            trex_dtype_name(opts->compute));
    if (opts && (opts->recompute < TREX_MODEL_RECOMPUTE_NONE ||
                 opts->recompute > TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE)) /* the last policy */
        return trex_err_set(err, TREX_EINVAL,
                            "model options: recompute: %d — use NONE, ATTENTION, MOE, FULL, FULL_KEEP_CORE or "
                            "ATTENTION_KEEP_CORE",
                            (int)opts->recompute);
    if (opts && opts->head_precision != TREX_HEAD_AUTO && opts->head_precision != TREX_HEAD_FP32 &&
        opts->head_precision != TREX_HEAD_BF16X3 && opts->head_precision != TREX_HEAD_BF16X3_G1 &&
        opts->head_precision != TREX_HEAD_BF16X2_G1)
        return trex_err_set(err, TREX_EINVAL,
                            "model options: head_precision: %d — use AUTO, FP32, BF16X3, BF16X3_G1 or "
                            "BF16X2_G1",
                            (int)opts->head_precision);
    m->have_pass = false;
    m->grads = grads;
    if (grads) {
        trex_code brc = bind_model(&m->g, cfg, &m->weights->layout, grads, NULL, m->eptr_g, true, err);
        TREX_ASSERT(brc == TREX_OK); /* the same layout bound the weights in trex_model_create */
    }
    trex_arena_reset(m->arena);
    memset(m->bs, 0, (size_t)m->nblocks * sizeof *m->bs);
    memset(m->load, 0, (size_t)(m->nblocks * cfg->n_routed_experts) * sizeof *m->load);
    memset(out, 0, sizeof *out);
    m->opts = opts ? *opts : trex_model_opts_default();
    m->ctx.grads_zero = grads && m->opts.grads_zero;
    m->ctx.compute = m->opts.compute;
    m->tokens = b->tokens;
    const int64_t B = b->B, T = b->T, N = B * T, Nm = B * (T - 1);
    const int64_t d = cfg->hidden_size, n = cfg->hc_mult, nd = n * d, L = cfg->num_hidden_layers;
    m->B = B, m->T = T, m->N = N, m->Nm = m->mtp ? Nm : 0;

    /* documents, positions and targets */
    ALLOC(m->seq.tokens, N);
    ALLOC(m->seq.pos, N);
    ALLOC(m->seq.seg_start, N);
    ALLOC(m->seq.seg_len, N);
    seq_build(&m->seq, B, T, T, b->tokens, b->doc_ids, 0);
    TREX_TRY(head_pass_alloc(m, &m->hp, N, b, err));
    if (m->mtp) {
        ALLOC(m->seqm.tokens, Nm);
        ALLOC(m->seqm.pos, Nm);
        ALLOC(m->seqm.seg_start, Nm);
        ALLOC(m->seqm.seg_len, Nm);
        seq_build(&m->seqm, B, T - 1, T, b->tokens, b->doc_ids, 1);
        TREX_TRY(head_pass_alloc(m, &m->hpm, Nm, b, err));
    }
    build_targets(m, b);
    m->chunk = NULL;
    m->w3 = m->hnB = NULL;
    head3_dhn_weight_free(m);
    m->head_kt = trex_model_head_terms(&m->opts);
    m->head3 = m->head_kt > 0;
    m->head_g3 = m->head3 && trex_model_head_grad3(&m->opts);
    m->head_f32b = m->head_kt == 2 && trex_gemm_f32b_native();
    /* consumed by the split head's first product into d head.weight */
    m->head_dw_set = m->ctx.grads_zero && m->head3;
    if (m->ctx.grads_zero)
        TREX_TRY(grads_clear_summed(m, err));
    const bool merged = heads_merged(m, logits, mtp_logits);
    if (m->head3) { /* the head's buffers; merged heads carve theirs in heads_run3 */
        if (!merged)
            TREX_TRY(head3_buffers(m, N, backward, b, err));
    } else if (backward || !logits || (m->mtp && !mtp_logits)) { /* (with gradients it holds dlogits) */
        ALLOC_W(m->chunk, head_chunk_rows(m, N) * cfg->vocab_size);
    }

    /* scratch of the blocks */
    fwd_tmp tmp;
    ALLOC_W(tmp.x_in, N * d);
    ALLOC_W(tmp.xn, N * d);
    tmp.y = tmp.state = NULL;
    const bool recompute = backward && blocks_recomputed(m->opts.recompute);
    const bool keep_core = recompute && m->opts.recompute == TREX_MODEL_RECOMPUTE_FULL_KEEP_CORE;
    if (!backward) {
        ALLOC(tmp.y, N * d);
        ALLOC(tmp.state, N * trex_mhc_state_size(n));
    }

    /* embedding into n streams, then the main blocks */
    float *Xa, *Xb = NULL;
    ALLOC_W(m->X0, N * nd);
    trex_prof_begin(TREX_PROF_EMBED);
    for (int64_t i = 0; i < N; i++)
        for (int64_t k = 0; k < n; k++)
            memcpy(m->X0 + (i * n + k) * d, m->w.embed + (int64_t)b->tokens[i] * d, (size_t)d * sizeof(float));
    trex_prof_end(TREX_PROF_EMBED);
    double bal = 0.0;
    float *X = m->X0;
    ALLOC_W(Xb, N * nd); /* the middle streams of every block (recomputed in the backward) */
    for (int64_t l = 0; l < L; l++) {
        float *Xout;
        if (backward) {
            ALLOC_W(Xout, N * nd);
        } else {
            Xout = X; /* Xin -> Xb -> back into the same buffer */
        }
        Xa = X;
        int64_t *load = m->load + l * cfg->n_routed_experts;
        if (recompute) { /* keep only the input streams (and the core): the backward runs this forward again */
            if (keep_core && !(m->bs[l].core = trex_attn_core_reserve(&m->ctx, cfg, (int)l, N, m->opts.sparse,
                                                                      true, err))) {
                rc = err ? err->code : TREX_ENOMEM;
                goto fail;
            }
            block_saved scratch = {0};
            const trex_arena_mark mk = trex_arena_mark_get(m->arena);
            rc = block_forward(m, l, &m->seq.info, N, Xa, Xb, Xout, &scratch, &tmp, &bal, &m->bs[l].il, load,
                               m->bs[l].core, err);
            trex_arena_rewind(m->arena, mk);
            m->bs[l].s[0].X = Xa;
        } else {
            rc = block_forward(m, l, &m->seq.info, N, Xa, Xb, Xout, backward ? &m->bs[l] : NULL, &tmp, &bal,
                               &m->bs[l].il, load, NULL, err);
        }
        if (rc != TREX_OK)
            goto fail;
        X = Xout;
    }
    m->XL = X;

    double sum_main = 0.0, sum_mtp = 0.0;
    const float scale_main = m->hp.count ? (float)(1.0 / (double)m->hp.count) : 0.0f;
    trex_prof_begin(TREX_PROF_HEAD);
    if (merged) /* its products run with the MTP head's, below */
        head_collapse(m, &m->hp, m->XL, &m->w.hc_head, m->w.norm);
    else
        rc = head_run(m, &m->hp, m->XL, &m->w.hc_head, m->w.norm, logits, scale_main, b, &sum_main, err);
    trex_prof_end(TREX_PROF_HEAD);
    if (rc != TREX_OK)
        goto fail;

    if (m->mtp) {
        trex_prof_begin(TREX_PROF_MTP);
        ALLOC_W(m->Xm, Nm * nd);
        ALLOC_W(m->hh, Nm * nd);
        ALLOC(m->hh_rstd, Nm * n);
        ALLOC_W(m->ein, Nm * d);
        ALLOC_W(m->ee, Nm * d);
        ALLOC(m->ee_rstd, Nm);
        ALLOC_W(m->Z0, Nm * nd);
        float *Pe;
        ALLOC_W(Pe, Nm * d);
        mtp_fwd_job mf = {.Xm = m->Xm, .Z0 = m->Z0, .XL = m->XL, .Pe = Pe, .T = T, .n = n, .d = d};
        trex_pool_for(m->ctx.pool, Nm, 16, mtp_xm_rows, &mf);
        for (int64_t i = 0; i < Nm; i++)
            memcpy(m->ein + i * d, m->w.embed + (int64_t)m->seqm.tokens[i] * d, (size_t)d * sizeof(float));
        const float eps = (float)cfg->rms_norm_eps;
        trex_rmsnorm_forward(m->ctx.pool, m->hh, m->hh_rstd, m->Xm, m->w.hnorm, Nm * n, d, eps);
        trex_rmsnorm_forward(m->ctx.pool, m->ee, m->ee_rstd, m->ein, m->w.enorm, Nm, d, eps);
        trex_linear_forward_ex(m->ctx.pool, m->ctx.ws, m->ctx.compute, m->Z0, m->hh, m->w.h_proj, Nm * n,
                               d, d);
        trex_linear_forward_ex(m->ctx.pool, m->ctx.ws, m->ctx.compute, Pe, m->ee, m->w.e_proj, Nm, d, d);
        trex_pool_for(m->ctx.pool, Nm, 16, mtp_z0_rows, &mf);
        float *Zmid = Xb, *ZL; /* Xb: free scratch of at least Nm * nd floats */
        ALLOC_W(ZL, Nm * nd);
        rc = block_forward(m, L, &m->seqm.info, Nm, m->Z0, Zmid, ZL, backward ? &m->bs[L] : NULL, &tmp, &bal,
                           &m->bs[L].il, m->load + L * cfg->n_routed_experts, NULL, err);
        if (rc != TREX_OK)
            goto fail;
        m->ZL = ZL;
        const float scale_mtp = m->hpm.count ? (float)(m->opts.mtp_weight / (double)m->hpm.count) : 0.0f;
        trex_prof_begin(TREX_PROF_HEAD);
        if (merged) {
            head_collapse(m, &m->hpm, m->ZL, &m->w.mtp_hc_head, m->w.mtp_norm);
            rc = heads_run3(m, scale_main, scale_mtp, b, &sum_main, &sum_mtp, err);
        } else {
            rc = head_run(m, &m->hpm, m->ZL, &m->w.mtp_hc_head, m->w.mtp_norm, mtp_logits, scale_mtp, b,
                          &sum_mtp, err);
        }
        trex_prof_end(TREX_PROF_HEAD);
        if (rc != TREX_OK)
            goto fail;
        trex_prof_end(TREX_PROF_MTP);
    }

    if (m->head_dw_set) /* no row had a target: no product of the split heads wrote d head.weight */
        grads_clear_run(m, m->g.head - m->grads, cfg->vocab_size * cfg->hidden_size);

    /* losses (docs/model-conventions.md) */
    out->main_targets = m->hp.count;
    out->mtp_targets = m->mtp ? m->hpm.count : 0;
    out->main = m->hp.count ? sum_main / (double)m->hp.count : 0.0;
    out->mtp = m->mtp && m->hpm.count ? sum_mtp / (double)m->hpm.count : 0.0;
    out->balance = bal;
    out->indexer = 0.0;
    for (int64_t l = 0; l < m->nblocks; l++)
        if (trex_config_ratio(cfg, l) == 4 && m->bs[l].il.count > 0)
            out->indexer += m->bs[l].il.kl_sum / (double)m->bs[l].il.count;
    out->loss = out->main + m->opts.mtp_weight * out->mtp + out->balance +
                m->opts.indexer_weight * out->indexer;
    m->have_pass = backward;
    return TREX_OK;
fail:
    m->have_pass = false;
    return rc;
}

/* ---- backward ---------------------------------------------------------------------------------- */

/* dE[token] += sum over rows of the rows of dx (serially, in row order). */
static void embed_backward(float *dE, const int32_t *tokens, const float *dx, int64_t rows,
                           int64_t nstreams, int64_t d)
{
    for (int64_t i = 0; i < rows; i++) {
        float *de = dE + (int64_t)tokens[i] * d;
        for (int64_t k = 0; k < nstreams; k++) {
            const float *g = dx + (i * nstreams + k) * d;
            for (int64_t c = 0; c < d; c++)
                de[c] += g[c];
        }
    }
}

/* Gradient through norm(hc_head(X)) given dhn: adds into dX. */
static void head_collapse_backward(trex_model *m, const head_pass *hp, const float *X,
                                   const trex_mhc_w *hcw, trex_mhc_w *hcg, const float *normw, float *dnorm,
                                   const float *dhn, float *dX, const bwd_tmp *t)
{
    const int64_t d = m->cfg->hidden_size;
    trex_rmsnorm_backward(m->ctx.pool, t->dy, dnorm, dhn, hp->h, normw, hp->rstd, hp->R, d, false);
    trex_mhc_head_backward(&m->ctx, m->cfg, hp->R, dX, hcg, t->dstate, t->dy, X, hcw, hp->hstate);
}

/* The MTP part of the backward: rows [i0, i1) of the token rows of dZ0 [Nm, n, d] summed over the n
 * streams into dPe [Nm, d] (streams in order); rows [i0, i1) of the main streams' gradient dXL
 * [B * T, n d] written as 0 + dXm (dXm [B * (T - 1), n d]: position t of each sequence; the last
 * position 0), the bits of adding dXm into zeroed rows (+0 + -0 is +0). */
typedef struct mtp_bwd_job {
    const float *dZ0, *dXm;
    float *dPe, *dXL;
    int64_t T, n, d;
} mtp_bwd_job;

static void mtp_dpe_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const mtp_bwd_job *j = arg;
    const int64_t n = j->n, d = j->d;
    for (int64_t i = i0; i < i1; i++) {
        float *pe = j->dPe + i * d;
        memcpy(pe, j->dZ0 + i * n * d, (size_t)d * sizeof(float));
        for (int64_t k = 1; k < n; k++) {
            const float *z = j->dZ0 + (i * n + k) * d;
            for (int64_t c = 0; c < d; c++)
                pe[c] += z[c];
        }
    }
}

static void mtp_dxl_rows(void *arg, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const mtp_bwd_job *j = arg;
    const int64_t nd = j->n * j->d;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t r = i / j->T, t = i % j->T;
        float *o = j->dXL + i * nd;
        if (t == j->T - 1) {
            memset(o, 0, (size_t)nd * sizeof(float));
            continue;
        }
        const float *x = j->dXm + (r * (j->T - 1) + t) * nd;
        for (int64_t c = 0; c < nd; c++)
            o[c] = 0.0f + x[c];
    }
}

/* count floats from the arena, not zeroed: for scratch whose every element the caller writes before
 * reading it. Aborts when out of memory, as trex_arena_xalloc does. */
static float *scratch_floats(trex_arena *ar, int64_t count)
{
    const size_t bytes = (size_t)(count > 0 ? count : 1) * sizeof(float);
    float *p = trex_arena_alloc_uninit(ar, bytes);
    if (!p)
        TREX_ABORT("model backward: out of activation memory for %zu bytes of scratch", bytes);
    return p;
}

void trex_model_backward(trex_model *m)
{
    TREX_ASSERT(m->have_pass && m->grads);
    m->have_pass = false;
    const trex_config *cfg = m->cfg;
    const int64_t N = m->N, Nm = m->Nm, T = m->T, B = m->B;
    const int64_t d = cfg->hidden_size, n = cfg->hc_mult, nd = n * d, L = cfg->num_hidden_layers;
    trex_arena *ar = m->arena;
    bwd_tmp t; /* each written before it is read (dA: its MTP rows cleared below, then dXL takes its place) */
    t.dA = scratch_floats(ar, N * nd);
    t.dB = scratch_floats(ar, N * nd);
    t.dy = scratch_floats(ar, N * d);
    t.dxn = scratch_floats(ar, N * d);
    t.dx_in = scratch_floats(ar, N * d);
    t.x_in = scratch_floats(ar, N * d);
    t.xn = scratch_floats(ar, N * d);
    t.rstd = scratch_floats(ar, N);
    t.dstate = scratch_floats(ar, N * trex_mhc_dstate_size(n));
    t.Xmid = scratch_floats(ar, N * nd);
    /* d loss / d X_L: hc_head's backward adds into it, after the MTP part's rows (all of them written) */
    float *dXL = m->mtp ? scratch_floats(ar, N * nd) : trex_arena_xalloc(ar, (size_t)(N * nd) * sizeof(float));

    if (m->mtp) {
        /* MTP head -> MTP block -> e_proj / h_proj -> enorm / hnorm */
        trex_prof_begin(TREX_PROF_MTP);
        memset(t.dA, 0, (size_t)(Nm * nd) * sizeof(float));
        trex_prof_begin(TREX_PROF_HEAD);
        head_collapse_backward(m, &m->hpm, m->ZL, &m->w.mtp_hc_head, &m->g.mtp_hc_head, m->w.mtp_norm,
                               m->g.mtp_norm, m->hpm.dhn, t.dA, &t);
        trex_prof_end(TREX_PROF_HEAD);
        block_backward(m, L, &m->seqm.info, Nm, &t);
        float *dZ0 = t.dA, *dPe = t.dy, *dee = t.dxn, *dXm = t.dB, *dhh = t.dB;
        mtp_bwd_job mj = {.dZ0 = dZ0, .dPe = dPe, .dXL = dXL, .T = T, .n = n, .d = d};
        trex_pool_for(m->ctx.pool, Nm, 16, mtp_dpe_rows, &mj);
        trex_linear_backward_ex(m->ctx.pool, m->ctx.ws, m->ctx.compute, dee, m->g.e_proj, dPe, m->ee,
                                m->w.e_proj, Nm, d, d, false, !m->ctx.grads_zero);
        trex_linear_backward_ex(m->ctx.pool, m->ctx.ws, m->ctx.compute, dhh, m->g.h_proj, dZ0, m->hh,
                                m->w.h_proj, Nm * n, d, d, false, !m->ctx.grads_zero);
        /* hnorm: dXm may not alias dhh; use dA (dZ0 is consumed) */
        trex_rmsnorm_backward(m->ctx.pool, t.dA, m->g.hnorm, dhh, m->Xm, m->w.hnorm, m->hh_rstd, Nm * n, d,
                              false);
        dXm = t.dA;
        mj.dXm = dXm;
        trex_pool_for(m->ctx.pool, B * T, 16, mtp_dxl_rows, &mj);
        trex_rmsnorm_backward(m->ctx.pool, t.dx_in, m->g.enorm, dee, m->ein, m->w.enorm, m->ee_rstd, Nm, d,
                              false);
        trex_prof_begin(TREX_PROF_EMBED);
        embed_backward(m->g.embed, m->seqm.tokens, t.dx_in, Nm, 1, d);
        trex_prof_end(TREX_PROF_EMBED);
        trex_prof_end(TREX_PROF_MTP);
    }

    /* main head -> hc_head -> blocks L-1 .. 0 -> embedding */
    trex_prof_begin(TREX_PROF_HEAD);
    head_collapse_backward(m, &m->hp, m->XL, &m->w.hc_head, &m->g.hc_head, m->w.norm, m->g.norm, m->hp.dhn,
                           dXL, &t);
    trex_prof_end(TREX_PROF_HEAD);
    t.dA = dXL; /* dL/dXout of the last block (dA's buffer is free: the MTP part is done) */
    if (blocks_recomputed(m->opts.recompute)) {
        /* each main block's forward again from its kept input (and attention core), then its backward;
         * the copy's losses, expert counts and outputs go to scratch (they equal the first forward's,
         * bit for bit) */
        float *Xout = scratch_floats(ar, N * nd);
        int64_t *load = trex_arena_xalloc(ar, (size_t)cfg->n_routed_experts * sizeof *load);
        const fwd_tmp ftmp = {.x_in = t.x_in, .xn = t.xn, .y = NULL, .state = NULL};
        for (int64_t l = L - 1; l >= 0; l--) {
            const trex_arena_mark mk = trex_arena_mark_get(ar);
            block_saved *bs = &m->bs[l];
            const float *Xin = bs->s[0].X;
            const trex_indexer_loss il = bs->il;
            trex_attn_core *core = bs->core;
            trex_indexer_loss il_again;
            double bal = 0.0;
            trex_err err = {0};
            memset(bs, 0, sizeof *bs);
            if (block_forward(m, l, &m->seq.info, N, Xin, t.Xmid, Xout, bs, &ftmp, &bal, &il_again, load,
                              core, &err) != TREX_OK) {
                fprintf(stderr, "trex: recomputing block %" PRId64 " in the backward: %s\n", l, err.msg);
                abort(); /* the same forward fitted a moment ago: only a broken invariant gets here */
            }
            bs->il = il;
            block_backward(m, l, &m->seq.info, N, &t);
            trex_arena_rewind(ar, mk);
        }
    } else {
        for (int64_t l = L - 1; l >= 0; l--)
            block_backward(m, l, &m->seq.info, N, &t);
    }
    trex_prof_begin(TREX_PROF_EMBED);
    embed_backward(m->g.embed, m->tokens, t.dA, N, n, d);
    trex_prof_end(TREX_PROF_EMBED);
}
