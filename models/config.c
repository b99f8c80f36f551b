#include "models/config.h"
#include "models/config_internal.h"
#include "models/format/json_guard.h"
#include "kernels/kern.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const arch_names[MDL_ARCH_COUNT] = {"Qwen3ForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM",
                                                       "DFlashDraftModel", "Qwen3DSparkModel", "Qwen3MoeForCausalLM"};

const char *mdl_arch_name(mdl_arch a) { return arch_names[a]; }

char *mdl_read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) {
                snprintf(err, errlen, "%s: out of memory", path);
                goto fail;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (n > max_bytes) {
            snprintf(err, errlen, "%s: larger than %zu bytes", path, max_bytes);
            goto fail;
        }
        if (r == 0) break;
    }
    if (ferror(f)) {
        snprintf(err, errlen, "%s: read error", path);
        goto fail;
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
fail:
    free(buf);
    fclose(f);
    return NULL;
}

/* Reads an integer field in [lo, hi]. Missing: *out = dflt when has_default, else error. */
static int get_int(const cJSON *root, const char *key, int has_default, int dflt, long lo, long hi,
                   int *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (has_default) {
            *out = dflt;
            return 0;
        }
        snprintf(err, errlen, "config.json: missing field %s", key);
        return -1;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi) {
        snprintf(err, errlen, "config.json: field %s must be an integer in [%ld, %ld]", key, lo, hi);
        return -1;
    }
    *out = (int)v->valuedouble;
    return 0;
}

static int get_num(const cJSON *root, const char *key, double dflt, double lo, double hi, double *out,
                   char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        snprintf(err, errlen, "config.json: field %s must be a number in [%g, %g]", key, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *root, const char *key, int dflt, int *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) {
        snprintf(err, errlen, "config.json: field %s must be true or false", key);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A drafter field: DFlash keeps some under "dflash_config" (read first), DSpark at the top level. */
static const cJSON *drafter_field(const cJSON *root, const char *key)
{
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(root, "dflash_config");
    const cJSON *v = cJSON_IsObject(dc) ? cJSON_GetObjectItemCaseSensitive(dc, key) : NULL;
    return v && !cJSON_IsNull(v) ? v : cJSON_GetObjectItemCaseSensitive(root, key);
}

static int drafter_int(const cJSON *root, const char *key, int has_default, int dflt, long lo, long hi,
                       int *out, char *err, size_t errlen)
{
    const cJSON *v = drafter_field(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (has_default) {
            *out = dflt;
            return 0;
        }
        snprintf(err, errlen, "config.json: missing field %s", key);
        return -1;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        snprintf(err, errlen, "config.json: field %s must be an integer in [%ld, %ld]", key, lo, hi);
        return -1;
    }
    *out = (int)v->valuedouble;
    return 0;
}

/* target_layer_ids as z-lab dflash and DeepSpec define them, one check and one message for the
 * drafter's config and for the target it is paired with: strictly increasing ids, each -1 (the
 * embedding output, HF hidden_states[0]; DS@afdfa7c deepspec/modeling/dspark/common.py:52-75) or a
 * target layer in [0, L-1] (hidden_states[j+1]; for j = L-1 that is the final-normed state,
 * SPEC-NOTES.md section 0). models/forward.c captures each of them. */
static int check_target_ids(const char *who, const int *ids, int n, int L, char *err, size_t errlen)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < -1 || ids[i] > L - 1 || (i > 0 && ids[i] <= ids[i - 1])) {
            snprintf(err, errlen,
                     "%s: target_layer_ids[%d] = %d: ids must be strictly increasing, each -1 (the "
                     "embedding output) or a target layer in [0, %d]",
                     who, i, ids[i], L - 1);
            return -1;
        }
    return 0;
}

/* A number field (dflash_config first) that must equal `want` when present: a value that changes
 * the math graphswap does not implement is refused by name. */
static int drafter_num_is(const cJSON *root, const char *key, double want, char *err, size_t errlen)
{
    const cJSON *v = drafter_field(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != want) {
        snprintf(err, errlen, "config.json: %s other than %g is not supported", key, want);
        return -1;
    }
    return 0;
}

