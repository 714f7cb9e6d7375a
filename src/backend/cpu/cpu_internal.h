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
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/error.h"
#include "backend/operand_kind.h" /* fp8t_scaled_quant */
#include "numerics/scaling_hd.h"  /* fp8t_amax_merge */
#include "util/check.h"           /* FP8T_FATAL */

/* Scratch buffers owned by the backend; each grows as needed and is reused across calls
 * (ops run one at a time on the backend's single "stream"). */
enum {
    CPU_SCRATCH_GEMM_A = 0, /* float operand copies of gemm_bf16 / gemm_fp8 */
    CPU_SCRATCH_GEMM_B,
    CPU_SCRATCH_CODES,       /* block / mxfp8 fake quantization codes */
    CPU_SCRATCH_SCALES,      /* block scales / e8m0 exponents */
    CPU_SCRATCH_ATTN,        /* attention's head-major copies of q, k, v, dout */
    CPU_SCRATCH_ACT,         /* gelu_forward_bf16's FP32 result before the rounding */
    CPU_SCRATCH_GRAD,        /* the fused GELU-backward ops' FP32 dx before the rounding */
    CPU_SCRATCH_OPERAND,     /* make_operand's composed values (a combination with no kernel) */
    CPU_SCRATCH_OPERAND_SUM, /* ... and its residual sum when the caller keeps none */
    CPU_SCRATCH_NORM_X,      /* a norm backward's input widened from its BF16 copy */
    CPU_SCRATCH_QKV,         /* the attention forward ops' qkv + qkv_bias (fp8t_attn_shape) */
    CPU_SCRATCH_GEMM_C,      /* gemm_tn_bf16_out's FP32 product before its rounding */
    CPU_SCRATCH_WIDE_A,      /* swiglu_operand's gate and up widened from BF16 (gelu16_operand:
                                its values) */
    CPU_SCRATCH_WIDE_B,
    /* (the fused GELU backward's GELU input widened likewise goes in CPU_SCRATCH_ACT, which
     * its bias-free path leaves unused) */
    CPU_SCRATCH_COUNT
};

typedef struct {
    void *scratch[CPU_SCRATCH_COUNT];
    size_t scratch_bytes[CPU_SCRATCH_COUNT];
    /* RoPE cos/sin cache of attention (cpu_attention.c): [rope_T][cos half | sin half] */
    float *rope;
    int rope_T, rope_HS;
    float rope_theta;
    fp8t_rope_scaling rope_scaling; /* the scaling the cached table was made with */
    /* BF16 buckets of reduce_start in flight (cpu_comm.c): the BF16 copy MPI sums, widened
     * back into x at reduce_wait */
    struct cpu_bf16_pending {
        float *x;
        uint16_t *h;
        size_t n;
    } * bf16_pending;
    int n_bf16_pending, cap_bf16_pending;
} cpu_state;

static inline cpu_state *cpu_of(fp8t_backend *b) { return (cpu_state *)b->impl; }

/* The CPU backend's op table (make_operand composes its requests of these ops themselves, not
 * of whatever table wraps them) */
extern const fp8t_backend_ops cpu_backend_ops;

/* 64-byte aligned, zeroed; prints "fp8train: out of memory ..." and exits on failure. */
void *cpu_alloc_or_die(size_t bytes, const char *file, int line);
#define CPU_ZALLOC(bytes) cpu_alloc_or_die((bytes), __FILE__, __LINE__)
/* A scratch buffer of at least `bytes` (contents undefined). */
void *cpu_scratch(fp8t_backend *b, int slot, size_t bytes);

/* exp(x) for float, within 2 ulp of the exact value over the whole range (overflow to Inf,
 * gradual underflow to 0, NaN in gives NaN out), written without calls or branches so a
 * `#pragma omp simd` loop around it vectorizes (glibc's expf is a scalar call). Deterministic:
 * it does not depend on the ISA of the machine beyond IEEE float arithmetic. */
