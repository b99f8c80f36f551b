/* models/config.h — config.json of a Hugging Face causal LM, parsed and checked.
 * Supported: Qwen3ForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM with SiLU MLP, plain RoPE
 * (rope_scaling null), full attention. Anything else is a clear error naming the field. */
#ifndef GS_MDL_CONFIG_H
#define GS_MDL_CONFIG_H

#include <stddef.h>

#include "models/safetensors.h"

typedef enum { MDL_ARCH_QWEN3 = 0, MDL_ARCH_LLAMA, MDL_ARCH_QWEN2, MDL_ARCH_DFLASH, MDL_ARCH_DSPARK } mdl_arch;

#define MDL_MAX_TARGET_IDS 64

#define MDL_MAX_EOS 8

typedef struct {
    mdl_arch arch;
    int hidden, intermediate, layers, heads, kv_heads, head_dim, vocab;
    double rms_eps, rope_theta;
    int max_pos;
    int tie;
    int bos;                 /* -1 when absent */
    int eos[MDL_MAX_EOS];    /* eos_token_id may be an int or a list */
    int n_eos;
    mdl_dtype dtype;         /* torch_dtype: BF16, F16 or F32 */
    int qk_norm;             /* qwen3 */
    int qkv_bias;            /* qwen2, llama attention_bias */
    int o_bias;              /* llama attention_bias */
    /* drafters (DFlash, DSpark): see tests/reference/SPEC-NOTES.md */
    int is_drafter;
    int block_size;          /* drafter block rows B (DFlash: B-1 drafts; DSpark: B drafts) */
    int n_target_layers;     /* layers of the target it was trained on */
    int target_ids[MDL_MAX_TARGET_IDS]; /* target hidden states feeding the context: -1 embedding
                                           output, j residual after layer j, L-1 final-normed */
    int n_target_ids;
    int mask_token_id;
    int markov_rank;         /* DSpark vanilla Markov head rank (0: none) */
    int conf_head;           /* DSpark confidence head */
    int conf_with_markov;    /* its input is [h ; w1[prev]] rather than h */
    int own_embed;           /* DSpark: own embed_tokens + lm_head (DFlash uses the target's) */
    int test_hook_reallocates; /* TEST ONLY ("graphswap_test_hook_reallocates": true): the drafter's
                                  post-load hook reallocates a derived buffer, the bug class the
                                  update guard (I5) must catch */
} mdl_config;

const char *mdl_arch_name(mdl_arch a); /* the HF architectures[] string */

/* A drafter must fit its target: same hidden size and vocabulary, num_target_layers = the target's
 * layers, target layer ids in {-1} U [0, L-1] (-1: embedding output; L-1: the final-normed state,
 * as Hugging Face output_hidden_states), strictly increasing. */
int mdl_config_check_drafter(const mdl_config *target, const mdl_config *draft, char *err, size_t errlen);

/* Parses config.json text. Returns 0, or -1 with err naming the field and the reason. */
int mdl_config_parse(const char *json, size_t len, mdl_config *out, char *err, size_t errlen);
/* Reads dir/config.json. */
int mdl_config_load(const char *dir, mdl_config *out, char *err, size_t errlen);

/* Reads a whole file into a NUL-terminated malloc'd buffer (max_bytes bound). NULL + err on failure. */
char *mdl_read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

#endif
