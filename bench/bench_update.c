/* bench/bench_update.c — `graphswap bench update`: weight-update throughput over loopback HTTP.
 *
 * Starts `graphswap serve` (this binary, /proc/self/exe) on a checkpoint — the one given with --model,
 * or a ~0.5 GB qwen3 written into a temporary folder with the in-process mkmodel — on a free loopback
 * port, then pushes full updates of that same checkpoint the way a trainer does: POST
 * /v1/weights/begin, the tensors in buckets of about --bucket-mb MiB (each bucket a safetensors file
 * built in memory: the header is formatted here, the tensor bytes go straight from the mmap'd
 * checkpoint to the socket with writev), POST /v1/weights/finish. Plain sockets, one keep-alive
 * connection.
 *
 * Reported per bucket size: end-to-end GB/s (tensor bytes / wall time from begin to the finish
 * answer) next to the single-thread memcpy bandwidth measured in the same run (an HTTP bucket costs
 * the server at least two copies: socket -> staging buffer -> weights) and the bare loopback TCP
 * rate (one connection, a thread writing 64 MiB chunks to a thread reading them, no HTTP and no
 * weights: the transport's own ceiling on this machine), the finish time (post-load
 * hook + plan guard, from GET /v1/weights last_update) as a share of the total, and the server's
 * resident memory (VmRSS from /proc/PID/status) before the first update, at its peak during the
 * updates (sampled every few ms), after them, and its growth per update. Nothing here asserts a speed.
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "models/mkmodel.h"
#include "models/format/json_guard.h"
#include "models/format/safetensors.h"
#include "bench/bench_util.h"
#include "bench/bench.h"
#include "server/core/cli.h"

int srv_bench_update(int argc, char **argv);


/* ---- the checkpoint: every tensor of every *.safetensors file, mmap'd --------------------------- */

typedef struct {
    mdl_st_file *files;
    int n_files;
    const mdl_st_tensor **t; /* every tensor, file by file in header order */
    size_t n;
    uint64_t bytes;
} bu_ckpt;

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void ckpt_open(const char *dir, bu_ckpt *c)
{
    memset(c, 0, sizeof *c);
    DIR *d = opendir(dir);
    if (!d) srv_die("%s: %s", dir, strerror(errno));
    char **names = NULL;
    int nn = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 12 && strcmp(de->d_name + l - 12, ".safetensors") == 0) {
            names = realloc(names, (size_t)(nn + 1) * sizeof *names);
            if (!names || !(names[nn] = strdup(de->d_name))) srv_die("out of memory");
            nn++;
        }
    }
    closedir(d);
    if (!nn) srv_die("%s: no *.safetensors file", dir);
    qsort(names, (size_t)nn, sizeof *names, name_cmp);
    c->files = calloc((size_t)nn, sizeof *c->files);
    if (!c->files) srv_die("out of memory");
    for (int i = 0; i < nn; i++) {
        char path[8400], err[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (mdl_st_open(path, &c->files[i], err, sizeof err) != 0) srv_die("%s", err);
        c->n_files++;
        c->t = realloc(c->t, (c->n + c->files[i].n) * sizeof *c->t);
        if (!c->t) srv_die("out of memory");
        for (size_t k = 0; k < c->files[i].n; k++) {
            c->t[c->n++] = &c->files[i].tensors[k];
            c->bytes += c->files[i].tensors[k].nbytes;
        }
        free(names[i]);
    }
    free(names);
}

static void ckpt_close(bu_ckpt *c)
{
    for (int i = 0; i < c->n_files; i++) mdl_st_close(&c->files[i]);
    free(c->files);
    free(c->t);
    memset(c, 0, sizeof *c);
}

/* Buckets: consecutive tensors up to `cap` bytes (a larger tensor travels alone). first[b] is the
 * index of bucket b's first tensor; first[nb] == n. */
