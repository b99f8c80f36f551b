/* server/dialects/sglang_weights.c — SGLang's weight-side routes (disk loads, pause / continue, the prefix
 * cache, weight versions, checksums, the NCCL weights update group). Each is a thin producer over the
 * commands of weights_api.c (weights_internal.h); the NCCL commands run in weights_gpu.c. SGLang
 * answers most of them with {success, message} and the HTTP status of the outcome.
 * SGLang's memory routes (/release_memory_occupation, /resume_memory_occupation) live with vLLM's in
 * server/weights/memory_api.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dialects/dialects.h"

static int route_sglang_load(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    int st = srv_weights_load(s, conn, b, "model_path", SRV_LOAD_SGLANG);
    cJSON_Delete(b);
    return st;
}

static int route_update_version(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const char *v = NULL;
    if (srv_opt_version(b, "new_version", &v, &e) != 0) {
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
    return srv_cmd_simple(s, conn, SRV_CMD_SET_VERSION, ver, o);
}

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


/* The pending group (joined, no id yet) out of srv_state: *g and *ic are the caller's, NULL when
 * none. busy: mark a fetch under way when there is one (a concurrent init is refused meanwhile). */
static void store_take(srv_state *s, srv_store_group **g, srv_cmd **ic, int busy)
{
    pthread_mutex_lock(&s->store_mu);
    *g = s->store_group;
    *ic = s->store_init;
    s->store_group = NULL;
    s->store_init = NULL;
    if (*g && busy) s->store_busy = 1;
    pthread_mutex_unlock(&s->store_mu);
}

static void store_drop(srv_store_group *g, srv_cmd *ic)
{
    if (g) srv_store_group_close(g);
    if (ic) cJSON_Delete(ic->result);
    free(ic);
}

void srv_weights_sglang_destroy(srv_state *s)
{
    srv_store_group *g;
    srv_cmd *ic;
    store_take(s, &g, &ic, 0);
    store_drop(g, ic);
}

/* SGLang POST /init_weights_update_group {master_address, master_port, rank_offset, world_size,
 * group_name, backend[, staging_bytes, timeout_s, nccl_unique_id_b64 (a test path)]}.
 * SGLang's trainer (init_custom_process_group) hosts a TCPStore at master_address:master_port, but
 * publishes its ncclUniqueId only at its first collective on the group (ProcessGroupNCCL creates
 * communicators lazily), i.e. the first broadcast of /update_weights_from_distributed. So here
 * graphswap only joins the store (srv_store_join on this handler thread: the trainer's init waits for
 * it) and answers at once; the id is fetched, and the communicator created, when the first update
 * comes. With nccl_unique_id_b64 the communicator is created here. */
static int route_nccl_init_sglang(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    srv_cmd *c = srv_nccl_init_request(s, conn, SRV_STORE_SGLANG, &e);
    if (!c) return e.status >= 500 ? send_sglang(conn, e.status, e.msg) : srv_send_err(conn, &e);
    return srv_nccl_group_init(s, conn, c, "update_weights_from_distributed");
}

/* The rest of an SGLang-style init once its body is parsed (also AReaL's vLLM init route, whose
 * trainer creates the group the same way): join the store and keep the group pending, or, with
 * nccl_unique_id_b64, create the communicator now. */
