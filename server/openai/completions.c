/* server/openai/completions.c — POST /v1/completions and /v1/chat/completions over the native
 * jobs (server/core/jobs.c): response building, SSE streaming, timeouts and client disconnects.
 *
 * Streaming. The handler thread sleeps on the job's condvar; every publication bumps job->events.
 * On each wake-up it turns everything new into SSE events: for each unfinished choice, the text it may
 * show is the decoded text minus (a) the longest suffix that is a proper prefix of a stop string (it
 * could still become a match, which must not be shown) and minus (b) an incomplete UTF-8 tail. When
 * the choice finished, everything up to its final length goes out with finish_reason. The events of
 * one wake-up are written as one HTTP chunk; a failed write means the client left: every choice is
 * cancelled and the handler waits for the job to settle before freeing it.
 *
 * Prompt logprobs (echo with logprobs; vLLM's prompt_logprobs): the engine scores the prompt into the
 * choice's out_prompt_* arrays during prefill, all before the first token is published, so they are
 * read once a choice has a token or has finished. A stream holds back the first event of such a
 * choice (echo text, role) until then, and sends the prompt logprobs in it.
 *
 * Non-streaming clients are not polled for disconnects (civetweb exposes no socket to poll while the
 * handler waits): such a request runs to its end or to --request-timeout.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/openai/openai.h"

/* ---- response building ---------------------------------------------------------------------------------- */

static const char *finish_name(const srv_choice *ch)
{
    switch (ch->r.finish) {
    case ENG_FINISH_STOP: return "stop";
    case ENG_FINISH_LENGTH: return "length";
    default: return "abort";
    }
}

static void add_stop_reason(cJSON *o, const srv_job *j, const srv_choice *ch)
{
    if (ch->stop_idx >= 0) {
        cJSON_AddStringToObject(o, "stop_reason", j->g.stop[ch->stop_idx]);
        return;
    }
    int32_t t = ch->r.stop_token;
    for (int i = 0; t >= 0 && i < j->g.n_stop_ids; i++)
        if (j->g.stop_ids[i] == t) {
            cJSON_AddNumberToObject(o, "stop_reason", t);
            return;
        }
    cJSON_AddNullToObject(o, "stop_reason"); /* eos, length, abort */
}

/* The display form of a token: "token_id:N" (return_tokens_as_token_ids, or no tokenizer), its text,
 * or, when its bytes are not valid UTF-8 on their own (part of a character), "bytes:\xNN..." as
 * OpenAI writes them, so distinct tokens keep distinct top_logprobs keys. *rn: raw byte count. */
static cJSON *token_json(const srv_job *j, int32_t id, char *raw, size_t cap, size_t *rn)
{
    *rn = 0;
    if (!j->g.tokens_as_ids && j->s->tok && mdl_tok_piece(j->s->tok, id, raw, cap, rn) == 0 && *rn <= cap) {
        if (srv_utf8_valid(raw, *rn) && !memchr(raw, 0, *rn)) return srv_json_bytes(raw, *rn);
        char esc[6 + 4 * 64 + 1];
        size_t k = (size_t)snprintf(esc, sizeof esc, "bytes:");
        for (size_t i = 0; i < *rn && k + 4 < sizeof esc; i++)
            k += (size_t)snprintf(esc + k, sizeof esc - k, "\\x%02x", (unsigned char)raw[i]);
        return cJSON_CreateString(esc);
    }
    char name[32];
    snprintf(name, sizeof name, "token_id:%d", (int)id);
    *rn = 0;
    return cJSON_CreateString(name);
}

/* One token of a legacy logprobs object: its display name, logprob (null when lp is NaN: the first
 * prompt token, or a prompt position not scored before an abort), the {name: logprob} map of it and
 * its K alternatives `top`, and its text offset. */
