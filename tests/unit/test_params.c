/* tests/unit/test_params.c — parameter table mapping, coverage and load sessions (I2, I3, I4).
 * Checked against an independent expectation: the stored bytes of every parameter after a cold
 * load must equal the checkpoint tensors placed by hand at the documented rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "models/mkmodel.h"
#include "models/model.h"
#include "test_util.h"

typedef struct {
    eng_backend *be;
    mdl_model *m;
    mdl_st_file f;
    char dir[1024];
} fx;

static void make(fx *x, const char *name, mdl_arch arch, int tie, mdl_dtype dt)
{
    char err[512];
    snprintf(x->dir, sizeof x->dir, "%s", test_tmpdir(name));
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    o.arch = arch;
    o.tie = tie;
    o.dtype = dt;
    o.tokenizer = 0;
    o.vocab = 96;
    o.hidden = 32;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = 12; /* != hidden / heads */
    o.intermediate = 40;
    assert_int_equal(mdl_mkmodel(&o, x->dir, err, sizeof err), 0);
    mdl_config cfg;
    assert_int_equal(mdl_config_load(x->dir, &cfg, err, sizeof err), 0);
    eng_backend_config bc = {.arena_bytes = (size_t)1 << 28, .threads = 1, .checked = 1};
    x->be = eng_backend_cpu_create(&bc, err, sizeof err);
    x->m = mdl_model_create(&cfg, x->be, err, sizeof err);
    assert_non_null(x->m);
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", x->dir);
    assert_int_equal(mdl_st_open(path, &x->f, err, sizeof err), 0);
}

static void unmake(fx *x)
{
    mdl_st_close(&x->f);
    mdl_model_destroy(x->m);
    eng_backend_destroy(x->be);
}

/* Expected bytes of a destination row range: the checkpoint tensor converted to the storage dtype. */
static void check_dest_bytes(const mdl_model *m, const mdl_st_tensor *t)
{
    const mdl_dest *d = mdl_model_find(m, t->name);
    assert_non_null(d);
    const mdl_param *p = &m->params[d->param];
    size_t w = mdl_dtype_size(p->dt);
    uint8_t *want = malloc(t->numel * w);
    assert_int_equal(mdl_convert(want, p->dt, t->data, t->dtype, t->numel), 0);
    assert_memory_equal((const uint8_t *)p->ptr + (size_t)d->row0 * (size_t)p->cols * w, want, t->numel * w);
    free(want);
}

static void test_table_rows(void **state)
{
    (void)state;
    fx x;
    make(&x, "table", MDL_ARCH_QWEN2, 0, MDL_DT_BF16);
    const mdl_dest *q = mdl_model_find(x.m, "model.layers.1.self_attn.q_proj.weight");
    const mdl_dest *k = mdl_model_find(x.m, "model.layers.1.self_attn.k_proj.weight");
    const mdl_dest *v = mdl_model_find(x.m, "model.layers.1.self_attn.v_proj.weight");
    const mdl_dest *vb = mdl_model_find(x.m, "model.layers.1.self_attn.v_proj.bias");
    const mdl_dest *up = mdl_model_find(x.m, "model.layers.0.mlp.up_proj.weight");
    assert_non_null(q);
    assert_int_equal(q->param, k->param);
    assert_int_equal(q->row0, 0);
    assert_int_equal(q->rows, 48);
    assert_int_equal(k->row0, 48);
    assert_int_equal(v->row0, 72);
    assert_int_equal(v->rows, 24);
    assert_int_equal(vb->row0, 72);
    assert_int_equal(up->row0, 40);
    assert_string_equal(x.m->params[q->param].name, "layers.1.qkv");
    assert_null(mdl_model_find(x.m, "model.layers.2.mlp.up_proj.weight"));
    assert_null(mdl_model_find(x.m, "model.layers.0.self_attn.q_norm.weight")); /* qwen2: none */
    unmake(&x);
}

static void test_cold_load_places_every_byte(void **state)
{
    (void)state;
    const mdl_dtype dts[] = {MDL_DT_BF16, MDL_DT_F16, MDL_DT_F32};
    for (int i = 0; i < 3; i++) {
        fx x;
        make(&x, "cold", MDL_ARCH_QWEN3, i == 1, dts[i]);
        char err[512];
        assert_int_equal(mdl_model_load_dir(x.m, x.dir, err, sizeof err), 0);
        assert_int_equal(x.m->hook_runs, 1);
        for (size_t t = 0; t < x.f.n; t++) check_dest_bytes(x.m, &x.f.tensors[t]);
        unmake(&x);
    }
}

