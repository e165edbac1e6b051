/* src/plan/report.c — planner reports: JSON objects, table rows, the --explain breakdown and SVG
 * pictures (search space; pipeline timeline of one step). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trex/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

static const char *sched_name(int64_t s)
{
    static const char *const n[] = {"1f1b", "interleaved", "dualpipe", "dualpipev"};
    return s >= 0 && s < 4 ? n[s] : "?";
}

static double r3(double x)
{
    return round(x * 1000.0) / 1000.0;
}

cJSON *trex_plan_result_json(const trex_plan_result *r, bool explain)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    const trex_plan_layout *l = &r->lay;
    char buf[256];
    trex_plan_layout_str(l, buf, sizeof buf);
    cJSON_AddStringToObject(o, "layout", buf);
    cJSON_AddNumberToObject(o, "tp", (double)l->tp);
    cJSON_AddNumberToObject(o, "pp", (double)l->pp);
    cJSON_AddNumberToObject(o, "vpp", (double)l->vpp);
    cJSON_AddNumberToObject(o, "ep", (double)l->ep);
    cJSON_AddNumberToObject(o, "cp", (double)l->cp);
    cJSON_AddNumberToObject(o, "dp", (double)l->dp);
    cJSON_AddNumberToObject(o, "edp", (double)r->edp);
    cJSON_AddNumberToObject(o, "zero", (double)l->zero);
    cJSON_AddStringToObject(o, "recompute", trex_plan_recompute_name(l->recompute));
    cJSON_AddNumberToObject(o, "swap_optimizer", (double)l->swap_optimizer);
    cJSON_AddNumberToObject(o, "mbs", (double)l->mbs);
    cJSON_AddStringToObject(o, "schedule", sched_name(l->schedule));
    cJSON_AddNumberToObject(o, "a2a_overlap", (double)l->a2a_overlap);
    cJSON_AddStringToObject(o, "dispatcher", l->dedup ? "deepep" : "alltoall");
    cJSON_AddNumberToObject(o, "first", (double)l->first);
    cJSON_AddNumberToObject(o, "last", (double)l->last);
    cJSON_AddNumberToObject(o, "micro_batches", (double)r->m);
    cJSON_AddBoolToObject(o, "feasible", r->feasible);
    if (!r->feasible)
        cJSON_AddStringToObject(o, "why", r->why);
    cJSON_AddNumberToObject(o, "mem_per_device_gb", r3(r->mem_total / GIB));
    cJSON_AddNumberToObject(o, "step_s", r3(r->step_s));
    cJSON_AddNumberToObject(o, "tokens_per_s", round(r->tokens_per_s));
    cJSON_AddNumberToObject(o, "mfu", round(r->mfu * 10000.0) / 10000.0);
    cJSON_AddNumberToObject(o, "tflops_per_device", round(r->tflops_per_device * 10.0) / 10.0);
    if (explain) {
        cJSON *t = cJSON_AddObjectToObject(o, "time_s");
        cJSON_AddNumberToObject(t, "compute", r3(r->t_compute));
        cJSON_AddNumberToObject(t, "recompute", r3(r->t_recompute));
        cJSON_AddNumberToObject(t, "host_overhead_in_compute", r3(r->t_overhead));
        cJSON_AddNumberToObject(t, "tp_exposed", r3(r->t_tp));
        cJSON_AddNumberToObject(t, "cp_exposed", r3(r->t_cp));
        cJSON_AddNumberToObject(t, "a2a_exposed", r3(r->t_a2a));
        cJSON_AddNumberToObject(t, "a2a_hidden", r3(r->t_a2a_hidden));
        cJSON_AddNumberToObject(t, "a2a_scaleup", r3(r->t_a2a_up));
        cJSON_AddNumberToObject(t, "a2a_scaleout", r3(r->t_a2a_out));
        cJSON_AddNumberToObject(t, "bubble", r3(r->t_bubble));
        cJSON_AddNumberToObject(t, "pp_p2p_exposed", r3(r->t_pp));
        cJSON_AddNumberToObject(t, "dp_exposed", r3(r->t_dp));
        cJSON_AddNumberToObject(t, "optimizer", r3(r->t_optimizer));
        cJSON_AddNumberToObject(t, "swap_exposed", r3(r->t_swap));
        cJSON *mm = cJSON_AddObjectToObject(o, "memory_gb");
        for (int i = 0; i < TREX_MEM_COUNT; i++)
            cJSON_AddNumberToObject(mm, trex_plan_mem_name(i), r3(r->mem[i] / GIB));
        cJSON_AddNumberToObject(mm, "host_swapped_per_node", r3(r->mem_host_node / GIB));
        cJSON_AddNumberToObject(o, "worst_stage", (double)r->worst_stage);
        if (r->has_fp32) {
            const trex_plan_fp32_result *f = &r->fp32;
            cJSON *e = cJSON_AddObjectToObject(o, "fp32_engine");
            cJSON_AddNumberToObject(e, "forward_s", r3(f->fwd_s));
            cJSON_AddNumberToObject(e, "backward_s", r3(f->bwd_s));
            cJSON_AddNumberToObject(e, "optimizer_s", r3(r->t_optimizer));
            /* CPU seconds (all threads): the time model's own output, independent of the load */
            cJSON_AddNumberToObject(e, "cpu_forward_s", r3(f->cpu_s[0]));
            cJSON_AddNumberToObject(e, "cpu_backward_s", r3(f->cpu_s[1]));
            cJSON_AddNumberToObject(e, "cpu_optimizer_s", r3(f->opt_cpu_s));
            cJSON_AddNumberToObject(e, "cpu_step_s",
                                    r3((double)r->m * (f->cpu_s[0] + f->cpu_s[1]) + f->opt_cpu_s));
            cJSON_AddNumberToObject(e, "params_mib", f->params / MIB);
            cJSON_AddNumberToObject(e, "grads_mib", f->grads / MIB);
            cJSON_AddNumberToObject(e, "optim_mib", f->optim / MIB);
            cJSON_AddNumberToObject(e, "acts_kept_mib", f->acts_kept / MIB);
            cJSON_AddNumberToObject(e, "acts_peak_mib", f->acts_peak / MIB);
            cJSON_AddNumberToObject(e, "acts_end_mib", f->acts_end / MIB);
            cJSON_AddNumberToObject(e, "acts_reserved_mib", f->acts_reserved / MIB);
            cJSON_AddNumberToObject(e, "acts_resident_mib", f->acts_resident / MIB);
            cJSON_AddNumberToObject(e, "rss_peak_mib", f->rss_peak / MIB);
        }
    }
    return o;
}

