/* dev/cuda/skinny_ladder.cu — the FP8 GEMMs of a decode step (M <= 64 tokens against a weight
 * matrix): cuBLASLt's FP8 and BF16 kernels, the backend's path, against a weight-streaming
 * kernel of our own that was tried for issue 21 and is not in the backend, because it lost.
 *
 * Build and run from the repository root (the CUDA runtime and cuBLASLt; sm_90a):
 *
 *   make BUILD=build-gpu build-gpu/dev/cuda/skinny_ladder && build-gpu/dev/cuda/skinny_ladder
 *
 * Optional arguments: `skinny_ladder [iters]` (timed launches per case, default 50). Build
 * with -DSK_UNROLL=8 or 16 for the kernel's other batch depths.
 *
 * Versions:
 *   1  cuBLASLt, C[M,N] = X[M,K] W[N,K]^T in FP8 (E4M3 x E4M3, per-tensor scales, FP32 out,
 *      no fast accumulation) and in BF16: what gemm_fp8 / gemm_bf16_rounded run.
 *   2  the kernel below: a block of one warpgroup owns 64 weight rows and a K range; every
 *      lane loads its rows' 16-byte pieces straight into registers as wgmma's A fragment
 *      (m64nNk32, N = 8..64 tokens), the tokens go to shared memory as its B; the K ranges of
 *      a row tile form a thread-block cluster (up to 8) that sums the partial tiles through
 *      distributed shared memory in rank order (deterministic, no workspace).
 *
 * Why it lost (H100 80GB HBM3, 2026-12-07, 50 launches per case, weights from DRAM; the table
 * is in bench/RESULTS.md): cuBLASLt FP8 at M = 64 takes 6.9-12.4 µs on the layers' projections
 * (2.6-16.8 MB of weights, 0.37-1.36 TB/s), 17.4 µs on llama's gate+up (33.6 MB, 1.92 TB/s)
 * and 2.0-2.3 TB/s on the heads (80-263 MB); the kernel took 8.8-25.3 µs on the same, 0.55-
 * 0.84x cuBLASLt at its best batch depth (4), 0.77-0.84x at one token. A GEMM this small is a
 * few µs of launch, DRAM latency and ramp before its bytes, for FP8 and BF16 alike, which is
 * why cuBLASLt's FP8 is only 0.96-1.46x its BF16 on the projections (1.72-1.86x on the
 * heads). A first version on mma.sync m16n8k32 FP8 was slower still: Hopper has no warp-level
 * FP8 MMA and the compiler emulates it through FP16 conversions.
 *
 * The fragment trick (kept because it is what makes the A fragment a plain 16-byte load):
 * wgmma's 8-bit A fragment gives lane (g = lane/4, t = lane%4) of each warp the bytes
 * k = 4t..4t+3 and 16+4t..16+4t+3 of rows g and g+8. A dot product does not depend on which k
 * goes to which slot as long as both operands agree, so lane t loads bytes 16t..16t+15 of a
 * 64-deep chunk of its two rows and feeds bytes 0-7 to one k32 step and 8-15 to the next; the
 * tokens' tiles are written with the same permutation.
 *
 * Checks (before anything is timed): version 2 against a double-precision sum of the decoded
 * codes times both scales, relative to the largest |C|, within 5e-4 (gpu_test's bound for
 * the FP8 tensor cores), on shapes with M = 1, 7, 16, 33, 64, N not a multiple of 64, the
 * bias and accumulation; version 1 FP8 on the same data for comparison (measured: 1.7e-5 to
 * 1.4e-4 for the kernel, 3.5e-5 to 2.7e-4 for cuBLASLt).
 *
 * Timing: CUDA events around `iters` launches (cuBLASLt's descriptors and algorithm made
 * before, as the backend caches them); each launch reads the next of several weight copies
 * that together exceed the 50 MB L2, so the weights come from DRAM as in a decode step.
 * GB/s counts the weight bytes alone (the tokens and C are small). The GPT-2 head is timed at
 * N = 50264 (cuBLASLt's FP8 needs N % 16 == 0; the backend pads the head likewise). */