/* Fields of the published drafter configs that do not change inference (accepted, not used):
 *   DeepSpec Qwen3DSparkConfig (DS@afdfa7c deepspec/modeling/dspark/qwen3/config.py:37-56, a
 *   deepcopy of the target's Qwen3Config): num_anchors (training only: anchor blocks sampled per
 *   sequence, qwen3/modeling.py:249, 398-402), _attn_implementation / attn_implementation (kernel choice),
 *   tie_word_embeddings (always false there; Qwen3DSparkModel has no output-embedding tying, so
 *   its lm_head.weight is used either way), initializer_range, use_cache, attention_dropout,
 *   pad_token_id, model_type, transformers_version, sliding_window / max_window_layers (only with
 *   use_sliding_window, refused by the common parser).
 * Fields that would change the math and are implemented: architectures, num_hidden_layers,
 * num_target_layers, block_size, mask_token_id, target_layer_ids (-1 .. L-1), markov_rank,
 * markov_head_type "vanilla", enable_confidence_head, confidence_head_with_markov; refused by
 * name: layer_types other than full_attention, markov_head_type gated / rnn, and the z-lab DFlash2
 * fields is_causal=true, input_embedding_scale / output_multiplier != 1, final_logit_softcapping. */
static int parse_drafter(const cJSON *root, mdl_config *c, char *err, size_t errlen)
{
    const int dspark = c->arch == MDL_ARCH_DSPARK;
    if (drafter_int(root, "block_size", !dspark, 16, 2, 64, &c->block_size, err, errlen) ||
        drafter_int(root, "num_target_layers", 0, 0, 1, 1024, &c->n_target_layers, err, errlen) ||
        drafter_int(root, "mask_token_id", 0, 0, 0, c->vocab - 1, &c->mask_token_id, err, errlen))
        return -1;
    if (dspark && c->block_size < 1) {
        snprintf(err, errlen, "config.json: block_size must be >= 1");
        return -1;
    }
    const cJSON *ids = drafter_field(root, "target_layer_ids");
    if (ids && !cJSON_IsNull(ids)) {
        int n = cJSON_GetArraySize(ids);
        if (!cJSON_IsArray(ids) || n < 1 || n > MDL_MAX_TARGET_IDS) {
            snprintf(err, errlen, "config.json: target_layer_ids must be a list of 1..%d layer ids", MDL_MAX_TARGET_IDS);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            const cJSON *x = cJSON_GetArrayItem(ids, i);
            if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || fabs(x->valuedouble) > 1 << 20) {
                snprintf(err, errlen, "config.json: target_layer_ids[%d] must be an integer", i);
                return -1;
            }
            c->target_ids[i] = (int)x->valuedouble;
        }
        c->n_target_ids = n;
    } else if (dspark) {
        snprintf(err, errlen, "config.json: missing field target_layer_ids");
        return -1;
    } else { /* the published DFlash default: one id per drafter layer */
        int n = c->n_target_layers, m = c->layers;
        if (m > MDL_MAX_TARGET_IDS) m = MDL_MAX_TARGET_IDS;
        for (int i = 0; i < m; i++)
            c->target_ids[i] = m == 1 ? n / 2 : (int)nearbyint(1.0 + (double)i * (n - 4) / (m - 1));
        c->n_target_ids = m;
    }
    /* (the z-lab default gives duplicate or negative ids for targets of < 5 layers: refused here) */
    if (check_target_ids("config.json", c->target_ids, c->n_target_ids, c->n_target_layers, err, errlen))
        return -1;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        int ok = cJSON_IsArray(lt) && cJSON_GetArraySize(lt) == c->layers;
        const cJSON *x;
        cJSON_ArrayForEach(x, lt) ok = ok && cJSON_IsString(x) && strcmp(x->valuestring, "full_attention") == 0;
        if (!ok) {
            snprintf(err, errlen,
                     "config.json: layer_types must list \"full_attention\" for each of the %d drafter layers "
                     "(sliding-window drafter layers are not supported)",
                     c->layers);
            return -1;
        }
    }
    int flag;
    if (c->arch == MDL_ARCH_DFLASH) { /* z-lab DFlash2 options (ZL2 _draft_value): defaults only */
        const cJSON *ic = drafter_field(root, "is_causal");
        if (ic && !cJSON_IsNull(ic) && !cJSON_IsFalse(ic)) {
            snprintf(err, errlen, "config.json: is_causal drafters are not supported (must be false)");
            return -1;
        }
        const cJSON *sc = drafter_field(root, "final_logit_softcapping");
        if (sc && !cJSON_IsNull(sc) && !(cJSON_IsNumber(sc) && sc->valuedouble <= 0)) {
            snprintf(err, errlen, "config.json: final_logit_softcapping is not supported (must be null)");
            return -1;
        }
        if (drafter_num_is(root, "input_embedding_scale", 1.0, err, errlen) ||
            drafter_num_is(root, "output_multiplier", 1.0, err, errlen))
            return -1;
    }
    if (dspark) {
        if (drafter_int(root, "markov_rank", 1, 0, 0, 1 << 16, &c->markov_rank, err, errlen)) return -1;
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "markov_head_type");
        if (c->markov_rank > 0 && mt && !(cJSON_IsString(mt) && strcmp(mt->valuestring, "vanilla") == 0)) {
            snprintf(err, errlen, "config.json: markov_head_type must be \"vanilla\" (gated and rnn heads are not supported)");
            return -1;
        }
        int anchors;
        if (get_int(root, "num_anchors", 1, 0, 0, 1 << 30, &anchors, err, errlen)) return -1; /* training only */
        if (get_bool(root, "enable_confidence_head", 0, &c->conf_head, err, errlen) ||
            get_bool(root, "confidence_head_with_markov", 0, &flag, err, errlen))
            return -1;
        /* present only with the head (config.py:49-52); without it the field means nothing */
        c->conf_with_markov = c->conf_head && flag;
        if (c->conf_with_markov && c->markov_rank == 0) {
            snprintf(err, errlen, "config.json: confidence_head_with_markov needs markov_rank > 0");
            return -1;
        }
        c->own_embed = 1;
    }
    return get_bool(root, "graphswap_test_hook_reallocates", 0, &c->test_hook_reallocates, err, errlen) ||
           get_bool(root, "graphswap_test_skip_hook", 0, &c->test_skip_hook, err, errlen) ||
           get_bool(root, "graphswap_test_accept_drafts", 0, &c->test_accept_drafts, err, errlen);
}

