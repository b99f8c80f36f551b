/* kernels/cuda/mm_kernels.cuh — the batch-invariant matmul kernels (kernels/cuda/matmul.cu's paths 1,
 * 2 and 4, FP8: their design and why a row's result does not depend on the other rows are in matmul.cu's
 * header), shared by KOP_MATMUL (matmul.cu) and the grouped expert matmuls of KOP_MOE_FFN (moe.cu).
 *
 * Grouped launch (GROUPED = true, kc_mm_grp): the grid's y index is a slot of the list of experts that
 * have rows (act[0] = their count, act[1 ..] their ids); block (x, y) runs the ungrouped kernel's block
 * x on expert e = act[1 + y]: rows offs[e] .. offs[e + 1] of the grouped output, weight rows from
 * w + e * wstride, activation row i of the group read from x row xmap[offs[e] + i] (xmap != NULL) or
 * x row offs[e] + i. A slot past the count returns at once (act[0] < 0: the grouping failed, all
 * return). max_rows is the most rows one expert may hold (tiles are sized for it). Each output element
 * takes exactly the arithmetic of the ungrouped kernel for the same activation row, weight row and K:
 * an expert's dot products are KOP_MATMUL rows bit for bit (kern.h's KOP_MOE_FFN contract, on this
 * backend). No bias and no accumulation in grouped launches. */
#ifndef GS_KERN_CUDA_MM_KERNELS_CUH
#define GS_KERN_CUDA_MM_KERNELS_CUH

#include <type_traits>

#include "kernels/cuda/common.cuh"

/* the grouping of a grouped launch (ignored by ungrouped ones) */
struct kc_mm_grp {
    const int32_t *offs; /* [E + 1]: expert e's rows are offs[e] .. offs[e + 1] */
    const int32_t *act;  /* [1 + E]: count, then the experts with rows */
    const int32_t *xmap; /* grouped row -> x row, or NULL (x is grouped already) */
    size_t wstride;      /* weight elements per expert */
};

/* Resolves block (blockIdx.x, blockIdx.y) of a grouped launch: returns the live rows of its expert (-1:
 * nothing to do), its id in e and its first grouped row in r0. */
__device__ __forceinline__ int kc_mm_group_rows(const kc_mm_grp &g, int &e, int &r0)
{
    const int na = g.act[0];
    if ((int)blockIdx.y >= na) return -1;
    e = g.act[1 + blockIdx.y];
    r0 = g.offs[e];
    return g.offs[e + 1] - r0;
}

/* ---- 1. skinny tensor-core kernel --------------------------------------------------------------------- */

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1)
{
#ifdef GS_CUDA_EMU /* tests/emu: the instruction emulated from the PTX ISA's fragment layouts (emu_mma.cpp) */
    emu_mma_m16n8k16_bf16_f32(d, a0, a1, a2, a3, b0, b1);
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

/* (a, b) -> bf16x2 hi = rn(a), rn(b) and lo = rn(a - hi), rn(b - hi); a in the low half. */
__device__ __forceinline__ void split_pair(float a, float b, uint32_t &hi, uint32_t &lo)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
    memcpy(&hi, &h, 4);
    memcpy(&lo, &l, 4);
}

/* One 32-wide k chunk of a 16 x 8 tile: thread (g, t) holds weight rows f0 = g and f1 = g + 8 at
 * k0 .. k0+7 (a, b: 8 bf16 each, k0 = 32 kc + 8 t) and loads activation row g of its group at the
 * same k. k-slots 2t, 2t+1 <-> k0+0,1 and 2t+8, 2t+9 <-> k0+2,3 in the first MMA pair, k0+4..7 in
 * the second; each pair multiplies the hi then the lo part of the activations. */
__device__ __forceinline__ void mm_chunk(float (&acc)[4], const uint4 &a, const uint4 &b, const float4 *xr, int kc,
                                         bool xok)
{
    const float4 zf = make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 p = xok ? __ldg(xr + (size_t)kc * 8) : zf;     /* k0 .. k0+3 */
    const float4 q = xok ? __ldg(xr + (size_t)kc * 8 + 1) : zf; /* k0+4 .. k0+7 */
    uint32_t h0, l0, h1, l1, h2, l2, h3, l3;
    split_pair(p.x, p.y, h0, l0);
    split_pair(p.z, p.w, h1, l1);
    split_pair(q.x, q.y, h2, l2);
    split_pair(q.z, q.w, h3, l3);
    mma_bf16_16816(acc, a.x, b.x, a.y, b.y, h0, h1);
    mma_bf16_16816(acc, a.x, b.x, a.y, b.y, l0, l1);
    mma_bf16_16816(acc, a.z, b.z, a.w, b.w, h2, h3);
    mma_bf16_16816(acc, a.z, b.z, a.w, b.w, l2, l3);
}

