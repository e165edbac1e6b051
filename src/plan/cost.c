/* src/plan/cost.c — evaluation of one layout: memory per device, step time, MFU.
 *
 * The model (docs/planner.md §Cost model):
 *   - blocks are split into pipeline chunks (even, or with given first/last chunk sizes) and chunks
 *     mapped to pipeline ranks by the schedule;
 *   - per rank and micro-batch, forward and backward times are sums over its blocks of GEMM time
 *     (FLOPs / achieved peak), attention-core time, element-wise time (bytes / achieved HBM
 *     bandwidth), a per-block host overhead, and exposed communication (TP, CP, EP all-to-all);
 *   - the step is m micro-batches of the slowest rank plus the schedule's bubble, exposed PP
 *     point-to-point, the exposed DP gradient/parameter traffic, the optimizer step and the
 *     optimizer-state swap;
 *   - memory per device is weights + gradients + optimizer state (by optimizer and ZeRO stage) +
 *     activations (by recompute policy x micro-batches in flight) + head workspace + communication
 *     buffers + the cluster's reserved bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trex/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

void trex_plan_layout_unset(trex_plan_layout *l)
{
    l->tp = l->pp = l->vpp = l->ep = l->cp = l->dp = -1;
    l->zero = l->recompute = l->swap_optimizer = l->mbs = -1;
    l->schedule = l->a2a_overlap = l->dedup = -1;
    l->first = l->last = -1;
}

void trex_plan_run_defaults(trex_plan_run *r)
{
    memset(r, 0, sizeof *r);
    r->seq = 4096;
    r->optimizer = TREX_OPT_ADAMW;
    r->weight_bytes = 2;
    r->grad_bytes = 4;
    r->state_bytes = 4;
    r->act_bytes = 2;
    r->imbalance = 1.0;
}

const char *trex_plan_mem_name(int region)
{
    static const char *const names[TREX_MEM_COUNT] = {
        "weights", "gradients", "optimizer", "activations", "head", "comm_buffers", "reserved"};
    TREX_ASSERT(region >= 0 && region < TREX_MEM_COUNT);
    return names[region];
}

/* ---- stage assignment ---- */

typedef struct stage_map {
    int64_t n_chunks;
    int64_t chunk_first[2 * TREX_PLAN_MAX_STAGES * 8 + 1]; /* first block of each chunk */
    int64_t chunk_rank[2 * TREX_PLAN_MAX_STAGES * 8];
} stage_map;

static int64_t chunks_per_rank(const trex_plan_layout *l)
{
    if (l->schedule == TREX_SCHED_DUALPIPEV)
        return 2;
    if (l->schedule == TREX_SCHED_INTERLEAVED)
        return l->vpp;
    return 1;
}

/* Splits the main layers over chunks; MTP blocks go to the last chunk. */
static trex_code map_stages(const trex_plan_model *m, const trex_plan_layout *l, stage_map *sm,
                            trex_err *err)
{
    int64_t v = chunks_per_rank(l), n = l->pp * v, L = m->n_layers;
    if (n > (int64_t)(sizeof sm->chunk_rank / sizeof sm->chunk_rank[0]))
        return trex_err_set(err, TREX_EINVAL, "layout: pp x chunks per rank = %lld is too many",
                            (long long)n);
    if (n > L + 2)
        return trex_err_set(err, TREX_EINVAL,
                            "layout: %lld pipeline chunks (pp=%lld x %lld) for %lld layers: use a "
                            "smaller pp or vpp", (long long)n, (long long)l->pp, (long long)v,
                            (long long)L);
    int64_t counts[2 * TREX_PLAN_MAX_STAGES * 8];
    int64_t first = l->first, last = l->last, rest = L, lo = 0, hi = n;
    if (n == 1 && (first >= 0 || last >= 0))
        return trex_err_set(err, TREX_EINVAL, "layout: first/last need pp x vpp > 1");
    if (first >= 0) {
        counts[0] = first, rest -= first, lo = 1;
    }
    if (last >= 0) {
        counts[n - 1] = last, rest -= last, hi = n - 1;
    }
    if (rest < 0 || (hi <= lo && rest != 0))
        return trex_err_set(err, TREX_EINVAL,
                            "layout: first=%lld last=%lld leave %lld layers for %lld middle chunks",
                            (long long)first, (long long)last, (long long)rest, (long long)(hi - lo));
    for (int64_t c = lo; c < hi; c++) {
        int64_t k = hi - lo, i = c - lo;
        /* remainder goes to the middle chunks, away from the embedding and the head */
        int64_t base = rest / k, rem = rest % k;
        int64_t start = (k - rem) / 2;
        counts[c] = base + (i >= start && i < start + rem ? 1 : 0);
    }
    sm->n_chunks = n;
    int64_t b = 0;
    for (int64_t c = 0; c < n; c++) {
        sm->chunk_first[c] = b;
        b += counts[c];
        if (l->schedule == TREX_SCHED_DUALPIPEV)
            sm->chunk_rank[c] = c < l->pp ? c : 2 * l->pp - 1 - c;
        else
            sm->chunk_rank[c] = c % l->pp;
    }
    TREX_ASSERT(b == L);
    sm->chunk_first[n] = m->n_blocks; /* the last chunk also takes the MTP blocks */
    return TREX_OK;
}

/* ---- per-block costs ---- */

typedef struct ctx {
    const trex_plan_model *m;
    const trex_cluster *cl;
    const trex_plan_run *run;
    const trex_plan_layout *l;
    int64_t N, m_mb, edp;
    double tok;          /* tokens per micro-batch per CP rank */
    double act_scale;    /* run act bytes / 2 */
    double p_lin, p_bf16;
} ctx;

