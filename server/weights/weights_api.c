/* server/weights/weights_api.c — the weight-update API over HTTP: the engine-thread command runner, the
 * native /v1/weights/... routes, disk loads and their confinement, checksums, pause / resume, and the
 * helpers the dialects share (weights_internal.h). vLLM's routes are in weights_vllm.c, SGLang's in
 * weights_sglang.c, the NCCL / CUDA-IPC transports in weights_gpu.c.
 *
 * Every route is a thin producer: handler threads validate input (JSON bodies, safetensors headers
 * of buckets, paths) and hand a command to the engine thread, which alone touches the engine
 * (engine/weights.h: begin -> bucket* -> finish | abort). A transport only produces
 * (name, dtype, shape, bytes); the NCCL and CUDA-IPC transports of the CUDA backend plug into the
 * same commands.
 *
 * Commands run in arrival order on the engine thread between steps. A "wait" begin (or /pause with
 * mode=wait) first stops admission and lets running requests finish, bounded by --drain-timeout;
 * what still runs then is aborted. While a session is open or generation is paused, the engine does
 * not step (I7); requests queue. A session without a command or a bucket upload for
 * --weight-session-timeout seconds (the trainer died) is aborted by the engine thread, as an
 * explicit abort would (srv_weights_expire), so queued requests do not wait forever.
 *
 * Disk loads are confined to --weights-root file by file: relative paths are taken under the root,
 * and the folder and every file the loader opens must resolve under it (confine, confine_ckpt).
 *
 * Bucket bodies (application/octet-stream safetensors) stream into one staging buffer reused by
 * every bucket of every session (bucket_mu: one upload at a time), bounded by --max-bucket-bytes.
 * It keeps the size of the largest bucket seen: resident memory is flat across updates, and
 * no update pays for page-faulting a fresh buffer (measured: 512 MiB buckets 2.8 GB/s with a
 * buffer per session, 6.7 GB/s reused).
 *
 * The command runner, srv_cmds_run (engine thread, called by server/serve.c engine_main between
 * steps). A route parses and validates its input into a srv_cmd and queues it: srv_cmd_submit
 * waits for it, srv_cmd_post (detached) does not. One command at a time, the head of the queue:
 *
 *   QUEUED    s->cmd_head .. cmd_tail (under s->mu)
 *     |  run_cmd. A "wait" BEGIN, LOAD, NCCL_UPDATE (with a communicator) or PAUSE, with no session
 *     |  open and the weights not UNDEFINED, first drains:
 *     v
 *   DRAINING  admission off (eng_set_admission(0)), deadline = now + --drain-timeout. run_cmd
 *     |  returns 0, srv_cmds_run returns 1 and engine_main steps though frozen; the head command is
 *     |  run again each iteration until nothing runs or the deadline passed (what still runs is
 *     |  aborted: abort_running); then admission on again
 *     v
 *   RUN       the kind's engine calls (below); the HTTP status in c->status, the message in c->err;
 *     |  srv_log_weight_cmd logs a session that ended
 *     v
 *   DONE      srv_weights_publish, c->done = 1, its cv signalled (the handler answers and frees it);
 *             a detached command is logged when it failed and freed here.
 *   Stopping: every queued command goes to DONE with 503, unrun (a drain's admission restored).
 *
 *   kind                 engine calls (engine/weights.h unless named)
 *   BEGIN                eng_weights_begin (pause "abort" ends running requests there)
 *   BUCKET               eng_weights_bucket (the handler parsed the safetensors header already)
 *   FINISH               eng_weights_finish; the CUDA-IPC mapping released once the session closed
 *   ABORT                eng_weights_abort; the CUDA-IPC mapping released
 *   LOAD                 confine_ckpt again, then one whole session: eng_weights_begin ->
 *                        eng_weights_load_dir (the target, then the drafter: "draft." for model "all")
 *                        -> eng_weights_finish; a failed load is aborted (INCONSISTENT once something
 *                        was written, I8)
 *   HOST_UPDATE          one whole session: eng_weights_begin -> eng_weights_bucket of the caller's
 *                        host tensors (SGLang /update_weights_from_tensor; a pull, pull.c) ->
 *                        eng_weights_finish; a refused bucket is aborted (it wrote nothing);
 *   CHECKSUMS            eng_weights_checksums or eng_weights_checksums_ckpt
 *   RESET_PREFIX         eng_reset_prefix_cache
 *   PAUSE / RESUME       s->paused = 1 / 0 (PAUSE "abort": eng_abort_running first); no engine state:
 *                        engine_main does not step while paused (srv_engine_frozen). No update ends
 *                        a pause: a /pause (vLLM), /pause_generation (SGLang) or AReaL's pause lasts
 *                        until its resume route, as each framework pauses, updates (slime: many
 *                        buckets; a fleet: every replica), then resumes itself
 *   SET_VERSION          eng_weights_set_version
 *   NCCL_*, IPC_*        srv_gpu_cmd_run (weights_gpu.c): receive into a session, or manage the group
 *   TRL_*, PRIMERL_...   c->run, the dialect's engine side (server/dialects/), set by its route
 *   WRESET               c->run: eng_weights_reset (weights_checker reset_tensors, checker.c)
 *   EXPORT               c->run: eng_weights_ckpt_visit into one safetensors buffer (pull.c)
 * The session timeout is not a command: srv_weights_expire (after the commands, each iteration)
 * aborts an open session with no command and no bucket upload for --weight-session-timeout.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/format/json_guard.h"
#include "server/weights/weights_api.h"

/* ---- engine thread -------------------------------------------------------------------------------- */

static void publish_version_name(srv_state *s, const eng_weights_info *w)
{
    snprintf(s->vname[w->version_num % 64], sizeof s->vname[0], "%s", w->version);
}

