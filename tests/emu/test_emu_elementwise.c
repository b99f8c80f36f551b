/* tests/emu/test_emu_elementwise.c — kernels/cuda/elementwise.cu (KOP_EMBED, KOP_GATHER_ROWS,
 * KOP_COPY_COLS, KOP_SILU_MUL, KOP_ADD), the real CUDA source, run on the CPU emulation of the CUDA
 * primitives (tests/emu/emu_cuda.h) against the CPU kernels (kern_cpu_exec).
 *
 * Why: CI has no GPU; this runs the row kernels' early exits and the grid-stride kernels' vectorized
 * (float4) and scalar paths, whose choice depends on the width and the buffers' alignment, on every CI
 * run. The emulated context has 2 SMs (grids of at most 16 blocks), so every thread strides.
 *
 * Cases: embed f32 / bf16 tables (padding ids out of range must not be read); gather with repeated and
 * boundary indices; copy_cols into a column block of a wider row; silu_mul with I % 4 == 0 (float4) and
 * not, and with a misaligned output (scalar path); add out of place, in place (y == x), H % 4 != 0 and a
 * misaligned x (x rows past n finite, so a write there shows); zero live rows. Copies and add bitwise
 * equal to the CPU, silu_mul within 1e-6 (glibc expf on both sides, in the same expression: in practice
 * bitwise too); rows past n keep their contents; two schedules agree. Then the data-dependent checks: a
 * token id / gather index out of range is recorded (KC_ERR_*) and the row skipped, the other rows
 * written.
 *
 * Limits: those of the emulation (emu_cuda.h): glibc's expf (CUDA's may differ by an ulp). */
#include "tests/emu/emu_optest.h"

static kern_pool *g_pool;

static void test_embed(void **state)
{
    (void)state;
    gpu_rng r = {61};
    for (int bf = 0; bf < 2; bf++) {
        const int H = bf ? 300 : 96, V = 50, max_rows = 8, n = 5;
        et_case t;
        et_init(&t, KOP_EMBED);
        int32_t *ids = et_i32(max_rows, -999); /* padding ids out of range: must not be read */
        for (int i = 0; i < n; i++) ids[i] = gpu_int(&r, 0, V - 1);
        ids[1] = V - 1;
        ids[2] = 0;
        et_buf(&t, 0, ids, max_rows * 4, ET_IN);
        et_buf(&t, 1, et_weights(&r, bf, (size_t)V * H, 1.0f), (size_t)V * H * (bf ? 2 : 4), ET_IN);
        et_buf(&t, 2, et_poison((size_t)max_rows * H), (size_t)max_rows * H * 4, ET_OUT_F32);
        et_buf(&t, 3, et_i32(1, n), 4, ET_IN);
        t.op.p[0] = H;
        t.op.p[1] = V;
        t.op.p[2] = max_rows;
        t.op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        t.exact[2] = 1;
        assert_int_equal(et_run(g_pool, &t, emu_kc_embed, bf ? "embed bf16" : "embed f32"), 0);
    }
}