#include <cooperative_groups.h>

#include "backend/cuda/cuda_common.cuh" /* fp8_format, CUDA_CHECK, fp8_dec_dev */

/* ---- version 2: the kernel ---- */

namespace cg = cooperative_groups;

typedef struct {
    int num_sms;
    cudaStream_t stream;
} skinny_ctx;

#define SK_THREADS 128 /* one warpgroup */
#define SK_ROWS 64     /* rows of B per block: wgmma's M */
#define SK_CHUNK 64    /* k per step of the loads: 4 lanes x 16 bytes, two wgmma k32 */
#ifndef SK_UNROLL      /* -DSK_UNROLL=8 or 16 times other depths (slower on an H100) */
#define SK_UNROLL 4    /* chunks whose weight loads are in flight together */
#endif
#define SK_MAX_CLUSTER 8
/* the tokens' smem tiles, K-major without swizzle: 8-token x 16-byte core matrices, the two
 * k halves of a k32 step SK_LBO apart, consecutive 8-token groups SK_SBO apart */
#define SK_LBO 128
#define SK_SBO 256

/* wgmma m64nNk32, A (the weights) from registers, B (the tokens) from shared memory through
 * its descriptor, FP32 accumulators d [N/2] in the m64nN layout; scale_d 0 starts the sum. */
#define SK_DREGS_4 "{%0, %1, %2, %3}"
#define SK_DOUTS_4 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define SK_TAIL_4 "{%4, %5, %6, %7}, %8, p, 1, 1"
#define SK_PRED_4 "%9"
#define SK_DREGS_8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define SK_DOUTS_8                                                                               \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define SK_TAIL_8 "{%8, %9, %10, %11}, %12, p, 1, 1"
#define SK_PRED_8 "%13"
#define SK_DREGS_16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define SK_DOUTS_16                                                                              \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),          \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),  \
        "+f"(d[14]), "+f"(d[15])
#define SK_TAIL_16 "{%16, %17, %18, %19}, %20, p, 1, 1"
#define SK_PRED_16 "%21"
#define SK_DREGS_32                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define SK_DOUTS_32                                                                              \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),          \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),  \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),            \
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define SK_TAIL_32 "{%32, %33, %34, %35}, %36, p, 1, 1"
#define SK_PRED_32 "%37"
#define SK_WGMMA(N, NR, TT)                                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SK_PRED_##NR                                \
                 ", 0;\n"                                                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." TT " " SK_DREGS_##NR          \
                 ", " SK_TAIL_##NR ";\n}\n"                                                      \
                 : SK_DOUTS_##NR                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d))

template <int NT, bool W_E5, bool X_E5>
__device__ __forceinline__ void wgmma_rs(float (&d)[NT / 2], const unsigned (&a)[4],
                                         uint64_t desc, int scale_d) {
#define SK_TYPES(N, NR)                                                                          \
    if (!W_E5 && !X_E5)                                                                          \
        SK_WGMMA(N, NR, "e4m3.e4m3");                                                            \
    else if (!W_E5 && X_E5)                                                                      \
        SK_WGMMA(N, NR, "e4m3.e5m2");                                                            \
    else                                                                                         \
        SK_WGMMA(N, NR, "e5m2.e4m3");
    if constexpr (NT == 8) {
        SK_TYPES(8, 4)
    } else if constexpr (NT == 16) {
        SK_TYPES(16, 8)
    } else if constexpr (NT == 32) {
        SK_TYPES(32, 16)
    } else {
        static_assert(NT == 64, "token tiles of 8, 16, 32 or 64");
        SK_TYPES(64, 32)
    }
#undef SK_TYPES
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit_wait() {
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::
                     : "memory");
}
/* the generic-proxy smem stores before it visible to wgmma's reads */
__device__ __forceinline__ void fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ uint64_t smem_desc(const void *p) {
    const uint64_t addr = (uint64_t)__cvta_generic_to_shared(p);
    return ((addr & 0x3FFFFu) >> 4) | ((uint64_t)(SK_LBO >> 4) << 16) |
           ((uint64_t)(SK_SBO >> 4) << 32);
}

