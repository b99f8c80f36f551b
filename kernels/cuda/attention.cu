/* kernels/cuda/attention.cu — KOP_KV_WRITE and KOP_ATTENTION over the paged f32 KV cache
 * ([num_blocks, block_size, nkv, hd]; block tables map (slot, logical block) to a physical block).
 *
 * Attention: row r, query head h attends cache positions 0 .. kv_len[r]-1 of slot[r]. The kv_len rule
 * covers everything: causal decode and prefill/verify rows (kv_len = pos + 1) and non-causal drafter
 * blocks (the same kv_len on every block row). One block (4 warps) per (row, kv head, group of up to
 * G query heads sharing that kv head, sequence split): each key's K and V rows are read once for all
 * G heads. Lane l owns head dimensions l, l+32, ...; a score is a warp reduction; each warp keeps an
 * online softmax (running max m, sum l, accumulator) over the keys it takes (j = j0 + warp, + 4, ...),
 * and the 4 warps are merged through shared memory in a fixed order. exp2 with log2(e) folded into the
 * scale, f32 throughout.
 *
 * Sequence splits (flash-decoding), batch invariant: a row's keys are cut into splits whose number
 * and ranges are a function of that row's kv_len L only (never of the bucket, the live row count or
 * the other rows), so a row gets bitwise the same output in a decode step, a verify step or a
 * prefill chunk (kernels/kern.h, invariant I9): chunk = ATT_CHUNK keys while L <= ATT_CHUNK *
 * ATT_MAX_SPLITS, else ceil(L / ATT_MAX_SPLITS) rounded up to a multiple of ATT_CHUNK; splits =
 * ceil(L / chunk) <= ATT_MAX_SPLITS. Computed on the device from kv_len, so one captured graph serves
 * every context length. grid.y is the most splits any row can need (from max_blocks * block_size);
 * blocks past their row's split count return at once. A row with one split writes its output
 * directly (a choice that depends on L only); a row with more writes (m, l, acc) partials to
 * scratch, and a combine kernel merges its splits in split order. When the partials of all max_rows
 * rows do not fit the context's attention scratch, the rows are processed in chunks, one (split
 * kernel, combine) pair per chunk on the same stream, reusing the scratch (stream order makes the
 * reuse safe, and it is capturable). Nothing is allocated at launch.
 */
#include <math.h>

#include "kernels/cuda/common.cuh"

/* ---- KOP_KV_WRITE -------------------------------------------------------------------------------------- */
__global__ void __launch_bounds__(128) k_kv_write(const float *__restrict__ qkv, float *kc, float *vc,
                                                  const int32_t *__restrict__ slot, const int32_t *__restrict__ pos,
                                                  const int32_t *__restrict__ bt, const int32_t *n_rows, int head,
                                                  int stride, int k_off, int v_off, int bs, int max_blocks,
                                                  int max_rows, long long num_blocks, long long max_seqs, kc_err *err)
{
    const int n = kc_rows(n_rows, max_rows, err, KOP_KV_WRITE);
    const int r = blockIdx.x;
    if (r >= n) return;
    const int32_t s = slot[r];
    if (s < 0) return; /* masked padding row */
    const int32_t ps = pos[r];
    if (s >= max_seqs) {
        if (threadIdx.x == 0) kc_fail(err, KC_ERR_SLOT, KOP_KV_WRITE, s, (int)max_seqs);
        return;
    }
    if (ps < 0 || ps / bs >= max_blocks) {
        if (threadIdx.x == 0) kc_fail(err, KC_ERR_POS, KOP_KV_WRITE, ps, max_blocks * bs);
        return;
    }
    const int32_t blk = bt[(size_t)s * (size_t)max_blocks + (size_t)(ps / bs)];
    if (blk < 0 || blk >= num_blocks) {
        if (threadIdx.x == 0) kc_fail(err, KC_ERR_BLOCK, KOP_KV_WRITE, blk, (int)num_blocks);
        return;
    }
    const size_t dst = ((size_t)blk * (size_t)bs + (size_t)(ps % bs)) * (size_t)head;
    const float *row = qkv + (size_t)r * (size_t)stride;
    for (int i = threadIdx.x; i < head; i += blockDim.x) {
        kc[dst + i] = row[k_off + i];
        vc[dst + i] = row[v_off + i];
    }
}

