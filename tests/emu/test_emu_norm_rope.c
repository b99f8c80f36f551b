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

static void test_rmsnorm(void **state)
{
    (void)state;
    gpu_rng r = {51};
    const int Hs[] = {100, 1024, 4096 + 96};
    for (int hi = 0; hi < 3; hi++)
        for (int inplace = 0; inplace < 2; inplace++) {
            const int H = Hs[hi], max_rows = 5, n = hi == 2 ? 2 : 3;
            et_case t;
            et_init(&t, KOP_RMSNORM);
            float *x = et_rows(&r, max_rows, H, n, 3.0f);
            if (inplace) {
                et_buf(&t, 0, x, (size_t)max_rows * H * 4, ET_OUT_F32);
                et_view(&t, 2, 0, 0, (size_t)max_rows * H * 4);
            } else {
                et_buf(&t, 0, x, (size_t)max_rows * H * 4, ET_IN);
                et_buf(&t, 2, et_poison((size_t)max_rows * H), (size_t)max_rows * H * 4, ET_OUT_F32);
            }
            et_buf(&t, 1, et_near1(&r, H), (size_t)H * 4, ET_IN);
            et_buf(&t, 3, et_i32(1, n), 4, ET_IN);
            t.op.p[0] = H;
            t.op.p[1] = max_rows;
            t.op.f[0] = 1e-6f;
            char name[96];
            snprintf(name, sizeof name, "rmsnorm H %d %s", H, inplace ? "in place" : "out of place");
            assert_int_equal(et_run(g_pool, &t, emu_kc_rmsnorm, name), 0);
        }
}

static float *inv_freq(int hd, double base)
{
    float *inv = et_alloc((size_t)hd / 2 * 4);
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(base, 2.0 * i / hd));
    return inv;
}

static void test_qk_norm_rope(void **state)
{
    (void)state;
    gpu_rng r = {52};
    const struct {
        int nh, nkv, hd, qn, kn, extra_cols;
    } cases[] = {{4, 2, 64, 1, 1, 0}, {4, 2, 64, 0, 0, 16}, {2, 2, 16, 1, 1, 0}, {5, 1, 256, 1, 1, 0},
                 {3, 1, 128, 1, 1, 32}, {2, 1, 128, 0, 1, 8}, {8, 8, 16, 1, 0, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int nh = cases[ci].nh, nkv = cases[ci].nkv, hd = cases[ci].hd;
        const int stride = (nh + 2 * nkv) * hd + cases[ci].extra_cols, max_rows = 5, n = 3;
        et_case t;
        et_init(&t, KOP_QK_NORM_ROPE);
        et_buf(&t, 0, et_rows(&r, max_rows, stride, n, 2.0f), (size_t)max_rows * stride * 4, ET_OUT_F32);
        if (cases[ci].qn) et_buf(&t, 1, et_near1(&r, hd), (size_t)hd * 4, ET_IN);
        if (cases[ci].kn) et_buf(&t, 2, et_near1(&r, hd), (size_t)hd * 4, ET_IN);
        int32_t *pos = et_i32(max_rows, -7);
        for (int i = 0; i < n; i++) pos[i] = gpu_int(&r, 0, 6000);
        pos[0] = 0; /* angle 0: cos 1, sin 0 */
        et_buf(&t, 3, pos, max_rows * 4, ET_IN);
        et_buf(&t, 4, inv_freq(hd, 1000000.0), (size_t)hd / 2 * 4, ET_IN);
        et_buf(&t, 5, et_i32(1, n), 4, ET_IN);
        t.op.p[0] = nh;
        t.op.p[1] = nkv;
        t.op.p[2] = hd;
        t.op.p[3] = stride;
        t.op.p[4] = max_rows;
        t.op.f[0] = 1e-6f;
        /* without norms the rope is the CPU's expression with the same libm: bitwise */
        t.exact[0] = !cases[ci].qn && !cases[ci].kn;
        char name[96];
        snprintf(name, sizeof name, "qk_norm_rope nh %d nkv %d hd %d norms q %d k %d", nh, nkv, hd, cases[ci].qn,
                 cases[ci].kn);
        assert_int_equal(et_run(g_pool, &t, emu_kc_qk_norm_rope, name), 0);
    }
    /* keys only (nh = 0) on a view that starts inside each row, as the drafter's context path */
    for (int norm = 0; norm < 2; norm++) {
        const int nkv = 2, hd = 32, L = 3, cols = 2 * nkv * hd * L, max_rows = 4, n = 2;
        et_case t;
        et_init(&t, KOP_QK_NORM_ROPE);
        const size_t full = (size_t)(max_rows + 1) * cols * 4, off = (size_t)1 * 2 * nkv * hd * 4;
        et_buf(&t, ET_EXTRA, et_rows(&r, max_rows + 1, cols, n, 2.0f), full, ET_OUT_F32);
        et_view(&t, 0, ET_EXTRA, off, (size_t)max_rows * cols * 4);
        if (norm) et_buf(&t, 2, et_near1(&r, hd), (size_t)hd * 4, ET_IN);
        int32_t *pos = et_i32(max_rows, 0);
        pos[0] = 5;
        pos[1] = 900;
        et_buf(&t, 3, pos, max_rows * 4, ET_IN);
        et_buf(&t, 4, inv_freq(hd, 10000.0), (size_t)hd / 2 * 4, ET_IN);
        et_buf(&t, 5, et_i32(1, n), 4, ET_IN);
        t.op.p[0] = 0;
        t.op.p[1] = nkv;
        t.op.p[2] = hd;
        t.op.p[3] = cols;
        t.op.p[4] = max_rows;
        t.op.f[0] = 1e-6f;
        t.exact[ET_EXTRA] = !norm;
        assert_int_equal(et_run(g_pool, &t, emu_kc_qk_norm_rope, norm ? "qk_norm_rope keys-only view, k norm"
                                                                     : "qk_norm_rope keys-only view"),
                         0);
    }
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
