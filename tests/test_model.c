/* tests/test_model.c — the whole model (model/model.c) on a small hand-made config.
 *
 *  - gradient check: for every trainable tensor, the directional derivative of `loss` along a random
 *    sign vector from the backward pass against fp32 central differences, and single coordinates
 *    (the largest gradient entries) of several tensors;
 *  - packed == unpacked: a row holding two documents gives the same logits, MTP logits and
 *    main/MTP losses as each document alone;
 *  - bad input: token id out of range, T < 2, loss_mask values;
 *  - the head's row chunking and the thread count change no bit of losses or gradients. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "trex/config.h"
#include "trex/model.h"
#include "trex/params.h"
#include "trex/pool.h"

static const char *const CONFIG_JSON =
    "{\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"head_dim\": 16, \"qk_rope_head_dim\": 8, \"q_lora_rank\": 16,"
    " \"o_groups\": 2, \"o_lora_rank\": 8, \"sliding_window\": 4, \"compress_ratios\": [0, 4, 8, 0],"
    " \"compress_rope_theta\": 160000, \"rope_theta\": 10000,"
    " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 65536,"
    " \"beta_fast\": 32, \"beta_slow\": 1}, \"max_position_embeddings\": 1048576,"
    " \"index_n_heads\": 2, \"index_head_dim\": 16, \"index_topk\": 2, \"n_routed_experts\": 4,"
    " \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16,"
    " \"routed_scaling_factor\": 1.5, \"scoring_func\": \"sqrtsoftplus\", \"num_hash_layers\": 1,"
    " \"swiglu_limit\": 10.0, \"hidden_act\": \"silu\", \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20,"
    " \"hc_eps\": 1e-6, \"rms_norm_eps\": 1e-6, \"num_nextn_predict_layers\": 1,"
    " \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1,"
    " \"initializer_range\": 0.1}";

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static double urand(void) /* [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* Moves the parameters that init leaves constant (norm weights 1, hc base 0, hc scale 0.01, sink 0,
 * gate bias 0) to generic values, so that every path carries gradient. */
static void perturb(trex_weights *w)
{
    for (int64_t i = 0; i < w->layout.count; i++) {
        const trex_param *p = &w->layout.params[i];
        if (p->is_int)
            continue;
        float *x = w->f + p->offset;
        for (int64_t k = 0; k < p->numel; k++) {
            switch (p->kind) {
            case TREX_P_NORM: x[k] = (float)(1.0 + 0.3 * urand()); break;
            case TREX_P_HC_BASE: x[k] = (float)(0.5 * urand()); break;
            case TREX_P_HC_SCALE: x[k] = (float)(0.3 + 0.4 * urand()); break;
            case TREX_P_ATTN_SINK: x[k] = (float)(0.5 * urand()); break;
            case TREX_P_GATE_BIAS: x[k] = (float)(0.05 * urand()); break;
            default: break;
            }
        }
    }
}

enum { B = 2, T = 16 };

typedef struct fixture {
    trex_config cfg;
    trex_weights w;
    trex_model *m1, *m2; /* 1 and 2 threads */
    trex_pool *p1, *p2;
    int32_t tokens[B * T], doc[B * T];
    uint8_t mask[B * T];
    trex_batch batch;
    trex_model_opts opts;
} fixture;

static double loss_at(fixture *f)
{
    trex_losses ls;
    trex_err err;
    trex_code rc = trex_model_forward(f->m2, &f->batch, &f->opts, NULL, NULL, NULL, &ls, &err);
    TREX_ASSERT(rc == TREX_OK);
    return ls.loss;
}

/* Checks every trainable tensor (only_indexer: only the indexer's tensors) by directional and
 * single-coordinate differences, with f->opts as they are. */
