/* tests/gpu/test_cuda_invariance.c — batch invariance of the CUDA backend (kernels/kern.h: a row's result is
 * bitwise independent of how many other rows share the step; invariant I9: greedy output with a drafter
 * equals greedy output without one, token for token).
 *
 *  - KOP_MATMUL (bf16 weights: tensor-core kernel and, for K % 32 != 0, the CUDA-core kernel; f32
 *    weights: CUDA-core kernel): the same first rows computed in ops with max_rows 1, 8, 32, 64, 256 and
 *    several live row counts (the other rows random) are bitwise identical, and close to a double
 *    reference. The opt-in cuBLASLt path (GS_CUDA_FAST_GEMM=1) still agrees within bf16 tolerance.
 *  - KOP_ATTENTION: rows with given kv_lens (short, several splits, capped chunks past 4096 keys)
 *    computed alone (max_rows 1) and among many rows with other kv_lens (max_rows 64, 256; a geometry
 *    whose 256 rows do not fit the attention scratch at once, so rows run in chunks; a context with a
 *    tiny scratch) are bitwise identical, and close to a double reference.
 *  - The engine on CUDA (graphs): a greedy request alone vs batched with 3 others gives bitwise
 *    identical tokens and logprobs; with a DFlash drafter vs without: bitwise identical tokens and
 *    logprobs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "../unit/test_rt.h"
#include "../unit/test_util.h"
#include "engine/backend/backend_cuda.h"
#include "engine/engine.h"
#include "gpu_test.h"
#include "kernels/cuda/kern_cuda.h"
#include "kernels/kern.h"
#include "gpu_models.h"

static eng_backend *g_be;
static char g_qwen3[1100], g_dflash[1100];

static eng_backend *cuda_backend(size_t arena)
{
    char err[256];
    eng_backend_config bc = {.arena_bytes = arena, .threads = 0, .checked = 1};
    eng_backend *be = eng_backend_cuda_create(&bc, err, sizeof err);
    if (!be) fail_msg("%s", err);
    return be;
}

/* ---- one-op harness ------------------------------------------------------------------------------------- */
static void *dev_up(eng_backend *be, const void *host, size_t bytes)
{
    void *d = be->ops->alloc(be, bytes ? bytes : 4, "invariance");
    assert_non_null(d);
    if (bytes) be->ops->upload(be, d, host, bytes);
    return d;
}
static void run_op(eng_backend *be, kern_op *op)
{
    eng_tape tape = {.ops = op, .n = 1, .cap = 1};
    be->ops->run(be, &tape);
    be->ops->synchronize(be);
}
static float *f32_alloc(size_t n)
{
    float *p = malloc((n ? n : 1) * 4);
    assert_non_null(p);
    return p;
}
static float *f32_poisoned(size_t n)
{
    float *p = f32_alloc(n);
    for (size_t i = 0; i < n; i++) p[i] = gpu_poison_f32();
    return p;
}
static int32_t *i32_alloc(size_t n, int32_t v)
{
    int32_t *p = malloc((n ? n : 1) * 4);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}
static int bits_equal(const float *a, const float *b, size_t n) { return memcmp(a, b, n * 4) == 0; }

/* ---- matmul ------------------------------------------------------------------------------------------- */
#define MM_FIRST 8 /* rows whose results are compared across buckets (row 0 also with max_rows 1) */

typedef struct {
    int K, N, bf, bias, acc;
    const char *what;
} mm_shape;

/* Runs out[:M] (+)= x W^T + bias on be for live rows n; x rows < MM_FIRST from xf, the rest random, rows
 * >= n poisoned; returns the downloaded output (caller frees). */
