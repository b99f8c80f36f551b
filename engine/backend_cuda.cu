/* engine/backend_cuda.cu — the CUDA backend (contract: engine/backend.h; design: backend_cuda.h).
 * Host code only, written in the C subset of C++ against the CUDA runtime's C API (a .cu file so that
 * the CPU-only build, which globs the .c files of engine/, never sees it); the kernels are behind
 * kernels/cuda/kern_cuda.h. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "engine/arena.h"
#include "engine/backend_cuda.h"
#include "kernels/cuda/kern_cuda.h"

#define STAGE_SEGS 8

typedef struct {
    int device;
    cudaStream_t stream;
    kern_cuda_ctx *kctx;
    /* arena: one cudaMalloc'd region, the shared allocation table (engine/arena.h) */
    uint8_t *base;
    eng_arena arena;
    /* staging ring: pinned host memory and a device mirror of the same size (upload_convert) */
    uint8_t *pinned, *dstage;
    size_t stage_bytes, seg_bytes;
    int seg, seg_pending[STAGE_SEGS];
    size_t seg_off;
    cudaEvent_t seg_done[STAGE_SEGS];
} cu_impl;

struct eng_plan {
    cudaGraphExec_t exec;
    kern_op *ops;
    size_t n;
};

static cu_impl *impl_of(eng_backend *be) { return (cu_impl *)be->impl; }

static void cu_die(cudaError_t e, const char *what, int line)
{
    fprintf(stderr, "graphswap: CUDA error %s (%s) in %s (backend_cuda.c:%d)\n", cudaGetErrorName(e),
            cudaGetErrorString(e), what, line);
    abort();
}
#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t cu_e_ = (call);                                                                \
        if (cu_e_ != cudaSuccess) cu_die(cu_e_, #call, __LINE__);                                  \
    } while (0)

/* The engine thread may not be the one that created the backend: make the device current. */
static void cu_enter(cu_impl *c) { CU(cudaSetDevice(c->device)); }

/* ---- arena (same table as the CPU backend: sorted by address by construction) --------------------- */

static void *cu_alloc_fn(eng_backend *be, size_t bytes, const char *tag)
{
    cu_impl *c = impl_of(be);
    size_t align = bytes >= (1u << 20) ? ((size_t)2 << 20) : 256;
    void *p = eng_arena_take(&c->arena, bytes, align, tag);
    if (!p) return NULL;
    cu_enter(c);
    CU(cudaMemsetAsync(p, 0, bytes ? bytes : 1, c->stream)); /* zeroed, ordered before any later use */
    return p;
}

static void cu_free_fn(eng_backend *be, void *ptr)
{
    if (!ptr) return;
    if (!eng_arena_retire(&impl_of(be)->arena, ptr)) { /* the range is never handed out again */
        fprintf(stderr, "graphswap: bug: free of %p which is not a live arena allocation\n", ptr);
        abort();
    }
}

static int cu_contains(eng_backend *be, const void *ptr, size_t bytes)
{
    return eng_arena_contains(&impl_of(be)->arena, ptr, bytes);
}

static int cu_alloc_info(eng_backend *be, const void *ptr, eng_alloc_info *out)
{
    return eng_arena_info(&impl_of(be)->arena, ptr, out);
}

static size_t cu_bytes_in_use(eng_backend *be) { return impl_of(be)->arena.live_bytes; }

/* ---- staging ring ---------------------------------------------------------------------------------------- */

/* After a full synchronize nothing in flight reads the ring: start over at segment 0. */
static void ring_drained(cu_impl *c)
{
    c->seg = 0;
    c->seg_off = 0;
    for (int i = 0; i < STAGE_SEGS; i++) c->seg_pending[i] = 0;
}

/* Offset of n bytes (n <= seg_bytes) of the ring that no enqueued copy still reads. */
static size_t ring_get(cu_impl *c, size_t n)
{
    n = (n + 255) & ~(size_t)255;
    if (c->seg_off + n > c->seg_bytes) {
        /* leave this segment: everything enqueued so far that reads it precedes this event */
        CU(cudaEventRecord(c->seg_done[c->seg], c->stream));
        c->seg_pending[c->seg] = 1;
        c->seg = (c->seg + 1) % STAGE_SEGS;
        c->seg_off = 0;
        if (c->seg_pending[c->seg]) {
            CU(cudaEventSynchronize(c->seg_done[c->seg]));
            c->seg_pending[c->seg] = 0;
        }
    }
    size_t off = (size_t)c->seg * c->seg_bytes + c->seg_off;
    c->seg_off += n;
    return off;
}

