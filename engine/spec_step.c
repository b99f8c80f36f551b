/* engine/spec_step.c — one speculative engine step: draft -> verify -> context.
 *
 * Invariants (per running sequence, with a drafter attached):
 *   - decode-ready (eng_seq_decode_ready) means the whole prompt is computed and the first token
 *     was sampled from the prefill: n_computed == n_tokens - 1 and n_out >= 1; the last token (the
 *     anchor, at position start = n_computed) is known but not yet in the target's KV cache. The
 *     first anchor is therefore always the first generated token, never the last prompt token
 *     (as z-lab dflash / DeepSpec: prefill the whole prompt, then speculate);
 *   - the drafter's context K/V exists for every position < n_computed (written by the context
 *     step right after the target step that computed those positions, or inherited with a shared
 *     prefix-cache block, whose drafter K/V lives in the same physical block) — of every sequence
 *     that drafts: a "speculative": false request (eng_request.no_spec) never drafts, gets no
 *     context rows, and so never registers its blocks in the prefix cache;
 *   - nothing ever reads a KV position >= n_computed (attention reads kv_len keys), so rejected
 *     draft rows and the drafter's transient block K/V need no clean-up: "cut back" is setting
 *     n_computed to start + accepted + 1.
 * A step: (1) the drafter proposes W tokens for each decode-ready sequence (one block of B rows,
 * non-causal over its context); (2) the target verifies [anchor, d1..dn] causally alongside any
 * prefill chunks; (3) acceptance (greedy: d_i == target argmax at slot i-1; sampling: accept with
 * probability p(d_i) since the drafter is greedy, i.e. a point mass q, else resample from p with d_i
 * removed; bonus from p at the first unverified slot) — decided for every slot by the verify
 * plan's KOP_SAMPLE op, on the device; the host only walks to the first rejection; (4) the
 * drafter's context step for every position the target just committed.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_internal.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int spec_init(eng_engine *e, char *err, size_t errlen)
{
    const eng_config *c = &e->cfg;
    const mdl_model *d = e->draft;
    const mdl_config *dc = &d->cfg;
    eng_backend *be = e->be;
    const int R = c->max_step_tokens, S = c->max_seqs;
    const size_t i32 = sizeof(int32_t);
    mdl_draft_io *io = &e->dio;
    if (!(io->c_idx = eng_xalloc(be, (size_t)R * i32, "draft.c_idx", err, errlen)) ||
        !(io->c_pos = eng_xalloc(be, (size_t)R * i32, "draft.c_pos", err, errlen)) ||
        !(io->c_slot = eng_xalloc(be, (size_t)R * i32, "draft.c_slot", err, errlen)) ||
        !(io->c_n = eng_xalloc(be, i32, "draft.c_n", err, errlen)) ||
        !(io->d_tok = eng_xalloc(be, (size_t)R * i32, "draft.d_tok", err, errlen)) ||
        !(io->d_pos = eng_xalloc(be, (size_t)R * i32, "draft.d_pos", err, errlen)) ||
        !(io->d_slot = eng_xalloc(be, (size_t)R * i32, "draft.d_slot", err, errlen)) ||
        !(io->d_kv_len = eng_xalloc(be, (size_t)R * i32, "draft.d_kv_len", err, errlen)) ||
        !(io->d_n = eng_xalloc(be, i32, "draft.d_n", err, errlen)) ||
        !(io->d_logit_idx = eng_xalloc(be, (size_t)R * i32, "draft.d_logit_idx", err, errlen)) ||
        !(io->d_n_logits = eng_xalloc(be, i32, "draft.d_n_logits", err, errlen)) ||
        !(io->d_anchor = eng_xalloc(be, (size_t)S * i32, "draft.d_anchor", err, errlen)) ||
        !(io->d_nseq = eng_xalloc(be, i32, "draft.d_nseq", err, errlen)))
        return -1;
    /* the drafter's KV cache: same blocks and positions as the target's, its own geometry */
    io->kv_layer_bytes = (size_t)e->io.num_blocks * (size_t)c->block_size * (size_t)dc->kv_heads *
                         (size_t)dc->head_dim * sizeof(float);
    io->kcache = calloc((size_t)dc->layers, sizeof(float *));
    io->vcache = calloc((size_t)dc->layers, sizeof(float *));
    if (!io->kcache || !io->vcache) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    for (int l = 0; l < dc->layers; l++) {
        char tag[48];
        snprintf(tag, sizeof tag, "draft.kv.k.%d", l);
        if (!(io->kcache[l] = eng_xalloc(be, io->kv_layer_bytes, tag, err, errlen))) return -1;
        snprintf(tag, sizeof tag, "draft.kv.v.%d", l);
        if (!(io->vcache[l] = eng_xalloc(be, io->kv_layer_bytes, tag, err, errlen))) return -1;
    }
    if (mdl_draft_ws_alloc(d, be, R, &e->dws, err, errlen) != 0) return -1;

    e->h_c_idx = calloc((size_t)R, i32);
    e->h_c_pos = calloc((size_t)R, i32);
    e->h_c_slot = calloc((size_t)R, i32);
    e->h_d_tok = calloc((size_t)R, i32);
    e->h_d_pos = calloc((size_t)R, i32);
    e->h_d_slot = calloc((size_t)R, i32);
    e->h_d_kv_len = calloc((size_t)R, i32);
    e->h_d_logit_idx = calloc((size_t)R, i32);
    e->h_d_anchor = calloc((size_t)S, i32);
    e->h_drafts = calloc((size_t)R, i32);
    e->h_conf = calloc((size_t)R, sizeof(float));
    e->sp_slot = calloc((size_t)S, i32);
    e->sp_nd = calloc((size_t)S, i32);
    e->sp_row0 = calloc((size_t)S, i32);
    if (!e->h_c_idx || !e->h_c_pos || !e->h_c_slot || !e->h_d_tok || !e->h_d_pos || !e->h_d_slot ||
        !e->h_d_kv_len || !e->h_d_logit_idx || !e->h_d_anchor || !e->h_drafts || !e->h_conf || !e->sp_slot ||
        !e->sp_nd || !e->sp_row0 || eng_tape_init(&e->dtape, mdl_draft_ops(d)) != 0) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    /* draft plans per number of drafting sequences (1, 2, 4, ... S); context plans per row bucket */
    for (int n = 1;; n *= 2) {
        int ns = n < S ? n : S;
        e->draft_bucket_seqs[e->n_draft_buckets++] = ns;
        if (ns == S) break;
    }
    if (c->use_plans) {
        for (int b = 0; b < e->n_draft_buckets; b++) {
            eng_tape_reset(&e->dtape);
            mdl_emit_draft_block(d, e->m, &e->dws, &e->io, io, e->draft_bucket_seqs[b] * e->spec_B, &e->dtape);
            if (!(e->draft_plans[b] = be->ops->plan_create(be, &e->dtape))) goto plan_fail;
        }
        for (int b = 0; b < e->n_buckets; b++) {
            eng_tape_reset(&e->dtape);
            mdl_emit_draft_context(d, &e->dws, &e->ws, &e->io, io, e->bucket_rows[b], &e->dtape);
            if (!(e->ctx_plans[b] = be->ops->plan_create(be, &e->dtape))) goto plan_fail;
        }
    }
    return 0;
