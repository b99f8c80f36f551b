/* models/config_gen.c — generation_config.json: eos ids and sampling defaults.
 *
 * As vLLM (--generation-config auto, the default) reads it: the eos_token_id entries are added to
 * the stop token ids (graphswap: merged into the model's eos set, so ignore_eos and min_tokens treat
 * them alike), and the sampling fields that differ from transformers' GenerationConfig defaults
 * become the defaults of requests that do not set them. do_sample is not read (vLLM does not read
 * it either). The server applies them in server/core/request.c (serve --generation-config auto).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "models/config.h"
#include "models/format/json_guard.h"

static int gen_num(const cJSON *root, const char *key, double lo, double hi, double neutral, int has_neutral,
                   double *out, int *set, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    *set = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        snprintf(err, errlen, "generation_config.json: field %s must be a number in [%g, %g]", key, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    *set = !(has_neutral && v->valuedouble == neutral);
    return 0;
}

int mdl_gen_config_parse(const char *json, size_t len, mdl_config *c, char *err, size_t errlen)
{
    char why[160];
    mdl_json_result jr;
    cJSON *root = mdl_json_parse(json, len, MDL_JSON_MAX_DEPTH, MDL_JSON_OBJECT, &jr, why, sizeof why);
    int rc = -1;
    if (!root) {
        snprintf(err, errlen, "generation_config.json: %s",
                 jr.status == MDL_JSON_E_DEEP ? why : "not a JSON object");
        goto out;
    }
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (eos && !cJSON_IsNull(eos)) {
        const cJSON *one = cJSON_IsArray(eos) ? eos->child : eos;
        for (; one; one = cJSON_IsArray(eos) ? one->next : NULL) {
            if (!cJSON_IsNumber(one) || one->valuedouble != floor(one->valuedouble) || one->valuedouble < 0 ||
                one->valuedouble >= c->vocab) {
                snprintf(err, errlen, "generation_config.json: field eos_token_id: entries must be token ids below %d",
                         c->vocab);
                goto out;
            }
            const int id = (int)one->valuedouble;
            int dup = 0;
            for (int i = 0; i < c->n_eos; i++) dup |= c->eos[i] == id;
            if (dup) continue;
            if (c->n_eos >= MDL_MAX_EOS) {
                snprintf(err, errlen, "generation_config.json: field eos_token_id: more than %d eos ids in all",
                         MDL_MAX_EOS);
                goto out;
            }
            c->eos[c->n_eos++] = id;
        }
    }
    double v;
    int set;
    if (gen_num(root, "temperature", 0, 100, 1.0, 1, &v, &set, err, errlen)) goto out;
    if (set) c->gen.set |= MDL_GEN_TEMPERATURE, c->gen.temperature = (float)v;
    if (gen_num(root, "top_p", 0, 1, 1.0, 1, &v, &set, err, errlen)) goto out;
    if (set && !(v > 0)) {
        snprintf(err, errlen, "generation_config.json: field top_p must be in (0, 1]");
        goto out;
    }
    if (set) c->gen.set |= MDL_GEN_TOP_P, c->gen.top_p = (float)v;
    if (gen_num(root, "top_k", -1, 1 << 30, 50, 1, &v, &set, err, errlen)) goto out;
    if (set && v != floor(v)) {
        snprintf(err, errlen, "generation_config.json: field top_k must be an integer");
        goto out;
    }
    if (set) c->gen.set |= MDL_GEN_TOP_K, c->gen.top_k = v > 0 ? (int)v : 0;
    if (gen_num(root, "min_p", 0, 1, 0, 0, &v, &set, err, errlen)) goto out;
    if (set) c->gen.set |= MDL_GEN_MIN_P, c->gen.min_p = (float)v;
    if (gen_num(root, "repetition_penalty", 1e-6, 1e6, 1.0, 1, &v, &set, err, errlen)) goto out;
    if (set) c->gen.set |= MDL_GEN_REPETITION_PENALTY, c->gen.repetition_penalty = v;
    if (gen_num(root, "max_new_tokens", 1, 1 << 30, 0, 0, &v, &set, err, errlen)) goto out;
    if (set && v != floor(v)) {
        snprintf(err, errlen, "generation_config.json: field max_new_tokens must be an integer");
        goto out;
    }
    if (set) c->gen.set |= MDL_GEN_MAX_NEW_TOKENS, c->gen.max_new_tokens = (int)v;
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}
