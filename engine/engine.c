/* engine/engine.c — scheduler, KV block management, plan cache and the step loop (see engine.h). */
/* The life of a request. An eng_request has no state field: where it is follows from what holds it
 * (e->queue, or e->seqs[slot].req) and from its sequence's counters (eng_seq, engine_internal.h).
 *
 *   eng_submit (engine thread: server/core/jobs.c hands it the inbox's choices)
 *     |  checked: ids < vocab, prompt + max_tokens <= max_model_len, KV fits, logprobs, penalties;
 *     |  refused: -1 and *busy 0 bad request (400), 1 queue full, 2 asleep / INCONSISTENT /
 *     |  UNDEFINED weights (503 with the reason, I8)
 *     v
 *   QUEUED    in the e->queue FIFO, r->slot = -1 --- cancel flag ---------------> FINISHED "abort"
 *     |         (eng_retire_and_admit ends a cancelled request anywhere in the queue, not at the head)
 *     |  admit(): only in ENG_W_READY with admission on; strictly FIFO (a head that does not fit
 *     |  blocks the rest); needs a free slot and KV blocks for prompt + max_tokens + lookahead, all
 *     |  reserved now, so a running sequence never runs out of blocks (no preemption exists)
 *     v
 *   PREFILL   n_computed < n_tokens - 1, or n_computed == n_tokens - 1 with n_out == 0; leading full
 *     |         prompt blocks found in the prefix cache start it at n_computed = matched * block_size
 *     |  chunks of <= prefill_chunk rows per step; the row of the last known token samples the first
 *     |  output token (and rows scoring prompt logprobs, if asked, write those)
 *     v
 *   DECODE    eng_seq_decode_ready: n_computed == n_tokens - 1, n_out >= 1. One row per step; with a
 *     |         drafter the anchor + up to W drafts (spec_step.c), n_computed cut back to the accepted
 *     |  eng_append_token: on_token != 0, an eos or stop id (after min_tokens) -> "stop";
 *     |  max_tokens or max_model_len reached -> "length"
 *     v
 *   FINISHED  eng_finish_seq: blocks released, slot free, r->finish set, on_finish called (the last
 *             time the engine touches r)
 *
 *   From QUEUED or a slot to FINISHED "abort": the cancel flag (next step), eng_abort_running (the
 *   server's pause "abort"), eng_abort_all (sleep, shutdown), eng_weights_begin with pause "abort".
 *   A weight session freezes slots where they are: while ENG_W_UPDATING eng_step does nothing (I7).
 *   A finish that wrote weights sends "recompute" slots back to PREFILL (n_computed = 0: every known
 *   token again, under the new weights); "keep" slots go on where they were, their blocks never
 *   registered in the prefix cache (I6). After a failed session that wrote weights (INCONSISTENT)
 *   or a guard failure (UNDEFINED) the next eng_step ends every running and queued request "abort"
 *   (I8: no token from mixed weights), and eng_submit refuses new ones until a full update passes.
 *
 * One eng_step, in this order:
 *   0. ENG_W_UPDATING: return at once (I7); INCONSISTENT / UNDEFINED: abort everything, return (I8).
 *      With a drafter the rest is spec_step (spec_step.c).
 *   1. eng_retire_and_admit: cancelled slots and queued requests end "abort", then admit().
 *   2. rows: decode rows first (eng_schedule_rows, decode = 1), then prefill chunks within
 *      max_step_tokens (decode = 0); each row that needs logits gets a logits row (sample or score).
 *   3. eng_set_prefill_rows: sampling parameters, bans and penalties of every logits row.
 *   4. eng_run_target: upload the step parameters (penalty updates, block tables when dirty), launch
 *      the plan of the smallest bucket >= rows (or run the tape eagerly), download the chosen tokens.
 *   5. n_computed += rows; eng_register_blocks (prefix cache); eng_emit_prefill (scores, append,
 *      stop conditions, callbacks, finish).
 * Weight commands, pauses and closures are not part of a step: the server's engine loop runs them
 * between steps (server/serve.c engine_main), so every step runs on one set of weights (I7). Pause
 * modes there: "abort" ends running requests (at begin, or by /pause); "wait" turns admission off
 * (eng_set_admission) and steps until nothing runs, bounded, before the begin; "keep" and
 * "recompute" freeze the slots as above; the server's /pause (srv_state.paused) just stops stepping.
 */
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/kvpool.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void eng_config_defaults(eng_config *c)
{
    c->max_seqs = 64;
    c->max_step_tokens = 256;
    c->prefill_chunk = 256;
    c->block_size = 16;
    c->max_model_len = 4096;
    c->kv_bytes = 512u << 20;
    c->use_plans = 1;
    c->queue_cap = 4096;
    c->prefix_caching = 1;
    c->num_spec_tokens = 0;
    c->spec_conf_threshold = 0;
}

const char *eng_finish_name(eng_finish f)
{
    switch (f) {
    case ENG_FINISH_LENGTH: return "length";
    case ENG_FINISH_STOP: return "stop";
    case ENG_FINISH_ABORT: return "abort";
    default: return "none";
    }
}

void *eng_xalloc(eng_backend *be, size_t bytes, const char *tag, char *err, size_t errlen)
{
    void *p = be->ops->alloc(be, bytes, tag);
    if (!p) snprintf(err, errlen, "out of device memory allocating %s (%zu bytes)", tag, bytes);
    return p;
}

eng_engine *eng_create(const eng_config *cfg, mdl_model *m, eng_backend *be, char *err, size_t errlen)
{
    return eng_create_spec(cfg, m, NULL, be, err, errlen);
}

