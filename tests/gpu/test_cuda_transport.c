/* tests/gpu/test_cuda_transport.c — the GPU weight transports below HTTP (label gpu; exit 77
 * without a device):
 *  1. backend device_convert: device -> device F32/F16/BF16 conversions, bit-identical to the
 *     host's mdl_convert, and exact same-dtype copies;
 *  2. CUDA IPC from a second process: a child cudaMallocs a buffer, fills it with F32 values and
 *     sends its cudaIpcMemHandle_t over a pipe; this process maps it with the module's ipc_open,
 *     converts from it into the arena with device_convert (as /v1/weights/ipc/bucket does),
 *     compares, and unmaps it (ipc_close) before the child frees its buffer;
 *  3. NCCL (built with NCCL only): the child is rank 0 (ncclGetUniqueId, ncclCommInitRank,
 *     an in-place ncclAllReduce of one float32 1.0 as vLLM's PyNcclCommunicator warm-up, then
 *     ncclBroadcast of a byte pattern), this process rank 1 through nccl_init, nccl_warmup (its
 *     zeroed float + the child's 1.0 = 1.0) and nccl_recv into an arena staging buffer, then
 *     nccl_destroy;
 *  4. NCCL with graphswap at rank 0 (TRL's /init_communicator/): this process makes the id with
 *     nccl_unique_id and sends it; the child joins as rank 1 (the trainer), runs the warm-up
 *     all_reduce and broadcasts another pattern from root 1, which nccl_recv(root 1) receives.
 * The child forks before this process touches CUDA (a forked child must not inherit a CUDA context). */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#if GS_HAVE_NCCL
#include <nccl.h>
#endif

#include "engine/backend/transport_cuda.h"
#include "gpu_test.h"

static int failures;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            failures++;                                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#define N_IPC 100003
#define N_NCCL ((size_t)3 << 20)

static float pattern(size_t i) { return (float)((double)(i % 9973) * 0.37 - 1700.0) * ((i & 1) ? 1e-3f : 1.0f); }

