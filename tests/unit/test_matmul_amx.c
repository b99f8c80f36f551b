/* tests/unit/test_matmul_amx.c — the "amx" matmul order (KERN_BF16_ACT_AMX, kernels/cpu/matmul_amx.c):
 *   - the order itself: one raw TDPBF16PS tile product (16 x 16 outputs, 1-4 k blocks, C = 0)
 *     against kern_mm_cols_amx_emul, over random values, special values (denormal inputs and
 *     results, inf, NaN, overflow) and tiny products that flush (where the CPU has AMX);
 *   - KOP_MATMUL in the amx mode on every ISA (scalar / AVX2 / AVX-512 / AVX512_BF16 emulate it,
 *     "amx" runs TDPBF16PS) against the plain-C emulation, bit for bit (a NaN only as a NaN), for
 *     every k tail, n tail and row count (1 .. 40), with bias and accumulate, 1 / 2 / 3 threads;
 *   - batch invariance: each row alone gives the bits it gives in the batch;
 *   - the other modes keep their bits (the amx setting changes only bf16 matmuls in that mode).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* value kinds: 0 normal (a wide exponent range), 1 with specials (denormals, tiny values whose
 * products flush, inf, NaN, huge), 2 tiny only (every product near or under 2^-126) */
static float rnd_val(int kind)
{
    const uint64_t r = rnd_u64();
    const float m = (float)((int)(r % 2001) - 1000) / 1000.0f;
    if (kind == 0) return ldexpf(m, (int)((r >> 20) % 24) - 12);
    if (kind == 2) return ldexpf(m, (int)((r >> 20) % 30) - 78);
    switch ((r >> 40) % 16) {
    case 0: return bitsf((uint32_t)(r >> 8) & 0x807fffffu);     /* f32 denormal */
    case 1: return bitsf(((uint32_t)(r >> 8) & 0x8000ffffu) | 0); /* bf16 denormal range */
    case 2: return ldexpf(m, -64 - (int)((r >> 20) % 10));       /* products under 2^-126 */
    case 3: return (r >> 50) & 1 ? INFINITY : -INFINITY;
    case 4: return (r >> 50) & 1 ? NAN : -NAN;
    case 5: return ldexpf(m, 100 + (int)((r >> 20) % 27));       /* products overflow */
    case 6: return 0.0f * (((r >> 50) & 1) ? 1.0f : -1.0f);
    default: return ldexpf(m, (int)((r >> 20) % 24) - 12);
    }
}
static uint16_t rnd_w(int kind)
{
    const float f = rnd_val(kind);
    if (kind == 1 && (rnd_u64() & 7) == 0) return (uint16_t)(rnd_u64() & 0x807f); /* bf16 denormal */
    return kern_f32_to_bf16(f);
}

static int isa_list(kern_isa *out) { return isa_list_of(out, 1); }

/* ---- the instruction itself ---------------------------------------------------------------------- */
#if defined(KERN_HAVE_X86) && defined(KERN_HAVE_AMX_BUILD)
#include <immintrin.h>
typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tcfg;
/* C[16][16] = sum over nblk k blocks of A[16][32 nblk] (row-major) times B (packed pairs) */
__attribute__((target("amx-tile,amx-bf16"))) static void raw_tdp(const uint16_t *A, const uint16_t *Bp, float *C, int nblk)
{
    tcfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 3; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
    _tile_zero(0);
    for (int b = 0; b < nblk; b++) {
        _tile_loadd(1, A + b * 32, 64 * nblk);
        _tile_loadd(2, Bp + b * 16 * 32, 64);
        _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, C, 64);
    _tile_release();
}
#endif

static void test_instruction_order(void **state)
{
    (void)state;
#if defined(KERN_HAVE_X86) && defined(KERN_HAVE_AMX_BUILD)
    if (!kern_amx_supported()) {
        print_message("no AMX here (or the kernel refused the tile state): the instruction is not probed\n");
        return;
    }
    enum { MAXB = 4 };
    static uint16_t A[16 * 32 * MAXB], Bp[MAXB * 16 * 32], W[16 * 32 * MAXB];
    static float X[16 * 32 * MAXB], C[256], E[256];
    long checked = 0;
    for (int it = 0; it < 1200; it++) {
        const int nblk = 1 + it % MAXB, K = 32 * nblk, kind = it % 3;
        for (int i = 0; i < 16 * K; i++) {
            A[i] = rnd_w(kind);
            X[i] = kern_bf16_to_f32(A[i]); /* exactly A (a bf16 denormal: flushed by both) */
            W[i] = rnd_w(kind);
        }
        /* W row n = output column n; B row (k pair) kk: column n at 2n, 2n + 1 */
        for (int n = 0; n < 16; n++)
            for (int k = 0; k < K; k++) Bp[(k / 32) * 512 + ((k % 32) / 2) * 32 + n * 2 + (k & 1)] = W[n * K + k];
        raw_tdp(A, Bp, C, nblk);
        kern_mm_args a = {.x = X, .w = W, .out = E, .K = K, .N = 16, .M = 16, .bf16 = 1};
        kern_mm_cols_amx_emul(&a, 0, 16);
        for (int i = 0; i < 256; i++) {
            /* a bf16 denormal activation: the matmul rounds x with DAZ first; the same zero */
            if (!same_f(C[i], E[i]))
                fail_msg("iter %d (K %d, kind %d) output %d: native %08x emulated %08x", it, K, kind, i,
                         fbits(C[i]), fbits(E[i]));
            checked++;
        }
    }
    print_message("TDPBF16PS vs the pinned order: %ld outputs, all equal\n", checked);
#else
    print_message("built without the AMX intrinsics: the instruction is not probed\n");
#endif
}

