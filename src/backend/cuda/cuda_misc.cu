/* CUDA backend — embedding, bias, GELU, SwiGLU, fused softmax + cross-entropy, elementwise
 * arithmetic, deterministic sums, AdamW.
 *
 * Determinism: the embedding backward sorts token positions by token (CUB radix sort, which
 * is stable) and adds each token's rows in position order; the sums use a block count that
 * depends only on n and combine block partials in a fixed order. No floating-point atomics. */
#include <math.h>

#include <cub/device/device_radix_sort.cuh>

#include "backend/cuda/cuda_common.cuh"

#define EW_THREADS 256

static unsigned ew_blocks(cuda_state *s, size_t n, size_t per_thread) {
    size_t want = (n + EW_THREADS * per_thread - 1) / (EW_THREADS * per_thread);
    size_t cap = (size_t)s->num_sms * 16;
    if (want < 1) want = 1;
    return (unsigned)(want < cap ? want : cap);
}

#define GRID_STRIDE(i, n)                                                                        \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (size_t)gridDim.x * blockDim.x)

/* the same from element `start` on: the scalar tail after a float4 body */
#define GRID_STRIDE_FROM(i, start, n)                                                            \
    for (size_t i = (start) + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);            \
         i += (size_t)gridDim.x * blockDim.x)

/* Elementwise kernels work on float4 groups, four times the bytes per load instruction (the
 * scalar versions reached ~2.6 TB/s on an H200): when every pointer of the op is 16-byte
 * aligned, the kernel strides over the n4 = n / 4 groups (group g = elements 4g..4g+3), then
 * its first threads take the n % 4 elements left, in the same launch; otherwise n4 = 0 and the
 * scalar loop covers all n elements. Every element goes through the same __device__ function
 * on both paths, with the same operations in the same order as before vectorization, so the
 * result bits depend neither on the path nor on the alignment. An output may alias an input
 * at the same index: a thread reads its group of every input before it writes the group, and
 * no other thread touches those elements. */
static size_t ew_groups(size_t n, int all_aligned) { return all_aligned ? n / 4 : 0; }

/* blocks for a float4 body of n4 groups (2 per thread before the cap) or a scalar loop */
static unsigned ew_vec_blocks(cuda_state *s, size_t n, size_t n4) {
    return n4 ? ew_blocks(s, n4, 2) : ew_blocks(s, n, 4);
}

/* a float array as float4 groups (16-byte aligned, checked by the caller) */
__host__ __device__ static inline const float4 *as4(const float *p) { return (const float4 *)p; }
__host__ __device__ static inline float4 *as4(float *p) { return (float4 *)p; }

/* ---------------------------------------------------------------------------------------- */
/* embedding */

__global__ void embedding_forward_kernel(float *out, const int *__restrict__ tokens,
                                         const float *__restrict__ wte,
                                         const float *__restrict__ wpe, int T, int C, size_t n) {
    GRID_STRIDE(k, n) {
        size_t i = k / C;
        int c = (int)(k % C);
        int tok = tokens[i];
        /* + 0.0f without wpe, as the CPU: turns -0 into +0 */
        out[k] = wte[(size_t)tok * C + c] + (wpe ? wpe[(size_t)(i % T) * C + c] : 0.0f);
    }
}

__global__ void embedding_forward_vec4_kernel(float4 *out, const int *__restrict__ tokens,
                                              const float4 *__restrict__ wte,
                                              const float4 *__restrict__ wpe, int T, int C4,
                                              size_t n4) {
    GRID_STRIDE(k, n4) {
        size_t i = k / C4;
        int c = (int)(k % C4);
        float4 v = wte[(size_t)tokens[i] * C4 + c];
        float4 p = wpe ? wpe[(size_t)(i % T) * C4 + c] : make_float4(0.f, 0.f, 0.f, 0.f);
        v.x += p.x, v.y += p.y, v.z += p.z, v.w += p.w;
        out[k] = v;
    }
}

void cuda_embedding_forward(fp8t_backend *b, float *out, const int *tokens, const float *wte,
                            const float *wpe, int B, int T, int C) {
    if (B <= 0 || T <= 0 || C <= 0) return;
    cuda_state *s = cuda_of(b);
    size_t n = (size_t)B * T * C;
    if (C % 4 == 0 && aligned16(out) && aligned16(wte) && (!wpe || aligned16(wpe))) {
        embedding_forward_vec4_kernel<<<ew_blocks(s, n / 4, 2), EW_THREADS, 0, s->stream>>>(
            (float4 *)out, tokens, (const float4 *)wte, (const float4 *)wpe, T, C / 4, n / 4);
    } else {
        embedding_forward_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(
            out, tokens, wte, wpe, T, C, n);
    }
    CUDA_LAUNCH_CHECK(s);
}

__global__ void iota_kernel(int *v, int n) { GRID_STRIDE(i, (size_t)n) v[i] = (int)i; }

/* One block per position of the token-sorted order; the block at the first position of a
 * token's run adds that token's dout rows, in position order, onto dwte[token]. V is float,
 * or float4 when C % 4 == 0 and the rows are 16-byte aligned (CV = C / 4 groups): each
 * column gets the same additions in the same order either way. */
template <class V>
__global__ void embedding_backward_wte_kernel(V *dwte, const V *__restrict__ dout,
                                              const int *__restrict__ sorted_tok,
                                              const int *__restrict__ sorted_pos, int N, int CV) {
    int j = blockIdx.x;
    int tok = sorted_tok[j];
    if (j > 0 && sorted_tok[j - 1] == tok) return; /* not the head of its run */
    int end = j + 1;
    while (end < N && sorted_tok[end] == tok) end++;
    V *row = dwte + (size_t)tok * CV;
    for (int c = threadIdx.x; c < CV; c += blockDim.x) {
        V acc = row[c];
        for (int k = j; k < end; k++) add_into(acc, dout[(size_t)sorted_pos[k] * CV + c]);
        row[c] = acc;
    }
}

