/* server/rendezvous/tcpstore.c — c10d TCPStore client and the frameworks' NCCL-id rendezvous (tcpstore.h has
 * the protocol and where it was read). */
#include "server/rendezvous/tcpstore.h"
#include "server/rendezvous/le.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* TCPStoreBackend.hpp: enum class QueryType : uint8_t (declaration order) */
enum {
    Q_VALIDATE = 0,
    Q_SET = 1,
    Q_COMPARE_SET = 2,
    Q_GET = 3,
    Q_ADD = 4,
    Q_CHECK = 5,
    Q_WAIT = 6,
    Q_GETNUMKEYS = 7,
    Q_DELETE_KEY = 8,
    Q_CANCEL_WAIT = 12,
    Q_PING = 13,
};
enum { CHECK_READY = 0, CHECK_NOT_READY = 1 };       /* CheckResponseType */
enum { WAIT_STOP_WAITING = 0, WAIT_CANCELED = 1 };   /* WaitResponseType */
#define VALIDATION_MAGIC 0x3C85F7CEu                 /* validationMagicNumber */
#define CANCEL_DRAIN_MS 5000 /* after a WAIT timed out: how long the server has to confirm the cancel */

struct srv_store {
    int fd;
    int timeout_ms;
    int broken; /* a reply was cut or refused mid-way: the stream is out of step, refuse further use */
    char peer[300];
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms)
{
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- bounded socket I/O ---- */

/* 0 when fd is ready for ev, SRV_STORE_TIMEOUT at the deadline, SRV_STORE_ERR on a poll error */
static int wait_fd(int fd, short ev, int64_t deadline)
{
    for (;;) {
        int64_t rem = deadline - now_ms();
        if (rem <= 0) return SRV_STORE_TIMEOUT;
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, rem > INT_MAX ? INT_MAX : (int)rem);
        if (r < 0) {
            if (errno == EINTR) continue;
            return SRV_STORE_ERR;
        }
        if (r == 0) continue; /* re-check the clock */
        if (p.revents & POLLNVAL) return SRV_STORE_ERR;
        return 0; /* POLLERR / POLLHUP: the next send / recv reports it */
    }
}

static int fail(srv_store *s, int rc, char *err, size_t errlen, const char *fmt, const char *what)
{
    if (s) s->broken = 1;
    snprintf(err, errlen, fmt, what, s ? s->peer : "?");
    return rc;
}

static int send_all(srv_store *s, const void *buf, size_t n, int64_t deadline, const char *what, char *err,
                    size_t errlen)
{
    const unsigned char *p = buf;
    size_t off = 0;
    while (off < n) {
        ssize_t r = send(s->fd, p + off, n - off, MSG_NOSIGNAL);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int w = wait_fd(s->fd, POLLOUT, deadline);
            if (w == SRV_STORE_TIMEOUT)
                return fail(s, w, err, errlen, "TCPStore: timed out sending %s to %s", what);
            if (w) return fail(s, w, err, errlen, "TCPStore: poll failed sending %s to %s", what);
            continue;
        }
        if (r < 0 && (errno == EPIPE || errno == ECONNRESET))
            return fail(s, SRV_STORE_CLOSED, err, errlen, "TCPStore: connection closed sending %s to %s", what);
        char m[160];
        snprintf(m, sizeof m, "TCPStore: send failed (%s) sending %%s to %%s", strerror(errno));
        return fail(s, SRV_STORE_ERR, err, errlen, m, what);
    }
    return 0;
}

