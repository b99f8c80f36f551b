/* bench/bench_prefill.c — `graphswap bench prefill`: prompt processing against the FMA peak.
 *
 * Prefill is compute-bound, so its ceiling is the machine's fused-multiply-add throughput. The same
 * run measures that peak with a loop of independent FMA chains on every worker thread (the widest
 * vector the kernels use: AVX-512, AVX2 or scalar), then times the prefill of one L-token prompt
 * (max_tokens 1, prefix caching off, the whole prompt in one step) for each length, and prints
 * tokens/s and the share of the peak. Only the FLOPs a prefill must do are counted: every
 * non-embedding matmul of every prompt row, causal attention (QK^T and PV over the keys each row
 * sees), and the lm_head row of the last position (the only logits anybody asked for). Nothing here
 * asserts a speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "bench/bench_util.h"
#include "kernels/cpu/kern_cpu.h"
#include "models/config.h"
#include "bench/bench.h"
#include "server/core/cli.h"

/* ---- FMA peak ----------------------------------------------------------------------------------- */

typedef struct {
    long iters;
    int isa;
    int lanes;
    int bf16_dot; /* time vdpbf16ps chains instead of FMAs */
} fma_ctx;

#define FMA_CHAINS 12 /* independent accumulators: covers FMA latency x pipes on current x86 cores */
/* Twelve named accumulators (an array would live in memory: the compiler does not promote it). */
#define FMA12(T, FMA, SET1, RED)                                                                   \
    T a0 = SET1(0), a1 = SET1(1), a2 = SET1(2), a3 = SET1(3), a4 = SET1(4), a5 = SET1(5);            \
    T a6 = SET1(6), a7 = SET1(7), a8 = SET1(8), a9 = SET1(9), a10 = SET1(10), a11 = SET1(11);        \
    const T m = SET1(0.999999f), c = SET1(1e-7f);                                                 \
    for (long i = 0; i < iters; i++) {                                                             \
        a0 = FMA(a0, m, c), a1 = FMA(a1, m, c), a2 = FMA(a2, m, c), a3 = FMA(a3, m, c);           \
        a4 = FMA(a4, m, c), a5 = FMA(a5, m, c), a6 = FMA(a6, m, c), a7 = FMA(a7, m, c);           \
        a8 = FMA(a8, m, c), a9 = FMA(a9, m, c), a10 = FMA(a10, m, c), a11 = FMA(a11, m, c);       \
    }                                                                                              \
    return RED(a0) + RED(a1) + RED(a2) + RED(a3) + RED(a4) + RED(a5) + RED(a6) + RED(a7) + RED(a8) + \
           RED(a9) + RED(a10) + RED(a11)

#ifdef KERN_HAVE_X86
#include <immintrin.h>
__attribute__((target("avx512f"))) static double fma_avx512(long iters)
{
    FMA12(__m512, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_reduce_add_ps);
}
/* vdpbf16ps: 16 lanes x 2 products per instruction (the --bf16-activations matmul's instruction) */
__attribute__((target("avx512f,avx512bf16"))) static double dp_avx512bf16(long iters)
{
#define DP_BF(a, m, c) _mm512_dpbf16_ps((a), (__m512bh)(m), (__m512bh)(c))
    FMA12(__m512, DP_BF, _mm512_set1_ps, _mm512_reduce_add_ps);
#undef DP_BF
}
__attribute__((target("avx2,fma"))) static float red256(__m256 v)
{
    float t[8];
    _mm256_storeu_ps(t, v);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
__attribute__((target("avx2,fma"))) static double fma_avx2(long iters)
{
    FMA12(__m256, _mm256_fmadd_ps, _mm256_set1_ps, red256);
}
#endif

#ifdef KERN_HAVE_AMX_BUILD
/* TDPBF16PS: 4 independent C tiles (2 A x 2 B, all in tile registers: no loads in the loop), each
 * instruction 16 x 16 outputs x 32 products (the --bf16-activations=amx matmul's instruction) */
typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) bench_tilecfg;
__attribute__((target("amx-tile,amx-bf16"))) static double tdp_amx(long iters)
{
    bench_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _Alignas(64) static _Thread_local uint16_t ab[16 * 32];
    for (int i = 0; i < 16 * 32; i++) ab[i] = 0x3f80; /* 1.0 */
    _Alignas(64) float out[256];
    _tile_loadconfig(&c);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ab, 64);
    _tile_loadd(5, ab, 64);
    _tile_loadd(6, ab, 64);
    _tile_loadd(7, ab, 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}
