/* kernels/cpu/attention.c — KOP_KV_WRITE and KOP_ATTENTION over the paged KV cache.
 *
 * Cache layout (both k and v): [num_blocks, block_size, nkv, hd] f32; a sequence slot's position j
 * lives in block block_tables[slot * max_blocks + j / block_size] at offset j % block_size.
 * num_blocks is the cache buffer's extent divided by one block's bytes, and the number of slots is
 * the block table's extent divided by max_blocks: every block id, slot and position read from the
 * step parameters is checked against them before it is used as an address.
 */
#include "kernels/cpu/kern_cpu.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* ---- KOP_KV_WRITE: a few KB per row, done on the calling thread --------------------------------- */

void kern_cpu_kv_write(kern_pool *pool, const kern_op *op)
{
    (void)pool;
    const int32_t *p = op->p;
    const int nkv = p[0], hd = p[1], stride = p[2], k_off = p[3], v_off = p[4], bs = p[5],
              max_blocks = p[6], max_rows = p[7];
    const int32_t n = kern_cpu_count(op, 6, max_rows);
    const float *qkv = op->buf[0].ptr;
    float *kc = op->buf[1].ptr, *vc = op->buf[2].ptr;
    const int32_t *slot = op->buf[3].ptr, *pos = op->buf[4].ptr, *bt = op->buf[5].ptr;
    const size_t head = (size_t)nkv * (size_t)hd; /* floats per cached position */
    const int64_t num_blocks = (int64_t)(op->buf[1].bytes / ((size_t)bs * head * 4));
    const int64_t max_seqs = (int64_t)(op->buf[5].bytes / ((size_t)max_blocks * 4));
    for (int r = 0; r < n; r++) {
        if (slot[r] < 0) continue; /* masked padding row */
        KERN_CHECK(op, slot[r] < max_seqs);
        KERN_CHECK(op, pos[r] >= 0 && pos[r] / bs < max_blocks);
        int32_t blk = bt[(int64_t)slot[r] * max_blocks + pos[r] / bs];
        KERN_CHECK(op, blk >= 0 && blk < num_blocks);
        size_t dst = ((size_t)blk * (size_t)bs + (size_t)(pos[r] % bs)) * head;
        const float *row = qkv + (size_t)r * (size_t)stride;
        memcpy(kc + dst, row + k_off, head * sizeof(float));
        memcpy(vc + dst, row + v_off, head * sizeof(float));
    }
}

/* ---- KOP_ATTENTION ------------------------------------------------------------------------------
 * One (row, query head) pair at a time, one pass over its keys with an online softmax: keys come
 * in chunks of ATT_CHUNK positions (chunk boundaries at fixed multiples of ATT_CHUNK, so they
 * depend on nothing but kv_len); a chunk's scores are computed first, the running max m is raised
 * to the chunk max once (rescaling the running sum l and accumulator acc by exp(old m - new m)),
 * then each key adds p = exp(s - m) to l and p * V[j] to acc. out = acc / l. All in f32; the dot
 * products and axpys use the 16-lane scheme and exp is kern_expf, so results do not depend on the
 * ISA or the threads.
 * The dot products go through simd->dots4x4 (4 keys x 4 queries per reduction network), the
 * softmax steps of a tile's (up to 16) queries through simd->softmax16 (one query per lane, scores
 * stored key-major), and a chunk's axpys through simd->axpys (acc held in registers): bitwise the
 * per-query, per-key scalar loops, faster.
 */
#define ATT_CHUNK 32

typedef struct {
    const kern_op *op;
    const kern_simd_ops *simd;
    const float *q, *kc, *vc;
    float *out;
    const int32_t *slot, *kv_len, *bt;
    int nh, group, hd, q_stride, bs, max_blocks, n_rows;
    size_t head; /* floats per cached position: nkv * hd */
    int64_t num_blocks, max_seqs;
    float scale;
    atomic_int next; /* the next unclaimed query tile (attn_run) */
} attn_task;

/* One tile of queries: rows r0 .. r0+nr-1 (one sequence slot >= 0) times query heads hb ..
 * hb+nhq-1 (all reading one KV head), nr * nhq <= ATT_Q. Each query runs exactly the operations it
 * would run alone (the same chunks, in the same order, on its own m, l and acc); the tile only
 * shares work that gives the same bits: the chunk's key addresses, and the loads of its keys, which
 * feed 4 x 4 blocks of dot products (simd->dots4x4) instead of one dot product each. */