plan_fail:
    snprintf(err, errlen, "drafter plan capture failed");
    return -1;
}

void spec_free(eng_engine *e)
{
    if (!e->draft) return;
    for (int b = 0; b < MAX_BUCKETS; b++) {
        if (e->draft_plans[b]) e->be->ops->plan_free(e->be, e->draft_plans[b]);
        if (e->ctx_plans[b]) e->be->ops->plan_free(e->be, e->ctx_plans[b]);
    }
    eng_tape_free(&e->dtape);
    free(e->dio.kcache);
    free(e->dio.vcache);
    free(e->h_c_idx);
    free(e->h_c_pos);
    free(e->h_c_slot);
    free(e->h_d_tok);
    free(e->h_d_pos);
    free(e->h_d_slot);
    free(e->h_d_kv_len);
    free(e->h_d_logit_idx);
    free(e->h_d_anchor);
    free(e->h_drafts);
    free(e->h_conf);
    free(e->sp_slot);
    free(e->sp_nd);
    free(e->sp_row0);
}

/* (1) Draft: one block per drafting sequence. Fills e->h_drafts[j*W + k] and e->h_conf. */
static void run_draft(eng_engine *e, int ns)
{
    eng_backend *be = e->be;
    const int B = e->spec_B, dspark = e->draft->cfg.arch == MDL_ARCH_DSPARK;
    const int32_t mask = e->draft->cfg.mask_token_id;
    int rows = 0, nl = 0;
    for (int j = 0; j < ns; j++) {
        const eng_seq *q = &e->seqs[e->sp_slot[j]];
        const int start = q->n_computed;
        e->h_d_anchor[j] = q->tokens[start];
        for (int i = 0; i < B; i++, rows++) {
            e->h_d_tok[rows] = i == 0 ? q->tokens[start] : mask;
            e->h_d_pos[rows] = start + i;
            e->h_d_slot[rows] = e->sp_slot[j];
            e->h_d_kv_len[rows] = start + B; /* context < start plus the whole block: non-causal */
            /* DFlash: slot i >= 1 predicts position start+i; DSpark: slot i predicts start+i+1 */
            if (dspark || i >= 1) e->h_d_logit_idx[nl++] = rows;
        }
    }
    assert(nl == ns * e->spec_W);
    const size_t i32 = sizeof(int32_t);
    int32_t n_rows = rows, n_logits = nl, n_seq = ns;
    be->ops->upload(be, e->dio.d_tok, e->h_d_tok, (size_t)rows * i32);
    be->ops->upload(be, e->dio.d_pos, e->h_d_pos, (size_t)rows * i32);
    be->ops->upload(be, e->dio.d_slot, e->h_d_slot, (size_t)rows * i32);
    be->ops->upload(be, e->dio.d_kv_len, e->h_d_kv_len, (size_t)rows * i32);
    be->ops->upload(be, e->dio.d_n, &n_rows, i32);
    be->ops->upload(be, e->dio.d_logit_idx, e->h_d_logit_idx, (size_t)nl * i32);
    be->ops->upload(be, e->dio.d_n_logits, &n_logits, i32);
    be->ops->upload(be, e->dio.d_anchor, e->h_d_anchor, (size_t)ns * i32);
    be->ops->upload(be, e->dio.d_nseq, &n_seq, i32);
    if (e->bt_dirty) {
        be->ops->upload(be, e->io.block_tables, e->h_bt,
                        (size_t)e->cfg.max_seqs * (size_t)e->io.max_blocks * i32);
        e->bt_dirty = 0;
    }
    if (e->cfg.use_plans) {
        int b = 0;
        while (e->draft_bucket_seqs[b] < ns) b++;
        be->ops->plan_launch(be, e->draft_plans[b]);
    } else {
        eng_tape_reset(&e->dtape);
        mdl_emit_draft_block(e->draft, e->m, &e->dws, &e->io, &e->dio, rows, &e->dtape);
        be->ops->run(be, &e->dtape);
    }
    be->ops->download(be, e->h_drafts, e->dws.drafts, (size_t)nl * i32);
    if (e->draft->conf_w >= 0) be->ops->download(be, e->h_conf, e->dws.conf, (size_t)nl * sizeof(float));
    be->ops->synchronize(be);
}

