/* CUDA backend — GEMMs through cuBLASLt.
 *
 * Layout mapping. The op table is row-major: C[M,N] (=|+=) op(A)[M,K] · op(B)[K,N]. cuBLASLt
 * is column-major, and a row-major [R,S] matrix is the same memory as a column-major [S,R]
 * one. So the row-major product is computed as the column-major product
 *     Cᵀ[N,M] = op(B)ᵀ[N,K] · op(A)ᵀ[K,M]
 * i.e. cuBLAS "A" is our B and cuBLAS "B" is our A, with m = N, n = M, k = K, ldc = N:
 *   our B stored [K,N] (transB=0) = col-major [N,K], ld N -> cuBLAS op N
 *   our B stored [N,K] (transB=1) = col-major [K,N], ld K -> cuBLAS op T
 *   our A stored [M,K] (transA=0) = col-major [K,M], ld K -> cuBLAS op N
 *   our A stored [K,M] (transA=1) = col-major [M,K], ld M -> cuBLAS op T
 * Hopper's FP8 kernels only exist for cuBLAS "TN" (op T on its A, op N on its B, both operands
 * K-major), which is our transB=1, transA=0: A as [M,K] and B as [N,K]. gemm_fp8 therefore
 * picks data or data_t of each operand to get that orientation, and transposes into scratch
 * when the needed copy is missing.
 *
 * Precision: CUBLAS_COMPUTE_32F everywhere (no TF32): gemm_f32 is exact FP32 arithmetic,
 * gemm_bf16 rounds operands to BF16 (round to nearest even, as bf16_encode) and accumulates in
 * FP32, gemm_fp8 multiplies codes and scales by scale_inv_A * scale_inv_B. Hopper's FP8 tensor
 * cores sum each 32-deep chunk of products with ~14 bits of precision; without fast
 * accumulation cuBLASLt promotes the partial sums to FP32 regularly (measured on an H200: 1.2e-4
 * relative to an exact FP32 sum; with fast accumulation up to 1.1e-3 at K=3072).
 *
 * Fallback: when cuBLASLt has no algorithm for a problem (FP8 needs 16-byte aligned pointers
 * and leading dimensions that are multiples of 16; E5M2 x E5M2 does not exist), the operands
 * are decoded to FP32 (exactly: every FP8 and BF16 value is a float) and the FP32 GEMM runs.
 * The result is the same up to accumulation order. */
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

static int ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 1;
    while (a < 256 && (u % (uintptr_t)(a * 2)) == 0) a *= 2;
    return a;
}

/* the cache entries of one problem: every field but the outcome (valid, ok, algo) */
static int lt_same_problem(const lt_cache_entry *e, const lt_cache_entry *q) {
    return e->valid && e->m == q->m && e->n == q->n && e->k == q->k && e->ta == q->ta &&
           e->tb == q->tb && e->type_a == q->type_a && e->type_b == q->type_b &&
           e->acc == q->acc && e->fast == q->fast && e->lda == q->lda && e->ldb == q->ldb &&
           e->ldc == q->ldc && e->al_a == q->al_a && e->al_b == q->al_b && e->al_c == q->al_c &&
           e->compute == q->compute && e->bias == q->bias && e->mode_a == q->mode_a &&
           e->mode_b == q->mode_b && e->type_d == q->type_d;
}

/* Column-major cuBLASLt matmul: C[m,n] (=|+=) op(A)[m,k] · op(B)[k,n], C and D of type_d
 * (FP32, or BF16: the FP32 result rounded to nearest even in the epilogue), scale pointers
 * (device, may be NULL) multiply the product; bias (device [m], may be NULL; FP32 C only) is
 * added to every column in the epilogue (FP32: product + bias[i], one rounding, as a separate
 * add). 0 ok, -1 if cuBLASLt has no algorithm (nothing was launched). */
