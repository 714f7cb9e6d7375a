/* CUDA backend — LayerNorm and RMSNorm, forward and backward, and deterministic column sums.
 *
 * Forward and the dx part of backward: one warp per row (rows are short: C floats, a few KiB,
 * so the repeated passes over a row hit L1). Weight/bias gradients are column sums over all
 * rows; they are computed without atomics in two fixed-order passes: each block sums a fixed
 * chunk of COL_CHUNK rows per column into partial[chunk][c], then one thread per column adds
 * the partials in chunk order. The result depends only on N and C. */
#include "backend/cuda/cuda_common.cuh"

#define NORM_THREADS 256 /* 8 warps = 8 rows per block */
#define COL_CHUNK 64     /* rows per column-sum partial */
#define COL_THREADS 128

/* ---------------------------------------------------------------------------------------- */
/* forward */

__global__ void layernorm_forward_kernel(float *out, float *mean_out, float *rstd_out,
                                         const float *__restrict__ x,
                                         const float *__restrict__ w,
                                         const float *__restrict__ bias, int N, int C,
                                         float eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *xr = x + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += xr[c];
    float mean = warp_sum(sum) / (float)C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = xr[c] - mean;
        var += d * d;
    }
    var = warp_sum(var) / (float)C;
    float rstd = 1.0f / sqrtf(var + eps);
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float n = (xr[c] - mean) * rstd;
        o[c] = n * w[c] + (bias ? bias[c] : 0.0f);
    }
    if (lane == 0) {
        if (mean_out) mean_out[row] = mean;
        if (rstd_out) rstd_out[row] = rstd;
    }
}

void cuda_layernorm_forward(fp8t_backend *b, float *out, float *mean, float *rstd,
                            const float *x, const float *w, const float *bias, int N, int C,
                            float eps) {
    if (N <= 0 || C <= 0) return;
    cuda_state *s = cuda_of(b);
    int rows_per_block = NORM_THREADS / 32;
    layernorm_forward_kernel<<<cdiv_u(N, rows_per_block), NORM_THREADS, 0, s->stream>>>(
        out, mean, rstd, x, w, bias, N, C, eps);
    CUDA_LAUNCH_CHECK(s);
}

__global__ void rmsnorm_forward_kernel(float *out, float *rstd_out, const float *__restrict__ x,
                                       const float *__restrict__ w, int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *xr = x + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) ss += xr[c] * xr[c];
    float rstd = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = xr[c] * rstd * w[c];
    if (lane == 0 && rstd_out) rstd_out[row] = rstd;
}

void cuda_rmsnorm_forward(fp8t_backend *b, float *out, float *rstd, const float *x,
                          const float *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    cuda_state *s = cuda_of(b);
    int rows_per_block = NORM_THREADS / 32;
    rmsnorm_forward_kernel<<<cdiv_u(N, rows_per_block), NORM_THREADS, 0, s->stream>>>(
        out, rstd, x, w, N, C, eps);
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* backward: dx (warp per row, accumulated) */

__global__ void layernorm_backward_dx_kernel(float *dx, const float *__restrict__ dout,
                                             const float *__restrict__ x,
                                             const float *__restrict__ w,
                                             const float *__restrict__ mean,
                                             const float *__restrict__ rstd, int N, int C) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *xr = x + (size_t)row * C, *dr = dout + (size_t)row * C;
    float m = mean[row], rs = rstd[row];
    float s_dn = 0.0f, s_dnn = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float n = (xr[c] - m) * rs;
        float dn = dr[c] * w[c];
        s_dn += dn;
        s_dnn += dn * n;
    }
    float dn_mean = warp_sum(s_dn) / (float)C;
    float dnn_mean = warp_sum(s_dnn) / (float)C;
    float *o = dx + (size_t)row * C;
    /* the CPU backend's exact operation order, without FMA contraction: the differences of
     * nearly equal terms here are multiplied by rstd, which amplifies a contracted rounding */
    for (int c = lane; c < C; c += 32) {
        float n = __fmul_rn(__fsub_rn(xr[c], m), rs);
        float dn = __fmul_rn(w[c], dr[c]);
        float t = __fsub_rn(__fsub_rn(dn, dn_mean), __fmul_rn(n, dnn_mean));
        o[c] = __fadd_rn(o[c], __fmul_rn(t, rs));
    }
}

__global__ void rmsnorm_backward_dx_kernel(float *dx, const float *__restrict__ dout,
                                           const float *__restrict__ x,
                                           const float *__restrict__ w,
                                           const float *__restrict__ rstd, int N, int C) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *xr = x + (size_t)row * C, *dr = dout + (size_t)row * C;
    float rs = rstd[row];
    float s_dnn = 0.0f;
    for (int c = lane; c < C; c += 32) s_dnn += dr[c] * w[c] * (xr[c] * rs);
    float dnn_mean = warp_sum(s_dnn) / (float)C;
    float *o = dx + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float n = xr[c] * rs;
        o[c] += (dr[c] * w[c] - n * dnn_mean) * rs;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* deterministic column sums */

