/* tests/unit/test_weights.c — weight-update sessions on a live engine (I2-I8), and the 501 refusal of
 * GPU transports (device-memory buckets) into an FP8 target or drafter.
 * The independent check is a cold start: after any update W0 -> W1, every parameter and every
 * derived buffer of the hot-updated engine must be byte-identical (SHA-256) to an engine cold-loaded
 * from W1, and greedy outputs (with a drafter, the speculative traces too) must be equal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "engine/engine_internal.h" /* white-box: the guard test forces a replay */
#include "engine/weights.h"
#include "engine/sha256.h"
#include "models/mkmodel.h"
#include "test_rt.h"
#include "test_util.h"

static char g_dir[1024];
static char T0[1100], T1[1100], D0[1100], D1[1100], DBAD[1100], TF8[1100], DF8[1100];

typedef test_rt rt;

static void mk_fp8(const char *out, mdl_arch arch, uint64_t seed, const char *target, int bad_hook, int fp8)
{
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    if (fp8) o.fp8_b0 = 16, o.fp8_b1 = 32;
    o.tokenizer = 0;
    o.vocab = 200;
    o.layers = 3;
    o.seed = seed;
    o.arch = arch;
    o.target_dir = target;
    if (arch == MDL_ARCH_DSPARK) {
        o.layers = 2;
        o.block_size = 4;
        o.markov_rank = 8;
    }
    char err[512];
    if (mdl_mkmodel(&o, out, err, sizeof err) != 0) fail_msg("mkmodel %s: %s", out, err);
    if (bad_hook) { /* the test-only variant whose hook reallocates a derived buffer */
        char cmd[4096];
        snprintf(cmd, sizeof cmd,
                 "sed -i 's/\"architectures\"/\"graphswap_test_hook_reallocates\": true, \"architectures\"/' '%s/config.json'",
                 out);
        assert_int_equal(system(cmd), 0);
    }
}

static void mk(const char *out, mdl_arch arch, uint64_t seed, const char *target, int bad_hook)
{
    mk_fp8(out, arch, seed, target, bad_hook, 0);
}

static void open_rt(rt *x, const char *target, const char *draft)
{
    char err[512];
    eng_backend_config bc = {.arena_bytes = (size_t)1 << 30, .threads = 1, .checked = 1};
    eng_backend *be = eng_backend_cpu_create(&bc, err, sizeof err);
    if (!be) fail_msg("%s", err);
    eng_config ec;
    eng_config_defaults(&ec);
    ec.max_seqs = 4;
    ec.max_step_tokens = 32;
    ec.max_model_len = 128;
    ec.kv_bytes = 4 << 20;
    test_rt_open(x, be, target, draft, &ec);
}

typedef struct {
    eng_request r;
    int32_t prompt[8];
    int32_t out[24];
    float lp[24];
    char trace[4096];
    size_t tn;
} req;

static void on_spec(eng_request *r, int step, int start, int32_t anchor, const int32_t *d, int nd, int acc,
                    int32_t bonus, void *user)
{
    req *q = user;
    (void)r;
    q->tn += (size_t)snprintf(q->trace + q->tn, sizeof q->trace - q->tn, "%d:%d:%d:%d:%d:%d:%d|", step, start,
                              anchor, nd, nd ? d[0] : -1, acc, bonus);
}

/* The tests' one request: the fixed 8-token prompt, max_tokens, eos ignored, outputs into q. */
static void req_init(req *q, int max_tokens)
{
    memset(q, 0, sizeof *q);
    for (int i = 0; i < 8; i++) q->prompt[i] = (i * 31 + 7) % 190;
    q->r.prompt = q->prompt;
    q->r.n_prompt = 8;
    q->r.max_tokens = max_tokens;
    q->r.ignore_eos = 1;
    q->r.out_tokens = q->out;
    q->r.out_logprobs = q->lp;
}

