/* kernels/cuda/matmul.cu — KOP_MATMUL: out[r, n] (+)= sum_k x[r, k] * W[n, k] + bias[n], r < n_rows.
 *
 * Activations are f32 (the project's contract), weights bf16 (or f32 for f32 checkpoints).
 *
 * Batch invariance (kernels/kern.h, invariant I9): by default a row's result is bitwise the same
 * whatever the op's max_rows (the plan bucket) and the live row count, so a verify step computes the
 * same logits for a row as a plain decode step. The path is chosen on the host from K, the weight
 * dtype and the alignment of x and W only (never from max_rows or the live row count):
 *
 * 1. Skinny tensor-core kernel (bf16 weights, K % 32 == 0, 16-byte aligned x and W), for every
 *    max_rows. The roles are swapped so the weight is the 16-row "A" operand of mma.sync.m16n8k16
 *    and 8 activation rows form the "B" operand. Each f32 activation is split into bf16 hi + lo
 *    parts and both are multiplied (2 MMAs), so activations keep ~16 significant bits and the only
 *    rounding left is the f32 accumulation: results are close to the CPU's f32 x bf16 product.
 *    Since a dot product is order-free, thread (g, t) loads 8 consecutive k of its weight rows as one
 *    16-byte vector and the same 8 k of its activation row; the k-slot <-> k mapping is the same in
 *    A and B. A block owns 16 output features and a tile of up to 32 rows (RG groups of 8: RG = 1, 2
 *    or 4 from max_rows) and splits K across its warps (warps = min(K / 32, 8): a function of K);
 *    the grid is (row tiles) x (feature strips) flattened with the row tile fastest, so the blocks
 *    that read one weight strip run together and the strip is read from HBM about once. Why a row's
 *    result does not depend on RG, its tile or n_rows: an MMA output element depends only on its own
 *    A row, B column and accumulator; row r always sits in B column r % 8; every warp walks its k
 *    chunks (warp, warp + nw, warp + 2 nw, ...) in increasing order whatever RG; the warps' partial
 *    tiles are summed through shared memory in warp order 0 .. nw-1; rows >= n only ever see zero B
 *    columns. Rows >= n are neither read nor written.
 * 2. CUDA-core kernel (f32 weights for every max_rows; bf16 weights when K % 32 != 0 or x / W are
 *    not 16-byte aligned): one warp per output feature and per tile of 32 rows, rows in groups of 4;
 *    each row has its own accumulator (lane-strided f32 FMAs in k order, then a fixed butterfly warp
 *    sum), so its result does not depend on the other rows either.
 * 3. cuBLASLt, only when the context was created with fast_gemm (GS_CUDA_FAST_GEMM=1), for
 *    max_rows > KERN_CUDA_SKINNY_ROWS (prefill chunks, large verify steps) and for bf16 weights that
 *    path 1 cannot take (the choice before batch invariance): faster prefill, but a
 *    row's result then depends on its plan bucket (bf16-rounded activations, the library's own
 *    reduction order), so I9 holds only up to rounding. Per chunk of Mc rows, the live activation
 *    rows are cast to bf16 (round to nearest even; rows >= n zeroed, never read) into scratch, one
 *    bf16 x bf16 -> f32 GEMM per chunk of Nc output columns (CUBLAS_COMPUTE_32F) writes into an f32
 *    scratch tile, and an epilogue adds the bias and stores (or accumulates) the live rows only.
 *    f32 weights run the same with f32 inputs (staged the same way) and CUBLAS_COMPUTE_32F (no TF32).
 *    Descriptors and the heuristic's algorithm are cached per shape; workspace and scratch are the
 *    context's (allocated once, only with fast_gemm: c->lt != NULL is the switch), so the GEMMs
 *    capture into graphs. A shape without an algorithm falls back to path 1 or 2.
 * In every path each output element is summed in one fixed order: eager runs and graph replays of an
 * op are bitwise equal.
 */
