/* kernels/cpu/matmul.c — KOP_MATMUL: out[r, n] (+)= x[r, :] . W[n, :] + bias[n].
 *
 * Batch-1 decode makes this a GEMV bound by reading W once, so the work is split across threads by
 * output columns (contiguous ranges of W rows, each streamed from memory by one thread), never by
 * K (that would change the order of each sum). The tiles themselves live in
 * simd_body.inc; any split and any row count give the same bits for every output.
 */
#include "kernels/cpu/kern_cpu.h"

#include <stdatomic.h>

typedef struct {
    kern_mm_args a;
    const kern_simd_ops *simd;
    const kern_pool *pool; /* for its per-thread scratch */
    int bf16x;       /* bf16 weights in the bf16-pairs scheme (the pool's bf16-activation mode) */
    int amx;         /* bf16 weights in the "amx" order (KERN_BF16_ACT_AMX, matmul_amx.c) */
    int cl;          /* f32 activations, the ISA's column-lane GEMM (windows of rows that fit) */
    int chunk;       /* output columns per work unit: a multiple of MM_CHUNK_UNIT */
    int nchunks;
    int win;         /* amx: rows per window (units are window-major), else M: one window */
    int nunits;      /* nchunks x windows */
    atomic_int next; /* the next unclaimed unit */
} mm_task;

/* Columns are handed out in units claimed from a shared counter, not as one fixed share per
 * thread: on a machine whose cores are time-shared (a VM), a thread that loses its core for a
 * while no longer holds up the whole op — the others take the units it has not claimed. Each unit
 * is a contiguous range of W rows (every core still streams whole rows), a multiple of 48 columns
 * (whole tiles of 6 or 8, and of AVX2's 6), about 8 units per thread. Which thread computes a
 * column never changes its bits. */
#define MM_CHUNK_UNIT 48
#define MM_CHUNKS_PER_THREAD 8

/* The amx order packs a thread's rows into its scratch once per window (matmul_amx.c); where the
 * scratch holds fewer rows than the op has, the op is cut into windows of rows that fit, and units
 * are handed out window-major: a thread's claims only go up, so it packs each window at most once
 * rather than once per unit of columns. */
static void mm_run(void *ctx, int tid, int nt)
{
    mm_task *t = ctx;
    (void)nt;
    kern_mm_xb xb = {.buf = kern_pool_scratch(t->pool, tid), .bytes = KERN_POOL_SCRATCH_BYTES};
    int cur = -1; /* the window xb holds rows of */
    for (;;) {
        const int u = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (u >= t->nunits) return;
        const int w = u / t->nchunks, c = u % t->nchunks;
        const int b = c * t->chunk, e = b + t->chunk < t->a.N ? b + t->chunk : t->a.N;
        kern_mm_args a = t->a;
        if (w != cur) xb.r0 = xb.r1 = 0, cur = w; /* other rows: nothing packed yet */
        if ((t->bf16x || t->amx || t->cl) && xb.buf) a.xb = &xb;
        if (t->amx || t->cl) {
            const int r0 = w * t->win;
            a.x += (size_t)r0 * (size_t)a.K;
            a.out += (size_t)r0 * (size_t)a.N;
            a.M = a.M - r0 < t->win ? a.M - r0 : t->win;
        }
        if (t->amx) {
            t->simd->mm_cols_amx(&a, b, e);
        } else if (t->bf16x) {
            t->simd->mm_cols_bf16x(&a, b, e);
        } else {
            t->simd->mm_cols(&a, b, e);
        }
    }
}

static atomic_long g_cl_ops;
long kern_cpu_mm_cl_ops(void) { return atomic_load_explicit(&g_cl_ops, memory_order_relaxed); }
int kern_cpu_mm_cl_rows(int fp8) { return fp8 ? kern_simd()->mm_cl_rows_fp8 : kern_simd()->mm_cl_rows; }

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
        .pool = pool,
        /* FP8 weights take the pairs order in either mode (kern.h) */
        .bf16x = (p[3] == KERN_DT_BF16 && kern_pool_bf16_activations(pool) == KERN_BF16_ACT_PAIRS) ||
                 (p[3] == KERN_DT_FP8 && kern_pool_bf16_activations(pool) != KERN_BF16_ACT_OFF),
        .amx = p[3] == KERN_DT_BF16 && kern_pool_bf16_activations(pool) == KERN_BF16_ACT_AMX,
    };
    if (p[3] == KERN_DT_FP8) {
        t.a.fs = op->buf[5].ptr;
        t.a.fb0 = p[5];
        t.a.fsk = (p[0] + p[6] - 1) / p[6];
        t.a.fsh = __builtin_ctz((unsigned)p[6]);
    }
    const int nt = pool ? kern_pool_threads(pool) : 1;
    const int units = (p[1] + MM_CHUNK_UNIT - 1) / MM_CHUNK_UNIT;
    int per = units / (MM_CHUNKS_PER_THREAD * nt);
    if (per < 1) per = 1;
    t.chunk = per * MM_CHUNK_UNIT;
    t.nchunks = (p[1] + t.chunk - 1) / t.chunk;
    t.win = M;
    if (t.amx && pool) { /* windows only where the scratch cannot hold every row (and holds some) */
        const int fit = kern_amx_scratch_rows(p[0], KERN_POOL_SCRATCH_BYTES);
        if (fit >= 32 && fit < M) t.win = fit;
    }
    const int cl_rows = p[3] == KERN_DT_FP8 ? t.simd->mm_cl_rows_fp8 : t.simd->mm_cl_rows;
    if (cl_rows && !t.bf16x && !t.amx && M >= cl_rows && kern_pool_scratch(pool, 0)) {
        const int fit = kern_cl_scratch_rows(p[0], KERN_POOL_SCRATCH_BYTES);
        if (fit >= cl_rows) {
            t.cl = 1, t.win = fit < M ? fit : M;
            atomic_fetch_add_explicit(&g_cl_ops, 1, memory_order_relaxed);
        }
    }
    t.nunits = t.nchunks * ((M + t.win - 1) / t.win);
    atomic_init(&t.next, 0);
    kern_cpu_parallel(pool, mm_run, &t, (size_t)M * (size_t)p[0] * (size_t)p[1]);
}
