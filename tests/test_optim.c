/* tests/test_optim.c — optimizers: settings, LR schedules, parameter groups on dsv4-tiny, Newton–Schulz
 * singular values, the Muon update RMS, AdamW's first step, gradient norm / clipping / NaN detection,
 * the optimizer kernels of every ISA level against their definitions bit for bit, clipping folded into
 * the update, the bias update, bitwise determinism across thread counts and scheduling, and state
 * save/load.
 *
 *   test_optim                   the self-contained tests
 *   test_optim --torch-ref FILE  compares steps with a PyTorch reference written by
 *                                tests/test_optim_torch.sh (the same small layout as `toy` below)
 *   test_optim --bench ...       times the step or the update on a config's tensors (usage: no args)
 *   test_optim --ns-bench ...    Newton-Schulz in bf16 vs fp32 on the dsv4-bench shapes */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "kernels/kernels.h"
#include "trex/config.h"
#include "trex/optim.h"
#include "trex/params.h"
#include "trex/pool.h"
#include "trex/rng.h"
#include "trex/safetensors.h"

static char tmpdir[512];

/* ---- a small hand-made layout (mirrored in tests/test_optim_torch.sh) -------------------------------- */

typedef struct toy_param {
    const char *name;
    trex_param_kind kind;
    int64_t s0, s1; /* s1 < 0: 1-D */
} toy_param;

static const toy_param toy[] = {
    {"embed.weight", TREX_P_EMBED, 12, 8},
    {"layers.0.hc_attn_fn", TREX_P_HC_FN, 6, 16},
    {"layers.0.hc_attn_base", TREX_P_HC_BASE, 6, -1},
    {"layers.0.attn_norm.weight", TREX_P_NORM, 8, -1},
    {"layers.0.attn.wq_a.weight", TREX_P_ATTN, 6, 8},
    {"layers.0.attn.wo_a.weight", TREX_P_ATTN, 10, 12},
    {"layers.0.attn.attn_sink", TREX_P_ATTN_SINK, 3, -1},
    {"layers.0.attn.compressor.ape", TREX_P_APE, 4, 6},
    {"layers.0.ffn.gate.weight", TREX_P_GATE, 4, 8},
    {"layers.0.ffn.gate.bias", TREX_P_GATE_BIAS, 4, -1},
    {"layers.0.ffn.experts.0.w2.weight", TREX_P_EXPERT, 8, 4},
    {"head.weight", TREX_P_HEAD, 12, 8},
};
#define NTOY ((int64_t)(sizeof toy / sizeof toy[0]))

/* A layout of explicit tensors (name lookup falls back to a scan: index is NULL). */
static void layout_make(trex_layout *lay, const toy_param *t, int64_t n)
{
    memset(lay, 0, sizeof *lay);
    lay->params = calloc((size_t)n, sizeof *lay->params);
    TREX_ASSERT(lay->params);
    lay->count = n;
    for (int64_t k = 0; k < n; k++) {
        trex_param *p = &lay->params[k];
        snprintf(p->name, sizeof p->name, "%s", t[k].name);
        p->ndim = t[k].s1 < 0 ? 1 : 2;
        p->shape[0] = t[k].s0;
        p->shape[1] = t[k].s1 < 0 ? 0 : t[k].s1;
        p->numel = t[k].s0 * (t[k].s1 < 0 ? 1 : t[k].s1);
        p->layer = -1;
        p->expert = -1;
        p->kind = t[k].kind;
        p->trainable = t[k].kind != TREX_P_GATE_BIAS && t[k].kind != TREX_P_TID2EID;
        p->offset = lay->n_float;
        lay->n_float += (p->numel + TREX_PARAM_ALIGN - 1) / TREX_PARAM_ALIGN * TREX_PARAM_ALIGN;
        if (p->trainable)
            lay->n_trainable += p->numel;
    }
}

static void fill_normal(float *dst, int64_t n, double std, uint64_t seed, uint64_t stream)
{
    trex_rng r = trex_rng_make(seed, stream);
    for (int64_t k = 0; k < n; k++)
        dst[k] = (float)(std * trex_rng_normal(&r));
}

static float *falloc(int64_t n)
{
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    TREX_ASSERT(p);
    return p;
}

static trex_config toy_config(void)
{
    trex_config c;
    memset(&c, 0, sizeof c);
    c.o_groups = 2;
    snprintf(c.name, sizeof c.name, "toy");
    return c;
}

/* ---- settings and schedules -------------------------------------------------------------------- */

static void test_settings(void)
{
    trex_optimizer_settings s, t;
    trex_err err = {0};
    trex_optimizer_defaults(&s);
    CHECK(trex_optimizer_settings_check(&s, &err) == TREX_OK, "defaults are valid: %s", err.msg);
    CHECK(s.kind == TREX_OPTIM_MUON && s.beta1 == 0.9 && s.beta2 == 0.95 && s.eps == 1e-20 &&
              s.weight_decay == 0.1 && s.muon_momentum == 0.95 && s.nesterov && s.update_rms == 0.18,
          "defaults follow MODEL_SPEC §9");
    CHECK(s.muon_ns == TREX_NS_BF16, "Newton-Schulz in bf16 by default");
    trex_muon_ns ns;
    CHECK(trex_muon_ns_parse("fp32", &ns, &err) == TREX_OK && ns == TREX_NS_FP32 &&
              trex_muon_ns_parse("bf16", &ns, &err) == TREX_OK && ns == TREX_NS_BF16 &&
              !strcmp(trex_muon_ns_name(TREX_NS_FP32), "fp32"),
          "muon_ns names");
    CHECK(trex_muon_ns_parse("fp16", &ns, &err) == TREX_EINVAL && strstr(err.msg, "fp16"), "bad muon_ns named: %s",
          err.msg);

    t = s;
    t.beta2 = 1.0;
    CHECK(trex_optimizer_settings_check(&t, &err) == TREX_EINVAL && strstr(err.msg, "'beta2'"), "beta2 = 1: %s",
          err.msg);
    t = s;
    t.lr = NAN;
    CHECK(trex_optimizer_settings_check(&t, &err) == TREX_EINVAL && strstr(err.msg, "'lr'"), "lr NaN: %s", err.msg);
    t = s;
    t.schedule = TREX_LR_COSINE;
    t.warmup_steps = 10;
    t.total_steps = 10;
    CHECK(trex_optimizer_settings_check(&t, &err) == TREX_EINVAL && strstr(err.msg, "'total_steps'"),
          "cosine needs total > warmup: %s", err.msg);

    /* JSON round trip, exact */
    t = s;
    t.kind = TREX_OPTIM_ADAMW;
    t.lr = 1.0 / 3.0;
    t.schedule = TREX_LR_COSINE;
    t.warmup_steps = 7;
    t.total_steps = 1000;
    t.min_lr = 1e-7 / 3.0;
    t.decay_1d = true;
    t.nesterov = false;
    t.muon_ns = TREX_NS_FP32;
    cJSON *j = trex_optimizer_settings_to_json(&t);
    char *txt = cJSON_PrintUnformatted(j);
    cJSON *back = cJSON_Parse(txt);
    trex_optimizer_settings u;
    CHECK(trex_optimizer_settings_from_json(&u, back, "settings.json", &err) == TREX_OK, "from_json: %s", err.msg);
    CHECK(u.kind == t.kind && u.lr == t.lr && u.schedule == t.schedule && u.warmup_steps == t.warmup_steps &&
              u.total_steps == t.total_steps && u.min_lr == t.min_lr && u.decay_1d && !u.nesterov &&
              u.eps == t.eps && u.beta2 == t.beta2 && u.muon_ns == TREX_NS_FP32,
          "settings survive JSON exactly: %s", txt);
    cJSON_AddNumberToObject(back, "momentum", 0.9);
    CHECK(trex_optimizer_settings_from_json(&u, back, "settings.json", &err) == TREX_EINVAL &&
              strstr(err.msg, "settings.json") && strstr(err.msg, "'momentum'"),
          "unknown setting named: %s", err.msg);
    cJSON_Delete(back);
    back = cJSON_Parse("{\"kind\": \"sgd\"}");
    CHECK(trex_optimizer_settings_from_json(&u, back, "x.json", &err) == TREX_EINVAL && strstr(err.msg, "sgd"),
          "bad kind named: %s", err.msg);
    cJSON_Delete(back);
    back = cJSON_Parse("{\"muon_ns\": \"int8\"}");
    CHECK(trex_optimizer_settings_from_json(&u, back, "x.json", &err) == TREX_EINVAL && strstr(err.msg, "int8"),
          "bad muon_ns named: %s", err.msg);
    cJSON_Delete(back);
    back = cJSON_Parse("{\"nesterov\": 1}");
    CHECK(trex_optimizer_settings_from_json(&u, back, "x.json", &err) == TREX_EINVAL && strstr(err.msg, "'nesterov'"),
          "wrong type named: %s", err.msg);
    cJSON_Delete(back);
    free(txt);
    cJSON_Delete(j);
}

