/* server/dialects/sglang_generate.c — SGLang's native generation API (what slime and AReaL's SGLang backend
 * call), as a thin translation over the native jobs (srv.h):
 *   POST /generate            input_ids | text (one, or a batch list), sampling_params, return_logprob,
 *                             top_logprobs_num, logprob_start_len, return_text_in_logprobs, rid, stream
 *   POST /abort_request       {"rid": ...} (prefix match, as SGLang's scheduler) | {"abort_all": true}
 *   GET  /get_server_info, /server_info, /get_model_info, /model_info, /v1/loads, /health_generate
 *
 * sampling_params are renamed onto the /v1/completions fields and validated by srv_parse_gen (one
 * place: penalties, logit_bias and the rest are accepted or refused there for every dialect). SGLang's
 * own rules on top: max_new_tokens defaults to 128; top_k -1 or >= the vocabulary means all tokens,
 * 0 and below -1 are refused; temperature 0 is greedy; constrained decoding (regex, json_schema, ebnf,
 * structural_tag, stop_regex) and multimodal / LoRA / hidden-state inputs are refused.
 *
 * Answers follow sglang tokenizer_manager.py (_handle_batch_output): {text, output_ids, meta_info{id,
 * finish_reason, prompt_tokens, weight_version, ..., completion_tokens, cached_tokens, e2e_latency,
 * logprob lists [logprob, id, text|null]}}; a batch or n > 1 gives a list. finish_reason: {"type":
 * "stop", "matched": id | string}, {"type": "length", "length": max_new_tokens}, {"type": "abort",
 * "message": ...} ("Abort before prefill" when no token was generated, which AReaL keys on). Streams
 * send cumulative text / output_ids / meta_info per event (SGLang's default, non-incremental), then
 * data: [DONE]. Errors are {"error": {"message", ...}} with 400 as SGLang's _create_error_response.
 *
 * cached_tokens: the prompt tokens this request took from the prefix cache at admission. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dialects/dialects.h"

#define SG_DEFAULT_MAX_NEW 128

static const srv_field_map SG_MAP[] = {
    {"max_new_tokens", "max_tokens"},
    {"min_new_tokens", "min_tokens"},
    {"temperature", "temperature"},
    {"top_p", "top_p"},
    {"min_p", "min_p"},
    {"stop", "stop"},
    {"stop_token_ids", "stop_token_ids"},
    {"ignore_eos", "ignore_eos"},
    {"skip_special_tokens", "skip_special_tokens"},
    {"no_stop_trim", "include_stop_str_in_output"},
    {"frequency_penalty", "frequency_penalty"},
    {"presence_penalty", "presence_penalty"},
    {"repetition_penalty", "repetition_penalty"},
    {"n", "n"},
    {"sampling_seed", "seed"},
    {"logit_bias", "logit_bias"},
    /* set by the dialect (only for renaming errors back) */
    {"top_logprobs_num", "logprobs"},
    {"logprob_start_len", "prompt_logprobs"},
};
#define SG_NMAP ((int)(sizeof SG_MAP / sizeof SG_MAP[0]))

/* The request beyond srv_gen: what the answer needs. */
typedef struct {
    int batch;           /* the answer is a list */
    int return_logprob, top_n, start_len, text_in_lp;
    int max_new;
    cJSON *rids;         /* the rid list of a batch (borrowed from the body), or NULL */
    char rid[128];       /* a single rid, or generated */
} sg_req;

