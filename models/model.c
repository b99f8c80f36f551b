/* models/model.c — parameter table, storage, load sessions and cold loading (see model.h). */
/* Load sessions (mdl_session): the one way bytes get into a model, for the cold load and for every
 * hot update alike.
 *
 *   mdl_model_create   build_table (checkpoint name -> mdl_dest: a whole parameter or a row range of a
 *                      stacked one, each with a coverage slot); every parameter and derived buffer
 *                      allocated once from the backend arena (zeroed); inv_freq filled
 *        |
 *   mdl_session_begin(FULL | PARTIAL)   covered[n_cover] all 0, counters 0, wrote = 0
 *        v
 *   OPEN  <--- mdl_session_bucket = mdl_session_validate (every tensor: a known name, a convertible
 *        |     dtype, the destination's shape; one failure refuses the bucket, nothing is written)
 *        |     + mdl_session_write / _write_device (a dtype-converting copy into each destination,
 *        |     covered[d->cover] = 1, wrote = 1). Any number of buckets, in any order.
 *        |
 *        | mdl_session_finish: mdl_session_check: FULL, every slot set (the tied lm_head
 *        |   alias and the online FP8 scale parts excepted) else -1 "missing tensor ..."; either
 *        |   mode, online FP8 codes and their scale parts together; a failure leaves the session
 *        |   open for the caller to end; then mdl_session_run_hook: model_post_load once if the
 *        |   session wrote anything
 *        v
 *   mdl_session_end    covered freed; what was written stays written (there is no rollback)
 *
 * Cold load (server/core/cli.c srv_runtime_open): mdl_config_load (config.json, models/config.c) ->
 * mdl_model_create -> mdl_model_load_dir[_progress]: begin FULL -> mdl_ckpt_foreach_bucket
 * (model.safetensors alone, or the shard files of model.safetensors.index.json's weight_map in
 * first-seen order, each tensor checked to be mapped to the file it is in) -> buckets -> finish
 * (coverage, hook) -> end. Only then does eng_create_spec capture plans. A failure fails start-up.
 * Hot updates (engine/weights.c) run the same steps on the same model and tables: begin, per bucket
 * mdl_session_validate then mdl_session_write[_device] (split so that a bucket spanning target and
 * drafter is validated whole first), at finish mdl_session_check and mdl_session_run_hook.
 * One table maps a name to the same bytes and one hook derives the same buffers, so after a full
 * update every parameter and derived buffer equals a cold start on that checkpoint (hot == cold),
 * at the addresses the plans baked (I1).
 */
#include "models/model.h"
#include "models/format/json_guard.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- table building ---------------------------------------------------------------------------- */

typedef struct {
    mdl_model *m;
    int cap_params, cap_dests;
    int failed;
    char why[256]; /* a refusal that is not out of memory (an FP8 shard off its block) */
} builder;

static int add_param(builder *b, const char *name, mdl_dtype dt, int64_t rows, int64_t cols)
{
    mdl_model *m = b->m;
    if (m->n_params == b->cap_params) {
        b->cap_params = b->cap_params ? b->cap_params * 2 : 64;
        mdl_param *np = realloc(m->params, (size_t)b->cap_params * sizeof *np);
        if (!np) {
            b->failed = 1;
            return -1;
        }
        m->params = np;
    }
    mdl_param *p = &m->params[m->n_params];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->dt = dt;
    p->rows = rows;
    p->cols = cols;
    p->bytes = (size_t)rows * (size_t)cols * mdl_dtype_size(dt);
    p->scale = -1;
    return m->n_params++;
}

/* Adds a destination. cover < 0: a new coverage slot; else share slot `cover` (aliases). */
static int add_dest(builder *b, const char *name, int param, int64_t row0, int64_t rows, int ndim,
                    int cover)
{
    mdl_model *m = b->m;
    if (param < 0) return -1;
    if (m->n_dests == b->cap_dests) {
        b->cap_dests = b->cap_dests ? b->cap_dests * 2 : 128;
        mdl_dest *nd = realloc(m->dests, (size_t)b->cap_dests * sizeof *nd);
        if (!nd) {
            b->failed = 1;
            return -1;
        }
        m->dests = nd;
    }
    mdl_dest *d = &m->dests[m->n_dests];
    d->name = strdup(name);
    if (!d->name) {
        b->failed = 1;
        return -1;
    }
    d->param = param;
    d->row0 = row0;
    d->rows = rows;
    d->ndim = ndim;
    d->cols = m->params[param].cols;
    d->d0 = 0;
    d->bcast = 0;
    d->n_cover = 1;
    d->alias = cover >= 0;
    d->online_scale = 0;
    d->pair = -1;
    /* I3: one coverage slot per destination part (a qkv row range is its own part); an alias shares
     * its partner's slot, so writing either name covers the shared matrix */
    d->cover = cover >= 0 ? cover : m->n_cover++;
    m->n_dests++;
    return d->cover;
}

/* A whole parameter with one checkpoint name. */
static int add_whole(builder *b, const char *ckpt, const char *rt, mdl_dtype dt, int64_t rows,
                     int64_t cols)
{
    int p = add_param(b, rt, dt, rows, cols);
    add_dest(b, ckpt, p, 0, rows, cols == 1 ? 1 : 2, -1);
    return p;
}

/* An alias of a whole stacked parameter in 3-D, [d0, rows / d0, cols] (transformers 5's fused
 * expert tensors), covering the n contiguous slots from cover0 that its per-expert names own. */
static void add_fused(builder *b, const char *name, int param, int64_t d0, int cover0, int n)
{
    const mdl_param *p = &b->m->params[param];
    if (add_dest(b, name, param, 0, p->rows, 3, cover0) < 0) return;
    mdl_dest *d = &b->m->dests[b->m->n_dests - 1];
    d->d0 = d0;
    d->n_cover = n;
}

/* A projection matrix [rows, cols]: the model's matrix dtype W, or (fp8) F8_E4M3 codes plus a
 * parameter of f32 block scales. */
static int add_proj(builder *b, const char *rt, mdl_dtype W, int fp8, int64_t rows, int64_t cols)
{
    const mdl_config *c = &b->m->cfg;
    const int p = add_param(b, rt, fp8 ? MDL_DT_F8_E4M3 : W, rows, cols);
    if (p < 0 || !fp8) return p;
    char srt[64];
    snprintf(srt, sizeof srt, "%.56s.scale", rt);
    const int s = add_param(b, srt, MDL_DT_F32, (rows + c->fp8_b0 - 1) / c->fp8_b0, (cols + c->fp8_b1 - 1) / c->fp8_b1);
    if (s < 0) return -1;
    b->m->params[s].is_scale = 1;
    b->m->params[s].ckpt_dt = MDL_DT_F32;
    b->m->params[p].scale = s;
    return p;
}

