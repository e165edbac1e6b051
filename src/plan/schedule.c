/* src/plan/schedule.c — pipeline schedule simulator: places every forward and backward of every
 * micro-batch on every pipeline rank for 1F1B, interleaved 1F1B (VPP) and DualPipeV, each rank
 * running its ops in the schedule's own order, an op starting when its rank is free and its inputs
 * (the previous stage's forward, the next stage's backward) are done. Communication takes no time
 * between ranks here: the cost model adds the exposed point-to-point separately (t_pp).
 *
 * Orders (docs/planner.md, "Pipeline timeline"):
 *   1F1B        rank r: min(p-1-r, m) warm-up forwards, then alternating F/B, then the cool-down Bs.
 *   interleaved Megatron's: micro-batches in groups of p, each group through chunk 0..v-1 forward
 *               (v-1..0 backward); (p-r-1)*2 + (v-1)*p warm-up forwards (all of them when m == p).
 *   DualPipeV   DeepSeek's dualpipev order (8 steps per rank: F0 warm-up, F0/F1, B1-W1-F1,
 *               overlapped F0&B1 / F1&B0, B1 + F1&B0, B1/B0 with the second half split into
 *               input-gradient and deferred weight-gradient ops, W-B0, W); needs m >= 2p. */
#include <stdlib.h>
#include <string.h>

#include "trex/alloc.h"
#include "trex/plan.h"

typedef struct sim {
    int64_t p, v, m, S;       /* ranks, chunks per rank, micro-batches, stages */
    int schedule;
    double *fend, *bend;      /* [S][m] end of the forward / (input-)backward, -1 not yet */
    const double *f, *b, *comm;
} sim;

static int64_t stage_of(const sim *s, int64_t rank, int64_t chunk)
{
    if (s->schedule == TREX_SCHED_DUALPIPEV)
        return chunk == 0 ? rank : 2 * s->p - 1 - rank;
    return chunk * s->p + rank;
}

/* appends one op to the list (rank, kind, chunk, mb[, chunk_b, mb_b]) */
static void push(trex_plan_timeline *tl, int64_t rank, int kind, int64_t c, int64_t mb, int64_t cb,
                 int64_t mbb)
{
    trex_plan_op *o = &tl->ops[tl->n_ops++];
    memset(o, 0, sizeof *o);
    o->rank = (int32_t)rank, o->kind = kind;
    o->chunk = (int32_t)c, o->mb = (int32_t)mb, o->chunk_b = (int32_t)cb, o->mb_b = (int32_t)mbb;
    o->start = o->end = -1;
}

static void order_1f1b(trex_plan_timeline *tl, int64_t p, int64_t m, int64_t r)
{
    int64_t w = p - 1 - r < m ? p - 1 - r : m;
    for (int64_t i = 0; i < w; i++)
        push(tl, r, TREX_OP_F, 0, i, 0, 0);
    for (int64_t i = 0; i < m - w; i++) {
        push(tl, r, TREX_OP_F, 0, w + i, 0, 0);
        push(tl, r, TREX_OP_B, 0, i, 0, 0);
    }
    for (int64_t i = m - w; i < m; i++)
        push(tl, r, TREX_OP_B, 0, i, 0, 0);
}

/* k-th forward (backward when back) of a rank in the interleaved order */
static void interleaved_at(int64_t p, int64_t v, int64_t m, int64_t k, bool back, int64_t *c,
                           int64_t *mb)
{
    int64_t g = k / (p * v), g0 = g * p, gs = m - g0 < p ? m - g0 : p, in = k - g * p * v;
    int64_t ch = in / gs;
    *c = back ? v - 1 - ch : ch;
    *mb = g0 + in % gs;
}

