/* core/prof.c — op-class timers (trex/prof.h): a per-thread pointer to the caller's counters, and
 * exclusive wall-time charging over nested begin/end pairs. */
#include "trex/prof.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "trex/status.h"

static _Thread_local trex_prof *active;

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void trex_prof_reset(trex_prof *p)
{
    memset(p, 0, sizeof *p);
}

trex_prof *trex_prof_attach(trex_prof *p)
{
    trex_prof *old = active;
    if (p)
        TREX_ASSERT(p->depth == 0);
    active = p;
    return old;
}

void trex_prof_begin(trex_prof_class c)
{
    trex_prof *p = active;
    if (!p)
        return;
    TREX_ASSERT((int)c >= 0 && c < TREX_PROF_COUNT);
    TREX_ASSERT(p->depth < TREX_PROF_MAX_DEPTH);
    const double t = clock_s(CLOCK_MONOTONIC), u = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    if (p->depth > 0) {
        p->seconds[p->open[p->depth - 1]] += t - p->mark;
        p->cpu_seconds[p->open[p->depth - 1]] += u - p->cpu_mark;
    }
    p->open[p->depth++] = (int)c;
    p->calls[c]++;
    p->mark = t;
    p->cpu_mark = u;
}

void trex_prof_end(trex_prof_class c)
{
    trex_prof *p = active;
    if (!p)
        return;
    if (p->depth < 1 || p->open[p->depth - 1] != (int)c)
        TREX_ABORT("trex_prof_end(%s) does not close the innermost open class (%s)", trex_prof_name(c),
                   p->depth > 0 ? trex_prof_name((trex_prof_class)p->open[p->depth - 1]) : "none");
    const double t = clock_s(CLOCK_MONOTONIC), u = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    p->seconds[c] += t - p->mark;
    p->cpu_seconds[c] += u - p->cpu_mark;
    p->depth--;
    p->mark = t;
    p->cpu_mark = u;
}

bool trex_prof_gemm_on(void)
{
    return active != NULL;
}

void trex_prof_gemm_add(const trex_prof_gemm *g)
{
    trex_prof *p = active;
    if (!p || g->groups < 1)
        return;
    const int64_t key_m = g->groups > 1 ? 0 : g->m;
    int i = 0;
    while (i < p->ngemm && !(p->gemm[i].n == g->n && p->gemm[i].k == g->k && p->gemm[i].groups == g->groups &&
                             p->gemm[i].layout == g->layout && p->gemm[i].key_m == key_m))
        i++;
    if (i == p->ngemm) {
        if (p->ngemm == TREX_PROF_GEMM_MAX) { /* full: the last entry takes every other shape */
            i = TREX_PROF_GEMM_MAX - 1;
            p->gemm[i].n = p->gemm[i].k = p->gemm[i].groups = p->gemm[i].key_m = 0;
            p->gemm[i].layout = 0;
        } else {
            p->gemm[p->ngemm++] = (trex_prof_gemm){.n = g->n, .k = g->k, .groups = g->groups, .key_m = key_m,
                                                   .layout = g->layout};
        }
    }
    const int c = p->depth > 0 ? p->open[p->depth - 1] : TREX_PROF_OTHER;
    p->gemm_seconds[c] += g->seconds;
    p->gemm_flops[c] += g->flops;
    p->gemm[i].m += g->m;
    p->gemm[i].calls++;
    p->gemm[i].seconds += g->seconds;
    p->gemm[i].flops += g->flops;
}

const char *trex_prof_gemm_layout(unsigned layout, char *buf, size_t size)
{
    const char *a = layout & TREX_PROF_GEMM_A_PACKED ? "packed" : layout & TREX_PROF_GEMM_A_F32 ? "f32" : "bf16";
    const char *b = layout & TREX_PROF_GEMM_B_PACKED ? "packed"
                    : layout & TREX_PROF_GEMM_B_EXACT ? "f32 exact"
                    : layout & TREX_PROF_GEMM_B_F32   ? "f32"
                                                      : "bf16";
    snprintf(buf, size, "%c%c %s x %s%s%s%s%s", layout & TREX_PROF_GEMM_TA ? 't' : 'n',
             layout & TREX_PROF_GEMM_TB ? 't' : 'n', a, b, layout & TREX_PROF_GEMM_SYM ? " sym" : "",
             layout & (TREX_PROF_GEMM_A_ROWS | TREX_PROF_GEMM_B_ROWS) ? " rows" : "",
             layout & TREX_PROF_GEMM_ACCUMULATE ? " +=" : "", layout & TREX_PROF_GEMM_SCALED ? " scaled" : "");
    return buf;
}

const char *trex_prof_name(trex_prof_class c)
{
    static const char *const names[TREX_PROF_COUNT] = {"embed", "attention", "moe",       "mhc",
                                                       "head",  "mtp",       "optimizer", "other"};
    return (int)c >= 0 && c < TREX_PROF_COUNT ? names[c] : "?";
}

double trex_prof_total(const trex_prof *p)
{
    double s = 0;
    for (int c = 0; c < TREX_PROF_COUNT; c++)
        s += p->seconds[c];
    return s;
}

double trex_wall_s(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

double trex_cpu_s(void)
{
    return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}
