/* models/tokenizer/tokenizer.c — byte-level BPE tokenizer (Hugging Face tokenizer.json): loading, encode,
 * decode. See tokenizer.h for the contract.
 *
 * The pipeline mirrors the reference `tokenizers` library:
 *   1. added tokens with normalized=false are matched on the raw text (leftmost-longest, honouring
 *      special / single_word / lstrip / rstrip);
 *   2. the remaining pieces are normalized (NFC, when configured) and added tokens with
 *      normalized=true are matched on the normalized pieces;
 *   3. the pre-tokenizer steps run on what is left: Split (regex or literal, all split behaviours,
 *      invert), Digits, and ByteLevel (add_prefix_space, optional GPT-2 regex);
 *   4. each piece is mapped byte -> GPT-2 byte-level character and merged by rank with a
 *      priority queue (lowest rank first, leftmost on ties), optionally skipping merges when the
 *      whole piece is a vocabulary entry (ignore_merges).
 * A loaded tokenizer is immutable: encode/decode keep all scratch state per call, so any number of
 * threads may use one tokenizer at once.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "models/tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/format/json_guard.h"
#include "models/tokenizer/tokenizer_internal.h"

#define MDL_TOK_MAX_ID (1 << 24)              /* ids are < 16M (largest real vocabularies ~260k) */
#define MDL_TOK_MAX_FILE (1024ull * 1024 * 1024) /* tokenizer.json larger than 1 GiB is refused */
#define MDL_TOK_MAX_STEPS 16
#define MDL_TOK_MAX_POST 8 /* ids a post-processor may add on either side */

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Unicode White_Space, the meaning of \s in the reference implementation's regex engines
 * (PCRE2's \s additionally matches U+180E, so patterns are rewritten to this explicit class). */
#define WS_CLASS_BODY "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                              */

static void seterr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

uint32_t mdl_tok_int_byte_cp(uint8_t b) {
    /* GPT-2 bytes_to_unicode: printable bytes map to themselves, the 68 others to 256.. in order */
    if (b <= 32) return 256u + b;
    if (b >= 127 && b <= 160) return 256u + 33u + (uint32_t)(b - 127);
    if (b == 173) return 256u + 33u + 34u;
    return b;
}

int mdl_tok_int_cp_byte(uint32_t cp) {
    if (cp < 256) {
        if (cp <= 32 || (cp >= 127 && cp <= 160) || cp == 173) return -1;
        return (int)cp;
    }
    if (cp <= 288) return (int)(cp - 256);
    if (cp <= 322) return (int)(cp - 289 + 127);
    if (cp == 323) return 173;
    return -1;
}

/* Returns len when s is valid UTF-8 (no overlongs, surrogates, or code points > U+10FFFF),
 * otherwise the byte offset of the first invalid sequence. */
size_t mdl_tok_int_utf8_check(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) {
            n = 2;
            cp = c & 0x1F;
            min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 3;
            cp = c & 0x0F;
            min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 4;
            cp = c & 0x07;
            min = 0x10000;
        } else {
            return i;
        }
        if (len - i < n) return i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n;
    }
    return len;
}

static bool is_white_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---- growable byte arena (offsets stay valid across growth) ---- */
typedef struct {
    char *p;
    size_t len, cap;
} arena;

static int arena_add(arena *a, const void *data, size_t n, uint32_t *off) {
    if (a->len + n + 1 > UINT32_MAX) return -1;
    if (a->len + n + 1 > a->cap) {
        size_t nc = a->cap ? a->cap : 4096;
        while (nc < a->len + n + 1) nc *= 2;
        char *np = realloc(a->p, nc);
        if (!np) return -1;
        a->p = np;
        a->cap = nc;
    }
    if (n) memcpy(a->p + a->len, data, n);
    *off = (uint32_t)a->len;
    a->len += n;
    a->p[a->len++] = 0; /* NUL after every entry: handy for debugging, never relied upon */
    return 0;
}

/* ---- string -> id map (open addressing, keys live in the arena) ---- */
typedef struct {
    uint32_t off, len;
    int32_t id; /* -1: empty slot */
} smap_ent;

typedef struct {
    smap_ent *e;
    size_t cap, n;
} smap;

static int smap_init(smap *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2 + 1);
    m->n = 0;
    m->e = malloc(m->cap * sizeof *m->e);
    if (!m->e) return -1;
    for (size_t i = 0; i < m->cap; i++) m->e[i].id = -1;
    return 0;
}

static smap_ent *smap_slot(const smap *m, const char *base, const char *s, size_t n) {
    size_t mask = m->cap - 1, i = (size_t)hash_bytes(s, n) & mask;
    for (;;) {
        smap_ent *e = &m->e[i];
        if (e->id < 0) return e;
        if (e->len == n && memcmp(base + e->off, s, n) == 0) return e;
        i = (i + 1) & mask;
    }
}

static int32_t smap_get(const smap *m, const char *base, const char *s, size_t n) {
    if (!m->e) return -1;
    return smap_slot(m, base, s, n)->id;
}

/* ---- (left id, right id) -> (rank, merged id) ---- */
typedef struct {
    uint64_t key; /* UINT64_MAX: empty */
    uint32_t rank;
    int32_t new_id;
} merge_ent;

/* ------------------------------------------------------------------------------------------ */
/* the tokenizer                                                                              */

enum { F_VOCAB = 1, F_ADDED = 2, F_SPECIAL = 4 };

typedef struct {
    uint32_t off, len;   /* content */
    uint32_t moff, mlen; /* the form matched in text (NFC of content when normalized and NFC) */
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} added_tok;

typedef struct {
    uint32_t *idx; /* indices into added[], sorted by first byte, then longest first */
    size_t n;
    size_t first[257];
} added_set;

typedef enum { BEH_ISOLATED, BEH_REMOVED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS } split_beh;
typedef enum { STEP_SPLIT, STEP_BYTELEVEL } step_kind;

typedef struct {
    step_kind kind;
    pcre2_code *re; /* Split pattern, or the GPT-2 regex for ByteLevel with use_regex */
    split_beh beh;
    bool invert;
    bool add_prefix_space;
} pretok_step;

struct mdl_tokenizer {
    int32_t n_ids; /* max id + 1 */
    uint32_t *tok_off, *tok_len; /* per id: token string (vocab form, or added content) */
    uint32_t *dec_off, *dec_len; /* per id: decoded bytes */
    uint8_t *flags;
    arena ar;
    smap vocab;     /* model vocabulary */
    smap added_map; /* added token content -> id */
    merge_ent *merges;
    size_t merges_cap;
    int32_t byte_id[256];  /* byte -> id of its byte-level character (-1: absent) */
    int32_t byte_fb[256];  /* byte -> id of "<0xXX>" (byte_fallback), -1 absent */
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    added_tok *added;
    size_t n_added;
    added_set set_raw, set_norm;
    bool nfc;
    pretok_step steps[MDL_TOK_MAX_STEPS];
    size_t n_steps;
    pcre2_code *word_re; /* \w of the reference (single_word added tokens) */
    int32_t bos, eos;
    int32_t post_pre[MDL_TOK_MAX_POST], post_suf[MDL_TOK_MAX_POST]; /* add_special_tokens */
    size_t n_post_pre, n_post_suf;
    mdl_chat_family chat;
};

static const char *tokstr(const mdl_tokenizer *t, uint32_t off) { return t->ar.p + off; }

static int32_t vocab_get(const mdl_tokenizer *t, const char *s, size_t n) {
    return smap_get(&t->vocab, t->ar.p, s, n);
}

static const merge_ent *merge_get(const mdl_tokenizer *t, int32_t a, int32_t b) {
    if (!t->merges) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = t->merges_cap - 1, i = (size_t)hash_u64(key) & mask;
    for (;;) {
        const merge_ent *e = &t->merges[i];
        if (e->key == UINT64_MAX) return NULL;
        if (e->key == key) return e;
        i = (i + 1) & mask;
    }
}

