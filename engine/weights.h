/* engine/weights.h — weight-update sessions of a live engine (cold load, reload, trainer updates).
 *
 * One mechanism for every transport: a transport only produces (name, dtype, shape, bytes) tensors
 * and calls begin -> bucket* -> finish | abort on the engine thread.
 *
 * States (I6-I8):
 *   READY         serving; begin opens a session -> UPDATING
 *   UPDATING      a session is open; no step runs (I7); requests queue
 *   INCONSISTENT  a session wrote some weights and then failed or was aborted; generation is refused
 *                 (503 with the reason) until a complete full update succeeds (I8)
 *   UNDEFINED     the guard found a plan-visible buffer moved, resized or retyped: plans would replay
 *                 onto freed memory, so generation and updates are refused for good (I5)
 * finish: coverage (full mode) -> each touched model's post-load hook exactly once (I4) -> guard
 * (address, size, dtype of every plan-visible buffer vs capture) -> version bump -> prefix cache
 * dropped (I6) -> frozen sequences resume ("keep") or recompute their KV ("recompute").
 * Pause modes are applied at begin: "abort" ends running requests; "wait" is a drain the caller
 * performs first (eng_set_admission(0) and step until nothing runs, bounded); "keep" and
 * "recompute" leave sequences frozen in their slots.
 */
#ifndef GS_ENG_WEIGHTS_H
#define GS_ENG_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "models/format/safetensors.h"

typedef struct eng_engine eng_engine;

typedef enum { ENG_W_READY = 0, ENG_W_UPDATING, ENG_W_INCONSISTENT, ENG_W_UNDEFINED } eng_wstate;
typedef enum { ENG_PAUSE_WAIT = 0, ENG_PAUSE_ABORT, ENG_PAUSE_KEEP, ENG_PAUSE_RECOMPUTE } eng_pause;
typedef enum { ENG_WMODEL_TARGET = 0, ENG_WMODEL_DRAFT, ENG_WMODEL_ALL } eng_wmodel;

const char *eng_wstate_name(eng_wstate s);
int eng_pause_parse(const char *s, eng_pause *out);
int eng_wmodel_parse(const char *s, eng_wmodel *out);

typedef struct {
    eng_wstate state;
    char reason[512];
    uint64_t version_num;      /* bumped by every successful finish (0: the cold load) */
    char version[128];         /* the string given at begin/finish, or the number */
    int session_open;
    uint64_t session_id;
    /* the last finished update */
    uint64_t tensors, bytes, buckets;
    double ms, hook_ms, guard_ms;
    uint64_t hook_runs_target, hook_runs_draft;
    uint64_t updates_ok, updates_failed;
    /* session bookkeeping */
    int prev_state_ok;          /* state was READY at begin */
    char pending_version[128];  /* version given at begin */
} eng_weights_info;

/* Each returns 0, or -1 with err and the HTTP status that fits (400 bad bucket, 409 out of order,
 * 422 incomplete, 503 unavailable). */
int eng_weights_begin(eng_engine *e, int full, eng_wmodel which, eng_pause pause, const char *version,
                      uint64_t *session_id, char *err, size_t errlen, int *status);
int eng_weights_bucket(eng_engine *e, const mdl_st_tensor *t, size_t n, const char *what, char *err,
                       size_t errlen, int *status);
/* GPU transports (NCCL staging, CUDA IPC): the same bucket when every t[i].data is device memory of
 * the engine's backend (written with its device_convert). */
int eng_weights_bucket_device(eng_engine *e, const mdl_st_tensor *t, size_t n, const char *what, char *err,
                              size_t errlen, int *status);
/* The checks of a bucket (session open: else 409; names, shapes, dtypes of both models: else 400)
 * without writing: a transport validates the metadata before receiving the bytes. t[i].data is not
 * read. */
int eng_weights_validate(eng_engine *e, const mdl_st_tensor *t, size_t n, const char *what, char *err,
                         size_t errlen, int *status);
int eng_weights_finish(eng_engine *e, const char *version, char *err, size_t errlen, int *status);
int eng_weights_abort(eng_engine *e, char *err, size_t errlen, int *status);
void eng_weights_get_info(const eng_engine *e, eng_weights_info *out);
eng_wstate eng_weights_state(const eng_engine *e);
/* Renames the current version (SGLang /update_weight_version); the weights are unchanged. */
void eng_weights_set_version(eng_engine *e, const char *version);
/* SGLang's weights_checker "reset_tensors" (weights_reset.c): one partial session that overwrites
 * every checkpoint tensor of `which` (model "all": the drafter's as "draft.<name>") with
 * pseudo-random values uniform in [0, 1) in the checkpoint dtype, except names containing one of
 * skip[0..n_skip); running requests are aborted; the hooks run; the version string is kept.
 * *n_reset: tensors written. 0, or -1 with err / *status as eng_weights_begin / bucket / finish. */
