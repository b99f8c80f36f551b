/* kernels/cpu/pool.c — the fixed worker pool behind kern_pool_run.
 *
 * kern_pool_run is called a few hundred times per decode step, so a dispatch must cost a few
 * microseconds, not a futex round trip per worker. Protocol:
 *  - The caller publishes (fn, ctx), resets `done`, then bumps the generation counter `gen`
 *    (seq_cst). Workers waiting for a new generation see it by spinning on `gen`.
 *  - A worker that saw no new generation for spin_ns stops spinning: under `mu` it increments
 *    `sleepers`, re-reads `gen`, and waits on `cv` while it is unchanged. The caller, after bumping
 *    `gen`, reads `sleepers` and broadcasts (under `mu`) only if it is non-zero. Both sides do a
 *    seq_cst write then a seq_cst read of the other's variable, so at least one of them sees the
 *    other: either the caller broadcasts, or the worker sees the new generation and never waits.
 *  - The caller runs its own share as thread 0, then spins until `done` == nthreads - 1. Workers
 *    read fn/ctx before their increment of `done`, so the next run cannot overwrite them early.
 * One thread at a time may call kern_pool_run (the engine thread); a task must not call it.
 */
#include "kernels/cpu/kern_cpu.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KERN_POOL_MAX_THREADS 256
#define KERN_SPIN_US_DEFAULT 1000

