/* tests/unit/test_fp8.c — FP8 weights in KOP_MATMUL (wdt KERN_DT_FP8, kernels/kern.h): float8_e4m3fn
 * codes with block scales S [ceil(N / b0), ceil(K / b1)], as block-FP8 checkpoints (Qwen3-FP8,
 * DeepSeek-V3) store weight and weight_scale_inv.
 *   - test_decode: kern_fp8_to_f32 against an independent decoder written from the OCP FP8 spec
 *     (sign, 4-bit exponent with bias 7, 3-bit mantissa, subnormals at exponent 0; 0x7e = 448 the
 *     largest finite value; 0x7f / 0xff the NaN codes, flagged by kern_fp8_is_nan).
 *   - test_matmul_equals_dequantized: on every ISA this CPU runs, with 1 and 2 threads, the FP8 op
 *     is bitwise the f32-weight op over the dequantized weights w = f32(q) * S[n / b0][k / b1] (the
 *     contract), for shapes with k tails (K % 16 != 0), partial scale blocks in both directions,
 *     b0 = 1 and 128, b1 = 16 .. 128, row counts 1 .. 70 (past the 64-row x block), bias and
 *     accumulate; and within 1e-5 of a float64 reference.
 *   - test_matmul_pairs: with the pool in a bf16-activation mode (pairs, and amx, which FP8 weights
 *     run in the pairs order too), on every ISA (the scalar and AVX2 / AVX-512 emulations and the
 *     native AVX512_BF16 vdpbf16ps where the CPU has it), 1 and 2 threads, the same shapes and row
 *     counts: the FP8 op is bitwise the bf16-pairs op over the bf16 weights
 *     kern_f32_to_bf16_daz(f32(q) * S) (kern.h); within 1e-5 of float64 over those bf16 values
 *     and bf16-rounded activations; and not the f32-activation result (the mode is not ignored).
 *   - test_row_invariance: a row's outputs with 1 live row and among 37 are bitwise the same.
 *   - test_validate: b1 not a power of two or below 16, b0 0, a scale buffer one float short, and
 *     FP8 as an embedding dtype are malformed ops (FP8 experts: test_moe).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/kern_cpu.h"
#include "kernels/kern.h"

#define TEST_RNG_SEED 0x13198a2e03707344ull
#include "test_kern_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* OCP 8-bit floating point spec, E4M3: value = (-1)^s * 2^(e - 7) * (1 + m / 8), e > 0;
 * (-1)^s * 2^-6 * (m / 8), e == 0; S.1111.111 is NaN (no infinities) */
