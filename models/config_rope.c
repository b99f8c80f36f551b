/* models/config_rope.c — the RoPE and attention-shape fields of config.json, and the RoPE tables.
 *
 * Layouts: transformers 4 writes a top-level rope_theta plus rope_scaling ({"rope_type" (or the
 * older "type"), "factor", ...} or null); transformers 5 writes rope_parameters ({"rope_theta",
 * "rope_type", ...}). Either is read; when both are present they must agree.
 *
 * Rope types (the math follows transformers' modeling_rope_utils.py, read at
 * huggingface/transformers@ef46806472a64b0013ed413781e3afed82bfa047 for default / linear / dynamic /
 * llama3 and the transformers 5 `_compute_yarn_parameters` (rope_parameters: mscale,
 * mscale_all_dim, truncate, original_max_position_embeddings) for yarn; nothing is copied):
 *   default  inv[i] = theta^(-2i/d)
 *   linear   inv[i] / factor
 *   dynamic  NTK scaling recomputed from the running sequence length; for lengths up to
 *            max_position_embeddings transformers uses exactly the default table, and graphswap
 *            never runs a sequence longer than that (max_model_len <= max_position_embeddings), so
 *            it is accepted as default. Refused when original_max_position_embeddings is set below
 *            max_position_embeddings (transformers versions differ on which length triggers it).
 *            (vLLM's DynamicNTKScalingRotaryEmbedding applies the scaled base at every length; we
 *            follow transformers.)
 *   llama3   wavelength bands: wl = 2 pi / inv; wl < orig/high: inv; wl > orig/low: inv / factor;
 *            else s = (orig/wl - low) / (high - low), (1 - s) inv / factor + s inv
 *   yarn     pos = theta^(2i/d); blend of 1/pos (extrapolation) and 1/(factor pos) (interpolation)
 *            with a linear ramp between the correction dims of beta_fast and beta_slow
 *            (d ln(orig / (2 pi beta)) / (2 ln theta), floored / ceiled when truncate, clamped to
 *            [0, d-1]); attention_factor (default 0.1 ln(factor) + 1, or
 *            mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set) multiplies
 *            cos and sin. graphswap leaves the rotation unscaled and multiplies the attention op's
 *            softmax scale by attention_factor^2 instead: q.k of two vectors each scaled by af is
 *            af^2 q.k, exactly, and nothing else reads the rotated q and k (the KV cache holds the
 *            unscaled k, consistently for every position).
 *            factor defaults to max_position_embeddings / original_max_position_embeddings; a
 *            given factor is used as given, as transformers 5 and vLLM do (transformers 4.5x
 *            replaced it by that ratio whenever original_max_position_embeddings was set).
 *   longrope and anything else: refused, naming the type.
 * partial_rotary_factor != 1 is refused (the qk_norm_rope op rotates the whole head).
 */
#include "models/config_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- RoPE fields ------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    mdl_rope_type type;
    const char *keys; /* accepted keys besides rope_type / type / rope_theta / partial_rotary_factor */
} rope_kind;

static const rope_kind rope_kinds[] = {
    {"default", MDL_ROPE_DEFAULT, ""},
    {"linear", MDL_ROPE_LINEAR, " factor "},
    {"dynamic", MDL_ROPE_DYNAMIC, " factor original_max_position_embeddings "},
    {"llama3", MDL_ROPE_LLAMA3, " factor low_freq_factor high_freq_factor original_max_position_embeddings "},
    {"yarn", MDL_ROPE_YARN,
     " factor original_max_position_embeddings beta_fast beta_slow mscale mscale_all_dim attention_factor "
     "truncate "},
};

/* A number field of the rope object `p` (named `where` in messages). Missing or null: *out = dflt,
 * *present = 0 (an error when required). */
static int rope_num(const cJSON *p, const char *where, const char *key, int required, double dflt, double lo,
                    double hi, double *out, int *present, char *err, size_t errlen)
{
    const cJSON *v = p ? cJSON_GetObjectItemCaseSensitive(p, key) : NULL;
    if (present) *present = 0;
    if (!v || cJSON_IsNull(v)) {
        if (required) {
            snprintf(err, errlen, "config.json: %s.%s is required", where, key);
            return -1;
        }
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        snprintf(err, errlen, "config.json: %s.%s must be a number in [%g, %g]", where, key, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    if (present) *present = 1;
    return 0;
}

static int same_number(const cJSON *a, const cJSON *b)
{
    return cJSON_IsNumber(a) && cJSON_IsNumber(b) && a->valuedouble == b->valuedouble;
}

static int rope_partial_factor(const cJSON *obj, const char *where, char *err, size_t errlen)
{
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, "partial_rotary_factor") : NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != 1.0) {
        snprintf(err, errlen,
                 "config.json: %spartial_rotary_factor must be 1.0 (partial rotary embeddings are not supported)",
                 where);
        return -1;
    }
    return 0;
}

