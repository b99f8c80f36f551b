/* tests/emu/emu_moe.cpp — kernels/cuda/moe.cu (KOP_MOE_ROUTE, KOP_MOE_FFN), the real source, compiled by
 * g++ against the CPU emulation of the CUDA primitives (emu_cuda.h, GS_CUDA_EMU) and launched with the
 * launch descriptions kc_moe_route / kc_moe_ffn enqueue on a GPU (the grouped matmuls are
 * mm_kernels.cuh's, mma.sync emulated by emu_mma.cpp). The grid-stride kernels get their grid from an
 * emulated context with cfg->sms SMs (default 2). Used by test_emu_moe.c.
 * Limits: those of the emulation (emu_cuda.h); the emulated mma sums in double and rounds once. */
#ifndef GS_CUDA_EMU
#error "build with -DGS_CUDA_EMU (tests/emu/CMakeLists.txt)"
#endif
#include "kernels/cuda/moe.cu"

#include "tests/emu/emu_kernels.h"

extern "C" int emu_kc_moe_route(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    (void)cfg;
    emu_kc_check_op(op, KOP_MOE_ROUTE, "emu_kc_moe_route");
    kc_err err = {};
    moe_route_launch(op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}

extern "C" int emu_kc_moe_ffn(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    emu_kc_check_op(op, KOP_MOE_FFN, "emu_kc_moe_ffn");
    kern_cuda_ctx c;
    memset(&c, 0, sizeof c);
    c.sms = cfg && cfg->sms > 0 ? cfg->sms : 2;
    kc_err err = {};
    moe_ffn_launches(&c, op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}
