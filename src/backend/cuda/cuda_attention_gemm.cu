/* CUDA backend — attention core "gemm" (--cuda-attn gemm): causal attention through
 * cuBLASLt strided-batched BF16 GEMMs over the full [T,T] score matrix of each head, the
 * pre-cuDNN approach of llm.c. Inputs are the prep kernel's q, k, v [B*NH, T, HS] (FP32, RoPE
 * applied); see cuda_common.cuh for the contract.
 *
 * Forward, per chunk of heads:
 *   q, k, v -> BF16 (round to nearest even)
 *   S = q kᵀ                    [T,T] per head, FP32 (BF16 products, FP32 accumulation)
 *   softmax: s = S*scale, keys j > query i masked; lse = max + log(sum exp(s - max));
 *            P = exp(s - max) / sum, rounded to BF16 (zeros above the diagonal)
 *   O = P v                     [T,HS] per head, FP32; then scattered into out [B, T, NH*HS]
 * Backward, per chunk of heads (P recomputed from lse, nothing kept from the forward):
 *   q, k, v, dout (permuted to [heads, T, HS]) -> BF16
 *   S = q kᵀ, dP = dout vᵀ      FP32
 *   P = exp(S*scale - lse) (FP32, masked), dS = P * (dP - Dv); P and dS rounded to BF16
 *   dv = Pᵀ dout, dq = scale * dS k, dk = scale * dSᵀ q     FP32, written straight into the
 *   caller's [B*NH, T, HS] arrays (a chunk of heads is a contiguous slab of them)
 *
 * Layout mapping. Every matrix here is row-major per head; cuBLASLt is column-major, and a
 * row-major [R,C] matrix with leading dimension ld is the column-major [C,R] matrix with the
 * same ld. So each row-major product is computed as its transpose (see gemm_shape_of):
 *   S[i][j]  = sum_d q[i][d] k[j][d]  ->  col-major Sᵀ[T,T] = op_T(k as [HS,T]) · (q as [HS,T])
 *   O[i][d]  = sum_j P[i][j] v[j][d]  ->  col-major Oᵀ[HS,T] = (v as [HS,T]) · (P as [T,T])
 *   dv[j][d] = sum_i P[i][j] dO[i][d] ->  col-major dvᵀ[HS,T] = (dO as [HS,T]) · op_T(P as [T,T])
 * (dP like S with v, dO; dq like O with k, dS; dk like dv with q, dS.) The [T,T] matrices use
 * a leading dimension ldT = T rounded up to 8, so every row of them (BF16 or FP32) starts on a
 * 16-byte boundary whatever T is; the padding columns are never written nor read.
 *
 * Memory: the [T,T] blocks are the cost (fwd 6 bytes per score: S FP32 + P BF16; bwd 12:
 * S, dP FP32 + P, dS BF16). Heads are processed in chunks sized so that the scratch slot
 * SCR_ATTN2 request stays under ATTN_GEMM_BUDGET whatever B*NH is; a single head that does not
 * fit (T > ~11500 backward) is reported unsupported and the FP32 kernels take it.
 *
 * Determinism: no atomics; the GEMMs are deterministic for a fixed algorithm, and algorithms
 * are cached per problem (static cache below; the backend is single-stream). */
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

/* Largest scratch request (bytes) for one call. cuda_scratch allocates 25% more, so the slot
 * stays under 2 GiB. */
#define ATTN_GEMM_BUDGET ((size_t)1536 << 20)

/* ---- host-only plan: GEMM shapes, buffer layout, chunking (plain C, no CUDA types, so a
 * host emulation can include this part verbatim) ---- */
/* ==== attn-gemm-plan begin ==== */
enum { AG_SCORE = 0, AG_PV, AG_PTV, AG_KINDS }; /* the three GEMM shapes (see gemm_shape_of) */

/* One column-major strided-batched product C[m,n] = alpha * op(A)[m,k] · op(B)[k,n].
 * A is stored as a_rows x a_cols (column-major, lda), likewise B; ta/tb: 1 = transposed. */
