/* dev/cuda/misc_ladder.cu — the memory-bound kernels of src/backend/cuda/cuda_misc.cu
 * (bias_add, GELU, SwiGLU, add / accumulate / scale, AdamW, embedding backward), before and
 * after vectorization: every op is checked bit for bit against the previous kernels, then both
 * are timed on GPT-2 1.5B shapes (16 x 1024 tokens).
 *
 * Build and run from the repository root (needs only the CUDA runtime, linked statically):
 *
 *   mkdir -p build-misc/dev && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xcompiler -Wall,-Wextra -o build-misc/dev/misc_ladder dev/cuda/misc_ladder.cu && build-misc/dev/misc_ladder
 *
 * Optional arguments: `misc_ladder [iters]` (timed iterations per case, default 20).
 *
 * Versions:
 *   1  the previous kernels and their launches, copied here verbatim but for the names:
 *      scalar grid-stride loops (bias_add with k % OC per element), add as a float4 launch
 *      plus a scalar launch for the tail.
 *   2  cuda_misc.cu as it is now (#included below, so this is the shipped code): float4
 *      groups when every pointer is 16-byte aligned, the n % 4 tail in the same launch;
 *      bias_add with threads over columns and rows walked per thread.
 *
 * Checks (all must pass before anything is timed): every buffer of version 2 equals version 1
 * bit for bit after the op, on sizes with and without an n % 4 tail, pointers 16-byte aligned
 * and misaligned by one float, the aliasing the op table allows (gelu_backward dx = dout,
 * add out = a and out = c, accumulate), data with NaN, +-Inf, signed zeros, subnormals and
 * huge values. Each buffer has guard floats after the op's range, so a write out of range
 * shows as a difference (version 1 never writes there).
 *
 * Timing: CUDA events around `iters` launches; every timed buffer is larger than the 60 MB L2,
 * so the figures are DRAM-bound. GB/s counts the bytes each op must read and write once. */
#include "backend/cuda/cuda_misc.cu"

#include <string.h>
#include <vector>

/* ---- what cuda_misc.cu asks of the rest of the backend (not linked in) ---- */
void *cuda_scratch(fp8t_backend *b, int slot, size_t bytes) {
    cuda_state *s = cuda_of(b);
    if (s->scratch_bytes[slot] < bytes) {
        CUDA_CHECK(cudaStreamSynchronize(s->stream));
        if (s->scratch[slot]) CUDA_CHECK(cudaFree(s->scratch[slot]));
        CUDA_CHECK(cudaMalloc(&s->scratch[slot], bytes));
        s->scratch_bytes[slot] = bytes;
    }
    return s->scratch[slot];
}

void cuda_column_sums(fp8t_backend *, float *, const float *, int, int) {
    fprintf(stderr, "misc_ladder: bias_backward is not part of this ladder\n");
    exit(1);
}

/* ---- version 1: the previous kernels, verbatim but for the names ---- */
__global__ void v1_bias_add_kernel(float *out, const float *__restrict__ bias, int OC, size_t n) {
    GRID_STRIDE(k, n) out[k] += bias[k % OC];
}

static void v1_bias_add(fp8t_backend *b, float *out, const float *bias, int N, int OC) {
    if (N <= 0 || OC <= 0) return;
    cuda_state *s = cuda_of(b);
    size_t n = (size_t)N * OC;
    v1_bias_add_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(out, bias, OC, n);
    CUDA_LAUNCH_CHECK(s);
}

__global__ void v1_gelu_forward_kernel(float *out, const float *x, size_t n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float u = GELU_SCALE * (v + 0.044715f * v * v * v);
        out[i] = v * (1.0f / (1.0f + expf(-2.0f * u)));
    }
}

__global__ void v1_gelu_backward_kernel(float *dx, const float *x, const float *dout, size_t n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float u = GELU_SCALE * (v + 0.044715f * v * v * v);
        float sg = 1.0f / (1.0f + expf(-2.0f * u));
        float du_dv = GELU_SCALE * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = (sg + 2.0f * v * sg * (1.0f - sg) * du_dv) * dout[i];
    }
}