static size_t *make_buckets(const bu_ckpt *c, uint64_t cap, size_t *nb, uint64_t *largest)
{
    size_t *first = malloc((c->n + 1) * sizeof *first);
    if (!first) srv_die("out of memory");
    size_t k = 0;
    uint64_t cur = 0;
    *largest = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (i == 0 || (cur > 0 && cur + c->t[i]->nbytes > cap)) {
            first[k++] = i;
            cur = 0;
        }
        cur += c->t[i]->nbytes;
        if (cur > *largest) *largest = cur;
    }
    first[k] = c->n;
    *nb = k;
    return first;
}

/* The safetensors header of tensors [a, b) (length prefix included), padded to 8 bytes. */
static char *bucket_header(const bu_ckpt *c, size_t a, size_t b, size_t *len)
{
    size_t cap = 64 + (b - a) * 400, n = 8;
    char *h = malloc(cap);
    if (!h) srv_die("out of memory");
    uint64_t off = 0;
    n += (size_t)snprintf(h + n, cap - n, "{");
    for (size_t i = a; i < b; i++) {
        const mdl_st_tensor *t = c->t[i];
        if (strlen(t->name) > 256) srv_die("tensor name too long: %.40s...", t->name);
        n += (size_t)snprintf(h + n, cap - n, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i > a ? "," : "", t->name,
                              mdl_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) n += (size_t)snprintf(h + n, cap - n, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        n += (size_t)snprintf(h + n, cap - n, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                              (unsigned long long)(off + t->nbytes));
        off += t->nbytes;
    }
    n += (size_t)snprintf(h + n, cap - n, "}");
    while ((n - 8) % 8) h[n++] = ' ';
    uint64_t hl = n - 8;
    for (int i = 0; i < 8; i++) h[i] = (char)(hl >> (8 * i));
    *len = n;
    return h;
}

/* ---- a keep-alive HTTP/1.1 client on one loopback connection -------------------------------------- */

typedef struct {
    int port;
    bench_conn c;
} bu_conn;

/* One request: head + body pieces (iov[1..n-1]; iov[0] is filled with the head here). Returns the
 * HTTP status and the response body (malloc'd, NUL-terminated) in *resp; -1 on a connection error. */
static int bu_request(bu_conn *c, const char *method, const char *path, const char *ctype, struct iovec *iov,
                      int n_iov, char **resp)
{
    *resp = NULL;
    size_t blen = 0;
    for (int i = 1; i < n_iov; i++) blen += iov[i].iov_len;
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                      "Connection: keep-alive\r\n\r\n",
                      method, path, c->port, ctype, blen);
    iov[0].iov_base = head;
    iov[0].iov_len = (size_t)hn;
    if (c->c.fd < 0 && bench_connect(&c->c, "127.0.0.1", c->port) != 0) return -1;
    if (bench_writev_all(c->c.fd, iov, n_iov) != 0) {
        bench_close(&c->c);
        return -1;
    }
    char line[8192];
    if (bench_line(&c->c, line, sizeof line) < 0) {
        bench_close(&c->c);
        return -1;
    }
    int status = 0;
    if (sscanf(line, "HTTP/%*s %d", &status) != 1) {
        bench_close(&c->c);
        return -1;
    }
    long long clen = -1;
    int close_after = 0;
    long ln;
    while ((ln = bench_line(&c->c, line, sizeof line)) > 0) {
        if (strncasecmp(line, "Content-Length:", 15) == 0) clen = atoll(line + 15);
        else if (strncasecmp(line, "Connection:", 11) == 0 && strstr(line, "close")) close_after = 1;
    }
    if (ln < 0 || clen < 0 || clen > (1 << 26)) {
        bench_close(&c->c);
        return -1;
    }
    char *body = malloc((size_t)clen + 1);
    if (!body) srv_die("out of memory");
    for (long long i = 0; i < clen; i++) {
        int ch = bench_getc(&c->c);
        if (ch < 0) {
            free(body);
            bench_close(&c->c);
            return -1;
        }
        body[i] = (char)ch;
    }
    body[clen] = 0;
    *resp = body;
    if (close_after) bench_close(&c->c);
    return status;
}

