/* server/cmd/cmd_generate.c — `graphswap generate`: prompts in, JSON out.
 * Single prompt (--prompt TEXT or --prompt-ids) or many (--batch-file, JSONL) through the continuous
 * batcher; output objects are printed in input order once everything finished. A text prompt is
 * encoded as POST /tokenize encodes it (special tokens parsed, BOS prepended when the tokenizer has
 * one), so a prompt tried here gives the same ids over HTTP. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/config.h"
#include "models/format/json_guard.h"
#include "models/tokenizer/tokenizer.h"
#include "server/cmd/cmd.h"
#include "server/core/cli.h"
#include "server/core/srv.h"

static const char help[] =
    "usage: graphswap generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3 | --batch-file FILE) [options]\n"
    "\n"
    "Prints {\"token_ids\":[...],\"logprobs\":[...],\"top_logprobs\":[[[id,logprob],...],...],\n"
    "\"finish_reason\":\"length\"|\"stop\",\"text\":\"...\"} (one line per request with --batch-file, in\n"
    "input order; \"text\", the generated tokens decoded without special tokens, when the model folder\n"
    "has a tokenizer).\n"
    "\n"
    "  --prompt TEXT          a text prompt, encoded with the model's tokenizer as POST /tokenize does\n"
    "                         (BOS prepended when the tokenizer has one); the output adds\n"
    "                         \"prompt_token_ids\"\n"
    "  --prompt-ids LIST      comma-separated token ids\n"
    "  --batch-file FILE      JSONL: {\"prompt_ids\":[..],\"max_tokens\":N,\"temperature\":T,\"top_k\":K,\n"
    "                         \"top_p\":P,\"min_p\":P,\"seed\":S,\"logprobs\":K,\"ignore_eos\":B,\"min_tokens\":N,\n"
    "                         \"stop_token_ids\":[..],\"prompt_logprobs\":K,\"presence_penalty\":X,\n"
    "                         \"frequency_penalty\":X,\"repetition_penalty\":X,\"logit_bias\":{\"id\":B}}\n"
    "  --max-tokens N         tokens to generate (default 16)\n"
    "  --min-tokens N         no eos / stop ids before N tokens\n"
    "  --temperature T        0 = greedy (default 0)\n"
    "  --top-k K  --top-p P  --min-p P  --seed S\n"
    "  --logprobs K           report the K best logprobs per token (0..20)\n"
    "  --presence-penalty X  --frequency-penalty X   vLLM's, over the output tokens (in [-2, 2])\n"
    "  --repetition-penalty X vLLM's, over prompt and output tokens (> 0; 1 = off)\n"
    "  --prompt-logprobs K    also score the prompt: \"prompt_logprobs\" (null, then the raw logprob\n"
    "                         of each prompt token after the ones before it), \"prompt_ranks\" and,\n"
    "                         for K > 0, \"prompt_top_logprobs\" (the K best [id,logprob] there)\n"
    "  --ignore-eos           do not stop at the model's eos token\n"
    "  --trace FILE           with --draft: one JSON line per sequence per speculative step\n"
    "                         {\"step\":k,\"start\":pos,\"anchor\":id,\"drafts\":[ids],\"accepted\":n,\"bonus\":id}\n"
    "                         (with --batch-file, each line also has \"request\": its 0-based index)\n"
    "\n"
    "With --draft the output adds \"acceptance_lengths\" (tokens emitted per speculative step) and\n"
    "\"spec\": {drafts, draft_tokens, accepted_tokens, mean_acceptance_length}.\n";

typedef struct {
    eng_request r;
    int32_t *prompt;
    int32_t stop[64];
    int index;
    int prompt_lp; /* -1: no prompt logprobs; else the alternatives per prompt position */
    FILE *trace;
} gen_item;

