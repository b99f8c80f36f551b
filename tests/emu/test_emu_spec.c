/* tests/emu/test_emu_spec.c — kernels/cuda/spec.cu (KOP_DRAFT_SELECT, KOP_CONFIDENCE), the real CUDA
 * source, run on the CPU emulation of the CUDA primitives (tests/emu/emu_cuda.h) against the CPU
 * kernels (kern_cpu_exec), as tests/gpu/test_cuda_ops.c does on a GPU.
 *
 * Why: CI has no GPU; this runs the kernels' index arithmetic, the per-slot launch sequence of the
 * Markov head (slot k reads slot k-1's argmax key), the cross-block argmax keys and the warp sums on
 * every CI run.
 *
 * draft_select: integer-valued data, so every sum is exact whatever the order: drafts and the updated
 * logits must equal the CPU's bitwise, ties (lowest id), NaN (never chosen; logit 0 NaN -> 0) and
 * -0 == +0 included, and rows of absent sequences keep the poison. confidence: within 1e-5 of the
 * CPU, rows past n keep the poison. Every op runs under two thread schedules (uniform, warps running
 * ahead), which must agree bitwise. Then the data-dependent check (previous token out of range).
 *
 * Limits: those of the emulation (emu_cuda.h): no memory-model fidelity, blocks run one after another,
 * no inline PTX, warp-synchronous code without an explicit sync is not modelled, C library math. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/kern.h"
#include "tests/emu/emu_kernels.h"
#include "tests/gpu/gpu_test.h"

static kern_pool *g_pool;

static const uint64_t SEEDS[2] = {0x5eed0004ull, 0x5eed0003ull}; /* uniform, run ahead */

typedef int (*emu_fn)(const kern_op *op, uint64_t seed, char *msg, size_t msglen);

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}
static int32_t *i32_fill(size_t n, int32_t v)
{
    int32_t *p = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}
static float *f32_rows(gpu_rng *r, size_t rows, size_t cols, size_t live, float scale)
{
    float *p = xmalloc(rows * cols * 4);
    for (size_t i = 0; i < rows * cols; i++) p[i] = i < live * cols ? gpu_unif(r) * scale : gpu_poison_f32();
    return p;
}

/* Runs op on the CPU and, from copies of the same buffers, under both emulated schedules. `out` lists
 * the output buffer slots; exact: bitwise vs the CPU, else within rtol (gpu_cmp_f32). Returns the
 * failures. */
static int run_both(const kern_op *op, emu_fn fn, const int *out, const int *is_i32, int nout, int exact, double rtol,
                    const char *name)
{
    kern_op cop = *op, eop[2] = {*op, *op};
    void *cbuf[KERN_MAX_BUFS] = {0}, *ebuf[2][KERN_MAX_BUFS] = {{0}};
    for (int k = 0; k < nout; k++) {
        const int s = out[k];
        const size_t b = op->buf[s].bytes;
        cbuf[s] = xmalloc(b);
        memcpy(cbuf[s], op->buf[s].ptr, b);
        cop.buf[s].ptr = cbuf[s];
        for (int run = 0; run < 2; run++) {
            ebuf[run][s] = xmalloc(b);
            memcpy(ebuf[run][s], op->buf[s].ptr, b);
            eop[run].buf[s].ptr = ebuf[run][s];
        }
    }
    kern_cpu_exec(g_pool, &cop);
    int bad = 0;
    for (int run = 0; run < 2; run++) {
        char msg[160];
        if (fn(&eop[run], SEEDS[run], msg, sizeof msg) != 0) fail_msg("%s: the kernel recorded %s", name, msg);
    }
    for (int k = 0; k < nout; k++) {
        const int s = out[k];
        const size_t b = op->buf[s].bytes;
        char what[96];
        snprintf(what, sizeof what, "%s buf[%d]", name, s);
        if (memcmp(ebuf[0][s], ebuf[1][s], b) != 0) {
            fprintf(stderr, "%s: two thread schedules differ\n", what);
            bad++;
        }
        if (is_i32[k]) {
            bad += gpu_cmp_i32(what, cbuf[s], ebuf[0][s], b / 4);
        } else if (exact) { /* bitwise: NaN inputs stay NaN with their bits, poison stays poison */
            const uint32_t *c = cbuf[s], *e = ebuf[0][s];
            int nb = 0;
            for (size_t i = 0; i < b / 4; i++)
                if (c[i] != e[i] && nb++ < 8)
                    fprintf(stderr, "%s[%zu]: bits %08x, cpu %08x\n", what, i, (unsigned)e[i], (unsigned)c[i]);
            bad += nb;
        } else
            bad += gpu_cmp_f32(what, cbuf[s], ebuf[0][s], op->buf[s].ptr, b / 4, rtol, exact);
        free(cbuf[s]);
        free(ebuf[0][s]);
        free(ebuf[1][s]);
    }
    return bad;
}

