/* train/metrics.c — what a training run shows and records: the progress line, RUN/metrics.jsonl (one
 * JSON object per step), the JSONL files' truncation on resume, and the model FLOPs of a step (the
 * planner's convention, docs/mfu.md). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>


#include "kernels/dispatch.h"
#include "trex/io.h"
#include "trex/plan.h"
#include "train/train_internal.h"
#include "trex/prof.h"

#define JSONL_MAX_BYTES ((size_t)1 << 30)

trex_code trex_train_step_flops(const trex_config *cfg, int64_t seq, int64_t gbs, trex_optim_kind kind,
                                double *flops, trex_err *err)
{
    trex_plan_model *pm = calloc(1, sizeof *pm);
    if (!pm)
        return trex_err_set(err, TREX_ENOMEM, "out of memory for the FLOP model");
    trex_code rc = trex_plan_model_from_config(pm, cfg, seq, err);
    if (rc == TREX_OK) {
        /* as trex_plan_evaluate counts a step (src/plan/cost.c) */
        double f = (double)gbs * (double)seq * pm->model_flops_per_token;
        if (kind == TREX_OPTIM_MUON) {
            double ns = 0;
            for (int64_t i = 0; i < pm->n_blocks; i++)
                ns += pm->blocks[i].ns_flops_dense + pm->blocks[i].ns_flops_expert;
            f += (double)pm->ns_iters * ns;
        }
        *flops = f;
    }
    free(pm);
    return rc;
}

/* ---- the peak of the MFU denominator ------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define PEAK_MAX_THREADS 1024
#define PEAK_MAX_REPS 64

typedef struct peak_job {
    trex_peak_fn fn;
    int64_t iters;
    double flops[PEAK_MAX_THREADS];
} peak_job;

static void peak_slot(void *arg, int64_t b, int64_t e, int tid)
{
    (void)tid;
    peak_job *j = arg;
    for (int64_t w = b; w < e; w++)
        j->flops[w] = j->fn(j->iters);
}

double trex_train_measure_peak(trex_pool *pool, trex_dtype compute, double secs, int reps, double *per_cpu,
                               const char **what)
{
    const trex_kernel_table *kt = trex_kernels_table();
    trex_peak_fn fn = NULL;
    const char *name = "none";
    if (compute == TREX_BF16 && kt->peak_bf16_amx) {
        fn = kt->peak_bf16_amx;
        name = "amx_bf16";
    } else if (compute == TREX_BF16 && kt->peak_bf16_dp) {
        fn = kt->peak_bf16_dp;
        name = "avx512_bf16";
    } else if (kt->peak_f32_fma) {
        /* fp32; or bf16 at a level without a bf16 unit (avx2, avx512f), whose bf16 products are fp32 FMAs */
        fn = kt->peak_f32_fma;
        name = kt->peak_f32_fma_name ? kt->peak_f32_fma_name : "fp32_fma";
    }
    if (what)
        *what = name;
    if (per_cpu)
        *per_cpu = 0;
    if (!fn)
        return 0;
    reps = reps < 1 ? 1 : reps > PEAK_MAX_REPS ? PEAK_MAX_REPS : reps;
    int threads = pool ? trex_pool_size(pool) : 1;
    threads = threads > PEAK_MAX_THREADS ? PEAK_MAX_THREADS : threads;
    peak_job *j = calloc(1, sizeof *j);
    TREX_ASSERT(j);
    j->fn = fn;
    j->iters = 1000;
    for (;;) { /* calibrate on this thread: grow until one run takes 20 ms */
        const double t0 = trex_wall_s();
        fn(j->iters);
        const double dt = trex_wall_s() - t0;
        if (dt > 0.02) {
            j->iters = (int64_t)((double)j->iters * secs / dt) + 1;
            break;
        }
        j->iters *= 4;
    }
    double v[PEAK_MAX_REPS], u[PEAK_MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = trex_wall_s(), c0 = trex_cpu_s(), total = 0;
        if (threads > 1) {
            trex_pool_for(pool, threads, 1, peak_slot, j);
            for (int w = 0; w < threads; w++)
                total += j->flops[w];
        } else {
            total = fn(j->iters);
        }
        v[r] = total / (trex_wall_s() - t0) / 1e12;
        t0 = trex_wall_s();
        c0 = trex_cpu_s();
        const double one = fn(j->iters);
        u[r] = one / (trex_cpu_s() - c0) / 1e12 * threads;
    }
    free(j);
    qsort(v, (size_t)reps, sizeof *v, cmp_double);
    qsort(u, (size_t)reps, sizeof *u, cmp_double);
    if (per_cpu)
        *per_cpu = reps % 2 ? u[reps / 2] : 0.5 * (u[reps / 2 - 1] + u[reps / 2]);
    return reps % 2 ? v[reps / 2] : 0.5 * (v[reps / 2 - 1] + v[reps / 2]);
}

