/* core/alloc.c — 64-byte aligned zeroed blocks with per-region accounting, bump arenas, peak RSS.
 *
 * A block comes from calloc (large ones are fresh zero pages from the kernel, so zeroing costs nothing
 * until a page is touched), aligned up inside the allocation; a small header just before the aligned
 * pointer remembers the raw pointer, the size and the region, so that trex_mem_free needs no size.
 * Blocks of 16 MiB or more ask Linux for transparent huge pages (madvise, before any of their pages is
 * touched): where THP runs in `madvise` mode (Debian's default) nothing else gets them, and faulting
 * the parameters, gradients, optimizer state and activation chunks in 4 KiB pages cost a dsv4-bench
 * process at T = 4096 about 70 s of system time against 30-41 s with 2 MiB pages (docs/perf.md
 * "Huge pages"). With THP `never` the call is a no-op.
 *
 * An arena is a list of chunks and a bump pointer. Reset keeps every chunk and starts again at the
 * first: a later pass that asks for the same sequence of sizes lands at the same places, calls the
 * system allocator no more and touches no new page. (Merging the chunks into one of their total size
 * would also fit such a pass, but its fresh pages would all be faulted in again: 6.7 GiB, about 4
 * CPU-seconds, in the second step of a dsv4-bench step at T = 4096.) Accounting (trex_mem) is not
 * locked: allocate from one thread, as planned allocation at start-up does. */
#include "trex/alloc.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#include "trex/status.h"

#define BLOCK_MAGIC 0x74726578626c6b31ull /* "trexblk1" */
#define BLOCK_PAD (2 * TREX_ALIGN)        /* room for the header plus the alignment slack */
#define ARENA_DEFAULT_CHUNK ((size_t)1 << 20)

typedef struct block_header {
    void *raw;
    size_t bytes;
    uint64_t magic;
    int region;
} block_header;

_Static_assert(sizeof(block_header) <= TREX_ALIGN, "block header must fit in the alignment slack");

const char *trex_region_name(trex_region r)
{
    static const char *const names[TREX_REGION_COUNT] = {
        [TREX_REGION_PARAMS] = "params", [TREX_REGION_GRADS] = "grads",
        [TREX_REGION_OPTIM] = "optim",   [TREX_REGION_ACTS] = "acts",
        [TREX_REGION_BUFFERS] = "buffers", [TREX_REGION_OTHER] = "other",
    };
    if ((int)r < 0 || r >= TREX_REGION_COUNT)
        return "?";
    return names[r];
}

static void mem_charge(trex_mem *mem, trex_region r, size_t bytes)
{
    if (!mem)
        return;
    mem->live[r] += bytes;
    if (mem->live[r] > mem->peak[r])
        mem->peak[r] = mem->live[r];
    mem->live_total += bytes;
    if (mem->live_total > mem->peak_total)
        mem->peak_total = mem->live_total;
}

static void mem_release(trex_mem *mem, trex_region r, size_t bytes)
{
    if (!mem)
        return;
    TREX_ASSERT(mem->live[r] >= bytes && mem->live_total >= bytes);
    mem->live[r] -= bytes;
    mem->live_total -= bytes;
}

/* Asks for transparent huge pages over the whole 2 MiB pages inside [raw, raw + bytes) of a block of
 * 16 MiB or more (smaller ones would gain little and may share their pages with other allocations). */