#define ATT_Q 16 /* = the 16 lanes of simd->softmax16 */
static void attn_tile(const attn_task *t, int r0, int nr, int hb, int nhq)
{
    const int hd = t->hd, nq = nr * nhq;
    const int32_t slot = t->slot[r0];
    KERN_CHECK(t->op, slot < t->max_seqs);
    int32_t Lmax = 0, L[ATT_Q];
    const float *qp[ATT_Q];
    for (int ri = 0; ri < nr; ri++) {
        const int32_t len = t->kv_len[r0 + ri];
        KERN_CHECK(t->op, len >= 0 && (int64_t)len <= (int64_t)t->max_blocks * t->bs);
        if (len > Lmax) Lmax = len;
        for (int hi = 0; hi < nhq; hi++) {
            L[ri * nhq + hi] = len;
            qp[ri * nhq + hi] = t->q + (size_t)(r0 + ri) * (size_t)t->q_stride + (size_t)(hb + hi) * (size_t)hd;
        }
    }
    const int32_t *table = t->bt + (int64_t)slot * t->max_blocks;
    const size_t kv_col = (size_t)(hb / t->group) * (size_t)hd;
    const kern_simd_ops *simd = t->simd;

    float acc[ATT_Q][KERN_MAX_HEAD_DIM];
    /* per query (lane q of simd->softmax16): running max, sum, this chunk's key count (as a
     * float), rescale factor; lanes past nq keep 0 keys */
    float m[ATT_Q], l[ATT_Q], cqf[ATT_Q], corr[ATT_Q], *accp[ATT_Q];
    for (int qi = 0; qi < ATT_Q; qi++) {
        if (qi < nq) memset(acc[qi], 0, (size_t)hd * sizeof(float));
        accp[qi] = acc[qi];
        m[qi] = -INFINITY;
        l[qi] = 0.0f;
        cqf[qi] = 0.0f;
    }
    /* S[i][q]: query q's score, then probability, of the chunk's key i; transposed so that the
     * softmax runs over 16 queries per vector. Entries no query reads are still initialized. */
    float S[ATT_CHUNK][ATT_Q];
    memset(S, 0, sizeof S);
    const float *krow[ATT_CHUNK], *vrow[ATT_CHUNK];
    for (int32_t j0 = 0; j0 < Lmax; j0 += ATT_CHUNK) {
        const int cmax = Lmax - j0 < ATT_CHUNK ? (int)(Lmax - j0) : ATT_CHUNK;
        /* the chunk's key addresses, one block-table lookup per cache block (no division per key) */
        for (int i = 0; i < cmax;) {
            const int32_t j = j0 + i, in_blk = j % t->bs;
            const int32_t blk = table[j / t->bs];
            KERN_CHECK(t->op, blk >= 0 && blk < t->num_blocks);
            const size_t at = ((size_t)blk * (size_t)t->bs + (size_t)in_blk) * t->head + kv_col;
            const int run = t->bs - in_blk < cmax - i ? t->bs - in_blk : cmax - i;
            for (int u = 0; u < run; u++, i++) {
                krow[i] = t->kc + at + (size_t)u * t->head;
                vrow[i] = t->vc + at + (size_t)u * t->head;
            }
        }
        /* scores: blocks of 4 keys x 4 queries (dot(k, q): the same bits as dot(q, k)); a block
         * whose keys lie past all its queries' lengths is skipped (scores past a query's length
         * are computed in partial blocks, never read) */
        for (int q0 = 0; q0 < nq; q0 += 4) {
            const int bq = nq - q0 < 4 ? nq - q0 : 4;
            int32_t lb = 0;
            for (int i = 0; i < bq; i++) lb = L[q0 + i] > lb ? L[q0 + i] : lb;
            for (int i0 = 0; i0 < cmax && j0 + i0 < lb; i0 += 4)
                simd->dots4x4(krow + i0, cmax - i0 < 4 ? cmax - i0 : 4, qp + q0, bq, hd, &S[i0][q0], ATT_Q);
        }
        /* each query's keys in this chunk, then the softmax step of all of them at once: scale,
         * raise m to the chunk max (rescaling l, and acc here), p = exp(s - m), l += p in key order */
        int cq[ATT_Q], cmaxq = 0;
        for (int qi = 0; qi < nq; qi++) {
            cq[qi] = L[qi] <= j0 ? 0 : L[qi] - j0 < ATT_CHUNK ? (int)(L[qi] - j0) : ATT_CHUNK;
            cqf[qi] = (float)cq[qi];
            if (cq[qi] > cmaxq) cmaxq = cq[qi];
        }
        simd->softmax16(&S[0][0], cmaxq, cqf, t->scale, m, l, corr);
        for (int qi = 0; qi < nq; qi++)
            if (corr[qi] != 1.0f) simd->scale(acc[qi], corr[qi], hd);
        /* acc += p V: 4 queries share each value row up to their shortest count, then each its own
         * rest (every query's chain still runs key by key in order) */
        for (int q0 = 0; q0 < nq; q0 += 4) {
            const int bq = nq - q0 < 4 ? nq - q0 : 4;
            int common = ATT_CHUNK;
            for (int qi = q0; qi < q0 + bq; qi++) common = cq[qi] < common ? cq[qi] : common;
            if (common > 0) simd->axpys(accp + q0, bq, &S[0][q0], ATT_Q, vrow, common, hd);
            for (int qi = q0; qi < q0 + bq; qi++)
                if (cq[qi] > common) simd->axpys(accp + qi, 1, &S[common][qi], ATT_Q, vrow + common, cq[qi] - common, hd);
        }
    }
    for (int qi = 0; qi < nq; qi++) {
        const int ri = qi / nhq, h = hb + qi % nhq;
        float *o = t->out + (size_t)(r0 + ri) * (size_t)t->nh * (size_t)hd + (size_t)h * (size_t)hd;
        if (L[qi] == 0) { /* no keys: define the empty softmax as zeros */
            memset(o, 0, (size_t)hd * sizeof(float));
            continue;
        }
        simd->div(o, acc[qi], l[qi], hd);
    }
}

