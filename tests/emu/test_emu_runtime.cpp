/* tests/emu/test_emu_runtime.cpp — the CUDA emulation itself (emu_cuda.h / emu_cuda.cpp), on small
 * kernels written here: built-in variables over a 3-D grid, the warp collectives against their CUDA
 * definitions (full masks, widths), shared memory per block, that the schedules really differ (a
 * kernel with a missing __syncthreads gives another answer under some seed), the bf16 conversions
 * (round to nearest even) and the emulated mma.sync m16n8k16 (fragments loaded by the PTX ISA's layout,
 * D = A * B + C rounded once), and that divergent or deadlocked barrier use aborts with a message (in a
 * forked child).
 *
 * Why: test_emu_sample / test_emu_spec trust the emulation to be CUDA's semantics and to expose
 * schedule-dependent results; this pins both down. Limits: those of the emulation (emu_cuda.h). */
#include "tests/emu/emu_cuda.h"

#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

extern "C" {
#include <cmocka.h>
}

/* ---- built-in variables ------------------------------------------------------------------------------ */
__global__ void k_ids(unsigned *out)
{
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned nt = blockDim.x * blockDim.y * blockDim.z;
    out[b * nt + t] += 1u + (b << 16) + t; /* each thread exactly once */
}

static void test_indices(void **state)
{
    (void)state;
    const dim3 grid(3, 2, 2), block(8, 4, 2);
    const unsigned nb = 12, nt = 64;
    std::vector<unsigned> out(nb * nt, 0u);
    emu_launch(emu_config{7}, k_ids, grid, block, 0, out.data());
    for (unsigned b = 0; b < nb; b++)
        for (unsigned t = 0; t < nt; t++) assert_int_equal(out[b * nt + t], 1u + (b << 16) + t);
}

/* ---- warp collectives ---------------------------------------------------------------------------------- */
enum { NQ = 24 };
__global__ void k_warp(const int *in, int *out)
{
    const int t = (int)threadIdx.x, lane = t & 31;
    const int v = in[t];
    int *o = out + t * NQ;
    o[0] = __shfl_xor_sync(0xffffffffu, v, 1);
    o[1] = __shfl_xor_sync(0xffffffffu, v, 16);
    o[2] = __shfl_xor_sync(0xffffffffu, v, 5, 8); /* 5 ^ lane may leave the 8-lane group */
    o[3] = __shfl_up_sync(0xffffffffu, v, 1);
    o[4] = __shfl_up_sync(0xffffffffu, v, 5);
    o[5] = __shfl_up_sync(0xffffffffu, v, 3, 16);
    o[6] = __shfl_down_sync(0xffffffffu, v, 1);
    o[7] = __shfl_down_sync(0xffffffffu, v, 7);
    o[8] = __shfl_down_sync(0xffffffffu, v, 2, 4);
    o[9] = __shfl_sync(0xffffffffu, v, 0);
    o[10] = __shfl_sync(0xffffffffu, v, 31 - lane);
    o[11] = __shfl_sync(0xffffffffu, v, lane + 35); /* modulo 32 */
    o[12] = __shfl_sync(0xffffffffu, v, 3, 8);
    o[13] = (int)__ballot_sync(0xffffffffu, v % 3 == 0);
    o[14] = (int)__match_any_sync(0xffffffffu, v % 5);
    o[15] = __all_sync(0xffffffffu, v >= 0);
    o[16] = __any_sync(0xffffffffu, v == 1000);
    o[17] = __reduce_add_sync(0xffffffffu, v);
    const double d = __shfl_xor_sync(0xffffffffu, (double)v + 0.25, 2); /* 8-byte values */
    o[18] = (int)(d * 4.0);
    unsigned long long u = (unsigned long long)v << 33;
    u = __shfl_sync(0xffffffffu, u, 7);
    o[19] = (int)(u >> 33);
    o[20] = __popc((unsigned)v) + 100 * __ffs(v) + 10000 * __clz(v);
    __syncwarp();
    o[21] = lane;
    o[22] = (int)(threadIdx.x >> 5);
    o[23] = 0;
}

