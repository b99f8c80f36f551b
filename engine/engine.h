/* engine/engine.h — the engine: one thread owns the backend, the model, the paged KV cache, the
 * scheduler (continuous batching with chunked prefill) and the plan cache.
 *
 * Requests are submitted and stepped from the same (engine) thread; other threads hand requests
 * over through their own queue (server/). A request's outputs are written into buffers its owner
 * allocated (max_tokens entries), so the step loop allocates nothing.
 *
 * Step: (1) retire cancelled requests, (2) admit waiting requests while a sequence slot and KV blocks
 * for prompt + max_tokens are free (reserved up front: no preemption is ever needed; leading full
 * prompt blocks found in the prefix cache are shared instead of recomputed), (3) build the
 * rows: every sequence with one token left (decode) first, then prefill chunks of at most
 * prefill_chunk tokens within max_step_tokens, (4) upload step parameters, launch the plan of the
 * smallest bucket >= rows (or run the tape eagerly), (5) download the logits of rows that end a
 * sequence's known tokens, sample, append, check stop conditions, call the callbacks.
 */
#ifndef GS_ENG_ENGINE_H
#define GS_ENG_ENGINE_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/sampler.h"
#include "models/model.h"

typedef struct {
    int max_seqs;        /* concurrent sequences (slots) */
    int max_step_tokens; /* rows of the largest plan bucket */
    int prefill_chunk;   /* max prompt tokens of one sequence per step */
    int block_size;      /* tokens per KV block */
    int max_model_len;   /* prompt + generated tokens per sequence (<= max_position_embeddings) */
    size_t kv_bytes;     /* KV cache budget */
    int use_plans;       /* 1: replay captured plans; 0: emit and run the tape each step */
    int queue_cap;       /* waiting requests */
    int prefix_caching;  /* share KV blocks of identical token prefixes (engine/kvpool.h) */
    /* speculative decoding (with a drafter) */
    int num_spec_tokens;        /* drafts verified per step at most (0: the drafter's full width) */
    float spec_conf_threshold;  /* DSpark: verify drafts only up to the first slot whose confidence
                                   c_k < threshold (per slot, as DeepSpec serves; 0: never cut) */
} eng_config;

void eng_config_defaults(eng_config *c);

typedef enum { ENG_FINISH_NONE = 0, ENG_FINISH_LENGTH, ENG_FINISH_STOP, ENG_FINISH_ABORT } eng_finish;
const char *eng_finish_name(eng_finish f);

/* logit_bias entries of one request (eng_sampling.n_logit_bias) */
#define ENG_MAX_LOGIT_BIAS 1024

/* per-draft-position acceptance counters keep positions 0..ENG_SPEC_MAX_POS-1 */
#define ENG_SPEC_MAX_POS 64

