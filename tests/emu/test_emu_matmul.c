/* tests/emu/test_emu_matmul.c — kernels/cuda/matmul.cu (KOP_MATMUL), the real CUDA source, run on the CPU
 * emulation of the CUDA primitives (tests/emu/emu_cuda.h; mma.sync emulated from the PTX ISA's fragment
 * layouts, tests/emu/emu_mma.cpp) against the CPU kernel (kern_cpu_exec).
 *
 * Why: CI has no GPU; tests/gpu/test_cuda_ops.c and test_cuda_invariance.c only run where one is lent.
 * This runs the default (batch-invariant) paths on every CI run: the tensor-core kernel (fragment
 * indexing, hi / lo split, k chunks over warps, warp partials merged through shared memory, 16-feature
 * strips, 32-row tiles of 1 / 2 / 4 row groups) and the CUDA-core kernel (f32 weights; bf16 with
 * K % 32 != 0 or misaligned x).
 *
 *  - test_matmul: shapes covering each path: N % 16 != 0 (partial strips, a strip's second 8 features
 *    absent), K of 1, 3, 8, 16 and 24 chunks of 32 (one to eight warps, one or two chunks per loop
 *    iteration, an odd chunk count), 1 / 2 / 4 row groups, several 32-row tiles with a partial last one,
 *    accumulate, bias, f32 and bf16 weights, K % 32 != 0, a misaligned x (a view 4 bytes into its
 *    buffer), n == max_rows with a partial row group (x ends at an inaccessible page), zero live rows,
 *    max_rows 0. Each vs the CPU within 2e-5 (of the largest |output|), rows
 *    past n keep the poison, inputs past n are NaN (a kernel reading them fails), two schedules agree.
 *  - test_matmul_invariance: the same 8 rows computed in ops with max_rows 1 (row 0), 8, 16, 40 and 64 and
 *    several live counts (the other rows random) are bitwise identical, on each path, and within
 *    tolerance of a double reference.
 *  - test_matmul_rows_check: a row count above max_rows is recorded (KC_ERR_ROWS) and nothing written.
 *  - test_matmul_fp8 / test_matmul_fp8_bitwise: FP8 weights (path 4) vs the CPU kernel, and bitwise
 *    the f32-weight path over the dequantized weights (kern.h's contract), every bucket.
 *
 * Limits: those of the emulation (emu_cuda.h); the emulated mma sums each output in double and rounds
 * once, so a GPU may differ in the last bits (the invariance holds on both: an output element depends
 * only on its own operands); the cuBLASLt path (GS_CUDA_FAST_GEMM=1) is not emulated. */
#include "tests/emu/emu_optest.h"

static kern_pool *g_pool;

/* the cases: tests/opcases/opcases.c (shared with tests/gpu/test_cuda_ops.c) */
static void test_matmul(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_matmul, opcase_matmul, "matmul");
}

/* FP8 weights (path 4) vs the CPU kernel: tests/opcases/opcases.c */
static void test_matmul_fp8(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_matmul, opcase_matmul_fp8, "matmul fp8");
}

/* kern.h's FP8 contract on this backend: every output is bitwise the f32-weight op (path 2) over the
 * dequantized weights kern_fp8_raw(q) * (s * 2^120), for each live row count and bucket. A kernel that
 * took the scale of the wrong block, or of the wrong block row, fails here (the b0 / b1 blocks are
 * small and the scales all different). */
