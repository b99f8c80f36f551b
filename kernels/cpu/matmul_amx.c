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

#if defined(KERN_HAVE_X86) && defined(KERN_HAVE_AMX_BUILD)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Per-thread buffers, grown on first use (kept for the thread's life: the pool's threads are
 * long-lived, so this allocates once per thread and shape high-water mark, not per step). */
static _Thread_local uint16_t *amx_xbuf, *amx_wbuf;
static _Thread_local size_t amx_xcap, amx_wcap;

static uint16_t *amx_grow(uint16_t **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap) return *p;
    free(*p);
    bytes = (bytes + 4095) & ~(size_t)4095;
    *p = aligned_alloc(64, bytes);
    *cap = *p ? bytes : 0;
    return *p;
}

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

/* Tiles: 0-2 C (16 x 16 f32), 3 A (16 rows x 32 bf16), 4-6 B (16 k pairs x 16 columns). Every tile
 * is 16 rows of 64 bytes; row and column tails are zero padding. */
static AMX_TARGET void amx_config(void)
{
    amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 7; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

/* rows [r0, r0 + 16) of x rounded to bf16 (vcvtne2ps2bf16: kern_f32_to_bf16_daz, bit for bit),
 * padded with zero rows past M and zero k past K: d is 16 x Kp */
static AMX_TARGET void amx_round_rows(const kern_mm_args *a, int r0, uint16_t *d, int Kp)
{
    const int K = a->K;
    for (int r = 0; r < 16; r++) {
        uint16_t *dr = d + (size_t)r * (size_t)Kp;
        if (r0 + r >= a->M) {
            memset(dr, 0, (size_t)Kp * 2);
            continue;
        }
        const float *x = a->x + (size_t)(r0 + r) * (size_t)K;
        int k = 0;
        for (; k + 32 <= K; k += 32)
            _mm512_storeu_si512((void *)(dr + k), (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k)));
        for (; k < K; k++) dr[k] = kern_f32_to_bf16_daz(x[k]);
        for (; k < Kp; k++) dr[k] = 0;
    }
}