static void test_gradients(fixture *f, bool only_indexer, const char *label)
{
    const trex_layout *lay = &f->w.layout;
    trex_losses ls;
    trex_err err;
    float *g = calloc((size_t)lay->n_float, sizeof *g);
    TREX_ASSERT(g);
    CHECK(trex_model_forward(f->m2, &f->batch, &f->opts, g, NULL, NULL, &ls, &err) == TREX_OK, "forward: %s",
          err.msg);
    trex_model_backward(f->m2);
    printf("%s: losses: loss %.6f main %.6f mtp %.6f balance %.6g indexer %.6g (targets %lld / %lld)\n", label, ls.loss,
           ls.main, ls.mtp, ls.balance, ls.indexer, (long long)ls.main_targets, (long long)ls.mtp_targets);
    CHECK(ls.balance > 0 && ls.indexer > 0 && ls.mtp > 0, "every loss term is computed");
    CHECK(fabs(ls.loss - (ls.main + f->opts.mtp_weight * ls.mtp + ls.balance + f->opts.indexer_weight * ls.indexer)) <
              1e-9, "loss = main + lambda mtp + balance + w_I indexer");
    CHECK(ls.main_targets == 2 * (T - 1) - 3, "main targets: %lld", (long long)ls.main_targets);

    int nchecked = 0, nbad = 0;
    double worst = 0.0;
    const char *worst_name = "-";
    float *v = malloc(sizeof(float) * 65536);
    TREX_ASSERT(v);
    for (int64_t i = 0; i < lay->count; i++) {
        const trex_param *p = &lay->params[i];
        if (!p->trainable || p->is_int || (only_indexer && !strstr(p->name, ".indexer.")))
            continue;
        TREX_ASSERT(p->numel <= 65536);
        float *x = f->w.f + p->offset;
        const float *gp = g + p->offset;
        double rms = 0.0;
        for (int64_t k = 0; k < p->numel; k++)
            rms += (double)x[k] * x[k];
        rms = sqrt(rms / (double)p->numel);
        double dot = 0.0, gn = 0.0;
        for (int64_t k = 0; k < p->numel; k++) {
            v[k] = urand() < 0 ? -1.0f : 1.0f;
            dot += (double)gp[k] * v[k];
            gn += fabs((double)gp[k]);
        }
        /* A step that crosses a routing or top-k switch shows up as a difference that depends on the
         * step; such a tensor is retried with smaller steps, and must agree at one of them. */
        double fd = 0.0, an = 0.0, err_ = 0.0, tol = 0.0;
        for (int attempt = 0; attempt < 3; attempt++) {
        const double h = (attempt == 0 ? 2e-3 : attempt == 1 ? 5e-4 : 2e-4) * (rms > 0.05 ? rms : 0.05);
        /* x +- h v, restored exactly afterwards */
        float *save = malloc(sizeof(float) * (size_t)p->numel);
        TREX_ASSERT(save);
        memcpy(save, x, sizeof(float) * (size_t)p->numel);
        for (int64_t k = 0; k < p->numel; k++)
            x[k] = save[k] + (float)h * v[k];
        double lp = loss_at(f);
        for (int64_t k = 0; k < p->numel; k++)
            x[k] = save[k] - (float)h * v[k];
        double lm = loss_at(f);
        /* the step actually taken, in fp32 */
        double hp = 0.0;
        for (int64_t k = 0; k < p->numel; k++)
            hp += ((double)(save[k] + (float)h * v[k]) - (double)(save[k] - (float)h * v[k])) * gp[k];
        memcpy(x, save, sizeof(float) * (size_t)p->numel);
        free(save);
        fd = (lp - lm) / (2.0 * h), an = hp / (2.0 * h);
        tol = 2e-4 + 3e-2 * fmax(fabs(fd), fabs(an)) + 1e-3 * gn / sqrt((double)p->numel);
        err_ = fabs(fd - an);
        if (err_ <= tol)
            break;
        }
        nchecked++;
        if (err_ > tol) {
            nbad++;
            printf("  %-48s fd %.6e  backward %.6e  (|g|_1 %.3e)\n", p->name, fd, an, gn);
        }
        if (fmax(fabs(fd), fabs(an)) > 1e-3 && err_ / fmax(fabs(fd), fabs(an)) > worst) {
            worst = err_ / fmax(fabs(fd), fabs(an));
            worst_name = p->name;
        }
        CHECK(err_ <= tol, "directional derivative of loss along %s: fd %.6e vs backward %.6e (dot %.6e)",
              p->name, fd, an, dot);
    }
    printf("%s: directional gradient check: %d tensors, %d outside tolerance, worst relative error %.3g (%s)\n",
           label, nchecked, nbad, worst, worst_name);

    /* single coordinates: the largest gradient entry of several tensors */
    static const char *const names[] = {
        "embed.weight", "head.weight", "hc_head_fn", "hc_head_scale", "layers.0.hc_attn_fn",
        "layers.0.hc_attn_scale", "layers.1.hc_ffn_base", "layers.1.attn.wq_b.weight",
        "layers.1.attn.compressor.ape", "layers.1.attn.indexer.wq_b.weight",
        "layers.1.attn.indexer.weights_proj.weight", "layers.1.attn.indexer.compressor.ape",
        "layers.1.attn.indexer.compressor.wkv.weight", "layers.2.attn.wkv.weight",
        "layers.2.attn.compressor.wgate.weight", "layers.0.ffn.gate.weight", "layers.2.ffn.gate.weight",
        "layers.2.ffn.experts.1.w2.weight", "mtp.0.e_proj.weight", "mtp.0.h_proj.weight", "mtp.0.hnorm.weight",
        "mtp.0.hc_head_fn", "mtp.0.attn.attn_sink", "norm.weight"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const trex_param *p = trex_layout_find(lay, names[k]);
        CHECK(p != NULL, "tensor %s in the layout", names[k]);
        if (!p || (only_indexer && !strstr(p->name, ".indexer.")))
            continue;
        int64_t best = 0;
        for (int64_t e = 1; e < p->numel; e++)
            if (fabsf(g[p->offset + e]) > fabsf(g[p->offset + best]))
                best = e;
        float *x = f->w.f + p->offset + best, save = *x;
        const float h = 1e-2f * fmaxf(fabsf(save), 0.1f);
        *x = save + h;
        float hplus = *x - save;
        double lp = loss_at(f);
        *x = save - h;
        float hminus = save - *x;
        double lm = loss_at(f);
        *x = save;
        const double fd = (lp - lm) / ((double)hplus + (double)hminus), an = g[p->offset + best];
        CHECK(fabs(fd - an) <= 1e-4 + 3e-2 * fabs(an), "d loss / d %s[%lld]: fd %.6e vs backward %.6e", names[k],
              (long long)best, fd, an);
        printf("  coordinate %-40s [%5lld]: fd % .6e  backward % .6e\n", names[k], (long long)best, fd, an);
    }
    free(v);
    free(g);
}

/* Logits of two documents packed into one row against each document alone. */
static void test_packed(fixture *f)
{
    enum { L1 = 8, L2 = 8, TT = L1 + L2 };
    const int64_t V = f->cfg.vocab_size;
    int32_t tok[TT], doc[TT];
    for (int i = 0; i < TT; i++) {
        tok[i] = (int32_t)((i * 37 + 11) % V);
        doc[i] = i < L1 ? 7 : 3;
    }
    float *lp = malloc(sizeof(float) * TT * V), *mp = malloc(sizeof(float) * (TT - 1) * V);
    float *la = malloc(sizeof(float) * L1 * V), *ma = malloc(sizeof(float) * (L1 - 1) * V);
    float *lb = malloc(sizeof(float) * L2 * V), *mb = malloc(sizeof(float) * (L2 - 1) * V);
    TREX_ASSERT(lp && mp && la && ma && lb && mb);
    trex_model_opts o = f->opts;
    trex_losses sp, sa, sb;
    trex_err err;
    trex_batch bp = {1, TT, tok, NULL, doc}, ba = {1, L1, tok, NULL, NULL}, bb = {1, L2, tok + L1, NULL, NULL};
    CHECK(trex_model_forward(f->m1, &bp, &o, NULL, lp, mp, &sp, &err) == TREX_OK, "packed: %s", err.msg);
    CHECK(trex_model_forward(f->m1, &ba, &o, NULL, la, ma, &sa, &err) == TREX_OK, "doc a: %s", err.msg);
    CHECK(trex_model_forward(f->m1, &bb, &o, NULL, lb, mb, &sb, &err) == TREX_OK, "doc b: %s", err.msg);
    double e1 = 0.0, e2 = 0.0;
    for (int64_t i = 0; i < L1 * V; i++)
        e1 = fmax(e1, fabs((double)lp[i] - la[i]));
    for (int64_t i = 0; i < L2 * V; i++)
        e1 = fmax(e1, fabs((double)lp[L1 * V + i] - lb[i]));
    for (int64_t i = 0; i < (L1 - 1) * V; i++)
        e2 = fmax(e2, fabs((double)mp[i] - ma[i]));
    for (int64_t i = 0; i < (L2 - 1) * V; i++)
        e2 = fmax(e2, fabs((double)mp[L1 * V + i] - mb[i]));
    printf("packed vs alone: max |logit diff| %.3g, max |mtp logit diff| %.3g\n", e1, e2);
    CHECK(e1 < 2e-5, "packed logits equal each document alone (max diff %.3g)", e1);
    CHECK(e2 < 2e-5, "packed MTP logits equal each document alone (max diff %.3g)", e2);
    CHECK(sp.main_targets == sa.main_targets + sb.main_targets, "main targets add up");
    CHECK(sp.mtp_targets == sa.mtp_targets + sb.mtp_targets, "mtp targets add up");
    CHECK_NEAR(sp.main, 0.5 * (sa.main + sb.main), 1e-5, "packed loss_main = mean of the two documents");
    CHECK_NEAR(sp.mtp, 0.5 * (sa.mtp + sb.mtp), 1e-5, "packed loss_mtp = mean of the two documents");
    free(lp), free(mp), free(la), free(ma), free(lb), free(mb);
}

