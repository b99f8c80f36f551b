/* server/weights_api.c — the weight-update API over HTTP (native, vLLM and SGLang routes), disk
 * loads, checksums, pause / resume.
 *
 * Every route is a thin producer: handler threads validate input (JSON bodies, safetensors headers
 * of buckets, paths) and hand a command to the engine thread, which alone touches the engine
 * (engine/weights.h: begin -> bucket* -> finish | abort). A transport only produces
 * (name, dtype, shape, bytes); the NCCL and CUDA-IPC transports of the CUDA backend plug into the
 * same commands.
 *
 * Commands run in arrival order on the engine thread between steps. A "wait" begin (or /pause with
 * mode=wait) first stops admission and lets running requests finish, bounded by --drain-timeout;
 * what still runs then is aborted. While a session is open or generation is paused, the engine does
 * not step (I7); requests queue.
 *
 * Bucket bodies (application/octet-stream safetensors) stream into one staging buffer reused by
 * every bucket of every session (bucket_mu: one upload at a time), bounded by --max-bucket-bytes.
 * It keeps the size of the largest bucket seen: resident memory is flat across updates, and
 * no update pays for page-faulting a fresh buffer (measured: 512 MiB buckets 2.8 GB/s with a
 * buffer per session, 6.7 GB/s reused).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/transport_cuda.h"
#include "engine/weights.h"
#include "server/srv.h"

typedef enum {
    CMD_BEGIN,
    CMD_BUCKET,
    CMD_FINISH,
    CMD_ABORT,
    CMD_LOAD,
    CMD_CHECKSUMS,
    CMD_RESET_PREFIX,
    CMD_PAUSE,
    CMD_RESUME,
    CMD_SET_VERSION,
    CMD_NCCL_INIT,    /* /init_weight_transfer_engine, /init_weights_update_group */
    CMD_NCCL_BUCKET,  /* /update_weights (vLLM, in an open session) */
    CMD_NCCL_UPDATE,  /* /update_weights_from_distributed (SGLang: begin + bucket + finish) */
    CMD_NCCL_DESTROY, /* /destroy_weights_update_group */
    CMD_IPC_OPEN,     /* /v1/weights/ipc/open */
    CMD_IPC_BUCKET,   /* /v1/weights/ipc/bucket */
} cmd_kind;

/* Tensor metadata of a GPU-transport bucket: names / dtypes / shapes and each tensor's byte offset
 * in the device buffer (NCCL: packed by gpu_pack; IPC: given by the trainer). data is NULL until
 * the engine thread points it into device memory. */
typedef struct {
    mdl_st_tensor *t;
    uint64_t *off;
    size_t n;
    uint64_t total; /* bytes the buffer must hold: max(off + nbytes) */
} gpu_meta;

struct srv_cmd {
    cmd_kind kind;
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
    /* GPU transports */
    gpu_meta meta;
    unsigned char blob[GS_NCCL_ID_BYTES]; /* NCCL unique id or CUDA IPC handle */
    size_t blob_len;
    int rank, world;
    size_t staging_req; /* 0: default */
    double timeout;     /* 0: default */
    char group[128];
    size_t ipc_offset, ipc_bytes;
    /* drain state (wait mode) */
    int draining;
    double deadline;
    /* results */
    int done, status;
    char err[1024];
    uint64_t session;
    int aborted_requests, paused_requests;
    cJSON *result;
    pthread_cond_t cv;
    srv_cmd *next;
};

/* ---- engine thread -------------------------------------------------------------------------------- */

static void publish_version_name(srv_state *s, const eng_weights_info *w)
{
    snprintf(s->vname[w->version_num % 64], sizeof s->vname[0], "%s", w->version);
}

void srv_weights_publish(srv_state *s)
{
    eng_weights_info w;
    eng_weights_get_info(s->rt.e, &w);
    pthread_mutex_lock(&s->wmu);
    s->wpub = w;
    publish_version_name(s, &w);
    s->is_paused_pub = s->paused;
    pthread_mutex_unlock(&s->wmu);
}

int srv_engine_frozen(srv_state *s) { return s->paused || eng_weights_state(s->rt.e) == ENG_W_UPDATING; }

static void add_sum(const char *name, const char *hex, void *u) { cJSON_AddStringToObject(u, name, hex); }

static void abort_running(srv_state *s, srv_cmd *c)
{
    int n = eng_num_running(s->rt.e);
    eng_engine *e = s->rt.e;
    /* eng_abort_all would also end queued requests; a pause ends only what runs */
    c->aborted_requests += n;
    eng_abort_running(e);
}

/* ---- GPU transports, engine side ------------------------------------------------------------------ */

#define GPU_NEEDS_CUDA                                                                                 \
    "this route receives weights over NCCL / CUDA IPC, which need the CUDA backend (this server runs " \
    "--backend cpu, or was built without CUDA); use POST /v1/weights/bucket (HTTP) or /v1/weights/load (disk)"

/* The CUDA module's transport table; NULL on the CPU backend. */
static const gs_gpu_transport *gpu_xport(const srv_state *s)
{
    if (!s->rt.be || strcmp(s->rt.be->ops->name, "cuda") != 0) return NULL;
    const gs_gpu_transport *(*get)(void);
    *(void **)&get = srv_cuda_symbol("gs_gpu_transport_table");
    const gs_gpu_transport *t = get ? get() : NULL;
    return t && t->abi == GS_GPU_TRANSPORT_ABI ? t : NULL;
}

static double gpu_timeout(const srv_state *s, const srv_cmd *c)
{
    if (c->timeout > 0) return c->timeout;
    if (s->nccl_timeout > 0) return s->nccl_timeout;
    const char *v = getenv("GRAPHSWAP_NCCL_TIMEOUT_S");
    double t = v ? strtod(v, NULL) : 0;
    return t > 0 ? t : 300.0;
}

static void ipc_release(srv_state *s)
{
    const gs_gpu_transport *x = gpu_xport(s);
    if (s->ipc_base && x) x->ipc_close(s->rt.be, s->ipc_base);
    s->ipc_base = NULL;
    s->ipc_bytes = s->ipc_offset = 0;
}

static void nccl_release(srv_state *s)
{
    const gs_gpu_transport *x = gpu_xport(s);
    if (s->nccl && x) x->nccl_destroy(s->nccl);
    s->nccl = NULL;
    s->nccl_group[0] = 0;
    s->nccl_rank = s->nccl_world = 0;
}

/* Points every tensor of the metadata into the device buffer base. */
static void gpu_meta_bind(gpu_meta *m, const uint8_t *base)
{
    for (size_t i = 0; i < m->n; i++) m->t[i].data = base + m->off[i];
}

/* Receives one broadcast into the staging buffer (the bytes of a bucket the engine refused, so the
 * trainer's broadcast still completes and both sides stay in step). Appends to err on failure. */
static void nccl_drain(srv_state *s, const gs_gpu_transport *x, srv_cmd *c)
{
    if (!x || !s->nccl || c->meta.total > s->nccl_staging_bytes) return;
    char e2[512];
    if (x->nccl_recv(s->nccl, s->nccl_staging, c->meta.total, gpu_timeout(s, c), e2, sizeof e2) != 0) {
        size_t l = strlen(c->err);
        snprintf(c->err + l, sizeof c->err - l, "; receiving its bytes also failed: %s", e2);
    }
}