void srv_weights_publish(srv_state *s)
{
    eng_weights_info w;
    eng_weights_get_info(s->rt.e, &w);
    pthread_mutex_lock(&s->wmu);
    s->wpub = w;
    publish_version_name(s, &w);
    s->is_paused_pub = s->paused;
    pthread_mutex_unlock(&s->wmu);
}

/* I7: engine_main steps only when this is 0 (or a "wait" drain runs): no step while a session is open
 * (UPDATING) or generation is paused */
int srv_engine_frozen(srv_state *s) { return s->paused || eng_weights_state(s->rt.e) == ENG_W_UPDATING; }

static void add_sum(const char *name, const char *hex, void *u) { cJSON_AddStringToObject(u, name, hex); }

static void abort_running(srv_state *s, srv_cmd *c)
{
    int n = eng_num_running(s->rt.e);
    eng_engine *e = s->rt.e;
    /* eng_abort_all would also end queued requests; a pause ends only what runs */
    c->aborted_requests += n;
    eng_abort_running(e);
}

static int confine_ckpt(srv_state *s, const char *dir, srv_err *e, const char *param);

/* Runs one command; returns 0 when it must wait (drain), 1 when done. */
static int run_cmd(srv_state *s, srv_cmd *c)
{
    eng_engine *e = s->rt.e;
    int st = 200;
    char *err = c->err;
    const size_t el = sizeof c->err;
    eng_weights_info wi;
    eng_weights_get_info(e, &wi);
    /* (with a session already open or the weights undefined the command fails at once: no drain) */
    const int begins =
        c->kind == SRV_CMD_BEGIN || c->kind == SRV_CMD_LOAD || c->kind == SRV_CMD_HOST_UPDATE ||
        (c->kind == SRV_CMD_NCCL_UPDATE && s->nccl);
    if ((begins || c->kind == SRV_CMD_PAUSE) && c->pause == ENG_PAUSE_WAIT &&
        !wi.session_open && wi.state != ENG_W_UNDEFINED) {
        /* drain: no admission, running requests finish (bounded); the rest is aborted */
        if (!c->draining) {
            c->draining = 1;
            c->deadline = srv_now() + s->drain_timeout;
            eng_set_admission(e, 0);
        }
        /* I7 ("wait"): the session begins only once nothing runs, so no request straddles two weight
         * versions; returning 0 keeps this command at the head and lets engine_main step meanwhile */
        if (eng_num_running(e) > 0 && srv_now() < c->deadline) return 0;
        if (eng_num_running(e) > 0) abort_running(s, c);
        eng_set_admission(e, 1);
    }
    if (begins && !wi.session_open && wi.state != ENG_W_UNDEFINED) {
        if (c->pause == ENG_PAUSE_ABORT) c->aborted_requests += eng_num_running(e); /* begin ends them */
        else c->paused_requests = eng_num_running(e); /* frozen during the session ("wait": none left) */
    }
    switch (c->kind) {
    case SRV_CMD_BEGIN:
        if (eng_weights_begin(e, c->full, c->which, c->pause, c->version, &c->session, err, el, &st) == 0) {
            st = 200;
        }
        break;
    case SRV_CMD_BUCKET:
        if (eng_weights_bucket(e, c->tensors, c->n_tensors, c->what, err, el, &st) == 0) st = 200;
        break;
    case SRV_CMD_FINISH:
        if (eng_weights_finish(e, c->version, err, el, &st) == 0) st = 200;
        eng_weights_get_info(e, &wi);
        if (!wi.session_open) srv_gpu_ipc_release(s); /* once per session: closed when the session ends */
        break;
    case SRV_CMD_ABORT:
        if (eng_weights_abort(e, err, el, &st) == 0) st = 200;
        srv_gpu_ipc_release(s);
        break;
    case SRV_CMD_NCCL_INIT:
    case SRV_CMD_NCCL_BUCKET:
    case SRV_CMD_NCCL_UPDATE:
    case SRV_CMD_NCCL_DESTROY:
    case SRV_CMD_IPC_OPEN:
    case SRV_CMD_IPC_BUCKET:
        srv_gpu_cmd_run(s, c, &st); /* weights_gpu.c */
        break;
    case SRV_CMD_TRL_INIT:
    case SRV_CMD_TRL_COMM:
    case SRV_CMD_TRL_CHECK:
    case SRV_CMD_TRL_PARAM:
    case SRV_CMD_TRL_FINISH:
    case SRV_CMD_TRL_CLOSE:
    case SRV_CMD_PRIMERL_UPDATE:
    case SRV_CMD_WRESET:
    case SRV_CMD_EXPORT: /* the export's copy of the weights (pull.c) */
        /* a dialect's own engine-side steps (dialects/trl_weights.c, primerl_weights.c): set by the
         * route that made the command */
        assert(c->run);
        c->run(s, c, &st);
        break;
    case SRV_CMD_HOST_UPDATE: /* one whole session of one bucket of host tensors (the caller's) */
        if (eng_weights_begin(e, c->full, c->which, c->pause, c->version, &c->session, err, el, &st) != 0) break;
        if (eng_weights_bucket(e, c->tensors, c->n_tensors, c->what, err, el, &st) != 0) {
            int st2; /* a refused bucket writes nothing: the weights are what they were */
            char e2[64];
            eng_weights_abort(e, e2, sizeof e2, &st2);
            break;
        }
        if (eng_weights_finish(e, c->version, err, el, &st) == 0) st = 200;
        break;
    case SRV_CMD_LOAD: {
        /* the files again, right before they are opened (see confine_ckpt) */
        srv_err ce;
        if (confine_ckpt(s, c->path, &ce, "path") != 0 ||
            (c->which == ENG_WMODEL_ALL && confine_ckpt(s, c->draft_path, &ce, "draft_path") != 0)) {
            snprintf(err, el, "%s", ce.msg);
            st = ce.status;
            break;
        }
        /* a whole session: begin -> the folder(s) in buckets -> finish; any failure aborts it */
        if (eng_weights_begin(e, c->full, c->which, c->pause, c->version, &c->session, err, el, &st) != 0) break;
        int rc = 0;
        const char *tdir = c->which == ENG_WMODEL_DRAFT ? NULL : c->path;
        const char *ddir = c->which == ENG_WMODEL_TARGET ? NULL : (c->which == ENG_WMODEL_DRAFT ? c->path : c->draft_path);
        if (tdir) rc = eng_weights_load_dir(e, tdir, NULL, s->update_bucket, err, el, &st);
        if (rc == 0 && ddir)
            rc = eng_weights_load_dir(e, ddir, c->which == ENG_WMODEL_ALL ? "draft." : NULL, s->update_bucket, err,
                                      el, &st);
        /* I8: a load that failed half way is aborted, never finished: if it wrote anything the
         * weights are INCONSISTENT (the load's own error is what the caller gets) */
        if (rc != 0) {
            int st2;
            char e2[64];
            eng_weights_abort(e, e2, sizeof e2, &st2);
            break;
        }
        if (eng_weights_finish(e, c->version, err, el, &st) == 0) st = 200;
        break;
    }
    case SRV_CMD_CHECKSUMS: {
        cJSON *t = cJSON_CreateObject();
        int rc = c->ckpt_names ? eng_weights_checksums_ckpt(e, c->draft, add_sum, t, &c->hash_dt)
                               : eng_weights_checksums(e, c->draft, add_sum, t);
        if (rc != 0) {
            cJSON_Delete(t);
            /* -3: the weights are asleep (released memory has nothing to hash) */
            snprintf(err, el, "%s",
                     rc == -1   ? "this server has no drafter"
                     : rc == -3 ? "the weights are asleep (released by /sleep or /release_memory_occupation): "
                                  "wake them up first"
                                : "out of memory computing checksums");
            st = rc == -1 ? 400 : rc == -3 ? 409 : 500;
        } else {
            c->result = t;
        }
        break;
    }
    case SRV_CMD_RESET_PREFIX:
        eng_reset_prefix_cache(e);
        break;
    case SRV_CMD_PAUSE:
        if (c->pause == ENG_PAUSE_ABORT) abort_running(s, c);
        s->paused = 1;
        break;
    case SRV_CMD_RESUME:
        s->paused = 0;
        break;
    case SRV_CMD_SET_VERSION:
        eng_weights_set_version(e, c->version);
        break;
    }
    srv_log_weight_cmd(e, st, err); /* one line when a session ended (server/http/log.c) */
    c->status = st;
    return 1;
}