struct kern_pool {
    int n;
    pthread_t *threads; /* n - 1 workers; thread 0 is the caller */
    kern_task_fn fn;
    void *ctx;
    atomic_long spin_ns;
    atomic_int stop;
    int bf16_activations; /* the bf16-weight matmul order: KERN_BF16_ACT_OFF / _PAIRS / _AMX (kern_cpu.h) */
    void *scratch;        /* n * KERN_POOL_SCRATCH_BYTES (or NULL) */
    /* separate cache lines: `gen` is read-mostly by spinning workers, `done` is written by them */
    _Alignas(64) atomic_uint gen;
    _Alignas(64) atomic_int done;
    _Alignas(64) atomic_int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct {
    kern_pool *pool;
    int tid;
} worker_arg;

static inline void cpu_relax(void)
{
#ifdef KERN_HAVE_X86
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Waits for gen != seen and returns the new value: spin with pause for KERN_SPIN_PURE_NS, then
 * spin with sched_yield (so that, with more runnable threads than cores, a spinning worker hands
 * its core to the thread everyone is waiting for instead of burning its time slice) until spin_ns,
 * then sleep on the condition variable. */
#define KERN_SPIN_PURE_NS 20000
static unsigned wait_generation(kern_pool *p, unsigned seen)
{
    unsigned g;
    const long spin = atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
    int64_t t0 = 0, elapsed = 0;
    for (unsigned i = 0;; i++) {
        g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        if (elapsed < KERN_SPIN_PURE_NS)
            cpu_relax();
        else
            sched_yield();
        if ((i & 31) == 31) { /* the clock is read rarely: it costs more than a pause */
            int64_t t = now_ns();
            if (t0 == 0) t0 = t;
            elapsed = t - t0;
            if (elapsed >= spin) break;
        }
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *arg)
{
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    kern_pool *p = wa.pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_generation(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        p->fn(p->ctx, wa.tid, p->n);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
    return NULL;
}

static void wake_all(kern_pool *p)
{
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

kern_pool *kern_pool_create(int nthreads)
{
    if (nthreads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n > 0 ? (int)n : 1;
    }
    if (nthreads > KERN_POOL_MAX_THREADS) nthreads = KERN_POOL_MAX_THREADS;
    kern_pool *p = aligned_alloc(64, (sizeof(kern_pool) + 63) / 64 * 64);
    if (!p) return NULL;
    memset(p, 0, sizeof(*p));
    p->n = nthreads;
    /* every mode's per-thread matmul scratch (NULL if out of memory: the matmuls then run without) */
    p->scratch = aligned_alloc(64, (size_t)nthreads * KERN_POOL_SCRATCH_BYTES);
    long spin_us = KERN_SPIN_US_DEFAULT;
    const char *env = getenv("GS_KERN_SPIN_US");
    if (env && *env) spin_us = atol(env);
    atomic_init(&p->spin_ns, spin_us * 1000);
    atomic_init(&p->stop, 0);
    atomic_init(&p->gen, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    if (pthread_mutex_init(&p->mu, NULL) != 0) goto fail_mu;
    if (pthread_cond_init(&p->cv, NULL) != 0) goto fail_cv;
    if (nthreads > 1) {
        p->threads = calloc((size_t)nthreads - 1, sizeof(pthread_t));
        if (!p->threads) goto fail_threads;
    }
    for (int t = 1; t < nthreads; t++) {
        worker_arg *wa = malloc(sizeof(*wa));
        int err = wa ? 0 : ENOMEM;
        if (wa) {
            *wa = (worker_arg){p, t};
            err = pthread_create(&p->threads[t - 1], NULL, worker_main, wa);
            if (err) free(wa);
        }
        if (err) { /* keep the threads that started: shut them down like destroy does */
            fprintf(stderr, "kern_pool_create: cannot start worker %d: error %d\n", t, err);
            p->n = t;
            kern_pool_destroy(p);
            return NULL;
        }
    }
    return p;
fail_threads:
    pthread_cond_destroy(&p->cv);
fail_cv:
    pthread_mutex_destroy(&p->mu);
fail_mu:
    free(p->scratch);
    free(p);
    return NULL;
}

void kern_pool_destroy(kern_pool *p)
{
    if (!p) return;
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    atomic_fetch_add(&p->gen, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->n; t++) pthread_join(p->threads[t - 1], NULL);
    free(p->threads);
    free(p->scratch);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int kern_pool_threads(const kern_pool *p) { return p ? p->n : 1; }

void kern_pool_set_spin_us(kern_pool *p, long us)
{
    atomic_store_explicit(&p->spin_ns, us * 1000, memory_order_relaxed);
}

void kern_pool_run(kern_pool *p, kern_task_fn fn, void *ctx)
{
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes fn/ctx/done, pairs with `sleepers` */
    wake_all(p);
    fn(ctx, 0, p->n);
    const int want = p->n - 1;
    /* Shares are balanced, so the wait is short; yield after a while in case a worker was
     * preempted (more runnable threads than cores). */
    for (unsigned i = 0; atomic_load_explicit(&p->done, memory_order_acquire) != want; i++) {
        if (i < 512)
            cpu_relax();
        else
            sched_yield();
    }
}

/* ---- helpers shared by the kernels ------------------------------------------------------------ */

/* Below ~32k scalar operations (a few microseconds) waking the workers costs about as much as it
 * saves. */
static atomic_size_t g_min_parallel_work = 32768;

size_t kern_cpu_set_min_parallel_work(size_t work)
{
    return atomic_exchange(&g_min_parallel_work, work);
}

void kern_cpu_parallel(kern_pool *pool, kern_task_fn fn, void *ctx, size_t work)
{
    if (!pool || pool->n == 1 || work < atomic_load_explicit(&g_min_parallel_work, memory_order_relaxed))
        fn(ctx, 0, 1);
    else
        kern_pool_run(pool, fn, ctx);
}

/* The per-thread scratch (activations pre-rounded to bf16, or a weight panel, simd_body.inc) is
 * allocated at creation, never in a step; without it (out of memory) the matmuls run without it:
 * the same bits. This retries the allocation once. */
void kern_pool_set_bf16_activations(kern_pool *pool, int on)
{
    pool->bf16_activations = on == KERN_BF16_ACT_AMX ? KERN_BF16_ACT_AMX : on != 0;
    if (on && !pool->scratch) pool->scratch = aligned_alloc(64, (size_t)pool->n * KERN_POOL_SCRATCH_BYTES);
}

void *kern_pool_scratch(const kern_pool *pool, int tid)
{
    if (!pool || !pool->scratch) return NULL;
    assert(tid >= 0 && tid < pool->n);
    return (char *)pool->scratch + (size_t)tid * KERN_POOL_SCRATCH_BYTES;
}

int kern_pool_bf16_activations(const kern_pool *pool) { return pool ? pool->bf16_activations : 0; }