/* /update_weights: validate against the model -> receive one broadcast -> device write. */
static int nccl_bucket(srv_state *s, srv_cmd *c, int *st)
{
    eng_engine *e = s->rt.e;
    const gs_gpu_transport *x = gpu_xport(s);
    char *err = c->err;
    const size_t el = sizeof c->err;
    snprintf(c->what, sizeof c->what, "nccl bucket %llu", (unsigned long long)++s->n_gpu_buckets);
    if (eng_weights_validate(e, c->meta.t, c->meta.n, c->what, err, el, st) != 0) {
        nccl_drain(s, x, c);
        return -1;
    }
    if (!x) return snprintf(err, el, "%s", GPU_NEEDS_CUDA), *st = 501, -1;
    if (!x->have_nccl)
        return snprintf(err, el, "this server's CUDA module was built without NCCL"), *st = 501, -1;
    if (!s->nccl)
        return snprintf(err, el, "no NCCL group: POST /init_weight_transfer_engine (vLLM) or "
                                 "/init_weights_update_group (SGLang) first"), *st = 409, -1;
    if (c->meta.total > s->nccl_staging_bytes)
        return snprintf(err, el, "%s: %llu bytes is larger than the NCCL staging buffer (%zu bytes): split the "
                                 "bucket", c->what, (unsigned long long)c->meta.total, s->nccl_staging_bytes),
               *st = 400, -1;
    if (x->nccl_recv(s->nccl, s->nccl_staging, c->meta.total, gpu_timeout(s, c), err, el) != 0) {
        *st = 502; /* the communicator is aborted: destroy and init again */
        nccl_release(s);
        return -1;
    }
    gpu_meta_bind(&c->meta, s->nccl_staging);
    if (eng_weights_bucket_device(e, c->meta.t, c->meta.n, c->what, err, el, st) != 0) return -1;
    *st = 200;
    return 0;
}

static int nccl_init_cmd(srv_state *s, srv_cmd *c, int *st)
{
    const gs_gpu_transport *x = gpu_xport(s);
    char *err = c->err;
    const size_t el = sizeof c->err;
    if (!x) return snprintf(err, el, "%s", GPU_NEEDS_CUDA), *st = 501, -1;
    if (!x->have_nccl)
        return snprintf(err, el, "this server's CUDA module was built without NCCL"), *st = 501, -1;
    if (s->nccl)
        return snprintf(err, el, "an NCCL group (rank %d of %d) already exists: POST /destroy_weights_update_group "
                                 "first", s->nccl_rank, s->nccl_world), *st = 409, -1;
    size_t want = c->staging_req;
    if (!want) {
        const char *v = getenv("GRAPHSWAP_NCCL_STAGING_BYTES");
        want = v ? (size_t)strtoull(v, NULL, 10) : 0;
    }
    if (!want || want > s->max_bucket) want = s->max_bucket;
    /* one device staging buffer for the life of the process: every bucket of every group reuses it
     * (arena memory is never handed out twice, so it is not freed with the group) */
    if (!s->nccl_staging) {
        s->nccl_staging = s->rt.be->ops->alloc(s->rt.be, want, "nccl.staging");
        if (!s->nccl_staging)
            return snprintf(err, el, "cannot allocate %zu bytes of NCCL staging from the GPU arena (give a smaller "
                                     "staging_bytes, or more --gpu-memory-mb)", want), *st = 507, -1;
        s->nccl_staging_bytes = want;
    }
    s->nccl = x->nccl_init(s->rt.be, c->blob, c->blob_len, c->rank, c->world, gpu_timeout(s, c), err, el);
    if (!s->nccl) return *st = 502, -1;
    s->nccl_rank = c->rank;
    s->nccl_world = c->world;
    snprintf(s->nccl_group, sizeof s->nccl_group, "%s", c->group);
    if (c->timeout > 0) s->nccl_timeout = c->timeout;
    c->result = cJSON_CreateObject();
    cJSON_AddBoolToObject(c->result, "success", 1);
    cJSON_AddStringToObject(c->result, "message", "NCCL group initialized");
    cJSON_AddNumberToObject(c->result, "rank", c->rank);
    cJSON_AddNumberToObject(c->result, "world_size", c->world);
    cJSON_AddNumberToObject(c->result, "staging_bytes", (double)s->nccl_staging_bytes);
    cJSON_AddNumberToObject(c->result, "alignment", 256);
    *st = 200;
    return 0;
}

/* /update_weights_from_distributed: one partial session around one bucket. */
static int nccl_update(srv_state *s, srv_cmd *c, int *st)
{
    eng_engine *e = s->rt.e;
    char *err = c->err;
    const size_t el = sizeof c->err;
    const gs_gpu_transport *x = gpu_xport(s);
    if (!x) return snprintf(err, el, "%s", GPU_NEEDS_CUDA), *st = 501, -1;
    if (!s->nccl)
        return snprintf(err, el, "no NCCL group: POST /init_weights_update_group first"), *st = 409, -1;
    if (eng_weights_begin(e, 0, ENG_WMODEL_TARGET, c->pause, c->version, &c->session, err, el, st) != 0) {
        nccl_drain(s, x, c);
        return -1;
    }
    s->paused = 0;
    if (nccl_bucket(s, c, st) != 0) {
        int st2;
        char e2[64];
        eng_weights_abort(e, e2, sizeof e2, &st2);
        return -1;
    }
    if (eng_weights_finish(e, c->version, err, el, st) != 0) return -1;
    *st = 200;
    return 0;
}

static int ipc_open_cmd(srv_state *s, srv_cmd *c, int *st)
{
    eng_weights_info wi;
    eng_weights_get_info(s->rt.e, &wi);
    char *err = c->err;
    const size_t el = sizeof c->err;
    const gs_gpu_transport *x = gpu_xport(s);
    if (!wi.session_open)
        return snprintf(err, el, "ipc/open outside a session (state %s): POST /v1/weights/begin first",
                        eng_wstate_name(wi.state)), *st = 409, -1;
    if (!x) return snprintf(err, el, "%s", GPU_NEEDS_CUDA), *st = 501, -1;
    if (s->ipc_base && s->ipc_session == wi.session_id)
        return snprintf(err, el, "a CUDA IPC buffer is already open in this session (it is closed at finish / "
                                 "abort; send every bucket through it)"), *st = 409, -1;
    ipc_release(s); /* a mapping left by an earlier session */
    uint8_t *p = x->ipc_open(s->rt.be, c->blob, c->blob_len, err, el);
    if (!p) return *st = 400, -1;
    s->ipc_base = p;
    s->ipc_offset = c->ipc_offset;
    s->ipc_bytes = c->ipc_bytes;
    s->ipc_session = wi.session_id;
    *st = 200;
    return 0;
}

static int ipc_bucket_cmd(srv_state *s, srv_cmd *c, int *st)
{
    eng_engine *e = s->rt.e;
    char *err = c->err;
    const size_t el = sizeof c->err;
    snprintf(c->what, sizeof c->what, "ipc bucket %llu", (unsigned long long)++s->n_gpu_buckets);
    if (eng_weights_validate(e, c->meta.t, c->meta.n, c->what, err, el, st) != 0) return -1;
    if (!gpu_xport(s)) return snprintf(err, el, "%s", GPU_NEEDS_CUDA), *st = 501, -1;
    eng_weights_info wi;
    eng_weights_get_info(e, &wi);
    if (!s->ipc_base || s->ipc_session != wi.session_id)
        return snprintf(err, el, "no CUDA IPC buffer is open in this session: POST /v1/weights/ipc/open first"),
               *st = 409, -1;
    if (c->meta.total > s->ipc_bytes)
        return snprintf(err, el, "%s: tensors reach byte %llu of an IPC buffer of %zu bytes", c->what,
                        (unsigned long long)c->meta.total, s->ipc_bytes), *st = 400, -1;
    gpu_meta_bind(&c->meta, s->ipc_base + s->ipc_offset);
    if (eng_weights_bucket_device(e, c->meta.t, c->meta.n, c->what, err, el, st) != 0) return -1;
    /* the trainer may overwrite its buffer as soon as this returns */
    s->rt.be->ops->synchronize(s->rt.be);
    *st = 200;
    return 0;
}

