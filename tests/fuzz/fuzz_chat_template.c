/* tests/fuzz/fuzz_chat_template.c — libFuzzer harness for the built-in chat templates: srv_chat_encode
 * (render the messages with the model's family, then encode with special tokens parsed), on a
 * civetweb-sized stack.
 *
 * Input: byte 0 picks the tokenizer (bits 0-1: default = ChatML, gpt2 = no template, llama3) and
 * add_generation_prompt (bit 2); the rest is the JSON of "messages".
 * Properties beyond "no crash": a model without a template always refuses (400); a rendering
 * decodes to text that starts with the family's opening token and, with add_generation_prompt,
 * ends with the assistant header; ids lie in [0, vocab); a refusal is a 4xx/5xx with a message.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/format/json_guard.h"
#include "server/core/srv.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static srv_state g_state[FZ_TOK_COUNT];

typedef struct {
    const srv_state *s;
    int add_gen;
    const char *body;
    size_t len;
} job;

static int ends_with(const char *s, size_t n, const char *suf)
{
    size_t k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

static void *run(void *arg)
{
    job *j = arg;
    const srv_state *s = j->s;
    /* the server's reader of every body (depth, NUL refused) */
    cJSON *msgs = mdl_json_parse(j->body, j->len, MDL_JSON_MAX_DEPTH, MDL_JSON_REFUSE_NUL, NULL, NULL, 0);
    if (!msgs) return NULL;
    srv_prompt p;
    srv_err e;
    memset(&e, 0, sizeof e);
    srv_chat_opts co = {.add_generation_prompt = j->add_gen, .continue_final_message = 0, .enable_thinking = -1,
                        .date_string = NULL};
    if (srv_chat_encode(s, msgs, &co, &p, &e) != 0) {
        FZ_CHECK(e.status >= 400 && e.status <= 599 && e.msg[0]);
        FZ_CHECK(p.ids == NULL && p.n == 0);
        cJSON_Delete(msgs);
        return NULL;
    }
    FZ_CHECK(s->chat != MDL_CHAT_NONE);
    FZ_CHECK(cJSON_IsArray(msgs) && cJSON_GetArraySize(msgs) >= 1);
    FZ_CHECK(p.n >= 1 && p.ids);
    for (int i = 0; i < p.n; i++) FZ_CHECK(p.ids[i] >= 0 && p.ids[i] < s->vocab);
    char err[256];
    size_t dn = 0;
    FZ_CHECK(mdl_tok_decode(s->tok, p.ids, (size_t)p.n, 0, NULL, 0, &dn, err, sizeof err) == 0);
    char *txt = malloc(dn + 1);
    FZ_CHECK(txt && mdl_tok_decode(s->tok, p.ids, (size_t)p.n, 0, txt, dn, &dn, err, sizeof err) == 0);
    const char *open = s->chat == MDL_CHAT_CHATML ? "<|im_start|>" : "<|begin_of_text|><|start_header_id|>";
    FZ_CHECK(dn >= strlen(open) && memcmp(txt, open, strlen(open)) == 0);
    if (j->add_gen)
        FZ_CHECK(ends_with(txt, dn, s->chat == MDL_CHAT_CHATML ? "<|im_start|>assistant\n"
                                                                 : "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    else
        FZ_CHECK(ends_with(txt, dn, s->chat == MDL_CHAT_CHATML ? "<|im_end|>\n" : "<|eot_id|>"));
    free(txt);
    free(p.ids);
    cJSON_Delete(msgs);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int which = (data[0] & 3) % FZ_TOK_COUNT;
    srv_state *s = &g_state[which];
    if (!s->tok) {
        s->tok = fz_tokenizer(which);
        s->chat = mdl_tok_chat_family(s->tok);
        s->vocab = mdl_tok_vocab_size(s->tok);
        s->model_name = "m";
    }
    job j = {s, (data[0] >> 2) & 1, (const char *)data + 1, size - 1};
    fz_small_stack(run, &j);
    return 0;
}
