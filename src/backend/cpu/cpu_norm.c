/* CPU backend — LayerNorm and RMSNorm, forward and backward (llm.c formulas).
 * Row statistics are accumulated in double. The backward computes dx row-parallel (rows are
 * independent) and the weight/bias gradients column-parallel with the rows visited in order,
 * so dw and dbias are bit-identical whatever the thread count. */
#include <math.h>

#include "backend/cpu/cpu_internal.h"

/* Columns per work item of the column-parallel weight-gradient passes. */
enum { NORM_COL_BLOCK = 64 };

void cpu_layernorm_forward(fp8t_backend *b, float *out, float *mean, float *rstd, const float *x,
                           const float *w, const float *bias, int N, int C, float eps) {
    (void)b;
#pragma omp parallel for schedule(static) if ((long)N * C > 16384)
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * C; /* [C] */
        float *outr = out + (size_t)r * C;   /* [C] */
        double s = 0.0;
        for (int c = 0; c < C; c++) s += xr[c];
        float m = (float)(s / C);
        double v = 0.0;
        for (int c = 0; c < C; c++) {
            double d = (double)xr[c] - m;
            v += d * d;
        }
        float rs = (float)(1.0 / sqrt(v / C + eps));
        for (int c = 0; c < C; c++) {
            float n = (xr[c] - m) * rs;
            outr[c] = n * w[c] + (bias ? bias[c] : 0.0f);
        }
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = rs;
    }
}

/* The reference: the FP32 result in scratch, then to_bf16 */
void cpu_layernorm_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, float *mean,
                                float *rstd, const float *x, const float *w, const float *bias,
                                int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    float *y = cpu_scratch(b, CPU_SCRATCH_ACT, (size_t)N * C * sizeof(float)); /* [N, C] */
    cpu_layernorm_forward(b, y, mean, rstd, x, w, bias, N, C, eps);
    cpu_to_bf16(b, out, amax_out, y, N, C);
}

/* The reference: add (with the sum's BF16 copy), then layernorm_forward_bf16 */
void cpu_add_layernorm_forward_bf16(fp8t_backend *b, float *sum, uint16_t *sum16, uint16_t *out,
                                    float *amax_out, float *mean, float *rstd, const float *a,
                                    const float *c, const float *w, const float *bias, int N,
                                    int C, float eps) {
    if (N <= 0 || C <= 0) return;
    cpu_add_bias(b, sum, sum16, a, c, NULL, N, C);
    cpu_layernorm_forward_bf16(b, out, amax_out, mean, rstd, sum, w, bias, N, C, eps);
}

/* The reference: rmsnorm_forward into scratch, then to_bf16 */
void cpu_rmsnorm_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, float *rstd,
                              const float *x, const float *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    float *y = cpu_scratch(b, CPU_SCRATCH_ACT, (size_t)N * C * sizeof(float)); /* [N, C] */
    cpu_rmsnorm_forward(b, y, rstd, x, w, N, C, eps);
    cpu_to_bf16(b, out, amax_out, y, N, C);
}

/* The reference: add (with the sum's BF16 copy), then rmsnorm_forward_bf16 */
void cpu_add_rmsnorm_forward_bf16(fp8t_backend *b, float *sum, uint16_t *sum16, uint16_t *out,
                                  float *amax_out, float *rstd, const float *a, const float *c,
                                  const float *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    cpu_add_bias(b, sum, sum16, a, c, NULL, N, C);
    cpu_rmsnorm_forward_bf16(b, out, amax_out, rstd, sum, w, N, C, eps);
}

/* The reference: add_bias / add into sum (or scratch), the FP32 norm in scratch, then quantize
 * or to_bf16 */
void cpu_add_norm_operand(fp8t_backend *b, void *out, float *sum, const float *a, const float *y,
                          const float *ybias, const float *w, const float *bias, int rms,
                          int rows, int cols, float eps, const float *scale, fp8_format fmt) {
    if (rows <= 0 || cols <= 0) return;
    const size_t n = (size_t)rows * cols;
    const float *x = a;
    if (y) {
        /* [rows, cols] */
        float *s = sum ? sum : cpu_scratch(b, CPU_SCRATCH_GRAD, n * sizeof(float));
        cpu_add_bias(b, s, NULL, a, y, ybias, rows, cols); /* no ybias: add's sum */
        x = s;
    }
    float *o = cpu_scratch(b, CPU_SCRATCH_ACT, n * sizeof(float)); /* [rows, cols] */
    if (rms)
        cpu_rmsnorm_forward(b, o, NULL, x, w, rows, cols, eps);
    else
        cpu_layernorm_forward(b, o, NULL, NULL, x, w, bias, rows, cols, eps);
    if (scale)
        cpu_quantize(b, (uint8_t *)out, NULL, NULL, o, rows, cols, fmt, scale);
    else
        cpu_to_bf16(b, (uint16_t *)out, NULL, o, rows, cols);
}

