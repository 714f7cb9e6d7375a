/* fp8train — FP8 scaling recipes (Transformer Engine semantics).
 *
 * Delayed scaling: every FP8 tensor t has an amax history of `len` slots. Slot 0 collects the
 * current step's amax (max over micro-batches). At the end of a step:
 *   amax  = max(history[0..len-1][t])  (algo max)   or history[0][t]  (algo most_recent)
 *   scale = (fp8_max / amax) / 2^margin; amax 0/Inf/NaN keeps the previous scale;
 *           an Inf scale becomes FLT_MAX
 *   roll:  new[i] = old[i+1], new[len-1] = old[0], new[0] = 0
 * so the scale used at step t comes from amaxes of steps before t; scale_inv = 1/scale.
 *
 * Current scaling: amax = max(amax, epsilon); amax 0/Inf/NaN => scale 1;
 *   else scale = fp8_max / amax, optionally rounded down to a power of two.
 *
 * Block scaling (DeepSeek-V3): 1x128 tiles (activations, gradients) or 128x128 blocks
 * (weights), one FP32 scale per block computed with the current-scaling formula.
 * MXFP8: 32-element blocks along rows, E8M0 scale 2^ceil(log2(amax/448)), E4M3 elements.
 */
#ifndef FP8TRAIN_RECIPE_H
#define FP8TRAIN_RECIPE_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FP8T_AMAX_MAX = 0, FP8T_AMAX_MOST_RECENT = 1 } fp8t_amax_algo;

/* The recipe state of a whole model lives in ONE flat float array so a GPU can update every
 * tensor in one launch and a checkpoint can save it as one blob. For n tensors and history
 * length len the layout is:
 *   history   [len][n]   history[i*n + t]
 *   scale     [n]
 *   scale_inv [n]
 *   fmt_max   [n]        fp8 max of the tensor's format (448 or 57344)
 * fp8t_recipe_state_floats(n, len) = (len + 3) * n. */
typedef struct {
    int n;            /* number of tensors */
    int len;          /* history length */
    float *history;   /* [len][n] */
    float *scale;     /* [n] */
    float *scale_inv; /* [n] */
    float *fmt_max;   /* [n] */
} fp8t_recipe_state;

size_t fp8t_recipe_state_floats(int n, int len);
/* Point the views into base (which holds fp8t_recipe_state_floats(n,len) floats). */
void fp8t_recipe_state_view(fp8t_recipe_state *st, float *base, int n, int len);
/* History 0, scale 1, scale_inv 1, fmt_max from fmts[t] (fmts may be NULL: all E4M3). */
void fp8t_recipe_state_reset(fp8t_recipe_state *st, const fp8_format *fmts);

/* Scalar pieces, shared by the CPU bulk update and the tests. */
float fp8t_delayed_scale(float amax, float prev_scale, float fmt_max, int margin);
float fp8t_current_scale(float amax, float fmt_max, float epsilon, int pow2);

/* The delayed-scaling update of every tensor: new scale from the history, then roll. */
void fp8t_delayed_update(fp8t_recipe_state *st, fp8t_amax_algo algo, int margin);
/* Record an amax into slot 0 of tensor t (max with what is there; NaN wins). */
void fp8t_recipe_record_amax(fp8t_recipe_state *st, int t, float amax);
/* Max over the history of tensor t (what the next scale will be computed from); NaN slots are
 * skipped, as in Transformer Engine. */
float fp8t_recipe_history_max(const fp8t_recipe_state *st, int t);

/* ---- block scaling ----
 * x is [rows, cols] row-major; blocks are tile_r x tile_c (1x128 or 128x128; edge blocks are
 * partial). scales has ceil(rows/tile_r)*ceil(cols/tile_c) entries, row-major over blocks, and
 * holds the quantization scale (fp8 value = x * scale). */
void fp8t_block_quantize(uint8_t *codes, float *scales, const float *x, int rows, int cols,
                         int tile_r, int tile_c, fp8_format fmt);
/* The same with each block's scale rounded down to a power of two when pow2 (the current-scaling
 * option; 1/scale is then exact, so code / scale and code * (1/scale) agree bit for bit). */
void fp8t_block_quantize_pow2(uint8_t *codes, float *scales, const float *x, int rows, int cols,
                              int tile_r, int tile_c, fp8_format fmt, int pow2);
void fp8t_block_dequantize(float *out, const uint8_t *codes, const float *scales, int rows,
                           int cols, int tile_r, int tile_c, fp8_format fmt);

/* ---- MXFP8 ----
 * x is [rows, cols]; each row is cut into 32-element blocks (last partial). e8m0 has
 * rows*ceil(cols/32) entries: the biased exponent (127 = 2^0) of the block's scale
 * 2^ceil(log2(amax/448)); elements are E4M3 codes of x / 2^e. amax 0 => exponent 127. */
void fp8t_mxfp8_quantize(uint8_t *codes, uint8_t *e8m0, const float *x, int rows, int cols);
void fp8t_mxfp8_dequantize(float *out, const uint8_t *codes, const uint8_t *e8m0, int rows,
                           int cols);

#ifdef __cplusplus
}
#endif
#endif
