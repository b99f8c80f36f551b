/* server/weights_primerl.c — prime-rl's NCCL broadcaster mode (PrimeIntellect-ai/prime-rl@559b447,
 * 559b44772e471d1538537b8805cc77f3824a5e64). prime-rl's filesystem mode (POST /update_weights
 * {"weight_dir"}: a disk load) is served by weights_vllm.c; this file adds the route that switches a
 * server into NCCL mode and what /update_weights {"weight_dir"} means afterwards.
 *
 * What prime-rl does (read from its sources at that commit):
 *   orchestrator  src/prime_rl/utils/client.py init_nccl_broadcast(): once per server,
 *                 POST /init_broadcaster {"host", "port", "rank_offset", "inference_world_size",
 *                 "timeout", "quantize_in_weight_transfer"} with rank_offset = server index *
 *                 (inference_world_size / servers) (defaults, packages/prime-rl-configs/.../
 *                 orchestrator.py NCCLWeightBroadcastConfig: host "localhost", port 29501, timeout
 *                 1200 s, inference_world_size 1, quantize false). The NIXL mode posts the same route
 *                 with "session_id" too (init_nixl_broadcast). A non-404 HTTP error of this call is
 *                 swallowed by the orchestrator (it only logs the 404 case).
 *   server        src/prime_rl/inference/vllm/server.py /init_broadcaster -> collective_rpc
 *                 "init_broadcaster"; answers {"status": "ok"}.
 *   worker        src/prime_rl/inference/vllm/worker/nccl.py NCCLWeightUpdateWorker.init_broadcaster:
 *                 rank = rank_offset + local_rank + 1, world = inference_world_size + 1 ("+1 as the
 *                 trainer broadcaster is on rank 0"); StatelessProcessGroup.create(host, port, rank,
 *                 world, store_timeout=timeout) + PyNcclCommunicator: the trainer (rank 0) hosts the
 *                 TCPStore and publishes the ncclUniqueId there, then every rank runs the warm-up
 *                 all_reduce — vLLM's rendezvous exactly (SRV_STORE_VLLM, server/tcpstore.h).
 *   trainer       src/prime_rl/transports/weights/nccl.py NCCLWeightBroadcastSender: rank 0 of
 *                 inference_world_size + 1, the same StatelessProcessGroup + PyNcclCommunicator.
 *   update        the orchestrator (client.py update_weights) POSTs /pause?mode=keep, touches
 *                 <weight_dir>/NCCL_READY, POSTs /update_weights {"weight_dir"} (the same body as the
 *                 filesystem mode: the NCCL worker ignores the folder, which holds only the STABLE and
 *                 NCCL_READY markers) and /resume; the trainer waits for NCCL_READY, then broadcasts.
 *
 * graphswap: /init_broadcaster validates its body (400 naming the field); on the CPU backend it
 * answers 501 before any network I/O; on CUDA it is vLLM's init (SRV_CMD_NCCL_INIT after the
 * SRV_STORE_VLLM rendezvous) at rank rank_offset + 1 of inference_world_size + 1 (graphswap is one
 * GPU: local rank 0), warm-up all_reduce included, answered {"status": "ok"}. The server is then in
 * broadcaster mode, and /update_weights {"weight_dir"} answers 501 (srv_primerl_update_nccl)
 * because prime-rl's framing differs from the one the NCCL transport receives (weights_gpu.c):
 *
 *   weights_gpu.c receives  one ncclBroadcast per bucket of uint8 bytes, the tensors' names /
 *                           dtypes / shapes given in the HTTP body, tensors at 256-byte aligned
 *                           offsets, written straight into the model.
 *   prime-rl broadcasts     (transports/weights/nccl.py broadcast_weights / broadcast_state_dict)
 *     1. one int64 (torch.long, 8 bytes): the number of state dicts N = layers + 1;
 *     2. N times, first the non-layer tensors (embeddings, final norm, lm_head) then layer 0, 1, ...:
 *        a. one int64: the byte length L of the metadata;
 *        b. L uint8: pickle.dumps(metadata) (default protocol), metadata = {torch.dtype: [(name,
 *           torch.Size, numel), ...]} in the state dict's order, one entry per dtype present;
 *        c. per dtype, in the dict's order: one broadcast of that dtype, numel = sum of the numels,
 *           the tensors flattened and concatenated with no padding (torch.cat).
 *     The names and shapes come in-band (b), not over HTTP, so a receiver must read the count and
 *     lengths back to the host and unpickle a dict keyed by torch.dtype globals (pickle GLOBAL /
 *     STACK_GLOBAL "torch" "bfloat16") with torch.Size reductions; the names are Hugging Face
 *     checkpoint names (preprocess_layer_checkpoint: convert_layer_to_hf / revert_weight_conversion).
 *     With quantize_in_weight_transfer the layers come in vLLM's kernel format with FP8 weights
 *     (preprocess_layer_quantized): refused here at init.
 *   What is missing: an engine-side command that receives a broadcast of N bytes and hands them to
 *   the host (the transport table has nccl_recv and the backend has download, but no srv_cmd kind
 *   runs them for a handler), a strict unpickler for that metadata shape, and a bucket per dtype
 *   group with contiguous (not 256-aligned) offsets. Until then the update is refused (501): the
 *   trainer's broadcasts then go unmatched and end at its NCCL timeout.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/weights_internal.h"

#define PRIMERL_NEEDS_FRAMING                                                                          \
    "prime-rl's NCCL weight broadcast is not received yet: its trainer sends an int64 count, then per " \
    "layer an int64 length, a pickled {dtype: [(name, shape, numel)]} and one concatenated broadcast "  \
    "per dtype, while graphswap's NCCL transport receives one 256-byte-aligned bucket whose names come " \
    "over HTTP (see server/weights_primerl.c); use prime-rl's filesystem mode (weight_broadcast.type = " \
    "\"filesystem\": POST /update_weights {\"weight_dir\"} loads the checkpoint from disk)"

/* The server whose /init_broadcaster created its NCCL group (broadcaster mode), else NULL. Set by
 * the handler once the engine thread has created the communicator; read by /update_weights'
 * handler. (srv_state has no field for it; a process serves one srv_state.) */
