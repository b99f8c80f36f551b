/* server/http/metrics.h — the counters and histograms behind GET /metrics (metrics.c). */
#ifndef GS_SRV_METRICS_H
#define GS_SRV_METRICS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* ---- metrics (metrics.c) ------------------------------------------------------------------------ */

#define SRV_HIST_MAX 24
typedef struct {
    const double *le; /* upper bounds, ascending; +Inf implied */
    int n;
    uint64_t bucket[SRV_HIST_MAX + 1]; /* per-bucket (not cumulative) counts, [n] = +Inf */
    double sum;
    uint64_t count;
} srv_hist;

typedef struct {
    pthread_mutex_t mu; /* histograms and finish counters */
    srv_hist ttft, itl, e2e;
    uint64_t finished[4]; /* by eng_finish (index 0 unused) */
    /* written by the engine thread after each step (a copy: handlers never read the engine) */
    atomic_int running, waiting, kv_in_use, kv_total;
    _Atomic uint64_t prompt_tokens, generation_tokens, prefix_queries, prefix_hits;
    _Atomic uint64_t spec_drafts, spec_draft_tokens, spec_accepted, spec_accepted_per_pos[64];
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
void srv_hist_observe(srv_hist *h, double v); /* caller holds m->mu */
/* Engine thread: copies gauges and counters out of the engine. */
void srv_metrics_publish(srv_metrics *m, const eng_engine *e);
/* Renders the Prometheus text exposition format; malloc'd, NUL-terminated. */
char *srv_metrics_render(srv_metrics *m, const char *model_name, size_t *len);

#endif
