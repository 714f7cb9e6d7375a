/* CPU backend — quantization ops. The numerics themselves (encoders, scaling formulas, block
 * and MXFP8 layouts) live in src/numerics; these ops only arrange the passes over memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"
#include "fp8train/fp8.h"
#include "fp8train/recipe.h"

void cpu_amax(fp8t_backend *b, float *amax_out, const float *x, size_t n) {
    (void)b;
    *amax_out = fp8t_amax_merge(*amax_out, fp8_amax(x, n)); /* NaN if any element is NaN */
}

/* Cast (+ amax) in one vectorized pass by the numerics library, then the transpose of the
 * byte codes (a quarter of the traffic of x) in 32x32 tiles. */
enum { QTILE = 32 };

void cpu_quantize(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                  const float *x, int rows, int cols, fp8_format fmt, const float *scale) {
    if (rows <= 0 || cols <= 0) return;
    size_t n = (size_t)rows * cols;
    uint8_t *rm = codes ? codes : cpu_scratch(b, CPU_SCRATCH_CODES, n); /* [rows, cols] */
    float amax = fp8_quantize_amax(rm, x, n, *scale, fmt, 1);
    if (amax_out) *amax_out = fp8t_amax_merge(*amax_out, amax);
    if (!codes_t) return;
    const int row_tiles = (rows + QTILE - 1) / QTILE;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int rt = 0; rt < row_tiles; rt++) {
        int r0 = rt * QTILE, r1 = r0 + QTILE < rows ? r0 + QTILE : rows;
        for (int c0 = 0; c0 < cols; c0 += QTILE) {
            int c1 = c0 + QTILE < cols ? c0 + QTILE : cols;
            for (int c = c0; c < c1; c++) {
                uint8_t *dst = codes_t + (size_t)c * rows; /* row c of [cols, rows] */
                for (int r = r0; r < r1; r++) dst[r] = rm[(size_t)r * cols + c];
            }
        }
    }
}

void cpu_compute_scale(fp8t_backend *b, float *scale, float *scale_inv, const float *amax,
                       float fmt_max, float epsilon, int pow2) {
    (void)b;
    float s = fp8t_current_scale(*amax, fmt_max, epsilon, pow2);
    *scale = s;
    *scale_inv = 1.0f / s;
}

void cpu_fake_quantize(fp8t_backend *b, float *out, const float *x, size_t n, fp8_format fmt,
                       const float *scale) {
    (void)b;
    fp8_fake_quantize(out, x, n, *scale, fmt);
}

void cpu_block_fake_quantize(fp8t_backend *b, float *out, const float *x, int rows, int cols,
                             int tile_r, int tile_c, fp8_format fmt) {
    if (rows <= 0 || cols <= 0) return;
    if (tile_r <= 0 || tile_c <= 0) {
        FP8T_FATAL("block_fake_quantize: tile %dx%d must be positive (block scaling uses "
                   "1x128 or 128x128)",
                   tile_r, tile_c);
    }
    size_t nblocks = (size_t)((rows + tile_r - 1) / tile_r) * ((cols + tile_c - 1) / tile_c);
    uint8_t *codes = cpu_scratch(b, CPU_SCRATCH_CODES, (size_t)rows * cols); /* [rows, cols] */
    float *scales = cpu_scratch(b, CPU_SCRATCH_SCALES, nblocks * sizeof(float)); /* [blocks] */
    fp8t_block_quantize(codes, scales, x, rows, cols, tile_r, tile_c, fmt);
    fp8t_block_dequantize(out, codes, scales, rows, cols, tile_r, tile_c, fmt);
}

/* The scaled operand through the reference quantizer (fp8t_block_quantize_pow2) on the
 * operand's own [R, K] layout with the kind's tile (ROW: 1 x K); its per-block scales become
 * scale_inv in the operand layout. */
