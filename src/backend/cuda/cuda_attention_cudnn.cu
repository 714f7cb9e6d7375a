/* CUDA backend — attention core through cuDNN's fused flash attention (SDPA), forward and
 * backward, built with cuDNN's C backend API (cudnnBackend*: no cudnn-frontend, which is C++
 * and not packaged here).
 *
 * Why: models with head size 128 are bound by attention; our own BF16 flash kernels
 * (cuda_attention_flash.cu) reach ~200 TFLOP/s there on an H200, issue 14 asks for 400, which
 * is where cuDNN's Hopper attention kernels run. Our kernels stay the fallback: the build
 * without cuDNN (FP8T_HAVE_CUDNN unset), and any shape cuDNN will not take (no engine, or a
 * plan that does not finalize: logged once per shape).
 *
 * Data flow (all on the backend's stream):
 *   forward   qkv FP32 [B, T, W] (W = (NH + 2 NKV) HS) -> one conversion kernel -> BF16
 *             [B, T, W] with RoPE applied to q and k in FP32 first (the flash kernels'
 *             arithmetic); the SDPA graph reads q, k, v from it through strides (no per-head
 *             copies, and grouped-query attention natively: K/V have NKV heads, cuDNN maps
 *             query head h to K/V head h / (NH / NKV)), writes O BF16 [B, T, NH HS] and the
 *             log-sum-exp FP32 [B, NH, T] straight into the op's lse (cuDNN's "stats": the
 *             natural-log LSE of the scaled, masked scores, the CPU backend's lse); O is widened
 *             to the op's FP32 out. The BF16 [B, T, W] copy goes into the caller's saved buffer
 *             (the backward reads it there) or scratch.
 *   backward  dout and out FP32 -> BF16 dO and O (one pass); the graph gives dq | dk | dv BF16
 *             into a [B, T, W] buffer (K/V gradients already summed over their group by
 *             cuDNN); a last kernel widens them into dqkv FP32 and un-rotates dq, dk (the
 *             transpose of the rotation). O is taken from the op's `out`, not kept in `saved`:
 *             `out` is the forward's BF16 O widened exactly, so rounding it back gives the same
 *             bits, and the model keeps `out` anyway (saving O again would cost B*T*C*2 bytes
 *             per layer for nothing).
 * Numerics: q, k, v, P, dO, dS in BF16 with FP32 accumulation (the flash kernels' contract);
 * unlike them O and dq, dk, dv come back rounded to BF16 (2^-9 relative per element).
 * Determinism: the backward graph takes the dP-workspace form (dq = dS K by a matmul of its
 * own, no FP32 atomics for dq) and engine configurations that cuDNN marks non-deterministic are
 * passed over while others exist, so two runs give the same bits (the rest of this backend's
 * contract, resume bit-exactness included; gpu_test checks it). The benchmark switch
 * fp8t_cuda_attention_cudnn_deterministic(b, 0) builds cuDNN's atomic-dq form instead.
 *
 * The graphs are the composite SDPA pattern cuDNN's fused-attention engines match (the one
 * cudnn-frontend lowers its SDPA node to for cuDNN 9.x before 9.21):
 *   forward:  S = Q K^T; S *= scale; causal mask (GEN_INDEX row >= col, BINARY_SELECT with
 *             -inf); m = rowmax(S); E = exp(S - m); l = rowsum(E); stats = m + log(l);
 *             P = E / l (BF16); O = P V.
 *   backward: Dsum = rowsum(dO * O) (FP32, in our workspace); P = exp(scale Q K^T - stats),
 *             masked; dV = P^T dO; dP = dO V^T; dS = P (dP - Dsum) scale; dK = dS^T Q;
 *             dQ = dS K. Transposes are RESHAPE operations (views with swapped strides);
 *             with GQA, dK and dV go through full-head virtual tensors and an ADD reduction.
 * Every cuDNN call's status is checked; a failure while building a plan names the call and
 * cuDNN's message, and that shape falls back to the flash kernels; a failure while executing
 * one exits (like a CUDA error: the stream's state is unknown).
 * Plans are built once per (B, NH, NKV, T, HS, deterministic) and cached (CUDNN_CACHE
 * entries, replaced round-robin). */
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

#ifdef FP8T_HAVE_CUDNN /* without cuDNN only the entry points' "not taken" stubs remain */
#include <cudnn.h>

/* ---------------------------------------------------------------------------------------- */
/* conversion kernels (BF16 bits as uint16_t, round-to-nearest-even) */

__device__ __forceinline__ uint16_t sdpa_bf16(float x) {
    __nv_bfloat16 h = __float2bfloat16_rn(x);
    return *reinterpret_cast<uint16_t *>(&h);
}
__device__ __forceinline__ float sdpa_f32(uint16_t x) {
    return __uint_as_float((unsigned)x << 16);
}

/* The [B*T, W] conversions below walk one token row per block step (grid-stride over the
 * B*T rows) and, within it, 4 consecutive elements i..i+3 of a head's first half and their
 * partners i+HS/2.. per thread: 16-byte FP32 loads, 8-byte BF16 stores, and the column split
 * by shifts (HS/2 is a power of two, HS in {32, 64, 128}: cuda_attn_cudnn_usable). lg4 =
 * log2(HS/8), the number of 4-element groups in a half being 1 << lg4. vec = 0: the FP32 side
 * is not 16-byte aligned, scalar accesses (the BF16 side is ours: always aligned). */
__device__ __forceinline__ uint2 sdpa_pack4(float a, float b, float c, float d) {
    uint2 o;
    o.x = (unsigned)sdpa_bf16(a) | ((unsigned)sdpa_bf16(b) << 16);
    o.y = (unsigned)sdpa_bf16(c) | ((unsigned)sdpa_bf16(d) << 16);
    return o;
}

/* dst [B*T, W] BF16 from qkv [B*T, W] FP32 (+ bias [W] first where given, bias_add's one
 * FP32 add); head slots < NHK = NH + NKV (q and k) rotated first when cosv != NULL (pair
 * (i, i + HS/2) at position t by t * inv_freq_i, the flash conversion's arithmetic:
 * q1 c - q2 s, q2 c + q1 s). */
