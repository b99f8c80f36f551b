/* kernels/cpu/matmul_amx.c — the "amx" matmul order (kern_cpu.h): bf16 weights, activations
 * rounded to bf16, summed in the order Intel AMX's TDPBF16PS sums them. The native kernel runs
 * TDPBF16PS (kern_simd_amx, where cpuid shows AMX-TILE + AMX-BF16 and the kernel grants the tile
 * state through arch_prctl); every other ISA table runs kern_mm_cols_amx_emul, an exact emulation
 * in plain C (the same IEEE operations, so the same bits: tests/unit/test_amx.c checks both against
 * each other on the native instruction).
 *
 * The order, pinned on an Emerald Rapids Xeon (family 6 model 207) by a probe over random cases,
 * denormals, NaN, inf and k tails (see docs/DESIGN.md "The AMX order"):
 *   x'[k] = kern_f32_to_bf16_daz(x[r, k]) (a bf16, never denormal), w'[k] = W[n, k] with a
 *   denormal bf16 read as a zero of its sign; K is padded with zeros (both operands) to Kp, a
 *   multiple of 32. acc = +0; for each block b = 0 .. Kp/32 - 1 in order, with j = 32 b:
 *     e = +0; for i = 0 .. 15: e = FTZ(fma(x'[j + 2i],     w'[j + 2i],     e))   ("even" elements)
 *     o = +0; for i = 0 .. 15: o = FTZ(fma(x'[j + 2i + 1], w'[j + 2i + 1], o))   ("odd" elements)
 *     acc = FTZ(acc + FTZ(e + o))
 *   where fma rounds once to nearest even and FTZ turns a denormal result into the zero of its
 *   sign (MXCSR plays no part). "Even / odd" are the two halves of each bf16 pair of the
 *   instruction (the low / high 16 bits of a dword: k = 2i / 2i + 1), not even / odd pairs; the
 *   chains run in ascending i (both other orders tried mismatch about a third of the outputs). Then
 *   out = acc (+ bias[n]) (+ out, with accumulate) in plain f32, as every other mode.
 *   NaN: a NaN input gives a NaN output in both; its payload and sign are not pinned (the native
 *   instruction propagates the accumulator's NaN first, then the even chain's; the emulation
 *   follows fmaf / the compiler's operand order). Everything else, bit for bit.
 * Each output depends only on its own row of x and column of W, so a row's result does not depend
 * on the batch (the native kernel pads rows to 16 with zeros; padded rows are discarded).
 */
#include "kernels/cpu/kern_cpu.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static inline float amx_daz_bf16(uint16_t h) { return kern_flush_denormal(kern_bf16_to_f32(h)); }

/* One output, from the activation row x (f32, rounded here) and the weight row w (bf16), length K. */
static float amx_emul_dot(const float *x, const uint16_t *w, int K)
{
    float acc = 0.0f;
    for (int j = 0; j < K; j += 32) {
        float e = 0.0f, o = 0.0f;
        for (int i = 0; i < 16; i++) {
            const int k = j + 2 * i;
            const float xe = k < K ? kern_bf16_to_f32(kern_f32_to_bf16_daz(x[k])) : 0.0f;
            const float we = k < K ? amx_daz_bf16(w[k]) : 0.0f;
            const float xo = k + 1 < K ? kern_bf16_to_f32(kern_f32_to_bf16_daz(x[k + 1])) : 0.0f;
            const float wo = k + 1 < K ? amx_daz_bf16(w[k + 1]) : 0.0f;
            e = kern_flush_denormal(fmaf(xe, we, e));
            o = kern_flush_denormal(fmaf(xo, wo, o));
        }
        acc = kern_flush_denormal(acc + kern_flush_denormal(e + o));
    }
    return acc;
}

static inline void amx_finish(const kern_mm_args *a, int r, int n, float s)
{
    if (a->bias) s = s + a->bias[n];
    float *o = a->out + (size_t)r * (size_t)a->N + (size_t)n;
    *o = a->accumulate ? *o + s : s;
}

