/* tests/opcases/opcases.c — the one-op cases shared by tests/gpu/test_cuda_ops.c and tests/emu/test_emu_*.c
 * (opcases.h). Shapes cover each kernel's paths; see the test files' headers for what each family checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/opcases/opcases.h"

/* ---- building ---------------------------------------------------------------------------------------- */
void oc_init(oc_case *t, kern_op_kind kind, double rtol)
{
    memset(t, 0, sizeof *t);
    t->op.kind = kind;
    for (int i = 0; i < OC_SLOTS; i++) t->alias[i] = -1;
    t->rtol = rtol;
}
void oc_buf(oc_case *t, int slot, void *host, size_t bytes, int role)
{
    t->host[slot] = host;
    t->bytes[slot] = bytes;
    t->type[slot] = role;
}
void oc_view(oc_case *t, int slot, int of, size_t off, size_t bytes)
{
    t->alias[slot] = of;
    t->off[slot] = off;
    t->bytes[slot] = bytes;
    t->type[slot] = OC_IN; /* compared through the slot it views */
}
int oc_compare(const oc_case *t, int s, const void *cpu, const void *got, const char *what)
{
    switch (t->type[s]) {
    case OC_OUT_F32: return gpu_cmp_f32(what, cpu, got, t->host[s], t->bytes[s] / 4, t->rtol, t->exact[s]);
    case OC_OUT_I32: return gpu_cmp_i32(what, cpu, got, t->bytes[s] / 4);
    case OC_OUT_CMP: return t->cmp(t, s, cpu, got, what);
    default: return 0;
    }
}
void oc_check(oc_harness *h, oc_case *t, const char *name)
{
    h->n_run++;
    const int bad = h->run(h, t, name);
    if (bad) fail_msg("%s: %d failures", name, bad);
}

/* ---- data -------------------------------------------------------------------------------------------- */
void *oc_alloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    assert_non_null(p);
    return p;
}
float *oc_poison(size_t n)
{
    float *p = oc_alloc(n * 4);
    for (size_t i = 0; i < n; i++) p[i] = gpu_poison_f32();
    return p;
}
float *oc_rows(gpu_rng *r, size_t rows, size_t cols, size_t live, float scale)
{
    float *p = oc_poison(rows * cols);
    for (size_t i = 0; i < live * cols; i++) p[i] = gpu_unif(r) * scale;
    return p;
}
float *oc_rand(gpu_rng *r, size_t n, float scale) { return oc_rows(r, n, 1, n, scale); }
float *oc_near1(gpu_rng *r, size_t n)
{
    float *p = oc_rand(r, n, 0.2f);
    for (size_t i = 0; i < n; i++) p[i] += 1.0f;
    return p;
}
void *oc_weights(gpu_rng *r, int bf, size_t n, float scale)
{
    if (!bf) return oc_rand(r, n, scale);
    uint16_t *p = oc_alloc(n * 2);
    for (size_t i = 0; i < n; i++) p[i] = kern_f32_to_bf16(gpu_unif(r) * scale);
    return p;
}
uint8_t *oc_fp8_codes(gpu_rng *r, size_t n)
{
    uint8_t *p = oc_alloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) {
        do p[i] = (uint8_t)gpu_next(r);
        while ((p[i] & 0x7f) == 0x7f); /* never a NaN code (the loader refuses them) */
    }
    return p;
}
float *oc_fp8_scales(gpu_rng *r, size_t n)
{
    float *p = oc_alloc(n * 4);
    for (size_t i = 0; i < n; i++) p[i] = ldexpf(1.0f + 0.5f * gpu_unif(r), gpu_int(r, -14, -6)); /* ~ amax / 448 */
    return p;
}
int32_t *oc_i32(size_t n, int32_t v)
{
    int32_t *p = oc_alloc(n * 4);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}
float *oc_inv_freq(int hd, double base)
{
    float *inv = oc_alloc((size_t)hd / 2 * 4);
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(base, 2.0 * i / hd));
    return inv;
}
int32_t *oc_block_tables(gpu_rng *r, const oc_cache_geo *g)
{
    int32_t *bt = oc_i32((size_t)g->max_seqs * g->max_blocks, -1);
    int32_t *pool = oc_i32((size_t)g->num_blocks, 0);
    for (int i = 0; i < g->num_blocks; i++) pool[i] = i;
    for (int i = g->num_blocks - 1; i > 0; i--) {
        const int j = gpu_int(r, 0, i), x = pool[i];
        pool[i] = pool[j];
        pool[j] = x;
    }
    int next = 0;
    for (int s = 0; s < g->max_seqs; s++)
        for (int b = 0; b < g->max_blocks && next < g->num_blocks; b++) bt[s * g->max_blocks + b] = pool[next++];
    free(pool);
    return bt;
}

/* ---- KOP_RMSNORM: H 100 / 1024 / 4096 + 96 (the re-read tail), out of place and in place -------------- */
void opcase_rmsnorm(oc_harness *h)
{
    gpu_rng r = {51};
    const int Hs[] = {100, 1024, 4096 + 96};
    for (int hi = 0; hi < 3; hi++)
        for (int inplace = 0; inplace < 2; inplace++) {
            const int H = Hs[hi], max_rows = 6, n = hi == 2 ? 2 : 4;
            oc_case t;
            oc_init(&t, KOP_RMSNORM, oc_rtol(h, 1e-5, 1e-4));
            float *x = oc_rows(&r, max_rows, H, n, 3.0f);
            if (inplace) {
                oc_buf(&t, 0, x, (size_t)max_rows * H * 4, OC_OUT_F32);
                oc_view(&t, 2, 0, 0, (size_t)max_rows * H * 4);
            } else {
                oc_buf(&t, 0, x, (size_t)max_rows * H * 4, OC_IN);
                oc_buf(&t, 2, oc_poison((size_t)max_rows * H), (size_t)max_rows * H * 4, OC_OUT_F32);
            }
            oc_buf(&t, 1, oc_near1(&r, H), (size_t)H * 4, OC_IN);
            oc_buf(&t, 3, oc_i32(1, n), 4, OC_IN);
            t.op.p[0] = H;
            t.op.p[1] = max_rows;
            t.op.f[0] = 1e-6f;
            char name[96];
            snprintf(name, sizeof name, "rmsnorm H %d %s", H, inplace ? "in place" : "out of place");
            oc_check(h, &t, name);
        }
}

/* ---- KOP_QK_NORM_ROPE: both norms, none (exact rope on the emulation), only one; hd 16 .. 256; row strides
 * with extra columns (untouched); keys only (nh 0) on a view that starts inside each row ------------------ */
void opcase_qk_norm_rope(oc_harness *h)
{
    gpu_rng r = {52};
    const struct {
        int nh, nkv, hd, qn, kn, extra_cols;
    } cases[] = {{4, 2, 64, 1, 1, 0},  {4, 2, 64, 0, 0, 16},  {2, 2, 16, 1, 1, 0}, {5, 1, 256, 1, 1, 0},
                 {8, 1, 256, 1, 1, 0}, {3, 1, 128, 1, 1, 32}, {2, 1, 128, 0, 1, 8}, {8, 8, 16, 1, 0, 0}};
    /* large angles: a GPU's sincosf differs from glibc's by an ulp or two of the angle */
    const double rtol = oc_rtol(h, 1e-5, 2e-4);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int nh = cases[ci].nh, nkv = cases[ci].nkv, hd = cases[ci].hd;
        const int stride = (nh + 2 * nkv) * hd + cases[ci].extra_cols, max_rows = 5, n = 3;
        oc_case t;
        oc_init(&t, KOP_QK_NORM_ROPE, rtol);
        oc_buf(&t, 0, oc_rows(&r, max_rows, stride, n, 2.0f), (size_t)max_rows * stride * 4, OC_OUT_F32);
        if (cases[ci].qn) oc_buf(&t, 1, oc_near1(&r, hd), (size_t)hd * 4, OC_IN);
        if (cases[ci].kn) oc_buf(&t, 2, oc_near1(&r, hd), (size_t)hd * 4, OC_IN);
        int32_t *pos = oc_i32(max_rows, -7);
        for (int i = 0; i < n; i++) pos[i] = gpu_int(&r, 0, 6000);
        pos[0] = 0; /* angle 0: cos 1, sin 0 */
        oc_buf(&t, 3, pos, max_rows * 4, OC_IN);
        oc_buf(&t, 4, oc_inv_freq(hd, 1000000.0), (size_t)hd / 2 * 4, OC_IN);
        oc_buf(&t, 5, oc_i32(1, n), 4, OC_IN);
        t.op.p[0] = nh;
        t.op.p[1] = nkv;
        t.op.p[2] = hd;
        t.op.p[3] = stride;
        t.op.p[4] = max_rows;
        t.op.f[0] = 1e-6f;
        /* without norms the rope is the CPU's expression: bitwise with the same libm */
        t.exact[0] = h->emu && !cases[ci].qn && !cases[ci].kn;
        char name[96];
        snprintf(name, sizeof name, "qk_norm_rope nh %d nkv %d hd %d norms q %d k %d", nh, nkv, hd, cases[ci].qn,
                 cases[ci].kn);
        oc_check(h, &t, name);
    }
    /* keys only (nh = 0) on a view that starts inside each row, as the drafter's context path */
    for (int norm = 0; norm < 2; norm++) {
        const int nkv = 2, hd = 32, L = 3, cols = 2 * nkv * hd * L, max_rows = 4, n = 2;
        oc_case t;
        oc_init(&t, KOP_QK_NORM_ROPE, rtol);
        const size_t full = (size_t)(max_rows + 1) * cols * 4, off = (size_t)1 * 2 * nkv * hd * 4;
        oc_buf(&t, OC_EXTRA, oc_rows(&r, max_rows + 1, cols, n, 2.0f), full, OC_OUT_F32);
        oc_view(&t, 0, OC_EXTRA, off, (size_t)max_rows * cols * 4);
        if (norm) oc_buf(&t, 2, oc_near1(&r, hd), (size_t)hd * 4, OC_IN);
        int32_t *pos = oc_i32(max_rows, 0);
        pos[0] = 5;
        pos[1] = 900;
        oc_buf(&t, 3, pos, max_rows * 4, OC_IN);
        oc_buf(&t, 4, oc_inv_freq(hd, 10000.0), (size_t)hd / 2 * 4, OC_IN);
        oc_buf(&t, 5, oc_i32(1, n), 4, OC_IN);
        t.op.p[0] = 0;
        t.op.p[1] = nkv;
        t.op.p[2] = hd;
        t.op.p[3] = cols;
        t.op.p[4] = max_rows;
        t.op.f[0] = 1e-6f;
        t.exact[OC_EXTRA] = h->emu && !norm;
        oc_check(h, &t, norm ? "qk_norm_rope keys-only view, k norm" : "qk_norm_rope keys-only view");
    }
}

