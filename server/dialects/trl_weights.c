/* server/dialects/trl_weights.c — the weight-side routes of TRL's `trl vllm-serve` (trl/scripts/vllm_serve.py;
 * the trainer's side is trl/generation/vllm_client.py, huggingface/trl@f2cd577). The paths end in a
 * slash, as TRL's do. Each is a thin producer over the commands of weights_api.c / weights_gpu.c.
 * (TRL's generation routes, /generate/ /chat/ ..., are another file's.)
 *
 *   POST /init_communicator/    {host, port, world_size, client_device_uuid}
 *   POST /update_named_param/   {name, dtype, shape}: one tensor, one broadcast from the trainer
 *   POST /reset_prefix_cache/   ends the TRL session (one hook), then SRV_CMD_RESET_PREFIX
 *   POST /close_communicator/   (no group: 200, as TRL)
 * (TRL@f2cd577 has no /batch_update_named_params/.)
 *
 * TRL's NCCL group, as its vLLM worker builds it (WeightSyncWorkerExtension): the inference side is
 * rank 0 of world 2 — it hosts the torch TCPStore on host:port (StatelessProcessGroup.create with
 * rank 0), makes the ncclUniqueId and publishes it (PyNcclCommunicator: broadcast_obj(id, src=0)),
 * creates the communicator and runs vLLM's warm-up all_reduce; the trainer is rank 1 and the root of
 * every broadcast. Each /update_named_param/ answers at once (TRL's server hands the work to its
 * workers fire-and-forget; the trainer broadcasts only after the answer), then the tensor is
 * received, written, and both ranks run StatelessProcessGroup.barrier() through the store
 * (srv_store_trl_barrier). So each route is a synchronous command (checks, 4xx to the trainer before
 * it broadcasts anything) followed by a detached one (srv_cmd_post) that the engine thread runs in
 * queue order:
 *
 *   init_communicator:  TRL_INIT (no group yet; the id made; the store hosted)   -> 200
 *                       TRL_COMM (detached: the communicator, rank 0 of 2, root 1, warm-up)
 *   update_named_param: TRL_CHECK (the group is there; a TRL session begun if none is open, partial,
 *                       pause "keep"; the tensor checked against the model)  -> 200
 *                       TRL_PARAM (detached: the broadcast received and written; the barrier)
 *   reset_prefix_cache: TRL_FINISH (the session finished: coverage, one hook, guard, new version)
 *   close_communicator: TRL_CLOSE (finish, communicator destroyed, store stopped)
 *
 * One session, one hook: TRL sends no begin or end, so the session its first parameter opens is
 * finished by what the trainer does after its last one — /reset_prefix_cache/ (TRL's
 * VLLMGeneration.sync_weights ends with it) or /close_communicator/ — or, failing those, by the
 * engine thread as soon as a generation request waits for it (trl_settle: vLLM's TRL server
 * serves generation while it loads, so a request never waits on a trainer that updates and then
 * generates without a reset) or the session timeout passes (finished, not aborted: every tensor
 * written was whole). The CPU backend validates every body and answers 501 (no NCCL).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dialects/dialects.h"

#define TRL_WORLD 2 /* graphswap is one rank (rank 0); the trainer rank 1 */
#define TRL_ROOT 1

/* ---- engine side --------------------------------------------------------------------------------- */

static int trl_timeout_ms(const srv_state *s) { return (int)(srv_nccl_timeout_s(s, 0) * 1000); }

static void trl_store_stop(srv_state *s)
{
    srv_store_server_stop(s->trl_store);
    s->trl_store = NULL;
    s->trl_bcast_n = 0;
}

/* Finishes the open TRL session (partial: what was written; one hook per touched model). */
static int trl_finish(srv_state *s, srv_cmd *c, int *st)
{
    eng_weights_info wi;
    eng_weights_get_info(s->rt.e, &wi);
    if (!s->trl_session || !wi.session_open) {
        s->trl_session = 0;
        return *st = 200, 0;
    }
    s->trl_session = 0;
    if (eng_weights_finish(s->rt.e, c ? c->version : "", c->err, sizeof c->err, st) != 0) return -1;
    return *st = 200, 0;
}

