/* core/pool.c — a fixed pthread pool with a deterministic static parallel-for.
 *
 * The caller is thread 0; nthreads-1 persistent workers wait for the job generation counter to move.
 * A call splits [0, n) into k = min(nthreads, n / grain) contiguous chunks, the first n % k of them one
 * index longer; chunk i runs on thread i. The boundaries depend only on n, grain and the pool size,
 * never on timing. Concurrent calls from unrelated threads are serialised; a call from inside a task
 * (of any pool) runs inline on the calling thread, which a thread-local marker detects (the only
 * per-thread state here, set only while a task runs).
 *
 * Waiting polls before it sleeps. A training step makes about 1 800 parallel calls, most of them a
 * few hundred microseconds long with a few microseconds of the caller's serial work between them; a
 * condition variable alone costs 60-75 us per call on the 2-core development VM (a sleeping thread's
 * wake-up), about 0.12 s of a 3.5 s step at T = 512. So a worker polls the generation for up to
 * TREX_SPIN_US microseconds (default SPIN_US; 0 for a pool with more threads than cores; 0: never
 * poll) before it sleeps on a condition variable, and the caller polls the count of workers still on
 * the job for an adaptive budget of at most that long (spin_until): where other processes hold the
 * cores, the caller's polling would keep a core from a worker that has not even taken the job, so such
 * waits cut the budget and the caller soon sleeps at once. 2-chunk calls in a loop: 1.6 us polling,
 * 60-75 us sleeping at once; beside two busy loops on the 2 cores 3.3 us against 104 us.
 *
 * No wake-up is lost: a thread about to sleep registers (sleepers, waiting) and then checks its
 * condition again, and the thread that makes the condition true publishes it and then reads the
 * registration, all sequentially consistent atomics: in their single order one of the two sees the
 * other (weakening either side to release/acquire would reopen the gap, and no test can show it). The
 * lock only closes the interval between that second check and the wait, for the broadcast that a
 * registration asks for. */
#include "trex/pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trex/status.h"

#define POOL_MAX_THREADS 1024
#define SPIN_US 200         /* default polling before a wait sleeps, at most (TREX_SPIN_US overrides) */
#define SPIN_PROBE_NS 2000  /* polling when the adaptive budget has fallen below it (spin_until) */
#define SPIN_US_MAX 1000000 /* TREX_SPIN_US at most this (one second) */

struct trex_pool {
    int nthreads;
    pthread_t *threads; /* nthreads - 1 workers; worker w runs chunks for tid w + 1 */
    int started;        /* workers successfully created */
    int64_t spin_ns;    /* polling before a wait sleeps, at most */
    int64_t call_budget; /* the caller's adaptive polling (spin_until; guarded by call_lock) */

    pthread_mutex_t call_lock; /* one parallel-for at a time */
    pthread_mutex_t lock;      /* guards the sleeps on wake and done */
    pthread_cond_t wake;
    pthread_cond_t done;
    _Atomic uint64_t generation; /* moves once per job, after the job is written */
    atomic_int stop;
    atomic_int pending;  /* workers that have not finished (or passed on) the current job */
    atomic_int running;  /* workers that have taken the current job (pending - running: not yet) */
    atomic_int sleepers; /* workers asleep on wake, or about to be */
    atomic_int waiting;  /* the caller asleep on done, or about to be */

    /* the current job: written by the caller before generation moves, read by the workers after it
     * has; the caller writes the next one only when every worker has finished with this one */
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

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Every worker has taken the current job: those still on it are running, not waiting for a core. */
static bool workers_running(trex_pool *pool)
{
    return atomic_load_explicit(&pool->running, memory_order_relaxed) == pool->nthreads - 1;
}

/* Polls until pred(pool, seen) holds; true if it holds. A worker's wait for the next job (budget NULL)
 * polls for the pool's spin_ns: the caller's serial work between calls, not the load, decides how long
 * those waits are. The caller's wait polls for *budget ns (SPIN_PROBE_NS when less), which adapts: a
 * wait that ends while polling doubles it (up to spin_ns), one that runs out while some worker has not
 * taken the job quarters it (that worker is not running: polling only holds a core it may need), one
 * that runs out while all of them work leaves it (the wait was only long). */
static bool spin_until(trex_pool *pool, bool (*pred)(trex_pool *, uint64_t), uint64_t seen,
                       int64_t *budget)
{
    if (pred(pool, seen))
        return true;
    if (pool->spin_ns <= 0)
        return false;
    const int64_t want = budget ? *budget : pool->spin_ns;
    const int64_t t0 = now_ns(), limit = want > SPIN_PROBE_NS ? want : SPIN_PROBE_NS;
    for (unsigned i = 1;; i++) {
        cpu_relax();
        if (pred(pool, seen)) {
            if (budget)
                *budget = 2 * want + SPIN_PROBE_NS < pool->spin_ns ? 2 * want + SPIN_PROBE_NS
                                                                   : pool->spin_ns;
            return true;
        }
        if (i % 16 == 0 && now_ns() - t0 > limit) {
            if (budget && !workers_running(pool))
                *budget /= 4;
            return pred(pool, seen);
        }
    }
}

static bool job_posted(trex_pool *pool, uint64_t seen)
{
    return atomic_load(&pool->generation) != seen || atomic_load(&pool->stop);
}

static bool job_finished(trex_pool *pool, uint64_t unused)
{
    (void)unused;
    return atomic_load(&pool->pending) == 0;
}

/* The generation after `seen` (or any, once the pool stops): polled, then slept for. */
static uint64_t await_job(trex_pool *pool, uint64_t seen)
{
    if (!spin_until(pool, job_posted, seen, NULL)) {
        lock_or_die(&pool->lock);
        /* registered before the check: either this check sees the new generation, or trex_pool_for,
         * which reads sleepers after moving it, sees the registration and broadcasts */
        atomic_fetch_add(&pool->sleepers, 1);
        while (!job_posted(pool, seen))
            wait_or_die(&pool->wake, &pool->lock);
        atomic_fetch_sub(&pool->sleepers, 1);
        unlock_or_die(&pool->lock);
    }
    return atomic_load(&pool->generation);
}

static void *worker_main(void *p)
{
    worker_arg wa = *(worker_arg *)p;
    free(p);
    trex_pool *pool = wa.pool;
    for (uint64_t seen = 0;;) {
        seen = await_job(pool, seen);
        if (atomic_load(&pool->stop))
            break;
        atomic_fetch_add_explicit(&pool->running, 1, memory_order_relaxed);
        if (wa.tid < pool->chunks)
            run_chunk(pool, wa.tid);
        /* the last worker out wakes the caller if it went to sleep: it registered (waiting) before
         * checking pending under the lock, so one of the two sees the other */
        if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->waiting)) {
            lock_or_die(&pool->lock);
            broadcast_or_die(&pool->done);
            unlock_or_die(&pool->lock);
        }
    }
    return NULL;
}

