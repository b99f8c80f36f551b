/* engine/engine_internal.h — the engine's state, shared by engine/engine.c (scheduler, plain
 * decoding) and spec_decode/ (the speculative step). Not an API: nothing outside those includes it. */
#ifndef GS_ENG_ENGINE_INTERNAL_H
#define GS_ENG_ENGINE_INTERNAL_H

#include "engine/engine.h"
#include "engine/kvpool.h"
#include "engine/weights.h"

#define MAX_BUCKETS 16
/* min_tokens bans of one token: the model's eos ids and the request's stop ids (at most 64) */
#define ENG_MAX_BANS (MDL_MAX_EOS + 64)


typedef struct {
    eng_request *req; /* NULL: free slot */
    int32_t *tokens;  /* [max_model_len]: prompt then generated */
    int n_tokens, n_computed, n_blocks;
    int n_hashed;   /* leading blocks registered in (or taken from) the prefix cache */
    uint64_t chain; /* chain hash after those blocks */
    int no_register; /* its KV spans a weight update ("keep"): never register its blocks */
    int pen;         /* the request has penalties: its outputs are counted in io.pen_state */
    int pen_folded;  /* outputs [0, pen_folded) are in io.pen_state or in the next launch's updates */
} eng_seq;

/* Decode-ready: the whole prompt is computed and the last known token, one the engine sampled, is
 * not yet in the target's KV cache (n_computed == n_tokens - 1, n_out >= 1). A prompt whose
 * uncomputed remainder is one token (a 1-token prompt, a prefill chunk or a prefix-cache hit ending
 * at n - 1) is NOT decode-ready: that token is prefilled and samples the first output token. With a
 * drafter this is the public loops' step sequence (z-lab dflash and DeepSpec prefill the whole
 * prompt and anchor the first speculative step on the first generated token; SPEC-NOTES.md 1.4, 3). */
static inline int eng_seq_decode_ready(const eng_seq *q)
{
    return q->req && q->n_computed == q->n_tokens - 1 && q->req->n_out > 0;
}

struct eng_engine {
    eng_config cfg;
    mdl_model *m;
    eng_backend *be;
    eng_step_io io;
    mdl_workspace ws;
    /* host mirrors of the step parameters */
    int32_t *h_tok, *h_pos, *h_slot, *h_kv_len, *h_logit_idx, *h_bt;
    int bt_dirty;
    int32_t *logit_seq; /* slot of each logits row */
    int32_t *logit_score; /* [LR] prompt index scored by each logits row (>= 1), or 0: a sampling row */
    kern_sample_params *h_samp; /* [LR] sampling parameters of each logits row */
    kern_sample_out *h_samp_out; /* [LR] what the step chose for each logits row */
    int32_t *h_bans;             /* [io.n_bans] */
    int n_bans_used;             /* filled this step */
    int32_t *h_upd;              /* [1 + 2 * io.max_upd] the next launch's pen_state updates */
    int upd_dirty;               /* the device's update count is nonzero (reset it before a launch) */
    int32_t *h_pen_row;          /* [V] a slot's pen_state row being written (all zero between uses) */
    /* plans */
    int n_buckets;
    int bucket_rows[MAX_BUCKETS];
    struct eng_plan *plans[MAX_BUCKETS];
    eng_tape tape; /* eager mode scratch, and capture */
    /* sequences and KV blocks */
    eng_seq *seqs;
    int32_t *token_store;
    eng_kvpool kv;
    int n_running;
    /* waiting FIFO */
    eng_request **queue;
    int q_head, q_len;
    int32_t banned[ENG_MAX_BANS];
    eng_stats stats;
    /* speculative decoding (draft == NULL: off); see engine/spec_step.c */
    mdl_model *draft;
    mdl_draft_io dio;
    mdl_draft_ws dws;
    int spec_B, spec_W;     /* drafter block rows, drafts per block */
    int lookahead;          /* positions past the last token a step may write (KV reservation) */
    int32_t *h_c_idx, *h_c_pos, *h_c_slot;                              /* [R] */
    int32_t *h_d_tok, *h_d_pos, *h_d_slot, *h_d_kv_len, *h_d_logit_idx; /* [R] */
    int32_t *h_d_anchor;                                                /* [S] */
    int32_t *h_drafts;                                                  /* [R] */
    float *h_conf;                                                      /* [R] */
    int32_t *sp_slot, *sp_nd, *sp_row0;                                 /* [S] per decoding sequence */
    int n_draft_buckets;
    int draft_bucket_seqs[MAX_BUCKETS];
    struct eng_plan *draft_plans[MAX_BUCKETS], *ctx_plans[MAX_BUCKETS];
    eng_tape dtape;
    /* weight updates (engine/weights.c) */
    eng_weights_info winfo;
    mdl_session ws_target, ws_draft;
    int ws_has_target, ws_has_draft;
    eng_wmodel ws_which;
    eng_pause ws_pause;
    int ws_full;
    double ws_t0;
    int admission_off;
    struct eng_guard_entry *guard;
    int n_guard;
    /* sleep (engine/sleep.c) */
    eng_sleep_info sleep;
    uint8_t *w_backup; /* level 1: the weights' bytes, in eng_sleep_ranges order */
};


