/* server/weights/pull.c — replicas that join with the live weights: GET /v1/weights/export, POST
 * /v1/weights/pull and `serve --weights-from URL` (issue 24).
 *
 * Why: an RL trainer runs N replicas behind a router and pushes every update to each of them. A
 * replica started (or restarted by Kubernetes) after some updates holds the cold-start checkpoint
 * of --model: it must take the live weights from a replica that has them before it serves.
 *
 * The export (source side). GET /v1/weights/export?model=target|draft answers one safetensors file:
 * every checkpoint tensor of that model by its Hugging Face name, in the checkpoint dtype, i.e.
 * exactly the tensors and bytes the checkpoint-name checksums hash (engine/weights.h
 * eng_weights_ckpt_visit, which both share), __metadata__ {"format": "pt", "weight_version": V} and
 * the header X-Weight-Version (V percent-encoded past printable ASCII). Derived buffers are not
 * exported: the receiver's post-load hook recomputes them. The copy is one SRV_CMD_EXPORT command on
 * the engine thread (so it is one consistent snapshot between two sessions, and generation waits only
 * while the tensors are copied); the answer is written from the copy afterwards. Refused: 409 while a
 * weight session is open (half written weights), 503 while the weights are INCONSISTENT / UNDEFINED,
 * asleep, or while this replica's own --weights-from pull has not succeeded (its weights are stale).
 *
 * The pull (receiver side), one attempt:
 *
 *   PLAN     (once per pull; an engine closure, nothing read) this replica's checkpoint tensors of
 *            each model pulled: names, shapes, sizes. They bound what the source may send.
 *   FETCH    per model: GET /v1/weights/checksums?names=checkpoint&model=M (JSON, bounded), then GET
 *            /v1/weights/export?model=M (bounded by what this replica's model can need)
 *   VERIFY   the export parsed by the safetensors reader every bucket goes through (mdl_st_parse:
 *            header, dtypes, offsets, coverage); its names and shapes equal this replica's exactly
 *            (else 422: another model); its weight_version equals the checksums' version; every
 *            tensor's SHA-256 equals the source's checksum. Nothing has touched the engine yet.
 *   WRITE    one SRV_CMD_HOST_UPDATE: a full session of every pulled model (model "all": drafter
 *            names "draft."), pause "wait", version = the source's; the one bucket is validated
 *            whole before its first byte is written (engine/weights.h), so a refusal changes nothing.
 *
 *   An attempt ends      OK           the weights and version are the source's
 *                        UNREACHABLE  no connection / no HTTP answer / a truncated one
 *                        BUSY         the source answered 409 / 503 / 502 / 504 / 429 (a session
 *                                     open, asleep, itself still pulling, a proxy in between)
 *                        RACE         a hash or the version differs between checksums and export:
 *                                     the source finished an update in between
 *                        FATAL        anything else (not graphswap, another model, a bad key, a
 *                                     malformed safetensors, this replica refused the session)
 *   The driver (pull_run) retries BUSY and RACE (RACE at most PULL_MAX_RACES times in a row for the
 *   route), UNREACHABLE only at start-up (the source may be starting too), with a backoff of 0.25 s
 *   doubling to 2 s (cut at the deadline, where one last attempt runs), until timeout_s; FATAL or
 *   the deadline ends it with the last error. Every
 *   attempt frees what it fetched before the next one.
 *
 * Start-up (serve --weights-from URL): srv_pull_boot_start sets pull_pending before the listener
 * starts, then one thread runs the pull with UNREACHABLE retried up to --weights-from-timeout.
 *   PENDING  pull_pending = 1: generation answers 503 ("not ready: ..."), /health?ready=1 503 with
 *            the reason (plain /health stays 200: liveness), the export 503
 *   PULLED   pull_pending = 0: ready
 *   FAILED   the reason says why; srv_pull_boot_failed() = 1 and `graphswap serve` shuts down and
 *            exits 1, so a pod crash-loops and tries again
 * A shutdown during the pull cancels it (srv_pull_boot_cancel; checked between reads and attempts).
 *
 * The HTTP client is civetweb's (mg_connect_client, mg_get_response, mg_read): plain http:// only,
 * one GET per connection. Connecting waits at most 10 s (civetweb), a silent source at most 30 s per
 * read (civetweb's default), the whole pull timeout_s.
 *
 * Memory: the receiver holds one copy of the pulled models in the checkpoint dtype (the export
 * bodies) until the session finished; the source one copy while it answers.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/sha256.h"
#include "models/format/json_guard.h"
#include "server/weights/weights.h"
#include "server/weights/weights_api.h"

#define PULL_MAX_JSON ((size_t)64 << 20) /* a checksums answer (about 150 bytes per tensor) */
#define PULL_MAX_ERR_BODY ((size_t)64 << 10) /* an error answer of the source */
#define PULL_MAX_RACES 5                 /* route: the source updated during this many attempts in a row */
#define PULL_DEFAULT_TIMEOUT 300.0       /* seconds, route and --weights-from-timeout */
#define PULL_MAX_TIMEOUT 86400.0
#define PULL_MAX_KEY 1024

/* ---- the export (source side) --------------------------------------------------------------------- */

typedef struct {
    srv_cmd c;           /* first: the runner sees a srv_cmd (c.run = export_run) */
    int draft;
    /* results (engine thread) */
    uint8_t *buf;        /* the safetensors file */
    size_t len, hlen;
    uint64_t data_bytes, off;
    char version[128];
    mdl_st_out *outs;    /* the header's tensors */
    size_t n, cap;
} export_cmd;