/* Runs one command; returns 0 when it must wait (drain), 1 when done. */
static int run_cmd(srv_state *s, srv_cmd *c)
{
    eng_engine *e = s->rt.e;
    int st = 200;
    char *err = c->err;
    const size_t el = sizeof c->err;
    eng_weights_info wi;
    eng_weights_get_info(e, &wi);
    /* (with a session already open or the weights undefined the command fails at once: no drain) */
    const int begins = c->kind == CMD_BEGIN || c->kind == CMD_LOAD || (c->kind == CMD_NCCL_UPDATE && s->nccl);
    if ((begins || c->kind == CMD_PAUSE) && c->pause == ENG_PAUSE_WAIT &&
        !wi.session_open && wi.state != ENG_W_UNDEFINED) {
        /* drain: no admission, running requests finish (bounded); the rest is aborted */
        if (!c->draining) {
            c->draining = 1;
            c->deadline = srv_now() + s->drain_timeout;
            eng_set_admission(e, 0);
        }
        if (eng_num_running(e) > 0 && srv_now() < c->deadline) return 0;
        if (eng_num_running(e) > 0) abort_running(s, c);
        eng_set_admission(e, 1);
    }
    if (begins && !wi.session_open && wi.state != ENG_W_UNDEFINED) {
        if (c->pause == ENG_PAUSE_ABORT) c->aborted_requests += eng_num_running(e); /* begin ends them */
        else c->paused_requests = eng_num_running(e); /* frozen during the session ("wait": none left) */
    }
    switch (c->kind) {
    case CMD_BEGIN:
        if (eng_weights_begin(e, c->full, c->which, c->pause, c->version, &c->session, err, el, &st) == 0) {
            st = 200;
            s->paused = 0;
        }
        break;
    case CMD_BUCKET:
        if (eng_weights_bucket(e, c->tensors, c->n_tensors, c->what, err, el, &st) == 0) st = 200;
        break;
    case CMD_FINISH:
        if (eng_weights_finish(e, c->version, err, el, &st) == 0) st = 200;
        eng_weights_get_info(e, &wi);
        if (!wi.session_open) ipc_release(s); /* once per session: closed when the session ends */
        break;
    case CMD_ABORT:
        if (eng_weights_abort(e, err, el, &st) == 0) st = 200;
        ipc_release(s);
        break;
    case CMD_NCCL_INIT:
        nccl_init_cmd(s, c, &st);
        break;
    case CMD_NCCL_BUCKET:
        nccl_bucket(s, c, &st);
        break;
    case CMD_NCCL_UPDATE:
        nccl_update(s, c, &st);
        break;
    case CMD_NCCL_DESTROY:
        if (!s->nccl) {
            snprintf(err, el, "no NCCL group to destroy");
            st = 409;
        } else {
            nccl_release(s);
        }
        break;
    case CMD_IPC_OPEN:
        ipc_open_cmd(s, c, &st);
        break;
    case CMD_IPC_BUCKET:
        ipc_bucket_cmd(s, c, &st);
        break;
    case CMD_LOAD: {
        /* a whole session: begin -> the folder(s) in buckets -> finish; any failure aborts it */
        if (eng_weights_begin(e, c->full, c->which, c->pause, c->version, &c->session, err, el, &st) != 0) break;
        int rc = 0;
        const char *tdir = c->which == ENG_WMODEL_DRAFT ? NULL : c->path;
        const char *ddir = c->which == ENG_WMODEL_TARGET ? NULL : (c->which == ENG_WMODEL_DRAFT ? c->path : c->draft_path);
        if (tdir) rc = eng_weights_load_dir(e, tdir, NULL, s->update_bucket, err, el, &st);
        if (rc == 0 && ddir)
            rc = eng_weights_load_dir(e, ddir, c->which == ENG_WMODEL_ALL ? "draft." : NULL, s->update_bucket, err,
                                      el, &st);
        if (rc != 0) {
            int st2;
            char e2[64];
            eng_weights_abort(e, e2, sizeof e2, &st2);
            break;
        }
        if (eng_weights_finish(e, c->version, err, el, &st) == 0) st = 200;
        s->paused = 0;
        break;
    }
    case CMD_CHECKSUMS: {
        cJSON *t = cJSON_CreateObject();
        if (eng_weights_checksums(e, c->draft, add_sum, t) != 0) {
            cJSON_Delete(t);
            snprintf(err, el, "this server has no drafter");
            st = 400;
        } else {
            c->result = t;
        }
        break;
    }
    case CMD_RESET_PREFIX:
        eng_reset_prefix_cache(e);
        break;
    case CMD_PAUSE:
        if (c->pause == ENG_PAUSE_ABORT) abort_running(s, c);
        s->paused = 1;
        break;
    case CMD_RESUME:
        s->paused = 0;
        break;
    case CMD_SET_VERSION:
        eng_weights_set_version(e, c->version);
        break;
    }
    c->status = st;
    return 1;
}

int srv_cmds_run(srv_state *s, int stopping)
{
    for (;;) {
        pthread_mutex_lock(&s->mu);
        srv_cmd *c = s->cmd_head;
        pthread_mutex_unlock(&s->mu);
        if (!c) return 0;
        if (stopping) {
            c->status = 503;
            snprintf(c->err, sizeof c->err, "the server is shutting down");
            if (c->draining) eng_set_admission(s->rt.e, 1);
        } else if (!run_cmd(s, c)) {
            srv_weights_publish(s);
            return 1; /* draining: keep stepping */
        }
        srv_weights_publish(s);
        pthread_mutex_lock(&s->mu);
        s->cmd_head = c->next;
        if (!s->cmd_head) s->cmd_tail = NULL;
        c->done = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

/* ---- handler side ------------------------------------------------------------------------------------ */

/* Queues c for the engine thread and waits for it. Returns c->status. */
static int submit_cmd(srv_state *s, srv_cmd *c)
{
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        snprintf(c->err, sizeof c->err, "the server is shutting down");
        pthread_cond_destroy(&c->cv);
        return c->status = 503;
    }
    c->next = NULL;
    if (s->cmd_tail) s->cmd_tail->next = c;
    else s->cmd_head = c;
    s->cmd_tail = c;
    pthread_cond_signal(&s->inbox_cv);
    while (!c->done) pthread_cond_wait(&c->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&c->cv);
    return c->status;
}

static cJSON *info_json(srv_state *s)
{
    pthread_mutex_lock(&s->wmu);
    eng_weights_info w = s->wpub;
    int paused = s->is_paused_pub;
    pthread_mutex_unlock(&s->wmu);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", w.version);
    cJSON_AddNumberToObject(o, "version_number", (double)w.version_num);
    cJSON_AddStringToObject(o, "state", eng_wstate_name(w.state));
    if (w.reason[0]) cJSON_AddStringToObject(o, "reason", w.reason);
    else cJSON_AddNullToObject(o, "reason");
    cJSON_AddBoolToObject(o, "session_open", w.session_open);
    cJSON_AddBoolToObject(o, "paused", paused);
    cJSON *lu = cJSON_AddObjectToObject(o, "last_update");
    cJSON_AddNumberToObject(lu, "tensors", (double)w.tensors);
    cJSON_AddNumberToObject(lu, "bytes", (double)w.bytes);
    cJSON_AddNumberToObject(lu, "buckets", (double)w.buckets);
    cJSON_AddNumberToObject(lu, "ms", w.ms);
    cJSON_AddNumberToObject(lu, "hook_ms", w.hook_ms);
    cJSON_AddNumberToObject(lu, "guard_ms", w.guard_ms);
    cJSON *c = cJSON_AddObjectToObject(o, "counters");
    cJSON_AddNumberToObject(c, "updates_ok", (double)w.updates_ok);
    cJSON_AddNumberToObject(c, "updates_failed", (double)w.updates_failed);
    cJSON_AddNumberToObject(c, "hook_runs_target", (double)w.hook_runs_target);
    cJSON_AddNumberToObject(c, "hook_runs_draft", (double)w.hook_runs_draft);
    return o;
}

static int send_cmd_result(struct mg_connection *conn, srv_cmd *c, cJSON *ok_body)
{
    if (c->status != 200) {
        cJSON_Delete(ok_body);
        srv_err e;
        srv_errf(&e, c->status, NULL, "%s", c->err);
        if (c->status == 409) e.type = "conflict";
        return srv_send_err(conn, &e);
    }
    int st = srv_send_json(conn, 200, ok_body);
    cJSON_Delete(ok_body);
    return st;
}

/* A JSON object body, where an empty body means {}. */
static cJSON *read_json_opt(srv_state *s, struct mg_connection *c, srv_err *e)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (ri->content_length == 0) return cJSON_CreateObject();
    size_t len;
    char *txt = srv_read_body(s, c, &len, e);
    if (!txt) return NULL;
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", txt[i])) i++;
    cJSON *o = NULL;
    if (i == len) {
        o = cJSON_CreateObject();
    } else {
        o = cJSON_ParseWithLength(txt, len);
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            o = NULL;
            srv_errf(e, 400, NULL, "request body must be a JSON object");
        }
    }
    free(txt);
    return o;
}

