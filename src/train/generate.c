/* train/generate.c — `trex generate`: answer one chat prompt with a run's checkpoint.
 *
 * The run directory gives the model (config.json), the tokenizer (tokenizer.json, copied there by
 * `trex train`), the attention mode (settings.json) and the weights (step-N, verified against its
 * manifest). The prompt is rendered with the DeepSeek-V4 chat template (trex_chat_encode_prompt);
 * then each new token comes from a whole forward pass over the sequence so far (no KV cache: correct
 * first) — greedy at temperature 0 (ties to the lower id), else sampled from softmax(logits / T),
 * optionally among the top k, with the counter-based RNG of the seed. Stops at <｜end▁of▁sentence｜>
 * or after max_new tokens. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trex/checkpoint.h"
#include "trex/data.h"
#include "trex/io.h"
#include "trex/model.h"
#include "trex/pool.h"
#include "trex/rng.h"
#include "trex/train.h"
#include "trex/prof.h"

/* The next token from one row of logits. */
static int32_t pick(const float *logits, int64_t V, double temperature, int64_t top_k, trex_rng *rng, double *work)
{
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (temperature <= 0)
        return (int32_t)best;
    /* keep the top k (ties at the cut to the lower id), weights exp((l - max)/T) */
    double cut = -INFINITY;
    if (top_k > 0 && top_k < V) {
        for (int64_t i = 0; i < V; i++)
            work[i] = logits[i];
        /* the k-th largest by partial selection */
        for (int64_t k = 0; k < top_k; k++) {
            int64_t m = k;
            for (int64_t i = k + 1; i < V; i++)
                if (work[i] > work[m])
                    m = i;
            double tmp = work[k];
            work[k] = work[m];
            work[m] = tmp;
        }
        cut = work[top_k - 1];
    }
    double sum = 0;
    int64_t kept = 0;
    for (int64_t i = 0; i < V; i++) {
        double w = 0;
        if (logits[i] >= cut && (top_k <= 0 || kept < top_k)) {
            w = exp(((double)logits[i] - (double)logits[best]) / temperature);
            kept++;
        }
        work[i] = w;
        sum += w;
    }
    double u = trex_rng_uniform(rng) * sum, acc = 0;
    for (int64_t i = 0; i < V; i++) {
        acc += work[i];
        if (work[i] > 0 && u < acc)
            return (int32_t)i;
    }
    return (int32_t)best;
}

static trex_code run_attention(const char *run, bool *sparse, trex_err *err)
{
    char p[TREX_TRAIN_PATH + 64];
    snprintf(p, sizeof p, "%s/settings.json", run);
    cJSON *j = NULL;
    TREX_TRY(trex_json_load(p, &j, err));
    trex_train_settings s;
    trex_train_defaults(&s);
    trex_code rc = trex_train_settings_from_json(&s, j, p, err);
    cJSON_Delete(j);
    *sparse = s.sparse;
    return rc;
}

