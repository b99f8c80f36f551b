/* engine/backend/transport_cuda.h — the GPU weight transports (NCCL broadcast, CUDA IPC) of the CUDA module.
 *
 * They live in libgraphswap_cuda.so (engine/backend/transport_cuda.cu) next to the CUDA backend; the
 * graphswap binary does not link CUDA or NCCL (cmake/cuda.cmake) and reaches them through one
 * dlsym'ed entry point, gs_gpu_transport_table(), which returns this table of functions. Declared
 * without CUDA / NCCL headers so any C file can include it.
 *
 * A transport only moves bytes into device memory; the server then hands the tensors to the open
 * weight-update session (eng_weights_bucket_device). Every function runs on the engine thread.
 *
 * NCCL: one communicator, created by nccl_init (ncclCommInitRankConfig, non-blocking, so a peer
 * that never joins ends in a timeout instead of hanging the engine thread) with this server at
 * `rank` of `world`. nccl_recv receives one ncclBroadcast from `root` (the trainer: rank 0 for
 * vLLM / SGLang, world - 1 for TRL, where graphswap is rank 0) of
 * `bytes` bytes (ncclUint8) into dst on the backend's stream and waits for it (bounded by
 * timeout_s; on a timeout or an NCCL error the communicator is aborted and must be destroyed).
 * nccl_warmup runs the warm-up collective vLLM's ranks run right after ncclCommInitRank
 * (PyNcclCommunicator.__init__: an in-place ncclAllReduce of one float32, ncclSum, then a stream
 * sync) on 4 bytes of scratch_dev (device memory, zeroed first with cudaMemsetAsync), bounded and
 * failing as nccl_recv does. nccl_unique_id makes a new ncclUniqueId (ncclGetUniqueId), for the
 * flows in which graphswap is rank 0 (TRL); it needs no communicator and may run on any thread.
 * (ABI 2 added nccl_warmup after the ABI-1 fields; ABI 3 the root of nccl_recv and nccl_unique_id.)
 * Built without nccl.h (GS_HAVE_NCCL=0), nccl_init fails with a message and IPC still works.
 *
 * CUDA IPC: ipc_open maps a peer's cudaIpcMemHandle_t (cudaIpcOpenMemHandle, lazy peer access) and
 * returns the mapping's base; ipc_close unmaps it (cudaIpcCloseMemHandle) after synchronizing the
 * backend's stream, so no queued copy still reads the peer's memory.
 */
#ifndef GS_ENG_TRANSPORT_CUDA_H
#define GS_ENG_TRANSPORT_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "engine/backend/backend.h"

#define GS_GPU_TRANSPORT_ABI 3
#define GS_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */
#define GS_IPC_HANDLE_BYTES 64 /* sizeof(cudaIpcMemHandle_t) */

typedef struct gs_nccl gs_nccl;

typedef struct {
    int abi; /* GS_GPU_TRANSPORT_ABI */
    int have_nccl;
    gs_nccl *(*nccl_init)(eng_backend *be, const void *unique_id, size_t id_len, int rank, int world,
                          double timeout_s, char *err, size_t errlen);
    int (*nccl_recv)(gs_nccl *g, void *dst_dev, size_t bytes, int root, double timeout_s, char *err, size_t errlen);
    void (*nccl_destroy)(gs_nccl *g);
    void *(*ipc_open)(eng_backend *be, const void *handle, size_t handle_len, char *err, size_t errlen);
    void (*ipc_close)(eng_backend *be, void *base);
    /* ABI 2 */
    int (*nccl_warmup)(gs_nccl *g, void *scratch_dev, double timeout_s, char *err, size_t errlen);
    /* ABI 3: GS_NCCL_ID_BYTES into id; 0, or -1 with err */
    int (*nccl_unique_id)(void *id, char *err, size_t errlen);
} gs_gpu_transport;

/* The module's entry point (looked up by name with dlsym). */
const gs_gpu_transport *gs_gpu_transport_table(void);

#ifdef __cplusplus
}
#endif

#endif
