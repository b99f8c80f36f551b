/* tests/gpu/gpu_fwd.h — a model's forward pass driven directly (no scheduler): step buffers, KV cache
 * and workspace allocated on any backend, step parameters uploaded by hand, the tape run eagerly or
 * replayed as a plan. Used by the model parity tests and by the decode benchmark. */
#ifndef GS_GPU_FWD_H
#define GS_GPU_FWD_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/backend/stepio.h"
#include "engine/backend/tape.h"
#include "models/config.h"
#include "models/model.h"

typedef struct {
    eng_backend *be;
    mdl_model *m;
    eng_step_io io;
    mdl_workspace ws;
    eng_tape tape;
    int32_t *h_bt;
} gpu_fwd;

static inline void *gpu_fwd_alloc(eng_backend *be, size_t bytes, const char *tag, int *ok)
{
    void *p = be->ops->alloc(be, bytes, tag);
    if (!p) *ok = 0;
    return p;
}

/* Loads dir on be; sizes for max_rows rows, max_seqs sequences of up to max_len tokens. */
static inline int gpu_fwd_open(gpu_fwd *f, eng_backend *be, const char *dir, int max_rows, int max_seqs,
                               int max_len, int block_size, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->be = be;
    mdl_config cfg;
    if (mdl_config_load(dir, &cfg, err, errlen) != 0) return -1;
    f->m = mdl_model_create(&cfg, be, err, errlen);
    if (!f->m) return -1;
    if (mdl_model_load_dir(f->m, dir, err, errlen) != 0) return -1;
    eng_step_io *io = &f->io;
    const size_t R = (size_t)max_rows, S = (size_t)max_seqs, i32 = sizeof(int32_t);
    io->max_rows = max_rows;
    io->max_seqs = max_seqs;
    io->block_size = block_size;
    io->max_blocks = (max_len + block_size - 1) / block_size;
    io->num_blocks = max_seqs * io->max_blocks;
    io->kv_layer_bytes = (size_t)io->num_blocks * (size_t)block_size * (size_t)cfg.kv_heads * (size_t)cfg.head_dim *
                         sizeof(float);
    int ok = 1;
    io->tok = gpu_fwd_alloc(be, R * i32, "t.tok", &ok);
    io->pos = gpu_fwd_alloc(be, R * i32, "t.pos", &ok);
    io->slot = gpu_fwd_alloc(be, R * i32, "t.slot", &ok);
    io->kv_len = gpu_fwd_alloc(be, R * i32, "t.kv_len", &ok);
    io->n_rows = gpu_fwd_alloc(be, i32, "t.n_rows", &ok);
    io->logit_idx = gpu_fwd_alloc(be, R * i32, "t.logit_idx", &ok);
    io->n_logits = gpu_fwd_alloc(be, i32, "t.n_logits", &ok);
    io->block_tables = gpu_fwd_alloc(be, S * (size_t)io->max_blocks * i32, "t.bt", &ok);
    io->kcache = calloc((size_t)cfg.layers, sizeof(float *));
    io->vcache = calloc((size_t)cfg.layers, sizeof(float *));
    f->h_bt = malloc(S * (size_t)io->max_blocks * i32);
    if (!io->kcache || !io->vcache || !f->h_bt || !ok) {
        snprintf(err, errlen, "out of memory for the step buffers");
        return -1;
    }
    for (int l = 0; l < cfg.layers; l++) {
        io->kcache[l] = gpu_fwd_alloc(be, io->kv_layer_bytes, "t.kc", &ok);
        io->vcache[l] = gpu_fwd_alloc(be, io->kv_layer_bytes, "t.vc", &ok);
    }
    if (!ok) {
        snprintf(err, errlen, "out of device memory for the KV cache");
        return -1;
    }
    if (mdl_workspace_alloc(f->m, be, max_rows, max_rows, &f->ws, err, errlen) != 0) return -1;
    if (eng_tape_init(&f->tape, mdl_forward_ops(f->m)) != 0) {
        snprintf(err, errlen, "out of memory for the tape");
        return -1;
    }
    for (size_t i = 0; i < S * (size_t)io->max_blocks; i++) f->h_bt[i] = (int32_t)i; /* slot s: its own blocks */
    be->ops->upload(be, io->block_tables, f->h_bt, S * (size_t)io->max_blocks * i32);
    be->ops->synchronize(be);
    return 0;
}

static inline void gpu_fwd_close(gpu_fwd *f)
{
    eng_tape_free(&f->tape);
    free(f->io.kcache);
    free(f->io.vcache);
    free(f->h_bt);
    mdl_model_destroy(f->m);
    memset(f, 0, sizeof *f);
}

/* The tape for a bucket of `rows` rows (logits for up to `rows` rows). */
static inline const eng_tape *gpu_fwd_emit(gpu_fwd *f, int rows)
{
    eng_tape_reset(&f->tape);
    mdl_emit_forward(f->m, &f->ws, &f->io, rows, rows, &f->tape);
    return &f->tape;
}

/* Uploads one step: n rows (tok, pos, slot; kv_len = pos + 1: causal) and nl logits rows. */
static inline void gpu_fwd_params(gpu_fwd *f, const int32_t *tok, const int32_t *pos, const int32_t *slot, int n,
                                  const int32_t *logit_idx, int nl)
{
    eng_backend *be = f->be;
    int32_t kvl[4096];
    for (int i = 0; i < n && i < 4096; i++) kvl[i] = pos[i] + 1;
    const size_t i32 = sizeof(int32_t);
    be->ops->upload(be, f->io.tok, tok, (size_t)n * i32);
    be->ops->upload(be, f->io.pos, pos, (size_t)n * i32);
    be->ops->upload(be, f->io.slot, slot, (size_t)n * i32);
    be->ops->upload(be, f->io.kv_len, kvl, (size_t)n * i32);
    be->ops->upload(be, f->io.n_rows, &n, i32);
    be->ops->upload(be, f->io.logit_idx, logit_idx, (size_t)nl * i32);
    be->ops->upload(be, f->io.n_logits, &nl, i32);
}

/* Runs the step (plan when given, else the tape for bucket `rows` eagerly) and downloads nl rows of
 * logits into out [nl, vocab]. */
static inline void gpu_fwd_run(gpu_fwd *f, int rows, eng_plan *plan, int nl, float *out)
{
    eng_backend *be = f->be;
    if (plan) be->ops->plan_launch(be, plan);
    else be->ops->run(be, gpu_fwd_emit(f, rows));
    if (out && nl > 0)
        be->ops->download(be, out, f->ws.logits, (size_t)nl * (size_t)f->m->cfg.vocab * sizeof(float));
    be->ops->synchronize(be);
}

#endif