/* dwpe[t, c] += sum over b of dout[b, t, c], b in order. k = t * C + c indexes dwpe and every
 * [T, C] slice of dout alike (no division); V as above, TCV = T * C / 4 groups for float4. */
template <class V>
__global__ void embedding_backward_wpe_kernel(V *dwpe, const V *__restrict__ dout, int B,
                                              size_t TCV) {
    GRID_STRIDE(k, TCV) {
        V acc = dwpe[k];
        for (int bb = 0; bb < B; bb++) add_into(acc, dout[(size_t)bb * TCV + k]);
        dwpe[k] = acc;
    }
}

/* threads per block for a row of `units` columns: as few passes of at most 256 threads as
 * possible, each pass's threads rounded up to a warp */
static int row_threads(int units) {
    int passes = (units + 255) / 256;
    int per_pass = (units + passes - 1) / passes;
    return (per_pass + 31) / 32 * 32;
}

void cuda_embedding_backward(fp8t_backend *b, float *dwte, float *dwpe, const float *dout,
                             const int *tokens, int B, int T, int C) {
    if (B <= 0 || T <= 0 || C <= 0) return;
    cuda_state *s = cuda_of(b);
    int N = B * T;
    if (dwte) {
        size_t temp_bytes = 0;
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const int *)NULL,
                                                   (int *)NULL, (const int *)NULL, (int *)NULL, N,
                                                   0, 32, s->stream));
        size_t arr = align_up((size_t)N * sizeof(int), 256);
        char *base = (char *)cuda_scratch(b, SCR_SORT, 3 * arr + temp_bytes);
        int *pos_in = (int *)base, *tok_sorted = (int *)(base + arr);
        int *pos_sorted = (int *)(base + 2 * arr);
        void *temp = base + 3 * arr;
        iota_kernel<<<cdiv_u(N, EW_THREADS), EW_THREADS, 0, s->stream>>>(pos_in, N);
        CUDA_LAUNCH_CHECK(s);
        /* LSD radix sort is stable: equal tokens keep increasing positions */
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, tok_sorted, pos_in,
                                                   pos_sorted, N, 0, 32, s->stream));
        CUDA_LAUNCH_CHECK(s);
        if (C % 4 == 0 && aligned16(dwte) && aligned16(dout)) {
            embedding_backward_wte_kernel<float4><<<N, row_threads(C / 4), 0, s->stream>>>(
                as4(dwte), as4(dout), tok_sorted, pos_sorted, N, C / 4);
        } else {
            embedding_backward_wte_kernel<float>
                <<<N, row_threads(C), 0, s->stream>>>(dwte, dout, tok_sorted, pos_sorted, N, C);
        }
        CUDA_LAUNCH_CHECK(s);
    }
    if (dwpe) {
        size_t TC = (size_t)T * C;
        if (C % 4 == 0 && aligned16(dwpe) && aligned16(dout)) {
            embedding_backward_wpe_kernel<float4>
                <<<ew_blocks(s, TC / 4, 1), EW_THREADS, 0, s->stream>>>(as4(dwpe), as4(dout), B,
                                                                        TC / 4);
        } else {
            embedding_backward_wpe_kernel<float>
                <<<ew_blocks(s, TC, 1), EW_THREADS, 0, s->stream>>>(dwpe, dout, B, TC);
        }
        CUDA_LAUNCH_CHECK(s);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* bias */

/* out[N, units] += bias[units] per row (rows ld units apart), V float or float4 (units = OC / 4
 * groups when OC % 4 == 0, the row stride too, and both pointers are 16-byte aligned). Threads x
 * over columns, threads y and blocks y over rows: each thread loads its bias value once and
 * walks its rows, with no division per element (the grid-stride version's k % OC held it at
 * ~2.6 TB/s). */
template <class V>
__global__ void bias_add_kernel(V *out, size_t ld, const V *__restrict__ bias, int N, int units) {
    unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= (unsigned)units) return;
    V bc = bias[c];
    size_t row_step = (size_t)gridDim.y * blockDim.y;
    for (size_t r = (size_t)blockIdx.y * blockDim.y + threadIdx.y; r < (size_t)N; r += row_step)
        add_into(out[r * ld + c], bc);
}

template <class V>
static void bias_add_launch(cuda_state *s, V *out, size_t ld, const V *bias, int N, int units) {
    /* a row in as few blocks of <= 256 threads as possible; narrow rows stack several rows
     * of threads in one block */
    int tx = row_threads(units);
    dim3 block((unsigned)tx, (unsigned)(256 / tx));
    unsigned col_blocks = cdiv_u((size_t)units, (size_t)tx);
    /* rows: about num_sms * 16 blocks in all, as ew_blocks; each thread then adds its bias
     * value to N / (gridDim.y * blockDim.y) rows */
    size_t row_blocks = cdiv_u((size_t)N, block.y);
    size_t cap = (size_t)s->num_sms * 16 / col_blocks;
    if (cap < 1) cap = 1;
    if (cap > 65535) cap = 65535; /* gridDim.y limit */
    dim3 grid(col_blocks, (unsigned)(row_blocks < cap ? row_blocks : cap));
    bias_add_kernel<V><<<grid, block, 0, s->stream>>>(out, ld, bias, N, units);
}