/* Keeps the lines of buf whose "step" is <= keep_step and that parse as JSON objects. */
static size_t filter_lines(char *buf, size_t len, int64_t keep_step)
{
    size_t w = 0, i = 0;
    while (i < len) {
        char *nl = memchr(buf + i, '\n', len - i);
        if (!nl) /* a last line without its newline was cut by a crash */
            break;
        const size_t n = (size_t)(nl - (buf + i)) + 1;
        *nl = 0;
        cJSON *j = cJSON_Parse(buf + i);
        *nl = '\n';
        const cJSON *st = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
        if (cJSON_IsNumber(st) && st->valuedouble <= (double)keep_step) {
            memmove(buf + w, buf + i, n);
            w += n;
        }
        cJSON_Delete(j);
        i += n;
    }
    return w;
}

trex_code train_jsonl_open(FILE **out, const char *run, const char *name, int64_t keep_step, trex_err *err)
{
    char path[TREX_TRAIN_PATH + 64];
    snprintf(path, sizeof path, "%s/%s", run, name);
    char *buf = NULL;
    size_t len = 0;
    if (keep_step > 0) {
        trex_err e2;
        trex_code rc = trex_file_read(path, JSONL_MAX_BYTES, &buf, &len, &e2);
        if (rc == TREX_OK) {
            len = filter_lines(buf, len, keep_step);
        } else {
            free(buf);
            buf = NULL;
            len = 0;
        }
    }
    trex_code rc = trex_file_write_atomic(path, buf ? buf : "", len, err);
    free(buf);
    if (rc != TREX_OK)
        return rc;
    *out = fopen(path, "a");
    if (!*out)
        return trex_err_set(err, TREX_EIO, "%s: cannot open for appending", path);
    return TREX_OK;
}

static void put_real(char *buf, size_t cap, size_t *k, const char *key, double v)
{
    if (*k >= cap)
        return;
    if (isfinite(v))
        *k += (size_t)snprintf(buf + *k, cap - *k, ",\"%s\":%.17g", key, v);
    else
        *k += (size_t)snprintf(buf + *k, cap - *k, ",\"%s\":null", key);
}

static void put_int(char *buf, size_t cap, size_t *k, const char *key, int64_t v)
{
    if (*k < cap)
        *k += (size_t)snprintf(buf + *k, cap - *k, ",\"%s\":%" PRId64, key, v);
}