static void on_spec(eng_request *r, int step, int start, int32_t anchor, const int32_t *drafts, int n_drafts,
                    int accepted, int32_t bonus, void *user)
{
    gen_item *it = user;
    if (!it->trace) return;
    fprintf(it->trace, "{\"request\":%d,\"step\":%d,\"start\":%d,\"anchor\":%d,\"drafts\":[", it->index, step,
            start, anchor);
    for (int i = 0; i < n_drafts; i++) fprintf(it->trace, "%s%d", i ? "," : "", drafts[i]);
    fprintf(it->trace, "],\"accepted\":%d,\"bonus\":%d}\n", accepted, bonus);
    (void)r;
}

static int parse_ids(const char *s, int32_t **out, int *n)
{
    int cap = 16, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    while (v && *s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > 0x7fffffff) break;
        if (k == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) break;
            v = nv;
        }
        v[k++] = (int32_t)x;
        s = end;
        if (*s == ',') s++;
        else if (*s) break;
    }
    if (!v || *s || k == 0) {
        free(v);
        return -1;
    }
    *out = v;
    *n = k;
    return 0;
}

static int alloc_outputs(gen_item *it)
{
    eng_request *r = &it->r;
    r->out_tokens = calloc((size_t)r->max_tokens, sizeof *r->out_tokens);
    r->out_logprobs = calloc((size_t)r->max_tokens, sizeof *r->out_logprobs);
    r->out_top = r->sp.logprobs > 0 ? calloc((size_t)r->max_tokens * (size_t)r->sp.logprobs, sizeof *r->out_top) : NULL;
    r->out_accept_lens = calloc((size_t)r->max_tokens, sizeof *r->out_accept_lens);
    r->on_spec = on_spec;
    r->user = it;
    if (it->prompt_lp >= 0) {
        const size_t np = (size_t)r->n_prompt;
        r->prompt_top = it->prompt_lp;
        r->out_prompt_logprobs = calloc(np, sizeof *r->out_prompt_logprobs);
        r->out_prompt_rank = calloc(np, sizeof *r->out_prompt_rank);
        r->out_prompt_top = r->prompt_top > 0 ? calloc(np * (size_t)r->prompt_top, sizeof *r->out_prompt_top) : NULL;
        if (!r->out_prompt_logprobs || !r->out_prompt_rank || (r->prompt_top > 0 && !r->out_prompt_top)) return -1;
    }
    return r->out_tokens && r->out_logprobs && r->out_accept_lens && (r->sp.logprobs == 0 || r->out_top) ? 0 : -1;
}

static void free_item(gen_item *it)
{
    free(it->prompt);
    free((void *)it->r.sp.logit_bias);
    free(it->r.out_tokens);
    free(it->r.out_logprobs);
    free(it->r.out_top);
    free(it->r.out_accept_lens);
    free(it->r.out_prompt_logprobs);
    free(it->r.out_prompt_rank);
    free(it->r.out_prompt_top);
}

/* [[id, logprob], ...] of k entries */
static cJSON *top_pairs(const eng_toplp *t, int k)
{
    cJSON *step = cJSON_CreateArray();
    for (int j = 0; j < k; j++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(t[j].id));
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(t[j].logprob));
        cJSON_AddItemToArray(step, pair);
    }
    return step;
}

/* The encoding of POST /tokenize (server/core/request.c srv_parse_prompt_text, add_special_tokens
 * true): special tokens parsed, BOS prepended unless the text already starts with it. */
