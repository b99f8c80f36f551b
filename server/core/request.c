/* server/core/request.c — OpenAI request bodies (untrusted JSON) -> srv_gen, with every check a client
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

#include "server/core/srv.h"

const cJSON *srv_field(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int get_bool(const cJSON *o, const char *key, int *out, srv_err *e)
{
    const cJSON *v = srv_field(o, key);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return srv_errf(e, 400, key, "%s must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Integral number in [lo, hi]; *set = 1 when given. */
static int get_int(const cJSON *o, const char *key, double lo, double hi, double *out, int *set, srv_err *e)
{
    const cJSON *v = srv_field(o, key);
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
    const cJSON *v = srv_field(o, key);
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

int srv_parse_prompt_text(const srv_state *s, const char *text, size_t len, int add_special, int allow_empty,
                          srv_prompt *out, const char *param, srv_err *e)
{
    out->ids = NULL;
    out->n = 0;
    if (!s->tok)
        return srv_errf(e, 400, param, "%s: this model has no tokenizer (tokenizer.json); send token ids", param);
    if (len == 0 && !allow_empty) return srv_errf(e, 400, param, "%s must not be empty", param);
    if (!srv_utf8_valid(text, len)) return srv_errf(e, 400, param, "%s is not valid UTF-8", param);
    char err[256];
    size_t n = 0;
    if (mdl_tok_encode(s->tok, text, len, 1, NULL, 0, &n, err, sizeof err) != 0)
        return srv_errf(e, 400, param, "%s: %s", param, err);
    /* add_special_tokens: what the post-processor adds around the text (HF: also around "") */
    const int32_t *pre = NULL, *suf = NULL;
    size_t npre = add_special ? mdl_tok_special_ids(s->tok, 0, &pre) : 0;
    size_t nsuf = add_special ? mdl_tok_special_ids(s->tok, 1, &suf) : 0;
    out->ids = malloc((npre + n + nsuf + 1) * sizeof *out->ids);
    if (!out->ids) return srv_errf(e, 500, NULL, "out of memory");
    size_t got = 0;
    if (mdl_tok_encode(s->tok, text, len, 1, out->ids + npre, n, &got, err, sizeof err) != 0 || got != n) {
        free(out->ids);
        out->ids = NULL;
        return srv_errf(e, 500, param, "tokenizing %s failed", param);
    }
    if (npre) memcpy(out->ids, pre, npre * sizeof *pre);
    if (nsuf) memcpy(out->ids + npre + n, suf, nsuf * sizeof *suf);
    n += npre + nsuf;
    if (n == 0 && !allow_empty) {
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
        return srv_parse_prompt_text(s, p->valuestring, strlen(p->valuestring), add_special, 0, &g->prompts[0],
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
                     ? srv_parse_prompt_text(s, x->valuestring, strlen(x->valuestring), add_special, 0,
                                             &g->prompts[i], name, e)
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
/* Built-in renderers, one per template family, that reproduce the published Jinja templates byte for
 * byte (tests/data/templates/ and tests/integration/test_chat_templates.py check them against jinja2
 * as transformers configures it: trim_blocks, lstrip_blocks, its own tojson). Message content is a
 * string or a list of text parts joined with "\n" (vLLM's "string" content format). */

static void sb_str(srv_buf *b, const char *s) { srv_buf_add(b, s, strlen(s)); }

/* Python str.isspace() for the code point at s (what Jinja's trim and str.strip() remove). */
static size_t py_space_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) return 0;
    if (u[0] < 0x80) return (u[0] >= 0x09 && u[0] <= 0x0D) || (u[0] >= 0x1C && u[0] <= 0x20) ? 1 : 0;
    uint32_t cp = 0;
    size_t l = u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    if (l > n) return 0;
    cp = l == 2 ? (uint32_t)(u[0] & 0x1F) : l == 3 ? (uint32_t)(u[0] & 0x0F) : (uint32_t)(u[0] & 0x07);
    for (size_t i = 1; i < l; i++) cp = (cp << 6) | (u[i] & 0x3F);
    int sp = cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
             cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
    return sp ? l : 0;
}

/* A byte range of valid UTF-8. */
typedef struct {
    const char *p;
    size_t n;
} span;

/* str.strip() (ws: Unicode whitespace) or str.strip('\n') (!ws), on the left and / or right. */
static span py_strip(span s, int left, int right, int ws)
{
    if (left)
        for (;;) {
            size_t k = ws ? py_space_at(s.p, s.n) : (s.n && s.p[0] == '\n');
            if (!k) break;
            s.p += k;
            s.n -= k;
        }
    if (right)
        while (s.n) {
            if (!ws) {
                if (s.p[s.n - 1] != '\n') break;
                s.n--;
                continue;
            }
            size_t at = s.n - 1;
            while (at > 0 && ((unsigned char)s.p[at] & 0xC0) == 0x80) at--;
            if (py_space_at(s.p + at, s.n - at) != s.n - at) break;
            s.n = at;
        }
    return s;
}

static const char *span_find(span s, const char *needle, int last)
{
    size_t k = strlen(needle);
    const char *hit = NULL;
    for (size_t i = 0; i + k <= s.n; i++)
        if (memcmp(s.p + i, needle, k) == 0) {
            hit = s.p + i;
            if (!last) break;
        }
    return hit;
}

static void sb_span(srv_buf *b, span s) { srv_buf_add(b, s.p, s.n); }

/* Python json.dumps(s, ensure_ascii=False) of a string (transformers' tojson filter). */
static void sb_py_json_str(srv_buf *b, span s)
{
    sb_str(b, "\"");
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        char esc[8];
        switch (c) {
        case '"': sb_str(b, "\\\""); break;
        case '\\': sb_str(b, "\\\\"); break;
        case '\n': sb_str(b, "\\n"); break;
        case '\r': sb_str(b, "\\r"); break;
        case '\t': sb_str(b, "\\t"); break;
        case '\b': sb_str(b, "\\b"); break;
        case '\f': sb_str(b, "\\f"); break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                sb_str(b, esc);
            } else {
                srv_buf_add(b, s.p + i, 1);
            }
        }
    }
    sb_str(b, "\"");
}

