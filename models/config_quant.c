/* models/config_quant.c — config.json's quantization_config: block FP8 (quant_method "fp8", as
 * Qwen3-FP8 and DeepSeek-V3 ship it) and compressed-tensors FP8 (quant_method "compressed-tensors",
 * as llm-compressor writes its FP8, FP8_DYNAMIC and FP8_BLOCK schemes). Both end in the same model
 * state (mdl_config.fp8*): which projections are FP8 (fp8_skip), what a scale covers (fp8_scheme,
 * fp8_b0 x fp8_b1) and what the scale tensors are called (fp8_ct). Every other scheme, and every FP8
 * variant whose math graphswap does not run, is refused naming the field. */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "models/config.h"
#include "models/config_internal.h"

#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The projections of a layer, as checkpoint module names after "model.layers.N." */
static const char *const proj_part[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                         "mlp.down_proj"};

/* Which projections a scheme quantizes: quantized(mod, u) is 1 (FP8), 0 (kept), or -1 (refused,
 * err written). */
typedef int (*quantized_fn)(const char *mod, void *u, char *err, size_t errlen);

/* A sparse layer's experts (Qwen3-MoE): hit[4..6] as for a dense layer's gate / up / down, from
 * every expert's parts; the experts' gate and up rows are one stacked matrix (w13), their down rows
 * another (w2), and KOP_MOE_FFN reads both in one dtype, so every part is FP8 or none is. The router (mlp.gate) is never FP8: vLLM's
 * and SGLang's Qwen3-MoE build it unquantized, so FP8 checkpoints keep it in bf16; a
 * compressed-tensors config that targets it (check_router) is refused. */
static int expert_skips(const mdl_config *c, int l, quantized_fn quantized, void *u, int check_router, int *hit,
                        char *err, size_t errlen)
{
    static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
    char mod[128];
    int first[3] = {-1, -1, -1};
    for (int e = 0; e < c->n_experts; e++)
        for (int k = 0; k < 3; k++) {
            snprintf(mod, sizeof mod, "model.layers.%d.mlp.experts.%d.%s", l, e, part[k]);
            const int q = quantized(mod, u, err, errlen);
            if (q < 0) return -1;
            if (first[k] < 0) first[k] = q;
            if (q != first[k] || q != first[0]) {
                snprintf(err, errlen,
                         "config.json: quantization_config quantizes only some of layer %d's experts' projections "
                         "(%s: the experts' gate / up / down are stacked matrices that one kernel reads, all FP8 "
                         "or none)",
                         l, mod);
                return -1;
            }
        }
    hit[4] = hit[5] = !first[0];
    hit[6] = !first[2];
    snprintf(mod, sizeof mod, "model.layers.%d.mlp.gate", l);
    const int r = check_router ? quantized(mod, u, err, errlen) : 0;
    if (r < 0) return -1;
    if (r) {
        snprintf(err, errlen, "config.json: quantization_config quantizes the router %s (an FP8 router is not supported)",
                 mod);
        return -1;
    }
    return 0;
}

/* A drafter's modules outside its layers: fc (target features -> hidden) is a Linear that FP8
 * schemes quantize like a projection (fp8_fc). The DSpark heads (markov_head.markov_w1 / w2,
 * confidence_head.proj) are kept unquantized, like lm_head: a scheme that names them is refused.
 * The block "fp8" method names only what it skips, so with it those heads stay unquantized (a file
 * holding them in FP8 is refused by dtype, naming the tensor). */
static int drafter_heads(mdl_config *c, quantized_fn quantized, void *u, int check_heads, char *err, size_t errlen)
{
    const int q = quantized("fc", u, err, errlen);
    if (q < 0) return -1;
    c->fp8_fc = q;
    if (!check_heads) return 0;
    const char *head[3] = {"markov_head.markov_w1", "markov_head.markov_w2", "confidence_head.proj"};
    const int has[3] = {c->markov_rank > 0, c->markov_rank > 0, c->conf_head};
    for (int i = 0; i < 3; i++) {
        const int h = has[i] ? quantized(head[i], u, err, errlen) : 0;
        if (h < 0) return -1;
        if (h) {
            snprintf(err, errlen,
                     "config.json: compressed-tensors quantizes %s (FP8 DSpark heads are not supported; list it "
                     "in ignore)",
                     head[i]);
            return -1;
        }
    }
    return 0;
}

