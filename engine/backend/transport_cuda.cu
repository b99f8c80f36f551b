/* engine/backend/transport_cuda.cu — NCCL and CUDA-IPC weight transports of the CUDA module (see
 * engine/backend/transport_cuda.h). Built into libgraphswap_cuda.so (and gs_cuda for tests); NCCL is used
 * only when cmake/cuda.cmake found nccl.h and libnccl (GS_HAVE_NCCL=1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#if GS_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

#include "engine/backend/backend_cuda.h"
#include "engine/backend/transport_cuda.h"

#if GS_HAVE_NCCL
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void nap(void)
{
    struct timespec ts = {0, 200000}; /* 0.2 ms */
    nanosleep(&ts, NULL);
}
#endif

static cudaStream_t stream_of(eng_backend *be) { return (cudaStream_t)eng_backend_cuda_stream(be); }

/* the backend's device current on this thread */
static int enter(eng_backend *be, char *err, size_t errlen)
{
    int dev = 0;
    cudaError_t e = cudaStreamGetDevice(stream_of(be), &dev);
    if (e == cudaSuccess) e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* ---- NCCL ---------------------------------------------------------------------------------------------- */

#if GS_HAVE_NCCL
/* libnccl is loaded on first use (dlopen), not linked: the module, and so `--backend cuda`, must
 * load on machines without NCCL; only the NCCL routes need it. GRAPHSWAP_NCCL_LIB overrides the
 * library path (default libnccl.so.2, then libnccl.so). */
static struct {
    int tried, ok;
    char why[256];
    ncclResult_t (*init_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
    const char *(*error_string)(ncclResult_t);
    const char *(*last_error)(ncclComm_t);
    ncclResult_t (*abort_comm)(ncclComm_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*finalize)(ncclComm_t);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
} N;

static int nccl_load(char *err, size_t errlen)
{
    if (!N.tried) {
        N.tried = 1;
        const char *env = getenv("GRAPHSWAP_NCCL_LIB");
        void *h = dlopen(env && *env ? env : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!h && !(env && *env)) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(N.why, sizeof N.why, "cannot load NCCL (%s): install libnccl2 or set GRAPHSWAP_NCCL_LIB", dlerror());
        } else {
            int miss = 0;
#define NSYM(field, name) miss |= !(*(void **)&N.field = dlsym(h, name))
            NSYM(init_config, "ncclCommInitRankConfig");
            NSYM(async_error, "ncclCommGetAsyncError");
            NSYM(error_string, "ncclGetErrorString");
            NSYM(last_error, "ncclGetLastError");
            NSYM(abort_comm, "ncclCommAbort");
            NSYM(broadcast, "ncclBroadcast");
            NSYM(all_reduce, "ncclAllReduce");
            NSYM(finalize, "ncclCommFinalize");
            NSYM(destroy, "ncclCommDestroy");
            NSYM(get_unique_id, "ncclGetUniqueId");
#undef NSYM
            if (miss) snprintf(N.why, sizeof N.why, "the loaded NCCL lacks a needed function (NCCL >= 2.14 needed)");
            else N.ok = 1;
        }
    }
    if (!N.ok) snprintf(err, errlen, "%s", N.why);
    return N.ok ? 0 : -1;
}

struct gs_nccl {
    eng_backend *be;
    ncclComm_t comm;
    int rank, world;
    int broken; /* aborted after an error or a timeout: only destroy is valid */
};

/* Aborts the communicator after an error or a timeout: only destroy is valid afterwards. */
static void nccl_break(gs_nccl *g)
{
    if (g->comm) N.abort_comm(g->comm); /* also ends a kernel waiting on the stream */
    g->comm = NULL;
    g->broken = 1;
}

/* Waits while a non-blocking communicator reports ncclInProgress. 0, or -1 with err (timeout or
 * error: the communicator is aborted). */
static int nccl_wait(gs_nccl *g, double deadline, const char *what, char *err, size_t errlen)
{
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = N.async_error(g->comm, &st);
        if (r != ncclSuccess) st = r;
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) {
            snprintf(err, errlen, "NCCL %s failed: %s (%s)", what, N.error_string(st), N.last_error(g->comm));
            break;
        }
        if (now_s() > deadline) {
            snprintf(err, errlen, "NCCL %s timed out (is the trainer, rank 0, taking part?)", what);
            break;
        }
        nap();
    }
    nccl_break(g);
    return -1;
}

