/* server/weights/weights_api.h — what the weight-route files share (weights_api.c, weights_vllm.c,
 * weights_sglang.c, weights_trl.c, weights_gpu.c): the admin command (srv_cmd) the handler threads
 * hand to the engine thread, and the helpers every dialect builds its routes from.
 *
 *   weights_api.c     the engine-thread command runner, publishing, the session timeout, the native
 *                     /v1/weights/... routes, disk confinement, and the helpers below (commands, bodies,
 *                     versions, begin, load, checksums, pause)
 *   weights_vllm.c    vLLM's routes (/pause, /start_weight_update, /update_weights, ...)
 *   weights_sglang.c  SGLang's routes (/update_weights_from_disk, /pause_generation, ...)
 *   weights_trl.c     TRL vllm-serve's weight routes (/init_communicator/, /update_named_param/, ...)
 *   weights_areal.c   AReaL's vLLM server routes (/areal_update_weights, /areal_pause_generation, ...)
 *   weights_gpu.c     the GPU transports: NCCL / CUDA-IPC body parsing, their engine-side commands,
 *                     the IPC routes
 *   pull.c            replicas that join with the live weights: /v1/weights/export, /v1/weights/pull,
 *                     serve --weights-from
 *
 * A route handler (a civetweb thread) parses and validates its input into a srv_cmd, submits it
 * (srv_cmd_submit: queued for the engine thread, which runs it between steps) and answers from the
 * command's result. Handlers never touch the engine (srv.h).
 */
#ifndef GS_SRV_WEIGHTS_INTERNAL_H
#define GS_SRV_WEIGHTS_INTERNAL_H

#include <limits.h>

#include "engine/backend/transport_cuda.h"
#include "engine/weights.h"
#include "server/core/srv.h"
#include "server/weights/weights.h"
#include "server/rendezvous/tcpstore.h"

typedef enum {
    SRV_CMD_BEGIN,
    SRV_CMD_BUCKET,
    SRV_CMD_FINISH,
    SRV_CMD_ABORT,
    SRV_CMD_LOAD,
    SRV_CMD_HOST_UPDATE,  /* begin + one bucket of host tensors + finish (dialects/sglang_tensor.c) */
    SRV_CMD_CHECKSUMS,
    SRV_CMD_RESET_PREFIX,
    SRV_CMD_PAUSE,
    SRV_CMD_RESUME,
    SRV_CMD_SET_VERSION,
    SRV_CMD_NCCL_INIT,    /* /init_weight_transfer_engine, /init_weights_update_group */
    SRV_CMD_NCCL_BUCKET,  /* /update_weights (vLLM, in an open session) */
    SRV_CMD_NCCL_UPDATE,  /* /update_weights_from_distributed (SGLang: begin + bucket + finish) */
    SRV_CMD_NCCL_DESTROY, /* /destroy_weights_update_group */
    SRV_CMD_IPC_OPEN,     /* /v1/weights/ipc/open */
    SRV_CMD_IPC_BUCKET,   /* /v1/weights/ipc/bucket */
    SRV_CMD_TRL_INIT,     /* /init_communicator/: the id made, the store hosted (weights_trl.c) */
    SRV_CMD_TRL_COMM,     /* ... then the communicator (detached: the trainer joins after the answer) */
    SRV_CMD_TRL_CHECK,    /* /update_named_param/: the session (begun if none), the tensor checked */
    SRV_CMD_TRL_PARAM,    /* ... then its broadcast received, written, the barrier (detached) */
    SRV_CMD_TRL_FINISH,   /* /reset_prefix_cache/: the TRL session finished (one hook) */
    SRV_CMD_TRL_CLOSE,    /* /close_communicator/: finish, communicator and store gone */
    SRV_CMD_WRESET,       /* /weights_checker reset_tensors (checker.c: eng_weights_reset) */
    SRV_CMD_PRIMERL_UPDATE, /* prime-rl's /update_weights in broadcaster mode: its whole framed stream */
    SRV_CMD_EXPORT,       /* GET /v1/weights/export: the checkpoint tensors copied out (pull.c, c->run) */
} srv_cmd_kind;

/* Tensor metadata of a GPU-transport bucket: names / dtypes / shapes and each tensor's byte offset
 * in the device buffer (IPC: given by the trainer; NCCL: laid out by the engine thread as it
 * receives, see weights_gpu.c). data is NULL until the engine thread points it into device memory.
 *
 * NCCL framing, how the trainer's broadcasts carry the tensors (in order): broadcast k carries
 * tensors [k ? frame_end[k-1] : 0, frame_end[k]) back to back with no padding (vLLM's packed
 * chunks, SGLang's flattened_bucket); nframes 0 means one broadcast per tensor (vLLM unpacked,
 * SGLang's default, AReaL, TRL). */
