/* kernels/cpu/simd_t8x16.h — the column-lane GEMM's transposing store (simd_body.inc simd_mm_cl) in
 * 256-bit registers, shared by the AVX2 and AVX-512 builds; the includer defines SIMD_TARGET (with
 * avx2) first and includes <immintrin.h>. */
#ifndef GS_SIMD_T8X16_H
#define GS_SIMD_T8X16_H

/* 8 x 8 floats: row i of the result is column i of r[0..7] */
static inline __attribute__((always_inline, unused)) SIMD_TARGET void t8x8(__m256 r[8])
{
    __m256 t[8], u[8];
    SIMD_UNROLL for (int i = 0; i < 4; i++)
    {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);     /* r0[0] r1[0] r0[1] r1[1] | [4] [5] */
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]); /* [2] [3] | [6] [7] */
    }
    SIMD_UNROLL for (int h = 0; h < 2; h++) /* rows 4h .. 4h+3: columns 0..3 | 4..7 of them */
    {
        u[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    SIMD_UNROLL for (int i = 0; i < 4; i++)
    {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}
/* d[l * ld + r] = t[r * 16 + l] for r < 8, l < 16: two 8 x 8 transposes */
static inline __attribute__((always_inline, unused)) SIMD_TARGET void V_T8X16_STORE(float *d, size_t ld, const float *t)
{
    SIMD_UNROLL for (int lb = 0; lb < 16; lb += 8)
    {
        __m256 r[8];
        SIMD_UNROLL for (int i = 0; i < 8; i++) r[i] = _mm256_load_ps(t + i * 16 + lb);
        t8x8(r);
        SIMD_UNROLL for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + (size_t)(lb + i) * ld, r[i]);
    }
}

#endif