/* The launch of a KOP_KV_WRITE op: launch(kernel, grid, block, dynamic smem, arguments...). kc_kv_write
 * enqueues it; tests/emu runs the same launch on the CPU emulation (GS_CUDA_EMU). */
template <typename Launch>
__host__ void kvw_launch(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    if (p[7] == 0) return;
    const int head = p[0] * p[1];
    const long long num_blocks = (long long)(op->buf[1].bytes / ((size_t)p[5] * (size_t)head * 4));
    const long long max_seqs = (long long)(op->buf[5].bytes / ((size_t)p[6] * 4));
    launch(k_kv_write, dim3((unsigned)p[7]), dim3(128), (size_t)0, (const float *)op->buf[0].ptr,
           (float *)op->buf[1].ptr, (float *)op->buf[2].ptr, (const int32_t *)op->buf[3].ptr,
           (const int32_t *)op->buf[4].ptr, (const int32_t *)op->buf[5].ptr, (const int32_t *)op->buf[6].ptr, head,
           p[2], p[3], p[4], p[5], p[6], p[7], num_blocks, max_seqs, err);
}

#ifndef GS_CUDA_EMU
void kc_kv_write(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    kvw_launch(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("kv_write");
    });
}
#endif

/* ---- KOP_ATTENTION ---------------------------------------------------------------------------------------- */
#define ATT_WARPS 4
/* Keys per split (until the split count reaches ATT_MAX_SPLITS). Small, so that decode at batch 1
 * still spreads over the GPU (kv_len 512: 8 splits per kv head, what the bucket-based heuristic chose
 * before); the partials add about G / 64 to the K/V traffic (G query heads per kv head), and rows of
 * up to 64 keys write none. */
#define ATT_CHUNK 64
#define ATT_MAX_SPLITS 64

struct attn_args {
    const float *q, *kc, *vc;
    float *out;
    const int32_t *slot, *kv_len, *bt, *n_rows;
    float *part_acc; /* [rows of the launch, nh, ystride, hd] */
    float *part_ml;  /* [rows of the launch, nh, ystride, 2] */
    long long num_blocks, max_seqs;
    int nh, nkv, hd, q_stride, bs, max_blocks, max_rows, group, hchunks;
    int ystride; /* grid.y: the most splits any row can need */
    int r0;      /* first row of this launch (rows r0 .. r0 + gridDim.x / (nkv * hchunks) - 1) */
    float scale_log2; /* scale * log2(e) */
    kc_err *err;
};

/* Keys per split of a row with L > 0 keys: a function of L only (no overflow for any int L). */
__host__ __device__ __forceinline__ int attn_chunk(int L)
{
    if (L <= ATT_CHUNK * ATT_MAX_SPLITS) return ATT_CHUNK;
    const int c = (L - 1) / ATT_MAX_SPLITS + 1;     /* ceil(L / ATT_MAX_SPLITS) */
    return ((c - 1) / ATT_CHUNK + 1) * ATT_CHUNK; /* rounded up to a multiple of ATT_CHUNK */
}
/* Number of splits of a row with L > 0 keys (1 .. ATT_MAX_SPLITS). */
__host__ __device__ __forceinline__ int attn_splits(int L) { return (L - 1) / attn_chunk(L) + 1; }

/* The row's slot and kv_len, checked. Returns 0 for "no keys" (masked row, empty, or a failed check:
 * reported once), 1 otherwise. */
__device__ __forceinline__ int attn_row(const attn_args &a, int r, int report, int32_t &slot, int32_t &L)
{
    slot = a.slot[r];
    if (slot < 0) return 0;
    L = a.kv_len[r];
    if (slot >= a.max_seqs) {
        if (report) kc_fail(a.err, KC_ERR_SLOT, KOP_ATTENTION, slot, (int)a.max_seqs);
        return 0;
    }
    if (L < 0 || (long long)L > (long long)a.max_blocks * a.bs) {
        if (report) kc_fail(a.err, KC_ERR_KVLEN, KOP_ATTENTION, L, a.max_blocks * a.bs);
        return 0;
    }
    return L > 0;
}

