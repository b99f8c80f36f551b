/* server/rendezvous/tcpstore_server.c — a minimal c10d TCPStore server, for the one flow in which graphswap is
 * rank 0 and so hosts the store: TRL's /init_communicator (trl/scripts/vllm_serve.py: the inference
 * server's worker rank 0 runs StatelessProcessGroup.create(host, port, rank 0, world_size), i.e.
 * TCPStore(is_master=True), and publishes the NCCL unique id with broadcast_obj; the trainer joins
 * as rank world_size - 1).
 *
 * The query handlers follow pytorch/pytorch@16c9a1823c4917599a5c8f20854e54dd2c46880d
 * torch/csrc/distributed/c10d/store/TCPStoreBackend.cpp (the same protocol as tcpstore.h): a
 * connection's first query must be VALIDATE with the magic; PING echoes its nonce; SET / GET /
 * ADD (decimal text, int64 reply) / CHECK / WAIT (STOP_WAITING when every key exists) /
 * CANCEL_WAIT (WAIT_CANCELED) / DELETE_KEY / GETNUMKEYS / COMPARE_SET as torch's handlers reply. A
 * GET of a missing key closes the connection, as getHandler's tcpStore_.at() throw does.
 *
 * One thread per connection (at most SRV_STORE_SERVER_MAX_CONN), a mutex + condition variable over
 * the key table. Peers are untrusted: keys, values, key counts and the table's total size are
 * bounded, a started message must complete within SRV_STORE_SERVER_MSG_MS, and anything else than
 * the protocol closes that connection (not the server).
 */
#include "server/rendezvous/tcpstore.h"
#include "server/rendezvous/le.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SRV_STORE_SERVER_MAX_CONN 64
#define SRV_STORE_SERVER_MAX_KEYS 4096
#define SRV_STORE_SERVER_MAX_BYTES (64u << 20) /* keys + values held */
#define SRV_STORE_SERVER_MSG_MS 30000        /* a message, once begun, must arrive within this */
#define TICK_MS 100                            /* how often blocked threads look at the stop flag */

enum { Q_VALIDATE, Q_SET, Q_COMPARE_SET, Q_GET, Q_ADD, Q_CHECK, Q_WAIT, Q_GETNUMKEYS, Q_DELETE_KEY,
       Q_CANCEL_WAIT = 12, Q_PING = 13 };

typedef struct {
    char *key;
    unsigned char *val;
    size_t len;
} kv;

typedef struct conn conn;
struct srv_store_server {
    int lfd, port;
    pthread_t acceptor;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    kv *kvs;
    size_t nkv, bytes;
    conn *conns[SRV_STORE_SERVER_MAX_CONN];
};

struct conn {
    srv_store_server *sv;
    int fd;
    int done;
    pthread_t t;
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int stopping(srv_store_server *sv)
{
    pthread_mutex_lock(&sv->mu);
    int s = sv->stop;
    pthread_mutex_unlock(&sv->mu);
    return s;
}

/* 1 readable, 0 tick passed, -1 error / hang-up without data */
static int readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, ms);
    if (r < 0) return errno == EINTR ? 0 : -1;
    if (r == 0) return 0;
    if (p.revents & POLLIN) return 1;
    return -1;
}

/* exactly n bytes; idle_ok: the first byte may take forever (between queries), else the message
 * must arrive within SRV_STORE_SERVER_MSG_MS. 0 ok, -1 closed / error / stop / late */
static int get_bytes(conn *c, void *buf, size_t n, int idle_ok)
{
    unsigned char *p = buf;
    size_t off = 0;
    int64_t deadline = mono_ms() + SRV_STORE_SERVER_MSG_MS;
    while (off < n) {
        if (stopping(c->sv)) return -1;
        if (!(idle_ok && off == 0) && mono_ms() > deadline) return -1;
        int r = readable(c->fd, TICK_MS);
        if (r < 0) return -1;
        if (r == 0) continue;
        ssize_t k = recv(c->fd, p + off, n - off, MSG_DONTWAIT);
        if (k == 0) return -1;
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            return -1;
        }
        off += (size_t)k;
    }
    return 0;
}