/* The destinations of checkpoint linear `base` (e.g. "model.layers.0.self_attn.k_proj"): rows
 * [row0, row0 + rows) of projection p; with block scales also base.weight_scale_inv, rows
 * [row0 / b0, ..) of p's scale table, which needs the shard to start on a block row and to end on
 * one unless it ends the matrix. */
static void add_linear(builder *b, const char *base, int p, int64_t row0, int64_t rows)
{
    if (p < 0) return;
    char ck[192];
    snprintf(ck, sizeof ck, "%s.weight", base);
    add_dest(b, ck, p, row0, rows, 2, -1);
    const int s = b->m->params[p].scale;
    if (s < 0) return;
    const int64_t b0 = b->m->cfg.fp8_b0;
    const int online = b->m->cfg.fp8_online; /* scales computed on arrival: no checkpoint name */
    if (row0 % b0 != 0 || (rows % b0 != 0 && row0 + rows != b->m->params[p].rows)) {
        if (!b->why[0])
            snprintf(b->why, sizeof b->why,
                     "%s.weight: its %lld rows at row %lld of the stacked matrix are not whole FP8 scale blocks of "
                     "%lld rows (%s)",
                     base, (long long)rows, (long long)row0, (long long)b0,
                     online ? "--quantization-block" : "weight_block_size");
        b->failed = 1;
        return;
    }
    if (online) return;
    const mdl_config *c = &b->m->cfg;
    snprintf(ck, sizeof ck, "%s.%s", base, c->fp8_ct ? "weight_scale" : "weight_scale_inv");
    const int tensor = c->fp8_scheme == MDL_FP8_TENSOR;
    if (add_dest(b, ck, s, row0 / b0, (rows + b0 - 1) / b0, tensor ? 1 : 2, -1) >= 0 && tensor)
        b->m->dests[b->m->n_dests - 1].bcast = 1;
}

static int dest_cmp(const void *a, const void *b)
{
    return strcmp(((const mdl_dest *)a)->name, ((const mdl_dest *)b)->name);
}

