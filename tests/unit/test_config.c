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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama_qwen2),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