typedef struct {
    mdl_st_tensor *t;
    uint64_t *off;
    uint64_t *roff; /* NCCL: where tensor i is received (off[i] unless it must move to be aligned) */
    size_t n;
    uint64_t total; /* bytes the buffer must hold: max(off + nbytes) */
    size_t *frame_end;
    size_t nframes;
} srv_gpu_meta;

struct srv_cmd {
    srv_cmd_kind kind;
    /* arguments */
    int full;
    eng_wmodel which;
    eng_pause pause;
    char version[128];
    char path[PATH_MAX], draft_path[PATH_MAX];
    const mdl_st_tensor *tensors;
    size_t n_tensors;
    char what[64];
    int draft; /* checksums of the drafter */
    int ckpt_names; /* checksums by checkpoint tensor name (eng_weights_checksums_ckpt) */
    mdl_dtype hash_dt; /* result: the dtype checkpoint-name hashes are taken in */
    /* GPU transports */
    srv_gpu_meta meta;
    unsigned char blob[GS_NCCL_ID_BYTES]; /* NCCL unique id or CUDA IPC handle */
    size_t blob_len;
    int rank, world;
    size_t staging_req; /* 0: default */
    double timeout;     /* 0: default */
    char group[128];
    int warmup;         /* run the warm-up all_reduce after the communicator init (vLLM) */
    int root;           /* NCCL_INIT: the rank the group's weights come from (0; TRL: world - 1) */
    int rendezvous;     /* no nccl_unique_id_b64: the id comes from the trainer's TCPStore */
    char master_addr[256];
    int master_port;
    size_t ipc_offset, ipc_bytes;
    const char *const *skip; /* WRESET: names containing one of these are not reset */
    int n_skip, n_reset;     /* ... and the tensors it wrote */
    /* drain state (wait mode) */
    int draining;
    double deadline;
    int detached;       /* srv_cmd_post: nobody waits; the engine thread logs a failure and frees it */
    /* a dialect's command (SRV_CMD_TRL_*, SRV_CMD_PRIMERL_UPDATE): its engine-thread side, which the
     * runner calls; *st its HTTP status. Set by the route that makes the command. */
    void (*run)(srv_state *s, srv_cmd *c, int *st);
    /* results */
    int done, status;
    char err[1024];
    uint64_t session;
    int aborted_requests, paused_requests;
    cJSON *result;
    pthread_cond_t cv;
    srv_cmd *next;
};

/* ---- commands (weights_api.c) ------------------------------------------------------------------- */

srv_cmd *srv_cmd_new(srv_cmd_kind k); /* zeroed; NULL on OOM */
/* Declares srv_cmd *c of kind k, answering 500 (out of memory) from the route when it cannot. */
#define SRV_NEW_CMD(c, k)                                                                              \
    srv_cmd *c = srv_cmd_new(k);                                                                       \
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory")
/* Queues c for the engine thread and waits for it. Returns c->status. */
int srv_cmd_submit(srv_state *s, srv_cmd *c);
/* Queues c for the engine thread without waiting (for a command that must run after the answer:
 * TRL's trainer broadcasts only once /update_named_param/ has answered). The engine thread owns c
 * from here: it logs a failure on stderr and frees c (and its meta). Commands run in queue order. */
void srv_cmd_post(srv_state *s, srv_cmd *c);
/* The answer of a finished command: ok_body (taken) with 200, else the error (409: "conflict"). */
int srv_cmd_send_result(struct mg_connection *conn, srv_cmd *c, cJSON *ok_body);
/* A command without arguments but a version; answers ok (taken) on success. */
int srv_cmd_simple(srv_state *s, struct mg_connection *conn, srv_cmd_kind k, const char *version, cJSON *ok);

/* ---- bodies and fields (weights_api.c) ---------------------------------------------------------- */

/* A JSON object body, where an empty (or whitespace-only) body means {}. NULL with e filled. */
cJSON *srv_read_json_opt(srv_state *s, struct mg_connection *c, srv_err *e);
/* An optional string field (a number gives its text); at most 127 bytes. */
int srv_opt_string(const cJSON *b, const char *key, const char **out, srv_err *e);
/* srv_opt_string for a version name: printable UTF-8 (no control characters), at most 127 bytes. */
int srv_opt_version(const cJSON *b, const char *key, const char **out, srv_err *e);
/* mode / model / pause / version (or weight_version) of a begin-like body into c. */
int srv_parse_begin(const cJSON *b, srv_cmd *c, eng_wmodel dflt_model, srv_err *e);
/* The published weight state as GET /v1/weights answers it. */
cJSON *srv_weights_info_json(srv_state *s);

/* ---- shared operations (weights_api.c) ---------------------------------------------------------- */

