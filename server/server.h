/* server/server.h — a graphswap server in this process (server/serve.c): what `graphswap serve`
 * and `graphswap eval --model` start and stop. */
#ifndef GS_SRV_SERVER_H
#define GS_SRV_SERVER_H

#include <stddef.h>

/* ---- a server in this process (serve.c) ---------------------------------------------------------
 * `graphswap serve` is srv_server_start + wait for SIGINT / SIGTERM + srv_server_stop; graphswap
 * eval --model runs its servers in its own process with the same two calls. */
typedef struct srv_server srv_server;
/* serve's argv (argv[0] the command name): options as `graphswap serve` takes them (--help prints
 * the help and exits 0, a bad option exits 2, a bad --admin-allow / --weights-root exits 1); loads the
 * model, starts the engine thread and the listener. NULL with err filled when the model does not
 * load or the address cannot be bound. */
srv_server *srv_server_start(int argc, char **argv, char *err, size_t errlen);
const char *srv_server_url(const srv_server *sv); /* "http://HOST:PORT", the bound port */
void srv_server_stop(srv_server *sv);             /* the shutdown of serve.c's file comment; frees sv */
/* 1 once the server cannot become ready: its --weights-from pull gave up (serve then exits 1). */
int srv_server_failed(const srv_server *sv);

/* `graphswap serve`: srv_server_start + wait for SIGINT / SIGTERM + srv_server_stop. */
int srv_cmd_serve(int argc, char **argv);

#endif