int srv_cmds_run(srv_state *s, int stopping)
{
    for (;;) {
        pthread_mutex_lock(&s->mu);
        srv_cmd *c = s->cmd_head;
        pthread_mutex_unlock(&s->mu);
        if (!c) return 0;
        if (stopping) {
            c->status = 503;
            snprintf(c->err, sizeof c->err, "the server is shutting down");
            if (c->draining) eng_set_admission(s->rt.e, 1);
        } else if (!run_cmd(s, c)) {
            srv_weights_publish(s);
            return 1; /* draining: keep stepping */
        }
        s->wsess_last = srv_now(); /* any command is session activity */
        srv_weights_publish(s);
        const int detached = c->detached; /* (a waited-for c may be freed once the lock is released) */
        pthread_mutex_lock(&s->mu);
        s->cmd_head = c->next;
        if (!s->cmd_head) s->cmd_tail = NULL;
        c->done = 1;
        if (!detached) pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&s->mu);
        if (detached) { /* nobody waits for it: say what failed, then it is ours to free */
            if (c->status != 200)
                srv_logf("error", "weights", "%s failed (%d): %s", c->what[0] ? c->what : "a queued command",
                         c->status, c->err);
            srv_gpu_meta_free(&c->meta);
            cJSON_Delete(c->result);
            free(c);
        }
    }
}

double srv_weights_session_due(srv_state *s)
{
    if (s->session_timeout <= 0 || eng_weights_state(s->rt.e) != ENG_W_UPDATING) return -1;
    const double now = srv_now();
    /* a bucket upload being read is activity: a large bucket over a slow link may take longer
     * than the timeout to arrive, and its command only comes once it has */
    const unsigned ev = atomic_load(&s->w_upload_events);
    if (atomic_load(&s->w_uploads) > 0 || ev != s->w_events_seen) {
        s->w_events_seen = ev;
        s->wsess_last = now;
    }
    return s->wsess_last + s->session_timeout - now;
}

void srv_weights_expire(srv_state *s)
{
    const double due = srv_weights_session_due(s);
    /* TRL's session ends by a finish (dialects/trl_weights.c) */
    if (s->w_settle && s->w_settle(s, due != -1 && due <= 0)) return;
    if (due == -1 || due > 0) return; /* (-1 is exact: no session, or the timeout is off) */
    eng_weights_info wi;
    eng_weights_get_info(s->rt.e, &wi);
    char err[256];
    int st;
    /* (a trainer that died mid-session must not freeze generation forever, I7; I8 applies as to any
     * abort) */
    eng_weights_abort(s->rt.e, err, sizeof err, &st); /* exactly what POST /v1/weights/abort does */
    srv_gpu_ipc_release(s);
    atomic_fetch_add(&s->w_sessions_timed_out, 1);
    srv_weights_publish(s);
    eng_weights_info after;
    eng_weights_get_info(s->rt.e, &after);
    fprintf(stderr, "graphswap: weights: session %llu aborted after %.0f s without a bucket or command "
            "(--weight-session-timeout); weights %s\n",
            (unsigned long long)wi.session_id, s->session_timeout, eng_wstate_name(after.state));
    fflush(stderr);
}