static float *mm_once(eng_backend *be, const mm_shape *s, const void *w, const float *bias, const float *xf,
                      const float *initf, int M, int n, gpu_rng *r)
{
    const size_t K = (size_t)s->K, N = (size_t)s->N;
    float *x = f32_poisoned((size_t)M * K), *out = f32_poisoned((size_t)M * N);
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < K; k++) x[i * K + k] = i < MM_FIRST ? xf[i * K + k] : gpu_unif(r) * 3.0f;
    if (s->acc)
        for (int i = 0; i < n; i++)
            for (size_t f = 0; f < N; f++) out[i * N + f] = i < MM_FIRST ? initf[i * N + f] : gpu_unif(r);
    const size_t wbytes = N * K * (s->bf ? 2 : 4);
    void *dx = dev_up(be, x, (size_t)M * K * 4), *dw = dev_up(be, w, wbytes);
    void *db = s->bias ? dev_up(be, bias, N * 4) : NULL;
    void *dout = dev_up(be, out, (size_t)M * N * 4);
    int32_t nn = n;
    void *dn = dev_up(be, &nn, 4);
    kern_op op = {.kind = KOP_MATMUL};
    op.buf[0] = (kern_buf){dx, (size_t)M * K * 4};
    op.buf[1] = (kern_buf){dw, wbytes};
    op.buf[2] = (kern_buf){db, db ? N * 4 : 0};
    op.buf[3] = (kern_buf){dout, (size_t)M * N * 4};
    op.buf[4] = (kern_buf){dn, 4};
    op.p[0] = s->K;
    op.p[1] = s->N;
    op.p[2] = M;
    op.p[3] = s->bf ? KERN_DT_BF16 : KERN_DT_F32;
    op.p[4] = s->acc;
    run_op(be, &op);
    float *got = f32_alloc((size_t)M * N);
    be->ops->download(be, got, dout, (size_t)M * N * 4);
    /* rows past n are never written */
    for (size_t i = (size_t)n * N; i < (size_t)M * N; i++)
        if (gpu_bits(got[i]) != GPU_POISON_BITS) fail_msg("%s: M %d n %d: element %zu past n written", s->what, M, n, i);
    be->ops->free(be, dx);
    be->ops->free(be, dw);
    if (db) be->ops->free(be, db);
    be->ops->free(be, dout);
    be->ops->free(be, dn);
    free(x);
    free(out);
    return got;
}

typedef struct {
    void *w;
    float *bias, *xf, *initf;
} mm_data;

static void mm_data_make(const mm_shape *s, gpu_rng *r, mm_data *d)
{
    const size_t K = (size_t)s->K, N = (size_t)s->N;
    if (s->bf) {
        uint16_t *w = malloc(N * K * 2);
        assert_non_null(w);
        for (size_t i = 0; i < N * K; i++) w[i] = kern_f32_to_bf16(gpu_unif(r) * 0.5f);
        d->w = w;
    } else {
        float *w = f32_alloc(N * K);
        for (size_t i = 0; i < N * K; i++) w[i] = gpu_unif(r) * 0.5f;
        d->w = w;
    }
    d->bias = f32_alloc(N);
    for (size_t i = 0; i < N; i++) d->bias[i] = gpu_unif(r);
    d->xf = f32_alloc(MM_FIRST * K);
    for (size_t i = 0; i < MM_FIRST * K; i++) d->xf[i] = gpu_unif(r) * 3.0f;
    d->initf = f32_alloc(MM_FIRST * N);
    for (size_t i = 0; i < MM_FIRST * N; i++) d->initf[i] = gpu_unif(r);
}
static void mm_data_free(mm_data *d)
{
    free(d->w);
    free(d->bias);
    free(d->xf);
    free(d->initf);
}

/* double reference of row i of the first rows */
static void mm_ref_check(const mm_shape *s, const mm_data *d, const float *got, int rows, double rtol)
{
    const size_t K = (size_t)s->K, N = (size_t)s->N;
    for (int i = 0; i < rows; i++)
        for (size_t f = 0; f < N; f++) {
            double acc = 0;
            for (size_t k = 0; k < K; k++) {
                const double wv = s->bf ? (double)kern_bf16_to_f32(((const uint16_t *)d->w)[f * K + k])
                                        : (double)((const float *)d->w)[f * K + k];
                acc += (double)d->xf[i * K + k] * wv;
            }
            if (s->bias) acc += d->bias[f];
            if (s->acc) acc += d->initf[i * N + f];
            const double g = got[i * N + f];
            if (!(fabs(g - acc) <= rtol * (1.0 + fabs(acc)) * sqrt((double)K)))
                fail_msg("%s: row %d feature %zu: gpu %.9g, reference %.9g", s->what, i, f, g, acc);
        }
}