/* Fields SGLang accepts that would change the answer and that graphswap does not implement. */
static int sg_refuse(const cJSON *body, const cJSON *sp, srv_err *e)
{
    static const char *top[] = {"image_data", "video_data", "audio_data", "input_embeds", "lora_path", "lora_id",
                                "session_params", "custom_logit_processor", "token_ids_logprob"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++) {
        const cJSON *v = srv_field(body, top[i]);
        if (v && !(cJSON_IsArray(v) && !v->child)) /* AReaL sends "image_data": null */
            return srv_errf(e, 400, top[i], "%s is not supported by this server", top[i]);
    }
    static const char *flags[] = {"return_hidden_states", "return_routed_experts"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (cJSON_IsTrue(srv_field(body, flags[i])))
            return srv_errf(e, 400, flags[i], "%s is not supported by this server", flags[i]);
    static const char *grammar[] = {"regex", "json_schema", "ebnf", "structural_tag", "stop_regex"};
    for (size_t i = 0; i < sizeof grammar / sizeof grammar[0]; i++)
        if (srv_field(sp, grammar[i]))
            return srv_errf(e, 400, grammar[i], "sampling_params.%s is not supported (no constrained decoding)",
                            grammar[i]);
    const cJSON *v = srv_field(sp, "spaces_between_special_tokens");
    if (v && !cJSON_IsBool(v))
        return srv_errf(e, 400, "spaces_between_special_tokens", "spaces_between_special_tokens must be a boolean");
    return 0;
}

static int get_flag(const cJSON *o, const char *k, int *out, srv_err *e)
{
    const cJSON *v = srv_field(o, k);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return srv_errf(e, 400, k, "%s must be a boolean", k);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_integer(const cJSON *o, const char *k, double lo, double hi, int *out, srv_err *e)
{
    const cJSON *v = srv_field(o, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return srv_errf(e, 400, k, "%s must be an integer in [%.0f, %.0f]", k, lo, hi);
    *out = (int)v->valuedouble;
    return 0;
}

/* Parses a /generate body into j->g and q. */
static int sg_parse(srv_state *s, const cJSON *body, srv_job *j, sg_req *q, srv_err *e)
{
    memset(q, 0, sizeof *q);
    q->start_len = -1;
    const cJSON *ids = srv_field(body, "input_ids"), *text = srv_field(body, "text");
    if (!ids == !text)
        return srv_errf(e, 400, ids ? "text" : "input_ids", "Either text or input_ids should be provided (exactly one).");
    const char *pname = ids ? "input_ids" : "text";
    const cJSON *prompt = ids ? ids : text;
    if (ids && !cJSON_IsArray(ids))
        return srv_errf(e, 400, "input_ids", "input_ids must be a list of token ids or a list of such lists");
    if (text && !cJSON_IsString(text) && !cJSON_IsArray(text))
        return srv_errf(e, 400, "text", "text must be a string or a list of strings");
    q->batch = ids ? (ids->child && cJSON_IsArray(ids->child)) : cJSON_IsArray(text);

    /* sampling_params: an object, or (batch) a list of equal objects */
    const cJSON *sp = srv_field(body, "sampling_params");
    if (sp && cJSON_IsArray(sp)) {
        for (const cJSON *x = sp->child; x; x = x->next)
            if (!cJSON_Compare(x, sp->child, 1))
                return srv_errf(e, 400, "sampling_params", "per-prompt sampling_params that differ are not supported");
        sp = sp->child;
    }
    if (sp && !cJSON_IsObject(sp)) return srv_errf(e, 400, "sampling_params", "sampling_params must be an object");
    if (sg_refuse(body, sp, e)) return -1;

    if (get_flag(body, "return_logprob", &q->return_logprob, e) ||
        get_integer(body, "top_logprobs_num", 0, ENG_MAX_LOGPROBS, &q->top_n, e) ||
        get_integer(body, "logprob_start_len", -1, 1 << 30, &q->start_len, e) ||
        get_flag(body, "return_text_in_logprobs", &q->text_in_lp, e) || get_flag(body, "stream", &j->g.stream, e))
        return -1;
    int stream = j->g.stream;

    const cJSON *rid = srv_field(body, "rid");
    if (rid && cJSON_IsString(rid)) snprintf(q->rid, sizeof q->rid, "%s", rid->valuestring);
    else if (rid && cJSON_IsArray(rid) && q->batch) {
        for (const cJSON *x = rid->child; x; x = x->next)
            if (!cJSON_IsString(x)) return srv_errf(e, 400, "rid", "rid must be a string or a list of strings");
        if (cJSON_GetArraySize(rid) != cJSON_GetArraySize(prompt))
            return srv_errf(e, 400, "rid", "rid must have one entry per prompt");
        q->rids = (cJSON *)rid;
    } else if (rid)
        return srv_errf(e, 400, "rid", "rid must be a string (or, for a batch, a list of strings)");

    /* the canonical body */
    cJSON *canon = cJSON_CreateObject();
    if (!canon) return srv_errf(e, 500, NULL, "out of memory");
    cJSON_AddItemToObject(canon, "prompt", cJSON_Duplicate(prompt, 1));
    cJSON_AddNumberToObject(canon, "max_tokens", SG_DEFAULT_MAX_NEW);
    const cJSON *tk = srv_field(sp, "top_k");
    if (tk) {
        if (!cJSON_IsNumber(tk) || tk->valuedouble != floor(tk->valuedouble) ||
            (tk->valuedouble < 1 && tk->valuedouble != -1)) {
            cJSON_Delete(canon);
            return srv_errf(e, 400, "top_k", "top_k must be -1 (disable) or at least 1, got %.17g",
                            cJSON_IsNumber(tk) ? tk->valuedouble : NAN);
        }
        /* SGLang's "all" is 1 << 30; anything at or above the vocabulary keeps every token */
        cJSON_AddNumberToObject(canon, "top_k", tk->valuedouble >= s->vocab ? -1 : tk->valuedouble);
    }
    if (q->return_logprob) {
        cJSON_AddNumberToObject(canon, "logprobs", q->top_n);
        if (q->start_len >= 0) cJSON_AddNumberToObject(canon, "prompt_logprobs", q->top_n);
    }
    srv_field_map map[SG_NMAP + 1];
    memcpy(map, SG_MAP, sizeof SG_MAP);
    map[SG_NMAP] = (srv_field_map){pname, "prompt"};
    if (srv_parse_mapped(s, canon, sp, map, SG_NMAP + 1, &j->g, e)) return -1;
    j->g.stream = stream;
    q->max_new = j->g.max_tokens;
    if (j->g.n > 1) q->batch = 1;
    if (q->return_logprob && q->start_len >= 0)
        for (int p = 0; p < j->g.n_prompts; p++)
            if (q->start_len >= j->g.prompts[p].n)
                return srv_errf(e, 400, "logprob_start_len",
                                "logprob_start_len (%d) is higher than the number of input tokens (%d). Request with "
                                "a lower logprob_start_len.", q->start_len, j->g.prompts[p].n);
    if (!q->rid[0]) snprintf(q->rid, sizeof q->rid, "%s", ""); /* set after prepare (from j->id) */
    return 0;
}

static const char *weight_version_now(srv_state *s, char *buf, size_t cap)
{
    pthread_mutex_lock(&s->wmu);
    snprintf(buf, cap, "%s", s->wpub.version);
    pthread_mutex_unlock(&s->wmu);
    return buf;
}

/* ---- answers ------------------------------------------------------------------------------------------ */

static cJSON *lp_entry(const srv_state *s, float lp, int32_t id, int with_text)
{
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, isnan(lp) ? cJSON_CreateNull() : cJSON_CreateNumber(lp));
    cJSON_AddItemToArray(a, cJSON_CreateNumber(id));
    if (with_text && s->tok) {
        size_t n = 0;
        char *t = srv_decode(s, &id, 1, 0, &n);
        cJSON_AddItemToArray(a, t ? srv_json_bytes(t, n) : cJSON_CreateNull());
        free(t);
    } else {
        cJSON_AddItemToArray(a, cJSON_CreateNull());
    }
    return a;
}

static cJSON *top_list(const srv_state *s, const eng_toplp *top, int k, int with_text)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < k; i++) cJSON_AddItemToArray(a, lp_entry(s, top[i].logprob, top[i].id, with_text));
    return a;
}

