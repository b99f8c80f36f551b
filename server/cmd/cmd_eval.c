/* server/cmd/cmd_eval.c — `graphswap eval`: the speculative-decoding evaluation.
 *
 * Every prompt runs twice against graphswap servers: once with the drafter (speculative) and once
 * without (plain decoding of the same target). Reported per category and overall: tau (tokens a
 * speculative step commits: 1 + accepted drafts per step, as z-lab and DeepSpec define it), the
 * acceptance rate per draft position (steps whose k-th draft was accepted / steps), tokens/s of
 * both runs and the speedup, and at temperature 0 the losslessness check (token-identical outputs).
 *
 * One client path for both modes: --url evaluates a running server with a drafter; its plain run
 * goes to the same server with the request field "speculative": false (same target, same engine,
 * the drafter idle), or to --baseline-url, a second server without a drafter; --no-baseline skips
 * it (only tau and the acceptance rates are reported). --model --draft runs in this process: it
 * starts `serve` itself (srv_server_start, a loopback port, its log in OUT/server.log) with the
 * drafter; its plain run goes to that server with "speculative": false.
 *
 * The two runs alternate (the default): blocks of --concurrency prompts, each run speculatively and
 * plainly in turn, the order flipped from one block to the next (ABBA), so a machine that speeds up
 * or slows down while the eval runs (other tenants, thermal limits, a VM's steal time) moves both
 * runs alike; each block's speedup is kept and their spread reported. --sequential runs every
 * prompt speculatively first, then every prompt plainly (with --model: on a second server that
 * never loaded the drafter). Both modes send the very same requests through the very same request
 * path. Speculative counters come from each response's usage.spec (drafts, accepted_tokens,
 * accepted_per_position), so concurrent requests do not mix.
 *
 * Prompt files (JSONL, one object per line; a bad line fails the run before anything is sent, as
 * "FILE:LINE: reason"):
 *   Spec-Bench question.jsonl  {"question_id", "category", "turns": [str, ...]}: a chat; turn k is
 *                              sent with the earlier turns and the model's own answers to them
 *   {"prompt": str}            a completion (/v1/completions)
 *   {"messages": [...]}        a chat (/v1/chat/completions)
 *   optional "category" (default "default").
 * Outputs in --out: eval.json, eval.md, eval.svg, eval-requests.jsonl (docs/EVAL.md has the
 * schema). Exit status: 0, 1 when the losslessness check fails, 2 for bad input or an unreachable
 * server. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "models/format/json_guard.h"
#include "server/cmd/cmd.h"
#include "server/core/cli.h"
#include "server/core/srv.h"
#include "server/server.h"

#define EV_MAX_POS ENG_SPEC_MAX_POS /* the server reports at most this many positions */
#define EV_MAX_CATS 64

static const char help[] =
    "usage: graphswap eval [--prompts FILE] (--model DIR --draft DIR | --url URL [--baseline-url URL])\n"
    "                      [--no-baseline] [options]\n"
    "\n"
    "Speculative-decoding evaluation: every prompt runs with the drafter and without it; reports tau\n"
    "(tokens per speculative step), acceptance rate per draft position, tokens/s of both runs, the\n"
    "speedup and, at temperature 0, whether the outputs are identical (lossless), per category and\n"
    "overall, in OUT/eval.json, OUT/eval.md and OUT/eval.svg (OUT/eval-requests.jsonl: every request's\n"
    "token ids, time and counters).\n"
    "\n"
    "  --prompts FILE       JSONL: Spec-Bench question.jsonl lines {\"category\",\"turns\":[...]}, or\n"
    "                       {\"prompt\": str} / {\"messages\": [...]} with an optional \"category\"\n"
    "                       (default: eval/prompts/heldout.jsonl, the bundled held-out prompts, in\n"
    "                       the current folder or in the checkout of the binary: BUILD/..)\n"
    "  --model DIR          run in this process: serve the target with --draft on a loopback port\n"
    "                       (the plain run: the same server, \"speculative\": false; with\n"
    "                       --sequential, the target alone afterwards); log in OUT/server.log\n"
    "  --draft DIR          the drafter (DFlash or DSpark) for --model\n"
    "  --url URL            evaluate a running server with a drafter (http://host:port); the plain\n"
    "                       run is sent to the same server with \"speculative\": false\n"
    "  --baseline-url URL   send the plain run to this server instead (the same target served\n"
    "                       without a drafter)\n"
    "  --no-baseline        no plain run: tokens/s without the drafter, speedup and the lossless\n"
    "                       check are null\n"
    "  --sequential         every prompt speculatively, then every prompt plainly (default: the\n"
    "                       runs alternate per block of --concurrency prompts, order flipped each\n"
    "                       block, and the spread of the blocks' speedups is reported)\n"
    "  --api-key KEY        bearer key for the servers (default: $GRAPHSWAP_API_KEY)\n"
    "  --temperature T      0 = greedy with the losslessness check (default 0)\n"
    "  --seed S             request seeds, the same in both runs: prompt i uses S + i, turn k of a\n"
    "                       Spec-Bench prompt (S + i) * 16 + k (default 0)\n"
    "  --max-tokens N       tokens per completion / turn (default 128)\n"
    "  --concurrency N      requests in flight at once (default 1: batch-1 speed)\n"
    "  --limit N            the first N prompts of each category\n"
    "  --categories A,B     only these categories\n"
    "  --out DIR            output folder (default eval-results)\n"
    "  --threads N  --spec-confidence-threshold X  --num-spec-tokens N  --bf16-activations[=amx]\n"
    "                       engine options of --model (as graphswap serve takes them)\n"
    "\n"
    "A progress bar goes to stderr (a line per 10% when stderr is not a terminal). Exit status: 0; 1\n"
    "when the losslessness check fails (temperature 0, an output differs from plain decoding); 2 for\n"
    "bad input (FILE:LINE of a bad prompt line), an unreachable server (5 s connect timeout) or a\n"
    "failed request. Schema of eval.json: docs/EVAL.md.\n";

/* ---- small helpers --------------------------------------------------------------------------- */

/* eval's own messages and progress: stderr, or a duplicate of it while servers of --model run in
 * this process (their log goes to OUT/server.log through descriptor 2 meanwhile) */
static FILE *ev_err;

static void ev_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void ev_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("graphswap eval: error: ", ev_err ? ev_err : stderr);
    vfprintf(ev_err ? ev_err : stderr, fmt, ap);
    fputc('\n', ev_err ? ev_err : stderr);
    va_end(ap);
    exit(2);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- prompts --------------------------------------------------------------------------------- */

typedef enum { EV_PROMPT, EV_MESSAGES, EV_TURNS } ev_kind;

typedef struct {
    ev_kind kind;
    cJSON *src;    /* the line (owned) */
    int cat;       /* index into the category table */
    int n_units;   /* requests it makes: 1, or one per turn */
    int unit0;     /* its first unit's index in the result arrays */
} ev_item;

typedef struct { /* one request's results, per run */
    cJSON *ids;    /* completion token ids (owned) */
    long tokens, drafts, accepted;
    long pos[EV_MAX_POS];
    int npos;      /* length of usage.spec.accepted_per_position: the drafter's width */
    double seconds;
} ev_unit;

