/* tests/unit/test_tcpstore.c — server/rendezvous/tcpstore.c against hostile or broken peers: a scripted fake
 * store in a thread sends short reads, oversized lengths, silence, wrong nonces and wrong reply
 * bytes; every call must fail with the right code and message within its deadline, never hang or
 * over-allocate. Plus the strict unpickler on hand-built pickles (the exact vLLM stream, accepted,
 * and mutations of it, refused) and the framework key builder. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "server/rendezvous/tcpstore.h"

/* ---- a scripted peer ---- */

typedef enum {
    P_BAD_NONCE,   /* answers PING with another number */
    P_SILENT_PING, /* never answers PING */
    P_CLOSE_PING,  /* closes after 2 of the 4 PING reply bytes */
    P_GET_HUGE,    /* GET reply announces 1 TiB */
    P_GET_SHORT,   /* GET reply: 128 announced, 10 sent, close */
    P_GET_LEN_CUT, /* GET reply: 3 bytes of the length, close */
    P_GET_SILENT,  /* no GET reply */
    P_WAIT_CANCEL, /* WAIT never answered; CANCEL_WAIT answered; then a SET must arrive */
    P_WAIT_LATE,   /* WAIT answered only with the cancel: STOP_WAITING then WAIT_CANCELED */
    P_BAD_WAIT,    /* WAIT answered with 7 */
    P_ADD,         /* ADD answered 41 + delta */
    P_ID,          /* join (ADD) then WAIT/GET answered with `id_len` bytes */
} script;

typedef struct {
    int lfd, port;
    script sc;
    size_t id_len;
    int ok;              /* the peer saw what it expected */
    char set_key[128];   /* P_WAIT_CANCEL: the key of the SET after the cancel; P_ID: the GET key */
    pthread_t t;
} peer;

static int rd(int fd, void *buf, size_t n)
{
    unsigned char *p = buf;
    size_t off = 0;
    while (off < n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 5000) <= 0) return -1;
        ssize_t r = recv(fd, p + off, n - off, 0);
        if (r <= 0) return -1;
        off += (size_t)r;
    }
    return 0;
}

static uint64_t u64le(const unsigned char *c)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | c[i];
    return v;
}

static int rd_vec(int fd, char *out, size_t cap)
{
    unsigned char h[8];
    if (rd(fd, h, 8)) return -1;
    uint64_t n = u64le(h);
    if (n >= cap) return -1;
    if (n && rd(fd, out, (size_t)n)) return -1;
    out[n] = 0;
    return 0;
}

/* one request: its type byte; the key (first key for WAIT) in key */
static int rd_req(int fd, int *type, char *key, size_t cap)
{
    unsigned char q;
    if (rd(fd, &q, 1)) return -1;
    *type = q;
    char junk[256];
    unsigned char h[8];
    switch (q) {
    case 6: /* WAIT: count, keys */
        if (rd(fd, h, 8) || u64le(h) != 1) return -1;
        return rd_vec(fd, key, cap);
    case 3: /* GET */
        return rd_vec(fd, key, cap);
    case 4: /* ADD: key, int64 */
        if (rd_vec(fd, key, cap)) return -1;
        return rd(fd, h, 8);
    case 1: /* SET: key, value */
        if (rd_vec(fd, key, cap)) return -1;
        return rd_vec(fd, junk, sizeof junk);
    case 12: /* CANCEL_WAIT */
        return 0;
    }
    return -1;
}

static void send_u64(int fd, uint64_t v)
{
    unsigned char c[8];
    for (int i = 0; i < 8; i++) c[i] = (unsigned char)(v >> (8 * i));
    (void)!send(fd, c, 8, MSG_NOSIGNAL);
}

static void wait_close(int fd)
{
    char b[64];
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    while (poll(&pf, 1, 3000) > 0 && recv(fd, b, sizeof b, 0) > 0) {
    }
}

