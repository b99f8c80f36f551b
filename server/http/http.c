/* server/http/http.c — HTTP plumbing over civetweb: responses, errors, bounded body reading, the router
 * and API-key auth.
 *
 * Responses are written with a single mg_write (status line + headers + body) so a small response is
 * one TCP segment (tcp_nodelay is on: no Nagle / delayed-ACK stalls between header and body writes).
 * civetweb discards any unread request body after the handler returns, so a handler may answer
 * early (413, 401, 404) without reading the body.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "models/format/json_guard.h"
#include "server/http/http.h"
#include "server/http/log.h"

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
    /* Retry-After follows the error's type: "overloaded" (a full queue: 503, 429) invites a retry; a
     * 503 of another type (unusable weights: service_unavailable) does not */
    if (strcmp(e->type ? e->type : srv_err_type(e->status), "overloaded") == 0)
        snprintf(extra, sizeof extra, "Retry-After: 1\r\n");
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

char *srv_read_body(const srv_http *s, struct mg_connection *c, size_t *len, srv_err *e)
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
    mdl_json_result r;
    cJSON *body = mdl_json_parse(txt, len, MDL_JSON_MAX_DEPTH, MDL_JSON_REFUSE_NUL | MDL_JSON_WHOLE | MDL_JSON_OBJECT,
                                 &r, why, sizeof why);
    if (body) return body;
    switch (r.status) {
    case MDL_JSON_E_SYNTAX:
        srv_errf(e, 400, NULL, "request body is not valid JSON (error near byte %zu of %zu)", r.at, len);
        break;
    case MDL_JSON_E_NOT_OBJECT:
        srv_errf(e, 400, NULL, "request body must be a JSON object");
        break;
    case MDL_JSON_E_TRAILING: /* only whitespace may follow the object */
        srv_errf(e, 400, NULL, "request body has data after the JSON object (at byte %zu)", r.at);
        break;
    default: /* depth, NUL */
        srv_errf(e, 400, NULL, "request body: %s", why);
        break;
    }
    return NULL;
}

cJSON *srv_read_json(const srv_http *s, struct mg_connection *c, srv_err *e)
{
    size_t len;
    char *txt = srv_read_body(s, c, &len, e);
    if (!txt) return NULL;
    cJSON *body = srv_parse_json_object(txt, len, e);
    free(txt);
    return body;
}

/* ---- router -------------------------------------------------------------------------------------- */

void srv_route_add(srv_http *s, const char *method, const char *path, srv_route_fn fn, int auth)
{
    if (s->n_routes == SRV_MAX_ROUTES) { /* a bug: the route tables are fixed at build time */
        fprintf(stderr, "graphswap: too many HTTP routes (SRV_MAX_ROUTES %d)\n", SRV_MAX_ROUTES);
        abort();
    }
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
static int authorized(const srv_http *s, struct mg_connection *c)
{
    if (!s->api_key) return 1;
    return bearer_matches(c, s->api_key);
}

/* ---- --admin-allow -------------------------------------------------------------------------------- */

/* Strict dotted-quad IPv4: four decimal parts 0..255, no leading zeros, nothing else (inet_pton's
 * own IPv4 syntax is already strict on glibc; this keeps the rule independent of the libc). */
static int parse_ipv4(const char *s, uint8_t out[4])
{
    for (int i = 0; i < 4; i++) {
        if (s[0] < '0' || s[0] > '9') return -1;
        if (s[0] == '0' && s[1] >= '0' && s[1] <= '9') return -1;
        unsigned v = 0;
        int k = 0;
        while (s[k] >= '0' && s[k] <= '9' && k < 4) v = v * 10 + (unsigned)(s[k++] - '0');
        if (k > 3 || v > 255) return -1;
        out[i] = (uint8_t)v;
        s += k;
        if (i < 3 && *s++ != '.') return -1;
    }
    return *s ? -1 : 0;
}

static int parse_cidr(const char *s, size_t len, srv_cidr *c, char *why, size_t whylen)
{
    char buf[80];
    if (len == 0) return snprintf(why, whylen, "an empty entry"), -1;
    if (len >= sizeof buf) return snprintf(why, whylen, "%.*s...: too long", 40, s), -1;
    memcpy(buf, s, len);
    buf[len] = 0;
    char *slash = strchr(buf, '/');
    if (slash) *slash = 0;
    memset(c, 0, sizeof *c);
    if (parse_ipv4(buf, c->addr) == 0) c->family = 4;
    else if (strchr(buf, ':') && inet_pton(AF_INET6, buf, c->addr) == 1) c->family = 6;
    else return snprintf(why, whylen, "%.*s: not an IPv4 or IPv6 address", (int)len, s), -1;
    const int max = c->family == 4 ? 32 : 128;
    c->prefix = max;
    if (slash) {
        const char *p = slash + 1;
        int v = 0, k = 0;
        while (p[k] >= '0' && p[k] <= '9' && k < 4) v = v * 10 + (p[k++] - '0');
        if (k == 0 || p[k] || (p[0] == '0' && k > 1) || v > max)
            return snprintf(why, whylen, "%.*s: the prefix length must be a number 0..%d", (int)len, s, max), -1;
        c->prefix = v;
    }
    for (int b = c->prefix; b < max; b++)
        if (c->addr[b / 8] & (0x80u >> (b % 8)))
            return snprintf(why, whylen, "%.*s: host bits are set (the network of that prefix is written with "
                            "zeros there)", (int)len, s), -1;
    return 0;
}

int srv_cidr_parse_list(const char *list, srv_cidr *out, int cap, int *n, char *why, size_t whylen)
{
    *n = 0;
    const char *p = list;
    for (;;) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (*n == cap) return snprintf(why, whylen, "more than %d entries", cap), -1;
        if (parse_cidr(p, len, &out[*n], why, whylen) != 0) return -1;
        ++*n;
        if (!q) return 0;
        p = q + 1;
    }
}

