/* kernels/cpu/simd_avx2.c — AVX2 instantiation of simd_body.inc: the 16 lanes are two ymm halves
 * (lanes 0-7, 8-15), so every lane sees the same operations as in the AVX-512 and scalar builds.
 * Only called after kern_simd() saw avx2 at run time. */
#include "kernels/cpu/kern_cpu.h"

#ifdef KERN_HAVE_X86
#include <immintrin.h>

#define SIMD_TARGET __attribute__((target("avx2,fma")))
#define SIMD_SFX(name) name##_avx2
typedef struct {
    __m256 lo, hi;
} v16x2;
#define V v16x2
/* 16 ymm registers and two per accumulator. M == 1: 6 columns (12 accumulators). M > 1: 4 rows x
 * 1 column, so a converted weight vector serves 4 rows; x vectors come straight from L1 as memory
 * operands. Measured best of 2x2, 2x3, 3x2, 4x1 and 4x2 for M = 1 and 4. */
#define MM_MR_MAX 4
#define MM_NR_ONE 6
#define MM_NR_MULTI 1
#define MM_NR_MAX 6
#define MM_NR_ONE_F8 4 /* FP8 decode temporaries: 8 accumulators, not 12 */
#define SIMD_AXPY_ACC 4 /* 8 ymm */
/* multi-row matmuls from 5 rows (f32 weights: 16) run rows outer over blocks of 64 columns
 * (simd_body.inc simd_mm_cols_t) */
#define MM_ROWS_OUTER 5
#define MM_ROWS_OUTER_F32 16
#define MM_NB 64
/* from KERN_CL_MIN_ROWS rows (f32 activations), the column-lane GEMM: 6 rows x 16 columns, 12
 * ymm accumulators (simd_body.inc simd_mm_cl) */
#define MM_CL_ROWS KERN_CL_ROWS

