/* models/format/json_guard.c — see json_guard.h. */
#include "models/format/json_guard.h"

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
