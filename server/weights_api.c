/* server/weights_api.c — the weight-update API over HTTP (native, vLLM and SGLang routes), disk
 * loads, checksums, pause / resume.
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
 * not step (I7); requests queue.
 *
 * Bucket bodies (application/octet-stream safetensors) stream into one staging buffer reused by
 * every bucket of every session (bucket_mu: one upload at a time), bounded by --max-bucket-bytes.
 * It keeps the size of the largest bucket seen: resident memory is flat across updates, and
 * no update pays for page-faulting a fresh buffer (measured: 512 MiB buckets 2.8 GB/s with a
 * buffer per session, 6.7 GB/s reused).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/weights.h"
#include "server/srv.h"

typedef enum {
    CMD_BEGIN,
    CMD_BUCKET,
    CMD_FINISH,
    CMD_ABORT,
    CMD_LOAD,
    CMD_CHECKSUMS,
    CMD_RESET_PREFIX,
    CMD_PAUSE,
    CMD_RESUME,
    CMD_SET_VERSION,
} cmd_kind;

struct srv_cmd {
    cmd_kind kind;
    /* arguments */
    int full;
    eng_wmodel which;
    eng_pause pause;
    char version[128];
    char path[PATH_MAX], draft_path[PATH_MAX];
    const mdl_st_tensor *tensors;
    size_t n_tensors;
    char what[64];
    int draft; /* checksums of the drafter */
    /* drain state (wait mode) */
    int draining;
    double deadline;
    /* results */
    int done, status;
    char err[1024];
    uint64_t session;
    int aborted_requests, paused_requests;
    cJSON *result;
    pthread_cond_t cv;
    srv_cmd *next;
};

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

int srv_engine_frozen(srv_state *s)
{
    eng_weights_info w;
    eng_weights_get_info(s->rt.e, &w);
    return s->paused || w.state == ENG_W_UPDATING;
}

static void add_sum(const char *name, const char *hex, void *u) { cJSON_AddStringToObject(u, name, hex); }

static void abort_running(srv_state *s, srv_cmd *c)
{
    int n = eng_num_running(s->rt.e);
    eng_engine *e = s->rt.e;
    /* eng_abort_all would also end queued requests; a pause ends only what runs */
    c->aborted_requests += n;
    eng_abort_running(e);
}

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
    if ((c->kind == CMD_BEGIN || c->kind == CMD_LOAD || c->kind == CMD_PAUSE) && c->pause == ENG_PAUSE_WAIT &&
        !wi.session_open && wi.state != ENG_W_UNDEFINED) {
        /* drain: no admission, running requests finish (bounded); the rest is aborted */
        if (!c->draining) {
            c->draining = 1;
            c->deadline = srv_now() + s->drain_timeout;
            eng_set_admission(e, 0);
        }
        if (eng_num_running(e) > 0 && srv_now() < c->deadline) return 0;
        if (eng_num_running(e) > 0) abort_running(s, c);
        eng_set_admission(e, 1);
    }
    if ((c->kind == CMD_BEGIN || c->kind == CMD_LOAD) && !wi.session_open && wi.state != ENG_W_UNDEFINED) {
        if (c->pause == ENG_PAUSE_ABORT) c->aborted_requests += eng_num_running(e); /* begin ends them */
        else c->paused_requests = eng_num_running(e); /* frozen during the session ("wait": none left) */
    }
    switch (c->kind) {
    case CMD_BEGIN:
        if (eng_weights_begin(e, c->full, c->which, c->pause, c->version, &c->session, err, el, &st) == 0) {
            st = 200;
            s->paused = 0;
        }
        break;
    case CMD_BUCKET:
        if (eng_weights_bucket(e, c->tensors, c->n_tensors, c->what, err, el, &st) == 0) st = 200;
        break;
    case CMD_FINISH:
        if (eng_weights_finish(e, c->version, err, el, &st) == 0) st = 200;
        break;
    case CMD_ABORT:
        if (eng_weights_abort(e, err, el, &st) == 0) st = 200;
        break;
    case CMD_LOAD: {
        /* a whole session: begin -> the folder(s) in buckets -> finish; any failure aborts it */
        if (eng_weights_begin(e, c->full, c->which, c->pause, c->version, &c->session, err, el, &st) != 0) break;
        int rc = 0;
        const char *tdir = c->which == ENG_WMODEL_DRAFT ? NULL : c->path;
        const char *ddir = c->which == ENG_WMODEL_TARGET ? NULL : (c->which == ENG_WMODEL_DRAFT ? c->path : c->draft_path);
        if (tdir) rc = eng_weights_load_dir(e, tdir, NULL, s->update_bucket, err, el, &st);
        if (rc == 0 && ddir)
            rc = eng_weights_load_dir(e, ddir, c->which == ENG_WMODEL_ALL ? "draft." : NULL, s->update_bucket, err,
                                      el, &st);
        if (rc != 0) {
            int st2;
            char e2[64];
            eng_weights_abort(e, e2, sizeof e2, &st2);
            break;
        }
        if (eng_weights_finish(e, c->version, err, el, &st) == 0) st = 200;
        s->paused = 0;
        break;
    }
    case CMD_CHECKSUMS: {
        cJSON *t = cJSON_CreateObject();
        if (eng_weights_checksums(e, c->draft, add_sum, t) != 0) {
            cJSON_Delete(t);
            snprintf(err, el, "this server has no drafter");
            st = 400;
        } else {
            c->result = t;
        }
        break;
    }
    case CMD_RESET_PREFIX:
        eng_reset_prefix_cache(e);
        break;
    case CMD_PAUSE:
        if (c->pause == ENG_PAUSE_ABORT) abort_running(s, c);
        s->paused = 1;
        break;
    case CMD_RESUME:
        s->paused = 0;
        break;
    case CMD_SET_VERSION:
        eng_weights_set_version(e, c->version);
        break;
    }
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
        srv_weights_publish(s);
        pthread_mutex_lock(&s->mu);
        s->cmd_head = c->next;
        if (!s->cmd_head) s->cmd_tail = NULL;
        c->done = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

