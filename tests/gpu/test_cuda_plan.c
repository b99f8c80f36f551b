/* tests/gpu/test_cuda_plan.c — the CUDA backend's contract: arena (zeroed, aligned, retired ranges),
 * transfers through the staging ring, device-side dtype conversion bit-identical to mdl_convert,
 * CUDA-graph replay bitwise equal to eager execution for every row count of the bucket, checked replay
 * catching a retired pointer, and data-dependent kernel checks reported instead of read out of bounds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "../unit/test_util.h"
#include "engine/backend/backend_cuda.h"
#include "gpu_fwd.h"
#include "gpu_test.h"
#include "kernels/cuda/kern_cuda.h"
#include "models/mkmodel.h"

static char g_dir[1100];

static eng_backend *make(size_t arena, int checked)
{
    char err[256];
    eng_backend_config bc = {.arena_bytes = arena, .threads = 0, .checked = checked};
    eng_backend *be = eng_backend_cuda_create(&bc, err, sizeof err);
    if (!be) fail_msg("%s", err);
    return be;
}

static void test_arena(void **state)
{
    (void)state;
    eng_backend *be = make((size_t)64 << 20, 1);
    uint8_t *a = be->ops->alloc(be, 1000, "a");
    uint8_t *b = be->ops->alloc(be, (size_t)3 << 20, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal((uintptr_t)a % 256, 0);
    assert_int_equal((uintptr_t)b % 256, 0);
    uint8_t *h = malloc((size_t)3 << 20);
    memset(h, 0xab, (size_t)3 << 20);
    be->ops->download(be, h, b, (size_t)3 << 20);
    for (size_t i = 0; i < ((size_t)3 << 20); i++)
        if (h[i]) fail_msg("alloc not zeroed at %zu", i);
    assert_true(be->ops->contains(be, a + 10, 990));
    assert_false(be->ops->contains(be, a + 10, 991));
    eng_alloc_info info;
    assert_int_equal(be->ops->alloc_info(be, b + 5, &info), 0);
    assert_ptr_equal(info.ptr, b);
    assert_string_equal(info.tag, "b");
    assert_int_equal(info.live, 1);
    size_t in_use = be->ops->bytes_in_use(be);
    be->ops->free(be, a);
    assert_false(be->ops->contains(be, a, 1));
    assert_int_equal(be->ops->alloc_info(be, a, &info), 0);
    assert_int_equal(info.live, 0);
    assert_int_equal(be->ops->bytes_in_use(be), in_use - 1000);
    uint8_t *c = be->ops->alloc(be, 100, "c");
    assert_true(c > b); /* never reuses the retired range */
    assert_null(be->ops->alloc(be, (size_t)100 << 20, "too big"));
    free(h);
    eng_backend_destroy(be);
}

static void test_transfers(void **state)
{
    (void)state;
    eng_backend *be = make((size_t)1 << 30, 0);
    const size_t n = (size_t)200 << 20; /* larger than the staging ring */
    uint8_t *src = malloc(n), *back = malloc(n);
    gpu_rng r = {3};
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = gpu_next(&r);
        memcpy(src + i, &v, 8);
    }
    uint8_t *d1 = be->ops->alloc(be, n, "d1"), *d2 = be->ops->alloc(be, n, "d2");
    be->ops->upload(be, d1, src, n);
    be->ops->copy(be, d2, d1, n);
    be->ops->download(be, back, d2, n);
    assert_memory_equal(src, back, n);
    /* many small uploads from one reused host buffer: each upload owns its bytes on return */
    int32_t *small = be->ops->alloc(be, 4096 * 4, "small");
    int32_t v[1], got[4096];
    for (int i = 0; i < 4096; i++) {
        v[0] = i * 7 + 1;
        be->ops->upload(be, small + i, v, 4);
    }
    be->ops->synchronize(be);
    be->ops->download(be, got, small, sizeof got);
    for (int i = 0; i < 4096; i++) assert_int_equal(got[i], i * 7 + 1);
    free(src);
    free(back);
    eng_backend_destroy(be);
}

