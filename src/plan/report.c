/* src/plan/report.c — planner reports: JSON objects, table rows, the --explain breakdown and SVG
 * pictures (search space; pipeline timeline of one step). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trex/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

static const char *rec_name(int64_t r)
{
    return r == TREX_RECOMPUTE_NONE ? "none" : r == TREX_RECOMPUTE_SELECTIVE ? "selective" : "full";
}

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
    cJSON_AddStringToObject(o, "recompute", rec_name(l->recompute));
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
        fprintf(out, "%-3s %-3s %-4s %-4s %-3s %-4s %-4s %-10s %-4s %-3s %-11s %9s %8s %11s %6s %7s\n",
                "tp", "pp", "vpp", "ep", "cp", "dp", "zero", "recompute", "swap", "mbs", "schedule",
                "mem GiB", "step s", "tokens/s", "MFU", "TFLOPS");
        return;
    }
    const trex_plan_layout *l = &r->lay;
    fprintf(out, "%-3lld %-3lld %-4lld %-4lld %-3lld %-4lld %-4lld %-10s %-4lld %-3lld %-11s %9.1f %8.2f %11.0f %5.1f%% %7.1f%s\n",
            (long long)l->tp, (long long)l->pp, (long long)l->vpp, (long long)l->ep, (long long)l->cp,
            (long long)l->dp, (long long)l->zero, rec_name(l->recompute), (long long)l->swap_optimizer,
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
    trex_plan_fp32_result g;
    trex_err err = {0};
    if (trex_plan_fp32_evaluate(&m->cfg, &cl->fp32, &mr, &g, &err) != TREX_OK) {
        fprintf(out, "  (model run view: %s)\n", err.msg);
        return;
    }
    fprintf(out, "\nas `trex model run --backward --no-logits` (one pass, dense CSA, %g threads), predicted:\n",
            cl->fp32.threads);
    fprintf(out, "  time: forward %.3f s, backward %.3f s (%lld tokens); CPU time forward %.3f s, backward "
                 "%.3f s\n", g.fwd_s, g.bwd_s, (long long)(mr.B * mr.T), g.cpu_s[0], g.cpu_s[1]);
    fprintf(out, "  memory: peak RSS %.1f MiB; peak by region: params %.1f MiB grads %.1f MiB acts %.1f MiB; "
                 "activations used %.1f MiB of %.1f MiB reserved\n",
            g.rss_peak / MIB, g.params / MIB, g.grads / MIB, g.acts_reserved / MIB, g.acts_end / MIB,
            g.acts_reserved / MIB);
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

trex_code trex_plan_svg(const char *path, const trex_plan_point *pts, int64_t n, double mem_limit_gib,
                        const trex_plan_result *best, const trex_plan_result *timeline, trex_err *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return trex_err_set(err, TREX_EIO, "--svg %s: cannot create the file", path);
    double W = 900, H1 = 520, H2 = timeline ? 60.0 + 34.0 * (double)timeline->n_stages + 60.0 : 0;
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
    /* timeline: one step per pipeline rank (forward, backward, exposed communication, idle) */
    if (timeline && timeline->n_stages > 0) {
        const trex_plan_result *r = timeline;
        double y0 = H1 + 30, total = r->step_s;
        svg_text(f, W / 2, y0 - 6, "middle", 16, "Pipeline timeline of one step (per rank)");
        double p = (double)r->n_stages, mb = (double)r->m;
        for (int64_t s = 0; s < r->n_stages; s++) {
            double y = y0 + 10 + 34.0 * (double)s;
            double unit = (rx - lx) / total;
            double warm = (double)s * (r->stage_f[s]) / (r->lay.schedule == TREX_SCHED_INTERLEAVED ? (double)r->lay.vpp : 1.0);
            double busy = mb * (r->stage_f[s] + r->stage_b[s]);
            double comm = mb * r->stage_comm[s];
            double x = lx;
            snprintf(lab, sizeof lab, "rank %lld", (long long)s);
            svg_text(f, lx - 6, y + 18, "end", 11, lab);
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"24\" fill=\"#ddd\"/>\n", x, y, warm * unit);
            x += warm * unit;
            double fw = mb * r->stage_f[s] * unit, bw = mb * r->stage_b[s] * unit;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"24\" fill=\"#4a8\"/>\n", x, y, fw);
            x += fw;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"24\" fill=\"#48c\"/>\n", x, y, bw);
            x += bw;
            double cw = fmin(comm * unit, rx - x);
            if (cw > 0)
                fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"24\" fill=\"#e94\"/>\n", x, y, cw);
            (void)busy;
            (void)p;
        }
        double yl = y0 + 10 + 34.0 * p + 16;
        svg_text(f, lx, yl, "start", 11,
                 "grey: fill bubble   green: forward   blue: backward (+recompute)   orange: exposed all-to-all");
        snprintf(lab, sizeof lab, "0 s ... %.2f s (optimizer, DP sync and drain at the end)", total);
        svg_text(f, rx, yl, "end", 11, lab);
    }
#undef PX
#undef PY
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0)
        return trex_err_set(err, TREX_EIO, "--svg %s: write failed", path);
    return TREX_OK;
}