__global__ void sdpa_qkv_kernel(uint16_t *dst, const float *__restrict__ qkv,
                                const float *__restrict__ bias, const float *__restrict__ cosv,
                                const float *__restrict__ sinv, int ntok, int T, int slots,
                                int NHK, int HS, int lg4, int vec) {
    const int half = HS / 2, groups = slots << lg4, W = slots * HS;
    for (int tok = blockIdx.x; tok < ntok; tok += gridDim.x) {
        const int t = tok % T;
        const float *row = qkv + (size_t)tok * W;
        uint16_t *out = dst + (size_t)tok * W;
        for (int j = threadIdx.x; j < groups; j += blockDim.x) {
            const int slot = j >> lg4, i = (j & ((1 << lg4) - 1)) * 4;
            const int c1 = slot * HS + i, c2 = c1 + half;
            /* vec: qkv and bias 16-byte aligned (the callers check) */
            auto load4 = [vec](const float *p) {
                return vec ? *reinterpret_cast<const float4 *>(p)
                           : make_float4(p[0], p[1], p[2], p[3]);
            };
            float4 a = load4(row + c1), b = load4(row + c2);
            if (bias) add_into(a, load4(bias + c1)), add_into(b, load4(bias + c2));
            if (cosv && slot < NHK) {
                float4 c = *reinterpret_cast<const float4 *>(cosv + (size_t)t * half + i);
                float4 sn = *reinterpret_cast<const float4 *>(sinv + (size_t)t * half + i);
                float4 y1, y2;
                y1.x = a.x * c.x - b.x * sn.x, y2.x = b.x * c.x + a.x * sn.x;
                y1.y = a.y * c.y - b.y * sn.y, y2.y = b.y * c.y + a.y * sn.y;
                y1.z = a.z * c.z - b.z * sn.z, y2.z = b.z * c.z + a.z * sn.z;
                y1.w = a.w * c.w - b.w * sn.w, y2.w = b.w * c.w + a.w * sn.w;
                a = y1, b = y2;
            }
            *reinterpret_cast<uint2 *>(out + c1) = sdpa_pack4(a.x, a.y, a.z, a.w);
            *reinterpret_cast<uint2 *>(out + c2) = sdpa_pack4(b.x, b.y, b.z, b.w);
        }
    }
}

/* a -> BF16 a16 and, when b != NULL, b -> b16 (n elements each) */
__global__ void sdpa_to_bf16_kernel(uint16_t *a16, const float *__restrict__ a, uint16_t *b16,
                                    const float *__restrict__ b, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        a16[i] = sdpa_bf16(a[i]);
        if (b) b16[i] = sdpa_bf16(b[i]);
    }
}

__global__ void sdpa_to_f32_kernel(float *dst, const uint16_t *__restrict__ src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = sdpa_f32(src[i]);
}

/* dqkv [B*T, W] FP32 from cuDNN's dq | dk | dv BF16 in the same layout; dq and dk (slots
 * < NHK) un-rotated when cosv != NULL: the transpose of the forward rotation
 * (x1 c + x2 s, x2 c - x1 s). Same walk as sdpa_qkv_kernel. */
__global__ void sdpa_dqkv_kernel(float *dqkv, const uint16_t *__restrict__ g,
                                 const float *__restrict__ cosv, const float *__restrict__ sinv,
                                 int ntok, int T, int slots, int NHK, int HS, int lg4, int vec) {
    const int half = HS / 2, groups = slots << lg4, W = slots * HS;
    for (int tok = blockIdx.x; tok < ntok; tok += gridDim.x) {
        const int t = tok % T;
        const uint16_t *row = g + (size_t)tok * W;
        float *out = dqkv + (size_t)tok * W;
        for (int j = threadIdx.x; j < groups; j += blockDim.x) {
            const int slot = j >> lg4, i = (j & ((1 << lg4) - 1)) * 4;
            const int c1 = slot * HS + i, c2 = c1 + half;
            uint2 u = *reinterpret_cast<const uint2 *>(row + c1);
            uint2 v = *reinterpret_cast<const uint2 *>(row + c2);
            float4 a = make_float4(sdpa_f32((uint16_t)u.x), sdpa_f32((uint16_t)(u.x >> 16)),
                                   sdpa_f32((uint16_t)u.y), sdpa_f32((uint16_t)(u.y >> 16)));
            float4 b = make_float4(sdpa_f32((uint16_t)v.x), sdpa_f32((uint16_t)(v.x >> 16)),
                                   sdpa_f32((uint16_t)v.y), sdpa_f32((uint16_t)(v.y >> 16)));
            if (cosv && slot < NHK) {
                float4 c = *reinterpret_cast<const float4 *>(cosv + (size_t)t * half + i);
                float4 sn = *reinterpret_cast<const float4 *>(sinv + (size_t)t * half + i);
                float4 y1, y2;
                y1.x = a.x * c.x + b.x * sn.x, y2.x = b.x * c.x - a.x * sn.x;
                y1.y = a.y * c.y + b.y * sn.y, y2.y = b.y * c.y - a.y * sn.y;
                y1.z = a.z * c.z + b.z * sn.z, y2.z = b.z * c.z - a.z * sn.z;
                y1.w = a.w * c.w + b.w * sn.w, y2.w = b.w * c.w - a.w * sn.w;
                a = y1, b = y2;
            }
            if (vec) {
                *reinterpret_cast<float4 *>(out + c1) = a;
                *reinterpret_cast<float4 *>(out + c2) = b;
            } else {
                out[c1] = a.x, out[c1 + 1] = a.y, out[c1 + 2] = a.z, out[c1 + 3] = a.w;
                out[c2] = b.x, out[c2 + 1] = b.y, out[c2 + 2] = b.z, out[c2 + 3] = b.w;
            }
        }
    }
}

static unsigned sdpa_blocks(const cuda_state *s, size_t n) {
    size_t want = (n + 255) / 256, cap = (size_t)s->num_sms * 32;
    return (unsigned)(want < cap ? (want ? want : 1) : cap);
}
/* blocks for the row walks: one row per block step, at most 32 blocks per SM */
static unsigned sdpa_rows(const cuda_state *s, int rows) {
    int cap = s->num_sms * 32;
    return (unsigned)(rows < cap ? (rows > 0 ? rows : 1) : cap);
}
static int sdpa_aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }
/* log2(HS / 8) for HS in {32, 64, 128} */
static int sdpa_lg4(int HS) { return HS == 32 ? 2 : HS == 64 ? 3 : 4; }

/* ---------------------------------------------------------------------------------------- */
/* the SDPA graphs, their plans and their workspace needs, per shape */
#define CUDNN_CACHE 16
#define SDPA_MAX_DESC 192

/* tensor ids in the variant packs */
enum {
    UID_Q = 1,
    UID_K,
    UID_V,
    UID_O,
    UID_STATS,
    UID_SCALE,
    UID_NEGINF,
    UID_DO,
    UID_DQ,
    UID_DK,
    UID_DV,
    UID_ONE,
    UID_DSUM,
    UID_DQACC,
    UID_VIRTUAL = 100 /* virtual tensors from here on */
};

typedef struct {
    int B, NH, NKV, T, HS, det;
    int ok; /* 1 both plans finalized, 0 unsupported (fall back) */
    cudnnBackendDescriptor_t fwd_plan, bwd_plan;
    int64_t fwd_ws, bwd_ws; /* the plans' workspace bytes */
    size_t bwd_extra;       /* our part of the backward's workspace: Dsum (+ dq accumulator) */
    cudnnBackendDescriptor_t desc[2][SDPA_MAX_DESC]; /* everything the plans were built from */
    int ndesc[2];
} sdpa_entry;