static void legacy_entry(const srv_job *j, cJSON *o, int32_t id, float lp, const eng_toplp *top, int K, size_t off)
{
    char raw[1024];
    size_t rn;
    cJSON *name = token_json(j, id, raw, sizeof raw, &rn);
    cJSON *m = isnan(lp) ? cJSON_CreateNull() : cJSON_CreateObject();
    if (name && m && !isnan(lp)) {
        cJSON_AddNumberToObject(m, name->valuestring, lp);
        for (int k = 0; k < K; k++) {
            cJSON *tn = token_json(j, top[k].id, raw, sizeof raw, &rn);
            if (tn && !cJSON_GetObjectItemCaseSensitive(m, tn->valuestring))
                cJSON_AddNumberToObject(m, tn->valuestring, top[k].logprob);
            cJSON_Delete(tn);
        }
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "tokens"), name);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "token_logprobs"),
                         isnan(lp) ? cJSON_CreateNull() : cJSON_CreateNumber(lp));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "top_logprobs"), m);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "text_offset"), cJSON_CreateNumber((double)off));
}

/* The raw logprob the engine wrote for prompt position i of a choice whose prompt was scored (NaN for
 * position 0 and positions an abort left unscored). Read once the choice has a token or finished. */
static float prompt_lp(const eng_request *r, int i)
{
    return i >= 1 && i < r->n_prompt_scored ? r->out_prompt_logprobs[i] : NAN;
}

/* Legacy completions logprobs for tokens [from, to). base: text offset of the completion. With
 * with_prompt (echo with logprobs), the prompt's tokens come first, at offsets from 0. */
static cJSON *lp_legacy(const srv_job *j, const srv_choice *ch, int from, int to, size_t base, int with_prompt)
{
    const eng_request *r = &ch->r;
    const int K = r->sp.logprobs;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddArrayToObject(o, "tokens");
    cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON_AddArrayToObject(o, "text_offset");
    size_t off = 0;
    for (int i = 0; with_prompt && i < r->n_prompt; i++) {
        const int32_t id = r->prompt[i];
        legacy_entry(j, o, id, prompt_lp(r, i), K ? r->out_prompt_top + (size_t)i * (size_t)r->prompt_top : NULL, K,
                     off);
        size_t n = 0;
        free(srv_decode(j->s, &id, 1, j->g.skip_special, &n));
        off += n;
    }
    for (int i = from; i < to; i++)
        legacy_entry(j, o, r->out_tokens[i], r->out_logprobs[i], K ? r->out_top + (size_t)i * (size_t)K : NULL, K,
                     base + (i ? ch->tok_end[i - 1] : 0));
    return o;
}

/* vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...]: at each
 * position the prompt token (its rank among all ids) and the g.prompt_logprobs best ids (ranks 1..). */
cJSON *srv_prompt_logprobs_vllm(const srv_job *j, const srv_choice *ch)
{
    const eng_request *r = &ch->r;
    const int K = j->g.prompt_logprobs;
    cJSON *a = cJSON_CreateArray();
    char raw[1024], key[16];
    size_t rn;
    for (int i = 0; i < r->n_prompt; i++) {
        const float lp = prompt_lp(r, i);
        if (isnan(lp)) {
            cJSON_AddItemToArray(a, cJSON_CreateNull());
            continue;
        }
        cJSON *m = cJSON_CreateObject();
        for (int k = -1; k < K; k++) { /* -1: the prompt token itself */
            const eng_toplp *t = k >= 0 ? &r->out_prompt_top[(size_t)i * (size_t)r->prompt_top + (size_t)k] : NULL;
            const int32_t id = t ? t->id : r->prompt[i];
            snprintf(key, sizeof key, "%d", (int)id);
            if (cJSON_GetObjectItemCaseSensitive(m, key)) continue;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "logprob", t ? t->logprob : lp);
            cJSON_AddNumberToObject(e, "rank", t ? k + 1 : r->out_prompt_rank[i]);
            cJSON_AddItemToObject(e, "decoded_token", token_json(j, id, raw, sizeof raw, &rn));
            cJSON_AddItemToObject(m, key, e);
        }
        cJSON_AddItemToArray(a, m);
    }
    return a;
}

/* vLLM's placement of prompt_logprobs: in the choice for completions, at the top of a chat answer or
 * chunk (from choice 0: every chat choice has the same prompt). */