/* The session a TRL parameter goes into: the open TRL one, or a new one (partial, target, "keep": a
 * request running now is frozen and goes on with the new weights). *began = 1 when new. */
static int trl_session(srv_state *s, srv_cmd *c, int *began, int *st)
{
    eng_weights_info wi;
    eng_weights_get_info(s->rt.e, &wi);
    *began = 0;
    if (wi.session_open && s->trl_session) return 0;
    if (wi.session_open)
        return snprintf(c->err, sizeof c->err, "another weight-update session is open (begun by another route): "
                        "finish or abort it first"), *st = 409, -1;
    if (eng_weights_begin(s->rt.e, 0, ENG_WMODEL_TARGET, ENG_PAUSE_KEEP, "", &c->session, c->err, sizeof c->err,
                          st) != 0)
        return -1;
    s->paused = 0;
    s->trl_session = *began = 1;
    return 0;
}

static int trl_group_ready(srv_state *s, srv_cmd *c, int *st)
{
    if (s->nccl && s->trl_store && s->nccl_root == TRL_ROOT) return 0;
    return snprintf(c->err, sizeof c->err, "no TRL communicator: POST /init_communicator/ first (or its NCCL init "
                    "failed: see the server's log)"), *st = 409, -1;
}

static void trl_cmd_run(srv_state *s, srv_cmd *c, int *st)
{
    const gs_gpu_transport *x = srv_gpu_xport(s);
    char *err = c->err;
    const size_t el = sizeof c->err;
    int began = 0;
    switch (c->kind) {
    case SRV_CMD_TRL_INIT: {
        if (!x) {
            snprintf(err, el, "%s", SRV_GPU_NEEDS_CUDA);
            *st = 501;
            return;
        }
        if (s->nccl || s->trl_store) {
            snprintf(err, el, "a weight-sync communicator already exists (%s): POST /close_communicator/ first",
                     s->trl_store ? "TRL's" : s->nccl_group);
            *st = 409;
            return;
        }
        if (!x->have_nccl || !x->nccl_unique_id || x->nccl_unique_id(c->blob, err, el) != 0) {
            if (!x->have_nccl) snprintf(err, el, "this server's CUDA module was built without NCCL");
            *st = 501;
            return;
        }
        c->blob_len = GS_NCCL_ID_BYTES;
        srv_store_req r = {.kind = SRV_STORE_TRL, .host = c->master_addr, .port = c->master_port,
                           .rank_offset = 0, .world_size = TRL_WORLD, .timeout_ms = trl_timeout_ms(s)};
        char e2[512];
        if (srv_store_trl_host(&r, c->blob, &s->trl_store, e2, sizeof e2) != 0) {
            snprintf(err, el, "cannot host the TCPStore on %s:%d: %s", c->master_addr, c->master_port, e2);
            *st = 502;
            return;
        }
        s->trl_bcast_n = 1;
        *st = 200;
        return;
    }
    case SRV_CMD_TRL_COMM:
        snprintf(c->what, sizeof c->what, "TRL's NCCL init (rank 0 of %d)", TRL_WORLD);
        if (srv_gpu_nccl_init(s, c, st) != 0) trl_store_stop(s); /* a new /init_communicator/ may retry */
        return;
    case SRV_CMD_TRL_CHECK:
        if (trl_group_ready(s, c, st) != 0 || trl_session(s, c, &began, st) != 0) return;
        snprintf(c->what, sizeof c->what, "update_named_param %.40s", c->meta.t[0].name);
        if (eng_weights_validate(s->rt.e, c->meta.t, c->meta.n, c->what, err, el, st) != 0 ||
            (srv_gpu_meta_frame_need(&c->meta) > s->nccl_staging_bytes &&
             (snprintf(err, el, "%s: %llu bytes is larger than the NCCL staging buffer (%zu bytes)", c->what,
                       (unsigned long long)c->meta.t[0].nbytes, s->nccl_staging_bytes), *st = 400))) {
            if (began) { /* nothing written: the weights stay what they were */
                int st2;
                char e2[64];
                eng_weights_abort(s->rt.e, e2, sizeof e2, &st2);
                s->trl_session = 0;
            }
            return;
        }
        *st = 200;
        return;
    case SRV_CMD_TRL_PARAM: {
        snprintf(c->what, sizeof c->what, "update_named_param %.40s", c->meta.t[0].name);
        if (trl_group_ready(s, c, st) != 0) return; /* (closed meanwhile: the trainer's broadcast fails) */
        /* the session again: trl_settle may have finished it since TRL_CHECK */
        if (trl_session(s, c, &began, st) != 0) {
            size_t l = strlen(err);
            snprintf(err + l, el - l, "; its broadcast was not received");
            return;
        }
        int rc = srv_gpu_nccl_bucket(s, c, st); /* refused: its bytes are still received (drained) */
        if (!s->nccl) { /* the broadcast failed: the communicator is gone, and the store with it */
            trl_store_stop(s);
            return;
        }
        /* StatelessProcessGroup.barrier() after the broadcast, as both TRL sides run it */
        char e2[512];
        if (srv_store_trl_barrier(s->trl_store, TRL_WORLD, &s->trl_bcast_n, trl_timeout_ms(s), e2, sizeof e2) != 0) {
            size_t l = strlen(err);
            snprintf(err + l, el - l, "%s%s", l ? "; " : "", e2);
            if (rc == 0) *st = 504;
        }
        return;
    }
    case SRV_CMD_TRL_FINISH:
        trl_finish(s, c, st);
        return;
    case SRV_CMD_TRL_CLOSE:
        trl_finish(s, c, st);
        srv_gpu_nccl_release(s);
        trl_store_stop(s); /* (*st: the finish's) */
        return;
    default:
        snprintf(err, el, "not a TRL command");
        *st = 500;
    }
}

