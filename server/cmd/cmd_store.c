/* server/cmd/cmd_store.c — `graphswap store-rendezvous`: joins a trainer's TCPStore as a framework
 * would and prints the NCCL unique id and graphswap's rank (a diagnostic, and the integration
 * tests' hook into server/rendezvous/tcpstore.c). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/format/json_guard.h"
#include "server/cmd/cmd.h"
#include "server/core/cli.h"
#include "server/rendezvous/tcpstore.h"
#include "server/weights/weights_api.h"

static const char help[] =
    "usage: graphswap store-rendezvous --framework vllm|sglang|trl --host ADDR --port N\n"
    "                                  --rank-offset R --world-size W [--group-name G]\n"
    "                                  [--backend nccl] [--timeout-ms T] [--id-timeout-ms T]\n"
    "                                  [--unique-id HEX --barriers N (trl)]\n"
    "\n"
    "Joins the torch.distributed TCPStore the trainer (rank 0) hosts at ADDR:N, as the framework's\n"
    "inference side does (vLLM StatelessProcessGroup, SGLang init_custom_process_group), waits for\n"
    "the NCCL unique id rank 0 publishes, and prints one JSON line:\n"
    "  {\"framework\":..., \"rank\":R, \"world_size\":W, \"key\":..., \"unique_id\":\"<256 hex digits>\"}\n"
    "After the join it prints {\"joined\":true,\"rank\":R} first (stdout is flushed).\n"
    "--timeout-ms bounds the connect and each store operation (default 30000); --id-timeout-ms the\n"
    "wait for the id (default: --timeout-ms). Exit status 1 with a message on stderr on failure.\n"
    "\n"
    "--framework trl --unique-id HEX (256 hex digits): graphswap is rank 0 (TRL's init_communicator):\n"
    "it hosts the store on ADDR:N, publishes the id as vLLM's rank 0 does, prints\n"
    "{\"hosting\":true,\"port\":N}, waits for the other world_size-1 ranks to join (--timeout-ms),\n"
    "prints {\"joined\":true,\"rank\":0}, then runs rank 0's side of N vLLM StatelessProcessGroup\n"
    "barriers (what each /update_named_param/ runs after its broadcast), printing {\"barrier\":i} after\n"
    "each, and keeps serving until stdin closes (or --timeout-ms).\n"
    "\n"
    "graphswap store-rendezvous --framework vllm|sglang --init-body JSON\n"
    "runs the NCCL init route's handler side on JSON (vLLM /init_weight_transfer_engine's body,\n"
    "{\"init_info\": {...}}; SGLang /init_weights_update_group's) with the routes' own code: the body's\n"
    "validation, then (without nccl_unique_id_b64) the TCPStore rendezvous at master_address:\n"
    "master_port, and prints the outcome as one JSON line, {\"status\":200, \"rank\", \"world_size\",\n"
    "\"group\", \"warmup_all_reduce\", \"unique_id_from\", \"unique_id\"} or {\"status\":400|502|504,\n"
    "\"param\", \"message\"} (exit 1); SGLang prints {\"joined\":true,\"rank\":R} after its join. No\n"
    "communicator is created (that is the engine thread's, on the CUDA backend).\n";

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int host_trl(const srv_store_req *req, const char *hex, int barriers)
{
    unsigned char id[SRV_STORE_ID_BYTES];
    if (!hex || strlen(hex) != 2 * SRV_STORE_ID_BYTES) srv_die("store-rendezvous: trl needs --unique-id (256 hex digits)");
    for (int i = 0; i < SRV_STORE_ID_BYTES; i++) {
        int a = hexval(hex[2 * i]), b = hexval(hex[2 * i + 1]);
        if (a < 0 || b < 0) srv_die("store-rendezvous: --unique-id is not hex");
        id[i] = (unsigned char)(a * 16 + b);
    }
    char err[512];
    srv_store_server *sv = NULL;
    if (srv_store_trl_host(req, id, &sv, err, sizeof err) != 0) {
        fprintf(stderr, "graphswap store-rendezvous: %s\n", err);
        return 1;
    }
    printf("{\"hosting\":true,\"port\":%d}\n", srv_store_server_port(sv));
    fflush(stdout);
    if (srv_store_server_wait_count(sv, "init/", req->world_size, req->timeout_ms) != 0) {
        fprintf(stderr, "graphswap store-rendezvous: trl: the other ranks did not join within %d ms\n",
                req->timeout_ms);
        srv_store_server_stop(sv);
        return 1;
    }
    printf("{\"joined\":true,\"rank\":0}\n");
    fflush(stdout);
    int64_t bcast_n = 1; /* broadcast 0 was the id */
    for (int i = 0; i < barriers; i++) {
        if (srv_store_trl_barrier(sv, req->world_size, &bcast_n, req->timeout_ms, err, sizeof err) != 0) {
            fprintf(stderr, "graphswap store-rendezvous: %s\n", err);
            srv_store_server_stop(sv);
            return 1;
        }
        printf("{\"barrier\":%d}\n", i + 1);
        fflush(stdout);
    }
    struct pollfd p = {.fd = 0, .events = POLLIN};
    char sink[256];
    while (poll(&p, 1, req->timeout_ms) > 0 && read(0, sink, sizeof sink) > 0) {
    }
    srv_store_server_stop(sv);
    return 0;
}