static int opt_string(const cJSON *b, const char *key, const char **out, srv_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsNumber(v)) { /* versions are often numbers: keep their text */
        static _Thread_local char num[64];
        snprintf(num, sizeof num, "%.17g", v->valuedouble);
        *out = num;
        return 0;
    }
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= 128) {
        srv_errf(e, 400, key, "%s must be a string of fewer than 128 bytes", key);
        return -1;
    }
    *out = v->valuestring;
    return 0;
}

/* mode / model / pause / version of a begin-like body into c. */
static int parse_begin(const cJSON *b, srv_cmd *c, eng_wmodel dflt_model, srv_err *e)
{
    const char *mode = "full", *model = NULL, *pause = "wait", *version = NULL;
    if (opt_string(b, "mode", &mode, e) || opt_string(b, "model", &model, e) || opt_string(b, "pause", &pause, e) ||
        opt_string(b, "version", &version, e))
        return -1;
    if (!version && opt_string(b, "weight_version", &version, e)) return -1;
    if (strcmp(mode, "full") != 0 && strcmp(mode, "partial") != 0)
        return srv_errf(e, 400, "mode", "mode must be \"full\" or \"partial\""), -1;
    c->full = strcmp(mode, "full") == 0;
    c->which = dflt_model;
    if (model && eng_wmodel_parse(model, &c->which) != 0)
        return srv_errf(e, 400, "model", "model must be \"target\", \"draft\" or \"all\""), -1;
    if (eng_pause_parse(pause, &c->pause) != 0)
        return srv_errf(e, 400, "pause", "pause must be \"wait\", \"abort\", \"keep\" or \"recompute\""), -1;
    if (version) snprintf(c->version, sizeof c->version, "%s", version);
    return 0;
}

static srv_cmd *new_cmd(cmd_kind k)
{
    srv_cmd *c = calloc(1, sizeof *c);
    if (c) c->kind = k;
    return c;
}

#define NEW_CMD(c, k)                                                                                  \
    srv_cmd *c = new_cmd(k);                                                                           \
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory")

static int route_begin_model(srv_state *s, struct mg_connection *conn, eng_wmodel dflt)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    NEW_CMD(c, CMD_BEGIN);
    int rc = parse_begin(b, c, dflt, &e);
    cJSON_Delete(b);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    submit_cmd(s, c);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "session", (double)c->session);
    cJSON_AddStringToObject(o, "state", "updating");
    cJSON_AddNumberToObject(o, "aborted_requests", c->aborted_requests);
    int st = send_cmd_result(conn, c, o);
    free(c);
    return st;
}

static int route_begin(srv_state *s, struct mg_connection *conn) { return route_begin_model(s, conn, ENG_WMODEL_TARGET); }
static int route_begin_draft(srv_state *s, struct mg_connection *conn) { return route_begin_model(s, conn, ENG_WMODEL_DRAFT); }

/* Reads the octet-stream body into the staging buffer (caller holds bucket_mu). */
static int read_bucket(srv_state *s, struct mg_connection *conn, size_t *len, srv_err *e)
{
    const struct mg_request_info *ri = mg_get_request_info(conn);
    long long cl = ri->content_length;
    if (cl < 0) return srv_errf(e, 411, NULL, "a bucket needs a Content-Length"), -1;
    if ((unsigned long long)cl > s->max_bucket)
        return srv_errf(e, 413, NULL, "bucket of %lld bytes is larger than --max-bucket-bytes %zu", cl, s->max_bucket), -1;
    if ((size_t)cl > s->staging_cap) {
        uint8_t *nb = realloc(s->staging, (size_t)cl ? (size_t)cl : 1);
        if (!nb) return srv_errf(e, 507, NULL, "cannot grow the staging buffer to %lld bytes", cl), -1;
        s->staging = nb;
        s->staging_cap = (size_t)cl;
    }
    const char *expect = mg_get_header(conn, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0) mg_write(conn, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    size_t n = 0;
    while ((long long)n < cl) {
        size_t want = (size_t)cl - n;
        int r = mg_read(conn, s->staging + n, want > (1u << 30) ? (1u << 30) : want);
        if (r <= 0) break;
        n += (size_t)r;
    }
    if ((long long)n != cl) return srv_errf(e, 400, NULL, "truncated bucket: got %zu of %lld bytes", n, cl), -1;
    *len = n;
    return 0;
}

static int route_bucket(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    pthread_mutex_lock(&s->bucket_mu);
    size_t len = 0;
    if (read_bucket(s, conn, &len, &e) != 0) {
        pthread_mutex_unlock(&s->bucket_mu);
        return srv_send_err(conn, &e);
    }
    srv_cmd *c = new_cmd(CMD_BUCKET);
    mdl_st_file f;
    memset(&f, 0, sizeof f);
    int st;
    if (!c) {
        st = srv_send_error(conn, 500, NULL, "out of memory");
    } else {
        snprintf(c->what, sizeof c->what, "bucket %llu", (unsigned long long)++s->n_buckets_rx);
        /* the untrusted header is validated whole here, before the engine sees a byte */
        if (mdl_st_parse(s->staging, len, c->what, &f, c->err, sizeof c->err) != 0) {
            srv_errf(&e, 400, NULL, "%s", c->err);
            st = srv_send_err(conn, &e);
        } else {
            c->tensors = f.tensors;
            c->n_tensors = f.n;
            submit_cmd(s, c);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "tensors", (double)f.n);
            cJSON_AddNumberToObject(o, "bytes", (double)len);
            st = send_cmd_result(conn, c, o);
        }
    }
    mdl_st_close(&f);
    free(c);
    pthread_mutex_unlock(&s->bucket_mu);
    return st;
}

static int simple_cmd(srv_state *s, struct mg_connection *conn, cmd_kind k, const char *version, cJSON *ok)
{
    srv_cmd *c = new_cmd(k);
    if (!c) {
        cJSON_Delete(ok);
        return srv_send_error(conn, 500, NULL, "out of memory");
    }
    if (version) snprintf(c->version, sizeof c->version, "%s", version);
    submit_cmd(s, c);
    int st = send_cmd_result(conn, c, ok);
    free(c);
    return st;
}

static int route_finish(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const char *version = NULL;
    if (opt_string(b, "version", &version, &e) != 0 || (!version && opt_string(b, "weight_version", &version, &e) != 0)) {
        cJSON_Delete(b);
        return srv_send_err(conn, &e);
    }
    char v[128] = "";
    if (version) snprintf(v, sizeof v, "%s", version);
    cJSON_Delete(b);
    srv_cmd *c = new_cmd(CMD_FINISH);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    snprintf(c->version, sizeof c->version, "%s", v);
    submit_cmd(s, c);
    int st = send_cmd_result(conn, c, c->status == 200 ? info_json(s) : NULL);
    free(c);
    return st;
}

static int route_abort(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    srv_cmd *c = new_cmd(CMD_ABORT);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    submit_cmd(s, c);
    int st = send_cmd_result(conn, c, c->status == 200 ? info_json(s) : NULL);
    free(c);
    return st;
}

static int route_info(srv_state *s, struct mg_connection *conn)
{
    cJSON *o = info_json(s);
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}

/* A path confined to --weights-root: resolved (symlinks too) and under the root. */
static int confine(srv_state *s, const char *in, char *out, srv_err *e, const char *param)
{
    if (!s->weights_root)
        return srv_errf(e, 403, param, "disk loads are disabled: start the server with --weights-root DIR"), -1;
    if (!realpath(in, out)) return srv_errf(e, 400, param, "%s: %s", param, strerror(errno)), -1;
    size_t n = strlen(s->weights_root);
    if (strncmp(out, s->weights_root, n) != 0 || (out[n] != '/' && out[n] != 0 && strcmp(s->weights_root, "/") != 0))
        return srv_errf(e, 403, param, "%s is outside --weights-root", param), -1;
    return 0;
}

