/* tests/fuzz/fuzz_tokenizer.c — libFuzzer harness for mdl_tok_encode / mdl_tok_decode / mdl_tok_piece
 * over the three test tokenizers (tests/data/tokenizer/).
 *
 * Input: byte 0 picks the tokenizer (bits 0-1), encode or decode (bit 2), parse_special (bit 3) and
 * skip_special (bit 4); the rest is the text (encode) or little-endian 16-bit ids (decode).
 * Properties beyond "no crash":
 *   encode: the sizing call (cap 0) and the real call agree; ids lie in [0, vocab); the ids decode;
 *           without a normalizer (gpt2, llama3) decode(encode(text)) == text byte for byte; with the
 *           NFC normalizer (default) encode-decode is idempotent (NFC(NFC(x)) == NFC(x)), and so it is
 *           where gpt2's lstrip / rstrip special tokens (<mask>, <sep>) absorb whitespace.
 *   decode: sizing and real call agree; success implies every id is in range; the output equals the
 *           concatenated mdl_tok_piece bytes; skipping special tokens never lengthens it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* encode + decode; returns the decoded bytes (malloc'd) or NULL when encoding failed */
static char *roundtrip(const mdl_tokenizer *t, const char *text, size_t len, int ps, size_t *out_len)
{
    char err[256] = "";
    size_t n = 0;
    if (mdl_tok_encode(t, text, len, ps, NULL, 0, &n, err, sizeof err) != 0) {
        FZ_CHECK(err[0] != '\0');
        return NULL;
    }
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    FZ_CHECK(ids);
    size_t got = 0;
    FZ_CHECK(mdl_tok_encode(t, text, len, ps, ids, n, &got, err, sizeof err) == 0 && got == n);
    const int32_t vocab = mdl_tok_vocab_size(t);
    for (size_t i = 0; i < n; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < vocab);
    FZ_CHECK(len == 0 || n > 0);
    size_t dn = 0;
    FZ_CHECK(mdl_tok_decode(t, ids, n, 0, NULL, 0, &dn, err, sizeof err) == 0);
    char *out = malloc(dn + 1);
    FZ_CHECK(out);
    size_t dn2 = 0;
    FZ_CHECK(mdl_tok_decode(t, ids, n, 0, out, dn, &dn2, err, sizeof err) == 0 && dn2 == dn);
    free(ids);
    *out_len = dn;
    return out;
}

static void fuzz_encode(int which, int ps, const char *text, size_t len)
{
    const mdl_tokenizer *t = fz_tokenizer(which);
    size_t n1 = 0;
    char *once = roundtrip(t, text, len, ps, &n1);
    if (!once) return;
    const int strips = which == FZ_TOK_GPT2 && ps && (memmem(text, len, "<mask>", 6) || memmem(text, len, "<sep>", 5));
    if (which != FZ_TOK_DEFAULT && !strips) {
        FZ_CHECK(n1 == len && memcmp(once, text, len) == 0);
    } else {
        size_t n2 = 0;
        char *twice = roundtrip(t, once, n1, ps, &n2);
        FZ_CHECK(twice != NULL);
        FZ_CHECK(n2 == n1 && memcmp(twice, once, n1) == 0);
        free(twice);
    }
    free(once);
}

static void fuzz_decode(int which, int skip, const uint8_t *p, size_t size)
{
    const mdl_tokenizer *t = fz_tokenizer(which);
    const int32_t vocab = mdl_tok_vocab_size(t);
    size_t n = size / 2;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    FZ_CHECK(ids);
    for (size_t i = 0; i < n; i++) /* mostly in range, sometimes just past the end or negative */
        ids[i] = (int32_t)((p[2 * i] | p[2 * i + 1] << 8) % (vocab + 4)) - (p[2 * i + 1] == 0xff ? vocab + 4 : 0);
    char err[256] = "";
    size_t dn = 0;
    if (mdl_tok_decode(t, ids, n, skip, NULL, 0, &dn, err, sizeof err) != 0) {
        FZ_CHECK(err[0] != '\0');
        free(ids);
        return;
    }
    for (size_t i = 0; i < n; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < vocab);
    char *out = malloc(dn + 1);
    FZ_CHECK(out);
    size_t dn2 = 0;
    FZ_CHECK(mdl_tok_decode(t, ids, n, skip, out, dn, &dn2, err, sizeof err) == 0 && dn2 == dn);
    /* a short buffer gets a prefix and the full length */
    if (dn > 1) {
        size_t dn3 = 0;
        char *half = malloc(dn / 2);
        FZ_CHECK(half && mdl_tok_decode(t, ids, n, skip, half, dn / 2, &dn3, err, sizeof err) == 0 && dn3 == dn);
        FZ_CHECK(memcmp(half, out, dn / 2) == 0);
        free(half);
    }
    if (!skip) { /* the pieces concatenated */
        char piece[1024];
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            size_t pn = 0;
            FZ_CHECK(mdl_tok_piece(t, ids[i], piece, sizeof piece, &pn) == 0 && pn <= sizeof piece);
            FZ_CHECK(at + pn <= dn && memcmp(out + at, piece, pn) == 0);
            at += pn;
        }
        FZ_CHECK(at == dn);
        size_t ds = 0;
        FZ_CHECK(mdl_tok_decode(t, ids, n, 1, NULL, 0, &ds, err, sizeof err) == 0 && ds <= dn);
    }
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int which = (data[0] & 3) % FZ_TOK_COUNT;
    if (data[0] & 4) fuzz_decode(which, (data[0] >> 4) & 1, data + 1, size - 1);
    else fuzz_encode(which, (data[0] >> 3) & 1, (const char *)data + 1, size - 1);
    return 0;
}