typedef struct {
    int m, n, k, ta, tb;
    int a_rows, a_cols, lda, b_rows, b_cols, ldb, ldc;
    long long stride_a, stride_b, stride_c; /* elements between consecutive heads */
} ag_shape;

static int ag_ldT(int T) { return (T + 7) / 8 * 8; }

static ag_shape gemm_shape_of(int kind, int T, int HS) {
    ag_shape g;
    long long tt = (long long)T * ag_ldT(T), th = (long long)T * HS;
    memset(&g, 0, sizeof(g));
    if (kind == AG_SCORE) {
        /* S[i][j] = sum_d X[i][d] Y[j][d] (S = q kᵀ with X=q, Y=k; dP = dO vᵀ with X=dO, Y=v).
         * Col-major C = Sᵀ [T(keys j), T(queries i)], ldc ldT: C(j,i) at j + i*ldT = S[i][j].
         * A = Y: row-major [T,HS] = col-major [HS,T] ld HS, op T -> op(A)(j,d) = Y[j][d].
         * B = X: col-major [HS,T] ld HS, op N -> B(d,i) = X[i][d]. m = n = T, k = HS. */
        g.m = T, g.n = T, g.k = HS, g.ta = 1, g.tb = 0;
        g.a_rows = HS, g.a_cols = T, g.lda = HS;
        g.b_rows = HS, g.b_cols = T, g.ldb = HS;
        g.ldc = ag_ldT(T);
        g.stride_a = th, g.stride_b = th, g.stride_c = tt;
    } else if (kind == AG_PV) {
        /* O[i][d] = sum_j W[i][j] Y[j][d] (O = P v; dq = dS k).
         * Col-major C = Oᵀ [HS, T], ldc HS: C(d,i) at d + i*HS = O[i][d].
         * A = Y: col-major [HS,T] ld HS, op N -> A(d,j) = Y[j][d].
         * B = W: row-major [T,T] ld ldT = col-major [T(j),T(i)], op N -> B(j,i) = W[i][j].
         * m = HS, n = T, k = T. */
        g.m = HS, g.n = T, g.k = T, g.ta = 0, g.tb = 0;
        g.a_rows = HS, g.a_cols = T, g.lda = HS;
        g.b_rows = T, g.b_cols = T, g.ldb = ag_ldT(T);
        g.ldc = HS;
        g.stride_a = th, g.stride_b = tt, g.stride_c = th;
    } else {
        /* AG_PTV: R[j][d] = sum_i W[i][j] X[i][d] (dv = Pᵀ dO; dk = dSᵀ q).
         * Col-major C = Rᵀ [HS, T(j)], ldc HS: C(d,j) at d + j*HS = R[j][d].
         * A = X: col-major [HS,T] ld HS, op N -> A(d,i) = X[i][d].
         * B = W: col-major [T(j),T(i)] ld ldT (B(j,i) = W[i][j]), op T -> op(B)(i,j) = W[i][j].
         * m = HS, n = T, k = T. */
        g.m = HS, g.n = T, g.k = T, g.ta = 0, g.tb = 1;
        g.a_rows = HS, g.a_cols = T, g.lda = HS;
        g.b_rows = T, g.b_cols = T, g.ldb = ag_ldT(T);
        g.ldc = HS;
        g.stride_a = th, g.stride_b = tt, g.stride_c = th;
    }
    return g;
}

/* Byte offsets of the sub-buffers of SCR_ATTN2 for a chunk of nh heads (each 256-aligned).
 * fwd: q16 k16 v16 [nh,T,HS] bf16 | S [nh,T,ldT] f32 | P [nh,T,ldT] bf16 | O [nh,T,HS] f32
 * bwd: q16 k16 v16 dO16 [nh,T,HS] bf16 | S, dP [nh,T,ldT] f32 | P, dS [nh,T,ldT] bf16 */
typedef struct {
    size_t q16, k16, v16, do16, S, dP, P, dS, O, total;
} ag_layout;

