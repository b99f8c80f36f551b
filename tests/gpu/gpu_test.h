/* tests/gpu/gpu_test.h — helpers shared by the CUDA backend tests.
 *
 * Every test binary starts with GPU_TEST_SKIP_WITHOUT_DEVICE(): with no usable CUDA device it exits
 * with 77, which ctest reports as SKIPPED (SKIP_RETURN_CODE 77), never as passed. */
#ifndef GS_GPU_TEST_H
#define GS_GPU_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend_cuda.h"

#define GPU_TEST_SKIP_WITHOUT_DEVICE()                                                             \
    do {                                                                                           \
        if (eng_backend_cuda_device_count() <= 0) {                                                \
            printf("no usable CUDA device: skipped (exit 77)\n");                                  \
            return 77;                                                                             \
        }                                                                                          \
    } while (0)

/* Poison written into every output element before a run: a quiet NaN with a payload no kernel
 * produces. Elements that must stay unwritten (rows past n_rows, columns outside the op's range)
 * are compared bitwise against it; live elements must never be NaN. */
#define GPU_POISON_BITS 0x7fcdead5u
#define GPU_POISON_I32 0x7eadbeef

static inline float gpu_poison_f32(void)
{
    union { uint32_t u; float f; } v = {.u = GPU_POISON_BITS};
    return v.f;
}
static inline uint32_t gpu_bits(float f)
{
    union { uint32_t u; float f; } v = {.f = f};
    return v.u;
}

/* xorshift64*: deterministic test data */
typedef struct {
    uint64_t s;
} gpu_rng;
static inline uint64_t gpu_next(gpu_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}
static inline float gpu_unif(gpu_rng *r) /* [-1, 1) */
{
    return (float)((double)(gpu_next(r) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
static inline int gpu_int(gpu_rng *r, int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(gpu_next(r) % (uint64_t)(hi - lo + 1));
}

/* Compares a GPU f32 buffer with the CPU's, both started from `init`. Returns the number of
 * failures (printing the first few). Rules: where init holds the poison, the GPU must leave the
 * poison exactly when the CPU did (and write where the CPU wrote); a live element must be finite
 * or at least not NaN, and within tol = rtol * (max |cpu| over live elements) + rtol * |cpu|
 * (exact: bitwise equal, NaNs included). */
static inline int gpu_cmp_f32(const char *what, const float *cpu, const float *gpu, const float *init, size_t n,
                              double rtol, int exact)
{
    double scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (gpu_bits(cpu[i]) == GPU_POISON_BITS) continue;
        if (!isnan(cpu[i]) && fabs((double)cpu[i]) > scale) scale = fabs((double)cpu[i]);
    }
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t cb = gpu_bits(cpu[i]), gb = gpu_bits(gpu[i]);
        const int init_poison = init && gpu_bits(init[i]) == GPU_POISON_BITS;
        const char *why = NULL;
        if (init_poison && cb == GPU_POISON_BITS) {
            if (gb != GPU_POISON_BITS) why = "written by the GPU but not by the CPU";
        } else if (gb == GPU_POISON_BITS) {
            why = "not written by the GPU";
        } else if (exact && cb == gb) {
            /* bitwise equal: passes, NaN inputs carried through an in-place op included */
        } else if (isnan(gpu[i]) || isnan(cpu[i])) {
            why = "NaN";
        } else if (exact) {
            if (cb != gb) why = "not bitwise equal";
        } else {
            const double d = fabs((double)gpu[i] - (double)cpu[i]);
            if (!(d <= rtol * scale + rtol * fabs((double)cpu[i]) + 1e-30)) why = "outside tolerance";
        }
        if (why) {
            if (bad < 8)
                fprintf(stderr, "%s[%zu]: %s (cpu %.9g gpu %.9g, scale %.3g)\n", what, i, why, (double)cpu[i],
                        (double)gpu[i], scale);
            bad++;
        }
    }
    if (bad) fprintf(stderr, "%s: %d of %zu elements bad\n", what, bad, n);
    return bad;
}

static inline int gpu_cmp_i32(const char *what, const int32_t *cpu, const int32_t *gpu, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (cpu[i] != gpu[i]) {
            if (bad < 8) fprintf(stderr, "%s[%zu]: cpu %d gpu %d\n", what, i, cpu[i], gpu[i]);
            bad++;
        }
    return bad;
}

#endif
