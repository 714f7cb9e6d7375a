/* CUDA backend — LayerNorm and RMSNorm, forward and backward, and deterministic column sums.
 *
 * Fast paths (C a multiple of 4, every row pointer 16-byte aligned; the common case):
 *   - forward: one warp per row, the row held in registers (V float4 per lane), so x is read
 *     from memory once with 16-byte loads and the output is written with 16-byte stores;
 *     C <= 4096.
 *   - backward: one block per chunk of rows, the block's threads spread over one row at a
 *     time (V float4 per thread, at most 256 threads). Each row is read once: x and dout feed
 *     both the dx sums (a block reduction in a fixed order) and the thread's running column
 *     sums for dw/dbias, which are written as one partial per chunk; a second kernel adds the
 *     partials in a fixed tree. The separate column-sum pass over x and dout is gone; C <= 4096.
 *   - column sums (bias_backward): float4 loads, 128-row partials, the same finishing kernel.
 * Everything else (other C, unaligned pointers) takes the original kernels below, which work
 * for every shape: forward and dx one warp per row with scalar loads (rows are short, so the
 * repeated passes over a row hit L1); column sums in two fixed-order passes: each block sums
 * a fixed chunk of COL_CHUNK rows per column into partial[chunk][c], then one thread per
 * column adds the partials in chunk order.
 *
 * Determinism: no atomics. Every reduction is cut into pieces that depend on N and C only
 * (rows per chunk from N, threads per row from C, never from the GPU's SM count) and the
 * pieces are combined in a fixed order, so results depend only on N and C. The formulas and
 * the operation order of each element are the original kernels' (the LayerNorm dx without
 * FMA contraction, as the CPU computes it). */
#include "backend/cuda/cuda_common.cuh"

#define NORM_THREADS 256 /* 8 warps = 8 rows per block */
#define COL_CHUNK 64     /* rows per column-sum partial */
#define COL_THREADS 128

/* fast paths */
#define FWD_VEC_THREADS 128 /* forward: 4 warps = 4 rows per block */
#define FWD_VEC_MAX_V 32    /* float4 per lane: C <= 32 * 32 * 4 = 4096 */
#define BWD_VEC_MAX_THREADS 256
#define BWD_VEC_MAX_V 4 /* float4 per thread: C <= 256 * 4 * 4 = 4096 */
#define CS_COLS4 32     /* column sums: float4 columns per block (128 columns) */
#define CS_LANES 8      /* ... rows summed side by side per block */
#define CS_ROWS_PER_LANE 16
#define CS_CHUNK (CS_LANES * CS_ROWS_PER_LANE) /* 128 rows per partial */
#define FIN_COLS4 8                            /* finishing: float4 columns per block */
#define FIN_LANES 32 /* ... partials summed side by side (a power of 2) */

enum { NORM_LN = 0, NORM_RMS = 1 };

/* float4 <-> four consecutive floats of a register array (indices are compile-time constants
 * after unrolling, so the arrays stay in registers) */
__device__ __forceinline__ void f4_unpack(float *dst, float4 v) {
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
}
__device__ __forceinline__ float4 f4_pack(const float *src) {
    return make_float4(src[0], src[1], src[2], src[3]);
}

/* ---------------------------------------------------------------------------------------- */
/* forward */

__global__ void layernorm_forward_kernel(float *out, float *mean_out, float *rstd_out,
                                         const float *__restrict__ x, const float *__restrict__ w,
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

/* Lane l's part of row `row` of x [N, C]: float4 columns l, l + 32, ..., l + 32 (V-1) (zeros
 * past C / 4), and the row's statistics from those registers: the original kernels' formulas
 * (two-pass variance). */
template <int V, int MODE>
__device__ __forceinline__ void
norm_row_load(float (&v)[4 * V], float &mean, float &rstd, const float *x, int row, int C,
              float eps, int lane, const float *__restrict__ x2 = nullptr,
              float *sum_out = nullptr, const float *__restrict__ x2b = nullptr,
              uint16_t *sum16 = nullptr) {
    const int C4 = C >> 2;
    const float4 *x4 = reinterpret_cast<const float4 *>(x + (size_t)row * C); /* [C4] */
#pragma unroll
    for (int i = 0; i < V; i++) {
        int q = lane + 32 * i;
        f4_unpack(v + 4 * i, q < C4 ? x4[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
    }
    if (x2) { /* the norm's input is x + x2 (add's arithmetic), or with x2b [C] x + (x2 + x2b)
               * (add_bias's), written to sum_out when it is given (and to sum16 as BF16) */
        const float4 *y4 = reinterpret_cast<const float4 *>(x2 + (size_t)row * C);
        const float4 *yb4 = reinterpret_cast<const float4 *>(x2b);
        float4 *s4 = sum_out ? reinterpret_cast<float4 *>(sum_out + (size_t)row * C) : nullptr;
        /* every load of the row before any store: sum_out may be x itself, so a store between
         * two loads holds the second until the first's round trip (a chain of memory latencies
         * per row, what a decode step's few rows pay in full) */
#pragma unroll
        for (int i = 0; i < V; i++) {
            int q = lane + 32 * i;
            if (q < C4) {
                float y[4];
                f4_unpack(y, y4[q]);
                if (yb4) {
                    float yb[4];
                    f4_unpack(yb, yb4[q]);
                    for (int k = 0; k < 4; k++) y[k] = y[k] + yb[k];
                }
                for (int k = 0; k < 4; k++) v[4 * i + k] = v[4 * i + k] + y[k];
            }
        }
#pragma unroll
        for (int i = 0; i < V; i++) {
            int q = lane + 32 * i;
            if (q < C4) {
                if (s4) s4[q] = f4_pack(v + 4 * i);
                if (sum16)
                    reinterpret_cast<uint2 *>(sum16 + (size_t)row * C)[q] = bf16x4_of(
                        make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]));
            }
        }
    }
    mean = 0.0f;
    if (MODE == NORM_LN) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < V; i++)
            if (lane + 32 * i < C4)
#pragma unroll
                for (int k = 0; k < 4; k++) sum += v[4 * i + k];
        mean = warp_sum(sum) / (float)C;
        float var = 0.0f;
#pragma unroll
        for (int i = 0; i < V; i++)
            if (lane + 32 * i < C4)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    float d = v[4 * i + k] - mean;
                    var += d * d;
                }
        var = warp_sum(var) / (float)C;
        rstd = 1.0f / sqrtf(var + eps);
    } else {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < V; i++)
            if (lane + 32 * i < C4)