static int lt_matmul(cuda_state *s, int m, int n, int k, cublasOperation_t ta,
                     cublasOperation_t tb, cudaDataType_t type_a, const void *A, int lda,
                     cudaDataType_t type_b, const void *B, int ldb, void *C, int ldc, int acc,
                     const float *scale_a, const float *scale_b, int fast_accum,
                     cublasComputeType_t compute, const float *bias, int mode_a = 0,
                     int mode_b = 0, cudaDataType_t type_d = CUDA_R_32F) {
    int al_a = ptr_align(A), al_b = ptr_align(B), al_c = ptr_align(C);
    const int has_bias = bias != NULL;
    lt_cache_entry key;
    memset(&key, 0, sizeof(key));
    key.valid = 1;
    key.m = m, key.n = n, key.k = k, key.ta = (int)ta, key.tb = (int)tb;
    key.type_a = (int)type_a, key.type_b = (int)type_b, key.acc = acc, key.fast = fast_accum;
    key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.al_a = al_a, key.al_b = al_b, key.al_c = al_c;
    key.compute = (int)compute;
    key.bias = has_bias;
    key.mode_a = mode_a, key.mode_b = mode_b;
    key.type_d = (int)type_d;
    lt_cache_entry *hit = NULL;
    if (!s->plain) {
        for (int i = 0; i < LT_CACHE_SIZE && !hit; i++)
            if (lt_same_problem(&s->lt_cache[i], &key)) hit = &s->lt_cache[i];
        if (hit && !hit->ok) return -1;
    }

    cublasLtMatmulDesc_t op;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (scale_a)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                    &scale_a, sizeof(scale_a)));
    if (scale_b)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                    &scale_b, sizeof(scale_b)));
    if (has_bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bias_type = CUDA_R_32F;
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bias_type, sizeof(bias_type)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                    sizeof(bias)));
    }
    if (mode_a || mode_b) {
        /* block scaling: the scale pointers are per-block arrays (cublasLtMatmulMatrixScale_t) */
        int32_t ma = mode_a, mb = mode_b;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma,
                                                    sizeof(ma)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb,
                                                    sizeof(mb)));
    }
    int is_fp8 = type_a == CUDA_R_8F_E4M3 || type_a == CUDA_R_8F_E5M2;
    if (is_fp8) {
        int8_t fa = fast_accum ? 1 : 0;
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)));
    }
    cublasLtMatrixLayout_t la, lb, lc;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, type_a, ta == CUBLAS_OP_N ? m : k,
                                            ta == CUBLAS_OP_N ? k : m, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, type_b, tb == CUBLAS_OP_N ? k : n,
                                            tb == CUBLAS_OP_N ? n : k, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, type_d, m, n, ldc));

    int ok = 1;
    cublasLtMatmulAlgo_t algo;
    if (hit) {
        algo = hit->algo;
    } else {
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &s->workspace_bytes,
            sizeof(s->workspace_bytes)));
        uint32_t ua = (uint32_t)al_a, ub = (uint32_t)al_b, uc = (uint32_t)al_c;
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
        cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(s->lt, op, la, lb, lc, lc, pref, 1, &heur, &nres);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st != CUBLAS_STATUS_SUCCESS || nres == 0 || heur.state != CUBLAS_STATUS_SUCCESS)
            ok = 0;
        else
            algo = heur.algo;
        if (!s->plain) {
            lt_cache_entry *e = &s->lt_cache[s->lt_cache_next];
            s->lt_cache_next = (s->lt_cache_next + 1) % LT_CACHE_SIZE;
            *e = key;
            e->ok = ok;
            if (ok) e->algo = algo;
        }
    }
    if (ok) {
        float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
        cublasStatus_t st = cublasLtMatmul(s->lt, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc,
                                           &algo, s->workspace, s->workspace_bytes, s->stream);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
            /* the heuristic offered an algorithm that the matmul then refused: remember the
             * problem as unsupported and let the caller take its fallback */
            if (!s->warned_lt_reject) {
                fp8t_warnf("cuBLASLt refused a %s GEMM its heuristic accepted (%s): m=%d "
                           "n=%d k=%d op=%c%c lda=%d ldb=%d ldc=%d align=%d/%d/%d scales=%p/%p; "
                           "using the fallback for such GEMMs (reported once)",
                           is_fp8 ? "FP8" : "BF16/FP32", cublasLtGetStatusString(st), m, n, k,
                           ta == CUBLAS_OP_T ? 'T' : 'N', tb == CUBLAS_OP_T ? 'T' : 'N', lda, ldb,
                           ldc, al_a, al_b, al_c, (const void *)scale_a, (const void *)scale_b);
                s->warned_lt_reject = 1;
            }
            ok = 0;
            if (!s->plain)
                for (int i = 0; i < LT_CACHE_SIZE; i++)
                    if (lt_same_problem(&s->lt_cache[i], &key)) s->lt_cache[i].ok = 0;
        } else {
            CUBLAS_CHECK(st);
        }
        if (s->sync_each_op) CUDA_CHECK(cudaStreamSynchronize(s->stream));
    }
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    return ok ? 0 : -1;
}

/* The row-major product through the column-major library (see the top of the file). lda, ldb,
 * ldc: row strides (elements) of A, B and C as stored; 0 means packed (the stored column
 * count). */
static int rowmajor_matmul(cuda_state *s, void *C, cudaDataType_t type_a, const void *A,
                           cudaDataType_t type_b, const void *B, int M, int N, int K, int transA,
                           int transB, int acc, const float *scale_a, const float *scale_b,
                           int fast_accum, cublasComputeType_t compute, int lda, int ldb, int ldc,
                           const float *bias, cudaDataType_t type_d = CUDA_R_32F) {
    cublasOperation_t op_b = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    int ld_b = ldb ? ldb : (transB ? K : N);
    cublasOperation_t op_a = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    int ld_a = lda ? lda : (transA ? M : K);
    return lt_matmul(s, N, M, K, op_b, op_a, type_b, B, ld_b, type_a, A, ld_a, C, ldc ? ldc : N,
                     acc, scale_b, scale_a, fast_accum, compute, bias, 0, 0, type_d);
}

