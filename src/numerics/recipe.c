/* fp8train — FP8 scaling recipes: delayed and current per-tensor scaling (Transformer Engine
 * semantics), DeepSeek-V3 block scaling and MXFP8. The exact formulas are in recipe.h and
 * docs/numerics.md; the tests in tests/test_recipe.c spell out expected values by hand. */
#include "fp8train/recipe.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- recipe state ---- */

size_t fp8t_recipe_state_floats(int n, int len) {
    if (n <= 0 || len <= 0) return 0;
    return ((size_t)len + 3) * (size_t)n;
}

void fp8t_recipe_state_view(fp8t_recipe_state *st, float *base, int n, int len) {
    st->n = n;
    st->len = len;
    st->history = base;                                 /* [len][n] */
    st->scale = base + (size_t)len * (size_t)n;          /* [n] */
    st->scale_inv = st->scale + n;                       /* [n] */
    st->fmt_max = st->scale_inv + n;                     /* [n] */
}

void fp8t_recipe_state_reset(fp8t_recipe_state *st, const fp8_format *fmts) {
    const size_t hist = (size_t)st->len * (size_t)st->n;
    for (size_t i = 0; i < hist; i++) st->history[i] = 0.0f;
    for (int t = 0; t < st->n; t++) {
        st->scale[t] = 1.0f;
        st->scale_inv[t] = 1.0f;
        st->fmt_max[t] = fp8_format_max(fmts ? fmts[t] : FP8_E4M3);
    }
}

/* ---- scalar formulas ---- */

float fp8t_delayed_scale(float amax, float prev_scale, float fmt_max, int margin) {
    /* amax 0, negative, Inf or NaN says nothing about the data's range: keep the old scale. */
    if (!(amax > 0.0f) || isinf(amax)) return prev_scale;
    float scale = (fmt_max / amax) / ldexpf(1.0f, margin);
    /* A subnormal amax makes fmt_max/amax overflow; the largest finite scale is the best we
     * can do (the tensor is ~0 anyway). */
    if (isinf(scale)) scale = FLT_MAX;
    return scale;
}

