/* models/config.h — config.json of a Hugging Face causal LM, parsed and checked.
 * Supported: Qwen3ForCausalLM, Qwen3MoeForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM with SiLU
 * MLPs, full attention,
 * RoPE default / linear / dynamic / llama3 / yarn in both the transformers 4 layout (rope_theta +
 * rope_scaling) and the transformers 5 one (rope_parameters) — see models/config_rope.c and the
 * README's "Supported config fields". Anything else is a clear error naming the field. */
#ifndef GS_MDL_CONFIG_H
#define GS_MDL_CONFIG_H

#include <stddef.h>

#include "models/format/safetensors.h"

typedef enum {
    MDL_ARCH_QWEN3 = 0,
    MDL_ARCH_LLAMA,
    MDL_ARCH_QWEN2,
    MDL_ARCH_DFLASH,
    MDL_ARCH_DSPARK,
    MDL_ARCH_QWEN3_MOE, /* Qwen3MoeForCausalLM: Qwen3 with sparse MoE MLPs (models/model.c, forward.c) */
    MDL_ARCH_COUNT
} mdl_arch;

#define MDL_MAX_LAYERS 1024

#define MDL_MAX_TARGET_IDS 64

#define MDL_MAX_EOS 8

/* mdl_config.fp8_skip bits: the projections of a layer kept unquantized */
enum { MDL_FP8_SKIP_QKV = 1, MDL_FP8_SKIP_O = 2, MDL_FP8_SKIP_GATE_UP = 4, MDL_FP8_SKIP_DOWN = 8 };
/* mdl_config.fp8_scheme: what one scale of a projection covers */
enum { MDL_FP8_BLOCK = 0, MDL_FP8_CHANNEL = 1, MDL_FP8_TENSOR = 2 };

enum {
    MDL_GEN_TEMPERATURE = 1,
    MDL_GEN_TOP_P = 2,
    MDL_GEN_TOP_K = 4,
    MDL_GEN_MIN_P = 8,
    MDL_GEN_REPETITION_PENALTY = 16,
    MDL_GEN_MAX_NEW_TOKENS = 32
};

/* RoPE frequency schemes (transformers' rope_type), models/config_rope.c */
typedef enum { MDL_ROPE_DEFAULT = 0, MDL_ROPE_LINEAR, MDL_ROPE_DYNAMIC, MDL_ROPE_LLAMA3, MDL_ROPE_YARN } mdl_rope_type;

/* generation_config.json sampling defaults, as vLLM's --generation-config auto reads them: a field
 * counts when present and unlike transformers' GenerationConfig default (temperature 1, top_p 1,
 * top_k 50, min_p none, repetition_penalty 1, max_new_tokens none). */
