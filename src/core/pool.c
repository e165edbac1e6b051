/* core/pool.c — a fixed pthread pool with a deterministic static parallel-for.
 *
 * The caller is thread 0; nthreads-1 persistent workers sleep on a condition variable and wake when
 * the job generation counter moves. A call splits [0, n) into k = min(nthreads, n / grain) contiguous
 * chunks, the first n % k of them one index longer; chunk i runs on thread i. The boundaries depend
 * only on n, grain and the pool size, never on timing. Concurrent calls from unrelated threads are
 * serialised; a call from inside a task (of any pool) runs inline on the calling thread, which a
 * thread-local marker detects (the only per-thread state here, set only while a task runs). */
#include "trex/pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trex/status.h"

#define POOL_MAX_THREADS 1024

struct trex_pool {
    int nthreads;
    pthread_t *threads; /* nthreads - 1 workers; worker w runs chunks for tid w + 1 */
    int started;        /* workers successfully created */

    pthread_mutex_t call_lock; /* one parallel-for at a time */
    pthread_mutex_t lock;      /* guards everything below */
    pthread_cond_t wake;
    pthread_cond_t done;
    uint64_t generation;
    int stop;
    int pending; /* worker chunks not yet finished */

    /* the current job */
    trex_task_fn fn;
    void *arg;
    int64_t n;
    int chunks;
};

typedef struct task_marker {
    const trex_pool *pool;
    int tid;
} task_marker;

static _Thread_local task_marker in_task;

typedef struct worker_arg {
    trex_pool *pool;
    int tid;
} worker_arg;

/* Chunk i of k over [0, n): balanced, first n % k chunks one longer. No overflow for any n >= 0. */
static void chunk_bounds(int64_t n, int k, int i, int64_t *begin, int64_t *end)
{
    int64_t base = n / k, rem = n % k;
    *begin = (int64_t)i * base + (i < rem ? i : rem);
    *end = *begin + base + (i < rem ? 1 : 0);
}

static void run_chunk(trex_pool *pool, int tid)
{
    int64_t b, e;
    chunk_bounds(pool->n, pool->chunks, tid, &b, &e);
    task_marker saved = in_task;
    in_task.pool = pool;
    in_task.tid = tid;
    pool->fn(pool->arg, b, e, tid);
    in_task = saved;
}

static void lock_or_die(pthread_mutex_t *m)
{
    int rc = pthread_mutex_lock(m);
    if (rc != 0)
        TREX_ABORT("pthread_mutex_lock: %s", strerror(rc));
}

static void unlock_or_die(pthread_mutex_t *m)
{
    int rc = pthread_mutex_unlock(m);
    if (rc != 0)
        TREX_ABORT("pthread_mutex_unlock: %s", strerror(rc));
}

static void wait_or_die(pthread_cond_t *c, pthread_mutex_t *m)
{
    int rc = pthread_cond_wait(c, m);
    if (rc != 0)
        TREX_ABORT("pthread_cond_wait: %s", strerror(rc));
}

static void broadcast_or_die(pthread_cond_t *c)
{
    int rc = pthread_cond_broadcast(c);
    if (rc != 0)
        TREX_ABORT("pthread_cond_broadcast: %s", strerror(rc));
}

static void *worker_main(void *p)
{
    worker_arg wa = *(worker_arg *)p;
    free(p);
    trex_pool *pool = wa.pool;
    uint64_t seen = 0;
    lock_or_die(&pool->lock);
    for (;;) {
        while (!pool->stop && pool->generation == seen)
            wait_or_die(&pool->wake, &pool->lock);
        if (pool->stop)
            break;
        seen = pool->generation;
        if (wa.tid >= pool->chunks)
            continue;
        unlock_or_die(&pool->lock);
        run_chunk(pool, wa.tid);
        lock_or_die(&pool->lock);
        if (--pool->pending == 0)
            broadcast_or_die(&pool->done);
    }
    unlock_or_die(&pool->lock);
    return NULL;
}

trex_code trex_pool_threads(int requested, int *out, trex_err *err)
{
    TREX_ASSERT(out);
    if (requested > 0) {
        if (requested > POOL_MAX_THREADS)
            return trex_err_set(err, TREX_EINVAL, "thread pool: %d threads requested, at most %d allowed",
                                requested, POOL_MAX_THREADS);
        *out = requested;
        return TREX_OK;
    }
    const char *env = getenv("TREX_THREADS");
    if (env && *env) {
        char *end = NULL;
        errno = 0;
        long v = strtol(env, &end, 10);
        if (errno != 0 || end == env || *end != '\0' || v < 1 || v > POOL_MAX_THREADS)
            return trex_err_set(err, TREX_EINVAL,
                                "TREX_THREADS='%s' is not a thread count: set it to an integer in "
                                "[1, %d], or unset it to use every online core",
                                env, POOL_MAX_THREADS);
        *out = (int)v;
        return TREX_OK;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1)
        cores = 1;
    if (cores > POOL_MAX_THREADS)
        cores = POOL_MAX_THREADS;
    *out = (int)cores;
    return TREX_OK;
}

