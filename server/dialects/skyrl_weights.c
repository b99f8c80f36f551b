/* server/dialects/skyrl_weights.c — SkyRL's weight sync against a remote vLLM server
 * (NovaSky-AI/SkyRL@a956456, a9564572eb8e91076be43c1bd5e4615e3de17265; the older
 * skyrl-train/skyrl_train/inference_engines/remote_inference_engine.py was removed at 6dc221f).
 *
 * What SkyRL sends (skyrl/backends/skyrl_train/inference_servers/remote_inference_client.py; the
 * receiving methods are NewInferenceWorkerWrap in inference_servers/new_inference_worker_wrap.py, the
 * server vllm_server_actor.py = vLLM with VLLM_SERVER_DEV_MODE=1 plus /fetch_weights):
 *   GET  /get_world_size                              (dialect_vllm.c)
 *   POST /init_weight_transfer_engine {"init_info": {master_address, master_port, rank_offset: 1,
 *        world_size: servers' workers + 1}}          (weights_vllm.c: vLLM's own NCCL init)
 *   POST /pause?mode=keep&clear_cache=false, /resume, /reset_prefix_cache {"reset_running_requests"},
 *        /sleep?level=N[&tags=...], /wake_up[?tags=...]     (weights_vllm.c, memory_api.c)
 *   POST /collective_rpc {"method", "kwargs"}          (here; vLLM's dev route answers
 *        {"results": [one per worker]}, each null for these methods: graphswap is one worker)
 *     skyrl_start_weight_update {"is_checkpoint_format": true}   -> SRV_CMD_BEGIN (full, target, keep)
 *     update_weights_nccl {"update_info": {names, dtype_names, shapes, "packed": true[,
 *        packed_buffer_size_bytes, packed_num_buffers]}} -> SRV_CMD_NCCL_BUCKET per broadcast (below)
 *     update_weights_ipc {"update_info": {names, dtype_names, shapes, sizes,
 *        ipc_handles_pickled}}                        -> 501 (below)
 *     skyrl_finish_weight_update                      -> SRV_CMD_FINISH
 *     skyrl_sleep_for_weight_sync {"offload_kv"}, skyrl_wake_for_weight_sync {"tags"} -> 501 (below)
 *   POST /fetch_weights {"target_version"[, "sync_dir", "uri"]}  -> 501 (below)
 * The broadcast strategy (weight_sync/broadcast_strategy.py _send_chunks_vllm_native) is: start,
 * then update_weights_nccl posted while the trainer runs NCCLWeightTransferEngine.trainer_send_weights
 * (packed=True), then finish; the delta strategy (delta_strategy.py) is fetch_weights, pause, reset,
 * start, POST /update_weights {"update_info": <delta info>}, finish, resume.
 *
 * NCCL packing (vLLM's, which SkyRL's trainer uses: vllm-project/vllm@00a9ccf
 * vllm/distributed/weight_transfer/packed_tensor.py packed_nccl_broadcast_consumer, nccl_engine.py
 * @04b06ef): with packed, the tensors in update_info order are cut into broadcasts: a broadcast takes
 * tensors until its byte total exceeds packed_buffer_size_bytes (default 1 GiB; the tensor that
 * crosses it is included), each broadcast is the tensors' bytes back to back with no padding (uint8);
 * without packed, one broadcast per tensor: the framing of vLLM's own /update_weights
 * (srv_gpu_meta_parse_vllm), one SRV_CMD_NCCL_BUCKET for the call. packed_num_buffers only sets how
 * many broadcasts vLLM keeps in flight; the order is the same. On the CPU backend the engine checks
 * the names against the model (400) and then answers 501.
 *
 * A failed update (a bad body, a tensor the model refuses, 501, a transport error) aborts the open
 * session before it is answered: SkyRL's sender raises out of send_chunks and never calls finish,
 * so the session would otherwise hold generation until --weight-session-timeout.
 *
 * Not served (501 after a validated body):
 *   update_weights_ipc: ipc_handles_pickled is base64(pickle({gpu_uuid: (rebuild_cuda_tensor,
 *     args)})), torch's reduce_tensor reduction of the sender's packed buffer; graphswap's IPC
 *     transport maps a raw cudaIpcMemHandle_t (/v1/weights/ipc/open) and does not unpickle torch's.
 *   skyrl_sleep/wake_for_weight_sync: SkyRL's fully-async offload keeps KEEP-paused requests and
 *     their KV cache across the sync; graphswap's sleep ends running requests and discards the KV
 *     cache (memory_api.c). SkyRL's synchronous path (/sleep, /wake_up) is served.
 *   /fetch_weights (delta sync): the deltas are zstd-compressed XOR patches (weight_sync/
 *     delta_payload.py, delta_checkpoint.py) applied to a local copy of the checkpoint; graphswap has
 *     no zstd decoder. Use SkyRL's broadcast strategy, or /v1/weights/load of a full checkpoint.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dialects/dialects.h"

#define SKYRL_METHODS                                                                                  \
    "skyrl_start_weight_update, update_weights_nccl, update_weights_ipc, skyrl_finish_weight_update, "  \
    "skyrl_sleep_for_weight_sync, skyrl_wake_for_weight_sync"
#define SKYRL_IPC_PICKLE                                                                               \
    "SkyRL's CUDA IPC chunks carry torch's pickled reduce_tensor handle (ipc_handles_pickled), which "  \
    "graphswap does not unpickle; use SkyRL's broadcast (NCCL) strategy, or graphswap's own "           \
    "/v1/weights/ipc/open + /v1/weights/ipc/bucket (a raw cudaIpcMemHandle_t)"
#define SKYRL_OFFLOAD                                                                                  \
    "SkyRL's offload for weight sync keeps KEEP-paused requests and their KV cache across the sync; "   \
    "graphswap's sleep ends running requests and discards the KV cache: leave "                         \
    "offload_kv_for_weight_sync off (SkyRL's /sleep + /wake_up path is served)"
#define SKYRL_DELTA                                                                                    \
    "SkyRL's checkpoint-delta sync (zstd-compressed XOR patches) is not implemented: use its broadcast " \
    "strategy, or load a full checkpoint (POST /v1/weights/load)"

/* {"results": [null]}: vLLM's collective_rpc answer for one worker whose method returned None. */
static int send_results(struct mg_connection *conn)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "results"), cJSON_CreateNull());
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}

