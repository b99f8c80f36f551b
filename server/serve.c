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
 *      A --weights-from pull still under way was told to stop before step 1 and is joined here
 *      (each command or closure it waits for has been answered 503; a read from a silent source
 *      ends within civetweb's 30 s).
 *   3. Handlers still writing (their jobs are settled) get up to 10 s to finish, then mg_stop stops
 *      accepting and joins the handler threads.
 *   4. Tokenizer, runtime and state are freed.
 *
 * Start-up (srv_server_start), in this order: options and the log format; srv_runtime_open
 * (server/core/cli.c: config.json, the backend, the target's cold load, the drafter's, then
 * eng_create_spec: every plan-visible buffer, plan capture, the guard's record); the tokenizer;
 * immutable copies for the handler threads; locks, metrics and the published weight state; the
 * routes; the engine thread (engine_main); with --weights-from the pull's thread (generation refused
 * until it succeeded; weights/pull.c); last the civetweb listener (mg_start) and the
 * "serving ... on URL" line. A signal before that line defers the shutdown to the end of start-up.
 *
 * The engine thread (engine_main), one iteration:
 *
 *     +-> under mu: wait on inbox_cv while no job, command or closure is queued, nothing can step and
 *     |   not stopping (timed: the end of an unlogged stats window; with a session open at least once
 *     |   a second, for --weight-session-timeout); take the whole inbox list, read `stopping`
 *     |   srv_jobs_dispatch   each job's choices -> eng_submit (stopping: the job is rejected, 503)
 *     |   srv_cmds_run        admin commands, in arrival order (weights/weights_api.c); 1 while a
 *     |                       "wait" drain holds the head command: steps go on though frozen
 *     |   srv_closures_run    srv_engine_call closures (sleep / wake, ...), in arrival order
 *     |   srv_weights_expire  an open session idle past --weight-session-timeout is aborted
 *     |   stopping?           eng_abort_all, publish metrics, leave the thread
 *     |   eng_step            once, if work exists and the engine is not frozen (a weight session
 *     |                       open or generation paused, I7), or a drain is in progress
 *     +-- publish metrics; the throughput line
 *
 * Handler threads hand work over through three queues, all under srv_state.mu, each push signalling
 * inbox_cv, each refused (503 / -1) once `stopping` is set:
 *   jobs      srv_job_submit -> inbox; the engine's callbacks publish under job->mu; the handler
 *             waits on job->cv until the job settled (server/core/jobs.c, srv.h)
 *   commands  srv_cmd_submit (waits for c->done) or srv_cmd_post (detached) -> cmd_head
 *   closures  srv_engine_call -> clo_head, waits until the closure ran (server/core/closures.c)
 * So within one iteration jobs are submitted before commands run, and commands before closures.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include "server/core/srv.h"
#include "server/dialects/dialects.h"
#include "server/openai/openai.h"
#include "server/server.h"
#include "server/weights/weights.h"

static volatile sig_atomic_t g_signal, g_started;
/* SIGINT / SIGTERM: a clean shutdown once the server runs; during start-up (a long model load) the
 * first signal defers the shutdown to the end of the start, a second one exits at once. */
static void on_signal(int sig)
{
    if (g_signal && !g_started) _exit(128 + sig);
    g_signal = sig;
}

/* ---- engine thread ------------------------------------------------------------------------------- */

/* The periodic throughput line (--log-interval), as vLLM's "Avg prompt throughput" line: counter
 * deltas over the window since the last line. Engine thread only; no allocation. */
typedef struct {
    double interval;  /* seconds; 0: off */
    double t_last;    /* start of the window (monotonic) */
    uint64_t prompt, gen, drafts, draft_tokens, accepted;
    int has_drafter;
} stats_log;

/* 1 when the window holds something worth a line: tokens moved, or requests run or wait. */
static int stats_pending(const stats_log *sl, const eng_engine *e)
{
    const eng_stats *st = eng_get_stats(e);
    return st->prompt_tokens != sl->prompt || st->generated_tokens != sl->gen || eng_num_running(e) > 0 ||
           eng_num_waiting(e) > 0;
}

static void stats_reset(stats_log *sl, const eng_engine *e, double now)
{
    const eng_stats *st = eng_get_stats(e);
    sl->t_last = now;
    sl->prompt = st->prompt_tokens;
    sl->gen = st->generated_tokens;
    sl->drafts = st->spec_drafts;
    sl->draft_tokens = st->spec_draft_tokens;
    sl->accepted = st->spec_accepted;
}

static void stats_tick(stats_log *sl, const eng_engine *e, double now)
{
    if (sl->interval <= 0 || now - sl->t_last < sl->interval) return;
    if (!stats_pending(sl, e)) {
        stats_reset(sl, e, now);
        return;
    }
    const eng_stats *st = eng_get_stats(e);
    const double dt = now - sl->t_last;
    const double ptps = (double)(st->prompt_tokens - sl->prompt) / dt, gtps = (double)(st->generated_tokens - sl->gen) / dt;
    const int kv_total = eng_kv_blocks_total(e), kv_used = eng_kv_blocks_in_use(e);
    const double kv_pct = kv_total ? 100.0 * kv_used / kv_total : 0;
    srv_logline l;
    uint64_t dd = 0;
    double rate = 0, mal = 0;
    char spec[96] = "";
    if (sl->has_drafter) {
        const uint64_t dtok = st->spec_draft_tokens - sl->draft_tokens, acc = st->spec_accepted - sl->accepted;
        dd = st->spec_drafts - sl->drafts;
        rate = dtok ? 100.0 * (double)acc / (double)dtok : 0;
        mal = dd ? 1.0 + (double)acc / (double)dd : 0;
        snprintf(spec, sizeof spec, ", spec acceptance %.1f%% (mean length %.2f)", rate, mal);
    }
    srv_log_begin(&l, "info", "stats", "prompt %.1f tok/s, generation %.1f tok/s, running %d, waiting %d, KV %.1f%%%s",
                  ptps, gtps, eng_num_running(e), eng_num_waiting(e), kv_pct, spec);
    srv_log_num(&l, "prompt_tok_s", ptps, 1);
    srv_log_num(&l, "gen_tok_s", gtps, 1);
    srv_log_int(&l, "running", eng_num_running(e));
    srv_log_int(&l, "waiting", eng_num_waiting(e));
    srv_log_num(&l, "kv_usage_pct", kv_pct, 1);
    if (sl->has_drafter) {
        srv_log_num(&l, "spec_acceptance_pct", rate, 1);
        srv_log_num(&l, "spec_mean_acceptance_length", mal, 2);
        srv_log_int(&l, "spec_drafts", (long long)dd);
    }
    srv_log_num(&l, "interval_s", dt, 2);
    srv_log_end(&l);
    stats_reset(sl, e, now);
}

/* A running server: state, engine thread, listener (srv_server_start / srv_server_stop). */
struct srv_server {
    srv_state *s;
    stats_log stats; /* the engine thread's throughput line (set before it starts) */
    pthread_t eng_thread;
    struct mg_context *ctx;
    char url[340];
};

static void *engine_main(void *arg)
{
    srv_server *sv = arg;
    srv_state *s = sv->s;
    eng_engine *e = s->rt.e;
    int draining = 0;
    stats_log *sl = &sv->stats;
    stats_reset(sl, e, srv_now());
    for (;;) {
        /* no step while a weight session is open or generation is paused (I7), unless a "wait"
         * command is draining the running requests */
        const int frozen = srv_engine_frozen(s) && !draining;
        const int work = !frozen && eng_num_running(e) + eng_num_waiting(e) > 0;
        /* Idle with an unlogged window: wake at its end so the last burst gets its line. Idle with
         * nothing to log: sleep until woken, and start a fresh window then (an idle hour must not
         * dilute the next line's rates). */
        const int log_wait = sl->interval > 0 && stats_pending(sl, e);
        pthread_mutex_lock(&s->mu);
        int slept = 0;
        while (!s->inbox_head && !s->cmd_head && !s->clo_head && !work && !s->stopping) {
            /* Wake at the earlier of: the end of an unlogged stats window; an open weight session's
             * --weight-session-timeout (checked at least once a second, so that an upload in
             * progress counts as activity). Neither: sleep until woken. */
            double wait = -1;
            if (log_wait) {
                wait = sl->t_last + sl->interval - srv_now();
                if (wait <= 0) break; /* the window ended while this iteration ran */
            }
            const double due = srv_weights_session_due(s);
            if (due != -1) {
                if (due <= 0) break;
                const double d = due < 1.0 ? due : 1.0;
                if (wait < 0 || d < wait) wait = d;
            }
            if (!log_wait) slept = 1;
            if (wait < 0) {
                pthread_cond_wait(&s->inbox_cv, &s->mu);
                continue;
            }
            struct timespec ts = srv_timespec_at(srv_now() + wait);
            (void)pthread_cond_timedwait(&s->inbox_cv, &s->mu, &ts); /* woken or timed out: look again */
        }
        srv_job *list = s->inbox_head;
        s->inbox_head = s->inbox_tail = NULL;
        /* (`stopping` read with the list under one lock: nothing can be pushed after it was set) */
        const int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        srv_jobs_dispatch(s, list, stopping);
        draining = srv_cmds_run(s, stopping);
        srv_closures_run(s, stopping);
        if (!stopping) srv_weights_expire(s);
        if (stopping) {
            eng_abort_all(e);
            srv_metrics_publish(&s->met, e);
            return NULL;
        }
        if (slept) stats_reset(sl, e, srv_now());
        /* I7: looked at after the commands ran: a begin taken in this iteration already freezes it */
        if ((draining || !srv_engine_frozen(s)) && eng_num_running(e) + eng_num_waiting(e) > 0) eng_step(e);
        srv_metrics_publish(&s->met, e); /* (the weight state changes only in commands: published there) */
        stats_tick(sl, e, srv_now());
    }
}

/* civetweb's own errors (a port in use, a bad option) go to stderr */
static int log_civetweb(const struct mg_connection *c, const char *msg)
{
    (void)c;
    srv_logf("error", "http", "%s", msg);
    return 1;
}

static long long param_count(const mdl_model *m)
{
    long long n = 0;
    for (int i = 0; i < m->n_params; i++) n += (long long)m->params[i].rows * (long long)m->params[i].cols;
    return n;
}

static int is_loopback(const char *host)
{
    return strcmp(host, "127.0.0.1") == 0 || strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0 ||
           strncmp(host, "127.", 4) == 0;
}

/* A model's FP8 projections for the start-up line: the scale scheme and where the codes came from
 * ("fp8 128x128 blocks (online)", "fp8 per channel (compressed-tensors)"); NULL when not FP8. */
static const char *quant_str(const mdl_config *mc, char *out, size_t cap)
{
    if (!mc->fp8) return NULL;
    char scheme[32];
    if (mc->fp8_scheme == MDL_FP8_BLOCK) snprintf(scheme, sizeof scheme, "%dx%d blocks", mc->fp8_b0, mc->fp8_b1);
    else snprintf(scheme, sizeof scheme, "per %s", mc->fp8_scheme == MDL_FP8_CHANNEL ? "channel" : "tensor");
    snprintf(out, cap, "fp8 %s%s", scheme,
             mc->fp8_lm_head  ? " (online, lm_head too)"
             : mc->fp8_online ? " (online)"
             : mc->fp8_ct     ? " (compressed-tensors)"
                              : "");
    return out;
}

/* The start-up summary, as vLLM and llama.cpp print one: what runs, on what, how big the cache is,
 * how long start-up took, and who may call what. Three lines (model, engine, routes). */
static void log_startup(const srv_state *s, const srv_runtime_opts *ro, const char *host)
{
    const mdl_model *m = eng_model(s->rt.e);
    const mdl_config *mc = &m->cfg;
    const eng_config *ec = eng_get_config(s->rt.e);
    const long long np = param_count(m);
    const char *dt = m->wdt == KERN_DT_BF16 ? "bf16" : "f32";
    srv_logline l;
    srv_log_begin(&l, "info", "model", "%s (%s): %.1fM parameters, %s, %d layers, vocab %d%s%s", s->model_dir,
                  mdl_arch_name(mc->arch), (double)np / 1e6, dt, mc->layers, mc->vocab,
                  s->rt.draft ? ", drafter " : "", s->rt.draft ? ro->draft_dir : "");
    srv_log_str(&l, "model", s->model_dir);
    srv_log_str(&l, "served_name", s->model_name);
    srv_log_str(&l, "arch", mdl_arch_name(mc->arch));
    srv_log_int(&l, "params", np);
    srv_log_str(&l, "dtype", dt);
    char quant[96], dquant[96];
    srv_log_str(&l, "quantization", quant_str(mc, quant, sizeof quant));
    srv_log_int(&l, "weight_bytes", (long long)m->weight_bytes);
    srv_log_num(&l, "load_ms", s->rt.load_ms, 1);
    srv_log_str(&l, "tokenizer", s->tok ? "yes" : "none");
    if (s->rt.draft) {
        srv_log_str(&l, "draft", ro->draft_dir);
        srv_log_str(&l, "draft_arch", mdl_arch_name(s->rt.draft->cfg.arch));
        srv_log_int(&l, "draft_params", param_count(s->rt.draft));
        srv_log_str(&l, "draft_quantization", quant_str(&s->rt.draft->cfg, dquant, sizeof dquant));
        srv_log_int(&l, "num_spec_tokens", ec->num_spec_tokens);
        srv_log_num(&l, "draft_load_ms", s->rt.draft_load_ms, 1);
    } else {
        srv_log_str(&l, "draft", NULL);
    }
    srv_log_end(&l);

    long threads = ro->threads > 0 ? ro->threads : sysconf(_SC_NPROCESSORS_ONLN);
    const int blocks = eng_kv_blocks_total(s->rt.e);
    const long long kv_bytes = 2LL * mc->layers * blocks * ec->block_size * mc->kv_heads * mc->head_dim * (long long)sizeof(float);
    const char *backend = ro->backend ? ro->backend : "cpu";
    srv_log_begin(&l, "info", "engine",
                  "%s backend, %ld threads, %d KV blocks x %d tokens (%.1f MiB), max %d seqs x %d tokens, %s %.0f ms",
                  backend, threads, blocks, ec->block_size, (double)kv_bytes / (1 << 20), ec->max_seqs, ec->max_model_len,
                  ec->use_plans ? "plans captured in" : "eager (no plans), engine ready in", s->rt.engine_ms);
    srv_log_str(&l, "backend", backend);
    srv_log_int(&l, "threads", threads);
    srv_log_int(&l, "kv_blocks", blocks);
    srv_log_int(&l, "block_size", ec->block_size);
    srv_log_int(&l, "kv_bytes", kv_bytes);
    srv_log_int(&l, "max_seqs", ec->max_seqs);
    srv_log_int(&l, "max_model_len", ec->max_model_len);
    srv_log_int(&l, "max_step_tokens", ec->max_step_tokens);
    srv_log_bool(&l, "plans", ec->use_plans);
    srv_log_bool(&l, "prefix_caching", ec->prefix_caching);
    srv_log_num(&l, "plan_capture_ms", s->rt.engine_ms, 1);
    srv_log_end(&l);

    const char *api = s->http.api_key ? "api-key" : "open";
    /* the rule of admin_authorized (http.c) */
    const int allow = s->http.n_admin_allow > 0;
    const char *admin = s->http.admin_disabled ? (allow ? "allow-list" : "disabled")
                        : s->http.admin_key    ? "admin-key"
                        : s->http.api_key      ? "api-key"
                        : allow           ? "allow-list"
                                          : "loopback-only";
    srv_log_begin(&l, "info", "routes",
                  "/v1/*, /tokenize, /detokenize: %s; weight routes: %s%s%s; /health, /metrics: open; disk loads: %s",
                  s->http.api_key ? "API key required" : "open (no --api-key)",
                  s->http.admin_disabled ? (allow ? "closed outside --admin-allow (non-loopback --host without --admin-key)"
                                             : "disabled (non-loopback --host without --admin-key)")
                  : s->http.admin_key    ? "admin key required"
                  : s->http.api_key      ? "API key required (no --admin-key)"
                  : allow           ? "closed outside --admin-allow (no key set)"
                                    : "no key, loopback listener only",
                  allow ? "; no key needed from --admin-allow " : "", allow ? s->http.admin_allow_spec : "",
                  s->weights_root ? s->weights_root : "off");
    srv_log_str(&l, "api", api);
    srv_log_str(&l, "admin", admin);
    srv_log_str(&l, "admin_allow", s->http.admin_allow_spec);
    srv_log_str(&l, "weights_root", s->weights_root);
    srv_log_str(&l, "host", host);
    srv_log_bool(&l, "loopback", is_loopback(host));
    srv_log_end(&l);
}

/* ---- the command ------------------------------------------------------------------------------------- */

/* A start-up error, in the log format (a JSON log shipper sees it too), then exit(1). */
static void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char *fmt, ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (srv_log_get_format() == SRV_LOG_JSON) {
        srv_logf("error", "serve", "%s", msg);
        exit(1);
    }
    srv_die("%s", msg);
}