/* The integer in environment variable `name`: false when it is unset or empty (*v untouched), else
 * true with *ok telling whether it is a whole integer in [lo, hi]. */
static bool env_integer(const char *name, long lo, long hi, long *v, bool *ok)
{
    const char *env = getenv(name);
    if (!env || !*env)
        return false;
    char *end = NULL;
    errno = 0;
    const long x = strtol(env, &end, 10);
    *ok = errno == 0 && end != env && *end == '\0' && x >= lo && x <= hi;
    if (*ok)
        *v = x;
    return true;
}

/* TREX_SPIN_US, or the default for a pool of n threads: SPIN_US, or 0 when the threads outnumber the
 * online cores (a polling thread would hold a core that a thread it waits for needs); an invalid
 * value is an error (as TREX_THREADS). */
static trex_code spin_setting(int n, int64_t *ns, trex_err *err)
{
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long us = cores > 0 && n > cores ? 0 : SPIN_US;
    bool ok = true;
    if (env_integer("TREX_SPIN_US", 0, SPIN_US_MAX, &us, &ok) && !ok)
        return trex_err_set(err, TREX_EINVAL,
                            "TREX_SPIN_US='%s' is not a polling time: set it to microseconds in [0, %d] "
                            "(0: threads sleep at once when they wait), or unset it for %d",
                            getenv("TREX_SPIN_US"), SPIN_US_MAX, SPIN_US);
    *ns = (int64_t)us * 1000;
    return TREX_OK;
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
    long v = 0;
    bool ok = true;
    if (env_integer("TREX_THREADS", 1, POOL_MAX_THREADS, &v, &ok)) {
        if (!ok)
            return trex_err_set(err, TREX_EINVAL,
                                "TREX_THREADS='%s' is not a thread count: set it to an integer in "
                                "[1, %d], or unset it to use every online core",
                                getenv("TREX_THREADS"), POOL_MAX_THREADS);
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
    int64_t spin_ns = 0;
    rc = spin_setting(n, &spin_ns, err);
    if (rc != TREX_OK)
        return rc;
    trex_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return trex_err_set(err, TREX_ENOMEM, "thread pool: out of memory");
    pool->nthreads = n;
    pool->spin_ns = spin_ns;
    pool->call_budget = spin_ns;
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
    atomic_store(&pool->stop, 1);
    lock_or_die(&pool->lock);
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

static double thread_cpu_s(clockid_t id)
{
    struct timespec ts;
    if (clock_gettime(id, &ts) != 0)
        return 0.0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double trex_pool_cpu_s(const trex_pool *pool)
{
    double s = thread_cpu_s(CLOCK_THREAD_CPUTIME_ID);
    for (int w = 0; pool && w < pool->started; w++) {
        clockid_t id;
        if (pthread_getcpuclockid(pool->threads[w], &id) == 0)
            s += thread_cpu_s(id);
    }
    return s;
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
    TREX_ASSERT(atomic_load(&pool->pending) == 0);
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    pool->chunks = k;
    atomic_store(&pool->pending, pool->nthreads - 1); /* every worker passes through each job */
    atomic_store_explicit(&pool->running, 0, memory_order_relaxed);
    atomic_fetch_add(&pool->generation, 1);
    if (atomic_load(&pool->sleepers) > 0) { /* a worker registered before checking: wake it */
        lock_or_die(&pool->lock);
        broadcast_or_die(&pool->wake);
        unlock_or_die(&pool->lock);
    }

    run_chunk(pool, 0);

    if (!spin_until(pool, job_finished, 0, &pool->call_budget)) {
        lock_or_die(&pool->lock);
        atomic_store(&pool->waiting, 1);
        while (!job_finished(pool, 0))
            wait_or_die(&pool->done, &pool->lock);
        atomic_store(&pool->waiting, 0);
        unlock_or_die(&pool->lock);
    }
    unlock_or_die(&pool->call_lock);
}
