/* server/openai/completions.c — POST /v1/completions and /v1/chat/completions: jobs, engine callbacks, response
 * building, SSE streaming, timeouts and client disconnects. The job interface (srv_job_* in srv.h:
 * prepare, submit, wait, snapshots, SSE, the abort registry) is the one native request path that the
 * other dialects (dialect_*.c) use too.
 *
 * One HTTP request is one job; every (prompt, sample) pair is one choice, i.e. one eng_request,
 * indexed prompt-major (choice = prompt * n + sample). See srv.h for the job life cycle and locks.
 *
 * Text. The engine thread decodes each token as it is produced (on_token) and appends its bytes to
 * the choice's text buffer (byte-level BPE: the text of a sequence is the concatenation of its
 * tokens' bytes), records where each token's text ends (tok_end, for text_offset) and looks for stop
 * strings in the window that the new bytes can complete. A match stops the request (on_token returns
 * 1: finish "stop") and fixes the visible length `cut` (the match start, or its end with
 * include_stop_str_in_output). Like vLLM, stop strings are not looked for before min_tokens, and the
 * text of an eos / stop_token_ids token is left out unless include_stop_str_in_output.
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

#include "server/core/srv.h"

/* ---- engine-thread side --------------------------------------------------------------------------- */

static int is_stop_token(const srv_state *s, const eng_request *r, int32_t tok)
{
    if (r->n_out < r->min_tokens) return 0;
    if (!r->ignore_eos)
        for (int i = 0; i < s->n_eos; i++)
            if (tok == s->eos[i]) return 1;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (tok == r->stop_ids[i]) return 1;
    return 0;
}

/* Grows the text buffer to hold `more` bytes. Returns 0 or -1. */
static int text_reserve(srv_choice *ch, size_t more)
{
    if (ch->text_len + more + 1 <= ch->text_cap) return 0;
    size_t nc = ch->text_cap ? ch->text_cap : 256;
    while (nc < ch->text_len + more + 1) nc *= 2;
    char *nt = realloc(ch->text, nc);
    if (!nt) return -1;
    ch->text = nt;
    ch->text_cap = nc;
    return 0;
}

static int on_token(eng_request *r, void *user)
{
    srv_choice *ch = user;
    srv_job *j = ch->job;
    srv_state *s = j->s;
    const srv_gen *g = &j->g;
    const int k = r->n_out - 1;
    const int32_t tok = r->out_tokens[k];
    const double now = srv_now();

    /* a client holding its first token must see its request in the gauges (running, KV usage):
     * refresh them before the token can reach it, not only after the step (as on_finish does) */
    if (k == 0) srv_metrics_publish(&s->met, s->rt.e);
    pthread_mutex_lock(&s->met.mu);
    if (k == 0) srv_hist_observe(&s->met.ttft, now - j->t_arrival);
    else srv_hist_observe(&s->met.itl, now - ch->t_last);
    pthread_mutex_unlock(&s->met.mu);
    ch->t_last = now;

    /* this token's bytes (none for a stop token unless include_stop_str_in_output) */
    const int stop_tok = is_stop_token(s, r, tok);
    char small[256], *piece = small;
    size_t pn = 0;
    if (s->tok && (!stop_tok || g->include_stop)) {
        char err[64];
        if (mdl_tok_decode(s->tok, &tok, 1, g->skip_special, small, sizeof small, &pn, err, sizeof err) != 0) pn = 0;
        if (pn > sizeof small) {
            piece = malloc(pn);
            size_t n2 = 0;
            if (!piece || mdl_tok_decode(s->tok, &tok, 1, g->skip_special, piece, pn, &n2, err, sizeof err) != 0) {
                free(piece);
                piece = small;
                pn = 0;
            }
        }
    }

    int stop = 0;
    pthread_mutex_lock(&j->mu);
    const size_t old_len = ch->text_len;
    if (pn) {
        if (text_reserve(ch, pn) != 0) {
            ch->oom = 1;
            stop = 1;
        } else {
            memcpy(ch->text + ch->text_len, piece, pn);
            ch->text_len += pn;
            ch->text[ch->text_len] = 0;
        }
    }
    ch->tok_end[k] = (uint32_t)ch->text_len;
    if (!stop && g->n_stop && !stop_tok && r->n_out >= r->min_tokens && ch->text_len > old_len) {
        /* earliest match that ends inside the new bytes: it may start up to max_stop_len - 1 bytes
         * before them */
        size_t from = old_len >= g->max_stop_len - 1 ? old_len - (g->max_stop_len - 1) : 0, best = (size_t)-1;
        int best_i = -1;
        for (int i = 0; i < g->n_stop; i++) {
            size_t L = g->stop_len[i];
            for (size_t p = from; p + L <= ch->text_len && p < best; p++)
                if (ch->text[p] == g->stop[i][0] && p + L > old_len && memcmp(ch->text + p, g->stop[i], L) == 0) {
                    best = p;
                    best_i = i;
                    break;
                }
        }
        if (best_i >= 0) {
            ch->stop_idx = best_i;
            ch->cut = g->include_stop ? best + g->stop_len[best_i] : best;
            stop = 1;
        }
    }
    ch->n_pub = r->n_out;
    j->events++;
    /* only a streaming handler wants every token; waking a non-streaming one per token would take
     * CPU from the engine's workers for nothing (it waits for on_finish) */
    if (g->stream) pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (piece != small) free(piece);
    return stop;
}

