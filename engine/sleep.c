/* engine/sleep.c — releasing memory for a colocated trainer, with stable addresses (engine.h).
 *
 * The semantics follow vLLM's sleep mode (vllm/device_allocator/cumem.py CuMemAllocator: memory is
 * allocated under a tag, "weights" or "kv_cache"; sleep(level 1) copies the weights to CPU memory
 * and unmaps every tagged allocation, level 2 unmaps without any copy; wake_up(tags) maps them
 * again at the same virtual addresses and copies the backup back, so CUDA graphs stay valid) and
 * SGLang's release_memory_occupation (torch_memory_saver: pause / resume by tag, the virtual
 * addresses kept). Here the physical memory is the backend's (mem_release / mem_restore): CPU pages
 * with MADV_DONTNEED, CUDA VMM granules with cuMemUnmap / cuMemRelease and cuMemCreate / cuMemMap.
 * Nothing a plan bakes moves: no plan is captured again, and the guard (I5) is checked at wake.
 *
 * Not in the step loop: everything here may allocate (range lists, the level 1 host backup). */
/* Per tag, e->sleep.asleep says which sleep (bit set: ASLEEP). eng_sleep / eng_wake run on the engine
 * thread (server/weights/memory_api.c, through an engine closure); tags 0 means both.
 *
 *   AWAKE --- eng_sleep(level, tags) ---> ASLEEP --- eng_wake(tags) ---> AWAKE
 *   (a tag already asleep at sleep, or awake at wake, is skipped)
 *
 *   tag              eng_sleep level 1             eng_sleep level 2      eng_wake
 *   ---------------  ----------------------------  ---------------------  ------------------------------
 *   weights          copied to host (w_backup, in  released, no copy      mem_restore at the same
 *   (ENG_MEM_        tag_ranges order), then                              addresses; level 1: backup
 *    WEIGHTS)        released                                             uploaded and freed; level 2:
 *                                                                         zero, INCONSISTENT (I8) until
 *                                                                         a complete full update
 *   kv_cache         released: contents lost       the same               zero; block tables re-uploaded
 *   (ENG_MEM_KV)
 *
 * Freed: the physical memory of the tag's allocations (backend mem_release). Kept: every address
 * (the reservation), so the plans, the guard's record, the parameter tables and block tables stay
 * valid (I1); the engine's host state. Lost either way: every running and waiting request (aborted
 * at sleep) and the prefix cache (flushed at sleep and at wake).
 * Refused: level not 1 or 2, an unknown tag (400); a backend without mem_release (501); UNDEFINED
 * weights (503); an open weight session (409). While a tag sleeps: eng_submit refuses (503); with
 * the weights asleep eng_weights_begin refuses (409) and checksums are not read.
 * Failures: a failed weights release, or a host backup that cannot be restored, leaves the weights
 * INCONSISTENT (lose_weights); once nothing sleeps, the guard is checked (UNDEFINED if it fails).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/arena.h"
#include "engine/engine_internal.h"

enum { GROUP_WEIGHTS = 0, GROUP_KV = 1 }; /* backend memory groups */

/* A tag's allocations (each listed once) and their total bytes */
typedef struct {
    eng_range_list l;
    size_t total;
} ranges;

static void ranges_add(ranges *r, void *p, size_t bytes)
{
    if (!p || !bytes) return;
    for (size_t i = 0; i < r->l.n; i++) /* (a tied or shared buffer is listed once) */
        if (r->l.ptr[i] == p) return;
    const size_t n0 = r->l.n;
    eng_range_list_add(&r->l, p, bytes);
    if (r->l.n > n0) r->total += bytes;
}

static void ranges_free(ranges *r)
{
    eng_range_list_free(&r->l);
    r->total = 0;
}

static void add_model(ranges *r, const mdl_model *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_params; i++) ranges_add(r, m->params[i].ptr, m->params[i].bytes);
    for (int i = 0; i < m->n_derived; i++) ranges_add(r, m->derived[i].ptr, m->derived[i].bytes);
    ranges_add(r, m->inv_freq, (size_t)(m->cfg.head_dim / 2) * sizeof(float));
}

