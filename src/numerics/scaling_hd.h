/* fp8train — the scalar FP8 scaling formulas, written once for both backends.
 *
 * Every function here must give the same bits on the host (the numerics library and the CPU
 * backend, C11) and on the GPU (the CUDA backend's kernels), so it is written once in the
 * common subset of C11 and CUDA C++: bit casts through memcpy, <math.h> only, no globals.
 * FP8T_HD makes each one a static inline function for C and a __host__ __device__ one for
 * nvcc. The formulas themselves are documented in fp8train/recipe.h. */
#ifndef FP8TRAIN_SCALING_HD_H
#define FP8TRAIN_SCALING_HD_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp8train/recipe.h" /* fp8t_amax_algo, the state layout */

#ifdef __CUDACC__
#define FP8T_HD static __host__ __device__ __forceinline__
#else
#define FP8T_HD static inline
#endif

/* NaN-propagating max of |v| into a running amax acc (>= 0 or NaN): a NaN already in acc
 * stays, a NaN arriving in v wins, so non-finite data is never hidden. */
FP8T_HD float fp8t_amax_merge(float acc, float v) {
    if (acc != acc) return acc;
    if (v != v) return v;
    const float a = v < 0.0f ? -v : v;
    return a > acc ? a : acc;
}

/* max of two amaxes (>= 0) in which a NaN wins (fmaxf would drop it), as the canonical NaN */
FP8T_HD float fp8t_max_nan_wins(float a, float b) {
    if (isnan(a) || isnan(b)) return NAN;
    return a > b ? a : b;
}

/* Largest power of two <= v for finite v > 0 (normal or subnormal). */
FP8T_HD float fp8t_pow2_floor(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if (u >= 0x00800000u) {
        u &= 0xFF800000u; /* normal: drop the mantissa */
    } else {
        uint32_t top = 1; /* subnormal: keep only the highest set bit */
        while ((u >> 1) >= top) top <<= 1;
        u = top;
    }
    float r;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* Delayed scaling: (fmt_max / amax) / 2^margin; amax 0, negative, Inf or NaN says nothing
 * about the data's range and keeps prev_scale. A subnormal amax makes fmt_max/amax overflow:
 * the largest finite scale is the best one can do (the tensor is ~0 anyway). */
FP8T_HD float fp8t_delayed_scale_of(float amax, float prev_scale, float fmt_max, int margin) {
    if (!(amax > 0.0f) || isinf(amax)) return prev_scale;
    float scale = (fmt_max / amax) / ldexpf(1.0f, margin);
    if (isinf(scale)) scale = FLT_MAX;
    return scale;
}

/* max of two amaxes in which a NaN is skipped (IEEE maxNum, what fmaxf does): the reduction
 * over an amax history, as Transformer Engine's delayed-scaling kernel does it with fmaxf. */
FP8T_HD float fp8t_max_nan_skips(float a, float b) {
    if (isnan(b)) return a;
    if (isnan(a)) return b;
    return a > b ? a : b;
}

/* Max over the amax history of tensor t; history is [len][n]. A NaN slot is skipped, as in
 * Transformer Engine: one broken step must not freeze the scale for the whole window (the NaN
 * stays in its slot, where the NaN tracker and inspect see it); a history of nothing but NaN
 * and 0 gives 0, which keeps the previous scale. An Inf still wins and keeps the scale. */
FP8T_HD float fp8t_history_max(const float *history, int n, int len, int t) {
    float m = 0.0f;
    for (int i = 0; i < len; i++) m = fp8t_max_nan_skips(m, history[(size_t)i * n + t]);
    return m;
}

/* The delayed-scaling update of tensor t of a recipe state (views as in fp8t_recipe_state:
 * hist [len][n], scale, scale_inv, fmt_max [n]): new scale and scale_inv from its history,
 * then its history column rolls: new[i] = old[i+1], new[len-1] = old[0], new[0] = 0.
 * Tensors are independent, so a GPU runs one thread per t. */
FP8T_HD void fp8t_delayed_update_tensor(float *hist, float *scale, float *scale_inv,
                                        const float *fmt_max, int n, int len, int t, int algo,
                                        int margin) {
    const float amax =
        algo == FP8T_AMAX_MOST_RECENT ? hist[t] : fp8t_history_max(hist, n, len, t);
    scale[t] = fp8t_delayed_scale_of(amax, scale[t], fmt_max[t], margin);
    scale_inv[t] = 1.0f / scale[t];
    if (len > 1) {
        const float first = hist[t];
        for (int i = 0; i + 1 < len; i++) hist[(size_t)i * n + t] = hist[(size_t)(i + 1) * n + t];
        hist[(size_t)(len - 1) * n + t] = first;
    }
    hist[t] = 0.0f;
}

/* Current scaling: fmt_max / max(amax, epsilon), optionally rounded down to a power of two;
 * amax 0, Inf or NaN gives 1. */
FP8T_HD float fp8t_current_scale_of(float amax, float fmt_max, float epsilon, int pow2) {
    if (isnan(amax)) return 1.0f; /* checked first: max(NaN, eps) would hide the NaN */
    if (amax < epsilon) amax = epsilon;
    if (!(amax > 0.0f) || isinf(amax)) return 1.0f;
    float scale = fmt_max / amax;
    if (isinf(scale)) scale = FLT_MAX;
    if (pow2 && scale > 0.0f) scale = fp8t_pow2_floor(scale);
    return scale;
}

/* MXFP8: biased E8M0 exponent of the smallest power of two 2^e with amax / 2^e <= 448, i.e.
 * e = ceil(log2(amax / 448)), found exactly (448 * 2^e is exact in double) rather than through
 * a rounded log2. Clamped to the E8M0 range [2^-127, 2^127]; 0xFF (NaN) for Inf/NaN amax. */
FP8T_HD uint8_t fp8t_mx_scale_exponent(float amax) {
    if (isnan(amax) || isinf(amax)) return 0xFF;
    if (amax == 0.0f) return 127;
    int e;
    (void)frexp((double)amax / 448.0, &e); /* amax/448 in [2^(e-1), 2^e), up to rounding */
    e -= 2;
    while (448.0 * ldexp(1.0, e) < (double)amax) e++; /* at most a few steps */
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}

#endif
