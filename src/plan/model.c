/* src/plan/model.c — the cost description of a model (trex_plan_model): parameters, FLOPs, element-
 * wise traffic, saved activations and communication widths per block, per token.
 *
 * Three families:
 *   - DeepSeek-V4 (model_type deepseek_v4): parameters come from trex_layout_build, the layout the
 *     runtime allocates, so planner and runtime agree; FLOPs from the config shapes (MODEL_SPEC §3);
 *   - MLA + MoE (deepseek_v3, kimi_k2) and GQA + MoE (qwen3_moe) from their Hugging Face configs, for
 *     the published validation runs (docs/planner.md §Validation).
 * FLOP convention (docs/planner.md §Conventions): 2 FLOPs per multiply-add, model FLOPs = 3 x forward
 * GEMM FLOPs (forward, data gradient, weight gradient), recompute not counted, causal attention counts
 * the attended half (Megatron's num_floating_point_operations for GQA/MLA models), DeepSeek-V4 sparse
 * attention counts the entries actually attended, router and mHC mixing not counted. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trex/io.h"
#include "trex/params.h"
#include "trex/plan.h"

#define ACT 2.0 /* bytes of a BF16 activation */

/* ---- JSON helpers for Hugging Face configs (extra fields are ignored: HF configs carry many) ---- */

static trex_code hf_int(const cJSON *j, const char *label, const char *key, int64_t lo, int64_t hi,
                        int64_t *out, trex_err *err)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!it)
        return trex_err_set(err, TREX_ENOTFOUND, "%s: missing field \"%s\"", label, key);
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble))
        return trex_err_set(err, TREX_EFORMAT, "%s: field \"%s\" must be an integer", label, key);
    if (it->valuedouble < (double)lo || it->valuedouble > (double)hi)
        return trex_err_set(err, TREX_ERANGE, "%s: field \"%s\" = %g is outside [%lld, %lld]", label,
                            key, it->valuedouble, (long long)lo, (long long)hi);
    *out = (int64_t)it->valuedouble;
    return TREX_OK;
}

static trex_code hf_int_opt(const cJSON *j, const char *label, const char *key, int64_t lo, int64_t hi,
                            int64_t def, int64_t *out, trex_err *err)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!it || cJSON_IsNull(it)) {
        *out = def;
        return TREX_OK;
    }
    return hf_int(j, label, key, lo, hi, out, err);
}

static double avg_window(int64_t s, int64_t w)
{
    /* mean over queries t = 0..s-1 of min(w, t+1) */
    double sum = 0;
    for (int64_t t = 0; t < s; t++)
        sum += (double)(t + 1 < w ? t + 1 : w);
    return sum / (double)s;
}

/* mean over t of the compressed entries a query attends: min(topk, floor((t+1)/ratio)); topk <= 0
 * means no limit */
static double avg_compressed(int64_t s, int64_t ratio, int64_t topk)
{
    double sum = 0;
    for (int64_t t = 0; t < s; t++) {
        int64_t v = (t + 1) / ratio;
        sum += (double)(topk > 0 && v > topk ? topk : v);
    }
    return sum / (double)s;
}

static void finish_model(trex_plan_model *m)
{
    double total = m->p_embed + m->p_head + m->p_global_other, active = m->p_head +
                                                                       m->p_global_other;
    double mtp = 0, f = m->f_head;
    for (int64_t i = 0; i < m->n_blocks; i++) {
        const trex_plan_block *b = &m->blocks[i];
        double p = b->p_attn + b->p_mlp + b->p_expert + b->p_repl;
        double act = b->p_attn + b->p_mlp + b->p_repl +
                     (m->n_experts ? b->p_expert * (double)m->topk / (double)m->n_experts : 0);
        if (b->mtp) {
            mtp += p;
        } else {
            total += p;
            active += act;
        }
        f += b->f_model;
    }
    m->p_total = total;
    m->p_active = active;
    m->p_mtp = mtp;
    m->model_flops_per_token = 3.0 * f;
}