static cJSON *finish_json(const srv_job *j, const srv_choice *ch, const sg_req *q)
{
    const eng_request *r = &ch->r;
    cJSON *f = cJSON_CreateObject();
    if (r->finish == ENG_FINISH_STOP) {
        cJSON_AddStringToObject(f, "type", "stop");
        if (ch->stop_idx >= 0) cJSON_AddStringToObject(f, "matched", j->g.stop[ch->stop_idx]);
        else if (r->stop_token >= 0) cJSON_AddNumberToObject(f, "matched", r->stop_token);
    } else if (r->finish == ENG_FINISH_LENGTH) {
        cJSON_AddStringToObject(f, "type", "length");
        cJSON_AddNumberToObject(f, "length", q->max_new);
    } else {
        cJSON_AddStringToObject(f, "type", "abort");
        cJSON_AddStringToObject(f, "message", ch->n_pub == 0 ? "Abort before prefill"
                                              : atomic_load(&((srv_job *)j)->aborted) ? "Abort in running"
                                                                                      : "Aborted by the server");
    }
    return f;
}

static void out_id(const srv_job *j, const sg_req *q, int i, char *buf, size_t cap)
{
    const srv_choice *ch = &j->ch[i];
    if (q->rids && j->g.n == 1) {
        const cJSON *x = cJSON_GetArrayItem(q->rids, ch->prompt_idx);
        snprintf(buf, cap, "%s", x ? x->valuestring : q->rid);
    } else if (j->n_ch == 1) {
        snprintf(buf, cap, "%s", q->rid);
    } else {
        snprintf(buf, cap, "%s_%d", q->rid, i);
    }
}