static void on_finish(eng_request *r, void *user)
{
    srv_choice *ch = user;
    srv_job *j = ch->job;
    srv_state *s = j->s;
    /* metrics first: once n_live drops to 0 below, the handler may free the job. The gauges and
     * counters are refreshed here too (the engine has already released this request's slot and
     * blocks), so a client that reads /metrics right after its response sees its own request. */
    srv_metrics_publish(&s->met, s->rt.e);
    pthread_mutex_lock(&s->met.mu);
    if (r->finish > ENG_FINISH_NONE && r->finish <= ENG_FINISH_ABORT) s->met.finished[r->finish]++;
    srv_hist_observe(&s->met.e2e, srv_now() - j->t_arrival);
    pthread_mutex_unlock(&s->met.mu);
    pthread_mutex_lock(&j->mu);
    ch->finished = 1;
    ch->n_pub = r->n_out;
    j->n_live--;
    j->events++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void job_reject(srv_job *j, int status, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    srv_errf(&j->rej, status, NULL, "%s", msg);
    j->state = SRV_JOB_REJECTED;
    j->events++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void job_submit(srv_state *s, srv_job *j)
{
    char err[512] = "";
    int busy = 0, submitted = 0;
    for (; submitted < j->n_ch; submitted++)
        if (eng_submit(s->rt.e, &j->ch[submitted].r, &busy, err, sizeof err) != 0) break;
    /* on_finish only ever runs inside eng_step / eng_abort_all on this thread, so nothing finished yet */
    pthread_mutex_lock(&j->mu);
    j->n_live = submitted;
    if (submitted < j->n_ch) {
        for (int i = 0; i < submitted; i++) atomic_store(&j->ch[i].r.cancel, 1);
        srv_errf(&j->rej, busy ? 503 : 400, NULL, "%s", err);
        /* busy 2: the weights are unusable (a failed update), not a full queue: no point retrying
         * until a trainer repairs them */
        if (busy == 2) j->rej.type = "service_unavailable";
        j->state = SRV_JOB_REJECTED;
    } else {
        j->state = SRV_JOB_ACCEPTED;
    }
    j->events++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void srv_jobs_dispatch(srv_state *s, srv_job *list, int stopping)
{
    while (list) {
        srv_job *j = list;
        list = j->next; /* read first: once handed over, the handler may free j */
        if (stopping) job_reject(j, 503, "the server is shutting down");
        else job_submit(s, j);
    }
}

/* ---- job construction ---------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void job_unregister(srv_job *j)
{
    srv_state *s = j->s;
    pthread_mutex_lock(&s->jobs_mu);
    if (j->registered) {
        if (j->reg_prev) j->reg_prev->reg_next = j->reg_next;
        else s->jobs = j->reg_next;
        if (j->reg_next) j->reg_next->reg_prev = j->reg_prev;
        j->registered = 0;
    }
    pthread_mutex_unlock(&s->jobs_mu);
}

void srv_job_free(srv_job *j)
{
    if (!j) return;
    job_unregister(j);
    for (int i = 0; i < j->n_ch; i++) {
        srv_choice *ch = &j->ch[i];
        free(ch->r.out_tokens);
        free(ch->r.out_logprobs);
        free(ch->r.out_top);
        free(ch->r.out_prompt_logprobs);
        free(ch->r.out_prompt_rank);
        free(ch->r.out_prompt_top);
        free(ch->text);
        free(ch->tok_end);
    }
    free(j->ch);
    srv_gen_free(&j->g);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

srv_job *srv_job_new(srv_state *s, double t_arrival)
{
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->s = s;
    j->t_arrival = t_arrival;
    j->created = srv_wall();
    atomic_init(&j->aborted, 0);
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    return j;
}

srv_job *srv_job_from_request(srv_state *s, struct mg_connection *c, double t_arrival, cJSON **body, srv_err *e)
{
    *body = srv_read_json(s, c, e);
    if (!*body) return NULL;
    srv_job *j = srv_job_new(s, t_arrival);
    if (!j) {
        cJSON_Delete(*body);
        *body = NULL;
        srv_errf(e, 500, NULL, "out of memory");
    }
    return j;
}

/* Alternatives the engine reports per prompt token: the larger of echo+logprobs' count and
 * prompt_logprobs; -1: the prompt is not scored. */
static int prompt_top_of(const srv_gen *g)
{
    const int legacy = g->api == SRV_API_COMPLETIONS && g->echo && g->logprobs ? g->sp.logprobs : -1;
    return legacy > g->prompt_logprobs ? legacy : g->prompt_logprobs;
}

/* Allocates one choice per (prompt, sample) with its output buffers. */
static int job_choices(srv_job *j, const char *id_prefix, srv_err *e)
{
    srv_state *s = j->s;
    const srv_gen *g = &j->g;
    uint64_t id = atomic_fetch_add(&s->next_id, 1) + 1;
    snprintf(j->id, sizeof j->id, "%s-%016llx%08llx", id_prefix,
             (unsigned long long)splitmix64(s->seed_base ^ id), (unsigned long long)id);
    j->n_ch = g->n_prompts * g->n;
    j->ch = calloc((size_t)j->n_ch, sizeof *j->ch);
    if (!j->ch) return srv_errf(e, 500, NULL, "out of memory");
    const size_t mt = (size_t)g->max_tokens, k = (size_t)g->sp.logprobs;
    for (int p = 0; p < g->n_prompts; p++)
        for (int i = 0; i < g->n; i++) {
            srv_choice *ch = &j->ch[p * g->n + i];
            eng_request *r = &ch->r;
            ch->job = j;
            ch->index = p * g->n + i;
            ch->prompt_idx = p;
            ch->stop_idx = -1;
            r->prompt = g->prompts[p].ids;
            r->n_prompt = g->prompts[p].n;
            r->max_tokens = g->max_tokens;
            r->min_tokens = g->min_tokens;
            r->ignore_eos = g->ignore_eos;
            r->no_spec = g->no_spec;
            r->stop_ids = g->stop_ids;
            r->n_stop_ids = g->n_stop_ids;
            r->sp = g->sp;
            r->cache_salt = g->cache_salt;
            /* seeded: sample i uses seed + i (so n > 1 gives n different, reproducible samples);
             * unseeded: a per-process random stream */
            r->sp.seed = g->seed_set ? g->sp.seed + (uint64_t)i
                                     : splitmix64(s->seed_base + atomic_fetch_add(&s->next_id, 1));
            r->out_tokens = malloc(mt * sizeof *r->out_tokens);
            r->out_logprobs = malloc(mt * sizeof *r->out_logprobs);
            r->out_top = k ? malloc(mt * k * sizeof *r->out_top) : NULL;
            ch->tok_end = malloc(mt * sizeof *ch->tok_end);
            if (!r->out_tokens || !r->out_logprobs || (k && !r->out_top) || !ch->tok_end)
                return srv_errf(e, 500, NULL, "out of memory allocating outputs for %zu tokens", mt);
            const int ptop = prompt_top_of(g);
            if (ptop >= 0) {
                const size_t np = (size_t)r->n_prompt;
                r->prompt_top = ptop;
                r->out_prompt_logprobs = malloc(np * sizeof *r->out_prompt_logprobs);
                r->out_prompt_rank = malloc(np * sizeof *r->out_prompt_rank);
                r->out_prompt_top = ptop ? malloc(np * (size_t)ptop * sizeof *r->out_prompt_top) : NULL;
                if (!r->out_prompt_logprobs || !r->out_prompt_rank || (ptop && !r->out_prompt_top))
                    return srv_errf(e, 500, NULL, "out of memory allocating prompt logprobs for %zu tokens", np);
            }
            r->on_token = on_token;
            r->on_finish = on_finish;
            r->user = ch;
            atomic_init(&r->cancel, 0);
        }
    return 0;
}

static void cancel_all(srv_job *j)
{
    for (int i = 0; i < j->n_ch; i++) atomic_store(&j->ch[i].r.cancel, 1);
}

/* Caller holds j->mu. */
static int settled(const srv_job *j) { return j->state != SRV_JOB_QUEUED && j->n_live == 0; }

static void abs_deadline(double t, struct timespec *ts)
{
    /* srv_now() is CLOCK_MONOTONIC, as is the job condvar */
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Caller holds j->mu. Waits until pred or the deadline; returns 0 on pred, ETIMEDOUT otherwise. */
static int wait_until(srv_job *j, int (*pred)(const srv_job *, uint64_t), uint64_t arg, double deadline)
{
    struct timespec ts;
    abs_deadline(deadline, &ts);
    while (!pred(j, arg)) {
        if (srv_now() >= deadline) return ETIMEDOUT;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    return 0;
}

static int pred_settled(const srv_job *j, uint64_t unused)
{
    (void)unused;
    return settled(j);
}
static int pred_not_queued(const srv_job *j, uint64_t unused)
{
    (void)unused;
    return j->state != SRV_JOB_QUEUED;
}
static int pred_event(const srv_job *j, uint64_t seen) { return j->events != seen; }

/* Caller holds j->mu. Cancels and waits (unbounded: the engine retires cancelled requests at its next
 * step, and at shutdown aborts everything) until the engine holds no pointer into the job. */
static void cancel_and_settle(srv_job *j)
{
    cancel_all(j);
    while (!settled(j)) pthread_cond_wait(&j->cv, &j->mu);
}

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

/* The visible end of a choice's text. Caller holds j->mu. */
static size_t visible_end(const srv_job *j, const srv_choice *ch)
{
    if (ch->stop_idx >= 0) return ch->cut;
    if (ch->finished) return ch->text_len;
    size_t end = ch->text_len;
    /* hold back the longest suffix that is a proper prefix of a stop string */
    size_t hold = 0;
    for (int i = 0; i < j->g.n_stop; i++) {
        size_t L = j->g.stop_len[i];
        for (size_t h = (L - 1 < end ? L - 1 : end); h > hold; h--)
            if (ch->text[end - h] == j->g.stop[i][0] && memcmp(ch->text + end - h, j->g.stop[i], h) == 0) {
                hold = h;
                break;
            }
    }
    end = srv_utf8_stable_len(ch->text, end - hold);
    return end < ch->sent_bytes ? ch->sent_bytes : end;
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

cJSON *srv_ids_json(const int32_t *ids, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* "weight_version": the versions the tokens of choice `only` (or of every choice, -1) were generated
 * with — one string, or a list across a "keep" update. Read once the choices finished. */
cJSON *srv_job_versions_json(const srv_job *j, int only)
{
    uint64_t vs[8];
    int nv = 0;
    for (int i = 0; i < j->n_ch; i++) {
        if (only >= 0 && i != only) continue;
        for (int k = 0; k < j->ch[i].r.n_versions; k++) {
            int seen = 0;
            for (int q = 0; q < nv; q++) seen |= vs[q] == j->ch[i].r.versions[k];
            if (!seen && nv < 8) vs[nv++] = j->ch[i].r.versions[k];
        }
    }
    return srv_weight_version_json(j->s, vs, nv);
}

long srv_job_cached_tokens(const srv_job *j)
{
    long n = 0; /* per prompt, as prompt_tokens counts it: its first sample's hit */
    for (int i = 0; i < j->n_ch; i++)
        if (j->ch[i].index % j->g.n == 0) n += j->ch[i].r.n_cached;
    return n;
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

/* ---- streaming -------------------------------------------------------------------------------------------- */

void srv_sse_event(srv_buf *b, cJSON *o)
{
    char *t = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!t) {
        b->oom = 1;
        return;
    }
    srv_buf_add(b, "data: ", 6);
    srv_buf_add(b, t, strlen(t));
    srv_buf_add(b, "\n\n", 2);
    free(t);
}

void srv_sse_flush(srv_sse *so, srv_buf *b)
{
    if (so->broken || b->n == 0) {
        b->n = 0;
        return;
    }
    if (b->oom) {
        so->broken = 1;
        return;
    }
    if (so->chunked) {
        char hdr[24];
        int hn = snprintf(hdr, sizeof hdr, "%zx\r\n", b->n);
        srv_buf f = {0};
        srv_buf_add(&f, hdr, (size_t)hn);
        srv_buf_add(&f, b->p, b->n);
        srv_buf_add(&f, "\r\n", 2);
        if (f.oom || mg_write(so->c, f.p, f.n) != (int)f.n) so->broken = 1;
        free(f.p);
    } else if (mg_write(so->c, b->p, b->n) != (int)b->n) {
        so->broken = 1;
    }
    b->n = 0;
}

void srv_sse_begin(srv_sse *so, struct mg_connection *c)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    so->c = c;
    so->chunked = strcmp(ri->http_version ? ri->http_version : "", "1.1") == 0;
    so->broken = 0;
    char head[256];
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n%s\r\n",
                      so->chunked ? "Transfer-Encoding: chunked\r\n" : "Connection: close\r\n");
    if (mg_write(c, head, (size_t)hn) != hn) so->broken = 1;
}

void srv_sse_end(srv_sse *so)
{
    if (so->chunked && !so->broken) mg_write(so->c, "0\r\n\r\n", 5);
}

/* Whether a choice has a first event (the chat role; completions: the echoed prompt and/or
 * prompt_token_ids and/or prompt logprobs), and whether it must wait for the prompt logprobs. */
static int has_first_event(const srv_job *j)
{
    return j->g.api == SRV_API_CHAT || j->g.echo || j->g.return_token_ids || j->g.prompt_logprobs >= 0;
}
static int first_event_waits(const srv_job *j) { return prompt_top_of(&j->g) >= 0; }

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
    sn->end = visible_end(j, ch);
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
    pthread_mutex_lock(&j->mu);
    /* errors before the first token are plain HTTP errors: wait for the engine to accept the job */
    if (wait_until(j, pred_not_queued, 0, deadline) != 0) {
        cancel_and_settle(j);
        pthread_mutex_unlock(&j->mu);
        return srv_send_error(c, 504, NULL, "request timed out after %.0f s waiting to be scheduled (--request-timeout)",
                              s->request_timeout);
    }
    if (j->state == SRV_JOB_REJECTED) {
        cancel_and_settle(j);
        srv_err e = j->rej;
        pthread_mutex_unlock(&j->mu);
        return srv_send_err(c, &e);
    }
    pthread_mutex_unlock(&j->mu);

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
    pthread_mutex_lock(&j->mu);
    while (!so.broken) {
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
        pthread_mutex_lock(&j->mu);
        if (so.broken || all_sent) break;
        if (wait_until(j, pred_event, seen, deadline) != 0) {
            timed_out = 1;
            break;
        }
    }
    /* the client left, the deadline passed, or everything was sent: make sure the engine is done */
    if (!settled(j)) cancel_and_settle(j);
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
    pthread_mutex_unlock(&j->mu);
    srv_sse_flush(&so, &b);
    srv_sse_end(&so);
    free(snap);
    free(has);
    free(b.p);
    free(echo_len);
    return 200;
}

/* ---- the job interface every dialect uses (srv.h) ------------------------------------------------------------ */

int srv_job_prepare(srv_job *j, const char *id_prefix, srv_err *e)
{
    if (j->g.n_stop && !j->s->tok)
        return srv_errf(e, 400, "stop", "stop strings need a tokenizer, and this model has none");
    return job_choices(j, id_prefix, e);
}

int srv_job_submit(srv_job *j, srv_err *e)
{
    srv_state *s = j->s;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return srv_errf(e, 503, NULL, "the server is shutting down");
    }
    /* registered before the engine can see it, so that an abort that arrives right after this
     * request was accepted finds it */
    pthread_mutex_lock(&s->jobs_mu);
    j->reg_prev = NULL;
    j->reg_next = s->jobs;
    if (s->jobs) s->jobs->reg_prev = j;
    s->jobs = j;
    j->registered = 1;
    pthread_mutex_unlock(&s->jobs_mu);
    if (s->inbox_tail) s->inbox_tail->next = j;
    else s->inbox_head = j;
    s->inbox_tail = j;
    pthread_cond_signal(&s->inbox_cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int srv_err_timed_out(const srv_state *s, srv_err *e)
{
    return srv_errf(e, 504, NULL, "request timed out after %.0f s (--request-timeout); generation was cancelled",
                    s->request_timeout);
}

int srv_job_wait(srv_job *j, double deadline, srv_err *e)
{
    pthread_mutex_lock(&j->mu);
    int timed_out = wait_until(j, pred_settled, 0, deadline) != 0;
    if (timed_out) cancel_and_settle(j);
    int rc = 0;
    if (j->state == SRV_JOB_REJECTED) {
        *e = j->rej;
        rc = -1;
    } else if (timed_out) {
        srv_err_timed_out(j->s, e);
        rc = -1;
    } else {
        for (int i = 0; i < j->n_ch; i++)
            if (j->ch[i].oom) rc = srv_errf(e, 500, NULL, "out of memory building the response");
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int srv_job_wait_accepted(srv_job *j, double deadline, srv_err *e)
{
    int rc = 0;
    pthread_mutex_lock(&j->mu);
    if (wait_until(j, pred_not_queued, 0, deadline) != 0) {
        cancel_and_settle(j);
        rc = srv_errf(e, 504, NULL, "request timed out after %.0f s waiting to be scheduled (--request-timeout)",
                      j->s->request_timeout);
    } else if (j->state == SRV_JOB_REJECTED) {
        cancel_and_settle(j);
        *e = j->rej;
        rc = -1;
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int srv_job_snapshot(srv_job *j, srv_choice_view *v, uint64_t *seen)
{
    int changed = 0;
    pthread_mutex_lock(&j->mu);
    *seen = j->events;
    for (int i = 0; i < j->n_ch; i++) {
        srv_choice *ch = &j->ch[i];
        if (v[i].finished) continue;
        ch->sent_bytes = v[i].text.n; /* visible_end never goes back before what the view holds */
        size_t end = visible_end(j, ch);
        if (end > v[i].text.n) {
            srv_buf_add(&v[i].text, ch->text + v[i].text.n, end - v[i].text.n);
            changed = 1;
        }
        if (ch->n_pub != v[i].n_pub || ch->finished) changed = 1;
        v[i].n_pub = ch->n_pub;
        v[i].finished = ch->finished;
    }
    pthread_mutex_unlock(&j->mu);
    return changed;
}

int srv_job_wait_event(srv_job *j, uint64_t seen, double deadline)
{
    pthread_mutex_lock(&j->mu);
    int rc = wait_until(j, pred_event, seen, deadline);
    pthread_mutex_unlock(&j->mu);
    return rc;
}

void srv_job_cancel_settle(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    if (!settled(j)) cancel_and_settle(j);
    pthread_mutex_unlock(&j->mu);
}

int srv_job_abort(srv_state *s, const char *rid)
{
    int hit = 0;
    const size_t n = rid ? strlen(rid) : 0;
    pthread_mutex_lock(&s->jobs_mu);
    for (srv_job *j = s->jobs; j; j = j->reg_next) {
        if (rid && strncmp(j->rid, rid, n) != 0) continue;
        atomic_store(&j->aborted, 1);
        cancel_all(j);
        hit++;
    }
    pthread_mutex_unlock(&s->jobs_mu);
    if (hit) { /* an idle engine thread must wake up to retire them */
        pthread_mutex_lock(&s->mu);
        pthread_cond_signal(&s->inbox_cv);
        pthread_mutex_unlock(&s->mu);
    }
    return hit;
}

size_t srv_choice_text_end(const srv_choice *ch) { return ch->stop_idx >= 0 ? ch->cut : ch->text_len; }

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
