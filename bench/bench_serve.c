/* bench/bench_serve.c — `graphswap bench serve`: placeholder until the server issue lands. */
#include <stdio.h>

#include "server/cli.h"

int srv_bench_serve(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "graphswap bench serve: not built yet (see README: not done)\n");
    return 2;
}
