/* optim/optim.c — parameter groups, AdamW, the Muon step around Newton–Schulz (optim/muon.c), LR
 * schedules, gradient norm and clipping, the aux-loss-free bias update, and state save/load.
 *
 * The plan (trex_optimizer_create) walks the layout once: each trainable tensor gets a group, a weight
 * decay flag and an offset in the one state block; Muon tensors are cut into logical matrices (wo_a
 * into its o_groups row blocks); trainable elements are cut into fixed chunks of CHUNK elements for the
 * element-wise work (gradient norm and AdamW: the optimizer kernels of kernels/kernels.h, the same bits
 * at every ISA level; gradient clipping is folded into the step's reads of the gradients). Muon
 * matrices below muon_large_numel are assigned to nthreads workers once (longest first, each to the
 * least loaded worker); each worker owns a workspace. A matrix is always orthogonalised by one call
 * with a fixed GEMM order, so the bits never depend on the thread count. */
#include "trex/optim.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "trex/safetensors.h"
#include "trex/tensor.h"

#define CHUNK (INT64_C(1) << 16)            /* elements per chunk of element-wise work */
#define LARGE_DEFAULT (INT64_C(1) << 20)    /* default muon_large_numel */

typedef struct chunk {
    int64_t param;
    int64_t begin; /* element offset in the parameter buffer */
    int64_t len;
} chunk;

struct trex_optimizer {
    const trex_layout *lay;
    trex_optimizer_settings s;
    int nthreads;
    trex_mem *mem;
    int64_t step;

    uint8_t *group;     /* [count] trex_optim_group */
    uint8_t *decay;     /* [count] weight decay applies */
    int64_t *state_off; /* [count] float offset of the tensor's state, -1 when none */
    float *state;       /* TREX_REGION_OPTIM */
    size_t state_floats;

    int64_t n_muon;
    trex_muon_matrix *muon;
    int64_t n_large;
    int64_t *large;        /* indices of muon matrices done one at a time, in layout order */
    int64_t *worker_start; /* [nthreads + 1] CSR over worker_units */
    int64_t *worker_units; /* small muon matrices of each worker, longest first */
    float **ws;            /* [nthreads] workspace of each worker (carved from ws_block) */
    trex_gemm_ws **gws;    /* [nthreads] bf16 GEMM workspace of each worker (Newton–Schulz in bf16) */
    float *ws_block;       /* TREX_REGION_BUFFERS */

    int64_t n_chunks; /* every trainable tensor */
    chunk *chunks;
    int64_t n_adam; /* chunks of AdamW tensors */
    chunk *adam;
    double *chunk_sq;   /* [n_chunks] sums of squares (TREX_REGION_BUFFERS) */
    int64_t *chunk_bad; /* [n_chunks] NaN/Inf counts */

    /* bf16 copies written by the step (trex_optimizer_set_copies): the copy set, per tensor its index
     * in it (-1: none); copy_base is the params buffer they follow. */
    const float *copy_base;
    const trex_wcopy *copies;
    int64_t *copy_idx;
};

/* ---- settings ---------------------------------------------------------------------------------- */

void trex_optimizer_defaults(trex_optimizer_settings *s)
{
    TREX_ASSERT(s);
    memset(s, 0, sizeof *s);
    s->kind = TREX_OPTIM_MUON;
    s->lr = 2.7e-4;
    s->beta1 = 0.9;
    s->beta2 = 0.95;
    s->eps = 1e-20;
    s->weight_decay = 0.1;
    s->decay_1d = false;
    s->muon_momentum = 0.95;
    s->nesterov = true;
    s->update_rms = 0.18;
    s->schedule = TREX_LR_CONSTANT;
    s->warmup_steps = 0;
    s->total_steps = 0;
    s->min_lr = 2.7e-5;
    s->clip_norm = 1.0;
    s->bias_update_speed = 1e-3;
    s->muon_large_numel = 0;
    s->muon_ns = TREX_NS_BF16;
}

const char *trex_muon_ns_name(trex_muon_ns p)
{
    return p == TREX_NS_BF16 ? "bf16" : p == TREX_NS_FP32 ? "fp32" : "?";
}

trex_code trex_muon_ns_parse(const char *text, trex_muon_ns *out, trex_err *err)
{
    TREX_ASSERT(text && out);
    if (!strcmp(text, "bf16"))
        *out = TREX_NS_BF16;
    else if (!strcmp(text, "fp32"))
        *out = TREX_NS_FP32;
    else
        return trex_err_set(err, TREX_EINVAL, "Muon Newton-Schulz precision '%s'; use 'bf16' or 'fp32'", text);
    return TREX_OK;
}

const char *trex_optim_kind_name(trex_optim_kind k)
{
    return k == TREX_OPTIM_ADAMW ? "adamw" : k == TREX_OPTIM_MUON ? "muon" : "?";
}

const char *trex_optim_group_name(trex_optim_group g)
{
    switch (g) {
    case TREX_GROUP_ADAMW:
        return "adamw";
    case TREX_GROUP_MUON:
        return "muon";
    case TREX_GROUP_FROZEN:
        return "frozen";
    }
    return "?";
}

static const char *schedule_name(trex_lr_kind k)
{
    return k == TREX_LR_COSINE ? "cosine" : k == TREX_LR_CONSTANT ? "constant" : "?";
}

typedef enum ftype { F_DOUBLE, F_INT, F_BOOL, F_KIND, F_SCHEDULE, F_NS } ftype;

typedef struct sfield {
    const char *name;
    ftype type;
    size_t off;
} sfield;

#define SF(n, t) {#n, t, offsetof(trex_optimizer_settings, n)}
static const sfield sfields[] = {
    SF(kind, F_KIND),
    SF(lr, F_DOUBLE),
    SF(beta1, F_DOUBLE),
    SF(beta2, F_DOUBLE),
    SF(eps, F_DOUBLE),
    SF(weight_decay, F_DOUBLE),
    SF(decay_1d, F_BOOL),
    SF(muon_momentum, F_DOUBLE),
    SF(nesterov, F_BOOL),
    SF(update_rms, F_DOUBLE),
    SF(schedule, F_SCHEDULE),
    SF(warmup_steps, F_INT),
    SF(total_steps, F_INT),
    SF(min_lr, F_DOUBLE),
    SF(clip_norm, F_DOUBLE),
    SF(bias_update_speed, F_DOUBLE),
    SF(muon_large_numel, F_INT),
    SF(muon_ns, F_NS),
};
#undef SF
#define NSFIELDS (sizeof sfields / sizeof sfields[0])