static void add_prompt_logprobs(const srv_job *j, const srv_choice *ch, cJSON *o, cJSON *c)
{
    if (j->g.prompt_logprobs < 0) return;
    if (j->g.api != SRV_API_CHAT) cJSON_AddItemToObject(c, "prompt_logprobs", srv_prompt_logprobs_vllm(j, ch));
    else if (ch == &j->ch[0]) cJSON_AddItemToObject(o, "prompt_logprobs", srv_prompt_logprobs_vllm(j, ch));
}

static cJSON *chat_lp_entry(const srv_job *j, int32_t id, float lp)
{
    char raw[1024];
    size_t rn;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToObject(e, "token", token_json(j, id, raw, sizeof raw, &rn));
    cJSON_AddNumberToObject(e, "logprob", lp);
    cJSON *b = cJSON_AddArrayToObject(e, "bytes");
    for (size_t i = 0; i < rn; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)raw[i]));
    return e;
}

/* Chat logprobs {"content":[...]} for tokens [from, to). */
static cJSON *lp_chat(const srv_job *j, const srv_choice *ch, int from, int to)
{
    const eng_request *r = &ch->r;
    const int K = r->sp.logprobs;
    cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
    for (int i = from; i < to; i++) {
        cJSON *e = chat_lp_entry(j, r->out_tokens[i], r->out_logprobs[i]);
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; k < K; k++) {
            const eng_toplp *t = &r->out_top[(size_t)i * (size_t)K + (size_t)k];
            cJSON_AddItemToArray(tops, chat_lp_entry(j, t->id, t->logprob));
        }
        cJSON_AddItemToArray(content, e);
    }
    return o;
}

static void add_usage(cJSON *o, const srv_job *j)
{
    long p = 0, c = 0;
    for (int i = 0; i < j->g.n_prompts; i++) p += j->g.prompts[i].n;
    for (int i = 0; i < j->n_ch; i++) c += j->ch[i].n_pub;
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)p);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)c);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(p + c));
    const long cached = srv_job_cached_tokens(j);
    if (j->s->prompt_tokens_details && cached > 0) { /* vLLM: only with the flag and a hit */
        cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
        cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    }
    if (j->s->rt.draft) { /* speculative decoding: the job is settled, its counters are final */
        uint64_t d = 0, dt = 0, a = 0, pos[ENG_SPEC_MAX_POS] = {0};
        const int W = eng_spec_width(j->s->rt.e) < ENG_SPEC_MAX_POS ? eng_spec_width(j->s->rt.e) : ENG_SPEC_MAX_POS;
        for (int i = 0; i < j->n_ch; i++) {
            d += j->ch[i].r.spec_drafts;
            dt += j->ch[i].r.spec_draft_tokens;
            a += j->ch[i].r.spec_accepted;
            for (int k = 0; k < W; k++) pos[k] += j->ch[i].r.spec_accepted_per_pos[k];
        }
        cJSON *sp = cJSON_AddObjectToObject(u, "spec");
        cJSON_AddNumberToObject(sp, "drafts", (double)d);
        cJSON_AddNumberToObject(sp, "draft_tokens", (double)dt);
        cJSON_AddNumberToObject(sp, "accepted_tokens", (double)a);
        cJSON_AddNumberToObject(sp, "mean_acceptance_length", d ? 1.0 + (double)a / (double)d : 0.0);
        /* steps whose k-th draft (k = 1..W) was accepted; / drafts = acceptance rate per position */
        cJSON *ap = cJSON_AddArrayToObject(sp, "accepted_per_position");
        for (int k = 0; k < W; k++) cJSON_AddItemToArray(ap, cJSON_CreateNumber((double)pos[k]));
    }
}

static cJSON *head_json(const srv_job *j, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)(long long)j->created);
    cJSON_AddStringToObject(o, "model", j->s->model_name);
    return o;
}

/* Echo text of a choice's prompt (completions with echo). */
static char *echo_text(const srv_job *j, int prompt_idx, size_t *len)
{
    *len = 0;
    if (!j->g.echo || !j->s->tok) return NULL;
    return srv_decode(j->s, j->g.prompts[prompt_idx].ids, j->g.prompts[prompt_idx].n, j->g.skip_special, len);
}