/* Degenerate sizes: nothing to multiply. K == 0 gives C = 0 (or C unchanged when acc). */
static int gemm_trivial(fp8t_backend *b, float *C, int M, int N, int K, int acc) {
    if (M <= 0 || N <= 0) return 1;
    if (K <= 0) {
        if (!acc)
            CUDA_CHECK(cudaMemsetAsync(C, 0, (size_t)M * N * sizeof(float), cuda_of(b)->stream));
        return 1;
    }
    return 0;
}

void cuda_gemm_f32(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N, int K,
                   int transA, int transB, int acc) {
    if (gemm_trivial(b, C, M, N, K, acc)) return;
    if (rowmajor_matmul(cuda_of(b), C, CUDA_R_32F, A, CUDA_R_32F, B, M, N, K, transA, transB, acc,
                        NULL, NULL, 0, CUBLAS_COMPUTE_32F, 0, 0, 0, NULL) != 0) {
        FP8T_FATAL("cuBLASLt found no FP32 algorithm for M=%d N=%d K=%d", M, N, K);
    }
}

/* C[r, c] (= or +=) Cg[r, c] (+ bias[c]) for r < rows, c < cols: from the aligned scratch
 * result (row stride ldg) into C (row stride ldc, rows possibly unaligned: scalar stores).
 * Accumulating here instead of in the GEMM's epilogue (beta = 1) gives the same bits: both add
 * the FP32-rounded product sum to C with one rounding; so does the bias (only with acc = 0). */
__global__ void copy_out_kernel(float *C, int ldc, const float *__restrict__ Cg, int ldg,
                                int rows, int cols, int acc, const float *__restrict__ bias) {
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *g = Cg + (size_t)r * ldg;
        float *c = C + (size_t)r * ldc;
        for (int j = threadIdx.x; j < cols; j += blockDim.x)
            c[j] = acc ? c[j] + g[j] : bias ? g[j] + bias[j] : g[j];
    }
}

/* A BF16 operand decoded into packed floats out [rows, cols] (exact). */
__global__ void bf16_operand_decode_kernel(float *out, const __nv_bfloat16 *__restrict__ in,
                                           int ld, int rows, int cols) {
    for (int r = blockIdx.x; r < rows; r += gridDim.x)
        for (int c = threadIdx.x; c < cols; c += blockDim.x)
            out[(size_t)r * cols + c] = __bfloat162float(in[(size_t)r * ld + c]);
}

static void check_bf16_operand(const char *name, const fp8t_bf16_operand *o, int rows, int cols) {
    if (o->rows != rows || o->cols != cols || !o->data) {
        FP8T_FATAL("gemm_bf16_rounded: operand %s is stored [%d,%d] (data %p) but the GEMM "
                   "needs it stored as [%d,%d]",
                   name, o->rows, o->cols, (const void *)o->data, rows, cols);
    }
}

/* The product C (= or +=) op(A)·op(B) (+ bias) on the padded operands, C with row stride ldc.
 * Every GEMM dimension but M is rounded up to a multiple of 8 with the operands' zero padding
 * (measured on the GPT-2 head: N = 50257 kept odd ran at ~70 TFLOP/s). The result goes
 * straight into C when its rows are 16-byte aligned (ldc % 4 == 0): with N padded to Np when
 * the stride has room for it and there is no bias to read past N, else with N itself when
 * N % 4 == 0. Otherwise (the packed [M, 50257] logits) it goes through an aligned scratch in row
 * chunks of at most ~512 MiB and a copy-out. Returns 0, or -1 when cuBLASLt has no algorithm
 * (nothing written). */
