/* tests/emu/test_emu_attention.c — kernels/cuda/attention.cu (KOP_KV_WRITE, KOP_ATTENTION), the real CUDA
 * source, run on the CPU emulation of the CUDA primitives (tests/emu/emu_cuda.h) against the CPU kernels
 * (kern_cpu_exec).
 *
 * Why: CI has no GPU; this runs on every CI run the paged-cache addressing, the split-by-kv_len rule
 * (attn_chunk / attn_splits), the split kernel's per-warp online softmax and its fixed-order merge through
 * shared memory, the partials and the combine, the row chunks taken when the partials of all rows do not
 * fit the scratch, and every GQA head-group instantiation (G = 1, 2, 4, 8; head dims per lane NV = 1, 2,
 * 4, 8, 32).
 *
 *  - test_kv_write: rows of several slots (one masked), positions across blocks; the caches bitwise the
 *    CPU's, untouched positions keep the poison.
 *  - test_attention: head dims 16 / 32 / 64 / 80 / 128 / 256 / 288, GQA groups 1 / 2 / 3 / 4 / 8 / 16 (a
 *    partial head group, two head chunks; every (NV, G) instantiation runs), masked rows (slot -1),
 *    kv_len 0 / 1 / 63 / 64 / 65 / 300 and longer (many splits),
 *    drafter-style non-causal rows (several rows of one slot with the same kv_len), a scratch so small
 *    that rows run in chunks of one and of three rows. Within 2e-5 of the CPU, rows past n keep the
 *    poison, two schedules agree bitwise.
 *  - test_attention_invariance: rows with kv_len 1 / 63 / 64 / 65 / 300 computed alone (max_rows 1) and
 *    among other rows (max_rows 8, 40, 64; the default scratch and one holding 3 rows' partials) are
 *    bitwise identical, and within 1e-5 of a double reference; masked and empty rows are zeros.
 *  - test_data_checks: a slot / position / block id / kv_len out of range is recorded (KC_ERR_*) and the
 *    row skipped, the other rows still the CPU's.
 *
 * Limits: those of the emulation (emu_cuda.h): blocks one after another, glibc's exp2f (CUDA's exp2f
 * may differ by an ulp), nvcc's FMA contraction not reproduced. */
#include "tests/emu/emu_optest.h"

static kern_pool *g_pool;

/* the kv_write and attention cases: tests/opcases/opcases.c (shared with tests/gpu/test_cuda_ops.c) */
typedef oc_cache_geo cache_geo;
#define block_tables oc_block_tables

static void test_kv_write(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_kv_write, opcase_kv_write, "kv_write");
}

static void test_attention(void **state)
{
    (void)state;
    et_cases(g_pool, emu_kc_attention, opcase_attention, "attention");
}

/* ---- batch invariance ------------------------------------------------------------------------------------- */
typedef struct {
    int nh, nkv, hd, bs, max_blocks, max_seqs;
    int q_stride, num_blocks;
    size_t cache_elems;
    float *kc, *vc;
    int32_t *bt;
    float scale;
} att_env;

/* One attention op over max_rows rows (n live), one schedule. Returns the output (caller frees); rows past
 * n must keep the poison. */
static float *att_once(const att_env *e, const float *q, const int32_t *slot, const int32_t *kvl, int max_rows, int n,
                       size_t attn_bytes, uint64_t seed)
{
    const size_t ob = (size_t)max_rows * e->nh * e->hd;
    float *out = et_poison(ob);
    int32_t nn = n;
    kern_op op = {.kind = KOP_ATTENTION};
    op.buf[0] = (kern_buf){(void *)q, (size_t)max_rows * e->q_stride * 4};
    op.buf[1] = (kern_buf){e->kc, e->cache_elems * 4};
    op.buf[2] = (kern_buf){e->vc, e->cache_elems * 4};
    op.buf[3] = (kern_buf){out, ob * 4};
    op.buf[4] = (kern_buf){(void *)slot, (size_t)max_rows * 4};
    op.buf[5] = (kern_buf){(void *)kvl, (size_t)max_rows * 4};
    op.buf[6] = (kern_buf){e->bt, (size_t)e->max_seqs * e->max_blocks * 4};
    op.buf[7] = (kern_buf){&nn, 4};
    op.p[0] = e->nh;
    op.p[1] = e->nkv;
    op.p[2] = e->hd;
    op.p[3] = e->q_stride;
    op.p[4] = e->bs;
    op.p[5] = e->max_blocks;
    op.p[6] = max_rows;
    op.f[0] = e->scale;
    const emu_kc_config cfg = {.attn_bytes = attn_bytes};
    char msg[192];
    if (emu_kc_attention(&op, &cfg, seed, msg, sizeof msg) != 0) fail_msg("attention: the kernel recorded %s", msg);
    for (size_t i = (size_t)n * e->nh * e->hd; i < ob; i++)
        if (gpu_bits(out[i]) != GPU_POISON_BITS)
            fail_msg("attention: max_rows %d n %d: element %zu past n written", max_rows, n, i);
    return out;
}

