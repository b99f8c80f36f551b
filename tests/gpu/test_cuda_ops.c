/* tests/gpu/test_cuda_ops.c — every CUDA op against the CPU reference kernels (kern_cpu_exec) on random
 * inputs, through the CUDA backend (arena, upload, eager run, download).
 *
 * Each case builds one op twice (host buffers for the CPU, arena buffers for the GPU) from the same
 * initial contents: inputs random, padding rows of inputs (past n_rows) NaN-poisoned so that a kernel
 * reading them would turn a live result into NaN, every output element poisoned. Then: live elements
 * within bf16 tolerance of the CPU's (copies bitwise), NaN never passes, and every element the CPU
 * left unwritten (rows past n, columns outside the op, cache positions not addressed) still holds
 * the poison on the GPU. The cases of every op are tests/opcases (opcases.c), shared with the emulated
 * kernels' tests (tests/emu): each op family runs here through gpu_run (larger sample shapes, e.g.
 * V 151936 over 8 rows, only here). Shapes cover each kernel's paths: tensor-core (1, 2, 4 row groups, several
 * 32-row tiles) / CUDA-core matmuls (cuBLASLt: test_cuda_invariance, under GS_CUDA_FAST_GEMM=1), split and unsplit attention, GQA groups, head dims 16..256, in-place ops, views. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/backend/backend_cuda.h"
#include "gpu_test.h"
#include "kernels/kern.h"
#include "tests/opcases/opcases.h"

static eng_backend *g_be;
static kern_pool *g_pool;

/* ---- the harness (tests/opcases/opcases.h): one op on the CPU and through the CUDA backend ------------ */
static int gpu_run(oc_harness *h, oc_case *t, const char *name)
{
    (void)h;
    kern_op cop = t->op, gop = t->op;
    void *cbuf[OC_SLOTS] = {0}, *gbuf[OC_SLOTS] = {0};
    for (int s = 0; s < OC_SLOTS; s++) {
        if (t->type[s] == OC_NONE || t->alias[s] >= 0) continue;
        cbuf[s] = malloc(t->bytes[s] ? t->bytes[s] : 1);
        assert_non_null(cbuf[s]);
        memcpy(cbuf[s], t->host[s], t->bytes[s]);
        gbuf[s] = g_be->ops->alloc(g_be, t->bytes[s], name);
        assert_non_null(gbuf[s]);
        g_be->ops->upload(g_be, gbuf[s], t->host[s], t->bytes[s]);
    }
    for (int s = 0; s < KERN_MAX_BUFS; s++) {
        if (t->alias[s] >= 0) {
            cbuf[s] = (char *)cbuf[t->alias[s]] + t->off[s];
            gbuf[s] = (char *)gbuf[t->alias[s]] + t->off[s];
        }
        cop.buf[s] = (kern_buf){cbuf[s], cbuf[s] ? t->bytes[s] : 0};
        gop.buf[s] = (kern_buf){gbuf[s], gbuf[s] ? t->bytes[s] : 0};
    }
    kern_cpu_exec(g_pool, &cop);
    /* twice: a second run from the same initial contents must give bitwise the same outputs */
    void *got[2][OC_SLOTS] = {{0}};
    for (int run = 0; run < (t->twice ? 2 : 1); run++) {
        if (run > 0)
            for (int s = 0; s < OC_SLOTS; s++)
                if (gbuf[s] && t->alias[s] < 0) g_be->ops->upload(g_be, gbuf[s], t->host[s], t->bytes[s]);
        eng_tape tape = {.ops = &gop, .n = 1, .cap = 1};
        g_be->ops->run(g_be, &tape);
        g_be->ops->synchronize(g_be);
        for (int s = 0; s < OC_SLOTS; s++) {
            if (t->alias[s] >= 0 || !oc_is_out(t->type[s])) continue;
            got[run][s] = malloc(t->bytes[s] ? t->bytes[s] : 1);
            assert_non_null(got[run][s]);
            g_be->ops->download(g_be, got[run][s], gbuf[s], t->bytes[s]);
        }
    }
    int bad = 0;
    for (int s = 0; s < OC_SLOTS; s++) {
        if (t->alias[s] >= 0 || !oc_is_out(t->type[s])) continue;
        char what[160];
        snprintf(what, sizeof what, "%.140s buf[%d]", name, s);
        if (got[1][s] && memcmp(got[0][s], got[1][s], t->bytes[s]) != 0) {
            fprintf(stderr, "%s: two GPU runs differ\n", what);
            bad++;
        }
        bad += oc_compare(t, s, cbuf[s], got[0][s], what);
        free(got[0][s]);
        free(got[1][s]);
    }
    for (int s = 0; s < OC_SLOTS; s++) {
        if (t->alias[s] >= 0 || t->type[s] == OC_NONE) continue;
        free(cbuf[s]);
        free(t->host[s]);
        g_be->ops->free(g_be, gbuf[s]);
    }
    return bad;
}

