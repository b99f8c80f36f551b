/* models/mkmodel.c — writes a random-init checkpoint (config.json, safetensors shards, index,
 * tokenizer files) in exactly the layout and naming of a Hugging Face Qwen3 / Llama / Qwen2 folder.
 *
 * Initialisation is chosen so that tests are meaningful, not to look trained: matrices are
 * N(0, 1/fan_in) and embeddings N(0, 4/hidden), so activations keep unit scale through depth and
 * logits spread by O(1) (greedy
 * choices are never near-ties), norm weights are 1 + N(0, 0.1^2), biases N(0, 0.1^2). The stream of
 * numbers depends only on the seed and the tensor order, so a seed names a checkpoint.
 */
#include "models/mkmodel.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "kernels/kern.h"
#include "models/format/json_guard.h"
#include "models/format/safetensors.h"
#include "models/tokenizer/tokenizer.h"

void mdl_mkmodel_defaults(mdl_mkmodel_opts *o)
{
    memset(o, 0, sizeof *o);
    o->arch = MDL_ARCH_QWEN3;
    o->hidden = 64;
    o->layers = 2;
    o->heads = 4;
    o->kv_heads = 2;
    o->head_dim = 16;
    o->intermediate = 128;
    o->vocab = 1024;
    o->max_pos = 4096;
    o->tie = 1;
    o->dtype = MDL_DT_BF16;
    o->shards = 1;
    o->seed = 0;
    o->tokenizer = 1;
    o->markov_rank = 16;
    o->conf_head = 1;
    o->mask_token_id = -1;
    o->rope_truncate = -1;
    o->experts = 8;
    o->experts_per_tok = 2;
    o->moe_inter = 32;
    o->norm_topk = 1;
    o->sparse_step = 1;
}

