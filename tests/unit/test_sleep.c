/* tests/unit/test_sleep.c — releasing memory with stable addresses (eng_sleep / eng_wake).
 * After sleep level 1 + wake: greedy output bitwise identical with the same plans (no re-capture:
 * the plan pointers and the guard are unchanged), every weight checksum identical. Level 2 + wake:
 * generation and partial updates are refused until a complete full update. While asleep: RSS
 * (/proc/self/statm) is lower by about the released bytes, generation and weight updates are
 * refused. The backend runs checked, so released pages are PROT_NONE: any touch while asleep
 * would crash the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/backend/arena.h"
#include "engine/engine.h"
#include "engine/engine_internal.h" /* white-box: the KV allocations */
#include "engine/weights.h"
#include "models/mkmodel.h"
#include "test_rt.h"
#include "test_util.h"

static char g_dir[1024], T0[1100], D0[1100];

static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    unsigned long size = 0, res = 0;
    assert_int_equal(fscanf(f, "%lu %lu", &size, &res), 2);
    fclose(f);
    return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

static void open_rt_draft(test_rt *x, int checked, const char *draft)
{
    char err[512];
    eng_backend_config bc = {.arena_bytes = (size_t)1 << 30, .threads = 1, .checked = checked};
    eng_backend *be = eng_backend_cpu_create(&bc, err, sizeof err);
    if (!be) fail_msg("%s", err);
    eng_config ec;
    eng_config_defaults(&ec);
    ec.max_seqs = 4;
    ec.max_step_tokens = 32;
    ec.max_model_len = 128;
    ec.kv_bytes = 16 << 20;
    test_rt_open(x, be, T0, draft, &ec);
}

static void open_rt(test_rt *x, int checked) { open_rt_draft(x, checked, NULL); }

typedef struct {
    eng_request r;
    int32_t prompt[8], out[16];
    float lp[16];
} req;

static int generate(test_rt *x, req *q, char *err, size_t errlen)
{
    memset(q, 0, sizeof *q);
    for (int i = 0; i < 8; i++) q->prompt[i] = (i * 37 + 11) % 1000;
    q->r.prompt = q->prompt;
    q->r.n_prompt = 8;
    q->r.max_tokens = 16;
    q->r.ignore_eos = 1;
    q->r.out_tokens = q->out;
    q->r.out_logprobs = q->lp;
    int busy = 0;
    if (eng_submit(x->e, &q->r, &busy, err, errlen) != 0) return busy ? -2 : -1;
    eng_run_until_idle(x->e);
    return 0;
}

/* One full update from the checkpoint folder (all tensors in one bucket). */
static int full_update(test_rt *x, int full, char *err, size_t errlen, int *status)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", T0);
    mdl_st_file f;
    assert_int_equal(mdl_st_open(path, &f, err, errlen), 0);
    int rc = eng_weights_begin(x->e, full, ENG_WMODEL_TARGET, ENG_PAUSE_WAIT, "again", NULL, err, errlen, status);
    if (rc == 0) rc = eng_weights_bucket(x->e, f.tensors, f.n, "bucket", err, errlen, status);
    if (rc == 0) rc = eng_weights_finish(x->e, NULL, err, errlen, status);
    mdl_st_close(&f);
    return rc;
}

/* A full update of both models (model "all": drafter tensors prefixed "draft."). */
static void full_update_all(test_rt *x)
{
    char err[512], path[1200];
    int st;
    assert_int_equal(eng_weights_begin(x->e, 1, ENG_WMODEL_ALL, ENG_PAUSE_WAIT, NULL, NULL, err, sizeof err, &st), 0);
    const char *dirs[2] = {T0, D0};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/model.safetensors", dirs[k]);
        mdl_st_file f;
        assert_int_equal(mdl_st_open(path, &f, err, sizeof err), 0);
        mdl_st_tensor *t = calloc(f.n, sizeof *t);
        char (*names)[160] = calloc(f.n, 160);
        for (size_t i = 0; i < f.n; i++) {
            t[i] = f.tensors[i];
            snprintf(names[i], 160, "%s%s", k ? "draft." : "", f.tensors[i].name);
            t[i].name = names[i];
        }
        if (eng_weights_bucket(x->e, t, f.n, "bucket", err, sizeof err, &st) != 0) fail_msg("%s", err);
        free(t);
        free(names);
        mdl_st_close(&f);
    }
    if (eng_weights_finish(x->e, NULL, err, sizeof err, &st) != 0) fail_msg("%s", err);
}

