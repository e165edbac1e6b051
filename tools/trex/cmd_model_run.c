/* tools/trex/cmd_model_run.c — `trex model run`: one forward (and optionally backward) pass of a
 * DeepSeek-V4 model over a batch file, writing logits, losses and gradients to safetensors.
 *
 * Input batch (docs/model-conventions.md): `tokens` I32 [B, T]; optional `loss_mask` U8 [B, T] and
 * `doc_ids` I32 [B, T]. Output: `logits` F32 [B, T, V] and `mtp_logits` F32 [B, T-1, V] (unless
 * --no-logits), the scalars `loss`, `loss_main`, `loss_mtp`, `loss_balance`, `loss_indexer` (F32,
 * shape []), and with --backward `grad.<name>` F32 for every trainable parameter. Prints the losses,
 * the forward and backward times and the memory held (peak RSS and the per-region accounting). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "kernels/dispatch.h"
#include "opts.h"
#include "trex/alloc.h"
#include "trex/config.h"
#include "trex/model.h"
#include "trex/params.h"
#include "trex/pool.h"
#include "trex/safetensors.h"
#include "trex/status.h"
#include "trex/prof.h"

/* The batch tensors, owned. */
typedef struct batch_buf {
    trex_batch b;
    int32_t *tokens, *doc_ids;
    uint8_t *loss_mask;
} batch_buf;

static void batch_free(batch_buf *bb)
{
    free(bb->tokens);
    free(bb->doc_ids);
    free(bb->loss_mask);
}

/* "[a, b]" of an entry's shape. */
static const char *shape_str(const trex_st_entry *e, char *buf, size_t cap)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < e->ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", e->shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
    return buf;
}

static trex_code batch_load(batch_buf *bb, const char *path, trex_err *err)
{
    memset(bb, 0, sizeof *bb);
    trex_st_file *f = NULL;
    trex_code rc = trex_st_open(&f, path, err);
    if (rc != TREX_OK)
        return rc;
    for (int64_t i = 0; i < trex_st_count(f); i++) {
        const char *nm = trex_st_entry_at(f, i)->name;
        if (strcmp(nm, "tokens") && strcmp(nm, "loss_mask") && strcmp(nm, "doc_ids")) {
            rc = trex_err_set(err, TREX_EFORMAT,
                              "%s: %s: unexpected tensor — a batch holds only tokens, loss_mask and doc_ids",
                              path, nm);
            goto out;
        }
    }
    const trex_st_entry *et = trex_st_find(f, "tokens");
    if (!et) {
        rc = trex_err_set(err, TREX_ENOTFOUND, "%s: tokens: missing — a batch needs tokens I32 [B, T]", path);
        goto out;
    }
    char sb[160];
    if (et->dtype != TREX_I32 || et->ndim != 2) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: tokens: %s %s — tokens must be I32 [B, T]", path,
                          trex_dtype_name(et->dtype), shape_str(et, sb, sizeof sb));
        goto out;
    }
    const int64_t B = et->shape[0], T = et->shape[1];
    if (B < 1 || T < 2 || B > INT32_MAX / T) {
        rc = trex_err_set(err, TREX_EINVAL,
                          "%s: tokens: shape [%" PRId64 ", %" PRId64 "] — need B >= 1 rows of T >= 2 tokens, "
                          "at most 2^31-1 in all", path, B, T);
        goto out;
    }
    const size_t N = (size_t)(B * T);
    bb->tokens = malloc(N * sizeof *bb->tokens);
    if (!bb->tokens) {
        rc = trex_err_set(err, TREX_ENOMEM, "%s: tokens: out of memory", path);
        goto out;
    }
    int64_t shape[2] = {B, T};
    rc = trex_st_read_i32(f, "tokens", bb->tokens, 2, shape, err);
    if (rc != TREX_OK)
        goto out;
    const trex_st_entry *em = trex_st_find(f, "loss_mask");
    if (em) {
        if (em->dtype != TREX_U8 || em->ndim != 2 || em->shape[0] != B || em->shape[1] != T) {
            rc = trex_err_set(err, TREX_EFORMAT,
                              "%s: loss_mask: %s %s — it must be U8 [%" PRId64 ", %" PRId64 "] like tokens",
                              path, trex_dtype_name(em->dtype), shape_str(em, sb, sizeof sb), B, T);
            goto out;
        }
        bb->loss_mask = malloc(N);
        if (!bb->loss_mask) {
            rc = trex_err_set(err, TREX_ENOMEM, "%s: loss_mask: out of memory", path);
            goto out;
        }
        memcpy(bb->loss_mask, trex_st_data(f, em), N);
    }
    const trex_st_entry *ed = trex_st_find(f, "doc_ids");
    if (ed) {
        if (ed->dtype != TREX_I32 || ed->ndim != 2 || ed->shape[0] != B || ed->shape[1] != T) {
            rc = trex_err_set(err, TREX_EFORMAT,
                              "%s: doc_ids: %s %s — it must be I32 [%" PRId64 ", %" PRId64 "] like tokens",
                              path, trex_dtype_name(ed->dtype), shape_str(ed, sb, sizeof sb), B, T);
            goto out;
        }
        bb->doc_ids = malloc(N * sizeof *bb->doc_ids);
        if (!bb->doc_ids) {
            rc = trex_err_set(err, TREX_ENOMEM, "%s: doc_ids: out of memory", path);
            goto out;
        }
        rc = trex_st_read_i32(f, "doc_ids", bb->doc_ids, 2, shape, err);
        if (rc != TREX_OK)
            goto out;
    }
    bb->b.B = B;
    bb->b.T = T;
    bb->b.tokens = bb->tokens;
    bb->b.loss_mask = bb->loss_mask;
    bb->b.doc_ids = bb->doc_ids;
