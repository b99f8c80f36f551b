/* tests/unit/test_plan.c — arenas, plans and checked replay on the CPU backend (I1, I5).
 * A plan bakes pointers; freeing or reallocating any buffer it references after capture must make a
 * checked replay abort naming the op and pointer, never silently read retired memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "models/mkmodel.h"
#include "test_util.h"

typedef struct {
    eng_backend *be;
    mdl_model *m;
    eng_engine *e;
    char dir[1024];
} fixture;

/* one thread: the abort tests fork, and a child has no pool workers */
static eng_backend *make_backend(int checked)
{
    char err[256];
    eng_backend_config bc = {.arena_bytes = (size_t)1 << 30, .threads = 1, .checked = checked};
    eng_backend *be = eng_backend_cpu_create(&bc, err, sizeof err);
    assert_non_null(be);
    return be;
}

static void open_fixture(fixture *f, const char *name, int use_plans)
{
    char err[512];
    snprintf(f->dir, sizeof f->dir, "%s", test_tmpdir(name));
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    o.tokenizer = 0;
    o.vocab = 300;
    assert_int_equal(mdl_mkmodel(&o, f->dir, err, sizeof err), 0);
    mdl_config cfg;
    assert_int_equal(mdl_config_load(f->dir, &cfg, err, sizeof err), 0);
    f->be = make_backend(1);
    f->m = mdl_model_create(&cfg, f->be, err, sizeof err);
    assert_non_null(f->m);
    assert_int_equal(mdl_model_load_dir(f->m, f->dir, err, sizeof err), 0);
    eng_config ec;
    eng_config_defaults(&ec);
    ec.max_seqs = 4;
    ec.max_step_tokens = 16;
    ec.max_model_len = 64;
    ec.kv_bytes = 1 << 20;
    ec.use_plans = use_plans;
    f->e = eng_create(&ec, f->m, f->be, err, sizeof err);
    assert_non_null(f->e);
}

static void close_fixture(fixture *f)
{
    eng_destroy(f->e);
    mdl_model_destroy(f->m);
    eng_backend_destroy(f->be);
}

/* Runs one greedy request of 4 tokens; returns the tokens. */
static void run_request(eng_engine *e, int32_t out[4])
{
    static const int32_t prompt[] = {5, 17, 42};
    float lps[4];
    eng_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt;
    r.n_prompt = 3;
    r.max_tokens = 4;
    r.ignore_eos = 1;
    r.out_tokens = out;
    r.out_logprobs = lps;
    char err[256];
    assert_int_equal(eng_submit(e, &r, NULL, err, sizeof err), 0);
    eng_run_until_idle(e);
    assert_int_equal(r.n_out, 4);
}

static void test_arena_never_reuses(void **state)
{
    (void)state;
    eng_backend *be = make_backend(1);
    uint8_t *a = be->ops->alloc(be, 1000, "a");
    uint8_t *b = be->ops->alloc(be, 64, "b");
    assert_non_null(a);
    assert_true(be->ops->contains(be, a, 1000));
    assert_false(be->ops->contains(be, a, 1001));
    assert_true(be->ops->contains(be, a + 999, 1));
    for (int i = 0; i < 1000; i++) assert_int_equal(a[i], 0); /* zeroed */
    be->ops->free(be, a);
    assert_false(be->ops->contains(be, a, 1));
    uint8_t *c = be->ops->alloc(be, 1000, "a2");
    assert_true(c > b); /* a retired range is never handed out again */
    eng_alloc_info info;
    assert_int_equal(be->ops->alloc_info(be, a + 10, &info), 0);
    assert_int_equal(info.live, 0);
    assert_string_equal(info.tag, "a");
    assert_int_equal(be->ops->bytes_in_use(be), 64 + 1000);
    eng_backend_destroy(be);
}

static void test_plan_replay_runs_checked(void **state)
{
    (void)state;
    fixture f;
    open_fixture(&f, "plan-ok", 1);
    int32_t a[4], b[4];
    run_request(f.e, a);
    run_request(f.e, b);
    assert_memory_equal(a, b, sizeof a);
    assert_true(eng_get_stats(f.e)->plan_launches > 0);
    close_fixture(&f);
}

static fixture *g_child;
static void replay_after_realloc(void *arg)
{
    (void)arg;
    int32_t out[4];
    run_request(g_child->e, out); /* must abort in checked replay */
}

/* Free a weight a plan reads and allocate a replacement, as a careless reload would. */
static void test_stale_weight_pointer_aborts(void **state)
{
    (void)state;
    fixture f;
    open_fixture(&f, "plan-stale", 1);
    mdl_param *p = &f.m->params[f.m->layer[1].gate_up];
    void *old = p->ptr;
    f.be->ops->free(f.be, old);
    void *fresh = f.be->ops->alloc(f.be, p->bytes, "gate_up.reloaded");
    assert_ptr_not_equal(fresh, old);
    g_child = &f;
    char err[4096];
    int st = test_run_child(replay_after_realloc, NULL, err, sizeof err);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGABRT);
    assert_non_null(strstr(err, "checked replay"));
    assert_non_null(strstr(err, "matmul"));
    assert_non_null(strstr(err, "retired"));
    close_fixture(&f);
}

/* Freeing a step-parameter buffer (not a weight) is caught the same way. */
static void test_stale_step_buffer_aborts(void **state)
{
    (void)state;
    fixture f;
    open_fixture(&f, "plan-stale-kv", 1);
    int32_t out[4];
    run_request(f.e, out);
    f.be->ops->free(f.be, f.m->inv_freq);
    g_child = &f;
    char err[4096];
    int st = test_run_child(replay_after_realloc, NULL, err, sizeof err);
    assert_true(WIFSIGNALED(st));
    assert_non_null(strstr(err, "qk_norm_rope"));
    close_fixture(&f);
}

/* The same abuse with plans off still runs the tape through the same check (eager path). */
static void test_eager_also_checked(void **state)
{
    (void)state;
    fixture f;
    open_fixture(&f, "eager-stale", 0);
    f.be->ops->free(f.be, f.m->params[f.m->final_norm].ptr);
    g_child = &f;
    char err[4096];
    int st = test_run_child(replay_after_realloc, NULL, err, sizeof err);
    assert_true(WIFSIGNALED(st));
    assert_non_null(strstr(err, "rmsnorm"));
    close_fixture(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_never_reuses),
        cmocka_unit_test(test_plan_replay_runs_checked),
        cmocka_unit_test(test_stale_weight_pointer_aborts),
        cmocka_unit_test(test_stale_step_buffer_aborts),
        cmocka_unit_test(test_eager_also_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