static void test_matmul_fp8_bitwise(void **state)
{
    (void)state;
    gpu_rng r = {38};
    const struct {
        int K, N, b0, b1;
    } shapes[] = {{100, 40, 16, 32}, {256, 30, 1, 128}, {48, 70, 8, 16}};
    const int Ms[][2] = {{1, 1}, {8, 5}, {40, 40}, {64, 33}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int K = shapes[si].K, N = shapes[si].N, b0 = shapes[si].b0, b1 = shapes[si].b1;
        const size_t sc = (size_t)(K + b1 - 1) / (size_t)b1, sr = (size_t)(N + b0 - 1) / (size_t)b0;
        uint8_t *q = oc_fp8_codes(&r, (size_t)N * K);
        float *fs = oc_fp8_scales(&r, sr * sc), *wd = et_alloc((size_t)N * K * 4);
        for (int f = 0; f < N; f++)
            for (int k = 0; k < K; k++)
                wd[(size_t)f * K + k] = kern_fp8_raw(q[(size_t)f * K + k]) * (fs[(size_t)(f / b0) * sc + (size_t)(k / b1)] * 0x1p120f);
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi][0], n = Ms[mi][1];
            float *x = et_rand(&r, (size_t)M * K, 2.0f), *o8 = et_poison((size_t)M * N), *o32 = et_poison((size_t)M * N);
            int32_t nn = n;
            kern_op op = {.kind = KOP_MATMUL};
            op.buf[0] = (kern_buf){x, (size_t)M * K * 4};
            op.buf[3] = (kern_buf){o32, (size_t)M * N * 4};
            op.buf[4] = (kern_buf){&nn, 4};
            op.p[0] = K;
            op.p[1] = N;
            op.p[2] = M;
            op.buf[1] = (kern_buf){wd, (size_t)N * K * 4};
            op.p[3] = KERN_DT_F32;
            char msg[192];
            if (emu_kc_matmul(&op, NULL, ET_SEEDS[0], msg, sizeof msg) != 0) fail_msg("f32: %s", msg);
            op.buf[1] = (kern_buf){q, (size_t)N * K};
            op.buf[3] = (kern_buf){o8, (size_t)M * N * 4};
            op.buf[5] = (kern_buf){fs, sr * sc * 4};
            op.p[3] = KERN_DT_FP8;
            op.p[5] = b0;
            op.p[6] = b1;
            if (emu_kc_matmul(&op, NULL, ET_SEEDS[1], msg, sizeof msg) != 0) fail_msg("fp8: %s", msg);
            for (size_t i = 0; i < (size_t)M * N; i++)
                if (gpu_bits(o8[i]) != gpu_bits(o32[i]))
                    fail_msg("K %d N %d blocks %dx%d max_rows %d n %d: element %zu: fp8 %.9g, dequantized f32 %.9g", K,
                             N, b0, b1, M, n, i, (double)o8[i], (double)o32[i]);
            free(x), free(o8), free(o32);
        }
        free(q), free(fs), free(wd);
    }
}

/* ---- batch invariance ----------------------------------------------------------------------------------- */
#define MM_FIRST 8 /* rows whose results are compared across buckets (row 0 also with max_rows 1) */

typedef struct {
    int K, N, bf, bias, acc, xoff;
    const char *what;
} mm_shape;

typedef struct {
    void *w;
    float *bias, *xf, *initf;
} mm_data;

/* out[:M] (+)= x W^T + bias for live rows n (one schedule); x rows < MM_FIRST from d->xf, the rest
 * random, rows >= n NaN-poisoned. Returns the output (caller frees); rows past n must keep the poison. */
static float *mm_once(const mm_shape *s, const mm_data *d, int M, int n, gpu_rng *r, uint64_t seed)
{
    const size_t K = (size_t)s->K, N = (size_t)s->N;
    float *xbuf = et_poison((size_t)M * K + (size_t)s->xoff + 1), *x = xbuf + s->xoff;
    float *out = et_poison((size_t)M * N + 1);
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < K; k++) x[i * K + k] = i < MM_FIRST ? d->xf[i * K + k] : gpu_unif(r) * 3.0f;
    if (s->acc)
        for (int i = 0; i < n; i++)
            for (size_t f = 0; f < N; f++) out[i * N + f] = i < MM_FIRST ? d->initf[i * N + f] : gpu_unif(r);
    int32_t nn = n;
    kern_op op = {.kind = KOP_MATMUL};
    op.buf[0] = (kern_buf){x, (size_t)M * K * 4};
    op.buf[1] = (kern_buf){d->w, N * K * (s->bf ? 2 : 4)};
    op.buf[2] = (kern_buf){s->bias ? d->bias : NULL, s->bias ? N * 4 : 0};
    op.buf[3] = (kern_buf){out, (size_t)M * N * 4};
    op.buf[4] = (kern_buf){&nn, 4};
    op.p[0] = s->K;
    op.p[1] = s->N;
    op.p[2] = M;
    op.p[3] = s->bf ? KERN_DT_BF16 : KERN_DT_F32;
    op.p[4] = s->acc;
    char msg[192];
    if (emu_kc_matmul(&op, NULL, seed, msg, sizeof msg) != 0) fail_msg("%s: the kernel recorded %s", s->what, msg);
    for (size_t i = (size_t)n * N; i < (size_t)M * N; i++)
        if (gpu_bits(out[i]) != GPU_POISON_BITS)
            fail_msg("%s: max_rows %d n %d: element %zu past n written", s->what, M, n, i);
    free(xbuf);
    return out;
}