template <int NV, int G>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(attn_args a)
{
    extern __shared__ float sm_acc[]; /* [ATT_WARPS][G][hd] */
    __shared__ float sm_m[ATT_WARPS][G], sm_l[ATT_WARPS][G];
    const int n = kc_rows(a.n_rows, a.max_rows, a.err, KOP_ATTENTION);
    int b = blockIdx.x;
    const int hc = b % a.hchunks;
    b /= a.hchunks;
    const int kvh = b % a.nkv, r = a.r0 + b / a.nkv;
    if (r >= n) return;
    const int split = blockIdx.y;
    const int hd = a.hd, h0 = kvh * a.group + hc * G;
    const int gc = a.group - hc * G < G ? a.group - hc * G : G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t slot, L;
    float *orow = a.out + (size_t)r * (size_t)a.nh * (size_t)hd;
    if (!attn_row(a, r, split == 0 && threadIdx.x == 0, slot, L)) {
        if (split == 0) /* no keys: zeros (the combine skips such rows) */
            for (int e = threadIdx.x; e < gc * hd; e += blockDim.x) orow[(size_t)h0 * hd + e] = 0.0f;
        return;
    }
    const int chunk = attn_chunk(L), nsplit = attn_splits(L);
    if (split >= nsplit) return; /* past the row's own splits (grid.y is the most any row needs) */
    const int j0 = split * chunk;
    const int j1 = j0 + chunk < L ? j0 + chunk : L;

    float q[G][NV];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qh = a.q + (size_t)r * (size_t)a.q_stride + (size_t)(h0 + (g < gc ? g : 0)) * (size_t)hd;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int d = lane + 32 * i;
            q[g][i] = (g < gc && d < hd) ? qh[d] : 0.0f;
        }
    }
    float m[G], l[G], acc[G][NV];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++) acc[g][i] = 0.0f;
    }
    const int32_t *table = a.bt + (size_t)slot * (size_t)a.max_blocks;
    const size_t head = (size_t)a.nkv * (size_t)hd, kv_col = (size_t)kvh * (size_t)hd;
    for (int j = j0 + warp; j < j1; j += ATT_WARPS * 2) {
        /* two keys per iteration (j and j + ATT_WARPS): both loads in flight before the math */
        float kv[2][NV], vv[2][NV];
        bool have[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int jj = j + u * ATT_WARPS;
            have[u] = jj < j1;
            int32_t blk = have[u] ? table[jj / a.bs] : 0;
            if (have[u] && (blk < 0 || blk >= a.num_blocks)) {
                if (lane == 0) kc_fail(a.err, KC_ERR_BLOCK, KOP_ATTENTION, blk, (int)a.num_blocks);
                have[u] = false;
            }
            const size_t at = ((size_t)blk * (size_t)a.bs + (size_t)(jj % a.bs)) * head + kv_col;
#pragma unroll
            for (int i = 0; i < NV; i++) {
                const int d = lane + 32 * i;
                const bool ok = have[u] && d < hd;
                kv[u][i] = ok ? a.kc[at + d] : 0.0f;
                vv[u][i] = ok ? a.vc[at + d] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (!have[u]) continue; /* warp-uniform */
#pragma unroll
            for (int g = 0; g < G; g++) {
                if (g >= gc) continue;
                float sdot = 0.0f;
#pragma unroll
                for (int i = 0; i < NV; i++) sdot = fmaf(q[g][i], kv[u][i], sdot);
                const float sc = kc_warp_sum(sdot) * a.scale_log2;
                const float mn = fmaxf(m[g], sc);
                const float corr = exp2f(m[g] - mn);
                const float pj = exp2f(sc - mn);
                l[g] = l[g] * corr + pj;
#pragma unroll
                for (int i = 0; i < NV; i++) acc[g][i] = fmaf(pj, vv[u][i], acc[g][i] * corr);
                m[g] = mn;
            }
        }
    }
    /* merge the warps (fixed order) */
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int d = lane + 32 * i;
            if (d < hd) sm_acc[((size_t)warp * G + g) * hd + d] = acc[g][i];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < gc * hd; e += blockDim.x) {
        const int g = e / hd, d = e % hd;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[w][g]);
        float Ls = 0.0f, A = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) {
            const float mw = sm_m[w][g];
            if (mw == -INFINITY) continue; /* took no keys */
            const float cw = exp2f(mw - M);
            Ls = fmaf(sm_l[w][g], cw, Ls);
            A = fmaf(sm_acc[((size_t)w * G + g) * hd + d], cw, A);
        }
        if (nsplit == 1) {
            orow[(size_t)(h0 + g) * hd + d] = A / Ls;
        } else {
            const size_t pi = ((size_t)(r - a.r0) * a.nh + (size_t)(h0 + g)) * (size_t)a.ystride + (size_t)split;
            a.part_acc[pi * hd + d] = A;
            if (d == 0) {
                a.part_ml[2 * pi] = M;
                a.part_ml[2 * pi + 1] = Ls;
            }
        }
    }
}