/* How a disk load reads its pause mode and answers. */
typedef enum {
    SRV_LOAD_NATIVE,  /* "pause" (default wait); answers GET /v1/weights */
    SRV_LOAD_SGLANG,  /* abort_all_requests -> abort, else wait; {success, message, num_paused_requests} */
    SRV_LOAD_PRIMERL, /* "pause" (default keep: prime-rl has paused with mode=keep); {"status": "ok"} */
    SRV_LOAD_AREAL,   /* "pause" (default abort, as AReaL's server); stays paused; {success, message} */
} srv_load_style;
/* A disk load of the folder b[path_key] (confined to --weights-root) as one session. */
int srv_weights_load(srv_state *s, struct mg_connection *conn, const cJSON *b, const char *path_key,
                     srv_load_style style);
/* Runs a checksums command (*out: the command, to free; *tensors: its name -> hex object). On OOM
 * answers 500 itself and leaves *out NULL. Returns the command's status. */
int srv_weights_checksums(srv_state *s, struct mg_connection *conn, int draft, int ckpt_names, cJSON **tensors,
                          srv_cmd **out);
/* "names": NULL / "internal" -> 0, "checkpoint" -> 1, else -1. */
int srv_weights_parse_names(const char *v);
/* The fields that say how the hashes of a checksums answer are defined. */
void srv_weights_hash_fields(cJSON *o, const srv_cmd *c);
/* Pauses generation: mode abort | wait | keep (SGLang's retract / in_place: keep). */
int srv_weights_pause(srv_state *s, struct mg_connection *conn, const char *mode);

/* Routes more than one dialect serves (weights_api.c). */
int srv_wroute_begin_model(srv_state *s, struct mg_connection *conn, eng_wmodel dflt);
int srv_wroute_begin(srv_state *s, struct mg_connection *conn);          /* target model */
int srv_wroute_finish(srv_state *s, struct mg_connection *conn);
int srv_wroute_checker(srv_state *s, struct mg_connection *conn); /* /weight_checker, /weights_checker (checker.c) */
int srv_wroute_reset_prefix(srv_state *s, struct mg_connection *conn);   /* {"success": true} */
int srv_wroute_pause(srv_state *s, struct mg_connection *conn);          /* ?mode= or {"mode"} */
int srv_wroute_resume(srv_state *s, struct mg_connection *conn);
int srv_wroute_weight_version(srv_state *s, struct mg_connection *conn); /* {"weight_version"} */

/* ---- GPU transports (weights_gpu.c) ------------------------------------------------------------- */

#define SRV_GPU_NEEDS_CUDA                                                                             \
    "this route receives weights over NCCL / CUDA IPC, which need the CUDA backend (this server runs " \
    "--backend cpu, or was built without CUDA); use POST /v1/weights/bucket (HTTP) or /v1/weights/load (disk)"

/* 1 when the backend is CUDA with the transport table (NCCL / IPC routes can work). */
int srv_gpu_available(const srv_state *s);
/* Engine thread: runs an SRV_CMD_NCCL_* / SRV_CMD_IPC_* command; *st its HTTP status. */
void srv_gpu_cmd_run(srv_state *s, srv_cmd *c, int *st);
/* The CUDA module's transport table; NULL on the CPU backend. */
const gs_gpu_transport *srv_gpu_xport(const srv_state *s);
/* Seconds an NCCL step (communicator init, a broadcast, a store wait) may take: req when > 0, else
 * the group's timeout_s (s may be NULL: handler threads), else GRAPHSWAP_NCCL_TIMEOUT_S, else 300;
 * at most a day. */
double srv_nccl_timeout_s(const srv_state *s, double req);
/* Engine thread, the NCCL steps the TRL commands reuse: create the group of c (rank, world, root,
 * warm-up; 200 / 4xx / 5xx in *st), receive one bucket of c->meta into the open session (validated
 * first; a refused bucket's bytes are still received, so both sides stay in step), and drop the
 * group. */
int srv_gpu_nccl_init(srv_state *s, srv_cmd *c, int *st);
int srv_gpu_nccl_bucket(srv_state *s, srv_cmd *c, int *st);
void srv_gpu_nccl_release(srv_state *s);
/* Engine thread, prime-rl's in-band framing (weights_primerl.c): receive one broadcast of `bytes`
 * bytes (at most the staging's) from the group's root into the staging and download it into host
 * (0, or -1 with c->err and *st 502, the communicator released; 500 without a group or when bytes
 * exceed the staging); receive and drop the broadcasts of
 * c->meta (as a refused bucket: a failure appends to c->err and releases the communicator). */
