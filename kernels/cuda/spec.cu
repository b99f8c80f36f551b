/* kernels/cuda/spec.cu — KOP_DRAFT_SELECT (argmax + vanilla Markov head) and KOP_CONFIDENCE.
 *
 * draft_select is sequential inside a sequence (slot k's Markov bias depends on slot k-1's choice)
 * but each slot is a V-wide GEMV + argmax, so it runs as one wide kernel per slot, all sequences at
 * once: kernel k (grid: V ranges x sequences) reads the previous choice, adds W2 . W1[prev] to its
 * part of the slot's logits, and folds its best (value, index) into a 64-bit key with atomicMax. A key
 * orders by value (NaN lowest, -0 == +0), then by lower index, so the final choice is exactly the
 * CPU's sequential scan: the lowest index of the maximum, NaNs never chosen, and 0 when logit 0 is NaN
 * (the scan starts there and nothing compares greater than NaN). Without a Markov head all W slots
 * are independent and take one launch. A last kernel writes the drafts; the keys (context scratch) are
 * zeroed first with a memset node. atomicMax on integer keys is order-independent: deterministic. */
#include <math.h>

#include "kernels/cuda/common.cuh"

__device__ __forceinline__ unsigned long long ds_key(float v, int idx)
{
    if (isnan(v)) return 0ull;
    if (v == 0.0f) v = 0.0f; /* -0 ties with +0, as in the CPU's > comparison */
    const uint32_t u = __float_as_uint(v);
    const uint32_t o = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)o << 32) | (unsigned long long)(0xffffffffu - (uint32_t)idx);
}

__device__ __forceinline__ int32_t ds_best(unsigned long long key, float first)
{
    if (isnan(first) || key == 0ull) return 0;
    return (int32_t)(0xffffffffu - (uint32_t)(key & 0xffffffffull));
}

template <bool BF>
__device__ __forceinline__ float ds_w(const void *w, size_t i)
{
    return BF ? kc_bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

#define DS_THREADS 256
#define DS_PER_THREAD 8

/* k >= 0: slot k of every sequence (Markov head); k < 0: every slot (no head). */
template <bool BF>
__global__ void __launch_bounds__(DS_THREADS) k_ds_update(float *logits, const void *__restrict__ w1,
                                                          const void *__restrict__ w2,
                                                          const int32_t *__restrict__ anchor,
                                                          unsigned long long *keys, const int32_t *n_seqs, int W,
                                                          int V, int r, int max_seqs, int k, kc_err *err)
{
    extern __shared__ float z[]; /* r floats: W1[prev] */
    __shared__ unsigned long long red[DS_THREADS / 32];
    const int n = kc_rows(n_seqs, max_seqs, err, KOP_DRAFT_SELECT);
    const int s = k < 0 ? (int)blockIdx.y / W : (int)blockIdx.y;
    const int kk = k < 0 ? (int)blockIdx.y % W : k;
    if (s >= n) return;
    const size_t row = (size_t)s * (size_t)W + (size_t)kk;
    float *lg = logits + row * (size_t)V;
    if (w1) {
        const int32_t prev = kk == 0 ? anchor[s] : ds_best(keys[row - 1], logits[(row - 1) * (size_t)V]);
        if (prev < 0 || prev >= V) {
            if (threadIdx.x == 0 && blockIdx.x == 0) kc_fail(err, KC_ERR_PREV, KOP_DRAFT_SELECT, prev, V);
            return;
        }
        for (int i = threadIdx.x; i < r; i += blockDim.x) z[i] = ds_w<BF>(w1, (size_t)prev * (size_t)r + i);
        __syncthreads();
    }
    const int per_block = DS_THREADS * DS_PER_THREAD;
    const int v0 = blockIdx.x * per_block, v1 = v0 + per_block < V ? v0 + per_block : V;
    unsigned long long best = 0ull;
    for (int v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
        float x = lg[v];
        if (w1) {
            float d = 0.0f;
            const size_t at = (size_t)v * (size_t)r;
            for (int i = 0; i < r; i++) d = fmaf(ds_w<BF>(w2, at + i), z[i], d);
            x = x + d;
            lg[v] = x;
        }
        const unsigned long long kv = ds_key(x, v);
        best = kv > best ? kv : best;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < DS_THREADS / 32; i++) best = red[i] > best ? red[i] : best;
        best = red[0] > best ? red[0] : best;
        if (best) atomicMax(keys + row, best);
    }
}

__global__ void __launch_bounds__(256) k_ds_final(const float *__restrict__ logits,
                                                  const unsigned long long *__restrict__ keys,
                                                  int32_t *__restrict__ drafts, const int32_t *n_seqs, int W, int V,
                                                  int max_seqs, kc_err *err)
{
    const int n = kc_rows(n_seqs, max_seqs, err, KOP_DRAFT_SELECT);
    const size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n <= 0 || row >= (size_t)n * (size_t)W) return;
    drafts[row] = ds_best(keys[row], logits[row * (size_t)V]);
}

/* The launches of a KOP_DRAFT_SELECT op, in order, once its argmax keys are zeroed: launch(kernel, grid,
 * block, dynamic smem, arguments...). kc_draft_select enqueues them; tests/emu runs the same launches
 * on the CPU emulation (GS_CUDA_EMU). */
