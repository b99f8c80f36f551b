/* tests/emu/test_emu_spec.c — kernels/cuda/spec.cu (KOP_DRAFT_SELECT, KOP_CONFIDENCE), the real CUDA
 * source, run on the CPU emulation of the CUDA primitives (tests/emu/emu_cuda.h) against the CPU
 * kernels (kern_cpu_exec), as tests/gpu/test_cuda_ops.c does on a GPU.
 *
 * Why: CI has no GPU; this runs the kernels' index arithmetic, the per-slot launch sequence of the
 * Markov head (slot k reads slot k-1's argmax key), the cross-block argmax keys and the warp sums on
 * every CI run.
 *
 * The cases are tests/opcases/opcases.c's (opcase_draft_select, opcase_confidence), shared with
 * tests/gpu/test_cuda_ops.c and run here through emu_optest.h's harness (buffers ending at a guard page).
 * draft_select: integer-valued data, so every sum is exact whatever the order: drafts and the updated
 * logits must equal the CPU's bitwise, ties (lowest id), NaN (never chosen; logit 0 NaN -> 0) and
 * -0 == +0 included, and rows of absent sequences keep the poison. confidence: within 1e-5 of the
 * CPU, rows past n keep the poison. Every op runs under two thread schedules (uniform, warps running
 * ahead), which must agree bitwise. Then the data-dependent check (previous token out of range).
 *
 * Limits: those of the emulation (emu_cuda.h): no memory-model fidelity, blocks run one after another,
 * no inline PTX, warp-synchronous code without an explicit sync is not modelled, C library math. */
#include "tests/emu/emu_optest.h"

static kern_pool *g_pool;

static const uint64_t SEEDS[2] = {0x5eed0004ull, 0x5eed0003ull}; /* uniform, run ahead */

/* the emulated kernels as emu_kc_fn (the schedule seeds are emu_optest.h's) */
static int kc_draft_select(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    (void)cfg;
    return emu_kc_draft_select(op, seed, msg, msglen);
}
static int kc_confidence(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    (void)cfg;
    return emu_kc_confidence(op, seed, msg, msglen);
}

/* the cases: tests/opcases/opcases.c (shared with tests/gpu/test_cuda_ops.c) */
static void test_draft_select(void **state)
{
    (void)state;
    et_cases(g_pool, kc_draft_select, opcase_draft_select, "draft_select");
}

static void test_confidence(void **state)
{
    (void)state;
    et_cases(g_pool, kc_confidence, opcase_confidence, "confidence");
}

/* A previous token outside [0, V) (the CPU aborts): the kernels record it and skip what depends on it;
 * the other sequences / rows are still the CPU's. */
static void test_prev_checks(void **state)
{
    (void)state;
    const int W = 2, V = 50, rk = 4, max_seqs = 2;
    const size_t lb = (size_t)max_seqs * W * V * 4, wb = (size_t)V * rk * 4;
    float *lg = oc_alloc(lb), *lg_cpu = oc_alloc(lb), *w1 = oc_alloc(wb), *w2 = oc_alloc(wb);
    gpu_rng r = {23};
    for (int i = 0; i < max_seqs * W * V; i++) lg[i] = (float)gpu_int(&r, -9, 9);
    for (int i = 0; i < V * rk; i++) {
        w1[i] = (float)gpu_int(&r, -2, 2);
        w2[i] = (float)gpu_int(&r, -2, 2);
    }
    memcpy(lg_cpu, lg, lb);
    int32_t anchor[2] = {3, V}, drafts[4] = {-7, -7, -7, -7}, cpu_drafts[4] = {-7, -7, -7, -7}, nn = 2, one = 1;
    kern_op op = {.kind = KOP_DRAFT_SELECT};
    op.buf[0] = (kern_buf){lg, lb};
    op.buf[1] = (kern_buf){w1, wb};
    op.buf[2] = (kern_buf){w2, wb};
    op.buf[3] = (kern_buf){anchor, sizeof anchor};
    op.buf[4] = (kern_buf){drafts, sizeof drafts};
    op.buf[5] = (kern_buf){&nn, 4};
    op.p[0] = W;
    op.p[1] = V;
    op.p[2] = rk;
    op.p[3] = KERN_DT_F32;
    op.p[4] = max_seqs;
    char msg[160] = "";
    assert_int_equal(emu_kc_draft_select(&op, SEEDS[1], msg, sizeof msg), 1);
    if (!strstr(msg, "KC_ERR_PREV")) fail_msg("draft_select: recorded '%s', expected KC_ERR_PREV", msg);
    kern_op cop = op; /* sequence 0 alone on the CPU */
    cop.buf[0].ptr = lg_cpu;
    cop.buf[4].ptr = cpu_drafts;
    cop.buf[5].ptr = &one;
    kern_cpu_exec(g_pool, &cop);
    assert_memory_equal(drafts, cpu_drafts, 2 * sizeof drafts[0]);
    assert_memory_equal(lg, lg_cpu, (size_t)W * V * 4);

    /* confidence: row 3 (sequence 1, slot 1) reads drafts[2] as its previous token */
    enum { H = 8 };
    float h[2 * 2 * H], w[H + 4], b[1] = {0.5f}, conf[4], cpu_conf[4];
    for (size_t i = 0; i < sizeof h / 4; i++) h[i] = gpu_unif(&r);
    for (size_t i = 0; i < sizeof w / 4; i++) w[i] = gpu_unif(&r);
    for (int i = 0; i < 4; i++) conf[i] = cpu_conf[i] = gpu_poison_f32();
    int32_t cdr[4] = {1, 2, V + 5, 3}, canchor[2] = {3, 4};
    kern_op fop = {.kind = KOP_CONFIDENCE};
    fop.buf[0] = (kern_buf){h, sizeof h};
    fop.buf[1] = (kern_buf){w1, wb};
    fop.buf[2] = (kern_buf){cdr, sizeof cdr};
    fop.buf[3] = (kern_buf){canchor, sizeof canchor};
    fop.buf[4] = (kern_buf){w, sizeof w};
    fop.buf[5] = (kern_buf){b, sizeof b};
    fop.buf[6] = (kern_buf){conf, sizeof conf};
    fop.buf[7] = (kern_buf){&nn, 4};
    fop.p[0] = W;
    fop.p[1] = H;
    fop.p[2] = rk;
    fop.p[3] = KERN_DT_F32;
    fop.p[4] = max_seqs;
    fop.p[5] = V;
    msg[0] = 0;
    assert_int_equal(emu_kc_confidence(&fop, SEEDS[0], msg, sizeof msg), 1);
    if (!strstr(msg, "KC_ERR_PREV")) fail_msg("confidence: recorded '%s', expected KC_ERR_PREV", msg);
    assert_int_equal(gpu_bits(conf[3]), GPU_POISON_BITS);
    cdr[2] = 0; /* the CPU on valid input: rows 0..2 do not depend on drafts[2] */
    fop.buf[6].ptr = cpu_conf;
    kern_cpu_exec(g_pool, &fop);
    for (int i = 0; i < 3; i++)
        if (!(fabs((double)conf[i] - (double)cpu_conf[i]) <= 1e-5)) fail_msg("confidence row %d: %.9g, cpu %.9g", i, (double)conf[i], (double)cpu_conf[i]);
    free(lg);
    free(lg_cpu);
    free(w1);
    free(w2);
}

int main(void)
{
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_select),
        cmocka_unit_test(test_confidence),
        cmocka_unit_test(test_prev_checks),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    return rc;
}