#define SK_MAX_WARPS 8
#define SK_TILE_ROWS 32 /* rows per block at most: 4 groups of 8 */

/* Block b: row tile b % tiles (RG * 8 rows from row0), feature strip b / tiles (16 features). */
template <int RG, bool GROUPED>
__global__ void __launch_bounds__(SK_MAX_WARPS * 32)
    k_mm_skinny(const float *__restrict__ x, const uint16_t *__restrict__ w, const float *__restrict__ bias,
                float *__restrict__ out, const int32_t *n_rows, int K, int N, int max_rows, int tiles,
                int accumulate, kc_err *err, kc_mm_grp grp)
{
    __shared__ float red[SK_MAX_WARPS][RG][4][32];
    int e = 0, r0g = 0; /* grouped: the expert and its first grouped row */
    const int nall = GROUPED ? kc_mm_group_rows(grp, e, r0g) : kc_rows(n_rows, max_rows, err, KOP_MATMUL);
    const int tile = (int)(blockIdx.x % (unsigned)tiles), strip = (int)(blockIdx.x / (unsigned)tiles);
    const int row0 = tile * (RG * 8);
    if (nall <= row0) return; /* the whole block (also nall < 0: a bad row count, reported) */
    /* live rows of this tile; x (unless mapped) and out are addressed from the tile's first row */
    const int n = nall - row0 < RG * 8 ? nall - row0 : RG * 8;
    const bool mapped = GROUPED && grp.xmap;
    if (GROUPED) w += (size_t)e * grp.wstride;
    const size_t first = (size_t)r0g + (size_t)row0; /* r0g is 0 ungrouped */
    if (!mapped) x += first * (size_t)K;
    out += first * (size_t)N;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int f0 = strip * 16 + g, f1 = f0 + 8;
    const bool ok0 = f0 < N, ok1 = f1 < N;
    /* 32 k per chunk: 4 x 16 bytes of each weight row, 8 x 16 bytes of each activation row */
    const uint4 *w0 = reinterpret_cast<const uint4 *>(w + (size_t)(ok0 ? f0 : 0) * (size_t)K) + t;
    const uint4 *w1 = reinterpret_cast<const uint4 *>(w + (size_t)(ok1 ? f1 : 0) * (size_t)K) + t;
    const int groups = (n + 7) >> 3;
    const float4 *xr[RG];
    bool xok[RG];
#pragma unroll
    for (int rg = 0; rg < RG; rg++) {
        const int row = rg * 8 + g;
        xok[rg] = row < n;
        const size_t xrow = !xok[rg] ? 0 : mapped ? (size_t)grp.xmap[r0g + row0 + row] : (size_t)row;
        xr[rg] = reinterpret_cast<const float4 *>(x + xrow * (size_t)K) + 2 * t;
    }
    float acc[RG][4];
#pragma unroll
    for (int rg = 0; rg < RG; rg++) acc[rg][0] = acc[rg][1] = acc[rg][2] = acc[rg][3] = 0.0f;

    const int KC = K >> 5;
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    /* Two chunks per iteration, both weight loads (the HBM stream) issued before any math; the
     * activation loads hit L1/L2 (every block reads the same few rows). */
    for (int kc = warp; kc < KC; kc += 2 * nw) {
        const int kc2 = kc + nw;
        const bool two = kc2 < KC;
        const uint4 a0 = ok0 ? __ldg(w0 + (size_t)kc * 4) : z4; /* row f0: k0 .. k0+7 */
        const uint4 b0 = ok1 ? __ldg(w1 + (size_t)kc * 4) : z4; /* row f1 */
        const uint4 a1 = ok0 && two ? __ldg(w0 + (size_t)kc2 * 4) : z4;
        const uint4 b1 = ok1 && two ? __ldg(w1 + (size_t)kc2 * 4) : z4;
#pragma unroll
        for (int rg = 0; rg < RG; rg++) {
            if (rg < groups) {
                mm_chunk(acc[rg], a0, b0, xr[rg], kc, xok[rg]);
                if (two) mm_chunk(acc[rg], a1, b1, xr[rg], kc2, xok[rg]);
            }
        }
    }
#pragma unroll
    for (int rg = 0; rg < RG; rg++) {
#pragma unroll
        for (int c = 0; c < 4; c++) red[warp][rg][c][lane] = acc[rg][c];
    }
    __syncthreads();
    /* C fragment: c0,c1 = (feature g, rows 2t, 2t+1), c2,c3 = (feature g+8, rows 2t, 2t+1) */
    for (int i = threadIdx.x; i < RG * 4 * 32; i += blockDim.x) {
        const int l = i & 31, c = (i >> 5) & 3, rg = i >> 7;
        const int row = rg * 8 + 2 * (l & 3) + (c & 1);
        const int f = strip * 16 + (l >> 2) + (c >= 2 ? 8 : 0);
        if (row >= n || f >= N) continue;
        float s = red[0][rg][c][l];
        for (int ww = 1; ww < nw; ww++) s += red[ww][rg][c][l];
        if (bias) s = s + bias[f];
        float *o = out + (size_t)row * (size_t)N + f;
        *o = accumulate ? *o + s : s;
    }
}

