/* tests/gpu/test_cuda_ops.c — every CUDA op against the CPU reference kernels (kern_cpu_exec) on random
 * inputs, through the CUDA backend (arena, upload, eager run, download).
 *
 * Each case builds one op twice (host buffers for the CPU, arena buffers for the GPU) from the same
 * initial contents: inputs random, padding rows of inputs (past n_rows) NaN-poisoned so that a kernel
 * reading them would turn a live result into NaN, every output element poisoned. Then: live elements
 * within bf16 tolerance of the CPU's (copies bitwise), NaN never passes, and every element the CPU
 * left unwritten (rows past n, columns outside the op, cache positions not addressed) still holds
 * the poison on the GPU. Shapes cover each kernel's paths: tensor-core (1, 2, 4 row groups, several
 * 32-row tiles) / CUDA-core matmuls (cuBLASLt: test_cuda_invariance, under GS_CUDA_FAST_GEMM=1), split and unsplit attention, GQA groups, head dims 16..256, in-place ops, views. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/backend_cuda.h"
#include "gpu_test.h"
#include "kernels/kern.h"

static eng_backend *g_be;
static kern_pool *g_pool;

/* ---- the harness ---------------------------------------------------------------------------------- */
enum { T_NONE = 0, T_IN, T_OUT_F32, T_OUT_I32 };

/* Slots 0..KERN_MAX_BUFS-1 are the op's buffers; slot OT_EXTRA holds a buffer the op only sees
 * through views (a sub-range starting inside it). */
#define OT_EXTRA KERN_MAX_BUFS
#define OT_SLOTS (KERN_MAX_BUFS + 1)

typedef struct {
    kern_op op; /* kind, p, f (buffers filled by ot_run) */
    void *host[OT_SLOTS];
    size_t bytes[OT_SLOTS];
    int type[OT_SLOTS];
    int alias[OT_SLOTS]; /* slot whose buffer this one views, or -1 */
    size_t off[OT_SLOTS];
    int exact[OT_SLOTS];
    double rtol;
} optest;

static void ot_init(optest *t, kern_op_kind kind)
{
    memset(t, 0, sizeof *t);
    t->op.kind = kind;
    for (int i = 0; i < OT_SLOTS; i++) t->alias[i] = -1;
    t->rtol = 2e-3;
}
/* Takes ownership of host (malloc'd). */
static void ot_buf(optest *t, int slot, void *host, size_t bytes, int type)
{
    t->host[slot] = host;
    t->bytes[slot] = bytes;
    t->type[slot] = type;
}
static void ot_view(optest *t, int slot, int of, size_t off, size_t bytes)
{
    t->alias[slot] = of;
    t->off[slot] = off;
    t->bytes[slot] = bytes;
    t->type[slot] = T_IN; /* compared through the slot it views */
}

static int ot_run(optest *t, const char *name)
{
    kern_op cop = t->op, gop = t->op;
    void *cbuf[OT_SLOTS] = {0}, *gbuf[OT_SLOTS] = {0};
    for (int s = 0; s < OT_SLOTS; s++) {
        if (t->type[s] == T_NONE || t->alias[s] >= 0) continue;
        cbuf[s] = malloc(t->bytes[s] ? t->bytes[s] : 1);
        assert_non_null(cbuf[s]);
        memcpy(cbuf[s], t->host[s], t->bytes[s]);
        gbuf[s] = g_be->ops->alloc(g_be, t->bytes[s], name);
        assert_non_null(gbuf[s]);
        g_be->ops->upload(g_be, gbuf[s], t->host[s], t->bytes[s]);
    }
    for (int s = 0; s < KERN_MAX_BUFS; s++) {
        if (t->alias[s] >= 0) {
            cbuf[s] = (char *)cbuf[t->alias[s]] + t->off[s];
            gbuf[s] = (char *)gbuf[t->alias[s]] + t->off[s];
        }
        cop.buf[s] = (kern_buf){cbuf[s], cbuf[s] ? t->bytes[s] : 0};
        gop.buf[s] = (kern_buf){gbuf[s], gbuf[s] ? t->bytes[s] : 0};
    }
    kern_cpu_exec(g_pool, &cop);
    eng_tape tape = {.ops = &gop, .n = 1, .cap = 1};
    g_be->ops->run(g_be, &tape);
    g_be->ops->synchronize(g_be);
    int bad = 0;
    for (int s = 0; s < OT_SLOTS; s++) {
        if (t->alias[s] >= 0 || (t->type[s] != T_OUT_F32 && t->type[s] != T_OUT_I32)) continue;
        void *got = malloc(t->bytes[s]);
        assert_non_null(got);
        g_be->ops->download(g_be, got, gbuf[s], t->bytes[s]);
        char what[96];
        snprintf(what, sizeof what, "%s buf[%d]", name, s);
        if (t->type[s] == T_OUT_F32)
            bad += gpu_cmp_f32(what, cbuf[s], got, t->host[s], t->bytes[s] / 4, t->rtol, t->exact[s]);
        else
            bad += gpu_cmp_i32(what, cbuf[s], got, t->bytes[s] / 4);
        free(got);
    }
    for (int s = 0; s < OT_SLOTS; s++) {
        if (t->alias[s] >= 0 || t->type[s] == T_NONE) continue;
        free(cbuf[s]);
        free(t->host[s]);
        g_be->ops->free(g_be, gbuf[s]);
    }
    return bad;
}