void cuda_bias_add_ld(fp8t_backend *b, float *out, int ld, const float *bias, int N, int OC) {
    if (N <= 0 || OC <= 0) return;
    cuda_state *s = cuda_of(b);
    if (OC % 4 == 0 && ld % 4 == 0 && aligned16(out) && aligned16(bias))
        bias_add_launch<float4>(s, as4(out), (size_t)ld / 4, as4(bias), N, OC / 4);
    else
        bias_add_launch<float>(s, out, (size_t)ld, bias, N, OC);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_bias_add(fp8t_backend *b, float *out, const float *bias, int N, int OC) {
    cuda_bias_add_ld(b, out, OC, bias, N, OC);
}

/* one value or a float4 of them rounded to BF16 (nearest even) at unit i of a packed copy */
__device__ __forceinline__ void store_bf16(uint16_t *o, size_t i, float v) {
    o[i] = (uint16_t)(__float_as_uint(bf16_round_dev(v)) >> 16);
}
__device__ __forceinline__ void store_bf16(uint16_t *o, size_t i, float4 v) {
    reinterpret_cast<uint2 *>(o)[i] = bf16x4_of(v);
}

/* out = a + (y + bias) over [N, units] (bias NULL: a + y), laid out as bias_add_kernel's
 * threads (each loads its bias value once and walks rows); out may alias a; out16 (or NULL)
 * gets the BF16 copy. */
template <class V>
__global__ void add_bias_kernel(V *out, uint16_t *out16, const V *a, const V *__restrict__ y,
                                const V *__restrict__ bias, int N, int units) {
    unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= (unsigned)units) return;
    V bc;
    if (bias) bc = bias[c];
    size_t row_step = (size_t)gridDim.y * blockDim.y;
    for (size_t r = (size_t)blockIdx.y * blockDim.y + threadIdx.y; r < (size_t)N; r += row_step) {
        V t = y[r * units + c];
        if (bias) add_into(t, bc);
        add_into(t, a[r * units + c]);
        out[r * units + c] = t;
        if (out16) store_bf16(out16, r * units + c, t);
    }
}

void cuda_add_bias(fp8t_backend *b, float *out, uint16_t *out16, const float *a, const float *y,
                   const float *bias, int N, int OC) {
    if (N <= 0 || OC <= 0) return;
    cuda_state *s = cuda_of(b);
    const int vec = OC % 4 == 0 && aligned16(out) && aligned16(a) && aligned16(y) &&
                    aligned16(bias) && aligned8(out16);
    const int units = vec ? OC / 4 : OC;
    int tx = row_threads(units);
    dim3 block((unsigned)tx, (unsigned)(256 / tx));
    unsigned col_blocks = cdiv_u((size_t)units, (size_t)tx);
    size_t row_blocks = cdiv_u((size_t)N, block.y);
    size_t cap = (size_t)s->num_sms * 16 / col_blocks;
    if (cap < 1) cap = 1;
    if (cap > 65535) cap = 65535;
    dim3 grid(col_blocks, (unsigned)(row_blocks < cap ? row_blocks : cap));
    if (vec)
        add_bias_kernel<float4>
            <<<grid, block, 0, s->stream>>>(as4(out), out16, as4(a), as4(y), as4(bias), N, units);
    else
        add_bias_kernel<float><<<grid, block, 0, s->stream>>>(out, out16, a, y, bias, N, units);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_bias_backward(fp8t_backend *b, float *dbias, const float *dout, int N, int OC) {
    cuda_column_sums(b, dbias, dout, N, OC);
}

/* ---------------------------------------------------------------------------------------- */
/* activations (elementwise; outputs may alias inputs of the same index). gelu_forward and
 * gelu_backward evaluate gelu_dev and gelu_grad (cuda_common.cuh), the expressions the fused
 * GELU kernels share, so their bits agree. */

/* [n] each; n4 groups of float4 (see ew_groups) */
__global__ void gelu_forward_kernel(float *out, const float *x, size_t n, size_t n4) {
    GRID_STRIDE(i, n4) {
        float4 v = as4(x)[i];
        as4(out)[i] = make_float4(gelu_dev(v.x), gelu_dev(v.y), gelu_dev(v.z), gelu_dev(v.w));
    }
    GRID_STRIDE_FROM(i, n4 * 4, n) out[i] = gelu_dev(x[i]);
}

/* [n] each; dx may alias dout */
__global__ void gelu_backward_kernel(float *dx, const float *x, const float *dout, size_t n,
                                     size_t n4) {
    GRID_STRIDE(i, n4) {
        float4 v = as4(x)[i], d = as4(dout)[i];
        as4(dx)[i] = make_float4(gelu_grad(v.x, d.x), gelu_grad(v.y, d.y), gelu_grad(v.z, d.z),
                                 gelu_grad(v.w, d.w));
    }
    GRID_STRIDE_FROM(i, n4 * 4, n) dx[i] = gelu_grad(x[i], dout[i]);
}

void cuda_gelu_forward(fp8t_backend *b, float *out, const float *x, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    size_t n4 = ew_groups(n, aligned16(out) && aligned16(x));
    gelu_forward_kernel<<<ew_vec_blocks(s, n, n4), EW_THREADS, 0, s->stream>>>(out, x, n, n4);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_gelu_backward(fp8t_backend *b, float *dx, const float *x, const float *dout, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    size_t n4 = ew_groups(n, aligned16(dx) && aligned16(x) && aligned16(dout));
    gelu_backward_kernel<<<ew_vec_blocks(s, n, n4), EW_THREADS, 0, s->stream>>>(dx, x, dout, n,
                                                                                n4);
    CUDA_LAUNCH_CHECK(s);
}

/* dx = gelu'(x + bias) * dout over [rows, cols]: threads over columns (float4 when cols % 4 == 0
 * and every pointer is 16-byte aligned), each loading its bias once and walking rows; x + b is
 * one FP32 addition, as bias_add, then gelu_grad. dx may alias dout. */
__global__ void gelu_backward_bias_vec_kernel(float4 *dx, const float4 *__restrict__ x,
                                              const float4 *__restrict__ bias, const float4 *dout,
                                              int rows, int C4) {
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < C4; c += gridDim.y * blockDim.x) {
        const float4 bb = bias[c];
        for (int r = blockIdx.x; r < rows; r += gridDim.x) {
            size_t i = (size_t)r * C4 + c;
            float4 v = x[i], d = dout[i];
            v = make_float4(v.x + bb.x, v.y + bb.y, v.z + bb.z, v.w + bb.w);
            dx[i] = make_float4(gelu_grad(v.x, d.x), gelu_grad(v.y, d.y), gelu_grad(v.z, d.z),
                                gelu_grad(v.w, d.w));
        }
    }
}

__global__ void gelu_backward_bias_kernel(float *dx, const float *__restrict__ x,
                                          const float *__restrict__ bias, const float *dout,
                                          int rows, int cols) {
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < cols; c += gridDim.y * blockDim.x) {
        const float bb = bias[c];
        for (int r = blockIdx.x; r < rows; r += gridDim.x) {
            size_t i = (size_t)r * cols + c;
            dx[i] = gelu_grad(x[i] + bb, dout[i]);
        }
    }
}