/* The whole (non-streaming) response of a settled job. */
static cJSON *full_response(const srv_job *j)
{
    const int chat = j->g.api == SRV_API_CHAT;
    cJSON *o = head_json(j, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < j->n_ch; i++) {
        const srv_choice *ch = &j->ch[i];
        const srv_prompt *pr = &j->g.prompts[ch->prompt_idx];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, c);
        cJSON_AddNumberToObject(c, "index", ch->index);
        size_t end = ch->stop_idx >= 0 ? ch->cut : ch->text_len, elen = 0;
        char *echo = echo_text(j, ch->prompt_idx, &elen);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddItemToObject(m, "content", srv_json_bytes(ch->text ? ch->text : "", end));
        } else {
            char *t = malloc(elen + end + 1);
            if (t) {
                if (elen) memcpy(t, echo, elen);
                if (end) memcpy(t + elen, ch->text, end);
                cJSON_AddItemToObject(c, "text", srv_json_bytes(t, elen + end));
            }
            free(t);
        }
        free(echo);
        if (j->g.logprobs)
            cJSON_AddItemToObject(c, "logprobs", chat ? lp_chat(j, ch, 0, ch->n_pub)
                                                      : lp_legacy(j, ch, 0, ch->n_pub, elen, j->g.echo));
        else
            cJSON_AddNullToObject(c, "logprobs");
        add_prompt_logprobs(j, ch, o, c);
        cJSON_AddStringToObject(c, "finish_reason", finish_name(ch));
        add_stop_reason(c, j, ch);
        if (j->g.return_token_ids) {
            cJSON_AddItemToObject(c, "token_ids", srv_ids_json(ch->r.out_tokens, ch->n_pub));
            if (!chat) cJSON_AddItemToObject(c, "prompt_token_ids", srv_ids_json(pr->ids, pr->n));
        }
    }
    if (chat && j->g.return_token_ids)
        cJSON_AddItemToObject(o, "prompt_token_ids", srv_ids_json(j->g.prompts[0].ids, j->g.prompts[0].n));
    add_usage(o, j);
    cJSON_AddItemToObject(o, "weight_version", srv_job_versions_json(j, -1));
    return o;
}

/* Whether a choice has a first event (the chat role; completions: the echoed prompt and/or
 * prompt_token_ids and/or prompt logprobs), and whether it must wait for the prompt logprobs. */
static int has_first_event(const srv_job *j)
{
    return j->g.api == SRV_API_CHAT || j->g.echo || j->g.return_token_ids || j->g.prompt_logprobs >= 0;
}
static int first_event_waits(const srv_job *j) { return srv_gen_prompt_top(&j->g) >= 0; }

/* The first event of a choice (immutable request data, and prompt logprobs that are final once the
 * choice has a token or finished: no lock). */
static void first_event(const srv_job *j, srv_choice *ch, srv_buf *b)
{
    const int chat = j->g.api == SRV_API_CHAT;
    const srv_prompt *pr = &j->g.prompts[ch->prompt_idx];
    ch->first_sent = 1;
    cJSON *o = head_json(j, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    cJSON_AddNumberToObject(c, "index", ch->index);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
    } else {
        size_t elen = 0;
        char *echo = echo_text(j, ch->prompt_idx, &elen);
        cJSON_AddItemToObject(c, "text", srv_json_bytes(echo ? echo : "", elen));
        free(echo);
    }
    if (!chat && j->g.echo && j->g.logprobs) cJSON_AddItemToObject(c, "logprobs", lp_legacy(j, ch, 0, 0, 0, 1));
    else cJSON_AddNullToObject(c, "logprobs");
    add_prompt_logprobs(j, ch, o, c);
    cJSON_AddNullToObject(c, "finish_reason");
    if (j->g.return_token_ids) {
        cJSON_AddItemToObject(c, "token_ids", cJSON_CreateArray());
        if (!chat) cJSON_AddItemToObject(c, "prompt_token_ids", srv_ids_json(pr->ids, pr->n));
    }
    if (chat && j->g.return_token_ids && ch == &j->ch[0])
        cJSON_AddItemToObject(o, "prompt_token_ids", srv_ids_json(pr->ids, pr->n));
    srv_sse_event(b, o);
}