static int recv_all(srv_store *s, void *buf, size_t n, int64_t deadline, const char *what, char *err,
                    size_t errlen)
{
    unsigned char *p = buf;
    size_t off = 0;
    while (off < n) {
        ssize_t r = recv(s->fd, p + off, n - off, 0);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        if (r == 0) {
            char m[200];
            snprintf(m, sizeof m,
                     "TCPStore: the store closed the connection during %%s from %%s (short read: %zu of %zu bytes)",
                     off, n);
            return fail(s, SRV_STORE_CLOSED, err, errlen, m, what);
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            int w = wait_fd(s->fd, POLLIN, deadline);
            if (w == SRV_STORE_TIMEOUT)
                return fail(s, w, err, errlen, "TCPStore: timed out waiting for %s from %s", what);
            if (w) return fail(s, w, err, errlen, "TCPStore: poll failed waiting for %s from %s", what);
            continue;
        }
        if (errno == ECONNRESET)
            return fail(s, SRV_STORE_CLOSED, err, errlen, "TCPStore: connection reset during %s from %s", what);
        char m[160];
        snprintf(m, sizeof m, "TCPStore: recv failed (%s) during %%s from %%s", strerror(errno));
        return fail(s, SRV_STORE_ERR, err, errlen, m, what);
    }
    return 0;
}

/* ---- request building: torch's SendBuffer, integers little-endian (x86-64 / aarch64 host order) ---- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
    int oom;
} wbuf;

static void wb_put(wbuf *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void wb_u8(wbuf *b, unsigned v)
{
    unsigned char c = (unsigned char)v;
    wb_put(b, &c, 1);
}

static void wb_u32(wbuf *b, uint32_t v)
{
    unsigned char c[4];
    for (int i = 0; i < 4; i++) c[i] = (unsigned char)(v >> (8 * i));
    wb_put(b, c, 4);
}

static void wb_u64(wbuf *b, uint64_t v)
{
    unsigned char c[8];
    srv_put_le64(c, v);
    wb_put(b, c, 8);
}

static void wb_bytes(wbuf *b, const void *p, size_t n)
{
    wb_u64(b, n);
    if (n) wb_put(b, p, n);
}

static uint32_t rd_u32(const unsigned char *c)
{
    return (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
}

static int check_key(const char *key, char *err, size_t errlen)
{
    if (!key) {
        snprintf(err, errlen, "TCPStore: no key");
        return SRV_STORE_ERR;
    }
    if (strlen(key) > SRV_STORE_MAX_KEY) {
        snprintf(err, errlen, "TCPStore: key of %zu bytes exceeds %d", strlen(key), SRV_STORE_MAX_KEY);
        return SRV_STORE_ERR;
    }
    return 0;
}

static int usable(srv_store *s, char *err, size_t errlen)
{
    if (!s || s->fd < 0) {
        snprintf(err, errlen, "TCPStore: not connected");
        return SRV_STORE_ERR;
    }
    if (s->broken) {
        snprintf(err, errlen, "TCPStore: the connection to %s failed earlier and is out of step", s->peer);
        return SRV_STORE_ERR;
    }
    return 0;
}

static int flush_wb(srv_store *s, wbuf *b, int64_t deadline, const char *what, char *err, size_t errlen)
{
    int rc;
    if (b->oom) {
        snprintf(err, errlen, "TCPStore: out of memory building %s", what);
        rc = SRV_STORE_ERR;
    } else {
        rc = send_all(s, b->p, b->n, deadline, what, err, errlen);
    }
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
    return rc;
}

/* a uint64-length-prefixed vector reply, length bounded */
static int recv_vector(srv_store *s, unsigned char **val, size_t *len, int64_t deadline, const char *what,
                       char *err, size_t errlen)
{
    unsigned char h[8];
    *val = NULL;
    *len = 0;
    int rc = recv_all(s, h, 8, deadline, what, err, errlen);
    if (rc) return rc;
    uint64_t n = srv_le64(h);
    if (n > SRV_STORE_MAX_VALUE) {
        s->broken = 1;
        snprintf(err, errlen, "TCPStore: %s from %s announces %llu bytes, over the %u-byte limit", what, s->peer,
                 (unsigned long long)n, SRV_STORE_MAX_VALUE);
        return SRV_STORE_ERR;
    }
    unsigned char *p = malloc(n ? (size_t)n : 1);
    if (!p) {
        s->broken = 1;
        snprintf(err, errlen, "TCPStore: out of memory for %s", what);
        return SRV_STORE_ERR;
    }
    rc = recv_all(s, p, (size_t)n, deadline, what, err, errlen);
    if (rc) {
        free(p);
        return rc;
    }
    *val = p;
    *len = (size_t)n;
    return 0;
}

