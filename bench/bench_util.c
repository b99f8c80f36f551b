#include "bench/bench_util.h"
#include "server/core/cli.h"

#include <errno.h>
#include <stdatomic.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int bench_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n)
{
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void bench_warn(const char *name, const char *msg)
{
    fprintf(stderr, "graphswap bench %s: warning: %s\n", name, msg);
    if (!isatty(STDOUT_FILENO)) printf("warning: %s\n", msg);
}

double bench_preflight(const char *name, const char *what)
{
    printf("graphswap bench %s: %s\n", name, what);
    fflush(stdout);
    char msg[512];
    /* load: other processes compete for the cores every figure here depends on */
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    FILE *f = fopen("/proc/loadavg", "r");
    double load = -1;
    if (f) {
        if (fscanf(f, "%lf", &load) != 1) load = -1;
        fclose(f);
    }
    if (load > (double)cores) {
        snprintf(msg, sizeof msg, "1-minute load average %.2f is above the %ld online cores: figures will be low and noisy",
                 load, cores);
        bench_warn(name, msg);
    }
    /* memory: one thread copying 64 MiB (best of 3). Any recent x86 / arm64 core copies several
     * GB/s; far less means a throttled, overcommitted or swapping machine. */
    const size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (a && b) {
        memset(a, 1, n);
        memset(b, 2, n);
        for (int i = 0; i < 3; i++) {
            double t0 = bench_now();
            memcpy(b, a, n);
            double dt = bench_now() - t0;
            if (dt > 0 && (double)n / dt / 1e9 > best) best = (double)n / dt / 1e9;
        }
        if (b[n / 2] != 1) best = 0; /* (reads the copy: the compiler may not drop it) */
    }
    free(a);
    free(b);
    double expect = BENCH_MEMCPY_EXPECT_GBS;
    const char *env = getenv("GRAPHSWAP_BENCH_MEMCPY_GBS");
    if (env && atof(env) > 0) expect = atof(env);
    if (best < expect / 2) {
        snprintf(msg, sizeof msg, "single-thread memcpy %.2f GB/s is far below the expected %.1f GB/s: the machine is "
                 "loaded or throttled", best, expect);
        bench_warn(name, msg);
    }
    fflush(stdout);
    return best;
}

int bench_connect(bench_conn *c, const char *host, int port)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    c->fd = -1;
    c->pos = c->len = 0;
    if (getaddrinfo(host, ps, &hints, &res) != 0) return -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            c->fd = fd;
            break;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return c->fd >= 0 ? 0 : -1;
}

void bench_close(bench_conn *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->pos = c->len = 0;
}

int bench_fill(bench_conn *c)
{
    if (c->pos < c->len) return 1;
    ssize_t r;
    do r = recv(c->fd, c->buf, sizeof c->buf, 0);
    while (r < 0 && errno == EINTR);
    if (r <= 0) return 0;
    c->pos = 0;
    c->len = (size_t)r;
    return 1;
}

int bench_getc(bench_conn *c) { return bench_fill(c) ? (unsigned char)c->buf[c->pos++] : -1; }

long bench_line(bench_conn *c, char *out, size_t cap)
{
    size_t k = 0;
    for (;;) {
        int ch = bench_getc(c);
        if (ch < 0) return -1;
        if (ch == '\n') break;
        if (k + 1 < cap) out[k++] = (char)ch;
    }
    if (k && out[k - 1] == '\r') k--;
    out[k] = 0;
    return (long)k;
}

int bench_read(bench_conn *c, char *out, size_t n)
{
    while (n) {
        if (!bench_fill(c)) return -1;
        size_t k = c->len - c->pos < n ? c->len - c->pos : n;
        memcpy(out, c->buf + c->pos, k);
        c->pos += k;
        out += k;
        n -= k;
    }
    return 0;
}

int bench_writev_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)(n > 1024 ? 1024 : n)};
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

int bench_send_all(int fd, const char *p, size_t n)
{
    struct iovec iov = {(void *)p, n};
    return bench_writev_all(fd, &iov, 1);
}

static void *drain_stderr(void *arg)
{
    bench_child *ch = arg;
    char buf[4096];
    ssize_t r;
    while ((r = read(ch->err_fd, buf, sizeof buf)) > 0)
        if (fwrite(buf, 1, (size_t)r, stderr) != (size_t)r) break;
    return NULL;
}

int bench_start_server(const char *model, const char *const *extra, double timeout_s, bench_child *ch)
{
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        const char *args[64] = {"graphswap", "serve", "--model", model, "--host", "127.0.0.1", "--port", "0"};
        int k = 8;
        for (int i = 0; extra && extra[i] && k < 63; i++) args[k++] = extra[i];
        args[k] = NULL;
        execv("/proc/self/exe", (char *const *)args);
        _exit(127);
    }
    close(pfd[1]);
    ch->pid = pid;
    ch->err_fd = pfd[0];
    ch->port = 0;
    char line[4096];
    size_t k = 0;
    for (double t0 = bench_now(); bench_now() - t0 < timeout_s;) {
        char c;
        if (read(pfd[0], &c, 1) <= 0) break;
        if (c != '\n') {
            if (k + 1 < sizeof line) line[k++] = c;
            continue;
        }
        line[k] = 0;
        k = 0;
        fprintf(stderr, "%s\n", line);
        const char *u = strstr(line, "http://127.0.0.1:");
        if (u) {
            ch->port = atoi(u + 17);
            break;
        }
    }
    if (ch->port <= 0 || pthread_create(&ch->drain, NULL, drain_stderr, ch) != 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(ch->err_fd);
        ch->pid = -1;
        return -1;
    }
    return 0;
}

void bench_stop_server(bench_child *ch)
{
    if (ch->pid <= 0) return;
    kill(ch->pid, SIGTERM);
    int st = 0, done = 0;
    for (int i = 0; i < 3000 && !done; i++) { /* 60 s, then SIGKILL */
        done = waitpid(ch->pid, &st, WNOHANG) == ch->pid;
        if (!done) usleep(20000);
    }
    if (!done) {
        kill(ch->pid, SIGKILL);
        waitpid(ch->pid, &st, 0);
    }
    pthread_join(ch->drain, NULL);
    close(ch->err_fd);
    ch->pid = -1;
}

int bench_int_list(const char *flag, const char *s, int lo, int hi, int *out, int cap)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < lo || v > hi || n == cap || (*end && *end != ','))
            srv_die("%s: expected a comma-separated list of up to %d integers in [%d, %d], got \"%s\"", flag, cap, lo,
                    hi, s);
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) srv_die("%s: empty list", flag);
    return n;
}

static _Atomic unsigned long long g_sink;

void bench_sink(double v)
{
    unsigned long long bits;
    memcpy(&bits, &v, sizeof bits);
    atomic_fetch_xor_explicit(&g_sink, bits, memory_order_relaxed);
}