/* ---- handler side ------------------------------------------------------------------------------------ */

/* Queues c for the engine thread and waits for it. Returns c->status. */
static int submit_cmd(srv_state *s, srv_cmd *c)
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

static cJSON *info_json(srv_state *s)
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

static int send_cmd_result(struct mg_connection *conn, srv_cmd *c, cJSON *ok_body)
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
static cJSON *read_json_opt(srv_state *s, struct mg_connection *c, srv_err *e)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (ri->content_length == 0) return cJSON_CreateObject();
    size_t len;
    char *txt = srv_read_body(s, c, &len, e);
    if (!txt) return NULL;
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", txt[i])) i++;
    cJSON *o = NULL;
    if (i == len) {
        o = cJSON_CreateObject();
    } else {
        o = cJSON_ParseWithLength(txt, len);
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            o = NULL;
            srv_errf(e, 400, NULL, "request body must be a JSON object");
        }
    }
    free(txt);
    return o;
}

static int opt_string(const cJSON *b, const char *key, const char **out, srv_err *e)
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

/* mode / model / pause / version of a begin-like body into c. */
static int parse_begin(const cJSON *b, srv_cmd *c, eng_wmodel dflt_model, srv_err *e)
{
    const char *mode = "full", *model = NULL, *pause = "wait", *version = NULL;
    if (opt_string(b, "mode", &mode, e) || opt_string(b, "model", &model, e) || opt_string(b, "pause", &pause, e) ||
        opt_string(b, "version", &version, e))
        return -1;
    if (!version && opt_string(b, "weight_version", &version, e)) return -1;
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

static srv_cmd *new_cmd(cmd_kind k)
{
    srv_cmd *c = calloc(1, sizeof *c);
    if (c) c->kind = k;
    return c;
}

#define NEW_CMD(c, k)                                                                                  \
    srv_cmd *c = new_cmd(k);                                                                           \
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory")

static int route_begin_model(srv_state *s, struct mg_connection *conn, eng_wmodel dflt)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    NEW_CMD(c, CMD_BEGIN);
    int rc = parse_begin(b, c, dflt, &e);
    cJSON_Delete(b);
    if (rc != 0) {
        free(c);
        return srv_send_err(conn, &e);
    }
    submit_cmd(s, c);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "session", (double)c->session);
    cJSON_AddStringToObject(o, "state", "updating");
    cJSON_AddNumberToObject(o, "aborted_requests", c->aborted_requests);
    int st = send_cmd_result(conn, c, o);
    free(c);
    return st;
}