static int do_load(srv_state *s, struct mg_connection *conn, const cJSON *b, const char *path_key, int sglang)
{
    srv_err e;
    srv_cmd *c = new_cmd(CMD_LOAD);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(b, path_key);
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(b, "draft_path");
    int st;
    if (parse_begin(b, c, ENG_WMODEL_TARGET, &e) != 0) goto err;
    if (sglang) { /* SGLang: abort_all_requests picks the pause mode; flush_cache is implied (I6) */
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(b, "abort_all_requests");
        c->pause = cJSON_IsTrue(ab) ? ENG_PAUSE_ABORT : ENG_PAUSE_WAIT;
    }
    if (!cJSON_IsString(p)) {
        srv_errf(&e, 400, path_key, "%s must be a checkpoint folder path", path_key);
        goto err;
    }
    if (confine(s, p->valuestring, c->path, &e, path_key) != 0) goto err;
    if (c->which == ENG_WMODEL_ALL) {
        if (!cJSON_IsString(dp)) {
            srv_errf(&e, 400, "draft_path", "model \"all\" needs draft_path (the drafter's folder)");
            goto err;
        }
        if (confine(s, dp->valuestring, c->draft_path, &e, "draft_path") != 0) goto err;
    }
    submit_cmd(s, c);
    if (sglang) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "success", c->status == 200);
        cJSON_AddStringToObject(o, "message", c->status == 200 ? "Succeeded to update model weights." : c->err);
        cJSON_AddNumberToObject(o, "num_paused_requests", c->paused_requests + c->aborted_requests);
        st = srv_send_json(conn, c->status == 200 ? 200 : c->status, o);
        cJSON_Delete(o);
    } else {
        st = send_cmd_result(conn, c, c->status == 200 ? info_json(s) : NULL);
    }
    free(c);
    return st;
err:
    free(c);
    return srv_send_err(conn, &e);
}

static int route_load(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    int st = do_load(s, conn, b, "path", 0);
    cJSON_Delete(b);
    return st;
}

static int route_sglang_load(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    int st = do_load(s, conn, b, "model_path", 1);
    cJSON_Delete(b);
    return st;
}

static int checksums(srv_state *s, struct mg_connection *conn, int draft, cJSON **tensors, srv_cmd **out)
{
    srv_cmd *c = new_cmd(CMD_CHECKSUMS);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    c->draft = draft;
    submit_cmd(s, c);
    *tensors = c->result;
    *out = c;
    return c->status;
}

static int route_checksums(srv_state *s, struct mg_connection *conn)
{
    char model[16] = "target";
    const struct mg_request_info *ri = mg_get_request_info(conn);
    if (ri->query_string) mg_get_var(ri->query_string, strlen(ri->query_string), "model", model, sizeof model);
    if (strcmp(model, "target") != 0 && strcmp(model, "draft") != 0)
        return srv_send_error(conn, 400, "model", "model must be \"target\" or \"draft\"");
    cJSON *t = NULL;
    srv_cmd *c = NULL;
    checksums(s, conn, strcmp(model, "draft") == 0, &t, &c);
    if (!c) return 500;
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        pthread_mutex_lock(&s->wmu);
        cJSON_AddStringToObject(o, "version", s->wpub.version);
        pthread_mutex_unlock(&s->wmu);
        cJSON_AddItemToObject(o, "tensors", t);
    }
    int st = send_cmd_result(conn, c, o);
    free(c);
    return st;
}

/* vLLM /weight_checker and SGLang /weights_checker: {"action":"checksum"} or
 * {"action":"compare","checksums":{name:hex}} (model optional). */
static int route_checker(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const char *action = "checksum", *model = "target";
    if (opt_string(b, "action", &action, &e) || opt_string(b, "model", &model, &e)) {
        cJSON_Delete(b);
        return srv_send_err(conn, &e);
    }
    if (strcmp(action, "checksum") != 0 && strcmp(action, "compare") != 0) {
        cJSON_Delete(b);
        return srv_send_error(conn, 400, "action", "action must be \"checksum\" or \"compare\"");
    }
    cJSON *t = NULL;
    srv_cmd *c = NULL;
    checksums(s, conn, strcmp(model, "draft") == 0, &t, &c);
    if (!c) {
        cJSON_Delete(b);
        return 500;
    }
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        if (strcmp(action, "checksum") == 0) {
            cJSON_AddItemToObject(o, "checksums", t);
        } else {
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(b, "checksums");
            cJSON *mism = cJSON_AddArrayToObject(o, "mismatches");
            const cJSON *x;
            int n = 0;
            cJSON_ArrayForEach(x, want)
            {
                const cJSON *have = cJSON_GetObjectItemCaseSensitive(t, x->string);
                n++;
                if (!cJSON_IsString(x) || !cJSON_IsString(have) || strcmp(x->valuestring, have->valuestring) != 0)
                    cJSON_AddItemToArray(mism, cJSON_CreateString(x->string));
            }
            cJSON_AddBoolToObject(o, "match", cJSON_GetArraySize(mism) == 0 && n == cJSON_GetArraySize(t));
            cJSON_AddNumberToObject(o, "compared", n);
            cJSON_Delete(t);
        }
    }
    cJSON_Delete(b);
    int st = send_cmd_result(conn, c, o);
    free(c);
    return st;
}

static int route_reset_prefix(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", 1);
    return simple_cmd(s, conn, CMD_RESET_PREFIX, NULL, o);
}

/* vLLM /pause?mode=abort|wait|keep, SGLang /pause_generation {"mode": abort|retract|in_place} */
static int do_pause(srv_state *s, struct mg_connection *conn, const char *mode)
{
    srv_cmd *c = new_cmd(CMD_PAUSE);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    if (strcmp(mode, "retract") == 0 || strcmp(mode, "in_place") == 0) mode = "keep";
    if (eng_pause_parse(mode, &c->pause) != 0 || c->pause == ENG_PAUSE_RECOMPUTE) {
        free(c);
        return srv_send_error(conn, 400, "mode", "mode must be abort, wait or keep");
    }
    submit_cmd(s, c);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "paused");
    cJSON_AddNumberToObject(o, "num_aborted_requests", c->aborted_requests);
    int st = send_cmd_result(conn, c, o);
    free(c);
    return st;
}

static int route_pause(srv_state *s, struct mg_connection *conn)
{
    char mode[32] = "abort";
    const struct mg_request_info *ri = mg_get_request_info(conn);
    if (ri->query_string) mg_get_var(ri->query_string, strlen(ri->query_string), "mode", mode, sizeof mode);
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(b, "mode");
    if (cJSON_IsString(m)) snprintf(mode, sizeof mode, "%s", m->valuestring);
    cJSON_Delete(b);
    return do_pause(s, conn, mode);
}

static int route_resume(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "resumed");
    return simple_cmd(s, conn, CMD_RESUME, NULL, o);
}

static int route_is_paused(srv_state *s, struct mg_connection *conn)
{
    pthread_mutex_lock(&s->wmu);
    int p = s->is_paused_pub;
    pthread_mutex_unlock(&s->wmu);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "is_paused", p);
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}

static int route_weight_version(srv_state *s, struct mg_connection *conn)
{
    cJSON *o = cJSON_CreateObject();
    pthread_mutex_lock(&s->wmu);
    cJSON_AddStringToObject(o, "weight_version", s->wpub.version);
    pthread_mutex_unlock(&s->wmu);
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}

static int route_update_version(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const char *v = NULL;
    if (opt_string(b, "new_version", &v, &e) != 0) {
        cJSON_Delete(b);
        return srv_send_err(conn, &e);
    }
    if (!v) {
        cJSON_Delete(b);
        return srv_send_error(conn, 400, "new_version", "new_version is required");
    }
    char ver[128];
    snprintf(ver, sizeof ver, "%s", v);
    cJSON_Delete(b);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", 1);
    cJSON_AddStringToObject(o, "message", "weight version updated");
    return simple_cmd(s, conn, CMD_SET_VERSION, ver, o);
}

