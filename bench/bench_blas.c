/* bench/bench_blas.c — `graphswap bench blas`: the CPU matmul against the BLAS libraries a Debian
 * machine offers, on one layer's prefill matmuls.
 *
 * Why a library is not used (docs/DESIGN.md): a library is worth taking only if it is faster on
 * these shapes AND its result for a row does not depend on how many rows are in the product
 * (batch invariance: a row's logits must not depend on what else is in the step). This bench
 * measures both, side by side, in one run:
 *  - speed: one transformer layer's four matmuls (fused q/k/v, o, fused gate/up, down; weights
 *    [N][K] as the checkpoint stores them, Y = X W^T) for each prompt length M, median of --reps,
 *    GFLOP/s and the share of the FMA peak measured in the same run;
 *  - row invariance: rows 0, M/2 and M-1 computed alone (M = 1) against the same rows of the
 *    M-row product, bit for bit ("yes"), else the largest absolute difference; and whether calling a
 *    library on a fixed C rows at a time (--chunk) would make it so.
 * The libraries are loaded with dlopen at run time (OpenBLAS, BLIS, oneDNN: `apt-get install
 * libopenblas0-pthread libblis4-pthread libdnnl2`); the ones not installed are reported and skipped,
 * so the binary has no link-time dependency on any of them; they are loaded and run in child
 * processes (blas_in_child). Every engine gets --threads threads (OPENBLAS_NUM_THREADS,
 * BLIS_NUM_THREADS and OMP_NUM_THREADS are set before loading). Nothing here asserts a speed.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "kernels/kern.h"
#include "models/config.h"
#include "bench/bench.h"
#include "server/core/cli.h"

/* CBLAS row-major Y[M][N] = X[M][K] W[N][K]^T (CblasRowMajor 101, NoTrans 111, Trans 112) */
typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                               const float *b, int ldb, float beta, float *c, int ldc);
/* oneDNN's dnnl_sgemm is row-major; dnnl_dim_t is int64_t; returns dnnl_success (0) */
typedef int (*dnnl_sgemm_fn)(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                             int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

enum { ENG_GRAPHSWAP, ENG_OPENBLAS, ENG_BLIS, ENG_ONEDNN, ENG_COUNT };

typedef struct {
    const char *name;
    const char *const *sonames; /* tried in order */
    const char *package;        /* the Debian package that provides it */
    void *h;
    cblas_sgemm_fn cblas;
    dnnl_sgemm_fn dnnl;
    char version[96];
} blas_lib;

typedef struct {
    const char *name;
    int K, N;
} blas_shape;

/* The "/C" variant (--chunk C, default 64): a product of M rows as ceil(M / C) calls of exactly C
 * rows (the last padded with zero rows), a row alone as one padded call with the row first. If a
 * library's result for a row depended only on the call's shape, that would make it row-invariant (a
 * fixed blocking independent of M, imposed from outside) — at the price of C rows of arithmetic
 * for every decode row. */
typedef struct {
    kern_pool *pool;
    blas_lib *lib; /* NULL: graphswap */
    int chunk;      /* > 0: calls of exactly this many rows */
    float *xp, *yp; /* chunk x maxK and chunk x maxN scratch */
    /* graphswap in the amx order (pool in KERN_BF16_ACT_AMX): the bf16 copy wb[s] of each f32
     * weight wf[s] (the same values rounded), found by the f32 pointer gemm is given */
    float *const *wf;
    uint16_t *const *wb;
    int nw;
} blas_engine;

static void *sym(void *h, const char *name)
{
    dlerror();
    return dlsym(h, name);
}

static void lib_open(blas_lib *l, int threads)
{
    for (int i = 0; l->sonames[i] && !l->h; i++) l->h = dlopen(l->sonames[i], RTLD_NOW | RTLD_LOCAL);
    if (!l->h) return;
    void *p;
    if ((p = sym(l->h, "cblas_sgemm"))) memcpy(&l->cblas, &p, sizeof p);
    if ((p = sym(l->h, "dnnl_sgemm"))) memcpy(&l->dnnl, &p, sizeof p);
    if (!l->cblas && !l->dnnl) {
        dlclose(l->h);
        l->h = NULL;
        return;
    }
    /* the thread count also through the library's own call where it has one */
    if ((p = sym(l->h, "openblas_set_num_threads"))) {
        void (*f)(int);
        memcpy(&f, &p, sizeof p);
        f(threads);
    }
    if ((p = sym(l->h, "bli_thread_set_num_threads"))) {
        void (*f)(long);
        memcpy(&f, &p, sizeof p);
        f(threads);
    }
    snprintf(l->version, sizeof l->version, "?");
    if ((p = sym(l->h, "openblas_get_config"))) {
        const char *(*f)(void);
        memcpy(&f, &p, sizeof p);
        snprintf(l->version, sizeof l->version, "%s", f());
    } else if ((p = sym(l->h, "bli_info_get_version_str"))) {
        const char *(*f)(void);
        memcpy(&f, &p, sizeof p);
        snprintf(l->version, sizeof l->version, "%s", f());
    } else if ((p = sym(l->h, "dnnl_version"))) {
        const struct {
            int major, minor, patch;
        } *(*f)(void);
        memcpy(&f, &p, sizeof p);
        snprintf(l->version, sizeof l->version, "%d.%d.%d", f()->major, f()->minor, f()->patch);
    }
}

/* Y[M][N] = X[M][K] W[N][K]^T on one engine */
static void gemm1(const blas_engine *e, int M, int K, int N, const float *x, const float *w, float *y)
{
    if (!e->lib) {
        int32_t rows = M;
        kern_op op = {.kind = KOP_MATMUL};
        op.buf[0] = (kern_buf){(void *)x, (size_t)M * (size_t)K * sizeof(float)};
        op.buf[1] = (kern_buf){(void *)w, (size_t)N * (size_t)K * sizeof(float)};
        op.p[3] = KERN_DT_F32;
        for (int s = 0; s < e->nw; s++)
            if (e->wf[s] == w) {
                op.buf[1] = (kern_buf){e->wb[s], (size_t)N * (size_t)K * 2};
                op.p[3] = KERN_DT_BF16;
            }
        op.buf[3] = (kern_buf){y, (size_t)M * (size_t)N * sizeof(float)};
        op.buf[4] = (kern_buf){&rows, sizeof rows};
        op.p[0] = K;
        op.p[1] = N;
        op.p[2] = M;
        kern_cpu_exec(e->pool, &op);
    } else if (e->lib->cblas) {
        e->lib->cblas(101, 111, 112, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
    } else if (e->lib->dnnl('N', 'T', M, N, K, 1.0f, x, K, w, K, 0.0f, y, N) != 0) {
        srv_die("bench blas: dnnl_sgemm failed (M %d K %d N %d)", M, K, N);
    }
}

static void gemm(const blas_engine *e, int M, int K, int N, const float *x, const float *w, float *y)
{
    const int C = e->chunk;
    if (C <= 0) {
        gemm1(e, M, K, N, x, w, y);
        return;
    }
    int r = 0;
    for (; r + C <= M; r += C) gemm1(e, C, K, N, x + (size_t)r * (size_t)K, w, y + (size_t)r * (size_t)N);
    if (r == M) return;
    const size_t n = (size_t)(M - r);
    memcpy(e->xp, x + (size_t)r * (size_t)K, n * (size_t)K * sizeof(float));
    memset(e->xp + n * (size_t)K, 0, ((size_t)C - n) * (size_t)K * sizeof(float));
    gemm1(e, C, K, N, e->xp, w, e->yp);
    memcpy(y + (size_t)r * (size_t)N, e->yp, n * (size_t)N * sizeof(float));
}

/* Median seconds of one layer's matmuls at M rows (a warm-up first). */
static double time_layer(const blas_engine *e, const blas_shape *sh, int nsh, int M, float *const *w, const float *x,
                         float *y, int reps, double *t)
{
    double total = 0;
    for (int s = 0; s < nsh; s++) {
        gemm(e, M, sh[s].K, sh[s].N, x, w[s], y);
        for (int r = 0; r < reps; r++) {
            double t0 = bench_now();
            gemm(e, M, sh[s].K, sh[s].N, x, w[s], y);
            t[r] = bench_now() - t0;
        }
        total += bench_median(t, reps);
    }
    return total;
}

/* Largest |difference| between rows {0, M/2, M-1} of the M-row product and the same rows alone;
 * 0 with *same = 1 when every bit agrees. */
static double row_invariance(const blas_engine *e, const blas_shape *sh, int nsh, int M, float *const *w,
                             const float *x, float *y, float *y1, int *same)
{
    double worst = 0;
    *same = 1;
    for (int s = 0; s < nsh; s++) {
        const int K = sh[s].K, N = sh[s].N;
        gemm(e, M, K, N, x, w[s], y);
        const int rows[3] = {0, M / 2, M - 1};
        for (int i = 0; i < 3; i++) {
            const int r = rows[i];
            gemm(e, 1, K, N, x + (size_t)r * (size_t)K, w[s], y1);
            const float *full = y + (size_t)r * (size_t)N;
            if (memcmp(full, y1, (size_t)N * sizeof *y1) != 0) *same = 0;
            for (int n = 0; n < N; n++) {
                double d = fabs((double)full[n] - (double)y1[n]);
                if (d > worst) worst = d;
            }
        }
    }
    return worst;
}

static float frand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Everything one measurement needs; the libraries' part runs in a child process (blas_in_child). */
typedef struct {
    const blas_shape *sh;
    int nsh, reps, chunk, threads;
    float *const *w;
    const float *x;
    float *y, *y1, *xp, *yp;
    double *t, peak, flop_row;
    blas_lib *libs;
    const char *want;
    int M; /* 0: only report which libraries load, and their versions */
} blas_run;

static void print_row(const blas_run *r, const blas_engine *e, const char *name)
{
    const double sec = time_layer(e, r->sh, r->nsh, r->M, r->w, r->x, r->y, r->reps, r->t);
    int same;
    const double d = row_invariance(e, r->sh, r->nsh, r->M, r->w, r->x, r->y, r->y1, &same);
    const double gf = r->flop_row * r->M / sec / 1e9;
    printf("%-6d %-12s %10.3f %10.1f %7.1f%%  ", r->M, name, sec * 1e3, gf, 100.0 * gf / r->peak);
    if (same)
        printf("yes\n");
    else
        printf("no (max |diff| %.3g)\n", d);
    fflush(stdout);
}

/* In a child process: load the asked-for libraries, then report them (r->M == 0) or measure each,
 * whole calls and --chunk-row calls. */
static void libs_child(const blas_run *r)
{
    for (int l = ENG_OPENBLAS; l < ENG_COUNT; l++) {
        blas_lib *lib = &r->libs[l];
        if (!srv_list_has(r->want, lib->name)) {
            if (!r->M) printf("%s: not asked for (--libs), skipped\n", lib->name);
            continue;
        }
        lib_open(lib, r->threads);
        if (!r->M) {
            if (lib->h)
                printf("%s: %s\n", lib->name, lib->version);
            else
                printf("%s: not installed (apt-get install %s), skipped\n", lib->name, lib->package);
            continue;
        }
        if (!lib->h) continue;
        char name[32];
        const blas_engine whole = {.lib = lib, .xp = r->xp, .yp = r->yp};
        print_row(r, &whole, lib->name);
        usleep(200000); /* let the library's spinning threads go idle */
        const blas_engine chunked = {.lib = lib, .chunk = r->chunk, .xp = r->xp, .yp = r->yp};
        snprintf(name, sizeof name, "%s/%d", lib->name, r->chunk);
        print_row(r, &chunked, name);
        usleep(200000);
    }
}

/* The libraries run in child processes (one per length, and one that reports them): their worker
 * threads (OpenBLAS's, OpenMP's) never share a process with graphswap's pool, so they neither spin
 * against its measurements nor outlive them, and the child leaves with _exit (oneDNN's OpenMP
 * threads, still there at exit, crashed LeakSanitizer's tracer in the ASan build). */
static void blas_in_child(const blas_run *r)
{
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) srv_die("bench blas: fork: %s", strerror(errno));
    if (pid == 0) {
        libs_child(r);
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) srv_die("bench blas: waitpid: %s", strerror(errno));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        printf("(the libraries' process for M %d ended abnormally: wait status %d)\n", r->M, st);
}

static const char help[] =
    "usage: graphswap bench blas [--model DIR] [--lengths LIST] [--reps N] [--threads N] [--chunk C]\n"
    "                            [--libs openblas,blis,onednn]\n"
    "\n"
    "graphswap's f32 CPU matmul against OpenBLAS, BLIS and oneDNN (those installed; loaded at run\n"
    "time: apt-get install libopenblas0-pthread libblis4-pthread libdnnl2) on one layer's prefill\n"
    "matmuls (fused q/k/v, o, fused gate/up, down) of --model's config (default: hidden 768,\n"
    "intermediate 2048, 12 heads, 4 KV heads, head_dim 64) at M = 128, 512, 2048 rows (--lengths):\n"
    "GFLOP/s (median of --reps, default 5), the share of the FMA peak measured in the same run, and\n"
    "whether rows 0, M/2 and M-1 computed alone equal the same rows of the M-row product bit for bit\n"
    "(row-invariant: what batch invariance needs). Rows \"LIB/C\": the same library called on\n"
    "exactly C rows at a time (--chunk, default 64; zero-padded), a fixed blocking imposed from\n"
    "outside.\n"
    "Where the CPU runs AMX natively, the header gives the TDPBF16PS peak too and rows\n"
    "\"graphswap-amx\" run the same layer with bf16 weights in the --bf16-activations=amx order\n"
    "(their % peak: of the AMX peak).\n"
    "\n"
    "  --model DIR    take the shapes from DIR/config.json\n"
    "  --libs LIST    the libraries to try (default openblas,blis,onednn; \"none\": graphswap alone)\n"
    "  --threads N    threads for every engine (default: all cores)\n";

int srv_bench_blas(int argc, char **argv)
{
    const char *model = NULL;
    int lengths[16] = {128, 512, 2048}, n_lengths = 3, reps = 5, threads = 0, chunk = 64;
    const char *want = "openblas,blis,onednn";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            return 0;
        }
        if (srv_arg_str(argc, argv, &i, "--model", &model) || srv_arg_int(argc, argv, &i, "--reps", 1, 1000, &reps) ||
            srv_arg_int(argc, argv, &i, "--threads", 1, 256, &threads) ||
            srv_arg_int(argc, argv, &i, "--chunk", 1, 4096, &chunk) || srv_arg_str(argc, argv, &i, "--libs", &want))
            continue;
        if (strcmp(argv[i], "--lengths") == 0 && i + 1 < argc) {
            n_lengths = bench_int_list("--lengths", argv[++i], 1, 1 << 15, lengths, 16);
            continue;
        }
        srv_die_usage("bench blas", argv[i]);
    }
    int H = 768, I = 2048, nh = 12, nkv = 4, hd = 64;
    if (model) {
        char err[1024];
        mdl_config c;
        if (mdl_config_load(model, &c, err, sizeof err) != 0) srv_die("%s", err);
        H = c.hidden, I = c.intermediate, nh = c.heads, nkv = c.kv_heads, hd = c.head_dim;
    }
    const blas_shape sh[4] = {
        {"qkv", H, (nh + 2 * nkv) * hd}, {"o", nh * hd, H}, {"gate_up", H, 2 * I}, {"down", I, H}};
    const int nsh = 4;

    bench_preflight("blas", "the f32 CPU matmul against the installed BLAS libraries, one layer's prefill matmuls");
    kern_pool *pool = kern_pool_create(threads);
    if (!pool) srv_die("bench blas: cannot start the worker pool");
    threads = kern_pool_threads(pool);
    const char *isa;
    const double peak = bench_fma_peak(pool, &isa, 0);
    const double amx_peak = bench_fma_peak(pool, &isa, 2); /* 0 without native AMX */

    /* the libraries read their thread counts from the environment when loaded */
    char tn[16];
    snprintf(tn, sizeof tn, "%d", threads);
    setenv("OPENBLAS_NUM_THREADS", tn, 1);
    setenv("BLIS_NUM_THREADS", tn, 1);
    setenv("OMP_NUM_THREADS", tn, 1);
    static const char *const so_openblas[] = {"libopenblas.so.0", "libopenblas.so", NULL};
    static const char *const so_blis[] = {"libblis.so.4", "libblis.so", NULL};
    static const char *const so_onednn[] = {"libdnnl.so.3", "libdnnl.so.2", "libdnnl.so", NULL};
    blas_lib libs[ENG_COUNT] = {
        [ENG_OPENBLAS] = {.name = "openblas", .sonames = so_openblas, .package = "libopenblas0-pthread"},
        [ENG_BLIS] = {.name = "blis", .sonames = so_blis, .package = "libblis4-pthread"},
        [ENG_ONEDNN] = {.name = "onednn", .sonames = so_onednn, .package = "libdnnl2"},
    };
    printf("threads: %d  isa: %s  FMA peak: %.1f GFLOP/s", threads, isa, peak);
    if (amx_peak > 0) printf("  AMX peak (TDPBF16PS, bf16): %.1f GFLOP/s", amx_peak);
    printf("\n");
    printf("shapes (K x N, Y = X W^T):");
    for (int s = 0; s < nsh; s++) printf(" %s %dx%d", sh[s].name, sh[s].K, sh[s].N);
    printf("%s%s\n", model ? "  from " : "  (default)", model ? model : "");
    printf("graphswap: kernels %s\n", kern_cpu_isa_name());

    int maxM = 1, maxK = 1, maxN = 1;
    for (int i = 0; i < n_lengths; i++) maxM = lengths[i] > maxM ? lengths[i] : maxM;
    for (int s = 0; s < nsh; s++) {
        maxK = sh[s].K > maxK ? sh[s].K : maxK;
        maxN = sh[s].N > maxN ? sh[s].N : maxN;
    }
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    float *x = aligned_alloc(64, (size_t)maxM * (size_t)maxK * sizeof(float));
    float *y = aligned_alloc(64, (size_t)maxM * (size_t)maxN * sizeof(float));
    float *y1 = aligned_alloc(64, (size_t)maxN * sizeof(float));
    double *t = malloc((size_t)reps * sizeof *t);
    float *w[4];
    float *xp = aligned_alloc(64, (size_t)chunk * (size_t)maxK * sizeof(float));
    float *yp = aligned_alloc(64, (size_t)chunk * (size_t)maxN * sizeof(float));
    if (!x || !y || !y1 || !t || !xp || !yp) srv_die("out of memory");
    for (size_t i = 0; i < (size_t)maxM * (size_t)maxK; i++) x[i] = frand(&seed);
    for (int s = 0; s < nsh; s++) {
        const size_t n = (size_t)sh[s].K * (size_t)sh[s].N;
        if (!(w[s] = aligned_alloc(64, n * sizeof(float)))) srv_die("out of memory");
        for (size_t i = 0; i < n; i++) w[s][i] = frand(&seed) * 0.05f;
    }
    blas_run run = {.sh = sh, .nsh = nsh, .reps = reps, .chunk = chunk, .threads = threads, .w = w, .x = x, .y = y,
                    .y1 = y1, .xp = xp, .yp = yp, .t = t, .peak = peak, .libs = libs, .want = want};
    for (int s = 0; s < nsh; s++) run.flop_row += 2.0 * sh[s].K * sh[s].N;
    blas_in_child(&run); /* M 0: which libraries load */

    const blas_engine gs = {.pool = pool};
    /* where AMX runs natively: the same layer with bf16 weights in the amx order (a row
     * "graphswap-amx", its share of the AMX peak, not the FMA peak) */
    kern_pool *apool = NULL;
    uint16_t *wb[4] = {0};
    if (amx_peak > 0) {
        apool = kern_pool_create(threads);
        if (!apool) srv_die("bench blas: cannot start the worker pool");
        kern_pool_set_bf16_activations(apool, KERN_BF16_ACT_AMX);
        for (int s = 0; s < nsh; s++) {
            const size_t n = (size_t)sh[s].K * (size_t)sh[s].N;
            if (!(wb[s] = aligned_alloc(64, (n * 2 + 63) / 64 * 64))) srv_die("out of memory");
            for (size_t i = 0; i < n; i++) wb[s][i] = kern_f32_to_bf16(w[s][i]);
        }
        printf("graphswap-amx: bf16 weights, --bf16-activations=amx; %% peak is of the AMX peak\n");
    }
    const blas_engine gsa = {.pool = apool, .wf = w, .wb = wb, .nw = nsh};
    printf("%-6s %-12s %10s %10s %8s  %s\n", "M", "engine", "ms/layer", "GFLOP/s", "% peak", "row-invariant");
    for (int li = 0; li < n_lengths; li++) {
        run.M = lengths[li];
        print_row(&run, &gs, "graphswap");
        usleep(200000); /* the pool's workers back to sleep */
        if (apool) {
            blas_run ra = run;
            ra.peak = amx_peak;
            print_row(&ra, &gsa, "graphswap-amx");
            usleep(200000);
        }
        blas_in_child(&run);
    }
    for (int s = 0; s < nsh; s++) free(w[s]), free(wb[s]);
    if (apool) kern_pool_destroy(apool);
    free(x);
    free(y);
    free(y1);
    free(xp);
    free(yp);
    free(t);
    kern_pool_destroy(pool);
    return 0;
}