static size_t ag_align(size_t x) { return (x + 255) / 256 * 256; }

static ag_layout ag_layout_of(int bwd, size_t nh, int T, int HS) {
    ag_layout L;
    size_t th = nh * (size_t)T * HS, tt = nh * (size_t)T * ag_ldT(T), off = 0;
    memset(&L, 0, sizeof(L));
    L.q16 = off, off += ag_align(th * 2);
    L.k16 = off, off += ag_align(th * 2);
    L.v16 = off, off += ag_align(th * 2);
    if (bwd) L.do16 = off, off += ag_align(th * 2);
    L.S = off, off += ag_align(tt * 4);
    if (bwd) L.dP = off, off += ag_align(tt * 4);
    L.P = off, off += ag_align(tt * 2);
    if (bwd) L.dS = off, off += ag_align(tt * 2);
    if (!bwd) L.O = off, off += ag_align(th * 4);
    L.total = off;
    return L;
}

/* Heads per chunk: as many as fit in the budget, then evened out over the chunks (fewer
 * distinct batch counts, similar chunk sizes). 0 when one head does not fit. */
static size_t ag_chunk_heads(int bwd, size_t BH, int T, int HS, size_t budget) {
    if (ag_layout_of(bwd, 1, T, HS).total > budget) return 0;
    size_t lo = 1, hi = BH; /* largest nh with layout(nh) <= budget (monotone in nh) */
    while (lo < hi) {
        size_t mid = lo + (hi - lo + 1) / 2;
        if (ag_layout_of(bwd, mid, T, HS).total <= budget)
            lo = mid;
        else
            hi = mid - 1;
    }
    size_t nchunks = (BH + lo - 1) / lo;
    return (BH + nchunks - 1) / nchunks;
}
/* ==== attn-gemm-plan end ==== */

/* ---------------------------------------------------------------------------------------- */
/* cuBLASLt plans: descriptors + algorithm per problem, created once */

#define AG_CACHE_SIZE 32
typedef struct {
    int valid, ok;
    int device;
    size_t workspace_bytes;
    int kind, T, HS, batch, al_a, al_b, al_c;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} ag_plan;

static ag_plan ag_cache[AG_CACHE_SIZE];
static int ag_cache_next;
static int ag_warned_reject;

/* Alignment in bytes (capped at 16, all cuBLASLt asks for) of a pointer. */
static int ag_ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 1;
    while (a < 16 && (u % (uintptr_t)(a * 2)) == 0) a *= 2;
    return a;
}

static void ag_plan_release(ag_plan *e) {
    if (!e->valid) return;
    cublasLtMatrixLayoutDestroy(e->la);
    cublasLtMatrixLayoutDestroy(e->lb);
    cublasLtMatrixLayoutDestroy(e->lc);
    cublasLtMatmulDescDestroy(e->op);
    e->valid = 0;
}

static cublasLtMatrixLayout_t ag_layout_create(cudaDataType_t type, int rows, int cols, int ld,
                                               int batch, long long stride) {
    cublasLtMatrixLayout_t l;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, (uint64_t)rows, (uint64_t)cols, ld));
    int32_t bc = batch;
    int64_t st = stride;
    CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &st, sizeof(st)));
    return l;
}

/* The plan for GEMM `kind` over `batch` heads with these operand pointers (their alignment
 * is part of the problem); NULL when cuBLASLt has no algorithm. A and B are BF16, C FP32. */