static void *peer_main(void *arg)
{
    peer *p = arg;
    struct pollfd pf = {.fd = p->lfd, .events = POLLIN};
    if (poll(&pf, 1, 5000) <= 0) return NULL;
    int fd = accept(p->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    unsigned char hs[10];
    if (rd(fd, hs, 10) || hs[0] != 0 || hs[5] != 13) goto out; /* VALIDATE + magic, PING + nonce */
    if (!(hs[1] == 0xCE && hs[2] == 0xF7 && hs[3] == 0x85 && hs[4] == 0x3C)) goto out;
    unsigned char nonce[4];
    memcpy(nonce, hs + 6, 4);
    if (p->sc == P_SILENT_PING) {
        p->ok = 1;
        wait_close(fd);
        goto out;
    }
    if (p->sc == P_BAD_NONCE) nonce[0] ^= 1;
    if (p->sc == P_CLOSE_PING) {
        (void)!send(fd, nonce, 2, MSG_NOSIGNAL);
        p->ok = 1;
        goto out;
    }
    (void)!send(fd, nonce, 4, MSG_NOSIGNAL);
    if (p->sc == P_BAD_NONCE) {
        p->ok = 1;
        wait_close(fd);
        goto out;
    }
    int type;
    char key[128];
    if (p->sc == P_ADD || p->sc == P_ID) {
        if (rd_req(fd, &type, key, sizeof key) || type != 4) goto out;
        send_u64(fd, p->sc == P_ADD ? 41 + 2 : 1);
        if (p->sc == P_ADD) {
            p->ok = strcmp(key, "cnt") == 0;
            wait_close(fd);
            goto out;
        }
    }
    if (rd_req(fd, &type, key, sizeof key) || type != 6) goto out;
    unsigned char b;
    switch (p->sc) {
    case P_BAD_WAIT:
        b = 7;
        (void)!send(fd, &b, 1, MSG_NOSIGNAL);
        p->ok = 1;
        wait_close(fd);
        goto out;
    case P_WAIT_CANCEL:
    case P_WAIT_LATE:
        if (rd_req(fd, &type, key, sizeof key) || type != 12) goto out;
        if (p->sc == P_WAIT_LATE) {
            b = 0;
            (void)!send(fd, &b, 1, MSG_NOSIGNAL);
        }
        b = 1;
        (void)!send(fd, &b, 1, MSG_NOSIGNAL);
        if (rd_req(fd, &type, p->set_key, sizeof p->set_key) || type != 1) goto out;
        p->ok = 1;
        wait_close(fd);
        goto out;
    default: break;
    }
    b = 0;
    (void)!send(fd, &b, 1, MSG_NOSIGNAL); /* STOP_WAITING */
    if (rd_req(fd, &type, key, sizeof key) || type != 3) goto out;
    unsigned char val[256];
    memset(val, 0xAB, sizeof val);
    switch (p->sc) {
    case P_GET_HUGE: send_u64(fd, (uint64_t)1 << 40); break;
    case P_GET_SHORT:
        send_u64(fd, 128);
        (void)!send(fd, val, 10, MSG_NOSIGNAL);
        break;
    case P_GET_LEN_CUT: (void)!send(fd, val, 3, MSG_NOSIGNAL); break;
    case P_GET_SILENT: wait_close(fd); break;
    case P_ID:
        send_u64(fd, p->id_len);
        (void)!send(fd, val, p->id_len, MSG_NOSIGNAL);
        snprintf(p->set_key, sizeof p->set_key, "%s", key);
        wait_close(fd);
        break;
    default: break;
    }
    p->ok = 1;
out:
    close(fd);
    return NULL;
}

static void peer_start(peer *p, script sc)
{
    memset(p, 0, sizeof *p);
    p->sc = sc;
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(p->lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(p->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(p->lfd, 4), 0);
    socklen_t sl = sizeof a;
    getsockname(p->lfd, (struct sockaddr *)&a, &sl);
    p->port = ntohs(a.sin_port);
}

static void peer_run(peer *p)
{
    assert_int_equal(pthread_create(&p->t, NULL, peer_main, p), 0);
}

static void peer_join(peer *p)
{
    pthread_join(p->t, NULL);
    close(p->lfd);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static srv_store *connect_ok(peer *p, int timeout_ms)
{
    srv_store *s = NULL;
    char err[512];
    int rc = srv_store_connect(&s, "127.0.0.1", p->port, timeout_ms, err, sizeof err);
    if (rc) fprintf(stderr, "connect: %s\n", err);
    assert_int_equal(rc, 0);
    return s;
}

/* ---- handshake ---- */

static void test_bad_nonce(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_BAD_NONCE);
    peer_run(&p);
    srv_store *s = NULL;
    char err[512];
    assert_int_equal(srv_store_connect(&s, "127.0.0.1", p.port, 2000, err, sizeof err), SRV_STORE_ERR);
    assert_null(s);
    assert_non_null(strstr(err, "not a TCPStore"));
    peer_join(&p);
    assert_true(p.ok);
}

static void test_silent_ping_times_out(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_SILENT_PING);
    peer_run(&p);
    srv_store *s = NULL;
    char err[512];
    double t0 = now_s();
    int rc = srv_store_connect(&s, "127.0.0.1", p.port, 400, err, sizeof err);
    double dt = now_s() - t0;
    assert_int_equal(rc, SRV_STORE_TIMEOUT);
    assert_true(dt >= 0.35 && dt < 3.0);
    assert_non_null(strstr(err, "PING"));
    peer_join(&p);
    assert_true(p.ok);
}

static void test_ping_short_read(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_CLOSE_PING);
    peer_run(&p);
    srv_store *s = NULL;
    char err[512];
    /* the peer closes mid-reply: connect retries (the listener is gone after one accept) until the
     * deadline, and reports the short read */
    double t0 = now_s();
    int rc = srv_store_connect(&s, "127.0.0.1", p.port, 600, err, sizeof err);
    assert_true(now_s() - t0 < 3.0);
    assert_int_not_equal(rc, 0);
    assert_null(s);
    peer_join(&p);
    assert_true(p.ok);
}