/* Newton–Schulz FLOPs of one iteration on an rows x cols matrix (a = min, b = max): X Xᵀ (2a²b), its
 * square (2a³), the product with X (2a²b). */
static double ns_iter_flops(double rows, double cols)
{
    double a = rows < cols ? rows : cols, b = rows < cols ? cols : rows;
    return 4.0 * a * a * b + 2.0 * a * a * a;
}

/* ---- MoE part shared by the HF families ---- */

static void moe_part(trex_plan_block *b, double h, double E, double k, double f, double fs)
{
    b->moe = true;
    b->p_expert = E * 3.0 * h * f;
    b->p_mlp += 3.0 * h * fs;
    b->p_repl += E * h + E; /* router weight, bias */
    b->p_frozen += E;       /* the aux-free balancing bias is rule-updated */
    b->f_expert = 2.0 * 3.0 * h * f * k;
    b->f_mlp += 2.0 * 3.0 * h * fs;
    b->f_router = 2.0 * h * E;
    b->f_model += b->f_expert + 2.0 * 3.0 * h * fs;
    /* router softmax/top-k, permute and unpermute of k copies, SwiGLU on k experts (+ shared) */
    b->mem_bytes += 12.0 * E + 4.0 * (k + 1) * h + 3.0 * ACT * (k * f + fs);
    /* saved: norm in/out, router logits+probs (fp32), permuted tokens, fc1 out, SwiGLU out */
    double sel = ACT * h + 8.0 * E + ACT * k * h + 2.0 * ACT * (k * f + fs);
    b->act_sel += sel;
    b->act_none += sel + ACT * h + ACT * (k * f + fs);
    b->tp_msgs += fs > 0 ? 2 : 0; /* the shared expert is tensor-parallel */
}

static void dense_part(trex_plan_block *b, double h, double F)
{
    b->p_mlp += 3.0 * h * F;
    b->f_mlp += 2.0 * 3.0 * h * F;
    b->f_model += 2.0 * 3.0 * h * F;
    b->mem_bytes += 3.0 * ACT * F;
    double sel = ACT * h + 2.0 * ACT * F;
    b->act_sel += sel;
    b->act_none += sel + ACT * h + ACT * F;
    b->tp_msgs += 2;
}

static void ns_hf(trex_plan_block *b, double h, double E, double f, double fs, double F,
                  int64_t iters)
{
    double it = (double)iters;
    if (b->moe) {
        b->ns_flops_expert = it * E * (2.0 * ns_iter_flops(f, h) + ns_iter_flops(h, f));
        if (fs > 0)
            b->ns_flops_dense += it * (2.0 * ns_iter_flops(fs, h) + ns_iter_flops(h, fs));
        b->ns_flops_dense += it * ns_iter_flops(E, h);
    } else {
        b->ns_flops_dense += it * (2.0 * ns_iter_flops(F, h) + ns_iter_flops(h, F));
    }
}