static ag_plan *ag_plan_get(cuda_state *s, int kind, int T, int HS, int batch, const void *A,
                            const void *B, const void *C) {
    int al_a = ag_ptr_align(A), al_b = ag_ptr_align(B), al_c = ag_ptr_align(C);
    for (int i = 0; i < AG_CACHE_SIZE; i++) {
        ag_plan *e = &ag_cache[i];
        if (e->valid && e->device == s->device && e->workspace_bytes == s->workspace_bytes &&
            e->kind == kind && e->T == T && e->HS == HS && e->batch == batch && e->al_a == al_a &&
            e->al_b == al_b && e->al_c == al_c)
            return e->ok ? e : NULL;
    }
    ag_plan *e = &ag_cache[ag_cache_next];
    ag_cache_next = (ag_cache_next + 1) % AG_CACHE_SIZE;
    ag_plan_release(e);

    ag_shape g = gemm_shape_of(kind, T, HS);
    cublasOperation_t ta = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    e->la = ag_layout_create(CUDA_R_16BF, g.a_rows, g.a_cols, g.lda, batch, g.stride_a);
    e->lb = ag_layout_create(CUDA_R_16BF, g.b_rows, g.b_cols, g.ldb, batch, g.stride_b);
    e->lc = ag_layout_create(CUDA_R_32F, g.m, g.n, g.ldc, batch, g.stride_c);

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = (uint64_t)s->workspace_bytes;
    uint32_t ua = (uint32_t)al_a, ub = (uint32_t)al_b, uc = (uint32_t)al_c;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ua, sizeof(ua)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ub, sizeof(ub)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &uc, sizeof(uc)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &uc, sizeof(uc)));
    cublasLtMatmulHeuristicResult_t heur;
    memset(&heur, 0, sizeof(heur));
    int nres = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s->lt, e->op, e->la, e->lb, e->lc, e->lc,
                                                       pref, 1, &heur, &nres);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    e->valid = 1;
    e->ok = st == CUBLAS_STATUS_SUCCESS && nres > 0 && heur.state == CUBLAS_STATUS_SUCCESS;
    if (e->ok) e->algo = heur.algo;
    e->device = s->device, e->workspace_bytes = s->workspace_bytes;
    e->kind = kind, e->T = T, e->HS = HS, e->batch = batch;
    e->al_a = al_a, e->al_b = al_b, e->al_c = al_c;
    return e->ok ? e : NULL;
}

/* C = alpha * op(A) op(B) for the heads of one chunk. 0 ok; -1 when cuBLASLt refuses the
 * algorithm its heuristic offered (remembered: the next call reports unsupported up front). */
static int ag_matmul(cuda_state *s, int kind, int T, int HS, int batch, float alpha,
                     const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *C) {
    ag_plan *e = ag_plan_get(s, kind, T, HS, batch, A, B, C);
    if (!e) return -1;
    float beta = 0.0f;
    cublasStatus_t st =
        cublasLtMatmul(s->lt, e->op, &alpha, A, e->la, B, e->lb, &beta, C, e->lc, C, e->lc,
                       &e->algo, s->workspace, s->workspace_bytes, s->stream);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
        if (!ag_warned_reject) {
            ag_shape g = gemm_shape_of(kind, T, HS);
            fp8t_warnf("cuBLASLt refused a batched BF16 attention GEMM its heuristic "
                       "accepted (%s): m=%d n=%d k=%d batch=%d; attention falls back to the FP32 "
                       "kernels for this shape (reported once) (%s:%d)",
                       cublasLtGetStatusString(st), g.m, g.n, g.k, batch, __FILE__, __LINE__);
            ag_warned_reject = 1;
        }
        e->ok = 0;
        return -1;
    }
    CUBLAS_CHECK(st);
    if (s->sync_each_op) CUDA_CHECK(cudaStreamSynchronize(s->stream));
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* kernels */

/* 8 consecutive floats -> 8 BF16 (round to nearest even) in one 16-byte store. */
__device__ __forceinline__ void store8_bf16(__nv_bfloat16 *dst, const float *src) {
    uint4 u;
    __nv_bfloat162 p0 = __floats2bfloat162_rn(src[0], src[1]);
    __nv_bfloat162 p1 = __floats2bfloat162_rn(src[2], src[3]);
    __nv_bfloat162 p2 = __floats2bfloat162_rn(src[4], src[5]);
    __nv_bfloat162 p3 = __floats2bfloat162_rn(src[6], src[7]);
    u.x = *(unsigned int *)&p0;
    u.y = *(unsigned int *)&p1;
    u.z = *(unsigned int *)&p2;
    u.w = *(unsigned int *)&p3;
    *(uint4 *)dst = u;
}