static void test_warp_collectives(void **state)
{
    (void)state;
    const int NT = 64;
    std::vector<int> in(NT), out((size_t)NT * NQ, -1);
    uint64_t s = 12345;
    for (int t = 0; t < NT; t++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        in[t] = (int)((s >> 40) % 997);
    }
    for (uint64_t seed = 0; seed < 4; seed++) {
        emu_launch(emu_config{seed}, k_warp, dim3(1), dim3(NT), 0, in.data(), out.data());
        for (int t = 0; t < NT; t++) {
            const int lane = t & 31, w0 = t & ~31;
            const int *o = &out[(size_t)t * NQ];
            auto at = [&](int l) { return in[w0 + l]; };
            int e[NQ];
            e[0] = at(lane ^ 1);
            e[1] = at(lane ^ 16);
            e[2] = (lane ^ 5) < (lane & ~7) + 8 ? at(lane ^ 5) : at(lane);
            e[3] = lane >= 1 ? at(lane - 1) : at(lane);
            e[4] = lane >= 5 ? at(lane - 5) : at(lane);
            e[5] = (lane & 15) >= 3 ? at(lane - 3) : at(lane);
            e[6] = lane + 1 < 32 ? at(lane + 1) : at(lane);
            e[7] = lane + 7 < 32 ? at(lane + 7) : at(lane);
            e[8] = (lane & 3) + 2 < 4 ? at(lane + 2) : at(lane);
            e[9] = at(0);
            e[10] = at(31 - lane);
            e[11] = at((lane + 35) & 31);
            e[12] = at((lane & ~7) + 3);
            unsigned ballot = 0, match = 0, all = 1, any = 0;
            int sum = 0;
            for (int l = 0; l < 32; l++) {
                ballot |= (unsigned)(at(l) % 3 == 0) << l;
                match |= (unsigned)(at(l) % 5 == at(lane) % 5) << l;
                all &= at(l) >= 0;
                any |= at(l) == 1000;
                sum += at(l);
            }
            e[13] = (int)ballot;
            e[14] = (int)match;
            e[15] = (int)all;
            e[16] = (int)any;
            e[17] = sum;
            e[18] = at(lane ^ 2) * 4 + 1;
            e[19] = at(7);
            const unsigned v = (unsigned)at(lane);
            e[20] = __builtin_popcount(v) + 100 * __builtin_ffs((int)v) + 10000 * (v ? __builtin_clz(v) : 32);
            e[21] = lane;
            e[22] = t >> 5;
            e[23] = 0;
            for (int q = 0; q < NQ; q++)
                if (o[q] != e[q]) fail_msg("seed %llu thread %d query %d: %d, expected %d", (unsigned long long)seed, t, q, o[q], e[q]);
        }
    }
}

/* ---- shared memory and schedules ------------------------------------------------------------------------ */
/* Per block: every thread adds its value into a warp slot (lane 0 first clears it), then thread 0
 * sums the slots. With `racy`, the __syncthreads between the clear and the adds is missing, and the
 * one before the final sum too: the answer depends on the schedule. */
__global__ void k_block_sum(const int *in, int *out, int racy)
{
    __shared__ int slot[8];
    const int t = (int)threadIdx.x, w = t >> 5, lane = t & 31;
    const int v = in[blockIdx.x * blockDim.x + t];
    if (lane == 0) slot[w] = 0;
    if (!racy) __syncthreads();
    int s = v;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) slot[w] += s;
    if (!racy) __syncthreads();
    if (t == 0) {
        int tot = 0;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++) tot += slot[k];
        out[blockIdx.x] = tot;
    }
    __syncthreads();
}

static void test_schedules(void **state)
{
    (void)state;
    const int NB = 3, NT = 256;
    std::vector<int> in((size_t)NB * NT);
    for (size_t i = 0; i < in.size(); i++) in[i] = (int)(i % 13) + 1;
    std::vector<int> want(NB, 0);
    for (int b = 0; b < NB; b++)
        for (int t = 0; t < NT; t++) want[b] += in[(size_t)b * NT + t];
    int wrong = 0;
    std::vector<std::vector<int>> seen;
    for (uint64_t seed = 0; seed < 16; seed++) {
        std::vector<int> out(NB, -1), racy(NB, -1);
        emu_launch(emu_config{seed}, k_block_sum, dim3(NB), dim3(NT), 0, in.data(), out.data(), 0);
        for (int b = 0; b < NB; b++) assert_int_equal(out[b], want[b]);
        emu_launch(emu_config{seed}, k_block_sum, dim3(NB), dim3(NT), 0, in.data(), racy.data(), 1);
        wrong += racy != want;
        bool is_new = true;
        for (const auto &v : seen) is_new = is_new && v != racy;
        if (is_new) seen.push_back(racy);
    }
    printf("racy block sum: %d of 16 schedules wrong, %zu different answers\n", wrong, seen.size());
    assert_true(wrong > 0 && seen.size() >= 4); /* the schedules differ from seed to seed */
}

/* ---- bf16 conversions (cuda_bf16.h), round-to-nearest intrinsics -------------------------------------- */
static unsigned short bf16_bits(float f) { return __float2bfloat16_rn(f).__x; }
static float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

