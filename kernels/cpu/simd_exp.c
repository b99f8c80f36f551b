/* kernels/cpu/simd_exp.c — the coefficient tables of kern_exp_neg (f64) and kern_expf (f32), defined
 * once for the scalar, AVX2 and AVX-512 bodies (kern_cpu.h explains the reductions and their
 * accuracy). */
#include "kernels/cpu/kern_cpu.h"

const double kern_exp_neg_c[14] = {0x1p+0,
                                   0x1p+0,
                                   0x1p-1,
                                   0x1.5555555555555p-3,
                                   0x1.5555555555555p-5,
                                   0x1.1111111111111p-7,
                                   0x1.6c16c16c16c17p-10,
                                   0x1.a01a01a01a01ap-13,
                                   0x1.a01a01a01a01ap-16,
                                   0x1.71de3a556c734p-19,
                                   0x1.27e4fb7789f5cp-22,
                                   0x1.ae64567f544e4p-26,
                                   0x1.1eed8eff8d898p-29,
                                   0x1.6124613a86d09p-33};

const float kern_expf_c[8] = {0x1p+0f, 0x1p+0f, 0x1p-1f, 0x1.555556p-3f, 0x1.555556p-5f, 0x1.111112p-7f, 0x1.6c16c2p-10f, 0x1.a01a02p-13f};
