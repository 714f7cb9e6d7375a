/* fp8train — FP8 scaling recipes: delayed and current per-tensor scaling (Transformer Engine
 * semantics), DeepSeek-V3 block scaling and MXFP8. The exact formulas are in recipe.h and
 * docs/numerics.md; the tests in tests/test_recipe.c spell out expected values by hand. */
#include "fp8train/error.h"
#include "fp8train/recipe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "numerics/scaling_hd.h" /* the formulas, shared with the CUDA kernels */

/* ---- recipe state ---- */

size_t fp8t_recipe_state_floats(int n, int len) {
    if (n <= 0 || len <= 0) return 0;
    return ((size_t)len + 3) * (size_t)n;
}

void fp8t_recipe_state_view(fp8t_recipe_state *st, float *base, int n, int len) {
    st->n = n;
    st->len = len;
    st->history = base;                         /* [len][n] */
    st->scale = base + (size_t)len * (size_t)n; /* [n] */
    st->scale_inv = st->scale + n;              /* [n] */
    st->fmt_max = st->scale_inv + n;            /* [n] */
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
    return fp8t_delayed_scale_of(amax, prev_scale, fmt_max, margin);
}

float fp8t_current_scale(float amax, float fmt_max, float epsilon, int pow2) {
    return fp8t_current_scale_of(amax, fmt_max, epsilon, pow2);
}

/* ---- delayed scaling over the whole state ---- */

void fp8t_recipe_record_amax(fp8t_recipe_state *st, int t, float amax) {
    st->history[t] = fp8t_max_nan_wins(st->history[t], amax);
}

float fp8t_recipe_history_max(const fp8t_recipe_state *st, int t) {
    return fp8t_history_max(st->history, st->n, st->len, t);
}

void fp8t_delayed_update(fp8t_recipe_state *st, fp8t_amax_algo algo, int margin) {
    for (int t = 0; t < st->n; t++)
        fp8t_delayed_update_tensor(st->history, st->scale, st->scale_inv, st->fmt_max, st->n,
                                   st->len, t, (int)algo, margin);
}

/* ---- block scaling ---- */

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* Shapes come from callers (and from files): reject nonsense instead of dividing by zero. */
static int block_args_ok(const char *fn, int rows, int cols, int tile_r, int tile_c) {
    if (rows >= 0 && cols >= 0 && tile_r > 0 && tile_c > 0) return 1;
    fp8t_warnf("%s: bad shape rows=%d cols=%d tile=%dx%d (need rows, cols >= 0 and "
               "tiles > 0, e.g. 1x128 or 128x128)",
               fn, rows, cols, tile_r, tile_c);
    return 0;
}

void fp8t_block_quantize(uint8_t *codes, float *scales, const float *x, int rows, int cols,
                         int tile_r, int tile_c, fp8_format fmt) {
    fp8t_block_quantize_pow2(codes, scales, x, rows, cols, tile_r, tile_c, fmt, 0);
}

void fp8t_block_quantize_pow2(uint8_t *codes, float *scales, const float *x, int rows, int cols,
                              int tile_r, int tile_c, fp8_format fmt, int pow2) {
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
            amax = fp8t_max_nan_wins(amax, a);
        }
        const float scale = fp8t_current_scale(amax, fmt_max, 0.0f, pow2);
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

void fp8t_mxfp8_quantize(uint8_t *codes, uint8_t *e8m0, const float *x, int rows, int cols) {
    if (!block_args_ok(__func__, rows, cols, 1, MX_BLOCK)) return;
    const int nb = ceil_div(cols, MX_BLOCK);
#pragma omp parallel for schedule(static) if ((long)rows * cols >= 65536)
    for (int r = 0; r < rows; r++) {
        for (int b = 0; b < nb; b++) {
            const int c0 = b * MX_BLOCK;
            const int w = (c0 + MX_BLOCK < cols ? c0 + MX_BLOCK : cols) - c0;
            const size_t off = (size_t)r * cols + c0;
            const uint8_t eb = fp8t_mx_scale_exponent(fp8_amax(x + off, (size_t)w));
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
            out[i] =
                eb == 0xFF ? NAN : (float)((double)table[codes[i]] * ldexp(1.0, (int)eb - 127));
        }
    }
}
