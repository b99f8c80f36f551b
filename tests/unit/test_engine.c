/* tests/unit/test_engine.c — KV block pool, prefix caching and scheduling invariants.
 * Prefix reuse must be invisible in the output: a request served partly from cached blocks gives
 * bitwise the same tokens and logprobs as on an engine with prefix caching off. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "engine/kvpool.h"
#include "models/mkmodel.h"
#include "test_util.h"

static void test_kvpool_states(void **state)
{
    (void)state;
    eng_kvpool p;
    assert_int_equal(eng_kvpool_init(&p, 4, 2), 0);
    int32_t a = eng_kvpool_alloc(&p), b = eng_kvpool_alloc(&p);
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    const int32_t t1[2] = {7, 8}, t2[2] = {9, 10};
    uint64_t h1 = eng_kvpool_register(&p, a, ENG_KV_ROOT_HASH, t1);
    eng_kvpool_register(&p, b, h1, t2);
    assert_int_equal(eng_kvpool_lookup(&p, ENG_KV_ROOT_HASH, t1), a);
    assert_int_equal(eng_kvpool_lookup(&p, h1, t2), b);
    assert_int_equal(eng_kvpool_lookup(&p, ENG_KV_ROOT_HASH, t2), -1); /* same tokens, other prefix */
    eng_kvpool_release(&p, a);
    eng_kvpool_release(&p, b);
    assert_int_equal(eng_kvpool_available(&p), 4);
    assert_int_equal(eng_kvpool_in_use(&p), 0);
    /* free blocks go first, then cached ones in LRU order (a was released first) */
    assert_int_equal(eng_kvpool_alloc(&p), 2);
    assert_int_equal(eng_kvpool_alloc(&p), 3);
    assert_int_equal(eng_kvpool_alloc(&p), a);
    assert_int_equal(eng_kvpool_lookup(&p, ENG_KV_ROOT_HASH, t1), -1); /* evicted */
    assert_int_equal(eng_kvpool_lookup(&p, h1, t2), b);
    eng_kvpool_acquire(&p, b); /* reuse takes it off the LRU */
    assert_int_equal(eng_kvpool_alloc(&p), -1);
    eng_kvpool_release(&p, b);
    eng_kvpool_reset_cache(&p);
    assert_int_equal(eng_kvpool_lookup(&p, h1, t2), -1);
    assert_int_equal(eng_kvpool_available(&p), 1);
    eng_kvpool_free(&p);
}

typedef struct {
    eng_backend *be;
    mdl_model *m;
    eng_engine *e;
} rt;

static const char *g_dir;

static void open_rt(rt *x, int prefix_caching, int blocks)
{
    char err[512];
    mdl_config cfg;
    assert_int_equal(mdl_config_load(g_dir, &cfg, err, sizeof err), 0);
    eng_backend_config bc = {.arena_bytes = (size_t)1 << 30, .threads = 2, .checked = 1};
    x->be = eng_backend_cpu_create(&bc, err, sizeof err);
    x->m = mdl_model_create(&cfg, x->be, err, sizeof err);
    assert_int_equal(mdl_model_load_dir(x->m, g_dir, err, sizeof err), 0);
    eng_config ec;
    eng_config_defaults(&ec);
    ec.max_seqs = 4;
    ec.max_step_tokens = 32;
    ec.prefill_chunk = 20;
    ec.block_size = 16;
    ec.max_model_len = 128;
    size_t per_block = 2u * (size_t)cfg.layers * 16 * (size_t)cfg.kv_heads * (size_t)cfg.head_dim * 4;
    ec.kv_bytes = (size_t)blocks * per_block;
    ec.prefix_caching = prefix_caching;
    x->e = eng_create(&ec, x->m, x->be, err, sizeof err);
    assert_non_null(x->e);
}

static void close_rt(rt *x)
{
    eng_destroy(x->e);
    mdl_model_destroy(x->m);
    eng_backend_destroy(x->be);
}

typedef struct {
    eng_request r;
    int32_t prompt[100];
    int32_t out[16];
    float lp[16];
} req;

