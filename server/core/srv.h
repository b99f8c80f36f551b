/* server/core/srv.h — internal interfaces of the HTTP server (every server/ file except the CLI ones).
 *
 * Threads and ownership
 *   - civetweb handler threads: parse and validate untrusted input into plain structs (srv_gen),
 *     build a job, push it into the inbox, then wait on the job's condition variable and write the
 *     response (whole, or as SSE chunks). They never call the engine and never touch model state.
 *   - the engine thread (serve.c): owns srv_state.rt (backend + model + engine). It drains the inbox
 *     into eng_submit, steps while work exists, and runs the request callbacks (on_token,
 *     on_finish), which publish results into the job under the job's mutex.
 *   - the main thread: starts everything, waits for SIGINT/SIGTERM, shuts down.
 *
 * Job life cycle (srv_job.state):
 *   QUEUED  --engine submits every choice-->  ACCEPTED  --all choices finished-->  settled
 *   QUEUED  --a submit fails / shutdown-->    REJECTED (already submitted choices are cancelled)
 * A job is "settled" when state != QUEUED and n_live == 0: the engine holds no pointer into it any
 * more, and only then may the handler free it. Handlers always wait for settling, also after a
 * timeout or a client disconnect (they set every choice's cancel flag first; the engine retires
 * cancelled requests at its next step, so the wait is bounded by one step).
 *
 * Locks: srv_state.mu guards the inbox and `stopping`; srv_job.mu guards everything the engine
 * thread publishes into a job (token counts, decoded text, finish flags). The engine thread never
 * holds both at once. Metrics have their own mutex (histograms) and atomics (gauges, counters).
 */
#ifndef GS_SRV_SRV_H
#define GS_SRV_SRV_H

#include <civetweb.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/weights.h"
#include "models/tokenizer/tokenizer.h"
#include "server/core/cli.h"
#include "server/http/log.h"

#define SRV_MAX_STOP 8          /* stop strings per request */
#define SRV_MAX_STOP_BYTES 256  /* bytes per stop string */
#define SRV_MAX_N 16            /* samples per prompt */
#define SRV_MAX_CACHE_SALT 1024 /* bytes of a cache_salt */
#define SRV_MAX_ROUTES 160 /* every dialect, the weight and memory routes */

typedef struct srv_state srv_state;
typedef struct srv_job srv_job;
typedef struct srv_cmd srv_cmd;
typedef struct srv_closure srv_closure;

/* ---- errors ------------------------------------------------------------------------------------- */

/* An error to send as {"error":{"message","type","param","code"}} with HTTP status `status`. */
typedef struct {
    int status;
    const char *type; /* NULL: derived from the status */
    char param[64];   /* "" -> null */
    char msg[768];
} srv_err;