void trex_plan_print_row(FILE *out, const trex_plan_result *r)
{
    if (!r) {
        fprintf(out, "%-3s %-3s %-4s %-4s %-3s %-4s %-4s %-19s %-4s %-3s %-11s %9s %8s %11s %6s %7s\n",
                "tp", "pp", "vpp", "ep", "cp", "dp", "zero", "recompute", "swap", "mbs", "schedule",
                "mem GiB", "step s", "tokens/s", "MFU", "TFLOPS");
        return;
    }
    const trex_plan_layout *l = &r->lay;
    fprintf(out, "%-3lld %-3lld %-4lld %-4lld %-3lld %-4lld %-4lld %-19s %-4lld %-3lld %-11s %9.1f %8.2f %11.0f %5.1f%% %7.1f%s\n",
            (long long)l->tp, (long long)l->pp, (long long)l->vpp, (long long)l->ep, (long long)l->cp,
            (long long)l->dp, (long long)l->zero, trex_plan_recompute_name(l->recompute), (long long)l->swap_optimizer,
            (long long)l->mbs, sched_name(l->schedule), r->mem_total / GIB, r->step_s, r->tokens_per_s,
            100.0 * r->mfu, r->tflops_per_device, r->feasible ? "" : "  (does not fit)");
}

/* The fp32 engine's breakdown: the training step the result describes, then one pass as
 * `trex model run --backward --no-logits` runs it (dense CSA, weights copied from a mapped file, no
 * optimizer), printed like the runtime prints its memory so that the two can be compared line by line
 * (tests/test_plan_local.sh). */
