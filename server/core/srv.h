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
#include "server/http/http.h"
#include "server/http/log.h"
#include "server/http/metrics.h"

#define SRV_MAX_STOP 8          /* stop strings per request */
#define SRV_MAX_STOP_BYTES 256  /* bytes per stop string */
#define SRV_MAX_N 16            /* samples per prompt */
#define SRV_MAX_CACHE_SALT 1024 /* bytes of a cache_salt */

typedef struct srv_job srv_job;
typedef struct srv_cmd srv_cmd;
typedef struct srv_closure srv_closure;

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
    srv_http http;           /* router, keys, body limits (server/http/http.h) */
    double request_timeout;  /* seconds */
    int max_choices;         /* engine requests per HTTP request (prompts x n) */
    uint64_t seed_base;      /* per-process randomness for unseeded requests */
    double t_start;          /* wall clock at start (for "created") */

    pthread_mutex_t mu;      /* inbox + stopping */
    pthread_cond_t inbox_cv;
    srv_job *inbox_head, *inbox_tail;
    int stopping;
    /* every submitted generation job of every dialect, for aborts by request id (SGLang's
     * /abort_request); a job is in it from srv_job_submit to srv_job_free */
    pthread_mutex_t jobs_mu;
    srv_job *jobs;

    _Atomic uint64_t next_id;
    srv_metrics met;

    /* weight updates and admin commands (weights_*.c). Commands are closures run by the engine
     * thread in arrival order; the list is guarded by `mu`. */
    srv_cmd *cmd_head, *cmd_tail;
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
    /* engine thread, before the session timeout is looked at: a dialect's own way to end its open
     * session (TRL: dialects/trl_weights.c); returns 1 when it handled an expired one. NULL: none */
    int (*w_settle)(srv_state *s, int expired);
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
    cJSON *wsnap;               /* weights_checker's last snapshot (checker.c), under wmu */
    /* engine closures (serve.c srv_engine_call), guarded by `mu` */
    srv_closure *clo_head, *clo_tail;
    int prompt_tokens_details;  /* --enable-prompt-tokens-details (vLLM): usage.prompt_tokens_details
                                   {cached_tokens} when some prompt tokens came from the prefix cache */
    /* memory release (memory_api.c) */
    int weights_cpu_backup;     /* --enable-weights-cpu-backup: SGLang's release keeps a host copy of
                                   the weights (sleep level 1) instead of discarding them (level 2) */
    atomic_uint mem_asleep_pub; /* eng_is_sleeping, published by the engine thread */
    int memory_saver;           /* --enable-memory-saver (SGLang's flag): reported as server_info's
                                   enable_memory_saver, which slime checks against its
                                   --offload-rollout; the release routes work either way */
    /* replicas that join with the live weights (weights/pull.c): POST /v1/weights/pull and
     * serve --weights-from */
    atomic_int pull_busy;       /* a pull is under way (one at a time: another one answers 409) */
    atomic_int pull_pending;    /* --weights-from: 1 until its start-up pull succeeded; meanwhile
                                   generation answers 503, /health?ready=1 503 and the export 503 */
    char pull_reason[512];      /* under wmu: what those answers say while pull_pending */
    struct srv_pull_boot *pull_boot; /* the start-up pull's thread (pull.c); NULL: none */
};

/* ---- engine closures (closures.c) ------------------------------------------------------------------
 * The generic way for a handler thread to run code on the engine thread, which alone touches the
 * engine: fill fn and arg, call srv_engine_call. It queues the closure, wakes the engine thread and
 * waits until fn(s, arg) ran there (between steps, after the inbox and the admin commands, in
 * arrival order among closures). Returns 0, or -1 when the server is shutting down (fn not run). */
struct srv_closure {
    void (*fn)(srv_state *s, void *arg);
    void *arg;
    /* serve.c */
    int done, ran;
    int abandoned; /* srv_engine_ping timed out: the engine thread frees the closure (heap) */
    pthread_cond_t cv;
    srv_closure *next;
};
int srv_engine_call(srv_state *s, srv_closure *c);
/* Liveness: a no-op closure the engine thread must service within timeout_s seconds. Returns 0
 * when it did, 1 on a timeout (the engine is stuck in a step, or not looping), -1 when the server is
 * shutting down or out of memory. Never blocks past the timeout: on one, the closure is left to the
 * engine thread to free, so the handler can answer (prime-rl's /liveness: 503 "engine_unresponsive"). */
int srv_engine_ping(srv_state *s, double timeout_s);
/* Engine thread: runs (or, when stopping, drops) every queued closure. */
void srv_closures_run(srv_state *s, int stopping);

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
 * shutting down, or while serve --weights-from has not pulled its weights yet; the job was not
 * submitted and the caller frees it). */
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
/* Alternatives the engine reports per prompt token: the larger of echo+logprobs' count and
 * prompt_logprobs; -1: the prompt is not scored. */
int srv_gen_prompt_top(const srv_gen *g);
/* The visible end of a choice's text while it streams (stop-string prefixes and an incomplete
 * UTF-8 tail held back; never before what was already sent). Caller holds j->mu. */
size_t srv_choice_visible_end(const srv_job *j, const srv_choice *ch);
/* A JSON array of ids. */
cJSON *srv_ids_json(const int32_t *ids, int n);

/* Engine thread: submits every choice of every job of an inbox list taken from srv_state (or, when
 * stopping, rejects them with 503). A job may be freed by its handler as soon as it is handled, so
 * the list is walked before each job is handed over. */
void srv_jobs_dispatch(srv_state *s, srv_job *list, int stopping);

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

/* The "weight_version" of a response whose tokens came from versions[0..n) (numbers): the version
 * string when there is one, else a list of them (tokens kept across a "keep" update). */
cJSON *srv_weight_version_json(srv_state *s, const uint64_t *versions, int n);


#endif