static void cu_check_kernels(cu_impl *c)
{
    char msg[256];
    if (kern_cuda_take_error(c->kctx, msg, sizeof msg)) {
        fprintf(stderr, "graphswap: CUDA kernel check failed: %s\n", msg);
        abort();
    }
}

static void cu_sync(cu_impl *c)
{
    CU(cudaStreamSynchronize(c->stream));
    ring_drained(c);
    cu_check_kernels(c);
}

static void cu_upload(eng_backend *be, void *dst, const void *src, size_t n)
{
    cu_impl *c = impl_of(be);
    cu_enter(c);
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    while (n) {
        size_t k = n < c->seg_bytes ? n : c->seg_bytes;
        size_t off = ring_get(c, k);
        memcpy(c->pinned + off, s, k);
        CU(cudaMemcpyAsync(d, c->pinned + off, k, cudaMemcpyHostToDevice, c->stream));
        s += k;
        d += k;
        n -= k;
    }
}

static void cu_download(eng_backend *be, void *dst, const void *src, size_t n)
{
    cu_impl *c = impl_of(be);
    cu_enter(c);
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    while (n) {
        size_t k = n < c->seg_bytes ? n : c->seg_bytes;
        size_t off = ring_get(c, k);
        CU(cudaMemcpyAsync(c->pinned + off, s, k, cudaMemcpyDeviceToHost, c->stream));
        cu_sync(c);
        memcpy(d, c->pinned + off, k);
        s += k;
        d += k;
        n -= k;
    }
}

static void cu_copy(eng_backend *be, void *dst, const void *src, size_t n)
{
    cu_impl *c = impl_of(be);
    if (!n) return;
    cu_enter(c);
    CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->stream));
}

static int convertible(mdl_dtype dt) { return dt == MDL_DT_F32 || dt == MDL_DT_F16 || dt == MDL_DT_BF16; }

static int cu_upload_convert(eng_backend *be, void *dst, mdl_dtype dst_dt, const void *src, mdl_dtype src_dt,
                             size_t n)
{
    cu_impl *c = impl_of(be);
    if (!convertible(src_dt) || !convertible(dst_dt)) return -1;
    if (n == 0) return 0;
    if (!dst || !src) return -1;
    const size_t ss = mdl_dtype_size(src_dt), ds = mdl_dtype_size(dst_dt);
    if (src_dt == dst_dt) {
        cu_upload(be, dst, src, n * ss);
        return 0;
    }
    cu_enter(c);
    const size_t per = c->seg_bytes / ss; /* elements per chunk */
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    while (n) {
        size_t k = n < per ? n : per;
        size_t off = ring_get(c, k * ss);
        memcpy(c->pinned + off, s, k * ss);
        CU(cudaMemcpyAsync(c->dstage + off, c->pinned + off, k * ss, cudaMemcpyHostToDevice, c->stream));
        if (kern_cuda_convert(d, (int)dst_dt, c->dstage + off, (int)src_dt, k, c->stream) != 0) return -1;
        s += k * ss;
        d += k * ds;
        n -= k;
    }
    return 0;
}

/* device -> device: the source already lives on the GPU (NCCL staging, CUDA-IPC mapping) */
static int cu_device_convert(eng_backend *be, void *dst, mdl_dtype dst_dt, const void *src, mdl_dtype src_dt,
                             size_t n)
{
    cu_impl *c = impl_of(be);
    if (!convertible(src_dt) || !convertible(dst_dt)) return -1;
    if (n == 0) return 0;
    if (!dst || !src) return -1;
    cu_enter(c);
    return kern_cuda_convert(dst, (int)dst_dt, src, (int)src_dt, n, c->stream);
}

/* ---- compute ---------------------------------------------------------------------------------------------- */

static void cu_check_op(eng_backend *be, const kern_op *op, size_t index)
{
    for (int b = 0; b < KERN_MAX_BUFS; b++) {
        const kern_buf *kb = &op->buf[b];
        if (!kb->ptr) continue;
        if (!cu_contains(be, kb->ptr, kb->bytes)) {
            eng_alloc_info info;
            const char *why = "outside every arena allocation";
            if (cu_alloc_info(be, kb->ptr, &info) == 0)
                why = info.live ? "overruns its allocation" : "points into a retired (freed) allocation";
            fprintf(stderr,
                    "graphswap: checked replay: op %zu (%s) buffer %d pointer %p (+%zu bytes) %s\n",
                    index, kern_op_name(op->kind), b, kb->ptr, kb->bytes, why);
            abort();
        }
    }
}