/* Qwen3-MoE: GQA with q/k RMSNorm, all layers MoE (decoder_sparse_step 1), no shared expert. */
static trex_code build_qwen3(trex_plan_model *m, const cJSON *j, const char *label, trex_err *err)
{
    int64_t h, L, a, g, d, E, k, f, V, F, step;
    TREX_TRY(hf_int(j, label, "hidden_size", 1, 1 << 20, &h, err));
    TREX_TRY(hf_int(j, label, "num_hidden_layers", 1, TREX_MAX_LAYERS, &L, err));
    TREX_TRY(hf_int(j, label, "num_attention_heads", 1, 1 << 14, &a, err));
    TREX_TRY(hf_int(j, label, "num_key_value_heads", 1, 1 << 14, &g, err));
    TREX_TRY(hf_int_opt(j, label, "head_dim", 1, 1 << 14, h / a, &d, err));
    TREX_TRY(hf_int(j, label, "num_experts", 1, 1 << 16, &E, err));
    TREX_TRY(hf_int(j, label, "num_experts_per_tok", 1, 1 << 10, &k, err));
    TREX_TRY(hf_int(j, label, "moe_intermediate_size", 1, 1 << 20, &f, err));
    TREX_TRY(hf_int(j, label, "intermediate_size", 1, 1 << 22, &F, err));
    TREX_TRY(hf_int(j, label, "vocab_size", 1, 1 << 24, &V, err));
    TREX_TRY(hf_int_opt(j, label, "decoder_sparse_step", 1, 1 << 10, 1, &step, err));
    if (a % g)
        return trex_err_set(err, TREX_EINVAL,
                            "%s: num_attention_heads (%lld) must be a multiple of num_key_value_heads "
                            "(%lld)", label, (long long)a, (long long)g);
    const cJSON *mlp_only = cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers");
    m->hidden = h, m->vocab = V, m->n_layers = L, m->n_mtp = 0, m->n_blocks = L;
    m->n_experts = E, m->topk = k, m->moe_ffn = f, m->hc_mult = 1;
    double H = (double)h, s = (double)m->seq;
    for (int64_t i = 0; i < L; i++) {
        trex_plan_block *b = &m->blocks[i];
        memset(b, 0, sizeof *b);
        b->attn = TREX_PLAN_ATTN_GQA;
        double qd = (double)(a * d), kvd = (double)(g * d);
        b->p_attn = H * qd + 2.0 * H * kvd + qd * H;
        b->p_repl = 2.0 * H + 2.0 * (double)d; /* two RMSNorms, q_norm, k_norm */
        b->p_adam = b->p_repl;
        b->f_attn = 2.0 * b->p_attn;
        b->f_core = 2.0 * qd * s; /* QK and PV over the causal half: 2 x s/2 x a·d MACs */
        b->f_model = b->f_attn + b->f_core;
        b->mem_bytes = 20.0 * H + 4.0 * ACT * (qd + 2.0 * kvd);
        double sel = ACT * H + ACT * (qd + 2.0 * kvd) + ACT * qd + 4.0 * (double)a;
        b->act_sel = sel;
        b->act_none = sel + ACT * H;
        b->act_in = ACT * H;
        b->tp_msgs = 2;
        b->kv_width = 2.0 * kvd;
        bool dense = (i + 1) % step != 0;
        if (cJSON_IsArray(mlp_only)) {
            const cJSON *x;
            cJSON_ArrayForEach(x, mlp_only) if (cJSON_IsNumber(x) && x->valueint == i) dense = true;
        }
        if (dense)
            dense_part(b, H, (double)F);
        else
            moe_part(b, H, (double)E, (double)k, (double)f, 0);
    }
    m->p_embed = (double)V * H;
    m->p_head = (double)V * H;
    m->p_global_other = H;
    m->f_head = 2.0 * H * (double)V;
    return TREX_OK;
}