static int recv_i64(srv_store *s, int64_t *out, int64_t deadline, const char *what, char *err, size_t errlen)
{
    unsigned char h[8];
    int rc = recv_all(s, h, 8, deadline, what, err, errlen);
    if (rc) return rc;
    uint64_t u = srv_le64(h);
    memcpy(out, &u, sizeof u);
    return 0;
}

/* ---- connect ---- */

static int connect_once(const struct addrinfo *ai, int64_t deadline, int *fd_out, int *err_no)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        *err_no = errno;
        return SRV_STORE_ERR;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            *err_no = errno;
            close(fd);
            return SRV_STORE_ERR;
        }
        int w = wait_fd(fd, POLLOUT, deadline);
        if (w) {
            *err_no = w == SRV_STORE_TIMEOUT ? ETIMEDOUT : EIO;
            close(fd);
            return w;
        }
        int so = 0;
        socklen_t sl = sizeof so;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0 || so != 0) {
            *err_no = so ? so : errno;
            close(fd);
            return SRV_STORE_ERR;
        }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *fd_out = fd;
    return 0;
}

/* VALIDATE then PING (TCPStore::validate / TCPStore::ping), within the connect's deadline */
static int handshake(srv_store *s, int64_t deadline, char *err, size_t errlen)
{
    wbuf b = {0};
    uint32_t nonce = (uint32_t)getpid();
    wb_u8(&b, Q_VALIDATE);
    wb_u32(&b, VALIDATION_MAGIC);
    wb_u8(&b, Q_PING);
    wb_u32(&b, nonce);
    int rc = flush_wb(s, &b, deadline, "VALIDATE + PING", err, errlen);
    if (rc) return rc;
    unsigned char r[4];
    rc = recv_all(s, r, 4, deadline, "the PING reply", err, errlen);
    if (rc) return rc;
    if (rd_u32(r) != nonce) {
        s->broken = 1;
        snprintf(err, errlen, "TCPStore: %s answered PING with %u, expected %u: not a TCPStore", s->peer,
                 rd_u32(r), nonce);
        return SRV_STORE_ERR;
    }
    return 0;
}

int srv_store_connect(srv_store **out, const char *host, int port, int timeout_ms, char *err, size_t errlen)
{
    *out = NULL;
    if (!host || !*host || strlen(host) > 255) {
        snprintf(err, errlen, "TCPStore: bad host");
        return SRV_STORE_ERR;
    }
    if (port < 1 || port > 65535) {
        snprintf(err, errlen, "TCPStore: port %d out of range 1..65535", port);
        return SRV_STORE_ERR;
    }
    if (timeout_ms <= 0) {
        snprintf(err, errlen, "TCPStore: timeout must be positive");
        return SRV_STORE_ERR;
    }
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        snprintf(err, errlen, "TCPStore: cannot resolve %s: %s", host, gai_strerror(g));
        return SRV_STORE_ERR;
    }
    srv_store *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(res);
        snprintf(err, errlen, "TCPStore: out of memory");
        return SRV_STORE_ERR;
    }
    s->fd = -1;
    s->timeout_ms = timeout_ms;
    snprintf(s->peer, sizeof s->peer, "%s:%d", host, port);
    int64_t deadline = now_ms() + timeout_ms;
    int64_t backoff = 50;
    int last_errno = 0, rc = SRV_STORE_ERR, tries = 0;
    char herr[1024] = "";
    for (;;) {
        tries++;
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int fd = -1;
            rc = connect_once(ai, deadline, &fd, &last_errno);
            if (rc == 0) {
                s->fd = fd;
                s->broken = 0;
                rc = handshake(s, deadline, herr, sizeof herr);
                if (rc == 0) goto done;
                close(s->fd);
                s->fd = -1;
                if (rc != SRV_STORE_CLOSED) goto done; /* a live peer that is not a TCPStore: no retry */
            }
        }
        int64_t rem = deadline - now_ms();
        if (rem <= 0) {
            rc = SRV_STORE_TIMEOUT;
            break;
        }
        sleep_ms(backoff < rem ? backoff : rem);
        if (backoff < 1000) backoff *= 2;
    }
