/* models/tokenizer/tokenizer_default.c — mdl_tok_write_default: a small but real byte-level BPE tokenizer
 * (Qwen2-style NFC normalizer, Split regex + ByteLevel pre-tokenizer, ByteLevel decoder) learned
 * deterministically by a tiny BPE trainer over the embedded sample text below, plus the Qwen special
 * tokens at the top of the id range and a ChatML tokenizer_config.json. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "models/tokenizer/tokenizer.h"

#include <errno.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "models/tokenizer/tokenizer_internal.h"

#define DEFAULT_MAX_MERGES 1000
#define N_SPECIAL 3

static const char *const SPECIALS[N_SPECIAL] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char CHATML_TEMPLATE[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}";

/* Training text: written for graphswap (English prose and a little code), concatenated in order.
 * Split into parts so no string literal exceeds the 4095 characters every C compiler accepts. */
static const char *const SAMPLE_PARTS[] = {
    "graphswap is a small inference server. It loads a model, reads a prompt, and writes the answer "
    "one token at a time. The server keeps every request in a queue, and the scheduler picks the next "
    "batch of sequences to run. When a sequence is finished, its memory is given back to the pool, and "
    "the next request in the queue can start. The model is the same for every request, but the weights "
    "can change while the server is running: a trainer sends new weights, the server checks them, and "
    "the next step uses them.\n\n",
    "A tokenizer turns text into numbers. The text is first split into small pieces: words, numbers, "
    "spaces, and punctuation. Each piece is then written as bytes, and the bytes are merged into larger "
    "tokens by a list of merge rules. The rules were learned from sample text like this one, so common "
    "words such as the, and, is, of, to, in, and that become single tokens, while rare words stay split "
    "into smaller parts. When we decode, we simply join the bytes of every token and read them back as "
    "text.\n\n",
    "Why does this matter? Because the model only sees token ids. If the tokenizer on the server does not "
    "match the tokenizer that was used in training, the model reads the wrong numbers and the answer is "
    "wrong. That is why we test the tokenizer against a reference, line by line, and token by token.\n\n",
    "Here is a short story. The cat sat on the mat, and the dog sat on the log. They were both happy, "
    "and they were both tired. The sun was warm, the wind was soft, and the day was long. In the evening "
    "the cat walked home, and the dog walked with it. They did not talk, because cats and dogs do not "
    "talk, but they were good friends all the same. The next morning they met again at the same place, "
    "and the story started over.\n\n",
    "Numbers are split into single digits: 2024, 3.14159, 42, 1000000, and 7 are all read one digit at "
    "a time. Dates such as 2024-05-17 and times such as 10:30 are split the same way. Prices like $19.99 "
    "or 5% are common in text, and so are versions like v1.2.3.\n\n",
    "Some words have accents: caf\xc3\xa9, na\xc3\xafve, r\xc3\xa9sum\xc3\xa9, and fa\xc3\xa7" "ade. "
    "Some text uses other scripts, but this sample is mostly English so the merges stay easy to read.\n\n",
    "The server is written in C. Here is a small piece of code:\n\n",
    "#include <stdio.h>\n"
    "#include <stdlib.h>\n\n",
    "static int add(int a, int b) {\n"
    "    return a + b;\n"
    "}\n\n",
    "int main(int argc, char **argv) {\n"
    "    int total = 0;\n"
    "    for (int i = 1; i < argc; i++) {\n"
    "        total = add(total, atoi(argv[i]));\n"
    "    }\n"
    "    printf(\"total = %d\\n\", total);\n"
    "    return 0;\n"
    "}\n\n",
    "And here is the same idea in Python:\n\n",
    "def add(a, b):\n"
    "    return a + b\n\n",
    "def main(args):\n"
    "    total = 0\n"
    "    for value in args:\n"
    "        total = add(total, int(value))\n"
    "    print(f\"total = {total}\")\n"
    "    return total\n\n",
    "if __name__ == \"__main__\":\n"
    "    import sys\n"
    "    main(sys.argv[1:])\n\n",
    "A request to the server is a small JSON object: {\"model\": \"default\", \"prompt\": \"Hello, world\", "
    "\"max_tokens\": 16, \"temperature\": 0.0}. The response has the text, the token ids, and the "
    "weight version that produced them. A chat request has a list of messages instead of a prompt, and "
    "each message has a role and some content: the system message sets the rules, the user message asks "
    "the question, and the assistant message is the answer.\n\n",
    "When the trainer sends new weights, the server opens a load session. Each bucket of weights is "
    "written in place, and the server keeps track of which parts have arrived. When the session is "
    "finished, the server checks that every part is there, updates the derived buffers, and bumps the "
    "weight version. If anything is missing, the session fails and the server refuses to generate until "
    "a complete update arrives. This is the rule: never run on partial weights, never read freed memory, "
    "and never reuse a cache that was built from old weights.\n\n",
    "Tests are part of the code. Every module has unit tests, the server has integration tests, and the "
    "tokenizer has reference tests that compare every token id with the reference library. If a test "
    "fails, the change does not land. Good tests are short, fast, and easy to read; they check one "
    "thing at a time, and they say clearly what went wrong when they fail.\n\n",
    "The quick brown fox jumps over the lazy dog. The five boxing wizards jump quickly. How vexingly "
    "quick daft zebras jump! Pack my box with five dozen liquor jugs. Sphinx of black quartz, judge my "
    "vow. We're sure it's fine; they've said so, and I'll check again if you'd like. I'm done.\n\n",
    "Speculative decoding makes generation faster without changing the answer. A small drafter model "
    "guesses the next few tokens, and the large target model checks all of the guesses in one step. "
    "Every guess that the target agrees with is accepted, and the first guess that it rejects is "
    "replaced by the target's own choice. The acceptance length tells how many tokens were accepted per "
    "step on average; a longer acceptance length means fewer steps and a faster answer. Because the "
    "target always checks the draft, the output is exactly the same as without the drafter.\n\n",
    "A captured graph replays the same kernels with the same pointers every step. Anything that changes "
    "from step to step, such as token ids, positions, and sequence lengths, is written into parameter "
    "buffers before each launch. The buffers themselves never move, so the graph stays valid for as long "
    "as the server runs. Weight updates write into the same buffers in place, which is why the server "
    "can take new weights without capturing the graphs again.\n\n",
    "Configuration lives in a small file next to the weights: the number of layers, the hidden size, "
    "the number of attention heads, the vocabulary size, and the rope settings. The server reads the "
    "file, checks every value, and refuses to start when something is missing or out of range. Clear "
    "error messages save time: they name the file, the field, and the value that was wrong.\n",
};

