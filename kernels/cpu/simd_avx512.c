/* kernels/cpu/simd_avx512.c — AVX-512 instantiation of simd_body.inc (one zmm = the 16 lanes).
 * Compiled for any target; only called after kern_simd() saw avx512f at run time. */
#include "kernels/cpu/kern_cpu.h"

#ifdef KERN_HAVE_X86
#include <immintrin.h>

#define SIMD_TARGET __attribute__((target("avx512f,avx2,fma")))
#define SIMD_SFX(name) name##_avx512
#define V __m512
/* 32 zmm registers: a 4x6 tile holds 24 accumulators + 4 x vectors + the weight in flight. */
#define MM_MR_MAX 4
#define MM_NR_ONE 8
#define MM_NR_MULTI 6
#define MM_NR_MAX 8

static inline __attribute__((always_inline)) SIMD_TARGET V V_ZERO(void) { return _mm512_setzero_ps(); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_LOAD(const float *p) { return _mm512_loadu_ps(p); }
/* bf16 -> f32 is the 16-bit pattern moved to the high half: zero-extend to 32 bits, shift left. */
static inline __attribute__((always_inline)) SIMD_TARGET V V_LOADBF(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline __attribute__((always_inline)) SIMD_TARGET void V_STORE(float *p, V v) { _mm512_storeu_ps(p, v); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_SET1(float f) { return _mm512_set1_ps(f); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_ADD(V a, V b) { return _mm512_add_ps(a, b); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_MUL(V a, V b) { return _mm512_mul_ps(a, b); }
static inline __attribute__((always_inline)) SIMD_TARGET V V_FMA(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
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

#include "kernels/cpu/simd_body.inc"

const kern_simd_ops kern_simd_avx512 = {
    .isa = KERN_ISA_AVX512,
    .name = "avx512",
    .mm_cols = simd_mm_cols_avx512,
    .dot = simd_dot_avx512,
    .axpy = simd_axpy_avx512,
    .scale = simd_scale_avx512,
};
#endif