/* tests/gpu/test_cuda_ops.c's test_draft_select (row 3 starts with -0), plus a second V (one id past
 * a block's range). */
static void test_draft_select(void **state)
{
    (void)state;
    gpu_rng r = {19};
    for (int variant = 0; variant < 8; variant++) {
        const int markov = variant & 1, bf = !(variant & 2);
        const int W = 4, V = variant & 4 ? 2049 : 3000, rk = 16, max_seqs = 3, n = 2;
        const size_t rows = (size_t)max_seqs * W;
        float *lg = xmalloc(rows * V * 4);
        for (size_t i = 0; i < rows * V; i++) lg[i] = (float)gpu_int(&r, -40, 40);
        for (size_t i = (size_t)n * W * V; i < rows * V; i++) lg[i] = gpu_poison_f32(); /* rows of absent seqs */
        if (!markov) {
            lg[0 * V + 0] = NAN;      /* row 0: logit 0 NaN -> draft 0 */
            lg[1 * V + 17] = 1000.0f; /* row 1: a tie between 17 and V-1 (another block) -> 17 */
            lg[1 * V + V - 1] = 1000.0f;
            lg[2 * V + 5] = NAN; /* row 2: a NaN elsewhere is never chosen */
            lg[2 * V + 6] = 2000.0f;
            for (int v = 0; v < V; v++) lg[3 * V + v] = v % 2 ? 0.0f : -0.0f; /* row 3: -0 ties +0 -> 0 */
        }
        void *w1 = NULL, *w2 = NULL;
        const size_t wn = (size_t)V * rk, wb = wn * (bf ? 2 : 4);
        if (markov) {
            w1 = xmalloc(wb);
            w2 = xmalloc(wb);
            for (size_t i = 0; i < wn; i++) {
                const float a = (float)gpu_int(&r, -3, 3), b = (float)gpu_int(&r, -3, 3);
                if (bf) {
                    ((uint16_t *)w1)[i] = kern_f32_to_bf16(a);
                    ((uint16_t *)w2)[i] = kern_f32_to_bf16(b);
                } else {
                    ((float *)w1)[i] = a;
                    ((float *)w2)[i] = b;
                }
            }
        }
        int32_t *anchor = i32_fill(max_seqs, -1);
        for (int s = 0; s < n; s++) anchor[s] = gpu_int(&r, 0, V - 1);
        int32_t *drafts = i32_fill(rows, (int32_t)GPU_POISON_I32);
        int32_t nn = n;
        kern_op op = {.kind = KOP_DRAFT_SELECT};
        op.buf[0] = (kern_buf){lg, rows * V * 4};
        if (markov) {
            op.buf[1] = (kern_buf){w1, wb};
            op.buf[2] = (kern_buf){w2, wb};
        }
        op.buf[3] = (kern_buf){anchor, (size_t)max_seqs * 4};
        op.buf[4] = (kern_buf){drafts, rows * 4};
        op.buf[5] = (kern_buf){&nn, 4};
        op.p[0] = W;
        op.p[1] = V;
        op.p[2] = markov ? rk : 0;
        op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        op.p[4] = max_seqs;
        char name[64];
        snprintf(name, sizeof name, "draft_select markov=%d bf16=%d V=%d", markov, bf, V);
        static const int out[2] = {0, 4}, is_i32[2] = {0, 1};
        assert_int_equal(run_both(&op, emu_kc_draft_select, out, is_i32, 2, 1, 0.0, name), 0);
        free(lg);
        free(w1);
        free(w2);
        free(anchor);
        free(drafts);
    }
}