static int generate(rt *x, req *q, int max_tokens)
{
    req_init(q, max_tokens);
    q->r.on_spec = on_spec;
    q->r.user = q;
    char err[256];
    int busy = 0;
    if (eng_submit(x->e, &q->r, &busy, err, sizeof err) != 0) return busy ? -2 : -1;
    eng_run_until_idle(x->e);
    return 0;
}

/* Streams a checkpoint folder's tensors into the open session: shuffled order, q/k/v and
 * gate/up of a layer in different buckets, `per_bucket` tensors per bucket; prefix for "all". */
static void push_dir(rt *x, const char *dir, const char *prefix, int per_bucket, unsigned seed, int skip_one)
{
    char path[1200], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    mdl_st_file f;
    assert_int_equal(mdl_st_open(path, &f, err, sizeof err), 0);
    size_t n = f.n;
    size_t *ord = malloc(n * sizeof *ord);
    for (size_t i = 0; i < n; i++) ord[i] = i;
    for (size_t i = n - 1; i > 0; i--) { /* deterministic shuffle */
        seed = seed * 1103515245u + 12345u;
        size_t j = (seed >> 8) % (i + 1), t = ord[i];
        ord[i] = ord[j];
        ord[j] = t;
    }
    mdl_st_tensor *b = calloc(n, sizeof *b);
    char (*names)[160] = calloc(n, 160);
    size_t k = 0;
    int status;
    for (size_t i = 0; i < n; i++) {
        if (skip_one && i == n / 2) continue;
        b[k] = f.tensors[ord[i]];
        snprintf(names[k], 160, "%s%s", prefix, f.tensors[ord[i]].name);
        b[k].name = names[k];
        k++;
        if ((int)k == per_bucket || i == n - 1) {
            if (eng_weights_bucket(x->e, b, k, "bucket", err, sizeof err, &status) != 0) fail_msg("%s", err);
            k = 0;
        }
    }
    if (k && eng_weights_bucket(x->e, b, k, "bucket", err, sizeof err, &status) != 0) fail_msg("%s", err);
    free(b);
    free(names);
    free(ord);
    mdl_st_close(&f);
}

static void update(rt *x, eng_wmodel which, const char *tdir, const char *ddir, int per_bucket, unsigned seed)
{
    char err[512];
    int status;
    assert_int_equal(eng_weights_begin(x->e, 1, which, ENG_PAUSE_WAIT, "v1", NULL, err, sizeof err, &status), 0);
    if (which != ENG_WMODEL_DRAFT) push_dir(x, tdir, "", per_bucket, seed, 0);
    if (which != ENG_WMODEL_TARGET) push_dir(x, ddir, which == ENG_WMODEL_ALL ? "draft." : "", per_bucket, seed + 1, 0);
    if (eng_weights_finish(x->e, NULL, err, sizeof err, &status) != 0) fail_msg("%s", err);
}

