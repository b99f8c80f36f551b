/* kernels/cpu/moe.c — KOP_MOE_ROUTE and KOP_MOE_FFN (kern.h): the router and the experts of a
 * sparse MoE block.
 *
 * The experts run as ggml's mul_mat_id does: the routed rows (row, slot) are grouped by expert
 * (a counting sort in routed order, so a group lists its rows in ascending row), each expert's
 * group is one GEMM against that expert's rows of the stacked weight, and an expert no row chose
 * is never touched: at batch 1 a step reads k experts' weights, not E. Every dot product is a
 * KOP_MATMUL row (the same simd mm_cols: the same bits whatever the group's size), and each row's
 * weighted sum runs over its slots in their order, so a row's result does not depend on which
 * experts the other rows chose (batch invariance). FP8 experts take the same path: each mm_cols call
 * gets the expert's first scale row, as a KOP_MATMUL over that expert's matrix would.
 *
 * Phases of KOP_MOE_FFN (each a parallel region; the grouping is a serial pass over n*k entries):
 *   group   posof[r*k + j] = the row's place in its expert's group; xg[place] = h[r]
 *   gate_up units (expert, column range of I): g and u columns by mm_cols, then a = silu(g) * u
 *   down    units (expert, column range of H): y = a . W2[e]^T
 *   combine rows: out[r] = out[r] + (sum over j of w_j * y_j, in j order from 0)
 */
#include "kernels/cpu/kern_cpu.h"

#include <stdatomic.h>
#include <string.h>

/* ---- KOP_MOE_ROUTE -------------------------------------------------------------------------------- */

typedef struct {
    const kern_op *op;
    const float *logits;
    int32_t *ids;
    float *wts;
    int E, k, n, norm;
} route_task;

static void route_row(const route_task *t, int r)
{
    const float *l = t->logits + (size_t)r * (size_t)t->E;
    float q[KERN_MAX_EXPERTS];
    uint8_t taken[KERN_MAX_EXPERTS];
    int best[KERN_MAX_EXPERTS];
    float m = l[0];
    for (int e = 1; e < t->E; e++)
        if (l[e] > m) m = l[e];
    float s = 0.0f;
    for (int e = 0; e < t->E; e++) {
        q[e] = kern_expf(l[e] - m);
        s = s + q[e];
    }
    for (int e = 0; e < t->E; e++) {
        q[e] = q[e] / s;
        taken[e] = 0;
    }
    /* the k best by (q, lower id): selection, k passes over E */
    for (int j = 0; j < t->k; j++) {
        int b = -1;
        uint64_t bk = 0;
        for (int e = 0; e < t->E; e++) {
            if (taken[e]) continue;
            const uint64_t key = kern_sample_key(q[e], e);
            if (b < 0 || key > bk) b = e, bk = key;
        }
        taken[b] = 1;
        best[j] = b;
    }
    float tot = 0.0f;
    if (t->norm)
        for (int j = 0; j < t->k; j++) tot = tot + q[best[j]];
    /* ascending expert id: taken[] in id order */
    int32_t *ids = t->ids + (size_t)r * (size_t)t->k;
    float *w = t->wts + (size_t)r * (size_t)t->k;
    int j = 0;
    for (int e = 0; e < t->E && j < t->k; e++)
        if (taken[e]) {
            ids[j] = e;
            w[j] = t->norm ? q[e] / tot : q[e];
            j++;
        }
}

static void route_run(void *ctx, int tid, int nt)
{
    const route_task *t = ctx;
    int64_t b, e;
    kern_split(t->n, tid, nt, 1, &b, &e);
    for (int64_t r = b; r < e; r++) route_row(t, (int)r);
}