typedef struct cost {
    double fwd, bwd, recompute;   /* compute only */
    double overhead;              /* host overhead (inside fwd/bwd/recompute) */
    double comm_fwd, comm_bwd;    /* exposed TP + CP communication */
    double cp;                    /* of which CP */
    double a2a;                   /* all-to-all, forward + backward (+ recompute), un-hidden */
    double a2a_up, a2a_out;       /* split of a2a by fabric */
    double act;                   /* activation bytes kept per micro-batch */
    double act_peak;              /* extra transient bytes while recomputing one block */
    double p_dense, p_expert;     /* parameter elements on the device */
    double p_adam_dense;          /* of p_dense, AdamW under Muon */
    double ns_dense, ns_expert;   /* Newton–Schulz FLOPs per iteration, whole matrices */
    double model_flops;           /* model FLOPs of this rank's blocks per micro-batch (all TP) */
} cost;

static double link_bw(const trex_cluster *cl, int64_t group, int64_t stride)
{
    return group * stride <= cl->scaleup_domain ? cl->scaleup_bw_gbs * 1e9 : cl->scaleout_bw_gbs * 1e9;
}

/* Two-level ring collective (all-gather or reduce-scatter) of `bytes` (the full, unsharded size)
 * over a group of n members spaced `stride` devices apart. */
static double collective_time(const trex_cluster *cl, double bytes, int64_t n, int64_t stride)
{
    if (n <= 1 || bytes <= 0)
        return 0;
    int64_t local = cl->scaleup_domain / stride;
    if (local < 1)
        local = 1;
    if (local > n)
        local = n;
    double e = cl->eff.collective, t = 0;
    double up = cl->scaleup_bw_gbs * 1e9 * e, out = cl->scaleout_bw_gbs * 1e9 * e;
    t += (double)(local - 1) / (double)local * bytes / up + (double)(local - 1) * cl->scaleup_latency_us * 1e-6;
    int64_t groups = n / local;
    if (groups > 1)
        t += (double)(groups - 1) / (double)groups * (bytes / (double)local) / out +
             (double)(groups - 1) * cl->scaleout_latency_us * 1e-6;
    return t;
}

static void block_cost(const ctx *c, const trex_plan_block *b, cost *o)
{
    const trex_plan_layout *l = c->l;
    const trex_cluster *cl = c->cl;
    const trex_plan_model *m = c->m;
    double tp = (double)l->tp, tok = c->tok, imb = c->run->imbalance;
    double h = (double)m->hidden;
    double t_lin = tok / tp * (b->f_attn + b->f_mlp) / c->p_lin;
    double rows = tok / tp * (double)m->topk * (double)l->ep / (double)(m->n_experts ? m->n_experts : 1);
    double sat = rows / (rows + cl->eff.gemm_half_rows);
    double t_exp = b->moe ? tok / tp * b->f_expert * imb /
                                (c->p_lin * cl->eff.grouped_gemm / cl->eff.gemm * sat) : 0;
    double t_core = tok / tp * b->f_core / (c->p_bf16 * cl->eff.attention);
    double t_router = tok / tp * b->f_router / (c->p_bf16 * cl->eff.gemm);
    double t_mem = tok / tp * b->mem_bytes * c->act_scale / (cl->hbm_bw_gbs * 1e9 * cl->eff.memory);
    double ovh = cl->eff.layer_overhead_us * 1e-6;
    double fwd = t_lin + t_exp + t_core + t_router + t_mem + ovh;
    double bwd = 2.0 * (t_lin + t_exp + t_router + t_mem + ovh) + 2.5 * t_core;
    /* TP: all-gather / reduce-scatter of h-wide activations (sequence parallel) */
    double t_tp = 0;
    if (l->tp > 1) {
        double bytes = tok * h * 2.0 * c->act_scale;
        t_tp = b->tp_msgs * collective_time(cl, bytes, l->tp, 1);
    }
    /* CP: K/V of the other CP ranks, overlapped with the attention core */
    double t_cp_f = 0, t_cp_b = 0;
    if (l->cp > 1) {
        double bytes = (double)(l->cp - 1) * tok * b->kv_width * 2.0 * c->act_scale / tp;
        double bw = link_bw(cl, l->cp, l->tp) * cl->eff.collective;
        double t = bytes / bw;
        t_cp_f = fmax(0, t - cl->eff.overlap * t_core);
        t_cp_b = fmax(0, 2.0 * t - cl->eff.overlap * 2.5 * t_core);
    }
    /* EP all-to-all: dispatch + combine of k copies per token */
    double a2a = 0, a2a_up = 0, a2a_out = 0;
    if (b->moe && l->ep > 1) {
        double ep = (double)l->ep, k = (double)m->topk;
        double g = (double)(l->ep < cl->scaleup_domain ? l->ep : cl->scaleup_domain);
        double nd = ceil(ep / g); /* scale-up domains spanned */
        double in_copies = k * (g - 1.0) / ep, out_copies;
        if (l->dedup && nd > 1) {
            out_copies = (nd - 1.0) * (1.0 - pow(1.0 - 1.0 / nd, k));
            in_copies += k * (1.0 - g / ep); /* forwarded inside the destination domain */
        } else {
            out_copies = k * (1.0 - g / ep);
        }
        double disp = c->run->fp8 ? 1.03 : 2.0, comb = 2.0;
        double toks = tok / tp * imb;
        double up_bw = cl->scaleup_bw_gbs * 1e9 * cl->eff.a2a_scaleup;
        double out_bw = cl->scaleout_bw_gbs * 1e9 * cl->eff.a2a_scaleout;
        double lat = (nd > 1 ? cl->scaleout_latency_us : cl->scaleup_latency_us) * 1e-6;
        double per_dir[2] = {disp, comb};
        for (int d = 0; d < 2; d++) {
            double up = toks * in_copies * h * per_dir[d] / up_bw;
            double out = toks * out_copies * h * per_dir[d] / out_bw;
            a2a += fmax(up, out) + 2.0 * lat;
            a2a_up += up;
            a2a_out += out;
        }
        /* backward: the same volume in the other direction (BF16 both ways) */
        double fwd_a2a = a2a;
        a2a += fwd_a2a * (c->run->fp8 ? 4.0 / 3.03 : 1.0);
        a2a_up *= 2.0, a2a_out *= 2.0;
        if (l->recompute == TREX_RECOMPUTE_FULL) {
            a2a += fwd_a2a;
            a2a_up *= 1.5, a2a_out *= 1.5;
        }
    }
    double rec = 0;
    if (l->recompute == TREX_RECOMPUTE_SELECTIVE)
        rec = 0.4 * t_mem;
    else if (l->recompute == TREX_RECOMPUTE_FULL)
        rec = fwd + t_tp + t_cp_f;
    o->fwd += fwd;
    o->bwd += bwd;
    o->recompute += rec;
    o->overhead += 3.0 * ovh + (l->recompute == TREX_RECOMPUTE_FULL ? ovh : 0);
    o->comm_fwd += t_tp + t_cp_f;
    o->comm_bwd += t_tp + t_cp_b;
    o->cp += t_cp_f + t_cp_b;
    o->a2a += a2a;
    o->a2a_up += a2a_up;
    o->a2a_out += a2a_out;
    double per_tok = l->recompute == TREX_RECOMPUTE_FULL  ? b->act_in
                     : l->recompute == TREX_RECOMPUTE_NONE ? b->act_none
                                                           : b->act_sel;
    o->act += tok / tp * per_tok * c->act_scale;
    double full = tok / tp * b->act_none * c->act_scale;
    if (l->recompute == TREX_RECOMPUTE_FULL && full > o->act_peak)
        o->act_peak = full;
    o->p_dense += (b->p_attn + b->p_mlp) / tp + b->p_repl;
    o->p_adam_dense += b->p_adam;
    o->p_expert += b->p_expert / (double)l->ep;
    o->ns_dense += b->ns_flops_dense;
    o->ns_expert += b->ns_flops_expert;
    o->model_flops += c->tok * 3.0 * b->f_model;
}