static void print_fp32(FILE *out, const trex_plan_model *m, const trex_cluster *cl,
                       const trex_plan_run *run, const trex_plan_result *r)
{
    const trex_plan_fp32_result *f = &r->fp32;
    static const char *const kinds[TREX_FP32_KINDS] = {"GEMM", "attention core", "exp", "mHC",
                                                       "element-wise", "first touch"};
    fprintf(out, "\nfp32 reference engine (cluster %s), micro-batch %lld x %lld, %g threads, %s CSA:\n",
            cl->name, (long long)r->lay.mbs, (long long)run->seq, cl->fp32.threads,
            run->dense_attention ? "dense" : "top-k");
    fprintf(out, "  steady-state micro-batch: forward %.3f s, backward %.3f s (CPU time %.3f s, %.3f s); "
                 "optimizer step %.3f s (%s)\n", f->fwd_s, f->bwd_s, f->cpu_s[0], f->cpu_s[1], r->t_optimizer,
            run->optimizer == TREX_OPT_MUON ? "Muon" : "AdamW");
    for (int ph = 0; ph < 2; ph++) {
        fprintf(out, "    %s:", ph ? "backward" : "forward ");
        for (int k = 0; k < TREX_FP32_KINDS; k++)
            fprintf(out, " %s %.3f s%s", kinds[k], f->t[ph][k], k + 1 < TREX_FP32_KINDS ? "," : "");
        fprintf(out, "\n");
    }
    fprintf(out, "    work: GEMM %.4g + %.4g GFLOP, attention core %.4g + %.4g GFLOP, %.3g exp\n",
            f->gemm_flops[0] / 1e9, f->gemm_flops[1] / 1e9, f->attn_flops[0] / 1e9,
            f->attn_flops[1] / 1e9, f->exps[0] + f->exps[1]);
    fprintf(out, "  regions (trex_mem): params %.1f MiB grads %.1f MiB optim %.1f MiB acts %.1f MiB\n",
            f->params / MIB, f->grads / MIB, f->optim / MIB, f->acts_reserved / MIB);
    fprintf(out, "  activation arena: kept by the forward %.1f MiB, highest use %.1f MiB, in use after the "
                 "backward %.1f MiB, reserved %.1f MiB, pages touched %.1f MiB (head logits chunk %.1f MiB)\n",
            f->acts_kept / MIB, f->acts_peak / MIB, f->acts_end / MIB, f->acts_reserved / MIB,
            f->acts_resident / MIB, f->head_chunk / MIB);

    trex_plan_fp32_run mr;
    trex_plan_fp32_run_defaults(&mr);
    mr.B = r->lay.mbs;
    mr.T = run->seq;
    mr.sparse = false;
    mr.threads = (int)cl->fp32.threads;
    mr.grads_all_touched = false;
    mr.load_file = true;
    trex_plan_fp32_run_recompute(&mr, r->lay.recompute);
    trex_plan_fp32_result g;
    trex_err err = {0};
    if (trex_plan_fp32_evaluate(&m->cfg, &cl->fp32, &mr, &g, &err) != TREX_OK) {
        fprintf(out, "  (model run view: %s)\n", err.msg);
        return;
    }
    const bool rec = mr.recompute_full || mr.recompute_attn || mr.recompute_moe;
    fprintf(out, "\nas `trex model run --backward --no-logits%s%s` (one pass, dense CSA, %g threads), predicted:\n",
            rec ? " --recompute " : "", rec ? trex_plan_recompute_name(r->lay.recompute) : "", cl->fp32.threads);
    fprintf(out, "  time: forward %.3f s, backward %.3f s (%lld tokens); CPU time forward %.3f s, backward "
                 "%.3f s\n", g.fwd_s, g.bwd_s, (long long)(mr.B * mr.T), g.cpu_s[0], g.cpu_s[1]);
    fprintf(out, "  memory: peak RSS %.1f MiB; peak by region: params %.1f MiB grads %.1f MiB acts %.1f MiB; "
                 "activations used %.1f MiB of %.1f MiB reserved, peak %.1f MiB\n",
            g.rss_peak / MIB, g.params / MIB, g.grads / MIB, g.acts_reserved / MIB, g.acts_end / MIB,
            g.acts_reserved / MIB, g.acts_peak / MIB);
    fprintf(out, "  peak RSS = max(step: baseline %.1f + params %.1f + gradient pages %.1f + arena pages %.1f "
                 "MiB; loading: baseline + params + the mapped file of %.1f MiB)\n",
            g.baseline / MIB, g.params / MIB, g.grads_resident / MIB, g.acts_resident / MIB,
            g.file / MIB);
}

