/* tests/unit/test_config.c — config.json parsing: real-world shapes accepted, unsupported values
 * refused with a message naming the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/config.h"

/* The fields of Qwen3-0.6B's published config.json. */
static const char qwen3_06b[] =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\","
    "\"hidden_size\":1024,\"initializer_range\":0.02,\"intermediate_size\":3072,"
    "\"max_position_embeddings\":40960,\"max_window_layers\":28,\"model_type\":\"qwen3\","
    "\"num_attention_heads\":16,\"num_hidden_layers\":28,\"num_key_value_heads\":8,"
    "\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,"
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.51.0\","
    "\"use_cache\":true,\"use_sliding_window\":false,\"vocab_size\":151936}";

static void test_qwen3(void **state)
{
    (void)state;
    mdl_config c;
    char err[256];
    assert_int_equal(mdl_config_parse(qwen3_06b, strlen(qwen3_06b), &c, err, sizeof err), 0);
    assert_int_equal(c.arch, MDL_ARCH_QWEN3);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.hidden, 1024);
    assert_int_equal(c.kv_heads, 8);
    assert_int_equal(c.vocab, 151936);
    assert_true(c.tie);
    assert_true(c.qk_norm);
    assert_false(c.qkv_bias);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos[0], 151645);
    assert_int_equal(c.bos, 151643);
    assert_int_equal(c.dtype, MDL_DT_BF16);
}

static void test_llama_qwen2(void **state)
{
    (void)state;
    const char *llama =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":100,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":1,\"vocab_size\":300,"
        "\"eos_token_id\":[5,7],\"rope_theta\":500000.0,\"attention_bias\":true,\"torch_dtype\":\"float16\"}";
    mdl_config c;
    char err[256];
    assert_int_equal(mdl_config_parse(llama, strlen(llama), &c, err, sizeof err), 0);
    assert_int_equal(c.head_dim, 16); /* default hidden / heads */
    assert_false(c.qk_norm);
    assert_true(c.qkv_bias);
    assert_true(c.o_bias);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.dtype, MDL_DT_F16);
    const char *qwen2 =
        "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":100,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":300}";
    assert_int_equal(mdl_config_parse(qwen2, strlen(qwen2), &c, err, sizeof err), 0);
    assert_true(c.qkv_bias);
    assert_false(c.o_bias);
}

static void test_refusals(void **state)
{
    (void)state;
    struct {
        const char *json, *expect;
    } cases[] = {
        {"[]", "not a JSON object"},
        {"{\"architectures\":[\"MistralForCausalLM\"]}", "unsupported architecture MistralForCausalLM"},
        {"{\"architectures\":\"Qwen3ForCausalLM\"}", "architectures"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"]}", "missing field hidden_size"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":-4}", "hidden_size"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64.5}", "hidden_size"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":3,\"num_key_value_heads\":2,\"vocab_size\":9,\"head_dim\":8}",
         "not a multiple"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"head_dim\":15}",
         "head_dim 15 must be even"},
        /* no head_dim: hidden_size / num_attention_heads is 0 (found by fuzz_config) */
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":2,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9}",
         "no head_dim, and hidden_size 2 / num_attention_heads 4 gives 0"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"rope_scaling\":{\"type\":\"longrope\"}}",
         "rope_scaling.rope_type \"longrope\" is not supported"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"hidden_act\":\"gelu\"}",
         "hidden_act"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"torch_dtype\":\"int8\"}",
         "torch_dtype"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"use_sliding_window\":true,"
         "\"sliding_window\":16,\"max_window_layers\":0}",
         "use_sliding_window=true with sliding_window 16"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"eos_token_id\":9}",
         "eos_token_id"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"tie_word_embeddings\":1}",
         "tie_word_embeddings"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mdl_config c;
        char err[256] = "";
        assert_int_equal(mdl_config_parse(cases[i].json, strlen(cases[i].json), &c, err, sizeof err), -1);
        if (!strstr(err, cases[i].expect)) fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].expect);
    }
}

/* A small target and a DSpark drafter config carrying every field DeepSpec's build_draft_config
 * writes (DS@afdfa7c deepspec/modeling/dspark/qwen3/config.py:37-56, on a deepcopy of the target's
 * Qwen3Config); the drafter fields are appended per case. */
#define TGT_GEO                                                                                         \
    "\"attention_bias\":false,\"attention_dropout\":0.0,\"bos_token_id\":1,\"eos_token_id\":2,"          \
    "\"head_dim\":16,\"hidden_act\":\"silu\",\"hidden_size\":64,\"initializer_range\":0.02,"            \
    "\"intermediate_size\":96,\"max_position_embeddings\":4096,\"max_window_layers\":4,"                \
    "\"model_type\":\"qwen3\",\"num_attention_heads\":4,\"num_key_value_heads\":2,"                    \
    "\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,"       \
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.57.1\",\"use_cache\":true,"               \
    "\"use_sliding_window\":false,\"vocab_size\":300"
static const char tgt4[] = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"num_hidden_layers\":4,"
                           "\"tie_word_embeddings\":true," TGT_GEO "}";
#define DSPARK_HEAD                                                                                     \
    "{\"architectures\":[\"Qwen3DSparkModel\"],\"num_hidden_layers\":2,\"num_target_layers\":4,"        \
    "\"tie_word_embeddings\":false,\"block_size\":7,\"mask_token_id\":299," TGT_GEO ","

static int parse_pair(const char *dj, mdl_config *d, char *err, size_t errlen)
{
    mdl_config t;
    assert_int_equal(mdl_config_parse(tgt4, strlen(tgt4), &t, err, errlen), 0);
    if (mdl_config_parse(dj, strlen(dj), d, err, errlen) != 0) return -1;
    return mdl_config_check_drafter(&t, d, err, errlen);
}

/* A config that must be refused, and a piece of the message that must name why. */
typedef struct {
    const char *json, *expect;
} refusal;

/* Each case refused (-1) with its expected words: as a drafter paired with tgt4 (pair), or alone. */
static void expect_refusals(const refusal *bad, size_t n, int pair)
{
    for (size_t i = 0; i < n; i++) {
        mdl_config c;
        char err[512] = "";
        const int rc = pair ? parse_pair(bad[i].json, &c, err, sizeof err)
                            : mdl_config_parse(bad[i].json, strlen(bad[i].json), &c, err, sizeof err);
        if (rc != -1) fail_msg("case %zu (%s) was accepted", i, bad[i].expect);
        if (!strstr(err, bad[i].expect)) fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i].expect);
    }
}