typedef struct {
    ev_item *items;
    int n_items, n_units;
    char *cats[EV_MAX_CATS];
    int n_cats;
} ev_set;

static int cat_index(ev_set *s, const char *name, const char *file, int line)
{
    for (int i = 0; i < s->n_cats; i++)
        if (strcmp(s->cats[i], name) == 0) return i;
    if (s->n_cats == EV_MAX_CATS) ev_die("%s:%d: more than %d categories", file, line, EV_MAX_CATS);
    s->cats[s->n_cats] = strdup(name);
    if (!s->cats[s->n_cats]) ev_die("out of memory");
    return s->n_cats++;
}

static int valid_messages(const cJSON *m)
{
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) < 1) return 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, m) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(x, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (!cJSON_IsObject(x) || !cJSON_IsString(r) || !cJSON_IsString(c)) return 0;
    }
    return 1;
}

/* Reads and validates the whole file first: nothing is sent when any line is bad. */
static void load_prompts(const char *file, int limit, const char *only, ev_set *s)
{
    FILE *f = fopen(file, "r");
    if (!f) ev_die("%s: cannot open: %s", file, strerror(errno));
    memset(s, 0, sizeof *s);
    int cap = 0, per_cat[EV_MAX_CATS] = {0};
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    for (int lineno = 1; (len = getline(&line, &lcap, f)) >= 0; lineno++) {
        if (strspn(line, " \t\r\n") == (size_t)len) continue;
        char why[160];
        mdl_json_result jr;
        cJSON *j = mdl_json_parse(line, strlen(line), MDL_JSON_MAX_DEPTH, MDL_JSON_OBJECT, &jr, why, sizeof why);
        if (!j) ev_die("%s:%d: %s", file, lineno, jr.status == MDL_JSON_E_DEEP ? why : "not a JSON object");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "category");
        if (c && !cJSON_IsString(c)) ev_die("%s:%d: \"category\" must be a string", file, lineno);
        const char *cat = c ? c->valuestring : "default";
        ev_item it = {.src = j};
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "messages");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "turns");
        if ((p != NULL) + (m != NULL) + (t != NULL) != 1)
            ev_die("%s:%d: needs exactly one of \"prompt\", \"messages\" or \"turns\"", file, lineno);
        if (p) {
            if (!cJSON_IsString(p) || !p->valuestring[0]) ev_die("%s:%d: \"prompt\" must be a non-empty string", file, lineno);
            it.kind = EV_PROMPT;
            it.n_units = 1;
        } else if (m) {
            if (!valid_messages(m))
                ev_die("%s:%d: \"messages\" must be a non-empty list of {\"role\", \"content\"} strings", file, lineno);
            it.kind = EV_MESSAGES;
            it.n_units = 1;
        } else {
            int ok = cJSON_IsArray(t) && cJSON_GetArraySize(t) >= 1;
            const cJSON *x;
            cJSON_ArrayForEach(x, t) ok = ok && cJSON_IsString(x);
            if (!ok) ev_die("%s:%d: \"turns\" must be a non-empty list of strings", file, lineno);
            it.kind = EV_TURNS;
            it.n_units = cJSON_GetArraySize(t);
        }
        if (only && !srv_list_has(only, cat)) {
            cJSON_Delete(j);
            continue;
        }
        it.cat = cat_index(s, cat, file, lineno);
        if (limit > 0 && per_cat[it.cat] >= limit) {
            cJSON_Delete(j);
            continue;
        }
        per_cat[it.cat]++;
        if (s->n_items == cap) {
            cap = cap ? 2 * cap : 64;
            ev_item *ni = realloc(s->items, (size_t)cap * sizeof *ni);
            if (!ni) ev_die("out of memory");
            s->items = ni;
        }
        it.unit0 = s->n_units;
        s->n_units += it.n_units;
        s->items[s->n_items++] = it;
    }
    free(line);
    fclose(f);
    if (s->n_items == 0) ev_die("%s: no prompts%s", file, only ? " in the chosen categories" : "");
}

/* ---- HTTP client (HTTP/1.1, one request per connection) ---------------------------------------- */

typedef struct {
    char host[256];
    char port[16];
    char base[320];
} ev_url;

static int parse_url(const char *u, ev_url *o)
{
    memset(o, 0, sizeof *o);
    if (strncmp(u, "http://", 7) != 0) return -1;
    const char *h = u + 7, *end = h + strcspn(h, "/");
    const char *colon = memchr(h, ':', (size_t)(end - h));
    const size_t hl = (size_t)((colon ? colon : end) - h);
    if (hl == 0 || hl >= sizeof o->host) return -1;
    memcpy(o->host, h, hl);
    if (colon) {
        const size_t pl = (size_t)(end - colon - 1);
        if (pl == 0 || pl >= sizeof o->port || strspn(colon + 1, "0123456789") < pl) return -1;
        memcpy(o->port, colon + 1, pl);
    } else {
        strcpy(o->port, "80");
    }
    if (*end && strcmp(end, "/") != 0) return -1; /* a base URL: no path */
    snprintf(o->base, sizeof o->base, "http://%s:%s", o->host, o->port);
    return 0;
}

/* Connects within timeout_s (non-blocking connect + poll); -1 with errno-style reason in why. */
static int dial(const ev_url *u, double timeout_s, char *why, size_t whylen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(u->host, u->port, &hints, &res);
    if (rc != 0) {
        snprintf(why, whylen, "cannot resolve %s: %s", u->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            snprintf(why, whylen, "connect: %s", strerror(errno));
            close(fd);
            fd = -1;
            continue;
        }
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof err;
        if (poll(&pf, 1, (int)(timeout_s * 1000)) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) {
            snprintf(why, whylen, "connect: %s", err ? strerror(err) : "timed out");
            close(fd);
            fd = -1;
            continue;
        }
        fcntl(fd, F_SETFL, fl);
    }
    freeaddrinfo(res);
    return fd;
}

/* POST path with a JSON body; returns the HTTP status (and the parsed body in *out) or -1 with a
 * reason. Bodies are read to the end of the connection (the request says Connection: close). */
