/* The operands the tests make, as make_operand requests run on a backend: one function per
 * one-pass kernel (src/backend/operand_kind.h), its arguments in the order the kernel takes
 * them, so a test names the operand it wants and the request is written once (the inference
 * kernels': the request, for t_run or the model's composition, model_compose_operand). On the
 * CUDA backend a request must be one a kernel makes (those below are), on the CPU any is. */
#ifndef FP8TRAIN_TESTS_OPERAND_OPS_H
#define FP8TRAIN_TESTS_OPERAND_OPS_H

#include <string.h>

#include "backend/operand_kind.h"
#include "fp8train/backend.h"
#include "model/operand.h" /* model_operand_req: the model's own plain request */

/* The plain request for x [rows, cols]: per-tensor FP8 codes (codes_t: transposed, may be
 * NULL; either may be NULL on the CPU) with *scale, amax max-accumulated when non-NULL */
static inline fp8t_operand_req t_fp8_req(uint8_t *codes, uint8_t *codes_t, float *amax,
                                         const float *x, int rows, int cols, fp8_format fmt,
                                         const float *scale) {
    fp8t_operand_req r = model_operand_req(codes, x, rows, cols, (fp8t_operand_format)fmt, scale);
    r.out.data_t = codes_t;
    r.out.amax = amax;
    return r;
}

/* ... and the BF16 operand of x (fp8t_bf16_operand's padded layout) */
static inline fp8t_operand_req t_bf16_req(uint16_t *out, float *amax, const float *x, int rows,
                                          int cols) {
    fp8t_operand_req r = t_fp8_req(NULL, NULL, amax, x, rows, cols, FP8_E4M3, NULL);
    r.out.data = out;
    r.out.format = FP8T_OPERAND_BF16;
    return r;
}

static inline void t_run(fp8t_backend *b, const fp8t_operand_req *r) {
    b->ops->make_operand(b, r);
}

/* ---- per-tensor FP8 ---- */
/* codes = fp8(x * *scale) saturating (codes_t transposed), the amax of x */
static inline void t_quantize(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax,
                              const float *x, int rows, int cols, fp8_format fmt,
                              const float *scale) {
    const fp8t_operand_req r = t_fp8_req(codes, codes_t, amax, x, rows, cols, fmt, scale);
    t_run(b, &r);
}
/* ... and colsum += x's column sums */
static inline void t_quantize_colsum(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t,
                                     float *amax, float *colsum, const float *x, int rows,
                                     int cols, fp8_format fmt, const float *scale) {
    fp8t_operand_req r = t_fp8_req(codes, codes_t, amax, x, rows, cols, fmt, scale);
    r.colsum = colsum;
    t_run(b, &r);
}
/* codes of gelu(x (+ bias)) */
static inline void t_quantize_gelu(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax,
                                   const float *x, const float *bias, int rows, int cols,
                                   fp8_format fmt, const float *scale) {
    fp8t_operand_req r = t_fp8_req(codes, codes_t, amax, x, rows, cols, fmt, scale);
    r.step = FP8T_STEP_GELU;
    r.bias = bias;
    t_run(b, &r);
}
/* codes of dx = gelu'(x (+ bias)) * dout, colsum (may be NULL) += dx's column sums */
static inline void t_quantize_dgelu(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t,
                                    float *amax, float *colsum, const float *dout, const float *x,
                                    const float *bias, int rows, int cols, fp8_format fmt,
                                    const float *scale) {
    fp8t_operand_req r = t_fp8_req(codes, codes_t, amax, dout, rows, cols, fmt, scale);
    r.step = FP8T_STEP_DGELU;
    r.x2 = x;
    r.bias = bias;
    r.colsum = colsum;
    t_run(b, &r);
}

/* ---- BF16 ---- */
static inline void t_to_bf16(fp8t_backend *b, uint16_t *out, float *amax, const float *x,
                             int rows, int cols) {
    const fp8t_operand_req r = t_bf16_req(out, amax, x, rows, cols);
    t_run(b, &r);
}
static inline void t_to_bf16_colsum(fp8t_backend *b, uint16_t *out, float *amax, float *colsum,
                                    const float *x, int rows, int cols) {
    fp8t_operand_req r = t_bf16_req(out, amax, x, rows, cols);
    r.colsum = colsum;
    t_run(b, &r);
}
/* the BF16 operand of gelu(x) */
static inline void t_gelu_bf16(fp8t_backend *b, uint16_t *out, float *amax, const float *x,
                               int rows, int cols) {
    fp8t_operand_req r = t_bf16_req(out, amax, x, rows, cols);
    r.step = FP8T_STEP_GELU;
    t_run(b, &r);
}
/* ... of dx = gelu'(x (+ bias)) * dout, colsum as t_quantize_dgelu's */
static inline void t_dgelu_bf16(fp8t_backend *b, uint16_t *out, float *amax, float *colsum,
                                const float *dout, const float *x, const float *bias, int rows,
                                int cols) {
    fp8t_operand_req r = t_bf16_req(out, amax, dout, rows, cols);
    r.step = FP8T_STEP_DGELU;
    r.x2 = x;
    r.bias = bias;
    r.colsum = colsum;
    t_run(b, &r);
}
/* ... of LayerNorm(x; w, bias) (as layernorm_forward, mean and rstd kept); with c non-NULL of
 * LayerNorm(sum), sum = x + c written too */
