/* server/http/metrics.c — GET /metrics in the Prometheus text exposition format (0.0.4), with vLLM's metric
 * names under a "graphswap:" prefix, so vLLM dashboards and RL-side monitors read them unchanged.
 *
 * Sources. Gauges (running / waiting requests, KV usage) and the engine's token counters are copied
 * into atomics by the engine thread (srv_metrics_publish) after each step, and also before a
 * request's first token or its finish can reach the client (server/openai/completions.c), so a client never sees
 * its own request missing from them: a handler thread never reads engine state. Histograms and finish
 * counters are updated by the engine-thread callbacks under met.mu and read under it here.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http/http.h"
#include "server/http/metrics.h"

/* vLLM's buckets */
static const double ttft_le[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                 1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_le[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4,  0.5,
                                0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_le[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

#define NB(a) ((int)(sizeof(a) / sizeof((a)[0])))

void srv_metrics_init(srv_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->ttft.le = ttft_le;
    m->ttft.n = NB(ttft_le);
    m->itl.le = itl_le;
    m->itl.n = NB(itl_le);
    m->e2e.le = e2e_le;
    m->e2e.n = NB(e2e_le);
    _Static_assert(NB(ttft_le) <= SRV_HIST_MAX && NB(itl_le) <= SRV_HIST_MAX && NB(e2e_le) <= SRV_HIST_MAX,
                   "histogram bucket count");
}

void srv_metrics_destroy(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void srv_hist_observe(srv_hist *h, double v)
{
    if (!(v >= 0)) v = 0;
    int b = 0;
    while (b < h->n && v > h->le[b]) b++;
    h->bucket[b]++;
    h->sum += v;
    h->count++;
}

void srv_metrics_publish(srv_metrics *m, const eng_engine *e)
{
    const eng_stats *st = eng_get_stats(e);
    atomic_store(&m->running, eng_num_running(e));
    atomic_store(&m->waiting, eng_num_waiting(e));
    atomic_store(&m->kv_in_use, eng_kv_blocks_in_use(e));
    atomic_store(&m->kv_total, eng_kv_blocks_total(e));
    atomic_store(&m->prompt_tokens, st->prompt_tokens);
    atomic_store(&m->generation_tokens, st->generated_tokens);
    atomic_store(&m->prefix_queries, st->prefix_cache_queries);
    atomic_store(&m->prefix_hits, st->prefix_cache_hits);
    atomic_store(&m->spec_drafts, st->spec_drafts);
    atomic_store(&m->spec_draft_tokens, st->spec_draft_tokens);
    atomic_store(&m->spec_accepted, st->spec_accepted);
    _Static_assert(sizeof st->spec_accepted_per_pos / sizeof st->spec_accepted_per_pos[0] ==
                       sizeof m->spec_accepted_per_pos / sizeof m->spec_accepted_per_pos[0],
                   "per-position acceptance counters");
    for (int i = 0; i < ENG_SPEC_MAX_POS; i++) atomic_store(&m->spec_accepted_per_pos[i], st->spec_accepted_per_pos[i]);
}


/* Prometheus label value escaping: backslash, double quote and newline. */
static void label_escape(const char *in, char *out, size_t cap)
{
    size_t k = 0;
    for (; *in && k + 3 < cap; in++) {
        if (*in == '\\' || *in == '"') {
            out[k++] = '\\';
            out[k++] = *in;
        } else if (*in == '\n') {
            out[k++] = '\\';
            out[k++] = 'n';
        } else {
            out[k++] = *in;
        }
    }
    out[k] = 0;
}

static void header(srv_buf *b, const char *name, const char *type, const char *help)
{
    srv_buf_printf(b, "# HELP graphswap:%s %s\n# TYPE graphswap:%s %s\n", name, help, name, type);
}

static void hist(srv_buf *b, const char *name, const char *help, const srv_hist *h, const char *lbl)
{
    header(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->bucket[i];
        srv_buf_printf(b, "graphswap:%s_bucket{%s,le=\"%g\"} %llu\n", name, lbl, h->le[i], (unsigned long long)cum);
    }
    cum += h->bucket[h->n];
    srv_buf_printf(b, "graphswap:%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lbl, (unsigned long long)cum);
    srv_buf_printf(b, "graphswap:%s_sum{%s} %.9g\n", name, lbl, h->sum);
    srv_buf_printf(b, "graphswap:%s_count{%s} %llu\n", name, lbl, (unsigned long long)h->count);
}

char *srv_metrics_render(srv_metrics *m, const char *model_name, size_t *len)
{
    srv_buf b = {0};
    char esc[512], lbl[600];
    label_escape(model_name, esc, sizeof esc);
    snprintf(lbl, sizeof lbl, "model_name=\"%s\"", esc);

    header(&b, "num_requests_running", "gauge", "Number of requests in model execution batches.");
    srv_buf_printf(&b, "graphswap:num_requests_running{%s} %d\n", lbl, atomic_load(&m->running));
    header(&b, "num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
    srv_buf_printf(&b, "graphswap:num_requests_waiting{%s} %d\n", lbl, atomic_load(&m->waiting));
    int used = atomic_load(&m->kv_in_use), total = atomic_load(&m->kv_total);
    header(&b, "kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
    srv_buf_printf(&b, "graphswap:kv_cache_usage_perc{%s} %.6g\n", lbl, total > 0 ? (double)used / total : 0.0);

    header(&b, "prompt_tokens_total", "counter", "Number of prefill tokens processed.");
    srv_buf_printf(&b, "graphswap:prompt_tokens_total{%s} %llu\n", lbl, (unsigned long long)atomic_load(&m->prompt_tokens));
    header(&b, "generation_tokens_total", "counter", "Number of generation tokens processed.");
    srv_buf_printf(&b, "graphswap:generation_tokens_total{%s} %llu\n", lbl,
              (unsigned long long)atomic_load(&m->generation_tokens));
    header(&b, "prefix_cache_queries_total", "counter",
           "Prefix cache queries, in terms of number of queried tokens.");
    srv_buf_printf(&b, "graphswap:prefix_cache_queries_total{%s} %llu\n", lbl,
              (unsigned long long)atomic_load(&m->prefix_queries));
    header(&b, "prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.");
    srv_buf_printf(&b, "graphswap:prefix_cache_hits_total{%s} %llu\n", lbl, (unsigned long long)atomic_load(&m->prefix_hits));

    /* speculative decoding (zero without a drafter); mean acceptance length = 1 + accepted / drafts */
    header(&b, "spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.");
    srv_buf_printf(&b, "graphswap:spec_decode_num_drafts_total{%s} %llu\n", lbl,
              (unsigned long long)atomic_load(&m->spec_drafts));
    header(&b, "spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.");
    srv_buf_printf(&b, "graphswap:spec_decode_num_draft_tokens_total{%s} %llu\n", lbl,
              (unsigned long long)atomic_load(&m->spec_draft_tokens));
    header(&b, "spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.");
    srv_buf_printf(&b, "graphswap:spec_decode_num_accepted_tokens_total{%s} %llu\n", lbl,
              (unsigned long long)atomic_load(&m->spec_accepted));
    header(&b, "spec_decode_num_accepted_tokens_per_pos_total", "counter",
           "Accepted tokens per draft position.");
    int npos = 0;
    for (int i = 0; i < ENG_SPEC_MAX_POS; i++)
        if (atomic_load(&m->spec_accepted_per_pos[i])) npos = i + 1;
    for (int i = 0; i < npos; i++)
        srv_buf_printf(&b, "graphswap:spec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%d\"} %llu\n", lbl, i,
                  (unsigned long long)atomic_load(&m->spec_accepted_per_pos[i]));

    pthread_mutex_lock(&m->mu);
    header(&b, "request_success_total", "counter", "Count of successfully processed requests.");
    static const char *reasons[4] = {NULL, "length", "stop", "abort"}; /* indexed by eng_finish */
    for (int f = ENG_FINISH_LENGTH; f <= ENG_FINISH_ABORT; f++)
        srv_buf_printf(&b, "graphswap:request_success_total{%s,finished_reason=\"%s\"} %llu\n", lbl, reasons[f],
                  (unsigned long long)m->finished[f]);
    hist(&b, "time_to_first_token_seconds", "Histogram of time to first token in seconds.", &m->ttft, lbl);
    hist(&b, "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &m->itl, lbl);
    hist(&b, "e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", &m->e2e, lbl);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}
