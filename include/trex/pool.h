/* trex/pool.h — a fixed thread pool with a deterministic parallel-for.
 *
 * trex_pool_for splits [0, n) into contiguous chunks, one per thread, by a rule that depends only on n,
 * grain and the pool size; every index is run exactly once. Kernels that want bitwise results whatever
 * the thread count compute each output element in one thread, in a fixed order. */
#ifndef TREX_POOL_H
#define TREX_POOL_H

#include <stdint.h>

#include "trex/status.h"

typedef struct trex_pool trex_pool;

/* fn runs on indices [begin, end) from thread tid (0 <= tid < trex_pool_size). */
typedef void (*trex_task_fn)(void *arg, int64_t begin, int64_t end, int tid);

/* nthreads <= 0: the TREX_THREADS environment variable, else the number of online cores. Waiting
 * threads poll for up to TREX_SPIN_US microseconds before they sleep (core/pool.c). Returns NULL when
 * threads cannot be started or either variable is invalid. */
trex_pool *trex_pool_create(int nthreads);
/* Same, with a message: TREX_EINVAL for a bad TREX_THREADS, TREX_SPIN_US or count, TREX_EUNSUPPORTED
 * when threads cannot be started, TREX_ENOMEM. */
trex_code trex_pool_create_checked(trex_pool **out, int nthreads, trex_err *err);
/* The thread count trex_pool_create would use: requested if > 0, else TREX_THREADS, else the cores. */
trex_code trex_pool_threads(int requested, int *out, trex_err *err);
void trex_pool_destroy(trex_pool *pool);
int trex_pool_size(const trex_pool *pool);  /* 1 for a NULL pool */
/* CPU seconds of the calling thread and the pool's workers, each read from its own thread clock. Unlike
 * the process clock (trex_cpu_s), which on Linux adds another thread's time still on a core only at a
 * scheduler tick or switch, this counts a running worker to the moment of the call: the CPU time of a
 * parallel call of a millisecond is then not short by a worker's share. */
double trex_pool_cpu_s(const trex_pool *pool);

/* Runs fn over [0, n) and returns when every chunk is done. A NULL pool, n <= grain, or a call from
 * inside a pool task runs inline on the caller. grain >= 1 is the smallest chunk worth a thread. */
void trex_pool_for(trex_pool *pool, int64_t n, int64_t grain, trex_task_fn fn, void *arg);
/* The number of chunks (= threads used) trex_pool_for gives [0, n): 1 when n <= grain, else
 * min(size, n / grain). Chunk i is [i*(n/k) + min(i, n%k), ...), the first n % k chunks one longer. */
int trex_pool_chunks(const trex_pool *pool, int64_t n, int64_t grain);

#endif
