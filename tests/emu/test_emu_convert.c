/* tests/emu/test_emu_convert.c — kernels/cuda/convert.cu (kern_cuda_convert: the device dtype conversion
 * of weight loading), the real CUDA source, run on the CPU emulation of the CUDA primitives
 * (tests/emu/emu_cuda.h) against the host's mdl_convert (models/format/safetensors.c), bitwise.
 *
 * Why: CI has no GPU; a GPU-loaded checkpoint must hold the same bits as a CPU-loaded one. This runs
 * every F32 / F16 / BF16 pair (the same-dtype ones are kern_cuda_convert's copy) on every CI run, over
 * special values (signed zeros, subnormals of both formats, the f16 subnormal / normal boundary and its
 * rounding ties, values rounding to f16 inf, infinities, quiet and signalling NaNs with payloads, bf16
 * rounding ties) and random bit patterns, with n not a multiple of the 256-thread block. Unsupported
 * dtypes return -1.
 *
 * Limits: those of the emulation (emu_cuda.h); n stays below the 65535-block grid cap (the grid-stride
 * loop's second trip is not exercised). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "models/format/safetensors.h"
#include "tests/emu/emu_kernels.h"
#include "tests/gpu/gpu_test.h"

#define N_ELEMS 4099

static const uint32_t F32_SPECIAL[] = {
    0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u, /* zeros, f32 subnormals, min normal */
    0x3f800000u, 0xbf800000u, 0x7f7fffffu, 0xff7fffffu,             /* 1, -1, +-max */
    0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa5a5a5u, 0xff812345u, /* inf, NaNs */
    0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, /* bf16 ties to even (both ways), just above / below */
    0x7f7f8000u, 0x7f7fc000u,                         /* bf16 rounding to inf */
    0x477fe000u, 0x477fefffu, 0x477ff000u, 0x47800000u, /* f16 max 65504, below / at the overflow boundary */
    /* f16 min normal, subnormals, ties */
    0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u, 0x33000001u, 0x32ffffffu,
    0x33c00000u, 0x34200000u, 0x387fe000u, 0x387ff000u, 0xb3400000u, /* subnormal ties to even, top subnormal */
    0x3c00a000u, 0x3c001000u, 0x3c003000u, 0x3c002fffu, /* f16 normal rounding ties */
};

static uint64_t g_s = 0x9e3779b97f4a7c15ull;
static uint32_t next32(void)
{
    g_s ^= g_s >> 12;
    g_s ^= g_s << 25;
    g_s ^= g_s >> 27;
    return (uint32_t)((g_s * 0x2545F4914F6CDD1Dull) >> 32);
}

/* n elements of dtype dt: the special values (as f32, or their narrow patterns), then random bits */
static void *make_src(int dt, size_t n)
{
    const size_t ns = sizeof F32_SPECIAL / sizeof F32_SPECIAL[0];
    if (dt == MDL_DT_F32) {
        uint32_t *p = malloc(n * 4);
        assert_non_null(p);
        for (size_t i = 0; i < n; i++) p[i] = i < ns ? F32_SPECIAL[i] : next32();
        return p;
    }
    uint16_t *p = malloc(n * 2);
    assert_non_null(p);
    static const uint16_t F16_SPECIAL[] = {0x0000u, 0x8000u, 0x0001u, 0x83ffu, 0x0400u, 0x7bffu, 0xfbffu,
                                           0x7c00u, 0xfc00u, 0x7e00u, 0x7c01u, 0xfd55u, 0x3c00u, 0x03ffu};
    const size_t nh = sizeof F16_SPECIAL / sizeof F16_SPECIAL[0];
    for (size_t i = 0; i < n; i++) {
        if (i < nh) p[i] = F16_SPECIAL[i];
        else if (i < nh + ns) p[i] = (uint16_t)(F32_SPECIAL[i - nh] >> 16); /* as bf16 patterns */
        else p[i] = (uint16_t)next32();
    }
    return p;
}

static size_t dt_size(int dt) { return dt == MDL_DT_F32 ? 4 : 2; }

static void test_convert_pairs(void **state)
{
    (void)state;
    const int dts[3] = {MDL_DT_F32, MDL_DT_F16, MDL_DT_BF16};
    const size_t ns[3] = {N_ELEMS, 1, 256};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int k = 0; k < 3; k++) {
                const int src_dt = dts[a], dst_dt = dts[b];
                const size_t n = ns[k];
                void *src = make_src(src_dt, n);
                const size_t db = n * dt_size(dst_dt);
                unsigned char *want = malloc(db + 8), *got = malloc(db + 8);
                assert_non_null(want);
                assert_non_null(got);
                memset(want, 0xa5, db + 8);
                memset(got, 0xa5, db + 8);
                assert_int_equal(mdl_convert(want, (mdl_dtype)dst_dt, src, (mdl_dtype)src_dt, n), 0);
                assert_int_equal(emu_kern_cuda_convert(got, dst_dt, src, src_dt, n, 0x5eed0020ull + (uint64_t)k), 0);
                if (memcmp(want, got, db + 8) != 0) {
                    for (size_t i = 0; i < db + 8; i++)
                        if (want[i] != got[i])
                            fail_msg("convert %d -> %d, n %zu: byte %zu (element %zu) %02x, mdl_convert %02x", src_dt,
                                     dst_dt, n, i, i / dt_size(dst_dt), got[i], want[i]);
                }
                free(src);
                free(want);
                free(got);
            }
    /* unsupported pairs, and nothing to do */
    float f = 1.0f, g = 2.0f;
    assert_int_equal(emu_kern_cuda_convert(&g, MDL_DT_F32, &f, MDL_DT_I32, 1, 1), -1);
    assert_int_equal(emu_kern_cuda_convert(&g, MDL_DT_F64, &f, MDL_DT_F32, 1, 1), -1);
    assert_int_equal(emu_kern_cuda_convert(&g, MDL_DT_BF16, &f, MDL_DT_F32, 0, 1), 0);
    assert_int_equal(gpu_bits(g), gpu_bits(2.0f));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