void cpu_layernorm_backward(fp8t_backend *b, float *dx, float *dw, float *dbias,
                            const float *dout, const float *x, const uint16_t *x16,
                            const float *w, const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    x = cpu_bf16_widen(b, CPU_SCRATCH_NORM_X, x, x16, (size_t)N * C);
    /* dx: per row, dx += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd */
    if (dx) {
#pragma omp parallel for schedule(static) if ((long)N * C > 16384)
        for (int r = 0; r < N; r++) {
            const float *xr = x + (size_t)r * C, *dr = dout + (size_t)r * C; /* [C] */
            float *dxr = dx + (size_t)r * C;                                 /* [C] */
            float m = mean[r], rs = rstd[r];
            double sum_dn = 0.0, sum_dn_n = 0.0;
            for (int c = 0; c < C; c++) {
                float n = (xr[c] - m) * rs;
                float dn = w[c] * dr[c];
                sum_dn += dn;
                sum_dn_n += (double)dn * n;
            }
            float mean_dn = (float)(sum_dn / C), mean_dn_n = (float)(sum_dn_n / C);
            for (int c = 0; c < C; c++) {
                float n = (xr[c] - m) * rs;
                float dn = w[c] * dr[c];
                dxr[c] += (dn - mean_dn - n * mean_dn_n) * rs;
            }
        }
    }
    /* dw += sum_r norm * dout, dbias += sum_r dout, rows in order per column */
    if (dw || dbias) {
        int nblocks = (C + NORM_COL_BLOCK - 1) / NORM_COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)N * C > 16384)
        for (int blk = 0; blk < nblocks; blk++) {
            int c0 = blk * NORM_COL_BLOCK;
            int nc = C - c0 < NORM_COL_BLOCK ? C - c0 : NORM_COL_BLOCK;
            double acc_w[NORM_COL_BLOCK] = {0}, acc_b[NORM_COL_BLOCK] = {0};
            for (int r = 0; r < N; r++) {
                const float *xr = x + (size_t)r * C + c0, *dr = dout + (size_t)r * C + c0;
                float m = mean[r], rs = rstd[r];
                for (int j = 0; j < nc; j++) {
                    float n = (xr[j] - m) * rs;
                    acc_w[j] += (double)(n * dr[j]);
                    acc_b[j] += dr[j];
                }
            }
            for (int j = 0; j < nc; j++) {
                if (dw) dw[c0 + j] += (float)acc_w[j];
                if (dbias) dbias[c0 + j] += (float)acc_b[j];
            }
        }
    }
}

void cpu_rmsnorm_forward(fp8t_backend *b, float *out, float *rstd, const float *x, const float *w,
                         int N, int C, float eps) {
    (void)b;
#pragma omp parallel for schedule(static) if ((long)N * C > 16384)
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * C; /* [C] */
        float *outr = out + (size_t)r * C;   /* [C] */
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        float rs = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++) outr[c] = xr[c] * rs * w[c];
        if (rstd) rstd[r] = rs;
    }
}

void cpu_rmsnorm_backward(fp8t_backend *b, float *dx, float *dw, const float *dout,
                          const float *x, const uint16_t *x16, const float *w, const float *rstd,
                          int N, int C) {
    if (N <= 0 || C <= 0) return;
    x = cpu_bf16_widen(b, CPU_SCRATCH_NORM_X, x, x16, (size_t)N * C);
    /* dx += rstd * (dnorm - norm * mean(dnorm * norm)), dnorm = w * dout, norm = x * rstd */
    if (dx) {
#pragma omp parallel for schedule(static) if ((long)N * C > 16384)
        for (int r = 0; r < N; r++) {
            const float *xr = x + (size_t)r * C, *dr = dout + (size_t)r * C; /* [C] */
            float *dxr = dx + (size_t)r * C;                                 /* [C] */
            float rs = rstd[r];
            double sum_dn_n = 0.0;
            for (int c = 0; c < C; c++) sum_dn_n += (double)(w[c] * dr[c]) * (xr[c] * rs);
            float mean_dn_n = (float)(sum_dn_n / C);
            for (int c = 0; c < C; c++) {
                float n = xr[c] * rs;
                dxr[c] += (w[c] * dr[c] - n * mean_dn_n) * rs;
            }
        }
    }
    if (dw) {
        int nblocks = (C + NORM_COL_BLOCK - 1) / NORM_COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)N * C > 16384)
        for (int blk = 0; blk < nblocks; blk++) {
            int c0 = blk * NORM_COL_BLOCK;
            int nc = C - c0 < NORM_COL_BLOCK ? C - c0 : NORM_COL_BLOCK;
            double acc_w[NORM_COL_BLOCK] = {0};
            for (int r = 0; r < N; r++) {
                const float *xr = x + (size_t)r * C + c0, *dr = dout + (size_t)r * C + c0;
                float rs = rstd[r];
                for (int j = 0; j < nc; j++) acc_w[j] += (double)(xr[j] * rs * dr[j]);
            }
            for (int j = 0; j < nc; j++) dw[c0 + j] += (float)acc_w[j];
        }
    }
}