/* (4) Context: K/V of the drafter for `rows` committed positions (h_c_* filled by the caller). */
static void run_context(eng_engine *e, int rows)
{
    eng_backend *be = e->be;
    const size_t i32 = sizeof(int32_t);
    int32_t n = rows;
    be->ops->upload(be, e->dio.c_idx, e->h_c_idx, (size_t)rows * i32);
    be->ops->upload(be, e->dio.c_pos, e->h_c_pos, (size_t)rows * i32);
    be->ops->upload(be, e->dio.c_slot, e->h_c_slot, (size_t)rows * i32);
    be->ops->upload(be, e->dio.c_n, &n, i32);
    if (e->cfg.use_plans) {
        be->ops->plan_launch(be, e->ctx_plans[eng_bucket_index(e, rows)]);
    } else {
        eng_tape_reset(&e->dtape);
        mdl_emit_draft_context(e->draft, &e->dws, &e->ws, &e->io, &e->dio, rows, &e->dtape);
        be->ops->run(be, &e->dtape);
    }
    be->ops->synchronize(be);
}

int spec_step(eng_engine *e)
{
    const eng_config *c = &e->cfg;
    const int W = e->spec_W;
    eng_retire_and_admit(e);
    if (e->n_running == 0) return e->q_len;

    /* decode-ready sequences and how many drafts each may verify */
    int ns = 0, n_drafting = 0;
    for (int s = 0; s < c->max_seqs; s++) {
        eng_seq *q = &e->seqs[s];
        if (!eng_seq_decode_ready(q)) continue; /* a 1-token prompt remainder is prefilled below */
        const eng_request *r = q->req;
        int nd = r->no_spec ? 0 : W;
        if (c->num_spec_tokens > 0 && nd > c->num_spec_tokens) nd = c->num_spec_tokens;
        /* (the anchor's step emits up to nd + 1 tokens: accepted drafts plus the bonus) */
        if (nd > r->max_tokens - r->n_out - 1) nd = r->max_tokens - r->n_out - 1; /* never past max_tokens */
        if (nd < 0) nd = 0;
        e->sp_slot[ns] = s;
        e->sp_nd[ns++] = nd;
        n_drafting += nd > 0;
    }
    /* (decode-ready sequences with nd == 0 still get a verify row below: plain decoding in the same
     * target step) */
    /* drafting sequences first (they form the draft step's rows, in order) */
    for (int a = 0, b = 0; b < ns; b++)
        if (e->sp_nd[b] > 0) {
            int ts = e->sp_slot[a], tn = e->sp_nd[a];
            e->sp_slot[a] = e->sp_slot[b];
            e->sp_nd[a] = e->sp_nd[b];
            e->sp_slot[b] = ts;
            e->sp_nd[b] = tn;
            a++;
        }
    double t0 = now_ns();
    if (n_drafting > 0) {
        run_draft(e, n_drafting);
        if (e->draft->conf_w >= 0 && c->spec_conf_threshold > 0) /* per-slot confidence cut */
            for (int j = 0; j < n_drafting; j++)
                for (int k = 0; k < e->sp_nd[j]; k++)
                    if (e->h_conf[j * W + k] < c->spec_conf_threshold) {
                        e->sp_nd[j] = k;
                        break;
                    }
    }
    double t1 = now_ns();

    /* verify rows [anchor, d1..dn] for decode-ready sequences, then prefill chunks */
    int rows = 0, nl = 0;
    for (int j = 0; j < ns; j++) {
        const int s = e->sp_slot[j];
        eng_seq *q = &e->seqs[s];
        const int start = q->n_computed, nd = e->sp_nd[j];
        e->sp_row0[j] = rows;
        for (int i = 0; i <= nd; i++, rows++) {
            e->h_tok[rows] = i == 0 ? q->tokens[start] : e->h_drafts[j * W + i - 1];
            e->h_pos[rows] = start + i;
            e->h_slot[rows] = s;
            e->h_kv_len[rows] = start + i + 1;
            e->h_logit_idx[nl] = rows;
            /* slot i verifies draft i (the token at output index n_out + i); slot nd: the bonus */
            eng_set_sample_row(e, nl, q->req, q->req->n_out + i, i < nd ? e->h_drafts[j * W + i] : -1,
                               e->h_drafts + (size_t)j * W, i); /* penalties: the drafts before draft i are outputs too */
            e->logit_seq[nl++] = s;
        }
    }
    const int verify_rows = rows, verify_nl = nl;
    eng_schedule_rows(e, 0, &rows, &nl); /* prefill chunks (decode-ready sequences are verified above) */
    assert(rows > 0);
    eng_set_prefill_rows(e, verify_nl, nl);
    eng_run_target(e, rows, nl);
    double t2 = now_ns();

    /* context rows are gathered while accepting: committed target rows of this step */
    int crows = 0;
    /* prefill rows: all computed positions are committed (a "speculative": false request never
     * drafts, so it needs no drafter context; its blocks are never registered, see
     * eng_register_blocks, so no speculative request can inherit them without it) */
    for (int r = verify_rows; r < rows; r++) {
        eng_seq *q = &e->seqs[e->h_slot[r]];
        q->n_computed++;
        if (q->req->no_spec) continue;
        e->h_c_idx[crows] = r;
        e->h_c_pos[crows] = e->h_pos[r];
        e->h_c_slot[crows++] = e->h_slot[r];
    }
    /* prompt scores; prefill sequences that completed their prompt sample their first token */
    eng_emit_prefill(e, verify_nl, nl);
    /* acceptance; logits row of verify row i of sequence j is sp_row0[j] + i (all rows have one) */
    for (int j = 0; j < ns; j++) {
        const int s = e->sp_slot[j], nd = e->sp_nd[j], row0 = e->sp_row0[j];
        eng_seq *q = &e->seqs[s];
        eng_request *r = q->req;
        const int start = q->n_computed;
        const int32_t anchor = q->tokens[start];
        const int32_t *d = e->h_drafts + j * W;
        int acc = 0;
        int32_t bonus = -1;
        eng_finish f = ENG_FINISH_NONE;
        int n_out0 = r->n_out;
        for (int i = 0; i <= nd && f == ENG_FINISH_NONE; i++) {
            /* the op decided every slot at once (slot i as output index n_out0 + i); the first
             * rejection, or the bonus slot nd, ends the walk */
            kern_sample_out *o = &e->h_samp_out[row0 + i];
            assert(r->n_out == n_out0 + i);
            if (e->draft->cfg.test_accept_drafts && i < nd && !o->accepted) { /* TEST ONLY: lossy */
                o->accepted = 1;
                o->tok = d[i];
            }
            /* I9: emit up to the first rejected slot, whose token is the target's own choice there
             * (greedy: its argmax; sampling: resampled without the draft), so the output is the target's */
            const int accepted_here = i < nd && o->accepted;
            acc += accepted_here;
            if (!accepted_here) bonus = o->tok;
            f = eng_emit_sampled(e, s, row0 + i);
            if (!accepted_here) break;
        }
        /* statistics, trace, acceptance length (tokens emitted by this step) */
        if (nd > 0) {
            e->stats.spec_drafts++;
            e->stats.spec_draft_tokens += (uint64_t)nd;
            e->stats.spec_accepted += (uint64_t)acc;
            for (int k = 0; k < acc && k < ENG_SPEC_MAX_POS; k++) {
                e->stats.spec_accepted_per_pos[k]++;
                r->spec_accepted_per_pos[k]++;
            }
            r->spec_drafts++;
            r->spec_draft_tokens += (uint64_t)nd;
            r->spec_accepted += (uint64_t)acc;
        }
        if (r->on_spec) r->on_spec(r, r->n_accept, start, anchor, d, nd, acc, bonus, r->user);
        if (r->out_accept_lens) r->out_accept_lens[r->n_accept] = r->n_out - n_out0;
        r->n_accept++;
        if (f != ENG_FINISH_NONE) {
            eng_finish_seq(e, s, f);
            continue;
        }
        /* cut back: the target keeps anchor + accepted drafts; their features become context */
        for (int i = 0; i <= acc && !r->no_spec; i++) {
            e->h_c_idx[crows] = row0 + i;
            e->h_c_pos[crows] = start + i;
            e->h_c_slot[crows++] = s;
        }
        /* I9: positions past the accepted prefix hold rejected drafts' K/V; kv_len never reaches them
         * before they are written again, so cutting back is only this */
        q->n_computed = start + acc + 1;
    }
    /* context rows of finished sequences are harmless (their blocks are released, positions
     * unread) but skipped anyway: only running sequences' rows were added above, except prefill
     * rows of a sequence that finished on its first token */
    int w = 0;
    for (int i = 0; i < crows; i++)
        if (e->seqs[e->h_c_slot[i]].req) {
            e->h_c_idx[w] = e->h_c_idx[i];
            e->h_c_pos[w] = e->h_c_pos[i];
            e->h_c_slot[w++] = e->h_c_slot[i];
        }
    if (w > 0) run_context(e, w);
    double t3 = now_ns();
    eng_register_blocks(e);
    e->stats.spec_ns_draft += t1 - t0;
    e->stats.spec_ns_verify += t2 - t1;
    e->stats.spec_ns_context += t3 - t2;
    return e->n_running + e->q_len;
}
