/* train/train.c — the training loop: `trex train` as a library call.
 *
 * One step (docs/train.md):
 *   1. read gbs sequences at the data position (train_data.c) and count each micro-batch's targets;
 *   2. for each of the K = gbs/mbs micro-batches: forward + backward of the model, adding into one
 *      gradient buffer, with per-micro-batch weights chosen so that the sum is the gradient of the
 *      global-batch objective (token means over all targets of the step; see "Means" below);
 *   3. during the indexer warm-up, zero every gradient but the indexer's (dense attention);
 *   4. NaN/Inf in the loss or any gradient: skip (nothing changes), log, count; else clip, step
 *      (trex_optimizer_update; in bf16 mode it also writes the bf16 weight copies, see
 *      setup_step), and the aux-loss-free bias update from the step's expert loads;
 *   5. metrics line, progress line, expert loads, evaluation and checkpoint when due.
 *
 * Means. The model returns token means over one micro-batch (main over n_k targets, MTP over m_k) and
 * their gradient. The step's objective is  sum_k (n_k/N) main_k + lambda sum_k (m_k/M) mtp_k
 * + (1/K) sum_k (bal_k + w_I idx_k)  with N = sum n_k, M = sum m_k. Micro-batch k's gradient enters
 * with weight c_k = n_k/N (1/K when n_k = 0) and is computed with mtp_weight lambda (m_k/M)/c_k,
 * balance_weight alpha/(K c_k) and indexer_weight w_I/(K c_k), so c_k times it is exactly micro-batch
 * k's share. The weights are applied without a second buffer: before micro-batch k the buffer is
 * multiplied by c_{k-1}/c_k, at the end by c_K (each skipped when it is 1; K = 1 never scales). */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/dispatch.h"
#include "trex/checkpoint.h"
#include "trex/io.h"
#include "trex/model.h"
#include "trex/params.h"
#include "trex/plan.h"
#include "trex/pool.h"
#include "trex/rng.h"
#include "train/train_internal.h"
#include "trex/prof.h"

#define DATA_SEED_SALT 0x6461746120726e67ull /* as train_data.c: the checkpoint's RNG is the data order's */

typedef struct range {
    int64_t off, n;
} range;

typedef struct trainer {
    trex_train_settings s;
    const trex_train_faults *faults;
    trex_config cfg;
    trex_tokenizer *tok;
    trex_pool *pool;
    trex_mem mem;
    trex_weights w;
    bool have_w;
    float *grads;
    trex_optimizer *opt;
    trex_model *model;
    train_loader data, eval;
    bool have_eval;
    int64_t K;                   /* micro-batches per step */
    int32_t *tokens, *docs;      /* [gbs, seq] */
    uint8_t *mask;
    int64_t *mb_main, *mb_mtp;   /* [K] targets per micro-batch */
    int64_t E, nblocks;
    int64_t *load;               /* [nblocks, E] tokens per expert this step */
    int64_t *bias_off;           /* [nblocks] gate.bias offset, -1 for hash layers */
    range *frozen;               /* trainable tensors other than the indexer's (zeroed in warm-up) */
    int64_t n_frozen;
    double weight_decay;         /* the settings' (0 during the warm-up) */
    double flops_step, peak_tflops;
    const char *peak_what;       /* where peak_tflops came from, for the start line */
    FILE *metrics, *loads;
    int64_t start_step;
    bool tty, line_open;
    char path[TREX_TRAIN_PATH + 64];
} trainer;

/* Ends a progress line redrawn in place before other output. */
static void end_line(trainer *t)
{
    if (t->line_open) {
        fputc('\n', stdout);
        t->line_open = false;
    }
}

static const char *run_path(trainer *t, const char *name)
{
    snprintf(t->path, sizeof t->path, "%s/%s", t->s.out, name);
    return t->path;
}

static bool file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static trex_code copy_file(const char *from, const char *to, trex_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    trex_code rc = trex_file_read(from, (size_t)1 << 30, &buf, &len, err);
    if (rc == TREX_OK)
        rc = trex_file_write_atomic(to, buf, len, err);
    free(buf);
    return rc;
}

trex_code trex_train_resume_settings(trex_train_settings *s, const char *run, trex_err *err)
{
    char p[TREX_TRAIN_PATH + 64];
    snprintf(p, sizeof p, "%s/settings.json", run);
    if (!file_exists(p))
        return trex_err_set(err, TREX_ENOTFOUND,
                            "--resume %s: %s is missing: the directory is not a trex training run (start one with "
                            "--out %s)",
                            run, p, run);
    cJSON *j = NULL;
    TREX_TRY(trex_json_load(p, &j, err));
    trex_train_defaults(s);
    trex_code rc = trex_train_settings_from_json(s, j, p, err);
    cJSON_Delete(j);
    if (rc != TREX_OK)
        return rc;
    snprintf(s->config, sizeof s->config, "%s/config.json", run);
    snprintf(s->tokenizer, sizeof s->tokenizer, "%s/tokenizer.json", run);
    snprintf(s->out, sizeof s->out, "%s", run);
    s->resume = true;
    return TREX_OK;
}

/* ---- setup ---------------------------------------------------------------------------------------- */

static trex_code alloc_buf(trainer *t, void **p, trex_region r, size_t bytes, const char *what, trex_err *err)
{
    *p = trex_mem_alloc(&t->mem, r, bytes);
    if (!*p)
        return trex_err_set(err, TREX_ENOMEM, "out of memory for %s (%zu bytes)", what, bytes);
    return TREX_OK;
}

