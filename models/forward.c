/* models/forward.c — the target's forward pass as an op tape (Qwen3 / Llama / Qwen2).
 *
 * One step processes R rows (tokens of any sequences, prefill chunks and decode tokens mixed):
 *   x = embed(tok)                                          [R,H]
 *   per layer:  h = rmsnorm(x) ; qkv = h Wqkv^T (+b)        [R,(nh+2nkv)hd]
 *               q,k: per-head rmsnorm (qwen3) then RoPE(pos)
 *               cache[slot, pos] = k, v ; attn = softmax(q K^T * hd^-0.5) V over kv_len keys
 *               x += attn Wo^T (+b)
 *               h = rmsnorm(x) ; gu = h Wgu^T ; act = silu(gate) * up ; x += act Wdown^T
 *               (a sparse Qwen3-MoE layer: logits = h Wrouter^T ; top-k experts and weights ;
 *                x += sum_j w_j * expert_j(h), each expert the SwiGLU MLP above: KOP_MOE_*)
 *   xs = x[logit_idx] ; xs = rmsnorm(xs) ; logits = xs Wlm^T    [n_logits, V]
 *   tokens = sample(logits, samp)  (when io->samp: the engine's steps; tests may stop at logits)
 * Row counts come from io->n_rows / io->n_logits at run time; `rows` / `logit_rows` only size the
 * extents baked for the plan bucket.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/model.h"

#define F4 sizeof(float)

int mdl_workspace_alloc(const mdl_model *m, eng_backend *be, int max_rows, int max_logits,
                        mdl_workspace *ws, char *err, size_t errlen)
{
    const mdl_config *c = &m->cfg;
    size_t R = (size_t)max_rows, S = (size_t)max_logits, H = (size_t)c->hidden;
    size_t qkv = (size_t)(c->heads + 2 * c->kv_heads) * (size_t)c->head_dim;
    size_t I = (size_t)c->intermediate;
    memset(ws, 0, sizeof *ws);
    ws->max_rows = max_rows;
    ws->max_logits = max_logits;
    struct {
        float **p;
        size_t n;
        const char *tag;
    } want[] = {
        {&ws->x, R * H, "ws.x"},
        {&ws->h, R * H, "ws.h"},
        {&ws->qkv, R * qkv, "ws.qkv"},
        {&ws->attn, R * (size_t)c->heads * (size_t)c->head_dim, "ws.attn"},
        {&ws->tmp, R * H, "ws.tmp"},
        {&ws->gu, R * 2 * I, "ws.gate_up"},
        {&ws->act, R * I, "ws.act"},
        {&ws->xs, S * H, "ws.xs"},
        {&ws->logits, S * (size_t)c->vocab, "ws.logits"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        *want[i].p = be->ops->alloc(be, want[i].n * F4, want[i].tag);
        if (!*want[i].p) {
            snprintf(err, errlen, "out of device memory allocating workspace %s", want[i].tag);
            return -1;
        }
    }
    if (c->n_sparse > 0) {
        const size_t E = (size_t)c->n_experts, K = (size_t)c->experts_per_tok;
        ws->moe_logits = be->ops->alloc(be, R * E * F4, "ws.moe_logits");
        ws->moe_w = be->ops->alloc(be, R * K * F4, "ws.moe_w");
        ws->moe_ids = be->ops->alloc(be, R * K * sizeof(int32_t), "ws.moe_ids");
        ws->moe_scratch = be->ops->alloc(be, kern_moe_scratch_bytes((int64_t)E, (int64_t)K, (int64_t)H,
                                                                    c->moe_inter, (int64_t)R), "ws.moe_scratch");
        if (!ws->moe_logits || !ws->moe_w || !ws->moe_ids || !ws->moe_scratch) {
            snprintf(err, errlen, "out of device memory allocating the MoE workspace");
            return -1;
        }
    }
    return 0;
}

/* embed + 10 per layer + gather, final norm, lm_head, sample; plus the drafter feature copies (at
 * most L + 1 ids in [-1, L-1]) and the final norm of the L-1 feature */
