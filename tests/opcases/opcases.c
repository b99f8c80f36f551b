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