/* Merges the splits of one (row, head) in split order; rows with no keys or one split were written
 * by the split kernel. */
__global__ void __launch_bounds__(128) k_attention_combine(attn_args a)
{
    const int n = kc_rows(a.n_rows, a.max_rows, a.err, KOP_ATTENTION);
    const int r = a.r0 + (int)(blockIdx.x / (unsigned)a.nh), h = (int)(blockIdx.x % (unsigned)a.nh);
    if (r >= n) return;
    const int hd = a.hd;
    float *o = a.out + (size_t)r * (size_t)a.nh * (size_t)hd + (size_t)h * (size_t)hd;
    int32_t slot, L;
    if (!attn_row(a, r, 0, slot, L)) return;
    const int ns = attn_splits(L);
    if (ns <= 1) return;
    const size_t p0 = ((size_t)(r - a.r0) * a.nh + (size_t)h) * (size_t)a.ystride;
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, a.part_ml[2 * (p0 + s)]);
    float Ls = 0.0f;
    for (int s = 0; s < ns; s++) Ls = fmaf(a.part_ml[2 * (p0 + s) + 1], exp2f(a.part_ml[2 * (p0 + s)] - M), Ls);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float A = 0.0f;
        for (int s = 0; s < ns; s++) A = fmaf(a.part_acc[(p0 + s) * hd + d], exp2f(a.part_ml[2 * (p0 + s)] - M), A);
        o[d] = A / Ls;
    }
}

/* Heads per block G, within the register budget G * NV <= 32 (only those are instantiated). */
template <int NV, typename Launch>
static void attn_launch_g(int G, dim3 grid, const attn_args &a, Launch &launch)
{
    const size_t smem = (size_t)ATT_WARPS * (size_t)G * (size_t)a.hd * sizeof(float);
    const dim3 block(ATT_WARPS * 32);
    if constexpr (NV <= 4) {
        switch (G) {
        case 1: launch(k_attention<NV, 1>, grid, block, smem, a); break;
        case 2: launch(k_attention<NV, 2>, grid, block, smem, a); break;
        case 4: launch(k_attention<NV, 4>, grid, block, smem, a); break;
        default: launch(k_attention<NV, 8>, grid, block, smem, a); break;
        }
    } else if constexpr (NV == 8) {
        switch (G) {
        case 1: launch(k_attention<NV, 1>, grid, block, smem, a); break;
        case 2: launch(k_attention<NV, 2>, grid, block, smem, a); break;
        default: launch(k_attention<NV, 4>, grid, block, smem, a); break;
        }
    } else {
        (void)G;
        launch(k_attention<NV, 1>, grid, block, smem, a);
    }
}

/* The launches of a KOP_ATTENTION op, in order (per chunk of rows: the split kernel, then the combine
 * when rows can have several splits): launch(kernel, grid, block, dynamic smem, arguments...). scratch:
 * the context's split partials (scratch_bytes). kc_attention enqueues them; tests/emu runs the same
 * launches on the CPU emulation (GS_CUDA_EMU). */