static const mm_shape g_mm_shapes[] = {
    {256, 200, 1, 1, 0, "bf16 tensor-core, N % 16 != 0, bias"},
    {512, 96, 1, 0, 1, "bf16 tensor-core, accumulate"},
    {2048, 48, 1, 1, 1, "bf16 tensor-core, 8 warps over K, bias, accumulate"},
    {96, 64, 1, 0, 0, "bf16 tensor-core, K = 3 chunks (3 warps)"},
    {100, 70, 1, 1, 0, "bf16 CUDA-core (K % 32 != 0)"},
    {64, 50, 0, 1, 1, "f32 CUDA-core, bias, accumulate"},
    {1024, 40, 0, 0, 0, "f32 CUDA-core, long K"},
};

static void test_matmul_invariance(void **state)
{
    (void)state;
    gpu_rng r = {101};
    const int Ms[] = {1, 8, 32, 64, 256};
    for (size_t si = 0; si < sizeof g_mm_shapes / sizeof g_mm_shapes[0]; si++) {
        const mm_shape *s = &g_mm_shapes[si];
        const size_t N = (size_t)s->N;
        mm_data d;
        mm_data_make(s, &r, &d);
        float ref[MM_FIRST * 256];
        assert_true(N <= 256);
        int have = 0; /* rows of ref set */
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi];
            const int ns[3] = {M, M > 3 ? M - 3 : M, M > MM_FIRST + 1 ? MM_FIRST + 1 : M};
            for (int ni = 0; ni < 3; ni++) {
                const int n = ns[ni];
                float *got = mm_once(g_be, s, d.w, d.bias, d.xf, d.initf, M, n, &r);
                const int cmp = n < MM_FIRST ? n : MM_FIRST;
                for (int i = 0; i < cmp; i++) {
                    if (i >= have) {
                        memcpy(ref + (size_t)i * N, got + (size_t)i * N, N * 4);
                        have = i + 1;
                    } else if (!bits_equal(ref + (size_t)i * N, got + (size_t)i * N, N)) {
                        for (size_t f = 0; f < N; f++)
                            if (gpu_bits(ref[i * N + f]) != gpu_bits(got[i * N + f]))
                                fail_msg("%s: row %d feature %zu differs with max_rows %d, n %d: %.9g vs %.9g", s->what,
                                         i, f, M, n, (double)ref[i * N + f], (double)got[i * N + f]);
                    }
                }
                free(got);
            }
        }
        assert_int_equal(have, MM_FIRST);
        mm_ref_check(s, &d, ref, MM_FIRST, s->bf ? 2e-5 : 2e-6);
        mm_data_free(&d);
    }
}

/* GS_CUDA_FAST_GEMM=1: buckets above KERN_CUDA_SKINNY_ROWS go to cuBLASLt (bf16-rounded activations);
 * the results must still be right (within bf16 tolerance of the invariant path), not bitwise. */
static void test_matmul_fast_gemm(void **state)
{
    (void)state;
    setenv("GS_CUDA_FAST_GEMM", "1", 1);
    eng_backend *fast = cuda_backend((size_t)256 << 20);
    unsetenv("GS_CUDA_FAST_GEMM");
    gpu_rng r = {102};
    const mm_shape shapes[] = {
        {256, 200, 1, 1, 1, "fast_gemm bf16 cuBLASLt"},
        {100, 70, 1, 1, 0, "fast_gemm bf16 K % 32 != 0"},
        {64, 50, 0, 1, 0, "fast_gemm f32 cuBLASLt"},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const mm_shape *s = &shapes[si];
        mm_data d;
        mm_data_make(s, &r, &d);
        gpu_rng r1 = {7}, r2 = {7}; /* same "other rows" on both backends */
        const int M = 64, n = 50;
        float *a = mm_once(g_be, s, d.w, d.bias, d.xf, d.initf, M, n, &r1);
        float *b = mm_once(fast, s, d.w, d.bias, d.xf, d.initf, M, n, &r2);
        assert_int_equal(gpu_cmp_f32(s->what, a, b, NULL, (size_t)n * s->N, s->bf ? 8e-3 : 1e-4, 0), 0);
        free(a);
        free(b);
        mm_data_free(&d);
    }
    eng_backend_destroy(fast);
}

/* ---- attention ------------------------------------------------------------------------------------------ */
typedef struct {
    int nh, nkv, hd, bs, max_blocks, max_seqs;
    const char *what;
} att_geo;

typedef struct {
    const att_geo *g;
    int q_stride, num_blocks;
    size_t cache_elems;
    float *h_kc, *h_vc;
    int32_t *h_bt;
    void *kc, *vc, *bt; /* on g_be */
} att_env;

