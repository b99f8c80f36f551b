/* bench/bench_serve.c — `graphswap bench serve`: drives a graphswap (or any OpenAI-compatible) server
 * over loopback with plain sockets and reports, per concurrency level, requests/s, generated tokens/s,
 * time to first token (mean / p50 / p99, streaming) and end-to-end latency; then the HTTP overhead of
 * one request: the same greedy generation timed over HTTP (non-streaming) and in-process (a runtime
 * opened here on the same model folder, found through /v1/models "root" or --model).
 *
 * Requests are streaming completions with token-id prompts (distinct per request, so the prefix cache
 * does not flatter the numbers), temperature 0, ignore_eos, and stream_options.include_usage so the
 * token count comes from the server. Each client thread keeps one HTTP/1.1 keep-alive connection and
 * decodes the chunked SSE body itself. Nothing here asserts a speed.
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "bench/bench.h"
#include "models/format/json_guard.h"
#include "server/core/cli.h"

/* ---- a minimal HTTP/1.1 client -------------------------------------------------------------------- */

typedef struct {
    char host[256];
    int port;
    const char *api_key;
} bs_target;

/* Called with each piece of the body as it arrives (after de-chunking). */
typedef void (*bs_sink)(void *ctx, const char *p, size_t n);

/* Sends one request and reads the whole response, feeding the body to sink. Returns the HTTP status,
 * or -1 on a connection failure (the connection is closed then). */
static int bs_request(const bs_target *t, bench_conn *c, const char *method, const char *path, const char *body,
                      bs_sink sink, void *ctx)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (c->fd < 0 && bench_connect(c, t->host, t->port) != 0) return -1;
        size_t bl = body ? strlen(body) : 0;
        char auth[512] = "";
        if (t->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", t->api_key);
        size_t cap = bl + 1024;
        char *req = malloc(cap);
        if (!req) return -1;
        int hn = snprintf(req, cap,
                          "%s %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                          "%sConnection: keep-alive\r\n\r\n",
                          method, path, t->host, t->port, bl, auth);
        if (bl) memcpy(req + hn, body, bl);
        int sent = bench_send_all(c->fd, req, (size_t)hn + bl);
        free(req);
        char line[8192];
        long ln = sent == 0 ? bench_line(c, line, sizeof line) : -1;
        if (ln < 0) { /* a kept-alive connection the server closed meanwhile: reconnect once */
            bench_close(c);
            continue;
        }
        int status = 0;
        if (sscanf(line, "HTTP/%*s %d", &status) != 1) {
            bench_close(c);
            return -1;
        }
        long long clen = -1;
        int chunked = 0, close_after = 0;
        while ((ln = bench_line(c, line, sizeof line)) > 0) {
            if (strncasecmp(line, "Content-Length:", 15) == 0) clen = atoll(line + 15);
            else if (strncasecmp(line, "Transfer-Encoding:", 18) == 0 && strstr(line, "chunked")) chunked = 1;
            else if (strncasecmp(line, "Connection:", 11) == 0 && strstr(line, "close")) close_after = 1;
        }
        if (ln < 0) {
            bench_close(c);
            return -1;
        }
        char data[65536];
        if (chunked) {
            for (;;) {
                if (bench_line(c, line, sizeof line) < 0) {
                    bench_close(c);
                    return -1;
                }
                size_t n = strtoul(line, NULL, 16);
                if (n == 0) {
                    bench_line(c, line, sizeof line); /* the CRLF after the last chunk */
                    break;
                }
                while (n) {
                    size_t k = n < sizeof data ? n : sizeof data;
                    if (bench_read(c, data, k) != 0) {
                        bench_close(c);
                        return -1;
                    }
                    if (sink) sink(ctx, data, k);
                    n -= k;
                }
                bench_line(c, line, sizeof line);
            }
        } else if (clen >= 0) {
            while (clen > 0) {
                size_t k = (size_t)clen < sizeof data ? (size_t)clen : sizeof data;
                if (bench_read(c, data, k) != 0) {
                    bench_close(c);
                    return -1;
                }
                if (sink) sink(ctx, data, k);
                clen -= (long long)k;
            }
        } else { /* until close */
            for (;;) {
                if (!bench_fill(c)) break;
                if (sink) sink(ctx, c->buf + c->pos, c->len - c->pos);
                c->pos = c->len;
            }
            close_after = 1;
        }
        if (close_after) bench_close(c);
        return status;
    }
    return -1;
}

