/* models/tokenizer/tokenizer.h — byte-level BPE tokenizer (Hugging Face tokenizer.json, as used by Qwen2/Qwen3
 * and Llama-3) and the built-in chat templates.
 *
 * Load: tokenizer.json (model.type "BPE" with vocab + merges (either "a b" strings or [a, b] pairs),
 * pre_tokenizer Split(regex) + ByteLevel (or a Sequence of them), decoder ByteLevel, added_tokens
 * with "special", post_processor for add_special_tokens) and tokenizer_config.json (bos_token,
 * eos_token, chat template family).
 * Encode: added tokens are matched first (longest match, left to right) and emitted as their ids
 * (when parse_special is set; otherwise only non-special added tokens are matched); the text between
 * them is split with the pre-tokenizer regex (PCRE2, UTF mode, Unicode properties), each piece mapped
 * byte -> unicode char (GPT-2 bytes_to_unicode) and merged by rank. Output equals the reference
 * `tokenizers` library byte for byte. Decode maps ids back to bytes (special tokens optionally
 * skipped). All input is untrusted: invalid UTF-8 in text, ids out of range and malformed files are
 * errors, never crashes.
 */
#ifndef GS_MDL_TOKENIZER_H
#define GS_MDL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct mdl_tokenizer mdl_tokenizer;

typedef enum {
    MDL_CHAT_NONE = 0, /* no chat template (chat requests are refused) */
    MDL_CHAT_CHATML,   /* Qwen: <|im_start|>role\n...<|im_end|>\n */
    MDL_CHAT_LLAMA3,   /* <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    MDL_CHAT_QWEN3,    /* ChatML as Qwen3's template: <think> blocks, enable_thinking, tool turns */
    MDL_CHAT_LLAMA31,  /* Llama-3.1's template: the system header with "Cutting Knowledge Date" always */
} mdl_chat_family;

/* Loads dir/tokenizer.json and dir/tokenizer_config.json. Returns NULL and writes err on failure
 * (missing file, bad JSON, unsupported model/pre-tokenizer type, unknown chat template). */
mdl_tokenizer *mdl_tok_load(const char *dir, char *err, size_t errlen);
void mdl_tok_free(mdl_tokenizer *t);

int32_t mdl_tok_vocab_size(const mdl_tokenizer *t);       /* max id + 1 over vocab and added tokens */
int32_t mdl_tok_bos(const mdl_tokenizer *t);              /* -1 when none */
int32_t mdl_tok_eos(const mdl_tokenizer *t);              /* -1 when none */
/* The ids add_special_tokens puts before (suffix 0) or after (suffix 1) an encoded text: the
 * tokenizer.json post_processor's single template (TemplateProcessing / Roberta / Bert / Sequence;
 * null and ByteLevel add nothing), as transformers' AutoTokenizer applies it: tokenizer_config.json's
 * bos_token, add_bos_token and add_eos_token do not change it. Returns the count (at most 8) and
 * points *ids at them. Empty text gets them too. */
size_t mdl_tok_special_ids(const mdl_tokenizer *t, int suffix, const int32_t **ids);
mdl_chat_family mdl_tok_chat_family(const mdl_tokenizer *t);
int mdl_tok_is_special(const mdl_tokenizer *t, int32_t id);
int32_t mdl_tok_token_id(const mdl_tokenizer *t, const char *token); /* exact vocab/added lookup, -1 */

/* Encodes text[0..len). Writes up to cap ids to out and the full count to *n (so a first call with
 * cap 0 sizes the buffer). Returns 0, or -1 with err set (invalid UTF-8 names the byte offset). */
int mdl_tok_encode(const mdl_tokenizer *t, const char *text, size_t len, int parse_special,
                   int32_t *out, size_t cap, size_t *n, char *err, size_t errlen);

/* Decodes ids to bytes (may be partial UTF-8 at the end: callers streaming text hold back an
 * incomplete tail). Writes up to cap bytes, full length in *n. Returns 0, or -1 for an id out of
 * range. */
int mdl_tok_decode(const mdl_tokenizer *t, const int32_t *ids, size_t n_ids, int skip_special,
                   char *out, size_t cap, size_t *n, char *err, size_t errlen);

/* The token's own string in the byte-level alphabet decoded to raw bytes (for logprobs "tokens"). */
int mdl_tok_piece(const mdl_tokenizer *t, int32_t id, char *out, size_t cap, size_t *n);

/* Writes a small, valid byte-level BPE tokenizer.json + tokenizer_config.json (ChatML family, Qwen
 * special tokens <|endoftext|> <|im_start|> <|im_end|>) into dir, with ids < vocab_size. Used by
 * `graphswap mkmodel` so the default model speaks text. Deterministic. Returns 0 or -1 with err. */
int mdl_tok_write_default(const char *dir, int32_t vocab_size, char *err, size_t errlen);

#endif