static void test_connect_refused_bounded(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_ADD);
    close(p.lfd); /* nothing listens on that port now */
    srv_store *s = NULL;
    char err[512];
    double t0 = now_s();
    int rc = srv_store_connect(&s, "127.0.0.1", p.port, 500, err, sizeof err);
    double dt = now_s() - t0;
    assert_int_equal(rc, SRV_STORE_TIMEOUT);
    assert_true(dt >= 0.45 && dt < 3.0);
    assert_non_null(strstr(err, "cannot connect"));
}

static void test_bad_args(void **st)
{
    (void)st;
    srv_store *s = NULL;
    char err[256];
    assert_int_equal(srv_store_connect(&s, "127.0.0.1", 0, 100, err, sizeof err), SRV_STORE_ERR);
    assert_int_equal(srv_store_connect(&s, "", 80, 100, err, sizeof err), SRV_STORE_ERR);
    assert_int_equal(srv_store_connect(&s, "127.0.0.1", 80, 0, err, sizeof err), SRV_STORE_ERR);
    assert_int_equal(srv_store_connect(&s, "no such host.invalid", 80, 100, err, sizeof err), SRV_STORE_ERR);
    assert_non_null(strstr(err, "resolve"));
}

/* ---- replies ---- */

static void get_fails(script sc, int want_rc, const char *want_msg)
{
    peer p;
    peer_start(&p, sc);
    peer_run(&p);
    srv_store *s = connect_ok(&p, 500);
    unsigned char *v = (unsigned char *)1;
    size_t n = 99;
    char err[512];
    double t0 = now_s();
    int rc = srv_store_get(s, "/k", &v, &n, err, sizeof err);
    assert_true(now_s() - t0 < 3.0);
    if (rc != want_rc || !strstr(err, want_msg)) fprintf(stderr, "rc %d: %s\n", rc, err);
    assert_int_equal(rc, want_rc);
    assert_non_null(strstr(err, want_msg));
    assert_null(v);
    assert_int_equal(n, 0);
    /* the stream is out of step: further use is refused, not misread */
    assert_int_equal(srv_store_set(s, "/x", "1", 1, err, sizeof err), SRV_STORE_ERR);
    assert_non_null(strstr(err, "out of step"));
    srv_store_close(s);
    peer_join(&p);
    assert_true(p.ok);
}

static void test_get_oversized(void **st)
{
    (void)st;
    get_fails(P_GET_HUGE, SRV_STORE_ERR, "over the 1048576-byte limit");
}

static void test_get_short_value(void **st)
{
    (void)st;
    get_fails(P_GET_SHORT, SRV_STORE_CLOSED, "short read: 10 of 128");
}

static void test_get_cut_length(void **st)
{
    (void)st;
    get_fails(P_GET_LEN_CUT, SRV_STORE_CLOSED, "short read: 3 of 8");
}

static void test_get_silent(void **st)
{
    (void)st;
    get_fails(P_GET_SILENT, SRV_STORE_TIMEOUT, "timed out waiting for the GET reply");
}

static void test_bad_wait_reply(void **st)
{
    (void)st;
    get_fails(P_BAD_WAIT, SRV_STORE_ERR, "sent 7 as a WAIT reply");
}

