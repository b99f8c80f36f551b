/* server/oai_parse.c — OpenAI request bodies (untrusted JSON) -> srv_gen, with every check a client
 * can fail: types, ranges, prompt shapes, token ids, context length, KV capacity. Every error names
 * the offending field in both the message and "param".
 *
 * Semantics follow vLLM where the two differ from OpenAI: unknown fields are ignored; null means
 * "not given"; top_k -1 or 0 disables it; chat max_tokens defaults to the remaining context (clamped
 * to what the KV cache can hold); seeded n > 1 uses seed + i for sample i. Fields that would change
 * the output and that graphswap does not implement (length_penalty, best_of, beam search, suffix,
 * tools) are refused instead of silently ignored. presence / frequency / repetition penalties and
 * logit_bias are vLLM's (ranges of SamplingParams, logit_bias keys token ids as strings, values
 * clamped to [-100, 100]); they act in the engine's sample op.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/srv.h"

/* The field, or NULL when absent or JSON null. */
static const cJSON *field(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int get_bool(const cJSON *o, const char *key, int *out, srv_err *e)
{
    const cJSON *v = field(o, key);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return srv_errf(e, 400, key, "%s must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Integral number in [lo, hi]; *set = 1 when given. */
static int get_int(const cJSON *o, const char *key, double lo, double hi, double *out, int *set, srv_err *e)
{
    const cJSON *v = field(o, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return srv_errf(e, 400, key, "%s must be an integer", key);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return srv_errf(e, 400, key, "%s must be in [%.0f, %.0f], got %.17g", key, lo, hi, v->valuedouble);
    *out = v->valuedouble;
    if (set) *set = 1;
    return 0;
}

/* Number in [lo, hi] (lo excluded when lo_open). */
static int get_num(const cJSON *o, const char *key, double lo, double hi, int lo_open, float *out, srv_err *e)
{
    const cJSON *v = field(o, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return srv_errf(e, 400, key, "%s must be a number", key);
    double x = v->valuedouble;
    if (!((lo_open ? x > lo : x >= lo) && x <= hi))
        return srv_errf(e, 400, key, "%s must be in %s%g, %g], got %g", key, lo_open ? "(" : "[", lo, hi, x);
    *out = (float)x;
    return 0;
}

/* ---- prompts ---------------------------------------------------------------------------------------- */

static int ids_from_array(const srv_state *s, const cJSON *a, srv_prompt *out, const char *param, srv_err *e)
{
    int n = cJSON_GetArraySize(a);
    if (n < 1) return srv_errf(e, 400, param, "%s must not be empty", param);
    out->ids = malloc((size_t)n * sizeof *out->ids);
    if (!out->ids) return srv_errf(e, 500, NULL, "out of memory");
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || !(x->valuedouble >= 0) ||
            !(x->valuedouble < s->vocab)) {
            srv_errf(e, 400, param, "%s[%d] is not a token id in [0, %d)", param, i, s->vocab);
            free(out->ids);
            out->ids = NULL;
            return -1;
        }
        out->ids[i++] = (int32_t)x->valuedouble;
    }
    out->n = n;
    return 0;
}

int srv_parse_prompt_text(const srv_state *s, const char *text, size_t len, int add_special, srv_prompt *out,
                          const char *param, srv_err *e)
{
    out->ids = NULL;
    out->n = 0;
    if (!s->tok)
        return srv_errf(e, 400, param, "%s: this model has no tokenizer (tokenizer.json); send token ids", param);
    if (len == 0) return srv_errf(e, 400, param, "%s must not be empty", param);
    if (!srv_utf8_valid(text, len)) return srv_errf(e, 400, param, "%s is not valid UTF-8", param);
    char err[256];
    size_t n = 0;
    if (mdl_tok_encode(s->tok, text, len, 1, NULL, 0, &n, err, sizeof err) != 0)
        return srv_errf(e, 400, param, "%s: %s", param, err);
    int32_t bos = add_special ? mdl_tok_bos(s->tok) : -1;
    out->ids = malloc((n + 1) * sizeof *out->ids);
    if (!out->ids) return srv_errf(e, 500, NULL, "out of memory");
    size_t got = 0;
    if (mdl_tok_encode(s->tok, text, len, 1, out->ids + 1, n, &got, err, sizeof err) != 0 || got != n) {
        free(out->ids);
        out->ids = NULL;
        return srv_errf(e, 500, param, "tokenizing %s failed", param);
    }
    if (bos >= 0 && !(n > 0 && out->ids[1] == bos)) {
        out->ids[0] = bos;
        n++;
    } else {
        memmove(out->ids, out->ids + 1, n * sizeof *out->ids);
    }
    if (n == 0) {
        free(out->ids);
        out->ids = NULL;
        return srv_errf(e, 400, param, "%s encodes to no tokens", param);
    }
    for (size_t i = 0; i < n; i++)
        if (out->ids[i] < 0 || out->ids[i] >= s->vocab) {
            srv_errf(e, 400, param, "%s: token %d is outside the model vocabulary (%d)", param, out->ids[i], s->vocab);
            free(out->ids);
            out->ids = NULL;
            return -1;
        }
    out->n = (int)n;
    return 0;
}

/* prompt: string | int[] | string[] | int[][]. */
static int parse_prompts(const srv_state *s, const cJSON *p, int add_special, srv_gen *g, srv_err *e)
{
    if (!p) return srv_errf(e, 400, "prompt", "prompt is required");
    if (cJSON_IsString(p)) {
        g->prompts = calloc(1, sizeof *g->prompts);
        if (!g->prompts) return srv_errf(e, 500, NULL, "out of memory");
        g->n_prompts = 1;
        return srv_parse_prompt_text(s, p->valuestring, strlen(p->valuestring), add_special, &g->prompts[0],
                                     "prompt", e);
    }
    if (!cJSON_IsArray(p))
        return srv_errf(e, 400, "prompt", "prompt must be a string, a list of token ids, a list of strings or a "
                                          "list of token-id lists");
    int n = cJSON_GetArraySize(p);
    if (n < 1) return srv_errf(e, 400, "prompt", "prompt must not be empty");
    const cJSON *first = p->child;
    if (cJSON_IsNumber(first)) {
        g->prompts = calloc(1, sizeof *g->prompts);
        if (!g->prompts) return srv_errf(e, 500, NULL, "out of memory");
        g->n_prompts = 1;
        return ids_from_array(s, p, &g->prompts[0], "prompt", e);
    }
    if (!cJSON_IsString(first) && !cJSON_IsArray(first))
        return srv_errf(e, 400, "prompt", "prompt[0] must be a token id, a string or a list of token ids");
    if (n > s->max_choices)
        return srv_errf(e, 400, "prompt", "at most %d prompts per request, got %d", s->max_choices, n);
    g->prompts = calloc((size_t)n, sizeof *g->prompts);
    if (!g->prompts) return srv_errf(e, 500, NULL, "out of memory");
    g->n_prompts = n;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, p)
    {
        char name[32];
        snprintf(name, sizeof name, "prompt[%d]", i);
        if (cJSON_IsString(first) != cJSON_IsString(x) || cJSON_IsArray(first) != cJSON_IsArray(x))
            return srv_errf(e, 400, "prompt", "%s: a prompt list must hold only strings or only token-id lists", name);
        int rc = cJSON_IsString(x)
                     ? srv_parse_prompt_text(s, x->valuestring, strlen(x->valuestring), add_special, &g->prompts[i],
                                             name, e)
                     : ids_from_array(s, x, &g->prompts[i], name, e);
        if (rc) {
            snprintf(e->param, sizeof e->param, "prompt");
            return -1;
        }
        i++;
    }
    return 0;
}

/* ---- chat ------------------------------------------------------------------------------------------- */

static void sb_str(srv_buf *b, const char *s) { srv_buf_add(b, s, strlen(s)); }

/* The text of a message's content: a string, or a list of {"type":"text","text":...} parts
 * (concatenated). Appends to b. */
static int content_text(const cJSON *content, int idx, int may_be_null, srv_buf *b, srv_err *e)
{
    if (!content || cJSON_IsNull(content)) {
        if (may_be_null) return 0;
        return srv_errf(e, 400, "messages", "messages[%d].content is required", idx);
    }
    if (cJSON_IsString(content)) {
        sb_str(b, content->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(content))
        return srv_errf(e, 400, "messages", "messages[%d].content must be a string or a list of text parts", idx);
    int k = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type))
            return srv_errf(e, 400, "messages", "messages[%d].content[%d] must be an object with a \"type\"", idx, k);
        if (strcmp(type->valuestring, "text") != 0)
            return srv_errf(e, 400, "messages", "messages[%d].content[%d]: content type \"%s\" is not supported "
                                                "(only \"text\")", idx, k, type->valuestring);
        if (!cJSON_IsString(text))
            return srv_errf(e, 400, "messages", "messages[%d].content[%d].text must be a string", idx, k);
        sb_str(b, text->valuestring);
        k++;
    }
    return 0;
}