static void build_table(builder *b)
{
    mdl_model *m = b->m;
    const mdl_config *c = &m->cfg;
    /* drafter checkpoints have no "model." prefix (z-lab and DeepSpec layouts) */
    const char *pre = c->is_drafter ? "" : "model.";
    const mdl_dtype W = m->wdt == KERN_DT_BF16 ? MDL_DT_BF16 : MDL_DT_F32, F = MDL_DT_F32;
    const int64_t H = c->hidden, I = c->intermediate, hd = c->head_dim;
    const int64_t q_rows = (int64_t)c->heads * hd, kv_rows = (int64_t)c->kv_heads * hd;
    const int64_t qkv_rows = q_rows + 2 * kv_rows;
    char ck[160], rt[64];

    m->embed = m->lm_head = m->fc = m->hidden_norm = m->markov_w1 = m->markov_w2 = m->conf_w = m->conf_b = -1;
    if (!c->is_drafter || c->own_embed) {
        snprintf(ck, sizeof ck, "%sembed_tokens.weight", pre);
        m->embed = add_whole(b, ck, "embed_tokens", W, c->vocab, H);
    }
    if (c->is_drafter) {
        if (c->fp8 && c->fp8_fc) { /* an FP8 fc: codes + scales, as a layer's projection */
            m->fc = add_proj(b, "fc", W, 1, H, (int64_t)c->n_target_ids * H);
            add_linear(b, "fc", m->fc, 0, H);
        } else {
            m->fc = add_whole(b, "fc.weight", "fc", W, H, (int64_t)c->n_target_ids * H);
        }
        m->hidden_norm = add_whole(b, "hidden_norm.weight", "hidden_norm", F, H, 1);
    }
    for (int l = 0; l < c->layers; l++) {
        mdl_layer_params *L = &m->layer[l];
        L->qkv_bias = L->q_norm = L->k_norm = L->o_bias = -1;
#define NAMES(ckfmt, rtfmt)                                                                            \
    snprintf(ck, sizeof ck, "%slayers.%d." ckfmt, pre, l);                                              \
    snprintf(rt, sizeof rt, "layers.%d." rtfmt, l)
        NAMES("input_layernorm.weight", "input_norm");
        L->input_norm = add_whole(b, ck, rt, F, H, 1);
        const unsigned skip = c->fp8 ? c->fp8_skip[l] : 0xffu; /* projections kept unquantized */
        snprintf(rt, sizeof rt, "layers.%d.qkv", l);
        L->qkv = add_proj(b, rt, W, !(skip & MDL_FP8_SKIP_QKV), qkv_rows, H);
        const char *proj[3] = {"q_proj", "k_proj", "v_proj"};
        const int64_t r0[3] = {0, q_rows, q_rows + kv_rows}, nr[3] = {q_rows, kv_rows, kv_rows};
        /* I2: q, k and v are three disjoint row ranges of one stacked qkv parameter: each name is
         * written straight into its rows, nothing waits for the other two (any bucket, any order) */
        for (int i = 0; i < 3; i++) {
            snprintf(ck, sizeof ck, "%slayers.%d.self_attn.%s", pre, l, proj[i]);
            add_linear(b, ck, L->qkv, r0[i], nr[i]);
        }
        if (c->qkv_bias) {
            snprintf(rt, sizeof rt, "layers.%d.qkv_bias", l);
            L->qkv_bias = add_param(b, rt, F, qkv_rows, 1);
            for (int i = 0; i < 3; i++) {
                snprintf(ck, sizeof ck, "%slayers.%d.self_attn.%s.bias", pre, l, proj[i]);
                add_dest(b, ck, L->qkv_bias, r0[i], nr[i], 1, -1);
            }
        }
        if (c->qk_norm) {
            NAMES("self_attn.q_norm.weight", "q_norm");
            L->q_norm = add_whole(b, ck, rt, F, hd, 1);
            NAMES("self_attn.k_norm.weight", "k_norm");
            L->k_norm = add_whole(b, ck, rt, F, hd, 1);
        }
        NAMES("self_attn.o_proj", "o_proj");
        L->o = add_proj(b, rt, W, !(skip & MDL_FP8_SKIP_O), H, q_rows);
        add_linear(b, ck, L->o, 0, H);
        if (c->o_bias) {
            NAMES("self_attn.o_proj.bias", "o_bias");
            L->o_bias = add_whole(b, ck, rt, F, H, 1);
        }
        NAMES("post_attention_layernorm.weight", "post_norm");
        L->post_norm = add_whole(b, ck, rt, F, H, 1);
        L->router = L->w13 = L->w2 = -1;
        if (c->sparse[l]) { /* Qwen3-MoE: the router and every expert, stacked (see model.h) */
            const int64_t E = c->n_experts, MI = c->moe_inter;
            NAMES("mlp.gate.weight", "router");
            L->router = add_whole(b, ck, rt, W, E, H);
            const int f8 = !(skip & MDL_FP8_SKIP_GATE_UP); /* (the config keeps w13 and w2 alike) */
            snprintf(rt, sizeof rt, "layers.%d.w13", l);
            L->w13 = add_proj(b, rt, W, f8, E * 2 * MI, H);
            snprintf(rt, sizeof rt, "layers.%d.w2", l);
            L->w2 = add_proj(b, rt, W, f8, E * H, MI);
            L->gate_up = L->down = -1;
            /* slots: every expert's gate, then every up, then every down (so each fused tensor
             * covers one contiguous run of them). FP8 experts go through add_linear: each part must
             * start on a block row (as KOP_MOE_FFN needs), and a checkpoint's parts bring their
             * scales, destinations of their own between the weights' slots, so such a model has no
             * fused-layout aliases (FP8 checkpoints name the experts one by one) */
            const int scales = f8 && !c->fp8_online;
            int base = -1;
            static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int k = 0; k < 3; k++)
                for (int64_t e = 0; e < E; e++) {
                    const int first = b->m->n_dests, pw = k < 2 ? L->w13 : L->w2;
                    const int64_t row0 = k < 2 ? e * 2 * MI + k * MI : e * H, nr = k < 2 ? MI : H;
                    snprintf(ck, sizeof ck, "%slayers.%d.mlp.experts.%lld.%s%s", pre, l, (long long)e, part[k],
                             f8 ? "" : ".weight");
                    if (f8) add_linear(b, ck, pw, row0, nr);
                    else add_dest(b, ck, pw, row0, nr, 2, -1);
                    if (base < 0 && b->m->n_dests > first) base = b->m->dests[first].cover;
                }
            if (!scales) {
                snprintf(ck, sizeof ck, "%slayers.%d.mlp.experts.gate_up_proj", pre, l);
                add_fused(b, ck, L->w13, E, base, (int)(2 * E));
                snprintf(ck, sizeof ck, "%slayers.%d.mlp.experts.down_proj", pre, l);
                add_fused(b, ck, L->w2, E, base + (int)(2 * E), (int)E);
            }
            continue;
        }
        snprintf(rt, sizeof rt, "layers.%d.gate_up", l);
        L->gate_up = add_proj(b, rt, W, !(skip & MDL_FP8_SKIP_GATE_UP), 2 * I, H);
        snprintf(ck, sizeof ck, "%slayers.%d.mlp.gate_proj", pre, l);
        add_linear(b, ck, L->gate_up, 0, I);
        snprintf(ck, sizeof ck, "%slayers.%d.mlp.up_proj", pre, l);
        add_linear(b, ck, L->gate_up, I, I);
        NAMES("mlp.down_proj", "down_proj");
        L->down = add_proj(b, rt, W, !(skip & MDL_FP8_SKIP_DOWN), H, I);
        add_linear(b, ck, L->down, 0, H);
#undef NAMES
    }
    snprintf(ck, sizeof ck, "%snorm.weight", pre);
    m->final_norm = add_whole(b, ck, "final_norm", F, H, 1);
    if (c->is_drafter) {
        if (c->own_embed) m->lm_head = add_whole(b, "lm_head.weight", "lm_head", W, c->vocab, H);
        if (c->markov_rank > 0) {
            m->markov_w1 = add_whole(b, "markov_head.markov_w1.weight", "markov_w1", W, c->vocab, c->markov_rank);
            m->markov_w2 = add_whole(b, "markov_head.markov_w2.weight", "markov_w2", W, c->vocab, c->markov_rank);
        }
        if (c->conf_head) {
            int64_t in = H + (c->conf_with_markov ? c->markov_rank : 0);
            m->conf_w = add_whole(b, "confidence_head.proj.weight", "conf_w", F, 1, in);
            m->conf_b = add_whole(b, "confidence_head.proj.bias", "conf_b", F, 1, 1);
        }
    } else if (c->tie) {
        m->lm_head = m->embed;
        /* alias: lm_head.weight writes the shared matrix and covers embed_tokens' slot */
        add_dest(b, "lm_head.weight", m->embed, 0, c->vocab, 2, m->dests[0].cover);
    } else if (c->fp8_lm_head) { /* online FP8 (--quantize-lm-head): quantized on arrival, as a projection */
        m->lm_head = add_proj(b, "lm_head", W, 1, c->vocab, H);
        add_linear(b, "lm_head", m->lm_head, 0, c->vocab);
    } else {
        m->lm_head = add_whole(b, "lm_head.weight", "lm_head", W, c->vocab, H);
    }
}

/* Online FP8: a scale part X.weight_scale_inv for each FP8 weight part X.weight (model.h mdl_dest),
 * added after the table so that the parts of a fused expert tensor keep contiguous slots. */
static void add_online_scales(builder *b)
{
    mdl_model *m = b->m;
    const int64_t b0 = m->cfg.fp8_b0;
    const int n0 = m->n_dests;
    for (int i = 0; i < n0 && !b->failed; i++) {
        const mdl_dest d = m->dests[i]; /* a copy: add_dest may move the array */
        const mdl_param *p = &m->params[d.param];
        if (d.alias || d.ndim != 2 || p->dt != MDL_DT_F8_E4M3 || p->scale < 0) continue;
        char ck[224];
        snprintf(ck, sizeof ck, "%s_scale_inv", d.name);
        const int c = add_dest(b, ck, p->scale, d.row0 / b0, (d.rows + b0 - 1) / b0, 2, -1);
        if (c < 0) return;
        m->dests[m->n_dests - 1].online_scale = 1;
        m->dests[m->n_dests - 1].pair = d.cover;
        m->dests[i].pair = c;
    }
}

/* The RoPE table the qk_norm_rope op reads (kern.h: f32 inv_freq[hd/2]), computed in double from
 * the config's rope type (models/config_rope.c) and rounded once. Written in place: plans keep the
 * pointer. */