/* fp8_skip (and a drafter's fp8_fc) from the predicate; q / k / v and gate / up are one stacked
 * matrix each: all FP8 or none. check_router (compressed-tensors, whose "Linear" target reaches
 * every linear module): a targeted router or DSpark head is refused. */
static int set_skips(mdl_config *c, quantized_fn quantized, void *u, int check_router, char *err, size_t errlen)
{
    for (int l = 0; l < c->layers; l++) {
        int hit[7];
        for (int i = 0; i < 7; i++) {
            if (c->sparse[l] && i >= 4) break; /* the experts' parts instead (below) */
            char mod[96];
            snprintf(mod, sizeof mod, "%slayers.%d.%s", c->is_drafter ? "" : "model.", l, proj_part[i]);
            const int q = quantized(mod, u, err, errlen);
            if (q < 0) return -1;
            hit[i] = !q;
        }
        if (c->sparse[l] && expert_skips(c, l, quantized, u, check_router, hit, err, errlen) != 0) return -1;
        if (hit[0] + hit[1] + hit[2] == 1 || hit[0] + hit[1] + hit[2] == 2 || hit[4] != hit[5]) {
            snprintf(err, errlen,
                     "config.json: quantization_config leaves only some of layer %d's %s unquantized (they are "
                     "one stacked matrix: all or none)",
                     l, hit[4] != hit[5] ? "gate_proj / up_proj" : "q_proj / k_proj / v_proj");
            return -1;
        }
        c->fp8_skip[l] = (unsigned char)((hit[0] ? MDL_FP8_SKIP_QKV : 0) | (hit[3] ? MDL_FP8_SKIP_O : 0) |
                                         (hit[4] ? MDL_FP8_SKIP_GATE_UP : 0) | (hit[6] ? MDL_FP8_SKIP_DOWN : 0));
        if (c->is_drafter && (c->fp8_skip[l] ^ c->fp8_skip[0]) & MDL_FP8_SKIP_QKV) {
            snprintf(err, errlen,
                     "config.json: quantization_config quantizes the q / k / v of only some drafter layers (layer "
                     "%d differs from layer 0: every layer's k / v rows are copied into one stacked context K/V "
                     "matrix of one dtype)",
                     l);
            return -1;
        }
    }
    return c->is_drafter ? drafter_heads(c, quantized, u, check_router, err, errlen) : 0;
}

/* ---- quant_method "fp8" --------------------------------------------------------------------------- */

/* Does the list (modules_to_not_convert / ignored_layers) name module `mod` or a module containing
 * it ("model.layers.3" covers "model.layers.3.mlp.down_proj")? */
static int fp8_ignored(const cJSON *list, const char *mod)
{
    if (!list || cJSON_IsNull(list)) return 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        if (!cJSON_IsString(e)) continue;
        const size_t n = strlen(e->valuestring);
        if (n && strncmp(mod, e->valuestring, n) == 0 && (mod[n] == 0 || mod[n] == '.')) return 1;
    }
    return 0;
}

static int fp8_quantized(const char *mod, void *u, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    const cJSON *const *lists = u;
    return !fp8_ignored(lists[0], mod) && !fp8_ignored(lists[1], mod);
}

