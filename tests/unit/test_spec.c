/* tests/unit/test_spec.c — speculative verification preserves the target distribution.
 * For a tiny vocabulary and fixed target logits, the token emitted at a verified slot (accept the
 * greedy draft d with probability p(d), else resample from p without d) must be distributed as p
 * itself — whatever d is. Checked with a chi-square goodness-of-fit test over many seeded trials
 * (fixed seeds: deterministic), against p computed here independently. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/cpu/kern_cpu.h"
#include "kernels/kern.h"
#include "spec_decode/verify.h"
#include <stdlib.h>
#include <string.h>

#define V 6
static const float logits[V] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 1.5f};

static void target_probs(double T, int top_k, double *p)
{
    int keep[V];
    for (int i = 0; i < V; i++) { /* rank by logit (distinct values here) */
        int rank = 0;
        for (int j = 0; j < V; j++) rank += logits[j] > logits[i];
        keep[i] = top_k <= 0 || rank < top_k;
    }
    double z = 0;
    for (int i = 0; i < V; i++) z += keep[i] ? exp(logits[i] / T) : 0;
    for (int i = 0; i < V; i++) p[i] = keep[i] ? exp(logits[i] / T) / z : 0;
}

/* chi-square of emitted counts against p; also returns the acceptance rate */
static double run(const eng_sampling *sp, int32_t draft, const double *p, int N, double *acc_rate)
{
    eng_sampler_scratch s;
    assert_int_equal(eng_sampler_scratch_init(&s, V), 0);
    int counts[V] = {0}, acc_n = 0;
    int32_t banned[1];
    for (int n = 0; n < N; n++) {
        eng_sampling q = *sp;
        q.seed = (uint64_t)n * 7919u + 1; /* a request per trial, token index 3 */
        int acc;
        int32_t tok = spec_verify_slot(logits, &q, draft, 3, banned, 0, &s, &acc);
        counts[tok]++;
        acc_n += acc;
        if (acc) assert_int_equal(tok, draft);
        else assert_int_not_equal(tok, draft);
    }
    eng_sampler_scratch_free(&s);
    double chi = 0;
    for (int k = 0; k < V; k++) {
        if (p[k] == 0) {
            assert_int_equal(counts[k], 0);
            continue;
        }
        double e = p[k] * N;
        chi += (counts[k] - e) * (counts[k] - e) / e;
    }
    *acc_rate = (double)acc_n / N;
    return chi;
}

static void test_rejection_sampling_preserves_target(void **state)
{
    (void)state;
    const double chi_crit = 20.5; /* df <= 5: P(chi2 > 20.5) < 0.001 */
    double p[V], acc;
    eng_sampling sp = {.temperature = 1.0f, .top_p = 1.0f};
    target_probs(1.0, 0, p);
    for (int32_t d = 0; d < V; d++) {
        double chi = run(&sp, d, p, 60000, &acc);
        if (chi > chi_crit) fail_msg("draft %d: chi2 %.2f", d, chi);
        assert_true(fabs(acc - p[d]) < 0.01); /* accepted with probability p(d) */
    }
    /* temperature and top-k: the target distribution is the filtered one */
    sp.temperature = 0.7f;
    sp.top_k = 3;
    target_probs(0.7, 3, p);
    for (int32_t d = 0; d < V; d++) {
        double chi = run(&sp, d, p, 60000, &acc);
        if (chi > chi_crit) fail_msg("top-k draft %d: chi2 %.2f", d, chi);
        if (p[d] == 0) assert_true(acc == 0); /* a draft outside top-k is never accepted */
    }
    /* the statistic does detect a wrong rule: always accepting the draft is far off p */
    int counts_bad = 60000;
    double e = p[0] * 60000;
    assert_true((counts_bad - e) * (counts_bad - e) / e > 100 * chi_crit);
}