void trex_plan_print_explain(FILE *out, const trex_plan_model *m, const trex_cluster *cl,
                             const trex_plan_run *run, const trex_plan_result *r)
{
    char buf[256];
    trex_plan_layout_str(&r->lay, buf, sizeof buf);
    fprintf(out, "layout    %s\n", buf);
    fprintf(out, "model     %s (%s): %.2f B parameters (+%.2f B MTP), %.2f B active; %.3g model "
                 "FLOPs/token\n", m->name, m->family, m->p_total / 1e9, m->p_mtp / 1e9,
            m->p_active / 1e9, m->model_flops_per_token);
    fprintf(out, "cluster   %s: %lld x %s, peak %.4g TFLOPS BF16 (MFU denominator), %.0f GiB\n",
            cl->name, (long long)run->devices, cl->device, cl->peak_bf16_tflops, cl->hbm_gib);
    fprintf(out, "batch     seq %lld, gbs %lld, dp %lld, edp %lld, %lld micro-batches per pipeline\n",
            (long long)run->seq, (long long)run->gbs, (long long)r->lay.dp, (long long)r->edp,
            (long long)r->m);
    fprintf(out, "\nstep time %.3f s (slowest pipeline rank %lld)\n", r->step_s, (long long)r->worst_stage);
    struct {
        const char *name;
        double v;
    } t[] = {{"compute (forward + backward)", r->t_compute},
             {"  of which host/launch overhead", r->t_overhead},
             {"recompute", r->t_recompute},
             {"TP communication (exposed)", r->t_tp},
             {"CP communication (exposed)", r->t_cp},
             {"EP all-to-all (exposed)", r->t_a2a},
             {"  hidden behind compute", r->t_a2a_hidden},
             {"  scale-up part (total)", r->t_a2a_up},
             {"  scale-out part (total)", r->t_a2a_out},
             {"pipeline bubble", r->t_bubble},
             {"PP point-to-point (exposed)", r->t_pp},
             {"DP gradient/parameter sync (exposed)", r->t_dp},
             {"optimizer step", r->t_optimizer},
             {"optimizer swap (exposed)", r->t_swap}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        fprintf(out, "  %-38s %9.3f s %6.1f%%\n", t[i].name, t[i].v, 100.0 * t[i].v / r->step_s);
    fprintf(out, "  tokens/s %.0f, %.1f TFLOPS per device, MFU %.1f%%%s\n", r->tokens_per_s,
            r->tflops_per_device, 100.0 * r->mfu, run->fp8 ? " (GEMMs in FP8; MFU against BF16 peak)" : "");
    fprintf(out, "\nmemory per device %.2f GiB (worst pipeline rank)%s\n", r->mem_total / GIB,
            r->feasible ? "" : "  DOES NOT FIT");
    for (int i = 0; i < TREX_MEM_COUNT; i++)
        fprintf(out, "  %-38s %9.2f GiB\n", trex_plan_mem_name(i), r->mem[i] / GIB);
    if (r->lay.swap_optimizer)
        fprintf(out, "  %-38s %9.1f GiB\n", "host: swapped optimizer state / node", r->mem_host_node / GIB);
    if (!r->feasible)
        fprintf(out, "  %s\n", r->why);
    if (r->has_fp32) {
        print_fp32(out, m, cl, run, r);
        return;
    }
    fprintf(out, "\nper pipeline rank, one micro-batch (forward/backward include TP/CP communication):\n"
                 "  rank layers  forward s  backward s  exposed a2a s\n");
    for (int64_t s = 0; s < r->n_stages && s < TREX_PLAN_MAX_STAGES; s++)
        fprintf(out, "  %4lld %6lld %10.4f %11.4f %15.4f\n", (long long)s, (long long)r->stage_layers[s],
                r->stage_f[s], r->stage_b[s], r->stage_comm[s]);
}

/* ---- SVG ---- */

static void svg_text(FILE *f, double x, double y, const char *anchor, int size, const char *s)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-family=\"sans-serif\" font-size=\"%d\" "
               "text-anchor=\"%s\">%s</text>\n", x, y, size, anchor, s);
}

static void svg_rect(FILE *f, double x, double y, double w, double h, const char *fill)
{
    if (w > 0.05 && h > 0)
        fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/>\n", x, y, w, h,
                fill);
}

/* colours: forward / backward per chunk parity, weight gradient, exposed all-to-all, idle (bubble),
 * and the end of the step */
#define C_F0 "#2e8b57"
#define C_F1 "#66bb8a"
#define C_B0 "#2f6db5"
#define C_B1 "#6f9fd8"
#define C_W "#a9c8ee"
#define C_A2A "#f08a24"
#define C_IDLE "#e4e4e4"
#define C_PP "#f6c67c"
#define C_DP "#d9534f"
#define C_OPT "#8e6bbf"
#define C_SWAP "#c5b0e3"
#define C_MIX "#5c8f8f"

/* The pipeline timeline of one step, laid out before anything is written (the picture's height
 * depends on it). The schedule comes from trex_plan_timeline_simulate with the result's per-rank
 * forward, backward and exposed all-to-all times; a step with many micro-batches is simulated for
 * `m_sim` of them and the steady state in the middle is cut out of the drawing (a broken time axis):
 * the steady state repeats the slowest rank's micro-batch time, so the cut is `shift` seconds. */
typedef struct tl_view {
    bool ok;
    char msg[sizeof(((trex_err *)0)->msg)];
    trex_plan_timeline tl;
    int64_t m_sim;
    double period;            /* the slowest rank's micro-batch (steady-state repeat) */
    double shift;             /* seconds of steady state not simulated (m - m_sim micro-batches) */
    double pipe_end;          /* simulated pipeline end + shift */
    double total;             /* pipe_end + PP + DP + optimizer + swap */
    bool cut;                 /* the time axis is broken at [t1, t2) (simulated times) */
    double t1, t2;
    double row_h, row_gap;
} tl_view;

static bool is_bwd(int k)
{
    return k == TREX_OP_B || k == TREX_OP_BI || k == TREX_OP_FB;
}