static int in_block(const srv_cidr *c, const uint8_t *a)
{
    int full = c->prefix / 8, rest = c->prefix % 8;
    if (memcmp(c->addr, a, (size_t)full) != 0) return 0;
    return !rest || ((c->addr[full] ^ a[full]) & (0xffu << (8 - rest)) & 0xffu) == 0;
}

int srv_cidr_match(const srv_cidr *list, int n, const char *addr)
{
    uint8_t a6[16], a4[4];
    int have4 = inet_pton(AF_INET, addr, a4) == 1, have6 = !have4 && inet_pton(AF_INET6, addr, a6) == 1;
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (have6 && memcmp(a6, mapped, 12) == 0) { /* ::ffff:a.b.c.d (a dual-stack listener's IPv4 client) */
        memcpy(a4, a6 + 12, 4);
        have4 = 1;
    }
    for (int i = 0; i < n; i++)
        if ((list[i].family == 4 && have4 && in_block(&list[i], a4)) ||
            (list[i].family == 6 && have6 && in_block(&list[i], a6)))
            return 1;
    return 0;
}

static int admin_allowed_addr(const srv_http *s, struct mg_connection *c)
{
    return s->n_admin_allow && srv_cidr_match(s->admin_allow, s->n_admin_allow, mg_get_request_info(c)->remote_addr);
}

/* Admin routes (weights, pause, cache): open to a client inside --admin-allow; else the admin key
 * when one is set; else disabled on a non-loopback listener; else the API key when one is set (an
 * API key protects every route but /health and /metrics); else open (loopback listener), unless an
 * --admin-allow list says who may call without a key. */
static int admin_authorized(const srv_http *s, struct mg_connection *c)
{
    if (admin_allowed_addr(s, c)) return 1;
    if (s->admin_key) return bearer_matches(c, s->admin_key);
    if (s->admin_disabled) return 0;
    if (s->api_key) return bearer_matches(c, s->api_key);
    return !s->n_admin_allow;
}

static int dispatch(srv_http *s, struct mg_connection *c);

int srv_dispatch(struct mg_connection *c, void *cbdata)
{
    srv_http *s = cbdata;
    atomic_fetch_add(&s->active, 1);
    const double t0 = srv_log_access_begin(); /* --access-log: one line per request (server/http/log.c) */
    int st = dispatch(s, c);
    srv_log_access_end(c, st, t0);
    atomic_fetch_sub(&s->active, 1);
    return st;
}

static int dispatch(srv_http *s, struct mg_connection *c)
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
                if (s->admin_key)
                    srv_errf(&e, 401, NULL, "missing or invalid admin key: send 'Authorization: Bearer <admin key>'");
                else if (s->admin_disabled && !s->n_admin_allow)
                    srv_errf(&e, 403, NULL,
                             "weight routes are disabled on a non-loopback listener without --admin-key");
                else if (s->admin_disabled || !s->api_key)
                    srv_errf(&e, 403, NULL, "client address %s is not in --admin-allow, and no --admin-key is set",
                             ri->remote_addr);
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
            return r->fn(s->owner, c);
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

int srv_query_var(struct mg_connection *c, const char *name, char *v, size_t len)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    char tmp[256];
    if (!ri->query_string || len > sizeof tmp) return 0;
    /* (mg_get_var empties its buffer when the variable is absent: read into tmp first) */
    if (mg_get_var(ri->query_string, strlen(ri->query_string), name, tmp, len) < 0) return 0;
    memcpy(v, tmp, strlen(tmp) + 1);
    return 1;
}

int srv_query_seconds(struct mg_connection *c, const char *name, double lo, double hi, double *out)
{
    char v[64];
    if (!srv_query_var(c, name, v, sizeof v)) return 0;
    char *end = NULL;
    errno = 0;
    const double t = strtod(v, &end);
    if (!v[0] || *end || errno || !(t >= lo && t <= hi)) return -1;
    *out = t;
    return 1;
}
