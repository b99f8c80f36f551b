#include "spec_decode/verify.h"

int32_t spec_verify_slot(const float *logits, const eng_sampling *sp, int32_t d, uint64_t t, const int32_t *banned,
                         int n_banned, eng_sampler_scratch *s, int *accepted)
{
    if (sp->temperature <= 1e-5f) {
        int32_t tok = eng_choose(logits, sp, t, banned, n_banned, s);
        *accepted = tok == d;
        return tok;
    }
    double p = eng_prob(logits, sp, d, banned, n_banned, s);
    if (eng_uniform(sp->seed, KERN_ACCEPT_COUNTER(t)) < p) {
        *accepted = 1;
        return d;
    }
    *accepted = 0;
    return eng_choose_excluding(logits, sp, t, banned, n_banned, d, s); /* residual: p without d */
}
