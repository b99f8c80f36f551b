/* engine/backend/backend.h — the device interface. Everything above it (models, scheduler, load sessions,
 * server) talks to memory and compute only through this struct of function pointers, so the CUDA
 * backend can replace the CPU one without any change above the interface.
 *
 * Memory model (invariant I1): a backend owns one pointer-stable arena. alloc() hands out memory
 * that never moves; free() only retires an allocation (its address range is never handed out
 * again), so a plan that still holds a retired pointer is detected in checked mode instead of
 * silently reading reused memory. All plan-visible buffers (weights, derived buffers, KV cache,
 * workspaces, step parameters) are allocated before the first capture.
 *
 * Plans: plan_create() captures a tape (deep copy on the CPU, stream capture + instantiate on CUDA);
 * plan_launch() replays it with the pointers baked at capture. Step parameters are written with
 * upload() before each launch.
 */
#ifndef GS_ENG_BACKEND_H
#define GS_ENG_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/tape.h"
#include "models/format/safetensors.h"

typedef struct eng_backend eng_backend;
typedef struct eng_plan eng_plan;

/* One live or retired arena allocation, as reported by alloc_info (for guards and audits). */
typedef struct {
    void *ptr;
    size_t bytes;
    const char *tag;
    int live;
} eng_alloc_info;

typedef struct {
    const char *name;
    /* 1 when device memory is host memory (the CPU backend): a "device" tensor (an NCCL staging
     * buffer, a CUDA-IPC mapping) can then be read on the host like any other */
    int host_memory;
    /* Memory. alloc returns zeroed memory aligned to 64 bytes, or NULL when the arena is full. */
    void *(*alloc)(eng_backend *be, size_t bytes, const char *tag);
    void (*free)(eng_backend *be, void *ptr);
    /* 1 when [ptr, ptr+bytes) lies inside one live allocation (checked mode, guards). */
    int (*contains)(eng_backend *be, const void *ptr, size_t bytes);
    int (*alloc_info)(eng_backend *be, const void *ptr, eng_alloc_info *out);
    size_t (*bytes_in_use)(eng_backend *be);
    /* Host <-> device transfers and device copies. */
    void (*upload)(eng_backend *be, void *dst, const void *src, size_t n);
    void (*download)(eng_backend *be, void *dst, const void *src, size_t n);
    void (*copy)(eng_backend *be, void *dst, const void *src, size_t n);
    /* Dtype-converting host -> device write of n elements (weight loading, I2). Returns 0, or -1
     * for a pair it cannot convert. */
    int (*upload_convert)(eng_backend *be, void *dst, mdl_dtype dst_dt, const void *src,
                          mdl_dtype src_dt, size_t n);
    /* Dtype-converting device -> device write of n elements: src is device memory (an NCCL
     * staging buffer, a CUDA-IPC mapping). Ordered on the backend's stream like copy(); the CPU
     * backend, whose device memory is host memory, converts in place of upload_convert. Returns 0,
     * or -1 for a pair it cannot convert. */
    int (*device_convert)(eng_backend *be, void *dst, mdl_dtype dst_dt, const void *src_dev,
                          mdl_dtype src_dt, size_t n);
    /* Compute. */
    void (*run)(eng_backend *be, const eng_tape *tape); /* eager: launch each op now */
    eng_plan *(*plan_create)(eng_backend *be, const eng_tape *tape);
    void (*plan_launch)(eng_backend *be, eng_plan *plan);
    void (*plan_free)(eng_backend *be, eng_plan *plan);
    void (*synchronize)(eng_backend *be);
    void (*destroy)(eng_backend *be);
    /* Sleep with stable addresses (engine/engine.h eng_sleep; optional: NULL = not supported).
     * mem_release gives up the physical memory behind the live allocations starting at
     * ptrs[0..n), as group `group` (< ENG_MEM_GROUPS), and keeps every address reserved: only
     * whole release granules (CPU: 4 KiB pages, MADV_DONTNEED; CUDA: VMM granules, cuMemUnmap +
     * cuMemRelease) that no other live allocation touches are released; *released gets their bytes.
     * Their contents are lost; nothing may read or write them until mem_restore, which backs the
     * same addresses again with zeroed memory (so a plan replays unchanged, I1). Both synchronize
     * first. A group released twice, or restored while not released, is refused (-1 with err). */
    int (*mem_release)(eng_backend *be, int group, void *const *ptrs, size_t n, size_t *released, char *err,
                       size_t errlen);
    int (*mem_restore)(eng_backend *be, int group, char *err, size_t errlen);
} eng_backend_ops;

#define ENG_MEM_GROUPS 4

struct eng_backend {
    const eng_backend_ops *ops;
    void *impl;
    int checked; /* verify every baked pointer against the arena at each launch */
};

typedef struct {
    size_t arena_bytes; /* address space reserved for the arena */
    int threads;        /* CPU worker threads (<= 0: all online CPUs) */
    int checked;
    int bf16_activations; /* CPU: bf16-weight matmuls round activations to bf16 (kern_pool_set_bf16_activations) */
} eng_backend_config;

/* CPU backend: arena in host memory, ops run by kernels/cpu on a fixed thread pool. Returns NULL
 * and writes err on failure. */
eng_backend *eng_backend_cpu_create(const eng_backend_config *cfg, char *err, size_t errlen);

static inline void eng_backend_destroy(eng_backend *be)
{
    if (be) be->ops->destroy(be);
}

#endif
