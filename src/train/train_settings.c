/* train/train_settings.c — the settings of a training run: defaults, one table of fields that drives
 * JSON in and out (RUN/settings.json, --run-file) and text values (the CLI's flags), and range checks.
 *
 * The JSON names are the field names below; the CLI's flags are the same names with '-' for '_'
 * (eval_data = --eval-data). Numbers given as text are parsed with full checks. */
#include "trex/train.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_internal.h"

typedef enum ftype {
    F_PATH,      /* char[TREX_TRAIN_PATH] */
    F_I64,
    F_U64,
    F_F64,
    F_BOOL,
    F_OPTIM,     /* trex_optim_kind: "adamw" | "muon" */
    F_SCHEDULE,  /* trex_lr_kind: "cosine" | "constant" */
    F_ATTENTION, /* bool sparse: "sparse" | "dense" */
    F_ORDER,     /* bool shuffle: "shuffle" | "sequential" */
    F_PRECISION, /* trex_dtype: "fp32" (TREX_F32) | "bf16" (TREX_BF16) */
    F_RECOMPUTE, /* trex_model_recompute: "none" | "attention" | "moe" | "full" | "full-keep-core" |
                  * "attention-keep-core" */
    F_MUON_NS,   /* trex_muon_ns: "bf16" | "fp32" */
} ftype;

typedef struct tfield {
    const char *name;
    ftype type;
    size_t off;
} tfield;

#define TF(n, t) {#n, t, offsetof(trex_train_settings, n)}
#define TO(n, m, t) {n, t, offsetof(trex_train_settings, opt.m)}
static const tfield tfields[] = {
    TF(config, F_PATH),
    TF(data, F_PATH),
    TF(eval_data, F_PATH),
    TF(tokenizer, F_PATH),
    TF(init, F_PATH),
    TF(out, F_PATH),
    TF(steps, F_I64),
    TF(seq, F_I64),
    TF(gbs, F_I64),
    TF(mbs, F_I64),
    {"data_order", F_ORDER, offsetof(trex_train_settings, shuffle)},
    TO("optimizer", kind, F_OPTIM),
    TO("muon_ns", muon_ns, F_MUON_NS),
    TO("lr", lr, F_F64),
    TO("min_lr", min_lr, F_F64),
    TO("warmup", warmup_steps, F_I64),
    TO("schedule", schedule, F_SCHEDULE),
    TO("weight_decay", weight_decay, F_F64),
    TO("clip", clip_norm, F_F64),
    TO("beta1", beta1, F_F64),
    TO("beta2", beta2, F_F64),
    TO("eps", eps, F_F64),
    TO("bias_update_speed", bias_update_speed, F_F64),
    TF(mtp_weight, F_F64),
    TF(mtp_weight_late, F_F64),
    TF(mtp_switch, F_I64),
    TF(balance_weight, F_F64),
    TF(indexer_weight, F_F64),
    TF(indexer_warmup, F_I64),
    {"attention", F_ATTENTION, offsetof(trex_train_settings, sparse)},
    TF(eval_every, F_I64),
    TF(eval_batches, F_I64),
    TF(save_every, F_I64),
    TF(keep, F_I64),
    TF(expert_load_every, F_I64),
    TF(max_bad_steps, F_I64),
    TF(seed, F_U64),
    TF(deterministic, F_BOOL),
    {"precision", F_PRECISION, offsetof(trex_train_settings, compute)},
    TF(weight_copies, F_BOOL),
    {"recompute", F_RECOMPUTE, offsetof(trex_train_settings, recompute)},
    TF(threads, F_I64),
    TF(peak_tflops, F_F64),
    TF(cluster, F_PATH),
};
#undef TF
#undef TO
#define NTFIELDS (sizeof tfields / sizeof tfields[0])