/* ---- handler side ------------------------------------------------------------------------------------ */

void srv_cmd_post(srv_state *s, srv_cmd *c)
{
    c->detached = 1;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        srv_gpu_meta_free(&c->meta);
        free(c);
        return;
    }
    c->next = NULL;
    if (s->cmd_tail) s->cmd_tail->next = c;
    else s->cmd_head = c;
    s->cmd_tail = c;
    pthread_cond_signal(&s->inbox_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Queues c for the engine thread and waits for it. Returns c->status. */
int srv_cmd_submit(srv_state *s, srv_cmd *c)
{
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        snprintf(c->err, sizeof c->err, "the server is shutting down");
        pthread_cond_destroy(&c->cv);
        return c->status = 503;
    }
    c->next = NULL;
    if (s->cmd_tail) s->cmd_tail->next = c;
    else s->cmd_head = c;
    s->cmd_tail = c;
    pthread_cond_signal(&s->inbox_cv);
    while (!c->done) pthread_cond_wait(&c->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&c->cv);
    return c->status;
}

cJSON *srv_weights_info_json(srv_state *s)
{
    pthread_mutex_lock(&s->wmu);
    eng_weights_info w = s->wpub;
    int paused = s->is_paused_pub;
    pthread_mutex_unlock(&s->wmu);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", w.version);
    cJSON_AddNumberToObject(o, "version_number", (double)w.version_num);
    cJSON_AddStringToObject(o, "state", eng_wstate_name(w.state));
    if (w.reason[0]) cJSON_AddStringToObject(o, "reason", w.reason);
    else cJSON_AddNullToObject(o, "reason");
    cJSON_AddBoolToObject(o, "session_open", w.session_open);
    cJSON_AddBoolToObject(o, "paused", paused);
    cJSON *lu = cJSON_AddObjectToObject(o, "last_update");
    cJSON_AddNumberToObject(lu, "tensors", (double)w.tensors);
    cJSON_AddNumberToObject(lu, "bytes", (double)w.bytes);
    cJSON_AddNumberToObject(lu, "buckets", (double)w.buckets);
    cJSON_AddNumberToObject(lu, "ms", w.ms);
    cJSON_AddNumberToObject(lu, "hook_ms", w.hook_ms);
    cJSON_AddNumberToObject(lu, "guard_ms", w.guard_ms);
    cJSON *c = cJSON_AddObjectToObject(o, "counters");
    cJSON_AddNumberToObject(c, "updates_ok", (double)w.updates_ok);
    cJSON_AddNumberToObject(c, "updates_failed", (double)w.updates_failed);
    cJSON_AddNumberToObject(c, "hook_runs_target", (double)w.hook_runs_target);
    cJSON_AddNumberToObject(c, "hook_runs_draft", (double)w.hook_runs_draft);
    return o;
}

int srv_cmd_send_result(struct mg_connection *conn, srv_cmd *c, cJSON *ok_body)
{
    if (c->status != 200) {
        cJSON_Delete(ok_body);
        srv_err e;
        srv_errf(&e, c->status, NULL, "%s", c->err);
        if (c->status == 409) e.type = "conflict";
        return srv_send_err(conn, &e);
    }
    int st = srv_send_json(conn, 200, ok_body);
    cJSON_Delete(ok_body);
    return st;
}

/* A JSON object body, where an empty body means {}. */
static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n'; } /* (not NUL) */

cJSON *srv_read_json_opt(srv_state *s, struct mg_connection *c, srv_err *e)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (ri->content_length == 0) return cJSON_CreateObject();
    size_t len;
    char *txt = srv_read_body(&s->http, c, &len, e);
    if (!txt) return NULL;
    size_t i = 0;
    while (i < len && is_ws(txt[i])) i++;
    /* empty or whitespace only means {} (curl -X POST sends no body); else the same checks as every
     * other JSON body: depth, NUL, one object, no trailing data (srv_parse_json_object) */
    cJSON *o = i == len ? cJSON_CreateObject() : srv_parse_json_object(txt, len, e);
    free(txt);
    return o;
}

int srv_opt_string(const cJSON *b, const char *key, const char **out, srv_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsNumber(v)) { /* versions are often numbers: keep their text */
        static _Thread_local char num[64];
        snprintf(num, sizeof num, "%.17g", v->valuedouble);
        *out = num;
        return 0;
    }
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= 128) {
        srv_errf(e, 400, key, "%s must be a string of fewer than 128 bytes", key);
        return -1;
    }
    *out = v->valuestring;
    return 0;
}

/* A version name ("version", "weight_version", "new_version"): it is echoed in weight responses,
 * /health and the weight_version of every completion, so it must be printable text: valid UTF-8,
 * no control characters (C0, DEL, C1), at most 127 bytes ("" means: no name, the number is used). */
static int check_version(const char *v, const char *key, srv_err *e)
{
    const size_t n = strlen(v);
    if (n >= 128) return srv_errf(e, 400, key, "%s must be at most 127 bytes (got %zu)", key, n), -1;
    if (!srv_utf8_valid(v, n)) return srv_errf(e, 400, key, "%s is not valid UTF-8", key), -1;
    const unsigned char *u = (const unsigned char *)v;
    for (size_t i = 0; i < n; i++) {
        /* C1 controls U+0080..U+009F are 0xC2 0x80..0x9F in (now known valid) UTF-8 */
        if (u[i] < 0x20 || u[i] == 0x7f || (u[i] == 0xc2 && i + 1 < n && u[i + 1] < 0xa0))
            return srv_errf(e, 400, key, "%s contains a control character (at byte %zu)", key, i), -1;
    }
    return 0;
}