/* The answer of a finished command: {"results": [null]} on success, else its error. */
static int send_cmd(struct mg_connection *conn, srv_cmd *c)
{
    return c->status == 200 ? send_results(conn) : srv_cmd_send_result(conn, c, NULL);
}

/* Aborts the open session (if any), as POST /v1/weights/abort: nothing written leaves the weights
 * ready, writes leave them inconsistent. */
static void abort_session(srv_state *s)
{
    srv_cmd *c = srv_cmd_new(SRV_CMD_ABORT);
    if (!c) return;
    srv_cmd_submit(s, c); /* (409 without a session: nothing to do) */
    free(c);
}

/* An optional boolean kwarg (absent or null: dflt). */
static int opt_bool(const cJSON *o, const char *key, int dflt, int *out, srv_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return *out = dflt, 0;
    if (!cJSON_IsBool(v)) return srv_errf(e, 400, NULL, "kwargs.%s must be a boolean", key), -1;
    *out = cJSON_IsTrue(v);
    return 0;
}

/* The update_info kwarg of update_weights_nccl / update_weights_ipc (an object). */
static const cJSON *update_info(const cJSON *kw, srv_err *e)
{
    const cJSON *ui = cJSON_GetObjectItemCaseSensitive(kw, "update_info");
    if (!cJSON_IsObject(ui)) srv_errf(e, 400, "kwargs.update_info", "kwargs.update_info must be an object");
    return cJSON_IsObject(ui) ? ui : NULL;
}

static int rpc_start(srv_state *s, struct mg_connection *conn, const cJSON *kw)
{
    srv_err e;
    int ckpt;
    if (opt_bool(kw, "is_checkpoint_format", 1, &ckpt, &e) != 0) {
        snprintf(e.param, sizeof e.param, "kwargs.is_checkpoint_format");
        return srv_send_err(conn, &e);
    }
    /* kernel format = vLLM's fused runtime parameter names (qkv_proj, gate_up_proj), not graphswap's */
    if (!ckpt)
        return srv_send_error(conn, 400, "kwargs.is_checkpoint_format", "kwargs.is_checkpoint_format: graphswap "
                              "takes checkpoint-format (Hugging Face) tensor names only");
    SRV_NEW_CMD(c, SRV_CMD_BEGIN);
    /* SkyRL sends every parameter (weight_extractor.get_weight_metadata), so a full update: its
     * coverage check catches a missing tensor, and it repairs weights a sleep level 2 discarded (the
     * colocated order: sleep, wake_up weights, sync, wake_up kv_cache). keep: SkyRL pauses with
     * mode=keep first; the requests it froze go on with the new weights. */
    c->full = 1;
    c->which = ENG_WMODEL_TARGET;
    c->pause = ENG_PAUSE_KEEP;
    srv_cmd_submit(s, c);
    int st = send_cmd(conn, c);
    free(c);
    return st;
}