#include "kernels/cuda/common.cuh"

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
template <int RG>
__global__ void __launch_bounds__(SK_MAX_WARPS * 32)
    k_mm_skinny(const float *__restrict__ x, const uint16_t *__restrict__ w, const float *__restrict__ bias,
                float *__restrict__ out, const int32_t *n_rows, int K, int N, int max_rows, int tiles,
                int accumulate, kc_err *err)
{
    __shared__ float red[SK_MAX_WARPS][RG][4][32];
    const int nall = kc_rows(n_rows, max_rows, err, KOP_MATMUL);
    const int tile = (int)(blockIdx.x % (unsigned)tiles), strip = (int)(blockIdx.x / (unsigned)tiles);
    const int row0 = tile * (RG * 8);
    if (nall <= row0) return; /* the whole block (also nall < 0: a bad row count, reported) */
    /* live rows of this tile; x and out are addressed from the tile's first row */
    const int n = nall - row0 < RG * 8 ? nall - row0 : RG * 8;
    x += (size_t)row0 * (size_t)K;
    out += (size_t)row0 * (size_t)N;
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
        xr[rg] = reinterpret_cast<const float4 *>(x + (size_t)(xok[rg] ? row : 0) * (size_t)K) + 2 * t;
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

/* ---- CUDA-core kernel: one warp per (output feature, row tile) ------------------------------------------- */
#define SIMPLE_TILE_ROWS 32

/* Block b: row tile b % tiles (rows row0 .. row0 + 31), features 8 (b / tiles) .. + 7 (one per warp).
 * Each row has its own accumulator: its result depends on its own x row only. */
template <bool BF>
__global__ void __launch_bounds__(256) k_mm_simple(const float *__restrict__ x, const void *__restrict__ w,
                                                   const float *__restrict__ bias, float *__restrict__ out,
                                                   const int32_t *n_rows, int K, int N, int max_rows, int tiles,
                                                   int accumulate, kc_err *err)
{
    const int nall = kc_rows(n_rows, max_rows, err, KOP_MATMUL);
    const int tile = (int)(blockIdx.x % (unsigned)tiles), fb = (int)(blockIdx.x / (unsigned)tiles);
    const int f = fb * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int row0 = tile * SIMPLE_TILE_ROWS;
    if (nall <= row0 || f >= N) return;
    const int n = nall - row0 < SIMPLE_TILE_ROWS ? nall - row0 : SIMPLE_TILE_ROWS; /* rows of this tile */
    x += (size_t)row0 * (size_t)K;
    out += (size_t)row0 * (size_t)N;
    const size_t wrow = (size_t)f * (size_t)K;
    for (int r0 = 0; r0 < n; r0 += 4) {
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        for (int k = lane; k < K; k += 32) {
            const float wv = BF ? kc_bf16_to_f32(((const uint16_t *)w)[wrow + k]) : ((const float *)w)[wrow + k];
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (r0 + j < n) s[j] = fmaf(x[(size_t)(r0 + j) * (size_t)K + k], wv, s[j]);
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

/* ---- the default (batch-invariant) launch: paths 1 and 2 ----------------------------------------------------- */

/* Path 1 takes the op: bf16 weights, K % 32 == 0, x and W 16-byte aligned (never max_rows or n). */
static int mm_skinny_ok(const kern_op *op)
{
    const int aligned = ((uintptr_t)op->buf[0].ptr % 16) == 0 && ((uintptr_t)op->buf[1].ptr % 16) == 0;
    return op->p[3] == KERN_DT_BF16 && op->p[0] % 32 == 0 && aligned;
}

/* The launch of an op on paths 1 / 2: launch(kernel, grid, block, dynamic smem, arguments...). kc_matmul
 * enqueues it (unless cuBLASLt took the op); tests/emu runs the same launch on the CPU emulation
 * (GS_CUDA_EMU). Path 1 tiles rows by RG * 8 (RG = 1, 2, 4 from max_rows), path 2 by 32. */
template <typename Launch>
__host__ void mm_launches(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    const int K = p[0], N = p[1], M = p[2];
    if (M == 0) return;
    const float *x = (const float *)op->buf[0].ptr;
    const float *bias = (const float *)op->buf[2].ptr;
    float *out = (float *)op->buf[3].ptr;
    const int32_t *nr = (const int32_t *)op->buf[4].ptr;
    if (mm_skinny_ok(op)) {
        const uint16_t *w = (const uint16_t *)op->buf[1].ptr;
        const int warps = K / 32 < SK_MAX_WARPS ? K / 32 : SK_MAX_WARPS; /* a function of K only */
        const int rg = M <= 8 ? 1 : M <= 16 ? 2 : SK_TILE_ROWS / 8;
        const unsigned tiles = kc_div_up((size_t)M, (size_t)rg * 8);
        const dim3 grid(tiles * kc_div_up((size_t)N, 16)), block((unsigned)warps * 32);
        if (rg == 1)
            launch(k_mm_skinny<1>, grid, block, (size_t)0, x, w, bias, out, nr, K, N, M, (int)tiles, p[4], err);
        else if (rg == 2)
            launch(k_mm_skinny<2>, grid, block, (size_t)0, x, w, bias, out, nr, K, N, M, (int)tiles, p[4], err);
        else
            launch(k_mm_skinny<4>, grid, block, (size_t)0, x, w, bias, out, nr, K, N, M, (int)tiles, p[4], err);
    } else {
        const void *w = op->buf[1].ptr;
        const unsigned tiles = kc_div_up((size_t)M, SIMPLE_TILE_ROWS);
        const dim3 grid(tiles * kc_div_up((size_t)N, 8)), block(256);
        if (p[3] == KERN_DT_BF16)
            launch(k_mm_simple<true>, grid, block, (size_t)0, x, w, bias, out, nr, K, N, M, (int)tiles, p[4], err);
        else
            launch(k_mm_simple<false>, grid, block, (size_t)0, x, w, bias, out, nr, K, N, M, (int)tiles, p[4], err);
    }
}

#ifndef GS_CUDA_EMU /* the emulated build (tests/emu) has no cuBLASLt: its context is fast_gemm off */
/* ---- 3. cuBLASLt ------------------------------------------------------------------------------------------ */

/* xs[r, k] = x[m0 + r, k] (as bf16, round to nearest even, or f32) for the live rows of the chunk,
 * 0 for the rest of its Mc rows: the GEMM never reads rows past n. */
template <bool BF>
__global__ void __launch_bounds__(256) k_mm_stage(const float *__restrict__ x, void *__restrict__ xs,
                                                  const int32_t *n_rows, int m0, int Mc, int K, int max_rows,
                                                  kc_err *err)
{
    const int n = kc_rows(n_rows, max_rows, err, KOP_MATMUL);
    int live = n - m0;
    live = live < 0 ? 0 : (live > Mc ? Mc : live);
    const size_t total = (size_t)Mc * (size_t)K, lim = (size_t)live * (size_t)K;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    const float *src = x + (size_t)m0 * (size_t)K;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        if (BF) ((uint16_t *)xs)[e] = e < lim ? kc_f32_to_bf16(src[e]) : (uint16_t)0;
        else ((float *)xs)[e] = e < lim ? src[e] : 0.0f;
    }
}

/* out[m0 + r, n0 + j] (+)= D[r * Nc + j] + bias[n0 + j] for live rows r of the chunk. */
__global__ void __launch_bounds__(256) k_mm_epilogue(const float *__restrict__ D, float *__restrict__ out,
                                                     const float *__restrict__ bias, const int32_t *n_rows, int m0,
                                                     int Mc, int n0, int Nc, int N, int max_rows, int accumulate,
                                                     kc_err *err)
{
    const int n = kc_rows(n_rows, max_rows, err, KOP_MATMUL);
    int live = n - m0;
    live = live < 0 ? 0 : (live > Mc ? Mc : live);
    const size_t total = (size_t)live * (size_t)Nc;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        const size_t r = e / (size_t)Nc, j = e % (size_t)Nc;
        float v = D[e];
        if (bias) v = v + bias[n0 + j];
        float *o = out + ((size_t)m0 + r) * (size_t)N + (size_t)n0 + j;
        *o = accumulate ? *o + v : v;
    }
}

static int align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && a % (uintptr_t)al) al >>= 1;
    return al;
}

