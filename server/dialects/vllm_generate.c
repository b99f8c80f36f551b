/* server/dialects/vllm_generate.c — vLLM's tokens-in / tokens-out API, as a thin translation over the native jobs:
 *   POST /inference/v1/generate   {request_id?, token_ids, sampling_params{...vLLM SamplingParams},
 *                                  model?, stream?, stream_options?, cache_salt?, priority?}
 *   GET  /get_world_size          {"world_size": 1} (include_dp accepted)
 *
 * Shapes follow vllm/entrypoints/serve/disagg/{protocol,serving}.py: the answer is {request_id
 * ("generate-tokens-" + the request's id), model, created, choices[{index, logprobs, finish_reason,
 * token_ids, routed_experts}], usage{prompt_tokens, total_tokens, completion_tokens,
 * prompt_tokens_details}, prompt_logprobs, kv_transfer_params}; logprobs are chat-style with
 * "token_id:N" tokens (the sampled token first in top_logprobs, max(logprobs, 1) entries, logprobs
 * clamped at -9999). A stream sends one chunk per choice with new tokens ({request_id, choices[...],
 * usage}), the usage chunk with stream_options.include_usage, then [DONE]. The sampling_params names
 * are srv_parse_gen's own (it follows vLLM), so they are validated there unchanged; max_tokens defaults
 * to the rest of the context as vLLM's serving does. Errors: {"error": {message, type, param, code}}.
 *
 * cache_salt (a non-empty string, srv_parse_gen's check) salts the prefix cache: only requests of the
 * same salt share cached blocks. usage.prompt_tokens_details is {cached_tokens} with
 * --enable-prompt-tokens-details and a prefix-cache hit (as vLLM), else null. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dialects/dialects.h"

/* vLLM SamplingParams fields srv_parse_gen reads under the same names */
static const srv_field_map VL_MAP[] = {
    {"n", "n"},
    {"presence_penalty", "presence_penalty"},
    {"frequency_penalty", "frequency_penalty"},
    {"repetition_penalty", "repetition_penalty"},
    {"temperature", "temperature"},
    {"top_p", "top_p"},
    {"top_k", "top_k"},
    {"min_p", "min_p"},
    {"seed", "seed"},
    {"stop", "stop"},
    {"stop_token_ids", "stop_token_ids"},
    {"ignore_eos", "ignore_eos"},
    {"max_tokens", "max_tokens"},
    {"min_tokens", "min_tokens"},
    {"logprobs", "logprobs"},
    {"prompt_logprobs", "prompt_logprobs"},
    {"skip_special_tokens", "skip_special_tokens"},
    {"include_stop_str_in_output", "include_stop_str_in_output"},
    {"logit_bias", "logit_bias"},
    {"best_of", "best_of"},
    {"structured_outputs", "structured_outputs"},
    {"guided_decoding", "guided_regex"},
};
#define VL_NMAP ((int)(sizeof VL_MAP / sizeof VL_MAP[0]))

/* Fields of SamplingParams that change the output and are not implemented (beyond srv_parse_gen's). */
static int vl_refuse(const cJSON *body, const cJSON *sp, srv_err *e)
{
    static const char *sps[] = {"bad_words", "allowed_token_ids", "truncate_prompt_tokens", "logits_processors",
                                "extra_args"};
    for (size_t i = 0; i < sizeof sps / sizeof sps[0]; i++) {
        const cJSON *v = srv_field(sp, sps[i]);
        if (v && !(cJSON_IsArray(v) && !v->child) && !(cJSON_IsObject(v) && !v->child))
            return srv_errf(e, 400, sps[i], "sampling_params.%s is not supported", sps[i]);
    }
    static const char *tops[] = {"features", "kv_transfer_params"};
    for (size_t i = 0; i < sizeof tops / sizeof tops[0]; i++)
        if (srv_field(body, tops[i])) return srv_errf(e, 400, tops[i], "%s is not supported", tops[i]);
    const cJSON *pr = srv_field(body, "priority");
    if (pr && !(cJSON_IsNumber(pr) && pr->valuedouble == 0))
        return srv_errf(e, 400, "priority", "priority must be 0: this server does not use priority scheduling");
    return 0;
}