static trex_code check_run_dir(trainer *t, char *ckpt, size_t cap, trex_err *err)
{
    const trex_train_settings *s = &t->s;
    if (s->resume) {
        trex_train_settings saved;
        TREX_TRY(trex_train_resume_settings(&saved, s->out, err));
        char va[TREX_TRAIN_PATH], vb[TREX_TRAIN_PATH];
        const char *f = trex_train_settings_fixed_diff(&saved, s, va, vb, sizeof va);
        if (f)
            return trex_err_set(err, TREX_EINVAL,
                                "--resume %s: %s = %s, but the run was started with %s = %s (%s/settings.json); a "
                                "resumed run keeps seq, gbs, mbs, data_order, optimizer, seed, deterministic and "
                                "precision — "
                                "drop the flag, or start a new run with --out",
                                s->out, f, vb, f, va, s->out);
        if (s->deterministic) {
            cJSON *j = NULL;
            TREX_TRY(trex_json_load(run_path(t, "settings.json"), &j, err));
            const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "kernels");
            const char *now = trex_isa_name(trex_kernels_isa());
            const bool same = cJSON_IsString(k) && !strcmp(k->valuestring, now);
            char was[32];
            snprintf(was, sizeof was, "%s", cJSON_IsString(k) ? k->valuestring : "?");
            cJSON_Delete(j);
            if (!same)
                return trex_err_set(err, TREX_EINVAL,
                                    "--resume %s --deterministic: the run used kernel level '%s' but this process uses "
                                    "'%s': set TREX_ISA=%s to continue it bit for bit",
                                    s->out, was, now, was);
        }
        trex_err e2;
        if (trex_ckpt_latest(s->out, ckpt, cap, &t->start_step, &e2) != TREX_OK)
            return trex_err_set(err, TREX_ENOTFOUND,
                                "--resume %s: the run has no complete checkpoint (no step-N directory with a "
                                "manifest.json): start it again with --out, or use --save-every",
                                s->out);
        return TREX_OK;
    }
    if (file_exists(run_path(t, "settings.json")) || file_exists(run_path(t, "metrics.jsonl")))
        return trex_err_set(err, TREX_EINVAL,
                            "--out %s already holds a training run (%s exists): continue it with --resume %s, or "
                            "choose another --out (nothing was changed)",
                            s->out, t->path, s->out);
    trex_err e2;
    if (trex_ckpt_latest(s->out, ckpt, cap, NULL, &e2) != TREX_ENOTFOUND)
        return trex_err_set(err, TREX_EINVAL,
                            "--out %s already holds checkpoints: continue with --resume %s, or choose another --out",
                            s->out, s->out);
    return TREX_OK;
}

static trex_code load_weights(trainer *t, const char *ckpt, trex_err *err)
{
    const trex_train_settings *s = &t->s;
    if (s->resume) {
        trex_ckpt_state st;
        trex_code rc = trex_ckpt_read_state(ckpt, &t->cfg, &st, err);
        if (rc != TREX_OK) {
            trex_err_prefix(err, "--resume %s", s->out);
            return rc;
        }
        char src[TREX_CKPT_SOURCE];
        train_loader_source(&t->data, src, sizeof src);
        if (strcmp(src, st.data_source))
            return trex_err_set(err, TREX_EINVAL,
                                "--resume %s: %s was trained on data \"%s\" but --data %s is \"%s\": resume with the "
                                "same shards",
                                s->out, ckpt, st.data_source, s->data, src);
        const int64_t pos = st.data_epoch * t->data.n + st.data_offset;
        if (st.step != t->start_step || pos != st.step * s->gbs)
            return trex_err_set(err, TREX_EFORMAT,
                                "%s/trainer.json: step %" PRId64 ", data position %" PRId64 " do not match step-%" PRId64
                                " with gbs %" PRId64 ": the checkpoint is not from this run",
                                ckpt, st.step, pos, t->start_step, s->gbs);
        if (st.compute != s->compute)
            return trex_err_set(err, TREX_EINVAL,
                                "--resume %s: %s was trained with --precision %s but this run asks for %s: resume with "
                                "--precision %s (a run keeps its precision)",
                                s->out, ckpt, st.compute == TREX_BF16 ? "bf16" : "fp32",
                                s->compute == TREX_BF16 ? "bf16" : "fp32", st.compute == TREX_BF16 ? "bf16" : "fp32");
        /* the run's copy of the config is RUN/config.json: keep the name the run started with */
        snprintf(t->cfg.name, sizeof t->cfg.name, "%s", st.config_name);
        rc = trex_ckpt_load(ckpt, &t->cfg, &t->mem, &t->w, NULL, &st, err);
        t->have_w = rc == TREX_OK;
        return rc;
    }
    trex_code rc;
    if (s->init[0])
        rc = trex_weights_load(&t->w, &t->cfg, s->init, &t->mem, err);
    else
        rc = trex_weights_init_pool(t->pool, &t->w, &t->cfg, s->seed, &t->mem, err);
    t->have_w = rc == TREX_OK;
    if (rc != TREX_OK && s->init[0])
        trex_err_prefix(err, "--init");
    return rc;
}

