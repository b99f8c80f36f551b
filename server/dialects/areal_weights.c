/* server/dialects/areal_weights.c — AReaL's vLLM backend: the weight routes its launcher adds to vLLM
 * (inclusionAI/AReaL@4aef98d8d818af55b43621aaadba047ae10f4e77 areal/engine/vllm_ext/
 * areal_vllm_server.py; the requests are built by areal/engine/vllm_remote.py VLLMBackend and sent by
 * areal/infra/remote_inf_engine.py with aiohttp `json=payload`; the client only checks that the
 * status is 2xx). Each route is a thin producer over the commands of weights_api.c and the NCCL
 * group of weights_sglang.c (AReaL's trainer creates its group as SGLang's does).
 *
 *   POST /areal_update_weights {"model_path"[, "load_format", "abort_all_requests"]}
 *        a disk load of model_path, confined to --weights-root as every disk load (srv_weights_load,
 *        SRV_LOAD_AREAL: running requests are aborted, as AReaL's server pauses without waiting; a
 *        server paused before stays paused). {"success": true, "message": "TP rank: 0 success\n"}.
 *   POST /areal_pause_generation {}    abort running requests and pause; {success, message}
 *   POST /areal_continue_generation {} resume; {success, message}
 *   POST /areal_init_weights_update_group {master_address, master_port (a string), rank_offset,
 *        world_size, backend, group_name}: SGLang's init body field for field. The trainer
 *        (fsdp_engine.py / megatron_engine.py _init_weight_update_from_distributed) calls
 *        init_custom_process_group: torch's tcp:// rendezvous, PrefixStore(group_name) and a lazily
 *        created ProcessGroupNCCL, exactly as SGLang's trainers do, so the SRV_STORE_SGLANG keys
 *        ("/G/G//cuda//0") and no warm-up collective (AReaL warms up its training groups only).
 *   POST /areal_set_update_weight_meta {names, dtypes, shapes, group_name}: the tensors of the
 *        next update (AReaL's worker keeps them until the next meta); validated here whole.
 *   POST /areal_update_weights_xccl {}: one partial session receiving those tensors, each its own
 *        broadcast from rank 0 (the trainer's _update_bucket_weights_from_distributed_async
 *        broadcasts tensor by tensor), running requests aborted, paused state kept.
 * On the CPU backend the three NCCL routes validate their bodies (400 naming the field) and answer
 * 501. The LoRA routes (/areal_update_weights_lora, /areal_set_update_weight_meta_lora,
 * /areal_update_weights_lora_xccl) answer 501: graphswap serves no adapters.
 *
 * Answers: AReaL's {"success", "message"} (its to_json_response) with the status of the outcome;
 * a body AReaL's pydantic models would refuse gets graphswap's 400 naming the field (AReaL: 422).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dialects/dialects.h"

static int send_areal(struct mg_connection *conn, int status, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", status == 200);
    cJSON_AddStringToObject(o, "message", msg);
    int st = srv_send_json(conn, status, o);
    cJSON_Delete(o);
    return st;
}

/* The success message of AReaL's build_response for one worker (graphswap is TP rank 0 of 1). */
#define AREAL_OK "TP rank: 0 success\n"

static int route_update_disk(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(b, "load_format");
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(b, "abort_all_requests");
    int st;
    /* (vLLM's loader reads what the folder holds with "auto"; graphswap reads safetensors only) */
    if (fmt && !cJSON_IsNull(fmt) &&
        !(cJSON_IsString(fmt) && (strcmp(fmt->valuestring, "auto") == 0 || strcmp(fmt->valuestring, "safetensors") == 0)))
        st = srv_send_error(conn, 400, "load_format", "load_format must be \"auto\" or \"safetensors\" (graphswap "
                            "loads safetensors checkpoints only)");
    /* (AReaL's server aborts running requests whatever it says; it is only checked) */
    else if (ab && !cJSON_IsBool(ab))
        st = srv_send_error(conn, 400, "abort_all_requests", "abort_all_requests must be a boolean");
    else
        st = srv_weights_load(s, conn, b, "model_path", SRV_LOAD_AREAL);
    cJSON_Delete(b);
    return st;
}

/* AReaL's pause aborts running requests (vLLM pause_generation(wait_for_inflight_requests=False))
 * and holds new ones at its /v1/completions until continue: graphswap's pause "abort" (new requests
 * queue). vLLM also drops its prefix cache there; graphswap's never serves KV of older weights (I6),
 * so a pause leaves it. */
static int route_pause(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    SRV_NEW_CMD(c, SRV_CMD_PAUSE);
    c->pause = ENG_PAUSE_ABORT;
    srv_cmd_submit(s, c);
    int st = send_areal(conn, c->status, c->status == 200 ? "Generation paused and all requests aborted" : c->err);
    free(c);
    return st;
}

static int route_continue(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    SRV_NEW_CMD(c, SRV_CMD_RESUME);
    srv_cmd_submit(s, c);
    int st = send_areal(conn, c->status, c->status == 200 ? "Generation continued" : c->err);
    free(c);
    return st;
}

