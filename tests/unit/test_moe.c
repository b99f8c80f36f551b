/* tests/unit/test_moe.c — KOP_MOE_ROUTE and KOP_MOE_FFN (kernels/cpu/moe.c) against the kern.h
 * contract:
 *   - route: a float64 softmax / top-k / renormalisation reference (ties to the lower id, ascending
 *     ids, norm on and off), and the exact f32 expression of the contract bit for bit;
 *   - ffn: bitwise equal to the same math composed from KOP_MATMUL / KOP_SILU_MUL ops one row and
 *     one expert at a time (the contract says each dot product is a KOP_MATMUL row), f32 and bf16
 *     weights, the bf16-activation modes too (bf16 pairs and the amx order, the latter on every ISA:
 *     native TDPBF16PS and its emulations);
 *   - batch invariance: a row's output alone equals its output among rows that chose other experts;
 *   - every ISA and 1 / 2 / 3 threads give the same bits;
 *   - an expert no live row chose is never read (its weights are NaN), rows past n_rows untouched;
 *   - a malformed expert id aborts (a bug: the route op writes ids in range);
 *   - FP8 experts (wdt KERN_DT_FP8: e4m3 codes plus block scales S13 / S2): bitwise the f32-weight op
 *     over the dequantized weights (kern_fp8_to_f32(q) * s, one f32 multiply, computed here), E 1 .. 8,
 *     k 1 .. E, b0 1 / 16 / 32, b1 16 / 32 / 64 with partial column blocks, 1 / 3 / 17 rows, every ISA,
 *     1 and 2 threads; an unchosen expert's NaN scales are never read; validate refuses bad b0 / b1 and
 *     missing or short scale tables;
 *   - FP8 experts in a bf16-activation mode (pairs or amx): bitwise bf16 experts of the rounded
 *     dequantized weights in the pairs order, the same shapes, every ISA, 1 and 2 threads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/kern_cpu.h"
#include "kernels/kern.h"

#define TEST_RNG_SEED 0x243f6a8885a308d3ull
#include "test_kern_util.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int isa_list(kern_isa *out) { return isa_list_of(out, 1); }

/* ---- route ------------------------------------------------------------------------------------------ */

static kern_op route_op(float *logits, int32_t *ids, float *w, int32_t *n, int E, int k, int rows, int norm)
{
    kern_op op = {.kind = KOP_MOE_ROUTE};
    op.buf[0] = B(logits, (size_t)rows * E * 4);
    op.buf[1] = B(ids, (size_t)rows * k * 4);
    op.buf[2] = B(w, (size_t)rows * k * 4);
    op.buf[3] = B(n, 4);
    op.p[0] = E, op.p[1] = k, op.p[2] = rows, op.p[3] = norm;
    return op;
}

/* The float64 reference of one row: softmax, the k best (lower id on ties), renormalised. */
static void route_ref(const float *l, int E, int k, int norm, int *ids, double *w)
{
    double m = l[0], s = 0, q[KERN_MAX_EXPERTS];
    int taken[KERN_MAX_EXPERTS] = {0}, best[KERN_MAX_EXPERTS];
    for (int e = 1; e < E; e++) m = l[e] > m ? l[e] : m;
    for (int e = 0; e < E; e++) s += q[e] = exp((double)l[e] - m);
    for (int e = 0; e < E; e++) q[e] /= s;
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (b < 0 || q[e] > q[b])) b = e;
        taken[b] = 1;
        best[j] = b;
    }
    double t = 0;
    for (int j = 0; j < k; j++) t += q[best[j]];
    int j = 0;
    for (int e = 0; e < E; e++)
        if (taken[e]) ids[j] = e, w[j] = norm ? q[e] / t : q[e], j++;
}

static void test_route_reference(void **state)
{
    (void)state;
    const int shapes[][2] = {{8, 2}, {8, 8}, {8, 1}, {32, 4}, {128, 8}, {5, 3}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int norm = 0; norm < 2; norm++) {
            const int E = shapes[si][0], k = shapes[si][1], rows = 7;
            float *l = xalloc((size_t)rows * E * 4), *w = xalloc((size_t)rows * k * 4);
            int32_t *ids = xalloc((size_t)rows * k * 4), n = rows - 1;
            fill(l, (size_t)rows * E, -4, 4);
            for (int i = 0; i < k; i++) ids[(rows - 1) * k + i] = -7; /* past n: untouched */
            kern_op op = route_op(l, ids, w, &n, E, k, rows, norm);
            kern_cpu_exec(NULL, &op);
            for (int r = 0; r < n; r++) {
                int rid[KERN_MAX_EXPERTS];
                double rw[KERN_MAX_EXPERTS];
                route_ref(l + (size_t)r * E, E, k, norm, rid, rw);
                for (int j = 0; j < k; j++) {
                    assert_int_equal(ids[r * k + j], rid[j]);
                    if (fabs(w[r * k + j] - rw[j]) > 2e-6 * (rw[j] + 1e-3))
                        fail_msg("E %d k %d norm %d row %d slot %d: weight %.9g want %.9g", E, k, norm, r, j,
                                 (double)w[r * k + j], rw[j]);
                }
            }
            for (int i = 0; i < k; i++) assert_int_equal(ids[(rows - 1) * k + i], -7);
            free(l), free(w), free(ids);
        }
}

