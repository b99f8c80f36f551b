/* engine/sampler.h — token sampling and logprobs on the host: the sort-based reference of the
 * KOP_SAMPLE op (kernels/kern.h). The engine samples inside its plans with that op; this code stays
 * as the independent check the op is tested against (tests/unit/test_sampler.c, test_spec.c).
 *
 * Reproducibility: randomness comes from Philox4x32-10 keyed by the request's seed with the
 * token's index in the request as counter, so a seeded request draws the same numbers whatever else
 * shares its batch or step. Logprobs are always those of the raw model distribution
 * (log_softmax of the logits, before temperature and filters), as vLLM reports them by default.
 */
#ifndef GS_ENG_SAMPLER_H
#define GS_ENG_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#define ENG_MAX_LOGPROBS 20

typedef struct {
    int32_t id;
    float bias; /* added to the logit of id (the server clamps it to [-100, 100]) */
} eng_logit_bias;

typedef struct {
    float temperature; /* <= 1e-5: greedy (argmax, lowest id on ties) */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    uint64_t seed;
    int logprobs;      /* number of top alternatives to report (0..ENG_MAX_LOGPROBS) */
    /* vLLM's penalties and logit_bias, applied to the raw logits before temperature and the filters
     * (logprobs stay raw): logit_bias first, then the repetition penalty over prompt and output
     * tokens, then frequency and presence penalties over output tokens (eng_penalize). */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    float repetition_penalty; /* 0 (a zeroed struct) or 1: off; else > 0 */
    const eng_logit_bias *logit_bias; /* n_logit_bias entries, unique ids (any order), owned by the
                                         caller until the request finishes */
    int n_logit_bias;
} eng_sampling;

/* 1 when sp has a repetition, frequency or presence penalty (the engine then keeps the sequence's
 * token counts); logit_bias alone does not count. */
int eng_sampling_has_penalties(const eng_sampling *sp);
/* The repetition penalty in effect: 1 for 0 (off). */
float eng_sampling_rep(const eng_sampling *sp);

typedef struct {
    int32_t id;
    float logprob;
} eng_toplp;

/* Scratch for one sampling call over a vocabulary of V (allocated once per engine). */
typedef struct {
    int V;
    float *prob;   /* [V] */
    int32_t *idx;  /* [V] */
} eng_sampler_scratch;

int eng_sampler_scratch_init(eng_sampler_scratch *s, int V);
void eng_sampler_scratch_free(eng_sampler_scratch *s);

/* Philox4x32-10 of (counter, key) -> 4 words. */
void eng_philox(uint64_t counter, uint64_t key, uint32_t out[4]);
/* Uniform double in [0, 1) for (seed, counter). */
double eng_uniform(uint64_t seed, uint64_t counter);

/* Samples one token from logits[V]. banned (may be NULL) lists ids that must not be chosen (min_tokens
 * keeps eos/stop ids out). counter: the token's index in its request. Writes the token's raw logprob
 * and, when sp->logprobs > 0, the sp->logprobs best raw logprobs (descending, ties by id). */
int32_t eng_sample(const float *logits, const eng_sampling *sp, uint64_t counter, const int32_t *banned,
                   int n_banned, eng_sampler_scratch *s, float *logprob, eng_toplp *top);

/* The token eng_sample would choose (no logprobs). */
int32_t eng_choose(const float *logits, const eng_sampling *sp, uint64_t counter, const int32_t *banned,
                   int n_banned, eng_sampler_scratch *s);
/* The same draw from the filtered distribution with `exclude` removed afterwards and the rest
 * renormalised (speculative resampling after a rejected draft). Bans apply before the filters
 * (min_tokens), `exclude` after them. */
int32_t eng_choose_excluding(const float *logits, const eng_sampling *sp, uint64_t counter, const int32_t *banned,
                             int n_banned, int32_t exclude, eng_sampler_scratch *s);
/* Probability of tok under the distribution eng_choose samples from (temperature, top-k, top-p,
 * min-p, bans); greedy: 1 for the argmax, else 0. Speculative verification accepts a draft with it. */
double eng_prob(const float *logits, const eng_sampling *sp, int32_t tok, const int32_t *banned, int n_banned,
                eng_sampler_scratch *s);
/* The logits the choice uses under sp's penalties and logit_bias (vLLM's order), written to
 * out[V] (out != logits): logit_bias added, then for every id seen in prompt[0..n_prompt) or
 * output[0..n_output) x = x > 0 ? x / rep : x * rep, then for every id x -= freq * count and
 * x -= pres * (count > 0) with count its occurrences in the output. Each step an f32 operation. The
 * sampling functions above take these logits; logprobs are computed from the raw ones. */
void eng_penalize(float *out, const float *logits, int V, const eng_sampling *sp, const int32_t *prompt,
                  int n_prompt, const int32_t *output, int n_output);

/* Raw logprob of tok and the k best raw logprobs (descending, ties by id). */
void eng_logprobs(const float *logits, int V, int32_t tok, int k, float *logprob, eng_toplp *top);

#endif