static trex_code plan_views(trainer *t, trex_err *err)
{
    const trex_config *c = &t->cfg;
    const trex_layout *lay = &t->w.layout;
    t->E = c->n_routed_experts;
    t->nblocks = trex_config_n_blocks(c);
    TREX_TRY(alloc_buf(t, (void **)&t->load, TREX_REGION_BUFFERS, (size_t)(t->nblocks * t->E) * sizeof *t->load,
                       "expert loads", err));
    TREX_TRY(alloc_buf(t, (void **)&t->bias_off, TREX_REGION_BUFFERS, (size_t)t->nblocks * sizeof *t->bias_off,
                       "bias offsets", err));
    for (int64_t b = 0; b < t->nblocks; b++) {
        char name[TREX_PARAM_NAME];
        if (b < c->num_hidden_layers)
            snprintf(name, sizeof name, "layers.%" PRId64 ".ffn.gate.bias", b);
        else
            snprintf(name, sizeof name, "mtp.0.ffn.gate.bias");
        const trex_param *p = trex_layout_find(lay, name);
        t->bias_off[b] = p && !trex_config_is_hash(c, b) ? p->offset : -1;
    }
    TREX_TRY(alloc_buf(t, (void **)&t->frozen, TREX_REGION_BUFFERS, (size_t)(lay->count + 1) * sizeof *t->frozen,
                       "warm-up ranges", err));
    for (int64_t i = 0; i < lay->count; i++) {
        const trex_param *p = &lay->params[i];
        if (p->trainable && !p->is_int && !strstr(p->name, ".attn.indexer."))
            t->frozen[t->n_frozen++] = (range){p->offset, p->numel};
    }
    return TREX_OK;
}

/* What a step needs once the config, the pool and the weights are there: gradients, the optimizer
 * (fresh state), the model, the batch buffers, the views of plan_views and the FLOPs of a step. Shared
 * by trex_train_run and trex_train_bench. */
bool trex_train_copies_as_panels(trex_model_recompute recompute)
{
    return recompute != TREX_MODEL_RECOMPUTE_ATTENTION && recompute != TREX_MODEL_RECOMPUTE_ATTENTION_KEEP_CORE &&
           recompute != TREX_MODEL_RECOMPUTE_MOE;
}

static trex_code setup_step(trainer *t, trex_err *err)
{
    const trex_train_settings *s = &t->s;
    const trex_layout *lay = &t->w.layout;
    TREX_TRY(alloc_buf(t, (void **)&t->grads, TREX_REGION_GRADS, (size_t)lay->n_float * sizeof(float), "gradients",
                       err));
    trex_optimizer_settings os = s->opt;
    os.total_steps = s->steps;
    t->weight_decay = os.weight_decay;
    TREX_TRY(trex_optimizer_create(&t->opt, lay, &t->cfg, &os, trex_pool_size(t->pool), &t->mem, err));
    /* bf16 products read bf16 copies of the experts' weights, rewritten after every change of the
     * weights (trex_weights_changed below; docs/params.md "bf16 compute copies"): as packed panels of
     * both products (2 bytes per weight more), with the attention's projections, under --recompute none,
     * full and full-keep-core, as rows of the experts' alone under attention, attention-keep-core and
     * moe, whose dsv4-bench T = 4096 peaks have no room for them */
    if (s->compute == TREX_BF16 && s->weight_copies) {
        const trex_wcopy_layout wl = trex_train_copies_as_panels(s->recompute) ? TREX_WCOPY_PANELS : TREX_WCOPY_ROWS;
        TREX_TRY(trex_weights_bf16_enable(t->pool, &t->w, wl, err));
        TREX_TRY(trex_optimizer_set_copies(t->opt, t->w.f, t->w.bf16, err)); /* written by each step */
    }
    TREX_TRY(trex_model_create(&t->model, &t->w, t->pool, &t->mem, err));
    t->K = s->gbs / s->mbs;
    const size_t n = (size_t)(s->gbs * s->seq);
    TREX_TRY(alloc_buf(t, (void **)&t->tokens, TREX_REGION_BUFFERS, n * sizeof *t->tokens, "the batch", err));
    TREX_TRY(alloc_buf(t, (void **)&t->docs, TREX_REGION_BUFFERS, n * sizeof *t->docs, "the batch", err));
    TREX_TRY(alloc_buf(t, (void **)&t->mask, TREX_REGION_BUFFERS, n, "the batch", err));
    TREX_TRY(alloc_buf(t, (void **)&t->mb_main, TREX_REGION_BUFFERS, (size_t)t->K * sizeof(int64_t), "counts", err));
    TREX_TRY(alloc_buf(t, (void **)&t->mb_mtp, TREX_REGION_BUFFERS, (size_t)t->K * sizeof(int64_t), "counts", err));
    TREX_TRY(plan_views(t, err));
    return trex_train_step_flops(&t->cfg, s->seq, s->gbs, s->opt.kind, &t->flops_step, err);
}