static inline float cpu_expf(float x) {
    /* Clamp to [-104, 89], where 2^n stays representable, on the bit pattern with masks:
     * float compares may trap, so gcc keeps them as branches and will not vectorize the
     * loop; integer masks are straight-line code. NaNs (patterns above +-Inf) pass through.
     * Range tests are one unsigned compare: u in (lo, hi] <=> u - lo - 1 <= hi - lo - 1. */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    /* below: x in [-Inf, -104); above: x in (89, +Inf] (all-ones masks) */
    uint32_t below = 0u - (uint32_t)(u - 0xC2D00001u <= 0xFF800000u - 0xC2D00001u);
    uint32_t above = 0u - (uint32_t)(u - 0x42B20001u <= 0x7F800000u - 0x42B20001u);
    u = (u & ~(below | above)) | (0xC2D00000u & below) | (0x42B20000u & above);
    float xc;
    memcpy(&xc, &u, sizeof xc);
    /* n = round(x / ln 2) with the 1.5*2^23 trick: n sits in the low mantissa bits */
    const float magic = 12582912.0f;
    float kf = xc * 1.44269504088896341f + magic;
    float k = kf - magic;
    /* r = x - n ln 2 in two steps (ln2_hi has few bits, so k * ln2_hi is exact) */
    float r = xc - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    /* e^r on |r| <= 0.35: Taylor to degree 7 (truncation 5e-9, below half an ulp) */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* times 2^n as two normal powers of two, so subnormal results round only once */
    uint32_t kbits;
    memcpy(&kbits, &kf, sizeof kbits);
    int32_t n = (int32_t)(kbits - 0x4B400000u), n1 = n / 2, n2 = n - n1;
    uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return (p * s1) * s2;
}

/* max of x[0..n) (-Inf for n == 0; NaNs are skipped, they reach the result through the
 * exp that follows). GCC vector extensions keep the running max in a register: gcc lowers
 * `omp simd reduction(max)` through a stack slot, which is several times slower. */
typedef float cpu_v4f __attribute__((vector_size(16)));
typedef int32_t cpu_v4i __attribute__((vector_size(16)));
static inline float cpu_row_max(const float *x, int n) {
    cpu_v4f m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        cpu_v4f v;
        memcpy(&v, x + j, sizeof v);
        cpu_v4i gt = v > m;
        m = (cpu_v4f)(((cpu_v4i)v & gt) | ((cpu_v4i)m & ~gt));
    }
    float mx = m[0];
    for (int l = 1; l < 4; l++) mx = m[l] > mx ? m[l] : mx;
    for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* Op implementations, grouped by file. */
/* cpu_gemm.c */
void cpu_gemm_f32(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N, int K,
                  int transA, int transB, int acc);
void cpu_gemm_bf16(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N, int K,
                   int transA, int transB, int acc, float *amax_a, float *amax_b);
void cpu_gemm_bf16_rounded(fp8t_backend *b, float *C, const fp8t_bf16_operand *A,
                           const fp8t_bf16_operand *B, int M, int N, int K, int transA,
                           int transB, int acc, const float *bias, int ldc);
void cpu_gemm_tn_bf16_out(fp8t_backend *b, uint16_t *C16, const fp8t_fp8_operand *A8,
                          const fp8t_fp8_operand *B8, const fp8t_bf16_operand *A16,
                          const fp8t_bf16_operand *B16, int M, int N, int K, int fast_accum);
void cpu_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A, const fp8t_fp8_operand *B,
                  int M, int N, int K, int transA, int transB, int acc, int fast_accum,
                  float *amax_out, const float *bias);
/* cpu_quant.c */
void cpu_amax(fp8t_backend *b, float *amax_out, const float *x, size_t n);
void cpu_quantize(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                  const float *x, int rows, int cols, fp8_format fmt, const float *scale);
void cpu_compute_scale(fp8t_backend *b, float *scale, float *scale_inv, const float *amax,
                       float fmt_max, float epsilon, int pow2);
void cpu_fake_quantize(fp8t_backend *b, float *out, const float *x, size_t n, fp8_format fmt,
                       const float *scale);
void cpu_block_quantize(fp8t_backend *b, uint8_t *codes, float *scale_inv, const float *x,
                        int rows, int cols, int transpose, fp8t_fp8_scaling scaling,
                        fp8_format fmt, int pow2);
void cpu_quantize_scaled(fp8t_backend *b, const fp8t_scaled_quant *q);
void cpu_block_fake_quantize(fp8t_backend *b, float *out, const float *x, int rows, int cols,
                             int tile_r, int tile_c, fp8_format fmt);
void cpu_mxfp8_fake_quantize(fp8t_backend *b, float *out, const float *x, int rows, int cols);
void cpu_bf16_round(fp8t_backend *b, float *out, const float *x, size_t n);
void cpu_bf16_pack(fp8t_backend *b, uint16_t *out, const float *x, const float *bias, int rows,
                   int cols);
void cpu_bf16_unpack(fp8t_backend *b, float *out, const uint16_t *x, size_t n);
/* An input in FP32: x itself, or its BF16 copy x16 (x NULL: a layer's save) widened into
 * scratch slot `slot` (bf16_unpack's values) */
const float *cpu_bf16_widen(fp8t_backend *b, int slot, const float *x, const uint16_t *x16,
                            size_t n);
void cpu_to_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, const float *x, int rows,
                 int cols);
void cpu_delayed_update(fp8t_backend *b, float *state, int n, int len, fp8t_amax_algo algo,
                        int margin);
