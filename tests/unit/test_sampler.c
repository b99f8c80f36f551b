/* tests/unit/test_sampler.c — Philox, greedy, filters, reproducibility and the sampled distribution.
 * The distribution test is a chi-square goodness of fit against softmax(logits / T) computed here
 * independently, with fixed seeds (so it is deterministic, and a wrong sampler fails it). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/sampler.h"

static void test_philox_known_answer(void **state)
{
    (void)state;
    /* Random123 known-answer vector for philox4x32-10: counter 0, key 0 */
    uint32_t w[4];
    eng_philox(0, 0, w);
    assert_int_equal(w[0], 0x6627e8d5u);
    assert_int_equal(w[1], 0xe169c58du);
    assert_int_equal(w[2], 0xbc57ac4cu);
    assert_int_equal(w[3], 0x9b00dbd8u);
    double u = eng_uniform(7, 3);
    assert_true(u >= 0 && u < 1);
    assert_true(u == eng_uniform(7, 3));
    assert_true(u != eng_uniform(8, 3));
}

static float logits8[8] = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f, 2.0f, -4.0f};

static void test_greedy_and_logprobs(void **state)
{
    (void)state;
    eng_sampler_scratch s;
    assert_int_equal(eng_sampler_scratch_init(&s, 8), 0);
    eng_sampling sp = {.temperature = 0, .top_p = 1, .logprobs = 3};
    float lp;
    eng_toplp top[3];
    int32_t t = eng_sample(logits8, &sp, 0, NULL, 0, &s, &lp, top);
    assert_int_equal(t, 1); /* tie between 1 and 4: lowest id */
    double z = 0;
    for (int i = 0; i < 8; i++) z += exp(logits8[i]);
    assert_float_equal(lp, 3.0 - log(z), 1e-6);
    assert_int_equal(top[0].id, 1);
    assert_int_equal(top[1].id, 4);
    assert_int_equal(top[2].id, 2);
    assert_float_equal(top[2].logprob, 2.5 - log(z), 1e-6);
    int32_t banned[2] = {1, 4};
    t = eng_sample(logits8, &sp, 0, banned, 2, &s, &lp, top);
    assert_int_equal(t, 2);
    eng_sampler_scratch_free(&s);
}

/* Counts over N seeded draws (counter = draw index, one seed) against expected probabilities. */
static double chi_square(const eng_sampling *sp, const double *expect, int N)
{
    eng_sampler_scratch s;
    assert_int_equal(eng_sampler_scratch_init(&s, 8), 0);
    int counts[8] = {0};
    for (int i = 0; i < N; i++) {
        float lp;
        counts[eng_sample(logits8, sp, (uint64_t)i, NULL, 0, &s, &lp, NULL)]++;
    }
    double chi = 0;
    for (int k = 0; k < 8; k++) {
        if (expect[k] == 0) {
            assert_int_equal(counts[k], 0); /* filtered tokens are never drawn */
            continue;
        }
        double e = expect[k] * N;
        chi += (counts[k] - e) * (counts[k] - e) / e;
    }
    eng_sampler_scratch_free(&s);
    return chi;
}

static void expected(double T, const int *keep, double *out)
{
    double z = 0;
    for (int k = 0; k < 8; k++) z += keep[k] ? exp(logits8[k] / T) : 0;
    for (int k = 0; k < 8; k++) out[k] = keep[k] ? exp(logits8[k] / T) / z : 0;
}

static void test_distribution(void **state)
{
    (void)state;
    const int all[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    double e[8];
    /* df = 7: P(chi2 > 24.3) = 0.001 */
    eng_sampling sp = {.temperature = 1.0f, .top_p = 1, .seed = 12345};
    expected(1.0, all, e);
    assert_true(chi_square(&sp, e, 200000) < 24.3);
    sp.temperature = 0.5f;
    expected(0.5, all, e);
    assert_true(chi_square(&sp, e, 200000) < 24.3);
    /* top-k 3 keeps ids 1, 4, 2 */
    const int k3[8] = {0, 1, 1, 0, 1, 0, 0, 0};
    sp.temperature = 1.0f;
    sp.top_k = 3;
    expected(1.0, k3, e);
    assert_true(chi_square(&sp, e, 100000) < 24.3);
    /* top-p: p(1)=p(4)=.307, p(2)=.186, p(6)=.113 ...: 0.75 keeps 1, 4, 2 */
    sp.top_k = 0;
    sp.top_p = 0.75f;
    assert_true(chi_square(&sp, e, 100000) < 24.3);
    /* min-p 0.5: keeps tokens with p >= 0.5 * p_max: 1, 4, 2 (0.61 of max) */
    sp.top_p = 1;
    sp.min_p = 0.5f;
    assert_true(chi_square(&sp, e, 100000) < 24.3);
    /* a wrong distribution is rejected by the same statistic (the test can fail) */
    sp.min_p = 0;
    expected(0.7, all, e);
    sp.temperature = 1.0f;
    assert_true(chi_square(&sp, e, 200000) > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answer),
        cmocka_unit_test(test_greedy_and_logprobs),
        cmocka_unit_test(test_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