static int put_bytes(conn *c, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    size_t off = 0;
    int64_t deadline = mono_ms() + SRV_STORE_SERVER_MSG_MS;
    while (off < n) {
        if (mono_ms() > deadline || stopping(c->sv)) return -1;
        ssize_t k = send(c->fd, p + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            off += (size_t)k;
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
            poll(&pf, 1, TICK_MS);
            continue;
        }
        return -1;
    }
    return 0;
}

static int get_u64(conn *c, uint64_t *v)
{
    unsigned char b[8];
    if (get_bytes(c, b, 8, 0)) return -1;
    *v = srv_le64(b);
    return 0;
}

/* a length-prefixed string or vector, at most max bytes; *out malloc'ed (NUL-terminated) */
static int get_vec(conn *c, size_t max, unsigned char **out, size_t *len)
{
    uint64_t n;
    if (get_u64(c, &n) || n > max) return -1;
    unsigned char *p = malloc((size_t)n + 1);
    if (!p) return -1;
    if (n && get_bytes(c, p, (size_t)n, 0)) {
        free(p);
        return -1;
    }
    p[n] = 0;
    *out = p;
    *len = (size_t)n;
    return 0;
}

static int get_key(conn *c, char **key)
{
    unsigned char *k;
    size_t n;
    if (get_vec(c, SRV_STORE_MAX_KEY * 4, &k, &n)) return -1;
    if (memchr(k, 0, n)) { /* keys are C strings here */
        free(k);
        return -1;
    }
    *key = (char *)k;
    return 0;
}

static int put_vec(conn *c, const unsigned char *p, size_t n)
{
    unsigned char h[8];
    srv_put_le64(h, n);
    return put_bytes(c, h, 8) || (n && put_bytes(c, p, n)) ? -1 : 0;
}

static int put_i64(conn *c, int64_t v)
{
    unsigned char h[8];
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    srv_put_le64(h, u);
    return put_bytes(c, h, 8);
}

/* ---- the table (caller holds mu) ---- */

static kv *find(srv_store_server *sv, const char *key)
{
    for (size_t i = 0; i < sv->nkv; i++)
        if (strcmp(sv->kvs[i].key, key) == 0) return &sv->kvs[i];
    return NULL;
}

/* takes ownership of val; -1 when over the limits (val freed) */
static int put_kv(srv_store_server *sv, const char *key, unsigned char *val, size_t len)
{
    kv *e = find(sv, key);
    size_t klen = strlen(key);
    size_t old = e ? e->len : 0, add = e ? 0 : klen;
    if (sv->bytes - old + len + add > SRV_STORE_SERVER_MAX_BYTES || (!e && sv->nkv >= SRV_STORE_SERVER_MAX_KEYS)) {
        free(val);
        return -1;
    }
    if (!e) {
        if (sv->nkv % 64 == 0) {
            kv *q = realloc(sv->kvs, (sv->nkv + 64) * sizeof *q);
            if (!q) {
                free(val);
                return -1;
            }
            sv->kvs = q;
        }
        char *k = strdup(key);
        if (!k) {
            free(val);
            return -1;
        }
        e = &sv->kvs[sv->nkv++];
        e->key = k;
        e->val = NULL;
        e->len = 0;
    }
    free(e->val);
    sv->bytes = sv->bytes - old + len + add;
    e->val = val;
    e->len = len;
    pthread_cond_broadcast(&sv->cv);
    return 0;
}

