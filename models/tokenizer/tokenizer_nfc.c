/* models/tokenizer/tokenizer_nfc.c — Unicode NFC (canonical decomposition, canonical ordering, canonical
 * composition) for the "NFC" normalizer of tokenizer.json (Qwen2/Qwen3 use it). Tables are in
 * tokenizer_nfc_data.c (generated from Python's unicodedata by scripts/gen_tokenizer_expected.py). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/tokenizer/tokenizer_internal.h"

enum {
    SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7,
    LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT
};

static unsigned ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = mdl_tok_int_ccc_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t c = mdl_tok_int_ccc_tab[mid] >> 8;
        if (c == cp) return mdl_tok_int_ccc_tab[mid] & 0xFF;
        if (c < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

static const uint32_t *decomp_of(uint32_t cp) {
    if (cp < 0xC0) return NULL;
    size_t lo = 0, hi = mdl_tok_int_decomp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t c = mdl_tok_int_decomp_tab[mid][0];
        if (c == cp) return mdl_tok_int_decomp_tab[mid];
        if (c < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = mdl_tok_int_comp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = mdl_tok_int_comp_tab[mid];
        if (e[0] == a && e[1] == b) return e[2];
        if (e[0] < a || (e[0] == a && e[1] < b))
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

typedef struct {
    uint32_t *v;
    size_t n, cap;
} u32buf;

static int push(u32buf *b, uint32_t cp) {
    if (b->n == b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        uint32_t *nv = realloc(b->v, nc * sizeof *nv);
        if (!nv) return -1;
        b->v = nv;
        b->cap = nc;
    }
    b->v[b->n++] = cp;
    return 0;
}

static int decompose(u32buf *b, uint32_t cp, int depth) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t si = cp - SBASE;
        if (push(b, LBASE + si / NCOUNT) || push(b, VBASE + (si % NCOUNT) / TCOUNT)) return -1;
        if (si % TCOUNT && push(b, TBASE + si % TCOUNT)) return -1;
        return 0;
    }
    const uint32_t *d = depth < 8 ? decomp_of(cp) : NULL;
    if (!d) return push(b, cp);
    if (decompose(b, d[1], depth + 1)) return -1;
    if (d[2] && decompose(b, d[2], depth + 1)) return -1;
    return 0;
}


/* s must be valid UTF-8. Returns 0 when s is already NFC (*out untouched), 1 with a malloc'ed
 * normalized copy in *out / *out_len, -1 when out of memory. */
int mdl_tok_int_nfc(const char *s, size_t len, char **out, size_t *out_len) {
    bool fast = true;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= 0xCC) { /* first code point >= U+0300 */
            fast = false;
            break;
        }
    if (fast) return 0;
    u32buf b = {0};
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += mdl_tok_int_utf8_dec(u + i, len - i, &cp);
        if (decompose(&b, cp, 0)) goto oom;
    }
    /* canonical ordering: stable sort of each run of non-starters by combining class */
    for (size_t i = 1; i < b.n; i++) {
        uint32_t cp = b.v[i];
        unsigned cc = ccc_of(cp);
        if (cc == 0) continue;
        size_t j = i;
        while (j > 0) {
            unsigned pc = ccc_of(b.v[j - 1]);
            if (pc == 0 || pc <= cc) break;
            b.v[j] = b.v[j - 1];
            j--;
        }
        b.v[j] = cp;
    }
    /* canonical composition */
    size_t o = 0;
    long starter = -1;
    unsigned last_cc = 0;
    for (size_t i = 0; i < b.n; i++) {
        uint32_t cp = b.v[i];
        unsigned cc = ccc_of(cp);
        if (starter >= 0 && (o == (size_t)starter + 1 || (last_cc != 0 && last_cc < cc))) {
            uint32_t comp = compose(b.v[starter], cp);
            if (comp) {
                b.v[starter] = comp;
                continue;
            }
        }
        if (cc == 0) starter = (long)o;
        last_cc = cc;
        b.v[o++] = cp;
    }
    b.n = o;
    /* encode; compare with the input */
    char *r = malloc(b.n * 4 + 1);
    if (!r) goto oom;
    size_t rl = 0;
    for (size_t i = 0; i < b.n; i++) {
        rl += mdl_tok_int_utf8_enc(b.v[i], r + rl);
    }
    free(b.v);
    if (rl == len && memcmp(r, s, len) == 0) {
        free(r);
        return 0;
    }
    r[rl] = 0;
    *out = r;
    *out_len = rl;
    return 1;
oom:
    free(b.v);
    return -1;
}