static int route_begin(srv_state *s, struct mg_connection *conn) { return route_begin_model(s, conn, ENG_WMODEL_TARGET); }
static int route_begin_draft(srv_state *s, struct mg_connection *conn) { return route_begin_model(s, conn, ENG_WMODEL_DRAFT); }

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

static int route_bucket(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    pthread_mutex_lock(&s->bucket_mu);
    size_t len = 0;
    if (read_bucket(s, conn, &len, &e) != 0) {
        pthread_mutex_unlock(&s->bucket_mu);
        return srv_send_err(conn, &e);
    }
    srv_cmd *c = new_cmd(CMD_BUCKET);
    mdl_st_file f;
    memset(&f, 0, sizeof f);
    int st;
    if (!c) {
        st = srv_send_error(conn, 500, NULL, "out of memory");
    } else {
        snprintf(c->what, sizeof c->what, "bucket %llu", (unsigned long long)++s->n_buckets_rx);
        /* the untrusted header is validated whole here, before the engine sees a byte */
        if (mdl_st_parse(s->staging, len, c->what, &f, c->err, sizeof c->err) != 0) {
            srv_errf(&e, 400, NULL, "%s", c->err);
            st = srv_send_err(conn, &e);
        } else {
            c->tensors = f.tensors;
            c->n_tensors = f.n;
            submit_cmd(s, c);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "tensors", (double)f.n);
            cJSON_AddNumberToObject(o, "bytes", (double)len);
            st = send_cmd_result(conn, c, o);
        }
    }
    mdl_st_close(&f);
    free(c);
    pthread_mutex_unlock(&s->bucket_mu);
    return st;
}

static int simple_cmd(srv_state *s, struct mg_connection *conn, cmd_kind k, const char *version, cJSON *ok)
{
    srv_cmd *c = new_cmd(k);
    if (!c) {
        cJSON_Delete(ok);
        return srv_send_error(conn, 500, NULL, "out of memory");
    }
    if (version) snprintf(c->version, sizeof c->version, "%s", version);
    submit_cmd(s, c);
    int st = send_cmd_result(conn, c, ok);
    free(c);
    return st;
}

static int route_finish(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const char *version = NULL;
    if (opt_string(b, "version", &version, &e) != 0 || (!version && opt_string(b, "weight_version", &version, &e) != 0)) {
        cJSON_Delete(b);
        return srv_send_err(conn, &e);
    }
    char v[128] = "";
    if (version) snprintf(v, sizeof v, "%s", version);
    cJSON_Delete(b);
    srv_cmd *c = new_cmd(CMD_FINISH);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    snprintf(c->version, sizeof c->version, "%s", v);
    submit_cmd(s, c);
    int st = send_cmd_result(conn, c, c->status == 200 ? info_json(s) : NULL);
    free(c);
    return st;
}

static int route_abort(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    srv_cmd *c = new_cmd(CMD_ABORT);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    submit_cmd(s, c);
    int st = send_cmd_result(conn, c, c->status == 200 ? info_json(s) : NULL);
    free(c);
    return st;
}

static int route_info(srv_state *s, struct mg_connection *conn)
{
    cJSON *o = info_json(s);
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}

/* A path confined to --weights-root: resolved (symlinks too) and under the root. */
static int confine(srv_state *s, const char *in, char *out, srv_err *e, const char *param)
{
    if (!s->weights_root)
        return srv_errf(e, 403, param, "disk loads are disabled: start the server with --weights-root DIR"), -1;
    if (!realpath(in, out)) return srv_errf(e, 400, param, "%s: %s", param, strerror(errno)), -1;
    size_t n = strlen(s->weights_root);
    if (strncmp(out, s->weights_root, n) != 0 || (out[n] != '/' && out[n] != 0 && strcmp(s->weights_root, "/") != 0))
        return srv_errf(e, 403, param, "%s is outside --weights-root", param), -1;
    return 0;
}