static int rpc_finish(srv_state *s, struct mg_connection *conn)
{
    SRV_NEW_CMD(c, SRV_CMD_FINISH); /* (version "": the next number) */
    srv_cmd_submit(s, c);
    int st = send_cmd(conn, c);
    free(c);
    return st;
}

/* A failed update's answer: the session start opened is aborted first (SkyRL will not call finish
 * after a failed update), then the error is sent. */
static int update_failed(srv_state *s, struct mg_connection *conn, const srv_err *e)
{
    abort_session(s);
    return srv_send_err(conn, e);
}

/* update_weights_nccl: one SRV_CMD_NCCL_BUCKET, received as vLLM's trainer broadcasts it (see the
 * top; srv_gpu_meta_parse_vllm). */
static int rpc_nccl(srv_state *s, struct mg_connection *conn, const cJSON *kw)
{
    srv_err e;
    const cJSON *ui = update_info(kw, &e);
    if (!ui) return update_failed(s, conn, &e);
    srv_cmd *c = srv_cmd_new(SRV_CMD_NCCL_BUCKET);
    if (!c) return srv_errf(&e, 500, NULL, "out of memory"), update_failed(s, conn, &e);
    if (srv_gpu_meta_parse_vllm(ui, "kwargs.update_info.", &c->meta, &e) != 0) {
        free(c);
        return update_failed(s, conn, &e);
    }
    srv_cmd_submit(s, c);
    int failed = c->status != 200;
    if (failed) {
        srv_errf(&e, c->status, NULL, "%s", c->err);
        if (c->status == 409) e.type = "conflict";
    }
    srv_gpu_meta_free(&c->meta);
    free(c);
    return failed ? update_failed(s, conn, &e) : send_results(conn);
}

/* update_weights_ipc: validated (names / dtype_names / shapes as NCCL's, sizes = each tensor's
 * element count, ipc_handles_pickled base64), then 501. */
static int rpc_ipc(srv_state *s, struct mg_connection *conn, const cJSON *kw)
{
    srv_err e;
    const cJSON *ui = update_info(kw, &e);
    if (!ui) return update_failed(s, conn, &e);
    srv_gpu_meta m;
    if (srv_gpu_meta_parse(ui, "kwargs.update_info.", "names", "dtype_names", NULL, &m, &e) != 0)
        return update_failed(s, conn, &e);
    const cJSON *sizes = cJSON_GetObjectItemCaseSensitive(ui, "sizes");
    int rc = 0;
    if (!cJSON_IsArray(sizes) || (size_t)cJSON_GetArraySize(sizes) != m.n)
        rc = srv_errf(&e, 400, "kwargs.update_info.sizes", "kwargs.update_info.sizes must be a list of %zu element "
                      "counts, one per name", m.n);
    for (size_t i = 0; rc == 0 && i < m.n; i++) {
        const cJSON *x = cJSON_GetArrayItem(sizes, (int)i);
        if (!cJSON_IsNumber(x) || x->valuedouble != (double)m.t[i].numel)
            rc = srv_errf(&e, 400, "kwargs.update_info.sizes", "kwargs.update_info.sizes[%zu] (%s) must be %llu, the "
                          "element count of its shape", i, m.t[i].name, (unsigned long long)m.t[i].numel);
    }
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(ui, "ipc_handles_pickled");
    if (rc == 0) {
        size_t len = cJSON_IsString(h) ? strlen(h->valuestring) : 0;
        unsigned char *buf = len ? malloc(len) : NULL;
        if (!len || !buf || srv_b64_decode(h->valuestring, buf, len) <= 0)
            rc = srv_errf(&e, 400, "kwargs.update_info.ipc_handles_pickled", "kwargs.update_info.ipc_handles_pickled "
                          "must be base64 (of the pickled {gpu_uuid: handle} dict)");
        free(buf);
    }
    srv_gpu_meta_free(&m);
    if (rc == 0) srv_errf(&e, 501, NULL, "%s", srv_gpu_available(s) ? SKYRL_IPC_PICKLE : SRV_GPU_NEEDS_CUDA);
    return update_failed(s, conn, &e);
}