static int http_post(const ev_url *u, const char *path, const char *body, const char *key, cJSON **out, char *why,
                     size_t whylen)
{
    *out = NULL;
    int fd = dial(u, 5.0, why, whylen);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = 600};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char head[1024];
    int hn = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n%s%s%s\r\n",
                      path, u->host, u->port, strlen(body), key ? "Authorization: Bearer " : "", key ? key : "",
                      key ? "\r\n" : "");
    if (hn < 0 || (size_t)hn >= sizeof head) {
        close(fd);
        snprintf(why, whylen, "request header too long");
        return -1;
    }
    const char *parts[2] = {head, body};
    const size_t lens[2] = {(size_t)hn, strlen(body)};
    for (int k = 0; k < 2; k++)
        for (size_t off = 0; off < lens[k];) {
            ssize_t w = send(fd, parts[k] + off, lens[k] - off, MSG_NOSIGNAL);
            if (w <= 0) {
                snprintf(why, whylen, "send: %s", strerror(errno));
                close(fd);
                return -1;
            }
            off += (size_t)w;
        }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (n + 4096 > cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(why, whylen, "recv: %s", strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (!buf) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    buf[n] = 0;
    int status = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1 || !sep) {
        snprintf(why, whylen, "not an HTTP response");
        free(buf);
        return -1;
    }
    /* chunked bodies: graphswap answers non-streaming requests with Content-Length; a proxy may not */
    char *b = sep + 4;
    if (strcasestr(buf, "transfer-encoding: chunked") && strcasestr(buf, "transfer-encoding: chunked") < sep) {
        char *w = b, *r = b;
        for (;;) {
            char *e;
            unsigned long len = strtoul(r, &e, 16);
            if (e == r || !(e = strstr(e, "\r\n")) || len == 0) break;
            r = e + 2;
            if ((size_t)(r - buf) + len > n) break;
            memmove(w, r, len);
            w += len;
            r += len + 2;
        }
        *w = 0;
    }
    /* another server's answer is untrusted too: guarded like a request body */
    *out = mdl_json_parse(b, strlen(b), MDL_JSON_MAX_DEPTH, 0, NULL, NULL, 0);
    free(buf);
    return status;
}

/* ---- the servers --model runs in this process -------------------------------------------------- */

/* --model's servers: `graphswap serve` in this process (srv_server_start), on a loopback port, one at
 * a time (the speculative run's server is stopped before the plain run's starts, so the runs never
 * share the CPUs or the memory). Their log goes to OUT/server.log: descriptor 2 points there while
 * one runs, eval's own messages go to ev_err (the original stderr). */
static srv_server *local_start(const char *log, char **argv, int argc, const char *what, ev_url *url)
{
    const int lfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (lfd < 0) ev_die("%s: cannot write: %s", log, strerror(errno));
    fflush(stderr);
    dup2(lfd, 2);
    close(lfd);
    char err[1024];
    srv_server *sv = srv_server_start(argc, argv, err, sizeof err);
    if (!sv) ev_die("cannot start %s: %s (log: %s)", what, err, log);
    if (parse_url(srv_server_url(sv), url) != 0) ev_die("the server reports an odd address %s", srv_server_url(sv));
    return sv;
}

/* ---- one run (speculative or plain) ------------------------------------------------------------ */

typedef struct {
    const ev_set *set;
    const ev_url *url;
    const char *key;
    int no_spec;   /* send "speculative": false (the plain run on a server with a drafter) */
    double temperature;
    uint64_t seed;
    int max_tokens;
    ev_unit *units;
    int hi;        /* items [next's start, hi) in this call of run_range */
    atomic_int next, done, failed;
    char why[2048];
    pthread_mutex_t mu;
    const char *label;
    int total;
} ev_run;

static void progress(ev_run *r, int force)
{
    static int last_decile = -1;
    const int d = atomic_load(&r->done), n = r->total;
    if (isatty(fileno(ev_err))) {
        const int w = 30, f = n ? d * w / n : w;
        fprintf(ev_err, "\r%-12s [", r->label);
        for (int i = 0; i < w; i++) fputc(i < f ? '=' : ' ', ev_err);
        fprintf(ev_err, "] %d/%d%s", d, n, d == n || force ? "\n" : "");
    } else {
        const int dec = n ? d * 10 / n : 10;
        if (dec != last_decile || force) {
            fprintf(ev_err, "%s: %d/%d prompts\n", r->label, d, n);
            last_decile = dec;
        }
        if (d == n) last_decile = -1;
    }
}

/* One request: fills u (token ids, counts, time); returns the assistant text for chats (owned). */
static char *one_request(ev_run *r, const char *path, cJSON *body, ev_unit *u, int chat)
{
    cJSON_AddNumberToObject(body, "max_tokens", r->max_tokens);
    cJSON_AddNumberToObject(body, "temperature", r->temperature);
    cJSON_AddBoolToObject(body, "return_token_ids", 1);
    if (r->no_spec) cJSON_AddBoolToObject(body, "speculative", 0);
    char *txt = cJSON_PrintUnformatted(body);
    cJSON *resp = NULL;
    char why[1024];
    const double t0 = now_s();
    int st = txt ? http_post(r->url, path, txt, r->key, &resp, why, sizeof why) : -1;
    u->seconds += now_s() - t0;
    free(txt);
    char *answer = NULL;
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(resp, "choices"), 0);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(ch, "token_ids");
    if (st != 200 || !cJSON_IsArray(ids)) {
        pthread_mutex_lock(&r->mu);
        if (!r->why[0]) {
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(resp, "error"), "message");
            if (st < 0) snprintf(r->why, sizeof r->why, "%s%s: %s", r->url->base, path, why);
            else snprintf(r->why, sizeof r->why, "%s%s: HTTP %d%s%s", r->url->base, path, st, cJSON_IsString(m) ? ": " : "",
                          cJSON_IsString(m) ? m->valuestring : "");
        }
        pthread_mutex_unlock(&r->mu);
        atomic_fetch_add(&r->failed, 1);
        cJSON_Delete(resp);
        return NULL;
    }
    if (!u->ids) u->ids = cJSON_CreateArray();
    const cJSON *x;
    cJSON_ArrayForEach(x, ids) cJSON_AddItemToArray(u->ids, cJSON_CreateNumber(x->valuedouble));
    u->tokens += cJSON_GetArraySize(ids);
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(resp, "usage"), "spec");
    if (sp) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(sp, "drafts");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(sp, "accepted_tokens");
        u->drafts += cJSON_IsNumber(d) ? (long)d->valuedouble : 0;
        u->accepted += cJSON_IsNumber(a) ? (long)a->valuedouble : 0;
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(sp, "accepted_per_position");
        int k = 0;
        cJSON_ArrayForEach(x, ap) if (k < EV_MAX_POS) u->pos[k++] += (long)x->valuedouble;
        if (k > u->npos) u->npos = k;
    }
    if (chat) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "message"), "content");
        answer = strdup(cJSON_IsString(c) ? c->valuestring : "");
    }
    cJSON_Delete(resp);
    return answer;
}

static void run_item(ev_run *r, int idx)
{
    const ev_item *it = &r->set->items[idx];
    const uint64_t seed = r->seed + (uint64_t)idx;
    if (it->kind == EV_PROMPT) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "prompt", cJSON_GetObjectItemCaseSensitive(it->src, "prompt")->valuestring);
        cJSON_AddNumberToObject(b, "seed", (double)seed);
        one_request(r, "/v1/completions", b, &r->units[it->unit0], 0);
        cJSON_Delete(b);
        return;
    }
    if (it->kind == EV_MESSAGES) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToObject(b, "messages", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(it->src, "messages"), 1));
        cJSON_AddNumberToObject(b, "seed", (double)seed);
        free(one_request(r, "/v1/chat/completions", b, &r->units[it->unit0], 1));
        cJSON_Delete(b);
        return;
    }
    /* Spec-Bench turns: the conversation grows by the model's own answers */
    cJSON *msgs = cJSON_CreateArray();
    const cJSON *t;
    int k = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(it->src, "turns")) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", t->valuestring);
        cJSON_AddItemToArray(msgs, m);
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToObject(b, "messages", cJSON_Duplicate(msgs, 1));
        cJSON_AddNumberToObject(b, "seed", (double)(seed * 16 + (uint64_t)k));
        char *ans = one_request(r, "/v1/chat/completions", b, &r->units[it->unit0 + k], 1);
        cJSON_Delete(b);
        if (!ans) break;
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "role", "assistant");
        cJSON_AddStringToObject(a, "content", ans);
        cJSON_AddItemToArray(msgs, a);
        free(ans);
        k++;
    }
    cJSON_Delete(msgs);
}

