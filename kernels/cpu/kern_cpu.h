/* kernels/cpu/kern_cpu.h — internals of the CPU backend (not part of the kern.h contract).
 *
 * Layout of the backend:
 *   pool.c          the worker pool (kern_pool_*)
 *   dispatch.c      kern_cpu_exec: validates an op, then calls one kernel per op family
 *   matmul.c        KOP_MATMUL           norm_rope.c    KOP_RMSNORM, KOP_QK_NORM_ROPE
 *   attention.c     KOP_KV_WRITE, KOP_ATTENTION
 *   elementwise.c   KOP_EMBED, KOP_SILU_MUL, KOP_ADD, KOP_GATHER_ROWS
 *   spec.c          KOP_COPY_COLS, KOP_DRAFT_SELECT, KOP_CONFIDENCE;  sample.c  KOP_SAMPLE
 *   moe.c           KOP_MOE_ROUTE, KOP_MOE_FFN
 *   matmul_amx.c    the "amx" order of KOP_MATMUL / KOP_MOE_FFN (KERN_BF16_ACT_AMX): TDPBF16PS natively,
 *                   an exact plain-C emulation on every other ISA (the order is written down there)
 *   simd.c          picks the instruction set once; simd_{scalar,avx2,avx512}.c instantiate
 *                   simd_body.inc, the one source of every reduction (dot products, GEMV tiles).
 *
 * Determinism: every reduction (matmul sums, attention and norm dot products) uses one scheme,
 * "16 lanes": lane i accumulates terms k = i, i+16, i+32, ... with a fused multiply-add (one
 * rounding, as C's fmaf), the 16 lanes are summed by a fixed tree (i + i+8, then + i+4, + i+2,
 * + i+1), then the k % 16 tail is added in order (s = s + a*b, unfused). The scalar, AVX2 (two 8-wide halves) and AVX-512 instantiations all
 * perform exactly these IEEE operations, so results are bitwise identical on every x86-64 machine,
 * for every row count, tile shape and thread split. Tests check this by forcing each ISA.
 *
 * "bf16 pairs" — the matmul of bf16 weights when the pool's bf16-activation mode is on
 * (kern_pool_set_bf16_activations; off by default): each activation is first rounded to bf16
 * (kern_f32_to_bf16_daz), and lane i accumulates the pairs k = 32s + 2i, 32s + 2i + 1 for
 * s = 0, 1, ... as vdpbf16ps does: acc = fma(x[k+1], w[k+1], acc), then acc = fma(x[k], w[k], acc),
 * each with denormal inputs read as zero and a tiny result flushed to zero with its sign (both
 * products are exact: 8-bit significands). Then the same fixed tree over the 16 lanes and the
 * k % 32 tail in order (s = s + x * w, unfused, x rounded), in plain IEEE arithmetic. The native
 * AVX512_BF16 kernel (vcvtne2ps2bf16 + vdpbf16ps) and the emulations in the scalar, AVX2 and
 * AVX-512 builds give the same bits; on this scheme bf16 matmuls do twice the products per
 * instruction, at the cost of activations carried at bf16 precision into each matmul (what
 * llama.cpp and vLLM do for bf16 models; graphswap's default keeps them f32). FP8 weights in
 * either bf16-activation mode: each weight dequantized (kern_fp8_to_f32(q) * s), rounded to bf16
 * (kern_f32_to_bf16_daz) in registers, then exactly this scheme (simd_body.inc, mode 4).
 */
#ifndef GS_KERN_CPU_H
#define GS_KERN_CPU_H