static gs_nccl *nccl_init(eng_backend *be, const void *unique_id, size_t id_len, int rank, int world,
                          double timeout_s, char *err, size_t errlen)
{
    if (id_len != sizeof(ncclUniqueId)) {
        snprintf(err, errlen, "an NCCL unique id has %zu bytes, got %zu", sizeof(ncclUniqueId), id_len);
        return NULL;
    }
    if (world < 2 || rank < 0 || rank >= world) {
        snprintf(err, errlen, "rank %d of world %d: a rank is 0..world-1 and a group has at least 2", rank, world);
        return NULL;
    }
    if (nccl_load(err, errlen) != 0 || enter(be, err, errlen) != 0) return NULL;
    gs_nccl *g = (gs_nccl *)calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    g->be = be;
    g->rank = rank;
    g->world = world;
    ncclUniqueId id;
    memcpy(&id, unique_id, sizeof id);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* bounded waits: a missing peer must not hang the engine thread */
    ncclResult_t r = N.init_config(&g->comm, world, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        snprintf(err, errlen, "ncclCommInitRank (rank %d of %d) failed: %s", rank, world, N.error_string(r));
        if (g->comm) N.abort_comm(g->comm);
        free(g);
        return NULL;
    }
    if (nccl_wait(g, now_s() + timeout_s, "communicator init", err, errlen) != 0) {
        free(g);
        return NULL;
    }
    return g;
}

static int nccl_usable(gs_nccl *g, char *err, size_t errlen)
{
    if (!g || g->broken || !g->comm) {
        snprintf(err, errlen, "the NCCL communicator failed earlier: destroy the group and init it again");
        return -1;
    }
    return 0;
}

/* After a collective was enqueued (r: the enqueue's result) on the backend's stream: waits for the
 * non-blocking enqueue, then until the stream gets past the collective, watching the
 * communicator's async error, until deadline. 0, or -1 with err (the communicator is aborted).
 * what names the collective in messages; hint ends a timeout's message. */
static int nccl_finish(gs_nccl *g, ncclResult_t r, double deadline, double timeout_s, const char *what,
                       const char *hint, char *err, size_t errlen)
{
    if (r != ncclSuccess && r != ncclInProgress) {
        snprintf(err, errlen, "NCCL %s failed: %s", what, N.error_string(r));
        nccl_break(g);
        return -1;
    }
    char w[160];
    snprintf(w, sizeof w, "%s enqueue", what);
    if (nccl_wait(g, deadline, w, err, errlen) != 0) return -1;
    cudaStream_t s = stream_of(g->be);
    for (;;) {
        cudaError_t ce = cudaStreamQuery(s);
        if (ce == cudaSuccess) return 0;
        if (ce != cudaErrorNotReady) {
            snprintf(err, errlen, "CUDA error while waiting for the NCCL %s: %s", what, cudaGetErrorString(ce));
            break;
        }
        ncclResult_t st = ncclSuccess;
        ncclResult_t q = N.async_error(g->comm, &st);
        if (q != ncclSuccess) st = q;
        if (st != ncclSuccess && st != ncclInProgress) {
            snprintf(err, errlen, "NCCL %s failed: %s", what, N.error_string(st));
            break;
        }
        if (now_s() > deadline) {
            snprintf(err, errlen, "NCCL %s timed out after %.0f s%s", what, timeout_s, hint);
            break;
        }
        nap();
    }
    nccl_break(g);
    return -1;
}

static int nccl_recv(gs_nccl *g, void *dst_dev, size_t bytes, int root, double timeout_s, char *err,
                     size_t errlen)
{
    if (nccl_usable(g, err, errlen) != 0) return -1;
    if (bytes == 0) return 0;
    if (enter(g->be, err, errlen) != 0) return -1;
    const double deadline = now_s() + timeout_s;
    ncclResult_t r = N.broadcast(dst_dev, dst_dev, bytes, ncclUint8, root, g->comm, stream_of(g->be));
    char what[96];
    snprintf(what, sizeof what, "broadcast of %zu bytes from rank %d", bytes, root);
    /* the bytes are there when the stream gets past the broadcast */
    return nccl_finish(g, r, deadline, timeout_s, what,
                       " (did the trainer broadcast exactly the bytes the metadata describes?)", err, errlen);
}