static void tl_prepare(tl_view *v, const trex_plan_result *r)
{
    memset(v, 0, sizeof *v);
    int64_t p = r->n_stages, m = r->m;
    int sched = (int)r->lay.schedule;
    int64_t chunks = sched == TREX_SCHED_INTERLEAVED ? r->lay.vpp : sched == TREX_SCHED_DUALPIPEV ? 2 : 1;
    /* simulate at most max(4p, 32) micro-batches (a multiple of p for interleaved) */
    int64_t cap = 4 * p > 32 ? 4 * p : 32;
    if (sched == TREX_SCHED_INTERLEAVED)
        cap = (cap + p - 1) / p * p;
    v->m_sim = m > cap ? cap : m;
    trex_err err = {0};
    if (trex_plan_timeline_simulate(&v->tl, sched, p, chunks, v->m_sim, r->stage_f, r->stage_b,
                                    r->stage_comm, &err) != TREX_OK) {
        snprintf(v->msg, sizeof v->msg, "%s", err.msg);
        return;
    }
    v->ok = true;
    double period = 0;
    for (int64_t s = 0; s < p; s++)
        period = fmax(period, r->stage_f[s] + r->stage_b[s] + r->stage_comm[s]);
    v->period = period;
    v->shift = (double)(m - v->m_sim) * period;
    v->pipe_end = v->tl.makespan + v->shift;
    v->total = v->pipe_end + r->t_pp + r->t_dp + r->t_optimizer + r->t_swap;
    /* cut out the steady state between the last rank's first backward (+1 period) and the first
     * rank's last forward (-1 period) when it would leave boxes narrower than ~6 px */
    double first_b = 0, last_f = v->tl.makespan;
    for (int64_t s = 0; s < p; s++) {
        double fb = -1, lf = -1;
        for (int64_t i = v->tl.rank_first[s]; i < v->tl.rank_first[s + 1]; i++) {
            const trex_plan_op *o = &v->tl.ops[i];
            if (fb < 0 && is_bwd(o->kind))
                fb = o->start;
            if (o->kind == TREX_OP_F || o->kind == TREX_OP_FB)
                lf = o->end;
        }
        first_b = fmax(first_b, fb);
        last_f = fmin(last_f, lf);
    }
    double per_rank_ops = (double)v->tl.n_ops / (double)p;
    v->t1 = first_b + period;
    v->t2 = last_f - period;
    v->cut = (v->shift > 0 || 780.0 / per_rank_ops < 6.0) && v->t2 - v->t1 > period;
    double h = 480.0 / (double)p;
    v->row_h = h > 22 ? 22 : h < 5 ? 5 : h;
    v->row_gap = v->row_h > 10 ? 6 : 2;
}

/* x of time t (seconds of the real step) on a possibly broken axis */
typedef struct tl_axis {
    double lx, rx, gap, scale, t1, t2r; /* t2r: first time drawn after the cut (real seconds) */
    bool cut;
} tl_axis;

static double ax_x(const tl_axis *a, double t)
{
    if (!a->cut || t <= a->t1)
        return a->lx + t * a->scale;
    return a->lx + a->t1 * a->scale + a->gap + (t - a->t2r) * a->scale;
}

/* draws [t0, t1) clipped to the visible parts of the axis */
static void ax_rect(FILE *f, const tl_axis *a, double t0, double t1, double y, double h, const char *fill)
{
    if (a->cut) {
        if (t0 < a->t1)
            svg_rect(f, ax_x(a, t0), y, (fmin(t1, a->t1) - t0) * a->scale, h, fill);
        if (t1 > a->t2r) {
            double s = fmax(t0, a->t2r);
            svg_rect(f, ax_x(a, s), y, (t1 - s) * a->scale, h, fill);
        }
        return;
    }
    svg_rect(f, ax_x(a, t0), y, (t1 - t0) * a->scale, h, fill);
}

static double nice_step(double span, int n)
{
    double raw = span / (double)n, e = pow(10.0, floor(log10(raw))), k = raw / e;
    return (k < 1.5 ? 1 : k < 3.5 ? 2 : k < 7.5 ? 5 : 10) * e;
}

static void tl_ticks(FILE *f, const tl_axis *a, double from, double to, int n, double y)
{
    if (to <= from)
        return;
    double st = nice_step(to - from, n);
    char lab[64];
    for (double t = ceil(from / st) * st; t <= to + 1e-9 * st; t += st) {
        double x = ax_x(a, t);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x, y, x, y + 4);
        snprintf(lab, sizeof lab, "%.4g", t);
        svg_text(f, x, y + 15, "middle", 10, lab);
    }
}

static double tl_height(const tl_view *v, const trex_plan_result *r)
{
    if (!v->ok)
        return 70;
    return 70.0 + (double)r->n_stages * (v->row_h + v->row_gap) + 40.0 + 140.0;
}