static int add_kv(srv_store_server *sv, const char *key, int64_t delta, int64_t *out)
{
    kv *e = find(sv, key);
    long long v = 0;
    if (e) {
        char num[32];
        if (e->len == 0 || e->len >= sizeof num) return -1;
        memcpy(num, e->val, e->len);
        num[e->len] = 0;
        char *end;
        errno = 0;
        v = strtoll(num, &end, 10);
        if (errno || *end) return -1; /* addHandler's std::stoll throws: the connection is dropped */
    }
    if ((delta > 0 && v > INT64_MAX - delta) || (delta < 0 && v < INT64_MIN - delta)) return -1;
    v += delta;
    char txt[32];
    int n = snprintf(txt, sizeof txt, "%lld", v);
    unsigned char *p = malloc((size_t)n);
    if (!p) return -1;
    memcpy(p, txt, (size_t)n);
    if (put_kv(sv, key, p, (size_t)n)) return -1;
    *out = v;
    return 0;
}

/* 1 when key existed (and is gone now), else 0 */
static int del_kv(srv_store_server *sv, const char *key)
{
    kv *e = find(sv, key);
    if (!e) return 0;
    sv->bytes -= e->len + strlen(e->key);
    free(e->key);
    free(e->val);
    *e = sv->kvs[--sv->nkv];
    return 1;
}

/* ---- queries ---- */

static int read_keys(conn *c, char ***keys, size_t *n)
{
    uint64_t k;
    if (get_u64(c, &k) || k == 0 || k > 64) return -1;
    char **ks = calloc((size_t)k, sizeof *ks);
    if (!ks) return -1;
    for (size_t i = 0; i < k; i++) {
        if (get_key(c, &ks[i])) {
            for (size_t j = 0; j < i; j++) free(ks[j]);
            free(ks);
            return -1;
        }
    }
    *keys = ks;
    *n = (size_t)k;
    return 0;
}

static void free_keys(char **ks, size_t n)
{
    for (size_t i = 0; i < n; i++) free(ks[i]);
    free(ks);
}

static int all_exist(srv_store_server *sv, const char *const *ks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!find(sv, ks[i])) return 0;
    return 1;
}

/* Caller holds sv->mu: sleeps on sv->cv until a change or TICK_MS (to look at sv->stop again) */
static void wait_tick(srv_store_server *sv)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* sv->cv has the default clock */
    ts.tv_nsec += (long)TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&sv->cv, &sv->mu, &ts);
}

/* WAIT: reply STOP_WAITING once the keys exist; the client may CANCEL_WAIT meanwhile */
static int do_wait(conn *c, char **ks, size_t n)
{
    srv_store_server *sv = c->sv;
    for (;;) {
        pthread_mutex_lock(&sv->mu);
        int ok = all_exist(sv, (const char *const *)ks, n), stop = sv->stop;
        if (!ok && !stop) {
            wait_tick(sv);
            ok = all_exist(sv, (const char *const *)ks, n);
            stop = sv->stop;
        }
        pthread_mutex_unlock(&sv->mu);
        if (stop) return -1;
        if (ok) {
            unsigned char r = 0; /* STOP_WAITING */
            return put_bytes(c, &r, 1);
        }
        int rd = readable(c->fd, 0);
        if (rd < 0) return -1;
        if (rd > 0) {
            unsigned char q;
            if (get_bytes(c, &q, 1, 0) || q != Q_CANCEL_WAIT) return -1;
            unsigned char r = 1; /* WAIT_CANCELED */
            return put_bytes(c, &r, 1);
        }
    }
}