/* DeepSeek-V3 / Kimi K2: MLA, first_k_dense_replace dense layers, shared expert, optional MTP. */
static trex_code build_mla(trex_plan_model *m, const cJSON *j, const char *label, trex_err *err)
{
    int64_t h, L, a, ql, kl, dn, dr, dv, E, k, f, ns, V, F, kd, mtp;
    TREX_TRY(hf_int(j, label, "hidden_size", 1, 1 << 20, &h, err));
    TREX_TRY(hf_int(j, label, "num_hidden_layers", 1, TREX_MAX_LAYERS - 4, &L, err));
    TREX_TRY(hf_int(j, label, "num_attention_heads", 1, 1 << 14, &a, err));
    TREX_TRY(hf_int(j, label, "q_lora_rank", 1, 1 << 20, &ql, err));
    TREX_TRY(hf_int(j, label, "kv_lora_rank", 1, 1 << 20, &kl, err));
    TREX_TRY(hf_int(j, label, "qk_nope_head_dim", 1, 1 << 14, &dn, err));
    TREX_TRY(hf_int(j, label, "qk_rope_head_dim", 0, 1 << 14, &dr, err));
    TREX_TRY(hf_int(j, label, "v_head_dim", 1, 1 << 14, &dv, err));
    TREX_TRY(hf_int(j, label, "n_routed_experts", 1, 1 << 16, &E, err));
    TREX_TRY(hf_int(j, label, "num_experts_per_tok", 1, 1 << 10, &k, err));
    TREX_TRY(hf_int(j, label, "moe_intermediate_size", 1, 1 << 20, &f, err));
    TREX_TRY(hf_int_opt(j, label, "n_shared_experts", 0, 64, 0, &ns, err));
    TREX_TRY(hf_int(j, label, "vocab_size", 1, 1 << 24, &V, err));
    TREX_TRY(hf_int(j, label, "intermediate_size", 1, 1 << 22, &F, err));
    TREX_TRY(hf_int_opt(j, label, "first_k_dense_replace", 0, 1 << 10, 0, &kd, err));
    TREX_TRY(hf_int_opt(j, label, "num_nextn_predict_layers", 0, 4, 0, &mtp, err));
    m->hidden = h, m->vocab = V, m->n_layers = L, m->n_mtp = mtp, m->n_blocks = L + mtp;
    m->n_experts = E, m->topk = k, m->moe_ffn = f, m->hc_mult = 1;
    double H = (double)h, s = (double)m->seq, A = (double)a;
    double QL = (double)ql, KL = (double)kl, DN = (double)dn, DR = (double)dr, DV = (double)dv;
    for (int64_t i = 0; i < L + mtp; i++) {
        trex_plan_block *b = &m->blocks[i];
        memset(b, 0, sizeof *b);
        b->attn = TREX_PLAN_ATTN_MLA;
        b->mtp = i >= L;
        double qh = A * (DN + DR);
        b->p_attn = H * QL + QL * qh + H * (KL + DR) + KL * A * (DN + DV) + A * DV * H;
        b->p_repl = 2.0 * H + QL + KL;
        b->f_attn = 2.0 * b->p_attn;
        b->f_core = s * A * (DN + DR + DV); /* 2 FLOPs x s/2 x a(dn+dr) + 2 x s/2 x a·dv */
        /* Megatron counts the two latent norms as one extra column each */
        b->f_model = b->f_attn + 2.0 * (QL + KL) + b->f_core;
        b->mem_bytes = 20.0 * H + 4.0 * ACT * (QL + KL) + 4.0 * ACT * (2.0 * qh + A * DV);
        /* selective recompute also recomputes the MLA up-projections (DeepSeek-V3 report §3.3;
         * Megatron --recompute-modules mla_up_proj) */
        double sel = ACT * H + ACT * (QL + KL + DR) + ACT * A * DV + 4.0 * A;
        b->act_sel = sel;
        b->act_none = sel + ACT * H + ACT * (QL + KL) + ACT * (2.0 * qh + A * DV);
        b->act_in = ACT * H;
        b->tp_msgs = 2;
        b->kv_width = qh + A * DV;
        if (b->mtp) { /* enorm, hnorm, eh_proj [h, 2h], shared head norm */
            b->p_mlp += 2.0 * H * H;
            b->p_repl += 3.0 * H;
            b->f_mlp += 4.0 * H * H;
            b->f_model += 2.0 * (2.0 * H * H + 3.0 * H);
        }
        if (i < kd)
            dense_part(b, H, (double)F);
        else
            moe_part(b, H, (double)E, (double)k, (double)f, (double)(ns * f));
        b->p_adam = 2.0 * H + QL + KL + (b->mtp ? 3.0 * H : 0);
    }
    m->p_embed = (double)V * H;
    m->p_head = (double)V * H;
    m->p_global_other = H;
    m->f_head = 2.0 * H * (double)V * (double)(1 + mtp);
    return TREX_OK;
}

