/* tests/unit/test_kernels.c — CPU kernels against plain reference loops (double accumulation),
 * plus the bitwise-independence contract of kern.h: a row's result must not depend on how many
 * rows share the op, on the thread split, or (kern_cpu.h) on the instruction set used.
 *
 * Every live-row test poisons rows past n_rows with NaN and checks they come back untouched.
 * GS_KERN_BENCH=1 adds a timing report (GEMV weight bandwidth vs memcpy, pool dispatch latency);
 * it prints numbers and asserts nothing about them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/kern_cpu.h"
#include "kernels/kern.h"
#include "test_kern_util.h"

#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------------------ */

static int rnd_int(int n) { return (int)(rnd_u64() % (uint64_t)n); }
static float *falloc(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(p);
    return p;
}
static void poison(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}
static void assert_all_nan(const float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isnan(p[i])) fail_msg("element %zu past n_rows was written (%g)", i, (double)p[i]);
}
static void assert_close(double got, double ref, double scale, double rtol, const char *what, int a, int b)
{
    double tol = rtol * (scale > 0 ? scale : 0) + 1e-30;
    if (!(fabs(got - ref) <= tol))
        fail_msg("%s[%d,%d]: got %.9g want %.9g (tol %.3g)", what, a, b, got, ref, tol);
}

/* The ISAs this CPU can run, best last (AVX512BF16 at most: the AMX table differs from it only in
 * the amx-mode matmul, test_matmul_amx's subject). */
static int isa_list(kern_isa *out) { return isa_list_of(out, 0); }
static void isa_reset(void)
{
    kern_isa l[TEST_ISA_CAP];
    isa_list(l);
}

/* ---- names, bf16 ------------------------------------------------------------------------------- */

static void test_op_names(void **state)
{
    (void)state;
    assert_string_equal(kern_op_name(KOP_EMBED), "embed");
    assert_string_equal(kern_op_name(KOP_MATMUL), "matmul");
    assert_string_equal(kern_op_name(KOP_GATHER_ROWS), "gather_rows");
    for (int k = 0; k < KOP_COUNT; k++) assert_string_not_equal(kern_op_name((kern_op_kind)k), "unknown");
    assert_string_equal(kern_op_name(KOP_COUNT), "unknown");
}