/* double reference of one row (all heads) */
static void att_ref_check(const att_env *e, const float *qrow, int slot, int L, const float *got)
{
    const int group = e->nh / e->nkv;
    double *sc = malloc((size_t)(L ? L : 1) * sizeof(double));
    assert_non_null(sc);
    for (int h = 0; h < e->nh; h++) {
        const int kvh = h / group;
        double mx = -INFINITY;
        for (int j = 0; j < L; j++) {
            const int blk = e->bt[slot * e->max_blocks + j / e->bs];
            const size_t at = ((size_t)blk * e->bs + (size_t)(j % e->bs)) * e->nkv * e->hd + (size_t)kvh * e->hd;
            double s = 0;
            for (int d = 0; d < e->hd; d++) s += (double)qrow[h * e->hd + d] * e->kc[at + d];
            sc[j] = s * (double)e->scale;
            if (sc[j] > mx) mx = sc[j];
        }
        double Z = 0;
        for (int j = 0; j < L; j++) Z += exp(sc[j] - mx);
        for (int d = 0; d < e->hd; d++) {
            double A = 0;
            for (int j = 0; j < L; j++) {
                const int blk = e->bt[slot * e->max_blocks + j / e->bs];
                const size_t at = ((size_t)blk * e->bs + (size_t)(j % e->bs)) * e->nkv * e->hd + (size_t)kvh * e->hd;
                A += exp(sc[j] - mx) * e->vc[at + d];
            }
            const double want = L ? A / Z : 0.0, have = got[h * e->hd + d];
            if (!(fabs(want - have) <= 1e-5))
                fail_msg("attention: L %d head %d dim %d: %.9g, reference %.9g", L, h, d, have, want);
        }
    }
    free(sc);
}

#define ATT_TRACK 6