/* The contract's f32 expression, step by step, bit for bit (one row of E 6, k 3). */
static void test_route_exact(void **state)
{
    (void)state;
    float l[6] = {0.5f, -1.25f, 2.0f, 0.75f, 2.0f, -3.0f}, w[3];
    int32_t ids[3], n = 1;
    for (int norm = 0; norm < 2; norm++) {
        kern_op op = route_op(l, ids, w, &n, 6, 3, 1, norm);
        kern_cpu_exec(NULL, &op);
        float m = 2.0f, x[6], s = 0.0f;
        for (int e = 0; e < 6; e++) s = s + (x[e] = kern_expf(l[e] - m));
        /* the best are 2 and 4 (equal: 2 first), then 3 */
        assert_int_equal(ids[0], 2), assert_int_equal(ids[1], 3), assert_int_equal(ids[2], 4);
        const float q2 = x[2] / s, q3 = x[3] / s, q4 = x[4] / s, t = q2 + q4 + q3; /* best-first */
        const float want[3] = {norm ? q2 / t : q2, norm ? q3 / t : q3, norm ? q4 / t : q4};
        for (int j = 0; j < 3; j++) assert_memory_equal(&w[j], &want[j], 4);
    }
}

/* Equal logits everywhere: the k lowest ids, each weight 1/E (or 1/k normalised). */
static void test_route_ties(void **state)
{
    (void)state;
    float l[16], w[4];
    int32_t ids[4], n = 1;
    for (int e = 0; e < 16; e++) l[e] = 0.25f;
    kern_op op = route_op(l, ids, w, &n, 16, 4, 1, 1);
    kern_cpu_exec(NULL, &op);
    for (int j = 0; j < 4; j++) {
        assert_int_equal(ids[j], j);
        assert_true(fabsf(w[j] - 0.25f) < 1e-7f);
    }
    l[9] = 0.5f; /* one better expert, then the lowest ids among the equal ones */
    kern_cpu_exec(NULL, &op);
    assert_int_equal(ids[0], 0), assert_int_equal(ids[1], 1), assert_int_equal(ids[2], 2), assert_int_equal(ids[3], 9);
}

/* ---- ffn -------------------------------------------------------------------------------------------- */

typedef struct {
    int H, I, E, k, rows;
    kern_dtype dt;
    void *w13, *w2;
    float *s13, *s2; /* FP8: the scale tables (buf 8 / 9), b0 and b1 (p 6 / 7); NULL / 0 otherwise */
    int b0, b1;
    float *h;
    int32_t *ids;
    float *wts;
    void *scratch;
} ffn_case;

static void to_dt(void *dst, const float *src, size_t n, kern_dtype dt)
{
    if (dt == KERN_DT_F32) memcpy(dst, src, n * 4);
    else
        for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = kern_f32_to_bf16(src[i]);
}

static void ffn_init(ffn_case *c, int H, int I, int E, int k, int rows, kern_dtype dt)
{
    memset(c, 0, sizeof *c);
    c->H = H, c->I = I, c->E = E, c->k = k, c->rows = rows, c->dt = dt;
    const size_t es = kern_dtype_size(dt), n13 = (size_t)E * 2 * I * H, n2 = (size_t)E * H * I;
    float *f = xalloc((n13 > n2 ? n13 : n2) * 4);
    c->w13 = xalloc(n13 * es);
    c->w2 = xalloc(n2 * es);
    fill(f, n13, -0.3f, 0.3f);
    to_dt(c->w13, f, n13, dt);
    fill(f, n2, -0.3f, 0.3f);
    to_dt(c->w2, f, n2, dt);
    free(f);
    c->h = xalloc((size_t)rows * H * 4);
    fill(c->h, (size_t)rows * H, -1, 1);
    c->ids = xalloc((size_t)rows * k * 4);
    c->wts = xalloc((size_t)rows * k * 4);
    for (int r = 0; r < rows; r++) { /* k distinct ascending experts per row, random weights */
        int taken[KERN_MAX_EXPERTS] = {0}, got = 0;
        while (got < k) {
            int e = (int)(rnd_u64() % (uint64_t)E);
            if (!taken[e]) taken[e] = 1, got++;
        }
        int j = 0;
        for (int e = 0; e < E; e++)
            if (taken[e]) c->ids[r * k + j] = e, c->wts[r * k + j] = rnd_f(0.05f, 0.6f), j++;
    }
    c->scratch = xalloc(kern_moe_scratch_bytes(E, k, H, I, rows));
}

static void ffn_free(ffn_case *c)
{
    free(c->w13), free(c->w2), free(c->h), free(c->ids), free(c->wts), free(c->scratch);
}