static void test_drafter_formats(void **state)
{
    (void)state;
    mdl_config d;
    char err[512] = "";
    /* every Qwen3DSparkConfig field; target_layer_ids with -1 (embeddings) and L-1 (final-normed) */
    const char *full = DSPARK_HEAD
        "\"layer_types\":[\"full_attention\",\"full_attention\"],\"_attn_implementation\":\"flex_attention\","
        "\"target_layer_ids\":[-1,1,3],\"num_anchors\":512,\"enable_confidence_head\":true,"
        "\"confidence_head_with_markov\":true,\"markov_rank\":16,\"markov_head_type\":\"vanilla\","
        "\"pad_token_id\":null}";
    if (parse_pair(full, &d, err, sizeof err) != 0) fail_msg("full DSpark config refused: %s", err);
    assert_int_equal(d.n_target_ids, 3);
    assert_int_equal(d.target_ids[0], -1);
    assert_int_equal(d.target_ids[2], 3);
    assert_int_equal(d.markov_rank, 16);
    assert_true(d.conf_head && d.conf_with_markov);
    /* confidence_head_with_markov means nothing without the head (DeepSpec writes it only with it) */
    const char *nohead = DSPARK_HEAD "\"target_layer_ids\":[0],\"num_anchors\":256,"
                                     "\"enable_confidence_head\":false,\"confidence_head_with_markov\":true,"
                                     "\"markov_rank\":0,\"markov_head_type\":\"gated\"}";
    if (parse_pair(nohead, &d, err, sizeof err) != 0) fail_msg("DSpark without heads refused: %s", err);
    assert_false(d.conf_head || d.conf_with_markov);
    /* z-lab DFlash: id L-1 in dflash_config */
    const char *dflash =
        "{\"architectures\":[\"DFlashDraftModel\"],\"num_hidden_layers\":1,\"num_target_layers\":4,"
        "\"block_size\":16," TGT_GEO ",\"dflash_config\":{\"mask_token_id\":299,\"target_layer_ids\":[0,3]}}";
    if (parse_pair(dflash, &d, err, sizeof err) != 0) fail_msg("DFlash with id L-1 refused: %s", err);
    assert_int_equal(d.target_ids[1], 3);

    const refusal bad[] = {
        {DSPARK_HEAD "\"target_layer_ids\":[-2,1],\"enable_confidence_head\":false,\"markov_rank\":0}",
         "target_layer_ids[0] = -2: ids must be strictly increasing, each -1 (the embedding output) or a "
         "target layer in [0, 3]"},
        {DSPARK_HEAD "\"target_layer_ids\":[0,4],\"enable_confidence_head\":false,\"markov_rank\":0}",
         "target_layer_ids[1] = 4: ids must be strictly increasing, each -1 (the embedding output) or a "
         "target layer in [0, 3]"},
        {DSPARK_HEAD "\"target_layer_ids\":[1,1],\"enable_confidence_head\":false,\"markov_rank\":0}",
         "target_layer_ids[1] = 1: ids must be strictly increasing"},
        {DSPARK_HEAD "\"target_layer_ids\":[1],\"layer_types\":[\"full_attention\",\"sliding_attention\"],"
                     "\"enable_confidence_head\":false,\"markov_rank\":0}",
         "layer_types"},
        {DSPARK_HEAD "\"target_layer_ids\":[1],\"layer_types\":[\"full_attention\"],"
                     "\"enable_confidence_head\":false,\"markov_rank\":0}",
         "layer_types"},
        {DSPARK_HEAD "\"target_layer_ids\":[1],\"num_anchors\":\"many\",\"enable_confidence_head\":false,"
                     "\"markov_rank\":0}",
         "num_anchors"},
        {DSPARK_HEAD "\"target_layer_ids\":[1],\"enable_confidence_head\":false,\"markov_rank\":4,"
                     "\"markov_head_type\":\"rnn\"}",
         "markov_head_type"},
        {"{\"architectures\":[\"DFlashDraftModel\"],\"num_hidden_layers\":1,\"num_target_layers\":4,"
         TGT_GEO ",\"dflash_config\":{\"mask_token_id\":299,\"target_layer_ids\":[1],\"is_causal\":true}}",
         "is_causal"},
        {"{\"architectures\":[\"DFlashDraftModel\"],\"num_hidden_layers\":1,\"num_target_layers\":4,"
         TGT_GEO ",\"dflash_config\":{\"mask_token_id\":299,\"target_layer_ids\":[1],"
         "\"input_embedding_scale\":2.0}}",
         "input_embedding_scale"},
        {"{\"architectures\":[\"DFlashDraftModel\"],\"num_hidden_layers\":1,\"num_target_layers\":4,"
         TGT_GEO ",\"output_multiplier\":0.5,\"dflash_config\":{\"mask_token_id\":299,\"target_layer_ids\":[1]}}",
         "output_multiplier"},
        {"{\"architectures\":[\"DFlashDraftModel\"],\"num_hidden_layers\":1,\"num_target_layers\":4,"
         TGT_GEO ",\"final_logit_softcapping\":30.0,\"dflash_config\":{\"mask_token_id\":299,"
         "\"target_layer_ids\":[1]}}",
         "final_logit_softcapping"},
        /* the z-lab default rule for a 4-layer target and 2 drafter layers gives [1, 1] */
        {"{\"architectures\":[\"DFlashDraftModel\"],\"num_hidden_layers\":2,\"num_target_layers\":4,"
         TGT_GEO ",\"dflash_config\":{\"mask_token_id\":299}}",
         "target_layer_ids[1] = 1"},
    };
    expect_refusals(bad, sizeof bad / sizeof bad[0], 1);
    /* the pairing check against a target reports the same message as the drafter's own config */
    mdl_config t;
    assert_int_equal(mdl_config_parse(tgt4, strlen(tgt4), &t, err, sizeof err), 0);
    assert_int_equal(mdl_config_parse(full, strlen(full), &d, err, sizeof err), 0);
    d.target_ids[2] = 4;
    assert_int_equal(mdl_config_check_drafter(&t, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "drafter: target_layer_ids[2] = 4: ids must be strictly increasing, each -1 (the "
                                "embedding output) or a target layer in [0, 3]"));
}