static trex_code setup(trainer *t, trex_err *err)
{
    trex_train_settings *s = &t->s;
    char ckpt[TREX_TRAIN_PATH + 64] = "";
    TREX_TRY(trex_train_settings_check(s, err));
    TREX_TRY(trex_kernels_init(err));
    TREX_TRY(check_run_dir(t, ckpt, sizeof ckpt, err));
    trex_code rc = trex_config_load(&t->cfg, s->config, err);
    if (rc != TREX_OK) {
        trex_err_prefix(err, "--config");
        return rc;
    }
    rc = trex_tok_load(&t->tok, s->tokenizer, err);
    if (rc != TREX_OK) {
        trex_err_prefix(err, "--tokenizer");
        return rc;
    }
    if (trex_tok_vocab_size(t->tok) > t->cfg.vocab_size)
        return trex_err_set(err, TREX_EINVAL,
                            "--tokenizer %s has %d ids but config %s has vocab_size %" PRId64
                            ": use a config with vocab_size >= %d (docs/train.md)",
                            s->tokenizer, (int)trex_tok_vocab_size(t->tok), s->config, t->cfg.vocab_size,
                            (int)trex_tok_vocab_size(t->tok));
    TREX_TRY(trex_pool_create_checked(&t->pool, (int)s->threads, err));
    TREX_TRY(train_loader_open(&t->data, s->data, t->tok, &s->seq, t->cfg.vocab_size, "--data", s->shuffle, s->seed,
                               &t->mem, err));
    if (s->eval_data[0]) {
        int64_t seq = s->seq;
        TREX_TRY(train_loader_open(&t->eval, s->eval_data, t->tok, &seq, t->cfg.vocab_size, "--eval-data", false, 0,
                                   &t->mem, err));
        t->have_eval = true;
    }
    TREX_TRY(load_weights(t, ckpt, err));
    TREX_TRY(setup_step(t, err));
    if (s->resume) {
        char op[TREX_TRAIN_PATH + 96];
        snprintf(op, sizeof op, "%s/optim.safetensors", ckpt);
        TREX_TRY(trex_optimizer_load(t->opt, op, err));
    }
    t->peak_tflops = s->peak_tflops;
    if (t->peak_tflops <= 0 && s->compute == TREX_BF16) {
        /* the cluster file's peak is the fp32 engine's; bf16 products run on AMX (docs/mfu.md). As the
         * cluster file's figure: the one-thread rate per CPU-second times the threads (load-independent) */
        double per_cpu = 0;
        trex_train_measure_peak(t->pool, TREX_BF16, 0.1, 3, &per_cpu, &t->peak_what);
        t->peak_tflops = per_cpu;
        if (t->peak_tflops <= 0)
            fprintf(stderr, "trex train: warning: no bf16 peak loop at kernel level %s: MFU unknown; pass "
                            "--peak-tflops\n", trex_isa_name(trex_kernels_isa()));
    } else if (t->peak_tflops <= 0 && s->cluster[0]) {
        trex_cluster cl;
        trex_err e2;
        if (trex_plan_cluster_load(&cl, s->cluster, &e2) == TREX_OK)
            t->peak_tflops = cl.peak_bf16_tflops;
        else
            fprintf(stderr, "trex train: warning: no peak for MFU (%s); pass --peak-tflops or --cluster\n", e2.msg);
    }
    /* the run directory: copies of the config and tokenizer, the effective settings, the logs */
    if (!s->resume) {
        TREX_TRY(trex_mkdirs(s->out, err));
        TREX_TRY(copy_file(s->config, run_path(t, "config.json"), err));
        TREX_TRY(copy_file(s->tokenizer, run_path(t, "tokenizer.json"), err));
    }
    cJSON *sj = trex_train_settings_to_json(s);
    cJSON_AddStringToObject(sj, "kernels", trex_isa_name(trex_kernels_isa()));
    rc = trex_json_save(run_path(t, "settings.json"), sj, err);
    cJSON_Delete(sj);
    if (rc != TREX_OK)
        return rc;
    TREX_TRY(train_jsonl_open(&t->metrics, s->out, "metrics.jsonl", t->start_step, err));
    TREX_TRY(train_jsonl_open(&t->loads, s->out, "expert_load.jsonl", t->start_step, err));
    t->data.pos = t->start_step * s->gbs;
    t->tty = isatty(fileno(stdout));
    return TREX_OK;
}

/* ---- one step ------------------------------------------------------------------------------------- */

typedef struct scale_job {
    float *g;
    int64_t n;
    float f;
} scale_job;

static void scale_chunk(void *arg, int64_t b, int64_t e, int tid)
{
    (void)tid;
    scale_job *j = arg;
    for (int64_t i = b; i < e; i++)
        j->g[i] *= j->f;
}

static void scale_grads(trainer *t, double f)
{
    scale_job j = {t->grads, t->w.layout.n_float, (float)f};
    trex_pool_for(t->pool, j.n, 1 << 16, scale_chunk, &j);
}

static double mtp_weight_at(const trainer *t)
{
    const trex_train_settings *s = &t->s;
    const int64_t done = trex_optimizer_step_count(t->opt);
    int64_t at = s->mtp_switch;
    if (at < 0)
        at = s->opt.schedule == TREX_LR_COSINE ? s->opt.warmup_steps : INT64_MAX;
    return done < at ? s->mtp_weight : s->mtp_weight_late;
}

static bool fault_nan(const trainer *t, int64_t step)
{
    if (!t->faults)
        return false;
    for (int64_t i = 0; i < t->faults->n_nan_steps; i++)
        if (t->faults->nan_steps[i] == step)
            return true;
    return false;
}