template <typename Launch>
__host__ void ds_launches(const kern_op *op, unsigned long long *keys, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    const int W = p[0], V = p[1], r = p[2], max_seqs = p[4];
    if (max_seqs == 0) return;
    const size_t rows = (size_t)max_seqs * (size_t)W;
    float *logits = (float *)op->buf[0].ptr;
    const void *w1 = op->buf[1].ptr, *w2 = op->buf[2].ptr;
    const int32_t *anchor = (const int32_t *)op->buf[3].ptr, *nseq = (const int32_t *)op->buf[5].ptr;
    const unsigned vb = kc_div_up((size_t)V, DS_THREADS * DS_PER_THREAD);
    const int bf = p[3] == KERN_DT_BF16;
    const size_t smem = w1 ? (size_t)r * sizeof(float) : 0;
    const int launches = w1 ? W : 1;
    for (int k = 0; k < launches; k++) {
        const dim3 grid(vb, (unsigned)(w1 ? (size_t)max_seqs : rows));
        const int kk = w1 ? k : -1;
        if (bf)
            launch(k_ds_update<true>, grid, dim3(DS_THREADS), smem, logits, w1, w2, anchor, keys, nseq, W, V, r,
                   max_seqs, kk, err);
        else
            launch(k_ds_update<false>, grid, dim3(DS_THREADS), smem, logits, w1, w2, anchor, keys, nseq, W, V, r,
                   max_seqs, kk, err);
    }
    launch(k_ds_final, dim3(kc_div_up(rows, 256)), dim3(256), (size_t)0, logits, keys, (int32_t *)op->buf[4].ptr,
           nseq, W, V, max_seqs, err);
}

#ifndef GS_CUDA_EMU
void kc_draft_select(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    const int32_t *p = op->p;
    const int W = p[0], max_seqs = p[4];
    if (max_seqs == 0) return;
    const size_t rows = (size_t)max_seqs * (size_t)W;
    if (rows * sizeof(unsigned long long) > c->keys_bytes) {
        fprintf(stderr, "graphswap: draft_select: %zu rows exceed the CUDA context's key scratch (%zu bytes)\n", rows,
                c->keys_bytes);
        abort();
    }
    KC_CUDA(cudaMemsetAsync(c->keys, 0, rows * sizeof(unsigned long long), s));
    ds_launches(op, c->keys, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("draft_select");
    });
}
#endif

/* ---- KOP_CONFIDENCE: one warp per draft row ------------------------------------------------------------------ */
template <bool BF>
__global__ void __launch_bounds__(256) k_confidence(const float *__restrict__ h, const void *__restrict__ w1,
                                                    const int32_t *__restrict__ drafts,
                                                    const int32_t *__restrict__ anchor, const float *__restrict__ w,
                                                    const float *__restrict__ b, float *__restrict__ conf,
                                                    const int32_t *n_seqs, int W, int H, int r, int max_seqs, int V,
                                                    kc_err *err)
{
    const int n = kc_rows(n_seqs, max_seqs, err, KOP_CONFIDENCE);
    const size_t row = (size_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (n <= 0 || row >= (size_t)n * (size_t)W) return;
    const int s = (int)(row / (size_t)W), k = (int)(row % (size_t)W);
    const float *hr = h + row * (size_t)H;
    float a = 0.0f;
    for (int i = lane; i < H; i += 32) a = fmaf(w[i], hr[i], a);
    a = kc_warp_sum(a);
    if (w1) {
        const int32_t prev = k == 0 ? anchor[s] : drafts[row - 1];
        if (prev < 0 || prev >= V) {
            if (lane == 0) kc_fail(err, KC_ERR_PREV, KOP_CONFIDENCE, prev, V);
            return;
        }
        float d = 0.0f;
        for (int i = lane; i < r; i += 32)
            d = fmaf(w[H + i], BF ? kc_bf16_to_f32(((const uint16_t *)w1)[(size_t)prev * r + i])
                                  : ((const float *)w1)[(size_t)prev * r + i],
                     d);
        a = a + kc_warp_sum(d);
    }
    a = a + b[0];
    if (lane == 0) conf[row] = 1.0f / (1.0f + expf(-a));
}

/* The launch of a KOP_CONFIDENCE op: launch(kernel, grid, block, dynamic smem, arguments...).
 * kc_confidence enqueues it; tests/emu runs the same launch on the CPU emulation (GS_CUDA_EMU). */
template <typename Launch>
__host__ void conf_launch(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    const int W = p[0], H = p[1], r = p[2], max_seqs = p[4], V = p[5];
    if (max_seqs == 0) return;
    const size_t rows = (size_t)max_seqs * (size_t)W;
    const dim3 grid(kc_div_up(rows, 8));
    const float *hh = (const float *)op->buf[0].ptr;
    const int32_t *dr = (const int32_t *)op->buf[2].ptr, *an = (const int32_t *)op->buf[3].ptr;
    const float *w = (const float *)op->buf[4].ptr, *b = (const float *)op->buf[5].ptr;
    float *conf = (float *)op->buf[6].ptr;
    const int32_t *nseq = (const int32_t *)op->buf[7].ptr;
    if (p[3] == KERN_DT_BF16)
        launch(k_confidence<true>, grid, dim3(256), (size_t)0, hh, op->buf[1].ptr, dr, an, w, b, conf, nseq, W, H, r,
               max_seqs, V, err);
    else
        launch(k_confidence<false>, grid, dim3(256), (size_t)0, hh, op->buf[1].ptr, dr, an, w, b, conf, nseq, W, H, r,
               max_seqs, V, err);
}

#ifndef GS_CUDA_EMU
void kc_confidence(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    conf_launch(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("confidence");
    });
}
#endif