static void test_schedule(void)
{
    trex_optimizer_settings s;
    trex_optimizer_defaults(&s);
    s.lr = 1.0;
    s.min_lr = 0.1;
    CHECK(trex_lr_at(&s, 0) == 1.0 && trex_lr_at(&s, 12345) == 1.0, "constant");
    s.warmup_steps = 4;
    CHECK_NEAR(trex_lr_at(&s, 0), 0.25, 1e-15, "warmup step 0");
    CHECK_NEAR(trex_lr_at(&s, 3), 1.0, 1e-15, "warmup last step");
    CHECK(trex_lr_at(&s, 100) == 1.0, "constant after warmup");
    s.schedule = TREX_LR_COSINE;
    s.total_steps = 104;
    CHECK_NEAR(trex_lr_at(&s, 4), 1.0, 1e-15, "cosine starts at the peak");
    CHECK_NEAR(trex_lr_at(&s, 54), 0.55, 1e-12, "cosine halfway is the mean of peak and floor");
    CHECK_NEAR(trex_lr_at(&s, 29), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.25)), 1e-12, "cosine quarter");
    CHECK(trex_lr_at(&s, 104) == 0.1 && trex_lr_at(&s, 1000) == 0.1, "floor after total_steps");
    int mono = 1;
    for (int64_t k = 5; k < 110; k++)
        mono &= trex_lr_at(&s, k) <= trex_lr_at(&s, k - 1);
    CHECK(mono, "cosine never rises after warmup");
}

static void test_bias_update(void)
{
    float b[5] = {0, 0, 0.5f, 0, -1};
    const int64_t load[5] = {9, 1, 3, 3, 4}; /* mean 4 */
    trex_optim_bias_update(b, load, 5, 0.001);
    CHECK(b[0] == -0.001f, "overloaded expert moves down: %g", b[0]);
    CHECK(b[1] == 0.001f, "underloaded expert moves up: %g", b[1]);
    CHECK(b[2] == (float)(0.5 + 0.001) && b[3] == 0.001f, "underloaded move up by gamma");
    CHECK(b[4] == -1.0f, "expert at the mean stays");
    const int64_t even[3] = {2, 2, 2};
    float c[3] = {1, 2, 3};
    trex_optim_bias_update(c, even, 3, 0.5);
    CHECK(c[0] == 1 && c[1] == 2 && c[2] == 3, "balanced loads change nothing");
}

/* ---- groups on dsv4-tiny ----------------------------------------------------------------------- */

static void test_groups_tiny(void)
{
    trex_config cfg;
    trex_layout lay;
    trex_err err = {0};
    if (trex_config_load(&cfg, "configs/dsv4-tiny.json", &err) != TREX_OK ||
        trex_layout_build(&lay, &cfg, &err) != TREX_OK) {
        CHECK(0, "dsv4-tiny: %s", err.msg);
        return;
    }
    trex_optimizer_settings s;
    trex_optimizer_defaults(&s);
    trex_mem mem = {0};
    trex_optimizer *o = NULL;
    CHECK(trex_optimizer_create(&o, &lay, &cfg, &s, 2, &mem, &err) == TREX_OK, "create: %s", err.msg);
    if (!o) {
        trex_layout_free(&lay);
        return;
    }
    int64_t n_adam = 0, n_muon = 0, n_frozen = 0, bad = 0, wo_a = 0, expert_units = 0;
    int64_t *covered = calloc((size_t)lay.count, sizeof *covered);
    for (int64_t i = 0; i < trex_optimizer_muon_count(o); i++) {
        const trex_muon_matrix *u = trex_optimizer_muon_at(o, i);
        const trex_param *p = &lay.params[u->param];
        covered[u->param] += u->rows * u->cols;
        if (u->offset < p->offset || u->offset + u->rows * u->cols > p->offset + p->numel || u->cols != p->shape[1])
            bad++;
        if (p->kind == TREX_P_EXPERT) {
            expert_units++;
            if (u->rows != p->shape[0] || u->offset != p->offset)
                bad++; /* one expert matrix, whole */
        }
        if (strstr(p->name, ".attn.wo_a.weight")) {
            wo_a++;
            const int64_t q = (u->offset - p->offset) / (u->rows * u->cols);
            if (u->rows != cfg.o_lora_rank || u->cols != (cfg.num_attention_heads / cfg.o_groups) * cfg.head_dim ||
                u->offset != p->offset + q * u->rows * u->cols)
                bad++;
        }
    }
    for (int64_t k = 0; k < lay.count; k++) {
        const trex_param *p = &lay.params[k];
        const trex_optim_group g = trex_optimizer_group(o, k);
        trex_optim_group want;
        switch (p->kind) {
        case TREX_P_GATE_BIAS:
        case TREX_P_TID2EID:
            want = TREX_GROUP_FROZEN;
            break;
        case TREX_P_EMBED:
        case TREX_P_HEAD:
        case TREX_P_NORM:
        case TREX_P_HC_BASE:
        case TREX_P_HC_SCALE:
        case TREX_P_ATTN_SINK:
        case TREX_P_APE:
            want = TREX_GROUP_ADAMW;
            break;
        default:
            want = TREX_GROUP_MUON;
        }
        if (g != want) {
            bad++;
            fprintf(stderr, "tensor %s: group %s, want %s\n", p->name, trex_optim_group_name(g),
                    trex_optim_group_name(want));
        }
        if ((g == TREX_GROUP_FROZEN) != !p->trainable)
            bad++;
        if (g == TREX_GROUP_MUON && (p->ndim != 2 || covered[k] != p->numel))
            bad++; /* every Muon tensor covered exactly once by its matrices */
        if (g != TREX_GROUP_MUON && covered[k])
            bad++;
        if (trex_optimizer_decays(o, k) != (g != TREX_GROUP_FROZEN && p->ndim == 2))
            bad++;
        n_adam += g == TREX_GROUP_ADAMW;
        n_muon += g == TREX_GROUP_MUON;
        n_frozen += g == TREX_GROUP_FROZEN;
        if ((g == TREX_GROUP_FROZEN) != (trex_optimizer_state(o, k, 0) == NULL))
            bad++;
    }
    const int64_t blocks = trex_config_n_blocks(&cfg), E = cfg.n_routed_experts;
    CHECK(bad == 0, "%" PRId64 " group/matrix inconsistencies on dsv4-tiny", bad);
    CHECK(n_adam + n_muon + n_frozen == lay.count, "every tensor in exactly one group");
    CHECK(n_frozen == blocks, "one frozen gate.bias or tid2eid per block: %" PRId64, n_frozen);
    CHECK(expert_units == blocks * E * 3, "one Muon matrix per routed expert matrix: %" PRId64, expert_units);
    CHECK(wo_a == blocks * cfg.o_groups, "wo_a gives o_groups matrices per block: %" PRId64, wo_a);
    CHECK(trex_optimizer_muon_count(o) == n_muon + blocks * (cfg.o_groups - 1), "matrix count");
    CHECK(mem.live[TREX_REGION_OPTIM] == trex_optimizer_state_bytes(&lay, TREX_OPTIM_MUON),
          "state charged to TREX_REGION_OPTIM: %zu vs %zu", mem.live[TREX_REGION_OPTIM],
          trex_optimizer_state_bytes(&lay, TREX_OPTIM_MUON));
    trex_optimizer_destroy(o);
    CHECK(mem.live[TREX_REGION_OPTIM] == 0 && mem.live[TREX_REGION_BUFFERS] == 0, "everything freed");

    s.kind = TREX_OPTIM_ADAMW;
    o = NULL;
    CHECK(trex_optimizer_create(&o, &lay, &cfg, &s, 1, &mem, &err) == TREX_OK, "create adamw: %s", err.msg);
    if (o) {
        int64_t wrong = 0;
        for (int64_t k = 0; k < lay.count; k++)
            wrong += trex_optimizer_group(o, k) != (lay.params[k].trainable ? TREX_GROUP_ADAMW : TREX_GROUP_FROZEN);
        CHECK(wrong == 0 && trex_optimizer_muon_count(o) == 0, "kind adamw: AdamW for every trainable tensor");
        CHECK(mem.live[TREX_REGION_OPTIM] == trex_optimizer_state_bytes(&lay, TREX_OPTIM_ADAMW), "adamw state bytes");
        trex_optimizer_destroy(o);
    }
    free(covered);
    trex_layout_free(&lay);
}

/* ---- Newton–Schulz ----------------------------------------------------------------------------- */

/* Eigenvalues of a symmetric r x r matrix (cyclic Jacobi, double), into ev[r]; a is destroyed. */
static void jacobi_eig(double *a, int64_t r, double *ev)
{
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0, diag = 0;
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < r; j++)
                *(i == j ? &diag : &off) += a[i * r + j] * a[i * r + j];
        if (off <= 1e-30 * diag)
            break;
        for (int64_t p = 0; p < r; p++)
            for (int64_t q = p + 1; q < r; q++) {
                const double apq = a[p * r + q];
                if (apq == 0)
                    continue;
                const double theta = (a[q * r + q] - a[p * r + p]) / (2 * apq);
                const double t = (theta >= 0 ? 1 : -1) / (fabs(theta) + sqrt(theta * theta + 1));
                const double c = 1 / sqrt(t * t + 1), s = t * c;
                for (int64_t k = 0; k < r; k++) { /* columns p, q */
                    const double akp = a[k * r + p], akq = a[k * r + q];
                    a[k * r + p] = c * akp - s * akq;
                    a[k * r + q] = s * akp + c * akq;
                }
                for (int64_t k = 0; k < r; k++) { /* rows p, q */
                    const double apk = a[p * r + k], aqk = a[q * r + k];
                    a[p * r + k] = c * apk - s * aqk;
                    a[q * r + k] = s * apk + c * aqk;
                }
            }
    }
    for (int64_t i = 0; i < r; i++)
        ev[i] = a[i * r + i];
}

