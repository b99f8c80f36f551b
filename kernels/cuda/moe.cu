/* kernels/cuda/moe.cu — KOP_MOE_ROUTE and KOP_MOE_FFN (kernels/kern.h): the router and the experts of a
 * sparse MoE block on the GPU.
 *
 * KOP_MOE_ROUTE: one warp per row (4 rows per block). The serial parts of the contract (the running
 * max, the sum in id order, the output in id order) run on lane 0; the exponentials, divisions and
 * the top-k selection (k rounds of a warp argmax over kern_sample_key, a total order: the result does
 * not depend on the reduction's shape) on every lane. kc_expf is kern_expf's arithmetic step for step
 * (every step an explicit fma or a rounded f32 operation), so ids and weights are the CPU's bit for
 * bit given the same logits.
 *
 * KOP_MOE_FFN, five launches, all sized from max_rows (a captured graph replays for any routing):
 *   group    one block: checks every live (row, slot) id (0 <= e < E, no expert twice in a row:
 *            KC_ERR_EXPERT, and then nothing else runs), counts the rows per expert, writes the
 *            experts' first grouped rows (offs), the list of experts with rows (act: count, ids), and
 *            for every routed row its grouped place (posof) and source row (srcrow). Places inside a
 *            group are claimed with shared-memory atomics, so their order varies run to run; no
 *            result depends on it (a grouped matmul row depends only on its own operands).
 *   gate_up  grouped matmul (mm_kernels.cuh), grid y = the experts with rows: g | u = h[srcrow] .
 *            W13[e]^T for each group, reading h in place through srcrow (no gathered copy);
 *   silu     a = silu(g) * u for the routed rows (kern_silu_mul's arithmetic, kc_expf);
 *   down     grouped matmul: y = a . W2[e]^T;
 *   combine  out[r] = out[r] + (acc = acc + w_j * y_j over j = 0 .. k-1, two rounded steps).
 * Each dot product is the KOP_MATMUL kernel's for the same operands (skinny tensor-core kernel for bf16
 * weights with K % 32 == 0 and aligned operands, else the CUDA-core kernel), so a row's result is the
 * same whatever the other rows chose and whatever max_rows (batch invariance, I9); an expert no live
 * row chose has no block (decode at batch 1 reads k experts' weights). Against the CPU: within the
 * matmul's tolerance (the tensor-core kernel keeps ~16 bits of each activation).
 *
 * Scratch (kern_moe_scratch_bytes, n = max_rows * k): gu f32 [n, 2I], a f32 [n, I], y f32 [n, H],
 * posof i32 [n], offs i32 [E + 1], srcrow i32 [n], act i32 [E + 1] at the contract's offsets (the
 * gathered-rows part [n, H] is not used here). */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mm_kernels.cuh"

/* ---- exact scalar math (kernels/cpu/kern_cpu.h's kern_expf and kern_silu_mul, step for step) ---------- */
__device__ __forceinline__ float kc_expf(float x)
{
    if (x != x) return x + x;
    const float t = x < 89.0f ? x : 89.0f; /* KERN_EXPF_MAX, KERN_EXPF_MIN */
    const float xc = t > -104.0f ? t : -104.0f;
    const float kd = fmaf(xc, 0x1.715476p+0f, 0x1.8p23f);
    const float nk = KERN_FSUB(0x1.8p23f, kd); /* -k, exactly */
    float r = fmaf(nk, 0x1.63p-1f, xc);
    r = fmaf(nk, -0x1.bd0106p-13f, r);
    /* 1 / i!, i = 7 .. 0 (kern_expf_c) */
    float p = 0x1.a01a02p-13f;
    p = fmaf(p, r, 0x1.6c16c2p-10f);
    p = fmaf(p, r, 0x1.111112p-7f);
    p = fmaf(p, r, 0x1.555556p-5f);
    p = fmaf(p, r, 0x1.555556p-3f);
    p = fmaf(p, r, 0x1p-1f);
    p = fmaf(p, r, 0x1p+0f);
    p = fmaf(p, r, 0x1p+0f);
    const int k = __float_as_int(kd) - 0x4b400000, k1 = k >> 1, k2 = k - k1;
    return KERN_FMUL(KERN_FMUL(p, __int_as_float((k1 + 127) * (1 << 23))), __int_as_float((k2 + 127) * (1 << 23)));
}

__device__ __forceinline__ float kc_silu_mul_exact(float a, float u)
{
    return KERN_FMUL(KERN_FDIV(a, KERN_FADD(1.0f, kc_expf(-a))), u);
}

/* ---- KOP_MOE_ROUTE ------------------------------------------------------------------------------------ */
#define RT_WARPS 4