static void test_matmul_invariance(void **state)
{
    (void)state;
    gpu_rng r = {32};
    const mm_shape shapes[] = {
        {256, 40, 1, 1, 0, 0, "bf16 tensor-core, N % 16 != 0, bias"},
        {512, 24, 1, 0, 1, 0, "bf16 tensor-core, 16 chunks, accumulate"},
        {96, 16, 1, 1, 1, 0, "bf16 tensor-core, 3 chunks, bias, accumulate"},
        {100, 20, 1, 1, 0, 0, "bf16 CUDA-core (K % 32 != 0)"},
        {128, 20, 1, 0, 1, 1, "bf16 CUDA-core (x misaligned), accumulate"},
        {64, 30, 0, 1, 1, 0, "f32 CUDA-core, bias, accumulate"},
    };
    const int Ms[] = {1, 8, 16, 40, 64};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const mm_shape *s = &shapes[si];
        const size_t K = (size_t)s->K, N = (size_t)s->N;
        mm_data d;
        d.w = et_weights(&r, s->bf, N * K, 0.5f);
        d.bias = et_rand(&r, N, 1.0f);
        d.xf = et_rand(&r, MM_FIRST * K, 3.0f);
        d.initf = et_rand(&r, MM_FIRST * N, 1.0f);
        float *ref = et_alloc(MM_FIRST * N * 4);
        int have = 0, run = 0; /* rows of ref set */
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi];
            const int ns[2] = {M, M > MM_FIRST + 1 ? MM_FIRST + 1 + (int)mi : M - 1};
            for (int ni = 0; ni < 2; ni++) {
                const int n = ns[ni];
                if (n <= 0) continue;
                float *got = mm_once(s, &d, M, n, &r, ET_SEEDS[run++ & 1]);
                const int cmp = n < MM_FIRST ? n : MM_FIRST;
                for (int i = 0; i < cmp; i++) {
                    if (i >= have) {
                        memcpy(ref + (size_t)i * N, got + (size_t)i * N, N * 4);
                        have = i + 1;
                        continue;
                    }
                    for (size_t f = 0; f < N; f++)
                        if (gpu_bits(ref[i * N + f]) != gpu_bits(got[i * N + f]))
                            fail_msg("%s: row %d feature %zu differs with max_rows %d, n %d: %.9g vs %.9g", s->what, i,
                                     f, M, n, (double)ref[i * N + f], (double)got[i * N + f]);
                }
                free(got);
            }
        }
        assert_int_equal(have, MM_FIRST);
        /* and right: a double reference */
        for (int i = 0; i < MM_FIRST; i++)
            for (size_t f = 0; f < N; f++) {
                double acc = 0;
                for (size_t k = 0; k < K; k++) {
                    const double wv = s->bf ? (double)kern_bf16_to_f32(((const uint16_t *)d.w)[f * K + k])
                                            : (double)((const float *)d.w)[f * K + k];
                    acc += (double)d.xf[i * K + k] * wv;
                }
                if (s->bias) acc += d.bias[f];
                if (s->acc) acc += d.initf[i * N + f];
                const double g = ref[i * N + f];
                /* the tensor-core kernel keeps ~16 significant bits of x (bf16 hi + lo) */
                const double rtol = s->bf && s->K % 32 == 0 && !s->xoff ? 2e-5 : 2e-6;
                if (!(fabs(g - acc) <= rtol * (1.0 + fabs(acc)) * sqrt((double)K)))
                    fail_msg("%s: row %d feature %zu: %.9g, reference %.9g", s->what, i, f, g, acc);
            }
        free(ref);
        free(d.w);
        free(d.bias);
        free(d.xf);
        free(d.initf);
    }
}

/* n_rows > max_rows: recorded by block 0, every block returns, nothing written (both paths) */
static void test_matmul_rows_check(void **state)
{
    (void)state;
    gpu_rng r = {33};
    for (int bf = 0; bf < 2; bf++) {
        const int K = 64, N = 24, M = 8;
        et_case t;
        et_init(&t, KOP_MATMUL);
        et_buf(&t, 0, et_rand(&r, (size_t)M * K, 1.0f), (size_t)M * K * 4, ET_IN);
        et_buf(&t, 1, et_weights(&r, bf, (size_t)N * K, 0.5f), (size_t)N * K * (bf ? 2 : 4), ET_IN);
        et_buf(&t, 3, et_poison((size_t)M * N), (size_t)M * N * 4, ET_OUT_F32);
        et_buf(&t, 4, et_i32(1, M + 1), 4, ET_IN);
        t.op.p[0] = K;
        t.op.p[1] = N;
        t.op.p[2] = M;
        t.op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        void *outs[ET_SLOTS] = {0};
        et_expect_error(&t, emu_kc_matmul, "KC_ERR_ROWS", bf ? "matmul bf16 rows" : "matmul f32 rows", outs);
        const float *o = outs[3];
        for (int i = 0; i < M * N; i++) assert_int_equal(gpu_bits(o[i]), GPU_POISON_BITS);
        for (int s = 0; s < ET_SLOTS; s++) free(outs[s]);
    }
}

int main(void)
{
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_fp8),
        cmocka_unit_test(test_matmul_fp8_bitwise),
        cmocka_unit_test(test_matmul_invariance),
        cmocka_unit_test(test_matmul_rows_check),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    return rc;
}
