/* CUDA backend — private declarations shared by the .cu files of src/backend/cuda.
 *
 * Every op runs on the backend's single stream; nothing waits for the device except to_host,
 * synchronize, free and scratch growth. Determinism: no op uses floating-point atomics; every
 * reduction cuts its input into pieces that depend on the sizes only and combines the partial
 * results in a fixed order, so two runs on the same GPU give bit-identical results.
 *
 * Switches (fp8t_backend_options, fixed at create; `fp8train train --disable cuda-fusion`,
 * `--cuda-attn`, `--cuda-sync`, `--disable cuda-lt-fp8` set them):
 *   plain                  every fused or cached path falls back to its plain version: the
 *                          simple attention kernels, separate amax/cast/transpose kernels for
 *                          quantize, packed BF16 GEMM operands with a separate amax pass, no
 *                          cuBLASLt algorithm cache, no RoPE table cache.
 *   attn = flash|cudnn|gemm|tiled|simple   the attention kernels alone. flash
 *                          (the default; head sizes 32, 64, 128, others fall back to
 *                          tiled/simple): BF16 tensor-core flash attention, except head size
 *                          128, which goes to cuDNN's fused attention when the build has cuDNN
 *                          (cuda_attention_cudnn.cu; flash where cuDNN refuses a shape);
 *                          cudnn: cuDNN for head sizes 32, 64 and 128 too; flash: never cuDNN;
 *                          gemm: cuBLASLt batched BF16 GEMMs
 *                          over [T,T] score blocks. Both round q, k, v, P, dout and dS to BF16
 *                          and accumulate in FP32. tiled and simple are FP32 (the CPU backend's
 *                          arithmetic up to summation order): the exact reference.
 *   sync_each_op           synchronize and check for errors after every op (slow; names the
 *                          op that failed instead of a later one).
 *   no_lt_fp8              FP8 GEMMs through the decode + FP32 GEMM fallback instead of
 *                          cuBLASLt's FP8 kernels (isolates cuBLASLt in a bisection). */
#ifndef FP8TRAIN_CUDA_COMMON_CUH
#define FP8TRAIN_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <type_traits>

#include "fp8train/backend.h"
#include "fp8train/error.h"       /* fp8t_warnf */
#include "backend/operand_kind.h" /* fp8t_scaled_quant */
#include "util/check.h"           /* FP8T_FATAL */

/* ---- error checks: the call, file and line, then exit (FP8T_FATAL: a CUDA error leaves the
 * context unusable, so there is nothing sensible to continue with) ---- */