static int query(conn *c, unsigned q)
{
    srv_store_server *sv = c->sv;
    char *key = NULL;
    unsigned char *v = NULL, *v2 = NULL;
    size_t n = 0, n2 = 0;
    int rc = -1;
    switch (q) {
    case Q_PING: {
        unsigned char nonce[4];
        rc = get_bytes(c, nonce, 4, 0) || put_bytes(c, nonce, 4) ? -1 : 0;
        break;
    }
    case Q_SET:
        if (get_key(c, &key) || get_vec(c, SRV_STORE_MAX_VALUE, &v, &n)) break;
        pthread_mutex_lock(&sv->mu);
        rc = put_kv(sv, key, v, n);
        pthread_mutex_unlock(&sv->mu);
        v = NULL;
        break;
    case Q_GET: {
        if (get_key(c, &key)) break;
        pthread_mutex_lock(&sv->mu);
        kv *e = find(sv, key);
        if (e) {
            n = e->len;
            v = malloc(n ? n : 1);
            if (v) memcpy(v, e->val, n);
        }
        pthread_mutex_unlock(&sv->mu);
        if (v) rc = put_vec(c, v, n); /* a missing key: the connection is closed (getHandler) */
        break;
    }
    case Q_ADD: {
        uint64_t d;
        if (get_key(c, &key) || get_u64(c, &d)) break;
        int64_t delta, out = 0;
        memcpy(&delta, &d, sizeof delta);
        pthread_mutex_lock(&sv->mu);
        rc = add_kv(sv, key, delta, &out);
        pthread_mutex_unlock(&sv->mu);
        if (rc == 0) rc = put_i64(c, out);
        break;
    }
    case Q_CHECK:
    case Q_WAIT: {
        char **ks;
        size_t nk;
        if (read_keys(c, &ks, &nk)) break;
        if (q == Q_CHECK) {
            pthread_mutex_lock(&sv->mu);
            unsigned char r = all_exist(sv, (const char *const *)ks, nk) ? 0 : 1; /* READY / NOT_READY */
            pthread_mutex_unlock(&sv->mu);
            rc = put_bytes(c, &r, 1);
        } else {
            rc = do_wait(c, ks, nk);
        }
        free_keys(ks, nk);
        break;
    }
    case Q_CANCEL_WAIT: {
        unsigned char r = 1;
        rc = put_bytes(c, &r, 1);
        break;
    }
    case Q_DELETE_KEY: {
        if (get_key(c, &key)) break;
        pthread_mutex_lock(&sv->mu);
        int64_t del = del_kv(sv, key);
        pthread_mutex_unlock(&sv->mu);
        rc = put_i64(c, del);
        break;
    }
    case Q_GETNUMKEYS: {
        pthread_mutex_lock(&sv->mu);
        int64_t k = (int64_t)sv->nkv;
        pthread_mutex_unlock(&sv->mu);
        rc = put_i64(c, k);
        break;
    }
    case Q_COMPARE_SET: {
        if (get_key(c, &key) || get_vec(c, SRV_STORE_MAX_VALUE, &v, &n) || get_vec(c, SRV_STORE_MAX_VALUE, &v2, &n2))
            break;
        pthread_mutex_lock(&sv->mu);
        kv *e = find(sv, key);
        unsigned char *reply = NULL;
        size_t rn = 0;
        int ok = 0;
        if (!e) {
            if (n == 0) { /* absent and expected empty: create */
                unsigned char *cp = malloc(n2 ? n2 : 1);
                if (cp && n2) memcpy(cp, v2, n2);
                ok = cp && put_kv(sv, key, cp, n2) == 0;
                reply = v2, rn = n2;
            } else {
                ok = 1, reply = v, rn = n; /* torch "lies": the expected value back */
            }
        } else {
            if (e->len == n && (n == 0 || memcmp(e->val, v, n) == 0)) {
                unsigned char *cp = malloc(n2 ? n2 : 1);
                if (cp && n2) memcpy(cp, v2, n2);
                ok = cp && put_kv(sv, key, cp, n2) == 0;
                e = find(sv, key);
            } else {
                ok = 1;
            }
            if (ok && e) {
                free(v);
                v = malloc(e->len ? e->len : 1);
                ok = v != NULL;
                if (v) memcpy(v, e->val, e->len);
                reply = v, rn = e->len;
            }
        }
        pthread_mutex_unlock(&sv->mu);
        rc = ok ? put_vec(c, reply, rn) : -1;
        break;
    }
    default: break; /* "Unexpected query type": drop the connection */
    }
    free(key);
    free(v);
    free(v2);
    return rc;
}