static int encode_prompt(const mdl_tokenizer *tok, const char *text, int vocab, int32_t **out, int *n_out, char *err,
                         size_t errlen)
{
    const size_t len = strlen(text);
    if (len == 0) return snprintf(err, errlen, "--prompt must not be empty"), -1;
    if (!srv_utf8_valid(text, len)) return snprintf(err, errlen, "--prompt is not valid UTF-8"), -1;
    size_t n = 0, got = 0;
    if (mdl_tok_encode(tok, text, len, 1, NULL, 0, &n, err, errlen) != 0) return -1;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    if (!ids) return snprintf(err, errlen, "out of memory"), -1;
    if (mdl_tok_encode(tok, text, len, 1, ids + 1, n, &got, err, errlen) != 0 || got != n) {
        free(ids);
        return -1;
    }
    const int32_t bos = mdl_tok_bos(tok);
    if (bos >= 0 && !(n > 0 && ids[1] == bos)) {
        ids[0] = bos;
        n++;
    } else {
        memmove(ids, ids + 1, n * sizeof *ids);
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) {
            snprintf(err, errlen, "--prompt: token %d is outside the model vocabulary (%d)", ids[i], vocab);
            free(ids);
            return -1;
        }
    if (n == 0) {
        free(ids);
        return snprintf(err, errlen, "--prompt encodes to no tokens"), -1;
    }
    *out = ids;
    *n_out = (int)n;
    return 0;
}

/* The generated ids as text (special tokens skipped, as /v1/completions does by default); NULL
 * without a tokenizer. Invalid UTF-8 (a token cut inside a character) becomes U+FFFD. */
static cJSON *decode_text(const mdl_tokenizer *tok, const int32_t *ids, int n)
{
    if (!tok) return NULL;
    char err[128];
    size_t need = 0, got = 0;
    if (mdl_tok_decode(tok, ids, (size_t)n, 1, NULL, 0, &need, err, sizeof err) != 0) return NULL;
    char *raw = malloc(need + 1);
    if (!raw || mdl_tok_decode(tok, ids, (size_t)n, 1, raw, need, &got, err, sizeof err) != 0 || got != need) {
        free(raw);
        return NULL;
    }
    cJSON *j = srv_json_bytes(raw, need);
    free(raw);
    return j;
}

static void print_result(const eng_request *r, int spec, const mdl_tokenizer *tok, int with_prompt)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *ids = cJSON_AddArrayToObject(o, "token_ids");
    cJSON *lps = cJSON_AddArrayToObject(o, "logprobs");
    for (int i = 0; i < r->n_out; i++) {
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->out_tokens[i]));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(r->out_logprobs[i]));
    }
    if (r->sp.logprobs > 0) {
        cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
        for (int i = 0; i < r->n_out; i++)
            cJSON_AddItemToArray(tops, top_pairs(r->out_top + (size_t)i * (size_t)r->sp.logprobs, r->sp.logprobs));
    }
    if (r->out_prompt_logprobs) { /* entries [1, n_prompt_scored) were written (all, unless aborted) */
        cJSON *pl = cJSON_AddArrayToObject(o, "prompt_logprobs"), *pr = cJSON_AddArrayToObject(o, "prompt_ranks");
        cJSON *pt = r->prompt_top > 0 ? cJSON_AddArrayToObject(o, "prompt_top_logprobs") : NULL;
        for (int i = 0; i < r->n_prompt; i++) {
            const int have = i >= 1 && i < r->n_prompt_scored;
            cJSON_AddItemToArray(pl, have ? cJSON_CreateNumber(r->out_prompt_logprobs[i]) : cJSON_CreateNull());
            cJSON_AddItemToArray(pr, have ? cJSON_CreateNumber(r->out_prompt_rank[i]) : cJSON_CreateNull());
            if (pt)
                cJSON_AddItemToArray(pt, have ? top_pairs(r->out_prompt_top + (size_t)i * (size_t)r->prompt_top,
                                                          r->prompt_top)
                                              : cJSON_CreateNull());
        }
    }
    cJSON_AddStringToObject(o, "finish_reason", eng_finish_name(r->finish));
    cJSON *text = decode_text(tok, r->out_tokens, r->n_out);
    if (text) cJSON_AddItemToObject(o, "text", text);
    if (with_prompt) {
        cJSON *pi = cJSON_AddArrayToObject(o, "prompt_token_ids");
        for (int i = 0; i < r->n_prompt; i++) cJSON_AddItemToArray(pi, cJSON_CreateNumber(r->prompt[i]));
    }
    if (spec) {
        cJSON *al = cJSON_AddArrayToObject(o, "acceptance_lengths");
        for (int i = 0; i < r->n_accept; i++) cJSON_AddItemToArray(al, cJSON_CreateNumber(r->out_accept_lens[i]));
        cJSON *sp = cJSON_AddObjectToObject(o, "spec");
        cJSON_AddNumberToObject(sp, "drafts", (double)r->spec_drafts);
        cJSON_AddNumberToObject(sp, "draft_tokens", (double)r->spec_draft_tokens);
        cJSON_AddNumberToObject(sp, "accepted_tokens", (double)r->spec_accepted);
        cJSON_AddNumberToObject(sp, "mean_acceptance_length",
                                r->spec_drafts ? 1.0 + (double)r->spec_accepted / (double)r->spec_drafts : 0.0);
    }
    char *txt = cJSON_PrintUnformatted(o);
    puts(txt);
    free(txt);
    cJSON_Delete(o);
}