static const char help[] =
    "usage: graphswap serve --model DIR [--host 127.0.0.1] [--port 8080] [options]\n"
    "\n"
    "OpenAI-compatible HTTP server: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,\n"
    "POST /tokenize, POST /detokenize, GET /health, GET /metrics (Prometheus).\n"
    "\n"
    "  --host ADDR            listen address (default 127.0.0.1)\n"
    "  --port N               listen port (default 8080; 0 = any free port, printed at start)\n"
    "  --served-model-name S  the model name in responses and /v1/models (default: --model)\n"
    "  --api-key KEY          require 'Authorization: Bearer KEY' on every route but /health and\n"
    "                         /metrics (also GRAPHSWAP_API_KEY; admin routes: see --admin-key)\n"
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
    "                         temperature / top_p / top_k / min_p / repetition_penalty are the\n"
    "                         defaults of requests that do not set them and its max_new_tokens\n"
    "                         caps max_tokens.\n"
    "                         vllm: OpenAI's defaults. Its eos_token_id ids stop generation either way.\n"
    "  --enable-prompt-tokens-details  usage.prompt_tokens_details {cached_tokens} on the OpenAI and\n"
    "                         vLLM routes when prompt tokens came from the prefix cache (as vLLM's flag)\n"
    "\n"
    "Weight updates (POST /v1/weights/{begin,bucket,finish,abort,load}, GET /v1/weights,\n"
    "GET /v1/weights/checksums, and the vLLM / SGLang routes; see docs/WEIGHTS.md):\n"
    "  --admin-key KEY        require 'Authorization: Bearer KEY' on the weight routes (also\n"
    "                         GRAPHSWAP_ADMIN_KEY); without one they take the --api-key when one is\n"
    "                         set, and are disabled on a non-loopback --host\n"
    "  --admin-allow CIDR[,CIDR...]  clients in these networks call the weight routes without a key\n"
    "                         (also GRAPHSWAP_ADMIN_ALLOW; IPv4 and IPv6, e.g. 10.0.0.0/8,fd00::/8).\n"
    "                         Default: none (keyless only on a loopback listener); given, it replaces\n"
    "                         that rule: a loopback client outside the list needs a key too\n"
    "  --weights-root DIR     folder disk loads (/v1/weights/load) must lie under (default: disabled)\n"
    "  --max-bucket-bytes N   largest HTTP bucket (default 2147483648)\n"
    "  --update-bucket-bytes N  bucket size of disk loads (default 536870912)\n"
    "  --drain-timeout S      seconds a \"wait\" pause lets running requests finish (default 60)\n"
    "  --weight-session-timeout S  abort an open weight session after S seconds without a bucket or\n"
    "                         command, as /v1/weights/abort would (default 300; 0 = never)\n"
    "  --weights-from URL     join with the live weights: after loading --model (the shapes), pull\n"
    "                         every checkpoint tensor of the replica at URL (http://HOST:PORT, its\n"
    "                         /v1/weights/export, checked against its checksums) as one full update\n"
    "                         before reporting ready (/health?ready=1 503 and generation 503 until\n"
    "                         then); retried while the source is unreachable or busy, then exit 1\n"
    "  --weights-from-key KEY the source's admin key (Bearer; also GRAPHSWAP_WEIGHTS_FROM_KEY)\n"
    "  --weights-from-timeout S  seconds the pull may take, retries included (default 300)\n"
    "\n"
    "Memory release for a colocated trainer (vLLM POST /sleep?level=1|2, POST /wake_up, GET\n"
    "/is_sleeping; SGLang POST /release_memory_occupation, /resume_memory_occupation; see docs/WEIGHTS.md):\n"
    "  --enable-weights-cpu-backup  SGLang's release keeps a host copy of the weights (as vLLM's\n"
    "                         level 1) instead of discarding them (a full update is then needed)\n"
    "  --enable-memory-saver  report enable_memory_saver true in /server_info (SGLang's flag; slime\n"
    "                         checks it against --offload-rollout). The release routes work either way\n"
    "\n"
    "Logging (stderr; a start-up summary, one line per weight update, errors):\n"
    "  --log-format text|json one line per event as text (default) or as one JSON object per line\n"
    "  --access-log           one line per HTTP request: method, path, status, bytes, duration\n"
    "  --log-interval S       every S seconds a throughput line (prompt / generation tok/s, running,\n"
    "                         waiting, KV usage, spec acceptance), only when something ran\n"
    "                         (default 10; 0 = off)\n";

