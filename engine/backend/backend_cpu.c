/* engine/backend/backend_cpu.c — the CPU backend: the reference implementation of the backend contract.
 *
 * Arena: one anonymous mapping reserved up front (MAP_NORESERVE: untouched pages cost nothing),
 * handed out by the shared allocation table (engine/backend/arena.h): ranges are never reused, so a stale
 * baked pointer can always be told apart from a live one.
 *
 * Sleep (mem_release / mem_restore): MADV_DONTNEED on the whole pages of the released allocations
 * gives their memory back (RSS drops) while the mapping, and so every baked address, stays.
 *
 * Plans: a deep copy of the tape. Replay runs the copied ops in order with their baked pointers —
 * the same semantics as a CUDA graph. In checked mode every pointer of every op is verified against
 * the live allocations before the op runs; a violation aborts naming the op and the pointer.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine/backend/arena.h"
#include "engine/backend/backend.h"

/* The page spans one sleeping group gave up (mem_release), to restore them. */
typedef struct {
    int released;
    eng_range_list spans;
} cpu_group;

typedef struct {
    eng_arena arena;
    void *region;
    size_t region_bytes;
    kern_pool *pool;
    cpu_group groups[ENG_MEM_GROUPS];
} cpu_impl;

struct eng_plan {
    kern_op *ops;
    size_t n;
};

static cpu_impl *impl_of(eng_backend *be) { return (cpu_impl *)be->impl; }

static void *cpu_alloc_fn(eng_backend *be, size_t bytes, const char *tag)
{
    /* fresh pages of an anonymous mapping are zero */
    return eng_arena_take(&impl_of(be)->arena, bytes, bytes >= (1u << 20) ? 4096 : 64, tag);
}

static void cpu_free_fn(eng_backend *be, void *ptr)
{
    if (!ptr) return;
    const eng_arena_entry *x = eng_arena_retire(&impl_of(be)->arena, ptr);
    if (!x) {
        fprintf(stderr, "graphswap: bug: free of %p which is not a live arena allocation\n", ptr);
        abort();
    }
    /* I1 / I5: a freed range is never reused, so a plan still baking it points at a retired entry
     * (the guard's alloc_info sees !live; checked replay aborts) instead of at someone else's buffer */
    /* give the pages back but keep the range reserved: it is never handed out again */
    size_t pg = 4096;
    uintptr_t b = ((uintptr_t)x->ptr + pg - 1) & ~(uintptr_t)(pg - 1);
    uintptr_t e = ((uintptr_t)x->ptr + x->bytes) & ~(uintptr_t)(pg - 1);
    if (e > b) madvise((void *)b, e - b, MADV_DONTNEED);
}

static int cpu_contains(eng_backend *be, const void *ptr, size_t bytes)
{
    return eng_arena_contains(&impl_of(be)->arena, ptr, bytes);
}

static int cpu_alloc_info(eng_backend *be, const void *ptr, eng_alloc_info *out)
{
    return eng_arena_info(&impl_of(be)->arena, ptr, out);
}

static size_t cpu_bytes_in_use(eng_backend *be) { return impl_of(be)->arena.live_bytes; }

static void cpu_memcpy(eng_backend *be, void *dst, const void *src, size_t n)
{
    (void)be;
    if (n) memcpy(dst, src, n);
}

static int cpu_upload_convert(eng_backend *be, void *dst, mdl_dtype dst_dt, const void *src,
                              mdl_dtype src_dt, size_t n)
{
    (void)be;
    return mdl_convert(dst, dst_dt, src, src_dt, n);
}

static void cpu_check_op(eng_backend *be, const kern_op *op, size_t index)
{
    for (int b = 0; b < KERN_MAX_BUFS; b++) {
        const kern_buf *kb = &op->buf[b];
        if (!kb->ptr) continue;
        /* I1 (--checked): every baked pointer must lie inside one live allocation before the op runs */
        if (!cpu_contains(be, kb->ptr, kb->bytes)) {
            eng_alloc_info info;
            const char *why = "outside every arena allocation";
            if (cpu_alloc_info(be, kb->ptr, &info) == 0)
                why = info.live ? "overruns its allocation" : "points into a retired (freed) allocation";
            fprintf(stderr,
                    "graphswap: checked replay: op %zu (%s) buffer %d pointer %p (+%zu bytes) %s\n",
                    index, kern_op_name(op->kind), b, kb->ptr, kb->bytes, why);
            abort();
        }
    }
}

static void cpu_exec_ops(eng_backend *be, const kern_op *ops, size_t n)
{
    cpu_impl *c = impl_of(be);
    for (size_t i = 0; i < n; i++) {
        if (be->checked) cpu_check_op(be, &ops[i], i);
        kern_cpu_exec(c->pool, &ops[i]);
    }
}

static void cpu_run(eng_backend *be, const eng_tape *tape)
{
    assert(!tape->overflow);
    cpu_exec_ops(be, tape->ops, tape->n);
}

static eng_plan *cpu_plan_create(eng_backend *be, const eng_tape *tape)
{
    (void)be;
    assert(!tape->overflow);
    eng_plan *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->ops = malloc((tape->n ? tape->n : 1) * sizeof *p->ops);
    if (!p->ops) {
        free(p);
        return NULL;
    }
    memcpy(p->ops, tape->ops, tape->n * sizeof *p->ops);
    p->n = tape->n;
    return p;
}