static void order_interleaved(trex_plan_timeline *tl, int64_t p, int64_t v, int64_t m, int64_t r)
{
    int64_t total = m * v, w = m == p ? total : (p - r - 1) * 2 + (v - 1) * p, c, mb;
    if (w > total)
        w = total;
    for (int64_t k = 0; k < w; k++) {
        interleaved_at(p, v, m, k, false, &c, &mb);
        push(tl, r, TREX_OP_F, c, mb, 0, 0);
    }
    for (int64_t i = 0; i < total - w; i++) {
        interleaved_at(p, v, m, w + i, false, &c, &mb);
        push(tl, r, TREX_OP_F, c, mb, 0, 0);
        interleaved_at(p, v, m, i, true, &c, &mb);
        push(tl, r, TREX_OP_B, c, mb, 0, 0);
    }
    for (int64_t k = total - w; k < total; k++) {
        interleaved_at(p, v, m, k, true, &c, &mb);
        push(tl, r, TREX_OP_B, c, mb, 0, 0);
    }
}

/* DualPipeV: counters of the next micro-batch per (kind, chunk) and a FIFO of deferred W ops */
typedef struct dpv {
    trex_plan_timeline *tl;
    int64_t r, nf[2], nb[2];
    int64_t wq_c[4096], wq_mb[4096], wq_head, wq_tail;
} dpv;

static void dpv_f(dpv *d, int64_t c)
{
    push(d->tl, d->r, TREX_OP_F, c, d->nf[c]++, 0, 0);
}

static void dpv_b(dpv *d, int64_t c, bool zb)
{
    if (zb) {
        TREX_ASSERT(d->wq_tail - d->wq_head < 4096);
        d->wq_c[d->wq_tail % 4096] = c, d->wq_mb[d->wq_tail % 4096] = d->nb[c];
        d->wq_tail++;
    }
    push(d->tl, d->r, zb ? TREX_OP_BI : TREX_OP_B, c, d->nb[c]++, 0, 0);
}

static void dpv_w(dpv *d)
{
    TREX_ASSERT(d->wq_head < d->wq_tail);
    int64_t i = d->wq_head++ % 4096;
    push(d->tl, d->r, TREX_OP_W, d->wq_c[i], d->wq_mb[i], 0, 0);
}

static void dpv_fb(dpv *d, int64_t cf, int64_t cb)
{
    push(d->tl, d->r, TREX_OP_FB, cf, d->nf[cf]++, cb, d->nb[cb]++);
}

static void order_dualpipev(trex_plan_timeline *tl, int64_t p, int64_t m, int64_t r)
{
    dpv *d = trex_xcalloc(1, sizeof *d);
    d->tl = tl, d->r = r;
    for (int64_t i = 0; i < (p - r - 1) * 2; i++) /* 1: nF0 */
        dpv_f(d, 0);
    for (int64_t i = 0; i < r + 1; i++) { /* 2: nF0F1 */
        dpv_f(d, 0);
        dpv_f(d, 1);
    }
    for (int64_t i = 0; i < p - r - 1; i++) { /* 3: nB1W1F1, zero bubble */
        dpv_b(d, 1, true);
        dpv_w(d);
        dpv_f(d, 1);
    }
    for (int64_t i = 0; i < m - 2 * p + r + 1; i++) { /* 4: nF0B1F1B0, the main step */
        if (i == 0 && r == p - 1) { /* the last rank does not overlap its first pair */
            dpv_f(d, 0);
            dpv_b(d, 1, false);
        } else {
            dpv_fb(d, 0, 1);
        }
        dpv_fb(d, 1, 0);
    }
    for (int64_t i = 0; i < p - r - 1; i++) { /* 5: nB1F1B0 */
        dpv_b(d, 1, false);
        dpv_fb(d, 1, 0);
    }
    bool zb = false;
    int64_t s6 = r + 1;
    for (int64_t i = 0; i < s6; i++) { /* 6: nB1B0, the second half split for zero bubble */
        if (i == s6 / 2 && r % 2 == 1)
            zb = true;
        dpv_b(d, 1, zb);
        if (i == s6 / 2 && r % 2 == 0)
            zb = true;
        dpv_b(d, 0, zb);
    }
    for (int64_t i = 0; i < p - r - 1; i++) { /* 7: nWB0 */
        dpv_w(d);
        dpv_b(d, 0, true);
    }
    for (int64_t i = 0; i < r + 1; i++) /* 8: nW */
        dpv_w(d);
    TREX_ASSERT(d->nf[0] == m && d->nf[1] == m && d->nb[0] == m && d->nb[1] == m &&
                d->wq_head == d->wq_tail);
    free(d);
}

