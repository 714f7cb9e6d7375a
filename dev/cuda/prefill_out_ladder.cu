/* dev/cuda/prefill_out_ladder.cu — what the inference prefill would gain if its GEMMs wrote
 * BF16 instead of FP32 (issue 21: FP8 prefill is only ~1.3x BF16 because the work around the
 * GEMMs costs both precisions the same, and much of it is FP32 GEMM outputs written and read
 * back). Times, at the prefill shapes of GPT-2 1.5B and llama-1b:
 *
 *   1  cuBLASLt FP8 (E4M3 x E4M3, per-tensor scales) with D in FP32 (what gemm_fp8 runs)
 *   2  the same with D in BF16 (C and D BF16, the FP32 sum rounded once in the epilogue)
 *   3  cuBLASLt BF16 with D in FP32 (gemm_bf16_rounded)
 *   4  the same with D in BF16
 *   and the consumer of the MLP's hidden rows: SwiGLU (llama) / GELU (GPT-2) into FP8 codes,
 *   reading FP32 rows (today) against BF16 rows.
 *
 * Build and run from the repository root (the CUDA runtime and cuBLASLt; sm_90a):
 *
 *   make BUILD=build-gpu build-gpu/dev/cuda/prefill_out_ladder &&
 *   build-gpu/dev/cuda/prefill_out_ladder [iters]
 *
 * Checks before timing: version 2's BF16 against the BF16 rounding (nearest even) of version
 * 1's FP32 on the same data, counted as equal / one BF16 step apart / further (the two may run
 * different kernels that sum in another order), and likewise 4 against 3.
 *
 * Measured (H100 80GB HBM3, 2026-12-07; the table is in bench/RESULTS.md): BF16 output makes
 * the FP8 GEMMs 1.03-1.19x faster and the BF16 ones 1.01-1.12x (the FP32 output's bytes weigh
 * more next to FP8's halved inputs), every BF16 output the rounding of the FP32 one bit for
 * bit; SwiGLU reading BF16 1.52-1.61x faster, GELU not at all (bound by its arithmetic). A
 * layer's four GEMMs are 1.54-1.59x faster in FP8 than in BF16 at these shapes (without fast
 * accumulation), which bounds the prefill's FP8/BF16 from above before any other work. */
#include <math.h>
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_common.cuh" /* CUDA_CHECK, fp8x4_enc_dev, swiglu_value, gelu */
#include "lt_plan.cuh"                  /* LT_CHECK, lt_plan */

/* random E4M3 codes (device), values in about [-4, 4]; their BF16 copies (exact) */
__global__ void init_codes(uint8_t *c, __nv_bfloat16 *b, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        float v = ((float)(h & 0xFFFFFF) / 16777216.0f - 0.5f) * 8.0f;
        c[i] = (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
        b[i] = __float2bfloat16(fp8_dec_dev(c[i], FP8_E4M3));
    }
}

/* four values of a row of T (FP32 or BF16) as floats */
__device__ __forceinline__ float4 load4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 load4(const __nv_bfloat16 *p) {
    const uint2 u = *(const uint2 *)p;
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xFFFF0000u));
}
/* the hidden rows' consumer: FP8 codes of swiglu(g, u) * scale (u != NULL) or of
 * gelu(g + bias) * scale, four values a thread */
template <typename T>
__global__ void hidden_to_fp8(uint32_t *out, const T *__restrict__ g, const T *__restrict__ u,
                              const float *__restrict__ bias, int cols, size_t n4, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 a = load4(g + 4 * i), r;
        if (u) {
            const float4 b = load4(u + 4 * i);
            r = make_float4(swiglu_value(a.x, b.x), swiglu_value(a.y, b.y),
                            swiglu_value(a.z, b.z), swiglu_value(a.w, b.w));
        } else {
            const float4 bb = *(const float4 *)(bias + (4 * i) % cols);
            r = make_float4(gelu_dev(a.x + bb.x), gelu_dev(a.y + bb.y), gelu_dev(a.z + bb.z),
                            gelu_dev(a.w + bb.w));
        }
        out[i] = fp8x4_enc_dev(r.x * scale, r.y * scale, r.z * scale, r.w * scale, FP8_E4M3);
    }
}
__global__ void round_bf16(__nv_bfloat16 *o, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        o[i] = __float2bfloat16_rn(x[i]);
}

