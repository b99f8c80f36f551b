/* server/cmd/cmd_mkmodel.c — `graphswap mkmodel`: random-init checkpoints in Hugging Face layout. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/kern.h"
#include "models/config.h"
#include "models/mkmodel.h"
#include "models/model.h"
#include "server/cmd/cmd.h"
#include "server/core/cli.h"

static int count_params(const mdl_st_tensor *t, size_t n, const char *what, void *user, char *err, size_t errlen)
{
    (void)what, (void)err, (void)errlen;
    for (size_t i = 0; i < n; i++) *(uint64_t *)user += t[i].numel;
    return 0;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* What mkmodel wrote, read back from the folder (not from the options): the architecture, the
 * parameter count of the checkpoint as a loader sees it, and every file with its size. */
static void report(const char *out)
{
    char err[1024];
    mdl_config cfg;
    uint64_t params = 0;
    if (mdl_config_load(out, &cfg, err, sizeof err) != 0 ||
        mdl_ckpt_foreach_bucket(out, 0, count_params, &params, err, sizeof err) != 0)
        srv_die("%s: cannot read back what was written: %s", out, err);
    DIR *d = opendir(out);
    if (!d) srv_die("%s: cannot list", out);
    char *names[256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < 256;)
        if (e->d_name[0] != '.' && (names[n] = strdup(e->d_name)) != NULL) n++;
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, name_cmp);
    printf("wrote %s: %s, %llu parameters (%.2fM), %d files\n", out, mdl_arch_name(cfg.arch),
           (unsigned long long)params, (double)params / 1e6, n);
    for (int i = 0; i < n; i++) {
        char path[4352];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", out, names[i]);
        if (stat(path, &st) == 0) printf("  %-36s %12lld bytes\n", names[i], (long long)st.st_size);
        free(names[i]);
    }
}