void cuda_gelu_backward_bias(fp8t_backend *b, float *dx, const float *x, const float *bias,
                             const float *dout, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    const int vec =
        cols % 4 == 0 && aligned16(dx) && aligned16(x) && aligned16(bias) && aligned16(dout);
    const int units = vec ? cols / 4 : cols;
    unsigned gy = (unsigned)((units + EW_THREADS - 1) / EW_THREADS);
    if (gy > 65535u) gy = 65535u;
    size_t cap = (size_t)s->num_sms * 16 / gy;
    unsigned gx = (unsigned)((size_t)rows < cap ? (size_t)rows : (cap ? cap : 1));
    dim3 grid(gx, gy);
    if (vec)
        gelu_backward_bias_vec_kernel<<<grid, EW_THREADS, 0, s->stream>>>(
            as4(dx), as4(x), as4(bias), as4(dout), rows, cols / 4);
    else
        gelu_backward_bias_kernel<<<grid, EW_THREADS, 0, s->stream>>>(dx, x, bias, dout, rows,
                                                                      cols);
    CUDA_LAUNCH_CHECK(s);
}

/* [n] each; gate16 / up16 (may be NULL): the inputs' BF16 saves from the same read */
__global__ void swiglu_forward_kernel(float *out, const float *gate, const float *up,
                                      uint16_t *gate16, uint16_t *up16, size_t n, size_t n4) {
    GRID_STRIDE(i, n4) {
        float4 g = as4(gate)[i], u = as4(up)[i];
        as4(out)[i] = make_float4(swiglu_value(g.x, u.x), swiglu_value(g.y, u.y),
                                  swiglu_value(g.z, u.z), swiglu_value(g.w, u.w));
        if (gate16) ((uint2 *)gate16)[i] = bf16x4_of(g);
        if (up16) ((uint2 *)up16)[i] = bf16x4_of(u);
    }
    GRID_STRIDE_FROM(i, n4 * 4, n) {
        const float g = gate[i], u = up[i];
        out[i] = swiglu_value(g, u);
        if (gate16) ((__nv_bfloat16 *)gate16)[i] = __float2bfloat16_rn(g);
        if (up16) ((__nv_bfloat16 *)up16)[i] = __float2bfloat16_rn(u);
    }
}

/* element i of an input given as FP32 (f) or as its BF16 save (h) */
__device__ __forceinline__ float in_at(const float *f, const uint16_t *h, size_t i) {
    return f ? f[i] : __bfloat162float(((const __nv_bfloat16 *)h)[i]);
}
__device__ __forceinline__ float4 in4_at(const float *f, const uint16_t *h, size_t i) {
    return f ? as4(f)[i] : f32x4_of_bf16(((const uint2 *)h)[i]);
}

/* [n] each; gate (up) NULL: from gate16 (up16) */
__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout,
                                       const float *gate, const float *up, const uint16_t *gate16,
                                       const uint16_t *up16, size_t n, size_t n4) {
    GRID_STRIDE(i, n4) {
        float4 g = in4_at(gate, gate16, i), u = in4_at(up, up16, i), d = as4(dout)[i];
        float4 dg, du;
        swiglu_grads(dg.x, du.x, d.x, g.x, u.x);
        swiglu_grads(dg.y, du.y, d.y, g.y, u.y);
        swiglu_grads(dg.z, du.z, d.z, g.z, u.z);
        swiglu_grads(dg.w, du.w, d.w, g.w, u.w);
        as4(dgate)[i] = dg;
        as4(dup)[i] = du;
    }
    GRID_STRIDE_FROM(i, n4 * 4, n) {
        float dg, du;
        swiglu_grads(dg, du, dout[i], in_at(gate, gate16, i), in_at(up, up16, i));
        dgate[i] = dg;
        dup[i] = du;
    }
}