void kern_cpu_moe_route(kern_pool *pool, const kern_op *op)
{
    route_task t = {
        .op = op,
        .logits = op->buf[0].ptr,
        .ids = op->buf[1].ptr,
        .wts = op->buf[2].ptr,
        .E = op->p[0],
        .k = op->p[1],
        .n = kern_cpu_count(op, 3, op->p[2]),
        .norm = op->p[3],
    };
    kern_cpu_parallel(pool, route_run, &t, t.n < 2 ? 0 : (size_t)t.n * (size_t)t.E * (size_t)(t.k + 4));
}

/* ---- KOP_MOE_FFN ------------------------------------------------------------------------------------ */

/* Columns per work unit: whole tiles (matmul.c's unit), at least one unit per expert group. */
#define MOE_CHUNK 48
#define MOE_MAX_UNITS 4096

typedef struct {
    const kern_simd_ops *simd;
    const float *h, *wts;
    const int32_t *ids;
    const void *w13, *w2;
    float *out;
    int H, I, E, k, n, bf16, bf16x, amx;
    size_t es; /* weight element size */
    /* FP8 experts (kern.h): the scale tables (NULL otherwise), b0, log2 b1, and scales per block row
     * of W13 (ceil(H / b1)) and of W2 (ceil(I / b1)) */
    const float *s13, *s2;
    int fb0, fsh, fsk13, fsk2;
    /* scratch */
    float *xg, *gu, *act, *yg;
    int32_t *posof, *offs;
    /* the current phase's work list: units (expert, column range) claimed from next */
    int32_t *unit_e;
    int nunits, chunk;
    atomic_int next;
} ffn_task;

/* out[r, c0 .. c1) = x[r, :] . w[c, :] for r < M, w one expert's [N, K] matrix; fs its first scale
 * row (FP8: column c's scales at fs + (c / b0) * fsk, as KOP_MATMUL's with w as its whole W), else
 * NULL */
static void mm(const ffn_task *t, const float *x, const void *w, const float *fs, int fsk, float *out, int K, int N,
               int M, int c0, int c1)
{
    kern_mm_args a = {.x = x, .w = w, .bias = NULL, .out = out, .K = K, .N = N, .M = M, .bf16 = t->bf16,
                      .accumulate = 0, .fs = fs, .fb0 = t->fb0, .fsh = t->fsh, .fsk = fsk, .xb = NULL};
    if (t->amx) t->simd->mm_cols_amx(&a, c0, c1); /* the "amx" order, as KOP_MATMUL */
    else if (t->bf16x) t->simd->mm_cols_bf16x(&a, c0, c1);
    else t->simd->mm_cols(&a, c0, c1);
}

/* units of phase gate_up: (e, columns [c0, c1) of I): gate rows c0.., up rows I + c0.. */
static void gate_up_run(void *ctx, int tid, int nt)
{
    ffn_task *t = ctx;
    (void)tid, (void)nt;
    const int I = t->I, H = t->H;
    for (;;) {
        const int u = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (u >= t->nunits) return;
        const int e = t->unit_e[u] >> 16, c = t->unit_e[u] & 0xffff;
        const int c0 = c * t->chunk, c1 = c0 + t->chunk < I ? c0 + t->chunk : I;
        const int r0 = t->offs[e], M = t->offs[e + 1] - r0;
        const uint8_t *w = (const uint8_t *)t->w13 + (size_t)e * 2 * (size_t)I * (size_t)H * t->es;
        /* FP8: expert e's block rows start at e*2I / b0 (I % b0 == 0: no block spans two experts) */
        const float *fs = t->s13 ? t->s13 + (size_t)e * 2 * (size_t)(I / t->fb0) * (size_t)t->fsk13 : NULL;
        float *gu = t->gu + (size_t)r0 * 2 * (size_t)I;
        mm(t, t->xg + (size_t)r0 * (size_t)H, w, fs, t->fsk13, gu, H, 2 * I, M, c0, c1);
        mm(t, t->xg + (size_t)r0 * (size_t)H, w, fs, t->fsk13, gu, H, 2 * I, M, I + c0, I + c1);
        for (int r = 0; r < M; r++) {
            const float *g = gu + (size_t)r * 2 * (size_t)I;
            float *a = t->act + ((size_t)r0 + (size_t)r) * (size_t)I;
            for (int i = c0; i < c1; i++) a[i] = kern_silu_mul(g[i], g[I + i]);
        }
    }
}