/* ---- data ------------------------------------------------------------------------------------------ */
static float *f32_poison(size_t n)
{
    float *p = malloc((n ? n : 1) * 4);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = gpu_poison_f32();
    return p;
}
/* rows x cols: random in [-scale, scale) for rows < live, poison after */
static float *f32_rows(gpu_rng *r, size_t rows, size_t cols, size_t live, float scale)
{
    float *p = f32_poison(rows * cols);
    for (size_t i = 0; i < live * cols; i++) p[i] = gpu_unif(r) * scale;
    return p;
}
static float *f32_rand(gpu_rng *r, size_t n, float scale) { return f32_rows(r, n, 1, n, scale); }
static float *f32_near1(gpu_rng *r, size_t n) /* norm weights */
{
    float *p = f32_rand(r, n, 0.2f);
    for (size_t i = 0; i < n; i++) p[i] += 1.0f;
    return p;
}
static uint16_t *bf16_rand(gpu_rng *r, size_t n, float scale)
{
    uint16_t *p = malloc((n ? n : 1) * 2);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = kern_f32_to_bf16(gpu_unif(r) * scale);
    return p;
}
static void *w_rand(gpu_rng *r, int bf, size_t n, float scale)
{
    return bf ? (void *)bf16_rand(r, n, scale) : (void *)f32_rand(r, n, scale);
}
static int32_t *i32_fill(size_t n, int32_t v)
{
    int32_t *p = malloc((n ? n : 1) * 4);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}
static int32_t *i32_one(int32_t v) { return i32_fill(1, v); }

/* ---- tests ------------------------------------------------------------------------------------------ */
static void test_embed(void **state)
{
    (void)state;
    gpu_rng r = {11};
    for (int bf = 0; bf < 2; bf++) {
        const int H = 96, V = 50, max_rows = 8, n = 5;
        optest t;
        ot_init(&t, KOP_EMBED);
        int32_t *ids = i32_fill(max_rows, -999); /* padding ids out of range: must not be read */
        for (int i = 0; i < n; i++) ids[i] = gpu_int(&r, 0, V - 1);
        ot_buf(&t, 0, ids, max_rows * 4, T_IN);
        ot_buf(&t, 1, w_rand(&r, bf, (size_t)V * H, 1.0f), (size_t)V * H * (bf ? 2 : 4), T_IN);
        ot_buf(&t, 2, f32_poison((size_t)max_rows * H), (size_t)max_rows * H * 4, T_OUT_F32);
        ot_buf(&t, 3, i32_one(n), 4, T_IN);
        t.op.p[0] = H;
        t.op.p[1] = V;
        t.op.p[2] = max_rows;
        t.op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        t.exact[2] = 1;
        assert_int_equal(ot_run(&t, "embed"), 0);
    }
}

static void test_rmsnorm(void **state)
{
    (void)state;
    gpu_rng r = {12};
    const int Hs[] = {100, 1024, 4096 + 96};
    for (int hi = 0; hi < 3; hi++)
        for (int inplace = 0; inplace < 2; inplace++) {
            const int H = Hs[hi], max_rows = 6, n = 4;
            optest t;
            ot_init(&t, KOP_RMSNORM);
            float *x = f32_rows(&r, max_rows, H, n, 3.0f);
            if (inplace) {
                ot_buf(&t, 0, x, (size_t)max_rows * H * 4, T_OUT_F32);
                ot_view(&t, 2, 0, 0, (size_t)max_rows * H * 4);
            } else {
                ot_buf(&t, 0, x, (size_t)max_rows * H * 4, T_IN);
                ot_buf(&t, 2, f32_poison((size_t)max_rows * H), (size_t)max_rows * H * 4, T_OUT_F32);
            }
            ot_buf(&t, 1, f32_near1(&r, H), (size_t)H * 4, T_IN);
            ot_buf(&t, 3, i32_one(n), 4, T_IN);
            t.op.p[0] = H;
            t.op.p[1] = max_rows;
            t.op.f[0] = 1e-6f;
            t.rtol = 1e-4;
            assert_int_equal(ot_run(&t, "rmsnorm"), 0);
        }
}

typedef struct {
    int K, N, M, n, bf, bias, acc;
    const char *path;
} mm_case;

