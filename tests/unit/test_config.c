/* tests/unit/test_config.c — config.json parsing: real-world shapes accepted, unsupported values
 * refused with a message naming the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
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
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"rope_scaling\":{\"type\":\"yarn\"}}",
         "rope_scaling"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"hidden_act\":\"gelu\"}",
         "hidden_act"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"torch_dtype\":\"int8\"}",
         "torch_dtype"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,\"use_sliding_window\":true}",
         "use_sliding_window"},
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

    struct {
        const char *json, *expect;
    } bad[] = {
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
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        assert_int_equal(parse_pair(bad[i].json, &d, err, sizeof err), -1);
        if (!strstr(err, bad[i].expect)) fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i].expect);
    }
    /* the pairing check against a target reports the same message as the drafter's own config */
    mdl_config t;
    assert_int_equal(mdl_config_parse(tgt4, strlen(tgt4), &t, err, sizeof err), 0);
    assert_int_equal(mdl_config_parse(full, strlen(full), &d, err, sizeof err), 0);
    d.target_ids[2] = 4;
    assert_int_equal(mdl_config_check_drafter(&t, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "drafter: target_layer_ids[2] = 4: ids must be strictly increasing, each -1 (the "
                                "embedding output) or a target layer in [0, 3]"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama_qwen2),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_drafter_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
