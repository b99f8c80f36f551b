/* tests/gpu/test_cuda_model.c — whole models on the CUDA backend against the CPU backend.
 *
 *  - logits parity: small random Qwen3 (bf16), Qwen2 (f32, biases) and Llama (bf16, untied) models
 *    run the same steps (a mixed two-sequence prefill, decode steps, a prefill of two row tiles,
 *    cuBLASLt under GS_CUDA_FAST_GEMM=1) on both backends; logits agree within bf16 tolerance and
 *    pick the same token.
 *  - engine: greedy requests through the scheduler give the same tokens on the CPU, on the GPU with
 *    CUDA graphs and on the GPU eagerly; logprobs agree closely.
 *  - speculative decoding on the GPU (DSpark and DFlash drafters: draft_select, confidence,
 *    copy_cols, gather ops in real flows): greedy output equals plain greedy decoding (I9).
 *  - hot update on the GPU: target + drafter updated in place from disk in small buckets (the
 *    pinned staging ring, device dtype conversion, the drafter's derived buffers rebuilt into their
 *    allocations) equal a cold start on the new checkpoint — checksums of every parameter and
 *    derived buffer, also against a cold start on the CPU backend, and identical generations with the
 *    plans captured before the update (I2, I4, I5).
 *  - FP8 (block 16 x 32, as Qwen3-FP8 stores it): dense and MoE logits parity, an FP8 target with an
 *    FP8 DFlash drafter lossless, and a hot FP8 update on the GPU byte-identical to a CPU cold start. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "../unit/test_rt.h"
#include "../unit/test_util.h"
#include "engine/backend/backend_cuda.h"
#include "engine/engine.h"
#include "engine/weights.h"
#include "gpu_fwd.h"
#include "gpu_test.h"
#include "gpu_models.h"

static char g_qwen3[1100], g_qwen2[1100], g_llama[1100], g_dspark[1100], g_dflash[1100];
static char g_moe[1100];             /* Qwen3-MoE: KOP_MOE_ROUTE / KOP_MOE_FFN on the GPU */
static char g_qwen3b[1100], g_dflashb[1100]; /* same shapes, other seed: the update's source */
/* block FP8 (16 x 32): a Qwen3 target (and its update source), a DFlash drafter, a Qwen3-MoE target */
static char g_q8[1100], g_q8b[1100], g_dflash8[1100], g_moe8[1100];