/* One output object: text (its first `tlen` bytes), output_ids and meta_info over n tokens. fin: the
 * choice finished (finish_reason, versions and final counters are readable). */
static cJSON *sg_output(const srv_job *j, int i, const sg_req *q, const char *text, size_t tlen, int n, int fin)
{
    const srv_state *s = j->s;
    const srv_choice *ch = &j->ch[i];
    const eng_request *r = &ch->r;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "text", srv_json_bytes(text ? text : "", tlen));
    cJSON_AddItemToObject(o, "output_ids", srv_ids_json(r->out_tokens, n));
    cJSON *m = cJSON_AddObjectToObject(o, "meta_info");
    char id[160];
    out_id(j, q, i, id, sizeof id);
    cJSON_AddStringToObject(m, "id", id);
    if (fin) cJSON_AddItemToObject(m, "finish_reason", finish_json(j, ch, q));
    else cJSON_AddNullToObject(m, "finish_reason");
    cJSON_AddNumberToObject(m, "prompt_tokens", r->n_prompt);
    char wv[160];
    if (fin) cJSON_AddItemToObject(m, "weight_version", srv_job_versions_json(j, i));
    else cJSON_AddStringToObject(m, "weight_version", weight_version_now(j->s, wv, sizeof wv));
    cJSON_AddNumberToObject(m, "num_retractions", 0);
    if (q->return_logprob) {
        const int K = q->top_n;
        cJSON *in = cJSON_AddArrayToObject(m, "input_token_logprobs");
        cJSON *intop = K ? cJSON_CreateArray() : NULL;
        /* the prompt is scored before the first token: readable once a token exists or it finished */
        if (q->start_len >= 0 && (n > 0 || fin))
            for (int p = q->start_len; p < r->n_prompt; p++) {
                const float lp = p >= 1 && p < r->n_prompt_scored ? r->out_prompt_logprobs[p] : NAN;
                cJSON_AddItemToArray(in, lp_entry(s, lp, r->prompt[p], q->text_in_lp));
                if (intop)
                    cJSON_AddItemToArray(intop, isnan(lp) ? cJSON_CreateNull()
                                                          : top_list(s, r->out_prompt_top + (size_t)p * (size_t)r->prompt_top,
                                                                     K, q->text_in_lp));
            }
        cJSON *out = cJSON_AddArrayToObject(m, "output_token_logprobs");
        for (int t = 0; t < n; t++) cJSON_AddItemToArray(out, lp_entry(s, r->out_logprobs[t], r->out_tokens[t], q->text_in_lp));
        cJSON_AddNumberToObject(m, "output_token_logprobs_length", n);
        if (K) {
            cJSON_AddItemToObject(m, "input_top_logprobs", intop);
            cJSON *ot = cJSON_AddArrayToObject(m, "output_top_logprobs");
            for (int t = 0; t < n; t++) cJSON_AddItemToArray(ot, top_list(s, r->out_top + (size_t)t * (size_t)K, K, q->text_in_lp));
        }
    }
    cJSON_AddNumberToObject(m, "reasoning_tokens", 0);
    cJSON_AddNumberToObject(m, "completion_tokens", n);
    /* n_cached is set at admission, before the first token is published (read after it) */
    cJSON_AddNumberToObject(m, "cached_tokens", n > 0 || fin ? r->n_cached : 0);
    if (fin) {
        cJSON_AddNumberToObject(m, "e2e_latency", srv_now() - j->t_arrival);
        if (s->rt.draft) { /* sglang _calculate_spec_decoding_metrics names */
            const double verify = (double)r->spec_drafts, drafted = (double)r->spec_draft_tokens;
            cJSON_AddNumberToObject(m, "spec_accept_rate", drafted > 0 ? (double)r->spec_accepted / drafted : 0.0);
            cJSON_AddNumberToObject(m, "spec_accept_length", verify > 0 ? (double)n / verify : 0.0);
            cJSON_AddNumberToObject(m, "spec_accept_token_num", (double)r->spec_accepted);
            cJSON_AddNumberToObject(m, "spec_draft_token_num", drafted);
            cJSON_AddNumberToObject(m, "spec_verify_ct", verify);
        }
    }
    return o;
}

