/* models/model.h — a target model: its parameter table, storage, load sessions and forward tape.
 *
 * Parameter table (I2): every checkpoint tensor name maps to exactly one destination, a whole
 * runtime parameter or a row range of a stacked one:
 *   model.layers.N.self_attn.{q,k,v}_proj.weight -> rows [0,nh*hd) / [nh*hd, +nkv*hd) / [.., +nkv*hd)
 *                                                   of layers.N.qkv [(nh+2nkv)*hd, H]
 *   model.layers.N.self_attn.{q,k,v}_proj.bias   -> the same rows of layers.N.qkv_bias (qwen2)
 *   model.layers.N.mlp.{gate,up}_proj.weight     -> rows [0,I) / [I,2I) of layers.N.gate_up [2I, H]
 *   Qwen3-MoE, a sparse layer N (E experts of moe_intermediate_size I):
 *   model.layers.N.mlp.gate.weight [E, H]        -> layers.N.router
 *   model.layers.N.mlp.experts.e.gate_proj.weight -> rows [e*2I, e*2I+I)    of layers.N.w13 [E*2I, H]
 *   model.layers.N.mlp.experts.e.up_proj.weight   -> rows [e*2I+I, (e+1)*2I) of layers.N.w13
 *   model.layers.N.mlp.experts.e.down_proj.weight -> rows [e*H, (e+1)*H)     of layers.N.w2 [E*H, I]
 *   model.layers.N.mlp.experts.gate_up_proj [E, 2I, H] (transformers 5) -> all of layers.N.w13
 *   model.layers.N.mlp.experts.down_proj [E, H, I]     (transformers 5) -> all of layers.N.w2
 *   (the fused names are aliases covering every expert's parts: coverage stays per expert part, so
 *   either layout, or a mix across buckets, fills the same bytes)
 *   block-FP8 (cfg.fp8): a projection X's X.weight (F8_E4M3) goes to its rows as above, and
 *   X.weight_scale_inv [ceil(rows / b0), ceil(cols / b1)] to rows [row0 / b0, ..) of the stacked
 *   parameter's scale table (a parameter of its own, e.g. layers.N.qkv.scale): weight and scale are
 *   separate destinations with separate coverage, so they may arrive in any buckets and any order
 *   (a shard whose rows do not start on a block, or end off one before the matrix ends, is refused
 *   when the model is built)
 *   compressed-tensors FP8 (cfg.fp8_ct): the scale is X.weight_scale, [ceil(rows / b0), ceil(cols /
 *   b1)] (strategy block), [rows, 1] (channel: the table has one column) or [1] (tensor: written into
 *   each of its shard's rows of the one-column table, so the kernel applies each shard's own scale)
 *   everything else                              -> one parameter of the same shape
 * Writing a tensor is a dtype-converting copy into its destination, in any order, in any bucket.
 * Matrices are stored in bf16 when the checkpoint's torch_dtype is bfloat16, else f32 (so f16 and
 * f32 checkpoints lose nothing); norm weights and biases are always f32.
 *
 * Tied embeddings: lm_head shares embed_tokens' storage. The table maps model.embed_tokens.weight
 * to it and also accepts lm_head.weight as an alias of the same destination: writing either one
 * writes the shared matrix (and covers it); the last write in a session wins.
 *
 * Coverage (I3): each destination part has a coverage slot set when it is written in the current
 * session. Sessions (I4): begin -> buckets -> finish; finish checks coverage in full mode and runs
 * the post-load hook exactly once when anything was written.
 */
#ifndef GS_MDL_MODEL_H
#define GS_MDL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/backend/stepio.h"
#include "engine/backend/tape.h"
#include "models/config.h"
#include "models/format/safetensors.h"

typedef struct {
    char name[64];   /* runtime name, e.g. "layers.3.qkv" */
    void *ptr;       /* arena storage, never moves */
    mdl_dtype dt;    /* storage dtype: BF16 or F32; F8_E4M3 for the projections of a block-FP8 model */
    int64_t rows, cols; /* vectors: rows = n, cols = 1 */
    size_t bytes;
    int scale;       /* F8_E4M3: the parameter holding its f32 block scales
                        [ceil(rows / fp8_b0), ceil(cols / fp8_b1)]; -1 otherwise */
    int is_scale;    /* this parameter is such a block-scale table */
    mdl_dtype ckpt_dt; /* a scale table: the dtype its tensors last arrived in (F32, or the BF16 /
                          F16 of compressed-tensors checkpoints), so exports give them back as they
                          came (exactly: every one of those values is an f32) */
} mdl_param;