trex_code trex_pool_create_checked(trex_pool **out, int nthreads, trex_err *err)
{
    TREX_ASSERT(out);
    *out = NULL;
    int n = 0;
    trex_code rc = trex_pool_threads(nthreads, &n, err);
    if (rc != TREX_OK)
        return rc;
    trex_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return trex_err_set(err, TREX_ENOMEM, "thread pool: out of memory");
    pool->nthreads = n;
    int inited = 0;
    int prc;
    if ((prc = pthread_mutex_init(&pool->call_lock, NULL)) != 0)
        goto fail_sync;
    inited++;
    if ((prc = pthread_mutex_init(&pool->lock, NULL)) != 0)
        goto fail_sync;
    inited++;
    if ((prc = pthread_cond_init(&pool->wake, NULL)) != 0)
        goto fail_sync;
    inited++;
    if ((prc = pthread_cond_init(&pool->done, NULL)) != 0)
        goto fail_sync;
    inited++;
    if (n > 1) {
        pool->threads = calloc((size_t)(n - 1), sizeof *pool->threads);
        if (!pool->threads) {
            trex_pool_destroy(pool);
            return trex_err_set(err, TREX_ENOMEM, "thread pool: out of memory");
        }
    }
    for (int w = 0; w < n - 1; w++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            trex_pool_destroy(pool);
            return trex_err_set(err, TREX_ENOMEM, "thread pool: out of memory");
        }
        wa->pool = pool;
        wa->tid = w + 1;
        prc = pthread_create(&pool->threads[w], NULL, worker_main, wa);
        if (prc != 0) {
            free(wa);
            trex_pool_destroy(pool);
            return trex_err_set(err, TREX_EUNSUPPORTED,
                                "thread pool: could not start thread %d of %d: %s; lower TREX_THREADS",
                                w + 1, n, strerror(prc));
        }
        pool->started++;
    }
    *out = pool;
    return TREX_OK;

fail_sync:
    if (inited > 3)
        pthread_cond_destroy(&pool->done);
    if (inited > 2)
        pthread_cond_destroy(&pool->wake);
    if (inited > 1)
        pthread_mutex_destroy(&pool->lock);
    if (inited > 0)
        pthread_mutex_destroy(&pool->call_lock);
    free(pool);
    return trex_err_set(err, TREX_EUNSUPPORTED, "thread pool: synchronisation setup failed: %s",
                        strerror(prc));
}

trex_pool *trex_pool_create(int nthreads)
{
    trex_pool *pool = NULL;
    if (trex_pool_create_checked(&pool, nthreads, NULL) != TREX_OK)
        return NULL;
    return pool;
}

void trex_pool_destroy(trex_pool *pool)
{
    if (!pool)
        return;
    TREX_ASSERT(in_task.pool != pool); /* destroying a pool from inside its own task */
    lock_or_die(&pool->lock);
    pool->stop = 1;
    broadcast_or_die(&pool->wake);
    unlock_or_die(&pool->lock);
    for (int w = 0; w < pool->started; w++) {
        int rc = pthread_join(pool->threads[w], NULL);
        if (rc != 0)
            TREX_ABORT("pthread_join: %s", strerror(rc));
    }
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->call_lock);
    free(pool->threads);
    free(pool);
}

int trex_pool_size(const trex_pool *pool)
{
    return pool ? pool->nthreads : 1;
}

int trex_pool_chunks(const trex_pool *pool, int64_t n, int64_t grain)
{
    TREX_ASSERT(n >= 0 && grain >= 1);
    int size = trex_pool_size(pool);
    if (n <= grain || size == 1)
        return 1;
    int64_t k = n / grain;
    return k < size ? (int)k : size;
}

void trex_pool_for(trex_pool *pool, int64_t n, int64_t grain, trex_task_fn fn, void *arg)
{
    TREX_ASSERT(fn);
    TREX_ASSERT(n >= 0 && grain >= 1);
    if (n == 0)
        return;
    if (in_task.pool) {
        fn(arg, 0, n, in_task.pool == pool ? in_task.tid : 0);
        return;
    }
    int k = trex_pool_chunks(pool, n, grain);
    if (k == 1) { /* not marked as a task: calls nested in fn may still use the pool */
        fn(arg, 0, n, 0);
        return;
    }
    lock_or_die(&pool->call_lock);
    lock_or_die(&pool->lock);
    TREX_ASSERT(pool->pending == 0);
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    pool->chunks = k;
    pool->pending = k - 1;
    pool->generation++;
    broadcast_or_die(&pool->wake);
    unlock_or_die(&pool->lock);

    run_chunk(pool, 0);

    lock_or_die(&pool->lock);
    while (pool->pending > 0)
        wait_or_die(&pool->done, &pool->lock);
    unlock_or_die(&pool->lock);
    unlock_or_die(&pool->call_lock);
}