static void make_req(req *q, int n_prompt, int seed_tail, int max_tokens)
{
    memset(q, 0, sizeof *q);
    for (int i = 0; i < n_prompt; i++) q->prompt[i] = (i * 37 + 11) % 250;
    for (int i = n_prompt - 5; i < n_prompt; i++) q->prompt[i] = (i * 13 + seed_tail) % 250;
    q->r.prompt = q->prompt;
    q->r.n_prompt = n_prompt;
    q->r.max_tokens = max_tokens;
    q->r.ignore_eos = 1;
    q->r.sp.top_p = 1;
    q->r.out_tokens = q->out;
    q->r.out_logprobs = q->lp;
}

static void submit(eng_engine *e, req *q)
{
    char err[256];
    assert_int_equal(eng_submit(e, &q->r, NULL, err, sizeof err), 0);
}

static void test_prefix_hits_are_invisible(void **state)
{
    (void)state;
    rt cached, plain;
    open_rt(&cached, 1, 64);
    open_rt(&plain, 0, 64);
    req a, b, b2;
    make_req(&a, 60, 1, 8);
    make_req(&b, 70, 2, 8); /* shares the first 55 tokens with a: 3 full blocks */
    submit(cached.e, &a);
    eng_run_until_idle(cached.e);
    submit(cached.e, &b);
    eng_run_until_idle(cached.e);
    const eng_stats *st = eng_get_stats(cached.e);
    assert_int_equal(st->prefix_cache_queries, 130);
    assert_int_equal(st->prefix_cache_hits, 48);
    make_req(&b2, 70, 2, 8);
    submit(plain.e, &b2);
    eng_run_until_idle(plain.e);
    assert_int_equal(eng_get_stats(plain.e)->prefix_cache_hits, 0);
    assert_memory_equal(b.out, b2.out, sizeof b.out);
    assert_memory_equal(b.lp, b2.lp, sizeof b.lp); /* bitwise */
    /* after a reset nothing is reused */
    eng_reset_prefix_cache(cached.e);
    req c;
    make_req(&c, 70, 2, 8);
    submit(cached.e, &c);
    eng_run_until_idle(cached.e);
    assert_int_equal(eng_get_stats(cached.e)->prefix_cache_hits, 48);
    assert_memory_equal(c.lp, b2.lp, sizeof c.lp);
    /* everything released: all blocks free or cached */
    assert_int_equal(eng_kv_blocks_in_use(cached.e), 0);
    close_rt(&cached);
    close_rt(&plain);
}

/* Concurrent sharers, then more work than blocks: eviction keeps outputs right. */
static void test_sharing_and_eviction(void **state)
{
    (void)state;
    rt cached, plain;
    open_rt(&cached, 1, 16); /* 16 blocks: 3 requests of 6 blocks do not all fit at once */
    open_rt(&plain, 0, 16);
    req q[6], p[6];
    for (int i = 0; i < 6; i++) {
        make_req(&q[i], 80, i % 2, 10);
        make_req(&p[i], 80, i % 2, 10);
        submit(cached.e, &q[i]);
        submit(plain.e, &p[i]);
    }
    eng_run_until_idle(cached.e);
    eng_run_until_idle(plain.e);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(q[i].r.n_out, 10);
        assert_memory_equal(q[i].out, p[i].out, sizeof q[i].out);
        assert_memory_equal(q[i].lp, p[i].lp, sizeof q[i].lp);
    }
    assert_true(eng_get_stats(cached.e)->prefix_cache_hits > 0);
    assert_int_equal(eng_kv_blocks_in_use(cached.e), 0);
    close_rt(&cached);
    close_rt(&plain);
}

static void test_cancel_frees_blocks(void **state)
{
    (void)state;
    rt x;
    open_rt(&x, 1, 16);
    req a;
    make_req(&a, 40, 0, 16);
    submit(x.e, &a);
    eng_step(x.e);
    assert_true(eng_kv_blocks_in_use(x.e) > 0);
    atomic_store(&a.r.cancel, 1);
    eng_step(x.e);
    assert_int_equal(a.r.finish, ENG_FINISH_ABORT);
    assert_int_equal(eng_kv_blocks_in_use(x.e), 0);
    assert_int_equal(eng_num_running(x.e), 0);
    close_rt(&x);
}