static int print_json(cJSON *o, int rc)
{
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!t) return 1;
    printf("%s\n", t);
    fflush(stdout);
    free(t);
    return rc;
}

static int init_fail(const srv_err *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "status", e->status);
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    cJSON_AddStringToObject(o, "message", e->msg);
    return print_json(o, 1);
}

/* --init-body: the handler side of the NCCL init routes (weights_vllm.c, weights_sglang.c) */
static int init_body(srv_store_kind kind, const char *json)
{
    srv_err e;
    memset(&e, 0, sizeof e);
    if (kind != SRV_STORE_VLLM && kind != SRV_STORE_SGLANG)
        srv_die("store-rendezvous: --init-body is for --framework vllm or sglang");
    cJSON *b = mdl_json_parse(json, strlen(json), MDL_JSON_MAX_DEPTH, MDL_JSON_OBJECT, NULL, NULL, 0);
    if (!b) {
        srv_errf(&e, 400, NULL, "the body must be a JSON object");
        return init_fail(&e);
    }
    srv_cmd *c = srv_cmd_new(SRV_CMD_NCCL_INIT);
    if (!c) srv_die("store-rendezvous: out of memory");
    int rc = srv_nccl_init_parse(b, kind, c, &e);
    cJSON_Delete(b);
    if (rc == 0 && c->rendezvous) {
        if (kind == SRV_STORE_VLLM) {
            rc = srv_nccl_rendezvous(c, kind, &e);
        } else {
            srv_store_group *g = NULL;
            rc = srv_nccl_store_join(c, &g, &e);
            if (rc == 0) {
                printf("{\"joined\":true,\"rank\":%d}\n", c->rank);
                fflush(stdout);
                rc = srv_nccl_store_fetch(g, c, &e);
                srv_store_group_close(g);
            }
        }
    }
    if (rc != 0) {
        free(c);
        return init_fail(&e);
    }
    char hex[2 * GS_NCCL_ID_BYTES + 1];
    for (size_t i = 0; i < c->blob_len && i < GS_NCCL_ID_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", c->blob[i]);
    hex[2 * (c->blob_len < GS_NCCL_ID_BYTES ? c->blob_len : GS_NCCL_ID_BYTES)] = 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "status", 200);
    cJSON_AddStringToObject(o, "framework", srv_store_kind_name(kind));
    cJSON_AddNumberToObject(o, "rank", c->rank);
    cJSON_AddNumberToObject(o, "world_size", c->world);
    cJSON_AddStringToObject(o, "group", c->group);
    cJSON_AddBoolToObject(o, "warmup_all_reduce", c->warmup);
    cJSON_AddStringToObject(o, "unique_id_from", c->rendezvous ? "tcpstore" : "nccl_unique_id_b64");
    cJSON_AddStringToObject(o, "unique_id", hex);
    free(c);
    return print_json(o, 0);
}

