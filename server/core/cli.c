#include "server/core/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/http/log.h"

#ifdef GS_HAVE_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

static void *cuda_module; /* the dlopen'ed libgraphswap_cuda.so (NULL until --backend cuda loads it) */

/* The CUDA backend lives in libgraphswap_cuda.so next to the binary (see cmake/cuda.cmake for why
 * it is not linked in). */
static eng_backend *cuda_backend_create(const eng_backend_config *cfg, char *err, size_t errlen)
{
    char exe[PATH_MAX], path[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(err, errlen, "--backend cuda: cannot locate the graphswap binary");
        return NULL;
    }
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(path, sizeof path, "%s/libgraphswap_cuda.so", exe);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cuda_module = h;
    if (!h) {
        snprintf(err, errlen, "--backend cuda: %s", dlerror());
        return NULL;
    }
    eng_backend *(*create)(const eng_backend_config *, char *, size_t);
    *(void **)&create = dlsym(h, "eng_backend_cuda_create");
    if (!create) {
        snprintf(err, errlen, "--backend cuda: %s has no eng_backend_cuda_create", path);
        return NULL;
    }
    return create(cfg, err, errlen); /* the module stays loaded for the process's lifetime */
}
#endif

void *srv_cuda_symbol(const char *name)
{
#ifdef GS_HAVE_CUDA
    return cuda_module ? dlsym(cuda_module, name) : NULL;
#else
    (void)name;
    return NULL;
#endif
}

void srv_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("graphswap: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

void srv_die_usage(const char *cmd, const char *arg)
{
    fprintf(stderr, "graphswap %s: unknown option %s (see graphswap %s --help)\n", cmd, arg, cmd);
    exit(2);
}

static const char *value_of(int argc, char **argv, int *i, const char *name)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "graphswap: option %s needs a value\n", name);
        exit(2);
    }
    return argv[++*i];
}

int srv_arg_flag(int argc, char **argv, int *i, const char *name, int *out)
{
    (void)argc;
    if (strcmp(argv[*i], name) != 0) return 0;
    *out = 1;
    return 1;
}

int srv_list_has(const char *list, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *c = strchr(p, ',');
        const size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        if (!c) break;
        p = c + 1;
    }
    return 0;
}

int srv_arg_str(int argc, char **argv, int *i, const char *name, const char **out)
{
    if (strcmp(argv[*i], name) != 0) return 0;
    *out = value_of(argc, argv, i, name);
    return 1;
}

int srv_arg_int(int argc, char **argv, int *i, const char *name, long lo, long hi, int *out)
{
    if (strcmp(argv[*i], name) != 0) return 0;
    const char *v = value_of(argc, argv, i, name);
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "graphswap: option %s: '%s' is not an integer in [%ld, %ld]\n", name, v, lo, hi);
        exit(2);
    }
    *out = (int)x;
    return 1;
}

int srv_arg_u64(int argc, char **argv, int *i, const char *name, uint64_t *out)
{
    if (strcmp(argv[*i], name) != 0) return 0;
    const char *v = value_of(argc, argv, i, name);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || end == v || v[0] == '-') {
        fprintf(stderr, "graphswap: option %s: '%s' is not a non-negative integer\n", name, v);
        exit(2);
    }
    *out = x;
    return 1;
}

int srv_arg_float(int argc, char **argv, int *i, const char *name, double lo, double hi, float *out)
{
    if (strcmp(argv[*i], name) != 0) return 0;
    const char *v = value_of(argc, argv, i, name);
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || *end || end == v || !(x >= lo && x <= hi)) {
        fprintf(stderr, "graphswap: option %s: '%s' is not a number in [%g, %g]\n", name, v, lo, hi);
        exit(2);
    }
    *out = (float)x;
    return 1;
}

void srv_runtime_defaults(srv_runtime_opts *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 0;
    const char *chk = getenv("GRAPHSWAP_CHECKED");
    o->checked = chk && strcmp(chk, "1") == 0;
    eng_config_defaults(&o->ecfg);
}

