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
} mdl_mkmodel_opts;

void mdl_mkmodel_defaults(mdl_mkmodel_opts *o);
int mdl_mkmodel(const mdl_mkmodel_opts *o, const char *out_dir, char *err, size_t errlen);

#endif