/* Llama-3.1-8B's published config.json (transformers 4 layout, llama3 rope_scaling). */
static const char llama31_8b[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"hidden_act\":\"silu\","
    "\"hidden_size\":4096,\"initializer_range\":0.02,\"intermediate_size\":14336,"
    "\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\",\"num_attention_heads\":32,"
    "\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,"
    "\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
    "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,"
    "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.43.0.dev0\","
    "\"use_cache\":true,\"vocab_size\":128256}";

/* Qwen2.5-7B-Instruct's published config.json: a sliding_window value with use_sliding_window false. */
static const char qwen25_7b[] =
    "{\"architectures\":[\"Qwen2ForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":151643,"
    "\"eos_token_id\":151645,\"hidden_act\":\"silu\",\"hidden_size\":3584,\"initializer_range\":0.02,"
    "\"intermediate_size\":18944,\"max_position_embeddings\":32768,\"max_window_layers\":28,"
    "\"model_type\":\"qwen2\",\"num_attention_heads\":28,\"num_hidden_layers\":28,\"num_key_value_heads\":4,"
    "\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,\"sliding_window\":131072,\"tie_word_embeddings\":false,"
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.43.1\",\"use_cache\":true,"
    "\"use_sliding_window\":false,\"vocab_size\":152064}";

/* A Qwen3 config as transformers 5 writes it: rope_parameters, dtype, layer_types. */
static const char qwen3_v5[] =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"dtype\":\"float32\",\"head_dim\":16,"
    "\"hidden_size\":64,\"intermediate_size\":128,\"layer_types\":[\"full_attention\",\"full_attention\"],"
    "\"max_position_embeddings\":4096,\"max_window_layers\":2,\"num_attention_heads\":4,\"num_hidden_layers\":2,"
    "\"num_key_value_heads\":2,\"rope_parameters\":{\"rope_theta\":5000.0,\"rope_type\":\"default\"},"
    "\"sliding_window\":null,\"use_sliding_window\":false,\"vocab_size\":512,\"transformers_version\":\"5.0.0\"}";

static void test_real_configs(void **state)
{
    (void)state;
    mdl_config c;
    char err[256];
    assert_int_equal(mdl_config_parse(llama31_8b, strlen(llama31_8b), &c, err, sizeof err), 0);
    assert_int_equal(c.rope_type, MDL_ROPE_LLAMA3);
    assert_true(c.rope_theta == 500000.0 && c.rope_factor == 8.0);
    assert_true(c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0);
    assert_int_equal(c.rope_orig_max_pos, 8192);
    assert_int_equal(c.n_eos, 3);
    assert_false(c.qkv_bias);
    assert_true(c.rope_attn_factor == 1.0);
    assert_int_equal(mdl_config_parse(qwen25_7b, strlen(qwen25_7b), &c, err, sizeof err), 0);
    assert_true(c.qkv_bias);
    assert_int_equal(c.rope_type, MDL_ROPE_DEFAULT);
    assert_true(c.rope_theta == 1e6);
    /* transformers 5: theta inside rope_parameters (graphswap used its default 1e6 before) */
    if (mdl_config_parse(qwen3_v5, strlen(qwen3_v5), &c, err, sizeof err) != 0) fail_msg("%s", err);
    assert_true(c.rope_theta == 5000.0);
    assert_int_equal(c.dtype, MDL_DT_F32);
    assert_int_equal(c.rope_type, MDL_ROPE_DEFAULT);
}

/* A small Qwen3 (head_dim 16, 2 layers) with `extra` JSON members appended (", ..." or ""). */
static int parse_with(const char *arch, int max_pos, const char *extra, mdl_config *c, char *err, size_t errlen)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"architectures\":[\"%s\"],\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,\"vocab_size\":512,"
             "\"max_position_embeddings\":%d%s}",
             arch, max_pos, extra);
    return mdl_config_parse(json, strlen(json), c, err, errlen);
}

static void expect_ok(const char *arch, int max_pos, const char *extra, mdl_config *c)
{
    char err[512] = "";
    if (parse_with(arch, max_pos, extra, c, err, sizeof err) != 0) fail_msg("%s: refused: %s", extra, err);
}

static void expect_refused(const char *arch, int max_pos, const char *extra, const char *msg)
{
    mdl_config c;
    char err[512] = "";
    if (parse_with(arch, max_pos, extra, &c, err, sizeof err) == 0) fail_msg("%s: accepted", extra);
    if (!strstr(err, msg)) fail_msg("%s: '%s' lacks '%s'", extra, err, msg);
}

#define Q3 "Qwen3ForCausalLM"

static void test_rope_default_linear_dynamic(void **state)
{
    (void)state;
    mdl_config c;
    double inv[8], ref[8];
    for (int i = 0; i < 8; i++) ref[i] = pow(10000.0, -(double)(2 * i) / 16.0);
    /* v4 and v5 layouts name the same theta */
    expect_ok(Q3, 4096, ",\"rope_theta\":10000", &c);
    mdl_rope_inv_freq(&c, inv);
    for (int i = 0; i < 8; i++) assert_true(fabs(inv[i] - ref[i]) <= 1e-15 * ref[i]);
    expect_ok(Q3, 4096, ",\"rope_parameters\":{\"rope_theta\":10000,\"rope_type\":\"default\"}", &c);
    assert_true(c.rope_theta == 10000.0);
    expect_ok(Q3, 4096, ",\"rope_theta\":10000,\"rope_parameters\":{\"rope_theta\":10000}", &c);
    assert_true(mdl_attn_softmax_scale(&c) == 1.0 / sqrt(16.0));
    /* linear: inv / factor, both layouts, "type" (older name) too */
    const char *lin[] = {",\"rope_theta\":10000,\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4.0}",
                         ",\"rope_theta\":10000,\"rope_scaling\":{\"type\":\"linear\",\"factor\":4.0}",
                         ",\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":4.0,\"rope_theta\":10000}"};
    for (int k = 0; k < 3; k++) {
        expect_ok(Q3, 4096, lin[k], &c);
        assert_int_equal(c.rope_type, MDL_ROPE_LINEAR);
        mdl_rope_inv_freq(&c, inv);
        for (int i = 0; i < 8; i++) assert_true(fabs(inv[i] - ref[i] / 4.0) <= 1e-15 * ref[i]);
    }
    /* dynamic: exactly default for every length up to max_position_embeddings */
    expect_ok(Q3, 4096, ",\"rope_theta\":10000,\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2.0}", &c);
    assert_int_equal(c.rope_type, MDL_ROPE_DYNAMIC);
    mdl_rope_inv_freq(&c, inv);
    for (int i = 0; i < 8; i++) assert_true(fabs(inv[i] - ref[i]) <= 1e-15 * ref[i]);
    expect_ok(Q3, 4096,
              ",\"rope_parameters\":{\"rope_type\":\"dynamic\",\"factor\":2.0,"
              "\"original_max_position_embeddings\":4096}",
              &c);
    expect_refused(Q3, 4096,
                   ",\"rope_parameters\":{\"rope_type\":\"dynamic\",\"factor\":2.0,"
                   "\"original_max_position_embeddings\":64}",
                   "rope_parameters.rope_type dynamic with original_max_position_embeddings 64");
    expect_refused(Q3, 4096, ",\"rope_scaling\":{\"rope_type\":\"dynamic\"}", "rope_scaling.factor is required");
    expect_refused(Q3, 4096, ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":0}", "rope_scaling.factor");
}