void mdl_tok_free(mdl_tokenizer *t) {
    if (!t) return;
    free(t->tok_off);
    free(t->tok_len);
    free(t->dec_off);
    free(t->dec_len);
    free(t->flags);
    free(t->ar.p);
    free(t->vocab.e);
    free(t->added_map.e);
    free(t->merges);
    free(t->added);
    free(t->set_raw.idx);
    free(t->set_norm.idx);
    for (size_t i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
    pcre2_code_free(t->word_re);
    free(t);
}

/* ------------------------------------------------------------------------------------------ */
/* loading                                                                                    */

static char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        seterr(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 1 << 20;
            if (nc > MDL_TOK_MAX_FILE + 65536 + 1) nc = MDL_TOK_MAX_FILE + 65536 + 1;
            if (nc <= cap) {
                seterr(err, errlen, "%s: file larger than %llu bytes", path, MDL_TOK_MAX_FILE);
                goto fail;
            }
            char *nb = realloc(buf, nc);
            if (!nb) {
                seterr(err, errlen, "%s: out of memory", path);
                goto fail;
            }
            buf = nb;
            cap = nc;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (n > MDL_TOK_MAX_FILE) {
            seterr(err, errlen, "%s: file larger than %llu bytes", path, MDL_TOK_MAX_FILE);
            goto fail;
        }
        if (r == 0) break;
    }
    if (ferror(f)) {
        seterr(err, errlen, "%s: read error", path);
        goto fail;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
fail:
    fclose(f);
    free(buf);
    return NULL;
}

static cJSON *parse_json_file(const char *path, char *err, size_t errlen) {
    size_t len = 0;
    char *buf = read_file(path, &len, err, errlen);
    if (!buf) return NULL;
    char why[160];
    mdl_json_result jr;
    cJSON *j = mdl_json_parse(buf, len, MDL_JSON_MAX_DEPTH, MDL_JSON_WHOLE, &jr, why, sizeof why);
    if (!j) {
        if (jr.status == MDL_JSON_E_SYNTAX || jr.status == MDL_JSON_E_TRAILING)
            seterr(err, errlen, "%s: invalid JSON near byte %zu", path, jr.at);
        else
            seterr(err, errlen, "%s: %s", path, why);
    }
    free(buf);
    return j;
}

/* cJSON strings come straight from the file: their bytes are not checked as UTF-8 by cJSON. */
static bool json_str_ok(const cJSON *j) {
    return cJSON_IsString(j) && j->valuestring &&
           mdl_tok_int_utf8_check((const unsigned char *)j->valuestring, strlen(j->valuestring)) ==
               strlen(j->valuestring);
}

static bool json_id(const cJSON *j, int32_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0) || d >= MDL_TOK_MAX_ID || d != (double)(int32_t)d) return false;
    *out = (int32_t)d;
    return true;
}

/* optional boolean field: absent/null -> def; wrong type -> error */
static int json_bool(const cJSON *obj, const char *name, bool def, bool *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(j)) return -1;
    *out = cJSON_IsTrue(j);
    return 0;
}

static const char *json_type(const cJSON *obj) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

/* Rewrites \s / \S (outside and inside character classes) to the explicit Unicode White_Space
 * class, so PCRE2 matches exactly what the reference regex engine matches. */
static char *rewrite_pattern(const char *p) {
    size_t n = strlen(p);
    size_t cap = n * 4 + 256, o = 0;
    for (size_t i = 0; i < n; i++)
        if (p[i] == '\\') cap += sizeof(WS_CLASS_BODY) + 8;
    char *out = malloc(cap);
    if (!out) return NULL;
    bool in_class = false;
    size_t class_start = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            if (d == 's' && !in_class) {
                o += (size_t)sprintf(out + o, "[%s]", WS_CLASS_BODY);
            } else if (d == 's') {
                o += (size_t)sprintf(out + o, "%s", WS_CLASS_BODY);
            } else if (d == 'S' && !in_class) {
                o += (size_t)sprintf(out + o, "[^%s]", WS_CLASS_BODY);
            } else {
                out[o++] = c;
                out[o++] = d;
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            class_start = i;
            out[o++] = c;
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
            /* POSIX class [:name:] inside a bracket expression */
            const char *e = strstr(p + i + 2, ":]");
            if (e) {
                size_t l = (size_t)(e + 2 - (p + i));
                memcpy(out + o, p + i, l);
                o += l;
                i += l - 1;
                continue;
            }
        }
        if (in_class && c == ']') {
            /* ']' first in the class (after an optional '^') is a literal */
            size_t first = class_start + 1;
            if (first < n && p[first] == '^') first++;
            if (i != first) in_class = false;
        }
        out[o++] = c;
    }
    out[o] = 0;
    return out;
}

static pcre2_code *compile_re(const char *pattern, bool literal, char *err, size_t errlen) {
    char *pat = NULL;
    const char *use = pattern;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
    if (literal) {
        opts |= PCRE2_LITERAL;
    } else {
        pat = rewrite_pattern(pattern);
        if (!pat) {
            seterr(err, errlen, "out of memory");
            return NULL;
        }
        use = pat;
    }
    int ec = 0;
    PCRE2_SIZE eo = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)use, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    free(pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        seterr(err, errlen, "cannot compile pre-tokenizer regex \"%.80s\": %s", pattern,
               (const char *)msg);
        return NULL;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if absent */
    return re;
}

static int add_step(mdl_tokenizer *t, pretok_step st, char *err, size_t errlen) {
    if (t->n_steps >= MDL_TOK_MAX_STEPS) {
        pcre2_code_free(st.re);
        seterr(err, errlen, "tokenizer.json: pre_tokenizer has more than %d steps", MDL_TOK_MAX_STEPS);
        return -1;
    }
    t->steps[t->n_steps++] = st;
    return 0;
}

static int parse_pretok(mdl_tokenizer *t, const cJSON *pt, int depth, char *err, size_t errlen) {
    if (depth > 4) {
        seterr(err, errlen, "tokenizer.json: pre_tokenizer nested too deeply");
        return -1;
    }
    if (!cJSON_IsObject(pt)) {
        seterr(err, errlen, "tokenizer.json: pre_tokenizer is not an object");
        return -1;
    }
    const char *type = json_type(pt);
    if (!type) {
        seterr(err, errlen, "tokenizer.json: pre_tokenizer without \"type\"");
        return -1;
    }
    bool after_bytelevel = t->n_steps > 0 && t->steps[t->n_steps - 1].kind == STEP_BYTELEVEL;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        if (!cJSON_IsArray(arr)) {
            seterr(err, errlen, "tokenizer.json: Sequence pre_tokenizer without \"pretokenizers\" array");
            return -1;
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            if (parse_pretok(t, it, depth + 1, err, errlen)) return -1;
        }
        return 0;
    }
    if (after_bytelevel) {
        seterr(err, errlen,
               "tokenizer.json: pre_tokenizer step \"%s\" after ByteLevel is not supported", type);
        return -1;
    }
    pretok_step st = {0};
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        if (!(json_str_ok(rx) || json_str_ok(lit))) {
            seterr(err, errlen, "tokenizer.json: Split pre_tokenizer needs pattern {\"Regex\": ...} or {\"String\": ...}");
            return -1;
        }
        if (!cJSON_IsString(beh)) {
            seterr(err, errlen, "tokenizer.json: Split pre_tokenizer without \"behavior\"");
            return -1;
        }
        static const struct {
            const char *name;
            split_beh b;
        } behs[] = {{"Isolated", BEH_ISOLATED},           {"Removed", BEH_REMOVED},
                    {"MergedWithPrevious", BEH_MERGED_PREV}, {"MergedWithNext", BEH_MERGED_NEXT},
                    {"Contiguous", BEH_CONTIGUOUS}};
        size_t k;
        for (k = 0; k < sizeof behs / sizeof behs[0]; k++)
            if (strcmp(beh->valuestring, behs[k].name) == 0) break;
        if (k == sizeof behs / sizeof behs[0]) {
            seterr(err, errlen, "tokenizer.json: unknown Split behavior \"%.40s\"", beh->valuestring);
            return -1;
        }
        if (json_bool(pt, "invert", false, &st.invert)) {
            seterr(err, errlen, "tokenizer.json: Split \"invert\" is not a boolean");
            return -1;
        }
        st.kind = STEP_SPLIT;
        st.beh = behs[k].b;
        if (json_str_ok(rx)) {
            st.re = compile_re(rx->valuestring, false, err, errlen);
        } else {
            if (lit->valuestring[0] == 0) {
                seterr(err, errlen, "tokenizer.json: Split with an empty String pattern");
                return -1;
            }
            st.re = compile_re(lit->valuestring, true, err, errlen);
        }
        if (!st.re) return -1;
        return add_step(t, st, err, errlen);
    }
    if (strcmp(type, "Digits") == 0) {
        bool indiv;
        if (json_bool(pt, "individual_digits", false, &indiv)) {
            seterr(err, errlen, "tokenizer.json: Digits \"individual_digits\" is not a boolean");
            return -1;
        }
        st.kind = STEP_SPLIT;
        st.beh = BEH_ISOLATED;
        st.re = compile_re(indiv ? "\\p{N}" : "\\p{N}+", false, err, errlen);
        if (!st.re) return -1;
        return add_step(t, st, err, errlen);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        bool use_regex;
        if (json_bool(pt, "add_prefix_space", true, &st.add_prefix_space) ||
            json_bool(pt, "use_regex", true, &use_regex)) {
            seterr(err, errlen, "tokenizer.json: ByteLevel options must be booleans");
            return -1;
        }
        st.kind = STEP_BYTELEVEL;
        if (use_regex) {
            st.re = compile_re(GPT2_REGEX, false, err, errlen);
            if (!st.re) return -1;
        }
        return add_step(t, st, err, errlen);
    }
    seterr(err, errlen, "tokenizer.json: unsupported pre_tokenizer type \"%.40s\"", type);
    return -1;
}