typedef struct {
    char *name;          /* checkpoint tensor name */
    int param;           /* destination parameter */
    int64_t row0, rows;  /* destination row range */
    int ndim;            /* expected checkpoint shape: [rows], [rows, cols] or [d0, rows / d0, cols] */
    int64_t cols;
    int64_t d0;          /* ndim 3: the leading dimension (experts) */
    int cover, n_cover;  /* coverage slots [cover, cover + n_cover) */
    int bcast;           /* a per-tensor FP8 scale (compressed-tensors strategy "tensor"): the
                            checkpoint's one value, shape [1] (or []), fills rows [row0, row0 + rows)
                            of the scale table (its shard's rows) */
    int alias;           /* another name of parts that have names of their own (the tied lm_head,
                            the fused expert tensors): not reported missing, not a checkpoint tensor
                            of its own in checksums and exports */
    /* Online FP8 (cfg.fp8_online): each FP8 weight part X.weight has a scale part
     * X.weight_scale_inv (online_scale), its rows of the scale table, so that exports and
     * checksums carry the scales computed on arrival, and a replica can take codes + scales as they
     * are (--weights-from). A full update of bf16 / f32 weights does not need the scale parts (no
     * coverage), but a session that writes codes must write their scales and nothing else may:
     * mdl_session_check. pair: the other part's coverage slot (-1: not such a part). */
    int online_scale, pair;
} mdl_dest;

/* The leading dimension of d's checkpoint tensor: its rows, or 1 for a per-tensor scale (bcast) */
static inline int64_t mdl_dest_ckpt_rows(const mdl_dest *d) { return d->bcast ? 1 : d->rows; }

typedef struct {
    int input_norm, qkv, qkv_bias, q_norm, k_norm, o, o_bias, post_norm, gate_up, down;
    int router, w13, w2; /* a sparse MoE layer (gate_up = down = -1 there; -1 in a dense layer) */
} mdl_layer_params;

typedef struct mdl_model {
    mdl_config cfg;
    eng_backend *be;
    mdl_param *params;
    int n_params;
    mdl_dest *dests; /* sorted by name */
    int n_dests;
    int n_cover;
    mdl_layer_params *layer;
    int embed, final_norm, lm_head; /* lm_head == embed when tied; -1 in a DFlash drafter (it
                                       uses its target's by reference) */
    /* drafters only (-1 otherwise) */
    int fc, hidden_norm, markov_w1, markov_w2, conf_w, conf_b;
    /* Derived buffers (drafters): refilled in place by the post-load hook from the layers'
     * checkpoint-layout parameters, never reallocated (I1, I4):
     *   ctx_kv    [L * 2 * nkv * hd, H]  rows K0, V0, K1, V1, ... (k_proj / v_proj of each layer)
     *   ctx_knorm [L, hd]                 k_norm of each layer
     *   ctx_kv_scale [L * 2 * nkv * hd / b0, ceil(H / b1)]  FP8 q/k/v only (derived[2], n_derived
     *                                     3): the scale rows of ctx_kv's rows */
    mdl_param derived[3];
    int n_derived;
    float *inv_freq;                /* RoPE inverse frequencies [hd/2] of the config's rope type: a derived
                                       buffer, filled at create and refilled in place by the hook */
    kern_dtype wdt;                 /* storage dtype of matrices */
    uint64_t hook_runs;             /* post-load hook executions (tests, metrics) */
    uint64_t weight_bytes;          /* bytes of all parameters */
    /* online FP8 (cfg.fp8_online): host scratch for quantizing an arriving tensor one block row
     * at a time (q8_rows rows of the widest FP8 projection), allocated at create */
    float *q8_f32, *q8_scales;
    uint8_t *q8_codes;
    int64_t q8_rows, q8_cols;
} mdl_model;

/* Builds the table and allocates every parameter from the backend arena (zeroed). Targets and
 * drafters (cfg->is_drafter) alike. */
mdl_model *mdl_model_create(const mdl_config *cfg, eng_backend *be, char *err, size_t errlen);
void mdl_model_destroy(mdl_model *m);
const mdl_dest *mdl_model_find(const mdl_model *m, const char *name);

