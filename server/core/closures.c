/* server/core/closures.c — engine closures: a handler thread's way to run code on the engine thread
 * (srv_engine_call in srv.h). The queue is srv_state.clo_head/clo_tail under srv_state.mu; the engine
 * thread drains it between steps (server/serve.c), after the inbox and the admin commands. A closure
 * belongs to its handler again once `done` is set: the handler waits for that on the closure's
 * condition variable, so the engine never touches a closure after signalling it. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "server/core/srv.h"

int srv_engine_call(srv_state *s, srv_closure *c)
{
    pthread_cond_init(&c->cv, NULL);
    c->done = c->ran = c->abandoned = 0;
    c->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        pthread_cond_destroy(&c->cv);
        return -1;
    }
    if (s->clo_tail) s->clo_tail->next = c;
    else s->clo_head = c;
    s->clo_tail = c;
    pthread_cond_signal(&s->inbox_cv);
    while (!c->done) pthread_cond_wait(&c->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&c->cv);
    return c->ran ? 0 : -1;
}

void srv_closures_run(srv_state *s, int stopping)
{
    pthread_mutex_lock(&s->mu);
    srv_closure *list = s->clo_head;
    s->clo_head = s->clo_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (list) {
        srv_closure *c = list;
        list = c->next; /* (c belongs to its handler again once done is set) */
        if (!stopping) {
            c->fn(s, c->arg);
            c->ran = 1;
        }
        pthread_mutex_lock(&s->mu);
        c->done = 1;
        const int orphan = c->abandoned; /* its handler gave up waiting: nobody else holds it */
        if (!orphan) pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&s->mu);
        if (orphan) {
            pthread_cond_destroy(&c->cv);
            free(c);
        }
    }
}

static void ping_noop(srv_state *s, void *arg)
{
    (void)s;
    (void)arg;
}

int srv_engine_ping(srv_state *s, double timeout_s)
{
    srv_closure *c = calloc(1, sizeof *c);
    if (!c) return -1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->fn = ping_noop;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    const double whole = floor(timeout_s);
    dl.tv_sec += (time_t)whole;
    dl.tv_nsec += (long)((timeout_s - whole) * 1e9);
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
        return -1;
    }
    if (s->clo_tail) s->clo_tail->next = c;
    else s->clo_head = c;
    s->clo_tail = c;
    pthread_cond_signal(&s->inbox_cv);
    int rc = 0;
    while (!c->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&c->cv, &s->mu, &dl);
    const int done = c->done, ran = c->ran;
    if (!done) c->abandoned = 1; /* still queued or running: the engine thread frees it */
    pthread_mutex_unlock(&s->mu);
    if (!done) return 1;
    pthread_cond_destroy(&c->cv);
    free(c);
    return ran ? 0 : -1;
}