static void test_upload_convert(void **state)
{
    (void)state;
    eng_backend *be = make((size_t)512 << 20, 0);
    const mdl_dtype dts[3] = {MDL_DT_F32, MDL_DT_F16, MDL_DT_BF16};
    const size_t n = (size_t)5 << 20; /* several staging chunks */
    float *f = malloc(n * 4);
    gpu_rng r = {4};
    const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                 0xffffffffu, 0x00000001u, 0x33800000u, 0x387fe000u, 0x477ff000u, 0x477fefffu,
                                 0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x38800000u, 0x337fffffu, 0x7fffffffu};
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)gpu_next(&r);
        if (i < sizeof specials / 4) u = specials[i];
        else if (i % 3 == 0) u &= 0x8fffffffu; /* small magnitudes: f16 subnormals */
        memcpy(&f[i], &u, 4);
    }
    for (int si = 0; si < 3; si++) {
        size_t ss = mdl_dtype_size(dts[si]);
        void *src = malloc(n * ss);
        assert_int_equal(mdl_convert(src, dts[si], f, MDL_DT_F32, n), 0);
        for (int di = 0; di < 3; di++) {
            size_t ds = mdl_dtype_size(dts[di]);
            void *want = malloc(n * ds), *got = malloc(n * ds);
            assert_int_equal(mdl_convert(want, dts[di], src, dts[si], n), 0);
            void *dst = be->ops->alloc(be, n * ds, "conv");
            assert_int_equal(be->ops->upload_convert(be, dst, dts[di], src, dts[si], n), 0);
            be->ops->download(be, got, dst, n * ds);
            if (memcmp(want, got, n * ds) != 0) {
                for (size_t i = 0; i < n; i++)
                    if (memcmp((char *)want + i * ds, (char *)got + i * ds, ds)) {
                        fail_msg("%s -> %s differs at %zu", mdl_dtype_name(dts[si]), mdl_dtype_name(dts[di]), i);
                    }
            }
            be->ops->free(be, dst);
            free(want);
            free(got);
        }
        free(src);
    }
    void *dst = be->ops->alloc(be, 64, "bad");
    int32_t ints[4] = {1, 2, 3, 4};
    assert_int_equal(be->ops->upload_convert(be, dst, MDL_DT_F32, ints, MDL_DT_I32, 4), -1);
    free(f);
    eng_backend_destroy(be);
}

/* A plan replays for every row count of its bucket and gives exactly the eager results. */
static void test_plan_replay_bitwise(void **state)
{
    (void)state;
    char err[512];
    eng_backend *be = make((size_t)1 << 30, 1);
    gpu_fwd g;
    if (gpu_fwd_open(&g, be, g_dir, 64, 8, 96, 16, err, sizeof err) != 0) fail_msg("%s", err);
    const int V = g.m->cfg.vocab;
    const int buckets[3] = {8, 32, 64}; /* skinny RG1, skinny RG4, cuBLASLt */
    float *a = malloc((size_t)64 * V * 4), *b = malloc((size_t)64 * V * 4);
    for (int bi = 0; bi < 3; bi++) {
        const int R = buckets[bi];
        eng_plan *plan = be->ops->plan_create(be, gpu_fwd_emit(&g, R));
        assert_non_null(plan);
        const int ns[] = {1, R, R / 2 + 1, 3 < R ? 3 : R};
        for (int k = 0; k < 4; k++) {
            const int n = ns[k];
            int32_t tok[64], pos[64], slot[64], li[64];
            for (int i = 0; i < n; i++) {
                tok[i] = (i * 31 + k) % V;
                slot[i] = i % 8;
                pos[i] = 20 + i / 8;
                li[i] = i;
            }
            gpu_fwd_params(&g, tok, pos, slot, n, li, n);
            gpu_fwd_run(&g, R, NULL, n, a);
            gpu_fwd_run(&g, R, plan, n, b);
            if (memcmp(a, b, (size_t)n * V * 4) != 0)
                fail_msg("bucket %d, %d rows: graph replay differs from eager", R, n);
            for (size_t i = 0; i < (size_t)n * V; i++)
                if (isnan(a[i])) fail_msg("NaN logit");
        }
        be->ops->plan_free(be, plan);
    }
    free(a);
    free(b);
    gpu_fwd_close(&g);
    eng_backend_destroy(be);
}