static void test_attention_invariance(void **state)
{
    (void)state;
    gpu_rng r = {43};
    att_env e = {.nh = 8, .nkv = 2, .hd = 64, .bs = 16, .max_blocks = 20, .max_seqs = 4};
    e.q_stride = (e.nh + 2 * e.nkv) * e.hd;
    e.num_blocks = e.max_seqs * e.max_blocks;
    e.cache_elems = (size_t)e.num_blocks * e.bs * e.nkv * e.hd;
    e.kc = et_rand(&r, e.cache_elems, 1.0f);
    e.vc = et_rand(&r, e.cache_elems, 1.0f);
    e.bt = et_i32((size_t)e.num_blocks, 0);
    for (int i = 0; i < e.num_blocks; i++) e.bt[i] = i;
    for (int i = e.num_blocks - 1; i > 0; i--) {
        const int j = gpu_int(&r, 0, i), x = e.bt[i];
        e.bt[i] = e.bt[j];
        e.bt[j] = x;
    }
    e.scale = 4.0f / sqrtf((float)e.hd);
    const int max_kv = e.max_blocks * e.bs, row_elems = e.nh * e.hd;
    const int track_len[ATT_TRACK] = {1, 63, 64, 65, 300, 320};
    float *tq = et_rand(&r, (size_t)ATT_TRACK * e.q_stride, 2.0f);
    int32_t tslot[ATT_TRACK];
    for (int t = 0; t < ATT_TRACK; t++) tslot[t] = t % e.max_seqs;
    float *ref = et_alloc((size_t)ATT_TRACK * row_elems * 4);
    int run = 0;
    /* alone: max_rows 1 */
    for (int t = 0; t < ATT_TRACK; t++) {
        int32_t sl = tslot[t], L = track_len[t];
        float *got = att_once(&e, tq + (size_t)t * e.q_stride, &sl, &L, 1, 1, 0, ET_SEEDS[run++ & 1]);
        memcpy(ref + (size_t)t * row_elems, got, (size_t)row_elems * 4);
        att_ref_check(&e, tq + (size_t)t * e.q_stride, sl, L, got);
        free(got);
    }
    /* among other rows: max_rows 8 (some tracked rows), 40 and 64 (all, spread out), with the default
     * scratch and one holding 3 rows' partials (rows in chunks of 3) */
    const size_t ys = ((size_t)max_kv + 63) / 64; /* grid.y: the most splits a row can need (5) */
    const size_t tiny = (size_t)3 * e.nh * ys * ((size_t)e.hd + 2) * 4 + 100;
    const int buckets[] = {8, 40, 64};
    for (size_t bi = 0; bi < sizeof buckets / sizeof buckets[0]; bi++) {
        const int M = buckets[bi], n = M - 2, ntrack = M < 3 * ATT_TRACK ? 3 : ATT_TRACK;
        float *q = et_poison((size_t)M * e.q_stride);
        int32_t *slot = et_i32((size_t)M, GPU_POISON_I32), *kvl = et_i32((size_t)M, GPU_POISON_I32);
        for (int i = 0; i < n; i++) {
            slot[i] = gpu_int(&r, 0, e.max_seqs - 1);
            kvl[i] = gpu_int(&r, 0, 3) == 0 ? gpu_int(&r, 1, max_kv) : gpu_int(&r, 1, 70);
            for (int c = 0; c < e.q_stride; c++) q[(size_t)i * e.q_stride + c] = gpu_unif(&r);
        }
        slot[n - 1] = -1; /* a masked row and an empty one among them */
        kvl[n - 2] = 0;
        int pos[ATT_TRACK];
        for (int t = 0; t < ntrack; t++) {
            const int tt = (t + (int)bi) % ATT_TRACK;
            pos[t] = (t * (n - 3)) / ntrack + (int)bi % 2; /* distinct, < n - 2 */
            slot[pos[t]] = tslot[tt];
            kvl[pos[t]] = track_len[tt];
            memcpy(q + (size_t)pos[t] * e.q_stride, tq + (size_t)tt * e.q_stride, (size_t)e.q_stride * 4);
        }
        for (int variant = 0; variant < 2; variant++) {
            float *got = att_once(&e, q, slot, kvl, M, n, variant ? tiny : 0, ET_SEEDS[run++ & 1]);
            for (int t = 0; t < ntrack; t++) {
                const int tt = (t + (int)bi) % ATT_TRACK;
                if (memcmp(ref + (size_t)tt * row_elems, got + (size_t)pos[t] * row_elems, (size_t)row_elems * 4) != 0)
                    fail_msg("attention: the row with kv_len %d differs alone vs at row %d of max_rows %d (%s scratch)",
                             track_len[tt], pos[t], M, variant ? "3-row" : "default");
            }
            for (int j = 0; j < row_elems; j++)
                if (gpu_bits(got[(size_t)(n - 1) * row_elems + j]) != 0 ||
                    gpu_bits(got[(size_t)(n - 2) * row_elems + j]) != 0)
                    fail_msg("attention: masked / empty row not +0 (max_rows %d)", M);
            free(got);
        }
        free(q);
        free(slot);
        free(kvl);
    }
    free(tq);
    free(ref);
    free(e.kc);
    free(e.vc);
    free(e.bt);
}