static int same_d(double a, double b) { return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b)); }

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(kern_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(kern_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(kern_f32_to_bf16(0.0f), 0x0000);
    assert_int_equal(kern_f32_to_bf16(-0.0f), 0x8000);
    /* ties go to even, anything above a tie rounds up */
    assert_int_equal(kern_f32_to_bf16(bitsf(0x3f808000u)), 0x3f80);
    assert_int_equal(kern_f32_to_bf16(bitsf(0x3f818000u)), 0x3f82);
    assert_int_equal(kern_f32_to_bf16(bitsf(0x3f808001u)), 0x3f81);
    assert_int_equal(kern_f32_to_bf16(bitsf(0x3f807fffu)), 0x3f80);
    /* overflow rounds to infinity; infinities and NaN survive, NaN stays NaN (quiet) */
    assert_int_equal(kern_f32_to_bf16(bitsf(0x7f7fffffu)), 0x7f80);
    assert_int_equal(kern_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(kern_f32_to_bf16(-INFINITY), 0xff80);
    assert_true(isnan(kern_bf16_to_f32(kern_f32_to_bf16(NAN))));
    assert_true(isnan(kern_bf16_to_f32(kern_f32_to_bf16(bitsf(0x7f800001u))))); /* low-bit payload */
    /* every bf16 pattern round-trips exactly (NaN to NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kern_bf16_to_f32((uint16_t)h);
        assert_int_equal(fbits(f), h << 16);
        if (isnan(f))
            assert_true(isnan(kern_bf16_to_f32(kern_f32_to_bf16(f))));
        else
            assert_int_equal(kern_f32_to_bf16(f), h);
    }
    /* the result is the nearest bf16 (random values) */
    for (int i = 0; i < 100000; i++) {
        float f = bitsf((uint32_t)rnd_u64() & 0x7effffffu); /* finite, far from overflow */
        uint16_t h = kern_f32_to_bf16(f);
        double err = fabs((double)kern_bf16_to_f32(h) - f);
        double up = fabs((double)kern_bf16_to_f32((uint16_t)(h + 1)) - f);
        double dn = fabs((double)kern_bf16_to_f32((uint16_t)(h - 1)) - f);
        assert_false(up < err || dn < err); /* dn is NaN for h == 0: compares false */
    }
}

/* ---- pool --------------------------------------------------------------------------------------- */

typedef struct {
    atomic_int calls[8];
    atomic_int bad;
    int want_n;
} pool_probe;

static void probe_fn(void *ctx, int tid, int n)
{
    pool_probe *p = ctx;
    if (n != p->want_n || tid < 0 || tid >= n) atomic_fetch_add(&p->bad, 1);
    else atomic_fetch_add(&p->calls[tid], 1);
}

static void test_pool(void **state)
{
    (void)state;
    for (int nt = 1; nt <= 4; nt++) {
        kern_pool *pool = kern_pool_create(nt);
        assert_non_null(pool);
        assert_int_equal(kern_pool_threads(pool), nt);
        pool_probe pr = {.want_n = nt};
        const int runs = 20000;
        for (int i = 0; i < runs; i++) kern_pool_run(pool, probe_fn, &pr);
        assert_int_equal(atomic_load(&pr.bad), 0);
        for (int t = 0; t < nt; t++) assert_int_equal(atomic_load(&pr.calls[t]), runs);
        /* after idling past the spin window the workers sleep; a run must still wake them all */
        kern_pool_set_spin_us(pool, 50);
        for (int rep = 0; rep < 3; rep++) {
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
            kern_pool_run(pool, probe_fn, &pr);
            kern_pool_run(pool, probe_fn, &pr);
        }
        for (int t = 0; t < nt; t++) assert_int_equal(atomic_load(&pr.calls[t]), runs + 6);
        /* zero spin: workers go straight to sleep between runs */
        kern_pool_set_spin_us(pool, 0);
        for (int i = 0; i < 2000; i++) kern_pool_run(pool, probe_fn, &pr);
        for (int t = 0; t < nt; t++) assert_int_equal(atomic_load(&pr.calls[t]), runs + 2006);
        kern_pool_destroy(pool);
    }
    kern_pool *pool = kern_pool_create(0); /* one per online CPU */
    assert_non_null(pool);
    assert_true(kern_pool_threads(pool) >= 1);
    kern_pool_destroy(pool);
    kern_pool_destroy(NULL);
    /* a NULL pool runs inline */
    pool_probe pr = {.want_n = 1};
    kern_pool_run(NULL, probe_fn, &pr);
    assert_int_equal(atomic_load(&pr.calls[0]), 1);
}

/* ---- matmul ------------------------------------------------------------------------------------- */

typedef struct {
    int K, N, max_rows, bf16, accumulate, has_bias;
    float *x, *bias, *out;
    void *w;
    float *wf; /* the weights as f32 (decoded bf16) for the reference */
    int32_t n_rows;
} mm_case;

static void mm_init(mm_case *c, int K, int N, int max_rows, int bf16, int has_bias, int accumulate)
{
    *c = (mm_case){.K = K, .N = N, .max_rows = max_rows, .bf16 = bf16, .accumulate = accumulate,
                   .has_bias = has_bias};
    c->x = falloc((size_t)max_rows * K);
    c->out = falloc((size_t)max_rows * N);
    c->wf = falloc((size_t)N * K);
    c->bias = has_bias ? falloc((size_t)N) : NULL;
    fill(c->x, (size_t)max_rows * K, -1.0f, 1.0f);
    fill(c->wf, (size_t)N * K, -0.5f, 0.5f);
    if (has_bias) fill(c->bias, (size_t)N, -1.0f, 1.0f);
    if (bf16) {
        uint16_t *w = malloc((size_t)N * K * 2);
        assert_non_null(w);
        for (size_t i = 0; i < (size_t)N * K; i++) {
            w[i] = kern_f32_to_bf16(c->wf[i]);
            c->wf[i] = kern_bf16_to_f32(w[i]);
        }
        c->w = w;
    } else {
        c->w = c->wf;
    }
}
static void mm_free(mm_case *c)
{
    if (c->w != c->wf) free(c->w);
    free(c->wf);
    free(c->x);
    free(c->out);
    free(c->bias);
}
static kern_op mm_op(mm_case *c)
{
    kern_op op = {.kind = KOP_MATMUL};
    size_t ws = c->bf16 ? 2 : 4;
    op.buf[0] = B(c->x, (size_t)c->max_rows * c->K * 4);
    op.buf[1] = B(c->w, (size_t)c->N * c->K * ws);
    if (c->bias) op.buf[2] = B(c->bias, (size_t)c->N * 4);
    op.buf[3] = B(c->out, (size_t)c->max_rows * c->N * 4);
    op.buf[4] = B(&c->n_rows, 4);
    op.p[0] = c->K;
    op.p[1] = c->N;
    op.p[2] = c->max_rows;
    op.p[3] = c->bf16 ? KERN_DT_BF16 : KERN_DT_F32;
    op.p[4] = c->accumulate;
    return op;
}

static void mm_check_case(kern_pool *pool, int K, int N, int M, int max_rows, int bf16, int bias, int acc)
{
    mm_case c;
    mm_init(&c, K, N, max_rows, bf16, bias, acc);
    c.n_rows = M;
    float *prev = falloc((size_t)M * N);
    fill(c.out, (size_t)M * N, -2.0f, 2.0f);
    memcpy(prev, c.out, (size_t)M * N * 4);
    poison(c.out + (size_t)M * N, (size_t)(max_rows - M) * N);
    kern_op op = mm_op(&c);
    kern_cpu_exec(pool, &op);
    for (int r = 0; r < M; r++)
        for (int n = 0; n < N; n++) {
            double s = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double t = (double)c.x[(size_t)r * K + k] * c.wf[(size_t)n * K + k];
                s += t;
                mag += fabs(t);
            }
            if (bias) {
                s += c.bias[n];
                mag += fabs(c.bias[n]);
            }
            if (acc) {
                s += prev[(size_t)r * N + n];
                mag += fabs(prev[(size_t)r * N + n]);
            }
            assert_close(c.out[(size_t)r * N + n], s, mag, 1e-5, "matmul", r, n);
        }
    assert_all_nan(c.out + (size_t)M * N, (size_t)(max_rows - M) * N);
    free(prev);
    mm_free(&c);
}

static void test_matmul_reference(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    int nisa = isa_list(isas);
    size_t old = kern_cpu_set_min_parallel_work(0);
    kern_pool *pools[2] = {kern_pool_create(1), kern_pool_create(3)};
    static const int Ks[] = {1, 7, 16, 33, 100, 257};
    static const int Ns[] = {1, 5, 17, 67};
    for (int ii = 0; ii < nisa; ii++) {
        assert_int_equal(kern_simd_force(isas[ii]), 0);
        for (int ki = 0; ki < 6; ki++)
            for (int ni = 0; ni < 4; ni++)
                for (int variant = 0; variant < 8; variant++) {
                    int bf16 = variant & 1, bias = (variant >> 1) & 1, acc = (variant >> 2) & 1;
                    int M = 1 + rnd_int(17);
                    int max_rows = M + rnd_int(3);
                    kern_pool *pool = pools[rnd_int(2)];
                    mm_check_case(pool, Ks[ki], Ns[ni], M, max_rows, bf16, bias, acc);
                }
        /* every row count 1..17 (all remainder tiles) on one shape, and n_rows == 0 */
        for (int M = 0; M <= 17; M++) mm_check_case(pools[1], 45, 29, M, 18, 1, 1, 0);
        /* bigger than one row block (MM_MB = 64 rows) and than a tile of columns */
        mm_check_case(pools[1], 64, 40, 70, 72, 1, 0, 1);
    }
    isa_reset();
    kern_pool_destroy(pools[0]);
    kern_pool_destroy(pools[1]);
    kern_cpu_set_min_parallel_work(old);
}

/* Row r of an M-row run == the same row run alone, for every pool size and ISA, bitwise. K = 1024
 * with f32 weights: from 16 rows on, the weights are read from a packed panel (simd_body.inc). */
static void test_matmul_bitwise(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    int nisa = isa_list(isas);
    size_t old = kern_cpu_set_min_parallel_work(0);
    const int M = 17;
    for (int bk = 0; bk < 3; bk++) {
        const int bf16 = bk == 1, K = bk == 2 ? 1024 : 300;
        mm_case c;
        mm_init(&c, K, 77, M, bf16, 1, 0);
        float *golden = falloc((size_t)M * c.N);
        int have_golden = 0;
        for (int ii = 0; ii < nisa; ii++) {
            assert_int_equal(kern_simd_force(isas[ii]), 0);
            for (int nt = 1; nt <= 3; nt++) {
                kern_pool *pool = kern_pool_create(nt);
                for (int m = 1; m <= M; m += (m < 8 ? 1 : 4)) { /* batched runs, m rows */
                    c.n_rows = m;
                    kern_op op = mm_op(&c);
                    kern_cpu_exec(pool, &op);
                    if (!have_golden) {
                        /* golden: every row run alone, single thread, first ISA */
                        kern_op op1 = op;
                        float *xsave = c.x, *osave = c.out;
                        for (int r = 0; r < M; r++) {
                            c.x = xsave + (size_t)r * c.K;
                            c.out = golden + (size_t)r * c.N;
                            c.n_rows = 1;
                            c.max_rows = 1;
                            op1 = mm_op(&c);
                            kern_cpu_exec(NULL, &op1);
                        }
                        c.x = xsave;
                        c.out = osave;
                        c.max_rows = M;
                        have_golden = 1;
                    }
                    if (memcmp(c.out, golden, (size_t)m * c.N * 4) != 0)
                        fail_msg("matmul not bitwise row-independent: isa %d threads %d m %d bf16 %d",
                                 (int)isas[ii], nt, m, bf16);
                }
                kern_pool_destroy(pool);
            }
        }
        free(golden);
        mm_free(&c);
    }
    isa_reset();
    kern_cpu_set_min_parallel_work(old);
}

/* The column-lane GEMM (AVX2 from KERN_CL_MIN_ROWS rows with a pool's scratch, simd_body.inc
 * simd_mm_cl) against the register tiles of the scalar build, bit for bit: k tails, column tails
 * (the last < 16 columns take the tiles), remainder row tiles, bias and accumulate, f32 and bf16
 * weights, and ops cut into windows of rows (K = 4096: the scratch holds 78 rows; 160 rows: two
 * windows of 78, each packed anew, and 4 rows by the tiles). FP8 weights:
 * test_fp8 test_matmul_equals_dequantized. */
static void test_matmul_column_lanes(void **state)
{
    (void)state;
    if (kern_simd_force(KERN_ISA_AVX2) != 0) {
        isa_reset();
        skip(); /* the only ISA with the path; its order is the tiles' (test_matmul_bitwise) */
    }
    size_t old = kern_cpu_set_min_parallel_work(0);
    /* one thread takes every window of an op in turn, so a window packed over another's rows fails
     * there whatever the timing; two threads share the units */
    kern_pool *pools[2] = {kern_pool_create(1), kern_pool_create(2)}, *pool = pools[1];
    /* the first and the 7th shape: exactly KERN_CL_MIN_ROWS rows and one more */
    static const int shapes[][3] = {{16, 16, KERN_CL_MIN_ROWS}, {48, 40, 23},  {300, 77, 31},
                                    {768, 48, 64},  {4096, 20, 100}, {4100, 33, 90},
                                    {33, 16, KERN_CL_MIN_ROWS + 1}, {4096, 17, 160}};
    assert_true(kern_cl_scratch_rows(4096, KERN_POOL_SCRATCH_BYTES) < 100);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int variant = 0; variant < 16; variant++) {
            pool = pools[variant >> 3];
            const int K = shapes[si][0], N = shapes[si][1], M = shapes[si][2];
            const int bf16 = variant & 1, bias = (variant >> 1) & 1, acc = (variant >> 2) & 1;
            mm_case c;
            mm_init(&c, K, N, M, bf16, bias, acc);
            c.n_rows = M;
            float *init = falloc((size_t)M * N), *ref = falloc((size_t)M * N);
            fill(init, (size_t)M * N, -2.0f, 2.0f);
            memcpy(c.out, init, (size_t)M * N * 4);
            kern_op op = mm_op(&c);
            assert_int_equal(kern_simd_force(KERN_ISA_SCALAR), 0);
            kern_cpu_exec(NULL, &op);
            memcpy(ref, c.out, (size_t)M * N * 4);
            memcpy(c.out, init, (size_t)M * N * 4);
            assert_int_equal(kern_simd_force(KERN_ISA_AVX2), 0);
            const long before = kern_cpu_mm_cl_ops();
            kern_cpu_exec(pool, &op);
            assert_int_equal(kern_cpu_mm_cl_ops(), before + 1);
            for (size_t i = 0; i < (size_t)M * N; i++)
                if (memcmp(&c.out[i], &ref[i], 4) != 0)
                    fail_msg("column-lane GEMM K %d N %d M %d bf16 %d bias %d acc %d threads %d: out[%zu, %zu] %.9g, tiles %.9g",
                             K, N, M, bf16, bias, acc, kern_pool_threads(pool), i / (size_t)N, i % (size_t)N, (double)c.out[i], (double)ref[i]);
            free(init);
            free(ref);
            mm_free(&c);
        }
    /* below KERN_CL_MIN_ROWS rows, and without a pool (no scratch), the tiles run */
    mm_case c;
    mm_init(&c, 64, 32, KERN_CL_MIN_ROWS, 0, 0, 0);
    c.n_rows = KERN_CL_MIN_ROWS - 1;
    kern_op op = mm_op(&c);
    const long before = kern_cpu_mm_cl_ops();
    kern_cpu_exec(pool, &op);
    c.n_rows = KERN_CL_MIN_ROWS;
    kern_cpu_exec(NULL, &op);
    assert_int_equal(kern_cpu_mm_cl_ops(), before);
    mm_free(&c);
    kern_pool_destroy(pools[0]);
    kern_pool_destroy(pools[1]);
    isa_reset();
    kern_cpu_set_min_parallel_work(old);
}

/* ---- bf16-activation matmul (the "bf16 pairs" scheme of kern_cpu.h) --------------------------- */

/* A float drawn from every class: normal values near 1, huge and tiny normals, denormals, zeros,
 * infinities, NaNs (fully random bits), so rounding and flushing edge cases all occur. */
static float rnd_any_float(void)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)rnd_u64()};
    switch (rnd_int(4)) {
    case 0: v.u = (v.u & 0x807fffffu) | (uint32_t)(120 + rnd_int(14)) << 23; break; /* near 1 */
    case 1: v.u &= 0x807fffffu; break;                                              /* denormal or zero */
    case 2: v.u = (v.u & 0x807fffffu) | (uint32_t)(1 + rnd_int(3)) << 23; break;    /* tiny normal */
    default: break;                                                                 /* anything */
    }
    return v.f;
}

#ifdef KERN_HAVE_X86
#include <immintrin.h>
__attribute__((target("avx512f,avx512bf16"))) static void cvt_native(const float *x, uint16_t *out)
{
    _mm512_storeu_si512((void *)out, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x)));
}
#endif

/* kern_f32_to_bf16_daz is what vcvtne2ps2bf16 computes, on every class of input (where the CPU has
 * the instruction; elsewhere the matmul tests below still check the emulations against each
 * other). */