int eng_weights_reset(eng_engine *e, eng_wmodel which, const char *const *skip, int n_skip, uint64_t seed,
                      int *n_reset, char *err, size_t errlen, int *status);
/* 1 when name contains one of skip[0..n_skip) (SGLang's skip_tensor_list: substrings). */
int eng_weights_name_skipped(const char *name, const char *const *skip, int n_skip);
/* Disk transport: streams a checkpoint folder into the open session in buckets of about
 * bucket_bytes (names prefixed with `prefix`, e.g. "draft." for model "all"; NULL: none). A bad
 * tensor refuses its bucket; earlier buckets stay written (the caller aborts the session). */
int eng_weights_load_dir(eng_engine *e, const char *dir, const char *prefix, size_t bucket_bytes, char *err,
                         size_t errlen, int *status);

/* 0: stop admitting new sequences (a "wait" drain); 1: admit again. */
void eng_set_admission(eng_engine *e, int on);

/* Records the guard's reference (every plan-visible allocation and every parameter / derived
 * buffer's address, size and dtype). Called by the engine after capture. */
int eng_guard_record(eng_engine *e);
/* 0 when everything still matches; else -1 and a reason naming the buffer. */
int eng_guard_check(eng_engine *e, char *reason, size_t cap);

/* Calls fn(name, sha256-hex) for every parameter (stored layout) and derived buffer of the target
 * (draft = 0) or the drafter (draft = 1). Returns -1 when there is no drafter, -3 while the weights
 * are asleep (eng_sleep: their memory is released; nothing is read). */
int eng_weights_checksums(eng_engine *e, int draft, void (*fn)(const char *name, const char *hex, void *u), void *u);
/* The same by checkpoint (Hugging Face) tensor name, so a trainer can compare them with hashes of its
 * own tensors: for every checkpoint tensor the model accepts (q/k/v and gate/up rows of the fused
 * buffers separately; for tied embeddings lm_head.weight is not listed, it is
 * model.embed_tokens.weight), fn(name, hex) with hex = SHA-256 of the tensor's values converted to the
 * model's checkpoint dtype (config torch_dtype, *hash_dt; round to nearest even), laid out row-major,
 * little endian, i.e. the bytes of torch's t.to(torch_dtype).contiguous(). Then the derived buffers
 * under their own names, over their stored bytes (as eng_weights_checksums). Returns -1 when there is
 * no drafter, -2 out of memory, -3 while the weights are asleep. */
int eng_weights_checksums_ckpt(eng_engine *e, int draft, void (*fn)(const char *name, const char *hex, void *u),
                               void *u, mdl_dtype *hash_dt);

/* One checkpoint tensor as eng_weights_ckpt_visit hands it over. */
typedef struct {
    const char *name;  /* checkpoint (Hugging Face) name */
    mdl_dtype dtype;   /* the model's checkpoint dtype (config torch_dtype) */
    int ndim;          /* 1 or 2: the checkpoint's shape */
    int64_t shape[2];
    size_t nbytes;     /* numel * mdl_dtype_size(dtype) */
    const void *data;  /* the values converted to dtype, row-major, little endian (valid during the
                          call only); NULL when the visit is of the metadata only */
} eng_ckpt_tensor;
/* Visits every checkpoint tensor of the target (draft = 0) or the drafter (draft = 1): exactly the
 * tensors, names, order (by name) and bytes eng_weights_checksums_ckpt hashes (for tied embeddings
 * lm_head.weight is skipped; derived buffers are not visited: they have no checkpoint name).
 * with_data = 0 visits the metadata only (nothing is read; allowed while asleep). fn returns 0 to go
 * on, anything else to stop. Returns 0; -1 no drafter, -2 out of memory, -3 weights asleep
 * (with_data), -4 stopped by fn. Engine thread (it reads the weights). */
int eng_weights_ckpt_visit(eng_engine *e, int draft, int with_data, int (*fn)(const eng_ckpt_tensor *t, void *u),
                           void *u);

#endif