/* Python's repr(float) (what json.dumps writes): the shortest digits that round-trip, fixed notation
 * for 1e-4 <= |x| < 1e16 (with ".0" when integral), else d.ddde+XX. */
static void sb_py_float(srv_buf *b, double x)
{
    if (x != x) {
        sb_str(b, "NaN");
        return;
    }
    if (x > 1.7976931348623157e308 || x < -1.7976931348623157e308) {
        sb_str(b, x > 0 ? "Infinity" : "-Infinity");
        return;
    }
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e: [-]d[.ddd]e(+|-)XX */
    const char *q = e;
    int neg = *q == '-';
    if (neg) q++;
    char dig[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    int ex = atoi(q + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (neg) sb_str(b, "-");
    if (x == 0 || (ex >= -4 && ex < 16)) {
        if (x == 0) ex = 0;
        if (ex < 0) {
            sb_str(b, "0.");
            for (int i = 0; i < -ex - 1; i++) sb_str(b, "0");
            srv_buf_add(b, dig, (size_t)nd);
        } else {
            for (int i = 0; i <= ex; i++) srv_buf_add(b, i < nd ? &dig[i] : "0", 1);
            sb_str(b, ".");
            if (nd > ex + 1) srv_buf_add(b, dig + ex + 1, (size_t)(nd - ex - 1));
            else sb_str(b, "0");
        }
        return;
    }
    srv_buf_add(b, dig, 1);
    if (nd > 1) {
        sb_str(b, ".");
        srv_buf_add(b, dig + 1, (size_t)(nd - 1));
    }
    char xs[16];
    snprintf(xs, sizeof xs, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    sb_str(b, xs);
}

static int hex4(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (unsigned)d;
    }
    return 0;
}

/* json.dumps(json.loads(text), ensure_ascii=False): vLLM parses a tool call's arguments string
 * before the template writes it through tojson (vllm/entrypoints/chat_utils.py,
 * _postprocess_messages). Walks the JSON text itself (cJSON keeps no int / float distinction):
 * ", " and ": " separators, strings re-escaped as Python does, ints as written, floats as repr.
 * Returns the end of the value, or NULL when the text is not JSON. */
static const char *py_redump(srv_buf *b, const char *p, int depth)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (depth > 64) return NULL;
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        srv_buf_add(b, p, 1);
        p++;
        for (int first = 1;; first = 0) {
            while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
            if (*p == close && first) break;
            if (!first) sb_str(b, ", ");
            if (close == '}') {
                while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
                if (*p != '"' || !(p = py_redump(b, p, depth + 1))) return NULL;
                while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
                if (*p++ != ':') return NULL;
                sb_str(b, ": ");
            }
            if (!(p = py_redump(b, p, depth + 1))) return NULL;
            while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
            if (*p == ',') {
                p++;
                continue;
            }
            if (*p != close) return NULL;
            break;
        }
        srv_buf_add(b, &close, 1);
        return p + 1;
    }
    if (*p == '"') {
        srv_buf raw = {0};
        for (p++; *p != '"'; p++) {
            if (!*p || (unsigned char)*p < 0x20) {
                free(raw.p);
                return NULL;
            }
            if (*p != '\\') {
                srv_buf_add(&raw, p, 1);
                continue;
            }
            p++;
            const char *m = strchr("\"\\/bfnrt", *p);
            if (m && *p) {
                static const char to[] = "\"\\/\b\f\n\r\t";
                srv_buf_add(&raw, &to[m - "\"\\/bfnrt"], 1);
                continue;
            }
            if (*p != 'u') {
                free(raw.p);
                return NULL;
            }
            unsigned cp = 0, lo = 0;
            if (hex4(p + 1, &cp)) {
                free(raw.p);
                return NULL;
            }
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && p[1] == '\\' && p[2] == 'u' && !hex4(p + 3, &lo) && lo >= 0xDC00 &&
                lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                free(raw.p); /* a lone surrogate cannot be written as UTF-8 */
                return NULL;
            }
            char u[4];
            size_t ul = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
            if (ul == 1) u[0] = (char)cp;
            else if (ul == 2) u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F));
            else if (ul == 3)
                u[0] = (char)(0xE0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[2] = (char)(0x80 | (cp & 0x3F));
            else
                u[0] = (char)(0xF0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
                u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F));
            srv_buf_add(&raw, u, ul);
        }
        if (raw.oom || !srv_utf8_valid(raw.p ? raw.p : "", raw.n) || (raw.n && memchr(raw.p, 0, raw.n))) {
            free(raw.p);
            return NULL;
        }
        sb_py_json_str(b, (span){raw.p ? raw.p : "", raw.n});
        free(raw.p);
        return p + 1;
    }
    static const char *lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++)
        if (strncmp(p, lits[i], strlen(lits[i])) == 0) {
            sb_str(b, lits[i]);
            return p + strlen(lits[i]);
        }
    /* a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
    const char *q = p;
    int is_float = 0;
    if (*q == '-') q++;
    if (*q == '0') q++;
    else if (*q >= '1' && *q <= '9')
        while (*q >= '0' && *q <= '9') q++;
    else
        return NULL;
    if (*q == '.') {
        is_float = 1;
        if (!(*++q >= '0' && *q <= '9')) return NULL;
        while (*q >= '0' && *q <= '9') q++;
    }
    if (*q == 'e' || *q == 'E') {
        is_float = 1;
        q++;
        if (*q == '+' || *q == '-') q++;
        if (!(*q >= '0' && *q <= '9')) return NULL;
        while (*q >= '0' && *q <= '9') q++;
    }
    if (is_float) {
        sb_py_float(b, strtod(p, NULL));
    } else if (q - p == 2 && p[0] == '-' && p[1] == '0') {
        sb_str(b, "0"); /* int("-0") */
    } else {
        srv_buf_add(b, p, (size_t)(q - p));
    }
    return q;
}