/* ---- validation of a resolved layout ---- */

static trex_code check_layout(const trex_plan_model *m, const trex_cluster *cl,
                              const trex_plan_run *run, const trex_plan_layout *l, trex_err *err)
{
    (void)cl;
    const char *names[] = {"tp", "pp", "vpp", "ep", "cp", "mbs"};
    const int64_t vals[] = {l->tp, l->pp, l->vpp, l->ep, l->cp, l->mbs};
    for (int i = 0; i < 6; i++)
        if (vals[i] < 1)
            return trex_err_set(err, TREX_EINVAL, "layout: %s must be at least 1 (got %lld)",
                                names[i], (long long)vals[i]);
    if (l->zero < 0 || l->zero > 3)
        return trex_err_set(err, TREX_EINVAL, "layout: zero must be 0, 1, 2 or 3");
    if (l->recompute < 0 || l->recompute > TREX_RECOMPUTE_ATTENTION_KEEP_CORE)
        return trex_err_set(err, TREX_EINVAL,
                            "layout: recompute must be none, selective or full (or, on the fp32_ref "
                            "engine, attention, moe, full-keep-core or attention-keep-core)");
    if (run->devices < 1)
        return trex_err_set(err, TREX_EINVAL, "--devices must be at least 1");
    int64_t mp = l->tp * l->pp * l->cp;
    if (run->devices % mp)
        return trex_err_set(err, TREX_EINVAL,
                            "--devices %lld is not divisible by tp x pp x cp = %lld x %lld x %lld = "
                            "%lld: change the device count or the layout",
                            (long long)run->devices, (long long)l->tp, (long long)l->pp,
                            (long long)l->cp, (long long)mp);
    int64_t dp = run->devices / mp;
    if (l->dp >= 0 && l->dp != dp)
        return trex_err_set(err, TREX_EINVAL,
                            "layout: dp=%lld but devices / (tp x pp x cp) = %lld", (long long)l->dp,
                            (long long)dp);
    if ((l->tp * l->cp * dp) % l->ep)
        return trex_err_set(err, TREX_EINVAL,
                            "layout: ep=%lld must divide the devices of one pipeline stage "
                            "(tp x cp x dp = %lld)", (long long)l->ep,
                            (long long)(l->tp * l->cp * dp));
    if (m->n_experts && m->n_experts % l->ep)
        return trex_err_set(err, TREX_EINVAL, "layout: ep=%lld does not divide the %lld experts",
                            (long long)l->ep, (long long)m->n_experts);
    if (!m->n_experts && l->ep != 1)
        return trex_err_set(err, TREX_EINVAL, "layout: ep must be 1 for a dense model");
    if (run->gbs < 1)
        return trex_err_set(err, TREX_EINVAL, "--gbs must be at least 1");
    if (run->gbs % (dp * l->mbs))
        return trex_err_set(err, TREX_EINVAL,
                            "--gbs %lld is not divisible by dp x mbs = %lld x %lld",
                            (long long)run->gbs, (long long)dp, (long long)l->mbs);
    if (run->seq % l->cp)
        return trex_err_set(err, TREX_EINVAL, "--seq %lld is not divisible by cp=%lld",
                            (long long)run->seq, (long long)l->cp);
    if (l->pp > TREX_PLAN_MAX_STAGES)
        return trex_err_set(err, TREX_EINVAL, "layout: pp=%lld is above %d", (long long)l->pp,
                            TREX_PLAN_MAX_STAGES);
    int64_t mb = run->gbs / (dp * l->mbs);
    switch (l->schedule) {
    case TREX_SCHED_1F1B:
        if (l->vpp != 1)
            return trex_err_set(err, TREX_EINVAL, "layout: schedule=1f1b needs vpp=1");
        break;
    case TREX_SCHED_INTERLEAVED:
        if (l->vpp < 2 || l->pp < 2)
            return trex_err_set(err, TREX_EINVAL,
                                "layout: schedule=interleaved needs pp >= 2 and vpp >= 2");
        if (mb < l->pp)
            return trex_err_set(err, TREX_EINVAL,
                                "layout: interleaved needs at least pp=%lld micro-batches (have "
                                "%lld)", (long long)l->pp, (long long)mb);
        break;
    case TREX_SCHED_DUALPIPE:
        if (l->pp < 2 || l->pp % 2 || l->vpp != 1)
            return trex_err_set(err, TREX_EINVAL, "layout: dualpipe needs an even pp >= 2, vpp=1");
        if (mb < l->pp)
            return trex_err_set(err, TREX_EINVAL, "layout: dualpipe needs at least pp micro-batches");
        break;
    case TREX_SCHED_DUALPIPEV:
        if (l->pp < 2 || l->vpp != 2)
            return trex_err_set(err, TREX_EINVAL, "layout: dualpipev needs pp >= 2 (vpp is 2)");
        if (mb < 2 * l->pp)
            return trex_err_set(err, TREX_EINVAL,
                                "layout: dualpipev needs at least 2 x pp = %lld micro-batches (have "
                                "%lld)", (long long)(2 * l->pp), (long long)mb);
        break;
    default:
        return trex_err_set(err, TREX_EINVAL, "layout: unknown schedule");
    }
    return TREX_OK;
}

