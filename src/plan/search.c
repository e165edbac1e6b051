/* src/plan/search.c — layout strings and the search over layouts.
 *
 * The search enumerates TP, PP, schedule (1F1B, interleaved with VPP, DualPipeV), uneven first/last
 * chunks, EP, CP, ZeRO stage, recompute policy, optimizer swap and micro-batch size; fields the
 * caller fixed are kept. Each candidate is evaluated by trex_plan_evaluate; infeasible ones are kept
 * too (ranked by memory) so a model that fits nowhere can be explained. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trex/plan.h"

static const char *const recompute_names[] = {"none", "selective",      "full",
                                              "attention", "moe", "full-keep-core", "attention-keep-core"};
#define NRECOMPUTE ((int)(sizeof recompute_names / sizeof recompute_names[0]))

const char *trex_plan_recompute_name(int64_t r)
{
    return r >= 0 && r < NRECOMPUTE ? recompute_names[r] : "?";
}
static const char *const schedule_names[] = {"1f1b", "interleaved", "dualpipe", "dualpipev"};

static trex_code parse_i64(const char *key, const char *val, int64_t *out, trex_err *err)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (errno || end == val || *end || v < 0)
        return trex_err_set(err, TREX_EINVAL,
                            "--layout: %s=%s is not a non-negative integer", key, val);
    *out = (int64_t)v;
    return TREX_OK;
}

trex_code trex_plan_layout_parse(trex_plan_layout *l, const char *text, trex_err *err)
{
    char buf[512];
    if (strlen(text) >= sizeof buf)
        return trex_err_set(err, TREX_EINVAL, "--layout: the string is too long");
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ')
            item++;
        if (!*item)
            continue;
        char *eq = strchr(item, '=');
        if (!eq)
            return trex_err_set(err, TREX_EINVAL,
                                "--layout: \"%s\" is not key=value (e.g. tp=1,pp=4,ep=32)", item);
        *eq = 0;
        const char *k = item, *v = eq + 1;
        struct {
            const char *name;
            int64_t *dst;
        } ints[] = {{"tp", &l->tp},       {"pp", &l->pp},     {"vpp", &l->vpp},
                    {"ep", &l->ep},       {"cp", &l->cp},     {"dp", &l->dp},
                    {"zero", &l->zero},   {"mbs", &l->mbs},   {"swap_optimizer", &l->swap_optimizer},
                    {"a2a_overlap", &l->a2a_overlap},         {"first", &l->first},
                    {"last", &l->last}};
        bool done = false;
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
            if (!strcmp(k, ints[i].name)) {
                TREX_TRY(parse_i64(k, v, ints[i].dst, err));
                done = true;
            }
        }
        if (done)
            continue;
        if (!strcmp(k, "recompute")) {
            int64_t r = -1;
            for (int i = 0; i < NRECOMPUTE; i++)
                if (!strcmp(v, recompute_names[i]))
                    r = i;
            if (r < 0)
                return trex_err_set(err, TREX_EINVAL,
                                    "--layout: recompute=%s (use none, selective or full; on the fp32_ref "
                                    "engine also attention, moe, full-keep-core or attention-keep-core)", v);
            l->recompute = r;
        } else if (!strcmp(k, "schedule")) {
            int64_t r = -1;
            for (int i = 0; i < 4; i++)
                if (!strcmp(v, schedule_names[i]))
                    r = i;
            if (r < 0)
                return trex_err_set(err, TREX_EINVAL,
                                    "--layout: schedule=%s (use 1f1b, interleaved, dualpipe or "
                                    "dualpipev)", v);
            l->schedule = r;
        } else if (!strcmp(k, "dispatcher")) {
            if (!strcmp(v, "deepep") || !strcmp(v, "dedup"))
                l->dedup = 1;
            else if (!strcmp(v, "alltoall") || !strcmp(v, "a2a"))
                l->dedup = 0;
            else
                return trex_err_set(err, TREX_EINVAL,
                                    "--layout: dispatcher=%s (use deepep or alltoall)", v);
        } else {
            return trex_err_set(err, TREX_EINVAL,
                                "--layout: unknown key \"%s\" (keys: tp pp vpp ep cp dp zero "
                                "recompute swap_optimizer mbs schedule a2a_overlap dispatcher first "
                                "last)", k);
        }
    }
    if (l->swap_optimizer > 1 || l->a2a_overlap > 1)
        return trex_err_set(err, TREX_EINVAL, "--layout: swap_optimizer and a2a_overlap are 0 or 1");
    return TREX_OK;
}

void trex_plan_layout_str(const trex_plan_layout *l, char *buf, size_t len)
{
    int n = snprintf(buf, len,
                     "tp=%lld,pp=%lld,vpp=%lld,ep=%lld,cp=%lld,zero=%lld,recompute=%s,"
                     "swap_optimizer=%lld,mbs=%lld,schedule=%s,a2a_overlap=%lld,dispatcher=%s",
                     (long long)l->tp, (long long)l->pp, (long long)l->vpp, (long long)l->ep,
                     (long long)l->cp, (long long)l->zero,
                     trex_plan_recompute_name(l->recompute),
                     (long long)l->swap_optimizer, (long long)l->mbs,
                     l->schedule >= 0 && l->schedule < 4 ? schedule_names[l->schedule] : "?",
                     (long long)l->a2a_overlap, l->dedup ? "deepep" : "alltoall");
    if (n > 0 && (size_t)n < len && (l->first >= 0 || l->last >= 0))
        snprintf(buf + n, len - (size_t)n, ",first=%lld,last=%lld", (long long)l->first,
                 (long long)l->last);
}

/* ---- search ---- */

