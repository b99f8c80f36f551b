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
#include <sys/resource.h>
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
        while (!s->inbox_head && !s->cmd_head && !work && !s->stopping) pthread_cond_wait(&s->inbox_cv, &s->mu);
        srv_job *list = s->inbox_head;
        s->inbox_head = s->inbox_tail = NULL;
        const int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        srv_jobs_dispatch(s, list, stopping);
        draining = srv_cmds_run(s, stopping);
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
    "  --http-threads N       HTTP handler threads = concurrent connections (default 512)\n"
    "  --max-body-bytes N     largest request body (default 8388608), else 413\n"
    "  --request-timeout S    seconds per request, reading included (default 600): a request still\n"
    "                         running is cancelled (504, or an error event on a stream)\n"
    "  --keep-alive-ms N      idle keep-alive connection timeout (default 5000)\n"
    "  --io-timeout S         a client that sends no byte for S seconds while its request line,\n"
    "                         headers or body are read, or takes none of its response, is dropped\n"
    "                         (a stalled body gets 408; default 10, at most --request-timeout)\n"
    "  --queue-cap N          requests waiting for a sequence slot (default 4096), else 503\n"
    "  --max-batch N          sequences (prompts x n) per request (default 256)\n"
    "  --generation-config auto|vllm  auto (default, as vLLM): the model's generation_config.json\n"
    "                         temperature / top_p / top_k / min_p are the defaults of requests that\n"
    "                         do not set them and its max_new_tokens caps max_tokens; a\n"
    "                         repetition_penalty != 1 there cannot be honoured and stops start-up.\n"
    "                         vllm: OpenAI's defaults. Its eos_token_id ids stop generation either way.\n"
    "\n"
    "Weight updates (POST /v1/weights/{begin,bucket,finish,abort,load}, GET /v1/weights,\n"
    "GET /v1/weights/checksums, and the vLLM / SGLang routes; see README):\n"
    "  --admin-key KEY        require 'Authorization: Bearer KEY' on the weight routes (also\n"
    "                         GRAPHSWAP_ADMIN_KEY); without one they are disabled on a non-loopback --host\n"
    "  --weights-root DIR     folder disk loads (/v1/weights/load) must lie under (default: disabled)\n"
    "  --max-bucket-bytes N   largest HTTP bucket (default 2147483648)\n"
    "  --update-bucket-bytes N  bucket size of disk loads (default 536870912)\n"
    "  --drain-timeout S      seconds a \"wait\" pause lets running requests finish (default 60)\n";

int srv_cmd_serve(int argc, char **argv)
{
    srv_runtime_opts ro;
    srv_runtime_defaults(&ro);
    const char *host = "127.0.0.1", *api_key = getenv("GRAPHSWAP_API_KEY"), *served = NULL;
    int port = 8080, http_threads = 512, max_body = 8 << 20, timeout_s = 600, keep_alive_ms = 5000, io_s = 10;
    int queue_cap = ro.ecfg.queue_cap, max_batch = 256, drain_s = 60;
    const char *admin_key = getenv("GRAPHSWAP_ADMIN_KEY"), *weights_root = NULL, *gen_cfg = "auto";
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
            srv_arg_int(argc, argv, &i, "--io-timeout", 1, 1 << 24, &io_s) ||
            srv_arg_int(argc, argv, &i, "--queue-cap", 1, 1 << 20, &queue_cap) ||
            srv_arg_int(argc, argv, &i, "--max-batch", 1, 1 << 16, &max_batch) ||
            srv_arg_str(argc, argv, &i, "--admin-key", &admin_key) ||
            srv_arg_str(argc, argv, &i, "--weights-root", &weights_root) ||
            srv_arg_u64(argc, argv, &i, "--max-bucket-bytes", &max_bucket) ||
            srv_arg_u64(argc, argv, &i, "--update-bucket-bytes", &update_bucket) ||
            srv_arg_int(argc, argv, &i, "--drain-timeout", 0, 1 << 20, &drain_s) ||
            srv_arg_str(argc, argv, &i, "--generation-config", &gen_cfg))
            continue;
        srv_die_usage("serve", argv[i]);
    }
    if (strcmp(gen_cfg, "auto") != 0 && strcmp(gen_cfg, "vllm") != 0)
        srv_die("--generation-config must be auto or vllm");
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
    if (strcmp(gen_cfg, "auto") == 0) {
        s->gen = mc->gen;
        /* a default that graphswap cannot apply would make every request differ from vLLM's answer */
        if (s->gen.set & MDL_GEN_REPETITION_PENALTY)
            srv_die("%s/generation_config.json: repetition_penalty %g is not supported (only 1); start with "
                    "--generation-config vllm to use OpenAI's defaults instead of the file's",
                    ro.model_dir, s->gen.repetition_penalty);
        if (s->gen.set) {
            char line[256];
            size_t n = 0;
            const mdl_gen_defaults *gd = &s->gen;
            if (gd->set & MDL_GEN_TEMPERATURE)
                n += (size_t)snprintf(line + n, sizeof line - n, " temperature=%g", gd->temperature);
            if (gd->set & MDL_GEN_TOP_P) n += (size_t)snprintf(line + n, sizeof line - n, " top_p=%g", gd->top_p);
            if (gd->set & MDL_GEN_TOP_K) n += (size_t)snprintf(line + n, sizeof line - n, " top_k=%d", gd->top_k);
            if (gd->set & MDL_GEN_MIN_P) n += (size_t)snprintf(line + n, sizeof line - n, " min_p=%g", gd->min_p);
            if (gd->set & MDL_GEN_MAX_NEW_TOKENS)
                snprintf(line + n, sizeof line - n, " max_new_tokens=%d", gd->max_new_tokens);
            fprintf(stderr, "graphswap: request defaults from generation_config.json:%s\n", line);
        }
    }
    s->api_key = api_key;
    s->max_body = (size_t)max_body;
    s->request_timeout = timeout_s;
    s->io_timeout = io_s < timeout_s ? io_s : timeout_s;
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
    srv_weights_publish(s);

    srv_route_add(s, "GET", "/health", srv_route_health, 0);
    srv_route_add(s, "GET", "/metrics", srv_route_metrics, 0);
    srv_route_add(s, "GET", "/v1/models", srv_route_models, 1);
    srv_route_add(s, "GET", "/v1/models/*", srv_route_model_one, 1);
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
    /* civetweb's request_timeout_ms bounds each silent wait on a socket (request line and headers,
     * each body read, each write), not a whole request: the I/O timeout, so that a client sending a
     * partial header holds its worker for seconds, not for --request-timeout (slowloris). The
     * generation deadline (--request-timeout) is enforced by the handlers. */
    snprintf(rto, sizeof rto, "%lld", (long long)(s->io_timeout * 1000));
    snprintf(kat, sizeof kat, "%d", keep_alive_ms);
    const char *opts[] = {"listening_ports", ports, "num_threads", nthreads, "enable_keep_alive", "yes",
                          "keep_alive_timeout_ms", kat, "request_timeout_ms", rto, "tcp_nodelay", "1", NULL};
    /* one descriptor per connection: let --http-threads connections exist (the soft limit is often
     * 1024, below the hard one) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
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