/* ---- data-dependent checks (the CPU aborts on them) ------------------------------------------------------- */
static void test_data_checks(void **state)
{
    (void)state;
    gpu_rng r = {44};
    const cache_geo g = {2, 32, 4, 6, 3, 18};
    /* kv_write: row 1's slot, row 2's position, row 3's block id (a table entry past the cache) */
    const char *codes[3] = {"KC_ERR_SLOT", "KC_ERR_POS", "KC_ERR_BLOCK"};
    for (int k = 0; k < 3; k++) {
        const int sl[4] = {0, k == 0 ? 3 : 1, 1, 2}, ps[4] = {1, 2, k == 1 ? 24 : 3, 4};
        et_case t;
        oc_kv_write_case(&t, 1e-5, &r, &g, 2, 4, 4, sl, ps);
        int32_t *bt = t.host[5];
        if (k == 2) bt[2 * g.max_blocks + 1] = g.num_blocks; /* slot 2, position 4 */
        char name[64];
        snprintf(name, sizeof name, "kv_write check %s", codes[k]);
        et_expect_error(&t, emu_kc_kv_write, codes[k], name, NULL);
    }
    /* attention: row 1's kv_len past the table, or its slot past the tables: recorded, the row skipped
     * (zeros), rows 0, 2 and 3 still the CPU's */
    for (int k = 0; k < 2; k++) {
        const int nh = 4, hd = 32, max_rows = 4, max_seqs = 3;
        const cache_geo ag = {2, hd, 16, 8, max_seqs, 24};
        const size_t cache = (size_t)ag.num_blocks * ag.bs * ag.nkv * hd;
        const int q_stride = nh * hd;
        et_case t;
        et_init(&t, KOP_ATTENTION);
        et_buf(&t, 0, et_rand(&r, (size_t)max_rows * q_stride, 1.0f), (size_t)max_rows * q_stride * 4, ET_IN);
        et_buf(&t, 1, et_rand(&r, cache, 1.0f), cache * 4, ET_IN);
        et_buf(&t, 2, et_rand(&r, cache, 1.0f), cache * 4, ET_IN);
        et_buf(&t, 3, et_poison((size_t)max_rows * nh * hd), (size_t)max_rows * nh * hd * 4, ET_OUT_F32);
        int32_t *slot = et_i32(max_rows, 0), *kvl = et_i32(max_rows, 100); /* 2 splits */
        slot[2] = 2;
        slot[3] = 1;
        if (k == 0) kvl[1] = 129;
        else slot[1] = max_seqs;
        et_buf(&t, 4, slot, max_rows * 4, ET_IN);
        et_buf(&t, 5, kvl, max_rows * 4, ET_IN);
        et_buf(&t, 6, block_tables(&r, &ag), (size_t)max_seqs * ag.max_blocks * 4, ET_IN);
        et_buf(&t, 7, et_i32(1, max_rows), 4, ET_IN);
        t.op.p[0] = nh;
        t.op.p[1] = ag.nkv;
        t.op.p[2] = hd;
        t.op.p[3] = q_stride;
        t.op.p[4] = ag.bs;
        t.op.p[5] = ag.max_blocks;
        t.op.p[6] = max_rows;
        t.op.f[0] = 0.2f;
        /* the CPU on the same op with row 1 made valid */
        kern_op cop = t.op;
        float *cout = et_poison((size_t)max_rows * nh * hd);
        int32_t cslot[4] = {0, 0, 2, 1}, ckvl[4] = {100, 100, 100, 100};
        for (int s = 0; s < 8; s++) cop.buf[s] = (kern_buf){t.host[s], t.bytes[s]};
        cop.buf[3].ptr = cout;
        cop.buf[4].ptr = cslot;
        cop.buf[5].ptr = ckvl;
        kern_cpu_exec(g_pool, &cop);
        void *outs[ET_SLOTS] = {0};
        et_expect_error(&t, emu_kc_attention, k == 0 ? "KC_ERR_KVLEN" : "KC_ERR_SLOT",
                        k == 0 ? "attention kv_len check" : "attention slot check", outs);
        const float *o = outs[3];
        for (int row = 0; row < 4; row++) {
            if (row == 1) {
                for (int i = 0; i < nh * hd; i++) assert_int_equal(gpu_bits(o[nh * hd + i]), 0u);
                continue;
            }
            assert_int_equal(gpu_cmp_f32("attention check rows", cout + row * nh * hd, o + row * nh * hd, NULL,
                                         (size_t)nh * hd, 2e-5, 0),
                             0);
        }
        free(cout);
        for (int s = 0; s < ET_SLOTS; s++) free(outs[s]);
    }
}

int main(void)
{
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_write),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_invariance),
        cmocka_unit_test(test_data_checks),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    return rc;
}
