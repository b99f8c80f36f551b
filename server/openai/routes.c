/* server/openai/routes.c — the small routes: GET /health, GET /v1/models, GET /metrics, POST /tokenize,
 * POST /detokenize (vLLM shapes). None of them touches the engine: they read immutable start-up data,
 * the tokenizer (thread-safe) or the metrics copies. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai/openai.h"

/* GET /health: liveness, as vLLM / SGLang users expect it: 200 while the process serves, also while a
 * weight session is open or generation is paused (a load balancer must not kill or drop a server for
 * taking an update; requests queue meanwhile), with "status" "updating" / "paused" saying so; 503
 * with the reason when the weights are inconsistent (a failed update) or undefined (the plan guard
 * fired), since nothing can be generated until an update repairs them.
 * GET /health?ready=1: readiness: 503 also while updating or paused, so a readiness probe takes the
 * server out of rotation until generation runs again; and while serve --weights-from has not pulled
 * the live weights yet (status "pulling", the reason naming the pull; plain /health stays 200:
 * the process is alive, a liveness probe must not restart it). */
int srv_route_health(srv_state *s, struct mg_connection *c)
{
    pthread_mutex_lock(&s->wmu);
    eng_weights_info w = s->wpub;
    int paused = s->is_paused_pub;
    const int pulling = atomic_load(&s->pull_pending);
    char pull_reason[sizeof s->pull_reason];
    memcpy(pull_reason, s->pull_reason, sizeof pull_reason);
    pthread_mutex_unlock(&s->wmu);
    char ready_q[8] = "";
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (ri->query_string) mg_get_var(ri->query_string, strlen(ri->query_string), "ready", ready_q, sizeof ready_q);
    const int want_ready = ready_q[0] && strcmp(ready_q, "0") != 0 && strcmp(ready_q, "false") != 0;
    cJSON *o = cJSON_CreateObject();
    const int bad = w.state == ENG_W_INCONSISTENT || w.state == ENG_W_UNDEFINED;
    const int updating = w.session_open || w.state == ENG_W_UPDATING;
    const int ready = !bad && !updating && !paused && !pulling;
    cJSON_AddStringToObject(o, "status", bad        ? "unavailable"
                                         : pulling  ? "pulling"
                                         : updating ? "updating"
                                         : paused   ? "paused"
                                                    : "ok");
    cJSON_AddStringToObject(o, "weights", eng_wstate_name(w.state));
    cJSON_AddStringToObject(o, "weight_version", w.version);
    cJSON_AddBoolToObject(o, "ready", ready);
    cJSON_AddBoolToObject(o, "session_open", w.session_open);
    cJSON_AddBoolToObject(o, "paused", paused);
    if (bad) cJSON_AddStringToObject(o, "reason", w.reason);
    else if (pulling) cJSON_AddStringToObject(o, "reason", pull_reason);
    int st = srv_send_json(c, bad || (want_ready && !ready) ? 503 : 200, o);
    cJSON_Delete(o);
    return st;
}

/* The served model as /v1/models lists it (vLLM's ModelCard). */
static cJSON *model_card(const srv_state *s)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)(long long)s->t_start);
    cJSON_AddStringToObject(m, "owned_by", "graphswap");
    cJSON_AddStringToObject(m, "root", s->model_dir);
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", s->max_model_len);
    return m;
}

int srv_route_models(srv_state *s, struct mg_connection *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_card(s));
    int st = srv_send_json(c, 200, o);
    cJSON_Delete(o);
    return st;
}

/* GET /v1/models/{id} (the OpenAI client's models.retrieve): the card, or vLLM's 404. The id may
 * hold slashes (a model folder as the name); civetweb has decoded the path already. */
int srv_route_model_one(srv_state *s, struct mg_connection *c)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    /* The official openai client sends retrieve("/tmp/model") as GET /v1/models/%2Ftmp%2Fmodel
     * (openai-python models.retrieve: path_template("/models/{model}") quotes every "/"). civetweb
     * decodes it into local_uri_raw ("/v1/models//tmp/model") and then cleans local_uri, whose
     * "//" collapse would drop the id's leading "/": the id is read from local_uri_raw, as decoded,
     * so an absolute --model folder (the default id, as in vLLM) is found. */
    const char *raw = ri->local_uri_raw ? ri->local_uri_raw : ri->local_uri;
    const size_t pre = strlen("/v1/models/");
    const char *id = strncmp(raw, "/v1/models/", pre) == 0 ? raw + pre : ri->local_uri + pre;
    if (strcmp(id, s->model_name) != 0) {
        srv_err e;
        srv_errf(&e, 404, "model", "The model `%.200s` does not exist.", id);
        e.type = "NotFoundError";
        return srv_send_err(c, &e);
    }
    cJSON *m = model_card(s);
    int st = srv_send_json(c, 200, m);
    cJSON_Delete(m);
    return st;
}