static void test_wait_timeout_cancels(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_WAIT_CANCEL);
    peer_run(&p);
    srv_store *s = connect_ok(&p, 2000);
    char err[512];
    const char *k = "/never";
    double t0 = now_s();
    assert_int_equal(srv_store_wait(s, &k, 1, 300, err, sizeof err), SRV_STORE_TIMEOUT);
    double dt = now_s() - t0;
    assert_true(dt >= 0.25 && dt < 2.0);
    assert_non_null(strstr(err, "timed out after 300 ms waiting for key /never"));
    /* the cancel was confirmed: the connection is still in step */
    assert_int_equal(srv_store_set(s, "/after", "v", 1, err, sizeof err), 0);
    srv_store_close(s);
    peer_join(&p);
    assert_true(p.ok);
    assert_string_equal(p.set_key, "/after");
}

static void test_wait_late_stop(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_WAIT_LATE);
    peer_run(&p);
    srv_store *s = connect_ok(&p, 2000);
    char err[512];
    const char *k = "/late";
    /* the keys appeared as we cancelled: STOP_WAITING then WAIT_CANCELED, the wait succeeded */
    assert_int_equal(srv_store_wait(s, &k, 1, 200, err, sizeof err), 0);
    assert_int_equal(srv_store_set(s, "/after", "v", 1, err, sizeof err), 0);
    srv_store_close(s);
    peer_join(&p);
    assert_true(p.ok);
}

static void test_add(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_ADD);
    peer_run(&p);
    srv_store *s = connect_ok(&p, 2000);
    char err[512];
    int64_t v = 0;
    assert_int_equal(srv_store_add(s, "cnt", 2, &v, err, sizeof err), 0);
    assert_int_equal(v, 43);
    srv_store_close(s);
    peer_join(&p);
    assert_true(p.ok);
}

static void test_long_key_refused(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_ADD);
    peer_run(&p);
    srv_store *s = connect_ok(&p, 2000);
    char err[512], key[SRV_STORE_MAX_KEY + 2];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = 0;
    assert_int_equal(srv_store_set(s, key, "v", 1, err, sizeof err), SRV_STORE_ERR);
    assert_non_null(strstr(err, "exceeds"));
    assert_int_equal(srv_store_add(s, "cnt", 2, NULL, err, sizeof err), 0); /* still usable */
    srv_store_close(s);
    peer_join(&p);
}

/* ---- rendezvous ---- */

static int join_fetch(peer *p, srv_store_kind kind, const char *group, unsigned char id[SRV_STORE_ID_BYTES],
                      int *rank, char *err, size_t errlen)
{
    srv_store_req req = {.kind = kind, .host = "127.0.0.1", .port = p->port, .rank_offset = 1, .world_size = 2,
                         .group_name = group, .timeout_ms = 2000};
    return srv_store_rendezvous(&req, id, rank, err, errlen);
}

static void test_sglang_id(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_ID);
    p.id_len = 128;
    peer_run(&p);
    unsigned char id[SRV_STORE_ID_BYTES];
    int rank = -1;
    char err[512];
    int rc = join_fetch(&p, SRV_STORE_SGLANG, "grp", id, &rank, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(rank, 1);
    for (int i = 0; i < SRV_STORE_ID_BYTES; i++) assert_int_equal(id[i], 0xAB);
    peer_join(&p);
    assert_true(p.ok);
    assert_string_equal(p.set_key, "/grp/grp//cuda//0");
}

static void test_sglang_id_wrong_size(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_ID);
    p.id_len = 100;
    peer_run(&p);
    unsigned char id[SRV_STORE_ID_BYTES];
    int rank = -1;
    char err[512];
    assert_int_equal(join_fetch(&p, SRV_STORE_SGLANG, "grp", id, &rank, err, sizeof err), SRV_STORE_ERR);
    assert_non_null(strstr(err, "has 100 bytes"));
    assert_int_equal(rank, -1);
    peer_join(&p);
}

static void test_vllm_raw_bytes_refused(void **st)
{
    (void)st;
    peer p;
    peer_start(&p, P_ID);
    p.id_len = 128; /* raw bytes where vLLM sends a pickle */
    peer_run(&p);
    unsigned char id[SRV_STORE_ID_BYTES];
    int rank = -1;
    char err[512];
    assert_int_equal(join_fetch(&p, SRV_STORE_VLLM, NULL, id, &rank, err, sizeof err), SRV_STORE_ERR);
    assert_non_null(strstr(err, "refusing the pickle"));
    peer_join(&p);
    assert_string_equal(p.set_key, "/broadcast_from/0/0");
}