done:
    freeaddrinfo(res);
    if (rc) {
        if (herr[0] && rc != SRV_STORE_TIMEOUT)
            snprintf(err, errlen, "%s", herr);
        else
            snprintf(err, errlen, "TCPStore: cannot connect to %s within %d ms (%d tries; last: %s)", s->peer,
                     timeout_ms, tries, herr[0] ? herr : strerror(last_errno ? last_errno : ETIMEDOUT));
        free(s);
        return rc == SRV_STORE_TIMEOUT ? SRV_STORE_TIMEOUT : SRV_STORE_ERR;
    }
    *out = s;
    return 0;
}

void srv_store_close(srv_store *s)
{
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    free(s);
}

void srv_store_set_timeout(srv_store *s, int timeout_ms)
{
    if (s && timeout_ms > 0) s->timeout_ms = timeout_ms;
}

/* ---- queries ---- */

int srv_store_set(srv_store *s, const char *key, const void *val, size_t len, char *err, size_t errlen)
{
    int rc = usable(s, err, errlen);
    if (rc || (rc = check_key(key, err, errlen))) return rc;
    if (len > SRV_STORE_MAX_VALUE) {
        snprintf(err, errlen, "TCPStore: value of %zu bytes over the limit", len);
        return SRV_STORE_ERR;
    }
    wbuf b = {0};
    wb_u8(&b, Q_SET);
    wb_bytes(&b, key, strlen(key));
    wb_bytes(&b, val, len);
    return flush_wb(s, &b, now_ms() + s->timeout_ms, "SET", err, errlen);
}

static int send_keys(srv_store *s, unsigned q, const char *const *keys, size_t n, int64_t deadline,
                     const char *what, char *err, size_t errlen)
{
    if (n == 0 || n > 64) {
        snprintf(err, errlen, "TCPStore: %s of %zu keys (1..64)", what, n);
        return SRV_STORE_ERR;
    }
    for (size_t i = 0; i < n; i++) {
        int rc = check_key(keys[i], err, errlen);
        if (rc) return rc;
    }
    wbuf b = {0};
    wb_u8(&b, q);
    wb_u64(&b, n);
    for (size_t i = 0; i < n; i++) wb_bytes(&b, keys[i], strlen(keys[i]));
    return flush_wb(s, &b, deadline, what, err, errlen);
}

static int recv_wait_reply(srv_store *s, unsigned char *r, int64_t deadline, char *err, size_t errlen)
{
    int rc = recv_all(s, r, 1, deadline, "the WAIT reply", err, errlen);
    if (rc) return rc;
    if (*r != WAIT_STOP_WAITING && *r != WAIT_CANCELED) {
        s->broken = 1;
        snprintf(err, errlen, "TCPStore: %s sent %u as a WAIT reply (0 or 1 expected)", s->peer, *r);
        return SRV_STORE_ERR;
    }
    return 0;
}