enum { COLSUM_PLAIN = 0, COLSUM_LN = 1, COLSUM_RMS = 2 };

/* part0[chunk][c] = sum over the chunk's rows of f0(r, c); part1 likewise for f1 (LN only):
 *   PLAIN: f0 = x
 *   LN:    f0 = dout * (x - mean) * rstd  (dw),  f1 = dout  (dbias)
 *   RMS:   f0 = dout * x * rstd           (dw) */
template <int MODE>
__global__ void colsum_partials_kernel(float *part0, float *part1, const float *__restrict__ a,
                                       const float *__restrict__ x,
                                       const float *__restrict__ mean,
                                       const float *__restrict__ rstd, int N, int C,
                                       int chunk_rows) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int chunk = blockIdx.y;
    if (c >= C) return;
    int r0 = chunk * chunk_rows, r1 = min(N, r0 + chunk_rows);
    float s0 = 0.0f, s1 = 0.0f;
    for (int r = r0; r < r1; r++) {
        float v = a[(size_t)r * C + c];
        if (MODE == COLSUM_PLAIN) {
            s0 += v;
        } else if (MODE == COLSUM_LN) {
            s0 += v * ((x[(size_t)r * C + c] - mean[r]) * rstd[r]);
            s1 += v;
        } else {
            s0 += v * (x[(size_t)r * C + c] * rstd[r]);
        }
    }
    part0[(size_t)chunk * C + c] = s0;
    if (MODE == COLSUM_LN) part1[(size_t)chunk * C + c] = s1;
}

__global__ void colsum_finish_kernel(float *out0, float *out1, const float *part0,
                                     const float *part1, int nchunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s0 = 0.0, s1 = 0.0;
    for (int k = 0; k < nchunks; k++) {
        s0 += part0[(size_t)k * C + c];
        if (out1) s1 += part1[(size_t)k * C + c];
    }
    out0[c] += (float)s0;
    if (out1) out1[c] += (float)s1;
}

/* Rows per partial: COL_CHUNK, doubled until the chunk count fits the grid's y limit. A
 * function of N alone, so the summation order is too. */
static int col_chunk_rows(int N) {
    int chunk = COL_CHUNK;
    while ((N + chunk - 1) / chunk > 65535) chunk *= 2;
    return chunk;
}

/* out0 (+= f0 column sums), out1 (+= f1 column sums, LN only, may be NULL) */
template <int MODE>
static void column_sums(fp8t_backend *b, float *out0, float *out1, const float *a,
                        const float *x, const float *mean, const float *rstd, int N, int C) {
    cuda_state *s = cuda_of(b);
    int chunk = col_chunk_rows(N);
    int nchunks = (N + chunk - 1) / chunk;
    size_t per = (size_t)nchunks * C;
    float *part0 = (float *)cuda_scratch(b, SCR_REDUCE, per * 2 * sizeof(float));
    float *part1 = part0 + per;
    dim3 grid(cdiv_u(C, COL_THREADS), nchunks);
    colsum_partials_kernel<MODE><<<grid, COL_THREADS, 0, s->stream>>>(part0, part1, a, x, mean,
                                                                      rstd, N, C, chunk);
    CUDA_LAUNCH_CHECK(s);
    colsum_finish_kernel<<<cdiv_u(C, COL_THREADS), COL_THREADS, 0, s->stream>>>(
        out0, MODE == COLSUM_LN ? out1 : NULL, part0, part1, nchunks, C);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_column_sums(fp8t_backend *b, float *colsum, const float *x, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    column_sums<COLSUM_PLAIN>(b, colsum, NULL, x, NULL, NULL, NULL, rows, cols);
}

void cuda_layernorm_backward(fp8t_backend *b, float *dx, float *dw, float *dbias,
                             const float *dout, const float *x, const float *w,
                             const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    cuda_state *s = cuda_of(b);
    if (dx) {
        int rows_per_block = NORM_THREADS / 32;
        layernorm_backward_dx_kernel<<<cdiv_u(N, rows_per_block), NORM_THREADS, 0, s->stream>>>(
            dx, dout, x, w, mean, rstd, N, C);
        CUDA_LAUNCH_CHECK(s);
    }
    if (dw) {
        /* dbias NULL (no bias): the dbias partials are computed and dropped */
        column_sums<COLSUM_LN>(b, dw, dbias, dout, x, mean, rstd, N, C);
    } else if (dbias) {
        cuda_column_sums(b, dbias, dout, N, C);
    }
}

void cuda_rmsnorm_backward(fp8t_backend *b, float *dx, float *dw, const float *dout,
                           const float *x, const float *w, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    cuda_state *s = cuda_of(b);
    if (dx) {
        int rows_per_block = NORM_THREADS / 32;
        rmsnorm_backward_dx_kernel<<<cdiv_u(N, rows_per_block), NORM_THREADS, 0, s->stream>>>(
            dx, dout, x, w, rstd, N, C);
        CUDA_LAUNCH_CHECK(s);
    }
    if (dw) column_sums<COLSUM_RMS>(b, dw, NULL, dout, x, NULL, rstd, N, C);
}
