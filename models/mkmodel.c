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

#include "models/safetensors.h"
#include "models/tokenizer.h"

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
    char name[128];
    int ndim;
    int64_t shape[2];
    void *data; /* in the output dtype */
    size_t bytes;
    int shard;
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

static const char *model_type(mdl_arch a)
{
    return a == MDL_ARCH_QWEN3 ? "qwen3" : a == MDL_ARCH_LLAMA ? "llama" : "qwen2";
}

static const char *torch_dtype(mdl_dtype d)
{
    return d == MDL_DT_BF16 ? "bfloat16" : d == MDL_DT_F16 ? "float16" : "float32";
}

int mdl_mkmodel(const mdl_mkmodel_opts *o, const char *dir, char *err, size_t errlen)
{
    if (o->hidden < 1 || o->layers < 1 || o->heads < 1 || o->kv_heads < 1 || o->head_dim < 2 ||
        o->head_dim % 2 || o->heads % o->kv_heads || o->intermediate < 1 || o->vocab < 2 || o->shards < 1) {
        snprintf(err, errlen, "invalid model shape (need heads %% kv_heads == 0, even head_dim, sizes >= 1)");
        return -1;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: cannot create: %s", dir, strerror(errno));
        return -1;
    }
    int bos = o->vocab - 2 >= 0 ? o->vocab - 2 : 0, eos = o->vocab - 1;
    if (o->tokenizer && o->vocab >= 512) {
        if (mdl_tok_write_default(dir, o->vocab, err, errlen) != 0) return -1;
        mdl_tokenizer *tk = mdl_tok_load(dir, err, errlen);
        if (!tk) return -1;
        bos = mdl_tok_token_id(tk, "<|endoftext|>");
        eos = mdl_tok_token_id(tk, "<|im_end|>");
        mdl_tok_free(tk);
    }

    gen_set g = {.rng = {.s = o->seed * 0x2545F4914F6CDD1Dull + 1}, .dt = o->dtype};
    const int64_t H = o->hidden, I = o->intermediate, hd = o->head_dim;
    char nm[160];
    gen(&g, "model.embed_tokens.weight", o->vocab, H, 3);
    for (int l = 0; l < o->layers; l++) {
#define G(fmt, r, c, k)                                                                                \
    snprintf(nm, sizeof nm, "model.layers.%d." fmt, l);                                                 \
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
        if (o->arch == MDL_ARCH_QWEN3) {
            G("self_attn.q_norm.weight", hd, 0, 1);
            G("self_attn.k_norm.weight", hd, 0, 1);
        }
        G("post_attention_layernorm.weight", H, 0, 1);
        G("mlp.gate_proj.weight", I, H, 0);
        G("mlp.up_proj.weight", I, H, 0);
        G("mlp.down_proj.weight", H, I, 0);
#undef G
    }
    gen(&g, "model.norm.weight", H, 0, 1);
    if (!o->tie) gen(&g, "lm_head.weight", o->vocab, H, 0);
    int rc = -1;
    cJSON *cfg = NULL, *idx = NULL;
    mdl_st_out *outs = NULL;
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
            q->dtype = o->dtype;
            q->ndim = g.t[i].ndim;
            q->shape[0] = g.t[i].shape[0];
            q->shape[1] = g.t[i].shape[1];
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
    cJSON_AddNumberToObject(cfg, "rope_theta", o->arch == MDL_ARCH_LLAMA ? 500000.0 : 1000000.0);
    cJSON_AddBoolToObject(cfg, "tie_word_embeddings", o->tie);
    cJSON_AddNumberToObject(cfg, "bos_token_id", bos);
    cJSON_AddNumberToObject(cfg, "eos_token_id", eos);
    cJSON_AddStringToObject(cfg, "torch_dtype", torch_dtype(o->dtype));
    cJSON_AddStringToObject(cfg, "hidden_act", "silu");
    cJSON_AddNullToObject(cfg, "rope_scaling");
    cJSON_AddNumberToObject(cfg, "initializer_range", 0.02);
    cJSON_AddBoolToObject(cfg, "use_cache", 1);
    if (o->arch != MDL_ARCH_QWEN2) cJSON_AddBoolToObject(cfg, "attention_bias", 0);
    if (o->arch == MDL_ARCH_LLAMA) cJSON_AddBoolToObject(cfg, "mlp_bias", 0);
    if (o->arch != MDL_ARCH_LLAMA) {
        cJSON_AddBoolToObject(cfg, "use_sliding_window", 0);
        cJSON_AddNullToObject(cfg, "sliding_window");
        cJSON_AddNumberToObject(cfg, "max_window_layers", o->layers);
    }
    cJSON_AddStringToObject(cfg, "transformers_version", "4.51.0");
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