int srv_store_wait(srv_store *s, const char *const *keys, size_t n, int timeout_ms, char *err, size_t errlen)
{
    int rc = usable(s, err, errlen);
    if (rc) return rc;
    if (timeout_ms <= 0) timeout_ms = s->timeout_ms;
    int64_t deadline = now_ms() + timeout_ms;
    rc = send_keys(s, Q_WAIT, keys, n, now_ms() + s->timeout_ms, "WAIT", err, errlen);
    if (rc) return rc;
    int w = wait_fd(s->fd, POLLIN, deadline);
    unsigned char r = 0;
    if (w == 0) {
        rc = recv_wait_reply(s, &r, now_ms() + s->timeout_ms, err, errlen);
        if (rc) return rc;
        if (r != WAIT_STOP_WAITING) {
            s->broken = 1;
            snprintf(err, errlen, "TCPStore: %s sent WAIT_CANCELED to a WAIT that was not cancelled", s->peer);
            return SRV_STORE_ERR;
        }
        return 0;
    }
    if (w != SRV_STORE_TIMEOUT) {
        s->broken = 1;
        snprintf(err, errlen, "TCPStore: poll failed waiting for keys on %s", s->peer);
        return SRV_STORE_ERR;
    }
    /* TCPStore::doWait: cancel, then the server answers WAIT_CANCELED (after a STOP_WAITING if the
     * keys appeared meanwhile) */
    wbuf b = {0};
    wb_u8(&b, Q_CANCEL_WAIT);
    int64_t dl = now_ms() + (s->timeout_ms < CANCEL_DRAIN_MS ? s->timeout_ms : CANCEL_DRAIN_MS);
    rc = flush_wb(s, &b, dl, "CANCEL_WAIT", err, errlen);
    if (rc) return rc;
    rc = recv_wait_reply(s, &r, dl, err, errlen);
    if (rc) return rc;
    int appeared = 0;
    if (r == WAIT_STOP_WAITING) {
        appeared = 1;
        rc = recv_wait_reply(s, &r, dl, err, errlen);
        if (rc) return rc;
        if (r != WAIT_CANCELED) {
            s->broken = 1;
            snprintf(err, errlen, "TCPStore: %s did not confirm CANCEL_WAIT", s->peer);
            return SRV_STORE_ERR;
        }
    }
    if (appeared) return 0; /* the keys exist now: the wait's purpose is met */
    snprintf(err, errlen, "TCPStore: timed out after %d ms waiting for key %s%s on %s", timeout_ms, keys[0],
             n > 1 ? " (and others)" : "", s->peer);
    return SRV_STORE_TIMEOUT;
}

int srv_store_get(srv_store *s, const char *key, unsigned char **val, size_t *len, char *err, size_t errlen)
{
    *val = NULL;
    *len = 0;
    int rc = srv_store_wait(s, &key, 1, s ? s->timeout_ms : 0, err, errlen);
    if (rc) return rc;
    int64_t deadline = now_ms() + s->timeout_ms;
    wbuf b = {0};
    wb_u8(&b, Q_GET);
    wb_bytes(&b, key, strlen(key));
    rc = flush_wb(s, &b, deadline, "GET", err, errlen);
    if (rc) return rc;
    return recv_vector(s, val, len, deadline, "the GET reply", err, errlen);
}

int srv_store_add(srv_store *s, const char *key, int64_t delta, int64_t *out, char *err, size_t errlen)
{
    int rc = usable(s, err, errlen);
    if (rc || (rc = check_key(key, err, errlen))) return rc;
    int64_t deadline = now_ms() + s->timeout_ms;
    wbuf b = {0};
    wb_u8(&b, Q_ADD);
    wb_bytes(&b, key, strlen(key));
    uint64_t u;
    memcpy(&u, &delta, sizeof u);
    wb_u64(&b, u);
    rc = flush_wb(s, &b, deadline, "ADD", err, errlen);
    if (rc) return rc;
    int64_t v;
    rc = recv_i64(s, &v, deadline, "the ADD reply", err, errlen);
    if (rc == 0 && out) *out = v;
    return rc;
}

int srv_store_check(srv_store *s, const char *const *keys, size_t n, int *ready, char *err, size_t errlen)
{
    int rc = usable(s, err, errlen);
    if (rc) return rc;
    int64_t deadline = now_ms() + s->timeout_ms;
    rc = send_keys(s, Q_CHECK, keys, n, deadline, "CHECK", err, errlen);
    if (rc) return rc;
    unsigned char r;
    rc = recv_all(s, &r, 1, deadline, "the CHECK reply", err, errlen);
    if (rc) return rc;
    if (r != CHECK_READY && r != CHECK_NOT_READY) {
        s->broken = 1;
        snprintf(err, errlen, "TCPStore: %s sent %u as a CHECK reply (0 or 1 expected)", s->peer, r);
        return SRV_STORE_ERR;
    }
    *ready = r == CHECK_READY;
    return 0;
}