static void test_bad_input(fixture *f)
{
    trex_err err;
    trex_losses ls;
    int32_t tok[B * T];
    memcpy(tok, f->tokens, sizeof tok);
    tok[T + 5] = (int32_t)f->cfg.vocab_size;
    trex_batch b = {B, T, tok, NULL, NULL};
    trex_code rc = trex_model_check_batch(&f->cfg, &b, "x.safetensors", &err);
    CHECK(rc == TREX_ERANGE && strstr(err.msg, "x.safetensors") && strstr(err.msg, "tokens") &&
              strstr(err.msg, "[1, 5]") && strstr(err.msg, "64"),
          "token id = vocab_size rejected with file, tensor, place and value: %s", err.msg);
    rc = trex_model_forward(f->m1, &b, &f->opts, NULL, NULL, NULL, &ls, &err);
    CHECK(rc == TREX_ERANGE, "forward rejects an out-of-range token");
    tok[T + 5] = -1;
    CHECK(trex_model_check_batch(&f->cfg, &b, "x", &err) == TREX_ERANGE, "negative token id rejected");
    trex_batch b1 = {B, 1, f->tokens, NULL, NULL};
    CHECK(trex_model_check_batch(&f->cfg, &b1, "x", &err) == TREX_EINVAL, "T = 1 rejected: %s", err.msg);
    uint8_t mask[B * T];
    memset(mask, 1, sizeof mask);
    mask[3] = 2;
    trex_batch b2 = {B, T, f->tokens, mask, NULL};
    CHECK(trex_model_check_batch(&f->cfg, &b2, "x", &err) == TREX_ERANGE && strstr(err.msg, "loss_mask"),
          "loss_mask value 2 rejected");
}

/* The thread count changes no bit; the head's row chunking changes only the order of the head
 * gradient's sums; a second step reuses the arena. */
static void test_bits(fixture *f)
{
    const int64_t n = f->w.layout.n_float;
    float *g1 = calloc((size_t)n, sizeof *g1), *g2 = calloc((size_t)n, sizeof *g2);
    TREX_ASSERT(g1 && g2);
    trex_losses l1, l2;
    trex_err err;
    trex_model_opts o = f->opts;
    CHECK(trex_model_forward(f->m1, &f->batch, &o, g1, NULL, NULL, &l1, &err) == TREX_OK, "fwd 1");
    trex_model_backward(f->m1);
    CHECK(trex_model_forward(f->m2, &f->batch, &o, g2, NULL, NULL, &l2, &err) == TREX_OK, "fwd 2");
    trex_model_backward(f->m2);
    CHECK(memcmp(&l1, &l2, sizeof l1) == 0, "losses: same bits with 1 and 2 threads");
    CHECK(memcmp(g1, g2, sizeof(float) * (size_t)n) == 0, "gradients: same bits with 1 and 2 threads");

    memset(g2, 0, sizeof(float) * (size_t)n);
    o.head_chunk_rows = 5;
    CHECK(trex_model_forward(f->m2, &f->batch, &o, g2, NULL, NULL, &l2, &err) == TREX_OK, "fwd 3");
    trex_model_backward(f->m2);
    CHECK(memcmp(&l1, &l2, sizeof l1) == 0, "losses: same bits with the head in chunks of 5 rows");
    double mx = 0.0, gmax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs((double)g1[i] - g2[i]));
        gmax = fmax(gmax, fabs((double)g1[i]));
    }
    CHECK(mx <= 1e-6 * gmax, "gradients with the head in chunks of 5 rows: max diff %.3g (max |g| %.3g)", mx, gmax);

    /* asking for the logits as well changes nothing */
    memset(g2, 0, sizeof(float) * (size_t)n);
    float *lg = malloc(sizeof(float) * B * T * (size_t)f->cfg.vocab_size);
    float *mlg = malloc(sizeof(float) * B * (T - 1) * (size_t)f->cfg.vocab_size);
    TREX_ASSERT(lg && mlg);
    CHECK(trex_model_forward(f->m2, &f->batch, &f->opts, g2, lg, mlg, &l2, &err) == TREX_OK, "fwd logits");
    trex_model_backward(f->m2);
    CHECK(memcmp(&l1, &l2, sizeof l1) == 0 && memcmp(g1, g2, sizeof(float) * (size_t)n) == 0,
          "losses and gradients: same bits when the logits are written too");
    free(lg);
    free(mlg);

    memset(g2, 0, sizeof(float) * (size_t)n);
    size_t reserved = trex_model_arena_reserved(f->m1);
    CHECK(trex_model_forward(f->m1, &f->batch, &f->opts, g2, NULL, NULL, &l2, &err) == TREX_OK, "fwd 4");
    trex_model_backward(f->m1);
    CHECK(memcmp(g1, g2, sizeof(float) * (size_t)n) == 0, "second step: same gradients");
    CHECK(trex_model_arena_reserved(f->m1) == reserved, "second step: the arena did not grow");
    free(g1);
    free(g2);
}

/* The bf16x3g1 and bf16x2g1 heads (bf16 compute) with gradients run both heads' rows as one pass (model.c
 * heads_run3: main rows 0-31, MTP rows 32-61) and pair their row chunks (head_forward3): the losses are
 * the same bits for any chunking (every logit is one sum over K = 3d or 2d), the gradients differ only by the
 * order of the head gradient's sums, and the thread count changes no bit. Chunks of 6 rows pair up (ten
 * make five pairs, the last chunk of 2 rows is alone; rows 30-35 are of both heads), 7-row chunks never
 * pair (odd), with 2-row chunks over a masked stretch a chunk without targets ends the pair before it,
 * and with the logits asked for ("a pass per head") each head runs alone, in one chunk. */