static double spec_e4m3(uint8_t q)
{
    const int s = q >> 7, e = (q >> 3) & 15, m = q & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

static void test_decode(void **state)
{
    (void)state;
    for (int q = 0; q < 256; q++) {
        if ((q & 0x7f) == 0x7f) {
            assert_true(kern_fp8_is_nan((uint8_t)q));
            continue;
        }
        assert_false(kern_fp8_is_nan((uint8_t)q));
        const float f = kern_fp8_to_f32((uint8_t)q);
        if ((double)f != spec_e4m3((uint8_t)q)) fail_msg("code 0x%02x: %.9g, spec %.9g", q, (double)f, spec_e4m3((uint8_t)q));
        assert_int_equal(signbit(f) != 0, q >= 0x80); /* 0x80 is -0 */
    }
    for (int q = 0; q < 256; q++) /* the kernels' form: raw bits times 2^120 */
        if (!kern_fp8_is_nan((uint8_t)q)) assert_int_equal(fbits(kern_fp8_raw((uint8_t)q) * 0x1p120f), fbits(kern_fp8_to_f32((uint8_t)q)));
    assert_true(kern_fp8_to_f32(0x7e) == 448.0f);
    assert_true(kern_fp8_to_f32(0x01) == 0x1p-9f);
    assert_true(kern_fp8_to_f32(0x08) == 0x1p-6f);
}

typedef struct {
    int K, N, b0, b1, wide;
} shape;

typedef struct {
    uint8_t *q;   /* [N, K] */
    float *s;     /* [ceil(N / b0), ceil(K / b1)] */
    float *deq;   /* [N, K] = f32(q) * s, one rounded multiply */
    float *bias;  /* [N] */
    int sk;
} fp8w;

static void fp8w_init(fp8w *w, const shape *sh)
{
    const int K = sh->K, N = sh->N, sr = (N + sh->b0 - 1) / sh->b0;
    w->sk = (K + sh->b1 - 1) / sh->b1;
    w->q = xalloc((size_t)N * K);
    w->s = xalloc((size_t)sr * w->sk * 4);
    w->deq = xalloc((size_t)N * K * 4);
    w->bias = xalloc((size_t)N * 4);
    fill(w->bias, (size_t)N, -1, 1);
    for (int i = 0; i < sr * w->sk; i++) w->s[i] = rnd_f(0.5f, 2.0f) * 0x1p-6f; /* checkpoint-like scales */
    if (sh->wide) /* the whole range: f32-subnormal products, scales just below KERN_FP8_SCALE_MAX */
        for (int i = 0; i < sr * w->sk; i++) w->s[i] = i % 3 == 0 ? 0x1.fffffep7f : i % 3 == 1 ? 0x1p-140f : rnd_f(1e-30f, 1.0f);
    for (size_t i = 0; i < (size_t)N * K; i++) {
        uint8_t c;
        do c = (uint8_t)rnd_u64();
        while (kern_fp8_is_nan(c));
        w->q[i] = c;
    }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            w->deq[(size_t)n * K + k] = kern_fp8_to_f32(w->q[(size_t)n * K + k]) * w->s[(n / sh->b0) * w->sk + k / sh->b1];
}

static void fp8w_free(fp8w *w)
{
    free(w->q);
    free(w->s);
    free(w->deq);
    free(w->bias);
}

/* out (+)= x W^T (+ bias) for n live rows of max_rows M; fp8: W as codes + scales, 2: W as wb16 (bf16),
 * else w->deq */
static void run_mm_w(kern_pool *pool, const shape *sh, const fp8w *w, int fp8, const float *x, float *out, int M,
                     int n, int bias, int acc, const uint16_t *wb16)
{
    const int K = sh->K, N = sh->N;
    int32_t nr = n;
    kern_op op = {.kind = KOP_MATMUL};
    op.buf[0] = B((void *)x, (size_t)M * K * 4);
    op.buf[1] = fp8 == 1 ? B(w->q, (size_t)N * K) : fp8 == 2 ? B((void *)wb16, (size_t)N * K * 2) : B(w->deq, (size_t)N * K * 4);
    op.buf[2] = bias ? B(w->bias, (size_t)N * 4) : B(NULL, 0);
    op.buf[3] = B(out, (size_t)M * N * 4);
    op.buf[4] = B(&nr, 4);
    op.p[0] = K, op.p[1] = N, op.p[2] = M, op.p[3] = fp8 == 1 ? KERN_DT_FP8 : fp8 == 2 ? KERN_DT_BF16 : KERN_DT_F32;
    op.p[4] = acc;
    if (fp8 == 1) {
        op.buf[5] = B(w->s, (size_t)((N + sh->b0 - 1) / sh->b0) * w->sk * 4);
        op.p[5] = sh->b0, op.p[6] = sh->b1;
    }
    char why[160];
    if (kern_validate(&op, why, sizeof why) != 0) fail_msg("malformed: %s", why);
    kern_cpu_exec(pool, &op);
}
static void run_mm(kern_pool *pool, const shape *sh, const fp8w *w, int fp8, const float *x, float *out, int M, int n,
                   int bias, int acc)
{
    run_mm_w(pool, sh, w, fp8, x, out, M, n, bias, acc, NULL);
}

/* k tails (K % 16, K % 32), partial scale blocks both ways, b1 16 (two scale blocks per 32-k step of
 * the pairs order) .. 128, b0 1 .. 128 */
static const shape shapes[] = {
    {128, 96, 128, 128, 0}, /* one scale block */
    {256, 200, 128, 128, 0}, /* partial row block, 2 k blocks */
    {160, 50, 16, 32, 0}, /* partial k block (160 = 5 x 32), row blocks of 16 */
    {40, 30, 1, 16, 0}, /* K % 16 = 8: the tail, a scale per row */
    {200, 70, 7, 64, 0}, /* b0 7, K 200 = 3 blocks of 64 + 8 */
    {1024, 24, 128, 128, 0}, /* long rows */
    {96, 40, 4, 16, 1},   /* scales over the whole range (the vs-float64 check is skipped) */
    {112, 20, 16, 16, 0}, /* b1 16 with K % 32 = 16: the pairs order's tail is a whole scale block */
    {24, 10, 1, 16, 0},   /* K below one 32-k step: every k in the tails */
};
static const int Ms[] = {1, 3, 5, 17, 70};

static void test_matmul_pairs(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list_of(isas, 1);
    kern_pool *pools[2] = {kern_pool_create(1), kern_pool_create(2)};
    const size_t old = kern_cpu_set_min_parallel_work(0);
    long checked = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *sh = &shapes[si];
        const int K = sh->K, N = sh->N;
        fp8w w;
        fp8w_init(&w, sh);
        uint16_t *wb = xalloc((size_t)N * K * 2);
        for (size_t i = 0; i < (size_t)N * K; i++) wb[i] = kern_f32_to_bf16_daz(w.deq[i]);
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi], bias = (int)(mi & 1), acc = mi == 2 || mi == 4;
            float *x = xalloc((size_t)M * K * 4), *init = xalloc((size_t)M * N * 4);
            fill(x, (size_t)M * K, -2, 2);
            fill(init, (size_t)M * N, -1, 1);
            float *ref = xalloc((size_t)M * N * 4), *got = xalloc((size_t)M * N * 4), *f32a = xalloc((size_t)M * N * 4);
            assert_int_equal(kern_simd_force(KERN_ISA_SCALAR), 0);
            kern_pool_set_bf16_activations(pools[0], KERN_BF16_ACT_PAIRS);
            memcpy(ref, init, (size_t)M * N * 4);
            run_mm_w(pools[0], sh, &w, 2, x, ref, M, M, bias, acc, wb); /* bf16 pairs over the rounded weights */
            kern_pool_set_bf16_activations(pools[0], KERN_BF16_ACT_OFF);
            memcpy(f32a, init, (size_t)M * N * 4);
            run_mm(pools[0], sh, &w, 1, x, f32a, M, M, bias, acc);
            if (!sh->wide) assert_true(memcmp(ref, f32a, (size_t)M * N * 4) != 0);
            for (int ii = 0; ii < nisa; ii++)
                for (int t = 0; t < 2; t++)
                    for (int mode = KERN_BF16_ACT_PAIRS; mode <= KERN_BF16_ACT_AMX; mode++) {
                        assert_int_equal(kern_simd_force(isas[ii]), 0);
                        kern_pool_set_bf16_activations(pools[t], mode);
                        memcpy(got, init, (size_t)M * N * 4);
                        run_mm(pools[t], sh, &w, 1, x, got, M, M, bias, acc);
                        for (size_t i = 0; i < (size_t)M * N; i++)
                            if (fbits(got[i]) != fbits(ref[i]))
                                fail_msg("K %d N %d b %dx%d M %d isa %d threads %d mode %d: out[%zu] %.9g, bf16 pairs "
                                         "over the bf16-rounded dequantized weights %.9g",
                                         K, N, sh->b0, sh->b1, M, (int)isas[ii], t + 1, mode, i, (double)got[i],
                                         (double)ref[i]);
                        checked += (long)M * N;
                        kern_pool_set_bf16_activations(pools[t], KERN_BF16_ACT_OFF);
                    }
            for (int r = 0; r < M && !sh->wide; r++) /* and right: float64 over the bf16 values */
                for (int n = 0; n < N; n++) {
                    double d = acc ? init[(size_t)r * N + n] : 0.0, mag = fabs(d);
                    for (int k = 0; k < K; k++) {
                        const double t = (double)kern_bf16_to_f32(kern_f32_to_bf16_daz(x[(size_t)r * K + k])) *
                                         (double)kern_bf16_to_f32(wb[(size_t)n * K + k]);
                        d += t;
                        mag += fabs(t);
                    }
                    if (bias) d += w.bias[n], mag += fabs(w.bias[n]);
                    if (!(fabs(ref[(size_t)r * N + n] - d) <= 1e-5 * mag + 1e-30))
                        fail_msg("K %d N %d M %d: out[%d, %d] %.9g, float64 %.9g", K, N, M, r, n,
                                 (double)ref[(size_t)r * N + n], d);
                }
            free(x), free(init), free(ref), free(got), free(f32a);
        }
        free(wb);
        fp8w_free(&w);
    }
    print_message("FP8 in bf16 pairs: %ld outputs bitwise over %d ISA(s)\n", checked, nisa);
    kern_cpu_set_min_parallel_work(old);
    kern_simd_force(isas[nisa - 1]);
    kern_pool_destroy(pools[0]);
    kern_pool_destroy(pools[1]);
}