size_t mdl_forward_ops(const mdl_model *m) { return 7 + 11 * (size_t)m->cfg.layers; }

static kern_buf B(void *p, size_t bytes)
{
    kern_buf b = {p, p ? bytes : 0};
    return b;
}

static void emit_matmul(eng_tape *t, const mdl_model *m, const float *x, int K, int p_w, int p_bias,
                        float *out, int N, int rows, int32_t *n_rows, int accumulate)
{
    const mdl_param *w = &m->params[p_w];
    const mdl_param *bias = p_bias >= 0 ? &m->params[p_bias] : NULL;
    kern_op op = {.kind = KOP_MATMUL};
    op.buf[0] = B((void *)x, (size_t)rows * (size_t)K * F4);
    op.buf[1] = B(w->ptr, w->bytes);
    op.buf[2] = bias ? B(bias->ptr, bias->bytes) : B(NULL, 0);
    op.buf[3] = B(out, (size_t)rows * (size_t)N * F4);
    op.buf[4] = B(n_rows, sizeof(int32_t));
    op.p[0] = K;
    op.p[1] = N;
    op.p[2] = rows;
    op.p[3] = m->wdt;
    op.p[4] = accumulate;
    if (w->dt == MDL_DT_F8_E4M3) { /* block-FP8: codes + the scale table (kern.h KOP_MATMUL) */
        const mdl_param *s = &m->params[w->scale];
        op.p[3] = KERN_DT_FP8;
        op.buf[5] = B(s->ptr, s->bytes);
        op.p[5] = m->cfg.fp8_b0;
        op.p[6] = m->cfg.fp8_b1;
    }
    eng_tape_push(t, &op);
}

static void emit_rmsnorm(eng_tape *t, const mdl_model *m, const float *x, int p_w, float *out, int rows,
                         int32_t *n_rows)
{
    const mdl_param *w = &m->params[p_w];
    size_t H = (size_t)m->cfg.hidden;
    kern_op op = {.kind = KOP_RMSNORM};
    op.buf[0] = B((void *)x, (size_t)rows * H * F4);
    op.buf[1] = B(w->ptr, w->bytes);
    op.buf[2] = B(out, (size_t)rows * H * F4);
    op.buf[3] = B(n_rows, sizeof(int32_t));
    op.p[0] = (int32_t)H;
    op.p[1] = rows;
    op.f[0] = (float)m->cfg.rms_eps;
    eng_tape_push(t, &op);
}

/* Everything one decoder layer touches besides its weights. */
typedef struct {
    float *x, *h, *qkv, *attn, *gu, *act;
    float *moe_logits, *moe_w; /* a sparse MoE layer's step buffers (mdl_workspace) */
    int32_t *moe_ids;
    void *moe_scratch;
    int32_t *pos, *slot, *kv_len, *n_rows, *block_tables;
    float *kc, *vc;
    size_t kv_bytes, bt_bytes;
    int block_size, max_blocks;
} layer_io;

/* One pre-norm decoder layer (Qwen3 / Llama / Qwen2, and the drafters' layers): attention over the
 * paged cache with kv_len keys per row, then the SiLU MLP; both residual adds are accumulating
 * matmuls into x. */
