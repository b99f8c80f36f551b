/* tests/emu/test_emu_sample.c — kernels/cuda/sample.cu (KOP_SAMPLE), the real CUDA source, run on the
 * CPU emulation of the CUDA primitives (tests/emu/emu_cuda.h) against the CPU kernel (kern_cpu_exec).
 *
 * Why: CI has no GPU, so tests/gpu/test_cuda_ops.c's test_sample only runs where a GPU is lent.
 * This runs the same kind of rows through the same kernel source on every CI run, small enough for
 * two cores: index and logic bugs, missing or misplaced barriers and warp votes at divergent points
 * fail here (the emulation aborts on divergent barrier use; a result that depends on the thread
 * schedule shows up as two schedules disagreeing).
 *
 * Each op: random rows of every mode (greedy, temperature, top-k, top-p, min-p and their
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
 * boundary can differ on a GPU but not here). Sizes are smaller than the GPU test's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/kern.h"
#include "tests/emu/emu_kernels.h"
#include "tests/gpu/gpu_test.h"

static kern_pool *g_pool;

/* two schedules per op: even seed uniform, odd seed run ahead (emu_cuda.cpp) */
static const uint64_t SEEDS[2] = {0x5eed0002ull, 0x5eed0001ull};

typedef struct {
    int n_rows, n_acc, n_rej, n_drawn_not_best, n_verify_greedy, n_ties, n_long_bans;
} sample_stats;

static int32_t *i32_fill(size_t n, int32_t v)
{
    int32_t *p = malloc((n ? n : 1) * 4);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}
static float *f32_poison(size_t n)
{
    float *p = malloc((n ? n : 1) * 4);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = gpu_poison_f32();
    return p;
}

/* best id of C0 by the order key (the greedy choice) */
static int32_t sample_best(const float *l, int V, const int32_t *ban, int nb)
{
    int32_t best = -1;
    uint64_t bk = 0;
    for (int32_t i = 0; i < V; i++) {
        int banned = 0;
        for (int k = 0; k < nb; k++) banned |= ban[k] == i;
        if (banned) continue;
        const uint64_t k = kern_sample_key(l[i], i);
        if (best < 0 || k > bk) {
            best = i;
            bk = k;
        }
    }
    return best;
}

static int sample_lp_ok(float c, float g)
{
    return !isnan(c) && !isnan(g) && (c == g || fabs((double)c - (double)g) <= 1e-5);
}

/* Fills rows < n of logits and params with a mix of every mode (tests/gpu/test_cuda_ops.c's
 * sample_rows); bans are taken from bans[0..NB). */
static void sample_rows(gpu_rng *r, float *logits, kern_sample_params *prm, int32_t *bans, int NB, int V, int n,
                        int long_bans)
{
    int ban_used = 0;
    for (int j = 0; j < n; j++) {
        float *l = logits + (size_t)j * V;
        const int shape = gpu_int(r, 0, V < 100 ? 3 : 6);
        const float scale = 1.0f + 9.0f * (gpu_unif(r) * 0.5f + 0.5f);
        for (int i = 0; i < V; i++) {
            const float x = gpu_unif(r) * scale;
            l[i] = shape == 1 ? roundf(x * 4) / 4 : x; /* coarse: ties everywhere */
        }
        if (shape == 2) { /* a tie at the maximum: the lower id wins */
            const int a = gpu_int(r, 0, V - 1), b = gpu_int(r, 0, V - 1);
            l[a] = l[b] = scale + 1.0f;
        } else if (shape == 3) { /* a peaked row: verification accepts often */
            l[gpu_int(r, 0, V - 1)] = scale + 6.0f;
        } else if (shape == 4) { /* most ids masked with -inf (grammar masks) */
            for (int i = 0; i < V; i++)
                if (gpu_int(r, 0, 15) != 0) l[i] = -INFINITY;
            l[gpu_int(r, 0, V - 1)] = scale;
        } else if (shape == 5) { /* a run of tied best ids inside one warp batch: selections descend into
                                  * the id bytes of the key, where a bin's candidates share a warp batch */
            const int m = gpu_int(r, 2, 9), a = gpu_int(r, 0, V - m);
            for (int i = a; i < a + m; i++) l[i] = scale + 0.5f;
        }
        kern_sample_params *p = &prm[j];
        memset(p, 0, sizeof *p);
        const int mode = j % 10;
        const float T = 0.3f + 1.5f * (gpu_unif(r) * 0.5f + 0.5f);
        p->temperature = mode == 0 ? (j % 20 == 0 ? 0.0f : 1e-6f) : T;
        p->top_k = (mode == 2 || mode == 5 || mode == 7) ? gpu_int(r, 1, 60) : mode == 8 ? V : mode == 9 ? 1 : 0;
        p->top_p = (mode == 3 || mode == 5 || mode == 6 || mode == 7) ? 0.05f + 0.9f * (gpu_unif(r) * 0.5f + 0.5f)
                                                                      : (j % 3 ? 1.0f : 0.0f); /* off both ways */
        p->min_p = (mode == 4 || mode == 6 || mode == 7) ? 0.3f * (gpu_unif(r) * 0.5f + 0.5f) : 0.0f;
        p->seed = gpu_next(r);
        p->counter = gpu_next(r) % 5000;
        static const int nlp[3] = {0, 5, 20};
        p->n_logprobs = nlp[(j / 10) % 3];
        p->ban_off = ban_used;
        p->n_ban = 0;
        if (long_bans && j % 7 == 1) p->n_ban = 600 < NB - ban_used ? 600 : NB - ban_used; /* past the staged bans */
        else if (gpu_int(r, 0, 2) == 0) p->n_ban = gpu_int(r, 1, 6);
        if (ban_used + p->n_ban > NB) p->n_ban = 0;
        for (int b = 0; b < p->n_ban; b++) bans[ban_used + b] = gpu_int(r, 0, V - 1);
        if (p->n_ban >= 2) { /* the best raw id banned, and a duplicate */
            int32_t top = 0;
            for (int i = 1; i < V; i++)
                if (kern_sample_key(l[i], i) > kern_sample_key(l[top], top)) top = i;
            bans[ban_used] = top;
            bans[ban_used + 1] = top;
        }
        ban_used += p->n_ban;
        const int kind = gpu_int(r, 0, 5); /* verify rows: the argmax, a random id, a banned id */
        p->draft = -1;
        if (kind == 1 || kind == 2) p->draft = sample_best(l, V, bans + p->ban_off, p->n_ban);
        else if (kind == 3) p->draft = gpu_int(r, 0, V - 1);
        else if (kind == 4 && p->n_ban > 0) p->draft = bans[p->ban_off + gpu_int(r, 0, p->n_ban - 1)];
    }
}

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