eng_engine *eng_create_spec(const eng_config *cfg_in, mdl_model *m, mdl_model *draft, eng_backend *be, char *err,
                            size_t errlen)
{
    eng_engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    e->cfg = *cfg_in;
    eng_config *c = &e->cfg;
    e->m = m;
    e->be = be;
    const mdl_config *mc = &m->cfg;
    if (c->max_model_len > mc->max_pos) c->max_model_len = mc->max_pos;
    if (c->max_seqs < 1 || c->max_step_tokens < 1 || c->block_size < 1 || c->max_model_len < 2 ||
        c->prefill_chunk < 1) {
        snprintf(err, errlen, "invalid engine configuration");
        goto fail;
    }
    if (draft) {
        if (mdl_config_check_drafter(mc, &draft->cfg, err, errlen) != 0) goto fail;
        e->draft = draft;
        e->spec_B = draft->cfg.block_size;
        e->spec_W = draft->cfg.arch == MDL_ARCH_DSPARK ? e->spec_B : e->spec_B - 1;
        /* a step writes up to B positions past the last token (drafter block, verify rows) */
        e->lookahead = e->spec_B + 1;
        /* every running sequence must fit its verify rows (W + 1) and draft rows (B) in one step */
        int per_seq = (e->spec_W + 1 > e->spec_B ? e->spec_W + 1 : e->spec_B);
        if (c->max_seqs * per_seq > c->max_step_tokens) c->max_seqs = c->max_step_tokens / per_seq;
        if (c->max_seqs < 1) {
            snprintf(err, errlen, "max_step_tokens %d is smaller than one speculative block (%d rows)",
                     c->max_step_tokens, per_seq);
            goto fail;
        }
    }
    if (c->max_seqs > c->max_step_tokens) c->max_seqs = c->max_step_tokens;
    const int R = c->max_step_tokens, S = c->max_seqs;
    /* logits rows per step: any row may need one (verify rows with a drafter, a prompt being scored
     * for prompt logprobs), so the workspace holds R; a step computes only the n_logits it uses */
    const int LR = R;
    e->io.max_rows = R;
    e->io.max_seqs = S;
    e->io.block_size = c->block_size;
    e->io.max_blocks = (c->max_model_len + e->lookahead + c->block_size - 1) / c->block_size;
    const size_t per_block = (size_t)c->block_size * (size_t)mc->kv_heads * (size_t)mc->head_dim * sizeof(float);
    size_t nb = c->kv_bytes / (2 * (size_t)mc->layers * per_block);
    size_t nb_max = (size_t)S * (size_t)e->io.max_blocks;
    if (nb > nb_max) nb = nb_max;
    if (nb < (size_t)e->io.max_blocks) {
        snprintf(err, errlen, "KV cache budget of %zu bytes holds %zu blocks; one sequence of %d tokens needs %d",
                 c->kv_bytes, nb, c->max_model_len, e->io.max_blocks);
        goto fail;
    }
    e->io.num_blocks = (int)nb;
    e->io.kv_layer_bytes = nb * per_block;

    /* plan-visible buffers: all allocated here, before the first capture (I1) */
    const size_t i32 = sizeof(int32_t);
    if (!(e->io.tok = eng_xalloc(be, (size_t)R * i32, "step.tok", err, errlen)) ||
        !(e->io.pos = eng_xalloc(be, (size_t)R * i32, "step.pos", err, errlen)) ||
        !(e->io.slot = eng_xalloc(be, (size_t)R * i32, "step.slot", err, errlen)) ||
        !(e->io.kv_len = eng_xalloc(be, (size_t)R * i32, "step.kv_len", err, errlen)) ||
        !(e->io.n_rows = eng_xalloc(be, i32, "step.n_rows", err, errlen)) ||
        !(e->io.logit_idx = eng_xalloc(be, (size_t)LR * i32, "step.logit_idx", err, errlen)) ||
        !(e->io.n_logits = eng_xalloc(be, i32, "step.n_logits", err, errlen)) ||
        !(e->io.block_tables = eng_xalloc(be, (size_t)S * (size_t)e->io.max_blocks * i32, "step.block_tables", err, errlen)) ||
        !(e->io.samp = eng_xalloc(be, (size_t)LR * sizeof(kern_sample_params), "step.samp", err, errlen)) ||
        !(e->io.samp_out = eng_xalloc(be, (size_t)LR * sizeof(kern_sample_out), "step.samp_out", err, errlen)) ||
        !(e->io.bans = eng_xalloc(be, (size_t)LR * (ENG_MAX_BANS + (size_t)e->spec_W) * i32, "step.bans", err, errlen)))
        goto fail;
    e->io.n_bans = LR * (ENG_MAX_BANS + e->spec_W); /* bans, and a verify row's earlier drafts (penalties) */
    /* penalties and logit_bias: per-slot state the sample op reads in place, and the updates of a
     * launch (a step appends at most one token per logits row of the step before) */
    e->io.max_bias = ENG_MAX_LOGIT_BIAS;
    e->io.max_upd = LR;
    if (!(e->io.pen_state = eng_xalloc(be, (size_t)S * (size_t)mc->vocab * i32, "step.pen_state", err, errlen)) ||
        !(e->io.bias = eng_xalloc(be, (size_t)S * ENG_MAX_LOGIT_BIAS * sizeof(kern_logit_bias), "step.bias", err,
                                  errlen)) ||
        !(e->io.upd = eng_xalloc(be, (1 + 2 * (size_t)LR) * i32, "step.upd", err, errlen)))
        goto fail;
    e->io.kcache = calloc((size_t)mc->layers, sizeof(float *));
    e->io.vcache = calloc((size_t)mc->layers, sizeof(float *));
    if (!e->io.kcache || !e->io.vcache) goto oom;
    for (int l = 0; l < mc->layers; l++) {
        char tag[48];
        snprintf(tag, sizeof tag, "kv.k.%d", l);
        if (!(e->io.kcache[l] = eng_xalloc(be, e->io.kv_layer_bytes, tag, err, errlen))) goto fail;
        snprintf(tag, sizeof tag, "kv.v.%d", l);
        if (!(e->io.vcache[l] = eng_xalloc(be, e->io.kv_layer_bytes, tag, err, errlen))) goto fail;
    }
    if (mdl_workspace_alloc(m, be, R, LR, &e->ws, err, errlen) != 0) goto fail;
    if (draft && mdl_workspace_add_features(m, be, &e->ws, draft->cfg.target_ids, draft->cfg.n_target_ids, err,
                                            errlen) != 0)
        goto fail;

    /* host side */
    e->h_tok = calloc((size_t)R, i32);
    e->h_pos = calloc((size_t)R, i32);
    e->h_slot = calloc((size_t)R, i32);
    e->h_kv_len = calloc((size_t)R, i32);
    e->h_logit_idx = calloc((size_t)LR, i32);
    e->logit_seq = calloc((size_t)LR, i32);
    e->logit_score = calloc((size_t)LR, i32);
    e->h_bt = calloc((size_t)S * (size_t)e->io.max_blocks, i32);
    e->h_samp = calloc((size_t)LR, sizeof *e->h_samp);
    e->h_samp_out = calloc((size_t)LR, sizeof *e->h_samp_out);
    e->h_bans = calloc((size_t)e->io.n_bans, i32);
    e->h_upd = calloc(1 + 2 * (size_t)LR, i32);
    e->h_pen_row = calloc((size_t)mc->vocab, i32);
    e->seqs = calloc((size_t)S, sizeof *e->seqs);
    e->token_store = malloc((size_t)S * (size_t)c->max_model_len * i32);
    e->queue = calloc((size_t)c->queue_cap, sizeof *e->queue);
    if (!e->h_tok || !e->h_pos || !e->h_slot || !e->h_kv_len || !e->h_logit_idx || !e->logit_seq || !e->logit_score ||
        !e->h_bt || !e->h_samp || !e->h_samp_out || !e->h_bans || !e->h_upd || !e->h_pen_row || !e->seqs || !e->token_store || !e->queue ||
        eng_kvpool_init(&e->kv, (int)nb, c->block_size) != 0)
        goto oom;
    for (int s = 0; s < S; s++) e->seqs[s].tokens = e->token_store + (size_t)s * (size_t)c->max_model_len;
    e->bt_dirty = 1;
    /* the op reads the update count every launch: zero until the first penalized output */
    be->ops->upload(be, e->io.upd, e->h_upd, i32);

    if (eng_tape_init(&e->tape, mdl_forward_ops(m)) != 0) goto oom;
    /* buckets: 1, 2, 4, ... up to max_step_tokens (the last one exactly max_step_tokens) */
    for (int r = 1;; r *= 2) {
        int rows = r < R ? r : R;
        e->bucket_rows[e->n_buckets++] = rows;
        if (rows == R || e->n_buckets == MAX_BUCKETS) break;
    }
    if (e->bucket_rows[e->n_buckets - 1] != R) {
        snprintf(err, errlen, "max_step_tokens %d needs more than %d plan buckets", R, MAX_BUCKETS);
        goto fail;
    }
    /* I1: every plan-visible buffer (step I/O, KV, workspaces above; the drafter's in spec_init) exists
     * before the first capture below; nothing a plan bakes is allocated after it. */
    if (draft && spec_init(e, err, errlen) != 0) goto fail;
    if (c->use_plans) {
        for (int b = 0; b < e->n_buckets; b++) {
            int rows = e->bucket_rows[b];
            eng_tape_reset(&e->tape);
            mdl_emit_forward(m, &e->ws, &e->io, rows, rows < LR ? rows : LR, &e->tape);
            e->plans[b] = be->ops->plan_create(be, &e->tape);
            if (!e->plans[b]) {
                snprintf(err, errlen, "plan capture failed for %d rows", rows);
                goto fail;
            }
        }
    }
    snprintf(e->winfo.version, sizeof e->winfo.version, "0");
    /* I5: the reference the guard compares against at every finish and wake-up: the addresses, sizes
     * and dtypes the plans just captured */
    if (eng_guard_record(e) != 0) goto oom;
    return e;
oom:
    snprintf(err, errlen, "out of host memory creating the engine");
fail:
    eng_destroy(e);
    return NULL;
}