static inline void t_layernorm_bf16(fp8t_backend *b, float *sum, uint16_t *out, float *amax,
                                    float *mean, float *rstd, const float *x, const float *c,
                                    const float *w, const float *bias, int N, int C, float eps) {
    fp8t_operand_req r = t_bf16_req(out, amax, x, N, C);
    r.step = c ? FP8T_STEP_ADD_LAYERNORM : FP8T_STEP_LAYERNORM;
    r.x2 = c;
    r.sum = sum;
    r.norm_w = w, r.norm_b = bias, r.eps = eps;
    r.mean = mean, r.rstd = rstd;
    t_run(b, &r);
}

/* ---- the inference model's: no amax, one layout, FP8 with scale or BF16 with scale NULL ---- */
static inline fp8t_operand_req t_infer_req(void *out, const float *x, int rows, int cols,
                                           const float *scale) {
    fp8t_operand_req r = t_fp8_req((uint8_t *)out, NULL, NULL, x, rows, cols, FP8_E4M3, scale);
    if (!scale) r.out.format = FP8T_OPERAND_BF16;
    return r;
}
/* the request for the operand of LayerNorm (rms: RMSNorm) of s = a + (y + ybias) (written
 * to sum), or of a when y is NULL */
static inline fp8t_operand_req t_norm_req(void *out, float *sum, const float *a, const float *y,
                                          const float *ybias, const float *w, const float *bias,
                                          int rms, int rows, int cols, float eps,
                                          const float *scale) {
    fp8t_operand_req r = t_infer_req(out, a, rows, cols, scale);
    if (y)
        r.step = rms ? FP8T_STEP_ADD_RMSNORM : FP8T_STEP_ADD_LAYERNORM;
    else
        r.step = rms ? FP8T_STEP_RMSNORM : FP8T_STEP_LAYERNORM;
    r.x2 = y;
    r.bias = y ? ybias : NULL;
    r.sum = y ? sum : NULL;
    r.norm_w = w, r.norm_b = bias, r.eps = eps;
    return r;
}
/* ... of silu(gate) * up */
static inline fp8t_operand_req t_swiglu_req(void *out, const float *gate, const float *up,
                                            int rows, int cols, const float *scale) {
    fp8t_operand_req r = t_infer_req(out, gate, rows, cols, scale);
    r.step = FP8T_STEP_SWIGLU;
    r.x2 = up;
    return r;
}
/* ... of BF16 gate16 and up16 [rows, cols] packed, its amax too (may be NULL); out NULL: the
 * amax alone */
static inline fp8t_operand_req t_swiglu16_req(void *out, const uint16_t *gate16,
                                              const uint16_t *up16, int rows, int cols,
                                              const float *scale, float *amax) {
    fp8t_operand_req r = t_swiglu_req(out, NULL, NULL, rows, cols, scale);
    if (!out) r.out.format = FP8T_OPERAND_E4M3, r.out.scale = NULL;
    r.x_16 = gate16, r.x2_16 = up16;
    r.out.amax = amax;
    return r;
}
/* ... of GELU of BF16 x16 [rows, cols] packed (+ bias [cols], may be NULL) */
static inline fp8t_operand_req t_gelu16_req(void *out, const uint16_t *x16, const float *bias,
                                            int rows, int cols, const float *scale, float *amax) {
    fp8t_operand_req r = t_swiglu16_req(out, x16, NULL, rows, cols, scale, amax);
    r.step = FP8T_STEP_GELU;
    r.bias = bias;
    return r;
}

/* ---- block- and row-scaled FP8 ---- */
/* both orientations q asks for (operand_kind.h's fp8t_scaled_quant) */
static inline void t_quantize_scaled(fp8t_backend *b, const fp8t_scaled_quant *q) {
    fp8t_operand_req r =
        t_fp8_req(q->codes, q->codes_t, q->amax_out, q->x, q->rows, q->cols, q->fmt, NULL);
    r.out.scale_inv = q->scale_inv;
    r.out.scale_inv_t = q->scale_inv_t;
    r.out.scaling = q->scaling;
    r.out.pow2 = q->pow2;
    r.colsum = q->colsum;
    if (q->gelu) r.step = FP8T_STEP_GELU, r.save16 = q->gelu_save16;
    if (q->gelu_x || q->gelu_x16)
        r.step = FP8T_STEP_DGELU, r.x2 = q->gelu_x, r.x2_16 = q->gelu_x16;
    r.bias = q->gelu || q->gelu_x || q->gelu_x16 ? q->bias : NULL;
    t_run(b, &r);
}
/* the scaled operand of x [rows, cols] (transpose 0) or of its transpose (1): codes [R, K]
 * and scale_inv in scaling's layout */
static inline void t_block_quantize(fp8t_backend *b, uint8_t *codes, float *scale_inv,
                                    const float *x, int rows, int cols, int transpose,
                                    fp8t_fp8_scaling scaling, fp8_format fmt, int pow2) {
    fp8t_scaled_quant q;
    memset(&q, 0, sizeof(q));
    if (transpose)
        q.codes_t = codes, q.scale_inv_t = scale_inv;
    else
        q.codes = codes, q.scale_inv = scale_inv;
    q.x = x;
    q.rows = rows, q.cols = cols;
    q.scaling = scaling, q.fmt = fmt, q.pow2 = pow2;
    t_quantize_scaled(b, &q);
}

#endif