const char srv_runtime_help[] =
    "\n"
    "Engine options (serve, generate, bench):\n"
    "  --model DIR            Hugging Face checkpoint folder (config.json + safetensors)\n"
    "  --backend cpu|cuda     where the model runs (default cpu; cuda needs a build with nvcc)\n"
    "  --gpu-memory-mb N      CUDA arena size (default: all free device memory but 2 GiB)\n"
    "  --threads N            CPU worker threads (default: all cores)\n"
    "  --checked              verify every baked plan pointer at replay (also GRAPHSWAP_CHECKED=1)\n"
    "  --quantization fp8     store the projections of a bf16 / f16 / f32 checkpoint as block FP8\n"
    "                         (e4m3 + f32 scales per --quantization-block ROWS,COLS, default 128,128),\n"
    "                         quantized as each tensor arrives (cold load and every update); W8A16;\n"
    "                         the --draft drafter too (unless it is FP8 already, or\n"
    "                         --draft-quantization none)\n"
    "  --quantize-lm-head     with --quantization fp8: the target's (untied) lm_head as block FP8\n"
    "                         too, so decoding reads one byte per weight of every matrix, as\n"
    "                         llama.cpp's Q8_0 does (default off: vLLM and SGLang keep it bf16)\n"
    "  --draft-quantization fp8|none\n"
    "                         the drafter's online FP8 on its own (default: as --quantization)\n"
    "  --bf16-activations     CPU, bf16 weights: round each matmul's activations to bf16 and sum\n"
    "                         bf16 products in pairs as vdpbf16ps does (as llama.cpp does; about\n"
    "                         twice the prefill matmul rate on CPUs with AVX512_BF16, the same bits\n"
    "                         elsewhere, slower there); default off: activations stay f32\n"
    "  --bf16-activations=amx the same rounding, bf16 products summed in Intel AMX's TDPBF16PS\n"
    "                         order (native where the CPU has AMX: about 3x the prefill rate of\n"
    "                         f32 activations; an exact, slow emulation elsewhere); =pairs is the\n"
    "                         plain flag, =off the default. FP8 weights (either mode): each\n"
    "                         weight dequantized and rounded to bf16, then the pairs order (as\n"
    "                         SGLang's CPU backend runs FP8)\n"
    "  --eager                run the op tape each step instead of replaying captured plans\n"
    "  --max-seqs N           concurrent sequences (default 64)\n"
    "  --max-step-tokens N    rows of the largest plan bucket (default 256)\n"
    "  --prefill-chunk N      prompt tokens of one sequence per step (default 256)\n"
    "  --max-model-len N      prompt + generated tokens per sequence (default min(4096, model))\n"
    "  --kv-cache-mb N        KV cache budget in MiB (default 512)\n"
    "  --no-prefix-caching    do not share KV blocks of identical prompt prefixes\n"
    "  --draft DIR            speculative decoding with a DFlash or DSpark drafter checkpoint\n"
    "  --num-spec-tokens N    drafts verified per step at most (default: the drafter's width)\n"
    "  --spec-confidence-threshold X\n"
    "                         DSpark: verify drafts only up to the first slot whose confidence is\n"
    "                         below X (per slot, as DeepSpec serves; default 0 = never cut)\n";

