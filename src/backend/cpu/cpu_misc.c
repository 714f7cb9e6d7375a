/* CPU backend — embedding, bias, activations, fused softmax + cross-entropy, elementwise ops,
 * deterministic reductions and AdamW. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

/* Elementwise loops go parallel only when the work pays for the thread wake-up. */
#define PAR_MIN 32768

/* Columns per work item of the column-parallel (row-order) reductions. */
enum { COL_BLOCK = 64 };

/* Elements per chunk of sum/sumsq: fixed, so the summation tree depends on n only. */
enum { SUM_CHUNK = 16384 };

/* ---- embedding ---- */

void cpu_embedding_forward(fp8t_backend *b, float *out, const int *tokens, const float *wte,
                           const float *wpe, int B, int T, int C) {
    (void)b;
    int N = B * T;
#pragma omp parallel for schedule(static) if ((long)N * C > PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *we = wte + (size_t)tokens[i] * C;            /* [C] */
        const float *pe = wpe ? wpe + (size_t)(i % T) * C : NULL; /* [C] */
        float *o = out + (size_t)i * C;                           /* [C] */
        for (int c = 0; c < C; c++) o[c] = we[c] + (pe ? pe[c] : 0.0f);
    }
}

void cpu_embedding_backward(fp8t_backend *b, float *dwte, float *dwpe, const float *dout,
                            const int *tokens, int B, int T, int C) {
    (void)b;
    int N = B * T;
    int nblocks = (C + COL_BLOCK - 1) / COL_BLOCK;
    /* Parallel over column blocks; within a block the positions are added in order, so a
     * token that appears several times accumulates in the same order on every run. */
#pragma omp parallel for schedule(static) if ((long)N * C > PAR_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * C;                /* [C] */
            float *dw = dwte + (size_t)tokens[i] * C;             /* [C] */
            float *dp = dwpe ? dwpe + (size_t)(i % T) * C : NULL; /* [C] */
            for (int c = c0; c < c1; c++) dw[c] += d[c];
            if (dp)
                for (int c = c0; c < c1; c++) dp[c] += d[c];
        }
    }
}

/* ---- bias ---- */

void cpu_column_sums(float *colsum, const float *x, int rows, int cols, int ld) {
    int nblocks = (cols + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)rows * cols > PAR_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * COL_BLOCK, nc = cols - c0 < COL_BLOCK ? cols - c0 : COL_BLOCK;
        double acc[COL_BLOCK] = {0};
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * ld + c0;
            for (int j = 0; j < nc; j++) acc[j] += xr[j];
        }
        for (int j = 0; j < nc; j++) colsum[c0 + j] += (float)acc[j];
    }
}

void cpu_bias_add(fp8t_backend *b, float *out, const float *bias, int N, int OC) {
    (void)b;
#pragma omp parallel for schedule(static) if ((long)N * OC > PAR_MIN)
    for (int r = 0; r < N; r++) {
        float *o = out + (size_t)r * OC; /* [OC] */
        for (int c = 0; c < OC; c++) o[c] += bias[c];
    }
}

void cpu_bias_backward(fp8t_backend *b, float *dbias, const float *dout, int N, int OC) {
    (void)b;
    cpu_column_sums(dbias, dout, N, OC, OC);
}

/* ---- activations ---- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* GELU (tanh approximation) without the cancellation of 1 + tanh(u) for negative u:
 * 0.5 (1 + tanh(u)) = sigmoid(2u) and 1 - tanh(u)^2 = 4 sigmoid(2u) (1 - sigmoid(2u)), so
 *   gelu(v)  = v * s,  gelu'(v) = s + 2 v s (1 - s) du/dv,  s = 1 / (1 + e^(-2u)),
 * accurate to a few ulp relative everywhere (the CUDA kernels use the same form). */
static inline float gelu_sig(float u) { return 1.0f / (1.0f + cpu_expf(-2.0f * u)); }

void cpu_gelu_forward(fp8t_backend *b, float *out, const float *x, size_t n) {
    (void)b;
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float u = GELU_K * (v + GELU_C * v * v * v);
        out[i] = v * gelu_sig(u);
    }
}

/* The reference: the FP32 result in scratch, then to_bf16 (the CUDA backend does both in one
 * kernel). */