void eng_destroy(eng_engine *e)
{
    if (!e) return;
    for (int b = 0; b < e->n_buckets; b++)
        if (e->plans[b]) e->be->ops->plan_free(e->be, e->plans[b]);
    spec_free(e);
    free(e->guard);
    free(e->w_backup); /* (destroyed asleep at level 1) */
    if (e->ws_has_target) mdl_session_end(&e->ws_target);
    if (e->ws_has_draft) mdl_session_end(&e->ws_draft);
    eng_tape_free(&e->tape);
    free(e->io.kcache);
    free(e->io.vcache);
    free(e->h_tok);
    free(e->h_pos);
    free(e->h_slot);
    free(e->h_kv_len);
    free(e->h_logit_idx);
    free(e->logit_seq);
    free(e->logit_score);
    free(e->h_bt);
    free(e->h_samp);
    free(e->h_samp_out);
    free(e->h_bans);
    free(e->h_upd);
    free(e->h_pen_row);
    free(e->seqs);
    free(e->token_store);
    eng_kvpool_free(&e->kv);
    free(e->queue);
    free(e);
}

static int blocks_for(const eng_engine *e, const eng_request *r);

/* vLLM's ranges (SamplingParams._verify_args): presence and frequency in [-2, 2], repetition > 0;
 * logit_bias ids in [0, V), ascending and unique, finite values. */