typedef struct eng_request eng_request;
struct eng_request {
    /* input (owned by the caller, valid until on_finish) */
    const int32_t *prompt;
    int n_prompt;
    int max_tokens, min_tokens, ignore_eos;
    /* 1: decode without the drafter even when the engine has one: the request verifies no drafts
     * (one target token per step, as plain decoding) and runs no drafter context rows, so it costs
     * what plain decoding costs; its KV blocks are never registered in the prefix cache (they lack
     * the drafter's context K/V a speculative request sharing them would read), cached blocks it
     * may still use. The HTTP "speculative": false; graphswap eval's baseline on a server with a
     * drafter. */
    int no_spec;
    const int32_t *stop_ids;
    int n_stop_ids;
    eng_sampling sp;
    /* outputs, caller-allocated: max_tokens entries (out_top: max_tokens * sp.logprobs) */
    int32_t *out_tokens;
    float *out_logprobs;
    eng_toplp *out_top;
    int n_out;
    eng_finish finish;
    int32_t stop_token; /* the eos / stop id that ended it, or -1 */
    /* callbacks, called on the engine thread. on_token may return nonzero to stop the request
     * (finish "stop"; the server uses it for stop strings). */
    int (*on_token)(eng_request *r, void *user);
    void (*on_finish)(eng_request *r, void *user);
    void *user;
    /* prompt logprobs (completions' echo with logprobs, vLLM's prompt_logprobs): with
     * out_prompt_logprobs set (caller-allocated, n_prompt entries each), entry i in [1, n_prompt)
     * receives the raw logprob of prompt[i] after prompt[0..i) and out_prompt_rank[i] its rank (1 =
     * the best id), out_prompt_top[i * prompt_top ..] the prompt_top best ids there; entry 0 is left
     * as the caller set it. Such a request computes its whole prompt (no prefix-cache reuse), and its
     * prefill rows each compute logits (lm_head and the sample op). A position is scored once: a
     * prefill repeated after a "recompute" weight update keeps the scores it has.
     * n_prompt_scored (the engine's count): entries [1, n_prompt_scored) are written, all of them
     * before the first token. */
    int prompt_top;
    float *out_prompt_logprobs;
    int32_t *out_prompt_rank;
    eng_toplp *out_prompt_top;
    int n_prompt_scored;
    /* prefix-cache salt (vLLM's cache_salt): 0 none, else eng_cache_salt_hash of the salt string,
     * computed once by the submitter. It seeds the chain hash the first block is hashed under, so
     * requests share cached blocks only with requests of the same salt (or, unsalted, with unsalted
     * ones). */
    uint64_t cache_salt;
    /* prompt tokens taken from the prefix cache at admission (leading full blocks shared times the
     * block size; 0 for a request with prompt logprobs or with prefix caching off). Engine-written. */
    int n_cached;
    atomic_int cancel; /* set from any thread: the request ends with "abort" at the next step */
    /* speculative decoding: per-request counters, optional per-step acceptance lengths
     * (caller-allocated, max_tokens entries), and a trace callback (engine thread) */
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted;
    /* steps whose draft at position k (0-based) was accepted (graphswap eval's acceptance rate per
     * draft position: divided by spec_drafts) */
    uint32_t spec_accepted_per_pos[ENG_SPEC_MAX_POS];
    /* weight versions its tokens were generated with, in order (a "keep" update mid-request adds
     * one); versions[0] is the version of its first token */
    uint64_t versions[8];
    int n_versions;
    int32_t *out_accept_lens;
    int n_accept;
    void (*on_spec)(eng_request *r, int step, int start, int32_t anchor, const int32_t *drafts, int n_drafts,
                    int accepted, int32_t bonus, void *user);
    /* engine-owned */
    int slot;
};

typedef struct {
    uint64_t steps, rows, prompt_tokens, generated_tokens, finished, plan_launches, eager_runs;
    uint64_t prefix_cache_queries, prefix_cache_hits; /* in tokens, as vLLM counts them */
    /* speculative decoding (vLLM names): proposals, proposed tokens, accepted tokens, accepted
     * tokens per draft position; time split of the speculative step */
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted;
    uint64_t spec_accepted_per_pos[ENG_SPEC_MAX_POS];
    double spec_ns_context, spec_ns_draft, spec_ns_verify;
} eng_stats;

typedef struct eng_engine eng_engine;

eng_engine *eng_create(const eng_config *cfg, mdl_model *m, eng_backend *be, char *err, size_t errlen);
/* With a drafter (DFlash / DSpark, loaded on the same backend): every step is draft -> verify ->
 * context (engine/spec_step.c). Greedy output is identical to eng_create's (I9). */
eng_engine *eng_create_spec(const eng_config *cfg, mdl_model *m, mdl_model *draft, eng_backend *be, char *err,
                            size_t errlen);
void eng_destroy(eng_engine *e);

/* Queues a request (validated: prompt ids < vocab, non-empty, prompt + max_tokens <= max_model_len,
 * logprobs <= 20). Returns 0, or -1 with err and *busy: 0 a bad request (400), 1 the queue is full
 * (429/503), 2 the weights are unusable (inconsistent or undefined: 503 with the reason). */