void cpu_gelu_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, uint16_t *save16,
                           const float *x, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    size_t n = (size_t)rows * (size_t)cols;
    if (save16) cpu_bf16_pack(b, save16, x, NULL, rows, cols);
    float *y = cpu_scratch(b, CPU_SCRATCH_ACT, n * sizeof(float)); /* [rows, cols] */
    cpu_gelu_forward(b, y, x, n);
    cpu_to_bf16(b, out, amax_out, y, rows, cols);
}

/* GELU's input x + bias [cols] (the bias its producer left out) into y [rows, cols], the same
 * bits as bias_add on a copy; x itself when there is no bias. */
static const float *gelu_input(fp8t_backend *b, float *y, const float *x, const float *bias,
                               int rows, int cols) {
    if (!bias) return x;
    memcpy(y, x, (size_t)rows * (size_t)cols * sizeof(float));
    cpu_bias_add(b, y, bias, rows, cols);
    return y;
}

void cpu_quantize_gelu(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                       uint16_t *save16, const float *x, const float *bias, int rows, int cols,
                       fp8_format fmt, const float *scale, float *values) {
    if (rows <= 0 || cols <= 0) return;
    size_t n = (size_t)rows * (size_t)cols;
    if (save16) cpu_bf16_pack(b, save16, x, bias, rows, cols);
    /* [rows, cols]: GELU's output, where the request wants it or in scratch */
    float *y = values ? values : cpu_scratch(b, CPU_SCRATCH_ACT, n * sizeof(float));
    cpu_gelu_forward(b, y, gelu_input(b, y, x, bias, rows, cols), n);
    cpu_quantize(b, codes, codes_t, amax_out, y, rows, cols, fmt, scale);
}

/* The references of the fused column sums: the op, then bias_backward's sums (the same bits) */
void cpu_quantize_colsum(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                         float *colsum, const float *x, int rows, int cols, fp8_format fmt,
                         const float *scale) {
    cpu_quantize(b, codes, codes_t, amax_out, x, rows, cols, fmt, scale);
    if (rows > 0 && cols > 0) cpu_bias_backward(b, colsum, x, rows, cols);
}

void cpu_to_bf16_colsum(fp8t_backend *b, uint16_t *out, float *amax_out, float *colsum,
                        const float *x, int rows, int cols) {
    cpu_to_bf16(b, out, amax_out, x, rows, cols);
    if (rows > 0 && cols > 0) cpu_bias_backward(b, colsum, x, rows, cols);
}

/* x + bias in scratch, then the plain backward (the same bits) */
void cpu_gelu_backward_bias(fp8t_backend *b, float *dx, const float *x, const float *bias,
                            const float *dout, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    size_t n = (size_t)rows * (size_t)cols;
    float *y = cpu_scratch(b, CPU_SCRATCH_ACT, n * sizeof(float)); /* [rows, cols] */
    cpu_gelu_backward(b, dx, gelu_input(b, y, x, bias, rows, cols), dout, n);
}

void cpu_gelu_backward(fp8t_backend *b, float *dx, const float *x, const float *dout, size_t n) {
    (void)b;
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float v = x[i], d = dout[i]; /* read both before writing: dx may alias dout */
        float u = GELU_K * (v + GELU_C * v * v * v);
        float sg = gelu_sig(u);
        float du_dv = GELU_K * (1.0f + 3.0f * GELU_C * v * v);
        float grad = sg + 2.0f * v * sg * (1.0f - sg) * du_dv;
        dx[i] = grad * d;
    }
}

/* The references of the fused GELU backward: dx into dst, or scratch where dst is NULL
 * (gelu_backward, or gelu_backward_bias with a bias), then the rounding op with its column
 * sums. */
static const float *gelu_backward_into(fp8t_backend *b, float *dst, const float *dout,
                                       const float *x, const float *bias, int rows, int cols) {
    size_t n = (size_t)rows * (size_t)cols;
    float *dx =
        dst ? dst : cpu_scratch(b, CPU_SCRATCH_GRAD, n * sizeof(float)); /* [rows, cols] */
    if (bias)
        cpu_gelu_backward_bias(b, dx, x, bias, dout, rows, cols);
    else
        cpu_gelu_backward(b, dx, x, dout, n);
    return dx;
}