static void test_rope_llama3(void **state)
{
    (void)state;
    mdl_config c;
    double inv[64];
    char err[512];
    assert_int_equal(mdl_config_parse(llama31_8b, strlen(llama31_8b), &c, err, sizeof err), 0);
    mdl_rope_inv_freq(&c, inv);
    int hi = 0, lo = 0, mid = 0;
    for (int i = 0; i < 64; i++) {
        const double base = pow(500000.0, -(double)(2 * i) / 128.0), wl = 2 * M_PI / base;
        double want = base;
        if (wl > 8192.0) want = base / 8.0, lo++;
        else if (wl >= 2048.0) {
            const double s = (8192.0 / wl - 1.0) / 3.0;
            want = (1 - s) * base / 8.0 + s * base;
            mid++;
        } else hi++;
        if (fabs(inv[i] - want) > 1e-14 * want) fail_msg("inv[%d] = %.17g, want %.17g", i, inv[i], want);
    }
    assert_true(hi > 0 && mid > 0 && lo > 0); /* all three bands exercised */
    const char *v5 = ",\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000.0,\"factor\":8.0,"
                     "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":64}";
    expect_ok("LlamaForCausalLM", 4096, v5, &c);
    assert_int_equal(c.rope_type, MDL_ROPE_LLAMA3);
    assert_int_equal(c.rope_orig_max_pos, 64);
    expect_refused("LlamaForCausalLM", 4096,
                   ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"high_freq_factor\":4.0,"
                   "\"original_max_position_embeddings\":64}",
                   "rope_scaling.low_freq_factor is required");
    expect_refused("LlamaForCausalLM", 4096,
                   ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                   "\"high_freq_factor\":4.0}",
                   "rope_scaling.original_max_position_embeddings is required");
    expect_refused("LlamaForCausalLM", 4096,
                   ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":2.0,"
                   "\"high_freq_factor\":2.0,\"original_max_position_embeddings\":64}",
                   "high_freq_factor must differ");
}

static void test_rope_yarn(void **state)
{
    (void)state;
    mdl_config c;
    double inv[8];
    /* the Qwen3 long-context recipe, with max_position_embeddings = factor * original */
    expect_ok(Q3, 131072,
              ",\"rope_theta\":1000000,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
              "\"original_max_position_embeddings\":32768}",
              &c);
    assert_int_equal(c.rope_type, MDL_ROPE_YARN);
    assert_true(c.rope_factor == 4.0 && c.rope_orig_max_pos == 32768 && c.rope_truncate);
    assert_true(c.rope_beta_fast == 32.0 && c.rope_beta_slow == 1.0);
    assert_true(fabs(c.rope_attn_factor - (0.1 * log(4.0) + 1.0)) < 1e-15);
    assert_true(fabs(mdl_attn_softmax_scale(&c) - c.rope_attn_factor * c.rope_attn_factor / 4.0) < 1e-15);
    /* the blend, recomputed here: ramp between the correction dims of beta_fast and beta_slow */
    const char *y = ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":10000,\"factor\":8.0,"
                    "\"original_max_position_embeddings\":64,\"beta_fast\":8,\"beta_slow\":0.5%s}";
    char extra[512];
    for (int trunc = 0; trunc < 2; trunc++) {
        snprintf(extra, sizeof extra, y, trunc ? "" : ",\"truncate\":false");
        expect_ok(Q3, 512, extra, &c);
        assert_int_equal(c.rope_truncate, trunc);
        mdl_rope_inv_freq(&c, inv);
        double lo = 16 * log(64 / (8 * 2 * M_PI)) / (2 * log(10000.0));
        double hi = 16 * log(64 / (0.5 * 2 * M_PI)) / (2 * log(10000.0));
        if (trunc) lo = floor(lo), hi = ceil(hi);
        lo = fmax(lo, 0), hi = fmin(hi, 15);
        int blended = 0;
        for (int i = 0; i < 8; i++) {
            const double p = pow(10000.0, (double)(2 * i) / 16.0);
            const double r = fmin(fmax((i - lo) / (hi - lo), 0), 1);
            const double want = (1 / (8 * p)) * r + (1 / p) * (1 - r);
            blended += r > 0 && r < 1;
            if (fabs(inv[i] - want) > 1e-14 * want) fail_msg("trunc %d inv[%d] %.17g want %.17g", trunc, i, inv[i], want);
        }
        assert_true(blended > 0);
    }
    /* factor absent: max_position_embeddings / original */
    expect_ok(Q3, 512, ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"original_max_position_embeddings\":64}", &c);
    assert_true(c.rope_factor == 8.0);
    /* attention factor: explicit, or mscale / mscale_all_dim */
    expect_ok(Q3, 512,
              ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":8,\"original_max_position_embeddings\":64,"
              "\"attention_factor\":1.5}",
              &c);
    assert_true(c.rope_attn_factor == 1.5);
    assert_true(fabs(mdl_attn_softmax_scale(&c) - 2.25 / 4.0) < 1e-15);
    expect_ok(Q3, 512,
              ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":8,\"original_max_position_embeddings\":64,"
              "\"mscale\":0.707,\"mscale_all_dim\":1.0}",
              &c);
    assert_true(fabs(c.rope_attn_factor - (0.1 * 0.707 * log(8.0) + 1) / (0.1 * log(8.0) + 1)) < 1e-15);
    /* Qwen3's documented long-context recipe: the factor as given (transformers 5, vLLM), not
     * max_position_embeddings / original (transformers 4.5x) */
    expect_ok(Q3, 40960,
              ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768}",
              &c);
    assert_true(c.rope_factor == 4.0 && c.rope_orig_max_pos == 32768);
    assert_true(fabs(c.rope_attn_factor - (0.1 * log(4.0) + 1)) < 1e-15);
    expect_refused(Q3, 512,
                   ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":8,\"original_max_position_embeddings\":64,"
                   "\"truncate\":1}",
                   "rope_parameters.truncate must be true or false");
    expect_refused(Q3, 512,
                   ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":8,\"original_max_position_embeddings\":64,"
                   "\"beta_fast\":-2}",
                   "rope_parameters.beta_fast must be a number in [0,");
    expect_refused(Q3, 512,
                   ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":8,\"original_max_position_embeddings\":64,"
                   "\"attention_factor\":0}",
                   "the yarn attention factor 0 must be positive");
}