/* ---- load sessions ---------------------------------------------------------------------------- */
typedef enum { MDL_LOAD_FULL = 0, MDL_LOAD_PARTIAL = 1 } mdl_load_mode;

typedef struct {
    mdl_model *m;
    mdl_load_mode mode;
    uint8_t *covered; /* [n_cover] */
    /* [n_cover] online FP8 weight parts that arrived in this session as F8_E4M3 codes (raw) or as
     * bf16 / f16 / f32 weights, quantized on arrival (conv) */
    uint8_t *raw, *conv;
    uint64_t tensors, bytes, buckets;
    int wrote;
} mdl_session;

int mdl_session_begin(mdl_session *s, mdl_model *m, mdl_load_mode mode, char *err, size_t errlen);
/* Validates the whole bucket (names known, shapes equal, dtypes convertible) before writing any
 * byte; a bad bucket changes nothing. `what` names the source in messages. */
int mdl_session_bucket(mdl_session *s, const mdl_st_tensor *t, size_t n, const char *what, char *err,
                       size_t errlen);
/* The two halves of mdl_session_bucket (a bucket spanning two models validates both first). */
int mdl_session_validate(const mdl_session *s, const mdl_st_tensor *t, size_t n, const char *what, char *err,
                         size_t errlen);
void mdl_session_write(mdl_session *s, const mdl_st_tensor *t, size_t n);
/* The same write when every t[i].data is device memory of m->be (an NCCL staging buffer, a CUDA-IPC
 * mapping): backend device_convert instead of upload_convert; coverage and counters alike. */
void mdl_session_write_device(mdl_session *s, const mdl_st_tensor *t, size_t n);
/* What a finish requires (no hook): 0; MDL_CHECK_COVERAGE (full mode: a part did not arrive,
 * "missing tensor ..." in err); or MDL_CHECK_PAIRS (either mode, online FP8: a weight part arrived
 * as codes without its scale part in this session, or a scale part without its codes: it is
 * computed when the weights arrive in bf16 / f16 / f32; the tensor named in err). */
enum { MDL_CHECK_COVERAGE = 1, MDL_CHECK_PAIRS = 2 };
int mdl_session_check(const mdl_session *s, char *err, size_t errlen);
/* Runs the post-load hook if the session wrote anything (exactly once per finish). */
void mdl_session_run_hook(mdl_session *s);
/* mdl_session_check, then the post-load hook once if anything was written. Returns 0 or -1 with
 * err (the session stays open for an abort). */
int mdl_session_finish(mdl_session *s, char *err, size_t errlen);
void mdl_session_end(mdl_session *s); /* frees session state (after finish or to abort) */

/* Reads a checkpoint folder (model.safetensors, or the shards of model.safetensors.index.json,
 * each tensor checked against the index) and hands its tensors to fn in buckets of about
 * bucket_bytes (0: one bucket per file), straight from the memory-mapped files. */
typedef int (*mdl_bucket_fn)(const mdl_st_tensor *t, size_t n, const char *what, void *user, char *err,
                             size_t errlen);
int mdl_ckpt_foreach_bucket(const char *dir, size_t bucket_bytes, mdl_bucket_fn fn, void *user, char *err,
                            size_t errlen);

/* Cold load of a checkpoint folder: one session, one bucket per safetensors file, finish. */
int mdl_model_load_dir(mdl_model *m, const char *dir, char *err, size_t errlen);
/* The same, calling fn(done, total, final, user) before the first bucket, after each bucket of about
 * 64 MiB (bytes of model storage filled so far, of all of it) and, with final = 1, once the load
 * succeeded; fn decides what to show. */
typedef void (*mdl_load_progress_fn)(uint64_t done, uint64_t total, int final, void *user);
int mdl_model_load_dir_progress(mdl_model *m, const char *dir, mdl_load_progress_fn fn, void *user, char *err,
                                size_t errlen);