/* The rendering of one tool call's arguments as vLLM hands them to the template (a dict), or -1. */
static int py_args(srv_buf *b, const char *args)
{
    const char *end = py_redump(b, args, 0);
    if (!end) return -1;
    while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') end++;
    return *end ? -1 : 0;
}

typedef struct {
    const char *role;      /* developer is rendered as system */
    srv_buf text;          /* content as one string ("" for null) */
    const char *reasoning; /* reasoning_content when a string, else NULL */
    const cJSON *tool_calls; /* non-empty list, else NULL */
    int has_tool_calls;    /* the key is present and not null */
} chat_msg;

/* The text of a message's content: a string, or a list of {"type":"text","text":...} parts joined
 * with "\n". */
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
        if (k > 0) sb_str(b, "\n");
        sb_str(b, text->valuestring);
        k++;
    }
    return 0;
}

static void free_msgs(chat_msg *v, int n)
{
    for (int i = 0; i < n; i++) free(v[i].text.p);
    free(v);
}

static span msg_span(const chat_msg *m) { return (span){m->text.p ? m->text.p : "", m->text.n}; }

static int parse_msgs(const srv_state *s, const cJSON *messages, chat_msg **out, int *nout, srv_err *e)
{
    if (!messages) return srv_errf(e, 400, "messages", "messages is required");
    if (!cJSON_IsArray(messages)) return srv_errf(e, 400, "messages", "messages must be a list of message objects");
    int n = cJSON_GetArraySize(messages);
    if (n < 1) return srv_errf(e, 400, "messages", "messages must not be empty");
    chat_msg *v = calloc((size_t)n, sizeof *v);
    if (!v) return srv_errf(e, 500, NULL, "out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            free_msgs(v, n);
            return srv_errf(e, 400, "messages", "messages[%d] must be an object with a string \"role\"", i);
        }
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer") &&
            strcmp(r, "tool")) {
            free_msgs(v, n);
            return srv_errf(e, 400, "messages", "messages[%d].role \"%.64s\" is not supported (system, developer, "
                                                "user, assistant, tool)", i, r);
        }
        v[i].role = strcmp(r, "developer") == 0 ? "system" : r;
        const int assistant = strcmp(r, "assistant") == 0;
        if (content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), i, assistant, &v[i].text, e)) {
            free_msgs(v, n);
            return -1;
        }
        if (v[i].text.oom) {
            free_msgs(v, n);
            return srv_errf(e, 500, NULL, "out of memory");
        }
        const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        if (rc && !cJSON_IsNull(rc) && !cJSON_IsString(rc)) {
            free_msgs(v, n);
            return srv_errf(e, 400, "messages", "messages[%d].reasoning_content must be a string", i);
        }
        v[i].reasoning = cJSON_IsString(rc) ? rc->valuestring : NULL;
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (tc && !cJSON_IsNull(tc)) {
            v[i].has_tool_calls = 1;
            if (!assistant || !cJSON_IsArray(tc)) {
                free_msgs(v, n);
                return srv_errf(e, 400, "messages", "messages[%d].tool_calls must be a list on an assistant message",
                                i);
            }
            v[i].tool_calls = tc->child ? tc : NULL;
            int k = 0;
            const cJSON *c;
            cJSON_ArrayForEach(c, tc)
            {
                const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
                const cJSON *ar = cJSON_GetObjectItemCaseSensitive(f, "arguments");
                srv_buf probe = {0};
                int bad = !cJSON_IsObject(f) || !cJSON_IsString(nm) || !cJSON_IsString(ar);
                if (!bad && ar->valuestring[0] && py_args(&probe, ar->valuestring)) bad = 2;
                free(probe.p);
                if (bad) {
                    free_msgs(v, n);
                    return bad == 2 ? srv_errf(e, 400, "messages",
                                               "messages[%d].tool_calls[%d].function.arguments is not valid JSON", i, k)
                                    : srv_errf(e, 400, "messages",
                                               "messages[%d].tool_calls[%d] must be {\"function\": {\"name\": "
                                               "string, \"arguments\": string}}", i, k);
                }
                k++;
            }
            /* Llama-3.1's template raises on anything but a single call (vLLM drops an empty list) */
            if (s->chat == MDL_CHAT_LLAMA31 && k > 1) {
                free_msgs(v, n);
                return srv_errf(e, 400, "messages", "messages[%d].tool_calls: This model only supports single "
                                                    "tool-calls at once!", i);
            }
            if (v[i].tool_calls && s->chat != MDL_CHAT_QWEN3 && s->chat != MDL_CHAT_LLAMA31) {
                free_msgs(v, n);
                return srv_errf(e, 400, "messages",
                                "messages[%d].tool_calls: assistant tool calls are only rendered for the Qwen3 "
                                "and Llama-3.1 templates", i);
            }
        }
        i++;
    }
    *out = v;
    *nout = n;
    return 0;
}