typedef struct {
    unsigned set; /* MDL_GEN_* bits */
    float temperature, top_p, min_p;
    int top_k;    /* 0: off */
    int max_new_tokens;
    double repetition_penalty;
} mdl_gen_defaults;

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
    /* RoPE beyond rope_theta (models/config_rope.c); defaults mean plain RoPE */
    mdl_rope_type rope_type;
    double rope_factor;                  /* linear, dynamic, llama3, yarn */
    double rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int rope_orig_max_pos;               /* llama3, yarn: original_max_position_embeddings */
    double rope_beta_fast, rope_beta_slow; /* yarn */
    int rope_truncate;                   /* yarn: floor/ceil the correction range */
    double rope_attn_factor;             /* yarn: multiplies cos and sin; 1 otherwise */
    mdl_gen_defaults gen;    /* generation_config.json sampling defaults */
    /* Qwen3-MoE (0 / empty otherwise): layer l is sparse iff sparse[l] (not in mlp_only_layers,
     * num_experts > 0 and (l + 1) % decoder_sparse_step == 0); a dense layer's MLP is intermediate */
    int n_experts, experts_per_tok, moe_inter, norm_topk;
    int n_sparse;                   /* layers with sparse[l] */
    unsigned char sparse[MDL_MAX_LAYERS];
    /* Block-FP8 checkpoints (quantization_config quant_method "fp8", fmt "e4m3", activation_scheme
     * "dynamic", weight_block_size [fp8_b0, fp8_b1]: Qwen3-FP8, DeepSeek-V3): every projection
     * (q/k/v, o, gate/up, down) stores X.weight as float8_e4m3fn and X.weight_scale_inv as f32 block
     * scales, except the modules named in modules_to_not_convert / ignored_layers:
     * fp8_skip[l] bits MDL_FP8_SKIP_* (embeddings, lm_head, norms and routers are never FP8) */
    int fp8, fp8_b0, fp8_b1;
    /* compressed-tensors FP8 (quant_method "compressed-tensors", format "float-quantized",
     * llm-compressor's FP8 / FP8_DYNAMIC / FP8_BLOCK schemes): the scales are X.weight_scale, in the
     * checkpoint's dtype, one per block (strategy "block"), per output row ("channel": [rows, 1]) or
     * per tensor ("tensor": [1], one value per fused shard). Channel and tensor scales are stored as
     * a block table of fp8_b0 = 1 row and fp8_b1 >= every projection's width (one column): a tensor
     * scale is that shard's value in each of its rows, so no shard waits for another and nothing
     * is requantized. */
    int fp8_ct;     /* the scales are named X.weight_scale (else X.weight_scale_inv) */
    int fp8_scheme; /* MDL_FP8_BLOCK, MDL_FP8_CHANNEL or MDL_FP8_TENSOR */
    int fp8_online; /* serve --quantization fp8 on a bf16 / f16 / f32 checkpoint: each arriving
                       projection is quantized block by block into its FP8 storage (no scale tensors
                       in the checkpoint; mdl_fp8_quantize) */
    int fp8_lm_head; /* online only (serve --quantize-lm-head): an untied target's lm_head is block FP8
                        too, so a decode step reads one byte per weight of every matrix (as llama.cpp's
                        Q8_0 does). No checkpoint format stores an FP8 lm_head (Qwen3-FP8 and
                        DeepSeek-V3 keep it bf16), so only online quantization makes one. */
    unsigned char fp8_skip[MDL_MAX_LAYERS];
    int fp8_fc; /* drafters: fc (the target-features projection) is FP8 too. A drafter's layers are
                   all FP8 or none in q/k/v, whose k / v rows the stacked context K/V copies. */
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
    int test_skip_hook;      /* TEST ONLY ("graphswap_test_skip_hook": true): the drafter's post-load
                                hook does not refill its derived buffers after an update (stale
                                context K/V weights), the bug whose acceptance drop the RL-loop
                                negative control must measure */
    int test_accept_drafts;  /* TEST ONLY ("graphswap_test_accept_drafts": true): a speculative step
                                accepts every draft whatever the target says, so speculative output
                                differs from plain decoding: the bug graphswap eval's losslessness
                                check must catch (its negative control) */
} mdl_config;

const char *mdl_arch_name(mdl_arch a); /* the HF architectures[] string */

/* A drafter must fit its target: same hidden size and vocabulary, num_target_layers = the target's
 * layers, target layer ids in {-1} U [0, L-1] (-1: embedding output; L-1: the final-normed state,
 * as Hugging Face output_hidden_states), strictly increasing. */
int mdl_config_check_drafter(const mdl_config *target, const mdl_config *draft, char *err, size_t errlen);

/* RoPE inverse frequencies inv[0 .. head_dim/2) of the config's rope type, in double (the table
 * the qk_norm_rope op reads is these rounded to f32). */
void mdl_rope_inv_freq(const mdl_config *c, double *inv);
/* The attention op's softmax scale: head_dim^-0.5, times rope_attn_factor^2 (yarn scales cos and
 * sin by the factor, so q.k by its square). */
double mdl_attn_softmax_scale(const mdl_config *c);

/* Parses config.json text. Returns 0, or -1 with err naming the field and the reason. */
int mdl_config_parse(const char *json, size_t len, mdl_config *out, char *err, size_t errlen);
/* Merges generation_config.json text into c (after mdl_config_parse): its eos_token_id (an int or
 * a list) joins c->eos (vLLM adds them to the stop ids), and the sampling defaults go to c->gen.
 * 0, or -1 with err naming the field. */
int mdl_gen_config_parse(const char *json, size_t len, mdl_config *c, char *err, size_t errlen);
/* Reads dir/config.json, then dir/generation_config.json when there is one. */
int mdl_config_load(const char *dir, mdl_config *out, char *err, size_t errlen);

/* Reads a whole file into a NUL-terminated malloc'd buffer (max_bytes bound). NULL + err on failure. */
char *mdl_read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

#endif
