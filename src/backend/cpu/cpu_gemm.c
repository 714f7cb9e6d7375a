/* CPU backend — GEMMs through OpenBLAS (FP32 accumulation in every precision).
 * BF16: both operands are rounded to BF16 into backend scratch, then multiplied in FP32, which
 * is what a BF16 tensor-core GEMM with FP32 accumulation computes up to summation order.
 * FP8: the codes are decoded exactly to float, multiplied in FP32, and the product scaled by
 * scale_inv_A * scale_inv_B (the alpha of the GEMM, as cuBLASLt applies it). */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

/* C[M,N] = alpha * op(A)·op(B) + (acc ? C : 0) */
/* C [M, ldc] (ldc >= N; columns >= N untouched) */
static void sgemm_rowmajor_ld(float *C, int ldc, const float *A, const float *B, int M, int N,
                              int K, int transA, int transB, int acc, float alpha) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* empty sum: the product is zero */
        if (!acc)
            for (int r = 0; r < M; r++) memset(C + (size_t)r * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    int lda = transA ? M : K; /* A stored [K,M] or [M,K] */
    int ldb = transB ? K : N; /* B stored [N,K] or [K,N] */
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb,
                acc ? 1.0f : 0.0f, C, ldc);
}

static void sgemm_rowmajor(float *C, const float *A, const float *B, int M, int N, int K,
                           int transA, int transB, int acc, float alpha) {
    sgemm_rowmajor_ld(C, N, A, B, M, N, K, transA, transB, acc, alpha);
}

void cpu_gemm_f32(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N, int K,
                  int transA, int transB, int acc) {
    (void)b;
    sgemm_rowmajor(C, A, B, M, N, K, transA, transB, acc, 1.0f);
}

void cpu_gemm_bf16(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N, int K,
                   int transA, int transB, int acc, float *amax_a, float *amax_b) {
    size_t na = (size_t)(M > 0 ? M : 0) * (size_t)(K > 0 ? K : 0);
    size_t nb = (size_t)(K > 0 ? K : 0) * (size_t)(N > 0 ? N : 0);
    /* the reference: a separate pass (the CUDA backend fuses it into its BF16 conversion) */
    if (amax_a) cpu_amax(b, amax_a, A, na);
    if (amax_b) cpu_amax(b, amax_b, B, nb);
    if (M <= 0 || N <= 0) return;
    float *a16 = cpu_scratch(b, CPU_SCRATCH_GEMM_A, (na ? na : 1) * sizeof(float)); /* op(A) */
    float *b16 = cpu_scratch(b, CPU_SCRATCH_GEMM_B, (nb ? nb : 1) * sizeof(float)); /* op(B) */
    bf16_round(a16, A, na);
    bf16_round(b16, B, nb);
    sgemm_rowmajor(C, a16, b16, M, N, K, transA, transB, acc, 1.0f);
}

/* The BF16 operand's stored [rows, cols] values, decoded (exactly) into a packed float
 * buffer out [rows, cols]. */
static void decode_bf16_operand(float *out, const fp8t_bf16_operand *op) {
    const size_t ld = (size_t)fp8t_bf16_pad(op->cols);
    if (ld == (size_t)op->cols) { /* no padding columns: one (parallel) pass */
        bf16_decode_n(out, op->data, (size_t)op->rows * ld);
        return;
    }
    for (int r = 0; r < op->rows; r++)
        bf16_decode_n(out + (size_t)r * op->cols, op->data + (size_t)r * ld, (size_t)op->cols);
}

/* A GEMM's operand must be stored as the shape the GEMM reads (rows x cols of its stored
 * layout): a mismatch is a caller bug, reported with the shapes. */
static void check_bf16_shape(const char *name, const fp8t_bf16_operand *op, int rows, int cols) {
    if (op->rows != rows || op->cols != cols || (!op->data && rows > 0 && cols > 0)) {
        FP8T_FATAL("gemm_bf16_rounded: operand %s is stored %dx%d (data %p) but the GEMM "
                   "needs %dx%d",
                   name, op->rows, op->cols, (const void *)op->data, rows, cols);
    }
}

void cpu_gemm_bf16_rounded(fp8t_backend *b, float *C, const fp8t_bf16_operand *A,
                           const fp8t_bf16_operand *B, int M, int N, int K, int transA,
                           int transB, int acc, const float *bias, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (ldc == 0) ldc = N;
    if (ldc < N) {
        FP8T_FATAL("gemm_bf16_rounded: ldc = %d is less than N = %d", ldc, N);
    }
    const int k = K > 0 ? K : 0;
    check_bf16_shape("A", A, transA ? k : M, transA ? M : k);
    check_bf16_shape("B", B, transB ? N : k, transB ? k : N);
    size_t na = (size_t)M * (size_t)k, nb = (size_t)k * (size_t)N;
    float *af = cpu_scratch(b, CPU_SCRATCH_GEMM_A, (na ? na : 1) * sizeof(float)); /* op(A) */
    float *bf = cpu_scratch(b, CPU_SCRATCH_GEMM_B, (nb ? nb : 1) * sizeof(float)); /* op(B) */
    if (k > 0) {
        decode_bf16_operand(af, A);
        decode_bf16_operand(bf, B);
    }
    sgemm_rowmajor_ld(C, ldc, af, bf, M, N, K, transA, transB, acc, 1.0f);
    if (bias && ldc == N)
        cpu_bias_add(b, C, bias, M, N);
    else if (bias) /* bias_add's arithmetic, row by row */
        for (int r = 0; r < M; r++) cpu_bias_add(b, C + (size_t)r * ldc, bias, 1, N);
}