#endif

static float fmaf1(float a, float b, float c) { return fmaf(a, b, c); }
static float id1(float v) { return v; }
static float set1(float v) { return v; }
static double fma_scalar(long iters)
{
    FMA12(float, fmaf1, set1, id1);
}

static void fma_task(void *vctx, int tid, int nth)
{
    (void)tid, (void)nth;
    const fma_ctx *c = vctx;
#ifdef KERN_HAVE_X86
#ifdef KERN_HAVE_AMX_BUILD
    if (c->bf16_dot == 2) {
        bench_sink(tdp_amx(c->iters));
        return;
    }
#endif
    if (c->bf16_dot) {
        bench_sink(dp_avx512bf16(c->iters));
        return;
    }
    if (c->isa >= KERN_ISA_AVX512) {
        bench_sink(fma_avx512(c->iters));
        return;
    }
    if (c->isa == KERN_ISA_AVX2) {
        bench_sink(fma_avx2(c->iters));
        return;
    }
#endif
    bench_sink(fma_scalar(c->iters));
}

/* Best of several runs, GFLOP/s over all pool threads (an FMA is 2 FLOPs per lane). */
double bench_fma_peak(kern_pool *pool, const char **isa_name, int bf16_dot)
{
    const kern_simd_ops *so = kern_simd();
    fma_ctx c = {.isa = so->isa, .lanes = so->isa >= KERN_ISA_AVX512 ? 16 : so->isa == KERN_ISA_AVX2 ? 8 : 1};
    if (bf16_dot) c.bf16_dot = 1, c.lanes = 32; /* vdpbf16ps: two products per lane */
    *isa_name = so->name;
    c.iters = c.isa == KERN_ISA_SCALAR ? 2000000 : 4000000;
    if (bf16_dot == 2) { /* TDPBF16PS: 16 x 16 x 32 products, 4 per iteration */
        if (!kern_cpu_amx_native()) return 0;
        c.bf16_dot = 2;
        c.iters = 200000;
    }
    int nth = kern_pool_threads(pool);
    double best = 0;
    for (int it = 0; it < 5; it++) {
        double t0 = bench_now();
        kern_pool_run(pool, fma_task, &c);
        double dt = bench_now() - t0;
        double gf = c.bf16_dot == 2 ? 2.0 * 16 * 16 * 32 * 4 * (double)c.iters * nth / dt / 1e9
                                    : 2.0 * c.lanes * FMA_CHAINS * (double)c.iters * nth / dt / 1e9;
        if (gf > best) best = gf;
    }
    return best;
}

/* ---- prefill ------------------------------------------------------------------------------------ */

/* FLOPs a prefill of L tokens must do (see the top of the file). */
static double prefill_flops(const mdl_config *c, int L)
{
    double H = c->hidden, I = c->intermediate, q = (double)c->heads * c->head_dim,
           kv = (double)c->kv_heads * c->head_dim;
    double per_row = 2.0 * c->layers * (H * q + 2 * H * kv + q * H + 3 * H * I);
    /* row p attends to p + 1 keys: sum over p = L (L + 1) / 2; QK^T and PV, 2 FLOPs per MAC */
    double attn = 4.0 * c->layers * q * ((double)L * (L + 1) / 2.0);
    return per_row * L + attn + 2.0 * H * c->vocab;
}

static double run_prefill(srv_runtime *rt, const int32_t *prompt, int L)
{
    char err[1024];
    int32_t out;
    float lp;
    eng_request r = {0};
    r.prompt = prompt;
    r.n_prompt = L;
    r.max_tokens = 1;
    r.ignore_eos = 1;
    r.sp.top_p = 1;
    r.out_tokens = &out;
    r.out_logprobs = &lp;
    if (eng_submit(rt->e, &r, NULL, err, sizeof err) != 0) srv_die("%s", err);
    double t0 = bench_now();
    eng_run_until_idle(rt->e);
    return bench_now() - t0;
}

static const char help[] =
    "usage: graphswap bench prefill --model DIR [--lengths LIST] [--reps N] [--threads N]\n"
    "\n"
    "Prefill tokens/s of one prompt of each length (default 128,512,2048; whole prompt in one step,\n"
    "prefix caching off, one generated token), median of --reps runs (default 5) after a warm-up,\n"
    "next to the FMA peak measured in the same run. \"% peak\" counts only the FLOPs a prefill must\n"
    "do: the matmuls of every prompt row, causal attention, and one lm_head row.\n";