void cpu_gelu_backward_quantize_colsum(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t,
                                       float *amax_out, float *colsum, const float *dout,
                                       const float *x, const uint16_t *x16, const float *bias,
                                       int rows, int cols, fp8_format fmt, const float *scale,
                                       float *values) {
    if (rows <= 0 || cols <= 0) return;
    x = cpu_bf16_widen(b, CPU_SCRATCH_ACT, x, x16, (size_t)rows * cols);
    const float *dx = gelu_backward_into(b, values, dout, x, bias, rows, cols);
    cpu_quantize(b, codes, codes_t, amax_out, dx, rows, cols, fmt, scale);
    if (colsum) cpu_bias_backward(b, colsum, dx, rows, cols);
}

/* The reference of quantize_scaled of plain values (make_operand composes a step first): the
 * column sums as bias_backward, amax as the amax op, then block_quantize of each orientation. */
void cpu_quantize_scaled(fp8t_backend *b, const fp8t_scaled_quant *q) {
    const int rows = q->rows, cols = q->cols;
    if (rows <= 0 || cols <= 0) return;
    FP8T_CHECK(!q->gelu && !q->gelu_x && !q->gelu_x16 && !q->swiglu && !q->dswiglu,
               "cpu_quantize_scaled: a producer step is make_operand's to compose");
    const size_t n = (size_t)rows * (size_t)cols;
    const float *v = q->x;
    if (q->colsum) cpu_bias_backward(b, q->colsum, v, rows, cols);
    if (q->amax_out) cpu_amax(b, q->amax_out, v, n);
    if (q->codes)
        cpu_block_quantize(b, q->codes, q->scale_inv, v, rows, cols, 0, q->scaling, q->fmt,
                           q->pow2);
    if (q->codes_t)
        cpu_block_quantize(b, q->codes_t, q->scale_inv_t, v, rows, cols, 1, q->scaling, q->fmt,
                           q->pow2);
}

void cpu_gelu_backward_bf16_colsum(fp8t_backend *b, uint16_t *out, float *amax_out, float *colsum,
                                   const float *dout, const float *x, const uint16_t *x16,
                                   const float *bias, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    x = cpu_bf16_widen(b, CPU_SCRATCH_ACT, x, x16, (size_t)rows * cols);
    const float *dx = gelu_backward_into(b, NULL, dout, x, bias, rows, cols);
    cpu_to_bf16(b, out, amax_out, dx, rows, cols);
    if (colsum) cpu_bias_backward(b, colsum, dx, rows, cols);
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + cpu_expf(-x)); }

void cpu_swiglu_forward(fp8t_backend *b, float *out, const float *gate, const float *up,
                        uint16_t *gate16, uint16_t *up16, size_t n) {
    (void)b;
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g * sigmoidf(g) * up[i];
    }
    /* the saves: bf16_pack's encoding */
    if (gate16) bf16_encode_n(gate16, gate, n);
    if (up16) bf16_encode_n(up16, up, n);
}

/* the inference activation operands' last steps: the amax op of the values y [rows, cols] where
 * asked, then quantize (scale) or to_bf16 into out (NULL: neither) */
static void act_operand_of(fp8t_backend *b, void *out, const float *y, int rows, int cols,
                           const float *scale, fp8_format fmt, float *amax_out) {
    if (amax_out) cpu_amax(b, amax_out, y, (size_t)rows * cols);
    if (!out) return;
    if (scale)
        cpu_quantize(b, (uint8_t *)out, NULL, NULL, y, rows, cols, fmt, scale);
    else
        cpu_to_bf16(b, (uint16_t *)out, NULL, y, rows, cols);
}

/* The reference: gate and up widened from BF16 where given so, swiglu_forward in scratch, the
 * amax op where asked, then quantize or to_bf16 (out NULL: neither) */
void cpu_swiglu_operand(fp8t_backend *b, void *out, const float *gate, const float *up,
                        const uint16_t *gate16, const uint16_t *up16, int rows, int cols,
                        const float *scale, fp8_format fmt, float *amax_out) {
    if (rows <= 0 || cols <= 0) return;
    const size_t n = (size_t)rows * cols;
    gate = cpu_bf16_widen(b, CPU_SCRATCH_WIDE_A, gate, gate16, n);
    up = cpu_bf16_widen(b, CPU_SCRATCH_WIDE_B, up, up16, n);
    float *y = cpu_scratch(b, CPU_SCRATCH_ACT, n * sizeof(float)); /* [rows, cols] */
    cpu_swiglu_forward(b, y, gate, up, NULL, NULL, n);
    act_operand_of(b, out, y, rows, cols, scale, fmt, amax_out);
}

/* The reference: x widened from BF16, bias_add, gelu_forward in scratch, the amax op where
 * asked, then quantize or to_bf16 (out NULL: neither) */
