/* bench/bench_decode.c — `graphswap bench decode`: decode throughput against the memory floor.
 *
 * Decode on a CPU reads every weight once per step, so the floor for one step is
 * (weight bytes read per step) / (memory bandwidth). The same run measures the machine's memcpy
 * bandwidth (bytes copied per second, all worker threads) and a read-only bandwidth, then decodes
 * at batch 1, 4, 16 with captured plans and eagerly, and prints the ratios. Nothing here asserts a
 * speed: the figures go in the README with the machine and commit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "models/config.h"
#include "bench/bench.h"
#include "server/core/cli.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    char *src, *dst;
    size_t n;
    int mode; /* 0 copy, 1 read */
} bw_ctx;

static void bw_task(void *vctx, int tid, int nth)
{
    bw_ctx *c = vctx;
    size_t chunk = (c->n / (size_t)nth) & ~(size_t)63;
    size_t b = chunk * (size_t)tid, e = tid == nth - 1 ? c->n : b + chunk;
    if (c->mode == 0) {
        memcpy(c->dst + b, c->src + b, e - b);
    } else {
        const double *p = (const double *)(c->src + b);
        size_t k = (e - b) / sizeof(double);
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= k; i += 4) {
            s0 += p[i];
            s1 += p[i + 1];
            s2 += p[i + 2];
            s3 += p[i + 3];
        }
        bench_sink(s0 + s1 + s2 + s3);
    }
}

