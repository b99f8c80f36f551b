/* models/format/json_guard.c — see json_guard.h. */
#include "models/format/json_guard.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

int mdl_json_check(const char *txt, size_t n, int max_depth, int refuse_nul, mdl_json_scan *out, char *msg,
                   size_t msglen)
{
    mdl_json_scan sc = {0, 0, 0, 0};
    int depth = 0, in_str = 0, over = 0;
    for (size_t i = 0; i < n; i++) {
        const char ch = txt[i];
        if (ch == '\0') {
            if (!sc.nul) sc.nul_at = i;
            sc.nul = 1;
            continue;
        }
        if (in_str) {
            if (ch == '"') {
                in_str = 0;
            } else if (ch == '\\' && i + 1 < n) {
                /* an escape: \u0000 (any hex case of zeros is the same code point) is a NUL */
                if (txt[i + 1] == 'u' && i + 5 < n && memcmp(txt + i + 2, "0000", 4) == 0) {
                    if (!sc.nul) sc.nul_at = i;
                    sc.nul = 1;
                }
                i++; /* the escaped character never ends the string */
            }
            continue;
        }
        if (ch == '"') {
            in_str = 1;
        } else if (ch == '[' || ch == '{') {
            if (++depth > sc.depth) sc.depth = depth;
            if (depth > max_depth && !over) {
                over = 1;
                sc.deep_at = i;
            }
        } else if ((ch == ']' || ch == '}') && depth > 0) {
            depth--;
        }
    }
    if (out) *out = sc;
    if (over) {
        if (msglen) snprintf(msg, msglen, "JSON nests deeper than %d levels (at byte %zu)", max_depth, sc.deep_at);
        return -1;
    }
    if (refuse_nul && sc.nul) {
        if (msglen)
            snprintf(msg, msglen, "JSON contains a NUL character (raw or \\u0000) at byte %zu; NUL is not accepted",
                     sc.nul_at);
        return -1;
    }
    return 0;
}

cJSON *mdl_json_parse(const char *txt, size_t len, int max_depth, unsigned flags, mdl_json_result *res, char *err,
                      size_t errlen)
{
    assert(txt || len == 0);
    assert(max_depth >= 1);
    mdl_json_result r = {MDL_JSON_OK, 0, 0, {0, 0, 0, 0}};
    cJSON *v = NULL;
    char why[160];
    /* the scan first: cJSON must never see a text deep enough to exhaust a small stack */
    if (mdl_json_check(txt, len, max_depth, (flags & MDL_JSON_REFUSE_NUL) != 0, &r.scan, why, sizeof why) != 0) {
        /* mdl_json_check names depth before NUL: the same order here */
        const int deep = r.scan.depth > max_depth;
        r.status = deep ? MDL_JSON_E_DEEP : MDL_JSON_E_NUL;
        r.at = deep ? r.scan.deep_at : r.scan.nul_at;
        if (errlen) snprintf(err, errlen, "%s", why);
        goto out;
    }
    const char *end = NULL;
    /* bounded by len, not by a terminator; trailing data is judged below, not by cJSON's
     * require_null_terminated (which takes any byte <= 32, NUL included, as whitespace) */
    v = len ? cJSON_ParseWithLengthOpts(txt, len, &end, 0) : NULL;
    if (!v) {
        r.status = MDL_JSON_E_SYNTAX;
        r.at = end && end >= txt && end <= txt + len ? (size_t)(end - txt) : 0;
        if (errlen) snprintf(err, errlen, "not valid JSON (error near byte %zu of %zu)", r.at, len);
        goto out;
    }
    r.end = end && end >= txt && end <= txt + len ? (size_t)(end - txt) : len;
    if ((flags & MDL_JSON_OBJECT) && !cJSON_IsObject(v)) {
        r.status = MDL_JSON_E_NOT_OBJECT;
        if (errlen) snprintf(err, errlen, "not a JSON object");
        goto fail;
    }
    if (flags & MDL_JSON_WHOLE) {
        size_t i = r.end;
        while (i < len && (txt[i] == ' ' || txt[i] == '\t' || txt[i] == '\r' || txt[i] == '\n')) i++;
        if (i < len) {
            r.status = MDL_JSON_E_TRAILING;
            r.at = i;
            if (errlen) snprintf(err, errlen, "data after the JSON value (at byte %zu)", i);
            goto fail;
        }
    }
    goto out;
fail:
    cJSON_Delete(v);
    v = NULL;
out:
    if (res) *res = r;
    return v;
}