static void fill_inv_freq(mdl_model *m)
{
    const int half = m->cfg.head_dim / 2;
    double invd[2048];
    float inv[2048];
    mdl_rope_inv_freq(&m->cfg, invd);
    for (int i = 0; i < half; i++) inv[i] = (float)invd[i];
    m->be->ops->upload(m->be, m->inv_freq, inv, (size_t)half * sizeof(float));
}

mdl_model *mdl_model_create(const mdl_config *cfg, eng_backend *be, char *err, size_t errlen)
{
    mdl_model *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->cfg = *cfg;
    m->be = be;
    if (cfg->is_drafter && cfg->qkv_bias) {
        snprintf(err, errlen, "drafter: attention_bias=true is not supported");
        free(m);
        return NULL;
    }
    m->wdt = cfg->dtype == MDL_DT_BF16 ? KERN_DT_BF16 : KERN_DT_F32;
    m->layer = calloc((size_t)cfg->layers, sizeof *m->layer);
    if (!m->layer) goto oom;
    builder b = {.m = m};
    build_table(&b);
    if (cfg->fp8_online && !b.failed) add_online_scales(&b);
    if (b.failed && b.why[0]) {
        snprintf(err, errlen, "%s", b.why);
        mdl_model_destroy(m);
        return NULL;
    }
    if (b.failed) goto oom;
    /* I2: sorted once for bsearch (mdl_model_find); build_table adds each checkpoint name once, so a
     * name has exactly one destination */
    qsort(m->dests, (size_t)m->n_dests, sizeof *m->dests, dest_cmp);
    for (int i = 0; i < m->n_params; i++) {
        mdl_param *p = &m->params[i];
        /* I1: the one allocation of this parameter; loads and updates write into it, nothing moves it */
        p->ptr = be->ops->alloc(be, p->bytes, p->name);
        if (!p->ptr) {
            snprintf(err, errlen, "out of device memory allocating %s (%zu bytes)", p->name, p->bytes);
            mdl_model_destroy(m);
            return NULL;
        }
        m->weight_bytes += p->bytes;
    }
    if (cfg->fp8_online) { /* one block row (b0 rows, or a whole shard when fewer) of the widest FP8 matrix */
        int64_t rows = 0, cols = 0;
        for (int i = 0; i < m->n_params; i++)
            if (m->params[i].dt == MDL_DT_F8_E4M3) {
                rows = m->params[i].rows > rows ? m->params[i].rows : rows;
                cols = m->params[i].cols > cols ? m->params[i].cols : cols;
            }
        m->q8_rows = cfg->fp8_b0 < rows ? cfg->fp8_b0 : rows;
        m->q8_cols = cols;
        const size_t n = (size_t)m->q8_rows * (size_t)cols, sn = (size_t)((cols + cfg->fp8_b1 - 1) / cfg->fp8_b1);
        m->q8_f32 = malloc((n ? n : 1) * sizeof(float));
        m->q8_codes = malloc(n ? n : 1);
        m->q8_scales = malloc((sn ? sn : 1) * sizeof(float));
        if (!m->q8_f32 || !m->q8_codes || !m->q8_scales) goto oom;
    }
    if (cfg->is_drafter) { /* derived buffers: allocated once here, refilled in place by the hook */
        const size_t kv_rows = (size_t)cfg->kv_heads * (size_t)cfg->head_dim;
        /* FP8 q/k/v (every drafter layer alike, config_quant.c): the stacked K/V is FP8 codes
         * plus the k / v rows' scale table, so a K or V block of rows must be whole scale blocks */
        const mdl_param *qkv0 = &m->params[m->layer[0].qkv];
        const int f8 = qkv0->dt == MDL_DT_F8_E4M3;
        if (f8 && kv_rows % (size_t)cfg->fp8_b0 != 0) {
            snprintf(err, errlen,
                     "drafter: FP8 k_proj / v_proj of %zu rows are not whole scale blocks of %d rows (the stacked "
                     "context K/V needs them whole)",
                     kv_rows, cfg->fp8_b0);
            mdl_model_destroy(m);
            return NULL;
        }
        mdl_param *d = &m->derived[0];
        snprintf(d->name, sizeof d->name, "derived.ctx_kv_weight");
        d->dt = qkv0->dt;
        d->rows = (int64_t)(2 * kv_rows * (size_t)cfg->layers);
        d->cols = cfg->hidden;
        d->bytes = (size_t)d->rows * (size_t)d->cols * mdl_dtype_size(d->dt);
        d->scale = -1;
        d = &m->derived[1];
        snprintf(d->name, sizeof d->name, "derived.ctx_k_norm");
        d->dt = MDL_DT_F32;
        d->rows = cfg->layers;
        d->cols = cfg->head_dim;
        d->bytes = (size_t)d->rows * (size_t)d->cols * sizeof(float);
        d->scale = -1;
        m->n_derived = 2;
        if (f8) { /* rows K0, V0, K1, V1, ... of the layers' qkv scale tables */
            const mdl_param *qs = &m->params[qkv0->scale];
            d = &m->derived[2];
            snprintf(d->name, sizeof d->name, "derived.ctx_kv_scale");
            d->dt = MDL_DT_F32;
            d->rows = (int64_t)(2 * kv_rows / (size_t)cfg->fp8_b0 * (size_t)cfg->layers);
            d->cols = qs->cols;
            d->bytes = (size_t)d->rows * (size_t)d->cols * sizeof(float);
            d->scale = -1;
            d->is_scale = 1;
            m->n_derived = 3;
        }
        for (int i = 0; i < m->n_derived; i++) {
            m->derived[i].ptr = be->ops->alloc(be, m->derived[i].bytes, m->derived[i].name);
            if (!m->derived[i].ptr) {
                snprintf(err, errlen, "out of device memory allocating %s", m->derived[i].name);
                mdl_model_destroy(m);
                return NULL;
            }
        }
    }
    /* RoPE inverse frequencies: a derived buffer, allocated once here and (re)filled in place from
     * the config (filled now too, so a model is usable before its first load) */
    m->inv_freq = be->ops->alloc(be, (size_t)(cfg->head_dim / 2) * sizeof(float), "rope_inv_freq");
    if (!m->inv_freq) {
        snprintf(err, errlen, "out of device memory allocating rope_inv_freq");
        mdl_model_destroy(m);
        return NULL;
    }
    fill_inv_freq(m);
    return m;
oom:
    snprintf(err, errlen, "out of memory building the parameter table");
    mdl_model_destroy(m);
    return NULL;
}