/* srv_opt_string for a version name: absent, a number (its text) or checked text. */
int srv_opt_version(const cJSON *b, const char *key, const char **out, srv_err *e)
{
    const char *v = NULL;
    if (srv_opt_string(b, key, &v, e) != 0) return -1;
    if (v && check_version(v, key, e) != 0) return -1;
    if (v) *out = v;
    return 0;
}

/* mode / model / pause / version of a begin-like body into c. */
int srv_parse_begin(const cJSON *b, srv_cmd *c, eng_wmodel dflt_model, srv_err *e)
{
    const char *mode = "full", *model = NULL, *pause = "wait", *version = NULL;
    if (srv_opt_string(b, "mode", &mode, e) || srv_opt_string(b, "model", &model, e) ||
        srv_opt_string(b, "pause", &pause, e) ||
        srv_opt_version(b, "version", &version, e))
        return -1;
    if (!version && srv_opt_version(b, "weight_version", &version, e)) return -1;
    if (strcmp(mode, "full") != 0 && strcmp(mode, "partial") != 0)
        return srv_errf(e, 400, "mode", "mode must be \"full\" or \"partial\""), -1;
    c->full = strcmp(mode, "full") == 0;
    c->which = dflt_model;
    if (model && eng_wmodel_parse(model, &c->which) != 0)
        return srv_errf(e, 400, "model", "model must be \"target\", \"draft\" or \"all\""), -1;
    if (eng_pause_parse(pause, &c->pause) != 0)
        return srv_errf(e, 400, "pause", "pause must be \"wait\", \"abort\", \"keep\" or \"recompute\""), -1;
    if (version) snprintf(c->version, sizeof c->version, "%s", version);
    return 0;
}

srv_cmd *srv_cmd_new(srv_cmd_kind k)
{
    srv_cmd *c = calloc(1, sizeof *c);
    if (c) c->kind = k;
    return c;
}

int srv_wroute_begin_model(srv_state *s, struct mg_connection *conn, eng_wmodel dflt)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    SRV_NEW_CMD(c, SRV_CMD_BEGIN);
    int rc = srv_parse_begin(b, c, dflt, &e);
    cJSON_Delete(b);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    srv_cmd_submit(s, c);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "session", (double)c->session);
    cJSON_AddStringToObject(o, "state", "updating");
    cJSON_AddNumberToObject(o, "aborted_requests", c->aborted_requests);
    int st = srv_cmd_send_result(conn, c, o);
    free(c);
    return st;
}

int srv_wroute_begin(srv_state *s, struct mg_connection *conn)
{
    return srv_wroute_begin_model(s, conn, ENG_WMODEL_TARGET);
}

/* Reads the octet-stream body into the staging buffer (caller holds bucket_mu). */
static int read_bucket(srv_state *s, struct mg_connection *conn, size_t *len, srv_err *e)
{
    const struct mg_request_info *ri = mg_get_request_info(conn);
    long long cl = ri->content_length;
    if (cl < 0) return srv_errf(e, 411, NULL, "a bucket needs a Content-Length"), -1;
    if ((unsigned long long)cl > s->max_bucket)
        return srv_errf(e, 413, NULL, "bucket of %lld bytes is larger than --max-bucket-bytes %zu", cl, s->max_bucket), -1;
    if ((size_t)cl > s->staging_cap) {
        uint8_t *nb = realloc(s->staging, (size_t)cl ? (size_t)cl : 1);
        if (!nb) return srv_errf(e, 507, NULL, "cannot grow the staging buffer to %lld bytes", cl), -1;
        s->staging = nb;
        s->staging_cap = (size_t)cl;
    }
    const char *expect = mg_get_header(conn, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0) mg_write(conn, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    size_t n = 0;
    while ((long long)n < cl) {
        size_t want = (size_t)cl - n;
        int r = mg_read(conn, s->staging + n, want > (1u << 30) ? (1u << 30) : want);
        if (r <= 0) break;
        n += (size_t)r;
    }
    if ((long long)n != cl) return srv_errf(e, 400, NULL, "truncated bucket: got %zu of %lld bytes", n, cl), -1;
    *len = n;
    return 0;
}

static int route_bucket_locked(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    pthread_mutex_lock(&s->bucket_mu);
    size_t len = 0;
    if (read_bucket(s, conn, &len, &e) != 0) {
        pthread_mutex_unlock(&s->bucket_mu);
        return srv_send_err(conn, &e);
    }
    srv_cmd *c = srv_cmd_new(SRV_CMD_BUCKET);
    mdl_st_file f;
    memset(&f, 0, sizeof f);
    int st;
    if (!c) {
        st = srv_send_error(conn, 500, NULL, "out of memory");
    } else {
        /* buckets are numbered per session from 1 (the session a trainer's begin answered with is
         * published before that answer, so it is the one this bucket goes to) */
        pthread_mutex_lock(&s->wmu);
        const uint64_t sid = s->wpub.session_id;
        pthread_mutex_unlock(&s->wmu);
        if (sid != s->rx_session) {
            s->rx_session = sid;
            s->n_buckets_rx = 0;
        }
        snprintf(c->what, sizeof c->what, "bucket %llu", (unsigned long long)++s->n_buckets_rx);
        /* the untrusted header is validated whole here, before the engine sees a byte */
        if (mdl_st_parse(s->staging, len, c->what, &f, c->err, sizeof c->err) != 0) {
            srv_errf(&e, 400, NULL, "%s", c->err);
            st = srv_send_err(conn, &e);
        } else {
            c->tensors = f.tensors;
            c->n_tensors = f.n;
            srv_cmd_submit(s, c);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "tensors", (double)f.n);
            cJSON_AddNumberToObject(o, "bytes", (double)len);
            st = srv_cmd_send_result(conn, c, o);
        }
    }
    mdl_st_close(&f);
    free(c);
    pthread_mutex_unlock(&s->bucket_mu);
    return st;
}