static void test_hot_equals_cold(void **state)
{
    (void)state;
    const eng_wmodel modes[] = {ENG_WMODEL_TARGET, ENG_WMODEL_DRAFT, ENG_WMODEL_ALL};
    const int splits[] = {1, 5, 1000};
    for (int mi = 0; mi < 3; mi++) {
        for (int si = 0; si < 3; si++) {
            rt hot, cold;
            const char *tdst = modes[mi] == ENG_WMODEL_DRAFT ? T0 : T1;
            const char *ddst = modes[mi] == ENG_WMODEL_TARGET ? D0 : D1;
            open_rt(&hot, T0, D0);
            open_rt(&cold, tdst, ddst);
            uint64_t th = hot.m->hook_runs, dh = hot.d->hook_runs;
            update(&hot, modes[mi], T1, D1, splits[si], 17u * (unsigned)(mi + si));
            /* exactly one hook per touched model, none for the untouched one */
            assert_int_equal(hot.m->hook_runs - th, modes[mi] != ENG_WMODEL_DRAFT);
            assert_int_equal(hot.d->hook_runs - dh, modes[mi] != ENG_WMODEL_TARGET);
            test_sums *a = malloc(sizeof *a), *b = malloc(sizeof *b);
            for (int dr = 0; dr < 2; dr++) {
                test_checksums(&hot, dr, a);
                test_checksums(&cold, dr, b);
                assert_string_equal(a->buf, b->buf);
                if (dr) assert_non_null(strstr(a->buf, "derived.ctx_kv_weight="));
            }
            free(a);
            free(b);
            req x, y;
            assert_int_equal(generate(&hot, &x, 20), 0);
            assert_int_equal(generate(&cold, &y, 20), 0);
            assert_memory_equal(x.out, y.out, sizeof x.out);
            assert_memory_equal(x.lp, y.lp, sizeof x.lp);
            assert_string_equal(x.trace, y.trace); /* drafts and acceptance too */
            eng_weights_info wi;
            eng_weights_get_info(hot.e, &wi);
            assert_int_equal(wi.state, ENG_W_READY);
            assert_int_equal(wi.version_num, 1);
            assert_string_equal(wi.version, "v1");
            assert_int_equal(x.r.versions[0], 1);
            test_rt_close(&hot);
            test_rt_close(&cold);
        }
    }
}

static void test_incomplete_abort_and_order(void **state)
{
    (void)state;
    rt x;
    open_rt(&x, T0, D0);
    char err[512];
    int status;
    /* out of order */
    assert_int_equal(eng_weights_finish(x.e, NULL, err, sizeof err, &status), -1);
    assert_int_equal(status, 409);
    assert_int_equal(eng_weights_bucket(x.e, NULL, 0, "b", err, sizeof err, &status), -1);
    assert_int_equal(status, 409);
    /* abort before any write: back to ready */
    assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_TARGET, ENG_PAUSE_ABORT, NULL, NULL, err, sizeof err, &status), 0);
    assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_TARGET, ENG_PAUSE_ABORT, NULL, NULL, err, sizeof err, &status), -1);
    assert_int_equal(status, 409);
    assert_int_equal(eng_weights_abort(x.e, err, sizeof err, &status), 0);
    eng_weights_info wi;
    eng_weights_get_info(x.e, &wi);
    assert_int_equal(wi.state, ENG_W_READY);
    /* incomplete full update: 422, inconsistent, generation refused */
    assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_TARGET, ENG_PAUSE_WAIT, NULL, NULL, err, sizeof err, &status), 0);
    push_dir(&x, T1, "", 4, 3, 1);
    assert_int_equal(eng_weights_finish(x.e, NULL, err, sizeof err, &status), -1);
    assert_int_equal(status, 422);
    assert_non_null(strstr(err, "missing tensor"));
    eng_weights_get_info(x.e, &wi);
    assert_int_equal(wi.state, ENG_W_INCONSISTENT);
    req q;
    assert_int_equal(generate(&x, &q, 4), -2);
    /* a partial update cannot repair it: refused at begin (409 saying a full update is needed),
     * nothing opened, nothing counted as ok; a complete full one repairs it */
    uint64_t ok0 = wi.updates_ok;
    assert_int_equal(eng_weights_begin(x.e, 0, ENG_WMODEL_TARGET, ENG_PAUSE_WAIT, NULL, NULL, err, sizeof err, &status), -1);
    assert_int_equal(status, 409);
    assert_non_null(strstr(err, "full update"));
    eng_weights_get_info(x.e, &wi);
    assert_int_equal(wi.state, ENG_W_INCONSISTENT);
    assert_int_equal(wi.session_open, 0);
    assert_int_equal(wi.updates_ok, ok0);
    assert_int_equal(eng_weights_begin(x.e, 0, ENG_WMODEL_ALL, ENG_PAUSE_WAIT, NULL, NULL, err, sizeof err, &status), -1);
    assert_int_equal(status, 409);
    update(&x, ENG_WMODEL_TARGET, T1, NULL, 7, 9);
    eng_weights_get_info(x.e, &wi);
    assert_int_equal(wi.state, ENG_W_READY);
    assert_int_equal(generate(&x, &q, 4), 0);
    /* abort after writes: inconsistent */
    assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_TARGET, ENG_PAUSE_WAIT, NULL, NULL, err, sizeof err, &status), 0);
    push_dir(&x, T0, "", 3, 5, 1);
    assert_int_equal(eng_weights_abort(x.e, err, sizeof err, &status), 0);
    eng_weights_get_info(x.e, &wi);
    assert_int_equal(wi.state, ENG_W_INCONSISTENT);
    assert_non_null(strstr(wi.reason, "aborted"));
    test_rt_close(&x);
}

