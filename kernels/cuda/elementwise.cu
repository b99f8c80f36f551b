/* kernels/cuda/elementwise.cu — KOP_EMBED, KOP_GATHER_ROWS, KOP_COPY_COLS, KOP_SILU_MUL, KOP_ADD.
 * No reductions: every output element is one expression of its inputs (bitwise equal to the CPU's
 * except silu_mul, whose expf may differ in the last bits). Row ops: one block per row of the bucket,
 * early exit past the live count. Flat ops: a grid-stride loop over the bucket's elements that stops
 * at n * width. */
#include "kernels/cuda/common.cuh"

/* ---- KOP_EMBED ------------------------------------------------------------------------------------ */
template <bool BF>
__global__ void __launch_bounds__(256) k_embed(const int32_t *__restrict__ ids, const void *__restrict__ table,
                                               float *__restrict__ out, const int32_t *n_rows, int H, int V,
                                               int max_rows, kc_err *err)
{
    const int n = kc_rows(n_rows, max_rows, err, KOP_EMBED);
    const int r = blockIdx.x;
    if (r >= n) return;
    const int32_t id = ids[r];
    if (id < 0 || id >= V) {
        if (threadIdx.x == 0) kc_fail(err, KC_ERR_TOKEN, KOP_EMBED, id, V);
        return;
    }
    float *o = out + (size_t)r * (size_t)H;
    const size_t at = (size_t)id * (size_t)H;
    if (BF) {
        const uint16_t *src = (const uint16_t *)table + at;
        for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = kc_bf16_to_f32(src[i]);
    } else {
        const float *src = (const float *)table + at;
        for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = src[i];
    }
}

/* The launch of each op of this file: launch(kernel, grid, block, dynamic smem, arguments...). The kc_*
 * launchers enqueue it; tests/emu runs the same launch on the CPU emulation (GS_CUDA_EMU). */
template <typename Launch>
__host__ void embed_launch(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    if (p[2] == 0) return;
    const int bf = p[3] == KERN_DT_BF16;
    const dim3 grid((unsigned)p[2]), block(256);
    if (bf)
        launch(k_embed<true>, grid, block, (size_t)0, (const int32_t *)op->buf[0].ptr, (const void *)op->buf[1].ptr,
               (float *)op->buf[2].ptr, (const int32_t *)op->buf[3].ptr, p[0], p[1], p[2], err);
    else
        launch(k_embed<false>, grid, block, (size_t)0, (const int32_t *)op->buf[0].ptr, (const void *)op->buf[1].ptr,
               (float *)op->buf[2].ptr, (const int32_t *)op->buf[3].ptr, p[0], p[1], p[2], err);
}

#ifndef GS_CUDA_EMU
void kc_embed(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    embed_launch(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("embed");
    });
}
#endif

/* ---- KOP_GATHER_ROWS -------------------------------------------------------------------------------- */
__global__ void __launch_bounds__(256) k_gather(const float *__restrict__ x, const int32_t *__restrict__ idx,
                                                float *__restrict__ out, const int32_t *n_out, int H, int x_rows,
                                                int max_out, kc_err *err)
{
    const int n = kc_rows(n_out, max_out, err, KOP_GATHER_ROWS);
    const int j = blockIdx.x;
    if (j >= n) return;
    const int32_t i = idx[j];
    if (i < 0 || i >= x_rows) {
        if (threadIdx.x == 0) kc_fail(err, KC_ERR_INDEX, KOP_GATHER_ROWS, i, x_rows);
        return;
    }
    const float *src = x + (size_t)i * (size_t)H;
    float *dst = out + (size_t)j * (size_t)H;
    for (int k = threadIdx.x; k < H; k += blockDim.x) dst[k] = src[k];
}

template <typename Launch>
__host__ void gather_launch(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    if (p[2] == 0) return;
    launch(k_gather, dim3((unsigned)p[2]), dim3(256), (size_t)0, (const float *)op->buf[0].ptr,
           (const int32_t *)op->buf[1].ptr, (float *)op->buf[2].ptr, (const int32_t *)op->buf[3].ptr, p[0], p[1], p[2],
           err);
}

#ifndef GS_CUDA_EMU
void kc_gather_rows(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    gather_launch(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("gather_rows");
    });
}
#endif

/* ---- KOP_COPY_COLS ------------------------------------------------------------------------------------ */
__global__ void __launch_bounds__(256) k_copy_cols(const float *__restrict__ x, float *__restrict__ out,
                                                   const int32_t *n_rows, int H, int stride, int col0, int max_rows,
                                                   kc_err *err)
{
    const int n = kc_rows(n_rows, max_rows, err, KOP_COPY_COLS);
    const int r = blockIdx.x;
    if (r >= n) return;
    const float *src = x + (size_t)r * (size_t)H;
    float *dst = out + (size_t)r * (size_t)stride + col0;
    for (int k = threadIdx.x; k < H; k += blockDim.x) dst[k] = src[k];
}