AMX_TARGET void kern_mm_cols_amx_native(const kern_mm_args *a, int n0, int n1)
{
    const int K = a->K, Kp = (K + 31) & ~31, nc = n1 - n0, ng = (nc + 15) / 16;
    const size_t gsz = (size_t)Kp * 16; /* bf16 per packed 16-column group */
    uint16_t *wb = amx_grow(&amx_wbuf, &amx_wcap, (size_t)ng * gsz * 2);
    uint16_t *xb = amx_grow(&amx_xbuf, &amx_xcap, (size_t)16 * (size_t)Kp * 2);
    if (!wb || !xb) { /* out of memory: the emulation gives the same bits */
        kern_mm_cols_amx_emul(a, n0, n1);
        return;
    }
    /* pack W's columns [n0, n1) into the B-tile layout: group g, k pair kk, column c, half h at
     * wb[g * gsz + kk * 32 + c * 2 + h]; zero past K and past n1 */
    const uint16_t *W = a->w;
    for (int g = 0; g < ng; g++) {
        uint16_t *pg = wb + (size_t)g * gsz;
        for (int c = 0; c < 16; c++) {
            const int n = n0 + g * 16 + c;
            if (n >= n1) {
                for (int kk = 0; kk < Kp / 2; kk++) pg[(size_t)kk * 32 + c * 2] = pg[(size_t)kk * 32 + c * 2 + 1] = 0;
                continue;
            }
            const uint16_t *wr = W + (size_t)n * (size_t)K;
            int k = 0;
            /* whole pairs as one 32-bit move (B row kk, column c is the dword W[n][2kk .. 2kk+1]) */
            for (; k + 2 <= K; k += 2) {
                uint32_t d;
                memcpy(&d, wr + k, 4);
                memcpy(pg + (size_t)(k >> 1) * 32 + c * 2, &d, 4);
            }
            for (; k < K; k++) pg[(size_t)(k >> 1) * 32 + c * 2 + (k & 1)] = wr[k];
            for (; k < Kp; k++) pg[(size_t)(k >> 1) * 32 + c * 2 + (k & 1)] = 0;
        }
    }
    amx_config();
    _Alignas(64) float cbuf[3][16 * 16];
    const int nkb = Kp / 32;
    kern_mm_xb *xc = a->xb;
    const int Mp = (a->M + 15) & ~15;
    for (int r0 = 0; r0 < a->M; r0 += 16) {
        /* the rows rounded once per op into the thread's scratch (kern_mm_xb, stride Kp, zero rows
         * up to a multiple of 16) when it holds 16 rows or more, else per call into xb: the same
         * rounding, the same bits */
        const uint16_t *xa = xb;
        if (xc && xc->r0 <= r0 && r0 + 16 <= xc->r1) {
            xa = xc->buf + (size_t)(r0 - xc->r0) * (size_t)Kp;
        } else if (xc && xc->bytes / ((size_t)Kp * 2) >= 16) {
            const int fit = (int)(xc->bytes / ((size_t)Kp * 2)) & ~15;
            const int r1 = Mp - r0 < fit ? Mp : r0 + fit;
            for (int rb = r0; rb < r1; rb += 16) amx_round_rows(a, rb, xc->buf + (size_t)(rb - r0) * (size_t)Kp, Kp);
            xc->r0 = r0;
            xc->r1 = r1;
            xa = xc->buf;
        } else {
            amx_round_rows(a, r0, xb, Kp);
        }
        const int mr = a->M - r0 < 16 ? a->M - r0 : 16;
        for (int g = 0; g < ng; g += 3) {
            const int gn = ng - g < 3 ? ng - g : 3;
            const uint16_t *b0 = wb + (size_t)g * gsz;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            if (gn == 3) {
                for (int kb = 0; kb < nkb; kb++) {
                    _tile_loadd(3, xa + (size_t)kb * 32, Kp * 2);
                    _tile_loadd(4, b0 + (size_t)kb * 512, 64);
                    _tile_loadd(5, b0 + gsz + (size_t)kb * 512, 64);
                    _tile_loadd(6, b0 + 2 * gsz + (size_t)kb * 512, 64);
                    _tile_dpbf16ps(0, 3, 4);
                    _tile_dpbf16ps(1, 3, 5);
                    _tile_dpbf16ps(2, 3, 6);
                }
            } else if (gn == 2) {
                for (int kb = 0; kb < nkb; kb++) {
                    _tile_loadd(3, xa + (size_t)kb * 32, Kp * 2);
                    _tile_loadd(4, b0 + (size_t)kb * 512, 64);
                    _tile_loadd(5, b0 + gsz + (size_t)kb * 512, 64);
                    _tile_dpbf16ps(0, 3, 4);
                    _tile_dpbf16ps(1, 3, 5);
                }
            } else {
                for (int kb = 0; kb < nkb; kb++) {
                    _tile_loadd(3, xa + (size_t)kb * 32, Kp * 2);
                    _tile_loadd(4, b0 + (size_t)kb * 512, 64);
                    _tile_dpbf16ps(0, 3, 4);
                }
            }
            _tile_stored(0, cbuf[0], 64);
            _tile_stored(1, cbuf[1], 64);
            _tile_stored(2, cbuf[2], 64);
            for (int t = 0; t < gn; t++) {
                const int nb = n0 + (g + t) * 16;
                const int cn = n1 - nb < 16 ? n1 - nb : 16;
                for (int r = 0; r < mr; r++)
                    for (int c = 0; c < cn; c++) amx_finish(a, r0 + r, nb + c, cbuf[t][r * 16 + c]);
            }
        }
    }
    _tile_release();
}
#else
int kern_amx_supported(void) { return 0; }
#endif