/* I8: a "keep" or "recompute" session that wrote weights and then failed (here: aborted) leaves the
 * frozen sequences on mixed weights. None of them may produce another token: the next step ends the
 * running and the queued request "abort", with the tokens they had before the session and no more,
 * and the engine is idle (no spin on a queue nothing can admit). With and without a drafter. */
static void test_failed_session_aborts_in_flight(void **state)
{
    (void)state;
    for (int mode = 0; mode < 4; mode++) {
        rt x;
        open_rt(&x, T0, mode >= 2 ? D0 : NULL);
        req q, w;
        req_init(&q, 20);
        req_init(&w, 20);
        char err[512];
        int status;
        assert_int_equal(eng_submit(x.e, &q.r, NULL, err, sizeof err), 0);
        for (int i = 0; i < 3; i++) eng_step(x.e);
        const int before = q.r.n_out;
        assert_true(before > 0 && before < 20);
        assert_int_equal(eng_submit(x.e, &w.r, NULL, err, sizeof err), 0); /* queued, not admitted */
        eng_pause pm = mode % 2 == 0 ? ENG_PAUSE_KEEP : ENG_PAUSE_RECOMPUTE;
        assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_TARGET, pm, NULL, NULL, err, sizeof err, &status), 0);
        push_dir(&x, T1, "", 3, 5, 1);
        assert_int_equal(eng_weights_abort(x.e, err, sizeof err, &status), 0);
        eng_weights_info wi;
        eng_weights_get_info(x.e, &wi);
        assert_int_equal(wi.state, ENG_W_INCONSISTENT);
        assert_int_equal(eng_step(x.e), 0);
        assert_int_equal(q.r.finish, ENG_FINISH_ABORT);
        assert_int_equal(q.r.n_out, before);
        assert_int_equal(w.r.finish, ENG_FINISH_ABORT);
        assert_int_equal(w.r.n_out, 0);
        assert_int_equal(eng_num_running(x.e) + eng_num_waiting(x.e), 0);
        test_rt_close(&x);
    }
}

static rt *g_bad;
static void replay_bad(void *arg)
{
    (void)arg;
    /* force the state back so the engine steps: the plans still hold the retired pointer */
    req q;
    g_bad->e->winfo.state = ENG_W_READY;
    generate(g_bad, &q, 4);
}

static void test_guard_fires(void **state)
{
    (void)state;
    rt x;
    open_rt(&x, T0, DBAD);
    char err[512];
    int status;
    assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_DRAFT, ENG_PAUSE_WAIT, NULL, NULL, err, sizeof err, &status), 0);
    push_dir(&x, DBAD, "", 100, 1, 0);
    assert_int_equal(eng_weights_finish(x.e, NULL, err, sizeof err, &status), -1);
    assert_int_equal(status, 503);
    eng_weights_info wi;
    eng_weights_get_info(x.e, &wi);
    assert_int_equal(wi.state, ENG_W_UNDEFINED);
    assert_non_null(strstr(wi.reason, "derived.ctx_kv_weight"));
    /* no generation, no updates */
    req q;
    assert_int_equal(generate(&x, &q, 4), -2);
    assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_DRAFT, ENG_PAUSE_WAIT, NULL, NULL, err, sizeof err, &status), -1);
    assert_int_equal(status, 503);
    /* and a checked replay would indeed have read retired memory */
    g_bad = &x;
    char out[4096];
    int st = test_run_child(replay_bad, NULL, out, sizeof out);
    assert_true(WIFSIGNALED(st));
    assert_non_null(strstr(out, "retired"));
    test_rt_close(&x);
}

