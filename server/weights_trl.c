/* server/weights_trl.c — the weight-side routes of TRL's `trl vllm-serve` (trl/scripts/vllm_serve.py;
 * the trainer's side is trl/generation/vllm_client.py, huggingface/trl@f2cd577). The paths end in a
 * slash, as TRL's do. Each is a thin producer over the commands of weights_api.c / weights_gpu.c.
 * (TRL's generation routes, /generate/ /chat/ ..., are another file's.)
 *
 *   POST /reset_prefix_cache/   -> SRV_CMD_RESET_PREFIX
 *   POST /init_communicator/    {host, port, world_size, client_device_uuid} -> SRV_CMD_NCCL_INIT
 *   POST /update_named_param/   {name, dtype, shape}: one tensor broadcast -> SRV_CMD_NCCL_UPDATE
 *   POST /close_communicator/   -> SRV_CMD_NCCL_DESTROY (no group: 200, as TRL)
 * (TRL@f2cd577 has no /batch_update_named_params/.)
 *
 * Bodies are validated whole (400 naming the field) on every backend; the CPU backend then answers
 * 501 as the other NCCL routes do. On CUDA, TRL's weight sync needs two things the NCCL transport
 * does not have yet, so init and update answer 501 there too (TODO, see trl_needs):
 *   - the rendezvous: TRL builds vLLM's StatelessProcessGroup on a torch.distributed TCPStore at
 *     host:port that the server (rank 0) hosts, and exchanges the ncclUniqueId through it; the
 *     trainer is rank world_size - 1 and every broadcast's root (nccl_recv assumes root 0), and each
 *     update ends with a store barrier;
 *   - the order: the trainer broadcasts only after /update_named_param/ has answered, so the command
 *     must be queued without the handler waiting for it (a detached srv_cmd_submit).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/weights_internal.h"

#define TRL_NEEDS_RENDEZVOUS                                                                            \
    "TRL's weight sync (init_communicator / update_named_param) is not implemented yet: graphswap would "  \
    "be NCCL rank 0 hosting the TCPStore (server/tcpstore.h srv_store_trl_host exists), but its NCCL "     \
    "transport cannot yet generate the unique id itself (ncclGetUniqueId) nor receive broadcasts from a "  \
    "non-zero root (the trainer, rank world_size - 1), and TRL's per-parameter store barrier is not "      \
    "served; use POST /v1/weights/bucket (HTTP), /v1/weights/load (disk), or vLLM's "                      \
    "/init_weight_transfer_engine + /update_weights (NCCL)"

/* The answer of a validated TRL NCCL command that cannot run (yet): 501 on either backend. */
static int trl_needs(struct mg_connection *conn, const srv_state *s)
{
    /* TODO(trl): the transport gets an id generator (ncclGetUniqueId) and a root argument for
     * nccl_recv; then init_communicator generates the id, hosts the store (srv_store_trl_host, kept
     * until close), submits SRV_CMD_NCCL_INIT (rank 0 of 2, warm-up per srv_store_warmup_allreduce),
     * and update_named_param submits its SRV_CMD_NCCL_UPDATE (root 1) detached, answers at once and
     * serves the trainer's group.barrier() through the store. */
    return srv_send_error(conn, 501, NULL, "%s", srv_gpu_available(s) ? TRL_NEEDS_RENDEZVOUS : SRV_GPU_NEEDS_CUDA);
}

/* {"message": msg} with 200, TRL's answer. */
static int send_message(struct mg_connection *conn, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "message", msg);
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}

static int route_reset_prefix(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e); /* (TRL's client sends no body) */
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
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
    cJSON *b = srv_read_json(s, conn, &e);
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
    cJSON_Delete(b);
    if (rc != 0) return srv_send_err(conn, &e);
    /* (here: an SRV_CMD_NCCL_INIT with rank 0 of world 2, group "trl"; see trl_needs) */
    return trl_needs(conn, s);
}

/* POST /update_named_param/ {"name", "dtype" ("torch.bfloat16"), "shape": [...]}: one tensor, its
 * bytes one broadcast from the trainer; a partial update of its own (a session around one bucket, as
 * SGLang's /update_weights_from_distributed: TRL sends no begin or end). */
static int route_update_named_param(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
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
    if (rc != 0) return srv_send_err(conn, &e);
    /* (here: an SRV_CMD_NCCL_UPDATE of this metadata, pause "wait", submitted detached; see trl_needs) */
    srv_gpu_meta_free(&meta);
    return trl_needs(conn, s);
}

static int route_close_communicator(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    if (!srv_gpu_available(s)) return srv_send_error(conn, 501, NULL, "%s", SRV_GPU_NEEDS_CUDA);
    srv_cmd *c = srv_cmd_new(SRV_CMD_NCCL_DESTROY);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    srv_cmd_submit(s, c);
    /* TRL closes whatever is there: no group is not an error */
    int st = c->status == 200 || c->status == 409 ? send_message(conn, "Request received, closing communicator")
                                                  : srv_cmd_send_result(conn, c, NULL);
    free(c);
    return st;
}

void srv_weights_trl_routes(srv_state *s)
{
    srv_route_add(s, "POST", "/reset_prefix_cache/", route_reset_prefix, 2);
    srv_route_add(s, "POST", "/init_communicator/", route_init_communicator, 2);
    srv_route_add(s, "POST", "/update_named_param/", route_update_named_param, 2);
    srv_route_add(s, "POST", "/close_communicator/", route_close_communicator, 2);
}
