/* spec_decode/verify.h — the per-slot verification rule of speculative decoding.
 *
 * The drafters here propose greedily, so the draft distribution q is a point mass on the draft d.
 * Standard speculative sampling then reduces to: accept d with probability min(1, p(d)/q(d)) = p(d);
 * on rejection sample from normalize(max(0, p - q)) = p with d removed. The emitted token is
 * distributed exactly as p (tested by a chi-square test). Greedy requests (temperature 0) accept
 * iff d is the target's argmax, so greedy output equals non-speculative output token for token. */
#ifndef GS_SPEC_VERIFY_H
#define GS_SPEC_VERIFY_H

#include <stdint.h>

#include "engine/sampler.h"
#include "kernels/kern.h" /* KERN_ACCEPT_COUNTER: the acceptance test's counter space */


/* Verifies draft d at one slot whose target logits are `logits` (the token becomes output index t;
 * banned: min_tokens bans). Returns the emitted token and sets *accepted. */
int32_t spec_verify_slot(const float *logits, const eng_sampling *sp, int32_t d, uint64_t t, const int32_t *banned,
                         int n_banned, eng_sampler_scratch *s, int *accepted);

#endif