static int rd(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* ---- the child (the "trainer") --------------------------------------------------------------------- */
#if GS_HAVE_NCCL
/* The trainer of one group of 2 at `rank`, the root of its broadcast: init, vLLM's warm-up
 * all_reduce (vLLM sends zeros; 1.0 shows the sum ran), then a broadcast of the byte pattern
 * i * mul + add; the group is destroyed once the parent has checked it. */
static int child_nccl(ncclUniqueId id, int rank, unsigned mul, unsigned add, int from_parent)
{
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 1;
    float one = 1.0f, *dw = NULL;
    if (cudaMalloc((void **)&dw, sizeof one) != cudaSuccess ||
        cudaMemcpy(dw, &one, sizeof one, cudaMemcpyHostToDevice) != cudaSuccess ||
        ncclAllReduce(dw, dw, 1, ncclFloat32, ncclSum, comm, 0) != ncclSuccess || cudaDeviceSynchronize() != cudaSuccess)
        return 1;
    cudaFree(dw);
    uint8_t *hb = malloc(N_NCCL), *db = NULL;
    for (size_t i = 0; i < N_NCCL; i++) hb[i] = (uint8_t)(i * mul + add);
    if (cudaMalloc((void **)&db, N_NCCL) != cudaSuccess || cudaMemcpy(db, hb, N_NCCL, cudaMemcpyHostToDevice) != cudaSuccess)
        return 1;
    if (ncclBroadcast(db, db, N_NCCL, ncclUint8, rank, comm, 0) != ncclSuccess) return 1;
    cudaDeviceSynchronize();
    char go;
    if (rd(from_parent, &go, 1) != 0) return 1;
    ncclCommDestroy(comm);
    cudaFree(db);
    free(hb);
    return 0;
}
#endif

static int child(int to_parent, int from_parent)
{
    char status = 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        status = 77;
        (void)!write(to_parent, &status, 1);
        return 0;
    }
    (void)!write(to_parent, &status, 1);
    /* IPC */
    float *h = malloc(N_IPC * sizeof *h), *d = NULL;
    for (size_t i = 0; i < N_IPC; i++) h[i] = pattern(i);
    cudaIpcMemHandle_t ih;
    if (cudaMalloc((void **)&d, N_IPC * sizeof *h) != cudaSuccess ||
        cudaMemcpy(d, h, N_IPC * sizeof *h, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaIpcGetMemHandle(&ih, d) != cudaSuccess)
        return 1;
    (void)!write(to_parent, &ih, sizeof ih);
    char go;
    if (rd(from_parent, &go, 1) != 0) return 1; /* the parent unmapped it */
    cudaFree(d);
    free(h);
#if GS_HAVE_NCCL
    /* 3: this child is rank 0 and makes the id; 4: the parent is rank 0 (its id), this child rank 1 */
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
    (void)!write(to_parent, &id, sizeof id);
    if (child_nccl(id, 0, 131u, 7u, from_parent) != 0) return 1;
    if (rd(from_parent, &id, sizeof id) != 0 || child_nccl(id, 1, 29u, 3u, from_parent) != 0) return 1;
#endif
    return 0;
}

/* ---- tests ------------------------------------------------------------------------------------------ */
static void test_device_convert(eng_backend *be)
{
    const size_t n = 70001;
    const mdl_dtype dts[3] = {MDL_DT_F32, MDL_DT_F16, MDL_DT_BF16};
    float *f = malloc(n * 4);
    for (size_t i = 0; i < n; i++) f[i] = pattern(i) * (i % 7 == 0 ? 1e-6f : 1.0f);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            size_t sa = mdl_dtype_size(dts[a]), sb = mdl_dtype_size(dts[b]);
            uint8_t *hs = malloc(n * sa), *want = malloc(n * sb), *got = malloc(n * sb);
            mdl_convert(hs, dts[a], f, MDL_DT_F32, n);
            mdl_convert(want, dts[b], hs, dts[a], n);
            void *ds = be->ops->alloc(be, n * sa, "t.src"), *dd = be->ops->alloc(be, n * sb, "t.dst");
            be->ops->upload(be, ds, hs, n * sa);
            CHECK(be->ops->device_convert(be, dd, dts[b], ds, dts[a], n) == 0, "device_convert %s -> %s",
                  mdl_dtype_name(dts[a]), mdl_dtype_name(dts[b]));
            be->ops->download(be, got, dd, n * sb);
            CHECK(memcmp(got, want, n * sb) == 0, "device_convert %s -> %s differs from mdl_convert",
                  mdl_dtype_name(dts[a]), mdl_dtype_name(dts[b]));
            free(hs);
            free(want);
            free(got);
        }
    CHECK(be->ops->device_convert(be, f, MDL_DT_I32, f, MDL_DT_F32, 1) == -1, "I32 refused");
    free(f);
}

static void test_ipc(eng_backend *be, const gs_gpu_transport *x, int from_child, int to_child)
{
    cudaIpcMemHandle_t ih;
    CHECK(rd(from_child, &ih, sizeof ih) == 0, "no IPC handle from the child");
    char err[512] = "";
    uint8_t junk[GS_IPC_HANDLE_BYTES - 1] = {0};
    CHECK(x->ipc_open(be, junk, sizeof junk, err, sizeof err) == NULL && strstr(err, "bytes"), "short handle refused: %s", err);
    void *p = x->ipc_open(be, &ih, sizeof ih, err, sizeof err);
    CHECK(p != NULL, "ipc_open: %s", err);
    if (p) {
        float *f = malloc(N_IPC * 4);
        uint16_t *want = malloc(N_IPC * 2), *got = malloc(N_IPC * 2);
        for (size_t i = 0; i < N_IPC; i++) f[i] = pattern(i);
        mdl_convert(want, MDL_DT_BF16, f, MDL_DT_F32, N_IPC);
        void *dd = be->ops->alloc(be, N_IPC * 2, "t.ipc");
        CHECK(be->ops->device_convert(be, dd, MDL_DT_BF16, p, MDL_DT_F32, N_IPC) == 0, "convert from IPC");
        be->ops->synchronize(be);
        be->ops->download(be, got, dd, N_IPC * 2);
        CHECK(memcmp(got, want, N_IPC * 2) == 0, "bytes read through the IPC mapping differ");
        x->ipc_close(be, p);
        free(f);
        free(want);
        free(got);
    }
    char go = 1;
    (void)!write(to_child, &go, 1);
}