static int bf16_rounded_lt(fp8t_backend *b, float *C, int ldc, const __nv_bfloat16 *a16,
                           const __nv_bfloat16 *b16, int M, int N, int K, int transA, int transB,
                           int acc, const float *bias) {
    cuda_state *s = cuda_of(b);
    const int Kp = fp8t_bf16_pad(K), Np = fp8t_bf16_pad(N);
    const int lda = transA ? fp8t_bf16_pad(M) : Kp, ldb = transB ? Kp : Np;
    if (s->plain) { /* the true sizes, the bias in its own pass */
        if (rowmajor_matmul(s, C, CUDA_R_16BF, a16, CUDA_R_16BF, b16, M, N, K, transA, transB,
                            acc, NULL, NULL, 0, CUBLAS_COMPUTE_32F, lda, ldb, ldc, NULL) != 0)
            return -1;
        if (bias) cuda_bias_add_ld(b, C, ldc, bias, M, N);
        return 0;
    }
    const int aligned = ldc % 4 == 0 && ((uintptr_t)C & 15u) == 0;
    const int n_direct = aligned && !bias && ldc >= Np ? Np : aligned && N % 4 == 0 ? N : 0;
    if (n_direct) {
        if (rowmajor_matmul(s, C, CUDA_R_16BF, a16, CUDA_R_16BF, b16, M, n_direct, Kp, transA,
                            transB, acc, NULL, NULL, 0, CUBLAS_COMPUTE_32F, lda, ldb, ldc,
                            bias) == 0)
            return 0;
        /* no algorithm with the bias epilogue: the product, then the bias */
        if (!bias || rowmajor_matmul(s, C, CUDA_R_16BF, a16, CUDA_R_16BF, b16, M, n_direct, Kp,
                                     transA, transB, acc, NULL, NULL, 0, CUBLAS_COMPUTE_32F, lda,
                                     ldb, ldc, NULL) != 0)
            return -1;
        cuda_bias_add_ld(b, C, ldc, bias, M, N);
        return 0;
    }
    const int ldg = Np;
    size_t cap_rows = ((size_t)512 << 20) / ((size_t)ldg * sizeof(float));
    int chunk = (int)(cap_rows < (size_t)M ? cap_rows : (size_t)M);
    if (chunk < M) chunk = chunk >= 64 ? chunk / 64 * 64 : 64;
    float *Cg = (float *)cuda_scratch(b, SCR_GEMM_C, (size_t)chunk * ldg * sizeof(float));
    for (int r0 = 0; r0 < M; r0 += chunk) {
        int mr = M - r0 < chunk ? M - r0 : chunk;
        /* r0 rows further down A: r0 rows of [M,K], or r0 columns of [K,M] (r0 is a multiple
         * of 64, so the pointer stays 16-byte aligned) */
        const __nv_bfloat16 *ar = transA ? a16 + r0 : a16 + (size_t)r0 * lda;
        if (rowmajor_matmul(s, Cg, CUDA_R_16BF, ar, CUDA_R_16BF, b16, mr, Np, Kp, transA, transB,
                            0, NULL, NULL, 0, CUBLAS_COMPUTE_32F, lda, ldb, ldg, NULL) != 0) {
            if (r0 == 0) return -1; /* nothing written: the caller's fallback does it all */
            FP8T_FATAL(
                "cuBLASLt has a BF16 algorithm for the first %d rows of a M=%d N=%d "
                "K=%d GEMM but not for rows %d..%d (%s:%d); rerun with --disable cuda-fusion",
                r0, M, N, K, r0, r0 + mr - 1, __FILE__, __LINE__);
        }
        unsigned grid = (unsigned)(mr < s->num_sms * 64 ? mr : s->num_sms * 64);
        copy_out_kernel<<<grid, 256, 0, s->stream>>>(C + (size_t)r0 * ldc, ldc, Cg, ldg, mr, N,
                                                     acc, bias);
        CUDA_LAUNCH_CHECK(s);
    }
    return 0;
}

void cuda_gemm_bf16_rounded(fp8t_backend *b, float *C, const fp8t_bf16_operand *A,
                            const fp8t_bf16_operand *B, int M, int N, int K, int transA,
                            int transB, int acc, const float *bias, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (ldc == 0) ldc = N;
    if (ldc < N) {
        FP8T_FATAL("gemm_bf16_rounded: ldc = %d is less than N = %d", ldc, N);
    }
    cuda_state *s = cuda_of(b);
    if (K <= 0) {
        if (!acc)
            CUDA_CHECK(cudaMemset2DAsync(C, (size_t)ldc * sizeof(float), 0,
                                         (size_t)N * sizeof(float), (size_t)M, s->stream));
        if (bias && !acc) cuda_bias_add_ld(b, C, ldc, bias, M, N);
        return;
    }
    check_bf16_operand("A", A, transA ? K : M, transA ? M : K);
    check_bf16_operand("B", B, transB ? N : K, transB ? K : N);
    const __nv_bfloat16 *a16 = (const __nv_bfloat16 *)A->data;
    const __nv_bfloat16 *b16 = (const __nv_bfloat16 *)B->data;
    if (bf16_rounded_lt(b, C, ldc, a16, b16, M, N, K, transA, transB, acc, bias) == 0) return;
    /* no BF16 algorithm (odd sizes): the same BF16 values as floats, FP32 GEMM (packed, then
     * copied out when C is strided) */
    float *af = (float *)cuda_scratch(b, SCR_GEMM_A, (size_t)M * K * 4);
    float *bf = (float *)cuda_scratch(b, SCR_GEMM_B, (size_t)K * N * 4);
    int ra = transA ? K : M, ca = transA ? M : K, rb = transB ? N : K, cb = transB ? K : N;
    bf16_operand_decode_kernel<<<(unsigned)(ra < 65535 ? ra : 65535), 256, 0, s->stream>>>(
        af, a16, fp8t_bf16_pad(ca), ra, ca);
    CUDA_LAUNCH_CHECK(s);
    bf16_operand_decode_kernel<<<(unsigned)(rb < 65535 ? rb : 65535), 256, 0, s->stream>>>(
        bf, b16, fp8t_bf16_pad(cb), rb, cb);
    CUDA_LAUNCH_CHECK(s);
    if (ldc == N) {
        cuda_gemm_f32(b, C, af, bf, M, N, K, transA, transB, acc);
        if (bias && !acc) cuda_bias_add(b, C, bias, M, N);
        return;
    }
    float *Cg = (float *)cuda_scratch(b, SCR_GEMM_C, (size_t)M * N * 4);
    cuda_gemm_f32(b, Cg, af, bf, M, N, K, transA, transB, 0);
    unsigned grid = (unsigned)(M < s->num_sms * 64 ? M : s->num_sms * 64);
    copy_out_kernel<<<grid, 256, 0, s->stream>>>(C, ldc, Cg, N, M, N, acc, acc ? NULL : bias);
    CUDA_LAUNCH_CHECK(s);
}