/* Smallest and largest singular value of x [n, m] (double). */
static void sv_range(const float *x, int64_t n, int64_t m, double *smin, double *smax)
{
    const int64_t r = n < m ? n : m;
    double *g = calloc((size_t)(r * r), sizeof *g), *ev = calloc((size_t)r, sizeof *ev);
    TREX_ASSERT(g && ev);
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < r; j++) {
            double s = 0;
            if (n <= m)
                for (int64_t k = 0; k < m; k++)
                    s += (double)x[i * m + k] * x[j * m + k];
            else
                for (int64_t k = 0; k < n; k++)
                    s += (double)x[k * m + i] * x[k * m + j];
            g[i * r + j] = s;
        }
    jacobi_eig(g, r, ev);
    *smin = INFINITY;
    *smax = 0;
    for (int64_t i = 0; i < r; i++) {
        const double sv = sqrt(ev[i] > 0 ? ev[i] : 0);
        *smin = sv < *smin ? sv : *smin;
        *smax = sv > *smax ? sv : *smax;
    }
    free(g);
    free(ev);
}

static void test_newton_schulz(void)
{
    /* Iterating the two scalar polynomials from x0 in [1e-4, 1] ends in [1.0, 1.00202] (computed in
     * double over a fine grid of x0); fp32 GEMMs add a little. Inputs are checked to reach the band. */
    static const int64_t shapes[][2] = {{16, 64}, {64, 16}, {33, 50}, {50, 33}, {1, 20}, {20, 1}, {24, 96}};
    trex_pool *pool = trex_pool_create(2);
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const int64_t n = shapes[t][0], m = shapes[t][1];
        float *x = falloc(n * m), *ws = falloc((int64_t)trex_muon_workspace(n, m));
        fill_normal(x, n * m, 1.0, 7, (uint64_t)t);
        double fro = 0, s0min, s0max, smin, smax;
        for (int64_t k = 0; k < n * m; k++)
            fro += (double)x[k] * x[k];
        sv_range(x, n, m, &s0min, &s0max);
        CHECK(s0min / sqrt(fro) > 1e-3, "[%" PRId64 ",%" PRId64 "]: input conditioned for the test (%g)", n, m,
              s0min / sqrt(fro));
        trex_muon_orthogonalize(t % 2 ? pool : NULL, x, n, m, ws);
        sv_range(x, n, m, &smin, &smax);
        CHECK(smin >= 0.9995 && smax <= 1.0025, "[%" PRId64 ",%" PRId64 "]: singular values in [%.6f, %.6f]", n, m,
              smin, smax);
        free(x);
        free(ws);
    }
    /* zero stays zero */
    float z[12] = {0}, ws[64];
    TREX_ASSERT(trex_muon_workspace(3, 4) <= 64);
    trex_muon_orthogonalize(NULL, z, 3, 4, ws);
    int zero = 1;
    for (int k = 0; k < 12; k++)
        zero &= z[k] == 0.0f;
    CHECK(zero, "a zero matrix stays zero");
    trex_pool_destroy(pool);
}

/* One Muon step (weight decay 0) moves a matrix by lr * 0.18 RMS (singular values 1 after NS). */
static void test_muon_update_rms(void)
{
    static const toy_param one[] = {{"layers.0.attn.wq_a.weight", TREX_P_ATTN, 24, 40}};
    trex_layout lay;
    layout_make(&lay, one, 1);
    trex_config cfg = toy_config();
    trex_optimizer_settings s;
    trex_optimizer_defaults(&s);
    s.weight_decay = 0;
    trex_optimizer *o = NULL;
    trex_err err = {0};
    CHECK(trex_optimizer_create(&o, &lay, &cfg, &s, 1, NULL, &err) == TREX_OK, "create: %s", err.msg);
    float *w = falloc(lay.n_float), *g = falloc(lay.n_float), *w0 = falloc(lay.n_float);
    fill_normal(g, 24 * 40, 3.0, 11, 0);
    const double lr = 0.01;
    trex_optimizer_step(o, NULL, w, g, lr);
    double ss = 0;
    for (int64_t k = 0; k < 24 * 40; k++)
        ss += (double)(w[k] - w0[k]) * (w[k] - w0[k]);
    const double rms = sqrt(ss / (24 * 40)) / lr;
    CHECK(rms >= 0.18 * 0.9995 && rms <= 0.18 * 1.0025, "update RMS / lr = %.6f, want 0.18", rms);
    trex_optimizer_destroy(o);
    free(w);
    free(g);
    free(w0);
    free(lay.params);
}

/* AdamW's first step: m_hat / sqrt(v_hat) = sign(g), so p <- p (1 - lr wd) - lr sign(g) (eps is tiny). */
static void test_adamw_first_step(void)
{
    static const toy_param two[] = {{"embed.weight", TREX_P_EMBED, 2, 3}, {"norm.weight", TREX_P_NORM, 3, -1}};
    trex_layout lay;
    layout_make(&lay, two, 2);
    trex_config cfg = toy_config();
    trex_optimizer_settings s;
    trex_optimizer_defaults(&s);
    trex_optimizer *o = NULL;
    trex_err err = {0};
    CHECK(trex_optimizer_create(&o, &lay, &cfg, &s, 1, NULL, &err) == TREX_OK, "create: %s", err.msg);
    float *w = falloc(lay.n_float), *g = falloc(lay.n_float);
    const float gv[6] = {0.5f, -2e-6f, 3.0f, -1.0f, 1e-15f, 7.0f};
    for (int k = 0; k < 6; k++) {
        w[k] = 1.0f;
        g[k] = gv[k];
    }
    for (int k = 0; k < 3; k++) {
        w[16 + k] = 2.0f;
        g[16 + k] = gv[k];
    }
    const double lr = 0.01;
    trex_optimizer_step(o, NULL, w, g, lr);
    int ok = 1;
    for (int k = 0; k < 6; k++)
        ok &= fabs(w[k] - (1.0 * (1 - lr * 0.1) - lr * (gv[k] > 0 ? 1 : -1))) < 1e-6;
    CHECK(ok, "2-D AdamW tensor: decayed, moved by lr against the gradient sign");
    ok = 1;
    for (int k = 0; k < 3; k++)
        ok &= fabs(w[16 + k] - (2.0 - lr * (gv[k] > 0 ? 1 : -1))) < 1e-6;
    CHECK(ok, "1-D AdamW tensor: not decayed");
    CHECK(trex_optimizer_step_count(o) == 1, "step count");
    trex_optimizer_destroy(o);
    free(w);
    free(g);
    free(lay.params);
}

/* ---- gradients: norm, clipping, NaN/Inf ------------------------------------------------------------ */

static void test_grad_guards(void)
{
    trex_layout lay;
    layout_make(&lay, toy, NTOY);
    trex_config cfg = toy_config();
    trex_optimizer_settings s;
    trex_optimizer_defaults(&s);
    s.clip_norm = 1.0;
    trex_optimizer *o = NULL;
    trex_err err = {0};
    trex_pool *pool = trex_pool_create(2);
    CHECK(trex_optimizer_create(&o, &lay, &cfg, &s, 2, NULL, &err) == TREX_OK, "create: %s", err.msg);
    float *w = falloc(lay.n_float), *g = falloc(lay.n_float), *w0 = falloc(lay.n_float), *g0 = falloc(lay.n_float);
    fill_normal(w, lay.n_float, 0.5, 1, 0);
    fill_normal(g, lay.n_float, 2.0, 1, 1);
    double ss = 0;
    for (int64_t k = 0; k < lay.count; k++) {
        const trex_param *p = &lay.params[k];
        for (int64_t e = 0; e < p->numel && p->trainable; e++)
            ss += (double)g[p->offset + e] * g[p->offset + e];
    }
    trex_grad_report r;
    trex_optimizer_grad_check(o, pool, g, &r);
    CHECK(fabs(r.norm - sqrt(ss)) <= 1e-12 * sqrt(ss), "grad norm %.17g vs %.17g", r.norm, sqrt(ss));
    CHECK(r.nonfinite == 0 && r.first_bad == -1, "finite gradients");

    /* NaN in the frozen gate.bias is ignored; NaN / Inf in trainable tensors are counted */
    const trex_param *bias = &lay.params[9], *wq = &lay.params[4], *head = &lay.params[11];
    g[bias->offset] = NAN;
    trex_optimizer_grad_check(o, pool, g, &r);
    CHECK(r.nonfinite == 0, "frozen tensor's gradient not checked");
    g[head->offset + 3] = INFINITY;
    g[wq->offset + 1] = NAN;
    memcpy(w0, w, (size_t)lay.n_float * sizeof *w);
    trex_step_report rep;
    trex_optimizer_update(o, pool, w, g, &rep);
    CHECK(rep.skipped && rep.nonfinite == 2 && rep.first_bad == 4, "NaN/Inf reported: %" PRId64 " in tensor %" PRId64,
          rep.nonfinite, rep.first_bad);
    CHECK(!memcmp(w, w0, (size_t)lay.n_float * sizeof *w) && trex_optimizer_step_count(o) == 0,
          "a skipped step changes nothing");
    g[head->offset + 3] = 0.25f;
    g[wq->offset + 1] = -0.5f;
    g[bias->offset] = 0.0f;

    /* clipping: the norm drops to clip_norm, the frozen tensor's gradient is left as it is */
    g[bias->offset + 1] = 123.0f;
    memcpy(g0, g, (size_t)lay.n_float * sizeof *g);
    trex_optimizer_grad_check(o, pool, g, &r);
    const double scale = trex_optimizer_clip(o, pool, g, r.norm);
    CHECK_NEAR(scale, 1.0 / r.norm, 1e-15, "clip scale");
    trex_grad_report r2;
    trex_optimizer_grad_check(o, pool, g, &r2);
    CHECK_NEAR(r2.norm, 1.0, 1e-6, "norm after clipping");
    CHECK(g[bias->offset + 1] == 123.0f, "frozen gradient not scaled");
    CHECK(g[head->offset] == (float)(g0[head->offset] * (float)scale), "scaled in fp32");
    CHECK(trex_optimizer_clip(o, pool, g, 0.5) == 1.0, "no clipping below clip_norm");
    memcpy(g, g0, (size_t)lay.n_float * sizeof *g);
    trex_optimizer_update(o, pool, w, g, &rep);
    CHECK(!rep.skipped && rep.clip_scale < 1 && rep.lr == s.lr && trex_optimizer_step_count(o) == 1,
          "update: clipped and stepped");
    CHECK(w[bias->offset] == w0[bias->offset] && w[bias->offset + 1] == w0[bias->offset + 1], "frozen tensor unchanged");
    trex_optimizer_destroy(o);
    trex_pool_destroy(pool);
    free(w);
    free(g);
    free(w0);
    free(g0);
    free(lay.params);
}