/* What a choice has new for the stream, copied under j->mu so that the events can be built without
 * holding the lock the engine thread needs for every token. Token-indexed arrays below n_pub
 * (out_tokens, out_logprobs, out_top, tok_end) and the finish fields of a finished choice never
 * change again, so they are read afterwards without the lock. */
typedef struct {
    int n_pub, fin;
    size_t end;  /* new visible length */
    char *delta; /* text[sent_bytes, end) */
    size_t dn;
} choice_snap;

/* Caller holds j->mu. Returns 1 when the choice has something to send. */
static int snap_choice(const srv_job *j, const srv_choice *ch, choice_snap *sn)
{
    memset(sn, 0, sizeof *sn);
    if (ch->sent_final) return 0;
    sn->fin = ch->finished;
    sn->n_pub = ch->n_pub;
    sn->end = srv_choice_visible_end(j, ch);
    const int want_tokens = j->g.logprobs || j->g.return_token_ids;
    if (!(sn->end > ch->sent_bytes || (sn->n_pub > ch->sent_tokens && want_tokens) || sn->fin)) return 0;
    sn->dn = sn->end > ch->sent_bytes ? sn->end - ch->sent_bytes : 0;
    sn->delta = malloc(sn->dn + 1);
    if (sn->delta && sn->dn) memcpy(sn->delta, ch->text + ch->sent_bytes, sn->dn);
    return 1;
}

/* The event for a snapshot (no lock held); advances the handler's cursors. */
static void emit_choice(srv_job *j, srv_choice *ch, choice_snap *sn, size_t echo_len, srv_buf *b)
{
    const int chat = j->g.api == SRV_API_CHAT;
    cJSON *o = head_json(j, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    cJSON_AddNumberToObject(c, "index", ch->index);
    const char *delta = sn->delta ? sn->delta : "";
    const size_t dn = sn->delta ? sn->dn : 0;
    if (!sn->delta) b->oom = 1;
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (dn || !sn->fin) cJSON_AddItemToObject(d, "content", srv_json_bytes(delta, dn));
    } else {
        cJSON_AddItemToObject(c, "text", srv_json_bytes(delta, dn));
    }
    if (j->g.logprobs)
        cJSON_AddItemToObject(c, "logprobs", chat ? lp_chat(j, ch, ch->sent_tokens, sn->n_pub)
                                                  : lp_legacy(j, ch, ch->sent_tokens, sn->n_pub, echo_len, 0));
    else
        cJSON_AddNullToObject(c, "logprobs");
    if (sn->fin) {
        cJSON_AddStringToObject(c, "finish_reason", finish_name(ch));
        add_stop_reason(c, j, ch);
        cJSON_AddItemToObject(o, "weight_version", srv_job_versions_json(j, (int)(ch - j->ch)));
    } else {
        cJSON_AddNullToObject(c, "finish_reason");
    }
    if (j->g.return_token_ids)
        cJSON_AddItemToObject(c, "token_ids", srv_ids_json(ch->r.out_tokens + ch->sent_tokens, sn->n_pub - ch->sent_tokens));
    ch->sent_bytes = sn->end;
    ch->sent_tokens = sn->n_pub;
    ch->sent_final = sn->fin;
    free(sn->delta);
    sn->delta = NULL;
    srv_sse_event(b, o);
}

