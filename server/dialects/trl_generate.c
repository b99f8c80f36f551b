/* server/dialects/trl_generate.c — the HTTP protocol of TRL's `trl vllm-serve` (trl/scripts/vllm_serve.py, read
 * by trl/generation/vllm_client.py), as a thin translation over the native jobs:
 *   GET  /health/               {"status": "ok"}
 *   GET  /get_world_size/       {"world_size": 1}
 *   POST /generate/             {prompts: [str] | [[ids]], images?, n, repetition_penalty, temperature, top_p,
 *                                top_k, min_p, max_tokens, logprobs, structured_outputs_regex |
 *                                guided_decoding_regex, generation_kwargs}
 *   POST /chat/                 {messages: [[{role, content}]], ... the same, chat_template_kwargs, tools}
 * The trailing slashes are part of TRL's routes (FastAPI does not redirect POSTs), so these are
 * distinct from the OpenAI / SGLang / vLLM paths without one. The weight routes (/init_communicator/,
 * /update_named_param/, /batch_update_named_params/, /close_communicator/) live with the weight API.
 *
 * Answers: {prompt_ids: [[ids] per prompt], completion_ids: [[ids] per sequence, prompt-major],
 * logprobs: [[[...]]] | null, logprob_token_ids: [[[...]]] | null}: per token the sampled token's
 * logprob when logprobs is 0, else the `logprobs` best ids plus the sampled one when it is not among
 * them, sorted by rank (trl/generation/vllm_generation.py extract_logprobs). generation_kwargs
 * override the named fields (they are vLLM SamplingParams names, so they go through the same mapping).
 * Errors are FastAPI's: 422 {"detail": [{"type", "loc", "msg", "input"}]} for a request the model or
 * SamplingParams refuses, {"detail": message} otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dialects/dialects.h"

static const srv_field_map TRL_MAP[] = {
    {"n", "n"},
    {"repetition_penalty", "repetition_penalty"},
    {"presence_penalty", "presence_penalty"},
    {"frequency_penalty", "frequency_penalty"},
    {"temperature", "temperature"},
    {"top_p", "top_p"},
    {"top_k", "top_k"},
    {"min_p", "min_p"},
    {"max_tokens", "max_tokens"},
    {"min_tokens", "min_tokens"},
    {"logprobs", "logprobs"},
    {"seed", "seed"},
    {"stop", "stop"},
    {"stop_token_ids", "stop_token_ids"},
    {"ignore_eos", "ignore_eos"},
    {"skip_special_tokens", "skip_special_tokens"},
    {"include_stop_str_in_output", "include_stop_str_in_output"},
    {"logit_bias", "logit_bias"},
    {"best_of", "best_of"},
    {"structured_outputs", "structured_outputs"},
    {"guided_decoding", "guided_regex"},
    {"structured_outputs_regex", "guided_regex"},
    {"guided_decoding_regex", "guided_regex"},
};
#define TRL_NMAP ((int)(sizeof TRL_MAP / sizeof TRL_MAP[0]))

/* FastAPI's shapes: 422 with a validation-error list for request errors, {"detail": msg} for others */
static int trl_send_err(struct mg_connection *c, const srv_err *e)
{
    cJSON *o = cJSON_CreateObject();
    if (e->status == 400 || e->status == 404 || e->status == 422) {
        cJSON *d = cJSON_AddArrayToObject(o, "detail");
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "value_error");
        cJSON *loc = cJSON_AddArrayToObject(x, "loc");
        cJSON_AddItemToArray(loc, cJSON_CreateString("body"));
        if (e->param[0]) cJSON_AddItemToArray(loc, cJSON_CreateString(e->param));
        cJSON_AddStringToObject(x, "msg", e->msg);
        cJSON_AddNullToObject(x, "input");
        cJSON_AddItemToArray(d, x);
    } else {
        cJSON_AddStringToObject(o, "detail", e->msg);
    }
    int st = srv_send_json(c, e->status == 400 || e->status == 404 ? 422 : e->status, o);
    cJSON_Delete(o);
    return st;
}