int srv_bench_prefill(int argc, char **argv)
{
    srv_runtime_opts ro;
    srv_runtime_defaults(&ro);
    int lengths[16] = {128, 512, 2048}, n_lengths = 3, reps = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            fputs(srv_runtime_help, stdout);
            return 0;
        }
        if (srv_runtime_arg(argc, argv, &i, &ro) || srv_arg_int(argc, argv, &i, "--reps", 1, 1000, &reps)) continue;
        if (strcmp(argv[i], "--lengths") == 0 && i + 1 < argc) {
            n_lengths = bench_int_list("--lengths", argv[++i], 1, 1 << 16, lengths, 16);
            continue;
        }
        srv_die_usage("bench prefill", argv[i]);
    }
    bench_preflight("prefill", "prompt tokens/s against the FMA peak measured in the same run");
    kern_pool *pool = kern_pool_create(ro.threads);
    const char *isa;
    double peak = bench_fma_peak(pool, &isa, 0);
    /* --bf16-activations where the CPU has vdpbf16ps: its peak too (bf16 matmuls run on it) */
    const int amx = ro.bf16_activations == KERN_BF16_ACT_AMX && kern_cpu_amx_native();
    const int dot = ro.bf16_activations && kern_cpu_bf16_dot_native();
    double dpeak = amx ? bench_fma_peak(pool, &isa, 2) : dot ? bench_fma_peak(pool, &isa, 1) : 0;
    int nthreads = kern_pool_threads(pool);
    kern_pool_destroy(pool);
    printf("model: %s  threads: %d  isa: %s%s\n", ro.model_dir, nthreads, isa,
           ro.bf16_activations == KERN_BF16_ACT_AMX ? "  --bf16-activations=amx"
           : ro.bf16_activations                    ? "  --bf16-activations"
                                                    : "");
    printf("FMA peak: %.1f GFLOP/s (%d threads)\n", peak, nthreads);
    if (amx)
        printf("AMX peak (TDPBF16PS): %.1f GFLOP/s (%d threads)\n", dpeak, nthreads);
    else if (dot)
        printf("BF16 dot peak (vdpbf16ps): %.1f GFLOP/s (%d threads)\n", dpeak, nthreads);
    printf("%-6s %10s %10s %10s %10s %10s %8s%s\n", "len", "tok/s", "ms", "min ms", "max ms", "GFLOP/s", "% peak",
           amx ? "  % AMX peak" : dot ? "  % dot peak" : "");
    for (int li = 0; li < n_lengths; li++) {
        int L = lengths[li];
        srv_runtime_opts o = ro;
        o.ecfg.max_seqs = 1;
        o.ecfg.prefix_caching = 0;
        o.ecfg.max_step_tokens = L;
        o.ecfg.prefill_chunk = L;
        if (o.ecfg.max_model_len < L + 1) o.ecfg.max_model_len = L + 1;
        char err[1024];
        srv_runtime rt;
        if (srv_runtime_open(&rt, &o, err, sizeof err) != 0) srv_die("%s", err);
        const mdl_config *c = &rt.m->cfg;
        int32_t *prompt = malloc((size_t)L * sizeof *prompt);
        double *t = malloc((size_t)reps * sizeof *t);
        if (!prompt || !t) srv_die("out of memory");
        for (int i = 0; i < L; i++) prompt[i] = (int32_t)(((int64_t)i * 104729 + 17) % c->vocab);
        run_prefill(&rt, prompt, L); /* warm-up: page in the weights, fault in the workspace */
        for (int k = 0; k < reps; k++) t[k] = run_prefill(&rt, prompt, L);
        const double med = bench_median(t, reps); /* sorts t: t[0] min, t[reps - 1] max */
        double gf = prefill_flops(c, L) / med / 1e9;
        printf("%-6d %10.1f %10.2f %10.2f %10.2f %10.1f %7.1f%%", L, L / med, med * 1e3, t[0] * 1e3,
               t[reps - 1] * 1e3, gf, 100.0 * gf / peak);
        if (dot) printf(" %11.1f%%", 100.0 * gf / dpeak);
        printf("\n");
        fflush(stdout);
        free(prompt);
        free(t);
        srv_runtime_close(&rt);
    }
    return 0;
}
