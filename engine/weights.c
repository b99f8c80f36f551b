/* engine/weights.c — weight-update sessions, the plan guard and checksums (see weights.h). */
/* Weight sessions: the state machine of e->winfo.state (eng_wstate) and session_open, driven on the
 * engine thread by the server's command runner (server/weights/weights_api.c srv_cmds_run: BEGIN,
 * BUCKET, FINISH, ABORT, LOAD, the GPU transports' commands) and by its session timeout
 * (srv_weights_expire, which calls eng_weights_abort). The cold load before eng_create is not a
 * session of this file: it is one mdl_session of models/model.c.
 *
 *   state (at the call)  begin                      bucket / validate / load_dir   finish / abort
 *   -------------------  -------------------------  -----------------------------  ---------------
 *   READY                full or partial: UPDATING  409 (no session)               409
 *   UPDATING             409 (one at a time)        validated whole, then written  see below
 *   INCONSISTENT         full only: UPDATING        409                            409
 *                        (partial: 409, I8)
 *   UNDEFINED            503, for good (I5)         409                            409
 *   begin also refuses: weights asleep (409, sleep.c), a drafter model without one (400).
 *   A bucket: every tensor of both models (model "all": names "draft." go to the drafter) is
 *   validated before the first byte is written; a refused bucket (400) changes nothing, the session
 *   stays open. "Written" (mdl_session.wrote) is what decides the failure states below.
 *
 *   finish (UPDATING)
 *     1. coverage, full mode (I3): a slot unset -> 422; wrote anything ? INCONSISTENT (I8)
 *        : back to the state at begin (prev_state_ok)
 *     2. hooks: each model the session wrote runs its post-load hook once (I4); derived buffers are
 *        refilled in place (models/model.c model_post_load); an untouched model is not re-processed
 *     3. guard (I5): a plan-visible buffer freed, moved, resized or retyped -> UNDEFINED, 503
 *     4. wrote anything: version_num++, version string = finish's, else begin's, else the number;
 *        prefix cache dropped; "recompute" slots re-prefill, the others never register (I6)
 *        nothing written: only a version given at finish renames the current version
 *     5. -> READY (also from INCONSISTENT: such a session is full and passed coverage)
 *   abort (UPDATING): wrote anything ? INCONSISTENT (I8) : back to the state at begin
 *   A session always ends at finish or abort (end_sessions), whatever the outcome.
 *
 * Pause modes (eng_pause), chosen at begin: "abort" ends the running requests at begin (queued ones
 * stay queued); "wait" is done by the caller before begin (weights_api.c run_cmd: admission off,
 * step until nothing runs or --drain-timeout, then abort the rest); "keep" and "recompute" leave the
 * sequences frozen in their slots (eng_step does nothing while UPDATING, I7), to go on with their KV
 * ("keep": tokens after the update report the new version too) or to recompute it ("recompute").
 * The server maps the frameworks' words onto these: SGLang's abort_all_requests -> abort, else wait;
 * SGLang's /pause_generation retract and in_place -> keep; vLLM's /pause abort | wait | keep.
 */
#include "engine/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_internal.h"
#include "engine/sha256.h"

/* One plan-visible buffer as recorded at capture. */
typedef struct eng_guard_entry {
    const void *ptr;
    size_t bytes;
    int dtype;        /* mdl_dtype of a parameter / derived buffer, -1 for other allocations */
    const void *owner; /* the mdl_param it was recorded from (NULL for other allocations) */
    char tag[64]; /* a parameter name (mdl_param.name, 64) or an allocation tag */
} eng_guard_entry;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

const char *eng_wstate_name(eng_wstate s)
{
    static const char *const n[] = {"ready", "updating", "inconsistent", "undefined"};
    return n[s];
}

int eng_pause_parse(const char *s, eng_pause *out)
{
    static const char *const n[] = {"wait", "abort", "keep", "recompute"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, n[i]) == 0) {
            *out = (eng_pause)i;
            return 0;
        }
    return -1;
}