#define CUDA_CHECK(call)                                                                         \
    do {                                                                                         \
        cudaError_t cuda_check_err_ = (call);                                                    \
        if (cuda_check_err_ != cudaSuccess) {                                                    \
            FP8T_FATAL("CUDA error %s (%s) in %s", cudaGetErrorName(cuda_check_err_),            \
                       cudaGetErrorString(cuda_check_err_), #call);                              \
        }                                                                                        \
    } while (0)

#define CUBLAS_CHECK(call)                                                                       \
    do {                                                                                         \
        cublasStatus_t cublas_check_st_ = (call);                                                \
        if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS) {                                         \
            FP8T_FATAL("cuBLAS error %d (%s) in %s", (int)cublas_check_st_,                      \
                       cublasLtGetStatusString(cublas_check_st_), #call);                        \
        }                                                                                        \
    } while (0)

/* After a kernel launch: launch-configuration errors now, execution errors at the next sync
 * (or right away with sync_each_op). */
#define CUDA_LAUNCH_CHECK(s)                                                                     \
    do {                                                                                         \
        CUDA_CHECK(cudaGetLastError());                                                          \
        if ((s)->sync_each_op) CUDA_CHECK(cudaStreamSynchronize((s)->stream));                   \
    } while (0)

/* Scratch buffers owned by the backend; each grows as needed and is reused across calls. Two
 * buffers used by the same op are always different slots. */
enum {
    SCR_GEMM_A = 0, /* bf16 / transposed fp8 / decoded copies of GEMM operand A */
    SCR_GEMM_B,     /* ... of operand B */
    SCR_REDUCE,     /* block partials of reductions (sums, norm weight grads, bias grads) */
    SCR_ATTN,       /* attention: rotated q/k/v per head, D = rowsum(dout*out), dq/dk/dv */
    SCR_SORT,       /* embedding backward: sorted tokens/positions + CUB temp storage */
    SCR_QUANT,      /* block / mxfp8 scales */
    SCR_GEMM_C,     /* a GEMM result with 16-byte aligned rows, copied out to the packed C */
    SCR_ATTN2,      /* attention, tensor-core variants: bf16 copies, [T,T] score/prob blocks */
    SCR_BF16_A,     /* gemm_bf16: the BF16 operand copy of A (gemm_bf16_rounded's input) */
    SCR_BF16_B,     /* ... of B */
    SCR_ACT,        /* quantize_gelu's FP32 GELU output, where it is not fused */
    SCR_GELU_X,     /* a dGELU pass's GELU input widened from its BF16 copy, where the pass
                       reads FP32 (cuda_bf16_widen) */
    SCR_NORM_X,     /* a norm backward's input widened likewise (the row kernels) */
    SCR_COLSUM,     /* column-sum partials of to_bf16_colsum / quantize_colsum */
    SCR_STATS,      /* tensor_stats: block partials, tile scales, per-block results */
    SCR_STATS_PACK, /* tensor_stats: a strided tensor packed for the kernels that read it so */
    SCR_QKV,        /* attention_forward: qkv + qkv_bias, for the paths that do not add it */
    SCR_GEMM_F32,   /* gemm_tn_bf16_out: the FP32 product, where no BF16-output kernel runs */
    SCR_COUNT
};

#define LT_CACHE_SIZE 64
typedef struct {
    int valid;
    int m, n, k, ta, tb, type_a, type_b, acc, fast;
    int lda, ldb, ldc;
    int al_a, al_b, al_c; /* pointer alignments the algorithm was chosen for */
    int compute;          /* cublasComputeType_t */
    int bias;             /* with the bias epilogue */
    int mode_a, mode_b;   /* cuBLASLt scale modes of its A and B (0: one scalar each) */
    int type_d;           /* C's and D's cudaDataType_t */
    int ok;               /* 0: cuBLASLt has no algorithm for this problem (use the fallback) */
    cublasLtMatmulAlgo_t algo;
} lt_cache_entry;

typedef struct {
    int device;
    int num_sms;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt workspace */
    size_t workspace_bytes;
    void *scratch[SCR_COUNT];
    size_t scratch_bytes[SCR_COUNT];
    /* switches (fp8t_backend_options, fixed at creation) */
    int plain;        /* .plain */
    int attn_mode;    /* ATTN_* (.attn) */
    int attn_cudnn;   /* cuDNN SDPA first: 0 no, 1 head size 128 (the default when built
                          * with cuDNN), 2 head sizes 32/64/128 (.attn = cudnn) */
    int sync_each_op; /* .sync_each_op */
    int capturing;    /* between graph_begin and graph_end: nothing may wait or allocate */
    unsigned long scratch_gen; /* scratch reallocations so far (a graph recorded before one
                                  may hold a freed scratch pointer) */
    int no_lt_fp8;             /* .no_lt_fp8 */
    /* cuBLASLt algorithm cache (off with plain) */
    lt_cache_entry lt_cache[LT_CACHE_SIZE];
    int lt_cache_next;
    /* RoPE cos/sin tables [T][HS/2], computed on the host exactly as the CPU backend does */
    float *rope_cos, *rope_sin;
    int rope_T, rope_half;
    float rope_theta;
    fp8t_rope_scaling rope_scaling; /* the scaling the cached tables were made with */
    /* accounting */
    long n_attn_tc, n_attn_fp32; /* attention calls by path (fp8t_cuda_attention_counts) */
    long n_attn_cudnn;           /* ... of the tensor-core ones, through cuDNN */
    size_t bytes_in_use, bytes_peak;
    long n_fp8_lt, n_fp8_fallback; /* gemm_fp8 calls by path (fp8t_cuda_gemm_counts) */
    int warned_lt_reject;          /* cuBLASLt refused a problem its heuristic offered */
    int warned_fp8_bias;           /* no FP8 kernel with the bias epilogue (reported once) */
    int warned_fp8_block;          /* a block-scaled GEMM took the fallback (reported once) */
    long n_fp8_block_lt;           /* ... of the cuBLASLt ones, block-scaled */
    float *fp8_scales;             /* [8] 16-byte aligned copies of FP8 scale_inv pointers */
    /* data parallel (cuda_comm.cu) */
    void *nccl;            /* ncclComm_t once comm_init ran (NULL: none) */
    cudaEvent_t comm_done; /* recorded after each collective, polled with a timeout */
    int comm_rank, comm_size;
    void *cudnn; /* cuda_attention_cudnn.cu: handle and plan cache (NULL until first use) */
    /* the gradient buckets (reduce_start / reduce_wait): NCCL on a stream of their own,
     * ordered after the backward's ops by bucket_ready, the main stream ordered after them by
     * buckets_done; their BF16 copies side by side in bucket_bf16 (reset by each wait) */
    cudaStream_t comm_stream;
    cudaEvent_t bucket_ready, buckets_done;
    int buckets_pending;
    __nv_bfloat16 *bucket_bf16;
    size_t bucket_bf16_cap, bucket_bf16_used;
    /* prefetch_l2: its kernels on a stream of their own (beside the GEMM they run under, not
     * ahead of it on the main stream), forked from the main stream by pf_fork; the main stream
     * waits for pf_done (the last of them) only at the end of a recording and at synchronize
     * (cuda_prefetch_join) */
    cudaStream_t pf_stream;
    cudaEvent_t pf_fork, pf_done;
    int pf_pending;
} cuda_state;

/* the main stream ordered after the last prefetch_l2 kernel (a recording must end joined) */
void cuda_prefetch_join(cuda_state *s);

/* attention implementations (fp8t_backend_options.attn) */
enum { ATTN_TILED = 0, ATTN_SIMPLE, ATTN_FLASH, ATTN_GEMM };

static inline cuda_state *cuda_of(fp8t_backend *b) { return (cuda_state *)b->impl; }

/* A scratch buffer of at least `bytes` (contents undefined). Growing waits for the stream. */
void *cuda_scratch(fp8t_backend *b, int slot, size_t bytes);

/* ---- small device helpers ---- */
static inline unsigned cdiv_u(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
static inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
/* f(i) with i a zero of the narrowest index type whose grid-stride arithmetic over n units
 * cannot wrap: unsigned below 2^31 units, else size_t (a kernel templated on it does its
 * per-element divisions in 32 bits where it can) */
template <typename F> static void with_index_type(size_t n, F f) {
    if (n < ((size_t)1 << 31))
        f(0u);
    else
        f((size_t)0);
}

__device__ __forceinline__ uint8_t fp8_enc_dev(float x, fp8_format fmt) {
    /* __NV_SATFINITE: finite overflow clamps to +-max; NaN stays NaN. On sm_89+ this is the
     * hardware cvt.rn.satfinite instruction, which the test checks against the toolkit's
     * emulation (what the CPU fp8_encode matches) on every float32 input. */
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE,
                                          fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}
/* Four codes packed little-endian (byte 0 = a): two cvt.rn.satfinite.{e4m3,e5m2}x2.f32, the
 * instruction fp8_enc_dev issues for one value, so the bits are the same. */
__device__ __forceinline__ uint32_t fp8x4_enc_dev(float a, float b, float c, float d,
                                                  fp8_format fmt) {
    const __nv_fp8_interpretation_t it = fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2;
    uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, it);
    uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, it);
    return lo | (hi << 16);
}