/* ---- GPU transports, handler side ----------------------------------------------------------------------
 * Bodies are validated whole here (400 naming the field); the engine thread then validates the
 * tensors against the model before any byte moves, and only then receives / copies.
 *
 * NCCL packing (vLLM /update_weights, SGLang /update_weights_from_distributed): the bucket is ONE
 * ncclBroadcast from rank 0 of uint8 bytes; tensor i starts at the first multiple of 256 at or after
 * the end of tensor i-1 (tensor 0 at 0), its bytes are numel * dtype size, contiguous, little
 * endian; the broadcast length is the end of the last tensor (no trailing padding). */
#define GPU_ALIGN 256

static int b64_val(int ch)
{
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+' || ch == '-') return 62;
    if (ch == '/' || ch == '_') return 63;
    return -1;
}

/* Standard or URL-safe base64 (padding optional). Returns the decoded length, or -1. */
static long b64_decode(const char *in, unsigned char *out, size_t cap)
{
    size_t n = 0;
    unsigned acc = 0;
    int bits = 0;
    for (; *in && *in != '='; in++) {
        int v = b64_val((unsigned char)*in);
        if (v < 0) return -1;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n >= cap) return -1;
            out[n++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    while (*in == '=') in++;
    return *in ? -1 : (long)n;
}

/* "bfloat16", "torch.bfloat16", "BF16", "bf16", "float16", "half", "float32", "float" ... */
static int gpu_dtype_parse(const char *s, mdl_dtype *out)
{
    if (strncmp(s, "torch.", 6) == 0) s += 6;
    static const struct {
        const char *n;
        mdl_dtype dt;
    } tab[] = {{"bfloat16", MDL_DT_BF16}, {"bf16", MDL_DT_BF16}, {"float16", MDL_DT_F16}, {"half", MDL_DT_F16},
               {"f16", MDL_DT_F16},       {"float32", MDL_DT_F32}, {"float", MDL_DT_F32}, {"f32", MDL_DT_F32}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcasecmp(s, tab[i].n) == 0) return *out = tab[i].dt, 0;
    return mdl_dtype_parse(s, out); /* the safetensors names; the engine refuses non-float ones */
}

static void gpu_meta_free(gpu_meta *m)
{
    for (size_t i = 0; i < m->n; i++) free(m->t[i].name);
    free(m->t);
    free(m->off);
    memset(m, 0, sizeof *m);
}

/* Parses names / dtypes / shapes (and, for IPC, offsets) of obj. pfx prefixes the field names in
 * messages ("update_info."). offsets_key NULL: NCCL packing (GPU_ALIGN). */
static int gpu_meta_parse(const cJSON *obj, const char *pfx, const char *names_key, const char *dtypes_key,
                          const char *offsets_key, gpu_meta *m, srv_err *e)
{
    char f[4][96];
    snprintf(f[0], sizeof f[0], "%s%s", pfx, names_key);
    snprintf(f[1], sizeof f[1], "%s%s", pfx, dtypes_key);
    snprintf(f[2], sizeof f[2], "%sshapes", pfx);
    snprintf(f[3], sizeof f[3], "%s%s", pfx, offsets_key ? offsets_key : "offsets");
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(obj, names_key);
    const cJSON *dts = cJSON_GetObjectItemCaseSensitive(obj, dtypes_key);
    const cJSON *shapes = cJSON_GetObjectItemCaseSensitive(obj, "shapes");
    const cJSON *offs = offsets_key ? cJSON_GetObjectItemCaseSensitive(obj, offsets_key) : NULL;
    memset(m, 0, sizeof *m);
    if (!cJSON_IsArray(names) || cJSON_GetArraySize(names) == 0)
        return srv_errf(e, 400, f[0], "%s must be a non-empty list of tensor names", f[0]), -1;
    int n = cJSON_GetArraySize(names);
    if (!cJSON_IsArray(dts) || cJSON_GetArraySize(dts) != n)
        return srv_errf(e, 400, f[1], "%s must be a list of %d dtype names (one per tensor)", f[1], n), -1;
    if (!cJSON_IsArray(shapes) || cJSON_GetArraySize(shapes) != n)
        return srv_errf(e, 400, f[2], "%s must be a list of %d shapes (one per tensor)", f[2], n), -1;
    if (offsets_key && (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != n))
        return srv_errf(e, 400, f[3], "%s must be a list of %d byte offsets (one per tensor)", f[3], n), -1;
    m->t = calloc((size_t)n, sizeof *m->t);
    m->off = calloc((size_t)n, sizeof *m->off);
    if (!m->t || !m->off) {
        gpu_meta_free(m);
        return srv_errf(e, 500, NULL, "out of memory"), -1;
    }
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        mdl_st_tensor *t = &m->t[i];
        const cJSON *nm = cJSON_GetArrayItem(names, i), *dt = cJSON_GetArrayItem(dts, i);
        const cJSON *sh = cJSON_GetArrayItem(shapes, i);
        if (!cJSON_IsString(nm) || !nm->valuestring[0] || strlen(nm->valuestring) > 512) {
            srv_errf(e, 400, f[0], "%s[%d] must be a tensor name", f[0], i);
            goto bad;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(m->t[j].name, nm->valuestring) == 0) {
                srv_errf(e, 400, f[0], "%s: tensor %s appears twice", f[0], nm->valuestring);
                goto bad;
            }
        if (!cJSON_IsString(dt) || gpu_dtype_parse(dt->valuestring, &t->dtype) != 0) {
            srv_errf(e, 400, f[1], "%s[%d] (%s) must be a dtype name such as \"bfloat16\", \"float16\" or \"float32\"",
                     f[1], i, nm->valuestring);
            goto bad;
        }
        int nd = cJSON_IsArray(sh) ? cJSON_GetArraySize(sh) : -1;
        if (nd < 0 || nd > MDL_ST_MAX_DIMS) {
            srv_errf(e, 400, f[2], "%s[%d] (%s) must be a list of at most %d dimensions", f[2], i, nm->valuestring,
                     MDL_ST_MAX_DIMS);
            goto bad;
        }
        t->name = strdup(nm->valuestring);
        if (!t->name) {
            srv_errf(e, 500, NULL, "out of memory");
            goto bad;
        }
        m->n = (size_t)i + 1;
        t->ndim = nd;
        uint64_t numel = 1;
        for (int d = 0; d < nd; d++) {
            const cJSON *x = cJSON_GetArrayItem(sh, d);
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9007199254740992.0 ||
                x->valuedouble != (double)(int64_t)x->valuedouble) {
                srv_errf(e, 400, f[2], "%s[%d] (%s): dimension %d must be a non-negative integer", f[2], i,
                         t->name, d);
                goto bad;
            }
            t->shape[d] = (int64_t)x->valuedouble;
            if (t->shape[d] && numel > (UINT64_C(1) << 48) / (uint64_t)t->shape[d]) {
                srv_errf(e, 400, f[2], "%s[%d] (%s) is too large", f[2], i, t->name);
                goto bad;
            }
            numel *= (uint64_t)t->shape[d];
        }
        t->numel = numel;
        t->nbytes = numel * mdl_dtype_size(t->dtype);
        uint64_t off;
        if (offsets_key) {
            const cJSON *o = cJSON_GetArrayItem(offs, i);
            size_t w = mdl_dtype_size(t->dtype);
            if (!cJSON_IsNumber(o) || o->valuedouble < 0 || o->valuedouble > 9007199254740992.0 ||
                o->valuedouble != (double)(uint64_t)o->valuedouble || ((uint64_t)o->valuedouble % (w ? w : 1))) {
                srv_errf(e, 400, f[3], "%s[%d] (%s) must be a non-negative byte offset, a multiple of %zu", f[3], i,
                         t->name, w);
                goto bad;
            }
            off = (uint64_t)o->valuedouble;
        } else {
            off = (at + GPU_ALIGN - 1) / GPU_ALIGN * GPU_ALIGN;
        }
        m->off[i] = off;
        at = off + t->nbytes;
        if (at > m->total) m->total = at;
    }
    if (offsets_key) { /* tensors of one bucket must not overlap */
        for (size_t i = 0; i < m->n; i++)
            for (size_t j = i + 1; j < m->n; j++)
                if (m->t[i].nbytes && m->t[j].nbytes && m->off[i] < m->off[j] + m->t[j].nbytes &&
                    m->off[j] < m->off[i] + m->t[i].nbytes) {
                    srv_errf(e, 400, f[3], "%s: tensors %s and %s overlap", f[3], m->t[i].name, m->t[j].name);
                    goto bad;
                }
    }
    return 0;
