/* tests/gpu/test_cuda_ops.c — every CUDA op against the CPU reference kernels (kern_cpu_exec) on random
 * inputs, through the CUDA backend (arena, upload, eager run, download).
 *
 * Each case builds one op twice (host buffers for the CPU, arena buffers for the GPU) from the same
 * initial contents: inputs random, padding rows of inputs (past n_rows) NaN-poisoned so that a kernel
 * reading them would turn a live result into NaN, every output element poisoned. Then: live elements
 * within bf16 tolerance of the CPU's (copies bitwise), NaN never passes, and every element the CPU
 * left unwritten (rows past n, columns outside the op, cache positions not addressed) still holds
 * the poison on the GPU. The cases of every op but draft_select, confidence and sample are tests/opcases
 * (opcases.c), shared with the emulated kernels' tests (tests/emu): each op family runs here through
 * gpu_run. Shapes cover each kernel's paths: tensor-core (1, 2, 4 row groups, several
 * 32-row tiles) / CUDA-core matmuls (cuBLASLt: test_cuda_invariance, under GS_CUDA_FAST_GEMM=1), split and unsplit attention, GQA groups, head dims 16..256, in-place ops, views. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/backend_cuda.h"
#include "gpu_test.h"
#include "kernels/kern.h"
#include "tests/opcases/opcases.h"

static eng_backend *g_be;
static kern_pool *g_pool;

/* ---- the harness (tests/opcases/opcases.h): one op on the CPU and through the CUDA backend ------------ */
static int gpu_run(oc_harness *h, oc_case *t, const char *name)
{
    (void)h;
    kern_op cop = t->op, gop = t->op;
    void *cbuf[OC_SLOTS] = {0}, *gbuf[OC_SLOTS] = {0};
    for (int s = 0; s < OC_SLOTS; s++) {
        if (t->type[s] == OC_NONE || t->alias[s] >= 0) continue;
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
    for (int s = 0; s < OC_SLOTS; s++) {
        if (t->alias[s] >= 0 || (t->type[s] != OC_OUT_F32 && t->type[s] != OC_OUT_I32)) continue;
        void *got = malloc(t->bytes[s]);
        assert_non_null(got);
        g_be->ops->download(g_be, got, gbuf[s], t->bytes[s]);
        char what[160];
        snprintf(what, sizeof what, "%.140s buf[%d]", name, s);
        if (t->type[s] == OC_OUT_F32)
            bad += gpu_cmp_f32(what, cbuf[s], got, t->host[s], t->bytes[s] / 4, t->rtol, t->exact[s]);
        else
            bad += gpu_cmp_i32(what, cbuf[s], got, t->bytes[s] / 4);
        free(got);
    }
    for (int s = 0; s < OC_SLOTS; s++) {
        if (t->alias[s] >= 0 || t->type[s] == OC_NONE) continue;
        free(cbuf[s]);
        free(t->host[s]);
        g_be->ops->free(g_be, gbuf[s]);
    }
    return bad;
}

/* runs one family of the shared cases */
static void gpu_cases(void (*cases)(oc_harness *), const char *family)
{
    oc_harness h = {.emu = 0, .run = gpu_run};
    cases(&h);
    printf("%s: %d shared cases\n", family, h.n_run);
}

/* the GPU-only cases below build an oc_case too */
static int ot_run(oc_case *t, const char *name) { return gpu_run(NULL, t, name); }
static int32_t *i32_one(int32_t v) { return oc_i32(1, v); }

/* ---- the shared cases (tests/opcases/opcases.c) ------------------------------------------------------- */
static void test_embed(void **state)
{
    (void)state;
    gpu_cases(opcase_embed, "embed");
}

static void test_rmsnorm(void **state)
{
    (void)state;
    gpu_cases(opcase_rmsnorm, "rmsnorm");
}

static void test_matmul(void **state)
{
    (void)state;
    /* every path keeps the f32 activations (the tensor-core kernel as bf16 hi + lo); cuBLASLt under
     * GS_CUDA_FAST_GEMM=1: test_cuda_invariance */
    gpu_cases(opcase_matmul, "matmul");
}

static void test_qk_norm_rope(void **state)
{
    (void)state;
    gpu_cases(opcase_qk_norm_rope, "qk_norm_rope");
}

static void test_kv_write(void **state)
{
    (void)state;
    gpu_cases(opcase_kv_write, "kv_write");
}

static void test_attention(void **state)
{
    (void)state;
    gpu_cases(opcase_attention, "attention");
}

static void test_silu_mul_add(void **state)
{
    (void)state;
    gpu_cases(opcase_silu_mul, "silu_mul");
    gpu_cases(opcase_add, "add");
}

static void test_gather_copy_cols(void **state)
{
    (void)state;
    gpu_cases(opcase_gather_rows, "gather_rows");
    gpu_cases(opcase_copy_cols, "copy_cols");
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
        oc_case t;
        oc_init(&t, KOP_DRAFT_SELECT, 2e-3);
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
        oc_buf(&t, 0, lg, rows * V * 4, OC_OUT_F32);
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
            oc_buf(&t, 1, w1, wn * (bf ? 2 : 4), OC_IN);
            oc_buf(&t, 2, w2, wn * (bf ? 2 : 4), OC_IN);
        }
        int32_t *anchor = oc_i32(max_seqs, -1);
        for (int s = 0; s < n; s++) anchor[s] = gpu_int(&r, 0, V - 1);
        oc_buf(&t, 3, anchor, max_seqs * 4, OC_IN);
        int32_t *drafts = oc_i32(rows, (int32_t)GPU_POISON_I32);
        oc_buf(&t, 4, drafts, rows * 4, OC_OUT_I32);
        oc_buf(&t, 5, i32_one(n), 4, OC_IN);
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
        oc_case t;
        oc_init(&t, KOP_CONFIDENCE, 2e-3);
        oc_buf(&t, 0, oc_rows(&r, rows, H, (size_t)n * W, 1.0f), rows * H * 4, OC_IN);
        if (with_w1) oc_buf(&t, 1, oc_weights(&r, bf, (size_t)V * rk, 1.0f), (size_t)V * rk * (bf ? 2 : 4), OC_IN);
        int32_t *drafts = oc_i32(rows, -3);
        for (size_t i = 0; i < (size_t)n * W; i++) drafts[i] = gpu_int(&r, 0, V - 1);
        oc_buf(&t, 2, drafts, rows * 4, OC_IN);
        int32_t *anchor = oc_i32(max_seqs, -3);
        for (int s = 0; s < n; s++) anchor[s] = gpu_int(&r, 0, V - 1);
        oc_buf(&t, 3, anchor, max_seqs * 4, OC_IN);
        oc_buf(&t, 4, oc_rand(&r, H + rk, 0.3f), (size_t)(H + rk) * 4, OC_IN);
        oc_buf(&t, 5, oc_rand(&r, 1, 1.0f), 4, OC_IN);
        oc_buf(&t, 6, oc_poison(rows), rows * 4, OC_OUT_F32);
        oc_buf(&t, 7, i32_one(n), 4, OC_IN);
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
        float *logits = oc_poison((size_t)max_rows * V);
        kern_sample_params *prm = calloc((size_t)max_rows, sizeof *prm);
        int32_t *bans = oc_i32(NB, 0);
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
        float *logits = oc_poison((size_t)max_rows * V);
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
