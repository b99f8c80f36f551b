/* kernels/cpu/simd_scalar.c — portable instantiation of simd_body.inc: the 16 lanes are a float
 * array, so it runs anywhere and gives the same bits as the vector builds: fmaf is the correctly
 * rounded fused multiply-add that vfmadd computes (a library call where the CPU lacks FMA: slow,
 * but this path is only the fallback), and the lane loops are never reassociated. */
#include "kernels/cpu/kern_cpu.h"

#include <math.h>

#define SIMD_TARGET
#define SIMD_SFX(name) name##_scalar
typedef struct {
    float l[16];
} v16s;
#define V v16s
#define MM_MR_MAX 1
#define MM_NR_ONE 1
#define MM_NR_MULTI 1
#define MM_NR_MAX 1
#define SIMD_AXPY_ACC 4

#define AIS static inline __attribute__((always_inline, unused))
AIS V V_ZERO(void) { return (V){{0}}; }
AIS V V_LOAD(const float *p)
{
    V v;
    for (int i = 0; i < 16; i++) v.l[i] = p[i];
    return v;
}
AIS V V_LOADBF(const uint16_t *p)
{
    V v;
    for (int i = 0; i < 16; i++) v.l[i] = kern_bf16_to_f32(p[i]);
    return v;
}
AIS V V_LOADF8(const uint8_t *p)
{
    V v;
    for (int i = 0; i < 16; i++) v.l[i] = kern_fp8_raw(p[i]);
    return v;
}
#define VS float
AIS float VS_SET1(float f) { return f; }
AIS V V_MULS(V a, float s)
{
    for (int i = 0; i < 16; i++) a.l[i] = a.l[i] * s;
    return a;
}
AIS void V_STORE(float *p, V v)
{
    for (int i = 0; i < 16; i++) p[i] = v.l[i];
}
AIS V V_SET1(float f)
{
    V v;
    for (int i = 0; i < 16; i++) v.l[i] = f;
    return v;
}
AIS V V_ADD(V a, V b)
{
    for (int i = 0; i < 16; i++) a.l[i] = a.l[i] + b.l[i];
    return a;
}
AIS V V_MUL(V a, V b)
{
    for (int i = 0; i < 16; i++) a.l[i] = a.l[i] * b.l[i];
    return a;
}
AIS V V_FMA(V a, V b, V c)
{
    for (int i = 0; i < 16; i++) c.l[i] = fmaf(a.l[i], b.l[i], c.l[i]);
    return c;
}
AIS V V_SUB(V a, V b)
{
    for (int i = 0; i < 16; i++) a.l[i] = a.l[i] - b.l[i];
    return a;
}
AIS V V_DIV(V a, V b)
{
    for (int i = 0; i < 16; i++) a.l[i] = a.l[i] / b.l[i];
    return a;
}
AIS V V_MIN(V a, V b) /* as minps: b unless a < b (b when either is NaN) */
{
    for (int i = 0; i < 16; i++) a.l[i] = a.l[i] < b.l[i] ? a.l[i] : b.l[i];
    return a;
}
AIS V V_MAX(V a, V b)
{
    for (int i = 0; i < 16; i++) a.l[i] = a.l[i] > b.l[i] ? a.l[i] : b.l[i];
    return a;
}
AIS V V_EXPF_SCALE(V p, V kd)
{
    for (int i = 0; i < 16; i++) p.l[i] = kern_expf_scale(p.l[i], kd.l[i]);
    return p;
}
AIS V V_SELECT_LT(V a, V b, V x, V y)
{
    for (int i = 0; i < 16; i++) y.l[i] = a.l[i] < b.l[i] ? x.l[i] : y.l[i];
    return y;
}
AIS V V_NANPASS(V y, V x)
{
    for (int i = 0; i < 16; i++)
        if (x.l[i] != x.l[i]) y.l[i] = x.l[i] + x.l[i];
    return y;
}
AIS float V_HSUM(V v)
{
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = v.l[i] + v.l[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    float s2a = s4[0] + s4[2], s2b = s4[1] + s4[3];
    return s2a + s2b;
}

/* out[j] = V_HSUM(a[j]) for j < 16 */
AIS void V_HSUM16_STORE(float *out, const V *a)
{
    for (int j = 0; j < 16; j++) out[j] = V_HSUM(a[j]);
}

/* bf16 pairs (kern_cpu.h): e = even k, o = odd k of each lane's pair; the flushes spelled out */
typedef struct {
    V e, o;
} pairs;
#define XP pairs
#define WP pairs
#define flush_tiny kern_flush_denormal
AIS WP WP_LOAD(const uint16_t *w)
{
    WP p;
    for (int i = 0; i < 16; i++) {
        p.e.l[i] = flush_tiny(kern_bf16_to_f32(w[2 * i]));
        p.o.l[i] = flush_tiny(kern_bf16_to_f32(w[2 * i + 1]));
    }
    return p;
}
AIS WP WP_FROM_F32(V a, V b)
{
    uint16_t h[32];
    for (int i = 0; i < 16; i++) {
        h[i] = kern_f32_to_bf16_daz(a.l[i]);
        h[16 + i] = kern_f32_to_bf16_daz(b.l[i]);
    }
    return WP_LOAD(h);
}
AIS V V_DP2(V acc, XP x, WP w)
{
    for (int i = 0; i < 16; i++) {
        acc.l[i] = flush_tiny(fmaf(x.o.l[i], w.o.l[i], acc.l[i]));
        acc.l[i] = flush_tiny(fmaf(x.e.l[i], w.e.l[i], acc.l[i]));
    }
    return acc;
}

#include "kernels/cpu/simd_body.inc"

static void exp_shift_scalar(double *y, const float *l, double mx, int n)
{
    for (int i = 0; i < n; i++) y[i] = kern_exp_neg((double)l[i] - mx);
}

const kern_simd_ops kern_simd_scalar = {
    .isa = KERN_ISA_SCALAR,
    .name = "scalar",
    .mm_cols = simd_mm_cols_scalar,
    .mm_cols_bf16x = simd_mm_cols_bf16x_scalar,
    .mm_cols_amx = kern_mm_cols_amx_emul,
    .dot = simd_dot_scalar,
    .dots4x4 = simd_dots4x4_scalar,
    .axpys = simd_axpys_scalar,
    .scale = simd_scale_scalar,
    .exp_shift = exp_shift_scalar,
    .silu_mul = simd_silu_mul_scalar,
    .softmax16 = simd_softmax16_scalar,
    .div = simd_div_scalar,
};