static int nccl_warmup(gs_nccl *g, void *scratch_dev, double timeout_s, char *err, size_t errlen)
{
    if (nccl_usable(g, err, errlen) != 0) return -1;
    if (!scratch_dev) {
        snprintf(err, errlen, "NCCL warm-up all_reduce: no device scratch buffer");
        return -1;
    }
    if (enter(g->be, err, errlen) != 0) return -1;
    const double deadline = now_s() + timeout_s;
    cudaStream_t s = stream_of(g->be);
    /* torch.zeros(1) on the peers: the same float32 0 here */
    cudaError_t ce = cudaMemsetAsync(scratch_dev, 0, sizeof(float), s);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "NCCL warm-up all_reduce: cudaMemsetAsync: %s", cudaGetErrorString(ce));
        return -1;
    }
    ncclResult_t r = N.all_reduce(scratch_dev, scratch_dev, 1, ncclFloat32, ncclSum, g->comm, s);
    return nccl_finish(g, r, deadline, timeout_s, "warm-up all_reduce (1 float32, sum)",
                       " (vLLM's ranks run it right after the communicator init: is the trainer's rank 0 "
                       "a vLLM PyNcclCommunicator?)", err, errlen);
}

static int nccl_unique_id(void *id, char *err, size_t errlen)
{
    if (nccl_load(err, errlen) != 0) return -1;
    ncclUniqueId u;
    ncclResult_t r = N.get_unique_id(&u);
    if (r != ncclSuccess) {
        snprintf(err, errlen, "ncclGetUniqueId failed: %s", N.error_string(r));
        return -1;
    }
    memcpy(id, &u, sizeof u);
    return 0;
}

static void nccl_destroy(gs_nccl *g)
{
    if (!g) return;
    if (g->comm) {
        char e[16];
        if (enter(g->be, e, sizeof e) == 0) cudaStreamSynchronize(stream_of(g->be));
        N.finalize(g->comm);
        ncclResult_t st = ncclInProgress;
        const double deadline = now_s() + 30;
        while (N.async_error(g->comm, &st) == ncclSuccess && st == ncclInProgress && now_s() < deadline)
            nap();
        if (st == ncclSuccess) N.destroy(g->comm);
        else N.abort_comm(g->comm);
    }
    free(g);
}
#else
static gs_nccl *nccl_init(eng_backend *be, const void *unique_id, size_t id_len, int rank, int world,
                          double timeout_s, char *err, size_t errlen)
{
    (void)be, (void)unique_id, (void)id_len, (void)rank, (void)world, (void)timeout_s;
    snprintf(err, errlen, "this libgraphswap_cuda.so was built without NCCL (no nccl.h / libnccl at configure time)");
    return NULL;
}
static int nccl_recv(gs_nccl *g, void *dst_dev, size_t bytes, int root, double timeout_s, char *err,
                     size_t errlen)
{
    (void)g, (void)dst_dev, (void)bytes, (void)root, (void)timeout_s;
    snprintf(err, errlen, "built without NCCL");
    return -1;
}
static int nccl_warmup(gs_nccl *g, void *scratch_dev, double timeout_s, char *err, size_t errlen)
{
    (void)g, (void)scratch_dev, (void)timeout_s;
    snprintf(err, errlen, "built without NCCL");
    return -1;
}
static int nccl_unique_id(void *id, char *err, size_t errlen)
{
    (void)id;
    snprintf(err, errlen, "this libgraphswap_cuda.so was built without NCCL (no nccl.h / libnccl at configure time)");
    return -1;
}
static void nccl_destroy(gs_nccl *g) { (void)g; }
#endif

/* ---- CUDA IPC ------------------------------------------------------------------------------------------ */

static void *ipc_open(eng_backend *be, const void *handle, size_t handle_len, char *err, size_t errlen)
{
    if (handle_len != sizeof(cudaIpcMemHandle_t)) {
        snprintf(err, errlen, "a cudaIpcMemHandle_t has %zu bytes, got %zu", sizeof(cudaIpcMemHandle_t), handle_len);
        return NULL;
    }
    if (enter(be, err, errlen) != 0) return NULL;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    void *p = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it */
        snprintf(err, errlen, "cudaIpcOpenMemHandle: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void ipc_close(eng_backend *be, void *base)
{
    if (!base) return;
    char e[16];
    if (enter(be, e, sizeof e) != 0) return;
    cudaStreamSynchronize(stream_of(be)); /* no queued copy may still read the mapping */
    if (cudaIpcCloseMemHandle(base) != cudaSuccess) cudaGetLastError();
}

extern "C" const gs_gpu_transport *gs_gpu_transport_table(void)
{
    static gs_gpu_transport t;
    if (!t.abi) {
        t.have_nccl = GS_HAVE_NCCL ? 1 : 0;
        t.nccl_init = nccl_init;
        t.nccl_recv = nccl_recv;
        t.nccl_destroy = nccl_destroy;
        t.ipc_open = ipc_open;
        t.ipc_close = ipc_close;
        t.nccl_warmup = nccl_warmup;
        t.nccl_unique_id = nccl_unique_id;
        t.abi = GS_GPU_TRANSPORT_ABI;
    }
    return &t;
}