int srv_store_compare_set(srv_store *s, const char *key, const void *expected, size_t exp_len,
                          const void *desired, size_t des_len, unsigned char **cur, size_t *cur_len,
                          char *err, size_t errlen)
{
    *cur = NULL;
    *cur_len = 0;
    int rc = usable(s, err, errlen);
    if (rc || (rc = check_key(key, err, errlen))) return rc;
    if (exp_len > SRV_STORE_MAX_VALUE || des_len > SRV_STORE_MAX_VALUE) {
        snprintf(err, errlen, "TCPStore: COMPARE_SET value over the limit");
        return SRV_STORE_ERR;
    }
    int64_t deadline = now_ms() + s->timeout_ms;
    wbuf b = {0};
    wb_u8(&b, Q_COMPARE_SET);
    wb_bytes(&b, key, strlen(key));
    wb_bytes(&b, expected, exp_len);
    wb_bytes(&b, desired, des_len);
    rc = flush_wb(s, &b, deadline, "COMPARE_SET", err, errlen);
    if (rc) return rc;
    rc = recv_vector(s, cur, cur_len, deadline, "the COMPARE_SET reply", err, errlen);
    if (rc == 0 && *cur_len == 0) {
        free(*cur);
        *cur = NULL;
    }
    return rc;
}

int srv_store_delete(srv_store *s, const char *key, int *deleted, char *err, size_t errlen)
{
    int rc = usable(s, err, errlen);
    if (rc || (rc = check_key(key, err, errlen))) return rc;
    int64_t deadline = now_ms() + s->timeout_ms;
    wbuf b = {0};
    wb_u8(&b, Q_DELETE_KEY);
    wb_bytes(&b, key, strlen(key));
    rc = flush_wb(s, &b, deadline, "DELETE_KEY", err, errlen);
    if (rc) return rc;
    int64_t v;
    rc = recv_i64(s, &v, deadline, "the DELETE_KEY reply", err, errlen);
    if (rc == 0 && deleted) *deleted = v == 1;
    return rc;
}

/* ---- the frameworks' rendezvous ---- */

struct srv_store_group {
    srv_store *s;
    srv_store_kind kind;
    int rank, world;
    char key[SRV_STORE_MAX_KEY + 1];
};

int srv_store_kind_parse(const char *name, srv_store_kind *out)
{
    if (!name) return -1;
    if (strcmp(name, "vllm") == 0) *out = SRV_STORE_VLLM;
    else if (strcmp(name, "sglang") == 0) *out = SRV_STORE_SGLANG;
    else if (strcmp(name, "trl") == 0) *out = SRV_STORE_TRL;
    else return -1;
    return 0;
}

const char *srv_store_kind_name(srv_store_kind k)
{
    switch (k) {
    case SRV_STORE_VLLM: return "vllm";
    case SRV_STORE_SGLANG: return "sglang";
    case SRV_STORE_TRL: return "trl";
    }
    return "?";
}

int srv_store_warmup_allreduce(srv_store_kind kind)
{
    return kind == SRV_STORE_VLLM || kind == SRV_STORE_TRL;
}

int srv_store_parse_port(const char *text, int *port)
{
    if (!text || !*text || strlen(text) > 5) return -1;
    int v = 0;
    for (const char *c = text; *c; c++) {
        if (*c < '0' || *c > '9') return -1;
        v = v * 10 + (*c - '0');
    }
    if (v < 1 || v > 65535) return -1;
    *port = v;
    return 0;
}