/* Best of several passes over a buffer much larger than the caches, GB/s. */
static double bandwidth(kern_pool *pool, int mode)
{
    bw_ctx c = {.n = (size_t)512 << 20, .mode = mode};
    c.src = malloc(c.n);
    c.dst = malloc(c.n);
    if (!c.src || !c.dst) srv_die("out of memory for the bandwidth test");
    memset(c.src, 1, c.n);
    memset(c.dst, 2, c.n);
    double best = 0;
    for (int it = 0; it < 6; it++) {
        double t0 = now_s();
        kern_pool_run(pool, bw_task, &c);
        double gbs = (double)c.n / (now_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    free(c.src);
    free(c.dst);
    return best;
}

typedef struct {
    double tok_s, step_ms;
    eng_stats delta; /* engine counters over the timed part */
} decode_result;

/* d += s (sign 1) or d -= s (sign -1) over the speculative-decoding counters bench spec reports
 * (unsigned counters: adding (uint64_t)-1 * x subtracts x, modulo 2^64) */
static void spec_counters_add(eng_stats *d, const eng_stats *s, int sign)
{
    const uint64_t u = (uint64_t)(int64_t)sign;
    d->spec_drafts += u * s->spec_drafts;
    d->spec_draft_tokens += u * s->spec_draft_tokens;
    d->spec_accepted += u * s->spec_accepted;
    for (int k = 0; k < ENG_SPEC_MAX_POS; k++) d->spec_accepted_per_pos[k] += u * s->spec_accepted_per_pos[k];
    d->spec_ns_context += sign * s->spec_ns_context;
    d->spec_ns_draft += sign * s->spec_ns_draft;
    d->spec_ns_verify += sign * s->spec_ns_verify;
}

static decode_result run_decode(srv_runtime_opts *ro, int batch, int tokens)
{
    char err[1024];
    srv_runtime rt;
    ro->ecfg.max_seqs = batch;
    if (srv_runtime_open(&rt, ro, err, sizeof err) != 0) srv_die("%s", err);
    const int V = rt.m->cfg.vocab, P = 16;
    eng_request *reqs = calloc((size_t)batch, sizeof *reqs);
    int32_t *prompts = malloc((size_t)batch * P * sizeof(int32_t));
    int32_t *out = malloc((size_t)batch * (size_t)tokens * sizeof(int32_t));
    float *lps = malloc((size_t)batch * (size_t)tokens * sizeof(float));
    if (!reqs || !prompts || !out || !lps) srv_die("out of memory");
    for (int b = 0; b < batch; b++) {
        for (int i = 0; i < P; i++) prompts[b * P + i] = (int32_t)((b * 7919 + i * 104729) % V);
        eng_request *r = &reqs[b];
        r->prompt = prompts + b * P;
        r->n_prompt = P;
        r->max_tokens = tokens;
        r->ignore_eos = 1;
        r->sp.top_p = 1;
        r->out_tokens = out + (size_t)b * (size_t)tokens;
        r->out_logprobs = lps + (size_t)b * (size_t)tokens;
        if (eng_submit(rt.e, r, NULL, err, sizeof err) != 0) srv_die("%s", err);
    }
    const eng_stats *st = eng_get_stats(rt.e);
    /* prefill every prompt (one step, or more when batch * 16 rows exceed a step), then one decode
     * step to warm the caches, all outside the timed part */
    while (st->generated_tokens < (uint64_t)batch) eng_step(rt.e);
    eng_step(rt.e);
    eng_stats s0 = *st;
    double t0 = now_s();
    eng_run_until_idle(rt.e);
    double dt = now_s() - t0;
    decode_result res = {.tok_s = (double)(st->generated_tokens - s0.generated_tokens) / dt,
                         .step_ms = 1e3 * dt / (double)(st->steps - s0.steps)};
    res.delta = *st;
    res.delta.steps -= s0.steps;
    res.delta.generated_tokens -= s0.generated_tokens;
    spec_counters_add(&res.delta, &s0, -1);
    free(reqs);
    free(prompts);
    free(out);
    free(lps);
    srv_runtime_close(&rt);
    return res;
}

static const char help[] =
    "usage: graphswap bench decode --model DIR [--tokens N] [--threads N] [--batches LIST]\n"
    "                              [--modes plan|eager|plan,eager]\n"
    "\n"
    "Decode tokens/s at batch 1, 4, 16 and 32 (or --batches, e.g. 1,8) with captured plans and\n"
    "eagerly (or --modes), next to the memcpy and read bandwidth measured in the same run and the\n"
    "floor they imply (weight bytes per step / bandwidth). \"vs read\" is the weight bytes a step\n"
    "reads per second as a share of the read bandwidth: 100% is the memory floor.\n";

static int bench_decode(int argc, char **argv)
{
    srv_runtime_opts ro;
    srv_runtime_defaults(&ro);
    int tokens = 64;
    int batches[16] = {1, 4, 16, 32}, n_batches = 4;
    int modes[2] = {1, 0}, n_modes = 2; /* 1: plan, 0: eager */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            fputs(srv_runtime_help, stdout);
            return 0;
        }
        if (srv_runtime_arg(argc, argv, &i, &ro) || srv_arg_int(argc, argv, &i, "--tokens", 4, 1 << 16, &tokens))
            continue;
        if (strcmp(argv[i], "--batches") == 0 && i + 1 < argc) {
            n_batches = bench_int_list("--batches", argv[++i], 1, 4096, batches, 16);
            continue;
        }
        if (strcmp(argv[i], "--modes") == 0 && i + 1 < argc) {
            const char *m = argv[++i];
            if (strcmp(m, "plan") == 0) n_modes = 1, modes[0] = 1;
            else if (strcmp(m, "eager") == 0) n_modes = 1, modes[0] = 0;
            else if (strcmp(m, "plan,eager") == 0) n_modes = 2, modes[0] = 1, modes[1] = 0;
            else srv_die("--modes: expected plan, eager or plan,eager, got \"%s\"", m);
            continue;
        }
        srv_die_usage("bench decode", argv[i]);
    }
    bench_preflight("decode", "decode tokens/s at batch 1, 4, 16, 32 (plans and eager) against the memory-bandwidth floor");
    char err[1024];
    srv_runtime rt;
    if (srv_runtime_open(&rt, &ro, err, sizeof err) != 0) srv_die("%s", err);
    const mdl_model *m = rt.m;
    /* bytes a decode step reads: every parameter except the embedding table (one row is gathered),
     * which is read in full anyway when it doubles as the tied lm_head */
    double step_bytes = (double)m->weight_bytes;
    if (m->lm_head != m->embed) step_bytes -= (double)m->params[m->embed].bytes;
    size_t params = 0;
    for (int i = 0; i < m->n_params; i++) params += (size_t)(m->params[i].rows * m->params[i].cols);
    int threads = ro.threads;
    kern_pool *pool = kern_pool_create(threads);
    double copy_bw = bandwidth(pool, 0), read_bw = bandwidth(pool, 1);
    int nthreads = kern_pool_threads(pool);
    kern_pool_destroy(pool);
    srv_runtime_close(&rt);

    double floor_tok_s = copy_bw * 1e9 / step_bytes;
    printf("model: %s  params: %.1fM  weight bytes per decode step: %.1f MB  threads: %d\n", ro.model_dir,
           (double)params / 1e6, step_bytes / 1e6, nthreads);
    printf("memcpy bandwidth: %.2f GB/s   read bandwidth: %.2f GB/s\n", copy_bw, read_bw);
    printf("floor at batch 1: %.2f tok/s (memcpy)   %.2f tok/s (read)\n", floor_tok_s,
           read_bw * 1e9 / step_bytes);
    printf("%-6s %-7s %10s %10s %12s %12s %9s\n", "batch", "mode", "tok/s", "step ms", "GB/s weights", "vs floor",
           "vs read");
    for (int bi = 0; bi < n_batches; bi++) {
        for (int mi = 0; mi < n_modes; mi++) {
            ro.ecfg.use_plans = modes[mi];
            decode_result r = run_decode(&ro, batches[bi], tokens);
            double gbs = step_bytes / (r.step_ms * 1e-3) / 1e9;
            printf("%-6d %-7s %10.2f %10.2f %12.2f %11.1f%% %8.1f%%\n", batches[bi], modes[mi] ? "plan" : "eager",
                   r.tok_s, r.step_ms, gbs, 100.0 * gbs / copy_bw, 100.0 * gbs / read_bw);
            fflush(stdout);
        }
    }
    return 0;
}

