/* bench/bench_util.h — what the HTTP benchmarks share: a monotonic clock, a keep-alive HTTP/1.1
 * connection's byte plumbing, and the `graphswap serve` child they start on a free loopback port. */
#ifndef GS_BENCH_UTIL_H
#define GS_BENCH_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

double bench_now(void); /* monotonic seconds */

typedef struct {
    int fd; /* -1: not connected */
    char buf[65536];
    size_t pos, len;
} bench_conn;

int bench_connect(bench_conn *c, const char *host, int port); /* TCP_NODELAY; 0 or -1 */
void bench_close(bench_conn *c);
int bench_fill(bench_conn *c);                          /* 1 when buffered bytes are available */
int bench_getc(bench_conn *c);                          /* next byte, -1 at EOF / error */
long bench_line(bench_conn *c, char *out, size_t cap);  /* a line without CRLF; -1 at EOF */
int bench_read(bench_conn *c, char *out, size_t n);     /* exactly n bytes; 0 or -1 */
int bench_writev_all(int fd, struct iovec *iov, int n); /* consumes iov; 0 or -1 */
int bench_send_all(int fd, const char *p, size_t n);

/* `graphswap serve --model M --host 127.0.0.1 --port 0 [extra...]` started from this binary; its
 * stderr is echoed (a thread keeps draining it, so a chatty server never blocks on the pipe). */
typedef struct {
    pid_t pid;
    int err_fd;
    int port;
    pthread_t drain;
} bench_child;

/* extra: NULL-terminated further arguments. Returns 0 once the server printed its port (within
 * timeout_s), else -1 (the child is killed). */
int bench_start_server(const char *model, const char *const *extra, double timeout_s, bench_child *ch);
/* SIGTERM, wait up to 60 s, then SIGKILL. */
void bench_stop_server(bench_child *ch);

/* The start of every bench: one line saying what it measures, then warnings when the machine is
 * not in a state to measure anything (a 1-minute load average above the online cores, or a
 * single-thread memcpy far below BENCH_MEMCPY_EXPECT_GBS; GRAPHSWAP_BENCH_MEMCPY_GBS overrides the
 * expected figure). Warnings go to stderr, and to stdout too when stdout is not a terminal, so a
 * saved result file carries them. Returns the measured memcpy GB/s. */
#define BENCH_MEMCPY_EXPECT_GBS 4.0
double bench_preflight(const char *name, const char *what);

/* qsort's comparison of doubles, ascending */
int bench_cmp_double(const void *a, const void *b);
/* Sorts v[0..n) ascending in place and returns its median (the mean of the middle two for even n;
 * 0 for n = 0). */
double bench_median(double *v, int n);

/* Consumes a computed value so the compiler cannot drop the loop that made it (timing loops on
 * pool threads; thread-safe, any number of threads). */
void bench_sink(double v);

/* "1,4,16" -> out[]: at most cap integers in [lo, hi], comma-separated; dies with a message naming
 * flag on anything else. Returns the count (>= 1). */
int bench_int_list(const char *flag, const char *s, int lo, int hi, int *out, int cap);

/* The FMA (bf16_dot 1: vdpbf16ps; 2: AMX TDPBF16PS, 0 without native AMX) throughput of every pool thread together, GFLOP/s, best of 5 runs
 * of independent chains in the widest vector the kernels use (bench/bench_prefill.c); *isa_name:
 * that instruction set's name. */
typedef struct kern_pool kern_pool;
double bench_fma_peak(kern_pool *pool, const char **isa_name, int bf16_dot);

#endif