typedef struct {
    cudnnHandle_t h;
    int det; /* build deterministic backward plans */
    sdpa_entry cache[CUDNN_CACHE];
    int next;
    int used;
} sdpa_state;

/* one graph under construction: the descriptors it created (destroyed with its plan), the
 * operations, the next virtual id, and the first failure */
typedef struct {
    cudnnHandle_t h;
    cudnnBackendDescriptor_t *desc;
    int ndesc;
    cudnnBackendDescriptor_t ops[48];
    int nops;
    int64_t next_uid;
    const char *what; /* "forward" or "backward" (messages) */
    char err[FP8T_ERR_LEN];
} sdpa_graph;

/* Record the first failing cuDNN call (its name, status and cuDNN's last message) and make the
 * builder return -1. */
static int sdpa_fail(sdpa_graph *g, const char *call, cudnnStatus_t st) {
    if (!g->err[0]) {
        char msg[200] = "";
        cudnnGetLastErrorString(msg, sizeof(msg));
        snprintf(g->err, sizeof(g->err), "%s: %s%s%s", call, cudnnGetErrorString(st),
                 msg[0] ? ": " : "", msg);
    }
    return -1;
}
#define DNN(g, call)                                                                             \
    do {                                                                                         \
        cudnnStatus_t dnn_st_ = (call);                                                          \
        if (dnn_st_ != CUDNN_STATUS_SUCCESS) return sdpa_fail((g), #call, dnn_st_);              \
    } while (0)
/* the same for builders that return a descriptor */
#define DNN_D(g, call)                                                                           \
    do {                                                                                         \
        cudnnStatus_t dnn_st_ = (call);                                                          \
        if (dnn_st_ != CUDNN_STATUS_SUCCESS) {                                                   \
            sdpa_fail((g), #call, dnn_st_);                                                      \
            return NULL;                                                                         \
        }                                                                                        \
    } while (0)
/* one descriptor-valued attribute of op (the call, attribute named, in the failure message) */
#define SET_DESC(g, op, attr, d)                                                                 \
    DNN(g, cudnnBackendSetAttribute(op, attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &(d)))
#define TRY(x)                                                                                   \
    do {                                                                                         \
        if (!(x)) return -1;                                                                     \
    } while (0)

static cudnnBackendDescriptor_t g_new(sdpa_graph *g, cudnnBackendDescriptorType_t type) {
    if (g->ndesc >= SDPA_MAX_DESC) {
        if (!g->err[0])
            snprintf(g->err, sizeof(g->err), "more than %d descriptors", SDPA_MAX_DESC);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    DNN_D(g, cudnnBackendCreateDescriptor(type, &d));
    g->desc[g->ndesc++] = d;
    return d;
}

static int g_op(sdpa_graph *g, cudnnBackendDescriptor_t op) {
    if (g->nops >= (int)(sizeof(g->ops) / sizeof(g->ops[0]))) {
        if (!g->err[0]) snprintf(g->err, sizeof(g->err), "too many operations");
        return -1;
    }
    DNN(g, cudnnBackendFinalize(op));
    g->ops[g->nops++] = op;
    return 0;
}

/* A tensor descriptor: 4 dims and strides, uid 0 = the next virtual id. By-value tensors are
 * host scalars given in the variant pack. */
static cudnnBackendDescriptor_t g_tensor(sdpa_graph *g, int64_t uid, cudnnDataType_t type,
                                         const int64_t dim[4], const int64_t stride[4],
                                         int is_virtual, int by_value) {
    cudnnBackendDescriptor_t t = g_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    if (!t) return NULL;
    if (!uid) uid = g->next_uid++;
    int64_t align = 16;
    bool virt = is_virtual != 0, byval = by_value != 0;
    DNN_D(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                      &type));
    DNN_D(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim));
    DNN_D(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride));
    DNN_D(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    DNN_D(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1,
                                      &align));
    if (virt)
        DNN_D(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1,
                                          &virt));
    if (byval)
        DNN_D(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1,
                                          &byval));
    DNN_D(g, cudnnBackendFinalize(t));
    return t;
}

/* a virtual FP32 (or `type`) tensor with the given dims and strides */
static cudnnBackendDescriptor_t g_virt(sdpa_graph *g, cudnnDataType_t type, int64_t d0,
                                       int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1,
                                       int64_t s2, int64_t s3) {
    const int64_t dim[4] = {d0, d1, d2, d3}, stride[4] = {s0, s1, s2, s3};
    return g_tensor(g, 0, type, dim, stride, 1, 0);
}

/* y = mode(x[, b[, t]]); axis >= 0 for GEN_INDEX */
static int g_pointwise(sdpa_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                       cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                       cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis) {
    TRY(x && y);
    cudnnBackendDescriptor_t pw = g_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    TRY(pw);
    DNN(g, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1,
                                    &mode));
    DNN(g, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1,
                                    &prec));
    if (axis >= 0)
        DNN(g,
            cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
    DNN(g, cudnnBackendFinalize(pw));
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    TRY(op);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) SET_DESC(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) SET_DESC(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    return g_op(g, op);
}

/* c = a b (batched over dims 0, 1; b's head dim may divide a's: grouped-query attention) */
static int g_matmul(sdpa_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                    cudnnBackendDescriptor_t c) {
    TRY(a && b && c);
    cudnnBackendDescriptor_t mm = g_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    TRY(mm);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    DNN(g, cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                    &comp));
    DNN(g, cudnnBackendFinalize(mm));
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    TRY(op);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    return g_op(g, op);
}

/* y = reduce(x) over the dims where y has extent 1 (or x's head groups: GQA sums) */
static int g_reduce(sdpa_graph *g, cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x,
                    cudnnBackendDescriptor_t y) {
    TRY(x && y);
    cudnnBackendDescriptor_t rd = g_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    TRY(rd);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    DNN(g, cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                    &comp));
    DNN(g, cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_OPERATOR,
                                    CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red));
    DNN(g, cudnnBackendFinalize(rd));
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    TRY(op);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    return g_op(g, op);
}