/* ---- KOP_EMBED: f32 / bf16 tables, padding ids out of range (must not be read), bitwise --------------- */
void opcase_embed(oc_harness *h)
{
    gpu_rng r = {61};
    for (int bf = 0; bf < 2; bf++) {
        const int H = bf ? 300 : 96, V = 50, max_rows = 8, n = 5;
        oc_case t;
        oc_init(&t, KOP_EMBED, oc_rtol(h, 1e-5, 2e-3));
        int32_t *ids = oc_i32(max_rows, -999);
        for (int i = 0; i < n; i++) ids[i] = gpu_int(&r, 0, V - 1);
        ids[1] = V - 1;
        ids[2] = 0;
        oc_buf(&t, 0, ids, max_rows * 4, OC_IN);
        oc_buf(&t, 1, oc_weights(&r, bf, (size_t)V * H, 1.0f), (size_t)V * H * (bf ? 2 : 4), OC_IN);
        oc_buf(&t, 2, oc_poison((size_t)max_rows * H), (size_t)max_rows * H * 4, OC_OUT_F32);
        oc_buf(&t, 3, oc_i32(1, n), 4, OC_IN);
        t.op.p[0] = H;
        t.op.p[1] = V;
        t.op.p[2] = max_rows;
        t.op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        t.exact[2] = 1;
        oc_check(h, &t, bf ? "embed bf16" : "embed f32");
    }
}

/* ---- KOP_GATHER_ROWS: repeated and boundary indices, bitwise -------------------------------------------- */
void opcase_gather_rows(oc_harness *h)
{
    gpu_rng r = {62};
    const int H = 300, x_rows = 9, max_out = 5, n = 4;
    oc_case t;
    oc_init(&t, KOP_GATHER_ROWS, oc_rtol(h, 1e-5, 2e-3));
    oc_buf(&t, 0, oc_rand(&r, (size_t)x_rows * H, 1.0f), (size_t)x_rows * H * 4, OC_IN);
    int32_t *idx = oc_i32(max_out, 1000);
    idx[0] = 8;
    idx[1] = 0;
    idx[2] = 8;
    idx[3] = 4;
    oc_buf(&t, 1, idx, max_out * 4, OC_IN);
    oc_buf(&t, 2, oc_poison((size_t)max_out * H), (size_t)max_out * H * 4, OC_OUT_F32);
    oc_buf(&t, 3, oc_i32(1, n), 4, OC_IN);
    t.op.p[0] = H;
    t.op.p[1] = x_rows;
    t.op.p[2] = max_out;
    t.exact[2] = 1;
    oc_check(h, &t, "gather_rows");
}

/* ---- KOP_COPY_COLS: into each column block of a wider row (the last one ends at the row's end) ---------- */
void opcase_copy_cols(oc_harness *h)
{
    gpu_rng r = {66};
    for (int blk = 0; blk < 3; blk++) {
        const int H = 40, k = 3, stride = k * H + 4, max_rows = 6, n = 4;
        oc_case t;
        oc_init(&t, KOP_COPY_COLS, oc_rtol(h, 1e-5, 2e-3));
        oc_buf(&t, 0, oc_rows(&r, max_rows, H, n, 1.0f), (size_t)max_rows * H * 4, OC_IN);
        oc_buf(&t, 1, oc_poison((size_t)max_rows * stride), (size_t)max_rows * stride * 4, OC_OUT_F32);
        oc_buf(&t, 2, oc_i32(1, n), 4, OC_IN);
        t.op.p[0] = H;
        t.op.p[1] = stride;
        t.op.p[2] = blk * H + (blk == 2 ? 4 : 0);
        t.op.p[3] = max_rows;
        t.exact[1] = 1;
        char name[64];
        snprintf(name, sizeof name, "copy_cols block %d", blk);
        oc_check(h, &t, name);
    }
}

/* ---- KOP_SILU_MUL: I % 4 == 0 (float4) and not, a misaligned output (scalar path), many rows, zero rows;
 * within 1e-6 (the same expf expression) ----------------------------------------------------------------- */
void opcase_silu_mul(oc_harness *h)
{
    gpu_rng r = {63};
    const struct {
        int I, max_rows, n, out_off; /* out_off: out starts out_off floats into its buffer */
        const char *what;
    } cases[] = {{100, 7, 5, 0, "float4"},         {256, 9, 9, 0, "float4, every row"},
                 {256, 7, 5, 0, "float4, I 256"},  {37, 7, 6, 0, "I % 4 != 0"},
                 {64, 5, 3, 1, "misaligned out"}, {300, 40, 33, 0, "grid-stride over many rows"},
                 {64, 4, 0, 0, "zero rows"}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int I = cases[ci].I, M = cases[ci].max_rows, n = cases[ci].n, oo = cases[ci].out_off;
        oc_case t;
        oc_init(&t, KOP_SILU_MUL, 1e-6);
        float *gu = oc_rows(&r, M, 2 * (size_t)I, n, 6.0f);
        if (n > 0) {
            gu[0] = -100.0f; /* expf(100) overflows: silu -> -0 */
            gu[1] = 100.0f;
        }
        oc_buf(&t, 0, gu, (size_t)M * 2 * I * 4, OC_IN);
        oc_buf(&t, OC_EXTRA, oc_poison((size_t)M * I + (size_t)oo), ((size_t)M * I + (size_t)oo) * 4, OC_OUT_F32);
        oc_view(&t, 1, OC_EXTRA, (size_t)oo * 4, (size_t)M * I * 4);
        oc_buf(&t, 2, oc_i32(1, n), 4, OC_IN);
        t.op.p[0] = I;
        t.op.p[1] = M;
        char name[96];
        snprintf(name, sizeof name, "silu_mul I %d: %s", I, cases[ci].what);
        oc_check(h, &t, name);
    }
}

/* ---- KOP_ADD: out of place, in place (y == x), H % 4 != 0, a misaligned x, many rows, zero rows; bitwise.
 * x rows past n finite (x + anything there would change it), y rows past n poisoned ---------------------- */
void opcase_add(oc_harness *h)
{
    gpu_rng r = {64};
    const struct {
        int H, max_rows, n, same, x_off;
        const char *what;
    } cases[] = {{256, 6, 4, 0, 0, "float4"},        {256, 6, 4, 1, 0, "float4, y == x"},
                 {101, 6, 4, 0, 0, "H % 4 != 0"},    {101, 6, 5, 1, 0, "H % 4 != 0, y == x"},
                 {128, 5, 3, 0, 1, "misaligned x"}, {512, 40, 37, 0, 0, "grid-stride over many rows"},
                 {256, 4, 0, 0, 0, "zero rows"}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int H = cases[ci].H, M = cases[ci].max_rows, n = cases[ci].n, xo = cases[ci].x_off;
        oc_case t;
        oc_init(&t, KOP_ADD, oc_rtol(h, 1e-5, 2e-3));
        const size_t xb = (size_t)M * H * 4;
        oc_buf(&t, OC_EXTRA, oc_rand(&r, (size_t)M * H + (size_t)xo, 1.0f), xb + (size_t)xo * 4, OC_OUT_F32);
        oc_view(&t, 0, OC_EXTRA, (size_t)xo * 4, xb);
        if (cases[ci].same) oc_view(&t, 1, OC_EXTRA, (size_t)xo * 4, xb);
        else oc_buf(&t, 1, oc_rows(&r, M, H, n, 1.0f), xb, OC_IN);
        oc_buf(&t, 2, oc_i32(1, n), 4, OC_IN);
        t.op.p[0] = H;
        t.op.p[1] = M;
        t.exact[OC_EXTRA] = 1;
        char name[96];
        snprintf(name, sizeof name, "add H %d: %s", H, cases[ci].what);
        oc_check(h, &t, name);
    }
}