/* W: wgmma's A = our B [N,K] (weights), X: wgmma's B = our A [M,K] (tokens, NT >= M of them
 * in the tile, zeros past M). W_E5 / X_E5: E5M2 codes (else E4M3). */
template <int NT, bool W_E5, bool X_E5>
__global__ void __launch_bounds__(SK_THREADS)
    gemm_fp8_skinny_kernel(float *__restrict__ C, const uint8_t *__restrict__ X,
                           const uint8_t *__restrict__ W, int M, int N, int K,
                           const float *__restrict__ sx, const float *__restrict__ sw, int acc,
                           const float *__restrict__ bias) {
    constexpr int TILE = NT * 32; /* bytes of one k32 step's token tile */
    /* the batch's token tiles [2 * SK_UNROLL][TILE]; after the products, the block's partial
     * sums [NT][SK_ROWS] floats (NT * 256 bytes <= 2 * SK_UNROLL * TILE) */
    __shared__ __align__(128) uint8_t smem[2 * SK_UNROLL * TILE];
    cg::cluster_group cluster = cg::this_cluster();
    const int S = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * SK_ROWS;
    const int chunks = K / SK_CHUNK;
    const int c_begin = (int)((long)chunks * rank / S);
    const int c_end = (int)((long)chunks * (rank + 1) / S);

    const int r0 = n0 + warp * 16 + g, r1 = r0 + 8; /* this lane's two weight rows */
    const uint4 *w0 = reinterpret_cast<const uint4 *>(W + (size_t)(r0 < N ? r0 : 0) * K) + t;
    const uint4 *w1 = reinterpret_cast<const uint4 *>(W + (size_t)(r1 < N ? r1 : 0) * K) + t;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

    float sum[NT / 2], d[NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; i++) sum[i] = 0.0f, d[i] = 0.0f;

    for (int c0 = c_begin; c0 < c_end; c0 += SK_UNROLL) {
        uint4 wa[SK_UNROLL], wb[SK_UNROLL];
#pragma unroll
        for (int u = 0; u < SK_UNROLL; u++) { /* every weight load of the batch first */
            const int c = c0 + u;
            wa[u] = c < c_end && r0 < N ? __ldg(w0 + 4 * c) : zero;
            wb[u] = c < c_end && r1 < N ? __ldg(w1 + 4 * c) : zero;
        }
        /* the tokens' codes of the batch into the tiles, one (token, chunk) pair per thread and
         * round: 16-byte piece p of a chunk (bytes 16p..16p+15, what weight lane t = p holds)
         * has the k of step h = 0 in its words 0, 1 and of h = 1 in words 2, 3; word 0 goes to
         * the step's logical bytes 4p..4p+3 (first core matrix), word 1 to 16+4p.. (second):
         * the slots the weight fragment's a0..a3 feed with the same bytes of their rows. So the
         * four pieces' word 0s make the step-0 tile's first core-matrix row, their word 1s its
         * second, and so on: four 16-byte loads, four 16-byte stores. */
        const int nb = c_end - c0 < SK_UNROLL ? c_end - c0 : SK_UNROLL;
        constexpr int ROUNDS = (NT * SK_UNROLL + SK_THREADS - 1) / SK_THREADS;
        uint4 xv[ROUNDS][4];
#pragma unroll
        for (int j = 0; j < ROUNDS; j++) { /* every token load first */
            const int i = (int)threadIdx.x + j * SK_THREADS;
            const int u = i % SK_UNROLL, tok = i / SK_UNROLL;
            const bool live = tok < M && u < nb;
            const uint4 *src = reinterpret_cast<const uint4 *>(
                X + (size_t)(live ? tok : 0) * K + (size_t)(c0 + (live ? u : 0)) * SK_CHUNK);
#pragma unroll
            for (int p = 0; p < 4; p++) xv[j][p] = live ? __ldg(src + p) : zero;
        }
        __syncthreads(); /* the previous batch's products are done with the tiles */
#pragma unroll
        for (int j = 0; j < ROUNDS; j++) {
            const int i = (int)threadIdx.x + j * SK_THREADS;
            const int u = i % SK_UNROLL, tok = i / SK_UNROLL;
            if (tok >= NT || u >= nb) continue;
            uint4 *s0 = reinterpret_cast<uint4 *>(smem + (2 * u) * TILE + (tok >> 3) * SK_SBO +
                                                  (tok & 7) * 16);
            uint4 *s1 = reinterpret_cast<uint4 *>(reinterpret_cast<uint8_t *>(s0) + TILE);
            const uint4(&v)[4] = xv[j];
            s0[0] = make_uint4(v[0].x, v[1].x, v[2].x, v[3].x);
            s0[SK_LBO / 16] = make_uint4(v[0].y, v[1].y, v[2].y, v[3].y);
            s1[0] = make_uint4(v[0].z, v[1].z, v[2].z, v[3].z);
            s1[SK_LBO / 16] = make_uint4(v[0].w, v[1].w, v[2].w, v[3].w);
        }
        fence_async_smem();
        __syncthreads();
#pragma unroll
        for (int u = 0; u < SK_UNROLL; u++) {
            if (u >= nb) break;
            /* each chunk's two k32 steps start a fresh sum, promoted into FP32 after them
             * (a wait per chunk: the weights' loads, not the products, bound the time) */
            const unsigned a0[4] = {wa[u].x, wb[u].x, wa[u].y, wb[u].y};
            const unsigned a1[4] = {wa[u].z, wb[u].z, wa[u].w, wb[u].w};
            wgmma_fence();
            wgmma_rs<NT, W_E5, X_E5>(d, a0, smem_desc(smem + (2 * u) * TILE), 0);
            wgmma_rs<NT, W_E5, X_E5>(d, a1, smem_desc(smem + (2 * u + 1) * TILE), 1);
            wgmma_commit_wait();
#pragma unroll
            for (int i = 0; i < NT / 2; i++) sum[i] += d[i];
        }
    }

    /* d's layout: d[4i], d[4i+1] row g, tokens 8i + 2t, +1; d[4i+2], d[4i+3] row g + 8 */
    __syncthreads();                               /* the tiles become the partial sums */
    float *part = reinterpret_cast<float *>(smem); /* [NT][SK_ROWS] */
#pragma unroll
    for (int i = 0; i < NT / 8; i++) {
        const int tok = 8 * i + 2 * t, row = warp * 16 + g;
        part[tok * SK_ROWS + row] = sum[4 * i];
        part[(tok + 1) * SK_ROWS + row] = sum[4 * i + 1];
        part[tok * SK_ROWS + row + 8] = sum[4 * i + 2];
        part[(tok + 1) * SK_ROWS + row + 8] = sum[4 * i + 3];
    }
    cluster.sync();

    /* rank r finishes its share of the tile's M x 64 values, four at a time, summing the
     * ranks in order (every rank's load issued before the first add) */
    const float scale = *sx * *sw;
    const int E4 = M * SK_ROWS / 4;
    const int e_begin = E4 * rank / S, e_end = E4 * (rank + 1) / S;
    for (int e = e_begin + (int)threadIdx.x; e < e_end; e += SK_THREADS) {
        float4 v[SK_MAX_CLUSTER];
#pragma unroll
        for (int q = 0; q < SK_MAX_CLUSTER; q++)
            if (q < S)
                v[q] = reinterpret_cast<const float4 *>(cluster.map_shared_rank(part, q))[e];
        float s[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
#pragma unroll
        for (int q = 1; q < SK_MAX_CLUSTER; q++)
            if (q < S) s[0] += v[q].x, s[1] += v[q].y, s[2] += v[q].z, s[3] += v[q].w;
        const int tok = 4 * e / SK_ROWS, nn = n0 + 4 * e % SK_ROWS;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int n = nn + k;
            if (n < N) {
                float o = s[k] * scale;
                float *cp = C + (size_t)tok * N + n;
                if (acc) o = *cp + o;
                if (bias) o = o + bias[n];
                *cp = o;
            }
        }
    }
    cluster.sync(); /* the peers read this block's part until here */
}