static cJSON *bu_json(bu_conn *c, const char *method, const char *path, const char *body, int want)
{
    struct iovec iov[2] = {{0}, {(void *)body, body ? strlen(body) : 0}};
    char *resp = NULL;
    int st = bu_request(c, method, path, "application/json", iov, body ? 2 : 1, &resp);
    if (st != want) srv_die("%s %s: HTTP %d %s", method, path, st, resp ? resp : "(no response)");
    cJSON *o = mdl_json_parse(resp, resp ? strlen(resp) : 0, MDL_JSON_MAX_DEPTH, 0, NULL, NULL, 0);
    free(resp);
    if (!o) srv_die("%s %s: the answer is not JSON", method, path);
    return o;
}

/* ---- the server child ---------------------------------------------------------------------------- */

static void start_server(const char *model, uint64_t max_bucket, const char *threads, bench_child *ch)
{
    char mb[32];
    snprintf(mb, sizeof mb, "%llu", (unsigned long long)max_bucket);
    const char *extra[] = {"--max-bucket-bytes", mb, "--kv-cache-mb", "64", "--max-seqs", "4", "--max-model-len",
                           "512", threads ? "--threads" : NULL, threads, NULL};
    if (bench_start_server(model, extra, 600, ch) != 0) srv_die("the server did not start");
}

/* VmRSS of a process in bytes (0 when unreadable). */
static uint64_t rss_bytes(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kb = strtoull(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return kb << 10;
}

typedef struct {
    pid_t pid;
    atomic_int stop;
    atomic_uint_fast64_t peak;
} bu_sampler;

static void *sample_rss(void *arg)
{
    bu_sampler *s = arg;
    while (!atomic_load(&s->stop)) {
        uint64_t r = rss_bytes(s->pid);
        if (r > atomic_load(&s->peak)) atomic_store(&s->peak, r);
        usleep(5000);
    }
    return NULL;
}

/* Single-thread memcpy bandwidth (best of several passes over 512 MiB), GB/s. */
static double memcpy_gbs(void)
{
    const size_t n = (size_t)512 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) srv_die("out of memory for the memcpy test");
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int it = 0; it < 5; it++) {
        double t0 = bench_now();
        memcpy(it & 1 ? a : b, it & 1 ? b : a, n);
        double g = (double)n / (bench_now() - t0) / 1e9;
        if (g > best) best = g;
    }
    volatile char sink = a[12345] + b[54321];
    (void)sink;
    free(a);
    free(b);
    return best;
}

/* Bare loopback TCP (best of 3 passes of 1 GiB): the ceiling of any HTTP transport here, GB/s. The
 * sender connects like the update client (bench_connect) and the reader reuses one buffer, as the
 * server reuses its staging buffer. */
typedef struct {
    int lfd;
    size_t total, chunk;
    char *buf;
} bu_sink;

static void *sink_main(void *arg)
{
    bu_sink *k = arg;
    int c = accept(k->lfd, NULL, NULL);
    size_t got = 0;
    while (c >= 0 && got < k->total) {
        ssize_t n = read(c, k->buf, k->chunk);
        if (n <= 0) break;
        got += (size_t)n;
    }
    if (c >= 0) close(c);
    return NULL;
}

static double loopback_gbs(void)
{
    const size_t chunk = (size_t)64 << 20, total = (size_t)1 << 30;
    char *src = malloc(chunk), *dst = malloc(chunk);
    if (!src || !dst) srv_die("out of memory for the loopback test");
    memset(src, 3, chunk);
    memset(dst, 4, chunk);
    double best = 0;
    for (int it = 0; it < 3; it++) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof sa;
        bu_sink k = {.lfd = socket(AF_INET, SOCK_STREAM, 0), .total = total, .chunk = chunk, .buf = dst};
        if (k.lfd < 0 || bind(k.lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(k.lfd, 1) != 0 ||
            getsockname(k.lfd, (struct sockaddr *)&sa, &sl) != 0)
            srv_die("loopback test: cannot listen: %s", strerror(errno));
        pthread_t t;
        if (pthread_create(&t, NULL, sink_main, &k) != 0) srv_die("cannot start a thread");
        bench_conn c = {.fd = -1};
        if (bench_connect(&c, "127.0.0.1", ntohs(sa.sin_port)) != 0)
            srv_die("loopback test: cannot connect: %s", strerror(errno));
        const double t0 = bench_now();
        for (size_t sent = 0; sent < total; sent += chunk)
            if (bench_send_all(c.fd, src, chunk) != 0) srv_die("loopback test: write: %s", strerror(errno));
        bench_close(&c);
        pthread_join(t, NULL);
        const double g = (double)total / (bench_now() - t0) / 1e9;
        if (g > best) best = g;
        close(k.lfd);
    }
    free(src);
    free(dst);
    return best;
}

