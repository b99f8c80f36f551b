/* tests/emu/emu_spec.cpp — kernels/cuda/spec.cu (KOP_DRAFT_SELECT, KOP_CONFIDENCE), the real source,
 * compiled by g++ against the CPU emulation of the CUDA primitives (emu_cuda.h, GS_CUDA_EMU) and
 * launched with ds_launches / conf_launch, the launches kc_draft_select / kc_confidence enqueue on a
 * GPU. Used by test_emu_spec.c.
 * Limits: those of the emulation (emu_cuda.h): no memory-model fidelity, blocks run one after another
 * (the cross-block atomicMax is exercised, not concurrently), no inline PTX, warp-synchronous code
 * without an explicit sync is not modelled, C library math instead of CUDA's. */
#ifndef GS_CUDA_EMU
#error "build with -DGS_CUDA_EMU (tests/emu/CMakeLists.txt)"
#endif
#include "kernels/cuda/spec.cu"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tests/emu/emu_kernels.h"

/* k_ds_update's `extern __shared__ float z[]` (the launch's dynamic shared memory: r floats; built
 * with -fno-extern-tls-init, see CMakeLists.txt) */
EMU_DYNAMIC_SHARED(float, z);

static void emu_check_op(const kern_op *op, kern_op_kind kind, const char *who)
{
    char why[192];
    if (!op || op->kind != kind || kern_validate(op, why, sizeof why) != 0) {
        fprintf(stderr, "%s: malformed op: %s\n", who, op && op->kind == kind ? why : "wrong kind");
        abort();
    }
}

extern "C" int emu_kc_draft_select(const kern_op *op, uint64_t seed, char *msg, size_t msglen)
{
    emu_check_op(op, KOP_DRAFT_SELECT, "emu_kc_draft_select");
    /* the context's argmax key scratch, zeroed before the launches as kc_draft_select does */
    std::vector<unsigned long long> keys((size_t)op->p[4] * (size_t)op->p[0] + 1, 0ull);
    kc_err err = {};
    uint64_t launch_seed = seed;
    ds_launches(op, keys.data(), &err, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        emu_launch(emu_config{launch_seed}, kernel, grid, block, smem, args...);
        launch_seed += 2; /* another schedule of the same kind for the next launch */
    });
    return emu_kc_report(err, msg, msglen);
}

extern "C" int emu_kc_confidence(const kern_op *op, uint64_t seed, char *msg, size_t msglen)
{
    emu_check_op(op, KOP_CONFIDENCE, "emu_kc_confidence");
    kc_err err = {};
    conf_launch(op, &err, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        emu_launch(emu_config{seed}, kernel, grid, block, smem, args...);
    });
    return emu_kc_report(err, msg, msglen);
}
