/* kernels/cpu/simd_avx512.c — AVX-512 instantiation of simd_body.inc (one zmm = the 16 lanes).
 * Compiled for any target; only called after kern_simd() saw avx512f at run time. */
#include "kernels/cpu/kern_cpu.h"

#ifdef KERN_HAVE_X86
#define SIMD_TARGET __attribute__((target("avx512f,avx2,fma")))
#define SIMD_SFX(name) name##_avx512
#include "kernels/cpu/simd_avx512_v.h"

/* bf16 pairs (kern_cpu.h), emulated with FMAs: e = even k, o = odd k of each lane's pair. The
 * flushes are explicit (MXCSR is left alone: the compiler may move arithmetic across a change of
 * it). */
typedef struct {
    V e, o;
} pairs;
#define XP pairs
#define WP pairs
#define AI5 static inline __attribute__((always_inline)) SIMD_TARGET
AI5 __m512i flush_tiny_i(__m512i u, __m512i of) /* lanes of u where `of` has a zero exponent -> signed zero */
{
    const __mmask16 tiny = _mm512_testn_epi32_mask(of, _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_and_epi32(u, tiny, u, _mm512_set1_epi32((int)0x80000000u));
}
AI5 V flush_tiny(V v)
{
    const __m512i u = _mm512_castps_si512(v);
    return _mm512_castsi512_ps(flush_tiny_i(u, u));
}
/* kern_f32_to_bf16_daz, kept in the high half of each 32-bit lane (the bf16 value as an f32) */
AI5 __m512i round_bf16_daz(__m512i u)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), hi);
    const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_and_si512(u, hi), _mm512_set1_epi32(0x00400000));
    return flush_tiny_i(r, u); /* a denormal input: its signed zero */
}
AI5 WP WP_FROM_F32(V va, V vb) /* a rounded value is never denormal: no flush is left */
{
    const __m512 a = _mm512_castsi512_ps(round_bf16_daz(_mm512_castps_si512(va)));
    const __m512 b = _mm512_castsi512_ps(round_bf16_daz(_mm512_castps_si512(vb)));
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return (WP){_mm512_permutex2var_ps(a, ev, b), _mm512_permutex2var_ps(a, od, b)};
}
AI5 WP WP_LOAD(const uint16_t *w)
{
    const __m512i u = _mm512_loadu_si512((const void *)w); /* lane i: w[2i] | w[2i+1] << 16 */
    return (WP){flush_tiny(_mm512_castsi512_ps(_mm512_slli_epi32(u, 16))),
                flush_tiny(_mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u))))};
}
AI5 V V_DP2(V acc, XP x, WP w)
{
    acc = flush_tiny(_mm512_fmadd_ps(x.o, w.o, acc));
    return flush_tiny(_mm512_fmadd_ps(x.e, w.e, acc));
}

#include "kernels/cpu/simd_body.inc"

/* kern_simd_ops.exp_shift: kern_exp_neg's operations on 8 doubles at a time (the tail scalar) */
static SIMD_TARGET void exp_shift_avx512(double *y, const float *l, double mx, int n)
{
    const __m512d shift = _mm512_set1_pd(KERN_EXP_SHIFT), vmx = _mm512_set1_pd(mx), lo = _mm512_set1_pd(KERN_EXP_NEG_MIN);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m512d x = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(l + i)), vmx);
        const __m512d kd = _mm512_fmadd_pd(x, _mm512_set1_pd(KERN_EXP_INV_LN2), shift);
        const __m512d k = _mm512_sub_pd(kd, shift);
        __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(KERN_EXP_LN2_HI), x);
        r = _mm512_fnmadd_pd(k, _mm512_set1_pd(KERN_EXP_LN2_LO), r);
        __m512d p = _mm512_set1_pd(kern_exp_neg_c[13]);
        for (int j = 12; j >= 0; j--) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kern_exp_neg_c[j]));
        const __m512i e = _mm512_slli_epi64(_mm512_add_epi64(_mm512_castpd_si512(kd), _mm512_set1_epi64(1023)), 52);
        const __m512d v = _mm512_mul_pd(p, _mm512_castsi512_pd(e));
        const __mmask8 keep = _mm512_cmp_pd_mask(x, lo, _CMP_NLT_UQ); /* x >= min, or NaN */
        _mm512_storeu_pd(y + i, _mm512_maskz_mov_pd(keep, v));
    }
    for (; i < n; i++) y[i] = kern_exp_neg((double)l[i] - mx);
}

/* the entries both AVX-512 tables share */
#define AVX512_ENTRIES                                                                             \
    .mm_cols = simd_mm_cols_avx512, .dot = simd_dot_avx512, .dots4x4 = simd_dots4x4_avx512,         \
    .axpys = simd_axpys_avx512, .scale = simd_scale_avx512, .exp_shift = exp_shift_avx512,          \
    .silu_mul = simd_silu_mul_avx512, .softmax16 = simd_softmax16_avx512,   \
    .div = simd_div_avx512, .mm_cl_rows_fp8 = KERN_CL_MIN_ROWS_AVX512_FP8

const kern_simd_ops kern_simd_avx512 = {
    .isa = KERN_ISA_AVX512,
    .name = "avx512",
    .mm_cols_bf16x = simd_mm_cols_bf16x_avx512, /* emulated */
    .mm_cols_amx = kern_mm_cols_amx_emul,
    AVX512_ENTRIES,
};

/* AVX-512 with the native bf16-pairs matmul (simd_avx512bf16.c) */
const kern_simd_ops kern_simd_avx512bf16 = {
    .isa = KERN_ISA_AVX512BF16,
    .name = "avx512bf16",
    .mm_cols_bf16x = kern_mm_cols_bf16x_native,
    .mm_cols_amx = kern_mm_cols_amx_emul,
    AVX512_ENTRIES,
};

#ifdef KERN_HAVE_AMX_BUILD
/* AVX512BF16 with the native "amx" matmul (matmul_amx.c) */
const kern_simd_ops kern_simd_amx = {
    .isa = KERN_ISA_AMX,
    .name = "amx",
    .mm_cols_bf16x = kern_mm_cols_bf16x_native,
    .mm_cols_amx = kern_mm_cols_amx_native,
    AVX512_ENTRIES,
};
#endif
#endif