/* A TRL command: the runner (server/weights/weights_api.c srv_cmds_run) calls trl_cmd_run for it. */
static srv_cmd *trl_cmd_new(srv_cmd_kind k)
{
    srv_cmd *c = srv_cmd_new(k);
    if (c) c->run = trl_cmd_run;
    return c;
}

static int trl_settle(srv_state *s, int expired)
{
    if (!s->trl_session) return 0;
    if (!expired && eng_num_waiting(s->rt.e) == 0) return 0;
    pthread_mutex_lock(&s->mu);
    const int queued = s->cmd_head != NULL; /* a parameter already on its way: let it come first */
    pthread_mutex_unlock(&s->mu);
    if (queued && !expired) return 0;
    srv_cmd c;
    memset(&c, 0, sizeof c);
    int st;
    if (trl_finish(s, &c, &st) != 0)
        srv_logf("error", "weights", "finishing TRL's session%s: %s", expired ? " (timed out)" : "", c.err);
    else if (expired)
        srv_logf("warn", "weights", "TRL's weight session finished after --weight-session-timeout without a "
                 "/reset_prefix_cache/");
    srv_weights_publish(s);
    return 1;
}

void srv_weights_trl_destroy(srv_state *s) { trl_store_stop(s); }

/* ---- handler side -------------------------------------------------------------------------------- */

/* {"message": msg} with 200, TRL's answer. */
static int send_message(struct mg_connection *conn, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "message", msg);
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}

/* Runs c (synchronous), then on 200 posts its continuation `then` (c's arguments, its meta moved)
 * and answers TRL's {"message": msg}; else c's error. Frees c. */