#pragma unroll
                for (int k = 0; k < 4; k++) ss += v[4 * i + k] * v[4 * i + k];
        rstd = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
    }
}

/* The normalized values of float4 column q (w, bias [C]; bias NULL for RMSNorm) */
template <int MODE>
__device__ __forceinline__ void norm_out4(float (&o)[4], const float *v, float mean, float rstd,
                                          const float4 *w4, const float4 *b4, int q) {
    /* read-only loads: free to run ahead of the output stores of earlier columns (which the
     * compiler cannot prove apart from w and bias) */
    float wk[4], bk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    f4_unpack(wk, __ldg(w4 + q));
    if (MODE == NORM_LN && b4) f4_unpack(bk, __ldg(b4 + q));
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (MODE == NORM_LN) {
            float n = (v[k] - mean) * rstd;
            o[k] = n * wk[k] + bk[k];
        } else {
            o[k] = v[k] * rstd * wk[k];
        }
    }
}

/* Fast forward, LayerNorm (MODE NORM_LN) or RMSNorm (NORM_RMS): one warp per row; lane l
 * holds the row's float4 columns l, l + 32, ..., l + 32 (V-1) in registers. */
template <int V, int MODE>
__global__ void __launch_bounds__(FWD_VEC_THREADS)
    norm_forward_vec_kernel(float *out, float *mean_out, float *rstd_out,
                            const float *__restrict__ x, const float *__restrict__ w,
                            const float *__restrict__ bias, int N, int C, float eps) {
    int row = blockIdx.x * (FWD_VEC_THREADS / 32) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const int C4 = C >> 2;
    float v[4 * V], mean, rstd; /* the row */
    norm_row_load<V, MODE>(v, mean, rstd, x, row, C, eps, lane);
    const float4 *w4 = reinterpret_cast<const float4 *>(w);    /* [C4] */
    const float4 *b4 = reinterpret_cast<const float4 *>(bias); /* [C4] or NULL */
    float4 *o4 = reinterpret_cast<float4 *>(out + (size_t)row * C);
#pragma unroll
    for (int i = 0; i < V; i++) {
        int q = lane + 32 * i;
        if (q < C4) {
            float o[4];
            norm_out4<MODE>(o, v + 4 * i, mean, rstd, w4, b4, q);
            o4[q] = f4_pack(o);
        }
    }
    if (lane == 0) {
        if (MODE == NORM_LN && mean_out) mean_out[row] = mean;
        if (rstd_out) rstd_out[row] = rstd;
    }
}

/* The same values rounded to BF16 into a BF16 operand out [pad8(N), C] (C % 8 == 0: no padding
 * columns; rows >= N zero), their amax max-accumulated into *amax_out (may be NULL): the bits
 * of the FP32 kernel followed by to_bf16. With x2, the input is x + x2, also written to
 * sum_out (add, then the norm). Warps walk rows with a grid stride (a capped grid:
 * one amax atomic per block). */
template <int V, int MODE>
__global__ void __launch_bounds__(FWD_VEC_THREADS)
    norm_forward_bf16_vec_kernel(uint2 *out, float *amax_out, float *mean_out, float *rstd_out,
                                 const float *__restrict__ x, const float *__restrict__ w,
                                 const float *__restrict__ bias, int N, int rows_out, int C,
                                 float eps, const float *__restrict__ x2, float *sum_out,
                                 uint16_t *sum16) {
    const int lane = threadIdx.x & 31, C4 = C >> 2;
    const float4 *w4 = reinterpret_cast<const float4 *>(w);    /* [C4] */
    const float4 *b4 = reinterpret_cast<const float4 *>(bias); /* [C4] or NULL */
    float am = 0.0f;
    for (int row = blockIdx.x * (FWD_VEC_THREADS / 32) + (threadIdx.x >> 5); row < rows_out;
         row += gridDim.x * (FWD_VEC_THREADS / 32)) {
        uint2 *o2 = out + (size_t)row * C4; /* 4 BF16 per float4 column */
        if (row >= N) {                     /* a padding row */
            for (int q = lane; q < C4; q += 32) o2[q] = make_uint2(0u, 0u);
            continue;
        }
        float v[4 * V], mean, rstd;
        norm_row_load<V, MODE>(v, mean, rstd, x, row, C, eps, lane, x2, sum_out, nullptr, sum16);
#pragma unroll
        for (int i = 0; i < V; i++) {
            int q = lane + 32 * i;
            if (q < C4) {
                float o[4];
                norm_out4<MODE>(o, v + 4 * i, mean, rstd, w4, b4, q);
                for (int k = 0; k < 4; k++) am = amax_merge_dev(am, o[k]);
                __nv_bfloat162 p0 = __floats2bfloat162_rn(o[0], o[1]);
                __nv_bfloat162 p1 = __floats2bfloat162_rn(o[2], o[3]);
                o2[q] = make_uint2(*(unsigned *)&p0, *(unsigned *)&p1);
            }
        }
        if (lane == 0) {
            if (MODE == NORM_LN && mean_out) mean_out[row] = mean;
            if (rstd_out) rstd_out[row] = rstd;
        }
    }
    if (amax_out) {
        am = block_amax(am);
        if (threadIdx.x == 0) atomic_amax_merge(amax_out, am);
    }
}