static void cpu_plan_launch(eng_backend *be, eng_plan *plan) { cpu_exec_ops(be, plan->ops, plan->n); }

static void cpu_plan_free(eng_backend *be, eng_plan *plan)
{
    (void)be;
    if (!plan) return;
    free(plan->ops);
    free(plan);
}

static void cpu_synchronize(eng_backend *be) { (void)be; }

/* ---- sleep: MADV_DONTNEED on whole pages, the mapping (and so every address) stays --------------- */

#define CPU_PAGE ((size_t)4096)

static int cpu_mem_release(eng_backend *be, int group, void *const *ptrs, size_t n, size_t *released, char *err,
                           size_t errlen)
{
    cpu_impl *c = impl_of(be);
    *released = 0;
    if (group < 0 || group >= ENG_MEM_GROUPS || c->groups[group].released) {
        snprintf(err, errlen, "memory group %d is already released", group);
        return -1;
    }
    cpu_group *g = &c->groups[group];
    const int rc = eng_arena_collect_spans(&c->arena, ptrs, n, CPU_PAGE, &g->spans);
    if (rc != 0) {
        snprintf(err, errlen, rc == -1 ? "release of a pointer that starts no live arena allocation"
                                       : "out of host memory");
        return -1;
    }
    const eng_range_list *sp = &g->spans;
    for (size_t i = 0; i < sp->n; i++) {
        /* private anonymous pages: the next touch maps a zero page (what mem_restore promises) */
        if (madvise(sp->ptr[i], sp->bytes[i], MADV_DONTNEED) != 0) {
            snprintf(err, errlen, "madvise(MADV_DONTNEED) of %zu bytes at %p failed", sp->bytes[i], sp->ptr[i]);
            return -1; /* (the pages released so far are zero: the caller treats the group as lost) */
        }
        /* checked mode: a stray read or write of released memory faults at once, as it would on
         * unmapped device memory, instead of silently paging zeros back in */
        if (be->checked) (void)mprotect(sp->ptr[i], sp->bytes[i], PROT_NONE);
        *released += sp->bytes[i];
    }
    g->released = 1;
    return 0;
}

static int cpu_mem_restore(eng_backend *be, int group, char *err, size_t errlen)
{
    cpu_impl *c = impl_of(be);
    if (group < 0 || group >= ENG_MEM_GROUPS || !c->groups[group].released) {
        snprintf(err, errlen, "memory group %d is not released", group);
        return -1;
    }
    cpu_group *g = &c->groups[group];
    const eng_range_list *sp = &g->spans;
    for (size_t i = 0; i < sp->n; i++)
        if (be->checked && mprotect(sp->ptr[i], sp->bytes[i], PROT_READ | PROT_WRITE) != 0) {
            snprintf(err, errlen, "mprotect of %zu bytes at %p failed", sp->bytes[i], sp->ptr[i]);
            return -1;
        }
    g->released = 0;
    g->spans.n = 0;
    return 0;
}

static void cpu_destroy(eng_backend *be)
{
    cpu_impl *c = impl_of(be);
    if (c) {
        kern_pool_destroy(c->pool);
        if (c->region) munmap(c->region, c->region_bytes);
        eng_arena_release(&c->arena);
        for (int i = 0; i < ENG_MEM_GROUPS; i++) eng_range_list_free(&c->groups[i].spans);
        free(c);
    }
    free(be);
}

static const eng_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = 1,
    .alloc = cpu_alloc_fn,
    .free = cpu_free_fn,
    .contains = cpu_contains,
    .alloc_info = cpu_alloc_info,
    .bytes_in_use = cpu_bytes_in_use,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .upload_convert = cpu_upload_convert,
    .device_convert = cpu_upload_convert, /* host memory is the device */
    .run = cpu_run,
    .plan_create = cpu_plan_create,
    .plan_launch = cpu_plan_launch,
    .plan_free = cpu_plan_free,
    .synchronize = cpu_synchronize,
    .destroy = cpu_destroy,
    .mem_release = cpu_mem_release,
    .mem_restore = cpu_mem_restore,
};

eng_backend *eng_backend_cpu_create(const eng_backend_config *cfg, char *err, size_t errlen)
{
    eng_backend *be = calloc(1, sizeof *be);
    cpu_impl *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        snprintf(err, errlen, "out of memory creating the CPU backend");
        return NULL;
    }
    be->ops = &cpu_ops;
    be->impl = c;
    be->checked = cfg->checked;
    size_t cap = (cfg->arena_bytes + 4095) & ~(size_t)4095;
    void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot reserve %zu bytes for the CPU arena", cap);
        cpu_destroy(be);
        return NULL;
    }
    c->region = m;
    c->region_bytes = cap;
    eng_arena_init(&c->arena, m, cap);
#ifdef MADV_HUGEPAGE
    madvise(m, cap, MADV_HUGEPAGE); /* fewer TLB misses when streaming weights */
#endif
    c->pool = kern_pool_create(cfg->threads);
    if (!c->pool) {
        snprintf(err, errlen, "cannot start %d CPU worker threads", cfg->threads);
        cpu_destroy(be);
        return NULL;
    }
    kern_pool_set_bf16_activations(c->pool, cfg->bf16_activations);
    return be;
}
