/* server/serve.c — `graphswap serve`: the OpenAI-compatible HTTP server (civetweb) over the engine.
 *
 * Threads (see srv.h): civetweb handler threads validate requests and wait on their job; one engine
 * thread owns the runtime, drains the inbox into eng_submit and steps while work exists; the main
 * thread waits for SIGINT / SIGTERM.
 *
 * Shutdown, in this order, so that every step is bounded and nothing leaks:
 *   1. `stopping` is set under the inbox mutex: new generation requests get 503 from then on, and
 *      nothing can enter the inbox any more.
 *   2. The engine thread finishes its current step, rejects what is still in the inbox, aborts every
 *      running and waiting request (finish "abort": non-streaming clients get their partial result,
 *      streams get a final chunk with finish_reason "abort" and [DONE]) and exits; it is joined.
 *   3. Handlers still writing (their jobs are settled) get up to 10 s to finish, then mg_stop stops
 *      accepting and joins the handler threads.
 *   4. Tokenizer, runtime and state are freed.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/srv.h"

static volatile sig_atomic_t g_signal;
static void on_signal(int sig) { g_signal = sig; }

/* ---- engine thread ------------------------------------------------------------------------------- */

static void *engine_main(void *arg)
{
    srv_state *s = arg;
    eng_engine *e = s->rt.e;
    int draining = 0;
    for (;;) {
        /* no step while a weight session is open or generation is paused (I7), unless a "wait"
         * command is draining the running requests */
        const int frozen = srv_engine_frozen(s) && !draining;
        const int work = !frozen && eng_num_running(e) + eng_num_waiting(e) > 0;
        pthread_mutex_lock(&s->mu);
        while (!s->inbox_head && !s->cmd_head && !work && !s->stopping) {
            /* an open weight session wakes the thread for its --weight-session-timeout (checked at
             * least once a second, so an upload in progress is seen as activity) */
            const double due = srv_weights_session_due(s);
            if (due == -1) {
                pthread_cond_wait(&s->inbox_cv, &s->mu);
                continue;
            }
            if (due <= 0) break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts); /* the condition variable's clock */
            const double w = due < 1.0 ? due : 1.0;
            ts.tv_sec += (time_t)w;
            ts.tv_nsec += (long)((w - (double)(time_t)w) * 1e9);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&s->inbox_cv, &s->mu, &ts);
        }
        srv_job *list = s->inbox_head;
        s->inbox_head = s->inbox_tail = NULL;
        const int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        srv_jobs_dispatch(s, list, stopping);
        draining = srv_cmds_run(s, stopping);
        if (!stopping) srv_weights_expire(s);
        if (stopping) {
            eng_abort_all(e);
            srv_metrics_publish(&s->met, e);
            return NULL;
        }
        if ((draining || !srv_engine_frozen(s)) && eng_num_running(e) + eng_num_waiting(e) > 0) eng_step(e);
        srv_metrics_publish(&s->met, e); /* (the weight state changes only in commands: published there) */
    }
}

/* civetweb's own errors (a port in use, a bad option) go to stderr */
static int log_civetweb(const struct mg_connection *c, const char *msg)
{
    (void)c;
    fprintf(stderr, "graphswap: http: %s\n", msg);
    return 1;
}

/* ---- the command ------------------------------------------------------------------------------------- */

static const char help[] =
    "usage: graphswap serve --model DIR [--host 127.0.0.1] [--port 8080] [options]\n"
    "\n"
    "OpenAI-compatible HTTP server: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,\n"
    "POST /tokenize, POST /detokenize, GET /health, GET /metrics (Prometheus).\n"
    "\n"
    "  --host ADDR            listen address (default 127.0.0.1)\n"
    "  --port N               listen port (default 8080; 0 = any free port, printed at start)\n"
    "  --served-model-name S  the model name in responses and /v1/models (default: --model)\n"
    "  --api-key KEY          require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize\n"
    "                         (also GRAPHSWAP_API_KEY); /health and /metrics stay public\n"
    "  --http-threads N       HTTP handler threads = concurrent connections (default 128)\n"
    "  --max-body-bytes N     largest request body (default 8388608), else 413\n"
    "  --request-timeout S    seconds per request, reading included (default 600): a request still\n"
    "                         running is cancelled (504, or an error event on a stream)\n"
    "  --keep-alive-ms N      idle keep-alive connection timeout (default 5000)\n"
    "  --queue-cap N          requests waiting for a sequence slot (default 4096), else 503\n"
    "  --max-batch N          sequences (prompts x n) per request (default 256)\n"
    "\n"
    "Weight updates (POST /v1/weights/{begin,bucket,finish,abort,load}, GET /v1/weights,\n"
    "GET /v1/weights/checksums, and the vLLM / SGLang routes; see README):\n"
    "  --admin-key KEY        require 'Authorization: Bearer KEY' on the weight routes (also\n"
    "                         GRAPHSWAP_ADMIN_KEY); without one they are disabled on a non-loopback --host\n"
    "  --weights-root DIR     folder disk loads (/v1/weights/load) must lie under (default: disabled)\n"
    "  --max-bucket-bytes N   largest HTTP bucket (default 2147483648)\n"
    "  --update-bucket-bytes N  bucket size of disk loads (default 536870912)\n"
  "  --drain-timeout S      seconds a \"wait\" pause lets running requests finish (default 60)\n"
    "  --weight-session-timeout S  abort an open weight session after S seconds without a bucket or\n"
    "                         command, as /v1/weights/abort would (default 300; 0 = never)\n";