static void server_teardown(srv_server *sv);

/* `graphswap serve`'s start-up from its argv (argv[0] is the command name): parses the options
 * (--help prints the help and exits; a bad option exits 2), loads the model, starts the engine thread
 * and the listener. Returns the server, or NULL with err filled (a model that does not load, a port
 * in use, ...). */
srv_server *srv_server_start(int argc, char **argv, char *err, size_t errlen)
{
    srv_runtime_opts ro;
    srv_runtime_defaults(&ro);
    const char *host = "127.0.0.1", *api_key = getenv("GRAPHSWAP_API_KEY"), *served = NULL;
    int port = 8080, http_threads = 512, max_body = 8 << 20, timeout_s = 600, keep_alive_ms = 5000, io_s = 10;
    int queue_cap = ro.ecfg.queue_cap, max_batch = 256, drain_s = 60, wsess_s = 300;
    const char *admin_key = getenv("GRAPHSWAP_ADMIN_KEY"), *weights_root = NULL, *gen_cfg = "auto";
    const char *admin_allow_env = getenv("GRAPHSWAP_ADMIN_ALLOW"), *admin_allow = admin_allow_env;
    uint64_t max_bucket = (uint64_t)2 << 30, update_bucket = (uint64_t)512 << 20;
    const char *log_format = "text";
    int access_log = 0, log_interval = 10, weights_cpu_backup = 0, prompt_tokens_details = 0, memory_saver = 0;
    const char *weights_from = NULL, *weights_from_key = getenv("GRAPHSWAP_WEIGHTS_FROM_KEY");
    int weights_from_timeout = 300;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            fputs(srv_runtime_help, stdout);
            exit(0); /* (a help request is no server: the documented exit of srv_server_start) */
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
            srv_arg_str(argc, argv, &i, "--admin-allow", &admin_allow) ||
            srv_arg_str(argc, argv, &i, "--weights-root", &weights_root) ||
            srv_arg_u64(argc, argv, &i, "--max-bucket-bytes", &max_bucket) ||
            srv_arg_u64(argc, argv, &i, "--update-bucket-bytes", &update_bucket) ||
            srv_arg_int(argc, argv, &i, "--drain-timeout", 0, 1 << 20, &drain_s) ||
            srv_arg_int(argc, argv, &i, "--weight-session-timeout", 0, 1 << 24, &wsess_s) ||
            srv_arg_str(argc, argv, &i, "--weights-from", &weights_from) ||
            srv_arg_str(argc, argv, &i, "--weights-from-key", &weights_from_key) ||
            srv_arg_int(argc, argv, &i, "--weights-from-timeout", 1, 86400, &weights_from_timeout) ||
            srv_arg_str(argc, argv, &i, "--log-format", &log_format) ||
            srv_arg_flag(argc, argv, &i, "--access-log", &access_log) ||
            srv_arg_flag(argc, argv, &i, "--enable-weights-cpu-backup", &weights_cpu_backup) ||
            srv_arg_flag(argc, argv, &i, "--enable-prompt-tokens-details", &prompt_tokens_details) ||
            srv_arg_flag(argc, argv, &i, "--enable-memory-saver", &memory_saver) ||
            srv_arg_int(argc, argv, &i, "--log-interval", 0, 1 << 20, &log_interval) ||
            srv_arg_str(argc, argv, &i, "--generation-config", &gen_cfg))
            continue;
        srv_die_usage("serve", argv[i]);
    }
    if (strcmp(gen_cfg, "auto") != 0 && strcmp(gen_cfg, "vllm") != 0) {
        snprintf(err, errlen, "--generation-config must be auto or vllm");
        return NULL;
    }
    srv_log_format lf;
    if (srv_log_parse_format(log_format, &lf) != 0) {
        fprintf(stderr, "graphswap: --log-format must be text or json\n");
        exit(2);
    }
    /* set before anything is loaded: load progress lines use the format too */
    srv_log_set_format(lf);
    srv_log_set_access(access_log);
    if (api_key && !api_key[0]) api_key = NULL;
    ro.ecfg.queue_cap = queue_cap;

    srv_server *sv = calloc(1, sizeof *sv);
    srv_state *s = calloc(1, sizeof *s);
    if (!sv || !s) srv_die("out of memory");
    sv->s = s;
    s->http.owner = s;
    sv->stats.interval = log_interval;
    if (srv_runtime_open(&s->rt, &ro, err, errlen) != 0) {
        free(s);
        free(sv);
        return NULL;
    }
    char tokpath[4200];
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", ro.model_dir);
    if (access(tokpath, R_OK) == 0) {
        s->tok = mdl_tok_load(ro.model_dir, err, errlen);
        if (!s->tok) {
            srv_runtime_close(&s->rt);
            free(s);
            free(sv);
            return NULL;
        }
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
        if (s->gen.set) {
            char line[256];
            size_t n = 0;
            const mdl_gen_defaults *gd = &s->gen;
            if (gd->set & MDL_GEN_TEMPERATURE)
                n += (size_t)snprintf(line + n, sizeof line - n, " temperature=%g", gd->temperature);
            if (gd->set & MDL_GEN_TOP_P) n += (size_t)snprintf(line + n, sizeof line - n, " top_p=%g", gd->top_p);
            if (gd->set & MDL_GEN_TOP_K) n += (size_t)snprintf(line + n, sizeof line - n, " top_k=%d", gd->top_k);
            if (gd->set & MDL_GEN_MIN_P) n += (size_t)snprintf(line + n, sizeof line - n, " min_p=%g", gd->min_p);
            if (gd->set & MDL_GEN_REPETITION_PENALTY)
                n += (size_t)snprintf(line + n, sizeof line - n, " repetition_penalty=%g", gd->repetition_penalty);
            if (gd->set & MDL_GEN_MAX_NEW_TOKENS)
                snprintf(line + n, sizeof line - n, " max_new_tokens=%d", gd->max_new_tokens);
            fprintf(stderr, "graphswap: request defaults from generation_config.json:%s\n", line);
        }
    }
    s->http.api_key = api_key;
    s->http.max_body = (size_t)max_body;
    s->request_timeout = timeout_s;
    s->http.io_timeout = io_s < timeout_s ? io_s : timeout_s;
    s->max_choices = max_batch;
    s->t_start = srv_wall();
    s->seed_base = (uint64_t)(srv_wall() * 1e9) ^ ((uint64_t)getpid() << 32);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->jobs_mu, NULL);
    /* monotonic: the engine thread's timed wait (the throughput line) must not jump with the clock */
    srv_cond_init_monotonic(&s->inbox_cv);
    srv_metrics_init(&s->met);
    srv_metrics_publish(&s->met, s->rt.e);
    srv_weights_init(s);
    if (admin_key && !admin_key[0]) admin_key = NULL;
    s->http.admin_key = admin_key;
    /* weight routes on a reachable address need a key */
    s->http.admin_disabled = !admin_key && strcmp(host, "127.0.0.1") != 0 && strcmp(host, "localhost") != 0 &&
                        strcmp(host, "::1") != 0 && strncmp(host, "127.", 4) != 0;
    /* (an empty GRAPHSWAP_ADMIN_ALLOW means none, as an empty key does; an empty --admin-allow is an error) */
    if (admin_allow && (admin_allow[0] || admin_allow != admin_allow_env)) {
        char why[160];
        if (srv_cidr_parse_list(admin_allow, s->http.admin_allow, SRV_MAX_ADMIN_ALLOW, &s->http.n_admin_allow, why, sizeof why))
            fatal("--admin-allow %s: %s (give CIDRs such as 10.0.0.0/8,fd00::/8)", admin_allow, why);
        s->http.admin_allow_spec = admin_allow;
    }
    if (weights_root && !(s->weights_root = realpath(weights_root, NULL))) fatal("--weights-root %s: %s", weights_root, strerror(errno));
    s->max_bucket = (size_t)max_bucket;
    s->update_bucket = (size_t)update_bucket;
    s->drain_timeout = drain_s;
    s->session_timeout = wsess_s;
    srv_weights_publish(s);

    srv_route_add(&s->http, "GET", "/health", srv_route_health, 0);
    srv_route_add(&s->http, "GET", "/metrics", srv_route_metrics, 0);
    srv_route_add(&s->http, "GET", "/v1/models", srv_route_models, 1);
    srv_route_add(&s->http, "GET", "/v1/models/*", srv_route_model_one, 1);
    srv_route_add(&s->http, "POST", "/v1/completions", srv_route_completions, 1);
    srv_route_add(&s->http, "POST", "/v1/chat/completions", srv_route_chat, 1);
    srv_route_add(&s->http, "POST", "/tokenize", srv_route_tokenize, 1);
    srv_route_add(&s->http, "POST", "/detokenize", srv_route_detokenize, 1);
    srv_weights_routes(s);        /* native /v1/weights/... */
    srv_weights_vllm_routes(s);
    srv_weights_areal_routes(s);   /* AReaL's vLLM server (areal_vllm_server.py) */
    srv_weights_skyrl_routes(s);   /* SkyRL's /collective_rpc, /fetch_weights */
    srv_weights_primerl_routes(s); /* prime-rl's /init_broadcaster */
    srv_weights_sglang_routes(s);
    srv_weights_trl_routes(s);
    srv_weights_gpu_routes(s);     /* CUDA IPC (native) */
    srv_weights_pull_routes(s);    /* /v1/weights/export, /v1/weights/pull (native) */
    srv_dialect_sglang_routes(s);
    srv_dialect_vllm_routes(s);
    srv_dialect_trl_routes(s);
    s->weights_cpu_backup = weights_cpu_backup;
    s->prompt_tokens_details = prompt_tokens_details;
    s->memory_saver = memory_saver;
    srv_memory_routes(s);

    signal(SIGPIPE, SIG_IGN);

    sv->stats.has_drafter = s->rt.draft != NULL;
    log_startup(s, &ro, host);
    if (pthread_create(&sv->eng_thread, NULL, engine_main, sv) != 0) fatal("cannot start the engine thread");

    char ports[300], nthreads[16], rto[32], kat[32];
    snprintf(ports, sizeof ports, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    snprintf(nthreads, sizeof nthreads, "%d", http_threads);
    /* civetweb's request_timeout_ms bounds each silent wait on a socket (request line and headers,
     * each body read, each write), not a whole request: the I/O timeout, so that a client sending a
     * partial header holds its worker for seconds, not for --request-timeout (slowloris). The
     * generation deadline (--request-timeout) is enforced by the handlers. */
    snprintf(rto, sizeof rto, "%lld", (long long)(s->http.io_timeout * 1000));
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
    mg_init_library(0); /* reference-counted by civetweb: one per server, undone in teardown */
    /* --weights-from: not ready (generation 503) before the listener takes its first request; the
     * pull runs on its own thread from here, with civetweb's client (weights/pull.c) */
    if (weights_from &&
        srv_pull_boot_start(s, weights_from, weights_from_key, weights_from_timeout, err, errlen) != 0) {
        server_teardown(sv);
        return NULL;
    }
    struct mg_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.log_message = log_civetweb;
    sv->ctx = mg_start(&cb, s, opts);
    if (!sv->ctx) {
        snprintf(err, errlen, "cannot listen on %s", ports);
        server_teardown(sv);
        return NULL;
    }
    mg_set_request_handler(sv->ctx, "/", srv_dispatch, &s->http);
    struct mg_server_port sp[4];
    int nports = mg_get_server_ports(sv->ctx, 4, sp);
    int bound = nports > 0 ? sp[0].port : port;
    snprintf(sv->url, sizeof sv->url, "http://%s%s%s:%d", strchr(host, ':') ? "[" : "", host,
             strchr(host, ':') ? "]" : "", bound);
    {
        /* (scripts and tests read the port from "on http://HOST:PORT" in this line) */
        srv_logline l;
        srv_log_begin(&l, "info", "serve", "serving %s as \"%s\" on %s%s", ro.model_dir, s->model_name, sv->url,
                      api_key ? " (API key required)" : "");
        srv_log_str(&l, "url", sv->url);
        srv_log_int(&l, "port", bound);
        srv_log_int(&l, "http_threads", http_threads);
        srv_log_bool(&l, "access_log", access_log);
        srv_log_int(&l, "log_interval_s", log_interval);
        srv_log_end(&l);
    }
    return sv;
}