static void cu_run(eng_backend *be, const eng_tape *tape)
{
    cu_impl *c = impl_of(be);
    assert(!tape->overflow);
    cu_enter(c);
    for (size_t i = 0; i < tape->n; i++) {
        if (be->checked) cu_check_op(be, &tape->ops[i], i);
        kern_cuda_exec(c->kctx, &tape->ops[i], c->stream);
    }
}

/* Stream capture of the same dispatch as cu_run, then instantiation. 0 or -1 (message printed).
 * Relaxed mode: cuBLASLt may query the device or load kernels lazily while a GEMM is captured; the
 * dispatch itself never calls anything that synchronizes. */
static int capture(cu_impl *c, eng_plan *p)
{
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
        fprintf(stderr, "graphswap: CUDA plan capture could not start: %s\n", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return -1;
    }
    for (size_t i = 0; i < p->n; i++) kern_cuda_exec(c->kctx, &p->ops[i], c->stream);
    e = cudaStreamEndCapture(c->stream, &g);
    if (e != cudaSuccess) {
        fprintf(stderr, "graphswap: CUDA plan capture failed: %s\n", cudaGetErrorString(e));
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return -1;
    }
    e = cudaGraphInstantiate(&p->exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        fprintf(stderr, "graphswap: CUDA graph instantiation failed: %s\n", cudaGetErrorString(e));
        (void)cudaGetLastError();
        p->exec = NULL;
        return -1;
    }
    CU(cudaGraphUpload(p->exec, c->stream));
    return 0;
}

static eng_plan *cu_plan_create(eng_backend *be, const eng_tape *tape)
{
    cu_impl *c = impl_of(be);
    assert(!tape->overflow);
    cu_enter(c);
    eng_plan *p = (eng_plan *)calloc(1, sizeof *p);
    if (!p) return NULL;
    p->ops = (kern_op *)malloc((tape->n ? tape->n : 1) * sizeof *p->ops);
    if (!p->ops) {
        free(p);
        return NULL;
    }
    memcpy(p->ops, tape->ops, tape->n * sizeof *p->ops);
    p->n = tape->n;
    if (capture(c, p) != 0) {
        free(p->ops);
        free(p);
        return NULL;
    }
    return p;
}

static void cu_plan_launch(eng_backend *be, eng_plan *plan)
{
    cu_impl *c = impl_of(be);
    if (be->checked)
        for (size_t i = 0; i < plan->n; i++) cu_check_op(be, &plan->ops[i], i);
    cu_enter(c);
    CU(cudaGraphLaunch(plan->exec, c->stream));
}

static void cu_plan_free(eng_backend *be, eng_plan *plan)
{
    if (!plan) return;
    cu_impl *c = impl_of(be);
    cu_enter(c);
    if (plan->exec) {
        CU(cudaStreamSynchronize(c->stream)); /* never destroy a graph that may still run */
        CU(cudaGraphExecDestroy(plan->exec));
    }
    free(plan->ops);
    free(plan);
}

static void cu_synchronize(eng_backend *be)
{
    cu_impl *c = impl_of(be);
    cu_enter(c);
    cu_sync(c);
}

static void cu_destroy(eng_backend *be)
{
    cu_impl *c = impl_of(be);
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream) cudaStreamSynchronize(c->stream);
        kern_cuda_ctx_destroy(c->kctx);
        if (c->base) cudaFree(c->base);
        if (c->dstage) cudaFree(c->dstage);
        if (c->pinned) cudaFreeHost(c->pinned);
        for (int i = 0; i < STAGE_SEGS; i++)
            if (c->seg_done[i]) cudaEventDestroy(c->seg_done[i]);
        if (c->stream) cudaStreamDestroy(c->stream);
        eng_arena_release(&c->arena);
        free(c);
    }
    free(be);
}

static const eng_backend_ops *cuda_ops(void)
{
    static eng_backend_ops ops; /* filled field by field: C++17 has no designated initializers */
    if (!ops.name) {
        ops.alloc = cu_alloc_fn;
        ops.free = cu_free_fn;
        ops.contains = cu_contains;
        ops.alloc_info = cu_alloc_info;
        ops.bytes_in_use = cu_bytes_in_use;
        ops.upload = cu_upload;
        ops.download = cu_download;
        ops.copy = cu_copy;
        ops.upload_convert = cu_upload_convert;
        ops.device_convert = cu_device_convert;
        ops.run = cu_run;
        ops.plan_create = cu_plan_create;
        ops.plan_launch = cu_plan_launch;
        ops.plan_free = cu_plan_free;
        ops.synchronize = cu_synchronize;
        ops.destroy = cu_destroy;
        ops.name = "cuda";
    }
    return &ops;
}