/* y = x viewed through y's dims and strides (the transposes) */
static int g_reshape(sdpa_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    TRY(x && y);
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    TRY(op);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    SET_DESC(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    return g_op(g, op);
}

/* The input/output tensors both graphs share. Layouts: q, k, v inside the BF16 [B, T, W]
 * buffer (W = (NH + 2 NKV) HS; head h of q at column h*HS, of k at C + h*HS, of v at
 * C + NKV*HS + h*HS); O and dO token-major [B, T, C]; stats [B, NH, T, 1]. */
typedef struct {
    int64_t b, hq, hk, s, d, W, C;
} sdpa_dims;

static cudnnBackendDescriptor_t t_q(sdpa_graph *g, const sdpa_dims *z, int64_t uid) {
    const int64_t dim[4] = {z->b, z->hq, z->s, z->d}, st[4] = {z->s * z->W, z->d, z->W, 1};
    return g_tensor(g, uid, CUDNN_DATA_BFLOAT16, dim, st, 0, 0);
}
/* K or V transposed: [b, hk, d, s] over the same memory */
static cudnnBackendDescriptor_t t_kvT(sdpa_graph *g, const sdpa_dims *z, int64_t uid) {
    const int64_t dim[4] = {z->b, z->hk, z->d, z->s}, st[4] = {z->s * z->W, z->d, 1, z->W};
    return g_tensor(g, uid, CUDNN_DATA_BFLOAT16, dim, st, 0, 0);
}
static cudnnBackendDescriptor_t t_kv(sdpa_graph *g, const sdpa_dims *z, int64_t uid) {
    const int64_t dim[4] = {z->b, z->hk, z->s, z->d}, st[4] = {z->s * z->W, z->d, z->W, 1};
    return g_tensor(g, uid, CUDNN_DATA_BFLOAT16, dim, st, 0, 0);
}
static cudnnBackendDescriptor_t t_o(sdpa_graph *g, const sdpa_dims *z, int64_t uid) {
    const int64_t dim[4] = {z->b, z->hq, z->s, z->d}, st[4] = {z->s * z->C, z->d, z->C, 1};
    return g_tensor(g, uid, CUDNN_DATA_BFLOAT16, dim, st, 0, 0);
}
/* [b, hq, s, 1] FP32 (stats, Dsum) */
static cudnnBackendDescriptor_t t_rows(sdpa_graph *g, const sdpa_dims *z, int64_t uid) {
    const int64_t dim[4] = {z->b, z->hq, z->s, 1}, st[4] = {z->hq * z->s, z->s, 1, 1};
    return g_tensor(g, uid, CUDNN_DATA_FLOAT, dim, st, uid == 0, 0);
}
static cudnnBackendDescriptor_t t_scalar(sdpa_graph *g, int64_t uid) {
    const int64_t one[4] = {1, 1, 1, 1};
    return g_tensor(g, uid, CUDNN_DATA_FLOAT, one, one, 0, 1);
}
/* a virtual [b, hq, s, s] score-shaped tensor */
static cudnnBackendDescriptor_t t_ss(sdpa_graph *g, const sdpa_dims *z, cudnnDataType_t type) {
    return g_virt(g, type, z->b, z->hq, z->s, z->s, z->hq * z->s * z->s, z->s * z->s, z->s, 1);
}

/* S -> S masked causally: entries with key index > query index become -inf */
static cudnnBackendDescriptor_t g_causal(sdpa_graph *g, const sdpa_dims *z,
                                         cudnnBackendDescriptor_t S,
                                         cudnnBackendDescriptor_t neginf) {
    cudnnBackendDescriptor_t row = t_ss(g, z, CUDNN_DATA_INT32),
                             col = t_ss(g, z, CUDNN_DATA_INT32);
    cudnnBackendDescriptor_t keep = t_ss(g, z, CUDNN_DATA_BOOLEAN);
    cudnnBackendDescriptor_t out = t_ss(g, z, CUDNN_DATA_FLOAT);
    if (g_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, S, NULL, NULL, row, 2) ||
        g_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, S, NULL, NULL, col, 3) ||
        g_pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1) ||
        g_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, S, neginf, keep, out, -1))
        return NULL;
    return out;
}

static int build_fwd_ops(sdpa_graph *g, const sdpa_dims *z) {
    const cudnnDataType_t F = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t Q = t_q(g, z, UID_Q), KT = t_kvT(g, z, UID_K);
    cudnnBackendDescriptor_t V = t_kv(g, z, UID_V), O = t_o(g, z, UID_O);
    cudnnBackendDescriptor_t stats = t_rows(g, z, UID_STATS);
    cudnnBackendDescriptor_t scale = t_scalar(g, UID_SCALE), neginf = t_scalar(g, UID_NEGINF);
    cudnnBackendDescriptor_t S = t_ss(g, z, F), S1 = t_ss(g, z, F);
    TRY(Q && KT && V && O && stats && scale && neginf && S && S1);
    TRY(!g_matmul(g, Q, KT, S));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_MUL, F, S, scale, NULL, S1, -1));
    cudnnBackendDescriptor_t S2 = g_causal(g, z, S1, neginf);
    cudnnBackendDescriptor_t mx = t_rows(g, z, 0), sum = t_rows(g, z, 0), lg = t_rows(g, z, 0);
    cudnnBackendDescriptor_t sub = t_ss(g, z, F), e = t_ss(g, z, F);
    cudnnBackendDescriptor_t P = t_ss(g, z, CUDNN_DATA_BFLOAT16);
    TRY(S2 && mx && sum && lg && sub && e && P);
    TRY(!g_reduce(g, CUDNN_REDUCE_TENSOR_MAX, S2, mx));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_SUB, F, S2, mx, NULL, sub, -1));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_EXP, F, sub, NULL, NULL, e, -1));
    TRY(!g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, sum));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_LOG, F, sum, NULL, NULL, lg, -1));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_ADD, F, mx, lg, NULL, stats, -1));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_DIV, F, e, sum, NULL, P, -1));
    TRY(!g_matmul(g, P, V, O));
    return 0;
}