/* Collects a whole body (for JSON responses). */
typedef struct {
    char *p;
    size_t n, cap;
} bs_buf;

static void bs_collect(void *ctx, const char *p, size_t n)
{
    bs_buf *b = ctx;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) return;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* ---- load generation ------------------------------------------------------------------------------- */

typedef struct {
    double t0, ttft, e2e;
    long tokens;
    int events, done, ok;
    char pending[8192]; /* an SSE event split across reads */
    size_t np;
} bs_stream;

static void bs_event(bs_stream *s, const char *ev, size_t n)
{
    if (n < 6 || memcmp(ev, "data: ", 6) != 0) return;
    if (n >= 12 && memcmp(ev + 6, "[DONE]", 6) == 0) {
        s->done = 1;
        s->e2e = bench_now() - s->t0;
        return;
    }
    char tmp[8192];
    size_t k = n < sizeof tmp - 1 ? n : sizeof tmp - 1;
    memcpy(tmp, ev, k);
    tmp[k] = 0;
    if (strstr(tmp, "\"error\"")) s->ok = 0;
    const char *u = strstr(tmp, "\"completion_tokens\":");
    if (u) s->tokens = atol(u + 20);
    else if (!strstr(tmp, "\"choices\":[]") && s->events++ == 0)
        s->ttft = bench_now() - s->t0;
}

static void bs_stream_sink(void *ctx, const char *p, size_t n)
{
    bs_stream *s = ctx;
    for (size_t i = 0; i < n; i++) {
        if (s->np < sizeof s->pending) s->pending[s->np++] = p[i];
        if (s->np >= 2 && s->pending[s->np - 1] == '\n' && s->pending[s->np - 2] == '\n') {
            bs_event(s, s->pending, s->np - 2);
            s->np = 0;
        }
    }
}

typedef struct {
    const bs_target *t;
    int n_requests, prompt_len, max_tokens, level;
    atomic_int next;
    double *ttft, *e2e;
    long *tokens;
    int *ok;
} bs_run;

static void *bs_worker(void *arg)
{
    bs_run *r = arg;
    bench_conn c = {.fd = -1};
    char *body = malloc((size_t)r->prompt_len * 12 + 512);
    if (!body) return NULL;
    int i;
    while ((i = atomic_fetch_add(&r->next, 1)) < r->n_requests) {
        /* a distinct prompt per (level, request): no prefix-cache reuse between requests */
        uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1) + (uint64_t)r->level * 0xD1B54A32D192ED03ull;
        size_t k = (size_t)sprintf(body, "{\"prompt\":[");
        for (int j = 0; j < r->prompt_len; j++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            k += (size_t)sprintf(body + k, "%s%u", j ? "," : "", (unsigned)(x % 200) + 10u);
        }
        sprintf(body + k,
                "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
                "\"stream_options\":{\"include_usage\":true}}",
                r->max_tokens);
        bs_stream s;
        memset(&s, 0, sizeof s);
        s.ok = 1;
        s.t0 = bench_now();
        int st = bs_request(r->t, &c, "POST", "/v1/completions", body, bs_stream_sink, &s);
        r->ok[i] = st == 200 && s.ok && s.done;
        r->ttft[i] = s.ttft;
        r->e2e[i] = s.done ? s.e2e : bench_now() - s.t0;
        r->tokens[i] = s.tokens;
    }
    bench_close(&c);
    free(body);
    return NULL;
}

static double pct(const double *sorted, int n, double p)
{
    if (n == 0) return 0;
    int i = (int)(p * (n - 1) + 0.5);
    return sorted[i < n ? i : n - 1];
}

