/* server/http/log.c — the operator log (see log.h). */
#include "server/http/log.h"

#include <civetweb.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "server/http/http.h" /* srv_utf8_valid, srv_now */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int log_format = SRV_LOG_TEXT;
static atomic_int log_access = 0;

/* The clocks (declared in http.h): the log's timings and every deadline of the server. */
double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void srv_cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

struct timespec srv_timespec_at(double t)
{
    struct timespec ts;
    const double whole = floor(t);
    ts.tv_sec = (time_t)whole;
    ts.tv_nsec = (long)((t - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

double srv_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int srv_log_parse_format(const char *s, srv_log_format *out)
{
    if (strcmp(s, "text") == 0) *out = SRV_LOG_TEXT;
    else if (strcmp(s, "json") == 0) *out = SRV_LOG_JSON;
    else return -1;
    return 0;
}

void srv_log_set_format(srv_log_format f) { atomic_store(&log_format, (int)f); }
srv_log_format srv_log_get_format(void) { return (srv_log_format)atomic_load(&log_format); }
void srv_log_set_access(int on) { atomic_store(&log_access, on != 0); }
int srv_log_access_enabled(void) { return atomic_load(&log_access); }

/* ---- line building ------------------------------------------------------------------------------- */

/* Room kept at the end of the buffer for the truncation mark and the line end. */
#define TAIL_ROOM 32

static size_t room(const srv_logline *l) { return l->n + TAIL_ROOM < sizeof l->buf ? sizeof l->buf - TAIL_ROOM - l->n : 0; }

static void put(srv_logline *l, const char *s, size_t n)
{
    if (l->full) return;
    if (n > room(l)) {
        l->full = 1;
        return;
    }
    memcpy(l->buf + l->n, s, n);
    l->n += n;
}

static void puts_(srv_logline *l, const char *s) { put(l, s, strlen(s)); }

/* A string as JSON (quoted, escaped; bytes >= 0x80 pass through: the server's strings are UTF-8) or
 * as a text value (quoted when it holds a space, '=' or '"'; control characters as \xNN so a line
 * stays one line). A string that does not fit is cut, and the line marked full. */
static void put_value_str(srv_logline *l, const char *s, int json)
{
    int quote = json || !*s || strpbrk(s, " =\"") != NULL;
    /* a string that is not UTF-8 (a request path is the client's bytes) has its bytes >= 0x80
     * escaped too, so a JSON line always parses */
    const int utf8 = srv_utf8_valid(s, strlen(s));
    size_t save = l->n;
    if (quote) put(l, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p && !l->full; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            put(l, esc, 2);
        } else if (*p < 0x20 || *p == 0x7f || (*p >= 0x80 && !utf8)) {
            snprintf(esc, sizeof esc, json ? "\\u%04x" : "\\x%02x", *p);
            puts_(l, esc);
        } else {
            put(l, (const char *)p, 1);
        }
    }
    if (quote) put(l, "\"", 1);
    if (l->full) l->n = save; /* never a half-escaped value: the line ends before it */
}

static void put_key(srv_logline *l, const char *key)
{
    if (l->full) return;
    if (srv_log_get_format() == SRV_LOG_JSON) {
        put(l, ", \"", 3);
        puts_(l, key);
        put(l, "\": ", 3);
    } else {
        put(l, l->fields ? " " : " | ", l->fields ? 1 : 3);
        puts_(l, key);
        put(l, "=", 1);
    }
    l->fields++;
}

void srv_log_begin(srv_logline *l, const char *level, const char *event, const char *fmt, ...)
{
    l->n = 0;
    l->full = 0;
    l->fields = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char t[48];
    const int json = srv_log_get_format() == SRV_LOG_JSON;
    snprintf(t, sizeof t, json ? "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" : "%04d-%02d-%02d %02d:%02d:%02d.%03d",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(ts.tv_nsec / 1000000));
    char msg[1024] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    }
    if (json) {
        puts_(l, "{\"ts\": \"");
        puts_(l, t);
        puts_(l, "\", \"level\": \"");
        puts_(l, level);
        puts_(l, "\", \"event\": \"");
        puts_(l, event);
        puts_(l, "\"");
        if (fmt) {
            puts_(l, ", \"msg\": ");
            put_value_str(l, msg, 1);
        }
    } else {
        char lv[8];
        size_t i = 0;
        for (; level[i] && i < 5; i++) lv[i] = (char)(level[i] >= 'a' && level[i] <= 'z' ? level[i] - 32 : level[i]);
        for (; i < 5; i++) lv[i] = ' ';
        lv[5] = 0;
        puts_(l, t);
        puts_(l, " ");
        puts_(l, lv);
        puts_(l, " ");
        puts_(l, event);
        puts_(l, ":");
        if (fmt) {
            puts_(l, " ");
            /* the message as it is (unquoted), control characters escaped */
            const int utf8 = srv_utf8_valid(msg, strlen(msg));
            for (const unsigned char *p = (const unsigned char *)msg; *p && !l->full; p++) {
                char esc[8];
                if (*p < 0x20 || *p == 0x7f || (*p >= 0x80 && !utf8)) {
                    snprintf(esc, sizeof esc, "\\x%02x", *p);
                    puts_(l, esc);
                } else {
                    put(l, (const char *)p, 1);
                }
            }
        }
    }
}

void srv_log_str(srv_logline *l, const char *key, const char *val)
{
    size_t save = l->n;
    put_key(l, key);
    if (!val) puts_(l, srv_log_get_format() == SRV_LOG_JSON ? "null" : "-");
    else put_value_str(l, val, srv_log_get_format() == SRV_LOG_JSON);
    if (l->full) l->n = save;
}

static void put_raw_field(srv_logline *l, const char *key, const char *txt)
{
    size_t save = l->n;
    put_key(l, key);
    puts_(l, txt);
    if (l->full) l->n = save;
}

void srv_log_int(srv_logline *l, const char *key, long long v)
{
    char t[32];
    snprintf(t, sizeof t, "%lld", v);
    put_raw_field(l, key, t);
}

void srv_log_num(srv_logline *l, const char *key, double v, int decimals)
{
    char t[64];
    if (!isfinite(v)) snprintf(t, sizeof t, "%s", srv_log_get_format() == SRV_LOG_JSON ? "null" : "-");
    else snprintf(t, sizeof t, "%.*f", decimals < 0 ? 0 : decimals > 9 ? 9 : decimals, v);
    put_raw_field(l, key, t);
}

void srv_log_bool(srv_logline *l, const char *key, int v) { put_raw_field(l, key, v ? "true" : "false"); }

void srv_log_end(srv_logline *l)
{
    const int json = srv_log_get_format() == SRV_LOG_JSON;
    /* the tail room is always there: the marks and the line end fit */
    if (l->full) {
        const char *mark = json ? ", \"truncated\": true" : " ...";
        memcpy(l->buf + l->n, mark, strlen(mark));
        l->n += strlen(mark);
    }
    if (json) l->buf[l->n++] = '}';
    l->buf[l->n++] = '\n';
    pthread_mutex_lock(&log_mu);
    size_t off = 0;
    while (off < l->n) {
        ssize_t w = write(STDERR_FILENO, l->buf + off, l->n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* stderr is gone: nothing to report it to */
        off += (size_t)w;
    }
    pthread_mutex_unlock(&log_mu);
}

void srv_logf(const char *level, const char *event, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_logline l;
    srv_log_begin(&l, level, event, "%s", msg);
    srv_log_end(&l);
}

/* ---- access log ------------------------------------------------------------------------------------ */

/* Bytes a handler thread wrote for the request it is serving. Every response byte goes through
 * mg_write (http.c srv_send, the SSE writer in oai_run.c, the 100-continue in the upload routes),
 * and civetweb has no public accessor for its own count on a server connection, so the graphswap
 * binary is linked with -Wl,--wrap=mg_write (CMakeLists.txt): every call from our objects lands
 * here and civetweb's function is __real_mg_write. One request is served by one thread from
 * dispatch to return, so a thread-local counter is exact. */
static _Thread_local unsigned long long tl_bytes;

int __real_mg_write(struct mg_connection *c, const void *buf, size_t len);
int __wrap_mg_write(struct mg_connection *c, const void *buf, size_t len);
int __wrap_mg_write(struct mg_connection *c, const void *buf, size_t len)
{
    int w = __real_mg_write(c, buf, len);
    if (w > 0) tl_bytes += (unsigned long long)w;
    return w;
}

double srv_log_access_begin(void)
{
    if (!srv_log_access_enabled()) return 0;
    tl_bytes = 0;
    return srv_now();
}

void srv_log_access_end(const struct mg_connection *c, int status, double t0)
{
    if (t0 == 0) return;
    const double ms = (srv_now() - t0) * 1e3;
    const struct mg_request_info *ri = mg_get_request_info(c);
    const char *method = ri && ri->request_method ? ri->request_method : "-";
    const char *path = ri && ri->local_uri ? ri->local_uri : "-";
    srv_logline l;
    /* (the query string and headers are left out: they may carry keys) */
    srv_log_begin(&l, "info", "access", "%s %s %d", method, path, status);
    srv_log_str(&l, "method", method);
    srv_log_str(&l, "path", path);
    srv_log_int(&l, "status", status);
    srv_log_int(&l, "bytes", (long long)tl_bytes);
    srv_log_num(&l, "ms", ms, 2);
    srv_log_str(&l, "remote", ri ? ri->remote_addr : NULL);
    srv_log_end(&l);
}

/* ---- weight updates ---------------------------------------------------------------------------------- */

/* What the last command left (engine thread only): a session ended when a counter moved, or an
 * open session closed without one (an abort before anything was written). */
static uint64_t seen_ok, seen_failed; /* 0: the cold load runs before the engine exists, uncounted */
static int seen_open;
static double session_t0;

void srv_log_weight_cmd(const eng_engine *e, int status, const char *err)
{
    eng_weights_info w;
    eng_weights_get_info(e, &w);
    const double now = srv_now();
    if (w.session_open && !seen_open) session_t0 = now;
    const int ok = w.updates_ok != seen_ok, failed = w.updates_failed != seen_failed;
    const int aborted = !ok && !failed && seen_open && !w.session_open;
    if (ok) {
        const double gbs = w.ms > 0 ? (double)w.bytes / (w.ms * 1e-3) / 1e9 : 0;
        srv_logline l;
        srv_log_begin(&l, "info", "weights", "weight update to version %s: %.1f MB in %.1f ms (%.2f GB/s)",
                      w.version, (double)w.bytes / 1e6, w.ms, gbs);
        srv_log_str(&l, "version", w.version);
        srv_log_int(&l, "version_num", (long long)w.version_num);
        srv_log_int(&l, "bytes", (long long)w.bytes);
        srv_log_int(&l, "tensors", (long long)w.tensors);
        srv_log_int(&l, "buckets", (long long)w.buckets);
        srv_log_num(&l, "gb_s", gbs, 3);
        srv_log_int(&l, "hook_runs_target", (long long)w.hook_runs_target);
        srv_log_int(&l, "hook_runs_draft", (long long)w.hook_runs_draft);
        srv_log_num(&l, "hook_ms", w.hook_ms, 2);
        srv_log_num(&l, "guard_ms", w.guard_ms, 2);
        srv_log_num(&l, "ms", w.ms, 2);
        srv_log_str(&l, "state", eng_wstate_name(w.state));
        srv_log_end(&l);
    } else if (failed || aborted) {
        const char *why = err && *err ? err : w.reason[0] ? w.reason : "aborted";
        srv_logline l;
        srv_log_begin(&l, failed ? "error" : "warn", "weights_failed", "weight update %s: %s",
                      failed ? "failed" : "aborted", why);
        srv_log_str(&l, "reason", why);
        srv_log_int(&l, "status", status);
        srv_log_bool(&l, "aborted", !failed);
        srv_log_str(&l, "state", eng_wstate_name(w.state));
        srv_log_str(&l, "version", w.version);
        if (seen_open) srv_log_num(&l, "ms", (now - session_t0) * 1e3, 2);
        srv_log_end(&l);
    }
    seen_ok = w.updates_ok;
    seen_failed = w.updates_failed;
    seen_open = w.session_open;
}