/* dK (or dV) = A^T-view times X: with GQA through a full-head tensor summed over the group */
static int g_grad_kv(sdpa_graph *g, const sdpa_dims *z, cudnnBackendDescriptor_t AT,
                     cudnnBackendDescriptor_t X, cudnnBackendDescriptor_t out) {
    if (z->hq == z->hk) return g_matmul(g, AT, X, out);
    cudnnBackendDescriptor_t full = g_virt(g, CUDNN_DATA_BFLOAT16, z->b, z->hq, z->s, z->d,
                                           z->hq * z->s * z->d, z->s * z->d, z->d, 1);
    TRY(full);
    TRY(!g_matmul(g, AT, X, full));
    return g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

static int build_bwd_ops(sdpa_graph *g, const sdpa_dims *z, int det) {
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, BF = CUDNN_DATA_BFLOAT16;
    cudnnBackendDescriptor_t Q = t_q(g, z, UID_Q), KT = t_kvT(g, z, UID_K);
    cudnnBackendDescriptor_t VT = t_kvT(g, z, UID_V), O = t_o(g, z, UID_O);
    cudnnBackendDescriptor_t dO = t_o(g, z, UID_DO), stats = t_rows(g, z, UID_STATS);
    cudnnBackendDescriptor_t dQ = t_q(g, z, UID_DQ), dK = t_kv(g, z, UID_DK);
    cudnnBackendDescriptor_t dV = t_kv(g, z, UID_DV);
    cudnnBackendDescriptor_t scale = t_scalar(g, UID_SCALE), neginf = t_scalar(g, UID_NEGINF);
    cudnnBackendDescriptor_t one = t_scalar(g, UID_ONE), dsum = t_rows(g, z, UID_DSUM);
    TRY(Q && KT && VT && O && dO && stats && dQ && dK && dV && scale && neginf && one && dsum);
    /* Dsum = rowsum(dO * O), kept in memory for the whole backward */
    cudnnBackendDescriptor_t dOO =
        g_virt(g, F, z->b, z->hq, z->s, z->d, z->hq * z->s * z->d, z->s * z->d, z->hq * z->d, 1);
    cudnnBackendDescriptor_t rs = t_rows(g, z, 0);
    TRY(dOO && rs);
    TRY(!g_pointwise(g, CUDNN_POINTWISE_MUL, F, dO, O, NULL, dOO, -1));
    TRY(!g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dOO, rs));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_MUL, F, rs, one, NULL, dsum, -1));
    /* P = exp(scale Q K^T - stats), masked */
    cudnnBackendDescriptor_t S = t_ss(g, z, F), S1 = t_ss(g, z, F), S2 = t_ss(g, z, F);
    TRY(S && S1 && S2);
    TRY(!g_matmul(g, Q, KT, S));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_MUL, F, S, scale, NULL, S1, -1));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_SUB, F, S1, stats, NULL, S2, -1));
    cudnnBackendDescriptor_t S3 = g_causal(g, z, S2, neginf), P = t_ss(g, z, F);
    TRY(S3 && P);
    TRY(!g_pointwise(g, CUDNN_POINTWISE_EXP, F, S3, NULL, NULL, P, -1));
    /* dV = P^T dO */
    const int64_t ss = z->hq * z->s * z->s, s2 = z->s * z->s;
    cudnnBackendDescriptor_t PT = g_virt(g, BF, z->b, z->hq, z->s, z->s, ss, s2, 1, z->s);
    TRY(PT);
    TRY(!g_reshape(g, P, PT));
    TRY(!g_grad_kv(g, z, PT, dO, dV));
    /* dS = P (dO V^T - Dsum) scale */
    cudnnBackendDescriptor_t dP = t_ss(g, z, F), t1 = t_ss(g, z, F), t2 = t_ss(g, z, F);
    cudnnBackendDescriptor_t dS = t_ss(g, z, F);
    TRY(dP && t1 && t2 && dS);
    TRY(!g_matmul(g, dO, VT, dP));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_SUB, F, dP, dsum, NULL, t1, -1));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_MUL, F, t1, P, NULL, t2, -1));
    TRY(!g_pointwise(g, CUDNN_POINTWISE_MUL, F, t2, scale, NULL, dS, -1));
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dST = g_virt(g, BF, z->b, z->hq, z->s, z->s, ss, s2, 1, z->s);
    TRY(dST);
    TRY(!g_reshape(g, dS, dST));
    TRY(!g_grad_kv(g, z, dST, Q, dK));
    /* dQ = dS K (K as [b, hk, s, d]: a view of K^T) */
    cudnnBackendDescriptor_t K =
        g_virt(g, F, z->b, z->hk, z->s, z->d, z->s * z->W, z->d, z->W, 1);
    TRY(K);
    TRY(!g_reshape(g, KT, K));
    if (det) return g_matmul(g, dS, K, dQ); /* the dP-workspace form: no atomics */
    const int64_t dim[4] = {z->b, z->hq, z->s, z->d};
    const int64_t st[4] = {z->hq * z->s * z->d, z->s * z->d, z->d, 1};
    cudnnBackendDescriptor_t acc = g_tensor(g, UID_DQACC, F, dim, st, 0, 0);
    TRY(acc);
    TRY(!g_matmul(g, dS, K, acc));
    return g_pointwise(g, CUDNN_POINTWISE_IDENTITY, F, acc, NULL, NULL, dQ, -1);
}

/* 1 if the engine behind cfg is marked non-deterministic */
static int cfg_nondeterministic(cudnnBackendDescriptor_t cfg) {
    cudnnBackendDescriptor_t eng = NULL;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) !=
        CUDNN_STATUS_SUCCESS)
        return 1;
    int64_t n = 0;
    int nondet = 1;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 1, &n, &eng) == CUDNN_STATUS_SUCCESS) {
        cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        int64_t nn = 0;
        if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                     CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                                     &nn, notes) == CUDNN_STATUS_SUCCESS) {
            nondet = 0;
            for (int64_t i = 0; i < nn; i++)
                if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) nondet = 1;
        }
    }
    cudnnBackendDestroyDescriptor(eng);
    return nondet;
}

/* The operation graph of g's operations, then the first engine configuration of cuDNN's
 * heuristics (mode A, then the fallback list) that finalizes as an execution plan. With det,
 * configurations whose engine carries cuDNN's NONDETERMINISTIC note are passed over first; if
 * that leaves none, they are taken after all, with a note on stderr (the backward graph's
 * dP-workspace form is what makes it deterministic; gpu_test's repeat check shows whether the
 * bits agree). */
static int build_plan(sdpa_graph *g, int det, cudnnBackendDescriptor_t *plan_out, int64_t *ws) {
    cudnnBackendDescriptor_t graph = g_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    TRY(graph);
    DNN(g, cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                    &g->h));
    DNN(g, cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops));
    DNN(g, cudnnBackendFinalize(graph));
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    int skipped = 0; /* configurations passed over as non-deterministic */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && !skipped) break;
        for (int m = 0; m < 2; m++) {
            cudnnBackendDescriptor_t heur = g_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
            TRY(heur);
            SET_DESC(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
            DNN(g, cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE,
                                            CUDNN_TYPE_HEUR_MODE, 1, &modes[m]));
            DNN(g, cudnnBackendFinalize(heur));
            int64_t count = 0;
            DNN(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL));
            if (count <= 0) continue;
            if (count > 16) count = 16;
            cudnnBackendDescriptor_t cfgs[16];
            for (int64_t i = 0; i < count; i++)
                TRY(cfgs[i] = g_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
            int64_t got = 0;
            DNN(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs));
            for (int64_t i = 0; i < got && i < count; i++) {
                if (pass == 0 && det && cfg_nondeterministic(cfgs[i])) {
                    skipped++;
                    continue;
                }
                cudnnBackendDescriptor_t plan = NULL;
                DNN(g,
                    cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan));
                const char *call = "cudnnBackendSetAttribute(CUDNN_ATTR_EXECUTION_PLAN_HANDLE)";
                cudnnStatus_t st = cudnnBackendSetAttribute(
                    plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->h);
                if (st == CUDNN_STATUS_SUCCESS) {
                    call = "cudnnBackendSetAttribute(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)";
                    st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
                }
                if (st == CUDNN_STATUS_SUCCESS) {
                    call = "cudnnBackendFinalize(execution plan)";
                    st = cudnnBackendFinalize(plan);
                }
                int64_t n = 0;
                if (st == CUDNN_STATUS_SUCCESS) {
                    call = "cudnnBackendGetAttribute(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)";
                    st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                  CUDNN_TYPE_INT64, 1, &n, ws);
                }
                if (st == CUDNN_STATUS_SUCCESS) {
                    if (pass == 1)
                        fp8t_warnf("cuDNN attention: every engine cuDNN offers "
                                   "for the %s graph is marked non-deterministic; using "
                                   "one",
                                   g->what);
                    *plan_out = plan;
                    return 0;
                }
                sdpa_fail(g, call, st);
                cudnnBackendDestroyDescriptor(plan);
            }
        }
    }
    if (!g->err[0]) snprintf(g->err, sizeof(g->err), "no engine configuration for the graph");
    return -1;
}