__device__ __forceinline__ float fp8_dec_dev(uint8_t c, fp8_format fmt) {
    /* exact: every E4M3 and E5M2 value is a half */
    __half_raw h =
        __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
}
/* the codes in the low (.x) and high (.y) byte of c: one conversion instruction for two */
__device__ __forceinline__ float2 fp8x2_dec_dev(uint16_t c, fp8_format fmt) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)c,
                                                     fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half22float2(__half2(h));
}

__device__ __forceinline__ float bf16_round_dev(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
}

/* pointer alignment the vector loads and stores need (NULL passes) */
static inline int aligned4(const void *p) { return ((uintptr_t)p & 3u) == 0; }
static inline int aligned8(const void *p) { return ((uintptr_t)p & 7u) == 0; }
static inline int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* 4 floats rounded to BF16 (nearest even) as 8 bytes, bf16_pack's bits, and back (exact: a
 * BF16 value is its bits in the high half of a float) */
__device__ __forceinline__ uint2 bf16x4_of(float4 v) {
    __nv_bfloat162 p = __floats2bfloat162_rn(v.x, v.y), q = __floats2bfloat162_rn(v.z, v.w);
    return make_uint2(*(unsigned *)&p, *(unsigned *)&q);
}
__device__ __forceinline__ float4 f32x4_of_bf16(uint2 w) {
    return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                       __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
}

/* acc += x per component (float or float4), in the scalar code's operand order: bias_add's
 * one FP32 add wherever a kernel adds a bias to what it loads */
__device__ __forceinline__ void add_into(float &acc, float x) { acc += x; }
__device__ __forceinline__ void add_into(float4 &acc, float4 x) {
    acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
}

/* GELU, the sigmoid form of the tanh approximation (see cpu_misc.c: no cancellation for
 * v < 0): gelu_forward and gelu_forward_bf16 both evaluate exactly this expression. */