/* One step on the global batch in t->tokens / t->mask / t->docs (steps 2-4 of the header). */
static trex_code train_step(trainer *t, int64_t step, train_metrics *m, trex_err *err)
{
    const trex_train_settings *s = &t->s;
    const int64_t T = s->seq, mbs = s->mbs, K = t->K;
    const bool mtp = t->cfg.num_nextn_predict_layers > 0;
    int64_t N = 0, M = 0;
    for (int64_t k = 0; k < K; k++) {
        train_count_targets(t->mask + k * mbs * T, t->docs + k * mbs * T, mbs, T, mtp, &t->mb_main[k], &t->mb_mtp[k]);
        N += t->mb_main[k];
        M += t->mb_mtp[k];
    }
    const bool warm = step <= s->indexer_warmup;
    const double lam = mtp_weight_at(t);
    memset(t->load, 0, (size_t)(t->nblocks * t->E) * sizeof *t->load);
    double sum_main = 0, sum_mtp = 0, bal = 0, idx = 0, c_prev = 1.0;
    for (int64_t k = 0; k < K; k++) {
        const double c = t->mb_main[k] > 0 ? (double)t->mb_main[k] / (double)N : 1.0 / (double)K;
        trex_model_opts o = trex_model_opts_default();
        o.sparse = !warm && s->sparse;
        o.mtp_weight = M > 0 ? lam * ((double)t->mb_mtp[k] / (double)M) / c : lam;
        o.balance_weight = s->balance_weight / ((double)K * c);
        o.indexer_weight = s->indexer_weight / ((double)K * c);
        o.compute = s->compute;
        o.recompute = s->recompute;
        o.grads_zero = k == 0; /* the first micro-batch writes every gradient (none cleared here) */
        if (k > 0 && c != c_prev)
            scale_grads(t, c_prev / c);
        const int64_t off = k * mbs * T;
        trex_batch b = {mbs, T, t->tokens + off, t->mask + off, t->docs + off};
        trex_losses l;
        trex_code rc = trex_model_forward(t->model, &b, &o, t->grads, NULL, NULL, &l, err);
        if (rc != TREX_OK) {
            trex_err_prefix(err, "step %" PRId64 ", micro-batch %" PRId64, step, k);
            return rc;
        }
        TREX_ASSERT(l.main_targets == t->mb_main[k] && l.mtp_targets == (mtp ? t->mb_mtp[k] : 0));
        trex_model_backward(t->model);
        sum_main += l.main * (double)l.main_targets;
        sum_mtp += l.mtp * (double)l.mtp_targets;
        bal += c * l.balance;
        idx += l.indexer / (double)K;
        for (int64_t bl = 0; bl < t->nblocks; bl++) {
            const int64_t *ld = trex_model_expert_load(t->model, bl);
            for (int64_t e = 0; e < t->E; e++)
                t->load[bl * t->E + e] += ld[e];
        }
        c_prev = c;
    }
    if (c_prev != 1.0)
        scale_grads(t, c_prev);
    if (warm)
        for (int64_t i = 0; i < t->n_frozen; i++)
            memset(t->grads + t->frozen[i].off, 0, (size_t)t->frozen[i].n * sizeof(float));
    if (fault_nan(t, step))
        t->grads[t->frozen[0].off] = NAN;

    m->main = N > 0 ? sum_main / (double)N : 0.0;
    m->mtp = M > 0 ? sum_mtp / (double)M : 0.0;
    m->balance = bal;
    m->indexer = idx;
    m->mtp_weight = lam;
    m->loss = m->main + lam * m->mtp + bal + s->indexer_weight * idx;
    m->main_targets = N;
    m->mtp_targets = M;
    m->warmup = warm;
    m->sparse = !warm && s->sparse;

    /* weight decay is off while everything but the indexer is frozen (docs/train.md) */
    const trex_optimizer_settings *cur = trex_optimizer_settings_get(t->opt);
    const double wd = warm ? 0.0 : t->weight_decay;
    if (cur->weight_decay != wd) {
        trex_optimizer_settings ns = *cur;
        ns.weight_decay = wd;
        TREX_TRY(trex_optimizer_settings_set(t->opt, &ns, err));
    }
    trex_step_report rep;
    trex_prof_begin(TREX_PROF_OPTIMIZER);
    if (isfinite(m->loss)) {
        trex_optimizer_update(t->opt, t->pool, t->w.f, t->grads, &rep);
    } else {
        trex_grad_report g;
        trex_optimizer_grad_check(t->opt, t->pool, t->grads, &g);
        rep = (trex_step_report){g.norm, 1.0, 0.0, g.nonfinite, g.first_bad, true};
    }
    trex_prof_end(TREX_PROF_OPTIMIZER);
    m->lr = rep.lr;
    m->grad_norm = rep.grad_norm;
    m->clip_scale = rep.clip_scale;
    m->skipped = rep.skipped;
    m->nonfinite = rep.nonfinite;
    if (rep.skipped) {
        end_line(t);
        const char *bad = rep.first_bad >= 0 ? t->w.layout.params[rep.first_bad].name : "(none)";
        fprintf(stderr,
                "trex train: step %" PRId64 " skipped: loss %g, %" PRId64 " non-finite gradient values (first in %s)\n",
                step, m->loss, rep.nonfinite, bad);
    }
    trex_prof_begin(TREX_PROF_OPTIMIZER);
    if (!rep.skipped && !warm)
        for (int64_t bl = 0; bl < t->nblocks; bl++)
            if (t->bias_off[bl] >= 0)
                trex_optim_bias_update(t->w.f + t->bias_off[bl], t->load + bl * t->E, t->E, s->opt.bias_update_speed);
    if (!rep.skipped)
        trex_weights_changed(t->pool, &t->w, true); /* the step wrote the bf16 copies too */
    trex_prof_end(TREX_PROF_OPTIMIZER);
    return TREX_OK;
}

