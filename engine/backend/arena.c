/* engine/backend/arena.c — see arena.h. */
#include "engine/backend/arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void eng_arena_init(eng_arena *a, void *base, size_t cap)
{
    memset(a, 0, sizeof *a);
    a->base = base;
    a->cap = cap;
}

void eng_arena_release(eng_arena *a)
{
    free(a->e);
    a->e = NULL;
    a->n = a->cap_e = 0;
}

void *eng_arena_take(eng_arena *a, size_t bytes, size_t align, const char *tag)
{
    /* I1: a bump allocator: ranges are handed out once, in address order, never reused after a
     * retire, so an address always names the same allocation (and find() can bsearch the entries) */
    size_t off = (a->used + align - 1) & ~(align - 1);
    if (bytes == 0) bytes = 1;
    if (off > a->cap || bytes > a->cap - off) return NULL;
    if (a->n == a->cap_e) {
        size_t ncap = a->cap_e ? a->cap_e * 2 : 256;
        eng_arena_entry *ne = realloc(a->e, ncap * sizeof *ne);
        if (!ne) return NULL;
        a->e = ne;
        a->cap_e = ncap;
    }
    eng_arena_entry *x = &a->e[a->n++];
    x->ptr = a->base + off;
    x->bytes = bytes;
    snprintf(x->tag, sizeof x->tag, "%s", tag ? tag : "");
    x->live = 1;
    a->used = off + bytes;
    a->live_bytes += bytes;
    return x->ptr;
}

/* Index of the entry whose range starts at or before p, or -1. */
static long find(const eng_arena *a, const void *p)
{
    const uint8_t *q = p;
    long lo = 0, hi = (long)a->n - 1, best = -1;
    while (lo <= hi) {
        long mid = lo + (hi - lo) / 2;
        if (a->e[mid].ptr <= q) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

const eng_arena_entry *eng_arena_retire(eng_arena *a, void *ptr)
{
    long i = find(a, ptr);
    if (i < 0 || a->e[i].ptr != ptr || !a->e[i].live) return NULL;
    a->e[i].live = 0;
    a->live_bytes -= a->e[i].bytes;
    return &a->e[i];
}

int eng_arena_contains(const eng_arena *a, const void *ptr, size_t bytes)
{
    long i = find(a, ptr);
    if (i < 0) return 0;
    const eng_arena_entry *x = &a->e[i];
    size_t off = (size_t)((const uint8_t *)ptr - x->ptr);
    return x->live && off <= x->bytes && bytes <= x->bytes - off;
}

int eng_arena_info(const eng_arena *a, const void *ptr, eng_alloc_info *out)
{
    long i = find(a, ptr);
    if (i < 0) return -1;
    const eng_arena_entry *x = &a->e[i];
    if ((const uint8_t *)ptr >= x->ptr + x->bytes) return -1;
    out->ptr = x->ptr;
    out->bytes = x->bytes;
    out->tag = x->tag;
    out->live = x->live;
    return 0;
}

int eng_arena_release_spans(const eng_arena *a, void *const *ptrs, size_t n, size_t granule,
                            void (*fn)(uint8_t *span, size_t bytes, void *u), void *u)
{
    if (a->n == 0) return n ? -1 : 0;
    unsigned char *in = calloc(a->n, 1);
    size_t *next_lo = malloc(a->n * sizeof *next_lo); /* first granule of the next blocker after i */
    if (!in || !next_lo) {
        free(in);
        free(next_lo);
        return -2;
    }
    for (size_t k = 0; k < n; k++) {
        long i = find(a, ptrs[k]);
        if (i < 0 || a->e[i].ptr != (const uint8_t *)ptrs[k] || !a->e[i].live) {
            free(in);
            free(next_lo);
            return -1;
        }
        in[i] = 1;
    }
    const size_t G = granule;
    size_t lo_next = SIZE_MAX;
    for (size_t i = a->n; i-- > 0;) {
        next_lo[i] = lo_next;
        if (a->e[i].live && !in[i]) lo_next = (size_t)(a->e[i].ptr - a->base) / G;
    }
    /* the granule the bump pointer is in may still be handed out (a later alloc): it blocks */
    const size_t tail = a->used / G;
    size_t blk_hi = 0, cur_lo = 0, cur_hi = 0; /* blk_hi: end granule of the last blocker seen */
    int have = 0;
    for (size_t i = 0; i < a->n; i++) {
        const eng_arena_entry *x = &a->e[i];
        const size_t off = (size_t)(x->ptr - a->base);
        if (x->live && !in[i]) {
            blk_hi = (off + x->bytes + G - 1) / G;
            continue;
        }
        if (!in[i]) continue;
        size_t lo = off / G, hi = (off + x->bytes + G - 1) / G;
        if (lo < blk_hi) lo = blk_hi;
        if (hi > next_lo[i]) hi = next_lo[i];
        if (hi > tail) hi = tail;
        if (lo >= hi) continue;
        if (have && lo <= cur_hi) {
            if (hi > cur_hi) cur_hi = hi;
            continue;
        }
        if (have) fn(a->base + cur_lo * G, (cur_hi - cur_lo) * G, u);
        cur_lo = lo;
        cur_hi = hi;
        have = 1;
    }
    if (have) fn(a->base + cur_lo * G, (cur_hi - cur_lo) * G, u);
    free(in);
    free(next_lo);
    return 0;
}

void eng_range_list_add(eng_range_list *l, void *p, size_t bytes)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 64;
        void **np = realloc(l->ptr, nc * sizeof *np);
        if (np) l->ptr = np;
        size_t *nb = realloc(l->bytes, nc * sizeof *nb);
        if (nb) l->bytes = nb;
        if (!np || !nb) {
            l->oom = 1;
            return;
        }
        l->cap = nc;
    }
    l->ptr[l->n] = p;
    l->bytes[l->n++] = bytes;
}

void eng_range_list_free(eng_range_list *l)
{
    free(l->ptr);
    free(l->bytes);
    memset(l, 0, sizeof *l);
}

static void add_span(uint8_t *span, size_t bytes, void *u) { eng_range_list_add(u, span, bytes); }

int eng_arena_collect_spans(const eng_arena *a, void *const *ptrs, size_t n, size_t granule, eng_range_list *out)
{
    out->n = 0;
    out->oom = 0;
    int rc = eng_arena_release_spans(a, ptrs, n, granule, add_span, out);
    if (rc == 0 && out->oom) rc = -2;
    if (rc != 0) out->n = 0;
    return rc;
}