static int sg_stream(srv_state *s, struct mg_connection *c, srv_job *j, const sg_req *q, double deadline)
{
    srv_err e;
    if (srv_job_wait_accepted(j, deadline, &e) != 0) return srv_send_err(c, &e);
    srv_sse so;
    srv_sse_begin(&so, c);
    srv_buf b = {0};
    srv_choice_view *v = calloc((size_t)j->n_ch, sizeof *v);
    char *done = calloc((size_t)j->n_ch, 1);
    if (!v || !done) so.broken = 1;
    int timed_out = 0;
    while (!so.broken) {
        uint64_t seen = 0;
        srv_choice_view *old = calloc((size_t)j->n_ch, sizeof *old);
        if (!old) {
            so.broken = 1;
            break;
        }
        for (int i = 0; i < j->n_ch; i++) {
            old[i].n_pub = v[i].n_pub;
            old[i].text.n = v[i].text.n;
        }
        srv_job_snapshot(j, v, &seen);
        int all = 1;
        for (int i = 0; i < j->n_ch; i++) {
            if (done[i]) continue;
            if (v[i].finished || v[i].n_pub != old[i].n_pub || v[i].text.n != old[i].text.n) {
                cJSON *o = sg_output(j, i, q, v[i].text.p, v[i].text.n, v[i].n_pub, v[i].finished);
                if (j->n_ch > 1) cJSON_AddNumberToObject(o, "index", i);
                srv_sse_event(&b, o);
                if (v[i].finished) done[i] = 1;
            }
            all &= done[i];
        }
        free(old);
        srv_sse_flush(&so, &b);
        if (all || so.broken) break;
        if (srv_job_wait_event(j, seen, deadline) != 0) {
            timed_out = 1;
            break;
        }
    }
    srv_job_cancel_settle(j);
    if (!so.broken) {
        if (timed_out) {
            srv_err_timed_out(s, &e);
            srv_sse_event(&b, srv_err_json(&e));
        }
        srv_buf_add(&b, "data: [DONE]\n\n", 14);
        srv_sse_flush(&so, &b);
    }
    srv_sse_end(&so);
    for (int i = 0; v && i < j->n_ch; i++) free(v[i].text.p);
    free(v);
    free(done);
    free(b.p);
    return 200;
}

