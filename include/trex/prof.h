/* trex/prof.h — op-class timers: wall seconds and call counts per class of operation (embedding,
 * attention, MoE, mHC, head, MTP, optimizer, other) over some training steps, for `trex bench step`.
 *
 * Usage:
 *   trex_prof p;  trex_prof_reset(&p);
 *   trex_prof_attach(&p);                 // this thread records into p from now on
 *   ... trex_prof_begin(TREX_PROF_MOE); moe(...); trex_prof_end(TREX_PROF_MOE); ...
 *   trex_prof_attach(NULL);               // off again
 *   p.seconds[TREX_PROF_MOE], p.calls[TREX_PROF_MOE]
 *
 * Begin/end pairs are placed in the code on the thread that drives a step (the model's forward and
 * backward, the optimizer step); the work inside may run on the pool's threads, so a class's seconds
 * are the wall time the driving thread spent in it. Pairs nest (the MTP block runs attention and MoE
 * sub-layers): time is charged to the innermost open class only, so the classes never count a second
 * twice and their sum is at most the wall time between attach and detach. Each interval is also
 * charged the process's CPU time (CLOCK_PROCESS_CPUTIME_ID: all threads, pool workers included).
 *
 * Matrix products are also charged by shape: every call of the bf16 GEMM framework made on a thread with
 * a profiler attached adds its wall time and FLOPs to the entry of its shape and layout (gemm[]), for
 * `trex bench step --gemm-profile`. Products that run on the pool's threads inside another op (none
 * at present) would not be seen. The entries overlap the classes: a product is also in its class.
 *
 * The profiler a thread records into is a thread-local pointer set by trex_prof_attach (the one piece
 * of per-thread state in trex besides the kernel dispatch table: it spares every layer a context
 * argument that only benchmarks use). With nothing attached, begin/end are one thread-local load and
 * a branch. A trex_prof is owned by the caller; it must outlive its attachment. */
#ifndef TREX_PROF_H
#define TREX_PROF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum trex_prof_class {
    TREX_PROF_EMBED = 0, /* embedding lookup and its gradient */
    TREX_PROF_ATTENTION, /* attention sub-layers with their input norm (forward, backward) */
    TREX_PROF_MOE,       /* MoE sub-layers with their input norm */
    TREX_PROF_MHC,       /* mHC pre/post mappings around every sub-layer (Sinkhorn included) */
    TREX_PROF_HEAD,      /* hc_head, final norm, LM head and cross-entropy (main and MTP) */
    TREX_PROF_MTP,       /* MTP-only work: enorm/hnorm, e_proj/h_proj (its block's sub-layers and head
                          * count under their own classes) */
    TREX_PROF_OPTIMIZER, /* gradient norm, clipping, optimizer step, bias update */
    TREX_PROF_OTHER,     /* anything else a caller chooses to time */
    TREX_PROF_COUNT
} trex_prof_class;

#define TREX_PROF_MAX_DEPTH 8
#define TREX_PROF_GEMM_MAX 256 /* shapes kept; later ones are summed in the last entry (groups 0) */

/* Layout bits of a product C = alpha op(A) op(B) + beta C (trex_prof_gemm.layout). */
enum {
    TREX_PROF_GEMM_TA = 1,          /* op(A) = A^T: A stored [K, M] */
    TREX_PROF_GEMM_TB = 2,          /* op(B) = B^T: B stored [N, K] */
    TREX_PROF_GEMM_A_F32 = 4,       /* A fp32, rounded to bf16 while packed (else bf16) */
    TREX_PROF_GEMM_B_F32 = 8,
    TREX_PROF_GEMM_A_PACKED = 16,   /* A pre-packed by the caller */
    TREX_PROF_GEMM_B_PACKED = 32,
    TREX_PROF_GEMM_A_ROWS = 64,     /* A read through a row list (grouped experts) */
    TREX_PROF_GEMM_B_ROWS = 128,
    TREX_PROF_GEMM_ACCUMULATE = 256, /* beta != 0: C read and written */
    TREX_PROF_GEMM_SCALED = 512,    /* alpha != 1, or beta not in {0, 1} */
    TREX_PROF_GEMM_SYM = 1024,      /* a symmetric product op(X) op(X)^T (trex_gemm_syrk) */
    TREX_PROF_GEMM_B_EXACT = 2048,  /* B fp32 taken as it is, against a spread bf16 A (trex_gemm_bf16_f32b) */
};