static eng_backend *cpu_backend(void)
{
    char err[256];
    eng_backend_config bc = {.arena_bytes = (size_t)2 << 30, .threads = 2, .checked = 1};
    eng_backend *be = eng_backend_cpu_create(&bc, err, sizeof err);
    if (!be) fail_msg("%s", err);
    return be;
}
static eng_backend *cuda_backend(void)
{
    char err[256];
    eng_backend_config bc = {.arena_bytes = (size_t)2 << 30, .threads = 0, .checked = 1};
    eng_backend *be = eng_backend_cuda_create(&bc, err, sizeof err);
    if (!be) fail_msg("%s", err);
    return be;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* logits rows [nl, V]: within rtol * max|cpu| per row, same argmax */
static void cmp_logits(const char *what, const float *cpu, const float *gpu, int nl, int V, double rtol)
{
    for (int r = 0; r < nl; r++) {
        char name[128];
        snprintf(name, sizeof name, "%s row %d", what, r);
        assert_int_equal(gpu_cmp_f32(name, cpu + (size_t)r * V, gpu + (size_t)r * V, NULL, (size_t)V, rtol, 0), 0);
        assert_int_equal(argmax(cpu + (size_t)r * V, V), argmax(gpu + (size_t)r * V, V));
    }
}

static void parity(const char *dir, double rtol_small, double rtol_large)
{
    char err[512];
    eng_backend *cb = cpu_backend(), *gb = cuda_backend();
    gpu_fwd c, g;
    if (gpu_fwd_open(&c, cb, dir, 64, 4, 128, 16, err, sizeof err) != 0) fail_msg("cpu: %s", err);
    if (gpu_fwd_open(&g, gb, dir, 64, 4, 128, 16, err, sizeof err) != 0) fail_msg("gpu: %s", err);
    const int V = c.m->cfg.vocab;
    float *lc = malloc((size_t)64 * V * 4), *lg = malloc((size_t)64 * V * 4);
    int32_t tok[64], pos[64], slot[64], li[64];
    /* step 1: prefill 11 tokens of slot 0 and 7 of slot 1 (18 rows, bucket 32: skinny matmuls) */
    int n = 0;
    for (int i = 0; i < 11; i++, n++) tok[n] = (i * 37 + 5) % V, pos[n] = i, slot[n] = 0;
    for (int i = 0; i < 7; i++, n++) tok[n] = (i * 91 + 3) % V, pos[n] = i, slot[n] = 1;
    li[0] = 10;
    li[1] = 17;
    int next[2] = {11, 7};
    gpu_fwd_params(&c, tok, pos, slot, n, li, 2);
    gpu_fwd_params(&g, tok, pos, slot, n, li, 2);
    gpu_fwd_run(&c, 32, NULL, 2, lc);
    gpu_fwd_run(&g, 32, NULL, 2, lg);
    cmp_logits("prefill", lc, lg, 2, V, rtol_small);
    /* decode steps: both sequences, the CPU's greedy token */
    for (int step = 0; step < 3; step++) {
        for (int s = 0; s < 2; s++) {
            tok[s] = argmax(lc + (size_t)s * V, V);
            pos[s] = next[s]++;
            slot[s] = s;
            li[s] = s;
        }
        gpu_fwd_params(&c, tok, pos, slot, 2, li, 2);
        gpu_fwd_params(&g, tok, pos, slot, 2, li, 2);
        gpu_fwd_run(&c, 2, NULL, 2, lc);
        gpu_fwd_run(&g, 2, NULL, 2, lg);
        cmp_logits("decode", lc, lg, 2, V, rtol_small);
    }
    /* a 48-row prefill of slot 2 in a 64-row bucket: two row tiles (cuBLASLt with GS_CUDA_FAST_GEMM=1); logits of 3 rows */
    for (int i = 0; i < 48; i++) tok[i] = (i * 13 + 1) % V, pos[i] = i, slot[i] = 2;
    li[0] = 47;
    li[1] = 20;
    li[2] = 0;
    gpu_fwd_params(&c, tok, pos, slot, 48, li, 3);
    gpu_fwd_params(&g, tok, pos, slot, 48, li, 3);
    gpu_fwd_run(&c, 64, NULL, 3, lc);
    gpu_fwd_run(&g, 64, NULL, 3, lg);
    cmp_logits("prefill 48", lc, lg, 3, V, rtol_large);
    free(lc);
    free(lg);
    gpu_fwd_close(&c);
    gpu_fwd_close(&g);
    eng_backend_destroy(cb);
    eng_backend_destroy(gb);
}

static void test_parity_qwen3(void **state)
{
    (void)state;
    parity(g_qwen3, 2e-3, 2e-2);
}
static void test_parity_qwen2_f32(void **state)
{
    (void)state;
    parity(g_qwen2, 1e-4, 1e-4);
}
static void test_parity_llama(void **state)
{
    (void)state;
    parity(g_llama, 2e-3, 2e-2);
}
static void test_parity_qwen3_moe(void **state)
{
    (void)state;
    parity(g_moe, 2e-3, 2e-2);
}

/* FP8 weights (kernels/cuda/mm_kernels.cuh path 4, the FP8 experts): f32 activations on both backends */
static void test_parity_fp8(void **state)
{
    (void)state;
    parity(g_q8, 2e-3, 2e-2);
    parity(g_moe8, 2e-3, 2e-2);
}

/* ---- through the engine ------------------------------------------------------------------------------ */
typedef test_rt rt;

static void open_rt(rt *x, eng_backend *be, const char *dir, const char *draft, int use_plans)
{
    eng_config ec;
    eng_config_defaults(&ec);
    ec.max_seqs = 4;
    ec.max_step_tokens = 64;
    ec.prefill_chunk = 48;
    ec.max_model_len = 128;
    ec.kv_bytes = 16 << 20;
    ec.use_plans = use_plans;
    test_rt_open(x, be, dir, draft, &ec);
}

#define NREQ 3
#define NTOK 12

typedef struct {
    eng_request r[NREQ];
    int32_t prompt[NREQ][40];
    int32_t out[NREQ][NTOK];
    float lp[NREQ][NTOK];
} batch;

static void run_batch(rt *x, batch *b)
{
    memset(b, 0, sizeof *b);
    const int lens[NREQ] = {5, 40, 17};
    char err[256];
    for (int q = 0; q < NREQ; q++) {
        for (int i = 0; i < lens[q]; i++) b->prompt[q][i] = (q * 101 + i * 29 + 7) % 500;
        eng_request *r = &b->r[q];
        r->prompt = b->prompt[q];
        r->n_prompt = lens[q];
        r->max_tokens = NTOK;
        r->ignore_eos = 1;
        r->sp.top_p = 1;
        r->out_tokens = b->out[q];
        r->out_logprobs = b->lp[q];
        assert_int_equal(eng_submit(x->e, r, NULL, err, sizeof err), 0);
    }
    eng_run_until_idle(x->e);
    for (int q = 0; q < NREQ; q++) assert_int_equal(b->r[q].n_out, NTOK);
}

static void same_tokens(const char *what, const batch *a, const batch *b, double lp_tol)
{
    for (int q = 0; q < NREQ; q++)
        for (int i = 0; i < NTOK; i++) {
            if (a->out[q][i] != b->out[q][i])
                fail_msg("%s: request %d token %d: %d vs %d", what, q, i, a->out[q][i], b->out[q][i]);
            if (lp_tol >= 0 && !(fabs((double)a->lp[q][i] - (double)b->lp[q][i]) <= lp_tol))
                fail_msg("%s: request %d logprob %d: %g vs %g", what, q, i, (double)a->lp[q][i], (double)b->lp[q][i]);
        }
}

static void test_engine_greedy(void **state)
{
    (void)state;
    static batch cpu, plan, eager;
    rt x;
    open_rt(&x, cpu_backend(), g_qwen3, NULL, 1);
    run_batch(&x, &cpu);
    test_rt_close(&x);
    open_rt(&x, cuda_backend(), g_qwen3, NULL, 1);
    run_batch(&x, &plan);
    assert_true(eng_get_stats(x.e)->plan_launches > 0);
    test_rt_close(&x);
    open_rt(&x, cuda_backend(), g_qwen3, NULL, 0);
    run_batch(&x, &eager);
    test_rt_close(&x);
    same_tokens("cpu vs cuda graphs", &cpu, &plan, 0.05);
    same_tokens("cpu vs cuda eager", &cpu, &eager, 0.05);
}

static void spec_vs_plain(const char *target, const char *draft)
{
    static batch plain, spec;
    rt x;
    open_rt(&x, cpu_backend(), target, NULL, 1);
    run_batch(&x, &plain);
    test_rt_close(&x);
    open_rt(&x, cuda_backend(), target, draft, 1);
    run_batch(&x, &spec);
    assert_true(eng_get_stats(x.e)->spec_drafts > 0);
    test_rt_close(&x);
    same_tokens("speculative on cuda vs plain on cpu", &plain, &spec, -1);
}

static void test_spec_dspark(void **state)
{
    (void)state;
    spec_vs_plain(g_qwen3, g_dspark);
}
static void test_spec_dflash(void **state)
{
    (void)state;
    spec_vs_plain(g_qwen3, g_dflash);
}
/* an FP8 target with an FP8 drafter: its stacked context K/V is FP8 codes + derived.ctx_kv_scale */
static void test_spec_fp8(void **state)
{
    (void)state;
    spec_vs_plain(g_q8, g_dflash8);
}

/* FP8 codes and scales reach the GPU as stored: a hot update of the FP8 target on the GPU equals a
 * cold start on the CPU backend, byte for byte */
static void test_fp8_update(void **state)
{
    (void)state;
    static test_sums a, c;
    rt hot, cpu;
    char err[512];
    int status;
    open_rt(&hot, cuda_backend(), g_q8, NULL, 1);
    assert_int_equal(eng_weights_begin(hot.e, 1, ENG_WMODEL_TARGET, ENG_PAUSE_ABORT, "v1", NULL, err, sizeof err, &status), 0);
    if (eng_weights_load_dir(hot.e, g_q8b, NULL, 4096, err, sizeof err, &status) != 0 ||
        eng_weights_finish(hot.e, NULL, err, sizeof err, &status) != 0)
        fail_msg("FP8 update: %s (status %d)", err, status);
    open_rt(&cpu, cpu_backend(), g_q8b, NULL, 1);
    test_checksums(&hot, 0, &a);
    test_checksums(&cpu, 0, &c);
    assert_string_equal(a.buf, c.buf);
    test_rt_close(&hot);
    test_rt_close(&cpu);
}

static void test_hot_update_equals_cold(void **state)
{
    (void)state;
    static batch before, hot_out, cold_out;
    static test_sums a, b, c;
    rt hot, cold, cpu;
    char err[512];
    int status;
    open_rt(&hot, cuda_backend(), g_qwen3, g_dflash, 1);
    run_batch(&hot, &before); /* the plans have run on the old weights */
    const uint64_t th = hot.m->hook_runs, dh = hot.d->hook_runs;
    assert_int_equal(eng_weights_begin(hot.e, 1, ENG_WMODEL_ALL, ENG_PAUSE_ABORT, "v1", NULL, err, sizeof err, &status), 0);
    if (eng_weights_load_dir(hot.e, g_qwen3b, NULL, 4096, err, sizeof err, &status) != 0 ||
        eng_weights_load_dir(hot.e, g_dflashb, "draft.", 4096, err, sizeof err, &status) != 0 ||
        eng_weights_finish(hot.e, NULL, err, sizeof err, &status) != 0)
        fail_msg("update: %s (status %d)", err, status);
    assert_int_equal(hot.m->hook_runs - th, 1);
    assert_int_equal(hot.d->hook_runs - dh, 1);
    assert_int_equal(eng_weights_state(hot.e), ENG_W_READY);
    open_rt(&cold, cuda_backend(), g_qwen3b, g_dflashb, 1);
    open_rt(&cpu, cpu_backend(), g_qwen3b, g_dflashb, 1);
    for (int dr = 0; dr < 2; dr++) {
        test_checksums(&hot, dr, &a);
        test_checksums(&cold, dr, &b);
        test_checksums(&cpu, dr, &c);
        assert_string_equal(a.buf, b.buf);
        assert_string_equal(a.buf, c.buf); /* bit-identical storage on both backends */
        if (dr) assert_non_null(strstr(a.buf, "derived.ctx_kv_weight="));
    }
    run_batch(&hot, &hot_out);
    run_batch(&cold, &cold_out);
    same_tokens("hot-updated vs cold start on cuda", &hot_out, &cold_out, 0); /* logprobs bitwise too */
    test_rt_close(&hot);
    test_rt_close(&cold);
    test_rt_close(&cpu);
}

int main(void)
{
    GPU_TEST_SKIP_WITHOUT_DEVICE();
    const char *base = test_tmpdir("cuda-model");
    if (!base) return 1;
    char b[1024];
    snprintf(b, sizeof b, "%s", base);
    gpu_mkmodel(g_qwen3, b, "qwen3", MDL_ARCH_QWEN3, MDL_DT_BF16, 1, 32, 4, 2, 7, NULL);
    gpu_mkmodel(g_qwen2, b, "qwen2", MDL_ARCH_QWEN2, MDL_DT_F32, 1, 32, 4, 2, 7, NULL);
    gpu_mkmodel(g_llama, b, "llama", MDL_ARCH_LLAMA, MDL_DT_BF16, 0, 64, 2, 1, 7, NULL);
    gpu_mkmodel(g_dspark, b, "dspark", MDL_ARCH_DSPARK, MDL_DT_BF16, 1, 32, 4, 2, 7, g_qwen3);
    gpu_mkmodel(g_dflash, b, "dflash", MDL_ARCH_DFLASH, MDL_DT_BF16, 1, 32, 4, 2, 7, g_qwen3);
    gpu_mkmodel(g_moe, b, "qwen3moe", MDL_ARCH_QWEN3_MOE, MDL_DT_BF16, 0, 32, 4, 2, 9, NULL);
    gpu_mkmodel(g_qwen3b, b, "qwen3b", MDL_ARCH_QWEN3, MDL_DT_BF16, 1, 32, 4, 2, 8, NULL);
    gpu_mkmodel(g_dflashb, b, "dflashb", MDL_ARCH_DFLASH, MDL_DT_BF16, 1, 32, 4, 2, 8, g_qwen3b);
    gpu_mkmodel_fp8(g_q8, b, "qwen3-fp8", MDL_ARCH_QWEN3, MDL_DT_BF16, 1, 32, 4, 2, 7, NULL, 16, 32);
    gpu_mkmodel_fp8(g_q8b, b, "qwen3-fp8b", MDL_ARCH_QWEN3, MDL_DT_BF16, 1, 32, 4, 2, 8, NULL, 16, 32);
    gpu_mkmodel_fp8(g_dflash8, b, "dflash-fp8", MDL_ARCH_DFLASH, MDL_DT_BF16, 1, 32, 4, 2, 7, g_q8, 16, 32);
    gpu_mkmodel_fp8(g_moe8, b, "qwen3moe-fp8", MDL_ARCH_QWEN3_MOE, MDL_DT_BF16, 0, 32, 4, 2, 9, NULL, 16, 32);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parity_qwen3),  cmocka_unit_test(test_parity_qwen2_f32),
        cmocka_unit_test(test_parity_llama),  cmocka_unit_test(test_engine_greedy),
        cmocka_unit_test(test_spec_dspark),   cmocka_unit_test(test_spec_dflash),
        cmocka_unit_test(test_hot_update_equals_cold), cmocka_unit_test(test_parity_qwen3_moe),
        cmocka_unit_test(test_parity_fp8),    cmocka_unit_test(test_spec_fp8),
        cmocka_unit_test(test_fp8_update),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