#define BENCH_SPEC_MAX_REPS 32

/* the median of tok_s (field 0) or step_ms (field 1) over n runs */
static double median_field(const decode_result *x, int n, int field)
{
    double v[BENCH_SPEC_MAX_REPS];
    for (int i = 0; i < n; i++) v[i] = field ? x[i].step_ms : x[i].tok_s;
    return bench_median(v, n);
}

static const char spec_help[] =
    "usage: graphswap bench spec --model T --draft D [--tokens N] [--threads N] [--batches LIST]\n"
    "                            [--reps N]\n"
    "\n"
    "Speculative decoding against plain decoding in the same run, at batch 1 and 8 (or --batches,\n"
    "e.g. 1): tokens/s, mean acceptance length, acceptance per draft position, and the speculative\n"
    "step's time split into draft / verify / context, with its cost relative to one plain decode step.\n"
    "--reps N (default 1, at most 32) alternates N plain and N speculative runs per batch and reports\n"
    "medians (the machine's speed drifts between runs), then each pair's step cost.\n";

static int bench_spec(int argc, char **argv)
{
    srv_runtime_opts ro;
    srv_runtime_defaults(&ro);
    int tokens = 64;
    int batches[16] = {1, 8}, n_batches = 2, reps = 1;
    for (int i = 1; i < argc; i++) {
        if (srv_arg_int(argc, argv, &i, "--reps", 1, BENCH_SPEC_MAX_REPS, &reps)) continue;
        if (strcmp(argv[i], "--batches") == 0 && i + 1 < argc) {
            n_batches = bench_int_list("--batches", argv[++i], 1, 4096, batches, 16);
            continue;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(spec_help, stdout);
            fputs(srv_runtime_help, stdout);
            return 0;
        }
        if (srv_runtime_arg(argc, argv, &i, &ro) || srv_arg_int(argc, argv, &i, "--tokens", 4, 1 << 16, &tokens))
            continue;
        srv_die_usage("bench spec", argv[i]);
    }
    if (!ro.draft_dir) srv_die("--draft DIR is required");
    const char *draft = ro.draft_dir;
    /* drafts verified per step: the drafter's width (DFlash: block - 1, DSpark: block, as
     * engine/engine.c sets it), capped by --num-spec-tokens; one column per position */
    char err[1024];
    mdl_config dc;
    if (mdl_config_load(draft, &dc, err, sizeof err) != 0) srv_die("%s", err);
    int width = dc.arch == MDL_ARCH_DSPARK ? dc.block_size : dc.block_size - 1;
    if (ro.ecfg.num_spec_tokens > 0 && width > ro.ecfg.num_spec_tokens) width = ro.ecfg.num_spec_tokens;
    if (width > ENG_SPEC_MAX_POS) width = ENG_SPEC_MAX_POS;
    if (width < 1) width = 1;
    bench_preflight("spec", "speculative decoding vs plain decoding at batch 1 and 8 (same prompts, greedy)");
    printf("target: %s  drafter: %s (%s, %d drafts per step)\n", ro.model_dir, draft, mdl_arch_name(dc.arch), width);
    printf("columns: tok/s generated tokens per second; step ms wall time per engine step; draft%% verify%% ctx%%\n"
           "  the speculative step's time in drafting, verifying and updating the drafter context; mean AL\n"
           "  tokens emitted per step (1 + accepted drafts per step); step/dec a step's cost in plain decode\n"
           "  steps; p1..p%d the share of steps whose draft at that position was accepted\n", width);
    printf("%-6s %-6s %9s %9s %8s %8s %8s %8s %9s ", "batch", "mode", "tok/s", "step ms", "draft%", "verify%", "ctx%",
           "mean AL", "step/dec");
    for (int k = 0; k < width; k++) {
        char col[16];
        snprintf(col, sizeof col, "p%d", k + 1);
        printf(" %5s", col);
    }
    printf("\n");
    for (int bi = 0; bi < n_batches; bi++) {
        /* plain and speculative runs alternate, --reps times: the machine's speed drifts, so a
         * ratio of two runs taken minutes apart says little; medians of each, counters summed */
        decode_result p[BENCH_SPEC_MAX_REPS], r[BENCH_SPEC_MAX_REPS];
        eng_stats d = {0};
        for (int k = 0; k < reps; k++) {
            ro.draft_dir = NULL;
            p[k] = run_decode(&ro, batches[bi], tokens);
            ro.draft_dir = draft;
            r[k] = run_decode(&ro, batches[bi], tokens);
            spec_counters_add(&d, &r[k].delta, 1);
        }
        const double p_tok = median_field(p, reps, 0), p_ms = median_field(p, reps, 1);
        const double r_tok = median_field(r, reps, 0), r_ms = median_field(r, reps, 1);
        printf("%-6d %-6s %9.2f %9.2f %8s %8s %8s %8s %9s\n", batches[bi], "plain", p_tok, p_ms, "-", "-", "-", "1.00",
               "1.00");
        double tot = d.spec_ns_draft + d.spec_ns_verify + d.spec_ns_context;
        if (tot <= 0) tot = 1;
        double al = d.spec_drafts ? 1.0 + (double)d.spec_accepted / (double)d.spec_drafts : 1.0;
        printf("%-6d %-6s %9.2f %9.2f %7.1f%% %7.1f%% %7.1f%% %8.2f %9.2f ", batches[bi], "spec", r_tok, r_ms,
               100 * d.spec_ns_draft / tot, 100 * d.spec_ns_verify / tot, 100 * d.spec_ns_context / tot, al,
               r_ms / p_ms);
        for (int k = 0; k < width; k++)
            printf(" %5.2f", d.spec_drafts ? (double)d.spec_accepted_per_pos[k] / (double)d.spec_drafts : 0.0);
        printf("\n");
        if (reps > 1) {
            printf("  step/dec of each alternated pair:");
            for (int k = 0; k < reps; k++) printf(" %.2f", r[k].step_ms / p[k].step_ms);
            printf("\n");
        }
        fflush(stdout);
    }
    return 0;
}

