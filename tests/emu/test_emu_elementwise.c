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

/* the cases: tests/opcases/opcases.c (shared with tests/gpu/test_cuda_ops.c) */
static void test_embed(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_embed, opcase_embed, "embed");
}

static void test_gather_copy_cols(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_gather_rows, opcase_gather_rows, "gather_rows");
    et_cases(g_pool, emu_kc_copy_cols, opcase_copy_cols, "copy_cols");
}

static void test_silu_mul(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_silu_mul, opcase_silu_mul, "silu_mul");
}

static void test_add(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_add, opcase_add, "add");
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
