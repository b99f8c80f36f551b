/* bench/bench_gemv.c — `graphswap bench gemv`: the decode-shaped CPU matmul (1 to a few rows) by weight
 * dtype: f32, bf16 and FP8 (float8_e4m3fn with 128 x 128 block scales, kern.h KOP_MATMUL), on the
 * matmuls of --layers transformer layers (fused q/k/v, o, fused gate/up, down) run in turn, so the
 * weights stream from memory as in a decode step of a model larger than the caches.
 *
 * Per dtype and row count: the median time of one pass over all layers (--reps passes), the weight
 * bytes read per second, and the time against bf16's (the FP8 goal of issue 26: batch 1 at >= 1.7x
 * bf16's speed, since it reads half the bytes). Weights are random: by default Gaussian values
 * quantized per block as checkpoints are (mdl_fp8_quantize: amax / 448 scales, so about 1e-4 of the
 * codes are e4m3 subnormals, as in the 125M bench checkpoint: 52 of 589824); --codes uniform draws
 * every code but NaN alike instead (7 in 128 subnormal), the case where the kernels' denormal f32
 * operands cost most (Zen 3, 1 thread, one layer in cache: 0.47 -> 0.96 ms per pass). bf16 and f32
 * hold the dequantized values' roundings; activations random; the results are consumed, not
 * checked (tests/unit/test_fp8.c checks them). Nothing here asserts a speed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "kernels/cpu/kern_cpu.h"
#include "kernels/kern.h"
#include "models/format/safetensors.h"
#include "server/core/cli.h"

#define GV_MATS 4
#define GV_B 128 /* FP8 scale block, both directions */

typedef struct {
    int K, N;
} gv_shape;

static const char gv_help[] =
    "usage: graphswap bench gemv [--hidden H] [--intermediate I] [--kv-dim D] [--layers L] [--rows LIST]\n"
    "                            [--reps N] [--threads N] [--codes gaussian|uniform]\n"
    "\n"
    "Decode-shaped matmuls (rows 1, 4, 16: --rows) over L layers' weights (default 12 layers of hidden\n"
    "768, intermediate 2048, K/V width 256: the 125M bench model) in f32, bf16 and FP8 (e4m3 with\n"
    "128 x 128 block scales): median ms per pass over all layers, weight GB/s, and speed against bf16.\n"
    "FP8 codes: gaussian (default: Gaussian weights quantized per block as checkpoints are, about 1e-4\n"
    "subnormal codes) or uniform (every code but NaN equally likely: 7 in 128 subnormal, the slow case\n"
    "of CPUs that take denormal f32 operands slowly).\n";

static void *gv_alloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench gemv: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

