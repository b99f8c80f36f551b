/* bench/bench_transfer.c — `graphswap bench transfer`: weight-update throughput inside the process,
 * on any backend (no HTTP: `bench update` measures that path), against the backend's own copy rates.
 *
 * In one run, on the checkpoint given with --model (and --draft):
 *   floors   upload: host -> weights memory through the backend's upload (on CUDA the pinned
 *            staging ring and DMA; on the CPU a memcpy), one large buffer; device copy: weights
 *            memory -> weights memory (on CUDA device to device; bytes counted once);
 *   host     a full update of the target from the memory-mapped checkpoint (page cache): begin,
 *            every bucket of about --bucket-mb through eng_weights_bucket (dtype conversion
 *            included), finish; GB/s of tensor bytes and the ratio to the upload floor;
 *   device   the same tensors arriving in backend memory first (what NCCL and CUDA IPC deliver):
 *            each bucket is uploaded into one staging allocation (not timed), then written with
 *            eng_weights_bucket_device + synchronize (timed); ratio to the device copy floor;
 *   derived  with --draft: a full drafter update; its post-load hook refills the derived buffers
 *            (stacked context K/V weights, k_norm) in place: derived bytes / hook time.
 * Best of --repeat runs each. Nothing is asserted: the figures go into bench/results with the
 * machine and commit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "engine/weights.h"
#include "models/model.h"
#include "bench/bench.h"
#include "server/core/cli.h"

typedef struct {
    eng_engine *e;
    eng_backend *be;
    uint8_t *stage;     /* device staging (device mode), stage_bytes */
    size_t stage_bytes;
    int device;         /* 0: eng_weights_bucket from host memory; 1: via stage */
    double timed_s;     /* device mode: time in eng_weights_bucket_device + synchronize */
    size_t max_bucket;  /* sizing pass: largest bucket */
    int sizing;
} tr_ctx;

static int tr_bucket(const mdl_st_tensor *t, size_t n, const char *what, void *user, char *err, size_t errlen)
{
    tr_ctx *c = user;
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) bytes += (t[i].nbytes + 255) & ~(size_t)255;
    if (c->sizing) {
        if (bytes > c->max_bucket) c->max_bucket = bytes;
        return 0;
    }
    int status = 0;
    if (!c->device) return eng_weights_bucket(c->e, t, n, what, err, errlen, &status);
    mdl_st_tensor *tt = malloc((n ? n : 1) * sizeof *tt);
    if (!tt) srv_die("out of memory");
    size_t off = 0;
    for (size_t i = 0; i < n; i++) { /* the bytes arrive in backend memory first, as a GPU transport delivers them */
        tt[i] = t[i];
        c->be->ops->upload(c->be, c->stage + off, t[i].data, t[i].nbytes);
        tt[i].data = c->stage + off;
        off += (t[i].nbytes + 255) & ~(size_t)255;
    }
    c->be->ops->synchronize(c->be);
    double t0 = bench_now();
    int rc = eng_weights_bucket_device(c->e, tt, n, what, err, errlen, &status);
    c->be->ops->synchronize(c->be);
    c->timed_s += bench_now() - t0;
    free(tt);
    return rc;
}

typedef struct {
    double s;       /* begin -> finish (host mode) or timed buckets (device mode) */
    uint64_t bytes; /* tensor bytes written */
    double hook_ms, guard_ms;
} tr_run;

static tr_run full_update(tr_ctx *c, const char *dir, eng_wmodel which, size_t bucket)
{
    char err[1024];
    int status;
    uint64_t sid;
    eng_weights_info wi;
    c->timed_s = 0;
    double t0 = bench_now();
    if (eng_weights_begin(c->e, 1, which, ENG_PAUSE_ABORT, NULL, &sid, err, sizeof err, &status) != 0 ||
        mdl_ckpt_foreach_bucket(dir, bucket, tr_bucket, c, err, sizeof err) != 0 ||
        eng_weights_finish(c->e, NULL, err, sizeof err, &status) != 0)
        srv_die("bench transfer: update failed: %s", err);
    c->be->ops->synchronize(c->be);
    double dt = bench_now() - t0;
    eng_weights_get_info(c->e, &wi);
    tr_run r = {.s = c->device ? c->timed_s : dt, .bytes = wi.bytes, .hook_ms = wi.hook_ms, .guard_ms = wi.guard_ms};
    return r;
}

/* Best (shortest) of `repeat` full updates. */
static tr_run best_update(tr_ctx *c, const char *dir, eng_wmodel which, size_t bucket, int repeat)
{
    tr_run best = {0};
    for (int i = 0; i < repeat; i++) {
        tr_run r = full_update(c, dir, which, bucket);
        if (i == 0 || r.s < best.s) best = r;
    }
    return best;
}