trex_code trex_generate(const trex_generate_opts *o, FILE *out, trex_generate_result *res, trex_err *err)
{
    TREX_ASSERT(o && o->run && o->prompt && res);
    memset(res, 0, sizeof *res);
    if (o->max_new < 1 || o->max_new > (1 << 20))
        return trex_err_set(err, TREX_EINVAL, "--max-new %" PRId64 " must be in [1, 2^20]", o->max_new);
    if (!(o->temperature >= 0) || !isfinite(o->temperature))
        return trex_err_set(err, TREX_EINVAL, "--temperature %g must be >= 0 (0: greedy)", o->temperature);
    if (o->top_k < 0)
        return trex_err_set(err, TREX_EINVAL, "--top-k %" PRId64 " must be >= 0 (0: every token)", o->top_k);
    const double t0 = trex_wall_s();
    char path[TREX_TRAIN_PATH + 64], dir[TREX_TRAIN_PATH + 64];
    trex_config cfg;
    trex_tokenizer *tok = NULL;
    trex_pool *pool = NULL;
    trex_mem mem;
    memset(&mem, 0, sizeof mem);
    trex_weights w;
    bool have_w = false;
    trex_model *model = NULL;
    trex_tokbuf ids = {0};
    float *logits = NULL;
    double *work = NULL;
    char *text = NULL;
    trex_code rc;

    snprintf(path, sizeof path, "%s/config.json", o->run);
    rc = trex_config_load(&cfg, path, err);
    if (rc != TREX_OK) {
        trex_err_prefix(err, "--run %s is not a complete training run (trex train --out RUN writes config.json)",
                        o->run);
        goto out;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", o->run);
    rc = trex_tok_load(&tok, path, err);
    if (rc != TREX_OK)
        goto out;
    bool sparse = o->attention == 1;
    if (o->attention < 0 && (rc = run_attention(o->run, &sparse, err)) != TREX_OK)
        goto out;
    if (o->step >= 0) {
        snprintf(dir, sizeof dir, "%s/step-%" PRId64, o->run, o->step);
        res->step = o->step;
    } else if ((rc = trex_ckpt_latest(o->run, dir, sizeof dir, &res->step, err)) != TREX_OK) {
        goto out;
    }
    trex_ckpt_state st;
    rc = trex_ckpt_load(dir, &cfg, &mem, &w, NULL, &st, err);
    if (rc != TREX_OK)
        goto out;
    have_w = true;
    if ((rc = trex_pool_create_checked(&pool, (int)o->threads, err)) != TREX_OK)
        goto out;
    if ((rc = trex_model_create(&model, &w, pool, &mem, err)) != TREX_OK)
        goto out;

    trex_chat_msg msgs[2];
    int nm = 0;
    if (o->system)
        msgs[nm++] = (trex_chat_msg){TREX_CHAT_SYSTEM, o->system, NULL};
    msgs[nm++] = (trex_chat_msg){TREX_CHAT_USER, o->prompt, NULL};
    if ((rc = trex_chat_encode_prompt(tok, msgs, nm, (trex_chat_gen)o->mode, &ids, err)) != TREX_OK)
        goto out;
    res->prompt_tokens = ids.n;
    const int64_t V = cfg.vocab_size, cap = ids.n + o->max_new;
    logits = malloc((size_t)(cap * V) * sizeof *logits);
    work = malloc((size_t)V * sizeof *work);
    int32_t *seq = malloc((size_t)cap * sizeof *seq);
    if (!logits || !work || !seq) {
        free(seq);
        rc = trex_err_set(err, TREX_ENOMEM, "out of memory for %" PRId64 " x %" PRId64 " logits", cap, V);
        goto out;
    }
    memcpy(seq, ids.ids, (size_t)ids.n * sizeof *seq);
    if (o->echo_prompt) {
        size_t tl;
        if (trex_tok_decode(tok, seq, ids.n, &text, &tl, err) == TREX_OK)
            fprintf(out, "%s", text);
        free(text);
        text = NULL;
    }
    int32_t eos = trex_tok_id(tok, "<｜end▁of▁sentence｜>");
    if (eos < 0)
        eos = (int32_t)cfg.eos_token_id;
    trex_rng rng = trex_rng_make(o->seed, 0x67656e /* "gen" */);
    trex_model_opts mo = trex_model_opts_default();
    mo.sparse = sparse;
    int64_t n = ids.n;
    size_t printed = 0;
    while (res->new_tokens < o->max_new) {
        trex_batch b = {1, n, seq, NULL, NULL};
        trex_losses l;
        rc = trex_model_forward(model, &b, &mo, NULL, logits, NULL, &l, err);
        if (rc != TREX_OK)
            break;
        int32_t next = pick(logits + (n - 1) * V, V, o->temperature, o->top_k, &rng, work);
        res->new_tokens++;
        if (next == eos) {
            res->stopped_at_eos = true;
            break;
        }
        seq[n++] = next;
        /* print what the answer's bytes have grown by */
        size_t tl;
        rc = trex_tok_decode(tok, seq + ids.n, n - ids.n, &text, &tl, err);
        if (rc != TREX_OK)
            break;
        if (tl > printed) {
            fwrite(text + printed, 1, tl - printed, out);
            fflush(out);
            printed = tl;
        }
        free(text);
        text = NULL;
    }
    free(seq);
    fputc('\n', out);
    fflush(out);
    res->seconds = trex_wall_s() - t0;
out:
    free(text);
    free(work);
    free(logits);
    trex_tokbuf_free(&ids);
    trex_model_destroy(model);
    if (have_w)
        trex_weights_free(&w);
    trex_pool_destroy(pool);
    trex_tok_free(tok);
    return rc;
}