/* Consecutive rows of one sequence form row tiles (up to ATT_Q / group rows, at least 1);
 * each row tile is cut into query tiles by KV head (and by ATT_Q when a group has more heads). Every
 * thread walks the same rows and finds the same tiles, numbered k = 0, 1, ...; a thread runs the
 * tile numbers it claims from a shared counter (in increasing order, so one walk finds them all).
 * Claimed one at a time, tiles balance themselves: in a causal prefill a row's keys grow with its
 * position, and on time-shared cores a thread may stall; fixed shares would wait for the slowest. */
static void attn_run(void *ctx, int tid, int nt)
{
    attn_task *t = ctx;
    (void)tid, (void)nt;
    int mine = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
    const int group = t->group, nkv = t->nh / t->group;
    const int rows_per = group < ATT_Q ? ATT_Q / group : 1;
    int k = 0;
    for (int r = 0; r < t->n_rows;) {
        int e = r + 1;
        while (e < t->n_rows && e - r < rows_per && t->slot[e] == t->slot[r]) e++;
        const int nr = e - r;
        if (t->slot[r] < 0) { /* masked padding rows */
            if (k++ == mine) {
                memset(t->out + (size_t)r * (size_t)t->nh * (size_t)t->hd, 0,
                       (size_t)nr * (size_t)t->nh * (size_t)t->hd * sizeof(float));
                mine = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
            }
        } else {
            const int per = ATT_Q / nr < group ? ATT_Q / nr : group; /* query heads per tile */
            for (int g = 0; g < nkv; g++)
                for (int hb = g * group; hb < (g + 1) * group; hb += per)
                    if (k++ == mine) {
                        attn_tile(t, r, nr, hb, (g + 1) * group - hb < per ? (g + 1) * group - hb : per);
                        mine = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
                    }
        }
        r = e;
    }
}

void kern_cpu_attention(kern_pool *pool, const kern_op *op)
{
    const int32_t *p = op->p;
    const int nh = p[0], nkv = p[1], hd = p[2], bs = p[4], max_blocks = p[5];
    const int32_t n = kern_cpu_count(op, 7, p[6]);
    if (n == 0) return;
    const size_t head = (size_t)nkv * (size_t)hd;
    attn_task t = {
        .op = op,
        .simd = kern_simd(),
        .q = op->buf[0].ptr,
        .kc = op->buf[1].ptr,
        .vc = op->buf[2].ptr,
        .out = op->buf[3].ptr,
        .slot = op->buf[4].ptr,
        .kv_len = op->buf[5].ptr,
        .bt = op->buf[6].ptr,
        .nh = nh,
        .group = nh / nkv,
        .hd = hd,
        .q_stride = p[3],
        .bs = bs,
        .max_blocks = max_blocks,
        .n_rows = n,
        .head = head,
        .num_blocks = (int64_t)(op->buf[1].bytes / ((size_t)bs * head * 4)),
        .max_seqs = (int64_t)(op->buf[6].bytes / ((size_t)max_blocks * 4)),
        .scale = op->f[0],
    };
    atomic_init(&t.next, 0);
    size_t keys = 0;
    for (int r = 0; r < n; r++)
        if (t.slot[r] >= 0 && t.kv_len[r] > 0) keys += (size_t)t.kv_len[r];
    kern_cpu_parallel(pool, attn_run, &t, keys * (size_t)nh * (size_t)hd * 2);
}