typedef struct {
    eng_backend *be;
    eng_plan *plan;
} launch_arg;

static void launch_child(void *p)
{
    launch_arg *a = p;
    a->be->ops->plan_launch(a->be, a->plan); /* the checked replay aborts before any CUDA call */
}

static void test_checked_replay_catches_retired(void **state)
{
    (void)state;
    eng_backend *be = make((size_t)64 << 20, 1);
    float *x = be->ops->alloc(be, 64 * 4, "x");
    int32_t *n = be->ops->alloc(be, 4, "n");
    int32_t one = 1;
    be->ops->upload(be, n, &one, 4);
    kern_op op = {.kind = KOP_ADD};
    op.buf[0] = (kern_buf){x, 64 * 4};
    op.buf[1] = (kern_buf){x, 64 * 4};
    op.buf[2] = (kern_buf){n, 4};
    op.p[0] = 64;
    op.p[1] = 1;
    eng_tape tape = {.ops = &op, .n = 1, .cap = 1};
    eng_plan *plan = be->ops->plan_create(be, &tape);
    assert_non_null(plan);
    be->ops->plan_launch(be, plan);
    be->ops->synchronize(be);
    be->ops->free(be, x); /* the plan still bakes x */
    launch_arg arg = {be, plan};
    char msg[1024];
    int st = test_run_child(launch_child, &arg, msg, sizeof msg);
    assert_true(WIFSIGNALED(st));
    assert_non_null(strstr(msg, "retired"));
    be->ops->plan_free(be, plan);
    eng_backend_destroy(be);
}

/* A token id out of range is recorded by the kernel (and the row skipped), not read out of bounds. */
static void test_kernel_check_reported(void **state)
{
    (void)state;
    eng_backend *be = make((size_t)64 << 20, 0);
    char err[256];
    kern_cuda_config kc = {0};
    kern_cuda_ctx *ctx = kern_cuda_ctx_create(&kc, err, sizeof err);
    assert_non_null(ctx);
    cudaStream_t s = (cudaStream_t)eng_backend_cuda_stream(be);
    const int H = 8, V = 10;
    int32_t *ids = be->ops->alloc(be, 8, "ids"), *n = be->ops->alloc(be, 4, "n");
    float *table = be->ops->alloc(be, (size_t)V * H * 4, "table"), *out = be->ops->alloc(be, 2 * H * 4, "out");
    int32_t h_ids[2] = {3, 12}, two = 2;
    be->ops->upload(be, ids, h_ids, 8);
    be->ops->upload(be, n, &two, 4);
    kern_op op = {.kind = KOP_EMBED};
    op.buf[0] = (kern_buf){ids, 8};
    op.buf[1] = (kern_buf){table, (size_t)V * H * 4};
    op.buf[2] = (kern_buf){out, 2 * H * 4};
    op.buf[3] = (kern_buf){n, 4};
    op.p[0] = H;
    op.p[1] = V;
    op.p[2] = 2;
    op.p[3] = KERN_DT_F32;
    kern_cuda_exec(ctx, &op, s);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    char msg[256];
    assert_int_equal(kern_cuda_take_error(ctx, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "token id"));
    assert_int_equal(kern_cuda_take_error(ctx, msg, sizeof msg), 0); /* cleared */
    kern_cuda_ctx_destroy(ctx);
    eng_backend_destroy(be);
}

int main(void)
{
    GPU_TEST_SKIP_WITHOUT_DEVICE();
    const char *base = test_tmpdir("cuda-plan");
    if (!base) return 1;
    snprintf(g_dir, sizeof g_dir, "%s/m", base);
    mdl_mkmodel_opts o;
    mdl_mkmodel_defaults(&o);
    o.tokenizer = 0;
    o.hidden = 128;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = 32;
    o.intermediate = 256;
    o.vocab = 700;
    char err[512];
    if (mdl_mkmodel(&o, g_dir, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena),
        cmocka_unit_test(test_transfers),
        cmocka_unit_test(test_upload_convert),
        cmocka_unit_test(test_plan_replay_bitwise),
        cmocka_unit_test(test_checked_replay_catches_retired),
        cmocka_unit_test(test_kernel_check_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