static int route_bucket(srv_state *s, struct mg_connection *conn)
{
    /* session activity (--weight-session-timeout): an upload in progress, and every upload that
     * started or ended (a refused one sends no command) */
    atomic_fetch_add(&s->w_uploads, 1);
    atomic_fetch_add(&s->w_upload_events, 1);
    int st = route_bucket_locked(s, conn);
    atomic_fetch_add(&s->w_upload_events, 1);
    atomic_fetch_sub(&s->w_uploads, 1);
    return st;
}

int srv_cmd_simple(srv_state *s, struct mg_connection *conn, srv_cmd_kind k, const char *version, cJSON *ok)
{
    srv_cmd *c = srv_cmd_new(k);
    if (!c) {
        cJSON_Delete(ok);
        return srv_send_error(conn, 500, NULL, "out of memory");
    }
    if (version) snprintf(c->version, sizeof c->version, "%s", version);
    srv_cmd_submit(s, c);
    int st = srv_cmd_send_result(conn, c, ok);
    free(c);
    return st;
}

int srv_wroute_finish(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const char *version = NULL;
    if (srv_opt_version(b, "version", &version, &e) != 0 ||
        (!version && srv_opt_version(b, "weight_version", &version, &e) != 0)) {
        cJSON_Delete(b);
        return srv_send_err(conn, &e);
    }
    char v[128] = "";
    if (version) snprintf(v, sizeof v, "%s", version);
    cJSON_Delete(b);
    srv_cmd *c = srv_cmd_new(SRV_CMD_FINISH);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    snprintf(c->version, sizeof c->version, "%s", v);
    srv_cmd_submit(s, c);
    int st = srv_cmd_send_result(conn, c, c->status == 200 ? srv_weights_info_json(s) : NULL);
    free(c);
    return st;
}

static int route_abort(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    srv_cmd *c = srv_cmd_new(SRV_CMD_ABORT);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    srv_cmd_submit(s, c);
    int st = srv_cmd_send_result(conn, c, c->status == 200 ? srv_weights_info_json(s) : NULL);
    free(c);
    return st;
}

static int route_info(srv_state *s, struct mg_connection *conn)
{
    cJSON *o = srv_weights_info_json(s);
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}

/* 1 when the resolved (realpath) path p lies under the resolved root. */
static int under_root(const srv_state *s, const char *p)
{
    size_t n = strlen(s->weights_root);
    if (strcmp(s->weights_root, "/") == 0) return 1;
    return strncmp(p, s->weights_root, n) == 0 && (p[n] == '/' || p[n] == 0);
}

/* A folder confined to --weights-root: a relative path is taken relative to the root (not the
 * server's working directory), then resolved (symlinks too) and checked to lie under the root.
 * Errors name the path as resolved, so a caller sees what the server looked at. */
static int confine(srv_state *s, const char *in, char *out, srv_err *e, const char *param)
{
    if (!s->weights_root)
        return srv_errf(e, 403, param, "disk loads are disabled: start the server with --weights-root DIR"), -1;
    char joined[PATH_MAX];
    int n = in[0] == '/' ? snprintf(joined, sizeof joined, "%s", in)
                         : snprintf(joined, sizeof joined, "%s/%s", s->weights_root, in);
    if (n < 0 || (size_t)n >= sizeof joined) return srv_errf(e, 400, param, "%s is too long", param), -1;
    if (!realpath(joined, out)) return srv_errf(e, 400, param, "%s %s: %s", param, joined, strerror(errno)), -1;
    if (!under_root(s, out))
        return srv_errf(e, 403, param, "%s %s (resolved to %s) is outside --weights-root %s", param, joined, out,
                        s->weights_root), -1;
    return 0;
}

/* One file a disk load will open (dir/name, dir already confined): it must resolve under the root
 * too (a symlinked file inside the root must not reach out of it; the loader opens files through
 * their names, so the folder's realpath alone does not confine them) and be a regular file that
 * starts like a safetensors file (want_st): 8-byte little-endian header length N with
 * 8 + N <= size, N <= MDL_ST_MAX_HEADER, and the header starting with '{'. Anything else is "not a
 * safetensors file": its bytes are never echoed. */
static int confine_file(srv_state *s, const char *dir, const char *name, int want_st, srv_err *e, const char *param)
{
    char path[PATH_MAX + 300], real[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!realpath(path, real)) return srv_errf(e, 400, param, "%s: %s", path, strerror(errno)), -1;
    if (!under_root(s, real))
        return srv_errf(e, 403, param, "%s (resolved to %s) is outside --weights-root %s", path, real,
                        s->weights_root), -1;
    if (!want_st) return 0;
    int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return srv_errf(e, 400, param, "%s: %s", path, strerror(errno)), -1;
    struct stat st;
    unsigned char h[9];
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 9 && pread(fd, h, 9, 0) == 9;
    close(fd);
    if (ok) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | h[i];
        ok = hl >= 2 && hl <= MDL_ST_MAX_HEADER && hl <= (uint64_t)st.st_size - 8 && h[8] == '{';
    }
    if (!ok) return srv_errf(e, 400, param, "%s is not a safetensors file", path), -1;
    return 0;
}

/* Every file a disk load of dir opens (mdl_ckpt_foreach_bucket: model.safetensors.index.json and
 * its shards, else model.safetensors) through confine_file. Run by the handler (a clear error
 * before anything pauses) and again on the engine thread right before the load, which leaves only
 * the time of one begin for a file to be swapped for a symlink. */