static int parse_normalizer(mdl_tokenizer *t, const cJSON *n, int depth, char *err, size_t errlen) {
    if (!n || cJSON_IsNull(n)) return 0;
    if (depth > 4 || !cJSON_IsObject(n)) {
        seterr(err, errlen, "tokenizer.json: malformed normalizer");
        return -1;
    }
    const char *type = json_type(n);
    if (!type) {
        seterr(err, errlen, "tokenizer.json: normalizer without \"type\"");
        return -1;
    }
    if (strcmp(type, "NFC") == 0) {
        t->nfc = true;
        return 0;
    }
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(arr)) {
            seterr(err, errlen, "tokenizer.json: Sequence normalizer without \"normalizers\" array");
            return -1;
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            if (parse_normalizer(t, it, depth + 1, err, errlen)) return -1;
        }
        return 0;
    }
    seterr(err, errlen,
           "tokenizer.json: unsupported normalizer \"%.40s\" (only null and NFC are supported)", type);
    return -1;
}

static int parse_decoder(const cJSON *d, int depth, char *err, size_t errlen) {
    const char *type = cJSON_IsObject(d) ? json_type(d) : NULL;
    if (!type || depth > 4) {
        seterr(err, errlen, "tokenizer.json: missing or malformed decoder (ByteLevel required)");
        return -1;
    }
    if (strcmp(type, "ByteLevel") == 0) return 0;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        const cJSON *it;
        int n = 0;
        cJSON_ArrayForEach(it, arr) {
            if (parse_decoder(it, depth + 1, err, errlen)) return -1;
            n++;
        }
        if (n > 0) return 0;
    }
    seterr(err, errlen, "tokenizer.json: unsupported decoder \"%.40s\" (ByteLevel required)", type);
    return -1;
}

/* post_processor: the ids added around one encoded sequence when add_special_tokens is set (the
 * "single" template only; pairs do not exist here). Supported as the reference library applies them
 * (tokenizers/src/processors/{template,sequence,roberta,bert,byte_level}.rs): null and ByteLevel add
 * nothing, TemplateProcessing its single template (SpecialToken pieces around Sequence "A"),
 * RobertaProcessing / BertProcessing cls ... sep, Sequence applies each in turn. Special token ids
 * are resolved after the vocabulary and the added tokens are loaded. */
static int post_add(int32_t *v, size_t *n, int32_t id, char *err, size_t errlen) {
    if (*n >= MDL_TOK_MAX_POST) {
        seterr(err, errlen, "tokenizer.json: post_processor adds more than %d tokens", MDL_TOK_MAX_POST);
        return -1;
    }
    v[(*n)++] = id;
    return 0;
}

static int post_check_id(const mdl_tokenizer *t, int32_t id, char *err, size_t errlen) {
    if (id < 0 || id >= t->n_ids) {
        seterr(err, errlen, "tokenizer.json: post_processor token id %d is not in the vocabulary", (int)id);
        return -1;
    }
    return 0;
}

static int parse_post(mdl_tokenizer *t, const cJSON *pp, int depth, int32_t *pre, size_t *npre, int32_t *suf,
                      size_t *nsuf, char *err, size_t errlen) {
    if (!pp || cJSON_IsNull(pp)) return 0;
    const char *type = cJSON_IsObject(pp) ? json_type(pp) : NULL;
    if (!type || depth > 4) {
        seterr(err, errlen, "tokenizer.json: malformed post_processor");
        return -1;
    }
    if (strcmp(type, "ByteLevel") == 0) return 0;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pp, "processors")) {
            /* each processor wraps the result of the previous one */
            int32_t p2[MDL_TOK_MAX_POST], s2[MDL_TOK_MAX_POST];
            size_t np2 = 0, ns2 = 0;
            if (parse_post(t, it, depth + 1, p2, &np2, s2, &ns2, err, errlen)) return -1;
            if (np2 + *npre > MDL_TOK_MAX_POST || ns2 + *nsuf > MDL_TOK_MAX_POST) {
                seterr(err, errlen, "tokenizer.json: post_processor adds more than %d tokens", MDL_TOK_MAX_POST);
                return -1;
            }
            memmove(pre + np2, pre, *npre * sizeof *pre);
            memcpy(pre, p2, np2 * sizeof *pre);
            *npre += np2;
            memcpy(suf + *nsuf, s2, ns2 * sizeof *suf);
            *nsuf += ns2;
        }
        return 0;
    }
    if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(pp, "cls");
        const cJSON *sep = cJSON_GetObjectItemCaseSensitive(pp, "sep");
        int32_t ci, si;
        if (cJSON_GetArraySize(cls) != 2 || cJSON_GetArraySize(sep) != 2 || !json_id(cJSON_GetArrayItem(cls, 1), &ci) ||
            !json_id(cJSON_GetArrayItem(sep, 1), &si)) {
            seterr(err, errlen, "tokenizer.json: %s needs cls and sep as [token, id]", type);
            return -1;
        }
        if (post_check_id(t, ci, err, errlen) || post_check_id(t, si, err, errlen)) return -1;
        if (*npre >= MDL_TOK_MAX_POST) {
            seterr(err, errlen, "tokenizer.json: post_processor adds more than %d tokens", MDL_TOK_MAX_POST);
            return -1;
        }
        memmove(pre + 1, pre, *npre * sizeof *pre);
        pre[0] = ci;
        (*npre)++;
        return post_add(suf, nsuf, si, err, errlen);
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(pp, "special_tokens");
        if (!cJSON_IsArray(single)) {
            seterr(err, errlen, "tokenizer.json: TemplateProcessing.single must be a list");
            return -1;
        }
        int32_t before[MDL_TOK_MAX_POST], after[MDL_TOK_MAX_POST];
        size_t nb = 0, na = 0;
        int seen_a = 0;
        const cJSON *piece;
        cJSON_ArrayForEach(piece, single) {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(piece, "SpecialToken");
            const cJSON *sq = cJSON_GetObjectItemCaseSensitive(piece, "Sequence");
            if (cJSON_IsObject(sq)) {
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(sq, "id");
                if (!cJSON_IsString(id) || strcmp(id->valuestring, "A") != 0 || seen_a) {
                    seterr(err, errlen, "tokenizer.json: TemplateProcessing.single must hold sequence A once");
                    return -1;
                }
                seen_a = 1;
                continue;
            }
            const cJSON *name = cJSON_IsObject(sp) ? cJSON_GetObjectItemCaseSensitive(sp, "id") : NULL;
            if (!cJSON_IsString(name)) {
                seterr(err, errlen, "tokenizer.json: TemplateProcessing.single pieces are SpecialToken or Sequence");
                return -1;
            }
            const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids");
            if (!cJSON_IsArray(ids)) {
                seterr(err, errlen, "tokenizer.json: TemplateProcessing special token \"%.60s\" is not defined",
                       name->valuestring);
                return -1;
            }
            const cJSON *x;
            cJSON_ArrayForEach(x, ids) {
                int32_t id;
                if (!json_id(x, &id)) {
                    seterr(err, errlen, "tokenizer.json: TemplateProcessing \"%.60s\" has a bad id", name->valuestring);
                    return -1;
                }
                if (post_check_id(t, id, err, errlen)) return -1;
                if (post_add(seen_a ? after : before, seen_a ? &na : &nb, id, err, errlen)) return -1;
            }
        }
        if (!seen_a) {
            seterr(err, errlen, "tokenizer.json: TemplateProcessing.single has no sequence A");
            return -1;
        }
        if (nb + *npre > MDL_TOK_MAX_POST || na + *nsuf > MDL_TOK_MAX_POST) {
            seterr(err, errlen, "tokenizer.json: post_processor adds more than %d tokens", MDL_TOK_MAX_POST);
            return -1;
        }
        memmove(pre + nb, pre, *npre * sizeof *pre);
        memcpy(pre, before, nb * sizeof *pre);
        *npre += nb;
        memcpy(suf + *nsuf, after, na * sizeof *suf);
        *nsuf += na;
        return 0;
    }
    seterr(err, errlen,
           "tokenizer.json: unsupported post_processor \"%.40s\" (null, ByteLevel, TemplateProcessing, "
           "RobertaProcessing, BertProcessing, Sequence)", type);
    return -1;
}