static int route_init_group(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    srv_cmd *c = srv_cmd_new(SRV_CMD_NCCL_INIT);
    int rc = 0;
    /* AReaL's UpdateGroupRequest requires backend (its platform's, "nccl" on CUDA); the rest is
     * SGLang's body (group_name required without nccl_unique_id_b64, backend "nccl") */
    if (!c) rc = srv_errf(&e, 500, NULL, "out of memory");
    else if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(b, "backend")))
        rc = srv_errf(&e, 400, "backend", "backend (\"nccl\") is required");
    else if (srv_nccl_init_parse(b, SRV_STORE_SGLANG, c, &e) != 0) rc = -1;
    cJSON_Delete(b);
    if (rc == 0 && !srv_gpu_available(s)) rc = srv_errf(&e, 501, NULL, SRV_GPU_NEEDS_CUDA);
    if (rc != 0) {
        free(c);
        return e.status >= 500 ? send_areal(conn, e.status, e.msg) : srv_send_err(conn, &e);
    }
    return srv_nccl_group_init(s, conn, c, "/areal_update_weights_xccl");
}

/* names / dtypes / shapes / group_name of a meta body; 0 or -1 with e filled. */
static int meta_parse(const cJSON *b, srv_gpu_meta *m, srv_err *e)
{
    if (srv_gpu_meta_parse(b, "", "names", "dtypes", NULL, m, e) != 0) return -1;
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(b, "group_name");
    if (!cJSON_IsString(g) || !g->valuestring[0]) {
        srv_gpu_meta_free(m);
        return srv_errf(e, 400, "group_name", "group_name must be the name of the weights update group"), -1;
    }
    return 0;
}

static int route_set_meta(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    srv_gpu_meta m;
    if (meta_parse(b, &m, &e) != 0) {
        cJSON_Delete(b);
        return srv_send_err(conn, &e);
    }
    srv_gpu_meta_free(&m);
    if (!srv_gpu_available(s)) {
        cJSON_Delete(b);
        return send_areal(conn, 501, SRV_GPU_NEEDS_CUDA);
    }
    pthread_mutex_lock(&s->store_mu);
    cJSON_Delete(s->areal_meta);
    s->areal_meta = b;
    pthread_mutex_unlock(&s->store_mu);
    return send_areal(conn, 200, AREAL_OK);
}

static int route_update_xccl(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e); /* AReaL sends {} */
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    if (!srv_gpu_available(s)) return send_areal(conn, 501, SRV_GPU_NEEDS_CUDA);
    pthread_mutex_lock(&s->store_mu);
    const int have = s->areal_meta != NULL;
    cJSON *meta = have ? cJSON_Duplicate(s->areal_meta, 1) : NULL;
    pthread_mutex_unlock(&s->store_mu);
    if (!have) return send_areal(conn, 409, "no weight meta: POST /areal_set_update_weight_meta first");
    srv_cmd *c = meta ? srv_cmd_new(SRV_CMD_NCCL_UPDATE) : NULL;
    /* (the meta was validated when it was set: only memory can fail here) */
    int rc = c ? meta_parse(meta, &c->meta, &e) : srv_errf(&e, 500, NULL, "out of memory");
    cJSON_Delete(meta);
    if (rc != 0) {
        free(c);
        return send_areal(conn, e.status, e.msg);
    }
    c->pause = ENG_PAUSE_ABORT;
    /* (one broadcast per tensor: srv_gpu_meta_parse's framing) */
    return srv_nccl_group_update(s, conn, c);
}

static int route_lora(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    return send_areal(conn, 501, "graphswap serves no LoRA adapters: update the full weights "
                                 "(/areal_update_weights or /areal_update_weights_xccl)");
}

void srv_weights_areal_destroy(srv_state *s)
{
    pthread_mutex_lock(&s->store_mu);
    cJSON_Delete(s->areal_meta);
    s->areal_meta = NULL;
    pthread_mutex_unlock(&s->store_mu);
}

void srv_weights_areal_routes(srv_state *s)
{
    srv_route_add(&s->http, "POST", "/areal_update_weights", route_update_disk, 2);
    srv_route_add(&s->http, "POST", "/areal_pause_generation", route_pause, 2);
    srv_route_add(&s->http, "POST", "/areal_continue_generation", route_continue, 2);
    srv_route_add(&s->http, "POST", "/areal_init_weights_update_group", route_init_group, 2);
    srv_route_add(&s->http, "POST", "/areal_set_update_weight_meta", route_set_meta, 2);
    srv_route_add(&s->http, "POST", "/areal_update_weights_xccl", route_update_xccl, 2);
    srv_route_add(&s->http, "POST", "/areal_update_weights_lora", route_lora, 2);
    srv_route_add(&s->http, "POST", "/areal_set_update_weight_meta_lora", route_lora, 2);
    srv_route_add(&s->http, "POST", "/areal_update_weights_lora_xccl", route_lora, 2);
}