void kern_mm_cols_amx_emul(const kern_mm_args *a, int n0, int n1)
{
    const int K = a->K;
    for (int r = 0; r < a->M; r++)
        for (int n = n0; n < n1; n++)
            amx_finish(a, r, n, amx_emul_dot(a->x + (size_t)r * (size_t)K, (const uint16_t *)a->w + (size_t)n * (size_t)K, K));
}

int kern_amx_scratch_rows(int K, size_t bytes)
{
    const size_t blk = (size_t)32 * (size_t)((K + 31) & ~31); /* bytes per 16-row block */
    return (int)(bytes / blk) * 16;
}

#if defined(KERN_HAVE_X86) && defined(KERN_HAVE_AMX_BUILD)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA 18

/* 0 unknown, 1 usable, -1 not */
static atomic_int g_amx_state;

int kern_amx_supported(void)
{
    int s = atomic_load_explicit(&g_amx_state, memory_order_acquire);
    if (s) return s > 0;
    unsigned eax, ebx, ecx, edx;
    int ok = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & (1u << 24)) && (edx & (1u << 22));
    /* the tile data state must be granted once per process (Linux 5.16+); refused: no AMX */
    if (ok) ok = syscall(SYS_arch_prctl, AMX_ARCH_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA) == 0;
    atomic_store_explicit(&g_amx_state, ok ? 1 : -1, memory_order_release);
    return ok;
}

typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) amx_tilecfg;

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16")))

/* The product is computed transposed, C^T = W . x'^T, so that W is read where it lies and never
 * packed: A tiles are 16 rows of W (16 output columns x 32 k, row stride 2K bytes, straight from
 * the weights), B tiles are 16 rows of x' in TDPBF16PS's pair layout (16 k pairs x 16 rows: dword
 * (kk, r) = x'[r][2kk .. 2kk + 1]), and C tiles hold 16 columns x 16 rows. The instruction's sum
 * is symmetric in its operands (each product is exact before the FMA, and the chains run over the
 * pair halves in k order whichever operand carries which), so the bits are those of the pinned
 * order above. Tiles: 0-3 C (two column groups x two row blocks), 4-5 A, 6-7 B; each 16 rows of
 * 64 bytes. */
static AMX_TARGET void amx_config(void)
{
    amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

/* One B tile: rows [0, rows) of x (row stride ldx floats), k [0, kn), kn <= 32, rounded by
 * vcvtne2ps2bf16 (kern_f32_to_bf16_daz, bit for bit), zero past rows and past kn: dword (kk, r)
 * at d + 2 (16 kk + r). Each row's 16 pairs are one vector; the 16 x 16 dword transpose runs in
 * registers (dwords, then qwords within 128-bit lanes, then lanes). */
static AMX_TARGET void amx_pack_tile(const float *x, size_t ldx, int rows, int kn, uint16_t *d)
{
    const __mmask16 lo = kn >= 16 ? 0xffff : (__mmask16)((1u << kn) - 1);
    const __mmask16 hi = kn >= 32 ? 0xffff : kn <= 16 ? 0 : (__mmask16)((1u << (kn - 16)) - 1);
    __m512i r[16], t[16], u[16];
    for (int i = 0; i < 16; i++) {
        r[i] = _mm512_setzero_si512();
        if (i < rows) {
            const float *xr = x + (size_t)i * ldx;
            r[i] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, xr + 16), _mm512_maskz_loadu_ps(lo, xr));
        }
    }
    /* t: in each 128-bit lane l, rows (2i, 2i + 1) interleaved at columns 4l .. 4l + 3 */
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + c], lane l: rows 4g .. 4g + 3 at column 4l + c */
    for (int g = 0; g < 4; g++) {
        u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    /* column 4l + c gathers lane l of u[c], u[4 + c], u[8 + c], u[12 + c] */
    for (int c = 0; c < 4; c++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88), v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        _mm512_store_si512((void *)(d + 32 * (0 + c)), _mm512_shuffle_i32x4(v0, v2, 0x88));
        _mm512_store_si512((void *)(d + 32 * (8 + c)), _mm512_shuffle_i32x4(v0, v2, 0xdd));
        _mm512_store_si512((void *)(d + 32 * (4 + c)), _mm512_shuffle_i32x4(v1, v3, 0x88));
        _mm512_store_si512((void *)(d + 32 * (12 + c)), _mm512_shuffle_i32x4(v1, v3, 0xdd));
    }
}