typedef struct cands {
    int64_t v[64];
    int n;
} cands;

static void add(cands *c, int64_t x)
{
    for (int i = 0; i < c->n; i++)
        if (c->v[i] == x)
            return;
    if (c->n < 64)
        c->v[c->n++] = x;
}

static int cmp_result(const void *a, const void *b)
{
    const trex_plan_result *x = a, *y = b;
    if (x->feasible != y->feasible)
        return x->feasible ? -1 : 1;
    double kx = x->feasible ? x->step_s : x->mem_total, ky = y->feasible ? y->step_s : y->mem_total;
    return kx < ky ? -1 : kx > ky ? 1 : 0;
}

/* Keeps the best `cap` results in a max-heap-free way: an array kept sorted lazily. */
typedef struct keeper {
    trex_plan_result *a;
    int64_t n, cap;
    int64_t worst; /* index of the worst kept result when full */
} keeper;

static void keep(keeper *k, const trex_plan_result *r)
{
    if (k->n < k->cap) {
        k->a[k->n++] = *r;
        if (k->n == k->cap) {
            k->worst = 0;
            for (int64_t i = 1; i < k->n; i++)
                if (cmp_result(&k->a[i], &k->a[k->worst]) > 0)
                    k->worst = i;
        }
        return;
    }
    if (cmp_result(r, &k->a[k->worst]) >= 0)
        return;
    k->a[k->worst] = *r;
    k->worst = 0;
    for (int64_t i = 1; i < k->n; i++)
        if (cmp_result(&k->a[i], &k->a[k->worst]) > 0)
            k->worst = i;
}

void trex_plan_search_free(trex_plan_search_out *out)
{
    free(out->best);
    free(out->points);
    memset(out, 0, sizeof *out);
}