#include "kernels/kern.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* ---- malformed-op checks (always on: a bad op is a bug, and the CPU backend is the checked one) */
_Noreturn void kern_cpu_fail(const kern_op *op, const char *what, const char *file, int line);
#define KERN_CHECK(op, cond)                                                                       \
    do {                                                                                           \
        if (!(cond)) kern_cpu_fail((op), #cond, __FILE__, __LINE__);                               \
    } while (0)

/* ---- instruction-set selection ----------------------------------------------------------------- */
/* AVX512BF16: AVX-512 plus the native bf16-pairs matmul (every other entry is AVX-512's); AMX:
 * AVX512BF16 plus the native "amx" matmul (TDPBF16PS, matmul_amx.c) */
typedef enum {
    KERN_ISA_SCALAR = 0,
    KERN_ISA_AVX2 = 1,
    KERN_ISA_AVX512 = 2,
    KERN_ISA_AVX512BF16 = 3,
    KERN_ISA_AMX = 4
} kern_isa;

/* Activation rows rounded to bf16 for the bf16-pairs matmul, rows [r0, r1) of the op's x, row r
 * at buf + (r - r0) * K; for the column-lane GEMM (f32 activations) rows [0, r1) transposed
 * (simd_body.inc simd_mm_cl); for the amx one, whole 16-row blocks in TDPBF16PS's B-tile layout (block
 * of row r0 + 16 b at buf + b * 16 * Kp, Kp = K rounded up to 32, matmul_amx.c). One per thread
 * per op (matmul.c mm_run), reused by every work unit the thread claims in that op and never by
 * another op, so it cannot go stale. */
typedef struct {
    uint16_t *buf; /* the thread's pool scratch */
    size_t bytes;
    int r0, r1;
} kern_mm_xb;

/* Arguments of one GEMV/GEMM call: out[r, n] (+)= x[r, :] . W[n, :] + bias[n], r < M. */
typedef struct {
    const float *x;    /* [M, K] */
    const void *w;     /* [N, K], f32 or bf16 */
    const float *bias; /* [N] or NULL */
    float *out;        /* [M, N] */
    int K, N, M;
    int bf16;       /* W is bf16 */
    int accumulate; /* out += instead of out = */
    /* FP8 weights (KERN_DT_FP8, kern.h KOP_MATMUL): W holds e4m3 codes, weight (n, k) is
     * kern_fp8_to_f32(W[n, k]) * fs[(n / fb0) * fsk + (k >> fsh)]; fs NULL otherwise */
    const float *fs;
    int fb0, fsh, fsk;
    kern_mm_xb *xb; /* bf16-pairs mode: the calling thread's rounded rows, or NULL (round as it goes) */
} kern_mm_args;

/* The column-lane GEMM (simd_body.inc simd_mm_cl; ISAs whose kern_simd_ops.mm_cl_rows /
 * mm_cl_rows_fp8 is set): f32 activations, from that many rows (AVX2: KERN_CL_MIN_ROWS), in tiles
 * of KERN_CL_ROWS rows, over the thread's scratch (kern_mm_xb): the rows of M that it holds for a
 * K (0: none, K < 16). */
#define KERN_CL_ROWS 6
/* below 16 rows, packing the weights costs more than the tile work it saves: Zen 3, 2 threads,
 * bench gemv (125M projections from DRAM), 5 alternated runs, min ms: 10 rows bf16 17.9 -> 19.5,
 * FP8 17.4 -> 21.7; 16 rows bf16 23.6 -> 25.3 (median 28.6 -> 26.2), FP8 level, f32 34.9 -> 30.8.
 * (Before the pack prefetched and padded its lanes, 16 rows bf16 went 37 -> 43 and the threshold
 * was 20.) */
#define KERN_CL_MIN_ROWS 16
/* floats from one lane to the next in the packed weights (16 columns a step) and in a row tile's
 * packed x (8 rows a step): one 64-byte line more than the lane's steps, so the 16 lanes that a
 * pack writes at once do not fall in the same L1 sets (unpadded, K = 2048 puts them 8 KiB apart) */
static inline size_t kern_cl_pw_lane(size_t J) { return 16 * J + 16; }
static inline size_t kern_cl_xp_lane(size_t J) { return 8 * J + 16; }
/* floats of one row tile's packed x (16 lanes) */
static inline size_t kern_cl_xp_tile(size_t J) { return 16 * kern_cl_xp_lane(J); }
static inline int kern_cl_scratch_rows(int K, size_t bytes)
{
    const size_t J = (size_t)K / 16, fl = bytes / sizeof(float);
    const size_t fixed = 16 * KERN_CL_ROWS * 16 + 16 * kern_cl_pw_lane(J);
    if (J == 0 || fl <= fixed) return 0;
    return (int)((fl - fixed) / kern_cl_xp_tile(J)) * KERN_CL_ROWS;
}

/* Per-ISA entry points; all give bitwise-identical results (see top of file). */
typedef struct {
    kern_isa isa;
    const char *name;
    /* all rows 0..M-1, output columns [n0, n1) */
    void (*mm_cols)(const kern_mm_args *a, int n0, int n1);
    /* the same for bf16 weights in the bf16-pairs scheme (activations rounded to bf16) */
    void (*mm_cols_bf16x)(const kern_mm_args *a, int n0, int n1);
    /* the same for bf16 weights in the "amx" order (matmul_amx.c): native TDPBF16PS or its exact
     * emulation (bitwise the same); ignores a->xb */
    void (*mm_cols_amx)(const kern_mm_args *a, int n0, int n1);
    /* mm_cols takes the column-lane GEMM for an op of M >= mm_cl_rows rows of f32 activations
     * over f32 / bf16 weights (mm_cl_rows_fp8: FP8 weights) when a->xb holds them
     * (kern_cl_scratch_rows); 0: never (>= KERN_CL_MIN_ROWS otherwise) */
    int mm_cl_rows, mm_cl_rows_fp8;
    /* sum_i a[i]*b[i] in the 16-lane scheme */
    float (*dot)(const float *a, const float *b, int n);
    /* out[i * ldo + j] = dot(q[i], k[j], n) for i < nq <= 4, j < nk <= 4: bitwise as nq * nk calls
     * of dot, faster */
    void (*dots4x4)(const float *const *q, int nq, const float *const *k, int nk, int n, float *out, int ldo);
    /* for each q < ny (1..4), for j = 0 .. nx-1 in order: y[q][i] = fmaf(a[j * lda + q], x[j][i],
     * y[q][i]) (one rounding per term) */
    void (*axpys)(float *const *y, int ny, const float *a, int lda, const float *const *x, int nx, int n);
    /* y[i] = y[i] * alpha */
    void (*scale)(float *y, float alpha, int n);
    /* y[i] = kern_exp_neg((double)l[i] - mx), bit for bit (the log-softmax's terms) */
    void (*exp_shift)(double *y, const float *l, double mx, int n);
    /* out[i] = kern_silu_mul(g[i], u[i]), bit for bit */
    void (*silu_mul)(float *out, const float *g, const float *u, int n);
    /* y[i] = x[i] / d */
    void (*div)(float *y, const float *x, float d, int n);
    /* One key chunk of an online softmax for 16 queries, lane q = query q; st[16 * i + q] is query
     * q's score of key i < nk, and query q takes the keys i < cq[q] (a float; 0: untouched).
     * Exactly, for each query with cq[q] > 0:
     *   s[i] = s[i] * scale (i < cq[q]); mc = the max of them in key order (NaN never greater);
     *   if mc > m[q]: { if l[q] > 0: corr[q] = kern_expf(m[q] - mc), l[q] = l[q] * corr[q];
     *                   m[q] = mc }
     *   s[i] = kern_expf(s[i] - m[q]), l[q] = l[q] + s[i] for i < cq[q] in order.
     * corr[q] = 1 where nothing was rescaled (the caller scales acc by corr[q] != 1: by exactly 1
     * would change no bit). st entries of keys past cq[q] are overwritten with garbage. */
    void (*softmax16)(float *st, int nk, const float *cq, float scale, float *m, float *l, float *corr);
} kern_simd_ops;

extern const kern_simd_ops kern_simd_scalar;
#if defined(__x86_64__) || defined(__i386__)
#define KERN_HAVE_X86 1
extern const kern_simd_ops kern_simd_avx2;
extern const kern_simd_ops kern_simd_avx512;
extern const kern_simd_ops kern_simd_avx512bf16;
void kern_mm_cols_bf16x_native(const kern_mm_args *a, int n0, int n1); /* simd_avx512bf16.c */
/* A compiler with the AMX intrinsics (GCC 11+, clang 12+): the native "amx" matmul is built */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define KERN_HAVE_AMX_BUILD 1
extern const kern_simd_ops kern_simd_amx;
void kern_mm_cols_amx_native(const kern_mm_args *a, int n0, int n1); /* matmul_amx.c */
#endif
#endif
/* The "amx" order emulated in plain C (matmul_amx.c): every table but kern_simd_amx runs it. */
void kern_mm_cols_amx_emul(const kern_mm_args *a, int n0, int n1);
/* cpuid shows AMX-TILE and AMX-BF16 and the kernel granted the tile data state (arch_prctl
 * ARCH_REQ_XCOMP_PERM, asked once per process); 0 where the build lacks AMX. */
int kern_amx_supported(void);
/* Rows of x (a multiple of 16) whose amx B tiles fit in bytes of scratch, for K (matmul_amx.c). */
int kern_amx_scratch_rows(int K, size_t bytes);

/* exp(x) for the terms of a log-softmax, x = l - max(l) <= 0, within about 1.5 ulp of the exact
 * value (glibc's exp is within 0.5): x = k ln2 + r with k = round(x / ln2) (the 1.5 * 2^52 shift
 * rounds it), r = x - k ln2_hi - k ln2_lo (ln2_hi has 31 significant bits, so k ln2_hi is exact),
 * exp(r) = the Taylor polynomial of degree 13 in Horner form (|r| <= ln2 / 2: truncation below 1e-17
 * relative), times 2^k built in the exponent bits. Below -708 it returns 0: such a term is under
 * 2^-1021, and the sum it joins reaches 1 at the maximum's own term, where it no longer changes a
 * bit. NaN stays NaN. Only IEEE double operations with fma, so the vector versions (AVX2, AVX-512:
 * kern_simd_ops.exp_shift) give the same bits, several times faster than a libm call per term. */
#define KERN_EXP_NEG_MIN (-708.0)
#define KERN_EXP_SHIFT 0x1.8p52               /* adding it rounds to an integer */
#define KERN_EXP_INV_LN2 0x1.71547652b82fep+0 /* 1 / ln 2 */
#define KERN_EXP_LN2_HI 0x1.62e42fee00000p-1  /* ln 2 to 31 bits */
#define KERN_EXP_LN2_LO 0x1.a39ef35793c76p-33 /* ln 2 - KERN_EXP_LN2_HI */
extern const double kern_exp_neg_c[14];       /* 1 / i!, i = 0 .. 13 (simd.c) */
static inline double kern_exp_neg(double x)
{
    const double *c = kern_exp_neg_c;
    if (x < KERN_EXP_NEG_MIN) return 0.0;
    const double kd = fma(x, KERN_EXP_INV_LN2, KERN_EXP_SHIFT); /* 1.5 * 2^52 + round(x / ln2) */
    const double k = kd - KERN_EXP_SHIFT;
    double r = fma(-k, KERN_EXP_LN2_HI, x);
    r = fma(-k, KERN_EXP_LN2_LO, r);
    double p = c[13];
    for (int i = 12; i >= 0; i--) p = fma(p, r, c[i]);
    union {
        double d;
        uint64_t u;
    } sc = {.d = kd};
    sc.u = (sc.u + 1023u) << 52; /* the low bits of kd's significand are k: 2^k */
    return p * sc.d;
}

/* exp(x) in f32 for SiLU and the attention softmax, within about 1 ulp of the exact value (glibc's
 * expf: 0.5), in plain IEEE f32 operations with fma so the vector versions (simd_body.inc
 * simd_expf: 8 / 16 lanes) give the same bits, several times faster than a libm call per element.
 * x is clamped to [-104, 89] (beyond, exp is 0 / inf in f32, and the clamped value still rounds
 * there); x = k ln2 + r with k = round(x / ln2) (adding 1.5 * 2^23 rounds it), r = x - k ln2_hi -
 * k ln2_lo (ln2_hi has 9 significant bits: k ln2_hi is exact); exp(r) = the Taylor polynomial of
 * degree 7 in Horner form (|r| <= ln2 / 2: truncation below 6e-9 relative); times 2^k in two
 * factors 2^(k >> 1) and 2^(k - (k >> 1)), each a normal number, so only the last product rounds
 * (a denormal result is rounded once, as it should be). NaN stays NaN (x + x, quiet). */
#define KERN_EXPF_MAX 89.0f
#define KERN_EXPF_MIN (-104.0f)
#define KERN_EXPF_SHIFT 0x1.8p23f              /* adding it rounds to an integer */
#define KERN_EXPF_SHIFT_BITS 0x4b400000         /* its bit pattern: kd's bits minus it are k */
#define KERN_EXPF_INV_LN2 0x1.715476p+0f        /* 1 / ln 2 */
#define KERN_EXPF_LN2_HI 0x1.63p-1f             /* 0.693359375 */
#define KERN_EXPF_LN2_LO (-0x1.bd0106p-13f)     /* ln 2 - KERN_EXPF_LN2_HI */
extern const float kern_expf_c[8];              /* 1 / i!, i = 0 .. 7 (simd.c) */
/* p * 2^k for kd = KERN_EXPF_SHIFT + k, |k| <= 150 */
static inline float kern_expf_scale(float p, float kd)
{
    union {
        float f;
        int32_t i;
    } b = {.f = kd}, s1, s2;
    const int32_t k = b.i - KERN_EXPF_SHIFT_BITS, k1 = k >> 1, k2 = k - k1;
    s1.i = (k1 + 127) * (1 << 23);
    s2.i = (k2 + 127) * (1 << 23);
    return p * s1.f * s2.f;
}
static inline float kern_expf(float x)
{
    if (x != x) return x + x;
    const float t = x < KERN_EXPF_MAX ? x : KERN_EXPF_MAX;  /* as minps / maxps */
    const float xc = t > KERN_EXPF_MIN ? t : KERN_EXPF_MIN;
    const float kd = fmaf(xc, KERN_EXPF_INV_LN2, KERN_EXPF_SHIFT);
    const float nk = KERN_EXPF_SHIFT - kd; /* -k, exactly */
    float r = fmaf(nk, KERN_EXPF_LN2_HI, xc);
    r = fmaf(nk, KERN_EXPF_LN2_LO, r);
    float p = kern_expf_c[7];
    for (int i = 6; i >= 0; i--) p = fmaf(p, r, kern_expf_c[i]);
    return kern_expf_scale(p, kd);
}
/* SiLU(a) * u, the one expression of KOP_SILU_MUL (simd silu_mul gives the same bits) */
static inline float kern_silu_mul(float a, float u) { return a / (1.0f + kern_expf(-a)) * u; }

/* A denormal becomes the zero of its sign: vdpbf16ps's DAZ on inputs and FTZ on results. */
static inline float kern_flush_denormal(float f)
{
    union {
        uint32_t u;
        float f;
    } v = {.f = f};
    if ((v.u & 0x7f800000u) == 0) v.u &= 0x80000000u;
    return v.f;
}

/* f32 -> bf16 as vcvtne2ps2bf16 rounds: kern_f32_to_bf16 (to nearest even, NaN stays a quiet NaN)
 * of the input with a denormal read as zero. The activation rounding of the bf16-pairs matmul. */
static inline uint16_t kern_f32_to_bf16_daz(float f) { return kern_f32_to_bf16(kern_flush_denormal(f)); }

/* The ISA in use: the best the CPU supports, or GS_KERN_ISA=scalar|avx2|avx512|avx512bf16 (capped
 * at what the CPU supports). Chosen on first use. */
const kern_simd_ops *kern_simd(void);
/* Test hook: force an ISA. Returns 0, or -1 if the CPU lacks it. Not thread-safe against running
 * kernels; call between ops. */
int kern_simd_force(kern_isa isa);

/* Full unrolling of the small fixed loops over arrays of vectors in the SIMD code (simd_*.c,
 * simd_body.inc): unrolled, the arrays stay in registers; GCC does not unroll at -O2 unless asked,
 * and SIMD_UNROLL (8) does not cover a 16-iteration loop. */
#if defined(__GNUC__) && !defined(__clang__)
#define SIMD_UNROLL _Pragma("GCC unroll 8")
#define SIMD_UNROLL16 _Pragma("GCC unroll 16")
#elif defined(__clang__)
#define SIMD_UNROLL _Pragma("unroll")
#define SIMD_UNROLL16 _Pragma("unroll")
#else
#define SIMD_UNROLL
#define SIMD_UNROLL16
#endif

/* ---- parallel helpers ------------------------------------------------------------------------- */
/* Runs fn on the pool, or inline as (tid 0, nthreads 1) when pool is NULL or work (roughly, the
 * number of scalar operations) is below the threshold where waking workers costs more than it
 * saves. Results never depend on which it picks. */
void kern_cpu_parallel(kern_pool *pool, kern_task_fn fn, void *ctx, size_t work);
/* Test hook: set the threshold (0: always use the pool). Returns the previous value. */
size_t kern_cpu_set_min_parallel_work(size_t work);
/* matmul ops so far that ran (some windows of) the column-lane GEMM: for tests */
long kern_cpu_mm_cl_ops(void);
/* the rows from which the selected ISA takes the column-lane GEMM for f32 / bf16 (fp8 0) or FP8
 * (fp8 1) weights; 0: never */
int kern_cpu_mm_cl_rows(int fp8);

/* Contiguous share [*b, *e) of 0..total for thread tid of nt, boundaries rounded to align. */
static inline void kern_split(int64_t total, int tid, int nt, int64_t align, int64_t *b, int64_t *e)
{
    int64_t units = (total + align - 1) / align;
    int64_t ub = units * tid / nt, ue = units * (tid + 1) / nt;
    *b = ub * align < total ? ub * align : total;
    *e = ue * align < total ? ue * align : total;
}

/* The pool's bf16-weight matmul order: KERN_BF16_ACT_OFF, _PAIRS or _AMX (0 for a NULL pool). */
int kern_pool_bf16_activations(const kern_pool *pool);
/* Thread tid's KERN_POOL_SCRATCH_BYTES of scratch, private to whichever task runs as tid; NULL
 * for a NULL pool (or one whose allocation failed). Contents do not survive a task. */
#define KERN_POOL_SCRATCH_BYTES ((size_t)2048 * 1024)
void *kern_pool_scratch(const kern_pool *pool, int tid);

/* Test hook: how long an idle worker spins before sleeping, in microseconds (default 1000, or
 * GS_KERN_SPIN_US). */
void kern_pool_set_spin_us(kern_pool *pool, long us);

/* ---- kernels (op already validated by dispatch.c) --------------------------------------------- */
void kern_cpu_embed(kern_pool *pool, const kern_op *op);
void kern_cpu_rmsnorm(kern_pool *pool, const kern_op *op);
void kern_cpu_matmul(kern_pool *pool, const kern_op *op);
void kern_cpu_qk_norm_rope(kern_pool *pool, const kern_op *op);
void kern_cpu_kv_write(kern_pool *pool, const kern_op *op);
void kern_cpu_attention(kern_pool *pool, const kern_op *op);
void kern_cpu_silu_mul(kern_pool *pool, const kern_op *op);
void kern_cpu_add(kern_pool *pool, const kern_op *op);
void kern_cpu_gather_rows(kern_pool *pool, const kern_op *op);
void kern_cpu_copy_cols(kern_pool *pool, const kern_op *op);
void kern_cpu_draft_select(kern_pool *pool, const kern_op *op);
void kern_cpu_confidence(kern_pool *pool, const kern_op *op);
void kern_cpu_sample(kern_pool *pool, const kern_op *op);
void kern_cpu_moe_route(kern_pool *pool, const kern_op *op);
void kern_cpu_moe_ffn(kern_pool *pool, const kern_op *op);

/* Reads the int32 row count in buf[i], checking 0 <= n <= max. */
int32_t kern_cpu_count(const kern_op *op, int i, int32_t max);

/* Upper bounds that keep per-row scratch on the stack: KERN_MAX_HEAD_DIM, KERN_MAX_MARKOV_RANK
 * (kernels/kern.h, enforced by kern_validate). */

#endif