/* to_bf16 of both operands into their own scratch, then the GEMM on the rounded operands: the
 * same bits as the model's cached path (linear.c), which makes the copies itself. */
void cuda_gemm_bf16(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N,
                    int K, int transA, int transB, int acc, float *amax_a, float *amax_b) {
    cuda_state *s = cuda_of(b);
    const int ra = transA ? K : M, ca = transA ? M : K, rb = transB ? N : K, cb = transB ? K : N;
    if (s->plain || M <= 0 || N <= 0 || K <= 0) {
        /* plain (and degenerate sizes): the amaxes in their own pass */
        if (amax_a) cuda_amax(b, amax_a, A, (size_t)(M > 0 ? M : 0) * (size_t)(K > 0 ? K : 0));
        if (amax_b) cuda_amax(b, amax_b, B, (size_t)(K > 0 ? K : 0) * (size_t)(N > 0 ? N : 0));
        amax_a = amax_b = NULL;
    }
    if (gemm_trivial(b, C, M, N, K, acc)) return;
    uint16_t *a16 = (uint16_t *)cuda_scratch(b, SCR_BF16_A, fp8t_bf16_bytes(ra, ca));
    uint16_t *b16 = (uint16_t *)cuda_scratch(b, SCR_BF16_B, fp8t_bf16_bytes(rb, cb));
    cuda_to_bf16_operand(b, a16, amax_a, A, ra, ca);
    cuda_to_bf16_operand(b, b16, amax_b, B, rb, cb);
    fp8t_bf16_operand qa = {a16, ra, ca}, qb = {b16, rb, cb};
    cuda_gemm_bf16_rounded(b, C, &qa, &qb, M, N, K, transA, transB, acc, NULL, 0);
}

static void check_operand(const char *name, const fp8t_fp8_operand *o, int rows, int cols,
                          int trans) {
    if (o->rows != rows || o->cols != cols || (!o->data && !o->data_t) || !o->scale_inv) {
        FP8T_FATAL("gemm_fp8: operand %s is stored [%d,%d] (data %p, data_t %p, scale_inv "
                   "%p) but the GEMM (trans%s=%d) needs it stored as [%d,%d] with data or data_t "
                   "and scale_inv set",
                   name, o->rows, o->cols, (const void *)o->data, (const void *)o->data_t,
                   (const void *)o->scale_inv, name, trans, rows, cols);
    }
}

__global__ void copy_scales_kernel(float *dst, const float *a, const float *b) {
    dst[0] = *a;
    dst[4] = *b;
}

/* cuBLASLt wants 16-byte aligned pointers; scale_inv usually points into the middle of the
 * recipe state, so misaligned per-tensor scales are copied into an aligned pair first (stream
 * ordered: the pair is free again once the previous GEMM has run) */
static void aligned_scales(cuda_state *s, const float **sa, const float **sb) {
    if (!((uintptr_t)*sa & 15u) && !((uintptr_t)*sb & 15u)) return;
    copy_scales_kernel<<<1, 1, 0, s->stream>>>(s->fp8_scales, *sa, *sb);
    CUDA_LAUNCH_CHECK(s);
    *sa = s->fp8_scales;
    *sb = s->fp8_scales + 4;
}