/* GB/s of the backend's upload (mode 0) or device copy (mode 1) of `bytes`, best of 5. */
static double floor_gbps(eng_backend *be, size_t bytes, int mode)
{
    uint8_t *a = be->ops->alloc(be, bytes, "bench.floor.a");
    uint8_t *b = mode ? be->ops->alloc(be, bytes, "bench.floor.b") : NULL;
    uint8_t *host = malloc(bytes);
    if (!a || (mode && !b) || !host) srv_die("bench transfer: cannot allocate %zu bytes for the floor", bytes);
    memset(host, 3, bytes);
    be->ops->upload(be, a, host, bytes);
    if (b) be->ops->upload(be, b, host, bytes);
    be->ops->synchronize(be);
    double best = 0;
    for (int i = 0; i < 5; i++) {
        double t0 = bench_now();
        if (mode) be->ops->copy(be, b, a, bytes);
        else be->ops->upload(be, a, host, bytes);
        be->ops->synchronize(be);
        double g = (double)bytes / (bench_now() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(host);
    be->ops->free(be, a);
    if (b) be->ops->free(be, b);
    return best;
}

static const char help[] =
    "usage: graphswap bench transfer --model DIR [--draft DIR] [--bucket-mb N] [--repeat N] [--backend cpu|cuda]\n"
    "\n"
    "Weight-update throughput in the process (no HTTP): a full target update from host memory, the same\n"
    "tensors delivered in backend memory first (the NCCL / CUDA-IPC path), and with --draft the drafter's\n"
    "derived-buffer refill, against the backend's upload and device-copy rates measured in the same run.\n"
    "  --bucket-mb N   bucket size (default 512)\n"
    "  --repeat N      runs per measurement, the best is reported (default 3)\n";

int srv_bench_transfer(int argc, char **argv)
{
    srv_runtime_opts ro;
    srv_runtime_defaults(&ro);
    int bucket_mb = 512, repeat = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            fputs(srv_runtime_help, stdout);
            return 0;
        }
        if (srv_runtime_arg(argc, argv, &i, &ro) || srv_arg_int(argc, argv, &i, "--bucket-mb", 1, 65536, &bucket_mb) ||
            srv_arg_int(argc, argv, &i, "--repeat", 1, 100, &repeat))
            continue;
        srv_die_usage("bench transfer", argv[i]);
    }
    if (!ro.model_dir) srv_die("--model DIR is required");
    /* a small KV cache: this benchmark never decodes */
    ro.ecfg.max_seqs = 1;
    ro.ecfg.max_model_len = 256;
    ro.ecfg.max_step_tokens = 64;
    ro.ecfg.prefill_chunk = 64;
    ro.ecfg.kv_bytes = (size_t)64 << 20;
    bench_preflight("transfer", "weight-update throughput inside the process (full and partial updates, host and "
                                "device paths) against the upload / device-copy floors");
    char err[1024];
    srv_runtime rt;
    if (srv_runtime_open(&rt, &ro, err, sizeof err) != 0) srv_die("%s", err);
    const size_t bucket = (size_t)bucket_mb << 20;
    tr_ctx c = {.e = rt.e, .be = rt.be};

    printf("backend: %s   model: %s (%.1f MB of weights)   bucket: %d MiB   best of %d\n",
           ro.backend ? ro.backend : "cpu", ro.model_dir, (double)rt.m->weight_bytes / 1e6, bucket_mb, repeat);
    const size_t fl = bucket < ((size_t)1 << 30) ? bucket : ((size_t)1 << 30);
    const double up = floor_gbps(rt.be, fl, 0), dcopy = floor_gbps(rt.be, fl, 1);
    printf("floors: upload %.2f GB/s, device copy %.2f GB/s (%zu MiB, bytes counted once)\n", up, dcopy, fl >> 20);

    tr_run h = best_update(&c, ro.model_dir, ENG_WMODEL_TARGET, bucket, repeat);
    printf("host     full update: %8.1f MB in %8.2f ms = %7.2f GB/s  (%3.0f%% of upload)   hook %.3f ms, guard %.3f ms\n",
           (double)h.bytes / 1e6, h.s * 1e3, (double)h.bytes / h.s / 1e9, 100.0 * (double)h.bytes / h.s / 1e9 / up,
           h.hook_ms, h.guard_ms);

    c.sizing = 1;
    if (mdl_ckpt_foreach_bucket(ro.model_dir, bucket, tr_bucket, &c, err, sizeof err) != 0) srv_die("%s", err);
    c.sizing = 0;
    c.stage_bytes = c.max_bucket;
    c.stage = rt.be->ops->alloc(rt.be, c.stage_bytes, "bench.stage");
    if (!c.stage) srv_die("bench transfer: cannot allocate a %zu-byte staging bucket", c.stage_bytes);
    c.device = 1;
    tr_run d = best_update(&c, ro.model_dir, ENG_WMODEL_TARGET, bucket, repeat);
    printf("device   full update: %8.1f MB in %8.2f ms = %7.2f GB/s  (%3.0f%% of device copy)\n", (double)d.bytes / 1e6,
           d.s * 1e3, (double)d.bytes / d.s / 1e9, 100.0 * (double)d.bytes / d.s / 1e9 / dcopy);
    c.device = 0;
    rt.be->ops->free(rt.be, c.stage);
    c.stage = NULL;

    if (rt.draft) {
        size_t derived = 0;
        for (int i = 0; i < rt.draft->n_derived; i++) derived += rt.draft->derived[i].bytes;
        tr_run r = best_update(&c, ro.draft_dir, ENG_WMODEL_DRAFT, bucket, repeat);
        printf("derived  drafter update %.1f MB; hook refilled %.1f MB of derived buffers in %.3f ms = %.2f GB/s\n",
               (double)r.bytes / 1e6, (double)derived / 1e6, r.hook_ms, (double)derived / (r.hook_ms * 1e-3) / 1e9);
    }
    srv_runtime_close(&rt);
    return 0;
}