static void att_env_make(att_env *e, const att_geo *g, gpu_rng *r)
{
    e->g = g;
    e->q_stride = (g->nh + 2 * g->nkv) * g->hd;
    e->num_blocks = g->max_seqs * g->max_blocks;
    e->cache_elems = (size_t)e->num_blocks * g->bs * g->nkv * g->hd;
    e->h_kc = f32_alloc(e->cache_elems);
    e->h_vc = f32_alloc(e->cache_elems);
    for (size_t i = 0; i < e->cache_elems; i++) {
        e->h_kc[i] = gpu_unif(r);
        e->h_vc[i] = gpu_unif(r);
    }
    /* each slot owns distinct physical blocks (a shuffled pool) */
    e->h_bt = i32_alloc((size_t)e->num_blocks, 0);
    for (int i = 0; i < e->num_blocks; i++) e->h_bt[i] = i;
    for (int i = e->num_blocks - 1; i > 0; i--) {
        const int j = gpu_int(r, 0, i), t = e->h_bt[i];
        e->h_bt[i] = e->h_bt[j];
        e->h_bt[j] = t;
    }
    e->kc = dev_up(g_be, e->h_kc, e->cache_elems * 4);
    e->vc = dev_up(g_be, e->h_vc, e->cache_elems * 4);
    e->bt = dev_up(g_be, e->h_bt, (size_t)e->num_blocks * 4);
}
static void att_env_free(att_env *e)
{
    g_be->ops->free(g_be, e->kc);
    g_be->ops->free(g_be, e->vc);
    g_be->ops->free(g_be, e->bt);
    free(e->h_kc);
    free(e->h_vc);
    free(e->h_bt);
}

static float g_att_scale;

/* One attention op over max_rows rows (n live); ctx NULL: through the backend, else kern_cuda_exec on
 * the backend's stream with that context (another scratch size). Returns the output (caller frees). */
static float *att_once(att_env *e, const float *q, const int32_t *slot, const int32_t *kvl, int max_rows, int n,
                       kern_cuda_ctx *ctx)
{
    const att_geo *g = e->g;
    const size_t ob = (size_t)max_rows * g->nh * g->hd * 4;
    float *out = f32_poisoned((size_t)max_rows * g->nh * g->hd);
    void *dq = dev_up(g_be, q, (size_t)max_rows * e->q_stride * 4), *dout = dev_up(g_be, out, ob);
    void *ds = dev_up(g_be, slot, (size_t)max_rows * 4), *dl = dev_up(g_be, kvl, (size_t)max_rows * 4);
    int32_t nn = n;
    void *dn = dev_up(g_be, &nn, 4);
    kern_op op = {.kind = KOP_ATTENTION};
    op.buf[0] = (kern_buf){dq, (size_t)max_rows * e->q_stride * 4};
    op.buf[1] = (kern_buf){e->kc, e->cache_elems * 4};
    op.buf[2] = (kern_buf){e->vc, e->cache_elems * 4};
    op.buf[3] = (kern_buf){dout, ob};
    op.buf[4] = (kern_buf){ds, (size_t)max_rows * 4};
    op.buf[5] = (kern_buf){dl, (size_t)max_rows * 4};
    op.buf[6] = (kern_buf){e->bt, (size_t)e->num_blocks * 4};
    op.buf[7] = (kern_buf){dn, 4};
    op.p[0] = g->nh;
    op.p[1] = g->nkv;
    op.p[2] = g->hd;
    op.p[3] = e->q_stride;
    op.p[4] = g->bs;
    op.p[5] = g->max_blocks;
    op.p[6] = max_rows;
    op.f[0] = g_att_scale / sqrtf((float)g->hd);
    if (!ctx) {
        run_op(g_be, &op);
    } else {
        g_be->ops->synchronize(g_be); /* the uploads */
        cudaStream_t s = (cudaStream_t)eng_backend_cuda_stream(g_be);
        kern_cuda_exec(ctx, &op, s);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        char msg[256];
        if (kern_cuda_take_error(ctx, msg, sizeof msg)) fail_msg("attention: %s", msg);
    }
    float *got = f32_alloc((size_t)max_rows * g->nh * g->hd);
    g_be->ops->download(g_be, got, dout, ob);
    for (size_t i = (size_t)n * g->nh * g->hd; i < (size_t)max_rows * g->nh * g->hd; i++)
        if (gpu_bits(got[i]) != GPU_POISON_BITS) fail_msg("attention %s: element %zu past n written", g->what, i);
    g_be->ops->free(g_be, dq);
    g_be->ops->free(g_be, dout);
    g_be->ops->free(g_be, ds);
    g_be->ops->free(g_be, dl);
    g_be->ops->free(g_be, dn);
    free(out);
    return got;
}