static void test_matmul(void **state)
{
    (void)state;
    gpu_rng r = {13};
    const mm_case cases[] = {
        {256, 200, 8, 5, 1, 1, 0, "skinny RG1, N % 16 != 0, bias"},
        {256, 200, 8, 5, 1, 0, 1, "skinny RG1, accumulate"},
        {512, 96, 16, 16, 1, 1, 1, "skinny RG2, full bucket"},
        {512, 96, 32, 17, 1, 0, 0, "skinny RG4"},
        {1024, 1000, 1, 1, 1, 0, 0, "skinny decode"},
        {96, 64, 4, 3, 1, 1, 0, "skinny K = 3 chunks"},
        {2048, 48, 2, 2, 1, 0, 1, "skinny long K, small N"},
        {100, 70, 4, 4, 1, 1, 0, "bf16 K % 32 != 0 -> CUDA-core"},
        {256, 300, 100, 77, 1, 1, 1, "tensor-core, 4 row tiles, bias, accumulate"},
        {128, 64, 64, 64, 1, 0, 0, "tensor-core, 2 full row tiles"},
        {64, 50, 4, 3, 0, 1, 0, "f32 fallback"},
        {64, 50, 64, 40, 0, 1, 1, "f32 CUDA-core, 2 row tiles"},
        {256, 40, 8, 0, 1, 1, 0, "zero rows"},
        {128, 40, 100, 0, 1, 0, 1, "zero rows, 4 row tiles"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const mm_case *c = &cases[ci];
        optest t;
        ot_init(&t, KOP_MATMUL);
        ot_buf(&t, 0, f32_rows(&r, c->M, c->K, c->n, 1.0f), (size_t)c->M * c->K * 4, T_IN);
        ot_buf(&t, 1, w_rand(&r, c->bf, (size_t)c->N * c->K, 0.5f), (size_t)c->N * c->K * (c->bf ? 2 : 4), T_IN);
        if (c->bias) ot_buf(&t, 2, f32_rand(&r, c->N, 1.0f), (size_t)c->N * 4, T_IN);
        float *out = c->acc ? f32_rows(&r, c->M, c->N, c->n, 2.0f) : f32_poison((size_t)c->M * c->N);
        ot_buf(&t, 3, out, (size_t)c->M * c->N * 4, T_OUT_F32);
        ot_buf(&t, 4, i32_one(c->n), 4, T_IN);
        t.op.p[0] = c->K;
        t.op.p[1] = c->N;
        t.op.p[2] = c->M;
        t.op.p[3] = c->bf ? KERN_DT_BF16 : KERN_DT_F32;
        t.op.p[4] = c->acc;
        /* every path keeps the f32 activations (the tensor-core kernel as bf16 hi + lo) */
        t.rtol = 1e-4;
        char name[128];
        snprintf(name, sizeof name, "matmul %s", c->path);
        assert_int_equal(ot_run(&t, name), 0);
    }
}

static void test_qk_norm_rope(void **state)
{
    (void)state;
    gpu_rng r = {14};
    const struct {
        int nh, nkv, hd, norms, extra_cols;
    } cases[] = {{4, 2, 64, 1, 0}, {4, 2, 64, 0, 16}, {2, 2, 16, 1, 0}, {8, 1, 256, 1, 0}, {3, 1, 128, 1, 32}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int nh = cases[ci].nh, nkv = cases[ci].nkv, hd = cases[ci].hd;
        const int stride = (nh + 2 * nkv) * hd + cases[ci].extra_cols, max_rows = 5, n = 3;
        optest t;
        ot_init(&t, KOP_QK_NORM_ROPE);
        ot_buf(&t, 0, f32_rows(&r, max_rows, stride, n, 2.0f), (size_t)max_rows * stride * 4, T_OUT_F32);
        if (cases[ci].norms) {
            ot_buf(&t, 1, f32_near1(&r, hd), (size_t)hd * 4, T_IN);
            ot_buf(&t, 2, f32_near1(&r, hd), (size_t)hd * 4, T_IN);
        }
        int32_t *pos = i32_fill(max_rows, -7);
        for (int i = 0; i < n; i++) pos[i] = gpu_int(&r, 0, 6000);
        ot_buf(&t, 3, pos, max_rows * 4, T_IN);
        float *inv = malloc((size_t)hd / 2 * 4);
        for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(1000000.0, 2.0 * i / hd));
        ot_buf(&t, 4, inv, (size_t)hd / 2 * 4, T_IN);
        ot_buf(&t, 5, i32_one(n), 4, T_IN);
        t.op.p[0] = nh;
        t.op.p[1] = nkv;
        t.op.p[2] = hd;
        t.op.p[3] = stride;
        t.op.p[4] = max_rows;
        t.op.f[0] = 1e-6f;
        t.rtol = 2e-4; /* large angles: sincosf vs glibc differ by an ulp or two of the angle */
        assert_int_equal(ot_run(&t, "qk_norm_rope"), 0);
    }
    /* keys only (nh = 0) on a view that starts inside each row, as the drafter's context path */
    {
        const int nkv = 2, hd = 32, L = 3, cols = 2 * nkv * hd * L, max_rows = 4, n = 2;
        optest t;
        ot_init(&t, KOP_QK_NORM_ROPE);
        const size_t full = (size_t)(max_rows + 1) * cols * 4, off = (size_t)1 * 2 * nkv * hd * 4;
        float *ckv = f32_rows(&r, max_rows + 1, cols, n, 2.0f);
        ot_buf(&t, OT_EXTRA, ckv, full, T_OUT_F32);
        ot_view(&t, 0, OT_EXTRA, off, (size_t)max_rows * cols * 4);
        ot_buf(&t, 2, f32_near1(&r, hd), (size_t)hd * 4, T_IN);
        int32_t *pos = i32_fill(max_rows, 0);
        pos[0] = 5;
        pos[1] = 900;
        ot_buf(&t, 3, pos, max_rows * 4, T_IN);
        float *inv = malloc((size_t)hd / 2 * 4);
        for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(10000.0, 2.0 * i / hd));
        ot_buf(&t, 4, inv, (size_t)hd / 2 * 4, T_IN);
        ot_buf(&t, 5, i32_one(n), 4, T_IN);
        t.op.p[0] = 0;
        t.op.p[1] = nkv;
        t.op.p[2] = hd;
        t.op.p[3] = cols;
        t.op.p[4] = max_rows;
        t.op.f[0] = 1e-6f;
        t.rtol = 2e-4;
        assert_int_equal(ot_run(&t, "qk_norm_rope keys-only view"), 0);
    }
}