static void advise_huge_pages(void *raw, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (bytes < ((size_t)16 << 20))
        return;
    const uintptr_t lo = ((uintptr_t)raw + huge - 1) & ~(huge - 1);
    const uintptr_t hi = ((uintptr_t)raw + bytes) & ~(huge - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* advice only: a refusal changes nothing */
#else
    (void)raw, (void)bytes;
#endif
}

void *trex_mem_alloc(trex_mem *mem, trex_region r, size_t bytes)
{
    TREX_ASSERT((int)r >= 0 && r < TREX_REGION_COUNT);
    if (bytes > SIZE_MAX - BLOCK_PAD)
        return NULL;
    unsigned char *raw = calloc(1, bytes + BLOCK_PAD);
    if (!raw)
        return NULL;
    advise_huge_pages(raw, bytes + BLOCK_PAD);
    uintptr_t at = ((uintptr_t)raw + sizeof(block_header) + TREX_ALIGN - 1) & ~(uintptr_t)(TREX_ALIGN - 1);
    unsigned char *p = raw + (at - (uintptr_t)raw);
    block_header h = {.raw = raw, .bytes = bytes, .magic = BLOCK_MAGIC, .region = (int)r};
    memcpy(p - sizeof h, &h, sizeof h);
    mem_charge(mem, r, bytes);
    return p;
}

void trex_mem_free(trex_mem *mem, trex_region r, void *p)
{
    if (!p)
        return;
    TREX_ASSERT((int)r >= 0 && r < TREX_REGION_COUNT);
    TREX_ASSERT(((uintptr_t)p & (TREX_ALIGN - 1)) == 0);
    block_header h;
    memcpy(&h, (unsigned char *)p - sizeof h, sizeof h);
    if (h.magic != BLOCK_MAGIC)
        TREX_ABORT("trex_mem_free: %p was not allocated by trex_mem_alloc (or was freed twice)", p);
    if (h.region != (int)r)
        TREX_ABORT("trex_mem_free: block charged to region %s, freed from region %s",
                   trex_region_name((trex_region)h.region), trex_region_name(r));
    mem_release(mem, r, h.bytes);
    h.magic = 0;
    memcpy((unsigned char *)p - sizeof h, &h, sizeof h);
    free(h.raw);
}

/* --- arenas ------------------------------------------------------------------------------------- */

typedef struct arena_chunk {
    struct arena_chunk *next;
    unsigned char *base; /* trex_mem_alloc block, 64-byte aligned */
    size_t size;
    size_t used;  /* bump offset */
    size_t dirty; /* bytes [0, dirty) may be non-zero; beyond it the block is still as calloc gave it */
} arena_chunk;

struct trex_arena {
    trex_mem *mem;
    trex_region region;
    size_t chunk_bytes;
    arena_chunk *first; /* chunks in order of creation */
    arena_chunk *cur;   /* the chunk being carved */
    size_t used;        /* bytes handed out since reset, each rounded up to TREX_ALIGN */
    size_t peak;        /* the most of used at once since reset */
    size_t reserved;    /* sum of chunk sizes */
};

static arena_chunk *chunk_new(trex_arena *a, size_t size)
{
    arena_chunk *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->base = trex_mem_alloc(a->mem, a->region, size);
    if (!c->base) {
        free(c);
        return NULL;
    }
    c->size = size;
    a->reserved += size;
    return c;
}

static void chunks_free(trex_arena *a)
{
    arena_chunk *c = a->first;
    while (c) {
        arena_chunk *next = c->next;
        trex_mem_free(a->mem, a->region, c->base);
        free(c);
        c = next;
    }
    a->first = a->cur = NULL;
    a->reserved = 0;
}

trex_arena *trex_arena_create(trex_mem *mem, trex_region r, size_t chunk_bytes)
{
    TREX_ASSERT((int)r >= 0 && r < TREX_REGION_COUNT);
    trex_arena *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->mem = mem;
    a->region = r;
    if (chunk_bytes == 0)
        chunk_bytes = ARENA_DEFAULT_CHUNK;
    a->chunk_bytes = (chunk_bytes + TREX_ALIGN - 1) & ~(size_t)(TREX_ALIGN - 1);
    if (a->chunk_bytes == 0) /* chunk_bytes near SIZE_MAX wrapped */
        a->chunk_bytes = ARENA_DEFAULT_CHUNK;
    return a;
}

void trex_arena_destroy(trex_arena *a)
{
    if (!a)
        return;
    chunks_free(a);
    free(a);
}

/* Carves `need` bytes (a multiple of TREX_ALIGN) from c if they fit, zeroed when zero is set. */
static void *chunk_carve(arena_chunk *c, size_t need, bool zero)
{
    if (need > c->size - c->used)
        return NULL;
    unsigned char *p = c->base + c->used;
    size_t end = c->used + need;
    if (zero && c->dirty > c->used)
        memset(p, 0, (c->dirty < end ? c->dirty : end) - c->used);
    c->used = end;
    if (end > c->dirty)
        c->dirty = end;
    return p;
}

/* p, carved for need bytes: counted as handed out. */
static void *handed_out(trex_arena *a, void *p, size_t need)
{
    a->used += need;
    if (a->used > a->peak)
        a->peak = a->used;
    return p;
}

static void *arena_alloc(trex_arena *a, size_t bytes, bool zero)
{
    TREX_ASSERT(a);
    if (bytes > SIZE_MAX - 2 * TREX_ALIGN)
        return NULL;
    size_t need = (bytes + TREX_ALIGN - 1) & ~(size_t)(TREX_ALIGN - 1);
    if (need == 0)
        need = TREX_ALIGN; /* distinct pointers for zero-byte requests */
    while (a->cur) {
        void *p = chunk_carve(a->cur, need, zero);
        if (p)
            return handed_out(a, p, need);
        if (!a->cur->next)
            break;
        a->cur = a->cur->next;
    }
    /* A new chunk is at least as large as all before it: passes that rewind and then ask for blocks
     * larger than the free tails would otherwise strand tail after tail and touch their pages (the
     * model's T = 4096 step held ~1.8x its high-water mark). Untouched pages of a chunk cost no memory,
     * so the chunks grow geometrically, and fall back to the request when so much is refused. */
    size_t grow = a->reserved > a->chunk_bytes ? a->reserved : a->chunk_bytes;
    arena_chunk *c = chunk_new(a, need > grow ? need : grow);
    if (!c && grow > need && grow > a->chunk_bytes)
        c = chunk_new(a, need > a->chunk_bytes ? need : a->chunk_bytes);
    if (!c)
        return NULL;
    if (a->cur)
        a->cur->next = c;
    else
        a->first = c;
    a->cur = c;
    void *p = chunk_carve(c, need, zero);
    TREX_ASSERT(p);
    return handed_out(a, p, need);
}

void *trex_arena_alloc(trex_arena *a, size_t bytes)
{
    return arena_alloc(a, bytes, true);
}

void *trex_arena_alloc_uninit(trex_arena *a, size_t bytes)
{
    return arena_alloc(a, bytes, false);
}

void *trex_arena_xalloc(trex_arena *a, size_t bytes)
{
    void *p = trex_arena_alloc(a, bytes);
    if (!p)
        TREX_ABORT("arena (%s): out of memory allocating %zu bytes (%zu used, %zu reserved)",
                   trex_region_name(a->region), bytes, a->used, a->reserved);
    return p;
}

void trex_arena_reset(trex_arena *a)
{
    TREX_ASSERT(a);
    a->used = a->peak = 0;
    for (arena_chunk *c = a->first; c; c = c->next)
        c->used = 0;
    a->cur = a->first;
}

trex_arena_mark trex_arena_mark_get(const trex_arena *a)
{
    TREX_ASSERT(a);
    trex_arena_mark m = {a->cur, a->cur ? a->cur->used : 0, a->used};
    return m;
}

void trex_arena_rewind(trex_arena *a, trex_arena_mark m)
{
    TREX_ASSERT(a && m.used <= a->used);
    arena_chunk *c = m.chunk ? m.chunk : a->first;
    if (!c)
        return; /* nothing was ever carved */
    /* The mark's chunk keeps its old offset; every chunk after it is empty again. */
    c->used = m.chunk ? m.chunk_used : 0;
    for (arena_chunk *n = c->next; n; n = n->next)
        n->used = 0;
    a->cur = c;
    a->used = m.used;
}

size_t trex_arena_used(const trex_arena *a)
{
    TREX_ASSERT(a);
    return a->used;
}

size_t trex_arena_peak(const trex_arena *a)
{
    TREX_ASSERT(a);
    return a->peak;
}

size_t trex_arena_reserved(const trex_arena *a)
{
    TREX_ASSERT(a);
    return a->reserved;
}

void *trex_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        TREX_ABORT("out of memory (%zu bytes)", n);
    return p;
}

void *trex_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        TREX_ABORT("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

void *trex_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        TREX_ABORT("out of memory (%zu bytes)", n);
    return q;
}

size_t trex_peak_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmHWM:", 6) != 0)
            continue;
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(line + 6, &end, 10);
        if (errno == 0 && end != line + 6 && v <= SIZE_MAX / 1024)
            kb = (size_t)v;
        break;
    }
    if (fclose(f) != 0)
        return 0;
    return kb * 1024;
}
