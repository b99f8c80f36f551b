/* kernels/cpu/spec.c — the speculative-decoding ops: feature capture (KOP_COPY_COLS), draft token
 * choice with the DSpark Markov head (KOP_DRAFT_SELECT) and the DSpark confidence head
 * (KOP_CONFIDENCE). Contracts in kernels/kern.h.
 *
 * The Markov chain is sequential within a sequence (slot k's bias depends on slot k-1's choice), so
 * the unit of parallel work is the V-long bias update + argmax of one slot, split over V.
 * Dot products use the shared 16-lane scheme, so results are bitwise stable across ISAs. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/kern_cpu.h"

void kern_cpu_copy_cols(kern_pool *pool, const kern_op *op)
{
    (void)pool;
    const int H = op->p[0], stride = op->p[1], col0 = op->p[2];
    const int32_t n = kern_cpu_count(op, 2, op->p[3]);
    const float *x = op->buf[0].ptr;
    float *out = op->buf[1].ptr;
    for (int r = 0; r < n; r++)
        memcpy(out + (size_t)r * (size_t)stride + (size_t)col0, x + (size_t)r * (size_t)H, (size_t)H * sizeof(float));
}

/* Row `id` of a [V, r] weight as f32. */
static void load_row(const void *w, int dt, int r, int32_t id, float *out)
{
    if (dt == KERN_DT_BF16) {
        const uint16_t *b = (const uint16_t *)w + (size_t)id * (size_t)r;
        for (int i = 0; i < r; i++) out[i] = kern_bf16_to_f32(b[i]);
    } else {
        memcpy(out, (const float *)w + (size_t)id * (size_t)r, (size_t)r * sizeof(float));
    }
}


#define KERN_MAX_THREADS 256

/* One slot of one sequence: the Markov bias is added to every logit (split over V between the
 * threads: each logit's update is independent, so the split never changes a bit), each thread keeps
 * its best (value, lowest id), and the caller combines them in thread order. */
typedef struct {
    const kern_op *op;
    float *lg;             /* logits row of the slot */
    const float *z;        /* W1[prev] as f32 (NULL: no Markov head) */
    float best[KERN_MAX_THREADS];
    int32_t arg[KERN_MAX_THREADS];
} slot_task;

static void slot_task_fn(void *vctx, int tid, int nt)
{
    slot_task *t = vctx;
    const kern_op *op = t->op;
    const int V = op->p[1], r = op->p[2], dt = op->p[3];
    const kern_simd_ops *simd = kern_simd();
    float wrow[KERN_MAX_MARKOV_RANK];
    int64_t b, e;
    kern_split(V, tid, nt, 16, &b, &e);
    int32_t arg = -1;
    float best = 0;
    for (int64_t v = b; v < e; v++) {
        if (t->z) {
            load_row(op->buf[2].ptr, dt, r, (int32_t)v, wrow);
            t->lg[v] += simd->dot(wrow, t->z, r);
        }
        /* the rule of one sequential scan, whatever the split: a NaN logit 0 wins (nothing compares
         * greater), any other NaN is never chosen (a thread whose range starts with one must not stop
         * at it) */
        const float x = t->lg[v];
        if (v == 0 && x != x) {
            best = x;
            arg = 0;
        } else if (x == x && !(arg == 0 && best != best) && (arg < 0 || x > best)) {
            best = x;
            arg = (int32_t)v;
        }
    }
    t->best[tid] = best;
    t->arg[tid] = arg;
}

void kern_cpu_draft_select(kern_pool *pool, const kern_op *op)
{
    KERN_CHECK(op, op->p[2] <= KERN_MAX_MARKOV_RANK);
    const int W = op->p[0], V = op->p[1], r = op->p[2], dt = op->p[3];
    const int32_t n = kern_cpu_count(op, 5, op->p[4]);
    const int32_t *anchor = op->buf[3].ptr;
    int32_t *drafts = op->buf[4].ptr;
    const void *w1 = op->buf[1].ptr;
    const int nt = kern_pool_threads(pool) < KERN_MAX_THREADS ? kern_pool_threads(pool) : KERN_MAX_THREADS;
    float z[KERN_MAX_MARKOV_RANK];
    slot_task t = {.op = op};
    for (int32_t s = 0; s < n; s++) {
        int32_t prev = anchor[s];
        for (int k = 0; k < W; k++) { /* sequential: slot k's bias depends on slot k-1's choice */
            t.lg = (float *)op->buf[0].ptr + (size_t)(s * W + k) * (size_t)V;
            t.z = NULL;
            if (w1) {
                KERN_CHECK(op, prev >= 0 && prev < V);
                load_row(w1, dt, r, prev, z);
                t.z = z;
            }
            for (int i = 0; i < nt; i++) t.arg[i] = -1;
            kern_cpu_parallel(pool, slot_task_fn, &t, (size_t)V * (size_t)(r + 1));
            int32_t best = -1;
            float bv = 0;
            for (int i = 0; i < nt; i++) /* thread ranges ascend in v: first strict max = lowest id */
                if (t.arg[i] >= 0 && (best < 0 || t.best[i] > bv)) {
                    best = t.arg[i];
                    bv = t.best[i];
                }
            drafts[s * W + k] = best;
            prev = best;
        }
    }
}

void kern_cpu_confidence(kern_pool *pool, const kern_op *op)
{
    (void)pool;
    KERN_CHECK(op, op->p[2] <= KERN_MAX_MARKOV_RANK);
    const int W = op->p[0], H = op->p[1], r = op->p[2], dt = op->p[3], V = op->p[5];
    const int32_t n = kern_cpu_count(op, 7, op->p[4]);
    const float *h = op->buf[0].ptr;
    const void *w1 = op->buf[1].ptr;
    const int32_t *drafts = op->buf[2].ptr, *anchor = op->buf[3].ptr;
    const float *w = op->buf[4].ptr, *bias = op->buf[5].ptr;
    float *conf = op->buf[6].ptr;
    const kern_simd_ops *simd = kern_simd();
    float z[KERN_MAX_MARKOV_RANK];
    for (int s = 0; s < n; s++) {
        for (int k = 0; k < W; k++) {
            const int row = s * W + k;
            float a = simd->dot(w, h + (size_t)row * (size_t)H, H);
            if (w1) {
                int32_t prev = k == 0 ? anchor[s] : drafts[row - 1];
                KERN_CHECK(op, prev >= 0 && prev < V);
                load_row(w1, dt, r, prev, z);
                a += simd->dot(w + H, z, r);
            }
            a += bias[0];
            conf[row] = 1.0f / (1.0f + expf(-a));
        }
    }
}