/* Qwen3MoeConfig (transformers models/qwen3_moe/configuration_qwen3_moe.py): num_experts (default
 * 128), num_experts_per_tok (8), moe_intermediate_size (768), norm_topk_prob (false),
 * decoder_sparse_step (1), mlp_only_layers ([]); a layer is sparse iff its index is not in
 * mlp_only_layers, num_experts > 0 and (index + 1) % decoder_sparse_step == 0 (Qwen3MoeDecoderLayer).
 * router_aux_loss_coef and output_router_logits are training-only (not read). The defaults are
 * transformers', so a config that omits a field means what it means there. */
static int parse_moe(const cJSON *root, mdl_config *c, char *err, size_t errlen)
{
    int step;
    /* transformers 5 saves the expert count as num_local_experts (Qwen3MoeConfig.attribute_map maps
     * num_experts to it); Qwen's own checkpoints and transformers 4 write num_experts. Either is read;
     * both present and different is refused. */
    const char *ne_key = "num_experts";
    const cJSON *ne = cJSON_GetObjectItemCaseSensitive(root, "num_experts");
    const cJSON *nle = cJSON_GetObjectItemCaseSensitive(root, "num_local_experts");
    if (ne && nle && !(cJSON_IsNumber(ne) && cJSON_IsNumber(nle) && ne->valuedouble == nle->valuedouble)) {
        snprintf(err, errlen, "config.json: num_experts and num_local_experts disagree");
        return -1;
    }
    if (!ne && nle) ne_key = "num_local_experts";
    if (get_int(root, ne_key, 1, 128, 0, KERN_MAX_EXPERTS, &c->n_experts, err, errlen) ||
        get_int(root, "num_experts_per_tok", 1, 8, 1, KERN_MAX_EXPERTS, &c->experts_per_tok, err, errlen) ||
        get_int(root, "moe_intermediate_size", 1, 768, 1, 1 << 20, &c->moe_inter, err, errlen) ||
        get_bool(root, "norm_topk_prob", 0, &c->norm_topk, err, errlen) ||
        get_int(root, "decoder_sparse_step", 1, 1, 1, 1 << 20, &step, err, errlen))
        return -1;
    if (c->n_experts > 0 && c->experts_per_tok > c->n_experts) {
        snprintf(err, errlen, "config.json: num_experts_per_tok %d is more than num_experts %d", c->experts_per_tok,
                 c->n_experts);
        return -1;
    }
    if (c->layers > MDL_MAX_LAYERS) {
        snprintf(err, errlen, "config.json: num_hidden_layers %d: at most %d for Qwen3MoeForCausalLM", c->layers,
                 MDL_MAX_LAYERS);
        return -1;
    }
    unsigned char dense[MDL_MAX_LAYERS] = {0};
    const cJSON *ml = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    if (ml && !cJSON_IsNull(ml)) {
        if (!cJSON_IsArray(ml)) {
            snprintf(err, errlen, "config.json: mlp_only_layers must be a list of layer indices");
            return -1;
        }
        const cJSON *x;
        cJSON_ArrayForEach(x, ml)
        {
            if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble)) {
                snprintf(err, errlen, "config.json: mlp_only_layers entries must be integer layer indices");
                return -1;
            }
            /* transformers tests `idx not in mlp_only_layers`: an index no layer has changes nothing */
            if (x->valuedouble >= 0 && x->valuedouble < c->layers) dense[(int)x->valuedouble] = 1;
        }
    }
    c->n_sparse = 0;
    for (int l = 0; l < c->layers; l++) {
        c->sparse[l] = !dense[l] && c->n_experts > 0 && (l + 1) % step == 0;
        c->n_sparse += c->sparse[l];
    }
    return 0;
}

