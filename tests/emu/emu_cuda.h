/* tests/emu/emu_cuda.h — a CPU emulation of the CUDA device primitives, so that the real source of some
 * kernels in kernels/cuda/ compiles with g++ (-std=c++20, no nvcc, no CUDA headers) and runs in CI on
 * the CPU against the CPU kernels (tests/emu/test_emu_*.c). kernels/cuda/common.cuh includes this
 * header instead of the CUDA headers when GS_CUDA_EMU is defined; nothing else of the product changes.
 *
 * Why: the CUDA kernels are only run where a GPU is lent (rarely); logic and index bugs in them
 * (a wrong bound, a missing __syncthreads, a warp vote at a divergent point, a race on shared memory
 * between warps) should fail on every CI run instead.
 *
 * Model (runtime in emu_cuda.cpp): every CUDA thread of a block is a cooperative fiber on one OS thread.
 * A thread runs until it reaches a barrier (__syncthreads, __syncwarp, or a warp collective: every
 * __shfl_* / __ballot_sync / __match_any_sync / ... is a warp barrier plus an exchange), then yields
 * to a scheduler that picks what runs next at random (deterministic seed): a runnable thread, or a
 * warp whose 32 lanes all wait at the same collective (released together), or, when nothing else can
 * move, the block when all its threads wait at the same __syncthreads. Two schedules alternate by seed:
 * uniform random picks, and "run ahead" (random warp priorities, one warp races as far as it can
 * before the others move), which exposes missing __syncthreads between warps. Blocks of a grid run one
 * after another in a random order. Anything CUDA leaves undefined that the kernels could trip on
 * aborts with a message: lanes of a warp at different collectives or __syncwarp call sites, threads
 * at different __syncthreads call sites, threads exited while others wait at a barrier, a non-full
 * mask, a block whose size is not a multiple of 32.
 *
 * Limits: no memory-model fidelity (a thread's writes are visible to the others at once; fences are
 * no-ops; between barriers threads do not interleave at all, so races inside one barrier interval
 * are only exposed through the order in which whole intervals run); blocks never run concurrently;
 * warp-synchronous code that relies on lockstep execution without an explicit __syncwarp or
 * collective is not modelled (it runs as if fully independent); no inline PTX (the one tensor-core
 * instruction the kernels use, mma.sync m16n8k16 bf16 -> f32, is emulated from the PTX ISA: emu_mma.cpp;
 * its sums are exact-then-rounded, the hardware's may differ in the last bits), no textures, no
 * cooperative groups; only full-mask warp collectives; __shared__ variables are static
 * per kernel (thread_local: one OS thread runs all fibers) and are neither zeroed nor poisoned
 * between blocks; math functions are the C library's (CUDA's may differ by an ulp; nvcc's FMA
 * contraction is not reproduced). Not usable under ASan (fibers switch stacks).
 */
#ifndef GS_TESTS_EMU_CUDA_H
#define GS_TESTS_EMU_CUDA_H

#ifndef __cplusplus
#error "tests/emu/emu_cuda.h is C++ (the emulated .cu files are compiled by g++)"
#endif

#include <math.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers ---------------------------------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
/* One OS thread runs every fiber, so thread_local is shared by all threads of the block, and (unlike
 * static) it also takes `extern __shared__ T name[];` (dynamic shared memory: the test defines the
 * array with EMU_DYNAMIC_SHARED). */
#define __shared__ thread_local
#define __constant__ static

/* `extern __shared__ T name[];` of a kernel: the storage, at namespace scope of the including test.
 * Compile with -fno-extern-tls-init (g++ otherwise calls a TLS init function nothing defines). */
#define EMU_DYNAMIC_SHARED_BYTES (48 * 1024)
#define EMU_DYNAMIC_SHARED(T, name) alignas(16) thread_local T name[EMU_DYNAMIC_SHARED_BYTES / sizeof(T)]

/* ---- built-in variables ---------------------------------------------------------------------------- */
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
/* Set by the scheduler before it resumes a thread. */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