/* ---- the command ---------------------------------------------------------------------------------- */

/* srv_die exits: the server child and a generated checkpoint must not outlive the run */
static pid_t g_child;
static char g_tmpdir[64];
static int g_keep;

static const char help[] =
    "usage: graphswap bench update [--model DIR] [--bucket-mb 64,512] [--updates N] [options]\n"
    "\n"
    "Starts `graphswap serve` on a checkpoint (--model, or a ~0.5 GB qwen3 written to a temporary\n"
    "folder: hidden 1024, 20 layers, intermediate 2816, vocab 32000, bf16) on a free loopback port and\n"
    "pushes full updates of it over HTTP (begin, safetensors buckets of about --bucket-mb MiB sent\n"
    "straight from the mmap'd checkpoint, finish). Prints per bucket size: end-to-end GB/s next to\n"
    "this machine's single-thread memcpy bandwidth and its bare loopback TCP rate, the finish time\n"
    "(post-load hook + plan guard) as a share of the total, and the server's resident memory before,\n"
    "at its peak during, and after the updates, with its growth per update.\n"
    "\n"
    "  --model DIR        checkpoint folder to serve and push (default: generate one)\n"
    "  --bucket-mb LIST   bucket sizes in MiB, comma-separated (default 64,512)\n"
    "  --updates N        updates per bucket size (default 3)\n"
    "  --threads N        the server's CPU worker threads (default: all cores)\n"
    "  --keep             keep the generated checkpoint (its folder is printed)\n";

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        char p[8400];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void cleanup(void)
{
    if (g_child > 0) {
        kill(g_child, SIGKILL);
        waitpid(g_child, NULL, 0);
        g_child = 0;
    }
    if (g_tmpdir[0] && !g_keep) {
        char m[128];
        snprintf(m, sizeof m, "%s/model", g_tmpdir);
        rm_tree(m);
        rmdir(g_tmpdir);
    }
    g_tmpdir[0] = 0;
}