/* The B tiles of x's rows [r0, r0 + 16), k block kb at d + 512 kb. */
static AMX_TARGET void amx_pack_rows(const kern_mm_args *a, int r0, uint16_t *d)
{
    const int K = a->K, rows = a->M - r0 < 16 ? a->M - r0 : 16;
    for (int k = 0; k < K; k += 32)
        amx_pack_tile(a->x + (size_t)r0 * (size_t)K + (size_t)k, (size_t)K, rows, K - k < 32 ? K - k : 32, d + (size_t)k * 16);
}

/* Where the A tile of W's rows [nb, nb + 16), k block kb, is read from: W itself when all 16 rows
 * and 32 k exist, else a copy in t with zeros past n1 and past K (what the pinned order pads). */
static const uint16_t *amx_wtile(const kern_mm_args *a, int nb, int n1, int kb, uint16_t *t, int *stride)
{
    const int K = a->K, k0 = kb * 32, kn = K - k0 < 32 ? K - k0 : 32, rows = n1 - nb < 16 ? n1 - nb : 16;
    const uint16_t *w = (const uint16_t *)a->w + (size_t)nb * (size_t)K + (size_t)k0;
    if (kn == 32 && rows == 16) {
        *stride = K * 2;
        return w;
    }
    memset(t, 0, 1024);
    for (int r = 0; r < rows; r++) memcpy(t + r * 32, w + (size_t)r * (size_t)K, (size_t)kn * 2);
    *stride = 64;
    return t;
}

/* C tile t (16 columns x 16 rows, row = column) to out, bias / accumulate as the contract */
static void amx_finish_tile(const kern_mm_args *a, int rb, int cb, int n1, const float *ct)
{
    const int cn = n1 - cb < 16 ? n1 - cb : 16, mr = a->M - rb < 16 ? a->M - rb : 16;
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < cn; c++) amx_finish(a, rb + r, cb + c, ct[c * 16 + r]);
}

/* Rows [r0, r0 + 16) (the last block of x: r0 + 16 >= M) against columns [n0, n1): one B tile per
 * k block, four C tiles over four column groups, the A tiles alternating in tiles 4 and 5; xs: the
 * block's B tiles, or NULL (pack each into bt). Batch-1 decode lives here: four independent
 * accumulations keep the instruction's latency covered while W streams. */
static AMX_TARGET void amx_one_block(const kern_mm_args *a, int r0, int n0, int n1, const uint16_t *xs,
                                     uint16_t at[2][512], uint16_t *bt, float cbuf[4][256])
{
    const int K = a->K, nkb = (K + 31) / 32;
    for (int nb = n0; nb < n1; nb += 64) {
        const int ngr = (n1 - nb + 15) / 16 < 4 ? (n1 - nb + 15) / 16 : 4;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int kb = 0; kb < nkb; kb++) {
            const uint16_t *b0 = xs ? xs + (size_t)kb * 512 : bt;
            if (!xs)
                amx_pack_tile(a->x + (size_t)r0 * (size_t)K + (size_t)kb * 32, (size_t)K, a->M - r0,
                              K - kb * 32 < 32 ? K - kb * 32 : 32, bt);
            _tile_loadd(6, b0, 64);
            int st;
            const uint16_t *w = amx_wtile(a, nb, n1, kb, at[0], &st);
            _tile_loadd(4, w, st);
            _tile_dpbf16ps(0, 4, 6);
            if (ngr > 1) {
                w = amx_wtile(a, nb + 16, n1, kb, at[1], &st);
                _tile_loadd(5, w, st);
                _tile_dpbf16ps(1, 5, 6);
            }
            if (ngr > 2) {
                w = amx_wtile(a, nb + 32, n1, kb, at[0], &st);
                _tile_loadd(4, w, st);
                _tile_dpbf16ps(2, 4, 6);
            }
            if (ngr > 3) {
                w = amx_wtile(a, nb + 48, n1, kb, at[1], &st);
                _tile_loadd(5, w, st);
                _tile_dpbf16ps(3, 5, 6);
            }
        }
        _tile_stored(0, cbuf[0], 64);
        _tile_stored(1, cbuf[1], 64);
        _tile_stored(2, cbuf[2], 64);
        _tile_stored(3, cbuf[3], 64);
        for (int g = 0; g < ngr; g++) amx_finish_tile(a, r0, nb + 16 * g, n1, cbuf[g]);
    }
}