/* ---- host-side types named by common.cuh's host declarations (kc_die_*, kern_cuda_ctx, launchers):
 * opaque stand-ins, never used by emulated code ------------------------------------------------------ */
typedef enum emu_cuda_error { cudaSuccess = 0 } cudaError_t;
typedef int cublasStatus_t;
typedef struct emu_opaque_stream *cudaStream_t;
typedef struct emu_opaque_lt *cublasLtHandle_t;
typedef struct emu_opaque_desc *cublasLtMatmulDesc_t;
typedef struct emu_opaque_layout *cublasLtMatrixLayout_t;
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

/* ---- the runtime (emu_cuda.cpp) ---------------------------------------------------------------------- */
/* Prints the message with the current block / thread and aborts. */
[[noreturn]] void emu_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Barrier kinds a thread waits at. */
enum { EMU_WAIT_BLOCK = 1, EMU_WAIT_WARP = 2 };
/* Blocks the calling thread at a barrier (site: the call site, for the divergence checks). */
void emu_wait(int kind, const std::source_location &site);
/* Warp collective: publishes v for the calling lane, waits for the 32 lanes at the same call site,
 * returns the 32 values the lanes published (valid until the lane's next collective). */
const uint64_t *emu_warp_exchange(uint64_t v, const std::source_location &site);

inline void emu_full_mask(unsigned int mask, const std::source_location &site)
{
    if (mask != 0xffffffffu)
        emu_fatal("%s:%u: warp collective with mask %#x: only full masks are emulated", site.file_name(),
                  (unsigned)site.line(), mask);
}
inline int emu_lane() { return (int)(threadIdx.x & 31u); }

/* ---- barriers ------------------------------------------------------------------------------------------ */
inline void __syncthreads(const std::source_location site = std::source_location::current())
{
    emu_wait(EMU_WAIT_BLOCK, site);
}
inline void __syncwarp(unsigned int mask = 0xffffffffu,
                       const std::source_location site = std::source_location::current())
{
    emu_full_mask(mask, site);
    emu_wait(EMU_WAIT_WARP, site);
}
/* No memory model: a thread's writes are visible at once. */
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}

/* ---- warp collectives (full masks; widths dividing 32 for the shuffles) ------------------------------ */
template <typename T>
inline uint64_t emu_bits(T v)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffled values: at most 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}
template <typename T>
inline T emu_from_bits(uint64_t b)
{
    T v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}
inline void emu_width(int width, const std::source_location &site)
{
    if (width <= 0 || width > 32 || (width & (width - 1)))
        emu_fatal("%s:%u: shuffle width %d", site.file_name(), (unsigned)site.line(), width);
}