/* cpu_norm.c */
void cpu_layernorm_forward(fp8t_backend *b, float *out, float *mean, float *rstd, const float *x,
                           const float *w, const float *bias, int N, int C, float eps);
void cpu_layernorm_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, float *mean,
                                float *rstd, const float *x, const float *w, const float *bias,
                                int N, int C, float eps);
void cpu_add_layernorm_forward_bf16(fp8t_backend *b, float *sum, uint16_t *sum16, uint16_t *out,
                                    float *amax_out, float *mean, float *rstd, const float *a,
                                    const float *c, const float *w, const float *bias, int N,
                                    int C, float eps);
/* RMSNorm straight into a BF16 operand (rstd written), and with the residual add before it:
 * rmsnorm_forward then to_bf16, add first */
void cpu_rmsnorm_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, float *rstd,
                              const float *x, const float *w, int N, int C, float eps);
void cpu_add_rmsnorm_forward_bf16(fp8t_backend *b, float *sum, uint16_t *sum16, uint16_t *out,
                                  float *amax_out, float *rstd, const float *a, const float *c,
                                  const float *w, int N, int C, float eps);
void cpu_layernorm_backward(fp8t_backend *b, float *dx, float *dw, float *dbias,
                            const float *dout, const float *x, const uint16_t *x16,
                            const float *w, const float *mean, const float *rstd, int N, int C);
void cpu_rmsnorm_forward(fp8t_backend *b, float *out, float *rstd, const float *x, const float *w,
                         int N, int C, float eps);
void cpu_rmsnorm_backward(fp8t_backend *b, float *dx, float *dw, const float *dout,
                          const float *x, const uint16_t *x16, const float *w, const float *rstd,
                          int N, int C);
/* cpu_attention.c */
void cpu_attention_forward(fp8t_backend *b, float *out, float *lse, void *saved, const float *qkv,
                           const fp8t_attn_shape *s);
void cpu_attention_backward(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                            const void *saved, const float *out, const float *lse,
                            const fp8t_attn_shape *s);
size_t cpu_attention_saved_bytes(fp8t_backend *b, const fp8t_attn_shape *s);
/* cpu_attention_decode.c */
void cpu_kv_cache_write(fp8t_backend *b, void *kc, void *vc, int kv, const float *qkv,
                        const fp8t_attn_shape *s, int Tmax);
void cpu_attention_decode(fp8t_backend *b, float *out, void *kc, void *vc, int kv,
                          const float *qkv, const int *pos, const fp8t_attn_shape *s, int Tmax);
void cpu_embedding_forward_bf16(fp8t_backend *b, float *out, const int *tokens,
                                const uint16_t *wte, int ld, const float *wpe, const int *pos,
                                int B, int T, int C);
void cpu_embedding_forward_fp8(fp8t_backend *b, float *out, const int *tokens,
                               const uint8_t *codes, int ld, const float *scale_inv,
                               const float *wpe, const int *pos, int B, int T, int C);
/* cpu_norm.c / cpu_misc.c: the inference fusions (backend.h) */
void cpu_add_norm_operand(fp8t_backend *b, void *out, float *sum, const float *a, const float *y,
                          const float *ybias, const float *w, const float *bias, int rms,
                          int rows, int cols, float eps, const float *scale, fp8_format fmt);
void cpu_swiglu_operand(fp8t_backend *b, void *out, const float *gate, const float *up,
                        const uint16_t *gate16, const uint16_t *up16, int rows, int cols,
                        const float *scale, fp8_format fmt, float *amax_out);
void cpu_gelu16_operand(fp8t_backend *b, void *out, const uint16_t *x16, const float *bias,
                        int rows, int cols, const float *scale, fp8_format fmt, float *amax_out);
/* cpu_operand.c: make_operand over the kernels above (fp8t_operand_kernel_of) */
void cpu_make_operand(fp8t_backend *b, const fp8t_operand_req *r);
int cpu_make_operand_fuses(fp8t_backend *b, const fp8t_operand_req *r);
/* cpu_misc.c */
void cpu_embedding_forward(fp8t_backend *b, float *out, const int *tokens, const float *wte,
                           const float *wpe, int B, int T, int C);
void cpu_embedding_backward(fp8t_backend *b, float *dwte, float *dwpe, const float *dout,
                            const int *tokens, int B, int T, int C);
void cpu_bias_add(fp8t_backend *b, float *out, const float *bias, int N, int OC);
/* qkv [rows, W] as the forward attention ops read it: itself, or with s->qkv_bias added by
 * bias_add's arithmetic in CPU_SCRATCH_QKV */
const float *cpu_qkv_biased(fp8t_backend *b, const float *qkv, const fp8t_attn_shape *s,
                            size_t rows);