static void entry_release(sdpa_entry *e) {
    if (e->fwd_plan) cudnnBackendDestroyDescriptor(e->fwd_plan);
    if (e->bwd_plan) cudnnBackendDestroyDescriptor(e->bwd_plan);
    for (int k = 0; k < 2; k++)
        for (int i = e->ndesc[k] - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(e->desc[k][i]);
    memset(e, 0, sizeof(*e));
}

static sdpa_state *sdpa_of(fp8t_backend *b) {
    cuda_state *s = cuda_of(b);
    if (s->cudnn) return (sdpa_state *)s->cudnn;
    sdpa_state *d = (sdpa_state *)calloc(1, sizeof(sdpa_state));
    if (!d) {
        FP8T_FATAL("out of host memory");
    }
    d->det = 1;
    cudnnStatus_t st = cudnnCreate(&d->h);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetStream(d->h, s->stream);
    if (st != CUDNN_STATUS_SUCCESS) {
        /* no usable cuDNN at run time (library or driver mismatch): flash from now on */
        fp8t_warnf("cuDNN unavailable (cudnnCreate/cudnnSetStream: %s); "
                   "attention uses the flash kernels",
                   cudnnGetErrorString(st));
        if (d->h) cudnnDestroy(d->h);
        d->h = NULL;
    }
    s->cudnn = d;
    return d;
}

/* the cached plans for this shape, built on first use; NULL if cuDNN cannot run it */
static sdpa_entry *sdpa_plans(fp8t_backend *b, const fp8t_attn_shape *sh, int NKV) {
    sdpa_state *d = sdpa_of(b);
    if (!d->h) return NULL;
    for (int i = 0; i < d->used; i++) {
        sdpa_entry *e = &d->cache[i];
        if (e->B == sh->B && e->NH == sh->NH && e->NKV == NKV && e->T == sh->T &&
            e->HS == sh->HS && e->det == d->det)
            return e->ok ? e : NULL;
    }
    sdpa_entry *e = &d->cache[d->next];
    d->next = (d->next + 1) % CUDNN_CACHE;
    if (d->used < CUDNN_CACHE)
        d->used++;
    else {
        CUDA_CHECK(cudaStreamSynchronize(cuda_of(b)->stream)); /* the old plan may be queued */
        entry_release(e);
    }
    e->B = sh->B, e->NH = sh->NH, e->NKV = NKV, e->T = sh->T, e->HS = sh->HS, e->det = d->det;
    const sdpa_dims z = {sh->B,
                         sh->NH,
                         NKV,
                         sh->T,
                         sh->HS,
                         (int64_t)(sh->NH + 2 * NKV) * sh->HS,
                         (int64_t)sh->NH * sh->HS};
    for (int k = 0; k < 2; k++) {
        sdpa_graph g;
        memset(&g, 0, sizeof(g));
        g.h = d->h, g.desc = e->desc[k], g.next_uid = UID_VIRTUAL;
        g.what = k == 0 ? "forward" : "backward";
        int rc = k == 0 ? build_fwd_ops(&g, &z) : build_bwd_ops(&g, &z, d->det);
        if (!rc)
            rc = build_plan(&g, k == 0 || d->det, k == 0 ? &e->fwd_plan : &e->bwd_plan,
                            k == 0 ? &e->fwd_ws : &e->bwd_ws);
        e->ndesc[k] = g.ndesc;
        if (rc) {
            fp8t_warnf("cuDNN attention %s B%d NH%d NKV%d T%d HS%d not available "
                       "(%s); using the flash kernels for this shape",
                       g.what, sh->B, sh->NH, NKV, sh->T, sh->HS, g.err);
            e->ok = 0;
            return NULL;
        }
    }
    e->bwd_extra = (size_t)sh->B * sh->NH * sh->T * sizeof(float); /* Dsum */
    if (!d->det) e->bwd_extra += (size_t)sh->B * sh->NH * sh->T * sh->HS * sizeof(float);
    e->ok = 1;
    return e;
}

/* Run a plan with the (uid, pointer) pairs; by-value scalars point at host floats. */
static void sdpa_execute(sdpa_state *d, cudnnBackendDescriptor_t plan, const int64_t *uids,
                         void **ptrs, int n, void *ws, const char *what) {
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    const char *call = "cudnnBackendCreateDescriptor(variant pack)";
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendSetAttribute(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)";
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                      uids);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendSetAttribute(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)";
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                      CUDNN_TYPE_VOID_PTR, n, ptrs);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendSetAttribute(CUDNN_ATTR_VARIANT_PACK_WORKSPACE)";
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                      1, &ws);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendFinalize(variant pack)";
        st = cudnnBackendFinalize(vp);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendExecute";
        st = cudnnBackendExecute(d->h, plan, vp);
    }
    if (vp) cudnnBackendDestroyDescriptor(vp);
    if (st != CUDNN_STATUS_SUCCESS) {
        char msg[256] = "";
        cudnnGetLastErrorString(msg, sizeof(msg));
        FP8T_FATAL("cuDNN attention %s: %s failed: %s%s%s", what, call, cudnnGetErrorString(st),
                   msg[0] ? ": " : "", msg);
    }
}

/* plan workspace first (16-byte aligned sizes), then our part */
static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* the forward core on BF16 [B, T, W] q|k|v: O BF16 [B, T, C], lse FP32 [B, NH, T] */
static void sdpa_fwd_core(fp8t_backend *b, sdpa_entry *e, uint16_t *o16, float *lse,
                          const uint16_t *qkv16, float scale) {
    sdpa_state *d = (sdpa_state *)cuda_of(b)->cudnn;
    const size_t C = (size_t)e->NH * e->HS, CKV = (size_t)e->NKV * e->HS;
    void *ws = cuda_scratch(b, SCR_ATTN, round16((size_t)e->fwd_ws) + 16);
    float neginf = -INFINITY;
    const int64_t uids[7] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEGINF};
    void *ptrs[7] = {
        (void *)qkv16, (void *)(qkv16 + C), (void *)(qkv16 + C + CKV), o16, lse, &scale, &neginf};
    sdpa_execute(d, e->fwd_plan, uids, ptrs, 7, ws, "forward");
}