/* FP8 scale tables: S13 [E*2I / b0, ceil(H / b1)], S2 [E*H / b0, ceil(I / b1)] (kern.h) */
static size_t fp8_s13_floats(const ffn_case *c)
{
    return (size_t)c->E * 2 * (size_t)(c->I / c->b0) * (size_t)((c->H + c->b1 - 1) / c->b1);
}
static size_t fp8_s2_floats(const ffn_case *c)
{
    return (size_t)c->E * (size_t)(c->H / c->b0) * (size_t)((c->I + c->b1 - 1) / c->b1);
}

/* KOP_MOE_FFN on rows [0, n) of c into out (out starts as a copy of base). */
static void ffn_run(const ffn_case *c, kern_pool *pool, int n, const float *base, float *out)
{
    memcpy(out, base, (size_t)c->rows * c->H * 4);
    int32_t nr = n;
    const size_t es = kern_dtype_size(c->dt);
    kern_op op = {.kind = KOP_MOE_FFN};
    op.buf[0] = B(c->h, (size_t)c->rows * c->H * 4);
    op.buf[1] = B(c->w13, (size_t)c->E * 2 * c->I * c->H * es);
    op.buf[2] = B(c->w2, (size_t)c->E * c->H * c->I * es);
    op.buf[3] = B(c->ids, (size_t)c->rows * c->k * 4);
    op.buf[4] = B(c->wts, (size_t)c->rows * c->k * 4);
    op.buf[5] = B(out, (size_t)c->rows * c->H * 4);
    op.buf[6] = B(&nr, 4);
    op.buf[7] = B(c->scratch, kern_moe_scratch_bytes(c->E, c->k, c->H, c->I, c->rows));
    op.p[0] = c->H, op.p[1] = c->I, op.p[2] = c->E, op.p[3] = c->k, op.p[4] = c->rows, op.p[5] = c->dt;
    if (c->dt == KERN_DT_FP8) {
        op.buf[8] = B(c->s13, fp8_s13_floats(c) * 4);
        op.buf[9] = B(c->s2, fp8_s2_floats(c) * 4);
        op.p[6] = c->b0, op.p[7] = c->b1;
    }
    kern_cpu_exec(pool, &op);
}

/* The same from KOP_MATMUL and KOP_SILU_MUL, one row and one expert at a time. */
static void ffn_composed(const ffn_case *c, kern_pool *pool, int n, const float *base, float *out)
{
    const int H = c->H, I = c->I, k = c->k;
    const size_t es = kern_dtype_size(c->dt);
    memcpy(out, base, (size_t)c->rows * H * 4);
    float *gu = xalloc((size_t)2 * I * 4), *a = xalloc((size_t)I * 4), *y = xalloc((size_t)k * H * 4);
    int32_t one = 1;
    for (int r = 0; r < n; r++) {
        for (int j = 0; j < k; j++) {
            const int e = c->ids[r * k + j];
            kern_op op = {.kind = KOP_MATMUL};
            op.buf[0] = B(c->h + (size_t)r * H, (size_t)H * 4);
            op.buf[1] = B((uint8_t *)c->w13 + (size_t)e * 2 * I * H * es, (size_t)2 * I * H * es);
            op.buf[3] = B(gu, (size_t)2 * I * 4);
            op.buf[4] = B(&one, 4);
            op.p[0] = H, op.p[1] = 2 * I, op.p[2] = 1, op.p[3] = c->dt, op.p[4] = 0;
            kern_cpu_exec(pool, &op);
            kern_op sm = {.kind = KOP_SILU_MUL};
            sm.buf[0] = B(gu, (size_t)2 * I * 4);
            sm.buf[1] = B(a, (size_t)I * 4);
            sm.buf[2] = B(&one, 4);
            sm.p[0] = I, sm.p[1] = 1;
            kern_cpu_exec(pool, &sm);
            kern_op dn = {.kind = KOP_MATMUL};
            dn.buf[0] = B(a, (size_t)I * 4);
            dn.buf[1] = B((uint8_t *)c->w2 + (size_t)e * H * I * es, (size_t)H * I * es);
            dn.buf[3] = B(y + (size_t)j * H, (size_t)H * 4);
            dn.buf[4] = B(&one, 4);
            dn.p[0] = I, dn.p[1] = H, dn.p[2] = 1, dn.p[3] = c->dt, dn.p[4] = 0;
            kern_cpu_exec(pool, &dn);
        }
        for (int i = 0; i < H; i++) {
            float acc = 0.0f;
            for (int j = 0; j < k; j++) acc = acc + c->wts[r * k + j] * y[(size_t)j * H + i];
            out[(size_t)r * H + i] = out[(size_t)r * H + i] + acc;
        }
    }
    free(gu), free(a), free(y);
}

static void assert_bits(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0) fail_msg("%s: element %zu: %.9g vs %.9g", what, i, (double)a[i], (double)b[i]);
}