/* Grows the per-id tables to hold id. */
static int ensure_ids(mdl_tokenizer *t, int32_t id, int32_t *cap) {
    if (id < *cap) {
        if (id >= t->n_ids) t->n_ids = id + 1;
        return 0;
    }
    int32_t nc = *cap ? *cap : 1024;
    while (nc <= id) nc *= 2;
    uint32_t *a = realloc(t->tok_off, (size_t)nc * sizeof *a);
    if (!a) return -1;
    t->tok_off = a;
    uint32_t *b = realloc(t->tok_len, (size_t)nc * sizeof *b);
    if (!b) return -1;
    t->tok_len = b;
    uint8_t *f = realloc(t->flags, (size_t)nc);
    if (!f) return -1;
    t->flags = f;
    for (int32_t i = *cap; i < nc; i++) {
        t->tok_off[i] = 0;
        t->tok_len[i] = 0;
        t->flags[i] = 0;
    }
    *cap = nc;
    if (id >= t->n_ids) t->n_ids = id + 1;
    return 0;
}

static int load_vocab(mdl_tokenizer *t, const cJSON *vocab, int32_t *idcap, char *err, size_t errlen) {
    if (!cJSON_IsObject(vocab)) {
        seterr(err, errlen, "tokenizer.json: model.vocab missing or not an object");
        return -1;
    }
    size_t n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) n++;
    if (smap_init(&t->vocab, n)) goto oom;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id;
        const char *key = it->string;
        if (!key) continue;
        size_t kl = strlen(key);
        if (!json_id(it, &id)) {
            seterr(err, errlen, "tokenizer.json: vocab entry \"%.40s\" has an invalid id", key);
            return -1;
        }
        if (mdl_tok_int_utf8_check((const unsigned char *)key, kl) != kl) {
            seterr(err, errlen, "tokenizer.json: vocab entry with id %d is not valid UTF-8", (int)id);
            return -1;
        }
        smap_ent *e = smap_slot(&t->vocab, t->ar.p, key, kl);
        if (e->id >= 0) continue; /* duplicate key: keep the first */
        uint32_t off;
        if (arena_add(&t->ar, key, kl, &off)) goto oom;
        e->off = off;
        e->len = (uint32_t)kl;
        e->id = id;
        t->vocab.n++;
        if (ensure_ids(t, id, idcap)) goto oom;
        if (!(t->flags[id] & F_VOCAB)) {
            t->flags[id] |= F_VOCAB;
            t->tok_off[id] = off;
            t->tok_len[id] = (uint32_t)kl;
        }
    }
    return 0;
oom:
    seterr(err, errlen, "out of memory loading vocab");
    return -1;
}

static int merge_split(const cJSON *m, size_t rank, const char **a, size_t *al, const char **b,
                       size_t *bl, char *err, size_t errlen) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring;
        const char *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) {
            seterr(err, errlen, "tokenizer.json: bad merge #%zu \"%.40s\" (expected \"a b\")", rank + 1, s);
            return -1;
        }
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = strlen(sp + 1);
        return 0;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2) {
        const cJSON *x = cJSON_GetArrayItem(m, 0), *y = cJSON_GetArrayItem(m, 1);
        if (cJSON_IsString(x) && cJSON_IsString(y)) {
            *a = x->valuestring;
            *al = strlen(x->valuestring);
            *b = y->valuestring;
            *bl = strlen(y->valuestring);
            return 0;
        }
    }
    seterr(err, errlen, "tokenizer.json: bad merge #%zu (expected \"a b\" or [a, b])", rank + 1);
    return -1;
}

static int load_merges(mdl_tokenizer *t, const cJSON *merges, char *err, size_t errlen) {
    if (!cJSON_IsArray(merges)) {
        seterr(err, errlen, "tokenizer.json: model.merges missing or not an array");
        return -1;
    }
    size_t n = (size_t)cJSON_GetArraySize(merges);
    t->merges_cap = pow2_at_least(n * 2 + 1);
    t->merges = malloc(t->merges_cap * sizeof *t->merges);
    char *buf = NULL;
    size_t bufcap = 0;
    if (!t->merges) goto oom;
    for (size_t i = 0; i < t->merges_cap; i++) t->merges[i].key = UINT64_MAX;
    size_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        if (cJSON_IsString(m) && strncmp(m->valuestring, "#version", 8) == 0) continue;
        const char *a, *b;
        size_t al, bl;
        if (merge_split(m, rank, &a, &al, &b, &bl, err, errlen)) goto fail;
        int32_t ia = vocab_get(t, a, al), ib = vocab_get(t, b, bl);
        if (ia < 0 || ib < 0) {
            seterr(err, errlen, "tokenizer.json: merge #%zu: token \"%.*s\" not in vocab", rank + 1,
                   (int)(ia < 0 ? (al > 40 ? 40 : al) : (bl > 40 ? 40 : bl)), ia < 0 ? a : b);
            goto fail;
        }
        if (al + bl > bufcap) {
            bufcap = (al + bl) * 2 + 64;
            char *nb = realloc(buf, bufcap);
            if (!nb) goto oom;
            buf = nb;
        }
        memcpy(buf, a, al);
        memcpy(buf + al, b, bl);
        int32_t nid = vocab_get(t, buf, al + bl);
        if (nid < 0) {
            seterr(err, errlen, "tokenizer.json: merge #%zu: result \"%.*s\" not in vocab", rank + 1,
                   (int)(al + bl > 40 ? 40 : al + bl), buf);
            goto fail;
        }
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        size_t mask = t->merges_cap - 1, h = (size_t)hash_u64(key) & mask;
        while (t->merges[h].key != UINT64_MAX && t->merges[h].key != key) h = (h + 1) & mask;
        t->merges[h].key = key; /* a repeated pair takes the later rank, as in the reference */
        t->merges[h].rank = (uint32_t)rank;
        t->merges[h].new_id = nid;
        rank++;
    }
    free(buf);
    return 0;
oom:
    seterr(err, errlen, "out of memory loading merges");
fail:
    free(buf);
    return -1;
}

static int load_model(mdl_tokenizer *t, const cJSON *model, int32_t *idcap, char *err, size_t errlen) {
    if (!cJSON_IsObject(model)) {
        seterr(err, errlen, "tokenizer.json: missing \"model\"");
        return -1;
    }
    const char *type = json_type(model);
    if (type && strcmp(type, "BPE") != 0) {
        seterr(err, errlen, "tokenizer.json: unsupported model type \"%.40s\" (only BPE)", type);
        return -1;
    }
    if (!type && !cJSON_GetObjectItemCaseSensitive(model, "merges")) {
        seterr(err, errlen, "tokenizer.json: model has no \"type\" and no merges (only BPE is supported)");
        return -1;
    }
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0)) {
        seterr(err, errlen, "tokenizer.json: BPE dropout is not supported");
        return -1;
    }
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(model, affixes[k]);
        if (a && !cJSON_IsNull(a) && !(cJSON_IsString(a) && a->valuestring[0] == 0)) {
            seterr(err, errlen, "tokenizer.json: BPE %s is not supported", affixes[k]);
            return -1;
        }
    }
    if (json_bool(model, "ignore_merges", false, &t->ignore_merges) ||
        json_bool(model, "byte_fallback", false, &t->byte_fallback) ||
        json_bool(model, "fuse_unk", false, &t->fuse_unk)) {
        seterr(err, errlen, "tokenizer.json: BPE flags must be booleans");
        return -1;
    }
    if (load_vocab(t, cJSON_GetObjectItemCaseSensitive(model, "vocab"), idcap, err, errlen)) return -1;
    if (load_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), err, errlen)) return -1;
    t->unk_id = -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) t->unk_id = vocab_get(t, unk->valuestring, strlen(unk->valuestring));
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t l = mdl_tok_int_utf8_enc(mdl_tok_int_byte_cp((uint8_t)b), s);
        t->byte_id[b] = vocab_get(t, s, l);
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->byte_fb[b] = t->byte_fallback ? vocab_get(t, s, strlen(s)) : -1;
    }
    return 0;
}

