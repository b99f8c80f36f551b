/* kernels/cuda/norm_rope.cu — KOP_RMSNORM and KOP_QK_NORM_ROPE.
 *
 * RMSNorm: one block per row; each thread keeps its share of the row in registers between the sum of
 * squares (block reduction, fixed order) and the scaling, so in-place (out == x) is safe: a thread
 * only writes the elements it read. out = (x * (1 / sqrtf(mean + eps))) * w, as the CPU computes it.
 *
 * QK norm + RoPE: one warp per (row, head); each lane owns rotary pairs (i, i + hd/2) for
 * i = lane, lane + 32, ...; the head's sum of squares is a warp reduction; the angle is rounded to
 * f32 (pos * inv_freq[i]) before sincosf, as kern.h specifies. */
#include "kernels/cuda/common.cuh"

#define RMS_THREADS 256
#define RMS_PER_THREAD 16 /* rows up to 4096 stay in registers; longer rows are re-read */

__global__ void __launch_bounds__(RMS_THREADS) k_rmsnorm(const float *x, const float *__restrict__ w, float *out,
                                                         const int32_t *n_rows, int H, int max_rows, float eps,
                                                         kc_err *err)
{
    __shared__ float sh[32];
    const int n = kc_rows(n_rows, max_rows, err, KOP_RMSNORM);
    const int r = blockIdx.x;
    if (r >= n) return;
    const float *xr = x + (size_t)r * (size_t)H;
    float *o = out + (size_t)r * (size_t)H;
    float v[RMS_PER_THREAD];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < RMS_PER_THREAD; j++) {
        const int i = threadIdx.x + j * RMS_THREADS;
        v[j] = i < H ? xr[i] : 0.0f;
        ss = fmaf(v[j], v[j], ss);
    }
    for (int i = threadIdx.x + RMS_PER_THREAD * RMS_THREADS; i < H; i += RMS_THREADS) ss = fmaf(xr[i], xr[i], ss);
    ss = kc_block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / (float)H + eps);
    /* the tail (rows longer than RMS_PER_THREAD * RMS_THREADS) is re-read: write it first, since
     * the register part never aliases it */
    for (int i = threadIdx.x + RMS_PER_THREAD * RMS_THREADS; i < H; i += RMS_THREADS) o[i] = (xr[i] * scale) * w[i];
#pragma unroll
    for (int j = 0; j < RMS_PER_THREAD; j++) {
        const int i = threadIdx.x + j * RMS_THREADS;
        if (i < H) o[i] = (v[j] * scale) * w[i];
    }
}

/* The launch of a KOP_RMSNORM op: launch(kernel, grid, block, dynamic smem, arguments...). kc_rmsnorm
 * enqueues it; tests/emu runs the same launch on the CPU emulation (GS_CUDA_EMU). */
template <typename Launch>
__host__ void rms_launch(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    if (p[1] == 0) return;
    launch(k_rmsnorm, dim3((unsigned)p[1]), dim3(RMS_THREADS), (size_t)0, (const float *)op->buf[0].ptr,
           (const float *)op->buf[1].ptr, (float *)op->buf[2].ptr, (const int32_t *)op->buf[3].ptr, p[0], p[1],
           op->f[0], err);
}

#ifndef GS_CUDA_EMU
void kc_rmsnorm(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    rms_launch(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("rmsnorm");
    });
}
#endif

/* ---- KOP_QK_NORM_ROPE ------------------------------------------------------------------------------------ */
#define QKR_WARPS 4

__global__ void __launch_bounds__(QKR_WARPS * 32) k_qk_norm_rope(float *qkv, const float *__restrict__ q_norm,
                                                               const float *__restrict__ k_norm,
                                                               const int32_t *__restrict__ pos,
                                                               const float *__restrict__ inv_freq,
                                                               const int32_t *n_rows, int nh, int nkv, int hd,
                                                               int stride, int max_rows, float eps, kc_err *err)
{
    const int n = kc_rows(n_rows, max_rows, err, KOP_QK_NORM_ROPE);
    const int r = blockIdx.x;
    const int h = blockIdx.y * QKR_WARPS + (threadIdx.x >> 5);
    if (r >= n || h >= nh + nkv) return;
    const int lane = threadIdx.x & 31, half = hd / 2;
    float *xh = qkv + (size_t)r * (size_t)stride + (size_t)h * (size_t)hd;
    const float *w = h < nh ? q_norm : k_norm;
    const float fpos = (float)pos[r];
    float scale = 1.0f;
    if (w) {
        float ss = 0.0f;
        for (int i = lane; i < hd; i += 32) ss = fmaf(xh[i], xh[i], ss);
        ss = kc_warp_sum(ss);
        scale = 1.0f / sqrtf(ss / (float)hd + eps);
    }
    for (int i = lane; i < half; i += 32) {
        float a = xh[i], b = xh[i + half];
        if (w) {
            a = (a * scale) * w[i];
            b = (b * scale) * w[i + half];
        }
        const float ang = __fmul_rn(fpos, inv_freq[i]); /* rounded to f32, never fused */
        float sn, cs;
        sincosf(ang, &sn, &cs);
        xh[i] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
        xh[i + half] = __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
    }
}

/* The launch of a KOP_QK_NORM_ROPE op: launch(kernel, grid, block, dynamic smem, arguments...).
 * kc_qk_norm_rope enqueues it; tests/emu runs the same launch on the CPU emulation (GS_CUDA_EMU). */
template <typename Launch>
__host__ void qkr_launch(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    if (p[4] == 0) return;
    const dim3 grid((unsigned)p[4], kc_div_up((size_t)(p[0] + p[1]), QKR_WARPS));
    launch(k_qk_norm_rope, grid, dim3(QKR_WARPS * 32), (size_t)0, (float *)op->buf[0].ptr,
           (const float *)op->buf[1].ptr, (const float *)op->buf[2].ptr, (const int32_t *)op->buf[3].ptr,
           (const float *)op->buf[4].ptr, (const int32_t *)op->buf[5].ptr, p[0], p[1], p[2], p[3], p[4], op->f[0],
           err);
}

#ifndef GS_CUDA_EMU
void kc_qk_norm_rope(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    qkr_launch(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("qk_norm_rope");
    });
}
#endif
