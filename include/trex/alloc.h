/* trex/alloc.h — aligned allocation with per-region byte accounting, bump arenas, peak RSS.
 *
 * Memory is accounted by region (parameters, gradients, optimizer state, activations, buffers) in a
 * caller-owned trex_mem, so that a run can print what it holds where, and the planner can be checked
 * against it. Every block is 64-byte aligned and zero-filled. */
#ifndef TREX_ALLOC_H
#define TREX_ALLOC_H

#include <stddef.h>

typedef enum trex_region {
    TREX_REGION_PARAMS = 0,
    TREX_REGION_GRADS,
    TREX_REGION_OPTIM,
    TREX_REGION_ACTS,
    TREX_REGION_BUFFERS,
    TREX_REGION_OTHER,
    TREX_REGION_COUNT
} trex_region;

#define TREX_ALIGN 64

typedef struct trex_mem {
    size_t live[TREX_REGION_COUNT]; /* bytes held now */
    size_t peak[TREX_REGION_COUNT]; /* most bytes held at once */
    size_t live_total, peak_total;
} trex_mem;

const char *trex_region_name(trex_region r);

/* A zeroed, 64-byte-aligned block of `bytes` (0 allowed), charged to region r of mem (mem may be NULL).
 * Returns NULL when out of memory or when bytes overflows. Free with trex_mem_free. */
void *trex_mem_alloc(trex_mem *mem, trex_region r, size_t bytes);
/* Frees a block from trex_mem_alloc (NULL is a no-op); the block's size is remembered. */
void trex_mem_free(trex_mem *mem, trex_region r, void *p);

/* A bump arena: allocations are carved from large chunks and released together by reset.
 * After a first pass has grown it, later passes of the same shape allocate nothing from the system. */
typedef struct trex_arena trex_arena;

trex_arena *trex_arena_create(trex_mem *mem, trex_region r, size_t chunk_bytes);
void trex_arena_destroy(trex_arena *a);
/* A zeroed 64-byte-aligned block; NULL when out of memory. */
void *trex_arena_alloc(trex_arena *a, size_t bytes);
/* Like trex_arena_alloc but aborts with a message when out of memory (for use inside a step). */
void *trex_arena_xalloc(trex_arena *a, size_t bytes);
/* Like trex_arena_alloc but not zeroed (contents unspecified): for large scratch that is written before
 * it is read, where zeroing would cost a pass over memory. NULL when out of memory. */
void *trex_arena_alloc_uninit(trex_arena *a, size_t bytes);
void trex_arena_reset(trex_arena *a);

/* A position in an arena. Rewinding to it releases, for reuse, every block carved after it (scratch
 * that a layer needs only inside one call); blocks carved before it stay valid. Marks must be
 * rewound in LIFO order, and a reset invalidates them. */
typedef struct trex_arena_mark {
    void *chunk;       /* private: the chunk being carved when the mark was taken */
    size_t chunk_used; /* private: its bump offset then */
    size_t used;       /* private: trex_arena_used then */
} trex_arena_mark;

trex_arena_mark trex_arena_mark_get(const trex_arena *a);
void trex_arena_rewind(trex_arena *a, trex_arena_mark m);
size_t trex_arena_used(const trex_arena *a);      /* bytes handed out since the last reset */
size_t trex_arena_peak(const trex_arena *a);      /* the most of them at once since the last reset */
size_t trex_arena_reserved(const trex_arena *a);  /* bytes held from the system */

/* malloc/calloc/realloc for the bookkeeping of tools and data pipelines (not for tensors): abort with
 * a message when out of memory, and never return NULL, also for 0 bytes. Free with free(). */
void *trex_xmalloc(size_t n);
void *trex_xcalloc(size_t n, size_t size);
void *trex_xrealloc(void *p, size_t n);

/* Peak resident set size of this process in bytes (VmHWM), 0 when unknown. */
size_t trex_peak_rss_bytes(void);

#endif