static int route_generate(srv_state *s, struct mg_connection *c)
{
    const double t0 = srv_now(), deadline = t0 + s->request_timeout;
    srv_err e;
    cJSON *body;
    srv_job *j = srv_job_from_request(s, c, t0, &body, &e);
    if (!j) return srv_send_err(c, &e);
    sg_req q;
    int rc = sg_parse(s, body, j, &q, &e);
    if (rc == 0) rc = srv_job_prepare(j, "sglang", &e);
    if (rc == 0) {
        if (!q.rid[0]) snprintf(q.rid, sizeof q.rid, "%s", j->id + 7); /* "sglang-" + unique hex */
        snprintf(j->rid, sizeof j->rid, "%s", q.rid);
        rc = srv_job_submit(j, &e);
    }
    int status;
    if (rc != 0) {
        status = srv_send_err(c, &e);
    } else if (j->g.stream) {
        status = sg_stream(s, c, j, &q, deadline);
    } else if (srv_job_wait(j, deadline, &e) != 0) {
        status = srv_send_err(c, &e);
    } else {
        cJSON *out = q.batch ? cJSON_CreateArray() : NULL;
        for (int i = 0; i < j->n_ch; i++) {
            const srv_choice *ch = &j->ch[i];
            cJSON *o = sg_output(j, i, &q, ch->text, srv_choice_text_end(ch), ch->n_pub, 1);
            if (out) cJSON_AddItemToArray(out, o);
            else out = o;
        }
        status = srv_send_json(c, 200, out);
        cJSON_Delete(out);
    }
    cJSON_Delete(body); /* q.rids points into it */
    srv_job_free(j);
    return status;
}

/* sglang http_server.py abort_request: {"rid": "", "abort_all": false}; always 200 with no body */
static int route_abort(srv_state *s, struct mg_connection *c)
{
    srv_err e;
    cJSON *body = srv_read_json(&s->http, c, &e);
    if (!body) return srv_send_err(c, &e);
    const cJSON *rid = srv_field(body, "rid");
    const cJSON *all = srv_field(body, "abort_all");
    int rc = 0;
    if (rid && !cJSON_IsString(rid)) rc = srv_errf(&e, 400, "rid", "rid must be a string");
    else if (all && !cJSON_IsBool(all)) rc = srv_errf(&e, 400, "abort_all", "abort_all must be a boolean");
    if (rc == 0) {
        if (cJSON_IsTrue(all)) srv_job_abort(s, NULL);
        else if (rid && rid->valuestring[0]) srv_job_abort(s, rid->valuestring);
    }
    cJSON_Delete(body);
    if (rc != 0) return srv_send_err(c, &e);
    return srv_send(c, 200, "application/json", NULL, "", 0);
}

static int route_model_info(srv_state *s, struct mg_connection *c)
{
    char wv[160];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_path", s->model_dir);
    cJSON_AddStringToObject(o, "tokenizer_path", s->model_dir);
    cJSON_AddBoolToObject(o, "is_generation", 1);
    cJSON_AddNullToObject(o, "preferred_sampling_params");
    cJSON_AddStringToObject(o, "weight_version", weight_version_now(s, wv, sizeof wv));
    cJSON_AddBoolToObject(o, "has_image_understanding", 0);
    cJSON_AddBoolToObject(o, "has_audio_understanding", 0);
    int st = srv_send_json(c, 200, o);
    cJSON_Delete(o);
    return st;
}

/* The engine's live counters, as the engine thread last published them (srv_metrics_publish). */
typedef struct {
    int run, wait, used, total; /* running and waiting requests, KV tokens in use and in all */
} load_now;

static load_now load_read(srv_state *s)
{
    return (load_now){atomic_load(&s->met.running), atomic_load(&s->met.waiting), atomic_load(&s->met.kv_in_use),
                      atomic_load(&s->met.kv_total)};
}