/* double reference of one row (all heads) */
static void att_ref_check(const att_env *e, const float *qrow, int slot, int L, const float *got, const char *what)
{
    const att_geo *g = e->g;
    const int group = g->nh / g->nkv;
    const double scale = (double)(g_att_scale / sqrtf((float)g->hd));
    double *sc = malloc((size_t)L * sizeof(double));
    assert_non_null(sc);
    for (int h = 0; h < g->nh; h++) {
        const int kvh = h / group;
        double mx = -INFINITY;
        for (int j = 0; j < L; j++) {
            const int blk = e->h_bt[slot * g->max_blocks + j / g->bs];
            const size_t at = ((size_t)blk * g->bs + (size_t)(j % g->bs)) * g->nkv * g->hd + (size_t)kvh * g->hd;
            double s = 0;
            for (int d = 0; d < g->hd; d++) s += (double)qrow[h * g->hd + d] * e->h_kc[at + d];
            sc[j] = s * scale;
            if (sc[j] > mx) mx = sc[j];
        }
        double Z = 0;
        for (int j = 0; j < L; j++) Z += exp(sc[j] - mx);
        for (int d = 0; d < g->hd; d++) {
            double A = 0;
            for (int j = 0; j < L; j++) {
                const int blk = e->h_bt[slot * g->max_blocks + j / g->bs];
                const size_t at = ((size_t)blk * g->bs + (size_t)(j % g->bs)) * g->nkv * g->hd + (size_t)kvh * g->hd;
                A += exp(sc[j] - mx) * e->h_vc[at + d];
            }
            const double want = A / Z, have = got[h * g->hd + d];
            if (!(fabs(want - have) <= 1e-4)) fail_msg("%s: L %d head %d dim %d: gpu %.9g, reference %.9g", what, L, h, d, have, want);
        }
    }
    free(sc);
}

#define ATT_TRACK 7