int srv_gpu_nccl_recv_host(srv_state *s, srv_cmd *c, void *host, size_t bytes, int *st);
void srv_gpu_nccl_drain(srv_state *s, srv_cmd *c);
/* Engine thread: unmaps the CUDA-IPC buffer of the session (at finish / abort / timeout). */
void srv_gpu_ipc_release(srv_state *s);
/* Parses names / dtypes / shapes (and, for IPC, offsets) of obj. pfx prefixes the field names in
 * messages ("update_info."). offsets_key NULL: NCCL packing (256-byte aligned, in order). */
int srv_gpu_meta_parse(const cJSON *obj, const char *pfx, const char *names_key, const char *dtypes_key,
                       const char *offsets_key, srv_gpu_meta *m, srv_err *e);
void srv_gpu_meta_free(srv_gpu_meta *m);
/* NCCL framing of m (see srv_gpu_meta): vLLM's packed chunks — a broadcast takes tensors until its
 * bytes exceed chunk_bytes (the tensor that crosses it included; vLLM's pack_tensors) —, or with
 * chunk_bytes UINT64_MAX one broadcast of all (SGLang's flattened_bucket). 0, or -1 on OOM (e). */
int srv_gpu_meta_chunks(srv_gpu_meta *m, uint64_t chunk_bytes, srv_err *e);
/* vLLM's update_info {names, dtype_names, shapes[, packed, packed_buffer_size_bytes,
 * packed_num_buffers]} into m, framed as vLLM's NCCLWeightTransferEngine sends it: packed, its
 * chunks; else one broadcast per tensor. pfx prefixes the fields in messages. */
int srv_gpu_meta_parse_vllm(const cJSON *ui, const char *pfx, srv_gpu_meta *m, srv_err *e);
/* The bytes of staging the largest broadcast of m needs (with its realignment room); 0 when m has
 * no tensor. A bucket whose largest broadcast needs more than the staging cannot be received. */
uint64_t srv_gpu_meta_frame_need(const srv_gpu_meta *m);
/* The number of broadcasts of m, and the staging layout of broadcasts [k0, k1) from offset 0
 * (engine thread, as it receives; exposed for the fuzz harness): each broadcast at a multiple of 256,
 * its tensors back to back (roff); a tensor whose roff is not a multiple of its dtype size gets an
 * aligned off after the broadcasts (else off = roff). Returns the bytes used. */
size_t srv_gpu_meta_frames(const srv_gpu_meta *m);
uint64_t srv_gpu_meta_layout(srv_gpu_meta *m, size_t k0, size_t k1);
/* Standard or URL-safe base64 (padding optional) into out[0..cap): the decoded length, or -1. */
long srv_b64_decode(const char *in, unsigned char *out, size_t cap);
/* The NCCL group of an init body (init_info of vLLM, the top level of SGLang) into c: with
 * nccl_unique_id_b64 the id itself (c->blob), else master_address + master_port of the trainer's
 * TCPStore (c->rendezvous = 1; the id is fetched by srv_nccl_rendezvous / srv_nccl_store_*). */
int srv_parse_nccl_init(const cJSON *o, const char *pfx, srv_cmd *c, srv_err *e);
/* A whole init body of a framework (SRV_STORE_VLLM: {"init_info": {...}}; SRV_STORE_SGLANG: the
 * fields at the top level plus group_name (required without an id) and backend ("nccl")) into c,
 * c->warmup per srv_store_warmup_allreduce. Network-free: the routes answer 501 after it on the
 * CPU backend. */
int srv_nccl_init_parse(const cJSON *b, srv_store_kind kind, srv_cmd *c, srv_err *e);
/* The NCCL init routes' first steps: the body read and parsed (srv_nccl_init_parse) into a new
 * SRV_CMD_NCCL_INIT, then 501 on the CPU backend. The command, or NULL with e filled. */
srv_cmd *srv_nccl_init_request(srv_state *s, struct mg_connection *conn, srv_store_kind kind, srv_err *e);
/* Handler thread, c->rendezvous: the store rendezvous of c (server/rendezvous/tcpstore.h), bounded by
 * c->timeout (or GRAPHSWAP_NCCL_TIMEOUT_S, or 300 s). Failures: 504 when a deadline passed, else
 * 502, with the rendezvous' message. vLLM: join + fetch + close into c->blob. */
int srv_nccl_rendezvous(srv_cmd *c, srv_store_kind kind, srv_err *e);
/* SGLang's two phases: join at init (*g: the group to keep), fetch at the first update (into
 * c->blob; g stays open: close it with srv_store_group_close). */
int srv_nccl_store_join(srv_cmd *c, srv_store_group **g, srv_err *e);
int srv_nccl_store_fetch(srv_store_group *g, srv_cmd *c, srv_err *e);
/* An integer field of o in [lo, hi] (a number, or a string of one); required or (dflt when absent). */
int srv_json_int(const cJSON *o, const char *pfx, const char *key, int required, long long lo, long long hi,
                 long long dflt, long long *out, srv_err *e);

#endif