trex_code trex_plan_search(const trex_plan_model *m, const trex_cluster *cl, const trex_plan_run *run,
                           const trex_plan_layout *fixed, int64_t cap, trex_plan_search_out *out,
                           trex_err *err)
{
    memset(out, 0, sizeof *out);
    if (cap < 1)
        cap = 1;
    int64_t N = run->devices;
    if (N < 1)
        return trex_err_set(err, TREX_EINVAL, "--devices must be at least 1");
    cands tp = {0}, pp = {0}, ep = {0}, cp = {0}, zero = {0}, rec = {0}, swap = {0}, mbs = {0};
    if (fixed->tp >= 0)
        add(&tp, fixed->tp);
    else
        for (int64_t t = 1; t <= 8 && t <= cl->scaleup_domain; t *= 2)
            add(&tp, t);
    if (fixed->pp >= 0)
        add(&pp, fixed->pp);
    else
        for (int64_t p = 1; p <= m->n_layers && p <= 64; p++)
            if (N % p == 0)
                add(&pp, p);
    if (fixed->ep >= 0)
        add(&ep, fixed->ep);
    else
        for (int64_t e = 1; e <= (m->n_experts ? m->n_experts : 1) && e <= N; e++)
            if ((m->n_experts ? m->n_experts : 1) % e == 0 && N % e == 0)
                add(&ep, e);
    if (fixed->cp >= 0)
        add(&cp, fixed->cp);
    else
        for (int64_t c = 1; c <= 8 && (c == 1 || run->seq >= 16384 * c / 2); c *= 2)
            add(&cp, c);
    if (fixed->zero >= 0)
        add(&zero, fixed->zero);
    else
        for (int64_t z = 0; z <= 3; z++)
            add(&zero, z);
    if (fixed->recompute >= 0) {
        add(&rec, fixed->recompute);
    } else {
        for (int64_t r = 0; r < 3; r++)
            add(&rec, r);
        if (cl->engine == TREX_ENGINE_FP32_REF) /* trex's own engine has four more */
            add(&rec, TREX_RECOMPUTE_ATTENTION), add(&rec, TREX_RECOMPUTE_MOE),
                add(&rec, TREX_RECOMPUTE_FULL_KEEP_CORE), add(&rec, TREX_RECOMPUTE_ATTENTION_KEEP_CORE);
    }
    if (fixed->swap_optimizer >= 0)
        add(&swap, fixed->swap_optimizer);
    else
        add(&swap, 0), add(&swap, 1);
    if (fixed->mbs >= 0)
        add(&mbs, fixed->mbs);
    else
        for (int64_t b = 1; b <= 4; b *= 2)
            add(&mbs, b);

    keeper kp = {.a = calloc((size_t)cap, sizeof(trex_plan_result)), .cap = cap};
    int64_t pcap = 4096;
    out->points = malloc((size_t)pcap * sizeof *out->points);
    trex_plan_result *r = malloc(sizeof *r);
    if (!kp.a || !out->points || !r) {
        free(kp.a);
        free(r);
        free(out->points);
        out->points = NULL;
        return trex_err_set(err, TREX_ENOMEM, "out of memory");
    }
    trex_err last = {0};
    double smallest = -1;
    for (int it = 0; it < tp.n; it++)
    for (int ip = 0; ip < pp.n; ip++)
    for (int ic = 0; ic < cp.n; ic++) {
        int64_t T = tp.v[it], P = pp.v[ip], C = cp.v[ic];
        if (N % (T * P * C)) {
            trex_err_set(&last, TREX_EINVAL,
                         "--devices %lld is not divisible by tp x pp x cp = %lld x %lld x %lld; change "
                         "the device count or the layout", (long long)N, (long long)T, (long long)P,
                         (long long)C);
            continue;
        }
        /* schedules and chunk counts for this pp */
        trex_plan_layout sched[16];
        int ns = 0;
        for (int s = 0; s < 4 && ns < 16; s++) {
            if (fixed->schedule >= 0 && fixed->schedule != s)
                continue;
            if (s == TREX_SCHED_DUALPIPE && fixed->schedule != s)
                continue; /* DualPipe (2x parameters) only on request; DualPipeV is searched */
            if (s == TREX_SCHED_1F1B) {
                if (fixed->vpp >= 0 && fixed->vpp != 1 && fixed->schedule < 0)
                    continue;
                sched[ns] = *fixed, sched[ns].schedule = s, sched[ns++].vpp = 1;
            } else if (s == TREX_SCHED_INTERLEAVED) {
                if (P < 2)
                    continue;
                for (int64_t v = 2; v <= 8 && ns < 14; v++) {
                    if (fixed->vpp >= 0 && fixed->vpp != v)
                        continue;
                    if (P * v > m->n_layers + 2)
                        break;
                    sched[ns] = *fixed, sched[ns].schedule = s, sched[ns++].vpp = v;
                }
            } else if (s == TREX_SCHED_DUALPIPEV || s == TREX_SCHED_DUALPIPE) {
                if (P < 2 || (fixed->vpp >= 0 && fixed->vpp != (s == TREX_SCHED_DUALPIPEV ? 2 : 1)))
                    continue;
                sched[ns] = *fixed, sched[ns].schedule = s;
                sched[ns++].vpp = s == TREX_SCHED_DUALPIPEV ? 2 : 1;
            }
        }
        for (int is = 0; is < ns; is++)
        for (int ie = 0; ie < ep.n; ie++)
        for (int iz = 0; iz < zero.n; iz++)
        for (int ir = 0; ir < rec.n; ir++)
        for (int iw = 0; iw < swap.n; iw++)
        for (int ib = 0; ib < mbs.n; ib++)
        for (int iu = 0; iu < 2; iu++) {
            trex_plan_layout l = sched[is];
            l.tp = T, l.pp = P, l.cp = C, l.ep = ep.v[ie], l.zero = zero.v[iz];
            l.recompute = rec.v[ir], l.swap_optimizer = swap.v[iw], l.mbs = mbs.v[ib];
            int64_t dp = N / (T * P * C);
            if (l.zero > 0 && dp * C == 1 && fixed->zero < 0)
                continue; /* ZeRO stages mean nothing without data parallelism */
            if (l.a2a_overlap < 0)
                l.a2a_overlap = l.schedule != TREX_SCHED_1F1B;
            if (l.dedup < 0)
                l.dedup = 1;
            if (iu == 1) { /* uneven ends: one layer fewer in the first and last chunk */
                if (fixed->first >= 0 || fixed->last >= 0 || P < 2)
                    continue;
                int64_t chunks = P * (l.schedule == TREX_SCHED_DUALPIPEV ? 2 : l.vpp);
                int64_t per = m->n_layers / chunks;
                if (per < 2)
                    continue;
                l.first = per - 1, l.last = per - 1;
            }
            trex_err e = {0};
            if (trex_plan_evaluate(m, cl, run, &l, r, &e) != TREX_OK) {
                out->n_invalid++;
                last = e;
                continue;
            }
            if (out->n_points == pcap) {
                pcap *= 2;
                trex_plan_point *np = realloc(out->points, (size_t)pcap * sizeof *np);
                if (!np) {
                    free(kp.a);
                    free(r);
                    trex_plan_search_free(out);
                    return trex_err_set(err, TREX_ENOMEM, "out of memory");
                }
                out->points = np;
            }
            out->points[out->n_points++] = (trex_plan_point){
                r->feasible, r->mem_total / (1024.0 * 1024.0 * 1024.0), r->step_s};
            if (smallest < 0 || r->mem_total < smallest) {
                smallest = r->mem_total;
                out->smallest = *r;
            }
            keep(&kp, r);
        }
    }
    free(r);
    if (out->n_points == 0) {
        free(kp.a);
        trex_plan_search_free(out);
        return trex_err_set(err, TREX_EINVAL,
                            "no layout is valid for %lld devices: %s", (long long)N,
                            last.msg[0] ? last.msg
                                        : "no candidate: the fixed --layout keys leave nothing to try");
    }
    qsort(kp.a, (size_t)kp.n, sizeof *kp.a, cmp_result);
    out->best = kp.a;
    out->n_best = kp.n;
    return TREX_OK;
}