static int submit_then_post(srv_state *s, struct mg_connection *conn, srv_cmd *c, srv_cmd_kind then,
                            const char *msg)
{
    if (srv_cmd_submit(s, c) != 200) {
        int st = srv_cmd_send_result(conn, c, NULL);
        srv_gpu_meta_free(&c->meta);
        free(c);
        return st;
    }
    srv_cmd *d = trl_cmd_new(then);
    if (!d) {
        srv_gpu_meta_free(&c->meta);
        free(c);
        return srv_send_error(conn, 500, NULL, "out of memory");
    }
    memcpy(d->blob, c->blob, sizeof d->blob);
    d->blob_len = c->blob_len;
    d->rank = c->rank;
    d->world = c->world;
    d->root = c->root;
    d->warmup = c->warmup;
    d->timeout = c->timeout;
    snprintf(d->group, sizeof d->group, "%s", c->group);
    d->meta = c->meta; /* moved */
    memset(&c->meta, 0, sizeof c->meta);
    free(c);
    srv_cmd_post(s, d);
    return send_message(conn, msg);
}

/* POST /reset_prefix_cache/: TRL's sync_weights ends with it, so it finishes a TRL session first. */
static int route_reset_prefix(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e); /* (TRL's client sends no body) */
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    srv_cmd *f = trl_cmd_new(SRV_CMD_TRL_FINISH);
    if (!f) return srv_send_error(conn, 500, NULL, "out of memory");
    if (srv_cmd_submit(s, f) != 200) {
        int st = srv_cmd_send_result(conn, f, NULL);
        free(f);
        return st;
    }
    free(f);
    srv_cmd *c = srv_cmd_new(SRV_CMD_RESET_PREFIX);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    int st = srv_cmd_submit(s, c) == 200 ? send_message(conn, "Request received, resetting prefix cache status: True")
                                         : srv_cmd_send_result(conn, c, NULL);
    free(c);
    return st;
}

/* A required non-empty string field of at most max bytes. */
static int req_string(const cJSON *b, const char *key, size_t max, const char **out, srv_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, key);
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) > max)
        return srv_errf(e, 400, key, "%s must be a non-empty string of at most %zu bytes", key, max), -1;
    *out = v->valuestring;
    return 0;
}

/* POST /init_communicator/ {"host", "port", "world_size", "client_device_uuid"}. TRL's server
 * ignores world_size and uses its own tensor_parallel_size * data_parallel_size + 1: graphswap is
 * one rank, so the group is 2 (this server rank 0, the trainer rank 1) and another world_size means
 * the trainer counts other ranks that will never join. */
static int route_init_communicator(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const char *host = NULL, *uuid = NULL;
    long long port = 0, world = 0;
    int rc = req_string(b, "host", 255, &host, &e) || srv_json_int(b, "", "port", 1, 1, 65535, 0, &port, &e) ||
                     srv_json_int(b, "", "world_size", 1, 1, 1 << 20, 0, &world, &e) ||
                     req_string(b, "client_device_uuid", 128, &uuid, &e)
                 ? -1
                 : 0;
    if (rc == 0 && world != 2)
        rc = srv_errf(&e, 400, "world_size", "world_size must be 2 (got %lld): this server is one rank (rank 0) and "
                      "the trainer the other (rank 1)", world);
    if (rc == 0 && strlen(host) >= sizeof ((srv_cmd *)0)->master_addr)
        rc = srv_errf(&e, 400, "host", "host is too long");
    srv_cmd *c = rc == 0 ? trl_cmd_new(SRV_CMD_TRL_INIT) : NULL;
    if (rc == 0 && !c) rc = srv_errf(&e, 500, NULL, "out of memory");
    if (rc == 0) {
        snprintf(c->master_addr, sizeof c->master_addr, "%s", host); /* where the store listens ("0.0.0.0") */
        c->master_port = (int)port;
    }
    cJSON_Delete(b);
    /* on the CPU backend: 501 before any network I/O */
    if (rc == 0 && !srv_gpu_available(s)) rc = srv_errf(&e, 501, NULL, SRV_GPU_NEEDS_CUDA);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    c->rank = 0;
    c->world = TRL_WORLD;
    c->root = TRL_ROOT;
    c->warmup = srv_store_warmup_allreduce(SRV_STORE_TRL); /* PyNcclCommunicator's, as vLLM's ranks */
    snprintf(c->group, sizeof c->group, "trl");
    /* the id and the store now (the trainer connects as soon as we answer); the communicator after */
    return submit_then_post(s, conn, c, SRV_CMD_TRL_COMM, "Request received, initializing communicator");
}

