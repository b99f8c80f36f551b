/* tests/emu/emu_attention.cpp — kernels/cuda/attention.cu (KOP_KV_WRITE, KOP_ATTENTION), the real source,
 * compiled by g++ against the CPU emulation of the CUDA primitives (emu_cuda.h, GS_CUDA_EMU) and launched
 * with kvw_launch / attn_launches, the launches kc_kv_write / kc_attention enqueue on a GPU. The split
 * partials live in a host scratch of the configured size (cfg->attn_bytes, as the context's attn_bytes),
 * NaN-poisoned before the launches, with a guard past the end that must stay untouched. Used by
 * test_emu_attention.c.
 * Limits: those of the emulation (emu_cuda.h): blocks one after another (the split kernel of a chunk of
 * rows completes before its combine, as stream order guarantees), C library exp2f. */
#ifndef GS_CUDA_EMU
#error "build with -DGS_CUDA_EMU (tests/emu/CMakeLists.txt)"
#endif
#include "kernels/cuda/attention.cu"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tests/emu/emu_kernels.h"

/* k_attention's `extern __shared__ float sm_acc[]` (the launch's dynamic shared memory: ATT_WARPS * G * hd
 * floats; built with -fno-extern-tls-init, see CMakeLists.txt) */
EMU_DYNAMIC_SHARED(float, sm_acc);

extern "C" int emu_kc_kv_write(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    (void)cfg;
    emu_kc_check_op(op, KOP_KV_WRITE, "emu_kc_kv_write");
    kc_err err = {};
    kvw_launch(op, &err, emu_kc_launch{seed});
    return emu_kc_report(err, msg, msglen);
}

static const uint32_t SCRATCH_POISON = 0x7fc0a77eu; /* a quiet NaN: a partial read before it is written */
enum { GUARD_FLOATS = 1024 };

extern "C" int emu_kc_attention(const kern_op *op, const emu_kc_config *cfg, uint64_t seed, char *msg, size_t msglen)
{
    emu_kc_check_op(op, KOP_ATTENTION, "emu_kc_attention");
    const size_t attn_bytes = cfg && cfg->attn_bytes ? cfg->attn_bytes : (size_t)128 << 20;
    /* the host scratch: the configured size, or (the 128 MiB default) what every row's partials can
     * take at once, whichever is smaller; the kernels see attn_bytes, so a row chunking that
     * overran the allocation would hit the guard */
    const int32_t *p = op->p;
    long long ys = ((long long)p[5] * p[4] + ATT_CHUNK - 1) / ATT_CHUNK;
    if (ys > ATT_MAX_SPLITS) ys = ATT_MAX_SPLITS;
    if (ys < 1) ys = 1;
    const size_t all_rows = (size_t)p[6] * (size_t)p[0] * (size_t)ys * ((size_t)p[2] + 2) * sizeof(float);
    const size_t floats = (attn_bytes < all_rows ? attn_bytes : all_rows) / sizeof(float);
    std::vector<uint32_t> scratch(floats + GUARD_FLOATS, SCRATCH_POISON);
    kc_err err = {};
    attn_launches(op, reinterpret_cast<float *>(scratch.data()), attn_bytes, &err, emu_kc_launch{seed});
    for (size_t i = floats; i < scratch.size(); i++)
        if (scratch[i] != SCRATCH_POISON) {
            snprintf(msg, msglen, "attention: scratch written %zu floats past its end", i - floats);
            return 1;
        }
    return emu_kc_report(err, msg, msglen);
}