static int group_name_ok(const char *g)
{
    if (!g) return 0;
    size_t n = strlen(g);
    if (n == 0 || n > SRV_STORE_MAX_GROUP_NAME) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)g[i] < 0x20 || (unsigned char)g[i] > 0x7e) return 0;
    return 1;
}

int srv_store_key(char *buf, size_t cap, srv_store_kind kind, const char *group_name)
{
    int n;
    switch (kind) {
    case SRV_STORE_VLLM:
    case SRV_STORE_TRL:
        /* vllm-project/vllm@5a6541db9bfa77756459722f69e8c89a0b47a14d vllm/distributed/utils.py
         * StatelessProcessGroup.broadcast_obj: key f"broadcast_from/{src}/{broadcast_send_counter}",
         * store.set(key, pickle.dumps(obj)); PyNcclCommunicator's constructor is the group's first
         * broadcast (src 0, counter 0); TCPStore::set adds keyPrefix_ "/" */
        n = snprintf(buf, cap, "/broadcast_from/0/0");
        break;
    case SRV_STORE_SGLANG:
        /* sgl-project/sglang python/sglang/srt/utils.py init_custom_process_group: rendezvous
         * ("tcp://addr:port") -> TCPStore, store = PrefixStore(group_name, store); torch
         * distributed_c10d.py _new_process_group_helper: prefix_store = PrefixStore(f"{group_name}/",
         * store), backend_prefix_store = PrefixStore(f"{device}/", prefix_store) with device "cuda"
         * for nccl; PrefixStore::joinKey = prefix_ + "/" + key; ProcessGroupNCCL::
         * broadcastUniqueNCCLID: storeKey = std::to_string(ncclCommCounter_++) ("0" for the first
         * communicator), rank 0 sets the raw NCCL_UNIQUE_ID_BYTES */
        if (!group_name_ok(group_name)) return -1;
        n = snprintf(buf, cap, "/%s/%s//cuda//0", group_name, group_name);
        break;
    default: return -1;
    }
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int srv_store_join(const srv_store_req *req, srv_store_group **out, int *rank, char *err, size_t errlen)
{
    *out = NULL;
    if (!req) {
        snprintf(err, errlen, "no rendezvous request");
        return SRV_STORE_ERR;
    }
    const char *fw = srv_store_kind_name(req->kind);
    if (req->kind == SRV_STORE_TRL) {
        /* huggingface/trl@01bd4a596bb79314778ef8647bbba038a650bdcb trl/scripts/vllm_serve.py
         * WeightSyncWorkerExtension.init_communicator: the server's workers take ranks
         * get_world_group().rank (0..) and the trainer world_size - 1, so the server is rank 0: it
         * hosts the TCPStore and creates the id, and the trainer broadcasts from the last rank */
        snprintf(err, errlen,
                 "trl: TRL's init_communicator makes the inference server rank 0 (it hosts the TCPStore and "
                 "creates the NCCL unique id; the trainer is rank world_size-1): there is no store to join, "
                 "host one with srv_store_trl_host");
        return SRV_STORE_ERR;
    }
    if (req->kind != SRV_STORE_VLLM && req->kind != SRV_STORE_SGLANG) {
        snprintf(err, errlen, "unknown framework kind %d", (int)req->kind);
        return SRV_STORE_ERR;
    }
    if (req->backend && strcmp(req->backend, "nccl") != 0) {
        snprintf(err, errlen, "%s: backend \"%.40s\" is not supported (only \"nccl\")", fw, req->backend);
        return SRV_STORE_ERR;
    }
    if (req->world_size < 2 || req->world_size > 65536) {
        snprintf(err, errlen, "%s: world_size %d out of range 2..65536", fw, req->world_size);
        return SRV_STORE_ERR;
    }
    if (req->rank_offset < 1 || req->rank_offset >= req->world_size) {
        snprintf(err, errlen,
                 "%s: rank_offset %d: graphswap's rank must be in 1..world_size-1 (%d); rank 0 is the trainer, "
                 "which hosts the store and creates the NCCL unique id",
                 fw, req->rank_offset, req->world_size - 1);
        return SRV_STORE_ERR;
    }
    if (req->kind == SRV_STORE_SGLANG && req->world_size > 128) {
        /* ProcessGroupNCCL bootstraps groups above TORCH_NCCL_RANKS_PER_ROOT (128) with several roots
         * (ncclCommInitRankScalable, other keys): not implemented */
        snprintf(err, errlen, "sglang: world_size %d above 128 (torch's multi-root NCCL init) is not supported",
                 req->world_size);
        return SRV_STORE_ERR;
    }
    srv_store_group *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return SRV_STORE_ERR;
    }
    g->kind = req->kind;
    g->rank = req->rank_offset;
    g->world = req->world_size;
    if (srv_store_key(g->key, sizeof g->key, req->kind, req->group_name) != 0) {
        snprintf(err, errlen, "%s: group_name must be 1..%d printable ASCII characters", fw,
                 SRV_STORE_MAX_GROUP_NAME);
        free(g);
        return SRV_STORE_ERR;
    }
    char e[400];
    int rc = srv_store_connect(&g->s, req->host, req->port, req->timeout_ms, e, sizeof e);
    if (rc) {
        snprintf(err, errlen, "%s: %s", fw, e);
        free(g);
        return rc;
    }
    /* TCPStore::waitForWorkers: every client with numWorkers set increments initKey_ (no keyPrefix_);
     * rank 0's constructor waits until it reaches world_size (vLLM StatelessProcessGroup.create and
     * torch's _create_c10d_store both pass world_size, wait_for_workers defaults to True) */
    rc = srv_store_add(g->s, "init/", 1, NULL, e, sizeof e);
    if (rc) {
        snprintf(err, errlen, "%s: joining the store: %s", fw, e);
        srv_store_group_close(g);
        return rc;
    }
    *rank = g->rank;
    *out = g;
    return 0;
}