static cJSON *load_json(srv_state *s)
{
    const load_now n = load_read(s);
    cJSON *l = cJSON_CreateObject();
    cJSON_AddNumberToObject(l, "dp_rank", 0);
    cJSON_AddNumberToObject(l, "num_running_reqs", n.run);
    cJSON_AddNumberToObject(l, "num_waiting_reqs", n.wait);
    cJSON_AddNumberToObject(l, "num_total_reqs", n.run + n.wait);
    cJSON_AddNumberToObject(l, "num_used_tokens", n.used);
    cJSON_AddNumberToObject(l, "max_total_num_tokens", s->kv_tokens);
    cJSON_AddNumberToObject(l, "token_usage", n.total > 0 ? (double)n.used / (double)n.total : 0.0);
    return l;
}

/* sglang /get_server_info: its server_args, scheduler info and internal states (the fields frameworks
 * read: slime external.py reads tp_size / pp_size / num_gpus / disaggregation_mode / encoder_only) */
static int route_server_info(srv_state *s, struct mg_connection *c)
{
    char wv[160];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_path", s->model_dir);
    cJSON_AddStringToObject(o, "tokenizer_path", s->model_dir);
    cJSON_AddStringToObject(o, "served_model_name", s->model_name);
    cJSON_AddBoolToObject(o, "skip_tokenizer_init", s->tok == NULL);
    cJSON_AddNumberToObject(o, "context_length", s->max_model_len);
    cJSON_AddNumberToObject(o, "tp_size", 1);
    cJSON_AddNumberToObject(o, "pp_size", 1);
    cJSON_AddNumberToObject(o, "dp_size", 1);
    cJSON_AddNumberToObject(o, "ep_size", 1);
    cJSON_AddNumberToObject(o, "num_gpus", 1);
    cJSON_AddNumberToObject(o, "max_running_requests", s->max_choices);
    cJSON_AddNumberToObject(o, "max_total_num_tokens", s->kv_tokens);
    cJSON_AddStringToObject(o, "disaggregation_mode", "null");
    cJSON_AddBoolToObject(o, "encoder_only", 0);
    if (s->rt.draft) cJSON_AddStringToObject(o, "speculative_algorithm", "DFLASH");
    else cJSON_AddNullToObject(o, "speculative_algorithm");
    cJSON_AddStringToObject(o, "weight_version", weight_version_now(s, wv, sizeof wv));
    cJSON_AddBoolToObject(o, "incremental_streaming_output", 0);
    /* slime (sglang_engine.py _init_external) asserts it equals its --offload-rollout */
    cJSON_AddBoolToObject(o, "enable_memory_saver", s->memory_saver);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "internal_states"), load_json(s));
    cJSON_AddStringToObject(o, "version", "graphswap");
    int st = srv_send_json(c, 200, o);
    cJSON_Delete(o);
    return st;
}

/* GET /get_load, in two shapes, because its two readers disagree:
 *  - SGLang's server answers a list, one entry per DP rank, of GetLoadReqOutput {rid, http_worker_ipc,
 *    dp_rank, num_reqs, num_waiting_reqs, num_tokens} (sgl-project/sglang, the nightly API test
 *    test_api_get_load asserts rid / http_worker_ipc / dp_rank null and the three counts >= 0);
 *  - the Rust routers (sglang-router's and vllm-router's get_worker_load, routers/http/router.rs)
 *    read `data.get("load").as_i64()` of an object, and without it count the worker as -1 (blind
 *    power_of_two / cache_aware balancing).
 * So: ?format=sglang gives the list, ?format=router (or vllm) the object {"load": running + waiting,
 * plus the counts}; without a format, a request with no User-Agent (reqwest, the routers' client,
 * sends none) gets the object and every other (curl, python-requests, aiohttp) SGLang's list. */