/* yarn's get_mscale: 0.1 m ln(s) + 1 for s > 1, else 1 */
static double yarn_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0; }

int mdl_config_parse_rope(const cJSON *root, mdl_config *c, char *err, size_t errlen)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rp && cJSON_IsNull(rp)) rp = NULL;
    if (rs && cJSON_IsNull(rs)) rs = NULL;
    if (rp && !cJSON_IsObject(rp)) {
        snprintf(err, errlen, "config.json: rope_parameters must be an object or null");
        return -1;
    }
    if (rs && !cJSON_IsObject(rs)) {
        snprintf(err, errlen, "config.json: rope_scaling must be an object or null");
        return -1;
    }
    if (rp && rs && !cJSON_Compare(rp, rs, 1)) {
        snprintf(err, errlen, "config.json: rope_parameters and rope_scaling are both set and differ");
        return -1;
    }
    const cJSON *p = rp ? rp : rs;
    const char *where = rp ? "rope_parameters" : "rope_scaling";
    if (rope_partial_factor(root, "", err, errlen) != 0) return -1;
    if (p && rope_partial_factor(p, rp ? "rope_parameters." : "rope_scaling.", err, errlen) != 0) return -1;

    /* per-layer-type parameters ({"full_attention": {...}, "sliding_attention": {...}}) */
    const cJSON *it = p ? p->child : NULL;
    for (; it; it = it->next)
        if (cJSON_IsObject(it)) {
            snprintf(err, errlen, "config.json: %s.%.60s: per-layer-type RoPE parameters are not supported", where,
                     it->string);
            return -1;
        }

    /* theta: rope_parameters.rope_theta (v5) or the top-level rope_theta (v4); equal when both */
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(root, "rope_theta");
    const cJSON *in = p ? cJSON_GetObjectItemCaseSensitive(p, "rope_theta") : NULL;
    if (top && cJSON_IsNull(top)) top = NULL;
    if (in && cJSON_IsNull(in)) in = NULL;
    if (top && in && !same_number(top, in)) {
        snprintf(err, errlen, "config.json: rope_theta and %s.rope_theta differ", where);
        return -1;
    }
    const double dflt_theta = c->arch == MDL_ARCH_LLAMA ? 10000.0 : 1000000.0;
    if (in) {
        if (rope_num(p, where, "rope_theta", 0, dflt_theta, 1, 1e12, &c->rope_theta, NULL, err, errlen)) return -1;
    } else if (rope_num(root, "config", "rope_theta", 0, dflt_theta, 1, 1e12, &c->rope_theta, NULL, err, errlen)) {
        snprintf(err, errlen, "config.json: field rope_theta must be a number in [1, 1e+12]");
        return -1;
    }

    c->rope_type = MDL_ROPE_DEFAULT;
    c->rope_factor = 1.0;
    c->rope_attn_factor = 1.0;
    if (!p) return 0;

    /* the type: rope_type, or the older "type"; equal when both */
    const cJSON *t1 = cJSON_GetObjectItemCaseSensitive(p, "rope_type");
    const cJSON *t2 = cJSON_GetObjectItemCaseSensitive(p, "type");
    if ((t1 && !cJSON_IsString(t1)) || (t2 && !cJSON_IsString(t2))) {
        snprintf(err, errlen, "config.json: %s.rope_type must be a string", where);
        return -1;
    }
    if (t1 && t2 && strcmp(t1->valuestring, t2->valuestring) != 0) {
        snprintf(err, errlen, "config.json: %s.rope_type and %s.type differ", where, where);
        return -1;
    }
    const char *tname = t1 ? t1->valuestring : t2 ? t2->valuestring : NULL;
    if (!tname) {
        if (!rp) { /* transformers 4 requires a type in rope_scaling */
            snprintf(err, errlen, "config.json: rope_scaling.rope_type is required");
            return -1;
        }
        tname = "default";
    }
    const rope_kind *k = NULL;
    for (size_t i = 0; i < sizeof rope_kinds / sizeof rope_kinds[0]; i++)
        if (strcmp(tname, rope_kinds[i].name) == 0) k = &rope_kinds[i];
    if (!k) {
        snprintf(err, errlen,
                 "config.json: %s.rope_type \"%.40s\" is not supported (supported: default, linear, dynamic, "
                 "llama3, yarn)",
                 where, tname);
        return -1;
    }
    /* every key must mean something to this type: an unknown one could change the math */
    cJSON_ArrayForEach(it, p)
    {
        const char *key = it->string;
        if (strcmp(key, "rope_type") == 0 || strcmp(key, "type") == 0 || strcmp(key, "rope_theta") == 0 ||
            strcmp(key, "partial_rotary_factor") == 0)
            continue;
        char pat[80];
        snprintf(pat, sizeof pat, " %.70s ", key);
        if (!strstr(k->keys, pat) && !(k->type == MDL_ROPE_DEFAULT && cJSON_IsNull(it))) {
            snprintf(err, errlen, "config.json: %s.%.60s is not supported with rope_type %s", where, key, k->name);
            return -1;
        }
    }
    c->rope_type = k->type;
    const double BIG = 1e9;
    int has_factor = 0, has_orig = 0;
    double orig = 0;
    switch (k->type) {
    case MDL_ROPE_DEFAULT:
        break;
    case MDL_ROPE_LINEAR:
        if (rope_num(p, where, "factor", 1, 1, 1e-6, BIG, &c->rope_factor, NULL, err, errlen)) return -1;
        break;
    case MDL_ROPE_DYNAMIC:
        if (rope_num(p, where, "factor", 1, 1, 1e-6, BIG, &c->rope_factor, NULL, err, errlen) ||
            rope_num(p, where, "original_max_position_embeddings", 0, 0, 1, 1 << 24, &orig, &has_orig, err, errlen))
            return -1;
        if (has_orig && orig < c->max_pos) {
            snprintf(err, errlen,
                     "config.json: %s.rope_type dynamic with original_max_position_embeddings %g below "
                     "max_position_embeddings %d is not supported (dynamic NTK scaling would depend on the "
                     "sequence length)",
                     where, orig, c->max_pos);
            return -1;
        }
        /* exactly the default table for every length up to max_position_embeddings (see above) */
        break;
    case MDL_ROPE_LLAMA3:
        if (rope_num(p, where, "factor", 1, 1, 1e-6, BIG, &c->rope_factor, NULL, err, errlen) ||
            rope_num(p, where, "low_freq_factor", 1, 1, 1e-6, BIG, &c->rope_low_freq_factor, NULL, err, errlen) ||
            rope_num(p, where, "high_freq_factor", 1, 1, 1e-6, BIG, &c->rope_high_freq_factor, NULL, err, errlen) ||
            rope_num(p, where, "original_max_position_embeddings", 1, 0, 1, 1 << 24, &orig, NULL, err, errlen))
            return -1;
        if (c->rope_high_freq_factor == c->rope_low_freq_factor) {
            snprintf(err, errlen, "config.json: %s.high_freq_factor must differ from low_freq_factor", where);
            return -1;
        }
        c->rope_orig_max_pos = (int)orig;
        break;
    case MDL_ROPE_YARN: {
        double af, ms, msad, bf, bs;
        int has_af, has_ms, has_msad;
        if (rope_num(p, where, "factor", 0, 0, 1e-6, BIG, &c->rope_factor, &has_factor, err, errlen) ||
            rope_num(p, where, "original_max_position_embeddings", 0, c->max_pos, 1, 1 << 24, &orig, &has_orig, err,
                     errlen) ||
            rope_num(p, where, "attention_factor", 0, 0, 0, BIG, &af, &has_af, err, errlen) ||
            rope_num(p, where, "mscale", 0, 0, -BIG, BIG, &ms, &has_ms, err, errlen) ||
            rope_num(p, where, "mscale_all_dim", 0, 0, -BIG, BIG, &msad, &has_msad, err, errlen) ||
            rope_num(p, where, "beta_fast", 0, 0, 0, BIG, &bf, NULL, err, errlen) ||
            rope_num(p, where, "beta_slow", 0, 0, 0, BIG, &bs, NULL, err, errlen))
            return -1;
        if (orig != floor(orig)) {
            snprintf(err, errlen, "config.json: %s.original_max_position_embeddings must be an integer", where);
            return -1;
        }
        /* a given factor is used as given (transformers 5, vLLM; Qwen3's documented long-context
         * recipe sets factor 4 with max_position_embeddings 40960 and original 32768) */
        if (!has_factor) c->rope_factor = (double)c->max_pos / orig;
        c->rope_orig_max_pos = (int)orig;
        /* "or" defaults, as transformers reads them: 0 / null mean the paper's 32 and 1 */
        c->rope_beta_fast = bf != 0 ? bf : 32.0;
        c->rope_beta_slow = bs != 0 ? bs : 1.0;
        const cJSON *tr = cJSON_GetObjectItemCaseSensitive(p, "truncate");
        if (tr && !cJSON_IsNull(tr) && !cJSON_IsBool(tr)) {
            snprintf(err, errlen, "config.json: %s.truncate must be true or false", where);
            return -1;
        }
        c->rope_truncate = !tr || cJSON_IsNull(tr) || cJSON_IsTrue(tr);
        const double f = c->rope_factor;
        if (has_af) c->rope_attn_factor = af;
        else if (has_ms && has_msad && ms != 0 && msad != 0)
            c->rope_attn_factor = yarn_mscale(f, ms) / yarn_mscale(f, msad);
        else c->rope_attn_factor = yarn_mscale(f, 1.0);
        if (!(c->rope_attn_factor > 0 && isfinite(c->rope_attn_factor))) {
            snprintf(err, errlen, "config.json: %s: the yarn attention factor %g must be positive", where,
                     c->rope_attn_factor);
            return -1;
        }
        break;
    }
    }
    return 0;
}