static void seterr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- trainer state ---- */
typedef struct {
    char *s; /* token string (byte-level alphabet, UTF-8) */
    size_t len;
} tstr;

typedef struct {
    const char *p; /* raw bytes in the sample text */
    size_t len;
} piece;

typedef struct {
    int32_t *sym;
    size_t n;
    uint32_t count;
} word;

typedef struct {
    uint32_t key; /* (a << 16) | b, UINT32_MAX empty */
    uint32_t count;
} pair_ent;

static int piece_cmp(const void *a, const void *b) {
    const piece *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, n);
    if (c) return c;
    return x->len < y->len ? -1 : (x->len > y->len);
}

static uint32_t pair_hash(uint32_t k) {
    k ^= k >> 16;
    k *= 0x7feb352dU;
    k ^= k >> 15;
    k *= 0x846ca68bU;
    k ^= k >> 16;
    return k;
}

static int byte_id_cmp(const void *a, const void *b) {
    uint32_t x = mdl_tok_int_byte_cp(*(const uint8_t *)a), y = mdl_tok_int_byte_cp(*(const uint8_t *)b);
    return x < y ? -1 : (x > y);
}


typedef struct {
    tstr *tok;   /* id -> string */
    size_t ntok;
    int32_t (*merges)[2];
    size_t nmerges;
} trained;

static void trained_free(trained *t) {
    if (t->tok)
        for (size_t i = 0; i < t->ntok; i++) free(t->tok[i].s);
    free(t->tok);
    free(t->merges);
}

