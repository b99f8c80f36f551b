/* server/cmd/main.c — the graphswap binary: one entry point, one subcommand per capability. */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "server/cmd/cmd.h"
#include "server/core/cli.h"
#include "server/server.h"

static const char usage[] =
    "usage: graphswap <command> [options]\n"
    "\n"
    "commands:\n"
    "  serve      serve a model over HTTP: OpenAI-compatible completions and chat, tokenize,\n"
    "             Prometheus metrics, live weight updates\n"
    "  generate   generate from a text prompt (--prompt) or token ids (--prompt-ids, --batch-file);\n"
    "             prints JSON with ids, logprobs and text\n"
    "  mkmodel    write a random-init checkpoint (target or drafter) in Hugging Face layout\n"
    "  eval       speculative-decoding evaluation: tau, acceptance per draft position, speedup and\n"
    "             the losslessness check per prompt category (JSON, markdown, SVG)\n"
    "  bench      benchmarks: decode, spec, serve, update, transfer (graphswap bench --help)\n"
    "  store-rendezvous  join a trainer's torch TCPStore (vLLM / SGLang NCCL init) and print the\n"
    "             NCCL unique id and graphswap's rank\n"
    "  primerl-meta  parse one pickle of prime-rl's NCCL per-state-dict metadata and print it (JSON)\n"
    "  help       this list\n"
    "\n"
    "graphswap <command> --help shows the command's options.\n";

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "serve") == 0) return srv_cmd_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "generate") == 0) return srv_cmd_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "mkmodel") == 0) return srv_cmd_mkmodel(argc - 1, argv + 1);
    if (strcmp(cmd, "eval") == 0) return srv_cmd_eval(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return srv_cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "store-rendezvous") == 0) return srv_cmd_store_rendezvous(argc - 1, argv + 1);
    if (strcmp(cmd, "primerl-meta") == 0) return srv_cmd_primerl_meta(argc - 1, argv + 1);
    fprintf(stderr, "graphswap: unknown command %s\n%s", cmd, usage);
    return 2;
}