int eng_wmodel_parse(const char *s, eng_wmodel *out)
{
    static const char *const n[] = {"target", "draft", "all"};
    for (int i = 0; i < 3; i++)
        if (strcmp(s, n[i]) == 0) {
            *out = (eng_wmodel)i;
            return 0;
        }
    return -1;
}

void eng_set_admission(eng_engine *e, int on) { e->admission_off = !on; }

/* ---- guard (I5) ------------------------------------------------------------------------------- */

static int guard_add(eng_engine *e, int *cap, const void *ptr, size_t bytes, int dtype, const void *owner,
                     const char *tag)
{
    /* (a buffer many ops bake is recorded once; a parameter is kept apart from the allocation it
     * lives in, so both its table entry and its allocation are checked) */
    for (int i = 0; i < e->n_guard; i++)
        if (e->guard[i].ptr == ptr && e->guard[i].owner == owner) return 0;
    if (e->n_guard == *cap) {
        *cap = *cap ? *cap * 2 : 256;
        eng_guard_entry *g = realloc(e->guard, (size_t)*cap * sizeof *g);
        if (!g) return -1;
        e->guard = g;
    }
    eng_guard_entry *g = &e->guard[e->n_guard++];
    g->ptr = ptr;
    g->bytes = bytes;
    g->dtype = dtype;
    g->owner = owner;
    /* a diagnostic label: a longer parameter name is cut, on purpose (no snprintf: -O3 warns) */
    size_t tn = strnlen(tag, sizeof g->tag - 1);
    memcpy(g->tag, tag, tn);
    g->tag[tn] = 0;
    return 0;
}

static int guard_tape(eng_engine *e, int *cap, const eng_tape *t)
{
    for (size_t i = 0; i < t->n; i++)
        for (int b = 0; b < KERN_MAX_BUFS; b++) {
            const void *p = t->ops[i].buf[b].ptr;
            eng_alloc_info info;
            if (!p || e->be->ops->alloc_info(e->be, p, &info) != 0) continue;
            if (guard_add(e, cap, info.ptr, info.bytes, -1, NULL, info.tag) != 0) return -1;
        }
    return 0;
}

static int guard_model(eng_engine *e, int *cap, const mdl_model *m)
{
    for (int i = 0; i < m->n_params; i++)
        if (guard_add(e, cap, m->params[i].ptr, m->params[i].bytes, m->params[i].dt, &m->params[i],
                      m->params[i].name) != 0)
            return -1;
    for (int i = 0; i < m->n_derived; i++)
        if (guard_add(e, cap, m->derived[i].ptr, m->derived[i].bytes, m->derived[i].dt, &m->derived[i],
                      m->derived[i].name) != 0)
            return -1;
    return 0;
}

int eng_guard_record(eng_engine *e)
{
    int cap = 0;
    e->n_guard = 0;
    /* every allocation any plan bakes: re-emit the captured tapes (emission is deterministic) */
    for (int b = 0; b < e->n_buckets; b++) {
        int rows = e->bucket_rows[b], lr = e->draft ? rows : (rows < e->cfg.max_seqs ? rows : e->cfg.max_seqs);
        eng_tape_reset(&e->tape);
        mdl_emit_forward(e->m, &e->ws, &e->io, rows, lr, &e->tape);
        if (guard_tape(e, &cap, &e->tape) != 0) return -1;
        if (e->draft) {
            eng_tape_reset(&e->dtape);
            mdl_emit_draft_context(e->draft, &e->dws, &e->ws, &e->io, &e->dio, rows, &e->dtape);
            if (guard_tape(e, &cap, &e->dtape) != 0) return -1;
        }
    }
    for (int b = 0; b < e->n_draft_buckets; b++) {
        eng_tape_reset(&e->dtape);
        mdl_emit_draft_block(e->draft, e->m, &e->dws, &e->io, &e->dio, e->draft_bucket_seqs[b] * e->spec_B,
                             &e->dtape);
        if (guard_tape(e, &cap, &e->dtape) != 0) return -1;
    }
    /* and the parameter / derived tables themselves (address, size, dtype) */
    if (guard_model(e, &cap, e->m) != 0) return -1;
    if (e->draft && guard_model(e, &cap, e->draft) != 0) return -1;
    return 0;
}