/* The rope_scaling (v4) / rope_parameters (v5) object of the options, or NULL for plain RoPE in v4. */
static cJSON *rope_object(const mdl_mkmodel_opts *o, double theta)
{
    if (!o->rope_type && !o->config_v5) return NULL;
    cJSON *r = cJSON_CreateObject();
    if (o->config_v5) cJSON_AddNumberToObject(r, "rope_theta", theta);
    cJSON_AddStringToObject(r, "rope_type", o->rope_type ? o->rope_type : "default");
    const struct {
        const char *key;
        double v;
    } nums[] = {{"factor", o->rope_factor},
                {"low_freq_factor", o->rope_low_freq_factor},
                {"high_freq_factor", o->rope_high_freq_factor},
                {"original_max_position_embeddings", o->rope_orig_max_pos},
                {"beta_fast", o->rope_beta_fast},
                {"beta_slow", o->rope_beta_slow},
                {"mscale", o->rope_mscale},
                {"mscale_all_dim", o->rope_mscale_all_dim},
                {"attention_factor", o->rope_attention_factor}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (nums[i].v != 0) cJSON_AddNumberToObject(r, nums[i].key, nums[i].v);
    if (o->rope_truncate >= 0) cJSON_AddBoolToObject(r, "truncate", o->rope_truncate);
    return r;
}

typedef struct {
    uint64_t s;
    int have_spare;
    double spare;
} rng_t;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double normal(rng_t *r)
{
    if (r->have_spare) {
        r->have_spare = 0;
        return r->spare;
    }
    double u1 = ((double)(splitmix(&r->s) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (double)(splitmix(&r->s) >> 11) / 9007199254740992.0;
    double m = sqrt(-2.0 * log(u1));
    r->spare = m * sin(2 * M_PI * u2);
    r->have_spare = 1;
    return m * cos(2 * M_PI * u2);
}

typedef struct {
    char name[192];
    int ndim;
    int64_t shape[3];
    void *data; /* in the output dtype (dtype: the set's, or F8_E4M3 / F32 for FP8 codes and scales) */
    size_t bytes;
    int shard;
    int fp8;    /* 0: the set's dtype; 1: F8_E4M3 codes; 2: F32 block scales; 3: scales in the set's
                   dtype (compressed-tensors) */
} gen_tensor;

typedef struct {
    gen_tensor *t;
    int n, cap;
    rng_t rng;
    mdl_dtype dt;
    int failed;
} gen_set;

/* kind: 0 matrix N(0,1/fan_in) (fan_in = shape[1]), 1 norm 1+N(0,.01), 2 bias N(0,.01),
 * 3 embedding N(0, 4/hidden) */
static void gen(gen_set *g, const char *name, int64_t rows, int64_t cols, int kind)
{
    if (g->failed) return;
    if (g->n == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 64;
        gen_tensor *nt = realloc(g->t, (size_t)g->cap * sizeof *nt);
        if (!nt) {
            g->failed = 1;
            return;
        }
        g->t = nt;
    }
    gen_tensor *t = &g->t[g->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    float *f = malloc(n * sizeof *f);
    t->bytes = n * mdl_dtype_size(g->dt);
    t->data = malloc(t->bytes ? t->bytes : 1);
    if (!f || !t->data) {
        free(f);
        free(t->data);
        g->failed = 1;
        return;
    }
    double sd = kind == 0 ? 1.0 / sqrt((double)cols) : kind == 3 ? 2.0 / sqrt((double)cols) : 0.1;
    for (size_t i = 0; i < n; i++) f[i] = (float)((kind == 1 ? 1.0 : 0.0) + sd * normal(&g->rng));
    mdl_convert(t->data, g->dt, f, MDL_DT_F32, n);
    free(f);
    g->n++;
}

/* Quantizes tensor i (a projection [rows, cols] in the set's dtype) to FP8: its data becomes the
 * codes (or, dequant, f32(q) * s back in the set's dtype) and, unless dequant, a scale tensor is
 * appended: NAME_scale_inv of F32 block scales, or (ct: compressed-tensors) NAME_scale in the set's
 * dtype, per block, per row [rows, 1] or per tensor [1] (scheme). */
static void quantize_fp8(gen_set *g, int i, int b0, int b1, int dequant, int ct, int scheme)
{
    if (g->failed) return;
    gen_tensor *t = &g->t[i];
    const int64_t R = t->shape[0], C = t->shape[1];
    if (scheme != MDL_FP8_BLOCK) b0 = scheme == MDL_FP8_TENSOR ? (int)R : 1, b1 = (int)C;
    const int64_t SR = (R + b0 - 1) / b0, SC = (C + b1 - 1) / b1;
    const size_t n = (size_t)R * (size_t)C;
    float *w = malloc(n * sizeof *w), *s = malloc((size_t)(SR * SC) * sizeof *s);
    uint8_t *q = malloc(n);
    if (!w || !s || !q || mdl_convert(w, MDL_DT_F32, t->data, g->dt, n) != 0) {
        free(w), free(s), free(q);
        g->failed = 1;
        return;
    }
    mdl_fp8_quantize(w, R, C, b0, b1, ct ? g->dt : MDL_DT_F32, q, s);
    for (size_t k = 0; k < n; k++) /* the dequantized weight (kern.h KOP_MATMUL) */
        w[k] = kern_fp8_to_f32(q[k]) * s[(k / (size_t)C / (size_t)b0) * (size_t)SC + (k % (size_t)C) / (size_t)b1];
    free(t->data);
    if (dequant) {
        t->data = malloc(t->bytes ? t->bytes : 1);
        if (!t->data || mdl_convert(t->data, g->dt, w, MDL_DT_F32, n) != 0) g->failed = 1;
        free(w), free(s), free(q);
        return;
    }
    t->data = q;
    t->bytes = n;
    t->fp8 = 1;
    free(w);
    char name[192];
    snprintf(name, sizeof name, "%.170s_scale%s", t->name, ct ? "" : "_inv");
    const mdl_dtype dt = g->dt;
    const rng_t rng = g->rng; /* the slot's random fill must not shift the tensors after it */
    if (!ct) g->dt = MDL_DT_F32;
    /* a slot of the right size, overwritten below: [SR, SC], or [1] for a per-tensor scale */
    gen(g, name, scheme == MDL_FP8_TENSOR ? 1 : SR, scheme == MDL_FP8_TENSOR ? 0 : SC, 1);
    g->dt = dt;
    g->rng = rng;
    if (g->failed) {
        free(s);
        return;
    }
    gen_tensor *st = &g->t[g->n - 1];
    if (mdl_convert(st->data, ct ? dt : MDL_DT_F32, s, MDL_DT_F32, (size_t)(SR * SC)) != 0) g->failed = 1;
    st->fp8 = ct ? 3 : 2;
    free(s);
}

static int write_json(const char *path, cJSON *j, char *err, size_t errlen)
{
    char *txt = cJSON_Print(j);
    FILE *f = txt ? fopen(path, "w") : NULL;
    int ok = f && fputs(txt, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = 0;
    free(txt);
    if (!ok) snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    return ok ? 0 : -1;
}

/* mkdir -p */
static int mkdir_p(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
        *c = '/';
    }
    return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static const char *model_type(mdl_arch a)
{
    return a == MDL_ARCH_LLAMA ? "llama" : a == MDL_ARCH_QWEN2 ? "qwen2" : a == MDL_ARCH_QWEN3_MOE ? "qwen3_moe" : "qwen3";
}

/* Replaces the last 3 * E tensors (expert e: gate [I, H], up [I, H], down [H, I], e ascending) by
 * transformers 5's fused pair: gate_up_proj [E, 2I, H] (each expert's gate rows, then its up rows)
 * and down_proj [E, H, I]. The bytes are those of the per-expert tensors, in that order. */
static void fuse_experts(gen_set *g, const char *prefix, int E)
{
    if (g->failed) return;
    gen_tensor *t = g->t + g->n - 3 * E;
    const size_t gb = t[0].bytes, db = t[2].bytes;
    uint8_t *gu = malloc((size_t)E * 2 * gb), *dn = malloc((size_t)E * db);
    if (!gu || !dn) {
        free(gu);
        free(dn);
        g->failed = 1;
        return;
    }
    const int64_t I = t[0].shape[0], H = t[0].shape[1];
    for (int e = 0; e < E; e++) {
        memcpy(gu + (size_t)e * 2 * gb, t[3 * e].data, gb);
        memcpy(gu + (size_t)e * 2 * gb + gb, t[3 * e + 1].data, gb);
        memcpy(dn + (size_t)e * db, t[3 * e + 2].data, db);
    }
    for (int i = 0; i < 3 * E; i++) free(t[i].data);
    g->n -= 3 * E;
    gen_tensor *a = &g->t[g->n++], *b = &g->t[g->n++];
    memset(a, 0, sizeof *a);
    memset(b, 0, sizeof *b);
    snprintf(a->name, sizeof a->name, "%sgate_up_proj", prefix);
    a->ndim = 3, a->shape[0] = E, a->shape[1] = 2 * I, a->shape[2] = H, a->data = gu, a->bytes = (size_t)E * 2 * gb;
    snprintf(b->name, sizeof b->name, "%sdown_proj", prefix);
    b->ndim = 3, b->shape[0] = E, b->shape[1] = H, b->shape[2] = I, b->data = dn, b->bytes = (size_t)E * db;
}

static const char *torch_dtype(mdl_dtype d)
{
    return d == MDL_DT_BF16 ? "bfloat16" : d == MDL_DT_F16 ? "float16" : "float32";
}

/* Appends a copy of a tensor of the target checkpoint (DSpark's frozen embed_tokens / lm_head). */
static int gen_copy(gen_set *g, const char *target_dir, const char *src_name, const char *out_name, char *err,
                    size_t errlen)
{
    char path[4352];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", target_dir);
    char file[512] = "model.safetensors";
    size_t len;
    char *txt = mdl_read_file(path, 64u << 20, &len, err, errlen);
    if (txt) { /* sharded target: find the shard holding the tensor */
        cJSON *idx = mdl_json_parse(txt, len, MDL_JSON_MAX_DEPTH, 0, NULL, NULL, 0);
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(idx, "weight_map"), src_name);
        if (cJSON_IsString(f) && !strchr(f->valuestring, '/')) snprintf(file, sizeof file, "%s", f->valuestring);
        cJSON_Delete(idx);
        free(txt);
    }
    snprintf(path, sizeof path, "%s/%s", target_dir, file);
    mdl_st_file st;
    if (mdl_st_open(path, &st, err, errlen) != 0) return -1;
    const mdl_st_tensor *t = mdl_st_find(&st, src_name);
    int rc = -1;
    if (!t || t->ndim != 2) {
        snprintf(err, errlen, "%s: no 2-D tensor %s", path, src_name);
    } else {
        gen(g, out_name, t->shape[0], t->shape[1], 0); /* allocates; contents replaced below */
        if (!g->failed && mdl_convert(g->t[g->n - 1].data, g->dt, t->data, t->dtype, t->numel) == 0) rc = 0;
        else snprintf(err, errlen, "%s: cannot convert %s", path, src_name);
    }
    mdl_st_close(&st);
    return rc;
}

int mdl_mkmodel(const mdl_mkmodel_opts *o_in, const char *dir, char *err, size_t errlen)
{
    mdl_mkmodel_opts dopt = *o_in;
    const mdl_mkmodel_opts *o = &dopt;
    const int drafter = o->arch == MDL_ARCH_DFLASH || o->arch == MDL_ARCH_DSPARK;
    mdl_config tcfg;
    if (drafter) { /* geometry of the target */
        if (!o->target_dir) {
            snprintf(err, errlen, "a drafter needs --target DIR");
            return -1;
        }
        if (mdl_config_load(o->target_dir, &tcfg, err, errlen) != 0) return -1;
        if (tcfg.is_drafter) {
            snprintf(err, errlen, "--target must be a target model, not a drafter");
            return -1;
        }
        dopt.hidden = tcfg.hidden;
        dopt.vocab = tcfg.vocab;
        dopt.heads = tcfg.heads;
        dopt.kv_heads = tcfg.kv_heads;
        dopt.head_dim = tcfg.head_dim;
        dopt.intermediate = tcfg.intermediate;
        dopt.max_pos = tcfg.max_pos;
        dopt.dtype = tcfg.dtype;
        dopt.tie = 0;
        dopt.shards = 1;
        dopt.tokenizer = 0;
        if (!dopt.block_size) dopt.block_size = o->arch == MDL_ARCH_DFLASH ? 8 : 7;
        if (dopt.mask_token_id < 0) dopt.mask_token_id = tcfg.vocab >= 8 ? tcfg.vocab - 4 : 0;
        if (!dopt.n_target_ids) { /* one per drafter layer, spread over [0, L-2] */
            int L = tcfg.layers, k = o->layers < L - 1 ? o->layers : L - 1;
            if (k < 1) {
                snprintf(err, errlen, "the target needs at least 2 layers for a drafter");
                return -1;
            }
            for (int i = 0; i < k; i++) dopt.target_ids[i] = k == 1 ? (L - 2) / 2 : i * (L - 2) / (k - 1);
            dopt.n_target_ids = k;
        }
        for (int i = 0; i < dopt.n_target_ids; i++)
            if (dopt.target_ids[i] < -1 || dopt.target_ids[i] > tcfg.layers - 1 ||
                (i > 0 && dopt.target_ids[i] <= dopt.target_ids[i - 1])) {
                snprintf(err, errlen, "target layer ids must be strictly increasing, each -1 or in [0, %d]",
                         tcfg.layers - 1);
                return -1;
            }
        if (o->arch == MDL_ARCH_DFLASH) dopt.markov_rank = 0, dopt.conf_head = 0;
    }
    if (o->hidden < 1 || o->layers < 1 || o->heads < 1 || o->kv_heads < 1 || o->head_dim < 2 ||
        o->head_dim % 2 || o->heads % o->kv_heads || o->intermediate < 1 || o->vocab < 2 || o->shards < 1) {
        snprintf(err, errlen, "invalid model shape (need heads %% kv_heads == 0, even head_dim, sizes >= 1)");
        return -1;
    }
    if (mkdir_p(dir) != 0) {
        snprintf(err, errlen, "%s: cannot create: %s", dir, strerror(errno));
        return -1;
    }
    int bos = o->vocab - 2 >= 0 ? o->vocab - 2 : 0, eos = o->vocab - 1;
    if (drafter) {
        bos = tcfg.bos;
        eos = tcfg.n_eos ? tcfg.eos[0] : -1;
    }
    if (o->tokenizer && o->vocab >= 512) {
        if (mdl_tok_write_default(dir, o->vocab, err, errlen) != 0) return -1;
        mdl_tokenizer *tk = mdl_tok_load(dir, err, errlen);
        if (!tk) return -1;
        bos = mdl_tok_token_id(tk, "<|endoftext|>");
        eos = mdl_tok_token_id(tk, "<|im_end|>");
        mdl_tok_free(tk);
    }

    /* Qwen3-MoE's sparse layers, by the rule of transformers' Qwen3MoeDecoderLayer */
    unsigned char sparse[MDL_MAX_LAYERS] = {0};
    if (o->arch == MDL_ARCH_QWEN3_MOE) {
        if (o->experts < 1 || o->experts > KERN_MAX_EXPERTS || o->experts_per_tok < 1 ||
            o->experts_per_tok > o->experts || o->moe_inter < 1 || o->sparse_step < 1 || o->layers > MDL_MAX_LAYERS) {
            snprintf(err, errlen, "invalid MoE shape (need 1 <= experts-per-tok <= experts <= %d, sizes >= 1)",
                     KERN_MAX_EXPERTS);
            return -1;
        }
        for (int l = 0; l < o->layers; l++) sparse[l] = (l + 1) % o->sparse_step == 0;
        for (int i = 0; i < o->n_mlp_only; i++) {
            if (o->mlp_only[i] < 0 || o->mlp_only[i] >= o->layers) {
                snprintf(err, errlen, "mlp-only layer %d is not a layer of this model", o->mlp_only[i]);
                return -1;
            }
            sparse[o->mlp_only[i]] = 0;
        }
    }
    if (o->fp8_b0 > 0 && (o->moe_fused || o->fp8_b1 < 16 || (o->fp8_b1 & (o->fp8_b1 - 1)))) {
        snprintf(err, errlen, "--fp8: experts one tensor per part (not --moe-fused), with a column block that is "
                              "a power of two >= 16");
        return -1;
    }
    gen_set g = {.rng = {.s = o->seed * 0x2545F4914F6CDD1Dull + 1}, .dt = o->dtype};
    const int64_t H = o->hidden, I = o->intermediate, hd = o->head_dim;
    char nm[160];
    const char *pre = drafter ? "" : "model.";
    int rc = -1;
    cJSON *cfg = NULL, *idx = NULL;
    mdl_st_out *outs = NULL;
    if (!drafter) gen(&g, "model.embed_tokens.weight", o->vocab, H, 3);
    if (o->arch == MDL_ARCH_DSPARK &&
        gen_copy(&g, o->target_dir, "model.embed_tokens.weight", "embed_tokens.weight", err, errlen) != 0)
        goto out;
    if (drafter) {
        gen(&g, "fc.weight", H, (int64_t)o->n_target_ids * H, 0);
        gen(&g, "hidden_norm.weight", H, 0, 1);
    }
    for (int l = 0; l < o->layers; l++) {
#define G(fmt, r, c, k)                                                                                \
    snprintf(nm, sizeof nm, "%slayers.%d." fmt, pre, l);                                                \
    gen(&g, nm, r, c, k)
        G("input_layernorm.weight", H, 0, 1);
        G("self_attn.q_proj.weight", o->heads * hd, H, 0);
        G("self_attn.k_proj.weight", o->kv_heads * hd, H, 0);
        G("self_attn.v_proj.weight", o->kv_heads * hd, H, 0);
        if (o->arch == MDL_ARCH_QWEN2) {
            G("self_attn.q_proj.bias", o->heads * hd, 0, 2);
            G("self_attn.k_proj.bias", o->kv_heads * hd, 0, 2);
            G("self_attn.v_proj.bias", o->kv_heads * hd, 0, 2);
        }
        G("self_attn.o_proj.weight", H, o->heads * hd, 0);
        if (o->arch != MDL_ARCH_LLAMA && o->arch != MDL_ARCH_QWEN2) {
            G("self_attn.q_norm.weight", hd, 0, 1);
            G("self_attn.k_norm.weight", hd, 0, 1);
        }
        G("post_attention_layernorm.weight", H, 0, 1);
        if (sparse[l]) { /* Qwen3-MoE: the router, then each expert (HF's order) */
            G("mlp.gate.weight", o->experts, H, 0);
            for (int e = 0; e < o->experts; e++) {
                char ex[96];
                snprintf(ex, sizeof ex, "mlp.experts.%d.", e);
                snprintf(nm, sizeof nm, "%slayers.%d.%sgate_proj.weight", pre, l, ex);
                gen(&g, nm, o->moe_inter, H, 0);
                snprintf(nm, sizeof nm, "%slayers.%d.%sup_proj.weight", pre, l, ex);
                gen(&g, nm, o->moe_inter, H, 0);
                snprintf(nm, sizeof nm, "%slayers.%d.%sdown_proj.weight", pre, l, ex);
                gen(&g, nm, H, o->moe_inter, 0);
            }
            if (o->moe_fused) {
                snprintf(nm, sizeof nm, "%slayers.%d.mlp.experts.", pre, l);
                fuse_experts(&g, nm, o->experts);
            }
            continue;
        }
        G("mlp.gate_proj.weight", I, H, 0);
        G("mlp.up_proj.weight", I, H, 0);
        G("mlp.down_proj.weight", H, I, 0);
#undef G
    }
    if (o->fp8_b0 > 0) /* block FP8: every projection of every layer, and a drafter's fc */
        for (int i = 0, n0 = g.n; i < n0; i++) {
            const char *nm_i = g.t[i].name, *dot = strrchr(nm_i, '.');
            if ((dot && strcmp(dot, ".weight") == 0 && dot - nm_i > 5 && strncmp(dot - 5, "_proj", 5) == 0) ||
                strcmp(nm_i, "fc.weight") == 0)
                quantize_fp8(&g, i, o->fp8_b0, o->fp8_b1, o->fp8_dequant, o->fp8_ct, o->fp8_scheme);
        }
    snprintf(nm, sizeof nm, "%snorm.weight", pre);
    gen(&g, nm, H, 0, 1);
    if (!drafter && !o->tie) {
        gen(&g, "lm_head.weight", o->vocab, H, 0);
        if (o->fp8_lm_head) quantize_fp8(&g, g.n - 1, o->fp8_b0, o->fp8_b1, 1, 0, MDL_FP8_BLOCK);
    }
    if (o->arch == MDL_ARCH_DSPARK) {
        if (gen_copy(&g, o->target_dir, tcfg.tie ? "model.embed_tokens.weight" : "lm_head.weight",
                     "lm_head.weight", err, errlen) != 0)
            goto out;
        if (o->markov_rank > 0) { /* scaled so the Markov bias is O(1) next to the lm_head logits */
            gen(&g, "markov_head.markov_w1.weight", o->vocab, o->markov_rank, 3);
            gen(&g, "markov_head.markov_w2.weight", o->vocab, o->markov_rank, 0);
        }
        if (o->conf_head) {
            gen(&g, "confidence_head.proj.weight", 1, H + o->markov_rank, 0);
            gen(&g, "confidence_head.proj.bias", 1, 0, 2);
        }
    }
    if (g.failed) {
        snprintf(err, errlen, "out of memory generating weights");
        goto out;
    }
    /* shards: consecutive runs of tensors of about equal bytes */
    size_t total = 0, acc = 0;
    for (int i = 0; i < g.n; i++) total += g.t[i].bytes;
    int shards = o->shards > g.n ? g.n : o->shards;
    for (int i = 0; i < g.n; i++) {
        int s = (int)((acc * (size_t)shards) / (total ? total : 1));
        g.t[i].shard = s < shards ? s : shards - 1;
        acc += g.t[i].bytes;
    }
    outs = calloc((size_t)g.n, sizeof *outs);
    if (!outs) goto out;
    idx = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(idx, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *wm = cJSON_AddObjectToObject(idx, "weight_map");
    static const char *const st_meta[] = {"format", "pt", NULL};
    for (int s = 0; s < shards; s++) {
        char file[128], path[4352];
        if (shards == 1) snprintf(file, sizeof file, "model.safetensors");
        else snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, shards);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        size_t n = 0;
        for (int i = 0; i < g.n; i++) {
            if (g.t[i].shard != s) continue;
            mdl_st_out *q = &outs[n++];
            q->name = g.t[i].name;
            q->dtype = g.t[i].fp8 == 1 ? MDL_DT_F8_E4M3 : g.t[i].fp8 == 2 ? MDL_DT_F32 : o->dtype;
            q->ndim = g.t[i].ndim;
            q->shape[0] = g.t[i].shape[0];
            q->shape[1] = g.t[i].shape[1];
            q->shape[2] = g.t[i].shape[2];
            q->data = g.t[i].data;
            cJSON_AddStringToObject(wm, g.t[i].name, file);
        }
        if (mdl_st_write(path, outs, n, st_meta, err, errlen) != 0) goto out;
    }
    if (shards > 1) {
        char path[4352];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (write_json(path, idx, err, errlen) != 0) goto out;
    }

    cfg = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(cfg, "architectures");
    if (drafter) {
        cJSON_AddNumberToObject(cfg, "num_target_layers", tcfg.layers);
        cJSON_AddNumberToObject(cfg, "block_size", o->block_size);
        cJSON *ids = cJSON_CreateIntArray(o->target_ids, o->n_target_ids);
        if (o->arch == MDL_ARCH_DFLASH) {
            cJSON *dc = cJSON_AddObjectToObject(cfg, "dflash_config");
            cJSON_AddNumberToObject(dc, "mask_token_id", o->mask_token_id);
            cJSON_AddItemToObject(dc, "target_layer_ids", ids);
        } else { /* every field DeepSpec's build_draft_config sets (DS@afdfa7c qwen3/config.py:37-56) */
            cJSON_AddNumberToObject(cfg, "mask_token_id", o->mask_token_id);
            cJSON_AddItemToObject(cfg, "target_layer_ids", ids);
            cJSON_AddNumberToObject(cfg, "num_anchors", 512); /* training only (DS config/dspark/dspark_qwen3_8b.py) */
            cJSON_AddNumberToObject(cfg, "markov_rank", o->markov_rank);
            if (o->markov_rank > 0) cJSON_AddStringToObject(cfg, "markov_head_type", "vanilla");
            cJSON_AddBoolToObject(cfg, "enable_confidence_head", o->conf_head);
            if (o->conf_head) cJSON_AddBoolToObject(cfg, "confidence_head_with_markov", o->markov_rank > 0);
        }
    }
    cJSON_AddItemToArray(archs, cJSON_CreateString(mdl_arch_name(o->arch)));
    cJSON_AddStringToObject(cfg, "model_type", model_type(o->arch));
    cJSON_AddNumberToObject(cfg, "hidden_size", o->hidden);
    cJSON_AddNumberToObject(cfg, "intermediate_size", o->intermediate);
    cJSON_AddNumberToObject(cfg, "num_hidden_layers", o->layers);
    cJSON_AddNumberToObject(cfg, "num_attention_heads", o->heads);
    cJSON_AddNumberToObject(cfg, "num_key_value_heads", o->kv_heads);
    cJSON_AddNumberToObject(cfg, "head_dim", o->head_dim);
    cJSON_AddNumberToObject(cfg, "vocab_size", o->vocab);
    cJSON_AddNumberToObject(cfg, "max_position_embeddings", o->max_pos);
    cJSON_AddNumberToObject(cfg, "rms_norm_eps", 1e-6);
    const double theta = o->rope_theta > 0 ? o->rope_theta : o->arch == MDL_ARCH_LLAMA ? 500000.0 : 1000000.0;
    cJSON *rope = drafter ? NULL : rope_object(o, theta);
    if (!o->config_v5 || drafter) cJSON_AddNumberToObject(cfg, "rope_theta", theta);
    cJSON_AddBoolToObject(cfg, "tie_word_embeddings", o->tie);
    cJSON_AddNumberToObject(cfg, "bos_token_id", bos);
    cJSON_AddNumberToObject(cfg, "eos_token_id", eos);
    cJSON_AddStringToObject(cfg, o->config_v5 && !drafter ? "dtype" : "torch_dtype", torch_dtype(o->dtype));
    cJSON_AddStringToObject(cfg, "hidden_act", "silu");
    if (o->config_v5 && !drafter) cJSON_AddItemToObject(cfg, "rope_parameters", rope);
    else if (rope) cJSON_AddItemToObject(cfg, "rope_scaling", rope);
    else cJSON_AddNullToObject(cfg, "rope_scaling");
    cJSON_AddNumberToObject(cfg, "initializer_range", 0.02);
    cJSON_AddBoolToObject(cfg, "use_cache", 1);
    if (o->arch != MDL_ARCH_QWEN2) cJSON_AddBoolToObject(cfg, "attention_bias", 0);
    if (o->arch == MDL_ARCH_LLAMA) cJSON_AddBoolToObject(cfg, "mlp_bias", 0);
    if (o->arch == MDL_ARCH_QWEN3_MOE) { /* Qwen3MoeConfig's fields, as Qwen3-30B-A3B's config.json has them */
        cJSON_AddNumberToObject(cfg, "num_experts", o->experts);
        cJSON_AddNumberToObject(cfg, "num_experts_per_tok", o->experts_per_tok);
        cJSON_AddNumberToObject(cfg, "moe_intermediate_size", o->moe_inter);
        cJSON_AddBoolToObject(cfg, "norm_topk_prob", o->norm_topk);
        cJSON_AddNumberToObject(cfg, "decoder_sparse_step", o->sparse_step);
        cJSON_AddItemToObject(cfg, "mlp_only_layers", cJSON_CreateIntArray(o->mlp_only, o->n_mlp_only));
        cJSON_AddNumberToObject(cfg, "router_aux_loss_coef", 0.001);
        cJSON_AddBoolToObject(cfg, "output_router_logits", 0);
    }
    if (o->fp8_b0 > 0 && !o->fp8_dequant && o->fp8_ct) { /* as llm-compressor writes it */
        cJSON *qc = cJSON_AddObjectToObject(cfg, "quantization_config");
        cJSON *groups = cJSON_AddObjectToObject(qc, "config_groups");
        cJSON *g0 = cJSON_AddObjectToObject(groups, "group_0");
        cJSON_AddStringToObject(g0, "format", "float-quantized");
        cJSON *ia = cJSON_AddObjectToObject(g0, "input_activations");
        cJSON_AddBoolToObject(ia, "dynamic", 1);
        cJSON_AddNumberToObject(ia, "num_bits", 8);
        cJSON_AddStringToObject(ia, "strategy", "token");
        cJSON_AddBoolToObject(ia, "symmetric", 1);
        cJSON_AddStringToObject(ia, "type", "float");
        cJSON_AddNullToObject(g0, "output_activations");
        cJSON *tg = cJSON_AddArrayToObject(g0, "targets");
        cJSON_AddItemToArray(tg, cJSON_CreateString("Linear"));
        cJSON *w = cJSON_AddObjectToObject(g0, "weights");
        if (o->fp8_scheme == MDL_FP8_BLOCK) {
            const int bs[2] = {o->fp8_b0, o->fp8_b1};
            cJSON_AddItemToObject(w, "block_structure", cJSON_CreateIntArray(bs, 2));
        } else {
            cJSON_AddNullToObject(w, "block_structure");
        }
        cJSON_AddBoolToObject(w, "dynamic", 0);
        cJSON_AddNullToObject(w, "group_size");
        cJSON_AddNumberToObject(w, "num_bits", 8);
        cJSON_AddStringToObject(w, "observer", "minmax");
        cJSON_AddStringToObject(w, "strategy", o->fp8_scheme == MDL_FP8_BLOCK     ? "block"
                                               : o->fp8_scheme == MDL_FP8_CHANNEL ? "channel"
                                                                                  : "tensor");
        cJSON_AddBoolToObject(w, "symmetric", 1);
        cJSON_AddStringToObject(w, "type", "float");
        cJSON_AddStringToObject(qc, "format", "float-quantized");
        cJSON *ig = cJSON_AddArrayToObject(qc, "ignore");
        cJSON_AddItemToArray(ig, cJSON_CreateString("lm_head"));
        if (o->arch == MDL_ARCH_QWEN3_MOE) /* the routers, as llm-compressor's MoE recipes keep them */
            cJSON_AddItemToArray(ig, cJSON_CreateString("re:.*mlp\\.gate$"));
        if (o->arch == MDL_ARCH_DSPARK) /* its heads stay unquantized, as lm_head */
            cJSON_AddItemToArray(ig, cJSON_CreateString("re:^(markov_head|confidence_head)\\."));
        cJSON_AddNullToObject(qc, "kv_cache_scheme");
        cJSON_AddStringToObject(qc, "quant_method", "compressed-tensors");
        cJSON_AddStringToObject(qc, "quantization_status", "compressed");
    } else if (o->fp8_b0 > 0 && !o->fp8_dequant) { /* as Qwen3-8B-FP8's config.json has it */
        cJSON *qc = cJSON_AddObjectToObject(cfg, "quantization_config");
        cJSON_AddStringToObject(qc, "activation_scheme", "dynamic");
        cJSON_AddStringToObject(qc, "fmt", "e4m3");
        cJSON_AddStringToObject(qc, "quant_method", "fp8");
        const int bs[2] = {o->fp8_b0, o->fp8_b1};
        cJSON_AddItemToObject(qc, "weight_block_size", cJSON_CreateIntArray(bs, 2));
        cJSON *nc = cJSON_AddArrayToObject(qc, "modules_to_not_convert");
        cJSON_AddItemToArray(nc, cJSON_CreateString("lm_head"));
    }
    if (o->arch != MDL_ARCH_LLAMA && o->arch != MDL_ARCH_DFLASH) { /* DSpark: a copy of the target's */
        cJSON_AddBoolToObject(cfg, "use_sliding_window", 0);
        cJSON_AddNullToObject(cfg, "sliding_window");
        cJSON_AddNumberToObject(cfg, "max_window_layers", o->arch == MDL_ARCH_DSPARK ? tcfg.layers : o->layers);
    }
    if (drafter) {
        cJSON *lt = cJSON_AddArrayToObject(cfg, "layer_types");
        for (int l = 0; l < o->layers; l++) cJSON_AddItemToArray(lt, cJSON_CreateString("full_attention"));
        cJSON_AddNumberToObject(cfg, "attention_dropout", 0.0);
    }
    cJSON_AddStringToObject(cfg, "transformers_version", o->config_v5 && !drafter ? "5.0.0" : "4.51.0");
    char path[4352];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (write_json(path, cfg, err, errlen) != 0) goto out;
    rc = 0;
out:
    for (int i = 0; i < g.n; i++) free(g.t[i].data);
    free(g.t);
    free(outs);
    cJSON_Delete(cfg);
    cJSON_Delete(idx);
    return rc;
}
