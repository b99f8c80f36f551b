/* tests/emu/emu_mma.cpp — the warp-level tensor-core instruction the kernels use, emulated from its PTX ISA
 * definition: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (kernels/cuda/matmul.cu's
 * mma_bf16_16816 under GS_CUDA_EMU).
 *
 * Why: the only inline PTX of the kernels; its fragment indexing (which lane holds which element of A, B,
 * C and D) is the kind of bug a CPU comparison should catch. The layouts below are written from the PTX
 * ISA, NOT from the kernel, so a test through this emulation is an independent check of the kernel's
 * fragment indexing:
 *
 *   NVIDIA, "Parallel Thread Execution ISA", section "Matrix Fragments for mma.m16n8k16 with floating
 *   point type" (9.7.14.5.8 in PTX ISA 9.0; the number shifts between releases, e.g. 9.7.13.4.8 earlier)
 *   (https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-fragment-mma-16816-float),
 *   with groupID = %laneid >> 2, threadID_in_group = %laneid % 4:
 *     A (16 x 16, .bf16): four .b32 registers holding a0..a7, "elements low to high" (a0 in the low 16
 *       bits of the first register, a1 in its high bits, a2 / a3 in the second register, ...);
 *       row = groupID for ai where 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise;
 *       col = threadID_in_group * 2 + (i & 1) for i < 4, threadID_in_group * 2 + (i & 1) + 8 for i >= 4.
 *     B (16 x 8, .bf16): two .b32 registers holding b0..b3 (low to high);
 *       row = threadID_in_group * 2 + (i & 1) for i < 2, threadID_in_group * 2 + (i & 1) + 8 for i >= 2;
 *       col = groupID.
 *     C, D (16 x 8, .f32): four .f32 registers c0..c3;
 *       row = groupID for i < 2, groupID + 8 for i >= 2; col = threadID_in_group * 2 + (i & 1).
 *   D = A * B + C (the mma instruction: "Perform a MxNxK matrix multiply and accumulate operation,
 *   D = A*B+C").
 *
 * Numerics: each D element is the 16 bf16 x bf16 products (exact in double) plus its C element, summed in
 * double and rounded to f32 once (round to nearest even). The hardware's internal order and precision
 * differ (the ISA leaves them unspecified; tensor cores add products with limited alignment), so a GPU
 * result may differ from this one in the last bits of f32; like the hardware, an output element depends
 * only on its own A row, B column and C element. NaN / inf propagate as in IEEE double arithmetic.
 */
#include "tests/emu/emu_cuda.h"

namespace {

struct mma_in {
    uint32_t a[4], b[2];
    float c[4];
};
static_assert(sizeof(mma_in) <= EMU_WARP_DATA_BYTES, "mma fragments fit a warp computation's lane data");

/* element i (0 = low half) of a .b32 register holding two bf16 values, as a double */
double bf16_elem(uint32_t reg, int i)
{
    const uint32_t h = i == 0 ? (reg & 0xffffu) : (reg >> 16);
    return (double)std::bit_cast<float>(h << 16);
}

void mma_m16n8k16_bf16(const unsigned char (*ins)[EMU_WARP_DATA_BYTES], unsigned char (*outs)[EMU_WARP_DATA_BYTES])
{
    double A[16][16], B[16][8], C[16][8];
    bool seenA[16][16] = {}, seenB[16][8] = {}, seenC[16][8] = {};
    for (int lane = 0; lane < 32; lane++) {
        mma_in in;
        std::memcpy(&in, ins[lane], sizeof in);
        const int groupID = lane >> 2, tig = lane % 4;
        for (int i = 0; i < 8; i++) { /* a_i: register i / 2, half i % 2 */
            const int row = (i < 2 || (i >= 4 && i < 6)) ? groupID : groupID + 8;
            const int col = i < 4 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8;
            A[row][col] = bf16_elem(in.a[i / 2], i % 2);
            seenA[row][col] = true;
        }
        for (int i = 0; i < 4; i++) { /* b_i: register i / 2, half i % 2 */
            const int row = i < 2 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8;
            const int col = groupID;
            B[row][col] = bf16_elem(in.b[i / 2], i % 2);
            seenB[row][col] = true;
        }
        for (int i = 0; i < 4; i++) {
            const int row = i < 2 ? groupID : groupID + 8;
            const int col = tig * 2 + (i & 1);
            C[row][col] = (double)in.c[i];
            seenC[row][col] = true;
        }
    }
    /* the layouts above must cover every element exactly once (a transcription check of this file) */
    for (int r = 0; r < 16; r++) {
        for (int k = 0; k < 16; k++)
            if (!seenA[r][k]) emu_fatal("emu_mma: A[%d][%d] held by no lane", r, k);
        for (int c = 0; c < 8; c++)
            if (!seenB[r][c] || !seenC[r][c]) emu_fatal("emu_mma: B / C element (%d, %d) held by no lane", r, c);
    }
    for (int lane = 0; lane < 32; lane++) {
        const int groupID = lane >> 2, tig = lane % 4;
        float d[4];
        for (int i = 0; i < 4; i++) {
            const int row = i < 2 ? groupID : groupID + 8;
            const int col = tig * 2 + (i & 1);
            double s = C[row][col];
            for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
            d[i] = (float)s;
        }
        std::memcpy(outs[lane], d, sizeof d);
    }
}

} // namespace

void emu_mma_m16n8k16_bf16_f32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                               uint32_t b1, const std::source_location site)
{
    const mma_in in = {{a0, a1, a2, a3}, {b0, b1}, {d[0], d[1], d[2], d[3]}};
    const unsigned char *out = emu_warp_compute(&in, sizeof in, mma_m16n8k16_bf16, site);
    std::memcpy(d, out, sizeof d);
}