int srv_nccl_group_init(srv_state *s, struct mg_connection *conn, srv_cmd *c, const char *update_route)
{
    srv_err e;
    pthread_mutex_lock(&s->store_mu);
    const int busy = s->store_busy || s->store_group;
    if (!busy && c->rendezvous) s->store_busy = 1;
    pthread_mutex_unlock(&s->store_mu);
    if (busy) {
        free(c);
        return send_sglang(conn, 409, "a weights update group is already joined (or being joined): POST "
                                      "/destroy_weights_update_group first");
    }
    if (c->rendezvous) {
        srv_store_group *g = NULL;
        int rc = srv_nccl_store_join(c, &g, &e);
        char msg[1024]; /* written before c is shared: an update may take it at once */
        if (rc == 0)
            snprintf(msg, sizeof msg, "joined the trainer's TCPStore at %s:%d as rank %d of %d (group %s); the "
                     "NCCL communicator is created at the first %s", c->master_addr, c->master_port, c->rank,
                     c->world, c->group, update_route);
        pthread_mutex_lock(&s->store_mu);
        s->store_busy = 0;
        if (rc == 0) {
            s->store_group = g;
            s->store_init = c;
        }
        pthread_mutex_unlock(&s->store_mu);
        if (rc != 0) {
            free(c);
            return send_sglang(conn, e.status, e.msg);
        }
        return send_sglang(conn, 200, msg);
    }
    srv_cmd_submit(s, c);
    int st = c->status == 200 ? srv_send_json(conn, 200, c->result) : send_sglang(conn, c->status, c->err);
    cJSON_Delete(c->result);
    free(c);
    return st;
}

static int route_nccl_destroy(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    if (!srv_gpu_available(s)) return send_sglang(conn, 501, SRV_GPU_NEEDS_CUDA);
    srv_store_group *g;
    srv_cmd *ic;
    store_take(s, &g, &ic, 0); /* a group joined but never used: leave the store */
    const int pending = g != NULL;
    store_drop(g, ic);
    srv_cmd *c = srv_cmd_new(SRV_CMD_NCCL_DESTROY);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    srv_cmd_submit(s, c);
    int st = pending && c->status == 409 ? send_sglang(conn, 200, "weights update group left (its NCCL communicator "
                                                                  "had not been created yet)")
                                         : send_sglang(conn, c->status, c->status == 200 ? "NCCL group destroyed" : c->err);
    free(c);
    return st;
}

/* SGLang POST /update_weights_from_distributed {names, dtypes, shapes, group_name, flush_cache,
 * weight_version[, abort_all_requests, load_format]}: a partial session (begin, this bucket,
 * finish). The prefix cache is always dropped at finish (I6), whatever flush_cache says. The bytes
 * come as SGLang's model runner receives them (sgl-project/sglang python/sglang/srt/
 * model_executor/model_runner.py update_weights_from_distributed): one torch.distributed.broadcast
 * per tensor in names order, or with load_format "flattened_bucket" one broadcast of them all back
 * to back (_update_bucketed_weights_from_distributed, FlattenedTensorBucket: each tensor
 * flatten().view(uint8), concatenated). */
static int route_nccl_update(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    SRV_NEW_CMD(c, SRV_CMD_NCCL_UPDATE);
    const char *version = NULL;
    int rc = srv_gpu_meta_parse(b, "", "names", "dtypes", NULL, &c->meta, &e);
    if (rc == 0 && (srv_opt_version(b, "weight_version", &version, &e) != 0)) rc = -1;
    if (rc == 0 && version) snprintf(c->version, sizeof c->version, "%s", version);
    const cJSON *lf = cJSON_GetObjectItemCaseSensitive(b, "load_format");
    if (rc == 0 && lf && !cJSON_IsNull(lf)) {
        if (!cJSON_IsString(lf) || strcmp(lf->valuestring, "flattened_bucket") != 0)
            rc = srv_errf(&e, 400, "load_format", "load_format must be null or \"flattened_bucket\"");
        else rc = srv_gpu_meta_chunks(&c->meta, UINT64_MAX, &e);
    }
    c->pause = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "abort_all_requests")) ? ENG_PAUSE_ABORT : ENG_PAUSE_WAIT;
    cJSON_Delete(b);
    if (rc != 0) {
        srv_gpu_meta_free(&c->meta);
        free(c);
        return srv_send_err(conn, &e);
    }
    return srv_nccl_group_update(s, conn, c);
}

/* The rest of an SGLang-style update once its tensors are parsed into c (also AReaL's
 * /areal_update_weights_xccl): 501 on the CPU backend; else the pending group's communicator first,
 * then the update. */