/* ---- the evaluation ---- */

typedef struct rank_cost {
    cost c;
    bool first, last;
    int64_t layers;
} rank_cost;

static trex_code eval_ranks(const ctx *c, rank_cost *rc, trex_err *err)
{
    const trex_plan_model *m = c->m;
    const trex_plan_layout *l = c->l;
    stage_map *sm = calloc(1, sizeof *sm);
    if (!sm)
        return trex_err_set(err, TREX_ENOMEM, "out of memory");
    trex_code code = map_stages(m, l, sm, err);
    if (code != TREX_OK) {
        free(sm);
        return code;
    }
    for (int64_t r = 0; r < l->pp; r++)
        memset(&rc[r], 0, sizeof rc[r]);
    for (int64_t ch = 0; ch < sm->n_chunks; ch++) {
        rank_cost *R = &rc[sm->chunk_rank[ch]];
        int64_t end = ch + 1 < sm->n_chunks ? sm->chunk_first[ch + 1] : m->n_blocks;
        for (int64_t b = sm->chunk_first[ch]; b < end; b++) {
            block_cost(c, &m->blocks[b], &R->c);
            if (!m->blocks[b].mtp)
                R->layers++;
        }
        if (ch == 0)
            R->first = true;
        if (ch == sm->n_chunks - 1)
            R->last = true;
    }
    free(sm);
    /* embedding on the first chunk's rank, head + loss on the last chunk's rank */
    double tp = (double)l->tp, V = (double)m->vocab, h = (double)m->hidden;
    for (int64_t r = 0; r < l->pp; r++) {
        rank_cost *R = &rc[r];
        if (R->first) {
            R->c.p_dense += m->p_embed / tp;
            R->c.p_adam_dense += m->p_embed / tp;
        }
        if (R->last) {
            R->c.p_dense += (m->p_head + m->p_global_other) / tp;
            R->c.p_adam_dense += (m->p_head + m->p_global_other) / tp;
            double t_head = c->tok / tp * m->f_head / c->p_lin;
            /* fp32 logits, softmax and loss: read/write V-wide rows a few times */
            double t_loss = c->tok / tp * V * 4.0 * 4.0 * (double)(1 + m->n_mtp) /
                            (c->cl->hbm_bw_gbs * 1e9 * c->cl->eff.memory);
            R->c.fwd += t_head + t_loss;
            R->c.bwd += 2.0 * t_head + t_loss;
            R->c.model_flops += c->tok * 3.0 * m->f_head;
            if (l->tp > 1) {
                double t = collective_time(c->cl, c->tok * h * 2.0 * c->act_scale, l->tp, 1);
                R->c.comm_fwd += t;
                R->c.comm_bwd += t;
            }
        }
    }
    return TREX_OK;
}

/* Memory of rank r into bytes[]; returns the total. */
static double rank_memory(const ctx *c, const rank_cost *R, double bytes[TREX_MEM_COUNT],
                          double *host_bytes)
{
    const trex_plan_layout *l = c->l;
    const trex_plan_run *run = c->run;
    const trex_plan_model *m = c->m;
    int64_t dp = c->N / (l->tp * l->pp * l->cp);
    double copies = l->schedule == TREX_SCHED_DUALPIPE ? 2.0 : 1.0;
    double pd = R->c.p_dense * copies, pe = R->c.p_expert * copies;
    double P = pd + pe;
    double ddp = (double)(dp * l->cp), dedp = (double)c->edp;
    double shard = l->zero >= 1 ? pd / ddp + pe / dedp : P;
    /* optimizer tensors per parameter: AdamW master + m + v; Muon master + momentum (AdamW for the
     * embedding, head, norms and mHC biases) */
    double K = 3.0;
    if (run->optimizer == TREX_OPT_MUON) {
        double adam = R->c.p_adam_dense * copies;
        double adam_share = P > 0 ? adam / P : 0;
        K = 2.0 + adam_share;
    }
    memset(bytes, 0, sizeof(double) * TREX_MEM_COUNT);
    double w = P * run->weight_bytes;
    if (l->zero == 3) /* sharded weights + two gathered blocks in flight */
        w = (pd / ddp + pe / dedp) * run->weight_bytes +
            2.0 * P / (double)(R->layers ? R->layers : 1) * run->weight_bytes;
    bytes[TREX_MEM_WEIGHTS] = w;
    bytes[TREX_MEM_GRADS] = (l->zero >= 2 ? pd / ddp + pe / dedp : P) * run->grad_bytes;
    double opt = K * shard * run->state_bytes;
    *host_bytes = 0;
    if (l->swap_optimizer) {
        *host_bytes = opt;
        opt /= 16.0; /* streamed back in 16 chunks (MindSpeed swap_optimizer_times default) */
    }
    bytes[TREX_MEM_OPTIMIZER] = opt;
    /* activations: micro-batches in flight on this rank */
    double p = (double)l->pp, v = (double)l->vpp, mb = (double)c->m_mb, inflight;
    switch (l->schedule) {
    case TREX_SCHED_INTERLEAVED:
        inflight = fmin(mb, p) * (1.0 + (p - 1.0) / (p * v));
        break;
    case TREX_SCHED_DUALPIPE:
        inflight = p + 1.0;
        break;
    case TREX_SCHED_DUALPIPEV:
        inflight = p + 0.5;
        break;
    default:
        inflight = fmin(mb, p);
        break;
    }
    bytes[TREX_MEM_ACTIVATIONS] = R->c.act * inflight + R->c.act_peak +
                                  (R->first ? c->tok * (double)m->hidden * (double)m->hc_mult * 2.0 *
                                                  c->act_scale * inflight / (double)l->tp
                                            : 0);
    if (R->last)
        bytes[TREX_MEM_HEAD] = c->tok / (double)l->tp * (double)m->vocab * 6.0;
    double h = (double)m->hidden;
    double comm = 0;
    if (m->n_experts && l->ep > 1)
        comm += c->tok / (double)l->tp * (double)m->topk * h * 2.0 * 2.0 * run->imbalance;
    if (l->tp > 1)
        comm += c->tok * h * 2.0 * (double)m->hc_mult;
    if (ddp > 1 || dedp > 1)
        comm += 2.0 * fmin(P, 4e7) * run->grad_bytes;
    bytes[TREX_MEM_COMM] = comm;
    bytes[TREX_MEM_RESERVED] = c->cl->reserved_gib * GIB;
    double t = 0;
    for (int i = 0; i < TREX_MEM_COUNT; i++)
        t += bytes[i];
    return t;
}