static int eng_check_penalties(const eng_engine *e, const eng_sampling *sp, char *err, size_t errlen)
{
    const int V = e->m->cfg.vocab;
    if (!(sp->presence_penalty >= -2 && sp->presence_penalty <= 2)) {
        snprintf(err, errlen, "presence_penalty must be in [-2, 2], got %g", (double)sp->presence_penalty);
        return -1;
    }
    if (!(sp->frequency_penalty >= -2 && sp->frequency_penalty <= 2)) {
        snprintf(err, errlen, "frequency_penalty must be in [-2, 2], got %g", (double)sp->frequency_penalty);
        return -1;
    }
    if (!(sp->repetition_penalty >= 0 && isfinite(sp->repetition_penalty))) {
        snprintf(err, errlen, "repetition_penalty must be greater than zero, got %g", (double)sp->repetition_penalty);
        return -1;
    }
    if (sp->n_logit_bias < 0 || sp->n_logit_bias > ENG_MAX_LOGIT_BIAS || (sp->n_logit_bias > 0 && !sp->logit_bias)) {
        snprintf(err, errlen, "logit_bias may hold at most %d entries", ENG_MAX_LOGIT_BIAS);
        return -1;
    }
    for (int k = 0; k < sp->n_logit_bias; k++) {
        const eng_logit_bias *b = &sp->logit_bias[k];
        if (b->id < 0 || b->id >= V) {
            snprintf(err, errlen, "logit_bias key %d is not a token id in [0, %d)", b->id, V);
            return -1;
        }
        if (k > 0 && b->id <= sp->logit_bias[k - 1].id) {
            snprintf(err, errlen, "logit_bias ids must be ascending and unique (%d after %d)", b->id,
                     sp->logit_bias[k - 1].id);
            return -1;
        }
        if (!isfinite(b->bias)) {
            snprintf(err, errlen, "logit_bias value for token %d must be finite", b->id);
            return -1;
        }
    }
    if (e->draft && eng_sampling_has_penalties(sp) && e->spec_W > KERN_SAMPLE_MAX_EXTRA) {
        snprintf(err, errlen, "penalties with a drafter of %d drafts per step are not supported (at most %d)",
                 e->spec_W, KERN_SAMPLE_MAX_EXTRA);
        return -1;
    }
    return 0;
}

/* A newly admitted request's penalty state: its slot's pen_state row (prompt ids, no outputs) and
 * logit_bias list, written in place before the step's launch (no allocation: h_pen_row is the
 * engine's, zero between uses). */
static void pen_admit(eng_engine *e, int slot, const eng_request *r)
{
    eng_seq *s = &e->seqs[slot];
    eng_backend *be = e->be;
    const int V = e->m->cfg.vocab;
    s->pen = eng_sampling_has_penalties(&r->sp);
    s->pen_folded = 0;
    if (s->pen) {
        for (int i = 0; i < r->n_prompt; i++) e->h_pen_row[r->prompt[i]] = 1;
        be->ops->upload(be, e->io.pen_state + (size_t)slot * (size_t)V, e->h_pen_row, (size_t)V * sizeof(int32_t));
        for (int i = 0; i < r->n_prompt; i++) e->h_pen_row[r->prompt[i]] = 0;
    }
    if (r->sp.n_logit_bias > 0) {
        _Static_assert(sizeof(eng_logit_bias) == sizeof(kern_logit_bias), "the same record");
        be->ops->upload(be, e->io.bias + (size_t)slot * ENG_MAX_LOGIT_BIAS, r->sp.logit_bias,
                        (size_t)r->sp.n_logit_bias * sizeof(kern_logit_bias));
    }
}

/* The outputs of penalized sequences not yet counted in pen_state, as the next launch's updates. */
static void pen_fold(eng_engine *e)
{
    int n = 0;
    for (int s = 0; s < e->cfg.max_seqs; s++) {
        eng_seq *q = &e->seqs[s];
        if (!q->req || !q->pen) continue;
        /* at most one token per logits row of the last launch (<= max_upd); never past the list */
        for (; q->pen_folded < q->req->n_out && n < e->io.max_upd; q->pen_folded++) {
            e->h_upd[1 + 2 * n] = s;
            e->h_upd[2 + 2 * n] = q->req->out_tokens[q->pen_folded];
            n++;
        }
    }
    if (n == 0 && !e->upd_dirty) return;
    e->h_upd[0] = n;
    e->be->ops->upload(e->be, e->io.upd, e->h_upd, (1 + 2 * (size_t)n) * sizeof(int32_t));
    e->upd_dirty = n > 0;
}