static void emit_layer(eng_tape *t, const mdl_model *m, int l, const layer_io *io, int rows)
{
    const mdl_config *c = &m->cfg;
    const mdl_layer_params *L = &m->layer[l];
    const int H = c->hidden, I = c->intermediate, hd = c->head_dim, nh = c->heads, nkv = c->kv_heads;
    const int qkv_n = (nh + 2 * nkv) * hd;
    const size_t R = (size_t)rows, i32 = sizeof(int32_t);
    kern_op op;

    emit_rmsnorm(t, m, io->x, L->input_norm, io->h, rows, io->n_rows);
    emit_matmul(t, m, io->h, H, L->qkv, L->qkv_bias, io->qkv, qkv_n, rows, io->n_rows, 0);

    memset(&op, 0, sizeof op);
    op.kind = KOP_QK_NORM_ROPE;
    op.buf[0] = B(io->qkv, R * (size_t)qkv_n * F4);
    op.buf[1] = L->q_norm >= 0 ? B(m->params[L->q_norm].ptr, m->params[L->q_norm].bytes) : B(NULL, 0);
    op.buf[2] = L->k_norm >= 0 ? B(m->params[L->k_norm].ptr, m->params[L->k_norm].bytes) : B(NULL, 0);
    op.buf[3] = B(io->pos, R * i32);
    op.buf[4] = B(m->inv_freq, (size_t)(hd / 2) * F4);
    op.buf[5] = B(io->n_rows, i32);
    op.p[0] = nh;
    op.p[1] = nkv;
    op.p[2] = hd;
    op.p[3] = qkv_n;
    op.p[4] = rows;
    op.f[0] = (float)c->rms_eps;
    eng_tape_push(t, &op);

    memset(&op, 0, sizeof op);
    op.kind = KOP_KV_WRITE;
    op.buf[0] = B(io->qkv, R * (size_t)qkv_n * F4);
    op.buf[1] = B(io->kc, io->kv_bytes);
    op.buf[2] = B(io->vc, io->kv_bytes);
    op.buf[3] = B(io->slot, R * i32);
    op.buf[4] = B(io->pos, R * i32);
    op.buf[5] = B(io->block_tables, io->bt_bytes);
    op.buf[6] = B(io->n_rows, i32);
    op.p[0] = nkv;
    op.p[1] = hd;
    op.p[2] = qkv_n;
    op.p[3] = nh * hd;
    op.p[4] = (nh + nkv) * hd;
    op.p[5] = io->block_size;
    op.p[6] = io->max_blocks;
    op.p[7] = rows;
    eng_tape_push(t, &op);

    memset(&op, 0, sizeof op);
    op.kind = KOP_ATTENTION;
    op.buf[0] = B(io->qkv, R * (size_t)qkv_n * F4);
    op.buf[1] = B(io->kc, io->kv_bytes);
    op.buf[2] = B(io->vc, io->kv_bytes);
    op.buf[3] = B(io->attn, R * (size_t)(nh * hd) * F4);
    op.buf[4] = B(io->slot, R * i32);
    op.buf[5] = B(io->kv_len, R * i32);
    op.buf[6] = B(io->block_tables, io->bt_bytes);
    op.buf[7] = B(io->n_rows, i32);
    op.p[0] = nh;
    op.p[1] = nkv;
    op.p[2] = hd;
    op.p[3] = qkv_n;
    op.p[4] = io->block_size;
    op.p[5] = io->max_blocks;
    op.p[6] = rows;
    op.f[0] = (float)mdl_attn_softmax_scale(c); /* hd^-0.5, times the yarn attention factor^2 */
    eng_tape_push(t, &op);

    emit_matmul(t, m, io->attn, nh * hd, L->o, L->o_bias, io->x, H, rows, io->n_rows, 1);
    emit_rmsnorm(t, m, io->x, L->post_norm, io->h, rows, io->n_rows);
    if (L->w13 >= 0) { /* a sparse MoE layer: router -> top-k -> the chosen experts, added to x */
        const int E = c->n_experts, K = c->experts_per_tok, MI = c->moe_inter;
        emit_matmul(t, m, io->h, H, L->router, -1, io->moe_logits, E, rows, io->n_rows, 0);
        memset(&op, 0, sizeof op);
        op.kind = KOP_MOE_ROUTE;
        op.buf[0] = B(io->moe_logits, R * (size_t)E * F4);
        op.buf[1] = B(io->moe_ids, R * (size_t)K * i32);
        op.buf[2] = B(io->moe_w, R * (size_t)K * F4);
        op.buf[3] = B(io->n_rows, i32);
        op.p[0] = E;
        op.p[1] = K;
        op.p[2] = rows;
        op.p[3] = c->norm_topk;
        eng_tape_push(t, &op);
        memset(&op, 0, sizeof op);
        op.kind = KOP_MOE_FFN;
        op.buf[0] = B(io->h, R * (size_t)H * F4);
        op.buf[1] = B(m->params[L->w13].ptr, m->params[L->w13].bytes);
        op.buf[2] = B(m->params[L->w2].ptr, m->params[L->w2].bytes);
        op.buf[3] = B(io->moe_ids, R * (size_t)K * i32);
        op.buf[4] = B(io->moe_w, R * (size_t)K * F4);
        op.buf[5] = B(io->x, R * (size_t)H * F4);
        op.buf[6] = B(io->n_rows, i32);
        op.buf[7] = B(io->moe_scratch, kern_moe_scratch_bytes(E, K, H, MI, rows));
        op.p[0] = H;
        op.p[1] = MI;
        op.p[2] = E;
        op.p[3] = K;
        op.p[4] = rows;
        op.p[5] = m->wdt;
        if (m->params[L->w13].dt == MDL_DT_F8_E4M3) { /* FP8 experts: codes + scale tables (kern.h) */
            const mdl_param *s13 = &m->params[m->params[L->w13].scale], *s2 = &m->params[m->params[L->w2].scale];
            op.p[5] = KERN_DT_FP8;
            op.buf[8] = B(s13->ptr, s13->bytes);
            op.buf[9] = B(s2->ptr, s2->bytes);
            op.p[6] = c->fp8_b0;
            op.p[7] = c->fp8_b1;
        }
        eng_tape_push(t, &op);
        return;
    }
    emit_matmul(t, m, io->h, H, L->gate_up, -1, io->gu, 2 * I, rows, io->n_rows, 0);

    memset(&op, 0, sizeof op);
    op.kind = KOP_SILU_MUL;
    op.buf[0] = B(io->gu, R * (size_t)(2 * I) * F4);
    op.buf[1] = B(io->act, R * (size_t)I * F4);
    op.buf[2] = B(io->n_rows, i32);
    op.p[0] = I;
    op.p[1] = rows;
    eng_tape_push(t, &op);

    emit_matmul(t, m, io->act, I, L->down, -1, io->x, H, rows, io->n_rows, 1);
}