/* engine.c helpers the speculative step reuses */
/* An arena allocation for a plan-visible buffer, or NULL with err naming it. */
void *eng_xalloc(eng_backend *be, size_t bytes, const char *tag, char *err, size_t errlen);
void eng_retire_and_admit(eng_engine *e);
void eng_add_rows(eng_engine *e, int slot, int count, int *rows);
/* Adds the rows of every sequence with exactly one known token left (decode = 1) or more (decode =
 * 0: prefill chunks of at most prefill_chunk) within max_step_tokens; a sequence whose rows reach
 * its last known token gets a logits row, and a sequence scoring its prompt one per row. */
void eng_schedule_rows(eng_engine *e, int decode, int *rows, int *nl);
/* Sampling parameters of the logits rows [from, nl) eng_schedule_rows added (score or sample). */
void eng_set_prefill_rows(eng_engine *e, int from, int nl);
/* After the step: writes the score rows of [from, nl) into their requests' prompt logprobs, appends
 * the sampled tokens, and finishes the sequences they end. */
void eng_emit_prefill(eng_engine *e, int from, int nl);
eng_finish eng_append_token(eng_engine *e, int slot, int32_t tok);
void eng_finish_seq(eng_engine *e, int slot, eng_finish why);
int eng_bucket_index(const eng_engine *e, int rows);
/* Sampling parameters of logits row j (h_samp[j], bans appended to h_bans): the token becomes
 * output index `counter` of r; draft >= 0 makes it a speculative verify row. With penalties,
 * extra[0..n_extra) (appended to h_bans) count as outputs too: a verify row's earlier drafts of its
 * block, which are outputs r->n_out .. counter - 1 if they are accepted. */
void eng_set_sample_row(eng_engine *e, int j, const eng_request *r, int counter, int32_t draft, const int32_t *extra,
                        int n_extra);
/* Uploads the target step parameters for `rows` rows and `nl` logits rows (h_samp filled by the
 * caller), runs the target (plan or eager; the tape ends with KOP_SAMPLE) and downloads the
 * chosen tokens into h_samp_out: no logits cross back to the host. */
void eng_run_target(eng_engine *e, int rows, int nl);
/* Appends the token chosen for logits row j (h_samp_out[j]) to sequence s, with its logprobs. */
eng_finish eng_emit_sampled(eng_engine *e, int s, int j);
/* Registers newly completed full blocks in the prefix cache (after n_computed is final). */
void eng_register_blocks(eng_engine *e);
/* min_tokens: writes the ids banned for the token at output index n_out of r into e->banned and
 * returns their count. */
int eng_banned_ids(eng_engine *e, const eng_request *r, int n_out);

/* engine/spec_step.c */
int spec_init(eng_engine *e, char *err, size_t errlen);
void spec_free(eng_engine *e);
int spec_step(eng_engine *e);

#endif