static trex_code bad_setting(trex_err *err, const char *name, double v, const char *range)
{
    return trex_err_set(err, TREX_EINVAL, "optimizer setting '%s' = %g is out of range: it must be %s", name, v,
                        range);
}

trex_code trex_optimizer_settings_check(const trex_optimizer_settings *s, trex_err *err)
{
    TREX_ASSERT(s);
    if (s->kind != TREX_OPTIM_MUON && s->kind != TREX_OPTIM_ADAMW)
        return trex_err_set(err, TREX_EINVAL, "optimizer setting 'kind' = %d is not 'muon' or 'adamw'",
                            (int)s->kind);
    if (s->muon_ns != TREX_NS_BF16 && s->muon_ns != TREX_NS_FP32)
        return trex_err_set(err, TREX_EINVAL, "optimizer setting 'muon_ns' = %d is not 'bf16' or 'fp32'",
                            (int)s->muon_ns);
    if (s->schedule != TREX_LR_CONSTANT && s->schedule != TREX_LR_COSINE)
        return trex_err_set(err, TREX_EINVAL, "optimizer setting 'schedule' = %d is not 'constant' or 'cosine'",
                            (int)s->schedule);
    const struct {
        const char *name;
        double v, lo, hi;
        bool hi_open;
        const char *range;
    } r[] = {
        {"lr", s->lr, 0, INFINITY, false, "finite and >= 0"},
        {"beta1", s->beta1, 0, 1, true, "in [0, 1)"},
        {"beta2", s->beta2, 0, 1, true, "in [0, 1)"},
        {"eps", s->eps, 0, INFINITY, false, "finite and >= 0"},
        {"weight_decay", s->weight_decay, 0, INFINITY, false, "finite and >= 0"},
        {"muon_momentum", s->muon_momentum, 0, 1, true, "in [0, 1)"},
        {"update_rms", s->update_rms, 0, INFINITY, false, "finite and >= 0"},
        {"min_lr", s->min_lr, 0, INFINITY, false, "finite and >= 0"},
        {"clip_norm", s->clip_norm, 0, INFINITY, false, "finite and >= 0 (0 turns clipping off)"},
        {"bias_update_speed", s->bias_update_speed, 0, INFINITY, false, "finite and >= 0"},
    };
    for (size_t k = 0; k < sizeof r / sizeof r[0]; k++) {
        const double v = r[k].v;
        if (!isfinite(v) || v < r[k].lo || (r[k].hi_open ? v >= r[k].hi : v > r[k].hi))
            return bad_setting(err, r[k].name, v, r[k].range);
    }
    if (s->warmup_steps < 0)
        return bad_setting(err, "warmup_steps", (double)s->warmup_steps, ">= 0");
    if (s->total_steps < 0)
        return bad_setting(err, "total_steps", (double)s->total_steps, ">= 0");
    if (s->muon_large_numel < 0)
        return bad_setting(err, "muon_large_numel", (double)s->muon_large_numel, ">= 0 (0: the default)");
    if (s->schedule == TREX_LR_COSINE) {
        if (s->total_steps <= s->warmup_steps)
            return trex_err_set(err, TREX_EINVAL,
                                "optimizer setting 'total_steps' = %" PRId64 " must exceed 'warmup_steps' = %" PRId64
                                " for the cosine schedule (the decay runs from warmup_steps to total_steps)",
                                s->total_steps, s->warmup_steps);
        if (s->min_lr > s->lr)
            return trex_err_set(err, TREX_EINVAL,
                                "optimizer setting 'min_lr' = %g exceeds 'lr' = %g; the cosine schedule decays "
                                "from lr down to min_lr",
                                s->min_lr, s->lr);
    }
    return TREX_OK;
}