/* vLLM: empty arguments become {} */
static void args_of(srv_buf *b, const char *args)
{
    if (!args[0] || py_args(b, args)) sb_str(b, "{}");
}

static int starts_ends(span s, const char *a, const char *z)
{
    size_t la = strlen(a), lz = strlen(z);
    return s.n >= la && s.n >= lz && memcmp(s.p, a, la) == 0 && memcmp(s.p + s.n - lz, z, lz) == 0;
}

/* Qwen3's template (Qwen/Qwen3-8B tokenizer_config.json chat_template; tests/data/templates/qwen3.jinja) */
static void render_qwen3(const chat_msg *v, int n, const srv_chat_opts *o, srv_buf *b)
{
    if (strcmp(v[0].role, "system") == 0) {
        sb_str(b, "<|im_start|>system\n");
        sb_span(b, msg_span(&v[0]));
        sb_str(b, "<|im_end|>\n");
    }
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (strcmp(v[i].role, "user") == 0 && !starts_ends(msg_span(&v[i]), "<tool_response>", "</tool_response>")) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        const char *r = v[i].role;
        span c = msg_span(&v[i]);
        if (strcmp(r, "user") == 0 || (strcmp(r, "system") == 0 && i > 0)) {
            sb_str(b, "<|im_start|>");
            sb_str(b, r);
            sb_str(b, "\n");
            sb_span(b, c);
            sb_str(b, "<|im_end|>\n");
        } else if (strcmp(r, "assistant") == 0) {
            span reasoning = {"", 0};
            if (v[i].reasoning) {
                reasoning = (span){v[i].reasoning, strlen(v[i].reasoning)};
            } else if (span_find(c, "</think>", 0)) {
                /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                const char *first_end = span_find(c, "</think>", 0), *last_end = span_find(c, "</think>", 1);
                span head = py_strip((span){c.p, (size_t)(first_end - c.p)}, 0, 1, 0);
                const char *open = span_find(head, "<think>", 1);
                if (open) head = (span){open + 7, head.n - (size_t)(open + 7 - head.p)};
                reasoning = py_strip(head, 1, 0, 0);
                /* content.split('</think>')[-1].lstrip('\n') */
                c = py_strip((span){last_end + 8, c.n - (size_t)(last_end + 8 - c.p)}, 1, 0, 0);
            }
            if (i > last_query && (i == n - 1 || reasoning.n > 0)) {
                sb_str(b, "<|im_start|>assistant\n<think>\n");
                sb_span(b, py_strip(reasoning, 1, 1, 0));
                sb_str(b, "\n</think>\n\n");
                sb_span(b, py_strip(c, 1, 0, 0));
            } else {
                sb_str(b, "<|im_start|>assistant\n");
                sb_span(b, c);
            }
            int k = 0;
            const cJSON *tc;
            if (v[i].tool_calls)
                cJSON_ArrayForEach(tc, v[i].tool_calls)
                {
                    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
                    if ((k == 0 && c.n > 0) || k > 0) sb_str(b, "\n");
                    sb_str(b, "<tool_call>\n{\"name\": \"");
                    sb_str(b, cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring);
                    sb_str(b, "\", \"arguments\": ");
                    args_of(b, cJSON_GetObjectItemCaseSensitive(f, "arguments")->valuestring);
                    sb_str(b, "}\n</tool_call>");
                    k++;
                }
            sb_str(b, "<|im_end|>\n");
        } else if (strcmp(r, "tool") == 0) {
            if (i == 0 || strcmp(v[i - 1].role, "tool") != 0) sb_str(b, "<|im_start|>user");
            sb_str(b, "\n<tool_response>\n");
            sb_span(b, c);
            sb_str(b, "\n</tool_response>");
            if (i == n - 1 || strcmp(v[i + 1].role, "tool") != 0) sb_str(b, "<|im_end|>\n");
        }
    }
    if (o->add_generation_prompt) {
        sb_str(b, "<|im_start|>assistant\n");
        if (o->enable_thinking == 0) sb_str(b, "<think>\n\n</think>\n\n");
    }
}