static int stream_job(srv_state *s, struct mg_connection *c, srv_job *j, double deadline)
{
    srv_sse so;
    srv_buf b = {0};
    /* errors before the first token are plain HTTP errors: wait for the engine to accept the job */
    srv_err acc;
    if (srv_job_wait_accepted(j, deadline, &acc) != 0) return srv_send_err(c, &acc);

    srv_sse_begin(&so, c);

    /* echo length per prompt (for text_offset) */
    size_t *echo_len = calloc((size_t)j->g.n_prompts, sizeof *echo_len);
    if (echo_len && j->g.echo)
        for (int p = 0; p < j->g.n_prompts; p++) {
            char *t = echo_text(j, p, &echo_len[p]);
            free(t);
        }

    int timed_out = 0;
    uint64_t seen = 0;
    choice_snap *snap = calloc((size_t)j->n_ch, sizeof *snap);
    char *has = calloc((size_t)j->n_ch, 1);
    if (!snap || !has) so.broken = 1; /* out of memory: treated like a lost client */
    const int first_waits = first_event_waits(j);
    if (has_first_event(j) && !first_waits)
        for (int i = 0; i < j->n_ch; i++) first_event(j, &j->ch[i], &b);
    while (!so.broken) {
        pthread_mutex_lock(&j->mu);
        seen = j->events;
        for (int i = 0; i < j->n_ch; i++) has[i] = (char)snap_choice(j, &j->ch[i], &snap[i]);
        pthread_mutex_unlock(&j->mu);
        int all_sent = 1;
        for (int i = 0; i < j->n_ch; i++) {
            if (has[i] && !j->ch[i].first_sent && has_first_event(j)) first_event(j, &j->ch[i], &b);
            if (has[i]) emit_choice(j, &j->ch[i], &snap[i], echo_len ? echo_len[j->ch[i].prompt_idx] : 0, &b);
            all_sent &= j->ch[i].sent_final;
        }
        srv_sse_flush(&so, &b);
        if (so.broken || all_sent) break;
        if (srv_job_wait_event(j, seen, deadline) != 0) {
            timed_out = 1;
            break;
        }
    }
    /* the client left, the deadline passed, or everything was sent: make sure the engine is done
     * (then the job's fields are final and read without its lock) */
    srv_job_cancel_settle(j);
    if (!so.broken) {
        if (timed_out) {
            srv_err e;
            srv_err_timed_out(s, &e);
            srv_sse_event(&b, srv_err_json(&e));
        } else if (j->g.include_usage) {
            cJSON *o = head_json(j, j->g.api == SRV_API_CHAT ? "chat.completion.chunk" : "text_completion");
            cJSON_AddArrayToObject(o, "choices");
            add_usage(o, j);
            cJSON_AddItemToObject(o, "weight_version", srv_job_versions_json(j, -1));
            srv_sse_event(&b, o);
        }
        srv_buf_add(&b, "data: [DONE]\n\n", 14);
    }
    srv_sse_flush(&so, &b);
    srv_sse_end(&so);
    free(snap);
    free(has);
    free(b.p);
    free(echo_len);
    return 200;
}

/* ---- the routes --------------------------------------------------------------------------------------------- */

static int route_gen(srv_state *s, struct mg_connection *c, srv_api api)
{
    const double t0 = srv_now(), deadline = t0 + s->request_timeout;
    srv_err e;
    cJSON *body;
    srv_job *j = srv_job_from_request(s, c, t0, &body, &e);
    if (!j) return srv_send_err(c, &e);
    int rc = srv_parse_gen(s, body, api, &j->g, &e);
    cJSON_Delete(body);
    if (rc == 0) rc = srv_job_prepare(j, api == SRV_API_CHAT ? "chatcmpl" : "cmpl", &e);
    if (rc == 0) rc = srv_job_submit(j, &e);
    if (rc != 0) {
        srv_job_free(j);
        return srv_send_err(c, &e);
    }

    if (j->g.stream) {
        int st = stream_job(s, c, j, deadline);
        srv_job_free(j);
        return st;
    }
    int status;
    if (srv_job_wait(j, deadline, &e) != 0) {
        status = srv_send_err(c, &e);
    } else {
        /* settled: the engine no longer touches the job, so it is read without the lock */
        cJSON *o = full_response(j);
        status = o ? srv_send_json(c, 200, o) : srv_send_error(c, 500, NULL, "out of memory building the response");
        cJSON_Delete(o);
    }
    srv_job_free(j);
    return status;
}

int srv_route_completions(srv_state *s, struct mg_connection *c) { return route_gen(s, c, SRV_API_COMPLETIONS); }
int srv_route_chat(srv_state *s, struct mg_connection *c) { return route_gen(s, c, SRV_API_CHAT); }
