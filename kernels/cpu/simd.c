/* kernels/cpu/simd.c — picks the instruction set once per process. Any choice gives the same bits
 * (kern_cpu.h), so the choice is about speed only; GS_KERN_ISA can lower it for debugging. */
#include "kernels/cpu/kern_cpu.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic(const kern_simd_ops *) g_simd;

static int cpu_has(kern_isa isa)
{
#ifdef KERN_HAVE_X86
    __builtin_cpu_init();
    switch (isa) {
    case KERN_ISA_AMX:
#ifdef KERN_HAVE_AMX_BUILD
        return cpu_has(KERN_ISA_AVX512BF16) && kern_amx_supported();
#else
        return 0;
#endif
    case KERN_ISA_AVX512BF16:
        return cpu_has(KERN_ISA_AVX512) && __builtin_cpu_supports("avx512bf16");
    case KERN_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma");
    case KERN_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case KERN_ISA_SCALAR:
        return 1;
    }
    return 0;
#else
    return isa == KERN_ISA_SCALAR;
#endif
}

static const kern_simd_ops *ops_for(kern_isa isa)
{
    switch (isa) {
#ifdef KERN_HAVE_X86
#ifdef KERN_HAVE_AMX_BUILD
    case KERN_ISA_AMX:
        return &kern_simd_amx;
#endif
    case KERN_ISA_AVX512BF16:
        return &kern_simd_avx512bf16;
    case KERN_ISA_AVX512:
        return &kern_simd_avx512;
    case KERN_ISA_AVX2:
        return &kern_simd_avx2;
#endif
    default:
        return &kern_simd_scalar;
    }
}

const kern_simd_ops *kern_simd(void)
{
    const kern_simd_ops *s = atomic_load_explicit(&g_simd, memory_order_acquire);
    if (s) return s;
    kern_isa want = KERN_ISA_AMX;
    const char *env = getenv("GS_KERN_ISA");
    if (env && strcmp(env, "avx512bf16") == 0) want = KERN_ISA_AVX512BF16;
    if (env && strcmp(env, "avx512") == 0) want = KERN_ISA_AVX512;
    if (env && strcmp(env, "scalar") == 0) want = KERN_ISA_SCALAR;
    if (env && strcmp(env, "avx2") == 0) want = KERN_ISA_AVX2;
    while (want > KERN_ISA_SCALAR && !cpu_has(want)) want = (kern_isa)(want - 1);
    /* Racing first calls compute the same answer; whichever store lands is fine. */
    s = ops_for(want);
    atomic_store_explicit(&g_simd, s, memory_order_release);
    return s;
}

const char *kern_cpu_isa_name(void) { return kern_simd()->name; }

int kern_cpu_bf16_dot_native(void) { return kern_simd()->isa >= KERN_ISA_AVX512BF16; }

int kern_cpu_amx_native(void) { return kern_simd()->isa == KERN_ISA_AMX; }

int kern_simd_force(kern_isa isa)
{
    if (!cpu_has(isa)) return -1;
    atomic_store_explicit(&g_simd, ops_for(isa), memory_order_release);
    return 0;
}