/* The request fields merged with generation_kwargs (which win), as vllm_serve.py builds SamplingParams. */
static cJSON *merged_params(const cJSON *body, srv_err *e)
{
    cJSON *m = cJSON_Duplicate(body, 1);
    if (!m) {
        srv_errf(e, 500, NULL, "out of memory");
        return NULL;
    }
    const cJSON *gk = srv_field(body, "generation_kwargs");
    if (gk && !cJSON_IsObject(gk)) {
        cJSON_Delete(m);
        srv_errf(e, 400, "generation_kwargs", "generation_kwargs must be an object");
        return NULL;
    }
    for (const cJSON *x = gk ? gk->child : NULL; x; x = x->next) {
        cJSON *d = cJSON_Duplicate(x, 1);
        if (cJSON_GetObjectItemCaseSensitive(m, x->string)) cJSON_ReplaceItemInObjectCaseSensitive(m, x->string, d);
        else cJSON_AddItemToObject(m, x->string, d);
    }
    return m;
}

/* images: null, or a list of nulls (no VLM support) */
static int refuse_images(const cJSON *body, srv_err *e)
{
    const cJSON *im = srv_field(body, "images");
    if (!im) return 0;
    if (!cJSON_IsArray(im)) return srv_errf(e, 400, "images", "images must be a list");
    for (const cJSON *x = im->child; x; x = x->next)
        if (!cJSON_IsNull(x)) return srv_errf(e, 400, "images", "images are not supported (text-only model)");
    return 0;
}

/* Parses /generate/ (chat = 0) or /chat/ (chat = 1) into j->g. */
static int trl_parse(srv_state *s, const cJSON *body, int chat, srv_job *j, int *want_lp, srv_err *e)
{
    if (refuse_images(body, e)) return -1;
    cJSON *canon = cJSON_CreateObject();
    if (!canon) return srv_errf(e, 500, NULL, "out of memory");
    const char *pname = chat ? "messages" : "prompts";
    if (!chat) {
        const cJSON *p = srv_field(body, "prompts");
        if (!p) {
            cJSON_Delete(canon);
            return srv_errf(e, 400, "prompts", "Field required: prompts");
        }
        if (!cJSON_IsArray(p) || !p->child || !(cJSON_IsString(p->child) || cJSON_IsArray(p->child))) {
            cJSON_Delete(canon);
            return srv_errf(e, 400, "prompts", "prompts must be a non-empty list of strings or of token-id lists");
        }
        /* vllm_serve.py: strings are prompts (tokenized with the model's special tokens), lists are
         * prompt_token_ids */
        cJSON_AddItemToObject(canon, "prompt", cJSON_Duplicate(p, 1));
    } else {
        const cJSON *ms = srv_field(body, "messages");
        if (!ms || !cJSON_IsArray(ms) || !ms->child || !cJSON_IsArray(ms->child)) {
            cJSON_Delete(canon);
            return srv_errf(e, 400, "messages", "messages must be a non-empty list of conversations (lists of messages)");
        }
        /* chat_template_kwargs (vllm_serve.py passes them to llm.chat): the built-in templates' own
         * variables, parsed as /v1/chat/completions parses them */
        srv_chat_opts co;
        if (srv_chat_opts_parse(body, &co, e) != 0) {
            cJSON_Delete(canon);
            return -1;
        }
        const cJSON *tools = srv_field(body, "tools");
        if (tools && !(cJSON_IsArray(tools) && !tools->child)) {
            cJSON_Delete(canon);
            return srv_errf(e, 400, "tools", "tools are not supported");
        }
        cJSON *ps = cJSON_AddArrayToObject(canon, "prompt");
        int k = 0;
        for (const cJSON *conv = ms->child; conv; conv = conv->next, k++) {
            srv_prompt pr = {0};
            if (!cJSON_IsArray(conv) || srv_chat_encode(s, conv, &co, &pr, e) != 0) {
                if (!cJSON_IsArray(conv)) srv_errf(e, 400, "messages", "messages[%d] must be a list of messages", k);
                cJSON_Delete(canon);
                return -1;
            }
            cJSON_AddItemToArray(ps, srv_ids_json(pr.ids, pr.n));
            free(pr.ids);
        }
    }
    cJSON *m = merged_params(body, e);
    if (!m) {
        cJSON_Delete(canon);
        return -1;
    }
    srv_field_map map[TRL_NMAP + 1];
    memcpy(map, TRL_MAP, sizeof TRL_MAP);
    map[TRL_NMAP] = (srv_field_map){pname, "prompt"};
    /* the prompts are in canon already (the map entry only renames errors back) */
    cJSON_DeleteItemFromObjectCaseSensitive(m, "prompts");
    cJSON_DeleteItemFromObjectCaseSensitive(m, "messages");
    /* logprobs: an int (default 0) or null (no logprobs) */
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(m, "logprobs");
    *want_lp = !(lp && cJSON_IsNull(lp));
    if (!lp) cJSON_AddNumberToObject(m, "logprobs", 0);
    int rc = srv_parse_mapped(s, canon, m, map, TRL_NMAP + 1, &j->g, e);
    cJSON_Delete(m);
    return rc;
}