__global__ void v1_swiglu_forward_kernel(float *out, const float *gate, const float *up,
                                         size_t n) {
    GRID_STRIDE(i, n) {
        float g = gate[i];
        float sig = 1.0f / (1.0f + expf(-g));
        out[i] = g * sig * up[i];
    }
}

__global__ void v1_swiglu_backward_kernel(float *dgate, float *dup, const float *dout,
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

__global__ void v1_add_kernel(float *out, const float *a, const float *c, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + c[i];
}
__global__ void v1_add_vec4_kernel(float4 *out, const float4 *a, const float4 *c, size_t n4) {
    GRID_STRIDE(i, n4) {
        float4 x = a[i], y = c[i];
        out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}

static void v1_add(fp8t_backend *b, float *out, const float *a, const float *c, size_t n) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    size_t n4 = (aligned16(out) && aligned16(a) && aligned16(c)) ? n / 4 : 0;
    if (n4) {
        v1_add_vec4_kernel<<<ew_blocks(s, n4, 2), EW_THREADS, 0, s->stream>>>(
            (float4 *)out, (const float4 *)a, (const float4 *)c, n4);
        CUDA_LAUNCH_CHECK(s);
    }
    if (n4 * 4 < n) {
        size_t off = n4 * 4;
        v1_add_kernel<<<ew_blocks(s, n - off, 4), EW_THREADS, 0, s->stream>>>(out + off, a + off,
                                                                              c + off, n - off);
        CUDA_LAUNCH_CHECK(s);
    }
}

__global__ void v1_scale_kernel(float *out, float sc, size_t n) {
    GRID_STRIDE(i, n) out[i] *= sc;
}

__global__ void v1_adamw_kernel(float *params, float *m, float *v,
                                const float *__restrict__ grads, size_t n, float lr, float beta1,
                                float beta2, float eps, float wd, float bc1, float bc2,
                                float grad_scale) {
    const float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    GRID_STRIDE(i, n) {
        float g = __fmul_rn(grads[i], grad_scale);
        float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(omb1, g));
        float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(omb2, g), g));
        m[i] = mi;
        v[i] = vi;
        float mhat = __fdiv_rn(mi, bc1), vhat = __fdiv_rn(vi, bc2);
        float p = params[i];
        float upd =
            __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), eps)), __fmul_rn(wd, p));
        params[i] = __fsub_rn(p, __fmul_rn(lr, upd));
    }
}

static void v1_adamw(fp8t_backend *b, float *params, float *m, float *v, const float *grads,
                     size_t n, float lr, float beta1, float beta2, float eps, float wd, int t,
                     float grad_scale) {
    if (!n) return;
    cuda_state *s = cuda_of(b);
    float bc1 = 1.0f - powf(beta1, (float)t);
    float bc2 = 1.0f - powf(beta2, (float)t);
    v1_adamw_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(
        params, m, v, grads, n, lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale);
    CUDA_LAUNCH_CHECK(s);
}

__global__ void v1_embedding_backward_wte_kernel(float *dwte, const float *__restrict__ dout,
                                                 const int *__restrict__ sorted_tok,
                                                 const int *__restrict__ sorted_pos, int N,
                                                 int C) {
    int j = blockIdx.x;
    int tok = sorted_tok[j];
    if (j > 0 && sorted_tok[j - 1] == tok) return;
    int end = j + 1;
    while (end < N && sorted_tok[end] == tok) end++;
    float *row = dwte + (size_t)tok * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = row[c];
        for (int k = j; k < end; k++) acc += dout[(size_t)sorted_pos[k] * C + c];
        row[c] = acc;
    }
}

__global__ void v1_embedding_backward_wpe_kernel(float *dwpe, const float *__restrict__ dout,
                                                 int B, int T, int C) {
    GRID_STRIDE(k, (size_t)T * C) {
        size_t t = k / C, c = k % C;
        float acc = dwpe[k];
        for (int bb = 0; bb < B; bb++) acc += dout[((size_t)bb * T + t) * C + c];
        dwpe[k] = acc;
    }
}

