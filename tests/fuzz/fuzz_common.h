/* tests/fuzz/fuzz_common.h — helpers shared by the libFuzzer harnesses (built with -DGS_FUZZ=ON).
 *
 * fz_small_stack: runs fn(arg) on a worker thread with a civetweb-sized stack (FZ_STACK bytes), so a
 * parser that recurses per nesting level overflows here as it would in a server worker thread
 * (libFuzzer's main thread has 8 MiB and would hide it). ASan reports the overflow as
 * "stack-overflow" and the fuzzer records the input.
 *
 * fz_tokenizer: one of the test tokenizers under tests/data/tokenizer/ (default = ChatML with an
 * NFC normalizer, gpt2 = no chat template, llama3 = Llama-3 template), loaded once. The data folder
 * is GS_FUZZ_DATA (compiled in) unless the environment sets GS_FUZZ_DATA.
 */
#ifndef GS_TESTS_FUZZ_COMMON_H
#define GS_TESTS_FUZZ_COMMON_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "models/tokenizer/tokenizer.h"

/* civetweb's worker threads get CIVETWEB_THREAD_STACK_SIZE (102400 bytes in Debian's build), and
 * civetweb's request handling and the route's frames sit below the body parser: measured with
 * fuzz_http, '['*750 as a /v1/completions prompt overflows the server's worker while '['*600 does
 * not; on this thread cJSON needs about 96 KiB for '['*1000 and 64 KiB overflows near '['*650. So
 * 64 KiB is what a body parser has left (the environment may override it: FZ_STACK_KB). */
#ifndef FZ_STACK
#define FZ_STACK (64 * 1024)
#endif

/* Aborts with a message: the fuzzer records the input as a crash. */
#define FZ_CHECK(cond)                                                                                 \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "fuzz property failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);          \
            abort();                                                                                   \
        }                                                                                              \
    } while (0)

/* One worker thread with the small stack runs every input (a thread per input cost ~40x the
 * executions of fuzz_safetensors); the caller waits for it. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void *(*fn)(void *);
    void *arg;
    int busy;
} fz_worker;

static inline void *fz_worker_main(void *p)
{
    fz_worker *w = p;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->busy) pthread_cond_wait(&w->cv, &w->mu);
        pthread_mutex_unlock(&w->mu);
        w->fn(w->arg);
        pthread_mutex_lock(&w->mu);
        w->busy = 0;
        pthread_cond_broadcast(&w->cv);
    }
    return NULL;
}

static inline void fz_small_stack(void *(*fn)(void *), void *arg)
{
    static fz_worker w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0};
    static int started;
    if (!started) {
        const char *kb = getenv("FZ_STACK_KB");
        const size_t stack = kb && atoi(kb) >= 16 ? (size_t)atoi(kb) * 1024 : FZ_STACK;
        pthread_attr_t a;
        pthread_t t;
        FZ_CHECK(pthread_attr_init(&a) == 0);
        FZ_CHECK(pthread_attr_setstacksize(&a, stack) == 0);
        FZ_CHECK(pthread_create(&t, &a, fz_worker_main, &w) == 0);
        pthread_attr_destroy(&a);
        started = 1;
    }
    pthread_mutex_lock(&w.mu);
    w.fn = fn;
    w.arg = arg;
    w.busy = 1;
    pthread_cond_broadcast(&w.cv);
    while (w.busy) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
}

enum { FZ_TOK_DEFAULT, FZ_TOK_GPT2, FZ_TOK_LLAMA3, FZ_TOK_COUNT };

static inline mdl_tokenizer *fz_tokenizer(int which)
{
    static mdl_tokenizer *tok[FZ_TOK_COUNT];
    static const char *names[FZ_TOK_COUNT] = {"default", "gpt2", "llama3"};
    which %= FZ_TOK_COUNT;
    if (!tok[which]) {
        const char *base = getenv("GS_FUZZ_DATA");
#ifdef GS_FUZZ_DATA
        if (!base) base = GS_FUZZ_DATA;
#endif
        if (!base) base = "tests/data";
        char dir[4096], err[512];
        snprintf(dir, sizeof dir, "%s/tokenizer/%s", base, names[which]);
        tok[which] = mdl_tok_load(dir, err, sizeof err);
        if (!tok[which]) {
            fprintf(stderr, "fuzz: cannot load the tokenizer %s: %s\n", dir, err);
            exit(2);
        }
    }
    return tok[which];
}

#endif
