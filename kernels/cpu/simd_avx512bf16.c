/* kernels/cpu/simd_avx512bf16.c — the native bf16-pairs matmul (kern_cpu.h): vcvtne2ps2bf16 rounds
 * 32 activations, vdpbf16ps adds 16 lanes x 2 products per instruction, twice the f32 FMA's rate.
 * Only the mode-2 entry of simd_body.inc is instantiated here; the avx512bf16 table (simd_avx512.c)
 * takes every other entry from AVX-512. Only called after kern_simd() saw avx512bf16 at run time. */
#include "kernels/cpu/kern_cpu.h"

#ifdef KERN_HAVE_X86
#define SIMD_TARGET __attribute__((target("avx512f,avx512bf16,avx2,fma")))
#define SIMD_SFX(name) name##_avx512bf16
#include "kernels/cpu/simd_avx512_v.h"

#define XP __m512bh
#define WP __m512bh
#define AIB static inline __attribute__((always_inline)) SIMD_TARGET
/* bf16[j] = x[j] for j < 32: the second operand fills the low half */
AIB WP WP_LOAD(const uint16_t *w) { return (WP)_mm512_loadu_si512((const void *)w); }
AIB V V_DP2(V acc, XP x, WP w) { return _mm512_dpbf16_ps(acc, x, w); }
AIB WP WP_FROM_F32(V a, V b) { return _mm512_cvtne2ps_pbh(b, a); }

#define XB_ROUND32(d, x) _mm512_storeu_si512((void *)(d), (__m512i)XP_LOAD(x))
#define SIMD_MM_BF16X_ONLY
#include "kernels/cpu/simd_body.inc"

/* the entry of the kern_simd_avx512bf16 table (simd_avx512.c, next to the AVX-512 entries it shares) */
void kern_mm_cols_bf16x_native(const kern_mm_args *a, int n0, int n1) { simd_mm_cols_bf16x_avx512bf16(a, n0, n1); }
#endif
