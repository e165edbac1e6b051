/* kernels/x86/prefetch_l2.h — prefetching for any x86 level: hint_addr, and the micro-kernels' prefetch
 * of the lines the framework reads next (the next B slice, trex_ukr_c.prefetch): PREFETCHT1 into L2,
 * spread evenly over a call's steps, none past the last line. The hardware prefetchers stop at each 4 KiB page of the packed panels, so a B that
 * streams from L3 or memory would otherwise start every slice with demand misses (docs/kernels.md rounds
 * 14 and 17). always_inline: GCC deletes calls of a helper whose only effect is a prefetch (round 15). */
#ifndef TREX_KERNELS_X86_PREFETCH_L2_H
#define TREX_KERNELS_X86_PREFETCH_L2_H

#include <immintrin.h>
#include <stdint.h>

/* The address `floats` floats past p, for a prefetch hint only (it may lie past p's buffer: computed as
 * an integer, and a prefetch never faults). The element-wise leaves of every level ask for their
 * streams' lines this far ahead. */
static inline const char *hint_addr(const float *p, int64_t floats)
{
    return (const char *)((uintptr_t)p + (uintptr_t)floats * sizeof(float));
}

typedef struct l2_prefetch {
    const char *p;
    int64_t left, step; /* lines still to prefetch, lines per step */
} l2_prefetch;

/* The plan for `lines` lines at pf (NULL: none) over `steps` steps (steps > 0). */
static inline __attribute__((always_inline)) l2_prefetch l2_prefetch_plan(const void *pf, int64_t lines,
                                                                          int64_t steps)
{
    return (l2_prefetch){pf, pf ? lines : 0, pf ? (lines + steps - 1) / steps : 0};
}

/* One step's share. */
static inline __attribute__((always_inline)) void l2_prefetch_step(l2_prefetch *s)
{
    if (s->left <= 0)
        return;
    const int64_t n = s->left < s->step ? s->left : s->step;
    for (int64_t i = 0; i < n; i++)
        _mm_prefetch(s->p + 64 * i, _MM_HINT_T1);
    s->p += 64 * n;
    s->left -= n;
}

#endif
