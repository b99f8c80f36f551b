/* kernels/cuda/kern_cuda.h — the CUDA kernels of the op vocabulary (kernels/kern.h), C interface.
 *
 * One context per device owns everything the kernels need besides the op's own buffers, all of it
 * allocated once by kern_cuda_ctx_create (nothing is allocated afterwards, so any sequence of
 * kern_cuda_exec calls can be captured into a CUDA graph and replayed):
 *   - device scratch: split-attention partials, draft_select argmax keys;
 *   - with fast_gemm only: a cuBLASLt handle, its workspace, a host-side cache of GEMM descriptors
 *     + algorithms, the bf16 copy of a GEMM's activations and the GEMM output tile;
 *   - an error record in mapped pinned host memory that kernels write when a data-dependent check
 *     fails (token id, slot, position, block id, kv_len, gather index or row count out of range; a
 *     sample row's ban list, logprobs count or draft out of range).
 *     The CPU backend aborts on those; a kernel cannot, so it skips the bad row and records the
 *     first failure, and the backend reports it (and aborts) at its next synchronize.
 *
 * Semantics are exactly kern.h's. Every kernel reads its live row count from the op's device
 * step-parameter buffer, is launched with a grid sized for the op's max_rows (the plan bucket), and
 * returns early for rows >= n: a captured graph replays for any row count. Rows past n are never
 * read or written (GEMM outputs included: cuBLASLt writes into scratch, an epilogue copies live rows).
 *
 * Numerics (results match the CPU reference within bf16 tolerance, not bitwise; batch invariant: a
 * row's result is bitwise the same whatever the plan bucket and the other rows, as kern.h requires
 * and I9 needs):
 *   - KOP_MATMUL with bf16 weights (K % 32 == 0, aligned): a tensor-core kernel (mma.sync m16n8k16
 *     bf16, f32 accumulate) that splits each f32 activation into two bf16 parts (hi + lo, 16
 *     significant bits) so the activations lose almost nothing, rows tiled 32 at a time; a decode
 *     step reads the weights once at full bandwidth.
 *   - f32 weights and other shapes: a CUDA-core f32 kernel, rows tiled the same way.
 *   - fast_gemm (GS_CUDA_FAST_GEMM=1): more than KERN_CUDA_SKINNY_ROWS rows go to cuBLASLt
 *     (activations cast to bf16, f32 accumulation): faster prefill, not batch invariant.
 *   - attention splits a row's keys by its kv_len alone; reductions (norms, dot products, softmax)
 *     in f32 with fixed orders: deterministic run to run (eager and graph replay are bitwise equal).
 */
#ifndef GS_KERN_CUDA_H
#define GS_KERN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/kern.h"

/* With fast_gemm: rows up to which bf16 matmuls keep the tensor-core kernel instead of cuBLASLt. */
#define KERN_CUDA_SKINNY_ROWS 32

typedef struct kern_cuda_ctx kern_cuda_ctx;

typedef struct {
    int device;              /* CUDA device ordinal (the caller has made it current) */
    /* 0 (default): KOP_MATMUL is batch invariant — a row's result is bitwise the same for every
     * max_rows (plan bucket), so greedy output with a drafter equals greedy output without one (I9).
     * 1: matmuls with max_rows > KERN_CUDA_SKINNY_ROWS use cuBLASLt (bf16-rounded activations):
     * faster prefill, but a row's result then depends on its plan bucket, so I9 holds only up to
     * rounding. The cuBLASLt handle, its workspace and the GEMM scratch below exist only then.
     * The CUDA backend sets it from the environment: GS_CUDA_FAST_GEMM=1. */
    int fast_gemm;
    size_t gemm_x_bytes;     /* fast_gemm: bf16 activation scratch for cuBLASLt GEMMs (0: 32 MiB) */
    size_t gemm_out_bytes;   /* fast_gemm: f32 GEMM output scratch (0: 64 MiB) */
    size_t gemm_ws_bytes;    /* fast_gemm: cuBLASLt workspace (0: 32 MiB) */
    size_t attn_bytes;       /* split-attention partials (0: 128 MiB); rows whose partials do not fit
                                at once are processed in chunks of rows */
    size_t keys_bytes;       /* draft_select argmax keys (0: 1 MiB) */
} kern_cuda_config;

/* Creates the context on the current device (all device memory it will ever use is allocated
 * here). Returns NULL and writes err on failure. */
kern_cuda_ctx *kern_cuda_ctx_create(const kern_cuda_config *cfg, char *err, size_t errlen);
void kern_cuda_ctx_destroy(kern_cuda_ctx *ctx);
/* Device memory the context holds, in bytes. */
size_t kern_cuda_ctx_bytes(const kern_cuda_ctx *ctx);

/* Validates op (a malformed op aborts: it is a bug, as on the CPU) and enqueues it on stream. Safe
 * inside stream capture. A CUDA or cuBLAS error aborts with a message. */
void kern_cuda_exec(kern_cuda_ctx *ctx, const kern_op *op, cudaStream_t stream);

/* After the work that may have failed is complete (the caller synchronized): 0 when no kernel
 * recorded a failed check since the last call, else 1 with a message in msg (and the record is
 * cleared). */
int kern_cuda_take_error(kern_cuda_ctx *ctx, char *msg, size_t msglen);

/* ---- dtype conversion for weight loading (backend upload_convert) ------------------------------
 * dst[i] = convert(src[i]) for i < n between F32, F16 and BF16 (mdl_dtype codes), bit-identical to
 * the host's mdl_convert (round to nearest even, f16 subnormals/overflow, NaN kept quiet). src and
 * dst are device pointers, aligned to their element size. Returns 0, or -1 for an unsupported pair
 * (nothing enqueued). */
int kern_cuda_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n, cudaStream_t stream);

/* Number of CUDA devices, 0 when none can be used (no driver, no device). */
int kern_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