/* ---- KOP_KV_WRITE: rows of several slots (one masked), positions across blocks; caches bitwise, untouched
 * positions keep the poison ------------------------------------------------------------------------------ */
void oc_kv_write_case(oc_case *tp, double rtol, gpu_rng *r, const oc_cache_geo *g, int nh, int max_rows, int n,
                      const int *sl, const int *ps)
{
    const int stride = (nh + 2 * g->nkv) * g->hd + 8;
    const size_t head = (size_t)g->nkv * g->hd, cache = (size_t)g->num_blocks * g->bs * head;
    oc_init(tp, KOP_KV_WRITE, rtol);
    oc_buf(tp, 0, oc_rows(r, max_rows, stride, n, 1.0f), (size_t)max_rows * stride * 4, OC_IN);
    oc_buf(tp, 1, oc_poison(cache), cache * 4, OC_OUT_F32);
    oc_buf(tp, 2, oc_poison(cache), cache * 4, OC_OUT_F32);
    int32_t *slot = oc_i32(max_rows, 99), *pos = oc_i32(max_rows, -99);
    for (int i = 0; i < n; i++) {
        slot[i] = sl[i];
        pos[i] = ps[i];
    }
    oc_buf(tp, 3, slot, max_rows * 4, OC_IN);
    oc_buf(tp, 4, pos, max_rows * 4, OC_IN);
    oc_buf(tp, 5, oc_block_tables(r, g), (size_t)g->max_seqs * g->max_blocks * 4, OC_IN);
    oc_buf(tp, 6, oc_i32(1, n), 4, OC_IN);
    tp->op.p[0] = g->nkv;
    tp->op.p[1] = g->hd;
    tp->op.p[2] = stride;
    tp->op.p[3] = nh * g->hd;
    tp->op.p[4] = (nh + g->nkv) * g->hd;
    tp->op.p[5] = g->bs;
    tp->op.p[6] = g->max_blocks;
    tp->op.p[7] = max_rows;
    tp->exact[1] = tp->exact[2] = 1;
}

static void kvw_case(oc_harness *h, gpu_rng *r, const oc_cache_geo *g, int nh, int max_rows, int n, const int *sl,
                     const int *ps, const char *name)
{
    oc_case t;
    oc_kv_write_case(&t, oc_rtol(h, 1e-5, 2e-3), r, g, nh, max_rows, n, sl, ps);
    oc_check(h, &t, name);
}

void opcase_kv_write(oc_harness *h)
{
    gpu_rng r = {41};
    const oc_cache_geo g = {2, 32, 4, 6, 3, 18};
    const int sl[6] = {0, 0, 2, -1, 1, 2}, ps[6] = {0, 5, 23, 7, 13, 22};
    kvw_case(h, &r, &g, 4, 8, 6, sl, ps, "kv_write");
    /* head of 144 floats: more than the block's 128 threads */
    const oc_cache_geo g2 = {3, 48, 16, 2, 2, 4};
    const int sl2[3] = {1, 0, 1}, ps2[3] = {31, 0, 16};
    kvw_case(h, &r, &g2, 6, 3, 3, sl2, ps2, "kv_write head 144");
}

/* ---- KOP_ATTENTION: head dims 16 .. 288, GQA groups 1 .. 16, masked rows, kv_len 0 / 1 / 63 / 64 / 65 / 300
 * and long (many splits), drafter-style rows, few rows (split) and many (unsplit), the emulation's scratch
 * for 1 or 3 rows (row chunks; a GPU runs those with its own scratch) ------------------------------------- */
typedef struct {
    int nh, nkv, hd, bs, max_blocks, max_rows, n;
    int kvl[8];    /* kv_len of rows 0..7 (< 0: random in 1..max_kv); rows >= 8 random */
    int masked;    /* this row gets slot -1 (-1: none) */
    int drafter;   /* rows 0..drafter-1 share slot 0 and kv_len kvl[0] */
    int attn_rows; /* the emulation's scratch for this many rows' partials (0: the default) */
    const char *what;
} attn_case;

static void attn_run(oc_harness *h, const attn_case *c, gpu_rng *r)
{
    const int max_seqs = 3;
    const oc_cache_geo g = {c->nkv, c->hd, c->bs, c->max_blocks, max_seqs, max_seqs * c->max_blocks + 2};
    const size_t head = (size_t)g.nkv * g.hd, cache = (size_t)g.num_blocks * g.bs * head;
    const int q_stride = (c->nh + 2 * c->nkv) * c->hd, max_kv = c->bs * c->max_blocks;
    oc_case t;
    oc_init(&t, KOP_ATTENTION, oc_rtol(h, 2e-5, 1e-4));
    oc_buf(&t, 0, oc_rows(r, c->max_rows, q_stride, c->n, 1.0f), (size_t)c->max_rows * q_stride * 4, OC_IN);
    oc_buf(&t, 1, oc_rand(r, cache, 1.0f), cache * 4, OC_IN);
    oc_buf(&t, 2, oc_rand(r, cache, 1.0f), cache * 4, OC_IN);
    const size_t ob = (size_t)c->max_rows * c->nh * c->hd;
    oc_buf(&t, 3, oc_poison(ob), ob * 4, OC_OUT_F32);
    int32_t *slot = oc_i32(c->max_rows, 77), *kvl = oc_i32(c->max_rows, -5);
    for (int i = 0; i < c->n; i++) {
        slot[i] = gpu_int(r, 0, max_seqs - 1);
        kvl[i] = i < 8 && c->kvl[i] >= 0 ? c->kvl[i] : gpu_int(r, 1, max_kv);
        if (i < c->drafter) {
            slot[i] = 0;
            kvl[i] = kvl[0];
        }
    }
    if (c->masked >= 0) slot[c->masked] = -1;
    oc_buf(&t, 4, slot, c->max_rows * 4, OC_IN);
    oc_buf(&t, 5, kvl, c->max_rows * 4, OC_IN);
    oc_buf(&t, 6, oc_block_tables(r, &g), (size_t)max_seqs * g.max_blocks * 4, OC_IN);
    oc_buf(&t, 7, oc_i32(1, c->n), 4, OC_IN);
    t.op.p[0] = c->nh;
    t.op.p[1] = c->nkv;
    t.op.p[2] = c->hd;
    t.op.p[3] = q_stride;
    t.op.p[4] = c->bs;
    t.op.p[5] = c->max_blocks;
    t.op.p[6] = c->max_rows;
    t.op.f[0] = (float)(1.0 / sqrt((double)c->hd)) * 4.0f; /* sharper softmax than the default */
    if (c->attn_rows) {
        long long ys = ((long long)max_kv + 63) / 64;
        if (ys > 64) ys = 64;
        t.attn_bytes = (size_t)c->attn_rows * c->nh * (size_t)ys * ((size_t)c->hd + 2) * 4 + 100;
    }
    char name[160];
    snprintf(name, sizeof name, "attention nh %d nkv %d hd %d: %s", c->nh, c->nkv, c->hd, c->what);
    oc_check(h, &t, name);
}