template <typename T>
inline T __shfl_sync(unsigned int mask, T v, int src, int width = 32,
                     const std::source_location site = std::source_location::current())
{
    emu_full_mask(mask, site);
    emu_width(width, site);
    const uint64_t *all = emu_warp_exchange(emu_bits(v), site);
    const int lane = emu_lane(), base = lane & ~(width - 1);
    return emu_from_bits<T>(all[base + (src & (width - 1))]);
}
template <typename T>
inline T __shfl_up_sync(unsigned int mask, T v, unsigned int delta, int width = 32,
                        const std::source_location site = std::source_location::current())
{
    emu_full_mask(mask, site);
    emu_width(width, site);
    const uint64_t *all = emu_warp_exchange(emu_bits(v), site);
    const int lane = emu_lane(), sub = lane & (width - 1);
    return emu_from_bits<T>(all[(int)delta <= sub ? lane - (int)delta : lane]);
}
template <typename T>
inline T __shfl_down_sync(unsigned int mask, T v, unsigned int delta, int width = 32,
                          const std::source_location site = std::source_location::current())
{
    emu_full_mask(mask, site);
    emu_width(width, site);
    const uint64_t *all = emu_warp_exchange(emu_bits(v), site);
    const int lane = emu_lane(), sub = lane & (width - 1);
    return emu_from_bits<T>(all[sub + (int)delta < width ? lane + (int)delta : lane]);
}
template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = 32,
                         const std::source_location site = std::source_location::current())
{
    emu_full_mask(mask, site);
    emu_width(width, site);
    const uint64_t *all = emu_warp_exchange(emu_bits(v), site);
    const int lane = emu_lane(), src = lane ^ (lane_mask & 31);
    /* CUDA: a lane may read earlier width groups; a source in a later group gives the lane's own value */
    return emu_from_bits<T>(all[src < (lane & ~(width - 1)) + width ? src : lane]);
}
inline unsigned int __ballot_sync(unsigned int mask, int pred,
                                  const std::source_location site = std::source_location::current())
{
    emu_full_mask(mask, site);
    const uint64_t *all = emu_warp_exchange(pred != 0, site);
    unsigned int r = 0;
    for (int k = 0; k < 32; k++) r |= (unsigned int)(all[k] != 0) << k;
    return r;
}
inline int __all_sync(unsigned int mask, int pred, const std::source_location site = std::source_location::current())
{
    return __ballot_sync(mask, pred, site) == 0xffffffffu;
}
inline int __any_sync(unsigned int mask, int pred, const std::source_location site = std::source_location::current())
{
    return __ballot_sync(mask, pred, site) != 0u;
}
template <typename T>
inline unsigned int __match_any_sync(unsigned int mask, T v,
                                     const std::source_location site = std::source_location::current())
{
    emu_full_mask(mask, site);
    const uint64_t mine = emu_bits(v);
    const uint64_t *all = emu_warp_exchange(mine, site);
    unsigned int r = 0;
    for (int k = 0; k < 32; k++) r |= (unsigned int)(all[k] == mine) << k;
    return r;
}
template <typename T>
inline T __reduce_add_sync(unsigned int mask, T v, const std::source_location site = std::source_location::current())
{
    static_assert(std::is_integral_v<T>, "__reduce_*_sync: integers");
    emu_full_mask(mask, site);
    const uint64_t *all = emu_warp_exchange(emu_bits(v), site);
    T s = 0;
    for (int k = 0; k < 32; k++) s += emu_from_bits<T>(all[k]);
    return s;
}

/* Warp collective with a computation, for instructions whose result mixes every lane's registers (the
 * tensor-core mma.sync): the lane publishes `bytes` (<= EMU_WARP_DATA_BYTES) from `in` and waits for the
 * 32 lanes at the same call site; when the warp is released, fn(ins, outs) runs once (ins[l] / outs[l]:
 * lane l's data), and the lane gets its outs[lane] (valid until its next collective). */
#define EMU_WARP_DATA_BYTES 64
typedef void (*emu_warp_fn)(const unsigned char (*ins)[EMU_WARP_DATA_BYTES],
                            unsigned char (*outs)[EMU_WARP_DATA_BYTES]);
const unsigned char *emu_warp_compute(const void *in, size_t bytes, emu_warp_fn fn, const std::source_location &site);

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3} with the
 * accumulator in place (c = d on entry, as an asm "+f" operand): D = A (16 x 16) * B (16 x 8) + C over
 * the warp, each lane holding the fragments the PTX ISA assigns to it (emu_mma.cpp). A warp collective:
 * all 32 lanes, same call site. */
void emu_mma_m16n8k16_bf16_f32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                               uint32_t b1, const std::source_location site = std::source_location::current());

