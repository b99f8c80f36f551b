/* server/weights/weights.h — the weight-update layer as the server's wiring (server/serve.c) sees
 * it: set-up, the native routes, the engine thread's command runner, memory release. What the
 * weight routes of the dialects share is server/weights/weights_api.h. */
#ifndef GS_SRV_WEIGHTS_H
#define GS_SRV_WEIGHTS_H

#include "server/core/srv.h"

/* ---- weights (weights_api.c; the dialects' routes: weights_vllm.c, weights_sglang.c, weights_gpu.c) - */
void srv_weights_init(srv_state *s);
void srv_weights_destroy(srv_state *s);
void srv_weights_routes(srv_state *s);
/* Engine thread: runs the admin commands that are ready (a "wait" pause runs once nothing runs or
 * its drain deadline passed); publishes the weight state. Returns 1 when a command still waits for
 * running requests to drain (the engine must keep stepping). */
int srv_cmds_run(srv_state *s, int stopping);
void srv_weights_publish(srv_state *s);
/* Engine thread: seconds until the open weight session times out (<= 0: now), or -1 when no
 * session is open or the timeout is off. */
double srv_weights_session_due(srv_state *s);
/* Engine thread: aborts the open session when it has timed out (as POST /v1/weights/abort would),
 * logs it to stderr and counts it. */
void srv_weights_expire(srv_state *s);
/* 1 while generation must not step (a session is open or /pause is in effect). */
int srv_engine_frozen(srv_state *s);
/* ---- memory release (memory_api.c): vLLM /sleep, /wake_up, /is_sleeping; SGLang
 * /release_memory_occupation, /resume_memory_occupation ---------------------------------------------- */
void srv_memory_routes(srv_state *s);

/* The CUDA-IPC routes (weights_gpu.c; native). */
void srv_weights_gpu_routes(srv_state *s);

/* ---- replicas that join with the live weights (pull.c): GET /v1/weights/export, POST
 * /v1/weights/pull, serve --weights-from -------------------------------------------------------------- */
void srv_weights_pull_routes(srv_state *s);
/* serve --weights-from URL: marks the replica not ready (s->pull_pending) and starts the thread
 * that pulls the weights of URL (bearer key: NULL / "" none), retrying while the source is
 * unreachable or busy for timeout_s seconds. Before the listener starts. 0, or -1 with err (a bad
 * URL or key). */
int srv_pull_boot_start(srv_state *s, const char *url, const char *key, double timeout_s, char *err, size_t errlen);
/* 1 once the start-up pull gave up (the server must exit non-zero). */
int srv_pull_boot_failed(srv_state *s);
/* Shutdown: cancel tells the start-up pull to stop (before the engine thread stops); stop waits for
 * its thread and frees it (after the engine thread stopped: every command it waits for is answered). */
void srv_pull_boot_cancel(srv_state *s);
void srv_pull_boot_stop(srv_state *s);
#endif