/* the backward core: dq | dk | dv BF16 [B, T, W] from q|k|v, O, dO, lse */
static void sdpa_bwd_core(fp8t_backend *b, sdpa_entry *e, uint16_t *g16, const uint16_t *qkv16,
                          const uint16_t *o16, const uint16_t *do16, const float *lse,
                          float scale) {
    sdpa_state *d = (sdpa_state *)cuda_of(b)->cudnn;
    cuda_state *s = cuda_of(b);
    const size_t C = (size_t)e->NH * e->HS, CKV = (size_t)e->NKV * e->HS;
    const size_t rows = (size_t)e->B * e->NH * e->T;
    const size_t off = round16((size_t)e->bwd_ws);
    char *ws = (char *)cuda_scratch(b, SCR_ATTN, off + round16(rows * 4) + e->bwd_extra + 16);
    float *dsum = (float *)(ws + off);
    float *dqacc = (float *)(ws + off + round16(rows * 4));
    float neginf = -INFINITY, one = 1.0f;
    int64_t uids[14] = {UID_Q,  UID_K,  UID_V,     UID_O,      UID_DO,  UID_STATS, UID_DQ,
                        UID_DK, UID_DV, UID_SCALE, UID_NEGINF, UID_ONE, UID_DSUM,  UID_DQACC};
    void *ptrs[14] = {(void *)qkv16,
                      (void *)(qkv16 + C),
                      (void *)(qkv16 + C + CKV),
                      (void *)o16,
                      (void *)do16,
                      (void *)lse,
                      g16,
                      g16 + C,
                      g16 + C + CKV,
                      &scale,
                      &neginf,
                      &one,
                      dsum,
                      dqacc};
    int n = 13;
    if (!e->det) {
        /* the atomic form accumulates dq in FP32: start from zero (cuDNN >= 9.6 also clears
         * it; this keeps older libraries right) */
        CUDA_CHECK(cudaMemsetAsync(dqacc, 0, rows * e->HS * sizeof(float), s->stream));
        n = 14;
    }
    sdpa_execute(d, e->bwd_plan, uids, ptrs, n, ws, "backward");
}

#endif /* FP8T_HAVE_CUDNN */

/* ---------------------------------------------------------------------------------------- */
/* the entry points used by cuda_attention.cu */

/* Whether cuDNN takes this shape (head sizes 32, 64, 128; builds and caches the plans). */
int cuda_attn_cudnn_usable(fp8t_backend *b, const fp8t_attn_shape *sh, int NKV) {
#ifdef FP8T_HAVE_CUDNN
    cuda_state *s = cuda_of(b);
    if (!s->attn_cudnn || s->plain) return 0;
    const int HS = sh->HS;
    if (!(HS == 128 || (s->attn_cudnn == 2 && (HS == 32 || HS == 64)))) return 0;
    if (sh->B <= 0 || sh->T <= 0 || sh->NH <= 0) return 0;
    return sdpa_plans(b, sh, NKV) != NULL;
#else
    (void)b, (void)sh, (void)NKV;
    return 0;
#endif
}

/* what the forward keeps for the backward: q, k, v BF16 [B, T, W] */
size_t cuda_attn_cudnn_saved_bytes(const fp8t_attn_shape *sh, int NKV) {
    return (size_t)sh->B * sh->T * (sh->NH + 2 * NKV) * sh->HS * sizeof(uint16_t);
}

/* 0 done, -1 not taken (the caller runs another path) */
int cuda_attn_cudnn_fwd(fp8t_backend *b, float *out, float *lse, void *saved, const float *qkv,
                        const float *cosv, const float *sinv, const fp8t_attn_shape *sh, int NKV,
                        float scale) {
#ifdef FP8T_HAVE_CUDNN
    if (!cuda_attn_cudnn_usable(b, sh, NKV)) return -1;
    cuda_state *s = cuda_of(b);
    sdpa_entry *e = sdpa_plans(b, sh, NKV);
    const int B = sh->B, T = sh->T, NH = sh->NH, HS = sh->HS, slots = NH + 2 * NKV;
    const size_t nqkv = (size_t)B * T * slots * HS, nout = (size_t)B * T * NH * HS;
    /* scratch SCR_ATTN2: [q|k|v BF16 unless saved][O BF16][lse when the caller keeps none] */
    const size_t qb = saved ? 0 : round16(nqkv * 2), ob = round16(nout * 2);
    char *scr = (char *)cuda_scratch(b, SCR_ATTN2,
                                     qb + ob + (lse ? 0 : (size_t)B * NH * T * sizeof(float)));
    uint16_t *qkv16 = saved ? (uint16_t *)saved : (uint16_t *)scr;
    uint16_t *o16 = (uint16_t *)(scr + qb);
    if (!lse) lse = (float *)(scr + qb + ob);
    const int ntok = B * T, lg4 = sdpa_lg4(HS);
    sdpa_qkv_kernel<<<sdpa_rows(s, ntok), 256, 0, s->stream>>>(
        qkv16, qkv, sh->qkv_bias, cosv, sinv, ntok, T, slots, NH + NKV, HS, lg4,
        sdpa_aligned(qkv) && (!sh->qkv_bias || sdpa_aligned(sh->qkv_bias)));
    CUDA_LAUNCH_CHECK(s);
    sdpa_fwd_core(b, e, o16, lse, qkv16, scale);
    sdpa_to_f32_kernel<<<sdpa_blocks(s, nout), 256, 0, s->stream>>>(out, o16, nout);
    CUDA_LAUNCH_CHECK(s);
    return 0;
#else
    (void)b, (void)out, (void)lse, (void)saved, (void)qkv, (void)cosv, (void)sinv, (void)sh;
    (void)NKV, (void)scale;
    return -1;
#endif
}