static int do_load(srv_state *s, struct mg_connection *conn, const cJSON *b, const char *path_key, int sglang)
{
    srv_err e;
    srv_cmd *c = new_cmd(CMD_LOAD);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(b, path_key);
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(b, "draft_path");
    int st;
    if (parse_begin(b, c, ENG_WMODEL_TARGET, &e) != 0) goto err;
    if (sglang) { /* SGLang: abort_all_requests picks the pause mode; flush_cache is implied (I6) */
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(b, "abort_all_requests");
        c->pause = cJSON_IsTrue(ab) ? ENG_PAUSE_ABORT : ENG_PAUSE_WAIT;
    }
    if (!cJSON_IsString(p)) {
        srv_errf(&e, 400, path_key, "%s must be a checkpoint folder path", path_key);
        goto err;
    }
    if (confine(s, p->valuestring, c->path, &e, path_key) != 0) goto err;
    if (c->which == ENG_WMODEL_ALL) {
        if (!cJSON_IsString(dp)) {
            srv_errf(&e, 400, "draft_path", "model \"all\" needs draft_path (the drafter's folder)");
            goto err;
        }
        if (confine(s, dp->valuestring, c->draft_path, &e, "draft_path") != 0) goto err;
    }
    submit_cmd(s, c);
    if (sglang) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "success", c->status == 200);
        cJSON_AddStringToObject(o, "message", c->status == 200 ? "Succeeded to update model weights." : c->err);
        cJSON_AddNumberToObject(o, "num_paused_requests", c->paused_requests + c->aborted_requests);
        st = srv_send_json(conn, c->status == 200 ? 200 : c->status, o);
        cJSON_Delete(o);
    } else {
        st = send_cmd_result(conn, c, c->status == 200 ? info_json(s) : NULL);
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
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    int st = do_load(s, conn, b, "path", 0);
    cJSON_Delete(b);
    return st;
}

static int route_sglang_load(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    int st = do_load(s, conn, b, "model_path", 1);
    cJSON_Delete(b);
    return st;
}

static int checksums(srv_state *s, struct mg_connection *conn, int draft, cJSON **tensors, srv_cmd **out)
{
    srv_cmd *c = new_cmd(CMD_CHECKSUMS);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    c->draft = draft;
    submit_cmd(s, c);
    *tensors = c->result;
    *out = c;
    return c->status;
}

static int route_checksums(srv_state *s, struct mg_connection *conn)
{
    char model[16] = "target";
    const struct mg_request_info *ri = mg_get_request_info(conn);
    if (ri->query_string) mg_get_var(ri->query_string, strlen(ri->query_string), "model", model, sizeof model);
    if (strcmp(model, "target") != 0 && strcmp(model, "draft") != 0)
        return srv_send_error(conn, 400, "model", "model must be \"target\" or \"draft\"");
    cJSON *t = NULL;
    srv_cmd *c = NULL;
    checksums(s, conn, strcmp(model, "draft") == 0, &t, &c);
    if (!c) return 500;
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        pthread_mutex_lock(&s->wmu);
        cJSON_AddStringToObject(o, "version", s->wpub.version);
        pthread_mutex_unlock(&s->wmu);
        cJSON_AddItemToObject(o, "tensors", t);
    }
    int st = send_cmd_result(conn, c, o);
    free(c);
    return st;
}

/* vLLM /weight_checker and SGLang /weights_checker: {"action":"checksum"} or
 * {"action":"compare","checksums":{name:hex}} (model optional). */
