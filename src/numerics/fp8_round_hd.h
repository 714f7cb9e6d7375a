/* fp8train — FP8 rounding by float arithmetic, written once for the host and the GPU.
 *
 * The statistics of an FP8 image (tensor_stats) need q = decode(encode(x * s)) / s for every
 * element and several images; a conversion instruction per element and image (or a software
 * encoder) is most of the cost. Here the rounded value decode(encode(y)) comes from five
 * float / integer operations instead:
 *
 *   E = max(exponent of y, the format's smallest normal exponent)   (capped at 15)
 *   M = 1.5 * 2^(E - mbits + 23)                 (mbits = 3 for E4M3, 2 for E5M2)
 *   d = (y + M) - M
 *
 * y + M lies in M's binade, whose float spacing is 2^(E - mbits): the FP8 spacing at y's
 * exponent (the subnormal spacing below the smallest normal). The addition rounds y to that
 * grid with the FPU's round to nearest, ties to even (M's last mantissa bit is 0, so the parity
 * of the sum is the parity of the FP8 mantissa), and the subtraction is exact. What is left is
 * the saturating cast's clamp to +-max and the sign of a zero.
 *
 * fp8t_round_sat is exactly fp8_decode(fp8_encode(y, fmt, 1), fmt) for every float y (bit for
 * bit; NaN gives a NaN): tests/test_stats.c checks it on a dense sample of all floats, and
 * tests/gpu (gpu_exhaustive.cu) on all 2^32 inputs on the device. The _nosat and _clamp
 * variants are what the statistics kernels run where the caller knows more about y.
 *
 * fp8t_div_markstein(d, m, r) is d / m correctly rounded from r = 1/m correctly rounded: q0 =
 * d * r is within an ulp of d / m, its residual d - q0 * m is exact in an FMA, and one
 * correction step q0 + residual * r rounds to d / m (Markstein's theorem) when d / m, m and r
 * are normal floats; test_stats checks it for every FP8 value d against sampled m. */
#ifndef FP8TRAIN_FP8_ROUND_HD_H
#define FP8TRAIN_FP8_ROUND_HD_H

#include "numerics/scaling_hd.h" /* FP8T_HD */

/* The float operations whose rounding matters, never contracted into an FMA by nvcc (C11 on
 * the host contracts nothing). */
#ifdef __CUDA_ARCH__
#define FP8T_RMUL(a, b) __fmul_rn((a), (b))
#define FP8T_RADD(a, b) __fadd_rn((a), (b))
#define FP8T_RSUB(a, b) __fsub_rn((a), (b))
#define FP8T_RFMA(a, b, c) __fmaf_rn((a), (b), (c))
#else
#define FP8T_RMUL(a, b) ((a) * (b))
#define FP8T_RADD(a, b) ((a) + (b))
#define FP8T_RSUB(a, b) ((a) - (b))
#define FP8T_RFMA(a, b, c) fmaf((a), (b), (c))
#endif

FP8T_HD uint32_t fp8t_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

FP8T_HD float fp8t_f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float32 exponent fields (biased, << 23) of the smallest normal of each format, 2^-6 and
 * 2^-14, and the offset that turns an exponent field E into the magic M = 1.5 * 2^(E - mbits
 * + 23) */
#define FP8T_RND_EMIN_E4M3 (121u << 23)
#define FP8T_RND_EMIN_E5M2 (113u << 23)
#define FP8T_RND_ECAP (142u << 23) /* 2^15: every larger |y| overflows both formats */
#define FP8T_RND_MAGIC_E4M3 ((20u << 23) | 0x00400000u)
#define FP8T_RND_MAGIC_E5M2 ((21u << 23) | 0x00400000u)
/* |y| above which the cast clips (stats.h: fp8_overflows): 464 rounds to the even 448, E5M2's
 * 61440 (halfway between 57344 and 2^16) to the even 2^16, which overflows */
#define FP8T_CLIP_ABOVE_E4M3 464.0f
#define FP8T_CLIP_FROM_E5M2 61440.0f

/* y rounded to the FP8 grid of format e5m2 (0: E4M3, 1: E5M2), no clamp: exact for every
 * finite y with |y| below the format's clipping threshold (E4M3: |y| <= 464, E5M2: |y| <
 * 61440), except that a y that rounds to zero gives +0 whatever its sign. */
FP8T_HD float fp8t_round_nosat(float y, int e5m2) {
    uint32_t e = fp8t_f32_bits(y) & 0x7F800000u;
    const uint32_t lo = e5m2 ? FP8T_RND_EMIN_E5M2 : FP8T_RND_EMIN_E4M3;
    e = e < lo ? lo : e;
    const float magic = fp8t_f32_of(e + (e5m2 ? FP8T_RND_MAGIC_E5M2 : FP8T_RND_MAGIC_E4M3));
    return FP8T_RSUB(FP8T_RADD(y, magic), magic);
}

/* The same for any non-NaN y (infinities included), with the saturating cast's clamp to
 * +-max; *clipped = 1 where the non-saturating cast would overflow (fp8_overflows). A zero
 * result is +0. */
FP8T_HD float fp8t_round_clamp(float y, int e5m2, int *clipped) {
    uint32_t e = fp8t_f32_bits(y) & 0x7F800000u;
    const uint32_t lo = e5m2 ? FP8T_RND_EMIN_E5M2 : FP8T_RND_EMIN_E4M3;
    e = e < lo ? lo : e;
    e = e > FP8T_RND_ECAP ? FP8T_RND_ECAP : e;
    const float magic = fp8t_f32_of(e + (e5m2 ? FP8T_RND_MAGIC_E5M2 : FP8T_RND_MAGIC_E4M3));
    const float d = FP8T_RSUB(FP8T_RADD(y, magic), magic);
    const float mx = e5m2 ? 57344.0f : 448.0f;
    /* above the cap the sum is no longer on the FP8 grid, but still beyond the max */
    *clipped = d > mx || d < -mx;
    return d > mx ? mx : (d < -mx ? -mx : d);
}

/* fp8_decode(fp8_encode(y, fmt, 1), fmt) for every float y: NaN stays NaN, +-Inf and
 * overflows give +-max, a zero keeps y's sign. */
FP8T_HD float fp8t_round_sat(float y, int e5m2) {
    if (y != y) return y;
    int clipped;
    const float d = fp8t_round_clamp(y, e5m2, &clipped);
    return fp8t_f32_of(fp8t_f32_bits(d) | (fp8t_f32_bits(y) & 0x80000000u));
}

/* fp8t_mx_scale_exponent by the bits of amax (>= 0, Inf or NaN): the smallest e with
 * 448 * 2^e >= amax is exponent(amax) - 8, one more when amax's mantissa exceeds 448's
 * (1.75), clamped to -127 (the largest possible amax gives e = 120). */
FP8T_HD int fp8t_mx_exponent_bits(float amax) {
    const uint32_t u = fp8t_f32_bits(amax) & 0x7FFFFFFFu;
    if (u >= 0x7F800000u) return 0xFF;
    if (u == 0) return 127;
    const int eb = (int)(u >> 23) - 8 + ((u & 0x007FFFFFu) > 0x00600000u);
    return eb < 0 ? 0 : eb;
}

/* d / m correctly rounded, from r = 1/m correctly rounded (see the top) */
FP8T_HD float fp8t_div_markstein(float d, float m, float r) {
    const float q0 = FP8T_RMUL(d, r);
    const float res = FP8T_RFMA(-q0, m, d);
    return FP8T_RFMA(res, r, q0);
}

#endif
