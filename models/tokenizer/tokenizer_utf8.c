/* models/tokenizer/tokenizer_utf8.c — UTF-8 code point decoding and encoding for the tokenizer files
 * (byte-level BPE's byte <-> code point map, pre-tokenizer scans, NFC). Declared in
 * tokenizer_internal.h; a leaf: it uses nothing of the other tokenizer files. */
#include <stddef.h>
#include <stdint.h>

#include "models/tokenizer/tokenizer_internal.h"

size_t mdl_tok_int_utf8_dec(const unsigned char *s, size_t len, uint32_t *cp) {
    unsigned char c = s[0];
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (n > len) n = 1; /* truncated: the lead byte alone */
    switch (n) {
    case 2: *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F); break;
    case 3: *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); break;
    case 4:
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
              (s[3] & 0x3F);
        break;
    default: *cp = c;
    }
    return n;
}

size_t mdl_tok_int_utf8_enc(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