static void tl_draw(FILE *f, const tl_view *v, const trex_plan_result *r, double y0, double W)
{
    char lab[1200];
    const char *sn = sched_name(r->lay.schedule);
    if (r->lay.schedule == TREX_SCHED_INTERLEAVED)
        snprintf(lab, sizeof lab, "Pipeline timeline of one step: %s, pp=%lld, vpp=%lld, %lld micro-batches",
                 sn, (long long)r->n_stages, (long long)r->lay.vpp, (long long)r->m);
    else
        snprintf(lab, sizeof lab, "Pipeline timeline of one step: %s, pp=%lld, %lld micro-batches", sn,
                 (long long)r->n_stages, (long long)r->m);
    svg_text(f, W / 2, y0 + 16, "middle", 16, lab);
    if (!v->ok) {
        snprintf(lab, sizeof lab, "(%s)", v->msg);
        svg_text(f, W / 2, y0 + 40, "middle", 12, lab);
        return;
    }
    int64_t p = r->n_stages;
    tl_axis a = {.lx = 80, .rx = W - 30, .cut = v->cut, .t1 = v->t1, .t2r = v->t2 + v->shift};
    a.gap = a.cut ? 36 : 0;
    double end = fmax(v->total, r->step_s);
    double shown = a.cut ? v->t1 + (end - a.t2r) : end;
    a.scale = (a.rx - a.lx - a.gap) / shown;
    double top = y0 + 40, rh = v->row_h, rg = v->row_gap;
    /* rows: idle background over the pipeline, then ops, then the end of the step */
    for (int64_t s = 0; s < p; s++) {
        double y = top + (double)s * (rh + rg);
        if (rh >= 8 || s % (p / 16 + 1) == 0) {
            snprintf(lab, sizeof lab, "rank %lld", (long long)s);
            svg_text(f, a.lx - 6, y + rh / 2 + 4, "end", rh >= 10 ? 11 : 8, lab);
        }
        ax_rect(f, &a, 0, v->pipe_end, y, rh, C_IDLE);
        double run_x0 = -1, run_x1 = -1;
        const char *run_c = NULL;
        for (int64_t i = v->tl.rank_first[s]; i < v->tl.rank_first[s + 1]; i++) {
            const trex_plan_op *o = &v->tl.ops[i];
            double t0 = o->start, t1 = o->end;
            bool late = a.cut && t0 >= v->t2;
            if (late || (a.cut && t1 > v->t2 && t0 < v->t2)) {
                t0 = fmax(t0, v->t2) + v->shift;
                t1 += v->shift;
            }
            if (a.cut && t0 >= v->t1 && t1 <= a.t2r)
                continue; /* in the cut */
            const char *c = o->kind == TREX_OP_F ? (o->chunk % 2 ? C_F1 : C_F0)
                            : o->kind == TREX_OP_W ? C_W
                            : o->kind == TREX_OP_FB ? C_F0 : (o->chunk % 2 ? C_B1 : C_B0);
            double x0 = ax_x(&a, t0), w = (t1 - t0) * a.scale;
            if (w < 1.5) { /* runs of sub-pixel ops become one box (mixed colour when kinds differ) */
                if (run_c && x0 - run_x1 < 0.5 && run_x1 - run_x0 < 2.0) {
                    run_x1 = x0 + w;
                    if (strcmp(run_c, c) != 0)
                        run_c = C_MIX;
                    continue;
                }
                if (run_c)
                    svg_rect(f, run_x0, y, run_x1 - run_x0, rh, run_c);
                run_x0 = x0, run_x1 = x0 + w, run_c = c;
                continue;
            }
            if (run_c) {
                svg_rect(f, run_x0, y, run_x1 - run_x0, rh, run_c);
                run_c = NULL;
            }
            if (o->kind == TREX_OP_FB) {
                /* overlapped forward (top) and backward (bottom) of two micro-batches */
                ax_rect(f, &a, t0, t1, y, rh / 2, o->chunk % 2 ? C_F1 : C_F0);
                ax_rect(f, &a, t0, t1, y + rh / 2, rh / 2, o->chunk_b % 2 ? C_B1 : C_B0);
            } else {
                ax_rect(f, &a, t0, t1, y, rh, c);
            }
            if (o->comm > 0)
                ax_rect(f, &a, t1 - o->comm, t1, y, rh, C_A2A);
            if (w >= 14 && rh >= 10 && !(a.cut && t0 < v->t1 && t1 > v->t1)) {
                if (o->kind == TREX_OP_FB)
                    snprintf(lab, sizeof lab, "%d/%d", o->mb, o->mb_b);
                else
                    snprintf(lab, sizeof lab, "%d", o->mb);
                if (o->kind != TREX_OP_FB || w >= 26)
                    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-family=\"sans-serif\" font-size=\"%d\" "
                               "text-anchor=\"middle\" fill=\"%s\">%s</text>\n", x0 + w / 2, y + rh / 2 + 3.5,
                            rh >= 16 ? 10 : 8, o->kind == TREX_OP_W ? "#123" : "white", lab);
            }
        }
        if (run_c)
            svg_rect(f, run_x0, y, run_x1 - run_x0, rh, run_c);
        /* the end of the step: exposed PP point-to-point, DP sync, optimizer, swap (critical path) */
        double t = v->pipe_end;
        const double parts[4] = {r->t_pp, r->t_dp, r->t_optimizer, r->t_swap};
        const char *pc[4] = {C_PP, C_DP, C_OPT, C_SWAP};
        for (int k = 0; k < 4; k++) {
            ax_rect(f, &a, t, t + parts[k], y, rh, pc[k]);
            t += parts[k];
        }
    }
    double yb = top + (double)p * (rh + rg);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", a.lx, yb,
            a.cut ? ax_x(&a, v->t1) : a.rx, yb);
    if (a.cut) {
        double xc = ax_x(&a, v->t1);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", xc + a.gap, yb,
                a.rx, yb);
        for (int k = 0; k < 2; k++)
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\" stroke-width=\"1.5\"/>\n",
                    xc + 10 + 10 * k, yb + 6, xc + 16 + 10 * k, top - 4);
        tl_ticks(f, &a, 0, v->t1, 4, yb);
        tl_ticks(f, &a, a.t2r, end, 4, yb);
        if (v->m_sim < r->m)
            snprintf(lab, sizeof lab, "steady state cut: %.4g s = %.0f x %.4g s (%lld of %lld micro-batches "
                     "simulated, the rest extrapolated)", a.t2r - v->t1, (a.t2r - v->t1) / v->period, v->period,
                     (long long)v->m_sim, (long long)r->m);
        else
            snprintf(lab, sizeof lab, "steady state cut: %.4g s = %.0f x %.4g s", a.t2r - v->t1,
                     (a.t2r - v->t1) / v->period, v->period);
        svg_text(f, xc + a.gap / 2, top - 8, "middle", 10, lab);
    } else {
        tl_ticks(f, &a, 0, end, 8, yb);
    }
    svg_text(f, (a.lx + a.rx) / 2, yb + 30, "middle", 12, "time in the step (s)");
    /* the cost model's step time, when it differs from the simulated one */
    double xs = ax_x(&a, r->step_s);
    if (fabs(r->step_s - v->total) > 1e-3 * r->step_s && r->step_s >= (a.cut ? a.t2r : 0) && xs <= a.rx + 1)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" stroke-dasharray=\"4,3\"/>\n",
                xs, top - 6, xs, yb);
    /* legend */
    struct {
        const char *c, *name;
    } leg[] = {{C_F0, "forward"}, {C_F1, "forward, odd chunk"}, {C_B0, "backward"},
               {C_B1, "backward, odd chunk"}, {C_W, "weight gradient (W)"}, {C_A2A, "exposed all-to-all"},
               {C_IDLE, "idle (bubble)"}, {C_PP, "PP p2p"}, {C_DP, "DP sync"}, {C_OPT, "optimizer"},
               {C_SWAP, "optimizer swap"}, {C_MIX, "ops &lt; 1.5 px, merged"}};
    double lxp = a.lx, ly = yb + 48;
    for (size_t k = 0; k < sizeof leg / sizeof leg[0]; k++) {
        double wtxt = 6.0 * (double)strlen(leg[k].name) + 26;
        if (lxp + wtxt > a.rx) {
            lxp = a.lx;
            ly += 18;
        }
        svg_rect(f, lxp, ly - 10, 12, 12, leg[k].c);
        svg_text(f, lxp + 16, ly, "start", 11, leg[k].name);
        lxp += wtxt;
    }
    double bubble_sim = v->tl.makespan - v->tl.work_max;
    snprintf(lab, sizeof lab, "simulated schedule: pipeline %.4g s (idle on the busiest rank %.4g s), then PP p2p %.3g, "
             "DP sync %.3g, optimizer %.3g, swap %.3g: step %.4g s", v->pipe_end, bubble_sim, r->t_pp, r->t_dp,
             r->t_optimizer, r->t_swap, v->total);
    svg_text(f, a.lx, ly + 22, "start", 10, lab);
    snprintf(lab, sizeof lab, "cost model: step %.4g s with the bubble formula's %.4g s%s", r->step_s, r->t_bubble,
             fabs(r->step_s - v->total) > 1e-3 * r->step_s ? " (dashed line; uneven ranks and hidden "
             "all-to-all make the two differ)" : " (the same)");
    svg_text(f, a.lx, ly + 36, "start", 10, lab);
    svg_text(f, a.lx, ly + 50, "start", 10,
             "a box: the forward or backward of one chunk for one micro-batch (its number); a split box: a "
             "forward (top) and a backward (bottom)");
    svg_text(f, a.lx, ly + 64, "start", 10,
             "of two micro-batches overlapped (F/B numbers); the exposed PP p2p, DP sync and optimizer "
             "are drawn after the last backward");
}