/* [n]: one of swiglu_backward's gradients (up is not read for dup) */
template <bool GATE>
__global__ void swiglu_grad_kernel(float *out, const float *dout, const float *gate,
                                   const uint16_t *gate16, const float *up, const uint16_t *up16,
                                   size_t n) {
    GRID_STRIDE(i, n) {
        float dg, du;
        swiglu_grads(dg, du, dout[i], in_at(gate, gate16, i), GATE ? in_at(up, up16, i) : 0.0f);
        out[i] = GATE ? dg : du;
    }
}

void cuda_swiglu_grad(fp8t_backend *b, float *out, int which, const float *dout,
                      const float *gate, const uint16_t *gate16, const float *up,
                      const uint16_t *up16, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    if (which == FP8T_STEP_DSWIGLU_GATE)
        swiglu_grad_kernel<true><<<ew_blocks(s, n, 1), EW_THREADS, 0, s->stream>>>(
            out, dout, gate, gate16, up, up16, n);
    else
        swiglu_grad_kernel<false><<<ew_blocks(s, n, 1), EW_THREADS, 0, s->stream>>>(
            out, dout, gate, gate16, up, up16, n);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_swiglu_forward(fp8t_backend *b, float *out, const float *gate, const float *up,
                         uint16_t *gate16, uint16_t *up16, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    size_t n4 = ew_groups(n, aligned16(out) && aligned16(gate) && aligned16(up) &&
                                 aligned8(gate16) && aligned8(up16));
    swiglu_forward_kernel<<<ew_vec_blocks(s, n, n4), EW_THREADS, 0, s->stream>>>(
        out, gate, up, gate16, up16, n, n4);
    CUDA_LAUNCH_CHECK(s);
}

/* The inference model's activation operands (swiglu_operand, gelu16_operand): each element's
 * value (GELU = false: swiglu_value(x, up) with x the gate; true: gelu_dev(x (+ bias[col]))),
 * then its FP8 code (scale non-NULL: codes [rows, cols]) or BF16 (the operand [pad8(rows),
 * pad8(cols)], padding zero), or nothing (out NULL); the values' amax into amax_out (may be
 * NULL). The inputs are FP32 or (IN = uint16_t) BF16 values. Groups of 4 consecutive columns per
 * thread when cols % 4 == 0 and the inputs are aligned to a group (groups never straddle rows
 * then, and a group's 4 codes / 4 BF16 values go out in one 4- / 8-byte store), single elements
 * otherwise; the values are the same either way. IDX: 32-bit index arithmetic when the unit
 * count fits (a 64-bit division per unit cost more than the loads). */
__device__ __forceinline__ float4 load4_in(const float *p, size_t q) { return as4(p)[q]; }
__device__ __forceinline__ float4 load4_in(const uint16_t *p, size_t q) {
    return f32x4_of_bf16(reinterpret_cast<const uint2 *>(p)[q]);
}
__device__ __forceinline__ float load1_in(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float load1_in(const uint16_t *p, size_t i) {
    return __uint_as_float((unsigned)p[i] << 16);
}
template <bool GELU>
__device__ __forceinline__ float act_value(float x, float u, const float *bias, int c) {
    if (GELU) return gelu_dev(bias ? x + bias[c] : x);
    return swiglu_value(x, u);
}

template <typename IDX, typename IN, bool GELU>
__global__ void act_operand_kernel(void *out, const IN *__restrict__ x, const IN *__restrict__ up,
                                   const float *__restrict__ bias, int rows, int cols, int ld,
                                   int rows_out, const float *__restrict__ scale_p,
                                   fp8_format fmt, int vec, float *amax_out) {
    const float scale = scale_p ? *scale_p : 1.0f;
    float amax = 0.0f;
    const int per = vec ? 4 : 1;
    const IDX upr = (IDX)(ld / per); /* units per row; ld % per == 0 */
    const IDX units = (IDX)rows_out * upr;
    for (IDX u = (IDX)blockIdx.x * blockDim.x + threadIdx.x; u < units;
         u += (IDX)gridDim.x * blockDim.x) {
        const IDX r = u / upr;
        const int c0 = (int)(u - r * upr) * per;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < (IDX)rows) {
            if (vec) {
                if (c0 < cols) {
                    const size_t q = ((size_t)r * cols + c0) / 4;
                    const float4 a = load4_in(x, q);
                    const float4 b = GELU ? a : load4_in(up, q);
                    v[0] = act_value<GELU>(a.x, b.x, bias, c0);
                    v[1] = act_value<GELU>(a.y, b.y, bias, c0 + 1);
                    v[2] = act_value<GELU>(a.z, b.z, bias, c0 + 2);
                    v[3] = act_value<GELU>(a.w, b.w, bias, c0 + 3);
                }
            } else if (c0 < cols) {
                const size_t i = (size_t)r * cols + c0;
                v[0] = act_value<GELU>(load1_in(x, i), GELU ? 0.0f : load1_in(up, i), bias, c0);
            }
            if (amax_out) /* padding values are zeros: they leave the amax as it is */
                for (int j = 0; j < 4; j++) amax = amax_merge_dev(amax, v[j]);
        }
        const size_t o = (size_t)r * (size_t)ld + c0;
        if (!out) continue;
        if (vec && scale_p) {
            *(uint32_t *)((uint8_t *)out + o) =
                fp8x4_enc_dev(v[0] * scale, v[1] * scale, v[2] * scale, v[3] * scale, fmt);
        } else if (vec) {
            *(uint2 *)((__nv_bfloat16 *)out + o) = bf16x4_of(make_float4(v[0], v[1], v[2], v[3]));
        } else if (scale_p) {
            ((uint8_t *)out)[o] = fp8_enc_dev(v[0] * scale, fmt);
        } else {
            ((__nv_bfloat16 *)out)[o] = __float2bfloat16_rn(v[0]);
        }
    }
    if (amax_out) {
        amax = block_amax(amax);
        if (threadIdx.x == 0) atomic_amax_merge(amax_out, amax);
    }
}

/* act_operand_kernel over rows x cols: FP8 codes are [rows, cols]; the BF16 operand pads both
 * dimensions to 8; the amax alone walks the values. in_ok: the inputs are aligned to a group. */
template <typename IN, bool GELU>
static void act_operand(cuda_state *s, void *out, const IN *x, const IN *up, const float *bias,
                        int rows, int cols, const float *scale, fp8_format fmt, float *amax_out,
                        int in_ok) {
    const int ld = scale || !out ? cols : fp8t_bf16_pad(cols);
    const int rows_out = scale || !out ? rows : fp8t_bf16_pad(rows);
    const int vec = cols % 4 == 0 && in_ok && (scale ? aligned4(out) : aligned8(out));
    const size_t units = (size_t)rows_out * (size_t)(ld / (vec ? 4 : 1));
    with_index_type(units, [&](auto i) {
        act_operand_kernel<decltype(i), IN, GELU>
            <<<ew_blocks(s, units, 2), EW_THREADS, 0, s->stream>>>(
                out, x, up, bias, rows, cols, ld, rows_out, scale, fmt, vec, amax_out);
    });
    CUDA_LAUNCH_CHECK(s);
}

void cuda_swiglu_operand(fp8t_backend *b, void *out, const float *gate, const float *up,
                         const uint16_t *gate16, const uint16_t *up16, int rows, int cols,
                         const float *scale, fp8_format fmt, float *amax_out) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    if (gate16)
        act_operand<uint16_t, false>(s, out, gate16, up16, NULL, rows, cols, scale, fmt, amax_out,
                                     aligned8(gate16) && aligned8(up16));
    else
        act_operand<float, false>(s, out, gate, up, NULL, rows, cols, scale, fmt, amax_out,
                                  aligned16(gate) && aligned16(up));
}

