/* tests/emu/test_emu_sample.c — kernels/cuda/sample.cu (KOP_SAMPLE), the real CUDA source, run on the
 * CPU emulation of the CUDA primitives (tests/emu/emu_cuda.h) against the CPU kernel (kern_cpu_exec).
 *
 * Why: CI has no GPU, so tests/gpu/test_cuda_ops.c's test_sample only runs where a GPU is lent.
 * This runs the same kind of rows through the same kernel source on every CI run, small enough for
 * two cores: index and logic bugs, missing or misplaced barriers and warp votes at divergent points
 * fail here (the emulation aborts on divergent barrier use; a result that depends on the thread
 * schedule shows up as two schedules disagreeing).
 *
 * The cases are tests/opcases/opcases.c's opcase_sample (shared with tests/gpu/test_cuda_ops.c), run
 * here through emu_optest.h's harness (buffers ending at a guard page). Each op: random rows of every mode (greedy, temperature, top-k, top-p, min-p and their
 * combinations, bans (short, past the kernel's shared-memory staging, duplicates, the best id
 * banned), n_logprobs 0 / 5 / 20, verify rows whose draft is the argmax, a random id or a banned id),
 * run by the CPU kernel and by the emulated kernel under two schedules (uniform random picks, warps
 * running ahead), compared field by field: tok, accepted, n_top, top ids equal, logprobs within 1e-5,
 * output words past n_top and rows past n still the poison; the two schedules bitwise equal.
 * Then the kernel's data-dependent checks (the CPU aborts on them): a failing row is skipped and the
 * first failure recorded.
 *
 * Limits: those of the emulation (emu_cuda.h): no memory-model fidelity, blocks never concurrent, no
 * inline PTX, warp-synchronous code without an explicit sync is not modelled, C library math (the
 * device's exp may differ by an ulp, and nvcc contracts multiply-adds: a draw near a rounding
 * boundary can differ on a GPU but not here). The larger shapes run on a GPU only. */
#include "tests/emu/emu_optest.h"

static kern_pool *g_pool;

/* two schedules per op: even seed uniform, odd seed run ahead (emu_cuda.cpp) */
static const uint64_t SEEDS[2] = {0x5eed0002ull, 0x5eed0001ull};

/* The op over logits [max_rows, V], params, bans (NB entries, NULL: no buffer), out, n. */
static kern_op sample_op(const float *logits, const kern_sample_params *prm, const int32_t *bans, int NB, int V,
                         int max_rows, kern_sample_out *out, int32_t *n)
{
    kern_op op = {.kind = KOP_SAMPLE};
    op.p[0] = V;
    op.p[1] = max_rows;
    op.p[2] = NB;
    op.buf[0] = (kern_buf){(void *)logits, (size_t)max_rows * V * 4};
    op.buf[1] = (kern_buf){(void *)prm, (size_t)max_rows * sizeof(kern_sample_params)};
    if (NB > 0) op.buf[2] = (kern_buf){(void *)bans, (size_t)NB * 4};
    op.buf[3] = (kern_buf){out, (size_t)max_rows * sizeof(kern_sample_out)};
    op.buf[4] = (kern_buf){n, 4};
    return op;
}

static kern_sample_out *out_poison(int max_rows)
{
    kern_sample_out *o = malloc((size_t)max_rows * sizeof *o);
    assert_non_null(o);
    for (size_t w = 0; w < (size_t)max_rows * sizeof *o / 4; w++) ((uint32_t *)o)[w] = GPU_POISON_BITS;
    return o;
}

/* the emulated kernel as emu_kc_fn (the schedule seeds are emu_optest.h's) */
static int kc_sample(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    (void)cfg;
    return emu_kc_sample(op, seed, msg, msglen);
}

/* the cases: tests/opcases/opcases.c (shared with tests/gpu/test_cuda_ops.c, which adds larger shapes) */
static void test_sample(void **state)
{
    (void)state;
    et_cases(g_pool, kc_sample, opcase_sample, "sample");
}

/* The data-dependent checks the CPU kernel aborts on: the kernel skips the row (nothing written),
 * records the first failure, and the other rows are still right. */