static const int g_shapes[][5] = {
    /* H, I, E, k, rows */
    {64, 32, 8, 2, 5},   {48, 100, 4, 4, 3}, {40, 24, 16, 1, 9},
    {96, 64, 32, 4, 17}, {33, 17, 6, 3, 2},  {128, 256, 8, 2, 1},
};

static void test_ffn_composed(void **state)
{
    (void)state;
    kern_pool *pool = kern_pool_create(2);
    kern_cpu_set_min_parallel_work(0);
    for (size_t si = 0; si < sizeof g_shapes / sizeof g_shapes[0]; si++)
        for (int dt = 0; dt < 2; dt++)
            for (int bx = 0; bx < 1 + 2 * dt; bx++) { /* bf16: off, bf16 pairs, amx */
                const int *s = g_shapes[si];
                ffn_case c;
                ffn_init(&c, s[0], s[1], s[2], s[3], s[4], (kern_dtype)dt);
                kern_pool_set_bf16_activations(pool, bx);
                const size_t n = (size_t)c.rows * c.H;
                float *base = xalloc(n * 4), *got = xalloc(n * 4), *want = xalloc(n * 4);
                fill(base, n, -2, 2);
                const int live = c.rows > 1 ? c.rows - 1 : 1;
                ffn_run(&c, pool, live, base, got);
                ffn_composed(&c, pool, live, base, want);
                char what[96];
                snprintf(what, sizeof what, "shape %zu dt %d bf16x %d", si, dt, bx);
                assert_bits(got, want, n, what); /* rows past live: both = base */
                if (bx == KERN_BF16_ACT_AMX) { /* the amx order on every ISA (emulated or native) */
                    kern_isa isas[TEST_ISA_CAP];
                    const int nisa = isa_list(isas);
                    float *g2 = xalloc(n * 4);
                    for (int ii = 0; ii < nisa; ii++) {
                        assert_int_equal(kern_simd_force(isas[ii]), 0);
                        ffn_run(&c, pool, live, base, g2);
                        snprintf(what, sizeof what, "shape %zu amx isa %d", si, (int)isas[ii]);
                        assert_bits(g2, got, n, what);
                        ffn_composed(&c, pool, live, base, g2);
                        assert_bits(g2, got, n, what);
                    }
                    kern_simd_force(isas[nisa - 1]);
                    free(g2);
                }
                free(base), free(got), free(want);
                ffn_free(&c);
            }
    kern_pool_set_bf16_activations(pool, 0);
    kern_pool_destroy(pool);
}

/* A row alone, then the same row among others that chose other experts: the same bits; and the same
 * on every ISA and thread count. */
static void test_ffn_invariance(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list(isas);
    const int threads[3] = {1, 2, 3};
    for (int dt = 0; dt < 2; dt++) {
        ffn_case c;
        ffn_init(&c, 96, 80, 16, 3, 12, (kern_dtype)dt);
        const size_t n = (size_t)c.rows * c.H;
        float *base = xalloc(n * 4), *ref = xalloc(n * 4), *got = xalloc(n * 4);
        fill(base, n, -1, 1);
        assert_int_equal(kern_simd_force(KERN_ISA_SCALAR), 0);
        ffn_run(&c, NULL, c.rows, base, ref);
        for (int ii = 0; ii < nisa; ii++)
            for (int ti = 0; ti < 3; ti++) {
                assert_int_equal(kern_simd_force(isas[ii]), 0);
                kern_pool *pool = kern_pool_create(threads[ti]);
                ffn_run(&c, pool, c.rows, base, got);
                assert_bits(got, ref, n, "isa / threads");
                /* row 5 alone: moved to row 0 of a one-row batch */
                ffn_case one = c;
                one.rows = 1;
                one.h = c.h + 5 * c.H;
                one.ids = c.ids + 5 * c.k;
                one.wts = c.wts + 5 * c.k;
                ffn_run(&one, pool, 1, base + 5 * c.H, got);
                assert_bits(got, ref + 5 * c.H, (size_t)c.H, "row 5 alone");
                kern_pool_destroy(pool);
            }
        kern_isa l[TEST_ISA_CAP];
        assert_int_equal(kern_simd_force(l[isa_list(l) - 1]), 0);
        free(base), free(ref), free(got);
        ffn_free(&c);
    }
}

