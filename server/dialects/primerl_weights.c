/* server/dialects/primerl_weights.c — prime-rl's NCCL broadcaster mode (PrimeIntellect-ai/prime-rl@559b447,
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
 *                 all_reduce — vLLM's rendezvous exactly (SRV_STORE_VLLM, server/rendezvous/tcpstore.h).
 *   trainer       src/prime_rl/transports/weights/nccl.py NCCLWeightBroadcastSender: rank 0 of
 *                 inference_world_size + 1, the same StatelessProcessGroup + PyNcclCommunicator.
 *   update        the orchestrator (client.py update_weights) POSTs /pause?mode=keep, touches
 *                 <weight_dir>/NCCL_READY, POSTs /update_weights {"weight_dir"} (the same body as the
 *                 filesystem mode: the NCCL worker ignores the folder, which holds only the STABLE and
 *                 NCCL_READY markers) and /resume; the trainer waits for NCCL_READY, then broadcasts.
 *
 * What the trainer broadcasts per update (transports/weights/nccl.py broadcast_weights /
 * broadcast_state_dict / broadcast_integer; the receiving side, inference/vllm/worker/nccl.py
 * receive_integer / receive_state_dict, reads the same sequence), every broadcast from src=0 with
 * PyNcclCommunicator.broadcast on a CUDA tensor:
 *   1. broadcast_integer(N): torch.tensor([N], dtype=torch.long).cuda(), one int64 (8 bytes, little
 *      endian), N = layers + 1 state dicts;
 *   2. N times, first the non-layer tensors (embeddings, final norm, lm_head) then layer 0, 1, ...
 *      (filter_state_dict_by_layers):
 *        a. the metadata's byte length L: torch.tensor([len(state)], dtype=torch.long).cuda();
 *        b. L bytes, torch.ByteTensor(list(state)).cuda(): state = pickle.dumps(metadata) (default
 *           protocol), metadata = {torch.dtype: [(name, torch.Size, numel), ...]} in the state
 *           dict's order, one key per dtype present;
 *        c. per dtype, in the dict's order: one broadcast of torch.cat of the dtype's tensors
 *           flattened (numel = the sum of the numels, no padding).
 *   The names are Hugging Face checkpoint names (preprocess_layer_checkpoint: convert_layer_to_hf /
 *   revert_weight_conversion). With quantize_in_weight_transfer the layers come in vLLM's kernel
 *   format with FP8 weights (preprocess_layer_quantized): refused here at init.
 *   (ncclBroadcast moves count * dtype-size bytes whatever the dtype: the int64s and each dtype's
 *   concatenation are received as that many uint8 into the NCCL staging, engine/backend/transport_cuda.h.)
 *
 * graphswap: /init_broadcaster validates its body (400 naming the field); on the CPU backend it
 * answers 501 before any network I/O; on CUDA it is vLLM's init (SRV_CMD_NCCL_INIT after the
 * SRV_STORE_VLLM rendezvous) at rank rank_offset + 1 of inference_world_size + 1 (graphswap is one
 * GPU: local rank 0; the trainer, root 0), warm-up all_reduce included, answered {"status": "ok"}.
 * The server is then in broadcaster mode: /update_weights {"weight_dir"} is SRV_CMD_PRIMERL_UPDATE
 * (primerl_cmd_run, below), which on the engine thread opens a partial session on the target
 * with pause "keep" (unless one is open), receives 1. and reads it back to the host, then per state
 * dict receives a. and b. into the staging, downloads them, unpickles b. with a strict unpickler
 * of exactly that shape (server/rendezvous/primerl_meta.c: torch dtype globals, torch.Size reductions, nothing
 * executed), and receives each c. as one NCCL bucket of one frame (weights_gpu.c: validated against
 * the model before any byte moves; refused tensors are received and dropped so the trainer stays in
 * step); the session is finished once at the end (one post-load hook), and the answer is prime-rl's
 * {"status": "ok"}. Generation stays paused until prime-rl's /resume. Each dtype group of one state
 * dict must fit the NCCL staging (GRAPHSWAP_NCCL_STAGING_BYTES, else --max-bucket-bytes).
 *
 * Verified: the unpickler against pickles real torch 2.15 wrote (tests/unit/test_primerl_meta.c,
 * tests/integration/test_primerl_meta.py, fuzzed by tests/fuzz/fuzz_primerl_meta.c). The engine
 * path is compile-checked only: it has never run on a GPU against prime-rl's trainer.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/rendezvous/le.h"
#include "server/rendezvous/primerl_meta.h"
#include "server/dialects/dialects.h"

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
    cJSON *b = srv_read_json(&s->http, conn, &e);
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

/* ---- the update, engine side ------------------------------------------------------------------------
 * prime-rl's stream (see the top of the file), received in order from root 0 into the NCCL staging:
 * the count N, then per state dict its length L, its pickle (downloaded to the host and unpickled:
 * server/rendezvous/primerl_meta.c) and one broadcast per dtype group, each received as a bucket of one frame
 * (the group's tensors back to back: srv_gpu_meta_chunks(m, UINT64_MAX)) with the code of vLLM's
 * and SGLang's buckets (srv_gpu_nccl_bucket: validated against the model first; a refused group is
 * still received and dropped). After the first refusal every later group is received and dropped
 * too (srv_gpu_nccl_drain) so the trainer completes its broadcasts and the communicator stays in
 * step for the next update; the session is then aborted and the first refusal answered. What makes
 * the stream impossible to follow (a count, length or pickle refused, a group larger than the
 * staging, a failed receive) releases the communicator: no later receive can be matched with the
 * right broadcast, so the trainer's pending broadcast ends at its NCCL timeout instead. */

