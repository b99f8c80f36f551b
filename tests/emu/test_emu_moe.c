/* tests/emu/test_emu_moe.c — kernels/cuda/moe.cu (KOP_MOE_ROUTE, KOP_MOE_FFN and the grouped matmuls of
 * kernels/cuda/mm_kernels.cuh), the real CUDA source, run on the CPU emulation of the CUDA primitives
 * (tests/emu/emu_cuda.h) against the CPU kernels (kern_cpu_exec).
 *
 *  - test_moe_route / test_moe_ffn: the shared cases (tests/opcases/opcases.c): route ids and weights
 *    bitwise the CPU's; the experts within the matmul's tolerance, unchosen experts' NaN weights never
 *    read, rows past n untouched, two thread schedules bitwise equal. FP8 experts among them (e4m3 codes
 *    with 16 x 32 block scales, the grouped CUDA-core kernel over kc_wrow_fp8: each expert's scale rows from its own offset).
 *  - test_moe_ffn_invariance: rows 0..2 with fixed inputs and routing, computed in ops with max_rows 3, 8
 *    and 40 where the other rows (random) choose other experts, and row 0 alone in max_rows 1: bitwise
 *    identical outputs for those rows on each matmul path (batch invariance: I9 on an MoE target).
 *  - test_moe_checks: an expert id out of range, the same expert twice in a row (KC_ERR_EXPERT) and a row
 *    count above max_rows (KC_ERR_ROWS, both ops) are recorded, and out is left as it was.
 *
 * Limits: those of the emulation (emu_cuda.h); the emulated mma sums each output in double and rounds
 * once, so a GPU may differ in the last bits (the invariance holds on both). */
#include "tests/emu/emu_optest.h"

static kern_pool *g_pool;

static void test_moe_route(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_moe_route, opcase_moe_route, "moe_route");
}

static void test_moe_ffn(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_moe_ffn, opcase_moe_ffn, "moe_ffn");
}

/* ---- batch invariance ---------------------------------------------------------------------------------- */
typedef struct {
    int H, I, E, k, bf;
    const char *what;
} inv_shape;

/* one op: rows < 3 from the fixed data, the rest random (routing random too); returns out (caller frees) */
static float *ffn_once(const inv_shape *s, const void *w13, const void *w2, const float *h3, const int32_t *ids3,
                       const float *wts3, int M, int n, gpu_rng *r, uint64_t seed)
{
    const int H = s->H, k = s->k;
    float *hx = et_poison((size_t)M * H), *out = et_poison((size_t)M * H), *wts = et_poison((size_t)M * k);
    int32_t *ids = et_i32((size_t)M * k, -1);
    for (int row = 0; row < n; row++) {
        for (int i = 0; i < H; i++) {
            hx[row * H + i] = row < 3 ? h3[row * H + i] : gpu_unif(r);
            out[row * H + i] = row < 3 ? 0.25f * (float)i : gpu_unif(r);
        }
        uint8_t pick[64] = {0};
        for (int j = 0, got = 0; got < k; j++) {
            const int e = row < 3 ? ids3[row * k + got] : gpu_int(r, 0, s->E - 1);
            if (!pick[e]) pick[e] = 1, got++;
        }
        for (int e = 0, j = 0; e < s->E; e++)
            if (pick[e]) ids[row * k + j] = e, wts[row * k + j] = row < 3 ? wts3[row * k + j] : 0.3f, j++;
    }
    const size_t sb = kern_moe_scratch_bytes(s->E, k, H, s->I, M), ws = s->bf ? 2 : 4;
    float *scratch = et_poison(sb / 4);
    int32_t nn = n;
    kern_op op = {.kind = KOP_MOE_FFN};
    op.buf[0] = (kern_buf){hx, (size_t)M * H * 4};
    op.buf[1] = (kern_buf){(void *)w13, (size_t)s->E * 2 * s->I * H * ws};
    op.buf[2] = (kern_buf){(void *)w2, (size_t)s->E * H * s->I * ws};
    op.buf[3] = (kern_buf){ids, (size_t)M * k * 4};
    op.buf[4] = (kern_buf){wts, (size_t)M * k * 4};
    op.buf[5] = (kern_buf){out, (size_t)M * H * 4};
    op.buf[6] = (kern_buf){&nn, 4};
    op.buf[7] = (kern_buf){scratch, sb};
    op.p[0] = H, op.p[1] = s->I, op.p[2] = s->E, op.p[3] = k, op.p[4] = M;
    op.p[5] = s->bf ? KERN_DT_BF16 : KERN_DT_F32;
    char msg[192];
    if (emu_kc_moe_ffn(&op, NULL, seed, msg, sizeof msg) != 0) fail_msg("%s: the kernel recorded %s", s->what, msg);
    free(hx);
    free(wts);
    free(ids);
    free(scratch);
    return out;
}