/* Experts that no live row chose hold NaN: the output has none (they were never read). */
static void test_ffn_unread_experts(void **state)
{
    (void)state;
    ffn_case c;
    ffn_init(&c, 64, 48, 12, 2, 4, KERN_DT_BF16);
    int used[KERN_MAX_EXPERTS] = {0};
    for (int q = 0; q < 3 * c.k; q++) used[c.ids[q]] = 1; /* rows 0..2 live */
    for (int e = 0; e < c.E; e++) {
        if (used[e]) continue;
        uint16_t *a = (uint16_t *)c.w13 + (size_t)e * 2 * c.I * c.H, *b = (uint16_t *)c.w2 + (size_t)e * c.H * c.I;
        for (size_t i = 0; i < (size_t)2 * c.I * c.H; i++) a[i] = 0x7fc1;
        for (size_t i = 0; i < (size_t)c.H * c.I; i++) b[i] = 0x7fc1;
    }
    const size_t n = (size_t)c.rows * c.H;
    float *base = xalloc(n * 4), *got = xalloc(n * 4);
    fill(base, n, -1, 1);
    kern_pool *pool = kern_pool_create(2);
    ffn_run(&c, pool, 3, base, got);
    for (size_t i = 0; i < n; i++) assert_false(isnan(got[i]));
    assert_memory_equal(got + 3 * c.H, base + 3 * c.H, (size_t)c.H * 4); /* row past n untouched */
    kern_pool_destroy(pool);
    free(base), free(got);
    ffn_free(&c);
}

/* Runs an FFN whose ids[at] was set to ids[from] (from < 0: to E, out of range) in a child; the CPU
 * kernel must abort before touching out. */
static void expect_ffn_abort(int at, int from)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGABRT, SIG_DFL);
        fclose(stderr);
        ffn_case c;
        ffn_init(&c, 32, 16, 4, 2, 2, KERN_DT_F32);
        c.ids[at] = from < 0 ? c.E : c.ids[from];
        float *o = xalloc((size_t)c.rows * c.H * 4);
        ffn_run(&c, NULL, 2, o, o + 0);
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}

/* An expert id out of range, or the same expert twice in a row, is a bug of the op that wrote it
 * (KOP_MOE_ROUTE writes neither; the CUDA kernels size an expert's group by max_rows, so both
 * backends refuse a repeat): the CPU kernel aborts. */
static void test_ffn_bad_id_aborts(void **state)
{
    (void)state;
    expect_ffn_abort(1, -1);
    expect_ffn_abort(3, 2); /* row 1's second slot = its first */
}

/* ---- FP8 experts --------------------------------------------------------------------------------------- */

/* A random e4m3 code, never a NaN code (0x7f / 0xff) */
static uint8_t rnd_e4m3(void)
{
    uint8_t q;
    do q = (uint8_t)rnd_u64();
    while ((q & 0x7f) == 0x7f);
    return q;
}

/* Dequantizes one stacked matrix [rows, K] of codes q with scales s [rows / b0, ceil(K / b1)] into
 * deq: kern_fp8_to_f32(q) * s, one rounded f32 multiply (the contract's weight). */
static void fp8_deq(float *deq, const uint8_t *q, const float *s, size_t rows, int K, int b0, int b1)
{
    const size_t sk = (size_t)((K + b1 - 1) / b1);
    for (size_t n = 0; n < rows; n++)
        for (int k = 0; k < K; k++) {
            const float w = kern_fp8_to_f32(q[n * (size_t)K + (size_t)k]);
            const float sc = s[n / (size_t)b0 * sk + (size_t)(k / b1)];
            deq[n * (size_t)K + (size_t)k] = w * sc;
        }
}

/* q: an FP8 case (codes, scales in (2^-20, 2^7): a different scale per block); f: its f32 twin
 * over the dequantized weights, sharing h, ids, wts and the scratch (free q's weights, then f). */
static void ffn_fp8_init(ffn_case *q, ffn_case *f, int H, int I, int E, int k, int rows, int b0, int b1)
{
    ffn_init(f, H, I, E, k, rows, KERN_DT_F32);
    *q = *f;
    q->dt = KERN_DT_FP8, q->b0 = b0, q->b1 = b1;
    const size_t n13 = (size_t)E * 2 * I * H, n2 = (size_t)E * H * I;
    q->w13 = xalloc(n13);
    q->w2 = xalloc(n2);
    q->s13 = xalloc(fp8_s13_floats(q) * 4);
    q->s2 = xalloc(fp8_s2_floats(q) * 4);
    for (size_t i = 0; i < n13; i++) ((uint8_t *)q->w13)[i] = rnd_e4m3();
    for (size_t i = 0; i < n2; i++) ((uint8_t *)q->w2)[i] = rnd_e4m3();
    for (size_t i = 0; i < fp8_s13_floats(q); i++) q->s13[i] = ldexpf(rnd_f(1.0f, 2.0f), (int)(rnd_u64() % 26) - 19);
    for (size_t i = 0; i < fp8_s2_floats(q); i++) q->s2[i] = ldexpf(rnd_f(1.0f, 2.0f), (int)(rnd_u64() % 26) - 19);
    fp8_deq(f->w13, q->w13, q->s13, (size_t)E * 2 * I, H, b0, b1);
    fp8_deq(f->w2, q->w2, q->s2, (size_t)E * H, I, b0, b1);
}

static void ffn_fp8_free(ffn_case *q, ffn_case *f)
{
    free(q->w13), free(q->w2), free(q->s13), free(q->s2);
    ffn_free(f);
}

/* H, I, E, k, b0, b1: every shape but the last (whole blocks) has H or I (or both) not a multiple of
 * b1 (a partial column block), several a k tail (K % 16 != 0) too */