static int train(size_t max_merges, trained *tr, char *err, size_t errlen) {
    int rc = -1;
    piece *pieces = NULL;
    word *words = NULL;
    size_t npieces = 0, nwords = 0;
    pair_ent *pairs = NULL;
    char *text = NULL;
    pcre2_match_data *md = NULL;
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)QWEN2_REGEX, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &ec, &eo, NULL);
    memset(tr, 0, sizeof *tr);
    if (!re) {
        seterr(err, errlen, "internal error: cannot compile the pre-tokenizer regex");
        return -1;
    }
    md = pcre2_match_data_create(1, NULL);
    size_t text_len = 0, nparts = sizeof SAMPLE_PARTS / sizeof SAMPLE_PARTS[0];
    for (size_t i = 0; i < nparts; i++) text_len += strlen(SAMPLE_PARTS[i]);
    text = malloc(text_len + 1);
    if (!text) goto oom;
    text[0] = 0;
    for (size_t i = 0, o = 0; i < nparts; i++) {
        size_t l = strlen(SAMPLE_PARTS[i]);
        memcpy(text + o, SAMPLE_PARTS[i], l + 1);
        o += l;
    }
    size_t cap = text_len + 1;
    pieces = malloc(cap * sizeof *pieces);
    tr->tok = calloc(256 + max_merges, sizeof *tr->tok);
    tr->merges = malloc((max_merges ? max_merges : 1) * sizeof *tr->merges);
    if (!md || !pieces || !tr->tok || !tr->merges) goto oom;
    /* pre-tokenize the sample text */
    size_t from = 0;
    while (from < text_len) {
        int r = pcre2_match(re, (PCRE2_SPTR)text, text_len, from, 0, md, NULL);
        if (r < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] <= ov[0]) break; /* the pattern never matches empty */
        pieces[npieces++] = (piece){text + ov[0], ov[1] - ov[0]};
        from = ov[1];
    }
    qsort(pieces, npieces, sizeof *pieces, piece_cmp);
    /* byte alphabet: ids 0..255 in code point order of the byte-level characters */
    uint8_t order[256];
    int32_t byte_id[256];
    for (int b = 0; b < 256; b++) order[b] = (uint8_t)b;
    qsort(order, 256, 1, byte_id_cmp);
    for (int i = 0; i < 256; i++) {
        byte_id[order[i]] = i;
        char buf[4];
        size_t l = mdl_tok_int_utf8_enc(mdl_tok_int_byte_cp(order[i]), buf);
        tr->tok[i].s = malloc(l + 1);
        if (!tr->tok[i].s) goto oom;
        memcpy(tr->tok[i].s, buf, l);
        tr->tok[i].s[l] = 0;
        tr->tok[i].len = l;
    }
    tr->ntok = 256;
    /* unique words with counts */
    words = calloc(npieces ? npieces : 1, sizeof *words);
    if (!words) goto oom;
    size_t total_syms = 0;
    for (size_t i = 0; i < npieces; i++) {
        if (nwords > 0 && piece_cmp(&pieces[i], &pieces[i - 1]) == 0) {
            words[nwords - 1].count++;
            continue;
        }
        word *w = &words[nwords++];
        w->sym = malloc(pieces[i].len * sizeof *w->sym);
        if (!w->sym) goto oom;
        for (size_t k = 0; k < pieces[i].len; k++) w->sym[k] = byte_id[(unsigned char)pieces[i].p[k]];
        w->n = pieces[i].len;
        w->count = 1;
        total_syms += w->n;
    }
    size_t pcap = 16;
    while (pcap < total_syms * 2 + 2) pcap <<= 1;
    pairs = malloc(pcap * sizeof *pairs);
    if (!pairs) goto oom;
    /* merge loop: the most frequent adjacent pair (count >= 2), ties to the smaller (left, right) */
    while (tr->nmerges < max_merges) {
        for (size_t i = 0; i < pcap; i++) pairs[i].key = UINT32_MAX;
        for (size_t w = 0; w < nwords; w++) {
            for (size_t k = 0; k + 1 < words[w].n; k++) {
                uint32_t key = ((uint32_t)words[w].sym[k] << 16) | (uint32_t)words[w].sym[k + 1];
                size_t h = pair_hash(key) & (pcap - 1);
                while (pairs[h].key != UINT32_MAX && pairs[h].key != key) h = (h + 1) & (pcap - 1);
                if (pairs[h].key == UINT32_MAX) {
                    pairs[h].key = key;
                    pairs[h].count = 0;
                }
                pairs[h].count += words[w].count;
            }
        }
        uint32_t best = UINT32_MAX, best_count = 1;
        for (size_t i = 0; i < pcap; i++) {
            if (pairs[i].key == UINT32_MAX) continue;
            if (pairs[i].count > best_count || (pairs[i].count == best_count && pairs[i].key < best)) {
                best = pairs[i].key;
                best_count = pairs[i].count;
            }
        }
        if (best == UINT32_MAX) break; /* nothing occurs twice any more */
        int32_t a = (int32_t)(best >> 16), b = (int32_t)(best & 0xFFFF);
        size_t nl = tr->tok[a].len + tr->tok[b].len;
        char *ns = malloc(nl + 1);
        if (!ns) goto oom;
        memcpy(ns, tr->tok[a].s, tr->tok[a].len);
        memcpy(ns + tr->tok[a].len, tr->tok[b].s, tr->tok[b].len);
        ns[nl] = 0;
        int32_t nid = -1;
        for (size_t i = 0; i < tr->ntok; i++)
            if (tr->tok[i].len == nl && memcmp(tr->tok[i].s, ns, nl) == 0) nid = (int32_t)i;
        if (nid < 0) {
            nid = (int32_t)tr->ntok++;
            tr->tok[nid].s = ns;
            tr->tok[nid].len = nl;
        } else {
            free(ns);
        }
        tr->merges[tr->nmerges][0] = a;
        tr->merges[tr->nmerges][1] = b;
        tr->nmerges++;
        for (size_t w = 0; w < nwords; w++) {
            size_t o = 0;
            for (size_t k = 0; k < words[w].n; k++) {
                if (k + 1 < words[w].n && words[w].sym[k] == a && words[w].sym[k + 1] == b) {
                    words[w].sym[o++] = nid;
                    k++;
                } else {
                    words[w].sym[o++] = words[w].sym[k];
                }
            }
            words[w].n = o;
        }
    }
    rc = 0;
    goto done;