static const char bench_help[] =
    "usage: graphswap bench <bench> [options]   (graphswap bench <bench> --help for its options)\n"
    "\n"
    "benches:\n"
    "  decode     decode tokens/s at batch 1, 4, 16, 32 (plans and eager) against the memcpy / read floor\n"
    "  prefill    prompt tokens/s at lengths 128, 512, 2048 against the FMA peak of the same run\n"
    "  blas       the f32 CPU matmul against OpenBLAS / BLIS / oneDNN: GFLOP/s and row invariance\n"
    "  gemv       decode-shaped matmuls by weight dtype (f32, bf16, FP8 e4m3 + block scales): ms, GB/s\n"
    "  spec       speculative decoding with a drafter vs plain decoding: tok/s, acceptance per position\n"
    "  serve      a running (or started) server over loopback HTTP: req/s, tok/s, TTFT, HTTP overhead\n"
    "  update     weight-update throughput over loopback HTTP by bucket size (GB/s, hook, guard)\n"
    "  transfer   weight-update throughput inside the process (host and device paths) vs copy floors\n";

int srv_cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "decode") == 0) return bench_decode(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "spec") == 0) return bench_spec(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "prefill") == 0) return srv_bench_prefill(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "blas") == 0) return srv_bench_blas(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "gemv") == 0) return srv_bench_gemv(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "serve") == 0) return srv_bench_serve(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "update") == 0) return srv_bench_update(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "transfer") == 0) return srv_bench_transfer(argc - 1, argv + 1);
    const int asked = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
    if (argc >= 2 && !asked) fprintf(stderr, "graphswap bench: unknown bench %s\n", argv[1]);
    fputs(bench_help, asked ? stdout : stderr);
    return asked ? 0 : 2;
}