void cuda_gelu16_operand(fp8t_backend *b, void *out, const uint16_t *x16, const float *bias,
                         int rows, int cols, const float *scale, fp8_format fmt,
                         float *amax_out) {
    if (rows <= 0 || cols <= 0) return;
    act_operand<uint16_t, true>(cuda_of(b), out, x16, (const uint16_t *)NULL, bias, rows, cols,
                                scale, fmt, amax_out, aligned8(x16) && aligned16(bias));
}

void cuda_swiglu_backward(fp8t_backend *b, float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, const uint16_t *gate16,
                          const uint16_t *up16, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    size_t n4 =
        ew_groups(n, aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) &&
                         aligned16(up) && aligned8(gate16) && aligned8(up16));
    swiglu_backward_kernel<<<ew_vec_blocks(s, n, n4), EW_THREADS, 0, s->stream>>>(
        dgate, dup, dout, gate, up, gate16, up16, n, n4);
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* fused softmax + cross-entropy: one block per row, online max/sum in one read of the row,
 * then (with dlogits) one read + write for the gradient */

#define XENT_THREADS 512

/* merge two (max, sum of exp(x - max)) pairs */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    if (m2 > m) {
        s = s * expf(m - m2) + s2;
        m = m2;
    } else if (m2 == m) {
        s += s2;
    } else if (m2 == m2) { /* m2 < m, not NaN */
        s += s2 * expf(m2 - m);
    } else {
        m = m2; /* NaN propagates */
        s = m2;
    }
}

/* Softmax + cross-entropy, one block per row of stride ld: the row's (max, sum of exp) merged
 * per group of 4 columns, the loss, then the gradient (softmax - onehot) * dloss written as
 * FP32 (d32: rows of stride ld, may alias logits; columns V.. untouched) and/or as the BF16
 * operand (d16: [pad(N), pad(V)], padding zero; the grid then has pad(N) blocks, rows >= N
 * zero). One kernel for softmax_xent and softmax_xent_bf16, so that the FP32 gradient has the
 * same bits whichever outputs a call asks for (a read-only hook's dlogits are the unhooked
 * path's). The row is read twice, the second time mostly from L2. vec: float4 loads (ld % 4 ==
 * 0, logits 16-byte aligned); vec32: float4 stores of d32 likewise. 512 threads per row (1024
 * measured 10% slower on the H200 at GPT-2 124M: 4.7 vs 4.3 ms per step). */