void kc_matmul_release(kern_cuda_ctx *c)
{
    for (int i = 0; i < KC_MM_CACHE; i++) {
        kc_mm_entry *e = &c->mm[i];
        if (!e->used) continue;
        cublasLtMatrixLayoutDestroy(e->A);
        cublasLtMatrixLayoutDestroy(e->B);
        cublasLtMatrixLayoutDestroy(e->D);
        cublasLtMatmulDescDestroy(e->op);
        e->used = 0;
    }
}

/* Descriptors + algorithm for D[Nc, Mc] = W[n0:n0+Nc, :] . X[Mc, :]^T (column-major view: TN). */
static kc_mm_entry *mm_entry(kern_cuda_ctx *c, int Mc, int Nc, int K, int wdt, int alA, int alB)
{
    for (int i = 0; i < KC_MM_CACHE; i++) {
        kc_mm_entry *e = &c->mm[i];
        if (e->used && e->Mc == Mc && e->Nc == Nc && e->K == K && e->wdt == wdt && e->alA == alA && e->alB == alB)
            return e;
    }
    kc_mm_entry *e = &c->mm[c->mm_next];
    c->mm_next = (c->mm_next + 1) % KC_MM_CACHE;
    if (e->used) {
        cublasLtMatrixLayoutDestroy(e->A);
        cublasLtMatrixLayoutDestroy(e->B);
        cublasLtMatrixLayoutDestroy(e->D);
        cublasLtMatmulDescDestroy(e->op);
        e->used = 0;
    }
    const cudaDataType_t t = wdt == KERN_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    KC_CUBLAS(cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    KC_CUBLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    KC_CUBLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    KC_CUBLAS(cublasLtMatrixLayoutCreate(&e->A, t, (uint64_t)K, (uint64_t)Nc, (int64_t)K));
    KC_CUBLAS(cublasLtMatrixLayoutCreate(&e->B, t, (uint64_t)K, (uint64_t)Mc, (int64_t)K));
    KC_CUBLAS(cublasLtMatrixLayoutCreate(&e->D, CUDA_R_32F, (uint64_t)Nc, (uint64_t)Mc, (int64_t)Nc));
    cublasLtMatmulPreference_t pref;
    KC_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = c->lt_ws_bytes;
    uint32_t a32 = (uint32_t)alA, b32 = (uint32_t)alB, d32 = 256;
    KC_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    KC_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof a32));
    KC_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b32, sizeof b32));
    KC_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &d32, sizeof d32));
    KC_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &d32, sizeof d32));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, e->op, e->A, e->B, e->D, e->D, pref, 1, &res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    e->have_algo = st == CUBLAS_STATUS_SUCCESS && nres > 0;
    if (e->have_algo) e->algo = res.algo;
    e->used = 1;
    e->Mc = Mc;
    e->Nc = Nc;
    e->K = K;
    e->wdt = wdt;
    e->alA = alA;
    e->alB = alB;
    return e;
}

