/* server/core/jobs.c — the one native request path: generation jobs, from construction to the engine
 * thread's callbacks, waiting, snapshots for streaming, aborts by request id. Every dialect (the
 * OpenAI routes in server/openai/, the framework dialects in server/dialects/) goes through it; see
 * srv.h for the job life cycle and the locks.
 *
 * One HTTP request is one job; every (prompt, sample) pair is one choice, i.e. one eng_request,
 * indexed prompt-major (choice = prompt * n + sample).
 *
 * Text. The engine thread decodes each token as it is produced (on_token) and appends its bytes to
 * the choice's text buffer (byte-level BPE: the text of a sequence is the concatenation of its
 * tokens' bytes), records where each token's text ends (tok_end, for text_offset) and looks for stop
 * strings in the window that the new bytes can complete. A match stops the request (on_token returns
 * 1: finish "stop") and fixes the visible length `cut` (the match start, or its end with
 * include_stop_str_in_output). Like vLLM, stop strings are not looked for before min_tokens, and the
 * text of an eos / stop_token_ids token is left out unless include_stop_str_in_output.
 *
 * Visible text while streaming (srv_choice_visible_end): the decoded text minus (a) the longest
 * suffix that is a proper prefix of a stop string (it could still become a match, which must not be
 * shown) and minus (b) an incomplete UTF-8 tail; everything once the choice finished.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/core/srv.h"

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
        /* all or nothing: choices already queued are cancelled (retired at the next step), so the job
         * settles once they report their finish */
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
    srv_cond_init_monotonic(&j->cv);
    return j;
}

srv_job *srv_job_from_request(srv_state *s, struct mg_connection *c, double t_arrival, cJSON **body, srv_err *e)
{
    *body = srv_read_json(&s->http, c, e);
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
int srv_gen_prompt_top(const srv_gen *g)
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
            const int ptop = srv_gen_prompt_top(g);
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

/* Caller holds j->mu. Waits until pred or the deadline; returns 0 on pred, ETIMEDOUT otherwise. */
static int wait_until(srv_job *j, int (*pred)(const srv_job *, uint64_t), uint64_t arg, double deadline)
{
    const struct timespec ts = srv_timespec_at(deadline);
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

size_t srv_choice_visible_end(const srv_job *j, const srv_choice *ch)
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

cJSON *srv_ids_json(const int32_t *ids, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* "weight_version": the versions the tokens of choice `only` (or of every choice, -1) were generated
 * with — one string, or a list across a "keep" update. Read once the choices finished. */
/* I6: responses report every version their tokens came from (eng_request.versions, written by the
 * engine per token), not the version current when the answer is written. */
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


int srv_job_prepare(srv_job *j, const char *id_prefix, srv_err *e)
{
    if (j->g.n_stop && !j->s->tok)
        return srv_errf(e, 400, "stop", "stop strings need a tokenizer, and this model has none");
    return job_choices(j, id_prefix, e);
}

int srv_job_submit(srv_job *j, srv_err *e)
{
    srv_state *s = j->s;
    /* serve --weights-from: until the start-up pull succeeded the weights are the cold-start
     * checkpoint, which a replica joining a trainer's fleet must not serve (weights/pull.c) */
    if (atomic_load(&s->pull_pending)) {
        pthread_mutex_lock(&s->wmu);
        srv_errf(e, 503, NULL, "not ready: %s", s->pull_reason);
        pthread_mutex_unlock(&s->wmu);
        e->type = "service_unavailable";
        return -1;
    }
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
        size_t end = srv_choice_visible_end(j, ch);
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

char *srv_decode(const srv_state *s, const int32_t *ids, int n, int skip_special, size_t *len)
{
    char err[128];
    size_t need = 0;
    if (!s->tok || n < 0) return NULL;
    if (mdl_tok_decode(s->tok, ids, (size_t)n, skip_special, NULL, 0, &need, err, sizeof err) != 0) return NULL;
    char *out = malloc(need + 1);
    if (!out) return NULL;
    size_t got = 0;
    if (mdl_tok_decode(s->tok, ids, (size_t)n, skip_special, out, need, &got, err, sizeof err) != 0 || got != need) {
        free(out);
        return NULL;
    }
    out[need] = 0;
    *len = need;
    return out;
}

cJSON *srv_weight_version_json(srv_state *s, const uint64_t *versions, int n)
{
    /* (vname is a ring of the last 64 version names, by number, published by the engine thread) */
    pthread_mutex_lock(&s->wmu);
    cJSON *o;
    if (n <= 0) {
        o = cJSON_CreateString(s->wpub.version);
    } else if (n == 1) {
        o = cJSON_CreateString(s->vname[versions[0] % 64]);
    } else {
        o = cJSON_CreateArray();
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(o, cJSON_CreateString(s->vname[versions[i] % 64]));
    }
    pthread_mutex_unlock(&s->wmu);
    return o;
}