static int parse_fp8(const cJSON *q, mdl_config *c, char *err, size_t errlen)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(q, "fmt");
    if (fmt && !(cJSON_IsString(fmt) && strcmp(fmt->valuestring, "e4m3") == 0)) {
        snprintf(err, errlen, "config.json: quantization_config fmt must be \"e4m3\" (float8_e4m3fn weights)");
        return -1;
    }
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(q, "activation_scheme");
    if (as && !(cJSON_IsString(as) && strcmp(as->valuestring, "dynamic") == 0)) {
        snprintf(err, errlen,
                 "config.json: quantization_config activation_scheme must be \"dynamic\" (static activation "
                 "scales are not supported)");
        return -1;
    }
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(bs, 0)) ||
        !cJSON_IsNumber(cJSON_GetArrayItem(bs, 1))) {
        snprintf(err, errlen,
                 "config.json: quantization_config weight_block_size must be [rows, columns] (per-tensor FP8 "
                 "is not supported)");
        return -1;
    }
    const double b0 = cJSON_GetArrayItem(bs, 0)->valuedouble, b1 = cJSON_GetArrayItem(bs, 1)->valuedouble;
    if (!(b0 >= 1 && b0 <= 65536 && b0 == (int)b0) || !(b1 >= 16 && b1 <= 65536 && b1 == (int)b1) ||
        ((int)b1 & ((int)b1 - 1)) != 0) {
        snprintf(err, errlen,
                 "config.json: quantization_config weight_block_size [%g, %g]: rows must be >= 1 and columns a "
                 "power of two >= 16",
                 b0, b1);
        return -1;
    }
    c->fp8 = 1;
    c->fp8_scheme = MDL_FP8_BLOCK;
    c->fp8_b0 = (int)b0;
    c->fp8_b1 = (int)b1;
    const cJSON *lists[2] = {cJSON_GetObjectItemCaseSensitive(q, "modules_to_not_convert"),
                             cJSON_GetObjectItemCaseSensitive(q, "ignored_layers")};
    for (int li = 0; li < 2; li++)
        if (lists[li] && !cJSON_IsNull(lists[li]) && !cJSON_IsArray(lists[li])) {
            snprintf(err, errlen, "config.json: quantization_config %s must be a list of module names",
                     li ? "ignored_layers" : "modules_to_not_convert");
            return -1;
        }
    return set_skips(c, fp8_quantized, (void *)lists, 0, err, errlen);
}

/* ---- quant_method "compressed-tensors" ------------------------------------------------------------ */

/* Target matching as compressed-tensors does it (src/compressed_tensors/utils/match.py, commit
 * 0186d7ae2fe9, match_name / _match_class): a target "re:PAT" matches a module whose name PAT
 * matches from its first character (Python re.match: anchored at the start, not the end); any
 * other target matches the module of exactly that name, or by class name ("Linear": every
 * projection, lm_head and the MoE router are nn.Linear). Patterns come from an untrusted file:
 * each is compiled once, and matched under PCRE2 limits, so a pathological one fails instead of
 * running for ever. */
typedef struct {
    const char *s;   /* the target or ignore string */
    pcre2_code *re;  /* "re:" patterns; NULL for names */
    int ignore;      /* from the ignore list */
} ct_pat;

typedef struct {
    ct_pat *p;
    int n;
    pcre2_match_data *md;
    pcre2_match_context *mc;
} ct_ctx;

static void ct_free(ct_ctx *x)
{
    for (int i = 0; i < x->n; i++) pcre2_code_free(x->p[i].re);
    free(x->p);
    pcre2_match_data_free(x->md);
    pcre2_match_context_free(x->mc);
}

static int ct_add(ct_ctx *x, const cJSON *list, int ignore, char *err, size_t errlen)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        ct_pat *p = &x->p[x->n++];
        p->s = e->valuestring;
        p->ignore = ignore;
        p->re = NULL;
        if (strncmp(p->s, "re:", 3) != 0) continue;
        int ec;
        PCRE2_SIZE eo;
        p->re = pcre2_compile((PCRE2_SPTR)(p->s + 3), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &ec, &eo, NULL);
        if (!p->re) {
            snprintf(err, errlen, "config.json: quantization_config %s \"%.80s\" is not a regular expression",
                     ignore ? "ignore entry" : "target", p->s);
            return -1;
        }
    }
    return 0;
}