__global__ void __launch_bounds__(RT_WARPS * 32)
    k_moe_route(const float *__restrict__ logits, int32_t *__restrict__ ids, float *__restrict__ wts,
                const int32_t *n_rows, int E, int k, int max_rows, int norm, kc_err *err)
{
    __shared__ float q[RT_WARPS][KERN_MAX_EXPERTS];
    __shared__ unsigned char taken[RT_WARPS][KERN_MAX_EXPERTS];
    const int n = kc_rows(n_rows, max_rows, err, KOP_MOE_ROUTE);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = (int)blockIdx.x * RT_WARPS + warp;
    if (r >= n) return; /* the whole warp (also n < 0: reported); only warp collectives below */
    const float *l = logits + (size_t)r * (size_t)E;
    float *qw = q[warp];
    unsigned char *tk = taken[warp];
    /* m = l[0], then m = l[e] where l[e] > m: in order (a NaN l[0] stays, later NaNs never win) */
    float m = 0.0f;
    if (lane == 0) {
        m = l[0];
        for (int e = 1; e < E; e++)
            if (l[e] > m) m = l[e];
    }
    m = __shfl_sync(0xffffffffu, m, 0);
    for (int e = lane; e < E; e += 32) {
        qw[e] = kc_expf(KERN_FSUB(l[e], m));
        tk[e] = 0;
    }
    __syncwarp();
    float s = 0.0f;
    if (lane == 0)
        for (int e = 0; e < E; e++) s = KERN_FADD(s, qw[e]); /* id order */
    s = __shfl_sync(0xffffffffu, s, 0);
    for (int e = lane; e < E; e += 32) qw[e] = KERN_FDIV(qw[e], s);
    __syncwarp();
    /* the k best by (q, lower id), best first; tot in that order */
    float tot = 0.0f;
    for (int j = 0; j < k; j++) {
        unsigned long long best = 0;
        bool have = false;
        for (int e = lane; e < E; e += 32) {
            if (tk[e]) continue;
            const unsigned long long key = kern_sample_key(qw[e], e);
            if (!have || key > best) best = key, have = true;
        }
        /* lanes without a candidate hold 0, below every key (a key's low word is 0xFFFFFFFF - id > 0
         * for id < 2^32 - 1, and its high word has the sign-flip bit set or is ~u of a negative) */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
            if (other > best) best = other;
        }
        const int b = (int)(0xFFFFFFFFu - (uint32_t)(best & 0xFFFFFFFFull));
        if (norm) tot = KERN_FADD(tot, qw[b]);
        if (lane == 0) tk[b] = 1;
        __syncwarp();
    }
    if (lane == 0) {
        int32_t *ir = ids + (size_t)r * (size_t)k;
        float *wr = wts + (size_t)r * (size_t)k;
        int j = 0;
        for (int e = 0; e < E && j < k; e++)
            if (tk[e]) {
                ir[j] = e;
                wr[j] = norm ? KERN_FDIV(qw[e], tot) : qw[e];
                j++;
            }
    }
}

template <typename Launch>
__host__ void moe_route_launch(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    if (p[2] == 0) return;
    launch(k_moe_route, dim3(kc_div_up((size_t)p[2], RT_WARPS)), dim3(RT_WARPS * 32), (size_t)0,
           (const float *)op->buf[0].ptr, (int32_t *)op->buf[1].ptr, (float *)op->buf[2].ptr,
           (const int32_t *)op->buf[3].ptr, p[0], p[1], p[2], p[3], err);
}

/* ---- KOP_MOE_FFN ---------------------------------------------------------------------------------------- */
#define GROUP_THREADS 256

__global__ void __launch_bounds__(GROUP_THREADS)
    k_moe_group(const int32_t *__restrict__ ids, const int32_t *n_rows, int E, int k, int max_rows,
                int32_t *__restrict__ offs, int32_t *__restrict__ act, int32_t *__restrict__ posof,
                int32_t *__restrict__ srcrow, kc_err *err)
{
    __shared__ int cnt[KERN_MAX_EXPERTS];
    __shared__ int bad;
    const int n = kc_rows(n_rows, max_rows, err, KOP_MOE_FFN);
    if (n < 0) { /* reported; every later launch sees act[0] < 0 and does nothing */
        if (threadIdx.x == 0) act[0] = -1;
        return;
    }
    if (threadIdx.x == 0) bad = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    const int nk = n * k;
    for (int qi = threadIdx.x; qi < nk; qi += blockDim.x) {
        const int32_t e = ids[qi];
        const int r = qi / k, j = qi % k;
        bool ok = e >= 0 && e < E;
        for (int jj = 0; jj < j && ok; jj++) ok = ids[r * k + jj] != e;
        if (!ok) {
            bad = 1;
            kc_fail(err, KC_ERR_EXPERT, KOP_MOE_FFN, e, E);
        } else {
            atomicAdd(&cnt[e], 1);
        }
    }
    __syncthreads();
    if (bad) {
        if (threadIdx.x == 0) act[0] = -1;
        return; /* every thread: bad was read after the barrier */
    }
    if (threadIdx.x == 0) { /* offsets, the experts with rows, cnt[] becomes each group's cursor */
        int o = 0, na = 0;
        for (int e = 0; e < E; e++) {
            const int c = cnt[e];
            offs[e] = o;
            if (c) act[1 + na++] = e;
            cnt[e] = o;
            o += c;
        }
        offs[E] = o;
        act[0] = na;
    }
    __syncthreads();
    for (int qi = threadIdx.x; qi < nk; qi += blockDim.x) {
        const int pos = atomicAdd(&cnt[ids[qi]], 1);
        posof[qi] = pos;
        srcrow[pos] = qi / k;
    }
}