static int export_meta(const eng_ckpt_tensor *t, void *u)
{
    export_cmd *x = u;
    if (x->n == x->cap) {
        const size_t cap = x->cap ? 2 * x->cap : 256;
        mdl_st_out *no = realloc(x->outs, cap * sizeof *no);
        if (!no) return 1;
        x->outs = no;
        x->cap = cap;
    }
    mdl_st_out *o = &x->outs[x->n++];
    memset(o, 0, sizeof *o);
    o->name = t->name; /* the model's table: lives as long as the server */
    o->dtype = t->dtype;
    o->ndim = t->ndim;
    o->shape[0] = t->shape[0];
    o->shape[1] = t->shape[1];
    return 0;
}

static int export_copy(const eng_ckpt_tensor *t, void *u)
{
    export_cmd *x = u;
    if (t->nbytes > x->data_bytes - x->off) return 1; /* (the header pass sized it: cannot happen) */
    memcpy(x->buf + x->hlen + x->off, t->data, t->nbytes);
    x->off += t->nbytes;
    return 0;
}

/* Engine thread (SRV_CMD_EXPORT): the state checks, then the header and the copy. */
static void export_run(srv_state *s, srv_cmd *c, int *st)
{
    export_cmd *x = (export_cmd *)c;
    eng_engine *e = s->rt.e;
    eng_weights_info wi;
    eng_weights_get_info(e, &wi);
    if (wi.session_open || wi.state == ENG_W_UPDATING) {
        *st = 409;
        snprintf(c->err, sizeof c->err, "a weight session is open (state updating): the weights are half written; "
                                        "export after its finish");
        return;
    }
    if (wi.state == ENG_W_INCONSISTENT || wi.state == ENG_W_UNDEFINED) {
        *st = 503;
        snprintf(c->err, sizeof c->err, "the weights are %s (%s): there is nothing consistent to export",
                 eng_wstate_name(wi.state), wi.reason);
        return;
    }
    if (eng_is_sleeping(e) & ENG_MEM_WEIGHTS) {
        *st = 503;
        snprintf(c->err, sizeof c->err, "the weights are asleep (released by /sleep or /release_memory_occupation)");
        return;
    }
    if (atomic_load(&s->pull_pending)) {
        *st = 503;
        snprintf(c->err, sizeof c->err, "this replica has not pulled its own weights yet (--weights-from): it "
                                        "holds the cold-start checkpoint");
        return;
    }
    int rc = eng_weights_ckpt_visit(e, x->draft, 0, export_meta, x);
    if (rc != 0) {
        *st = rc == -1 ? 400 : 500;
        snprintf(c->err, sizeof c->err, "%s", rc == -1 ? "this server has no drafter" : "out of memory");
        return;
    }
    const char *meta[] = {"format", "pt", "weight_version", wi.version, NULL};
    uint8_t *hdr = NULL;
    if (mdl_st_header(x->outs, x->n, meta, "the export", &hdr, &x->hlen, &x->data_bytes, c->err, sizeof c->err) != 0) {
        *st = 500;
        return;
    }
    if (x->data_bytes > SIZE_MAX - x->hlen || !(x->buf = malloc(x->hlen + (size_t)x->data_bytes))) {
        free(hdr);
        *st = 507;
        snprintf(c->err, sizeof c->err, "cannot allocate %llu bytes for the export",
                 (unsigned long long)(x->hlen + x->data_bytes));
        return;
    }
    memcpy(x->buf, hdr, x->hlen);
    free(hdr);
    x->off = 0;
    rc = eng_weights_ckpt_visit(e, x->draft, 1, export_copy, x);
    if (rc != 0 || x->off != x->data_bytes) {
        free(x->buf);
        x->buf = NULL;
        *st = 500;
        snprintf(c->err, sizeof c->err, "%s", rc == -3 ? "the weights are asleep" : "out of memory copying the weights");
        return;
    }
    x->len = x->hlen + (size_t)x->data_bytes;
    snprintf(x->version, sizeof x->version, "%s", wi.version);
    *st = 200;
}

/* A header value: printable ASCII as is, other bytes (UTF-8 of a version name) and '%' as %XX. */
static void header_escape(const char *v, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)v; *p && n + 4 < cap; p++) {
        if (*p >= 0x20 && *p < 0x7f && *p != '%') {
            out[n++] = (char)*p;
        } else {
            out[n++] = '%';
            out[n++] = hex[*p >> 4];
            out[n++] = hex[*p & 15];
        }
    }
    out[n] = 0;
}

static int route_export(srv_state *s, struct mg_connection *conn)
{
    char model[16] = "target";
    srv_query_var(conn, "model", model, sizeof model);
    if (strcmp(model, "target") != 0 && strcmp(model, "draft") != 0)
        return srv_send_error(conn, 400, "model", "model must be \"target\" or \"draft\"");
    export_cmd *x = calloc(1, sizeof *x);
    if (!x) return srv_send_error(conn, 500, NULL, "out of memory");
    x->c.kind = SRV_CMD_EXPORT;
    x->c.run = export_run;
    snprintf(x->c.what, sizeof x->c.what, "export");
    x->draft = strcmp(model, "draft") == 0;
    srv_cmd_submit(s, &x->c);
    int st;
    if (x->c.status != 200) {
        st = srv_cmd_send_result(conn, &x->c, NULL);
    } else {
        char vh[3 * sizeof x->version + 4], head[1024];
        header_escape(x->version, vh, sizeof vh);
        const int hn = snprintf(head, sizeof head,
                                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %zu\r\n"
                                "X-Weight-Version: %s\r\nCache-Control: no-store\r\n\r\n",
                                x->len, vh);
        /* (no copy of the body into one buffer with the head: the body is the size of the model) */
        if (hn > 0 && (size_t)hn < sizeof head && mg_write(conn, head, (size_t)hn) > 0) {
            for (size_t off = 0; off < x->len;) {
                const size_t k = x->len - off < ((size_t)16 << 20) ? x->len - off : (size_t)16 << 20;
                if (mg_write(conn, x->buf + off, k) <= 0) break; /* the client went away or stalled */
                off += k;
            }
        }
        st = 200;
    }
    free(x->buf);
    free(x->outs);
    free(x);
    return st;
}

