/* server/core/closures.c — engine closures: a handler thread's way to run code on the engine thread
 * (srv_engine_call in srv.h). The queue is srv_state.clo_head/clo_tail under srv_state.mu; the engine
 * thread drains it between steps (server/serve.c), after the inbox and the admin commands. A closure
 * belongs to its handler again once `done` is set: the handler waits for that on the closure's
 * condition variable, so the engine never touches a closure after signalling it. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "server/core/srv.h"

/* Queues c and waits until the engine thread ran it, or until `deadline` (srv_now() seconds;
 * INFINITY: no limit). 0: ran; -1: not run (shutting down); 1: the deadline passed first, and c
 * now belongs to the engine thread, which frees it (so c must come from malloc then). */
static int call_until(srv_state *s, srv_closure *c, double deadline)
{
    srv_cond_init_monotonic(&c->cv);
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
    if (isinf(deadline)) {
        while (!c->done) pthread_cond_wait(&c->cv, &s->mu);
    } else {
        const struct timespec ts = srv_timespec_at(deadline);
        while (!c->done && pthread_cond_timedwait(&c->cv, &s->mu, &ts) != ETIMEDOUT) {
        }
    }
    if (!c->done) { /* still queued or running: the engine thread frees it when it is done */
        c->abandoned = 1;
        pthread_mutex_unlock(&s->mu);
        return 1;
    }
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&c->cv);
    return c->ran ? 0 : -1;
}

int srv_engine_call(srv_state *s, srv_closure *c) { return call_until(s, c, INFINITY); }

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
    c->fn = ping_noop;
    const int rc = call_until(s, c, srv_now() + timeout_s);
    if (rc != 1) free(c); /* (on 1 the engine thread owns it) */
    return rc;
}