static cudaDataType_t fp8_cuda_type(fp8_format f) {
    return f == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

/* cuBLASLt's scale mode of a block kind (fp8t_fp8_operand's layout is its layout) */
static int lt_scale_mode(fp8t_fp8_scaling k) {
#if CUBLAS_VERSION >= 120900
    if (k == FP8T_SCALING_VEC128) return (int)CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    if (k == FP8T_SCALING_BLK128) return (int)CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    if (k == FP8T_SCALING_ROW) return (int)CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    return (int)CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
#else
    (void)k;
    return -1; /* this toolkit has no block scale modes: always the fallback */
#endif
}

/* gemm_fp8 with block- or row-scaled operands: A [M,K] and B [N,K], both K-major, as the TN
 * kernels read them (cuBLAS A = our B, cuBLAS B = our A; the scale arrays go with their
 * operands: OUTER_VEC's m-vector is our B's N row scales, its n-vector our A's M). cuBLASLt's
 * block kernels take no fast accumulation (they promote every 128-deep chunk into the FP32 sum
 * with its two scales) and on Hopper only 1D x 1D, 1D x 2D and 2D x 1D; the row-scaled ones
 * (OUTER_VEC x OUTER_VEC) apply both scales to the finished FP32 sum and take fast_accum as
 * the per-tensor kernels do (retried without it where refused). Where it has no algorithm
 * (shapes: dimensions multiples of 16, 16-byte aligned pointers), the operands are decoded
 * (code * scale_inv) and the FP32 GEMM runs, reported once. */
static void gemm_fp8_block(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                           const fp8t_fp8_operand *B, int M, int N, int K, int transA, int transB,
                           int acc, int fast_accum, float *amax_out, const float *bias) {
    cuda_state *s = cuda_of(b);
    const int row_a = A->scaling == FP8T_SCALING_ROW, row_b = B->scaling == FP8T_SCALING_ROW;
    if (transA || !transB || A->rows != M || A->cols != K || B->rows != N || B->cols != K ||
        !A->data || !B->data || !A->scale_inv || !B->scale_inv || row_a != row_b ||
        (A->scaling == FP8T_SCALING_BLK128 && B->scaling == FP8T_SCALING_BLK128)) {
        FP8T_FATAL("gemm_fp8: block-scaled operands must be A [M,K] (transA = 0) and "
                   "B [N,K] (transB = 1) in data with scale_inv, not both 128x128, row scales on "
                   "both or neither: got A [%d,%d] B [%d,%d] (scaling %d/%d) for M=%d N=%d K=%d "
                   "transA=%d transB=%d",
                   A->rows, A->cols, B->rows, B->cols, (int)A->scaling, (int)B->scaling, M, N, K,
                   transA, transB);
    }
    if (gemm_trivial(b, C, M, N, K, acc)) {
        if (bias && !acc && M > 0 && N > 0) cuda_bias_add(b, C, bias, M, N);
        if (amax_out && M > 0 && N > 0) cuda_amax(b, amax_out, C, (size_t)M * N);
        return;
    }
    const int mode_a = lt_scale_mode(A->scaling), mode_b = lt_scale_mode(B->scaling);
    int done = 0, bias_done = 0;
    /* multiples of 16 only: the FP8 kernels need them, and then the scale arrays' padded
     * outer dimension (pad4) is the unpadded one cuBLASLt indexes with */
    const int shape_ok = M % 16 == 0 && N % 16 == 0 && K % 16 == 0;
    if (!s->no_lt_fp8 && b->fp8_block_native && shape_ok && mode_a >= 0 && mode_b >= 0 &&
        !(A->fmt == FP8_E5M2 && B->fmt == FP8_E5M2)) {
        /* a per-tensor operand next to a block one keeps its scalar mode; its scale_inv must be
         * 16-byte aligned as in gemm_fp8 */
        const float *sa = A->scale_inv, *sb = B->scale_inv;
        if ((A->scaling == FP8T_SCALING_TENSOR && ((uintptr_t)sa & 15u)) ||
            (B->scaling == FP8T_SCALING_TENSOR && ((uintptr_t)sb & 15u))) {
            copy_scales_kernel<<<1, 1, 0, s->stream>>>(s->fp8_scales, sa, sb);
            CUDA_LAUNCH_CHECK(s);
            if (A->scaling == FP8T_SCALING_TENSOR) sa = s->fp8_scales;
            if (B->scaling == FP8T_SCALING_TENSOR) sb = s->fp8_scales + 4;
        }
        /* fast accumulation where the row-scaled kernels take it: tried first, then without */
        for (int fa = row_a && fast_accum ? 1 : 0; !done && fa >= 0; fa--) {
            if (bias && !s->plain)
                bias_done = done =
                    lt_matmul(s, N, M, K, CUBLAS_OP_T, CUBLAS_OP_N, fp8_cuda_type(B->fmt),
                              B->data, K, fp8_cuda_type(A->fmt), A->data, K, C, N, acc, sb, sa,
                              fa, CUBLAS_COMPUTE_32F, bias, mode_b, mode_a) == 0;
            if (!done)
                done = lt_matmul(s, N, M, K, CUBLAS_OP_T, CUBLAS_OP_N, fp8_cuda_type(B->fmt),
                                 B->data, K, fp8_cuda_type(A->fmt), A->data, K, C, N, acc, sb, sa,
                                 fa, CUBLAS_COMPUTE_32F, NULL, mode_b, mode_a) == 0;
        }
    }
    if (done) {
        s->n_fp8_lt++;
        s->n_fp8_block_lt++;
    } else {
        s->n_fp8_fallback++;
        if (b->fp8_block_native && shape_ok && !s->warned_fp8_block) {
            fp8t_warnf(
                "cuBLASLt has no %s-scaled FP8 GEMM for M=%d N=%d K=%d (scale "
                "modes %d/%d, formats %s x %s); decoding the operands and running the FP32 "
                "GEMM for such GEMMs (reported once)",
                row_a ? "row" : "block", M, N, K, mode_a, mode_b, fp8_format_name(A->fmt),
                fp8_format_name(B->fmt));
            s->warned_fp8_block = 1;
        }
        float *af = (float *)cuda_scratch(b, SCR_GEMM_A, (size_t)M * K * 4);
        float *bf = (float *)cuda_scratch(b, SCR_GEMM_B, (size_t)N * K * 4);
        cuda_block_decode(b, af, A);
        cuda_block_decode(b, bf, B);
        cuda_gemm_f32(b, C, af, bf, M, N, K, 0, 1, acc);
    }
    if (bias && !bias_done) cuda_bias_add(b, C, bias, M, N);
    if (amax_out) cuda_amax(b, amax_out, C, (size_t)M * N);
}

void cuda_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                   const fp8t_fp8_operand *B, int M, int N, int K, int transA, int transB,
                   int acc, int fast_accum, float *amax_out, const float *bias) {
    if (A->scaling != FP8T_SCALING_TENSOR || B->scaling != FP8T_SCALING_TENSOR) {
        gemm_fp8_block(b, C, A, B, M, N, K, transA, transB, acc, fast_accum, amax_out, bias);
        return;
    }
    check_operand("A", A, transA ? K : M, transA ? M : K, transA);
    check_operand("B", B, transB ? N : K, transB ? K : N, transB);
    if (gemm_trivial(b, C, M, N, K, acc)) {
        if (bias && !acc && M > 0 && N > 0) cuda_bias_add(b, C, bias, M, N);
        if (amax_out && M > 0 && N > 0) cuda_amax(b, amax_out, C, (size_t)M * N);
        return;
    }
    int bias_done = 0; /* added in the epilogue */
    cuda_state *s = cuda_of(b);
    int done = 0;
    /* cuBLASLt has no E5M2 x E5M2 kernel; everything else goes to the FP8 tensor cores */
    if (!s->no_lt_fp8 && !(A->fmt == FP8_E5M2 && B->fmt == FP8_E5M2)) {
        /* A as [M,K] row-major (K-major): data when stored so, else data_t; transposed into
         * scratch when that copy is missing */
        const uint8_t *a_mk = transA ? A->data_t : A->data;
        if (!a_mk) {
            const uint8_t *a_km = transA ? A->data : A->data_t; /* [K,M] */
            uint8_t *t = (uint8_t *)cuda_scratch(b, SCR_GEMM_A, (size_t)M * K);
            cuda_transpose_u8(b, t, a_km, K, M);
            a_mk = t;
        }
        /* B as [N,K] row-major (K-major) */
        const uint8_t *b_nk = transB ? B->data : B->data_t;
        if (!b_nk) {
            const uint8_t *b_kn = transB ? B->data_t : B->data; /* [K,N] */
            uint8_t *t = (uint8_t *)cuda_scratch(b, SCR_GEMM_B, (size_t)N * K);
            cuda_transpose_u8(b, t, b_kn, K, N);
            b_nk = t;
        }
        const float *sa = A->scale_inv, *sb = B->scale_inv;
        aligned_scales(s, &sa, &sb);
        /* the bias in the epilogue unless plain or cuBLASLt has no such kernel (then the
         * product alone, and the bias below) */
        if (bias && !s->plain)
            bias_done = done =
                rowmajor_matmul(s, C, fp8_cuda_type(A->fmt), a_mk, fp8_cuda_type(B->fmt), b_nk, M,
                                N, K, 0, 1, acc, sa, sb, fast_accum, CUBLAS_COMPUTE_32F, 0, 0, 0,
                                bias) == 0;
        if (bias && !s->plain && !done && !s->warned_fp8_bias) {
            fp8t_warnf("cuBLASLt has no FP8 GEMM with an FP32 bias epilogue for "
                       "M=%d N=%d K=%d; the bias is added in its own pass (reported once)",
                       M, N, K);
            s->warned_fp8_bias = 1;
        }
        if (!done)
            done = rowmajor_matmul(s, C, fp8_cuda_type(A->fmt), a_mk, fp8_cuda_type(B->fmt), b_nk,
                                   M, N, K, 0, 1, acc, sa, sb, fast_accum, CUBLAS_COMPUTE_32F, 0,
                                   0, 0, NULL) == 0;
    }
    if (done)
        s->n_fp8_lt++;
    else
        s->n_fp8_fallback++;
    if (!done) {
        /* decode codes * scale_inv exactly into floats, FP32 GEMM; data_t (the transpose of the
         * stored layout) is used with the transpose flag flipped when data is missing */
        float *af = (float *)cuda_scratch(b, SCR_GEMM_A, (size_t)M * K * 4);
        float *bf = (float *)cuda_scratch(b, SCR_GEMM_B, (size_t)K * N * 4);
        int ta = A->data ? transA : !transA, tb = B->data ? transB : !transB;
        cuda_fp8_decode(b, af, A->data ? A->data : A->data_t, (size_t)M * K, A->fmt,
                        A->scale_inv);
        cuda_fp8_decode(b, bf, B->data ? B->data : B->data_t, (size_t)K * N, B->fmt,
                        B->scale_inv);
        cuda_gemm_f32(b, C, af, bf, M, N, K, ta, tb, acc);
    }
    if (bias && !bias_done) cuda_bias_add(b, C, bias, M, N);
    if (amax_out) cuda_amax(b, amax_out, C, (size_t)M * N);
}

