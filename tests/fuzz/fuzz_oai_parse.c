/* tests/fuzz/fuzz_oai_parse.c — libFuzzer harness for the OpenAI request parsers: srv_parse_gen
 * (/v1/completions and /v1/chat/completions, the chat template included) over the body parse the
 * server does (srv_parse_json_object, as srv_read_json), on a civetweb-sized stack.
 *
 * Input: byte 0 picks the API (bit 0: chat) and the tokenizer (bits 1-2); the rest is the body.
 * Properties beyond "no crash" (a successful parse is what the engine is then given):
 *   every prompt is non-empty with ids in [0, vocab); 1 <= n <= SRV_MAX_N; prompts x n within
 *   max_choices; max_tokens >= 1 and prompt + max_tokens within max_model_len and the KV cache;
 *   min_tokens <= max_tokens; stop strings non-empty, bounded, counted; sampling values in range.
 *   A refusal is a 4xx/5xx naming itself, and its error JSON (what the client gets) is valid:
 *   it prints and parses back with a UTF-8 message.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/format/json_guard.h"
#include "server/core/srv.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static srv_state g_state[FZ_TOK_COUNT];

static const srv_state *state_for(int which)
{
    srv_state *s = &g_state[which];
    if (!s->tok) {
        s->tok = fz_tokenizer(which);
        s->chat = mdl_tok_chat_family(s->tok);
        s->vocab = mdl_tok_vocab_size(s->tok);
        s->max_model_len = 512;
        s->model_name = "m"; /* as serve sets it (--served-model-name); the corpus names it */
        s->kv_tokens = 384; /* smaller than the context: both limits are reachable */
        s->max_choices = 32;
        s->http.max_body = 1 << 20;
        s->n_eos = 1;
        s->eos[0] = mdl_tok_eos(s->tok);
    }
    return s;
}

typedef struct {
    const srv_state *s;
    const char *body;
    size_t len;
    srv_api api;
} job;

static void check_ok(const srv_state *s, const srv_gen *g)
{
    FZ_CHECK(g->n_prompts >= 1 && g->prompts);
    FZ_CHECK(g->n >= 1 && g->n <= SRV_MAX_N && g->n_prompts * g->n <= s->max_choices);
    FZ_CHECK(g->max_tokens >= 1 && g->min_tokens >= 0 && g->min_tokens <= g->max_tokens);
    for (int i = 0; i < g->n_prompts; i++) {
        const srv_prompt *p = &g->prompts[i];
        FZ_CHECK(p->n >= 1 && p->ids);
        FZ_CHECK((long)p->n + g->max_tokens <= s->max_model_len && (long)p->n + g->max_tokens <= s->kv_tokens);
        for (int k = 0; k < p->n; k++) FZ_CHECK(p->ids[k] >= 0 && p->ids[k] < s->vocab);
    }
    FZ_CHECK(g->n_stop >= 0 && g->n_stop <= SRV_MAX_STOP);
    size_t mx = 0;
    for (int i = 0; i < g->n_stop; i++) {
        FZ_CHECK(g->stop[i] && g->stop_len[i] == strlen(g->stop[i]));
        FZ_CHECK(g->stop_len[i] >= 1 && g->stop_len[i] <= SRV_MAX_STOP_BYTES);
        if (g->stop_len[i] > mx) mx = g->stop_len[i];
    }
    FZ_CHECK(mx == g->max_stop_len);
    FZ_CHECK(g->n_stop_ids >= 0 && g->n_stop_ids <= 64);
    for (int i = 0; i < g->n_stop_ids; i++) FZ_CHECK(g->stop_ids[i] >= 0 && g->stop_ids[i] < s->vocab);
    FZ_CHECK(isfinite(g->sp.temperature) && g->sp.temperature >= 0 && g->sp.temperature <= 100);
    FZ_CHECK(g->sp.top_p > 0 && g->sp.top_p <= 1);
    FZ_CHECK(g->sp.min_p >= 0 && g->sp.min_p <= 1);
    FZ_CHECK(g->sp.top_k >= 0);
    FZ_CHECK(g->sp.logprobs >= 0 && g->sp.logprobs <= ENG_MAX_LOGPROBS);
    FZ_CHECK(g->prompt_logprobs >= -1 && g->prompt_logprobs <= ENG_MAX_LOGPROBS);
}

static void check_err(const srv_err *e)
{
    FZ_CHECK(e->status >= 400 && e->status <= 599 && e->msg[0] != '\0');
    cJSON *o = srv_err_json(e);
    FZ_CHECK(o);
    char *txt = cJSON_PrintUnformatted(o);
    FZ_CHECK(txt);
    cJSON *back = mdl_json_parse(txt, strlen(txt), MDL_JSON_MAX_DEPTH, MDL_JSON_WHOLE | MDL_JSON_OBJECT, NULL, NULL, 0);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(back, "error"), "message");
    FZ_CHECK(cJSON_IsString(m) && srv_utf8_valid(m->valuestring, strlen(m->valuestring)));
    cJSON_Delete(back);
    free(txt);
    cJSON_Delete(o);
}

static void *run(void *arg)
{
    job *j = arg;
    srv_err e;
    memset(&e, 0, sizeof e);
    /* as srv_read_json: the depth / NUL pre-check, then cJSON, one object */
    cJSON *body = srv_parse_json_object(j->body, j->len, &e);
    if (!body) {
        check_err(&e);
        return NULL;
    }
    srv_gen g;
    if (srv_parse_gen(j->s, body, j->api, &g, &e) == 0) check_ok(j->s, &g);
    else check_err(&e);
    srv_gen_free(&g);
    cJSON_Delete(body);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    job j = {state_for(((data[0] >> 1) & 3) % FZ_TOK_COUNT), (const char *)data + 1, size - 1,
             (data[0] & 1) ? SRV_API_CHAT : SRV_API_COMPLETIONS};
    fz_small_stack(run, &j);
    return 0;
}
