/* tests/unit/test_sampler.c — Philox, greedy, filters, reproducibility and the sampled distribution.
 * The distribution test is a chi-square goodness of fit against softmax(logits / T) computed here
 * independently, with fixed seeds (so it is deterministic, and a wrong sampler fails it).
 * The KOP_SAMPLE op (kernels/cpu/sample.c: radix selection, what the engine runs) is checked row
 * by row against the sort-based host reference (engine/sampler.c, spec_decode/verify.c). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "kernels/kern.h"
#include "spec_decode/verify.h"

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

/* xorshift for test data (deterministic) */
static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float rndf(void) { return (float)rnd() / 4294967296.0f; }

/* Many rows of every mode through one KOP_SAMPLE op vs the reference, field by field. Logits are
 * rounded to a coarse grid in some rows so that exact ties (broken by id) are common. */
static void test_sample_op_matches_reference(void **state)
{
    (void)state;
    enum { V = 3001, ROWS = 64, ROUNDS = 16, NB = 256 + ROWS * KERN_SAMPLE_MAX_EXTRA, MAXB = 40, NTOK = 200 };
    /* penalties and logit_bias: slot j's state for row j (pen_state, bias list), the token lists the
     * reference sees, and the update pairs of the launch */
    int32_t *pen_state = calloc((size_t)ROWS * V, sizeof(int32_t));
    kern_logit_bias *bias_tab = calloc((size_t)ROWS * MAXB, sizeof *bias_tab);
    int32_t *upd = calloc(1 + 2 * (size_t)ROWS * NTOK, sizeof(int32_t));
    int32_t *ptoks = malloc(sizeof(int32_t) * ROWS * NTOK), *otoks = malloc(sizeof(int32_t) * ROWS * NTOK);
    int *n_pt = calloc(ROWS, sizeof(int)), *n_ot = calloc(ROWS, sizeof(int));
    eng_logit_bias *ebias = calloc((size_t)ROWS * MAXB, sizeof *ebias);
    float *adj = malloc(sizeof(float) * V);
    assert_true(pen_state && bias_tab && upd && ptoks && otoks && n_pt && n_ot && ebias && adj);
    int n_pen_rows = 0, n_bias_rows = 0, n_extra_rows = 0, n_pen_changed = 0;
    float *logits = malloc(sizeof(float) * V * ROWS);
    kern_sample_params *prm = calloc(ROWS, sizeof *prm);
    kern_sample_out *out = calloc(ROWS, sizeof *out);
    int32_t *bans = malloc(sizeof(int32_t) * NB);
    assert_non_null(logits);
    assert_non_null(prm);
    assert_non_null(out);
    assert_non_null(bans);
    eng_sampler_scratch ss;
    assert_int_equal(eng_sampler_scratch_init(&ss, V), 0);
    kern_pool *pool = kern_pool_create(2);
    int n_acc = 0, n_rej = 0, n_sampled_not_best = 0, n_scored = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int ban_used = 0;
        memset(pen_state, 0, sizeof(int32_t) * ROWS * V);
        upd[0] = 0;
        for (int j = 0; j < ROWS; j++) {
            float *l = logits + (size_t)j * V;
            const float scale = 1.0f + 6.0f * rndf();
            const int coarse = rnd() % 3 == 0;
            for (int i = 0; i < V; i++) {
                float x = (rndf() * 2 - 1) * scale;
                l[i] = coarse ? roundf(x * 4) / 4 : x;
            }
            kern_sample_params *p = &prm[j];
            memset(p, 0, sizeof *p);
            const int mode = (int)(rnd() % 8);
            p->temperature = mode == 0 ? 0.0f : 0.3f + 1.5f * rndf();
            p->top_k = (mode == 2 || mode == 5) ? 1 + (int)(rnd() % 60) : (mode == 7 ? V : 0);
            p->top_p = (mode == 3 || mode == 5 || mode == 6) ? 0.05f + 0.9f * rndf() : 1.0f;
            p->min_p = (mode == 4 || mode == 6) ? 0.3f * rndf() : 0.0f;
            p->seed = rnd();
            p->counter = rnd() % 1000;
            p->n_logprobs = (int)(rnd() % 3) * 10;
            p->draft = -1;
            /* verify rows: the argmax, a random id, a banned id; score rows (prompt logprobs) */
            const int kind = (int)(rnd() % 5);
            p->ban_off = ban_used;
            p->n_ban = rnd() % 4 == 0 ? 1 + (int)(rnd() % 6) : 0;
            for (int b = 0; b < p->n_ban; b++) bans[ban_used++] = (int32_t)(rnd() % V);
            if (kind == 1) {
                int32_t best = 0;
                for (int i = 1; i < V; i++)
                    if (l[i] > l[best]) best = i;
                p->draft = best;
            } else if (kind == 2) {
                p->draft = (int32_t)(rnd() % V);
            } else if (kind == 3 && p->n_ban > 0) {
                p->draft = bans[p->ban_off];
            } else if (kind == 4) {
                p->draft = (int32_t)(rnd() % V);
                p->score = 1;
            }
            /* penalties (half the rows) and logit_bias (a third): prompt and output lists drawn from a
             * small id range so that repeats are common; the output reaches the kernel three ways:
             * counts already in pen_state, update pairs of this launch, extra ids (verify drafts) */
            p->slot = j;
            n_pt[j] = n_ot[j] = 0;
            p->rep = 1.0f;
            if (rnd() % 2) {
                p->pen = 1;
                const int what = (int)(rnd() % 4);
                p->rep = what == 1 ? 1.0f : (rnd() % 2 ? 0.5f + 1.5f * rndf() : 1.0f + rndf());
                p->freq = what == 2 ? 0.0f : 4 * rndf() - 2;
                p->pres = what == 3 ? 0.0f : 4 * rndf() - 2;
                const int span = 20 + (int)(rnd() % 200);
                n_pt[j] = 1 + (int)(rnd() % 60);
                n_ot[j] = (int)(rnd() % 80);
                for (int k = 0; k < n_pt[j]; k++) ptoks[j * NTOK + k] = (int32_t)(rnd() % span);
                for (int k = 0; k < n_ot[j]; k++) otoks[j * NTOK + k] = (int32_t)(rnd() % span);
                for (int k = 0; k < n_pt[j]; k++) pen_state[(size_t)j * V + ptoks[j * NTOK + k]] |= 1;
                const int ne = n_ot[j] > 0 ? (int)(rnd() % (n_ot[j] < 8 ? n_ot[j] + 1 : 9)) : 0;
                const int nu = (int)(rnd() % (n_ot[j] - ne + 1));
                for (int k = 0; k < n_ot[j] - ne; k++) {
                    const int32_t t = otoks[j * NTOK + k];
                    if (k < nu) {
                        upd[1 + 2 * upd[0]] = j;
                        upd[2 + 2 * upd[0]] = t;
                        upd[0]++;
                    } else {
                        pen_state[(size_t)j * V + t] += 2;
                    }
                }
                p->extra_off = ban_used;
                p->n_extra = ne;
                for (int k = 0; k < ne; k++) bans[ban_used++] = otoks[j * NTOK + n_ot[j] - ne + k];
                n_pen_rows++;
                n_extra_rows += ne > 0;
            }
            p->n_bias = 0;
            if (rnd() % 3 == 0) {
                p->n_bias = 1 + (int)(rnd() % MAXB);
                int32_t id = (int32_t)(rnd() % 50);
                for (int k = 0; k < p->n_bias; k++) {
                    bias_tab[j * MAXB + k].id = id;
                    bias_tab[j * MAXB + k].bias = (float)(rnd() % 3 == 0 ? (rnd() % 2 ? 100 : -100) : 20 * rndf() - 10);
                    ebias[j * MAXB + k].id = id;
                    ebias[j * MAXB + k].bias = bias_tab[j * MAXB + k].bias;
                    id += 1 + (int32_t)(rnd() % 70);
                    if (id >= V) {
                        p->n_bias = k + 1;
                        break;
                    }
                }
                /* the reference takes them in any order */
                for (int k = p->n_bias - 1; k > 0; k--) {
                    const int o = (int)(rnd() % (unsigned)(k + 1));
                    eng_logit_bias tmp = ebias[j * MAXB + k];
                    ebias[j * MAXB + k] = ebias[j * MAXB + o];
                    ebias[j * MAXB + o] = tmp;
                }
                n_bias_rows++;
            }
            if (kind == 1 && (p->pen || p->n_bias)) { /* the draft: the argmax of the penalized logits */
                eng_sampling ps = {.presence_penalty = p->pen ? p->pres : 0, .frequency_penalty = p->pen ? p->freq : 0,
                                   .repetition_penalty = p->pen ? p->rep : 1, .logit_bias = ebias + j * MAXB,
                                   .n_logit_bias = p->n_bias};
                eng_penalize(adj, l, V, &ps, ptoks + j * NTOK, n_pt[j], otoks + j * NTOK, n_ot[j]);
                int32_t best = 0;
                for (int i = 1; i < V; i++)
                    if (adj[i] > adj[best]) best = i;
                p->draft = best;
            }
        }
        int32_t n = ROWS;
        kern_op op = {.kind = KOP_SAMPLE};
        op.buf[0] = (kern_buf){logits, sizeof(float) * V * ROWS};
        op.buf[1] = (kern_buf){prm, sizeof *prm * ROWS};
        op.buf[2] = (kern_buf){bans, sizeof(int32_t) * NB};
        op.buf[3] = (kern_buf){out, sizeof *out * ROWS};
        op.buf[4] = (kern_buf){&n, sizeof n};
        op.p[0] = V;
        op.p[1] = ROWS;
        op.p[2] = NB;
        op.buf[5] = (kern_buf){pen_state, sizeof(int32_t) * ROWS * V};
        op.buf[6] = (kern_buf){bias_tab, sizeof *bias_tab * ROWS * MAXB};
        op.buf[7] = (kern_buf){upd, sizeof(int32_t) * (1 + 2 * (size_t)ROWS * NTOK)};
        op.p[3] = ROWS;
        op.p[4] = MAXB;
        op.p[5] = ROWS * NTOK;
        memset(out, 0xA5, sizeof *out * ROWS); /* poisoned: every field must be written */
        kern_cpu_exec(pool, &op);
        for (int j = 0; j < ROWS; j++) {
            const float *raw = logits + (size_t)j * V;
            const kern_sample_params *p = &prm[j];
            eng_sampling sp = {.temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p,
                               .min_p = p->min_p, .seed = p->seed, .logprobs = p->n_logprobs,
                               .presence_penalty = p->pen ? p->pres : 0, .frequency_penalty = p->pen ? p->freq : 0,
                               .repetition_penalty = p->pen ? p->rep : 1, .logit_bias = ebias + j * MAXB,
                               .n_logit_bias = p->n_bias};
            /* the choice sees the penalized logits, the logprobs the raw ones */
            eng_penalize(adj, raw, V, &sp, ptoks + j * NTOK, n_pt[j], otoks + j * NTOK, n_ot[j]);
            if (memcmp(adj, raw, sizeof(float) * V) != 0) n_pen_changed++;
            const float *l = adj;
            const int32_t *ban = bans + p->ban_off;
            float lp;
            eng_toplp top[ENG_MAX_LOGPROBS];
            int32_t tok;
            int acc = 0;
            if (p->score) { /* the given token, whatever the sampling parameters say */
                tok = p->draft;
                eng_logprobs(raw, V, tok, p->n_logprobs, &lp, top);
                n_scored++;
            } else if (p->draft >= 0) {
                tok = spec_verify_slot(l, &sp, p->draft, p->counter, ban, p->n_ban, &ss, &acc);
                eng_logprobs(raw, V, tok, p->n_logprobs, &lp, top);
                if (acc) n_acc++;
                else n_rej++;
            } else {
                tok = eng_choose(l, &sp, p->counter, ban, p->n_ban, &ss);
                eng_logprobs(raw, V, tok, p->n_logprobs, &lp, top);
                if (tok != eng_choose(l, &(eng_sampling){.temperature = 0}, 0, ban, p->n_ban, &ss)) n_sampled_not_best++;
            }
            if (out[j].tok != tok || out[j].accepted != acc)
                fail_msg("round %d row %d: op tok %d acc %d, reference tok %d acc %d (T %g k %d p %g min_p %g "
                         "draft %d bans %d)", round, j, out[j].tok, out[j].accepted, tok, acc, p->temperature,
                         p->top_k, p->top_p, p->min_p, p->draft, p->n_ban);
            assert_true(out[j].logprob == lp);
            int32_t rank = 0; /* score rows only: larger logits first; at equal ones +0 before -0, then lower ids */
            l = raw;
            if (p->score) {
                rank = 1;
                for (int i = 0; i < V; i++)
                    rank += l[i] > l[tok] ||
                            (l[i] == l[tok] && (signbit(l[i]) != signbit(l[tok]) ? !signbit(l[i]) : i < tok));
            }
            assert_int_equal(out[j].rank, rank);
            assert_int_equal(out[j].n_top, p->n_logprobs);
            for (int k = 0; k < p->n_logprobs; k++) {
                assert_int_equal(out[j].top[k].id, top[k].id);
                assert_true(out[j].top[k].logprob == top[k].logprob);
            }
        }
    }
    /* the rows exercised both branches of verification and real (non-greedy) draws */
    print_message("%d accepted, %d rejected, %d drawn not the best, %d scored\n", n_acc, n_rej, n_sampled_not_best, n_scored);
    assert_true(n_acc > 20 && n_rej > 20 && n_sampled_not_best > 50 && n_scored > 50);
    print_message("%d penalized rows (%d with extra ids), %d with logit_bias, %d whose logits changed\n", n_pen_rows,
                  n_extra_rows, n_bias_rows, n_pen_changed);
    assert_true(n_pen_rows > 300 && n_extra_rows > 100 && n_bias_rows > 200 && n_pen_changed > 400);
    free(pen_state);
    free(bias_tab);
    free(upd);
    free(ptoks);
    free(otoks);
    free(n_pt);
    free(n_ot);
    free(ebias);
    free(adj);
    kern_pool_destroy(pool);
    eng_sampler_scratch_free(&ss);
    free(logits);
    free(prm);
    free(out);
    free(bans);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answer),
        cmocka_unit_test(test_greedy_and_logprobs),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_sample_op_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