static void att_geometry(const att_geo *g, const int *track_len, int ntrack, uint64_t seed)
{
    gpu_rng r = {seed};
    att_env e;
    att_env_make(&e, g, &r);
    const int max_kv = g->max_blocks * g->bs, row_elems = g->nh * g->hd;
    float *tq = f32_alloc((size_t)ntrack * e.q_stride);
    for (size_t i = 0; i < (size_t)ntrack * e.q_stride; i++) tq[i] = gpu_unif(&r) * 2.0f;
    int32_t tslot[ATT_TRACK];
    for (int t = 0; t < ntrack; t++) tslot[t] = t % g->max_seqs;
    float *ref = f32_alloc((size_t)ntrack * row_elems);
    /* alone: max_rows 1 */
    for (int t = 0; t < ntrack; t++) {
        int32_t sl = tslot[t], L = track_len[t];
        assert_true(L <= max_kv);
        float *got = att_once(&e, tq + (size_t)t * e.q_stride, &sl, &L, 1, 1, NULL);
        memcpy(ref + (size_t)t * row_elems, got, (size_t)row_elems * 4);
        char what[160];
        snprintf(what, sizeof what, "attention %s alone", g->what);
        att_ref_check(&e, tq + (size_t)t * e.q_stride, sl, L, got, what);
        free(got);
    }
    /* among many rows: max_rows 64 and 256, live counts below the bucket, tracked rows spread out
     * (across the chunks of rows when the partials do not fit the scratch at once) */
    const int buckets[] = {64, 256};
    kern_cuda_ctx *tiny = NULL;
    {
        /* a context whose scratch holds the partials of 3 rows: every launch is chunked */
        long long ys = ((long long)max_kv + 63) / 64;
        if (ys > 64) ys = 64;
        kern_cuda_config kc = {0};
        kc.attn_bytes = (size_t)3 * g->nh * (size_t)ys * ((size_t)g->hd + 2) * 4 + 100;
        char err[256];
        tiny = kern_cuda_ctx_create(&kc, err, sizeof err);
        if (!tiny) fail_msg("%s", err);
    }
    for (size_t bi = 0; bi < sizeof buckets / sizeof buckets[0]; bi++) {
        const int M = buckets[bi], n = M - 5;
        float *q = f32_poisoned((size_t)M * e.q_stride);
        int32_t *slot = i32_alloc((size_t)M, GPU_POISON_I32), *kvl = i32_alloc((size_t)M, GPU_POISON_I32);
        for (int i = 0; i < n; i++) {
            slot[i] = gpu_int(&r, 0, g->max_seqs - 1);
            kvl[i] = gpu_int(&r, 0, 3) == 0 ? gpu_int(&r, 1, 70) : gpu_int(&r, 1, max_kv);
            if (kvl[i] > max_kv) kvl[i] = max_kv;
            for (int c = 0; c < e.q_stride; c++) q[(size_t)i * e.q_stride + c] = gpu_unif(&r);
        }
        slot[n - 1] = -1; /* a masked row and an empty one among them */
        kvl[n - 2] = 0;
        int pos[ATT_TRACK];
        for (int t = 0; t < ntrack; t++) {
            pos[t] = (t * (n - 3)) / ntrack + (int)bi; /* distinct, < n - 2 */
            slot[pos[t]] = tslot[t];
            kvl[pos[t]] = track_len[t];
            memcpy(q + (size_t)pos[t] * e.q_stride, tq + (size_t)t * e.q_stride, (size_t)e.q_stride * 4);
        }
        for (int variant = 0; variant < 2; variant++) {
            float *got = att_once(&e, q, slot, kvl, M, n, variant ? tiny : NULL);
            for (int t = 0; t < ntrack; t++)
                if (!bits_equal(ref + (size_t)t * row_elems, got + (size_t)pos[t] * row_elems, (size_t)row_elems))
                    fail_msg("attention %s: the row with kv_len %d differs alone vs at row %d of max_rows %d (%s scratch)",
                             g->what, track_len[t], pos[t], M, variant ? "tiny" : "default");
            for (int j = 0; j < row_elems; j++) {
                if (got[(size_t)(n - 1) * row_elems + j] != 0.0f || got[(size_t)(n - 2) * row_elems + j] != 0.0f)
                    fail_msg("attention %s: masked / empty row not zero", g->what);
            }
            free(got);
        }
        free(q);
        free(slot);
        free(kvl);
    }
    kern_cuda_ctx_destroy(tiny);
    free(tq);
    free(ref);
    att_env_free(&e);
}

static void test_attention_invariance(void **state)
{
    (void)state;
    g_att_scale = 4.0f; /* sharper softmax than 1 / sqrt(hd) */
    /* max_kv 4320 > 4096: kv_len 4300 has capped chunks (128 keys, 34 splits) */
    const att_geo a = {8, 2, 64, 16, 270, 4, "GQA 4, hd 64, long context"};
    const int la[ATT_TRACK] = {1, 63, 64, 65, 700, 4096, 4300};
    att_geometry(&a, la, ATT_TRACK, 201);
    /* 32 heads x hd 128 x 64 splits: 126 rows fill the default 128 MiB scratch, so 256 rows run in
     * chunks of rows even with the default context */
    const att_geo b = {32, 8, 128, 16, 257, 4, "32 heads, hd 128, rows in chunks"};
    const int lb[4] = {1, 100, 2000, 4112};
    att_geometry(&b, lb, 4, 202);
    /* head dim 256, group 8 in two head chunks, few splits */
    const att_geo c = {16, 2, 256, 8, 24, 3, "hd 256, group 8"};
    const int lc[3] = {5, 64, 192};
    att_geometry(&c, lc, 3, 203);
}

/* ---- through the engine ---------------------------------------------------------------------------------- */
typedef test_rt rt;

static void open_rt(rt *x, const char *draft)
{
    eng_config ec;
    eng_config_defaults(&ec);
    ec.max_seqs = 4;
    ec.max_step_tokens = 64;
    ec.prefill_chunk = 48;
    ec.max_model_len = 512; /* attention grid.y 8: rows past 64 keys run split */
    ec.kv_bytes = 16 << 20;
    ec.use_plans = 1;
    test_rt_open(x, cuda_backend((size_t)1 << 30), g_qwen3, draft, &ec);
}

#define NREQ 4
#define NTOK 24
#define MAXP 300