static void test_recompute_and_keep(void **state)
{
    (void)state;
    /* reference: W1 continuing from prompt + the tokens generated under W0 */
    for (int mode = 0; mode < 2; mode++) {
        rt x;
        open_rt(&x, T0, NULL);
        req q;
        req_init(&q, 12);
        char err[512];
        int status;
        assert_int_equal(eng_submit(x.e, &q.r, NULL, err, sizeof err), 0);
        for (int i = 0; i < 5; i++) eng_step(x.e);
        int before = q.r.n_out;
        assert_true(before > 0 && before < 12);
        eng_pause pm = mode == 0 ? ENG_PAUSE_RECOMPUTE : ENG_PAUSE_KEEP;
        assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_TARGET, pm, NULL, NULL, err, sizeof err, &status), 0);
        assert_int_equal(eng_step(x.e), 1); /* frozen: no step during the session (I7) */
        assert_int_equal(q.r.n_out, before);
        push_dir(&x, T1, "", 6, 11, 0);
        assert_int_equal(eng_weights_finish(x.e, NULL, err, sizeof err, &status), 0);
        eng_run_until_idle(x.e);
        assert_int_equal(q.r.n_out, 12);
        assert_int_equal(q.r.n_versions, 2); /* tokens from version 0 and version 1 */
        if (mode == 1) {
            /* I6: the "keep" sequence's blocks span both versions and must never be shared: a new
             * request with its prefix gets no prefix-cache hit and W1's cold output */
            const eng_stats *st = eng_get_stats(x.e);
            uint64_t hits0 = st->prefix_cache_hits;
            int32_t full[32];
            memcpy(full, q.prompt, 8 * sizeof(int32_t));
            memcpy(full + 8, q.out, 12 * sizeof(int32_t));
            req b, c;
            memset(&b, 0, sizeof b);
            b.r.prompt = full;
            b.r.n_prompt = 20;
            b.r.max_tokens = 6;
            b.r.ignore_eos = 1;
            b.r.out_tokens = b.out;
            b.r.out_logprobs = b.lp;
            assert_int_equal(eng_submit(x.e, &b.r, NULL, err, sizeof err), 0);
            eng_run_until_idle(x.e);
            assert_int_equal(st->prefix_cache_hits, hits0);
            rt y;
            open_rt(&y, T1, NULL);
            memset(&c, 0, sizeof c);
            c.r = b.r;
            memset(&c.r.cancel, 0, sizeof c.r.cancel);
            c.r.out_tokens = c.out;
            c.r.out_logprobs = c.lp;
            assert_int_equal(eng_submit(y.e, &c.r, NULL, err, sizeof err), 0);
            eng_run_until_idle(y.e);
            assert_memory_equal(b.out, c.out, 6 * sizeof(int32_t));
            test_rt_close(&y);
        }
        if (mode == 0) {
            rt y;
            open_rt(&y, T1, NULL);
            req p;
            memset(&p, 0, sizeof p);
            memcpy(p.prompt, q.prompt, sizeof q.prompt);
            int32_t full[32];
            memcpy(full, q.prompt, 8 * sizeof(int32_t));
            memcpy(full + 8, q.out, (size_t)before * sizeof(int32_t));
            p.r.prompt = full;
            p.r.n_prompt = 8 + before;
            p.r.max_tokens = 12 - before;
            p.r.ignore_eos = 1;
            p.r.out_tokens = p.out;
            p.r.out_logprobs = p.lp;
            assert_int_equal(eng_submit(y.e, &p.r, NULL, err, sizeof err), 0);
            eng_run_until_idle(y.e);
            assert_memory_equal(q.out + before, p.out, (size_t)(12 - before) * sizeof(int32_t));
            test_rt_close(&y);
        }
        test_rt_close(&x);
    }
}