bad:
    gpu_meta_free(m);
    return -1;
}

/* An integer field of o in [lo, hi]; required or (dflt when absent). */
static int get_int(const cJSON *o, const char *pfx, const char *key, int required, long long lo, long long hi,
                   long long dflt, long long *out, srv_err *e)
{
    char f[96];
    snprintf(f, sizeof f, "%s%s", pfx, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return srv_errf(e, 400, f, "%s is required", f), -1;
        *out = dflt;
        return 0;
    }
    double d = 0;
    char *end = NULL;
    if (cJSON_IsNumber(v)) d = v->valuedouble;
    else if (cJSON_IsString(v) && v->valuestring[0]) { /* "29500": ports are often strings */
        d = strtod(v->valuestring, &end);
        if (*end) d = -1e300;
    } else d = -1e300;
    /* the range first: casting a double outside long long (1e300, the -1e300 above, NaN) is undefined */
    if (!(d >= (double)lo && d <= (double)hi) || d != (double)(long long)d)
        return srv_errf(e, 400, f, "%s must be an integer in [%lld, %lld]", f, lo, hi), -1;
    *out = (long long)d;
    return 0;
}

/* The NCCL group of an init body (init_info of vLLM, the top level of SGLang) into c. */
static int parse_nccl_init(const cJSON *o, const char *pfx, srv_cmd *c, srv_err *e)
{
    long long rank, world, port, staging, timeout;
    char f[96];
    if (get_int(o, pfx, "world_size", 1, 2, 1 << 20, 0, &world, e) ||
        get_int(o, pfx, "rank_offset", 1, 1, 1 << 20, 0, &rank, e) ||
        get_int(o, pfx, "master_port", 0, 0, 65535, 0, &port, e) ||
        get_int(o, pfx, "staging_bytes", 0, 1, (long long)1 << 50, 0, &staging, e) ||
        get_int(o, pfx, "timeout_s", 0, 1, 86400, 0, &timeout, e))
        return -1;
    if (rank >= world) {
        snprintf(f, sizeof f, "%srank_offset", pfx);
        return srv_errf(e, 400, f, "%s (%lld) must be below world_size (%lld): the trainer is rank 0 and this server "
                        "(one GPU) is rank rank_offset", f, rank, world), -1;
    }
    const cJSON *ma = cJSON_GetObjectItemCaseSensitive(o, "master_address");
    if (ma && !cJSON_IsNull(ma) && !cJSON_IsString(ma)) {
        snprintf(f, sizeof f, "%smaster_address", pfx);
        return srv_errf(e, 400, f, "%s must be a string", f), -1;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "nccl_unique_id_b64");
    snprintf(f, sizeof f, "%snccl_unique_id_b64", pfx);
    if (!id || cJSON_IsNull(id))
        return srv_errf(e, 400, f, "%s is required: graphswap joins the trainer's communicator with the trainer's "
                        "ncclUniqueId (128 bytes, base64; ncclGetUniqueId on rank 0) and runs no TCP rendezvous "
                        "on master_address:master_port", f), -1;
    long n = cJSON_IsString(id) ? b64_decode(id->valuestring, c->blob, sizeof c->blob) : -1;
    if (n != GS_NCCL_ID_BYTES)
        return srv_errf(e, 400, f, "%s must be the base64 of a %d-byte ncclUniqueId", f, GS_NCCL_ID_BYTES), -1;
    c->blob_len = (size_t)n;
    c->rank = (int)rank;
    c->world = (int)world;
    c->staging_req = (size_t)staging;
    c->timeout = (double)timeout;
    return 0;
}

static int gpu_available(const srv_state *s) { return gpu_xport(s) != NULL; }

/* SGLang answers {success, message} (with the HTTP status of the outcome). */
static int send_sglang(struct mg_connection *conn, int status, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", status == 200);
    cJSON_AddStringToObject(o, "message", msg);
    int st = srv_send_json(conn, status, o);
    cJSON_Delete(o);
    return st;
}

/* vLLM POST /init_weight_transfer_engine {"init_info":{master_address, master_port, rank_offset,
 * world_size, nccl_unique_id_b64[, staging_bytes, timeout_s]}} */
static int route_nccl_init_vllm(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const cJSON *ii = cJSON_GetObjectItemCaseSensitive(b, "init_info");
    NEW_CMD(c, CMD_NCCL_INIT);
    int rc = -1;
    if (!cJSON_IsObject(ii)) srv_errf(&e, 400, "init_info", "init_info must be an object");
    else rc = parse_nccl_init(ii, "init_info.", c, &e);
    cJSON_Delete(b);
    if (rc == 0 && !gpu_available(s)) rc = (srv_errf(&e, 501, NULL, GPU_NEEDS_CUDA), -1);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    snprintf(c->group, sizeof c->group, "vllm");
    submit_cmd(s, c);
    int st = send_cmd_result(conn, c, c->result);
    free(c);
    return st;
}

/* SGLang POST /init_weights_update_group {master_address, master_port, rank_offset, world_size,
 * group_name, backend, nccl_unique_id_b64 (graphswap)} */
static int route_nccl_init_sglang(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    NEW_CMD(c, CMD_NCCL_INIT);
    const char *group = NULL, *backend = NULL;
    int rc = opt_string(b, "group_name", &group, &e) || opt_string(b, "backend", &backend, &e) ? -1 : 0;
    if (rc == 0 && backend && strcmp(backend, "nccl") != 0)
        rc = (srv_errf(&e, 400, "backend", "backend must be \"nccl\""), -1);
    if (rc == 0) rc = parse_nccl_init(b, "", c, &e);
    if (rc == 0) snprintf(c->group, sizeof c->group, "%s", group ? group : "");
    cJSON_Delete(b);
    if (rc == 0 && !gpu_available(s)) rc = (srv_errf(&e, 501, NULL, GPU_NEEDS_CUDA), -1);
    if (rc != 0) {
        free(c);
        return e.status == 501 ? send_sglang(conn, 501, e.msg) : srv_send_err(conn, &e);
    }
    submit_cmd(s, c);
    int st = c->status == 200 ? srv_send_json(conn, 200, c->result) : send_sglang(conn, c->status, c->err);
    cJSON_Delete(c->result);
    free(c);
    return st;
}

static int route_nccl_destroy(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    if (!gpu_available(s)) return send_sglang(conn, 501, GPU_NEEDS_CUDA);
    srv_cmd *c = new_cmd(CMD_NCCL_DESTROY);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    submit_cmd(s, c);
    int st = send_sglang(conn, c->status, c->status == 200 ? "NCCL group destroyed" : c->err);
    free(c);
    return st;
}

/* vLLM POST /update_weights {"update_info":{names, dtype_names, shapes}}: one bucket of an open
 * session, its bytes one NCCL broadcast (packing above). */
static int route_nccl_bucket(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const cJSON *ui = cJSON_GetObjectItemCaseSensitive(b, "update_info");
    NEW_CMD(c, CMD_NCCL_BUCKET);
    int rc = -1;
    if (!cJSON_IsObject(ui)) srv_errf(&e, 400, "update_info", "update_info must be an object");
    else rc = gpu_meta_parse(ui, "update_info.", "names", "dtype_names", NULL, &c->meta, &e);
    cJSON_Delete(b);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    /* (on the CPU backend the engine still checks the session and the names, then answers 501) */
    submit_cmd(s, c);
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "tensors", (double)c->meta.n);
        cJSON_AddNumberToObject(o, "bytes", (double)c->meta.total);
    }
    int st = send_cmd_result(conn, c, o);
    gpu_meta_free(&c->meta);
    free(c);
    return st;
}