static void emit_embed(eng_tape *t, const mdl_model *table_owner, int32_t *ids, float *out, int rows,
                       int32_t *n_rows)
{
    const mdl_config *c = &table_owner->cfg;
    const mdl_param *e = &table_owner->params[table_owner->embed];
    kern_op op = {.kind = KOP_EMBED};
    op.buf[0] = B(ids, (size_t)rows * sizeof(int32_t));
    op.buf[1] = B(e->ptr, e->bytes);
    op.buf[2] = B(out, (size_t)rows * (size_t)c->hidden * F4);
    op.buf[3] = B(n_rows, sizeof(int32_t));
    op.p[0] = c->hidden;
    op.p[1] = c->vocab;
    op.p[2] = rows;
    op.p[3] = table_owner->wdt;
    eng_tape_push(t, &op);
}

static void emit_gather(eng_tape *t, float *x, int x_rows, int32_t *idx, float *out, int out_rows, int H,
                        int32_t *n)
{
    kern_op op = {.kind = KOP_GATHER_ROWS};
    op.buf[0] = B(x, (size_t)x_rows * (size_t)H * F4);
    op.buf[1] = B(idx, (size_t)out_rows * sizeof(int32_t));
    op.buf[2] = B(out, (size_t)out_rows * (size_t)H * F4);
    op.buf[3] = B(n, sizeof(int32_t));
    op.p[0] = H;
    op.p[1] = x_rows;
    op.p[2] = out_rows;
    eng_tape_push(t, &op);
}

