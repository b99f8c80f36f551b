/* tests/gpu/gpu_models.h — the small random checkpoints the GPU model tests run on: hidden 128,
 * vocab 512, 2 target layers (drafters: 1 layer, block 4, Markov rank 16), written with mdl_mkmodel. */
#ifndef GS_GPU_MODELS_H
#define GS_GPU_MODELS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "models/mkmodel.h"

/* Writes base/name (a drafter's geometry comes from target) and puts its path in out[1100]; exits on
 * failure (nothing can be tested without it). fp8_b0 > 0: block-FP8 projections of fp8_b0 x fp8_b1. */
static inline void gpu_mkmodel_fp8(char *out, const char *base, const char *name, mdl_arch arch, mdl_dtype dt,
                                   int tie, int hd, int heads, int kv, uint64_t seed, const char *target, int fp8_b0,
                                   int fp8_b1)
{
    snprintf(out, 1100, "%s/%s", base, name);
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    o.arch = arch;
    o.tokenizer = 0;
    o.hidden = 128;
    o.layers = 2;
    o.heads = heads;
    o.kv_heads = kv;
    o.head_dim = hd;
    o.intermediate = 256;
    o.vocab = 512;
    o.dtype = dt;
    o.tie = tie;
    o.seed = seed;
    o.target_dir = target;
    if (arch == MDL_ARCH_QWEN3_MOE) { /* 8 experts, top-2, layer 1 dense (mlp_only_layers) */
        o.experts = 8;
        o.experts_per_tok = 2;
        o.moe_inter = 64;
        o.norm_topk = 1;
        o.sparse_step = 1;
        o.n_mlp_only = 1;
        o.mlp_only[0] = 1;
    }
    if (arch == MDL_ARCH_DSPARK || arch == MDL_ARCH_DFLASH) {
        o.layers = 1;
        o.block_size = 4;
        o.markov_rank = 16;
    }
    o.fp8_b0 = fp8_b0; /* block FP8 (quant_method fp8) when > 0 */
    o.fp8_b1 = fp8_b1;
    char err[512];
    if (mdl_mkmodel(&o, out, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel %s: %s\n", name, err);
        exit(1);
    }
}

static inline void gpu_mkmodel(char *out, const char *base, const char *name, mdl_arch arch, mdl_dtype dt, int tie,
                               int hd, int heads, int kv, uint64_t seed, const char *target)
{
    gpu_mkmodel_fp8(out, base, name, arch, dt, tie, hd, heads, kv, seed, target, 0, 0);
}

#endif