static void test_rope_refusals(void **state)
{
    (void)state;
    expect_refused(Q3, 4096, ",\"rope_scaling\":{\"rope_type\":\"longrope\",\"short_factor\":[1],\"long_factor\":[1]}",
                   "rope_scaling.rope_type \"longrope\" is not supported");
    expect_refused(Q3, 4096, ",\"rope_parameters\":{\"rope_type\":\"su\"}",
                   "rope_parameters.rope_type \"su\" is not supported");
    expect_refused(Q3, 4096, ",\"rope_scaling\":{\"factor\":2.0}", "rope_scaling.rope_type is required");
    expect_refused(Q3, 4096, ",\"rope_scaling\":{\"rope_type\":\"linear\",\"type\":\"yarn\",\"factor\":2}",
                   "rope_scaling.rope_type and rope_scaling.type differ");
    expect_refused(Q3, 4096, ",\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2.0,\"beta_fast\":3}",
                   "rope_parameters.beta_fast is not supported with rope_type linear");
    expect_refused(Q3, 4096, ",\"rope_parameters\":{\"rope_type\":\"default\",\"factor\":2.0}",
                   "rope_parameters.factor is not supported with rope_type default");
    expect_refused(Q3, 4096, ",\"rope_theta\":10000,\"rope_parameters\":{\"rope_theta\":20000}",
                   "rope_theta and rope_parameters.rope_theta differ");
    expect_refused(Q3, 4096,
                   ",\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2},"
                   "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":3}",
                   "rope_parameters and rope_scaling are both set and differ");
    expect_refused(Q3, 4096, ",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\"}}",
                   "rope_parameters.full_attention: per-layer-type RoPE parameters are not supported");
    expect_refused(Q3, 4096, ",\"rope_parameters\":[1]", "rope_parameters must be an object");
    expect_refused(Q3, 4096, ",\"rope_scaling\":\"yarn\"", "rope_scaling must be an object");
    expect_refused(Q3, 4096, ",\"partial_rotary_factor\":0.5", "partial_rotary_factor must be 1.0");
    expect_refused(Q3, 4096, ",\"rope_parameters\":{\"rope_type\":\"default\",\"partial_rotary_factor\":0.25}",
                   "rope_parameters.partial_rotary_factor must be 1.0");
    mdl_config c;
    expect_ok(Q3, 4096, ",\"partial_rotary_factor\":1.0,\"rope_scaling\":null,\"rope_parameters\":null", &c);
}

static void test_fields(void **state)
{
    (void)state;
    mdl_config c;
    /* dtype: transformers 5 "dtype", 4 "torch_dtype" */
    expect_ok(Q3, 4096, ",\"dtype\":\"float16\"", &c);
    assert_int_equal(c.dtype, MDL_DT_F16);
    expect_ok(Q3, 4096, ",\"dtype\":\"float32\",\"torch_dtype\":\"float32\"", &c);
    assert_int_equal(c.dtype, MDL_DT_F32);
    expect_refused(Q3, 4096, ",\"dtype\":\"float32\",\"torch_dtype\":\"bfloat16\"", "torch_dtype and dtype differ");
    expect_refused(Q3, 4096, ",\"dtype\":\"int8\"", "unsupported dtype int8");
    /* sliding windows: accepted when disabled, or when no sliding layer / window covers every length */
    expect_ok("Qwen2ForCausalLM", 32768, ",\"use_sliding_window\":false,\"sliding_window\":4096,\"max_window_layers\":0",
              &c);
    expect_ok("Qwen2ForCausalLM", 4096, ",\"use_sliding_window\":true,\"sliding_window\":4096,\"max_window_layers\":0",
              &c);
    expect_ok("Qwen2ForCausalLM", 32768, ",\"use_sliding_window\":true,\"sliding_window\":64,\"max_window_layers\":2",
              &c);
    expect_ok(Q3, 32768, ",\"use_sliding_window\":true,\"sliding_window\":null,\"max_window_layers\":0", &c);
    expect_refused("Qwen2ForCausalLM", 32768,
                   ",\"use_sliding_window\":true,\"sliding_window\":4096,\"max_window_layers\":1",
                   "use_sliding_window=true with sliding_window 4096 below max_position_embeddings 32768 on 1 layer");
    expect_refused(Q3, 8192, ",\"use_sliding_window\":true,\"max_window_layers\":0",
                   "sliding_window 4096 below max_position_embeddings 8192"); /* class default 4096 */
    expect_refused(Q3, 8192,
                   ",\"use_sliding_window\":true,\"sliding_window\":64,"
                   "\"layer_types\":[\"full_attention\",\"sliding_attention\"]",
                   "sliding_window 64 below max_position_embeddings 8192 on 1 layer");
    expect_ok(Q3, 8192, ",\"use_sliding_window\":false,\"layer_types\":[\"full_attention\",\"sliding_attention\"]",
              &c);
    expect_refused(Q3, 8192, ",\"layer_types\":[\"full_attention\",\"chunked_attention\"]",
                   "layer_types[1] \"chunked_attention\" is not supported");
    expect_refused(Q3, 8192, ",\"layer_types\":[\"full_attention\"]", "layer_types must be a list of num_hidden_layers");
    expect_refused(Q3, 8192, ",\"sliding_window\":-1", "sliding_window must be");
    expect_refused(Q3, 8192, ",\"use_sliding_window\":1", "use_sliding_window must be true or false");
    /* Llama ignores sliding fields (LlamaForCausalLM has no sliding attention) */
    expect_ok("LlamaForCausalLM", 8192, ",\"use_sliding_window\":true,\"sliding_window\":64,\"max_window_layers\":0",
              &c);
    /* biases */
    expect_refused("LlamaForCausalLM", 4096, ",\"mlp_bias\":true", "mlp_bias=true is not supported");
    expect_ok("LlamaForCausalLM", 4096, ",\"mlp_bias\":false,\"attention_bias\":true", &c);
    assert_true(c.qkv_bias && c.o_bias);
    expect_ok(Q3, 4096, ",\"attention_bias\":true", &c);
    assert_true(c.qkv_bias && c.o_bias && c.qk_norm);
    expect_ok("Qwen2ForCausalLM", 4096, "", &c);
    assert_true(c.qkv_bias && !c.o_bias);
    /* head_dim read, not derived, when given */
    expect_ok(Q3, 4096, "", &c);
    assert_int_equal(c.head_dim, 16);
    expect_ok(Q3, 4096, ",\"tie_word_embeddings\":true,\"eos_token_id\":[3,4,5]", &c);
    assert_true(c.tie);
    assert_int_equal(c.n_eos, 3);
}

/* Qwen3-30B-A3B's published config.json (Qwen/Qwen3-30B-A3B, transformers 4.51 writes num_experts). */
static const char qwen3_30b_a3b[] =
    "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"decoder_sparse_step\":1,\"eos_token_id\":151645,\"head_dim\":128,"
    "\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":6144,"
    "\"max_position_embeddings\":40960,\"max_window_layers\":48,\"mlp_only_layers\":[],"
    "\"model_type\":\"qwen3_moe\",\"moe_intermediate_size\":768,\"norm_topk_prob\":true,"
    "\"num_attention_heads\":32,\"num_experts\":128,\"num_experts_per_tok\":8,\"num_hidden_layers\":48,"
    "\"num_key_value_heads\":4,\"output_router_logits\":false,\"rms_norm_eps\":1e-06,\"rope_scaling\":null,"
    "\"rope_theta\":1000000.0,\"router_aux_loss_coef\":0.001,\"sliding_window\":null,"
    "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.51.0\","
    "\"use_cache\":true,\"use_sliding_window\":false,\"vocab_size\":151936}";

#define QM "Qwen3MoeForCausalLM"