void trex_train_defaults(trex_train_settings *s)
{
    memset(s, 0, sizeof *s);
    s->steps = 100;
    s->seq = 0;
    s->gbs = 8;
    s->mbs = 1;
    s->shuffle = true;
    trex_optimizer_defaults(&s->opt);
    s->opt.kind = TREX_OPTIM_ADAMW;
    s->opt.lr = 3e-4;
    s->opt.min_lr = 3e-5;
    s->opt.schedule = TREX_LR_COSINE;
    s->opt.warmup_steps = 0;
    s->mtp_weight = 0.3;
    s->weight_copies = true;
    s->mtp_weight_late = 0.1;
    s->mtp_switch = -1;
    s->balance_weight = 1e-4;
    s->indexer_weight = 1.0;
    s->indexer_warmup = 0;
    s->sparse = true;
    s->eval_every = 0;
    s->eval_batches = 8;
    s->save_every = 0;
    s->keep = 3;
    s->expert_load_every = 10;
    s->max_bad_steps = 5;
    s->seed = 1;
    s->compute = TREX_F32;
    s->threads = 0;
    s->peak_tflops = 0;
    snprintf(s->cluster, sizeof s->cluster, "configs/clusters/local.json");
}

static const tfield *find_field(const char *name)
{
    for (size_t i = 0; i < NTFIELDS; i++)
        if (!strcmp(tfields[i].name, name))
            return &tfields[i];
    return NULL;
}

static void *fptr(trex_train_settings *s, const tfield *f)
{
    return (char *)s + f->off;
}

static const void *fcptr(const trex_train_settings *s, const tfield *f)
{
    return (const char *)s + f->off;
}

cJSON *trex_train_settings_to_json(const trex_train_settings *s)
{
    cJSON *j = cJSON_CreateObject();
    TREX_ASSERT(j);
    cJSON_AddStringToObject(j, "format", "trex-train-settings");
    cJSON_AddNumberToObject(j, "version", 1);
    for (size_t i = 0; i < NTFIELDS; i++) {
        const tfield *f = &tfields[i];
        const void *p = fcptr(s, f);
        cJSON *v = NULL;
        char buf[32];
        switch (f->type) {
        case F_PATH:
            v = cJSON_CreateString((const char *)p);
            break;
        case F_I64:
            v = cJSON_CreateNumber((double)*(const int64_t *)p);
            break;
        case F_U64: /* 64-bit seeds do not survive a JSON double: decimal string */
            snprintf(buf, sizeof buf, "%" PRIu64, *(const uint64_t *)p);
            v = cJSON_CreateString(buf);
            break;
        case F_F64:
            v = cJSON_CreateNumber(*(const double *)p);
            break;
        case F_BOOL:
            v = cJSON_CreateBool(*(const bool *)p);
            break;
        case F_OPTIM:
            v = cJSON_CreateString(trex_optim_kind_name(*(const trex_optim_kind *)p));
            break;
        case F_SCHEDULE:
            v = cJSON_CreateString(*(const trex_lr_kind *)p == TREX_LR_COSINE ? "cosine" : "constant");
            break;
        case F_ATTENTION:
            v = cJSON_CreateString(*(const bool *)p ? "sparse" : "dense");
            break;
        case F_ORDER:
            v = cJSON_CreateString(*(const bool *)p ? "shuffle" : "sequential");
            break;
        case F_PRECISION:
            v = cJSON_CreateString(*(const trex_dtype *)p == TREX_BF16 ? "bf16" : "fp32");
            break;
        case F_MUON_NS:
            v = cJSON_CreateString(trex_muon_ns_name(*(const trex_muon_ns *)p));
            break;
        case F_RECOMPUTE:
            v = cJSON_CreateString(trex_model_recompute_name(*(const trex_model_recompute *)p));
            break;
        }
        TREX_ASSERT(v);
        cJSON_AddItemToObject(j, f->name, v);
    }
    return j;
}

static bool parse_i64(const char *t, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (errno || end == t || *end)
        return false;
    *out = v;
    return true;
}

static bool parse_u64(const char *t, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*t == '-')
        return false;
    unsigned long long v = strtoull(t, &end, 10);
    if (errno || end == t || *end)
        return false;
    *out = v;
    return true;
}