int srv_store_fetch_id(srv_store_group *g, unsigned char id[SRV_STORE_ID_BYTES], int timeout_ms, char *err,
                       size_t errlen)
{
    if (!g) {
        snprintf(err, errlen, "no group");
        return SRV_STORE_ERR;
    }
    const char *fw = srv_store_kind_name(g->kind);
    if (timeout_ms > 0) srv_store_set_timeout(g->s, timeout_ms);
    unsigned char *v = NULL;
    size_t n = 0;
    char e[400];
    int rc = srv_store_get(g->s, g->key, &v, &n, e, sizeof e);
    if (rc) {
        snprintf(err, errlen, "%s: fetching the NCCL unique id (key %s): %s", fw, g->key, e);
        return rc;
    }
    if (g->kind == SRV_STORE_VLLM) {
        rc = srv_store_unpickle_nccl_id(v, n, id, e, sizeof e);
        if (rc) snprintf(err, errlen, "vllm: the value of %s: %s", g->key, e);
    } else if (n != SRV_STORE_ID_BYTES) {
        snprintf(err, errlen, "%s: the value of %s has %zu bytes, not the %d of an ncclUniqueId", fw, g->key, n,
                 SRV_STORE_ID_BYTES);
        rc = SRV_STORE_ERR;
    } else {
        memcpy(id, v, SRV_STORE_ID_BYTES);
    }
    free(v);
    return rc;
}

void srv_store_group_close(srv_store_group *g)
{
    if (!g) return;
    srv_store_close(g->s);
    free(g);
}

int srv_store_rendezvous(const srv_store_req *req, unsigned char id[SRV_STORE_ID_BYTES], int *rank, char *err,
                         size_t errlen)
{
    srv_store_group *g = NULL;
    int r = -1;
    int rc = srv_store_join(req, &g, &r, err, errlen);
    if (rc) return rc;
    rc = srv_store_fetch_id(g, id, req->timeout_ms, err, errlen);
    srv_store_group_close(g);
    if (rc == 0) *rank = r;
    return rc;
}
