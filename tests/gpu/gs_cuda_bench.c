/* tests/gpu/gs_cuda_bench.c — decode latency on one GPU: CUDA graphs vs eager vs the HBM floor.
 *
 * For one checkpoint, in one run:
 *  1. the HBM floor's bandwidth: a large device-to-device copy (cudaMemcpyAsync), best of 10, counting
 *     bytes read + written;
 *  2. forward-step latency of a decode step at each batch size (every row a different sequence at
 *     context --ctx): the same tape replayed as a CUDA graph and run eagerly, timed with CUDA events
 *     over back-to-back steps (device time, launch overhead included where it stalls the GPU) and
 *     wall-clock with a synchronize per step; the floor is (weight bytes read per step + KV bytes
 *     read) / copy bandwidth;
 *  3. end to end through the engine (scheduler, logits download, sampling): decode tokens/s at each
 *     batch size with graphs and eagerly (--engine-tokens 0 skips it).
 * Prints a table and appends one JSON object per measurement to --json. Exits 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "engine/backend/backend_cuda.h"
#include "engine/engine.h"
#include "gpu_fwd.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, cudaError_t e)
{
    fprintf(stderr, "gs_cuda_bench: %s: %s\n", what, cudaGetErrorString(e));
    exit(1);
}
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) die(#call, e_);                                                     \
    } while (0)

/* Device-to-device copy bandwidth in GB/s (read + written bytes), best of 10. */
static double copy_bandwidth(size_t bytes)
{
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    CK(cudaMemset(b, 2, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < 12; i++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 2 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes / (best * 1e-3) / 1e9;
}

typedef struct {
    double dev_ms, wall_ms;
} timing;

/* iters back-to-back steps timed with events, then iters/2 steps each followed by a synchronize. */
static timing time_steps(gpu_fwd *f, int rows, eng_plan *plan, int iters)
{
    eng_backend *be = f->be;
    cudaStream_t s = (cudaStream_t)eng_backend_cuda_stream(be);
    const eng_tape *tape = plan ? NULL : gpu_fwd_emit(f, rows);
    for (int i = 0; i < 3; i++) {
        if (plan) be->ops->plan_launch(be, plan);
        else be->ops->run(be, tape);
    }
    be->ops->synchronize(be);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < iters; i++) {
        if (plan) be->ops->plan_launch(be, plan);
        else be->ops->run(be, tape);
    }
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    timing t = {.dev_ms = ms / iters};
    const int wi = iters / 2 > 1 ? iters / 2 : 1;
    double t0 = now_s();
    for (int i = 0; i < wi; i++) {
        if (plan) be->ops->plan_launch(be, plan);
        else be->ops->run(be, tape);
        be->ops->synchronize(be);
    }
    t.wall_ms = (now_s() - t0) * 1e3 / wi;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return t;
}

typedef struct {
    double tok_s, step_ms;
} e2e;

static e2e engine_decode(eng_backend *be, mdl_model *m, int batch, int tokens, int use_plans)
{
    char err[1024];
    eng_config ec;
    eng_config_defaults(&ec);
    const int P = 16;
    ec.max_seqs = batch;
    ec.max_step_tokens = batch * P > 32 ? batch * P : 32;
    ec.prefill_chunk = P;
    ec.max_model_len = P + tokens + 8;
    ec.use_plans = use_plans;
    ec.prefix_caching = 0;
    const size_t per_tok = 2u * (size_t)m->cfg.layers * (size_t)m->cfg.kv_heads * (size_t)m->cfg.head_dim * 4;
    ec.kv_bytes = (size_t)batch * (size_t)(ec.max_model_len + 32) * per_tok;
    eng_engine *e = eng_create(&ec, m, be, err, sizeof err);
    if (!e) {
        fprintf(stderr, "gs_cuda_bench: engine: %s\n", err);
        exit(1);
    }
    const int V = m->cfg.vocab;
    eng_request *reqs = calloc((size_t)batch, sizeof *reqs);
    int32_t *prompts = malloc((size_t)batch * P * 4), *out = malloc((size_t)batch * tokens * 4);
    float *lps = malloc((size_t)batch * tokens * 4);
    for (int b = 0; b < batch; b++) {
        for (int i = 0; i < P; i++) prompts[b * P + i] = (int32_t)((b * 7919 + i * 104729) % V);
        eng_request *r = &reqs[b];
        r->prompt = prompts + b * P;
        r->n_prompt = P;
        r->max_tokens = tokens;
        r->ignore_eos = 1;
        r->sp.top_p = 1;
        r->out_tokens = out + (size_t)b * tokens;
        r->out_logprobs = lps + (size_t)b * tokens;
        if (eng_submit(e, r, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "gs_cuda_bench: submit: %s\n", err);
            exit(1);
        }
    }
    eng_step(e); /* prefill */
    eng_step(e); /* first decode step */
    const eng_stats *st = eng_get_stats(e);
    const uint64_t g0 = st->generated_tokens, s0 = st->steps;
    const double t0 = now_s();
    eng_run_until_idle(e);
    const double dt = now_s() - t0;
    e2e r = {.tok_s = (double)(st->generated_tokens - g0) / dt,
             .step_ms = 1e3 * dt / (double)(st->steps - s0 ? st->steps - s0 : 1)};
    eng_destroy(e);
    free(reqs);
    free(prompts);
    free(out);
    free(lps);
    return r;
}

static const char usage[] =
    "usage: gs_cuda_bench --model DIR [--name NAME] [--batches 1,8,32] [--ctx 512] [--iters 50]\n"
    "                     [--engine-tokens 64] [--copy-mb 2048] [--json FILE]\n";

int main(int argc, char **argv)
{
    const char *dir = NULL, *name = NULL, *json = NULL, *batches_s = "1,8,32";
    int ctx = 512, iters = 50, etok = 64, copy_mb = 2048;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fputs(usage, stderr);
            return 2;
        }
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--name")) name = v;
        else if (!strcmp(a, "--json")) json = v;
        else if (!strcmp(a, "--batches")) batches_s = v;
        else if (!strcmp(a, "--ctx")) ctx = atoi(v);
        else if (!strcmp(a, "--iters")) iters = atoi(v);
        else if (!strcmp(a, "--engine-tokens")) etok = atoi(v);
        else if (!strcmp(a, "--copy-mb")) copy_mb = atoi(v);
        else {
            fputs(usage, stderr);
            return 2;
        }
        i++;
    }
    if (!dir || ctx < 1 || iters < 2) {
        fputs(usage, stderr);
        return 2;
    }
    if (!name) name = dir;
    int batches[16], nb = 0, maxb = 1;
    for (const char *p = batches_s; *p && nb < 16;) {
        batches[nb] = atoi(p);
        if (batches[nb] < 1) {
            fputs(usage, stderr);
            return 2;
        }
        if (batches[nb] > maxb) maxb = batches[nb];
        nb++;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    if (eng_backend_cuda_device_count() <= 0) {
        printf("no usable CUDA device: skipped (exit 77)\n");
        return 77;
    }
    const double bw = copy_bandwidth((size_t)copy_mb << 20);
    char err[1024];
    eng_backend_config bc = {.arena_bytes = 0, .threads = 0, .checked = 0};
    eng_backend *be = eng_backend_cuda_create(&bc, err, sizeof err);
    if (!be) {
        fprintf(stderr, "gs_cuda_bench: %s\n", err);
        return 1;
    }
    char gpu[256];
    eng_backend_cuda_describe(be, gpu, sizeof gpu);
    gpu_fwd f;
    double t_load = now_s();
    if (gpu_fwd_open(&f, be, dir, maxb, maxb, ctx + 8, 16, err, sizeof err) != 0) {
        fprintf(stderr, "gs_cuda_bench: %s\n", err);
        return 1;
    }
    t_load = now_s() - t_load;
    const mdl_model *m = f.m;
    double step_bytes = (double)m->weight_bytes;
    if (m->lm_head != m->embed) step_bytes -= (double)m->params[m->embed].bytes; /* one row gathered */
    const double kv_per_tok = 2.0 * m->cfg.layers * m->cfg.kv_heads * m->cfg.head_dim * 4.0;
    FILE *jf = json ? fopen(json, "a") : NULL;
    printf("gpu: %s\nmodel: %s (%s)  weights read per step: %.1f MB  load: %.1f s\n", gpu, name, dir,
           step_bytes / 1e6, t_load);
    printf("device-to-device copy: %.0f GB/s (read + write)\n", bw);
    printf("%-14s %5s %6s %10s %10s %10s %10s %10s %8s %8s\n", "model", "batch", "ctx", "graph ms", "eager ms",
           "graph wall", "eager wall", "floor ms", "g/floor", "e/g");
    const int V = m->cfg.vocab;
    for (int bi = 0; bi < nb; bi++) {
        const int B = batches[bi];
        int32_t *tok = malloc((size_t)B * 4), *pos = malloc((size_t)B * 4), *slot = malloc((size_t)B * 4),
                *li = malloc((size_t)B * 4);
        for (int i = 0; i < B; i++) {
            tok[i] = (i * 7919 + 11) % V;
            pos[i] = ctx - 1;
            slot[i] = i;
            li[i] = i;
        }
        gpu_fwd_params(&f, tok, pos, slot, B, li, B);
        timing eager = time_steps(&f, B, NULL, iters);
        eng_plan *plan = be->ops->plan_create(be, gpu_fwd_emit(&f, B));
        if (!plan) {
            fprintf(stderr, "gs_cuda_bench: plan capture failed\n");
            return 1;
        }
        timing graph = time_steps(&f, B, plan, iters);
        be->ops->plan_free(be, plan);
        const double bytes = step_bytes + (double)B * ctx * kv_per_tok;
        const double floor_ms = bytes / (bw * 1e9) * 1e3;
        printf("%-14s %5d %6d %10.3f %10.3f %10.3f %10.3f %10.3f %8.2f %8.2f\n", name, B, ctx, graph.dev_ms,
               eager.dev_ms, graph.wall_ms, eager.wall_ms, floor_ms, graph.dev_ms / floor_ms,
               eager.dev_ms / graph.dev_ms);
        fflush(stdout);
        if (jf)
            fprintf(jf,
                    "{\"kind\":\"step\",\"model\":\"%s\",\"gpu\":\"%s\",\"batch\":%d,\"ctx\":%d,\"graph_ms\":%.4f,"
                    "\"eager_ms\":%.4f,\"graph_wall_ms\":%.4f,\"eager_wall_ms\":%.4f,\"floor_ms\":%.4f,"
                    "\"bytes_per_step\":%.0f,\"copy_gbps\":%.1f}\n",
                    name, gpu, B, ctx, graph.dev_ms, eager.dev_ms, graph.wall_ms, eager.wall_ms, floor_ms, bytes, bw);
        free(tok);
        free(pos);
        free(slot);
        free(li);
    }
    if (etok > 0) {
        printf("%-14s %5s %12s %12s %12s %12s\n", "engine", "batch", "graph tok/s", "graph ms", "eager tok/s",
               "eager ms");
        for (int bi = 0; bi < nb; bi++) {
            const int B = batches[bi];
            e2e g = engine_decode(be, f.m, B, etok, 1);
            e2e e = engine_decode(be, f.m, B, etok, 0);
            printf("%-14s %5d %12.1f %12.3f %12.1f %12.3f\n", name, B, g.tok_s, g.step_ms, e.tok_s, e.step_ms);
            fflush(stdout);
            if (jf)
                fprintf(jf,
                        "{\"kind\":\"engine\",\"model\":\"%s\",\"batch\":%d,\"graph_tok_s\":%.2f,\"graph_step_ms\":%.4f,"
                        "\"eager_tok_s\":%.2f,\"eager_step_ms\":%.4f}\n",
                        name, B, g.tok_s, g.step_ms, e.tok_s, e.step_ms);
        }
    }
    if (jf) fclose(jf);
    gpu_fwd_close(&f);
    eng_backend_destroy(be);
    return 0;
}