void mdl_model_destroy(mdl_model *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_dests; i++) free(m->dests[i].name);
    free(m->dests);
    free(m->params);
    free(m->layer);
    free(m->q8_f32), free(m->q8_scales), free(m->q8_codes);
    free(m);
}

const mdl_dest *mdl_model_find(const mdl_model *m, const char *name)
{
    mdl_dest key = {.name = (char *)name};
    return bsearch(&key, m->dests, (size_t)m->n_dests, sizeof *m->dests, dest_cmp);
}

/* ---- sessions ---------------------------------------------------------------------------------- */

int mdl_session_begin(mdl_session *s, mdl_model *m, mdl_load_mode mode, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->m = m;
    s->mode = mode;
    s->covered = calloc((size_t)m->n_cover, 1);
    s->raw = calloc((size_t)m->n_cover, 1);
    s->conv = calloc((size_t)m->n_cover, 1);
    if (!s->covered || !s->raw || !s->conv) {
        mdl_session_end(s);
        snprintf(err, errlen, "out of memory starting a load session");
        return -1;
    }
    return 0;
}

static void shape_str(const mdl_st_tensor *t, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* The first of t's values (converted to f32 a chunk at a time into a stack buffer: no allocation, one
 * conversion call per chunk) that is not finite (scale 0) or not a valid FP8 scale (scale 1: finite,
 * > 0 and below KERN_FP8_SCALE_MAX); t->numel when none is (or when the dtype does not convert, which
 * validation refused before). */
static size_t first_bad_f32(const mdl_st_tensor *t, int scale)
{
    enum { CHUNK = 1024 };
    float f[CHUNK];
    const size_t es = mdl_dtype_size(t->dtype);
    for (size_t k0 = 0; k0 < t->numel; k0 += CHUNK) {
        const size_t n = t->numel - k0 < CHUNK ? t->numel - k0 : CHUNK;
        if (mdl_convert(f, MDL_DT_F32, (const uint8_t *)t->data + k0 * es, t->dtype, n) != 0) return t->numel;
        int bad = 0;
        for (size_t i = 0; i < n; i++) /* branch-free over the chunk; found again below only if set */
            bad |= scale ? !(f[i] > 0.0f && f[i] < KERN_FP8_SCALE_MAX) : !isfinite(f[i]);
        if (!bad) continue;
        for (size_t i = 0; i < n; i++)
            if (scale ? !(f[i] > 0.0f && f[i] < KERN_FP8_SCALE_MAX) : !isfinite(f[i])) return k0 + i;
    }
    return t->numel;
}

/* Block-FP8 values (host data): a NaN code in the weight (e4m3fn has no infinities; 0x7f / 0xff are
 * NaN), or a scale that is not finite, not > 0 or not below KERN_FP8_SCALE_MAX (the kernels' bound),
 * refuses the bucket naming the tensor and the element. */
static int fp8_values_bad(const mdl_st_tensor *t, int is_scale, const char *what, char *err, size_t errlen)
{
    if (!is_scale) {
        const uint8_t *q = t->data;
        for (size_t k = 0; k < t->numel; k++)
            if (kern_fp8_is_nan(q[k])) {
                snprintf(err, errlen, "%s: tensor %s holds a NaN code (0x%02x) at element %zu", what, t->name, q[k], k);
                return 1;
            }
        return 0;
    }
    const size_t k = first_bad_f32(t, 1);
    if (k == t->numel) return 0;
    float f;
    mdl_convert(&f, MDL_DT_F32, (const uint8_t *)t->data + k * mdl_dtype_size(t->dtype), t->dtype, 1);
    snprintf(err, errlen, "%s: tensor %s has scale %g at element %zu; FP8 block scales must be finite, > 0 and below %g",
             what, t->name, (double)f, k, (double)KERN_FP8_SCALE_MAX);
    return 1;
}

/* Online FP8: a NaN or infinite weight would make its block's scale meaningless: refused. */
static int nonfinite_at(const mdl_st_tensor *t, const char *what, char *err, size_t errlen)
{
    const size_t k = first_bad_f32(t, 0);
    if (k == t->numel) return 0;
    snprintf(err, errlen, "%s: tensor %s has a non-finite value at element %zu (--quantization fp8 cannot quantize it)",
             what, t->name, k);
    return 1;
}

/* Online FP8 (cfg.fp8_online): tensor t, rows [d->row0, ..) of FP8 projection p, quantized one block
 * row at a time (mdl_fp8_quantize: the blocks lie inside the shard, which starts on a block row, so
 * order and splits do not matter) through the model's scratch into the codes and the matching rows of
 * p's scale table. */
static void write_quantized(mdl_model *m, const mdl_dest *d, const mdl_st_tensor *t)
{
    const mdl_param *p = &m->params[d->param], *sp = &m->params[p->scale];
    const int b0 = m->cfg.fp8_b0, b1 = m->cfg.fp8_b1;
    const size_t cols = (size_t)p->cols, es = mdl_dtype_size(t->dtype);
    assert(cols <= (size_t)m->q8_cols && sp->cols == (p->cols + b1 - 1) / b1);
    eng_backend *be = m->be;
    for (int64_t r = 0; r < d->rows; r += m->q8_rows) {
        const int64_t nr = d->rows - r < m->q8_rows ? d->rows - r : m->q8_rows; /* whole blocks but the last */
        const size_t n = (size_t)nr * cols, sn = (size_t)((nr + b0 - 1) / b0) * (size_t)sp->cols;
        if (mdl_convert(m->q8_f32, MDL_DT_F32, (const uint8_t *)t->data + (size_t)r * cols * es, t->dtype, n) != 0) {
            fprintf(stderr, "graphswap: bug: %s does not convert to f32 after validation\n", t->name);
            abort();
        }
        mdl_fp8_quantize(m->q8_f32, nr, p->cols, b0, b1, MDL_DT_F32, m->q8_codes, m->q8_scales);
        const int64_t row = d->row0 + r;
        if (be->ops->upload_convert(be, (uint8_t *)p->ptr + (size_t)row * cols, MDL_DT_F8_E4M3, m->q8_codes,
                                    MDL_DT_F8_E4M3, n) != 0 ||
            be->ops->upload_convert(be, (float *)sp->ptr + (size_t)(row / b0) * (size_t)sp->cols, MDL_DT_F32,
                                    m->q8_scales, MDL_DT_F32, sn) != 0) {
            fprintf(stderr, "graphswap: bug: FP8 upload of %s failed\n", t->name);
            abort();
        }
    }
}

/* A per-tensor scale (d->bcast): its one value into each of the shard's rows of the one-column scale
 * table, from a stack buffer (no allocation per tensor). */
