/* models/forward.c — the target's forward pass as an op tape (Qwen3 / Llama / Qwen2).
 *
 * One step processes R rows (tokens of any sequences, prefill chunks and decode tokens mixed):
 *   x = embed(tok)                                          [R,H]
 *   per layer:  h = rmsnorm(x) ; qkv = h Wqkv^T (+b)        [R,(nh+2nkv)hd]
 *               q,k: per-head rmsnorm (qwen3) then RoPE(pos)
 *               cache[slot, pos] = k, v ; attn = softmax(q K^T * hd^-0.5) V over kv_len keys
 *               x += attn Wo^T (+b)
 *               h = rmsnorm(x) ; gu = h Wgu^T ; act = silu(gate) * up ; x += act Wdown^T
 *   xs = x[logit_idx] ; xs = rmsnorm(xs) ; logits = xs Wlm^T    [n_logits, V]
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
    return 0;
}

size_t mdl_forward_ops(const mdl_model *m) { return 4 + 10 * (size_t)m->cfg.layers; }

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

void mdl_emit_forward(const mdl_model *m, const mdl_workspace *ws, const eng_step_io *io, int rows,
                      int logit_rows, eng_tape *t)
{
    const mdl_config *c = &m->cfg;
    const int H = c->hidden, I = c->intermediate, hd = c->head_dim, nh = c->heads, nkv = c->kv_heads;
    const int qkv_n = (nh + 2 * nkv) * hd;
    const size_t R = (size_t)rows, i32 = sizeof(int32_t);
    const size_t bt_bytes = (size_t)io->max_seqs * (size_t)io->max_blocks * i32;
    kern_op op;

    memset(&op, 0, sizeof op);
    op.kind = KOP_EMBED;
    op.buf[0] = B(io->tok, R * i32);
    op.buf[1] = B(m->params[m->embed].ptr, m->params[m->embed].bytes);
    op.buf[2] = B(ws->x, R * (size_t)H * F4);
    op.buf[3] = B(io->n_rows, i32);
    op.p[0] = H;
    op.p[1] = c->vocab;
    op.p[2] = rows;
    op.p[3] = m->wdt;
    eng_tape_push(t, &op);

    for (int l = 0; l < c->layers; l++) {
        const mdl_layer_params *L = &m->layer[l];
        emit_rmsnorm(t, m, ws->x, L->input_norm, ws->h, rows, io->n_rows);
        emit_matmul(t, m, ws->h, H, L->qkv, L->qkv_bias, ws->qkv, qkv_n, rows, io->n_rows, 0);

        memset(&op, 0, sizeof op);
        op.kind = KOP_QK_NORM_ROPE;
        op.buf[0] = B(ws->qkv, R * (size_t)qkv_n * F4);
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
        op.buf[0] = B(ws->qkv, R * (size_t)qkv_n * F4);
        op.buf[1] = B(io->kcache[l], io->kv_layer_bytes);
        op.buf[2] = B(io->vcache[l], io->kv_layer_bytes);
        op.buf[3] = B(io->slot, R * i32);
        op.buf[4] = B(io->pos, R * i32);
        op.buf[5] = B(io->block_tables, bt_bytes);
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
        op.buf[0] = B(ws->qkv, R * (size_t)qkv_n * F4);
        op.buf[1] = B(io->kcache[l], io->kv_layer_bytes);
        op.buf[2] = B(io->vcache[l], io->kv_layer_bytes);
        op.buf[3] = B(ws->attn, R * (size_t)(nh * hd) * F4);
        op.buf[4] = B(io->slot, R * i32);
        op.buf[5] = B(io->kv_len, R * i32);
        op.buf[6] = B(io->block_tables, bt_bytes);
        op.buf[7] = B(io->n_rows, i32);
        op.p[0] = nh;
        op.p[1] = nkv;
        op.p[2] = hd;
        op.p[3] = qkv_n;
        op.p[4] = io->block_size;
        op.p[5] = io->max_blocks;
        op.p[6] = rows;
        op.f[0] = (float)(1.0 / sqrt((double)hd));
        eng_tape_push(t, &op);

        emit_matmul(t, m, ws->attn, nh * hd, L->o, L->o_bias, ws->x, H, rows, io->n_rows, 1);
        emit_rmsnorm(t, m, ws->x, L->post_norm, ws->h, rows, io->n_rows);
        emit_matmul(t, m, ws->h, H, L->gate_up, -1, ws->gu, 2 * I, rows, io->n_rows, 0);

        memset(&op, 0, sizeof op);
        op.kind = KOP_SILU_MUL;
        op.buf[0] = B(ws->gu, R * (size_t)(2 * I) * F4);
        op.buf[1] = B(ws->act, R * (size_t)I * F4);
        op.buf[2] = B(io->n_rows, i32);
        op.p[0] = I;
        op.p[1] = rows;
        eng_tape_push(t, &op);

        emit_matmul(t, m, ws->act, I, L->down, -1, ws->x, H, rows, io->n_rows, 1);
    }

    memset(&op, 0, sizeof op);
    op.kind = KOP_GATHER_ROWS;
    op.buf[0] = B(ws->x, R * (size_t)H * F4);
    op.buf[1] = B(io->logit_idx, (size_t)logit_rows * i32);
    op.buf[2] = B(ws->xs, (size_t)logit_rows * (size_t)H * F4);
    op.buf[3] = B(io->n_logits, i32);
    op.p[0] = H;
    op.p[1] = rows;
    op.p[2] = logit_rows;
    eng_tape_push(t, &op);

    emit_rmsnorm(t, m, ws->xs, m->final_norm, ws->xs, logit_rows, io->n_logits);
    emit_matmul(t, m, ws->xs, H, m->lm_head, -1, ws->logits, c->vocab, logit_rows, io->n_logits, 0);
}