int eng_guard_check(eng_engine *e, char *reason, size_t cap)
{
    for (int i = 0; i < e->n_guard; i++) {
        const eng_guard_entry *g = &e->guard[i];
        eng_alloc_info info;
        /* I5 / I1: the allocation a plan baked is still live, starts where it did and has its size
         * (the arena never hands a retired range out again, so a freed one stays detectable) */
        if (e->be->ops->alloc_info(e->be, g->ptr, &info) != 0 || !info.live || info.ptr != g->ptr ||
            info.bytes != g->bytes) {
            snprintf(reason, cap, "plan-visible buffer %s at %p (%zu bytes) was freed or resized after capture",
                     g->tag, g->ptr, g->bytes);
            return -1;
        }
        /* I5: a parameter or derived buffer still points at that allocation with its dtype (a hook
         * that swapped in a new buffer changes p->ptr even when the old one stays live) */
        if (g->owner) {
            const mdl_param *p = g->owner;
            if (p->ptr != g->ptr || p->bytes != g->bytes || (int)p->dt != g->dtype) {
                snprintf(reason, cap,
                         "plan-visible buffer %s moved from %p (%zu bytes, %s) to %p (%zu bytes, %s) after capture",
                         g->tag, g->ptr, g->bytes, mdl_dtype_name((mdl_dtype)g->dtype), p->ptr, p->bytes,
                         mdl_dtype_name(p->dt));
                return -1;
            }
        }
    }
    return 0;
}

/* ---- sessions ---------------------------------------------------------------------------------- */

static void end_sessions(eng_engine *e)
{
    if (e->ws_has_target) mdl_session_end(&e->ws_target);
    if (e->ws_has_draft) mdl_session_end(&e->ws_draft);
    e->ws_has_target = e->ws_has_draft = 0;
    e->winfo.session_open = 0;
}

static int wrote_any(const eng_engine *e)
{
    return (e->ws_has_target && e->ws_target.wrote) || (e->ws_has_draft && e->ws_draft.wrote);
}