#define PRIMERL_MAX_STATE_DICTS 100000 /* N = decoder layers + 1 */

/* The group [a, b) of pm as c->meta (names moved out of pm): one frame of all its tensors. */
static int group_meta(srv_primerl_meta *pm, size_t a, size_t b, srv_cmd *c)
{
    srv_gpu_meta *m = &c->meta;
    srv_err se;
    memset(m, 0, sizeof *m);
    m->t = calloc(b - a, sizeof *m->t);
    m->off = calloc(b - a, sizeof *m->off);
    m->roff = calloc(b - a, sizeof *m->roff);
    if (!m->t || !m->off || !m->roff) {
        srv_gpu_meta_free(m);
        return -1;
    }
    for (size_t i = a; i < b; i++) {
        m->t[m->n] = pm->t[i];
        pm->t[i].name = NULL; /* (m owns it now) */
        m->total += m->t[m->n].nbytes;
        m->n++;
    }
    if (srv_gpu_meta_chunks(m, UINT64_MAX, &se) != 0) {
        srv_gpu_meta_free(m);
        return -1;
    }
    return 0;
}

static void primerl_cmd_run(srv_state *s, srv_cmd *c, int *st)
{
    eng_engine *e = s->rt.e;
    const gs_gpu_transport *x = srv_gpu_xport(s);
    char *err = c->err;
    const size_t el = sizeof c->err;
    if (!x || !x->have_nccl) {
        snprintf(err, el, "%s", x ? "this server's CUDA module was built without NCCL" : SRV_GPU_NEEDS_CUDA);
        *st = 501;
        return;
    }
    if (!s->nccl) {
        snprintf(err, el, "no NCCL group: POST /init_broadcaster first (a failed receive closes the group)");
        *st = 409;
        return;
    }
    char first[sizeof c->err] = ""; /* the first refusal, while the stream is still followed */
    char why[sizeof c->err];
    int refused = 0, fst = 500, bst;
    uint64_t nd = 0, d = 0;
    unsigned char b8[8], *buf = NULL;
    srv_primerl_meta pm;
    memset(&pm, 0, sizeof pm);
    eng_weights_info wi;
    eng_weights_get_info(e, &wi);
    /* a partial session on the target, pause "keep": prime-rl has paused with mode=keep, and resumes
     * with /resume itself (s->paused is left as it is) */
    if (!wi.session_open &&
        eng_weights_begin(e, 0, ENG_WMODEL_TARGET, ENG_PAUSE_KEEP, c->version, &c->session, first, sizeof first,
                          &fst) != 0)
        refused = 1;
    /* 1. the count: one torch.long, 8 bytes little endian */
    if (srv_gpu_nccl_recv_host(s, c, b8, 8, st) != 0) goto recv_failed;
    nd = srv_le64(b8);
    if (nd == 0 || nd > PRIMERL_MAX_STATE_DICTS) {
        snprintf(why, sizeof why, "a state-dict count of %llu (1..%d expected)", (unsigned long long)nd,
                 PRIMERL_MAX_STATE_DICTS);
        goto lost;
    }
    for (d = 0; d < nd; d++) {
        /* 2a. the pickle's length, 2b. the pickle */
        if (srv_gpu_nccl_recv_host(s, c, b8, 8, st) != 0) goto recv_failed;
        const uint64_t len = srv_le64(b8);
        if (len < 4 || len > SRV_PRIMERL_META_MAX_BYTES || len > s->nccl_staging_bytes) {
            snprintf(why, sizeof why, "a metadata pickle of %llu bytes (4..%u, and at most the NCCL staging's %zu)",
                     (unsigned long long)len, SRV_PRIMERL_META_MAX_BYTES, s->nccl_staging_bytes);
            goto lost;
        }
        if (!(buf = malloc((size_t)len))) {
            snprintf(why, sizeof why, "out of memory");
            goto lost;
        }
        if (srv_gpu_nccl_recv_host(s, c, buf, (size_t)len, st) != 0) goto recv_failed;
        if (srv_primerl_meta_unpickle(buf, (size_t)len, &pm, why, sizeof why) != 0) goto lost;
        free(buf);
        buf = NULL;
        /* 2c. one broadcast per dtype, in the dict's order */
        for (size_t g = 0; g < pm.ngroups; g++) {
            const char *tn = srv_primerl_torch_dtype_name(pm.group_dtype[g]);
            if (group_meta(&pm, g ? pm.group_end[g - 1] : 0, pm.group_end[g], c) != 0) {
                snprintf(why, sizeof why, "out of memory");
                goto lost;
            }
            const uint64_t need = srv_gpu_meta_frame_need(&c->meta);
            if (need > s->nccl_staging_bytes) {
                snprintf(why, sizeof why, "its torch.%s tensors come in one broadcast of %llu bytes, more than the NCCL "
                         "staging holds (%zu bytes: set GRAPHSWAP_NCCL_STAGING_BYTES before /init_broadcaster)", tn,
                         (unsigned long long)need, s->nccl_staging_bytes);
                goto lost;
            }
            if (!refused) {
                if (srv_gpu_nccl_bucket(s, c, &bst) != 0) {
                    if (!s->nccl) goto recv_failed; /* (c->err: the receive's failure) */
                    refused = 1;
                    fst = bst;
                    snprintf(first, sizeof first, "%.900s (prime-rl state dict %llu of %llu, its torch.%s tensors)",
                             err, (unsigned long long)d + 1, (unsigned long long)nd, tn);
                }
            } else {
                err[0] = 0;
                srv_gpu_nccl_drain(s, c);
                if (!s->nccl) goto recv_failed;
            }
            srv_gpu_meta_free(&c->meta);
        }
        srv_primerl_meta_free(&pm);
    }
    eng_weights_get_info(e, &wi);
    if (refused) {
        if (wi.session_open) {
            char e2[64];
            eng_weights_abort(e, e2, sizeof e2, &bst);
        }
        snprintf(err, el, "%s", first);
        *st = fst;
        return;
    }
    if (eng_weights_finish(e, c->version, err, el, st) != 0) return; /* (one post-load hook) */
    *st = 200;
    return;

recv_failed: /* the communicator is released (srv_gpu_nccl_*) */
    snprintf(why, sizeof why, "receiving the broadcast failed: %.700s", err + (strncmp(err, "; ", 2) ? 0 : 2));
lost:
    srv_gpu_nccl_release(s);
    free(buf);
    srv_primerl_meta_free(&pm);
    srv_gpu_meta_free(&c->meta);
    eng_weights_get_info(e, &wi);
    if (wi.session_open) {
        char e2[64];
        eng_weights_abort(e, e2, sizeof e2, &bst);
    }
    snprintf(err, el, "%.300s%sprime-rl's NCCL stream, state dict %llu of %llu: %.450s; the NCCL group is closed "
             "(its stream cannot be followed past this): POST /init_broadcaster again", first,
             first[0] ? "; then " : "", (unsigned long long)(d < nd ? d + 1 : d), (unsigned long long)nd, why);
    *st = 502;
}

