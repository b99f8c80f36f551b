/* tests/emu/emu_kernels.h — C interface of the CUDA kernels run on the CPU emulation (emu_cuda.h):
 * each function takes an op as kern_cuda_exec does (host pointers instead of device pointers),
 * validates it (a malformed op aborts, as on the device), and runs the real launch sequence of
 * kernels/cuda/<file>.cu, compiled by g++ with GS_CUDA_EMU, under the schedule `seed` (see
 * emu_cuda.cpp: even seeds pick uniformly, odd seeds let warps run ahead).
 * Returns 0, or 1 with the first failed data-dependent check the kernels recorded (kc_fail) in msg.
 *
 * Exists so that tests/emu/test_emu_*.c can compare the CUDA kernels with the CPU kernels
 * (kern_cpu_exec) in CI, where there is no GPU. Limits: those of the emulation (emu_cuda.h: no
 * memory-model fidelity, blocks one after another, no inline PTX, warp-synchronous code without an
 * explicit sync not modelled, C library math); host memory stands in for device memory, so an
 * out-of-bounds access is only caught when it faults or changes a compared result. */
#ifndef GS_TESTS_EMU_KERNELS_H
#define GS_TESTS_EMU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/kern.h"

/* kernels/cuda/sample.cu (KOP_SAMPLE) */
int emu_kc_sample(const kern_op *op, uint64_t seed, char *msg, size_t msglen);
/* kernels/cuda/spec.cu (KOP_DRAFT_SELECT: zeroes the argmax keys first, as kc_draft_select does;
 * KOP_CONFIDENCE) */
int emu_kc_draft_select(const kern_op *op, uint64_t seed, char *msg, size_t msglen);
int emu_kc_confidence(const kern_op *op, uint64_t seed, char *msg, size_t msglen);

#ifdef __cplusplus
}
#endif

#if defined(__cplusplus) && defined(GS_KERN_CUDA_COMMON_CUH)
#include <cstdio>
/* For the emu_<file>.cpp wrappers: 0 when the record is clear, else 1 with it in msg (by enum name). */
static inline int emu_kc_report(const kc_err &e, char *msg, size_t msglen)
{
    const char *name = "unknown code";
    switch (e.code) {
#define EMU_KC_ERR(c) \
    case c: name = #c; break;
        EMU_KC_ERR(KC_ERR_NONE) EMU_KC_ERR(KC_ERR_ROWS) EMU_KC_ERR(KC_ERR_TOKEN) EMU_KC_ERR(KC_ERR_SLOT)
        EMU_KC_ERR(KC_ERR_POS) EMU_KC_ERR(KC_ERR_BLOCK) EMU_KC_ERR(KC_ERR_KVLEN) EMU_KC_ERR(KC_ERR_INDEX)
        EMU_KC_ERR(KC_ERR_PREV) EMU_KC_ERR(KC_ERR_BANS) EMU_KC_ERR(KC_ERR_LOGPROBS) EMU_KC_ERR(KC_ERR_NO_TOKEN)
#undef EMU_KC_ERR
    default: break;
    }
    if (e.code == KC_ERR_NONE) return 0;
    snprintf(msg, msglen, "%s (%s op, value %d, bound %d)", name, kern_op_name((kern_op_kind)e.kind), e.a, e.b);
    return 1;
}
#endif

#endif