/* Paged cache geometry shared by kv_write and attention tests. */
typedef struct {
    int nkv, hd, bs, max_blocks, max_seqs, num_blocks;
} cache_geo;

static int32_t *block_tables(gpu_rng *r, const cache_geo *g)
{
    /* every slot gets distinct physical blocks (a shuffled pool), unused entries -1 */
    int32_t *bt = i32_fill((size_t)g->max_seqs * g->max_blocks, -1);
    int32_t *pool = malloc((size_t)g->num_blocks * 4);
    for (int i = 0; i < g->num_blocks; i++) pool[i] = i;
    for (int i = g->num_blocks - 1; i > 0; i--) {
        int j = gpu_int(r, 0, i), x = pool[i];
        pool[i] = pool[j];
        pool[j] = x;
    }
    int next = 0;
    for (int s = 0; s < g->max_seqs; s++)
        for (int b = 0; b < g->max_blocks && next < g->num_blocks; b++) bt[s * g->max_blocks + b] = pool[next++];
    free(pool);
    return bt;
}

static void test_kv_write(void **state)
{
    (void)state;
    gpu_rng r = {15};
    const cache_geo g = {2, 32, 4, 6, 3, 18};
    const int nh = 4, stride = (nh + 2 * g.nkv) * g.hd + 8, max_rows = 8, n = 6;
    const size_t head = (size_t)g.nkv * g.hd, cache = (size_t)g.num_blocks * g.bs * head;
    optest t;
    ot_init(&t, KOP_KV_WRITE);
    ot_buf(&t, 0, f32_rows(&r, max_rows, stride, n, 1.0f), (size_t)max_rows * stride * 4, T_IN);
    ot_buf(&t, 1, f32_poison(cache), cache * 4, T_OUT_F32);
    ot_buf(&t, 2, f32_poison(cache), cache * 4, T_OUT_F32);
    int32_t *slot = i32_fill(max_rows, 99), *pos = i32_fill(max_rows, -99);
    const int sl[6] = {0, 0, 2, -1, 1, 2}, ps[6] = {0, 5, 23, 7, 13, 22};
    for (int i = 0; i < n; i++) {
        slot[i] = sl[i];
        pos[i] = ps[i];
    }
    ot_buf(&t, 3, slot, max_rows * 4, T_IN);
    ot_buf(&t, 4, pos, max_rows * 4, T_IN);
    ot_buf(&t, 5, block_tables(&r, &g), (size_t)g.max_seqs * g.max_blocks * 4, T_IN);
    ot_buf(&t, 6, i32_one(n), 4, T_IN);
    t.op.p[0] = g.nkv;
    t.op.p[1] = g.hd;
    t.op.p[2] = stride;
    t.op.p[3] = nh * g.hd;
    t.op.p[4] = (nh + g.nkv) * g.hd;
    t.op.p[5] = g.bs;
    t.op.p[6] = g.max_blocks;
    t.op.p[7] = max_rows;
    t.exact[1] = t.exact[2] = 1;
    assert_int_equal(ot_run(&t, "kv_write"), 0);
}

typedef struct {
    int nh, nkv, hd, bs, max_blocks, max_rows, n, max_len;
    const char *what;
} attn_case;