/* a[q, i] = silu(g) * u for the routed rows q < n * k (gu [., 2I], a [., I]) */
__global__ void __launch_bounds__(256) k_moe_silu(const float *__restrict__ gu, float *__restrict__ a,
                                                  const int32_t *n_rows, const int32_t *act, int I, int k)
{
    if (act[0] < 0) return;
    const size_t total = (size_t)*n_rows * (size_t)k * (size_t)I, step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        const size_t q = e / (size_t)I, i = e % (size_t)I;
        const float *g = gu + q * 2 * (size_t)I;
        a[e] = kc_silu_mul_exact(g[i], g[I + i]);
    }
}

/* out[r, i] = out[r, i] + sum over j (in order) of wts[r, j] * y[posof[r, j], i] */
__global__ void __launch_bounds__(256) k_moe_combine(const float *__restrict__ y, const float *__restrict__ wts,
                                                     const int32_t *__restrict__ posof, float *__restrict__ out,
                                                     const int32_t *n_rows, const int32_t *act, int H, int k)
{
    if (act[0] < 0) return;
    const size_t total = (size_t)*n_rows * (size_t)H, step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        const size_t r = e / (size_t)H, i = e % (size_t)H;
        const float *w = wts + r * (size_t)k;
        const int32_t *pos = posof + r * (size_t)k;
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc = KERN_FADD(acc, KERN_FMUL(w[j], y[(size_t)pos[j] * (size_t)H + i]));
        out[e] = KERN_FADD(out[e], acc);
    }
}

/* c: the context (its SM count sizes the grid-stride grids) */
template <typename Launch>
__host__ void moe_ffn_launches(const kern_cuda_ctx *c, const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    const int H = p[0], I = p[1], E = p[2], k = p[3], M = p[4], wdt = p[5];
    if (M == 0) return;
    const size_t n = (size_t)M * (size_t)k;
#define R64(b) (((b) + 63) & ~(size_t)63)
    uint8_t *s = (uint8_t *)op->buf[7].ptr + R64(n * (size_t)H * 4); /* past the (unused) gathered rows */
    float *gu = (float *)s;
    s += R64(n * (size_t)I * 8);
    float *a = (float *)s;
    s += R64(n * (size_t)I * 4);
    float *y = (float *)s;
    s += R64(n * (size_t)H * 4);
    int32_t *posof = (int32_t *)s;
    s += R64(n * 4);
    int32_t *offs = (int32_t *)s;
    s += R64(((size_t)E + 1) * 4);
    int32_t *srcrow = (int32_t *)s;
    s += R64(n * 4);
    int32_t *act = (int32_t *)s;
#undef R64
    const float *h = (const float *)op->buf[0].ptr;
    const int32_t *ids = (const int32_t *)op->buf[3].ptr, *nr = (const int32_t *)op->buf[6].ptr;
    launch(k_moe_group, dim3(1), dim3(GROUP_THREADS), (size_t)0, ids, nr, E, k, M, offs, act, posof, srcrow, err);
    /* grid y: the most experts that can have rows; an expert holds at most M rows (distinct ids per row) */
    const unsigned gy = (unsigned)((size_t)E < n ? (size_t)E : n);
    const kc_mm_grp g13 = {offs, act, srcrow, (size_t)2 * (size_t)I * (size_t)H};
    /* FP8 experts: their scale tables (buf 8 / 9, blocks p[6] x p[7]); read only then */
    const kc_mm_f8 f13 = {(const float *)op->buf[8].ptr, p[6], p[7]}, f2 = {(const float *)op->buf[9].ptr, p[6], p[7]};
    kc_mm_launch(h, op->buf[1].ptr, (const float *)NULL, gu, nr, H, 2 * I, M, wdt, 0, err, &g13, gy, launch, &f13);
    launch(k_moe_silu, dim3(kc_grid_for(c, n * (size_t)I)), dim3(256), (size_t)0, (const float *)gu, a, nr,
           (const int32_t *)act, I, k);
    const kc_mm_grp g2 = {offs, act, (const int32_t *)NULL, (size_t)H * (size_t)I};
    kc_mm_launch((const float *)a, op->buf[2].ptr, (const float *)NULL, y, nr, I, H, M, wdt, 0, err, &g2, gy, launch,
                 &f2);
    launch(k_moe_combine, dim3(kc_grid_for(c, (size_t)M * (size_t)H)), dim3(256), (size_t)0, (const float *)y,
           (const float *)op->buf[4].ptr, (const int32_t *)posof, (float *)op->buf[5].ptr, nr, (const int32_t *)act,
           H, k);
}

#ifndef GS_CUDA_EMU
void kc_moe_route(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    moe_route_launch(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("moe_route");
    });
}

void kc_moe_ffn(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    moe_ffn_launches(c, op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("moe_ffn");
    });
}
#endif