out:
    trex_st_close(f);
    if (rc != TREX_OK) {
        batch_free(bb);
        memset(bb, 0, sizeof *bb);
    }
    return rc;
}

static void print_mem(const trex_mem *mem, const trex_model *m)
{
    const double MiB = 1024.0 * 1024.0;
    printf("memory: peak RSS %.1f MiB; peak by region:", (double)trex_peak_rss_bytes() / MiB);
    for (int r = 0; r < TREX_REGION_COUNT; r++)
        if (mem->peak[r])
            printf(" %s %.1f MiB", trex_region_name((trex_region)r), (double)mem->peak[r] / MiB);
    printf("; activations used %.1f MiB of %.1f MiB reserved, peak %.1f MiB\n",
           (double)trex_model_arena_used(m) / MiB, (double)trex_model_arena_reserved(m) / MiB,
           (double)trex_model_arena_peak(m) / MiB);
}

/* Whether path b names the file a names (both exist: the same device and inode). */
static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int trex_cmd_model_run(int argc, char **argv)
{
    static const char *config = NULL, *weights = NULL, *batch = NULL, *outp = NULL;
    static const char *mode = "dense", *precision = "fp32", *head = "auto", *recompute = "none";
    static bool backward = false, no_logits = false;
    static double mtp_weight = 0.3, balance_weight = 1e-4, indexer_weight = 1.0;
    static int64_t threads = 0, head_chunk_rows = 0;
    static const trex_opt opts[] = {
        {"config", TREX_OPT_STR, &config, "FILE", "model config.json", true},
        {"weights", TREX_OPT_STR, &weights, "FILE", "weights (.safetensors, official names)", true},
        {"batch", TREX_OPT_STR, &batch, "FILE", "batch: tokens I32 [B,T], optional loss_mask U8, doc_ids I32", true},
        {"out", TREX_OPT_STR, &outp, "FILE", "output .safetensors (logits, losses, gradients)", true},
        {"backward", TREX_OPT_FLAG, &backward, NULL, "also run the backward pass and write grad.<name>", false},
        {"indexer-mode", TREX_OPT_STR, &mode, "MODE", "CSA attention: dense (all visible entries) or sparse (top-k)", false},
        {"mtp-weight", TREX_OPT_F64, &mtp_weight, "W", "weight of loss_mtp in loss", false},
        {"balance-weight", TREX_OPT_F64, &balance_weight, "A", "alpha of the sequence-wise balance loss", false},
        {"indexer-weight", TREX_OPT_F64, &indexer_weight, "W", "weight of loss_indexer in loss", false},
        {"threads", TREX_OPT_I64, &threads, "N", "worker threads (0: TREX_THREADS, else all cores)", false},
        {"precision", TREX_OPT_STR, &precision, "P", "large matrix products: fp32 (reference) or bf16 (bf16 inputs, fp32 sums; docs/precision.md)", false},
        {"head", TREX_OPT_STR, &head, "H", "LM head products: auto (bf16x2g1 under --precision bf16, else fp32), fp32, bf16x3 (3-term bf16 split on the bf16 GEMM, fp32-level accuracy, logits and gradients), bf16x3g1 (bf16x3 logits, 1-term bf16 gradient products), or bf16x2g1 (logits of the bf16 weight and the fp32 activation, 2-term split; 1-term bf16 gradient products; docs/precision.md)", false},
        {"recompute", TREX_OPT_STR, &recompute, "R", "with --backward: none (keep every block's activations), attention or moe (drop that sub-layer's internals, run its forward again before its backward), full (keep each block's input, run its forward again in the backward), full-keep-core or attention-keep-core (full or attention, keeping each block's attention core output and wo_a's products of it too, which the attention forward run again in the backward then skips); same results, less memory", false},
        {"head-chunk-rows", TREX_OPT_I64, &head_chunk_rows, "N", "rows of logits the head holds at once (0: automatic; docs/perf.md)", false},
        {"no-logits", TREX_OPT_FLAG, &no_logits, NULL, "do not compute or write logits / mtp_logits (big models)", false},
        {0}};
    trex_cmd_info info = {
        .usage = "trex model run --config C --weights W --batch IN --out OUT [options]",
        .summary = "Runs one forward pass (and with --backward the backward pass) of the model over a batch\n"
                   "and writes logits, the losses and the gradients to OUT (docs/model-conventions.md).",
    };
    int prc = trex_opts_parse(opts, argc, argv, &info);
    if (prc != TREX_OPTS_OK)
        return prc == TREX_OPTS_HELP ? 0 : 2;

    trex_model_opts mo = trex_model_opts_default();
    if (!strcmp(mode, "dense"))
        mo.sparse = false;
    else if (!strcmp(mode, "sparse"))
        mo.sparse = true;
    else
        return trex_cli_error("--indexer-mode: '%s' — use dense or sparse", mode);
    if (!strcmp(precision, "fp32"))
        mo.compute = TREX_F32;
    else if (!strcmp(precision, "bf16"))
        mo.compute = TREX_BF16;
    else
        return trex_cli_error("--precision: '%s' — use fp32 or bf16", precision);
    if (!strcmp(head, "auto"))
        mo.head_precision = TREX_HEAD_AUTO;
    else if (!strcmp(head, "fp32"))
        mo.head_precision = TREX_HEAD_FP32;
    else if (!strcmp(head, "bf16x3"))
        mo.head_precision = TREX_HEAD_BF16X3;
    else if (!strcmp(head, "bf16x3g1"))
        mo.head_precision = TREX_HEAD_BF16X3_G1;
    else if (!strcmp(head, "bf16x2g1"))
        mo.head_precision = TREX_HEAD_BF16X2_G1;
    else
        return trex_cli_error("--head: '%s' — use auto, fp32, bf16x3, bf16x3g1 or bf16x2g1", head);
    if (!trex_model_recompute_parse(recompute, &mo.recompute))
        return trex_cli_error("--recompute: '%s' — use none, attention, moe, full, full-keep-core or attention-keep-core",
                              recompute);
    if (head_chunk_rows < 0 || head_chunk_rows > ((int64_t)1 << 30))
        return trex_cli_error("--head-chunk-rows: %" PRId64 " — use 0 (automatic) or a positive count", head_chunk_rows);
    mo.head_chunk_rows = head_chunk_rows;
    if (!(mtp_weight >= 0) || !(balance_weight >= 0) || !(indexer_weight >= 0))
        return trex_cli_error("--mtp-weight / --balance-weight / --indexer-weight must be >= 0");
    if (threads < 0 || threads > 4096)
        return trex_cli_error("--threads: %" PRId64 " — use 0 (automatic) or 1..4096", threads);
    mo.mtp_weight = mtp_weight;
    mo.balance_weight = balance_weight;
    mo.indexer_weight = indexer_weight;

    int status = 1;
    trex_err err = {0};
    trex_config cfg;
    trex_mem mem;
    memset(&mem, 0, sizeof mem);
    trex_weights w;
    memset(&w, 0, sizeof w);
    bool have_w = false;
    batch_buf bb;
    memset(&bb, 0, sizeof bb);
    trex_pool *pool = NULL;
    trex_model *m = NULL;
    float *logits = NULL, *mtp_logits = NULL, *grads = NULL;
    trex_st_writer *wr = NULL;
    float scal[5];

    if (same_file(outp, weights) || same_file(outp, batch)) /* it would be replaced by the results */
        return trex_cli_error("--out %s is the %s file: give another path", outp,
                              same_file(outp, weights) ? "--weights" : "--batch");
    if (trex_kernels_init(&err) != TREX_OK) /* a bad TREX_ISA, before anything is loaded */
        goto fail;
    if (trex_config_load(&cfg, config, &err) != TREX_OK)
        goto fail;
    if (trex_pool_create_checked(&pool, (int)threads, &err) != TREX_OK)
        goto fail;
    if (batch_load(&bb, batch, &err) != TREX_OK)
        goto fail;
    if (trex_model_check_batch(&cfg, &bb.b, batch, &err) != TREX_OK)
        goto fail;
    const int64_t B = bb.b.B, T = bb.b.T, V = cfg.vocab_size;
    const bool mtp = cfg.num_nextn_predict_layers > 0;
    printf("model run: config %s (%s), weights %s, batch %s [B=%" PRId64 ", T=%" PRId64 "], %s attention, "
           "threads %d, kernels %s, precision %s, head %s, mtp_weight %g, balance_weight %g, indexer_weight %g"
           "%s%s%s%s\n",
           config, cfg.name, weights, batch, B, T, mo.sparse ? "sparse" : "dense", trex_pool_size(pool),
           trex_isa_label(trex_kernels_isa()), precision,
           trex_model_head_name(&mo),
           mo.mtp_weight, mo.balance_weight, mo.indexer_weight,
           backward ? ", backward (recompute " : "", backward ? trex_model_recompute_name(mo.recompute) : "",
           backward ? ")" : "",
           no_logits ? ", no logits" : "");
    fflush(stdout);
    if (trex_weights_load(&w, &cfg, weights, &mem, &err) != TREX_OK)
        goto fail;
    have_w = true;
    if (trex_model_create(&m, &w, pool, &mem, &err) != TREX_OK)
        goto fail;
    if (!no_logits) {
        if ((uint64_t)(B * T) > (uint64_t)INT64_MAX / (uint64_t)V / sizeof(float)) {
            trex_err_set(&err, TREX_ERANGE, "%s: tokens: [B, T, V] logits do not fit in memory — use --no-logits",
                         batch);
            goto fail;
        }
        logits = trex_mem_alloc(&mem, TREX_REGION_BUFFERS, (size_t)(B * T * V) * sizeof(float));
        if (mtp)
            mtp_logits = trex_mem_alloc(&mem, TREX_REGION_BUFFERS, (size_t)(B * (T - 1) * V) * sizeof(float));
        if (!logits || (mtp && !mtp_logits)) {
            trex_err_set(&err, TREX_ENOMEM, "%s: out of memory for the logits [%" PRId64 ", %" PRId64
                         ", %" PRId64 "] — use --no-logits", batch, B, T, V);
            goto fail;
        }
    }

    if (backward) {
        grads = trex_mem_alloc(&mem, TREX_REGION_GRADS, (size_t)w.layout.n_float * sizeof(float));
        if (!grads) {
            trex_err_set(&err, TREX_ENOMEM, "%s: out of memory for the gradients (%" PRId64 " floats)", weights,
                         w.layout.n_float);
            goto fail;
        }
    }
    trex_losses ls;
    double t0 = trex_wall_s();
    if (trex_model_forward(m, &bb.b, &mo, grads, logits, mtp_logits, &ls, &err) != TREX_OK)
        goto fail;
    double t_fwd = trex_wall_s() - t0, t_bwd = 0.0;
    printf("loss %.7f  loss_main %.7f (%" PRId64 " targets)  loss_mtp %.7f (%" PRId64 " targets)  "
           "loss_balance %.7g  loss_indexer %.7g\n",
           ls.loss, ls.main, ls.main_targets, ls.mtp, ls.mtp_targets, ls.balance, ls.indexer);
    fflush(stdout);
    if (backward) {
        t0 = trex_wall_s();
        trex_model_backward(m);
        t_bwd = trex_wall_s() - t0;
    }
    printf("time: forward %.3f s", t_fwd);
    if (backward)
        printf(", backward %.3f s", t_bwd);
    printf(" (%" PRId64 " tokens, %d threads)\n", B * T, trex_pool_size(pool));
    print_mem(&mem, m);

    wr = trex_st_writer_create();
    if (!wr) {
        trex_err_set(&err, TREX_ENOMEM, "%s: out of memory starting the writer", outp);
        goto fail;
    }
    if (logits) {
        int64_t s3[3] = {B, T, V};
        if (trex_st_writer_add(wr, "logits", TREX_F32, 3, s3, logits, &err) != TREX_OK)
            goto fail;
    }
    if (mtp_logits) {
        int64_t s3[3] = {B, T - 1, V};
        if (trex_st_writer_add(wr, "mtp_logits", TREX_F32, 3, s3, mtp_logits, &err) != TREX_OK)
            goto fail;
    }
    static const char *const names[5] = {"loss", "loss_main", "loss_mtp", "loss_balance", "loss_indexer"};
    scal[0] = (float)ls.loss, scal[1] = (float)ls.main, scal[2] = (float)ls.mtp;
    scal[3] = (float)ls.balance, scal[4] = (float)ls.indexer;
    for (int i = 0; i < 5; i++)
        if (trex_st_writer_add(wr, names[i], TREX_F32, 0, NULL, &scal[i], &err) != TREX_OK)
            goto fail;
    if (grads) {
        for (int64_t i = 0; i < w.layout.count; i++) {
            const trex_param *p = &w.layout.params[i];
            if (!p->trainable || p->is_int)
                continue;
            char name[TREX_PARAM_NAME + 8];
            snprintf(name, sizeof name, "grad.%s", p->name);
            if (trex_st_writer_add(wr, name, TREX_F32, p->ndim, p->shape, grads + p->offset, &err) != TREX_OK)
                goto fail;
        }
    }
    if (trex_st_writer_write(wr, outp, &err) != TREX_OK)
        goto fail;
    printf("wrote %s\n", outp);
    status = 0;
    goto out;
fail:
    trex_cli_error("%s", err.msg[0] ? err.msg : "failed");
out:
    trex_st_writer_destroy(wr);
    trex_mem_free(&mem, TREX_REGION_GRADS, grads);
    trex_mem_free(&mem, TREX_REGION_BUFFERS, logits);
    trex_mem_free(&mem, TREX_REGION_BUFFERS, mtp_logits);
    trex_model_destroy(m);
    if (have_w)
        trex_weights_free(&w);
    batch_free(&bb);
    trex_pool_destroy(pool);
    return status;
}
