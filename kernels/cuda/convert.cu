/* kernels/cuda/convert.cu — dtype conversion on the device for weight loading (upload_convert):
 * F32, F16, BF16 in any direction, bit-identical to the host's mdl_convert (models/format/safetensors.c):
 * integer bit manipulation only, so no rounding mode or FTZ setting can change a result. */
#include "kernels/cuda/common.cuh"
extern "C" {
#include "models/format/safetensors.h"
}

__device__ __forceinline__ uint16_t cv_f32_to_bf16(uint32_t x)
{
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t qnan = (x >> 16) | 0x0040u;
    return (uint16_t)(((x & 0x7fffffffu) > 0x7f800000u) ? qnan : rounded);
}

/* f16 -> f32 bits, exact (subnormals via an exact float product, as the host does) */
__device__ __forceinline__ uint32_t cv_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    if (em >= 0x7c00u) return sign | (em << 13) | 0x7f800000u;
    if (em >= 0x0400u) return sign | ((em << 13) + 0x38000000u);
    return sign | __float_as_uint(__fmul_rn((float)(int)em, 0x1p-24f));
}

/* f32 -> f16, round to nearest even, subnormals, overflow to inf, NaN kept quiet */
__device__ __forceinline__ uint16_t cv_f32_to_f16(uint32_t x)
{
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (x < 0x38800000u) { /* f16 subnormal: scale by 2^24 (exact), round to nearest even */
        const float a = __fmul_rn(__uint_as_float(x), 16777216.0f);
        return (uint16_t)(sign | (uint16_t)__float2uint_rn(a));
    }
    x += 0xfffu + ((x >> 13) & 1u);
    return (uint16_t)(sign | ((x - 0x38000000u) >> 13));
}

/* element i of src as f32 bits */
__device__ __forceinline__ uint32_t cv_load(const void *src, int dt, size_t i)
{
    if (dt == MDL_DT_F32) return ((const uint32_t *)src)[i];
    const uint16_t h = ((const uint16_t *)src)[i];
    return dt == MDL_DT_BF16 ? (uint32_t)h << 16 : cv_f16_to_f32(h);
}

__global__ void __launch_bounds__(256) k_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const uint32_t x = cv_load(src, src_dt, i);
        if (dst_dt == MDL_DT_F32) ((uint32_t *)dst)[i] = x;
        else if (dst_dt == MDL_DT_BF16) ((uint16_t *)dst)[i] = cv_f32_to_bf16(x);
        else ((uint16_t *)dst)[i] = cv_f32_to_f16(x);
    }
}

static int convertible(int dt) { return dt == MDL_DT_F32 || dt == MDL_DT_F16 || dt == MDL_DT_BF16; }

/* The launch of a conversion between two different convertible dtypes (n > 0): launch(kernel, grid,
 * block, dynamic smem, arguments...). kern_cuda_convert enqueues it; tests/emu runs the same launch on
 * the CPU emulation (GS_CUDA_EMU). */
template <typename Launch>
__host__ void cv_launch(void *dst, int dst_dt, const void *src, int src_dt, size_t n, Launch &&launch)
{
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    launch(k_convert, dim3((unsigned)blocks), dim3(256), (size_t)0, dst, dst_dt, src, src_dt, n);
}

#ifndef GS_CUDA_EMU
extern "C" int kern_cuda_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n, cudaStream_t s)
{
    if (!convertible(dst_dt) || !convertible(src_dt)) return -1;
    if (n == 0) return 0;
    if (dst_dt == src_dt) {
        KC_CUDA(cudaMemcpyAsync(dst, src, n * (src_dt == MDL_DT_F32 ? 4u : 2u), cudaMemcpyDeviceToDevice, s));
        return 0;
    }
    cv_launch(dst, dst_dt, src, src_dt, n, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("convert");
    });
    return 0;
}
#endif