/* BF16 copies of heads [h0, h0+nh) of q, k, v [BH, T, HS] (a contiguous slab) and, when dout
 * is given, of the same heads of dout [B, T, NH*HS] permuted to [nh, T, HS]. One thread per
 * 8 elements (HS % 8 == 0, so a group never crosses a row). */
__global__ void ag_to_bf16_kernel(__nv_bfloat16 *q16, __nv_bfloat16 *k16, __nv_bfloat16 *v16,
                                  __nv_bfloat16 *do16, const float *__restrict__ q,
                                  const float *__restrict__ k, const float *__restrict__ v,
                                  const float *__restrict__ dout, size_t h0, size_t nh, int T,
                                  int NH, int HS) {
    size_t th = (size_t)T * HS, groups = nh * th / 8;
    size_t base = h0 * th;
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
         g += (size_t)gridDim.x * blockDim.x) {
        size_t e = g * 8; /* element within the chunk: [nh, T, HS] */
        store8_bf16(q16 + e, q + base + e);
        store8_bf16(k16 + e, k + base + e);
        store8_bf16(v16 + e, v + base + e);
        if (dout) {
            size_t hl = e / th, r = e % th;
            size_t t = r / HS, d = r % HS;
            size_t bh = h0 + hl, bb = bh / NH, h = bh % NH;
            store8_bf16(do16 + e, dout + (bb * T + t) * NH * HS + h * HS + d);
        }
    }
}

/* Forward softmax, one warp per query row of the chunk: S [nh, T, ldT] FP32 (unscaled) ->
 * P [nh, T, ldT] BF16 (columns < T written, zeros above the diagonal), lse [nh*T] (the
 * chunk's slice of [BH, T]). */
__global__ void ag_softmax_kernel(__nv_bfloat16 *P, float *lse, const float *__restrict__ S,
                                  size_t nh, int T, int ldT, float scale) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= nh * T) return;
    int i = (int)(row % T); /* query position: keys 0..i are visible */
    const float *srow = S + row * ldT;
    __nv_bfloat16 *prow = P + row * ldT;
    float m = -INFINITY;
    for (int j = lane; j <= i; j += 32) m = fmaxf(m, srow[j] * scale);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j <= i; j += 32) sum += expf(srow[j] * scale - m);
    sum = warp_sum(sum);
    float inv = 1.0f / sum;
    for (int j = lane; j < T; j += 32)
        prow[j] = __float2bfloat16_rn(j <= i ? expf(srow[j] * scale - m) * inv : 0.0f);
    if (lane == 0) lse[row] = m + logf(sum);
}

/* Backward, one warp per query row: P = exp(S*scale - lse) (masked), dS = P * (dP - Dv), both
 * rounded to BF16 (columns < T written, zeros above the diagonal). lse, Dv: the chunk's
 * slices [nh*T]. */
__global__ void ag_dsoftmax_kernel(__nv_bfloat16 *P, __nv_bfloat16 *dS,
                                   const float *__restrict__ S, const float *__restrict__ dP,
                                   const float *__restrict__ lse, const float *__restrict__ Dv,
                                   size_t nh, int T, int ldT, float scale) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= nh * T) return;
    int i = (int)(row % T);
    float L = lse[row], D = Dv[row];
    const float *srow = S + row * ldT, *dprow = dP + row * ldT;
    __nv_bfloat16 *prow = P + row * ldT, *dsrow = dS + row * ldT;
    for (int j = lane; j < T; j += 32) {
        float p = 0.0f, ds = 0.0f;
        if (j <= i) {
            p = expf(srow[j] * scale - L);
            ds = p * (dprow[j] - D);
        }
        prow[j] = __float2bfloat16_rn(p);
        dsrow[j] = __float2bfloat16_rn(ds);
    }
}