int mdl_config_check_drafter(const mdl_config *t, const mdl_config *d, char *err, size_t errlen)
{
    if (!d->is_drafter) {
        snprintf(err, errlen, "drafter: %s is not a drafter architecture", mdl_arch_name(d->arch));
        return -1;
    }
    if (d->hidden != t->hidden) {
        snprintf(err, errlen, "drafter: hidden_size %d does not match the target's %d", d->hidden, t->hidden);
        return -1;
    }
    if (d->vocab != t->vocab) {
        snprintf(err, errlen, "drafter: vocab_size %d does not match the target's %d", d->vocab, t->vocab);
        return -1;
    }
    if (d->n_target_layers != t->layers) {
        snprintf(err, errlen, "drafter: num_target_layers %d does not match the target's %d layers",
                 d->n_target_layers, t->layers);
        return -1;
    }
    return check_target_ids("drafter", d->target_ids, d->n_target_ids, t->layers, err, errlen);
}

int mdl_config_parse(const char *json, size_t len, mdl_config *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    char why[160];
    mdl_json_result jr;
    cJSON *root = mdl_json_parse(json, len, MDL_JSON_MAX_DEPTH, MDL_JSON_OBJECT, &jr, why, sizeof why);
    int rc = -1;
    if (!root) {
        snprintf(err, errlen, "config.json: %s", jr.status == MDL_JSON_E_DEEP ? why : "not a JSON object");
        goto out;
    }
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (!cJSON_IsArray(archs) || cJSON_GetArraySize(archs) != 1 ||
        !cJSON_IsString(cJSON_GetArrayItem(archs, 0))) {
        snprintf(err, errlen, "config.json: field architectures must be a list of one string");
        goto out;
    }
    const char *an = cJSON_GetArrayItem(archs, 0)->valuestring;
    int found = 0;
    for (int i = 0; i < MDL_ARCH_COUNT; i++)
        if (strcmp(an, arch_names[i]) == 0) {
            c->arch = (mdl_arch)i;
            found = 1;
        }
    if (!found) {
        snprintf(err, errlen,
                 "config.json: unsupported architecture %s (supported: Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
                 "LlamaForCausalLM, Qwen2ForCausalLM, DFlashDraftModel, Qwen3DSparkModel)",
                 an);
        goto out;
    }
    const int M = 1 << 20;
    if (get_int(root, "hidden_size", 0, 0, 1, M, &c->hidden, err, errlen) ||
        get_int(root, "intermediate_size", 0, 0, 1, M, &c->intermediate, err, errlen) ||
        get_int(root, "num_hidden_layers", 0, 0, 1, 1024, &c->layers, err, errlen) ||
        get_int(root, "num_attention_heads", 0, 0, 1, 4096, &c->heads, err, errlen) ||
        get_int(root, "num_key_value_heads", 1, c->heads, 1, 4096, &c->kv_heads, err, errlen) ||
        get_int(root, "vocab_size", 0, 0, 1, 1 << 24, &c->vocab, err, errlen) ||
        get_int(root, "max_position_embeddings", 1, 4096, 1, 1 << 24, &c->max_pos, err, errlen))
        goto out;
    if (get_int(root, "head_dim", 1, c->hidden / c->heads, 2, 4096, &c->head_dim, err, errlen)) goto out;
    if (c->head_dim < 2) { /* the default, hidden_size / num_attention_heads as transformers takes it */
        snprintf(err, errlen,
                 "config.json: no head_dim, and hidden_size %d / num_attention_heads %d gives %d (at least 2)",
                 c->hidden, c->heads, c->head_dim);
        goto out;
    }
    if (c->head_dim % 2) {
        snprintf(err, errlen, "config.json: head_dim %d must be even for RoPE", c->head_dim);
        goto out;
    }
    if (c->heads % c->kv_heads) {
        snprintf(err, errlen,
                 "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                 c->heads, c->kv_heads);
        goto out;
    }
    if (get_num(root, "rms_norm_eps", 1e-6, 0, 1, &c->rms_eps, err, errlen) ||
        mdl_config_parse_rope(root, c, err, errlen) != 0 || mdl_config_parse_attention(root, c, err, errlen) != 0 ||
        get_bool(root, "tie_word_embeddings", c->arch == MDL_ARCH_QWEN2 ? 0 : 0, &c->tie, err, errlen) ||
        get_int(root, "bos_token_id", 1, -1, -1, c->vocab - 1, &c->bos, err, errlen))
        goto out;
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (cJSON_IsArray(eos)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, eos)
        {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= c->vocab ||
                c->n_eos >= MDL_MAX_EOS) {
                snprintf(err, errlen, "config.json: field eos_token_id: bad entry");
                goto out;
            }
            c->eos[c->n_eos++] = (int)e->valuedouble;
        }
    } else if (eos && !cJSON_IsNull(eos)) {
        int v;
        if (get_int(root, "eos_token_id", 0, 0, 0, c->vocab - 1, &v, err, errlen)) goto out;
        c->eos[c->n_eos++] = v;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0)) {
        snprintf(err, errlen, "config.json: unsupported hidden_act (only silu)");
        goto out;
    }
    int flag;
    if (get_bool(root, "mlp_bias", 0, &flag, err, errlen)) goto out;
    if (flag) {
        snprintf(err, errlen, "config.json: mlp_bias=true is not supported");
        goto out;
    }
    int attn_bias;
    if (get_bool(root, "attention_bias", 0, &attn_bias, err, errlen)) goto out;
    c->is_drafter = c->arch == MDL_ARCH_DFLASH || c->arch == MDL_ARCH_DSPARK;
    c->qk_norm = c->arch != MDL_ARCH_LLAMA && c->arch != MDL_ARCH_QWEN2;
    c->qkv_bias = c->arch == MDL_ARCH_QWEN2 || attn_bias;
    c->o_bias = c->arch != MDL_ARCH_QWEN2 && attn_bias;
    if (c->is_drafter && parse_drafter(root, c, err, errlen) != 0) goto out;
    if (c->arch == MDL_ARCH_QWEN3_MOE && parse_moe(root, c, err, errlen) != 0) goto out;
    if (mdl_config_parse_quant(root, c, err, errlen) != 0) goto out;
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

int mdl_config_load(const char *dir, mdl_config *out, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *buf = mdl_read_file(path, 1 << 20, &len, err, errlen);
    if (!buf) return -1;
    int rc = mdl_config_parse(buf, len, out, err, errlen);
    free(buf);
    if (rc != 0) return rc;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0; /* optional */
    fclose(f);
    buf = mdl_read_file(path, 1 << 20, &len, err, errlen);
    if (!buf) return -1;
    rc = mdl_gen_config_parse(buf, len, out, err, errlen);
    free(buf);
    return rc;
}