static void test_gather_copy_cols(void **state)
{
    (void)state;
    gpu_rng r = {62};
    {
        const int H = 300, x_rows = 9, max_out = 5, n = 4;
        et_case t;
        et_init(&t, KOP_GATHER_ROWS);
        et_buf(&t, 0, et_rand(&r, (size_t)x_rows * H, 1.0f), (size_t)x_rows * H * 4, ET_IN);
        int32_t *idx = et_i32(max_out, 1000);
        idx[0] = 8;
        idx[1] = 0;
        idx[2] = 8;
        idx[3] = 4;
        et_buf(&t, 1, idx, max_out * 4, ET_IN);
        et_buf(&t, 2, et_poison((size_t)max_out * H), (size_t)max_out * H * 4, ET_OUT_F32);
        et_buf(&t, 3, et_i32(1, n), 4, ET_IN);
        t.op.p[0] = H;
        t.op.p[1] = x_rows;
        t.op.p[2] = max_out;
        t.exact[2] = 1;
        assert_int_equal(et_run(g_pool, &t, emu_kc_gather_rows, "gather_rows"), 0);
    }
    for (int blk = 0; blk < 3; blk++) {
        const int H = 40, k = 3, stride = k * H + 4, max_rows = 6, n = 4;
        et_case t;
        et_init(&t, KOP_COPY_COLS);
        et_buf(&t, 0, et_rows(&r, max_rows, H, n, 1.0f), (size_t)max_rows * H * 4, ET_IN);
        et_buf(&t, 1, et_poison((size_t)max_rows * stride), (size_t)max_rows * stride * 4, ET_OUT_F32);
        et_buf(&t, 2, et_i32(1, n), 4, ET_IN);
        t.op.p[0] = H;
        t.op.p[1] = stride;
        t.op.p[2] = blk * H + (blk == 2 ? 4 : 0); /* the last block ends at the row's end */
        t.op.p[3] = max_rows;
        t.exact[1] = 1;
        assert_int_equal(et_run(g_pool, &t, emu_kc_copy_cols, "copy_cols"), 0);
    }
}

static void test_silu_mul(void **state)
{
    (void)state;
    gpu_rng r = {63};
    const struct {
        int I, max_rows, n, out_off; /* out_off: out starts out_off floats into its buffer */
        const char *what;
    } cases[] = {{100, 7, 5, 0, "float4"}, {256, 9, 9, 0, "float4, every row"}, {37, 7, 6, 0, "I % 4 != 0"},
                 {64, 5, 3, 1, "misaligned out"}, {300, 40, 33, 0, "grid-stride over many rows"},
                 {64, 4, 0, 0, "zero rows"}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int I = cases[ci].I, M = cases[ci].max_rows, n = cases[ci].n, oo = cases[ci].out_off;
        et_case t;
        et_init(&t, KOP_SILU_MUL);
        float *gu = et_rows(&r, M, 2 * (size_t)I, n, 6.0f);
        gu[0] = -100.0f; /* expf(100) overflows: silu -> -0 */
        gu[1] = 100.0f;
        et_buf(&t, 0, gu, (size_t)M * 2 * I * 4, ET_IN);
        et_buf(&t, ET_EXTRA, et_poison((size_t)M * I + (size_t)oo), ((size_t)M * I + (size_t)oo) * 4, ET_OUT_F32);
        et_view(&t, 1, ET_EXTRA, (size_t)oo * 4, (size_t)M * I * 4);
        et_buf(&t, 2, et_i32(1, n), 4, ET_IN);
        t.op.p[0] = I;
        t.op.p[1] = M;
        t.rtol = 1e-6;
        char name[96];
        snprintf(name, sizeof name, "silu_mul I %d: %s", I, cases[ci].what);
        assert_int_equal(et_run(g_pool, &t, emu_kc_silu_mul, name), 0);
    }
}

static void test_add(void **state)
{
    (void)state;
    gpu_rng r = {64};
    const struct {
        int H, max_rows, n, same, x_off;
        const char *what;
    } cases[] = {{256, 6, 4, 0, 0, "float4"}, {256, 6, 4, 1, 0, "float4, y == x"}, {101, 6, 4, 0, 0, "H % 4 != 0"},
                 {101, 6, 5, 1, 0, "H % 4 != 0, y == x"}, {128, 5, 3, 0, 1, "misaligned x"},
                 {512, 40, 37, 0, 0, "grid-stride over many rows"}, {256, 4, 0, 0, 0, "zero rows"}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int H = cases[ci].H, M = cases[ci].max_rows, n = cases[ci].n, xo = cases[ci].x_off;
        et_case t;
        et_init(&t, KOP_ADD);
        const size_t xb = (size_t)M * H * 4;
        /* x past n finite (x + anything there would change it; poison + poison would stay poison), y past
         * n poisoned (a live row reading it turns NaN) */
        et_buf(&t, ET_EXTRA, et_rand(&r, (size_t)M * H + (size_t)xo, 1.0f), xb + (size_t)xo * 4, ET_OUT_F32);
        et_view(&t, 0, ET_EXTRA, (size_t)xo * 4, xb);
        if (cases[ci].same) et_view(&t, 1, ET_EXTRA, (size_t)xo * 4, xb);
        else et_buf(&t, 1, et_rows(&r, M, H, n, 1.0f), xb, ET_IN);
        et_buf(&t, 2, et_i32(1, n), 4, ET_IN);
        t.op.p[0] = H;
        t.op.p[1] = M;
        t.exact[ET_EXTRA] = 1;
        char name[96];
        snprintf(name, sizeof name, "add H %d: %s", H, cases[ci].what);
        assert_int_equal(et_run(g_pool, &t, emu_kc_add, name), 0);
    }
}

