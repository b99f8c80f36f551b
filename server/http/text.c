/* server/http/text.c — UTF-8 handling for text that leaves the server, and token decoding.
 *
 * Decoded model output is arbitrary bytes (a byte-level BPE token may hold part of a character), but
 * every string the server writes into JSON must be valid UTF-8. Two rules:
 *   - streaming holds back a tail that more bytes could still turn into a valid character
 *     (srv_utf8_stable_len), so deltas never split a character;
 *   - what is finally written is sanitized: each invalid or truncated sequence becomes U+FFFD (one
 *     per maximal invalid subpart, as Python's errors="replace" does), so the concatenation of the
 *     streamed deltas equals the non-streamed text.
 * A NUL byte (a token may decode to one) is written as \u0000 (srv_json_bytes), never cut or replaced.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http/http.h"

/* Classifies the sequence starting at s[0] (n >= 1 bytes available):
 *   returns 1: a valid character of *len bytes;
 *   returns 0: a valid but incomplete prefix (all n bytes; more are needed);
 *   returns -1: invalid; *len bytes (>= 1, the maximal valid-looking prefix) form one bad subpart. */
static int utf8_step(const unsigned char *s, size_t n, size_t *len)
{
    unsigned char b = s[0];
    if (b < 0x80) {
        *len = 1;
        return 1;
    }
    int need;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F; /* no surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F; /* <= U+10FFFF */
    } else {
        *len = 1;
        return -1;
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) {
            *len = n;
            return 0;
        }
        unsigned char c = s[i], l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (c < l || c > h) {
            *len = (size_t)i;
            return -1;
        }
    }
    *len = (size_t)need;
    return 1;
}

size_t srv_utf8_stable_len(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    /* an incomplete sequence is at most 3 bytes long and starts with a lead byte (>= 0xC2) */
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        size_t at = n - k, l;
        if (u[at] >= 0xC2 && u[at] <= 0xF4 && utf8_step(u + at, k, &l) == 0) return at;
        if (u[at] < 0x80 || u[at] >= 0xC0) break; /* a non-continuation byte ends the search */
    }
    return n;
}

int srv_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, l;
    while (i < n) {
        if (utf8_step(u + i, n - i, &l) != 1) return 0;
        i += l;
    }
    return 1;
}

static char *sanitize(const char *s, size_t n, int keep_nul, size_t *out_len)
{
    const unsigned char *u = (const unsigned char *)s;
    /* worst case: every byte becomes U+FFFD (3 bytes) */
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    size_t i = 0, k = 0, l;
    while (i < n) {
        int r = utf8_step(u + i, n - i, &l);
        if (r == 1 && (u[i] != 0 || keep_nul)) {
            memcpy(o + k, u + i, l);
            k += l;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
        }
        i += l;
    }
    o[k] = 0;
    if (out_len) *out_len = k;
    return o;
}

char *srv_utf8_sanitize(const char *s, size_t n, size_t *out_len)
{
    return sanitize(s, n, 0, out_len); /* NUL too: callers hold C strings */
}

/* A JSON string of bytes that hold NUL: cJSON strings are C strings, so the escaped text is built
 * here (each NUL-free run escaped by cJSON itself, NUL as \u0000) and returned as a raw item. */
static cJSON *json_string_with_nul(const char *s, size_t n)
{
    size_t tl = 0;
    char *t = sanitize(s, n, 1, &tl);
    if (!t) return NULL;
    srv_buf b = {0};
    srv_buf_add(&b, "\"", 1);
    size_t i = 0;
    while (i <= tl) {
        const char *z = memchr(t + i, 0, tl - i);
        size_t seg = z ? (size_t)(z - (t + i)) : tl - i;
        if (seg) {
            char save = t[i + seg];
            t[i + seg] = 0;
            cJSON *str = cJSON_CreateString(t + i);
            char *q = str ? cJSON_PrintUnformatted(str) : NULL;
            t[i + seg] = save;
            if (q) srv_buf_add(&b, q + 1, strlen(q) - 2); /* without its quotes */
            else b.oom = 1;
            cJSON_free(q);
            cJSON_Delete(str);
        }
        if (!z) break;
        srv_buf_add(&b, "\\u0000", 6);
        i += seg + 1;
    }
    srv_buf_add(&b, "\"", 1);
    free(t);
    cJSON *j = b.oom ? NULL : cJSON_CreateRaw(b.p);
    free(b.p);
    return j;
}

cJSON *srv_json_bytes(const char *s, size_t n)
{
    char *t;
    if (n && memchr(s, 0, n)) return json_string_with_nul(s, n);
    if (srv_utf8_valid(s, n)) {
        t = malloc(n + 1);
        if (!t) return NULL;
        memcpy(t, s, n);
        t[n] = 0;
    } else {
        t = srv_utf8_sanitize(s, n, NULL);
        if (!t) return NULL;
    }
    cJSON *j = cJSON_CreateString(t);
    free(t);
    return j;
}

void srv_buf_add(srv_buf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2 + 256;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void srv_buf_printf(srv_buf *b, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (w < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)w < sizeof small) {
        srv_buf_add(b, small, (size_t)w);
        return;
    }
    char *big = malloc((size_t)w + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)w + 1, fmt, ap);
    va_end(ap);
    srv_buf_add(b, big, (size_t)w);
    free(big);
}
