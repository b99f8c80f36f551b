/* tests/gpu/test_cuda_sleep.c — sleep / wake-up on the CUDA backend's VMM arena (eng_sleep).
 *
 *  - level 1: device memory is given back (cudaMemGetInfo free grows by about the released granules)
 *    and taken again at wake-up; afterwards the CUDA graphs captured at start replay unchanged (same
 *    plan pointers, guard passes) and give bitwise the same greedy tokens and logprobs; every weight
 *    checksum is identical.
 *  - level 2: generation refused after wake-up until a full update from disk; then the same again.
 * Exits 77 (skipped) without a usable GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "../unit/test_rt.h"
#include "../unit/test_util.h"
#include "engine/backend/backend_cuda.h"
#include "engine/engine.h"
#include "engine/weights.h"
#include "gpu_test.h"
#include "models/mkmodel.h"

static char g_dir[1024], g_model[1100];

static size_t dev_free(void)
{
    size_t f = 0, t = 0;
    assert_int_equal(cudaMemGetInfo(&f, &t), cudaSuccess);
    return f;
}

typedef struct {
    eng_request r;
    int32_t prompt[8], out[16];
    float lp[16];
} req;

static int generate(test_rt *x, req *q)
{
    memset(q, 0, sizeof *q);
    for (int i = 0; i < 8; i++) q->prompt[i] = (i * 37 + 11) % 1000;
    q->r.prompt = q->prompt;
    q->r.n_prompt = 8;
    q->r.max_tokens = 16;
    q->r.ignore_eos = 1;
    q->r.out_tokens = q->out;
    q->r.out_logprobs = q->lp;
    char err[256];
    int busy = 0;
    if (eng_submit(x->e, &q->r, &busy, err, sizeof err) != 0) return busy ? -2 : -1;
    eng_run_until_idle(x->e);
    return 0;
}

static void test_sleep_levels(void **state)
{
    (void)state;
    char err[512];
    int st;
    eng_backend_config bc = {.arena_bytes = (size_t)4 << 30, .threads = 0, .checked = 1};
    eng_backend *be = eng_backend_cuda_create(&bc, err, sizeof err);
    if (!be) fail_msg("%s", err);
    eng_config ec;
    eng_config_defaults(&ec);
    ec.max_seqs = 4;
    ec.max_step_tokens = 32;
    ec.max_model_len = 256;
    ec.kv_bytes = (size_t)256 << 20;
    test_rt x;
    test_rt_open(&x, be, g_model, NULL, &ec);
    req a, b;
    assert_int_equal(generate(&x, &a), 0);
    test_sums *s0 = malloc(sizeof *s0), *s1 = malloc(sizeof *s1);
    test_checksums(&x, 0, s0);
    void *p0[8], *p1[8];
    const int rows[8] = {1, 2, 4, 8, 16, 32, 32, 32};
    for (int i = 0; i < 8; i++) p0[i] = eng_plan_for_rows(x.e, rows[i]);
    for (int level = 1; level <= 2; level++) {
        const size_t f0 = dev_free();
        assert_int_equal(eng_sleep(x.e, level, 0, err, sizeof err, &st), 0);
        const size_t f1 = dev_free();
        eng_sleep_info si;
        eng_sleep_get_info(x.e, &si);
        const size_t rel = si.released[0] + si.released[1];
        print_message("level %d: released %zu MiB (weights %zu, kv %zu); device free %zu -> %zu MiB\n", level,
                      rel >> 20, si.released[0] >> 20, si.released[1] >> 20, f0 >> 20, f1 >> 20);
        assert_true(si.released[0] > si.tag_bytes[0] / 2);
        assert_true(f1 >= f0 + rel - ((size_t)64 << 20));
        assert_int_equal(generate(&x, &b), -2);
        assert_int_equal(eng_wake(x.e, 0, err, sizeof err, &st), 0);
        const size_t f2 = dev_free();
        assert_true(f2 <= f0 + ((size_t)64 << 20)); /* taken again */
        if (level == 2) {
            assert_int_equal(generate(&x, &b), -2); /* weights inconsistent */
            assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_TARGET, ENG_PAUSE_WAIT, NULL, NULL, err, sizeof err,
                                               &st),
                             0);
            if (eng_weights_load_dir(x.e, g_model, NULL, (size_t)32 << 20, err, sizeof err, &st) != 0) fail_msg("%s", err);
            if (eng_weights_finish(x.e, NULL, err, sizeof err, &st) != 0) fail_msg("%s", err);
        }
        test_checksums(&x, 0, s1);
        assert_string_equal(s0->buf, s1->buf);
        assert_int_equal(eng_guard_check(x.e, err, sizeof err), 0);
        assert_int_equal(generate(&x, &b), 0);
        assert_memory_equal(a.out, b.out, sizeof a.out);
        assert_memory_equal(a.lp, b.lp, sizeof a.lp);
        for (int i = 0; i < 8; i++) p1[i] = eng_plan_for_rows(x.e, rows[i]);
        assert_memory_equal(p0, p1, sizeof p0); /* the graphs captured at start */
    }
    free(s0);
    free(s1);
    test_rt_close(&x);
}

int main(void)
{
    GPU_TEST_SKIP_WITHOUT_DEVICE();
    const char *d = test_tmpdir("cuda_sleep");
    if (!d) return 1;
    snprintf(g_dir, sizeof g_dir, "%s", d);
    snprintf(g_model, sizeof g_model, "%s/t", g_dir);
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    o.tokenizer = 0;
    o.hidden = 1024;
    o.heads = 16;
    o.kv_heads = 8;
    o.head_dim = 64;
    o.intermediate = 4096;
    o.layers = 4;
    o.vocab = 1000;
    o.seed = 3;
    char err[512];
    if (mdl_mkmodel(&o, g_model, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sleep_levels)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
