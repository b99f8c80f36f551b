/* kernels/cuda/kern_cuda.h — the CUDA kernels of the op vocabulary (kernels/kern.h), C interface.
 *
 * One context per device owns everything the kernels need besides the op's own buffers, all of it
 * allocated once by kern_cuda_ctx_create (nothing is allocated afterwards, so any sequence of
 * kern_cuda_exec calls can be captured into a CUDA graph and replayed):
 *   - a cuBLASLt handle and its workspace, and a host-side cache of GEMM descriptors + algorithms;
 *   - device scratch: the bf16 copy of a GEMM's activations, the GEMM output tile, split-attention
 *     partials, draft_select argmax keys;
 *   - an error record in mapped pinned host memory that kernels write when a data-dependent check
 *     fails (token id, slot, position, block id, kv_len, gather index or row count out of range).
 *     The CPU backend aborts on those; a kernel cannot, so it skips the bad row and records the
 *     first failure, and the backend reports it (and aborts) at its next synchronize.
 *
 * Semantics are exactly kern.h's. Every kernel reads its live row count from the op's device
 * step-parameter buffer, is launched with a grid sized for the op's max_rows (the plan bucket), and
 * returns early for rows >= n: a captured graph replays for any row count. Rows past n are never
 * read or written (GEMM outputs included: cuBLASLt writes into scratch, an epilogue copies live rows).
 *
 * Numerics (results match the CPU reference within bf16 tolerance, not bitwise):
 *   - KOP_MATMUL with bf16 weights and at most KERN_CUDA_SKINNY_ROWS rows (decode, drafts, small
 *     verify steps): a tensor-core kernel (mma.sync m16n8k16 bf16, f32 accumulate) that splits each
 *     f32 activation into two bf16 parts (hi + lo, 16 significant bits) so the activations lose
 *     almost nothing; weights are read once per step at full bandwidth.
 *   - more rows (prefill chunks, large verify steps): cuBLASLt bf16 x bf16 -> f32 with f32
 *     accumulation; the activations are cast to bf16 once (round to nearest even) into scratch.
 *   - f32 weights: CUDA-core f32 kernel for few rows, cuBLASLt f32 (CUBLAS_COMPUTE_32F, no TF32)
 *     for many.
 *   - reductions (norms, dot products, softmax) in f32 with fixed per-launch orders: results are
 *     deterministic run to run for the same op (eager and graph replay are bitwise equal).
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

/* Rows up to which bf16 matmuls use the skinny tensor-core kernel instead of cuBLASLt. */
#define KERN_CUDA_SKINNY_ROWS 32

typedef struct kern_cuda_ctx kern_cuda_ctx;

typedef struct {
    int device;              /* CUDA device ordinal (the caller has made it current) */
    size_t gemm_x_bytes;     /* bf16 activation scratch for cuBLASLt GEMMs (0: 32 MiB) */
    size_t gemm_out_bytes;   /* f32 GEMM output scratch (0: 64 MiB) */
    size_t gemm_ws_bytes;    /* cuBLASLt workspace (0: 32 MiB) */
    size_t attn_bytes;       /* split-attention partials (0: 16 MiB) */
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