/* How many gemm_fp8 calls ran on cuBLASLt's FP8 kernels and how many on the decode + FP32
 * fallback (tests and benchmarks report it: the fallback is correct but slow). 0 ok, -1 if b
 * is not a CUDA backend. */
extern "C" int fp8t_cuda_gemm_counts(fp8t_backend *b, long *fp8_lt, long *fp8_fallback) {
    if (!b || !b->name || strcmp(b->name, "cuda") != 0) return -1;
    cuda_state *s = cuda_of(b);
    if (fp8_lt) *fp8_lt = s->n_fp8_lt;
    if (fp8_fallback) *fp8_fallback = s->n_fp8_fallback;
    return 0;
}

/* How many gemm_fp8 calls with block-scaled operands ran on cuBLASLt's block kernels (a part
 * of fp8t_cuda_gemm_counts' fp8_lt). 0 ok, -1 if b is not a CUDA backend. */
extern "C" int fp8t_cuda_gemm_block_count(fp8t_backend *b, long *fp8_block_lt) {
    if (!b || !b->name || strcmp(b->name, "cuda") != 0) return -1;
    if (fp8_block_lt) *fp8_block_lt = cuda_of(b)->n_fp8_block_lt;
    return 0;
}

/* Y = X·Wᵀ into BF16 (backend.h): cuBLASLt with D in BF16 where it takes the problem (N % 8 ==
 * 0 and C16 16-byte aligned, so that its rows are; per-tensor FP8, or the BF16 operands with K
 * padded as gemm_bf16_rounded pads it), else the FP32-output op into scratch, then bf16_pack. */