template <int NT, bool W_E5, bool X_E5>
static void launch_skinny(skinny_ctx *s, float *C, const uint8_t *A, const uint8_t *B, int M,
                          int N, int K, const float *sa, const float *sb, int acc,
                          const float *bias, int S) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(cdiv_u((size_t)N, SK_ROWS), (unsigned)S, 1);
    cfg.blockDim = dim3(SK_THREADS, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = (unsigned)S;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemm_fp8_skinny_kernel<NT, W_E5, X_E5>, C, A, B, M, N, K,
                                  sa, sb, acc, bias));
    CUDA_CHECK(cudaGetLastError());
}

template <int NT>
static void launch_skinny_fmt(skinny_ctx *s, float *C, const uint8_t *A, fp8_format fa,
                              const uint8_t *B, fp8_format fb, int M, int N, int K,
                              const float *sa, const float *sb, int acc, const float *bias,
                              int S) {
    /* the kernel's W is our B, its X our A */
    const bool we5 = fb == FP8_E5M2, xe5 = fa == FP8_E5M2;
    if (!we5 && !xe5)
        launch_skinny<NT, false, false>(s, C, A, B, M, N, K, sa, sb, acc, bias, S);
    else if (!we5 && xe5)
        launch_skinny<NT, false, true>(s, C, A, B, M, N, K, sa, sb, acc, bias, S);
    else
        launch_skinny<NT, true, false>(s, C, A, B, M, N, K, sa, sb, acc, bias, S);
}