int srv_cmd_store_rendezvous(int argc, char **argv)
{
    const char *fw = NULL, *host = NULL, *group = NULL, *backend = NULL, *uid = NULL, *body = NULL;
    int port = 0, rank_offset = -1, world = 0, timeout_ms = 30000, id_timeout_ms = 0, barriers = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            return 0;
        }
        if (srv_arg_str(argc, argv, &i, "--framework", &fw) || srv_arg_str(argc, argv, &i, "--host", &host) ||
            srv_arg_int(argc, argv, &i, "--port", 1, 65535, &port) ||
            srv_arg_int(argc, argv, &i, "--rank-offset", 0, 1 << 20, &rank_offset) ||
            srv_arg_int(argc, argv, &i, "--world-size", 1, 1 << 20, &world) ||
            srv_arg_str(argc, argv, &i, "--group-name", &group) ||
            srv_arg_str(argc, argv, &i, "--backend", &backend) || srv_arg_str(argc, argv, &i, "--unique-id", &uid) ||
            srv_arg_str(argc, argv, &i, "--init-body", &body) ||
            srv_arg_int(argc, argv, &i, "--timeout-ms", 1, 86400000, &timeout_ms) ||
            srv_arg_int(argc, argv, &i, "--id-timeout-ms", 1, 86400000, &id_timeout_ms) ||
            srv_arg_int(argc, argv, &i, "--barriers", 0, 1000000, &barriers))
            continue;
        srv_die_usage("store-rendezvous", argv[i]);
    }
    srv_store_req req = {0};
    if (!fw || srv_store_kind_parse(fw, &req.kind) != 0) srv_die("store-rendezvous: --framework vllm|sglang|trl");
    if (body) return init_body(req.kind, body);
    if (!host || !port || rank_offset < 0 || !world)
        srv_die("store-rendezvous: --host, --port, --rank-offset and --world-size are required");
    req.host = host;
    req.port = port;
    req.rank_offset = rank_offset;
    req.world_size = world;
    req.group_name = group;
    req.backend = backend;
    req.timeout_ms = timeout_ms;

    if (req.kind == SRV_STORE_TRL) return host_trl(&req, uid, barriers);
    char err[512];
    int rank = -1;
    srv_store_group *g = NULL;
    if (srv_store_join(&req, &g, &rank, err, sizeof err) != 0) {
        fprintf(stderr, "graphswap store-rendezvous: %s\n", err);
        return 1;
    }
    printf("{\"joined\":true,\"rank\":%d}\n", rank);
    fflush(stdout);
    unsigned char id[SRV_STORE_ID_BYTES];
    int rc = srv_store_fetch_id(g, id, id_timeout_ms ? id_timeout_ms : timeout_ms, err, sizeof err);
    srv_store_group_close(g);
    if (rc != 0) {
        fprintf(stderr, "graphswap store-rendezvous: %s\n", err);
        return 1;
    }
    char key[SRV_STORE_MAX_KEY + 1];
    if (srv_store_key(key, sizeof key, req.kind, group) != 0) key[0] = 0;
    printf("{\"framework\":\"%s\",\"rank\":%d,\"world_size\":%d,\"key\":\"", srv_store_kind_name(req.kind), rank,
           world);
    for (const char *k = key; *k; k++) {
        if (*k == '"' || *k == '\\') putchar('\\');
        putchar(*k);
    }
    printf("\",\"unique_id\":\"");
    for (int i = 0; i < SRV_STORE_ID_BYTES; i++) printf("%02x", id[i]);
    printf("\"}\n");
    return 0;
}