/* the data-dependent checks (the CPU aborts on them): recorded, the row skipped, the others written */
static void test_data_checks(void **state)
{
    (void)state;
    gpu_rng r = {65};
    {
        const int H = 40, V = 10, max_rows = 3;
        et_case t;
        et_init(&t, KOP_EMBED);
        int32_t *ids = et_i32(max_rows, 2);
        ids[1] = V;
        et_buf(&t, 0, ids, max_rows * 4, ET_IN);
        float *table = et_rand(&r, (size_t)V * H, 1.0f);
        et_buf(&t, 1, table, (size_t)V * H * 4, ET_IN);
        et_buf(&t, 2, et_poison((size_t)max_rows * H), (size_t)max_rows * H * 4, ET_OUT_F32);
        et_buf(&t, 3, et_i32(1, max_rows), 4, ET_IN);
        t.op.p[0] = H;
        t.op.p[1] = V;
        t.op.p[2] = max_rows;
        t.op.p[3] = KERN_DT_F32;
        void *outs[ET_SLOTS] = {0};
        et_expect_error(&t, emu_kc_embed, "KC_ERR_TOKEN", "embed id V", outs);
        const float *o = outs[2], *tb = outs[1];
        for (int i = 0; i < H; i++) {
            assert_int_equal(gpu_bits(o[i]), gpu_bits(tb[2 * H + i]));
            assert_int_equal(gpu_bits(o[H + i]), GPU_POISON_BITS);
            assert_int_equal(gpu_bits(o[2 * H + i]), gpu_bits(tb[2 * H + i]));
        }
        for (int s = 0; s < ET_SLOTS; s++) free(outs[s]);
    }
    {
        const int H = 40, x_rows = 4, max_out = 3;
        et_case t;
        et_init(&t, KOP_GATHER_ROWS);
        et_buf(&t, 0, et_rand(&r, (size_t)x_rows * H, 1.0f), (size_t)x_rows * H * 4, ET_IN);
        int32_t *idx = et_i32(max_out, 1);
        idx[2] = -1;
        et_buf(&t, 1, idx, max_out * 4, ET_IN);
        et_buf(&t, 2, et_poison((size_t)max_out * H), (size_t)max_out * H * 4, ET_OUT_F32);
        et_buf(&t, 3, et_i32(1, max_out), 4, ET_IN);
        t.op.p[0] = H;
        t.op.p[1] = x_rows;
        t.op.p[2] = max_out;
        void *outs[ET_SLOTS] = {0};
        et_expect_error(&t, emu_kc_gather_rows, "KC_ERR_INDEX", "gather index -1", outs);
        const float *o = outs[2], *x = outs[0];
        for (int i = 0; i < H; i++) {
            assert_int_equal(gpu_bits(o[H + i]), gpu_bits(x[H + i]));
            assert_int_equal(gpu_bits(o[2 * H + i]), GPU_POISON_BITS);
        }
        for (int s = 0; s < ET_SLOTS; s++) free(outs[s]);
    }
}

int main(void)
{
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_gather_copy_cols),
        cmocka_unit_test(test_silu_mul),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_data_checks),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    return rc;
}