/* Muon Newton–Schulz FLOPs for the HF families (every 2-D matrix except embedding and head). */
/* per Newton–Schulz iteration */
static void ns_hf_all(trex_plan_model *m, const cJSON *j, int64_t iters)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, "intermediate_size");
    double F = cJSON_IsNumber(it) ? it->valuedouble : 0, H = (double)m->hidden;
    const cJSON *ns = cJSON_GetObjectItemCaseSensitive(j, "n_shared_experts");
    double fs = cJSON_IsNumber(ns) ? ns->valuedouble * (double)m->moe_ffn : 0;
    for (int64_t i = 0; i < m->n_blocks; i++) {
        trex_plan_block *b = &m->blocks[i];
        b->ns_flops_dense = 0;
        b->ns_flops_expert = 0;
        ns_hf(b, H, (double)m->n_experts, (double)m->moe_ffn, fs, F, iters);
        /* attention: approximate as one square-ish matrix per projection of equal size */
        double n = b->p_attn / H;
        b->ns_flops_dense += (double)iters * ns_iter_flops(H, n);
    }
}

/* ---- DeepSeek-V4 ---- */

static trex_code build_v4(trex_plan_model *m, const trex_config *c, trex_err *err)
{
    trex_layout lay;
    TREX_TRY(trex_layout_build(&lay, c, err));
    int64_t L = c->num_hidden_layers, nb = trex_config_n_blocks(c);
    m->hidden = c->hidden_size, m->vocab = c->vocab_size, m->n_layers = L;
    m->n_mtp = c->num_nextn_predict_layers, m->n_blocks = nb;
    m->n_experts = c->n_routed_experts, m->topk = c->num_experts_per_tok;
    m->moe_ffn = c->moe_intermediate_size, m->hc_mult = c->hc_mult;
    for (int64_t i = 0; i < nb; i++)
        memset(&m->blocks[i], 0, sizeof m->blocks[i]);
    /* parameters, optimizer split and Newton–Schulz work from the layout (MODEL_SPEC §9) */
    for (int64_t i = 0; i < lay.count; i++) {
        const trex_param *p = &lay.params[i];
        double n = (double)p->numel;
        bool adam = p->kind == TREX_P_EMBED || p->kind == TREX_P_HEAD || p->kind == TREX_P_NORM ||
                    p->kind == TREX_P_HC_BASE || p->kind == TREX_P_HC_SCALE ||
                    p->kind == TREX_P_ATTN_SINK || p->kind == TREX_P_APE;
        bool frozen = !p->trainable;
        double ns = 0;
        if (!adam && !frozen && p->ndim == 2) {
            double rows = (double)p->shape[0], cols = (double)p->shape[1];
            if (strstr(p->name, "wo_a")) /* G independent matrices (MODEL_SPEC §3.8) */
                ns = (double)c->o_groups * ns_iter_flops(rows / (double)c->o_groups, cols);
            else
                ns = ns_iter_flops(rows, cols);
        }
        if (p->layer < 0) {
            if (p->kind == TREX_P_EMBED)
                m->p_embed += n;
            else if (p->kind == TREX_P_HEAD)
                m->p_head += n;
            else
                m->p_global_other += n;
            continue;
        }
        TREX_ASSERT(p->layer < nb);
        trex_plan_block *b = &m->blocks[p->layer];
        switch (p->kind) {
        case TREX_P_ATTN:
        case TREX_P_COMPRESSOR:
        case TREX_P_INDEXER:
            b->p_attn += n;
            b->ns_flops_dense += ns;
            break;
        case TREX_P_EXPERT:
            b->p_expert += n;
            b->ns_flops_expert += ns;
            break;
        case TREX_P_SHARED_EXPERT:
        case TREX_P_MTP_PROJ:
            b->p_mlp += n;
            b->ns_flops_dense += ns;
            break;
        default: /* norms, hc_*, sink, ape, gate, gate bias, hash table */
            b->p_repl += n;
            b->ns_flops_dense += ns;
            if (adam)
                b->p_adam += n;
            if (frozen)
                b->p_frozen += n;
            break;
        }
    }
    trex_layout_free(&lay);

    double d = (double)c->hidden_size, H = (double)c->num_attention_heads, hd = (double)c->head_dim;
    double dc = (double)c->q_lora_rank, G = (double)c->o_groups, dg = (double)c->o_lora_rank;
    double nI = (double)c->index_n_heads, cI = (double)c->index_head_dim, E = (double)c->n_routed_experts;
    double k = (double)c->num_experts_per_tok, f = (double)c->moe_intermediate_size;
    double nhc = (double)c->hc_mult;
    int64_t s = m->seq;
    double win = avg_window(s, c->sliding_window);
    for (int64_t i = 0; i < nb; i++) {
        trex_plan_block *b = &m->blocks[i];
        int r = trex_config_ratio(c, i);
        b->mtp = i >= L;
        b->attn = r == 0 ? TREX_PLAN_ATTN_SWA : r == 4 ? TREX_PLAN_ATTN_CSA : TREX_PLAN_ATTN_HCA;
        double proj = d * dc + dc * H * hd + d * hd + dg * H * hd + G * dg * d;
        double comp = r > 0 ? 2.0 * (r == 4 ? 2.0 : 1.0) * hd * d : 0;
        double idx = r == 4 ? dc * nI * cI + d * nI + 2.0 * (2.0 * cI) * d : 0;
        b->f_attn = 2.0 * (proj + comp + idx);
        double entries = win + (r > 0 ? avg_compressed(s, r, r == 4 ? c->index_topk : 0) : 0);
        b->f_core = 2.0 * H * 2.0 * hd * entries; /* QK and PV over the attended entries */
        if (r == 4) /* indexer scoring over every visible compressed entry */
            b->f_core += 2.0 * nI * cI * avg_compressed(s, 4, 0);
        b->f_expert = 2.0 * 3.0 * d * f * k;
        b->f_mlp = 2.0 * 3.0 * d * f; /* shared expert */
        if (b->mtp)
            b->f_mlp += 2.0 * (1.0 + nhc) * d * d; /* e_proj once, h_proj per stream */
        b->f_router = 2.0 * d * E + 2.0 * 2.0 * (nhc * d) * (nhc * nhc + 2.0 * nhc); /* + mHC maps */
        b->f_model = b->f_attn + b->f_core + b->f_mlp + b->f_expert;
        b->moe = true;
        /* element-wise traffic: mHC pre/post per sub-layer (~14 h-wide passes), norms, head norm of
         * q, compressor softmax (fp32), indexer scores and top-k, MoE permute/SwiGLU */
        b->mem_bytes = 2.0 * 14.0 * ACT * d + 8.0 * d + 4.0 * ACT * H * hd + 4.0 * ACT * hd +
                       (r > 0 ? 4.0 * 2.0 * (r == 4 ? 2.0 : 1.0) * hd * 2.0 : 0) +
                       (r == 4 ? 2.0 * 4.0 * avg_compressed(s, 4, 0) + 8.0 * 4.0 * cI : 0) +
                       12.0 * E + 4.0 * (k + 1) * d + 3.0 * ACT * (k * f + f);
        /* saved for backward */
        double attn_sel = nhc * d * ACT + ACT * d + 2.0 * ACT * dc + ACT * H * hd + ACT * hd +
                          ACT * H * hd + ACT * G * dg + 4.0 * H +
                          (r > 0 ? ACT * hd / (double)r + 4.0 * 2.0 * (r == 4 ? 2.0 : 1.0) * hd : 0) +
                          (r == 4 ? ACT * nI * cI + ACT * nI + 4.0 * (double)c->index_topk : 0);
        double attn_none = attn_sel + ACT * d + ACT * H * hd;
        double moe_sel = nhc * d * ACT + ACT * d + 8.0 * E + ACT * k * d + 2.0 * ACT * (k * f + f);
        double moe_none = moe_sel + ACT * d + ACT * (k * f + f);
        b->act_sel = attn_sel + moe_sel;
        b->act_none = attn_none + moe_none;
        b->act_in = nhc * d * ACT;
        b->tp_msgs = 4; /* attention AG/RS and shared-expert AG/RS */
        b->kv_width = hd;
    }
    m->f_head = 2.0 * d * (double)c->vocab_size * (double)(1 + c->num_nextn_predict_layers);
    return TREX_OK;
}

