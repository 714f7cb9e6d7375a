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

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

#define GRID_STRIDE(i, n)                                                                     \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                   \
         i += (size_t)gridDim.x * blockDim.x)

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

__global__ void iota_kernel(int *v, int n) {
    GRID_STRIDE(i, (size_t)n) v[i] = (int)i;
}

/* One block per position of the token-sorted order; the block at the first position of a
 * token's run adds that token's dout rows, in position order, onto dwte[token]. */
__global__ void embedding_backward_wte_kernel(float *dwte, const float *__restrict__ dout,
                                              const int *__restrict__ sorted_tok,
                                              const int *__restrict__ sorted_pos, int N, int C) {
    int j = blockIdx.x;
    int tok = sorted_tok[j];
    if (j > 0 && sorted_tok[j - 1] == tok) return; /* not the head of its run */
    int end = j + 1;
    while (end < N && sorted_tok[end] == tok) end++;
    float *row = dwte + (size_t)tok * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = row[c];
        for (int k = j; k < end; k++) acc += dout[(size_t)sorted_pos[k] * C + c];
        row[c] = acc;
    }
}

/* dwpe[t, c] += sum over b of dout[b, t, c], b in order */
__global__ void embedding_backward_wpe_kernel(float *dwpe, const float *__restrict__ dout,
                                              int B, int T, int C) {
    GRID_STRIDE(k, (size_t)T * C) {
        size_t t = k / C, c = k % C;
        float acc = dwpe[k];
        for (int bb = 0; bb < B; bb++) acc += dout[((size_t)bb * T + t) * C + c];
        dwpe[k] = acc;
    }
}

void cuda_embedding_backward(fp8t_backend *b, float *dwte, float *dwpe, const float *dout,
                             const int *tokens, int B, int T, int C) {
    if (B <= 0 || T <= 0 || C <= 0) return;
    cuda_state *s = cuda_of(b);
    int N = B * T;
    if (dwte) {
        size_t temp_bytes = 0;
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const int *)NULL,
                                                   (int *)NULL, (const int *)NULL, (int *)NULL,
                                                   N, 0, 32, s->stream));
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
        int threads = C >= 256 ? 256 : (C >= 128 ? 128 : 64);
        embedding_backward_wte_kernel<<<N, threads, 0, s->stream>>>(dwte, dout, tok_sorted,
                                                                   pos_sorted, N, C);
        CUDA_LAUNCH_CHECK(s);
    }
    if (dwpe) {
        embedding_backward_wpe_kernel<<<ew_blocks(s, (size_t)T * C, 1), EW_THREADS, 0,
                                        s->stream>>>(dwpe, dout, B, T, C);
        CUDA_LAUNCH_CHECK(s);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* bias */

__global__ void bias_add_kernel(float *out, const float *__restrict__ bias, int OC, size_t n) {
    GRID_STRIDE(k, n) out[k] += bias[k % OC];
}

void cuda_bias_add(fp8t_backend *b, float *out, const float *bias, int N, int OC) {
    if (N <= 0 || OC <= 0) return;
    cuda_state *s = cuda_of(b);
    size_t n = (size_t)N * OC;
    bias_add_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(out, bias, OC, n);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_bias_backward(fp8t_backend *b, float *dbias, const float *dout, int N, int OC) {
    cuda_column_sums(b, dbias, dout, N, OC);
}

/* ---------------------------------------------------------------------------------------- */
/* activations (elementwise; outputs may alias inputs of the same index) */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* The sigmoid form of the tanh approximation (see cpu_misc.c): no cancellation for v < 0. */
__global__ void gelu_forward_kernel(float *out, const float *x, size_t n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float u = GELU_SCALE * (v + 0.044715f * v * v * v);
        out[i] = v * (1.0f / (1.0f + expf(-2.0f * u)));
    }
}

__global__ void gelu_backward_kernel(float *dx, const float *x, const float *dout, size_t n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float u = GELU_SCALE * (v + 0.044715f * v * v * v);
        float sg = 1.0f / (1.0f + expf(-2.0f * u));
        float du_dv = GELU_SCALE * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = (sg + 2.0f * v * sg * (1.0f - sg) * du_dv) * dout[i];
    }
}

void cuda_gelu_forward(fp8t_backend *b, float *out, const float *x, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    gelu_forward_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(out, x, n);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_gelu_backward(fp8t_backend *b, float *dx, const float *x, const float *dout,
                        size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    gelu_backward_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(dx, x, dout, n);
    CUDA_LAUNCH_CHECK(s);
}

__global__ void swiglu_forward_kernel(float *out, const float *gate, const float *up, size_t n) {
    GRID_STRIDE(i, n) {
        float g = gate[i];
        float sig = 1.0f / (1.0f + expf(-g));
        out[i] = g * sig * up[i];
    }
}

__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout,
                                       const float *gate, const float *up, size_t n) {
    GRID_STRIDE(i, n) {
        float g = gate[i], u = up[i], d = dout[i];
        float sig = 1.0f / (1.0f + expf(-g));
        float silu = g * sig;
        float dsilu = sig * (1.0f + g * (1.0f - sig));
        dgate[i] = d * u * dsilu;
        dup[i] = d * silu;
    }
}