static void *conn_main(void *arg)
{
    conn *c = arg;
    unsigned char h[5];
    /* the first query must be VALIDATE + the magic (TCPStoreMasterDaemon::query / validateHandler) */
    if (get_bytes(c, h, 5, 1) == 0 && h[0] == Q_VALIDATE && h[1] == 0xCE && h[2] == 0xF7 && h[3] == 0x85 &&
        h[4] == 0x3C) {
        unsigned char q;
        while (get_bytes(c, &q, 1, 1) == 0 && query(c, q) == 0) {
        }
    }
    shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_lock(&c->sv->mu);
    c->done = 1;
    pthread_mutex_unlock(&c->sv->mu);
    return NULL;
}

/* joins finished connection threads; with all = 1, every one (after stop) */
static void reap(srv_store_server *sv, int all)
{
    for (int i = 0; i < SRV_STORE_SERVER_MAX_CONN; i++) {
        pthread_mutex_lock(&sv->mu);
        conn *c = sv->conns[i];
        int done = c && c->done;
        pthread_mutex_unlock(&sv->mu);
        if (!c || (!done && !all)) continue;
        pthread_join(c->t, NULL);
        close(c->fd);
        free(c);
        pthread_mutex_lock(&sv->mu);
        sv->conns[i] = NULL;
        pthread_mutex_unlock(&sv->mu);
    }
}

static void *accept_main(void *arg)
{
    srv_store_server *sv = arg;
    while (!stopping(sv)) {
        reap(sv, 0);
        int r = readable(sv->lfd, TICK_MS);
        if (r <= 0) continue;
        int fd = accept4(sv->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        int slot = -1;
        pthread_mutex_lock(&sv->mu);
        for (int i = 0; i < SRV_STORE_SERVER_MAX_CONN && slot < 0; i++)
            if (!sv->conns[i]) slot = i;
        pthread_mutex_unlock(&sv->mu);
        conn *c = slot >= 0 ? calloc(1, sizeof *c) : NULL;
        if (!c) {
            close(fd); /* full: refuse the connection */
            continue;
        }
        c->sv = sv;
        c->fd = fd;
        if (pthread_create(&c->t, NULL, conn_main, c) != 0) {
            close(fd);
            free(c);
            continue;
        }
        pthread_mutex_lock(&sv->mu);
        sv->conns[slot] = c; /* only this thread fills slots */
        pthread_mutex_unlock(&sv->mu);
    }
    return NULL;
}

int srv_store_server_start(srv_store_server **out, const char *host, int port, char *err, size_t errlen)
{
    *out = NULL;
    if (port < 0 || port > 65535) {
        snprintf(err, errlen, "TCPStore server: port %d out of range", port);
        return SRV_STORE_ERR;
    }
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    int g = getaddrinfo(host && *host ? host : NULL, ps, &hints, &res);
    if (g) {
        snprintf(err, errlen, "TCPStore server: cannot resolve %s: %s", host ? host : "*", gai_strerror(g));
        return SRV_STORE_ERR;
    }
    int fd = -1, e = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SRV_STORE_SERVER_MAX_CONN) != 0) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, errlen, "TCPStore server: cannot listen on %s:%d: %s", host ? host : "*", port,
                 strerror(e ? e : EADDRNOTAVAIL));
        return SRV_STORE_ERR;
    }
    srv_store_server *sv = calloc(1, sizeof *sv);
    if (!sv) {
        close(fd);
        snprintf(err, errlen, "out of memory");
        return SRV_STORE_ERR;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    if (ss.ss_family == AF_INET) sv->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6) sv->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    else sv->port = port;
    sv->lfd = fd;
    pthread_mutex_init(&sv->mu, NULL);
    pthread_cond_init(&sv->cv, NULL);
    if (pthread_create(&sv->acceptor, NULL, accept_main, sv) != 0) {
        close(fd);
        free(sv);
        snprintf(err, errlen, "TCPStore server: cannot start its thread");
        return SRV_STORE_ERR;
    }
    *out = sv;
    return 0;
}

int srv_store_server_port(const srv_store_server *sv)
{
    return sv ? sv->port : 0;
}