int eng_submit(eng_engine *e, eng_request *r, int *busy, char *err, size_t errlen)
{
    const int V = e->m->cfg.vocab;
    if (busy) *busy = 0;
    if (r->n_prompt < 1) {
        snprintf(err, errlen, "prompt must contain at least one token");
        return -1;
    }
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= V) {
            snprintf(err, errlen, "prompt token id %d at index %d is out of range [0, %d)", r->prompt[i], i, V);
            return -1;
        }
    if (r->max_tokens < 1) {
        snprintf(err, errlen, "max_tokens must be at least 1");
        return -1;
    }
    if (r->n_prompt > e->cfg.max_model_len || r->max_tokens > e->cfg.max_model_len - r->n_prompt) {
        snprintf(err, errlen,
                 "this model's maximum context length is %d tokens; the request has %d prompt tokens "
                 "and max_tokens %d",
                 e->cfg.max_model_len, r->n_prompt, r->max_tokens);
        return -1;
    }
    if (blocks_for(e, r) > e->io.num_blocks) {
        snprintf(err, errlen, "the request needs %d KV blocks but the cache holds %d", blocks_for(e, r),
                 e->io.num_blocks);
        return -1;
    }
    if (r->sp.logprobs < 0 || r->sp.logprobs > ENG_MAX_LOGPROBS) {
        snprintf(err, errlen, "logprobs must be in [0, %d]", ENG_MAX_LOGPROBS);
        return -1;
    }
    if (r->out_prompt_logprobs && (r->prompt_top < 0 || r->prompt_top > ENG_MAX_LOGPROBS || !r->out_prompt_rank ||
                                   (r->prompt_top > 0 && !r->out_prompt_top))) {
        snprintf(err, errlen, "prompt logprobs must be in [0, %d]", ENG_MAX_LOGPROBS);
        return -1;
    }
    if (r->n_stop_ids > 64) {
        snprintf(err, errlen, "at most 64 stop_token_ids");
        return -1;
    }
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= V) {
            snprintf(err, errlen, "stop_token_ids[%d] = %d is not a token id in [0, %d)", i, r->stop_ids[i], V);
            return -1;
        }
    if (e->sleep.asleep) {
        snprintf(err, errlen, "the engine is asleep (%s%s%s released): wake it up first (POST /wake_up or "
                 "/resume_memory_occupation)",
                 e->sleep.asleep & ENG_MEM_WEIGHTS ? "weights" : "",
                 e->sleep.asleep == ENG_MEM_ALL ? " and " : "", e->sleep.asleep & ENG_MEM_KV ? "kv_cache" : "");
        if (busy) *busy = 2;
        return -1;
    }
    if (eng_check_penalties(e, &r->sp, err, errlen) != 0) return -1;
    /* I8 (and I5): nothing is queued on weights a failed update left half written or a guard
     * failure left undefined; busy 2 becomes a 503 carrying the reason */
    if (e->winfo.state == ENG_W_INCONSISTENT || e->winfo.state == ENG_W_UNDEFINED) {
        snprintf(err, errlen, "weights are %s: %s", eng_wstate_name(e->winfo.state), e->winfo.reason);
        if (busy) *busy = 2;
        return -1;
    }
    if (e->q_len == e->cfg.queue_cap) {
        snprintf(err, errlen, "the request queue is full (%d waiting)", e->q_len);
        if (busy) *busy = 1;
        return -1;
    }
    r->n_out = 0;
    r->n_versions = 0;
    r->n_accept = 0;
    r->n_prompt_scored = 1;
    r->n_cached = 0;
    r->spec_drafts = r->spec_draft_tokens = r->spec_accepted = 0;
    memset(r->spec_accepted_per_pos, 0, sizeof r->spec_accepted_per_pos);
    r->finish = ENG_FINISH_NONE;
    r->stop_token = -1;
    r->slot = -1;
    e->queue[(e->q_head + e->q_len) % e->cfg.queue_cap] = r;
    e->q_len++;
    return 0;
}

uint64_t eng_cache_salt_hash(const char *salt, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)salt[i]) * 0x100000001b3ull;
    h ^= (uint64_t)len;
    h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

static int blocks_for(const eng_engine *e, const eng_request *r)
{
    int total = r->n_prompt + r->max_tokens + e->lookahead;
    return (total + e->cfg.block_size - 1) / e->cfg.block_size;
}

void eng_finish_seq(eng_engine *e, int slot, eng_finish why)
{
    eng_seq *s = &e->seqs[slot];
    eng_request *r = s->req;
    int32_t *bt = e->h_bt + (size_t)slot * (size_t)e->io.max_blocks;
    for (int b = 0; b < s->n_blocks; b++) eng_kvpool_release(&e->kv, bt[b]);
    memset(bt, 0, (size_t)s->n_blocks * sizeof *bt);
    e->bt_dirty = 1;
    s->req = NULL;
    s->n_blocks = s->n_tokens = s->n_computed = s->n_hashed = 0;
    s->no_register = 0;
    e->n_running--;
    e->stats.finished++;
    /* on_finish last, after the slot is free: its owner may free r as soon as it returns */
    r->finish = why;
    r->slot = -1;
    if (r->on_finish) r->on_finish(r, r->user);
}