/* tests/gpu/test_cuda_ops.c's test_confidence, plus 72 rows (9 blocks of 8 warps, 68 live). */
static void test_confidence(void **state)
{
    (void)state;
    gpu_rng r = {20};
    for (int variant = 0; variant < 4; variant++) {
        const int with_w1 = variant > 0, bf = variant == 1;
        const int W = variant == 3 ? 4 : 3, H = variant == 3 ? 100 : 64, rk = 16, V = 100,
                  max_seqs = variant == 3 ? 18 : 4, n = variant == 3 ? 17 : 3;
        const size_t rows = (size_t)max_seqs * W;
        float *h = f32_rows(&r, rows, H, (size_t)n * W, 1.0f);
        void *w1 = NULL;
        const size_t w1b = (size_t)V * rk * (bf ? 2 : 4);
        if (with_w1) {
            w1 = xmalloc(w1b);
            for (size_t i = 0; i < (size_t)V * rk; i++) {
                const float x = gpu_unif(&r);
                if (bf) ((uint16_t *)w1)[i] = kern_f32_to_bf16(x);
                else ((float *)w1)[i] = x;
            }
        }
        int32_t *drafts = i32_fill(rows, -3);
        for (size_t i = 0; i < (size_t)n * W; i++) drafts[i] = gpu_int(&r, 0, V - 1);
        int32_t *anchor = i32_fill(max_seqs, -3);
        for (int s = 0; s < n; s++) anchor[s] = gpu_int(&r, 0, V - 1);
        float *w = f32_rows(&r, (size_t)H + rk, 1, (size_t)H + rk, 0.3f), *b = f32_rows(&r, 1, 1, 1, 1.0f);
        float *conf = f32_rows(&r, rows, 1, 0, 0.0f);
        int32_t nn = n;
        kern_op op = {.kind = KOP_CONFIDENCE};
        op.buf[0] = (kern_buf){h, rows * H * 4};
        if (with_w1) op.buf[1] = (kern_buf){w1, w1b};
        op.buf[2] = (kern_buf){drafts, rows * 4};
        op.buf[3] = (kern_buf){anchor, (size_t)max_seqs * 4};
        op.buf[4] = (kern_buf){w, ((size_t)H + rk) * 4};
        op.buf[5] = (kern_buf){b, 4};
        op.buf[6] = (kern_buf){conf, rows * 4};
        op.buf[7] = (kern_buf){&nn, 4};
        op.p[0] = W;
        op.p[1] = H;
        op.p[2] = rk;
        op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        op.p[4] = max_seqs;
        op.p[5] = V;
        char name[64];
        snprintf(name, sizeof name, "confidence w1=%d bf16=%d rows=%zu", with_w1, bf, rows);
        static const int out[1] = {6}, is_i32[1] = {0};
        assert_int_equal(run_both(&op, emu_kc_confidence, out, is_i32, 1, 0, 1e-5, name), 0);
        free(h);
        free(w1);
        free(drafts);
        free(anchor);
        free(w);
        free(b);
        free(conf);
    }
}

/* A previous token outside [0, V) (the CPU aborts): the kernels record it and skip what depends on it;
 * the other sequences / rows are still the CPU's. */
