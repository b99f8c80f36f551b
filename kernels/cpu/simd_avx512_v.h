/* kernels/cpu/simd_avx512_v.h — the 16-lane vector of the AVX-512 builds (one zmm), shared by
 * simd_avx512.c and simd_avx512bf16.c; the includer defines SIMD_TARGET and SIMD_SFX first. */
#ifndef GS_SIMD_AVX512_V_H
#define GS_SIMD_AVX512_V_H

#include <immintrin.h>

#define V __m512
/* 32 zmm registers: a 4x6 tile holds 24 accumulators + 4 x vectors + the weight in flight. */
#define MM_MR_MAX 4
#define MM_NR_ONE 8
#define MM_NR_MULTI 6
#define MM_NR_MAX 8
/* FP8 weights from KERN_CL_MIN_ROWS_AVX512_FP8 rows (f32 activations): the column-lane GEMM
 * (simd_body.inc simd_mm_cl), which decodes each weight once per op window for every row, not once
 * per 4-row register tile. Zen 4, 2 threads, bench gemv (125M projections from DRAM), 2 alternated
 * runs, ms: FP8 32 rows level, 48 rows 53.8 -> 42.7, 128 rows 140 -> 109; bench prefill 512 FP8
 * 860 -> 1090 tok/s. f32 and bf16 weights stay on the tiles (the pack's cost is not repaid there:
 * 16 rows bf16 13.2 -> 19.7 ms, 128 rows 106 -> 119; prefill 512 level). */
#define MM_CL_ROWS KERN_CL_ROWS
#define KERN_CL_MIN_ROWS_AVX512_FP8 40

static inline __attribute__((always_inline)) SIMD_TARGET V V_ZERO(void) { return _mm512_setzero_ps(); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_LOAD(const float *p) { return _mm512_loadu_ps(p); }
/* bf16 -> f32 is the 16-bit pattern moved to the high half: zero-extend to 32 bits, shift left. */
static inline __attribute__((always_inline)) SIMD_TARGET V V_LOADBF(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* 16 e4m3 codes as kern_fp8_raw: sign-extended to 32 bits and shifted left 20 (the sign fills bits
 * 27..31), then bits 27..30 cleared */
static inline __attribute__((always_inline)) SIMD_TARGET V V_LOADF8(const uint8_t *p)
{
    const __m512i c = _mm512_slli_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)), 20);
    return _mm512_castsi512_ps(_mm512_and_si512(c, _mm512_set1_epi32((int)0x87f00000u)));
}
#define VS __m512
static inline __attribute__((always_inline)) SIMD_TARGET VS VS_SET1(float f) { return _mm512_set1_ps(f); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_MULS(V a, VS s) { return _mm512_mul_ps(a, s); }
static inline __attribute__((always_inline)) SIMD_TARGET void V_STORE(float *p, V v) { _mm512_storeu_ps(p, v); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_SET1(float f) { return _mm512_set1_ps(f); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_ADD(V a, V b) { return _mm512_add_ps(a, b); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_MUL(V a, V b) { return _mm512_mul_ps(a, b); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_FMA(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_SUB(V a, V b) { return _mm512_sub_ps(a, b); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_DIV(V a, V b) { return _mm512_div_ps(a, b); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_MIN(V a, V b) { return _mm512_min_ps(a, b); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_MAX(V a, V b) { return _mm512_max_ps(a, b); }
/* kern_expf_scale lane-wise */
static inline __attribute__((always_inline)) SIMD_TARGET V V_EXPF_SCALE(V p, V kd)
{
    const __m512i k = _mm512_sub_epi32(_mm512_castps_si512(kd), _mm512_set1_epi32(KERN_EXPF_SHIFT_BITS));
    const __m512i k1 = _mm512_srai_epi32(k, 1), k2 = _mm512_sub_epi32(k, k1), b = _mm512_set1_epi32(127);
    const V s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, b), 23));
    const V s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, b), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}
/* lane-wise a < b ? x : y */
static inline __attribute__((always_inline)) SIMD_TARGET V V_SELECT_LT(V a, V b, V x, V y)
{
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
}
/* y, with x + x in the lanes where x is NaN */
static inline __attribute__((always_inline)) SIMD_TARGET V V_NANPASS(V y, V x)
{
    return _mm512_mask_add_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, x);
}
static inline __attribute__((always_inline)) SIMD_TARGET float V_HSUM(V v)
{
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);                                                   /* i + i+8 */
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); /* + i+4 */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                 /* + i+2 */
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));                             /* + i+1 */
    return _mm_cvtss_f32(s1);
}

/* out[j] = V_HSUM(a[j]) for 16 accumulators at once: the same tree and the same adds, on vectors
 * that each carry pieces of several accumulators (u0..u3 are 128-bit units):
 *   level 1  P_i = [a2i.u0 a2i.u1 a2i+1.u0 a2i+1.u1] + [a2i.u2 a2i.u3 a2i+1.u2 a2i+1.u3]
 *            = [s8 of a[2i] | s8 of a[2i+1]]                                          (8 vectors)
 *   level 2  R_i from (P_2i, P_2i+1): unit u = s4 of a[4i + u]                        (4 vectors)
 *   level 3  T_i from (R_2i, R_2i+1): unit u = [s2 of a[8i+u] (2 lanes), s2 of a[8i+4+u]] (2)
 *   level 4  Z from (T_0, T_1): unit u = final sums of a[u], a[u+4], a[u+8], a[u+12]
 * so lane 4u + v of Z is the sum of a[u + 4v]; one permute puts them in order. */
#define HSUM_ADD2(op, a, b, i0, i1) _mm512_add_ps(op((a), (b), (i0)), op((a), (b), (i1)))
static inline __attribute__((always_inline)) SIMD_TARGET void V_HSUM16_STORE(float *out, const V *a)
{
    V p[8], r[4], t[2];
    SIMD_UNROLL for (int i = 0; i < 8; i++) p[i] = HSUM_ADD2(_mm512_shuffle_f32x4, a[2 * i], a[2 * i + 1], 0x44, 0xEE);
    SIMD_UNROLL for (int i = 0; i < 4; i++) r[i] = HSUM_ADD2(_mm512_shuffle_f32x4, p[2 * i], p[2 * i + 1], 0x88, 0xDD);
    SIMD_UNROLL for (int i = 0; i < 2; i++)
        t[i] = HSUM_ADD2(_mm512_shuffle_ps, r[2 * i], r[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0), _MM_SHUFFLE(3, 2, 3, 2));
    V z = HSUM_ADD2(_mm512_shuffle_ps, t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0), _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, z));
}

#include "kernels/cpu/simd_t8x16.h"

#endif