static void write_bcast(mdl_model *m, const mdl_dest *d, const mdl_st_tensor *t, int device_src)
{
    const mdl_param *p = &m->params[d->param];
    eng_backend *be = m->be;
    float v, run[256];
    const void *src = t->data;
    if (device_src) { /* the one value from device memory (a GPU transport) */
        be->ops->download(be, run, t->data, mdl_dtype_size(t->dtype));
        be->ops->synchronize(be);
        src = run;
    }
    int rc = mdl_convert(&v, MDL_DT_F32, src, t->dtype, 1);
    for (int i = 0; i < 256; i++) run[i] = v;
    for (int64_t r = 0; r < d->rows && rc == 0; r += 256) {
        const int64_t n = d->rows - r < 256 ? d->rows - r : 256;
        rc = be->ops->upload_convert(be, (float *)p->ptr + (size_t)(d->row0 + r), MDL_DT_F32, run, MDL_DT_F32, (size_t)n);
    }
    if (rc != 0) {
        fprintf(stderr, "graphswap: bug: FP8 scale write of %s failed\n", t->name);
        abort();
    }
}

int mdl_session_validate(const mdl_session *s, const mdl_st_tensor *t, size_t n, const char *what, char *err,
                         size_t errlen)
{
    const mdl_model *m = s->m;
    for (size_t i = 0; i < n; i++) {
        const mdl_dest *d = mdl_model_find(m, t[i].name);
        if (!d) {
            snprintf(err, errlen, "%s: unknown tensor %s (not a parameter of this %s)", what, t[i].name,
                     mdl_arch_name(m->cfg.arch));
            return -1;
        }
        const mdl_param *p = &m->params[d->param];
        /* online: bf16 / f16 / f32 weights quantized on arrival, or codes as an export gives them */
        const int online = p->dt == MDL_DT_F8_E4M3 && m->cfg.fp8_online;
        const int want_f8 = (p->dt == MDL_DT_F8_E4M3 && !online) || (online && t[i].dtype == MDL_DT_F8_E4M3);
        if (want_f8 ? t[i].dtype != MDL_DT_F8_E4M3 : !mdl_dtype_convertible(t[i].dtype)) {
            snprintf(err, errlen, "%s: tensor %s has dtype %s; expected %s", what, t[i].name,
                     mdl_dtype_name(t[i].dtype),
                     want_f8  ? "F8_E4M3 (this model's projections are block-FP8)"
                     : online ? "BF16, F16 or F32 (or F8_E4M3 codes with their weight_scale_inv)"
                              : "BF16, F16 or F32");
            return -1;
        }
        int ok = t[i].ndim == d->ndim &&
                 (d->ndim == 3 ? t[i].shape[0] == d->d0 && t[i].shape[1] == d->rows / d->d0 && t[i].shape[2] == d->cols
                               : t[i].shape[0] == mdl_dest_ckpt_rows(d) && (d->ndim == 1 || t[i].shape[1] == d->cols));
        if (d->bcast && t[i].ndim == 0) ok = 1; /* a 0-dim scalar scale, as some exporters write it */
        if (!ok) {
            char got[128];
            shape_str(&t[i], got, sizeof got);
            if (d->bcast)
                snprintf(err, errlen, "%s: tensor %s has shape %s; expected [1] (one per-tensor FP8 scale)", what,
                         t[i].name, got);
            else if (d->ndim == 3)
                snprintf(err, errlen, "%s: tensor %s has shape %s; expected [%lld,%lld,%lld]", what, t[i].name,
                         got, (long long)d->d0, (long long)(d->rows / d->d0), (long long)d->cols);
            else if (d->ndim == 1)
                snprintf(err, errlen, "%s: tensor %s has shape %s; expected [%lld]", what, t[i].name,
                         got, (long long)d->rows);
            else
                snprintf(err, errlen, "%s: tensor %s has shape %s; expected [%lld,%lld]", what,
                         t[i].name, got, (long long)d->rows, (long long)d->cols);
            return -1;
        }
        if ((want_f8 || p->is_scale) && fp8_values_bad(&t[i], p->is_scale, what, err, errlen)) return -1;
        if (p->dt == MDL_DT_F8_E4M3 && !want_f8 && nonfinite_at(&t[i], what, err, errlen)) return -1;
    }
    return 0;
}

static void session_write(mdl_session *s, const mdl_st_tensor *t, size_t n, int device_src)
{
    mdl_model *m = s->m;
    /* direct, dtype-converting writes into the destinations (I2) */
    for (size_t i = 0; i < n; i++) {
        const mdl_dest *d = mdl_model_find(m, t[i].name);
        const mdl_param *p = &m->params[d->param];
        size_t row_bytes = (size_t)p->cols * mdl_dtype_size(p->dt);
        uint8_t *dst = (uint8_t *)p->ptr + (size_t)d->row0 * row_bytes;
        int rc = 0;
        if (p->dt == MDL_DT_F8_E4M3 && t[i].dtype != MDL_DT_F8_E4M3)
            write_quantized(m, d, &t[i]); /* host sources only (engine/weights.c refuses GPU transports) */
        else if (d->bcast)
            write_bcast(m, d, &t[i], device_src);
        else
            rc = device_src ? m->be->ops->device_convert(m->be, dst, p->dt, t[i].data, t[i].dtype, t[i].numel)
                            : m->be->ops->upload_convert(m->be, dst, p->dt, t[i].data, t[i].dtype, t[i].numel);
        if (rc != 0) {
            /* unreachable after validation; a bug if it happens */
            fprintf(stderr, "graphswap: bug: conversion %s -> %s failed\n", mdl_dtype_name(t[i].dtype),
                    mdl_dtype_name(p->dt));
            abort();
        }
        if (p->is_scale) m->params[d->param].ckpt_dt = t[i].dtype;
        if (d->pair >= 0 && !d->online_scale) (t[i].dtype == MDL_DT_F8_E4M3 ? s->raw : s->conv)[d->cover] = 1;
        /* I3: this part arrived in this session (covered is per session: begin zeroes it) */
        for (int c = 0; c < d->n_cover; c++) s->covered[d->cover + c] = 1;
        s->tensors++;
        s->bytes += t[i].nbytes;
        s->wrote = 1;
    }
    s->buckets++;
}

void mdl_session_write(mdl_session *s, const mdl_st_tensor *t, size_t n) { session_write(s, t, n, 0); }

void mdl_session_write_device(mdl_session *s, const mdl_st_tensor *t, size_t n) { session_write(s, t, n, 1); }

