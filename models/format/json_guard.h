/* models/format/json_guard.h — a pre-parse scan of untrusted JSON text, before cJSON sees it.
 *
 * Why: cJSON parses (and deletes, and prints) nested arrays and objects recursively, up to its
 * built-in limit of 1000 levels. On a thread with a small stack (civetweb's workers get about
 * 100 KiB) ~900 levels overflow it: a 1.8 KB body crashed the server. cJSON also keeps strings as
 * NUL-terminated C strings, so a "\u0000" escape silently truncates a prompt or a tensor name.
 * The scan is a linear pass with no recursion and no allocation: it tracks string state (quotes,
 * backslash escapes) to count nesting depth only outside strings, and finds NUL, raw or escaped,
 * inside strings. It does not validate JSON; cJSON still does that afterwards.
 */
#ifndef GS_MODELS_JSON_GUARD_H
#define GS_MODELS_JSON_GUARD_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Deepest nesting any untrusted JSON text may have (request bodies, safetensors headers,
 * tokenizer and config files). Real documents stay far below it (a safetensors header is 3 deep,
 * a tokenizer.json about 6, a request with a JSON schema a few dozen). */
#define MDL_JSON_MAX_DEPTH 128

typedef struct {
    int depth;      /* the deepest nesting seen ([ or { outside strings) */
    size_t deep_at; /* byte offset of the first [ or { past max_depth (when over) */
    int nul;        /* 1: a NUL byte, or a \u0000 escape, inside a string (or a raw NUL anywhere) */
    size_t nul_at;  /* byte offset of the first one */
} mdl_json_scan;

/* Scans txt[0..n). Returns 0 when the depth stays within max_depth and (when refuse_nul) no NUL
 * was seen; else -1 with msg (a sentence naming the byte offset) written into msg[0..msglen). */
int mdl_json_check(const char *txt, size_t n, int max_depth, int refuse_nul, mdl_json_scan *out, char *msg,
                   size_t msglen);

/* ---- the reader: the one entry point of JSON text into cJSON ------------------------------------
 * Every parse of untrusted or on-disk JSON (request bodies, safetensors headers, tokenizer, config
 * and index files, batch and prompt files, answers of other servers) goes through mdl_json_parse:
 * scripts/check_json_entry.py (a ctest) fails when a raw cJSON_Parse* call appears anywhere else,
 * so no call site can forget the depth scan. */

/* mdl_json_parse flags */
#define MDL_JSON_REFUSE_NUL 1u /* a NUL (raw, or \u0000 in a string) is an error; else only reported */
#define MDL_JSON_WHOLE 2u      /* only JSON whitespace (space, tab, CR, LF) may follow the value; else the
                                * rest is ignored, as cJSON_Parse does */
#define MDL_JSON_OBJECT 4u     /* the value must be an object */

typedef enum {
    MDL_JSON_OK = 0,
    MDL_JSON_E_DEEP,       /* nests deeper than max_depth (at: the first opener past it) */
    MDL_JSON_E_NUL,        /* a NUL, with MDL_JSON_REFUSE_NUL (at: the first one) */
    MDL_JSON_E_SYNTAX,     /* cJSON refused the text, or ran out of memory (at: where it stopped) */
    MDL_JSON_E_NOT_OBJECT, /* MDL_JSON_OBJECT and the value is not one (checked before MDL_JSON_WHOLE) */
    MDL_JSON_E_TRAILING,   /* MDL_JSON_WHOLE and more than whitespace follows (at: its first byte) */
} mdl_json_status;

typedef struct {
    mdl_json_status status;
    size_t at;          /* on an error: the byte offset it names */
    size_t end;         /* on success: the offset just past the value (before any trailing whitespace) */
    mdl_json_scan scan; /* the pre-scan (depth, NUL), whatever the outcome */
} mdl_json_result;

/* Scans txt[0..len) (mdl_json_check), then parses it with cJSON bounded by len (txt need not be
 * NUL-terminated; txt may be NULL when len is 0) and applies flags. Returns the value (the caller
 * cJSON_Deletes it), or NULL with *res (optional) saying why and err (optional) a sentence without
 * a prefix, for the caller to say where the text came from: "JSON nests deeper than 128 levels (at
 * byte 9)", "JSON contains a NUL character ...", "not valid JSON (error near byte 5 of 9)", "not a
 * JSON object", "data after the JSON value (at byte 7)". No allocation but cJSON's own. */
cJSON *mdl_json_parse(const char *txt, size_t len, int max_depth, unsigned flags, mdl_json_result *res, char *err,
                      size_t errlen);

#endif