#if GS_HAVE_NCCL
/* Joins the child's group as `rank` (the child is the other rank and the root), runs the warm-up
 * and receives the child's pattern i * mul + add through nccl_recv into an arena staging buffer. */
static void nccl_group(eng_backend *be, const gs_gpu_transport *x, const uint8_t *id, int rank, unsigned mul,
                       unsigned add, int to_child)
{
    char err[512] = "";
    gs_nccl *g = x->nccl_init(be, id, GS_NCCL_ID_BYTES, rank, 2, 120, err, sizeof err);
    CHECK(g != NULL, "nccl_init rank %d: %s", rank, err);
    if (g) {
        uint8_t *stage = be->ops->alloc(be, N_NCCL + 4096, "t.nccl.staging");
        be->ops->upload(be, stage, "\x7f\x7f\x7f\x7f", 4); /* nccl_warmup zeroes it first */
        CHECK(x->nccl_warmup(g, stage, 120, err, sizeof err) == 0, "nccl_warmup: %s", err);
        float w = 0;
        be->ops->download(be, &w, stage, sizeof w);
        CHECK(w == 1.0f, "warm-up all_reduce: %g, want 0 + 1 = 1", (double)w);
        CHECK(x->nccl_recv(g, stage, N_NCCL, 1 - rank, 120, err, sizeof err) == 0, "nccl_recv root %d: %s", 1 - rank,
              err);
        uint8_t *got = malloc(N_NCCL);
        be->ops->download(be, got, stage, N_NCCL);
        size_t bad = 0;
        for (size_t i = 0; i < N_NCCL; i++) bad += got[i] != (uint8_t)(i * mul + add);
        CHECK(bad == 0, "root %d: %zu of %zu broadcast bytes differ", 1 - rank, bad, N_NCCL);
        free(got);
    }
    char go = 1;
    (void)!write(to_child, &go, 1);
    x->nccl_destroy(g);
}

static void test_nccl(eng_backend *be, const gs_gpu_transport *x, int from_child, int to_child)
{
    uint8_t id[GS_NCCL_ID_BYTES];
    char err[512] = "";
    /* 3: the child (the trainer) is rank 0 and makes the id; this server rank 1 */
    CHECK(rd(from_child, id, sizeof id) == 0, "no NCCL id from the child");
    CHECK(x->nccl_init(be, id, sizeof id, 2, 2, 5, err, sizeof err) == NULL, "rank 2 of 2 refused");
    nccl_group(be, x, id, 1, 131u, 7u, to_child);
    /* 4: TRL's layout: this server is rank 0 and makes the id, the trainer (rank 1) is the root */
    CHECK(x->nccl_unique_id(id, err, sizeof err) == 0, "nccl_unique_id: %s", err);
    (void)!write(to_child, id, sizeof id);
    nccl_group(be, x, id, 0, 29u, 3u, to_child);
}
#endif

int main(void)
{
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        _exit(child(up[1], down[0]));
    }
    close(up[1]);
    close(down[0]);
    char cst = 0;
    if (rd(up[0], &cst, 1) != 0 || cst == 77 || eng_backend_cuda_device_count() <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        printf("no usable CUDA device: skipped (exit 77)\n");
        return 77;
    }
    char err[512];
    eng_backend_config cfg = {.arena_bytes = (size_t)1 << 30, .threads = 1, .checked = 1};
    eng_backend *be = eng_backend_cuda_create(&cfg, err, sizeof err);
    if (!be) {
        printf("FAIL: backend: %s\n", err);
        kill(pid, SIGKILL);
        return 1;
    }
    const gs_gpu_transport *x = gs_gpu_transport_table();
    CHECK(x && x->abi == GS_GPU_TRANSPORT_ABI, "transport table");
    test_device_convert(be);
    test_ipc(be, x, up[0], down[1]);
#if GS_HAVE_NCCL
    CHECK(x->have_nccl, "built with NCCL");
    test_nccl(be, x, up[0], down[1]);
#else
    printf("NCCL part skipped: built without NCCL\n");
#endif
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child exit status %d", ws);
    eng_backend_destroy(be);
    printf("%s (%d failures)\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}