AMX_TARGET void kern_mm_cols_amx_native(const kern_mm_args *a, int n0, int n1)
{
    const int K = a->K, Kp = (K + 31) & ~31, nkb = Kp / 32;
    const size_t blk = (size_t)16 * (size_t)Kp; /* bf16 per 16-row block of packed x */
    kern_mm_xb *xc = a->xb;
    /* the scratch holds whole 16-row blocks; with room for fewer than one (K over 16384), or none,
     * each B tile is packed where it is used instead: the same bits */
    const int fit = xc ? kern_amx_scratch_rows(K, xc->bytes) : 0;
    _Alignas(64) uint16_t at[2][512], bt[2][512];
    _Alignas(64) float cbuf[4][256];
    amx_config();
    for (int r0 = 0; r0 < a->M; r0 += 32) {
        const int nbk = a->M - r0 > 16 ? 2 : 1;
        /* rows packed once per op into the thread's scratch (kern_mm_xb), reused by every unit of
         * columns the thread claims; refilled from r0 when r0's blocks are not in it */
        const uint16_t *xs = NULL;
        if (fit >= 16 * nbk) {
            if (!(xc->r0 <= r0 && r0 + 16 * nbk <= xc->r1)) {
                const int r1 = a->M - r0 <= fit ? r0 + ((a->M - r0 + 15) & ~15) : r0 + fit;
                for (int rb = r0; rb < r1; rb += 16) amx_pack_rows(a, rb, xc->buf + (size_t)(rb - r0) / 16 * blk);
                xc->r0 = r0;
                xc->r1 = r1;
            }
            xs = xc->buf + (size_t)(r0 - xc->r0) / 16 * blk;
        }
        if (nbk == 1) { /* one row block (decode, a tail): four column groups per pass */
            amx_one_block(a, r0, n0, n1, xs, at, bt[0], cbuf);
            continue;
        }
        for (int nb = n0; nb < n1; nb += 32) { /* two row blocks x two column groups */
            const int ngr = n1 - nb > 16 ? 2 : 1;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int kb = 0; kb < nkb; kb++) {
                const uint16_t *b0 = bt[0], *b1 = bt[1];
                if (xs) {
                    b0 = xs + (size_t)kb * 512;
                    b1 = xs + blk + (size_t)kb * 512;
                } else { /* no scratch: this k block of the rows, packed here */
                    const int kn = K - kb * 32 < 32 ? K - kb * 32 : 32;
                    for (int h = 0; h < 2; h++) {
                        const int rb = r0 + 16 * h;
                        amx_pack_tile(a->x + (size_t)rb * (size_t)K + (size_t)kb * 32, (size_t)K,
                                      a->M - rb < 16 ? a->M - rb : 16, kn, bt[h]);
                    }
                }
                int st;
                const uint16_t *w = amx_wtile(a, nb, n1, kb, at[0], &st);
                _tile_loadd(4, w, st);
                _tile_loadd(6, b0, 64);
                _tile_loadd(7, b1, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                if (ngr == 2) {
                    w = amx_wtile(a, nb + 16, n1, kb, at[1], &st);
                    _tile_loadd(5, w, st);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
            /* C tile (g, h): 16 columns of group g x 16 rows of block h, row = column */
            _tile_stored(0, cbuf[0], 64);
            _tile_stored(1, cbuf[1], 64);
            _tile_stored(2, cbuf[2], 64);
            _tile_stored(3, cbuf[3], 64);
            for (int g = 0; g < ngr; g++)
                for (int h = 0; h < 2; h++) amx_finish_tile(a, r0 + 16 * h, nb + 16 * g, n1, cbuf[2 * g + h]);
        }
    }
    _tile_release();
}
#else
int kern_amx_supported(void) { return 0; }
#endif