/* Decode an FP8 operand into float scratch. op(X) is want_rows x want_cols; X->rows/cols is
 * the stored layout (its transpose when trans). Returns the transpose flag that goes with the
 * decoded buffer: when only data_t ([cols, rows] of the stored layout) is present it is
 * decoded instead, with the flag flipped. */
static int decode_operand(float *out, const fp8t_fp8_operand *op, int trans, const char *name,
                          int want_rows, int want_cols) {
    int need_rows = trans ? want_cols : want_rows, need_cols = trans ? want_rows : want_cols;
    if (op->rows != need_rows || op->cols != need_cols) {
        FP8T_FATAL("gemm_fp8: operand %s is stored %dx%d but the GEMM (trans%s=%d) needs "
                   "%dx%d",
                   name, op->rows, op->cols, name, trans, need_rows, need_cols);
    }
    const uint8_t *codes = op->data;
    if (!codes) {
        codes = op->data_t;
        trans = !trans;
    }
    if (!codes) {
        FP8T_FATAL("gemm_fp8: operand %s has neither data nor data_t", name);
    }
    /* exact decode; the scales go into the GEMM's alpha */
    fp8_dequantize(out, codes, (size_t)op->rows * op->cols, 1.0f, op->fmt);
    return trans;
}

/* A block-scaled (or per-tensor) K-major operand [rows, K] decoded to code * its scale_inv. */
static void decode_block_operand(float *out, const fp8t_fp8_operand *op, const char *name,
                                 int rows, int K) {
    if (op->rows != rows || op->cols != K || !op->data || !op->scale_inv) {
        FP8T_FATAL("gemm_fp8: block-scaled operand %s must be stored K-major as [%d,%d] "
                   "in data (A with transA = 0, B with transB = 1), got [%d,%d] data %p",
                   name, rows, K, op->rows, op->cols, (const void *)op->data);
    }
    float table[256];
    for (int c = 0; c < 256; c++) table[c] = fp8_decode((uint8_t)c, op->fmt);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < K; k++) {
            const size_t i = (size_t)r * K + k;
            const float si =
                op->scaling == FP8T_SCALING_TENSOR
                    ? *op->scale_inv
                    : op->scale_inv[fp8t_block_scale_index(op->scaling, rows, K, r, k)];
            out[i] = table[op->data[i]] * si;
        }
}

void cpu_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A, const fp8t_fp8_operand *B,
                  int M, int N, int K, int transA, int transB, int acc, int fast_accum,
                  float *amax_out, const float *bias) {
    (void)fast_accum; /* CPU accumulation is always full FP32 */
    if (M <= 0 || N <= 0) return;
    if (A->scaling != FP8T_SCALING_TENSOR || B->scaling != FP8T_SCALING_TENSOR) {
        if (transA || !transB ||
            (A->scaling == FP8T_SCALING_BLK128 && B->scaling == FP8T_SCALING_BLK128) ||
            ((A->scaling == FP8T_SCALING_ROW) != (B->scaling == FP8T_SCALING_ROW))) {
            FP8T_FATAL("gemm_fp8: block-scaled operands need transA = 0, "
                       "transB = 1, at most one 128x128-block operand, and row scales "
                       "on both or neither");
        }
        size_t na = (size_t)M * K, nb = (size_t)N * K;
        float *af = cpu_scratch(b, CPU_SCRATCH_GEMM_A, (na ? na : 1) * sizeof(float));
        float *bf = cpu_scratch(b, CPU_SCRATCH_GEMM_B, (nb ? nb : 1) * sizeof(float));
        decode_block_operand(af, A, "A", M, K);
        decode_block_operand(bf, B, "B", N, K);
        sgemm_rowmajor(C, af, bf, M, N, K, 0, 1, acc, 1.0f);
        if (bias) cpu_bias_add(b, C, bias, M, N);
        if (amax_out) cpu_amax(b, amax_out, C, (size_t)M * N);
        return;
    }
    size_t na = (size_t)M * K, nb = (size_t)K * N;
    float *af = cpu_scratch(b, CPU_SCRATCH_GEMM_A, (na ? na : 1) * sizeof(float));
    float *bf = cpu_scratch(b, CPU_SCRATCH_GEMM_B, (nb ? nb : 1) * sizeof(float));
    int ta = decode_operand(af, A, transA, "A", M, K);
    int tb = decode_operand(bf, B, transB, "B", K, N);
    float alpha = (*A->scale_inv) * (*B->scale_inv);
    sgemm_rowmajor(C, af, bf, M, N, K, ta, tb, acc, alpha);
    if (bias) cpu_bias_add(b, C, bias, M, N);
    if (amax_out) cpu_amax(b, amax_out, C, (size_t)M * N);
}

/* The FP32 product of gemm_fp8 / gemm_bf16_rounded in scratch, then its BF16 rounding
 * (bf16_pack's): the composition itself */
void cpu_gemm_tn_bf16_out(fp8t_backend *b, uint16_t *C16, const fp8t_fp8_operand *A8,
                          const fp8t_fp8_operand *B8, const fp8t_bf16_operand *A16,
                          const fp8t_bf16_operand *B16, int M, int N, int K, int fast_accum) {
    if (M <= 0 || N <= 0) return;
    float *C = cpu_scratch(b, CPU_SCRATCH_GEMM_C, (size_t)M * N * sizeof(float)); /* [M, N] */
    fp8t_gemm_tn_bf16_out_composed(&cpu_backend_ops, b, C, C16, A8, B8, A16, B16, M, N, K,
                                   fast_accum);
}
