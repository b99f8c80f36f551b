/* server/http/http.h — the HTTP core over civetweb: errors, responses, bounded bodies, SSE, UTF-8,
 * the router and its access rules (API key, admin key, --admin-allow).
 *
 * Nothing here knows the server's state: a route handler receives the srv_state (server/core/srv.h)
 * as an opaque pointer, and the router keeps what it needs (routes, keys, limits) in its own
 * srv_http, a member of srv_state set at start-up and read-only afterwards.
 */
#ifndef GS_SRV_HTTP_H
#define GS_SRV_HTTP_H

#include <civetweb.h>
#include <pthread.h>
#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define SRV_MAX_ROUTES 160 /* every dialect, the weight and memory routes */

typedef struct srv_state srv_state; /* server/core/srv.h */

/* ---- errors ------------------------------------------------------------------------------------- */

/* An error to send as {"error":{"message","type","param","code"}} with HTTP status `status`. */
typedef struct {
    int status;
    const char *type; /* NULL: derived from the status */
    char param[64];   /* "" -> null */
    char msg[768];
} srv_err;

int srv_errf(srv_err *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- routing (http.c) --------------------------------------------------------------------------- */

typedef int (*srv_route_fn)(srv_state *s, struct mg_connection *c);
typedef struct {
    const char *method; /* "GET", "POST" */
    const char *path;   /* an exact path; one ending in '*' is a prefix that matches any path with at
                           least one more character (GET /v1/models/{id}) */
    srv_route_fn fn;
    int auth;           /* 1: needs the API key when one is configured; 2: an admin (weights) route:
                           open to clients inside --admin-allow, else needs the admin key when one is
                           configured, and is disabled on a non-loopback listener without one */
} srv_route;

/* An address block of --admin-allow: family 4 or 6, the network's bytes (host bits zero), prefix. */
typedef struct {
    int family;
    uint8_t addr[16];
    int prefix;
} srv_cidr;
#define SRV_MAX_ADMIN_ALLOW 32

/* Parses a comma-separated list of CIDRs ("10.0.0.0/8,fd00::/8"; a bare address is one host) into
 * out[0..*n). Strict: dotted-quad IPv4 without leading zeros, inet_pton IPv6, a decimal prefix in
 * range, no host bits set, no empty entries. Returns 0, or -1 with why filled. */
int srv_cidr_parse_list(const char *list, srv_cidr *out, int cap, int *n, char *why, size_t whylen);
/* 1 when the textual address addr (a client's remote_addr) lies in one of the blocks (an
 * IPv4-mapped IPv6 address also matches IPv4 blocks). */
int srv_cidr_match(const srv_cidr *list, int n, const char *addr);

/* The router, its access rules and the request limits: filled at start-up (serve.c), read-only
 * while the listener runs (but `active`). */
typedef struct {
    srv_state *owner;           /* what every route receives */
    srv_route routes[SRV_MAX_ROUTES];
    int n_routes;
    const char *api_key;        /* NULL: no auth */
    const char *admin_key;      /* --admin-key (Bearer) for the admin routes; NULL: none */
    int admin_disabled;         /* non-loopback listener without an admin key */
    srv_cidr admin_allow[SRV_MAX_ADMIN_ALLOW]; /* --admin-allow: clients admitted without a key */
    int n_admin_allow;          /* 0: none given (keyless admin access: a loopback listener only) */
    const char *admin_allow_spec; /* the --admin-allow text (start-up log); NULL: none */
    size_t max_body;
    double io_timeout;          /* seconds a client may send nothing while its request is read (slowloris) */
    atomic_int active;          /* handlers inside srv_dispatch (shutdown lets them finish writing) */
} srv_http;

/* Adds a route (at most SRV_MAX_ROUTES: more is a bug, and aborts). */
void srv_route_add(srv_http *h, const char *method, const char *path, srv_route_fn fn, int auth);
/* The one civetweb request handler: exact path lookup, 405 with Allow for a known path with another
 * method, 404 otherwise, auth check, then the route (given h->owner). cbdata is the srv_http. */
int srv_dispatch(struct mg_connection *c, void *cbdata);

/* ---- helpers (http.c, text.c, sse.c) -------------------------------------------------------------------- */

double srv_now(void);        /* monotonic seconds */
double srv_wall(void);       /* wall-clock seconds since the epoch */
/* Every timed wait of the server is on CLOCK_MONOTONIC (a clock step must not fire or stall one):
 * conditions are made with srv_cond_init_monotonic, deadlines are srv_now() seconds, and
 * srv_timespec_at turns one into pthread_cond_timedwait's absolute time. */
void srv_cond_init_monotonic(pthread_cond_t *cv);
struct timespec srv_timespec_at(double t);

/* Query-string variables (decoded). srv_query_var: 1 and the value in v[0..len) when `name` is
 * there (the first one), else 0 with v untouched, so a default written into v beforehand stays.
 * srv_query_seconds: 0 when absent (*out untouched), 1 with *out when it is a number in [lo, hi],
 * -1 otherwise (the caller answers 400). */
int srv_query_var(struct mg_connection *c, const char *name, char *v, size_t len);
int srv_query_seconds(struct mg_connection *c, const char *name, double lo, double hi, double *out);

/* Writes a complete response (one write: status line, headers, body). */
int srv_send(struct mg_connection *c, int status, const char *content_type, const char *extra_headers,
             const char *body, size_t len);
int srv_send_json(struct mg_connection *c, int status, const cJSON *body);
int srv_send_err(struct mg_connection *c, const srv_err *e);
int srv_send_error(struct mg_connection *c, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
const char *srv_err_type(int status);
cJSON *srv_err_json(const srv_err *e);
/* Reads the whole body (bounded by h->max_body, each read by h->io_timeout). Returns a malloc'd NUL-terminated buffer, or NULL
 * with e filled (413 too large, 400 truncated, 408 timed out). */
char *srv_read_body(const srv_http *h, struct mg_connection *c, size_t *len, srv_err *e);
/* Reads and parses the body as a JSON object; NULL with e filled. */
cJSON *srv_read_json(const srv_http *h, struct mg_connection *c, srv_err *e);
/* Parses txt[0..len) as one JSON object (400 with e filled otherwise): nesting deeper than
 * MDL_JSON_MAX_DEPTH, a NUL in a string, invalid JSON, another value, or trailing data. */
cJSON *srv_parse_json_object(const char *txt, size_t len, srv_err *e);

/* A growable byte buffer (responses, SSE batches, the metrics page, rendered chat templates). Out of
 * memory sets oom and makes later appends no-ops; the contents stay NUL-terminated. */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} srv_buf;
void srv_buf_add(srv_buf *b, const char *s, size_t n);
void srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* UTF-8. srv_utf8_stable_len: the length of the longest prefix of s[0..n) that does not end inside
 * a sequence that more bytes could still complete (a streaming writer may send that prefix now). */
size_t srv_utf8_stable_len(const char *s, size_t n);
/* 1 when s[0..n) is valid UTF-8. */
int srv_utf8_valid(const char *s, size_t n);
/* A valid UTF-8 copy of s[0..n) (each invalid or truncated sequence, and NUL, -> U+FFFD), malloc'd. */
char *srv_utf8_sanitize(const char *s, size_t n, size_t *out_len);
/* cJSON string from bytes (invalid UTF-8 -> U+FFFD; NUL kept, written as \u0000 through a raw item).
 * NULL on OOM. */
cJSON *srv_json_bytes(const char *s, size_t n);

/* Server-sent events, shared by the streaming dialects. */
typedef struct {
    struct mg_connection *c;
    int chunked; /* HTTP/1.1: Transfer-Encoding: chunked; HTTP/1.0: raw until close */
    int broken;  /* a write failed: the client is gone */
} srv_sse;
/* Writes the 200 text/event-stream head. */
void srv_sse_begin(srv_sse *so, struct mg_connection *c);
/* Appends "data: <json>\n\n" and frees o. */
void srv_sse_event(srv_buf *b, cJSON *o);
/* Writes b as one HTTP chunk (one write) and empties it. */
void srv_sse_flush(srv_sse *so, srv_buf *b);
/* Ends the chunked body. */
void srv_sse_end(srv_sse *so);

/* Constant-time comparison of two byte strings (time depends only on the lengths). */
int srv_ct_equal(const char *a, size_t an, const char *b, size_t bn);

#endif