cJSON *trex_optimizer_settings_to_json(const trex_optimizer_settings *s)
{
    TREX_ASSERT(s);
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    for (size_t k = 0; k < NSFIELDS; k++) {
        const void *p = (const char *)s + sfields[k].off;
        cJSON *v = NULL;
        switch (sfields[k].type) {
        case F_DOUBLE:
            v = cJSON_CreateNumber(*(const double *)p);
            break;
        case F_INT:
            v = cJSON_CreateNumber((double)*(const int64_t *)p);
            break;
        case F_BOOL:
            v = cJSON_CreateBool(*(const bool *)p);
            break;
        case F_KIND:
            v = cJSON_CreateString(trex_optim_kind_name(*(const trex_optim_kind *)p));
            break;
        case F_SCHEDULE:
            v = cJSON_CreateString(schedule_name(*(const trex_lr_kind *)p));
            break;
        case F_NS:
            v = cJSON_CreateString(trex_muon_ns_name(*(const trex_muon_ns *)p));
            break;
        }
        if (!v || !cJSON_AddItemToObject(o, sfields[k].name, v)) {
            cJSON_Delete(v);
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

static trex_code parse_sfield(trex_optimizer_settings *s, const sfield *f, const cJSON *j, const char *label,
                              trex_err *err)
{
    void *p = (char *)s + f->off;
    switch (f->type) {
    case F_DOUBLE:
        if (!cJSON_IsNumber(j))
            break;
        *(double *)p = j->valuedouble;
        return TREX_OK;
    case F_INT: {
        if (!cJSON_IsNumber(j))
            break;
        const double v = j->valuedouble;
        if (v != floor(v) || fabs(v) > 9007199254740992.0)
            return trex_err_set(err, TREX_EINVAL, "%s: optimizer setting '%s' = %g must be a whole number", label,
                                f->name, v);
        *(int64_t *)p = (int64_t)v;
        return TREX_OK;
    }
    case F_BOOL:
        if (!cJSON_IsBool(j))
            break;
        *(bool *)p = cJSON_IsTrue(j);
        return TREX_OK;
    case F_KIND:
        if (!cJSON_IsString(j))
            break;
        if (!strcmp(j->valuestring, "muon"))
            *(trex_optim_kind *)p = TREX_OPTIM_MUON;
        else if (!strcmp(j->valuestring, "adamw"))
            *(trex_optim_kind *)p = TREX_OPTIM_ADAMW;
        else
            return trex_err_set(err, TREX_EINVAL, "%s: optimizer setting 'kind' = \"%s\"; use \"muon\" or \"adamw\"",
                                label, j->valuestring);
        return TREX_OK;
    case F_SCHEDULE:
        if (!cJSON_IsString(j))
            break;
        if (!strcmp(j->valuestring, "constant"))
            *(trex_lr_kind *)p = TREX_LR_CONSTANT;
        else if (!strcmp(j->valuestring, "cosine"))
            *(trex_lr_kind *)p = TREX_LR_COSINE;
        else
            return trex_err_set(err, TREX_EINVAL,
                                "%s: optimizer setting 'schedule' = \"%s\"; use \"constant\" or \"cosine\"", label,
                                j->valuestring);
        return TREX_OK;
    case F_NS:
        if (!cJSON_IsString(j))
            break;
        if (!strcmp(j->valuestring, "bf16"))
            *(trex_muon_ns *)p = TREX_NS_BF16;
        else if (!strcmp(j->valuestring, "fp32"))
            *(trex_muon_ns *)p = TREX_NS_FP32;
        else
            return trex_err_set(err, TREX_EINVAL, "%s: optimizer setting 'muon_ns' = \"%s\"; use \"bf16\" or \"fp32\"",
                                label, j->valuestring);
        return TREX_OK;
    }
    static const char *const want[] = {"a number", "a whole number", "true or false", "a string", "a string",
                                       "a string"};
    return trex_err_set(err, TREX_EINVAL, "%s: optimizer setting '%s' must be %s", label, f->name,
                        want[f->type]);
}

trex_code trex_optimizer_settings_from_json(trex_optimizer_settings *s, const cJSON *json, const char *label,
                                            trex_err *err)
{
    TREX_ASSERT(s && label);
    trex_optimizer_defaults(s);
    if (!cJSON_IsObject(json))
        return trex_err_set(err, TREX_EINVAL, "%s: optimizer settings must be a JSON object", label);
    for (const cJSON *e = json->child; e; e = e->next) {
        size_t k;
        for (k = 0; k < NSFIELDS && strcmp(sfields[k].name, e->string); k++)
            ;
        if (k == NSFIELDS)
            return trex_err_set(err, TREX_EINVAL,
                                "%s: unknown optimizer setting '%s'; remove it or fix its spelling (see "
                                "docs/optim.md)",
                                label, e->string);
        TREX_TRY(parse_sfield(s, &sfields[k], e, label, err));
    }
    trex_code rc = trex_optimizer_settings_check(s, err);
    if (rc != TREX_OK)
        trex_err_prefix(err, "%s", label);
    return rc;
}

/* ---- schedule, groups, bias update ------------------------------------------------------------- */

double trex_lr_at(const trex_optimizer_settings *s, int64_t step)
{
    TREX_ASSERT(s && step >= 0);
    if (step < s->warmup_steps)
        return s->lr * (double)(step + 1) / (double)s->warmup_steps;
    if (s->schedule == TREX_LR_CONSTANT)
        return s->lr;
    if (step >= s->total_steps)
        return s->min_lr;
    const double p = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}

trex_optim_group trex_optim_group_of(const trex_param *p, trex_optim_kind kind)
{
    TREX_ASSERT(p);
    if (!p->trainable || p->is_int)
        return TREX_GROUP_FROZEN;
    if (kind == TREX_OPTIM_ADAMW || p->ndim != 2)
        return TREX_GROUP_ADAMW;
    switch (p->kind) {
    case TREX_P_EMBED:
    case TREX_P_HEAD:
    case TREX_P_NORM:
    case TREX_P_HC_BASE:
    case TREX_P_HC_SCALE:
    case TREX_P_ATTN_SINK:
    case TREX_P_APE:
        return TREX_GROUP_ADAMW;
    default:
        return TREX_GROUP_MUON;
    }
}

static size_t align16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

static size_t state_floats_of(const trex_param *p, trex_optim_group g)
{
    return g == TREX_GROUP_ADAMW ? 2 * align16((size_t)p->numel) : g == TREX_GROUP_MUON ? align16((size_t)p->numel) : 0;
}

size_t trex_optimizer_state_bytes(const trex_layout *lay, trex_optim_kind kind)
{
    TREX_ASSERT(lay);
    size_t n = 0;
    for (int64_t k = 0; k < lay->count; k++)
        n += state_floats_of(&lay->params[k], trex_optim_group_of(&lay->params[k], kind));
    return n * sizeof(float);
}

void trex_optim_bias_update(float *bias, const int64_t *load, int64_t n, double gamma)
{
    TREX_ASSERT(n >= 0 && (n == 0 || (bias && load)));
    if (n == 0)
        return;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)load[i];
    const double mean = sum / (double)n;
    for (int64_t i = 0; i < n; i++) {
        const double d = mean - (double)load[i];
        const double sg = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
        bias[i] = (float)((double)bias[i] + gamma * sg);
    }
}

/* ---- plan and allocation ----------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && !strcmp(s + n - t, tail);
}

/* wo_a [G*d_g, (H/G)*c] is G independent matrices (one per output group); others are one matrix. */
static int64_t muon_splits(const trex_param *p, const trex_config *cfg)
{
    if (p->kind == TREX_P_ATTN && ends_with(p->name, ".attn.wo_a.weight"))
        return cfg->o_groups;
    return 1;
}

/* The FLOPs of a Newton–Schulz iteration in bf16 (r x r Gram of an r x c matrix and its square, both
 * symmetric products, then the r x r x c update), over r: the order of the workers' lists. */
static double muon_cost(const trex_muon_matrix *u)
{
    const double r = (double)(u->rows < u->cols ? u->rows : u->cols);
    const double c = (double)(u->rows < u->cols ? u->cols : u->rows);
    return r * r * (3.0 * c + r) + 1.0;
}

static size_t muon_ws_floats(const trex_muon_matrix *u)
{
    return align16((size_t)(u->rows * u->cols)) + trex_muon_workspace(u->rows, u->cols);
}

static bool decays(const trex_param *p, trex_optim_group g, const trex_optimizer_settings *s)
{
    return g != TREX_GROUP_FROZEN && s->weight_decay > 0 && (p->ndim == 2 || s->decay_1d);
}

typedef struct cost_ix {
    double cost;
    int64_t ix;
} cost_ix;

static int cmp_cost_desc(const void *a, const void *b)
{
    const cost_ix *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    return x->ix < y->ix ? -1 : x->ix > y->ix;
}

static void free_plan(trex_optimizer *o)
{
    free(o->group);
    free(o->decay);
    free(o->state_off);
    free(o->muon);
    free(o->large);
    free(o->worker_start);
    free(o->worker_units);
    free(o->ws);
    free(o->chunks);
    free(o->adam);
    free(o->copy_idx);
}

void trex_optimizer_destroy(trex_optimizer *o)
{
    if (!o)
        return;
    trex_mem_free(o->mem, TREX_REGION_OPTIM, o->state);
    trex_mem_free(o->mem, TREX_REGION_BUFFERS, o->ws_block);
    trex_mem_free(o->mem, TREX_REGION_BUFFERS, o->chunk_sq);
    trex_mem_free(o->mem, TREX_REGION_BUFFERS, o->chunk_bad);
    if (o->gws)
        for (int w = 0; w < o->nthreads; w++)
            trex_gemm_ws_destroy(o->gws[w]);
    free(o->gws);
    free_plan(o);
    free(o);
}

static void *xcalloc(size_t n, size_t size)
{
    return calloc(n ? n : 1, size);
}

/* Fills groups, decay flags, state offsets, Muon matrices and chunk lists. */
static trex_code plan_layout(trex_optimizer *o, const trex_config *cfg, trex_err *err)
{
    const trex_layout *lay = o->lay;
    const int64_t count = lay->count;
    o->group = xcalloc((size_t)count, 1);
    o->decay = xcalloc((size_t)count, 1);
    o->state_off = xcalloc((size_t)count, sizeof *o->state_off);
    if (!o->group || !o->decay || !o->state_off)
        return trex_err_set(err, TREX_ENOMEM, "optimizer: out of memory planning %" PRId64 " tensors", count);
    int64_t n_muon = 0, n_chunks = 0, n_adam = 0;
    size_t off = 0;
    for (int64_t k = 0; k < count; k++) {
        const trex_param *p = &lay->params[k];
        const trex_optim_group g = trex_optim_group_of(p, o->s.kind);
        o->group[k] = (uint8_t)g;
        o->decay[k] = decays(p, g, &o->s);
        o->state_off[k] = g == TREX_GROUP_FROZEN ? -1 : (int64_t)off;
        off += state_floats_of(p, g);
        if (g == TREX_GROUP_FROZEN)
            continue;
        const int64_t nc = (p->numel + CHUNK - 1) / CHUNK;
        n_chunks += nc;
        if (g == TREX_GROUP_ADAMW)
            n_adam += nc;
        if (g == TREX_GROUP_MUON) {
            const int64_t G = muon_splits(p, cfg);
            if (G < 1 || p->shape[0] % G)
                return trex_err_set(err, TREX_EINVAL,
                                    "optimizer: tensor '%s' has %" PRId64 " rows, not a multiple of o_groups = %" PRId64
                                    "; check the config",
                                    p->name, p->shape[0], G);
            n_muon += G;
        }
    }
    o->state_floats = off;
    o->n_muon = n_muon;
    o->n_chunks = n_chunks;
    o->n_adam = n_adam;
    o->muon = xcalloc((size_t)n_muon, sizeof *o->muon);
    o->chunks = xcalloc((size_t)n_chunks, sizeof *o->chunks);
    o->adam = xcalloc((size_t)n_adam, sizeof *o->adam);
    if (!o->muon || !o->chunks || !o->adam)
        return trex_err_set(err, TREX_ENOMEM, "optimizer: out of memory planning %" PRId64 " chunks", n_chunks);
    int64_t im = 0, ic = 0, ia = 0;
    for (int64_t k = 0; k < count; k++) {
        const trex_param *p = &lay->params[k];
        const trex_optim_group g = (trex_optim_group)o->group[k];
        if (g == TREX_GROUP_FROZEN)
            continue;
        for (int64_t b = 0; b < p->numel; b += CHUNK) {
            const chunk c = {k, p->offset + b, p->numel - b < CHUNK ? p->numel - b : CHUNK};
            o->chunks[ic++] = c;
            if (g == TREX_GROUP_ADAMW)
                o->adam[ia++] = c;
        }
        if (g == TREX_GROUP_MUON) {
            const int64_t G = muon_splits(p, cfg), rows = p->shape[0] / G;
            for (int64_t q = 0; q < G; q++)
                o->muon[im++] = (trex_muon_matrix){k, p->offset + q * rows * p->shape[1], rows, p->shape[1]};
        }
    }
    TREX_ASSERT(im == n_muon && ic == n_chunks && ia == n_adam);
    return TREX_OK;
}

/* Splits Muon matrices into large ones (done one at a time) and small ones assigned to workers. Returns
 * the workspace floats of each worker in ws_floats[nthreads]. */
static trex_code plan_muon(trex_optimizer *o, size_t *ws_floats, trex_err *err)
{
    const int nw = o->nthreads;
    const int64_t large_at = o->s.muon_large_numel > 0 ? o->s.muon_large_numel : LARGE_DEFAULT;
    o->large = xcalloc((size_t)o->n_muon, sizeof *o->large);
    o->worker_start = xcalloc((size_t)nw + 1, sizeof *o->worker_start);
    o->worker_units = xcalloc((size_t)o->n_muon, sizeof *o->worker_units);
    cost_ix *small = xcalloc((size_t)o->n_muon, sizeof *small);
    int *owner = xcalloc((size_t)o->n_muon, sizeof *owner);
    double *load = xcalloc((size_t)nw, sizeof *load);
    int64_t *fill = xcalloc((size_t)nw, sizeof *fill);
    trex_code rc = TREX_OK;
    if (!o->large || !o->worker_start || !o->worker_units || !small || !owner || !load || !fill) {
        rc = trex_err_set(err, TREX_ENOMEM, "optimizer: out of memory planning %" PRId64 " Muon matrices", o->n_muon);
        goto out;
    }
    int64_t n_small = 0;
    for (int64_t i = 0; i < o->n_muon; i++) {
        const trex_muon_matrix *u = &o->muon[i];
        if (ws_floats[0] < muon_ws_floats(u))
            ws_floats[0] = muon_ws_floats(u);
        if (u->rows * u->cols >= large_at && nw > 1)
            o->large[o->n_large++] = i;
        else
            small[n_small++] = (cost_ix){muon_cost(u), i};
    }
    qsort(small, (size_t)n_small, sizeof *small, cmp_cost_desc);
    for (int64_t j = 0; j < n_small; j++) {
        int best = 0;
        for (int w = 1; w < nw; w++)
            if (load[w] < load[best])
                best = w;
        load[best] += small[j].cost;
        owner[j] = best;
        o->worker_start[best + 1]++;
        const size_t need = muon_ws_floats(&o->muon[small[j].ix]);
        if (ws_floats[best] < need)
            ws_floats[best] = need;
    }
    for (int w = 0; w < nw; w++)
        o->worker_start[w + 1] += o->worker_start[w];
    for (int w = 0; w < nw; w++)
        fill[w] = o->worker_start[w];
    for (int64_t j = 0; j < n_small; j++)
        o->worker_units[fill[owner[j]]++] = small[j].ix;
out:
    free(small);
    free(owner);
    free(load);
    free(fill);
    return rc;
}

trex_code trex_optimizer_create(trex_optimizer **out, const trex_layout *lay, const trex_config *cfg,
                                const trex_optimizer_settings *s, int nthreads, trex_mem *mem, trex_err *err)
{
    TREX_ASSERT(out && lay && cfg && s);
    *out = NULL;
    TREX_TRY(trex_optimizer_settings_check(s, err));
    if (nthreads < 1)
        return trex_err_set(err, TREX_EINVAL, "optimizer: nthreads = %d; give the size of the pool (>= 1)", nthreads);
    trex_optimizer *o = calloc(1, sizeof *o);
    size_t *ws_floats = calloc((size_t)nthreads, sizeof *ws_floats);
    trex_code rc = TREX_OK;
    if (!o || !ws_floats) {
        rc = trex_err_set(err, TREX_ENOMEM, "optimizer: out of memory");
        goto fail;
    }
    o->lay = lay;
    o->s = *s;
    o->nthreads = nthreads;
    o->mem = mem;
    if ((rc = plan_layout(o, cfg, err)) != TREX_OK || (rc = plan_muon(o, ws_floats, err)) != TREX_OK)
        goto fail;
    size_t ws_total = 0;
    for (int w = 0; w < nthreads; w++)
        ws_total += align16(ws_floats[w]);
    o->state = trex_mem_alloc(mem, TREX_REGION_OPTIM, o->state_floats * sizeof(float));
    o->ws_block = trex_mem_alloc(mem, TREX_REGION_BUFFERS, ws_total * sizeof(float));
    o->chunk_sq = trex_mem_alloc(mem, TREX_REGION_BUFFERS, (size_t)o->n_chunks * sizeof(double));
    o->chunk_bad = trex_mem_alloc(mem, TREX_REGION_BUFFERS, (size_t)o->n_chunks * sizeof(int64_t));
    o->ws = xcalloc((size_t)nthreads, sizeof *o->ws);
    o->gws = xcalloc((size_t)nthreads, sizeof *o->gws);
    bool gws_ok = o->gws != NULL;
    for (int w = 0; w < nthreads && gws_ok && o->n_muon > 0; w++)
        gws_ok = (o->gws[w] = trex_gemm_ws_create()) != NULL;
    if (!o->state || !o->ws_block || !o->chunk_sq || !o->chunk_bad || !o->ws || !gws_ok) {
        rc = trex_err_set(err, TREX_ENOMEM,
                          "optimizer: out of memory allocating %.3f GiB of state and %.3f GiB of workspace",
                          (double)o->state_floats * 4.0 / 1073741824.0, (double)ws_total * 4.0 / 1073741824.0);
        goto fail;
    }
    size_t at = 0;
    for (int w = 0; w < nthreads; w++) {
        o->ws[w] = o->ws_block + at;
        at += align16(ws_floats[w]);
    }
    free(ws_floats);
    *out = o;
    return TREX_OK;
fail:
    free(ws_floats);
    trex_optimizer_destroy(o);
    return rc;
}

trex_code trex_optimizer_set_copies(trex_optimizer *o, const float *params, const trex_wcopy *c, trex_err *err)
{
    TREX_ASSERT(o && (params || !c));
    free(o->copy_idx);
    o->copy_idx = NULL, o->copies = NULL, o->copy_base = NULL;
    if (!c)
        return TREX_OK;
    const trex_layout *lay = o->lay;
    const int64_t n = lay->count > 0 ? lay->count : 1;
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx)
        return trex_err_set(err, TREX_ENOMEM, "optimizer: out of memory for the bf16 copies' table");
    int64_t found = 0;
    for (int64_t k = 0; k < lay->count; k++) {
        const trex_param *p = &lay->params[k];
        if ((idx[k] = p->is_int ? -1 : trex_wcopy_index(c, params + p->offset)) < 0)
            continue;
        found++;
        const trex_wcopy_tensor *ct = &c->t[idx[k]];
        if ((trex_optim_group)o->group[k] == TREX_GROUP_FROZEN || p->ndim != 2 || ct->cols != p->shape[1] ||
            ct->rows != p->shape[0]) {
            free(idx);
            return trex_err_set(err, TREX_EINVAL,
                                "optimizer: tensor '%s' has a bf16 copy the step cannot write (not updated by "
                                "the optimizer, or not its [%" PRId64 ", %" PRId64 "] matrix)",
                                p->name, p->shape[0], p->shape[1]);
        }
    }
    if (found != c->n) {
        free(idx);
        return trex_err_set(err, TREX_EINVAL,
                            "optimizer: %" PRId64 " of %" PRId64 " bf16 copies are not of parameter tensors "
                            "of this layout; the step could not keep them fresh",
                            c->n - found, c->n);
    }
    o->copy_idx = idx, o->copies = c, o->copy_base = params;
    return TREX_OK;
}

/* ---- accessors --------------------------------------------------------------------------------- */

const trex_optimizer_settings *trex_optimizer_settings_get(const trex_optimizer *o)
{
    TREX_ASSERT(o);
    return &o->s;
}

trex_code trex_optimizer_settings_set(trex_optimizer *o, const trex_optimizer_settings *s, trex_err *err)
{
    TREX_ASSERT(o && s);
    TREX_TRY(trex_optimizer_settings_check(s, err));
    if (s->kind != o->s.kind)
        return trex_err_set(err, TREX_EINVAL,
                            "optimizer setting 'kind' cannot change from '%s' to '%s' on a live optimizer (the "
                            "state differs); create a new optimizer",
                            trex_optim_kind_name(o->s.kind), trex_optim_kind_name(s->kind));
    if (s->muon_large_numel != o->s.muon_large_numel)
        return trex_err_set(err, TREX_EINVAL,
                            "optimizer setting 'muon_large_numel' sizes the workspace and cannot change on a live "
                            "optimizer; create a new optimizer");
    o->s = *s;
    for (int64_t k = 0; k < o->lay->count; k++)
        o->decay[k] = decays(&o->lay->params[k], (trex_optim_group)o->group[k], &o->s);
    return TREX_OK;
}

int64_t trex_optimizer_step_count(const trex_optimizer *o)
{
    TREX_ASSERT(o);
    return o->step;
}

trex_optim_group trex_optimizer_group(const trex_optimizer *o, int64_t param_index)
{
    TREX_ASSERT(o && param_index >= 0 && param_index < o->lay->count);
    return (trex_optim_group)o->group[param_index];
}

bool trex_optimizer_decays(const trex_optimizer *o, int64_t param_index)
{
    TREX_ASSERT(o && param_index >= 0 && param_index < o->lay->count);
    return o->decay[param_index];
}

int64_t trex_optimizer_muon_count(const trex_optimizer *o)
{
    TREX_ASSERT(o);
    return o->n_muon;
}

const trex_muon_matrix *trex_optimizer_muon_at(const trex_optimizer *o, int64_t i)
{
    TREX_ASSERT(o && i >= 0 && i < o->n_muon);
    return &o->muon[i];
}

const float *trex_optimizer_state(const trex_optimizer *o, int64_t param_index, int which)
{
    TREX_ASSERT(o && param_index >= 0 && param_index < o->lay->count);
    const trex_param *p = &o->lay->params[param_index];
    const trex_optim_group g = (trex_optim_group)o->group[param_index];
    if (g == TREX_GROUP_ADAMW && (which == 0 || which == 1))
        return o->state + o->state_off[param_index] + (which ? align16((size_t)p->numel) : 0);
    if (g == TREX_GROUP_MUON && which == 0)
        return o->state + o->state_off[param_index];
    return NULL;
}

/* ---- gradient norm and clipping ---------------------------------------------------------------- */

typedef struct grad_task {
    trex_optimizer *o;
    const float *g;
    float *gw;
    float scale;
} grad_task;

/* Each chunk's sum of squares in the fixed lanes of the sumsq kernel (the same bits at every level). */
static void grad_sq_chunks(void *arg, int64_t c0, int64_t c1, int tid)
{
    (void)tid;
    grad_task *t = arg;
    const trex_sumsq_fn sumsq = trex_optim_kernels_get()->sumsq;
    for (int64_t c = c0; c < c1; c++) {
        const chunk *ch = &t->o->chunks[c];
        t->o->chunk_sq[c] = sumsq(t->g + ch->begin, ch->len, &t->o->chunk_bad[c]);
    }
}

void trex_optimizer_grad_check(trex_optimizer *o, trex_pool *pool, const float *grads, trex_grad_report *out)
{
    TREX_ASSERT(o && grads && out);
    grad_task t = {.o = o, .g = grads};
    trex_pool_for(pool, o->n_chunks, 1, grad_sq_chunks, &t);
    double ss = 0.0;
    out->nonfinite = 0;
    out->first_bad = -1;
    for (int64_t c = 0; c < o->n_chunks; c++) {
        ss += o->chunk_sq[c];
        if (o->chunk_bad[c] && out->first_bad < 0)
            out->first_bad = o->chunks[c].param;
        out->nonfinite += o->chunk_bad[c];
    }
    out->norm = sqrt(ss);
}

static void grad_scale_chunks(void *arg, int64_t c0, int64_t c1, int tid)
{
    (void)tid;
    grad_task *t = arg;
    for (int64_t c = c0; c < c1; c++) {
        const chunk *ch = &t->o->chunks[c];
        float *g = t->gw + ch->begin;
        for (int64_t k = 0; k < ch->len; k++)
            g[k] *= t->scale;
    }
}

/* The clip factor for a gradient norm: clip_norm / norm when norm > clip_norm > 0, else 1. */
static double clip_factor(const trex_optimizer *o, double norm)
{
    const double max = o->s.clip_norm;
    if (!(max > 0) || !(norm > max) || !isfinite(norm))
        return 1.0;
    return max / norm;
}

double trex_optimizer_clip(trex_optimizer *o, trex_pool *pool, float *grads, double norm)
{
    TREX_ASSERT(o && grads);
    const double scale = clip_factor(o, norm);
    if (scale == 1.0)
        return 1.0;
    grad_task t = {.o = o, .gw = grads, .scale = (float)scale};
    trex_pool_for(pool, o->n_chunks, 1, grad_scale_chunks, &t);
    return scale;
}

/* ---- the step ---------------------------------------------------------------------------------- */

typedef struct step_task {
    trex_optimizer *o;
    float *params;
    const float *grads;
    float gscale; /* clip factor applied to every gradient as it is read (1: none) */
    double lr;
    double bc1, bc2; /* AdamW bias corrections 1 - beta^t */
    trex_pool *pool; /* for the GEMMs of large Muon matrices */
} step_task;

/* Elements [rel, rel + len) of parameter k, just written at w (= its element rel), to its bf16 copy
 * (either layout: trex_wcopy_put), if it has one: while the chunk is in cache, so the copies cost no
 * pass over the weights of their own (trex_optimizer_set_copies). */
static void copy_out(const trex_optimizer *o, int64_t k, const float *w, int64_t rel, int64_t len)
{
    if (o->copy_idx && o->copy_idx[k] >= 0)
        trex_wcopy_put(o->copies, o->copy_idx[k], w, rel, len);
}

/* AdamW over chunks [c0, c1) with the adamw kernel (kernels/kernels.h: one fused pass reading w, m, v
 * and g once and writing w, m, v once, per element in double on fp32 values, the clip factor applied
 * to g as it is read; the same bits at every level). The pool gives each thread one contiguous run of
 * chunks (64 Ki elements, each starting on a 64-byte boundary of the weights, gradients and state: no
 * cache line is shared between threads), and an element's arithmetic does not depend on the split. */
static void adamw_chunks(void *arg, int64_t c0, int64_t c1, int tid)
{
    (void)tid;
    const step_task *t = arg;
    const trex_optimizer *o = t->o;
    const trex_adamw_fn adamw = trex_optim_kernels_get()->adamw;
    trex_adamw_consts k = {.b1 = o->s.beta1,
                           .b2 = o->s.beta2,
                           .eps = o->s.eps,
                           .step_size = t->lr / t->bc1,
                           .bc2_sqrt = sqrt(t->bc2),
                           .gscale = t->gscale};
    for (int64_t c = c0; c < c1; c++) {
        const chunk *ch = &o->adam[c];
        const trex_param *p = &o->lay->params[ch->param];
        const int64_t rel = ch->begin - p->offset;
        float *m = o->state + o->state_off[ch->param] + rel;
        float *v = m + align16((size_t)p->numel);
        k.decay = o->decay[ch->param] ? 1.0 - t->lr * o->s.weight_decay : 1.0;
        adamw(t->params + ch->begin, m, v, t->grads + ch->begin, ch->len, &k);
        copy_out(o, ch->param, t->params + ch->begin, rel, ch->len);
    }
}

/* Momentum, Newton–Schulz and the weight update of one Muon matrix, with workspaces ws and gws. */
static void muon_matrix(const step_task *t, trex_pool *pool, int64_t i, float *ws, trex_gemm_ws *gws)
{
    const trex_optimizer *o = t->o;
    const trex_muon_matrix *u = &o->muon[i];
    const trex_param *p = &o->lay->params[u->param];
    const int64_t n = u->rows, m = u->cols, numel = n * m;
    float *mom = o->state + o->state_off[u->param] + (u->offset - p->offset);
    const float *g = t->grads + u->offset;
    float *w = t->params + u->offset;
    float *x = ws;
    const trex_optim_kernels *ok = trex_optim_kernels_get();
    /* the gradient read clipped (g gscale), as trex_optimizer_clip would leave it */
    ok->muon_momentum(mom, x, g, numel, (float)o->s.muon_momentum, t->gscale, o->s.nesterov);
    trex_muon_orthogonalize_ex(pool, x, n, m, ws + align16((size_t)numel), o->s.muon_ns, gws);
    const double scale = t->lr * sqrt((double)(n > m ? n : m)) * o->s.update_rms;
    const double decay = o->decay[u->param] ? 1.0 - t->lr * o->s.weight_decay : 1.0;
    ok->muon_update(w, x, numel, decay, scale);
    copy_out(o, u->param, w, u->offset - p->offset, numel);
}

static void muon_workers(void *arg, int64_t w0, int64_t w1, int tid)
{
    (void)tid;
    const step_task *t = arg;
    for (int64_t w = w0; w < w1; w++)
        for (int64_t j = t->o->worker_start[w]; j < t->o->worker_start[w + 1]; j++)
            muon_matrix(t, NULL, t->o->worker_units[j], t->o->ws[w], t->o->gws[w]);
}

/* The step with every gradient read as (float)(g * gscale): the bits of trex_optimizer_clip's in-place
 * scaling followed by the step, without the extra pass over the gradients. */
static void step_scaled(trex_optimizer *o, trex_pool *pool, float *params, const float *grads, float gscale,
                        double lr)
{
    TREX_ASSERT(o && params && grads);
    TREX_ASSERT(!o->copy_idx || params == o->copy_base); /* the copies follow this buffer */
    TREX_ASSERT(lr >= 0 && isfinite(lr));
    o->step++;
    step_task t = {
        .o = o,
        .params = params,
        .grads = grads,
        .gscale = gscale,
        .lr = lr,
        .bc1 = 1.0 - pow(o->s.beta1, (double)o->step),
        .bc2 = 1.0 - pow(o->s.beta2, (double)o->step),
        .pool = pool,
    };
    trex_pool_for(pool, o->n_adam, 1, adamw_chunks, &t);
    for (int64_t j = 0; j < o->n_large; j++)
        muon_matrix(&t, pool, o->large[j], o->ws[0], o->gws[0]);
    trex_pool_for(pool, o->nthreads, 1, muon_workers, &t);
}

void trex_optimizer_step(trex_optimizer *o, trex_pool *pool, float *params, const float *grads, double lr)
{
    step_scaled(o, pool, params, grads, 1.0f, lr);
}

void trex_optimizer_update(trex_optimizer *o, trex_pool *pool, float *params, float *grads, trex_step_report *rep)
{
    TREX_ASSERT(o && params && grads && rep);
    trex_grad_report g;
    trex_optimizer_grad_check(o, pool, grads, &g);
    memset(rep, 0, sizeof *rep);
    rep->grad_norm = g.norm;
    rep->nonfinite = g.nonfinite;
    rep->first_bad = g.first_bad;
    rep->clip_scale = 1.0;
    if (g.nonfinite > 0) {
        rep->skipped = true;
        return;
    }
    rep->lr = trex_lr_at(&o->s, o->step);
    /* clipping is folded into the step: the gradients are read scaled and left as they are */
    rep->clip_scale = clip_factor(o, g.norm);
    step_scaled(o, pool, params, grads, (float)rep->clip_scale, rep->lr);
}

/* ---- save and load ----------------------------------------------------------------------------- */

#define STATE_NAME (TREX_PARAM_NAME + 16)

static const char *const prefix[3] = {"adam_m.", "adam_v.", "muon_m."};

/* The state tensors of parameter k: count (0..2) and their prefix indices. */
static int state_tensors(const trex_optimizer *o, int64_t k, int which[2])
{
    switch ((trex_optim_group)o->group[k]) {
    case TREX_GROUP_ADAMW:
        which[0] = 0;
        which[1] = 1;
        return 2;
    case TREX_GROUP_MUON:
        which[0] = 2;
        return 1;
    case TREX_GROUP_FROZEN:
        break;
    }
    return 0;
}

static float *state_ptr(const trex_optimizer *o, int64_t k, int pre)
{
    return o->state + o->state_off[k] + (pre == 1 ? align16((size_t)o->lay->params[k].numel) : 0);
}

trex_code trex_optimizer_save(const trex_optimizer *o, const char *path, trex_err *err)
{
    TREX_ASSERT(o && path);
    trex_st_writer *wr = trex_st_writer_create();
    if (!wr)
        return trex_err_set(err, TREX_ENOMEM, "%s: out of memory starting the safetensors writer", path);
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, o->step);
    trex_code rc = trex_st_writer_metadata(wr, "format", "trex-optim", err);
    if (rc == TREX_OK)
        rc = trex_st_writer_metadata(wr, "kind", trex_optim_kind_name(o->s.kind), err);
    if (rc == TREX_OK)
        rc = trex_st_writer_metadata(wr, "step", step, err);
    for (int64_t k = 0; k < o->lay->count && rc == TREX_OK; k++) {
        const trex_param *p = &o->lay->params[k];
        int which[2];
        const int nt = state_tensors(o, k, which);
        for (int q = 0; q < nt && rc == TREX_OK; q++) {
            char name[STATE_NAME];
            snprintf(name, sizeof name, "%s%s", prefix[which[q]], p->name);
            rc = trex_st_writer_add(wr, name, TREX_F32, p->ndim, p->shape, state_ptr(o, k, which[q]), err);
        }
    }
    if (rc == TREX_OK)
        rc = trex_st_writer_write(wr, path, err);
    trex_st_writer_destroy(wr);
    return rc;
}