trex_code trex_plan_model_from_config(trex_plan_model *m, const trex_config *cfg, int64_t seq,
                                      trex_err *err)
{
    memset(m, 0, sizeof *m);
    if (seq < 1)
        return trex_err_set(err, TREX_EINVAL, "--seq must be at least 1 (got %lld)", (long long)seq);
    m->seq = seq;
    snprintf(m->name, sizeof m->name, "%s", cfg->name[0] ? cfg->name : "deepseek-v4");
    snprintf(m->family, sizeof m->family, "deepseek_v4");
    TREX_TRY(build_v4(m, cfg, err));
    m->ns_iters = 10; /* hybrid Newton–Schulz, MODEL_SPEC §9 */
    m->has_cfg = true;
    m->cfg = *cfg;
    finish_model(m);
    return TREX_OK;
}

trex_code trex_plan_model_from_json(trex_plan_model *m, const cJSON *json, const char *label,
                                    int64_t seq, trex_err *err)
{
    memset(m, 0, sizeof *m);
    if (seq < 1)
        return trex_err_set(err, TREX_EINVAL, "--seq must be at least 1 (got %lld)", (long long)seq);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(json, "model_type");
    if (!cJSON_IsString(mt))
        return trex_err_set(err, TREX_ENOTFOUND,
                            "%s: missing string field \"model_type\" (deepseek_v4, deepseek_v3, "
                            "kimi_k2 or qwen3_moe)", label);
    const char *type = mt->valuestring;
    if (!strcmp(type, "deepseek_v4")) {
        trex_config *cfg = calloc(1, sizeof *cfg);
        if (!cfg)
            return trex_err_set(err, TREX_ENOMEM, "out of memory");
        trex_code rc = trex_config_from_json(cfg, json, label, err);
        if (rc == TREX_OK) {
            const char *base = strrchr(label, '/');
            base = base ? base + 1 : label;
            if (!cfg->name[0])
                snprintf(cfg->name, sizeof cfg->name, "%.*s", (int)strcspn(base, "."), base);
            rc = trex_plan_model_from_config(m, cfg, seq, err);
        }
        free(cfg);
        return rc;
    }
    m->seq = seq;
    snprintf(m->family, sizeof m->family, "%s", type);
    const char *base = strrchr(label, '/');
    base = base ? base + 1 : label;
    snprintf(m->name, sizeof m->name, "%.*s", (int)strcspn(base, "."), base);
    if (!strcmp(type, "qwen3_moe")) {
        TREX_TRY(build_qwen3(m, json, label, err));
        ns_hf_all(m, json, 1);
        m->ns_iters = 5;
    } else if (!strcmp(type, "deepseek_v3") || !strcmp(type, "kimi_k2")) {
        TREX_TRY(build_mla(m, json, label, err));
        ns_hf_all(m, json, 1);
        m->ns_iters = 5;
    } else {
        return trex_err_set(err, TREX_EUNSUPPORTED,
                            "%s: model_type \"%s\" is not modelled by the planner (use deepseek_v4, "
                            "deepseek_v3, kimi_k2 or qwen3_moe)", label, type);
    }
    finish_model(m);
    return TREX_OK;
}

trex_code trex_plan_model_load(trex_plan_model *m, const char *path, int64_t seq, trex_err *err)
{
    cJSON *json = NULL;
    TREX_TRY(trex_json_load(path, &json, err));
    trex_code rc = trex_plan_model_from_json(m, json, path, seq, err);
    cJSON_Delete(json);
    return rc;
}
