/* tests/emu/emu_sample.cpp — kernels/cuda/sample.cu (KOP_SAMPLE), the real source, compiled by g++
 * against the CPU emulation of the CUDA primitives (emu_cuda.h, GS_CUDA_EMU) and launched with
 * ks_launch, the launch kc_sample enqueues on a GPU. Used by test_emu_sample.c.
 * Limits: those of the emulation (emu_cuda.h): no memory-model fidelity, no inline PTX, warp-synchronous
 * code without an explicit sync is not modelled, C library math instead of CUDA's. */
#ifndef GS_CUDA_EMU
#error "build with -DGS_CUDA_EMU (tests/emu/CMakeLists.txt)"
#endif
#include "kernels/cuda/sample.cu"

#include <cstdio>
#include <cstdlib>

#include "tests/emu/emu_kernels.h"

extern "C" int emu_kc_sample(const kern_op *op, uint64_t seed, char *msg, size_t msglen)
{
    char why[192];
    if (!op || op->kind != KOP_SAMPLE || kern_validate(op, why, sizeof why) != 0) {
        fprintf(stderr, "emu_kc_sample: malformed op: %s\n", op && op->kind == KOP_SAMPLE ? why : "not KOP_SAMPLE");
        abort();
    }
    kc_err err = {};
    const emu_config cfg = {seed};
    ks_launch(op, &err, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        emu_launch(cfg, kernel, grid, block, smem, args...);
    });
    return emu_kc_report(err, msg, msglen);
}