/* Largest power of two <= v for finite v > 0 (normal or subnormal). */
static float pow2_floor(float v) {
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

float fp8t_current_scale(float amax, float fmt_max, float epsilon, int pow2) {
    if (isnan(amax)) return 1.0f; /* checked first: max(NaN, eps) would hide the NaN */
    if (amax < epsilon) amax = epsilon;
    if (!(amax > 0.0f) || isinf(amax)) return 1.0f;
    float scale = fmt_max / amax;
    if (isinf(scale)) scale = FLT_MAX;
    if (pow2 && scale > 0.0f) scale = pow2_floor(scale);
    return scale;
}

/* ---- delayed scaling over the whole state ---- */

/* max that lets a NaN through (fmaxf would drop it and hide a broken step) */
static float max_nan_wins(float a, float b) {
    if (isnan(a) || isnan(b)) return NAN;
    return a > b ? a : b;
}

void fp8t_recipe_record_amax(fp8t_recipe_state *st, int t, float amax) {
    st->history[t] = max_nan_wins(st->history[t], amax);
}

float fp8t_recipe_history_max(const fp8t_recipe_state *st, int t) {
    float m = 0.0f;
    for (int i = 0; i < st->len; i++) m = max_nan_wins(m, st->history[(size_t)i * st->n + t]);
    return m;
}

void fp8t_delayed_update(fp8t_recipe_state *st, fp8t_amax_algo algo, int margin) {
    const int n = st->n, len = st->len;
    for (int t = 0; t < n; t++) {
        const float amax =
            algo == FP8T_AMAX_MOST_RECENT ? st->history[t] : fp8t_recipe_history_max(st, t);
        st->scale[t] = fp8t_delayed_scale(amax, st->scale[t], st->fmt_max[t], margin);
        st->scale_inv[t] = 1.0f / st->scale[t];
    }
    /* roll: new[i] = old[i+1], new[len-1] = old[0], new[0] = 0 (rows of n floats) */
    if (len > 1) {
        float *h = st->history;
        for (int t = 0; t < n; t++) {
            const float first = h[t];
            for (int i = 0; i + 1 < len; i++) h[(size_t)i * n + t] = h[(size_t)(i + 1) * n + t];
            h[(size_t)(len - 1) * n + t] = first;
        }
    }
    for (int t = 0; t < n; t++) st->history[t] = 0.0f;
}

/* ---- block scaling ---- */

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* Shapes come from callers (and from files): reject nonsense instead of dividing by zero. */
static int block_args_ok(const char *fn, int rows, int cols, int tile_r, int tile_c) {
    if (rows >= 0 && cols >= 0 && tile_r > 0 && tile_c > 0) return 1;
    fprintf(stderr, "%s: bad shape rows=%d cols=%d tile=%dx%d (need rows, cols >= 0 and "
                    "tiles > 0, e.g. 1x128 or 128x128)\n", fn, rows, cols, tile_r, tile_c);
    return 0;
}

void fp8t_block_quantize(uint8_t *codes, float *scales, const float *x, int rows, int cols,
                         int tile_r, int tile_c, fp8_format fmt) {
    if (!block_args_ok(__func__, rows, cols, tile_r, tile_c)) return;
    const int nbr = ceil_div(rows, tile_r), nbc = ceil_div(cols, tile_c);
    const float fmt_max = fp8_format_max(fmt);
#pragma omp parallel for schedule(static) if ((long)rows * cols >= 65536)
    for (int b = 0; b < nbr * nbc; b++) {
        const int r0 = (b / nbc) * tile_r, c0 = (b % nbc) * tile_c;
        const int r1 = r0 + tile_r < rows ? r0 + tile_r : rows;
        const int w = (c0 + tile_c < cols ? c0 + tile_c : cols) - c0;
        float amax = 0.0f;
        for (int r = r0; r < r1; r++) {
            const float a = fp8_amax(x + (size_t)r * cols + c0, (size_t)w);
            amax = max_nan_wins(amax, a);
        }
        const float scale = fp8t_current_scale(amax, fmt_max, 0.0f, 0);
        scales[b] = scale;
        for (int r = r0; r < r1; r++) {
            const size_t off = (size_t)r * cols + c0;
            fp8_quantize(codes + off, x + off, (size_t)w, scale, fmt, 1);
        }
    }
}

void fp8t_block_dequantize(float *out, const uint8_t *codes, const float *scales, int rows,
                           int cols, int tile_r, int tile_c, fp8_format fmt) {
    if (!block_args_ok(__func__, rows, cols, tile_r, tile_c)) return;
    const int nbc = ceil_div(cols, tile_c);
    float table[256]; /* decode(c) */
    for (int c = 0; c < 256; c++) table[c] = fp8_decode((uint8_t)c, fmt);
#pragma omp parallel for schedule(static) if ((long)rows * cols >= 65536)
    for (int r = 0; r < rows; r++) {
        const float *srow = scales + (size_t)(r / tile_r) * nbc;
        for (int c = 0; c < cols; c++) {
            const size_t i = (size_t)r * cols + c;
            out[i] = table[codes[i]] / srow[c / tile_c]; /* exact inverse of x * scale */
        }
    }
}

/* ---- MXFP8 ---- */

#define MX_BLOCK 32

/* Biased E8M0 exponent of the smallest power of two 2^e with amax / 2^e <= 448, i.e.
 * e = ceil(log2(amax / 448)), found exactly (448 * 2^e is exact in double) rather than through
 * a rounded log2. Clamped to the E8M0 range [2^-127, 2^127]; 0xFF (NaN) for Inf/NaN amax. */
static uint8_t mx_scale_exponent(float amax) {
    if (!isfinite(amax)) return 0xFF;
    if (amax == 0.0f) return 127;
    int e;
    (void)frexp((double)amax / 448.0, &e); /* amax/448 in [2^(e-1), 2^e), up to rounding */
    e -= 2;
    while (448.0 * ldexp(1.0, e) < (double)amax) e++; /* at most a few steps */
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}

void fp8t_mxfp8_quantize(uint8_t *codes, uint8_t *e8m0, const float *x, int rows, int cols) {
    if (!block_args_ok(__func__, rows, cols, 1, MX_BLOCK)) return;
    const int nb = ceil_div(cols, MX_BLOCK);
#pragma omp parallel for schedule(static) if ((long)rows * cols >= 65536)
    for (int r = 0; r < rows; r++) {
        for (int b = 0; b < nb; b++) {
            const int c0 = b * MX_BLOCK;
            const int w = (c0 + MX_BLOCK < cols ? c0 + MX_BLOCK : cols) - c0;
            const size_t off = (size_t)r * cols + c0;
            const uint8_t eb = mx_scale_exponent(fp8_amax(x + off, (size_t)w));
            e8m0[(size_t)r * nb + b] = eb;
            if (eb == 0xFF) { /* non-finite block: every element NaN, as the MX spec says */
                memset(codes + off, 0x7F, (size_t)w);
                continue;
            }
            /* x * 2^-e is exact unless the product is a float subnormal, which only happens
             * for elements far below the fp8 subnormal range (they become 0 either way). */
            const float inv = ldexpf(1.0f, 127 - (int)eb);
            fp8_quantize(codes + off, x + off, (size_t)w, inv, FP8_E4M3, 1);
        }
    }
}

void fp8t_mxfp8_dequantize(float *out, const uint8_t *codes, const uint8_t *e8m0, int rows,
                           int cols) {
    if (!block_args_ok(__func__, rows, cols, 1, MX_BLOCK)) return;
    const int nb = ceil_div(cols, MX_BLOCK);
    float table[256]; /* decode(c) */
    for (int c = 0; c < 256; c++) table[c] = fp8_decode((uint8_t)c, FP8_E4M3);
#pragma omp parallel for schedule(static) if ((long)rows * cols >= 65536)
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            const uint8_t eb = e8m0[(size_t)r * nb + c / MX_BLOCK];
            const size_t i = (size_t)r * cols + c;
            /* in double, so a result in the float subnormal range is rounded once */
            out[i] = eb == 0xFF ? NAN : (float)((double)table[codes[i]] * ldexp(1.0, (int)eb - 127));
        }
    }
}