/* save16 / x16 (may be NULL): make_operand's save16 / x2_16 (backend.h) */
void cpu_gelu_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, uint16_t *save16,
                           const float *x, int rows, int cols);
/* values (may be NULL): make_operand's values, GELU's output (the dGELU's: its gradient) */
void cpu_quantize_gelu(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                       uint16_t *save16, const float *x, const float *bias, int rows, int cols,
                       fp8_format fmt, const float *scale, float *values);
void cpu_gelu_backward_bias(fp8t_backend *b, float *dx, const float *x, const float *bias,
                            const float *dout, int rows, int cols);
void cpu_quantize_colsum(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                         float *colsum, const float *x, int rows, int cols, fp8_format fmt,
                         const float *scale);
void cpu_to_bf16_colsum(fp8t_backend *b, uint16_t *out, float *amax_out, float *colsum,
                        const float *x, int rows, int cols);
void cpu_gelu_backward_quantize_colsum(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t,
                                       float *amax_out, float *colsum, const float *dout,
                                       const float *x, const uint16_t *x16, const float *bias,
                                       int rows, int cols, fp8_format fmt, const float *scale,
                                       float *values);
void cpu_gelu_backward_bf16_colsum(fp8t_backend *b, uint16_t *out, float *amax_out, float *colsum,
                                   const float *dout, const float *x, const uint16_t *x16,
                                   const float *bias, int rows, int cols);
void cpu_bias_backward(fp8t_backend *b, float *dbias, const float *dout, int N, int OC);
void cpu_gelu_forward(fp8t_backend *b, float *out, const float *x, size_t n);
void cpu_gelu_backward(fp8t_backend *b, float *dx, const float *x, const float *dout, size_t n);
void cpu_swiglu_forward(fp8t_backend *b, float *out, const float *gate, const float *up,
                        uint16_t *gate16, uint16_t *up16, size_t n);
void cpu_swiglu_backward(fp8t_backend *b, float *dgate, float *dup, const float *dout,
                         const float *gate, const float *up, const uint16_t *gate16,
                         const uint16_t *up16, size_t n);
/* One of SwiGLU's gradients into out [n]: which FP8T_STEP_DSWIGLU_GATE (swiglu_backward's
 * dgate) or FP8T_STEP_DSWIGLU_UP (its dup; up is not read), bit for bit; gate (up) NULL:
 * from gate16 (up16) */
void cpu_swiglu_grad(fp8t_backend *b, float *out, int which, const float *dout, const float *gate,
                     const uint16_t *gate16, const float *up, const uint16_t *up16, size_t n);
void cpu_softmax_xent(fp8t_backend *b, float *losses, float *dlogits, const float *logits,
                      const int *targets, int N, int V, float dloss);
void cpu_softmax_xent_bf16(fp8t_backend *b, float *losses, uint16_t *dlogits, float *amax_out,
                           float *dlogits32, const float *logits, int ld, const int *targets,
                           int N, int V, float dloss);
void cpu_add(fp8t_backend *b, float *out, const float *a, const float *c, size_t n);
void cpu_add_bias(fp8t_backend *b, float *out, uint16_t *out16, const float *a, const float *y,
                  const float *bias, int N, int OC);
void cpu_accumulate(fp8t_backend *b, float *out, const float *x, size_t n);
void cpu_scale(fp8t_backend *b, float *out, float s, size_t n);
void cpu_sumsq(fp8t_backend *b, float *out, const float *x, size_t n);
void cpu_sum(fp8t_backend *b, float *out, const float *x, size_t n);
void cpu_adamw(fp8t_backend *b, float *params, float *m, float *v, const float *grads, size_t n,
               float lr, float beta1, float beta2, float eps, float wd, int t, float grad_scale);

/* Column sums in a fixed order: colsum[c] += sum over rows r of x[r*ld + c] (c < cols),
 * accumulated in double per column, rows visited in order. Parallel over column blocks, so
 * the result does not depend on the thread count. Used by bias_backward. */
void cpu_column_sums(float *colsum, const float *x, int rows, int cols, int ld);

/* cpu_comm.c: the collectives over MPI (host memory is the device memory) */
int cpu_comm_init(fp8t_backend *b, char *err, size_t errlen);
void cpu_allreduce(fp8t_backend *b, float *x, size_t n, fp8t_reduce_op op, int bf16);
void cpu_reduce_scatter(fp8t_backend *b, float *x, const size_t *counts);
void cpu_all_gather(fp8t_backend *b, float *x, const size_t *counts);
void cpu_reduce_start(fp8t_backend *b, float *x, size_t n, const size_t *counts, int bf16);
void cpu_reduce_wait(fp8t_backend *b);
void cpu_broadcast(fp8t_backend *b, void *x, size_t bytes, int root);

#endif