typedef struct {
    eng_request r[NREQ];
    int32_t prompt[NREQ][MAXP];
    int32_t out[NREQ][NTOK];
    float lp[NREQ][NTOK];
} batch;

static const int g_lens[NREQ] = {40, 5, 17, 290};

/* Submits the requests whose bit is set in mask (in index order), runs until idle. */
static void run_reqs(rt *x, batch *b, unsigned mask)
{
    memset(b, 0, sizeof *b);
    char err[256];
    for (int q = 0; q < NREQ; q++) {
        if (!(mask & (1u << q))) continue;
        for (int i = 0; i < g_lens[q]; i++) b->prompt[q][i] = (q * 131 + i * 29 + 7) % 500;
        eng_request *r = &b->r[q];
        r->prompt = b->prompt[q];
        r->n_prompt = g_lens[q];
        r->max_tokens = NTOK;
        r->ignore_eos = 1;
        r->sp.top_p = 1; /* temperature 0: greedy */
        r->out_tokens = b->out[q];
        r->out_logprobs = b->lp[q];
        assert_int_equal(eng_submit(x->e, r, NULL, err, sizeof err), 0);
    }
    eng_run_until_idle(x->e);
    for (int q = 0; q < NREQ; q++)
        if (mask & (1u << q)) assert_int_equal(b->r[q].n_out, NTOK);
}

static void same_bits(const char *what, const batch *a, const batch *b, int q)
{
    for (int i = 0; i < NTOK; i++) {
        if (a->out[q][i] != b->out[q][i])
            fail_msg("%s: request %d token %d: %d vs %d", what, q, i, a->out[q][i], b->out[q][i]);
        if (gpu_bits(a->lp[q][i]) != gpu_bits(b->lp[q][i]))
            fail_msg("%s: request %d logprob %d: %.9g vs %.9g (not bitwise equal)", what, q, i, (double)a->lp[q][i],
                     (double)b->lp[q][i]);
    }
}

static void test_engine_alone_vs_batched(void **state)
{
    (void)state;
    static batch alone0, alone3, all;
    rt x;
    open_rt(&x, NULL);
    run_reqs(&x, &alone0, 1u << 0);
    test_rt_close(&x);
    open_rt(&x, NULL);
    run_reqs(&x, &alone3, 1u << 3);
    test_rt_close(&x);
    open_rt(&x, NULL);
    run_reqs(&x, &all, 0xfu);
    test_rt_close(&x);
    same_bits("alone vs batched with 3 others", &alone0, &all, 0);
    same_bits("alone vs batched with 3 others", &alone3, &all, 3);
}

static void test_engine_dflash_vs_plain(void **state)
{
    (void)state;
    static batch plain, spec;
    rt x;
    open_rt(&x, NULL);
    run_reqs(&x, &plain, 0xfu);
    test_rt_close(&x);
    open_rt(&x, g_dflash);
    run_reqs(&x, &spec, 0xfu);
    assert_true(eng_get_stats(x.e)->spec_drafts > 0);
    test_rt_close(&x);
    for (int q = 0; q < NREQ; q++) same_bits("DFlash drafter vs no drafter on cuda (greedy)", &plain, &spec, q);
}

/* ---- setup -------------------------------------------------------------------------------------------- */
static int setup(void **state)
{
    (void)state;
    g_be = cuda_backend((size_t)1 << 30);
    return 0;
}
static int teardown(void **state)
{
    (void)state;
    eng_backend_destroy(g_be);
    return 0;
}

int main(void)
{
    GPU_TEST_SKIP_WITHOUT_DEVICE();
    const char *base = test_tmpdir("cuda-invariance");
    if (!base) return 1;
    char b[1024];
    snprintf(b, sizeof b, "%s", base);
    gpu_mkmodel(g_qwen3, b, "qwen3", MDL_ARCH_QWEN3, MDL_DT_BF16, 1, 32, 4, 2, 17, NULL);
    gpu_mkmodel(g_dflash, b, "dflash", MDL_ARCH_DFLASH, MDL_DT_BF16, 1, 32, 4, 2, 17, g_qwen3);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_invariance),      cmocka_unit_test(test_matmul_fast_gemm),
        cmocka_unit_test(test_attention_invariance),   cmocka_unit_test(test_engine_alone_vs_batched),
        cmocka_unit_test(test_engine_dflash_vs_plain),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