/* One op through the CPU kernel and the emulated CUDA kernel (two schedules). Returns the failures. */
static int sample_check(const float *logits, const kern_sample_params *prm, const int32_t *bans, int NB, int V,
                        int max_rows, int n, const char *name, sample_stats *st)
{
    const size_t ob = (size_t)max_rows * sizeof(kern_sample_out);
    kern_sample_out *init = out_poison(max_rows), *cpu = out_poison(max_rows);
    kern_sample_out *emu[2] = {out_poison(max_rows), out_poison(max_rows)};
    int32_t nn = n;
    kern_op op = sample_op(logits, prm, bans, NB, V, max_rows, cpu, &nn);
    kern_cpu_exec(g_pool, &op);
    for (int run = 0; run < 2; run++) {
        char msg[160];
        op.buf[3].ptr = emu[run];
        if (emu_kc_sample(&op, SEEDS[run], msg, sizeof msg) != 0) fail_msg("%s: the kernel recorded %s", name, msg);
    }

    int bad = 0;
#define SBAD(...)                                                                                  \
    do {                                                                                           \
        if (bad++ < 10) {                                                                          \
            fprintf(stderr, "%s row %d: ", name, j);                                               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)
    if (memcmp(emu[0], emu[1], ob) != 0) {
        for (int j = 0; j < max_rows; j++)
            if (memcmp(&emu[0][j], &emu[1][j], sizeof emu[0][j]) != 0)
                SBAD("two thread schedules differ (tok %d / %d)", emu[0][j].tok, emu[1][j].tok);
    }
    const kern_sample_out *g = emu[0];
    for (int j = 0; j < max_rows; j++) {
        const kern_sample_out *c = &cpu[j], *o = &g[j], *in = &init[j];
        if (j >= n) {
            if (memcmp(o, in, sizeof *o) != 0) SBAD("past n but written");
            continue;
        }
        const kern_sample_params *p = &prm[j];
        if (o->tok != c->tok || o->accepted != c->accepted)
            SBAD("tok %d acc %d, cpu tok %d acc %d (T %g k %d p %g min_p %g draft %d bans %d)", o->tok, o->accepted,
                 c->tok, c->accepted, (double)p->temperature, p->top_k, (double)p->top_p, (double)p->min_p, p->draft,
                 p->n_ban);
        if (!sample_lp_ok(c->logprob, o->logprob)) SBAD("logprob %.9g, cpu %.9g", (double)o->logprob, (double)c->logprob);
        if (o->n_top != c->n_top) SBAD("n_top %d, cpu %d", o->n_top, c->n_top);
        for (int k = 0; k < KERN_SAMPLE_MAX_TOP; k++) {
            if (k < c->n_top) {
                if (o->top[k].id != c->top[k].id) SBAD("top[%d] id %d, cpu %d", k, o->top[k].id, c->top[k].id);
                if (!sample_lp_ok(c->top[k].logprob, o->top[k].logprob))
                    SBAD("top[%d] logprob %.9g, cpu %.9g", k, (double)o->top[k].logprob, (double)c->top[k].logprob);
            } else if (memcmp(&o->top[k], &in->top[k], sizeof o->top[k]) != 0 ||
                       memcmp(&c->top[k], &in->top[k], sizeof c->top[k]) != 0) {
                SBAD("top[%d] past n_top written", k);
            }
        }
        /* what the rows exercised (from the CPU's results) */
        st->n_rows++;
        if (p->n_ban > 512) st->n_long_bans++; /* past the bans sample.cu stages in shared memory */
        if (p->draft >= 0 && p->temperature <= 1e-5f) st->n_verify_greedy++;
        else if (p->draft >= 0) {
            if (c->accepted) st->n_acc++;
            else st->n_rej++;
        } else if (p->temperature > 1e-5f &&
                   c->tok != sample_best(logits + (size_t)j * V, V, p->n_ban ? bans + p->ban_off : NULL, p->n_ban)) {
            st->n_drawn_not_best++;
        }
    }
#undef SBAD
    free(init);
    free(cpu);
    free(emu[0]);
    free(emu[1]);
    return bad;
}

static void test_sample(void **state)
{
    (void)state;
    gpu_rng r = {21};
    const struct {
        int V, max_rows, n, long_bans;
        const char *what;
    } cases[] = {
        {5003, 32, 30, 1, "V 5003"},  /* every mode x n_logprobs 0 / 5 / 20, bans past the staging */
        {1024, 34, 32, 0, "V 1024"},  /* V a multiple of the block: no partial warp batch */
        {545, 31, 30, 0, "V 545"},    /* one id past a warp batch boundary, < two passes of the block */
        {20001, 12, 10, 0, "V 20001"}, /* draws over several chunks of KS_THREADS * KS_DRAW_PER ids */
        {151936, 3, 2, 0, "V 151936"}, /* a real vocabulary */
        {13, 12, 10, 0, "V 13 (fewer ids than the top-n)"},
        {5003, 4, 0, 0, "zero rows"},
    };
    sample_stats st = {0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int V = cases[ci].V, max_rows = cases[ci].max_rows, n = cases[ci].n, NB = 4096;
        float *logits = f32_poison((size_t)max_rows * V);
        kern_sample_params *prm = calloc((size_t)max_rows, sizeof *prm);
        int32_t *bans = i32_fill(NB, 0);
        assert_non_null(prm);
        sample_rows(&r, logits, prm, bans, NB, V, n, cases[ci].long_bans);
        for (int j = n; j < max_rows; j++) { /* never read: out-of-range values */
            memset(&prm[j], 0xff, sizeof prm[j]);
            prm[j].n_logprobs = 999;
        }
        if (V < KERN_SAMPLE_MAX_TOP)
            for (int j = 0; j < n; j++) prm[j].n_logprobs = KERN_SAMPLE_MAX_TOP; /* n_top = V */
        char name[96];
        snprintf(name, sizeof name, "sample %s", cases[ci].what);
        assert_int_equal(sample_check(logits, prm, bans, NB, V, max_rows, n, name, &st), 0);
        free(logits);
        free(prm);
        free(bans);
    }
    { /* no bans buffer at all (p2 = 0, buf 2 NULL) */
        const int V = 700, max_rows = 4, n = 4;
        float *logits = f32_poison((size_t)max_rows * V);
        kern_sample_params *prm = calloc((size_t)max_rows, sizeof *prm);
        int32_t dummy = 0;
        assert_non_null(prm);
        sample_rows(&r, logits, prm, &dummy, 0, V, n, 0);
        assert_int_equal(sample_check(logits, prm, NULL, 0, V, max_rows, n, "sample no bans buffer", &st), 0);
        free(logits);
        free(prm);
    }
    printf("sample: %d rows: %d verify accepted, %d rejected, %d greedy verify, %d draws not the best, %d long ban "
           "lists\n",
           st.n_rows, st.n_acc, st.n_rej, st.n_verify_greedy, st.n_drawn_not_best, st.n_long_bans);
    assert_true(st.n_acc >= 3 && st.n_rej >= 3 && st.n_verify_greedy >= 3 && st.n_drawn_not_best >= 10 &&
                st.n_long_bans >= 2);
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
        float *logits = f32_poison((size_t)max_rows * V);
        kern_sample_params *prm = calloc((size_t)max_rows, sizeof *prm);
        int32_t *bans = i32_fill(NB, 0);
        assert_non_null(prm);
        int n = max_rows;
        sample_rows(&r, logits, prm, bans, NB, V, n, 0);
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
            all = i32_fill((size_t)V, 0);
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

int main(void)
{
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample),
        cmocka_unit_test(test_sample_checks),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    return rc;
}