static void test_join_validation(void **st)
{
    (void)st;
    char err[512];
    srv_store_group *g = (srv_store_group *)1;
    int rank = -1;
    srv_store_req base = {.kind = SRV_STORE_VLLM, .host = "127.0.0.1", .port = 1, .rank_offset = 1,
                          .world_size = 2, .timeout_ms = 100};
    srv_store_req r = base;
    r.kind = SRV_STORE_TRL;
    assert_int_equal(srv_store_join(&r, &g, &rank, err, sizeof err), SRV_STORE_ERR);
    assert_null(g);
    assert_non_null(strstr(err, "rank 0"));
    r = base;
    r.rank_offset = 0;
    assert_int_equal(srv_store_join(&r, &g, &rank, err, sizeof err), SRV_STORE_ERR);
    r = base;
    r.rank_offset = 2;
    assert_int_equal(srv_store_join(&r, &g, &rank, err, sizeof err), SRV_STORE_ERR);
    r = base;
    r.world_size = 1;
    assert_int_equal(srv_store_join(&r, &g, &rank, err, sizeof err), SRV_STORE_ERR);
    r = base;
    r.backend = "gloo";
    assert_int_equal(srv_store_join(&r, &g, &rank, err, sizeof err), SRV_STORE_ERR);
    r = base;
    r.kind = SRV_STORE_SGLANG;
    assert_int_equal(srv_store_join(&r, &g, &rank, err, sizeof err), SRV_STORE_ERR); /* no group name */
    assert_non_null(strstr(err, "group_name"));
    r.group_name = "bad\nname";
    assert_int_equal(srv_store_join(&r, &g, &rank, err, sizeof err), SRV_STORE_ERR);
    r.group_name = "g";
    r.world_size = 129;
    assert_int_equal(srv_store_join(&r, &g, &rank, err, sizeof err), SRV_STORE_ERR);
    assert_int_equal(rank, -1);
}