int eng_weights_begin(eng_engine *e, int full, eng_wmodel which, eng_pause pause, const char *version,
                      uint64_t *session_id, char *err, size_t errlen, int *status)
{
    eng_weights_info *w = &e->winfo;
    /* I5: fail closed for good: plans may point at freed memory, so nothing may write into it */
    if (w->state == ENG_W_UNDEFINED) {
        snprintf(err, errlen, "weights are undefined (%s); restart the server", w->reason);
        *status = 503;
        return -1;
    }
    /* I1: their pages are released (sleep.c): a write would fault (unmapped device memory) or be
     * undone by the level 1 backup at wake */
    if (e->sleep.asleep & ENG_MEM_WEIGHTS) {
        snprintf(err, errlen,
                 "the weights are asleep (their memory is released): wake them first (POST /wake_up?tags=weights "
                 "or /resume_memory_occupation {\"tags\": [\"weights\"]})");
        *status = 409;
        return -1;
    }
    if (w->session_open) {
        snprintf(err, errlen, "a weight update session is already open (state %s)", eng_wstate_name(w->state));
        *status = 409;
        return -1;
    }
    /* A partial update writes only some tensors, so it cannot make inconsistent weights whole
     * again: finishing it would answer 200 while generation stays refused. Refuse it up front,
     * before anything is written (I8: only a complete full update repairs). */
    if (!full && w->state == ENG_W_INCONSISTENT) {
        snprintf(err, errlen,
                 "the weights are inconsistent (%s): a partial update cannot repair them; send a complete "
                 "full update (mode \"full\")",
                 w->reason);
        *status = 409;
        return -1;
    }
    if (which != ENG_WMODEL_TARGET && !e->draft) {
        snprintf(err, errlen, "model \"%s\": this server has no drafter", which == ENG_WMODEL_DRAFT ? "draft" : "all");
        *status = 400;
        return -1;
    }
    mdl_load_mode mode = full ? MDL_LOAD_FULL : MDL_LOAD_PARTIAL;
    if (which != ENG_WMODEL_DRAFT) {
        if (mdl_session_begin(&e->ws_target, e->m, mode, err, errlen) != 0) goto oom;
        e->ws_has_target = 1;
    }
    if (which != ENG_WMODEL_TARGET) {
        if (mdl_session_begin(&e->ws_draft, e->draft, mode, err, errlen) != 0) goto oom;
        e->ws_has_draft = 1;
    }
    /* I7: from here on no step runs until finish or abort (eng_step returns while UPDATING); "abort"
     * ends what runs, the other modes leave it frozen in its slot */
    if (pause == ENG_PAUSE_ABORT) /* running requests end now; waiting ones stay queued */
        for (int s = 0; s < e->cfg.max_seqs; s++)
            if (e->seqs[s].req) eng_finish_seq(e, s, ENG_FINISH_ABORT);
    e->ws_which = which;
    e->ws_pause = pause;
    e->ws_full = full;
    e->ws_t0 = now_ms();
    w->prev_state_ok = w->state == ENG_W_READY;
    w->state = ENG_W_UPDATING;
    w->session_open = 1;
    w->session_id++;
    if (version && *version) snprintf(w->pending_version, sizeof w->pending_version, "%s", version);
    else w->pending_version[0] = 0;
    if (session_id) *session_id = w->session_id;
    return 0;
oom:
    end_sessions(e);
    *status = 500;
    return -1;
}

static int out_of_order(eng_engine *e, const char *what, char *err, size_t errlen, int *status)
{
    snprintf(err, errlen, "%s without an open weight update session (state %s)", what,
             eng_wstate_name(e->winfo.state));
    *status = 409;
    return -1;
}

/* write: 0 validate only, 1 host source, 2 device source */
static int bucket_impl(eng_engine *e, const mdl_st_tensor *t, size_t n, const char *what, int write, char *err,
                       size_t errlen, int *status)
{
    /* I7: weights are written only inside a session, i.e. while no step runs */
    if (!e->winfo.session_open) return out_of_order(e, "bucket", err, errlen, status);
    *status = 400;
    /* model "all": drafter tensors carry the prefix "draft."; split the bucket by model */
    mdl_st_tensor *tt = NULL, *dt = NULL;
    size_t nt = 0, nd = 0;
    int rc = -1;
    const mdl_st_tensor *ta = NULL, *da = NULL;
    size_t na = 0, ndd = 0;
    if (e->ws_which == ENG_WMODEL_TARGET) {
        ta = t;
        na = n;
    } else if (e->ws_which == ENG_WMODEL_DRAFT) {
        da = t;
        ndd = n;
    } else {
        tt = calloc(n ? n : 1, sizeof *tt);
        dt = calloc(n ? n : 1, sizeof *dt);
        if (!tt || !dt) {
            snprintf(err, errlen, "out of memory");
            *status = 500;
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            if (strncmp(t[i].name, "draft.", 6) == 0) {
                dt[nd] = t[i];
                dt[nd++].name = t[i].name + 6;
            } else {
                tt[nt++] = t[i];
            }
        }
        ta = tt;
        na = nt;
        da = dt;
        ndd = nd;
    }
    /* FP8 models take device-memory tensors (NCCL, CUDA IPC on a GPU backend) not yet: their value
     * checks (NaN codes, scale range) and online quantization read the tensor bytes on the host */
    if (write == 2 && !e->be->ops->host_memory &&
        ((ta && na && e->m->cfg.fp8) || (da && ndd && e->draft && e->draft->cfg.fp8))) {
        snprintf(err, errlen,
                 "%s: an FP8 model takes weights from host memory only (HTTP buckets, disk, --weights-from); "
                 "GPU transports (NCCL, CUDA IPC) into it are not implemented",
                 what);
        *status = 501;
        goto out;
    }
    /* bad input leaves the weights unharmed (DESIGN's error tiers): a refused bucket writes nothing,
     * so it cannot by itself make the weights INCONSISTENT */
    /* validate every tensor of both models before the first byte is written */
    if (ta && mdl_session_validate(&e->ws_target, ta, na, what, err, errlen) != 0) goto out;
    if (da && mdl_session_validate(&e->ws_draft, da, ndd, what, err, errlen) != 0) goto out;
    if (write == 1) {
        if (ta) mdl_session_write(&e->ws_target, ta, na);
        if (da) mdl_session_write(&e->ws_draft, da, ndd);
    } else if (write == 2) {
        if (ta) mdl_session_write_device(&e->ws_target, ta, na);
        if (da) mdl_session_write_device(&e->ws_draft, da, ndd);
    }
    rc = 0;
out:
    free(tt);
    free(dt);
    return rc;
}

