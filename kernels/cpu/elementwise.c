/* kernels/cpu/elementwise.c — KOP_EMBED, KOP_SILU_MUL, KOP_ADD, KOP_GATHER_ROWS. No reductions:
 * each output element is one expression of its inputs (SiLU's exp is kern_expf, the same bits on
 * every ISA), so any split gives the same bits. */
#include "kernels/cpu/kern_cpu.h"

#include <math.h>
#include <string.h>

/* ---- KOP_EMBED: rows split across threads; each token id is checked against V ----------------- */

typedef struct {
    const kern_op *op;
    const int32_t *ids;
    const void *table;
    float *out;
    int H, V, n, bf16;
} embed_task;

static void embed_run(void *ctx, int tid, int nt)
{
    const embed_task *t = ctx;
    int64_t b, e;
    kern_split(t->n, tid, nt, 1, &b, &e);
    for (int64_t r = b; r < e; r++) {
        const int32_t id = t->ids[r];
        KERN_CHECK(t->op, id >= 0 && id < t->V);
        float *o = t->out + (size_t)r * (size_t)t->H;
        const size_t at = (size_t)id * (size_t)t->H;
        if (t->bf16) {
            const uint16_t *src = (const uint16_t *)t->table + at;
            for (int i = 0; i < t->H; i++) o[i] = kern_bf16_to_f32(src[i]);
        } else {
            memcpy(o, (const float *)t->table + at, (size_t)t->H * sizeof(float));
        }
    }
}

void kern_cpu_embed(kern_pool *pool, const kern_op *op)
{
    embed_task t = {
        .op = op,
        .ids = op->buf[0].ptr,
        .table = op->buf[1].ptr,
        .out = op->buf[2].ptr,
        .H = op->p[0],
        .V = op->p[1],
        .n = kern_cpu_count(op, 3, op->p[2]),
        .bf16 = op->p[3] == KERN_DT_BF16,
    };
    /* rows are the unit of work: a single row is never worth a dispatch */
    kern_cpu_parallel(pool, embed_run, &t, t.n < 2 ? 0 : (size_t)t.n * (size_t)t.H);
}

/* ---- KOP_SILU_MUL and KOP_ADD: the live rows are one flat range of elements --------------------- */

typedef struct {
    const kern_simd_ops *simd;
    const float *gu;
    float *out;
    int I;
    int64_t total; /* n_rows * I */
} silu_task;

/* each (row, column) range of the thread's share in one call (kern_silu_mul's bits on every ISA) */
static void silu_run(void *ctx, int tid, int nt)
{
    const silu_task *t = ctx;
    int64_t b, e;
    kern_split(t->total, tid, nt, 16, &b, &e);
    while (b < e) {
        const int64_t r = b / t->I, i = b % t->I, n = e - b < t->I - i ? e - b : t->I - i;
        const float *g = t->gu + r * 2 * t->I + i;
        t->simd->silu_mul(t->out + b, g, g + t->I, (int)n);
        b += n;
    }
}

void kern_cpu_silu_mul(kern_pool *pool, const kern_op *op)
{
    silu_task t = {.simd = kern_simd(), .gu = op->buf[0].ptr, .out = op->buf[1].ptr, .I = op->p[0]};
    t.total = (int64_t)kern_cpu_count(op, 2, op->p[1]) * t.I;
    kern_cpu_parallel(pool, silu_run, &t, (size_t)t.total * 20);
}

typedef struct {
    float *x;
    const float *y;
    int64_t total;
} add_task;

static void add_run(void *ctx, int tid, int nt)
{
    const add_task *t = ctx;
    int64_t b, e;
    kern_split(t->total, tid, nt, 16, &b, &e);
    float *x = t->x;
    const float *y = t->y; /* may equal x (x += x) */
    for (int64_t k = b; k < e; k++) x[k] = x[k] + y[k];
}

void kern_cpu_add(kern_pool *pool, const kern_op *op)
{
    add_task t = {.x = op->buf[0].ptr, .y = op->buf[1].ptr};
    t.total = (int64_t)kern_cpu_count(op, 2, op->p[1]) * op->p[0];
    kern_cpu_parallel(pool, add_run, &t, (size_t)t.total);
}

/* ---- KOP_GATHER_ROWS: a handful of row copies, on the calling thread ----------------------------- */

void kern_cpu_gather_rows(kern_pool *pool, const kern_op *op)
{
    (void)pool;
    const int H = op->p[0], x_rows = op->p[1];
    const int32_t n = kern_cpu_count(op, 3, op->p[2]);
    const float *x = op->buf[0].ptr;
    const int32_t *idx = op->buf[1].ptr;
    float *out = op->buf[2].ptr;
    for (int j = 0; j < n; j++) {
        KERN_CHECK(op, idx[j] >= 0 && idx[j] < x_rows);
        memcpy(out + (size_t)j * (size_t)H, x + (size_t)idx[j] * (size_t)H, (size_t)H * sizeof(float));
    }
}
