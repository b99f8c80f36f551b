/* engine/arena.c — see arena.h. */
#include "engine/arena.h"

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