int eng_weights_bucket(eng_engine *e, const mdl_st_tensor *t, size_t n, const char *what, char *err,
                       size_t errlen, int *status)
{
    return bucket_impl(e, t, n, what, 1, err, errlen, status);
}

int eng_weights_bucket_device(eng_engine *e, const mdl_st_tensor *t, size_t n, const char *what, char *err,
                              size_t errlen, int *status)
{
    return bucket_impl(e, t, n, what, 2, err, errlen, status);
}

int eng_weights_validate(eng_engine *e, const mdl_st_tensor *t, size_t n, const char *what, char *err,
                         size_t errlen, int *status)
{
    return bucket_impl(e, t, n, what, 0, err, errlen, status);
}

static void fail_inconsistent(eng_engine *e, const char *why)
{
    eng_weights_info *w = &e->winfo;
    w->state = ENG_W_INCONSISTENT;
    snprintf(w->reason, sizeof w->reason, "%s", why);
    w->updates_failed++;
    end_sessions(e);
}

int eng_weights_finish(eng_engine *e, const char *version, char *err, size_t errlen, int *status)
{
    eng_weights_info *w = &e->winfo;
    if (!w->session_open) return out_of_order(e, "finish", err, errlen, status);
    /* I3 / I4: a full session finishes only when every destination part of every model in it arrived
     * in this session (mdl_session.covered), before any hook runs; either mode, online FP8 codes come
     * with their scales (mdl_session_check) */
    {
        char miss[400];
        const char *who = NULL;
        int bad = 0;
        if (e->ws_has_target && (bad = mdl_session_check(&e->ws_target, miss, sizeof miss)) != 0) who = "";
        else if (e->ws_has_draft && (bad = mdl_session_check(&e->ws_draft, miss, sizeof miss)) != 0)
            who = "drafter: ";
        if (who) {
            const char *what = bad == MDL_CHECK_COVERAGE ? "incomplete full update" : "FP8 codes and scales";
            snprintf(err, errlen, "%s: %s%s", what, who, miss);
            /* I8: some weights are new, some old: refused until a complete full update */
            if (wrote_any(e)) {
                fail_inconsistent(e, err);
            } else { /* nothing was written: the weights are what they were */
                end_sessions(e);
                w->state = w->prev_state_ok ? ENG_W_READY : ENG_W_INCONSISTENT;
                w->updates_failed++;
            }
            *status = 422;
            return -1;
        }
    }
    /* one hook per touched model (I4); untouched models are not re-processed */
    double th = now_ms();
    uint64_t t0 = e->m->hook_runs, d0 = e->draft ? e->draft->hook_runs : 0;
    if (e->ws_has_target) mdl_session_run_hook(&e->ws_target);
    if (e->ws_has_draft) mdl_session_run_hook(&e->ws_draft);
    e->be->ops->synchronize(e->be);
    double tg = now_ms();
    w->hook_runs_target += e->m->hook_runs - t0;
    if (e->draft) w->hook_runs_draft += e->draft->hook_runs - d0;
    /* the guard (I5): nothing a plan reads may have moved */
    char why[400];
    if (eng_guard_check(e, why, sizeof why) != 0) {
        w->state = ENG_W_UNDEFINED;
        snprintf(w->reason, sizeof w->reason, "%s", why);
        w->updates_failed++;
        end_sessions(e);
        snprintf(err, errlen, "update refused by the plan guard: %s; the server is now undefined", why);
        *status = 503;
        return -1;
    }
    double tend = now_ms();
    /* stats of this update */
    w->tensors = (e->ws_has_target ? e->ws_target.tensors : 0) + (e->ws_has_draft ? e->ws_draft.tensors : 0);
    w->bytes = (e->ws_has_target ? e->ws_target.bytes : 0) + (e->ws_has_draft ? e->ws_draft.bytes : 0);
    w->buckets = e->ws_has_target ? e->ws_target.buckets : e->ws_draft.buckets;
    w->hook_ms = tg - th;
    w->guard_ms = tend - tg;
    w->ms = tend - e->ws_t0;
    int wrote = wrote_any(e);
    end_sessions(e);
    if (wrote) { /* a new version: KV computed under older weights is never reused (I6) */
        w->version_num++;
        const char *v = version && *version ? version : w->pending_version;
        if (*v) snprintf(w->version, sizeof w->version, "%s", v);
        else snprintf(w->version, sizeof w->version, "%llu", (unsigned long long)w->version_num);
        /* I6: no cached prefix block computed under the old weights can be matched again */
        eng_kvpool_reset_cache(&e->kv);
        for (int s = 0; s < e->cfg.max_seqs; s++) {
            eng_seq *q = &e->seqs[s];
            if (!q->req) continue;
            if (e->ws_pause == ENG_PAUSE_RECOMPUTE) {
                q->n_computed = 0; /* every known token is prefilled again under the new weights */
                q->n_hashed = 0;
                q->chain = eng_kvpool_root(q->req->cache_salt);
            } else {
                /* "keep": its later blocks attend to KV of the old weights, so they must never be
                 * shared (a new request with the same prefix could otherwise match them) */
                q->no_register = 1;
            }
        }
    } else if (version && *version) {
        snprintf(w->version, sizeof w->version, "%s", version);
    }
    /* a complete full update repairs an inconsistent model. Invariant: a session that began on
     * inconsistent weights is a full one (begin refuses partial ones), so every success ends READY */
    w->state = ENG_W_READY;
    w->reason[0] = 0;
    w->updates_ok++;
    return 0;
}

