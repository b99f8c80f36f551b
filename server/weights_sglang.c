/* server/weights_sglang.c — SGLang's weight-side routes (disk loads, pause / continue, the prefix
 * cache, weight versions, checksums, the NCCL weights update group). Each is a thin producer over the
 * commands of weights_api.c (weights_internal.h); the NCCL commands run in weights_gpu.c. SGLang
 * answers most of them with {success, message} and the HTTP status of the outcome.
 * SGLang's memory routes (/release_memory_occupation, /resume_memory_occupation) live with vLLM's in
 * server/memory_api.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/weights_internal.h"

static int route_sglang_load(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    int st = srv_weights_load(s, conn, b, "model_path", SRV_LOAD_SGLANG);
    cJSON_Delete(b);
    return st;
}

static int route_update_version(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
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


/* SGLang POST /init_weights_update_group {master_address, master_port, rank_offset, world_size,
 * group_name, backend, nccl_unique_id_b64 (graphswap)} */
static int route_nccl_init_sglang(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    SRV_NEW_CMD(c, SRV_CMD_NCCL_INIT);
    const char *group = NULL, *backend = NULL;
    int rc = srv_opt_string(b, "group_name", &group, &e) || srv_opt_string(b, "backend", &backend, &e) ? -1 : 0;
    if (rc == 0 && backend && strcmp(backend, "nccl") != 0)
        rc = (srv_errf(&e, 400, "backend", "backend must be \"nccl\""), -1);
    if (rc == 0) rc = srv_parse_nccl_init(b, "", c, &e);
    if (rc == 0) snprintf(c->group, sizeof c->group, "%s", group ? group : "");
    cJSON_Delete(b);
    if (rc == 0 && !srv_gpu_available(s)) rc = (srv_errf(&e, 501, NULL, SRV_GPU_NEEDS_CUDA), -1);
    if (rc != 0) {
        free(c);
        return e.status == 501 ? send_sglang(conn, 501, e.msg) : srv_send_err(conn, &e);
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
    srv_cmd *c = srv_cmd_new(SRV_CMD_NCCL_DESTROY);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    srv_cmd_submit(s, c);
    int st = send_sglang(conn, c->status, c->status == 200 ? "NCCL group destroyed" : c->err);
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
    SRV_NEW_CMD(c, SRV_CMD_NCCL_UPDATE);
    const char *version = NULL;
    int rc = srv_gpu_meta_parse(b, "", "names", "dtypes", NULL, &c->meta, &e);
    if (rc == 0 && (srv_opt_version(b, "weight_version", &version, &e) != 0)) rc = -1;
    if (rc == 0 && version) snprintf(c->version, sizeof c->version, "%s", version);
    c->pause = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "abort_all_requests")) ? ENG_PAUSE_ABORT : ENG_PAUSE_WAIT;
    cJSON_Delete(b);
    if (rc == 0 && !srv_gpu_available(s)) rc = (srv_errf(&e, 501, NULL, SRV_GPU_NEEDS_CUDA), -1);
    if (rc != 0) {
        srv_gpu_meta_free(&c->meta);
        free(c);
        return e.status == 501 ? send_sglang(conn, 501, e.msg) : srv_send_err(conn, &e);
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
    if (ri->query_string) {
        char v[64];
        if (mg_get_var(ri->query_string, strlen(ri->query_string), "timeout", v, sizeof v) >= 0) {
            char *end = NULL;
            errno = 0;
            const double t = strtod(v, &end);
            if (!v[0] || *end || errno || !(t >= 0) || t > 1e9)
                return srv_send_error(conn, 400, "timeout", "timeout must be a number of seconds >= 0");
        }
    }
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
    srv_route_add(s, "POST", "/update_weights_from_disk", route_sglang_load, 2);
    srv_route_add(s, "POST", "/pause_generation", srv_wroute_pause, 2);
    srv_route_add(s, "POST", "/continue_generation", srv_wroute_resume, 2);
    srv_route_add(s, "POST", "/flush_cache", route_flush_cache, 2);
    srv_route_add(s, "GET", "/flush_cache", route_flush_cache, 2);
    srv_route_add(s, "GET", "/get_weight_version", srv_wroute_weight_version, 2);
    srv_route_add(s, "POST", "/update_weight_version", route_update_version, 2);
    srv_route_add(s, "POST", "/weights_checker", srv_wroute_checker, 2);
    srv_route_add(s, "POST", "/update_weights_from_distributed", route_nccl_update, 2);
    srv_route_add(s, "POST", "/init_weights_update_group", route_nccl_init_sglang, 2);
    srv_route_add(s, "POST", "/destroy_weights_update_group", route_nccl_destroy, 2);
}
