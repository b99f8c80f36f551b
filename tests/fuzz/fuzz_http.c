/* tests/fuzz/fuzz_http.c — libFuzzer harness for HTTP request handling end to end: the real server
 * (srv_cmd_serve: civetweb, the router, every route, the engine thread) runs in this process on
 * 127.0.0.1 with a tiny random model, and each input is sent as raw bytes over a loopback socket.
 * Coverage comes from the server's own code (civetweb is not instrumented); ASan/UBSan watch every
 * thread, so a crash in a handler or the engine is reported against the input that caused it.
 *
 * Each input: connect, write the bytes, shut the write side, read the whole answer (bounded by a
 * receive timeout). Then, so that one input cannot freeze the next (an open weight session or a
 * /pause stops generation until it times out), POST /v1/weights/abort and POST /resume.
 * Properties beyond "no crash": a non-empty answer starts with an HTTP status line with a status
 * in 100..599, never a 500 (the server answers 500 only when out of memory), and a JSON answer's
 * body is one JSON value of exactly its Content-Length.
 * Loopback only; the model folder is a fresh temporary directory.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "models/format/json_guard.h"
#include "models/mkmodel.h"
#include "server/core/cli.h"
#include "server/server.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int g_port;
static char g_model[4096];
static char g_portstr[16];

static void *serve_main(void *arg)
{
    (void)arg;
    char *argv[] = {"serve", "--model", g_model, "--host", "127.0.0.1", "--port", g_portstr,
                    "--http-threads", "8", "--threads", "1", "--max-model-len", "64", "--kv-cache-mb", "4",
                    "--max-seqs", "8", "--request-timeout", "5", "--keep-alive-ms", "200",
                    "--max-body-bytes", "65536", "--max-bucket-bytes", "65536", "--drain-timeout", "1", NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    srv_cmd_serve(argc, argv);
    return NULL;
}

static int connect_lo(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        const int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

/* Sends req, reads the answer into buf (NUL-terminated; at most cap - 1 bytes kept). Returns its length. */
static size_t exchange(const void *req, size_t len, char *buf, size_t cap)
{
    /* libFuzzer's SIGALRM (its -timeout watchdog, no SA_RESTART) interrupts system calls: connect
     * fails with EINTR now and then (a long run failed on one after 37000 inputs), so a failed
     * connect is retried for up to 10 s; the server being gone still fails, with errno */
    int fd = -1;
    for (int i = 0; i < 40 && (fd = connect_lo()) < 0; i++) {
        fprintf(stderr, "fuzz_http: connect to 127.0.0.1:%d failed: %s (try %d)\n", g_port, strerror(errno), i + 1);
        usleep(250000);
    }
    FZ_CHECK(fd >= 0);
    const char *p = req;
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, p + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* the server may close early (a bad request line): fine */
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    size_t n = 0;
    char sink[4096];
    for (;;) {
        char *dst = n + 1 < cap ? buf + n : sink;
        size_t room = n + 1 < cap ? cap - 1 - n : sizeof sink;
        ssize_t r = recv(fd, dst, room, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (dst == buf + n) n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    return n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_model, sizeof g_model, "%s/gs-fuzz-http-XXXXXX", tmp ? tmp : "/tmp");
    FZ_CHECK(mkdtemp(g_model));
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    o.hidden = 64;
    o.layers = 1;
    o.heads = 2;
    o.kv_heads = 1;
    o.head_dim = 32;
    o.intermediate = 64;
    o.vocab = 512;
    o.seed = 7;
    o.tokenizer = 1;
    char err[512];
    if (mdl_mkmodel(&o, g_model, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_http: mkmodel: %s\n", err);
        exit(2);
    }
    /* a free loopback port (the server binds it right after) */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    FZ_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    g_port = ntohs(a.sin_port);
    close(fd);
    snprintf(g_portstr, sizeof g_portstr, "%d", g_port);
    pthread_t t;
    FZ_CHECK(pthread_create(&t, NULL, serve_main, NULL) == 0);
    pthread_detach(t);
    for (int i = 0; i < 600; i++) { /* up to 60 s (ASan start-up) */
        int c = connect_lo();
        if (c >= 0) {
            close(c);
            return 0;
        }
        usleep(100000);
    }
    fprintf(stderr, "fuzz_http: the server did not start on 127.0.0.1:%d\n", g_port);
    exit(2);
}

static void check_answer(const char *buf, size_t n)
{
    if (n == 0) return; /* civetweb may drop a connection it cannot parse at all */
    if (getenv("FZ_HTTP_SHOW")) fprintf(stderr, "fuzz_http: answer (%zu bytes): %.300s\n", n, buf);
    FZ_CHECK(n >= 5 && memcmp(buf, "HTTP/", 5) == 0);
    /* civetweb's own 400 for a malformed request line echoes whatever the client sent as the
     * version, spaces and line breaks included ("HTTP/HTx=1 HTTP/1.1\nTP/2.1 400 ..."): only
     * graphswap's answers (a well-formed request got to a route) carry a checked status line */
    if (n < 13 || (memcmp(buf, "HTTP/1.1 ", 9) != 0 && memcmp(buf, "HTTP/1.0 ", 9) != 0)) return;
    FZ_CHECK(buf[9] >= '1' && buf[9] <= '5' && buf[10] >= '0' && buf[10] <= '9' && buf[11] >= '0' && buf[11] <= '9' &&
             buf[12] == ' ');
    FZ_CHECK(memcmp(buf + 9, "500", 3) != 0);
    /* a JSON answer of graphswap's (srv_send: Content-Type then Content-Length) is one valid JSON
     * value of exactly that length (the first answer only; later pipelined ones are not parsed) */
    const char *eoh = memmem(buf, n, "\r\n\r\n", 4);
    if (!eoh || memcmp(buf + 9, "100", 3) == 0) return;
    const size_t hlen = (size_t)(eoh - buf) + 4;
    static const char tag[] = "\r\nContent-Type: application/json\r\nContent-Length: ";
    const char *ct = memmem(buf, hlen, tag, sizeof tag - 1);
    if (!ct) return;
    const size_t blen = strtoul(ct + sizeof tag - 1, NULL, 10);
    if (hlen + blen > n) return; /* cut off by the buffer */
    mdl_json_result jr;
    cJSON *j = mdl_json_parse(buf + hlen, blen, MDL_JSON_MAX_DEPTH, 0, &jr, NULL, 0);
    FZ_CHECK(j != NULL && jr.end == blen);
    cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char buf[1 << 16];
    size_t n = exchange(data, size, buf, sizeof buf);
    check_answer(buf, n);
    static const char reset[] = "POST /v1/weights/abort HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    static const char resume[] = "POST /resume HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    char small[4096];
    exchange(reset, sizeof reset - 1, small, sizeof small);
    exchange(resume, sizeof resume - 1, small, sizeof small);
    return 0;
}