__global__ void softmax_xent_kernel(float *losses, uint2 *d16, float *d32, float *amax_out,
                                    const float *logits, int ld, const int *targets, int N, int V,
                                    float dloss, int vec, int vec32) {
    const int row = blockIdx.x, Vp = (V + 7) / 8 * 8, groups = Vp / 4;
    if (row >= N) { /* padding row of the BF16 operand */
        uint2 *o = d16 + (size_t)row * groups;
        for (int g = threadIdx.x; g < groups; g += blockDim.x) o[g] = make_uint2(0u, 0u);
        return;
    }
    const float *x = logits + (size_t)row * ld;
    const int target = targets[row];
    const int ignored = target < 0 || target >= V;
    const int full = V / 4; /* groups with all 4 columns < V */
    float m = -INFINITY, s = 0.0f;
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
        float v[4];
        if (vec && g < full) {
            float4 q = reinterpret_cast<const float4 *>(x)[g];
            v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
        } else {
            for (int e = 0; e < 4; e++) v[e] = 4 * g + e < V ? x[4 * g + e] : -INFINITY;
        }
        float gm = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
        if (isnan(v[0]) || isnan(v[1]) || isnan(v[2]) || isnan(v[3])) gm = NAN; /* propagates */
        if (gm == -INFINITY) continue; /* only padding columns (or -inf logits): adds nothing */
        float gs = 0.0f;
        for (int e = 0; e < 4; e++) gs += expf(v[e] - gm);
        lse_merge(m, s, gm, gs);
    }
    __shared__ float sh_m[32], sh_s[32];
    __shared__ float sh_max, sh_sum;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, off),
              s2 = __shfl_xor_sync(0xffffffffu, s, off);
        lse_merge(m, s, m2, s2);
    }
    if (lane == 0) sh_m[warp] = m, sh_s[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = sh_m[0], S = sh_s[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) lse_merge(M, S, sh_m[w], sh_s[w]);
        sh_max = M;
        sh_sum = S;
        /* x[target] read before the gradient may overwrite it (d32 aliasing logits) */
        if (losses) losses[row] = ignored ? 0.0f : logf(S) + M - x[target];
    }
    __syncthreads();
    if (!d16 && !d32) return;
    const float M = sh_max, inv_s = 1.0f / sh_sum;
    float *dr = d32 ? d32 + (size_t)row * ld : NULL;
    uint2 *o = d16 ? d16 + (size_t)row * groups : NULL;
    float am = 0.0f;
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (!ignored) {
            float v[4];
            if (vec && g < full) {
                float4 q = reinterpret_cast<const float4 *>(x)[g];
                v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
            } else {
                for (int e = 0; e < 4; e++) v[e] = 4 * g + e < V ? x[4 * g + e] : 0.0f;
            }
            for (int e = 0; e < 4; e++) {
                int c = 4 * g + e;
                if (c >= V) break;
                float p = expf(v[e] - M) * inv_s;
                d[e] = (p - (c == target ? 1.0f : 0.0f)) * dloss;
                am = amax_merge_dev(am, d[e]);
            }
        }
        if (dr) {
            if (vec32 && g < full)
                reinterpret_cast<float4 *>(dr)[g] = make_float4(d[0], d[1], d[2], d[3]);
            else
                for (int e = 0; e < 4 && 4 * g + e < V; e++) dr[4 * g + e] = d[e];
        }
        if (o) {
            __nv_bfloat162 p0 = __floats2bfloat162_rn(d[0], d[1]),
                           p1 = __floats2bfloat162_rn(d[2], d[3]);
            o[g] = make_uint2(*(unsigned *)&p0, *(unsigned *)&p1);
        }
    }
    if (amax_out) {
        am = block_amax(am);
        if (threadIdx.x == 0) atomic_amax_merge(amax_out, am);
    }
}

