/* tests/emu/emu_matmul.cpp — kernels/cuda/matmul.cu (KOP_MATMUL), the real source, compiled by g++ against
 * the CPU emulation of the CUDA primitives (emu_cuda.h, GS_CUDA_EMU) and launched with mm_launches, the
 * launch kc_matmul enqueues on a GPU when cuBLASLt is off (the default, batch-invariant paths: the
 * tensor-core kernel and the CUDA-core kernel). mma.sync is emulated from the PTX ISA's fragment layouts
 * (emu_mma.cpp). Used by test_emu_matmul.c.
 * Limits: those of the emulation (emu_cuda.h); the emulated mma sums in double and rounds once (the
 * hardware's internal order may differ in the last bits); the cuBLASLt path (fast_gemm) is not built. */
#ifndef GS_CUDA_EMU
#error "build with -DGS_CUDA_EMU (tests/emu/CMakeLists.txt)"
#endif
#include "kernels/cuda/matmul.cu"

#include "tests/emu/emu_kernels.h"

extern "C" int emu_kc_matmul(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    (void)cfg; /* no scratch, no grid-stride grid */
    emu_kc_check_op(op, KOP_MATMUL, "emu_kc_matmul");
    kc_err err = {};
    mm_launches(op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}