static void test_qwen3_moe(void **state)
{
    (void)state;
    mdl_config c;
    char err[256];
    if (mdl_config_parse(qwen3_30b_a3b, strlen(qwen3_30b_a3b), &c, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(c.arch, MDL_ARCH_QWEN3_MOE);
    assert_int_equal(c.n_experts, 128);
    assert_int_equal(c.experts_per_tok, 8);
    assert_int_equal(c.moe_inter, 768);
    assert_true(c.norm_topk);
    assert_int_equal(c.n_sparse, 48);
    assert_true(c.qk_norm);
    assert_false(c.tie);
    /* transformers' defaults (Qwen3MoeConfig): 128 experts, top-8, 768, norm_topk_prob false, step 1 */
    expect_ok(QM, 64, "", &c);
    assert_int_equal(c.n_experts, 128);
    assert_int_equal(c.experts_per_tok, 8);
    assert_int_equal(c.moe_inter, 768);
    assert_false(c.norm_topk);
    assert_int_equal(c.n_sparse, 2);
    /* transformers 5 saves num_local_experts (its attribute_map) */
    expect_ok(QM, 64, ",\"num_local_experts\":16,\"num_experts_per_tok\":4", &c);
    assert_int_equal(c.n_experts, 16);
    expect_ok(QM, 64, ",\"num_local_experts\":16,\"num_experts\":16,\"num_experts_per_tok\":2", &c);
    assert_int_equal(c.n_experts, 16);
    expect_refused(QM, 64, ",\"num_local_experts\":16,\"num_experts\":8", "disagree");
    /* sparse iff not in mlp_only_layers, num_experts > 0 and (l + 1) % step == 0 */
    expect_ok(QM, 64, ",\"decoder_sparse_step\":2", &c);
    assert_int_equal(c.n_sparse, 1);
    assert_false(c.sparse[0]);
    assert_true(c.sparse[1]);
    expect_ok(QM, 64, ",\"mlp_only_layers\":[0]", &c);
    assert_false(c.sparse[0]);
    assert_true(c.sparse[1]);
    expect_ok(QM, 64, ",\"mlp_only_layers\":[7,-1]", &c); /* no such layer: changes nothing */
    assert_int_equal(c.n_sparse, 2);
    expect_ok(QM, 64, ",\"num_experts\":0", &c);
    assert_int_equal(c.n_sparse, 0);
    /* the config of a dense Qwen3 never has experts, whatever it carries */
    expect_ok(Q3 "", 64, ",\"num_experts\":8", &c);
    assert_int_equal(c.n_sparse, 0);
    expect_refused(QM, 64, ",\"num_experts\":4,\"num_experts_per_tok\":5", "num_experts_per_tok 5 is more");
    expect_refused(QM, 64, ",\"num_experts_per_tok\":0", "num_experts_per_tok");
    expect_refused(QM, 64, ",\"moe_intermediate_size\":0", "moe_intermediate_size");
    expect_refused(QM, 64, ",\"decoder_sparse_step\":0", "decoder_sparse_step");
    expect_refused(QM, 64, ",\"mlp_only_layers\":[0.5]", "mlp_only_layers");
    expect_refused(QM, 64, ",\"mlp_only_layers\":3", "mlp_only_layers");
    expect_refused(QM, 64, ",\"norm_topk_prob\":1", "norm_topk_prob");
    expect_refused(QM, 64, ",\"num_experts\":100000", "num_experts");
}

static void test_generation_config(void **state)
{
    (void)state;
    mdl_config c;
    char err[512];
    assert_int_equal(mdl_config_parse(qwen3_06b, strlen(qwen3_06b), &c, err, sizeof err), 0);
    /* Qwen3-0.6B's published generation_config.json */
    const char *g = "{\"bos_token_id\":151643,\"do_sample\":true,\"eos_token_id\":[151645,151643],"
                    "\"pad_token_id\":151643,\"temperature\":0.6,\"top_k\":20,\"top_p\":0.95,"
                    "\"transformers_version\":\"4.51.0\"}";
    if (mdl_gen_config_parse(g, strlen(g), &c, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(c.n_eos, 2); /* 151645 (config.json) + 151643, no duplicate */
    assert_int_equal(c.eos[0], 151645);
    assert_int_equal(c.eos[1], 151643);
    assert_int_equal(c.gen.set, MDL_GEN_TEMPERATURE | MDL_GEN_TOP_K | MDL_GEN_TOP_P);
    assert_true(c.gen.temperature == 0.6f && c.gen.top_p == 0.95f);
    assert_int_equal(c.gen.top_k, 20);
    /* GenerationConfig defaults do not count (vLLM reads the diff): top_k 50, temperature 1, top_p 1 */
    assert_int_equal(mdl_config_parse(qwen3_06b, strlen(qwen3_06b), &c, err, sizeof err), 0);
    g = "{\"eos_token_id\":151645,\"temperature\":1.0,\"top_k\":50,\"top_p\":1.0,\"repetition_penalty\":1.0,"
        "\"min_p\":0.05,\"max_new_tokens\":128}";
    assert_int_equal(mdl_gen_config_parse(g, strlen(g), &c, err, sizeof err), 0);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.gen.set, MDL_GEN_MIN_P | MDL_GEN_MAX_NEW_TOKENS);
    assert_int_equal(c.gen.max_new_tokens, 128);
    /* Qwen2.5-Instruct's repetition_penalty is recorded (serve applies it as a request default) */
    g = "{\"repetition_penalty\":1.05,\"temperature\":0.7,\"top_p\":0.8,\"top_k\":20}";
    assert_int_equal(mdl_gen_config_parse(g, strlen(g), &c, err, sizeof err), 0);
    assert_true(c.gen.set & MDL_GEN_REPETITION_PENALTY);
    assert_true(c.gen.repetition_penalty == 1.05);
    const struct {
        const char *json, *expect;
    } bad[] = {
        {"{\"eos_token_id\":[1,200000]}", "generation_config.json: field eos_token_id"},
        {"{\"eos_token_id\":\"x\"}", "generation_config.json: field eos_token_id"},
        {"{\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", "more than 8 eos ids"},
        {"{\"temperature\":-1}", "generation_config.json: field temperature"},
        {"{\"top_p\":0}", "generation_config.json: field top_p"},
        {"{\"top_k\":2.5}", "generation_config.json: field top_k"},
        {"{\"max_new_tokens\":0}", "generation_config.json: field max_new_tokens"},
        {"[1]", "generation_config.json: not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(mdl_config_parse(qwen3_06b, strlen(qwen3_06b), &c, err, sizeof err), 0);
        err[0] = 0;
        assert_int_equal(mdl_gen_config_parse(bad[i].json, strlen(bad[i].json), &c, err, sizeof err), -1);
        if (!strstr(err, bad[i].expect)) fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i].expect);
    }
}

/* quantization_config: Qwen3-8B-FP8's (weight_block_size [128, 128], lm_head not converted) accepted;
 * modules_to_not_convert by module and by prefix; every scheme graphswap does not run refused by name. */
static void test_fp8(void **state)
{
    (void)state;
#define QBASE "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"   \
              "\"num_hidden_layers\":3,\"num_attention_heads\":4,\"vocab_size\":9,\"quantization_config\":"
    static const char ok[] = QBASE "{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\",\"quant_method\":\"fp8\","
                                   "\"weight_block_size\":[128,128],\"modules_to_not_convert\":[\"lm_head\","
                                   "\"model.layers.1.mlp.down_proj\",\"model.layers.2\"]}}";
    mdl_config c;
    char err[256] = "";
    if (mdl_config_parse(ok, strlen(ok), &c, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(c.fp8, 1);
    assert_int_equal(c.fp8_b0, 128);
    assert_int_equal(c.fp8_b1, 128);
    assert_int_equal(c.fp8_skip[0], 0);
    assert_int_equal(c.fp8_skip[1], MDL_FP8_SKIP_DOWN);
    assert_int_equal(c.fp8_skip[2], MDL_FP8_SKIP_QKV | MDL_FP8_SKIP_O | MDL_FP8_SKIP_GATE_UP | MDL_FP8_SKIP_DOWN);
    assert_int_equal(mdl_config_parse(qwen3_06b, strlen(qwen3_06b), &c, err, sizeof err), 0);
    assert_int_equal(c.fp8, 0);
    const refusal bad[] = {
        {QBASE "{\"quant_method\":\"awq\",\"bits\":4}}", "quant_method \"awq\" is not supported"},
        {QBASE "{\"quant_method\":\"compressed-tensors\"}}", "config_groups"},
        {QBASE "{\"quant_method\":\"fp8\"}}", "weight_block_size"},
        {QBASE "{\"quant_method\":\"fp8\",\"weight_block_size\":[128,100]}}", "power of two"},
        {QBASE "{\"quant_method\":\"fp8\",\"weight_block_size\":[0,128]}}", "weight_block_size"},
        {QBASE "{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\",\"weight_block_size\":[128,128]}}", "fmt"},
        {QBASE "{\"quant_method\":\"fp8\",\"activation_scheme\":\"static\",\"weight_block_size\":[128,128]}}",
         "activation_scheme"},
        {QBASE "{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128],\"ignored_layers\":"
               "[\"model.layers.0.self_attn.k_proj\"]}}",
         "layer 0's q_proj / k_proj / v_proj"},
        {QBASE "{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128],\"modules_to_not_convert\":"
               "[\"model.layers.1.mlp.up_proj\"]}}",
         "gate_proj / up_proj"},
        {QBASE "7}", "quantization_config"},
    };
#undef QBASE
    expect_refusals(bad, sizeof bad / sizeof bad[0], 0);
}

/* compressed-tensors FP8 as llm-compressor writes it (FP8_DYNAMIC: channel; FP8: tensor; FP8_BLOCK:
 * block), targets by class and by "re:" pattern (re.match: anchored at the start), ignore winning;
 * every variant graphswap does not run refused naming the field. */
static void test_fp8_compressed_tensors(void **state)
{
    (void)state;
#define CBASE "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":200,"   \
              "\"num_hidden_layers\":3,\"num_attention_heads\":4,\"head_dim\":16,\"vocab_size\":9,"              \
              "\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\","
#define W8(strategy) "\"weights\":{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"" strategy "\",\"symmetric\":true," \
                     "\"dynamic\":false,\"group_size\":null"
#define DYN "\"input_activations\":{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"token\",\"dynamic\":true}"
    mdl_config c;
    char err[256] = "";
    static const char channel[] = CBASE "\"config_groups\":{\"group_0\":{\"targets\":[\"Linear\"]," W8("channel") "},"
                                        DYN ",\"output_activations\":null}},\"ignore\":[\"lm_head\","
                                        "\"re:.*layers\\\\.2\\\\..*\",\"model.layers.1.mlp.down_proj\"],"
                                        "\"kv_cache_scheme\":null,\"quantization_status\":\"compressed\"}}";
    if (mdl_config_parse(channel, strlen(channel), &c, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(c.fp8, 1);
    assert_int_equal(c.fp8_ct, 1);
    assert_int_equal(c.fp8_scheme, MDL_FP8_CHANNEL);
    assert_int_equal(c.fp8_b0, 1);
    assert_int_equal(c.fp8_b1, 256); /* one column block wider than the widest projection (200) */
    assert_int_equal(c.fp8_skip[0], 0);
    assert_int_equal(c.fp8_skip[1], MDL_FP8_SKIP_DOWN);
    assert_int_equal(c.fp8_skip[2], MDL_FP8_SKIP_QKV | MDL_FP8_SKIP_O | MDL_FP8_SKIP_GATE_UP | MDL_FP8_SKIP_DOWN);
    /* regex targets, weight-only (no input_activations), tensor strategy; "re:" matches from the
     * start only: "mlp" alone matches nothing */
    static const char tensor[] = CBASE "\"config_groups\":{\"g\":{\"targets\":[\"re:.*self_attn\\\\.[qkvo]_proj$\","
                                       "\"re:mlp\"]," W8("tensor") "},\"input_activations\":null}}}}";
    if (mdl_config_parse(tensor, strlen(tensor), &c, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(c.fp8_scheme, MDL_FP8_TENSOR);
    for (int l = 0; l < 3; l++) assert_int_equal(c.fp8_skip[l], MDL_FP8_SKIP_GATE_UP | MDL_FP8_SKIP_DOWN);
    static const char block[] = CBASE "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"]," W8("block")
                                      ",\"block_structure\":[16,32]}," DYN "}},\"ignore\":[\"lm_head\"]}}";
    if (mdl_config_parse(block, strlen(block), &c, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(c.fp8_scheme, MDL_FP8_BLOCK);
    assert_int_equal(c.fp8_b0, 16);
    assert_int_equal(c.fp8_b1, 32);
    const refusal bad[] = {
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"]," W8("channel") "}}},\"ignore\":[]}}",
         "quantizes lm_head"},
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"]," W8("group") "}}},\"ignore\":[\"lm_head\"]}}",
         "strategy group is not supported"},
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"int\","
               "\"strategy\":\"group\"}}},\"ignore\":[\"lm_head\"]}}",
         "num_bits 8"},
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"]," W8("tensor") "},\"input_activations\":"
               "{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"tensor\",\"dynamic\":false}}},\"ignore\":[\"lm_head\"]}}",
         "input_activations must be dynamic"},
        {CBASE "\"config_groups\":{\"a\":{\"targets\":[\"re:.*self_attn.*\"]," W8("tensor") "}},\"b\":{\"targets\":"
               "[\"re:.*mlp.*\"]," W8("channel") "}}},\"ignore\":[\"lm_head\"]}}",
         "mix weight strategies"},
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"]," W8("block") ",\"block_structure\":[16,24]}}},"
               "\"ignore\":[\"lm_head\"]}}",
         "block_structure"},
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"]," W8("channel") "}}},\"ignore\":[\"lm_head\"],"
               "\"kv_cache_scheme\":{\"num_bits\":8}}}",
         "kv_cache_scheme"},
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"]," W8("channel") "}}},\"ignore\":[\"lm_head\"],"
               "\"quantization_status\":\"frozen\"}}",
         "quantization_status"},
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"re:(unclosed\"]," W8("channel") "}}}}}",
         "not a regular expression"},
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"re:.*k_proj$\"]," W8("channel") "}}}}}",
         "q_proj / k_proj / v_proj"},
        {CBASE "\"config_groups\":{\"g\":{\"format\":\"int-quantized\",\"targets\":[\"Linear\"]," W8("channel")
               "}}},\"ignore\":[\"lm_head\"]}}",
         "format \"int-quantized\""},
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"]," W8("channel") "}},\"output_activations\":"
               "{\"num_bits\":8}}},\"ignore\":[\"lm_head\"]}}",
         "output_activations"},
        /* catastrophic backtracking is cut by the match limit, not run for ever */
        {CBASE "\"config_groups\":{\"g\":{\"targets\":[\"re:(.*)*(.*)*(.*)*(.*)*(.*)*_$\"]," W8("channel")
               "}}},\"ignore\":[\"lm_head\"]}}",
         "too complex"},
    };