trex_code train_metrics_write(FILE *f, const train_metrics *m, trex_err *err)
{
    char buf[2048];
    const size_t cap = sizeof buf;
    size_t k = (size_t)snprintf(buf, cap, "{\"step\":%" PRId64, m->step);
    put_real(buf, cap, &k, "loss", m->loss);
    put_real(buf, cap, &k, "loss_main", m->main);
    put_real(buf, cap, &k, "loss_mtp", m->mtp);
    put_real(buf, cap, &k, "loss_balance", m->balance);
    put_real(buf, cap, &k, "loss_indexer", m->indexer);
    put_real(buf, cap, &k, "mtp_weight", m->mtp_weight);
    put_real(buf, cap, &k, "lr", m->lr);
    put_real(buf, cap, &k, "grad_norm", m->grad_norm);
    put_real(buf, cap, &k, "clip_scale", m->clip_scale);
    if (k < cap)
        k += (size_t)snprintf(buf + k, cap - k, ",\"skipped\":%s", m->skipped ? "true" : "false");
    put_int(buf, cap, &k, "nonfinite", m->nonfinite);
    put_int(buf, cap, &k, "skipped_total", m->skipped_total);
    put_int(buf, cap, &k, "targets", m->main_targets);
    put_int(buf, cap, &k, "mtp_targets", m->mtp_targets);
    put_int(buf, cap, &k, "tokens", m->tokens);
    put_real(buf, cap, &k, "step_s", m->step_s);
    put_real(buf, cap, &k, "tokens_per_s", m->tokens_per_s);
    put_real(buf, cap, &k, "tflops", m->tflops);
    put_real(buf, cap, &k, "mfu", m->mfu >= 0 ? m->mfu : NAN);
    put_real(buf, cap, &k, "peak_rss_mib", m->peak_rss_mib);
    put_real(buf, cap, &k, "mem_mib", m->mem_mib);
    if (k < cap)
        k += (size_t)snprintf(buf + k, cap - k, ",\"attention\":\"%s\",\"indexer_warmup\":%s",
                              m->sparse ? "sparse" : "dense", m->warmup ? "true" : "false");
    if (m->have_eval) {
        put_real(buf, cap, &k, "eval_loss", m->eval_main);
        put_real(buf, cap, &k, "eval_loss_mtp", m->eval_mtp);
        put_int(buf, cap, &k, "eval_targets", m->eval_targets);
    }
    if (k + 2 >= cap)
        TREX_ABORT("metrics line longer than %zu bytes", cap);
    buf[k++] = '}';
    buf[k++] = '\n';
    if (fwrite(buf, 1, k, f) != k || fflush(f) != 0)
        return trex_err_set(err, TREX_EIO, "metrics.jsonl: write failed (disk full?)");
    return TREX_OK;
}

static void fmt_duration(char *buf, size_t cap, double s)
{
    if (!isfinite(s) || s < 0)
        snprintf(buf, cap, "?");
    else if (s < 60)
        snprintf(buf, cap, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else
        snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

void train_progress(FILE *out, bool tty, const train_metrics *m)
{
    char eta[32], mfu[32];
    fmt_duration(eta, sizeof eta, m->eta_s);
    if (m->mfu >= 0)
        snprintf(mfu, sizeof mfu, "%.2f%%", 100.0 * m->mfu);
    else
        snprintf(mfu, sizeof mfu, "?");
    char line[512];
    int w = (int)log10((double)(m->steps > 0 ? m->steps : 1)) + 1;
    if (m->skipped)
        snprintf(line, sizeof line, "step %*" PRId64 "/%" PRId64 "  SKIPPED (%" PRId64 " non-finite gradients, loss %g)"
                 "  %" PRId64 " in a row  ETA %s",
                 w, m->step, m->steps, m->nonfinite, m->loss, m->bad_streak, eta);
    else
        snprintf(line, sizeof line,
                 "step %*" PRId64 "/%" PRId64 "  loss %.4f  mtp %.4f  lr %.2e  gnorm %.3f  %.0f tok/s  MFU %s  "
                 "mem %.0f MiB  ETA %s%s",
                 w, m->step, m->steps, m->main, m->mtp, m->lr, m->grad_norm, m->tokens_per_s, mfu,
                 m->peak_rss_mib, eta, m->warmup ? "  [indexer warm-up]" : "");
    if (tty)
        fprintf(out, "\r%s\033[K", line);
    else
        fprintf(out, "%s\n", line);
    fflush(out);
}