static void test_head_pairs(fixture *f)
{
    const int64_t n = f->w.layout.n_float;
    float *g1 = calloc((size_t)n, sizeof *g1), *g2 = calloc((size_t)n, sizeof *g2);
    TREX_ASSERT(g1 && g2);
    uint8_t mask[B * T];
    memcpy(mask, f->mask, sizeof mask);
    for (int i = 7; i < 13; i++) /* rows 6-11 of the main head lose their targets */
        mask[i] = 0;
    trex_batch masked = f->batch;
    masked.loss_mask = mask;
    static const int64_t rows[] = {6, 7, 2, 0}; /* 0: the default chunking and the logits asked for */
    float *lg = malloc(sizeof(float) * B * T * (size_t)f->cfg.vocab_size);
    float *mlg = malloc(sizeof(float) * B * (T - 1) * (size_t)f->cfg.vocab_size);
    TREX_ASSERT(lg && mlg);
    const trex_param *hw = trex_layout_find(&f->w.layout, "head.weight");
    TREX_ASSERT(hw);
    trex_err err;
    for (int bh = 0; bh < 4; bh++) {
        const int b = bh & 1;
        const trex_batch *batch = b ? &masked : &f->batch;
        trex_model_opts o = f->opts;
        o.compute = TREX_BF16;
        o.head_precision = bh < 2 ? TREX_HEAD_BF16X3_G1 : TREX_HEAD_BF16X2_G1;
        const char *hn = trex_model_head_name(&o);
        trex_losses l1, l2;
        memset(g1, 0, sizeof(float) * (size_t)n);
        CHECK(trex_model_forward(f->m1, batch, &o, g1, NULL, NULL, &l1, &err) == TREX_OK, "head pairs: %s", err.msg);
        trex_model_backward(f->m1);
        for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
            o.head_chunk_rows = rows[k];
            for (int p = 0; p < 2; p++) {
                trex_model *m = p == 0 ? f->m1 : f->m2;
                float *g = p == 0 ? g2 : g1; /* 1 thread into g2, then 2 threads compared with it */
                if (p == 1) {
                    g = calloc((size_t)n, sizeof *g);
                    TREX_ASSERT(g);
                } else {
                    memset(g2, 0, sizeof(float) * (size_t)n);
                }
                CHECK(trex_model_forward(m, batch, &o, g, rows[k] ? NULL : lg, rows[k] ? NULL : mlg, &l2, &err) ==
                          TREX_OK,
                      "head pairs: %s", err.msg);
                trex_model_backward(m);
                CHECK(memcmp(&l1, &l2, sizeof l1) == 0, "%s head, %lld-row chunks%s, %d threads: same losses", hn,
                      (long long)rows[k], b ? ", masked" : "", p + 1);
                if (p == 1) {
                    CHECK(memcmp(g, g2, sizeof(float) * (size_t)n) == 0,
                          "%s head, %lld-row chunks%s: same gradient bits with 1 and 2 threads", hn,
                          (long long)rows[k], b ? ", masked" : "");
                    free(g);
                    continue;
                }
                double mx = 0.0, gmax = 0.0;
                int64_t nother = 0; /* differing entries outside head.weight: d hn is the same sums */
                for (int64_t i = 0; i < n; i++) {
                    mx = fmax(mx, fabs((double)g1[i] - g2[i]));
                    gmax = fmax(gmax, fabs((double)g1[i]));
                    nother += (i < hw->offset || i >= hw->offset + hw->numel) && memcmp(&g1[i], &g2[i], 4) != 0;
                }
                CHECK(gmax > 0.0 && mx <= 1e-6 * gmax,
                      "%s head, %lld-row chunks%s: gradients as with one chunk, max diff %.3g (max |g| %.3g)", hn,
                      (long long)rows[k], b ? ", masked" : "", mx, gmax);
                CHECK(nother == 0,
                      "%s head, %lld-row chunks%s: gradients but head.weight's the same bits (%lld differ)", hn,
                      (long long)rows[k], b ? ", masked" : "", (long long)nother);
            }
        }
    }
    free(lg);
    free(mlg);
    free(g1);
    free(g2);
}

/* One micro-batch into g (its forward and backward on f->m1) with options o and grads_zero as given. */
static void grads_pass(fixture *f, const trex_batch *b, trex_model_opts o, bool grads_zero, float *g, float *lg,
                       float *mlg, trex_losses *l)
{
    trex_err err;
    o.grads_zero = grads_zero;
    CHECK(trex_model_forward(f->m1, b, &o, g, lg, mlg, l, &err) == TREX_OK, "grads_zero: %s", err.msg);
    trex_model_backward(f->m1);
}

/* trex_model_opts.grads_zero: with the gradients cleared before the pass, the split heads write d
 * head.weight with their first product (beta 0) instead of adding to the zeros. Every gradient keeps its
 * value (0 + x = x) for each split head, chunking (pairs, odd chunks that never pair, a masked stretch, the
 * logits asked for) and both heads' passes: a head that wrote with every product would differ, and one
 * that wrote with none would leave the NaN that d head.weight starts as in that run. */
static void test_head_grads_zero(fixture *f)
{
    const int64_t n = f->w.layout.n_float;
    float *g1 = malloc(sizeof(float) * (size_t)n), *g2 = malloc(sizeof(float) * (size_t)n);
    float *lg = malloc(sizeof(float) * B * T * (size_t)f->cfg.vocab_size);
    float *mlg = malloc(sizeof(float) * B * (T - 1) * (size_t)f->cfg.vocab_size);
    TREX_ASSERT(g1 && g2 && lg && mlg);
    uint8_t mask[B * T];
    memcpy(mask, f->mask, sizeof mask);
    for (int i = 7; i < 13; i++)
        mask[i] = 0;
    trex_batch masked = f->batch;
    masked.loss_mask = mask;
    const trex_param *hw = trex_layout_find(&f->w.layout, "head.weight");
    TREX_ASSERT(hw);
    static const trex_head_precision heads[] = {TREX_HEAD_BF16X3, TREX_HEAD_BF16X3_G1, TREX_HEAD_BF16X2_G1};
    static const int64_t rows[] = {6, 7, 2, 0}; /* 0: the default chunking and the logits asked for */
    for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++)
        for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
            for (int b = 0; b < 2; b++) {
                const trex_batch *batch = b ? &masked : &f->batch;
                trex_model_opts o = f->opts;
                o.compute = TREX_BF16;
                o.head_precision = heads[h];
                o.head_chunk_rows = rows[k];
                trex_losses l1, l2;
                memset(g1, 0, sizeof(float) * (size_t)n);
                memset(g2, 0, sizeof(float) * (size_t)n);
                grads_pass(f, batch, o, false, g1, rows[k] ? NULL : lg, rows[k] ? NULL : mlg, &l1);
                for (int64_t i = hw->offset; i < hw->offset + hw->numel; i++)
                    g2[i] = NAN; /* written by the head's first product, never read */
                grads_pass(f, batch, o, true, g2, rows[k] ? NULL : lg, rows[k] ? NULL : mlg, &l2);
                int64_t ndiff = 0;
                double gmax = 0.0;
                for (int64_t i = 0; i < n; i++) {
                    ndiff += g1[i] != g2[i];
                    gmax = fmax(gmax, fabs((double)g1[i]));
                }
                CHECK(memcmp(&l1, &l2, sizeof l1) == 0 && gmax > 0.0 && ndiff == 0,
                      "%s head, %lld-row chunks%s: gradients cleared beforehand, the head writing its first "
                      "product: the same values (%lld differ)",
                      trex_model_head_name(&o), (long long)rows[k], b ? ", masked" : "", (long long)ndiff);
            }
    free(lg);
    free(mlg);
    free(g1);
    free(g2);
}