static int route_checker(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const char *action = "checksum", *model = "target";
    if (opt_string(b, "action", &action, &e) || opt_string(b, "model", &model, &e)) {
        cJSON_Delete(b);
        return srv_send_err(conn, &e);
    }
    if (strcmp(action, "checksum") != 0 && strcmp(action, "compare") != 0) {
        cJSON_Delete(b);
        return srv_send_error(conn, 400, "action", "action must be \"checksum\" or \"compare\"");
    }
    cJSON *t = NULL;
    srv_cmd *c = NULL;
    checksums(s, conn, strcmp(model, "draft") == 0, &t, &c);
    if (!c) {
        cJSON_Delete(b);
        return 500;
    }
    cJSON *o = NULL;
    if (c->status == 200) {
        o = cJSON_CreateObject();
        if (strcmp(action, "checksum") == 0) {
            cJSON_AddItemToObject(o, "checksums", t);
        } else {
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(b, "checksums");
            cJSON *mism = cJSON_AddArrayToObject(o, "mismatches");
            const cJSON *x;
            int n = 0;
            cJSON_ArrayForEach(x, want)
            {
                const cJSON *have = cJSON_GetObjectItemCaseSensitive(t, x->string);
                n++;
                if (!cJSON_IsString(x) || !cJSON_IsString(have) || strcmp(x->valuestring, have->valuestring) != 0)
                    cJSON_AddItemToArray(mism, cJSON_CreateString(x->string));
            }
            cJSON_AddBoolToObject(o, "match", cJSON_GetArraySize(mism) == 0 && n == cJSON_GetArraySize(t));
            cJSON_AddNumberToObject(o, "compared", n);
            cJSON_Delete(t);
        }
    }
    cJSON_Delete(b);
    int st = send_cmd_result(conn, c, o);
    free(c);
    return st;
}

static int route_reset_prefix(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", 1);
    return simple_cmd(s, conn, CMD_RESET_PREFIX, NULL, o);
}

/* vLLM /pause?mode=abort|wait|keep, SGLang /pause_generation {"mode": abort|retract|in_place} */
static int do_pause(srv_state *s, struct mg_connection *conn, const char *mode)
{
    srv_cmd *c = new_cmd(CMD_PAUSE);
    if (!c) return srv_send_error(conn, 500, NULL, "out of memory");
    if (strcmp(mode, "retract") == 0 || strcmp(mode, "in_place") == 0) mode = "keep";
    if (eng_pause_parse(mode, &c->pause) != 0 || c->pause == ENG_PAUSE_RECOMPUTE) {
        free(c);
        return srv_send_error(conn, 400, "mode", "mode must be abort, wait or keep");
    }
    submit_cmd(s, c);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "paused");
    cJSON_AddNumberToObject(o, "num_aborted_requests", c->aborted_requests);
    int st = send_cmd_result(conn, c, o);
    free(c);
    return st;
}

static int route_pause(srv_state *s, struct mg_connection *conn)
{
    char mode[32] = "abort";
    const struct mg_request_info *ri = mg_get_request_info(conn);
    if (ri->query_string) mg_get_var(ri->query_string, strlen(ri->query_string), "mode", mode, sizeof mode);
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(b, "mode");
    if (cJSON_IsString(m)) snprintf(mode, sizeof mode, "%s", m->valuestring);
    cJSON_Delete(b);
    return do_pause(s, conn, mode);
}

static int route_resume(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    cJSON_Delete(b);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "resumed");
    return simple_cmd(s, conn, CMD_RESUME, NULL, o);
}

static int route_is_paused(srv_state *s, struct mg_connection *conn)
{
    pthread_mutex_lock(&s->wmu);
    int p = s->is_paused_pub;
    pthread_mutex_unlock(&s->wmu);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "is_paused", p);
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}

static int route_weight_version(srv_state *s, struct mg_connection *conn)
{
    cJSON *o = cJSON_CreateObject();
    pthread_mutex_lock(&s->wmu);
    cJSON_AddStringToObject(o, "weight_version", s->wpub.version);
    pthread_mutex_unlock(&s->wmu);
    int st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
    return st;
}

static int route_update_version(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const char *v = NULL;
    if (opt_string(b, "new_version", &v, &e) != 0) {
        cJSON_Delete(b);
        return srv_send_err(conn, &e);
    }
    if (!v) {
        cJSON_Delete(b);
        return srv_send_error(conn, 400, "new_version", "new_version is required");
    }
    char ver[128];
    snprintf(ver, sizeof ver, "%s", v);
    cJSON_Delete(b);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", 1);
    cJSON_AddStringToObject(o, "message", "weight version updated");
    return simple_cmd(s, conn, CMD_SET_VERSION, ver, o);
}