/* The split of K over a cluster: the fewest ranks (at most 8, each at least 2 chunks) that give
 * about two blocks per SM. */
static int skinny_split(const skinny_ctx *s, int N, int K) {
    const int tiles = (int)cdiv_u((size_t)N, SK_ROWS), chunks = K / SK_CHUNK;
    int S = 1;
    while (S < SK_MAX_CLUSTER && tiles * S < 2 * s->num_sms && chunks / (S + 1) >= 2) S++;
    return S;
}

/* C[M,N] (=|+=) A[M,K] * B[N,K]^T * (*sa * *sb) (+ bias[N]), C packed: 0, or -1 for a problem
 * the kernel does not take (nothing launched) */
static int gemm_fp8_skinny(skinny_ctx *s, float *C, const uint8_t *A, fp8_format fa,
                           const uint8_t *B, fp8_format fb, int M, int N, int K, const float *sa,
                           const float *sb, int acc, const float *bias) {
    if ((fa == FP8_E5M2 && fb == FP8_E5M2) || M < 1 || M > 64 || N < 1 || K < SK_CHUNK ||
        K % SK_CHUNK != 0 || !aligned16(A) || !aligned16(B))
        return -1;
    const int S = skinny_split(s, N, K);
    if (M <= 8)
        launch_skinny_fmt<8>(s, C, A, fa, B, fb, M, N, K, sa, sb, acc, bias, S);
    else if (M <= 16)
        launch_skinny_fmt<16>(s, C, A, fa, B, fb, M, N, K, sa, sb, acc, bias, S);
    else if (M <= 32)
        launch_skinny_fmt<32>(s, C, A, fa, B, fb, M, N, K, sa, sb, acc, bias, S);
    else
        launch_skinny_fmt<64>(s, C, A, fa, B, fb, M, N, K, sa, sb, acc, bias, S);
    return 0;
}

#include <math.h>
#include <string.h>
#include <vector>

#include "lt_plan.cuh" /* LT_CHECK, lt_plan: cuBLASLt's side */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
/* random E4M3 codes of values in about [-4, 4] (no NaN) */
static void random_codes(std::vector<uint8_t> &c) {
    for (auto &x : c) {
        float v = ((float)(next_u32() & 0xFFFFFF) / 16777216.0f - 0.5f) * 8.0f;
        x = (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    }
}
static float dec(uint8_t c) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
    return __half2float(__half(h));
}