#undef CBASE
#undef W8
#undef DYN
    expect_refusals(bad, sizeof bad / sizeof bad[0], 0);
}

/* FP8 Qwen3-MoE: Qwen3-30B-A3B-FP8's quantization_config (128 x 128 blocks: the routers never FP8),
 * and compressed-tensors over the same model: the routers must be ignored, and every expert part of a
 * layer is FP8 or none is. */
static void test_fp8_moe(void **state)
{
    (void)state;
    static const char *const qc[] = {
        "{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\",\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]}",
        "{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\",\"config_groups\":{\"g\":{\"targets\":"
        "[\"Linear\"],\"weights\":{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"channel\"}}},\"ignore\":"
        "[\"lm_head\",\"re:.*mlp\\\\.gate$\"]}",
        "{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\",\"config_groups\":{\"g\":{\"targets\":"
        "[\"Linear\"],\"weights\":{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"channel\"}}},\"ignore\":[\"lm_head\"]}",
        "{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\",\"config_groups\":{\"g\":{\"targets\":"
        "[\"Linear\"],\"weights\":{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"channel\"}}},\"ignore\":"
        "[\"lm_head\",\"re:.*mlp\\\\.gate$\",\"model.layers.7.mlp.experts.5.down_proj\"]}",
    };
    static const char *const expect[] = {NULL, NULL, "router model.layers.0.mlp.gate", "layer 7's experts"};
    char json[4096], err[256];
    const size_t n = strlen(qwen3_30b_a3b) - 1; /* without the closing brace */
    for (int i = 0; i < 4; i++) {
        snprintf(json, sizeof json, "%.*s,\"quantization_config\":%s}", (int)n, qwen3_30b_a3b, qc[i]);
        mdl_config c;
        err[0] = 0;
        const int rc = mdl_config_parse(json, strlen(json), &c, err, sizeof err);
        if (!expect[i]) {
            if (rc != 0) fail_msg("case %d: %s", i, err);
            assert_int_equal(c.fp8, 1);
            for (int l = 0; l < c.layers; l++) assert_int_equal(c.fp8_skip[l], 0);
        } else if (rc != -1 || !strstr(err, expect[i])) {
            fail_msg("case %d: rc %d, '%s' lacks '%s'", i, rc, err, expect[i]);
        }
    }
}

