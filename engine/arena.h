/* engine/arena.h — the allocation table of a pointer-stable arena, shared by every backend.
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

#include "engine/backend.h"

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

#ifdef __cplusplus
}
#endif

#endif