/* Launches the fast forward when the shape allows it; returns 0 (nothing launched) otherwise. */
template <int MODE>
static int norm_forward_vec(cudaStream_t st, float *out, float *mean, float *rstd, const float *x,
                            const float *w, const float *bias, int N, int C, float eps) {
    if (C % 4 != 0 || !aligned16(out) || !aligned16(x) || !aligned16(w) ||
        (bias && !aligned16(bias)))
        return 0;
    int per_lane = (int)cdiv_u((size_t)(C / 4), 32); /* float4 per lane */
    unsigned grid = cdiv_u((size_t)N, FWD_VEC_THREADS / 32);
#define FWD_VEC_CASE(V)                                                                          \
    if (per_lane <= (V)) {                                                                       \
        norm_forward_vec_kernel<V, MODE>                                                         \
            <<<grid, FWD_VEC_THREADS, 0, st>>>(out, mean, rstd, x, w, bias, N, C, eps);          \
        return 1;                                                                                \
    }
    FWD_VEC_CASE(1)
    FWD_VEC_CASE(2)
    FWD_VEC_CASE(4)
    FWD_VEC_CASE(6)
    FWD_VEC_CASE(8)
    FWD_VEC_CASE(12)
    FWD_VEC_CASE(16)
    FWD_VEC_CASE(24)
    FWD_VEC_CASE(FWD_VEC_MAX_V)
#undef FWD_VEC_CASE
    return 0;
}

void cuda_layernorm_forward(fp8t_backend *b, float *out, float *mean, float *rstd, const float *x,
                            const float *w, const float *bias, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    cuda_state *s = cuda_of(b);
    if (!norm_forward_vec<NORM_LN>(s->stream, out, mean, rstd, x, w, bias, N, C, eps)) {
        int rows_per_block = NORM_THREADS / 32;
        layernorm_forward_kernel<<<cdiv_u(N, rows_per_block), NORM_THREADS, 0, s->stream>>>(
            out, mean, rstd, x, w, bias, N, C, eps);
    }
    CUDA_LAUNCH_CHECK(s);
}

/* [add, then] LayerNorm (MODE NORM_LN) or RMSNorm (NORM_RMS: mean and bias NULL) straight into
 * a BF16 operand where the fast kernel takes the shape (C % 8 == 0, aligned pointers,
 * C <= 4096); otherwise the FP32 result through scratch and to_bf16. x2 (may be NULL): the
 * input is x + x2, written to sum_out (and as BF16 to sum16, may be NULL). */
template <int MODE>
static void norm_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, float *mean, float *rstd,
                      float *sum_out, uint16_t *sum16, const float *x, const float *x2,
                      const float *w, const float *bias, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    cuda_state *s = cuda_of(b);
    const int per_lane = (int)cdiv_u((size_t)(C / 4), 32); /* float4 per lane */
    if (s->plain || C % 8 != 0 || !aligned16(out) || !aligned16(x) || !aligned16(w) ||
        (bias && !aligned16(bias)) || (x2 && (!aligned16(x2) || !aligned16(sum_out))) ||
        !aligned8(sum16) || per_lane > FWD_VEC_MAX_V) {
        if (x2) cuda_add_bias(b, sum_out, sum16, x, x2, NULL, N, C);
        float *y = (float *)cuda_scratch(b, SCR_ACT, (size_t)N * C * sizeof(float));
        if (MODE == NORM_LN)
            cuda_layernorm_forward(b, y, mean, rstd, x2 ? sum_out : x, w, bias, N, C, eps);
        else
            cuda_rmsnorm_forward(b, y, rstd, x2 ? sum_out : x, w, N, C, eps);
        cuda_to_bf16_operand(b, out, amax_out, y, N, C);
        return;
    }
    const int rows_out = fp8t_bf16_pad(N);
    size_t want = cdiv_u((size_t)rows_out, FWD_VEC_THREADS / 32), cap = (size_t)s->num_sms * 16;
    unsigned grid = (unsigned)(want < cap ? want : cap);
#define FWD16_CASE(V)                                                                            \
    if (per_lane <= (V)) {                                                                       \
        norm_forward_bf16_vec_kernel<V, MODE><<<grid, FWD_VEC_THREADS, 0, s->stream>>>(          \
            (uint2 *)out, amax_out, mean, rstd, x, w, bias, N, rows_out, C, eps, x2, sum_out,    \
            x2 ? sum16 : NULL);                                                                  \
        CUDA_LAUNCH_CHECK(s);                                                                    \
        return;                                                                                  \
    }
    FWD16_CASE(1)
    FWD16_CASE(2)
    FWD16_CASE(4)
    FWD16_CASE(6)
    FWD16_CASE(8)
    FWD16_CASE(12)
    FWD16_CASE(16)
    FWD16_CASE(24)
    FWD16_CASE(FWD_VEC_MAX_V)