/* One request object of a batch file into *it (defaults from the command line). */
static int parse_line(const char *line, const gen_item *dflt, gen_item *it, char *err, size_t errlen)
{
    char why[160];
    mdl_json_result jr;
    cJSON *j = mdl_json_parse(line, strlen(line), MDL_JSON_MAX_DEPTH, MDL_JSON_OBJECT, &jr, why, sizeof why);
    int rc = -1;
    *it = *dflt;
    it->prompt = NULL;
    if (!j) {
        snprintf(err, errlen, "%s", jr.status == MDL_JSON_E_DEEP ? why : "not a JSON object");
        goto out;
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt_ids");
    int n = cJSON_GetArraySize(p);
    if (!cJSON_IsArray(p) || n < 1) {
        snprintf(err, errlen, "prompt_ids must be a non-empty list of token ids");
        goto out;
    }
    it->prompt = malloc((size_t)n * sizeof *it->prompt);
    if (!it->prompt) goto out;
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(p, i);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 2147483647.0) {
            snprintf(err, errlen, "prompt_ids[%d] is not a token id", i);
            goto out;
        }
        it->prompt[i] = (int32_t)x->valuedouble;
    }
    it->r.prompt = it->prompt;
    it->r.n_prompt = n;
    const cJSON *v;
#define NUM(key, lo, hi, dst)                                                                           \
    if ((v = cJSON_GetObjectItemCaseSensitive(j, key)) != NULL) {                                        \
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= (lo) && v->valuedouble <= (hi))) {                 \
            snprintf(err, errlen, "%s must be a number in [%g, %g]", key, (double)(lo), (double)(hi));    \
            goto out;                                                                                   \
        }                                                                                               \
        dst = v->valuedouble;                                                                           \
    }
    NUM("max_tokens", 1, 1 << 24, it->r.max_tokens);
    NUM("min_tokens", 0, 1 << 24, it->r.min_tokens);
    NUM("temperature", 0, 100, it->r.sp.temperature);
    NUM("top_k", -1, 1 << 24, it->r.sp.top_k);
    NUM("top_p", 0, 1, it->r.sp.top_p);
    NUM("min_p", 0, 1, it->r.sp.min_p);
    NUM("seed", 0, 9007199254740991.0, it->r.sp.seed);
    NUM("logprobs", 0, ENG_MAX_LOGPROBS, it->r.sp.logprobs);
    NUM("prompt_logprobs", 0, ENG_MAX_LOGPROBS, it->prompt_lp);
    NUM("presence_penalty", -2, 2, it->r.sp.presence_penalty);
    NUM("frequency_penalty", -2, 2, it->r.sp.frequency_penalty);
    NUM("repetition_penalty", 1e-30, 1e30, it->r.sp.repetition_penalty);