/* The allocations of a tag, in a fixed order (the level 1 backup is laid out in it). */
static int tag_ranges(const eng_engine *e, unsigned tag, ranges *r)
{
    memset(r, 0, sizeof *r);
    if (tag == ENG_MEM_WEIGHTS) {
        add_model(r, e->m);
        add_model(r, e->draft);
    } else {
        for (int l = 0; l < e->m->cfg.layers; l++) {
            ranges_add(r, e->io.kcache[l], e->io.kv_layer_bytes);
            ranges_add(r, e->io.vcache[l], e->io.kv_layer_bytes);
        }
        if (e->draft && e->dio.kcache)
            for (int l = 0; l < e->draft->cfg.layers; l++) {
                ranges_add(r, e->dio.kcache[l], e->dio.kv_layer_bytes);
                ranges_add(r, e->dio.vcache[l], e->dio.kv_layer_bytes);
            }
    }
    return r->l.oom ? -1 : 0;
}

static int fail(char *err, size_t errlen, int *status, int st, const char *msg)
{
    snprintf(err, errlen, "%s", msg);
    *status = st;
    return -1;
}

unsigned eng_is_sleeping(const eng_engine *e) { return e->sleep.asleep; }

void eng_sleep_get_info(const eng_engine *e, eng_sleep_info *out) { *out = e->sleep; }

static void lose_weights(eng_engine *e, const char *why)
{
    if (e->winfo.state == ENG_W_UNDEFINED) return;
    e->winfo.state = ENG_W_INCONSISTENT;
    snprintf(e->winfo.reason, sizeof e->winfo.reason, "%s", why);
}

int eng_sleep(eng_engine *e, int level, unsigned tags, char *err, size_t errlen, int *status)
{
    eng_backend *be = e->be;
    *status = 200;
    if (tags == 0) tags = ENG_MEM_ALL;
    if (level != 1 && level != 2) return fail(err, errlen, status, 400, "level must be 1 or 2");
    if (tags & ~ENG_MEM_ALL) return fail(err, errlen, status, 400, "unknown memory tag");
    if (!be->ops->mem_release || !be->ops->mem_restore) {
        snprintf(err, errlen, "the %s backend cannot release memory", be->ops->name);
        *status = 501;
        return -1;
    }
    if (e->winfo.state == ENG_W_UNDEFINED) {
        snprintf(err, errlen, "weights are undefined (%s); restart the server", e->winfo.reason);
        *status = 503;
        return -1;
    }
    /* (a session's buckets must land in live memory, and its finish runs the hooks and the guard on
     * it: sleeping in the middle would lose writes) */
    if (e->winfo.session_open)
        return fail(err, errlen, status, 409, "a weight update session is open: finish or abort it before sleeping");
    tags &= ~e->sleep.asleep; /* already asleep: nothing to do */
    if (!tags) return 0;
    /* (waiting requests too: admit() does not look at sleep, they would run on released memory) */
    eng_abort_all(e); /* running and waiting requests end with "abort" */
    be->ops->synchronize(be);
    /* the KV cache's contents are gone (also when only the weights sleep: KV computed under them
     * is no use once they may come back different). I6: flushed before any release, so no block
     * cached before the sleep is matched after it, also when a release below fails half way */
    eng_kvpool_reset_cache(&e->kv);
    if (tags & ENG_MEM_WEIGHTS) {
        ranges r;
        if (tag_ranges(e, ENG_MEM_WEIGHTS, &r) != 0) {
            ranges_free(&r);
            return fail(err, errlen, status, 500, "out of host memory");
        }
        if (level == 1) {
            e->w_backup = malloc(r.total ? r.total : 1);
            if (!e->w_backup) {
                snprintf(err, errlen, "out of host memory for the level 1 weight backup (%zu bytes)", r.total);
                ranges_free(&r);
                *status = 500;
                return -1;
            }
            size_t off = 0;
            for (size_t i = 0; i < r.l.n; i++) {
                be->ops->download(be, e->w_backup + off, r.l.ptr[i], r.l.bytes[i]);
                off += r.l.bytes[i];
            }
            e->sleep.backup_bytes = r.total;
        }
        size_t rel = 0;
        /* I1: the physical pages go, the addresses stay reserved: no buffer moves, no plan is recaptured */
        if (be->ops->mem_release(be, GROUP_WEIGHTS, r.l.ptr, r.l.n, &rel, err, errlen) != 0) {
            /* some memory may already be gone: the weights are only good again after a full update */
            free(e->w_backup);
            e->w_backup = NULL;
            e->sleep.backup_bytes = 0;
            lose_weights(e, "releasing the weights' memory failed; a complete full weight update is needed");
            ranges_free(&r);
            *status = 500;
            return -1;
        }
        e->sleep.released[0] = rel;
        e->sleep.tag_bytes[0] = r.total;
        e->sleep.weights_level = level;
        e->sleep.asleep |= ENG_MEM_WEIGHTS;
        ranges_free(&r);
    }
    if (tags & ENG_MEM_KV) {
        ranges r;
        if (tag_ranges(e, ENG_MEM_KV, &r) != 0) {
            ranges_free(&r);
            return fail(err, errlen, status, 500, "out of host memory");
        }
        size_t rel = 0;
        int rc = be->ops->mem_release(be, GROUP_KV, r.l.ptr, r.l.n, &rel, err, errlen);
        e->sleep.tag_bytes[1] = r.total;
        ranges_free(&r);
        if (rc != 0) {
            *status = 500;
            return -1;
        }
        e->sleep.released[1] = rel;
        e->sleep.asleep |= ENG_MEM_KV;
    }
    e->sleep.sleeps++;
    return 0;
}