int eng_backend_cuda_device_count(void) { return kern_cuda_device_count(); }

static size_t env_size(const char *name, size_t dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return (*end || x == 0) ? dflt : (size_t)x;
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            snprintf(err, errlen, "%s: %s (%s)", #call, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
            (void)cudaGetLastError();                                                              \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

/* Everything the backend will ever allocate, in order: stream, events, kernel context, staging,
 * arena (largest last). 0 or -1 with err. */
static int cu_start(cu_impl *c, const eng_backend_config *cfg, int ndev, char *err, size_t errlen)
{
    c->device = (int)env_size("GS_CUDA_DEVICE", 0);
    if (c->device >= ndev) {
        snprintf(err, errlen, "GS_CUDA_DEVICE=%d but only %d CUDA device(s)", c->device, ndev);
        return -1;
    }
    TRY(cudaSetDevice(c->device));
    TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    for (int i = 0; i < STAGE_SEGS; i++) TRY(cudaEventCreateWithFlags(&c->seg_done[i], cudaEventDisableTiming));
    kern_cuda_config kc;
    memset(&kc, 0, sizeof kc);
    kc.device = c->device;
    kc.fast_gemm = env_size("GS_CUDA_FAST_GEMM", 0) == 1; /* cuBLASLt prefill: I9 only up to rounding */
    c->kctx = kern_cuda_ctx_create(&kc, err, errlen);
    if (!c->kctx) return -1;
    c->stage_bytes = env_size("GS_CUDA_STAGING_MB", 64) << 20;
    c->seg_bytes = (c->stage_bytes / STAGE_SEGS) & ~(size_t)255;
    c->stage_bytes = c->seg_bytes * STAGE_SEGS;
    TRY(cudaHostAlloc((void **)&c->pinned, c->stage_bytes, cudaHostAllocDefault));
    TRY(cudaMalloc((void **)&c->dstage, c->stage_bytes));
    size_t free_b = 0, total_b = 0;
    TRY(cudaMemGetInfo(&free_b, &total_b));
    size_t cap = cfg->arena_bytes;
    const size_t headroom = (size_t)2 << 30; /* cuBLASLt, graphs, the driver */
    if (cap == 0) {
        if (free_b <= headroom + ((size_t)64 << 20)) {
            snprintf(err, errlen, "only %zu MiB of device memory free", free_b >> 20);
            return -1;
        }
        cap = free_b - headroom;
    }
    cap = (cap + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    if (cudaMalloc((void **)&c->base, cap) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "cannot allocate a %zu MiB CUDA arena (%zu MiB free of %zu MiB)", cap >> 20,
                 free_b >> 20, total_b >> 20);
        c->base = NULL;
        return -1;
    }
    eng_arena_init(&c->arena, c->base, cap);
    ring_drained(c);
    return 0;
}
#undef TRY

eng_backend *eng_backend_cuda_create(const eng_backend_config *cfg, char *err, size_t errlen)
{
    int ndev = kern_cuda_device_count();
    if (ndev <= 0) {
        snprintf(err, errlen, "no CUDA device is available");
        return NULL;
    }
    eng_backend *be = (eng_backend *)calloc(1, sizeof *be);
    cu_impl *c = (cu_impl *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        snprintf(err, errlen, "out of memory creating the CUDA backend");
        return NULL;
    }
    be->ops = cuda_ops();
    be->impl = c;
    be->checked = cfg->checked;
    if (cu_start(c, cfg, ndev, err, errlen) != 0) {
        cu_destroy(be);
        return NULL;
    }
    return be;
}

void *eng_backend_cuda_stream(eng_backend *be) { return (void *)impl_of(be)->stream; }

size_t eng_backend_cuda_arena_capacity(eng_backend *be) { return impl_of(be)->arena.cap; }
size_t eng_backend_cuda_arena_used(eng_backend *be) { return impl_of(be)->arena.used; }

void eng_backend_cuda_describe(eng_backend *be, char *out, size_t outlen)
{
    cu_impl *c = impl_of(be);
    struct cudaDeviceProp prop;
    int drv = 0, rt = 0;
    memset(&prop, 0, sizeof prop);
    if (cudaGetDeviceProperties(&prop, c->device) != cudaSuccess) (void)cudaGetLastError();
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    snprintf(out, outlen, "%s, %d SMs, %.1f GiB, cc %d.%d, driver API %d.%d, runtime %d.%d", prop.name,
             prop.multiProcessorCount, (double)prop.totalGlobalMem / (double)(1u << 30), prop.major, prop.minor,
             drv / 1000, (drv % 1000) / 10, rt / 1000, (rt % 1000) / 10);
}