/* Trims ASCII whitespace on both sides of b[from..) in place (Llama-3's template trims content). */
static void sb_trim_from(srv_buf *b, size_t from)
{
    if (b->oom || !b->p) return;
    size_t a = from, z = b->n;
    while (a < z && strchr(" \t\r\n", b->p[a])) a++;
    while (z > a && strchr(" \t\r\n", b->p[z - 1])) z--;
    memmove(b->p + from, b->p + a, z - a);
    b->n = from + (z - a);
    b->p[b->n] = 0;
}

int srv_chat_encode(const srv_state *s, const cJSON *messages, int add_generation_prompt, srv_prompt *out,
                    srv_err *e)
{
    out->ids = NULL;
    out->n = 0;
    if (!s->tok) return srv_errf(e, 400, "messages", "this model has no tokenizer, so it cannot serve chat");
    if (s->chat == MDL_CHAT_NONE)
        return srv_errf(e, 400, "messages", "this model has no chat template (tokenizer_config.json chat_template "
                                            "of a known family); use /v1/completions");
    if (!messages) return srv_errf(e, 400, "messages", "messages is required");
    if (!cJSON_IsArray(messages)) return srv_errf(e, 400, "messages", "messages must be a list of message objects");
    if (cJSON_GetArraySize(messages) < 1) return srv_errf(e, 400, "messages", "messages must not be empty");
    srv_buf b = {0};
    if (s->chat == MDL_CHAT_LLAMA3) sb_str(&b, "<|begin_of_text|>");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            free(b.p);
            return srv_errf(e, 400, "messages", "messages[%d] must be an object with a string \"role\"", i);
        }
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer")) {
            free(b.p);
            return srv_errf(e, 400, "messages", "messages[%d].role \"%s\" is not supported (system, developer, "
                                                "user, assistant)", i, r);
        }
        if (strcmp(r, "developer") == 0) r = "system";
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        int rc;
        if (s->chat == MDL_CHAT_CHATML) {
            /* <|im_start|>role\ncontent<|im_end|>\n */
            sb_str(&b, "<|im_start|>");
            sb_str(&b, r);
            sb_str(&b, "\n");
            rc = content_text(content, i, strcmp(r, "assistant") == 0, &b, e);
            sb_str(&b, "<|im_end|>\n");
        } else {
            /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> (content trimmed) */
            sb_str(&b, "<|start_header_id|>");
            sb_str(&b, r);
            sb_str(&b, "<|end_header_id|>\n\n");
            size_t at = b.n;
            rc = content_text(content, i, strcmp(r, "assistant") == 0, &b, e);
            sb_trim_from(&b, at);
            sb_str(&b, "<|eot_id|>");
        }
        if (rc) {
            free(b.p);
            return -1;
        }
        i++;
    }
    if (add_generation_prompt)
        sb_str(&b, s->chat == MDL_CHAT_CHATML ? "<|im_start|>assistant\n" : "<|start_header_id|>assistant<|end_header_id|>\n\n");
    if (b.oom) {
        free(b.p);
        return srv_errf(e, 500, NULL, "out of memory");
    }
    /* the template already carries bos where the family wants one */
    int rc = srv_parse_prompt_text(s, b.p, b.n, 0, out, "messages", e);
    free(b.p);
    return rc;
}