/* One case of test_grads_zero_sets_all: batch b under options o, from a cleared buffer g1 (adding) and
 * from a buffer of NaN g2 (grads_zero); false, with a message, when a value or a loss differs. */
static bool grads_zero_case(fixture *f, const trex_batch *b, const char *bname, trex_model_opts o, float *g1,
                            float *g2)
{
    const int64_t n = f->w.layout.n_float;
    trex_losses l1, l2;
    memset(g1, 0, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        g2[i] = NAN;
    grads_pass(f, b, o, false, g1, NULL, NULL, &l1);
    grads_pass(f, b, o, true, g2, NULL, NULL, &l2);
    int64_t ndiff = 0;
    const char *first = "-";
    for (int64_t k = 0; k < f->w.layout.count; k++) {
        const trex_param *p = &f->w.layout.params[k];
        for (int64_t i = p->offset; i < p->offset + p->numel; i++)
            if (!(g1[i] == g2[i])) /* NaN, or another value; +0 and -0 alike */
                first = ndiff++ ? first : p->name;
    }
    const bool ok = ndiff == 0 && memcmp(&l1, &l2, sizeof l1) == 0;
    CHECK(ok, "grads_zero from a NaN buffer: %s, %s, %s, recompute %d, %s head%s: %lld values differ from a "
          "pass adding to zeros (the first in %s)",
          trex_dtype_name(o.compute), o.sparse ? "sparse" : "dense", bname, (int)o.recompute,
          trex_model_head_name(&o), o.mtp_weight == 0.0 ? ", loss weights 0" : "", (long long)ndiff, first);
    return ok;
}

/* grads_zero is the promise that the pass sets every gradient: whatever the buffer held before is
 * never read. Each pass starts from a buffer of NaN and must give the values of a pass that adds to a
 * cleared buffer, every tensor (the summed ones that the model clears, the products that write theirs)
 * in every case that changes which products run: fp32 and bf16 compute, dense and sparse, each head,
 * each recompute policy, a batch without targets (no product of the head runs), two tokens (most
 * experts get no rows), and loss weights of 0. */
static void test_grads_zero_sets_all(fixture *f)
{
    const size_t bytes = sizeof(float) * (size_t)f->w.layout.n_float;
    float *g1 = malloc(bytes), *g2 = malloc(bytes);
    TREX_ASSERT(g1 && g2);
    uint8_t none[B * T];
    memset(none, 0, sizeof none);
    const trex_batch batches[] = {f->batch, {B, T, f->tokens, none, f->doc}, {1, 2, f->tokens, f->mask, NULL}};
    static const char *const bname[] = {"the batch", "no targets", "two tokens"};
    static const trex_model_recompute pol[] = {
        TREX_MODEL_RECOMPUTE_NONE, TREX_MODEL_RECOMPUTE_FULL, TREX_MODEL_RECOMPUTE_ATTENTION,
        TREX_MODEL_RECOMPUTE_MOE, TREX_MODEL_RECOMPUTE_FULL_KEEP_CORE, TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE};
    static const trex_head_precision heads[] = {TREX_HEAD_AUTO, TREX_HEAD_BF16X3, TREX_HEAD_FP32};
    int cases = 0, bad = 0;
    for (int run = 0; run < 4; run++) {
        trex_model_opts o = f->opts;
        o.compute = run & 1 ? TREX_BF16 : TREX_F32;
        o.sparse = run >= 2;
        /* every policy with every head, on the first batch */
        for (size_t pi = 0; pi < sizeof pol / sizeof pol[0]; pi++)
            for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
                trex_model_opts c = o;
                c.recompute = pol[pi];
                c.head_precision = heads[hi];
                cases++;
                bad += !grads_zero_case(f, &batches[0], bname[0], c, g1, g2);
            }
        /* every batch with the loss weights 0, and the others with the weights as they are */
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++)
            for (int zw = bi == 0; zw < 2; zw++) {
                trex_model_opts c = o;
                if (zw)
                    c.mtp_weight = c.indexer_weight = c.balance_weight = 0.0;
                cases++;
                bad += !grads_zero_case(f, &batches[bi], bname[bi], c, g1, g2);
            }
    }
    CHECK(bad == 0, "grads_zero sets every gradient: %d cases, %d differ", cases, bad);
    free(g1);
    free(g2);
}

/* With grads_zero, the attention's weight gradients (wq_a, wq_b, wkv, wo_a, wo_b, the compressors' and the
 * indexer's projections) and the MTP block's e_proj and h_proj are written by their products (beta 0)
 * instead of added to the zeros they hold: every gradient equal to a run that adds (fp32 and bf16, dense
 * and sparse), the losses too, with those tensors starting as NaN (kinds ATTN and MTP_PROJ always; the
 * compressors' and the indexer's, which run only with compressed entries and a KL term, where the run
 * that adds wrote them). Then a second pass without grads_zero on top of both: it must add, each tensor
 * then twice the first pass's within rounding (a product that always writes leaves it once). */