static void llama_turn(srv_buf *b, const char *role, span body)
{
    sb_str(b, "<|start_header_id|>");
    sb_str(b, role);
    sb_str(b, "<|end_header_id|>\n\n");
    sb_span(b, body);
    sb_str(b, "<|eot_id|>");
}

/* Llama-3.1's template (meta-llama/Llama-3.1-8B-Instruct; tests/data/templates/llama31.jinja), with
 * no tools / builtin_tools given; date_string from chat_template_kwargs. */
static void render_llama31(const chat_msg *v, int n, const srv_chat_opts *o, srv_buf *b)
{
    int i = 0;
    span sys = {"", 0};
    if (strcmp(v[0].role, "system") == 0) {
        sys = py_strip(msg_span(&v[0]), 1, 1, 1);
        i = 1;
    }
    sb_str(b, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
              "Cutting Knowledge Date: December 2023\nToday Date: ");
    sb_str(b, o->date_string ? o->date_string : "26 Jul 2024");
    sb_str(b, "\n\n");
    sb_span(b, sys);
    sb_str(b, "<|eot_id|>");
    for (; i < n; i++) {
        if (v[i].tool_calls) {
            /* {"name": "<name>", "parameters": <arguments|tojson>} */
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(v[i].tool_calls->child, "function");
            sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
            sb_str(b, cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring);
            sb_str(b, "\", \"parameters\": ");
            args_of(b, cJSON_GetObjectItemCaseSensitive(f, "arguments")->valuestring);
            sb_str(b, "}<|eot_id|>");
        } else if (strcmp(v[i].role, "tool") == 0) {
            /* a string is "iterable" to Jinja: the template writes it through tojson */
            sb_str(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            sb_py_json_str(b, msg_span(&v[i]));
            sb_str(b, "<|eot_id|>");
        } else {
            llama_turn(b, v[i].role, py_strip(msg_span(&v[i]), 1, 1, 1));
        }
    }
    if (o->add_generation_prompt) sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* The older families: ChatML (<|im_start|>role\ncontent<|im_end|>\n) and Llama-3 (bos, then
 * header + content|trim + <|eot_id|>). */
static void render_simple(const srv_state *s, const chat_msg *v, int n, const srv_chat_opts *o, srv_buf *b)
{
    if (s->chat == MDL_CHAT_LLAMA3) sb_str(b, "<|begin_of_text|>");
    for (int i = 0; i < n; i++) {
        if (s->chat == MDL_CHAT_CHATML) {
            sb_str(b, "<|im_start|>");
            sb_str(b, v[i].role);
            sb_str(b, "\n");
            sb_span(b, msg_span(&v[i]));
            sb_str(b, "<|im_end|>\n");
        } else {
            llama_turn(b, v[i].role, py_strip(msg_span(&v[i]), 1, 1, 1));
        }
    }
    if (o->add_generation_prompt)
        sb_str(b, s->chat == MDL_CHAT_CHATML ? "<|im_start|>assistant\n" : "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

int srv_chat_opts_parse(const cJSON *body, srv_chat_opts *o, srv_err *e)
{
    o->add_generation_prompt = 1;
    o->continue_final_message = 0;
    o->enable_thinking = -1;
    o->date_string = NULL;
    if (get_bool(body, "add_generation_prompt", &o->add_generation_prompt, e) ||
        get_bool(body, "continue_final_message", &o->continue_final_message, e))
        return -1;
    /* vLLM: "Cannot set both `continue_final_message` and `add_generation_prompt` to True." */
    if (o->continue_final_message && o->add_generation_prompt)
        return srv_errf(e, 400, "continue_final_message",
                        "Cannot set both continue_final_message and add_generation_prompt to true (set "
                        "add_generation_prompt to false)");
    const cJSON *kw = srv_field(body, "chat_template_kwargs");
    if (kw) {
        if (!cJSON_IsObject(kw))
            return srv_errf(e, 400, "chat_template_kwargs", "chat_template_kwargs must be an object");
        const cJSON *et = srv_field(kw, "enable_thinking");
        if (et && !cJSON_IsBool(et))
            return srv_errf(e, 400, "chat_template_kwargs", "chat_template_kwargs.enable_thinking must be a boolean");
        if (et) o->enable_thinking = cJSON_IsTrue(et);
        const cJSON *ds = srv_field(kw, "date_string");
        if (ds && (!cJSON_IsString(ds) || !srv_utf8_valid(ds->valuestring, strlen(ds->valuestring))))
            return srv_errf(e, 400, "chat_template_kwargs", "chat_template_kwargs.date_string must be a string");
        if (ds) o->date_string = ds->valuestring;
        /* other keys are variables the built-in templates do not read (as Jinja ignores them) */
    }
    return 0;
}

char *srv_chat_render(const srv_state *s, const cJSON *messages, const srv_chat_opts *o, size_t *len, srv_err *e)
{
    if (!s->tok) {
        srv_errf(e, 400, "messages", "this model has no tokenizer, so it cannot serve chat");
        return NULL;
    }
    if (s->chat == MDL_CHAT_NONE) {
        srv_errf(e, 400, "messages", "this model has no chat template (tokenizer_config.json chat_template "
                                     "of a known family); use /v1/completions");
        return NULL;
    }
    chat_msg *v = NULL;
    int n = 0;
    if (parse_msgs(s, messages, &v, &n, e)) return NULL;
    srv_chat_opts ro = *o;
    /* continue_final_message as transformers' render_jinja_template (utils/chat_template_utils.py,
     * v5): the final content gets a tag appended, the rendering is cut where the tag is (and
     * right-stripped when the template did not keep the space after it, i.e. trimmed the content) */
    static const char tag[] = "CONTINUE_FINAL_MESSAGE_TAG ";
    span fin = {"", 0};
    if (ro.continue_final_message) {
        ro.add_generation_prompt = 0;
        fin = py_strip(msg_span(&v[n - 1]), 1, 1, 1);
        size_t off = (size_t)(fin.p - msg_span(&v[n - 1]).p);
        sb_str(&v[n - 1].text, tag);
        if (v[n - 1].text.oom) {
            free_msgs(v, n);
            srv_errf(e, 500, NULL, "out of memory");
            return NULL;
        }
        fin.p = v[n - 1].text.p + off; /* the buffer may have moved */
    }
    srv_buf b = {0};
    if (s->chat == MDL_CHAT_QWEN3) render_qwen3(v, n, &ro, &b);
    else if (s->chat == MDL_CHAT_LLAMA31) render_llama31(v, n, &ro, &b);
    else render_simple(s, v, n, &ro, &b);
    if (!b.oom && !b.p) sb_str(&b, "");
    if (b.oom) {
        free_msgs(v, n);
        free(b.p);
        srv_errf(e, 500, NULL, "out of memory");
        return NULL;
    }
    if (o->continue_final_message) {
        span all = {b.p, b.n};
        const char *at = span_find(all, "CONTINUE_FINAL_MESSAGE_TAG", 1);
        int found = at != NULL;
        if (found && fin.n) {
            found = 0;
            for (size_t k = 0; k + fin.n <= b.n && !found; k++) found = memcmp(b.p + k, fin.p, fin.n) == 0;
        }
        if (!found) {
            free_msgs(v, n);
            free(b.p);
            srv_errf(e, 400, "continue_final_message",
                     "continue_final_message is set but the final message does not appear in the chat after "
                     "applying the chat template");
            return NULL;
        }
        size_t cut = (size_t)(at - b.p);
        int kept_space = cut + strlen(tag) <= b.n && memcmp(at, tag, strlen(tag)) == 0;
        b.n = kept_space ? cut : py_strip((span){b.p, cut}, 0, 1, 1).n;
        b.p[b.n] = 0;
    }
    free_msgs(v, n);
    *len = b.n;
    return b.p;
}

int srv_chat_encode(const srv_state *s, const cJSON *messages, const srv_chat_opts *o, srv_prompt *out, srv_err *e)
{
    out->ids = NULL;
    out->n = 0;
    size_t len = 0;
    char *text = srv_chat_render(s, messages, o, &len, e);
    if (!text) return -1;
    /* the template already carries bos where the family wants one (vLLM: add_special_tokens false) */
    int rc = srv_parse_prompt_text(s, text, len, 0, 0, out, "messages", e);
    free(text);
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
    const cJSON *v = srv_field(body, "stop");
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
    const cJSON *v = srv_field(body, "stop_token_ids");
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
        const cJSON *v = srv_field(body, nums[i].key);
        if (v && !(cJSON_IsNumber(v) && v->valuedouble == nums[i].neutral))
            return srv_errf(e, 400, nums[i].key, "%s is not supported (only %g)", nums[i].key, nums[i].neutral);
    }
    const cJSON *v = srv_field(body, "best_of");
    if (v && !(cJSON_IsNumber(v) && (v->valuedouble == 1 || v->valuedouble == g->n)))
        return srv_errf(e, 400, "best_of", "best_of is not supported (only best_of == n)");
    v = srv_field(body, "use_beam_search");
    if (v && cJSON_IsTrue(v)) return srv_errf(e, 400, "use_beam_search", "beam search is not supported");
    v = srv_field(body, "suffix");
    if (v && !(cJSON_IsString(v) && !v->valuestring[0])) return srv_errf(e, 400, "suffix", "suffix is not supported");
    v = srv_field(body, "tools");
    if (v && !(cJSON_IsArray(v) && !v->child)) return srv_errf(e, 400, "tools", "tools are not supported");
    /* constrained decoding is not built: answering unconstrained text to a client that asked for
     * JSON would be a silent wrong answer */
    v = srv_field(body, "response_format");
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
        if (srv_field(body, guided[i]))
            return srv_errf(e, 400, guided[i], "%s is not supported (no constrained decoding)", guided[i]);
    if (g->api == SRV_API_CHAT) {
        v = srv_field(body, "echo");
        if (v && !cJSON_IsBool(v)) return srv_errf(e, 400, "echo", "echo must be a boolean");
        if (v && cJSON_IsTrue(v))
            return srv_errf(e, 400, "echo", "echo is not supported on chat completions (use /v1/completions)");
        v = srv_field(body, "chat_template");
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

    const cJSON *model = srv_field(body, "model");
    if (model && !cJSON_IsString(model)) return srv_errf(e, 400, "model", "model must be a string");
    /* vLLM: a name other than the served one is 404 NotFoundError (absent: the served model) */
    if (model && strcmp(model->valuestring, s->model_name) != 0) {
        srv_errf(e, 404, "model", "The model `%.200s` does not exist (this server serves `%.200s`).",
                 model->valuestring, s->model_name);
        e->type = "NotFoundError";
        return -1;
    }

    if (get_int(body, "n", 1, SRV_MAX_N, &v, NULL, e)) return -1;
    if (srv_field(body, "n")) g->n = (int)v;
    if (refuse_unsupported(body, g, e)) return -1;

    /* prompt(s) */
    int add_special = 1;
    if (get_bool(body, "add_special_tokens", &add_special, e)) return -1;
    if (chat) {
        srv_chat_opts co;
        if (srv_chat_opts_parse(body, &co, e)) return -1;
        g->prompts = calloc(1, sizeof *g->prompts);
        if (!g->prompts) return srv_errf(e, 500, NULL, "out of memory");
        g->n_prompts = 1;
        if (srv_chat_encode(s, srv_field(body, "messages"), &co, &g->prompts[0], e)) return -1;
    } else if (parse_prompts(s, srv_field(body, "prompt"), add_special, g, e))
        return -1;
    if (g->n_prompts * g->n > s->max_choices)
        return srv_errf(e, 400, "n", "%d prompts x n %d = %d sequences exceed the limit of %d per request",
                        g->n_prompts, g->n, g->n_prompts * g->n, s->max_choices);
    int longest = 0;
    for (int i = 0; i < g->n_prompts; i++)
        if (g->prompts[i].n > longest) longest = g->prompts[i].n;

    /* lengths */
    const char *mt_key = "max_tokens";
    if (chat && srv_field(body, "max_completion_tokens")) mt_key = "max_completion_tokens";
    if (get_int(body, mt_key, 1, 1 << 30, &v, &max_set, e)) return -1;
    if (max_set) g->max_tokens = (int)v;
    else if (!chat) g->max_tokens = 16;
    else { /* vLLM: the rest of the context; here also what the KV cache can hold for one sequence */
        int room = s->max_model_len < s->kv_tokens ? s->max_model_len : s->kv_tokens;
        g->max_tokens = room - longest;
        if (g->max_tokens < 1) g->max_tokens = 1; /* reported as too long below */
    }
    /* vLLM: generation_config.json's max_new_tokens caps max_tokens, given or not */
    if ((s->gen.set & MDL_GEN_MAX_NEW_TOKENS) && g->max_tokens > s->gen.max_new_tokens)
        g->max_tokens = s->gen.max_new_tokens;
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
    /* defaults: the model's generation_config.json (s->gen, as vLLM's --generation-config auto),
     * else OpenAI's */
    const mdl_gen_defaults *gd = &s->gen;
    if (get_num(body, "temperature", 0, 100, 0, &g->sp.temperature, e)) return -1;
    if (!srv_field(body, "temperature")) g->sp.temperature = gd->set & MDL_GEN_TEMPERATURE ? gd->temperature : 1.0f;
    if (gd->set & MDL_GEN_TOP_P) g->sp.top_p = gd->top_p;
    if (gd->set & MDL_GEN_MIN_P) g->sp.min_p = gd->min_p;
    if (get_num(body, "top_p", 0, 1, 1, &g->sp.top_p, e)) return -1;
    if (get_int(body, "top_k", -1, 1 << 30, &v, &set, e)) return -1;
    g->sp.top_k = set ? (v > 0 ? (int)v : 0) : (gd->set & MDL_GEN_TOP_K ? gd->top_k : 0);
    set = 0;
    if (get_num(body, "min_p", 0, 1, 0, &g->sp.min_p, e)) return -1;
    /* vLLM's penalties (SamplingParams._verify_args ranges) and logit_bias */
    if (get_num(body, "presence_penalty", -2, 2, 0, &g->sp.presence_penalty, e)) return -1;
    if (get_num(body, "frequency_penalty", -2, 2, 0, &g->sp.frequency_penalty, e)) return -1;
    if (get_num(body, "repetition_penalty", 0, 1e30, 1, &g->sp.repetition_penalty, e)) return -1;
    /* vLLM's --generation-config auto: the file's repetition_penalty when the request sets none */
    if (!srv_field(body, "repetition_penalty"))
        g->sp.repetition_penalty = gd->set & MDL_GEN_REPETITION_PENALTY ? (float)gd->repetition_penalty : 1.0f;
    {
        eng_logit_bias *lb;
        if (srv_parse_logit_bias(srv_field(body, "logit_bias"), s->vocab, &lb, &g->sp.n_logit_bias, e)) return -1;
        g->sp.logit_bias = lb;
    }
    if (get_int(body, "seed", -9223372036854775808.0, 18446744073709551615.0, &v, &g->seed_set, e)) return -1;
    if (g->seed_set) g->sp.seed = v < 0 ? (uint64_t)(int64_t)v : (v >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)v);

    /* stop conditions */
    if (parse_stop(body, g, e) || parse_stop_ids(s, body, g, e)) return -1;
    if (get_bool(body, "ignore_eos", &g->ignore_eos, e)) return -1;
    /* graphswap's "speculative": false runs plain decoding on a server with a drafter (the
     * baseline of graphswap eval --url: same server, same target, same batch). */
    {
        int spec = 1;
        if (get_bool(body, "speculative", &spec, e)) return -1;
        g->no_spec = !spec;
    }
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
        const cJSON *lp = srv_field(body, "logprobs");
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
    const cJSON *plp = srv_field(body, "prompt_logprobs");
    if (plp && !cJSON_IsNull(plp)) {
        if (get_int(body, "prompt_logprobs", 0, ENG_MAX_LOGPROBS, &v, NULL, e)) return -1;
        g->prompt_logprobs = (int)v;
    }
    if (get_bool(body, "skip_special_tokens", &g->skip_special, e) ||
        get_bool(body, "return_token_ids", &g->return_token_ids, e) ||
        get_bool(body, "return_tokens_as_token_ids", &g->tokens_as_ids, e) || get_bool(body, "stream", &g->stream, e))
        return -1;
    const cJSON *so = srv_field(body, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return srv_errf(e, 400, "stream_options", "stream_options must be an object");
        const cJSON *iu = srv_field(so, "include_usage");
        if (iu && !cJSON_IsBool(iu))
            return srv_errf(e, 400, "stream_options", "stream_options.include_usage must be a boolean");
        g->include_usage = iu && cJSON_IsTrue(iu);
    }
    const cJSON *user = srv_field(body, "user");
    if (user && !cJSON_IsString(user)) return srv_errf(e, 400, "user", "user must be a string");
    /* vLLM's cache_salt (null: none): the prefix cache is shared only among requests of one salt */
    const cJSON *salt = srv_field(body, "cache_salt");
    if (salt) {
        if (!cJSON_IsString(salt) || !salt->valuestring[0])
            return srv_errf(e, 400, "cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.");
        const size_t len = strlen(salt->valuestring);
        if (len > SRV_MAX_CACHE_SALT)
            return srv_errf(e, 400, "cache_salt", "cache_salt is longer than %d bytes", SRV_MAX_CACHE_SALT);
        g->cache_salt = eng_cache_salt_hash(salt->valuestring, len);
    }
    return 0;
}
