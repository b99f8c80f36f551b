/* tests/emu/emu_convert.cpp — kernels/cuda/convert.cu (kern_cuda_convert: weight dtype conversion), the
 * real source, compiled by g++ against the CPU emulation of the CUDA primitives (emu_cuda.h, GS_CUDA_EMU)
 * and launched with cv_launch, the launch kern_cuda_convert enqueues on a GPU. Used by
 * test_emu_convert.c.
 * Limits: those of the emulation (emu_cuda.h); a grid of 65535 blocks (n > 16.7M, where the grid-stride
 * loop strides) is too slow to emulate. */
#ifndef GS_CUDA_EMU
#error "build with -DGS_CUDA_EMU (tests/emu/CMakeLists.txt)"
#endif
#include "kernels/cuda/convert.cu"

#include <cstring>

#include "tests/emu/emu_kernels.h"

extern "C" int emu_kern_cuda_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n, uint64_t seed)
{
    if (!convertible(dst_dt) || !convertible(src_dt)) return -1;
    if (n == 0) return 0;
    if (dst_dt == src_dt) { /* kern_cuda_convert's device copy */
        memcpy(dst, src, n * (src_dt == MDL_DT_F32 ? 4u : 2u));
        return 0;
    }
    cv_launch(dst, dst_dt, src, src_dt, n, emu_kc_launch{seed});
    return 0;
}
