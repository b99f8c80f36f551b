/* server/http/log.h — the operator log: one line per event on stderr, as text or as JSON.
 *
 * Every line is built in a fixed buffer on the caller's stack and written with one write(2), under a
 * mutex: lines from different threads never interleave, and a log shipper reading a pipe gets whole
 * lines (a line is at most SRV_LOG_LINE bytes, below PIPE_BUF). Nothing here allocates, so the
 * engine thread may log between steps.
 *
 * Formats (--log-format):
 *   text  2026-01-31 12:00:00.123 INFO  engine: message | key=value key="a value"
 *   json  {"ts": "2026-01-31T12:00:00.123Z", "level": "info", "event": "engine", "msg": "message",
 *          "key": value, ...}   (one object per line; ", " and ": " separators, like Python's json)
 */
#ifndef GS_SRV_LOG_H
#define GS_SRV_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "engine/weights.h"

struct mg_connection;
typedef struct eng_engine eng_engine;

#define SRV_LOG_LINE 4000

typedef enum { SRV_LOG_TEXT = 0, SRV_LOG_JSON = 1 } srv_log_format;

/* Process-wide settings (set once at start-up, before other threads log). */
int srv_log_parse_format(const char *s, srv_log_format *out); /* 0, or -1 for an unknown name */
void srv_log_set_format(srv_log_format f);
srv_log_format srv_log_get_format(void);
void srv_log_set_access(int on); /* --access-log */
int srv_log_access_enabled(void);

/* A line under construction. Fields are appended in order; a line that does not fit is cut at a
 * field boundary and marked ("truncated": true / a trailing "..."). */
typedef struct {
    char buf[SRV_LOG_LINE];
    size_t n;
    int full;
    int fields; /* fields appended so far (text: the first is set off from the message by " |") */
} srv_logline;

/* level: "info", "warn" or "error". msg may be NULL (no message). */
void srv_log_begin(srv_logline *l, const char *level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void srv_log_str(srv_logline *l, const char *key, const char *val); /* NULL: json null, text "-" */
void srv_log_int(srv_logline *l, const char *key, long long v);
void srv_log_num(srv_logline *l, const char *key, double v, int decimals); /* non-finite: null */
void srv_log_bool(srv_logline *l, const char *key, int v);
void srv_log_end(srv_logline *l); /* writes the line (one write) */

/* A line with only a message. */
void srv_logf(const char *level, const char *event, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Access log (server/http/http.c srv_dispatch): begin returns a start time (0 when the access log is
 * off) and zeroes this thread's byte count; end logs method, path, status, bytes written and the
 * duration. Bytes are counted by a link-time wrapper of mg_write (see log.c). */
double srv_log_access_begin(void);
void srv_log_access_end(const struct mg_connection *c, int status, double t0);

/* Engine thread, after every weight command (server/weights/weights_api.c): logs one line when the command
 * ended a session — "weights" (version, bytes, GB/s, buckets, hook runs, ms) after a successful
 * finish, "weights_failed" (with the reason) after a failed one or an abort. `err` is the command's
 * error message ("" when none). */
void srv_log_weight_cmd(const eng_engine *e, int status, const char *err);

#endif
