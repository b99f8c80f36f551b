/* tests/fuzz/fuzz_config.c — libFuzzer harness for mdl_config_parse: a checkpoint's config.json, read
 * from whatever folder a user or a trainer names (built with the other targets: -DGS_FUZZ=ON; seeds
 * in tests/fuzz/corpus/fuzz_config/: the shipped pair's configs and the FP8 ones mkmodel writes, block
 * fp8 and compressed-tensors with "re:" patterns, which PCRE2 compiles from the untrusted file).
 * Beyond "no crash": a refusal must explain itself; an accepted config must be one the model builder
 * can size: layers in 1 .. MDL_MAX_LAYERS, positive widths, heads a multiple of the KV heads, at most
 * MDL_MAX_TARGET_IDS target ids on a drafter, and FP8 settings inside what the kernels take (b0 >= 1,
 * b1 a power of two >= 16, a known scheme, channel / tensor as 1-row blocks wider than every matrix).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mdl_config c;
    char err[512];
    err[0] = '\0';
    if (mdl_config_parse((const char *)data, size, &c, err, sizeof err) != 0) {
        if (err[0] == '\0') abort();
        return 0;
    }
    if (c.layers < 1 || c.layers > MDL_MAX_LAYERS || c.hidden <= 0 || c.heads <= 0 || c.kv_heads <= 0 ||
        c.head_dim <= 0 || c.vocab <= 0 || c.heads % c.kv_heads != 0)
        abort();
    if (c.is_drafter && (c.n_target_ids < 1 || c.n_target_ids > MDL_MAX_TARGET_IDS)) abort();
    if (c.fp8) {
        if (c.fp8_b0 < 1 || c.fp8_b1 < 16 || (c.fp8_b1 & (c.fp8_b1 - 1)) != 0) abort();
        if (c.fp8_scheme != MDL_FP8_BLOCK && c.fp8_scheme != MDL_FP8_CHANNEL && c.fp8_scheme != MDL_FP8_TENSOR) abort();
        if (c.fp8_scheme != MDL_FP8_BLOCK && (c.fp8_b0 != 1 || c.fp8_b1 < c.hidden || c.fp8_b1 < c.intermediate))
            abort();
        if (c.fp8_online) abort(); /* a serve flag, never a config field */
    }
    return 0;
}