static void test_matmul_equals_dequantized(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list_of(isas, 1);
    kern_pool *p2 = kern_pool_create(2);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *sh = &shapes[si];
        const int K = sh->K, N = sh->N;
        fp8w w;
        fp8w_init(&w, sh);
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi], bias = (int)(mi & 1), acc = mi == 2 || mi == 4;
            float *x = xalloc((size_t)M * K * 4), *init = xalloc((size_t)M * N * 4);
            fill(x, (size_t)M * K, -2, 2);
            fill(init, (size_t)M * N, -1, 1);
            float *ref = xalloc((size_t)M * N * 4), *got = xalloc((size_t)M * N * 4);
            assert_int_equal(kern_simd_force(KERN_ISA_SCALAR), 0);
            memcpy(ref, init, (size_t)M * N * 4);
            run_mm(NULL, sh, &w, 0, x, ref, M, M, bias, acc); /* f32 weights, scalar ISA */
            for (int ii = 0; ii < nisa; ii++)
                for (int threads = 1; threads <= 2; threads++) {
                    assert_int_equal(kern_simd_force(isas[ii]), 0);
                    memcpy(got, init, (size_t)M * N * 4);
                    /* with a pool's scratch, from the ISA's mm_cl_rows_fp8 rows (AVX2 16, AVX-512 40:
                     * M 70) the column-lane GEMM runs, and must give the same bits */
                    const int cl = threads == 2 && kern_cpu_mm_cl_rows(1) && M >= kern_cpu_mm_cl_rows(1);
                    const long cl0 = kern_cpu_mm_cl_ops();
                    run_mm(threads == 2 ? p2 : NULL, sh, &w, 1, x, got, M, M, bias, acc);
                    assert_int_equal(kern_cpu_mm_cl_ops(), cl0 + cl);
                    for (size_t i = 0; i < (size_t)M * N; i++)
                        if (fbits(got[i]) != fbits(ref[i]))
                            fail_msg("K %d N %d b %dx%d M %d isa %d threads %d: out[%zu] %.9g, f32 over the "
                                     "dequantized weights %.9g",
                                     K, N, sh->b0, sh->b1, M, (int)isas[ii], threads, i, (double)got[i], (double)ref[i]);
                }
            /* and right: float64 */
            for (int r = 0; r < M && !sh->wide; r++)
                for (int n = 0; n < N; n++) {
                    double d = acc ? init[(size_t)r * N + n] : 0.0, mag = fabs(d);
                    for (int k = 0; k < K; k++) {
                        const double t = (double)x[(size_t)r * K + k] * spec_e4m3(w.q[(size_t)n * K + k]) *
                                         (double)w.s[(n / sh->b0) * w.sk + k / sh->b1];
                        d += t;
                        mag += fabs(t);
                    }
                    if (bias) d += w.bias[n], mag += fabs(w.bias[n]);
                    const double g = ref[(size_t)r * N + n];
                    if (!(fabs(g - d) <= 1e-5 * mag + 1e-30))
                        fail_msg("K %d N %d M %d: out[%d, %d] %.9g, float64 %.9g", K, N, M, r, n, g, d);
                }
            free(x), free(init), free(ref), free(got);
        }
        fp8w_free(&w);
    }
    kern_simd_force(isas[nisa - 1]);
    kern_pool_destroy(p2);
}