int mdl_workspace_add_features(const mdl_model *m, eng_backend *be, mdl_workspace *ws, const int *ids, int n,
                               char *err, size_t errlen)
{
    size_t bytes = (size_t)ws->max_rows * (size_t)n * (size_t)m->cfg.hidden * F4;
    ws->feat = be->ops->alloc(be, bytes, "ws.features");
    if (!ws->feat) {
        snprintf(err, errlen, "out of device memory allocating the drafter feature buffer");
        return -1;
    }
    ws->feat_ids = ids;
    ws->n_feat = n;
    ws->feat_h = m->cfg.hidden;
    return 0;
}

static int has_feature(const mdl_workspace *ws, int id)
{
    for (int f = 0; f < ws->n_feat; f++)
        if (ws->feat_ids[f] == id) return 1;
    return 0;
}

/* Drafter features with target layer id `id` (-1: the embedding output, z-lab / DeepSpec
 * hidden_states[0]; j: hidden_states[j + 1]): src [rows, H] into their columns of ws->feat. */
static void emit_features(eng_tape *t, const mdl_workspace *ws, int id, float *src, int rows, int32_t *n_rows)
{
    const int H = ws->feat_h;
    for (int f = 0; f < ws->n_feat; f++) {
        if (ws->feat_ids[f] != id) continue;
        kern_op op = {.kind = KOP_COPY_COLS};
        op.buf[0] = B(src, (size_t)rows * (size_t)H * F4);
        op.buf[1] = B(ws->feat, (size_t)rows * (size_t)(ws->n_feat * H) * F4);
        op.buf[2] = B(n_rows, sizeof(int32_t));
        op.p[0] = H;
        op.p[1] = ws->n_feat * H;
        op.p[2] = f * H;
        op.p[3] = rows;
        eng_tape_push(t, &op);
    }
}

void mdl_emit_forward(const mdl_model *m, const mdl_workspace *ws, const eng_step_io *io, int rows,
                      int logit_rows, eng_tape *t)
{
    const mdl_config *c = &m->cfg;
    const int H = c->hidden;
    layer_io lio = {
        .x = ws->x, .h = ws->h, .qkv = ws->qkv, .attn = ws->attn, .gu = ws->gu, .act = ws->act,
        .moe_logits = ws->moe_logits, .moe_w = ws->moe_w, .moe_ids = ws->moe_ids, .moe_scratch = ws->moe_scratch,
        .pos = io->pos, .slot = io->slot, .kv_len = io->kv_len, .n_rows = io->n_rows,
        .block_tables = io->block_tables,
        .kv_bytes = io->kv_layer_bytes,
        .bt_bytes = (size_t)io->max_seqs * (size_t)io->max_blocks * sizeof(int32_t),
        .block_size = io->block_size, .max_blocks = io->max_blocks,
    };
    emit_embed(t, m, io->tok, ws->x, rows, io->n_rows);
    emit_features(t, ws, -1, ws->x, rows, io->n_rows);
    for (int l = 0; l < c->layers; l++) {
        lio.kc = io->kcache[l];
        lio.vc = io->vcache[l];
        emit_layer(t, m, l, &lio, rows);
        if (l == c->layers - 1 && has_feature(ws, l)) {
            /* the last layer's feature is model.norm(x), as HF output_hidden_states[L] (the final
             * entry is replaced by last_hidden_state; SPEC-NOTES.md section 0); ws->h is free here */
            emit_rmsnorm(t, m, ws->x, m->final_norm, ws->h, rows, io->n_rows);
            emit_features(t, ws, l, ws->h, rows, io->n_rows);
        } else {
            emit_features(t, ws, l, ws->x, rows, io->n_rows);
        }
    }
    emit_gather(t, ws->x, rows, io->logit_idx, ws->xs, logit_rows, H, io->n_logits);
    emit_rmsnorm(t, m, ws->xs, m->final_norm, ws->xs, logit_rows, io->n_logits);
    emit_matmul(t, m, ws->xs, H, m->lm_head, -1, ws->logits, c->vocab, logit_rows, io->n_logits, 0);
    if (io->samp) {
        kern_op op = {.kind = KOP_SAMPLE};
        op.buf[0] = B(ws->logits, (size_t)logit_rows * (size_t)c->vocab * F4);
        op.buf[1] = B(io->samp, (size_t)logit_rows * sizeof(kern_sample_params));
        if (io->n_bans > 0) op.buf[2] = B(io->bans, (size_t)io->n_bans * sizeof(int32_t));
        op.buf[3] = B(io->samp_out, (size_t)logit_rows * sizeof(kern_sample_out));
        op.buf[4] = B(io->n_logits, sizeof(int32_t));
        op.p[0] = c->vocab;
        op.p[1] = logit_rows;
        op.p[2] = io->n_bans;
        if (io->pen_state) { /* penalties and logit_bias: per-slot state, written in place */
            op.buf[5] = B(io->pen_state, (size_t)io->max_seqs * (size_t)c->vocab * sizeof(int32_t));
            op.buf[6] = B(io->bias, (size_t)io->max_seqs * (size_t)io->max_bias * sizeof(kern_logit_bias));
            op.buf[7] = B(io->upd, (1 + 2 * (size_t)io->max_upd) * sizeof(int32_t));
            op.p[3] = io->max_seqs;
            op.p[4] = io->max_bias;
            op.p[5] = io->max_upd;
        }
        eng_tape_push(t, &op);
    }
}