struct shape {
    const char *model, *name;
    int N, K;
};

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 20;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("prefill_out_ladder: %s, %d SMs, %d timed launches a case\n", prop.name,
           prop.multiProcessorCount, iters);
    cudaStream_t st;
    CUDA_CHECK(cudaStreamCreate(&st));
    cublasLtHandle_t lt;
    LT_CHECK(cublasLtCreate(&lt));
    size_t wsb = 32u << 20;
    void *ws;
    CUDA_CHECK(cudaMalloc(&ws, wsb));
    float hs[8] = {0.0123f, 0, 0, 0, 0.456f, 0, 0, 0}, *ds;
    CUDA_CHECK(cudaMalloc(&ds, sizeof(hs)));
    CUDA_CHECK(cudaMemcpy(ds, hs, sizeof(hs), cudaMemcpyHostToDevice));
    const int Mmax = 8192, Nmax = 8192, Kmax = 8192;
    uint8_t *x8, *w8;
    __nv_bfloat16 *x16, *w16, *d16, *r16;
    float *d32;
    CUDA_CHECK(cudaMalloc(&x8, (size_t)Mmax * Kmax));
    CUDA_CHECK(cudaMalloc(&w8, (size_t)Nmax * Kmax));
    CUDA_CHECK(cudaMalloc(&x16, (size_t)Mmax * Kmax * 2));
    CUDA_CHECK(cudaMalloc(&w16, (size_t)Nmax * Kmax * 2));
    CUDA_CHECK(cudaMalloc(&d16, (size_t)Mmax * Nmax * 2 * 2));
    CUDA_CHECK(cudaMalloc(&r16, (size_t)Mmax * Nmax * 2));
    CUDA_CHECK(cudaMalloc(&d32, (size_t)Mmax * Nmax * 4 * 2));
    init_codes<<<1024, 256, 0, st>>>(x8, x16, (size_t)Mmax * Kmax, 1u);
    init_codes<<<1024, 256, 0, st>>>(w8, w16, (size_t)Nmax * Kmax, 7u);
    CUDA_CHECK(cudaStreamSynchronize(st));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));

    static const shape shapes[] = {
        {"gpt2-1.5b", "qkv", 4800, 1600}, {"gpt2-1.5b", "proj", 1600, 1600},
        {"gpt2-1.5b", "fc1", 6400, 1600}, {"gpt2-1.5b", "fc2", 1600, 6400},
        {"llama-1b", "qkv", 3072, 2048},  {"llama-1b", "o", 2048, 2048},
        {"llama-1b", "gate", 8192, 2048}, {"llama-1b", "down", 2048, 8192},
    };
    std::vector<uint16_t> h16;
    std::vector<float> h32;
    printf("\n%-10s %-5s %5s | %9s %9s %6s | %9s %9s %6s | %6s %6s | BF16 D vs rounded FP32 D "
           "(FP8 / BF16): equal, 1 step, more\n",
           "model", "gemm", "M", "fp8 f32", "fp8 bf16", "gain", "bf16 f32", "bf16 bf16", "gain",
           "f8/16", "f8/16");
    for (int M : {2048, 8192}) {
        for (const shape &s : shapes) {
            const int N = s.N, K = s.K;
            lt_plan p[4] = {lt_prepare(lt, wsb, CUDA_R_8F_E4M3, CUDA_R_32F, M, N, K, ds, ds + 4),
                            lt_prepare(lt, wsb, CUDA_R_8F_E4M3, CUDA_R_16BF, M, N, K, ds, ds + 4),
                            lt_prepare(lt, wsb, CUDA_R_16BF, CUDA_R_32F, M, N, K, NULL, NULL),
                            lt_prepare(lt, wsb, CUDA_R_16BF, CUDA_R_16BF, M, N, K, NULL, NULL)};
            const void *W[4] = {w8, w8, w16, w16}, *X[4] = {x8, x8, x16, x16};
            void *D[4] = {d32, d16, d32, d16};
            /* checks: BF16 D against the rounding of FP32 D */
            long cnt[2][3] = {{0, 0, 0}, {0, 0, 0}};
            const size_t n = (size_t)M * N;
            for (int v = 0; v < 2; v++) {
                lt_run(lt, p[2 * v], st, ws, wsb, W[2 * v], X[2 * v], d32);
                lt_run(lt, p[2 * v + 1], st, ws, wsb, W[2 * v + 1], X[2 * v + 1], d16);
                round_bf16<<<1024, 256, 0, st>>>(r16, d32, n);
                CUDA_CHECK(cudaStreamSynchronize(st));
                h16.resize(2 * n);
                CUDA_CHECK(cudaMemcpy(h16.data(), d16, n * 2, cudaMemcpyDeviceToHost));
                CUDA_CHECK(cudaMemcpy(h16.data() + n, r16, n * 2, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < n; i++) {
                    const int d = abs((int)(int16_t)h16[i] - (int)(int16_t)h16[n + i]);
                    cnt[v][d == 0 ? 0 : d == 1 ? 1 : 2]++;
                }
            }
            float us[4];
            for (int v = 0; v < 4; v++) {
                for (int w = 0; w < 3; w++) lt_run(lt, p[v], st, ws, wsb, W[v], X[v], D[v]);
                CUDA_CHECK(cudaEventRecord(e0, st));
                for (int w = 0; w < iters; w++) lt_run(lt, p[v], st, ws, wsb, W[v], X[v], D[v]);
                CUDA_CHECK(cudaEventRecord(e1, st));
                CUDA_CHECK(cudaEventSynchronize(e1));
                float ms;
                CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                us[v] = 1000.0f * ms / iters;
                lt_free(p[v]);
            }
            printf("%-10s %-5s %5d | %9.1f %9.1f %5.2fx | %9.1f %9.1f %5.2fx | %5.2fx %5.2fx | "
                   "%ld %ld %ld / %ld %ld %ld\n",
                   s.model, s.name, M, us[0], us[1], us[0] / us[1], us[2], us[3], us[2] / us[3],
                   us[2] / us[0], us[3] / us[1], cnt[0][0], cnt[0][1], cnt[0][2], cnt[1][0],
                   cnt[1][1], cnt[1][2]);
        }
    }

    /* the hidden rows' consumer */
    printf("\n%-24s %5s | %9s %9s %6s   (us; GB/s read+written FP32 / BF16)\n", "consumer", "M",
           "f32 in", "bf16 in", "gain");
    float *bias = d32 + (size_t)Mmax * Nmax * 2 - 8192;
    CUDA_CHECK(cudaMemset(bias, 0, 8192 * 4));
    CUDA_CHECK(cudaMemset(d32, 0, (size_t)Mmax * Nmax * 4 * 2 - 8192 * 4));
    CUDA_CHECK(cudaMemset(d16, 0, (size_t)Mmax * Nmax * 2 * 2));
    for (int M : {2048, 8192}) {
        for (int sw = 0; sw < 2; sw++) {
            const int H = sw ? 8192 : 6400;
            const size_t n = (size_t)M * H, n4 = n / 4;
            float us[2];
            for (int v = 0; v < 2; v++) {
                const int grid = prop.multiProcessorCount * 8;
                auto launch = [&]() {
                    if (v == 0)
                        hidden_to_fp8<float><<<grid, 256, 0, st>>>(
                            (uint32_t *)x8, d32, sw ? d32 + n : NULL, bias, H, n4, 0.5f);
                    else
                        hidden_to_fp8<__nv_bfloat16><<<grid, 256, 0, st>>>(
                            (uint32_t *)x8, d16, sw ? d16 + n : NULL, bias, H, n4, 0.5f);
                };
                for (int w = 0; w < 3; w++) launch();
                CUDA_CHECK(cudaEventRecord(e0, st));
                for (int w = 0; w < iters; w++) launch();
                CUDA_CHECK(cudaEventRecord(e1, st));
                CUDA_CHECK(cudaEventSynchronize(e1));
                float ms;
                CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                us[v] = 1000.0f * ms / iters;
            }
            const double in = sw ? 2.0 : 1.0;
            printf("%-24s %5d | %9.1f %9.1f %5.2fx   (%.0f / %.0f GB/s)\n",
                   sw ? "llama-1b swiglu->fp8" : "gpt2-1.5b gelu->fp8", M, us[0], us[1],
                   us[0] / us[1], (double)n * (4 * in + 1) / (us[0] * 1e3),
                   (double)n * (2 * in + 1) / (us[1] * 1e3));
        }
    }
    CUDA_CHECK(cudaGetLastError());
    return 0;
}
