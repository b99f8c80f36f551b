/* kernels/cpu/spec.c — the speculative-decoding ops: feature capture (KOP_COPY_COLS), draft token
 * choice with the DSpark Markov head (KOP_DRAFT_SELECT) and the DSpark confidence head
 * (KOP_CONFIDENCE). Contracts in kernels/kern.h.
 *
 * The Markov chain is sequential within a sequence (slot k's bias depends on slot k-1's choice), so
 * sequences are the unit of parallel work; the V-long bias update of one slot is a GEMV over W2 and
 * is split across nothing (V*r multiply-adds per slot, small next to the lm_head GEMM before it).
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

#define KERN_MAX_MARKOV_RANK 4096

typedef struct {
    const kern_op *op;
    int32_t n;
} spec_task;

static void draft_select_task(void *vctx, int tid, int nt)
{
    const spec_task *t = vctx;
    const kern_op *op = t->op;
    const int W = op->p[0], V = op->p[1], r = op->p[2], dt = op->p[3];
    float *logits = op->buf[0].ptr;
    const void *w1 = op->buf[1].ptr, *w2 = op->buf[2].ptr;
    const int32_t *anchor = op->buf[3].ptr;
    int32_t *drafts = op->buf[4].ptr;
    const kern_simd_ops *simd = kern_simd();
    float z[KERN_MAX_MARKOV_RANK], wrow[KERN_MAX_MARKOV_RANK];
    int64_t b, e;
    kern_split(t->n, tid, nt, 1, &b, &e);
    for (int64_t s = b; s < e; s++) {
        int32_t prev = anchor[s];
        for (int k = 0; k < W; k++) {
            float *lg = logits + (size_t)(s * W + k) * (size_t)V;
            if (w1) {
                KERN_CHECK(op, prev >= 0 && prev < V);
                load_row(w1, dt, r, prev, z);
                for (int v = 0; v < V; v++) {
                    load_row(w2, dt, r, v, wrow);
                    lg[v] += simd->dot(wrow, z, r);
                }
            }
            int32_t best = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[best]) best = v;
            drafts[s * W + k] = best;
            prev = best;
        }
    }
}

void kern_cpu_draft_select(kern_pool *pool, const kern_op *op)
{
    KERN_CHECK(op, op->p[2] <= KERN_MAX_MARKOV_RANK);
    spec_task t = {op, kern_cpu_count(op, 5, op->p[4])};
    size_t work = (size_t)t.n * (size_t)op->p[0] * (size_t)op->p[1] * (size_t)(op->p[2] + 1);
    kern_cpu_parallel(pool, draft_select_task, &t, work);
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
