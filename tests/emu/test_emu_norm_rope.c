/* tests/emu/test_emu_norm_rope.c — kernels/cuda/norm_rope.cu (KOP_RMSNORM, KOP_QK_NORM_ROPE), the real
 * CUDA source, run on the CPU emulation of the CUDA primitives (tests/emu/emu_cuda.h) against the CPU
 * kernels (kern_cpu_exec).
 *
 * Why: CI has no GPU; this runs the block sum of squares (fixed order through shared memory), the
 * register-resident row with its re-read tail (rows longer than 4096), the in-place aliasing rules, the
 * per-(row, head) warps of qk_norm_rope with and without norms, q heads and k heads, keys-only ops on a
 * view that starts inside each row, on every CI run.
 *
 * Cases: rmsnorm H 100 / 1024 / 4096 + 96 (the tail), out of place and in place; qk_norm_rope with both
 * norms, without norms (exact rope), only a k norm, hd 16 / 64 / 128 / 256, row strides with extra
 * columns (untouched), and keys only (nh 0) on a view. Within 1e-5 of the largest |output| of the CPU
 * (the sums of squares are added in another order; glibc's sincosf on both sides), rows past n and columns
 * outside the heads keep their contents (poison past n), two schedules agree bitwise.
 *
 * Limits: those of the emulation (emu_cuda.h): glibc's sqrtf / sincosf (a GPU's sincosf differs by an
 * ulp or two of a large angle; tests/gpu/test_cuda_ops.c allows for it). */
#include "tests/emu/emu_optest.h"

static kern_pool *g_pool;

/* the cases: tests/opcases/opcases.c (shared with tests/gpu/test_cuda_ops.c) */
static void test_rmsnorm(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_rmsnorm, opcase_rmsnorm, "rmsnorm");
}

static void test_qk_norm_rope(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_qk_norm_rope, opcase_qk_norm_rope, "qk_norm_rope");
}

/* n_rows > max_rows: recorded, nothing written */
static void test_rows_check(void **state)
{
    (void)state;
    gpu_rng r = {53};
    const int H = 64, max_rows = 3;
    et_case t;
    et_init(&t, KOP_RMSNORM);
    et_buf(&t, 0, et_rand(&r, (size_t)max_rows * H, 1.0f), (size_t)max_rows * H * 4, ET_IN);
    et_buf(&t, 1, et_near1(&r, H), (size_t)H * 4, ET_IN);
    et_buf(&t, 2, et_poison((size_t)max_rows * H), (size_t)max_rows * H * 4, ET_OUT_F32);
    et_buf(&t, 3, et_i32(1, -1), 4, ET_IN);
    t.op.p[0] = H;
    t.op.p[1] = max_rows;
    t.op.f[0] = 1e-6f;
    void *outs[ET_SLOTS] = {0};
    et_expect_error(&t, emu_kc_rmsnorm, "KC_ERR_ROWS", "rmsnorm n -1", outs);
    for (int i = 0; i < max_rows * H; i++) assert_int_equal(gpu_bits(((const float *)outs[2])[i]), GPU_POISON_BITS);
    for (int s = 0; s < ET_SLOTS; s++) free(outs[s]);
}

int main(void)
{
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_qk_norm_rope),
        cmocka_unit_test(test_rows_check),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    return rc;
}