int eng_weights_abort(eng_engine *e, char *err, size_t errlen, int *status)
{
    eng_weights_info *w = &e->winfo;
    if (!w->session_open) return out_of_order(e, "abort", err, errlen, status);
    /* I8: an abort after writes leaves the weights mixed: INCONSISTENT until a complete full update */
    if (wrote_any(e)) {
        char why[256];
        uint64_t n = (e->ws_has_target ? e->ws_target.tensors : 0) + (e->ws_has_draft ? e->ws_draft.tensors : 0);
        snprintf(why, sizeof why, "an update was aborted after %llu tensors were written; a complete full update is needed",
                 (unsigned long long)n);
        fail_inconsistent(e, why);
    } else {
        end_sessions(e);
        w->state = w->prev_state_ok ? ENG_W_READY : ENG_W_INCONSISTENT;
    }
    return 0;
}

void eng_weights_get_info(const eng_engine *e, eng_weights_info *out) { *out = e->winfo; }

eng_wstate eng_weights_state(const eng_engine *e) { return e->winfo.state; }

void eng_weights_set_version(eng_engine *e, const char *version)
{
    snprintf(e->winfo.version, sizeof e->winfo.version, "%s", version);
}

/* Downloads p's stored bytes (its layout and dtype) into *buf, grown as needed, and reports their
 * sha256 to fn. 0, or -1 out of host memory. */