static int rpc_sleep(struct mg_connection *conn, const cJSON *kw, int wake)
{
    srv_err e;
    if (!wake) {
        int offload;
        if (opt_bool(kw, "offload_kv", 1, &offload, &e) != 0) {
            snprintf(e.param, sizeof e.param, "kwargs.offload_kv");
            return srv_send_err(conn, &e);
        }
    } else {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(kw, "tags"), *x;
        int ok = cJSON_IsArray(t);
        cJSON_ArrayForEach(x, t) ok &= cJSON_IsString(x) && (strcmp(x->valuestring, "weights") == 0 ||
                                                             strcmp(x->valuestring, "kv_cache") == 0);
        if (!ok)
            return srv_send_error(conn, 400, "kwargs.tags", "kwargs.tags must be a list of \"weights\" / \"kv_cache\"");
    }
    return srv_send_error(conn, 501, NULL, "%s", SKYRL_OFFLOAD);
}

/* POST /collective_rpc {"method", "args": [], "kwargs": {...}, "timeout"} (vLLM's dev route): only
 * SkyRL's weight-sync methods, with keyword arguments (SkyRL sends no positional ones). */
static int route_collective_rpc(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(b, "method");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(b, "args");
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(b, "kwargs");
    const cJSON *to = cJSON_GetObjectItemCaseSensitive(b, "timeout");
    cJSON *empty = cJSON_CreateObject();
    int st;
    if (!empty) st = srv_send_error(conn, 500, NULL, "out of memory");
    else if (!cJSON_IsString(method) || !method->valuestring[0])
        st = srv_send_error(conn, 400, "method", "method (the worker method to run) is required");
    else if (args && !cJSON_IsNull(args) && (!cJSON_IsArray(args) || cJSON_GetArraySize(args) > 0))
        st = srv_send_error(conn, 400, "args", "args must be an empty list: SkyRL's methods take kwargs");
    else if (kw && !cJSON_IsNull(kw) && !cJSON_IsObject(kw))
        st = srv_send_error(conn, 400, "kwargs", "kwargs must be an object");
    else if (to && !cJSON_IsNull(to) && !(cJSON_IsNumber(to) && to->valuedouble > 0))
        st = srv_send_error(conn, 400, "timeout", "timeout must be a positive number of seconds");
    else {
        const char *m = method->valuestring;
        if (!kw || cJSON_IsNull(kw)) kw = empty;
        if (strcmp(m, "skyrl_start_weight_update") == 0) st = rpc_start(s, conn, kw);
        else if (strcmp(m, "update_weights_nccl") == 0) st = rpc_nccl(s, conn, kw);
        else if (strcmp(m, "update_weights_ipc") == 0) st = rpc_ipc(s, conn, kw);
        else if (strcmp(m, "skyrl_finish_weight_update") == 0) st = rpc_finish(s, conn);
        else if (strcmp(m, "skyrl_sleep_for_weight_sync") == 0) st = rpc_sleep(conn, kw, 0);
        else if (strcmp(m, "skyrl_wake_for_weight_sync") == 0) st = rpc_sleep(conn, kw, 1);
        else
            st = srv_send_error(conn, 400, "method", "method %.100s is not served: graphswap's /collective_rpc runs "
                                "SkyRL's weight-sync methods only (" SKYRL_METHODS ")", m);
    }
    cJSON_Delete(empty);
    cJSON_Delete(b);
    return st;
}

/* POST /fetch_weights {"target_version"[, "sync_dir", "uri"]} (SkyRL's delta sync): validated as
 * SkyRL's server does (target_version required, an integer), then 501. */
static int route_fetch_weights(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    long long v;
    int rc = srv_json_int(b, "", "target_version", 1, 0, (long long)1 << 53, 0, &v, &e);
    const char *keys[] = {"sync_dir", "uri"};
    for (int i = 0; rc == 0 && i < 2; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(b, keys[i]);
        if (x && !cJSON_IsNull(x) && (!cJSON_IsString(x) || !x->valuestring[0]))
            rc = srv_errf(&e, 400, keys[i], "%s must be a non-empty string", keys[i]);
    }
    cJSON_Delete(b);
    if (rc != 0) return srv_send_err(conn, &e);
    return srv_send_error(conn, 501, NULL, "%s", SKYRL_DELTA);
}

void srv_weights_skyrl_routes(srv_state *s)
{
    srv_route_add(&s->http, "POST", "/collective_rpc", route_collective_rpc, 2);
    srv_route_add(&s->http, "POST", "/fetch_weights", route_fetch_weights, 2);
}