/* ---- determinism and state round trip ----------------------------------------------------------- */

static const toy_param mixed[] = {
    {"embed.weight", TREX_P_EMBED, 40, 16},
    {"layers.0.attn.wq_a.weight", TREX_P_ATTN, 48, 64},
    {"layers.0.attn.wo_a.weight", TREX_P_ATTN, 32, 40},
    {"layers.0.ffn.experts.0.w1.weight", TREX_P_EXPERT, 24, 16},
    {"layers.0.ffn.experts.0.w2.weight", TREX_P_EXPERT, 16, 24},
    {"layers.0.ffn.experts.1.w1.weight", TREX_P_EXPERT, 24, 16},
    {"layers.0.ffn.experts.1.w2.weight", TREX_P_EXPERT, 16, 24},
    {"layers.0.ffn_norm.weight", TREX_P_NORM, 16, -1},
    {"layers.0.ffn.gate.weight", TREX_P_GATE, 4, 16},
    {"layers.0.ffn.gate.bias", TREX_P_GATE_BIAS, 4, -1},
    {"layers.0.hc_ffn_fn", TREX_P_HC_FN, 24, 64},
    {"head.weight", TREX_P_HEAD, 40, 16},
};
#define NMIXED ((int64_t)(sizeof mixed / sizeof mixed[0]))

/* Runs `steps` updates from a fixed start; returns params (caller frees) and the optimizer. */
static float *run_steps(const trex_layout *lay, const trex_optimizer_settings *s, int threads, int steps,
                        trex_optimizer **out)
{
    trex_config cfg = toy_config();
    trex_err err = {0};
    trex_pool *pool = threads > 1 ? trex_pool_create(threads) : NULL;
    trex_optimizer *o = NULL;
    if (trex_optimizer_create(&o, lay, &cfg, s, threads, NULL, &err) != TREX_OK)
        TREX_ABORT("create: %s", err.msg);
    float *w = falloc(lay->n_float), *g = falloc(lay->n_float);
    fill_normal(w, lay->n_float, 0.3, 5, 0);
    for (int t = 0; t < steps; t++) {
        fill_normal(g, lay->n_float, 1.0, 5, 1 + (uint64_t)t);
        trex_step_report rep;
        trex_optimizer_update(o, pool, w, g, &rep);
    }
    free(g);
    trex_pool_destroy(pool);
    *out = o;
    return w;
}

static bool same_state(const trex_optimizer *a, const trex_optimizer *b, const trex_layout *lay)
{
    for (int64_t k = 0; k < lay->count; k++)
        for (int q = 0; q < 2; q++) {
            const float *x = trex_optimizer_state(a, k, q), *y = trex_optimizer_state(b, k, q);
            if (!x != !y || (x && memcmp(x, y, (size_t)lay->params[k].numel * sizeof *x)))
                return false;
        }
    return trex_optimizer_step_count(a) == trex_optimizer_step_count(b);
}

/* ---- the optimizer kernels of every level against their definitions ---------------------------- */

