/* engine/backend/backend_cuda.cu — the CUDA backend (contract: engine/backend/backend.h; design: backend_cuda.h).
 * Host code only, written in the C subset of C++ against the CUDA runtime's C API (a .cu file so that
 * the CPU-only build, which globs the .c files of engine/, never sees it); the kernels are behind
 * kernels/cuda/kern_cuda.h. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h> /* driver API types only: the VMM entry points come from cudaGetDriverEntryPointByVersion */
#include <cuda_runtime_api.h>

#include "engine/backend/arena.h"
#include "engine/backend/backend_cuda.h"
#include "kernels/cuda/kern_cuda.h"

#define STAGE_SEGS 8

/* The granule spans one sleeping group gave up (mem_release), to back them again. */
typedef struct {
    int released;
    eng_range_list spans;
} cu_group;

/* Driver entry points of the virtual-memory API (no link against libcuda: the binary and the tests
 * must load where there is no driver). */
typedef struct {
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*err_name)(CUresult, const char **);
} cu_vmm;
static cu_vmm g_vmm;

typedef struct {
    int device;
    cudaStream_t stream;
    kern_cuda_ctx *kctx;
    /* arena: one reserved virtual range (cuMemAddressReserve), backed granule by granule on demand
     * (cuMemCreate + cuMemMap + cuMemSetAccess: one physical allocation per granule, so that sleep
     * can give back any granule and map a fresh one at the same address); the shared allocation
     * table (engine/backend/arena.h) */
    uint8_t *base;
    eng_arena arena;
    size_t gran;                      /* VMM granularity (2 MiB on H100 / H200) */
    CUmemGenericAllocationHandle *h;  /* [cap / gran]: 0 = not backed */
    size_t n_gran, backed_end;        /* granules [0, backed_end) were backed once */
    cu_group groups[ENG_MEM_GROUPS];
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

static const char *vmm_err(CUresult r)
{
    const char *n = NULL;
    if (!g_vmm.err_name || g_vmm.err_name(r, &n) != CUDA_SUCCESS || !n) return "CUDA_ERROR_?";
    return n;
}

static void vmm_die(CUresult r, const char *what, int line)
{
    fprintf(stderr, "graphswap: CUDA driver error %s (%d) in %s (backend_cuda.cu:%d)\n", vmm_err(r), (int)r, what,
            line);
    abort();
}
#define DRV(call)                                                                                  \
    do {                                                                                           \
        CUresult drv_r_ = (call);                                                                  \
        if (drv_r_ != CUDA_SUCCESS) vmm_die(drv_r_, #call, __LINE__);                              \
    } while (0)

static CUmemAllocationProp vmm_prop(const cu_impl *c)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = c->device;
    return p;
}

/* Backs granules [g0, g1) that are not backed (fresh physical memory, read-write for the device).
 * Returns 0, or the driver's error (out of memory: the granules backed so far stay backed). */
static CUresult vmm_back(cu_impl *c, size_t g0, size_t g1)
{
    const CUmemAllocationProp prop = vmm_prop(c);
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (size_t g = g0; g < g1; g++) {
        if (c->h[g]) continue;
        const CUdeviceptr va = (CUdeviceptr)(uintptr_t)(c->base + g * c->gran);
        CUmemGenericAllocationHandle h = 0;
        CUresult r = g_vmm.create(&h, c->gran, &prop, 0);
        if (r != CUDA_SUCCESS) return r;
        r = g_vmm.map(va, c->gran, 0, h, 0);
        if (r != CUDA_SUCCESS) {
            DRV(g_vmm.release(h));
            return r;
        }
        r = g_vmm.set_access(va, c->gran, &acc, 1);
        if (r != CUDA_SUCCESS) {
            DRV(g_vmm.unmap(va, c->gran));
            DRV(g_vmm.release(h));
            return r;
        }
        c->h[g] = h;
    }
    return CUDA_SUCCESS;
}

/* Gives granules [g0, g1) back to the driver (the virtual range stays reserved). */
static void vmm_unback(cu_impl *c, size_t g0, size_t g1)
{
    for (size_t g = g0; g < g1; g++) {
        if (!c->h[g]) continue;
        DRV(g_vmm.unmap((CUdeviceptr)(uintptr_t)(c->base + g * c->gran), c->gran));
        DRV(g_vmm.release(c->h[g]));
        c->h[g] = 0;
    }
}

static void *cu_alloc_fn(eng_backend *be, size_t bytes, const char *tag)
{
    cu_impl *c = impl_of(be);
    size_t align = bytes >= (1u << 20) ? ((size_t)2 << 20) : 256;
    void *p = eng_arena_take(&c->arena, bytes, align, tag);
    if (!p) return NULL;
    cu_enter(c);
    const size_t end = (c->arena.used + c->gran - 1) / c->gran;
    if (end > c->backed_end) { /* back the granules the bump pointer entered */
        CUresult r = vmm_back(c, c->backed_end, end);
        if (r != CUDA_SUCCESS) {
            if (r != CUDA_ERROR_OUT_OF_MEMORY) vmm_die(r, "cuMemCreate / cuMemMap (arena)", __LINE__);
            (void)eng_arena_retire(&c->arena, p); /* (its range is never handed out again) */
            return NULL;
        }
        c->backed_end = end;
    }
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
    const int f8 = src_dt == MDL_DT_F8_E4M3 && dst_dt == MDL_DT_F8_E4M3; /* FP8 codes: copied, never converted */
    if (!f8 && (!convertible(src_dt) || !convertible(dst_dt))) return -1;
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
    if (src_dt == MDL_DT_F8_E4M3 && dst_dt == MDL_DT_F8_E4M3) { /* FP8 codes: copied */
        if (n && (!dst || !src)) return -1;
        if (n) cu_copy(be, dst, src, n);
        return 0;
    }
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

/* ---- sleep: unmap granules, map fresh ones at the same addresses ----------------------------------- */

static int cu_mem_release(eng_backend *be, int group, void *const *ptrs, size_t n, size_t *released, char *err,
                          size_t errlen)
{
    cu_impl *c = impl_of(be);
    *released = 0;
    if (group < 0 || group >= ENG_MEM_GROUPS || c->groups[group].released) {
        snprintf(err, errlen, "memory group %d is already released", group);
        return -1;
    }
    cu_group *g = &c->groups[group];
    const int rc = eng_arena_collect_spans(&c->arena, ptrs, n, c->gran, &g->spans);
    if (rc != 0) {
        snprintf(err, errlen, rc == -1 ? "release of a pointer that starts no live arena allocation"
                                       : "out of host memory");
        return -1;
    }
    const eng_range_list *sp = &g->spans;
    cu_enter(c);
    cu_sync(c); /* nothing in flight may still read or write what is unmapped */
    for (size_t i = 0; i < sp->n; i++) {
        const size_t g0 = (size_t)((uint8_t *)sp->ptr[i] - c->base) / c->gran, g1 = g0 + sp->bytes[i] / c->gran;
        vmm_unback(c, g0, g1);
        *released += sp->bytes[i];
    }
    g->released = 1;
    return 0;
}

static int cu_mem_restore(eng_backend *be, int group, char *err, size_t errlen)
{
    cu_impl *c = impl_of(be);
    if (group < 0 || group >= ENG_MEM_GROUPS || !c->groups[group].released) {
        snprintf(err, errlen, "memory group %d is not released", group);
        return -1;
    }
    cu_group *g = &c->groups[group];
    const eng_range_list *sp = &g->spans;
    cu_enter(c);
    for (size_t i = 0; i < sp->n; i++) {
        const size_t g0 = (size_t)((uint8_t *)sp->ptr[i] - c->base) / c->gran, g1 = g0 + sp->bytes[i] / c->gran;
        CUresult r = vmm_back(c, g0, g1); /* (skips granules a failed earlier try already backed) */
        if (r != CUDA_SUCCESS) {
            if (r != CUDA_ERROR_OUT_OF_MEMORY) vmm_die(r, "cuMemCreate / cuMemMap (wake-up)", __LINE__);
            snprintf(err, errlen, "out of device memory mapping %zu MiB back at wake-up (is the trainer still "
                     "holding it?); try again", sp->bytes[i] >> 20);
            return -1; /* still released: a later wake-up retries */
        }
        CU(cudaMemsetAsync(sp->ptr[i], 0, sp->bytes[i], c->stream)); /* zeroed, as alloc() promises */
    }
    cu_sync(c);
    g->released = 0;
    g->spans.n = 0;
    return 0;
}

static void cu_destroy(eng_backend *be)
{
    cu_impl *c = impl_of(be);
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream) cudaStreamSynchronize(c->stream);
        kern_cuda_ctx_destroy(c->kctx);
        if (c->h) {
            vmm_unback(c, 0, c->n_gran);
            free(c->h);
        }
        if (c->base) DRV(g_vmm.addr_free((CUdeviceptr)(uintptr_t)c->base, c->n_gran * c->gran));
        for (int i = 0; i < ENG_MEM_GROUPS; i++) eng_range_list_free(&c->groups[i].spans);
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
        ops.mem_release = cu_mem_release;
        ops.mem_restore = cu_mem_restore;
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

/* The driver's virtual-memory entry points (once). 0 or -1 with err. */
static int vmm_load(char *err, size_t errlen)
{
    if (g_vmm.create) return 0;
    struct {
        const char *name;
        void **fn;
    } want[] = {
        {"cuMemAddressReserve", (void **)&g_vmm.reserve}, {"cuMemAddressFree", (void **)&g_vmm.addr_free},
        {"cuMemCreate", (void **)&g_vmm.create},          {"cuMemRelease", (void **)&g_vmm.release},
        {"cuMemMap", (void **)&g_vmm.map},                {"cuMemUnmap", (void **)&g_vmm.unmap},
        {"cuMemSetAccess", (void **)&g_vmm.set_access},   {"cuMemGetAllocationGranularity", (void **)&g_vmm.granularity},
        {"cuGetErrorName", (void **)&g_vmm.err_name},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        void *fn = NULL;
        cudaError_t e = cudaGetDriverEntryPointByVersion(want[i].name, &fn, 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
            (void)cudaGetLastError();
            snprintf(err, errlen, "the CUDA driver has no %s (virtual memory management): %s", want[i].name,
                     cudaGetErrorName(e));
            memset(&g_vmm, 0, sizeof g_vmm);
            return -1;
        }
        *want[i].fn = fn;
    }
    return 0;
}

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
    if (vmm_load(err, errlen) != 0) return -1;
    CUmemAllocationProp prop = vmm_prop(c);
    CUresult r = g_vmm.granularity(&c->gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS || c->gran == 0 || (c->gran & (c->gran - 1))) {
        snprintf(err, errlen, "cuMemGetAllocationGranularity: %s", vmm_err(r));
        return -1;
    }
    if (c->gran < ((size_t)2 << 20)) c->gran = (size_t)2 << 20; /* (the 2 MiB alignment of large allocations) */
    cap = (cap + c->gran - 1) & ~(c->gran - 1);
    /* only the address range is reserved here: granules are backed as allocations reach them, so a
     * too large --gpu-memory-mb fails at the allocation that does not fit */
    CUdeviceptr va = 0;
    r = g_vmm.reserve(&va, cap, c->gran, 0, 0);
    if (r != CUDA_SUCCESS) {
        snprintf(err, errlen, "cannot reserve a %zu MiB CUDA arena address range: %s (%zu MiB free of %zu MiB)",
                 cap >> 20, vmm_err(r), free_b >> 20, total_b >> 20);
        return -1;
    }
    c->base = (uint8_t *)(uintptr_t)va;
    c->n_gran = cap / c->gran;
    c->h = (CUmemGenericAllocationHandle *)calloc(c->n_gran, sizeof *c->h);
    if (!c->h) {
        snprintf(err, errlen, "out of host memory");
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