static void plan_ptrs(test_rt *x, void **out)
{
    for (int b = 0; b < x->e->n_buckets; b++) out[b] = eng_plan_for_rows(x->e, x->e->bucket_rows[b]);
}

/* A checked runtime and what sleep + wake must reproduce: the greedy output (a), the target's
 * checksums (s0; s1 allocated for the later read) and the plan pointers (p0). */
static void open_with_baseline(test_rt *x, req *a, test_sums **s0, test_sums **s1, void **p0)
{
    char err[512];
    open_rt(x, 1);
    assert_int_equal(generate(x, a, err, sizeof err), 0);
    *s0 = malloc(sizeof **s0);
    *s1 = malloc(sizeof **s1);
    assert_non_null(*s0);
    assert_non_null(*s1);
    test_checksums(x, 0, *s0);
    plan_ptrs(x, p0);
}

static void test_level1_identical(void **state)
{
    (void)state;
    test_rt x;
    char err[512];
    int st;
    req a, b;
    test_sums *s0, *s1;
    void *p0[MAX_BUCKETS], *p1[MAX_BUCKETS];
    open_with_baseline(&x, &a, &s0, &s1, p0);
    const int nb0 = x.e->n_buckets;
    const uint64_t launches0 = eng_get_stats(x.e)->plan_launches;
    assert_true(launches0 > 0);

    const size_t r0 = rss_bytes();
    assert_int_equal(eng_sleep(x.e, 1, ENG_MEM_ALL, err, sizeof err, &st), 0);
    const size_t r1 = rss_bytes();
    eng_sleep_info si;
    eng_sleep_get_info(x.e, &si);
    assert_int_equal(si.asleep, ENG_MEM_ALL);
    assert_int_equal(si.weights_level, 1);
    assert_true(si.released[0] > si.tag_bytes[0] * 9 / 10); /* weights: nearly every page */
    assert_true(si.released[1] >= si.tag_bytes[1] - 8192);  /* KV: page-aligned, 1 MiB+ each */
    assert_int_equal(si.backup_bytes, si.tag_bytes[0]);
    /* level 1 on the CPU: the backup is host memory too, so RSS may not drop by the weights; it must
     * not grow by them (they moved, they were not copied) */
    assert_true(r1 <= r0 + ((size_t)2 << 20));
    print_message("level 1: RSS %zu -> %zu KiB (released %zu weights + %zu kv bytes, backup %zu)\n", r0 >> 10,
                  r1 >> 10, si.released[0], si.released[1], si.backup_bytes);

    /* asleep: generation, updates and checksums refused; a second sleep is a no-op */
    assert_int_equal(generate(&x, &b, err, sizeof err), -2);
    assert_non_null(strstr(err, "asleep"));
    assert_int_not_equal(full_update(&x, 1, err, sizeof err, &st), 0);
    assert_int_equal(st, 409);
    assert_int_equal(eng_weights_checksums(x.e, 0, test_sums_add, s1), -3);
    assert_int_equal(eng_sleep(x.e, 1, 0, err, sizeof err, &st), 0);
    assert_int_equal(eng_is_sleeping(x.e), ENG_MEM_ALL);

    assert_int_equal(eng_wake(x.e, 0, err, sizeof err, &st), 0);
    assert_int_equal(eng_is_sleeping(x.e), 0);
    assert_int_equal(eng_wake(x.e, 0, err, sizeof err, &st), 0); /* awake: a no-op */
    test_checksums(&x, 0, s1);
    assert_string_equal(s0->buf, s1->buf);
    assert_int_equal(eng_guard_check(x.e, err, sizeof err), 0);
    assert_int_equal(generate(&x, &b, err, sizeof err), 0);
    assert_memory_equal(a.out, b.out, sizeof a.out);
    assert_memory_equal(a.lp, b.lp, sizeof a.lp);
    /* the same plans replayed: none captured again */
    plan_ptrs(&x, p1);
    assert_int_equal(x.e->n_buckets, nb0);
    assert_memory_equal(p0, p1, (size_t)nb0 * sizeof p0[0]);
    assert_true(eng_get_stats(x.e)->plan_launches > launches0);
    eng_weights_info wi;
    eng_weights_get_info(x.e, &wi);
    assert_int_equal(wi.state, ENG_W_READY);
    free(s0);
    free(s1);
    test_rt_close(&x);
}

