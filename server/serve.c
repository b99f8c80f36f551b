/* server/serve.c — `graphswap serve`: HTTP front end (civetweb) over the engine thread.
 *
 * Threads: civetweb's handler threads parse and validate requests into plain C structs, push a job
 * into the inbox and wait on the job's condition variable; they never touch model or device state.
 * One engine thread owns the runtime: it drains the inbox into eng_submit, runs steps while there is
 * work, and completes jobs from the engine's on_finish callback (on the engine thread).
 *
 * Routes here: GET /health, POST /v1/completions (token-id or text prompts, max_tokens,
 * temperature, top_p, top_k, min_p, seed, logprobs, ignore_eos). The full OpenAI surface
 * (chat, streaming, n, stop strings, tokenize, metrics, auth) is tracked as not done in the README.
 */
#include <civetweb.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "models/tokenizer.h"
#include "server/cli.h"

#define SRV_MAX_BODY (8u << 20)

typedef struct srv_job {
    eng_request r;
    int32_t *prompt;
    int done;
    int submit_failed;
    int busy;
    char err[512];
    pthread_cond_t cv;
    struct srv_job *next;
} srv_job;

typedef struct {
    srv_runtime rt;
    mdl_tokenizer *tok;
    const char *model_name;
    pthread_mutex_t mu;
    pthread_cond_t inbox_cv;
    srv_job *inbox_head, *inbox_tail;
    int stopping;
    uint64_t next_id;
} srv_state;

static volatile sig_atomic_t g_signal;
static void on_signal(int sig) { g_signal = sig; }

/* ---- engine thread ------------------------------------------------------------------------------ */

static void job_finished(eng_request *r, void *user)
{
    srv_state *s = user;
    srv_job *j = (srv_job *)r; /* r is the first member */
    pthread_mutex_lock(&s->mu);
    j->done = 1;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&s->mu);
}

static void *engine_main(void *arg)
{
    srv_state *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int busy = eng_num_running(s->rt.e) + eng_num_waiting(s->rt.e) > 0;
        while (!s->inbox_head && !busy && !s->stopping) pthread_cond_wait(&s->inbox_cv, &s->mu);
        srv_job *list = s->inbox_head;
        s->inbox_head = s->inbox_tail = NULL;
        int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        while (list) {
            srv_job *j = list;
            list = j->next;
            if (eng_submit(s->rt.e, &j->r, &j->busy, j->err, sizeof j->err) != 0) {
                pthread_mutex_lock(&s->mu);
                j->submit_failed = 1;
                j->done = 1;
                pthread_cond_signal(&j->cv);
                pthread_mutex_unlock(&s->mu);
            }
        }
        if (stopping) {
            eng_abort_all(s->rt.e);
            return NULL;
        }
        if (eng_num_running(s->rt.e) + eng_num_waiting(s->rt.e) > 0) eng_step(s->rt.e);
    }
}

/* ---- HTTP helpers --------------------------------------------------------------------------------- */

static void send_json(struct mg_connection *c, int status, cJSON *body)
{
    char *txt = cJSON_PrintUnformatted(body);
    size_t n = txt ? strlen(txt) : 0;
    mg_printf(c,
              "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
              "Connection: keep-alive\r\n\r\n",
              status, mg_get_response_code_text(c, status), n);
    if (n) mg_write(c, txt, n);
    free(txt);
}