/* ---- the HTTP client (civetweb's) ------------------------------------------------------------------ */

typedef struct {
    char host[256];    /* for mg_connect_client (an IPv6 address without brackets) */
    int port;
    char hosthdr[300]; /* the Host header */
    char url[320];     /* http://host:port, as messages name it */
} pull_url;

static int host_char_ok(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
           ch == '-' || ch == '_' || ch == ':';
}

/* "http://HOST[:PORT][/]" (HOST a name, an IPv4 address or [an IPv6 address]). 0, or -1 with why. */
static int parse_url(const char *in, pull_url *u, char *why, size_t wl)
{
    memset(u, 0, sizeof *u);
    if (strncmp(in, "https://", 8) == 0)
        return snprintf(why, wl, "https is not supported: give the source's http:// address"), -1;
    if (strncmp(in, "http://", 7) != 0)
        return snprintf(why, wl, "url must be http://HOST:PORT (the source replica's address)"), -1;
    const char *h = in + 7, *end = h + strcspn(h, "/?#");
    if (*end && strcmp(end, "/") != 0) return snprintf(why, wl, "url must have no path, query or fragment"), -1;
    const char *hend, *pstart = NULL;
    if (*h == '[') {
        const char *rb = memchr(h, ']', (size_t)(end - h));
        if (!rb) return snprintf(why, wl, "url: an IPv6 address without its ']'"), -1;
        hend = rb;
        h++;
        if (rb + 1 < end) {
            if (rb[1] != ':') return snprintf(why, wl, "url: junk after the IPv6 address"), -1;
            pstart = rb + 2;
        }
    } else {
        const char *colon = memchr(h, ':', (size_t)(end - h));
        hend = colon ? colon : end;
        if (colon) pstart = colon + 1;
        if (memchr(h, ':', (size_t)(hend - h))) return snprintf(why, wl, "url: an IPv6 address must be in []"), -1;
    }
    const size_t hl = (size_t)(hend - h);
    if (hl == 0 || hl >= sizeof u->host) return snprintf(why, wl, "url: no host, or a host name too long"), -1;
    for (size_t i = 0; i < hl; i++)
        if (!host_char_ok((unsigned char)h[i])) return snprintf(why, wl, "url: the host has a character it cannot have"), -1;
    memcpy(u->host, h, hl);
    long port = 80;
    if (pstart) {
        const size_t pl = (size_t)(end - pstart);
        if (pl == 0 || pl > 5 || strspn(pstart, "0123456789") < pl) return snprintf(why, wl, "url: a bad port"), -1;
        port = strtol(pstart, NULL, 10);
        if (port < 1 || port > 65535) return snprintf(why, wl, "url: port out of range"), -1;
    }
    u->port = (int)port;
    const int v6 = strchr(u->host, ':') != NULL;
    snprintf(u->hosthdr, sizeof u->hosthdr, v6 ? "[%s]:%d" : "%s:%d", u->host, u->port);
    snprintf(u->url, sizeof u->url, "http://%s", u->hosthdr);
    return 0;
}

/* A bearer key goes into a header: printable ASCII without spaces (RFC 6750 b64token and more). */
static int key_ok(const char *k)
{
    const size_t n = strlen(k);
    if (n == 0 || n > PULL_MAX_KEY) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)k[i] <= 0x20 || (unsigned char)k[i] >= 0x7f) return 0;
    return 1;
}

typedef struct {
    int status;
    uint8_t *body; /* malloc'd; NULL when empty */
    size_t len;
} pull_http;

enum { GET_OK = 0, GET_TRANSPORT = -1, GET_TOO_BIG = -2, GET_CANCELLED = -3 };

/* GET path from u (Connection: close), the body read whole, at most max bytes, by the deadline.
 * GET_OK with r filled (any status; r->body is the caller's), else an error code and why. */