#undef NUM
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "logit_bias")) != NULL) {
        srv_err se = {0};
        eng_logit_bias *lb;
        int nb;
        if (srv_parse_logit_bias(v, INT32_MAX, &lb, &nb, &se) != 0) { /* ids checked by the engine */
            snprintf(err, errlen, "%s", se.msg);
            goto out;
        }
        it->r.sp.logit_bias = lb;
        it->r.sp.n_logit_bias = nb;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "ignore_eos")) != NULL) it->r.ignore_eos = cJSON_IsTrue(v);
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "stop_token_ids")) != NULL) {
        int ns = cJSON_GetArraySize(v);
        if (!cJSON_IsArray(v) || ns > 64) {
            snprintf(err, errlen, "stop_token_ids must be a list of at most 64 token ids");
            goto out;
        }
        for (int i = 0; i < ns; i++) {
            const cJSON *x = cJSON_GetArrayItem(v, i);
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 2147483647.0) {
                snprintf(err, errlen, "stop_token_ids[%d] is not a token id", i);
                goto out;
            }
            it->stop[i] = (int32_t)x->valuedouble;
        }
        it->r.n_stop_ids = ns; /* r.stop_ids is pointed at it->stop once the array stops moving */
    }
    rc = 0;
out:
    cJSON_Delete(j);
    return rc;
}