static int hash_stored(eng_backend *be, const mdl_param *p, uint8_t **buf, size_t *cap,
                       void (*fn)(const char *name, const char *hex, void *u), void *u)
{
    if (p->bytes > *cap) {
        uint8_t *nb = realloc(*buf, p->bytes);
        if (!nb) return -1;
        *buf = nb;
        *cap = p->bytes;
    }
    be->ops->download(be, *buf, p->ptr, p->bytes);
    be->ops->synchronize(be);
    char hex[65];
    eng_sha256_hex(*buf, p->bytes, hex);
    fn(p->name, hex, u);
    return 0;
}

int eng_weights_checksums(eng_engine *e, int draft, void (*fn)(const char *name, const char *hex, void *u), void *u)
{
    const mdl_model *m = draft ? e->draft : e->m;
    if (!m) return -1;
    if (e->sleep.asleep & ENG_MEM_WEIGHTS) return -3; /* released memory must not be read */
    size_t cap = 0;
    uint8_t *buf = NULL;
    int rc = 0;
    for (int k = 0; k < m->n_params + m->n_derived && rc == 0; k++)
        rc = hash_stored(e->be, k < m->n_params ? &m->params[k] : &m->derived[k - m->n_params], &buf, &cap, fn, u);
    free(buf);
    return rc;
}

/* Checkpoint tensors (see weights.h), shared by the checkpoint-name checksums and the export
 * (server/weights/pull.c). Each checkpoint tensor is a contiguous row range [row0, row0 + rows) x
 * cols of its destination (row-major), so its bytes are downloaded as one run, converted from the
 * storage dtype to the checkpoint's torch_dtype (round to nearest even; exact whenever the value
 * came from a tensor of that dtype) and handed to fn. The two buffers are grown, never per tensor
 * reallocated when the next one fits. */
int eng_weights_ckpt_visit(eng_engine *e, int draft, int with_data, int (*fn)(const eng_ckpt_tensor *t, void *u),
                           void *u)
{
    const mdl_model *m = draft ? e->draft : e->m;
    if (!m) return -1;
    if (with_data && (e->sleep.asleep & ENG_MEM_WEIGHTS)) return -3; /* released memory must not be read */
    const mdl_dtype hd = m->cfg.dtype;
    eng_backend *be = e->be;
    size_t cap = 0, ccap = 0;
    uint8_t *buf = NULL, *cbuf = NULL;
    int rc = 0;
    for (int k = 0; k < m->n_dests && rc == 0; k++) {
        const mdl_dest *d = &m->dests[k];
        /* tied embeddings: lm_head.weight is an alias of model.embed_tokens.weight (the same
         * storage), not a checkpoint tensor of its own (the same rule as coverage) */
        if (d->alias) continue; /* (the fused expert tensors likewise: reported per expert) */
        const mdl_param *p = &m->params[d->param];
        /* a per-tensor FP8 scale is its shard's one value (every row of the shard holds it) */
        const size_t n = (size_t)mdl_dest_ckpt_rows(d) * (size_t)p->cols, es = mdl_dtype_size(p->dt);
        /* FP8 weights and their scales as the checkpoint stores them (F8_E4M3; the scales in the dtype
         * they arrived in) */
        const mdl_dtype td = p->dt == MDL_DT_F8_E4M3 ? p->dt : p->is_scale ? p->ckpt_dt : hd;
        eng_ckpt_tensor t = {.name = d->name, .dtype = td, .ndim = d->ndim, .nbytes = n * mdl_dtype_size(td)};
        t.shape[0] = mdl_dest_ckpt_rows(d);
        t.shape[1] = d->ndim == 2 ? d->cols : 0;
        if (with_data) {
            if (n * es > cap || t.nbytes > ccap) {
                free(buf);
                free(cbuf);
                cap = n * es;
                ccap = t.nbytes;
                buf = malloc(cap ? cap : 1);
                cbuf = malloc(ccap ? ccap : 1);
                if (!buf || !cbuf) {
                    rc = -2;
                    break;
                }
            }
            be->ops->download(be, buf, (const uint8_t *)p->ptr + (size_t)d->row0 * (size_t)p->cols * es, n * es);
            be->ops->synchronize(be);
            t.data = buf;
            if (p->dt != td) {
                if (mdl_convert(cbuf, td, buf, p->dt, n) != 0) {
                    rc = -2;
                    break;
                }
                t.data = cbuf;
            }
        }
        if (fn(&t, u) != 0) rc = -4;
    }
    free(buf);
    free(cbuf);
    return rc;
}