/* vLLM /update_weights and SGLang /update_weights_from_distributed receive bytes over NCCL (or a
 * CUDA IPC buffer): transports of the CUDA backend. */
static int route_gpu_transport(srv_state *s, struct mg_connection *conn)
{
    (void)s;
    return srv_send_error(conn, 501, NULL,
                          "this route receives weights over NCCL / CUDA IPC, which need the CUDA backend (not built "
                          "into this server); use POST /v1/weights/bucket (HTTP) or /v1/weights/load (disk)");
}

cJSON *srv_weight_version_json(srv_state *s, const uint64_t *versions, int n)
{
    pthread_mutex_lock(&s->wmu);
    cJSON *o;
    if (n <= 0) {
        o = cJSON_CreateString(s->wpub.version);
    } else if (n == 1) {
        o = cJSON_CreateString(s->vname[versions[0] % 64]);
    } else {
        o = cJSON_CreateArray();
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(o, cJSON_CreateString(s->vname[versions[i] % 64]));
    }
    pthread_mutex_unlock(&s->wmu);
    return o;
}

void srv_weights_init(srv_state *s)
{
    pthread_mutex_init(&s->wmu, NULL);
    pthread_mutex_init(&s->bucket_mu, NULL);
}

void srv_weights_destroy(srv_state *s)
{
    free(s->staging);
    free(s->weights_root);
    pthread_mutex_destroy(&s->wmu);
    pthread_mutex_destroy(&s->bucket_mu);
}

void srv_weights_routes(srv_state *s)
{
    /* native */
    srv_route_add(s, "POST", "/v1/weights/begin", route_begin, 2);
    srv_route_add(s, "POST", "/v1/weights/bucket", route_bucket, 2);
    srv_route_add(s, "POST", "/v1/weights/finish", route_finish, 2);
    srv_route_add(s, "POST", "/v1/weights/abort", route_abort, 2);
    srv_route_add(s, "POST", "/v1/weights/load", route_load, 2);
    srv_route_add(s, "GET", "/v1/weights", route_info, 2);
    srv_route_add(s, "GET", "/v1/weights/checksums", route_checksums, 2);
    /* vLLM */
    srv_route_add(s, "POST", "/pause", route_pause, 2);
    srv_route_add(s, "POST", "/resume", route_resume, 2);
    srv_route_add(s, "GET", "/is_paused", route_is_paused, 2);
    srv_route_add(s, "POST", "/start_weight_update", route_begin, 2);
    srv_route_add(s, "POST", "/start_draft_weight_update", route_begin_draft, 2);
    srv_route_add(s, "POST", "/finish_weight_update", route_finish, 2);
    srv_route_add(s, "GET", "/weight_info", route_weight_version, 2);
    srv_route_add(s, "POST", "/weight_checker", route_checker, 2);
    srv_route_add(s, "POST", "/reset_prefix_cache", route_reset_prefix, 2);
    srv_route_add(s, "POST", "/update_weights", route_gpu_transport, 2);
    srv_route_add(s, "POST", "/init_weight_transfer_engine", route_gpu_transport, 2);
    /* SGLang */
    srv_route_add(s, "POST", "/update_weights_from_disk", route_sglang_load, 2);
    srv_route_add(s, "POST", "/pause_generation", route_pause, 2);
    srv_route_add(s, "POST", "/continue_generation", route_resume, 2);
    srv_route_add(s, "POST", "/flush_cache", route_reset_prefix, 2);
    srv_route_add(s, "GET", "/get_weight_version", route_weight_version, 2);
    srv_route_add(s, "POST", "/update_weight_version", route_update_version, 2);
    srv_route_add(s, "POST", "/weights_checker", route_checker, 2);
    srv_route_add(s, "POST", "/update_weights_from_distributed", route_gpu_transport, 2);
    srv_route_add(s, "POST", "/init_weights_update_group", route_gpu_transport, 2);
}