static void *worker(void *p)
{
    ev_run *r = p;
    for (int i; (i = atomic_fetch_add(&r->next, 1)) < r->hi;) {
        if (atomic_load(&r->failed)) break;
        run_item(r, i);
        atomic_fetch_add(&r->done, 1);
        pthread_mutex_lock(&r->mu);
        progress(r, 0);
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

/* Runs items [lo, hi) (the progress counts on from earlier calls); returns the wall time; dies with
 * the first failure's reason. */
static double run_range(ev_run *r, int lo, int hi, int concurrency)
{
    pthread_t th[256];
    if (concurrency > 256) concurrency = 256;
    if (concurrency > hi - lo) concurrency = hi - lo > 0 ? hi - lo : 1;
    atomic_store(&r->next, lo);
    r->hi = hi;
    atomic_store(&r->failed, 0);
    r->total = r->set->n_items;
    if (lo == 0) progress(r, 0);
    const double t0 = now_s();
    int started = 0;
    for (; started < concurrency; started++)
        if (pthread_create(&th[started], NULL, worker, r) != 0) break;
    if (started == 0) ev_die("cannot start a client thread");
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    const double wall = now_s() - t0;
    if (atomic_load(&r->failed)) {
        fputc('\n', ev_err);
        ev_die("%s", r->why);
    }
    return wall;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* the q-quantile of sorted v[0..n) (linear between neighbours) */
static double quantile(const double *v, int n, double q)
{
    const double pos = q * (n - 1);
    const int i = (int)pos;
    return i + 1 < n ? v[i] + (pos - i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* completion tokens of items [lo, hi) */
static long range_tokens(const ev_set *set, const ev_unit *u, int lo, int hi)
{
    long t = 0;
    for (int i = lo; i < hi; i++)
        for (int k = set->items[i].unit0; k < set->items[i].unit0 + set->items[i].n_units; k++) t += u[k].tokens;
    return t;
}

/* ---- aggregation and reports ------------------------------------------------------------------- */

typedef struct {
    int prompts, units;
    long tokens, plain_tokens, drafts, accepted, pos[EV_MAX_POS];
    double spec_s, plain_s;
    int mismatches;
    cJSON *mism; /* [{"prompt": i, "turn": k, "first_diff": j}] */
} ev_agg;

static int first_diff(const cJSON *a, const cJSON *b)
{
    const int na = cJSON_GetArraySize(a), nb = cJSON_GetArraySize(b);
    for (int i = 0; i < na && i < nb; i++)
        if (cJSON_GetArrayItem(a, i)->valuedouble != cJSON_GetArrayItem(b, i)->valuedouble) return i;
    return na == nb ? -1 : (na < nb ? na : nb);
}

static cJSON *agg_json(const ev_agg *g, int W, int have_plain, int lossless_check, double spec_wall, double plain_wall)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompts", g->prompts);
    cJSON_AddNumberToObject(o, "requests", g->units);
    cJSON_AddNumberToObject(o, "completion_tokens", (double)g->tokens);
    cJSON_AddNumberToObject(o, "spec_steps", (double)g->drafts);
    cJSON_AddNumberToObject(o, "accepted_tokens", (double)g->accepted);
    cJSON_AddNumberToObject(o, "tau", g->drafts ? 1.0 + (double)g->accepted / (double)g->drafts : 0.0);
    cJSON *ap = cJSON_AddArrayToObject(o, "accept_rate_per_position");
    for (int k = 0; k < W; k++)
        cJSON_AddItemToArray(ap, cJSON_CreateNumber(g->drafts ? (double)g->pos[k] / (double)g->drafts : 0.0));
    /* tokens/s: per category from request times (sum of tokens / sum of request seconds); overall
     * from the run's wall time (the caller passes it) */
    const double st = spec_wall > 0 ? (double)g->tokens / spec_wall : g->spec_s > 0 ? (double)g->tokens / g->spec_s : 0;
    cJSON_AddNumberToObject(o, "spec_tok_s", st);
    if (have_plain) {
        const double pt = plain_wall > 0 ? (double)g->plain_tokens / plain_wall
                          : g->plain_s > 0 ? (double)g->plain_tokens / g->plain_s : 0;
        cJSON_AddNumberToObject(o, "plain_tok_s", pt);
        cJSON_AddNumberToObject(o, "speedup", pt > 0 ? st / pt : 0.0);
    } else {
        cJSON_AddNullToObject(o, "plain_tok_s");
        cJSON_AddNullToObject(o, "speedup");
    }
    if (lossless_check) {
        cJSON_AddBoolToObject(o, "lossless", g->mismatches == 0);
        cJSON_AddItemToObject(o, "mismatches", cJSON_Duplicate(g->mism, 1));
    } else {
        cJSON_AddNullToObject(o, "lossless");
    }
    return o;
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) ev_die("%s: cannot write", path);
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void fmt_or_dash(char *b, size_t n, const char *fmt, double v)
{
    if (isnan(v)) snprintf(b, n, "-");
    else snprintf(b, n, fmt, v);
}

static void md_row(FILE *f, const char *name, const cJSON *o)
{
    char pt[32], sp[32];
    fmt_or_dash(pt, sizeof pt, "%.1f", num(o, "plain_tok_s"));
    fmt_or_dash(sp, sizeof sp, "%.2fx", num(o, "speedup"));
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "lossless");
    fprintf(f, "| %s | %d | %ld | %.3f | %.1f | %s | %s | %s |", name, (int)num(o, "prompts"),
            (long)num(o, "completion_tokens"), num(o, "tau"), num(o, "spec_tok_s"), pt, sp,
            cJSON_IsBool(l) ? (cJSON_IsTrue(l) ? "yes" : "**no**") : "-");
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(o, "accept_rate_per_position")) fprintf(f, " %.3f |", x->valuedouble);
    fputc('\n', f);
}

/* Two bar charts: acceptance rate per draft position (overall), speedup (or tau) per category. */
static char *svg_chart(const cJSON *root, int W)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) ev_die("out of memory");
    const cJSON *ov = cJSON_GetObjectItemCaseSensitive(root, "overall");
    const cJSON *cats = cJSON_GetObjectItemCaseSensitive(root, "categories");
    const int nc = cJSON_GetArraySize(cats);
    const int have_speed = !isnan(num(ov, "speedup"));
    const int Wd = 900, H = 340;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", Wd, 2 * H);
    /* panel 1: acceptance per position */
    const int x0 = 60, y0 = 40, pw = Wd - 100, ph = H - 100;
    fprintf(f, "<text x=\"%d\" y=\"22\" text-anchor=\"middle\" font-weight=\"bold\">acceptance rate per draft "
               "position (overall, tau %.3f)</text>\n", Wd / 2, num(ov, "tau"));
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", x0, y0 + ph, x0 + pw, y0 + ph);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", x0, y0, x0, y0 + ph);
    for (int t = 0; t <= 4; t++)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"10\">%.2f</text>\n", x0 - 4,
                y0 + ph - ph * t / 4 + 4, t / 4.0);
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(ov, "accept_rate_per_position");
    for (int k = 0; k < W; k++) {
        const double v = cJSON_GetArrayItem(ap, k)->valuedouble;
        const int bw = pw / (W > 0 ? W : 1), bh = (int)(v * ph);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#4c78a8\"/>\n", x0 + k * bw + 4,
                y0 + ph - bh, bw - 8, bh);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\">%.3f</text>\n", x0 + k * bw + bw / 2,
                y0 + ph - bh - 3, v);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", x0 + k * bw + bw / 2, y0 + ph + 15, k + 1);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">draft position</text>\n", x0 + pw / 2, y0 + ph + 32);
    fprintf(f, "<text x=\"16\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 16 %d)\">acceptance rate</text>\n",
            y0 + ph / 2, y0 + ph / 2);
    /* panel 2: speedup (or tau) per category */
    const int y1 = H + 40;
    const char *metric = have_speed ? "speedup" : "tau";
    double mx = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cats) if (num(c, metric) > mx) mx = num(c, metric);
    if (!(mx > 0)) mx = 1;
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-weight=\"bold\">%s per category</text>\n", Wd / 2,
            H + 22, have_speed ? "speedup over plain decoding" : "tau (no baseline run)");
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", x0, y1 + ph, x0 + pw, y1 + ph);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", x0, y1, x0, y1 + ph);
    /* the y-axis: ticks at quarters of the tallest bar, and what it measures */
    for (int t = 0; t <= 4; t++) {
        const int y = y1 + ph - ph * t / 4;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", x0 - 3, y, x0, y);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"10\">%.2f%s</text>\n", x0 - 5, y + 4,
                mx * t / 4, have_speed ? "x" : "");
    }
    fprintf(f, "<text x=\"16\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 16 %d)\">%s</text>\n",
            y1 + ph / 2, y1 + ph / 2, have_speed ? "speedup (plain = 1)" : "tau");
    if (have_speed && mx >= 1) {
        const int y = y1 + ph - (int)(ph / mx);
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#888\" stroke-dasharray=\"4\"/>\n", x0, y, x0 + pw, y);
    }
    int k = 0;
    cJSON_ArrayForEach(c, cats) {
        const double v = num(c, metric);
        const int bw = pw / (nc > 0 ? nc : 1), bh = isnan(v) ? 0 : (int)(v / mx * ph);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f58518\"/>\n", x0 + k * bw + 4,
                y1 + ph - bh, bw - 8, bh);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\">%.2f</text>\n", x0 + k * bw + bw / 2,
                y1 + ph - bh - 3, isnan(v) ? 0.0 : v);
        /* category names are user data: escape for XML */
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\">", x0 + k * bw + bw / 2, y1 + ph + 15);
        for (const char *p = c->string; *p; p++) {
            if (*p == '<') fputs("&lt;", f);
            else if (*p == '>') fputs("&gt;", f);
            else if (*p == '&') fputs("&amp;", f);
            else if ((unsigned char)*p >= 0x20) fputc(*p, f);
        }
        fputs("</text>\n", f);
        k++;
    }
    fputs("</svg>\n", f);
    fclose(f);
    return out;
}