void cuda_swiglu_forward(fp8t_backend *b, float *out, const float *gate, const float *up,
                         size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    swiglu_forward_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(out, gate, up, n);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_swiglu_backward(fp8t_backend *b, float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    swiglu_backward_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(dgate, dup, dout,
                                                                            gate, up, n);
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

__global__ void softmax_xent_kernel(float *losses, float *dlogits, const float *logits,
                                    const int *targets, int V, float dloss) {
    int row = blockIdx.x;
    const float *x = logits + (size_t)row * V;
    int target = targets[row];
    int ignored = target < 0 || target >= V;
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) lse_merge(m, s, x[i], 1.0f);
    /* block reduction of (m, s) in a fixed tree order */
    __shared__ float sh_m[32], sh_s[32];
    __shared__ float sh_max, sh_sum, sh_xt;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    if (lane == 0) sh_m[warp] = m, sh_s[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = sh_m[0], S = sh_s[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) lse_merge(M, S, sh_m[w], sh_s[w]);
        sh_max = M;
        sh_sum = S;
        sh_xt = ignored ? 0.0f : x[target]; /* read before dlogits may overwrite it */
        losses[row] = ignored ? 0.0f : logf(S) + M - sh_xt;
    }
    __syncthreads();
    if (!dlogits) return;
    float *d = dlogits + (size_t)row * V;
    if (ignored) {
        for (int i = threadIdx.x; i < V; i += blockDim.x) d[i] = 0.0f;
        return;
    }
    float M = sh_max, inv_s = 1.0f / sh_sum;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float p = expf(x[i] - M) * inv_s;
        d[i] = (p - (i == target ? 1.0f : 0.0f)) * dloss;
    }
}

void cuda_softmax_xent(fp8t_backend *b, float *losses, float *dlogits, const float *logits,
                       const int *targets, int N, int V, float dloss) {
    if (N <= 0 || V <= 0) return;
    cuda_state *s = cuda_of(b);
    softmax_xent_kernel<<<N, XENT_THREADS, 0, s->stream>>>(losses, dlogits, logits, targets, V,
                                                          dloss);
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* elementwise arithmetic */

__global__ void add_kernel(float *out, const float *a, const float *c, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + c[i];
}
__global__ void add_vec4_kernel(float4 *out, const float4 *a, const float4 *c, size_t n4) {
    GRID_STRIDE(i, n4) {
        float4 x = a[i], y = c[i];
        out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}

void cuda_add(fp8t_backend *b, float *out, const float *a, const float *c, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    size_t n4 = (aligned16(out) && aligned16(a) && aligned16(c)) ? n / 4 : 0;
    if (n4) {
        add_vec4_kernel<<<ew_blocks(s, n4, 2), EW_THREADS, 0, s->stream>>>(
            (float4 *)out, (const float4 *)a, (const float4 *)c, n4);
        CUDA_LAUNCH_CHECK(s);
    }
    if (n4 * 4 < n) {
        size_t off = n4 * 4;
        add_kernel<<<ew_blocks(s, n - off, 4), EW_THREADS, 0, s->stream>>>(out + off, a + off,
                                                                          c + off, n - off);
        CUDA_LAUNCH_CHECK(s);
    }
}

void cuda_accumulate(fp8t_backend *b, float *out, const float *x, size_t n) {
    cuda_add(b, out, out, x, n);
}

__global__ void scale_kernel(float *out, float sc, size_t n) {
    GRID_STRIDE(i, n) out[i] *= sc;
}

void cuda_scale(fp8t_backend *b, float *out, float sc, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    scale_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(out, sc, n);
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

__global__ void adamw_kernel(float *params, float *m, float *v, const float *__restrict__ grads,
                             size_t n, float lr, float beta1, float beta2, float eps, float wd,
                             float bc1, float bc2, float grad_scale) {
    /* the CPU backend's operations in its order, without FMA contraction (_rn intrinsics), so
     * both backends take the same optimizer step bit for bit */
    const float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    GRID_STRIDE(i, n) {
        float g = __fmul_rn(grads[i], grad_scale);
        float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(omb1, g));
        float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(omb2, g), g));
        m[i] = mi;
        v[i] = vi;
        float mhat = __fdiv_rn(mi, bc1), vhat = __fdiv_rn(vi, bc2);
        float p = params[i];
        float upd = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), eps)), __fmul_rn(wd, p));
        params[i] = __fsub_rn(p, __fmul_rn(lr, upd));
    }
}

void cuda_adamw(fp8t_backend *b, float *params, float *m, float *v, const float *grads,
                size_t n, float lr, float beta1, float beta2, float eps, float wd, int t,
                float grad_scale) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    /* bias corrections on the host, once per call */
    float bc1 = 1.0f - powf(beta1, (float)t);
    float bc2 = 1.0f - powf(beta2, (float)t);
    adamw_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(
        params, m, v, grads, n, lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale);
    CUDA_LAUNCH_CHECK(s);
}