int srv_bench_update(int argc, char **argv)
{
    const char *model = NULL, *list = "64,512", *threads = NULL;
    int updates = 3, keep = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            return 0;
        }
        if (srv_arg_str(argc, argv, &i, "--model", &model) || srv_arg_str(argc, argv, &i, "--bucket-mb", &list) ||
            srv_arg_int(argc, argv, &i, "--updates", 1, 100000, &updates) ||
            srv_arg_str(argc, argv, &i, "--threads", &threads) || srv_arg_flag(argc, argv, &i, "--keep", &keep))
            continue;
        srv_die_usage("bench update", argv[i]);
    }
    uint64_t sizes[16];
    int n_sizes = 0;
    for (const char *p = list; *p;) {
        char *end;
        double mb = strtod(p, &end);
        if (end == p || mb <= 0 || mb > 65536 || n_sizes == 16) srv_die("--bucket-mb: bad list %s", list);
        sizes[n_sizes++] = (uint64_t)(mb * 1048576.0);
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') srv_die("--bucket-mb: bad list %s", list);
    }

    bench_preflight("update", "weight-update throughput over loopback HTTP (begin, buckets, finish) by bucket size");
    char tmpdir[] = "/tmp/graphswap-bench-update-XXXXXX";
    char gen[128];
    g_keep = keep;
    atexit(cleanup);
    if (!model) {
        if (!mkdtemp(tmpdir)) srv_die("mkdtemp: %s", strerror(errno));
        snprintf(g_tmpdir, sizeof g_tmpdir, "%s", tmpdir);
        snprintf(gen, sizeof gen, "%s/model", tmpdir);
        mdl_mkmodel_opts o;
        mdl_mkmodel_defaults(&o);
        o.hidden = 1024;
        o.layers = 20;
        o.heads = 16;
        o.kv_heads = 8;
        o.head_dim = 64;
        o.intermediate = 2816;
        o.vocab = 32000;
        o.tokenizer = 0;
        o.seed = 1;
        char err[1024];
        double t0 = bench_now();
        fprintf(stderr, "bench update: writing a ~0.5 GB checkpoint to %s ...\n", gen);
        if (mdl_mkmodel(&o, gen, err, sizeof err) != 0) srv_die("%s", err);
        fprintf(stderr, "bench update: written in %.1f s\n", bench_now() - t0);
        model = gen;
    }

    bu_ckpt ck;
    ckpt_open(model, &ck);
    uint64_t max_bucket = 0;
    for (int s = 0; s < n_sizes; s++) {
        size_t nb;
        uint64_t largest;
        free(make_buckets(&ck, sizes[s], &nb, &largest));
        if (largest > max_bucket) max_bucket = largest;
    }
    max_bucket += (uint64_t)1 << 20; /* headers */

    const double mc = memcpy_gbs(), lo = loopback_gbs();
    bench_child ch;
    start_server(model, max_bucket, threads, &ch);
    g_child = ch.pid;
    bu_conn conn = {.port = ch.port, .c = {.fd = -1}};
    cJSON *o = bu_json(&conn, "GET", "/v1/weights", NULL, 200);
    cJSON_Delete(o);
    usleep(200000);
    const uint64_t rss_start = rss_bytes(ch.pid);

    printf("graphswap bench update: %s\n", model);
    printf("checkpoint %.3f GB in %zu tensors (%d file%s); single-thread memcpy %.2f GB/s; bare loopback TCP "
           "%.2f GB/s; server pid %d\n",
           (double)ck.bytes / 1e9, ck.n, ck.n_files, ck.n_files == 1 ? "" : "s", mc, lo, (int)ch.pid);
    printf("server VmRSS after start: %.1f MB\n\n", (double)rss_start / 1e6);
    printf("%-9s %7s %9s %9s %8s %10s %9s %9s %8s %10s %10s %10s %12s\n", "bucket", "buckets", "GB/s", "GB/s",
           "x memcpy", "x loopback", "finish", "finish", "hook", "RSS before", "RSS peak", "RSS after", "growth");
    printf("%-9s %7s %9s %9s %8s %10s %9s %9s %8s %10s %10s %10s %12s\n", "MiB", "", "best", "median", "(best)",
           "(best)", "ms", "share", "ms", "MB", "MB", "MB", "MB/update");
    fflush(stdout);

    int failures = 0;
    for (int s = 0; s < n_sizes; s++) {
        size_t nb;
        uint64_t largest;
        size_t *first = make_buckets(&ck, sizes[s], &nb, &largest);
        double *gbs = calloc((size_t)updates, sizeof *gbs);
        if (!gbs) srv_die("out of memory");
        double fin_ms = 0, share = 0, hook_ms = 0;
        bu_sampler smp = {.pid = ch.pid};
        atomic_store(&smp.stop, 0);
        atomic_store(&smp.peak, 0);
        const uint64_t rss_before = rss_bytes(ch.pid);
        uint64_t rss_first = 0;
        pthread_t st;
        if (pthread_create(&st, NULL, sample_rss, &smp) != 0) srv_die("cannot start a thread");
        for (int u = 0; u < updates; u++) {
            char begin[160];
            snprintf(begin, sizeof begin, "{\"mode\":\"full\",\"model\":\"target\",\"pause\":\"wait\",\"version\":\"bench-%d-%d\"}", s, u);
            double t0 = bench_now();
            cJSON_Delete(bu_json(&conn, "POST", "/v1/weights/begin", begin, 200));
            for (size_t b = 0; b < nb; b++) {
                const size_t a = first[b], e = first[b + 1];
                size_t hl;
                char *hdr = bucket_header(&ck, a, e, &hl);
                struct iovec *iov = malloc((e - a + 2) * sizeof *iov);
                if (!iov) srv_die("out of memory");
                iov[1].iov_base = hdr;
                iov[1].iov_len = hl;
                for (size_t i = a; i < e; i++) {
                    iov[2 + i - a].iov_base = (void *)ck.t[i]->data;
                    iov[2 + i - a].iov_len = ck.t[i]->nbytes;
                }
                char *resp = NULL;
                int code = bu_request(&conn, "POST", "/v1/weights/bucket", "application/octet-stream", iov,
                                      (int)(e - a + 2), &resp);
                if (code != 200) srv_die("bucket %zu of %zu: HTTP %d %s", b + 1, nb, code, resp ? resp : "");
                free(resp);
                free(iov);
                free(hdr);
            }
            double tf = bench_now();
            cJSON *fin = bu_json(&conn, "POST", "/v1/weights/finish", "{}", 200);
            double t1 = bench_now();
            cJSON_Delete(fin);
            gbs[u] = (double)ck.bytes / (t1 - t0) / 1e9;
            cJSON *info = bu_json(&conn, "GET", "/v1/weights", NULL, 200);
            const cJSON *lu = cJSON_GetObjectItemCaseSensitive(info, "last_update");
            const double hm = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(lu, "hook_ms"));
            const double gm = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(lu, "guard_ms"));
            const cJSON *state = cJSON_GetObjectItemCaseSensitive(info, "state");
            const double tens = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(lu, "tensors"));
            const double bks = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(lu, "buckets"));
            if (!cJSON_IsString(state) || strcmp(state->valuestring, "ready") != 0 || (size_t)tens != ck.n ||
                (size_t)bks != nb) {
                fprintf(stderr, "bench update: unexpected state after update %d: %s tensors %.0f buckets %.0f\n", u,
                        cJSON_IsString(state) ? state->valuestring : "?", tens, bks);
                failures++;
            }
            cJSON_Delete(info);
            fin_ms += hm + gm;
            hook_ms += hm;
            share += (hm + gm) / ((t1 - t0) * 1e3);
            (void)tf;
            if (u == 0) rss_first = rss_bytes(ch.pid);
        }
        atomic_store(&smp.stop, 1);
        pthread_join(st, NULL);
        const uint64_t rss_after = rss_bytes(ch.pid);
        double sorted[1024];
        int ns = updates < 1024 ? updates : 1024;
        memcpy(sorted, gbs, (size_t)ns * sizeof *sorted);
        qsort(sorted, (size_t)ns, sizeof *sorted, bench_cmp_double);
        const double best = sorted[ns - 1], med = sorted[ns / 2];
        const double growth = updates > 1 ? ((double)rss_after - (double)rss_first) / (updates - 1) / 1e6 : 0.0;
        printf("%-9.0f %7zu %9.2f %9.2f %8.2f %10.2f %9.3f %8.2f%% %8.3f %10.1f %10.1f %10.1f %12.3f\n",
               (double)sizes[s] / 1048576.0, nb, best, med, best / mc, best / lo, fin_ms / updates, 100 * share / updates,
               hook_ms / updates, (double)rss_before / 1e6, (double)atomic_load(&smp.peak) / 1e6,
               (double)rss_after / 1e6, growth);
        fflush(stdout);
        free(gbs);
        free(first);
    }
    bench_close(&conn.c);
    bench_stop_server(&ch);
    g_child = 0;
    ckpt_close(&ck);
    printf("\nGB/s: tensor bytes / wall time from begin to the finish answer (one keep-alive connection);\n"
           "x loopback: against bare loopback TCP (no HTTP, no weights), the ceiling of an HTTP transport;\n"
           "finish = post-load hook + plan guard (GET /v1/weights last_update), share of that wall time;\n"
           "growth: VmRSS change per update after the first update of that bucket size.\n");
    if (model == gen && keep) printf("checkpoint kept in %s\n", gen);
    cleanup();
    return failures ? 1 : 0;
}