/* The sum of squares as kernels/kernels.h defines it: 16 lanes over k mod 16, then a fixed tree. */
static double sumsq_def(const float *x, int64_t n, int64_t *bad)
{
    double lane[16] = {0};
    *bad = 0;
    for (int64_t k = 0; k < n; k++) {
        lane[k % 16] += (double)x[k] * (double)x[k];
        *bad += !isfinite(x[k]);
    }
    double t[4];
    for (int j = 0; j < 4; j++)
        t[j] = (lane[j] + lane[j + 8]) + (lane[j + 4] + lane[j + 12]);
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* AdamW per element as kernels/kernels.h (and docs/optim.md) define it, with the gradient clipped in
 * place first (a float multiply), as trex_optimizer_clip does. */
static void adamw_def(float *w, float *m, float *v, const float *g, int64_t n, const trex_adamw_consts *c)
{
    const float b1 = (float)c->b1, c1 = (float)(1.0 - c->b1), b2 = (float)c->b2, c2 = (float)(1.0 - c->b2);
    const float eps = (float)c->eps, ss = (float)c->step_size, q = (float)c->bc2_sqrt, decay = (float)c->decay;
    for (int64_t k = 0; k < n; k++) {
        const float gk = g[k] * c->gscale;
        const float mk = b1 * m[k] + c1 * gk;
        const float vk = b2 * v[k] + (c2 * gk) * gk;
        m[k] = mk;
        v[k] = vk;
        const float denom = sqrtf(vk) / q + eps;
        w[k] = w[k] * decay - (ss * mk) / denom;
    }
}

/* Every level's sumsq, adamw, scale and Muon passes against the definitions, bit for bit, on awkward
 * lengths (0, 1, odd, around the 8- and 16-element vectors, a chunk and a bit), at aligned and unaligned
 * addresses, with zeros, subnormals and (for sumsq and scale) Inf and NaN among the values. */
static void test_optim_kernels(void)
{
    static const int64_t lens[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 47, 100, 1001, 65536 + 13};
    const int64_t cap = 65536 + 13 + 2; /* the longest, one element of offset, one past the end */
    float *x = falloc(cap), *w0 = falloc(cap), *m0 = falloc(cap), *v0 = falloc(cap), *g = falloc(cap);
    float *w[2] = {falloc(cap), falloc(cap)}, *m[2] = {falloc(cap), falloc(cap)}, *v[2] = {falloc(cap), falloc(cap)};
    const trex_adamw_consts consts[] = {
        {.b1 = 0.9, .b2 = 0.95, .eps = 1e-20, .step_size = 1e-3 / (1 - 0.9), .bc2_sqrt = sqrt(1 - 0.95),
         .decay = 1 - 1e-3 * 0.1, .gscale = 1.0f},
        {.b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .step_size = 2.7e-4, .bc2_sqrt = 1.0, .decay = 1.0, .gscale = 0.37f},
        {.b1 = 0.5, .b2 = 0.999, .eps = 1e-20, .step_size = 0.05, .bc2_sqrt = 0.25, .decay = 0.99, .gscale = 0.9999f},
    };
    int checked = 0, sum_bad = 0, adam_bad = 0, scale_bad = 0, muon_bad = 0;
    const char *bad_name = "";
    for (int cap_isa = TREX_ISA_REF; cap_isa < TREX_ISA_COUNT; cap_isa++) {
        const trex_optim_kernels *kt = trex_optim_kernels_for((trex_isa)cap_isa);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (int off = 0; off < 2; off++) {
                const int64_t n = lens[li];
                float *xs = x + off;
                /* sumsq: finite values, then with Inf and NaN planted */
                for (int special = 0; special < 3; special++) {
                    fill_normal(xs, n, 3.0, 40 + (uint64_t)li, (uint64_t)off);
                    if (n > 4) {
                        xs[1] = 0.0f;
                        xs[2] = -1e-41f; /* subnormal */
                        xs[n - 1] = -0.0f;
                    }
                    if (special >= 1 && n > 0)
                        xs[n / 2] = special == 1 ? -INFINITY : NAN;
                    if (special == 1 && n > 3)
                        xs[3] = INFINITY;
                    /* scale (y = a x) out of place, then in place; the element past the end untouched */
                    static const float sc[] = {-4.775f, 3.4445f, 1e-30f};
                    const float a = sc[special];
                    float *y = g + off;
                    y[n] = 42.0f;
                    kt->scale(y, xs, a, n);
                    for (int64_t k = 0; k < n; k++) {
                        const float want = a * xs[k];
                        scale_bad += memcmp(&want, &y[k], sizeof want) != 0;
                    }
                    kt->scale(y, y, a, n);
                    for (int64_t k = 0; k < n; k++) {
                        const float want = a * (a * xs[k]);
                        scale_bad += memcmp(&want, &y[k], sizeof want) != 0;
                    }
                    scale_bad += y[n] != 42.0f;
                    /* muon_normalize (x / norm in double) in place; the element past the end untouched */
                    static const double nd[] = {3.0000001, 0.7, 1e-30};
                    memcpy(y, xs, (size_t)n * sizeof *y);
                    kt->muon_normalize(y, n, nd[special]);
                    for (int64_t k = 0; k < n; k++) {
                        const float want = (float)((double)xs[k] / nd[special]);
                        scale_bad += memcmp(&want, &y[k], sizeof want) != 0;
                    }
                    scale_bad += y[n] != 42.0f;
                    if (scale_bad)
                        bad_name = kt->name;
                    int64_t b0 = -1, b1 = -1;
                    const double r0 = sumsq_def(xs, n, &b0), r1 = kt->sumsq(xs, n, &b1);
                    const bool same = special == 2 && n > 0 ? isnan(r0) && isnan(r1) : !memcmp(&r0, &r1, sizeof r0);
                    if (!same || b0 != b1) {
                        sum_bad++;
                        bad_name = kt->name;
                    }
                    checked++;
                }
                /* adamw under each set of constants */
                for (size_t ci = 0; ci < sizeof consts / sizeof consts[0]; ci++) {
                    fill_normal(w0 + off, n, 0.5, 50 + (uint64_t)li, ci);
                    fill_normal(m0 + off, n, 0.01, 60 + (uint64_t)li, ci);
                    fill_normal(v0 + off, n, 1e-3, 70 + (uint64_t)li, ci);
                    fill_normal(g + off, n, 0.02, 80 + (uint64_t)li, ci);
                    for (int64_t k = 0; k < n; k++)
                        v0[off + k] = fabsf(v0[off + k]) * v0[off + k] * 1e3f;
                    if (n > 4) {
                        g[off] = 0.0f;
                        v0[off] = 0.0f;
                        m0[off] = 0.0f;
                        g[off + 1] = 1e-40f;
                        v0[off + 2] = 0.0f;
                    }
                    for (int q = 0; q < 2; q++) {
                        memcpy(w[q] + off, w0 + off, (size_t)n * sizeof(float));
                        memcpy(m[q] + off, m0 + off, (size_t)n * sizeof(float));
                        memcpy(v[q] + off, v0 + off, (size_t)n * sizeof(float));
                    }
                    /* the element past the end must stay as it was */
                    w[1][off + n] = m[1][off + n] = v[1][off + n] = 42.0f;
                    /* Muon's momentum (Nesterov or not) and update passes, on the same streams */
                    {
                        const float mu = ci == 2 ? 0.5f : 0.95f, gs = consts[ci].gscale;
                        const bool nest = ci != 1;
                        const double dec = consts[ci].decay, sc = 1e-3 * (double)(ci + 1);
                        kt->muon_momentum(m[1] + off, v[1] + off, g + off, n, mu, gs, nest);
                        kt->muon_update(w[1] + off, v[1] + off, n, dec, sc);
                        for (int64_t k = 0; k < n; k++) {
                            const float gk = g[off + k] * gs, mk = mu * m0[off + k] + gk;
                            const float xk = nest ? mu * mk + gk : mk;
                            const float wk = (float)((double)w0[off + k] * dec - sc * (double)xk);
                            muon_bad += memcmp(&mk, &m[1][off + k], 4) || memcmp(&xk, &v[1][off + k], 4) ||
                                        memcmp(&wk, &w[1][off + k], 4);
                        }
                        muon_bad += w[1][off + n] != 42.0f || m[1][off + n] != 42.0f || v[1][off + n] != 42.0f;
                        if (muon_bad)
                            bad_name = kt->name;
                        memcpy(w[1] + off, w0 + off, (size_t)n * sizeof(float));
                        memcpy(m[1] + off, m0 + off, (size_t)n * sizeof(float));
                        memcpy(v[1] + off, v0 + off, (size_t)n * sizeof(float));
                    }
                    adamw_def(w[0] + off, m[0] + off, v[0] + off, g + off, n, &consts[ci]);
                    kt->adamw(w[1] + off, m[1] + off, v[1] + off, g + off, n, &consts[ci]);
                    const size_t bytes = (size_t)n * sizeof(float);
                    if (memcmp(w[0] + off, w[1] + off, bytes) || memcmp(m[0] + off, m[1] + off, bytes) ||
                        memcmp(v[0] + off, v[1] + off, bytes) || w[1][off + n] != 42.0f || m[1][off + n] != 42.0f ||
                        v[1][off + n] != 42.0f) {
                        adam_bad++;
                        bad_name = kt->name;
                    }
                    checked++;
                }
            }
    }
    CHECK(sum_bad == 0, "sumsq: %d cases differ from the definition (level %s)", sum_bad, bad_name);
    CHECK(adam_bad == 0, "adamw: %d cases differ from the definition (level %s)", adam_bad, bad_name);
    CHECK(scale_bad == 0, "scale, muon_normalize: %d elements differ from a * x, x / norm (level %s)", scale_bad,
          bad_name);
    CHECK(muon_bad == 0, "muon_momentum / muon_update: %d elements differ from the definitions (level %s)", muon_bad,
          bad_name);
    CHECK(checked > 0, "kernel cases ran");
    if (getenv("TREX_VERBOSE"))
        printf("optimizer kernels: %d cases, levels up to %s\n", checked, trex_optim_kernels_for(TREX_ISA_AMX)->name);
    free(x);
    free(w0);
    free(m0);
    free(v0);
    free(g);
    for (int q = 0; q < 2; q++) {
        free(w[q]);
        free(m[q]);
        free(v[q]);
    }
}

/* trex_optimizer_update folds the clip factor into the step: the same bits as grad_check, clip and step
 * one after the other, for AdamW and Muon tensors, and the gradients are left unclipped. */
static void test_update_folds_clip(void)
{
    trex_layout lay;
    layout_make(&lay, toy, NTOY);
    trex_config cfg = toy_config();
    for (int kind = 0; kind < 2; kind++) {
        trex_optimizer_settings s;
        trex_optimizer_defaults(&s);
        s.kind = kind ? TREX_OPTIM_ADAMW : TREX_OPTIM_MUON;
        s.muon_ns = TREX_NS_FP32;
        s.clip_norm = 0.5;
        trex_optimizer *a = NULL, *b = NULL;
        trex_err err = {0};
        CHECK(trex_optimizer_create(&a, &lay, &cfg, &s, 1, NULL, &err) == TREX_OK &&
                  trex_optimizer_create(&b, &lay, &cfg, &s, 1, NULL, &err) == TREX_OK,
              "create: %s", err.msg);
        float *wa = falloc(lay.n_float), *wb = falloc(lay.n_float), *g = falloc(lay.n_float),
              *g0 = falloc(lay.n_float);
        fill_normal(wa, lay.n_float, 0.5, 7, 0);
        memcpy(wb, wa, (size_t)lay.n_float * sizeof *wa);
        bool same = true, kept = true, clipped = true;
        for (int t = 0; t < 3; t++) {
            fill_normal(g0, lay.n_float, 1.0, 7, 1 + (uint64_t)t);
            memcpy(g, g0, (size_t)lay.n_float * sizeof *g);
            trex_step_report rep;
            trex_optimizer_update(a, NULL, wa, g, &rep);
            kept &= !memcmp(g, g0, (size_t)lay.n_float * sizeof *g);
            trex_grad_report r;
            trex_optimizer_grad_check(b, NULL, g, &r);
            const double sc = trex_optimizer_clip(b, NULL, g, r.norm);
            trex_optimizer_step(b, NULL, wb, g, trex_lr_at(&s, trex_optimizer_step_count(b)));
            clipped &= sc < 1.0 && rep.clip_scale == sc && rep.grad_norm == r.norm;
            same &= !memcmp(wa, wb, (size_t)lay.n_float * sizeof *wa) && same_state(a, b, &lay);
        }
        CHECK(clipped, "%s: the steps were clipped, and update reports the factor", trex_optim_kind_name(s.kind));
        CHECK(same, "%s: update = grad_check + clip + step, bit for bit", trex_optim_kind_name(s.kind));
        CHECK(kept, "%s: update leaves the gradients as they were", trex_optim_kind_name(s.kind));
        trex_optimizer_destroy(a);
        trex_optimizer_destroy(b);
        free(wa);
        free(wb);
        free(g);
        free(g0);
    }
    free(lay.params);
}

static void test_determinism_ns(trex_muon_ns ns)
{
    trex_layout lay;
    layout_make(&lay, mixed, NMIXED);
    trex_optimizer_settings s;
    trex_optimizer_defaults(&s);
    s.muon_ns = ns;
    s.lr = 0.02;
    s.clip_norm = 5.0;
    trex_optimizer *o1, *o2, *o3;
    float *w1 = run_steps(&lay, &s, 1, 3, &o1);
    float *w2 = run_steps(&lay, &s, 2, 3, &o2);
    s.muon_large_numel = 1000; /* wq_a, wo_a groups and hc_ffn_fn go one at a time with a threaded GEMM */
    float *w3 = run_steps(&lay, &s, 2, 3, &o3);
    const size_t bytes = (size_t)lay.n_float * sizeof(float);
    CHECK(!memcmp(w1, w2, bytes) && same_state(o1, o2, &lay), "NS %s: 1 vs 2 threads: same bits",
          trex_muon_ns_name(ns));
    CHECK(!memcmp(w1, w3, bytes) && same_state(o1, o3, &lay), "NS %s: large-matrix path: same bits",
          trex_muon_ns_name(ns));
    double moved = 0;
    float *w0 = falloc(lay.n_float);
    fill_normal(w0, lay.n_float, 0.3, 5, 0);
    for (int64_t k = 0; k < lay.n_float; k++)
        moved += fabs(w1[k] - w0[k]);
    CHECK(moved > 0, "the steps moved the weights");
    trex_optimizer_destroy(o1);
    trex_optimizer_destroy(o2);
    trex_optimizer_destroy(o3);
    free(w0);
    free(w1);
    free(w2);
    free(w3);
    free(lay.params);
}

static void test_determinism(void)
{
    test_determinism_ns(TREX_NS_BF16);
    test_determinism_ns(TREX_NS_FP32);
}

static void test_state_roundtrip(void)
{
    trex_layout lay;
    layout_make(&lay, mixed, NMIXED);
    trex_config cfg = toy_config();
    trex_optimizer_settings s;
    trex_optimizer_defaults(&s);
    s.lr = 0.02;
    trex_err err = {0};
    char path[600], path2[600];
    snprintf(path, sizeof path, "%s/optim.safetensors", tmpdir);
    snprintf(path2, sizeof path2, "%s/optim-adamw.safetensors", tmpdir);
    trex_optimizer *a;
    float *w = run_steps(&lay, &s, 2, 2, &a);
    CHECK(trex_optimizer_save(a, path, &err) == TREX_OK, "save: %s", err.msg);
    trex_optimizer *b = NULL;
    CHECK(trex_optimizer_create(&b, &lay, &cfg, &s, 2, NULL, &err) == TREX_OK, "create: %s", err.msg);
    CHECK(trex_optimizer_load(b, path, &err) == TREX_OK, "load: %s", err.msg);
    CHECK(same_state(a, b, &lay), "state and step count bit-exact after save/load");

    /* names and metadata of the file */
    trex_st_file *f = NULL;
    if (trex_st_open(&f, path, &err) == TREX_OK) {
        CHECK(trex_st_find(f, "adam_m.embed.weight") && trex_st_find(f, "adam_v.head.weight") &&
                  trex_st_find(f, "muon_m.layers.0.attn.wo_a.weight") && !trex_st_find(f, "muon_m.layers.0.ffn.gate.bias") &&
                  !trex_st_find(f, "adam_m.layers.0.ffn.gate.bias"),
              "tensor names");
        const char *st = trex_st_metadata(f, "step");
        CHECK(st && !strcmp(st, "2"), "step in metadata: %s", st ? st : "(none)");
        trex_st_close(f);
    }

    /* continuing from the loaded state gives the same bits as continuing the original */
    float *wb = falloc(lay.n_float), *g = falloc(lay.n_float);
    memcpy(wb, w, (size_t)lay.n_float * sizeof *w);
    fill_normal(g, lay.n_float, 1.0, 9, 9);
    trex_optimizer_step(a, NULL, w, g, 0.01);
    trex_optimizer_step(b, NULL, wb, g, 0.01);
    CHECK(!memcmp(w, wb, (size_t)lay.n_float * sizeof *w), "resumed step identical");

    /* wrong kind, wrong layout, not an optimizer file */
    trex_optimizer_settings sa = s;
    sa.kind = TREX_OPTIM_ADAMW;
    trex_optimizer *c = NULL;
    CHECK(trex_optimizer_create(&c, &lay, &cfg, &sa, 1, NULL, &err) == TREX_OK, "create adamw: %s", err.msg);
    CHECK(trex_optimizer_load(c, path, &err) == TREX_EINVAL && strstr(err.msg, "'muon'") && strstr(err.msg, path),
          "kind mismatch named: %s", err.msg);
    CHECK(trex_optimizer_save(c, path2, &err) == TREX_OK, "save adamw: %s", err.msg);
    trex_layout small;
    layout_make(&small, mixed, NMIXED - 1); /* no head.weight */
    trex_optimizer *d = NULL;
    CHECK(trex_optimizer_create(&d, &small, &cfg, &sa, 1, NULL, &err) == TREX_OK, "create small: %s", err.msg);
    CHECK(trex_optimizer_load(d, path2, &err) == TREX_EFORMAT && strstr(err.msg, "adam_m.head.weight"),
          "extra tensor named: %s", err.msg);
    trex_optimizer_destroy(d);
    trex_layout big;
    static toy_param more[NMIXED + 1];
    memcpy(more, mixed, sizeof mixed);
    more[NMIXED] = (toy_param){"norm.weight", TREX_P_NORM, 16, -1};
    layout_make(&big, more, NMIXED + 1);
    d = NULL;
    CHECK(trex_optimizer_create(&d, &big, &cfg, &sa, 1, NULL, &err) == TREX_OK, "create big: %s", err.msg);
    CHECK(trex_optimizer_load(d, path2, &err) == TREX_ENOTFOUND && strstr(err.msg, "adam_m.norm.weight"),
          "missing tensor named: %s", err.msg);
    trex_optimizer_destroy(d);
    char wpath[600];
    snprintf(wpath, sizeof wpath, "%s/not-optim.safetensors", tmpdir);
    trex_st_writer *wr = trex_st_writer_create();
    int64_t shp[1] = {4};
    trex_st_writer_add(wr, "x", TREX_F32, 1, shp, w, &err);
    trex_st_writer_write(wr, wpath, &err);
    trex_st_writer_destroy(wr);
    CHECK(trex_optimizer_load(c, wpath, &err) == TREX_EFORMAT && strstr(err.msg, "format"),
          "not an optimizer file: %s", err.msg);
    unlink(wpath);
    unlink(path);
    unlink(path2);
    trex_optimizer_destroy(a);
    trex_optimizer_destroy(b);
    trex_optimizer_destroy(c);
    free(w);
    free(wb);
    free(g);
    free(small.params);
    free(big.params);
    free(lay.params);
}

/* ---- comparison with the PyTorch reference ---------------------------------------------------------- */

/* max |a - b| over n, and max |b - base| (base NULL: max |b|). */
static void diff(const float *a, const float *b, const float *base, int64_t n, double *d, double *scale)
{
    *d = 0;
    *scale = 0;
    for (int64_t k = 0; k < n; k++) {
        const double e = fabs((double)a[k] - b[k]), s = fabs((double)b[k] - (base ? base[k] : 0));
        *d = e > *d ? e : *d;
        *scale = s > *scale ? s : *scale;
    }
}

static int torch_compare(const char *path)
{
    trex_err err = {0};
    trex_st_file *f = NULL;
    if (trex_st_open(&f, path, &err) != TREX_OK) {
        CHECK(0, "%s", err.msg);
        return check_summary();
    }
    trex_layout lay;
    layout_make(&lay, toy, NTOY);
    trex_config cfg = toy_config();
    const char *steps_s = trex_st_metadata(f, "steps");
    const int steps = steps_s ? atoi(steps_s) : 0;
    CHECK(steps > 0, "metadata 'steps'");
    float lr[16];
    const int64_t lshape[1] = {steps};
    CHECK(steps <= 16 && trex_st_read_f32(f, "lr", lr, 1, lshape, &err) == TREX_OK, "lr: %s", err.msg);
    float *w0 = falloc(lay.n_float), *w = falloc(lay.n_float), *g = falloc(lay.n_float), *e = falloc(lay.n_float);
    for (int64_t k = 0; k < lay.count; k++) {
        const trex_param *p = &lay.params[k];
        char name[160];
        snprintf(name, sizeof name, "init.%s", p->name);
        CHECK(trex_st_read_f32(f, name, w0 + p->offset, p->ndim, p->shape, &err) == TREX_OK, "%s", err.msg);
    }
    static const struct {
        const char *tag;
        trex_optim_kind kind;
        bool nesterov;
    } runs[] = {{"muon", TREX_OPTIM_MUON, true}, {"muon_plain", TREX_OPTIM_MUON, false}, {"adamw", TREX_OPTIM_ADAMW, true}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        trex_optimizer_settings s;
        trex_optimizer_defaults(&s);
        s.kind = runs[r].kind;
        s.nesterov = runs[r].nesterov;
        s.muon_ns = TREX_NS_FP32; /* the float64 reference: compare with the fp32 products */
        trex_optimizer *o = NULL;
        CHECK(trex_optimizer_create(&o, &lay, &cfg, &s, 1, NULL, &err) == TREX_OK, "create: %s", err.msg);
        if (!o)
            continue;
        memcpy(w, w0, (size_t)lay.n_float * sizeof *w);
        for (int t = 0; t < steps; t++) {
            for (int64_t k = 0; k < lay.count; k++) {
                const trex_param *p = &lay.params[k];
                char name[160];
                snprintf(name, sizeof name, "grad.%d.%s", t, p->name);
                CHECK(trex_st_read_f32(f, name, g + p->offset, p->ndim, p->shape, &err) == TREX_OK, "%s", err.msg);
            }
            trex_optimizer_step(o, NULL, w, g, lr[t]);
        }
        for (int64_t k = 0; k < lay.count; k++) {
            const trex_param *p = &lay.params[k];
            char name[160];
            double d, sc;
            snprintf(name, sizeof name, "%s.%s", runs[r].tag, p->name);
            if (trex_st_read_f32(f, name, e, p->ndim, p->shape, &err) != TREX_OK) {
                CHECK(0, "%s", err.msg);
                continue;
            }
            diff(w + p->offset, e, w0 + p->offset, p->numel, &d, &sc);
            CHECK(d <= 1e-5 * sc + 1e-7, "%s %s: max diff %.3g, max change %.3g (%s)", runs[r].tag, p->name, d, sc,
                  trex_optim_group_name(trex_optimizer_group(o, k)));
            for (int q = 0; q < 2; q++) {
                const float *st = trex_optimizer_state(o, k, q);
                if (!st)
                    continue;
                const char *which = trex_optimizer_group(o, k) == TREX_GROUP_MUON ? "muon_m" : q ? "adam_v" : "adam_m";
                snprintf(name, sizeof name, "%s.%s.%s", runs[r].tag, which, p->name);
                if (trex_st_read_f32(f, name, e, p->ndim, p->shape, &err) != TREX_OK) {
                    CHECK(0, "%s", err.msg);
                    continue;
                }
                diff(st, e, NULL, p->numel, &d, &sc);
                CHECK(d <= 1e-5 * sc, "%s %s: max diff %.3g of %.3g", runs[r].tag, name, d, sc);
            }
        }
        trex_optimizer_destroy(o);
    }
    /* Newton–Schulz alone, against the float64 reference */
    for (int t = 0;; t++) {
        char name[64];
        snprintf(name, sizeof name, "ns.in.%d", t);
        const trex_st_entry *en = trex_st_find(f, name);
        if (!en)
            break;
        const int64_t n = en->shape[0], m = en->shape[1];
        float *x = falloc(n * m), *ref = falloc(n * m), *ws = falloc((int64_t)trex_muon_workspace(n, m));
        CHECK(trex_st_read_f32(f, name, x, 2, en->shape, &err) == TREX_OK, "%s", err.msg);
        snprintf(name, sizeof name, "ns.out.%d", t);
        CHECK(trex_st_read_f32(f, name, ref, 2, en->shape, &err) == TREX_OK, "%s", err.msg);
        trex_muon_orthogonalize(NULL, x, n, m, ws);
        double d, sc;
        diff(x, ref, NULL, n * m, &d, &sc);
        CHECK(d <= 1e-5 * sc, "NS [%" PRId64 ", %" PRId64 "]: max diff %.3g of %.3g", n, m, d, sc);
        free(x);
        free(ref);
        free(ws);
    }
    trex_st_close(f);
    free(w0);
    free(w);
    free(g);
    free(e);
    free(lay.params);
    return check_summary();
}

/* ---- benchmark: test_optim --bench ------------------------------------------------------------------ */

static double now_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Times trex_optimizer_step (or, with the last argument `update`, trex_optimizer_update: gradient check,
 * clip factor and step) on the tensors of a config's layout: all of them, or those of one layer (SELECT =
 * a layer index; -1: the global tensors). Prints the median wall and process CPU seconds. */