/* ---- the request -------------------------------------------------------------------------------------- */

static int cmp_bias_id(const void *a, const void *b)
{
    const eng_logit_bias *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

int srv_parse_logit_bias(const cJSON *v, int vocab, eng_logit_bias **out, int *n_out, srv_err *e)
{
    *out = NULL;
    *n_out = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsObject(v))
        return srv_errf(e, 400, "logit_bias", "logit_bias must be an object mapping token ids (strings) to biases");
    const int n = cJSON_GetArraySize(v);
    if (n == 0) return 0;
    if (n > ENG_MAX_LOGIT_BIAS)
        return srv_errf(e, 400, "logit_bias", "logit_bias may hold at most %d entries, got %d", ENG_MAX_LOGIT_BIAS, n);
    eng_logit_bias *b = malloc((size_t)n * sizeof *b);
    if (!b) return srv_errf(e, 500, NULL, "out of memory");
    int k = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, v)
    {
        const char *key = x->string;
        long long id = 0;
        int digits = 0;
        for (const char *c = key; c && *c; c++, digits++) {
            if (*c < '0' || *c > '9' || digits >= 12) {
                digits = -1;
                break;
            }
            id = id * 10 + (*c - '0');
        }
        if (digits <= 0) {
            free(b);
            return srv_errf(e, 400, "logit_bias", "logit_bias keys must be token ids as decimal strings, got \"%.40s\"",
                            key ? key : "");
        }
        if (id >= vocab) {
            free(b);
            return srv_errf(e, 400, "logit_bias", "logit_bias key %lld is not a token id in [0, %d)", id, vocab);
        }
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) {
            free(b);
            return srv_errf(e, 400, "logit_bias", "logit_bias value for token %lld must be a number", id);
        }
        const double bias = x->valuedouble < -100 ? -100 : x->valuedouble > 100 ? 100 : x->valuedouble; /* vLLM */
        b[k].id = (int32_t)id;
        b[k].bias = (float)bias;
        k++;
    }
    /* a repeated id ("5", "05") keeps its last value, as a Python dict does; then ascending ids */
    int m = 0;
    for (int i = 0; i < k; i++) {
        int later = 0;
        for (int j = i + 1; j < k && !later; j++) later = b[j].id == b[i].id;
        if (!later) b[m++] = b[i];
    }
    qsort(b, (size_t)m, sizeof *b, cmp_bias_id);
    *out = b;
    *n_out = m;
    return 0;
}