/* ---- the tables -------------------------------------------------------------------------------- */

void mdl_rope_inv_freq(const mdl_config *c, double *inv)
{
    const int d = c->head_dim, half = d / 2;
    const double base = c->rope_theta, f = c->rope_factor;
    for (int i = 0; i < half; i++) inv[i] = 1.0 / pow(base, (double)(2 * i) / (double)d);
    switch (c->rope_type) {
    case MDL_ROPE_DEFAULT:
    case MDL_ROPE_DYNAMIC:
        break;
    case MDL_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv[i] /= f;
        break;
    case MDL_ROPE_LLAMA3: {
        const double orig = c->rope_orig_max_pos, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
        const double lo_wl = orig / lo, hi_wl = orig / hi;
        for (int i = 0; i < half; i++) {
            const double wl = 2.0 * M_PI / inv[i];
            if (wl < hi_wl) continue;
            if (wl > lo_wl) {
                inv[i] /= f;
                continue;
            }
            const double s = (orig / wl - lo) / (hi - lo);
            inv[i] = (1.0 - s) * inv[i] / f + s * inv[i];
        }
        break;
    }
    case MDL_ROPE_YARN: {
        const double orig = c->rope_orig_max_pos;
        double low = (double)d * log(orig / (c->rope_beta_fast * 2.0 * M_PI)) / (2.0 * log(base));
        double high = (double)d * log(orig / (c->rope_beta_slow * 2.0 * M_PI)) / (2.0 * log(base));
        if (c->rope_truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > d - 1) high = d - 1;
        if (low == high) high += 0.001; /* as transformers: no singular ramp */
        for (int i = 0; i < half; i++) {
            double ramp = ((double)i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            const double extra = 1.0 - ramp; /* weight of the unscaled (extrapolated) frequency */
            inv[i] = inv[i] / f * (1.0 - extra) + inv[i] * extra;
        }
        break;
    }
    }
}

double mdl_attn_softmax_scale(const mdl_config *c)
{
    const double s = 1.0 / sqrt((double)c->head_dim);
    /* exactly hd^-0.5 unless yarn; 0 is a zeroed config built by hand (tests): plain RoPE */
    return c->rope_attn_factor == 1.0 || c->rope_attn_factor == 0.0 ? s
                                                                     : s * c->rope_attn_factor * c->rope_attn_factor;
}

/* ---- attention shape and dtype ----------------------------------------------------------------- */

int mdl_config_parse_attention(const cJSON *root, mdl_config *c, char *err, size_t errlen)
{
    /* dtype: transformers 5 writes "dtype", 4 "torch_dtype"; equal when both */
    const cJSON *dt4 = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    const cJSON *dt5 = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (dt4 && cJSON_IsNull(dt4)) dt4 = NULL;
    if (dt5 && cJSON_IsNull(dt5)) dt5 = NULL;
    if (dt4 && dt5 &&
        !(cJSON_IsString(dt4) && cJSON_IsString(dt5) && strcmp(dt4->valuestring, dt5->valuestring) == 0)) {
        snprintf(err, errlen, "config.json: torch_dtype and dtype differ");
        return -1;
    }
    const cJSON *dt = dt5 ? dt5 : dt4;
    c->dtype = MDL_DT_BF16;
    if (dt) {
        const char *s = cJSON_IsString(dt) ? dt->valuestring : "";
        if (strcmp(s, "bfloat16") == 0) c->dtype = MDL_DT_BF16;
        else if (strcmp(s, "float16") == 0) c->dtype = MDL_DT_F16;
        else if (strcmp(s, "float32") == 0) c->dtype = MDL_DT_F32;
        else {
            snprintf(err, errlen, "config.json: unsupported %s %.40s (bfloat16, float16 or float32)",
                     dt5 ? "dtype" : "torch_dtype", s);
            return -1;
        }
    }

    /* Sliding windows. Qwen2 / Qwen3 (transformers Qwen2Config / Qwen3Config): the window is
     * sliding_window (class default 4096) when use_sliding_window, else none; without an explicit
     * layer_types, layers i >= max_window_layers (class default 28) slide. A window of W keys
     * changes nothing for sequences of at most W tokens, and graphswap runs none longer than
     * max_position_embeddings: accepted when no layer slides or W >= max_position_embeddings,
     * refused otherwise. Llama has no sliding window. */
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window");
    if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v)) {
        snprintf(err, errlen, "config.json: field use_sliding_window must be true or false");
        return -1;
    }
    const int use_sw = v && cJSON_IsTrue(v);
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (sw && !cJSON_IsNull(sw) &&
        (!cJSON_IsNumber(sw) || sw->valuedouble != floor(sw->valuedouble) || sw->valuedouble < 1)) {
        snprintf(err, errlen, "config.json: field sliding_window must be a positive integer or null");
        return -1;
    }
    const cJSON *mwl = cJSON_GetObjectItemCaseSensitive(root, "max_window_layers");
    if (mwl && !cJSON_IsNull(mwl) && (!cJSON_IsNumber(mwl) || mwl->valuedouble != floor(mwl->valuedouble) ||
                                      mwl->valuedouble < 0)) {
        snprintf(err, errlen, "config.json: field max_window_layers must be a non-negative integer");
        return -1;
    }
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    int sliding_layers = 0;
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->layers) {
            snprintf(err, errlen, "config.json: field layer_types must be a list of num_hidden_layers (%d) strings",
                     c->layers);
            return -1;
        }
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, lt)
        {
            const char *s = cJSON_IsString(e) ? e->valuestring : "";
            if (strcmp(s, "sliding_attention") == 0) sliding_layers++;
            else if (strcmp(s, "full_attention") != 0) {
                snprintf(err, errlen, "config.json: layer_types[%d] \"%.40s\" is not supported (full_attention, "
                         "or sliding_attention with a window of at least max_position_embeddings)", i, s);
                return -1;
            }
            i++;
        }
    } else {
        const int first = mwl && cJSON_IsNumber(mwl) ? (int)fmin(mwl->valuedouble, (double)c->layers) : 28;
        sliding_layers = c->layers > first ? c->layers - first : 0;
    }
    if (c->arch == MDL_ARCH_LLAMA) return 0; /* LlamaForCausalLM reads none of these */
    /* an absent sliding_window is the config class default (4096); null means none */
    const int window = !use_sw ? 0 : !sw ? 4096 : cJSON_IsNumber(sw) ? (int)fmin(sw->valuedouble, 1 << 30) : 0;
    if (window > 0 && sliding_layers > 0 && window < c->max_pos) {
        snprintf(err, errlen,
                 "config.json: use_sliding_window=true with sliding_window %d below max_position_embeddings %d on "
                 "%d layer(s) is not supported (sliding-window attention)",
                 window, c->max_pos, sliding_layers);
        return -1;
    }
    return 0;
}