/* Forward passes over the held-out set: token means of the main and MTP losses over all its targets. */
static trex_code evaluate(trainer *t, bool sparse, double lam, train_metrics *m, trex_err *err)
{
    const trex_train_settings *s = &t->s;
    const int64_t T = s->seq;
    int64_t nmb = (t->eval.n + s->mbs - 1) / s->mbs;
    if (s->eval_batches > 0 && s->eval_batches < nmb)
        nmb = s->eval_batches;
    t->eval.pos = 0;
    double sum_main = 0, sum_mtp = 0;
    int64_t N = 0, M = 0;
    for (int64_t k = 0; k < nmb; k++) {
        const int64_t rows = t->eval.n - t->eval.pos < s->mbs ? t->eval.n - t->eval.pos : s->mbs;
        TREX_TRY(train_loader_fill(&t->eval, rows, t->tokens, t->mask, t->docs, err));
        trex_model_opts o = trex_model_opts_default();
        o.sparse = sparse;
        o.mtp_weight = lam;
        o.balance_weight = s->balance_weight;
        o.indexer_weight = s->indexer_weight;
        o.compute = s->compute;
        trex_batch b = {rows, T, t->tokens, t->mask, t->docs};
        trex_losses l;
        trex_code rc = trex_model_forward(t->model, &b, &o, NULL, NULL, NULL, &l, err);
        if (rc != TREX_OK) {
            trex_err_prefix(err, "evaluation on %s", s->eval_data);
            return rc;
        }
        sum_main += l.main * (double)l.main_targets;
        sum_mtp += l.mtp * (double)l.mtp_targets;
        N += l.main_targets;
        M += l.mtp_targets;
    }
    m->have_eval = true;
    m->eval_main = N ? sum_main / (double)N : 0.0;
    m->eval_mtp = M ? sum_mtp / (double)M : 0.0;
    m->eval_targets = N;
    return TREX_OK;
}

static trex_code write_loads(trainer *t, int64_t step, trex_err *err)
{
    FILE *f = t->loads;
    fprintf(f, "{\"step\":%" PRId64 ",\"blocks\":[", step);
    for (int64_t b = 0; b < t->nblocks; b++) {
        const int64_t *ld = t->load + b * t->E;
        int64_t sum = 0, mx = 0;
        for (int64_t e = 0; e < t->E; e++) {
            sum += ld[e];
            mx = ld[e] > mx ? ld[e] : mx;
        }
        const double mean = (double)sum / (double)t->E;
        fprintf(f, "%s{\"block\":%" PRId64 ",\"hash\":%s,\"max_over_mean\":%.6g,\"load\":[", b ? "," : "", b,
                trex_config_is_hash(&t->cfg, b) ? "true" : "false", mean > 0 ? (double)mx / mean : 0.0);
        for (int64_t e = 0; e < t->E; e++)
            fprintf(f, "%s%" PRId64, e ? "," : "", ld[e]);
        fprintf(f, "]}");
    }
    fprintf(f, "]}\n");
    if (fflush(f) != 0 || ferror(f))
        return trex_err_set(err, TREX_EIO, "%s/expert_load.jsonl: write failed (disk full?)", t->s.out);
    return TREX_OK;
}

static trex_code save(trainer *t, int64_t step, trex_err *err)
{
    const trex_train_settings *s = &t->s;
    trex_ckpt_state st;
    memset(&st, 0, sizeof st);
    st.step = step;
    st.data_epoch = t->data.pos / t->data.n;
    st.data_offset = t->data.pos % t->data.n;
    st.data_shard = 0;
    st.rng = trex_rng_make(s->seed ^ DATA_SEED_SALT, (uint64_t)st.data_epoch);
    train_loader_source(&t->data, st.data_source, sizeof st.data_source);
    st.compute = s->compute;
    trex_ckpt_save_opts so = {.keep_last = (int)s->keep};
    const double t0 = trex_wall_s();
    trex_code rc = trex_ckpt_save(s->out, &t->w, t->opt, &st, &so, err);
    if (rc != TREX_OK)
        return rc;
    end_line(t);
    printf("trex train: saved %s/step-%" PRId64 " (%.1f s)\n", s->out, step, trex_wall_s() - t0);
    fflush(stdout);
    return TREX_OK;
}