int srv_route_metrics(srv_state *s, struct mg_connection *c)
{
    size_t n = 0;
    char *txt = srv_metrics_render(&s->met, s->model_name, &n);
    if (!txt) return srv_send_error(c, 500, NULL, "out of memory rendering metrics");
    /* weight updates: hook runs per model (exactly one per finish of a touched model), outcomes,
     * the current version number and state */
    pthread_mutex_lock(&s->wmu);
    eng_weights_info w = s->wpub;
    pthread_mutex_unlock(&s->wmu);
    char extra[2048];
    int en = snprintf(extra, sizeof extra,
                      "# HELP graphswap:weight_update_hook_runs_total Post-load hook runs by model.\n"
                      "# TYPE graphswap:weight_update_hook_runs_total counter\n"
                      "graphswap:weight_update_hook_runs_total{model=\"target\"} %llu\n"
                      "graphswap:weight_update_hook_runs_total{model=\"draft\"} %llu\n"
                      "# HELP graphswap:weight_updates_total Finished weight-update sessions by result.\n"
                      "# TYPE graphswap:weight_updates_total counter\n"
                      "graphswap:weight_updates_total{result=\"ok\"} %llu\n"
                      "graphswap:weight_updates_total{result=\"failed\"} %llu\n"
                      "# HELP graphswap:weight_version_number Number of successful updates since start.\n"
                      "# TYPE graphswap:weight_version_number gauge\n"
                      "graphswap:weight_version_number %llu\n"
                      "# HELP graphswap:weights_state 0 ready, 1 updating, 2 inconsistent, 3 undefined.\n"
                      "# TYPE graphswap:weights_state gauge\n"
                      "graphswap:weights_state %d\n"
                      "# HELP graphswap:weight_sessions_timed_out_total Sessions aborted by --weight-session-timeout.\n"
                      "# TYPE graphswap:weight_sessions_timed_out_total counter\n"
                      "graphswap:weight_sessions_timed_out_total %llu\n"
                      "# HELP graphswap:weight_update_last_seconds Duration of the last update.\n"
                      "# TYPE graphswap:weight_update_last_seconds gauge\n"
                      "graphswap:weight_update_last_seconds %.6f\n",
                      (unsigned long long)w.hook_runs_target, (unsigned long long)w.hook_runs_draft,
                      (unsigned long long)w.updates_ok, (unsigned long long)w.updates_failed,
                      (unsigned long long)w.version_num, (int)w.state,
                      (unsigned long long)atomic_load(&s->w_sessions_timed_out), w.ms / 1e3);
    char *all = malloc(n + (size_t)en + 1);
    if (!all) {
        free(txt);
        return srv_send_error(c, 500, NULL, "out of memory rendering metrics");
    }
    memcpy(all, txt, n);
    memcpy(all + n, extra, (size_t)en + 1);
    srv_send(c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, all, n + (size_t)en);
    free(all);
    free(txt);
    return 200;
}

/* Wraps p in the post-processor's ids (add_special_tokens on a rendered chat). */
static int add_specials(srv_state *s, srv_prompt *p, srv_err *e)
{
    const int32_t *pre = NULL, *suf = NULL;
    size_t npre = mdl_tok_special_ids(s->tok, 0, &pre), nsuf = mdl_tok_special_ids(s->tok, 1, &suf);
    if (npre + nsuf == 0) return 0;
    int32_t *ids = malloc(((size_t)p->n + npre + nsuf) * sizeof *ids);
    if (!ids) return srv_errf(e, 500, NULL, "out of memory");
    memcpy(ids, pre, npre * sizeof *ids);
    if (p->n) memcpy(ids + npre, p->ids, (size_t)p->n * sizeof *ids);
    memcpy(ids + npre + (size_t)p->n, suf, nsuf * sizeof *ids);
    free(p->ids);
    p->ids = ids;
    p->n += (int)(npre + nsuf);
    return 0;
}

/* {"prompt": str | [ids], "add_special_tokens": bool} or {"messages": [...], "add_generation_prompt": bool}
 * -> {"count", "max_model_len", "tokens", "token_strs"} */