void cpu_gelu16_operand(fp8t_backend *b, void *out, const uint16_t *x16, const float *bias,
                        int rows, int cols, const float *scale, fp8_format fmt, float *amax_out) {
    if (rows <= 0 || cols <= 0) return;
    const size_t n = (size_t)rows * cols;
    float *y = cpu_scratch(b, CPU_SCRATCH_WIDE_A, n * sizeof(float)); /* [rows, cols] */
    bf16_decode_n(y, x16, n);
    if (bias) cpu_bias_add(b, y, bias, rows, cols);
    cpu_gelu_forward(b, y, y, n);
    act_operand_of(b, out, y, rows, cols, scale, fmt, amax_out);
}

/* one element's gradients: dgate = d * up * silu'(g), dup = d * silu(g) */
static inline void swiglu_grads(float *dg, float *du, float d, float g, float u) {
    float s = sigmoidf(g);
    float silu = g * s;
    float dsilu = s * (1.0f + g * (1.0f - s)); /* d/dg of g*sigmoid(g) */
    *dg = d * u * dsilu;
    *du = d * silu;
}

void cpu_swiglu_backward(fp8t_backend *b, float *dgate, float *dup, const float *dout,
                         const float *gate, const float *up, const uint16_t *gate16,
                         const uint16_t *up16, size_t n) {
    (void)b;
    if (gate && up) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            float g = gate[i], u = up[i], d = dout[i]; /* all reads before the writes */
            swiglu_grads(&dgate[i], &dup[i], d, g, u);
        }
        return;
    }
    /* from the BF16 saves (exact widening: the same values as after bf16_unpack) */
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = gate ? gate[i] : bf16_decode(gate16[i]), u = up ? up[i] : bf16_decode(up16[i]);
        float d = dout[i];
        swiglu_grads(&dgate[i], &dup[i], d, g, u);
    }
}

void cpu_swiglu_grad(fp8t_backend *b, float *out, int which, const float *dout, const float *gate,
                     const uint16_t *gate16, const float *up, const uint16_t *up16, size_t n) {
    (void)b;
    const int want_gate = which == FP8T_STEP_DSWIGLU_GATE;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = gate ? gate[i] : bf16_decode(gate16[i]);
        float u = !want_gate ? 0.0f : up ? up[i] : bf16_decode(up16[i]);
        float dg, du;
        swiglu_grads(&dg, &du, dout[i], g, u);
        out[i] = want_gate ? dg : du;
    }
}

/* ---- fused softmax + cross-entropy ---- */

static void check_targets(const int *targets, int N, int V) {
    for (int r = 0; r < N; r++)
        if (targets[r] >= V) {
            FP8T_FATAL("softmax_xent: target %d at row %d is outside the vocabulary "
                       "(V = %d); check the data's token ids against the model's vocab_size "
                       "(%s:%d)",
                       targets[r], r, V, __FILE__, __LINE__);
        }
}

/* One row: *loss and (when dr) dr[V] = (softmax - onehot) * dloss; dr may alias lr. */
static void xent_row(float *loss, float *dr, const float *lr, int V, int tgt, float dloss) {
    if (tgt < 0) { /* ignored position: no loss, no gradient */
        if (loss) *loss = 0.0f;
        if (dr) memset(dr, 0, (size_t)V * sizeof(float));
        return;
    }
    float mx = cpu_row_max(lr, V);
    float logit_t = lr[tgt]; /* read before dr (possibly lr itself) is overwritten */
    double sum = 0.0;
    if (dr) { /* one exp per element: keep exp(l - max) in dr for the gradient pass */
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++) {
            float e = cpu_expf(lr[v] - mx);
            dr[v] = e;
            sum += e;
        }
        float scale = (float)(1.0 / sum) * dloss;
#pragma omp simd
        for (int v = 0; v < V; v++) dr[v] *= scale;
        dr[tgt] -= dloss; /* (softmax - onehot) * dloss */
    } else {
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++) sum += cpu_expf(lr[v] - mx);
    }
    if (loss) *loss = (float)(log(sum) - ((double)logit_t - mx));
}

void cpu_softmax_xent(fp8t_backend *b, float *losses, float *dlogits, const float *logits,
                      const int *targets, int N, int V, float dloss) {
    (void)b;
    check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if ((long)N * V > PAR_MIN)
    for (int r = 0; r < N; r++)
        xent_row(losses ? losses + r : NULL, dlogits ? dlogits + (size_t)r * V : NULL,
                 logits + (size_t)r * V, V, targets[r], dloss);
}