/* OUT/eval-requests.jsonl: one line per request (a Spec-Bench turn is one), in prompt-file order:
 * {"category", "prompt" (index among the evaluated prompts), "turn", "spec": {"token_ids",
 * "seconds", "steps", "accepted_tokens"}, "plain": {"token_ids", "seconds"} (with a plain run),
 * "first_diff" (with the lossless check: the first index where the outputs differ, or -1)}. The
 * raw material of the aggregates: where a mismatch starts, which prompts draft well. */
static void write_requests(const char *dir, const ev_set *set, const ev_unit *su, const ev_unit *pu, int check)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/eval-requests.jsonl", dir);
    FILE *f = fopen(path, "w");
    if (!f) ev_die("%s: cannot write: %s", path, strerror(errno));
    for (int i = 0; i < set->n_items; i++) {
        const ev_item *it = &set->items[i];
        for (int u = it->unit0; u < it->unit0 + it->n_units; u++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "category", set->cats[it->cat]);
            cJSON_AddNumberToObject(o, "prompt", i);
            cJSON_AddNumberToObject(o, "turn", u - it->unit0);
            cJSON *sj = cJSON_AddObjectToObject(o, "spec");
            cJSON_AddItemToObject(sj, "token_ids", su[u].ids ? cJSON_Duplicate(su[u].ids, 1) : cJSON_CreateArray());
            cJSON_AddNumberToObject(sj, "seconds", su[u].seconds);
            cJSON_AddNumberToObject(sj, "steps", (double)su[u].drafts);
            cJSON_AddNumberToObject(sj, "accepted_tokens", (double)su[u].accepted);
            if (pu) {
                cJSON *pj = cJSON_AddObjectToObject(o, "plain");
                cJSON_AddItemToObject(pj, "token_ids", pu[u].ids ? cJSON_Duplicate(pu[u].ids, 1) : cJSON_CreateArray());
                cJSON_AddNumberToObject(pj, "seconds", pu[u].seconds);
            }
            if (check) cJSON_AddNumberToObject(o, "first_diff", first_diff(su[u].ids, pu[u].ids));
            char *line = cJSON_PrintUnformatted(o);
            cJSON_Delete(o);
            if (!line || fprintf(f, "%s\n", line) < 0) ev_die("%s: cannot write", path);
            free(line);
        }
    }
    if (fclose(f) != 0) ev_die("%s: cannot write", path);
}

/* ---- the command --------------------------------------------------------------------------------- */

/* The bundled held-out prompts: eval/prompts/heldout.jsonl in the current folder, else in the
 * repository the binary was built in (build/graphswap -> ../eval/prompts). */
static const char *default_prompts(char *buf, size_t n)
{
    static const char rel[] = "eval/prompts/heldout.jsonl";
    if (access(rel, R_OK) == 0) return rel;
    char self[4096];
    const ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl > 0) {
        self[sl] = 0;
        /* CHECKOUT/BUILD/graphswap -> CHECKOUT: drop the last two path components */
        char *slash = strrchr(self, '/');
        if (slash) *slash = 0;
        slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            const int w = snprintf(buf, n, "%s/%s", self, rel);
            if (w > 0 && (size_t)w < n && access(buf, R_OK) == 0) return buf;
        }
    }
    ev_die("no --prompts given and no bundled %s (in the current folder or beside the binary's build folder)", rel);
}