void cuda_softmax_xent(fp8t_backend *b, float *losses, float *dlogits, const float *logits,
                       const int *targets, int N, int V, float dloss) {
    if (N <= 0 || V <= 0) return;
    cuda_state *s = cuda_of(b);
    const int vec = !s->plain && V % 4 == 0 && aligned16(logits);
    const int vec32 = dlogits && !s->plain && V % 4 == 0 && aligned16(dlogits);
    softmax_xent_kernel<<<N, XENT_THREADS, 0, s->stream>>>(losses, NULL, dlogits, NULL, logits, V,
                                                           targets, N, V, dloss, vec, vec32);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_softmax_xent_bf16(fp8t_backend *b, float *losses, uint16_t *dlogits, float *amax_out,
                            float *dlogits32, const float *logits, int ld, const int *targets,
                            int N, int V, float dloss) {
    if (N <= 0 || V <= 0) return;
    if (ld < V) {
        FP8T_FATAL("softmax_xent_bf16: ld = %d is less than V = %d", ld, V);
    }
    cuda_state *s = cuda_of(b);
    const int vec = !s->plain && ld % 4 == 0 && aligned16(logits);
    const int vec32 = dlogits32 && !s->plain && ld % 4 == 0 && aligned16(dlogits32);
    softmax_xent_kernel<<<fp8t_bf16_pad(N), XENT_THREADS, 0, s->stream>>>(
        losses, (uint2 *)dlogits, dlogits32, amax_out, logits, ld, targets, N, V, dloss, vec,
        vec32);
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* elementwise arithmetic */

/* [n] each; out may alias a or c (see ew_groups) */
__global__ void add_kernel(float *out, const float *a, const float *c, size_t n, size_t n4) {
    GRID_STRIDE(i, n4) {
        float4 x = as4(a)[i], y = as4(c)[i];
        as4(out)[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
    GRID_STRIDE_FROM(i, n4 * 4, n) out[i] = a[i] + c[i];
}

void cuda_add(fp8t_backend *b, float *out, const float *a, const float *c, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    size_t n4 = ew_groups(n, aligned16(out) && aligned16(a) && aligned16(c));
    add_kernel<<<ew_vec_blocks(s, n, n4), EW_THREADS, 0, s->stream>>>(out, a, c, n, n4);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_accumulate(fp8t_backend *b, float *out, const float *x, size_t n) {
    cuda_add(b, out, out, x, n);
}

/* [n] */
__global__ void scale_kernel(float *out, float sc, size_t n, size_t n4) {
    GRID_STRIDE(i, n4) {
        float4 x = as4(out)[i];
        as4(out)[i] = make_float4(x.x * sc, x.y * sc, x.z * sc, x.w * sc);
    }
    GRID_STRIDE_FROM(i, n4 * 4, n) out[i] *= sc;
}

void cuda_scale(fp8t_backend *b, float *out, float sc, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    size_t n4 = ew_groups(n, aligned16(out));
    scale_kernel<<<ew_vec_blocks(s, n, n4), EW_THREADS, 0, s->stream>>>(out, sc, n, n4);
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* deterministic sums: the block count is a function of n only; each block's threads stride
 * over fixed elements, the block sums in a fixed tree; one final block adds the partials in
 * a fixed tree onto *out. */

#define SUM_THREADS 256
#define SUM_MAX_BLOCKS 1024

static int sum_blocks(size_t n) {
    size_t want = (n + SUM_THREADS * 16 - 1) / (SUM_THREADS * 16);
    if (want < 1) want = 1;
    return (int)(want < SUM_MAX_BLOCKS ? want : SUM_MAX_BLOCKS);
}

/* per-thread and per-block accumulation in double (cheap next to the memory traffic, and
 * close to the CPU's double chunk sums) */
template <int SQUARE>
__global__ void sum_partials_kernel(double *partials, const float *__restrict__ x, size_t n) {
    __shared__ double sh[SUM_THREADS];
    double acc = 0.0;
    GRID_STRIDE(i, n) {
        double v = x[i];
        acc += SQUARE ? v * v : v;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

__global__ void sum_finish_kernel(float *out, const double *partials, int nparts) {
    __shared__ double sh[SUM_THREADS];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += partials[i];
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out += (float)sh[0];
}

template <int SQUARE>
static void reduce_sum(fp8t_backend *b, float *out, const float *x, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    int nb = sum_blocks(n);
    double *partials = (double *)cuda_scratch(b, SCR_REDUCE, (size_t)nb * sizeof(double));
    sum_partials_kernel<SQUARE><<<nb, SUM_THREADS, 0, s->stream>>>(partials, x, n);
    CUDA_LAUNCH_CHECK(s);
    sum_finish_kernel<<<1, SUM_THREADS, 0, s->stream>>>(out, partials, nb);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_sumsq(fp8t_backend *b, float *out, const float *x, size_t n) {
    reduce_sum<1>(b, out, x, n);
}

void cuda_sum(fp8t_backend *b, float *out, const float *x, size_t n) {
    reduce_sum<0>(b, out, x, n);
}

/* ---------------------------------------------------------------------------------------- */
/* AdamW */

typedef struct {
    float lr, beta1, beta2, eps, wd;
    float bc1, bc2; /* bias corrections 1 - beta^t */
    float grad_scale;
} adamw_hparams;

/* One parameter's step: the CPU backend's operations in its order, without FMA contraction
 * (_rn intrinsics), so both backends take the same optimizer step bit for bit. omb1, omb2 =
 * 1 - beta1, 1 - beta2. */
__device__ __forceinline__ void adamw_element(float &p, float &m, float &v, float grad,
                                              const adamw_hparams &h, float omb1, float omb2) {
    float g = __fmul_rn(grad, h.grad_scale);
    float mi = __fadd_rn(__fmul_rn(h.beta1, m), __fmul_rn(omb1, g));
    float vi = __fadd_rn(__fmul_rn(h.beta2, v), __fmul_rn(__fmul_rn(omb2, g), g));
    m = mi;
    v = vi;
    float mhat = __fdiv_rn(mi, h.bc1), vhat = __fdiv_rn(vi, h.bc2);
    float upd =
        __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), h.eps)), __fmul_rn(h.wd, p));
    p = __fsub_rn(p, __fmul_rn(h.lr, upd));
}

/* params, m, v, grads: [n] each; n4 groups of float4 (see ew_groups) */
__global__ void adamw_kernel(float *params, float *m, float *v, const float *__restrict__ grads,
                             size_t n, size_t n4, adamw_hparams h) {
    const float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
    GRID_STRIDE(i, n4) {
        float4 p = as4(params)[i], mi = as4(m)[i], vi = as4(v)[i];
        float4 g = as4(grads)[i];
        adamw_element(p.x, mi.x, vi.x, g.x, h, omb1, omb2);
        adamw_element(p.y, mi.y, vi.y, g.y, h, omb1, omb2);
        adamw_element(p.z, mi.z, vi.z, g.z, h, omb1, omb2);
        adamw_element(p.w, mi.w, vi.w, g.w, h, omb1, omb2);
        as4(m)[i] = mi;
        as4(v)[i] = vi;
        as4(params)[i] = p;
    }
    GRID_STRIDE_FROM(i, n4 * 4, n) {
        float p = params[i], mi = m[i], vi = v[i];
        adamw_element(p, mi, vi, grads[i], h, omb1, omb2);
        m[i] = mi;
        v[i] = vi;
        params[i] = p;
    }
}

void cuda_adamw(fp8t_backend *b, float *params, float *m, float *v, const float *grads, size_t n,
                float lr, float beta1, float beta2, float eps, float wd, int t,
                float grad_scale) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    adamw_hparams h;
    h.lr = lr, h.beta1 = beta1, h.beta2 = beta2, h.eps = eps, h.wd = wd;
    /* bias corrections on the host, once per call */
    h.bc1 = 1.0f - powf(beta1, (float)t);
    h.bc2 = 1.0f - powf(beta2, (float)t);
    h.grad_scale = grad_scale;
    size_t n4 =
        ew_groups(n, aligned16(params) && aligned16(m) && aligned16(v) && aligned16(grads));
    adamw_kernel<<<ew_vec_blocks(s, n, n4), EW_THREADS, 0, s->stream>>>(params, m, v, grads, n,
                                                                        n4, h);
    CUDA_LAUNCH_CHECK(s);
}