#define AI2 static inline __attribute__((always_inline, unused)) SIMD_TARGET
AI2 V V_ZERO(void) { return (V){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
AI2 V V_LOAD(const float *p) { return (V){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
AI2 __m256 ldbf8(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
AI2 V V_LOADBF(const uint16_t *p) { return (V){ldbf8(p), ldbf8(p + 8)}; }
/* 8 e4m3 codes as kern_fp8_raw: sign-extended to 32 bits and shifted left 20 (the sign fills bits
 * 27..31), then bits 27..30 cleared */
AI2 __m256 ldf8x8(const uint8_t *p)
{
    const __m256i c = _mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)), 20);
    return _mm256_castsi256_ps(_mm256_and_si256(c, _mm256_set1_epi32((int)0x87f00000u)));
}
AI2 V V_LOADF8(const uint8_t *p) { return (V){ldf8x8(p), ldf8x8(p + 8)}; }
#define VS __m256
AI2 VS VS_SET1(float f) { return _mm256_set1_ps(f); }
AI2 V V_MULS(V a, VS s) { return (V){_mm256_mul_ps(a.lo, s), _mm256_mul_ps(a.hi, s)}; }
AI2 void V_STORE(float *p, V v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
AI2 V V_SET1(float f) { return (V){_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
AI2 V V_ADD(V a, V b) { return (V){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
AI2 V V_MUL(V a, V b) { return (V){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
AI2 V V_FMA(V a, V b, V c) { return (V){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
AI2 V V_SUB(V a, V b) { return (V){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
AI2 V V_DIV(V a, V b) { return (V){_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
AI2 V V_MIN(V a, V b) { return (V){_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
AI2 V V_MAX(V a, V b) { return (V){_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
AI2 __m256 expf_scale8(__m256 p, __m256 kd) /* kern_expf_scale lane-wise */
{
    const __m256i k = _mm256_sub_epi32(_mm256_castps_si256(kd), _mm256_set1_epi32(KERN_EXPF_SHIFT_BITS));
    const __m256i k1 = _mm256_srai_epi32(k, 1), k2 = _mm256_sub_epi32(k, k1), b = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, b), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, b), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
AI2 V V_EXPF_SCALE(V p, V kd) { return (V){expf_scale8(p.lo, kd.lo), expf_scale8(p.hi, kd.hi)}; }
AI2 V V_SELECT_LT(V a, V b, V x, V y) /* lane-wise a < b ? x : y */
{
    return (V){_mm256_blendv_ps(y.lo, x.lo, _mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ)),
               _mm256_blendv_ps(y.hi, x.hi, _mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ))};
}
AI2 __m256 nanpass8(__m256 y, __m256 x) { return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); }
AI2 V V_NANPASS(V y, V x) { return (V){nanpass8(y.lo, x.lo), nanpass8(y.hi, x.hi)}; }
AI2 float V_HSUM(V v)
{
    __m256 s8 = _mm256_add_ps(v.lo, v.hi);                                             /* i + i+8 */
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); /* + i+4 */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                 /* + i+2 */
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));                             /* + i+1 */
    return _mm_cvtss_f32(s1);
}

/* out[j] = V_HSUM(a[j]) for 16 accumulators at once: the same tree and the same adds, on vectors
 * that each carry pieces of several accumulators. Step for step the network of simd_avx512.c, with
 * the lo / hi ymm halves standing for its 128-bit units 0-1 / 2-3. */
AI2 V hsum_pair_units(V p, V q) /* level 2: [P.u0 P.u2 Q.u0 Q.u2] + [P.u1 P.u3 Q.u1 Q.u3] */
{
    return (V){_mm256_add_ps(_mm256_permute2f128_ps(p.lo, p.hi, 0x20), _mm256_permute2f128_ps(p.lo, p.hi, 0x31)),
               _mm256_add_ps(_mm256_permute2f128_ps(q.lo, q.hi, 0x20), _mm256_permute2f128_ps(q.lo, q.hi, 0x31))};
}
#define HSUM_SHUF_ADD(a, b, i0, i1)                                                                \
    _mm256_add_ps(_mm256_shuffle_ps((a), (b), (i0)), _mm256_shuffle_ps((a), (b), (i1)))
AI2 void V_HSUM16_STORE(float *out, const V *a)
{
    V p[8], r[4], t[2];
    SIMD_UNROLL for (int i = 0; i < 8; i++) /* level 1: [s8 a[2i] | s8 a[2i+1]] */
        p[i] = (V){_mm256_add_ps(a[2 * i].lo, a[2 * i].hi), _mm256_add_ps(a[2 * i + 1].lo, a[2 * i + 1].hi)};
    SIMD_UNROLL for (int i = 0; i < 4; i++) r[i] = hsum_pair_units(p[2 * i], p[2 * i + 1]); /* s4 of a[4i .. 4i+3] */
    SIMD_UNROLL for (int i = 0; i < 2; i++) /* level 3: per unit [s4_0 + s4_2, s4_1 + s4_3] of R and of S */
        t[i] = (V){HSUM_SHUF_ADD(r[2 * i].lo, r[2 * i + 1].lo, _MM_SHUFFLE(1, 0, 1, 0), _MM_SHUFFLE(3, 2, 3, 2)),
                   HSUM_SHUF_ADD(r[2 * i].hi, r[2 * i + 1].hi, _MM_SHUFFLE(1, 0, 1, 0), _MM_SHUFFLE(3, 2, 3, 2))};
    /* level 4: per unit [s2_0 + s2_1] of both halves of T0, then of T1 */
    float z[16];
    _mm256_storeu_ps(z, HSUM_SHUF_ADD(t[0].lo, t[1].lo, _MM_SHUFFLE(2, 0, 2, 0), _MM_SHUFFLE(3, 1, 3, 1)));
    _mm256_storeu_ps(z + 8, HSUM_SHUF_ADD(t[0].hi, t[1].hi, _MM_SHUFFLE(2, 0, 2, 0), _MM_SHUFFLE(3, 1, 3, 1)));
    for (int j = 0; j < 16; j++) out[j] = z[4 * (j % 4) + j / 4]; /* lane 4u + v holds a[u + 4v] */
}

#include "kernels/cpu/simd_t8x16.h"

/* bf16 pairs (kern_cpu.h), emulated with FMAs: e = even k, o = odd k of each lane's pair (lanes
 * 0-7 take x[0..15], lanes 8-15 x[16..31]); the flushes are explicit, MXCSR is left alone. */
typedef struct {
    V e, o;
} pairs;
#define XP pairs
#define WP pairs
AI2 __m256i flush_tiny_i(__m256i u, __m256i of) /* lanes of u where `of` has a zero exponent -> signed zero */
{
    const __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(of, _mm256_set1_epi32(0x7f800000)), _mm256_setzero_si256());
    return _mm256_blendv_epi8(u, _mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)), tiny);
}
AI2 __m256 flush_tiny(__m256 v)
{
    const __m256i u = _mm256_castps_si256(v);
    return _mm256_castsi256_ps(flush_tiny_i(u, u));
}
AI2 __m256 round_bf16_daz(__m256 f) /* kern_f32_to_bf16_daz, as an f32 (low 16 bits zero) */
{
    const __m256i u = _mm256_castps_si256(f), hi = _mm256_set1_epi32((int)0xffff0000u);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), hi);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_and_si256(u, hi), _mm256_set1_epi32(0x00400000)), nan);
    return _mm256_castsi256_ps(flush_tiny_i(r, u));
}
/* 16 floats (lo: 0..7, hi: 8..15) -> rounded evens (x[0], x[2], ..., x[14]) and odds */
AI2 void split16v(__m256 lo, __m256 hi, __m256 *e, __m256 *o)
{
    const __m256 a = round_bf16_daz(lo), b = round_bf16_daz(hi);
    /* per 128-bit half [a0 a2 b0 b2 | a4 a6 b4 b6]; the 64-bit permute puts them in order */
    *e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
    *o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8));
}
AI2 WP WP_FROM_F32(V a, V b) /* a rounded value is never denormal, so no flush is left */
{
    WP p;
    split16v(a.lo, a.hi, &p.e.lo, &p.o.lo);
    split16v(b.lo, b.hi, &p.e.hi, &p.o.hi);
    return p;
}
AI2 WP WP_LOAD(const uint16_t *w)
{
    const __m256i m = _mm256_set1_epi32((int)0xffff0000u);
    const __m256i u0 = _mm256_loadu_si256((const __m256i *)w), u1 = _mm256_loadu_si256((const __m256i *)(w + 16));
    return (WP){{flush_tiny(_mm256_castsi256_ps(_mm256_slli_epi32(u0, 16))), flush_tiny(_mm256_castsi256_ps(_mm256_slli_epi32(u1, 16)))},
                {flush_tiny(_mm256_castsi256_ps(_mm256_and_si256(u0, m))), flush_tiny(_mm256_castsi256_ps(_mm256_and_si256(u1, m)))}};
}
AI2 V V_DP2(V acc, XP x, WP w)
{
    acc = (V){flush_tiny(_mm256_fmadd_ps(x.o.lo, w.o.lo, acc.lo)), flush_tiny(_mm256_fmadd_ps(x.o.hi, w.o.hi, acc.hi))};
    return (V){flush_tiny(_mm256_fmadd_ps(x.e.lo, w.e.lo, acc.lo)), flush_tiny(_mm256_fmadd_ps(x.e.hi, w.e.hi, acc.hi))};
}

#include "kernels/cpu/simd_body.inc"

/* kern_simd_ops.exp_shift: kern_exp_neg's operations on 4 doubles at a time (the tail scalar) */
static SIMD_TARGET void exp_shift_avx2(double *y, const float *l, double mx, int n)
{
    const __m256d shift = _mm256_set1_pd(KERN_EXP_SHIFT), vmx = _mm256_set1_pd(mx), lo = _mm256_set1_pd(KERN_EXP_NEG_MIN);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d x = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(l + i)), vmx);
        const __m256d kd = _mm256_fmadd_pd(x, _mm256_set1_pd(KERN_EXP_INV_LN2), shift);
        const __m256d k = _mm256_sub_pd(kd, shift);
        __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(KERN_EXP_LN2_HI), x);
        r = _mm256_fnmadd_pd(k, _mm256_set1_pd(KERN_EXP_LN2_LO), r);
        __m256d p = _mm256_set1_pd(kern_exp_neg_c[13]);
        for (int j = 12; j >= 0; j--) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kern_exp_neg_c[j]));
        const __m256i e = _mm256_slli_epi64(_mm256_add_epi64(_mm256_castpd_si256(kd), _mm256_set1_epi64x(1023)), 52);
        const __m256d v = _mm256_mul_pd(p, _mm256_castsi256_pd(e));
        _mm256_storeu_pd(y + i, _mm256_andnot_pd(_mm256_cmp_pd(x, lo, _CMP_LT_OQ), v)); /* x < min: 0 */
    }
    for (; i < n; i++) y[i] = kern_exp_neg((double)l[i] - mx);
}

const kern_simd_ops kern_simd_avx2 = {
    .isa = KERN_ISA_AVX2,
    .name = "avx2",
    .mm_cols = simd_mm_cols_avx2,
    .mm_cols_bf16x = simd_mm_cols_bf16x_avx2,
    .mm_cols_amx = kern_mm_cols_amx_emul,
    .mm_cl_rows = KERN_CL_MIN_ROWS,
    .mm_cl_rows_fp8 = KERN_CL_MIN_ROWS,
    .dot = simd_dot_avx2,
    .dots4x4 = simd_dots4x4_avx2,
    .axpys = simd_axpys_avx2,
    .scale = simd_scale_avx2,
    .exp_shift = exp_shift_avx2,
    .silu_mul = simd_silu_mul_avx2,
    .softmax16 = simd_softmax16_avx2,
    .div = simd_div_avx2,
};
#endif