static void test_weight_grads_zero(fixture *f)
{
    const int64_t n = f->w.layout.n_float;
    const size_t bytes = sizeof(float) * (size_t)n;
    float *g1 = malloc(bytes), *g2 = malloc(bytes), *g0 = malloc(bytes);
    TREX_ASSERT(g1 && g2 && g0);
    for (int run = 0; run < 4; run++) {
        trex_model_opts o = f->opts;
        o.compute = run & 1 ? TREX_BF16 : TREX_F32;
        o.sparse = run >= 2;
        const char *dt = trex_dtype_name(o.compute), *mode = o.sparse ? "sparse" : "dense";
        trex_losses l1, l2;
        memset(g1, 0, bytes);
        memset(g2, 0, bytes);
        grads_pass(f, &f->batch, o, false, g1, NULL, NULL, &l1);
        int64_t nan = 0;
        for (int64_t k = 0; k < f->w.layout.count; k++) {
            const trex_param *p = &f->w.layout.params[k];
            bool poison = p->kind == TREX_P_ATTN || p->kind == TREX_P_MTP_PROJ;
            if (p->kind == TREX_P_COMPRESSOR || p->kind == TREX_P_INDEXER)
                for (int64_t i = p->offset; i < p->offset + p->numel && !poison; i++)
                    poison = g1[i] != 0.0f;
            for (int64_t i = p->offset; poison && i < p->offset + p->numel; i++, nan++)
                g2[i] = NAN;
        }
        grads_pass(f, &f->batch, o, true, g2, NULL, NULL, &l2);
        memcpy(g0, g1, bytes);
        for (int pass = 1; pass <= 2; pass++) {
            if (pass == 2) { /* a second micro-batch: both add */
                grads_pass(f, &f->batch, o, false, g1, NULL, NULL, &l1);
                grads_pass(f, &f->batch, o, false, g2, NULL, NULL, &l2);
            }
            int64_t ndiff = 0;
            for (int64_t i = 0; i < n; i++)
                ndiff += memcmp(&g1[i], &g2[i], sizeof g1[i]) != 0;
            CHECK(memcmp(&l1, &l2, sizeof l1) == 0 && nan > 0 && ndiff == 0,
                  "%s, %s, pass %d: weight gradients written by their products, then added to: the same bits "
                  "(%lld of %lld differ, %lld started as NaN)",
                  dt, mode, pass, (long long)ndiff, (long long)n, (long long)nan);
        }
        int64_t off = 0;
        for (int64_t k = 0; k < f->w.layout.count; k++) {
            const trex_param *p = &f->w.layout.params[k];
            double e2 = 0.0, r2 = 0.0;
            for (int64_t i = p->offset; !p->is_int && i < p->offset + p->numel; i++) {
                const double r = 2.0 * (double)g0[i];
                e2 += ((double)g2[i] - r) * ((double)g2[i] - r);
                r2 += r * r;
            }
            off += !(e2 <= 1e-8 * r2);
        }
        CHECK(off == 0, "%s, %s: after a second micro-batch every gradient is twice the first's (%lld tensors "
              "are not)", dt, mode, (long long)off);
    }
    free(g0);
    free(g1);
    free(g2);
}

/* Every recompute policy (full, attention, moe, full-keep-core, attention-keep-core) gives the same bits as
 * keeping everything: the
 * losses and every gradient (dense and sparse, fp32 and bf16 compute, 1 and 2 threads); each holds less in the activation
 * arena after the backward, and leaves the expert loads of the forward untouched (counted once). */
static void test_recompute(fixture *f)
{
    static const trex_model_recompute pol[] = {TREX_MODEL_RECOMPUTE_FULL, TREX_MODEL_RECOMPUTE_ATTENTION,
                                               TREX_MODEL_RECOMPUTE_MOE, TREX_MODEL_RECOMPUTE_FULL_KEEP_CORE,
                                               TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE};
    const int64_t n = f->w.layout.n_float;
    const int64_t nb = f->cfg.num_hidden_layers + f->cfg.num_nextn_predict_layers;
    float *g1 = calloc((size_t)n, sizeof *g1), *g2 = calloc((size_t)n, sizeof *g2);
    int64_t *load1 = calloc((size_t)(nb * f->cfg.n_routed_experts), sizeof *load1);
    TREX_ASSERT(g1 && g2 && load1);
    trex_err err;
    for (int run = 0; run < 4; run++) { /* dense, sparse; fp32, bf16 compute */
        const int sparse = run & 1;
        trex_model_opts o = f->opts;
        o.sparse = sparse;
        o.compute = run < 2 ? TREX_F32 : TREX_BF16;
        trex_losses l1, l2;
        memset(g1, 0, sizeof(float) * (size_t)n);
        CHECK(trex_model_forward(f->m1, &f->batch, &o, g1, NULL, NULL, &l1, &err) == TREX_OK, "keep: %s", err.msg);
        trex_model_backward(f->m1);
        const size_t used_keep = trex_model_arena_used(f->m1);
        for (int64_t l = 0; l < nb; l++)
            memcpy(load1 + l * f->cfg.n_routed_experts, trex_model_expert_load(f->m1, l),
                   sizeof(int64_t) * (size_t)f->cfg.n_routed_experts);
        size_t used_full = 0, used_attn = 0;
        for (size_t k = 0; k < sizeof pol / sizeof pol[0]; k++) {
            o.recompute = pol[k];
            const char *name = trex_model_recompute_name(pol[k]);
            for (int p = 0; p < 2; p++) {
                trex_model *m = p == 0 ? f->m1 : f->m2;
                memset(g2, 0, sizeof(float) * (size_t)n);
                CHECK(trex_model_forward(m, &f->batch, &o, g2, NULL, NULL, &l2, &err) == TREX_OK, "%s: %s", name,
                      err.msg);
                trex_model_backward(m);
                CHECK(memcmp(&l1, &l2, sizeof l1) == 0, "recompute %s (%s, %s, %d threads): same losses", name,
                      sparse ? "sparse" : "dense", trex_dtype_name(o.compute), p + 1);
                int64_t ndiff = 0;
                for (int64_t i = 0; i < n; i++)
                    ndiff += memcmp(&g1[i], &g2[i], sizeof(float)) != 0;
                CHECK(ndiff == 0, "recompute %s (%s, %s, %d threads): same gradients (%lld of %lld differ)",
                      name, sparse ? "sparse" : "dense", trex_dtype_name(o.compute), p + 1, (long long)ndiff,
                      (long long)n);
                bool same_load = true;
                for (int64_t l = 0; l < nb; l++)
                    same_load &= memcmp(load1 + l * f->cfg.n_routed_experts, trex_model_expert_load(m, l),
                                        sizeof(int64_t) * (size_t)f->cfg.n_routed_experts) == 0;
                CHECK(same_load, "recompute %s (%s): expert loads counted once", name, sparse ? "sparse" : "dense");
                if (p == 0)
                    CHECK(trex_model_arena_used(m) < used_keep, "recompute %s holds less: %zu vs %zu bytes", name,
                          trex_model_arena_used(m), used_keep);
                /* the keep-core policies hold the cores on top of what full (attention) keeps: they really
                 * keep them */
                if (p == 0 && pol[k] == TREX_MODEL_RECOMPUTE_FULL)
                    used_full = trex_model_arena_used(m);
                if (p == 0 && pol[k] == TREX_MODEL_RECOMPUTE_ATTENTION)
                    used_attn = trex_model_arena_used(m);
                if (p == 0 && pol[k] == TREX_MODEL_RECOMPUTE_FULL_KEEP_CORE)
                    CHECK(trex_model_arena_used(m) > used_full, "recompute %s holds more than full: %zu vs %zu bytes",
                          name, trex_model_arena_used(m), used_full);
                if (p == 0 && pol[k] == TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE)
                    CHECK(trex_model_arena_used(m) > used_attn,
                          "recompute %s holds more than attention: %zu vs %zu bytes", name, trex_model_arena_used(m),
                          used_attn);
            }
        }
    }
    trex_model_opts bad = f->opts;
    bad.recompute = (trex_model_recompute)7;
    trex_losses ls;
    CHECK(trex_model_forward(f->m1, &f->batch, &bad, NULL, NULL, NULL, &ls, &err) == TREX_EINVAL &&
              strstr(err.msg, "recompute"),
          "an unknown recompute policy is refused");
    free(g1);
    free(g2);
    free(load1);
}