/* Every target of every group and every ignore entry, compiled. */
static int ct_init(ct_ctx *x, const cJSON *groups, const cJSON *ignore, char *err, size_t errlen)
{
    memset(x, 0, sizeof *x);
    int n = ignore ? cJSON_GetArraySize(ignore) : 0;
    const cJSON *g;
    cJSON_ArrayForEach(g, groups) n += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(g, "targets"));
    x->p = calloc((size_t)n + 1, sizeof *x->p);
    x->mc = pcre2_match_context_create(NULL);
    x->md = pcre2_match_data_create(1, NULL);
    if (!x->p || !x->mc || !x->md) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pcre2_set_match_limit(x->mc, 100000);
    pcre2_set_depth_limit(x->mc, 1000);
    cJSON_ArrayForEach(g, groups) if (ct_add(x, cJSON_GetObjectItemCaseSensitive(g, "targets"), 0, err, errlen)) return -1;
    return ignore ? ct_add(x, ignore, 1, err, errlen) : 0;
}

/* 1 when an entry of the kind (target / ignore) matches the module, 0 when none does, -1 when a
 * pattern hit the match limits */
static int ct_match(const ct_ctx *x, int ignore, const char *mod, const char *cls, char *err, size_t errlen)
{
    for (int i = 0; i < x->n; i++) {
        const ct_pat *p = &x->p[i];
        if (p->ignore != ignore) continue;
        if (!p->re) {
            if (strcmp(p->s, mod) == 0 || strcmp(p->s, cls) == 0) return 1;
            continue;
        }
        const int m = pcre2_match(p->re, (PCRE2_SPTR)mod, strlen(mod), 0, 0, x->md, x->mc);
        if (m >= 0) return 1;
        if (m != PCRE2_ERROR_NOMATCH) {
            snprintf(err, errlen, "config.json: quantization_config %s \"%.80s\" could not be matched (%s)",
                     ignore ? "ignore entry" : "target", p->s,
                     m == PCRE2_ERROR_MATCHLIMIT || m == PCRE2_ERROR_DEPTHLIMIT ? "too complex" : "error");
            return -1;
        }
    }
    return 0;
}

/* A Linear module is FP8 when a group targets it and the ignore list does not name it
 * (match_named_modules: ignore wins). */
static int ct_quantized(const char *mod, void *u, char *err, size_t errlen)
{
    const ct_ctx *x = u;
    const int hit = ct_match(x, 0, mod, "Linear", err, errlen);
    if (hit <= 0) return hit;
    const int ig = ct_match(x, 1, mod, "Linear", err, errlen);
    return ig < 0 ? -1 : !ig;
}

static int is_str(const cJSON *o, const char *key, const char *want)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && strcmp(v->valuestring, want) == 0;
}

static int absent(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !v || cJSON_IsNull(v);
}

static int is_list_of_strings(const cJSON *v)
{
    if (!cJSON_IsArray(v)) return 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) if (!cJSON_IsString(e)) return 0;
    return 1;
}

/* One config group: 8-bit float symmetric weights with static (stored) scales per channel, per tensor
 * or per block, and activations left alone or dynamically quantized (graphswap runs W8A16: f32
 * activations, as SGLang's CPU backend runs FP8). scheme / b0 / b1 out. */