static trex_code setup(ctx *c, const trex_plan_model *m, const trex_cluster *cl,
                       const trex_plan_run *run, const trex_plan_layout *l, trex_err *err)
{
    TREX_TRY(check_layout(m, cl, run, l, err));
    if (l->recompute == TREX_RECOMPUTE_ATTENTION || l->recompute == TREX_RECOMPUTE_MOE ||
        l->recompute == TREX_RECOMPUTE_FULL_KEEP_CORE || l->recompute == TREX_RECOMPUTE_ATTENTION_KEEP_CORE)
        return trex_err_set(err, TREX_EINVAL,
                            "layout: recompute=%s is a policy of trex's own engine (clusters with engine "
                            "fp32_ref); for cluster %s use none, selective or full",
                            trex_plan_recompute_name(l->recompute), cl->name);
    if (run->fp8 && cl->peak_fp8_tflops <= 0)
        return trex_err_set(err, TREX_EUNSUPPORTED,
                            "--fp8: cluster %s has no FP8 peak (peak_fp8_tflops is 0)", cl->name);
    if (m->seq != run->seq)
        return trex_err_set(err, TREX_EINVAL, "model costs were built for seq %lld, run has %lld",
                            (long long)m->seq, (long long)run->seq);
    memset(c, 0, sizeof *c);
    c->m = m, c->cl = cl, c->run = run, c->l = l;
    c->N = run->devices;
    int64_t dp = c->N / (l->tp * l->pp * l->cp);
    c->m_mb = run->gbs / (dp * l->mbs);
    c->edp = c->N / (l->pp * l->ep);
    c->tok = (double)(l->mbs * run->seq) / (double)l->cp;
    /* FP8 runs cache GEMM inputs in FP8 (DeepSeek-V3 report §3.3): about 0.6 of the BF16 bytes */
    c->act_scale = run->act_bytes / 2.0 * (run->fp8 ? 0.6 : 1.0);
    c->p_bf16 = cl->peak_bf16_tflops * 1e12;
    c->p_lin = run->fp8 ? cl->peak_fp8_tflops * 1e12 * cl->eff.gemm_fp8 : c->p_bf16 * cl->eff.gemm;
    return TREX_OK;
}

/* ---- cluster engine fp32-ref: the local reference engine in one process (src/plan/engine.c) ---- */

static trex_code fp32_check(const trex_plan_model *m, const trex_cluster *cl, const trex_plan_run *run,
                            const trex_plan_layout *l, trex_err *err)
{
    if (!m->has_cfg)
        return trex_err_set(err, TREX_EUNSUPPORTED,
                            "cluster %s runs trex's fp32 reference engine, which runs DeepSeek-V4 configs "
                            "only (model %s is %s)", cl->name, m->name, m->family);
    if (run->devices != 1)
        return trex_err_set(err, TREX_EINVAL,
                            "cluster %s runs trex's fp32 reference engine in one process: use --devices 1 "
                            "(got %lld)", cl->name, (long long)run->devices);
    if (run->fp8)
        return trex_err_set(err, TREX_EUNSUPPORTED, "cluster %s: the fp32 reference engine has no FP8",
                            cl->name);
    TREX_TRY(check_layout(m, cl, run, l, err));
    if (l->recompute == TREX_RECOMPUTE_SELECTIVE)
        return trex_err_set(err, TREX_EINVAL,
                            "layout: the fp32 reference engine has no selective recomputation (it "
                            "recomputes the cheap activations itself): use recompute=none, attention, moe "
                            "or full");
    if (l->swap_optimizer)
        return trex_err_set(err, TREX_EINVAL,
                            "layout: the fp32 reference engine keeps the optimizer state in memory: use "
                            "swap_optimizer=0");
    if (l->zero != 0)
        return trex_err_set(err, TREX_EINVAL,
                            "layout: zero=%lld shards over data parallelism; one process has none: use "
                            "zero=0", (long long)l->zero);
    return TREX_OK;
}

static void fp32_run_of(const trex_cluster *cl, const trex_plan_run *run, const trex_plan_layout *l,
                        trex_plan_fp32_run *fr)
{
    trex_plan_fp32_run_defaults(fr);
    fr->B = l->mbs;
    fr->T = run->seq;
    fr->sparse = !run->dense_attention;
    fr->threads = (int)cl->fp32.threads;
    fr->warm = true;               /* steady state */
    fr->grads_all_touched = true;  /* trex train zeroes the gradients every step */
    fr->with_optimizer = true;
    fr->optimizer = run->optimizer;
    trex_plan_fp32_run_recompute(fr, l->recompute);
}