static void admit(eng_engine *e)
{
    /* I7: no sequence starts during a session or a "wait" drain; I8: none starts on INCONSISTENT or
     * UNDEFINED weights (eng_step aborts those queued before the failure) */
    if (e->admission_off || e->winfo.state != ENG_W_READY) return; /* draining or updating */
    while (e->q_len > 0) {
        eng_request *r = e->queue[e->q_head];
        if (atomic_load(&r->cancel)) { /* cancelled while waiting */
            e->q_head = (e->q_head + 1) % e->cfg.queue_cap;
            e->q_len--;
            r->finish = ENG_FINISH_ABORT;
            if (r->on_finish) r->on_finish(r, r->user);
            continue;
        }
        if (e->n_running == e->cfg.max_seqs) return;
        int slot = 0;
        while (e->seqs[slot].req) slot++;
        eng_seq *s = &e->seqs[slot];
        int32_t *bt = e->h_bt + (size_t)slot * (size_t)e->io.max_blocks;
        /* prefix cache: reuse the longest run of cached full blocks, always leaving at least one
         * prompt token to compute (its logits start the generation) */
        const int bs = e->cfg.block_size;
        int matched = 0, cached_idle = 0;
        uint64_t chain = eng_kvpool_root(r->cache_salt);
        if (e->cfg.prefix_caching && !r->out_prompt_logprobs) { /* scoring needs every prompt row */
            for (int i = 0; i < (r->n_prompt - 1) / bs; i++) {
                int32_t b = eng_kvpool_lookup(&e->kv, chain, r->prompt + (size_t)i * (size_t)bs);
                if (b < 0) break;
                bt[matched++] = b;
                cached_idle += e->kv.ref[b] == 0;
                chain = eng_kvpool_hash(chain, r->prompt + (size_t)i * (size_t)bs, bs);
            }
        }
        int need = blocks_for(e, r) - matched;
        /* matched blocks idle in the LRU count as available, but this request takes them itself: they
         * cannot also be among the `need` fresh ones */
        if (need > eng_kvpool_available(&e->kv) - cached_idle) return; /* wait for blocks */
        for (int b = 0; b < matched; b++) eng_kvpool_acquire(&e->kv, bt[b]);
        for (int b = 0; b < need; b++) bt[matched + b] = eng_kvpool_alloc(&e->kv);
        e->q_head = (e->q_head + 1) % e->cfg.queue_cap;
        e->q_len--;
        s->req = r;
        r->slot = slot;
        memcpy(s->tokens, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
        s->n_tokens = r->n_prompt;
        s->n_computed = matched * bs;
        s->n_hashed = matched;
        s->chain = chain;
        r->n_cached = matched * bs;
        s->n_blocks = matched + need;
        e->bt_dirty = 1;
        pen_admit(e, slot, r);
        if (e->cfg.prefix_caching) {
            e->stats.prefix_cache_queries += (uint64_t)r->n_prompt;
            e->stats.prefix_cache_hits += (uint64_t)(matched * bs);
        }
        e->n_running++;
        e->stats.prompt_tokens += (uint64_t)r->n_prompt;
    }
}

void eng_add_rows(eng_engine *e, int slot, int count, int *rows)
{
    eng_seq *s = &e->seqs[slot];
    for (int i = 0; i < count; i++) {
        int p = s->n_computed + i, r = (*rows)++;
        e->h_tok[r] = s->tokens[p];
        e->h_pos[r] = p;
        e->h_slot[r] = slot;
        e->h_kv_len[r] = p + 1; /* causal */
    }
}

/* Appends a sampled token; returns the finish reason it triggers (NONE to go on). */
eng_finish eng_append_token(eng_engine *e, int slot, int32_t tok)
{
    eng_seq *s = &e->seqs[slot];
    eng_request *r = s->req;
    s->tokens[s->n_tokens++] = tok;
    /* I6: the version this token was generated with; a "keep" update mid-request appends the new one */
    if (r->n_versions == 0 || r->versions[r->n_versions - 1] != e->winfo.version_num) {
        if (r->n_versions < 8) r->versions[r->n_versions++] = e->winfo.version_num;
    }
    r->out_tokens[r->n_out] = tok;
    r->n_out++;
    e->stats.generated_tokens++;
    if (r->on_token && r->on_token(r, r->user)) return ENG_FINISH_STOP;
    if (r->n_out >= r->min_tokens) {
        const mdl_config *mc = &e->m->cfg;
        if (!r->ignore_eos)
            for (int i = 0; i < mc->n_eos; i++)
                if (tok == mc->eos[i]) {
                    r->stop_token = tok;
                    return ENG_FINISH_STOP;
                }
        for (int i = 0; i < r->n_stop_ids; i++)
            if (tok == r->stop_ids[i]) {
                r->stop_token = tok;
                return ENG_FINISH_STOP;
            }
    }
    if (r->n_out >= r->max_tokens || s->n_tokens >= e->cfg.max_model_len) return ENG_FINISH_LENGTH;
    return ENG_FINISH_NONE;
}

/* Batch invariance: a bucket only bounds the extents a plan was captured for; it reads n_rows and
 * n_logits at run time and a row's result depends only on its own sequence, never on the step's other
 * rows, so which bucket (or eager run) computes a row never changes its bits. */
int eng_bucket_index(const eng_engine *e, int rows)
{
    for (int b = 0; b < e->n_buckets; b++)
        if (e->bucket_rows[b] >= rows) return b;
    assert(0 && "rows exceed the largest bucket");
    return -1;
}

struct eng_plan *eng_plan_for_rows(eng_engine *e, int rows)
{
    return e->cfg.use_plans ? e->plans[eng_bucket_index(e, rows)] : NULL;
}

void eng_retire_and_admit(eng_engine *e)
{
    for (int s = 0; s < e->cfg.max_seqs; s++)
        if (e->seqs[s].req && atomic_load(&e->seqs[s].req->cancel)) eng_finish_seq(e, s, ENG_FINISH_ABORT);
    /* cancelled requests anywhere in the queue end now, not when they reach its head */
    int w = 0, cap = e->cfg.queue_cap;
    for (int i = 0; i < e->q_len; i++) {
        eng_request *r = e->queue[(e->q_head + i) % cap];
        if (atomic_load(&r->cancel)) {
            r->finish = ENG_FINISH_ABORT;
            if (r->on_finish) r->on_finish(r, r->user);
        } else {
            e->queue[(e->q_head + w++) % cap] = r;
        }
    }
    e->q_len = w;
    admit(e);
}

void eng_set_sample_row(eng_engine *e, int j, const eng_request *r, int counter, int32_t draft, const int32_t *extra,
                        int n_extra)
{
    kern_sample_params *p = &e->h_samp[j];
    const int nb = eng_banned_ids(e, r, counter);
    assert(e->n_bans_used + nb <= e->io.n_bans);
    p->temperature = r->sp.temperature;
    p->top_p = r->sp.top_p;
    p->min_p = r->sp.min_p;
    p->top_k = r->sp.top_k;
    p->seed = r->sp.seed;
    /* batch invariance: the random stream is keyed by (seed, output index), never by row or step, so
     * a request samples the same tokens alone or batched, chunked or not, with or without drafts */
    p->counter = (uint64_t)counter;
    p->draft = draft;
    p->n_logprobs = r->sp.logprobs;
    p->ban_off = e->n_bans_used;
    p->n_ban = nb;
    p->score = 0;
    memcpy(e->h_bans + e->n_bans_used, e->banned, (size_t)nb * sizeof(int32_t));
    e->n_bans_used += nb;
    /* penalties (the slot's pen_state, plus the block's earlier drafts) and logit_bias */
    p->pen = e->seqs[r->slot].pen;
    p->slot = r->slot;
    p->rep = eng_sampling_rep(&r->sp);
    p->freq = r->sp.frequency_penalty;
    p->pres = r->sp.presence_penalty;
    p->n_bias = r->sp.n_logit_bias;
    p->extra_off = 0;
    p->n_extra = 0;
    if (p->pen && n_extra > 0) {
        assert(n_extra <= KERN_SAMPLE_MAX_EXTRA && e->n_bans_used + n_extra <= e->io.n_bans);
        p->extra_off = e->n_bans_used;
        p->n_extra = n_extra;
        memcpy(e->h_bans + e->n_bans_used, extra, (size_t)n_extra * sizeof(int32_t));
        e->n_bans_used += n_extra;
    }
}

/* No allocation in the step loop: every buffer this writes (the h_* mirrors, io.*) was allocated by
 * eng_create_spec; a step only uploads, launches or runs, and downloads. */
void eng_run_target(eng_engine *e, int rows, int nl)
{
    const eng_config *c = &e->cfg;
    eng_backend *be = e->be;
    int32_t n_rows = rows, n_logits = nl;
    const size_t i32 = sizeof(int32_t);
    be->ops->upload(be, e->io.tok, e->h_tok, (size_t)rows * i32);
    be->ops->upload(be, e->io.pos, e->h_pos, (size_t)rows * i32);
    be->ops->upload(be, e->io.slot, e->h_slot, (size_t)rows * i32);
    be->ops->upload(be, e->io.kv_len, e->h_kv_len, (size_t)rows * i32);
    be->ops->upload(be, e->io.n_rows, &n_rows, i32);
    be->ops->upload(be, e->io.logit_idx, e->h_logit_idx, (size_t)nl * i32);
    be->ops->upload(be, e->io.n_logits, &n_logits, i32);
    be->ops->upload(be, e->io.samp, e->h_samp, (size_t)nl * sizeof(kern_sample_params));
    pen_fold(e);
    if (e->n_bans_used > 0) be->ops->upload(be, e->io.bans, e->h_bans, (size_t)e->n_bans_used * i32);
    e->n_bans_used = 0;
    if (e->bt_dirty) {
        be->ops->upload(be, e->io.block_tables, e->h_bt, (size_t)c->max_seqs * (size_t)e->io.max_blocks * i32);
        e->bt_dirty = 0;
    }
    if (c->use_plans) {
        be->ops->plan_launch(be, e->plans[eng_bucket_index(e, rows)]);
        e->stats.plan_launches++;
    } else {
        eng_tape_reset(&e->tape);
        mdl_emit_forward(e->m, &e->ws, &e->io, rows, nl > 0 ? nl : 1, &e->tape);
        be->ops->run(be, &e->tape);
        e->stats.eager_runs++;
    }
    if (nl > 0) be->ops->download(be, e->h_samp_out, e->io.samp_out, (size_t)nl * sizeof(kern_sample_out));
    be->ops->synchronize(be);
    e->stats.steps++;
    e->stats.rows += (uint64_t)rows;
}

/* The k best alternatives of a sample record into a request's output slot i (k per slot). */
static void copy_top(eng_toplp *dst, size_t i, const kern_sample_out *o, int k)
{
    assert(o->n_top == k);
    for (int t = 0; t < k; t++) {
        dst[i * (size_t)k + (size_t)t].id = o->top[t].id;
        dst[i * (size_t)k + (size_t)t].logprob = o->top[t].logprob;
    }
}

eng_finish eng_emit_sampled(eng_engine *e, int s, int j)
{
    eng_request *r = e->seqs[s].req;
    const kern_sample_out *o = &e->h_samp_out[j];
    r->out_logprobs[r->n_out] = o->logprob;
    copy_top(r->out_top, (size_t)r->n_out, o, r->sp.logprobs);
    return eng_append_token(e, s, o->tok);
}

void eng_register_blocks(eng_engine *e)
{
    const eng_config *c = &e->cfg;
    if (!c->prefix_caching) return;
    const int bs = c->block_size;
    for (int s = 0; s < c->max_seqs; s++) {
        eng_seq *q = &e->seqs[s];
        /* with a drafter, a "speculative": false request's blocks lack the drafter's context K/V
         * (spec_step skips its context rows): never shared with a request that drafts */
        /* I6: no_register marks KV that spans a "keep" update (old weights before it): never shared */
        if (!q->req || q->no_register || (e->draft && q->req->no_spec)) continue;
        const int32_t *bt = e->h_bt + (size_t)s * (size_t)e->io.max_blocks;
        while ((q->n_hashed + 1) * bs <= q->n_computed) {
            const int32_t *toks = q->tokens + (size_t)q->n_hashed * (size_t)bs;
            q->chain = eng_kvpool_register(&e->kv, bt[q->n_hashed], q->chain, toks);
            q->n_hashed++;
        }
    }
}

int eng_banned_ids(eng_engine *e, const eng_request *r, int n_out)
{
    int nb = 0;
    if (n_out < r->min_tokens) { /* keep eos and stop ids out until min_tokens */
        const mdl_config *mc = &e->m->cfg;
        if (!r->ignore_eos)
            for (int i = 0; i < mc->n_eos; i++) e->banned[nb++] = mc->eos[i];
        for (int i = 0; i < r->n_stop_ids; i++) e->banned[nb++] = r->stop_ids[i];
    }
    return nb;
}

void eng_schedule_rows(eng_engine *e, int decode, int *rows, int *nl)
{
    const eng_config *c = &e->cfg;
    for (int s = 0; s < c->max_seqs; s++) {
        eng_seq *q = &e->seqs[s];
        if (!q->req) continue;
        int left = q->n_tokens - q->n_computed;
        if (decode != eng_seq_decode_ready(q)) continue;
        int take = left < c->prefill_chunk ? left : c->prefill_chunk;
        if (take > c->max_step_tokens - *rows) take = c->max_step_tokens - *rows;
        if (take <= 0) continue;
        /* a logits row (at most one per row, so the R of the workspace always suffice): the row of
         * position p scores prompt[p + 1] while p + 1 < n_prompt and that position is not scored yet
         * (a prefill repeated after a "recompute" weight update does not score again); the row of
         * the last known token samples the next one; other rows need no logits */
        const eng_request *rq = q->req;
        const int first = q->n_computed, row0 = *rows;
        eng_add_rows(e, s, take, rows);
        for (int i = 0; i < take; i++) {
            const int p = first + i;
            /* (n_prompt_scored: a "recompute" re-prefill must not score a position twice) */
            const int at = rq->out_prompt_logprobs && p + 1 < rq->n_prompt && p + 1 >= rq->n_prompt_scored ? p + 1 : 0;
            if (!at && p != q->n_tokens - 1) continue;
            e->h_logit_idx[*nl] = row0 + i;
            e->logit_score[*nl] = at;
            e->logit_seq[(*nl)++] = s;
        }
    }
}

void eng_set_prefill_rows(eng_engine *e, int from, int nl)
{
    for (int j = from; j < nl; j++) {
        const eng_request *r = e->seqs[e->logit_seq[j]].req;
        const int at = e->logit_score[j];
        if (!at) {
            eng_set_sample_row(e, j, r, r->n_out, -1, NULL, 0);
            continue;
        }
        kern_sample_params *p = &e->h_samp[j];
        memset(p, 0, sizeof *p);
        p->draft = r->prompt[at];
        p->score = 1;
        p->n_logprobs = r->prompt_top;
    }
}

void eng_emit_prefill(eng_engine *e, int from, int nl)
{
    for (int j = from; j < nl; j++) {
        const int s = e->logit_seq[j], at = e->logit_score[j];
        eng_request *r = e->seqs[s].req;
        assert(r); /* a sequence's logits rows are in position order: only its last one can finish it */
        if (!at) {
            eng_finish f = eng_emit_sampled(e, s, j);
            if (f != ENG_FINISH_NONE) eng_finish_seq(e, s, f);
            continue;
        }
        const kern_sample_out *o = &e->h_samp_out[j];
        assert(o->tok == r->prompt[at] && at == r->n_prompt_scored);
        r->out_prompt_logprobs[at] = o->logprob;
        r->out_prompt_rank[at] = o->rank;
        copy_top(r->out_prompt_top, (size_t)at, o, r->prompt_top);
        r->n_prompt_scored = at + 1;
    }
}

int eng_step(eng_engine *e)
{
    if (e->winfo.state == ENG_W_UPDATING) return e->n_running + e->q_len; /* no step in a session (I7) */
    /* I8: a failed session left the weights half written (or the guard found them undefined): no
     * token may come from them, and none may wait for a good update that may never come (the engine
     * loop would spin on a queue nothing can admit). Every request in flight ends "abort" here, as
     * new ones are refused 503 in eng_submit. */
    if (e->winfo.state == ENG_W_INCONSISTENT || e->winfo.state == ENG_W_UNDEFINED) {
        eng_abort_all(e);
        return 0;
    }
    if (e->draft) return spec_step(e);
    eng_retire_and_admit(e);
    if (e->n_running == 0) return e->q_len;

    /* rows: decode tokens first, then prefill chunks within the step budget */
    int rows = 0, nl = 0;
    eng_schedule_rows(e, 1, &rows, &nl);
    eng_schedule_rows(e, 0, &rows, &nl);
    assert(rows > 0);
    /* (all nl rows: a decode row is a sampling row like the last row of a prefill) */
    eng_set_prefill_rows(e, 0, nl);
    eng_run_target(e, rows, nl);

    /* advance computed counts for every scheduled row; register newly completed full blocks */
    /* n_computed first: registration hashes only computed full blocks, and emitting appends tokens */
    for (int r = 0; r < rows; r++) e->seqs[e->h_slot[r]].n_computed++;
    eng_register_blocks(e);
    eng_emit_prefill(e, 0, nl);
    return e->n_running + e->q_len;
}

void eng_run_until_idle(eng_engine *e)
{
    while (e->winfo.state != ENG_W_UPDATING && eng_step(e) > 0) {
    }
}

void eng_abort_running(eng_engine *e)
{
    for (int s = 0; s < e->cfg.max_seqs; s++)
        if (e->seqs[s].req) eng_finish_seq(e, s, ENG_FINISH_ABORT);
}

void eng_abort_all(eng_engine *e)
{
    for (int s = 0; s < e->cfg.max_seqs; s++)
        if (e->seqs[s].req) eng_finish_seq(e, s, ENG_FINISH_ABORT);
    while (e->q_len > 0) {
        eng_request *r = e->queue[e->q_head];
        e->q_head = (e->q_head + 1) % e->cfg.queue_cap;
        e->q_len--;
        r->finish = ENG_FINISH_ABORT;
        if (r->on_finish) r->on_finish(r, r->user);
    }
}

int eng_num_running(const eng_engine *e) { return e->n_running; }
int eng_spec_width(const eng_engine *e) { return e->draft ? e->spec_W : 0; }
int eng_num_waiting(const eng_engine *e) { return e->q_len; }
int eng_kv_blocks_total(const eng_engine *e) { return e->io.num_blocks; }
int eng_kv_blocks_free(const eng_engine *e) { return eng_kvpool_available(&e->kv); }
int eng_kv_blocks_in_use(const eng_engine *e) { return eng_kvpool_in_use(&e->kv); }
void eng_reset_prefix_cache(eng_engine *e) { eng_kvpool_reset_cache(&e->kv); }
const eng_stats *eng_get_stats(const eng_engine *e) { return &e->stats; }
const eng_config *eng_get_config(const eng_engine *e) { return &e->cfg; }
const mdl_model *eng_model(const eng_engine *e) { return e->m; }