static void v1_embedding_backward(fp8t_backend *b, float *dwte, float *dwpe, const float *dout,
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
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, tok_sorted, pos_in,
                                                   pos_sorted, N, 0, 32, s->stream));
        CUDA_LAUNCH_CHECK(s);
        int threads = C >= 256 ? 256 : (C >= 128 ? 128 : 64);
        v1_embedding_backward_wte_kernel<<<N, threads, 0, s->stream>>>(dwte, dout, tok_sorted,
                                                                       pos_sorted, N, C);
        CUDA_LAUNCH_CHECK(s);
    }
    if (dwpe) {
        v1_embedding_backward_wpe_kernel<<<ew_blocks(s, (size_t)T * C, 1), EW_THREADS, 0,
                                           s->stream>>>(dwpe, dout, B, T, C);
        CUDA_LAUNCH_CHECK(s);
    }
}

/* ---- the ops, by version, on buffers p[0..] of n floats each (some ops alias them) ---- */
static cuda_state g_state;
static fp8t_backend g_be;

#define ADAMW_ARGS 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.5f

typedef struct {
    const char *name;
    int nbuf;
    void (*run)(int version, float **p, size_t n);
    double bytes_per_elem; /* DRAM bytes the op must move per element, for GB/s */
} ew_op;

static void run_gelu_fwd(int v, float **p, size_t n) {
    if (v == 1) {
        v1_gelu_forward_kernel<<<ew_blocks(&g_state, n, 4), EW_THREADS, 0, g_state.stream>>>(
            p[0], p[1], n);
        CUDA_LAUNCH_CHECK(&g_state);
    } else {
        cuda_gelu_forward(&g_be, p[0], p[1], n);
    }
}
static void run_gelu_bwd(int v, float **p, size_t n) {
    if (v == 1) {
        v1_gelu_backward_kernel<<<ew_blocks(&g_state, n, 4), EW_THREADS, 0, g_state.stream>>>(
            p[0], p[1], p[2], n);
        CUDA_LAUNCH_CHECK(&g_state);
    } else {
        cuda_gelu_backward(&g_be, p[0], p[1], p[2], n);
    }
}
/* dx aliasing dout, as the backward of the MLP does */
static void run_gelu_bwd_alias(int v, float **p, size_t n) {
    float *q[3] = {p[0], p[1], p[0]};
    run_gelu_bwd(v, q, n);
}
static void run_swiglu_fwd(int v, float **p, size_t n) {
    if (v == 1) {
        v1_swiglu_forward_kernel<<<ew_blocks(&g_state, n, 4), EW_THREADS, 0, g_state.stream>>>(
            p[0], p[1], p[2], n);
        CUDA_LAUNCH_CHECK(&g_state);
    } else {
        cuda_swiglu_forward(&g_be, p[0], p[1], p[2], NULL, NULL, n);
    }
}
static void run_swiglu_bwd(int v, float **p, size_t n) {
    if (v == 1) {
        v1_swiglu_backward_kernel<<<ew_blocks(&g_state, n, 4), EW_THREADS, 0, g_state.stream>>>(
            p[0], p[1], p[2], p[3], p[4], n);
        CUDA_LAUNCH_CHECK(&g_state);
    } else {
        cuda_swiglu_backward(&g_be, p[0], p[1], p[2], p[3], p[4], NULL, NULL, n);
    }
}
static void run_add(int v, float **p, size_t n) {
    if (v == 1)
        v1_add(&g_be, p[0], p[1], p[2], n);
    else
        cuda_add(&g_be, p[0], p[1], p[2], n);
}
static void run_add_out_a(int v, float **p, size_t n) {
    if (v == 1)
        v1_add(&g_be, p[0], p[0], p[1], n);
    else
        cuda_add(&g_be, p[0], p[0], p[1], n);
}
static void run_add_out_c(int v, float **p, size_t n) {
    if (v == 1)
        v1_add(&g_be, p[0], p[1], p[0], n);
    else
        cuda_add(&g_be, p[0], p[1], p[0], n);
}
static void run_accumulate(int v, float **p, size_t n) {
    if (v == 1)
        v1_add(&g_be, p[0], p[0], p[1], n);
    else
        cuda_accumulate(&g_be, p[0], p[1], n);
}
static void run_scale(int v, float **p, size_t n) {
    if (v == 1) {
        v1_scale_kernel<<<ew_blocks(&g_state, n, 4), EW_THREADS, 0, g_state.stream>>>(p[0],
                                                                                      0.999f, n);
        CUDA_LAUNCH_CHECK(&g_state);
    } else {
        cuda_scale(&g_be, p[0], 0.999f, n);
    }
}
static void run_adamw(int v, float **p, size_t n) {
    if (v == 1)
        v1_adamw(&g_be, p[0], p[1], p[2], p[3], n, ADAMW_ARGS);
    else
        cuda_adamw(&g_be, p[0], p[1], p[2], p[3], n, ADAMW_ARGS);
}