/* The reference: softmax_xent's FP32 gradient in scratch (copied to dlogits32 when asked, after
 * every row is read: it may alias logits), then to_bf16. */
void cpu_softmax_xent_bf16(fp8t_backend *b, float *losses, uint16_t *dlogits, float *amax_out,
                           float *dlogits32, const float *logits, int ld, const int *targets,
                           int N, int V, float dloss) {
    if (N <= 0 || V <= 0) return;
    if (ld < V) {
        FP8T_FATAL("softmax_xent_bf16: ld = %d is less than V = %d", ld, V);
    }
    check_targets(targets, N, V);
    float *d = cpu_scratch(b, CPU_SCRATCH_ACT, (size_t)N * V * sizeof(float)); /* [N, V] */
#pragma omp parallel for schedule(static) if ((long)N * V > PAR_MIN)
    for (int r = 0; r < N; r++)
        xent_row(losses ? losses + r : NULL, d + (size_t)r * V, logits + (size_t)r * ld, V,
                 targets[r], dloss);
    if (dlogits32)
        for (int r = 0; r < N; r++)
            memcpy(dlogits32 + (size_t)r * ld, d + (size_t)r * V, (size_t)V * sizeof(float));
    cpu_to_bf16(b, dlogits, amax_out, d, N, V);
}

/* ---- elementwise ---- */

void cpu_add(fp8t_backend *b, float *out, const float *a, const float *c, size_t n) {
    (void)b;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + c[i];
}

void cpu_add_bias(fp8t_backend *b, float *out, uint16_t *out16, const float *a, const float *y,
                  const float *bias, int N, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (!bias) {
        cpu_add(b, out, a, y, (size_t)N * OC);
    } else {
#pragma omp parallel for schedule(static) if ((long)N * OC > PAR_MIN)
        for (int r = 0; r < N; r++) {
            const size_t o = (size_t)r * OC;
            for (int c = 0; c < OC; c++) out[o + c] = a[o + c] + (y[o + c] + bias[c]);
        }
    }
    /* the reference of the copy from the same pass: bf16_pack of the sum */
    if (out16) cpu_bf16_pack(b, out16, out, NULL, N, OC);
}

void cpu_accumulate(fp8t_backend *b, float *out, const float *x, size_t n) {
    (void)b;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] += x[i];
}

void cpu_scale(fp8t_backend *b, float *out, float s, size_t n) {
    (void)b;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] *= s;
}

/* ---- deterministic reductions: chunk partials in double, combined in chunk order ---- */

static double chunked_sum(const float *x, size_t n, int squares) {
    if (n == 0) return 0.0;
    size_t nchunks = (n + SUM_CHUNK - 1) / SUM_CHUNK;
    double stack_partials[64];
    double *partials = nchunks <= 64 ? stack_partials : CPU_ZALLOC(nchunks * sizeof(double));
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t k = 0; k < nchunks; k++) {
        size_t i0 = k * SUM_CHUNK, i1 = i0 + SUM_CHUNK < n ? i0 + SUM_CHUNK : n;
        double s = 0.0;
        if (squares)
            for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        else
            for (size_t i = i0; i < i1; i++) s += x[i];
        partials[k] = s;
    }
    double total = 0.0;
    for (size_t k = 0; k < nchunks; k++) total += partials[k];
    if (partials != stack_partials) free(partials);
    return total;
}

void cpu_sumsq(fp8t_backend *b, float *out, const float *x, size_t n) {
    (void)b;
    *out += (float)chunked_sum(x, n, 1);
}

void cpu_sum(fp8t_backend *b, float *out, const float *x, size_t n) {
    (void)b;
    *out += (float)chunked_sum(x, n, 0);
}

/* ---- optimizer ---- */

void cpu_adamw(fp8t_backend *b, float *params, float *m, float *v, const float *grads, size_t n,
               float lr, float beta1, float beta2, float eps, float wd, int t, float grad_scale) {
    (void)b;
    float bc1 = 1.0f - powf(beta1, (float)t); /* bias corrections */
    float bc2 = 1.0f - powf(beta2, (float)t);
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        float mhat = mi / bc1, vhat = vi / bc2;
        m[i] = mi;
        v[i] = vi;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * params[i]);
    }
}
