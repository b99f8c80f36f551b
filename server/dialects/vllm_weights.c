/* server/dialects/vllm_weights.c — vLLM's weight-side routes (vllm serve with its RL extensions: pause /
 * resume, the weight-update session, checksums, the prefix cache, the NCCL weight transfer engine).
 * Each is a thin producer over the commands of weights_api.c (weights_internal.h); the NCCL commands
 * run in weights_gpu.c. prime-rl's server is vLLM with a few routes of its own: its filesystem
 * /update_weights form is served here too (its /init_broadcaster in weights_primerl.c; SkyRL's
 * /collective_rpc weight-sync methods in weights_skyrl.c).
 * vLLM's memory routes (/sleep, /wake_up, /is_sleeping) live with SGLang's in server/weights/memory_api.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dialects/dialects.h"

static int route_begin_draft(srv_state *s, struct mg_connection *conn)
{
    return srv_wroute_begin_model(s, conn, ENG_WMODEL_DRAFT);
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

/* vLLM POST /init_weight_transfer_engine {"init_info":{master_address, master_port, rank_offset,
 * world_size[, staging_bytes, timeout_s, nccl_unique_id_b64]}}: the trainer (rank 0) hosts a
 * TCPStore at master_address:master_port (vLLM's StatelessProcessGroup) and publishes its
 * ncclUniqueId there; graphswap joins as rank rank_offset, fetches it on this handler thread
 * (srv_nccl_rendezvous: 504 when the trainer's store or id does not come in time, 502 on another
 * failure), then the engine thread creates the communicator and runs vLLM's warm-up all_reduce.
 * nccl_unique_id_b64 (a test path) skips the rendezvous. */
static int route_nccl_init_vllm(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    srv_cmd *c = srv_nccl_init_request(s, conn, SRV_STORE_VLLM, &e);
    if (!c) return srv_send_err(conn, &e);
    if (c->rendezvous && srv_nccl_rendezvous(c, SRV_STORE_VLLM, &e) != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    srv_cmd_submit(s, c);
    int st = srv_cmd_send_result(conn, c, c->result);
    free(c);
    return st;
}

/* vLLM POST /update_weights {"update_info":{names, dtype_names, shapes[, packed,
 * packed_buffer_size_bytes, packed_num_buffers]}}: tensors of an open session, received as vLLM's
 * NCCLWeightTransferEngine.trainer_send_weights broadcasts them (srv_gpu_meta_parse_vllm). */
static int nccl_bucket(srv_state *s, struct mg_connection *conn, cJSON *b)
{
    srv_err e;
    const cJSON *ui = cJSON_GetObjectItemCaseSensitive(b, "update_info");
    SRV_NEW_CMD(c, SRV_CMD_NCCL_BUCKET);
    int rc = -1;
    if (!cJSON_IsObject(ui))
        srv_errf(&e, 400, "update_info", "update_info must be an object (vLLM's NCCL bucket), or give weight_dir "
                 "(prime-rl: a checkpoint folder to load from disk)");
    else rc = srv_gpu_meta_parse_vllm(ui, "update_info.", &c->meta, &e);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    /* (on the CPU backend the engine still checks the session and the names, then answers 501) */
    srv_cmd_submit(s, c);
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "tensors", (double)c->meta.n);
        cJSON_AddNumberToObject(o, "bytes", (double)c->meta.total);
    }
    int st = srv_cmd_send_result(conn, c, o);
    srv_gpu_meta_free(&c->meta);
    free(c);
    return st;
}

/* POST /update_weights, two forms told apart by the body's fields:
 *   {"update_info": {...}}    vLLM's NCCL bucket (above)
 *   {"weight_dir": "DIR"}     prime-rl's filesystem update: a disk load of DIR (confined to
 *                             --weights-root, as /v1/weights/load), answered {"status": "ok"}; a
 *                             "pause" field may override the default "keep" (srv_weights_load).
 *                             After a successful prime-rl /init_broadcaster (CUDA only) the same
 *                             body means "receive the trainer's NCCL broadcast" (prime-rl's NCCL
 *                             worker ignores the folder): weights_primerl.c (compile-checked only)
 * Giving both is refused: the server would have to guess which transport the trainer drives. */
static int route_update_weights(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const cJSON *wd = cJSON_GetObjectItemCaseSensitive(b, "weight_dir");
    int st;
    if (wd && cJSON_GetObjectItemCaseSensitive(b, "update_info"))
        st = srv_send_error(conn, 400, "weight_dir", "give either update_info (an NCCL bucket) or weight_dir (a disk "
                            "load), not both");
    else if (wd && srv_primerl_broadcasting(s)) st = srv_primerl_update_nccl(s, conn, b);
    else if (wd) st = srv_weights_load(s, conn, b, "weight_dir", SRV_LOAD_PRIMERL);
    else st = nccl_bucket(s, conn, b);
    cJSON_Delete(b);
    return st;
}

void srv_weights_vllm_routes(srv_state *s)
{
    srv_route_add(&s->http, "POST", "/pause", srv_wroute_pause, 2);
    srv_route_add(&s->http, "POST", "/resume", srv_wroute_resume, 2);
    srv_route_add(&s->http, "GET", "/is_paused", route_is_paused, 2);
    srv_route_add(&s->http, "POST", "/start_weight_update", srv_wroute_begin, 2);
    srv_route_add(&s->http, "POST", "/start_draft_weight_update", route_begin_draft, 2);
    srv_route_add(&s->http, "POST", "/finish_weight_update", srv_wroute_finish, 2);
    srv_route_add(&s->http, "GET", "/weight_info", srv_wroute_weight_version, 2);
    srv_route_add(&s->http, "POST", "/weight_checker", srv_wroute_checker, 2);
    srv_route_add(&s->http, "POST", "/reset_prefix_cache", srv_wroute_reset_prefix, 2);
    srv_route_add(&s->http, "POST", "/update_weights", route_update_weights, 2);
    srv_route_add(&s->http, "POST", "/init_weight_transfer_engine", route_nccl_init_vllm, 2);
}