static const trex_param *find_param(const trex_layout *lay, const char *name, int64_t *index)
{
    const trex_param *p = lay->index ? trex_layout_find(lay, name) : NULL;
    if (!lay->index)
        for (int64_t k = 0; k < lay->count && !p; k++)
            if (!strcmp(lay->params[k].name, name))
                p = &lay->params[k];
    if (p)
        *index = p - lay->params;
    return p;
}

/* Names the first tensor of f that the optimizer does not expect. */
static trex_code unexpected_tensor(const trex_optimizer *o, const trex_st_file *f, const char *path, trex_err *err)
{
    for (int64_t i = 0; i < trex_st_count(f); i++) {
        const char *name = trex_st_entry_at(f, i)->name;
        int pre = -1;
        for (int q = 0; q < 3 && pre < 0; q++)
            if (!strncmp(name, prefix[q], strlen(prefix[q])))
                pre = q;
        int64_t k = -1;
        const trex_param *p = pre >= 0 ? find_param(o->lay, name + strlen(prefix[pre]), &k) : NULL;
        int which[2];
        const int nt = p ? state_tensors(o, k, which) : 0;
        if (!p || !nt || (which[0] != pre && (nt < 2 || which[1] != pre)))
            return trex_err_set(err, TREX_EFORMAT,
                                "%s: unexpected tensor '%s': this optimizer (kind %s) keeps no such state; load "
                                "state written for the same config and optimizer kind",
                                path, name, trex_optim_kind_name(o->s.kind));
    }
    TREX_ABORT("unexpected_tensor called without an unexpected tensor");
}