int srv_route_tokenize(srv_state *s, struct mg_connection *c)
{
    srv_err e;
    cJSON *body = srv_read_json(&s->http, c, &e);
    if (!body) return srv_send_err(c, &e);
    srv_prompt p = {0};
    int rc = 0, add_special = 1, strs = 0;
    srv_chat_opts co;
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(body, "messages");
    const cJSON *v;
#define BOOL_FIELD(key, dst)                                                                                \
    if (rc == 0 && (v = cJSON_GetObjectItemCaseSensitive(body, key)) != NULL && !cJSON_IsNull(v)) {          \
        if (cJSON_IsBool(v)) dst = cJSON_IsTrue(v);                                                          \
        else rc = srv_errf(&e, 400, key, "%s must be a boolean", key);                                        \
    }
    BOOL_FIELD("add_special_tokens", add_special)
    BOOL_FIELD("return_token_strs", strs)
#undef BOOL_FIELD
    if (rc == 0) {
        if (messages && !cJSON_IsNull(messages)) {
            /* vLLM's TokenizeChatRequest: add_special_tokens defaults to false for messages (the
             * template carries bos); true adds the post-processor's ids on top, as vLLM does */
            const cJSON *as = cJSON_GetObjectItemCaseSensitive(body, "add_special_tokens");
            const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
            rc = srv_chat_opts_parse(body, &co, &e);
            if (rc == 0 && tools && !cJSON_IsNull(tools) && !(cJSON_IsArray(tools) && !tools->child))
                rc = srv_errf(&e, 400, "tools", "tools are not supported (the templates' tool blocks are not rendered)");
            if (rc == 0) rc = srv_chat_encode(s, messages, &co, &p, &e);
            if (rc == 0 && cJSON_IsTrue(as)) rc = add_specials(s, &p, &e);
        } else if (cJSON_IsString(prompt)) {
            rc = srv_parse_prompt_text(s, prompt->valuestring, strlen(prompt->valuestring), add_special, 1, &p,
                                       "prompt", &e);
        } else {
            rc = srv_errf(&e, 400, "prompt", "give prompt (a string) or messages (a list of chat messages)");
        }
    }
    cJSON_Delete(body);
    if (rc) return srv_send_err(c, &e);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "count", p.n);
    cJSON_AddNumberToObject(o, "max_model_len", s->max_model_len);
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; i < p.n; i++) cJSON_AddItemToArray(toks, cJSON_CreateNumber(p.ids[i]));
    if (strs) {
        cJSON *a = cJSON_AddArrayToObject(o, "token_strs");
        char raw[1024];
        for (int i = 0; i < p.n; i++) {
            size_t rn = 0;
            if (mdl_tok_piece(s->tok, p.ids[i], raw, sizeof raw, &rn) != 0 || rn > sizeof raw) rn = 0;
            cJSON_AddItemToArray(a, srv_json_bytes(raw, rn));
        }
    } else {
        cJSON_AddNullToObject(o, "token_strs");
    }
    free(p.ids);
    int st = srv_send_json(c, 200, o);
    cJSON_Delete(o);
    return st;
}

/* {"tokens": [ids]} -> {"prompt": text} */
int srv_route_detokenize(srv_state *s, struct mg_connection *c)
{
    srv_err e;
    cJSON *body = srv_read_json(&s->http, c, &e);
    if (!body) return srv_send_err(c, &e);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(body, "tokens");
    int n = cJSON_GetArraySize(t);
    int32_t *ids = NULL;
    int rc = 0;
    if (!s->tok) rc = srv_errf(&e, 400, "tokens", "this model has no tokenizer");
    else if (!cJSON_IsArray(t)) rc = srv_errf(&e, 400, "tokens", "tokens must be a list of token ids");
    else if (n > 0 && !(ids = malloc((size_t)n * sizeof *ids))) rc = srv_errf(&e, 500, NULL, "out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(t, i);
        int32_t lim = mdl_tok_vocab_size(s->tok) > s->vocab ? mdl_tok_vocab_size(s->tok) : s->vocab;
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || !(x->valuedouble >= 0) ||
            !(x->valuedouble < lim))
            rc = srv_errf(&e, 400, "tokens", "tokens[%d] is not a token id in [0, %d)", i, (int)lim);
        else
            ids[i] = (int32_t)x->valuedouble;
    }
    cJSON_Delete(body);
    size_t len = 0;
    char *text = NULL;
    if (rc == 0 && !(text = n ? srv_decode(s, ids, n, 0, &len) : strdup("")))
        rc = srv_errf(&e, 400, "tokens", "tokens could not be decoded (an id outside the tokenizer vocabulary)");
    free(ids);
    if (rc) return srv_send_err(c, &e);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "prompt", srv_json_bytes(text, len));
    free(text);
    int st = srv_send_json(c, 200, o);
    cJSON_Delete(o);
    return st;
}