/* The products of one shape and layout. A call of one problem is keyed by its M, N and K; a grouped
 * call (the experts) by the N and K of its first problem and its number of problems, whatever their
 * rows (which follow the routing). trex_prof_gemm_add takes one call with m = its rows (M summed over
 * its problems); the entry's m sums them over its calls. */
typedef struct trex_prof_gemm {
    int64_t m, n, k, groups;
    int64_t key_m; /* entries: M of a one-problem shape, 0 for grouped calls (set by trex_prof_gemm_add) */
    unsigned layout;
    int64_t calls;
    double seconds, flops; /* wall seconds of the calls, 2 M N K summed over their problems (a symmetric
                            * product: M (M + 1) K, the FLOPs of its distinct elements) */
} trex_prof_gemm;

typedef struct trex_prof {
    double seconds[TREX_PROF_COUNT]; /* wall seconds charged to each class (exclusive of nested ones) */
    double cpu_seconds[TREX_PROF_COUNT]; /* CPU seconds of the whole process (every thread) in the same
                                          * intervals: on a shared machine, the time actually on a core */
    int64_t calls[TREX_PROF_COUNT];  /* begin calls of each class */
    trex_prof_gemm gemm[TREX_PROF_GEMM_MAX]; /* matrix products by shape, in order of first call */
    int ngemm;
    /* the same products by the class open when they ran (TREX_PROF_OTHER when none was) */
    double gemm_seconds[TREX_PROF_COUNT], gemm_flops[TREX_PROF_COUNT];
    /* private: the open classes, innermost last, and the time of the last charge */
    int depth;
    int open[TREX_PROF_MAX_DEPTH];
    double mark, cpu_mark;
} trex_prof;

/* Zeroes the counters (also of an uninitialised struct); not while p is attached with a class open. */
void trex_prof_reset(trex_prof *p);
/* Makes p the calling thread's profiler (NULL: none); returns the previous one. */
trex_prof *trex_prof_attach(trex_prof *p);
/* Open / close class c on the calling thread; no-ops when no profiler is attached. Pairs must nest
 * (end closes the innermost open class, which must be c: a mismatch is a bug and aborts). */
void trex_prof_begin(trex_prof_class c);
void trex_prof_end(trex_prof_class c);
/* Whether the calling thread has a profiler attached (the GEMM framework times its calls only then). */
bool trex_prof_gemm_on(void);
/* Charges one call (g->m its rows, g->seconds, g->flops; g->calls and g->key_m are ignored) to the
 * entry of its shape and layout and to the innermost open class; a call of no problem (groups 0) is
 * not charged. */
void trex_prof_gemm_add(const trex_prof_gemm *g);
/* "nn", "nt", "tn" or "tt", then the operand types ("bf16", "f32", "packed") and "rows", "+=", "scaled"
 * where they apply, e.g. "nt f32 x packed +=", into buf; returns buf. */
const char *trex_prof_gemm_layout(unsigned layout, char *buf, size_t size);
/* "embed", "attention", "moe", "mhc", "head", "mtp", "optimizer", "other". */
const char *trex_prof_name(trex_prof_class c);

/* Clocks, in seconds: monotonic wall time, and the CPU time of the whole process (every thread). */
double trex_wall_s(void);
double trex_cpu_s(void);
/* Sum of seconds over every class. */
double trex_prof_total(const trex_prof *p);

#endif