int srv_store_server_set(srv_store_server *sv, const char *key, const void *val, size_t len)
{
    if (!sv || !key || strlen(key) > SRV_STORE_MAX_KEY || len > SRV_STORE_MAX_VALUE) return SRV_STORE_ERR;
    unsigned char *p = malloc(len ? len : 1);
    if (!p) return SRV_STORE_ERR;
    if (len) memcpy(p, val, len);
    pthread_mutex_lock(&sv->mu);
    int rc = put_kv(sv, key, p, len);
    pthread_mutex_unlock(&sv->mu);
    return rc ? SRV_STORE_ERR : 0;
}

int srv_store_server_add(srv_store_server *sv, const char *key, int64_t delta, int64_t *out)
{
    if (!sv || !key || strlen(key) > SRV_STORE_MAX_KEY) return SRV_STORE_ERR;
    int64_t v = 0;
    pthread_mutex_lock(&sv->mu);
    int rc = add_kv(sv, key, delta, &v);
    pthread_mutex_unlock(&sv->mu);
    if (rc == 0 && out) *out = v;
    return rc ? SRV_STORE_ERR : 0;
}

/* Waits (sv->mu not held) until ready(sv, arg) holds; SRV_STORE_TIMEOUT after timeout_ms or at stop. */
static int wait_until(srv_store_server *sv, int (*ready)(srv_store_server *, const void *), const void *arg,
                      int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    pthread_mutex_lock(&sv->mu);
    while (!ready(sv, arg)) {
        if (sv->stop || mono_ms() >= deadline) {
            pthread_mutex_unlock(&sv->mu);
            return SRV_STORE_TIMEOUT;
        }
        wait_tick(sv);
    }
    pthread_mutex_unlock(&sv->mu);
    return 0;
}

typedef struct {
    const char *key;
    int64_t target;
} count_arg;

static int count_reached(srv_store_server *sv, const void *arg)
{
    const count_arg *a = arg;
    kv *e = find(sv, a->key);
    if (!e || e->len == 0 || e->len >= 32) return 0;
    char num[32];
    memcpy(num, e->val, e->len);
    num[e->len] = 0;
    return strtoll(num, NULL, 10) >= a->target;
}

int srv_store_server_wait_count(srv_store_server *sv, const char *key, int64_t target, int timeout_ms)
{
    if (!sv || !key) return SRV_STORE_ERR;
    count_arg a = {key, target};
    return wait_until(sv, count_reached, &a, timeout_ms);
}

typedef struct {
    const char *const *keys;
    size_t n;
} keys_arg;

static int keys_exist(srv_store_server *sv, const void *arg)
{
    const keys_arg *a = arg;
    return all_exist(sv, a->keys, a->n);
}

int srv_store_server_wait_keys(srv_store_server *sv, const char *const *keys, size_t n, int timeout_ms)
{
    if (!sv || !keys) return SRV_STORE_ERR;
    keys_arg a = {keys, n};
    return wait_until(sv, keys_exist, &a, timeout_ms);
}

int srv_store_server_delete(srv_store_server *sv, const char *key)
{
    if (!sv || !key) return 0;
    pthread_mutex_lock(&sv->mu);
    int d = del_kv(sv, key);
    pthread_mutex_unlock(&sv->mu);
    return d;
}

void srv_store_server_stop(srv_store_server *sv)
{
    if (!sv) return;
    pthread_mutex_lock(&sv->mu);
    sv->stop = 1;
    pthread_cond_broadcast(&sv->cv);
    pthread_mutex_unlock(&sv->mu);
    pthread_join(sv->acceptor, NULL);
    reap(sv, 1);
    close(sv->lfd);
    for (size_t i = 0; i < sv->nkv; i++) {
        free(sv->kvs[i].key);
        free(sv->kvs[i].val);
    }
    free(sv->kvs);
    pthread_cond_destroy(&sv->cv);
    pthread_mutex_destroy(&sv->mu);
    free(sv);
}

/* ---- TRL: graphswap as rank 0 ---- */