static void test_sample_checks(void **state)
{
    (void)state;
    gpu_rng r = {22};
    const int V = 300, max_rows = 3, NB = 64;
    const struct {
        const char *what, *expect;
    } cases[] = {
        {"ban id out of range", "KC_ERR_TOKEN"}, {"draft out of range", "KC_ERR_TOKEN"},
        {"n_logprobs out of range", "KC_ERR_LOGPROBS"}, {"ban list outside the buffer", "KC_ERR_BANS"},
        {"every id banned", "KC_ERR_NO_TOKEN"}, {"row count above max_rows", "KC_ERR_ROWS"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        float *logits = oc_poison((size_t)max_rows * V);
        kern_sample_params *prm = calloc((size_t)max_rows, sizeof *prm);
        int32_t *bans = oc_i32(NB, 0);
        assert_non_null(prm);
        int n = max_rows;
        oc_sample_rows(&r, logits, prm, bans, NB, V, n, 0);
        kern_sample_params *p = &prm[1]; /* the bad row */
        if (ci == 0) { /* the last entry, which sample_rows leaves unused */
            p->ban_off = NB - 1;
            p->n_ban = 1;
            bans[NB - 1] = V;
        } else if (ci == 1) {
            p->draft = V;
        } else if (ci == 2) {
            p->n_logprobs = KERN_SAMPLE_MAX_TOP + 1;
        } else if (ci == 3) {
            p->ban_off = NB - 1;
            p->n_ban = 2;
        }
        int32_t *all = NULL;
        if (ci == 4) { /* a ban list of every id: it needs its own buffer */
            all = oc_i32((size_t)V, 0);
            for (int i = 0; i < V; i++) all[i] = V - 1 - i;
            for (int j = 0; j < max_rows; j++) {
                prm[j].n_ban = j == 1 ? V : 0;
                prm[j].ban_off = 0;
            }
        }
        if (ci == 5) n = max_rows + 1;
        kern_sample_out *out = out_poison(max_rows), *init = out_poison(max_rows), *cpu = out_poison(max_rows);
        int32_t nn = n;
        kern_op op = sample_op(logits, prm, all ? all : bans, all ? V : NB, V, max_rows, out, &nn);
        char msg[160] = "";
        assert_int_equal(emu_kc_sample(&op, SEEDS[ci & 1], msg, sizeof msg), 1);
        if (!strstr(msg, cases[ci].expect)) fail_msg("%s: recorded '%s', expected %s", cases[ci].what, msg, cases[ci].expect);
        if (ci == 5) { /* no row runs */
            assert_memory_equal(out, init, (size_t)max_rows * sizeof *out);
        } else { /* row 1 untouched, rows 0 and 2 as the CPU's (the CPU run without row 1) */
            assert_memory_equal(&out[1], &init[1], sizeof *out);
            for (int j = 0; j < max_rows; j += 2) {
                kern_op one = sample_op(logits + (size_t)j * V, &prm[j], all ? all : bans, all ? V : NB, V, 1, &cpu[j],
                                        &(int32_t){1});
                kern_cpu_exec(g_pool, &one);
                assert_int_equal(out[j].tok, cpu[j].tok);
                assert_int_equal(out[j].n_top, cpu[j].n_top);
            }
        }
        free(out);
        free(init);
        free(cpu);
        free(all);
        free(logits);
        free(prm);
        free(bans);
    }
}

/* The penalty state checks (KC_ERR_PEN): a row whose slot is outside the table, whose extra ids or
 * logit_bias list are out of range (or not ascending) is skipped, the others run as on the CPU; an
 * update pair out of range is skipped and recorded, the other pairs still applied. */
static void test_sample_pen_checks(void **state)
{
    (void)state;
    gpu_rng r = {23};
    const int V = 300, max_rows = 3, NB = 64, slots = 2, MB = 4, MU = 4;
    for (int ci = 0; ci < 5; ci++) {
        float *logits = oc_poison((size_t)max_rows * V);
        kern_sample_params *prm = calloc((size_t)max_rows, sizeof *prm);
        int32_t *bans = oc_i32(NB, 0), *pen = oc_i32((size_t)slots * V, 0), *upd = oc_i32(1 + 2 * MU, 0);
        kern_logit_bias *bias = calloc((size_t)slots * MB, sizeof *bias);
        assert_non_null(prm);
        assert_non_null(bias);
        oc_sample_rows(&r, logits, prm, bans, NB, V, max_rows, 0);
        for (int s = 0; s < slots; s++)
            for (int k = 0; k < MB; k++) bias[s * MB + k] = (kern_logit_bias){10 * k + s, 2.0f};
        for (int j = 0; j < max_rows; j++) {
            prm[j].pen = 1;
            prm[j].slot = j % slots;
            prm[j].rep = 1.3f;
            prm[j].freq = 0.5f;
            prm[j].n_bias = MB;
            prm[j].n_extra = 0;
        }
        pen[5] = 3;
        upd[0] = 2;
        upd[1] = 0, upd[2] = 7;
        upd[3] = 1, upd[4] = 8;
        kern_sample_params *p = &prm[1]; /* the bad row */
        if (ci == 0) p->slot = slots;
        else if (ci == 1) { /* an extra id out of range (the last ban entry, unused) */
            p->extra_off = NB - 1;
            p->n_extra = 1;
            bans[NB - 1] = V;
        } else if (ci == 2) { /* a bias list not ascending: slot 1's, read by row 1 only */
            bias[1 * MB + 2].id = bias[1 * MB + 1].id;
        } else if (ci == 3) {
            p->n_extra = KERN_SAMPLE_MAX_EXTRA + 1;
        } else { /* an update pair with a token outside the vocabulary */
            upd[4] = V;
        }
        kern_sample_out *out = out_poison(max_rows), *init = out_poison(max_rows);
        int32_t nn = max_rows;
        kern_op op = sample_op(logits, prm, bans, NB, V, max_rows, out, &nn);
        op.p[3] = slots;
        op.p[4] = MB;
        op.p[5] = MU;
        op.buf[5] = (kern_buf){pen, (size_t)slots * V * 4};
        op.buf[6] = (kern_buf){bias, (size_t)slots * MB * sizeof *bias};
        op.buf[7] = (kern_buf){upd, (1 + 2 * (size_t)MU) * 4};
        char msg[160] = "";
        assert_int_equal(emu_kc_sample(&op, SEEDS[ci & 1], msg, sizeof msg), 1);
        if (!strstr(msg, "KC_ERR_PEN")) fail_msg("case %d: recorded '%s', expected KC_ERR_PEN", ci, msg);
        assert_int_equal(pen[7], 2); /* the good pair */
        if (ci == 4) {
            assert_int_equal(pen[V + 8], 0);
        } else {
            assert_int_equal(pen[V + 8], 2);
            assert_memory_equal(&out[1], &init[1], sizeof *out);
            assert_int_not_equal(out[0].n_top, init[0].n_top);
        }
        free(out);
        free(init);
        free(logits);
        free(prm);
        free(bans);
        free(pen);
        free(upd);
        free(bias);
    }
}

int main(void)
{
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample),
        cmocka_unit_test(test_sample_checks),
        cmocka_unit_test(test_sample_pen_checks),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    return rc;
}