/* units of phase down: (e, columns [c0, c1) of H) */
static void down_run(void *ctx, int tid, int nt)
{
    ffn_task *t = ctx;
    (void)tid, (void)nt;
    const int I = t->I, H = t->H;
    for (;;) {
        const int u = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (u >= t->nunits) return;
        const int e = t->unit_e[u] >> 16, c = t->unit_e[u] & 0xffff;
        const int c0 = c * t->chunk, c1 = c0 + t->chunk < H ? c0 + t->chunk : H;
        const int r0 = t->offs[e], M = t->offs[e + 1] - r0;
        const uint8_t *w = (const uint8_t *)t->w2 + (size_t)e * (size_t)H * (size_t)I * t->es;
        /* FP8: expert e's block rows start at e*H / b0 (H % b0 == 0) */
        const float *fs = t->s2 ? t->s2 + (size_t)e * (size_t)(H / t->fb0) * (size_t)t->fsk2 : NULL;
        mm(t, t->act + (size_t)r0 * (size_t)I, w, fs, t->fsk2, t->yg + (size_t)r0 * (size_t)H, I, H, M, c0, c1);
    }
}

static void combine_run(void *ctx, int tid, int nt)
{
    const ffn_task *t = ctx;
    int64_t b, e;
    kern_split(t->n, tid, nt, 1, &b, &e);
    const int H = t->H, k = t->k;
    for (int64_t r = b; r < e; r++) {
        float *o = t->out + (size_t)r * (size_t)H;
        const float *w = t->wts + (size_t)r * (size_t)k;
        const int32_t *pos = t->posof + (size_t)r * (size_t)k;
        for (int i = 0; i < H; i++) {
            float acc = 0.0f;
            for (int j = 0; j < k; j++) acc = acc + w[j] * t->yg[(size_t)pos[j] * (size_t)H + (size_t)i];
            o[i] = o[i] + acc;
        }
    }
}

/* The work list of one phase: every expert with rows, cut into column ranges of about `chunk`. */
static void plan_units(ffn_task *t, int cols, int nt)
{
    int groups = 0;
    for (int e = 0; e < t->E; e++) groups += t->offs[e + 1] > t->offs[e];
    /* about 4 units per thread over all groups; whole tiles */
    int per = groups ? cols * groups / (4 * nt) : cols;
    per = (per + MOE_CHUNK - 1) / MOE_CHUNK * MOE_CHUNK;
    if (per < MOE_CHUNK) per = MOE_CHUNK;
    if (per > cols) per = cols;
    while ((int64_t)groups * ((cols + per - 1) / per) > MOE_MAX_UNITS) per *= 2; /* (E <= 1024 fits) */
    t->chunk = per;
    const int nc = (cols + per - 1) / per;
    t->nunits = 0;
    for (int e = 0; e < t->E; e++)
        if (t->offs[e + 1] > t->offs[e])
            for (int c = 0; c < nc; c++) t->unit_e[t->nunits++] = (int32_t)((e << 16) | c);
    atomic_store_explicit(&t->next, 0, memory_order_relaxed);
}