static int setup(void **state)
{
    (void)state;
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("engine"));
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    o.tokenizer = 0;
    o.vocab = 256;
    char err[512];
    assert_int_equal(mdl_mkmodel(&o, dir, err, sizeof err), 0);
    g_dir = dir;
    return 0;
}

/* n_cached: the prompt tokens taken from the prefix cache at admission (full shared blocks times
 * the block size); a prompt-logprobs request never reuses the cache and reports 0. */
static void test_cached_tokens_per_request(void **state)
{
    (void)state;
    rt x;
    open_rt(&x, 1, 64);
    req a, b, c;
    make_req(&a, 60, 1, 4);
    make_req(&b, 60, 1, 4); /* the same 60 tokens: 3 full blocks of 16 (the 4th is partial) */
    submit(x.e, &a);
    eng_run_until_idle(x.e);
    assert_int_equal(a.r.n_cached, 0);
    submit(x.e, &b);
    eng_run_until_idle(x.e);
    assert_int_equal(b.r.n_cached, 48);
    assert_memory_equal(a.out, b.out, sizeof a.out);
    static float plp[100];
    static int32_t prank[100];
    make_req(&c, 60, 1, 4);
    c.r.out_prompt_logprobs = plp;
    c.r.out_prompt_rank = prank;
    submit(x.e, &c);
    eng_run_until_idle(x.e);
    assert_int_equal(c.r.n_cached, 0);
    /* prefix caching off: always 0 */
    rt plain;
    open_rt(&plain, 0, 64);
    req d, d2;
    make_req(&d, 60, 1, 4);
    make_req(&d2, 60, 1, 4);
    submit(plain.e, &d);
    eng_run_until_idle(plain.e);
    submit(plain.e, &d2);
    eng_run_until_idle(plain.e);
    assert_int_equal(d2.r.n_cached, 0);
    close_rt(&plain);
    close_rt(&x);
}

/* cache_salt: equal salts share blocks, different salts (and salted vs unsalted) never do; the
 * output does not depend on the salt. */
static void test_cache_salt(void **state)
{
    (void)state;
    assert_true(eng_cache_salt_hash("", 0) != 0);
    assert_true(eng_cache_salt_hash("a", 1) != eng_cache_salt_hash("b", 1));
    assert_true(eng_kvpool_root(0) == ENG_KV_ROOT_HASH);
    assert_true(eng_kvpool_root(eng_cache_salt_hash("a", 1)) != ENG_KV_ROOT_HASH);
    rt x;
    open_rt(&x, 1, 64);
    const uint64_t sa = eng_cache_salt_hash("salt-A", 6), sb = eng_cache_salt_hash("salt-B", 6);
    req q[6];
    const uint64_t salts[6] = {sa, sa, sb, 0, 0, sb};
    const int want[6] = {0, 48, 0, 0, 48, 48};
    for (int i = 0; i < 6; i++) {
        make_req(&q[i], 60, 1, 4);
        q[i].r.cache_salt = salts[i];
        submit(x.e, &q[i]);
        eng_run_until_idle(x.e);
        assert_int_equal(q[i].r.n_cached, want[i]);
        assert_memory_equal(q[i].out, q[0].out, sizeof q[0].out);
        assert_memory_equal(q[i].lp, q[0].lp, sizeof q[0].lp);
    }
    assert_int_equal(eng_kv_blocks_in_use(x.e), 0);
    close_rt(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kvpool_states),
        cmocka_unit_test(test_prefix_hits_are_invisible),
        cmocka_unit_test(test_sharing_and_eviction),
        cmocka_unit_test(test_cancel_frees_blocks),
        cmocka_unit_test(test_cached_tokens_per_request),
        cmocka_unit_test(test_cache_salt),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
