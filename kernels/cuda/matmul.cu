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
 * 4. FP8 weights (KERN_DT_FP8, W8A16 like the CPU backend): path 2's kernel itself, its weight rows
 *    read through kc_wrow_fp8 (mm_kernels.cuh), which decodes each e4m3 code and multiplies it by its
 *    block scale in registers; also the FP8 experts' grouped matmuls of KOP_MOE_FFN. Every max_rows,
 *    never cuBLASLt. An output is bitwise path 2 over the dequantized f32 weights. (Hopper's FP8 tensor
 *    cores take FP8 activations too: a W8A8 path would change the model's numerics, not taken.)
 * In every path each output element is summed in one fixed order: eager runs and graph replays of an
 * op are bitwise equal.
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mm_kernels.cuh"

/* ---- the default (batch-invariant) launch: paths 1, 2 and 4 ------------------------------------------------- */

/* The launch of an op on paths 1 / 2 / 4 (mm_kernels.cuh's kc_mm_launch, ungrouped):
 * launch(kernel, grid, block, dynamic smem, arguments...). kc_matmul enqueues it (unless cuBLASLt took
 * the op); tests/emu runs the same launch on the CPU emulation (GS_CUDA_EMU). */
template <typename Launch>
__host__ void mm_launches(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    const kc_mm_f8 f8 = {(const float *)op->buf[5].ptr, p[5], p[6]}; /* read only for FP8 weights */
    kc_mm_launch((const float *)op->buf[0].ptr, op->buf[1].ptr, (const float *)op->buf[2].ptr, (float *)op->buf[3].ptr,
                 (const int32_t *)op->buf[4].ptr, p[0], p[1], p[2], p[3], p[4], err, NULL, 1u, launch, &f8);
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
     * tensor-core kernel cannot take, go to cuBLASLt; a shape without an algorithm falls through.
     * FP8 weights never: path 4 decodes them in registers */
    if (c->lt && p[3] != KERN_DT_FP8 && (M > KERN_CUDA_SKINNY_ROWS || (bf && !kc_mm_skinny_ok(p[3], p[0], op->buf[0].ptr, op->buf[1].ptr))) && mm_cublaslt(c, op, s) == 0) return;
    mm_launches(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("matmul");
    });
}
#endif