void kern_cpu_moe_ffn(kern_pool *pool, const kern_op *op)
{
    const int32_t *p = op->p;
    const int H = p[0], I = p[1], E = p[2], k = p[3], max_rows = p[4];
    const int n = kern_cpu_count(op, 6, max_rows);
    if (n == 0) return;
    const size_t nr = (size_t)max_rows * (size_t)k;
#define R64(b) (((b) + 63) & ~(size_t)63)
    uint8_t *s = op->buf[7].ptr;
    ffn_task t = {
        .simd = kern_simd(),
        .h = op->buf[0].ptr,
        .w13 = op->buf[1].ptr,
        .w2 = op->buf[2].ptr,
        .ids = op->buf[3].ptr,
        .wts = op->buf[4].ptr,
        .out = op->buf[5].ptr,
        .H = H, .I = I, .E = E, .k = k, .n = n,
        .bf16 = p[5] == KERN_DT_BF16,
        .bf16x = (p[5] == KERN_DT_BF16 && kern_pool_bf16_activations(pool) == KERN_BF16_ACT_PAIRS) ||
                 (p[5] == KERN_DT_FP8 && kern_pool_bf16_activations(pool) != KERN_BF16_ACT_OFF),
        .amx = p[5] == KERN_DT_BF16 && kern_pool_bf16_activations(pool) == KERN_BF16_ACT_AMX,
        .es = kern_dtype_size((kern_dtype)p[5]),
    };
    if (p[5] == KERN_DT_FP8) { /* kern.h: b0 = p 6 divides I and H, b1 = p 7 a power of two */
        t.s13 = op->buf[8].ptr;
        t.s2 = op->buf[9].ptr;
        t.fb0 = p[6];
        t.fsh = __builtin_ctz((unsigned)p[7]);
        t.fsk13 = (H + p[7] - 1) / p[7];
        t.fsk2 = (I + p[7] - 1) / p[7];
    }
    t.xg = (float *)s;
    s += R64(nr * (size_t)H * 4);
    t.gu = (float *)s;
    s += R64(nr * (size_t)I * 8);
    t.act = (float *)s;
    s += R64(nr * (size_t)I * 4);
    t.yg = (float *)s;
    s += R64(nr * (size_t)H * 4);
    t.posof = (int32_t *)s;
    s += R64(nr * 4);
    t.offs = (int32_t *)s;
#undef R64
    /* group: a counting sort of the routed rows by expert (routed order within a group) */
    for (int e = 0; e <= E; e++) t.offs[e] = 0;
    const size_t nk = (size_t)n * (size_t)k;
    for (size_t q = 0; q < nk; q++) {
        const int32_t e = t.ids[q];
        KERN_CHECK(op, e >= 0 && e < E);
        for (size_t q0 = q / (size_t)k * (size_t)k; q0 < q; q0++) KERN_CHECK(op, t.ids[q0] != e); /* once a row */
        t.offs[e + 1]++;
    }
    for (int e = 0; e < E; e++) t.offs[e + 1] += t.offs[e];
    /* cursor per expert: offs[e] advanced while placing, then restored from the next expert's start */
    for (size_t q = 0; q < nk; q++) {
        const int32_t e = t.ids[q];
        const int32_t pos = t.offs[e]++;
        t.posof[q] = pos;
        memcpy(t.xg + (size_t)pos * (size_t)H, t.h + q / (size_t)k * (size_t)H, (size_t)H * sizeof(float));
    }
    for (int e = E; e > 0; e--) t.offs[e] = t.offs[e - 1];
    t.offs[0] = 0;
    /* the work list: about 4 units per thread plus one per expert group (plan_units), at most
     * E + 4 * threads + rounding; unit = expert << 16 | column range (< 2^20 / 48 ranges) */
    int32_t units_stack[MOE_MAX_UNITS];
    const int nt = pool ? kern_pool_threads(pool) : 1;
    t.unit_e = units_stack;
    const size_t work_gu = nk * (size_t)H * (size_t)(2 * I), work_dn = nk * (size_t)I * (size_t)H;
    plan_units(&t, I, nt);
    kern_cpu_parallel(pool, gate_up_run, &t, work_gu);
    plan_units(&t, H, nt);
    kern_cpu_parallel(pool, down_run, &t, work_dn);
    kern_cpu_parallel(pool, combine_run, &t, n < 2 ? 0 : nk * (size_t)H);
}