static int bench(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: test_optim --bench CONFIG adamw|muon THREADS STEPS [all|LAYER [ns [step|update]]]\n"
                        "  ns: the Muon Newton-Schulz precision (settings field muon_ns), when the build has it\n"
                        "  step: time trex_optimizer_step (the default); update: trex_optimizer_update (gradient\n"
                        "  norm, clipping folded into the step, step)\n");
        return 2;
    }
    trex_config cfg;
    trex_layout full;
    trex_err err = {0};
    if (trex_config_load(&cfg, argv[2], &err) != TREX_OK || trex_layout_build(&full, &cfg, &err) != TREX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    trex_optimizer_settings s;
    trex_optimizer_defaults(&s);
    s.kind = !strcmp(argv[3], "adamw") ? TREX_OPTIM_ADAMW : TREX_OPTIM_MUON;
    const int threads = atoi(argv[4]), steps = atoi(argv[5]);
    if (threads < 1 || steps < 1) {
        fprintf(stderr, "test_optim --bench: THREADS and STEPS must be >= 1 (got '%s', '%s')\n", argv[4], argv[5]);
        return 2;
    }
    const bool all = argc < 7 || !strcmp(argv[6], "all");
    const int64_t sel = all ? 0 : atoll(argv[6]);
    if (argc >= 8) {
        trex_muon_ns ns;
        if (trex_muon_ns_parse(argv[7], &ns, &err) != TREX_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 2;
        }
        s.muon_ns = ns;
    }
    const bool update = argc >= 9 && !strcmp(argv[8], "update");
    if (argc >= 9 && !update && strcmp(argv[8], "step")) {
        fprintf(stderr, "test_optim --bench: the last argument is 'step' or 'update' (got '%s')\n", argv[8]);
        return 2;
    }
    /* the selected tensors, packed into a new layout */
    trex_layout lay = {0};
    lay.params = calloc((size_t)full.count, sizeof *lay.params);
    TREX_ASSERT(lay.params);
    for (int64_t k = 0; k < full.count; k++) {
        const trex_param *p = &full.params[k];
        if (!all && p->layer != sel)
            continue;
        trex_param *q = &lay.params[lay.count++];
        *q = *p;
        if (p->is_int)
            continue;
        q->offset = lay.n_float;
        lay.n_float += (p->numel + TREX_PARAM_ALIGN - 1) / TREX_PARAM_ALIGN * TREX_PARAM_ALIGN;
        if (p->trainable)
            lay.n_trainable += p->numel;
    }
    trex_pool *pool = threads > 1 ? trex_pool_create(threads) : NULL;
    trex_optimizer *o = NULL;
    if (trex_optimizer_create(&o, &lay, &cfg, &s, threads, NULL, &err) != TREX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    float *w = falloc(lay.n_float), *g = falloc(lay.n_float);
    fill_normal(w, lay.n_float, 0.02, 1, 0);
    fill_normal(g, lay.n_float, 1e-3, 1, 1);
    double *wall = calloc((size_t)steps, sizeof *wall), *cpu = calloc((size_t)steps, sizeof *cpu);
    TREX_ASSERT(wall && cpu);
    for (int t = 0; t < steps; t++) {
        const double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        if (update) {
            trex_step_report rep;
            trex_optimizer_update(o, pool, w, g, &rep);
            if (t == 0)
                printf("gradient norm %.17g, clip factor %.17g, lr %g\n", rep.grad_norm, rep.clip_scale, rep.lr);
        } else {
            trex_optimizer_step(o, pool, w, g, 1e-4);
        }
        wall[t] = now_s(CLOCK_MONOTONIC) - w0;
        cpu[t] = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        printf("step %d: wall %.3f s, cpu %.3f s\n", t, wall[t], cpu[t]);
    }
    uint64_t h = 1469598103934665603u; /* FNV-1a of the weights and state after the steps */
    for (int64_t k = 0; k < lay.count; k++) {
        const trex_param *p = &lay.params[k];
        const float *part[3] = {w + p->offset, trex_optimizer_state(o, k, 0), trex_optimizer_state(o, k, 1)};
        for (int q = 0; q < 3; q++)
            for (int64_t e = 0; part[q] && e < (p->is_int ? 0 : p->numel); e++) {
                uint32_t b;
                memcpy(&b, &part[q][e], 4);
                h = (h ^ b) * 1099511628211u;
            }
    }
    printf("hash %016" PRIx64 "\n", h);
    qsort(wall, (size_t)steps, sizeof *wall, cmp_double);
    qsort(cpu, (size_t)steps, sizeof *cpu, cmp_double);
    printf("bench %s kind=%s threads=%d tensors=%s trainable=%" PRId64 " muon_matrices=%" PRId64
           " ns=%s %s: median wall %.3f s, cpu %.3f s over %d steps (%.3f ns per trainable element)\n",
           argv[2], argv[3], threads, all ? "all" : argv[6], lay.n_trainable, trex_optimizer_muon_count(o),
           trex_muon_ns_name(s.muon_ns), update ? "update" : "step", wall[steps / 2], cpu[steps / 2], steps,
           1e9 * wall[steps / 2] / (double)(lay.n_trainable > 0 ? lay.n_trainable : 1));
    trex_optimizer_destroy(o);
    trex_pool_destroy(pool);
    free(w);
    free(g);
    free(wall);
    free(cpu);
    free(lay.params);
    trex_layout_free(&full);
    return 0;
}

/* ---- Newton–Schulz in bf16 vs fp32 (a test, and test_optim --ns-bench) ------------------------------ */

#define NS_BF16_SV_LO 0.98 /* measured: 0.9925 (every ISA) */
#define NS_BF16_SV_HI 1.02 /* measured: 1.0065 */
#define NS_BF16_REL 0.025 /* measured: 0.0119 */

/* An input like a gradient: Gaussian noise plus `rank` directions `spike` times stronger (rank 0: pure
 * noise). */
static void ns_input(float *x, int64_t n, int64_t m, int rank, double spike, uint64_t seed)
{
    fill_normal(x, n * m, 1.0, seed, 0);
    if (rank <= 0)
        return;
    float *u = falloc(n * rank), *v = falloc(m * rank);
    fill_normal(u, n * rank, 1.0, seed, 1);
    fill_normal(v, m * rank, 1.0, seed, 2);
    const double a = spike / sqrt((double)rank);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double t = 0;
            for (int q = 0; q < rank; q++)
                t += (double)u[i * rank + q] * v[j * rank + q];
            x[i * m + j] += (float)(a * t);
        }
    free(u);
    free(v);
}

