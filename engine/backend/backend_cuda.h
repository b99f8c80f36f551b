/* engine/backend/backend_cuda.h — the CUDA backend: the same contract as the CPU backend (engine/backend/backend.h),
 * on one GPU. Declared without CUDA headers so any C file can include it; link gs_cuda (built when
 * cmake/cuda.cmake finds nvcc, which also defines GS_HAVE_CUDA=1 for the graphswap binary).
 *
 *  - Arena: one virtual address range of cfg->arena_bytes (0: all free device memory but 2 GiB)
 *    reserved with cuMemAddressReserve, bump allocation (256-byte alignment, 2 MiB for allocations
 *    of 1 MiB or more), an allocation table like the CPU backend's; free() retires a range that is
 *    never handed out again. Physical memory is the virtual-memory API's: each VMM granule (2 MiB)
 *    the bump pointer reaches is backed by its own cuMemCreate + cuMemMap + cuMemSetAccess, so sleep
 *    (mem_release: cuMemUnmap + cuMemRelease of whole granules; mem_restore: fresh granules mapped at
 *    the same addresses, zeroed) gives memory back while every baked address, and so every
 *    instantiated graph, stays valid (vLLM's CuMemAllocator and SGLang's torch_memory_saver do the
 *    same per tensor). alloc() zeroes (a memset on the stream). The driver entry points come from
 *    cudaGetDriverEntryPointByVersion: nothing links libcuda. After creation the backend never
 *    calls cudaMalloc again.
 *  - One stream, created once. upload / upload_convert copy through a pinned staging ring (allocated
 *    once; 8 segments, each reused only after the event recorded when the ring last left it), so the
 *    host buffer may be reused as soon as upload returns; the copies are asynchronous and ordered on
 *    the stream before any later launch. download is synchronous (its result is needed on return).
 *    copy is a device-to-device copy on the stream. upload_convert stages the source bytes on the
 *    device and converts them there (kernels/cuda/convert.cu, bit-identical to mdl_convert).
 *  - run: every op enqueued on the stream (kern_cuda_exec). plan_create: stream capture of exactly
 *    the same dispatch, cudaGraphInstantiate and a pre-upload of the graph; the plan keeps a copy of
 *    the op list. plan_launch: cudaGraphLaunch; in checked mode every baked pointer of the kept op
 *    list is first verified against the live arena allocations (host side), aborting with the op and
 *    the pointer on a violation, as the CPU backend's checked replay does.
 *  - synchronize: waits for the stream, then reports a data-dependent check a kernel recorded
 *    (token id, slot, block id, ... out of range) and aborts, as the CPU kernels would have.
 *  - Any CUDA error aborts with a message (fail closed).
 * Environment: GS_CUDA_DEVICE (ordinal, default 0), GS_CUDA_STAGING_MB (pinned staging, default 64),
 * GS_CUDA_FAST_GEMM=1 (cuBLASLt for large row counts: faster prefill, not batch invariant).
 */
#ifndef GS_ENG_BACKEND_CUDA_H
#define GS_ENG_BACKEND_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "engine/backend/backend.h"

/* Returns NULL and writes err when there is no usable device or memory runs out. */
eng_backend *eng_backend_cuda_create(const eng_backend_config *cfg, char *err, size_t errlen);

/* Number of usable CUDA devices (0 without a driver or a device): tests skip on 0. */
int eng_backend_cuda_device_count(void);

/* The backend's stream (a cudaStream_t) for benchmarks that time work with CUDA events. */
void *eng_backend_cuda_stream(eng_backend *be);

/* "NVIDIA H200, 132 SMs, 139.8 GiB, driver 13.0, runtime 13.0" */
void eng_backend_cuda_describe(eng_backend *be, char *out, size_t outlen);

/* Arena capacity and high-water mark in bytes. */
size_t eng_backend_cuda_arena_capacity(eng_backend *be);
size_t eng_backend_cuda_arena_used(eng_backend *be);

#ifdef __cplusplus
}
#endif

#endif