static void run_level(const bs_target *t, int conc, int n, int prompt_len, int max_tokens, int level)
{
    bs_run r = {.t = t, .n_requests = n, .prompt_len = prompt_len, .max_tokens = max_tokens, .level = level};
    atomic_init(&r.next, 0);
    r.ttft = calloc((size_t)n, sizeof *r.ttft);
    r.e2e = calloc((size_t)n, sizeof *r.e2e);
    r.tokens = calloc((size_t)n, sizeof *r.tokens);
    r.ok = calloc((size_t)n, sizeof *r.ok);
    pthread_t *th = calloc((size_t)conc, sizeof *th);
    if (!r.ttft || !r.e2e || !r.tokens || !r.ok || !th) srv_die("out of memory");
    double t0 = bench_now();
    for (int i = 0; i < conc; i++)
        if (pthread_create(&th[i], NULL, bs_worker, &r) != 0) srv_die("cannot start client thread %d", i);
    for (int i = 0; i < conc; i++) pthread_join(th[i], NULL);
    double wall = bench_now() - t0;
    int ok = 0;
    long toks = 0;
    double *tt = calloc((size_t)n, sizeof *tt), *ee = calloc((size_t)n, sizeof *ee);
    if (!tt || !ee) srv_die("out of memory");
    double tsum = 0, esum = 0;
    for (int i = 0; i < n; i++) {
        if (!r.ok[i]) continue;
        tt[ok] = r.ttft[i];
        ee[ok] = r.e2e[i];
        tsum += r.ttft[i];
        esum += r.e2e[i];
        toks += r.tokens[i];
        ok++;
    }
    qsort(tt, (size_t)ok, sizeof *tt, bench_cmp_double);
    qsort(ee, (size_t)ok, sizeof *ee, bench_cmp_double);
    printf("%5d %6d/%-4d %9.2f %10.1f %10.2f %9.2f %9.2f %10.2f %9.2f\n", conc, ok, n, ok / wall, toks / wall,
           ok ? 1e3 * tsum / ok : 0, 1e3 * pct(tt, ok, 0.5), 1e3 * pct(tt, ok, 0.99), ok ? 1e3 * esum / ok : 0,
           1e3 * pct(ee, ok, 0.99));
    fflush(stdout);
    free(tt);
    free(ee);
    free(r.ttft);
    free(r.e2e);
    free(r.tokens);
    free(r.ok);
    free(th);
}

/* ---- HTTP overhead: the same generation over HTTP and in-process ------------------------------------- */

static int32_t *overhead_prompt(int len)
{
    int32_t *p = malloc((size_t)len * sizeof *p);
    if (!p) srv_die("out of memory");
    for (int j = 0; j < len; j++) p[j] = 10 + (j * 37) % 200;
    return p;
}

/* Median latency of a non-streaming greedy request over HTTP. */
static double http_latency(const bs_target *t, int prompt_len, int max_tokens, int reps, long *out_tokens)
{
    int32_t *p = overhead_prompt(prompt_len);
    char *body = malloc((size_t)prompt_len * 12 + 256);
    if (!body) srv_die("out of memory");
    size_t k = (size_t)sprintf(body, "{\"prompt\":[");
    for (int j = 0; j < prompt_len; j++) k += (size_t)sprintf(body + k, "%s%d", j ? "," : "", p[j]);
    sprintf(body + k, "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true}", max_tokens);
    double *v = calloc((size_t)reps, sizeof *v);
    bench_conn c = {.fd = -1};
    int n = 0;
    for (int i = 0; i < reps + 1; i++) { /* the first run warms the connection and caches */
        bs_buf b = {0};
        double t0 = bench_now();
        int st = bs_request(t, &c, "POST", "/v1/completions", body, bs_collect, &b);
        double dt = bench_now() - t0;
        if (st == 200 && b.p) {
            const char *u = strstr(b.p, "\"completion_tokens\":");
            if (u) *out_tokens = atol(u + 20);
            if (i > 0) v[n++] = dt;
        }
        free(b.p);
    }
    bench_close(&c);
    double m = bench_median(v, n);
    free(v);
    free(body);
    free(p);
    return n ? m : -1;
}