static int route_get_load(srv_state *s, struct mg_connection *c)
{
    char fmt[16] = "";
    srv_query_var(c, "format", fmt, sizeof fmt);
    int router;
    if (!fmt[0]) router = mg_get_header(c, "User-Agent") == NULL;
    else if (strcmp(fmt, "router") == 0 || strcmp(fmt, "vllm") == 0) router = 1;
    else if (strcmp(fmt, "sglang") == 0) router = 0;
    else return srv_send_error(c, 400, "format", "format must be \"sglang\", \"router\" or \"vllm\"");
    const load_now n = load_read(s);
    cJSON *l = cJSON_CreateObject();
    if (router) cJSON_AddNumberToObject(l, "load", n.run + n.wait);
    else {
        cJSON_AddNullToObject(l, "rid");
        cJSON_AddNullToObject(l, "http_worker_ipc");
        cJSON_AddNullToObject(l, "dp_rank");
    }
    cJSON_AddNumberToObject(l, "num_reqs", n.run + n.wait);
    cJSON_AddNumberToObject(l, "num_waiting_reqs", n.wait);
    cJSON_AddNumberToObject(l, "num_tokens", n.used);
    cJSON *o = l;
    if (!router) {
        o = cJSON_CreateArray();
        cJSON_AddItemToArray(o, l);
    }
    int st = srv_send_json(c, 200, o);
    cJSON_Delete(o);
    return st;
}

/* sglang /v1/loads (slime server_control.py reads loads[*].num_running_reqs / num_waiting_reqs) */
static int route_loads(srv_state *s, struct mg_connection *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "timestamp", srv_wall());
    cJSON_AddStringToObject(o, "version", "graphswap");
    cJSON_AddNumberToObject(o, "dp_rank_count", 1);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "loads"), load_json(s));
    int st = srv_send_json(c, 200, o);
    cJSON_Delete(o);
    return st;
}

/* sglang /health_generate: one generated token proves the engine works (200 empty), else 503 */
static int route_health_generate(srv_state *s, struct mg_connection *c)
{
    const double t0 = srv_now(), lim = s->request_timeout < 20 ? s->request_timeout : 20;
    srv_err e;
    srv_job *j = srv_job_new(s, t0);
    if (!j) return srv_send_error(c, 500, NULL, "out of memory");
    cJSON *canon = cJSON_CreateObject();
    cJSON *p = cJSON_AddArrayToObject(canon, "prompt");
    cJSON_AddItemToArray(p, cJSON_CreateNumber(0));
    cJSON_AddNumberToObject(canon, "max_tokens", 1);
    cJSON_AddNumberToObject(canon, "temperature", 0);
    int rc = srv_parse_mapped(s, canon, NULL, NULL, 0, &j->g, &e);
    if (rc == 0) rc = srv_job_prepare(j, "health", &e);
    if (rc == 0) rc = srv_job_submit(j, &e);
    if (rc == 0) rc = srv_job_wait(j, t0 + lim, &e);
    if (rc == 0 && j->ch[0].n_pub < 1) rc = -1;
    srv_job_free(j);
    return srv_send(c, rc == 0 ? 200 : 503, "text/plain", NULL, "", 0);
}

void srv_dialect_sglang_routes(srv_state *s)
{
    srv_route_add(&s->http, "POST", "/generate", route_generate, 1);
    srv_route_add(&s->http, "POST", "/abort_request", route_abort, 1);
    srv_route_add(&s->http, "GET", "/get_server_info", route_server_info, 1);
    srv_route_add(&s->http, "GET", "/server_info", route_server_info, 1);
    srv_route_add(&s->http, "GET", "/get_model_info", route_model_info, 1);
    srv_route_add(&s->http, "GET", "/model_info", route_model_info, 1);
    srv_route_add(&s->http, "GET", "/v1/loads", route_loads, 1);
    srv_route_add(&s->http, "GET", "/get_load", route_get_load, 1);
    srv_route_add(&s->http, "GET", "/health_generate", route_health_generate, 1);
}