static void test_moe_ffn_invariance(void **state)
{
    (void)state;
    gpu_rng r = {93};
    const inv_shape shapes[] = {
        {64, 32, 8, 2, 1, "bf16 tensor-core"},
        {40, 24, 6, 2, 1, "bf16 CUDA-core (H % 32 != 0)"},
        {32, 32, 5, 3, 0, "f32 CUDA-core"},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const inv_shape *s = &shapes[si];
        const int H = s->H, k = s->k;
        void *w13 = et_weights(&r, s->bf, (size_t)s->E * 2 * s->I * H, 0.3f);
        void *w2 = et_weights(&r, s->bf, (size_t)s->E * H * s->I, 0.3f);
        float *h3 = et_rand(&r, (size_t)3 * H, 1.5f), wts3[3 * 3];
        int32_t ids3[3 * 3];
        for (int row = 0; row < 3; row++)
            for (int j = 0; j < k; j++) {
                ids3[row * k + j] = (row + 2 * j) % s->E; /* distinct for j < k <= 3 with E >= 5 */
                wts3[row * k + j] = 0.2f + 0.1f * (float)(row + j);
            }
        const struct {
            int M, n;
        } runs[] = {{3, 3}, {8, 8}, {8, 5}, {40, 37}, {1, 1}};
        float *ref = NULL;
        for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
            float *got = ffn_once(s, w13, w2, h3, ids3, wts3, runs[ri].M, runs[ri].n, &r, ET_SEEDS[ri & 1]);
            const int rows = runs[ri].n < 3 ? runs[ri].n : 3;
            if (!ref) {
                ref = got;
                continue;
            }
            for (int i = 0; i < rows * H; i++)
                if (gpu_bits(ref[i]) != gpu_bits(got[i]))
                    fail_msg("%s: row %d column %d differs with max_rows %d n %d: %.9g vs %.9g", s->what, i / H,
                             i % H, runs[ri].M, runs[ri].n, (double)ref[i], (double)got[i]);
            for (size_t i = (size_t)runs[ri].n * H; i < (size_t)runs[ri].M * H; i++)
                if (gpu_bits(got[i]) != GPU_POISON_BITS) fail_msg("%s: element %zu past n written", s->what, i);
            free(got);
        }
        free(ref);
        free(w13);
        free(w2);
        free(h3);
    }
}

/* ---- data-dependent checks ------------------------------------------------------------------------------- */
static void ffn_check_case(gpu_rng *r, int bad_kind, const char *code, const char *name)
{
    const int H = 32, I = 32, E = 4, k = 2, M = 3, n = 3;
    et_case t;
    et_init(&t, KOP_MOE_FFN);
    int32_t *ids = et_i32((size_t)M * k, 0);
    for (int row = 0; row < M; row++) ids[row * k] = 0, ids[row * k + 1] = 1 + row;
    if (bad_kind == 0) ids[3] = E;     /* out of range */
    if (bad_kind == 1) ids[5] = ids[4]; /* row 2 chooses expert 0 twice */
    et_buf(&t, 0, et_rand(r, (size_t)M * H, 1.0f), (size_t)M * H * 4, ET_IN);
    et_buf(&t, 1, et_weights(r, 1, (size_t)E * 2 * I * H, 0.3f), (size_t)E * 2 * I * H * 2, ET_IN);
    et_buf(&t, 2, et_weights(r, 1, (size_t)E * H * I, 0.3f), (size_t)E * H * I * 2, ET_IN);
    et_buf(&t, 3, ids, (size_t)M * k * 4, ET_IN);
    et_buf(&t, 4, et_rand(r, (size_t)M * k, 1.0f), (size_t)M * k * 4, ET_IN);
    et_buf(&t, 5, et_poison((size_t)M * H), (size_t)M * H * 4, ET_OUT_F32);
    et_buf(&t, 6, et_i32(1, bad_kind == 2 ? M + 1 : n), 4, ET_IN);
    const size_t sb = kern_moe_scratch_bytes(E, k, H, I, M);
    et_buf(&t, 7, et_poison(sb / 4), sb, ET_IN);
    t.op.p[0] = H, t.op.p[1] = I, t.op.p[2] = E, t.op.p[3] = k, t.op.p[4] = M, t.op.p[5] = KERN_DT_BF16;
    void *outs[ET_SLOTS] = {0};
    et_expect_error(&t, emu_kc_moe_ffn, code, name, outs);
    const float *o = outs[5];
    for (int i = 0; i < M * H; i++)
        if (gpu_bits(o[i]) != GPU_POISON_BITS) fail_msg("%s: out[%d] written", name, i);
    for (int s = 0; s < ET_SLOTS; s++) free(outs[s]);
}

static void test_moe_checks(void **state)
{
    (void)state;
    gpu_rng r = {94};
    ffn_check_case(&r, 0, "KC_ERR_EXPERT", "moe_ffn id out of range");
    ffn_check_case(&r, 1, "KC_ERR_EXPERT", "moe_ffn expert twice in a row");
    ffn_check_case(&r, 2, "KC_ERR_ROWS", "moe_ffn n_rows > max_rows");
    /* route: n_rows > max_rows, nothing written */
    const int E = 8, k = 2, M = 3;
    et_case t;
    et_init(&t, KOP_MOE_ROUTE);
    et_buf(&t, 0, et_rand(&r, (size_t)M * E, 1.0f), (size_t)M * E * 4, ET_IN);
    et_buf(&t, 1, et_i32((size_t)M * k, GPU_POISON_I32), (size_t)M * k * 4, ET_OUT_I32);
    et_buf(&t, 2, et_poison((size_t)M * k), (size_t)M * k * 4, ET_OUT_F32);
    et_buf(&t, 3, et_i32(1, M + 1), 4, ET_IN);
    t.op.p[0] = E, t.op.p[1] = k, t.op.p[2] = M, t.op.p[3] = 1;
    void *outs[ET_SLOTS] = {0};
    et_expect_error(&t, emu_kc_moe_route, "KC_ERR_ROWS", "moe_route n_rows > max_rows", outs);
    const int32_t *ids = outs[1];
    const float *w = outs[2];
    for (int i = 0; i < M * k; i++) {
        assert_int_equal(ids[i], GPU_POISON_I32);
        assert_int_equal(gpu_bits(w[i]), GPU_POISON_BITS);
    }
    for (int s = 0; s < ET_SLOTS; s++) free(outs[s]);
}

int main(void)
{
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_ffn),
        cmocka_unit_test(test_moe_ffn_invariance),
        cmocka_unit_test(test_moe_checks),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    return rc;
}