const char *srv_server_url(const srv_server *sv) { return sv->url; }

int srv_server_failed(const srv_server *sv) { return srv_pull_boot_failed(sv->s); }

/* Shutdown steps 1-4 (the file comment); the listener may be absent (a failed start). */
static void server_teardown(srv_server *sv)
{
    srv_state *s = sv->s;
    srv_pull_boot_cancel(s); /* a --weights-from pull stops at its next read or attempt */
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->inbox_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(sv->eng_thread, NULL);
    srv_pull_boot_stop(s); /* (every command or closure it waited for was answered 503) */
    /* every job is settled now; let the handlers write their last bytes (mg_stop makes civetweb
     * drop further writes), bounded in case a client does not read */
    for (int i = 0; i < 500 && atomic_load(&s->http.active) > 0; i++) usleep(20000);
    if (sv->ctx) mg_stop(sv->ctx);
    mg_exit_library();
    mdl_tok_free(s->tok);
    srv_runtime_close(&s->rt);
    srv_metrics_destroy(&s->met);
    srv_weights_sglang_destroy(s);
    srv_weights_trl_destroy(s);
    srv_weights_areal_destroy(s);
    srv_weights_destroy(s);
    pthread_cond_destroy(&s->inbox_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    free(sv);
}

void srv_server_stop(srv_server *sv)
{
    server_teardown(sv);
    srv_logf("info", "serve", "stopped");
}

int srv_cmd_serve(int argc, char **argv)
{
    char err[1024];
    /* the handlers first: a client may send SIGTERM as soon as the "serving ... on" line is out
     * (installed after it, a quick stop killed the process instead of shutting it down) */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    srv_server *sv = srv_server_start(argc, argv, err, sizeof err);
    if (!sv) fatal("%s", err);
    g_started = 1;
    int failed = 0;
    while (!g_signal && !(failed = srv_server_failed(sv))) usleep(20000);
    if (failed) srv_logf("error", "serve", "the --weights-from pull failed, shutting down (exit status 1)");
    else srv_logf("info", "serve", "signal %d, shutting down", (int)g_signal);
    srv_server_stop(sv);
    return failed ? 1 : 0;
}