int eng_wake(eng_engine *e, unsigned tags, char *err, size_t errlen, int *status)
{
    eng_backend *be = e->be;
    *status = 200;
    if (tags == 0) tags = ENG_MEM_ALL;
    if (tags & ~ENG_MEM_ALL) return fail(err, errlen, status, 400, "unknown memory tag");
    tags &= e->sleep.asleep; /* awake already: nothing to do */
    if (!tags) return 0;
    if (tags & ENG_MEM_WEIGHTS) {
        if (be->ops->mem_restore(be, GROUP_WEIGHTS, err, errlen) != 0) {
            *status = 500;
            return -1;
        }
        e->sleep.asleep &= ~ENG_MEM_WEIGHTS;
        if (e->sleep.weights_level == 1 && e->w_backup) {
            ranges r;
            if (tag_ranges(e, ENG_MEM_WEIGHTS, &r) != 0) {
                ranges_free(&r);
                lose_weights(e, "out of host memory restoring the weights; a complete full weight update is needed");
                return fail(err, errlen, status, 500, "out of host memory");
            }
            size_t off = 0;
            for (size_t i = 0; i < r.l.n; i++) {
                be->ops->upload(be, r.l.ptr[i], e->w_backup + off, r.l.bytes[i]);
                off += r.l.bytes[i];
            }
            be->ops->synchronize(be); /* the uploads read the backup: done before it is freed */
            ranges_free(&r);
        } else {
            /* I8: the weights are zero pages now: refused (503 with the reason) until a full update */
            lose_weights(e, "the weights were discarded by sleep level 2 (or released by tag); a complete full "
                            "weight update (mode \"full\") is needed before generation");
        }
        free(e->w_backup);
        e->w_backup = NULL;
        e->sleep.backup_bytes = 0;
        e->sleep.weights_level = 0;
    }
    if (tags & ENG_MEM_KV) {
        if (be->ops->mem_restore(be, GROUP_KV, err, errlen) != 0) {
            *status = 500;
            return -1;
        }
        e->sleep.asleep &= ~ENG_MEM_KV;
        e->bt_dirty = 1; /* (block tables are step parameters: uploaded again before the next launch) */
    }
    eng_kvpool_reset_cache(&e->kv);
    e->sleep.wakes++;
    if (!e->sleep.asleep) {
        /* I5: every plan-visible buffer is where the plans baked it */
        char why[400];
        if (eng_guard_check(e, why, sizeof why) != 0) {
            e->winfo.state = ENG_W_UNDEFINED;
            snprintf(e->winfo.reason, sizeof e->winfo.reason, "%s", why);
            snprintf(err, errlen, "wake-up refused by the plan guard: %s; the server is now undefined", why);
            *status = 503;
            return -1;
        }
    }
    return 0;
}