static trex_code loop(trainer *t, trex_err *err)
{
    const trex_train_settings *s = &t->s;
    int64_t streak = 0, skipped_total = 0, first_bad = 0;
    double t_steps = 0;
    int64_t n_timed = 0;
    for (int64_t step = t->start_step + 1; step <= s->steps; step++) {
        train_metrics m;
        memset(&m, 0, sizeof m);
        m.step = step;
        m.steps = s->steps;
        const double t0 = trex_wall_s();
        TREX_TRY(train_loader_fill(&t->data, s->gbs, t->tokens, t->mask, t->docs, err));
        TREX_TRY(train_step(t, step, &m, err));
        m.step_s = trex_wall_s() - t0;
        t_steps += m.step_s;
        n_timed++;
        if (m.skipped) {
            if (streak == 0)
                first_bad = step;
            streak++;
            skipped_total++;
        } else {
            streak = 0;
        }
        m.skipped_total = skipped_total;
        m.bad_streak = streak;
        m.tokens = s->gbs * s->seq;
        m.tokens_per_s = (double)m.tokens / m.step_s;
        m.tflops = t->flops_step / m.step_s / 1e12;
        m.mfu = t->peak_tflops > 0 ? m.tflops / t->peak_tflops : -1.0;
        m.peak_rss_mib = (double)trex_peak_rss_bytes() / 1048576.0;
        m.mem_mib = (double)t->mem.live_total / 1048576.0;
        m.eta_s = t_steps / (double)n_timed * (double)(s->steps - step);
        const bool last = step == s->steps;
        if (t->have_eval && (last || (s->eval_every > 0 && step % s->eval_every == 0)))
            TREX_TRY(evaluate(t, m.sparse, m.mtp_weight, &m, err));
        TREX_TRY(train_metrics_write(t->metrics, &m, err));
        train_progress(stdout, t->tty, &m);
        t->line_open = t->tty;
        if (m.have_eval) {
            end_line(t);
            printf("trex train: step %" PRId64 " eval loss %.4f (mtp %.4f) over %" PRId64 " targets of %s\n", step,
                   m.eval_main, m.eval_mtp, m.eval_targets, s->eval_data);
        }
        if (s->expert_load_every > 0 && (step % s->expert_load_every == 0 || last))
            TREX_TRY(write_loads(t, step, err));
        if (streak >= s->max_bad_steps) {
            end_line(t);
            char dir[TREX_TRAIN_PATH + 64];
            int64_t good = 0;
            trex_err e2;
            bool have = trex_ckpt_latest(s->out, dir, sizeof dir, &good, &e2) == TREX_OK;
            return trex_err_set(err, TREX_ERANGE,
                                "stopping: %" PRId64 " steps in a row (%" PRId64 "..%" PRId64 ") had a NaN/Inf loss or "
                                "gradient (--max-bad-steps %" PRId64 "); the weights are those after step %" PRId64
                                "; %s%s%s — lower --lr, check the data, then --resume %s",
                                streak, first_bad, step, s->max_bad_steps, first_bad - 1,
                                have ? "the last checkpoint " : "no checkpoint was written yet", have ? dir : "",
                                have ? " is intact" : "", s->out);
        }
        /* no checkpoint while steps are being skipped, except the run's last */
        if ((last || (s->save_every > 0 && step % s->save_every == 0)) && (streak == 0 || last))
            TREX_TRY(save(t, step, err));
        if (t->faults && t->faults->kill_after_step == step) {
            end_line(t);
            fprintf(stderr, "trex train: fault injection: SIGKILL after step %" PRId64 "\n", step);
            fflush(NULL);
            raise(SIGKILL);
        }
    }
    end_line(t);
    return TREX_OK;
}

static void teardown(trainer *t)
{
    if (t->metrics)
        fclose(t->metrics);
    if (t->loads)
        fclose(t->loads);
    trex_model_destroy(t->model);
    trex_optimizer_destroy(t->opt);
    trex_mem_free(&t->mem, TREX_REGION_GRADS, t->grads);
    trex_mem_free(&t->mem, TREX_REGION_BUFFERS, t->tokens);
    trex_mem_free(&t->mem, TREX_REGION_BUFFERS, t->docs);
    trex_mem_free(&t->mem, TREX_REGION_BUFFERS, t->mask);
    trex_mem_free(&t->mem, TREX_REGION_BUFFERS, t->mb_main);
    trex_mem_free(&t->mem, TREX_REGION_BUFFERS, t->mb_mtp);
    trex_mem_free(&t->mem, TREX_REGION_BUFFERS, t->load);
    trex_mem_free(&t->mem, TREX_REGION_BUFFERS, t->bias_off);
    trex_mem_free(&t->mem, TREX_REGION_BUFFERS, t->frozen);
    if (t->have_w)
        trex_weights_free(&t->w);
    train_loader_close(&t->data);
    train_loader_close(&t->eval);
    trex_pool_destroy(t->pool);
    trex_tok_free(t->tok);
}

trex_code trex_train_run(const trex_train_settings *s, const trex_train_faults *faults, trex_err *err)
{
    trainer *t = calloc(1, sizeof *t);
    if (!t)
        return trex_err_set(err, TREX_ENOMEM, "out of memory for the trainer");
    t->s = *s;
    t->faults = faults;
    const double t0 = trex_wall_s();
    trex_code rc = setup(t, err);
    if (rc == TREX_OK) {
        const trex_train_settings *e = &t->s;
        trex_train_settings_print(e, stdout);
        printf("trex train: model %s: %.2fM parameters (%" PRId64 " trainable), %" PRId64 " threads, kernels %s\n",
               t->cfg.name, (double)t->w.layout.n_float / 1e6, t->w.layout.n_trainable,
               (int64_t)trex_pool_size(t->pool), trex_isa_label(trex_kernels_isa()));
        printf("trex train: data %s: %" PRId64 " sequences of %" PRId64 "; step = %" PRId64 " micro-batches of %" PRId64
               " (%" PRId64 " tokens); %.3g model FLOPs/step; peak %.4g TFLOP/s%s%s%s%s\n",
               e->data, t->data.n, e->seq, t->K, e->mbs, e->gbs * e->seq, t->flops_step, t->peak_tflops,
               t->peak_tflops > 0 ? "" : " (MFU unknown)", t->peak_what ? " (measured now: " : "",
               t->peak_what ? t->peak_what : "", t->peak_what ? ")" : "");
        if (e->resume)
            printf("trex train: resuming %s at step %" PRId64 " of %" PRId64 "\n", e->out, t->start_step, e->steps);
        if (t->start_step >= e->steps)
            printf("trex train: nothing to do: the run is at step %" PRId64 " of %" PRId64 " (raise --steps)%s\n",
                   t->start_step, e->steps, t->have_eval ? "; evaluating it on --eval-data" : "");
        fflush(stdout);
        if (t->start_step >= e->steps && t->have_eval) {
            train_metrics m;
            memset(&m, 0, sizeof m);
            const bool sparse = e->sparse && e->steps > e->indexer_warmup;
            rc = evaluate(t, sparse, e->mtp_weight_late, &m, err);
            if (rc == TREX_OK)
                printf("trex train: step %" PRId64 " eval loss %.6f (mtp %.6f) over %" PRId64 " targets of %s\n",
                       t->start_step, m.eval_main, m.eval_mtp, m.eval_targets, e->eval_data);
        }
        if (rc == TREX_OK)
            rc = loop(t, err);
        if (rc == TREX_OK && t->start_step < e->steps)
            printf("trex train: done: steps %" PRId64 "..%" PRId64 " in %.1f s; run directory %s\n", t->start_step + 1,
                   e->steps, trex_wall_s() - t0, e->out);
    }
    teardown(t);
    free(t);
    return rc;
}