static const ew_op OPS[] = {
    {"gelu_forward", 2, run_gelu_fwd, 8},
    {"gelu_backward", 3, run_gelu_bwd, 12},
    {"gelu_backward dx=dout", 2, run_gelu_bwd_alias, 12},
    {"swiglu_forward", 3, run_swiglu_fwd, 12},
    {"swiglu_backward", 5, run_swiglu_bwd, 20},
    {"add", 3, run_add, 12},
    {"add out=a", 2, run_add_out_a, 12},
    {"add out=c", 2, run_add_out_c, 12},
    {"accumulate", 2, run_accumulate, 12},
    {"scale", 1, run_scale, 8},
    {"adamw", 4, run_adamw, 28},
};
#define N_OPS (sizeof(OPS) / sizeof(OPS[0]))

/* ---- test data ---- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float rng_normal(void) {
    float u1 = (rng_u32() + 1.0f) / 4294967296.0f, u2 = rng_u32() / 4294967296.0f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* mostly N(0, 3), with every 97th value a special (NaN, +-Inf, +-0, subnormal, huge, tiny) */
static void fill(float *x, size_t n) {
    static const uint32_t specials[] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x00000000u,
                                        0x80000000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu,
                                        0xFF7FFFFFu, 0x00800000u, 0x42C80000u, 0xC2C80000u};
    for (size_t i = 0; i < n; i++) {
        if (i % 97 == 13) {
            uint32_t u = specials[(i / 97) % (sizeof(specials) / sizeof(specials[0]))];
            memcpy(&x[i], &u, 4);
        } else {
            x[i] = 3.0f * rng_normal();
        }
    }
}

/* ---- checks ---- */
static int n_pass, n_fail;

static void report(const char *what, const char *shape, int ok) {
    printf("%s %s [%s]\n", ok ? "PASS" : "FAIL", what, shape);
    if (ok)
        n_pass++;
    else
        n_fail++;
}

#define GUARD 8 /* floats after each op's range */