int mdl_session_bucket(mdl_session *s, const mdl_st_tensor *t, size_t n, const char *what, char *err,
                       size_t errlen)
{
    /* nothing is written unless the whole bucket is good */
    if (mdl_session_validate(s, t, n, what, err, errlen) != 0) return -1;
    mdl_session_write(s, t, n);
    return 0;
}

/* The post-load hook, run exactly once per finish of a session that wrote this model.
 * A Qwen3/Llama/Qwen2 target keeps no weight-derived buffers (stacked qkv / gate_up are
 * destinations, written directly). A drafter refills, in place, the stacked context K/V weight
 * (rows K0, V0, K1, V1, ... copied from each layer's k_proj / v_proj rows of its qkv) and the
 * stacked k_norm, so the context path is one GEMM for every layer. */
static void model_post_load(mdl_model *m)
{
    /* I4: the only place derived state is recomputed after create, from the whole of the model's
     * parameters, once per finish; every copy below writes into buffers allocated at create (I1) */
    m->hook_runs++;
    fill_inv_freq(m); /* config-derived: the same values, in place (I1, I4) */
    if (!m->cfg.is_drafter) return;
    const mdl_config *c = &m->cfg;
    eng_backend *be = m->be;
    const size_t kv_rows = (size_t)c->kv_heads * (size_t)c->head_dim;
    const size_t row_bytes = (size_t)c->hidden * mdl_dtype_size(m->derived[0].dt);
    if (c->test_skip_hook && m->hook_runs > 1) return; /* TEST ONLY: stale derived buffers */
    if (c->test_hook_reallocates && m->hook_runs > 1) {
        /* TEST ONLY: the classic reload bug (a derived buffer rebuilt as a new allocation), which
         * leaves captured plans pointing at retired memory; the update guard must catch it */
        void *fresh = be->ops->alloc(be, m->derived[0].bytes, "derived.ctx_kv_weight.realloc");
        if (fresh) {
            be->ops->free(be, m->derived[0].ptr);
            m->derived[0].ptr = fresh;
        }
    }
    uint8_t *dst = m->derived[0].ptr;
    for (int l = 0; l < c->layers; l++) {
        const uint8_t *qkv = m->params[m->layer[l].qkv].ptr;
        const size_t k0 = (size_t)c->heads * (size_t)c->head_dim;
        be->ops->copy(be, dst + (size_t)(2 * l) * kv_rows * row_bytes, qkv + k0 * row_bytes, kv_rows * row_bytes);
        be->ops->copy(be, dst + (size_t)(2 * l + 1) * kv_rows * row_bytes, qkv + (k0 + kv_rows) * row_bytes,
                      kv_rows * row_bytes);
        be->ops->copy(be, (float *)m->derived[1].ptr + (size_t)l * (size_t)c->head_dim,
                      m->params[m->layer[l].k_norm].ptr, (size_t)c->head_dim * sizeof(float));
        if (m->n_derived > 2) { /* FP8: the k / v rows' scale rows, in the same order */
            const mdl_param *qs = &m->params[m->params[m->layer[l].qkv].scale];
            const size_t b0 = (size_t)c->fp8_b0, srow = (size_t)qs->cols * sizeof(float);
            const size_t n = kv_rows / b0, sk0 = k0 / b0; /* whole blocks (checked at create) */
            uint8_t *sd = (uint8_t *)m->derived[2].ptr + (size_t)(2 * l) * n * srow;
            const uint8_t *ss = qs->ptr;
            be->ops->copy(be, sd, ss + sk0 * srow, n * srow);
            be->ops->copy(be, sd + n * srow, ss + (sk0 + n) * srow, n * srow);
        }
    }
}

static int check_coverage(const mdl_session *s, char *err, size_t errlen)
{
    const mdl_model *m = s->m;
    size_t n = 0, missing = 0;
    for (int i = 0; i < m->n_dests; i++) {
        const mdl_dest *d = &m->dests[i];
        /* I3 / I4: a full finish requires every slot, so no hook runs on a half-written model */
        if (s->covered[d->cover]) continue;
        /* an alias (the tied lm_head, a fused expert tensor) is satisfied by the names it stands
         * for; report those. An online scale part is computed unless codes arrive (check_pairs). */
        if (d->alias || d->online_scale) continue;
        if (missing++ == 0) n += (size_t)snprintf(err, errlen, "missing tensor %s", d->name);
        else if (missing <= 8 && n < errlen) n += (size_t)snprintf(err + n, errlen - n, ", %s", d->name);
    }
    if (missing > 8 && n < errlen) snprintf(err + n, errlen - n, " (and %zu more)", missing - 8);
    return missing ? -1 : 0;
}

static int check_pairs(const mdl_session *s, char *err, size_t errlen)
{
    const mdl_model *m = s->m;
    for (int i = 0; i < m->n_dests; i++) {
        const mdl_dest *d = &m->dests[i];
        if (!d->online_scale) continue;
        const int w = d->pair, got = s->covered[d->cover];
        const int len = (int)strlen(d->name) - (int)strlen("_scale_inv"); /* the weight's name */
        if (s->raw[w] && !got) {
            snprintf(err, errlen, "%.*s arrived as F8_E4M3 codes without %s", len, d->name, d->name);
            return -1;
        }
        if (got && (!s->raw[w] || s->conv[w])) {
            snprintf(err, errlen,
                     "%s arrived without %.*s as F8_E4M3 codes (this model quantizes bf16 / f16 / f32 weights "
                     "online and computes their scales)",
                     d->name, len, d->name);
            return -1;
        }
    }
    return 0;
}

int mdl_session_check(const mdl_session *s, char *err, size_t errlen)
{
    if (s->mode == MDL_LOAD_FULL && check_coverage(s, err, errlen) != 0) return MDL_CHECK_COVERAGE;
    return check_pairs(s, err, errlen) != 0 ? MDL_CHECK_PAIRS : 0;
}

void mdl_session_run_hook(mdl_session *s)
{
    if (s->wrote) model_post_load(s->m); /* exactly once per finish, never for an untouched model */
}

int mdl_session_finish(mdl_session *s, char *err, size_t errlen)
{
    if (mdl_session_check(s, err, errlen) != 0) return -1;
    mdl_session_run_hook(s);
    return 0;
}

void mdl_session_end(mdl_session *s)
{
    free(s->covered);
    free(s->raw);
    free(s->conv);
    s->covered = s->raw = s->conv = NULL;
}

/* ---- cold load ----------------------------------------------------------------------------------- */