/* ---- 2 and 4. CUDA-core kernel: one warp per (output feature, row tile) ------------------------------------- */
#define SIMPLE_TILE_ROWS 32

/* an FP8 operand's scale table (kern.h KOP_MATMUL / KOP_MOE_FFN): S row-major [ceil(rows / b0),
 * ceil(K / b1)], b1 a power of two */
struct kc_mm_f8 {
    const float *s;
    int b0, b1;
};

/* kern.h's kern_fp8_raw: the e4m3 code's bits moved into an f32 (its value times 2^-120) */
__device__ __forceinline__ float kc_fp8_raw(uint8_t q)
{
    return __uint_as_float(((uint32_t)(q & 0x80u) << 24) | ((uint32_t)(q & 0x7fu) << 20));
}

/* Weight rows for the CUDA-core kernel: row(e, f) points at expert e's (0 ungrouped) weight row f,
 * at(k) is its f32 weight k. Path 2 reads f32 or bf16 weights as they are; path 4 (FP8) decodes
 * each code and multiplies it by its block scale, kc_fp8_raw(q) * (S[f / b0][k >> sh] * 2^120): one
 * rounded multiply, the value kern.h defines, so path 4 is bitwise path 2 over the dequantized f32
 * weights. Expert e's rows start wstride elements further, on a block row (kern_validate). */
template <typename W>
struct kc_wrow_plain {
    const W *w;
    size_t wstride, K;
    const W *r;
    __device__ __forceinline__ void row(int e, int f) { r = w + (size_t)e * wstride + (size_t)f * K; }
    __device__ __forceinline__ float at(int k) const
    {
        if constexpr (std::is_same<W, uint16_t>::value) return kc_bf16_to_f32(r[k]);
        else return r[k];
    }
};
struct kc_wrow_fp8 {
    const uint8_t *w;
    const float *s;
    size_t wstride, K;
    int b0, sh, sk;
    const uint8_t *r;
    const float *sr;
    __device__ __forceinline__ void row(int e, int f)
    {
        r = w + (size_t)e * wstride + (size_t)f * K;
        sr = s + ((size_t)e * (wstride / K / (size_t)b0) + (size_t)(f / b0)) * (size_t)sk;
    }
    __device__ __forceinline__ float at(int k) const { return kc_fp8_raw(r[k]) * (sr[k >> sh] * 0x1p120f); }
};

/* Block b: row tile b % tiles (rows row0 .. row0 + 31), features 8 (b / tiles) .. + 7 (one per warp).
 * Each row has its own accumulator (lane-strided f32 FMAs in k order, then the fixed warp sum): its
 * result depends on its own x row only. */
template <typename WR, bool GROUPED>
__global__ void __launch_bounds__(256) k_mm_simple(const float *__restrict__ x, WR wr, const float *__restrict__ bias,
                                                   float *__restrict__ out, const int32_t *n_rows, int K, int N,
                                                   int max_rows, int tiles, int accumulate, kc_err *err, kc_mm_grp grp)
{
    int e = 0, r0g = 0;
    const int nall = GROUPED ? kc_mm_group_rows(grp, e, r0g) : kc_rows(n_rows, max_rows, err, KOP_MATMUL);
    const int tile = (int)(blockIdx.x % (unsigned)tiles), fb = (int)(blockIdx.x / (unsigned)tiles);
    const int f = fb * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int row0 = tile * SIMPLE_TILE_ROWS;
    if (nall <= row0 || f >= N) return;
    const int n = nall - row0 < SIMPLE_TILE_ROWS ? nall - row0 : SIMPLE_TILE_ROWS; /* rows of this tile */
    const bool mapped = GROUPED && grp.xmap;
    wr.row(e, f);
    const size_t first = (size_t)r0g + (size_t)row0; /* r0g is 0 ungrouped */
    if (!mapped) x += first * (size_t)K;
    out += first * (size_t)N;
    for (int r0 = 0; r0 < n; r0 += 4) {
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        const float *xj[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int row = r0 + j < n ? r0 + j : 0;
            xj[j] = x + (mapped ? (size_t)grp.xmap[r0g + row0 + row] : (size_t)row) * (size_t)K;
        }
        for (int k = lane; k < K; k += 32) {
            const float wk = wr.at(k);
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (r0 + j < n) s[j] = fmaf(xj[j][k], wk, s[j]);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) s[j] = kc_warp_sum(s[j]);
        if (lane == 0) {
            for (int j = 0; j < 4 && r0 + j < n; j++) {
                float v = s[j];
                if (bias) v = v + bias[f];
                float *o = out + (size_t)(r0 + j) * (size_t)N + f;
                *o = accumulate ? *o + v : v;
            }
        }
    }
}