void opcase_attention(oc_harness *h)
{
    gpu_rng r = {42};
    const attn_case cases[] = {
        {4, 4, 32, 16, 20, 8, 7, {0, 1, 63, 64, 65, 300, 320, 2}, 1, 0, 0, "group 1, kv_len 0 .. 320, masked row"},
        {8, 4, 64, 16, 20, 6, 6, {300, 65, 64, 63, 1, 0, -1, -1}, 2, 0, 0, "group 2"},
        {8, 2, 128, 16, 20, 5, 5, {65, 300, 1, 64, 0, -1, -1, -1}, 0, 0, 0, "group 4, hd 128"},
        {8, 1, 64, 8, 40, 5, 4, {300, 63, 0, 129, -1, -1, -1, -1}, 3, 0, 0, "group 8"},
        {16, 1, 32, 16, 6, 4, 3, {65, 96, 1, -1, -1, -1, -1, -1}, -1, 0, 0, "group 16: two head chunks of 8"},
        {32, 2, 64, 16, 4, 4, 3, {64, -1, 0, -1, -1, -1, -1, -1}, 1, 0, 0, "group 16, hd 64"},
        {8, 2, 64, 16, 8, 3, 3, {128, -1, 0, -1, -1, -1, -1, -1}, 1, 0, 0, "GQA 4, few rows: split"},
        {4, 4, 128, 16, 70, 2, 2, {1100, -1, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "long context, split in many chunks"},
        {4, 4, 128, 16, 4, 64, 50, {64, -1, 0, -1, -1, -1, -1, -1}, 1, 0, 0, "many rows: unsplit"},
        {8, 2, 64, 16, 8, 6, 5, {100, 0, 0, 0, 0, 0, 0, 0}, -1, 5, 0, "drafter block: 5 rows, one slot, one kv_len"},
        {4, 2, 64, 16, 20, 9, 8, {300, 1, 65, 0, 200, 64, 129, 63}, 6, 0, 1, "scratch for 1 row: row chunks of 1"},
        {4, 2, 32, 16, 20, 9, 9, {300, 1, 65, 0, 200, 64, 129, 63}, 2, 0, 3, "scratch for 3 rows: row chunks of 3"},
        {2, 1, 16, 4, 8, 5, 4, {32, 1, 17, 5, -1, -1, -1, -1}, -1, 0, 0, "hd 16 (half the lanes idle)"},
        {6, 2, 80, 16, 4, 4, 4, {64, 1, 33, 50, -1, -1, -1, -1}, -1, 0, 0, "hd 80"},
        {8, 2, 256, 8, 10, 3, 3, {80, 1, 65, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 256, group 4"},
        {8, 1, 256, 8, 3, 2, 2, {24, 9, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 256, group 8 in two chunks"},
        {16, 2, 256, 8, 8, 3, 2, {64, -1, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 256, group 8, nh 16"},
        {4, 2, 256, 16, 6, 2, 2, {96, 1, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 256, group 2"},
        {2, 2, 128, 16, 6, 2, 2, {70, 33, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 128, group 1"},
        /* the other (NV, G) instantiations: every one of the 16 runs in this family */
        {8, 2, 32, 16, 6, 2, 2, {70, 5, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 32, group 4"},
        {2, 2, 64, 16, 6, 2, 2, {70, 5, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 64, group 1"},
        {4, 2, 128, 16, 6, 2, 2, {70, 5, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 128, group 2"},
        {8, 1, 128, 16, 6, 2, 2, {70, 5, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 128, group 8"},
        {2, 2, 256, 16, 6, 2, 2, {70, 5, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 256, group 1"},
        {2, 1, 288, 16, 6, 3, 2, {70, 3, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "hd 288 (NV 32)"},
        {2, 2, 32, 64, 80, 2, 2, {5000, 4097, -1, -1, -1, -1, -1, -1}, -1, 0, 0, "past 4096 keys: capped splits"},
        {4, 2, 32, 16, 4, 5, 0, {0, 0, 0, 0, 0, 0, 0, 0}, -1, 0, 0, "zero rows"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) attn_run(h, &cases[ci], &r);
}

/* ---- KOP_MATMUL: tensor-core (N % 16 != 0, K of 1 .. 64 chunks, 1 / 2 / 4 row groups, several 32-row tiles)
 * and CUDA-core (f32 weights; bf16 with K % 32 != 0 or misaligned x) paths, bias, accumulate, zero rows ---- */
typedef struct {
    int K, N, M, n, bf, bias, acc, xoff; /* xoff: x starts xoff floats into its buffer */
    const char *path;
} mm_case;

/* FP8 weights (kern.h KOP_MATMUL, KERN_DT_FP8): e4m3 codes over the whole code range (no NaN) with
 * block scales; block rows 1 (channel), 16 and 128, block columns 16 to 128 with partial last blocks
 * (N % b0, K % b1 != 0), bias, accumulate, several row tiles, zero rows. */
void opcase_matmul_fp8(oc_harness *h)
{
    gpu_rng r = {37};
    const struct {
        int K, N, M, n, b0, b1, bias, acc;
        const char *what;
    } cases[] = {
        {256, 200, 8, 5, 128, 128, 1, 0, "128 x 128 blocks, partial last block row, bias"},
        {100, 70, 4, 4, 16, 32, 0, 1, "16 x 32 blocks, K % b1 != 0, accumulate"},
        {64, 50, 64, 40, 1, 64, 1, 1, "channel scales (1-row blocks), 2 row tiles, bias, accumulate"},
        {1024, 96, 1, 1, 128, 128, 0, 0, "decode"},
        {48, 9, 38, 38, 16, 16, 0, 0, "n == max_rows: a partial group in the second tile"},
        {96, 24, 8, 0, 16, 32, 1, 0, "zero rows"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int K = cases[ci].K, N = cases[ci].N, M = cases[ci].M, n = cases[ci].n, b0 = cases[ci].b0,
                  b1 = cases[ci].b1;
        const size_t sr = (size_t)(N + b0 - 1) / (size_t)b0, sc = (size_t)(K + b1 - 1) / (size_t)b1;
        oc_case t;
        oc_init(&t, KOP_MATMUL, oc_rtol(h, 2e-5, 1e-4));
        oc_buf(&t, 0, oc_rows(&r, (size_t)M, (size_t)K, (size_t)n, 1.0f), (size_t)M * K * 4, OC_IN);
        oc_buf(&t, 1, oc_fp8_codes(&r, (size_t)N * K), (size_t)N * K, OC_IN);
        if (cases[ci].bias) oc_buf(&t, 2, oc_rand(&r, (size_t)N, 1.0f), (size_t)N * 4, OC_IN);
        float *out = cases[ci].acc ? oc_rows(&r, (size_t)M, (size_t)N, (size_t)n, 2.0f) : oc_poison((size_t)M * N);
        oc_buf(&t, 3, out, (size_t)M * N * 4, OC_OUT_F32);
        oc_buf(&t, 4, oc_i32(1, n), 4, OC_IN);
        oc_buf(&t, 5, oc_fp8_scales(&r, sr * sc), sr * sc * 4, OC_IN);
        t.op.p[0] = K;
        t.op.p[1] = N;
        t.op.p[2] = M;
        t.op.p[3] = KERN_DT_FP8;
        t.op.p[4] = cases[ci].acc;
        t.op.p[5] = b0;
        t.op.p[6] = b1;
        char name[192];
        snprintf(name, sizeof name, "matmul fp8 K %d N %d max_rows %d n %d blocks %dx%d: %s", K, N, M, n, b0, b1,
                 cases[ci].what);
        oc_check(h, &t, name);
    }
}

void opcase_matmul(oc_harness *h)
{
    gpu_rng r = {31};
    const mm_case cases[] = {
        {256, 200, 8, 5, 1, 1, 0, 0, "tensor-core RG 1, 8 warps, N % 16 == 8, bias"},
        {256, 200, 8, 5, 1, 0, 1, 0, "tensor-core RG 1, N % 16 == 8, accumulate"},
        {256, 70, 8, 8, 1, 0, 1, 0, "tensor-core RG 1, N % 16 == 6, accumulate"},
        {32, 40, 4, 3, 1, 1, 0, 0, "tensor-core, K = 1 chunk (1 warp)"},
        {96, 64, 16, 16, 1, 1, 1, 0, "tensor-core RG 2, K = 3 chunks (3 warps), full bucket"},
        {96, 64, 4, 3, 1, 1, 0, 0, "tensor-core RG 1, K = 3 chunks"},
        {512, 48, 16, 11, 1, 0, 0, 0, "tensor-core RG 2, 16 chunks (two per iteration)"},
        {512, 96, 16, 16, 1, 1, 1, 0, "tensor-core RG 2, full bucket, bias, accumulate"},
        {512, 96, 32, 17, 1, 0, 0, 0, "tensor-core RG 4"},
        {768, 24, 32, 17, 1, 1, 0, 0, "tensor-core RG 4, 24 chunks (odd per warp)"},
        {1024, 1000, 1, 1, 1, 0, 0, 0, "tensor-core decode"},
        {2048, 48, 2, 2, 1, 0, 1, 0, "tensor-core long K, small N, accumulate"},
        {256, 300, 100, 77, 1, 1, 1, 0, "tensor-core, 4 row tiles (partial, one empty), bias, accumulate"},
        {128, 64, 64, 64, 1, 0, 0, 0, "tensor-core, 2 full row tiles"},
        {256, 40, 8, 0, 1, 1, 0, 0, "tensor-core, zero rows"},
        {128, 40, 100, 0, 1, 0, 1, 0, "tensor-core, zero rows, 4 row tiles"},
        {128, 40, 0, 0, 1, 1, 0, 0, "max_rows 0"},
        {100, 70, 4, 4, 1, 1, 0, 0, "bf16 K % 32 != 0 -> CUDA-core"},
        {256, 50, 40, 33, 1, 1, 1, 1, "bf16, x misaligned -> CUDA-core, 2 row tiles"},
        {64, 50, 4, 3, 0, 1, 0, 0, "f32 CUDA-core"},
        {64, 50, 64, 40, 0, 1, 1, 0, "f32 CUDA-core, 2 row tiles, accumulate"},
        {70, 9, 64, 45, 0, 1, 1, 0, "f32 CUDA-core, K % 32 != 0, 2 row tiles, accumulate"},
        {100, 30, 6, 6, 1, 0, 0, 0, "bf16 CUDA-core, n == max_rows: a partial 4-row group at x's end"},
        {64, 20, 38, 38, 0, 1, 0, 0, "f32 CUDA-core, n == max_rows: a partial group in the second tile"},
        {37, 8, 6, 0, 0, 0, 0, 0, "f32 CUDA-core, zero rows"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const mm_case *c = &cases[ci];
        /* a zero-byte buffer: the emulation's case (the GPU harness allocates arena buffers) */
        if (c->M == 0 && !h->emu) continue;
        oc_case t;
        /* both keep the f32 activations (the tensor-core kernel as bf16 hi + lo) */
        oc_init(&t, KOP_MATMUL, oc_rtol(h, 2e-5, 1e-4));
        const size_t xb = (size_t)c->M * c->K * 4;
        float *x = oc_rows(&r, (size_t)c->M * c->K + (size_t)c->xoff, 1, (size_t)c->n * c->K + (size_t)c->xoff, 1.0f);
        if (c->xoff) {
            oc_buf(&t, OC_EXTRA, x, xb + (size_t)c->xoff * 4, OC_IN);
            oc_view(&t, 0, OC_EXTRA, (size_t)c->xoff * 4, xb);
        } else {
            oc_buf(&t, 0, x, xb, OC_IN);
        }
        oc_buf(&t, 1, oc_weights(&r, c->bf, (size_t)c->N * c->K, 0.5f), (size_t)c->N * c->K * (c->bf ? 2 : 4), OC_IN);
        if (c->bias) oc_buf(&t, 2, oc_rand(&r, c->N, 1.0f), (size_t)c->N * 4, OC_IN);
        float *out = c->acc ? oc_rows(&r, c->M, c->N, c->n, 2.0f) : oc_poison((size_t)c->M * c->N);
        oc_buf(&t, 3, out, (size_t)c->M * c->N * 4, OC_OUT_F32);
        oc_buf(&t, 4, oc_i32(1, c->n), 4, OC_IN);
        t.op.p[0] = c->K;
        t.op.p[1] = c->N;
        t.op.p[2] = c->M;
        t.op.p[3] = c->bf ? KERN_DT_BF16 : KERN_DT_F32;
        t.op.p[4] = c->acc;
        char name[160];
        snprintf(name, sizeof name, "matmul K %d N %d max_rows %d n %d: %s", c->K, c->N, c->M, c->n, c->path);
        oc_check(h, &t, name);
    }
}

/* ---- KOP_DRAFT_SELECT: integer-valued data, so every sum is exact whatever the order: drafts and the
 * updated logits bitwise equal to the CPU's, ties (lowest id, one of them in another block), NaN (never
 * chosen; logit 0 NaN -> 0), -0 (id 0) tying +0; rows of absent sequences keep the poison. Markov head
 * f32 / bf16; V 3000 and 2049 (one id past a block's range) ------------------------------------------ */
void opcase_draft_select(oc_harness *h)
{
    gpu_rng r = {19};
    for (int variant = 0; variant < 8; variant++) {
        const int markov = variant & 1, bf = !(variant & 2);
        const int W = 4, V = variant & 4 ? 2049 : 3000, rk = 16, max_seqs = 3, n = 2;
        const size_t rows = (size_t)max_seqs * W;
        oc_case t;
        oc_init(&t, KOP_DRAFT_SELECT, 0.0);
        float *lg = oc_alloc(rows * V * 4);
        for (size_t i = 0; i < rows * V; i++) lg[i] = (float)gpu_int(&r, -40, 40);
        for (size_t i = (size_t)n * W * V; i < rows * V; i++) lg[i] = gpu_poison_f32(); /* rows of absent seqs */
        if (!markov) {
            lg[0 * V + 0] = NAN;      /* row 0: logit 0 NaN -> draft 0 */
            lg[1 * V + 17] = 1000.0f; /* row 1: a tie between 17 and V-1 (another block) -> 17 */
            lg[1 * V + V - 1] = 1000.0f;
            lg[2 * V + 5] = NAN; /* row 2: a NaN elsewhere is never chosen */
            lg[2 * V + 6] = 2000.0f;
            for (int v = 0; v < V; v++) lg[3 * V + v] = v % 2 ? 0.0f : -0.0f; /* row 3: -0 (id 0) ties +0 -> 0 */
        }
        oc_buf(&t, 0, lg, rows * V * 4, OC_OUT_F32);
        if (markov) {
            const size_t wn = (size_t)V * rk, wb = wn * (bf ? 2 : 4);
            void *w1 = oc_alloc(wb), *w2 = oc_alloc(wb);
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
            oc_buf(&t, 1, w1, wb, OC_IN);
            oc_buf(&t, 2, w2, wb, OC_IN);
        }
        int32_t *anchor = oc_i32(max_seqs, -1);
        for (int s = 0; s < n; s++) anchor[s] = gpu_int(&r, 0, V - 1);
        oc_buf(&t, 3, anchor, (size_t)max_seqs * 4, OC_IN);
        oc_buf(&t, 4, oc_i32(rows, (int32_t)GPU_POISON_I32), rows * 4, OC_OUT_I32);
        oc_buf(&t, 5, oc_i32(1, n), 4, OC_IN);
        t.op.p[0] = W;
        t.op.p[1] = V;
        t.op.p[2] = markov ? rk : 0;
        t.op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        t.op.p[4] = max_seqs;
        t.exact[0] = 1; /* bitwise: NaN inputs keep their bits, -0 stays -0, poison stays poison */
        char name[64];
        snprintf(name, sizeof name, "draft_select markov=%d bf16=%d V=%d", markov, bf, V);
        oc_check(h, &t, name);
    }
}

/* ---- KOP_CONFIDENCE: without / with the w1 embedding (f32, bf16), 12 rows and 72 (9 blocks of 8 warps, 68
 * live); within 1e-5 of the CPU, rows past n keep the poison ------------------------------------------- */
void opcase_confidence(oc_harness *h)
{
    gpu_rng r = {20};
    for (int variant = 0; variant < 4; variant++) {
        const int with_w1 = variant > 0, bf = variant == 1;
        const int W = variant == 3 ? 4 : 3, H = variant == 3 ? 100 : 64, rk = 16, V = 100,
                  max_seqs = variant == 3 ? 18 : 4, n = variant == 3 ? 17 : 3;
        const size_t rows = (size_t)max_seqs * W;
        oc_case t;
        oc_init(&t, KOP_CONFIDENCE, 1e-5);
        oc_buf(&t, 0, oc_rows(&r, rows, H, (size_t)n * W, 1.0f), rows * H * 4, OC_IN);
        if (with_w1) oc_buf(&t, 1, oc_weights(&r, bf, (size_t)V * rk, 1.0f), (size_t)V * rk * (bf ? 2 : 4), OC_IN);
        int32_t *drafts = oc_i32(rows, -3);
        for (size_t i = 0; i < (size_t)n * W; i++) drafts[i] = gpu_int(&r, 0, V - 1);
        oc_buf(&t, 2, drafts, rows * 4, OC_IN);
        int32_t *anchor = oc_i32(max_seqs, -3);
        for (int s = 0; s < n; s++) anchor[s] = gpu_int(&r, 0, V - 1);
        oc_buf(&t, 3, anchor, (size_t)max_seqs * 4, OC_IN);
        oc_buf(&t, 4, oc_rand(&r, (size_t)H + rk, 0.3f), ((size_t)H + rk) * 4, OC_IN);
        oc_buf(&t, 5, oc_rand(&r, 1, 1.0f), 4, OC_IN);
        oc_buf(&t, 6, oc_poison(rows), rows * 4, OC_OUT_F32);
        oc_buf(&t, 7, oc_i32(1, n), 4, OC_IN);
        t.op.p[0] = W;
        t.op.p[1] = H;
        t.op.p[2] = rk;
        t.op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        t.op.p[4] = max_seqs;
        t.op.p[5] = V;
        char name[64];
        snprintf(name, sizeof name, "confidence w1=%d bf16=%d rows=%zu", with_w1, bf, rows);
        oc_check(h, &t, name);
    }
}

/* ---- KOP_SAMPLE -------------------------------------------------------------------------------------
 * Random rows of every mode (greedy, temperature, top-k, top-p, min-p and their combinations; bans short,
 * past the kernel's shared-memory staging, duplicated, the best id banned; n_logprobs 0 / 5 / 20; verify
 * rows whose draft is the argmax, a random id or a banned id; score rows) through one op, compared field
 * by field: tok, accepted, rank, n_top and the top ids equal, logprobs within 1e-5 (absolute; -inf
 * equal). Some rows are rounded to a coarse grid so that exact ties (broken by the lower id) are
 * common, some carry a tie at the maximum or a run of tied best ids inside one warp batch, some mask
 * most ids with -inf. Every out word
 * starts as the poison; what the CPU leaves unwritten (top entries past n_top, rows past n) must stay
 * poisoned. A GPU runs each op twice (bitwise equal: the kernel's sums have fixed orders), the emulation
 * under two schedules. Draws differ between backends only when u * zz or top_p * z1 lands within rounding
 * of a running-sum boundary: with these seeds, never. Larger shapes only on a GPU (!h->emu). */
typedef struct {
    int n_rows, n_acc, n_rej, n_drawn_not_best, n_verify_greedy, n_long_bans, n_scored;
    int n_pen, n_extra, n_bias, n_pen_changed; /* penalized rows, with extra ids, with logit_bias; tok moved */
} oc_sample_stats;

int32_t oc_sample_best(const float *l, int V, const int32_t *ban, int nb)
{
    int32_t best = -1;
    uint64_t bk = 0;
    for (int32_t i = 0; i < V; i++) {
        int banned = 0;
        for (int k = 0; k < nb; k++) banned |= ban[k] == i;
        if (banned) continue;
        const uint64_t k = kern_sample_key(l[i], i);
        if (best < 0 || k > bk) {
            best = i;
            bk = k;
        }
    }
    return best;
}

void oc_sample_rows(gpu_rng *r, float *logits, kern_sample_params *prm, int32_t *bans, int NB, int V, int n,
                    int long_bans)
{
    int ban_used = 0;
    for (int j = 0; j < n; j++) {
        float *l = logits + (size_t)j * V;
        const int shape = gpu_int(r, 0, V < 100 ? 3 : 6);
        const float scale = 1.0f + 9.0f * (gpu_unif(r) * 0.5f + 0.5f);
        for (int i = 0; i < V; i++) {
            const float x = gpu_unif(r) * scale;
            l[i] = shape == 1 ? roundf(x * 4) / 4 : x; /* coarse: ties everywhere */
        }
        if (shape == 2) { /* a tie at the maximum: the lower id wins */
            const int a = gpu_int(r, 0, V - 1), b = gpu_int(r, 0, V - 1);
            l[a] = l[b] = scale + 1.0f;
        } else if (shape == 3) { /* a peaked row: verification accepts often */
            l[gpu_int(r, 0, V - 1)] = scale + 6.0f;
        } else if (shape == 4) { /* most ids masked with -inf (grammar masks) */
            for (int i = 0; i < V; i++)
                if (gpu_int(r, 0, 15) != 0) l[i] = -INFINITY;
            l[gpu_int(r, 0, V - 1)] = scale;
        } else if (shape == 5) { /* a run of tied best ids inside one warp batch: selections descend into
                                  * the id bytes of the key, where a bin's candidates share a warp batch */
            const int m = gpu_int(r, 2, 9), a = gpu_int(r, 0, V - m);
            for (int i = a; i < a + m; i++) l[i] = scale + 0.5f;
        }
        kern_sample_params *p = &prm[j];
        memset(p, 0, sizeof *p);
        const int mode = j % 10;
        const float T = 0.3f + 1.5f * (gpu_unif(r) * 0.5f + 0.5f);
        p->temperature = mode == 0 ? (j % 20 == 0 ? 0.0f : 1e-6f) : T;
        p->top_k = (mode == 2 || mode == 5 || mode == 7) ? gpu_int(r, 1, 60) : mode == 8 ? V : mode == 9 ? 1 : 0;
        p->top_p = (mode == 3 || mode == 5 || mode == 6 || mode == 7) ? 0.05f + 0.9f * (gpu_unif(r) * 0.5f + 0.5f)
                                                                      : (j % 3 ? 1.0f : 0.0f); /* off both ways */
        p->min_p = (mode == 4 || mode == 6 || mode == 7) ? 0.3f * (gpu_unif(r) * 0.5f + 0.5f) : 0.0f;
        p->seed = gpu_next(r);
        p->counter = gpu_next(r) % 5000;
        static const int nlp[3] = {0, 5, 20};
        p->n_logprobs = nlp[(j / 10) % 3];
        p->ban_off = ban_used;
        p->n_ban = 0;
        if (long_bans && j % 7 == 1) p->n_ban = 600 < NB - ban_used ? 600 : NB - ban_used; /* past the staged bans */
        else if (gpu_int(r, 0, 2) == 0) p->n_ban = gpu_int(r, 1, 6);
        if (ban_used + p->n_ban > NB) p->n_ban = 0;
        for (int b = 0; b < p->n_ban; b++) bans[ban_used + b] = gpu_int(r, 0, V - 1);
        if (p->n_ban >= 2) { /* the best raw id banned, and a duplicate */
            int32_t top = 0;
            for (int i = 1; i < V; i++)
                if (kern_sample_key(l[i], i) > kern_sample_key(l[top], top)) top = i;
            bans[ban_used] = top;
            bans[ban_used + 1] = top;
        }
        ban_used += p->n_ban;
        const int kind = gpu_int(r, 0, 5); /* verify rows: the argmax, a random id, a banned id */
        p->draft = -1;
        if (kind == 1 || kind == 2) p->draft = oc_sample_best(l, V, bans + p->ban_off, p->n_ban);
        else if (kind == 3) p->draft = gpu_int(r, 0, V - 1);
        else if (kind == 4 && p->n_ban > 0) p->draft = bans[p->ban_off + gpu_int(r, 0, p->n_ban - 1)];
        else if (kind == 5 && j % 2) { /* a score row (prompt logprobs): the given id, maybe banned */
            p->draft = gpu_int(r, 0, V - 1);
            p->score = 1;
        }
    }
}

/* Penalties and logit_bias on the rows [0, n): each row on with probability 1/2 (slot j % slots), the
 * slots' pen_state words (prompt bits, output counts) over a small id range so that they matter, a
 * launch's update pairs, extra ids (after the bans the rows use) and per-slot sorted bias lists. */
void oc_sample_penalties(gpu_rng *r, kern_sample_params *prm, int n, int V, int32_t *bans, int NB, int32_t *pen_state,
                         int slots, kern_logit_bias *bias, int max_bias, int32_t *upd, int max_upd)
{
    int used = 0;
    for (int j = 0; j < n; j++)
        if (prm[j].ban_off + prm[j].n_ban > used) used = prm[j].ban_off + prm[j].n_ban;
    const int span = V < 300 ? V : 300;
    int bl[16];
    assert_true(slots <= 16);
    for (int s = 0; s < slots; s++) {
        int32_t *st = pen_state + (size_t)s * V;
        for (int k = 0; k < 40; k++) st[gpu_int(r, 0, span - 1)] |= 1;
        for (int k = 0; k < 60; k++) st[gpu_int(r, 0, span - 1)] += 2 * gpu_int(r, 1, 3);
        int32_t id = gpu_int(r, 0, V < 30 ? V - 1 : 30);
        bl[s] = 0;
        for (; bl[s] < max_bias && id < V; bl[s]++) { /* ascending ids */
            bias[(size_t)s * max_bias + bl[s]].id = id;
            bias[(size_t)s * max_bias + bl[s]].bias = gpu_int(r, 0, 4) == 0 ? (gpu_int(r, 0, 1) ? 100.0f : -100.0f)
                                                                            : 12.0f * gpu_unif(r);
            id += gpu_int(r, 1, V < 100 ? 2 : 40);
        }
    }
    if (upd) {
        upd[0] = gpu_int(r, 0, max_upd);
        for (int q = 0; q < upd[0]; q++) {
            upd[1 + 2 * q] = gpu_int(r, 0, slots - 1);
            upd[2 + 2 * q] = gpu_int(r, 0, span - 1);
        }
    }
    for (int j = 0; j < n; j++) {
        kern_sample_params *p = &prm[j];
        p->slot = j % slots;
        if (gpu_int(r, 0, 1)) {
            p->pen = 1;
            const int what = gpu_int(r, 0, 3);
            p->rep = what == 1 ? 1.0f : 1.0f + 0.9f * gpu_unif(r);
            p->freq = what == 2 ? 0.0f : 2.0f * gpu_unif(r);
            p->pres = what == 3 ? 0.0f : 2.0f * gpu_unif(r);
            const int ne = gpu_int(r, 0, 6);
            if (used + ne <= NB) {
                p->extra_off = used;
                p->n_extra = ne;
                for (int k = 0; k < ne; k++) bans[used++] = gpu_int(r, 0, span - 1);
            }
        } else {
            p->rep = 1.0f;
        }
        if (bl[p->slot] > 0 && gpu_int(r, 0, 2) == 0) p->n_bias = gpu_int(r, 1, bl[p->slot]);
    }
}

static int sample_lp_ok(float c, float g)
{
    return !isnan(c) && !isnan(g) && (c == g || fabs((double)c - (double)g) <= 1e-5);
}

/* the OC_OUT_CMP comparison of the sample out (slot 3); counts what the rows exercised into cmp_ctx */
static int sample_cmp(const oc_case *t, int slot, const void *cpu_out, const void *got, const char *name)
{
    const kern_sample_out *cpu = cpu_out, *g = got, *init = t->host[slot];
    const float *logits = t->host[0];
    const kern_sample_params *prm = t->host[1];
    const int32_t *bans = t->host[2];
    const int V = (int)t->op.p[0], max_rows = (int)t->op.p[1], n = *(const int32_t *)t->host[4];
    oc_sample_stats *st = t->cmp_ctx;
    int bad = 0;
#define SBAD(...)                                                                                  \
    do {                                                                                           \
        if (bad++ < 10) {                                                                          \
            fprintf(stderr, "%s row %d: ", name, j);                                               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)
    for (int j = 0; j < max_rows; j++) {
        const kern_sample_out *c = &cpu[j], *o = &g[j], *in = &init[j];
        if (j >= n) {
            if (memcmp(o, in, sizeof *o) != 0) SBAD("past n but written");
            continue;
        }
        const kern_sample_params *p = &prm[j];
        if (o->tok != c->tok || o->accepted != c->accepted)
            SBAD("tok %d acc %d, cpu tok %d acc %d (T %g k %d p %g min_p %g draft %d bans %d)", o->tok, o->accepted,
                 c->tok, c->accepted, (double)p->temperature, p->top_k, (double)p->top_p, (double)p->min_p, p->draft,
                 p->n_ban);
        if (!sample_lp_ok(c->logprob, o->logprob)) SBAD("logprob %.9g, cpu %.9g", (double)o->logprob, (double)c->logprob);
        if (o->rank != c->rank) SBAD("rank %d, cpu %d", o->rank, c->rank);
        if (o->n_top != c->n_top) SBAD("n_top %d, cpu %d", o->n_top, c->n_top);
        for (int k = 0; k < KERN_SAMPLE_MAX_TOP; k++) {
            if (k < c->n_top) {
                if (o->top[k].id != c->top[k].id) SBAD("top[%d] id %d, cpu %d", k, o->top[k].id, c->top[k].id);
                if (!sample_lp_ok(c->top[k].logprob, o->top[k].logprob))
                    SBAD("top[%d] logprob %.9g, cpu %.9g", k, (double)o->top[k].logprob, (double)c->top[k].logprob);
            } else if (memcmp(&o->top[k], &in->top[k], sizeof o->top[k]) != 0 ||
                       memcmp(&c->top[k], &in->top[k], sizeof c->top[k]) != 0) {
                SBAD("top[%d] past n_top written", k);
            }
        }
        /* what the rows exercised (from the CPU's results, so the same on either harness) */
        st->n_rows++;
        if (p->n_ban > 512) st->n_long_bans++; /* past the bans sample.cu stages in shared memory */
        st->n_pen += p->pen;
        st->n_extra += p->pen && p->n_extra > 0;
        st->n_bias += p->n_bias > 0;
        if ((p->pen || p->n_bias) && !p->score &&
            c->tok != oc_sample_best(logits + (size_t)j * V, V, p->n_ban ? bans + p->ban_off : NULL, p->n_ban))
            st->n_pen_changed++;
        if (p->score) st->n_scored += c->tok == p->draft;
        else if (p->draft >= 0 && p->temperature <= 1e-5f) st->n_verify_greedy++;
        else if (p->draft >= 0) {
            if (c->accepted) st->n_acc++;
            else st->n_rej++;
        } else if (p->temperature > 1e-5f &&
                   c->tok != oc_sample_best(logits + (size_t)j * V, V, p->n_ban ? bans + p->ban_off : NULL, p->n_ban)) {
            st->n_drawn_not_best++;
        }
    }
#undef SBAD
    return bad;
}

void opcase_sample(oc_harness *h)
{
    gpu_rng r = {21};
    const struct {
        int V, max_rows, n, long_bans, nb, gpu_only;
        const char *what;
    } cases[] = {
        {5003, 32, 30, 1, 4096, 0, "V 5003"}, /* every mode x n_logprobs 0 / 5 / 20, bans past the staging */
        {1024, 34, 32, 0, 4096, 0, "V 1024"}, /* V a multiple of the block: no partial warp batch */
        {545, 31, 30, 0, 4096, 0, "V 545"},   /* one id past a warp batch boundary, < two passes of the block */
        {20001, 12, 10, 0, 4096, 0, "V 20001"}, /* draws over several chunks of KS_THREADS * KS_DRAW_PER ids */
        {151936, 3, 2, 0, 4096, 0, "V 151936"}, /* a real vocabulary */
        {13, 12, 10, 0, 4096, 0, "V 13 (fewer ids than the top-n)"},
        {5003, 4, 0, 0, 4096, 0, "zero rows"},
        {700, 4, 4, 0, 0, 0, "no bans buffer"}, /* p2 = 0, buf 2 NULL */
        /* larger: a GPU only (the emulation's time) */
        {5003, 256, 240, 1, 4096, 1, "V 5003, 256 rows"},
        {4096, 64, 60, 0, 4096, 1, "V 4096, 64 rows"},
        {151936, 8, 6, 0, 4096, 1, "V 151936, 8 rows"},
        {13, 16, 12, 0, 4096, 1, "V 13, 16 rows"},
        {5003, 8, 0, 0, 4096, 1, "zero rows of 8"},
        {1000, 4, 4, 0, 0, 1, "no bans buffer, V 1000"},
    };
    oc_sample_stats st = {0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        if (cases[ci].gpu_only && h->emu) continue;
        const int V = cases[ci].V, max_rows = cases[ci].max_rows, n = cases[ci].n, NB = cases[ci].nb;
        float *logits = oc_poison((size_t)max_rows * V);
        kern_sample_params *prm = oc_alloc((size_t)max_rows * sizeof *prm);
        memset(prm, 0, (size_t)max_rows * sizeof *prm);
        int32_t dummy = 0, *bans = NB > 0 ? oc_i32((size_t)NB, 0) : &dummy;
        oc_sample_rows(&r, logits, prm, bans, NB, V, n, cases[ci].long_bans);
        /* penalties and logit_bias on every case but "no bans buffer" (buffers 5..7 NULL there) */
        const int pen = NB > 0, slots = 5, max_bias = 24, max_upd = 48;
        int32_t *pen_state = NULL, *upd = NULL;
        kern_logit_bias *bias = NULL;
        if (pen) {
            pen_state = oc_i32((size_t)slots * V, 0);
            bias = oc_alloc((size_t)slots * max_bias * sizeof *bias);
            upd = oc_i32(1 + 2 * (size_t)max_upd, 0);
            oc_sample_penalties(&r, prm, n, V, bans, NB, pen_state, slots, bias, max_bias, upd, max_upd);
        }
        for (int j = n; j < max_rows; j++) { /* never read: out-of-range values */
            memset(&prm[j], 0xff, sizeof prm[j]);
            prm[j].n_logprobs = 999;
        }
        if (V < KERN_SAMPLE_MAX_TOP)
            for (int j = 0; j < n; j++) prm[j].n_logprobs = KERN_SAMPLE_MAX_TOP; /* n_top = V */
        const size_t ob = (size_t)max_rows * sizeof(kern_sample_out);
        oc_case t;
        oc_init(&t, KOP_SAMPLE, 0.0);
        oc_buf(&t, 0, logits, (size_t)max_rows * V * 4, OC_IN);
        oc_buf(&t, 1, prm, (size_t)max_rows * sizeof *prm, OC_IN);
        if (NB > 0) oc_buf(&t, 2, bans, (size_t)NB * 4, OC_IN);
        oc_buf(&t, 3, oc_poison(ob / 4), ob, OC_OUT_CMP); /* every word the poison */
        oc_buf(&t, 4, oc_i32(1, n), 4, OC_IN);
        t.op.p[0] = V;
        t.op.p[1] = max_rows;
        t.op.p[2] = NB;
        if (pen) { /* pen_state is updated in place by the launch's pairs: compared exactly */
            oc_buf(&t, 5, pen_state, (size_t)slots * V * 4, OC_OUT_I32);
            oc_buf(&t, 6, bias, (size_t)slots * max_bias * sizeof *bias, OC_IN);
            oc_buf(&t, 7, upd, (1 + 2 * (size_t)max_upd) * 4, OC_IN);
            t.op.p[3] = slots;
            t.op.p[4] = max_bias;
            t.op.p[5] = max_upd;
        }
        t.cmp = sample_cmp;
        t.cmp_ctx = &st;
        t.twice = 1;
        char name[96];
        snprintf(name, sizeof name, "sample %s", cases[ci].what);
        oc_check(h, &t, name);
    }
    printf("sample: %d rows: %d verify accepted, %d rejected, %d greedy verify, %d draws not the best, %d long ban "
           "lists, %d scored; %d penalized (%d with extra ids), %d with logit_bias, %d penalized choices not the raw "
           "best\n",
           st.n_rows, st.n_acc, st.n_rej, st.n_verify_greedy, st.n_drawn_not_best, st.n_long_bans, st.n_scored,
           st.n_pen, st.n_extra, st.n_bias, st.n_pen_changed);
    const int least = h->emu ? 3 : 10; /* the GPU's larger shapes exercise more */
    assert_true(st.n_acc >= least && st.n_rej >= least && st.n_verify_greedy >= least && st.n_scored >= least &&
                st.n_drawn_not_best >= (h->emu ? 10 : 30) && st.n_long_bans >= 2);
    assert_true(st.n_pen >= least * 5 && st.n_extra >= least * 3 && st.n_bias >= least * 3 && st.n_pen_changed >= least * 3);
}

/* ---- KOP_MOE_ROUTE: ids and weights bitwise equal to the CPU's (the CUDA kernel keeps kern_expf's and the
 * contract's order of every step). Ties in q (equal logits) to the lower id, a NaN logit, -inf logits, a
 * row whose logits are all equal, E from 1 to KERN_MAX_EXPERTS, k = 1 and k = E, norm on and off, several
 * blocks of rows, zero rows; rows past n keep the poison ------------------------------------------------ */
void opcase_moe_route(oc_harness *h)
{
    gpu_rng r = {91};
    const struct {
        int E, k, max_rows, n, norm;
        const char *what;
    } cases[] = {
        {8, 2, 5, 5, 1, "Qwen3-style top-2 of 8, norm"},
        {128, 8, 9, 7, 1, "128 experts top-8 (Qwen3-30B-A3B), two blocks of rows"},
        {128, 8, 3, 3, 0, "128 experts top-8, no norm"},
        {60, 4, 4, 4, 0, "60 experts (Qwen1.5-MoE), top-4"},
        {1, 1, 3, 2, 1, "one expert"},
        {5, 5, 4, 3, 1, "k == E"},
        {33, 3, 2, 2, 1, "E not a multiple of 32"},
        {KERN_MAX_EXPERTS, 16, 2, 2, 1, "KERN_MAX_EXPERTS experts"},
        {16, 2, 6, 0, 1, "zero rows"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int E = cases[ci].E, k = cases[ci].k, M = cases[ci].max_rows, n = cases[ci].n;
        oc_case t;
        oc_init(&t, KOP_MOE_ROUTE, 0.0);
        float *l = oc_rows(&r, M, E, n, 4.0f);
        for (int row = 0; row < n; row++) {
            float *lr = l + (size_t)row * E;
            if (row == 1 && E >= 4) lr[3] = lr[1] = lr[E - 1] = 9.0f; /* a three-way tie at the top */
            if (row == 2 && E >= 4) lr[2] = NAN;                      /* a NaN logit */
            if (row == 3)
                for (int e = 0; e < E; e++) lr[e] = 0.5f; /* all equal: the k lowest ids */
            if (row == 4 && E >= 8) lr[0] = lr[5] = -INFINITY;
        }
        const size_t kb = (size_t)M * k * 4;
        int32_t *ids = oc_i32((size_t)M * k, GPU_POISON_I32);
        oc_buf(&t, 0, l, (size_t)M * E * 4, OC_IN);
        oc_buf(&t, 1, ids, kb, OC_OUT_I32);
        oc_buf(&t, 2, oc_poison((size_t)M * k), kb, OC_OUT_F32);
        oc_buf(&t, 3, oc_i32(1, n), 4, OC_IN);
        t.exact[2] = 1;
        t.op.p[0] = E;
        t.op.p[1] = k;
        t.op.p[2] = M;
        t.op.p[3] = cases[ci].norm;
        char name[160];
        snprintf(name, sizeof name, "moe_route E %d k %d max_rows %d n %d: %s", E, k, M, n, cases[ci].what);
        oc_check(h, &t, name);
    }
}

/* ---- KOP_MOE_FFN: against the CPU within the matmul's tolerance. bf16 weights with H, I % 32 == 0 (the
 * grouped tensor-core kernel for both matmuls), f32 weights and bf16 with H % 32 != 0 (the CUDA-core
 * kernel), a misaligned h (gate_up on the CUDA-core kernel, down on the tensor-core one), decode (one row),
 * every row routed to one expert (an expert's group over several row tiles), many experts each with few
 * rows, k == E, zero rows. The experts no live row chose hold NaN weights (a kernel that read them would
 * fail), ids past n are out of range (never read), out accumulates onto random live rows and keeps the
 * poison past n ------------------------------------------------------------------------------------------- */
typedef struct {
    int H, I, E, k, max_rows, n, bf, hoff, skew; /* skew: 1 every row picks expert E-1 (and the lowest others) */
    /* bf: 0 f32, 1 bf16, 2 FP8 (e4m3 codes, 16-row blocks of 32 columns, or 16 with fp8_b1 16) */
    const char *what;
} moe_case;

void opcase_moe_ffn(oc_harness *h)
{
    gpu_rng r = {92};
    const moe_case cases[] = {
        {64, 32, 8, 2, 5, 5, 1, 0, 0, "bf16 tensor-core both matmuls, top-2 of 8"},
        {128, 64, 16, 4, 20, 17, 1, 0, 0, "bf16 tensor-core, 17 rows top-4 of 16"},
        {96, 64, 32, 4, 1, 1, 1, 0, 0, "decode: one row, 4 of 32 experts read"},
        {64, 32, 4, 1, 40, 37, 1, 0, 1, "every row to one expert: 2 row tiles of one group"},
        {64, 32, 4, 2, 70, 66, 0, 0, 1, "f32, skewed: one expert's group of 66 rows (3 tiles)"},
        {40, 24, 6, 2, 6, 4, 1, 0, 0, "bf16 H % 32 != 0 -> CUDA-core"},
        {48, 20, 5, 3, 7, 7, 0, 0, 0, "f32 CUDA-core, I % 4 != 0"},
        {64, 32, 8, 2, 6, 5, 1, 1, 0, "bf16, h misaligned: gate_up CUDA-core, down tensor-core"},
        {32, 32, 3, 3, 4, 3, 1, 0, 0, "k == E"},
        {64, 32, 8, 2, 6, 0, 1, 0, 0, "zero rows"},
        {64, 32, 8, 2, 5, 5, 2, 0, 0, "FP8 experts, 16 x 32 blocks, top-2 of 8"},
        {96, 48, 16, 4, 40, 37, 2, 0, 0, "FP8 experts, 37 rows top-4 of 16 (K % 32 != 0 in down)"},
        {64, 32, 4, 2, 70, 66, 2, 0, 1, "FP8 experts, skewed: one expert's group of 66 rows"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const moe_case *c = &cases[ci];
        const int H = c->H, I = c->I, E = c->E, k = c->k, M = c->max_rows, n = c->n;
        oc_case t;
        oc_init(&t, KOP_MOE_FFN, oc_rtol(h, 1e-4, 5e-4));
        /* routing: k distinct experts per live row, ascending; rows past n out of range */
        int32_t *ids = oc_i32((size_t)M * k, E + 3);
        float *wts = oc_poison((size_t)M * k);
        uint8_t *used = calloc((size_t)E, 1);
        assert_non_null(used);
        for (int row = 0; row < n; row++) {
            uint8_t pick[KERN_MAX_EXPERTS] = {0};
            int got = 0;
            if (c->skew) pick[E - 1] = 1, got = 1;
            while (got < k) {
                const int e = c->skew ? got - 1 : gpu_int(&r, 0, E - 1);
                if (!pick[e]) pick[e] = 1, got++;
            }
            for (int e = 0, j = 0; e < E; e++)
                if (pick[e]) {
                    ids[row * k + j] = e;
                    wts[row * k + j] = 0.05f + 0.5f * (gpu_unif(&r) + 1.0f);
                    used[e] = 1;
                    j++;
                }
        }
        const int f8 = c->bf == 2, b0 = 16, b1 = 32;
        const size_t ws = f8 ? 1 : c->bf ? 2 : 4, xb = (size_t)M * H * 4;
        void *w13 = f8 ? (void *)oc_fp8_codes(&r, (size_t)E * 2 * I * H) : oc_weights(&r, c->bf, (size_t)E * 2 * I * H, 0.3f);
        void *w2 = f8 ? (void *)oc_fp8_codes(&r, (size_t)E * H * I) : oc_weights(&r, c->bf, (size_t)E * H * I, 0.3f);
        for (int e = 0; e < E; e++) /* an expert no live row chose: NaN weights (an FP8 NaN code) */
            if (!used[e]) {
                for (size_t i = 0; i < (size_t)2 * I * H; i++) {
                    const size_t at = (size_t)e * 2 * I * H + i;
                    if (f8) ((uint8_t *)w13)[at] = 0x7f;
                    else if (c->bf) ((uint16_t *)w13)[at] = 0x7fc1;
                    else ((float *)w13)[at] = NAN;
                }
                for (size_t i = 0; i < (size_t)H * I; i++) {
                    const size_t at = (size_t)e * H * I + i;
                    if (f8) ((uint8_t *)w2)[at] = 0x7f;
                    else if (c->bf) ((uint16_t *)w2)[at] = 0x7fc1;
                    else ((float *)w2)[at] = NAN;
                }
            }
        free(used);
        float *hx = oc_rows(&r, (size_t)M * H + (size_t)c->hoff, 1, (size_t)n * H + (size_t)c->hoff, 1.5f);
        if (c->hoff) {
            oc_buf(&t, OC_EXTRA, hx, xb + (size_t)c->hoff * 4, OC_IN);
            oc_view(&t, 0, OC_EXTRA, (size_t)c->hoff * 4, xb);
        } else {
            oc_buf(&t, 0, hx, xb, OC_IN);
        }
        oc_buf(&t, 1, w13, (size_t)E * 2 * I * H * ws, OC_IN);
        oc_buf(&t, 2, w2, (size_t)E * H * I * ws, OC_IN);
        oc_buf(&t, 3, ids, (size_t)M * k * 4, OC_IN);
        oc_buf(&t, 4, wts, (size_t)M * k * 4, OC_IN);
        oc_buf(&t, 5, oc_rows(&r, M, H, n, 2.0f), xb, OC_OUT_F32);
        oc_buf(&t, 6, oc_i32(1, n), 4, OC_IN);
        const size_t sb = kern_moe_scratch_bytes(E, k, H, I, M);
        oc_buf(&t, 7, oc_poison(sb / 4), sb, OC_IN); /* stale scratch: NaN */
        t.op.p[0] = H;
        t.op.p[1] = I;
        t.op.p[2] = E;
        t.op.p[3] = k;
        t.op.p[4] = M;
        t.op.p[5] = f8 ? KERN_DT_FP8 : c->bf ? KERN_DT_BF16 : KERN_DT_F32;
        if (f8) { /* the scale tables S13 [E*2I / b0, ceil(H / b1)] and S2 [E*H / b0, ceil(I / b1)] */
            const size_t n13 = (size_t)E * 2 * I / b0 * ((size_t)(H + b1 - 1) / b1);
            const size_t n2 = (size_t)E * H / b0 * ((size_t)(I + b1 - 1) / b1);
            oc_buf(&t, 8, oc_fp8_scales(&r, n13), n13 * 4, OC_IN);
            oc_buf(&t, 9, oc_fp8_scales(&r, n2), n2 * 4, OC_IN);
            t.op.p[6] = b0;
            t.op.p[7] = b1;
        }
        char name[200];
        snprintf(name, sizeof name, "moe_ffn H %d I %d E %d k %d max_rows %d n %d: %s", H, I, E, k, M, n, c->what);
        oc_check(h, &t, name);
    }
}