static int ct_group(const char *gname, const cJSON *g, const cJSON *q, int *scheme, int *b0, int *b1, char *err,
                    size_t errlen)
{
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(g, "format");
    if (!fmt || cJSON_IsNull(fmt)) fmt = cJSON_GetObjectItemCaseSensitive(q, "format");
    if (!cJSON_IsObject(g) || !is_list_of_strings(cJSON_GetObjectItemCaseSensitive(g, "targets"))) {
        snprintf(err, errlen, "config.json: quantization_config config_groups.%.40s needs a targets list", gname);
        return -1;
    }
    if (!(cJSON_IsString(fmt) && strcmp(fmt->valuestring, "float-quantized") == 0)) {
        snprintf(err, errlen,
                 "config.json: compressed-tensors config_groups.%.40s format %s%.40s%s is not supported (supported: "
                 "\"float-quantized\" FP8)",
                 gname, cJSON_IsString(fmt) ? "\"" : "", cJSON_IsString(fmt) ? fmt->valuestring : "(none)",
                 cJSON_IsString(fmt) ? "\"" : "");
        return -1;
    }
    const cJSON *nb = cJSON_GetObjectItemCaseSensitive(w, "num_bits");
    const cJSON *sym = cJSON_GetObjectItemCaseSensitive(w, "symmetric");
    const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(w, "dynamic");
    if (!cJSON_IsObject(w) || !cJSON_IsNumber(nb) || nb->valuedouble != 8 || !is_str(w, "type", "float") ||
        (sym && !cJSON_IsTrue(sym)) || (dyn && !cJSON_IsFalse(dyn))) {
        snprintf(err, errlen,
                 "config.json: compressed-tensors config_groups.%.40s weights must be num_bits 8, type \"float\", "
                 "symmetric, not dynamic (FP8 e4m3 with stored scales)",
                 gname);
        return -1;
    }
    if (is_str(w, "strategy", "channel") || is_str(w, "strategy", "tensor")) {
        *scheme = is_str(w, "strategy", "channel") ? MDL_FP8_CHANNEL : MDL_FP8_TENSOR;
        *b0 = *b1 = 0;
    } else if (is_str(w, "strategy", "block")) {
        const cJSON *bs = cJSON_GetObjectItemCaseSensitive(w, "block_structure");
        const double r = cJSON_GetArraySize(bs) == 2 && cJSON_IsNumber(cJSON_GetArrayItem(bs, 0))
                             ? cJSON_GetArrayItem(bs, 0)->valuedouble : 0;
        const double k = cJSON_GetArraySize(bs) == 2 && cJSON_IsNumber(cJSON_GetArrayItem(bs, 1))
                             ? cJSON_GetArrayItem(bs, 1)->valuedouble : 0;
        if (!cJSON_IsArray(bs) || !(r >= 1 && r <= 65536 && r == (int)r) || !(k >= 16 && k <= 65536 && k == (int)k) ||
            ((int)k & ((int)k - 1)) != 0) {
            snprintf(err, errlen,
                     "config.json: compressed-tensors config_groups.%.40s block_structure must be [rows, columns], "
                     "rows >= 1 and columns a power of two >= 16",
                     gname);
            return -1;
        }
        *scheme = MDL_FP8_BLOCK;
        *b0 = (int)r;
        *b1 = (int)k;
    } else {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(w, "strategy");
        snprintf(err, errlen,
                 "config.json: compressed-tensors config_groups.%.40s weights strategy %.40s is not supported "
                 "(supported: channel, tensor, block)",
                 gname, cJSON_IsString(s) ? s->valuestring : "(none)");
        return -1;
    }
    const cJSON *ia = cJSON_GetObjectItemCaseSensitive(g, "input_activations");
    if (ia && !cJSON_IsNull(ia)) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(ia, "dynamic");
        /* dynamic per-token / per-tensor FP8 activations: W8A16 here (no input_scale tensors) */
        if (!cJSON_IsObject(ia) || !cJSON_IsTrue(d)) {
            snprintf(err, errlen,
                     "config.json: compressed-tensors config_groups.%.40s input_activations must be dynamic (static "
                     "activation scales, input_scale, are not supported)",
                     gname);
            return -1;
        }
    }
    if (!absent(g, "output_activations")) {
        snprintf(err, errlen, "config.json: compressed-tensors config_groups.%.40s output_activations are not supported",
                 gname);
        return -1;
    }
    return 0;
}