static const int fp8_shapes[][6] = {
    {48, 32, 1, 1, 16, 32},  {40, 24, 2, 1, 1, 16},  {64, 96, 4, 2, 32, 64}, {96, 80, 8, 3, 16, 64},
    {33, 17, 6, 6, 1, 32},   {160, 64, 8, 8, 32, 64}, {32, 48, 5, 2, 16, 32}, {200, 16, 7, 4, 1, 64},
    {64, 32, 3, 3, 32, 16},
};
static const int fp8_row_counts[] = {1, 3, 17};

static void test_ffn_fp8_dequantized(void **state)
{
    (void)state;
    const int(*shapes)[6] = fp8_shapes;
    const size_t nshapes = sizeof fp8_shapes / sizeof fp8_shapes[0];
    const int *row_counts = fp8_row_counts;
    const size_t nrc = sizeof fp8_row_counts / sizeof fp8_row_counts[0];
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list_of(isas, 1);
    kern_cpu_set_min_parallel_work(0);
    kern_pool *p2 = kern_pool_create(2);
    for (size_t si = 0; si < nshapes; si++)
        for (size_t ri = 0; ri < nrc; ri++) {
            const int *sh = shapes[si], rows = row_counts[ri];
            ffn_case q, f;
            ffn_fp8_init(&q, &f, sh[0], sh[1], sh[2], sh[3], rows, sh[4], sh[5]);
            const size_t n = (size_t)rows * q.H;
            float *base = xalloc(n * 4), *ref = xalloc(n * 4), *got = xalloc(n * 4);
            fill(base, n, -2, 2);
            assert_int_equal(kern_simd_force(KERN_ISA_SCALAR), 0);
            ffn_run(&f, NULL, rows, base, ref); /* f32 over the dequantized weights, scalar, 1 thread */
            for (size_t i = 0; i < n; i++)
                if (!isfinite(ref[i])) fail_msg("shape %zu rows %d: reference not finite at %zu", si, rows, i);
            for (int ii = 0; ii < nisa; ii++)
                for (int threads = 1; threads <= 2; threads++) {
                    assert_int_equal(kern_simd_force(isas[ii]), 0);
                    ffn_run(&q, threads == 2 ? p2 : NULL, rows, base, got);
                    for (size_t i = 0; i < n; i++)
                        if (fbits(got[i]) != fbits(ref[i]))
                            fail_msg("H %d I %d E %d k %d b %dx%d rows %d isa %d threads %d: out[%zu] %.9g, f32 over "
                                     "the dequantized weights %.9g",
                                     q.H, q.I, q.E, q.k, q.b0, q.b1, rows, (int)isas[ii], threads, i, (double)got[i],
                                     (double)ref[i]);
                }
            kern_simd_force(isas[nisa - 1]);
            free(base), free(ref), free(got);
            ffn_fp8_free(&q, &f);
        }
    kern_pool_destroy(p2);
}

/* FP8 experts with the pool in a bf16-activation mode (pairs, or amx: FP8 runs the pairs order in
 * both, kern.h): bitwise the bf16-expert op in the pairs order over the bf16 weights
 * kern_f32_to_bf16_daz(dequantized), on every ISA (emulations and native vdpbf16ps), 1 and 2
 * threads, and not the f32-activation result. */
