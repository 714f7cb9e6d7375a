/* CPU backend — private declarations shared by the CPU backend source files.
 *
 * The CPU backend is the reference the CUDA backend is tested against, so every op is
 * deterministic: the same inputs give bit-identical outputs on every run and for every
 * OMP_NUM_THREADS. Parallel loops use static schedules over work items whose results do not
 * depend on which thread computes them; reductions are cut into fixed chunks (a function of the
 * size only), each chunk reduced in order, and the partials combined in order. */
#ifndef FP8TRAIN_CPU_INTERNAL_H
#define FP8TRAIN_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/backend.h"

/* Scratch buffers owned by the backend; each grows as needed and is reused across calls
 * (ops run one at a time on the backend's single "stream"). */
enum {
    CPU_SCRATCH_GEMM_A = 0, /* float operand copies of gemm_bf16 / gemm_fp8 */
    CPU_SCRATCH_GEMM_B,
    CPU_SCRATCH_CODES,      /* block / mxfp8 fake quantization codes */
    CPU_SCRATCH_SCALES,     /* block scales / e8m0 exponents */
    CPU_SCRATCH_COUNT
};

typedef struct {
    void *scratch[CPU_SCRATCH_COUNT];
    size_t scratch_bytes[CPU_SCRATCH_COUNT];
    float fp8_table[2][256]; /* fp8_decode of every code, per format */
} cpu_state;

static inline cpu_state *cpu_of(fp8t_backend *b) { return (cpu_state *)b->impl; }

/* 64-byte aligned, zeroed; prints "fp8train: out of memory ..." and exits on failure. */
void *cpu_alloc_or_die(size_t bytes, const char *file, int line);
#define CPU_ZALLOC(bytes) cpu_alloc_or_die((bytes), __FILE__, __LINE__)
/* A scratch buffer of at least `bytes` (contents undefined). */
void *cpu_scratch(fp8t_backend *b, int slot, size_t bytes);

/* NaN-propagating max of absolute values: any NaN makes the result NaN. */
static inline float cpu_amax_merge(float acc, float v) {
    if (acc != acc || v != v) return acc != acc ? acc : v;
    float a = v < 0 ? -v : v;
    return a > acc ? a : acc;
}

/* Op implementations, grouped by file. */
/* cpu_gemm.c */
void cpu_gemm_f32(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N, int K,
                  int transA, int transB, int acc);
void cpu_gemm_bf16(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N,
                   int K, int transA, int transB, int acc);
void cpu_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                  const fp8t_fp8_operand *B, int M, int N, int K, int transA, int transB,
                  int acc, int fast_accum, float *amax_out);
/* cpu_quant.c */
float cpu_amax_of(const float *x, size_t n); /* max abs, NaN if any NaN */
void cpu_amax(fp8t_backend *b, float *amax_out, const float *x, size_t n);
void cpu_quantize(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                  const float *x, int rows, int cols, fp8_format fmt, const float *scale);
void cpu_compute_scale(fp8t_backend *b, float *scale, float *scale_inv, const float *amax,
                       float fmt_max, float epsilon, int pow2);
void cpu_fake_quantize(fp8t_backend *b, float *out, const float *x, size_t n, fp8_format fmt,
                       const float *scale);
void cpu_block_fake_quantize(fp8t_backend *b, float *out, const float *x, int rows, int cols,
                             int tile_r, int tile_c, fp8_format fmt);
void cpu_mxfp8_fake_quantize(fp8t_backend *b, float *out, const float *x, int rows, int cols);
void cpu_bf16_round(fp8t_backend *b, float *out, const float *x, size_t n);
void cpu_delayed_update(fp8t_backend *b, float *state, int n, int len, fp8t_amax_algo algo,
                        int margin);
/* cpu_norm.c */
void cpu_layernorm_forward(fp8t_backend *b, float *out, float *mean, float *rstd,
                           const float *x, const float *w, const float *bias, int N, int C,
                           float eps);
void cpu_layernorm_backward(fp8t_backend *b, float *dx, float *dw, float *dbias,
                            const float *dout, const float *x, const float *w,
                            const float *mean, const float *rstd, int N, int C);
void cpu_rmsnorm_forward(fp8t_backend *b, float *out, float *rstd, const float *x,
                         const float *w, int N, int C, float eps);
void cpu_rmsnorm_backward(fp8t_backend *b, float *dx, float *dw, const float *dout,
                          const float *x, const float *w, const float *rstd, int N, int C);
/* cpu_attention.c */
void cpu_attention_forward(fp8t_backend *b, float *out, float *lse, const float *qkv, int B,
                           int T, int NH, int HS, float rope_theta);
void cpu_attention_backward(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                            const float *out, const float *lse, int B, int T, int NH, int HS,
                            float rope_theta);
/* cpu_misc.c */
void cpu_embedding_forward(fp8t_backend *b, float *out, const int *tokens, const float *wte,
                           const float *wpe, int B, int T, int C);
void cpu_embedding_backward(fp8t_backend *b, float *dwte, float *dwpe, const float *dout,
                            const int *tokens, int B, int T, int C);
void cpu_bias_add(fp8t_backend *b, float *out, const float *bias, int N, int OC);
void cpu_bias_backward(fp8t_backend *b, float *dbias, const float *dout, int N, int OC);
void cpu_gelu_forward(fp8t_backend *b, float *out, const float *x, size_t n);
void cpu_gelu_backward(fp8t_backend *b, float *dx, const float *x, const float *dout,
                       size_t n);
void cpu_swiglu_forward(fp8t_backend *b, float *out, const float *gate, const float *up,
                        size_t n);
void cpu_swiglu_backward(fp8t_backend *b, float *dgate, float *dup, const float *dout,
                         const float *gate, const float *up, size_t n);
void cpu_softmax_xent(fp8t_backend *b, float *losses, float *dlogits, const float *logits,
                      const int *targets, int N, int V, float dloss);
void cpu_add(fp8t_backend *b, float *out, const float *a, const float *c, size_t n);
void cpu_accumulate(fp8t_backend *b, float *out, const float *x, size_t n);
void cpu_scale(fp8t_backend *b, float *out, float s, size_t n);
void cpu_sumsq(fp8t_backend *b, float *out, const float *x, size_t n);
void cpu_sum(fp8t_backend *b, float *out, const float *x, size_t n);
void cpu_adamw(fp8t_backend *b, float *params, float *m, float *v, const float *grads, size_t n,
               float lr, float beta1, float beta2, float eps, float wd, int t,
               float grad_scale);

/* Column sums in a fixed order: colsum[c] += sum over rows r of x[r*ld + c] (c < cols),
 * accumulated in double per column, rows visited in order. Parallel over column blocks, so
 * the result does not depend on the thread count. Used by bias_backward. */
void cpu_column_sums(float *colsum, const float *x, int rows, int cols, int ld);

#endif