static void test_keys(void **st)
{
    (void)st;
    char k[SRV_STORE_MAX_KEY + 1];
    assert_int_equal(srv_store_key(k, sizeof k, SRV_STORE_VLLM, NULL), 0);
    assert_string_equal(k, "/broadcast_from/0/0");
    assert_int_equal(srv_store_key(k, sizeof k, SRV_STORE_SGLANG, "weight_update_group"), 0);
    assert_string_equal(k, "/weight_update_group/weight_update_group//cuda//0");
    assert_int_equal(srv_store_key(k, 8, SRV_STORE_SGLANG, "weight_update_group"), -1);
    assert_int_equal(srv_store_key(k, sizeof k, SRV_STORE_SGLANG, ""), -1);
    srv_store_kind kind;
    assert_int_equal(srv_store_kind_parse("sglang", &kind), 0);
    assert_int_equal(kind, SRV_STORE_SGLANG);
    assert_int_equal(srv_store_kind_parse("SGLang", &kind), -1);
    assert_true(srv_store_warmup_allreduce(SRV_STORE_VLLM));
    assert_false(srv_store_warmup_allreduce(SRV_STORE_SGLANG));
    int port = 0;
    assert_int_equal(srv_store_parse_port("29500", &port), 0);
    assert_int_equal(port, 29500);
    const char *bad[] = {"", "0", "65536", "-1", "+80", " 80", "80 ", "8o", "123456", "0x50"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_int_equal(srv_store_parse_port(bad[i], &port), -1);
    assert_int_equal(port, 29500);
}

/* ---- the store server, through the client ---- */

typedef struct {
    srv_store_server *sv;
} setter_arg;

static void *late_setter(void *arg)
{
    setter_arg *a = arg;
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
    srv_store_server_set(a->sv, "/late", "L", 1);
    return NULL;
}

static void test_server_roundtrip(void **st)
{
    (void)st;
    char err[512];
    srv_store_server *sv = NULL;
    assert_int_equal(srv_store_server_start(&sv, "127.0.0.1", 0, err, sizeof err), 0);
    int port = srv_store_server_port(sv);
    assert_true(port > 0);
    srv_store *s = NULL;
    assert_int_equal(srv_store_connect(&s, "127.0.0.1", port, 2000, err, sizeof err), 0);
    assert_int_equal(srv_store_set(s, "/a", "xyz", 3, err, sizeof err), 0);
    unsigned char *v;
    size_t n;
    assert_int_equal(srv_store_get(s, "/a", &v, &n, err, sizeof err), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(v, "xyz", 3);
    free(v);
    int64_t c = 0;
    assert_int_equal(srv_store_add(s, "init/", 1, &c, err, sizeof err), 0);
    assert_int_equal(srv_store_add(s, "init/", 1, &c, err, sizeof err), 0);
    assert_int_equal(c, 2);
    assert_int_equal(srv_store_server_wait_count(sv, "init/", 2, 100), 0);
    assert_int_equal(srv_store_server_wait_count(sv, "init/", 3, 100), SRV_STORE_TIMEOUT);
    const char *keys[2] = {"/a", "/b"};
    int ready = -1;
    assert_int_equal(srv_store_check(s, keys, 2, &ready, err, sizeof err), 0);
    assert_int_equal(ready, 0);
    assert_int_equal(srv_store_wait(s, keys, 2, 300, err, sizeof err), SRV_STORE_TIMEOUT); /* cancelled */
    unsigned char *cur;
    size_t cn;
    assert_int_equal(srv_store_compare_set(s, "/b", "", 0, "new", 3, &cur, &cn, err, sizeof err), 0);
    assert_int_equal(cn, 3);
    free(cur);
    assert_int_equal(srv_store_compare_set(s, "/b", "old", 3, "x", 1, &cur, &cn, err, sizeof err), 0);
    assert_memory_equal(cur, "new", 3); /* mismatch: the current value back */
    free(cur);
    assert_int_equal(srv_store_compare_set(s, "/b", "new", 3, "x", 1, &cur, &cn, err, sizeof err), 0);
    assert_int_equal(cn, 1);
    free(cur);
    assert_int_equal(srv_store_wait(s, keys, 2, 300, err, sizeof err), 0);
    int del = 0;
    assert_int_equal(srv_store_delete(s, "/b", &del, err, sizeof err), 0);
    assert_int_equal(del, 1);
    assert_int_equal(srv_store_delete(s, "/b", &del, err, sizeof err), 0);
    assert_int_equal(del, 0);
    /* a WAIT woken by a local set from another thread */
    setter_arg a = {sv};
    pthread_t t;
    pthread_create(&t, NULL, late_setter, &a);
    const char *late = "/late";
    assert_int_equal(srv_store_wait(s, &late, 1, 3000, err, sizeof err), 0);
    pthread_join(t, NULL);
    /* ADD on a non-number: the server drops the connection (addHandler's stoll throws) */
    assert_int_equal(srv_store_add(s, "/a", 1, NULL, err, sizeof err), SRV_STORE_CLOSED);
    srv_store_close(s);
    /* a GET of a missing key (without the WAIT torch sends first): dropped too; the server lives on */
    srv_store *s2 = NULL;
    assert_int_equal(srv_store_connect(&s2, "127.0.0.1", port, 2000, err, sizeof err), 0);
    assert_int_equal(srv_store_set(s2, "/z", "1", 1, err, sizeof err), 0);
    srv_store_close(s2);
    srv_store_server_stop(sv);
}

static void test_server_trl_publishes_pickle(void **st)
{
    (void)st;
    char err[512];
    peer p; /* only for a free port */
    peer_start(&p, P_ADD);
    int port = p.port;
    close(p.lfd);
    unsigned char id[SRV_STORE_ID_BYTES], got[SRV_STORE_ID_BYTES];
    for (int i = 0; i < SRV_STORE_ID_BYTES; i++) id[i] = (unsigned char)(255 - i);
    srv_store_req req = {.kind = SRV_STORE_TRL, .host = "127.0.0.1", .port = port, .world_size = 2,
                         .timeout_ms = 2000};
    srv_store_server *sv = NULL;
    int rc = srv_store_trl_host(&req, id, &sv, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    srv_store *s = NULL;
    assert_int_equal(srv_store_connect(&s, "127.0.0.1", port, 2000, err, sizeof err), 0);
    assert_int_equal(srv_store_add(s, "init/", 1, NULL, err, sizeof err), 0);
    assert_int_equal(srv_store_server_wait_count(sv, "init/", 2, 1000), 0);
    unsigned char *v;
    size_t n;
    assert_int_equal(srv_store_get(s, "/broadcast_from/0/0", &v, &n, err, sizeof err), 0);
    assert_int_equal(srv_store_unpickle_nccl_id(v, n, got, err, sizeof err), 0);
    assert_memory_equal(got, id, SRV_STORE_ID_BYTES);
    free(v);
    srv_store_close(s);
    /* the port is taken now: a second host fails with a message */
    srv_store_server *sv2 = NULL;
    assert_int_equal(srv_store_trl_host(&req, id, &sv2, err, sizeof err), SRV_STORE_ERR);
    assert_non_null(strstr(err, "cannot listen"));
    srv_store_server_stop(sv);
    req.world_size = 1;
    assert_int_equal(srv_store_trl_host(&req, id, &sv2, err, sizeof err), SRV_STORE_ERR);
}

/* ---- the unpickler ---- */

typedef struct {
    int proto;           /* 3: GLOBAL + BINPUT; 4/5: FRAME, STACK_GLOBAL, MEMOIZE */
    const char *mod, *cls, *fn;
    int idlen;
    int dict_opcode;     /* '}' normally */
    int trailing, cut;   /* extra bytes after STOP; bytes removed from the end */
    int bad_get;         /* insert a BINGET of an unset memo slot */
} pk;

static void put(unsigned char *b, size_t *n, const void *p, size_t len)
{
    memcpy(b + *n, p, len);
    *n += len;
}

static void put1(unsigned char *b, size_t *n, int c)
{
    b[(*n)++] = (unsigned char)c;
}

static void put_str(unsigned char *b, size_t *n, const char *s)
{
    put1(b, n, 0x8c);
    put1(b, n, (int)strlen(s));
    put(b, n, s, strlen(s));
    put1(b, n, 0x94);
}

static size_t mkpickle(unsigned char *b, const pk *o, const unsigned char *id)
{
    size_t n = 0;
    put1(b, &n, 0x80);
    put1(b, &n, o->proto);
    size_t frame_at = 0;
    if (o->proto >= 4) {
        put1(b, &n, 0x95);
        frame_at = n;
        n += 8;
    }
    int memo = 0;
    if (o->proto >= 4) {
        put_str(b, &n, "_ctypes");
        put_str(b, &n, o->fn);
        put1(b, &n, 0x93);
        put1(b, &n, 0x94);
        put_str(b, &n, o->mod);
        put_str(b, &n, o->cls);
        put1(b, &n, 0x93);
        put1(b, &n, 0x94);
    } else {
        char g[256];
        int gl = snprintf(g, sizeof g, "c_ctypes\n%s\n", o->fn);
        put(b, &n, g, (size_t)gl);
        put1(b, &n, 'q');
        put1(b, &n, memo++);
        gl = snprintf(g, sizeof g, "c%s\n%s\n", o->mod, o->cls);
        put(b, &n, g, (size_t)gl);
        put1(b, &n, 'q');
        put1(b, &n, memo++);
    }
    if (o->bad_get) {
        put1(b, &n, 'h');
        put1(b, &n, 20);
    }
    put1(b, &n, o->dict_opcode);
    if (o->proto >= 4) put1(b, &n, 0x94);
    else {
        put1(b, &n, 'q');
        put1(b, &n, memo++);
    }
    put1(b, &n, 'C');
    put1(b, &n, o->idlen);
    put(b, &n, id, (size_t)o->idlen);
    const unsigned char tail4[] = {0x94, 0x86, 0x94, 0x86, 0x94, 'R', 0x94, '.'};
    if (o->proto >= 4) put(b, &n, tail4, sizeof tail4);
    else {
        const unsigned char tail3[] = {'q', 3, 0x86, 'q', 4, 0x86, 'q', 5, 'R', 'q', 6, '.'};
        put(b, &n, tail3, sizeof tail3);
    }
    if (o->proto >= 4) {
        uint64_t fl = n - frame_at - 8;
        for (int i = 0; i < 8; i++) b[frame_at + i] = (unsigned char)(fl >> (8 * i));
    }
    for (int i = 0; i < o->trailing; i++) put1(b, &n, '.');
    return n - (size_t)o->cut;
}

static const pk good4 = {4, "vllm.distributed.device_communicators.pynccl_wrapper", "ncclUniqueId", "_unpickle",
                         128, '}', 0, 0, 0};

static int unpickle(const pk *o, char *err, size_t errlen, unsigned char out[128])
{
    unsigned char id[128], b[1024];
    for (int i = 0; i < 128; i++) id[i] = (unsigned char)(i * 3 + 1);
    size_t n = mkpickle(b, o, id);
    memset(out, 0, 128);
    return srv_store_unpickle_nccl_id(b, n, out, err, errlen);
}

static void test_unpickle_accepts(void **st)
{
    (void)st;
    char err[256];
    unsigned char out[128];
    for (int proto = 3; proto <= 5; proto++) {
        pk o = good4;
        o.proto = proto;
        int rc = unpickle(&o, err, sizeof err, out);
        if (rc) fprintf(stderr, "proto %d: %s\n", proto, err);
        assert_int_equal(rc, 0);
        for (int i = 0; i < 128; i++) assert_int_equal(out[i], (unsigned char)(i * 3 + 1));
    }
}

static void refused(pk o, const char *msg)
{
    char err[256] = "";
    unsigned char out[128];
    int rc = unpickle(&o, err, sizeof err, out);
    if (rc == 0 || !strstr(err, msg)) fprintf(stderr, "rc %d: %s (want %s)\n", rc, err, msg);
    assert_int_equal(rc, SRV_STORE_ERR);
    assert_non_null(strstr(err, msg));
}

static void test_unpickle_refuses(void **st)
{
    (void)st;
    pk o = good4;
    o.cls = "Evil";
    refused(o, "the class is not");
    o = good4;
    o.mod = "os";
    refused(o, "the class is not");
    o = good4;
    o.fn = "system";
    refused(o, "not _ctypes._unpickle");
    o = good4;
    o.idlen = 127;
    refused(o, "not 128 long");
    o = good4;
    o.dict_opcode = 'N'; /* None where the instance dict goes */
    refused(o, "opcode 0x4e");
    o = good4;
    o.trailing = 1;
    refused(o, "trailing data");
    o = good4;
    o.cut = 1;
    refused(o, "FRAME longer than the data"); /* a cut protocol-4 stream: its frame overruns */
    o = good4;
    o.proto = 3;
    o.cut = 1;
    refused(o, "no STOP");
    o = good4;
    o.cut = 140;
    refused(o, "refusing the pickle");
    o = good4;
    o.bad_get = 1;
    refused(o, "memo read of an unset index");
    o = good4;
    o.proto = 2;
    refused(o, "pickle protocol 2");

    char err[256];
    unsigned char out[128];
    const unsigned char none[] = {0x80, 4, 'N', '.'};
    assert_int_equal(srv_store_unpickle_nccl_id(none, sizeof none, out, err, sizeof err), SRV_STORE_ERR);
    const unsigned char bytes_only[] = {0x80, 4, 'C', 2, 'a', 'b', '.'};
    assert_int_equal(srv_store_unpickle_nccl_id(bytes_only, sizeof bytes_only, out, err, sizeof err), SRV_STORE_ERR);
    assert_non_null(strstr(err, "not a reduction"));
    const unsigned char huge_frame[] = {0x80, 4, 0x95, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '.'};
    assert_int_equal(srv_store_unpickle_nccl_id(huge_frame, sizeof huge_frame, out, err, sizeof err), SRV_STORE_ERR);
    assert_non_null(strstr(err, "FRAME longer"));
    const unsigned char huge_str[] = {0x80, 4, 'X', 0xff, 0xff, 0xff, 0x7f, 'a', '.'};
    assert_int_equal(srv_store_unpickle_nccl_id(huge_str, sizeof huge_str, out, err, sizeof err), SRV_STORE_ERR);
    assert_int_equal(srv_store_unpickle_nccl_id(NULL, 0, out, err, sizeof err), SRV_STORE_ERR);
    /* a deep stack of tuples: bounded, refused */
    unsigned char deep[64] = {0x80, 4};
    size_t n = 2;
    for (int i = 0; i < 12; i++) deep[n++] = '}';
    deep[n++] = '.';
    assert_int_equal(srv_store_unpickle_nccl_id(deep, n, out, err, sizeof err), SRV_STORE_ERR);
    assert_non_null(strstr(err, "stack too deep"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_nonce),
        cmocka_unit_test(test_silent_ping_times_out),
        cmocka_unit_test(test_ping_short_read),
        cmocka_unit_test(test_connect_refused_bounded),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_get_oversized),
        cmocka_unit_test(test_get_short_value),
        cmocka_unit_test(test_get_cut_length),
        cmocka_unit_test(test_get_silent),
        cmocka_unit_test(test_bad_wait_reply),
        cmocka_unit_test(test_wait_timeout_cancels),
        cmocka_unit_test(test_wait_late_stop),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_long_key_refused),
        cmocka_unit_test(test_sglang_id),
        cmocka_unit_test(test_sglang_id_wrong_size),
        cmocka_unit_test(test_vllm_raw_bytes_refused),
        cmocka_unit_test(test_join_validation),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_server_roundtrip),
        cmocka_unit_test(test_server_trl_publishes_pickle),
        cmocka_unit_test(test_unpickle_accepts),
        cmocka_unit_test(test_unpickle_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