__device__ __forceinline__ float gelu_dev(float v) {
    float u = 0.7978845608028654f * (v + 0.044715f * v * v * v); /* sqrt(2/pi) (v + .. v^3) */
    return v * (1.0f / (1.0f + expf(-2.0f * u)));
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* gelu'(v) * d for that form: gelu_backward, gelu_backward_bias and the fused GELU-backward
 * rounding passes all evaluate exactly this expression */
__device__ __forceinline__ float gelu_grad(float v, float d) {
    float u = GELU_SCALE * (v + 0.044715f * v * v * v);
    float sg = 1.0f / (1.0f + expf(-2.0f * u));
    float du_dv = GELU_SCALE * (1.0f + 3.0f * 0.044715f * v * v);
    return (sg + 2.0f * v * sg * (1.0f - sg) * du_dv) * d;
}

/* silu(g) * u: swiglu_forward's value */
__device__ __forceinline__ float swiglu_value(float g, float u) {
    float sig = 1.0f / (1.0f + expf(-g));
    return g * sig * u;
}

/* dgate = d * u * silu'(g), dup = d * silu(g): swiglu_backward's gradients */
__device__ __forceinline__ void swiglu_grads(float &dg, float &du, float d, float g, float u) {
    float sig = 1.0f / (1.0f + expf(-g));
    float silu = g * sig;
    float dsilu = sig * (1.0f + g * (1.0f - sig));
    dg = d * u * dsilu;
    du = d * silu;
}

/* SwiGLU's step in a per-tensor rounding pass, on the 4 consecutive elements e .. e + 3
 * (e % 4 == 0, every array 16-byte aligned, the BF16 ones 8-byte) whose input x holds: SW 1
 * (FP8T_STEP_SWIGLU) swiglu_value(x, up) with x the gate, the BF16 copies of x and up written
 * to save16 / save16b where non-NULL (bf16_pack's bits); SW 2 / 3 (DSWIGLU_GATE / _UP) the
 * gate's / up's gradient of swiglu_grads with x the gradient of SwiGLU's output, the gate read
 * from gate or gate16, up (SW 2 only) from up or up16 */
template <int SW>
__device__ __forceinline__ float4 swiglu_step4(float4 x, size_t e, const float *gate,
                                               const uint16_t *gate16, const float *up,
                                               const uint16_t *up16, uint16_t *save16,
                                               uint16_t *save16b) {
    if (SW == 1) {
        const float4 u = *(const float4 *)(up + e);
        if (save16) *(uint2 *)(save16 + e) = bf16x4_of(x);
        if (save16b) *(uint2 *)(save16b + e) = bf16x4_of(u);
        return make_float4(swiglu_value(x.x, u.x), swiglu_value(x.y, u.y), swiglu_value(x.z, u.z),
                           swiglu_value(x.w, u.w));
    }
    const float4 g =
        gate16 ? f32x4_of_bf16(*(const uint2 *)(gate16 + e)) : *(const float4 *)(gate + e);
    float4 u = make_float4(0.0f, 0.0f, 0.0f, 0.0f); /* up's gradient does not read up */
    if (SW == 2) u = up16 ? f32x4_of_bf16(*(const uint2 *)(up16 + e)) : *(const float4 *)(up + e);
    float4 dg, du;
    swiglu_grads(dg.x, du.x, x.x, g.x, u.x);
    swiglu_grads(dg.y, du.y, x.y, g.y, u.y);
    swiglu_grads(dg.z, du.z, x.z, g.z, u.z);
    swiglu_grads(dg.w, du.w, x.w, g.w, u.w);
    return SW == 2 ? dg : du;
}

/* NaN-propagating max of |v| into acc (acc is a running amax: >= 0 or NaN). */
__device__ __forceinline__ float amax_merge_dev(float acc, float v) {
    if (acc != acc) return acc;
    if (v != v) return v;
    float a = fabsf(v);
    return a > acc ? a : acc;
}

/* *addr = amax_merge(*addr, v) atomically, v >= 0 or NaN. Max is order-independent, so this
 * is deterministic. A NaN already there stays; a NaN arriving wins. */
__device__ __forceinline__ void atomic_amax_merge(float *addr, float v) {
    unsigned int *ua = (unsigned int *)addr;
    unsigned int old = *(volatile unsigned int *)ua;
    for (;;) {
        float of = __uint_as_float(old);
        if (of != of) return; /* NaN is absorbing */
        float nv = (v != v) ? v : (v > of ? v : of);
        if (__float_as_uint(nv) == old) return;
        unsigned int prev = atomicCAS(ua, old, __float_as_uint(nv));
        if (prev == old) return;
        old = prev;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_amax(float acc) {
    for (int o = 16; o > 0; o >>= 1)
        acc = amax_merge_dev(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    return acc;
}

/* Block-wide amax of per-thread running amaxes; result valid in thread 0. blockDim.x must be
 * a multiple of 32 and at most 1024. */
__device__ __forceinline__ float block_amax(float acc) {
    __shared__ float sh_amax[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    acc = warp_amax(acc);
    __syncthreads(); /* sh_amax may still be read by a previous call */
    if (lane == 0) sh_amax[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        acc = lane < nw ? sh_amax[lane] : 0.0f;
        acc = warp_amax(acc);
    }
    return acc;
}

/* Block-wide sum in a fixed tree order; result valid in thread 0. */
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float sh_sum[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh_sum[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        v = lane < nw ? sh_sum[lane] : 0.0f;
        v = warp_sum(v);
    }
    return v;
}

/* Current-scaling formula, on the device: the same steps as fp8t_current_scale (recipe.c). */
__device__ __forceinline__ float current_scale_dev(float amax, float fmt_max, float epsilon,
                                                   int pow2) {
    if (isnan(amax)) return 1.0f; /* first: max(NaN, eps) would hide the NaN */
    if (amax < epsilon) amax = epsilon;
    if (!(amax > 0.0f) || isinf(amax)) return 1.0f;
    float s = fmt_max / amax;
    if (isinf(s)) s = 3.402823466e38f; /* FLT_MAX */
    if (pow2 && s > 0.0f) {
        /* largest power of two <= s: normal keeps sign and exponent; subnormal keeps its
         * highest set bit */
        unsigned int u = __float_as_uint(s);
        if (u >= 0x00800000u)
            u &= 0xff800000u;
        else
            u = 1u << (31 - __clz(u));
        s = __uint_as_float(u);
    }
    return s;
}

/* ---- op implementations, grouped by file ---- */
/* cuda_gemm.cu */
/* cuda_comm.cu: the data-parallel collectives over NCCL */
int cuda_comm_init(fp8t_backend *b, char *err, size_t errlen);
void cuda_allreduce(fp8t_backend *b, float *x, size_t n, fp8t_reduce_op op, int bf16);
void cuda_reduce_scatter(fp8t_backend *b, float *x, const size_t *counts);
void cuda_all_gather(fp8t_backend *b, float *x, const size_t *counts);
void cuda_reduce_start(fp8t_backend *b, float *x, size_t n, const size_t *counts, int bf16);
void cuda_reduce_wait(fp8t_backend *b);
void cuda_broadcast(fp8t_backend *b, void *x, size_t bytes, int root);
void cuda_comm_destroy(cuda_state *s);

void cuda_gemm_f32(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N, int K,
                   int transA, int transB, int acc);
void cuda_gemm_bf16(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N,
                    int K, int transA, int transB, int acc, float *amax_a, float *amax_b);
void cuda_gemm_bf16_rounded(fp8t_backend *b, float *C, const fp8t_bf16_operand *A,
                            const fp8t_bf16_operand *B, int M, int N, int K, int transA,
                            int transB, int acc, const float *bias, int ldc);
void cuda_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                   const fp8t_fp8_operand *B, int M, int N, int K, int transA, int transB,
                   int acc, int fast_accum, float *amax_out, const float *bias);
void cuda_gemm_tn_bf16_out(fp8t_backend *b, uint16_t *C16, const fp8t_fp8_operand *A8,
                           const fp8t_fp8_operand *B8, const fp8t_bf16_operand *A16,
                           const fp8t_bf16_operand *B16, int M, int N, int K, int fast_accum);
/* cuda_operand.cu: make_operand over the kernels below (fp8t_operand_kernel_of) */
void cuda_make_operand(fp8t_backend *b, const fp8t_operand_req *r);
int cuda_make_operand_fuses(fp8t_backend *b, const fp8t_operand_req *r);
/* cuda_quant.cu */
void cuda_amax(fp8t_backend *b, float *amax_out, const float *x, size_t n);
void cuda_quantize(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                   const float *x, int rows, int cols, fp8_format fmt, const float *scale);
/* save16 / x16 (may be NULL): make_operand's save16 / x2_16 (backend.h) */
/* values (may be NULL): make_operand's values, GELU's output (the dGELU's: its gradient) */
void cuda_quantize_gelu(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                        uint16_t *save16, const float *x, const float *bias, int rows, int cols,
                        fp8_format fmt, const float *scale, float *values);
void cuda_quantize_colsum(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                          float *colsum, const float *x, int rows, int cols, fp8_format fmt,
                          const float *scale);
void cuda_compute_scale(fp8t_backend *b, float *scale, float *scale_inv, const float *amax,
                        float fmt_max, float epsilon, int pow2);
void cuda_fake_quantize(fp8t_backend *b, float *out, const float *x, size_t n, fp8_format fmt,
                        const float *scale);
void cuda_block_fake_quantize(fp8t_backend *b, float *out, const float *x, int rows, int cols,
                              int tile_r, int tile_c, fp8_format fmt);
void cuda_block_quantize(fp8t_backend *b, uint8_t *codes, float *scale_inv, const float *x,
                         int rows, int cols, int transpose, fp8t_fp8_scaling scaling,
                         fp8_format fmt, int pow2);
/* out [rows, cols] = code * scale_inv of a K-major operand of any scaling kind */
void cuda_block_decode(fp8t_backend *b, float *out, const fp8t_fp8_operand *o);
void cuda_quantize_scaled(fp8t_backend *b, const fp8t_scaled_quant *q);
/* make_operand's QUANTIZE_SWIGLU / BF16_SWIGLU (operand_kind.h): SwiGLU's step into
 * per-tensor FP8 codes / a BF16 operand */
void cuda_quantize_swiglu(fp8t_backend *b, const fp8t_operand_req *r);
void cuda_bf16_swiglu(fp8t_backend *b, const fp8t_operand_req *r);

/* The inputs of a request's SwiGLU step by role (backend.h): SwiGLU reads x (the gate) and x2
 * (up) and writes the saves; a gradient reads x (SwiGLU's output gradient), x2 / x2_16 (the
 * gate) and, the gate's, x3 / x3_16 (up). */
typedef struct {
    int sw; /* swiglu_step4's SW: 1 SWIGLU, 2 DSWIGLU_GATE, 3 DSWIGLU_UP */
    const float *gate;
    const uint16_t *gate16;
    const float *up;
    const uint16_t *up16;
    uint16_t *save16, *save16b; /* SWIGLU's saves of the gate and up (each may be NULL) */
} swiglu_in;

static inline swiglu_in swiglu_in_of(const fp8t_operand_req *r) {
    swiglu_in in;
    in.sw = r->step == FP8T_STEP_SWIGLU ? 1 : r->step == FP8T_STEP_DSWIGLU_GATE ? 2 : 3;
    in.gate = in.sw == 1 ? NULL : r->x2;
    in.gate16 = in.sw == 1 ? NULL : r->x2_16;
    in.up = in.sw == 1 ? r->x2 : in.sw == 2 ? r->x3 : NULL;
    in.up16 = in.sw == 2 ? r->x3_16 : NULL;
    in.save16 = in.sw == 1 ? r->save16 : NULL;
    in.save16b = in.sw == 1 ? r->save16_2 : NULL;
    return in;
}

/* f(std::integral_constant<int, SW>()) for the request's SW (swiglu_in.sw), so that one
 * generic lambda launches the kernel instantiation of each step */
template <class F> static inline void with_sw(int sw, F &&f) {
    if (sw == 1)
        f(std::integral_constant<int, 1>());
    else if (sw == 2)
        f(std::integral_constant<int, 2>());
    else
        f(std::integral_constant<int, 3>());
}

/* the alignment swiglu_step4 needs of x and every input and save */
static inline int swiglu_in_aligned(const swiglu_in *in, const float *x) {
    return aligned16(x) && aligned16(in->gate) && aligned16(in->up) && aligned8(in->gate16) &&
           aligned8(in->up16) && aligned8(in->save16) && aligned8(in->save16b);
}

/* The CUDA backend's op table (the unfused paths compose requests of these ops themselves, not
 * of whatever table wraps them) */
extern const fp8t_backend_ops cuda_backend_ops;
/* The SwiGLU kernels' unfused path: the step's values in scratch (SCR_ACT), composed by
 * fp8t_operand_step_values (swiglu_forward with the saves, or swiglu_grad), the bits the
 * kernels compute. */
const float *cuda_swiglu_values(fp8t_backend *b, const fp8t_operand_req *r);
/* block_quantize of ROW: one block per operand row (any shape; the fallback's kernel) */
void cuda_row_quantize_generic(fp8t_backend *b, uint8_t *codes, float *scale_inv, const float *x,
                               int rows, int cols, int transpose, fp8_format fmt, int pow2);
void cuda_mxfp8_fake_quantize(fp8t_backend *b, float *out, const float *x, int rows, int cols);
void cuda_bf16_round(fp8t_backend *b, float *out, const float *x, size_t n);
/* cuda_bf16_operand.cu */
void cuda_bf16_pack(fp8t_backend *b, uint16_t *out, const float *x, const float *bias, int rows,
                    int cols);
void cuda_bf16_unpack(fp8t_backend *b, float *out, const uint16_t *x, size_t n);
/* An input in FP32 for a pass that reads no BF16: x itself, or its BF16 copy x16 (x NULL: a
 * layer's save) widened into scratch slot `slot` */
const float *cuda_bf16_widen(fp8t_backend *b, int slot, const float *x, const uint16_t *x16,
                             size_t n);
void cuda_to_bf16_operand(fp8t_backend *b, uint16_t *out, float *amax_out, const float *x,
                          int rows, int cols);
void cuda_gelu_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, uint16_t *save16,
                            const float *x, int rows, int cols);
void cuda_to_bf16_colsum(fp8t_backend *b, uint16_t *out, float *amax_out, float *colsum,
                         const float *x, int rows, int cols);
void cuda_gelu_backward_bf16_colsum(fp8t_backend *b, uint16_t *out, float *amax_out,
                                    float *colsum, const float *dout, const float *x,
                                    const uint16_t *x16, const float *bias, int rows, int cols);
void cuda_gelu_backward_quantize_colsum(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t,
                                        float *amax_out, float *colsum, const float *dout,
                                        const float *x, const uint16_t *x16, const float *bias,
                                        int rows, int cols, fp8_format fmt, const float *scale,
                                        float *values);
void cuda_delayed_update(fp8t_backend *b, float *state, int n, int len, fp8t_amax_algo algo,
                         int margin);
/* helpers used by the GEMMs: codes [rows, cols] -> codes_t [cols, rows];
 * fp8 codes -> floats times *scale_inv */
void cuda_transpose_u8(fp8t_backend *b, uint8_t *out, const uint8_t *in, int rows, int cols);
void cuda_fp8_decode(fp8t_backend *b, float *out, const uint8_t *codes, size_t n, fp8_format fmt,
                     const float *scale_inv);
/* cuda_norm.cu */
void cuda_layernorm_forward(fp8t_backend *b, float *out, float *mean, float *rstd, const float *x,
                            const float *w, const float *bias, int N, int C, float eps);
void cuda_layernorm_backward(fp8t_backend *b, float *dx, float *dw, float *dbias,
                             const float *dout, const float *x, const uint16_t *x16,
                             const float *w, const float *mean, const float *rstd, int N, int C);
void cuda_layernorm_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, float *mean,
                                 float *rstd, const float *x, const float *w, const float *bias,
                                 int N, int C, float eps);
void cuda_add_layernorm_forward_bf16(fp8t_backend *b, float *sum, uint16_t *sum16, uint16_t *out,
                                     float *amax_out, float *mean, float *rstd, const float *a,
                                     const float *c, const float *w, const float *bias, int N,
                                     int C, float eps);
void cuda_rmsnorm_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, float *rstd,
                               const float *x, const float *w, int N, int C, float eps);
void cuda_add_rmsnorm_forward_bf16(fp8t_backend *b, float *sum, uint16_t *sum16, uint16_t *out,
                                   float *amax_out, float *rstd, const float *a, const float *c,
                                   const float *w, int N, int C, float eps);
void cuda_rmsnorm_forward(fp8t_backend *b, float *out, float *rstd, const float *x,
                          const float *w, int N, int C, float eps);
void cuda_rmsnorm_backward(fp8t_backend *b, float *dx, float *dw, const float *dout,
                           const float *x, const uint16_t *x16, const float *w, const float *rstd,
                           int N, int C);
/* Deterministic column sums: colsum[c] += sum_r x[r*C + c] (bias_backward; the norms use the
 * same two-pass scheme). */
void cuda_column_sums(fp8t_backend *b, float *colsum, const float *x, int rows, int cols);
/* colsum[c] += sum over k < nchunks of part[k][c] (in a fixed order; part [nchunks, cols],
 * cols % 4 == 0, 16-byte aligned): the second pass of a column sum whose first pass another
 * kernel fused into its own (to_bf16_colsum, quantize_colsum). */
void cuda_column_sums_finish(fp8t_backend *b, float *colsum, const float *part, int nchunks,
                             int cols);
/* cuda_attention.cu */
/* Grouped-query attention (NKV < NH key/value heads): the kernels that lay q, k, v out per
 * head (attn_prep_kernel, flash_qkv_to_bf16_kernel) give every query head its own copy of its
 * group's k and v, so the attention cores run on NH heads unchanged; the backward's post kernel
 * sums dk, dv over a group's query heads (in head order: deterministic) into the NKV heads of
 * dqkv. */
void cuda_attention_forward(fp8t_backend *b, float *out, float *lse, void *saved,
                            const float *qkv, const fp8t_attn_shape *sh);
void cuda_attention_backward(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                             const void *saved, const float *out, const float *lse,
                             const fp8t_attn_shape *sh);
size_t cuda_attention_saved_bytes(fp8t_backend *b, const fp8t_attn_shape *sh);
/* Tensor-core attention cores. The gemm core's inputs are the prep kernel's per-head FP32
 * layouts q, k, v [B*NH, T, HS] (RoPE already applied); scale = 1/sqrt(HS).
 *   fwd: out [B, T, NH*HS] (the op's output layout), lse [B*NH, T] (natural log).
 *   bwd: dq, dk, dv [B*NH, T, HS] overwritten, from dout [B, T, NH*HS], lse and
 *        Dv [B*NH, T] = rowsum(dout * out) (FP32, computed by the caller).
 * Each returns 0 when it handled the problem, -1 when the shape is unsupported (nothing
 * launched; the caller falls back to the FP32 tiled/simple kernels). */
/* cuda_attention_flash.cu: the flash core reads the op's qkv [B, T, (NH + 2 NKV) HS] itself
 * (one pass that applies RoPE when cosv/sinv are given, rounds to BF16 and expands each K/V
 * head to the NH/NKV query heads of its group), so no prep kernel runs.
 *   fwd: out [B, T, NH*HS], lse [B*NH, T].
 *   bwd: with dqkv non-NULL (no RoPE to undo, NKV = NH) dq | dk | dv go straight into
 *        dqkv [B, T, 3C]; else into dq, dk, dv [B*NH, T, HS] for the caller's post kernel.
 *   bwd also writes Dv = rowsum(dout * out) [B*NH, T] (scratch), from its pass over dout.
 *   saved (may be NULL): cuda_attn_flash_saved_bytes bytes; the forward writes its BF16 q, k,
 *   v there, and a backward given them skips rebuilding them from qkv (the same bits). */
int cuda_attn_flash_supported(int B, int T, int NH, int HS); /* head sizes 32/64/128 */
size_t cuda_attn_flash_saved_bytes(int B, int T, int NH, int HS);
int cuda_attn_flash_fwd(fp8t_backend *b, float *out, float *lse, uint16_t *saved,
                        const float *qkv, const float *bias, const float *cosv, const float *sinv,
                        int B, int T, int NH, int NKV, int HS, float scale);
int cuda_attn_flash_bwd(fp8t_backend *b, float *dqkv, float *dq, float *dk, float *dv,
                        const float *qkv, const uint16_t *saved, const float *cosv,
                        const float *sinv, const float *dout, const float *out, const float *lse,
                        float *Dv, int B, int T, int NH, int NKV, int HS, float scale);
/* cuda_attention_cudnn.cu: cuDNN's fused attention (built with FP8T_HAVE_CUDNN). Reads the
 * op's qkv itself like flash (RoPE applied in its conversion pass), grouped-query attention
 * natively (no expanded K/V copies).
 *   usable: 1 when s->attn_cudnn asks for this head size and cuDNN finalized both plans for
 *           the shape (built once, cached; a shape it refuses is logged once and gets 0).
 *   fwd/bwd: the op's arguments; 0 done, -1 not taken (nothing launched).
 *   saved (may be NULL): cuda_attn_cudnn_saved_bytes bytes, the BF16 q|k|v [B, T, W]. */
int cuda_attn_cudnn_usable(fp8t_backend *b, const fp8t_attn_shape *sh, int NKV);
size_t cuda_attn_cudnn_saved_bytes(const fp8t_attn_shape *sh, int NKV);
int cuda_attn_cudnn_fwd(fp8t_backend *b, float *out, float *lse, void *saved, const float *qkv,
                        const float *cosv, const float *sinv, const fp8t_attn_shape *sh, int NKV,
                        float scale);
int cuda_attn_cudnn_bwd(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                        const void *saved, const float *out, const float *lse, const float *cosv,
                        const float *sinv, const fp8t_attn_shape *sh, int NKV, float scale);
void cuda_attn_cudnn_destroy(cuda_state *s);
/* cuda_attention_gemm.cu */
int cuda_attn_gemm_fwd(fp8t_backend *b, float *out, float *lse, const float *q, const float *k,
                       const float *v, int B, int T, int NH, int HS, float scale);
int cuda_attn_gemm_bwd(fp8t_backend *b, float *dq, float *dk, float *dv, const float *q,
                       const float *k, const float *v, const float *dout, const float *lse,
                       const float *Dv, int B, int T, int NH, int HS, float scale);
/* cuda_misc.cu */
void cuda_embedding_forward(fp8t_backend *b, float *out, const int *tokens, const float *wte,
                            const float *wpe, int B, int T, int C);
void cuda_embedding_backward(fp8t_backend *b, float *dwte, float *dwpe, const float *dout,
                             const int *tokens, int B, int T, int C);
void cuda_bias_add(fp8t_backend *b, float *out, const float *bias, int N, int OC);
void cuda_add_bias(fp8t_backend *b, float *out, uint16_t *out16, const float *a, const float *y,
                   const float *bias, int N, int OC);
/* bias_add on out [N, ld] (ld >= OC; columns >= OC untouched) */
void cuda_bias_add_ld(fp8t_backend *b, float *out, int ld, const float *bias, int N, int OC);
void cuda_bias_backward(fp8t_backend *b, float *dbias, const float *dout, int N, int OC);
void cuda_gelu_forward(fp8t_backend *b, float *out, const float *x, size_t n);
void cuda_gelu_backward(fp8t_backend *b, float *dx, const float *x, const float *dout, size_t n);
void cuda_gelu_backward_bias(fp8t_backend *b, float *dx, const float *x, const float *bias,
                             const float *dout, int rows, int cols);
void cuda_swiglu_forward(fp8t_backend *b, float *out, const float *gate, const float *up,
                         uint16_t *gate16, uint16_t *up16, size_t n);
void cuda_swiglu_backward(fp8t_backend *b, float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, const uint16_t *gate16,
                          const uint16_t *up16, size_t n);
/* one of swiglu_backward's gradients into out [n] (which: FP8T_STEP_DSWIGLU_GATE / _UP, up not
 * read for _UP); gate (up) NULL: from gate16 (up16) */
void cuda_swiglu_grad(fp8t_backend *b, float *out, int which, const float *dout,
                      const float *gate, const uint16_t *gate16, const float *up,
                      const uint16_t *up16, size_t n);
void cuda_softmax_xent(fp8t_backend *b, float *losses, float *dlogits, const float *logits,
                       const int *targets, int N, int V, float dloss);
void cuda_softmax_xent_bf16(fp8t_backend *b, float *losses, uint16_t *dlogits, float *amax_out,
                            float *dlogits32, const float *logits, int ld, const int *targets,
                            int N, int V, float dloss);
void cuda_add(fp8t_backend *b, float *out, const float *a, const float *c, size_t n);
void cuda_accumulate(fp8t_backend *b, float *out, const float *x, size_t n);
void cuda_scale(fp8t_backend *b, float *out, float s, size_t n);
void cuda_sumsq(fp8t_backend *b, float *out, const float *x, size_t n);
void cuda_sum(fp8t_backend *b, float *out, const float *x, size_t n);
void cuda_adamw(fp8t_backend *b, float *params, float *m, float *v, const float *grads, size_t n,
                float lr, float beta1, float beta2, float eps, float wd, int t, float grad_scale);
/* cuda_attention_decode.cu: the KV cache ops (backend.h) */
void cuda_kv_cache_write(fp8t_backend *b, void *kc, void *vc, int kv, const float *qkv,
                         const fp8t_attn_shape *s, int Tmax);
void cuda_attention_decode(fp8t_backend *b, float *out, void *kc, void *vc, int kv,
                           const float *qkv, const int *pos, const fp8t_attn_shape *s, int Tmax);
void cuda_embedding_forward_bf16(fp8t_backend *b, float *out, const int *tokens,
                                 const uint16_t *wte, int ld, const float *wpe, const int *pos,
                                 int B, int T, int C);
void cuda_embedding_forward_fp8(fp8t_backend *b, float *out, const int *tokens,
                                const uint8_t *codes, int ld, const float *scale_inv,
                                const float *wpe, const int *pos, int B, int T, int C);
/* the inference fusions (backend.h): cuda_norm.cu, cuda_misc.cu */
void cuda_add_norm_operand(fp8t_backend *b, void *out, float *sum, const float *a, const float *y,
                           const float *ybias, const float *w, const float *bias, int rms,
                           int rows, int cols, float eps, const float *scale, fp8_format fmt);
void cuda_swiglu_operand(fp8t_backend *b, void *out, const float *gate, const float *up,
                         const uint16_t *gate16, const uint16_t *up16, int rows, int cols,
                         const float *scale, fp8_format fmt, float *amax_out);
void cuda_gelu16_operand(fp8t_backend *b, void *out, const uint16_t *x16, const float *bias,
                         int rows, int cols, const float *scale, fp8_format fmt, float *amax_out);
/* cuda_stats.cu */
void cuda_tensor_stats(fp8t_backend *b, fp8t_stats_raw *out, const float *x, int rows, int cols,
                       const fp8t_stats_req *req);

/* MXFP8's biased E8M0 block exponent: that of the smallest 2^e with amax / 2^e <= 448, found
 * exactly in double as the CPU does (mx_scale_exponent in recipe.c); clamped to [-127, 127];
 * 0xFF (every element NaN) for a non-finite amax. Used by the MXFP8 cast and the statistics. */
__device__ __forceinline__ int mx_biased_exponent(float amax) {
    if (isnan(amax) || isinf(amax)) return 0xFF;
    if (amax == 0.0f) return 127;
    int e;
    (void)frexp((double)amax / 448.0, &e);
    e -= 2;
    while (448.0 * ldexp(1.0, e) < (double)amax) e++;
    e = max(-127, min(127, e));
    return e + 127;
}

#endif