static int load_added(mdl_tokenizer *t, const cJSON *arr, int32_t *idcap, char *err, size_t errlen) {
    if (!arr || cJSON_IsNull(arr)) return 0;
    if (!cJSON_IsArray(arr)) {
        seterr(err, errlen, "tokenizer.json: added_tokens is not an array");
        return -1;
    }
    size_t n = (size_t)cJSON_GetArraySize(arr);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added || smap_init(&t->added_map, n)) goto oom;
    /* ids follow the reference: a content already in the model vocabulary takes that id, any other
     * takes the next id after the model vocabulary (the file's "id" is only cross-checked there). */
    int32_t next_id = (int32_t)t->vocab.n;
    size_t k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        int32_t file_id = -1;
        if (!cJSON_IsObject(it) || !json_str_ok(content) ||
            !json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &file_id)) {
            seterr(err, errlen, "tokenizer.json: added_tokens[%zu] needs an \"id\" and a UTF-8 \"content\"", k);
            return -1;
        }
        added_tok a = {0};
        if (json_bool(it, "special", false, &a.special) ||
            json_bool(it, "single_word", false, &a.single_word) ||
            json_bool(it, "lstrip", false, &a.lstrip) || json_bool(it, "rstrip", false, &a.rstrip) ||
            json_bool(it, "normalized", !a.special, &a.normalized)) {
            seterr(err, errlen, "tokenizer.json: added_tokens[%zu] has a non-boolean flag", k);
            return -1;
        }
        k++;
        const char *c = content->valuestring;
        size_t cl = strlen(c);
        if (cl == 0) continue;
        smap_ent *e = smap_slot(&t->added_map, t->ar.p, c, cl);
        int32_t id;
        if (e->id >= 0) {
            id = e->id;
        } else {
            id = vocab_get(t, c, cl);
            if (id < 0) {
                if (next_id >= MDL_TOK_MAX_ID) {
                    seterr(err, errlen, "tokenizer.json: too many tokens");
                    return -1;
                }
                id = next_id++;
            }
        }
        uint32_t off;
        if (arena_add(&t->ar, c, cl, &off)) goto oom;
        a.off = a.moff = off;
        a.len = a.mlen = (uint32_t)cl;
        a.id = id;
        if (e->id < 0) {
            e->off = off;
            e->len = (uint32_t)cl;
            e->id = id;
            t->added_map.n++;
            t->added[t->n_added++] = a;
        } else {
            for (size_t i = 0; i < t->n_added; i++)
                if (t->added[i].id == id) t->added[i] = a; /* a repeated content: last flags win */
        }
        if (ensure_ids(t, id, idcap)) goto oom;
    }
    /* flags per id */
    for (size_t i = 0; i < t->n_added; i++) {
        added_tok *a = &t->added[i];
        t->flags[a->id] |= F_ADDED;
        if (a->special) t->flags[a->id] |= F_SPECIAL;
        t->tok_off[a->id] = a->off;
        t->tok_len[a->id] = a->len;
    }
    return 0;
oom:
    seterr(err, errlen, "out of memory loading added tokens");
    return -1;
}

static int set_cmp(const void *pa, const void *pb, void *ctx) {
    const mdl_tokenizer *t = ctx;
    const added_tok *a = &t->added[*(const uint32_t *)pa], *b = &t->added[*(const uint32_t *)pb];
    unsigned char fa = (unsigned char)t->ar.p[a->moff], fb = (unsigned char)t->ar.p[b->moff];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->mlen != b->mlen) return a->mlen > b->mlen ? -1 : 1;
    return a->id < b->id ? -1 : (a->id > b->id);
}

static int build_set(mdl_tokenizer *t, added_set *s, bool normalized) {
    s->idx = malloc((t->n_added ? t->n_added : 1) * sizeof *s->idx);
    if (!s->idx) return -1;
    s->n = 0;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized) s->idx[s->n++] = (uint32_t)i;
    qsort_r(s->idx, s->n, sizeof *s->idx, set_cmp, t);
    size_t j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < s->n && (unsigned char)t->ar.p[t->added[s->idx[j]].moff] < b) j++;
        s->first[b] = j;
    }
    s->first[256] = s->n;
    return 0;
}

static int finish_tables(mdl_tokenizer *t, char *err, size_t errlen) {
    /* normalized forms of normalized added tokens */
    if (t->nfc) {
        for (size_t i = 0; i < t->n_added; i++) {
            added_tok *a = &t->added[i];
            if (!a->normalized) continue;
            char *o = NULL;
            size_t ol = 0;
            int r = mdl_tok_int_nfc(t->ar.p + a->off, a->len, &o, &ol);
            if (r < 0) goto oom;
            if (r == 1) {
                uint32_t off;
                int rc = arena_add(&t->ar, o, ol, &off);
                free(o);
                if (rc) goto oom;
                a->moff = off;
                a->mlen = (uint32_t)ol;
            }
        }
    }
    if (build_set(t, &t->set_raw, false) || build_set(t, &t->set_norm, true)) goto oom;
    /* decoded bytes per id */
    t->dec_off = calloc((size_t)t->n_ids + 1, sizeof *t->dec_off);
    t->dec_len = calloc((size_t)t->n_ids + 1, sizeof *t->dec_len);
    if (!t->dec_off || !t->dec_len) goto oom;
    char *tmp = NULL;
    size_t tmpcap = 0;
    for (int32_t id = 0; id < t->n_ids; id++) {
        uint8_t f = t->flags[id];
        if (!(f & (F_VOCAB | F_ADDED))) continue;
        uint32_t len = t->tok_len[id];
        if (f & F_ADDED) { /* added tokens decode to their content */
            t->dec_off[id] = t->tok_off[id];
            t->dec_len[id] = len;
            continue;
        }
        if (len > tmpcap) {
            tmpcap = (size_t)len * 2 + 16;
            char *nt = realloc(tmp, tmpcap);
            if (!nt) {
                free(tmp);
                goto oom;
            }
            tmp = nt;
        }
        const unsigned char *s = (const unsigned char *)tokstr(t, t->tok_off[id]);
        size_t o = 0, i = 0;
        bool ok = true;
        while (i < len) {
            uint32_t cp;
            i += mdl_tok_int_utf8_dec(s + i, len - i, &cp);
            int b = mdl_tok_int_cp_byte(cp);
            if (b < 0) {
                ok = false;
                break;
            }
            tmp[o++] = (char)b;
        }
        if (!ok) { /* as the reference: a token outside the byte alphabet decodes to itself */
            t->dec_off[id] = t->tok_off[id];
            t->dec_len[id] = len;
            continue;
        }
        uint32_t off;
        if (arena_add(&t->ar, tmp, o, &off)) {
            free(tmp);
            goto oom;
        }
        t->dec_off[id] = off;
        t->dec_len[id] = (uint32_t)o;
    }
    free(tmp);
    /* \w of the reference regex engine, for single_word added tokens */
    bool need_word = false;
    for (size_t i = 0; i < t->n_added; i++) need_word |= t->added[i].single_word;
    if (need_word) {
        t->word_re = compile_re("[\\p{L}\\p{Nl}\\p{Nd}\\p{M}\\p{Pc}\\x{200c}\\x{200d}]", false, err, errlen);
        if (!t->word_re) return -1;
    }
    return 0;
oom:
    seterr(err, errlen, "out of memory");
    return -1;
}

/* tokenizer_config.json --------------------------------------------------------------------- */

static int config_token(mdl_tokenizer *t, const cJSON *cfg, const char *name, int32_t *out,
                        char *err, size_t errlen) {
    *out = -1;
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, name);
    if (!j || cJSON_IsNull(j)) return 0;
    if (cJSON_IsObject(j)) j = cJSON_GetObjectItemCaseSensitive(j, "content");
    if (!cJSON_IsString(j)) {
        seterr(err, errlen, "tokenizer_config.json: %s must be a string, {\"content\": ...} or null", name);
        return -1;
    }
    int32_t id = mdl_tok_token_id(t, j->valuestring);
    if (id < 0) {
        seterr(err, errlen, "tokenizer_config.json: %s \"%.60s\" is not a known token", name, j->valuestring);
        return -1;
    }
    *out = id;
    return 0;
}