/* ---- forward ------------------------------------------------------------------------------------ */
typedef struct {
    float *x, *h, *qkv, *attn, *tmp, *gu, *act, *xs, *logits;
    int max_rows, max_logits;
    /* Feature capture for a drafter (NULL when none): for each target layer id feat_ids[i] the
     * hidden state is copied into columns [i*H, (i+1)*H) of feat [max_rows, n_feat*H]: id -1 the
     * embedding output, 0 <= id <= L-2 the residual stream after layer id, id L-1 the final-normed
     * state after the last layer (Hugging Face output_hidden_states semantics). */
    float *feat;
    const int *feat_ids;
    int n_feat;
    int feat_h; /* hidden size H of the feature columns */
    /* Qwen3-MoE (NULL without sparse layers): router logits [max_rows, E], the chosen experts and
     * their weights [max_rows, k] (step buffers: one plan replays for any routing), and the
     * experts' scratch (kern_moe_scratch_bytes) */
    float *moe_logits, *moe_w;
    int32_t *moe_ids;
    void *moe_scratch;
} mdl_workspace;

int mdl_workspace_alloc(const mdl_model *m, eng_backend *be, int max_rows, int max_logits,
                        mdl_workspace *ws, char *err, size_t errlen);
/* Allocates the feature buffer for a drafter reading target layers ids[0..n). */
int mdl_workspace_add_features(const mdl_model *m, eng_backend *be, mdl_workspace *ws, const int *ids, int n,
                               char *err, size_t errlen);
/* Number of ops mdl_emit_forward pushes (to size tapes). */
size_t mdl_forward_ops(const mdl_model *m);
/* Emits one step for `rows` rows (the plan bucket) and `logit_rows` logits rows. */
void mdl_emit_forward(const mdl_model *m, const mdl_workspace *ws, const eng_step_io *io, int rows,
                      int logit_rows, eng_tape *t);

/* ---- drafter (DFlash / DSpark) forward -------------------------------------------------------------
 * Step parameters of the drafter's plans (plan-visible, engine-owned; R rows max, S sequences):
 *   context step (one row per newly committed position):
 *     c_idx i32[R]  row of the target step's feature buffer;  c_pos, c_slot i32[R];  c_n i32[1]
 *   draft step (B rows per drafting sequence, row = s*B + j):
 *     d_tok, d_pos, d_slot, d_kv_len i32[R];  d_n i32[1];
 *     d_logit_idx i32[R], d_n_logits i32[1]   block rows whose logits are drafts
 *     d_anchor i32[S], d_nseq i32[1]          per drafting sequence
 * The drafter's KV cache uses the target's block tables (same slots, same positions). */
typedef struct {
    int32_t *c_idx, *c_pos, *c_slot, *c_n;
    int32_t *d_tok, *d_pos, *d_slot, *d_kv_len, *d_n, *d_logit_idx, *d_n_logits, *d_anchor, *d_nseq;
    float **kcache, **vcache; /* per drafter layer, same blocks as the target's cache */
    size_t kv_layer_bytes;
} mdl_draft_io;

typedef struct {
    float *cfeat, *c, *ckv;           /* context: [R, k*H], [R, H], [R + 1, L*2*nkv*hd] */
    float *x, *h, *qkv, *attn, *gu, *act, *xs, *logits; /* draft block rows */
    int32_t *drafts;                  /* [R]: row = s*W + k */
    float *conf;                      /* [R] (DSpark confidence head) */
    int max_rows;
    int W;                            /* drafts per block: B-1 (DFlash) or B (DSpark) */
} mdl_draft_ws;

int mdl_draft_ws_alloc(const mdl_model *d, eng_backend *be, int max_rows, mdl_draft_ws *ws, char *err,
                       size_t errlen);
size_t mdl_draft_ops(const mdl_model *d);
/* Context step for `rows` committed positions: features -> fc -> hidden_norm -> one GEMM against
 * the stacked K/V weight -> per-layer k_norm + RoPE -> the drafter's KV cache. */
void mdl_emit_draft_context(const mdl_model *d, const mdl_draft_ws *ws, const mdl_workspace *tws,
                            const eng_step_io *io, const mdl_draft_io *dio, int rows, eng_tape *t);
/* Draft step for `rows` block rows (= n_seqs * B): embed -> layers (non-causal over context + block)
 * -> norm -> lm_head of the drafter (DSpark) or the target (DFlash) -> Markov choice -> confidence. */
void mdl_emit_draft_block(const mdl_model *d, const mdl_model *target, const mdl_draft_ws *ws,
                          const eng_step_io *io, const mdl_draft_io *dio, int rows, eng_tape *t);

#endif
