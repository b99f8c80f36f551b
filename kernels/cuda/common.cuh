/* kernels/cuda/common.cuh — internals shared by the CUDA kernel files (not part of any contract).
 *
 * Layout of kernels/cuda/:
 *   kern_cuda.h      the C interface (context, dispatch, validation, conversion)
 *   dispatch.cu      context creation, kern_cuda_exec (one switch over op kinds), error record
 *   validate.c       kern_cuda_validate: the kern.h contract checks, host side, before any launch
 *   elementwise.cu   KOP_EMBED, KOP_GATHER_ROWS, KOP_COPY_COLS, KOP_SILU_MUL, KOP_ADD
 *   norm_rope.cu     KOP_RMSNORM, KOP_QK_NORM_ROPE
 *   matmul.cu        KOP_MATMUL (skinny tensor-core kernel, cuBLASLt path, f32 fallback)
 *   attention.cu     KOP_KV_WRITE, KOP_ATTENTION (+ split-sequence combine)
 *   spec.cu          KOP_DRAFT_SELECT, KOP_CONFIDENCE
 *   sample.cu        KOP_SAMPLE (one block per row, radix selections in shared memory)
 *   mm_kernels.cuh   the batch-invariant matmul kernels, ungrouped (KOP_MATMUL) and grouped by expert
 *   moe.cu           KOP_MOE_ROUTE, KOP_MOE_FFN (grouped expert matmuls)
 *   convert.cu       dtype conversion for weight loading
 */
#ifndef GS_KERN_CUDA_COMMON_CUH
#define GS_KERN_CUDA_COMMON_CUH

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef GS_CUDA_EMU
/* tests/emu: the device primitives emulated on the CPU (g++, no CUDA toolkit), so that CI runs the
 * kernels' real source without a GPU; host-only types below are opaque stand-ins there */
#include "tests/emu/emu_cuda.h"
extern "C" {
#include "kernels/kern.h"
}
#else
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/kern_cuda.h"
#endif

/* ---- host-side error handling: any CUDA / cuBLAS failure is fatal (fail closed) ----------------- */
void kc_die_cuda(cudaError_t e, const char *what, const char *file, int line);
void kc_die_cublas(cublasStatus_t s, const char *what, const char *file, int line);

#define KC_CUDA(call)                                                                              \
    do {                                                                                           \
        cudaError_t kc_e_ = (call);                                                                \
        if (kc_e_ != cudaSuccess) kc_die_cuda(kc_e_, #call, __FILE__, __LINE__);                   \
    } while (0)
#define KC_CUBLAS(call)                                                                            \
    do {                                                                                           \
        cublasStatus_t kc_s_ = (call);                                                             \
        if (kc_s_ != CUBLAS_STATUS_SUCCESS) kc_die_cublas(kc_s_, #call, __FILE__, __LINE__);       \
    } while (0)
/* after every kernel launch */
#define KC_LAUNCHED(name) KC_CUDA(cudaGetLastError())

/* ---- device-side error record (mapped pinned host memory) ---------------------------------------- */
enum {
    KC_ERR_NONE = 0,
    KC_ERR_ROWS,   /* row count outside [0, max_rows] */
    KC_ERR_TOKEN,  /* token id outside [0, V) */
    KC_ERR_SLOT,   /* sequence slot outside [0, max_seqs) */
    KC_ERR_POS,    /* position outside the block table */
    KC_ERR_BLOCK,  /* block id outside the cache */
    KC_ERR_KVLEN,  /* kv_len outside [0, max_blocks * block_size] */
    KC_ERR_INDEX,  /* gather index outside [0, x_rows) */
    KC_ERR_PREV,   /* draft_select / confidence previous token outside [0, V) */
    KC_ERR_BANS,     /* sample: a row's ban list (ban_off, n_ban) outside the bans buffer */
    KC_ERR_LOGPROBS, /* sample: n_logprobs outside [0, KERN_SAMPLE_MAX_TOP] */
    KC_ERR_NO_TOKEN, /* sample: a row's bans leave no token */
    KC_ERR_PEN,      /* sample: penalty state (slot, extra ids, logit_bias list, update pair) out of range */
    KC_ERR_EXPERT,   /* moe_ffn: an expert id outside [0, E), or the same expert twice in a row */
    KC_ERR_COUNT
};

struct kc_err {
    unsigned int code;
    int kind; /* kern_op_kind */
    int a, b; /* offending value, bound */
};

/* First failure wins; the host reads the record after synchronizing. */
__device__ __forceinline__ void kc_fail(kc_err *e, unsigned int code, int kind, int a, int b)
{
    if (atomicCAS(&e->code, 0u, code) == 0u) {
        e->kind = kind;
        e->a = a;
        e->b = b;
        __threadfence_system();
    }
}

/* The live row count in *p, or -1 (reported once per launch, by block 0) when outside [0, max]. */
__device__ __forceinline__ int kc_rows(const int32_t *p, int max, kc_err *e, int kind)
{
    const int n = *p;
    if (n < 0 || n > max) {
        if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) kc_fail(e, KC_ERR_ROWS, kind, n, max);
        return -1;
    }
    return n;
}

/* ---- device math helpers -------------------------------------------------------------------------- */
__device__ __forceinline__ float kc_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* f32 -> bf16 round to nearest even, NaN kept quiet: the same bits as kern_f32_to_bf16 */
__device__ __forceinline__ uint16_t kc_f32_to_bf16(float f)
{
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float kc_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * sh: 32 floats of shared memory. The order is fixed for a given blockDim. */
__device__ __forceinline__ float kc_block_sum(float v, float *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kc_warp_sum(v);
    __syncthreads(); /* sh may be reused by a previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float s = lane < nw ? sh[lane] : 0.0f;
    return kc_warp_sum(s);
}

static inline unsigned kc_div_up(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

/* ---- the context ------------------------------------------------------------------------------------ */
#define KC_MM_CACHE 96

struct kc_mm_entry {
    int used;
    int Mc, Nc, K, wdt, alA, alB;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t A, B, D;
    cublasLtMatmulAlgo_t algo;
    int have_algo;
};

struct kern_cuda_ctx {
    int device, sms;
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    uint16_t *gx; /* bf16 activations of a cuBLASLt GEMM chunk */
    size_t gx_bytes;
    float *gout; /* f32 GEMM output tile */
    size_t gout_bytes;
    float *attn; /* split-attention partials */
    size_t attn_bytes;
    unsigned long long *keys; /* draft_select argmax keys */
    size_t keys_bytes;
    kc_err *err_host, *err_dev;
    kc_mm_entry mm[KC_MM_CACHE];
    int mm_next;
    size_t dev_bytes;
};

/* ---- launchers (one per op family; op already validated) -------------------------------------------- */
void kc_embed(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_gather_rows(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_copy_cols(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_silu_mul(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_add(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_rmsnorm(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_qk_norm_rope(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_matmul(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_matmul_release(kern_cuda_ctx *c);
void kc_kv_write(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_attention(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_draft_select(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_confidence(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_sample(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_moe_route(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);
void kc_moe_ffn(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s);

/* Grid size for a grid-stride loop over `work` items with 256-thread blocks. */
static inline unsigned kc_grid_for(const kern_cuda_ctx *c, size_t work)
{
    size_t b = (work + 255) / 256;
    size_t cap = (size_t)c->sms * 8;
    if (b > cap) b = cap;
    return b ? (unsigned)b : 1u;
}

#endif