static int detect_family(const char *tmpl, mdl_chat_family *fam, char *err, size_t errlen) {
    /* the Qwen3 and Llama-3.1 templates are told from their older relatives by what only they hold */
    if (strstr(tmpl, "<|im_start|>")) {
        *fam = strstr(tmpl, "enable_thinking") || strstr(tmpl, "<think>") ? MDL_CHAT_QWEN3 : MDL_CHAT_CHATML;
        return 0;
    }
    if (strstr(tmpl, "<|start_header_id|>")) {
        *fam = strstr(tmpl, "Cutting Knowledge Date") ? MDL_CHAT_LLAMA31 : MDL_CHAT_LLAMA3;
        return 0;
    }
    char head[61];
    size_t i = 0;
    for (; tmpl[i] && i < 60; i++) head[i] = (tmpl[i] == '\n' || tmpl[i] == '\r') ? ' ' : tmpl[i];
    head[i] = 0;
    seterr(err, errlen,
           "tokenizer_config.json: unrecognized chat_template \"%s%s\" (supported: ChatML "
           "<|im_start|>, Llama-3 <|start_header_id|>)",
           head, tmpl[i] ? "..." : "");
    return -1;
}

static int load_config(mdl_tokenizer *t, const char *dir, char *err, size_t errlen) {
    size_t pl = strlen(dir) + 64;
    char *path = malloc(pl);
    if (!path) {
        seterr(err, errlen, "out of memory");
        return -1;
    }
    snprintf(path, pl, "%s/tokenizer_config.json", dir);
    cJSON *cfg = parse_json_file(path, err, errlen);
    int rc = -1;
    if (!cfg) goto done;
    if (!cJSON_IsObject(cfg)) {
        seterr(err, errlen, "%s: not a JSON object", path);
        goto done;
    }
    if (config_token(t, cfg, "bos_token", &t->bos, err, errlen) ||
        config_token(t, cfg, "eos_token", &t->eos, err, errlen))
        goto done;
    /* add_bos_token / add_eos_token are not read: transformers' AutoTokenizer (5.24.0, checked by
     * tests/data/tokenizer/expected_add_special.jsonl) keeps tokenizer.json's post_processor for a
     * byte-level tokenizer whatever they say (TokenizersBackend, Qwen2Tokenizer, GPT2Tokenizer: Llama-3
     * gets <|begin_of_text|> from its TemplateProcessing, Qwen nothing from ByteLevel). Only the
     * SentencePiece-era Llama/Gemma classes of transformers 4.x rebuilt it from those keys
     * (LlamaTokenizerFast.update_post_processor), and their tokenizers are not byte-level. */
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    t->chat = MDL_CHAT_NONE;
    if (cJSON_IsArray(ct)) { /* [{"name": ..., "template": ...}]: use "default", else the first */
        const cJSON *it, *pick = NULL;
        cJSON_ArrayForEach(it, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
            if (!pick || (cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0)) pick = it;
        }
        ct = pick ? cJSON_GetObjectItemCaseSensitive(pick, "template") : NULL;
    }
    if (cJSON_IsString(ct)) {
        if (detect_family(ct->valuestring, &t->chat, err, errlen)) goto done;
    } else if (ct && !cJSON_IsNull(ct)) {
        seterr(err, errlen, "tokenizer_config.json: chat_template is not a string");
        goto done;
    } else {
        /* newer checkpoints keep the template in chat_template.jinja */
        snprintf(path, pl, "%s/chat_template.jinja", dir);
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            size_t len;
            char *tmpl = read_file(path, &len, err, errlen);
            if (!tmpl) goto done;
            int r = detect_family(tmpl, &t->chat, err, errlen);
            free(tmpl);
            if (r) goto done;
        }
    }
    rc = 0;
done:
    cJSON_Delete(cfg);
    free(path);
    return rc;
}

mdl_tokenizer *mdl_tok_load(const char *dir, char *err, size_t errlen) {
    if (!dir) {
        seterr(err, errlen, "no tokenizer directory");
        return NULL;
    }
    mdl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        seterr(err, errlen, "out of memory");
        return NULL;
    }
    t->bos = t->eos = -1;
    t->unk_id = -1;
    size_t pl = strlen(dir) + 32;
    char *path = malloc(pl);
    cJSON *root = NULL;
    if (!path) {
        seterr(err, errlen, "out of memory");
        goto fail;
    }
    snprintf(path, pl, "%s/tokenizer.json", dir);
    root = parse_json_file(path, err, errlen);
    if (!root) goto fail;
    if (!cJSON_IsObject(root)) {
        seterr(err, errlen, "%s: not a JSON object", path);
        goto fail;
    }
    int32_t idcap = 0;
    if (load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"), &idcap, err, errlen)) goto fail;
    if (parse_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), 0, err, errlen))
        goto fail;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!pt || cJSON_IsNull(pt)) {
        seterr(err, errlen, "tokenizer.json: pre_tokenizer is null (a ByteLevel pre-tokenizer is required)");
        goto fail;
    }
    if (parse_pretok(t, pt, 0, err, errlen)) goto fail;
    if (t->n_steps == 0 || t->steps[t->n_steps - 1].kind != STEP_BYTELEVEL) {
        seterr(err, errlen, "tokenizer.json: pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
        goto fail;
    }
    if (parse_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), 0, err, errlen)) goto fail;
    if (load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), &idcap, err, errlen))
        goto fail;
    if (t->n_ids == 0) {
        seterr(err, errlen, "tokenizer.json: empty vocabulary");
        goto fail;
    }
    if (finish_tables(t, err, errlen)) goto fail;
    if (parse_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), 0, t->post_pre, &t->n_post_pre,
                   t->post_suf, &t->n_post_suf, err, errlen))
        goto fail;
    cJSON_Delete(root);
    root = NULL;
    if (load_config(t, dir, err, errlen)) goto fail;
    free(path);
    return t;
fail:
    cJSON_Delete(root);
    free(path);
    mdl_tok_free(t);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* accessors                                                                                  */

int32_t mdl_tok_vocab_size(const mdl_tokenizer *t) { return t ? t->n_ids : 0; }
int32_t mdl_tok_bos(const mdl_tokenizer *t) { return t ? t->bos : -1; }
int32_t mdl_tok_eos(const mdl_tokenizer *t) { return t ? t->eos : -1; }

size_t mdl_tok_special_ids(const mdl_tokenizer *t, int suffix, const int32_t **ids) {
    if (!t) {
        if (ids) *ids = NULL;
        return 0;
    }
    if (ids) *ids = suffix ? t->post_suf : t->post_pre;
    return suffix ? t->n_post_suf : t->n_post_pre;
}
mdl_chat_family mdl_tok_chat_family(const mdl_tokenizer *t) { return t ? t->chat : MDL_CHAT_NONE; }

int mdl_tok_is_special(const mdl_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_ids && (t->flags[id] & F_SPECIAL);
}

int32_t mdl_tok_token_id(const mdl_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t n = strlen(token);
    int32_t id = smap_get(&t->added_map, t->ar.p, token, n);
    if (id >= 0) return id;
    return vocab_get(t, token, n);
}

/* ------------------------------------------------------------------------------------------ */
/* encoding                                                                                   */

typedef struct {
    int32_t id, prev, next;
    uint32_t len; /* 0: merged away */
} bpe_sym;

typedef struct {
    uint32_t rank, pos;
    int32_t new_id;
} bpe_hent;

typedef struct {
    size_t start, end;
    bool match;
} span;

typedef struct {
    const mdl_tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    bpe_sym *syms;
    size_t syms_cap;
    bpe_hent *heap;
    size_t heap_cap;
    char *bl;
    size_t bl_cap;
    char *err;
    size_t errlen;
} enc_ctx;

static int emit(enc_ctx *c, int32_t id) {
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 256;
        int32_t *ni = realloc(c->ids, nc * sizeof *ni);
        if (!ni) {
            seterr(c->err, c->errlen, "out of memory");
            return -1;
        }
        c->ids = ni;
        c->cap = nc;
    }
    c->ids[c->n++] = id;
    return 0;
}

/* Leftmost-first regex search at or after `from`. Returns 1 with [*ms, *me), 0 for none, -1. */
static int re_search(enc_ctx *c, const pcre2_code *re, const char *s, size_t len, size_t from,
                     size_t *ms, size_t *me) {
    for (int attempt = 0; attempt < 3; attempt++) {
        uint32_t opts = PCRE2_NO_UTF_CHECK | (attempt == 2 ? PCRE2_NO_JIT : 0);
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, from, opts, c->md, c->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
            *ms = ov[0];
            *me = ov[1];
            if (*ms > *me || *me > len) { /* \K games; never for sane patterns */
                seterr(c->err, c->errlen, "pre-tokenizer regex returned an invalid match");
                return -1;
            }
            return 1;
        }
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && attempt == 0) {
            if (!c->jstack) {
                c->jstack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
                if (!c->mctx) c->mctx = pcre2_match_context_create(NULL);
                if (!c->jstack || !c->mctx) break;
                pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
            }
            continue;
        }
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && attempt == 1) continue; /* try the interpreter */
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        seterr(c->err, c->errlen, "pre-tokenizer regex failed: %s", (const char *)msg);
        return -1;
    }
    seterr(c->err, c->errlen, "pre-tokenizer regex failed: out of memory");
    return -1;
}