static const srv_state *_Atomic primerl_broadcaster;

int srv_primerl_broadcasting(const srv_state *s) { return atomic_load(&primerl_broadcaster) == s; }

/* The /init_broadcaster body into c (network-free). */
static int init_parse(const cJSON *b, srv_cmd *c, srv_err *e)
{
    long long port, rank_offset, world, timeout;
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(b, "host");
    if (!cJSON_IsString(host) || !host->valuestring[0] || strlen(host->valuestring) >= sizeof c->master_addr)
        return srv_errf(e, 400, "host", "host (the trainer's TCPStore host, 1..%zu bytes) is required",
                        sizeof c->master_addr - 1), -1;
    if (srv_json_int(b, "", "port", 1, 1, 65535, 0, &port, e) ||
        srv_json_int(b, "", "rank_offset", 1, 0, 1 << 20, 0, &rank_offset, e) ||
        srv_json_int(b, "", "inference_world_size", 1, 1, 1 << 20, 0, &world, e) ||
        srv_json_int(b, "", "timeout", 0, 1, 86400, 0, &timeout, e))
        return -1;
    if (rank_offset >= world)
        return srv_errf(e, 400, "rank_offset", "rank_offset (%lld) must be below inference_world_size (%lld): "
                        "this server's rank is rank_offset + 1 of inference_world_size + 1 (the trainer is rank 0)",
                        rank_offset, world), -1;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(b, "quantize_in_weight_transfer");
    if (q && !cJSON_IsNull(q) && !cJSON_IsBool(q))
        return srv_errf(e, 400, "quantize_in_weight_transfer", "quantize_in_weight_transfer must be a boolean"), -1;
    if (cJSON_IsTrue(q))
        return srv_errf(e, 400, "quantize_in_weight_transfer", "quantize_in_weight_transfer: graphswap takes "
                        "checkpoint-format weights only (prime-rl's quantized transfer sends vLLM kernel-format "
                        "FP8 layers)"), -1;
    const cJSON *sid = cJSON_GetObjectItemCaseSensitive(b, "session_id");
    if (sid && !cJSON_IsNull(sid) && !cJSON_IsString(sid)) /* (NIXL's; the NCCL worker ignores it) */
        return srv_errf(e, 400, "session_id", "session_id must be a string"), -1;
    snprintf(c->master_addr, sizeof c->master_addr, "%s", host->valuestring);
    c->master_port = (int)port;
    c->rendezvous = 1;
    c->rank = (int)rank_offset + 1; /* graphswap is one GPU: local rank 0 */
    c->world = (int)world + 1;
    c->timeout = (double)timeout; /* 0: GRAPHSWAP_NCCL_TIMEOUT_S or 300 s */
    snprintf(c->group, sizeof c->group, "prime-rl");
    c->warmup = srv_store_warmup_allreduce(SRV_STORE_VLLM); /* PyNcclCommunicator's */
    return 0;
}

/* POST /init_broadcaster (see the top of the file). */
static int route_init_broadcaster(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    srv_cmd *c = srv_cmd_new(SRV_CMD_NCCL_INIT);
    int rc = c ? init_parse(b, c, &e) : srv_errf(&e, 500, NULL, "out of memory");
    cJSON_Delete(b);
    /* on the CPU backend: 501 before any network I/O */
    if (rc == 0 && !srv_gpu_available(s)) rc = srv_errf(&e, 501, NULL, "%s", SRV_GPU_NEEDS_CUDA);
    /* the trainer's store: join as rank rank_offset + 1, fetch the pickled id, leave */
    if (rc == 0) rc = srv_nccl_rendezvous(c, SRV_STORE_VLLM, &e);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    srv_cmd_submit(s, c);
    cJSON *o = NULL;
    if (c->status == 200) {
        atomic_store(&primerl_broadcaster, s);
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
    }
    cJSON_Delete(c->result);
    int st = srv_cmd_send_result(conn, c, o);
    free(c);
    return st;
}

/* /update_weights {"weight_dir"} in broadcaster mode (weights_vllm.c asks srv_primerl_broadcasting
 * first): the update would be a receive of prime-rl's framing, which is not implemented (see the
 * top of the file). weight_dir is only checked for its type, as prime-rl's NCCL worker ignores it. */
int srv_primerl_update_nccl(srv_state *s, struct mg_connection *conn, const cJSON *b)
{
    (void)s;
    const cJSON *wd = cJSON_GetObjectItemCaseSensitive(b, "weight_dir");
    if (wd && !cJSON_IsNull(wd) && !cJSON_IsString(wd))
        return srv_send_error(conn, 400, "weight_dir", "weight_dir must be a string");
    return srv_send_error(conn, 501, NULL, "%s", PRIMERL_NEEDS_FRAMING);
}

void srv_weights_primerl_routes(srv_state *s)
{
    srv_route_add(s, "POST", "/init_broadcaster", route_init_broadcaster, 2);
}