#undef FWD16_CASE
}

void cuda_layernorm_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, float *mean,
                                 float *rstd, const float *x, const float *w, const float *bias,
                                 int N, int C, float eps) {
    norm_bf16<NORM_LN>(b, out, amax_out, mean, rstd, NULL, NULL, x, NULL, w, bias, N, C, eps);
}

void cuda_add_layernorm_forward_bf16(fp8t_backend *b, float *sum, uint16_t *sum16, uint16_t *out,
                                     float *amax_out, float *mean, float *rstd, const float *a,
                                     const float *c, const float *w, const float *bias, int N,
                                     int C, float eps) {
    norm_bf16<NORM_LN>(b, out, amax_out, mean, rstd, sum, sum16, a, c, w, bias, N, C, eps);
}

void cuda_rmsnorm_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, float *rstd,
                               const float *x, const float *w, int N, int C, float eps) {
    norm_bf16<NORM_RMS>(b, out, amax_out, NULL, rstd, NULL, NULL, x, NULL, w, NULL, N, C, eps);
}

void cuda_add_rmsnorm_forward_bf16(fp8t_backend *b, float *sum, uint16_t *sum16, uint16_t *out,
                                   float *amax_out, float *rstd, const float *a, const float *c,
                                   const float *w, int N, int C, float eps) {
    norm_bf16<NORM_RMS>(b, out, amax_out, NULL, rstd, sum, sum16, a, c, w, NULL, N, C, eps);
}