typedef struct {
    span *v;
    size_t n, cap;
} span_list;

static int span_push(enc_ctx *c, span_list *l, size_t a, size_t b, bool m) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 32;
        span *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) {
            seterr(c->err, c->errlen, "out of memory");
            return -1;
        }
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = (span){a, b, m};
    return 0;
}

/* All matches of re in s, as contiguous spans covering [0, len) flagged match / no match.
 * Empty matches are kept (they split the text) except directly after the previous match, exactly
 * like the reference's find_iter. */
static int find_spans(enc_ctx *c, const pcre2_code *re, const char *s, size_t len, span_list *out) {
    out->n = 0;
    size_t prev = 0, from = 0, last_end = 0;
    bool have_last = false;
    while (from <= len) {
        size_t ms, me;
        int r = re_search(c, re, s, len, from, &ms, &me);
        if (r < 0) return -1;
        if (r == 0) break;
        if (ms == me && have_last && last_end == me) {
            if (from >= len) break;
            uint32_t cp;
            from += mdl_tok_int_utf8_dec((const unsigned char *)s + from, len - from, &cp);
            continue;
        }
        if (prev != ms && span_push(c, out, prev, ms, false)) return -1;
        if (span_push(c, out, ms, me, true)) return -1;
        prev = me;
        from = me;
        last_end = me;
        have_last = true;
    }
    if (prev != len && span_push(c, out, prev, len, false)) return -1;
    return 0;
}

/* Applies a split behaviour to spans in place (result: pieces to keep, match flag unused). */
static void apply_behavior(span_list *l, split_beh beh, bool invert) {
    if (invert)
        for (size_t i = 0; i < l->n; i++) l->v[i].match = !l->v[i].match;
    size_t o = 0;
    bool prev_match = false;
    switch (beh) {
    case BEH_ISOLATED:
        return;
    case BEH_REMOVED:
        for (size_t i = 0; i < l->n; i++)
            if (!l->v[i].match) l->v[o++] = l->v[i];
        break;
    case BEH_CONTIGUOUS:
        for (size_t i = 0; i < l->n; i++) {
            bool m = l->v[i].match;
            if (m == prev_match && o > 0)
                l->v[o - 1].end = l->v[i].end;
            else
                l->v[o++] = l->v[i];
            prev_match = m;
        }
        break;
    case BEH_MERGED_PREV:
        for (size_t i = 0; i < l->n; i++) {
            bool m = l->v[i].match;
            if (m && !prev_match && o > 0)
                l->v[o - 1].end = l->v[i].end;
            else
                l->v[o++] = l->v[i];
            prev_match = m;
        }
        break;
    case BEH_MERGED_NEXT: {
        /* right to left, writing from the end, then compact to the front */
        size_t w = l->n;
        for (size_t k = l->n; k-- > 0;) {
            span sp = l->v[k];
            if (sp.match && !prev_match && w < l->n)
                l->v[w].start = sp.start;
            else
                l->v[--w] = sp;
            prev_match = sp.match;
        }
        for (size_t i = w; i < l->n; i++) l->v[o++] = l->v[i];
        break;
    }
    }
    l->n = o;
}

static int heap_push(enc_ctx *c, size_t *hn, bpe_hent e) {
    bpe_hent *h = c->heap;
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < e.rank || (h[p].rank == e.rank && h[p].pos <= e.pos)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
    return 0;
}

static bpe_hent heap_pop(enc_ctx *c, size_t *hn) {
    bpe_hent *h = c->heap;
    bpe_hent top = h[0], last = h[--(*hn)];
    size_t n = *hn, i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bpe_hent *best = &last;
        if (l < n && (h[l].rank < best->rank || (h[l].rank == best->rank && h[l].pos < best->pos))) {
            m = l;
            best = &h[l];
        }
        if (r < n && (h[r].rank < best->rank || (h[r].rank == best->rank && h[r].pos < best->pos))) {
            m = r;
            best = &h[r];
        }
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (n > 0) h[i] = last;
    return top;
}

static int add_sym(enc_ctx *c, size_t *ns, int32_t id, uint32_t len) {
    if (*ns == c->syms_cap) {
        size_t nc = c->syms_cap ? c->syms_cap * 2 : 256;
        bpe_sym *n = realloc(c->syms, nc * sizeof *n);
        if (!n) {
            seterr(c->err, c->errlen, "out of memory");
            return -1;
        }
        c->syms = n;
        c->syms_cap = nc;
    }
    c->syms[*ns] = (bpe_sym){id, (int32_t)*ns - 1, (int32_t)*ns + 1, len};
    (*ns)++;
    return 0;
}

/* BPE on one pre-tokenized piece (raw bytes; mapped to the byte-level alphabet here). */
static int bpe_piece(enc_ctx *c, const unsigned char *s, size_t len) {
    const mdl_tokenizer *t = c->t;
    if (len == 0) return 0;
    if (len > (size_t)INT32_MAX / 4) {
        seterr(c->err, c->errlen, "text piece too long");
        return -1;
    }
    if (t->ignore_merges) {
        if (len * 2 > c->bl_cap) {
            size_t nc = len * 2 + 64;
            char *nb = realloc(c->bl, nc);
            if (!nb) {
                seterr(c->err, c->errlen, "out of memory");
                return -1;
            }
            c->bl = nb;
            c->bl_cap = nc;
        }
        size_t o = 0;
        for (size_t i = 0; i < len; i++) o += mdl_tok_int_utf8_enc(mdl_tok_int_byte_cp(s[i]), c->bl + o);
        int32_t id = vocab_get(t, c->bl, o);
        if (id >= 0) return emit(c, id);
    }
    /* initial symbols: one per byte-level character (= per byte) */
    size_t ns = 0;
    int32_t unk_pending = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id >= 0) {
            if (unk_pending >= 0) {
                if (add_sym(c, &ns, unk_pending, unk_len)) return -1;
                unk_pending = -1;
            }
            if (add_sym(c, &ns, id, 1)) return -1;
            continue;
        }
        if (t->byte_fallback) {
            /* the reference falls back on the bytes of the byte-level character's UTF-8 */
            char u[4];
            size_t ul = mdl_tok_int_utf8_enc(mdl_tok_int_byte_cp(s[i]), u), k;
            for (k = 0; k < ul; k++)
                if (t->byte_fb[(unsigned char)u[k]] < 0) break;
            if (k == ul) {
                for (k = 0; k < ul; k++)
                    if (add_sym(c, &ns, t->byte_fb[(unsigned char)u[k]], 1)) return -1;
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk_pending >= 0 && t->fuse_unk) {
                unk_len++;
            } else {
                if (unk_pending >= 0 && add_sym(c, &ns, unk_pending, unk_len)) return -1;
                unk_pending = t->unk_id;
                unk_len = 1;
            }
        }
        /* else: the character is dropped, as in the reference without an unk token */
    }
    if (unk_pending >= 0 && add_sym(c, &ns, unk_pending, unk_len)) return -1;
    if (ns == 0) return 0;
    c->syms[ns - 1].next = -1;
    if (ns > 1) {
        size_t need = ns * 3 + 1;
        if (need > c->heap_cap) {
            bpe_hent *nh = realloc(c->heap, need * sizeof *nh);
            if (!nh) {
                seterr(c->err, c->errlen, "out of memory");
                return -1;
            }
            c->heap = nh;
            c->heap_cap = need;
        }
        size_t hn = 0;
        bpe_sym *y = c->syms;
        for (size_t i = 0; i + 1 < ns; i++) {
            const merge_ent *m = merge_get(t, y[i].id, y[i + 1].id);
            if (m) heap_push(c, &hn, (bpe_hent){m->rank, (uint32_t)i, m->new_id});
        }
        while (hn > 0) {
            bpe_hent top = heap_pop(c, &hn);
            bpe_sym *cur = &y[top.pos];
            if (cur->len == 0 || cur->next < 0) continue;
            bpe_sym *right = &y[cur->next];
            const merge_ent *m = merge_get(t, cur->id, right->id);
            if (!m || m->new_id != top.new_id) continue; /* stale entry */
            cur->id = top.new_id;
            cur->len += right->len;
            cur->next = right->next;
            right->len = 0;
            if (cur->next >= 0) y[cur->next].prev = (int32_t)top.pos;
            if (cur->prev >= 0) {
                const merge_ent *pm = merge_get(t, y[cur->prev].id, cur->id);
                if (pm) heap_push(c, &hn, (bpe_hent){pm->rank, (uint32_t)cur->prev, pm->new_id});
            }
            if (cur->next >= 0) {
                const merge_ent *nm = merge_get(t, cur->id, y[cur->next].id);
                if (nm) heap_push(c, &hn, (bpe_hent){nm->rank, top.pos, nm->new_id});
            }
        }
    }
    for (int32_t i = 0; i >= 0; i = c->syms[i].next)
        if (emit(c, c->syms[i].id)) return -1;
    return 0;
}