static int confine_ckpt(srv_state *s, const char *dir, srv_err *e, const char *param)
{
    char ip[PATH_MAX + 64];
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);
    struct stat st;
    if (stat(ip, &st) != 0) return confine_file(s, dir, "model.safetensors", 1, e, param);
    if (confine_file(s, dir, "model.safetensors.index.json", 0, e, param) != 0) return -1;
    char err[512];
    size_t len;
    char *txt = mdl_read_file(ip, 64u << 20, &len, err, sizeof err);
    if (!txt) return srv_errf(e, 400, param, "%s", err), -1;
    /* guarded: this runs on a civetweb worker (~100 KiB of stack), where cJSON's recursion over a
     * deeply nested index crashed the server */
    char why[160];
    mdl_json_result jr;
    cJSON *index = mdl_json_parse(txt, len, MDL_JSON_MAX_DEPTH, 0, &jr, why, sizeof why);
    free(txt);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map"), *x;
    int rc = 0;
    if (!index && jr.status == MDL_JSON_E_DEEP) rc = (srv_errf(e, 400, param, "%s: %s", ip, why), -1);
    else if (!cJSON_IsObject(wm)) rc = (srv_errf(e, 400, param, "%s: not a JSON object with a weight_map", ip), -1);
    cJSON_ArrayForEach(x, wm)
    {
        if (rc != 0) break;
        /* (names the loader refuses, e.g. with a '/', are refused there with their own message) */
        if (!cJSON_IsString(x) || !x->valuestring[0] || strchr(x->valuestring, '/')) continue;
        rc = confine_file(s, dir, x->valuestring, 1, e, param);
    }
    cJSON_Delete(index);
    return rc;
}

int srv_weights_load(srv_state *s, struct mg_connection *conn, const cJSON *b, const char *path_key,
                     srv_load_style style)
{
    srv_err e;
    srv_cmd *c = srv_cmd_new(SRV_CMD_LOAD);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(b, path_key);
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(b, "draft_path");
    int st;
    if (srv_parse_begin(b, c, ENG_WMODEL_TARGET, &e) != 0) goto err;
    if (style == SRV_LOAD_SGLANG) { /* SGLang: abort_all_requests picks the pause mode; flush_cache is implied (I6) */
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(b, "abort_all_requests");
        c->pause = cJSON_IsTrue(ab) ? ENG_PAUSE_ABORT : ENG_PAUSE_WAIT;
    }
    /* prime-rl pauses with mode=keep before it updates: the requests it froze stay frozen through the
     * load and go on with the new weights (a "wait" load would first run them to the end) */
    if (style == SRV_LOAD_PRIMERL && !cJSON_GetObjectItemCaseSensitive(b, "pause")) c->pause = ENG_PAUSE_KEEP;
    /* AReaL's server pauses without waiting for running requests (they end with finish_reason
     * "abort"; its client resubmits them) and its /v1/completions stay gated until
     * /areal_continue_generation (no update ends a pause, see PAUSE / RESUME above) */
    if (style == SRV_LOAD_AREAL && !cJSON_GetObjectItemCaseSensitive(b, "pause")) c->pause = ENG_PAUSE_ABORT;
    if (!cJSON_IsString(p)) {
        srv_errf(&e, 400, path_key, "%s must be a checkpoint folder path", path_key);
        goto err;
    }
    if (confine(s, p->valuestring, c->path, &e, path_key) != 0 || confine_ckpt(s, c->path, &e, path_key) != 0)
        goto err;
    if (c->which == ENG_WMODEL_ALL) {
        if (!cJSON_IsString(dp)) {
            srv_errf(&e, 400, "draft_path", "model \"all\" needs draft_path (the drafter's folder)");
            goto err;
        }
        if (confine(s, dp->valuestring, c->draft_path, &e, "draft_path") != 0 ||
            confine_ckpt(s, c->draft_path, &e, "draft_path") != 0)
            goto err;
    }
    srv_cmd_submit(s, c);
    if (style == SRV_LOAD_AREAL) { /* AReaL's build_response: one "TP rank: N ..." line per worker */
        cJSON *o = cJSON_CreateObject();
        char msg[sizeof c->err + 64];
        snprintf(msg, sizeof msg, c->status == 200 ? "TP rank: 0 success\n" : "TP rank: 0 failed. reason: %s\n", c->err);
        cJSON_AddBoolToObject(o, "success", c->status == 200);
        cJSON_AddStringToObject(o, "message", msg);
        st = srv_send_json(conn, c->status, o);
        cJSON_Delete(o);
    } else if (style == SRV_LOAD_SGLANG) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "success", c->status == 200);
        cJSON_AddStringToObject(o, "message", c->status == 200 ? "Succeeded to update model weights." : c->err);
        cJSON_AddNumberToObject(o, "num_paused_requests", c->paused_requests + c->aborted_requests);
        st = srv_send_json(conn, c->status == 200 ? 200 : c->status, o);
        cJSON_Delete(o);
    } else if (style == SRV_LOAD_PRIMERL) {
        cJSON *o = NULL;
        if (c->status == 200) {
            o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "status", "ok");
        }
        st = srv_cmd_send_result(conn, c, o);
    } else {
        st = srv_cmd_send_result(conn, c, c->status == 200 ? srv_weights_info_json(s) : NULL);
    }
    free(c);
    return st;
err:
    free(c);
    return srv_send_err(conn, &e);
}