/* /update_weights {"weight_dir"} in broadcaster mode (weights_vllm.c asks srv_primerl_broadcasting
 * first): the whole framed stream of one update received by the engine thread (above), answered
 * {"status": "ok"} as prime-rl's server does. weight_dir is only checked for its type, as
 * prime-rl's NCCL worker ignores it. */
int srv_primerl_update_nccl(srv_state *s, struct mg_connection *conn, const cJSON *b)
{
    const cJSON *wd = cJSON_GetObjectItemCaseSensitive(b, "weight_dir");
    if (wd && !cJSON_IsNull(wd) && !cJSON_IsString(wd))
        return srv_send_error(conn, 400, "weight_dir", "weight_dir must be a string");
    if (!srv_gpu_available(s)) return srv_send_error(conn, 501, NULL, "%s", SRV_GPU_NEEDS_CUDA);
    SRV_NEW_CMD(c, SRV_CMD_PRIMERL_UPDATE);
    c->run = primerl_cmd_run; /* the runner calls it on the engine thread */
    c->which = ENG_WMODEL_TARGET;
    c->pause = ENG_PAUSE_KEEP;
    snprintf(c->what, sizeof c->what, "prime-rl NCCL update");
    srv_cmd_submit(s, c);
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
    }
    int st = srv_cmd_send_result(conn, c, o);
    srv_gpu_meta_free(&c->meta);
    free(c);
    return st;
}

/* GET /liveness (prime-rl src/prime_rl/inference/vllm/server.py at 559b447, polled by its
 * Kubernetes liveness probe): 200 {"status": "ok"} when the engine loop serviced a no-op within the
 * timeout (prime-rl's liveness_timeout_seconds, default 30; ?timeout= here, 0.1 to 300), else 503
 * {"status": "engine_unresponsive"}. Unlike /health it proves the engine thread is looping. */
static int route_liveness(srv_state *s, struct mg_connection *conn)
{
    double lim = 30;
    if (srv_query_seconds(conn, "timeout", 0.1, 300, &lim) < 0)
        return srv_send_error(conn, 400, "timeout", "timeout must be a number of seconds in [0.1, 300]");
    const int rc = srv_engine_ping(s, lim);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", rc == 0 ? "ok" : rc == 1 ? "engine_unresponsive" : "shutting_down");
    int st = srv_send_json(conn, rc == 0 ? 200 : 503, o);
    cJSON_Delete(o);
    return st;
}

void srv_weights_primerl_routes(srv_state *s)
{
    srv_route_add(&s->http, "GET", "/liveness", route_liveness, 0);
    srv_route_add(&s->http, "POST", "/init_broadcaster", route_init_broadcaster, 2);
}