int srv_cmd_serve(int argc, char **argv)
{
    srv_runtime_opts ro;
    srv_runtime_defaults(&ro);
    const char *host = "127.0.0.1", *api_key = getenv("GRAPHSWAP_API_KEY"), *served = NULL;
    int port = 8080, http_threads = 128, max_body = 8 << 20, timeout_s = 600, keep_alive_ms = 5000;
    int queue_cap = ro.ecfg.queue_cap, max_batch = 256, drain_s = 60, wsess_s = 300;
    const char *admin_key = getenv("GRAPHSWAP_ADMIN_KEY"), *weights_root = NULL;
    uint64_t max_bucket = (uint64_t)2 << 30, update_bucket = (uint64_t)512 << 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            fputs(srv_runtime_help, stdout);
            return 0;
        }
        if (srv_runtime_arg(argc, argv, &i, &ro) || srv_arg_str(argc, argv, &i, "--host", &host) ||
            srv_arg_int(argc, argv, &i, "--port", 0, 65535, &port) ||
            srv_arg_str(argc, argv, &i, "--served-model-name", &served) ||
            srv_arg_str(argc, argv, &i, "--api-key", &api_key) ||
            srv_arg_int(argc, argv, &i, "--http-threads", 1, 4096, &http_threads) ||
            srv_arg_int(argc, argv, &i, "--max-body-bytes", 1024, 1 << 30, &max_body) ||
            srv_arg_int(argc, argv, &i, "--request-timeout", 1, 1 << 24, &timeout_s) ||
            srv_arg_int(argc, argv, &i, "--keep-alive-ms", 0, 1 << 24, &keep_alive_ms) ||
            srv_arg_int(argc, argv, &i, "--queue-cap", 1, 1 << 20, &queue_cap) ||
            srv_arg_int(argc, argv, &i, "--max-batch", 1, 1 << 16, &max_batch) ||
            srv_arg_str(argc, argv, &i, "--admin-key", &admin_key) ||
            srv_arg_str(argc, argv, &i, "--weights-root", &weights_root) ||
            srv_arg_u64(argc, argv, &i, "--max-bucket-bytes", &max_bucket) ||
            srv_arg_u64(argc, argv, &i, "--update-bucket-bytes", &update_bucket) ||
            srv_arg_int(argc, argv, &i, "--drain-timeout", 0, 1 << 20, &drain_s) ||
            srv_arg_int(argc, argv, &i, "--weight-session-timeout", 0, 1 << 24, &wsess_s))
            continue;
        srv_die_usage("serve", argv[i]);
    }
    if (api_key && !api_key[0]) api_key = NULL;
    ro.ecfg.queue_cap = queue_cap;

    srv_state *s = calloc(1, sizeof *s);
    if (!s) srv_die("out of memory");
    char err[1024];
    if (srv_runtime_open(&s->rt, &ro, err, sizeof err) != 0) srv_die("%s", err);
    char tokpath[4200];
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", ro.model_dir);
    if (access(tokpath, R_OK) == 0) {
        s->tok = mdl_tok_load(ro.model_dir, err, sizeof err);
        if (!s->tok) srv_die("%s", err);
        s->chat = mdl_tok_chat_family(s->tok);
    }
    /* immutable copies, so handler threads never read engine or model state */
    const mdl_config *mc = &eng_model(s->rt.e)->cfg;
    const eng_config *ec = eng_get_config(s->rt.e);
    s->model_dir = ro.model_dir;
    s->model_name = served ? served : ro.model_dir;
    s->vocab = mc->vocab;
    s->max_model_len = ec->max_model_len;
    s->kv_tokens = eng_kv_blocks_total(s->rt.e) * ec->block_size;
    s->n_eos = mc->n_eos;
    memcpy(s->eos, mc->eos, sizeof s->eos);
    s->api_key = api_key;
    s->max_body = (size_t)max_body;
    s->request_timeout = timeout_s;
    s->max_choices = max_batch;
    s->t_start = srv_wall();
    s->seed_base = (uint64_t)(srv_wall() * 1e9) ^ ((uint64_t)getpid() << 32);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->inbox_cv, NULL);
    srv_metrics_init(&s->met);
    srv_metrics_publish(&s->met, s->rt.e);
    srv_weights_init(s);
    if (admin_key && !admin_key[0]) admin_key = NULL;
    s->admin_key = admin_key;
    /* weight routes on a reachable address need a key */
    s->admin_disabled = !admin_key && strcmp(host, "127.0.0.1") != 0 && strcmp(host, "localhost") != 0 &&
                        strcmp(host, "::1") != 0 && strncmp(host, "127.", 4) != 0;
    if (weights_root && !(s->weights_root = realpath(weights_root, NULL))) srv_die("--weights-root %s: %s", weights_root, strerror(errno));
    s->max_bucket = (size_t)max_bucket;
    s->update_bucket = (size_t)update_bucket;
    s->drain_timeout = drain_s;
    s->session_timeout = wsess_s;
    srv_weights_publish(s);

    srv_route_add(s, "GET", "/health", srv_route_health, 0);
    srv_route_add(s, "GET", "/metrics", srv_route_metrics, 0);
    srv_route_add(s, "GET", "/v1/models", srv_route_models, 1);
    srv_route_add(s, "POST", "/v1/completions", srv_route_completions, 1);
    srv_route_add(s, "POST", "/v1/chat/completions", srv_route_chat, 1);
    srv_route_add(s, "POST", "/tokenize", srv_route_tokenize, 1);
    srv_route_add(s, "POST", "/detokenize", srv_route_detokenize, 1);
    srv_weights_routes(s);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    pthread_t eng_thread;
    if (pthread_create(&eng_thread, NULL, engine_main, s) != 0) srv_die("cannot start the engine thread");

    char ports[300], nthreads[16], rto[32], kat[32];
    snprintf(ports, sizeof ports, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    snprintf(nthreads, sizeof nthreads, "%d", http_threads);
    snprintf(rto, sizeof rto, "%lld", (long long)timeout_s * 1000);
    snprintf(kat, sizeof kat, "%d", keep_alive_ms);
    const char *opts[] = {"listening_ports", ports, "num_threads", nthreads, "enable_keep_alive", "yes",
                          "keep_alive_timeout_ms", kat, "request_timeout_ms", rto, "tcp_nodelay", "1", NULL};
    mg_init_library(0);
    struct mg_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.log_message = log_civetweb;
    struct mg_context *ctx = mg_start(&cb, s, opts);
    if (!ctx) srv_die("cannot listen on %s", ports);
    mg_set_request_handler(ctx, "/", srv_dispatch, s);
    struct mg_server_port sp[4];
    int nports = mg_get_server_ports(ctx, 4, sp);
    int bound = nports > 0 ? sp[0].port : port;
    fprintf(stderr, "graphswap: serving %s as \"%s\" on http://%s%s%s:%d%s\n", ro.model_dir, s->model_name,
            strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", bound, api_key ? " (API key required)" : "");
    fflush(stderr);

    while (!g_signal) usleep(20000);
    fprintf(stderr, "graphswap: signal %d, shutting down\n", (int)g_signal);
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->inbox_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(eng_thread, NULL);
    /* every job is settled now; let the handlers write their last bytes (mg_stop makes civetweb
     * drop further writes), bounded in case a client does not read */
    for (int i = 0; i < 500 && atomic_load(&s->active) > 0; i++) usleep(20000);
    mg_stop(ctx);
    mg_exit_library();
    mdl_tok_free(s->tok);
    srv_runtime_close(&s->rt);
    srv_metrics_destroy(&s->met);
    srv_weights_destroy(s);
    pthread_cond_destroy(&s->inbox_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    fprintf(stderr, "graphswap: stopped\n");
    return 0;
}