typedef struct {
    char request_id[160];
    int include_usage, continuous_usage;
} vl_req;

static int vl_parse(srv_state *s, const cJSON *body, srv_job *j, vl_req *q, srv_err *e)
{
    memset(q, 0, sizeof *q);
    const cJSON *ids = srv_field(body, "token_ids");
    if (!ids) return srv_errf(e, 400, "token_ids", "token_ids is required");
    if (!cJSON_IsArray(ids) || (ids->child && !cJSON_IsNumber(ids->child)))
        return srv_errf(e, 400, "token_ids", "token_ids must be a list of token ids");
    const cJSON *sp = srv_field(body, "sampling_params");
    if (!sp) return srv_errf(e, 400, "sampling_params", "sampling_params is required");
    if (!cJSON_IsObject(sp)) return srv_errf(e, 400, "sampling_params", "sampling_params must be an object");
    if (vl_refuse(body, sp, e)) return -1;
    const cJSON *rid = srv_field(body, "request_id");
    if (rid && !cJSON_IsString(rid)) return srv_errf(e, 400, "request_id", "request_id must be a string");
    const cJSON *model = srv_field(body, "model");
    if (model && !cJSON_IsString(model)) return srv_errf(e, 400, "model", "model must be a string");
    const cJSON *st = srv_field(body, "stream");
    if (st && !cJSON_IsBool(st)) return srv_errf(e, 400, "stream", "stream must be a boolean");
    const cJSON *so = srv_field(body, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return srv_errf(e, 400, "stream_options", "stream_options must be an object");
        q->include_usage = cJSON_IsTrue(srv_field(so, "include_usage"));
        q->continuous_usage = cJSON_IsTrue(srv_field(so, "continuous_usage_stats"));
    }

    cJSON *canon = cJSON_CreateObject();
    if (!canon) return srv_errf(e, 500, NULL, "out of memory");
    cJSON_AddItemToObject(canon, "prompt", cJSON_Duplicate(ids, 1));
    if (model) cJSON_AddStringToObject(canon, "model", model->valuestring);
    const cJSON *salt = srv_field(body, "cache_salt"); /* validated and hashed by srv_parse_gen */
    if (salt) cJSON_AddItemToObject(canon, "cache_salt", cJSON_Duplicate(salt, 1));
    if (!srv_field(sp, "max_tokens")) { /* vLLM serving: the rest of the context */
        const int room = s->max_model_len < s->kv_tokens ? s->max_model_len : s->kv_tokens;
        const int left = room - cJSON_GetArraySize(ids);
        cJSON_AddNumberToObject(canon, "max_tokens", left > 0 ? left : 1);
    }
    srv_field_map map[VL_NMAP + 1];
    memcpy(map, VL_MAP, sizeof VL_MAP);
    map[VL_NMAP] = (srv_field_map){"token_ids", "prompt"};
    if (srv_parse_mapped(s, canon, sp, map, VL_NMAP + 1, &j->g, e)) return -1;
    j->g.stream = st && cJSON_IsTrue(st);
    j->g.include_usage = q->include_usage;
    if (rid) snprintf(q->request_id, sizeof q->request_id, "generate-tokens-%.140s", rid->valuestring);
    return 0;
}

static double clamp_lp(float lp) { return lp < -9999.0f ? -9999.0 : (double)lp; }

static cJSON *lp_item(int32_t id, float lp)
{
    char tok[32];
    snprintf(tok, sizeof tok, "token_id:%d", (int)id);
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "token", tok);
    cJSON_AddNumberToObject(x, "logprob", clamp_lp(lp));
    cJSON_AddNullToObject(x, "bytes");
    return x;
}

/* serving.py _create_tokens_logprobs for tokens [from, to): per token its logprob and, as vLLM orders
 * the logprobs dict (sampled token first, then the best ids), the first max(logprobs, 1) entries */