static void test_bf16_intrinsics(void **state)
{
    (void)state;
    assert_int_equal(bf16_bits(1.0f), 0x3f80);
    assert_int_equal(bf16_bits(-0.0f), 0x8000);
    assert_int_equal(bf16_bits(from_bits(0x3f808000u)), 0x3f80); /* tie, even below */
    assert_int_equal(bf16_bits(from_bits(0x3f818000u)), 0x3f82); /* tie, odd below: up */
    assert_int_equal(bf16_bits(from_bits(0x3f808001u)), 0x3f81);
    assert_int_equal(bf16_bits(from_bits(0x3f807fffu)), 0x3f80);
    assert_int_equal(bf16_bits(from_bits(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    assert_int_equal(bf16_bits(from_bits(0xff800000u)), 0xff80);
    assert_int_equal(bf16_bits(from_bits(0x00008000u)), 0x0000); /* subnormal tie to even */
    assert_int_equal(bf16_bits(from_bits(0x00018000u)), 0x0002);
    assert_int_equal(bf16_bits(from_bits(0x7fc00001u)), 0x7fff); /* NaN: canonical */
    assert_int_equal(bf16_bits(from_bits(0xff800001u)), 0x7fff);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 100000; i++) { /* round to nearest even on random non-NaN bits */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const uint32_t u = (uint32_t)x;
        if ((u & 0x7fffffffu) > 0x7f800000u) continue;
        const float f = from_bits(u), back = from_bits((uint32_t)bf16_bits(f) << 16);
        /* the nearest bf16 (ties even): no other bf16 neighbour is closer */
        const uint32_t h = bf16_bits(f);
        if ((h & 0x7fffu) == 0x7f80u) continue; /* overflow to inf, checked above */
        const float up = from_bits((uint32_t)(h + 1) << 16), dn = from_bits((uint32_t)(h - 1) << 16);
        const double e = fabs((double)back - f);
        if ((h & 0x7fffu) != 0x7f7fu) assert_true(e <= fabs((double)up - f));
        if ((h & 0x7fffu) != 0) assert_true(e <= fabs((double)dn - f));
        if (e == fabs((double)up - f) || ((h & 0x7fffu) != 0 && e == fabs((double)dn - f))) assert_int_equal(h & 1u, 0);
    }
    const __nv_bfloat162 p = __floats2bfloat162_rn(1.0f, -2.0f);
    uint32_t w;
    std::memcpy(&w, &p, 4);
    assert_int_equal(w, 0xc0003f80u); /* a in the low half */
    const float2 q = __bfloat1622float2(p);
    assert_true(q.x == 1.0f && q.y == -2.0f);
    assert_int_equal(__float2uint_rn(2.5f), 2u);
    assert_int_equal(__float2uint_rn(3.5f), 4u);
    assert_int_equal(__float2uint_rn(0.49999997f), 0u);
    assert_int_equal(__float2uint_rn(-1.0f), 0u);
    assert_int_equal(__float2uint_rn(NAN), 0u);
    assert_int_equal(__float2uint_rn(1e10f), 0xffffffffu);
}

/* ---- the emulated mma.sync m16n8k16 bf16 (emu_mma.cpp) ---------------------------------------------------
 * Each warp loads A (16 x 16), B (16 x 8), C (16 x 8) of its own into the fragment registers by the PTX
 * ISA's layout (written out again here, a transcription check of emu_mma.cpp), runs the instruction and
 * stores D by the accumulator layout; D must be A * B + C. */
static uint32_t pack_bf16(float lo, float hi) { return (uint32_t)bf16_bits(lo) | ((uint32_t)bf16_bits(hi) << 16); }

__global__ void k_mma(const float *A, const float *B, const float *C, float *D)
{
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    A += warp * 256;
    B += warp * 128;
    C += warp * 128;
    D += warp * 128;
    /* A: reg 0 = (g, 2t..2t+1), reg 1 = (g + 8, 2t..), reg 2 = (g, 2t + 8..), reg 3 = (g + 8, 2t + 8..) */
    const uint32_t a0 = pack_bf16(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]);
    const uint32_t a1 = pack_bf16(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]);
    const uint32_t a2 = pack_bf16(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]);
    const uint32_t a3 = pack_bf16(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9]);
    /* B (row k, column n = g): reg 0 = k 2t..2t+1, reg 1 = k 2t + 8.. */
    const uint32_t b0 = pack_bf16(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]);
    const uint32_t b1 = pack_bf16(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g]);
    /* C / D: c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..) */
    float d[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    emu_mma_m16n8k16_bf16_f32(d, a0, a1, a2, a3, b0, b1);
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

static void test_mma(void **state)
{
    (void)state;
    const int W = 2;
    std::vector<float> A(W * 256), B(W * 128), C(W * 128), D(W * 128, -1.0f);
    for (int w = 0; w < W; w++) { /* small integers: every sum exact */
        for (int i = 0; i < 256; i++) A[w * 256 + i] = (float)((i * 7 + w * 3) % 11 - 5);
        for (int i = 0; i < 128; i++) B[w * 128 + i] = (float)((i * 5 + w) % 9 - 4);
        for (int i = 0; i < 128; i++) C[w * 128 + i] = (float)(i % 13 - 6) * 0.5f;
    }
    /* rounded once: row 0 column 0 of warp 1 sums 1 + 16 products of 2^-12 * 2^-12 = 1 + 2^-20 (exact in
     * f32; accumulating in f32 from c = 1 one product at a time would lose each 2^-24) */
    for (int k = 0; k < 16; k++) {
        A[256 + k] = 0x1p-12f;
        B[128 + k * 8] = 0x1p-12f;
    }
    C[128] = 1.0f;
    emu_launch(emu_config{3}, k_mma, dim3(1), dim3(32 * W), 0, A.data(), B.data(), C.data(), D.data());
    for (int w = 0; w < W; w++)
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) {
                double s = C[w * 128 + m * 8 + n];
                for (int k = 0; k < 16; k++) s += (double)A[w * 256 + m * 16 + k] * B[w * 128 + k * 8 + n];
                if (D[w * 128 + m * 8 + n] != (float)s)
                    fail_msg("mma warp %d D[%d][%d] = %.9g, want %.9g", w, m, n, (double)D[w * 128 + m * 8 + n], s);
            }
    assert_true(D[128] == 1.0f + 0x1p-20f);
}