/* The model takes most activation blocks from its arena without zeroing them (model.c ALLOC_W,
 * scratch_floats: every element written before it is read). A model whose arena holds the activations
 * of another batch (other tokens, other chunking, one more document) gives the same bits as a fresh
 * model: losses and every gradient, fp32 and bf16 compute (the default head, both heads as one pass),
 * with and without recompute, each split head (bf16x3, bf16x3g1, bf16x2g1), and a forward without
 * gradients. */
static void test_stale_arena(fixture *f, trex_mem *mem)
{
    const int64_t n = f->w.layout.n_float;
    float *g1 = calloc((size_t)n, sizeof *g1), *g2 = calloc((size_t)n, sizeof *g2);
    int32_t tok[B * T], doc[B * T];
    TREX_ASSERT(g1 && g2);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (f->tokens[i] * 7 + 3) % (int32_t)f->cfg.vocab_size;
        doc[i] = i / 5;
    }
    const trex_batch other = {B, T, tok, NULL, doc};
    static const struct {
        trex_dtype compute;
        trex_head_precision head;
        trex_model_recompute rec;
        bool grads;
    } runs[] = {{TREX_F32, TREX_HEAD_AUTO, TREX_MODEL_RECOMPUTE_NONE, true},
                {TREX_F32, TREX_HEAD_AUTO, TREX_MODEL_RECOMPUTE_FULL, true},
                {TREX_BF16, TREX_HEAD_AUTO, TREX_MODEL_RECOMPUTE_NONE, true},
                {TREX_BF16, TREX_HEAD_AUTO, TREX_MODEL_RECOMPUTE_FULL, true},
                {TREX_BF16, TREX_HEAD_AUTO, TREX_MODEL_RECOMPUTE_ATTENTION, true},
                {TREX_BF16, TREX_HEAD_AUTO, TREX_MODEL_RECOMPUTE_FULL_KEEP_CORE, true},
                {TREX_BF16, TREX_HEAD_AUTO, TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE, true},
                {TREX_BF16, TREX_HEAD_BF16X3, TREX_MODEL_RECOMPUTE_NONE, true},
                {TREX_BF16, TREX_HEAD_BF16X3_G1, TREX_MODEL_RECOMPUTE_NONE, true},
                {TREX_BF16, TREX_HEAD_BF16X2_G1, TREX_MODEL_RECOMPUTE_NONE, true},
                {TREX_BF16, TREX_HEAD_AUTO, TREX_MODEL_RECOMPUTE_NONE, false}};
    trex_err err;
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        trex_model_opts o = f->opts;
        o.compute = runs[r].compute;
        o.head_precision = runs[r].head;
        o.recompute = runs[r].grads ? runs[r].rec : TREX_MODEL_RECOMPUTE_NONE;
        trex_model *fresh = NULL, *used = NULL;
        CHECK(trex_model_create(&fresh, &f->w, f->p2, mem, &err) == TREX_OK, "model: %s", err.msg);
        CHECK(trex_model_create(&used, &f->w, f->p2, mem, &err) == TREX_OK, "model: %s", err.msg);
        if (!fresh || !used)
            break;
        trex_losses l1, l2;
        memset(g1, 0, sizeof(float) * (size_t)n);
        CHECK(trex_model_forward(fresh, &f->batch, &o, runs[r].grads ? g1 : NULL, NULL, NULL, &l1, &err) == TREX_OK,
              "fresh: %s", err.msg);
        if (runs[r].grads)
            trex_model_backward(fresh);
        /* fill used's arena with another pass (gradients, chunks of 5 rows), then the same pass as fresh */
        trex_model_opts ob = o;
        ob.head_chunk_rows = 5;
        CHECK(trex_model_forward(used, &other, &ob, g2, NULL, NULL, &l2, &err) == TREX_OK, "other: %s", err.msg);
        trex_model_backward(used);
        memset(g2, 0, sizeof(float) * (size_t)n);
        CHECK(trex_model_forward(used, &f->batch, &o, runs[r].grads ? g2 : NULL, NULL, NULL, &l2, &err) == TREX_OK,
              "reused: %s", err.msg);
        if (runs[r].grads)
            trex_model_backward(used);
        CHECK(memcmp(&l1, &l2, sizeof l1) == 0 && memcmp(g1, g2, sizeof(float) * (size_t)n) == 0,
              "run %zu (%s, head %d, recompute %s%s): a reused arena gives a fresh model's bits", r,
              trex_dtype_name(o.compute), (int)o.head_precision, trex_model_recompute_name(o.recompute),
              runs[r].grads ? "" : ", forward only");
        trex_model_destroy(fresh);
        trex_model_destroy(used);
    }
    free(g1);
    free(g2);
}

/* A config without the MTP block: loss_mtp is 0, mtp_logits are not touched, gradients are finite
 * and match central differences along a random direction for a few tensors. */
