/* server/core/cli.h — command-line parsing helpers shared by the subcommands, and the runtime bundle
 * (backend + model + engine) every subcommand that computes opens the same way. The commands
 * themselves: server/cmd/cmd.h, bench/bench.h, server/server.h (serve). */
#ifndef GS_SRV_CLI_H
#define GS_SRV_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* Options are "--name value" or "--flag". srv_arg_* return 1 when argv[*i] matched (advancing *i
 * past a value), 0 when it did not, and exit(2) with a message on a bad value. */
int srv_arg_flag(int argc, char **argv, int *i, const char *name, int *out);
int srv_arg_int(int argc, char **argv, int *i, const char *name, long lo, long hi, int *out);
int srv_arg_u64(int argc, char **argv, int *i, const char *name, uint64_t *out);
int srv_arg_float(int argc, char **argv, int *i, const char *name, double lo, double hi, float *out);
int srv_arg_str(int argc, char **argv, int *i, const char *name, const char **out);
void srv_die_usage(const char *cmd, const char *arg); /* unknown option: exit(2) */
/* 1 when the comma-separated list (an option's value, e.g. "a,b,c") has the item name */
int srv_list_has(const char *list, const char *name);
void srv_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

typedef struct {
    const char *model_dir;
    const char *draft_dir; /* DFlash / DSpark drafter (NULL: none) */
    const char *backend;   /* "cpu" (default) or "cuda" */
    size_t gpu_arena_bytes; /* CUDA arena (0: all free device memory but 2 GiB) */
    int threads;
    int checked;
    int bf16_activations; /* --bf16-activations[=amx|pairs|off] (CPU backend): a KERN_BF16_ACT_* mode */
    const char *quantization; /* --quantization fp8: online block FP8 of a bf16 / f32 checkpoint */
    int quant_b0, quant_b1;   /* --quantization-block ROWS,COLS (default 128,128) */
    int quant_lm_head;        /* --quantize-lm-head: with --quantization fp8, the target's lm_head too */
    const char *draft_quantization; /* --draft-quantization fp8|none (NULL: as quantization) */
    eng_config ecfg;
} srv_runtime_opts;

typedef struct {
    eng_backend *be;
    mdl_model *m;
    mdl_model *draft;
    eng_engine *e;
    /* start-up timings for the operator log: checkpoint loads, engine creation (plan capture) */
    double load_ms, draft_load_ms, engine_ms;
} srv_runtime;

void srv_runtime_defaults(srv_runtime_opts *o);
/* Parses the options every engine-running command shares (--model, --threads, --checked,
 * --max-seqs, --max-step-tokens, --prefill-chunk, --max-model-len, --kv-cache-mb, --eager). */
int srv_runtime_arg(int argc, char **argv, int *i, srv_runtime_opts *o);
extern const char srv_runtime_help[];
int srv_runtime_open(srv_runtime *rt, const srv_runtime_opts *o, char *err, size_t errlen);
void srv_runtime_close(srv_runtime *rt);
/* A symbol of the CUDA module (libgraphswap_cuda.so) once --backend cuda has loaded it; NULL
 * otherwise (CPU backend, or a build without CUDA). The GPU weight transports are reached this way. */
void *srv_cuda_symbol(const char *name);

#endif