static void test_bf16_round_daz(void **state)
{
    (void)state;
    /* fixed points: RNE ties, denormals flushed with their sign, NaN quieted, overflow to inf */
    assert_int_equal(kern_f32_to_bf16_daz(1.0f), 0x3f80);
    union {
        uint32_t u;
        float f;
    } v;
    v.u = 0x3f808000u; /* tie, even below */
    assert_int_equal(kern_f32_to_bf16_daz(v.f), 0x3f80);
    v.u = 0x3f818000u; /* tie, odd below: up */
    assert_int_equal(kern_f32_to_bf16_daz(v.f), 0x3f82);
    v.u = 0x807fffffu; /* largest negative denormal: -0, not the nearest normal */
    assert_int_equal(kern_f32_to_bf16_daz(v.f), 0x8000);
    v.u = 0x7f800001u; /* signalling NaN -> quiet */
    assert_int_equal(kern_f32_to_bf16_daz(v.f), 0x7fc0);
    v.u = 0x7f7fffffu; /* FLT_MAX rounds to inf */
    assert_int_equal(kern_f32_to_bf16_daz(v.f), 0x7f80);
#ifdef KERN_HAVE_X86
    if (!__builtin_cpu_supports("avx512bf16")) {
        print_message("no avx512bf16 here: the native rounding is not compared\n");
        return;
    }
    float x[32];
    uint16_t got[32];
    for (int it = 0; it < 20000; it++) {
        for (int i = 0; i < 32; i++) x[i] = rnd_any_float();
        cvt_native(x, got);
        for (int i = 0; i < 32; i++) {
            memcpy(&v.u, &x[i], 4);
            if (got[i] != kern_f32_to_bf16_daz(x[i]))
                fail_msg("vcvtne2ps2bf16(%08x) = %04x, kern_f32_to_bf16_daz gives %04x", v.u, got[i],
                         kern_f32_to_bf16_daz(x[i]));
        }
    }
#endif
}

