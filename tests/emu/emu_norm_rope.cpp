/* tests/emu/emu_norm_rope.cpp — kernels/cuda/norm_rope.cu (KOP_RMSNORM, KOP_QK_NORM_ROPE), the real
 * source, compiled by g++ against the CPU emulation of the CUDA primitives (emu_cuda.h, GS_CUDA_EMU) and
 * launched with rms_launch / qkr_launch, the launches kc_rmsnorm / kc_qk_norm_rope enqueue on a GPU.
 * Used by test_emu_norm_rope.c.
 * Limits: those of the emulation (emu_cuda.h): glibc's sqrtf / sincosf (CUDA's sincosf may differ by an
 * ulp or two of a large angle). */
#ifndef GS_CUDA_EMU
#error "build with -DGS_CUDA_EMU (tests/emu/CMakeLists.txt)"
#endif
#include "kernels/cuda/norm_rope.cu"

#include "tests/emu/emu_kernels.h"

extern "C" int emu_kc_rmsnorm(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    (void)cfg;
    emu_kc_check_op(op, KOP_RMSNORM, "emu_kc_rmsnorm");
    kc_err err = {};
    rms_launch(op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}

extern "C" int emu_kc_qk_norm_rope(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg,
                                   size_t msglen)
{
    (void)cfg;
    emu_kc_check_op(op, KOP_QK_NORM_ROPE, "emu_kc_qk_norm_rope");
    kc_err err = {};
    qkr_launch(op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}