/* extract_logprobs: per token the ids sorted by rank (the sampled one among them) and their logprobs */
static void add_logprobs(const srv_job *j, cJSON *lps, cJSON *lids)
{
    for (int i = 0; i < j->n_ch; i++) {
        const eng_request *r = &j->ch[i].r;
        const int K = r->sp.logprobs;
        cJSON *sl = cJSON_CreateArray(), *si = cJSON_CreateArray();
        for (int t = 0; t < j->ch[i].n_pub; t++) {
            cJSON *a = cJSON_CreateArray(), *b = cJSON_CreateArray();
            const int32_t id = r->out_tokens[t];
            int have = 0;
            for (int k = 0; k < K; k++) {
                const eng_toplp *x = &r->out_top[(size_t)t * (size_t)K + (size_t)k];
                cJSON_AddItemToArray(a, cJSON_CreateNumber(x->logprob));
                cJSON_AddItemToArray(b, cJSON_CreateNumber(x->id));
                have |= x->id == id;
            }
            if (!have) { /* rank > K (or K == 0): last */
                cJSON_AddItemToArray(a, cJSON_CreateNumber(r->out_logprobs[t]));
                cJSON_AddItemToArray(b, cJSON_CreateNumber(id));
            }
            cJSON_AddItemToArray(sl, a);
            cJSON_AddItemToArray(si, b);
        }
        cJSON_AddItemToArray(lps, sl);
        cJSON_AddItemToArray(lids, si);
    }
}

static int route_gen(srv_state *s, struct mg_connection *c, int chat)
{
    const double t0 = srv_now(), deadline = t0 + s->request_timeout;
    srv_err e;
    cJSON *body;
    srv_job *j = srv_job_from_request(s, c, t0, &body, &e);
    if (!j) return trl_send_err(c, &e);
    int want_lp = 1;
    int rc = trl_parse(s, body, chat, j, &want_lp, &e);
    cJSON_Delete(body);
    if (rc == 0) rc = srv_job_prepare(j, "trl", &e);
    if (rc == 0) rc = srv_job_submit(j, &e);
    if (rc == 0) rc = srv_job_wait(j, deadline, &e);
    int status;
    if (rc != 0) {
        status = trl_send_err(c, &e);
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON *pids = cJSON_AddArrayToObject(o, "prompt_ids");
        for (int p = 0; p < j->g.n_prompts; p++) cJSON_AddItemToArray(pids, srv_ids_json(j->g.prompts[p].ids, j->g.prompts[p].n));
        cJSON *cids = cJSON_AddArrayToObject(o, "completion_ids");
        for (int i = 0; i < j->n_ch; i++) cJSON_AddItemToArray(cids, srv_ids_json(j->ch[i].r.out_tokens, j->ch[i].n_pub));
        if (want_lp) {
            cJSON *lps = cJSON_AddArrayToObject(o, "logprobs"), *lids = cJSON_AddArrayToObject(o, "logprob_token_ids");
            add_logprobs(j, lps, lids);
        } else {
            cJSON_AddNullToObject(o, "logprobs");
            cJSON_AddNullToObject(o, "logprob_token_ids");
        }
        status = srv_send_json(c, 200, o);
        cJSON_Delete(o);
    }
    srv_job_free(j);
    return status;
}

static int route_generate(srv_state *s, struct mg_connection *c) { return route_gen(s, c, 0); }
static int route_chat(srv_state *s, struct mg_connection *c) { return route_gen(s, c, 1); }

static int route_health(srv_state *s, struct mg_connection *c)
{
    (void)s;
    const char *b = "{\"status\":\"ok\"}";
    return srv_send(c, 200, "application/json", NULL, b, strlen(b));
}

static int route_world_size(srv_state *s, struct mg_connection *c)
{
    (void)s;
    const char *b = "{\"world_size\":1}";
    return srv_send(c, 200, "application/json", NULL, b, strlen(b));
}

void srv_dialect_trl_routes(srv_state *s)
{
    srv_route_add(&s->http, "GET", "/health/", route_health, 0);
    srv_route_add(&s->http, "GET", "/get_world_size/", route_world_size, 1);
    srv_route_add(&s->http, "POST", "/generate/", route_generate, 1);
    srv_route_add(&s->http, "POST", "/chat/", route_chat, 1);
    /* /reset_prefix_cache/ and the communicator routes: server/dialects/trl_weights.c */
}