/* Path 1 takes the operands: bf16 weights, K % 32 == 0, x and W 16-byte aligned (never max_rows or n;
 * grouped: the per-expert bases stay aligned when the base is, since K % 32 == 0). */
static inline int kc_mm_skinny_ok(int wdt, int K, const void *x, const void *w)
{
    return wdt == KERN_DT_BF16 && K % 32 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w % 16) == 0;
}

/* One matmul on paths 1 / 2 / 4: launch(kernel, grid, block, dynamic smem, arguments...). gy: the grid's y
 * size (1 ungrouped; grouped: the most experts that can have rows). Path 1 tiles rows by RG * 8
 * (RG = 1, 2, 4 from max_rows), paths 2 and 4 by 32. f8: the scales of FP8 weights (wdt KERN_DT_FP8). */
template <typename Launch>
__host__ void kc_mm_launch(const float *x, const void *w, const float *bias, float *out, const int32_t *nr, int K,
                           int N, int M, int wdt, int accumulate, kc_err *err, const kc_mm_grp *grp, unsigned gy,
                           Launch &&launch, const kc_mm_f8 *f8 = NULL)
{
    if (M == 0) return;
    const kc_mm_grp g = grp ? *grp : kc_mm_grp{NULL, NULL, NULL, 0};
    if (kc_mm_skinny_ok(wdt, K, x, w)) {
        const uint16_t *wb = (const uint16_t *)w;
        const int warps = K / 32 < SK_MAX_WARPS ? K / 32 : SK_MAX_WARPS; /* a function of K only */
        const int rg = M <= 8 ? 1 : M <= 16 ? 2 : SK_TILE_ROWS / 8;
        const unsigned tiles = kc_div_up((size_t)M, (size_t)rg * 8);
        const dim3 grid(tiles * kc_div_up((size_t)N, 16), gy), block((unsigned)warps * 32);
#define KC_SK(RG)                                                                                                    \
    (grp ? launch(k_mm_skinny<RG, true>, grid, block, (size_t)0, x, wb, bias, out, nr, K, N, M, (int)tiles, accumulate, \
                  err, g)                                                                                          \
         : launch(k_mm_skinny<RG, false>, grid, block, (size_t)0, x, wb, bias, out, nr, K, N, M, (int)tiles,          \
                  accumulate, err, g))
        if (rg == 1) KC_SK(1);
        else if (rg == 2) KC_SK(2);
        else KC_SK(4);
#undef KC_SK
    } else { /* paths 2 and 4 */
        const unsigned tiles = kc_div_up((size_t)M, SIMPLE_TILE_ROWS);
        const dim3 grid(tiles * kc_div_up((size_t)N, 8), gy), block(256);
        const size_t ws = g.wstride, Kz = (size_t)K;
#define KC_SIMPLE(WR, wr)                                                                                            \
    (grp ? launch(k_mm_simple<WR, true>, grid, block, (size_t)0, x, wr, bias, out, nr, K, N, M, (int)tiles, accumulate, \
                  err, g)                                                                                          \
         : launch(k_mm_simple<WR, false>, grid, block, (size_t)0, x, wr, bias, out, nr, K, N, M, (int)tiles,          \
                  accumulate, err, g))
        if (wdt == KERN_DT_FP8) {
            int sh = 0;
            while ((1 << sh) < f8->b1) sh++; /* b1 is a power of two (kern_validate) */
            const kc_wrow_fp8 wr = {(const uint8_t *)w, f8->s, ws, Kz, f8->b0, sh, (K + f8->b1 - 1) / f8->b1, NULL, NULL};
            KC_SIMPLE(kc_wrow_fp8, wr);
        } else if (wdt == KERN_DT_BF16) {
            const kc_wrow_plain<uint16_t> wr = {(const uint16_t *)w, ws, Kz, NULL};
            KC_SIMPLE(kc_wrow_plain<uint16_t>, wr);
        } else {
            const kc_wrow_plain<float> wr = {(const float *)w, ws, Kz, NULL};
            KC_SIMPLE(kc_wrow_plain<float>, wr);
        }
#undef KC_SIMPLE
    }
}

#endif