/* ---- KOP_MATMUL in the amx mode ------------------------------------------------------------------ */
typedef struct {
    int K, N, rows, accumulate, has_bias;
    float *x, *bias, *out;
    uint16_t *w;
    int32_t n;
} mm_case;

static kern_op mm_op(mm_case *c)
{
    kern_op op = {.kind = KOP_MATMUL};
    op.buf[0] = B(c->x, (size_t)c->rows * c->K * 4);
    op.buf[1] = B(c->w, (size_t)c->N * c->K * 2);
    if (c->has_bias) op.buf[2] = B(c->bias, (size_t)c->N * 4);
    op.buf[3] = B(c->out, (size_t)c->rows * c->N * 4);
    op.buf[4] = B(&c->n, 4);
    op.p[0] = c->K, op.p[1] = c->N, op.p[2] = c->rows, op.p[3] = KERN_DT_BF16, op.p[4] = c->accumulate;
    return op;
}

/* the reference: kern_mm_cols_amx_emul over all columns (then bias / accumulate as the contract) */
static void mm_ref(mm_case *c, const float *out0, float *ref)
{
    memcpy(ref, out0, (size_t)c->rows * c->N * 4);
    kern_mm_args a = {.x = c->x, .w = c->w, .bias = c->has_bias ? c->bias : NULL, .out = ref, .K = c->K, .N = c->N,
                      .M = c->n, .bf16 = 1, .accumulate = c->accumulate};
    kern_mm_cols_amx_emul(&a, 0, c->N);
}

static void check_bits(const float *got, const float *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (!same_f(got[i], want[i]))
            fail_msg("%s: element %zu: %08x vs %08x (%.9g vs %.9g)", what, i, fbits(got[i]), fbits(want[i]),
                     (double)got[i], (double)want[i]);
}

static void test_matmul_amx_every_isa(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list(isas);
    kern_pool *pools[3] = {kern_pool_create(1), kern_pool_create(2), kern_pool_create(3)};
    for (int i = 0; i < 3; i++) kern_pool_set_bf16_activations(pools[i], KERN_BF16_ACT_AMX);
    const size_t old = kern_cpu_set_min_parallel_work(0);
    static const int Ks[] = {1, 2, 31, 32, 33, 63, 64, 65, 100, 128, 200};
    static const int Ns[] = {1, 15, 16, 17, 33, 47, 48, 49, 97, 150};
    static const int Ms[] = {1, 2, 3, 15, 16, 17, 31, 33, 40};
    long cases = 0, outputs = 0;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            const int K = Ks[ki], N = Ns[ni], M = Ms[(ki + ni) % (sizeof Ms / sizeof Ms[0])];
            const int kind = (int)((ki * 7 + ni) % 3);
            mm_case c = {.K = K, .N = N, .rows = M, .n = M, .accumulate = (int)(ni & 1), .has_bias = (int)(ki & 1)};
            c.x = xalloc((size_t)M * K * 4), c.w = xalloc((size_t)N * K * 2), c.bias = xalloc((size_t)N * 4);
            c.out = xalloc((size_t)M * N * 4);
            float *out0 = xalloc((size_t)M * N * 4), *ref = xalloc((size_t)M * N * 4), *one = xalloc((size_t)N * 4 + 64);
            for (size_t i = 0; i < (size_t)M * K; i++) c.x[i] = rnd_val(kind);
            for (size_t i = 0; i < (size_t)N * K; i++) c.w[i] = rnd_w(kind);
            for (int i = 0; i < N; i++) c.bias[i] = rnd_val(0);
            for (size_t i = 0; i < (size_t)M * N; i++) out0[i] = rnd_val(0);
            mm_ref(&c, out0, ref);
            for (int ii = 0; ii < nisa; ii++)
                for (int ti = 0; ti < 3; ti++) {
                    assert_int_equal(kern_simd_force(isas[ii]), 0);
                    memcpy(c.out, out0, (size_t)M * N * 4);
                    kern_op op = mm_op(&c);
                    kern_cpu_exec(pools[ti], &op);
                    char what[128];
                    snprintf(what, sizeof what, "K %d N %d M %d kind %d isa %s threads %d", K, N, M, kind,
                             kern_cpu_isa_name(), ti + 1);
                    check_bits(c.out, ref, (size_t)M * N, what);
                    cases++;
                    outputs += (long)M * N;
                }
            /* batch invariance: each row alone (native where there is AMX) */
            for (int r = 0; r < M; r++) {
                mm_case o = c;
                o.rows = 1, o.n = 1, o.x = c.x + (size_t)r * K, o.out = one;
                memcpy(one, out0 + (size_t)r * N, (size_t)N * 4);
                kern_op op = mm_op(&o);
                kern_cpu_exec(pools[1], &op);
                check_bits(one, ref + (size_t)r * N, (size_t)N, "one row alone");
            }
            free(c.x), free(c.w), free(c.bias), free(c.out), free(out0), free(ref), free(one);
        }
    kern_cpu_set_min_parallel_work(old);
    for (int i = 0; i < 3; i++) kern_pool_destroy(pools[i]);
    print_message("amx mode: %d ISAs (native: %s), %ld runs, %ld outputs bitwise equal to the emulation\n", nisa,
                  kern_amx_supported() ? "yes" : "no", cases, outputs);
}

