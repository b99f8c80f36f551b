/* server/dialects/dialects.h — the framework dialects: each framework's generation routes
 * (<framework>_generate.c) and weight routes (<framework>_weights.c) side by side, registered by
 * server/serve.c. They translate onto the native request (server/core/srv.h) and the native weight
 * commands (server/weights/weights_api.h) and answer in their framework's shape. */
#ifndef GS_SRV_DIALECTS_H
#define GS_SRV_DIALECTS_H

#include "server/core/srv.h"
#include "server/openai/openai.h" /* srv_prompt_logprobs_vllm (vLLM's answer shape, shared) */
#include "server/weights/weights_api.h"

/* ---- dialects (dialect_*.c): framework-native routes over the same jobs --------------------------- */
void srv_dialect_sglang_routes(srv_state *s); /* SGLang: /generate, /abort_request, server and model info */
void srv_dialect_vllm_routes(srv_state *s);   /* vLLM tokens in / tokens out: /inference/v1/generate */
void srv_dialect_trl_routes(srv_state *s);    /* TRL `trl vllm-serve`: /health/, /generate/, /chat/, ... */

/* The shared translation of a dialect's sampling fields onto srv_gen: each {dialect name, canonical
 * name} pair copies src[dialect name] into canon[canonical name] (canonical = the /v1/completions
 * field srv_parse_gen reads), then srv_parse_gen validates and fills g. On an error, e names the
 * dialect's field again. canon is consumed. */
typedef struct {
    const char *from, *to;
} srv_field_map;
int srv_parse_mapped(const srv_state *s, cJSON *canon, const cJSON *src, const srv_field_map *map, int n_map,
                     srv_gen *g, srv_err *e);
/* Renames the canonical field `to` back to the dialect's `from` in e (param and message). */
void srv_err_rename(srv_err *e, const srv_field_map *map, int n_map);

/* ---- weight routes (<framework>_weights.c; registered by server/serve.c) ------------------------- */

void srv_weights_vllm_routes(srv_state *s);
void srv_weights_sglang_routes(srv_state *s);
void srv_weights_sglang_tensor_routes(srv_state *s); /* /update_weights_from_tensor (sglang_tensor.c) */
/* Leaves a joined SGLang group that never got its communicator (at shutdown). */
void srv_weights_sglang_destroy(srv_state *s);
void srv_weights_trl_routes(srv_state *s); /* also sets srv_state.w_settle (TRL's session end) */
/* At shutdown: the TRL store. */
void srv_weights_trl_destroy(srv_state *s);
/* SkyRL's /collective_rpc weight-sync methods and /fetch_weights (weights_skyrl.c) */
void srv_weights_skyrl_routes(srv_state *s);
/* prime-rl's /init_broadcaster (weights_primerl.c); after it succeeded (CUDA), /update_weights
 * {"weight_dir"} is srv_primerl_update_nccl instead of a disk load */
void srv_weights_primerl_routes(srv_state *s);
int srv_primerl_broadcasting(const srv_state *s);
int srv_primerl_update_nccl(srv_state *s, struct mg_connection *conn, const cJSON *b);
void srv_weights_areal_routes(srv_state *s);
/* Drops a weight meta set by /areal_set_update_weight_meta (at shutdown). */
void srv_weights_areal_destroy(srv_state *s);
/* The SGLang-style NCCL group (weights_sglang.c), shared with AReaL whose trainer creates its group
 * the same way (init_custom_process_group: SRV_STORE_SGLANG keys, no warm-up). init: c from
 * srv_nccl_init_request; joins the trainer's store (or creates the communicator from
 * nccl_unique_id_b64); update_route names the route that creates the communicator in the message.
 * update: c an SRV_CMD_NCCL_UPDATE with its meta; 501 on the CPU backend, else the pending group's
 * communicator, then the update. Both take c and answer {success, message}. */
int srv_nccl_group_init(srv_state *s, struct mg_connection *conn, srv_cmd *c, const char *update_route);
int srv_nccl_group_update(srv_state *s, struct mg_connection *conn, srv_cmd *c);

#endif