/* Prompt logprobs across a "recompute" update in the middle of a scored prefill: each position is
 * scored once, by the weights that first computed it (the repeated prefill does not score again):
 * positions [1, 33) equal a cold W0 run's, the rest a cold W1 run's. */
enum { PL_N = 60, PL_K = 2 };
typedef struct {
    eng_request r;
    int32_t out[4];
    float lp[4], plp[PL_N];
    int32_t rank[PL_N];
    eng_toplp top[PL_N * PL_K];
} pl_req;

static void pl_submit(rt *x, pl_req *q, const int32_t *prompt)
{
    memset(q, 0, sizeof *q);
    q->r.prompt = prompt;
    q->r.n_prompt = PL_N;
    q->r.max_tokens = 3;
    q->r.ignore_eos = 1;
    q->r.out_tokens = q->out;
    q->r.out_logprobs = q->lp;
    q->r.prompt_top = PL_K;
    q->r.out_prompt_logprobs = q->plp;
    q->r.out_prompt_rank = q->rank;
    q->r.out_prompt_top = q->top;
    char err[512];
    assert_int_equal(eng_submit(x->e, &q->r, NULL, err, sizeof err), 0);
}

static void test_prompt_logprobs_across_recompute(void **state)
{
    (void)state;
    int32_t prompt[PL_N];
    for (int i = 0; i < PL_N; i++) prompt[i] = (i * 37 + 11) % 190;
    pl_req q, c0, c1;
    rt x, y;
    char err[512];
    int status;
    open_rt(&x, T0, NULL);
    pl_submit(&x, &q, prompt);
    eng_step(x.e); /* 32 rows (max_step_tokens): positions 1..32 scored under W0 */
    assert_int_equal(q.r.n_prompt_scored, 33);
    assert_int_equal(eng_weights_begin(x.e, 1, ENG_WMODEL_TARGET, ENG_PAUSE_RECOMPUTE, NULL, NULL, err, sizeof err,
                                       &status), 0);
    push_dir(&x, T1, "", 6, 11, 0);
    assert_int_equal(eng_weights_finish(x.e, NULL, err, sizeof err, &status), 0);
    eng_run_until_idle(x.e);
    assert_int_equal(q.r.n_out, 3);
    assert_int_equal(q.r.n_prompt_scored, PL_N);
    for (int w = 0; w < 2; w++) {
        pl_req *c = w ? &c1 : &c0;
        open_rt(&y, w ? T1 : T0, NULL);
        pl_submit(&y, c, prompt);
        eng_run_until_idle(y.e);
        assert_int_equal(c->r.n_prompt_scored, PL_N);
        test_rt_close(&y);
    }
    for (int i = 1; i < PL_N; i++) {
        const pl_req *c = i < 33 ? &c0 : &c1;
        if (memcmp(&q.plp[i], &c->plp[i], sizeof q.plp[i]) != 0 || q.rank[i] != c->rank[i] ||
            memcmp(&q.top[i * PL_K], &c->top[i * PL_K], PL_K * sizeof q.top[0]) != 0)
            fail_msg("prompt position %d: %.9g rank %d, cold W%d %.9g rank %d", i, (double)q.plp[i], q.rank[i],
                     i < 33 ? 0 : 1, (double)c->plp[i], c->rank[i]);
    }
    /* the weights differ, so the two halves really came from different versions */
    assert_true(memcmp(&c0.plp[40], &c1.plp[40], sizeof c0.plp[40]) != 0);
    test_rt_close(&x);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "%s", test_tmpdir("weights"));
    snprintf(T0, sizeof T0, "%s/T0", g_dir);
    snprintf(T1, sizeof T1, "%s/T1", g_dir);
    snprintf(D0, sizeof D0, "%s/D0", g_dir);
    snprintf(D1, sizeof D1, "%s/D1", g_dir);
    snprintf(DBAD, sizeof DBAD, "%s/DBAD", g_dir);
    mk(T0, MDL_ARCH_QWEN3, 1, NULL, 0);
    mk(T1, MDL_ARCH_QWEN3, 2, NULL, 0);
    mk(D0, MDL_ARCH_DSPARK, 3, T0, 0);
    mk(D1, MDL_ARCH_DSPARK, 4, T1, 0);
    mk(DBAD, MDL_ARCH_DFLASH, 5, T0, 1);
    snprintf(TF8, sizeof TF8, "%s/TF8", g_dir);
    snprintf(DF8, sizeof DF8, "%s/DF8", g_dir);
    mk_fp8(TF8, MDL_ARCH_QWEN3, 6, NULL, 0, 1);
    mk_fp8(DF8, MDL_ARCH_DFLASH, 7, T0, 0, 1);
    return 0;
}