/* ---- misuse aborts -------------------------------------------------------------------------------------- */
__global__ void k_misuse(int kind, int *sink)
{
    const int t = (int)threadIdx.x;
    if (kind == 0) { /* two different __syncthreads */
        if (t < 32) __syncthreads();
        else __syncthreads();
    } else if (kind == 1) { /* a warp collective reached by half a warp */
        if ((t & 31) < 16) sink[t] = __shfl_xor_sync(0xffffffffu, t, 1);
    } else if (kind == 2) { /* threads exit while the others wait at __syncthreads */
        if (t >= 32) return;
        __syncthreads();
    } else if (kind == 3) { /* a partial mask */
        sink[t] = (int)__ballot_sync(0x0000ffffu, 1);
    } else if (kind == 4) { /* lanes of a warp at two different collectives */
        if (t & 1) sink[t] = __shfl_xor_sync(0xffffffffu, t, 1);
        else sink[t] = (int)__ballot_sync(0xffffffffu, 1);
    } else if (kind == 5 || kind == 6) { /* an mma reached by half a warp / beside a shuffle */
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        if ((t & 31) < 16) emu_mma_m16n8k16_bf16_f32(d, 0u, 0u, 0u, 0u, 0u, 0u);
        else if (kind == 6) d[0] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
        sink[t] = (int)d[0];
    }
}

/* Runs misuse `kind` in a child; the child must abort with `expect` in its message. */
static void expect_abort(int kind, const char *expect)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        int sink[64];
        emu_launch(emu_config{1}, k_misuse, dim3(1), dim3(64), 0, kind, sink);
        _exit(0);
    }
    close(fd[1]);
    std::string msg;
    char buf[512];
    ssize_t n;
    while ((n = read(fd[0], buf, sizeof buf)) > 0) msg.append(buf, (size_t)n);
    close(fd[0]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT)
        fail_msg("misuse %d: the child did not abort (status %#x): %s", kind, st, msg.c_str());
    if (msg.find(expect) == std::string::npos)
        fail_msg("misuse %d: message without '%s':\n%s", kind, expect, msg.c_str());
}

static void test_misuse_aborts(void **state)
{
    (void)state;
    expect_abort(0, "different __syncthreads");
    expect_abort(1, "not all 32 lanes");
    expect_abort(2, "others of the block have exited");
    expect_abort(3, "only full masks");
    expect_abort(4, "different warp collectives");
    expect_abort(5, "not all 32 lanes");
    expect_abort(6, "different warp");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_indices),
        cmocka_unit_test(test_warp_collectives),
        cmocka_unit_test(test_schedules),
        cmocka_unit_test(test_bf16_intrinsics),
        cmocka_unit_test(test_mma),
        cmocka_unit_test(test_misuse_aborts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