/* SGLang POST /update_weights_from_distributed {names, dtypes, shapes, group_name, flush_cache,
 * weight_version[, abort_all_requests]}: a partial session (begin, this bucket, finish). The prefix
 * cache is always dropped at finish (I6), whatever flush_cache says. */
static int route_nccl_update(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    NEW_CMD(c, CMD_NCCL_UPDATE);
    const char *version = NULL;
    int rc = gpu_meta_parse(b, "", "names", "dtypes", NULL, &c->meta, &e);
    if (rc == 0 && (opt_string(b, "weight_version", &version, &e) != 0)) rc = -1;
    if (rc == 0 && version) snprintf(c->version, sizeof c->version, "%s", version);
    c->pause = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "abort_all_requests")) ? ENG_PAUSE_ABORT : ENG_PAUSE_WAIT;
    cJSON_Delete(b);
    if (rc == 0 && !gpu_available(s)) rc = (srv_errf(&e, 501, NULL, GPU_NEEDS_CUDA), -1);
    if (rc != 0) {
        gpu_meta_free(&c->meta);
        free(c);
        return e.status == 501 ? send_sglang(conn, 501, e.msg) : srv_send_err(conn, &e);
    }
    submit_cmd(s, c);
    int st = send_sglang(conn, c->status, c->status == 200 ? "Succeeded to update parameter online." : c->err);
    gpu_meta_free(&c->meta);
    free(c);
    return st;
}

/* POST /v1/weights/ipc/open {"handle_b64", "bytes"[, "offset"]}: maps the trainer's reusable bucket
 * buffer (a cudaIpcMemHandle_t of its allocation; offset: where the buffer starts in it) once per
 * session; it is unmapped at finish / abort. */
static int route_ipc_open(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    NEW_CMD(c, CMD_IPC_OPEN);
    long long bytes = 0, off = 0;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(b, "handle_b64");
    long n = cJSON_IsString(h) ? b64_decode(h->valuestring, c->blob, sizeof c->blob) : -1;
    int rc = 0;
    if (n != GS_IPC_HANDLE_BYTES)
        rc = (srv_errf(&e, 400, "handle_b64", "handle_b64 must be the base64 of a %d-byte cudaIpcMemHandle_t",
                      GS_IPC_HANDLE_BYTES), -1);
    if (rc == 0 && (get_int(b, "", "bytes", 1, 1, (long long)1 << 50, 0, &bytes, &e) ||
                    get_int(b, "", "offset", 0, 0, (long long)1 << 50, 0, &off, &e)))
        rc = -1;
    if (rc == 0 && off % GPU_ALIGN) rc = (srv_errf(&e, 400, "offset", "offset must be a multiple of %d", GPU_ALIGN), -1);
    cJSON_Delete(b);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    c->blob_len = (size_t)n;
    c->ipc_bytes = (size_t)bytes;
    c->ipc_offset = (size_t)off;
    submit_cmd(s, c); /* (the engine checks the session first, then answers 501 on the CPU backend) */
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "success", 1);
        cJSON_AddNumberToObject(o, "bytes", (double)c->ipc_bytes);
    }
    int st = send_cmd_result(conn, c, o);
    free(c);
    return st;
}

/* POST /v1/weights/ipc/bucket {"names", "dtypes", "shapes", "offsets"}: tensors at byte offsets of
 * the open IPC buffer (each a multiple of its dtype size, inside the buffer, not overlapping). */
static int route_ipc_bucket(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    NEW_CMD(c, CMD_IPC_BUCKET);
    int rc = gpu_meta_parse(b, "", "names", "dtypes", "offsets", &c->meta, &e);
    cJSON_Delete(b);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    submit_cmd(s, c);
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "tensors", (double)c->meta.n);
        uint64_t sum = 0;
        for (size_t i = 0; i < c->meta.n; i++) sum += c->meta.t[i].nbytes;
        cJSON_AddNumberToObject(o, "bytes", (double)sum);
    }
    int st = send_cmd_result(conn, c, o);
    gpu_meta_free(&c->meta);
    free(c);
    return st;
}

cJSON *srv_weight_version_json(srv_state *s, const uint64_t *versions, int n)
{
    pthread_mutex_lock(&s->wmu);
    cJSON *o;
    if (n <= 0) {
        o = cJSON_CreateString(s->wpub.version);
    } else if (n == 1) {
        o = cJSON_CreateString(s->vname[versions[0] % 64]);
    } else {
        o = cJSON_CreateArray();
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(o, cJSON_CreateString(s->vname[versions[i] % 64]));
    }
    pthread_mutex_unlock(&s->wmu);
    return o;
}

void srv_weights_init(srv_state *s)
{
    pthread_mutex_init(&s->wmu, NULL);
    pthread_mutex_init(&s->bucket_mu, NULL);
}

void srv_weights_destroy(srv_state *s)
{
    free(s->staging);
    free(s->weights_root);
    pthread_mutex_destroy(&s->wmu);
    pthread_mutex_destroy(&s->bucket_mu);
}

void srv_weights_routes(srv_state *s)
{
    /* native */
    srv_route_add(s, "POST", "/v1/weights/begin", route_begin, 2);
    srv_route_add(s, "POST", "/v1/weights/bucket", route_bucket, 2);
    srv_route_add(s, "POST", "/v1/weights/finish", route_finish, 2);
    srv_route_add(s, "POST", "/v1/weights/abort", route_abort, 2);
    srv_route_add(s, "POST", "/v1/weights/load", route_load, 2);
    srv_route_add(s, "GET", "/v1/weights", route_info, 2);
    srv_route_add(s, "GET", "/v1/weights/checksums", route_checksums, 2);
    /* vLLM */
    srv_route_add(s, "POST", "/pause", route_pause, 2);
    srv_route_add(s, "POST", "/resume", route_resume, 2);
    srv_route_add(s, "GET", "/is_paused", route_is_paused, 2);
    srv_route_add(s, "POST", "/start_weight_update", route_begin, 2);
    srv_route_add(s, "POST", "/start_draft_weight_update", route_begin_draft, 2);
    srv_route_add(s, "POST", "/finish_weight_update", route_finish, 2);
    srv_route_add(s, "GET", "/weight_info", route_weight_version, 2);
    srv_route_add(s, "POST", "/weight_checker", route_checker, 2);
    srv_route_add(s, "POST", "/reset_prefix_cache", route_reset_prefix, 2);
    srv_route_add(s, "POST", "/update_weights", route_nccl_bucket, 2);
    srv_route_add(s, "POST", "/init_weight_transfer_engine", route_nccl_init_vllm, 2);
    /* SGLang */
    srv_route_add(s, "POST", "/update_weights_from_disk", route_sglang_load, 2);
    srv_route_add(s, "POST", "/pause_generation", route_pause, 2);
    srv_route_add(s, "POST", "/continue_generation", route_resume, 2);
    srv_route_add(s, "POST", "/flush_cache", route_reset_prefix, 2);
    srv_route_add(s, "GET", "/get_weight_version", route_weight_version, 2);
    srv_route_add(s, "POST", "/update_weight_version", route_update_version, 2);
    srv_route_add(s, "POST", "/weights_checker", route_checker, 2);
    srv_route_add(s, "POST", "/update_weights_from_distributed", route_nccl_update, 2);
    srv_route_add(s, "POST", "/init_weights_update_group", route_nccl_init_sglang, 2);
    srv_route_add(s, "POST", "/destroy_weights_update_group", route_nccl_destroy, 2);
    /* CUDA IPC (native) */
    srv_route_add(s, "POST", "/v1/weights/ipc/open", route_ipc_open, 2);
    srv_route_add(s, "POST", "/v1/weights/ipc/bucket", route_ipc_bucket, 2);
}