static void test_row_invariance(void **state)
{
    (void)state;
    const shape sh = {256, 100, 128, 128, 0};
    fp8w w;
    fp8w_init(&w, &sh);
    const int M = 37;
    float *x = xalloc((size_t)M * sh.K * 4), *one = xalloc((size_t)sh.N * 4), *all = xalloc((size_t)M * sh.N * 4);
    fill(x, (size_t)M * sh.K, -1, 1);
    run_mm(NULL, &sh, &w, 1, x, one, 1, 1, 1, 0);
    run_mm(NULL, &sh, &w, 1, x, all, M, M, 1, 0);
    for (int n = 0; n < sh.N; n++) assert_int_equal(fbits(one[n]), fbits(all[n]));
    free(x), free(one), free(all);
    fp8w_free(&w);
}

static void test_validate(void **state)
{
    (void)state;
    uint8_t q[64 * 32];
    float s[8], x[32], out[64];
    int32_t nr = 1;
    kern_op op = {.kind = KOP_MATMUL};
    op.buf[0] = B(x, sizeof x);
    op.buf[1] = B(q, sizeof q);
    op.buf[3] = B(out, sizeof out);
    op.buf[4] = B(&nr, 4);
    op.buf[5] = B(s, 4 * 2 * 2); /* [ceil(64 / 32), ceil(32 / 16)] */
    op.p[0] = 32, op.p[1] = 64, op.p[2] = 1, op.p[3] = KERN_DT_FP8, op.p[5] = 32, op.p[6] = 16;
    char why[160];
    assert_int_equal(kern_validate(&op, why, sizeof why), 0);
    op.p[6] = 24; /* not a power of two */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[6] = 8; /* below 16 */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[6] = 16, op.p[5] = 0;
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[5] = 32, op.buf[5] = B(s, 4 * 3); /* one scale short */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.buf[5] = B(NULL, 0);
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    /* FP8 is a matmul weight dtype only */
    float table[4 * 8];
    int32_t ids[1] = {0};
    kern_op e = {.kind = KOP_EMBED};
    e.buf[0] = B(ids, 4), e.buf[1] = B(table, sizeof table), e.buf[2] = B(out, 8 * 4), e.buf[3] = B(&nr, 4);
    e.p[0] = 8, e.p[1] = 4, e.p[2] = 1, e.p[3] = KERN_DT_FP8;
    assert_int_equal(kern_validate(&e, why, sizeof why), -1);
    e.p[3] = KERN_DT_F32;
    if (kern_validate(&e, why, sizeof why) != 0) fail_msg("f32 embed: %s", why);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_matmul_equals_dequantized),
        cmocka_unit_test(test_matmul_pairs),
        cmocka_unit_test(test_row_invariance),
        cmocka_unit_test(test_validate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
