/* tests/opcases/opcases.h — the one-op cases shared by the two harnesses that compare a CUDA kernel with
 * the CPU kernel (kern_cpu_exec):
 *  - tests/gpu/test_cuda_ops.c: the op on a real GPU through the CUDA backend (skipped without a GPU);
 *  - tests/emu/test_emu_*.c (emu_optest.h): the kernels' real source on the CPU emulation of the CUDA
 *    primitives, under two thread schedules, buffers ending at a guard page (every CI run).
 *
 * A case declares the op's buffers in an oc_case (inputs, outputs, views into another buffer; initial
 * contents: random inputs, padding rows past n poisoned, every output element poisoned) and hands it to
 * the harness's run, which builds its copies, runs the op on the CPU and on its side, compares every
 * output (live elements bitwise for exact slots or within rtol: gpu_cmp_f32; unwritten elements keep the
 * poison) and frees the case's buffers. Each op family's cases are defined once, below, and run by both.
 * Tolerances differ: the emulation uses the same libm as the CPU (tight rtol, some slots exact), a GPU
 * its own (oc_rtol picks by h->emu). */
#ifndef GS_TESTS_OPCASES_H
#define GS_TESTS_OPCASES_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"
#include "tests/gpu/gpu_test.h"

/* buffer roles; OC_OUT_CMP: an output compared by the case's own cmp (oc_case) */
enum { OC_NONE = 0, OC_IN, OC_OUT_F32, OC_OUT_I32, OC_OUT_CMP };
static inline int oc_is_out(int role) { return role == OC_OUT_F32 || role == OC_OUT_I32 || role == OC_OUT_CMP; }
/* Slots 0..KERN_MAX_BUFS-1 are the op's buffers; OC_EXTRA holds one the op only sees through views
 * (a sub-range starting inside it). */
#define OC_EXTRA KERN_MAX_BUFS
#define OC_SLOTS (KERN_MAX_BUFS + 1)

typedef struct oc_case_ {
    kern_op op; /* kind, p, f (buffers filled by the harness) */
    void *host[OC_SLOTS];
    size_t bytes[OC_SLOTS];
    int type[OC_SLOTS];
    int alias[OC_SLOTS]; /* slot whose buffer this one views, or -1 */
    size_t off[OC_SLOTS];
    int exact[OC_SLOTS];
    double rtol;
    size_t attn_bytes; /* the emulation's attention scratch (0: its default); a GPU ignores it */
    /* OC_OUT_CMP slots: cpu is the CPU's output, got the harness side's, t->host[] the initial contents of
     * every slot (still valid); returns the failures. cmp_ctx: the case's (e.g. counters). */
    int (*cmp)(const struct oc_case_ *t, int slot, const void *cpu, const void *got, const char *what);
    void *cmp_ctx;
    int twice; /* a GPU runs the op twice and requires bitwise equal outputs (the emulation always runs two
                * thread schedules and requires that) */
} oc_case;

/* A harness: emu 1 for the CPU emulation (same libm as the CPU kernels), 0 for a GPU. run executes the
 * case on both sides, compares and frees its buffers; returns the number of failures. */
typedef struct oc_harness {
    int emu;
    int (*run)(struct oc_harness *h, oc_case *t, const char *name);
    void *ctx;
    int n_run; /* cases run, counted by oc_check */
} oc_harness;

/* ---- building a case (buffers from the oc_* allocators below; the harness frees them) ---------------- */
void oc_init(oc_case *t, kern_op_kind kind, double rtol);
void oc_buf(oc_case *t, int slot, void *host, size_t bytes, int role);
void oc_view(oc_case *t, int slot, int of, size_t off, size_t bytes);
/* compares output slot s (role OC_OUT_F32 / I32 / CMP) of the CPU (cpu) and of the harness's side (got);
 * what names it in messages. Returns the failures. Both harnesses compare through it. */
int oc_compare(const oc_case *t, int s, const void *cpu, const void *got, const char *what);
/* runs the case (cmocka: fails the test when the harness reports a failure) */
void oc_check(oc_harness *h, oc_case *t, const char *name);
static inline double oc_rtol(const oc_harness *h, double emu_rtol, double gpu_rtol) { return h->emu ? emu_rtol : gpu_rtol; }

/* ---- data: 64-byte aligned (free()), never NULL ------------------------------------------------------- */
void *oc_alloc(size_t bytes);
float *oc_poison(size_t n);
/* rows x cols: random in [-scale, scale) for rows < live, poison after */
float *oc_rows(gpu_rng *r, size_t rows, size_t cols, size_t live, float scale);
float *oc_rand(gpu_rng *r, size_t n, float scale);
float *oc_near1(gpu_rng *r, size_t n); /* norm weights */
void *oc_weights(gpu_rng *r, int bf, size_t n, float scale); /* bf16 or f32 */
uint8_t *oc_fp8_codes(gpu_rng *r, size_t n); /* random e4m3 codes, no NaN code */
float *oc_fp8_scales(gpu_rng *r, size_t n);   /* block scales of e4m3 weights around 0.5 */
int32_t *oc_i32(size_t n, int32_t v);
float *oc_inv_freq(int hd, double base);

/* Paged cache geometry shared by kv_write and attention cases. */
typedef struct {
    int nkv, hd, bs, max_blocks, max_seqs, num_blocks;
} oc_cache_geo;
/* every slot gets distinct physical blocks (a shuffled pool), unused entries -1 */
int32_t *oc_block_tables(gpu_rng *r, const oc_cache_geo *g);
/* builds (does not run) a KOP_KV_WRITE case: n live rows of slots sl[] at positions ps[], nh q heads */
void oc_kv_write_case(oc_case *t, double rtol, gpu_rng *r, const oc_cache_geo *g, int nh, int max_rows, int n,
                      const int *sl, const int *ps);

/* ---- the shared cases: each runs every case of its op family through h ------------------------------- */
void opcase_rmsnorm(oc_harness *h);
void opcase_qk_norm_rope(oc_harness *h);
void opcase_embed(oc_harness *h);
void opcase_gather_rows(oc_harness *h);
void opcase_copy_cols(oc_harness *h);
void opcase_silu_mul(oc_harness *h);
void opcase_add(oc_harness *h);
void opcase_kv_write(oc_harness *h);
void opcase_attention(oc_harness *h);
void opcase_matmul(oc_harness *h);
void opcase_matmul_fp8(oc_harness *h);
void opcase_draft_select(oc_harness *h);
void opcase_confidence(oc_harness *h);
void opcase_sample(oc_harness *h);
void opcase_moe_route(oc_harness *h);
void opcase_moe_ffn(oc_harness *h);

/* ---- KOP_SAMPLE helpers (also the emulation's error-record cases) ----------------------------------- */
/* best id of C0 by the order key (the greedy choice), bans[0..nb) excluded */
int32_t oc_sample_best(const float *l, int V, const int32_t *bans, int nb);
/* fills rows < n of logits [., V] and params with a mix of every mode; bans taken from bans[0..NB);
 * long_bans: some rows' ban lists run past the kernel's shared-memory staging */
void oc_sample_rows(gpu_rng *r, float *logits, kern_sample_params *prm, int32_t *bans, int NB, int V, int n,
                    int long_bans);
/* penalties and logit_bias on those rows: buffers 5..7 of the op (tests/opcases/opcases.c) */
void oc_sample_penalties(gpu_rng *r, kern_sample_params *prm, int n, int V, int32_t *bans, int NB, int32_t *pen_state,
                         int slots, kern_logit_bias *bias, int max_bias, int32_t *upd, int max_upd);

#endif