static void test_level2_needs_full_update(void **state)
{
    (void)state;
    test_rt x;
    char err[512];
    int st;
    req a, b;
    test_sums *s0, *s1;
    void *p0[MAX_BUCKETS], *p1[MAX_BUCKETS];
    open_with_baseline(&x, &a, &s0, &s1, p0);

    const size_t r0 = rss_bytes();
    assert_int_equal(eng_sleep(x.e, 2, ENG_MEM_ALL, err, sizeof err, &st), 0);
    const size_t r1 = rss_bytes();
    eng_sleep_info si;
    eng_sleep_get_info(x.e, &si);
    assert_int_equal(si.backup_bytes, 0);
    /* the weights were resident (loaded): RSS drops by at least what was released of them */
    print_message("level 2: RSS %zu -> %zu KiB (released %zu weights + %zu kv bytes)\n", r0 >> 10, r1 >> 10,
                  si.released[0], si.released[1]);
    assert_true(r1 + si.released[0] <= r0 + ((size_t)1 << 20));

    /* wake the weights only (verl / slime: weights first, update, then the KV cache) */
    assert_int_equal(eng_wake(x.e, ENG_MEM_WEIGHTS, err, sizeof err, &st), 0);
    assert_int_equal(eng_is_sleeping(x.e), ENG_MEM_KV);
    eng_weights_info wi;
    eng_weights_get_info(x.e, &wi);
    assert_int_equal(wi.state, ENG_W_INCONSISTENT);
    assert_non_null(strstr(wi.reason, "sleep level 2"));
    /* a partial update cannot repair them */
    assert_int_not_equal(full_update(&x, 0, err, sizeof err, &st), 0);
    assert_int_equal(st, 409);
    assert_int_equal(eng_wake(x.e, ENG_MEM_KV, err, sizeof err, &st), 0);
    assert_int_equal(generate(&x, &b, err, sizeof err), -2); /* 503: the weights are inconsistent */
    assert_non_null(strstr(err, "sleep level 2"));
    /* the full update (the KV cache may sleep or not meanwhile): service again, same output */
    assert_int_equal(eng_sleep(x.e, 1, ENG_MEM_KV, err, sizeof err, &st), 0);
    if (full_update(&x, 1, err, sizeof err, &st) != 0) fail_msg("%s", err);
    assert_int_equal(eng_wake(x.e, ENG_MEM_KV, err, sizeof err, &st), 0);
    eng_weights_get_info(x.e, &wi);
    assert_int_equal(wi.state, ENG_W_READY);
    test_checksums(&x, 0, s1);
    assert_string_equal(s0->buf, s1->buf);
    assert_int_equal(generate(&x, &b, err, sizeof err), 0);
    assert_memory_equal(a.out, b.out, sizeof a.out);
    assert_memory_equal(a.lp, b.lp, sizeof a.lp);
    plan_ptrs(&x, p1);
    assert_memory_equal(p0, p1, (size_t)x.e->n_buckets * sizeof p0[0]);
    assert_int_equal(eng_guard_check(x.e, err, sizeof err), 0);
    free(s0);
    free(s1);
    test_rt_close(&x);
}

