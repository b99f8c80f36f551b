/* engine/backend/arena.h — the allocation table of a pointer-stable arena, shared by every backend.
 *
 * A backend reserves one region (host mmap, cudaMalloc) and hands it to the table, which gives out
 * ranges by bumping and records each as (ptr, bytes, tag, live). Ranges are never reused: retiring
 * one marks it dead and its addresses stay unassigned, so a stale baked pointer is always told apart
 * from a live one (checked replay, the update guard). Entries are sorted by address by construction,
 * so every lookup is a binary search. Host-side bookkeeping only: it never touches the region. */
#ifndef GS_ENG_ARENA_H
#define GS_ENG_ARENA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "engine/backend/backend.h"

typedef struct {
    uint8_t *ptr;
    size_t bytes;
    char tag[48];
    int live;
} eng_arena_entry;

typedef struct {
    uint8_t *base;
    size_t cap, used, live_bytes;
    eng_arena_entry *e;
    size_t n, cap_e;
} eng_arena;

void eng_arena_init(eng_arena *a, void *base, size_t cap);
void eng_arena_release(eng_arena *a); /* frees the table (not the region) */
/* A new range of bytes at `align` (a power of two); NULL when the region or host memory is full. */
void *eng_arena_take(eng_arena *a, size_t bytes, size_t align, const char *tag);
/* Retires the live range starting at ptr; its entry, or NULL when ptr starts no live range (a bug). */
const eng_arena_entry *eng_arena_retire(eng_arena *a, void *ptr);
int eng_arena_contains(const eng_arena *a, const void *ptr, size_t bytes);
int eng_arena_info(const eng_arena *a, const void *ptr, eng_alloc_info *out);
/* Sleep (eng_backend_ops.mem_release): the granule-aligned spans whose memory may be released when
 * the live ranges starting at ptrs[0..n) give up their contents: every granule (offsets from base,
 * which is granule-aligned) that overlaps one of them and no other live range (retired ranges and
 * alignment gaps never block). fn(span, bytes, u) is called for each maximal span in address order.
 * Duplicated pointers are fine. Returns 0, or -1 when some ptr starts no live range, -2 out of host
 * memory (fn not called). */
int eng_arena_release_spans(const eng_arena *a, void *const *ptrs, size_t n, size_t granule,
                            void (*fn)(uint8_t *span, size_t bytes, void *u), void *u);

/* A growable list of (pointer, bytes) ranges: the spans a sleeping group gave up (backends), the
 * allocations of a sleep tag (engine/sleep.c). */
typedef struct {
    void **ptr;
    size_t *bytes;
    size_t n, cap;
    int oom; /* an add ran out of host memory (that range was dropped) */
} eng_range_list;

void eng_range_list_add(eng_range_list *l, void *p, size_t bytes);
void eng_range_list_free(eng_range_list *l);
/* eng_arena_release_spans into out (emptied first): 0, -1 (some ptr starts no live range) or -2
 * (out of host memory). */
int eng_arena_collect_spans(const eng_arena *a, void *const *ptrs, size_t n, size_t granule, eng_range_list *out);

#ifdef __cplusplus
}
#endif

#endif