int cuda_attn_cudnn_bwd(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                        const void *saved, const float *out, const float *lse, const float *cosv,
                        const float *sinv, const fp8t_attn_shape *sh, int NKV, float scale) {
#ifdef FP8T_HAVE_CUDNN
    if (!cuda_attn_cudnn_usable(b, sh, NKV)) return -1;
    cuda_state *s = cuda_of(b);
    sdpa_entry *e = sdpa_plans(b, sh, NKV);
    const int B = sh->B, T = sh->T, NH = sh->NH, HS = sh->HS, slots = NH + 2 * NKV;
    const size_t nqkv = (size_t)B * T * slots * HS, nout = (size_t)B * T * NH * HS;
    /* scratch SCR_ATTN2: [q|k|v BF16 unless saved][dq|dk|dv BF16][O BF16][dO BF16] */
    const size_t qb = saved ? 0 : round16(nqkv * 2), gb = round16(nqkv * 2),
                 ob = round16(nout * 2);
    char *scr = (char *)cuda_scratch(b, SCR_ATTN2, qb + gb + 2 * ob);
    const uint16_t *qkv16 = (const uint16_t *)saved;
    const int ntok = B * T, lg4 = sdpa_lg4(HS);
    if (!saved) { /* the forward's conversion again: the same bits */
        sdpa_qkv_kernel<<<sdpa_rows(s, ntok), 256, 0, s->stream>>>(
            (uint16_t *)scr, qkv, NULL, cosv, sinv, ntok, T, slots, NH + NKV, HS, lg4,
            sdpa_aligned(qkv));
        CUDA_LAUNCH_CHECK(s);
        qkv16 = (const uint16_t *)scr;
    }
    uint16_t *g16 = (uint16_t *)(scr + qb), *o16 = (uint16_t *)(scr + qb + gb);
    uint16_t *do16 = (uint16_t *)(scr + qb + gb + ob);
    sdpa_to_bf16_kernel<<<sdpa_blocks(s, nout), 256, 0, s->stream>>>(do16, dout, o16, out, nout);
    CUDA_LAUNCH_CHECK(s);
    sdpa_bwd_core(b, e, g16, qkv16, o16, do16, lse, scale);
    sdpa_dqkv_kernel<<<sdpa_rows(s, ntok), 256, 0, s->stream>>>(
        dqkv, g16, cosv, sinv, ntok, T, slots, NH + NKV, HS, lg4, sdpa_aligned(dqkv));
    CUDA_LAUNCH_CHECK(s);
    return 0;
#else
    (void)b, (void)dqkv, (void)dout, (void)qkv, (void)saved, (void)out, (void)lse, (void)cosv;
    (void)sinv, (void)sh, (void)NKV, (void)scale;
    return -1;
#endif
}

void cuda_attn_cudnn_destroy(cuda_state *s) {
#ifdef FP8T_HAVE_CUDNN
    sdpa_state *d = (sdpa_state *)s->cudnn;
    if (!d) return;
    for (int i = 0; i < d->used; i++) entry_release(&d->cache[i]);
    if (d->h) cudnnDestroy(d->h);
    free(d);
    s->cudnn = NULL;
#else
    (void)s;
#endif
}

#ifdef FP8T_HAVE_CUDNN
/* x[i] = a hash of i mapped to [-1, 1), BF16 (benchmark inputs) */
__global__ void sdpa_fill_kernel(uint16_t *x, size_t n, unsigned seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        x[i] = sdpa_bf16((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}
#endif

/* Benchmarks: the cuDNN cores alone (no conversion passes) on random BF16 q|k|v and dO, ms per
 * call averaged over iters after one warm-up call each. 0 ok, -1 if cuDNN does not take the
 * shape (or the build has none). */
extern "C" int fp8t_cuda_attention_cudnn_bench(fp8t_backend *b, const fp8t_attn_shape *sh,
                                               int iters, double *fwd_ms, double *bwd_ms) {
#ifdef FP8T_HAVE_CUDNN
    if (!b || !b->name || strcmp(b->name, "cuda") != 0 || iters <= 0) return -1;
    const int NKV = fp8t_attn_nkv(sh);
    if (NKV <= 0 || sh->NH % NKV != 0 || !cuda_attn_cudnn_usable(b, sh, NKV)) return -1;
    cuda_state *s = cuda_of(b);
    sdpa_entry *e = sdpa_plans(b, sh, NKV);
    const size_t nqkv = (size_t)sh->B * sh->T * (sh->NH + 2 * NKV) * sh->HS;
    const size_t nout = (size_t)sh->B * sh->T * sh->NH * sh->HS;
    const size_t rows = (size_t)sh->B * sh->NH * sh->T;
    uint16_t *qkv16, *g16, *o16, *do16;
    float *lse;
    CUDA_CHECK(cudaMalloc(&qkv16, nqkv * 2));
    CUDA_CHECK(cudaMalloc(&g16, nqkv * 2));
    CUDA_CHECK(cudaMalloc(&o16, nout * 2));
    CUDA_CHECK(cudaMalloc(&do16, nout * 2));
    CUDA_CHECK(cudaMalloc(&lse, rows * sizeof(float)));
    sdpa_fill_kernel<<<sdpa_blocks(s, nqkv), 256, 0, s->stream>>>(qkv16, nqkv, 1u);
    sdpa_fill_kernel<<<sdpa_blocks(s, nout), 256, 0, s->stream>>>(do16, nout, 2u);
    CUDA_LAUNCH_CHECK(s);
    const float scale = 1.0f / sqrtf((float)sh->HS);
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    float ms = 0.0f;
    sdpa_fwd_core(b, e, o16, lse, qkv16, scale); /* warm-up (and O, lse for the backward) */
    CUDA_CHECK(cudaEventRecord(t0, s->stream));
    for (int i = 0; i < iters; i++) sdpa_fwd_core(b, e, o16, lse, qkv16, scale);
    CUDA_CHECK(cudaEventRecord(t1, s->stream));
    CUDA_CHECK(cudaEventSynchronize(t1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    *fwd_ms = ms / iters;
    sdpa_bwd_core(b, e, g16, qkv16, o16, do16, lse, scale);
    CUDA_CHECK(cudaEventRecord(t0, s->stream));
    for (int i = 0; i < iters; i++) sdpa_bwd_core(b, e, g16, qkv16, o16, do16, lse, scale);
    CUDA_CHECK(cudaEventRecord(t1, s->stream));
    CUDA_CHECK(cudaEventSynchronize(t1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    *bwd_ms = ms / iters;
    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));
    CUDA_CHECK(cudaFree(qkv16));
    CUDA_CHECK(cudaFree(g16));
    CUDA_CHECK(cudaFree(o16));
    CUDA_CHECK(cudaFree(do16));
    CUDA_CHECK(cudaFree(lse));
    return 0;
#else
    (void)b, (void)sh, (void)iters, (void)fwd_ms, (void)bwd_ms;
    return -1;
#endif
}

/* Benchmarks: 1 deterministic backward plans (the default), 0 cuDNN's atomic dq form. Plans
 * already built stay cached under their own flag. Returns -1 without cuDNN. */
extern "C" int fp8t_cuda_attention_cudnn_deterministic(fp8t_backend *b, int det) {
#ifdef FP8T_HAVE_CUDNN
    if (!b || !b->name || strcmp(b->name, "cuda") != 0) return -1;
    sdpa_of(b)->det = det ? 1 : 0;
    return 0;
#else
    (void)b, (void)det;
    return -1;
#endif
}