/* Ready time of an op's inputs, or -1 when one of them is not placed yet. */
static double ready_f(const sim *s, int64_t st, int64_t mb)
{
    return st == 0 ? 0.0 : s->fend[(st - 1) * s->m + mb];
}

static double ready_b(const sim *s, int64_t st, int64_t mb)
{
    double own = s->fend[st * s->m + mb];
    double next = st == s->S - 1 ? own : s->bend[(st + 1) * s->m + mb];
    return own < 0 || next < 0 ? -1.0 : (own > next ? own : next);
}

static double ready(const sim *s, const trex_plan_op *o)
{
    int64_t st = stage_of(s, o->rank, o->chunk);
    switch (o->kind) {
    case TREX_OP_F:
        return ready_f(s, st, o->mb);
    case TREX_OP_B:
    case TREX_OP_BI:
        return ready_b(s, st, o->mb);
    case TREX_OP_W:
        return s->bend[st * s->m + o->mb];
    default: {
        double a = ready_f(s, st, o->mb), b = ready_b(s, stage_of(s, o->rank, o->chunk_b), o->mb_b);
        return a < 0 || b < 0 ? -1.0 : (a > b ? a : b);
    }
    }
}

trex_code trex_plan_timeline_simulate(trex_plan_timeline *tl, int schedule, int64_t ranks,
                                      int64_t chunks, int64_t m, const double *f, const double *b,
                                      const double *comm, trex_err *err)
{
    memset(tl, 0, sizeof *tl);
    if (schedule == TREX_SCHED_1F1B)
        chunks = 1;
    if (schedule == TREX_SCHED_DUALPIPEV)
        chunks = 2;
    if (schedule == TREX_SCHED_DUALPIPE)
        return trex_err_set(err, TREX_EINVAL, "timeline: DualPipe (two mirrored stages per rank) is not "
                                              "simulated; DualPipeV, 1F1B and interleaved are");
    if (schedule < 0 || schedule > TREX_SCHED_DUALPIPEV || ranks < 1 || chunks < 1 || m < 1)
        return trex_err_set(err, TREX_EINVAL, "timeline: schedule %d, %lld ranks, %lld chunks, %lld "
                            "micro-batches", schedule, (long long)ranks, (long long)chunks, (long long)m);
    if (schedule == TREX_SCHED_DUALPIPEV && m < 2 * ranks)
        return trex_err_set(err, TREX_EINVAL, "timeline: DualPipeV needs at least 2 x pp = %lld "
                            "micro-batches, the step has %lld", (long long)(2 * ranks), (long long)m);
    if (schedule == TREX_SCHED_INTERLEAVED && m % ranks != 0 && m > ranks)
        return trex_err_set(err, TREX_EINVAL, "timeline: interleaved 1F1B with %lld micro-batches, not a "
                            "multiple of pp = %lld", (long long)m, (long long)ranks);
    if (schedule == TREX_SCHED_INTERLEAVED && m < ranks)
        return trex_err_set(err, TREX_EINVAL, "timeline: interleaved 1F1B needs at least pp = %lld "
                            "micro-batches, the step has %lld", (long long)ranks, (long long)m);
    int64_t per_rank = 3 * m * chunks; /* F, B (or BI and W) */
    if (per_rank * ranks > 20000000)
        return trex_err_set(err, TREX_EINVAL, "timeline: %lld ops is too many to simulate",
                            (long long)(per_rank * ranks));
    sim s = {.p = ranks, .v = chunks, .m = m, .S = ranks * chunks, .schedule = schedule,
             .f = f, .b = b, .comm = comm};
    tl->ops = malloc((size_t)(per_rank * ranks) * sizeof *tl->ops);
    tl->rank_first = malloc((size_t)(ranks + 1) * sizeof *tl->rank_first);
    s.fend = malloc((size_t)(s.S * m) * sizeof *s.fend);
    s.bend = malloc((size_t)(s.S * m) * sizeof *s.bend);
    double *free_at = calloc((size_t)ranks, sizeof *free_at);
    int64_t *next = malloc((size_t)ranks * sizeof *next);
    trex_code code = TREX_OK;
    if (!tl->ops || !tl->rank_first || !s.fend || !s.bend || !free_at || !next) {
        code = trex_err_set(err, TREX_ENOMEM, "timeline: out of memory");
        goto out;
    }
    tl->schedule = schedule, tl->ranks = ranks, tl->chunks = chunks, tl->m = m;
    for (int64_t r = 0; r < ranks; r++) {
        tl->rank_first[r] = tl->n_ops;
        if (schedule == TREX_SCHED_1F1B)
            order_1f1b(tl, ranks, m, r);
        else if (schedule == TREX_SCHED_INTERLEAVED)
            order_interleaved(tl, ranks, chunks, m, r);
        else
            order_dualpipev(tl, ranks, m, r);
        TREX_ASSERT(tl->n_ops - tl->rank_first[r] <= per_rank);
    }
    tl->rank_first[ranks] = tl->n_ops;
    for (int64_t i = 0; i < s.S * m; i++)
        s.fend[i] = s.bend[i] = -1.0;
    for (int64_t r = 0; r < ranks; r++)
        next[r] = tl->rank_first[r];
    /* durations: a rank's f and b are spread evenly over its chunks; the exposed communication is
     * half in the forward, half in the backward; a split backward is half input, half weight gradient */
    int64_t left = tl->n_ops;
    while (left > 0) {
        int64_t placed = 0;
        for (int64_t r = 0; r < ranks; r++) {
            double vf = (f[r] + comm[r] / 2.0) / (double)chunks, vb = (b[r] + comm[r] / 2.0) / (double)chunks;
            double cf = comm[r] / 2.0 / (double)chunks;
            for (; next[r] < tl->rank_first[r + 1]; next[r]++) {
                trex_plan_op *o = &tl->ops[next[r]];
                double t = ready(&s, o);
                if (t < 0)
                    break;
                double d = 0, c = 0;
                switch (o->kind) {
                case TREX_OP_F: d = vf, c = cf; break;
                case TREX_OP_B: d = vb, c = cf; break;
                case TREX_OP_BI: d = vb / 2.0, c = cf; break;
                case TREX_OP_W: d = vb / 2.0, c = 0; break;
                default: d = vf + vb, c = 2.0 * cf; break;
                }
                o->start = t > free_at[r] ? t : free_at[r];
                o->end = o->start + d;
                o->comm = c;
                free_at[r] = o->end;
                int64_t st = stage_of(&s, r, o->chunk);
                if (o->kind == TREX_OP_F || o->kind == TREX_OP_FB)
                    s.fend[st * m + o->mb] = o->end;
                if (o->kind == TREX_OP_B || o->kind == TREX_OP_BI)
                    s.bend[st * m + o->mb] = o->end;
                if (o->kind == TREX_OP_FB)
                    s.bend[stage_of(&s, r, o->chunk_b) * m + o->mb_b] = o->end;
                if (o->end > tl->makespan)
                    tl->makespan = o->end;
                placed++, left--;
            }
        }
        TREX_ASSERT(placed > 0); /* the orders above never deadlock */
    }
    for (int64_t r = 0; r < ranks; r++) {
        double w = 0;
        for (int64_t i = tl->rank_first[r]; i < tl->rank_first[r + 1]; i++)
            w += tl->ops[i].end - tl->ops[i].start;
        if (w > tl->work_max)
            tl->work_max = w;
    }
out:
    free(s.fend);
    free(s.bend);
    free(free_at);
    free(next);
    if (code != TREX_OK)
        trex_plan_timeline_free(tl);
    return code;
}

void trex_plan_timeline_free(trex_plan_timeline *tl)
{
    free(tl->ops);
    free(tl->rank_first);
    memset(tl, 0, sizeof *tl);
}