/* both versions from the same starting buffers; every float of every buffer must match */
static void check_op(const ew_op *op, size_t n, size_t off) {
    size_t len = off + n + GUARD;
    std::vector<float> init(len * op->nbuf), got1(len * op->nbuf), got2(len * op->nbuf);
    fill(init.data(), init.size());
    float *dev[2];
    float *p[2][5];
    for (int v = 0; v < 2; v++) {
        CUDA_CHECK(cudaMalloc(&dev[v], init.size() * 4));
        CUDA_CHECK(cudaMemcpy(dev[v], init.data(), init.size() * 4, cudaMemcpyHostToDevice));
        for (int k = 0; k < op->nbuf; k++) p[v][k] = dev[v] + k * len + off;
        op->run(v + 1, p[v], n);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(got1.data(), dev[0], init.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(got2.data(), dev[1], init.size() * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got1.size(); i++)
        if (memcmp(&got1[i], &got2[i], 4) && !bad++) first = i;
    char shape[96];
    snprintf(shape, sizeof(shape), "n=%zu, +%zu floats", n, off);
    if (bad)
        printf("  %zu floats differ, first: buffer %zu float %zu\n", bad, first / len,
               first % len);
    report(op->name, shape, !bad);
    CUDA_CHECK(cudaFree(dev[0]));
    CUDA_CHECK(cudaFree(dev[1]));
}

static void check_bias(int N, int OC, size_t off) {
    size_t len_out = off + (size_t)N * OC + GUARD, len_b = off + OC + GUARD;
    std::vector<float> init(len_out + len_b), got1(init.size()), got2(init.size());
    fill(init.data(), init.size());
    float *dev[2];
    for (int v = 0; v < 2; v++) {
        CUDA_CHECK(cudaMalloc(&dev[v], init.size() * 4));
        CUDA_CHECK(cudaMemcpy(dev[v], init.data(), init.size() * 4, cudaMemcpyHostToDevice));
        float *out = dev[v] + off, *bias = dev[v] + len_out + off;
        if (v == 0)
            v1_bias_add(&g_be, out, bias, N, OC);
        else
            cuda_bias_add(&g_be, out, bias, N, OC);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(got1.data(), dev[0], init.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(got2.data(), dev[1], init.size() * 4, cudaMemcpyDeviceToHost));
    char shape[96];
    snprintf(shape, sizeof(shape), "N%d OC%d, +%zu floats", N, OC, off);
    report("bias_add", shape, memcmp(got1.data(), got2.data(), init.size() * 4) == 0);
    CUDA_CHECK(cudaFree(dev[0]));
    CUDA_CHECK(cudaFree(dev[1]));
}

/* dwte [V, C], dwpe [T, C], dout [B, T, C] in one allocation, tokens with many repeats */
static void check_embedding_backward(int B, int T, int C, int V, size_t off) {
    size_t lw = off + (size_t)V * C + GUARD, lp = off + (size_t)T * C + GUARD;
    size_t ld = off + (size_t)B * T * C + GUARD;
    std::vector<float> init(lw + lp + ld), got1(init.size()), got2(init.size());
    fill(init.data(), init.size());
    std::vector<int> tok((size_t)B * T);
    for (size_t i = 0; i < tok.size(); i++) tok[i] = (int)(rng_u32() % (uint32_t)V);
    int *dtok;
    CUDA_CHECK(cudaMalloc(&dtok, tok.size() * 4));
    CUDA_CHECK(cudaMemcpy(dtok, tok.data(), tok.size() * 4, cudaMemcpyHostToDevice));
    float *dev[2];
    for (int v = 0; v < 2; v++) {
        CUDA_CHECK(cudaMalloc(&dev[v], init.size() * 4));
        CUDA_CHECK(cudaMemcpy(dev[v], init.data(), init.size() * 4, cudaMemcpyHostToDevice));
        float *dwte = dev[v] + off, *dwpe = dev[v] + lw + off, *dout = dev[v] + lw + lp + off;
        if (v == 0)
            v1_embedding_backward(&g_be, dwte, dwpe, dout, dtok, B, T, C);
        else
            cuda_embedding_backward(&g_be, dwte, dwpe, dout, dtok, B, T, C);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(got1.data(), dev[0], init.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(got2.data(), dev[1], init.size() * 4, cudaMemcpyDeviceToHost));
    char shape[96];
    snprintf(shape, sizeof(shape), "B%d T%d C%d V%d, +%zu floats", B, T, C, V, off);
    report("embedding_backward", shape, memcmp(got1.data(), got2.data(), init.size() * 4) == 0);
    CUDA_CHECK(cudaFree(dev[0]));
    CUDA_CHECK(cudaFree(dev[1]));
    CUDA_CHECK(cudaFree(dtok));
}

static void run_checks(void) {
    static const size_t ns[] = {1, 3, 4, 5, 1001, 4096, (1u << 20) + 3};
    for (size_t o = 0; o < N_OPS; o++)
        for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
            for (size_t off = 0; off < 2; off++) check_op(&OPS[o], ns[ni], off);
    static const int bias_cases[][2] = {{1, 1}, {7, 33},     {300, 768}, {5000, 64}, {2048, 2304},
                                        {3, 4}, {100, 1600}, {20, 6400}, {9, 50257}};
    for (size_t ci = 0; ci < sizeof(bias_cases) / sizeof(bias_cases[0]); ci++)
        for (size_t off = 0; off < 2; off++)
            check_bias(bias_cases[ci][0], bias_cases[ci][1], off);
    static const int emb_cases[][4] = {
        {4, 64, 768, 1000}, {2, 33, 6, 7}, {3, 17, 64, 5}, {2, 128, 1600, 4099}};
    for (size_t ci = 0; ci < sizeof(emb_cases) / sizeof(emb_cases[0]); ci++)
        for (size_t off = 0; off < 2; off++)
            check_embedding_backward(emb_cases[ci][0], emb_cases[ci][1], emb_cases[ci][2],
                                     emb_cases[ci][3], off);
}

/* ---- timing ---- */
static float time_ms(int iters, void (*fn)(int, float **, size_t), int v, float **p, size_t n) {
    fn(v, p, n); /* warm-up */
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, g_state.stream));
    for (int it = 0; it < iters; it++) fn(v, p, n);
    CUDA_CHECK(cudaEventRecord(e1, g_state.stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return ms / iters;
}

static int g_bias_N, g_bias_OC;
static void run_bias(int v, float **p, size_t) {
    if (v == 1)
        v1_bias_add(&g_be, p[0], p[1], g_bias_N, g_bias_OC);
    else
        cuda_bias_add(&g_be, p[0], p[1], g_bias_N, g_bias_OC);
}

static void bench_line(const char *name, const char *shape, double bytes, int iters,
                       void (*fn)(int, float **, size_t), float **p, size_t n) {
    float ms1 = time_ms(iters, fn, 1, p, n), ms2 = time_ms(iters, fn, 2, p, n);
    printf("%-22s %-16s v1 %8.3f ms %7.0f GB/s   v2 %8.3f ms %7.0f GB/s   x%.2f\n", name, shape,
           ms1, bytes / ms1 / 1e6, ms2, bytes / ms2 / 1e6, ms1 / ms2);
}

static void bench(int iters) {
    const size_t tokens = 16 * 1024, C = 1600;
    const size_t n_max = tokens * 4 * C; /* the MLP hidden activations */
    float *p[5];
    for (int k = 0; k < 5; k++) {
        CUDA_CHECK(cudaMalloc(&p[k], n_max * 4));
        CUDA_CHECK(cudaMemset(p[k], 0, n_max * 4));
    }
    /* small, finite, non-negative values (AdamW's v): no slow paths in the timed runs */
    std::vector<float> h(n_max);
    for (size_t i = 0; i < n_max; i++) h[i] = 0.01f * (float)(i % 201);
    for (int k = 0; k < 5; k++)
        CUDA_CHECK(cudaMemcpy(p[k], h.data(), n_max * 4, cudaMemcpyHostToDevice));
    printf("\n%-22s %-16s (%d iterations each)\n", "op", "shape", iters);
    for (size_t o = 0; o < N_OPS; o++) {
        size_t n = (OPS[o].run == run_add || OPS[o].run == run_add_out_a ||
                    OPS[o].run == run_add_out_c || OPS[o].run == run_accumulate)
                       ? tokens * C /* residual stream */
                       : n_max;
        char shape[32];
        snprintf(shape, sizeof(shape), "n=%zu", n);
        bench_line(OPS[o].name, shape, OPS[o].bytes_per_elem * n, iters, OPS[o].run, p, n);
    }
    static const int ocs[] = {1600, 4800, 6400};
    for (int oc : ocs) {
        g_bias_N = (int)tokens, g_bias_OC = oc;
        char shape[32];
        snprintf(shape, sizeof(shape), "N%zu OC%d", tokens, oc);
        bench_line("bias_add", shape, 8.0 * tokens * oc, iters, run_bias, p, 0);
    }
    for (int k = 0; k < 5; k++) CUDA_CHECK(cudaFree(p[k]));
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    if (iters < 1) {
        fprintf(stderr, "usage: %s [iters >= 1]\n", argv[0]);
        return 2;
    }
    int dev = 0;
    CUDA_CHECK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    g_state.device = dev;
    g_state.num_sms = prop.multiProcessorCount;
    CUDA_CHECK(cudaStreamCreate(&g_state.stream));
    g_be.name = "cuda";
    g_be.impl = &g_state;

    run_checks();
    if (n_fail) {
        printf("checks failed: not timing\n");
        return 1;
    }
    bench(iters);
    printf("\n%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