/* Where the figures come from: the host's architecture and CPUs (tokens/s depend on them) and the
 * commit of the checkout the binary was built in (git describe in the binary's folder; null when
 * that is no git checkout, e.g. an installed binary). */
static void add_machine(cJSON *root)
{
    char self[4096], cmd[4400];
    const ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    snprintf(cmd, sizeof cmd, "git describe --always --dirty 2>/dev/null");
    if (sl > 0) {
        self[sl] = 0;
        char *slash = strrchr(self, '/');
        if (slash && !strchr(self, '\'')) { /* single-quoted for the shell: no quote inside */
            *slash = 0;
            snprintf(cmd, sizeof cmd, "git -C '%s' describe --always --dirty 2>/dev/null", self);
        }
    }
    struct utsname u;
    cJSON *m = cJSON_AddObjectToObject(root, "machine");
    if (uname(&u) == 0) {
        cJSON_AddStringToObject(m, "system", u.sysname);
        cJSON_AddStringToObject(m, "arch", u.machine);
    }
    cJSON_AddNumberToObject(m, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
    char line[128] = "";
    FILE *p = popen(cmd, "r");
    if (p) {
        if (!fgets(line, sizeof line, p)) line[0] = 0;
        pclose(p);
    }
    line[strcspn(line, "\r\n")] = 0;
    if (line[0]) cJSON_AddStringToObject(root, "commit", line);
    else cJSON_AddNullToObject(root, "commit");
}

int srv_cmd_eval(int argc, char **argv)
{
    const char *prompts = NULL, *model = NULL, *draft = NULL, *url_s = NULL, *base_s = NULL, *out = "eval-results";
    const char *cats = NULL, *key = getenv("GRAPHSWAP_API_KEY");
    float temperature_f = 0, conf = -1;
    uint64_t seed = 0;
    int max_tokens = 128, concurrency = 1, limit = 0, no_baseline = 0, threads = 0, nspec = 0, sequential = 0;
    const char *bf16x = NULL; /* --bf16-activations[=MODE], passed to --model's servers as written */
    ev_err = stderr;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            return 0;
        }
        if (srv_arg_str(argc, argv, &i, "--prompts", &prompts) || srv_arg_str(argc, argv, &i, "--model", &model) ||
            srv_arg_str(argc, argv, &i, "--draft", &draft) || srv_arg_str(argc, argv, &i, "--url", &url_s) ||
            srv_arg_str(argc, argv, &i, "--baseline-url", &base_s) || srv_arg_str(argc, argv, &i, "--out", &out) ||
            srv_arg_str(argc, argv, &i, "--categories", &cats) || srv_arg_str(argc, argv, &i, "--api-key", &key) ||
            srv_arg_int(argc, argv, &i, "--threads", 1, 4096, &threads) ||
            srv_arg_float(argc, argv, &i, "--spec-confidence-threshold", 0, 1, &conf) ||
            srv_arg_int(argc, argv, &i, "--num-spec-tokens", 1, 64, &nspec) ||
            srv_arg_float(argc, argv, &i, "--temperature", 0, 100, &temperature_f) ||
            srv_arg_u64(argc, argv, &i, "--seed", &seed) ||
            srv_arg_int(argc, argv, &i, "--max-tokens", 1, 1 << 20, &max_tokens) ||
            srv_arg_int(argc, argv, &i, "--concurrency", 1, 256, &concurrency) ||
            srv_arg_int(argc, argv, &i, "--limit", 1, 1 << 30, &limit) ||
            srv_arg_flag(argc, argv, &i, "--no-baseline", &no_baseline) ||
            srv_arg_flag(argc, argv, &i, "--sequential", &sequential))
            continue;
        if (strcmp(argv[i], "--bf16-activations") == 0 || strncmp(argv[i], "--bf16-activations=", 19) == 0) {
            /* checked here: serve's own parser would end this process with its message in the log */
            const char *v = argv[i][18] ? argv[i] + 19 : "pairs";
            if (strcmp(v, "amx") && strcmp(v, "pairs") && strcmp(v, "off"))
                ev_die("--bf16-activations=%s: must be amx, pairs or off", v);
            bf16x = argv[i];
            continue;
        }
        srv_die_usage("eval", argv[i]);
    }
    if ((model != NULL) == (url_s != NULL)) ev_die("give exactly one of --model (with --draft) or --url");
    if (model && !draft) ev_die("--model needs --draft (the drafter to evaluate)");
    if (base_s && !url_s) ev_die("--baseline-url goes with --url");
    if (base_s && no_baseline) ev_die("--baseline-url and --no-baseline contradict each other");
    if (url_s && (threads || conf >= 0 || nspec || bf16x))
        ev_die("--threads, --spec-confidence-threshold, --num-spec-tokens and --bf16-activations configure the "
               "servers of --model");
    if (sequential && no_baseline) ev_die("--sequential orders the two runs: --no-baseline has one");
    if (key && !*key) key = NULL;
    /* the decimal the user wrote (0.8, not the float's 0.800000011920929) in requests and eval.json */
    char tbuf[32];
    snprintf(tbuf, sizeof tbuf, "%.7g", (double)temperature_f);
    const double temperature = strtod(tbuf, NULL);
    char bundled[4200];
    if (!prompts) prompts = default_prompts(bundled, sizeof bundled);
    ev_set set;
    load_prompts(prompts, limit, cats, &set);
    if (mkdir(out, 0755) != 0 && errno != EEXIST) ev_die("%s: cannot create: %s", out, strerror(errno));

    ev_url url, base;
    /* where the plain run goes: a server --model starts without the drafter, --baseline-url, or
     * the --url server itself with "speculative": false */
    const char *baseline = no_baseline        ? NULL
                           : model && sequential ? "plain-server"
                           : base_s              ? "baseline-url"
                                                 : "same-server";
    const int have_plain = baseline != NULL, alternate = have_plain && !sequential;
    /* --model: serve's argv for the two servers (the plain one stops before --draft) */
    char a_threads[16], a_conf[32], a_nspec[16], a_http[16], logpath[4200];
    char *sargv[24];
    int sargc = 0, sargc_plain = 0, saved_fd = -1;
    if (model) {
        /* eval's own output keeps the terminal; descriptor 2 goes to the servers' log from here */
        snprintf(logpath, sizeof logpath, "%s/server.log", out);
        const int lfd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (lfd < 0) ev_die("%s: cannot write: %s", logpath, strerror(errno));
        close(lfd);
        saved_fd = dup(2);
        FILE *e2 = saved_fd >= 0 ? fdopen(saved_fd, "w") : NULL;
        if (!e2) ev_die("cannot duplicate stderr: %s", strerror(errno));
        setvbuf(e2, NULL, _IONBF, 0);
        ev_err = e2;
        /* handler threads: one per client thread (and a few for the odd extra connection) */
        snprintf(a_http, sizeof a_http, "%d", concurrency + 4);
        char *const fixed[] = {"serve", "--host", "127.0.0.1", "--port", "0", "--api-key", "", "--log-interval", "0",
                               "--http-threads", a_http, "--model", (char *)model};
        for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++) sargv[sargc++] = fixed[k];
        if (threads) {
            snprintf(a_threads, sizeof a_threads, "%d", threads);
            sargv[sargc++] = "--threads";
            sargv[sargc++] = a_threads;
        }
        if (bf16x) sargv[sargc++] = (char *)bf16x;
        sargc_plain = sargc;
        sargv[sargc++] = "--draft";
        sargv[sargc++] = (char *)draft;
        if (conf >= 0) {
            snprintf(a_conf, sizeof a_conf, "%.9g", conf);
            sargv[sargc++] = "--spec-confidence-threshold";
            sargv[sargc++] = a_conf;
        }
        if (nspec) {
            snprintf(a_nspec, sizeof a_nspec, "%d", nspec);
            sargv[sargc++] = "--num-spec-tokens";
            sargv[sargc++] = a_nspec;
        }
        sargv[sargc] = NULL;
        fprintf(ev_err, "loading %s with %s in this process (server log: %s)\n", model, draft, logpath);
    } else {
        if (parse_url(url_s, &url) != 0) ev_die("--url %s: expected http://HOST[:PORT]", url_s);
        if (base_s && parse_url(base_s, &base) != 0) ev_die("--baseline-url %s: expected http://HOST[:PORT]", base_s);
        char why[1024];
        int fd = dial(&url, 5.0, why, sizeof why);
        if (fd < 0) ev_die("cannot reach %s: %s", url.base, why);
        close(fd);
        if (base_s && (fd = dial(&base, 5.0, why, sizeof why)) < 0) ev_die("cannot reach %s: %s", base.base, why);
        if (base_s) close(fd);
        if (!base_s) base = url;
    }

    ev_unit *su = calloc((size_t)set.n_units, sizeof *su), *pu = calloc((size_t)set.n_units, sizeof *pu);
    if (!su || !pu) ev_die("out of memory");
    ev_run r = {.set = &set, .url = &url, .key = key, .temperature = temperature, .seed = seed,
                .max_tokens = max_tokens, .units = su, .label = "speculative"};
    pthread_mutex_init(&r.mu, NULL);
    srv_server *sv = model ? local_start(logpath, sargv, sargc, "the target with the drafter", &url) : NULL;
    if (model && !base_s) base = url;
    ev_run rp = r; /* the plain run: its own units, counters and lock */
    rp.url = &base;
    rp.units = pu;
    rp.label = "plain";
    rp.no_spec = have_plain && strcmp(baseline, "same-server") == 0;
    pthread_mutex_init(&rp.mu, NULL);
    double spec_wall = 0, plain_wall = 0;
    /* alternate: blocks of `concurrency` prompts, speculative and plain in turn, the order flipped
     * every block; each block's speedup (tok/s over tok/s) is kept for the spread */
    const int block = alternate ? concurrency : set.n_items;
    const int n_blocks = set.n_items > 0 ? (set.n_items + block - 1) / block : 0;
    double *bspeed = calloc((size_t)(n_blocks > 0 ? n_blocks : 1), sizeof *bspeed);
    if (!bspeed) ev_die("out of memory");
    int n_bspeed = 0;
    if (alternate) {
        for (int b = 0; b < n_blocks; b++) {
            const int lo = b * block, hi = lo + block < set.n_items ? lo + block : set.n_items;
            double ws, wp;
            if (b & 1) {
                wp = run_range(&rp, lo, hi, concurrency);
                ws = run_range(&r, lo, hi, concurrency);
            } else {
                ws = run_range(&r, lo, hi, concurrency);
                wp = run_range(&rp, lo, hi, concurrency);
            }
            spec_wall += ws;
            plain_wall += wp;
            const long ts = range_tokens(&set, su, lo, hi), tp = range_tokens(&set, pu, lo, hi);
            if (ws > 0 && wp > 0 && ts > 0 && tp > 0) bspeed[n_bspeed++] = ((double)ts / ws) / ((double)tp / wp);
        }
        if (sv) srv_server_stop(sv);
    } else {
        spec_wall = run_range(&r, 0, set.n_items, concurrency);
        if (sv) srv_server_stop(sv);
        if (have_plain) {
            if (model) {
                char *keep = sargv[sargc_plain];
                sargv[sargc_plain] = NULL;
                sv = local_start(logpath, sargv, sargc_plain, "the target without the drafter", &base);
                sargv[sargc_plain] = keep;
            }
            plain_wall = run_range(&rp, 0, set.n_items, concurrency);
            if (model) srv_server_stop(sv);
        }
    }
    qsort(bspeed, (size_t)n_bspeed, sizeof *bspeed, cmp_double);
    if (saved_fd >= 0) { /* descriptor 2 is the terminal again (ev_err keeps its own duplicate) */
        fflush(stderr);
        dup2(saved_fd, 2);
    }
    /* a plain run that drafted is no baseline: a server that ignores "speculative": false (not
     * graphswap, or an older one) would make speedup 1 and the lossless check vacuous */
    for (int i = 0; have_plain && i < set.n_units; i++)
        if (pu[i].drafts > 0)
            ev_die("%s drafted in the plain run (it ignores \"speculative\": false): give --baseline-url (a server "
                   "without the drafter) or --no-baseline", base.base);

    /* the drafter's width: the per-position list the server reports has one entry per draft */
    int W = 0;
    for (int i = 0; i < set.n_units; i++)
        if (su[i].npos > W) W = su[i].npos;
    ev_agg cat[EV_MAX_CATS], all;
    memset(cat, 0, sizeof cat);
    memset(&all, 0, sizeof all);
    all.mism = cJSON_CreateArray();
    for (int c = 0; c < set.n_cats; c++) cat[c].mism = cJSON_CreateArray();
    const int check = have_plain && temperature == 0;
    for (int i = 0; i < set.n_items; i++) {
        const ev_item *it = &set.items[i];
        ev_agg *gs[2] = {&cat[it->cat], &all};
        for (int g = 0; g < 2; g++) gs[g]->prompts++;
        for (int u = it->unit0; u < it->unit0 + it->n_units; u++) {
            const int fd = check ? first_diff(su[u].ids, pu[u].ids) : -1;
            for (int g = 0; g < 2; g++) {
                ev_agg *a = gs[g];
                a->units++;
                a->tokens += su[u].tokens;
                a->plain_tokens += pu[u].tokens;
                a->drafts += su[u].drafts;
                a->accepted += su[u].accepted;
                a->spec_s += su[u].seconds;
                a->plain_s += pu[u].seconds;
                for (int k = 0; k < EV_MAX_POS; k++) a->pos[k] += su[u].pos[k];
                if (fd >= 0) {
                    a->mismatches++;
                    cJSON *m = cJSON_CreateObject();
                    cJSON_AddNumberToObject(m, "prompt", i);
                    cJSON_AddNumberToObject(m, "turn", u - it->unit0);
                    cJSON_AddNumberToObject(m, "first_diff", fd);
                    cJSON_AddItemToArray(a->mism, m);
                }
            }
        }
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "prompts_file", prompts);
    if (model) {
        cJSON_AddStringToObject(root, "model", model);
        cJSON_AddStringToObject(root, "draft", draft);
        cJSON_AddNullToObject(root, "url");
    } else {
        cJSON_AddNullToObject(root, "model");
        cJSON_AddNullToObject(root, "draft");
        cJSON_AddStringToObject(root, "url", url.base);
    }
    if (base_s) cJSON_AddStringToObject(root, "baseline_url", base.base);
    if (baseline) cJSON_AddStringToObject(root, "baseline", baseline);
    else cJSON_AddNullToObject(root, "baseline");
    if (threads) cJSON_AddNumberToObject(root, "threads", threads);
    else cJSON_AddNullToObject(root, "threads");
    add_machine(root);
    cJSON_AddNumberToObject(root, "temperature", temperature);
    cJSON_AddNumberToObject(root, "seed", (double)seed);
    cJSON_AddNumberToObject(root, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(root, "concurrency", concurrency);
    cJSON_AddNumberToObject(root, "draft_positions", W);
    cJSON_AddNumberToObject(root, "spec_wall_s", spec_wall);
    if (have_plain) cJSON_AddNumberToObject(root, "plain_wall_s", plain_wall);
    cJSON_AddStringToObject(root, "order", alternate ? "alternate" : "sequential");
    if (bf16x) cJSON_AddStringToObject(root, "bf16_activations", strchr(bf16x, '=') ? strchr(bf16x, '=') + 1 : "pairs");
    else cJSON_AddNullToObject(root, "bf16_activations");
    cJSON *cj = cJSON_AddObjectToObject(root, "categories");
    for (int c = 0; c < set.n_cats; c++) cJSON_AddItemToObject(cj, set.cats[c], agg_json(&cat[c], W, have_plain, check, 0, 0));
    cJSON_AddItemToObject(root, "overall", agg_json(&all, W, have_plain, check, spec_wall, plain_wall));
    /* the alternated blocks' speedups: their spread is how far one run of this eval can be trusted */
    cJSON *spread = NULL;
    if (n_bspeed > 0) {
        spread = cJSON_AddObjectToObject(cJSON_GetObjectItemCaseSensitive(root, "overall"), "speedup_spread");
        cJSON_AddNumberToObject(spread, "blocks", n_bspeed);
        cJSON_AddNumberToObject(spread, "prompts_per_block", block);
        cJSON_AddNumberToObject(spread, "min", bspeed[0]);
        cJSON_AddNumberToObject(spread, "p10", quantile(bspeed, n_bspeed, 0.1));
        cJSON_AddNumberToObject(spread, "median", quantile(bspeed, n_bspeed, 0.5));
        cJSON_AddNumberToObject(spread, "p90", quantile(bspeed, n_bspeed, 0.9));
        cJSON_AddNumberToObject(spread, "max", bspeed[n_bspeed - 1]);
    } else {
        cJSON_AddNullToObject(cJSON_GetObjectItemCaseSensitive(root, "overall"), "speedup_spread");
    }
    char *js = cJSON_Print(root);
    if (!js) ev_die("out of memory");
    write_file(out, "eval.json", js);
    free(js);

    char *md = NULL;
    size_t mdl = 0;
    FILE *f = open_memstream(&md, &mdl);
    if (!f) ev_die("out of memory");
    fprintf(f, "# graphswap eval\n\n%s, temperature %g, max_tokens %d, concurrency %d; %s; plain run: %s\n\n", prompts,
            temperature, max_tokens, concurrency, model ? model : url.base,
            !baseline ? "none" : !strcmp(baseline, "plain-server") ? "a server without the drafter"
                               : !strcmp(baseline, "baseline-url") ? base.base : "the same server, \"speculative\": false");
    fprintf(f, "| category | prompts | tokens | tau | spec tok/s | plain tok/s | speedup | lossless |");
    for (int k = 0; k < W; k++) fprintf(f, " p%d |", k + 1);
    fprintf(f, "\n|---|---|---|---|---|---|---|---|");
    for (int k = 0; k < W; k++) fprintf(f, "---|");
    fputc('\n', f);
    const cJSON *c;
    cJSON_ArrayForEach(c, cj) md_row(f, c->string, c);
    md_row(f, "**overall**", cJSON_GetObjectItemCaseSensitive(root, "overall"));
    if (spread)
        fprintf(f, "\nRuns alternated in %d blocks of %d prompt(s), the order flipped every block; the blocks' "
                   "speedups: median %.2fx, 10-90%% %.2fx-%.2fx, min %.2fx, max %.2fx.\n",
                n_bspeed, block, num(spread, "median"), num(spread, "p10"), num(spread, "p90"), num(spread, "min"),
                num(spread, "max"));
    else if (have_plain)
        fprintf(f, "\nRuns sequential: every prompt speculatively, then every prompt plainly.\n");
    fprintf(f, "\ntau: tokens committed per speculative step (1 + accepted drafts). pK: share of steps whose "
               "K-th draft was accepted. Overall tok/s from each run's wall time; per category, tokens over "
               "the summed request times.\n");
    fclose(f);
    write_file(out, "eval.md", md);
    free(md);
    char *svg = svg_chart(root, W);
    write_file(out, "eval.svg", svg);
    free(svg);
    write_requests(out, &set, su, have_plain ? pu : NULL, check);

    const cJSON *ov = cJSON_GetObjectItemCaseSensitive(root, "overall");
    const cJSON *lossless = cJSON_GetObjectItemCaseSensitive(ov, "lossless");
    char sp[32];
    fmt_or_dash(sp, sizeof sp, "%.2fx", num(ov, "speedup"));
    char spr[96] = "";
    if (spread)
        snprintf(spr, sizeof spr, " (blocks: median %.2fx, 10-90%% %.2fx-%.2fx)", num(spread, "median"),
                 num(spread, "p10"), num(spread, "p90"));
    fprintf(ev_err, "tau %.3f over %ld steps, speedup %s%s, lossless %s; wrote %s/eval.{json,md,svg} and eval-requests.jsonl\n", num(ov, "tau"),
            all.drafts, sp, spr, cJSON_IsBool(lossless) ? (cJSON_IsTrue(lossless) ? "yes" : "NO") : "not checked", out);
    if (all.drafts == 0)
        fprintf(ev_err, "graphswap eval: warning: no step verified a draft (is a drafter loaded?): tau is 0\n");
    const int rc = cJSON_IsFalse(lossless) ? 1 : 0;
    cJSON_Delete(root);
    cJSON_Delete(all.mism);
    for (int k = 0; k < set.n_cats; k++) {
        cJSON_Delete(cat[k].mism);
        free(set.cats[k]);
    }
    for (int i = 0; i < set.n_units; i++) {
        cJSON_Delete(su[i].ids);
        cJSON_Delete(pu[i].ids);
    }
    for (int i = 0; i < set.n_items; i++) cJSON_Delete(set.items[i].src);
    free(set.items);
    free(su);
    free(pu);
    pthread_mutex_destroy(&r.mu);
    pthread_mutex_destroy(&rp.mu);
    free(bspeed);
    if (ev_err != stderr) fclose(ev_err);
    ev_err = stderr;
    return rc;
}