static void ckpt_sum_add(const char *name, const char *hex, void *u)
{
    test_sums *s = u;
    s->n += (size_t)snprintf(s->buf + s->n, sizeof s->buf - s->n, "%s=%s;", name, hex);
}

/* Checkpoint-name checksums: the independent value is the SHA-256 of each tensor of the checkpoint
 * file, converted to the config's torch_dtype; every file tensor has one, each equal. */
static void check_ckpt_sums(rt *x, int draft, const char *dir, const mdl_model *m)
{
    test_sums *got = malloc(sizeof *got);
    got->n = 0;
    got->buf[0] = 0;
    mdl_dtype hd;
    assert_int_equal(eng_weights_checksums_ckpt(x->e, draft, ckpt_sum_add, got, &hd), 0);
    assert_int_equal(hd, m->cfg.dtype);
    char path[1200], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    mdl_st_file f;
    assert_int_equal(mdl_st_open(path, &f, err, sizeof err), 0);
    size_t entries = 0;
    for (const char *c = got->buf; *c; c++) entries += *c == ';';
    for (size_t i = 0; i < f.n; i++) {
        const mdl_st_tensor *t = &f.tensors[i];
        size_t nb = t->numel * mdl_dtype_size(hd);
        void *cv = malloc(nb ? nb : 1);
        assert_int_equal(mdl_convert(cv, hd, t->data, t->dtype, t->numel), 0);
        char hex[65], want[400];
        eng_sha256_hex(cv, nb, hex);
        free(cv);
        snprintf(want, sizeof want, "%s=%s;", t->name, hex);
        if (!strstr(got->buf, want)) fail_msg("%s: no or a different checksum for %s", dir, t->name);
    }
    /* the file's tensors plus the derived buffers, nothing else */
    assert_int_equal(entries, f.n + (size_t)m->n_derived);
    mdl_st_close(&f);
    free(got);
}

static void test_ckpt_checksums(void **state)
{
    (void)state;
    rt x;
    open_rt(&x, T0, D0);
    check_ckpt_sums(&x, 0, T0, x.m);
    check_ckpt_sums(&x, 1, D0, x.d);
    /* after a hot update they follow the new checkpoint */
    update(&x, ENG_WMODEL_ALL, T1, D1, 5, 3);
    check_ckpt_sums(&x, 0, T1, x.m);
    check_ckpt_sums(&x, 1, D1, x.d);
    test_rt_close(&x);
}

/* One bucket of every tensor of dir's checkpoint, names prefixed, through the host path (device 0)
 * or the device-memory one (device 1: NCCL / CUDA IPC buckets). Returns the call's rc; *status, err. */
