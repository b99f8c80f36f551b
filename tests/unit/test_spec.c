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

#include "spec_decode/verify.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rejection_sampling_preserves_target),
        cmocka_unit_test(test_greedy_accepts_only_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