/* POST /update_named_param/ {"name", "dtype" ("torch.bfloat16"), "shape": [...]}: one tensor, its
 * bytes one broadcast from the trainer into the TRL session (see the top of the file). */
static int route_update_named_param(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    srv_gpu_meta meta;
    memset(&meta, 0, sizeof meta);
    const char *name = NULL, *dtype = NULL;
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(b, "shape");
    int rc = req_string(b, "name", 512, &name, &e) || req_string(b, "dtype", 64, &dtype, &e) ? -1 : 0;
    if (rc == 0 && !cJSON_IsArray(shape)) rc = srv_errf(&e, 400, "shape", "shape must be a list of dimensions");
    if (rc == 0) { /* the one-tensor form of an NCCL bucket's metadata, parsed by the same code */
        cJSON *m = cJSON_CreateObject();
        cJSON *n = cJSON_AddArrayToObject(m, "name"), *d = cJSON_AddArrayToObject(m, "dtype");
        cJSON *sh = cJSON_AddArrayToObject(m, "shapes");
        cJSON_AddItemToArray(n, cJSON_CreateString(name));
        cJSON_AddItemToArray(d, cJSON_CreateString(dtype));
        cJSON_AddItemToArray(sh, cJSON_Duplicate(shape, 1));
        rc = sh && cJSON_GetArraySize(sh) == 1 ? srv_gpu_meta_parse(m, "", "name", "dtype", NULL, &meta, &e)
                                               : srv_errf(&e, 500, NULL, "out of memory");
        cJSON_Delete(m);
    }
    cJSON_Delete(b);
    if (rc == 0 && !srv_gpu_available(s)) {
        srv_gpu_meta_free(&meta);
        rc = srv_errf(&e, 501, NULL, SRV_GPU_NEEDS_CUDA);
    }
    srv_cmd *c = rc == 0 ? trl_cmd_new(SRV_CMD_TRL_CHECK) : NULL;
    if (rc == 0 && !c) {
        srv_gpu_meta_free(&meta);
        rc = srv_errf(&e, 500, NULL, "out of memory");
    }
    if (rc != 0) return srv_send_err(conn, &e);
    c->meta = meta;
    /* checked now (a refusal reaches the trainer before it broadcasts); received after the answer */
    return submit_then_post(s, conn, c, SRV_CMD_TRL_PARAM, "Request received, updating named parameter");
}

static int route_close_communicator(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    if (!srv_gpu_available(s)) return srv_send_error(conn, 501, NULL, "%s", SRV_GPU_NEEDS_CUDA);
    srv_cmd *c = trl_cmd_new(SRV_CMD_TRL_CLOSE);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    /* TRL closes whatever is there (no group is not an error); an open TRL session is finished */
    int st = srv_cmd_submit(s, c) == 200 ? send_message(conn, "Request received, closing communicator")
                                         : srv_cmd_send_result(conn, c, NULL);
    free(c);
    return st;
}

void srv_weights_trl_routes(srv_state *s)
{
    s->w_settle = trl_settle;
    srv_route_add(&s->http, "POST", "/reset_prefix_cache/", route_reset_prefix, 2);
    srv_route_add(&s->http, "POST", "/init_communicator/", route_init_communicator, 2);
    srv_route_add(&s->http, "POST", "/update_named_param/", route_update_named_param, 2);
    srv_route_add(&s->http, "POST", "/close_communicator/", route_close_communicator, 2);
}