static void test_ffn_fp8_pairs(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list_of(isas, 1);
    kern_cpu_set_min_parallel_work(0);
    kern_pool *pools[2] = {kern_pool_create(1), kern_pool_create(2)};
    for (size_t si = 0; si < sizeof fp8_shapes / sizeof fp8_shapes[0]; si++)
        for (size_t ri = 0; ri < sizeof fp8_row_counts / sizeof fp8_row_counts[0]; ri++) {
            const int *sh = fp8_shapes[si], rows = fp8_row_counts[ri];
            ffn_case q, f, b;
            ffn_fp8_init(&q, &f, sh[0], sh[1], sh[2], sh[3], rows, sh[4], sh[5]);
            b = f; /* f's routing and rows, bf16 weights of its dequantized values */
            b.dt = KERN_DT_BF16;
            const size_t n13 = (size_t)f.E * 2 * f.I * f.H, n2 = (size_t)f.E * f.H * f.I;
            uint16_t *b13 = xalloc(n13 * 2), *b2 = xalloc(n2 * 2);
            for (size_t i = 0; i < n13; i++) b13[i] = kern_f32_to_bf16_daz(((const float *)f.w13)[i]);
            for (size_t i = 0; i < n2; i++) b2[i] = kern_f32_to_bf16_daz(((const float *)f.w2)[i]);
            b.w13 = b13, b.w2 = b2;
            const size_t n = (size_t)rows * q.H;
            float *base = xalloc(n * 4), *ref = xalloc(n * 4), *got = xalloc(n * 4), *f32a = xalloc(n * 4);
            fill(base, n, -2, 2);
            assert_int_equal(kern_simd_force(KERN_ISA_SCALAR), 0);
            kern_pool_set_bf16_activations(pools[0], KERN_BF16_ACT_PAIRS);
            ffn_run(&b, pools[0], rows, base, ref);
            kern_pool_set_bf16_activations(pools[0], KERN_BF16_ACT_OFF);
            ffn_run(&q, pools[0], rows, base, f32a);
            assert_true(memcmp(ref, f32a, n * 4) != 0);
            for (int ii = 0; ii < nisa; ii++)
                for (int t = 0; t < 2; t++)
                    for (int mode = KERN_BF16_ACT_PAIRS; mode <= KERN_BF16_ACT_AMX; mode++) {
                        assert_int_equal(kern_simd_force(isas[ii]), 0);
                        kern_pool_set_bf16_activations(pools[t], mode);
                        ffn_run(&q, pools[t], rows, base, got);
                        kern_pool_set_bf16_activations(pools[t], KERN_BF16_ACT_OFF);
                        for (size_t i = 0; i < n; i++)
                            if (fbits(got[i]) != fbits(ref[i]))
                                fail_msg("H %d I %d E %d k %d b %dx%d rows %d isa %d threads %d mode %d: out[%zu] %.9g, "
                                         "bf16 pairs over the rounded dequantized weights %.9g",
                                         q.H, q.I, q.E, q.k, q.b0, q.b1, rows, (int)isas[ii], t + 1, mode, i,
                                         (double)got[i], (double)ref[i]);
                    }
            kern_simd_force(isas[nisa - 1]);
            free(base), free(ref), free(got), free(f32a), free(b13), free(b2);
            ffn_fp8_free(&q, &f);
        }
    kern_pool_destroy(pools[0]);
    kern_pool_destroy(pools[1]);
}

/* The scale rows of experts no live row chose are NaN: the output has none (never read), and the
 * output equals the run with those scales intact. */
static void test_ffn_fp8_unread_experts(void **state)
{
    (void)state;
    ffn_case q, f;
    ffn_fp8_init(&q, &f, 64, 48, 8, 2, 4, 16, 32);
    const size_t n = (size_t)q.rows * q.H;
    float *base = xalloc(n * 4), *want = xalloc(n * 4), *got = xalloc(n * 4);
    fill(base, n, -1, 1);
    kern_pool *pool = kern_pool_create(2);
    ffn_run(&q, pool, 2, base, want);
    int used[KERN_MAX_EXPERTS] = {0};
    for (int i = 0; i < 2 * q.k; i++) used[q.ids[i]] = 1; /* rows 0, 1 live */
    const size_t r13 = (size_t)2 * (q.I / q.b0) * ((q.H + q.b1 - 1) / q.b1), r2 = (size_t)(q.H / q.b0) * ((q.I + q.b1 - 1) / q.b1);
    for (int e = 0; e < q.E; e++) {
        if (used[e]) continue;
        for (size_t i = 0; i < r13; i++) q.s13[(size_t)e * r13 + i] = NAN;
        for (size_t i = 0; i < r2; i++) q.s2[(size_t)e * r2 + i] = NAN;
    }
    ffn_run(&q, pool, 2, base, got);
    for (size_t i = 0; i < n; i++) assert_false(isnan(got[i]));
    assert_memory_equal(got, want, n * 4);
    kern_pool_destroy(pool);
    free(base), free(want), free(got);
    ffn_fp8_free(&q, &f);
}

