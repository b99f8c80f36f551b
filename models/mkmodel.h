/* models/mkmodel.h — random-init checkpoints in the exact Hugging Face layout (tests, defaults). */
#ifndef GS_MDL_MKMODEL_H
#define GS_MDL_MKMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "models/config.h"

typedef struct {
    mdl_arch arch;
    int hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, max_pos;
    int tie;
    mdl_dtype dtype;
    int shards;
    uint64_t seed;
    int tokenizer; /* write tokenizer.json + tokenizer_config.json (needs vocab >= 512) */
    /* drafters (arch DFLASH / DSPARK): geometry comes from the target's config.json */
    const char *target_dir;
    int block_size;       /* 0: 8 for DFlash, 7 for DSpark */
    int markov_rank;      /* DSpark (default 16) */
    int conf_head;        /* DSpark confidence head (default on, with Markov input) */
    int n_target_ids;     /* 0: spread over the target's layers */
    int target_ids[MDL_MAX_TARGET_IDS];
    int mask_token_id;    /* -1: vocab - 4 (below mkmodel's tokenizer's special tokens) */
    /* config.json layout and RoPE (targets): transformers 4 (rope_theta + rope_scaling,
     * torch_dtype) or 5 (rope_parameters, dtype). Numbers left at 0 are not written. */
    int config_v5;
    const char *rope_type;   /* NULL: plain RoPE (rope_scaling null / rope_type default) */
    double rope_theta;       /* 0: 500000 for llama, 1e6 otherwise */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_beta_fast, rope_beta_slow;
    double rope_mscale, rope_mscale_all_dim, rope_attention_factor;
    int rope_orig_max_pos;
    int rope_truncate;       /* -1: not written, else false / true */
    /* Qwen3-MoE (arch QWEN3_MOE): experts, top-k, moe_intermediate_size, norm_topk_prob,
     * decoder_sparse_step, mlp_only_layers; moe_fused writes transformers 5's fused expert tensors
     * (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]) instead of one tensor per
     * expert part: the same numbers for the same seed, so both layouts name one model */
    int experts, experts_per_tok, moe_inter, norm_topk, sparse_step, moe_fused;
    int n_mlp_only;
    int mlp_only[MDL_MAX_LAYERS];
    /* Block FP8 (fp8_b0 > 0; targets, Qwen3-MoE experts one tensor per part): every projection
     * (q/k/v/o/gate/up/down, each expert's) quantized as
     * real FP8 checkpoints are, per [fp8_b0, fp8_b1] block s = amax / 448 and q = e4m3(w / s) to
     * nearest even; written as X.weight F8_E4M3 + X.weight_scale_inv F32 with a quantization_config.
     * fp8_dequant: write instead the same model with those weights dequantized (f32(q) * s, in
     * --dtype) and no quantization_config, the twin an FP8 model must match. fp8_lm_head (with
     * fp8_dequant, untied targets): lm_head dequantized likewise, the twin of serve --quantize-lm-head
     * (no checkpoint format stores an FP8 lm_head, so there is no quantized form to write). */
    int fp8_b0, fp8_b1, fp8_dequant, fp8_lm_head;
    /* compressed-tensors FP8 instead (llm-compressor's layout): X.weight_scale in --dtype, per block
     * (fp8_scheme MDL_FP8_BLOCK), per row [N, 1] (CHANNEL) or per tensor [1] (TENSOR; fp8_b0 > 0
     * still marks FP8 on), and a compressed-tensors quantization_config */
    int fp8_ct, fp8_scheme;
} mdl_mkmodel_opts;

void mdl_mkmodel_defaults(mdl_mkmodel_opts *o);
int mdl_mkmodel(const mdl_mkmodel_opts *o, const char *out_dir, char *err, size_t errlen);

#endif
