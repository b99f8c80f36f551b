/* tests/emu/emu_elementwise.cpp — kernels/cuda/elementwise.cu (KOP_EMBED, KOP_GATHER_ROWS, KOP_COPY_COLS,
 * KOP_SILU_MUL, KOP_ADD), the real source, compiled by g++ against the CPU emulation of the CUDA
 * primitives (emu_cuda.h, GS_CUDA_EMU) and launched with the launch descriptions the kc_* launchers
 * enqueue on a GPU. The grid-stride kernels get their grid from an emulated context with cfg->sms SMs
 * (default 2: few blocks, so every thread strides). Used by test_emu_elementwise.c.
 * Limits: those of the emulation (emu_cuda.h): glibc's expf (CUDA's may differ by an ulp). */
#ifndef GS_CUDA_EMU
#error "build with -DGS_CUDA_EMU (tests/emu/CMakeLists.txt)"
#endif
#include "kernels/cuda/elementwise.cu"

#include "tests/emu/emu_kernels.h"

/* the context the grid sizes read (kc_grid_for: its SM count) */
static void emu_ctx(kern_cuda_ctx *c, const emu_kc_config *cfg)
{
    memset(c, 0, sizeof *c);
    c->sms = cfg && cfg->sms > 0 ? cfg->sms : 2;
}

extern "C" int emu_kc_embed(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    (void)cfg;
    emu_kc_check_op(op, KOP_EMBED, "emu_kc_embed");
    kc_err err = {};
    embed_launch(op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}

extern "C" int emu_kc_gather_rows(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg,
                                  size_t msglen)
{
    (void)cfg;
    emu_kc_check_op(op, KOP_GATHER_ROWS, "emu_kc_gather_rows");
    kc_err err = {};
    gather_launch(op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}

extern "C" int emu_kc_copy_cols(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    (void)cfg;
    emu_kc_check_op(op, KOP_COPY_COLS, "emu_kc_copy_cols");
    kc_err err = {};
    copy_cols_launch(op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}

extern "C" int emu_kc_silu_mul(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    emu_kc_check_op(op, KOP_SILU_MUL, "emu_kc_silu_mul");
    kern_cuda_ctx c;
    emu_ctx(&c, cfg);
    kc_err err = {};
    silu_mul_launch(&c, op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}

extern "C" int emu_kc_add(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    emu_kc_check_op(op, KOP_ADD, "emu_kc_add");
    kern_cuda_ctx c;
    emu_ctx(&c, cfg);
    kc_err err = {};
    add_launch(&c, op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}