static int http_get(const pull_url *u, const char *key, const char *path, size_t max, double deadline,
                    atomic_int *cancel, pull_http *r, char *why, size_t wl)
{
    memset(r, 0, sizeof *r);
    char eb[256] = "";
    struct mg_connection *c = mg_connect_client(u->host, u->port, 0, eb, sizeof eb);
    if (!c) return snprintf(why, wl, "cannot connect: %s", eb[0] ? eb : "connection failed"), GET_TRANSPORT;
    int rc = GET_TRANSPORT;
    uint8_t *buf = NULL;
    if (mg_printf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: */*\r\nConnection: close\r\n%s%s%s\r\n", path,
                  u->hosthdr, key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "") <= 0) {
        snprintf(why, wl, "cannot send the request");
        goto done;
    }
    double left = deadline - srv_now();
    if (left < 1) left = 1;
    if (mg_get_response(c, eb, sizeof eb, left > 600 ? 600000 : (int)(left * 1000)) < 0) {
        snprintf(why, wl, "no HTTP answer to GET %s: %s", path, eb[0] ? eb : "connection closed");
        goto done;
    }
    const struct mg_response_info *ri = mg_get_response_info(c);
    if (!ri) {
        snprintf(why, wl, "no HTTP answer to GET %s", path);
        goto done;
    }
    r->status = ri->status_code;
    const long long cl = ri->content_length;
    /* an error answer is read only for its message */
    const size_t lim = r->status == 200 ? max : PULL_MAX_ERR_BODY;
    if (cl >= 0 && (unsigned long long)cl > lim) {
        if (r->status != 200) { /* its message does not matter */
            rc = GET_OK;
            goto done;
        }
        snprintf(why, wl, "GET %s answered %lld bytes, more than %zu", path, cl, lim);
        rc = GET_TOO_BIG;
        goto done;
    }
    size_t cap = cl >= 0 ? (size_t)cl : (size_t)1 << 16, n = 0;
    buf = malloc(cap ? cap : 1);
    if (!buf) {
        snprintf(why, wl, "out of memory for an answer of %zu bytes", cap);
        goto done;
    }
    for (;;) {
        if (cl >= 0 && n == (size_t)cl) break;
        if (cancel && atomic_load(cancel)) {
            snprintf(why, wl, "the server is shutting down");
            rc = GET_CANCELLED;
            goto done;
        }
        if (srv_now() > deadline) {
            snprintf(why, wl, "timed out reading the answer to GET %s (%zu bytes in)", path, n);
            goto done;
        }
        if (n == cap) { /* no Content-Length: grow up to the bound */
            if (cap >= lim) {
                if (r->status != 200) break;
                snprintf(why, wl, "GET %s answered more than %zu bytes", path, lim);
                rc = GET_TOO_BIG;
                goto done;
            }
            const size_t nc = cap > lim / 2 ? lim : 2 * cap;
            uint8_t *nb = realloc(buf, nc);
            if (!nb) {
                snprintf(why, wl, "out of memory for an answer of %zu bytes", nc);
                goto done;
            }
            buf = nb;
            cap = nc;
        }
        const size_t want = cap - n < ((size_t)1 << 20) ? cap - n : (size_t)1 << 20;
        const int k = mg_read(c, buf + n, want);
        if (k <= 0) break;
        n += (size_t)k;
    }
    if (cl >= 0 && n != (size_t)cl) {
        snprintf(why, wl, "the answer to GET %s was cut off after %zu of %lld bytes", path, n, cl);
        goto done;
    }
    r->body = buf;
    r->len = n;
    buf = NULL;
    rc = GET_OK;
done:
    free(buf);
    mg_close_connection(c);
    return rc;
}

/* ": MESSAGE" of an error answer that is graphswap's {"error": {"message"}} (or SGLang's / FastAPI's
 * {"message"} / {"detail"}), sanitized and cut; else a hint that the source is not graphswap. */
static void source_message(const pull_http *r, char *out, size_t cap)
{
    cJSON *j = r->body ? mdl_json_parse((const char *)r->body, r->len, MDL_JSON_MAX_DEPTH, MDL_JSON_OBJECT, NULL,
                                        NULL, 0)
                       : NULL;
    const cJSON *err = srv_field(j, "error");
    const cJSON *m = cJSON_IsObject(err) ? srv_field(err, "message") : NULL;
    if (!cJSON_IsString(m)) m = srv_field(j, "message");
    if (!cJSON_IsString(m)) m = srv_field(j, "detail");
    if (cJSON_IsString(m)) {
        size_t n = strlen(m->valuestring), sl;
        if (n > 300) n = 300;
        char *san = srv_utf8_sanitize(m->valuestring, n, &sl);
        snprintf(out, cap, ": %s", san ? san : "");
        free(san);
    } else {
        snprintf(out, cap, " (not a graphswap answer: is the url a graphswap replica?)");
    }
    cJSON_Delete(j);
}

/* ---- the pull (receiver side) ------------------------------------------------------------------------ */

typedef enum { PULL_OK = 0, PULL_UNREACHABLE, PULL_BUSY, PULL_RACE, PULL_FATAL } pull_outcome;

typedef struct {
    int draft;
    /* the plan: this replica's checkpoint tensors (data NULL; names in the model's table), by name */
    eng_ckpt_tensor *t;
    size_t n, cap;
    uint64_t numel, name_bytes;
    /* one attempt: what the source sent */
    uint8_t *body;
    size_t len;
    mdl_st_file f;
    cJSON *sums;
} pull_model;

typedef struct pull_job {
    srv_state *s;
    pull_url u;
    const char *key;        /* bearer key for the source; NULL: none */
    double timeout_s, deadline;
    int retry_unreachable;  /* start-up: the source may be starting too */
    int max_races;          /* 0: bounded by the deadline only */
    atomic_int *cancel;     /* start-up: set at shutdown; NULL: none */
    int model_given;
    eng_wmodel which;
    void (*on_retry)(struct pull_job *p, const srv_err *last); /* start-up: publish the reason */
    pull_model m[2];
    int n_models, has_draft;
    /* result */
    char version[128];
    uint64_t tensors, bytes;
    int attempts;
} pull_job;

static int by_name(const void *a, const void *b)
{
    return strcmp(((const eng_ckpt_tensor *)a)->name, ((const eng_ckpt_tensor *)b)->name);
}

static int plan_add(const eng_ckpt_tensor *t, void *u)
{
    pull_model *pm = u;
    if (pm->n == pm->cap) {
        const size_t cap = pm->cap ? 2 * pm->cap : 256;
        eng_ckpt_tensor *nt = realloc(pm->t, cap * sizeof *nt);
        if (!nt) return 1;
        pm->t = nt;
        pm->cap = cap;
    }
    pm->t[pm->n++] = *t;
    pm->numel += t->nbytes / mdl_dtype_size(t->dtype);
    pm->name_bytes += strlen(t->name);
    return 0;
}

typedef struct {
    pull_job *p;
    int rc;
} plan_call;

/* Engine closure: whether there is a drafter, and the metadata of each model pulled. */
static void plan_run(srv_state *s, void *arg)
{
    plan_call *pc = arg;
    pull_job *p = pc->p;
    p->has_draft = s->rt.draft != NULL;
    if (!p->model_given) p->which = p->has_draft ? ENG_WMODEL_ALL : ENG_WMODEL_TARGET;
    if (p->which != ENG_WMODEL_TARGET && !p->has_draft) {
        pc->rc = -1;
        return;
    }
    p->n_models = 0;
    if (p->which != ENG_WMODEL_DRAFT) p->m[p->n_models++].draft = 0;
    if (p->which != ENG_WMODEL_TARGET) p->m[p->n_models++].draft = 1;
    pc->rc = 0;
    for (int k = 0; k < p->n_models && pc->rc == 0; k++)
        if (eng_weights_ckpt_visit(s->rt.e, p->m[k].draft, 0, plan_add, &p->m[k]) != 0) pc->rc = -2;
}

/* What one attempt fetched, freed (the plan stays). */
static void attempt_free(pull_job *p)
{
    for (int k = 0; k < p->n_models; k++) {
        pull_model *pm = &p->m[k];
        mdl_st_close(&pm->f);
        free(pm->body);
        pm->body = NULL;
        pm->len = 0;
        cJSON_Delete(pm->sums);
        pm->sums = NULL;
    }
}

static void job_free(pull_job *p)
{
    attempt_free(p);
    for (int k = 0; k < 2; k++) free(p->m[k].t);
}

/* One GET of the source, classified: PULL_OK (200, r->body the caller's) or the outcome with e. */
static pull_outcome source_get(pull_job *p, const char *path, size_t max, pull_http *r, srv_err *e)
{
    char why[512];
    const int rc = http_get(&p->u, p->key, path, max, p->deadline, p->cancel, r, why, sizeof why);
    if (rc == GET_CANCELLED) return srv_errf(e, 503, NULL, "the server is shutting down"), PULL_FATAL;
    if (rc == GET_TOO_BIG)
        return srv_errf(e, 502, "url", "the source %s: %s (this replica's model cannot need that much: another model?)",
                        p->u.url, why), PULL_FATAL;
    if (rc != GET_OK) return srv_errf(e, 502, "url", "cannot reach the source %s: %s", p->u.url, why), PULL_UNREACHABLE;
    if (r->status == 200) return PULL_OK;
    char msg[400];
    source_message(r, msg, sizeof msg);
    const int st = r->status;
    free(r->body);
    r->body = NULL;
    srv_errf(e, 502, "url", "the source %s answered GET %s with HTTP %d%s", p->u.url, path, st, msg);
    /* a session open, asleep or still pulling itself (409 / 503), a proxy's failure (502 / 504), a
     * rate limit (429): the source will answer later */
    return st == 409 || st == 503 || st == 502 || st == 504 || st == 429 ? PULL_BUSY : PULL_FATAL;
}

static void shape_text(char *out, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* The source's tensors of pm are exactly this replica's (names, shapes) in dtypes it loads. */
static pull_outcome check_layout(pull_job *p, pull_model *pm, const char *mn, srv_err *e)
{
    uint8_t *seen = calloc(pm->n ? pm->n : 1, 1);
    if (!seen) return srv_errf(e, 500, NULL, "out of memory"), PULL_FATAL;
    pull_outcome o = PULL_OK;
    for (size_t i = 0; i < pm->f.n && o == PULL_OK; i++) {
        const mdl_st_tensor *t = &pm->f.tensors[i];
        const eng_ckpt_tensor key = {.name = t->name};
        const eng_ckpt_tensor *w = bsearch(&key, pm->t, pm->n, sizeof *pm->t, by_name);
        if (!w) {
            srv_errf(e, 422, "url", "the source %s serves another model: its %s tensor %s is not a checkpoint tensor "
                     "of this replica's %s model", p->u.url, mn, t->name, mn);
            o = PULL_FATAL;
            break;
        }
        int same = t->ndim == w->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == w->shape[d];
        if (!same) {
            char a[128], b[128];
            shape_text(a, sizeof a, t->ndim, t->shape);
            shape_text(b, sizeof b, w->ndim, w->shape);
            srv_errf(e, 422, "url", "the source %s serves another model: %s tensor %s has shape %s there, %s here",
                     p->u.url, mn, t->name, a, b);
            o = PULL_FATAL;
        } else if (!mdl_dtype_convertible(t->dtype) && t->dtype != MDL_DT_F8_E4M3) { /* FP8: the session checks it */
            srv_errf(e, 502, "url", "the source %s sent %s tensor %s as %s, which cannot be loaded", p->u.url, mn,
                     t->name, mdl_dtype_name(t->dtype));
            o = PULL_FATAL;
        }
        seen[w - pm->t] = 1;
    }
    for (size_t j = 0; j < pm->n && o == PULL_OK; j++)
        if (!seen[j]) {
            srv_errf(e, 422, "url", "the source %s serves another model: its %s export lacks tensor %s", p->u.url, mn,
                     pm->t[j].name);
            o = PULL_FATAL;
        }
    free(seen);
    return o;
}

/* FETCH and VERIFY of one model (the file comment). */
static pull_outcome fetch_model(pull_job *p, pull_model *pm, char *version, srv_err *e)
{
    const char *mn = pm->draft ? "draft" : "target";
    char path[128];
    pull_http r;
    snprintf(path, sizeof path, "/v1/weights/checksums?names=checkpoint&model=%s", mn);
    pull_outcome o = source_get(p, path, PULL_MAX_JSON, &r, e);
    if (o != PULL_OK) return o;
    char why[200];
    pm->sums = mdl_json_parse((const char *)r.body, r.len, MDL_JSON_MAX_DEPTH,
                              MDL_JSON_REFUSE_NUL | MDL_JSON_WHOLE | MDL_JSON_OBJECT, NULL, why, sizeof why);
    free(r.body);
    const cJSON *sums = srv_field(pm->sums, "tensors");
    const cJSON *names = srv_field(pm->sums, "names");
    const char *v = NULL;
    srv_err ve;
    int vrc;
    if (!pm->sums || !cJSON_IsObject(sums) || !cJSON_IsString(names) || strcmp(names->valuestring, "checkpoint") != 0)
        return srv_errf(e, 502, "url", "the source %s answered GET %s with %s (is the url a graphswap replica?)",
                        p->u.url, path, pm->sums ? "no checkpoint-name checksums" : why), PULL_FATAL;
    /* the version comes from a peer: the checks of a version a trainer names */
    if ((vrc = srv_opt_version(pm->sums, "version", &v, &ve)) != 0 || !v)
        return srv_errf(e, 502, "url", "the source %s: its checksums carry no usable version%s%s", p->u.url,
                        vrc ? ": " : "", vrc ? ve.msg : ""), PULL_FATAL;
    snprintf(version, 128, "%s", v);

    /* the export: at most this replica's tensors in f32 (the widest dtype it loads) and a header of
     * their names */
    uint64_t hbound = 4096 + pm->name_bytes + 160 * (uint64_t)pm->n;
    if (hbound > MDL_ST_MAX_HEADER) hbound = MDL_ST_MAX_HEADER;
    const uint64_t bound = 8 + hbound + 4 * pm->numel;
    snprintf(path, sizeof path, "/v1/weights/export?model=%s", mn);
    o = source_get(p, path, bound > SIZE_MAX ? SIZE_MAX : (size_t)bound, &r, e);
    if (o != PULL_OK) return o;
    pm->body = r.body;
    pm->len = r.len;
    char what[400], err[768];
    snprintf(what, sizeof what, "the export of %s (model %s)", p->u.url, mn);
    if (mdl_st_parse(pm->body, pm->len, what, &pm->f, err, sizeof err) != 0)
        return srv_errf(e, 502, "url", "%s", err), PULL_FATAL;
    const char *ev = NULL;
    for (size_t i = 0; i < pm->f.n_meta; i++)
        if (strcmp(pm->f.meta_keys[i], "weight_version") == 0) ev = pm->f.meta_vals[i];
    if (!ev) return srv_errf(e, 502, "url", "%s has no __metadata__ weight_version", what), PULL_FATAL;
    if (strcmp(ev, version) != 0)
        return srv_errf(e, 502, "url", "the source %s changed its weights during the pull (version %s, then %s)",
                        p->u.url, version, ev), PULL_RACE;
    if ((o = check_layout(p, pm, mn, e)) != PULL_OK) return o;
    for (size_t i = 0; i < pm->f.n; i++) {
        const mdl_st_tensor *t = &pm->f.tensors[i];
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(sums, t->name);
        if (!cJSON_IsString(h))
            return srv_errf(e, 502, "url", "the source %s: its checksums lack %s tensor %s", p->u.url, mn, t->name),
                   PULL_FATAL;
        char hex[65];
        eng_sha256_hex(t->data, (size_t)t->nbytes, hex);
        if (strcmp(hex, h->valuestring) != 0)
            return srv_errf(e, 502, "url", "the source %s changed its weights during the pull (%s tensor %s differs "
                            "from its checksum)", p->u.url, mn, t->name), PULL_RACE;
    }
    return PULL_OK;
}

/* WRITE: one full session of every pulled model through the command runner. */
static pull_outcome write_session(pull_job *p, srv_err *e)
{
    size_t n = 0, nb = 0;
    for (int k = 0; k < p->n_models; k++) {
        n += p->m[k].f.n;
        if (p->which == ENG_WMODEL_ALL && p->m[k].draft)
            for (size_t i = 0; i < p->m[k].f.n; i++) nb += strlen(p->m[k].f.tensors[i].name) + 7;
    }
    mdl_st_tensor *ts = calloc(n ? n : 1, sizeof *ts);
    char *names = nb ? malloc(nb) : NULL;
    srv_cmd *c = srv_cmd_new(SRV_CMD_HOST_UPDATE);
    if (!ts || (nb && !names) || !c) {
        free(ts);
        free(names);
        free(c);
        return srv_errf(e, 500, NULL, "out of memory"), PULL_FATAL;
    }
    size_t i = 0, off = 0;
    uint64_t bytes = 0;
    for (int k = 0; k < p->n_models; k++)
        for (size_t j = 0; j < p->m[k].f.n; j++, i++) {
            ts[i] = p->m[k].f.tensors[j];
            bytes += ts[i].nbytes;
            if (p->which == ENG_WMODEL_ALL && p->m[k].draft) { /* model "all": the drafter's names */
                const int w = snprintf(names + off, nb - off, "draft.%s", ts[i].name);
                ts[i].name = names + off;
                off += (size_t)w + 1;
            }
        }
    c->full = 1;
    c->which = p->which;
    c->pause = ENG_PAUSE_WAIT;
    snprintf(c->version, sizeof c->version, "%s", p->version);
    snprintf(c->what, sizeof c->what, "the pulled weights");
    c->tensors = ts;
    c->n_tensors = n;
    srv_cmd_submit(p->s, c);
    pull_outcome o = PULL_OK;
    if (c->status != 200) {
        srv_errf(e, c->status, NULL, "this replica did not take the pulled weights: %s", c->err);
        if (c->status == 409) e->type = "conflict";
        o = PULL_FATAL;
    } else {
        p->tensors = n;
        p->bytes = bytes;
    }
    free(ts);
    free(names);
    free(c);
    return o;
}

static pull_outcome attempt(pull_job *p, srv_err *e)
{
    char ver[2][128];
    for (int k = 0; k < p->n_models; k++) {
        const pull_outcome o = fetch_model(p, &p->m[k], ver[k], e);
        if (o != PULL_OK) return o;
    }
    if (p->n_models == 2 && strcmp(ver[0], ver[1]) != 0)
        return srv_errf(e, 502, "url", "the source %s changed its weights during the pull (version %s, then %s)",
                        p->u.url, ver[0], ver[1]), PULL_RACE;
    snprintf(p->version, sizeof p->version, "%s", ver[0]);
    return write_session(p, e);
}

/* Sleeps s seconds unless cancelled first (1). */
static int nap(pull_job *p, double secs)
{
    const double until = srv_now() + secs;
    while (srv_now() < until) {
        if (p->cancel && atomic_load(p->cancel)) return 1;
        usleep(20000);
    }
    return p->cancel && atomic_load(p->cancel);
}

/* The driver: plan, then attempts until OK, FATAL or the deadline (the file comment). 0, or -1
 * with e. The caller holds s->pull_busy. */
static int pull_run(pull_job *p, srv_err *e)
{
    p->deadline = srv_now() + p->timeout_s;
    plan_call pc = {p, 0};
    srv_closure cl = {.fn = plan_run, .arg = &pc};
    if (srv_engine_call(p->s, &cl) != 0) return srv_errf(e, 503, NULL, "the server is shutting down"), -1;
    if (pc.rc == -1) return srv_errf(e, 400, "model", "this replica has no drafter: pull model \"target\""), -1;
    if (pc.rc != 0) return srv_errf(e, 500, NULL, "out of memory"), -1;
    for (int k = 0; k < p->n_models; k++) qsort(p->m[k].t, p->m[k].n, sizeof *p->m[k].t, by_name);
    double backoff = 0.25;
    int races = 0;
    for (;;) {
        p->attempts++;
        const pull_outcome o = attempt(p, e);
        attempt_free(p);
        if (o == PULL_OK) return 0;
        if (o == PULL_FATAL || (o == PULL_UNREACHABLE && !p->retry_unreachable)) return -1;
        races = o == PULL_RACE ? races + 1 : 0;
        if (p->max_races && races >= p->max_races) {
            char last[sizeof e->msg];
            snprintf(last, sizeof last, "%s", e->msg);
            return srv_errf(e, 502, "url", "the source's weights changed during %d pulls in a row (last: %s)", races,
                            last), -1;
        }
        const double left = p->deadline - srv_now();
        if (left <= 0) {
            char last[sizeof e->msg];
            snprintf(last, sizeof last, "%s", e->msg);
            return srv_errf(e, 504, "timeout_s", "gave up after %.0f s and %d attempts; the last: %s", p->timeout_s,
                            p->attempts, last), -1;
        }
        if (p->on_retry) p->on_retry(p, e);
        if (nap(p, backoff < left ? backoff : left)) return srv_errf(e, 503, NULL, "the server is shutting down"), -1;
        backoff = backoff * 2 > 2.0 ? 2.0 : backoff * 2;
    }
}

static void log_pulled(const pull_job *p, double secs, const char *how)
{
    srv_logline l;
    srv_log_begin(&l, "info", "weights", "pulled the weights of %s%s: version %s, %llu tensors, %llu bytes, "
                  "%d attempt%s, %.1f s", p->u.url, how, p->version, (unsigned long long)p->tensors,
                  (unsigned long long)p->bytes, p->attempts, p->attempts == 1 ? "" : "s", secs);
    srv_log_str(&l, "source", p->u.url);
    srv_log_str(&l, "version", p->version);
    srv_log_int(&l, "tensors", (long long)p->tensors);
    srv_log_int(&l, "bytes", (long long)p->bytes);
    srv_log_int(&l, "attempts", p->attempts);
    srv_log_num(&l, "seconds", secs, 2);
    srv_log_end(&l);
}

/* POST /v1/weights/pull {"url", "model", "api_key", "timeout_s"} */
static int route_pull(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    pull_job p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.timeout_s = PULL_DEFAULT_TIMEOUT;
    p.max_races = PULL_MAX_RACES;
    const cJSON *url = srv_field(b, "url"), *key = srv_field(b, "api_key"), *to = srv_field(b, "timeout_s");
    const char *model = NULL;
    char why[160];
    int st;
    if (!cJSON_IsString(url) || parse_url(url->valuestring, &p.u, why, sizeof why) != 0) {
        st = srv_send_error(conn, 400, "url", "%s", cJSON_IsString(url) ? why : "url must be the source replica's "
                            "address, http://HOST:PORT");
        goto out;
    }
    if (srv_opt_string(b, "model", &model, &e) != 0) {
        st = srv_send_err(conn, &e);
        goto out;
    }
    if (model) {
        if (eng_wmodel_parse(model, &p.which) != 0) {
            st = srv_send_error(conn, 400, "model", "model must be \"target\", \"draft\" or \"all\"");
            goto out;
        }
        p.model_given = 1;
    }
    if (key && (!cJSON_IsString(key) || !key_ok(key->valuestring))) {
        st = srv_send_error(conn, 400, "api_key", "api_key must be a string of 1 to %d printable ASCII characters "
                            "without spaces", PULL_MAX_KEY);
        goto out;
    }
    p.key = key ? key->valuestring : NULL;
    if (to) {
        if (!cJSON_IsNumber(to) || !(to->valuedouble > 0) || to->valuedouble > PULL_MAX_TIMEOUT) {
            st = srv_send_error(conn, 400, "timeout_s", "timeout_s must be a number of seconds in (0, %.0f]",
                                PULL_MAX_TIMEOUT);
            goto out;
        }
        p.timeout_s = to->valuedouble;
    }
    int idle = 0;
    if (!atomic_compare_exchange_strong(&s->pull_busy, &idle, 1)) {
        srv_errf(&e, 409, NULL, "a pull is already under way on this replica");
        e.type = "conflict";
        st = srv_send_err(conn, &e);
        goto out;
    }
    const double t0 = srv_now();
    const int rc = pull_run(&p, &e);
    atomic_store(&s->pull_busy, 0);
    if (rc != 0) {
        srv_logf("error", "weights", "pull from %s failed (%d): %s", p.u.url, e.status, e.msg);
        st = srv_send_err(conn, &e);
        goto out;
    }
    log_pulled(&p, srv_now() - t0, "");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", 1);
    cJSON_AddStringToObject(o, "version", p.version);
    cJSON_AddNumberToObject(o, "tensors", (double)p.tensors);
    cJSON_AddNumberToObject(o, "bytes", (double)p.bytes);
    cJSON_AddStringToObject(o, "source", p.u.url);
    cJSON_AddStringToObject(o, "model", p.which == ENG_WMODEL_ALL ? "all" : p.which == ENG_WMODEL_DRAFT ? "draft" : "target");
    cJSON_AddNumberToObject(o, "attempts", p.attempts);
    st = srv_send_json(conn, 200, o);
    cJSON_Delete(o);
out:
    job_free(&p);
    cJSON_Delete(b);
    return st;
}

void srv_weights_pull_routes(srv_state *s)
{
    srv_route_add(&s->http, "GET", "/v1/weights/export", route_export, 2);
    srv_route_add(&s->http, "POST", "/v1/weights/pull", route_pull, 2);
}

/* ---- serve --weights-from ---------------------------------------------------------------------------- */

struct srv_pull_boot {
    srv_state *s;
    pthread_t th;
    int started;
    pull_url u;
    char key[PULL_MAX_KEY + 1]; /* "" none */
    double timeout_s;
    atomic_int cancel;
    atomic_int outcome; /* 0 under way, 1 pulled, 2 gave up */
};

static void set_reason(srv_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_reason(srv_state *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&s->wmu);
    vsnprintf(s->pull_reason, sizeof s->pull_reason, fmt, ap);
    pthread_mutex_unlock(&s->wmu);
    va_end(ap);
}

static void boot_retry(pull_job *p, const srv_err *last)
{
    const double left = p->deadline - srv_now();
    set_reason(p->s, "waiting for the weights from %s (--weights-from; attempt %d failed, retrying for %.0f s more): %s",
               p->u.url, p->attempts, left > 0 ? left : 0, last->msg);
}

static void *boot_main(void *arg)
{
    struct srv_pull_boot *b = arg;
    srv_state *s = b->s;
    pull_job p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.u = b->u;
    p.key = b->key[0] ? b->key : NULL;
    p.timeout_s = b->timeout_s;
    p.retry_unreachable = 1;
    p.cancel = &b->cancel;
    p.on_retry = boot_retry;
    const double t0 = srv_now();
    srv_err e;
    int rc = -1, idle = 0;
    /* (set before the listener started: no route pull can hold it) */
    if (atomic_compare_exchange_strong(&s->pull_busy, &idle, 1)) {
        rc = pull_run(&p, &e);
        atomic_store(&s->pull_busy, 0);
    } else {
        srv_errf(&e, 409, NULL, "another pull held the replica");
    }
    if (rc == 0) {
        atomic_store(&s->pull_pending, 0);
        set_reason(s, "%s", "");
        log_pulled(&p, srv_now() - t0, " (--weights-from)");
        atomic_store(&b->outcome, 1);
    } else if (!atomic_load(&b->cancel)) {
        set_reason(s, "the pull from %s (--weights-from) failed: %s", b->u.url, e.msg);
        srv_logf("error", "weights", "--weights-from %s: %s; shutting down with exit status 1", b->u.url, e.msg);
        atomic_store(&b->outcome, 2);
    }
    job_free(&p);
    return NULL;
}

int srv_pull_boot_start(srv_state *s, const char *url, const char *key, double timeout_s, char *err, size_t errlen)
{
    struct srv_pull_boot *b = calloc(1, sizeof *b);
    if (!b) return snprintf(err, errlen, "out of memory"), -1;
    char why[160];
    if (parse_url(url, &b->u, why, sizeof why) != 0) {
        free(b);
        return snprintf(err, errlen, "--weights-from %s: %s", url, why), -1;
    }
    if (key && *key && !key_ok(key)) {
        free(b);
        return snprintf(err, errlen, "--weights-from-key must be 1 to %d printable ASCII characters without spaces",
                        PULL_MAX_KEY), -1;
    }
    snprintf(b->key, sizeof b->key, "%s", key ? key : "");
    b->s = s;
    b->timeout_s = timeout_s;
    s->pull_boot = b;
    atomic_store(&s->pull_pending, 1);
    set_reason(s, "pulling the weights from %s (--weights-from)", b->u.url);
    if (pthread_create(&b->th, NULL, boot_main, b) != 0) {
        s->pull_boot = NULL;
        atomic_store(&s->pull_pending, 0);
        free(b);
        return snprintf(err, errlen, "cannot start the --weights-from thread"), -1;
    }
    b->started = 1;
    return 0;
}

int srv_pull_boot_failed(srv_state *s)
{
    return s->pull_boot && atomic_load(&s->pull_boot->outcome) == 2;
}

void srv_pull_boot_cancel(srv_state *s)
{
    if (s->pull_boot) atomic_store(&s->pull_boot->cancel, 1);
}

void srv_pull_boot_stop(srv_state *s)
{
    struct srv_pull_boot *b = s->pull_boot;
    if (!b) return;
    atomic_store(&b->cancel, 1);
    if (b->started) pthread_join(b->th, NULL);
    s->pull_boot = NULL;
    free(b);
}