__global__ void codes_to_bf16(__nv_bfloat16 *o, const uint8_t *c, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        o[i] = __float2bfloat16(fp8_dec_dev(c[i], FP8_E4M3));
}

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 50;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("skinny_ladder: %s, %d SMs, wgmma descriptor LBO %d SBO %d\n", prop.name,
           prop.multiProcessorCount, SK_LBO, SK_SBO);
    skinny_ctx st;
    st.num_sms = prop.multiProcessorCount;
    CUDA_CHECK(cudaStreamCreate(&st.stream));
    cublasLtHandle_t lt;
    LT_CHECK(cublasLtCreate(&lt));
    size_t ws_bytes = 32u << 20;
    void *ws;
    CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    /* the two scales 16 bytes apart: cuBLASLt wants aligned scale pointers */
    float hs[8] = {0.0123f, 0, 0, 0, 0.456f, 0, 0, 0}, *ds;
    CUDA_CHECK(cudaMalloc(&ds, 8 * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(ds, hs, sizeof(hs), cudaMemcpyHostToDevice));
    int fails = 0;

    /* ---- checks ---- */
    static const int checks[][5] = {/* M, N, K, acc, bias */
                                    {64, 4800, 1600, 0, 1}, {64, 2048, 8192, 1, 0},
                                    {1, 3072, 2048, 0, 0},  {7, 1000, 1600, 0, 1},
                                    {33, 200, 128, 1, 1},   {64, 96, 64, 0, 0},
                                    {16, 50000, 256, 0, 0}};
    for (auto &cs : checks) {
        const int M = cs[0], N = cs[1], K = cs[2], acc = cs[3], with_bias = cs[4];
        std::vector<uint8_t> hx((size_t)M * K), hw((size_t)N * K);
        random_codes(hx), random_codes(hw);
        std::vector<float> hc0((size_t)M * N), hb(N);
        for (auto &v : hc0) v = (float)(next_u32() % 1000) / 100.0f - 5.0f;
        for (auto &v : hb) v = (float)(next_u32() % 1000) / 100.0f - 5.0f;
        uint8_t *dx, *dw;
        float *dc, *db, *dc1;
        CUDA_CHECK(cudaMalloc(&dx, hx.size()));
        CUDA_CHECK(cudaMalloc(&dw, hw.size()));
        CUDA_CHECK(cudaMalloc(&dc, hc0.size() * 4));
        CUDA_CHECK(cudaMalloc(&dc1, hc0.size() * 4));
        CUDA_CHECK(cudaMalloc(&db, hb.size() * 4));
        CUDA_CHECK(cudaMemcpy(dx, hx.data(), hx.size(), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dw, hw.data(), hw.size(), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dc, hc0.data(), hc0.size() * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(db, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
        if (gemm_fp8_skinny(&st, dc, dx, FP8_E4M3, dw, FP8_E4M3, M, N, K, ds, ds + 4, acc,
                            with_bias ? db : nullptr) != 0) {
            printf("FAIL  %dx%dx%d: the kernel refused the shape\n", M, N, K);
            fails++;
            continue;
        }
        lt_plan pl = lt_prepare(lt, ws_bytes, CUDA_R_8F_E4M3, CUDA_R_32F, M, N, K, ds + 4, ds);
        lt_run(lt, pl, st.stream, ws, ws_bytes, dw, dx, dc1);
        lt_free(pl);
        CUDA_CHECK(cudaStreamSynchronize(st.stream));
        std::vector<float> out(hc0.size()), out_lt(hc0.size());
        CUDA_CHECK(cudaMemcpy(out.data(), dc, out.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(out_lt.data(), dc1, out.size() * 4, cudaMemcpyDeviceToHost));
        std::vector<float> xf(hx.size()), wf(hw.size());
        for (size_t i = 0; i < hx.size(); i++) xf[i] = dec(hx[i]);
        for (size_t i = 0; i < hw.size(); i++) wf[i] = dec(hw[i]);
        double maxref = 0, maxerr = 0, maxerr_lt = 0;
        std::vector<double> ref((size_t)M * N), prod((size_t)M * N);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double sacc = 0;
                for (int k = 0; k < K; k++)
                    sacc += (double)xf[(size_t)m * K + k] * wf[(size_t)n * K + k];
                prod[(size_t)m * N + n] = sacc * hs[0] * hs[4];
                double r = prod[(size_t)m * N + n];
                if (acc) r += hc0[(size_t)m * N + n];
                if (with_bias) r += hb[n];
                ref[(size_t)m * N + n] = r;
                maxref = fmax(maxref, fabs(r));
            }
        for (size_t i = 0; i < ref.size(); i++) {
            maxerr = fmax(maxerr, fabs(out[i] - ref[i]));
            maxerr_lt = fmax(maxerr_lt, fabs(out_lt[i] - prod[i]));
        }
        const double rel = maxerr / maxref, rel_lt = maxerr_lt / maxref;
        const int ok = rel <= 5e-4 && isfinite(rel);
        fails += !ok;
        printf("%s  %3dx%6dx%5d%s%s  v2 rel err %.3e  (v1 cuBLASLt FP8, no acc/bias: %.3e)\n",
               ok ? "PASS" : "FAIL", M, N, K, acc ? " acc" : "", with_bias ? " +bias" : "", rel,
               rel_lt);
        cudaFree(dx), cudaFree(dw), cudaFree(dc), cudaFree(dc1), cudaFree(db);
    }
    if (fails) {
        printf("%d check(s) failed: nothing timed\n", fails);
        return 1;
    }

    /* ---- timing at the decode shapes of GPT-2 1.5B and llama-1b ---- */
    static const struct {
        const char *name;
        int M, N, K;
    } shapes[] = {
        {"gpt2-1.5b qkv", 64, 4800, 1600},   {"gpt2-1.5b proj", 64, 1600, 1600},
        {"gpt2-1.5b fc", 64, 6400, 1600},    {"gpt2-1.5b fc2", 64, 1600, 6400},
        {"gpt2-1.5b head", 64, 50264, 1600}, {"llama-1b qkv", 64, 3072, 2048},
        {"llama-1b o", 64, 2048, 2048},      {"llama-1b gate+up", 64, 16384, 2048},
        {"llama-1b down", 64, 2048, 8192},   {"llama-1b head", 64, 128256, 2048},
        {"llama-1b qkv b1", 1, 3072, 2048},  {"llama-1b down b1", 1, 2048, 8192},
    };
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    printf("\n%-18s %5s %6s %5s | %9s %7s | %9s %7s | %9s %7s | %7s %7s | %9s %9s %7s\n", "shape",
           "M", "N", "K", "lt bf16", "GB/s", "lt fp8", "GB/s", "skinny", "GB/s", "lt8/16",
           "sk/lt8", "best16", "best8", "b8/b16");
    for (auto &sh : shapes) {
        const int M = sh.M, N = sh.N, K = sh.K;
        const size_t wbytes = (size_t)N * K;
        const int copies = (int)(400e6 / (double)wbytes) + 2; /* > 400 MB of FP8 weights */
        const int nc = copies > 64 ? 64 : copies;
        std::vector<uint8_t> hx((size_t)M * K), hw(wbytes);
        random_codes(hx), random_codes(hw);
        uint8_t *dx, *dw8;
        __nv_bfloat16 *dx16, *dw16;
        float *dc;
        CUDA_CHECK(cudaMalloc(&dx, hx.size()));
        CUDA_CHECK(cudaMalloc(&dx16, hx.size() * 2));
        CUDA_CHECK(cudaMalloc(&dc, (size_t)M * N * 4));
        CUDA_CHECK(cudaMemcpy(dx, hx.data(), hx.size(), cudaMemcpyHostToDevice));
        codes_to_bf16<<<256, 256>>>(dx16, dx, hx.size());
        /* nc copies of FP8 weights (and nc / 2 of BF16 ones: the same bytes in flight) */
        CUDA_CHECK(cudaMalloc(&dw8, wbytes * nc));
        for (int c = 0; c < nc; c++)
            CUDA_CHECK(cudaMemcpy(dw8 + wbytes * c, hw.data(), wbytes, cudaMemcpyHostToDevice));
        const int nc16 = nc / 2 > 1 ? nc / 2 : 2;
        CUDA_CHECK(cudaMalloc(&dw16, wbytes * 2 * nc16));
        for (int c = 0; c < nc16; c++)
            codes_to_bf16<<<1024, 256>>>(dw16 + wbytes * c, dw8, wbytes);
        CUDA_CHECK(cudaDeviceSynchronize());
        lt_plan p16 =
            lt_prepare(lt, ws_bytes, CUDA_R_16BF, CUDA_R_32F, M, N, K, nullptr, nullptr);
        lt_plan p8 = lt_prepare(lt, ws_bytes, CUDA_R_8F_E4M3, CUDA_R_32F, M, N, K, ds + 4, ds);
        /* launch i of version v: 0 BF16, 1 FP8 (cuBLASLt at its plan's pick), 2 the kernel */
        auto launch = [&](int v, int i) {
            if (v == 0)
                lt_run(lt, p16, st.stream, ws, ws_bytes, dw16 + wbytes * (i % nc16), dx16, dc);
            else if (v == 1)
                lt_run(lt, p8, st.stream, ws, ws_bytes, dw8 + wbytes * (i % nc), dx, dc);
            else
                gemm_fp8_skinny(&st, dc, dx, FP8_E4M3, dw8 + wbytes * (i % nc), FP8_E4M3, M, N, K,
                                ds, ds + 4, 0, nullptr);
        };
        /* ms per launch of version v, after 3 untimed */
        auto time_ms = [&](int v) {
            for (int i = 0; i < 3; i++) launch(v, i);
            CUDA_CHECK(cudaEventRecord(e0, st.stream));
            for (int i = 0; i < iters; i++) launch(v, i);
            CUDA_CHECK(cudaEventRecord(e1, st.stream));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float t;
            CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
            return (double)t / iters;
        };
        /* 0-2 as launch's versions with the heuristic's first algorithm (as the backend), then
         * 3 BF16 and 4 FP8 at the fastest of its up to 16 candidates */
        double ms[5];
        for (int v = 0; v < 3; v++) ms[v] = time_ms(v);
        for (int v = 0; v < 2; v++) {
            lt_plan &p = v == 0 ? p16 : p8;
            ms[3 + v] = 1e30;
            for (p.pick = 0; p.pick < p.nalgo; p.pick++) ms[3 + v] = fmin(ms[3 + v], time_ms(v));
            p.pick = 0;
        }
        printf("%-18s %5d %6d %5d | %7.1f us %7.0f | %7.1f us %7.0f | %7.1f us %7.0f | %6.2fx "
               "%6.2fx | %6.1f us %6.1f us %6.2fx (of %d/%d)\n",
               sh.name, M, N, K, ms[0] * 1e3, 2.0 * wbytes / ms[0] / 1e6, ms[1] * 1e3,
               wbytes / ms[1] / 1e6, ms[2] * 1e3, wbytes / ms[2] / 1e6, ms[0] / ms[1],
               ms[1] / ms[2], ms[3] * 1e3, ms[4] * 1e3, ms[3] / ms[4], p16.nalgo, p8.nalgo);
        lt_free(p16), lt_free(p8);
        cudaFree(dx), cudaFree(dx16), cudaFree(dc), cudaFree(dw8), cudaFree(dw16);
    }
    printf(
        "(lt8/16: cuBLASLt FP8 over BF16 speed; sk/lt8: the kernel over cuBLASLt FP8; best16 / "
        "best8: the fastest of cuBLASLt's candidates, b8/b16 their ratio)\n");
    return 0;
}