int srv_nccl_group_update(srv_state *s, struct mg_connection *conn, srv_cmd *c)
{
    srv_err e;
    int rc = 0;
    if (!srv_gpu_available(s)) {
        srv_gpu_meta_free(&c->meta);
        free(c);
        return send_sglang(conn, 501, SRV_GPU_NEEDS_CUDA);
    }
    /* the first update after a TCPStore join: the trainer publishes its id as its broadcast begins */
    srv_store_group *g;
    srv_cmd *ic;
    store_take(s, &g, &ic, 1);
    if (g) {
        rc = srv_nccl_store_fetch(g, ic, &e);
        srv_store_group_close(g); /* the id is all graphswap needs from the store */
        if (rc == 0) {
            srv_cmd_submit(s, ic);
            if (ic->status != 200) rc = srv_errf(&e, ic->status, NULL, "creating the NCCL communicator: %s", ic->err);
        }
        pthread_mutex_lock(&s->store_mu);
        s->store_busy = 0;
        pthread_mutex_unlock(&s->store_mu);
        store_drop(NULL, ic);
        if (rc != 0) {
            srv_gpu_meta_free(&c->meta);
            free(c);
            return send_sglang(conn, e.status, e.msg);
        }
    }
    srv_cmd_submit(s, c);
    int st = send_sglang(conn, c->status, c->status == 200 ? "Succeeded to update parameter online." : c->err);
    srv_gpu_meta_free(&c->meta);
    free(c);
    return st;
}

/* GET or POST /flush_cache[?timeout=S]: SGLang answers 200 with a text body (clients match its first
 * words; sgl-project/sglang@9c0549b python/sglang/srt/entrypoints/http_server.py flush_cache). SGLang
 * skips the flush while requests run or wait (and retries for `timeout` seconds); graphswap's reset
 * is a command between steps that always happens, so the timeout is only validated. */
static int route_flush_cache(srv_state *s, struct mg_connection *conn)
{
    const struct mg_request_info *ri = mg_get_request_info(conn);
    double t;
    if (srv_query_seconds(conn, "timeout", 0, 1e9, &t) < 0)
        return srv_send_error(conn, 400, "timeout", "timeout must be a number of seconds >= 0");
    if (strcmp(ri->request_method, "POST") == 0) {
        srv_err e;
        cJSON *b = srv_read_json_opt(s, conn, &e); /* (none, or a JSON object: SGLang ignores it) */
        if (!b) return srv_send_err(conn, &e);
        cJSON_Delete(b);
    }
    srv_cmd *c = srv_cmd_new(SRV_CMD_RESET_PREFIX);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    int st;
    if (srv_cmd_submit(s, c) == 200) {
        static const char msg[] = "Cache flushed.\nPlease check backend logs for more details. (When there are "
                                  "running or waiting requests, the operation will not be performed.)\n";
        st = srv_send(conn, 200, "text/plain; charset=utf-8", NULL, msg, sizeof msg - 1);
    } else {
        st = srv_cmd_send_result(conn, c, NULL);
    }
    free(c);
    return st;
}

void srv_weights_sglang_routes(srv_state *s)
{
    srv_route_add(&s->http, "POST", "/update_weights_from_disk", route_sglang_load, 2);
    srv_route_add(&s->http, "POST", "/pause_generation", srv_wroute_pause, 2);
    srv_route_add(&s->http, "POST", "/continue_generation", srv_wroute_resume, 2);
    srv_route_add(&s->http, "POST", "/flush_cache", route_flush_cache, 2);
    srv_route_add(&s->http, "GET", "/flush_cache", route_flush_cache, 2);
    srv_route_add(&s->http, "GET", "/get_weight_version", srv_wroute_weight_version, 2);
    srv_route_add(&s->http, "POST", "/update_weight_version", route_update_version, 2);
    srv_route_add(&s->http, "POST", "/weights_checker", srv_wroute_checker, 2);
    srv_route_add(&s->http, "POST", "/update_weights_from_distributed", route_nccl_update, 2);
    srv_route_add(&s->http, "POST", "/init_weights_update_group", route_nccl_init_sglang, 2);
    srv_route_add(&s->http, "POST", "/destroy_weights_update_group", route_nccl_destroy, 2);
    srv_weights_sglang_tensor_routes(s);
}
