/* server/core/closures.c — engine closures: a handler thread's way to run code on the engine thread
 * (srv_engine_call in srv.h). The queue is srv_state.clo_head/clo_tail under srv_state.mu; the engine
 * thread drains it between steps (server/serve.c), after the inbox and the admin commands. A closure
 * belongs to its handler again once `done` is set: the handler waits for that on the closure's
 * condition variable, so the engine never touches a closure after signalling it. */
#include <pthread.h>

#include "server/core/srv.h"

int srv_engine_call(srv_state *s, srv_closure *c)
{
    pthread_cond_init(&c->cv, NULL);
    c->done = c->ran = 0;
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
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&s->mu);
    }
}
