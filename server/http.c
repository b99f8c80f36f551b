/* server/http.c — HTTP plumbing over civetweb: responses, errors, bounded body reading, the router
 * and API-key auth.
 *
 * Responses are written with a single mg_write (status line + headers + body) so a small response is
 * one TCP segment (tcp_nodelay is on: no Nagle / delayed-ACK stalls between header and body writes).
 * civetweb discards any unread request body after the handler returns, so a handler may answer
 * early (413, 401, 404) without reading the body.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "models/json_guard.h"
#include "server/srv.h"

double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double srv_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int srv_ct_equal(const char *a, size_t an, const char *b, size_t bn)
{
    /* Every byte of the longer string is visited whatever the contents, and the length difference is
     * folded into the accumulator, so the time depends only on the lengths. */
    size_t n = an > bn ? an : bn;
    unsigned acc = an != bn;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < an ? (unsigned char)a[i] : 0, y = i < bn ? (unsigned char)b[i] : 0;
        acc |= (unsigned)(x ^ y);
    }
    return acc == 0;
}

int srv_errf(srv_err *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->type = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

const char *srv_err_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found";
    case 408:
    case 504: return "timeout";
    case 429:
    case 503: return "overloaded";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

cJSON *srv_err_json(const srv_err *e)
{
    cJSON *o = cJSON_CreateObject(), *x = cJSON_AddObjectToObject(o, "error");
    if (!x) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToObject(x, "message", srv_json_bytes(e->msg, strlen(e->msg)));
    cJSON_AddStringToObject(x, "type", e->type ? e->type : srv_err_type(e->status));
    if (e->param[0]) cJSON_AddStringToObject(x, "param", e->param);
    else cJSON_AddNullToObject(x, "param");
    cJSON_AddNumberToObject(x, "code", e->status);
    return o;
}

int srv_send(struct mg_connection *c, int status, const char *content_type, const char *extra_headers,
             const char *body, size_t len)
{
    char head[1024];
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
                      "%s\r\n",
                      status, mg_get_response_code_text(c, status), content_type, len,
                      extra_headers ? extra_headers : "");
    if (hn < 0 || (size_t)hn >= sizeof head) return status;
    char *buf = malloc((size_t)hn + len);
    if (buf) {
        memcpy(buf, head, (size_t)hn);
        if (len) memcpy(buf + hn, body, len);
        mg_write(c, buf, (size_t)hn + len);
        free(buf);
    } else { /* out of memory: two writes still deliver the response */
        mg_write(c, head, (size_t)hn);
        if (len) mg_write(c, body, len);
    }
    return status;
}

int srv_send_json(struct mg_connection *c, int status, const cJSON *body)
{
    char *txt = body ? cJSON_PrintUnformatted(body) : NULL;
    if (!txt) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":500}}";
        return srv_send(c, 500, "application/json", NULL, oom, sizeof oom - 1);
    }
    srv_send(c, status, "application/json", NULL, txt, strlen(txt));
    free(txt);
    return status;
}

int srv_send_err(struct mg_connection *c, const srv_err *e)
{
    cJSON *o = srv_err_json(e);
    char extra[128] = "";
    if ((e->status == 503 && !e->type) || e->status == 429) snprintf(extra, sizeof extra, "Retry-After: 1\r\n");
    if (e->status == 401) snprintf(extra, sizeof extra, "WWW-Authenticate: Bearer\r\n");
    char *txt = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!txt) return srv_send_json(c, 500, NULL);
    srv_send(c, e->status, "application/json", extra, txt, strlen(txt));
    free(txt);
    return e->status;
}