int eng_submit(eng_engine *e, eng_request *r, int *busy, char *err, size_t errlen);
/* eng_request.cache_salt of a salt string of len bytes: never 0 (0 means unsalted). */
uint64_t eng_cache_salt_hash(const char *salt, size_t len);

/* Runs one step. Returns the number of requests still running or waiting. */
int eng_step(eng_engine *e);
/* Steps until every submitted request finished. */
void eng_run_until_idle(eng_engine *e);

/* Ends every running and waiting request with finish "abort". */
void eng_abort_all(eng_engine *e);
/* Ends every running request with finish "abort" (waiting ones stay queued). */
void eng_abort_running(eng_engine *e);

int eng_num_running(const eng_engine *e);
int eng_spec_width(const eng_engine *e);      /* drafts a speculative step proposes (0: no drafter) */
int eng_num_waiting(const eng_engine *e);
int eng_kv_blocks_total(const eng_engine *e);
int eng_kv_blocks_free(const eng_engine *e);    /* free + cached (evictable) */
int eng_kv_blocks_in_use(const eng_engine *e);  /* referenced by running sequences */
/* Forgets every cached prefix block (after a weight update: no KV of old weights is reused). */
void eng_reset_prefix_cache(eng_engine *e);
const eng_stats *eng_get_stats(const eng_engine *e);
const eng_config *eng_get_config(const eng_engine *e);
const mdl_model *eng_model(const eng_engine *e);

/* ---- sleep: release memory for a colocated trainer, with stable addresses (engine/sleep.c) ------
 * Semantics of vLLM's sleep mode (CuMemAllocator: level 1 offloads the weights to host memory and
 * discards the KV cache; level 2 discards both) and SGLang's release_memory_occupation (tags
 * "weights", "kv_cache": release only what is named). The physical memory behind the named
 * allocations is given back to the system (backend mem_release) while every address stays
 * reserved, so the captured plans replay unchanged after wake-up (I1; no re-capture) and the guard
 * (I5) still passes.
 *   weights  (ENG_MEM_WEIGHTS): every parameter and derived buffer of the target and the drafter.
 *            Level 1: copied to host memory first and copied back at wake (bytes identical).
 *            Level 2: discarded; after wake the weights are "inconsistent" until a complete full
 *            update (partial updates 409, generation 503 with the reason, I8).
 *   kv_cache (ENG_MEM_KV): the KV caches of both models; always discarded (zero after wake) and
 *            the prefix cache is flushed.
 * Sleep aborts every running and waiting request (finish "abort"). While any tag sleeps, eng_submit
 * refuses (busy 2: 503); while the weights sleep, weight updates are refused (409); the rest keeps
 * working. Tags already asleep (at sleep) or awake (at wake) are skipped; tags 0 means both. Sleep is
 * refused during an open weight session (409) and once the weights are undefined (503).
 * Each returns 0, or -1 with err and *status (the HTTP status that fits). Engine thread only. */
#define ENG_MEM_WEIGHTS 1u
#define ENG_MEM_KV 2u
#define ENG_MEM_ALL (ENG_MEM_WEIGHTS | ENG_MEM_KV)
int eng_sleep(eng_engine *e, int level, unsigned tags, char *err, size_t errlen, int *status);
int eng_wake(eng_engine *e, unsigned tags, char *err, size_t errlen, int *status);
/* The tags now asleep (0: awake). */
unsigned eng_is_sleeping(const eng_engine *e);
typedef struct {
    unsigned asleep;        /* tags */
    int weights_level;      /* level the weights sleep at (0: awake) */
    size_t released[2];     /* bytes the backend gave up, by tag bit (weights, kv_cache) at the last sleep */
    size_t tag_bytes[2];    /* bytes of the allocations of each tag */
    size_t backup_bytes;    /* host copy of the weights (level 1) */
    uint64_t sleeps, wakes; /* counters */
} eng_sleep_info;
void eng_sleep_get_info(const eng_engine *e, eng_sleep_info *out);

/* Test hooks: the captured plan for `rows` rows (NULL when plans are off). */
struct eng_plan *eng_plan_for_rows(eng_engine *e, int rows);

#endif