/* A large-ish shape (several work units per thread, K beyond one scratch row block) and the switch
 * between modes: amx results differ from bf16 pairs in general, and switching back restores the
 * pairs bits. */
static void run_modes(int K, int N, int M);
static void test_matmul_amx_modes(void **state)
{
    (void)state;
    run_modes(768, 4 * 48 + 5, 37);
    /* K 2055 (Kp 2080): the 512 KB scratch holds 112 rows, so 130 rows refill it mid-op */
    run_modes(2055, 100, 130);
    /* K 8200: the scratch holds one 16-row block, so row pairs pack their B tiles per k block on
     * the stack and the last block reads the scratch; K 16400: not even one, every tile is packed
     * where it is used */
    run_modes(8200, 20, 33);
    run_modes(16400, 20, 17);
}

static void run_modes(int K, int N, int M)
{
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list(isas);
    mm_case c = {.K = K, .N = N, .rows = M, .n = M};
    c.x = xalloc((size_t)M * K * 4), c.w = xalloc((size_t)N * K * 2), c.out = xalloc((size_t)M * N * 4);
    float *ref = xalloc((size_t)M * N * 4), *pairs = xalloc((size_t)M * N * 4), *zero = xalloc((size_t)M * N * 4);
    memset(zero, 0, (size_t)M * N * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) c.x[i] = rnd_val(0);
    for (size_t i = 0; i < (size_t)N * K; i++) c.w[i] = rnd_w(0);
    mm_ref(&c, zero, ref);
    kern_pool *pool = kern_pool_create(2);
    kern_op op = mm_op(&c);
    kern_pool_set_bf16_activations(pool, KERN_BF16_ACT_PAIRS);
    kern_cpu_exec(pool, &op);
    memcpy(pairs, c.out, (size_t)M * N * 4);
    for (int ii = 0; ii < nisa; ii++) {
        assert_int_equal(kern_simd_force(isas[ii]), 0);
        kern_pool_set_bf16_activations(pool, KERN_BF16_ACT_AMX);
        assert_int_equal(kern_pool_bf16_activations(pool), KERN_BF16_ACT_AMX);
        kern_cpu_exec(pool, &op);
        check_bits(c.out, ref, (size_t)M * N, "amx mode, large");
        kern_pool_set_bf16_activations(pool, KERN_BF16_ACT_PAIRS);
        kern_cpu_exec(pool, &op);
        check_bits(c.out, pairs, (size_t)M * N, "back to bf16 pairs");
    }
    assert_true(memcmp(ref, pairs, (size_t)M * N * 4) != 0); /* a different order: some bits differ */
    kern_pool_destroy(pool);
    isa_list(isas);
    free(c.x), free(c.w), free(c.out), free(ref), free(pairs), free(zero);
}

static void test_isa_report(void **state)
{
    (void)state;
    kern_isa isas[TEST_ISA_CAP];
    const int nisa = isa_list(isas); /* leaves the best forced */
    print_message("isa %s, amx native %d, bf16 dot native %d\n", kern_cpu_isa_name(), kern_cpu_amx_native(),
                  kern_cpu_bf16_dot_native());
    assert_int_equal(kern_cpu_amx_native(), isas[nisa - 1] == KERN_ISA_AMX);
    assert_int_equal(kern_amx_supported() && isas[nisa - 1] == KERN_ISA_AMX, kern_cpu_amx_native());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_instruction_order),
        cmocka_unit_test(test_matmul_amx_every_isa),
        cmocka_unit_test(test_matmul_amx_modes),
        cmocka_unit_test(test_isa_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