/* ---- the step on a synthetic batch (trex bench step) ------------------------------------------------ */

trex_code trex_train_bench(const trex_train_bench_opts *o, trex_train_bench_result *res, trex_err *err)
{
    memset(res, 0, sizeof *res);
    if (!o->cfg)
        return trex_err_set(err, TREX_EINVAL, "bench: no model config");
    if (o->seq < 2 || o->seq > (1 << 24))
        return trex_err_set(err, TREX_EINVAL, "--seq %" PRId64 ": must be in [2, 16777216]", o->seq);
    if (o->mbs < 1 || o->mbs > 65536)
        return trex_err_set(err, TREX_EINVAL, "--mbs %" PRId64 ": must be in [1, 65536]", o->mbs);
    if (o->steps < 1 || o->steps > TREX_TRAIN_BENCH_MAX_STEPS)
        return trex_err_set(err, TREX_EINVAL, "--steps %" PRId64 ": must be in [1, %d]", o->steps,
                            TREX_TRAIN_BENCH_MAX_STEPS);
    if (o->warmup < 0 || o->warmup > 1000)
        return trex_err_set(err, TREX_EINVAL, "--warmup %" PRId64 ": must be in [0, 1000]", o->warmup);
    if (o->threads < 0 || o->threads > 4096)
        return trex_err_set(err, TREX_EINVAL, "--threads %" PRId64 ": must be in [0, 4096]", o->threads);
    if (o->compute != TREX_F32 && o->compute != TREX_BF16)
        return trex_err_set(err, TREX_EINVAL, "bench: compute must be fp32 or bf16");
    trainer *t = calloc(1, sizeof *t);
    if (!t)
        return trex_err_set(err, TREX_ENOMEM, "out of memory for the trainer");
    trex_train_settings *s = &t->s;
    trex_train_defaults(s);
    s->seq = o->seq;
    s->gbs = s->mbs = o->mbs;
    s->steps = o->warmup + o->steps;
    s->opt.kind = o->optimizer;
    s->opt.schedule = TREX_LR_CONSTANT;
    s->compute = o->compute;
    s->recompute = o->recompute;
    s->weight_copies = !o->no_weight_copies;
    s->threads = o->threads;
    s->seed = o->seed;
    s->sparse = true;
    t->cfg = *o->cfg;
    trex_code rc = trex_kernels_init(err);
    if (rc == TREX_OK)
        rc = trex_pool_create_checked(&t->pool, (int)s->threads, err);
    if (rc == TREX_OK) {
        rc = trex_weights_init_pool(t->pool, &t->w, &t->cfg, s->seed, &t->mem, err);
        t->have_w = rc == TREX_OK;
    }
    if (rc == TREX_OK)
        rc = setup_step(t, err);
    trex_plan_model *pm = NULL;
    if (rc == TREX_OK && !(pm = calloc(1, sizeof *pm)))
        rc = trex_err_set(err, TREX_ENOMEM, "out of memory for the FLOP model");
    if (rc == TREX_OK)
        rc = trex_plan_model_from_config(pm, &t->cfg, s->seq, err);
    if (rc == TREX_OK) {
        res->flops_per_token = pm->model_flops_per_token;
        res->flops_step = t->flops_step;
        res->threads = trex_pool_size(t->pool);
        /* uniformly random tokens, every position a target, one document per row */
        trex_rng r = trex_rng_make(s->seed, 0x62656e6368ull);
        const int64_t n = s->gbs * s->seq;
        for (int64_t i = 0; i < n; i++) {
            t->tokens[i] = (int32_t)trex_rng_below(&r, (uint64_t)t->cfg.vocab_size);
            t->mask[i] = 1;
            t->docs[i] = 0;
        }
    }
    trex_prof *prev = NULL;
    for (int64_t i = 0; rc == TREX_OK && i < s->steps; i++) {
        const bool timed = i >= o->warmup;
        if (timed && i == o->warmup && o->prof) {
            trex_prof_reset(o->prof);
            prev = trex_prof_attach(o->prof);
        }
        train_metrics m;
        memset(&m, 0, sizeof m);
        const double c0 = trex_cpu_s(), t0 = trex_wall_s();
        rc = train_step(t, i + 1, &m, err);
        const double dt = trex_wall_s() - t0, dc = trex_cpu_s() - c0;
        if (rc != TREX_OK)
            break;
        if (timed) {
            res->step_s[i - o->warmup] = dt;
            res->step_cpu_s[i - o->warmup] = dc;
        }
        if (i == 0)
            res->loss_first = m.main;
        res->loss_last = m.main;
    }
    if (o->prof && s->steps > o->warmup)
        trex_prof_attach(prev);
    if (rc == TREX_OK) {
        for (int r = 0; r < TREX_REGION_COUNT; r++)
            res->region_peak[r] = t->mem.peak[r];
        res->acts_used = trex_model_arena_used(t->model);
        res->peak_rss = trex_peak_rss_bytes();
    }
    free(pm);
    teardown(t);
    free(t);
    return rc;
}