int srv_bench_gemv(int argc, char **argv)
{
    int H = 768, I = 2048, KV = 256, L = 12, reps = 20, threads = 0, rows[8] = {1, 4, 16}, nrows = 3, uniform = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(gv_help, stdout);
            return 0;
        }
        if (srv_arg_int(argc, argv, &i, "--hidden", 16, 1 << 16, &H) ||
            srv_arg_int(argc, argv, &i, "--intermediate", 16, 1 << 17, &I) ||
            srv_arg_int(argc, argv, &i, "--kv-dim", 16, 1 << 16, &KV) ||
            srv_arg_int(argc, argv, &i, "--layers", 1, 512, &L) || srv_arg_int(argc, argv, &i, "--reps", 1, 10000, &reps) ||
            srv_arg_int(argc, argv, &i, "--threads", 1, 256, &threads))
            continue;
        if (strcmp(argv[i], "--codes") == 0 && i + 1 < argc && (strcmp(argv[i + 1], "gaussian") == 0 || strcmp(argv[i + 1], "uniform") == 0)) {
            uniform = strcmp(argv[++i], "uniform") == 0;
            continue;
        }
        if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
            nrows = bench_int_list("--rows", argv[++i], 1, 4096, rows, 8);
            continue;
        }
        fprintf(stderr, "bench gemv: unknown argument %s\n", argv[i]);
        fputs(gv_help, stderr);
        return 2;
    }
    bench_preflight("gemv", "decode-shaped matmuls by weight dtype (f32, bf16, FP8) over several layers' weights");
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    kern_pool *pool = kern_pool_create(threads);
    const gv_shape sh[GV_MATS] = {{H, H + 2 * KV}, {H, H}, {H, 2 * I}, {I, H}};
    size_t params = 0;
    for (int m = 0; m < GV_MATS; m++) params += (size_t)sh[m].K * sh[m].N;
    printf("threads %d, ISA %s, %d layers x %.2fM weights (%.1f MB in bf16), FP8 codes %s\n", threads, kern_simd()->name,
           L, (double)params / 1e6, (double)params * L * 2 / 1e6, uniform ? "uniform" : "gaussian");
    /* one weight per (layer, matrix) and dtype; FP8 codes and scales, f32 / bf16 of the dequantized values */
    const int ndt = 3;
    const kern_dtype dts[3] = {KERN_DT_F32, KERN_DT_BF16, KERN_DT_FP8};
    const char *dname[3] = {"f32", "bf16", "fp8"};
    void **w = calloc((size_t)ndt * L * GV_MATS, sizeof *w);
    float **sc = calloc((size_t)L * GV_MATS, sizeof *sc);
    if (!w || !sc) return 1;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    size_t nsub_all = 0;
    for (int l = 0; l < L; l++)
        for (int m = 0; m < GV_MATS; m++) {
            const size_t n = (size_t)sh[m].K * sh[m].N, ns = (size_t)((sh[m].N + GV_B - 1) / GV_B) * ((sh[m].K + GV_B - 1) / GV_B);
            const int at = l * GV_MATS + m;
            uint8_t *q = gv_alloc(n);
            float *f = gv_alloc(n * 4), *s = gv_alloc(ns * 4);
            uint16_t *b = gv_alloc(n * 2);
            size_t nsub = 0;
            if (uniform) {
                for (size_t i = 0; i < ns; i++) s[i] = 0x1p-7f;
                for (size_t i = 0; i < n; i++) {
                    seed ^= seed >> 12, seed ^= seed << 25, seed ^= seed >> 27;
                    uint8_t c = (uint8_t)((seed * 0x2545F4914F6CDD1Dull) >> 56);
                    if (kern_fp8_is_nan(c)) c = 0;
                    q[i] = c;
                }
            } else { /* f as scratch: Gaussian (Box-Muller) weights of std 0.02, then the block quantizer */
                for (size_t i = 0; i < n; i++) {
                    seed ^= seed >> 12, seed ^= seed << 25, seed ^= seed >> 27;
                    const uint64_t r = seed * 0x2545F4914F6CDD1Dull;
                    const double u1 = ((double)(r >> 40) + 1.0) / 16777217.0, u2 = (double)(r & 0xffffff) / 16777216.0;
                    f[i] = (float)(0.02 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
                }
                mdl_fp8_quantize(f, sh[m].N, sh[m].K, GV_B, GV_B, MDL_DT_F32, q, s);
            }
            const int sc_k = (sh[m].K + GV_B - 1) / GV_B;
            for (size_t i = 0; i < n; i++) {
                nsub += (q[i] & 0x78) == 0 && (q[i] & 7) != 0;
                f[i] = kern_fp8_to_f32(q[i]) * s[(i / (size_t)sh[m].K / GV_B) * (size_t)sc_k + (i % (size_t)sh[m].K) / GV_B];
                b[i] = kern_f32_to_bf16(f[i]);
            }
            nsub_all += nsub;
            w[(0 * L + l) * GV_MATS + m] = f;
            w[(1 * L + l) * GV_MATS + m] = b;
            w[(2 * L + l) * GV_MATS + m] = q;
            sc[at] = s;
        }
    printf("FP8 subnormal codes: %zu of %zu (%.2g)\n", nsub_all, params * L, (double)nsub_all / (double)(params * L));
    int maxr = 1;
    for (int i = 0; i < nrows; i++) maxr = rows[i] > maxr ? rows[i] : maxr;
    const int kmax = H > I ? H : I, nmax = 2 * I > H + 2 * KV ? 2 * I : H + 2 * KV;
    float *x = gv_alloc((size_t)maxr * kmax * 4), *out = gv_alloc((size_t)maxr * nmax * 4);
    for (size_t i = 0; i < (size_t)maxr * kmax; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    printf("%-5s %5s %10s %10s %9s\n", "dtype", "rows", "ms/pass", "GB/s", "vs bf16");
    double *t = malloc((size_t)reps * sizeof *t), bf_ms[8] = {0};
    for (int ri = 0; ri < nrows; ri++)
        for (int di = 0; di < ndt; di++) {
            static const int order[3] = {1, 0, 2}; /* bf16 first (the ratio's base), then f32, fp8 */
            const int d = order[di];
            const int M = rows[ri];
            int32_t nr = M;
            for (int rep = -2; rep < reps; rep++) { /* two warm-up passes */
                const double t0 = bench_now();
                for (int l = 0; l < L; l++)
                    for (int m = 0; m < GV_MATS; m++) {
                        const int K = sh[m].K, N = sh[m].N, at = l * GV_MATS + m;
                        kern_op op = {.kind = KOP_MATMUL};
                        op.buf[0] = (kern_buf){x, (size_t)M * K * 4};
                        op.buf[1] = (kern_buf){w[(d * L + l) * GV_MATS + m], (size_t)N * K * kern_dtype_size(dts[d])};
                        op.buf[3] = (kern_buf){out, (size_t)M * N * 4};
                        op.buf[4] = (kern_buf){&nr, 4};
                        op.p[0] = K, op.p[1] = N, op.p[2] = M, op.p[3] = dts[d];
                        if (dts[d] == KERN_DT_FP8) {
                            op.buf[5] = (kern_buf){sc[at], (size_t)((N + GV_B - 1) / GV_B) * ((K + GV_B - 1) / GV_B) * 4};
                            op.p[5] = GV_B, op.p[6] = GV_B;
                        }
                        kern_cpu_exec(pool, &op);
                    }
                if (rep >= 0) t[rep] = bench_now() - t0;
            }
            bench_sink(out[0]);
            const double ms = bench_median(t, reps) * 1e3;
            if (d == 1) bf_ms[ri] = ms;
            const double bytes = (double)params * L * (double)kern_dtype_size(dts[d]);
            printf("%-5s %5d %10.3f %10.2f %8.2fx\n", dname[d], M, ms, bytes / (ms * 1e-3) / 1e9, bf_ms[ri] / ms);
        }
    for (int i = 0; i < ndt * L * GV_MATS; i++) free(w[i]);
    for (int i = 0; i < L * GV_MATS; i++) free(sc[i]);
    free(w), free(sc), free(x), free(out), free(t);
    kern_pool_destroy(pool);
    return 0;
}