void cpu_block_quantize(fp8t_backend *b, uint8_t *codes, float *scale_inv, const float *x,
                        int rows, int cols, int transpose, fp8t_fp8_scaling scaling,
                        fp8_format fmt, int pow2) {
    (void)b;
    if (rows <= 0 || cols <= 0) return;
    if (scaling != FP8T_SCALING_VEC128 && scaling != FP8T_SCALING_BLK128 &&
        scaling != FP8T_SCALING_ROW) {
        FP8T_FATAL("block_quantize: scaling %d is not a block kind", (int)scaling);
    }
    const int R = transpose ? cols : rows, K = transpose ? rows : cols;
    const int tr = fp8t_scaling_tile_r(scaling), tc = fp8t_scaling_tile_c(scaling, K);
    const float *src = x;
    float *xt = NULL; /* [R, K] when transposed */
    if (transpose) {
        xt = malloc((size_t)R * (size_t)K * sizeof(float));
        if (!xt) {
            FP8T_FATAL("block_quantize: out of memory");
        }
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) xt[(size_t)c * rows + r] = x[(size_t)r * cols + c];
        src = xt;
    }
    const int nbr = (R + tr - 1) / tr, nbc = (K + tc - 1) / tc;
    float *sc = malloc((size_t)nbr * (size_t)nbc * sizeof(float)); /* [nbr, nbc] row-major */
    if (!sc) {
        FP8T_FATAL("block_quantize: out of memory");
    }
    fp8t_block_quantize_pow2(codes, sc, src, R, K, tr, tc, fmt, pow2);
    for (int br = 0; br < nbr; br++)
        for (int bc = 0; bc < nbc; bc++)
            scale_inv[fp8t_block_scale_index(scaling, R, K, br * tr, bc * tc)] =
                1.0f / sc[(size_t)br * nbc + bc];
    free(sc);
    free(xt);
}

void cpu_mxfp8_fake_quantize(fp8t_backend *b, float *out, const float *x, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    size_t nscales = (size_t)rows * ((cols + 31) / 32);
    uint8_t *codes = cpu_scratch(b, CPU_SCRATCH_CODES, (size_t)rows * cols); /* [rows, cols] */
    uint8_t *e8m0 = cpu_scratch(b, CPU_SCRATCH_SCALES, nscales); /* [rows, ceil(cols/32)] */
    fp8t_mxfp8_quantize(codes, e8m0, x, rows, cols);
    fp8t_mxfp8_dequantize(out, codes, e8m0, rows, cols);
}

/* Row by row into the padded layout (fp8t_bf16_operand); the amax from the numerics
 * library's vectorized pass, as the amax op takes it. */
void cpu_to_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, const float *x, int rows,
                 int cols) {
    if (rows < 0 || cols < 0) return;
    const size_t ld = (size_t)fp8t_bf16_pad(cols), n = (size_t)rows * (size_t)cols;
    if (amax_out) cpu_amax(b, amax_out, x, n);
    if (ld == (size_t)cols) { /* no padding columns: one (parallel) pass */
        bf16_encode_n(out, x, n);
    } else {
        for (int r = 0; r < rows; r++) {
            uint16_t *o = out + (size_t)r * ld; /* [ld] */
            bf16_encode_n(o, x + (size_t)r * cols, (size_t)cols);
            memset(o + cols, 0, (ld - (size_t)cols) * sizeof(uint16_t));
        }
    }
    memset(out + (size_t)rows * ld, 0,
           ((size_t)fp8t_bf16_pad(rows) - (size_t)rows) * ld * sizeof(uint16_t));
}

/* Row by row: the bias added in FP32 into a row of scratch (bias_add's arithmetic), then
 * rounded; without a bias one (parallel) pass */
void cpu_bf16_pack(fp8t_backend *b, uint16_t *out, const float *x, const float *bias, int rows,
                   int cols) {
    if (rows <= 0 || cols <= 0) return;
    if (!bias) {
        bf16_encode_n(out, x, (size_t)rows * (size_t)cols);
        return;
    }
    float *row = cpu_scratch(b, CPU_SCRATCH_ACT, (size_t)cols * sizeof(float)); /* [cols] */
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols;
        for (int c = 0; c < cols; c++) row[c] = xr[c] + bias[c];
        bf16_encode_n(out + (size_t)r * cols, row, (size_t)cols);
    }
}

void cpu_bf16_unpack(fp8t_backend *b, float *out, const uint16_t *x, size_t n) {
    (void)b;
    bf16_decode_n(out, x, n);
}

const float *cpu_bf16_widen(fp8t_backend *b, int slot, const float *x, const uint16_t *x16,
                            size_t n) {
    if (!x16) return x;
    float *w = cpu_scratch(b, slot, n * sizeof(float)); /* [n] */
    bf16_decode_n(w, x16, n);
    return w;
}

void cpu_bf16_round(fp8t_backend *b, float *out, const float *x, size_t n) {
    (void)b;
    bf16_round(out, x, n);
}

void cpu_delayed_update(fp8t_backend *b, float *state, int n, int len, fp8t_amax_algo algo,
                        int margin) {
    (void)b;
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, state, n, len);
    fp8t_delayed_update(&st, algo, margin);
}