template <typename Launch>
__host__ void copy_cols_launch(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    if (p[3] == 0) return;
    launch(k_copy_cols, dim3((unsigned)p[3]), dim3(256), (size_t)0, (const float *)op->buf[0].ptr,
           (float *)op->buf[1].ptr, (const int32_t *)op->buf[2].ptr, p[0], p[1], p[2], p[3], err);
}

#ifndef GS_CUDA_EMU
void kc_copy_cols(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    copy_cols_launch(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("copy_cols");
    });
}
#endif

/* ---- KOP_SILU_MUL: out[r,i] = silu(gu[r,i]) * gu[r,I+i] ------------------------------------------------ */
__device__ __forceinline__ float kc_silu(float a) { return a / (1.0f + expf(-a)); }

__global__ void __launch_bounds__(256) k_silu_mul(const float *__restrict__ gu, float *__restrict__ out,
                                                  const int32_t *n_rows, int I, int max_rows, int vec4, kc_err *err)
{
    const int n = kc_rows(n_rows, max_rows, err, KOP_SILU_MUL);
    if (n <= 0) return;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    if (vec4) { /* I % 4 == 0: whole float4s, never straddling a row */
        const int I4 = I / 4;
        const size_t total = (size_t)n * (size_t)I4;
        for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
            const size_t r = e / (size_t)I4, i = e % (size_t)I4;
            const float4 g = reinterpret_cast<const float4 *>(gu + r * 2 * (size_t)I)[i];
            const float4 u = reinterpret_cast<const float4 *>(gu + r * 2 * (size_t)I + I)[i];
            float4 o;
            o.x = kc_silu(g.x) * u.x;
            o.y = kc_silu(g.y) * u.y;
            o.z = kc_silu(g.z) * u.z;
            o.w = kc_silu(g.w) * u.w;
            reinterpret_cast<float4 *>(out)[e] = o;
        }
    } else {
        const size_t total = (size_t)n * (size_t)I;
        for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
            const size_t r = e / (size_t)I, i = e % (size_t)I;
            const float *g = gu + r * 2 * (size_t)I;
            out[e] = kc_silu(g[i]) * g[I + i];
        }
    }
}

/* c: the context (its SM count sizes the grid-stride grid) */
template <typename Launch>
__host__ void silu_mul_launch(const kern_cuda_ctx *c, const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    if (p[1] == 0) return;
    const int vec4 = p[0] % 4 == 0 && ((uintptr_t)op->buf[0].ptr % 16) == 0 && ((uintptr_t)op->buf[1].ptr % 16) == 0;
    const size_t work = (size_t)p[1] * (size_t)p[0] / (vec4 ? 4 : 1);
    launch(k_silu_mul, dim3(kc_grid_for(c, work)), dim3(256), (size_t)0, (const float *)op->buf[0].ptr,
           (float *)op->buf[1].ptr, (const int32_t *)op->buf[2].ptr, p[0], p[1], vec4, err);
}

#ifndef GS_CUDA_EMU
void kc_silu_mul(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    silu_mul_launch(c, op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("silu_mul");
    });
}
#endif

/* ---- KOP_ADD: x[r,:] += y[r,:] (y may equal x) ------------------------------------------------------------ */
__global__ void __launch_bounds__(256) k_add(float *x, const float *y, const int32_t *n_rows, int H, int max_rows,
                                             int vec4, kc_err *err)
{
    const int n = kc_rows(n_rows, max_rows, err, KOP_ADD);
    if (n <= 0) return;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    if (vec4) {
        const size_t total = (size_t)n * (size_t)H / 4;
        float4 *x4 = reinterpret_cast<float4 *>(x);
        const float4 *y4 = reinterpret_cast<const float4 *>(y);
        for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
            float4 a = x4[e];
            const float4 b = y4[e];
            a.x = a.x + b.x;
            a.y = a.y + b.y;
            a.z = a.z + b.z;
            a.w = a.w + b.w;
            x4[e] = a;
        }
    } else {
        const size_t total = (size_t)n * (size_t)H;
        for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) x[e] = x[e] + y[e];
    }
}

template <typename Launch>
__host__ void add_launch(const kern_cuda_ctx *c, const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    if (p[1] == 0) return;
    const int vec4 = p[0] % 4 == 0 && ((uintptr_t)op->buf[0].ptr % 16) == 0 && ((uintptr_t)op->buf[1].ptr % 16) == 0;
    const size_t work = (size_t)p[1] * (size_t)p[0] / (vec4 ? 4 : 1);
    launch(k_add, dim3(kc_grid_for(c, work)), dim3(256), (size_t)0, (float *)op->buf[0].ptr,
           (const float *)op->buf[1].ptr, (const int32_t *)op->buf[2].ptr, p[0], p[1], vec4, err);
}

#ifndef GS_CUDA_EMU
void kc_add(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    add_launch(c, op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("add");
    });
}
#endif