/* runs one family of the shared cases */
static void gpu_cases(void (*cases)(oc_harness *), const char *family)
{
    oc_harness h = {.emu = 0, .run = gpu_run};
    cases(&h);
    printf("%s: %d shared cases\n", family, h.n_run);
}

/* ---- the shared cases (tests/opcases/opcases.c) ------------------------------------------------------- */
static void test_embed(void **state)
{
    (void)state;
    gpu_cases(opcase_embed, "embed");
}

static void test_rmsnorm(void **state)
{
    (void)state;
    gpu_cases(opcase_rmsnorm, "rmsnorm");
}

static void test_matmul(void **state)
{
    (void)state;
    /* every path keeps the f32 activations (the tensor-core kernel as bf16 hi + lo); cuBLASLt under
     * GS_CUDA_FAST_GEMM=1: test_cuda_invariance */
    gpu_cases(opcase_matmul, "matmul");
    gpu_cases(opcase_matmul_fp8, "matmul fp8");
}

static void test_qk_norm_rope(void **state)
{
    (void)state;
    gpu_cases(opcase_qk_norm_rope, "qk_norm_rope");
}

static void test_kv_write(void **state)
{
    (void)state;
    gpu_cases(opcase_kv_write, "kv_write");
}

static void test_attention(void **state)
{
    (void)state;
    gpu_cases(opcase_attention, "attention");
}

static void test_silu_mul_add(void **state)
{
    (void)state;
    gpu_cases(opcase_silu_mul, "silu_mul");
    gpu_cases(opcase_add, "add");
}

static void test_gather_copy_cols(void **state)
{
    (void)state;
    gpu_cases(opcase_gather_rows, "gather_rows");
    gpu_cases(opcase_copy_cols, "copy_cols");
}

static void test_draft_select(void **state)
{
    (void)state;
    gpu_cases(opcase_draft_select, "draft_select");
}

static void test_confidence(void **state)
{
    (void)state;
    gpu_cases(opcase_confidence, "confidence");
}

static void test_sample(void **state)
{
    (void)state;
    gpu_cases(opcase_sample, "sample");
}

static void test_moe(void **state)
{
    (void)state;
    gpu_cases(opcase_moe_route, "moe_route");
    gpu_cases(opcase_moe_ffn, "moe_ffn");
}

int main(void)
{
    GPU_TEST_SKIP_WITHOUT_DEVICE();
    char err[256];
    eng_backend_config bc = {.arena_bytes = (size_t)2 << 30, .threads = 2, .checked = 1};
    g_be = eng_backend_cuda_create(&bc, err, sizeof err);
    if (!g_be) {
        fprintf(stderr, "cannot create the CUDA backend: %s\n", err);
        return 1;
    }
    g_pool = kern_pool_create(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_matmul),       cmocka_unit_test(test_qk_norm_rope),
        cmocka_unit_test(test_kv_write),     cmocka_unit_test(test_attention),
        cmocka_unit_test(test_silu_mul_add), cmocka_unit_test(test_gather_copy_cols),
        cmocka_unit_test(test_draft_select), cmocka_unit_test(test_confidence),
        cmocka_unit_test(test_sample),       cmocka_unit_test(test_moe),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_pool_destroy(g_pool);
    eng_backend_destroy(g_be);
    return rc;
}