static bool parse_f64(const char *t, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(t, &end);
    if (errno || end == t || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

/* Sets a field from text. The message names `label` (a flag or a file) and says what is expected. */
static trex_code set_text(trex_train_settings *s, const tfield *f, const char *t, const char *label,
                          trex_err *err)
{
    void *p = fptr(s, f);
    switch (f->type) {
    case F_PATH:
        if (strlen(t) >= TREX_TRAIN_PATH)
            return trex_err_set(err, TREX_EINVAL, "%s: the path is longer than %d bytes", label,
                                TREX_TRAIN_PATH - 1);
        snprintf((char *)p, TREX_TRAIN_PATH, "%s", t);
        return TREX_OK;
    case F_I64:
        if (!parse_i64(t, (int64_t *)p))
            return trex_err_set(err, TREX_EINVAL, "%s: '%s' is not an integer", label, t);
        return TREX_OK;
    case F_U64:
        if (!parse_u64(t, (uint64_t *)p))
            return trex_err_set(err, TREX_EINVAL, "%s: '%s' is not an unsigned 64-bit integer", label, t);
        return TREX_OK;
    case F_F64:
        if (!parse_f64(t, (double *)p))
            return trex_err_set(err, TREX_EINVAL, "%s: '%s' is not a finite number", label, t);
        return TREX_OK;
    case F_BOOL:
        if (!strcmp(t, "true") || !strcmp(t, "1"))
            *(bool *)p = true;
        else if (!strcmp(t, "false") || !strcmp(t, "0"))
            *(bool *)p = false;
        else
            return trex_err_set(err, TREX_EINVAL, "%s: '%s' is not true or false", label, t);
        return TREX_OK;
    case F_OPTIM:
        if (!strcmp(t, "adamw"))
            *(trex_optim_kind *)p = TREX_OPTIM_ADAMW;
        else if (!strcmp(t, "muon"))
            *(trex_optim_kind *)p = TREX_OPTIM_MUON;
        else
            return trex_err_set(err, TREX_EINVAL, "%s: '%s' is not an optimizer (use adamw or muon)", label, t);
        return TREX_OK;
    case F_SCHEDULE:
        if (!strcmp(t, "cosine"))
            *(trex_lr_kind *)p = TREX_LR_COSINE;
        else if (!strcmp(t, "constant"))
            *(trex_lr_kind *)p = TREX_LR_CONSTANT;
        else
            return trex_err_set(err, TREX_EINVAL, "%s: '%s' is not a schedule (use cosine or constant)", label, t);
        return TREX_OK;
    case F_ATTENTION:
        if (!strcmp(t, "sparse") || !strcmp(t, "dense"))
            *(bool *)p = !strcmp(t, "sparse");
        else
            return trex_err_set(err, TREX_EINVAL, "%s: '%s' is not an attention mode (use sparse or dense)",
                                label, t);
        return TREX_OK;
    case F_ORDER:
        if (!strcmp(t, "shuffle") || !strcmp(t, "sequential"))
            *(bool *)p = !strcmp(t, "shuffle");
        else
            return trex_err_set(err, TREX_EINVAL, "%s: '%s' is not a data order (use shuffle or sequential)",
                                label, t);
        return TREX_OK;
    case F_PRECISION:
        if (!strcmp(t, "fp32"))
            *(trex_dtype *)p = TREX_F32;
        else if (!strcmp(t, "bf16"))
            *(trex_dtype *)p = TREX_BF16;
        else
            return trex_err_set(err, TREX_EINVAL,
                                "%s: '%s' is not a precision (use fp32, the reference, or bf16: bf16 matrix products "
                                "with fp32 sums, docs/precision.md)",
                                label, t);
        return TREX_OK;
    case F_MUON_NS:
        return trex_muon_ns_parse(t, (trex_muon_ns *)p, err) == TREX_OK
                   ? TREX_OK
                   : trex_err_set(err, TREX_EINVAL,
                                  "%s: '%s' is not a Newton-Schulz precision (use bf16: bf16 products with "
                                  "fp32 sums, or fp32: the reference; docs/optim.md)",
                                  label, t);
    case F_RECOMPUTE:
        if (!trex_model_recompute_parse(t, (trex_model_recompute *)p))
            return trex_err_set(err, TREX_EINVAL,
                                "%s: '%s' is not a recompute policy (use none; attention or moe: that "
                                "sub-layer's forward runs again in the backward; full: the blocks' "
                                "forward runs again in the backward; or full-keep-core, "
                                "attention-keep-core: full, attention without the attention core loop; "
                                "docs/perf.md)",
                                label, t);
        return TREX_OK;
    }
    TREX_ABORT("unknown field type %d", (int)f->type);
}

trex_code trex_train_settings_set(trex_train_settings *s, const char *name, const char *text, trex_err *err)
{
    const tfield *f = find_field(name);
    if (!f)
        return trex_err_set(err, TREX_EINVAL, "unknown training setting '%s'", name);
    char label[96];
    snprintf(label, sizeof label, "--");
    size_t k = 2;
    for (const char *c = name; *c && k + 1 < sizeof label; c++)
        label[k++] = *c == '_' ? '-' : *c;
    label[k] = 0;
    return set_text(s, f, text, label, err);
}

trex_code trex_train_settings_from_json(trex_train_settings *s, const cJSON *json, const char *label,
                                        trex_err *err)
{
    if (!cJSON_IsObject(json))
        return trex_err_set(err, TREX_EINVAL, "%s: training settings must be a JSON object", label);
    const cJSON *it;
    cJSON_ArrayForEach(it, json)
    {
        const char *name = it->string;
        if (!strcmp(name, "format")) {
            if (!cJSON_IsString(it) || strcmp(it->valuestring, "trex-train-settings"))
                return trex_err_set(err, TREX_EINVAL, "%s: \"format\" must be \"trex-train-settings\"", label);
            continue;
        }
        if (!strcmp(name, "version")) {
            if (!cJSON_IsNumber(it) || it->valuedouble != 1)
                return trex_err_set(err, TREX_EINVAL, "%s: \"version\" must be 1", label);
            continue;
        }
        if (!strcmp(name, "kernels")) /* written by the run for information; checked by --deterministic resume */
            continue;
        const tfield *f = find_field(name);
        if (!f)
            return trex_err_set(err, TREX_EINVAL,
                                "%s: unknown field \"%s\" (the fields are the flags of `trex train` with '_' for "
                                "'-', see docs/train.md)",
                                label, name);
        char where[TREX_TRAIN_PATH + 64];
        snprintf(where, sizeof where, "%s: \"%s\"", label, name);
        char num[64];
        const char *text = NULL;
        switch (f->type) {
        case F_I64:
            if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || fabs(it->valuedouble) > 9e15)
                return trex_err_set(err, TREX_EINVAL, "%s must be an integer", where);
            snprintf(num, sizeof num, "%.0f", it->valuedouble);
            text = num;
            break;
        case F_F64:
            if (!cJSON_IsNumber(it))
                return trex_err_set(err, TREX_EINVAL, "%s must be a number", where);
            snprintf(num, sizeof num, "%.17g", it->valuedouble);
            text = num;
            break;
        case F_BOOL:
            if (!cJSON_IsBool(it))
                return trex_err_set(err, TREX_EINVAL, "%s must be true or false", where);
            text = cJSON_IsTrue(it) ? "true" : "false";
            break;
        case F_U64:
            if (cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble == floor(it->valuedouble) &&
                it->valuedouble < 9e15) {
                snprintf(num, sizeof num, "%.0f", it->valuedouble);
                text = num;
                break;
            }
            if (!cJSON_IsString(it))
                return trex_err_set(err, TREX_EINVAL, "%s must be a decimal string or a non-negative integer", where);
            text = it->valuestring;
            break;
        default:
            if (!cJSON_IsString(it))
                return trex_err_set(err, TREX_EINVAL, "%s must be a string", where);
            text = it->valuestring;
            break;
        }
        TREX_TRY(set_text(s, f, text, where, err));
    }
    return TREX_OK;
}

static trex_code bad(trex_err *err, const char *flag, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static trex_code bad(trex_err *err, const char *flag, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return trex_err_set(err, TREX_EINVAL, "%s: %s", flag, msg);
}

trex_code trex_train_settings_check(const trex_train_settings *s, trex_err *err)
{
    if (!s->config[0])
        return bad(err, "--config", "missing: give the model config.json");
    if (!s->data[0])
        return bad(err, "--data", "missing: give the token shard folder (trex data tokenize --out DIR)");
    if (!s->tokenizer[0])
        return bad(err, "--tokenizer", "missing: give the tokenizer.json the shards were made with");
    if (!s->out[0])
        return bad(err, "--out", "missing: give the run directory");
    if (s->steps < 1 || s->steps > (int64_t)1e12)
        return bad(err, "--steps", "%" PRId64 " must be >= 1", s->steps);
    if (s->seq < 0 || s->seq == 1 || s->seq > (1 << 24))
        return bad(err, "--seq", "%" PRId64 " must be >= 2 (0: the shards' sequence length)", s->seq);
    if (s->mbs < 1 || s->mbs > 65536)
        return bad(err, "--mbs", "%" PRId64 " must be in [1, 65536]", s->mbs);
    if (s->gbs < 1 || s->gbs % s->mbs)
        return bad(err, "--gbs", "%" PRId64 " must be a positive multiple of --mbs %" PRId64
                   " (gbs/mbs micro-batches per step)", s->gbs, s->mbs);
    if (s->gbs / s->mbs > 65536)
        return bad(err, "--gbs", "%" PRId64 " / --mbs %" PRId64 " is more than 65536 micro-batches", s->gbs, s->mbs);
    if (!(s->opt.lr > 0))
        return bad(err, "--lr", "%g must be > 0", s->opt.lr);
    if (s->opt.warmup_steps < 0 || (s->opt.schedule == TREX_LR_COSINE && s->opt.warmup_steps >= s->steps))
        return bad(err, "--warmup", "%" PRId64 " must be >= 0 and, with the cosine schedule, below --steps %" PRId64,
                   s->opt.warmup_steps, s->steps);
    if (s->opt.min_lr < 0 || (s->opt.schedule == TREX_LR_COSINE && s->opt.min_lr > s->opt.lr))
        return bad(err, "--min-lr", "%g must be in [0, --lr %g]", s->opt.min_lr, s->opt.lr);
    if (s->mtp_weight < 0 || s->mtp_weight_late < 0)
        return bad(err, "--mtp-weight", "%g / --mtp-weight-late %g must be >= 0", s->mtp_weight, s->mtp_weight_late);
    if (s->mtp_switch < -1)
        return bad(err, "--mtp-switch", "%" PRId64 " must be >= 0 (-1: when the lr decay starts)", s->mtp_switch);
    if (s->balance_weight < 0)
        return bad(err, "--balance-weight", "%g must be >= 0", s->balance_weight);
    if (s->indexer_weight < 0)
        return bad(err, "--indexer-weight", "%g must be >= 0", s->indexer_weight);
    if (s->indexer_warmup < 0 || s->indexer_warmup > s->steps)
        return bad(err, "--indexer-warmup", "%" PRId64 " must be in [0, --steps]", s->indexer_warmup);
    if (s->eval_every < 0)
        return bad(err, "--eval-every", "%" PRId64 " must be >= 0 (0: after the last step only)", s->eval_every);
    if (s->eval_batches < 0)
        return bad(err, "--eval-batches", "%" PRId64 " must be >= 0 (0: the whole held-out set)", s->eval_batches);
    if (s->save_every < 0)
        return bad(err, "--save-every", "%" PRId64 " must be >= 0 (0: after the last step only)", s->save_every);
    if (s->keep < 0 || s->keep > 1000000)
        return bad(err, "--keep", "%" PRId64 " must be >= 0 (0: keep every checkpoint)", s->keep);
    if (s->expert_load_every < 0)
        return bad(err, "--expert-load-every", "%" PRId64 " must be >= 0 (0: never)", s->expert_load_every);
    if (s->max_bad_steps < 1)
        return bad(err, "--max-bad-steps", "%" PRId64 " must be >= 1", s->max_bad_steps);
    if (s->threads < 0 || s->threads > 4096)
        return bad(err, "--threads", "%" PRId64 " must be in [0, 4096] (0: TREX_THREADS or every core)", s->threads);
    if (s->peak_tflops < 0)
        return bad(err, "--peak-tflops", "%g must be >= 0 (0: from --cluster)", s->peak_tflops);
    trex_optimizer_settings o = s->opt;
    o.total_steps = s->steps;
    trex_code rc = trex_optimizer_settings_check(&o, err);
    if (rc != TREX_OK)
        trex_err_prefix(err, "training settings");
    return rc;
}

void trex_train_settings_print(const trex_train_settings *s, FILE *out)
{
    fprintf(out, "trex train: settings");
    for (size_t i = 0; i < NTFIELDS; i++) {
        const tfield *f = &tfields[i];
        const void *p = fcptr(s, f);
        fprintf(out, "%s%s=", i % 6 == 0 ? "\n  " : " ", f->name);
        switch (f->type) {
        case F_PATH:
            fprintf(out, "%s", *(const char *)p ? (const char *)p : "-");
            break;
        case F_I64:
            fprintf(out, "%" PRId64, *(const int64_t *)p);
            break;
        case F_U64:
            fprintf(out, "%" PRIu64, *(const uint64_t *)p);
            break;
        case F_F64:
            fprintf(out, "%g", *(const double *)p);
            break;
        case F_BOOL:
            fprintf(out, "%s", *(const bool *)p ? "true" : "false");
            break;
        case F_OPTIM:
            fprintf(out, "%s", trex_optim_kind_name(*(const trex_optim_kind *)p));
            break;
        case F_SCHEDULE:
            fprintf(out, "%s", *(const trex_lr_kind *)p == TREX_LR_COSINE ? "cosine" : "constant");
            break;
        case F_ATTENTION:
            fprintf(out, "%s", *(const bool *)p ? "sparse" : "dense");
            break;
        case F_ORDER:
            fprintf(out, "%s", *(const bool *)p ? "shuffle" : "sequential");
            break;
        case F_PRECISION:
            fprintf(out, "%s", *(const trex_dtype *)p == TREX_BF16 ? "bf16" : "fp32");
            break;
        case F_MUON_NS:
            fprintf(out, "%s", trex_muon_ns_name(*(const trex_muon_ns *)p));
            break;
        case F_RECOMPUTE:
            fprintf(out, "%s", trex_model_recompute_name(*(const trex_model_recompute *)p));
            break;
        }
    }
    fputc('\n', out);
}

/* The settings a resumed run must keep (they define which sequences a step sees and how they are
 * combined). Returns the first differing one's name, or NULL. */
const char *trex_train_settings_fixed_diff(const trex_train_settings *a, const trex_train_settings *b,
                                           char *va, char *vb, size_t cap)
{
    static const char *const fixed[] = {"seq",  "gbs",  "mbs",          "data_order",
                                         "optimizer", "seed", "deterministic", "precision"};
    cJSON *ja = trex_train_settings_to_json(a), *jb = trex_train_settings_to_json(b);
    const char *diff = NULL;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && !diff; i++) {
        char *pa = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(ja, fixed[i]));
        char *pb = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(jb, fixed[i]));
        TREX_ASSERT(pa && pb);
        if (strcmp(pa, pb)) {
            diff = fixed[i];
            snprintf(va, cap, "%s", pa);
            snprintf(vb, cap, "%s", pb);
        }
        free(pa);
        free(pb);
    }
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    return diff;
}