void srv_gen_free(srv_gen *g)
{
    free((void *)g->sp.logit_bias);
    for (int i = 0; i < g->n_prompts; i++) free(g->prompts[i].ids);
    free(g->prompts);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop_ids);
    memset(g, 0, sizeof *g);
}

static int parse_stop(const cJSON *body, srv_gen *g, srv_err *e)
{
    const cJSON *v = field(body, "stop");
    if (!v) return 0;
    const cJSON *one = cJSON_IsString(v) ? v : NULL;
    if (!one && !cJSON_IsArray(v)) return srv_errf(e, 400, "stop", "stop must be a string or a list of strings");
    int n = one ? 1 : cJSON_GetArraySize(v);
    if (n > SRV_MAX_STOP) return srv_errf(e, 400, "stop", "at most %d stop strings, got %d", SRV_MAX_STOP, n);
    const cJSON *x = one ? one : v->child;
    for (int i = 0; i < n; i++, x = x->next) {
        if (!cJSON_IsString(x)) return srv_errf(e, 400, "stop", "stop[%d] must be a string", i);
        size_t len = strlen(x->valuestring);
        if (len == 0) return srv_errf(e, 400, "stop", "stop[%d] must not be empty", i);
        if (len > SRV_MAX_STOP_BYTES)
            return srv_errf(e, 400, "stop", "stop[%d] is longer than %d bytes", i, SRV_MAX_STOP_BYTES);
        if (!srv_utf8_valid(x->valuestring, len)) return srv_errf(e, 400, "stop", "stop[%d] is not valid UTF-8", i);
        g->stop[g->n_stop] = strdup(x->valuestring);
        if (!g->stop[g->n_stop]) return srv_errf(e, 500, NULL, "out of memory");
        g->stop_len[g->n_stop++] = len;
        if (len > g->max_stop_len) g->max_stop_len = len;
    }
    return 0;
}