typedef struct {
    void (*fn)(const char *name, const char *hex, void *u);
    void *u;
} hash_ctx;

static int hash_ckpt(const eng_ckpt_tensor *t, void *u)
{
    const hash_ctx *h = u;
    char hex[65];
    eng_sha256_hex(t->data, t->nbytes, hex);
    h->fn(t->name, hex, h->u);
    return 0;
}

/* Checkpoint-name checksums (see weights.h): SHA-256 of each tensor eng_weights_ckpt_visit hands
 * over, then the derived buffers over their stored bytes. */
int eng_weights_checksums_ckpt(eng_engine *e, int draft, void (*fn)(const char *name, const char *hex, void *u),
                               void *u, mdl_dtype *hash_dt)
{
    const mdl_model *m = draft ? e->draft : e->m;
    if (!m) return -1;
    if (e->sleep.asleep & ENG_MEM_WEIGHTS) return -3; /* released memory must not be read */
    if (hash_dt) *hash_dt = m->cfg.dtype;
    hash_ctx h = {fn, u};
    int rc = eng_weights_ckpt_visit(e, draft, 1, hash_ckpt, &h);
    if (rc != 0) return rc;
    /* derived buffers have no checkpoint name: their own entry, over their stored bytes */
    size_t cap = 0;
    uint8_t *buf = NULL;
    for (int k = 0; k < m->n_derived && rc == 0; k++)
        if (hash_stored(e->be, &m->derived[k], &buf, &cap, fn, u) != 0) rc = -2;
    free(buf);
    return rc;
}

/* ---- disk transport ------------------------------------------------------------------------------ */

typedef struct {
    eng_engine *e;
    const char *prefix;
    int status;
} disk_ctx;

static int disk_bucket(const mdl_st_tensor *t, size_t n, const char *what, void *user, char *err, size_t errlen)
{
    disk_ctx *c = user;
    if (!c->prefix) return eng_weights_bucket(c->e, t, n, what, err, errlen, &c->status);
    /* model "all": the drafter's folder is pushed with the "draft." prefix */
    mdl_st_tensor *v = calloc(n ? n : 1, sizeof *v);
    char (*names)[256] = calloc(n ? n : 1, 256);
    int rc = -1;
    if (v && names) {
        for (size_t i = 0; i < n; i++) {
            v[i] = t[i];
            snprintf(names[i], 256, "%s%s", c->prefix, t[i].name);
            v[i].name = names[i];
        }
        rc = eng_weights_bucket(c->e, v, n, what, err, errlen, &c->status);
    } else {
        snprintf(err, errlen, "out of memory");
        c->status = 500;
    }
    free(v);
    free(names);
    return rc;
}

int eng_weights_load_dir(eng_engine *e, const char *dir, const char *prefix, size_t bucket_bytes, char *err,
                         size_t errlen, int *status)
{
    if (!e->winfo.session_open) return out_of_order(e, "load", err, errlen, status);
    disk_ctx c = {e, prefix, 400};
    if (mdl_ckpt_foreach_bucket(dir, bucket_bytes, disk_bucket, &c, err, errlen) != 0) {
        *status = c.status;
        return -1;
    }
    return 0;
}