void cuda_gemm_tn_bf16_out(fp8t_backend *b, uint16_t *C16, const fp8t_fp8_operand *A8,
                           const fp8t_fp8_operand *B8, const fp8t_bf16_operand *A16,
                           const fp8t_bf16_operand *B16, int M, int N, int K, int fast_accum) {
    if (M <= 0 || N <= 0) return;
    fp8t_gemm_tn_bf16_out_check(A8, B8, A16, B16);
    cuda_state *s = cuda_of(b);
    const int lt_ok = !s->plain && K > 0 && N % 8 == 0 && aligned16(C16);
    int done = 0;
    if (A8 && lt_ok && !s->no_lt_fp8 && A8->scaling == FP8T_SCALING_TENSOR &&
        B8->scaling == FP8T_SCALING_TENSOR && A8->data && B8->data &&
        !(A8->fmt == FP8_E5M2 && B8->fmt == FP8_E5M2)) {
        check_operand("A", A8, M, K, 0);
        check_operand("B", B8, N, K, 1);
        const float *sa = A8->scale_inv, *sb = B8->scale_inv;
        aligned_scales(s, &sa, &sb);
        done = rowmajor_matmul(s, C16, fp8_cuda_type(A8->fmt), A8->data, fp8_cuda_type(B8->fmt),
                               B8->data, M, N, K, 0, 1, 0, sa, sb, fast_accum, CUBLAS_COMPUTE_32F,
                               0, 0, 0, NULL, CUDA_R_16BF) == 0;
        if (done) s->n_fp8_lt++;
    } else if (A16 && lt_ok) {
        check_bf16_operand("A", A16, M, K);
        check_bf16_operand("B", B16, N, K);
        const int Kp = fp8t_bf16_pad(K);
        done = rowmajor_matmul(s, C16, CUDA_R_16BF, A16->data, CUDA_R_16BF, B16->data, M, N, Kp,
                               0, 1, 0, NULL, NULL, 0, CUBLAS_COMPUTE_32F, Kp, Kp, 0, NULL,
                               CUDA_R_16BF) == 0;
    }
    if (done) return;
    float *C = (float *)cuda_scratch(b, SCR_GEMM_F32, (size_t)M * N * sizeof(float)); /* [M, N] */
    fp8t_gemm_tn_bf16_out_composed(&cuda_backend_ops, b, C, C16, A8, B8, A16, B16, M, N, K,
                                   fast_accum);
}