/* ---- integer intrinsics -------------------------------------------------------------------------------- */
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffs(unsigned int x) { return __builtin_ffs((int)x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned int)x) : 32; }
inline int __clz(unsigned int x) { return x ? __builtin_clz(x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline unsigned int __brev(unsigned int x)
{
    unsigned int r = 0;
    for (int k = 0; k < 32; k++) r |= ((x >> k) & 1u) << (31 - k);
    return r;
}

/* ---- bit casts ------------------------------------------------------------------------------------------ */
inline unsigned int __float_as_uint(float f) { return std::bit_cast<unsigned int>(f); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __uint_as_float(unsigned int u) { return std::bit_cast<float>(u); }
inline float __int_as_float(int u) { return std::bit_cast<float>(u); }
inline long long __double_as_longlong(double d) { return std::bit_cast<long long>(d); }
inline double __longlong_as_double(long long u) { return std::bit_cast<double>(u); }

/* ---- loads ------------------------------------------------------------------------------------------ */
template <typename T>
inline T __ldg(const T *p)
{
    return *p;
}

/* ---- vector types (the CUDA alignments: a float4 / uint4 load is one 16-byte access on the device) ------ */
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }

/* ---- bf16 (cuda_bf16.h): the storage types and the conversions the kernels use ----------------------- */
struct __nv_bfloat16 {
    unsigned short __x;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y; /* x in the low 16 bits of the 32-bit word */
};
/* f32 -> bf16, round to nearest, ties to even (cvt.rn.bf16.f32); a NaN gives the canonical NaN 0x7fff
 * (cuda_bf16.hpp's host path; the kernels never convert a NaN). Overflow rounds to inf. */
inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    const uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(unsigned short)0x7fffu};
    return __nv_bfloat16{(unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 h) { return std::bit_cast<float>((uint32_t)h.__x << 16); }
/* (a, b) -> {rn(a), rn(b)}: a in .x (the low half) */
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
    return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{__bfloat162float(h.x), __bfloat162float(h.y)}; }

/* ---- IEEE round-to-nearest arithmetic intrinsics (never contracted into an FMA: the project builds
 * with -ffp-contract=off) ------------------------------------------------------------------------------ */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
/* float -> unsigned, round to nearest even, saturating (NaN -> 0) */
inline unsigned int __float2uint_rn(float x)
{
    if (!(x > 0.0f)) return 0u;
    if (x >= 4294967296.0f) return 0xffffffffu;
    return (unsigned int)std::nearbyint((double)x); /* exact in double; the default rounding mode is nearest even */
}

/* ---- math: the C library (fast-math intrinsics as their exact counterparts) -------------------------- */
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }

/* ---- atomics: fibers switch only at barriers, so a plain read-modify-write is atomic ------------------ */
template <typename T>
inline T atomicAdd(T *p, T v)
{
    const T old = *p;
    *p = old + v;
    return old;
}
template <typename T>
inline T atomicSub(T *p, T v)
{
    const T old = *p;
    *p = old - v;
    return old;
}
template <typename T>
inline T atomicMax(T *p, T v)
{
    const T old = *p;
    *p = v > old ? v : old;
    return old;
}
template <typename T>
inline T atomicMin(T *p, T v)
{
    const T old = *p;
    *p = v < old ? v : old;
    return old;
}
template <typename T>
inline T atomicExch(T *p, T v)
{
    const T old = *p;
    *p = v;
    return old;
}
template <typename T>
inline T atomicCAS(T *p, T compare, T v)
{
    const T old = *p;
    if (old == compare) *p = v;
    return old;
}
template <typename T>
inline T atomicOr(T *p, T v)
{
    const T old = *p;
    *p = old | v;
    return old;
}
template <typename T>
inline T atomicAnd(T *p, T v)
{
    const T old = *p;
    *p = old & v;
    return old;
}

/* ---- the launcher ------------------------------------------------------------------------------------ */
struct emu_config {
    uint64_t seed; /* the schedule: blocks' order and every pick (run ahead when odd, uniform when even) */
};
/* Runs body() as every thread of every block of grid x block (the built-in variables set), under the
 * schedule of cfg. smem: the launch's dynamic shared bytes (at most EMU_DYNAMIC_SHARED_BYTES). */
void emu_run_grid(dim3 grid, dim3 block, size_t smem, const emu_config &cfg, void (*body)(void *), void *ctx);

/* kernel<<<grid, block, smem>>>(args...) with the same argument conversions as a real launch. */
template <typename... P, typename... A>
void emu_launch(const emu_config &cfg, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
    struct call {
        void (*k)(P...);
        std::tuple<P...> a;
    } c{kernel, std::tuple<P...>(static_cast<P>(std::forward<A>(args))...)};
    emu_run_grid(grid, block, smem, cfg, [](void *p) { std::apply(static_cast<call *>(p)->k, static_cast<call *>(p)->a); },
                 &c);
}

#endif
