/* dev/cuda/lt_plan.cuh — the cuBLASLt side the GEMM ladders share (skinny_ladder,
 * prefill_out_ladder): a checked call, and a TN matmul planned once and launched many times. */
#pragma once
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>

#define LT_CHECK(x)                                                                              \
    do {                                                                                         \
        cublasStatus_t st_ = (x);                                                                \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                      \
            fprintf(stderr, "cuBLASLt error %d at %s:%d\n", (int)st_, __FILE__, __LINE__);       \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

/* cuBLASLt TN: C[M,N] row-major = column-major [N,M] = W[N,K] (op T) x X[M,K] (op N), C of
 * type type_d (C and D alike); the descriptors and the heuristic's algorithms made once, so a
 * timed launch is the matmul alone */
struct lt_plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo[16]; /* the heuristic's candidates, best guess first */
    int nalgo, pick;               /* how many; the one lt_run launches */
};
static lt_plan lt_prepare(cublasLtHandle_t lt, size_t ws_bytes, cudaDataType_t type,
                          cudaDataType_t type_d, int M, int N, int K, const float *sw,
                          const float *sx) {
    lt_plan p;
    LT_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (sw) {
        LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw,
                                                sizeof(sw)));
        LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx,
                                                sizeof(sx)));
    }
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.la, type, K, N, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.lb, type, K, M, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.lc, type_d, N, M, N));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_bytes, sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t h[16];
    int n = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.la, p.lb, p.lc, p.lc, pref, 16, h, &n));
    cublasLtMatmulPreferenceDestroy(pref);
    if (n == 0) {
        fprintf(stderr, "cuBLASLt: no algorithm for M=%d N=%d K=%d (D type %d)\n", M, N, K,
                (int)type_d);
        exit(1);
    }
    p.nalgo = 0;
    for (int i = 0; i < n; i++)
        if (h[i].state == CUBLAS_STATUS_SUCCESS) p.algo[p.nalgo++] = h[i].algo;
    p.pick = 0;
    return p;
}
static void lt_run(cublasLtHandle_t lt, const lt_plan &p, cudaStream_t st, void *ws,
                   size_t ws_bytes, const void *W, const void *X, void *C) {
    float alpha = 1.0f, beta = 0.0f;
    LT_CHECK(cublasLtMatmul(lt, p.op, &alpha, W, p.la, X, p.lb, &beta, C, p.lc, C, p.lc,
                            &p.algo[p.pick], ws, ws_bytes, st));
}
static void lt_free(lt_plan &p) {
    cublasLtMatrixLayoutDestroy(p.la);
    cublasLtMatrixLayoutDestroy(p.lb);
    cublasLtMatrixLayoutDestroy(p.lc);
    cublasLtMatmulDescDestroy(p.op);
}