void cuda_rmsnorm_forward(fp8t_backend *b, float *out, float *rstd, const float *x,
                          const float *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    cuda_state *s = cuda_of(b);
    if (!norm_forward_vec<NORM_RMS>(s->stream, out, NULL, rstd, x, w, NULL, N, C, eps)) {
        int rows_per_block = NORM_THREADS / 32;
        rmsnorm_forward_kernel<<<cdiv_u(N, rows_per_block), NORM_THREADS, 0, s->stream>>>(
            out, rstd, x, w, N, C, eps);
    }
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* add_norm_operand (inference): [a + (y + ybias) ->] norm -> the next GEMM's operand */

/* The fast kernel: norm_forward_bf16_vec_kernel's row walk with the input a (+ (y + ybias)),
 * sum_out may be a itself (the residual stream updated in place: a lane loads its part of the
 * row before it writes it, and no other lane touches it; hence no __restrict__ on a),
 * the values written as FP8 codes quantized with *scale (FP8; [N, C], no padding rows) or as a
 * BF16 operand (C % 8 == 0: [pad8(N), C], padding rows zero). */
template <int V, int MODE, bool FP8>
__global__ void __launch_bounds__(FWD_VEC_THREADS)
    add_norm_operand_vec_kernel(void *out, float *sum_out, const float *a,
                                const float *__restrict__ y, const float *__restrict__ yb,
                                const float *__restrict__ w, const float *__restrict__ bias,
                                int N, int rows_out, int C, float eps,
                                const float *__restrict__ scale_p, fp8_format fmt) {
    const int lane = threadIdx.x & 31, C4 = C >> 2;
    const float4 *w4 = reinterpret_cast<const float4 *>(w);    /* [C4] */
    const float4 *b4 = reinterpret_cast<const float4 *>(bias); /* [C4] or NULL */
    const float scale = FP8 ? *scale_p : 1.0f;
    for (int row = blockIdx.x * (FWD_VEC_THREADS / 32) + (threadIdx.x >> 5); row < rows_out;
         row += gridDim.x * (FWD_VEC_THREADS / 32)) {
        if (row >= N) { /* a BF16 operand's padding row */
            uint2 *o2 = reinterpret_cast<uint2 *>(out) + (size_t)row * C4;
            for (int q = lane; q < C4; q += 32) o2[q] = make_uint2(0u, 0u);
            continue;
        }
        float v[4 * V], mean, rstd;
        norm_row_load<V, MODE>(v, mean, rstd, a, row, C, eps, lane, y, sum_out, yb);
#pragma unroll
        for (int i = 0; i < V; i++) {
            int q = lane + 32 * i;
            if (q < C4) {
                float o[4];
                norm_out4<MODE>(o, v + 4 * i, mean, rstd, w4, b4, q);
                if (FP8) {
                    reinterpret_cast<uint32_t *>(out)[(size_t)row * C4 + q] = fp8x4_enc_dev(
                        o[0] * scale, o[1] * scale, o[2] * scale, o[3] * scale, fmt);
                } else {
                    __nv_bfloat162 p0 = __floats2bfloat162_rn(o[0], o[1]);
                    __nv_bfloat162 p1 = __floats2bfloat162_rn(o[2], o[3]);
                    reinterpret_cast<uint2 *>(out)[(size_t)row * C4 + q] =
                        make_uint2(*(unsigned *)&p0, *(unsigned *)&p1);
                }
            }
        }
    }
}

template <int MODE, bool FP8>
static int add_norm_operand_vec(cuda_state *s, void *out, float *sum, const float *a,
                                const float *y, const float *yb, const float *w,
                                const float *bias, int N, int C, float eps, const float *scale,
                                fp8_format fmt) {
    const int per_lane = (int)cdiv_u((size_t)(C / 4), 32); /* float4 per lane */
    const int rows_out = FP8 ? N : fp8t_bf16_pad(N);
    size_t want = cdiv_u((size_t)rows_out, FWD_VEC_THREADS / 32), cap = (size_t)s->num_sms * 16;
    unsigned grid = (unsigned)(want < cap ? want : cap);
#define ANO_CASE(V)                                                                              \
    if (per_lane <= (V)) {                                                                       \
        add_norm_operand_vec_kernel<V, MODE, FP8><<<grid, FWD_VEC_THREADS, 0, s->stream>>>(      \
            out, sum, a, y, yb, w, bias, N, rows_out, C, eps, scale, fmt);                       \
        return 1;                                                                                \
    }
    ANO_CASE(1)
    ANO_CASE(2)
    ANO_CASE(4)
    ANO_CASE(6)
    ANO_CASE(8)
    ANO_CASE(12)
    ANO_CASE(16)
    ANO_CASE(24)
    ANO_CASE(FWD_VEC_MAX_V)
#undef ANO_CASE
    return 0;
}

void cuda_add_norm_operand(fp8t_backend *b, void *out, float *sum, const float *a, const float *y,
                           const float *ybias, const float *w, const float *bias, int rms,
                           int rows, int cols, float eps, const float *scale, fp8_format fmt) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    const int N = rows, C = cols;
    const int fast = !s->plain && C % (scale ? 4 : 8) == 0 &&
                     (int)cdiv_u((size_t)(C / 4), 32) <= FWD_VEC_MAX_V && aligned16(out) &&
                     aligned16(a) && aligned16(w) && (!bias || aligned16(bias)) &&
                     (!y || aligned16(y)) && (!ybias || aligned16(ybias)) &&
                     (!sum || aligned16(sum));
    if (fast) {
        int done;
        if (rms)
            done =
                scale ? add_norm_operand_vec<NORM_RMS, true>(s, out, y ? sum : NULL, a, y, ybias,
                                                             w, NULL, N, C, eps, scale, fmt)
                      : add_norm_operand_vec<NORM_RMS, false>(s, out, y ? sum : NULL, a, y, ybias,
                                                              w, NULL, N, C, eps, scale, fmt);
        else
            done = scale
                       ? add_norm_operand_vec<NORM_LN, true>(s, out, y ? sum : NULL, a, y, ybias,
                                                             w, bias, N, C, eps, scale, fmt)
                       : add_norm_operand_vec<NORM_LN, false>(s, out, y ? sum : NULL, a, y, ybias,
                                                              w, bias, N, C, eps, scale, fmt);
        if (done) {
            CUDA_LAUNCH_CHECK(s);
            return;
        }
    }
    /* the unfused ops: add (into sum, or scratch), the FP32 norm in scratch, the operand */
    const size_t n = (size_t)N * C;
    const float *x = a;
    if (y) {
        float *t = sum ? sum : (float *)cuda_scratch(b, SCR_GEMM_C, n * sizeof(float));
        cuda_add_bias(b, t, NULL, a, y, ybias, N, C); /* no ybias: add's sum */
        x = t;
    }
    float *o = (float *)cuda_scratch(b, SCR_ACT, n * sizeof(float));
    if (rms)
        cuda_rmsnorm_forward(b, o, NULL, x, w, N, C, eps);
    else
        cuda_layernorm_forward(b, o, NULL, NULL, x, w, bias, N, C, eps);
    if (scale)
        cuda_quantize(b, (uint8_t *)out, NULL, NULL, o, N, C, fmt, scale);
    else
        cuda_to_bf16_operand(b, (uint16_t *)out, NULL, o, N, C);
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
__global__ void
colsum_partials_kernel(float *part0, float *part1, const float *__restrict__ a,
                       const float *__restrict__ x, const float *__restrict__ mean,
                       const float *__restrict__ rstd, int N, int C, int chunk_rows) {
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
static void column_sums(fp8t_backend *b, float *out0, float *out1, const float *a, const float *x,
                        const float *mean, const float *rstd, int N, int C) {
    cuda_state *s = cuda_of(b);
    int chunk = col_chunk_rows(N);
    int nchunks = (N + chunk - 1) / chunk;
    size_t per = (size_t)nchunks * C;
    float *part0 = (float *)cuda_scratch(b, SCR_REDUCE, per * 2 * sizeof(float));
    float *part1 = part0 + per;
    dim3 grid(cdiv_u(C, COL_THREADS), nchunks);
    colsum_partials_kernel<MODE>
        <<<grid, COL_THREADS, 0, s->stream>>>(part0, part1, a, x, mean, rstd, N, C, chunk);
    CUDA_LAUNCH_CHECK(s);
    colsum_finish_kernel<<<cdiv_u(C, COL_THREADS), COL_THREADS, 0, s->stream>>>(
        out0, MODE == COLSUM_LN ? out1 : NULL, part0, part1, nchunks, C);
    CUDA_LAUNCH_CHECK(s);
}

/* ---- fast paths (C % 4 == 0, 16-byte aligned rows) ---- */

/* out0[c] += sum_k part0[k][c] and out1 likewise (either output may be NULL; part1 is read
 * only for out1): each column's nchunks partials are summed in double by FIN_LANES threads
 * (thread l takes partials l, l + FIN_LANES, ...), whose sums are then added in a fixed tree.
 * The order depends on nchunks alone. part0/part1 [nchunks, C4] float4, out0/out1 [4 * C4]. */
__global__ void __launch_bounds__(FIN_COLS4 *FIN_LANES)
    colsum_finish_vec_kernel(float *out0, float *out1, const float4 *__restrict__ part0,
                             const float4 *__restrict__ part1, int nchunks, int C4) {
    __shared__ double sh[2][FIN_LANES][4 * FIN_COLS4];
    int tx = threadIdx.x, ty = threadIdx.y;
    int q = blockIdx.x * FIN_COLS4 + tx;
    double s0[4] = {0.0, 0.0, 0.0, 0.0}, s1[4] = {0.0, 0.0, 0.0, 0.0};
    if (q < C4) {
#pragma unroll 4
        for (int k = ty; k < nchunks; k += FIN_LANES) {
            if (out0) {
                float4 v = part0[(size_t)k * C4 + q];
                s0[0] += v.x, s0[1] += v.y, s0[2] += v.z, s0[3] += v.w;
            }
            if (out1) {
                float4 v = part1[(size_t)k * C4 + q];
                s1[0] += v.x, s1[1] += v.y, s1[2] += v.z, s1[3] += v.w;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < 4; k++) sh[0][ty][4 * tx + k] = s0[k], sh[1][ty][4 * tx + k] = s1[k];
    __syncthreads();
    for (int half = FIN_LANES / 2; half > 0; half >>= 1) {
        if (ty < half) {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                sh[0][ty][4 * tx + k] += sh[0][ty + half][4 * tx + k];
                sh[1][ty][4 * tx + k] += sh[1][ty + half][4 * tx + k];
            }
        }
        __syncthreads();
    }
    if (ty == 0 && q < C4) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (out0) out0[4 * q + k] += (float)sh[0][0][4 * tx + k];
            if (out1) out1[4 * q + k] += (float)sh[1][0][4 * tx + k];
        }
    }
}

static void colsum_finish_vec(cuda_state *s, float *out0, float *out1, const float *part0,
                              const float *part1, int nchunks, int C4) {
    colsum_finish_vec_kernel<<<cdiv_u((size_t)C4, FIN_COLS4), dim3(FIN_COLS4, FIN_LANES), 0,
                               s->stream>>>(out0, out1, reinterpret_cast<const float4 *>(part0),
                                            reinterpret_cast<const float4 *>(part1), nchunks, C4);
    CUDA_LAUNCH_CHECK(s);
}

/* part[chunk][c] = sum of a[r][c] over the chunk's CS_CHUNK rows: thread (tx, ty) sums rows
 * r0 + ty, r0 + ty + CS_LANES, ... of float4 column q in order (all its loads issued before
 * the first add), then the CS_LANES sums are added in lane order. a [N, 4 * C4],
 * part [nchunks, C4] float4. */
__global__ void __launch_bounds__(CS_COLS4 *CS_LANES)
    colsum_vec_partials_kernel(float4 *part, const float4 *__restrict__ a, int N, int C4) {
    __shared__ float4 sh[CS_LANES][CS_COLS4];
    int tx = threadIdx.x, ty = threadIdx.y;
    int q = blockIdx.x * CS_COLS4 + tx;
    int chunk = blockIdx.y, r0 = chunk * CS_CHUNK;
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (q < C4) {
        float4 v[CS_ROWS_PER_LANE];
#pragma unroll
        for (int j = 0; j < CS_ROWS_PER_LANE; j++) {
            int r = r0 + ty + CS_LANES * j;
            v[j] = r < N ? a[(size_t)r * C4 + q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int j = 0; j < CS_ROWS_PER_LANE; j++)
            s.x += v[j].x, s.y += v[j].y, s.z += v[j].z, s.w += v[j].w;
    }
    sh[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && q < C4) {
        float4 t = sh[0][tx];
#pragma unroll
        for (int l = 1; l < CS_LANES; l++) {
            float4 u = sh[l][tx];
            t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
        }
        part[(size_t)chunk * C4 + q] = t;
    }
}

/* Rows per chunk of the fused backward: about 512..1024 chunks (enough blocks to fill the
 * GPU, few partials to add up), 8..256 rows. A function of N alone. */
static int bwd_chunk_rows(int N) {
    int rows = 32;
    while (rows < 256 && N / rows > 1024) rows *= 2;
    while (rows > 8 && N / rows < 512) rows /= 2;
    return rows;
}

/* Fused backward of LayerNorm (MODE NORM_LN) or RMSNorm (NORM_RMS) over one chunk of rows
 * [blockIdx.x * chunk_rows, +chunk_rows): the block's threads share one row at a time, thread
 * t holding float4 columns t, t + T, ..., t + (V-1) T (T = blockDim.x, a multiple of 32,
 * T * V >= C/4).
 *   dx (if non-NULL): dx += the original dx kernels' formula (LN: same operations, no FMA
 *     contraction in the final expression); the two row sums are each thread's partial sum,
 *     a warp butterfly, then the warps' sums in warp order.
 *   part_w (if non-NULL): part_w[chunk][c] = sum over the chunk's rows, in order, of
 *     dout * norm (the original column-sum kernels' terms); part_b (LN, if non-NULL) likewise
 *     of dout.
 * dout, x, dx [N, C]; w [C]; mean (LN), rstd [N]; part_w, part_b [nchunks, C]. X16: x is read
 * from its BF16 copy x16 [N, C] (8 bytes per float4 group) and widened, exactly. */
template <int V, int MODE, bool X16>
__global__ void __launch_bounds__(BWD_VEC_MAX_THREADS)
    norm_backward_vec_kernel(float *dx, float *part_w, float *part_b,
                             const float *__restrict__ dout, const float *__restrict__ x,
                             const uint16_t *__restrict__ x16, const float *__restrict__ w,
                             const float *__restrict__ mean, const float *__restrict__ rstd,
                             int N, int C, int chunk_rows) {
    /* per-warp row sums, two buffers used by alternate rows: the one __syncthreads per row
     * also orders a buffer's reads (row k) before its next writes (row k + 2) */
    __shared__ float2 red[2][BWD_VEC_MAX_THREADS / 32];
    const int C4 = C >> 2, T = blockDim.x, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, nwarps = T >> 5;
    const int r0 = blockIdx.x * chunk_rows, r1 = min(N, r0 + chunk_rows);
    const float4 *w4 = reinterpret_cast<const float4 *>(w); /* [C4] */
    float acc_w[4 * V], acc_b[4 * V];                       /* this thread's column sums */
#pragma unroll
    for (int j = 0; j < 4 * V; j++) acc_w[j] = 0.0f, acc_b[j] = 0.0f;
    int buf = 0;
    for (int r = r0; r < r1; r++) {
        const float4 *x4 = X16 ? NULL : reinterpret_cast<const float4 *>(x + (size_t)r * C);
        const uint2 *x2 = X16 ? reinterpret_cast<const uint2 *>(x16 + (size_t)r * C) : NULL;
        const float4 *d4 = reinterpret_cast<const float4 *>(dout + (size_t)r * C); /* [C4] */
        float4 *o4 = dx ? reinterpret_cast<float4 *>(dx + (size_t)r * C) : NULL;   /* [C4] */
        /* every load of the row first (x, dout, w and the dx accumulator), then the math */
        float xv[4 * V], dv[4 * V], wv[4 * V], ov[4 * V];
#pragma unroll
        for (int i = 0; i < V; i++) {
            int q = tid + T * i;
            float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (X16)
                f4_unpack(xv + 4 * i, q < C4 ? f32x4_of_bf16(x2[q]) : zero);
            else
                f4_unpack(xv + 4 * i, q < C4 ? x4[q] : zero);
            f4_unpack(dv + 4 * i, q < C4 ? d4[q] : zero);
            f4_unpack(wv + 4 * i, o4 && q < C4 ? w4[q] : zero);
            f4_unpack(ov + 4 * i, o4 && q < C4 ? o4[q] : zero);
        }
        const float m = MODE == NORM_LN ? mean[r] : 0.0f, rs = rstd[r];
        float s_dn = 0.0f, s_dnn = 0.0f;
#pragma unroll
        for (int i = 0; i < V; i++) {
            if (tid + T * i >= C4) continue;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int j = 4 * i + k;
                /* norm: (x - mean) * rstd is a subtraction then a product, so nothing can
                 * be contracted and it equals the __rn form the LN dx formula uses */
                float n = MODE == NORM_LN ? __fmul_rn(__fsub_rn(xv[j], m), rs) : xv[j] * rs;
                if (part_w) {
                    acc_w[j] += dv[j] * n;
                    if (MODE == NORM_LN) acc_b[j] += dv[j];
                }
                /* LN: the rounded product, as the dx formula below needs it */
                float dn = MODE == NORM_LN ? __fmul_rn(wv[j], dv[j]) : dv[j] * wv[j];
                s_dn += dn;
                s_dnn += dn * n;
                xv[j] = n, dv[j] = dn; /* kept for the dx pass */
            }
        }
        if (!o4) continue; /* uniform over the block */
        float a = MODE == NORM_LN ? warp_sum(s_dn) : 0.0f, c = warp_sum(s_dnn);
        if (nwarps > 1) {
            if (lane == 0) red[buf][warp] = make_float2(a, c);
            __syncthreads();
            float2 t = red[buf][0];
            a = t.x, c = t.y;
            for (int k = 1; k < nwarps; k++) {
                t = red[buf][k];
                a += t.x, c += t.y;
            }
            buf ^= 1;
        }
        const float dn_mean = a / (float)C, dnn_mean = c / (float)C;
#pragma unroll
        for (int i = 0; i < V; i++) {
            int q = tid + T * i;
            if (q >= C4) continue;
            float o[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int j = 4 * i + k;
                if (MODE == NORM_LN) {
                    /* the CPU backend's exact operation order, without FMA contraction (see
                     * layernorm_backward_dx_kernel) */
                    float t = __fsub_rn(__fsub_rn(dv[j], dn_mean), __fmul_rn(xv[j], dnn_mean));
                    o[k] = __fadd_rn(ov[j], __fmul_rn(t, rs));
                } else {
                    o[k] = ov[j] + (dv[j] - xv[j] * dnn_mean) * rs;
                }
            }
            o4[q] = f4_pack(o);
        }
    }
    if (!part_w) return;
    float4 *pw = reinterpret_cast<float4 *>(part_w + (size_t)blockIdx.x * C);
    float4 *pb = part_b ? reinterpret_cast<float4 *>(part_b + (size_t)blockIdx.x * C) : NULL;
#pragma unroll
    for (int i = 0; i < V; i++) {
        int q = tid + T * i;
        if (q >= C4) continue;
        pw[q] = f4_pack(acc_w + 4 * i);
        if (MODE == NORM_LN && pb) pb[q] = f4_pack(acc_b + 4 * i);
    }
}

/* Fast backward (dx += ..., dw += ..., dbias += ..., LN only for dbias); returns 0 (nothing
 * launched) when the shape or the pointers do not allow it. */
template <int MODE>
static int norm_backward_vec(fp8t_backend *b, float *dx, float *dw, float *dbias,
                             const float *dout, const float *x, const uint16_t *x16,
                             const float *w, const float *mean, const float *rstd, int N, int C) {
    if (C % 4 != 0) return 0;
    const int C4 = C / 4;
    const int V = C4 <= BWD_VEC_MAX_THREADS                   ? 1
                  : C4 <= 2 * BWD_VEC_MAX_THREADS             ? 2
                  : C4 <= BWD_VEC_MAX_V * BWD_VEC_MAX_THREADS ? BWD_VEC_MAX_V
                                                              : 0;
    if (!V || !aligned16(dout) || !aligned16(x) || !aligned8(x16) ||
        (dx && (!aligned16(dx) || !aligned16(w))))
        return 0;
    if (MODE == NORM_RMS) dbias = NULL;
    cuda_state *s = cuda_of(b);
    const int want_cols = dw || dbias;
    if (!dx && !want_cols) return 1;
    const int threads = (int)align_up(cdiv_u((size_t)C4, (size_t)V), 32);
    const int chunk_rows = bwd_chunk_rows(N);
    const int nchunks = (int)cdiv_u((size_t)N, (size_t)chunk_rows);
    float *part_w = NULL, *part_b = NULL;
    if (want_cols) {
        size_t per = (size_t)nchunks * C;
        part_w = (float *)cuda_scratch(b, SCR_REDUCE, per * (dbias ? 2 : 1) * sizeof(float));
        part_b = dbias ? part_w + per : NULL;
    }
#define BWD_VEC_LAUNCH(VV)                                                                       \
    if (x16)                                                                                     \
        norm_backward_vec_kernel<VV, MODE, true><<<nchunks, threads, 0, s->stream>>>(            \
            dx, part_w, part_b, dout, NULL, x16, w, mean, rstd, N, C, chunk_rows);               \
    else                                                                                         \
        norm_backward_vec_kernel<VV, MODE, false><<<nchunks, threads, 0, s->stream>>>(           \
            dx, part_w, part_b, dout, x, NULL, w, mean, rstd, N, C, chunk_rows)
    if (V == 1)
        BWD_VEC_LAUNCH(1);
    else if (V == 2)
        BWD_VEC_LAUNCH(2);
    else
        BWD_VEC_LAUNCH(BWD_VEC_MAX_V);
#undef BWD_VEC_LAUNCH
    CUDA_LAUNCH_CHECK(s);
    /* dw NULL: its partials are computed and dropped */
    if (want_cols) colsum_finish_vec(s, dw, dbias, part_w, part_b, nchunks, C4);
    return 1;
}

void cuda_column_sums_finish(fp8t_backend *b, float *colsum, const float *part, int nchunks,
                             int cols) {
    colsum_finish_vec(cuda_of(b), colsum, NULL, part, NULL, nchunks, cols / 4);
}

void cuda_column_sums(fp8t_backend *b, float *colsum, const float *x, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    int nchunks = (int)cdiv_u((size_t)rows, CS_CHUNK);
    if (cols % 4 == 0 && aligned16(x) && nchunks <= 65535) {
        cuda_state *s = cuda_of(b);
        int C4 = cols / 4;
        float *part =
            (float *)cuda_scratch(b, SCR_REDUCE, (size_t)nchunks * cols * sizeof(float));
        dim3 grid(cdiv_u((size_t)C4, CS_COLS4), nchunks);
        colsum_vec_partials_kernel<<<grid, dim3(CS_COLS4, CS_LANES), 0, s->stream>>>(
            reinterpret_cast<float4 *>(part), reinterpret_cast<const float4 *>(x), rows, C4);
        CUDA_LAUNCH_CHECK(s);
        colsum_finish_vec(s, colsum, NULL, part, NULL, nchunks, C4);
        return;
    }
    column_sums<COLSUM_PLAIN>(b, colsum, NULL, x, NULL, NULL, NULL, rows, cols);
}

void cuda_layernorm_backward(fp8t_backend *b, float *dx, float *dw, float *dbias,
                             const float *dout, const float *x, const uint16_t *x16,
                             const float *w, const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    if (norm_backward_vec<NORM_LN>(b, dx, dw, dbias, dout, x, x16, w, mean, rstd, N, C)) return;
    cuda_state *s = cuda_of(b);
    x = cuda_bf16_widen(b, SCR_NORM_X, x, x16, (size_t)N * C);
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
                           const float *x, const uint16_t *x16, const float *w, const float *rstd,
                           int N, int C) {
    if (N <= 0 || C <= 0) return;
    if (norm_backward_vec<NORM_RMS>(b, dx, dw, NULL, dout, x, x16, w, NULL, rstd, N, C)) return;
    cuda_state *s = cuda_of(b);
    x = cuda_bf16_widen(b, SCR_NORM_X, x, x16, (size_t)N * C);
    if (dx) {
        int rows_per_block = NORM_THREADS / 32;
        rmsnorm_backward_dx_kernel<<<cdiv_u(N, rows_per_block), NORM_THREADS, 0, s->stream>>>(
            dx, dout, x, w, rstd, N, C);
        CUDA_LAUNCH_CHECK(s);
    }
    if (dw) column_sums<COLSUM_RMS>(b, dw, NULL, dout, x, NULL, rstd, N, C);
}