/* A shard file name from an index must be a plain file name inside the folder. */
static int safe_file_name(const char *f)
{
    return f[0] && f[0] != '.' && !strchr(f, '/') && !strchr(f, '\\') && strlen(f) < 256;
}

/* One shard: every tensor must be listed for it in the index (when sharded); tensors are handed
 * out in runs of about bucket_bytes (0: the whole file), straight from the mapping. */
static int read_file(const char *dir, const char *file, const cJSON *weight_map, size_t bucket_bytes,
                     mdl_bucket_fn fn, void *user, char *err, size_t errlen)
{
    char path[4352];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    mdl_st_file f;
    if (mdl_st_open(path, &f, err, errlen) != 0) return -1;
    int rc = 0;
    if (weight_map) {
        for (size_t i = 0; i < f.n && rc == 0; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(weight_map, f.tensors[i].name);
            if (!cJSON_IsString(v) || strcmp(v->valuestring, file) != 0) {
                snprintf(err, errlen, "%s: tensor %s is not mapped to this file in model.safetensors.index.json",
                         path, f.tensors[i].name);
                rc = -1;
            }
        }
    }
    for (size_t i = 0; i < f.n && rc == 0;) {
        size_t j = i, bytes = 0;
        while (j < f.n && (j == i || bucket_bytes == 0 || bytes + f.tensors[j].nbytes <= bucket_bytes))
            bytes += f.tensors[j++].nbytes;
        rc = fn(f.tensors + i, j - i, path, user, err, errlen);
        i = j;
    }
    mdl_st_close(&f);
    return rc;
}

int mdl_ckpt_foreach_bucket(const char *dir, size_t bucket_bytes, mdl_bucket_fn fn, void *user, char *err,
                            size_t errlen)
{
    char path[4352];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    struct stat st;
    if (stat(path, &st) != 0) return read_file(dir, "model.safetensors", NULL, bucket_bytes, fn, user, err, errlen);
    int rc = -1;
    size_t len;
    char *txt = mdl_read_file(path, 64u << 20, &len, err, errlen);
    if (!txt) return -1;
    char why[160];
    mdl_json_result jr;
    cJSON *index = mdl_json_parse(txt, len, MDL_JSON_MAX_DEPTH, 0, &jr, why, sizeof why);
    free(txt);
    const cJSON *wm = index ? cJSON_GetObjectItemCaseSensitive(index, "weight_map") : NULL;
    const char **files = NULL;
    if (!index && jr.status == MDL_JSON_E_DEEP) {
        snprintf(err, errlen, "%s: %s", path, why);
        goto out;
    }
    if (!cJSON_IsObject(wm)) {
        snprintf(err, errlen, "%s: not a JSON object with a weight_map", path);
        goto out;
    }
    /* the distinct shard files, in first-seen order */
    int nf = 0, n = cJSON_GetArraySize(wm);
    files = calloc((size_t)(n ? n : 1), sizeof *files);
    if (!files) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm)
    {
        if (!cJSON_IsString(e) || !safe_file_name(e->valuestring)) {
            snprintf(err, errlen, "%s: tensor %s maps to an invalid file name", path, e->string);
            goto out;
        }
        int seen = 0;
        for (int i = 0; i < nf && !seen; i++) seen = strcmp(files[i], e->valuestring) == 0;
        if (!seen) files[nf++] = e->valuestring;
    }
    for (int i = 0; i < nf; i++)
        if (read_file(dir, files[i], wm, bucket_bytes, fn, user, err, errlen) != 0) goto out;
    rc = 0;
out:
    free(files);
    cJSON_Delete(index);
    return rc;
}

static int session_bucket_fn(const mdl_st_tensor *t, size_t n, const char *what, void *user, char *err,
                             size_t errlen)
{
    return mdl_session_bucket(user, t, n, what, err, errlen);
}

/* Bytes a checkpoint tensor fills in the model's storage (its destination's dtype, not the file's):
 * the unit of load progress, so the count reaches the total whatever dtype the checkpoint has. */
static uint64_t dest_bytes(const mdl_model *m, const mdl_dest *d)
{
    return (uint64_t)d->rows * (uint64_t)(d->ndim == 2 ? d->cols : 1) * mdl_dtype_size(m->params[d->param].dt);
}

typedef struct {
    mdl_session *s;
    mdl_load_progress_fn fn;
    void *user;
    uint64_t done, total;
} progress_ctx;

static int progress_bucket_fn(const mdl_st_tensor *t, size_t n, const char *what, void *user, char *err,
                              size_t errlen)
{
    progress_ctx *p = user;
    if (mdl_session_bucket(p->s, t, n, what, err, errlen) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        const mdl_dest *d = mdl_model_find(p->s->m, t[i].name); /* (the bucket was validated: found) */
        if (d) p->done += dest_bytes(p->s->m, d);
    }
    /* a tied checkpoint may also hold lm_head.weight (the same storage, written twice) */
    if (p->done > p->total) p->done = p->total;
    p->fn(p->done, p->total, 0, p->user);
    return 0;
}

int mdl_model_load_dir_progress(mdl_model *m, const char *dir, mdl_load_progress_fn fn, void *user, char *err,
                                size_t errlen)
{
    /* hot == cold: the cold load is the same FULL session (begin, buckets, coverage, hook) a trainer's
     * full update runs through engine/weights.c, on the same table */
    mdl_session s;
    if (mdl_session_begin(&s, m, MDL_LOAD_FULL, err, errlen) != 0) return -1;
    int rc;
    if (fn) {
        progress_ctx p = {&s, fn, user, 0, m->weight_bytes};
        fn(0, p.total, 0, user);
        /* buckets of about 64 MiB (instead of one per file) so a single-file checkpoint reports
         * progress while it loads; a cold load that fails is discarded whole, so smaller buckets
         * change nothing else */
        rc = mdl_ckpt_foreach_bucket(dir, (size_t)64 << 20, progress_bucket_fn, &p, err, errlen);
        if (rc == 0) rc = mdl_session_finish(&s, err, errlen);
        if (rc == 0) fn(p.total, p.total, 1, user);
    } else {
        rc = mdl_ckpt_foreach_bucket(dir, 0, session_bucket_fn, &s, err, errlen);
        if (rc == 0) rc = mdl_session_finish(&s, err, errlen);
    }
    mdl_session_end(&s);
    return rc;
}

int mdl_model_load_dir(mdl_model *m, const char *dir, char *err, size_t errlen)
{
    return mdl_model_load_dir_progress(m, dir, NULL, NULL, err, errlen);
}