static int pretok(enc_ctx *c, size_t step, const char *s, size_t len);

static int split_and_continue(enc_ctx *c, const pcre2_code *re, split_beh beh, bool invert,
                              size_t next_step, const char *s, size_t len, bool to_bpe) {
    span_list l = {0};
    int rc = -1;
    if (find_spans(c, re, s, len, &l)) goto done;
    apply_behavior(&l, beh, invert);
    for (size_t i = 0; i < l.n; i++) {
        if (l.v[i].end <= l.v[i].start) continue;
        const char *p = s + l.v[i].start;
        size_t pl = l.v[i].end - l.v[i].start;
        if (to_bpe ? bpe_piece(c, (const unsigned char *)p, pl) : pretok(c, next_step, p, pl))
            goto done;
    }
    rc = 0;
done:
    free(l.v);
    return rc;
}

static int pretok(enc_ctx *c, size_t step, const char *s, size_t len) {
    if (len == 0) return 0;
    const pretok_step *st = &c->t->steps[step];
    if (st->kind == STEP_SPLIT) return split_and_continue(c, st->re, st->beh, st->invert, step + 1, s, len, false);
    /* ByteLevel (always the last step) */
    char *tmp = NULL;
    if (st->add_prefix_space && s[0] != ' ') {
        tmp = malloc(len + 1);
        if (!tmp) {
            seterr(c->err, c->errlen, "out of memory");
            return -1;
        }
        tmp[0] = ' ';
        memcpy(tmp + 1, s, len);
        s = tmp;
        len++;
    }
    int rc = st->re ? split_and_continue(c, st->re, BEH_ISOLATED, false, step + 1, s, len, true)
                    : bpe_piece(c, (const unsigned char *)s, len);
    free(tmp);
    return rc;
}

/* \w of the reference engine at the character starting at s[i] */
static bool word_at(enc_ctx *c, const char *s, size_t len, size_t i) {
    int rc = pcre2_match(c->t->word_re, (PCRE2_SPTR)s, len, i, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK,
                         c->md, NULL);
    return rc >= 0;
}

static size_t prev_char(const char *s, size_t i) {
    do i--;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

static int segment(enc_ctx *c, int level, const char *s, size_t len, int parse_special);

/* Splits s on the added tokens of one set (leftmost-longest), passing the gaps on. */
static int added_pass(enc_ctx *c, int level, const added_set *set, const char *s, size_t len,
                      int parse_special) {
    const mdl_tokenizer *t = c->t;
    if (set->n == 0) return segment(c, level + 1, s, len, parse_special);
    size_t start_offset = 0, pos = 0;
    while (pos < len) {
        unsigned char b = (unsigned char)s[pos];
        const added_tok *hit = NULL;
        for (size_t k = set->first[b]; k < set->first[b + 1]; k++) {
            const added_tok *a = &t->added[set->idx[k]];
            if (a->mlen <= len - pos && memcmp(s + pos, t->ar.p + a->moff, a->mlen) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            pos++;
            continue;
        }
        size_t ms = pos, me = pos + hit->mlen;
        pos = me;
        if (!parse_special && hit->special) continue;
        if (hit->single_word) {
            bool before = ms > 0 && word_at(c, s, len, prev_char(s, ms));
            bool after = me < len && word_at(c, s, len, me);
            if (before || after) continue;
        }
        if (hit->lstrip) {
            size_t ns = ms;
            while (ns > 0) {
                size_t p = prev_char(s, ns);
                uint32_t cp;
                mdl_tok_int_utf8_dec((const unsigned char *)s + p, ns - p, &cp);
                if (!is_white_space(cp)) break;
                ns = p;
            }
            ms = ns > start_offset ? ns : start_offset;
        }
        if (hit->rstrip) {
            while (me < len) {
                uint32_t cp;
                size_t l = mdl_tok_int_utf8_dec((const unsigned char *)s + me, len - me, &cp);
                if (!is_white_space(cp)) break;
                me += l;
            }
            if (me > pos) pos = me;
        }
        if (start_offset < ms && segment(c, level + 1, s + start_offset, ms - start_offset, parse_special))
            return -1;
        if (emit(c, hit->id)) return -1;
        start_offset = me;
    }
    if (start_offset < len && segment(c, level + 1, s + start_offset, len - start_offset, parse_special))
        return -1;
    return 0;
}

/* level 0: raw text -> non-normalized added tokens; level 1: normalize, then normalized added
 * tokens; level 2: pre-tokenize + BPE. */
static int segment(enc_ctx *c, int level, const char *s, size_t len, int parse_special) {
    if (len == 0) return 0;
    if (level == 0) return added_pass(c, 0, &c->t->set_raw, s, len, parse_special);
    if (level == 1) {
        if (!c->t->nfc) return added_pass(c, 1, &c->t->set_norm, s, len, parse_special);
        char *o = NULL;
        size_t ol = 0;
        int r = mdl_tok_int_nfc(s, len, &o, &ol);
        if (r < 0) {
            seterr(c->err, c->errlen, "out of memory");
            return -1;
        }
        int rc = r == 1 ? added_pass(c, 1, &c->t->set_norm, o, ol, parse_special)
                        : added_pass(c, 1, &c->t->set_norm, s, len, parse_special);
        free(o);
        return rc;
    }
    return pretok(c, 0, s, len);
}

int mdl_tok_encode(const mdl_tokenizer *t, const char *text, size_t len, int parse_special,
                   int32_t *out, size_t cap, size_t *n, char *err, size_t errlen) {
    if (n) *n = 0;
    if (!t || (!text && len) || !n || (!out && cap)) {
        seterr(err, errlen, "invalid arguments");
        return -1;
    }
    if (len == 0) return 0;
    size_t bad = mdl_tok_int_utf8_check((const unsigned char *)text, len);
    if (bad != len) {
        seterr(err, errlen, "invalid UTF-8 at byte offset %zu", bad);
        return -1;
    }
    enc_ctx c = {.t = t, .err = err, .errlen = errlen};
    c.md = pcre2_match_data_create(1, NULL);
    int rc = -1;
    if (!c.md) {
        seterr(err, errlen, "out of memory");
        goto done;
    }
    if (segment(&c, 0, text, len, parse_special)) goto done;
    size_t k = c.n < cap ? c.n : cap;
    if (k) memcpy(out, c.ids, k * sizeof *out);
    *n = c.n;
    rc = 0;
done:
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mctx);
    pcre2_jit_stack_free(c.jstack);
    free(c.ids);
    free(c.syms);
    free(c.heap);
    free(c.bl);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* decoding                                                                                   */

int mdl_tok_decode(const mdl_tokenizer *t, const int32_t *ids, size_t n_ids, int skip_special,
                   char *out, size_t cap, size_t *n, char *err, size_t errlen) {
    if (n) *n = 0;
    if (!t || (!ids && n_ids) || !n || (!out && cap)) {
        seterr(err, errlen, "invalid arguments");
        return -1;
    }
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids) {
            seterr(err, errlen, "token id %d out of range [0, %d) at position %zu", (int)id,
                   (int)t->n_ids, i);
            return -1;
        }
        if (skip_special && (t->flags[id] & F_SPECIAL)) continue;
        uint32_t l = t->dec_len[id];
        if (total < cap) {
            size_t k = cap - total < l ? cap - total : l;
            memcpy(out + total, t->ar.p + t->dec_off[id], k);
        }
        total += l;
    }
    *n = total;
    return 0;
}

int mdl_tok_piece(const mdl_tokenizer *t, int32_t id, char *out, size_t cap, size_t *n) {
    if (n) *n = 0;
    if (!t || !n || (!out && cap) || id < 0 || id >= t->n_ids) return -1;
    uint32_t l = t->dec_len[id];
    size_t k = cap < l ? cap : l;
    if (k) memcpy(out, t->ar.p + t->dec_off[id], k);
    *n = l;
    return 0;
}