static trex_code load_from(trex_optimizer *o, const trex_st_file *f, const char *path, trex_err *err)
{
    const char *fmt = trex_st_metadata(f, "format");
    if (!fmt || strcmp(fmt, "trex-optim"))
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: metadata 'format' is %s%s%s, not \"trex-optim\": this is not an optimizer state file",
                            path, fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "");
    const char *kind = trex_st_metadata(f, "kind");
    if (!kind || strcmp(kind, trex_optim_kind_name(o->s.kind)))
        return trex_err_set(err, TREX_EINVAL,
                            "%s: the state was written by optimizer kind '%s' but this run uses '%s'; set the "
                            "optimizer kind to '%s' or start the optimizer state fresh",
                            path, kind ? kind : "(missing)", trex_optim_kind_name(o->s.kind), kind ? kind : "?");
    const char *st = trex_st_metadata(f, "step");
    char *end = NULL;
    errno = 0;
    const long long step = st ? strtoll(st, &end, 10) : -1;
    if (!st || end == st || *end || errno || step < 0)
        return trex_err_set(err, TREX_EFORMAT, "%s: metadata 'step' is %s%s%s; it must be a whole number >= 0", path,
                            st ? "\"" : "", st ? st : "missing", st ? "\"" : "");
    int64_t expected = 0;
    for (int64_t k = 0; k < o->lay->count; k++) {
        const trex_param *p = &o->lay->params[k];
        int which[2];
        const int nt = state_tensors(o, k, which);
        for (int q = 0; q < nt; q++) {
            char name[STATE_NAME];
            snprintf(name, sizeof name, "%s%s", prefix[which[q]], p->name);
            const trex_st_entry *e = trex_st_find(f, name);
            if (!e)
                return trex_err_set(err, TREX_ENOTFOUND,
                                    "%s: tensor '%s' is missing; the file was written for another config or "
                                    "optimizer kind",
                                    path, name);
            if (e->dtype != TREX_F32)
                return trex_err_set(err, TREX_EFORMAT, "%s: tensor '%s' has dtype %s; optimizer state is F32", path,
                                    name, trex_dtype_name(e->dtype));
            TREX_TRY(trex_st_read_f32(f, name, state_ptr(o, k, which[q]), p->ndim, p->shape, err));
            expected++;
        }
    }
    if (trex_st_count(f) != expected)
        return unexpected_tensor(o, f, path, err);
    o->step = (int64_t)step;
    return TREX_OK;
}

trex_code trex_optimizer_load(trex_optimizer *o, const char *path, trex_err *err)
{
    TREX_ASSERT(o && path);
    trex_st_file *f = NULL;
    TREX_TRY(trex_st_open(&f, path, err));
    trex_code rc = load_from(o, f, path, err);
    trex_st_close(f);
    return rc;
}