/* out [B, T, NH*HS] rows of heads [h0, h0+nh) from O [nh, T, HS]. */
__global__ void ag_scatter_out_kernel(float *out, const float *__restrict__ O, size_t h0,
                                      size_t nh, int T, int NH, int HS) {
    size_t th = (size_t)T * HS, n = nh * th;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t hl = e / th, r = e % th;
        size_t t = r / HS, d = r % HS;
        size_t bh = h0 + hl, bb = bh / NH, h = bh % NH;
        out[(bb * T + t) * NH * HS + h * HS + d] = O[e];
    }
}

static unsigned ag_blocks(cuda_state *s, size_t work) {
    size_t want = (work + 255) / 256, cap = (size_t)s->num_sms * 32;
    return (unsigned)(want < cap ? (want ? want : 1) : cap);
}

/* ---------------------------------------------------------------------------------------- */
/* entry points */

static int ag_supported(int B, int T, int NH, int HS) {
    return B > 0 && T > 0 && NH > 0 && HS > 0 && HS <= 256 && HS % 8 == 0;
}

int cuda_attn_gemm_fwd(fp8t_backend *b, float *out, float *lse, const float *q, const float *k,
                       const float *v, int B, int T, int NH, int HS, float scale) {
    if (!ag_supported(B, T, NH, HS)) return -1;
    cuda_state *s = cuda_of(b);
    size_t BH = (size_t)B * NH;
    size_t nc = ag_chunk_heads(0, BH, T, HS, ATTN_GEMM_BUDGET);
    if (nc == 0 || nc > (size_t)INT32_MAX) return -1;
    ag_layout L = ag_layout_of(0, nc, T, HS);
    char *base = (char *)cuda_scratch(b, SCR_ATTN2, L.total);
    __nv_bfloat16 *q16 = (__nv_bfloat16 *)(base + L.q16), *k16 = (__nv_bfloat16 *)(base + L.k16);
    __nv_bfloat16 *v16 = (__nv_bfloat16 *)(base + L.v16), *P = (__nv_bfloat16 *)(base + L.P);
    float *S = (float *)(base + L.S), *O = (float *)(base + L.O);
    int ldT = ag_ldT(T);

    /* every chunk's GEMMs must have an algorithm before anything is launched (at most two
     * batch sizes: the full chunk and the last one) */
    for (size_t h0 = 0; h0 < BH; h0 += nc) {
        int nh = (int)(BH - h0 < nc ? BH - h0 : nc);
        if (!ag_plan_get(s, AG_SCORE, T, HS, nh, k16, q16, S) ||
            !ag_plan_get(s, AG_PV, T, HS, nh, v16, P, O))
            return -1;
    }
    for (size_t h0 = 0; h0 < BH; h0 += nc) {
        size_t nh = BH - h0 < nc ? BH - h0 : nc;
        size_t rows = nh * T;
        ag_to_bf16_kernel<<<ag_blocks(s, rows * HS / 8), 256, 0, s->stream>>>(
            q16, k16, v16, NULL, q, k, v, NULL, h0, nh, T, NH, HS);
        CUDA_LAUNCH_CHECK(s);
        /* S = q kᵀ (AG_SCORE: A = k, B = q) */
        if (ag_matmul(s, AG_SCORE, T, HS, (int)nh, 1.0f, k16, q16, S)) return -1;
        ag_softmax_kernel<<<cdiv_u(rows * 32, 256), 256, 0, s->stream>>>(P, lse + h0 * T, S, nh,
                                                                         T, ldT, scale);
        CUDA_LAUNCH_CHECK(s);
        /* O = P v (AG_PV: A = v, B = P) */
        if (ag_matmul(s, AG_PV, T, HS, (int)nh, 1.0f, v16, P, O)) return -1;
        ag_scatter_out_kernel<<<ag_blocks(s, rows * HS), 256, 0, s->stream>>>(out, O, h0, nh, T,
                                                                              NH, HS);
        CUDA_LAUNCH_CHECK(s);
    }
    /* A -1 after a launch (cuBLASLt refusing its own heuristic's algorithm, reported) is still
     * safe: the caller's fallback overwrites all of out and lse. */
    return 0;
}