/* Median latency of the same request submitted to an engine in this process. */
static double inproc_latency(srv_runtime *rt, int prompt_len, int max_tokens, int reps)
{
    int32_t *p = overhead_prompt(prompt_len);
    eng_request r;
    int32_t *toks = malloc((size_t)max_tokens * sizeof *toks);
    float *lps = malloc((size_t)max_tokens * sizeof *lps);
    double *v = calloc((size_t)reps, sizeof *v);
    if (!toks || !lps || !v) srv_die("out of memory");
    int n = 0;
    for (int i = 0; i < reps + 1; i++) {
        memset(&r, 0, sizeof r);
        r.prompt = p;
        r.n_prompt = prompt_len;
        r.max_tokens = max_tokens;
        r.ignore_eos = 1;
        r.sp.top_p = 1.0f;
        r.out_tokens = toks;
        r.out_logprobs = lps;
        char err[256];
        int busy;
        double t0 = bench_now();
        if (eng_submit(rt->e, &r, &busy, err, sizeof err) != 0) srv_die("in-process request: %s", err);
        eng_run_until_idle(rt->e);
        if (i > 0) v[n++] = bench_now() - t0;
    }
    double m = bench_median(v, n);
    free(v);
    free(toks);
    free(lps);
    free(p);
    return m;
}

/* ---- own server ------------------------------------------------------------------------------------------ */

/* ---- the command ------------------------------------------------------------------------------------------- */

static const char help[] =
    "usage: graphswap bench serve (--url http://127.0.0.1:PORT | --model DIR) [options]\n"
    "\n"
    "Drives an OpenAI-compatible server over loopback (plain sockets, streaming completions, greedy,\n"
    "ignore_eos, distinct token-id prompts) and prints requests/s, tokens/s, time to first token\n"
    "(mean / p50 / p99) and end-to-end latency per concurrency level, then the HTTP overhead of one\n"
    "request against the same generation in-process.\n"
    "\n"
    "  --url URL              a running server (http://host:port)\n"
    "  --model DIR            start `graphswap serve --model DIR --port 0` for the run; also the\n"
    "                         model of the in-process comparison (default: /v1/models \"root\")\n"
    "  --requests N           requests per concurrency level (default 64)\n"
    "  --max-tokens N         tokens per request (default 64)\n"
    "  --prompt-len N         prompt tokens per request (default 32)\n"
    "  --concurrency LIST     comma-separated client counts (default 1,4,16,64)\n"
    "  --reps N               repetitions of the overhead measurement (default 20)\n"
    "  --threads N            engine threads for the started server and the in-process runtime\n"
    "  --api-key KEY          bearer token for the server\n"
    "  --no-inprocess         skip the in-process comparison\n";

