/* tests/unit/test_kern_util.h — helpers the CPU kernel unit tests share (test_kernels, test_moe,
 * test_matmul_amx): a seeded xorshift generator, bit comparisons, aligned buffers and the list of
 * instruction sets this CPU runs. Include after cmocka.h and kernels/cpu/kern_cpu.h; a file may
 * define TEST_RNG_SEED first for its own sequence. */
#ifndef GS_TEST_KERN_UTIL_H
#define GS_TEST_KERN_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#endif

static uint64_t g_rng = TEST_RNG_SEED;
static inline uint64_t rnd_u64(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static inline float rnd_f(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rnd_u64() >> 11) / 9007199254740992.0);
}
static inline void fill(float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) p[i] = rnd_f(lo, hi);
}
static inline uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* the same bits, or both NaN (payloads may differ) */
static inline int same_f(float a, float b) { return fbits(a) == fbits(b) || (isnan(a) && isnan(b)); }
/* 64-byte aligned, a cache line of slack past the end (vector tails may read, never write, it) */
static inline void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    assert_non_null(p);
    return p;
}
static inline kern_buf B(void *p, size_t bytes) { return (kern_buf){p, bytes}; }

/* room for every kern_isa */
#define TEST_ISA_CAP (KERN_ISA_AMX + 1)

/* The ISAs this CPU runs, best last, and that one left forced; with_amx 0 stops at AVX512BF16
 * (the AMX table differs from it only in the amx-mode matmul, which test_matmul_amx covers). */
static inline int isa_list_of(kern_isa out[TEST_ISA_CAP], int with_amx)
{
    int n = 0;
    out[n++] = KERN_ISA_SCALAR;
    const int last = with_amx ? KERN_ISA_AMX : KERN_ISA_AVX512BF16;
    for (int i = KERN_ISA_AVX2; i <= last; i++)
        if (kern_simd_force((kern_isa)i) == 0) out[n++] = (kern_isa)i;
    assert_int_equal(kern_simd_force(out[n - 1]), 0);
    return n;
}

#endif