/* Any order, any bucket split: one tensor per bucket in reverse order equals the cold load. */
static void test_order_free_buckets(void **state)
{
    (void)state;
    fx x;
    make(&x, "order", MDL_ARCH_QWEN3, 0, MDL_DT_BF16);
    char err[512];
    mdl_session s;
    assert_int_equal(mdl_session_begin(&s, x.m, MDL_LOAD_FULL, err, sizeof err), 0);
    for (size_t t = x.f.n; t-- > 0;)
        assert_int_equal(mdl_session_bucket(&s, &x.f.tensors[t], 1, "bucket", err, sizeof err), 0);
    assert_int_equal(mdl_session_finish(&s, err, sizeof err), 0);
    mdl_session_end(&s);
    assert_int_equal(x.m->hook_runs, 1);
    for (size_t t = 0; t < x.f.n; t++) check_dest_bytes(x.m, &x.f.tensors[t]);
    unmake(&x);
}

static void test_missing_tensor_named(void **state)
{
    (void)state;
    fx x;
    make(&x, "missing", MDL_ARCH_QWEN3, 1, MDL_DT_BF16);
    char err[1024];
    mdl_session s;
    assert_int_equal(mdl_session_begin(&s, x.m, MDL_LOAD_FULL, err, sizeof err), 0);
    for (size_t t = 0; t < x.f.n; t++) {
        if (strcmp(x.f.tensors[t].name, "model.layers.1.mlp.up_proj.weight") == 0) continue;
        assert_int_equal(mdl_session_bucket(&s, &x.f.tensors[t], 1, "b", err, sizeof err), 0);
    }
    assert_int_equal(mdl_session_finish(&s, err, sizeof err), -1);
    assert_string_equal(err, "missing tensor model.layers.1.mlp.up_proj.weight");
    assert_int_equal(x.m->hook_runs, 0); /* no hook on an incomplete full load */
    mdl_session_end(&s);
    /* partial mode accepts the same subset and runs the hook once */
    assert_int_equal(mdl_session_begin(&s, x.m, MDL_LOAD_PARTIAL, err, sizeof err), 0);
    assert_int_equal(mdl_session_bucket(&s, &x.f.tensors[0], 1, "b", err, sizeof err), 0);
    assert_int_equal(mdl_session_finish(&s, err, sizeof err), 0);
    assert_int_equal(x.m->hook_runs, 1);
    mdl_session_end(&s);
    /* a session that wrote nothing does not re-process the model */
    assert_int_equal(mdl_session_begin(&s, x.m, MDL_LOAD_PARTIAL, err, sizeof err), 0);
    assert_int_equal(mdl_session_finish(&s, err, sizeof err), 0);
    assert_int_equal(x.m->hook_runs, 1);
    mdl_session_end(&s);
    unmake(&x);
}