int srv_runtime_arg(int argc, char **argv, int *i, srv_runtime_opts *o)
{
    int eager = 0, kv_mb = 0, no_prefix = 0, gpu_mb = 0;
    if (srv_arg_str(argc, argv, i, "--backend", &o->backend)) {
        if (strcmp(o->backend, "cpu") != 0 && strcmp(o->backend, "cuda") != 0) {
            fprintf(stderr, "graphswap: --backend must be cpu or cuda\n");
            exit(2);
        }
        return 1;
    }
    if (srv_arg_int(argc, argv, i, "--gpu-memory-mb", 1, 1 << 30, &gpu_mb)) {
        o->gpu_arena_bytes = (size_t)gpu_mb << 20;
        return 1;
    }
    if (strncmp(argv[*i], "--bf16-activations=", 19) == 0) {
        const char *v = argv[*i] + 19;
        if (strcmp(v, "amx") == 0)
            o->bf16_activations = KERN_BF16_ACT_AMX;
        else if (strcmp(v, "pairs") == 0 || strcmp(v, "on") == 0)
            o->bf16_activations = KERN_BF16_ACT_PAIRS;
        else if (strcmp(v, "off") == 0)
            o->bf16_activations = KERN_BF16_ACT_OFF;
        else {
            fprintf(stderr, "graphswap: --bf16-activations= must be amx, pairs or off\n");
            exit(2);
        }
        return 1;
    }
    if (srv_arg_str(argc, argv, i, "--quantization", &o->quantization)) {
        if (strcmp(o->quantization, "fp8") != 0) {
            fprintf(stderr, "graphswap: --quantization must be fp8 (online block FP8 of the projections)\n");
            exit(2);
        }
        return 1;
    }
    if (srv_arg_str(argc, argv, i, "--draft-quantization", &o->draft_quantization)) {
        if (strcmp(o->draft_quantization, "fp8") != 0 && strcmp(o->draft_quantization, "none") != 0) {
            fprintf(stderr, "graphswap: --draft-quantization must be fp8 or none\n");
            exit(2);
        }
        return 1;
    }
    if (srv_arg_flag(argc, argv, i, "--quantize-lm-head", &o->quant_lm_head)) return 1;
    const char *qb = NULL;
    if (srv_arg_str(argc, argv, i, "--quantization-block", &qb)) {
        if (sscanf(qb, "%d,%d", &o->quant_b0, &o->quant_b1) != 2 || o->quant_b0 < 1 || o->quant_b0 > 65536 ||
            o->quant_b1 < 16 || o->quant_b1 > 65536 || (o->quant_b1 & (o->quant_b1 - 1))) {
            fprintf(stderr, "graphswap: --quantization-block ROWS,COLS: rows >= 1, columns a power of two >= 16\n");
            exit(2);
        }
        return 1;
    }
    if (srv_arg_flag(argc, argv, i, "--no-prefix-caching", &no_prefix)) {
        o->ecfg.prefix_caching = 0;
        return 1;
    }
    if (srv_arg_str(argc, argv, i, "--model", &o->model_dir) ||
        srv_arg_str(argc, argv, i, "--draft", &o->draft_dir) ||
        srv_arg_int(argc, argv, i, "--num-spec-tokens", 1, 64, &o->ecfg.num_spec_tokens) ||
        srv_arg_float(argc, argv, i, "--spec-confidence-threshold", 0, 1, &o->ecfg.spec_conf_threshold) ||
        srv_arg_int(argc, argv, i, "--threads", 1, 256, &o->threads) ||
        srv_arg_flag(argc, argv, i, "--checked", &o->checked) ||
        srv_arg_flag(argc, argv, i, "--bf16-activations", &o->bf16_activations) ||
        srv_arg_int(argc, argv, i, "--max-seqs", 1, 4096, &o->ecfg.max_seqs) ||
        srv_arg_int(argc, argv, i, "--max-step-tokens", 1, 16384, &o->ecfg.max_step_tokens) ||
        srv_arg_int(argc, argv, i, "--prefill-chunk", 1, 1 << 20, &o->ecfg.prefill_chunk) ||
        srv_arg_int(argc, argv, i, "--max-model-len", 2, 1 << 24, &o->ecfg.max_model_len))
        return 1;
    if (srv_arg_flag(argc, argv, i, "--eager", &eager)) {
        o->ecfg.use_plans = 0;
        return 1;
    }
    if (srv_arg_int(argc, argv, i, "--kv-cache-mb", 1, 1 << 22, &kv_mb)) {
        o->ecfg.kv_bytes = (size_t)kv_mb << 20;
        return 1;
    }
    return 0;
}

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Cold-load progress: a large checkpoint takes seconds to minutes to read, and a silent process
 * looks hung. Lines go out at most twice a second, and only when someone is watching (stderr is a
 * terminal) or the load is slow enough to matter (past 1 s): a quick load in a script or a test
 * stays quiet. */
typedef struct {
    const char *what, *dir;
    double t0, last;
    int tty, shown;
} load_progress;