static void test_greedy_accepts_only_argmax(void **state)
{
    (void)state;
    eng_sampler_scratch s;
    assert_int_equal(eng_sampler_scratch_init(&s, V), 0);
    eng_sampling sp = {.temperature = 0, .top_p = 1};
    int32_t banned[2] = {0};
    int acc;
    assert_int_equal(spec_verify_slot(logits, &sp, 0, 0, banned, 0, &s, &acc), 0);
    assert_int_equal(acc, 1);
    assert_int_equal(spec_verify_slot(logits, &sp, 5, 0, banned, 0, &s, &acc), 0);
    assert_int_equal(acc, 0);
    /* min_tokens bans: a banned argmax is never accepted; the next best is emitted */
    assert_int_equal(spec_verify_slot(logits, &sp, 0, 0, banned, 1, &s, &acc), 5);
    assert_int_equal(acc, 0);
    eng_sampler_scratch_free(&s);
}

/* ---- the speculative ops (kernels/cpu/spec.c) against plain loops ---------------------------------- */

static float frand(uint32_t *st)
{
    *st = *st * 1664525u + 1013904223u;
    return (float)((*st >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void test_copy_cols(void **state)
{
    (void)state;
    enum { R = 5, NH = 7, STRIDE = 21 };
    float x[R * NH], out[R * STRIDE];
    uint32_t st = 1;
    for (int i = 0; i < R * NH; i++) x[i] = frand(&st);
    for (int i = 0; i < R * STRIDE; i++) out[i] = -99;
    int32_t n = 3;
    kern_op op = {.kind = KOP_COPY_COLS};
    op.buf[0] = (kern_buf){x, sizeof x};
    op.buf[1] = (kern_buf){out, sizeof out};
    op.buf[2] = (kern_buf){&n, 4};
    op.p[0] = NH;
    op.p[1] = STRIDE;
    op.p[2] = 7;
    op.p[3] = R;
    kern_cpu_exec(NULL, &op);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < STRIDE; c++) {
            float want = (r < n && c >= 7 && c < 14) ? x[r * NH + c - 7] : -99;
            assert_true(out[r * STRIDE + c] == want);
        }
}

/* NaN logits in draft_select: the answer of one sequential scan (a NaN at id 0 wins, any other NaN
 * is never chosen) for 1 and 2 threads, also when a thread's range starts with a NaN. */
static void test_draft_select_nan_any_split(void **state)
{
    (void)state;
    enum { NV = 64 };
    size_t prev_work = kern_cpu_set_min_parallel_work(0); /* the pool really splits V in two */
    kern_pool *pool = kern_pool_create(2);
    for (int c = 0; c < 3; c++) {
        float lg[NV];
        for (int v = 0; v < NV; v++) lg[v] = (float)(v % 7);
        lg[40] = 50.0f;
        int32_t want = 40;
        if (c == 0) lg[32] = NAN; /* first element of the second thread's range */
        if (c == 1) lg[0] = NAN, want = 0;
        if (c == 2) lg[32] = NAN, lg[33] = NAN, lg[5] = NAN;
        for (int threads = 1; threads <= 2; threads++) {
            float buf[NV];
            memcpy(buf, lg, sizeof buf);
            int32_t anchor = 0, d = -1, n = 1;
            kern_op op = {.kind = KOP_DRAFT_SELECT};
            op.buf[0] = (kern_buf){buf, sizeof buf};
            op.buf[3] = (kern_buf){&anchor, sizeof anchor};
            op.buf[4] = (kern_buf){&d, sizeof d};
            op.buf[5] = (kern_buf){&n, 4};
            op.p[0] = 1;
            op.p[1] = NV;
            op.p[3] = KERN_DT_BF16;
            op.p[4] = 1;
            kern_cpu_exec(threads == 2 ? pool : NULL, &op);
            if (d != want) fail_msg("case %d, %d thread(s): draft %d, want %d", c, threads, d, want);
        }
    }
    kern_pool_destroy(pool);
    kern_cpu_set_min_parallel_work(prev_work);
}

/* Markov draft choice and confidence vs a double-precision loop; 1 vs 2 threads bitwise. */
static void test_draft_select_confidence(void **state)
{
    (void)state;
    enum { NS = 3, NW = 4, NV = 300, RK = 8, NH = 24 };
    uint32_t st = 7;
    float *base = malloc(sizeof(float) * NS * NW * NV), *lg1 = malloc(sizeof(float) * NS * NW * NV),
          *lg2 = malloc(sizeof(float) * NS * NW * NV);
    uint16_t w1[NV * RK], w2[NV * RK];
    float h[NS * NW * NH], cw[NH + RK], cb[1] = {0.25f}, conf[NS * NW];
    for (int i = 0; i < NS * NW * NV; i++) base[i] = 2.0f * frand(&st);
    for (int i = 0; i < NV * RK; i++) {
        w1[i] = kern_f32_to_bf16(frand(&st));
        w2[i] = kern_f32_to_bf16(frand(&st));
    }
    for (int i = 0; i < NS * NW * NH; i++) h[i] = frand(&st);
    for (int i = 0; i < NH + RK; i++) cw[i] = 0.3f * frand(&st);
    int32_t anchor[NS] = {5, 77, 299}, d1[NS * NW], d2[NS * NW], n = NS;
    for (int pass = 0; pass < 2; pass++) {
        float *lg = pass ? lg2 : lg1;
        int32_t *d = pass ? d2 : d1;
        memcpy(lg, base, sizeof(float) * NS * NW * NV);
        kern_pool *pool = pass ? kern_pool_create(2) : NULL;
        kern_op op = {.kind = KOP_DRAFT_SELECT};
        op.buf[0] = (kern_buf){lg, sizeof(float) * NS * NW * NV};
        op.buf[1] = (kern_buf){w1, sizeof w1};
        op.buf[2] = (kern_buf){w2, sizeof w2};
        op.buf[3] = (kern_buf){anchor, sizeof anchor};
        op.buf[4] = (kern_buf){d, sizeof(int32_t) * NS * NW};
        op.buf[5] = (kern_buf){&n, 4};
        op.p[0] = NW;
        op.p[1] = NV;
        op.p[2] = RK;
        op.p[3] = KERN_DT_BF16;
        op.p[4] = NS;
        kern_cpu_exec(pool, &op);
        kern_pool_destroy(pool);
    }
    assert_memory_equal(d1, d2, sizeof d1);
    assert_memory_equal(lg1, lg2, sizeof(float) * NS * NW * NV);
    /* the reference chain in double */
    for (int s = 0; s < NS; s++) {
        int prev = anchor[s];
        for (int k = 0; k < NW; k++) {
            int best = -1;
            double bv = 0;
            for (int v = 0; v < NV; v++) {
                double a = base[(s * NW + k) * NV + v];
                for (int i = 0; i < RK; i++)
                    a += (double)kern_bf16_to_f32(w2[v * RK + i]) * kern_bf16_to_f32(w1[prev * RK + i]);
                if (best < 0 || a > bv) {
                    best = v;
                    bv = a;
                }
            }
            assert_int_equal(d1[s * NW + k], best);
            prev = best;
        }
    }
    kern_op op = {.kind = KOP_CONFIDENCE};
    op.buf[0] = (kern_buf){h, sizeof h};
    op.buf[1] = (kern_buf){w1, sizeof w1};
    op.buf[2] = (kern_buf){d1, sizeof d1};
    op.buf[3] = (kern_buf){anchor, sizeof anchor};
    op.buf[4] = (kern_buf){cw, sizeof cw};
    op.buf[5] = (kern_buf){cb, sizeof cb};
    op.buf[6] = (kern_buf){conf, sizeof conf};
    op.buf[7] = (kern_buf){&n, 4};
    op.p[0] = NW;
    op.p[1] = NH;
    op.p[2] = RK;
    op.p[3] = KERN_DT_BF16;
    op.p[4] = NS;
    op.p[5] = NV;
    kern_cpu_exec(NULL, &op);
    for (int s = 0; s < NS; s++)
        for (int k = 0; k < NW; k++) {
            int prev = k == 0 ? anchor[s] : d1[s * NW + k - 1];
            double a = cb[0];
            for (int i = 0; i < NH; i++) a += (double)cw[i] * h[(s * NW + k) * NH + i];
            for (int i = 0; i < RK; i++) a += (double)cw[NH + i] * kern_bf16_to_f32(w1[prev * RK + i]);
            assert_float_equal(conf[s * NW + k], 1.0 / (1.0 + exp(-a)), 1e-5);
        }
    free(base);
    free(lg1);
    free(lg2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_cols),
        cmocka_unit_test(test_draft_select_confidence),
        cmocka_unit_test(test_draft_select_nan_any_split),
        cmocka_unit_test(test_rejection_sampling_preserves_target),
        cmocka_unit_test(test_greedy_accepts_only_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