/* Returns 0 when it enqueued the whole op, -1 when some chunk has no algorithm (nothing enqueued). */
static int mm_cublaslt(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    const int32_t *p = op->p;
    const int K = p[0], N = p[1], M = p[2], wdt = p[3], accumulate = p[4];
    const int bf = wdt == KERN_DT_BF16;
    const size_t wsz = bf ? 2 : 4;
    const float *x = (const float *)op->buf[0].ptr;
    const uint8_t *w = (const uint8_t *)op->buf[1].ptr;
    const float *bias = (const float *)op->buf[2].ptr;
    float *out = (float *)op->buf[3].ptr;
    const int32_t *n_rows = (const int32_t *)op->buf[4].ptr;
    const size_t out_elems = c->gout_bytes / 4;
    /* rows per chunk: the staged copy must fit, and at least 64 output columns of the tile */
    size_t Mc = (size_t)M;
    if (Mc > c->gx_bytes / (wsz * (size_t)K)) Mc = c->gx_bytes / (wsz * (size_t)K);
    const size_t min_cols = (size_t)N < 64 ? (size_t)N : 64;
    if (Mc > out_elems / min_cols) Mc = out_elems / min_cols;
    if (Mc == 0) return -1;
    size_t Nc = out_elems / Mc;
    if (Nc >= (size_t)N) Nc = (size_t)N;
    else Nc = Nc / 64 * 64;
    if (Nc == 0) return -1;
    /* plan every chunk first (host only), so a missing algorithm enqueues nothing */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t m0 = 0; m0 < (size_t)M; m0 += Mc) {
            const int mc = (int)((size_t)M - m0 < Mc ? (size_t)M - m0 : Mc);
            const void *B = c->gx;
            if (pass == 1) {
                const unsigned grid = kc_grid_for(c, (size_t)mc * (size_t)K);
                if (bf) k_mm_stage<true><<<grid, 256, 0, s>>>(x, c->gx, n_rows, (int)m0, mc, K, M, c->err_dev);
                else k_mm_stage<false><<<grid, 256, 0, s>>>(x, c->gx, n_rows, (int)m0, mc, K, M, c->err_dev);
                KC_LAUNCHED("matmul stage");
            }
            for (size_t n0 = 0; n0 < (size_t)N; n0 += Nc) {
                const int nc = (int)((size_t)N - n0 < Nc ? (size_t)N - n0 : Nc);
                const void *A = w + n0 * (size_t)K * wsz;
                kc_mm_entry *e = mm_entry(c, mc, nc, K, wdt, align_of(A), align_of(B));
                if (!e->have_algo) return -1; /* only possible in pass 0 */
                if (pass == 0) continue;
                const float one = 1.0f, zero = 0.0f;
                KC_CUBLAS(cublasLtMatmul(c->lt, e->op, &one, A, e->A, B, e->B, &zero, c->gout, e->D, c->gout, e->D,
                                         &e->algo, c->lt_ws, c->lt_ws_bytes, s));
                k_mm_epilogue<<<kc_grid_for(c, (size_t)mc * (size_t)nc), 256, 0, s>>>(
                    c->gout, out, bias, n_rows, (int)m0, mc, (int)n0, nc, N, M, accumulate, c->err_dev);
                KC_LAUNCHED("matmul epilogue");
            }
        }
    }
    return 0;
}

void kc_matmul(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    const int32_t *p = op->p;
    const int M = p[2];
    if (M == 0) return;
    const int bf = p[3] == KERN_DT_BF16;
    /* fast_gemm only (the cuBLASLt handle exists only then): large buckets, and bf16 weights the
     * tensor-core kernel cannot take, go to cuBLASLt; a shape without an algorithm falls through */
    if (c->lt && (M > KERN_CUDA_SKINNY_ROWS || (bf && !mm_skinny_ok(op))) && mm_cublaslt(c, op, s) == 0) return;
    mm_launches(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("matmul");
    });
}
#endif