oom:
    seterr(err, errlen, "out of memory");
done:
    if (words)
        for (size_t i = 0; i < nwords; i++) free(words[i].sym);
    free(words);
    free(pieces);
    free(pairs);
    free(text);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    if (rc) trained_free(tr);
    return rc;
}

static void put_json_str(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void put_json_cstr(FILE *f, const char *s) { put_json_str(f, s, strlen(s)); }

static int close_file(FILE *f, const char *path, char *err, size_t errlen) {
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        seterr(err, errlen, "cannot write %s", path);
        return -1;
    }
    return 0;
}

static int write_tokenizer_json(const char *path, const trained *tr, int32_t vocab_size, char *err,
                                size_t errlen) {
    FILE *f = fopen(path, "w");
    if (!f) {
        seterr(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    static const char bl[] = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
                             "\"use_regex\": false}";
    fputs("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [\n", f);
    for (int i = 0; i < N_SPECIAL; i++) {
        fprintf(f, "    {\"id\": %d, \"content\": ", (int)(vocab_size - N_SPECIAL + i));
        put_json_cstr(f, SPECIALS[i]);
        fprintf(f, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
                   "\"special\": true}%s\n",
                i + 1 < N_SPECIAL ? "," : "");
    }
    fputs("  ],\n  \"normalizer\": {\"type\": \"NFC\"},\n", f);
    fputs("  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n", f);
    fputs("    {\"type\": \"Split\", \"pattern\": {\"Regex\": ", f);
    put_json_cstr(f, QWEN2_REGEX);
    fputs("}, \"behavior\": \"Isolated\", \"invert\": false},\n", f);
    fprintf(f, "    %s\n  ]},\n", bl);
    fprintf(f, "  \"post_processor\": %s,\n  \"decoder\": %s,\n", bl, bl);
    fputs("  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
          "    \"continuing_subword_prefix\": \"\",\n    \"end_of_word_suffix\": \"\",\n"
          "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
          "    \"vocab\": {\n",
          f);
    for (size_t i = 0; i < tr->ntok; i++) {
        fputs("      ", f);
        put_json_str(f, tr->tok[i].s, tr->tok[i].len);
        fprintf(f, ": %zu,\n", i);
    }
    for (int i = 0; i < N_SPECIAL; i++) {
        fputs("      ", f);
        put_json_cstr(f, SPECIALS[i]);
        fprintf(f, ": %d%s\n", (int)(vocab_size - N_SPECIAL + i), i + 1 < N_SPECIAL ? "," : "");
    }
    fputs("    },\n    \"merges\": [\n", f);
    for (size_t i = 0; i < tr->nmerges; i++) {
        const tstr *a = &tr->tok[tr->merges[i][0]], *b = &tr->tok[tr->merges[i][1]];
        size_t n = a->len + b->len + 1;
        char *s = malloc(n);
        if (!s) {
            fclose(f);
            seterr(err, errlen, "out of memory");
            return -1;
        }
        memcpy(s, a->s, a->len);
        s[a->len] = ' '; /* byte-level tokens never contain a space (it is written as U+0120) */
        memcpy(s + a->len + 1, b->s, b->len);
        fputs("      ", f);
        put_json_str(f, s, n);
        fputs(i + 1 < tr->nmerges ? ",\n" : "\n", f);
        free(s);
    }
    fputs("    ]\n  }\n}\n", f);
    return close_file(f, path, err, errlen);
}

static int write_config_json(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "w");
    if (!f) {
        seterr(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    fputs("{\n  \"add_bos_token\": false,\n  \"add_prefix_space\": false,\n  \"bos_token\": null,\n"
          "  \"eos_token\": \"<|im_end|>\",\n  \"pad_token\": \"<|endoftext|>\",\n  \"unk_token\": null,\n"
          "  \"clean_up_tokenization_spaces\": false,\n  \"errors\": \"replace\",\n"
          "  \"model_max_length\": 32768,\n  \"split_special_tokens\": false,\n"
          "  \"tokenizer_class\": \"Qwen2Tokenizer\",\n  \"chat_template\": ",
          f);
    put_json_cstr(f, CHATML_TEMPLATE);
    fputs("\n}\n", f);
    return close_file(f, path, err, errlen);
}

int mdl_tok_write_default(const char *dir, int32_t vocab_size, char *err, size_t errlen) {
    if (!dir || !*dir) {
        seterr(err, errlen, "no directory given");
        return -1;
    }
    if (vocab_size < 256 + N_SPECIAL || vocab_size > (1 << 24)) {
        seterr(err, errlen, "default tokenizer needs %d <= vocab_size <= %d (got %d)", 256 + N_SPECIAL,
               1 << 24, (int)vocab_size);
        return -1;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        seterr(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    size_t max_merges = (size_t)(vocab_size - 256 - N_SPECIAL);
    if (max_merges > DEFAULT_MAX_MERGES) max_merges = DEFAULT_MAX_MERGES;
    trained tr;
    if (train(max_merges, &tr, err, errlen)) return -1;
    size_t pl = strlen(dir) + 32;
    char *path = malloc(pl);
    int rc = -1;
    if (!path) {
        seterr(err, errlen, "out of memory");
        goto done;
    }
    snprintf(path, pl, "%s/tokenizer.json", dir);
    if (write_tokenizer_json(path, &tr, vocab_size, err, errlen)) goto done;
    snprintf(path, pl, "%s/tokenizer_config.json", dir);
    if (write_config_json(path, err, errlen)) goto done;
    rc = 0;
done:
    free(path);
    trained_free(&tr);
    return rc;
}