static int parse_ct(const cJSON *q, mdl_config *c, char *err, size_t errlen)
{
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups");
    if (!cJSON_IsObject(groups) || !groups->child) {
        snprintf(err, errlen, "config.json: compressed-tensors quantization_config needs config_groups");
        return -1;
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(q, "quantization_status");
    if (st && !is_str(q, "quantization_status", "compressed")) {
        snprintf(err, errlen,
                 "config.json: compressed-tensors quantization_status must be \"compressed\" (the weights stored "
                 "as FP8 codes and scales)");
        return -1;
    }
    if (!absent(q, "kv_cache_scheme")) {
        snprintf(err, errlen, "config.json: compressed-tensors kv_cache_scheme is not supported (FP8 KV cache)");
        return -1;
    }
    const cJSON *ignore = cJSON_GetObjectItemCaseSensitive(q, "ignore");
    if (ignore && !cJSON_IsNull(ignore) && !is_list_of_strings(ignore)) {
        snprintf(err, errlen, "config.json: compressed-tensors ignore must be a list of module names");
        return -1;
    }
    int scheme = -1, b0 = 0, b1 = 0;
    const cJSON *g;
    cJSON_ArrayForEach(g, groups)
    {
        int s, r, k;
        if (ct_group(g->string, g, q, &s, &r, &k, err, errlen) != 0) return -1;
        if (scheme >= 0 && (s != scheme || r != b0 || k != b1)) {
            snprintf(err, errlen,
                     "config.json: compressed-tensors config_groups mix weight strategies or block sizes (one "
                     "scheme for every FP8 projection is supported)");
            return -1;
        }
        scheme = s, b0 = r, b1 = k;
    }
    ct_ctx x;
    int rc = ct_init(&x, groups, ignore && !cJSON_IsNull(ignore) ? ignore : NULL, err, errlen);
    /* lm_head is a Linear too: graphswap keeps it unquantized, so it must be ignored if targeted */
    const int lm = rc ? -1 : ct_quantized("lm_head", &x, err, errlen);
    if (lm != 0) {
        if (lm > 0)
            snprintf(err, errlen, "config.json: compressed-tensors quantizes lm_head (an FP8 lm_head is not supported)");
        ct_free(&x);
        return -1;
    }
    c->fp8 = 1;
    c->fp8_ct = 1;
    c->fp8_scheme = scheme;
    if (scheme == MDL_FP8_BLOCK) {
        c->fp8_b0 = b0, c->fp8_b1 = b1;
    } else { /* one scale per row: a block of 1 row and one column block wider than any projection */
        const int wide[5] = {c->hidden, c->intermediate, c->heads * c->head_dim, c->moe_inter,
                             c->is_drafter ? c->n_target_ids * c->hidden : 0}; /* + a drafter's fc */
        int w = 16;
        for (int i = 0; i < 5; i++)
            while (w < wide[i]) w *= 2;
        c->fp8_b0 = 1, c->fp8_b1 = w;
    }
    rc = set_skips(c, ct_quantized, &x, 1, err, errlen);
    ct_free(&x);
    return rc;
}

int mdl_config_parse_quant(const cJSON *root, mdl_config *c, char *err, size_t errlen)
{
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (!q || cJSON_IsNull(q)) return 0;
    const cJSON *qm = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (!cJSON_IsObject(q) || !cJSON_IsString(qm)) {
        snprintf(err, errlen, "config.json: quantization_config must be an object with a quant_method");
        return -1;
    }
    const int ct = strcmp(qm->valuestring, "compressed-tensors") == 0;
    if (strcmp(qm->valuestring, "fp8") != 0 && !ct) {
        snprintf(err, errlen,
                 "config.json: quantization_config quant_method \"%.40s\" is not supported (supported: \"fp8\" "
                 "with weight_block_size, \"compressed-tensors\" FP8)",
                 qm->valuestring);
        return -1;
    }
    return ct ? parse_ct(q, c, err, errlen) : parse_fp8(q, c, err, errlen);
}