static void fp32_memory(const trex_plan_fp32_result *f, double bytes[TREX_MEM_COUNT])
{
    memset(bytes, 0, sizeof(double) * TREX_MEM_COUNT);
    bytes[TREX_MEM_WEIGHTS] = f->params;
    bytes[TREX_MEM_GRADS] = f->grads_resident;
    bytes[TREX_MEM_OPTIMIZER] = f->optim;
    bytes[TREX_MEM_ACTIVATIONS] = f->acts_resident - f->head_chunk;
    bytes[TREX_MEM_HEAD] = f->head_chunk;
    bytes[TREX_MEM_RESERVED] = f->baseline;
}

static trex_code fp32_evaluate(const trex_plan_model *m, const trex_cluster *cl,
                               const trex_plan_run *run, const trex_plan_layout *l,
                               trex_plan_result *res, trex_err *err)
{
    TREX_TRY(fp32_check(m, cl, run, l, err));
    trex_plan_fp32_run fr;
    fp32_run_of(cl, run, l, &fr);
    memset(res, 0, sizeof *res);
    TREX_TRY(trex_plan_fp32_evaluate(&m->cfg, &cl->fp32, &fr, &res->fp32, err));
    const trex_plan_fp32_result *f = &res->fp32;
    res->has_fp32 = true;
    res->lay = *l;
    res->lay.dp = 1;
    res->m = run->gbs / l->mbs;
    res->edp = 1;
    res->n_stages = 1;
    double mb = (double)res->m;
    /* Muon: Newton–Schulz on the reference GEMM (long-K rate) */
    double t_opt = f->opt_s;
    if (run->optimizer == TREX_OPT_MUON) {
        int64_t iters = run->ns_iters > 0 ? run->ns_iters : m->ns_iters;
        double ns = 0;
        for (int64_t i = 0; i < m->n_blocks; i++)
            ns += m->blocks[i].ns_flops_dense + m->blocks[i].ns_flops_expert;
        double sp = cl->fp32.threads > 1 ? cl->fp32.speedup : 1.0;
        t_opt += (double)iters * ns / (cl->fp32.gemm_gflops_long * 1e9 * sp);
        res->fp32.opt_cpu_s += (double)iters * ns / (cl->fp32.gemm_gflops_long * 1e9);
    }
    res->t_compute = mb * (f->fwd_s + f->bwd_s);
    res->t_optimizer = t_opt;
    res->step_s = res->t_compute + t_opt;
    res->stage_f[0] = f->fwd_s;
    res->stage_b[0] = f->bwd_s;
    res->stage_layers[0] = m->n_layers;
    double tokens = (double)run->gbs * (double)run->seq;
    double mf = tokens * m->model_flops_per_token;
    if (run->optimizer == TREX_OPT_MUON) {
        int64_t iters = run->ns_iters > 0 ? run->ns_iters : m->ns_iters;
        for (int64_t i = 0; i < m->n_blocks; i++)
            mf += (double)iters * (m->blocks[i].ns_flops_dense + m->blocks[i].ns_flops_expert);
    }
    res->model_flops_step = mf;
    res->tokens_per_s = res->step_s > 0 ? tokens / res->step_s : 0;
    res->tflops_per_device = res->step_s > 0 ? mf / res->step_s / 1e12 : 0;
    res->mfu = res->tflops_per_device / cl->peak_bf16_tflops;
    fp32_memory(f, res->mem);
    res->mem_total = 0;
    for (int i = 0; i < TREX_MEM_COUNT; i++)
        res->mem_total += res->mem[i];
    double limit = (run->mem_limit_gib > 0 ? run->mem_limit_gib : cl->hbm_gib) * GIB;
    res->feasible = res->mem_total <= limit;
    if (!res->feasible) {
        int big = 0;
        for (int i = 1; i < TREX_MEM_COUNT; i++)
            if (res->mem[i] > res->mem[big])
                big = i;
        snprintf(res->why, sizeof res->why, "needs %.1f GiB > %.1f GiB (largest: %s %.1f GiB)",
                 res->mem_total / GIB, limit / GIB, trex_plan_mem_name(big), res->mem[big] / GIB);
    }
    return TREX_OK;
}

trex_code trex_plan_memory(const trex_plan_model *m, const trex_cluster *cl,
                           const trex_plan_run *run, const trex_plan_layout *lay, int64_t stage,
                           double bytes[TREX_MEM_COUNT], trex_err *err)
{
    if (cl->engine == TREX_ENGINE_FP32_REF) {
        TREX_TRY(fp32_check(m, cl, run, lay, err));
        trex_plan_fp32_run fr;
        fp32_run_of(cl, run, lay, &fr);
        trex_plan_fp32_result f;
        TREX_TRY(trex_plan_fp32_evaluate(&m->cfg, NULL, &fr, &f, err));
        f.baseline = cl->fp32.baseline_mib * 1048576.0;
        fp32_memory(&f, bytes);
        return TREX_OK;
    }
    ctx c;
    TREX_TRY(setup(&c, m, cl, run, lay, err));
    if (stage >= lay->pp)
        return trex_err_set(err, TREX_EINVAL, "stage %lld is not below pp=%lld", (long long)stage,
                            (long long)lay->pp);
    rank_cost *rc = calloc((size_t)lay->pp, sizeof *rc);
    if (!rc)
        return trex_err_set(err, TREX_ENOMEM, "out of memory");
    trex_code code = eval_ranks(&c, rc, err);
    if (code == TREX_OK) {
        double best = -1, tmp[TREX_MEM_COUNT], host;
        for (int64_t r = 0; r < lay->pp; r++) {
            if (stage >= 0 && r != stage)
                continue;
            double t = rank_memory(&c, &rc[r], tmp, &host);
            if (t > best) {
                best = t;
                memcpy(bytes, tmp, sizeof tmp);
            }
        }
    }
    free(rc);
    return code;
}