/* With a drafter (DSpark): its weights and its KV cache sleep too; the speculative trace (drafts,
 * acceptance) is identical after level 1, and after level 2 + a full update of both models. */
static void test_spec_drafter(void **state)
{
    (void)state;
    test_rt x;
    open_rt_draft(&x, 1, D0);
    char err[512];
    int st;
    req a, b;
    assert_int_equal(generate(&x, &a, err, sizeof err), 0);
    assert_true(a.r.spec_drafts > 0);
    test_sums *t0 = malloc(sizeof *t0), *d0 = malloc(sizeof *d0), *t1 = malloc(sizeof *t1), *d1 = malloc(sizeof *d1);
    test_checksums(&x, 0, t0);
    test_checksums(&x, 1, d0);
    for (int level = 1; level <= 2; level++) {
        assert_int_equal(eng_sleep(x.e, level, 0, err, sizeof err, &st), 0);
        eng_sleep_info si;
        eng_sleep_get_info(x.e, &si);
        assert_true(si.released[1] > 0);
        assert_int_equal(eng_wake(x.e, 0, err, sizeof err, &st), 0);
        if (level == 2) {
            assert_int_equal(generate(&x, &b, err, sizeof err), -2);
            full_update_all(&x);
        }
        test_checksums(&x, 0, t1);
        test_checksums(&x, 1, d1);
        assert_string_equal(t0->buf, t1->buf);
        assert_string_equal(d0->buf, d1->buf);
        assert_int_equal(generate(&x, &b, err, sizeof err), 0);
        assert_memory_equal(a.out, b.out, sizeof a.out);
        assert_int_equal(a.r.spec_drafts, b.r.spec_drafts);
        assert_int_equal(a.r.spec_accepted, b.r.spec_accepted);
    }
    free(t0);
    free(d0);
    free(t1);
    free(d1);
    test_rt_close(&x);
}

/* KV only: the weights stay (no backup), and a weight update may run while the KV cache sleeps. */
static void test_kv_only_and_refusals(void **state)
{
    (void)state;
    test_rt x;
    open_rt(&x, 0);
    char err[512];
    int st;
    req a, b;
    assert_int_equal(generate(&x, &a, err, sizeof err), 0);
    assert_int_equal(eng_sleep(x.e, 3, 0, err, sizeof err, &st), -1);
    assert_int_equal(st, 400);
    assert_int_equal(eng_sleep(x.e, 1, 4, err, sizeof err, &st), -1);
    assert_int_equal(st, 400);
    /* a weight session open: 409 */
    assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_TARGET, ENG_PAUSE_WAIT, NULL, NULL, err, sizeof err, &st), 0);
    assert_int_equal(eng_sleep(x.e, 1, 0, err, sizeof err, &st), -1);
    assert_int_equal(st, 409);
    assert_int_equal(eng_weights_abort(x.e, err, sizeof err, &st), 0);

    assert_int_equal(eng_sleep(x.e, 2, ENG_MEM_KV, err, sizeof err, &st), 0);
    eng_sleep_info si;
    eng_sleep_get_info(x.e, &si);
    assert_int_equal(si.asleep, ENG_MEM_KV);
    assert_int_equal(si.backup_bytes, 0);
    assert_int_equal(generate(&x, &b, err, sizeof err), -2);
    if (full_update(&x, 1, err, sizeof err, &st) != 0) fail_msg("%s", err);
    assert_int_equal(eng_wake(x.e, 0, err, sizeof err, &st), 0);
    eng_weights_info wi;
    eng_weights_get_info(x.e, &wi);
    assert_int_equal(wi.state, ENG_W_READY);
    assert_int_equal(generate(&x, &b, err, sizeof err), 0);
    assert_memory_equal(a.out, b.out, sizeof a.out);
    /* destroyed while asleep (shutdown during sleep): nothing leaks, nothing touches released memory */
    assert_int_equal(eng_sleep(x.e, 1, 0, err, sizeof err, &st), 0);
    test_rt_close(&x);
}