int srv_errf(srv_err *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

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

/* ---- routing (http.c) --------------------------------------------------------------------------- */

typedef int (*srv_route_fn)(srv_state *s, struct mg_connection *c);
typedef struct {
    const char *method; /* "GET", "POST" */
    const char *path;   /* an exact path; one ending in '*' is a prefix that matches any path with at
                           least one more character (GET /v1/models/{id}) */
    srv_route_fn fn;
    int auth;           /* 1: needs the API key when one is configured; 2: an admin (weights) route:
                           open to clients inside --admin-allow, else needs the admin key when one is
                           configured, and is disabled on a non-loopback listener without one */
} srv_route;

/* An address block of --admin-allow: family 4 or 6, the network's bytes (host bits zero), prefix. */
typedef struct {
    int family;
    uint8_t addr[16];
    int prefix;
} srv_cidr;
#define SRV_MAX_ADMIN_ALLOW 32

/* Parses a comma-separated list of CIDRs ("10.0.0.0/8,fd00::/8"; a bare address is one host) into
 * out[0..*n). Strict: dotted-quad IPv4 without leading zeros, inet_pton IPv6, a decimal prefix in
 * range, no host bits set, no empty entries. Returns 0, or -1 with why filled. */
int srv_cidr_parse_list(const char *list, srv_cidr *out, int cap, int *n, char *why, size_t whylen);
/* 1 when the textual address addr (a client's remote_addr) lies in one of the blocks (an
 * IPv4-mapped IPv6 address also matches IPv4 blocks). */
int srv_cidr_match(const srv_cidr *list, int n, const char *addr);

/* Adds a route (at most SRV_MAX_ROUTES; later native routes, e.g. weight updates, plug in here). */
void srv_route_add(srv_state *s, const char *method, const char *path, srv_route_fn fn, int auth);
/* The one civetweb request handler: exact path lookup, 405 with Allow for a known path with another
 * method, 404 otherwise, auth check, then the route. cbdata is the srv_state. */
int srv_dispatch(struct mg_connection *c, void *cbdata);

/* ---- state -------------------------------------------------------------------------------------- */

struct srv_state {
    /* immutable after start-up (read by every thread) */
    srv_runtime rt;          /* engine thread only, after start-up */
    mdl_tokenizer *tok;      /* NULL when the model folder has none; thread-safe */
    mdl_chat_family chat;
    const char *model_name;  /* --served-model-name, or the model folder */
    const char *model_dir;
    int vocab;               /* model vocabulary (token ids must be below it) */
    int max_model_len;
    int kv_tokens;           /* tokens the whole KV cache holds */
    int n_eos;
    int32_t eos[MDL_MAX_EOS];
    mdl_gen_defaults gen;    /* request sampling defaults (generation_config.json; none with
                                --generation-config vllm) */
    const char *api_key;     /* NULL: no auth */
    size_t max_body;
    double request_timeout;  /* seconds */
    double io_timeout;       /* seconds a client may send nothing while its request is read (slowloris) */
    int max_choices;         /* engine requests per HTTP request (prompts x n) */
    uint64_t seed_base;      /* per-process randomness for unseeded requests */
    double t_start;          /* wall clock at start (for "created") */
    srv_route routes[SRV_MAX_ROUTES];
    int n_routes;

    pthread_mutex_t mu;      /* inbox + stopping */
    pthread_cond_t inbox_cv;
    srv_job *inbox_head, *inbox_tail;
    int stopping;
    /* every submitted generation job of every dialect, for aborts by request id (SGLang's
     * /abort_request); a job is in it from srv_job_submit to srv_job_free */
    pthread_mutex_t jobs_mu;
    srv_job *jobs;

    _Atomic uint64_t next_id;
    atomic_int active;       /* handlers inside srv_dispatch (shutdown lets them finish writing) */
    srv_metrics met;

    /* weight updates and admin commands (weights_*.c). Commands are closures run by the engine
     * thread in arrival order; the list is guarded by `mu`. */
    srv_cmd *cmd_head, *cmd_tail;
    const char *admin_key;      /* --admin-key (Bearer) for the weight routes; NULL: none */
    int admin_disabled;         /* non-loopback listener without an admin key */
    srv_cidr admin_allow[SRV_MAX_ADMIN_ALLOW]; /* --admin-allow: clients admitted without a key */
    int n_admin_allow;          /* 0: none given (keyless admin access: a loopback listener only) */
    const char *admin_allow_spec; /* the --admin-allow text (start-up log); NULL: none */
    char *weights_root;         /* realpath of --weights-root; NULL: disk loads refused */
    size_t max_bucket;          /* --max-bucket-bytes */
    size_t update_bucket;       /* --update-bucket-bytes (disk loads) */
    double drain_timeout;       /* seconds a "wait" pause waits for running requests */
    double session_timeout;     /* --weight-session-timeout: an open session with no command and no
                                   bucket upload for this long is aborted (0: never) */
    double wsess_last;          /* engine thread: when the last weight command ran */
    atomic_int w_uploads;       /* bucket uploads being read or waiting for bucket_mu (activity) */
    atomic_uint w_upload_events; /* +1 at the start and at the end of every upload */
    unsigned w_events_seen;     /* engine thread: w_upload_events when last looked at */
    _Atomic uint64_t w_sessions_timed_out;
    pthread_mutex_t bucket_mu;  /* one bucket upload at a time: it owns the staging buffer */
    uint8_t *staging;           /* reusable bucket staging buffer (grown, never shrunk) */
    size_t staging_cap;
    uint64_t n_buckets_rx;      /* HTTP buckets received in session rx_session (bucket_mu): error
                                   messages number a session's buckets from 1 */
    uint64_t rx_session;
    int paused;                 /* engine thread: generation paused by /pause (vLLM) */
    /* GPU weight transports (engine thread only; weights_gpu.c, engine/backend/transport_cuda.h) */
    void *nccl;                 /* gs_nccl communicator; NULL: none */
    int nccl_rank, nccl_world;
    int nccl_root;              /* the rank weights are broadcast from: 0, or TRL's trainer (world - 1) */
    struct srv_store_server *trl_store; /* TRL: the TCPStore graphswap hosts as rank 0; NULL: none */
    int64_t trl_bcast_n;        /* its next broadcast_obj counter (0 was the NCCL id) */
    int trl_session;            /* the open weight session is TRL's (begun by /update_named_param/) */
    char nccl_group[128];
    void *nccl_staging;         /* device staging from the backend arena: allocated once, kept */
    size_t nccl_staging_bytes;
    double nccl_timeout;        /* seconds a communicator init or a broadcast may take */
    uint64_t n_gpu_buckets;     /* GPU-transport buckets of session gpu_session (engine thread) */
    uint64_t gpu_session;
    uint8_t *ipc_base;          /* CUDA-IPC mapping of the open session; NULL: none */
    size_t ipc_offset, ipc_bytes;
    uint64_t ipc_session;
    /* SGLang's NCCL group between /init_weights_update_group (the TCPStore joined) and the first
     * /update_weights_from_distributed (the id fetched, the communicator created): handler threads,
     * under store_mu (weights_sglang.c) */
    pthread_mutex_t store_mu;
    struct srv_store_group *store_group; /* NULL: no pending group */
    srv_cmd *store_init;        /* its SRV_CMD_NCCL_INIT (rank, world, group, timeout, staging) */
    int store_busy;             /* a join or fetch is under way on some handler thread */
    cJSON *areal_meta;          /* AReaL's /areal_set_update_weight_meta body, validated, for the next
                                   /areal_update_weights_xccl (weights_areal.c; under store_mu) */
    /* published by the engine thread after each step / command (under wmu) */
    pthread_mutex_t wmu;
    eng_weights_info wpub;
    char vname[64][128];        /* version strings by version number (ring) */
    int is_paused_pub;
    /* engine closures (serve.c srv_engine_call), guarded by `mu` */
    srv_closure *clo_head, *clo_tail;
    int prompt_tokens_details;  /* --enable-prompt-tokens-details (vLLM): usage.prompt_tokens_details
                                   {cached_tokens} when some prompt tokens came from the prefix cache */
    /* memory release (memory_api.c) */
    int weights_cpu_backup;     /* --enable-weights-cpu-backup: SGLang's release keeps a host copy of
                                   the weights (sleep level 1) instead of discarding them (level 2) */
    atomic_uint mem_asleep_pub; /* eng_is_sleeping, published by the engine thread */
};

/* ---- a server in this process (serve.c) ---------------------------------------------------------
 * `graphswap serve` is srv_server_start + wait for SIGINT / SIGTERM + srv_server_stop; graphswap
 * eval --model runs its servers in its own process with the same two calls. */
typedef struct srv_server srv_server;
/* serve's argv (argv[0] the command name): options as `graphswap serve` takes them (--help prints
 * the help and exits 0, a bad option exits 2, a bad --admin-allow / --weights-root exits 1); loads the
 * model, starts the engine thread and the listener. NULL with err filled when the model does not
 * load or the address cannot be bound. */
srv_server *srv_server_start(int argc, char **argv, char *err, size_t errlen);
const char *srv_server_url(const srv_server *sv); /* "http://HOST:PORT", the bound port */
void srv_server_stop(srv_server *sv);             /* the shutdown of serve.c's file comment; frees sv */

/* ---- engine closures (serve.c) ------------------------------------------------------------------
 * The generic way for a handler thread to run code on the engine thread, which alone touches the
 * engine: fill fn and arg, call srv_engine_call. It queues the closure, wakes the engine thread and
 * waits until fn(s, arg) ran there (between steps, after the inbox and the admin commands, in
 * arrival order among closures). Returns 0, or -1 when the server is shutting down (fn not run). */
struct srv_closure {
    void (*fn)(srv_state *s, void *arg);
    void *arg;
    /* serve.c */
    int done, ran;
    pthread_cond_t cv;
    srv_closure *next;
};
int srv_engine_call(srv_state *s, srv_closure *c);
/* Engine thread: runs (or, when stopping, drops) every queued closure. */
void srv_closures_run(srv_state *s, int stopping);

/* ---- memory release (memory_api.c): vLLM /sleep, /wake_up, /is_sleeping; SGLang
 * /release_memory_occupation, /resume_memory_occupation ---------------------------------------------- */
void srv_memory_routes(srv_state *s);

/* ---- parsed generation request (oai_parse.c) ----------------------------------------------------- */

typedef enum { SRV_API_COMPLETIONS = 0, SRV_API_CHAT } srv_api;

typedef struct {
    int32_t *ids;
    int n;
} srv_prompt;

typedef struct {
    srv_api api;
    srv_prompt *prompts;
    int n_prompts;
    int n;               /* samples per prompt */
    int max_tokens, min_tokens, ignore_eos;
    int no_spec;         /* "speculative": false — decode without the server's drafter (default
                          * true: speculative when a drafter is loaded; ignored without one) */
    eng_sampling sp;     /* sp.logprobs = alternatives per token */
    int seed_set;
    char *stop[SRV_MAX_STOP];
    size_t stop_len[SRV_MAX_STOP];
    int n_stop;
    size_t max_stop_len;
    int32_t *stop_ids;
    int n_stop_ids;
    int logprobs;        /* 1: report logprobs (completions: "logprobs" given; chat: logprobs true) */
    int echo, include_stop, skip_special, return_token_ids, tokens_as_ids;
    int prompt_logprobs; /* -1: off; else vLLM's prompt_logprobs (alternatives per prompt token) */
    int stream, include_usage;
    uint64_t cache_salt; /* vLLM's cache_salt, eng_cache_salt_hash of the string (0: none) */
} srv_gen;

/* Parses and validates a request body into g (zeroed first). Returns 0, or -1 with e filled. */
int srv_parse_gen(const srv_state *s, const cJSON *body, srv_api api, srv_gen *g, srv_err *e);
/* o's member key, or NULL when o is NULL, the member is absent or it is JSON null. */
const cJSON *srv_field(const cJSON *o, const char *key);
void srv_gen_free(srv_gen *g);
/* logit_bias (NULL / JSON null / {}: none): keys token ids as decimal strings in [0, vocab), values
 * numbers clamped to [-100, 100] (vLLM), at most ENG_MAX_LOGIT_BIAS; *out (malloc, ids ascending and
 * unique, the last of a repeated id kept) or NULL. Errors name "logit_bias". */
int srv_parse_logit_bias(const cJSON *v, int vocab, eng_logit_bias **out, int *n_out, srv_err *e);
/* Token ids of a prompt string: encoded, and with add_special the ids the tokenizer's post-processor
 * adds (mdl_tok_special_ids: Llama-3 <|begin_of_text|>, Qwen nothing). An empty text (or one that
 * encodes to nothing) is an error unless allow_empty (/tokenize: HF gives [] or just the specials). */
int srv_parse_prompt_text(const srv_state *s, const char *text, size_t len, int add_special, int allow_empty,
                          srv_prompt *out, const char *param, srv_err *e);
/* The chat template's request switches: add_generation_prompt (default true), vLLM's
 * continue_final_message (not with add_generation_prompt) and chat_template_kwargs.enable_thinking
 * (-1 when not given; Qwen3: false adds the empty <think> block after the generation prompt). */
typedef struct {
    int add_generation_prompt, continue_final_message, enable_thinking;
    const char *date_string; /* chat_template_kwargs.date_string (Llama-3.1; NULL: "26 Jul 2024"), in the body */
} srv_chat_opts;
int srv_chat_opts_parse(const cJSON *body, srv_chat_opts *o, srv_err *e);
/* Renders messages with the model's built-in chat template (malloc'ed text of *len bytes; NULL with e
 * filled on a bad request), or renders and encodes them. */
char *srv_chat_render(const srv_state *s, const cJSON *messages, const srv_chat_opts *o, size_t *len, srv_err *e);
int srv_chat_encode(const srv_state *s, const cJSON *messages, const srv_chat_opts *o, srv_prompt *out,
                    srv_err *e);

/* ---- generation jobs (oai_run.c): the one native request path every dialect goes through ----------
 *
 * A dialect (server/dialect_*.c) parses its own request shape into a srv_gen (via srv_parse_gen on a
 * canonical body: see srv_parse_mapped below), then: srv_job_new -> fill j->g -> srv_job_prepare ->
 * srv_job_submit -> srv_job_wait (whole answer) or the srv_job_snapshot / srv_job_wait_event loop
 * (streaming) -> read the choices -> srv_job_free. The fields below that the engine thread publishes
 * are read under j->mu until the job settled (srv_job_wait returned 0), and freely afterwards. */

typedef struct srv_choice {
    eng_request r; /* first member: the engine hands &r to the callbacks */
    srv_job *job;
    int index, prompt_idx;
    /* published by the engine thread under job->mu */
    char *text;
    size_t text_len, text_cap;
    uint32_t *tok_end; /* [max_tokens]: text length after token i */
    int n_pub;         /* tokens visible to the handler */
    int stop_idx;      /* matched stop string, -1 */
    size_t cut;        /* visible text length after a stop-string match */
    int finished;
    int oom;
    /* engine thread only */
    double t_last;
    /* handler only: streaming cursors */
    int sent_tokens, sent_final;
    int first_sent; /* its first event (echo / role) went out */
    size_t sent_bytes;
} srv_choice;

enum { SRV_JOB_QUEUED = 0, SRV_JOB_ACCEPTED, SRV_JOB_REJECTED };

struct srv_job {
    srv_state *s;
    srv_gen g;
    srv_choice *ch;
    int n_ch;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;
    int n_live;      /* submitted choices not finished yet */
    uint64_t events; /* bumped on every publication */
    srv_err rej;
    double t_arrival;
    double created;
    char id[64];
    srv_job *next;
    /* the abort registry (s->jobs_mu) */
    char rid[128];            /* the client's request id ("" none): SGLang rid, vLLM request_id */
    srv_job *reg_prev, *reg_next;
    int registered;
    atomic_int aborted;       /* cancelled by an abort route (not by a timeout or disconnect) */
};

/* A job for a request that arrived at t_arrival (srv_now()); j->g is zeroed. NULL: out of memory. */
srv_job *srv_job_new(srv_state *s, double t_arrival);
/* A generation route's first steps: reads the JSON body (*body, the caller's to delete) and makes the
 * job. NULL with e filled (the body's error, or 500 out of memory) and nothing to free. */
srv_job *srv_job_from_request(srv_state *s, struct mg_connection *c, double t_arrival, cJSON **body, srv_err *e);
/* Unregisters and frees a job that is settled (or was never submitted). */
void srv_job_free(srv_job *j);
/* After j->g is filled: the checks every dialect shares (stop strings need a tokenizer) and one choice
 * per (prompt, sample) with its output buffers; j->id is id_prefix-<unique>. 0, or -1 with e. */
int srv_job_prepare(srv_job *j, const char *id_prefix, srv_err *e);
/* Registers the job (for aborts) and hands it to the engine thread. 0, or -1 with e (503 while
 * shutting down; the job was not submitted and the caller frees it). */
int srv_job_submit(srv_job *j, srv_err *e);
/* Waits until the job settled. 0: its choices are final. -1 with e: rejected by the engine (its
 * error), or the deadline passed (504; generation cancelled, the job settled). */
int srv_job_wait(srv_job *j, double deadline, srv_err *e);
/* e: the 504 of a request that ran past --request-timeout (its generation cancelled). Returns -1. */
int srv_err_timed_out(const srv_state *s, srv_err *e);
/* Streaming, before the response head: waits until the engine accepted or rejected the job. 0, or -1
 * with e (the job is settled then). */
int srv_job_wait_accepted(srv_job *j, double deadline, srv_err *e);
/* Cancels every choice (a lost client, a timeout) and waits until the job settled. */
void srv_job_cancel_settle(srv_job *j);
/* Cancels every registered job whose rid starts with `rid` (SGLang matches by prefix), or every job
 * when rid is NULL; they end with finish "abort". Returns how many jobs were hit. */
int srv_job_abort(srv_state *s, const char *rid);
/* "weight_version" of choice `only` (-1: of every choice); the job is settled or the choice finished. */
cJSON *srv_job_versions_json(const srv_job *j, int only);
/* The visible text end of a choice (stop string cut, or everything). Settled jobs. */
size_t srv_choice_text_end(const srv_choice *ch);
/* Prompt tokens taken from the prefix cache, summed over the prompts (each prompt's first sample);
 * settled jobs. */
long srv_job_cached_tokens(const srv_job *j);
/* A JSON array of ids. */
cJSON *srv_ids_json(const int32_t *ids, int n);
/* vLLM's prompt_logprobs of a choice whose prompt was scored (g.prompt_logprobs >= 0): [null,
 * {"<id>": {"logprob", "rank", "decoded_token"}}, ...]. Read once the choice has a token or finished. */
cJSON *srv_prompt_logprobs_vllm(const srv_job *j, const srv_choice *ch);

int srv_route_completions(srv_state *s, struct mg_connection *c);
int srv_route_chat(srv_state *s, struct mg_connection *c);
/* Engine thread: submits every choice of every job of an inbox list taken from srv_state (or, when
 * stopping, rejects them with 503). A job may be freed by its handler as soon as it is handled, so
 * the list is walked before each job is handed over. */
void srv_jobs_dispatch(srv_state *s, srv_job *list, int stopping);

/* ---- helpers (http.c, text.c) -------------------------------------------------------------------- */

double srv_now(void);        /* monotonic seconds */
double srv_wall(void);       /* wall-clock seconds since the epoch */

/* Writes a complete response (one write: status line, headers, body). */
int srv_send(struct mg_connection *c, int status, const char *content_type, const char *extra_headers,
             const char *body, size_t len);
int srv_send_json(struct mg_connection *c, int status, const cJSON *body);
int srv_send_err(struct mg_connection *c, const srv_err *e);
int srv_send_error(struct mg_connection *c, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
const char *srv_err_type(int status);
cJSON *srv_err_json(const srv_err *e);
/* Reads the whole body (bounded by s->max_body). Returns a malloc'd NUL-terminated buffer, or NULL
 * with e filled (413 too large, 400 truncated, 408 timed out). */
char *srv_read_body(const srv_state *s, struct mg_connection *c, size_t *len, srv_err *e);
/* Reads and parses the body as a JSON object; NULL with e filled. */
cJSON *srv_read_json(const srv_state *s, struct mg_connection *c, srv_err *e);
/* Parses txt[0..len) as one JSON object (400 with e filled otherwise): nesting deeper than
 * MDL_JSON_MAX_DEPTH, a NUL in a string, invalid JSON, another value, or trailing data. */
cJSON *srv_parse_json_object(const char *txt, size_t len, srv_err *e);

/* A growable byte buffer (responses, SSE batches, the metrics page, rendered chat templates). Out of
 * memory sets oom and makes later appends no-ops; the contents stay NUL-terminated. */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} srv_buf;
void srv_buf_add(srv_buf *b, const char *s, size_t n);
void srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* UTF-8. srv_utf8_stable_len: the length of the longest prefix of s[0..n) that does not end inside
 * a sequence that more bytes could still complete (a streaming writer may send that prefix now). */
size_t srv_utf8_stable_len(const char *s, size_t n);
/* 1 when s[0..n) is valid UTF-8. */
int srv_utf8_valid(const char *s, size_t n);
/* A valid UTF-8 copy of s[0..n) (each invalid or truncated sequence, and NUL, -> U+FFFD), malloc'd. */
char *srv_utf8_sanitize(const char *s, size_t n, size_t *out_len);
/* cJSON string from bytes (invalid UTF-8 -> U+FFFD; NUL kept, written as \u0000 through a raw item).
 * NULL on OOM. */
cJSON *srv_json_bytes(const char *s, size_t n);

/* Server-sent events, shared by the streaming dialects. */
typedef struct {
    struct mg_connection *c;
    int chunked; /* HTTP/1.1: Transfer-Encoding: chunked; HTTP/1.0: raw until close */
    int broken;  /* a write failed: the client is gone */
} srv_sse;
/* Writes the 200 text/event-stream head. */
void srv_sse_begin(srv_sse *so, struct mg_connection *c);
/* Appends "data: <json>\n\n" and frees o. */
void srv_sse_event(srv_buf *b, cJSON *o);
/* Writes b as one HTTP chunk (one write) and empties it. */
void srv_sse_flush(srv_sse *so, srv_buf *b);
/* Ends the chunked body. */
void srv_sse_end(srv_sse *so);

/* Streaming: what one choice shows so far, kept by the handler between snapshots. */
typedef struct {
    srv_buf text; /* the visible text (stop-string prefixes and incomplete UTF-8 held back, as the
                     OpenAI stream does; everything once finished) */
    int n_pub;    /* tokens published: r.out_tokens / out_logprobs / out_top / tok_end below it are final */
    int finished; /* r.finish, r.stop_token, stop_idx, r.versions are final */
} srv_choice_view;
/* Brings every view (j->n_ch of them) up to date under j->mu; *seen = the job's event count. Returns 1
 * when any view changed. */
int srv_job_snapshot(srv_job *j, srv_choice_view *v, uint64_t *seen);
/* Waits until the job has an event after `seen`. 0, or ETIMEDOUT at the deadline. */
int srv_job_wait_event(srv_job *j, uint64_t seen, double deadline);

/* Decodes ids to bytes (malloc'd, NUL-terminated; *len bytes). NULL on failure. */
char *srv_decode(const srv_state *s, const int32_t *ids, int n, int skip_special, size_t *len);

/* Constant-time comparison of two byte strings (time depends only on the lengths). */
int srv_ct_equal(const char *a, size_t an, const char *b, size_t bn);

/* Route handlers that live outside oai_run.c. */
int srv_route_health(srv_state *s, struct mg_connection *c);
int srv_route_models(srv_state *s, struct mg_connection *c);
int srv_route_model_one(srv_state *s, struct mg_connection *c); /* GET /v1/models/{id} */
int srv_route_metrics(srv_state *s, struct mg_connection *c);
int srv_route_tokenize(srv_state *s, struct mg_connection *c);
int srv_route_detokenize(srv_state *s, struct mg_connection *c);

/* ---- dialects (dialect_*.c): framework-native routes over the same jobs --------------------------- */
void srv_dialect_sglang_routes(srv_state *s); /* SGLang: /generate, /abort_request, server and model info */
void srv_dialect_vllm_routes(srv_state *s);   /* vLLM tokens in / tokens out: /inference/v1/generate */
void srv_dialect_trl_routes(srv_state *s);    /* TRL `trl vllm-serve`: /health/, /generate/, /chat/, ... */

/* The shared translation of a dialect's sampling fields onto srv_gen: each {dialect name, canonical
 * name} pair copies src[dialect name] into canon[canonical name] (canonical = the /v1/completions
 * field srv_parse_gen reads), then srv_parse_gen validates and fills g. On an error, e names the
 * dialect's field again. canon is consumed. */
typedef struct {
    const char *from, *to;
} srv_field_map;
int srv_parse_mapped(const srv_state *s, cJSON *canon, const cJSON *src, const srv_field_map *map, int n_map,
                     srv_gen *g, srv_err *e);
/* Renames the canonical field `to` back to the dialect's `from` in e (param and message). */
void srv_err_rename(srv_err *e, const srv_field_map *map, int n_map);

/* ---- weights (weights_api.c; the dialects' routes: weights_vllm.c, weights_sglang.c, weights_gpu.c) - */
void srv_weights_init(srv_state *s);
void srv_weights_destroy(srv_state *s);
void srv_weights_routes(srv_state *s);
/* Engine thread: runs the admin commands that are ready (a "wait" pause runs once nothing runs or
 * its drain deadline passed); publishes the weight state. Returns 1 when a command still waits for
 * running requests to drain (the engine must keep stepping). */
int srv_cmds_run(srv_state *s, int stopping);
void srv_weights_publish(srv_state *s);
/* Engine thread: seconds until the open weight session times out (<= 0: now), or -1 when no
 * session is open or the timeout is off. */
double srv_weights_session_due(srv_state *s);
/* Engine thread: aborts the open session when it has timed out (as POST /v1/weights/abort would),
 * logs it to stderr and counts it. */
void srv_weights_expire(srv_state *s);
/* 1 while generation must not step (a session is open or /pause is in effect). */
int srv_engine_frozen(srv_state *s);
/* The "weight_version" of a response whose tokens came from versions[0..n) (numbers): the version
 * string when there is one, else a list of them (tokens kept across a "keep" update). */
cJSON *srv_weight_version_json(srv_state *s, const uint64_t *versions, int n);

#endif
