#include "engine/kvpool.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

int eng_kvpool_init(eng_kvpool *p, int nb, int bs)
{
    memset(p, 0, sizeof *p);
    p->num_blocks = nb;
    p->block_size = bs;
    p->n_buckets = 1;
    while (p->n_buckets < 2 * nb) p->n_buckets *= 2;
    p->ref = calloc((size_t)nb, sizeof *p->ref);
    p->hash = calloc((size_t)nb, sizeof *p->hash);
    p->parent = calloc((size_t)nb, sizeof *p->parent);
    p->hashed = calloc((size_t)nb, 1);
    p->tokens = calloc((size_t)nb * (size_t)bs, sizeof *p->tokens);
    p->free_stack = malloc((size_t)nb * sizeof *p->free_stack);
    p->lru_prev = malloc((size_t)nb * sizeof *p->lru_prev);
    p->lru_next = malloc((size_t)nb * sizeof *p->lru_next);
    p->chain_next = malloc((size_t)nb * sizeof *p->chain_next);
    p->bucket = malloc((size_t)p->n_buckets * sizeof *p->bucket);
    if (!p->ref || !p->hash || !p->parent || !p->hashed || !p->tokens || !p->free_stack || !p->lru_prev ||
        !p->lru_next || !p->chain_next || !p->bucket) {
        eng_kvpool_free(p);
        return -1;
    }
    for (int b = 0; b < nb; b++) p->free_stack[b] = nb - 1 - b; /* lowest ids first */
    p->n_free = nb;
    for (int i = 0; i < p->n_buckets; i++) p->bucket[i] = -1;
    p->lru_head = p->lru_tail = -1;
    return 0;
}

void eng_kvpool_free(eng_kvpool *p)
{
    free(p->ref);
    free(p->hash);
    free(p->parent);
    free(p->hashed);
    free(p->tokens);
    free(p->free_stack);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->chain_next);
    free(p->bucket);
    memset(p, 0, sizeof *p);
}

uint64_t eng_kvpool_hash(uint64_t parent, const int32_t *tokens, int bs)
{
    uint64_t h = parent ^ 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < bs; i++) { /* splitmix-style mixing per token */
        h ^= (uint64_t)(uint32_t)tokens[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
        h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
        h ^= h >> 31;
    }
    return h;
}

uint64_t eng_kvpool_root(uint64_t salt)
{
    if (!salt) return ENG_KV_ROOT_HASH;
    uint64_t h = ENG_KV_ROOT_HASH ^ (salt + 0x9E3779B97F4A7C15ull);
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    return h == ENG_KV_ROOT_HASH ? h + 1 : h;
}

static void lru_remove(eng_kvpool *p, int32_t b)
{
    int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0) p->lru_next[pr] = nx;
    else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pr;
    else p->lru_tail = pr;
    p->n_lru--;
}

static void lru_push_tail(eng_kvpool *p, int32_t b)
{
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

static void unhash(eng_kvpool *p, int32_t b)
{
    int32_t *link = &p->bucket[p->hash[b] & (uint64_t)(p->n_buckets - 1)];
    while (*link != b) {
        assert(*link >= 0);
        link = &p->chain_next[*link];
    }
    *link = p->chain_next[b];
    p->hashed[b] = 0;
}

int32_t eng_kvpool_alloc(eng_kvpool *p)
{
    int32_t b;
    if (p->n_free > 0) {
        b = p->free_stack[--p->n_free];
    } else if (p->n_lru > 0) {
        b = p->lru_head; /* evict the least recently used cached block */
        lru_remove(p, b);
        unhash(p, b);
    } else {
        return -1;
    }
    p->ref[b] = 1;
    return b;
}

void eng_kvpool_release(eng_kvpool *p, int32_t b)
{
    assert(p->ref[b] > 0);
    if (--p->ref[b] > 0) return;
    if (p->hashed[b]) lru_push_tail(p, b);
    else p->free_stack[p->n_free++] = b;
}

void eng_kvpool_acquire(eng_kvpool *p, int32_t b)
{
    assert(p->hashed[b]);
    if (p->ref[b]++ == 0) lru_remove(p, b);
}

int32_t eng_kvpool_lookup(const eng_kvpool *p, uint64_t parent, const int32_t *tokens)
{
    const int bs = p->block_size;
    uint64_t h = eng_kvpool_hash(parent, tokens, bs);
    for (int32_t b = p->bucket[h & (uint64_t)(p->n_buckets - 1)]; b >= 0; b = p->chain_next[b])
        if (p->hash[b] == h && p->parent[b] == parent &&
            memcmp(p->tokens + (size_t)b * (size_t)bs, tokens, (size_t)bs * sizeof *tokens) == 0)
            return b;
    return -1;
}

uint64_t eng_kvpool_register(eng_kvpool *p, int32_t b, uint64_t parent, const int32_t *tokens)
{
    const int bs = p->block_size;
    uint64_t h = eng_kvpool_hash(parent, tokens, bs);
    assert(p->ref[b] > 0 && !p->hashed[b]);
    if (eng_kvpool_lookup(p, parent, tokens) >= 0) return h; /* same content cached elsewhere */
    p->hash[b] = h;
    p->parent[b] = parent;
    memcpy(p->tokens + (size_t)b * (size_t)bs, tokens, (size_t)bs * sizeof *tokens);
    p->hashed[b] = 1;
    int32_t *head = &p->bucket[h & (uint64_t)(p->n_buckets - 1)];
    p->chain_next[b] = *head;
    *head = b;
    return h;
}

/* I6: called at every finish that wrote weights (engine/weights.c), at sleep and wake (sleep.c) and
 * by eng_reset_prefix_cache (an explicit flush): idle cached blocks go back to the free list and
 * blocks in use are unhashed, so no lookup can match KV computed before (a running sequence keeps
 * using its own blocks). */
void eng_kvpool_reset_cache(eng_kvpool *p)
{
    while (p->n_lru > 0) {
        int32_t b = p->lru_head;
        lru_remove(p, b);
        p->hashed[b] = 0;
        p->free_stack[p->n_free++] = b;
    }
    for (int b = 0; b < p->num_blocks; b++) p->hashed[b] = 0; /* in-use blocks: unshared from now */
    for (int i = 0; i < p->n_buckets; i++) p->bucket[i] = -1;
}