/* ---- drafters ----------------------------------------------------------------------------------- */

int mdl_draft_ws_alloc(const mdl_model *d, eng_backend *be, int max_rows, mdl_draft_ws *ws, char *err,
                       size_t errlen)
{
    const mdl_config *c = &d->cfg;
    size_t R = (size_t)max_rows, H = (size_t)c->hidden, I = (size_t)c->intermediate;
    size_t kvd = (size_t)c->kv_heads * (size_t)c->head_dim;
    size_t qkv = (size_t)(c->heads + 2 * c->kv_heads) * (size_t)c->head_dim;
    size_t ckv_cols = 2 * kvd * (size_t)c->layers;
    memset(ws, 0, sizeof *ws);
    ws->max_rows = max_rows;
    ws->W = c->arch == MDL_ARCH_DSPARK ? c->block_size : c->block_size - 1;
    struct {
        void **p;
        size_t n;
        const char *tag;
    } want[] = {
        {(void **)&ws->cfeat, R * (size_t)c->n_target_ids * H, "draft.ctx_features"},
        {(void **)&ws->c, R * H, "draft.ctx"},
        /* one spare row: a layer's K/V columns start inside the row, and each per-layer op sees a
         * full [R, ckv_cols] extent from its own start */
        {(void **)&ws->ckv, (R + 1) * ckv_cols, "draft.ctx_kv"},
        {(void **)&ws->x, R * H, "draft.x"},
        {(void **)&ws->h, R * H, "draft.h"},
        {(void **)&ws->qkv, R * qkv, "draft.qkv"},
        {(void **)&ws->attn, R * (size_t)c->heads * (size_t)c->head_dim, "draft.attn"},
        {(void **)&ws->gu, R * 2 * I, "draft.gate_up"},
        {(void **)&ws->act, R * I, "draft.act"},
        {(void **)&ws->xs, R * H, "draft.xs"},
        {(void **)&ws->logits, R * (size_t)c->vocab, "draft.logits"},
        {(void **)&ws->drafts, R, "draft.tokens"},
        {(void **)&ws->conf, R, "draft.confidence"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        *want[i].p = be->ops->alloc(be, want[i].n * F4, want[i].tag);
        if (!*want[i].p) {
            snprintf(err, errlen, "out of device memory allocating %s", want[i].tag);
            return -1;
        }
    }
    return 0;
}

size_t mdl_draft_ops(const mdl_model *d)
{
    size_t ctx = 4 + 2 * (size_t)d->cfg.layers, blk = 1 + 10 * (size_t)d->cfg.layers + 5;
    return ctx > blk ? ctx : blk;
}

void mdl_emit_draft_context(const mdl_model *d, const mdl_draft_ws *ws, const mdl_workspace *tws,
                            const eng_step_io *io, const mdl_draft_io *dio, int rows, eng_tape *t)
{
    const mdl_config *c = &d->cfg;
    const int H = c->hidden, hd = c->head_dim, nkv = c->kv_heads, k = c->n_target_ids;
    const int kvd = nkv * hd, ckv_cols = 2 * kvd * c->layers;
    const size_t R = (size_t)rows, i32 = sizeof(int32_t);
    emit_gather(t, tws->feat, tws->max_rows, dio->c_idx, ws->cfeat, rows, k * H, dio->c_n);
    emit_matmul(t, d, ws->cfeat, k * H, d->fc, -1, ws->c, H, rows, dio->c_n, 0);
    emit_rmsnorm(t, d, ws->c, d->hidden_norm, ws->c, rows, dio->c_n);
    /* one GEMM for every layer's context K and V: ckv = c . ctx_kv^T  [R, L*2*nkv*hd] */
    {
        const mdl_param *w = &d->derived[0];
        kern_op op = {.kind = KOP_MATMUL};
        op.buf[0] = B(ws->c, R * (size_t)H * F4);
        op.buf[1] = B(w->ptr, w->bytes);
        op.buf[3] = B(ws->ckv, R * (size_t)ckv_cols * F4);
        op.buf[4] = B(dio->c_n, i32);
        op.p[0] = H;
        op.p[1] = ckv_cols;
        op.p[2] = rows;
        op.p[3] = d->wdt;
        if (w->dt == MDL_DT_F8_E4M3) { /* FP8 q/k/v: the stacked codes and their scale rows */
            const mdl_param *s = &d->derived[2];
            op.p[3] = KERN_DT_FP8;
            op.buf[5] = B(s->ptr, s->bytes);
            op.p[5] = c->fp8_b0;
            op.p[6] = c->fp8_b1;
        }
        eng_tape_push(t, &op);
    }
    const size_t bt_bytes = (size_t)io->max_seqs * (size_t)io->max_blocks * i32;
    for (int l = 0; l < c->layers; l++) {
        float *kv = ws->ckv + (size_t)l * 2 * (size_t)kvd; /* [K_l | V_l] inside each row */
        kern_op op = {.kind = KOP_QK_NORM_ROPE};
        op.buf[0] = B(kv, R * (size_t)ckv_cols * F4);
        op.buf[2] = B((float *)d->derived[1].ptr + (size_t)l * (size_t)hd, (size_t)hd * F4);
        op.buf[3] = B(dio->c_pos, R * i32);
        op.buf[4] = B(d->inv_freq, (size_t)(hd / 2) * F4);
        op.buf[5] = B(dio->c_n, i32);
        op.p[0] = 0; /* keys only */
        op.p[1] = nkv;
        op.p[2] = hd;
        op.p[3] = ckv_cols;
        op.p[4] = rows;
        op.f[0] = (float)c->rms_eps;
        eng_tape_push(t, &op);

        memset(&op, 0, sizeof op);
        op.kind = KOP_KV_WRITE;
        op.buf[0] = B(kv, R * (size_t)ckv_cols * F4);
        op.buf[1] = B(dio->kcache[l], dio->kv_layer_bytes);
        op.buf[2] = B(dio->vcache[l], dio->kv_layer_bytes);
        op.buf[3] = B(dio->c_slot, R * i32);
        op.buf[4] = B(dio->c_pos, R * i32);
        op.buf[5] = B(io->block_tables, bt_bytes);
        op.buf[6] = B(dio->c_n, i32);
        op.p[0] = nkv;
        op.p[1] = hd;
        op.p[2] = ckv_cols;
        op.p[3] = 0;
        op.p[4] = kvd;
        op.p[5] = io->block_size;
        op.p[6] = io->max_blocks;
        op.p[7] = rows;
        eng_tape_push(t, &op);
    }
}

void mdl_emit_draft_block(const mdl_model *d, const mdl_model *target, const mdl_draft_ws *ws,
                          const eng_step_io *io, const mdl_draft_io *dio, int rows, eng_tape *t)
{
    const mdl_config *c = &d->cfg;
    const int H = c->hidden, W = ws->W;
    const int max_seqs = rows / c->block_size > 0 ? rows / c->block_size : 1;
    const int logit_rows = max_seqs * W;
    const mdl_model *head = c->own_embed ? d : target; /* DFlash: the target's embed and lm_head */
    layer_io lio = {
        .x = ws->x, .h = ws->h, .qkv = ws->qkv, .attn = ws->attn, .gu = ws->gu, .act = ws->act,
        .pos = dio->d_pos, .slot = dio->d_slot, .kv_len = dio->d_kv_len, .n_rows = dio->d_n,
        .block_tables = io->block_tables,
        .kv_bytes = dio->kv_layer_bytes,
        .bt_bytes = (size_t)io->max_seqs * (size_t)io->max_blocks * sizeof(int32_t),
        .block_size = io->block_size, .max_blocks = io->max_blocks,
    };
    emit_embed(t, head, dio->d_tok, ws->x, rows, dio->d_n);
    for (int l = 0; l < c->layers; l++) {
        lio.kc = dio->kcache[l];
        lio.vc = dio->vcache[l];
        emit_layer(t, d, l, &lio, rows);
    }
    emit_gather(t, ws->x, rows, dio->d_logit_idx, ws->xs, logit_rows, H, dio->d_n_logits);
    emit_rmsnorm(t, d, ws->xs, d->final_norm, ws->xs, logit_rows, dio->d_n_logits);
    emit_matmul(t, head, ws->xs, H, head->lm_head, -1, ws->logits, c->vocab, logit_rows, dio->d_n_logits, 0);

    const mdl_param *w1 = d->markov_w1 >= 0 ? &d->params[d->markov_w1] : NULL;
    const mdl_param *w2 = d->markov_w2 >= 0 ? &d->params[d->markov_w2] : NULL;
    kern_op op = {.kind = KOP_DRAFT_SELECT};
    op.buf[0] = B(ws->logits, (size_t)logit_rows * (size_t)c->vocab * F4);
    op.buf[1] = w1 ? B(w1->ptr, w1->bytes) : B(NULL, 0);
    op.buf[2] = w2 ? B(w2->ptr, w2->bytes) : B(NULL, 0);
    op.buf[3] = B(dio->d_anchor, (size_t)max_seqs * sizeof(int32_t));
    op.buf[4] = B(ws->drafts, (size_t)logit_rows * sizeof(int32_t));
    op.buf[5] = B(dio->d_nseq, sizeof(int32_t));
    op.p[0] = W;
    op.p[1] = c->vocab;
    op.p[2] = c->markov_rank;
    op.p[3] = d->wdt;
    op.p[4] = max_seqs;
    eng_tape_push(t, &op);

    if (d->conf_w >= 0) {
        memset(&op, 0, sizeof op);
        op.kind = KOP_CONFIDENCE;
        op.buf[0] = B(ws->xs, (size_t)logit_rows * (size_t)H * F4);
        op.buf[1] = w1 && c->conf_with_markov ? B(w1->ptr, w1->bytes) : B(NULL, 0);
        op.buf[2] = B(ws->drafts, (size_t)logit_rows * sizeof(int32_t));
        op.buf[3] = B(dio->d_anchor, (size_t)max_seqs * sizeof(int32_t));
        op.buf[4] = B(d->params[d->conf_w].ptr, d->params[d->conf_w].bytes);
        op.buf[5] = B(d->params[d->conf_b].ptr, d->params[d->conf_b].bytes);
        op.buf[6] = B(ws->conf, (size_t)logit_rows * F4);
        op.buf[7] = B(dio->d_nseq, sizeof(int32_t));
        op.p[0] = W;
        op.p[1] = H;
        op.p[2] = c->markov_rank;
        op.p[3] = d->wdt;
        op.p[4] = max_seqs;
        op.p[5] = c->vocab;
        eng_tape_push(t, &op);
    }
}