int srv_bench_serve(int argc, char **argv)
{
    const char *url = NULL, *model = NULL, *conc_list = "1,4,16,64", *threads = NULL, *api_key = NULL;
    int requests = 64, max_tokens = 64, prompt_len = 32, reps = 20, no_inproc = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            return 0;
        }
        if (srv_arg_str(argc, argv, &i, "--url", &url) || srv_arg_str(argc, argv, &i, "--model", &model) ||
            srv_arg_int(argc, argv, &i, "--requests", 1, 1 << 20, &requests) ||
            srv_arg_int(argc, argv, &i, "--max-tokens", 1, 1 << 20, &max_tokens) ||
            srv_arg_int(argc, argv, &i, "--prompt-len", 1, 1 << 20, &prompt_len) ||
            srv_arg_str(argc, argv, &i, "--concurrency", &conc_list) ||
            srv_arg_int(argc, argv, &i, "--reps", 1, 10000, &reps) ||
            srv_arg_str(argc, argv, &i, "--threads", &threads) || srv_arg_str(argc, argv, &i, "--api-key", &api_key) ||
            srv_arg_flag(argc, argv, &i, "--no-inprocess", &no_inproc))
            continue;
        srv_die_usage("bench serve", argv[i]);
    }
    if (!url && !model) srv_die("give --url of a running server or --model DIR to start one");
    bench_preflight("serve", "streaming requests over loopback HTTP at each concurrency level (req/s, tok/s, TTFT, "
                             "inter-token latency) and the HTTP overhead against the engine in the process");
    signal(SIGPIPE, SIG_IGN);
    bs_target t = {.api_key = api_key};
    bench_child child = {.pid = -1};
    if (url) {
        const char *h = strncmp(url, "http://", 7) == 0 ? url + 7 : url;
        const char *colon = strchr(h, ':'), *slash = strchr(h, '/');
        size_t hl = colon ? (size_t)(colon - h) : slash ? (size_t)(slash - h) : strlen(h);
        if (hl == 0 || hl >= sizeof t.host) srv_die("--url: cannot parse %s", url);
        memcpy(t.host, h, hl);
        t.host[hl] = 0;
        t.port = colon ? atoi(colon + 1) : 80;
    } else {
        const char *extra[] = {threads ? "--threads" : NULL, threads, NULL};
        if (bench_start_server(model, extra, 300, &child) != 0)
            srv_die("could not start graphswap serve --model %s", model);
        snprintf(t.host, sizeof t.host, "127.0.0.1");
        t.port = child.port;
    }

    /* the model folder for the in-process comparison: --model, or /v1/models "root" */
    char root[4096] = "";
    {
        bench_conn c = {.fd = -1};
        bs_buf b = {0};
        int st = bs_request(&t, &c, "GET", "/v1/models", NULL, bs_collect, &b);
        bench_close(&c);
        if (st != 200) {
            bench_stop_server(&child);
            srv_die("GET /v1/models on %s:%d failed (status %d)", t.host, t.port, st);
        }
        cJSON *o = mdl_json_parse(b.p, b.p ? b.n : 0, MDL_JSON_MAX_DEPTH, 0, NULL, NULL, 0);
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "data"), 0),
                                                          "root");
        if (cJSON_IsString(r)) snprintf(root, sizeof root, "%s", r->valuestring);
        cJSON_Delete(o);
        free(b.p);
    }
    if (model) snprintf(root, sizeof root, "%s", model);

    printf("graphswap bench serve: http://%s:%d  model %s\n", t.host, t.port, root[0] ? root : "?");
    printf("%d requests per level, prompt %d tokens, max_tokens %d (greedy, ignore_eos, streaming)\n\n", requests,
           prompt_len, max_tokens);
    printf("%5s %11s %9s %10s %10s %9s %9s %10s %9s\n", "conc", "ok", "req/s", "tok/s", "ttft mean", "ttft p50",
           "ttft p99", "e2e mean", "e2e p99");
    printf("%5s %11s %9s %10s %10s %9s %9s %10s %9s\n", "", "", "", "", "ms", "ms", "ms", "ms", "ms");
    int level = 0;
    for (const char *p = conc_list; *p;) {
        char *end;
        long conc = strtol(p, &end, 10);
        if (end == p || conc < 1 || conc > 4096) srv_die("--concurrency: bad list %s", conc_list);
        run_level(&t, (int)conc, requests, prompt_len, max_tokens, level++);
        p = *end == ',' ? end + 1 : end;
    }

    long tok_http = 0, tok_1 = 0;
    double h_full = http_latency(&t, prompt_len, max_tokens, reps, &tok_http);
    double h_one = http_latency(&t, prompt_len, 1, reps, &tok_1);
    bench_stop_server(&child);
    printf("\nHTTP overhead (non-streaming, median of %d):\n", reps);
    if (no_inproc || !root[0]) {
        printf("  max_tokens %d: HTTP %.2f ms; max_tokens 1: HTTP %.2f ms (no in-process comparison)\n", max_tokens,
               h_full * 1e3, h_one * 1e3);
        return 0;
    }
    srv_runtime_opts ro;
    srv_runtime_defaults(&ro);
    ro.model_dir = root;
    if (threads) ro.threads = atoi(threads);
    srv_runtime rt;
    char err[1024];
    if (srv_runtime_open(&rt, &ro, err, sizeof err) != 0) {
        printf("  in-process comparison skipped: %s\n", err);
        return 0;
    }
    double p_full = inproc_latency(&rt, prompt_len, max_tokens, reps);
    double p_one = inproc_latency(&rt, prompt_len, 1, reps);
    srv_runtime_close(&rt);
    printf("  %-16s %12s %12s %12s\n", "", "HTTP ms", "in-proc ms", "overhead ms");
    printf("  max_tokens %-5d %12.3f %12.3f %12.3f\n", max_tokens, h_full * 1e3, p_full * 1e3, (h_full - p_full) * 1e3);
    printf("  max_tokens %-5d %12.3f %12.3f %12.3f\n", 1, h_one * 1e3, p_one * 1e3, (h_one - p_one) * 1e3);
    if (tok_http != max_tokens) printf("  (note: the HTTP run generated %ld tokens)\n", tok_http);
    if (h_full < p_full || h_one < p_one)
        printf("  (a negative overhead is below the noise of this machine%s)\n",
               url ? "; with --url the server's idle threads share the cores with the in-process run" : "");
    return 0;
}