trex_code trex_plan_evaluate(const trex_plan_model *m, const trex_cluster *cl,
                             const trex_plan_run *run, const trex_plan_layout *lay,
                             trex_plan_result *res, trex_err *err)
{
    if (cl->engine == TREX_ENGINE_FP32_REF)
        return fp32_evaluate(m, cl, run, lay, res, err);
    ctx c;
    TREX_TRY(setup(&c, m, cl, run, lay, err));
    const trex_plan_layout *l = lay;
    rank_cost *rc = calloc((size_t)l->pp, sizeof *rc);
    if (!rc)
        return trex_err_set(err, TREX_ENOMEM, "out of memory");
    trex_code code = eval_ranks(&c, rc, err);
    if (code != TREX_OK) {
        free(rc);
        return code;
    }
    memset(res, 0, sizeof *res);
    res->lay = *l;
    res->lay.dp = c.N / (l->tp * l->pp * l->cp);
    res->m = c.m_mb;
    res->edp = c.edp;
    res->n_stages = l->pp;
    const trex_cluster *k = cl;
    double ov = k->eff.overlap, hf = k->eff.a2a_hide;
    bool hide_a2a = l->a2a_overlap > 0 || l->schedule == TREX_SCHED_DUALPIPE ||
                    l->schedule == TREX_SCHED_DUALPIPEV;

    /* per rank: full (un-hidden) and steady-state micro-batch times */
    double t_full_max = 0, t_steady_max = 0, sum_full = 0, sum_fb = 0;
    double F[TREX_PLAN_MAX_STAGES], B[TREX_PLAN_MAX_STAGES];
    int64_t slow = 0;
    for (int64_t r = 0; r < l->pp; r++) {
        cost *x = &rc[r].c;
        double comp = x->fwd + x->bwd + x->recompute;
        double f = x->fwd + x->comm_fwd, b = x->bwd + x->recompute + x->comm_bwd;
        double a2a_hidden = hide_a2a ? fmin(hf * x->a2a, comp) : 0;
        double full = f + b + x->a2a, steady = full - a2a_hidden;
        if (l->schedule == TREX_SCHED_DUALPIPE) {
            /* each rank runs its two mirrored stages for half of the micro-batches each */
            cost *y = &rc[l->pp - 1 - r].c;
            double comp2 = y->fwd + y->bwd + y->recompute;
            double f2 = y->fwd + y->comm_fwd, b2 = y->bwd + y->recompute + y->comm_bwd;
            double full2 = f2 + b2 + y->a2a, steady2 = full2 - fmin(hf * y->a2a, comp2);
            full = 0.5 * (full + full2), steady = 0.5 * (steady + steady2);
            f = 0.5 * (f + f2), b = 0.5 * (b + b2);
        }
        F[r] = f + (hide_a2a ? 0 : x->a2a / 2.0);
        B[r] = b + (hide_a2a ? 0 : x->a2a / 2.0);
        res->stage_f[r] = f;
        res->stage_b[r] = b;
        res->stage_comm[r] = x->a2a - a2a_hidden;
        res->stage_layers[r] = rc[r].layers;
        sum_full += full;
        sum_fb += F[r] + 0.5 * B[r];
        if (steady > t_steady_max) {
            t_steady_max = steady;
            slow = r;
        }
        if (full > t_full_max)
            t_full_max = full;
    }
    double p = (double)l->pp, v = (double)l->vpp, mb = (double)c.m_mb;
    double avg_full = sum_full / p, avg_fb = sum_fb / p;
    double bubble;
    switch (l->schedule) {
    case TREX_SCHED_INTERLEAVED:
        bubble = (p - 1.0) / v * avg_full;
        break;
    case TREX_SCHED_DUALPIPE:
        bubble = (p / 2.0 - 1.0) * avg_fb;
        break;
    case TREX_SCHED_DUALPIPEV:
        bubble = (p - 1.0) * avg_fb / 2.0;
        break;
    default:
        bubble = (p - 1.0) * avg_full;
        break;
    }
    double t_pipe = mb * t_steady_max + bubble;
    const cost *S = &rc[slow].c;
    res->worst_stage = slow;
    res->t_compute = mb * (S->fwd + S->bwd);
    res->t_recompute = mb * S->recompute;
    res->t_overhead = mb * S->overhead;
    res->t_cp = mb * S->cp;
    res->t_tp = mb * (S->comm_fwd + S->comm_bwd) - res->t_cp;
    double hid = hide_a2a ? fmin(hf * S->a2a, S->fwd + S->bwd + S->recompute) : 0;
    res->t_a2a = mb * (S->a2a - hid);
    res->t_a2a_hidden = mb * hid;
    res->t_a2a_up = mb * S->a2a_up;
    res->t_a2a_out = mb * S->a2a_out;
    res->t_bubble = bubble;

    /* PP point-to-point: activations at chunk boundaries; steady state mostly overlapped */
    double t_pp = 0;
    if (l->pp > 1) {
        int64_t stride = c.N / l->pp;
        double bytes = c.tok * (double)m->hidden * (double)m->hc_mult * 2.0 * c.act_scale /
                       (double)l->tp;
        double bw = link_bw(cl, 2, stride) * cl->eff.collective;
        double lat = (stride >= cl->scaleup_domain ? cl->scaleout_latency_us : cl->scaleup_latency_us) *
                     1e-6;
        double t1 = bytes / bw + lat;
        double per_mb = 2.0 * (double)chunks_per_rank(l) * t1;
        t_pp = 2.0 * (p - 1.0) * t1 + mb * (1.0 - ov) * per_mb;
    }
    res->t_pp = t_pp;

    /* DP: gradient reduce-scatter and parameter all-gather (all-reduce for ZeRO-0), overlapped with
     * the last backward / first forward and the pipeline drain/fill */
    int64_t dp = res->lay.dp;
    double ddp = (double)(dp * l->cp);
    double copies = l->schedule == TREX_SCHED_DUALPIPE ? 2.0 : 1.0;
    double t_dp = 0, t_opt = 0, t_swap = 0;
    double worst_opt = 0;
    for (int64_t r = 0; r < l->pp; r++) {
        const cost *x = &rc[r].c;
        double pd = x->p_dense * copies, pe = x->p_expert * copies;
        double rs = collective_time(cl, pd * run->grad_bytes, dp * l->cp, l->tp) +
                    collective_time(cl, pe * run->grad_bytes, c.edp, l->ep);
        double ag = collective_time(cl, pd * run->weight_bytes, dp * l->cp, l->tp) +
                    collective_time(cl, pe * run->weight_bytes, c.edp, l->ep);
        double exposed;
        double win_b = F[r] > 0 ? B[r] + bubble / 2.0 : 0, win_f = F[r] + bubble / 2.0;
        if (l->zero == 0) {
            exposed = fmax(0, 2.0 * rs - ov * win_b);
        } else if (l->zero == 3) {
            /* parameters gathered for forward and backward, gradients reduce-scattered, every
             * micro-batch; overlapped with that micro-batch's compute */
            double per_mb = 2.0 * ag + rs;
            double comp = x->fwd + x->bwd + x->recompute;
            exposed = mb * fmax(0, per_mb - ov * comp);
        } else {
            exposed = fmax(0, rs - ov * win_b) + fmax(0, ag - ov * win_f);
        }
        /* optimizer step on the shard: memory-bound update (+ Newton–Schulz for Muon) */
        double shard = l->zero >= 1 ? pd / ddp + pe / (double)c.edp : pd + pe;
        double bpp = run->optimizer == TREX_OPT_MUON ? 22.0 : 30.0;
        double t_o = shard * bpp / (cl->hbm_bw_gbs * 1e9 * cl->eff.memory);
        double extra_comm = 0;
        if (run->optimizer == TREX_OPT_MUON) {
            int64_t iters = run->ns_iters > 0 ? run->ns_iters : m->ns_iters;
            double ns = (double)iters * 1.1 * /* <= 10% packing imbalance (DeepSeek-V4 report) */
                        (x->ns_dense * copies / (double)(l->tp * dp * l->cp) +
                         x->ns_expert * copies / (double)(l->ep * c.edp));
            t_o += ns / (c.p_bf16 * cl->eff.gemm);
            /* whole matrices at their owner: one more gradient reduce-scatter over DP and TP */
            extra_comm = collective_time(cl, pd * run->grad_bytes, dp * l->cp, l->tp) +
                         collective_time(cl, pd * l->tp * run->grad_bytes, l->tp, 1) / (double)l->tp +
                         collective_time(cl, pe * run->grad_bytes, c.edp, l->ep);
            t_o += extra_comm;
        }
        double ts = 0;
        if (l->swap_optimizer) {
            double K = run->optimizer == TREX_OPT_MUON ? 2.2 : 3.0;
            double transfer = K * shard * run->state_bytes / (cl->host_bw_gbs * 1e9);
            ts = fmax(0, transfer - t_o); /* chunks stream while others update */
        }
        if (exposed > t_dp)
            t_dp = exposed;
        if (t_o + ts > worst_opt) {
            worst_opt = t_o + ts;
            t_opt = t_o;
            t_swap = ts;
        }
    }
    res->t_dp = t_dp;
    res->t_optimizer = t_opt;
    res->t_swap = t_swap;
    res->step_s = t_pipe + t_pp + t_dp + t_opt + t_swap;

    /* model FLOPs of the step: every token of the global batch (+ Newton–Schulz under Muon) */
    double tokens = (double)run->gbs * (double)run->seq;
    double mf = tokens * m->model_flops_per_token;
    if (run->optimizer == TREX_OPT_MUON) {
        int64_t iters = run->ns_iters > 0 ? run->ns_iters : m->ns_iters;
        double ns = 0;
        for (int64_t i = 0; i < m->n_blocks; i++)
            ns += m->blocks[i].ns_flops_dense + m->blocks[i].ns_flops_expert;
        mf += (double)iters * ns;
    }
    res->model_flops_step = mf;
    res->tokens_per_s = tokens / res->step_s;
    res->tflops_per_device = mf / res->step_s / (double)c.N / 1e12;
    res->mfu = res->tflops_per_device * 1e12 / c.p_bf16;

    /* memory: the worst rank */
    double best = -1;
    for (int64_t r = 0; r < l->pp; r++) {
        double tmp[TREX_MEM_COUNT], host;
        double t = rank_memory(&c, &rc[r], tmp, &host);
        if (t > best) {
            best = t;
            memcpy(res->mem, tmp, sizeof tmp);
            res->mem_total = t;
            res->mem_host_node = host * (double)cl->devices_per_node;
        }
    }
    double limit = (run->mem_limit_gib > 0 ? run->mem_limit_gib : cl->hbm_gib) * GIB;
    res->feasible = true;
    if (res->mem_total > limit) {
        res->feasible = false;
        int big = 0;
        for (int i = 1; i < TREX_MEM_COUNT; i++)
            if (res->mem[i] > res->mem[big])
                big = i;
        snprintf(res->why, sizeof res->why, "needs %.1f GiB per device > %.1f GiB (largest: %s %.1f GiB)",
                 res->mem_total / GIB, limit / GIB, trex_plan_mem_name(big), res->mem[big] / GIB);
    } else if (res->mem_host_node > cl->host_mem_gib * GIB) {
        res->feasible = false;
        snprintf(res->why, sizeof res->why,
                 "swapped optimizer state needs %.0f GiB of host memory per node > %.0f GiB",
                 res->mem_host_node / GIB, cl->host_mem_gib);
    }
    free(rc);
    return TREX_OK;
}
