/* kernels/cpu/matmul.c — KOP_MATMUL: out[r, n] (+)= x[r, :] . W[n, :] + bias[n].
 *
 * Batch-1 decode makes this a GEMV bound by reading W once, so the work is split across threads by
 * output columns (contiguous ranges of W rows: each thread streams its own part of W from memory),
 * never by K (that would change the order of each sum). The tiles themselves live in
 * simd_body.inc; any split and any row count give the same bits for every output.
 */
#include "kernels/cpu/kern_cpu.h"

typedef struct {
    kern_mm_args a;
    const kern_simd_ops *simd;
    int bf16x; /* bf16 weights in the bf16-pairs scheme (the pool's bf16-activation mode) */
} mm_task;

static void mm_run(void *ctx, int tid, int nt)
{
    const mm_task *t = ctx;
    int64_t b, e;
    /* 16-column units: ranges start on whole tiles (8 or 6 columns) for most of each share and
     * W rows of a share stay contiguous. */
    kern_split(t->a.N, tid, nt, 16, &b, &e);
    if (b >= e) return;
    if (t->bf16x)
        t->simd->mm_cols_bf16x(&t->a, (int)b, (int)e);
    else
        t->simd->mm_cols(&t->a, (int)b, (int)e);
}

void kern_cpu_matmul(kern_pool *pool, const kern_op *op)
{
    const int32_t *p = op->p;
    int32_t M = kern_cpu_count(op, 4, p[2]);
    if (M == 0) return;
    mm_task t = {
        .a = {
            .x = op->buf[0].ptr,
            .w = op->buf[1].ptr,
            .bias = op->buf[2].ptr,
            .out = op->buf[3].ptr,
            .K = p[0],
            .N = p[1],
            .M = M,
            .bf16 = p[3] == KERN_DT_BF16,
            .accumulate = p[4],
        },
        .simd = kern_simd(),
        .bf16x = p[3] == KERN_DT_BF16 && kern_pool_bf16_activations(pool),
    };
    kern_cpu_parallel(pool, mm_run, &t, (size_t)M * (size_t)p[0] * (size_t)p[1]);
}