static void test_no_mtp(void)
{
    char json[4096];
    snprintf(json, sizeof json, "%s", CONFIG_JSON);
    char *p = strstr(json, "\"compress_ratios\": [0, 4, 8, 0]");
    TREX_ASSERT(p);
    memcpy(p, "\"compress_ratios\": [0, 4, 8]   ", strlen("\"compress_ratios\": [0, 4, 8, 0]"));
    p = strstr(json, "\"num_nextn_predict_layers\": 1");
    TREX_ASSERT(p);
    p[strlen("\"num_nextn_predict_layers\": ")] = '0';
    static fixture f;
    trex_err err;
    cJSON *j = cJSON_Parse(json);
    TREX_ASSERT(j);
    trex_code rc = trex_config_from_json(&f.cfg, j, "test-config-no-mtp", &err);
    cJSON_Delete(j);
    CHECK(rc == TREX_OK, "config without MTP: %s", err.msg);
    if (rc != TREX_OK)
        return;
    trex_mem mem;
    memset(&mem, 0, sizeof mem);
    rc = trex_weights_init(&f.w, &f.cfg, 9, &mem, &err);
    CHECK(rc == TREX_OK, "weights: %s", err.msg);
    if (rc != TREX_OK)
        return;
    perturb(&f.w);
    f.p2 = trex_pool_create(2);
    TREX_ASSERT(f.p2);
    CHECK(trex_model_create(&f.m2, &f.w, f.p2, &mem, &err) == TREX_OK, "model: %s", err.msg);
    for (int i = 0; i < B * T; i++)
        f.tokens[i] = (int32_t)((i * 29 + 3) % f.cfg.vocab_size);
    f.batch = (trex_batch){B, T, f.tokens, NULL, NULL};
    f.opts = trex_model_opts_default();
    f.opts.indexer_weight = 0.0;
    float *g = calloc((size_t)f.w.layout.n_float, sizeof *g);
    float mtp_logits[4] = {7, 7, 7, 7};
    trex_losses ls;
    TREX_ASSERT(g);
    CHECK(trex_model_forward(f.m2, &f.batch, &f.opts, g, NULL, mtp_logits, &ls, &err) == TREX_OK, "fwd: %s",
          err.msg);
    trex_model_backward(f.m2);
    CHECK(ls.mtp == 0.0 && ls.mtp_targets == 0 && mtp_logits[0] == 7.0f, "no MTP: no MTP loss or logits");
    CHECK(ls.main_targets == B * (T - 1), "no MTP: main targets %lld", (long long)ls.main_targets);
    bool finite = true;
    for (int64_t i = 0; i < f.w.layout.n_float; i++)
        finite &= isfinite(g[i]);
    CHECK(finite, "no MTP: gradients are finite");
    static const char *const names[] = {"embed.weight", "layers.0.hc_attn_fn", "layers.2.ffn.gate.weight",
                                        "hc_head_base", "head.weight"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const trex_param *q = trex_layout_find(&f.w.layout, names[k]);
        CHECK(q != NULL, "%s", names[k]);
        if (!q)
            continue;
        float *x = f.w.f + q->offset, *save = malloc(sizeof(float) * (size_t)q->numel);
        TREX_ASSERT(save);
        memcpy(save, x, sizeof(float) * (size_t)q->numel);
        double an = 0.0;
        const float h = 1e-3f;
        for (int64_t e = 0; e < q->numel; e++) {
            float v = (e * 7 + k) % 3 == 0 ? -1.0f : 1.0f;
            an += (double)g[q->offset + e] * v;
            x[e] = save[e] + h * v;
        }
        double lp = loss_at(&f);
        for (int64_t e = 0; e < q->numel; e++)
            x[e] = save[e] - h * ((e * 7 + k) % 3 == 0 ? -1.0f : 1.0f);
        double lm = loss_at(&f);
        memcpy(x, save, sizeof(float) * (size_t)q->numel);
        free(save);
        double fd = (lp - lm) / (2.0 * h);
        CHECK(fabs(fd - an) <= 1e-3 + 3e-2 * fabs(fd), "no MTP: direction along %s: fd %.6e vs %.6e", names[k], fd,
              an);
    }
    free(g);
    trex_model_destroy(f.m2);
    trex_weights_free(&f.w);
    trex_pool_destroy(f.p2);
}

int main(void)
{
    static fixture f;
    trex_err err;
    cJSON *j = cJSON_Parse(CONFIG_JSON);
    TREX_ASSERT(j);
    trex_code rc = trex_config_from_json(&f.cfg, j, "test-config", &err);
    cJSON_Delete(j);
    CHECK(rc == TREX_OK, "config: %s", err.msg);
    if (rc != TREX_OK)
        return check_summary();
    trex_mem mem;
    memset(&mem, 0, sizeof mem);
    rc = trex_weights_init(&f.w, &f.cfg, 5, &mem, &err);
    CHECK(rc == TREX_OK, "weights: %s", err.msg);
    if (rc != TREX_OK)
        return check_summary();
    perturb(&f.w);
    f.p1 = trex_pool_create(1);
    f.p2 = trex_pool_create(2);
    TREX_ASSERT(f.p1 && f.p2);
    CHECK(trex_model_create(&f.m1, &f.w, f.p1, &mem, &err) == TREX_OK, "model: %s", err.msg);
    CHECK(trex_model_create(&f.m2, &f.w, f.p2, &mem, &err) == TREX_OK, "model: %s", err.msg);
    for (int i = 0; i < B * T; i++) {
        f.tokens[i] = (int32_t)((uint64_t)(urand() * 1e6 + 1e6) % (uint64_t)f.cfg.vocab_size);
        f.mask[i] = 1;
        f.doc[i] = i < T ? 0 : (i < T + 9 ? 4 : 5); /* row 1: two documents, 9 + 7 tokens */
    }
    f.mask[3] = 0;
    f.mask[T + 12] = 0;
    f.batch = (trex_batch){B, T, f.tokens, f.mask, f.doc};
    f.opts = trex_model_opts_default();
    f.opts.balance_weight = 0.05; /* large enough to see its gradient */
    f.opts.indexer_weight = 0.7;

    test_bad_input(&f);
    test_packed(&f);
    test_bits(&f);
    test_head_pairs(&f);
    test_head_grads_zero(&f);
    test_weight_grads_zero(&f);
    test_grads_zero_sets_all(&f);
    test_recompute(&f);
    test_stale_arena(&f, &mem);
    /* The indexer's inputs and the attention probabilities in its loss are detached
     * (docs/model-conventions.md), so grad.* is d loss/d param only with indexer_weight 0 for the
     * rest of the model; the indexer's own tensors feed nothing but loss_indexer in dense mode. */
    trex_model_opts keep = f.opts;
    f.opts.indexer_weight = 0.0;
    test_gradients(&f, false, "dense, indexer_weight 0");
    f.opts = keep;
    test_gradients(&f, true, "dense, indexer tensors");
    f.opts.indexer_weight = 0.0;
    f.opts.sparse = true;
    test_gradients(&f, false, "sparse, indexer_weight 0");
    f.opts = keep;

    trex_model_destroy(f.m1);
    trex_model_destroy(f.m2);
    trex_weights_free(&f.w);
    trex_pool_destroy(f.p1);
    trex_pool_destroy(f.p2);
    test_no_mtp();
    return check_summary();
}