/* The arena's release spans: whole granules only, never one a live neighbour (or the free tail)
 * touches; adjacent released ranges merge (w0 + w1). */
typedef struct {
    uint8_t *p[8];
    size_t n[8];
    int k;
} spans;
static void add_span(uint8_t *p, size_t n, void *u)
{
    spans *s = u;
    s->p[s->k] = p;
    s->n[s->k++] = n;
}

static void test_arena_spans(void **state)
{
    (void)state;
    eng_arena a;
    static uint8_t region[64 * 4096] __attribute__((aligned(4096)));
    eng_arena_init(&a, region, sizeof region);
    uint8_t *w0 = eng_arena_take(&a, 100, 64, "w0");           /* [0, 100) */
    uint8_t *w1 = eng_arena_take(&a, 3 * 4096, 64, "w1");      /* [128, ...) */
    uint8_t *o = eng_arena_take(&a, 64, 64, "other");          /* a live neighbour */
    uint8_t *k = eng_arena_take(&a, 4 * 4096, 4096, "kv");     /* page-aligned */
    uint8_t *d = eng_arena_take(&a, 4096, 4096, "dead");
    uint8_t *k2 = eng_arena_take(&a, 2 * 4096 + 10, 4096, "kv2");
    assert_non_null(eng_arena_retire(&a, d));
    void *set1[] = {w0, w1, w1};
    spans s = {.k = 0};
    assert_int_equal(eng_arena_release_spans(&a, set1, 3, 4096, add_span, &s), 0);
    /* w0 + w1 cover [0, 12416): pages 0..2 whole; page 3 holds "other" */
    assert_int_equal(s.k, 1);
    assert_ptr_equal(s.p[0], region);
    assert_int_equal(s.n[0], 3 * 4096);
    void *set2[] = {k, k2};
    s.k = 0;
    assert_int_equal(eng_arena_release_spans(&a, set2, 2, 4096, add_span, &s), 0);
    /* kv whole; kv2 but its last page, which holds the bump pointer (a later alloc goes there) */
    assert_int_equal(s.k, 2);
    assert_ptr_equal(s.p[0], k);
    assert_int_equal(s.n[0], 4 * 4096);
    assert_ptr_equal(s.p[1], k2);
    assert_int_equal(s.n[1], 2 * 4096);
    void *bad[] = {w1 + 64};
    assert_int_equal(eng_arena_release_spans(&a, bad, 1, 4096, add_span, &s), -1);
    void *dead[] = {d};
    assert_int_equal(eng_arena_release_spans(&a, dead, 1, 4096, add_span, &s), -1);
    (void)o;
    eng_arena_release(&a);
}

static int setup(void **state)
{
    (void)state;
    const char *d = test_tmpdir("sleep");
    if (!d) return -1;
    snprintf(g_dir, sizeof g_dir, "%s", d);
    snprintf(T0, sizeof T0, "%s/t0", g_dir);
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    o.tokenizer = 0;
    o.hidden = 512;
    o.heads = 8;
    o.kv_heads = 4;
    o.head_dim = 64;
    o.intermediate = 1536;
    o.layers = 4;
    o.vocab = 1000;
    o.seed = 7;
    char err[512];
    if (mdl_mkmodel(&o, T0, err, sizeof err) != 0) return -1;
    snprintf(D0, sizeof D0, "%s/d0", g_dir);
    mdl_mkmodel_defaults(&o);
    o.tokenizer = 0;
    o.arch = MDL_ARCH_DSPARK;
    o.target_dir = T0;
    o.layers = 1;
    o.block_size = 4;
    o.markov_rank = 8;
    o.seed = 8;
    return mdl_mkmodel(&o, D0, err, sizeof err) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_spans),
        cmocka_unit_test(test_level1_identical),
        cmocka_unit_test(test_level2_needs_full_update),
        cmocka_unit_test(test_kv_only_and_refusals),
        cmocka_unit_test(test_spec_drafter),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