template <typename Launch>
__host__ void attn_launches(const kern_op *op, float *scratch, size_t scratch_bytes, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    const int nh = p[0], nkv = p[1], hd = p[2], max_rows = p[6];
    if (max_rows == 0) return;
    attn_args a;
    a.q = (const float *)op->buf[0].ptr;
    a.kc = (const float *)op->buf[1].ptr;
    a.vc = (const float *)op->buf[2].ptr;
    a.out = (float *)op->buf[3].ptr;
    a.slot = (const int32_t *)op->buf[4].ptr;
    a.kv_len = (const int32_t *)op->buf[5].ptr;
    a.bt = (const int32_t *)op->buf[6].ptr;
    a.n_rows = (const int32_t *)op->buf[7].ptr;
    a.nh = nh;
    a.nkv = nkv;
    a.hd = hd;
    a.q_stride = p[3];
    a.bs = p[4];
    a.max_blocks = p[5];
    a.max_rows = max_rows;
    a.group = nh / nkv;
    a.num_blocks = (long long)(op->buf[1].bytes / ((size_t)p[4] * (size_t)nkv * (size_t)hd * 4));
    a.max_seqs = (long long)(op->buf[6].bytes / ((size_t)p[5] * 4));
    a.scale_log2 = op->f[0] * 1.4426950408889634f;
    a.err = err;
    /* dims per lane and heads per block (register budget: G * NV <= 32) */
    const int NV = hd <= 32 ? 1 : hd <= 64 ? 2 : hd <= 128 ? 4 : hd <= 256 ? 8 : 32;
    const int gmax = NV <= 4 ? 8 : NV == 8 ? 4 : 1;
    int G = 1;
    while (G < a.group && G < gmax) G *= 2;
    a.hchunks = (a.group + G - 1) / G;
    /* sequence splits: grid.y = the most any row can need (attn_splits is nondecreasing up to
     * ATT_CHUNK * ATT_MAX_SPLITS keys and at most ATT_MAX_SPLITS beyond) */
    const long long max_kv = (long long)a.max_blocks * a.bs;
    long long ys = (max_kv + ATT_CHUNK - 1) / ATT_CHUNK;
    if (ys > ATT_MAX_SPLITS) ys = ATT_MAX_SPLITS;
    if (ys < 1) ys = 1;
    a.ystride = (int)ys;
    /* rows per launch: the partials of every row of a launch must fit the scratch */
    size_t rows_per = (size_t)max_rows;
    if (ys > 1) {
        const size_t per_row = (size_t)nh * (size_t)ys * ((size_t)hd + 2) * sizeof(float);
        rows_per = scratch_bytes / per_row;
        if (rows_per == 0) {
            fprintf(stderr,
                    "graphswap: CUDA attention scratch (%zu bytes) smaller than one row's split partials (%zu "
                    "bytes: %d heads x %lld splits x head dim %d); raise kern_cuda_config.attn_bytes\n",
                    scratch_bytes, per_row, nh, ys, hd);
            abort();
        }
        if (rows_per > (size_t)max_rows) rows_per = (size_t)max_rows;
    }
    a.part_acc = scratch;
    a.part_ml = scratch + rows_per * (size_t)nh * (size_t)ys * (size_t)hd;
    for (size_t r0 = 0; r0 < (size_t)max_rows; r0 += rows_per) {
        const size_t rc = (size_t)max_rows - r0 < rows_per ? (size_t)max_rows - r0 : rows_per;
        a.r0 = (int)r0;
        const dim3 grid((unsigned)(rc * (size_t)nkv * (size_t)a.hchunks), (unsigned)ys);
        switch (NV) {
        case 1: attn_launch_g<1>(G, grid, a, launch); break;
        case 2: attn_launch_g<2>(G, grid, a, launch); break;
        case 4: attn_launch_g<4>(G, grid, a, launch); break;
        case 8: attn_launch_g<8>(G, grid, a, launch); break;
        default: attn_launch_g<32>(G, grid, a, launch); break;
        }
        if (ys > 1) launch(k_attention_combine, dim3((unsigned)(rc * (size_t)nh)), dim3(128), (size_t)0, a);
    }
}

#ifndef GS_CUDA_EMU
void kc_attention(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    attn_launches(op, c->attn, c->attn_bytes, c->err_dev,
                  [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
                      kernel<<<grid, block, smem, s>>>(args...);
                      KC_LAUNCHED("attention");
                  });
}
#endif
