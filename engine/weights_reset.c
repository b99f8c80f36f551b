/* engine/weights_reset.c — SGLang's weights_checker "reset_tensors": every checkpoint tensor of a
 * model overwritten with pseudo-random values, as one ordinary weight session (see weights.h).
 *
 * Why: a trainer (slime, miles) checks that its weight sync sends every tensor by taking a
 * snapshot, resetting the weights, pushing its update and comparing against the snapshot; a tensor
 * the update missed keeps its random values and the compare names it. SGLang's WeightChecker
 * (python/sglang/srt/utils/weight_checker.py, sgl-project/sglang 05bed317) fills each parameter with
 * torch.rand (uniform [0, 1) drawn in float32, then cast), skipping names that contain a pattern of
 * skip_tensor_list.
 *
 * How: the reset is written through the same session every transport uses (begin -> one bucket per
 * checkpoint tensor -> finish), so the destination rows, the post-load hook (derived buffers
 * refilled in place, I4), the plan guard (I5) and the version bookkeeping are the ones of a trainer's
 * update: nothing here writes a weight on its own. The session is partial (skipped names are not
 * written, so coverage does not apply); it is refused on INCONSISTENT weights as every partial one
 * is (I8). Running requests are aborted at begin: their next tokens would come from random weights.
 * The version string is kept (SGLang's reset does not change weight_version); the version number
 * goes up, so the prefix cache computed under the old weights is dropped (I6).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/weights.h"

/* splitmix64: a fixed stream per (seed, tensor index), so a reset is reproducible */
static uint64_t mix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int eng_weights_name_skipped(const char *name, const char *const *skip, int n_skip)
{
    for (int i = 0; i < n_skip; i++)
        if (skip[i][0] && strstr(name, skip[i])) return 1;
    return 0;
}

/* Writes model m's checkpoint tensors (names prefixed with `prefix`) one bucket each. */
static int reset_model(eng_engine *e, const mdl_model *m, const char *prefix, const char *const *skip, int n_skip,
                       uint64_t seed, int *n_written, char *err, size_t errlen, int *status)
{
    const mdl_dtype dt = m->cfg.dtype; /* the checkpoint's dtype: what a trainer sends */
    const size_t es = mdl_dtype_size(dt);
    float *f = NULL;
    uint8_t *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    char name[320];
    for (int k = 0; k < m->n_dests && rc == 0; k++) {
        const mdl_dest *d = &m->dests[k];
        /* tied embeddings: lm_head.weight is model.embed_tokens.weight (one storage, one name) */
        if (d->alias) continue; /* (and the fused expert tensors: their per-expert names are reset) */
        if (d->online_scale) continue; /* online FP8: computed from the reset weights */
        snprintf(name, sizeof name, "%s%s", prefix, d->name);
        if (eng_weights_name_skipped(name, skip, n_skip)) continue;
        const size_t n = (size_t)mdl_dest_ckpt_rows(d) * (size_t)(d->ndim == 2 ? d->cols : 1);
        if (n > cap) {
            free(f);
            free(buf);
            cap = n;
            f = malloc(n * sizeof *f);
            buf = malloc(n * es);
            if (!f || !buf) {
                snprintf(err, errlen, "out of memory resetting %s", name);
                *status = 500;
                rc = -1;
                break;
            }
        }
        uint64_t x = seed ^ ((uint64_t)(k + 1) * 0xD1B54A32D192ED03ull);
        for (size_t i = 0; i < n; i++) f[i] = (float)(mix64(&x) >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        if (mdl_convert(buf, dt, f, MDL_DT_F32, n) != 0) {
            snprintf(err, errlen, "cannot reset %s: its dtype %s has no conversion from F32", name,
                     mdl_dtype_name(dt));
            *status = 500;
            rc = -1;
            break;
        }
        mdl_st_tensor t = {.name = name, .dtype = dt, .ndim = d->ndim, .numel = n, .data = buf, .nbytes = n * es};
        t.shape[0] = mdl_dest_ckpt_rows(d);
        if (d->ndim == 2) t.shape[1] = d->cols;
        rc = eng_weights_bucket(e, &t, 1, "reset_tensors", err, errlen, status);
        if (rc == 0) (*n_written)++;
    }
    free(f);
    free(buf);
    return rc;
}

int eng_weights_reset(eng_engine *e, eng_wmodel which, const char *const *skip, int n_skip, uint64_t seed,
                      int *n_reset, char *err, size_t errlen, int *status)
{
    char version[128];
    snprintf(version, sizeof version, "%s", e->winfo.version);
    *n_reset = 0;
    if (eng_weights_begin(e, 0, which, ENG_PAUSE_ABORT, version, NULL, err, errlen, status) != 0) return -1;
    int rc = 0;
    if (which != ENG_WMODEL_DRAFT) rc = reset_model(e, e->m, "", skip, n_skip, seed, n_reset, err, errlen, status);
    if (rc == 0 && which != ENG_WMODEL_TARGET)
        rc = reset_model(e, e->draft, which == ENG_WMODEL_ALL ? "draft." : "", skip, n_skip, seed ^ 1, n_reset, err,
                         errlen, status);
    if (rc != 0) { /* I8: half reset is inconsistent; nothing written is what it was */
        int st2;
        char e2[64];
        eng_weights_abort(e, e2, sizeof e2, &st2);
        return -1;
    }
    return eng_weights_finish(e, version, err, errlen, status);
}