int srv_cmd_generate(int argc, char **argv)
{
    srv_runtime_opts ro;
    srv_runtime_defaults(&ro);
    const char *ids = NULL, *batch = NULL, *trace_path = NULL, *prompt_text = NULL;
    gen_item dflt;
    memset(&dflt, 0, sizeof dflt);
    dflt.r.max_tokens = 16;
    dflt.r.sp.top_p = 1.0f;
    dflt.prompt_lp = -1;
    int have_seed = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            fputs(srv_runtime_help, stdout);
            return 0;
        }
        uint64_t seed;
        if (srv_runtime_arg(argc, argv, &i, &ro) || srv_arg_str(argc, argv, &i, "--prompt-ids", &ids) ||
            srv_arg_str(argc, argv, &i, "--prompt", &prompt_text) ||
            srv_arg_str(argc, argv, &i, "--batch-file", &batch) ||
            srv_arg_str(argc, argv, &i, "--trace", &trace_path) ||
            srv_arg_int(argc, argv, &i, "--max-tokens", 1, 1 << 24, &dflt.r.max_tokens) ||
            srv_arg_int(argc, argv, &i, "--min-tokens", 0, 1 << 24, &dflt.r.min_tokens) ||
            srv_arg_float(argc, argv, &i, "--temperature", 0, 100, &dflt.r.sp.temperature) ||
            srv_arg_int(argc, argv, &i, "--top-k", -1, 1 << 24, &dflt.r.sp.top_k) ||
            srv_arg_float(argc, argv, &i, "--top-p", 0, 1, &dflt.r.sp.top_p) ||
            srv_arg_float(argc, argv, &i, "--min-p", 0, 1, &dflt.r.sp.min_p) ||
            srv_arg_int(argc, argv, &i, "--logprobs", 0, ENG_MAX_LOGPROBS, &dflt.r.sp.logprobs) ||
            srv_arg_float(argc, argv, &i, "--presence-penalty", -2, 2, &dflt.r.sp.presence_penalty) ||
            srv_arg_float(argc, argv, &i, "--frequency-penalty", -2, 2, &dflt.r.sp.frequency_penalty) ||
            srv_arg_float(argc, argv, &i, "--repetition-penalty", 1e-30, 1e30, &dflt.r.sp.repetition_penalty) ||
            srv_arg_int(argc, argv, &i, "--prompt-logprobs", 0, ENG_MAX_LOGPROBS, &dflt.prompt_lp) ||
            srv_arg_flag(argc, argv, &i, "--ignore-eos", &dflt.r.ignore_eos))
            continue;
        if (srv_arg_u64(argc, argv, &i, "--seed", &seed)) {
            dflt.r.sp.seed = seed;
            have_seed = 1;
            continue;
        }
        srv_die_usage("generate", argv[i]);
    }
    if (!have_seed) dflt.r.sp.seed = 0; /* generate is reproducible by default */
    if ((ids != NULL) + (batch != NULL) + (prompt_text != NULL) != 1)
        srv_die("give exactly one of --prompt, --prompt-ids or --batch-file");

    gen_item *items = NULL;
    int n_items = 0;
    char err[1024];
    /* the model folder's tokenizer, when it has one: --prompt needs it, and outputs add "text" */
    mdl_tokenizer *tok = NULL;
    if (ro.model_dir) {
        char tokpath[4200];
        snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", ro.model_dir);
        if (access(tokpath, R_OK) == 0 && !(tok = mdl_tok_load(ro.model_dir, err, sizeof err))) srv_die("%s", err);
    }
    if (prompt_text) {
        if (!tok) srv_die("--prompt: %s has no tokenizer (tokenizer.json); use --prompt-ids", ro.model_dir ? ro.model_dir : "the model");
        mdl_config mc;
        if (mdl_config_load(ro.model_dir, &mc, err, sizeof err) != 0) srv_die("%s", err);
        items = calloc(1, sizeof *items);
        if (!items) srv_die("out of memory");
        items[0] = dflt;
        if (encode_prompt(tok, prompt_text, mc.vocab, &items[0].prompt, &items[0].r.n_prompt, err, sizeof err) != 0)
            srv_die("%s", err);
        items[0].r.prompt = items[0].prompt;
        n_items = 1;
    } else if (ids) {
        items = calloc(1, sizeof *items);
        if (!items) srv_die("out of memory");
        items[0] = dflt;
        if (parse_ids(ids, &items[0].prompt, &items[0].r.n_prompt) != 0)
            srv_die("--prompt-ids must be a comma-separated list of token ids");
        items[0].r.prompt = items[0].prompt;
        n_items = 1;
    } else {
        size_t len;
        char *txt = mdl_read_file(batch, 1u << 30, &len, err, sizeof err);
        if (!txt) srv_die("%s", err);
        int cap = 0, lineno = 0;
        for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
            lineno++;
            if (strspn(line, " \t\r") == strlen(line)) continue;
            if (n_items == cap) {
                cap = cap ? cap * 2 : 16;
                gen_item *ni = realloc(items, (size_t)cap * sizeof *ni);
                if (!ni) srv_die("out of memory");
                items = ni;
            }
            if (parse_line(line, &dflt, &items[n_items], err, sizeof err) != 0)
                srv_die("%s line %d: %s", batch, lineno, err);
            n_items++;
        }
        free(txt);
        if (n_items == 0) srv_die("%s holds no requests", batch);
    }

    srv_runtime rt;
    if (srv_runtime_open(&rt, &ro, err, sizeof err) != 0) srv_die("%s", err);
    FILE *trace = NULL;
    if (trace_path) {
        if (!ro.draft_dir) srv_die("--trace needs --draft");
        if (!(trace = fopen(trace_path, "w"))) srv_die("%s: cannot write", trace_path);
    }
    for (int i = 0; i < n_items; i++) {
        items[i].index = i;
        items[i].trace = trace;
        items[i].r.stop_ids = items[i].stop;
        if (alloc_outputs(&items[i]) != 0) srv_die("out of memory");
        int busy;
        if (eng_submit(rt.e, &items[i].r, &busy, err, sizeof err) != 0)
            srv_die("request %d: %s", i + 1, err);
        /* keep the queue bounded for huge batch files */
        while (eng_num_waiting(rt.e) >= eng_get_config(rt.e)->queue_cap - 1) eng_step(rt.e);
    }
    eng_run_until_idle(rt.e);
    for (int i = 0; i < n_items; i++) {
        print_result(&items[i].r, ro.draft_dir != NULL, tok, prompt_text != NULL);
        free_item(&items[i]);
    }
    free(items);
    if (trace && fclose(trace) != 0) srv_die("%s: write error", trace_path);
    srv_runtime_close(&rt);
    mdl_tok_free(tok);
    return 0;
}