static cJSON *vl_logprobs(const srv_job *j, const srv_choice *ch, int from, int to)
{
    const eng_request *r = &ch->r;
    const int K = r->sp.logprobs, want = K > 1 ? K : 1;
    cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
    (void)j;
    for (int i = from; i < to; i++) {
        const int32_t id = r->out_tokens[i];
        cJSON *e = lp_item(id, r->out_logprobs[i]);
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        cJSON_AddItemToArray(tops, lp_item(id, r->out_logprobs[i]));
        for (int k = 0, n = 1; k < K && n < want; k++) {
            const eng_toplp *t = &r->out_top[(size_t)i * (size_t)K + (size_t)k];
            if (t->id == id) continue;
            cJSON_AddItemToArray(tops, lp_item(t->id, t->logprob));
            n++;
        }
        cJSON_AddItemToArray(content, e);
    }
    return o;
}

static const char *vl_finish(const srv_choice *ch)
{
    switch (ch->r.finish) {
    case ENG_FINISH_STOP: return "stop";
    case ENG_FINISH_LENGTH: return "length";
    default: return "abort";
    }
}

/* details: 0 no prompt_tokens_details (continuous stream usage), 1 the whole answer's (null without a
 * hit or the flag), 2 the stream's final usage chunk (vLLM drops it there when null: exclude_none).
 * 1 and 2 read the settled job. */
static cJSON *vl_usage(const srv_job *j, int completion, int details)
{
    cJSON *u = cJSON_CreateObject();
    const int p = j->g.prompts[0].n;
    cJSON_AddNumberToObject(u, "prompt_tokens", p);
    cJSON_AddNumberToObject(u, "total_tokens", p + completion);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    const long cached = details ? srv_job_cached_tokens(j) : 0;
    if (details && j->s->prompt_tokens_details && cached > 0) { /* vLLM: only with the flag and a hit */
        cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
        cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    } else if (details == 1) {
        cJSON_AddNullToObject(u, "prompt_tokens_details");
    }
    return u;
}

static cJSON *vl_full(const srv_job *j, const vl_req *q)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "request_id", q->request_id);
    cJSON_AddStringToObject(o, "model", j->s->model_name);
    cJSON_AddNumberToObject(o, "created", (double)(long long)j->created);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    int total = 0;
    for (int i = 0; i < j->n_ch; i++) {
        const srv_choice *ch = &j->ch[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", ch->index);
        if (j->g.logprobs) cJSON_AddItemToObject(c, "logprobs", vl_logprobs(j, ch, 0, ch->n_pub));
        else cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", vl_finish(ch));
        cJSON_AddItemToObject(c, "token_ids", srv_ids_json(ch->r.out_tokens, ch->n_pub));
        cJSON_AddNullToObject(c, "routed_experts");
        cJSON_AddItemToArray(choices, c);
        total += ch->n_pub;
    }
    cJSON_AddItemToObject(o, "usage", vl_usage(j, total, 1));
    if (j->g.prompt_logprobs >= 0) cJSON_AddItemToObject(o, "prompt_logprobs", srv_prompt_logprobs_vllm(j, &j->ch[0]));
    else cJSON_AddNullToObject(o, "prompt_logprobs");
    cJSON_AddNullToObject(o, "kv_transfer_params");
    return o;
}