/* pickle.dumps(ncclUniqueId) as Python 3.8+ writes it (protocol 4; see tcpstore_pickle.c for the
 * shape), so the trainer's pickle.loads builds vLLM's class from it */
static size_t pickle_nccl_id(unsigned char *b, const unsigned char id[SRV_STORE_ID_BYTES])
{
    static const char mod[] = "vllm.distributed.device_communicators.pynccl_wrapper";
    size_t n = 0;
    b[n++] = 0x80, b[n++] = 4, b[n++] = 0x95; /* PROTO 4, FRAME */
    size_t fl = n;
    n += 8;
    const char *strs[4] = {"_ctypes", "_unpickle", mod, "ncclUniqueId"};
    for (int i = 0; i < 4; i++) {
        size_t l = strlen(strs[i]);
        b[n++] = 0x8c, b[n++] = (unsigned char)l; /* SHORT_BINUNICODE */
        memcpy(b + n, strs[i], l);
        n += l;
        b[n++] = 0x94; /* MEMOIZE */
        if (i & 1) b[n++] = 0x93, b[n++] = 0x94; /* STACK_GLOBAL, MEMOIZE */
    }
    b[n++] = '}', b[n++] = 0x94;                          /* EMPTY_DICT */
    b[n++] = 'C', b[n++] = SRV_STORE_ID_BYTES;            /* SHORT_BINBYTES 128 */
    memcpy(b + n, id, SRV_STORE_ID_BYTES);
    n += SRV_STORE_ID_BYTES;
    static const unsigned char tail[] = {0x94, 0x86, 0x94, 0x86, 0x94, 'R', 0x94, '.'};
    memcpy(b + n, tail, sizeof tail);
    n += sizeof tail;
    srv_put_le64(b + fl, n - fl - 8);
    return n;
}

int srv_store_trl_host(const srv_store_req *req, const unsigned char id[SRV_STORE_ID_BYTES],
                       srv_store_server **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!req || req->kind != SRV_STORE_TRL) {
        snprintf(err, errlen, "trl: not a TRL request");
        return SRV_STORE_ERR;
    }
    if (req->world_size < 2 || req->world_size > SRV_STORE_SERVER_MAX_CONN) {
        snprintf(err, errlen, "trl: world_size %d out of range 2..%d", req->world_size, SRV_STORE_SERVER_MAX_CONN);
        return SRV_STORE_ERR;
    }
    if (req->port < 1 || req->port > 65535) {
        snprintf(err, errlen, "trl: port %d out of range 1..65535", req->port);
        return SRV_STORE_ERR;
    }
    char e[300];
    srv_store_server *sv;
    if (srv_store_server_start(&sv, req->host, req->port, e, sizeof e) != 0) {
        snprintf(err, errlen, "trl: %s", e);
        return SRV_STORE_ERR;
    }
    /* our own client's waitForWorkers increment (the master counts itself), then rank 0's
     * PyNcclCommunicator broadcast_obj(unique_id, src=0): "/broadcast_from/0/0" */
    unsigned char pk[400];
    size_t n = pickle_nccl_id(pk, id);
    if (srv_store_server_add(sv, "init/", 1, NULL) != 0 || srv_store_server_set(sv, "/broadcast_from/0/0", pk, n)) {
        srv_store_server_stop(sv);
        snprintf(err, errlen, "trl: cannot publish the unique id");
        return SRV_STORE_ERR;
    }
    *out = sv;
    return 0;
}

/* pickle.dumps(text) as Python writes a short str (protocol 4: PROTO, FRAME, SHORT_BINUNICODE,
 * MEMOIZE, STOP); text under 256 bytes. Returns the length written into b (cap >= len + 16). */
static size_t pickle_short_str(unsigned char *b, const char *text)
{
    size_t l = strlen(text), n = 0;
    b[n++] = 0x80, b[n++] = 4, b[n++] = 0x95;
    srv_put_le64(b + n, l + 4); /* the frame: 0x8c, the length byte, the text, 0x94, '.' */
    n += 8;
    b[n++] = 0x8c, b[n++] = (unsigned char)l;
    memcpy(b + n, text, l);
    n += l;
    b[n++] = 0x94, b[n++] = '.';
    return n;
}

