/* server/cmd_store.c — `graphswap store-rendezvous`: joins a trainer's TCPStore as a framework
 * would and prints the NCCL unique id and graphswap's rank (a diagnostic, and the integration
 * tests' hook into server/tcpstore.c). */
#include <stdio.h>
#include <string.h>

#include "server/cli.h"
#include "server/tcpstore.h"

static const char help[] =
    "usage: graphswap store-rendezvous --framework vllm|sglang|trl --host ADDR --port N\n"
    "                                  --rank-offset R --world-size W [--group-name G]\n"
    "                                  [--backend nccl] [--timeout-ms T] [--id-timeout-ms T]\n"
    "\n"
    "Joins the torch.distributed TCPStore the trainer (rank 0) hosts at ADDR:N, as the framework's\n"
    "inference side does (vLLM StatelessProcessGroup, SGLang init_custom_process_group), waits for\n"
    "the NCCL unique id rank 0 publishes, and prints one JSON line:\n"
    "  {\"framework\":..., \"rank\":R, \"world_size\":W, \"key\":..., \"unique_id\":\"<256 hex digits>\"}\n"
    "After the join it prints {\"joined\":true,\"rank\":R} first (stdout is flushed).\n"
    "--timeout-ms bounds the connect and each store operation (default 30000); --id-timeout-ms the\n"
    "wait for the id (default: --timeout-ms). Exit status 1 with a message on stderr on failure.\n";

int srv_cmd_store_rendezvous(int argc, char **argv)
{
    const char *fw = NULL, *host = NULL, *group = NULL, *backend = NULL;
    int port = 0, rank_offset = -1, world = 0, timeout_ms = 30000, id_timeout_ms = 0;
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
            srv_arg_str(argc, argv, &i, "--backend", &backend) ||
            srv_arg_int(argc, argv, &i, "--timeout-ms", 1, 86400000, &timeout_ms) ||
            srv_arg_int(argc, argv, &i, "--id-timeout-ms", 1, 86400000, &id_timeout_ms))
            continue;
        srv_die_usage("store-rendezvous", argv[i]);
    }
    srv_store_req req = {0};
    if (!fw || srv_store_kind_parse(fw, &req.kind) != 0) srv_die("store-rendezvous: --framework vllm|sglang|trl");
    if (!host || !port || rank_offset < 0 || !world)
        srv_die("store-rendezvous: --host, --port, --rank-offset and --world-size are required");
    req.host = host;
    req.port = port;
    req.rank_offset = rank_offset;
    req.world_size = world;
    req.group_name = group;
    req.backend = backend;
    req.timeout_ms = timeout_ms;

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