/* Orthogonalises one input both ways; reports the singular value range of each result (when sv),
 * ||O_bf16 - O_fp32||_F / ||O_fp32||_F, the RMS of each result, and the seconds of each. */
typedef struct ns_cmp {
    double smin[2], smax[2], rms[2], rel, sec[2];
    bool warm; /* in: time a second run */
} ns_cmp;

static void ns_compare(trex_pool *pool, trex_gemm_ws *gws, const float *in, int64_t n, int64_t m, bool sv, ns_cmp *r)
{
    float *x[2] = {falloc(n * m), falloc(n * m)}, *ws = falloc((int64_t)trex_muon_workspace(n, m));
    static const trex_muon_ns prec[2] = {TREX_NS_FP32, TREX_NS_BF16};
    for (int p = 0; p < 2; p++) {
        memcpy(x[p], in, (size_t)(n * m) * sizeof *in);
        if (r->warm) /* a first run grows the GEMM workspace */
            trex_muon_orthogonalize_ex(pool, x[p], n, m, ws, prec[p], gws);
        memcpy(x[p], in, (size_t)(n * m) * sizeof *in);
        const double t0 = now_s(CLOCK_MONOTONIC);
        trex_muon_orthogonalize_ex(pool, x[p], n, m, ws, prec[p], gws);
        r->sec[p] = now_s(CLOCK_MONOTONIC) - t0;
        double ss = 0;
        for (int64_t k = 0; k < n * m; k++)
            ss += (double)x[p][k] * x[p][k];
        r->rms[p] = sqrt(ss / (double)(n * m));
        r->smin[p] = r->smax[p] = NAN;
        if (sv)
            sv_range(x[p], n, m, &r->smin[p], &r->smax[p]);
    }
    double d = 0, f = 0;
    for (int64_t k = 0; k < n * m; k++) {
        d += ((double)x[1][k] - x[0][k]) * ((double)x[1][k] - x[0][k]);
        f += (double)x[0][k] * x[0][k];
    }
    r->rel = f > 0 ? sqrt(d / f) : 0;
    free(x[0]);
    free(x[1]);
    free(ws);
}