/* str(uuid.uuid4()): 16 random bytes, version 4, RFC 4122 variant, 8-4-4-4-12 lowercase hex */
static int uuid4(char out[37])
{
    unsigned char r[16];
    FILE *f = fopen("/dev/urandom", "rb");
    size_t got = f ? fread(r, 1, sizeof r, f) : 0;
    if (f) fclose(f);
    if (got != sizeof r) return -1;
    r[6] = (unsigned char)((r[6] & 0x0f) | 0x40);
    r[8] = (unsigned char)((r[8] & 0x3f) | 0x80);
    int n = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out[n++] = '-';
        n += snprintf(out + n, 3, "%02x", r[i]);
    }
    out[n] = 0;
    return 0;
}

int srv_store_trl_barrier(srv_store_server *sv, int world_size, int64_t *bcast_n, int timeout_ms, char *err,
                          size_t errlen)
{
    if (!sv || world_size < 2 || world_size > SRV_STORE_SERVER_MAX_CONN || !bcast_n || *bcast_n < 1) {
        snprintf(err, errlen, "trl barrier: bad arguments");
        return SRV_STORE_ERR;
    }
    char id[8 + 37], bkey[64];
    if (uuid4(id + 8) != 0) {
        snprintf(err, errlen, "trl barrier: cannot read /dev/urandom for the barrier id");
        return SRV_STORE_ERR;
    }
    memcpy(id, "barrier_", 8);
    snprintf(bkey, sizeof bkey, "/broadcast_from/0/%lld", (long long)*bcast_n);
    unsigned char pk[128];
    size_t pn = pickle_short_str(pk, id);
    /* phase 0: rank 0's broadcast_obj(barrier_id, src=0), the next of its broadcast counter */
    if (srv_store_server_set(sv, bkey, pk, pn) != 0) {
        snprintf(err, errlen, "trl barrier: the store is full");
        return SRV_STORE_ERR;
    }
    ++*bcast_n;
    /* phases 1 and 2: every rank's "arrival_<id>_<r>", then its "departure_<id>_<r>"; rank 0 waits
     * for both before it leaves (it runs the store: the others must be done with it) */
    static const char *const phase[2] = {"arrival", "departure"};
    char keys[2][SRV_STORE_SERVER_MAX_CONN][96];
    const char *kp[SRV_STORE_SERVER_MAX_CONN];
    int rc = 0;
    for (int ph = 0; ph < 2 && rc == 0; ph++) {
        for (int r = 0; r < world_size; r++) {
            snprintf(keys[ph][r], sizeof keys[ph][r], "/%s_%s_%d", phase[ph], id, r);
            kp[r] = keys[ph][r];
        }
        if (srv_store_server_set(sv, kp[0], "1", 1) != 0) {
            snprintf(err, errlen, "trl barrier: the store is full");
            rc = SRV_STORE_ERR;
        } else if (srv_store_server_wait_keys(sv, kp, (size_t)world_size, timeout_ms) != 0) {
            snprintf(err, errlen, "trl barrier: the trainer did not reach the barrier after the broadcast within "
                     "%d ms (phase %s)", timeout_ms, phase[ph]);
            rc = SRV_STORE_TIMEOUT;
        }
        /* every rank has read the barrier id once it has arrived (the id names its arrival key):
         * rank 0 drops it now rather than after vLLM's hour of data expiration, so a long run's
         * per-parameter barriers do not fill the store */
        if (ph == 0 && rc == 0) srv_store_server_delete(sv, bkey);
    }
    for (int ph = 0; ph < 2; ph++) /* as vLLM's rank 0: its arrival and departure keys go */
        for (int r = 0; r < world_size; r++) {
            snprintf(keys[ph][r], sizeof keys[ph][r], "/%s_%s_%d", phase[ph], id, r);
            srv_store_server_delete(sv, keys[ph][r]);
        }
    return rc;
}