static const char help[] =
    "usage: graphswap mkmodel --out DIR [options]\n"
    "\n"
    "Writes config.json, model.safetensors (or N shards + model.safetensors.index.json) and a small\n"
    "byte-level BPE tokenizer (tokenizer.json, tokenizer_config.json; vocab >= 512) in the exact\n"
    "layout and naming of a Hugging Face checkpoint, with seeded random weights, then prints what it\n"
    "wrote: the folder, the architecture, the parameter count and each file with its size.\n"
    "\n"
    "  --arch qwen3|qwen3_moe|llama|qwen2|dflash|dspark   (default qwen3)\n"
    "  --hidden N  --layers N  --heads N  --kv-heads N  --head-dim N  --intermediate N  --vocab N\n"
    "                             (defaults 64, 2, 4, 2, 16, 128, 1024)\n"
    "  --max-pos N                max_position_embeddings (default 4096)\n"
    "  --tie | --no-tie           tie lm_head to embed_tokens (default --tie)\n"
    "  --dtype bf16|f16|f32       (default bf16)\n"
    "  --shards N                 number of safetensors files (default 1)\n"
    "  --seed S                   (default 0)\n"
    "  --no-tokenizer             skip the tokenizer files\n"
    "\n"
    "Qwen3-MoE (--arch qwen3_moe: Qwen3MoeForCausalLM; --intermediate sizes the dense layers):\n"
    "  --experts N  --experts-per-tok K  --moe-intermediate N   (default 8, 2, 32)\n"
    "  --no-norm-topk             norm_topk_prob false (default true, as Qwen3-30B-A3B)\n"
    "  --sparse-step N            decoder_sparse_step (default 1)\n"
    "  --mlp-only LIST            mlp_only_layers, comma-separated layer indices (dense layers)\n"
    "  --moe-fused                transformers 5's fused experts.gate_up_proj / experts.down_proj\n"
    "                             (default: one tensor per expert part; the same weights either way)\n"
    "\n"
    "FP8 (targets; with --arch qwen3_moe every expert part, not with --moe-fused):\n"
    "  --fp8 ROWS,COLS            block-FP8 projections (F8_E4M3 weight + F32 weight_scale_inv per block,\n"
    "                             quant_method fp8), as Qwen3-FP8 checkpoints\n"
    "  --fp8 channel|tensor       compressed-tensors FP8 (llm-compressor's FP8_DYNAMIC / FP8): F8_E4M3\n"
    "                             weight + weight_scale per output row [N, 1] or per tensor [1], the\n"
    "                             scales in --dtype\n"
    "  --fp8-compressed-tensors   with --fp8 ROWS,COLS: compressed-tensors' block strategy (FP8_BLOCK)\n"
    "  --fp8-dequantized          with --fp8: the same model with the projections dequantized (the\n"
    "                             FP8 model's twin: no quantization_config)\n"
    "  --fp8-lm-head              with --fp8 ROWS,COLS --fp8-dequantized --no-tie: lm_head dequantized\n"
    "                             too (the twin of serve --quantization fp8 --quantize-lm-head)\n"
    "\n"
    "Drafters (--arch dflash: z-lab DFlashDraftModel; --arch dspark: DeepSpec Qwen3DSparkModel) take\n"
    "their geometry from the target; --layers sets the drafter depth:\n"
    "  --target DIR               the target checkpoint (required)\n"
    "  --block-size N             drafter block (default 8 for dflash, 7 for dspark)\n"
    "  --target-layer-ids LIST    target layers feeding the context (default: spread over [0, L-2]);\n"
    "                             -1 = the embedding output, L-1 = the final-normed last state\n"
    "  --mask-token-id N          (default vocab - 4)\n"
    "  --markov-rank N            DSpark Markov head rank (default 16; 0 = none)\n"
    "  --no-confidence            DSpark without a confidence head\n"
    "\n"
    "config.json layout and RoPE (targets):\n"
    "  --config-layout v4|v5      transformers 4 (rope_theta + rope_scaling, torch_dtype; default) or\n"
    "                             5 (rope_parameters, dtype)\n"
    "  --rope-type T              default|linear|dynamic|llama3|yarn (any string is written as is)\n"
    "  --rope-theta X             (default 500000 for llama, 1000000 otherwise)\n"
    "  --rope-factor X  --rope-low-freq-factor X  --rope-high-freq-factor X\n"
    "  --rope-orig-max-pos N      original_max_position_embeddings\n"
    "  --rope-beta-fast X  --rope-beta-slow X  --rope-mscale X  --rope-mscale-all-dim X\n"
    "  --rope-attention-factor X  --rope-truncate true|false\n"
    "                             (each written only when given)\n";

/* A "--name X" option parsed as a double (exactly as written, for config.json). */
static int arg_double(int argc, char **argv, int *i, const char *name, double *out)
{
    const char *s;
    if (!srv_arg_str(argc, argv, i, name, &s)) return 0;
    char *end;
    *out = strtod(s, &end);
    if (end == s || *end) srv_die("%s: not a number: %s", name, s);
    return 1;
}