static void on_load_progress(uint64_t done, uint64_t total, int last, void *user)
{
    load_progress *p = user;
    const double now = mono_ms(), el = now - p->t0;
    if (!p->tty && el < 1000 && !p->shown) return;
    if (!last && (done == 0 || done >= total || now - p->last < 500)) return; /* (100%: the final line says it) */
    if (last && !p->shown && !p->tty && el < 1000) return;
    p->last = now;
    p->shown = 1;
    const double gbs = el > 0 ? (double)done / (el * 1e-3) / 1e9 : 0;
    srv_logline l;
    const int gb = total >= 1000000000ull; /* small checkpoints in MB, so the figures are not 0.00 */
    const double unit = gb ? 1e9 : 1e6;
    srv_log_begin(&l, "info", "load", "%s %s: %.2f / %.2f %s (%.0f%%), %.2f GB/s%s", last ? "loaded" : "loading",
                  p->dir, (double)done / unit, (double)total / unit, gb ? "GB" : "MB",
                  total ? 100.0 * (double)done / (double)total : 100.0, gbs, last ? "" : " ...");
    srv_log_str(&l, "model", p->what);
    srv_log_str(&l, "dir", p->dir);
    srv_log_int(&l, "bytes", (long long)done);
    srv_log_int(&l, "total", (long long)total);
    srv_log_num(&l, "gb_s", gbs, 3);
    srv_log_num(&l, "ms", el, 1);
    srv_log_end(&l);
}

static int load_dir(mdl_model *m, const char *what, const char *dir, double *ms, char *err, size_t errlen)
{
    load_progress p = {what, dir, mono_ms(), 0, isatty(STDERR_FILENO), 0};
    int rc = mdl_model_load_dir_progress(m, dir, on_load_progress, &p, err, errlen);
    *ms = mono_ms() - p.t0;
    return rc;
}

/* Online FP8 (--quantization fp8, --draft-quantization fp8): every projection of the checkpoint in
 * dir (a drafter's fc too) stored as block FP8, quantized as each tensor arrives. */
static int online_fp8(const srv_runtime_opts *o, mdl_config *cfg, const char *flag, const char *dir, char *err,
                      size_t errlen)
{
    if (cfg->fp8) {
        snprintf(err, errlen, "%s fp8: %s is an FP8 checkpoint already (it loads as it is)", flag, dir);
        return -1;
    }
    cfg->fp8 = cfg->fp8_online = 1;
    cfg->fp8_fc = cfg->is_drafter;
    if (o->quant_lm_head && !cfg->is_drafter) {
        if (cfg->tie) {
            snprintf(err, errlen,
                     "--quantize-lm-head: %s ties lm_head to embed_tokens (tie_word_embeddings); only an untied "
                     "lm_head is quantized",
                     dir);
            return -1;
        }
        cfg->fp8_lm_head = 1;
    }
    cfg->fp8_b0 = o->quant_b0 ? o->quant_b0 : 128;
    cfg->fp8_b1 = o->quant_b1 ? o->quant_b1 : 128;
    return 0;
}

/* The drafter's online quantization: --draft-quantization, else the target's --quantization, which
 * leaves a drafter that is an FP8 checkpoint already as it is (only the explicit flag asks again). */
static int draft_online_fp8(const srv_runtime_opts *o, const mdl_config *dcfg)
{
    if (o->draft_quantization) return strcmp(o->draft_quantization, "fp8") == 0;
    return o->quantization && strcmp(o->quantization, "fp8") == 0 && !dcfg->fp8;
}