/* kern_validate: an FP8 MoE FFN with bad b0 / b1 or missing / short scale tables is malformed. */
static void test_validate_fp8(void **state)
{
    (void)state;
    char why[160];
    ffn_case q, f;
    ffn_fp8_init(&q, &f, 48, 32, 4, 2, 2, 16, 32); /* S13 [4*64/16, 2], S2 [4*48/16, 1] */
    float *out = xalloc((size_t)q.rows * q.H * 4);
    int32_t nr = 2;
    kern_op op = {.kind = KOP_MOE_FFN};
    op.buf[0] = B(q.h, (size_t)q.rows * q.H * 4);
    op.buf[1] = B(q.w13, (size_t)q.E * 2 * q.I * q.H);
    op.buf[2] = B(q.w2, (size_t)q.E * q.H * q.I);
    op.buf[3] = B(q.ids, (size_t)q.rows * q.k * 4);
    op.buf[4] = B(q.wts, (size_t)q.rows * q.k * 4);
    op.buf[5] = B(out, (size_t)q.rows * q.H * 4);
    op.buf[6] = B(&nr, 4);
    op.buf[7] = B(q.scratch, kern_moe_scratch_bytes(q.E, q.k, q.H, q.I, q.rows));
    op.buf[8] = B(q.s13, fp8_s13_floats(&q) * 4);
    op.buf[9] = B(q.s2, fp8_s2_floats(&q) * 4);
    assert_int_equal(fp8_s13_floats(&q), 4 * 4 * 2);
    assert_int_equal(fp8_s2_floats(&q), 4 * 3 * 1);
    op.p[0] = q.H, op.p[1] = q.I, op.p[2] = q.E, op.p[3] = q.k, op.p[4] = q.rows, op.p[5] = KERN_DT_FP8;
    op.p[6] = 16, op.p[7] = 32;
    if (kern_validate(&op, why, sizeof why) != 0) fail_msg("valid FP8 op refused: %s", why);
    const kern_op good = op;
    /* b0 */
    op.p[6] = 0;
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[6] = -16;
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[6] = 3; /* divides neither I 32 nor H 48... */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[6] = 32; /* divides I 32, not H 48 */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[6] = 24; /* divides H 48, not I 32 */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op = good;
    /* b1 */
    op.p[7] = 0;
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[7] = 8; /* below 16 */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[7] = 24; /* not a power of two */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[7] = 64; /* a larger b1 is fine: fewer scale columns (the tables are big enough) */
    if (kern_validate(&op, why, sizeof why) != 0) fail_msg("b1 64 refused: %s", why);
    op = good;
    /* the scale tables: missing, one float short */
    op.buf[8] = B(NULL, 0);
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op = good;
    op.buf[9] = B(NULL, 0);
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op = good;
    op.buf[8].bytes -= 4;
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op = good;
    op.buf[9].bytes -= 4;
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op = good;
    op.p[6] = 8; /* b0 8: twice the scale rows, the tables too small */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op = good;
    op.buf[1].bytes -= 1; /* W13 one code short */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op = good;
    /* f32 weights: slots 8 and 9 must be unused */
    op.p[5] = KERN_DT_F32, op.p[6] = op.p[7] = 0;
    op.buf[1] = B(f.w13, (size_t)f.E * 2 * f.I * f.H * 4);
    op.buf[2] = B(f.w2, (size_t)f.E * f.H * f.I * 4);
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.buf[8] = B(NULL, 0);
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.buf[9] = B(NULL, 0);
    if (kern_validate(&op, why, sizeof why) != 0) fail_msg("f32 op refused: %s", why);
    free(out);
    ffn_fp8_free(&q, &f);
}

static void test_validate(void **state)
{
    (void)state;
    char why[160];
    float l[8], w[2];
    int32_t ids[2], n = 1;
    kern_op op = route_op(l, ids, w, &n, 8, 2, 1, 1);
    assert_int_equal(kern_validate(&op, why, sizeof why), 0);
    op.p[1] = 9; /* k > E */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    op.p[1] = 2;
    op.buf[2] = B(ids, 8); /* weights aliasing the ids */
    assert_int_equal(kern_validate(&op, why, sizeof why), -1);
    ffn_case c;
    ffn_init(&c, 32, 16, 4, 2, 2, KERN_DT_F32);
    kern_op f = {.kind = KOP_MOE_FFN};
    float *out = xalloc((size_t)c.rows * c.H * 4);
    int32_t nr = 2;
    f.buf[0] = B(c.h, (size_t)c.rows * c.H * 4);
    f.buf[1] = B(c.w13, (size_t)c.E * 2 * c.I * c.H * 4);
    f.buf[2] = B(c.w2, (size_t)c.E * c.H * c.I * 4);
    f.buf[3] = B(c.ids, (size_t)c.rows * c.k * 4);
    f.buf[4] = B(c.wts, (size_t)c.rows * c.k * 4);
    f.buf[5] = B(out, (size_t)c.rows * c.H * 4);
    f.buf[6] = B(&nr, 4);
    f.buf[7] = B(c.scratch, kern_moe_scratch_bytes(c.E, c.k, c.H, c.I, c.rows));
    f.p[0] = c.H, f.p[1] = c.I, f.p[2] = c.E, f.p[3] = c.k, f.p[4] = c.rows, f.p[5] = KERN_DT_F32;
    assert_int_equal(kern_validate(&f, why, sizeof why), 0);
    f.buf[7].bytes -= 4; /* scratch too small */
    assert_int_equal(kern_validate(&f, why, sizeof why), -1);
    f.buf[7].bytes += 4;
    f.buf[1].bytes -= 4; /* W13 too small */
    assert_int_equal(kern_validate(&f, why, sizeof why), -1);
    f.buf[1].bytes += 4;
    f.buf[5] = f.buf[0]; /* out aliasing h */
    assert_int_equal(kern_validate(&f, why, sizeof why), -1);
    free(out);
    ffn_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_reference), cmocka_unit_test(test_route_exact),
        cmocka_unit_test(test_route_ties),      cmocka_unit_test(test_ffn_composed),
        cmocka_unit_test(test_ffn_invariance),  cmocka_unit_test(test_ffn_unread_experts),
        cmocka_unit_test(test_ffn_bad_id_aborts), cmocka_unit_test(test_validate),
        cmocka_unit_test(test_ffn_fp8_dequantized),
        cmocka_unit_test(test_ffn_fp8_pairs), cmocka_unit_test(test_ffn_fp8_unread_experts),
        cmocka_unit_test(test_validate_fp8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