static int send_error(struct mg_connection *c, int status, const char *type, const char *param,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int send_error(struct mg_connection *c, int status, const char *type, const char *param,
                      const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddNumberToObject(e, "code", status);
    send_json(c, status, o);
    cJSON_Delete(o);
    return status;
}

/* Reads the whole body (bounded). Returns a malloc'd NUL-terminated buffer or NULL (error sent). */
static char *read_body(struct mg_connection *c, size_t *len)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (ri->content_length > (long long)SRV_MAX_BODY) {
        send_error(c, 413, "invalid_request_error", NULL, "request body larger than %u bytes", SRV_MAX_BODY);
        return NULL;
    }
    size_t cap = ri->content_length > 0 ? (size_t)ri->content_length + 1 : 65536, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            send_error(c, 500, "server_error", NULL, "out of memory");
            return NULL;
        }
        if (n + 1 == cap) {
            if (cap > SRV_MAX_BODY) {
                free(buf);
                send_error(c, 413, "invalid_request_error", NULL, "request body larger than %u bytes", SRV_MAX_BODY);
                return NULL;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
            continue;
        }
        int r = mg_read(c, buf + n, cap - n - 1);
        if (r < 0) {
            free(buf);
            send_error(c, 400, "invalid_request_error", NULL, "could not read the request body");
            return NULL;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    if (ri->content_length > 0 && (long long)n != ri->content_length) {
        free(buf);
        send_error(c, 400, "invalid_request_error", NULL, "truncated request body");
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---- routes ------------------------------------------------------------------------------------------ */

static int h_health(struct mg_connection *c, void *cbdata)
{
    (void)cbdata;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    send_json(c, 200, o);
    cJSON_Delete(o);
    return 200;
}

static int num_field(struct mg_connection *c, const cJSON *body, const char *key, double lo, double hi,
                     int integer, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        (integer && v->valuedouble != (double)(long long)v->valuedouble)) {
        send_error(c, 400, "invalid_request_error", key, "%s must be %s in [%g, %g]", key,
                   integer ? "an integer" : "a number", lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 1;
}

static int h_completions(struct mg_connection *c, void *cbdata)
{
    srv_state *s = cbdata;
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (strcmp(ri->request_method, "POST") != 0)
        return send_error(c, 405, "invalid_request_error", NULL, "use POST");
    size_t len;
    char *txt = read_body(c, &len);
    if (!txt) return 400;
    cJSON *body = cJSON_ParseWithLength(txt, len);
    free(txt);
    srv_job *j = NULL;
    int status = 200;
    if (!cJSON_IsObject(body)) {
        status = send_error(c, 400, "invalid_request_error", NULL, "request body must be a JSON object");
        goto out;
    }
    j = calloc(1, sizeof *j);
    if (!j) {
        status = send_error(c, 500, "server_error", NULL, "out of memory");
        goto out;
    }
    pthread_cond_init(&j->cv, NULL);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    const int V = s->rt.m->cfg.vocab;
    if (cJSON_IsArray(p)) {
        int n = cJSON_GetArraySize(p);
        if (n < 1) {
            status = send_error(c, 400, "invalid_request_error", "prompt", "prompt must not be empty");
            goto out;
        }
        j->prompt = malloc((size_t)n * sizeof *j->prompt);
        if (!j->prompt) {
            status = send_error(c, 500, "server_error", NULL, "out of memory");
            goto out;
        }
        for (int i = 0; i < n; i++) {
            const cJSON *x = cJSON_GetArrayItem(p, i);
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= V ||
                x->valuedouble != (double)(int)x->valuedouble) {
                status = send_error(c, 400, "invalid_request_error", "prompt",
                                    "prompt[%d] is not a token id in [0, %d)", i, V);
                goto out;
            }
            j->prompt[i] = (int32_t)x->valuedouble;
        }
        j->r.n_prompt = n;
    } else if (cJSON_IsString(p) && s->tok) {
        size_t n = 0;
        char err[256];
        const char *t = p->valuestring;
        if (mdl_tok_encode(s->tok, t, strlen(t), 1, NULL, 0, &n, err, sizeof err) != 0) {
            status = send_error(c, 400, "invalid_request_error", "prompt", "prompt: %s", err);
            goto out;
        }
        if (n == 0) {
            status = send_error(c, 400, "invalid_request_error", "prompt", "prompt must not be empty");
            goto out;
        }
        j->prompt = malloc(n * sizeof *j->prompt);
        if (!j->prompt ||
            mdl_tok_encode(s->tok, t, strlen(t), 1, j->prompt, n, &n, err, sizeof err) != 0) {
            status = send_error(c, 500, "server_error", NULL, "tokenization failed");
            goto out;
        }
        j->r.n_prompt = (int)n;
    } else {
        status = send_error(c, 400, "invalid_request_error", "prompt",
                            s->tok ? "prompt must be a string or a list of token ids"
                                   : "prompt must be a list of token ids (this model has no tokenizer)");
        goto out;
    }
    j->r.prompt = j->prompt;
    double v;
    int rc;
    j->r.max_tokens = 16;
    j->r.sp.top_p = 1;
    j->r.sp.seed = __atomic_add_fetch(&s->next_id, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull;
#define FIELD(key, lo, hi, integer, dst)                                                                 \
    if ((rc = num_field(c, body, key, lo, hi, integer, &v)) < 0) {                                        \
        status = 400;                                                                                    \
        goto out;                                                                                        \
    } else if (rc > 0)                                                                                   \
        dst = v;
    FIELD("max_tokens", 1, 1 << 24, 1, j->r.max_tokens);
    FIELD("temperature", 0, 100, 0, j->r.sp.temperature);
    FIELD("top_p", 0, 1, 0, j->r.sp.top_p);
    FIELD("top_k", -1, 1 << 24, 1, j->r.sp.top_k);
    FIELD("min_p", 0, 1, 0, j->r.sp.min_p);
    FIELD("seed", 0, 9007199254740991.0, 1, j->r.sp.seed);
    FIELD("logprobs", 0, ENG_MAX_LOGPROBS, 1, j->r.sp.logprobs);
#undef FIELD
    const cJSON *ie = cJSON_GetObjectItemCaseSensitive(body, "ignore_eos");
    j->r.ignore_eos = cJSON_IsTrue(ie);
    j->r.out_tokens = calloc((size_t)j->r.max_tokens, sizeof(int32_t));
    j->r.out_logprobs = calloc((size_t)j->r.max_tokens, sizeof(float));
    if (j->r.sp.logprobs)
        j->r.out_top = calloc((size_t)j->r.max_tokens * (size_t)j->r.sp.logprobs, sizeof(eng_toplp));
    if (!j->r.out_tokens || !j->r.out_logprobs || (j->r.sp.logprobs && !j->r.out_top)) {
        status = send_error(c, 500, "server_error", NULL, "out of memory");
        goto out;
    }
    j->r.on_finish = job_finished;
    j->r.user = s;

    pthread_mutex_lock(&s->mu);
    if (s->inbox_tail) s->inbox_tail->next = j;
    else s->inbox_head = j;
    s->inbox_tail = j;
    pthread_cond_signal(&s->inbox_cv);
    while (!j->done) pthread_cond_wait(&j->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (j->submit_failed) {
        status = j->busy ? send_error(c, 503, "overloaded", NULL, "%s", j->err)
                         : send_error(c, 400, "invalid_request_error", NULL, "%s", j->err);
        goto out;
    }

    cJSON *o = cJSON_CreateObject();
    char id[64];
    snprintf(id, sizeof id, "cmpl-%llu", (unsigned long long)__atomic_add_fetch(&s->next_id, 1, __ATOMIC_RELAXED));
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)time(NULL));
    cJSON_AddStringToObject(o, "model", s->model_name);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    char *text = NULL;
    size_t tn = 0;
    if (s->tok) {
        char err[128];
        mdl_tok_decode(s->tok, j->r.out_tokens, (size_t)j->r.n_out, 1, NULL, 0, &tn, err, sizeof err);
        text = calloc(tn + 1, 1);
        if (text) mdl_tok_decode(s->tok, j->r.out_tokens, (size_t)j->r.n_out, 1, text, tn, &tn, err, sizeof err);
    }
    cJSON_AddStringToObject(ch, "text", text ? text : "");
    free(text);
    cJSON *ids = cJSON_AddArrayToObject(ch, "token_ids");
    for (int i = 0; i < j->r.n_out; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(j->r.out_tokens[i]));
    if (j->r.sp.logprobs > 0) {
        cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
        cJSON *toks = cJSON_AddArrayToObject(lp, "tokens");
        cJSON *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
        cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs");
        for (int i = 0; i < j->r.n_out; i++) {
            char name[32];
            snprintf(name, sizeof name, "token_id:%d", j->r.out_tokens[i]);
            cJSON_AddItemToArray(toks, cJSON_CreateString(name));
            cJSON_AddItemToArray(tlp, cJSON_CreateNumber(j->r.out_logprobs[i]));
            cJSON *m = cJSON_CreateObject();
            for (int k = 0; k < j->r.sp.logprobs; k++) {
                const eng_toplp *t = &j->r.out_top[(size_t)i * (size_t)j->r.sp.logprobs + (size_t)k];
                snprintf(name, sizeof name, "token_id:%d", t->id);
                cJSON_AddNumberToObject(m, name, t->logprob);
            }
            cJSON_AddItemToArray(top, m);
        }
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddStringToObject(ch, "finish_reason", eng_finish_name(j->r.finish));
    if (j->r.stop_token >= 0) cJSON_AddNumberToObject(ch, "stop_reason", j->r.stop_token);
    else cJSON_AddNullToObject(ch, "stop_reason");
    cJSON *pids = cJSON_AddArrayToObject(o, "prompt_token_ids");
    for (int i = 0; i < j->r.n_prompt; i++) cJSON_AddItemToArray(pids, cJSON_CreateNumber(j->r.prompt[i]));
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", j->r.n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->r.n_out);
    cJSON_AddNumberToObject(u, "total_tokens", j->r.n_prompt + j->r.n_out);
    cJSON_AddNumberToObject(o, "weight_version", 0);
    send_json(c, 200, o);
    cJSON_Delete(o);
out:
    if (j) {
        pthread_cond_destroy(&j->cv);
        free(j->prompt);
        free(j->r.out_tokens);
        free(j->r.out_logprobs);
        free(j->r.out_top);
        free(j);
    }
    cJSON_Delete(body);
    return status;
}

static int h_not_found(struct mg_connection *c, void *cbdata)
{
    (void)cbdata;
    const struct mg_request_info *ri = mg_get_request_info(c);
    return send_error(c, 404, "not_found", NULL, "no route %s %s", ri->request_method, ri->local_uri);
}

static const char help[] =
    "usage: graphswap serve --model DIR [--host 127.0.0.1] [--port 8080] [options]\n"
    "\n"
    "Serves GET /health and POST /v1/completions (OpenAI completions shape; prompt as a string\n"
    "when the model folder has a tokenizer, or as a list of token ids).\n"
    "\n"
    "  --host ADDR            listen address (default 127.0.0.1)\n"
    "  --port N               listen port (default 8080)\n"
    "  --http-threads N       HTTP handler threads (default 16)\n";

int srv_cmd_serve(int argc, char **argv)
{
    srv_runtime_opts ro;
    srv_runtime_defaults(&ro);
    const char *host = "127.0.0.1";
    int port = 8080, http_threads = 16;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            fputs(srv_runtime_help, stdout);
            return 0;
        }
        if (srv_runtime_arg(argc, argv, &i, &ro) || srv_arg_str(argc, argv, &i, "--host", &host) ||
            srv_arg_int(argc, argv, &i, "--port", 1, 65535, &port) ||
            srv_arg_int(argc, argv, &i, "--http-threads", 1, 1024, &http_threads))
            continue;
        srv_die_usage("serve", argv[i]);
    }
    static srv_state s;
    char err[1024];
    if (srv_runtime_open(&s.rt, &ro, err, sizeof err) != 0) srv_die("%s", err);
    char tokpath[4200];
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", ro.model_dir);
    if (access(tokpath, R_OK) == 0) {
        s.tok = mdl_tok_load(ro.model_dir, err, sizeof err);
        if (!s.tok) srv_die("%s", err);
    }
    s.model_name = ro.model_dir;
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.inbox_cv, NULL);
    pthread_t eng_thread;
    if (pthread_create(&eng_thread, NULL, engine_main, &s) != 0) srv_die("cannot start the engine thread");

    char ports[300], nthreads[16];
    int v6 = strchr(host, ':') != NULL;
    snprintf(ports, sizeof ports, v6 ? "[%s]:%d" : "%s:%d", host, port);
    snprintf(nthreads, sizeof nthreads, "%d", http_threads);
    const char *opts[] = {"listening_ports", ports, "num_threads", nthreads, "enable_keep_alive", "yes",
                          "request_timeout_ms", "600000", NULL};
    mg_init_library(0);
    struct mg_callbacks cb;
    memset(&cb, 0, sizeof cb);
    struct mg_context *ctx = mg_start(&cb, &s, opts);
    if (!ctx) srv_die("cannot listen on %s", ports);
    mg_set_request_handler(ctx, "/health$", h_health, &s);
    mg_set_request_handler(ctx, "/v1/completions$", h_completions, &s);
    mg_set_request_handler(ctx, "/", h_not_found, &s);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "graphswap: serving %s on http://%s\n", ro.model_dir, ports);
    while (!g_signal) usleep(100000);
    fprintf(stderr, "graphswap: signal %d, shutting down\n", (int)g_signal);
    pthread_mutex_lock(&s.mu);
    s.stopping = 1;
    pthread_cond_signal(&s.inbox_cv);
    pthread_mutex_unlock(&s.mu);
    pthread_join(eng_thread, NULL);
    mg_stop(ctx);
    mg_exit_library();
    mdl_tok_free(s.tok);
    srv_runtime_close(&s.rt);
    return 0;
}
