/* engine/kvpool.h — KV cache block pool with prefix caching (host-side bookkeeping only; the KV
 * memory itself is the engine's plan-visible cache).
 *
 * Every physical block is in exactly one state:
 *   free       ref 0, no hash           on the free stack
 *   cached     ref 0, hashed            on the LRU list (evictable, reusable by a matching prefix)
 *   in use     ref > 0 (hashed or not)  in some sequences' block tables
 * A hashed block holds a full, immutable block of tokens whose identity is the chain hash of
 * (parent chain hash, its tokens): two sequences share a block only when their whole prefixes up to
 * and including it are equal (tokens are compared exactly, not just hashed). Blocks are registered
 * once fully computed and are never written again while hashed. eng_kvpool_reset_cache forgets
 * every hash (weight updates: KV computed under old weights must never be reused, I6).
 */
#ifndef GS_ENG_KVPOOL_H
#define GS_ENG_KVPOOL_H

#include <stdint.h>

#define ENG_KV_ROOT_HASH 0x6a09e667f3bcc909ull

/* The parent chain hash of a sequence's first block: ENG_KV_ROOT_HASH unsalted (salt 0), else the
 * root mixed with the salt (vLLM mixes cache_salt into the first block's hash). Lookups compare the
 * parent exactly, so blocks under different salts are never shared. */
uint64_t eng_kvpool_root(uint64_t salt);

typedef struct {
    int num_blocks, block_size;
    int32_t *ref;
    uint64_t *hash, *parent;
    uint8_t *hashed;
    int32_t *tokens; /* [num_blocks * block_size], valid while hashed */
    int32_t *free_stack;
    int n_free;
    int32_t *lru_prev, *lru_next;
    int lru_head, lru_tail, n_lru;
    int32_t *bucket, *chain_next;
    int n_buckets;
} eng_kvpool;

int eng_kvpool_init(eng_kvpool *p, int num_blocks, int block_size);
void eng_kvpool_free(eng_kvpool *p);

static inline int eng_kvpool_available(const eng_kvpool *p) { return p->n_free + p->n_lru; }
static inline int eng_kvpool_in_use(const eng_kvpool *p) { return p->num_blocks - p->n_free - p->n_lru; }

/* A fresh block with ref 1 (evicting the least recently used cached block if no free one); -1 when
 * every block is in use. */
int32_t eng_kvpool_alloc(eng_kvpool *p);
/* ref--; at 0 a hashed block becomes cached (most recently used), others free. */
void eng_kvpool_release(eng_kvpool *p, int32_t block);
/* ref++ on a block found by lookup (leaves the LRU if it was cached). */
void eng_kvpool_acquire(eng_kvpool *p, int32_t block);

uint64_t eng_kvpool_hash(uint64_t parent, const int32_t *tokens, int block_size);
/* The hashed block holding exactly these tokens after this parent chain, or -1. */
int32_t eng_kvpool_lookup(const eng_kvpool *p, uint64_t parent, const int32_t *tokens);
/* Registers a fully computed in-use block. Returns its chain hash. A block whose content is already
 * cached elsewhere stays private (not registered). */
uint64_t eng_kvpool_register(eng_kvpool *p, int32_t block, uint64_t parent, const int32_t *tokens);
/* Forgets every hash: cached blocks become free; in-use blocks stay in use, unshared from now on. */
void eng_kvpool_reset_cache(eng_kvpool *p);

#endif
