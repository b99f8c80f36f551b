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

#endif