static int vl_stream(srv_state *s, struct mg_connection *c, srv_job *j, const vl_req *q, double deadline)
{
    srv_err e;
    if (srv_job_wait_accepted(j, deadline, &e) != 0) return srv_send_err(c, &e);
    srv_sse so;
    srv_sse_begin(&so, c);
    srv_buf b = {0};
    srv_choice_view *v = calloc((size_t)j->n_ch, sizeof *v);
    int *sent = calloc((size_t)j->n_ch, sizeof *sent), *fin_sent = calloc((size_t)j->n_ch, sizeof *fin_sent);
    if (!v || !sent || !fin_sent) so.broken = 1;
    int timed_out = 0;
    while (!so.broken) {
        uint64_t seen = 0;
        srv_job_snapshot(j, v, &seen);
        int all = 1;
        for (int i = 0; i < j->n_ch; i++) {
            srv_choice *ch = &j->ch[i];
            /* serving.py: a choice with no new token sends nothing, and its last token carries the
             * finish reason. Here a choice's last tokens and its finish are published by two
             * callbacks of one engine step, so a snapshot can fall between them: then the finish
             * goes out in a chunk of its own, with no token (fin_sent), rather than being lost. */
            if (v[i].n_pub > sent[i] || (v[i].finished && !fin_sent[i])) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "request_id", q->request_id);
                cJSON *cc = cJSON_CreateObject();
                cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), cc);
                cJSON_AddNumberToObject(cc, "index", ch->index);
                if (j->g.logprobs) cJSON_AddItemToObject(cc, "logprobs", vl_logprobs(j, ch, sent[i], v[i].n_pub));
                else cJSON_AddNullToObject(cc, "logprobs");
                if (v[i].finished) cJSON_AddStringToObject(cc, "finish_reason", vl_finish(ch));
                else cJSON_AddNullToObject(cc, "finish_reason");
                fin_sent[i] = v[i].finished;
                cJSON_AddItemToObject(cc, "token_ids", srv_ids_json(ch->r.out_tokens + sent[i], v[i].n_pub - sent[i]));
                cJSON_AddNullToObject(cc, "routed_experts");
                if (q->continuous_usage) cJSON_AddItemToObject(o, "usage", vl_usage(j, v[i].n_pub, 0));
                else cJSON_AddNullToObject(o, "usage");
                srv_sse_event(&b, o);
                sent[i] = v[i].n_pub;
            }
            all &= v[i].finished;
        }
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
        } else if (q->include_usage) {
            int total = 0;
            for (int i = 0; i < j->n_ch; i++) total += j->ch[i].n_pub;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "request_id", q->request_id);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", vl_usage(j, total, 2));
            srv_sse_event(&b, o);
        }
        srv_buf_add(&b, "data: [DONE]\n\n", 14);
        srv_sse_flush(&so, &b);
    }
    srv_sse_end(&so);
    for (int i = 0; v && i < j->n_ch; i++) free(v[i].text.p);
    free(v);
    free(sent);
    free(fin_sent);
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
    vl_req q;
    int rc = vl_parse(s, body, j, &q, &e);
    cJSON_Delete(body);
    if (rc == 0) rc = srv_job_prepare(j, "generate-tokens", &e);
    if (rc == 0) {
        if (!q.request_id[0]) snprintf(q.request_id, sizeof q.request_id, "%s", j->id);
        snprintf(j->rid, sizeof j->rid, "%.127s", q.request_id);
        rc = srv_job_submit(j, &e);
    }
    int status;
    if (rc != 0) {
        status = srv_send_err(c, &e);
    } else if (j->g.stream) {
        status = vl_stream(s, c, j, &q, deadline);
    } else if (srv_job_wait(j, deadline, &e) != 0) {
        status = srv_send_err(c, &e);
    } else {
        cJSON *o = vl_full(j, &q);
        status = srv_send_json(c, 200, o);
        cJSON_Delete(o);
    }
    srv_job_free(j);
    return status;
}

/* vLLM api_router.py get_world_size (TP * PP [* DP]); one engine here */
static int route_world_size(srv_state *s, struct mg_connection *c)
{
    (void)s;
    char v[16] = "";
    srv_query_var(c, "include_dp", v, sizeof v);
    if (v[0] && strcmp(v, "true") && strcmp(v, "false") && strcmp(v, "1") && strcmp(v, "0") && strcmp(v, "True") &&
        strcmp(v, "False"))
        return srv_send_error(c, 400, "include_dp", "include_dp must be a boolean");
    const char *body = "{\"world_size\":1}";
    return srv_send(c, 200, "application/json", NULL, body, strlen(body));
}

void srv_dialect_vllm_routes(srv_state *s)
{
    srv_route_add(&s->http, "POST", "/inference/v1/generate", route_generate, 1);
    srv_route_add(&s->http, "GET", "/get_world_size", route_world_size, 1);
}