/* FP8 drafters: the layers and fc follow the scheme (module names without "model."); every layer's
 * q / k / v alike (the stacked context K/V has one dtype); compressed-tensors must leave the DSpark
 * heads unquantized, as lm_head. */
static void test_fp8_drafter(void **state)
{
    (void)state;
#define CT(ignore) "\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\"," \
                   "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":8,\"type\":"    \
                   "\"float\",\"strategy\":\"channel\"}}},\"ignore\":[" ignore "]}}"
#define DSPARK_HEADS DSPARK_HEAD "\"target_layer_ids\":[0,3],\"enable_confidence_head\":true,\"markov_rank\":16,"
    mdl_config d;
    char err[512] = "";
    const char *dflash = "{\"architectures\":[\"DFlashDraftModel\"],\"num_hidden_layers\":2,\"num_target_layers\":4,"
                         "\"block_size\":16," TGT_GEO ",\"dflash_config\":{\"mask_token_id\":299,\"target_layer_ids\":"
                         "[0,3]},\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[16,32],"
                         "\"modules_to_not_convert\":[\"layers.1.mlp\"]}}";
    if (parse_pair(dflash, &d, err, sizeof err) != 0) fail_msg("FP8 DFlash refused: %s", err);
    assert_true(d.fp8 && d.fp8_fc);
    assert_int_equal(d.fp8_skip[0], 0);
    assert_int_equal(d.fp8_skip[1], MDL_FP8_SKIP_GATE_UP | MDL_FP8_SKIP_DOWN);
    const char *heads_ignored = DSPARK_HEADS CT("\"lm_head\",\"fc\",\"re:^(markov_head|confidence_head)\\\\.\"");
    if (parse_pair(heads_ignored, &d, err, sizeof err) != 0) fail_msg("FP8 DSpark refused: %s", err);
    assert_true(d.fp8 && d.fp8_ct && !d.fp8_fc);
    assert_int_equal(d.fp8_b0, 1);
    assert_int_equal(d.fp8_b1, 128); /* the widest projection is fc's 2 x 64 */
    const refusal bad[] = {
        {DSPARK_HEADS CT("\"lm_head\",\"confidence_head.proj\""), "quantizes markov_head.markov_w1"},
        {DSPARK_HEADS CT("\"lm_head\",\"re:^markov_head\\\\.\""), "quantizes confidence_head.proj"},
        {DSPARK_HEADS CT("\"lm_head\",\"re:^markov_head\\\\.\",\"confidence_head.proj\",\"layers.1.self_attn.q_proj\","
                         "\"layers.1.self_attn.k_proj\",\"layers.1.self_attn.v_proj\""),
         "q / k / v of only some drafter layers"},
    };
#undef CT
#undef DSPARK_HEADS
    expect_refusals(bad, sizeof bad / sizeof bad[0], 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_drafter),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama_qwen2),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_drafter_formats),
        cmocka_unit_test(test_real_configs),
        cmocka_unit_test(test_rope_default_linear_dynamic),
        cmocka_unit_test(test_rope_llama3),
        cmocka_unit_test(test_rope_yarn),
        cmocka_unit_test(test_rope_refusals),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_generation_config),
        cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_fp8_compressed_tensors),
        cmocka_unit_test(test_fp8_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