static int parse_stop_ids(const srv_state *s, const cJSON *body, srv_gen *g, srv_err *e)
{
    const cJSON *v = field(body, "stop_token_ids");
    if (!v) return 0;
    if (!cJSON_IsArray(v)) return srv_errf(e, 400, "stop_token_ids", "stop_token_ids must be a list of token ids");
    int n = cJSON_GetArraySize(v);
    if (n > 64) return srv_errf(e, 400, "stop_token_ids", "at most 64 stop_token_ids, got %d", n);
    if (n == 0) return 0;
    g->stop_ids = malloc((size_t)n * sizeof *g->stop_ids);
    if (!g->stop_ids) return srv_errf(e, 500, NULL, "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, v)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || !(x->valuedouble >= 0) ||
            !(x->valuedouble < s->vocab))
            return srv_errf(e, 400, "stop_token_ids", "stop_token_ids[%d] is not a token id in [0, %d)", g->n_stop_ids,
                            s->vocab);
        g->stop_ids[g->n_stop_ids++] = (int32_t)x->valuedouble;
    }
    return 0;
}

/* Fields that change the output but are not implemented: refused unless given at their neutral value. */
static int refuse_unsupported(const cJSON *body, const srv_gen *g, srv_err *e)
{
    static const struct {
        const char *key;
        double neutral;
    } nums[] = {{"length_penalty", 1}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        const cJSON *v = field(body, nums[i].key);
        if (v && !(cJSON_IsNumber(v) && v->valuedouble == nums[i].neutral))
            return srv_errf(e, 400, nums[i].key, "%s is not supported (only %g)", nums[i].key, nums[i].neutral);
    }
    const cJSON *v = field(body, "best_of");
    if (v && !(cJSON_IsNumber(v) && (v->valuedouble == 1 || v->valuedouble == g->n)))
        return srv_errf(e, 400, "best_of", "best_of is not supported (only best_of == n)");
    v = field(body, "use_beam_search");
    if (v && cJSON_IsTrue(v)) return srv_errf(e, 400, "use_beam_search", "beam search is not supported");
    v = field(body, "suffix");
    if (v && !(cJSON_IsString(v) && !v->valuestring[0])) return srv_errf(e, 400, "suffix", "suffix is not supported");
    v = field(body, "tools");
    if (v && !(cJSON_IsArray(v) && !v->child)) return srv_errf(e, 400, "tools", "tools are not supported");
    /* constrained decoding is not built: answering unconstrained text to a client that asked for
     * JSON would be a silent wrong answer */
    v = field(body, "response_format");
    if (v) {
        const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
        if (!cJSON_IsString(t))
            return srv_errf(e, 400, "response_format", "response_format must be an object with a \"type\"");
        if (strcmp(t->valuestring, "text") != 0)
            return srv_errf(e, 400, "response_format",
                            "response_format type \"%.64s\" is not supported (only \"text\": no constrained decoding)",
                            t->valuestring);
    }
    static const char *guided[] = {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                   "structured_outputs"};
    for (size_t i = 0; i < sizeof guided / sizeof guided[0]; i++)
        if (field(body, guided[i]))
            return srv_errf(e, 400, guided[i], "%s is not supported (no constrained decoding)", guided[i]);
    if (g->api == SRV_API_CHAT) {
        v = field(body, "echo");
        if (v && !cJSON_IsBool(v)) return srv_errf(e, 400, "echo", "echo must be a boolean");
        if (v && cJSON_IsTrue(v))
            return srv_errf(e, 400, "echo", "echo is not supported on chat completions (use /v1/completions)");
        v = field(body, "chat_template");
        if (v && !cJSON_IsString(v)) return srv_errf(e, 400, "chat_template", "chat_template must be a string");
        if (v)
            return srv_errf(e, 400, "chat_template",
                            "a request's own chat_template is not supported (the model's built-in template is used)");
    }
    return 0;
}