trex_code trex_plan_svg(const char *path, const trex_plan_point *pts, int64_t n, double mem_limit_gib,
                        const trex_plan_result *best, const trex_plan_result *timeline, trex_err *err)
{
    tl_view *view = NULL;
    if (timeline && timeline->n_stages > 0) {
        view = calloc(1, sizeof *view);
        if (!view)
            return trex_err_set(err, TREX_ENOMEM, "--svg: out of memory");
        tl_prepare(view, timeline);
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        if (view)
            trex_plan_timeline_free(&view->tl);
        free(view);
        return trex_err_set(err, TREX_EIO, "--svg %s: cannot create the file", path);
    }
    double W = 900, H1 = 520, H2 = view ? tl_height(view, timeline) : 0;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H1 + H2, W, H1 + H2);
    /* search space: x = memory per device (GiB), y = step time (s, log scale) */
    double xmax = mem_limit_gib * 1.5, ymin = 1e30, ymax = 0;
    for (int64_t i = 0; i < n; i++) {
        if (pts[i].mem_gib > xmax)
            xmax = pts[i].mem_gib;
        if (pts[i].step_s < ymin)
            ymin = pts[i].step_s;
        if (pts[i].step_s > ymax)
            ymax = pts[i].step_s;
    }
    if (xmax > mem_limit_gib * 6)
        xmax = mem_limit_gib * 6;
    if (!(ymax > ymin)) {
        ymax = ymin * 2 + 1;
        ymin = ymin > 0 ? ymin / 2 : 0.1;
    }
    double lx = 80, rx = W - 30, ty = 40, by = H1 - 60;
    double ly0 = log10(ymin * 0.9), ly1 = log10(ymax * 1.1);