int cuda_attn_gemm_bwd(fp8t_backend *b, float *dq, float *dk, float *dv, const float *q,
                       const float *k, const float *v, const float *dout, const float *lse,
                       const float *Dv, int B, int T, int NH, int HS, float scale) {
    if (!ag_supported(B, T, NH, HS)) return -1;
    cuda_state *s = cuda_of(b);
    size_t BH = (size_t)B * NH;
    size_t nc = ag_chunk_heads(1, BH, T, HS, ATTN_GEMM_BUDGET);
    if (nc == 0 || nc > (size_t)INT32_MAX) return -1;
    ag_layout L = ag_layout_of(1, nc, T, HS);
    char *base = (char *)cuda_scratch(b, SCR_ATTN2, L.total);
    __nv_bfloat16 *q16 = (__nv_bfloat16 *)(base + L.q16), *k16 = (__nv_bfloat16 *)(base + L.k16);
    __nv_bfloat16 *v16 = (__nv_bfloat16 *)(base + L.v16);
    __nv_bfloat16 *do16 = (__nv_bfloat16 *)(base + L.do16);
    __nv_bfloat16 *P = (__nv_bfloat16 *)(base + L.P), *dS = (__nv_bfloat16 *)(base + L.dS);
    float *S = (float *)(base + L.S), *dP = (float *)(base + L.dP);
    int ldT = ag_ldT(T);
    size_t th = (size_t)T * HS;

    for (size_t h0 = 0; h0 < BH; h0 += nc) {
        int nh = (int)(BH - h0 < nc ? BH - h0 : nc);
        if (!ag_plan_get(s, AG_SCORE, T, HS, nh, k16, q16, S) ||
            !ag_plan_get(s, AG_SCORE, T, HS, nh, v16, do16, dP) ||
            !ag_plan_get(s, AG_PTV, T, HS, nh, do16, P, dv + h0 * th) ||
            !ag_plan_get(s, AG_PV, T, HS, nh, k16, dS, dq + h0 * th) ||
            !ag_plan_get(s, AG_PTV, T, HS, nh, q16, dS, dk + h0 * th))
            return -1;
    }
    for (size_t h0 = 0; h0 < BH; h0 += nc) {
        size_t nh = BH - h0 < nc ? BH - h0 : nc;
        size_t rows = nh * T;
        int n = (int)nh;
        ag_to_bf16_kernel<<<ag_blocks(s, rows * HS / 8), 256, 0, s->stream>>>(
            q16, k16, v16, do16, q, k, v, dout, h0, nh, T, NH, HS);
        CUDA_LAUNCH_CHECK(s);
        /* S = q kᵀ and dP = dO vᵀ (AG_SCORE: A = k | v, B = q | dO) */
        if (ag_matmul(s, AG_SCORE, T, HS, n, 1.0f, k16, q16, S)) return -1;
        if (ag_matmul(s, AG_SCORE, T, HS, n, 1.0f, v16, do16, dP)) return -1;
        ag_dsoftmax_kernel<<<cdiv_u(rows * 32, 256), 256, 0, s->stream>>>(
            P, dS, S, dP, lse + h0 * T, Dv + h0 * T, nh, T, ldT, scale);
        CUDA_LAUNCH_CHECK(s);
        /* dv = Pᵀ dO (AG_PTV: A = dO, B = P); dq = scale dS k (AG_PV: A = k, B = dS);
         * dk = scale dSᵀ q (AG_PTV: A = q, B = dS) */
        if (ag_matmul(s, AG_PTV, T, HS, n, 1.0f, do16, P, dv + h0 * th)) return -1;
        if (ag_matmul(s, AG_PV, T, HS, n, scale, k16, dS, dq + h0 * th)) return -1;
        if (ag_matmul(s, AG_PTV, T, HS, n, scale, q16, dS, dk + h0 * th)) return -1;
    }
    /* as in the forward, a late -1 is safe: the fallback overwrites dq, dk, dv */
    return 0;
}