static int bucket_of(rt *x, const char *dir, const char *prefix, int device, char *err, size_t errlen, int *status)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    mdl_st_file f;
    assert_int_equal(mdl_st_open(path, &f, err, errlen), 0);
    mdl_st_tensor *b = calloc(f.n, sizeof *b);
    char (*names)[160] = calloc(f.n, 160);
    for (size_t i = 0; i < f.n; i++) {
        b[i] = f.tensors[i];
        snprintf(names[i], 160, "%s%s", prefix, f.tensors[i].name);
        b[i].name = names[i];
    }
    const int rc = device ? eng_weights_bucket_device(x->e, b, f.n, "bucket", err, errlen, status)
                          : eng_weights_bucket(x->e, b, f.n, "bucket", err, errlen, status);
    free(b);
    free(names);
    mdl_st_close(&f);
    return rc;
}

/* GPU transports into an FP8 model (target or drafter) are refused with 501 before anything is
 * written: the FP8 value checks and online quantization read tensor bytes on the host. The refusal
 * keys on the backend's device memory not being host memory, so the test runs the CPU backend with
 * host_memory cleared (its memory still is host memory, so the same call on a non-FP8 model goes
 * through and writes). */
static void test_fp8_device_transport_refused(void **state)
{
    (void)state;
    char err[512];
    int status;
    test_sums *before = malloc(sizeof *before), *after = malloc(sizeof *after);
    for (int drafter = 0; drafter < 2; drafter++) {
        rt x;
        if (drafter)
            open_rt(&x, T0, DF8); /* an f32 target, an FP8 drafter */
        else
            open_rt(&x, TF8, NULL);
        assert_true(drafter ? x.d->cfg.fp8 && !x.m->cfg.fp8 : x.m->cfg.fp8);
        const eng_backend_ops *cpu = x.be->ops;
        eng_backend_ops fake = *cpu;
        fake.host_memory = 0;
        test_checksums(&x, drafter, before);
        assert_int_equal(eng_weights_begin(x.e, 0, drafter ? ENG_WMODEL_ALL : ENG_WMODEL_TARGET, ENG_PAUSE_WAIT, "v",
                                           NULL, err, sizeof err, &status),
                         0);
        x.be->ops = &fake;
        /* the FP8 model's own tensors in device memory: 501, naming the limit */
        assert_int_equal(bucket_of(&x, drafter ? DF8 : TF8, drafter ? "draft." : "", 1, err, sizeof err, &status), -1);
        assert_int_equal(status, 501);
        assert_non_null(strstr(err, "an FP8 model takes weights from host memory only"));
        if (drafter) { /* the same engine's non-FP8 target takes a device bucket */
            if (bucket_of(&x, T1, "", 1, err, sizeof err, &status) != 0) fail_msg("device bucket into f32: %s", err);
            assert_int_equal(bucket_of(&x, T0, "", 1, err, sizeof err, &status), 0);
        }
        x.be->ops = cpu;
        eng_weights_info wi;
        eng_weights_get_info(x.e, &wi);
        assert_int_equal(wi.state, ENG_W_UPDATING);
        /* the same tensors from host memory go through */
        if (bucket_of(&x, drafter ? DF8 : TF8, drafter ? "draft." : "", 0, err, sizeof err, &status) != 0)
            fail_msg("host bucket: %s", err);
        if (eng_weights_finish(x.e, NULL, err, sizeof err, &status) != 0) fail_msg("%s", err);
        test_checksums(&x, drafter, after);
        assert_string_equal(after->buf, before->buf);
        eng_weights_get_info(x.e, &wi);
        assert_int_equal(wi.state, ENG_W_READY);
        test_rt_close(&x);
    }
    free(before);
    free(after);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hot_equals_cold),
        cmocka_unit_test(test_incomplete_abort_and_order),
        cmocka_unit_test(test_failed_session_aborts_in_flight),
        cmocka_unit_test(test_guard_fires),
        cmocka_unit_test(test_recompute_and_keep),
        cmocka_unit_test(test_prompt_logprobs_across_recompute),
        cmocka_unit_test(test_ckpt_checksums),
        cmocka_unit_test(test_fp8_device_transport_refused),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