static int route_load(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    int st = srv_weights_load(s, conn, b, "path", SRV_LOAD_NATIVE);
    cJSON_Delete(b);
    return st;
}
int srv_weights_checksums(srv_state *s, struct mg_connection *conn, int draft, int ckpt_names, cJSON **tensors,
                     srv_cmd **out)
{
    srv_cmd *c = srv_cmd_new(SRV_CMD_CHECKSUMS);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    c->draft = draft;
    c->ckpt_names = ckpt_names;
    srv_cmd_submit(s, c);
    *tensors = c->result;
    *out = c;
    return c->status;
}

/* "names": "internal" (default: one entry per runtime parameter, fused buffers whole, over their
 * stored bytes) or "checkpoint" (one per checkpoint tensor name, hashed in the checkpoint dtype; see
 * eng_weights_checksums_ckpt and README). -1 for anything else. */
int srv_weights_parse_names(const char *v)
{
    if (!v || strcmp(v, "internal") == 0) return 0;
    if (strcmp(v, "checkpoint") == 0) return 1;
    return -1;
}

/* The fields that say how the hashes of a checksums answer are defined. */
void srv_weights_hash_fields(cJSON *o, const srv_cmd *c)
{
    cJSON_AddStringToObject(o, "names", c->ckpt_names ? "checkpoint" : "internal");
    if (c->ckpt_names) cJSON_AddStringToObject(o, "dtype", mdl_dtype_name(c->hash_dt));
}

static int route_checksums(srv_state *s, struct mg_connection *conn)
{
    char model[16] = "target", names[16] = "internal";
    srv_query_var(conn, "model", model, sizeof model);
    srv_query_var(conn, "names", names, sizeof names);
    if (strcmp(model, "target") != 0 && strcmp(model, "draft") != 0)
        return srv_send_error(conn, 400, "model", "model must be \"target\" or \"draft\"");
    const int ck = srv_weights_parse_names(names);
    if (ck < 0) return srv_send_error(conn, 400, "names", "names must be \"internal\" or \"checkpoint\"");
    cJSON *t = NULL;
    srv_cmd *c = NULL;
    srv_weights_checksums(s, conn, strcmp(model, "draft") == 0, ck, &t, &c);
    if (!c) return 500;
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        pthread_mutex_lock(&s->wmu);
        cJSON_AddStringToObject(o, "version", s->wpub.version);
        pthread_mutex_unlock(&s->wmu);
        srv_weights_hash_fields(o, c);
        cJSON_AddItemToObject(o, "tensors", t);
    }
    int st = srv_cmd_send_result(conn, c, o);
    free(c);
    return st;
}

/* ---- routes more than one dialect serves (registered by weights_vllm.c and weights_sglang.c) -- */

int srv_wroute_reset_prefix(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", 1);
    return srv_cmd_simple(s, conn, SRV_CMD_RESET_PREFIX, NULL, o);
}

/* vLLM /pause?mode=abort|wait|keep, SGLang /pause_generation {"mode": abort|retract|in_place} */
int srv_weights_pause(srv_state *s, struct mg_connection *conn, const char *mode)
{
    srv_cmd *c = srv_cmd_new(SRV_CMD_PAUSE);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    if (strcmp(mode, "retract") == 0 || strcmp(mode, "in_place") == 0) mode = "keep";
    if (eng_pause_parse(mode, &c->pause) != 0 || c->pause == ENG_PAUSE_RECOMPUTE) {
        free(c);
        return srv_send_error(conn, 400, "mode", "mode must be abort, wait or keep");
    }
    srv_cmd_submit(s, c);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "paused");
    cJSON_AddNumberToObject(o, "num_aborted_requests", c->aborted_requests);
    int st = srv_cmd_send_result(conn, c, o);
    free(c);
    return st;
}

int srv_wroute_pause(srv_state *s, struct mg_connection *conn)
{
    char mode[32] = "abort";
    srv_query_var(conn, "mode", mode, sizeof mode);
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(b, "mode");
    if (cJSON_IsString(m)) snprintf(mode, sizeof mode, "%s", m->valuestring);
    cJSON_Delete(b);
    return srv_weights_pause(s, conn, mode);
}

int srv_wroute_resume(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "resumed");
    return srv_cmd_simple(s, conn, SRV_CMD_RESUME, NULL, o);
}
int srv_wroute_weight_version(srv_state *s, struct mg_connection *conn)
{
    cJSON *o = cJSON_CreateObject();
    pthread_mutex_lock(&s->wmu);
    cJSON_AddStringToObject(o, "weight_version", s->wpub.version);
    pthread_mutex_unlock(&s->wmu);
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}
void srv_weights_init(srv_state *s)
{
    pthread_mutex_init(&s->wmu, NULL);
    pthread_mutex_init(&s->bucket_mu, NULL);
    pthread_mutex_init(&s->store_mu, NULL);
}

void srv_weights_destroy(srv_state *s)
{
    free(s->staging);
    free(s->weights_root);
    cJSON_Delete(s->wsnap);
    pthread_mutex_destroy(&s->store_mu);
    pthread_mutex_destroy(&s->wmu);
    pthread_mutex_destroy(&s->bucket_mu);
}

void srv_weights_routes(srv_state *s)
{
    /* native */
    srv_route_add(&s->http, "POST", "/v1/weights/begin", srv_wroute_begin, 2);
    srv_route_add(&s->http, "POST", "/v1/weights/bucket", route_bucket, 2);
    srv_route_add(&s->http, "POST", "/v1/weights/finish", srv_wroute_finish, 2);
    srv_route_add(&s->http, "POST", "/v1/weights/abort", route_abort, 2);
    srv_route_add(&s->http, "POST", "/v1/weights/load", route_load, 2);
    srv_route_add(&s->http, "GET", "/v1/weights", route_info, 2);
    srv_route_add(&s->http, "GET", "/v1/weights/checksums", route_checksums, 2);
}