int srv_cmd_mkmodel(int argc, char **argv)
{
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    const char *out = NULL, *arch = NULL, *dtype = NULL, *ids = NULL, *layout = NULL, *trunc = NULL;
    const char *mlp_only = NULL, *fp8 = NULL;
    int tie = 0, no_tie = 0, no_tok = 0, no_conf = 0, layers_set = 0, no_norm_topk = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            return 0;
        }
        const int M = 1 << 20;
        if (srv_arg_str(argc, argv, &i, "--out", &out) || srv_arg_str(argc, argv, &i, "--arch", &arch) ||
            srv_arg_str(argc, argv, &i, "--dtype", &dtype) ||
            srv_arg_int(argc, argv, &i, "--hidden", 1, M, &o.hidden) ||
            (srv_arg_int(argc, argv, &i, "--layers", 1, 1024, &o.layers) && (layers_set = 1)) ||
            srv_arg_int(argc, argv, &i, "--heads", 1, 4096, &o.heads) ||
            srv_arg_int(argc, argv, &i, "--kv-heads", 1, 4096, &o.kv_heads) ||
            srv_arg_int(argc, argv, &i, "--head-dim", 2, 4096, &o.head_dim) ||
            srv_arg_int(argc, argv, &i, "--intermediate", 1, M, &o.intermediate) ||
            srv_arg_int(argc, argv, &i, "--vocab", 2, 1 << 24, &o.vocab) ||
            srv_arg_int(argc, argv, &i, "--max-pos", 2, 1 << 24, &o.max_pos) ||
            srv_arg_int(argc, argv, &i, "--shards", 1, 999, &o.shards) ||
            srv_arg_u64(argc, argv, &i, "--seed", &o.seed) || srv_arg_flag(argc, argv, &i, "--tie", &tie) ||
            srv_arg_flag(argc, argv, &i, "--no-tie", &no_tie) ||
            srv_arg_flag(argc, argv, &i, "--no-tokenizer", &no_tok) ||
            srv_arg_str(argc, argv, &i, "--target", &o.target_dir) ||
            srv_arg_int(argc, argv, &i, "--block-size", 2, 64, &o.block_size) ||
            srv_arg_str(argc, argv, &i, "--target-layer-ids", &ids) ||
            srv_arg_int(argc, argv, &i, "--mask-token-id", 0, 1 << 24, &o.mask_token_id) ||
            srv_arg_int(argc, argv, &i, "--markov-rank", 0, 4096, &o.markov_rank) ||
            srv_arg_flag(argc, argv, &i, "--no-confidence", &no_conf) ||
            srv_arg_str(argc, argv, &i, "--config-layout", &layout) ||
            srv_arg_str(argc, argv, &i, "--rope-type", &o.rope_type) ||
            arg_double(argc, argv, &i, "--rope-theta", &o.rope_theta) ||
            arg_double(argc, argv, &i, "--rope-factor", &o.rope_factor) ||
            arg_double(argc, argv, &i, "--rope-low-freq-factor", &o.rope_low_freq_factor) ||
            arg_double(argc, argv, &i, "--rope-high-freq-factor", &o.rope_high_freq_factor) ||
            srv_arg_int(argc, argv, &i, "--rope-orig-max-pos", 1, 1 << 24, &o.rope_orig_max_pos) ||
            arg_double(argc, argv, &i, "--rope-beta-fast", &o.rope_beta_fast) ||
            arg_double(argc, argv, &i, "--rope-beta-slow", &o.rope_beta_slow) ||
            arg_double(argc, argv, &i, "--rope-mscale", &o.rope_mscale) ||
            arg_double(argc, argv, &i, "--rope-mscale-all-dim", &o.rope_mscale_all_dim) ||
            arg_double(argc, argv, &i, "--rope-attention-factor", &o.rope_attention_factor) ||
            srv_arg_str(argc, argv, &i, "--rope-truncate", &trunc) ||
            srv_arg_int(argc, argv, &i, "--experts", 1, KERN_MAX_EXPERTS, &o.experts) ||
            srv_arg_int(argc, argv, &i, "--experts-per-tok", 1, KERN_MAX_EXPERTS, &o.experts_per_tok) ||
            srv_arg_int(argc, argv, &i, "--moe-intermediate", 1, M, &o.moe_inter) ||
            srv_arg_flag(argc, argv, &i, "--no-norm-topk", &no_norm_topk) ||
            srv_arg_int(argc, argv, &i, "--sparse-step", 1, 1024, &o.sparse_step) ||
            srv_arg_str(argc, argv, &i, "--mlp-only", &mlp_only) ||
            srv_arg_flag(argc, argv, &i, "--moe-fused", &o.moe_fused) ||
            srv_arg_str(argc, argv, &i, "--fp8", &fp8) ||
            srv_arg_flag(argc, argv, &i, "--fp8-dequantized", &o.fp8_dequant) ||
            srv_arg_flag(argc, argv, &i, "--fp8-lm-head", &o.fp8_lm_head) ||
            srv_arg_flag(argc, argv, &i, "--fp8-compressed-tensors", &o.fp8_ct))
            continue;
        srv_die_usage("mkmodel", argv[i]);
    }
    if (!out) srv_die("--out DIR is required");
    if (fp8 && (strcmp(fp8, "channel") == 0 || strcmp(fp8, "tensor") == 0)) {
        o.fp8_scheme = fp8[0] == 'c' ? MDL_FP8_CHANNEL : MDL_FP8_TENSOR;
        o.fp8_ct = 1;
        o.fp8_b0 = 1, o.fp8_b1 = 16; /* (unused: the scheme sets the blocks) */
    } else if (fp8) {
        if (sscanf(fp8, "%d,%d", &o.fp8_b0, &o.fp8_b1) != 2)
            srv_die("--fp8 ROWS,COLS|channel|tensor: the block size, e.g. 128,128, or a compressed-tensors strategy");
        if (o.fp8_b0 < 1 || o.fp8_b1 < 16) srv_die("--fp8 ROWS,COLS: rows >= 1, columns a power of two >= 16");
    }
    if ((o.fp8_dequant || o.fp8_ct) && !fp8) srv_die("--fp8-dequantized / --fp8-compressed-tensors need --fp8");
    if (o.fp8_lm_head && (!o.fp8_dequant || o.fp8_ct || !no_tie))
        srv_die("--fp8-lm-head needs --fp8 ROWS,COLS --fp8-dequantized --no-tie (an FP8 lm_head exists only "
                "online: serve --quantize-lm-head)");
    if (tie && no_tie) srv_die("--tie and --no-tie are exclusive");
    o.tie = !no_tie;
    o.tokenizer = !no_tok;
    if (arch) {
        if (strcmp(arch, "qwen3") == 0) o.arch = MDL_ARCH_QWEN3;
        else if (strcmp(arch, "qwen3_moe") == 0) o.arch = MDL_ARCH_QWEN3_MOE;
        else if (strcmp(arch, "llama") == 0) o.arch = MDL_ARCH_LLAMA;
        else if (strcmp(arch, "qwen2") == 0) o.arch = MDL_ARCH_QWEN2;
        else if (strcmp(arch, "dflash") == 0) o.arch = MDL_ARCH_DFLASH;
        else if (strcmp(arch, "dspark") == 0) o.arch = MDL_ARCH_DSPARK;
        else srv_die("--arch must be qwen3, qwen3_moe, llama, qwen2, dflash or dspark");
    }
    if (dtype) {
        if (strcmp(dtype, "bf16") == 0) o.dtype = MDL_DT_BF16;
        else if (strcmp(dtype, "f16") == 0) o.dtype = MDL_DT_F16;
        else if (strcmp(dtype, "f32") == 0) o.dtype = MDL_DT_F32;
        else srv_die("--dtype must be bf16, f16 or f32");
    }
    if (layout) {
        if (strcmp(layout, "v4") == 0) o.config_v5 = 0;
        else if (strcmp(layout, "v5") == 0) o.config_v5 = 1;
        else srv_die("--config-layout must be v4 or v5");
    }
    if (trunc) {
        if (strcmp(trunc, "true") == 0) o.rope_truncate = 1;
        else if (strcmp(trunc, "false") == 0) o.rope_truncate = 0;
        else srv_die("--rope-truncate must be true or false");
    }
    if (o.arch == MDL_ARCH_DFLASH || o.arch == MDL_ARCH_DSPARK) {
        if (!layers_set) o.layers = 1;
        o.conf_head = !no_conf;
    }
    o.norm_topk = !no_norm_topk;
    for (const char *p = mlp_only; p && *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= MDL_MAX_LAYERS || o.n_mlp_only == MDL_MAX_LAYERS || (*end && *end != ','))
            srv_die("--mlp-only: bad list");
        o.mlp_only[o.n_mlp_only++] = (int)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (ids) {
        const char *p = ids;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < -1 || v > 1 << 20 || o.n_target_ids == MDL_MAX_TARGET_IDS)
                srv_die("--target-layer-ids: bad list");
            o.target_ids[o.n_target_ids++] = (int)v;
            p = *end == ',' ? end + 1 : end;
            if (*end && *end != ',') srv_die("--target-layer-ids: bad list");
        }
    }
    char err[1024];
    if (mdl_mkmodel(&o, out, err, sizeof err) != 0) srv_die("%s", err);
    report(out);
    return 0;
}