static void test_prev_checks(void **state)
{
    (void)state;
    const int W = 2, V = 50, rk = 4, max_seqs = 2;
    const size_t lb = (size_t)max_seqs * W * V * 4, wb = (size_t)V * rk * 4;
    float *lg = xmalloc(lb), *lg_cpu = xmalloc(lb), *w1 = xmalloc(wb), *w2 = xmalloc(wb);
    gpu_rng r = {23};
    for (int i = 0; i < max_seqs * W * V; i++) lg[i] = (float)gpu_int(&r, -9, 9);
    for (int i = 0; i < V * rk; i++) {
        w1[i] = (float)gpu_int(&r, -2, 2);
        w2[i] = (float)gpu_int(&r, -2, 2);
    }
    memcpy(lg_cpu, lg, lb);
    int32_t anchor[2] = {3, V}, drafts[4] = {-7, -7, -7, -7}, cpu_drafts[4] = {-7, -7, -7, -7}, nn = 2, one = 1;
    kern_op op = {.kind = KOP_DRAFT_SELECT};
    op.buf[0] = (kern_buf){lg, lb};
    op.buf[1] = (kern_buf){w1, wb};
    op.buf[2] = (kern_buf){w2, wb};
    op.buf[3] = (kern_buf){anchor, sizeof anchor};
    op.buf[4] = (kern_buf){drafts, sizeof drafts};
    op.buf[5] = (kern_buf){&nn, 4};
    op.p[0] = W;
    op.p[1] = V;
    op.p[2] = rk;
    op.p[3] = KERN_DT_F32;
    op.p[4] = max_seqs;
    char msg[160] = "";
    assert_int_equal(emu_kc_draft_select(&op, SEEDS[1], msg, sizeof msg), 1);
    if (!strstr(msg, "KC_ERR_PREV")) fail_msg("draft_select: recorded '%s', expected KC_ERR_PREV", msg);
    kern_op cop = op; /* sequence 0 alone on the CPU */
    cop.buf[0].ptr = lg_cpu;
    cop.buf[4].ptr = cpu_drafts;
    cop.buf[5].ptr = &one;
    kern_cpu_exec(g_pool, &cop);
    assert_memory_equal(drafts, cpu_drafts, 2 * sizeof drafts[0]);
    assert_memory_equal(lg, lg_cpu, (size_t)W * V * 4);

    /* confidence: row 3 (sequence 1, slot 1) reads drafts[2] as its previous token */
    enum { H = 8 };
    float h[2 * 2 * H], w[H + 4], b[1] = {0.5f}, conf[4], cpu_conf[4];
    for (size_t i = 0; i < sizeof h / 4; i++) h[i] = gpu_unif(&r);
    for (size_t i = 0; i < sizeof w / 4; i++) w[i] = gpu_unif(&r);
    for (int i = 0; i < 4; i++) conf[i] = cpu_conf[i] = gpu_poison_f32();
    int32_t cdr[4] = {1, 2, V + 5, 3}, canchor[2] = {3, 4};
    kern_op fop = {.kind = KOP_CONFIDENCE};
    fop.buf[0] = (kern_buf){h, sizeof h};
    fop.buf[1] = (kern_buf){w1, wb};
    fop.buf[2] = (kern_buf){cdr, sizeof cdr};
    fop.buf[3] = (kern_buf){canchor, sizeof canchor};
    fop.buf[4] = (kern_buf){w, sizeof w};
    fop.buf[5] = (kern_buf){b, sizeof b};
    fop.buf[6] = (kern_buf){conf, sizeof conf};
    fop.buf[7] = (kern_buf){&nn, 4};
    fop.p[0] = W;
    fop.p[1] = H;
    fop.p[2] = rk;
    fop.p[3] = KERN_DT_F32;
    fop.p[4] = max_seqs;
    fop.p[5] = V;
    msg[0] = 0;
    assert_int_equal(emu_kc_confidence(&fop, SEEDS[0], msg, sizeof msg), 1);
    if (!strstr(msg, "KC_ERR_PREV")) fail_msg("confidence: recorded '%s', expected KC_ERR_PREV", msg);
    assert_int_equal(gpu_bits(conf[3]), GPU_POISON_BITS);
    cdr[2] = 0; /* the CPU on valid input: rows 0..2 do not depend on drafts[2] */
    fop.buf[6].ptr = cpu_conf;
    kern_cpu_exec(g_pool, &fop);
    for (int i = 0; i < 3; i++)
        if (!(fabs((double)conf[i] - (double)cpu_conf[i]) <= 1e-5)) fail_msg("confidence row %d: %.9g, cpu %.9g", i, (double)conf[i], (double)cpu_conf[i]);
    free(lg);
    free(lg_cpu);
    free(w1);
    free(w2);
}

int main(void)
{
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_select),
        cmocka_unit_test(test_confidence),
        cmocka_unit_test(test_prev_checks),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    return rc;
}