int srv_send_error(struct mg_connection *c, int status, const char *param, const char *fmt, ...)
{
    srv_err e;
    e.status = status;
    e.type = NULL;
    snprintf(e.param, sizeof e.param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    return srv_send_err(c, &e);
}

char *srv_read_body(const srv_state *s, struct mg_connection *c, size_t *len, srv_err *e)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    const long long cl = ri->content_length; /* -1: not given (chunked or none) */
    if (cl > (long long)s->max_body) {
        srv_errf(e, 413, NULL, "request body of %lld bytes is larger than the limit of %zu bytes (--max-body-bytes)",
                 cl, s->max_body);
        return NULL;
    }
    /* curl and libcurl send "Expect: 100-continue" for bodies over 1 KiB and wait a second for the
     * interim response; civetweb leaves it to request handlers */
    const char *expect = mg_get_header(c, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0 && ri->http_version && strcmp(ri->http_version, "1.1") == 0)
        mg_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    size_t cap = cl >= 0 ? (size_t)cl + 1 : 65536, n = 0;
    char *buf = malloc(cap);
    double t_read = srv_now(); /* when the last mg_read began */
    for (;;) {
        if (!buf) {
            srv_errf(e, 500, NULL, "out of memory reading the request body");
            return NULL;
        }
        if (cl >= 0 && (long long)n == cl) break; /* all announced bytes are in */
        if (n + 1 == cap) { /* only without Content-Length: grow up to the limit */
            if (n > s->max_body) {
                free(buf);
                srv_errf(e, 413, NULL, "request body is larger than the limit of %zu bytes (--max-body-bytes)",
                         s->max_body);
                return NULL;
            }
            size_t nc = cap * 2 > s->max_body + 2 ? s->max_body + 2 : cap * 2;
            char *nb = realloc(buf, nc);
            if (!nb) free(buf);
            buf = nb;
            cap = nc;
            continue;
        }
        t_read = srv_now();
        int r = mg_read(c, buf + n, cap - n - 1);
        if (r < 0) break; /* error or timeout: judged below */
        if (r == 0) break;
        n += (size_t)r;
    }
    if (n > s->max_body) {
        free(buf);
        srv_errf(e, 413, NULL, "request body is larger than the limit of %zu bytes (--max-body-bytes)", s->max_body);
        return NULL;
    }
    if (cl >= 0 && (long long)n != cl) {
        free(buf);
        /* civetweb's read gives up on a client silent for request_timeout_ms (= the I/O timeout);
         * one that ends sooner met the end of the stream */
        if (srv_now() - t_read >= s->io_timeout * 0.9)
            srv_errf(e, 408, NULL, "timed out reading the request body (%zu of %lld bytes, then nothing for %.0f s)",
                     n, cl, s->io_timeout);
        else
            srv_errf(e, 400, NULL, "truncated request body: got %zu of %lld bytes (Content-Length)", n, cl);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

cJSON *srv_parse_json_object(const char *txt, size_t len, srv_err *e)
{
    /* before cJSON: its recursion would overflow a civetweb worker's small stack on a deeply nested
     * body, and it would cut every string at a \u0000 (a silently shorter prompt or stop string) */
    char why[160];
    if (mdl_json_check(txt, len, MDL_JSON_MAX_DEPTH, 1, NULL, why, sizeof why) != 0) {
        srv_errf(e, 400, NULL, "request body: %s", why);
        return NULL;
    }
    const char *end = NULL;
    cJSON *body = cJSON_ParseWithLengthOpts(txt, len, &end, 0);
    if (!body) {
        size_t at = end && end >= txt ? (size_t)(end - txt) : 0;
        srv_errf(e, 400, NULL, "request body is not valid JSON (error near byte %zu of %zu)", at, len);
    } else if (!cJSON_IsObject(body)) {
        srv_errf(e, 400, NULL, "request body must be a JSON object");
        cJSON_Delete(body);
        body = NULL;
    } else {
        /* only whitespace may follow the object */
        while (end && (size_t)(end - txt) < len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
            end++; /* (not strchr: it would match the NUL terminator) */
        if (end && (size_t)(end - txt) < len) {
            srv_errf(e, 400, NULL, "request body has data after the JSON object (at byte %zu)", (size_t)(end - txt));
            cJSON_Delete(body);
            body = NULL;
        }
    }
    return body;
}

cJSON *srv_read_json(const srv_state *s, struct mg_connection *c, srv_err *e)
{
    size_t len;
    char *txt = srv_read_body(s, c, &len, e);
    if (!txt) return NULL;
    cJSON *body = srv_parse_json_object(txt, len, e);
    free(txt);
    return body;
}

/* ---- router -------------------------------------------------------------------------------------- */

void srv_route_add(srv_state *s, const char *method, const char *path, srv_route_fn fn, int auth)
{
    if (s->n_routes == SRV_MAX_ROUTES) srv_die("too many HTTP routes (SRV_MAX_ROUTES)");
    s->routes[s->n_routes++] = (srv_route){method, path, fn, auth};
}

/* 1 when the request carries "Authorization: Bearer <key>" (constant-time compare). */
static int bearer_matches(struct mg_connection *c, const char *key)
{
    const char *h = mg_get_header(c, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7;
    while (*k == ' ') k++;
    size_t kn = strlen(k);
    while (kn && (k[kn - 1] == ' ' || k[kn - 1] == '\t')) kn--;
    return srv_ct_equal(k, kn, key, strlen(key));
}

/* API key of the generation routes (when one is configured). */
static int authorized(const srv_state *s, struct mg_connection *c)
{
    if (!s->api_key) return 1;
    return bearer_matches(c, s->api_key);
}

/* Admin routes (weights, pause, cache): disabled on a non-loopback listener without an admin key;
 * else the admin key when one is set, else the API key when one is set (an API key protects every
 * route but /health and /metrics), else open (loopback only). */
static int admin_authorized(const srv_state *s, struct mg_connection *c)
{
    if (s->admin_disabled) return 0;
    if (s->admin_key) return bearer_matches(c, s->admin_key);
    if (s->api_key) return bearer_matches(c, s->api_key);
    return 1;
}

static int dispatch(srv_state *s, struct mg_connection *c);

int srv_dispatch(struct mg_connection *c, void *cbdata)
{
    srv_state *s = cbdata;
    atomic_fetch_add(&s->active, 1);
    const double t0 = srv_log_access_begin(); /* --access-log: one line per request (server/log.c) */
    int st = dispatch(s, c);
    srv_log_access_end(c, st, t0);
    atomic_fetch_sub(&s->active, 1);
    return st;
}

static int dispatch(srv_state *s, struct mg_connection *c)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    const char *path = ri->local_uri ? ri->local_uri : "";
    char allow[128] = "";
    size_t an = 0;
    for (int i = 0; i < s->n_routes; i++) {
        const srv_route *r = &s->routes[i];
        const size_t pl = strlen(r->path);
        const int prefix = pl && r->path[pl - 1] == '*';
        if (prefix ? strncmp(r->path, path, pl - 1) != 0 || !path[pl - 1] : strcmp(r->path, path) != 0) continue;
        if (strcmp(r->method, ri->request_method) == 0) {
            if (r->auth == 2 && !admin_authorized(s, c)) {
                srv_err e;
                if (s->admin_disabled)
                    srv_errf(&e, 403, NULL,
                             "weight routes are disabled on a non-loopback listener without --admin-key");
                else if (s->admin_key)
                    srv_errf(&e, 401, NULL, "missing or invalid admin key: send 'Authorization: Bearer <admin key>'");
                else
                    srv_errf(&e, 401, NULL,
                             "missing or invalid API key: admin routes need 'Authorization: Bearer <key>' "
                             "(the API key, as no --admin-key is set)");
                return srv_send_err(c, &e);
            }
            if (r->auth == 1 && !authorized(s, c)) {
                srv_err e;
                srv_errf(&e, 401, NULL, "missing or invalid API key: send 'Authorization: Bearer <key>'");
                return srv_send_err(c, &e);
            }
            return r->fn(s, c);
        }
        int w = snprintf(allow + an, sizeof allow - an, "%s%s", an ? ", " : "", r->method);
        if (w > 0 && (size_t)w < sizeof allow - an) an += (size_t)w;
    }
    srv_err e;
    if (an) {
        srv_errf(&e, 405, NULL, "method %s is not allowed on %s (allowed: %s)", ri->request_method, path, allow);
        cJSON *o = srv_err_json(&e);
        char *txt = o ? cJSON_PrintUnformatted(o) : NULL;
        cJSON_Delete(o);
        char extra[192];
        snprintf(extra, sizeof extra, "Allow: %s\r\n", allow);
        if (!txt) return srv_send_json(c, 500, NULL);
        srv_send(c, 405, "application/json", extra, txt, strlen(txt));
        free(txt);
        return 405;
    }
    srv_errf(&e, 404, NULL, "no route %s %s", ri->request_method, path);
    return srv_send_err(c, &e);
}