int srv_parse_gen(const srv_state *s, const cJSON *body, srv_api api, srv_gen *g, srv_err *e)
{
    memset(g, 0, sizeof *g);
    g->api = api;
    g->n = 1;
    g->skip_special = 1;
    g->sp.top_p = 1.0f;
    const int chat = api == SRV_API_CHAT;
    double v = 0;
    int set = 0, max_set = 0;

    const cJSON *model = field(body, "model");
    if (model && !cJSON_IsString(model)) return srv_errf(e, 400, "model", "model must be a string");
    /* vLLM: a name other than the served one is 404 NotFoundError (absent: the served model) */
    if (model && strcmp(model->valuestring, s->model_name) != 0) {
        srv_errf(e, 404, "model", "The model `%.200s` does not exist (this server serves `%.200s`).",
                 model->valuestring, s->model_name);
        e->type = "NotFoundError";
        return -1;
    }

    if (get_int(body, "n", 1, SRV_MAX_N, &v, NULL, e)) return -1;
    if (field(body, "n")) g->n = (int)v;
    if (refuse_unsupported(body, g, e)) return -1;

    /* prompt(s) */
    int add_special = 1, add_gen = 1;
    if (get_bool(body, "add_special_tokens", &add_special, e)) return -1;
    if (chat) {
        if (get_bool(body, "add_generation_prompt", &add_gen, e)) return -1;
        g->prompts = calloc(1, sizeof *g->prompts);
        if (!g->prompts) return srv_errf(e, 500, NULL, "out of memory");
        g->n_prompts = 1;
        if (srv_chat_encode(s, field(body, "messages"), add_gen, &g->prompts[0], e)) return -1;
    } else if (parse_prompts(s, field(body, "prompt"), add_special, g, e))
        return -1;
    if (g->n_prompts * g->n > s->max_choices)
        return srv_errf(e, 400, "n", "%d prompts x n %d = %d sequences exceed the limit of %d per request",
                        g->n_prompts, g->n, g->n_prompts * g->n, s->max_choices);
    int longest = 0;
    for (int i = 0; i < g->n_prompts; i++)
        if (g->prompts[i].n > longest) longest = g->prompts[i].n;

    /* lengths */
    const char *mt_key = "max_tokens";
    if (chat && field(body, "max_completion_tokens")) mt_key = "max_completion_tokens";
    if (get_int(body, mt_key, 1, 1 << 30, &v, &max_set, e)) return -1;
    if (max_set) g->max_tokens = (int)v;
    else if (!chat) g->max_tokens = 16;
    else { /* vLLM: the rest of the context; here also what the KV cache can hold for one sequence */
        int room = s->max_model_len < s->kv_tokens ? s->max_model_len : s->kv_tokens;
        g->max_tokens = room - longest;
        if (g->max_tokens < 1) g->max_tokens = 1; /* reported as too long below */
    }
    for (int i = 0; i < g->n_prompts; i++) {
        long total = (long)g->prompts[i].n + g->max_tokens;
        const char *what = chat ? "messages" : "prompt";
        /* the field to blame: the prompt when it leaves no room for a single token, else an explicit
         * max_tokens, else the prompt (the default max_tokens follows from it) */
        const char *blame = g->prompts[i].n >= s->max_model_len || g->prompts[i].n >= s->kv_tokens || !max_set
                                ? what
                                : mt_key;
        if (total > s->max_model_len)
            return srv_errf(e, 400, blame,
                            "This model's maximum context length is %d tokens. However, you requested %ld tokens "
                            "(%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
                            s->max_model_len, total, g->prompts[i].n, chat ? "messages" : "prompt", g->max_tokens,
                            chat ? "messages" : "prompt");
        if (total > s->kv_tokens)
            return srv_errf(e, 400, blame,
                            "the request needs %ld tokens of KV cache (%d prompt + %d max_tokens) but the cache "
                            "holds %d tokens", total, g->prompts[i].n, g->max_tokens, s->kv_tokens);
    }
    if (get_int(body, "min_tokens", 0, 1 << 30, &v, &set, e)) return -1;
    if (set) {
        if (v > g->max_tokens)
            return srv_errf(e, 400, "min_tokens", "min_tokens (%.0f) must not exceed max_tokens (%d)", v, g->max_tokens);
        g->min_tokens = (int)v;
    }

    /* sampling */
    if (get_num(body, "temperature", 0, 100, 0, &g->sp.temperature, e)) return -1;
    if (!field(body, "temperature")) g->sp.temperature = 1.0f; /* the OpenAI default */
    if (get_num(body, "top_p", 0, 1, 1, &g->sp.top_p, e)) return -1;
    if (get_int(body, "top_k", -1, 1 << 30, &v, &set, e)) return -1;
    g->sp.top_k = set && v > 0 ? (int)v : 0;
    set = 0;
    if (get_num(body, "min_p", 0, 1, 0, &g->sp.min_p, e)) return -1;
    /* vLLM's penalties (SamplingParams._verify_args ranges) and logit_bias */
    if (get_num(body, "presence_penalty", -2, 2, 0, &g->sp.presence_penalty, e)) return -1;
    if (get_num(body, "frequency_penalty", -2, 2, 0, &g->sp.frequency_penalty, e)) return -1;
    g->sp.repetition_penalty = 1.0f;
    if (get_num(body, "repetition_penalty", 0, 1e30, 1, &g->sp.repetition_penalty, e)) return -1;
    {
        eng_logit_bias *lb;
        if (srv_parse_logit_bias(field(body, "logit_bias"), s->vocab, &lb, &g->sp.n_logit_bias, e)) return -1;
        g->sp.logit_bias = lb;
    }
    if (get_int(body, "seed", -9223372036854775808.0, 18446744073709551615.0, &v, &g->seed_set, e)) return -1;
    if (g->seed_set) g->sp.seed = v < 0 ? (uint64_t)(int64_t)v : (v >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)v);

    /* stop conditions */
    if (parse_stop(body, g, e) || parse_stop_ids(s, body, g, e)) return -1;
    if (get_bool(body, "ignore_eos", &g->ignore_eos, e)) return -1;
    if (get_bool(body, "include_stop_str_in_output", &g->include_stop, e)) return -1;

    /* output shape */
    if (chat) {
        if (get_bool(body, "logprobs", &g->logprobs, e)) return -1;
        if (get_int(body, "top_logprobs", 0, ENG_MAX_LOGPROBS, &v, &set, e)) return -1;
        if (set) {
            if (!g->logprobs && v > 0)
                return srv_errf(e, 400, "top_logprobs", "top_logprobs requires logprobs to be true");
            g->sp.logprobs = (int)v;
        }
    } else {
        const cJSON *lp = field(body, "logprobs");
        if (lp && cJSON_IsBool(lp))
            return srv_errf(e, 400, "logprobs", "logprobs must be an integer in [0, %d] for completions",
                            ENG_MAX_LOGPROBS);
        if (get_int(body, "logprobs", 0, ENG_MAX_LOGPROBS, &v, &set, e)) return -1;
        if (set) {
            g->logprobs = 1;
            g->sp.logprobs = (int)v;
        }
        if (get_bool(body, "echo", &g->echo, e)) return -1;
    }
    /* vLLM's prompt_logprobs: the prompt tokens' logprobs with this many alternatives (null: none) */
    g->prompt_logprobs = -1;
    const cJSON *plp = field(body, "prompt_logprobs");
    if (plp && !cJSON_IsNull(plp)) {
        if (get_int(body, "prompt_logprobs", 0, ENG_MAX_LOGPROBS, &v, NULL, e)) return -1;
        g->prompt_logprobs = (int)v;
    }
    if (get_bool(body, "skip_special_tokens", &g->skip_special, e) ||
        get_bool(body, "return_token_ids", &g->return_token_ids, e) ||
        get_bool(body, "return_tokens_as_token_ids", &g->tokens_as_ids, e) || get_bool(body, "stream", &g->stream, e))
        return -1;
    const cJSON *so = field(body, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return srv_errf(e, 400, "stream_options", "stream_options must be an object");
        const cJSON *iu = field(so, "include_usage");
        if (iu && !cJSON_IsBool(iu))
            return srv_errf(e, 400, "stream_options", "stream_options.include_usage must be a boolean");
        g->include_usage = iu && cJSON_IsTrue(iu);
    }
    const cJSON *user = field(body, "user");
    if (user && !cJSON_IsString(user)) return srv_errf(e, 400, "user", "user must be a string");
    return 0;
}
