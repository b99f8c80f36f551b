/* tests/emu/emu_kernels.h — C interface of the CUDA kernels run on the CPU emulation (emu_cuda.h):
 * each function takes an op as kern_cuda_exec does (host pointers instead of device pointers),
 * validates it (a malformed op aborts, as on the device), and runs the real launch sequence of
 * kernels/cuda/<file>.cu, compiled by g++ with GS_CUDA_EMU, under the schedule `seed` (see
 * emu_cuda.cpp: even seeds pick uniformly, odd seeds let warps run ahead).
 * Returns 0, or 1 with the first failed data-dependent check the kernels recorded (kc_fail) in msg.
 *
 * Exists so that tests/emu/test_emu_*.c can compare the CUDA kernels with the CPU kernels
 * (kern_cpu_exec) in CI, where there is no GPU. Limits: those of the emulation (emu_cuda.h: no
 * memory-model fidelity, blocks one after another, no inline PTX but the emulated mma.sync of
 * emu_mma.cpp, warp-synchronous code without an explicit sync not modelled, C library math); host
 * memory stands in for device memory, so an out-of-bounds access is only caught when it faults or
 * changes a compared result. */
#ifndef GS_TESTS_EMU_KERNELS_H
#define GS_TESTS_EMU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/kern.h"

/* The emulated context of the ops below (kern_cuda_config's counterparts). It has no cuBLASLt
 * (fast_gemm off): KOP_MATMUL runs the default, batch-invariant paths. */
typedef struct {
    size_t attn_bytes; /* split-attention partials (0: 128 MiB, the CUDA context's default) */
    int sms;           /* SM count sizing the grid-stride grids (0: 2, so that the loops stride) */
} emu_kc_config;

/* One op of the files below (cfg may be NULL: defaults). Every launch of the op runs under its own
 * schedule of the seed's kind (seed, seed + 2, ...). */
typedef int (*emu_kc_fn)(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);

/* kernels/cuda/matmul.cu (KOP_MATMUL: tensor-core and CUDA-core kernels) */
int emu_kc_matmul(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
/* kernels/cuda/attention.cu (KOP_KV_WRITE; KOP_ATTENTION: the split kernel and the combine, in chunks of
 * rows when the partials do not fit cfg->attn_bytes; the scratch is NaN-poisoned before the launches and
 * a guard past it checked after) */
int emu_kc_kv_write(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
int emu_kc_attention(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
/* kernels/cuda/norm_rope.cu (KOP_RMSNORM, KOP_QK_NORM_ROPE) */
int emu_kc_rmsnorm(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
int emu_kc_qk_norm_rope(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
/* kernels/cuda/elementwise.cu (KOP_EMBED, KOP_GATHER_ROWS, KOP_COPY_COLS, KOP_SILU_MUL, KOP_ADD) */
int emu_kc_embed(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
int emu_kc_gather_rows(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
int emu_kc_copy_cols(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
int emu_kc_silu_mul(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
int emu_kc_add(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
/* kernels/cuda/convert.cu: kern_cuda_convert on host memory (mdl_dtype codes; the same-dtype case is the
 * device copy kern_cuda_convert enqueues, a memcpy here). Returns 0, or -1 for an unsupported pair. */
int emu_kern_cuda_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n, uint64_t seed);

/* kernels/cuda/sample.cu (KOP_SAMPLE) */
int emu_kc_sample(const kern_op *op, uint64_t seed, char *msg, size_t msglen);
/* kernels/cuda/spec.cu (KOP_DRAFT_SELECT: zeroes the argmax keys first, as kc_draft_select does;
 * KOP_CONFIDENCE) */
int emu_kc_draft_select(const kern_op *op, uint64_t seed, char *msg, size_t msglen);
int emu_kc_confidence(const kern_op *op, uint64_t seed, char *msg, size_t msglen);
/* kernels/cuda/moe.cu (KOP_MOE_ROUTE; KOP_MOE_FFN: the group, gate_up, silu, down and combine launches) */
int emu_kc_moe_route(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);
int emu_kc_moe_ffn(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen);

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
        EMU_KC_ERR(KC_ERR_PEN) EMU_KC_ERR(KC_ERR_EXPERT)
#undef EMU_KC_ERR
    default: break;
    }
    if (e.code == KC_ERR_NONE) return 0;
    snprintf(msg, msglen, "%s (%s op, value %d, bound %d)", name, kern_op_name((kern_op_kind)e.kind), e.a, e.b);
    return 1;
}

#include <cstdlib>
/* Aborts on a malformed op, as kern_cuda_exec does. */
static inline void emu_kc_check_op(const kern_op *op, kern_op_kind kind, const char *who)
{
    char why[192];
    if (!op || op->kind != kind || kern_validate(op, why, sizeof why) != 0) {
        fprintf(stderr, "%s: malformed op: %s\n", who, op && op->kind == kind ? why : "wrong kind");
        abort();
    }
}

/* The launch callback a launch description (xx_launch(op, ..., launch)) is given: each launch runs on
 * the emulation, under the next schedule of the seed's kind (seed, seed + 2, ...). */
struct emu_kc_launch {
    uint64_t seed;
    uint64_t launches = 0;
    template <typename K, typename... A>
    void operator()(K kernel, dim3 grid, dim3 block, size_t smem, A... args)
    {
        emu_launch(emu_config{seed + 2 * launches++}, kernel, grid, block, smem, args...);
    }
};
#endif

#endif