/* Newton–Schulz with bf16 products against the fp32 path, on small shapes of both orientations (noise
 * and noise plus a strong rank-8 part). Bounds from measurements (docs/optim.md): singular values
 * and the relative difference to fp32 as measured, with about 2x margin. */
static void test_newton_schulz_bf16(void)
{
    static const int64_t shapes[][2] = {{64, 128}, {128, 64}, {33, 50}, {24, 96}, {96, 24}};
    trex_pool *pool = trex_pool_create(2);
    trex_gemm_ws *gws = trex_gemm_ws_create();
    double lo = INFINITY, hi = 0, worst = 0;
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
        for (int kind = 0; kind < 2; kind++) {
            const int64_t n = shapes[t][0], m = shapes[t][1];
            float *in = falloc(n * m);
            ns_input(in, n, m, kind ? 8 : 0, kind ? 10.0 : 0.0, 200 + t);
            ns_cmp r = {.warm = false};
            ns_compare(t % 2 ? pool : NULL, gws, in, n, m, true, &r);
            CHECK(r.smin[0] >= 0.9995 && r.smax[0] <= 1.0025, "fp32 [%" PRId64 ",%" PRId64 "]: sv [%.5f, %.5f]", n, m,
                  r.smin[0], r.smax[0]);
            CHECK(r.smin[1] >= NS_BF16_SV_LO && r.smax[1] <= NS_BF16_SV_HI,
                  "bf16 [%" PRId64 ",%" PRId64 "] %s: singular values [%.5f, %.5f]", n, m, kind ? "spiky" : "noise",
                  r.smin[1], r.smax[1]);
            CHECK(r.rel <= NS_BF16_REL, "bf16 [%" PRId64 ",%" PRId64 "] %s: relative difference to fp32 %.5f", n, m,
                  kind ? "spiky" : "noise", r.rel);
            lo = r.smin[1] < lo ? r.smin[1] : lo;
            hi = r.smax[1] > hi ? r.smax[1] : hi;
            worst = r.rel > worst ? r.rel : worst;
            free(in);
        }
    if (getenv("TREX_VERBOSE"))
        printf("NS bf16: singular values in [%.5f, %.5f], relative difference to fp32 <= %.5f\n", lo, hi, worst);
    /* bitwise the same with and without the pool */
    float *a = falloc(48 * 80), *b = falloc(48 * 80), *ws = falloc((int64_t)trex_muon_workspace(48, 80));
    fill_normal(a, 48 * 80, 1.0, 3, 3);
    memcpy(b, a, 48 * 80 * sizeof *a);
    trex_muon_orthogonalize_ex(NULL, a, 48, 80, ws, TREX_NS_BF16, gws);
    trex_muon_orthogonalize_ex(pool, b, 48, 80, ws, TREX_NS_BF16, NULL);
    CHECK(!memcmp(a, b, 48 * 80 * sizeof *a), "bf16 NS: same bits with 1 and 2 threads");
    free(a);
    free(b);
    free(ws);
    trex_gemm_ws_destroy(gws);
    trex_pool_destroy(pool);
}

/* The Muon matrix shapes of dsv4-bench (configs/dsv4-bench.json), each as noise and as noise plus a
 * strong rank-8 part. */
static int ns_bench(int argc, char **argv)
{
    const int threads = argc >= 3 ? atoi(argv[2]) : 1;
    const bool sv = !(argc >= 4 && !strcmp(argv[3], "nosv"));
    static const struct {
        const char *what;
        int64_t n, m;
    } shapes[] = {
        {"expert w1/w3, shared w1/w3, wkv", 512, 1024},
        {"expert w2, wo_b", 1024, 512},
        {"wq_a", 256, 1024},
        {"wq_b", 8192, 256},
        {"wo_a group", 256, 4096},
        {"hc_attn_fn", 24, 4096},
        {"gate", 24, 1024},
    };
    trex_pool *pool = threads > 1 ? trex_pool_create(threads) : NULL;
    trex_gemm_ws *gws = trex_gemm_ws_create();
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
        for (int kind = 0; kind < 2; kind++) {
            const int64_t n = shapes[t].n, m = shapes[t].m;
            float *in = falloc(n * m);
            ns_input(in, n, m, kind ? 8 : 0, kind ? 10.0 : 0.0, 100 + t);
            ns_cmp r = {.warm = true};
            ns_compare(pool, gws, in, n, m, sv, &r);
            printf("[%5" PRId64 ",%5" PRId64 "] %-5s %-32s fp32: sv [%.4f, %.4f] rms*sqrt(max) %.4f %.3f s | "
                   "bf16: sv [%.4f, %.4f] rms*sqrt(max) %.4f %.3f s | rel diff %.4f | speedup %.2f\n",
                   n, m, kind ? "spiky" : "noise", shapes[t].what, r.smin[0], r.smax[0],
                   r.rms[0] * sqrt((double)(n > m ? n : m)), r.sec[0], r.smin[1], r.smax[1],
                   r.rms[1] * sqrt((double)(n > m ? n : m)), r.sec[1], r.rel, r.sec[0] / r.sec[1]);
            fflush(stdout);
            free(in);
        }
    trex_gemm_ws_destroy(gws);
    trex_pool_destroy(pool);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--bench"))
        return bench(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "--ns-bench"))
        return ns_bench(argc, argv);
    if (argc == 3 && !strcmp(argv[1], "--torch-ref"))
        return torch_compare(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: test_optim [--torch-ref FILE | --bench CONFIG adamw|muon THREADS STEPS [all|LAYER [ns "
                        "[step|update]]] | --ns-bench THREADS [nosv]]\n");
        return 2;
    }
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/trex-test-optim-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_settings();
    test_schedule();
    test_bias_update();
    test_groups_tiny();
    test_newton_schulz();
    test_newton_schulz_bf16();
    test_muon_update_rms();
    test_adamw_first_step();
    test_grad_guards();
    test_optim_kernels();
    test_update_folds_clip();
    test_determinism();
    test_state_roundtrip();
    rmdir(tmpdir);
    return check_summary();
}