static void test_attention(void **state)
{
    (void)state;
    gpu_rng r = {16};
    const attn_case cases[] = {
        {8, 2, 64, 16, 8, 3, 3, 128, "GQA 4, few rows: split"},
        {4, 4, 128, 16, 70, 2, 2, 1100, "long context, split in many chunks"},
        {4, 4, 128, 16, 4, 64, 50, 64, "many rows: unsplit"},
        {2, 1, 16, 4, 8, 5, 4, 32, "hd 16"},
        {16, 2, 256, 8, 8, 3, 2, 64, "hd 256, group 8 in two chunks"},
        {6, 2, 80, 16, 4, 4, 4, 64, "hd 80"},
        {32, 2, 64, 16, 4, 4, 3, 64, "group 16"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const attn_case *c = &cases[ci];
        const int max_seqs = 3;
        const cache_geo g = {c->nkv, c->hd, c->bs, c->max_blocks, max_seqs, max_seqs * c->max_blocks + 2};
        const size_t head = (size_t)g.nkv * g.hd, cache = (size_t)g.num_blocks * g.bs * head;
        const int q_stride = (c->nh + 2 * c->nkv) * c->hd;
        optest t;
        ot_init(&t, KOP_ATTENTION);
        ot_buf(&t, 0, f32_rows(&r, c->max_rows, q_stride, c->n, 1.0f), (size_t)c->max_rows * q_stride * 4, T_IN);
        ot_buf(&t, 1, f32_rand(&r, cache, 1.0f), cache * 4, T_IN);
        ot_buf(&t, 2, f32_rand(&r, cache, 1.0f), cache * 4, T_IN);
        ot_buf(&t, 3, f32_poison((size_t)c->max_rows * c->nh * c->hd), (size_t)c->max_rows * c->nh * c->hd * 4,
               T_OUT_F32);
        int32_t *slot = i32_fill(c->max_rows, 77), *kvl = i32_fill(c->max_rows, -5);
        for (int i = 0; i < c->n; i++) {
            slot[i] = gpu_int(&r, 0, max_seqs - 1);
            kvl[i] = gpu_int(&r, 1, c->max_len);
        }
        if (c->n >= 3) {
            slot[1] = -1;  /* masked row: zeros */
            kvl[2] = 0;    /* no keys: zeros */
            kvl[0] = c->max_len;
        }
        ot_buf(&t, 4, slot, c->max_rows * 4, T_IN);
        ot_buf(&t, 5, kvl, c->max_rows * 4, T_IN);
        ot_buf(&t, 6, block_tables(&r, &g), (size_t)max_seqs * g.max_blocks * 4, T_IN);
        ot_buf(&t, 7, i32_one(c->n), 4, T_IN);
        t.op.p[0] = c->nh;
        t.op.p[1] = c->nkv;
        t.op.p[2] = c->hd;
        t.op.p[3] = q_stride;
        t.op.p[4] = c->bs;
        t.op.p[5] = c->max_blocks;
        t.op.p[6] = c->max_rows;
        t.op.f[0] = (float)(1.0 / sqrt((double)c->hd)) * 4.0f; /* sharper softmax than the default */
        t.rtol = 1e-4;
        char name[128];
        snprintf(name, sizeof name, "attention %s", c->what);
        assert_int_equal(ot_run(&t, name), 0);
    }
}

static void test_silu_mul_add(void **state)
{
    (void)state;
    gpu_rng r = {17};
    const int Is[] = {100, 256};
    for (int ii = 0; ii < 2; ii++) {
        const int I = Is[ii], max_rows = 7, n = 5;
        optest t;
        ot_init(&t, KOP_SILU_MUL);
        ot_buf(&t, 0, f32_rows(&r, max_rows, 2 * I, n, 6.0f), (size_t)max_rows * 2 * I * 4, T_IN);
        ot_buf(&t, 1, f32_poison((size_t)max_rows * I), (size_t)max_rows * I * 4, T_OUT_F32);
        ot_buf(&t, 2, i32_one(n), 4, T_IN);
        t.op.p[0] = I;
        t.op.p[1] = max_rows;
        t.rtol = 1e-6;
        assert_int_equal(ot_run(&t, "silu_mul"), 0);
    }
    for (int same = 0; same < 2; same++)
        for (int ii = 0; ii < 2; ii++) {
            const int H = Is[ii] + 1 - ii, max_rows = 6, n = 4; /* 101 and 256 */
            optest t;
            ot_init(&t, KOP_ADD);
            ot_buf(&t, 0, f32_rows(&r, max_rows, H, n, 1.0f), (size_t)max_rows * H * 4, T_OUT_F32);
            if (same) ot_view(&t, 1, 0, 0, (size_t)max_rows * H * 4);
            else ot_buf(&t, 1, f32_rows(&r, max_rows, H, n, 1.0f), (size_t)max_rows * H * 4, T_IN);
            ot_buf(&t, 2, i32_one(n), 4, T_IN);
            t.op.p[0] = H;
            t.op.p[1] = max_rows;
            t.exact[0] = 1;
            assert_int_equal(ot_run(&t, "add"), 0);
        }
}

static void test_gather_copy_cols(void **state)
{
    (void)state;
    gpu_rng r = {18};
    {
        const int H = 72, x_rows = 9, max_out = 5, n = 3;
        optest t;
        ot_init(&t, KOP_GATHER_ROWS);
        ot_buf(&t, 0, f32_rand(&r, (size_t)x_rows * H, 1.0f), (size_t)x_rows * H * 4, T_IN);
        int32_t *idx = i32_fill(max_out, 1000);
        idx[0] = 8;
        idx[1] = 0;
        idx[2] = 8;
        ot_buf(&t, 1, idx, max_out * 4, T_IN);
        ot_buf(&t, 2, f32_poison((size_t)max_out * H), (size_t)max_out * H * 4, T_OUT_F32);
        ot_buf(&t, 3, i32_one(n), 4, T_IN);
        t.op.p[0] = H;
        t.op.p[1] = x_rows;
        t.op.p[2] = max_out;
        t.exact[2] = 1;
        assert_int_equal(ot_run(&t, "gather_rows"), 0);
    }
    {
        const int H = 40, k = 3, stride = k * H + 4, max_rows = 6, n = 4;
        optest t;
        ot_init(&t, KOP_COPY_COLS);
        ot_buf(&t, 0, f32_rows(&r, max_rows, H, n, 1.0f), (size_t)max_rows * H * 4, T_IN);
        ot_buf(&t, 1, f32_poison((size_t)max_rows * stride), (size_t)max_rows * stride * 4, T_OUT_F32);
        ot_buf(&t, 2, i32_one(n), 4, T_IN);
        t.op.p[0] = H;
        t.op.p[1] = stride;
        t.op.p[2] = H;
        t.op.p[3] = max_rows;
        t.exact[1] = 1;
        assert_int_equal(ot_run(&t, "copy_cols"), 0);
    }
}

/* Integer-valued data: every sum is exact in f32 whatever the order, so drafts and updated logits
 * must match the CPU bitwise, ties included (lowest id wins). */
static void test_draft_select(void **state)
{
    (void)state;
    gpu_rng r = {19};
    for (int variant = 0; variant < 4; variant++) {
        const int markov = variant & 1, bf = !(variant & 2);
        const int W = 4, V = 3000, rk = 16, max_seqs = 3, n = 2;
        const size_t rows = (size_t)max_seqs * W;
        optest t;
        ot_init(&t, KOP_DRAFT_SELECT);
        float *lg = malloc(rows * V * 4);
        for (size_t i = 0; i < rows * V; i++) lg[i] = (float)gpu_int(&r, -40, 40);
        for (size_t i = (size_t)n * W * V; i < rows * V; i++) lg[i] = gpu_poison_f32(); /* rows of absent seqs */
        if (!markov) {
            lg[0 * V + 0] = NAN;                   /* row 0: logit 0 NaN -> draft 0 */
            lg[1 * V + 17] = 1000.0f;              /* row 1: a tie between 17 and 2999 -> 17 */
            lg[1 * V + 2999] = 1000.0f;
            lg[2 * V + 5] = NAN;                   /* row 2: a NaN elsewhere is never chosen */
            lg[2 * V + 6] = 2000.0f;
            for (int v = 0; v < V; v++) lg[3 * V + v] = v % 2 ? 0.0f : -0.0f; /* row 3: -0 (id 0) ties +0 -> 0 */
        }
        ot_buf(&t, 0, lg, rows * V * 4, T_OUT_F32);
        if (markov) {
            const size_t wn = (size_t)V * rk;
            void *w1 = malloc(wn * (bf ? 2 : 4)), *w2 = malloc(wn * (bf ? 2 : 4));
            for (size_t i = 0; i < wn; i++) {
                float a = (float)gpu_int(&r, -3, 3), b = (float)gpu_int(&r, -3, 3);
                if (bf) {
                    ((uint16_t *)w1)[i] = kern_f32_to_bf16(a);
                    ((uint16_t *)w2)[i] = kern_f32_to_bf16(b);
                } else {
                    ((float *)w1)[i] = a;
                    ((float *)w2)[i] = b;
                }
            }
            ot_buf(&t, 1, w1, wn * (bf ? 2 : 4), T_IN);
            ot_buf(&t, 2, w2, wn * (bf ? 2 : 4), T_IN);
        }
        int32_t *anchor = i32_fill(max_seqs, -1);
        for (int s = 0; s < n; s++) anchor[s] = gpu_int(&r, 0, V - 1);
        ot_buf(&t, 3, anchor, max_seqs * 4, T_IN);
        int32_t *drafts = i32_fill(rows, (int32_t)GPU_POISON_I32);
        ot_buf(&t, 4, drafts, rows * 4, T_OUT_I32);
        ot_buf(&t, 5, i32_one(n), 4, T_IN);
        t.op.p[0] = W;
        t.op.p[1] = V;
        t.op.p[2] = markov ? rk : 0;
        t.op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        t.op.p[4] = max_seqs;
        t.exact[0] = 1;
        char name[64];
        snprintf(name, sizeof name, "draft_select markov=%d bf16=%d", markov, bf);
        assert_int_equal(ot_run(&t, name), 0);
    }
}

static void test_confidence(void **state)
{
    (void)state;
    gpu_rng r = {20};
    for (int variant = 0; variant < 3; variant++) {
        const int with_w1 = variant > 0, bf = variant == 1;
        const int W = 3, H = 64, rk = 16, V = 100, max_seqs = 4, n = 3;
        const size_t rows = (size_t)max_seqs * W;
        optest t;
        ot_init(&t, KOP_CONFIDENCE);
        ot_buf(&t, 0, f32_rows(&r, rows, H, (size_t)n * W, 1.0f), rows * H * 4, T_IN);
        if (with_w1) ot_buf(&t, 1, w_rand(&r, bf, (size_t)V * rk, 1.0f), (size_t)V * rk * (bf ? 2 : 4), T_IN);
        int32_t *drafts = i32_fill(rows, -3);
        for (size_t i = 0; i < (size_t)n * W; i++) drafts[i] = gpu_int(&r, 0, V - 1);
        ot_buf(&t, 2, drafts, rows * 4, T_IN);
        int32_t *anchor = i32_fill(max_seqs, -3);
        for (int s = 0; s < n; s++) anchor[s] = gpu_int(&r, 0, V - 1);
        ot_buf(&t, 3, anchor, max_seqs * 4, T_IN);
        ot_buf(&t, 4, f32_rand(&r, H + rk, 0.3f), (size_t)(H + rk) * 4, T_IN);
        ot_buf(&t, 5, f32_rand(&r, 1, 1.0f), 4, T_IN);
        ot_buf(&t, 6, f32_poison(rows), rows * 4, T_OUT_F32);
        ot_buf(&t, 7, i32_one(n), 4, T_IN);
        t.op.p[0] = W;
        t.op.p[1] = H;
        t.op.p[2] = rk;
        t.op.p[3] = bf ? KERN_DT_BF16 : KERN_DT_F32;
        t.op.p[4] = max_seqs;
        t.op.p[5] = V;
        t.rtol = 1e-5;
        assert_int_equal(ot_run(&t, "confidence"), 0);
    }
}

/* ---- KOP_SAMPLE ------------------------------------------------------------------------------------
 * Random rows of every mode through one op, CPU kernel vs CUDA, field by field: tok, accepted, n_top
 * and the top ids equal, logprobs within 1e-5 (absolute; -inf equal). Some rows are rounded to a
 * coarse grid so that exact ties (broken by the lower id) are common, some carry a tie at the maximum,
 * some mask most ids with -inf. Every out word starts as the poison; what the CPU leaves unwritten
 * (top entries past n_top, rows past n) must stay poisoned on the GPU. Two GPU runs must agree
 * bitwise (the kernel's sums have fixed orders). Draws differ between backends only when u * zz or
 * top_p * z1 lands within rounding of a running-sum boundary: with these seeds, never. */
typedef struct {
    int n_rows, n_acc, n_rej, n_drawn_not_best, n_verify_greedy;
} sample_stats;

/* best id of C0 by the order key (the greedy choice) */
static int32_t sample_best(const float *l, int V, const int32_t *ban, int nb)
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

static int sample_lp_ok(float c, float g)
{
    return !isnan(c) && !isnan(g) && (c == g || fabs((double)c - (double)g) <= 1e-5);
}

/* One op: logits [max_rows, V] (rows >= n poisoned), params, bans (NB entries), out poisoned. */
static int sample_check(const float *logits, const kern_sample_params *prm, const int32_t *bans, int NB, int V,
                        int max_rows, int n, const char *name, sample_stats *st)
{
    const size_t lb = (size_t)max_rows * V * 4, pb = (size_t)max_rows * sizeof(kern_sample_params),
                 bb = (size_t)NB * 4, ob = (size_t)max_rows * sizeof(kern_sample_out);
    kern_sample_out *init = malloc(ob), *cpu = malloc(ob), *gpu[2] = {malloc(ob), malloc(ob)};
    assert_true(init && cpu && gpu[0] && gpu[1]);
    for (size_t w = 0; w < ob / 4; w++) ((uint32_t *)init)[w] = GPU_POISON_BITS;
    memcpy(cpu, init, ob);
    int32_t nn = n;

    kern_op op = {.kind = KOP_SAMPLE};
    op.p[0] = V;
    op.p[1] = max_rows;
    op.p[2] = NB;
    op.buf[0] = (kern_buf){(void *)logits, lb};
    op.buf[1] = (kern_buf){(void *)prm, pb};
    if (NB > 0) op.buf[2] = (kern_buf){(void *)bans, bb};
    op.buf[3] = (kern_buf){cpu, ob};
    op.buf[4] = (kern_buf){&nn, 4};
    kern_cpu_exec(g_pool, &op);

    void *gl = g_be->ops->alloc(g_be, lb, name), *gp = g_be->ops->alloc(g_be, pb, name),
         *gb = NB > 0 ? g_be->ops->alloc(g_be, bb, name) : NULL, *go = g_be->ops->alloc(g_be, ob, name),
         *gn = g_be->ops->alloc(g_be, 4, name);
    assert_true(gl && gp && go && gn && (NB == 0 || gb));
    g_be->ops->upload(g_be, gl, logits, lb);
    g_be->ops->upload(g_be, gp, prm, pb);
    if (NB > 0) g_be->ops->upload(g_be, gb, bans, bb);
    g_be->ops->upload(g_be, gn, &nn, 4);
    kern_op gop = op;
    gop.buf[0] = (kern_buf){gl, lb};
    gop.buf[1] = (kern_buf){gp, pb};
    if (NB > 0) gop.buf[2] = (kern_buf){gb, bb};
    gop.buf[3] = (kern_buf){go, ob};
    gop.buf[4] = (kern_buf){gn, 4};
    for (int run = 0; run < 2; run++) {
        g_be->ops->upload(g_be, go, init, ob);
        eng_tape tape = {.ops = &gop, .n = 1, .cap = 1};
        g_be->ops->run(g_be, &tape);
        g_be->ops->synchronize(g_be);
        g_be->ops->download(g_be, gpu[run], go, ob);
    }

    int bad = 0;
#define SBAD(...)                                                                                  \
    do {                                                                                           \
        if (bad++ < 10) {                                                                          \
            fprintf(stderr, "%s row %d: ", name, j);                                               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)
    if (memcmp(gpu[0], gpu[1], ob) != 0) {
        const int j = -1;
        SBAD("two GPU runs differ");
    }
    const kern_sample_out *g = gpu[0];
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
        if (!sample_lp_ok(c->logprob, o->logprob))
            SBAD("logprob %.9g, cpu %.9g", (double)o->logprob, (double)c->logprob);
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
        /* what the rows exercised (from the CPU's results, so the same with or without a GPU) */
        st->n_rows++;
        if (p->draft >= 0 && p->temperature <= 1e-5f) st->n_verify_greedy++;
        else if (p->draft >= 0) {
            if (c->accepted) st->n_acc++;
            else st->n_rej++;
        } else if (p->temperature > 1e-5f &&
                   c->tok != sample_best(logits + (size_t)j * V, V, p->n_ban ? bans + p->ban_off : NULL, p->n_ban)) {
            st->n_drawn_not_best++;
        }
    }
#undef SBAD
    g_be->ops->free(g_be, gl);
    g_be->ops->free(g_be, gp);
    if (gb) g_be->ops->free(g_be, gb);
    g_be->ops->free(g_be, go);
    g_be->ops->free(g_be, gn);
    free(init);
    free(cpu);
    free(gpu[0]);
    free(gpu[1]);
    return bad;
}

/* Fills rows < n of logits and params with a mix of every mode; bans are taken from bans[0..NB). */
static void sample_rows(gpu_rng *r, float *logits, kern_sample_params *prm, int32_t *bans, int NB, int V, int n,
                        int long_bans)
{
    int ban_used = 0;
    for (int j = 0; j < n; j++) {
        float *l = logits + (size_t)j * V;
        const int shape = gpu_int(r, 0, V < 100 ? 3 : 5);
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
        if (long_bans && j == 1) p->n_ban = 600 < NB - ban_used ? 600 : NB - ban_used; /* past the staged bans */
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
        if (kind == 1 || kind == 2) p->draft = sample_best(l, V, bans + p->ban_off, p->n_ban);
        else if (kind == 3) p->draft = gpu_int(r, 0, V - 1);
        else if (kind == 4 && p->n_ban > 0) p->draft = bans[p->ban_off + gpu_int(r, 0, p->n_ban - 1)];
    }
}

static void test_sample(void **state)
{
    (void)state;
    gpu_rng r = {21};
    const struct {
        int V, max_rows, n, long_bans;
        const char *what;
    } cases[] = {
        {5003, 256, 240, 1, "V 5003"},
        {4096, 64, 60, 0, "V 4096"},
        {151936, 8, 6, 0, "V 151936"},
        {13, 16, 12, 0, "V 13 (fewer ids than the top-n)"},
        {5003, 8, 0, 0, "zero rows"},
    };
    sample_stats st = {0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int V = cases[ci].V, max_rows = cases[ci].max_rows, n = cases[ci].n, NB = 4096;
        float *logits = f32_poison((size_t)max_rows * V);
        kern_sample_params *prm = calloc((size_t)max_rows, sizeof *prm);
        int32_t *bans = i32_fill(NB, 0);
        assert_non_null(prm);
        sample_rows(&r, logits, prm, bans, NB, V, n, cases[ci].long_bans);
        for (int j = n; j < max_rows; j++) { /* never read: out-of-range values */
            memset(&prm[j], 0xff, sizeof prm[j]);
            prm[j].n_logprobs = 999;
        }
        if (V < KERN_SAMPLE_MAX_TOP)
            for (int j = 0; j < n; j++) prm[j].n_logprobs = KERN_SAMPLE_MAX_TOP; /* n_top = V */
        char name[96];
        snprintf(name, sizeof name, "sample %s", cases[ci].what);
        assert_int_equal(sample_check(logits, prm, bans, NB, V, max_rows, n, name, &st), 0);
        free(logits);
        free(prm);
        free(bans);
    }
    /* no bans buffer at all (p2 = 0, buf 2 NULL) */
    {
        const int V = 1000, max_rows = 4, n = 4;
        float *logits = f32_poison((size_t)max_rows * V);
        kern_sample_params *prm = calloc((size_t)max_rows, sizeof *prm);
        int32_t dummy = 0;
        assert_non_null(prm);
        sample_rows(&r, logits, prm, &dummy, 0, V, n, 0);
        assert_int_equal(sample_check(logits, prm, NULL, 0, V, max_rows, n, "sample no bans buffer", &st), 0);
        free(logits);
        free(prm);
    }
    printf("sample: %d rows: %d verify accepted, %d rejected, %d greedy verify, %d draws not the best\n", st.n_rows,
           st.n_acc, st.n_rej, st.n_verify_greedy, st.n_drawn_not_best);
    assert_true(st.n_acc >= 10 && st.n_rej >= 10 && st.n_verify_greedy >= 10 && st.n_drawn_not_best >= 30);
}

int main(void)
{
    GPU_TEST_SKIP_WITHOUT_DEVICE();
    char err[256];
    eng_backend_config bc = {.arena_bytes = (size_t)2 << 30, .threads = 2, .checked = 1};
    g_be = eng_backend_cuda_create(&bc, err, sizeof err);
    if (!g_be) {
        fprintf(stderr, "cannot create the CUDA backend: %s\n", err);
        return 1;
    }
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_matmul),       cmocka_unit_test(test_qk_norm_rope),
        cmocka_unit_test(test_kv_write),     cmocka_unit_test(test_attention),
        cmocka_unit_test(test_silu_mul_add), cmocka_unit_test(test_gather_copy_cols),
        cmocka_unit_test(test_draft_select), cmocka_unit_test(test_confidence),
        cmocka_unit_test(test_sample),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    eng_backend_destroy(g_be);
    return rc;
}