int srv_runtime_open(srv_runtime *rt, const srv_runtime_opts *o, char *err, size_t errlen)
{
    memset(rt, 0, sizeof *rt);
    if (!o->model_dir) {
        snprintf(err, errlen, "--model DIR is required");
        return -1;
    }
    mdl_config cfg;
    if (mdl_config_load(o->model_dir, &cfg, err, errlen) != 0) return -1;
    if (o->quant_lm_head && !o->quantization) {
        snprintf(err, errlen, "--quantize-lm-head needs --quantization fp8");
        return -1;
    }
    if (o->quantization && online_fp8(o, &cfg, "--quantization", o->model_dir, err, errlen) != 0) return -1;
    if (o->backend && strcmp(o->backend, "cuda") == 0) {
        if (o->bf16_activations) {
            snprintf(err, errlen, "--bf16-activations is a CPU-backend option (the CUDA backend's "
                                  "counterpart is GS_CUDA_FAST_GEMM=1)");
            return -1;
        }
#ifdef GS_HAVE_CUDA
        eng_backend_config bc = {.arena_bytes = o->gpu_arena_bytes, .threads = o->threads, .checked = o->checked};
        rt->be = cuda_backend_create(&bc, err, errlen);
#else
        snprintf(err, errlen, "--backend cuda: this graphswap was built without CUDA (no nvcc at configure time)");
        return -1;
#endif
    } else {
        eng_backend_config bc = {.arena_bytes = (size_t)64 << 30,
                                 .threads = o->threads,
                                 .checked = o->checked,
                                 .bf16_activations = o->bf16_activations};
        rt->be = eng_backend_cpu_create(&bc, err, errlen);
        if (rt->be && o->bf16_activations == KERN_BF16_ACT_AMX && !kern_cpu_amx_native()) {
            srv_logline l;
            srv_log_begin(&l, "warn", "bf16_activations",
                          "--bf16-activations=amx without AMX (instruction set in use: %s): the AMX order "
                          "runs emulated, bit for bit the same but much slower",
                          kern_cpu_isa_name());
            srv_log_end(&l);
        } else if (rt->be && o->bf16_activations == KERN_BF16_ACT_PAIRS && !kern_cpu_bf16_dot_native()) {
            srv_logline l;
            srv_log_begin(&l, "warn", "bf16_activations",
                          "--bf16-activations without AVX512_BF16 (instruction set in use: %s): the bf16 "
                          "products run emulated, bit for bit the same but slower than without the option",
                          kern_cpu_isa_name());
            srv_log_end(&l);
        }
    }
    if (!rt->be) return -1;
    if (cfg.is_drafter) {
        snprintf(err, errlen, "%s is a drafter (%s); serve a target with --model and give it as --draft",
                 o->model_dir, mdl_arch_name(cfg.arch));
        goto fail;
    }
    rt->m = mdl_model_create(&cfg, rt->be, err, errlen);
    if (!rt->m || load_dir(rt->m, "target", o->model_dir, &rt->load_ms, err, errlen) != 0) goto fail;
    if (o->bf16_activations && rt->m->wdt != KERN_DT_BF16 && !rt->m->cfg.fp8) {
        srv_logline l;
        srv_log_begin(&l, "warn", "bf16_activations",
                      "--bf16-activations has no effect on %s: its matrices are stored in f32 (the option "
                      "changes matmuls of bf16 and FP8 weights only)",
                      o->model_dir);
        srv_log_end(&l);
    }
    if (o->draft_dir) {
        mdl_config dcfg;
        char derr[1024];
        if (mdl_config_load(o->draft_dir, &dcfg, derr, sizeof derr) != 0 ||
            mdl_config_check_drafter(&cfg, &dcfg, derr, sizeof derr) != 0 ||
            (draft_online_fp8(o, &dcfg) &&
             online_fp8(o, &dcfg, o->draft_quantization ? "--draft-quantization" : "--quantization",
                        o->draft_dir, derr, sizeof derr) != 0) ||
            !(rt->draft = mdl_model_create(&dcfg, rt->be, derr, sizeof derr)) ||
            load_dir(rt->draft, "draft", o->draft_dir, &rt->draft_load_ms, derr, sizeof derr) != 0) {
            snprintf(err, errlen, "%s: %s", o->draft_dir, derr);
            goto fail;
        }
    }
    const double t_eng = mono_ms();
    rt->e = eng_create_spec(&o->ecfg, rt->m, rt->draft, rt->be, err, errlen);
    rt->engine_ms = mono_ms() - t_eng;
    if (!rt->e) goto fail;
    return 0;
fail:
    srv_runtime_close(rt);
    return -1;
}

void srv_runtime_close(srv_runtime *rt)
{
    eng_destroy(rt->e);
    mdl_model_destroy(rt->draft);
    mdl_model_destroy(rt->m);
    eng_backend_destroy(rt->be);
    memset(rt, 0, sizeof *rt);
}