/* The scheme computed the slow, obvious way: out[r, n] of the bf16-pairs matmul. */
static float bf16x_ref_one(const float *x, const uint16_t *w, int K)
{
#define FLUSH kern_flush_denormal
    float lane[16] = {0};
    const int K32 = K & ~31;
    for (int k0 = 0; k0 < K32; k0 += 32)
        for (int i = 0; i < 16; i++) {
            const int k = k0 + 2 * i;
            float xo = kern_bf16_to_f32(kern_f32_to_bf16_daz(x[k + 1])), xe = kern_bf16_to_f32(kern_f32_to_bf16_daz(x[k]));
            float wo = FLUSH(kern_bf16_to_f32(w[k + 1])), we = FLUSH(kern_bf16_to_f32(w[k]));
            lane[i] = FLUSH(fmaf(xo, wo, lane[i]));
            lane[i] = FLUSH(fmaf(xe, we, lane[i]));
        }
#undef FLUSH
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = lane[i] + lane[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    float s = (s4[0] + s4[2]) + (s4[1] + s4[3]);
    for (int k = K32; k < K; k++) s = s + kern_bf16_to_f32(kern_f32_to_bf16_daz(x[k])) * kern_bf16_to_f32(w[k]);
    return s;
}

/* Every ISA (emulated and, where the CPU has it, native vdpbf16ps), every thread count, every row
 * count: each output bitwise equal to bf16x_ref_one (the scheme written out), so rows are batch
 * invariant and the ISAs identical; on data of every float class (denormals, NaN, inf included)
 * and on ordinary data, where the result is also within f32 rounding of a double-precision sum
 * over the bf16-rounded activations (an independent check of the arithmetic). Mode off: the
 * pool's matmul is the f32-activation scheme, unchanged. */
static void test_matmul_bf16_activations(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list(isas);
    size_t old = kern_cpu_set_min_parallel_work(0);
    kern_pool *pools[3] = {kern_pool_create(1), kern_pool_create(2), kern_pool_create(3)};
    for (int i = 0; i < 3; i++) kern_pool_set_bf16_activations(pools[i], 1);
    /* K % 32 == 0 with 2+ rows: the rows rounded once into the pool's scratch (simd_body.inc);
     * 70 rows: two row blocks */
    static const int Ks[] = {32, 45, 64, 100, 775, 1024};
    static const int Ns[] = {1, 7, 19, 40};
    for (int special = 0; special <= 2; special++)
        for (int ki = 0; ki < 6; ki++)
            for (int ni = 0; ni < 4; ni++) {
                const int K = Ks[ki], N = Ns[ni], M = ki >= 4 ? 70 : 1 + rnd_int(17), bias = rnd_int(2);
                mm_case c;
                mm_init(&c, K, N, M, 1, bias, 0);
                uint16_t *w = (uint16_t *)c.w;
                if (special == 1) { /* a third of the values from every class */
                    for (size_t i = 0; i < (size_t)M * K; i++)
                        if (rnd_int(3) == 0) c.x[i] = rnd_any_float();
                    for (size_t i = 0; i < (size_t)N * K; i++)
                        if (rnd_int(3) == 0) w[i] = kern_f32_to_bf16(rnd_any_float());
                }
                if (special == 2) { /* products and sums around FLT_MIN: the flushes decide the bits */
                    for (size_t i = 0; i < (size_t)M * K; i++)
                        c.x[i] = rnd_int(8) == 0 ? 1.0f : ldexpf(rnd_f(-2.0f, 2.0f), -62 - rnd_int(3));
                    for (size_t i = 0; i < (size_t)N * K; i++)
                        w[i] = rnd_int(8) == 0 ? (uint16_t)(rnd_u64() & 0x807f) /* denormal */
                                               : kern_f32_to_bf16(ldexpf(rnd_f(-2.0f, 2.0f), -62 - rnd_int(3)));
                }
                float *want = falloc((size_t)M * N);
                for (int r = 0; r < M; r++)
                    for (int n = 0; n < N; n++) {
                        float s = bf16x_ref_one(c.x + (size_t)r * K, (const uint16_t *)c.w + (size_t)n * K, K);
                        want[(size_t)r * N + n] = bias ? s + c.bias[n] : s;
                        if (special) continue;
                        double d = 0, mag = 0;
                        for (int k = 0; k < K; k++) {
                            double t = (double)kern_bf16_to_f32(kern_f32_to_bf16_daz(c.x[(size_t)r * K + k])) *
                                       c.wf[(size_t)n * K + k];
                            d += t;
                            mag += fabs(t);
                        }
                        if (bias) d += c.bias[n], mag += fabs(c.bias[n]);
                        assert_close(want[(size_t)r * N + n], d, mag, 1e-5, "bf16x reference", r, n);
                    }
                for (int ii = 0; ii < nisa; ii++) {
                    assert_int_equal(kern_simd_force(isas[ii]), 0);
                    for (int pi = 0; pi < 3; pi++) {
                        const int m = pi == 0 ? M : 1 + rnd_int(M); /* a prefix of the rows */
                        c.n_rows = m;
                        poison(c.out, (size_t)M * N);
                        kern_op op = mm_op(&c);
                        kern_cpu_exec(pools[pi], &op);
                        for (size_t i = 0; i < (size_t)m * N; i++)
                            if (memcmp(&c.out[i], &want[i], 4) != 0 && !(isnan(c.out[i]) && isnan(want[i])))
                                fail_msg("bf16x matmul K %d N %d rows %d/%d isa %s threads %d: out[%zu] = %a, the "
                                         "scheme gives %a",
                                         K, N, m, M, kern_simd()->name, pi + 1, i, (double)c.out[i], (double)want[i]);
                        assert_all_nan(c.out + (size_t)m * N, (size_t)(M - m) * N);
                    }
                }
                free(want);
                mm_free(&c);
            }
    /* the mode is per pool: off again, the f32-activation path (checked against doubles of the
     * unrounded x, which the bf16 path would miss by far more than 1e-5) */
    for (int ii = 0; ii < nisa; ii++) {
        assert_int_equal(kern_simd_force(isas[ii]), 0);
        kern_pool_set_bf16_activations(pools[1], 0);
        mm_check_case(pools[1], 256, 24, 9, 9, 1, 1, 0);
        kern_pool_set_bf16_activations(pools[1], 1);
    }
    isa_reset();
    for (int i = 0; i < 3; i++) kern_pool_destroy(pools[i]);
    kern_cpu_set_min_parallel_work(old);
}

/* ---- the log-softmax's exp (kern_exp_neg, kern_simd_ops.exp_shift) ------------------------------ */

static double ulps_apart(double a, double b)
{
    if (a == b) return 0;
    int64_t ia, ib;
    memcpy(&ia, &a, 8);
    memcpy(&ib, &b, 8);
    return fabs((double)(ia - ib)); /* both positive here */
}

/* kern_exp_neg against glibc's exp (within 0.5 ulp of the true value) over [-708, 0]: at most 2 ulp
 * apart; 0 below -708, NaN for NaN, 1 at 0; and every ISA's exp_shift bit for bit the scalar, on
 * every tail length and on -inf / NaN / huge logits. */
static void test_exp_neg(void **state)
{
    (void)state;
    double worst = 0, at = 0;
    for (int it = 0; it < 2000000; it++) {
        const double x = it < 1000000 ? -708.0 * ((double)(rnd_u64() >> 11) / 9007199254740992.0)
                                      : -((double)(rnd_u64() >> 11) / 9007199254740992.0) * (it % 2 ? 1e-3 : 2.0);
        const double u = ulps_apart(kern_exp_neg(x), exp(x));
        if (u > worst) worst = u, at = x;
    }
    print_message("kern_exp_neg vs glibc exp: at most %.0f ulp apart (x = %.17g)\n", worst, at);
    if (worst > 2) fail_msg("kern_exp_neg(%.17g) is %.0f ulp from exp", at, worst);
    assert_true(kern_exp_neg(0.0) == 1.0 && kern_exp_neg(-0.0) == 1.0);
    assert_true(kern_exp_neg(-708.5) == 0.0 && kern_exp_neg(-INFINITY) == 0.0 && isnan(kern_exp_neg(NAN)));
    assert_true(kern_exp_neg(-708.0) > 0.0 && kern_exp_neg(-708.0) < 1e-307);

    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list(isas);
    enum { N = 300 };
    float l[N];
    double want[N], got[N];
    for (int trial = 0; trial < 40; trial++) {
        for (int i = 0; i < N; i++) l[i] = rnd_f(-40.0f, 25.0f);
        if (trial % 4 == 1) l[rnd_int(N)] = -INFINITY, l[rnd_int(N)] = NAN, l[rnd_int(N)] = -3e30f;
        const double mx = trial % 4 == 3 ? 800.0 : 25.0; /* 800: most terms below -708 */
        const int n = 1 + rnd_int(N);
        for (int i = 0; i < n; i++) want[i] = kern_exp_neg((double)l[i] - mx);
        for (int ii = 0; ii < nisa; ii++) {
            assert_int_equal(kern_simd_force(isas[ii]), 0);
            const kern_simd_ops *so = kern_simd();
            for (int i = 0; i < N; i++) got[i] = -1.0;
            so->exp_shift(got, l, mx, n);
            for (int i = 0; i < n; i++)
                if (!same_d(got[i], want[i]))
                    fail_msg("exp_shift (isa %s, n %d)[%d] of %a: %a, kern_exp_neg gives %a", so->name, n, i,
                             (double)l[i] - mx, got[i], want[i]);
            for (int i = n; i < N; i++) assert_true(got[i] == -1.0);
        }
    }
    isa_reset();
}

/* one of the float classes that break naive vector code: inf, NaN, zeros, denormals, the edges of
 * expf's range, huge */
static float special_f(void)
{
    static const float sp[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f, -1e-40f, 88.7f, 89.5f,
                               -87.5f, -103.5f, -200.0f, 3e38f, -3e38f};
    return sp[rnd_int((int)(sizeof sp / sizeof sp[0]))];
}

/* kern_expf (SiLU, attention softmax) against exp in double rounded once to f32 (the correctly
 * rounded result, up to double rounding): at most 1 ulp apart over the normal range, at most 1 unit
 * of the denormal spacing below it; 0 / inf past the ends, 1 at +-0, NaN for NaN; and every ISA's
 * silu_mul (vectorized kern_expf) bit for bit the scalar kern_silu_mul, on every tail length and on
 * inf / NaN / huge / denormal inputs. */
static void test_expf(void **state)
{
    (void)state;
    int64_t worst = 0;
    float at = 0;
    for (int it = 0; it < 3000000; it++) {
        const float x = it < 2000000 ? rnd_f(-104.0f, 88.72f) : rnd_f(-1.0f, 1.0f) * (it % 2 ? 1e-3f : 2.0f);
        const float want = (float)exp((double)x), got = kern_expf(x);
        int32_t iw, ig;
        memcpy(&iw, &want, 4);
        memcpy(&ig, &got, 4);
        const int64_t u = llabs((int64_t)iw - ig); /* both >= 0: bit patterns order them */
        if (u > worst) worst = u, at = x;
    }
    print_message("kern_expf vs exp rounded to f32: at most %lld ulp apart (x = %a)\n", (long long)worst, (double)at);
    if (worst > 1) fail_msg("kern_expf(%a) is %lld ulp from exp", (double)at, (long long)worst);
    assert_true(kern_expf(0.0f) == 1.0f && kern_expf(-0.0f) == 1.0f);
    assert_true(kern_expf(-INFINITY) == 0.0f && kern_expf(-104.0f) == 0.0f && kern_expf(-1e30f) == 0.0f);
    assert_true(isinf(kern_expf(INFINITY)) && isinf(kern_expf(88.73f)) && isinf(kern_expf(3e38f)));
    assert_true(kern_expf(88.72f) < INFINITY && kern_expf(88.72f) > 3e38f);
    assert_true(kern_expf(-103.0f) > 0.0f && kern_expf(-103.0f) < 1e-44f); /* a denormal */
    assert_true(isnan(kern_expf(NAN)) && isnan(kern_silu_mul(NAN, 1.0f)));
    assert_true(kern_silu_mul(-200.0f, 1.0f) == 0.0f && kern_silu_mul(200.0f, 2.0f) == 400.0f);

    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list(isas);
    enum { N = 200 };
    float g[N], u[N], want[N], got[N];
    for (int trial = 0; trial < 60; trial++) {
        for (int i = 0; i < N; i++) g[i] = rnd_f(-20.0f, 20.0f), u[i] = rnd_f(-3.0f, 3.0f);
        if (trial % 2)
            for (int j = 0; j < 12; j++) g[rnd_int(N)] = special_f(), u[rnd_int(N)] = special_f();
        const int n = trial < 33 ? trial : 1 + rnd_int(N); /* every tail length, then any */
        for (int i = 0; i < n; i++) want[i] = kern_silu_mul(g[i], u[i]);
        for (int ii = 0; ii < nisa; ii++) {
            assert_int_equal(kern_simd_force(isas[ii]), 0);
            const kern_simd_ops *so = kern_simd();
            for (int i = 0; i < N; i++) got[i] = -1.0f;
            so->silu_mul(got, g, u, n);
            for (int i = 0; i < n; i++)
                if (!same_f(got[i], want[i]))
                    fail_msg("silu_mul (isa %s, n %d)[%d] of %a, %a: %a, kern_silu_mul gives %a", so->name, n, i,
                             (double)g[i], (double)u[i], (double)got[i], (double)want[i]);
            for (int i = n; i < N; i++) assert_true(got[i] == -1.0f);
        }
    }
    isa_reset();
}

/* simd->softmax16 (attention's online-softmax step for 16 queries at once, scores key-major)
 * against the per-query loop it replaced, written out here, bit for bit on every ISA: random
 * running states (fresh, rescaled, not rescaled), key counts 0..32 per query, scores with inf / NaN
 * / huge values */
static void test_softmax16(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list(isas);
    enum { NK = 32 };
    float st0[NK * 16], st[NK * 16], m0[16], l0[16], cq[16], wm[16], wl[16], ws[NK * 16], wc[16];
    for (int trial = 0; trial < 400; trial++) {
        const float scale = trial % 5 ? rnd_f(0.05f, 0.3f) : 1.0f;
        int nk = 0;
        for (int q = 0; q < 16; q++) {
            const int c = trial % 7 == 0 ? NK : rnd_int(NK + 1);
            cq[q] = (float)c;
            nk = c > nk ? c : nk;
            const int fresh = rnd_int(3) == 0;
            m0[q] = fresh ? -INFINITY : rnd_f(-5.0f, 30.0f);
            l0[q] = fresh ? 0.0f : rnd_f(0.5f, 40.0f);
        }
        for (int i = 0; i < NK * 16; i++) st0[i] = rnd_f(-40.0f, 60.0f);
        if (trial % 3 == 1)
            for (int j = 0; j < 6; j++) st0[rnd_int(NK * 16)] = special_f();
        /* the reference: each query alone, as attention did before */
        memcpy(ws, st0, sizeof ws);
        for (int q = 0; q < 16; q++) {
            const int c = (int)cq[q];
            wm[q] = m0[q], wl[q] = l0[q], wc[q] = 1.0f;
            if (c == 0) continue;
            float mc = -INFINITY;
            for (int i = 0; i < c; i++) {
                ws[16 * i + q] = ws[16 * i + q] * scale;
                if (ws[16 * i + q] > mc) mc = ws[16 * i + q];
            }
            if (mc > wm[q]) {
                if (wl[q] > 0.0f) {
                    wc[q] = kern_expf(wm[q] - mc);
                    wl[q] = wl[q] * wc[q];
                }
                wm[q] = mc;
            }
            for (int i = 0; i < c; i++) {
                ws[16 * i + q] = kern_expf(ws[16 * i + q] - wm[q]);
                wl[q] = wl[q] + ws[16 * i + q];
            }
        }
        for (int ii = 0; ii < nisa; ii++) {
            assert_int_equal(kern_simd_force(isas[ii]), 0);
            const kern_simd_ops *so = kern_simd();
            float m[16], l[16], corr[16];
            memcpy(st, st0, sizeof st);
            memcpy(m, m0, sizeof m);
            memcpy(l, l0, sizeof l);
            so->softmax16(st, nk, cq, scale, m, l, corr);
            for (int q = 0; q < 16; q++) {
                if (fbits(m[q]) != fbits(wm[q]) || !same_f(l[q], wl[q]))
                    fail_msg("softmax16 (isa %s, trial %d) query %d: m %a l %a, per-query loop m %a l %a", so->name,
                             trial, q, (double)m[q], (double)l[q], (double)wm[q], (double)wl[q]);
                /* a factor of exactly 1 changes nothing: the caller skips it */
                if (!same_f(corr[q], wc[q]))
                    fail_msg("softmax16 (isa %s) query %d: corr %a, want %a", so->name, q, (double)corr[q],
                             (double)wc[q]);
                for (int i = 0; i < (int)cq[q]; i++)
                    if (!same_f(st[16 * i + q], ws[16 * i + q]))
                        fail_msg("softmax16 (isa %s) query %d key %d: %a, want %a", so->name, q, i,
                                 (double)st[16 * i + q], (double)ws[16 * i + q]);
            }
        }
    }
    isa_reset();
}

/* ---- rmsnorm ------------------------------------------------------------------------------------ */

static void test_rmsnorm(void **state)
{
    (void)state;
    kern_pool *pool = kern_pool_create(2);
    size_t old = kern_cpu_set_min_parallel_work(0);
    static const int Hs[] = {1, 15, 64, 1000};
    for (int hi = 0; hi < 4; hi++)
        for (int inplace = 0; inplace <= 1; inplace++) {
            const int H = Hs[hi], max_rows = 9;
            int32_t n = 1 + rnd_int(8);
            float *x = falloc((size_t)max_rows * H), *w = falloc((size_t)H), *out = falloc((size_t)max_rows * H);
            float *x0 = falloc((size_t)max_rows * H);
            fill(x, (size_t)max_rows * H, -3.0f, 3.0f);
            fill(w, (size_t)H, 0.5f, 1.5f);
            if (inplace) poison(x + (size_t)n * H, (size_t)(max_rows - n) * H);
            memcpy(x0, x, (size_t)max_rows * H * 4);
            float *dst = inplace ? x : out;
            poison(out, (size_t)max_rows * H);
            const float eps = 1e-6f;
            kern_op op = {.kind = KOP_RMSNORM};
            op.buf[0] = B(x, (size_t)max_rows * H * 4);
            op.buf[1] = B(w, (size_t)H * 4);
            op.buf[2] = B(dst, (size_t)max_rows * H * 4);
            op.buf[3] = B(&n, 4);
            op.p[0] = H;
            op.p[1] = max_rows;
            op.f[0] = eps;
            kern_cpu_exec(pool, &op);
            for (int r = 0; r < n; r++) {
                double ss = 0;
                for (int i = 0; i < H; i++) ss += (double)x0[(size_t)r * H + i] * x0[(size_t)r * H + i];
                double sc = 1.0 / sqrt(ss / H + eps);
                for (int i = 0; i < H; i++) {
                    double ref = x0[(size_t)r * H + i] * sc * w[i];
                    assert_close(dst[(size_t)r * H + i], ref, fabs(ref), 1e-5, "rmsnorm", r, i);
                }
            }
            assert_all_nan(dst + (size_t)n * H, (size_t)(max_rows - n) * H);
            free(x), free(w), free(out), free(x0);
        }
    kern_cpu_set_min_parallel_work(old);
    kern_pool_destroy(pool);
}

/* ---- qk norm + rope ----------------------------------------------------------------------------- */

static void test_qk_norm_rope(void **state)
{
    (void)state;
    kern_pool *pool = kern_pool_create(2);
    size_t old = kern_cpu_set_min_parallel_work(0);
    for (int variant = 0; variant < 4; variant++) {
        const int nh = 4, nkv = variant < 2 ? 2 : 1, hd = variant % 2 ? 64 : 18, max_rows = 7;
        const int stride = (nh + 2 * nkv) * hd + 3; /* padded rows */
        const int use_norm = variant != 2;
        int32_t n = 5;
        const float eps = 1e-6f;
        float *qkv = falloc((size_t)max_rows * stride), *q0 = falloc((size_t)max_rows * stride);
        float *qn = falloc((size_t)hd), *kn = falloc((size_t)hd), *invf = falloc((size_t)hd / 2);
        int32_t pos[7];
        fill(qkv, (size_t)max_rows * stride, -2.0f, 2.0f);
        poison(qkv + (size_t)n * stride, (size_t)(max_rows - n) * stride);
        memcpy(q0, qkv, (size_t)max_rows * stride * 4);
        fill(qn, (size_t)hd, 0.5f, 1.5f);
        fill(kn, (size_t)hd, 0.5f, 1.5f);
        for (int i = 0; i < hd / 2; i++) invf[i] = powf(10000.0f, -2.0f * i / hd);
        for (int r = 0; r < max_rows; r++) pos[r] = r == 0 ? 0 : rnd_int(5000);
        kern_op op = {.kind = KOP_QK_NORM_ROPE};
        op.buf[0] = B(qkv, (size_t)max_rows * stride * 4);
        if (use_norm) {
            op.buf[1] = B(qn, (size_t)hd * 4);
            op.buf[2] = B(kn, (size_t)hd * 4);
        }
        op.buf[3] = B(pos, sizeof pos);
        op.buf[4] = B(invf, (size_t)hd / 2 * 4);
        op.buf[5] = B(&n, 4);
        op.p[0] = nh;
        op.p[1] = nkv;
        op.p[2] = hd;
        op.p[3] = stride;
        op.p[4] = max_rows;
        op.f[0] = eps;
        kern_cpu_exec(pool, &op);
        for (int r = 0; r < n; r++) {
            for (int h = 0; h < nh + nkv; h++) {
                const float *src = q0 + (size_t)r * stride + (size_t)h * hd;
                const float *got = qkv + (size_t)r * stride + (size_t)h * hd;
                const float *w = h < nh ? qn : kn;
                double y[1024];
                double ss = 0;
                for (int i = 0; i < hd; i++) ss += (double)src[i] * src[i];
                double sc = use_norm ? 1.0 / sqrt(ss / hd + eps) : 1.0;
                for (int i = 0; i < hd; i++) y[i] = use_norm ? src[i] * sc * w[i] : src[i];
                for (int i = 0; i < hd / 2; i++) {
                    float ang = (float)pos[r] * invf[i]; /* the contract rounds the angle to f32 */
                    double cs = cos((double)ang), sn = sin((double)ang);
                    double a = y[i], b = y[i + hd / 2];
                    double mag = fabs(a) + fabs(b);
                    assert_close(got[i], a * cs - b * sn, mag, 1e-5, "rope lo", r, h * hd + i);
                    assert_close(got[i + hd / 2], b * cs + a * sn, mag, 1e-5, "rope hi", r, h * hd + i);
                }
            }
            /* the v heads and the row padding are not touched */
            size_t vbeg = (size_t)r * stride + (size_t)(nh + nkv) * hd;
            assert_memory_equal(qkv + vbeg, q0 + vbeg, (size_t)(nkv * hd + 3) * 4);
        }
        assert_all_nan(qkv + (size_t)n * stride, (size_t)(max_rows - n) * stride);
        free(qkv), free(q0), free(qn), free(kn), free(invf);
    }
    kern_cpu_set_min_parallel_work(old);
    kern_pool_destroy(pool);
}

/* ---- paged KV cache + attention ----------------------------------------------------------------- */

typedef struct {
    int nh, nkv, hd, bs, max_blocks, max_seqs, num_blocks;
    float *kc, *vc;
    int32_t *bt;
    float *K, *V; /* logical [max_seqs][max_blocks*bs][nkv*hd], what the cache should hold */
} paged;

static void paged_init_geom(paged *pg, int nh, int nkv, int hd, int bs, int max_blocks)
{
    *pg = (paged){.nh = nh, .nkv = nkv, .hd = hd, .bs = bs, .max_blocks = max_blocks, .max_seqs = 3};
    pg->num_blocks = pg->max_blocks * pg->max_seqs + 5;
    size_t cache = (size_t)pg->num_blocks * pg->bs * nkv * hd;
    pg->kc = falloc(cache);
    pg->vc = falloc(cache);
    poison(pg->kc, cache);
    poison(pg->vc, cache);
    /* shuffled block ids: a sequence's blocks are scattered and out of order */
    int nb = pg->num_blocks;
    int *perm = malloc((size_t)nb * sizeof(int));
    for (int i = 0; i < nb; i++) perm[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = rnd_int(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    pg->bt = malloc((size_t)pg->max_seqs * pg->max_blocks * sizeof(int32_t));
    for (int i = 0; i < pg->max_seqs * pg->max_blocks; i++) pg->bt[i] = perm[i];
    free(perm);
    size_t logical = (size_t)pg->max_seqs * pg->max_blocks * pg->bs * nkv * hd;
    pg->K = falloc(logical);
    pg->V = falloc(logical);
    fill(pg->K, logical, -1.0f, 1.0f);
    fill(pg->V, logical, -1.0f, 1.0f);
}
static void paged_init(paged *pg, int nh, int nkv, int hd) { paged_init_geom(pg, nh, nkv, hd, 4, 6); }
static void paged_free(paged *pg)
{
    free(pg->kc), free(pg->vc), free(pg->bt), free(pg->K), free(pg->V);
}
static const float *logical_at(const paged *pg, const float *base, int slot, int pos)
{
    return base + ((size_t)slot * pg->max_blocks * pg->bs + pos) * pg->nkv * pg->hd;
}

/* Writes every position of every sequence through KOP_KV_WRITE, a few rows per op, with masked
 * rows mixed in, then checks the cache holds exactly the logical K/V (and masked rows wrote
 * nothing: the spare blocks stay poisoned). */
static void paged_fill_via_kv_write(kern_pool *pool, paged *pg)
{
    const int nkv = pg->nkv, hd = pg->hd, nh = pg->nh;
    const int stride = (nh + 2 * nkv) * hd + 1, k_off = nh * hd, v_off = (nh + nkv) * hd;
    const int max_rows = 6;
    float *qkv = falloc((size_t)max_rows * stride);
    int32_t slot[6], pos[6], n;
    int total = pg->max_seqs * pg->max_blocks * pg->bs, done = 0;
    while (done < total) {
        n = 1 + rnd_int(max_rows);
        fill(qkv, (size_t)max_rows * stride, 5.0f, 6.0f);
        int r = 0;
        for (; r < n && done < total; r++) {
            if (rnd_int(4) == 0) { /* masked row: its values must never reach the cache */
                slot[r] = -1;
                pos[r] = 0;
                continue;
            }
            int s = done / (pg->max_blocks * pg->bs), p = done % (pg->max_blocks * pg->bs);
            slot[r] = s;
            pos[r] = p;
            memcpy(qkv + (size_t)r * stride + k_off, logical_at(pg, pg->K, s, p), (size_t)nkv * hd * 4);
            memcpy(qkv + (size_t)r * stride + v_off, logical_at(pg, pg->V, s, p), (size_t)nkv * hd * 4);
            done++;
        }
        n = r;
        for (; r < max_rows; r++) slot[r] = 0, pos[r] = 0; /* rows past n: never read */
        kern_op op = {.kind = KOP_KV_WRITE};
        op.buf[0] = B(qkv, (size_t)max_rows * stride * 4);
        op.buf[1] = B(pg->kc, (size_t)pg->num_blocks * pg->bs * nkv * hd * 4);
        op.buf[2] = B(pg->vc, (size_t)pg->num_blocks * pg->bs * nkv * hd * 4);
        op.buf[3] = B(slot, sizeof slot);
        op.buf[4] = B(pos, sizeof pos);
        op.buf[5] = B(pg->bt, (size_t)pg->max_seqs * pg->max_blocks * 4);
        op.buf[6] = B(&n, 4);
        op.p[0] = nkv;
        op.p[1] = hd;
        op.p[2] = stride;
        op.p[3] = k_off;
        op.p[4] = v_off;
        op.p[5] = pg->bs;
        op.p[6] = pg->max_blocks;
        op.p[7] = max_rows;
        kern_cpu_exec(pool, &op);
    }
    for (int s = 0; s < pg->max_seqs; s++)
        for (int p = 0; p < pg->max_blocks * pg->bs; p++) {
            int blk = pg->bt[s * pg->max_blocks + p / pg->bs];
            size_t at = ((size_t)blk * pg->bs + p % pg->bs) * nkv * hd;
            assert_memory_equal(pg->kc + at, logical_at(pg, pg->K, s, p), (size_t)nkv * hd * 4);
            assert_memory_equal(pg->vc + at, logical_at(pg, pg->V, s, p), (size_t)nkv * hd * 4);
        }
    /* the blocks no table names were never written (masked rows included) */
    int used_cnt = 0;
    for (int b = 0; b < pg->num_blocks; b++) {
        int used = 0;
        for (int i = 0; i < pg->max_seqs * pg->max_blocks; i++) used |= pg->bt[i] == b;
        if (!used) {
            assert_all_nan(pg->kc + (size_t)b * pg->bs * nkv * hd, (size_t)pg->bs * nkv * hd);
            assert_all_nan(pg->vc + (size_t)b * pg->bs * nkv * hd, (size_t)pg->bs * nkv * hd);
        } else {
            used_cnt++;
        }
    }
    assert_int_equal(used_cnt, pg->max_seqs * pg->max_blocks);
    free(qkv);
}

typedef struct {
    int max_rows, q_stride;
    float *q, *out;
    int32_t *slot, *kv_len;
    int32_t n;
} attn_rows;

static kern_op attn_op(const paged *pg, attn_rows *a, float scale)
{
    kern_op op = {.kind = KOP_ATTENTION};
    size_t cache = (size_t)pg->num_blocks * pg->bs * pg->nkv * pg->hd * 4;
    op.buf[0] = B(a->q, (size_t)a->max_rows * a->q_stride * 4);
    op.buf[1] = B(pg->kc, cache);
    op.buf[2] = B(pg->vc, cache);
    op.buf[3] = B(a->out, (size_t)a->max_rows * pg->nh * pg->hd * 4);
    op.buf[4] = B(a->slot, (size_t)a->max_rows * 4);
    op.buf[5] = B(a->kv_len, (size_t)a->max_rows * 4);
    op.buf[6] = B(pg->bt, (size_t)pg->max_seqs * pg->max_blocks * 4);
    op.buf[7] = B(&a->n, 4);
    op.p[0] = pg->nh;
    op.p[1] = pg->nkv;
    op.p[2] = pg->hd;
    op.p[3] = a->q_stride;
    op.p[4] = pg->bs;
    op.p[5] = pg->max_blocks;
    op.p[6] = a->max_rows;
    op.f[0] = scale;
    return op;
}

static void attn_rows_init(attn_rows *a, const paged *pg, int max_rows, int n)
{
    *a = (attn_rows){.max_rows = max_rows, .q_stride = (pg->nh + 2 * pg->nkv) * pg->hd, .n = n};
    a->q = falloc((size_t)max_rows * a->q_stride);
    a->out = falloc((size_t)max_rows * pg->nh * pg->hd);
    a->slot = malloc((size_t)max_rows * 4);
    a->kv_len = malloc((size_t)max_rows * 4);
    fill(a->q, (size_t)max_rows * a->q_stride, -1.5f, 1.5f);
    poison(a->out, (size_t)max_rows * pg->nh * pg->hd);
    int cap = pg->max_blocks * pg->bs;
    for (int r = 0; r < max_rows; r++) {
        a->slot[r] = rnd_int(5) == 0 ? -1 : rnd_int(pg->max_seqs);
        a->kv_len[r] = r == 0 ? cap : 1 + rnd_int(cap); /* row 0 uses every block */
    }
}
static void attn_rows_free(attn_rows *a) { free(a->q), free(a->out), free(a->slot), free(a->kv_len); }

static void test_attention(void **state)
{
    (void)state;
    kern_pool *pool = kern_pool_create(3);
    size_t old = kern_cpu_set_min_parallel_work(0);
    static const int groups[] = {1, 2, 4};
    for (int gi = 0; gi < 3; gi++)
        for (int hdi = 0; hdi < 2; hdi++) {
            const int nkv = 2, nh = nkv * groups[gi], hd = hdi ? 64 : 20;
            paged pg;
            paged_init(&pg, nh, nkv, hd);
            paged_fill_via_kv_write(pool, &pg);
            attn_rows a;
            attn_rows_init(&a, &pg, 9, 7);
            const float scale = 1.0f / sqrtf((float)hd);
            kern_op op = attn_op(&pg, &a, scale);
            kern_cpu_exec(pool, &op);
            for (int r = 0; r < a.n; r++)
                for (int h = 0; h < nh; h++) {
                    const float *o = a.out + ((size_t)r * nh + h) * hd;
                    if (a.slot[r] < 0) {
                        for (int d = 0; d < hd; d++) assert_true(o[d] == 0.0f);
                        continue;
                    }
                    const float *qv = a.q + (size_t)r * a.q_stride + (size_t)h * hd;
                    int kvh = h / groups[gi], L = a.kv_len[r];
                    double sc[64], mx = -INFINITY;
                    for (int j = 0; j < L; j++) {
                        const float *kr = logical_at(&pg, pg.K, a.slot[r], j) + (size_t)kvh * hd;
                        double s = 0;
                        for (int d = 0; d < hd; d++) s += (double)qv[d] * kr[d];
                        sc[j] = s * scale;
                        if (sc[j] > mx) mx = sc[j];
                    }
                    double l = 0;
                    for (int j = 0; j < L; j++) l += (sc[j] = exp(sc[j] - mx));
                    for (int d = 0; d < hd; d++) {
                        double ref = 0, mag = 0;
                        for (int j = 0; j < L; j++) {
                            double v = logical_at(&pg, pg.V, a.slot[r], j)[(size_t)kvh * hd + d];
                            ref += sc[j] / l * v;
                            mag += fabs(sc[j] / l * v);
                        }
                        assert_close(o[d], ref, mag, 1e-5, "attention", r, h * hd + d);
                    }
                }
            assert_all_nan(a.out + (size_t)a.n * nh * hd, (size_t)(a.max_rows - a.n) * nh * hd);
            attn_rows_free(&a);
            paged_free(&pg);
        }
    kern_cpu_set_min_parallel_work(old);
    kern_pool_destroy(pool);
}

/* The first n rows of a, each computed by an op of its own (one row, no pool): the reference the
 * batched op must equal bit for bit. The caller frees the result. */
static float *attn_rows_alone(const paged *pg, const attn_rows *a, int n, float scale)
{
    const size_t row = (size_t)pg->nh * pg->hd;
    float *golden = falloc((size_t)n * row);
    attn_rows one = *a;
    one.max_rows = 1;
    one.n = 1;
    for (int r = 0; r < n; r++) {
        one.q = a->q + (size_t)r * a->q_stride;
        one.out = golden + (size_t)r * row;
        one.slot = a->slot + r;
        one.kv_len = a->kv_len + r;
        kern_op op1 = attn_op(pg, &one, scale);
        kern_cpu_exec(NULL, &op1);
    }
    return golden;
}

/* The batched op over the first n rows of a, for every n in [n_min, a->n], every ISA and pool sizes
 * 1..3 (work threshold 0: the pool is always used), must give every row bit for bit as the row
 * computed alone. what names the case in a failure. */
static void attn_check_vs_alone(const paged *pg, attn_rows *a, float scale, int n_min, const char *what)
{
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list(isas), n_max = a->n;
    const size_t row = (size_t)pg->nh * pg->hd, old = kern_cpu_set_min_parallel_work(0);
    float *golden = attn_rows_alone(pg, a, n_max, scale);
    kern_op op = attn_op(pg, a, scale);
    for (int ii = 0; ii < nisa; ii++) {
        assert_int_equal(kern_simd_force(isas[ii]), 0);
        for (int nt = 1; nt <= 3; nt++) {
            kern_pool *pool = kern_pool_create(nt);
            for (int n = n_min; n <= n_max; n++) {
                a->n = n;
                poison(a->out, (size_t)n * row);
                kern_cpu_exec(pool, &op);
                for (int r = 0; r < n; r++)
                    if (memcmp(a->out + (size_t)r * row, golden + (size_t)r * row, row * 4) != 0)
                        fail_msg("%s: row %d (slot %d, kv_len %d) of %d differs from the row alone: isa %d threads %d",
                                 what, r, a->slot[r], a->kv_len[r], n, (int)isas[ii], nt);
            }
            kern_pool_destroy(pool);
        }
    }
    a->n = n_max;
    isa_reset();
    kern_cpu_set_min_parallel_work(old);
    free(golden);
}

/* attention: each row alone == batched, for 1..8 rows, pool sizes 1..3 and every ISA, bitwise */
static void test_attention_bitwise(void **state)
{
    (void)state;
    paged pg;
    paged_init(&pg, 8, 2, 40);
    paged_fill_via_kv_write(NULL, &pg);
    attn_rows a;
    attn_rows_init(&a, &pg, 8, 8);
    attn_check_vs_alone(&pg, &a, 0.17f, 1, "attention");
    attn_rows_free(&a);
    paged_free(&pg);
}

/* attention as a chunked prefill runs it: 40 rows, most of them consecutive positions of one
 * sequence (so they share query tiles), a few of another sequence and masked rows between them,
 * contexts over several 32-key chunks, GQA groups of 3 and 6, head dims with and without a k % 16
 * tail. Every row must equal the same row computed alone, bitwise, for every ISA and pool size. */
static void test_attention_prefill_bitwise(void **state)
{
    (void)state;
    static const int geom[2][5] = {{12, 4, 64, 16, 8}, {6, 1, 20, 8, 13}}; /* nh nkv hd bs max_blocks */
    for (int gi = 0; gi < 2; gi++) {
        paged pg;
        paged_init_geom(&pg, geom[gi][0], geom[gi][1], geom[gi][2], geom[gi][3], geom[gi][4]);
        paged_fill_via_kv_write(NULL, &pg);
        const int n = 40, cap = pg.max_blocks * pg.bs;
        attn_rows a;
        attn_rows_init(&a, &pg, n, n);
        for (int r = 0; r < n; r++) {
            a.slot[r] = r == 7 || r == 30 ? -1 : r >= 12 && r < 16 ? 0 : 1;
            a.kv_len[r] = a.slot[r] == 1 ? cap - n + 1 + r : 1 + rnd_int(cap);
        }
        attn_check_vs_alone(&pg, &a, 0.13f, n, gi ? "prefill attention, group 6, hd 20" : "prefill attention, group 3, hd 64");
        attn_rows_free(&a);
        paged_free(&pg);
    }
}

/* simd->dots4x4 and simd->axpys (the batched forms attention uses) against dot called one at a
 * time and against fmaf row by row, bitwise, for every ISA, every block shape (queries x keys up
 * to 4 x 4) and lengths with and without a k % 16 tail: they promise the same operations in the
 * same order */
static void test_simd_batched_bitwise(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    int nisa = isa_list(isas);
    enum { NMAX = 136 };
    float *k = falloc(16 * NMAX), *y0 = falloc(4 * NMAX), *y1 = falloc(4 * NMAX), a[64];
    fill(k, 16 * NMAX, -1, 1);
    fill(a, 64, -2, 2);
    const float *kp[16];
    for (int j = 0; j < 16; j++) kp[j] = k + (size_t)j * NMAX;
    static const int lens[] = {16, 64, 71, 128, 136, 5};
    for (int ii = 0; ii < nisa; ii++) {
        assert_int_equal(kern_simd_force(isas[ii]), 0);
        const kern_simd_ops *so = kern_simd();
        for (int li = 0; li < 6; li++) {
            const int n = lens[li];
            for (int nk = 1; nk <= 16; nk++) {
                const int nq = 1 + (nk - 1) % 4, nkb = 1 + (nk - 1) / 4; /* every 4 x 4 shape */
                float got[4 * 5];
                so->dots4x4(kp + 12, nq, kp, nkb, n, got, 5);
                for (int i = 0; i < nq; i++)
                    for (int j = 0; j < nkb; j++) {
                        float want = so->dot(kp[12 + i], kp[j], n);
                        if (memcmp(&got[i * 5 + j], &want, 4) != 0)
                            fail_msg("dots4x4[%d][%d] of %dx%d (n %d, isa %s): %.9g, dot gives %.9g", i, j, nq, nkb,
                                     n, so->name, (double)got[i * 5 + j], (double)want);
                    }
                /* ny outputs (1..4) of nx rows, a[j * lda + q] with lda 4 or 5 */
                const int ny = nq, lda = 4 + nk % 2, nx = 1 + (nk * 7) % 12;
                float *yq[4], *wq[4];
                for (int q = 0; q < ny; q++) {
                    yq[q] = y0 + (size_t)q * NMAX, wq[q] = y1 + (size_t)q * NMAX;
                    fill(yq[q], NMAX, -1, 1);
                    memcpy(wq[q], yq[q], NMAX * 4);
                }
                so->axpys(yq, ny, a, lda, kp, nx, n);
                for (int q = 0; q < ny; q++) {
                    for (int j = 0; j < nx; j++)
                        for (int i = 0; i < n; i++) wq[q][i] = fmaf(a[j * lda + q], kp[j][i], wq[q][i]);
                    if (memcmp(yq[q], wq[q], NMAX * 4) != 0)
                        fail_msg("axpys %d of %d outputs, %d rows (n %d, isa %s) differs from fmaf row by row", q, ny,
                                 nx, n, so->name);
                }
            }
        }
    }
    isa_reset();
    free(k), free(y0), free(y1);
}

/* ---- elementwise -------------------------------------------------------------------------------- */

static void test_silu_mul_add(void **state)
{
    (void)state;
    kern_pool *pool = kern_pool_create(2);
    size_t old = kern_cpu_set_min_parallel_work(0);
    const int I = 37, max_rows = 6;
    int32_t n = 4;
    float *gu = falloc((size_t)max_rows * 2 * I), *out = falloc((size_t)max_rows * I);
    fill(gu, (size_t)max_rows * 2 * I, -8.0f, 8.0f);
    poison(out, (size_t)max_rows * I);
    kern_op op = {.kind = KOP_SILU_MUL};
    op.buf[0] = B(gu, (size_t)max_rows * 2 * I * 4);
    op.buf[1] = B(out, (size_t)max_rows * I * 4);
    op.buf[2] = B(&n, 4);
    op.p[0] = I;
    op.p[1] = max_rows;
    kern_cpu_exec(pool, &op);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < I; i++) {
            double a = gu[(size_t)r * 2 * I + i], u = gu[(size_t)r * 2 * I + I + i];
            double ref = a / (1.0 + exp(-a)) * u;
            assert_close(out[(size_t)r * I + i], ref, fabs(ref), 1e-6, "silu_mul", r, i);
        }
    assert_all_nan(out + (size_t)n * I, (size_t)(max_rows - n) * I);

    /* add, including x += x */
    const int H = 33;
    float *x = falloc((size_t)max_rows * H), *y = falloc((size_t)max_rows * H), *x0 = falloc((size_t)max_rows * H);
    fill(x, (size_t)max_rows * H, -1, 1);
    fill(y, (size_t)max_rows * H, -1, 1);
    poison(x + (size_t)n * H, (size_t)(max_rows - n) * H);
    memcpy(x0, x, (size_t)max_rows * H * 4);
    for (int self = 0; self <= 1; self++) {
        kern_op ad = {.kind = KOP_ADD};
        ad.buf[0] = B(x, (size_t)max_rows * H * 4);
        ad.buf[1] = B(self ? x : y, (size_t)max_rows * H * 4);
        ad.buf[2] = B(&n, 4);
        ad.p[0] = H;
        ad.p[1] = max_rows;
        kern_cpu_exec(pool, &ad);
        for (int i = 0; i < n * H; i++) {
            float want = self ? x0[i] + x0[i] : x0[i] + y[i];
            assert_true(x[i] == want);
            x0[i] = x[i];
        }
        assert_all_nan(x + (size_t)n * H, (size_t)(max_rows - n) * H);
    }
    free(gu), free(out), free(x), free(y), free(x0);
    kern_cpu_set_min_parallel_work(old);
    kern_pool_destroy(pool);
}

static void test_embed_gather(void **state)
{
    (void)state;
    kern_pool *pool = kern_pool_create(2);
    size_t old = kern_cpu_set_min_parallel_work(0);
    const int H = 19, V = 50, max_rows = 5;
    float *tab = falloc((size_t)V * H);
    uint16_t *tabh = malloc((size_t)V * H * 2);
    fill(tab, (size_t)V * H, -1, 1);
    for (int i = 0; i < V * H; i++) tabh[i] = kern_f32_to_bf16(tab[i]);
    int32_t ids[5] = {3, 49, 0, 3, 7}, n = 4;
    float *out = falloc((size_t)max_rows * H);
    for (int bf = 0; bf <= 1; bf++) {
        poison(out, (size_t)max_rows * H);
        kern_op op = {.kind = KOP_EMBED};
        op.buf[0] = B(ids, sizeof ids);
        op.buf[1] = bf ? B(tabh, (size_t)V * H * 2) : B(tab, (size_t)V * H * 4);
        op.buf[2] = B(out, (size_t)max_rows * H * 4);
        op.buf[3] = B(&n, 4);
        op.p[0] = H;
        op.p[1] = V;
        op.p[2] = max_rows;
        op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        kern_cpu_exec(pool, &op);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < H; i++) {
                float want = bf ? kern_bf16_to_f32(tabh[(size_t)ids[r] * H + i]) : tab[(size_t)ids[r] * H + i];
                assert_true(out[(size_t)r * H + i] == want);
            }
        assert_all_nan(out + (size_t)n * H, (size_t)(max_rows - n) * H);
    }
    /* gather rows */
    const int max_out = 4;
    int32_t idx[4] = {4, 0, 4, 2}, ng = 3;
    float *g = falloc((size_t)max_out * H);
    poison(g, (size_t)max_out * H);
    kern_op ga = {.kind = KOP_GATHER_ROWS};
    ga.buf[0] = B(out, (size_t)max_rows * H * 4);
    ga.buf[1] = B(idx, sizeof idx);
    ga.buf[2] = B(g, (size_t)max_out * H * 4);
    ga.buf[3] = B(&ng, 4);
    ga.p[0] = H;
    ga.p[1] = max_rows;
    ga.p[2] = max_out;
    fill(out, (size_t)max_rows * H, -1, 1);
    kern_cpu_exec(pool, &ga);
    for (int j = 0; j < ng; j++) assert_memory_equal(g + (size_t)j * H, out + (size_t)idx[j] * H, (size_t)H * 4);
    assert_all_nan(g + (size_t)ng * H, (size_t)(max_out - ng) * H);
    free(tab), free(tabh), free(out), free(g);
    kern_cpu_set_min_parallel_work(old);
    kern_pool_destroy(pool);
}

/* ---- malformed ops abort ------------------------------------------------------------------------ */

static int dies(void (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen("/dev/null", "w", stderr);
        (void)f;
        fn();
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static float g_x[64], g_w[64], g_o[64];
static int32_t g_n = 1, g_ids[2] = {0, 9};
static kern_op small_mm(void)
{
    kern_op op = {.kind = KOP_MATMUL};
    op.buf[0] = B(g_x, sizeof g_x);
    op.buf[1] = B(g_w, sizeof g_w);
    op.buf[3] = B(g_o, sizeof g_o);
    op.buf[4] = B(&g_n, 4);
    op.p[0] = 8;
    op.p[1] = 8;
    op.p[2] = 8;
    return op;
}
static void die_ok(void)
{
    kern_op op = small_mm();
    kern_cpu_exec(NULL, &op);
}
static void die_short_weight(void)
{
    kern_op op = small_mm();
    op.p[1] = 9; /* W would need 9 rows */
    kern_cpu_exec(NULL, &op);
}
static void die_rows(void)
{
    kern_op op = small_mm();
    g_n = 9; /* n_rows > max_rows */
    kern_cpu_exec(NULL, &op);
}
static void die_unused_slot(void)
{
    kern_op op = small_mm();
    op.buf[6] = B(g_x, 4);
    kern_cpu_exec(NULL, &op);
}
static void die_kind(void)
{
    kern_op op = small_mm();
    op.kind = KOP_COUNT;
    kern_cpu_exec(NULL, &op);
}
static void die_token(void)
{
    kern_op op = {.kind = KOP_EMBED};
    int32_t n = 2;
    op.buf[0] = B(g_ids, sizeof g_ids);
    op.buf[1] = B(g_w, sizeof g_w); /* V = 8, H = 8; id 9 is out of range */
    op.buf[2] = B(g_o, sizeof g_o);
    op.buf[3] = B(&n, 4);
    op.p[0] = 8;
    op.p[1] = 8;
    op.p[2] = 2;
    kern_cpu_exec(NULL, &op);
}

static void test_malformed_ops_abort(void **state)
{
    (void)state;
    assert_false(dies(die_ok));
    assert_true(dies(die_short_weight));
    assert_true(dies(die_rows));
    assert_true(dies(die_unused_slot));
    assert_true(dies(die_kind));
    assert_true(dies(die_token));
}

/* ---- GS_KERN_BENCH=1: weight bandwidth of the GEMV, vs memcpy ------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    char *dst;
    const char *src;
    size_t bytes;
} cp_ctx;
static void cp_run(void *ctx, int tid, int nt)
{
    const cp_ctx *c = ctx;
    int64_t b, e;
    kern_split((int64_t)c->bytes, tid, nt, 4096, &b, &e);
    memcpy(c->dst + b, c->src + b, (size_t)(e - b));
}
/* Streams through `copies` distinct weight matrices so that (when copies * bytes >> L3) every call
 * reads its weights from memory, as a real model's layers do. */
static void bench_mm(kern_pool *pool, int K, int N, int M, int bf16, int copies, int iters)
{
    size_t ws = bf16 ? 2 : 4, wbytes = (size_t)N * K * ws;
    char *w = malloc(wbytes * copies);
    if (!w) {
        printf("  (skipped K=%d N=%d: out of memory)\n", K, N);
        return;
    }
    memset(w, 0x3c, wbytes * copies); /* small finite values in both encodings */
    float *x = falloc((size_t)M * K), *out = falloc((size_t)M * N);
    fill(x, (size_t)M * K, -1, 1);
    int32_t n = M;
    kern_op op = {.kind = KOP_MATMUL};
    op.buf[0] = B(x, (size_t)M * K * 4);
    op.buf[3] = B(out, (size_t)M * N * 4);
    op.buf[4] = B(&n, 4);
    op.p[0] = K;
    op.p[1] = N;
    op.p[2] = M;
    op.p[3] = bf16 ? KERN_DT_BF16 : KERN_DT_F32;
    for (int i = 0; i < copies; i++) { /* warm-up: page faults, worker wake-up */
        op.buf[1] = B(w + wbytes * i, wbytes);
        kern_cpu_exec(pool, &op);
    }
    /* best of 5 trials: the machine is shared, and noise only ever adds time */
    double t = 1e30, tc = 1e30;
    char *dst = malloc(wbytes);
    memset(dst, 0, wbytes);
    for (int trial = 0; trial < 5; trial++) {
        double t0 = now_s();
        for (int it = 0; it < iters; it++) {
            op.buf[1] = B(w + wbytes * (it % copies), wbytes);
            kern_cpu_exec(pool, &op);
        }
        double dt = (now_s() - t0) / iters;
        t = dt < t ? dt : t;
        /* memcpy of the same bytes, same rotation, split over the same threads */
        cp_ctx cc = {dst, w, wbytes};
        double c0 = now_s();
        for (int it = 0; it < iters; it++) {
            cc.src = w + wbytes * (it % copies);
            kern_pool_run(pool, cp_run, &cc);
        }
        dt = (now_s() - c0) / iters;
        tc = dt < tc ? dt : tc;
    }
    printf("  %-4s K=%-5d N=%-6d M=%-3d threads=%d %-5s: %8.1f us  weights %6.1f GB/s  memcpy %6.1f GB/s  (%3.0f%%)\n",
           bf16 ? "bf16" : "f32", K, N, M, kern_pool_threads(pool), copies > 1 || wbytes > (64u << 20) ? "cold" : "in-L3",
           t * 1e6, wbytes / t / 1e9, wbytes / tc / 1e9, 100.0 * tc / t);
    free(dst), free(w), free(x), free(out);
}

static void bench_memcpy_pool(kern_pool *pool, size_t bytes, int copies, int iters)
{
    char *src = malloc(bytes * copies), *dst = malloc(bytes);
    memset(src, 1, bytes * copies);
    memset(dst, 0, bytes);
    cp_ctx c = {dst, src, bytes};
    kern_pool_run(pool, cp_run, &c);
    double t = 1e30;
    for (int trial = 0; trial < 5; trial++) {
        double t0 = now_s();
        for (int it = 0; it < iters; it++) {
            c.src = src + bytes * (it % copies);
            kern_pool_run(pool, cp_run, &c);
        }
        double dt = (now_s() - t0) / iters;
        t = dt < t ? dt : t;
    }
    printf("  memcpy %zu MB x%d on %d threads: %.1f GB/s (bytes copied per second)\n", bytes >> 20, copies,
           kern_pool_threads(pool), bytes / t / 1e9);
    free(src), free(dst);
}

static void noop_fn(void *ctx, int tid, int n) { (void)ctx, (void)tid, (void)n; }

static void test_bench(void **state)
{
    (void)state;
    const char *env = getenv("GS_KERN_BENCH");
    if (!env || strcmp(env, "1") != 0) skip();
    kern_pool *pool = kern_pool_create(2);
    printf("[bench] isa %s, %d threads\n", kern_simd()->name, kern_pool_threads(pool));
    double t0 = now_s();
    const int runs = 200000;
    for (int i = 0; i < runs; i++) kern_pool_run(pool, noop_fn, NULL);
    printf("  pool dispatch (empty task, workers spinning): %.2f us\n", (now_s() - t0) / runs * 1e6);
    kern_pool_set_spin_us(pool, 50);
    double wake = 0;
    for (int i = 0; i < 50; i++) {
        struct timespec ts = {0, 2 * 1000 * 1000}; /* past the spin window: workers sleep */
        nanosleep(&ts, NULL);
        t0 = now_s();
        kern_pool_run(pool, noop_fn, NULL);
        wake += now_s() - t0;
    }
    printf("  pool dispatch (empty task, workers asleep):   %.2f us\n", wake / 50 * 1e6);
    kern_pool_set_spin_us(pool, 1000);
    bench_memcpy_pool(pool, (size_t)6 << 20, 48, 200);
    bench_memcpy_pool(pool, (size_t)300 << 20, 1, 10);
    static const int Ms[] = {1, 4, 16};
    for (int mi = 0; mi < 3; mi++) {
        bench_mm(pool, 1024, 3072, Ms[mi], 1, 48, 96); /* 288 MB of distinct weights: from DRAM */
        bench_mm(pool, 1024, 3072, Ms[mi], 1, 1, 96);  /* 6 MB, stays in L3 */
        bench_mm(pool, 1024, 151936, Ms[mi], 1, 1, 2); /* lm_head, 311 MB */
        bench_mm(pool, 1024, 3072, Ms[mi], 0, 24, 48);
    }
    kern_pool *p1 = kern_pool_create(1);
    bench_mm(p1, 1024, 3072, 1, 1, 48, 96);
    bench_mm(p1, 1024, 151936, 1, 1, 1, 2);
    kern_pool_destroy(p1);
    kern_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_names),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_matmul_reference),
        cmocka_unit_test(test_matmul_bitwise),
        cmocka_unit_test(test_matmul_column_lanes),
        cmocka_unit_test(test_bf16_round_daz),
        cmocka_unit_test(test_matmul_bf16_activations),
        cmocka_unit_test(test_exp_neg),
        cmocka_unit_test(test_expf),
        cmocka_unit_test(test_softmax16),
        cmocka_unit_test(test_simd_batched_bitwise),
        cmocka_unit_test(test_attention_prefill_bitwise),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_qk_norm_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_bitwise),
        cmocka_unit_test(test_silu_mul_add),
        cmocka_unit_test(test_embed_gather),
        cmocka_unit_test(test_malformed_ops_abort),
        cmocka_unit_test(test_bench),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
