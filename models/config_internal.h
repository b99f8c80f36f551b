/* models/config_internal.h — the parts of config.json parsing split out of models/config.c. */
#ifndef GS_MDL_CONFIG_INTERNAL_H
#define GS_MDL_CONFIG_INTERNAL_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "models/config.h"

/* rope_theta, rope_scaling (transformers 4), rope_parameters (transformers 5),
 * partial_rotary_factor. Needs c->arch, head_dim and max_pos parsed. 0, or -1 with err naming the
 * field. */
int mdl_config_parse_rope(const cJSON *root, mdl_config *c, char *err, size_t errlen);
/* use_sliding_window / sliding_window / max_window_layers / layer_types, torch_dtype / dtype.
 * Needs c->arch, layers and max_pos parsed. */
int mdl_config_parse_attention(const cJSON *root, mdl_config *c, char *err, size_t errlen);
/* quantization_config (models/config_quant.c): absent, block FP8 or compressed-tensors FP8 into
 * c->fp8*. Needs the architecture and every dimension parsed. */
int mdl_config_parse_quant(const cJSON *root, mdl_config *c, char *err, size_t errlen);

#endif
