/* server/cmd/cmd.h — the binary's commands (one file each in server/cmd/; main.c dispatches by name).
 * `serve` is server/server.h, `bench ...` bench/bench.h. Each takes its argv (argv[0] the command
 * name) and returns the process exit status. */
#ifndef GS_SRV_CMD_H
#define GS_SRV_CMD_H

int srv_cmd_generate(int argc, char **argv);
int srv_cmd_mkmodel(int argc, char **argv);
int srv_cmd_eval(int argc, char **argv);
/* `graphswap store-rendezvous` (server/rendezvous/tcpstore.h from the command line) */
int srv_cmd_store_rendezvous(int argc, char **argv);
/* `graphswap primerl-meta` (server/rendezvous/primerl_meta.c from the command line) */
int srv_cmd_primerl_meta(int argc, char **argv);

#endif