#define PX(v) (lx + (fmin(v, xmax) / xmax) * (rx - lx))
#define PY(v) (by - (log10(v) - ly0) / (ly1 - ly0) * (by - ty))
    svg_text(f, W / 2, 24, "middle", 16, "Search space: step time against memory per device");
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#333\"/>\n",
            lx, ty, rx - lx, by - ty);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#c00\" stroke-dasharray=\"6,4\"/>\n",
            PX(mem_limit_gib), ty, PX(mem_limit_gib), by);
    char lab[128];
    snprintf(lab, sizeof lab, "limit %.0f GiB", mem_limit_gib);
    svg_text(f, PX(mem_limit_gib) + 4, ty + 14, "start", 11, lab);
    for (int i = 0; i <= 5; i++) {
        double v = xmax * i / 5.0;
        snprintf(lab, sizeof lab, "%.0f", v);
        svg_text(f, PX(v), by + 16, "middle", 11, lab);
    }
    for (int i = 0; i <= 4; i++) {
        double v = pow(10.0, ly0 + (ly1 - ly0) * i / 4.0);
        snprintf(lab, sizeof lab, "%.3g", v);
        svg_text(f, lx - 6, PY(v) + 4, "end", 11, lab);
    }
    svg_text(f, (lx + rx) / 2, by + 36, "middle", 13, "memory per device (GiB)");
    fprintf(f, "<text x=\"20\" y=\"%.0f\" font-family=\"sans-serif\" font-size=\"13\" "
               "transform=\"rotate(-90 20 %.0f)\" text-anchor=\"middle\">step time (s, log)</text>\n",
            (ty + by) / 2, (ty + by) / 2);
    int64_t stride = n > 20000 ? n / 20000 : 1;
    for (int64_t i = 0; i < n; i += stride)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"%s\" fill-opacity=\"0.5\"/>\n",
                PX(pts[i].mem_gib), PY(pts[i].step_s), pts[i].feasible ? "#2a7" : "#d55");
    if (best) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"6\" fill=\"none\" stroke=\"#000\" stroke-width=\"2\"/>\n",
                PX(best->mem_total / GIB), PY(best->step_s));
        svg_text(f, PX(best->mem_total / GIB) + 8, PY(best->step_s) - 8, "start", 11, "best");
    }
    svg_text(f, rx - 4, by - 20, "end", 11, "green: fits, red: over the memory limit");
    /* the pipeline timeline of one step per rank, below */
#undef PX
#undef PY
    if (view) {
        tl_draw(f, view, timeline, H1, W);
        trex_plan_timeline_free(&view->tl);
        free(view);
    }
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0)
        return trex_err_set(err, TREX_EIO, "--svg %s: write failed", path);
    return TREX_OK;
}