/* A bad tensor anywhere in a bucket refuses the whole bucket before any byte is written. */
static void test_bad_bucket_writes_nothing(void **state)
{
    (void)state;
    fx x;
    make(&x, "badbucket", MDL_ARCH_QWEN3, 0, MDL_DT_BF16);
    char err[1024];
    size_t n = x.f.n;
    mdl_st_tensor *copy = malloc(n * sizeof *copy);
    struct {
        const char *what;
        const char *expect;
    } cases[] = {{"unknown", "unknown tensor model.layers.0.mlp.extra.weight"},
                 {"shape", "has shape [3,32]; expected"},
                 {"dtype", "has dtype I32"},
                 {"vector", "has shape [33]; expected [32]"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(copy, x.f.tensors, n * sizeof *copy);
        mdl_st_tensor *last = &copy[n - 1];
        if (c == 0) last->name = "model.layers.0.mlp.extra.weight";
        if (c == 1) {
            for (size_t t = 0; t < n; t++)
                if (strcmp(copy[t].name, "model.layers.1.self_attn.k_proj.weight") == 0) last = &copy[t];
            last->shape[0] = 3;
        }
        if (c == 2) last->dtype = MDL_DT_I32;
        if (c == 3) {
            for (size_t t = 0; t < n; t++)
                if (strcmp(copy[t].name, "model.norm.weight") == 0) last = &copy[t];
            last->shape[0] = 33;
        }
        mdl_session s;
        assert_int_equal(mdl_session_begin(&s, x.m, MDL_LOAD_FULL, err, sizeof err), 0);
        assert_int_equal(mdl_session_bucket(&s, copy, n, "bucket 7", err, sizeof err), -1);
        assert_non_null(strstr(err, cases[c].expect));
        assert_non_null(strstr(err, "bucket 7"));
        assert_int_equal(s.wrote, 0);
        mdl_session_end(&s);
        for (int p = 0; p < x.m->n_params; p++) { /* storage untouched: still all zero */
            const uint8_t *b = x.m->params[p].ptr;
            for (size_t i = 0; i < x.m->params[p].bytes; i++) assert_int_equal(b[i], 0);
        }
    }
    free(copy);
    unmake(&x);
}

/* Tied: lm_head.weight is an alias of embed_tokens' storage; either name covers it. */
static void test_tied_alias(void **state)
{
    (void)state;
    fx x;
    make(&x, "tied", MDL_ARCH_LLAMA, 1, MDL_DT_F32);
    assert_int_equal(x.m->lm_head, x.m->embed);
    const mdl_dest *a = mdl_model_find(x.m, "lm_head.weight"), *b = mdl_model_find(x.m, "model.embed_tokens.weight");
    assert_non_null(a);
    assert_int_equal(a->param, b->param);
    assert_int_equal(a->cover, b->cover);
    char err[512];
    mdl_session s;
    assert_int_equal(mdl_session_begin(&s, x.m, MDL_LOAD_FULL, err, sizeof err), 0);
    for (size_t t = 0; t < x.f.n; t++) {
        mdl_st_tensor tt = x.f.tensors[t];
        if (strcmp(tt.name, "model.embed_tokens.weight") == 0) tt.name = "lm_head.weight";
        assert_int_equal(mdl_session_bucket(&s, &tt, 1, "b", err, sizeof err), 0);
    }
    assert_int_equal(mdl_session_finish(&s, err, sizeof err), 0);
    mdl_session_end(&s);
    unmake(&x);
}

/* The RoPE table is a derived buffer: filled at create from the config's rope type (yarn here, the
 * transformers 5 layout) and refilled in place by the post-load hook (plans keep its pointer). */
static void test_inv_freq_derived(void **state)
{
    (void)state;
    char err[512];
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("params_rope"));
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    o.tokenizer = 0;
    o.vocab = 96;
    o.max_pos = 256;
    o.config_v5 = 1;
    o.rope_type = "yarn";
    o.rope_theta = 10000;
    o.rope_factor = 4;
    o.rope_orig_max_pos = 64;
    assert_int_equal(mdl_mkmodel(&o, dir, err, sizeof err), 0);
    mdl_config cfg;
    assert_int_equal(mdl_config_load(dir, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.rope_type, MDL_ROPE_YARN);
    eng_backend_config bc = {.arena_bytes = (size_t)1 << 26, .threads = 1, .checked = 1};
    eng_backend *be = eng_backend_cpu_create(&bc, err, sizeof err);
    mdl_model *m = mdl_model_create(&cfg, be, err, sizeof err);
    assert_non_null(m);
    const int half = cfg.head_dim / 2;
    double want[64];
    mdl_rope_inv_freq(&cfg, want);
    float *const table = m->inv_freq;
    for (int i = 0; i < half; i++) assert_true(table[i] == (float)want[i]);
    assert_true(table[half - 1] < (float)(1.0 / pow(10000.0, (double)(half - 1) * 2 / cfg.head_dim))); /* scaled */
    /* want[] comes from the code under test; yarn's ends do not: the fastest band (wavelength 2 pi,
     * beta_fast 32 over 64 positions) is extrapolated as is, the slowest interpolated by the factor */
    assert_true(table[0] == 1.0f);
    assert_float_equal(table[half - 1], 1.0 / pow(10000.0, (double)(half - 1) * 2 / cfg.head_dim) / 4.0,
                       1e-6 * table[half - 1]);
    memset(table, 0, (size_t)half * sizeof(float));
    mdl_st_file f;
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(mdl_st_open(path, &f, err, sizeof err), 0);
    mdl_session s;
    assert_int_equal(mdl_session_begin(&s, m, MDL_LOAD_PARTIAL, err, sizeof err), 0);
    assert_int_equal(mdl_session_bucket(&s, &f.tensors[0], 1, "b", err, sizeof err), 0);
    assert_int_equal(mdl_session_finish(&s, err, sizeof err), 0);
    mdl_session_end(&s);
    assert_ptr_equal(m->inv_freq, table); /* in place */
    for (int i = 0; i < half; i++) assert_true(table[i] == (float)want[i]);
    mdl_st_close(&f);
    mdl_model_destroy(m);
    eng_backend_destroy(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_rows),
        cmocka_unit_test(test_cold_load_places_every_byte),
        cmocka_unit_test(test_order_free_buckets),
        cmocka_unit_test(test_missing_tensor_named),
        cmocka_unit_test(test_bad_bucket_writes_nothing),
        cmocka_unit_test(test_tied_alias),
        cmocka_unit_test(test_inv_freq_derived),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
