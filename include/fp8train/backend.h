/* fp8train — the backend op table.
 *
 * The model's forward and backward are written ONCE against this table (src/model/). A backend
 * (src/backend/cpu, src/backend/cuda) implements every op. Rules every op follows:
 *  - All tensor pointers are backend ("device") memory obtained from ops->malloc. The CPU
 *    backend's device memory is host memory; the model never dereferences a device pointer.
 *  - Row-major layouts. Outputs come first in the argument list, then inputs, then sizes.
 *  - Ops are asynchronous on the backend's single stream; only to_host / synchronize wait.
 *  - "acc" outputs accumulate (+=), the others overwrite. Each op's comment says which.
 *  - Scalars the GPU must not wait for (scales, amaxes) are passed as device pointers.
 *  - Precision: activations, gradients and master weights are FP32 tensors. A GEMM's
 *    precision decides what its operands are rounded to (BF16, or FP8 codes + scale).
 */
#ifndef FP8TRAIN_BACKEND_H
#define FP8TRAIN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/dist.h"
#include "fp8train/fp8.h"
#include "fp8train/recipe.h"
#include "fp8train/stats.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fp8t_backend fp8t_backend;

/* RoPE frequency scaling. DEFAULT: inv_freq_i = theta^(-2i/HS). LLAMA3: Llama 3.1+'s
 * "llama3" rope_type (frequencies below original_max_pos / low_freq_factor wavelengths are
 * divided by factor, a smooth blend between the two cut-offs). */
typedef enum { FP8T_ROPE_DEFAULT = 0, FP8T_ROPE_LLAMA3 = 1 } fp8t_rope_type;
typedef struct {
    fp8t_rope_type type;
    float factor;           /* llama3: 32 for Llama-3.2, 8 for Llama-3.1 */
    float low_freq_factor;  /* llama3: 1 */
    float high_freq_factor; /* llama3: 4 */
    int original_max_pos;   /* llama3: 8192 */
} fp8t_rope_scaling;

/* The shape of one causal self-attention call (attention_* ops). qkv rows are
 * [q: NH*HS | k: NKV*HS | v: NKV*HS]; query head h reads key/value head h / (NH / NKV)
 * (grouped-query attention; NKV = NH is plain multi-head, NKV = 1 multi-query). */
typedef struct {
    int B, T;
    int NH;           /* query heads */
    int NKV;          /* key/value heads, dividing NH; 0 means NH */
    int HS;           /* head size */
    float rope_theta; /* > 0: RoPE (rotate-half) with this base on q and k; 0: none */
    fp8t_rope_scaling rope_scaling; /* with rope_theta > 0 */
    /* The forward ops (attention_forward, kv_cache_write, attention_decode) only: NULL, or a
     * device [(NH + 2 NKV) HS] bias the qkv rows still lack. Every value the op reads is
     * qkv + bias as bias_add gives it (one FP32 add), so a GEMM that cannot add the bias in
     * its epilogue (FP8 into FP32) leaves it to the attention instead of a pass of its own.
     * attention_backward refuses it. */
    const float *qkv_bias;
} fp8t_attn_shape;

/* NKV with 0 read as NH */
static inline int fp8t_attn_nkv(const fp8t_attn_shape *s) { return s->NKV > 0 ? s->NKV : s->NH; }
/* floats of one token's qkv row: (NH + 2 NKV) * HS */
static inline int fp8t_attn_qkv_width(const fp8t_attn_shape *s) {
    return (s->NH + 2 * fp8t_attn_nkv(s)) * s->HS;
}
/* The RoPE inverse frequency of rotation pair i (0 <= i < HS/2), in double, scaling applied
 * (the formula of transformers' _compute_llama3_parameters for LLAMA3). Both backends build
 * their cos/sin tables from it, so they rotate by the same angles. */
double fp8t_rope_inv_freq(const fp8t_attn_shape *s, int i);

/* How an FP8 operand's scale_inv applies to its codes. TENSOR: one float for the whole tensor.
 * The other kinds (scaled operands: make_operand) hold one FP32 scale_inv per block of the
 * stored [rows, cols] codes, cols being the GEMM's reduction dimension K (the operand is
 * K-major: an A stored [M,K] with transA = 0, a B stored [N,K] with transB = 1; data only, no
 * data_t):
 *   VEC128  1x128 tiles along K: scale_inv[kb * pad4(rows) + r]  (kb = c / 128)
 *   BLK128  128x128 blocks:      scale_inv[rb * pad4(ceil(cols/128)) + kb]  (rb = r / 128)
 *   ROW     one scale per row, over all of K: scale_inv[r]  (pad4(rows) floats)
 * which is cuBLASLt's layout for CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / _BLK128x128_32F /
 * _OUTER_VEC_32F on a K-major operand, so a GPU passes it as it is; the padding entries are
 * unused. Each block is quantized with the current-scaling scale of its own amax
 * (fp8t_current_scale, epsilon 0): ROW is block quantization with 1 x K tiles. */
typedef enum {
    FP8T_SCALING_TENSOR = 0,
    FP8T_SCALING_VEC128 = 1,
    FP8T_SCALING_BLK128 = 2,
    FP8T_SCALING_ROW = 3
} fp8t_fp8_scaling;

/* An FP8 operand: codes plus the device pointer to its scale_inv (value = code * scale_inv). */
typedef struct {
    const uint8_t *data;    /* [rows, cols] row-major codes */
    const uint8_t *data_t;  /* [cols, rows] transposed codes, or NULL (see fp8_wants_transpose) */
    const float *scale_inv; /* device pointer to 1 float, or per block (scaling) */
    fp8_format fmt;
    int rows, cols;
    fp8t_fp8_scaling scaling; /* 0: per tensor */
} fp8t_fp8_operand;

/* the layout helpers below run in CUDA kernels too */
#ifdef __CUDACC__
#define FP8T_LAYOUT_FN static __host__ __device__ inline
#else
#define FP8T_LAYOUT_FN static inline
#endif
FP8T_LAYOUT_FN int fp8t_pad4(int n) { return (n + 3) / 4 * 4; }
/* floats of a block-scaled operand's scale_inv array (padding included) */
FP8T_LAYOUT_FN size_t fp8t_block_scale_floats(fp8t_fp8_scaling k, int rows, int cols) {
    const size_t kb = (size_t)((cols + 127) / 128);
    if (k == FP8T_SCALING_VEC128) return kb * (size_t)fp8t_pad4(rows);
    if (k == FP8T_SCALING_BLK128)
        return (size_t)((rows + 127) / 128) * (size_t)fp8t_pad4((int)kb);
    if (k == FP8T_SCALING_ROW) return (size_t)fp8t_pad4(rows);
    return 1;
}
/* index of the scale_inv of element (r, c) of a block-scaled [rows, cols] operand */
FP8T_LAYOUT_FN size_t fp8t_block_scale_index(fp8t_fp8_scaling k, int rows, int cols, int r,
                                             int c) {
    if (k == FP8T_SCALING_VEC128) return (size_t)(c / 128) * (size_t)fp8t_pad4(rows) + (size_t)r;
    if (k == FP8T_SCALING_ROW) return (size_t)r;
    return (size_t)(r / 128) * (size_t)fp8t_pad4((cols + 127) / 128) + (size_t)(c / 128);
}
/* the tile of a scaling kind on a [rows, cols] operand: tile_r x tile_c elements */
FP8T_LAYOUT_FN int fp8t_scaling_tile_r(fp8t_fp8_scaling k) {
    return k == FP8T_SCALING_BLK128 ? 128 : 1;
}
FP8T_LAYOUT_FN int fp8t_scaling_tile_c(fp8t_fp8_scaling k, int cols) {
    return k == FP8T_SCALING_ROW ? (cols > 0 ? cols : 1) : 128;
}

/* A BF16 operand (make_operand): the [rows, cols] values rounded to BF16 (round to nearest
 * even; raw bits), stored with fp8t_bf16_pad(cols) elements per row and fp8t_bf16_pad(rows)
 * rows, the padding zero. The padding lets a GEMM round any of its dimensions up to a multiple
 * of 8 (tensor-core tiles; a zero product adds nothing to an FP32 sum) without another copy.
 * One copy serves every GEMM that reads the tensor in the same stored layout: X is operand A
 * of its Fprop and operand B of its Wgrad, dY operand A of its Dgrad and (transposed) of its
 * Wgrad, W operand B of its Fprop and of its Dgrad. */
typedef struct {
    const uint16_t *data; /* [fp8t_bf16_pad(rows), fp8t_bf16_pad(cols)] */
    int rows, cols;
} fp8t_bf16_operand;

static inline int fp8t_bf16_pad(int n) { return (n + 7) / 8 * 8; }
/* rows r0 .. r0+n-1 of BF16 operand o (r0 a multiple of 8, so that rows a GEMM pads to 8 read
 * past the view are the next rows' or, past the last view, o's zero padding) */
static inline fp8t_bf16_operand fp8t_bf16_rows(const fp8t_bf16_operand *o, int r0, int n) {
    fp8t_bf16_operand v = {o->data + (size_t)r0 * (size_t)fp8t_bf16_pad(o->cols), n, o->cols};
    return v;
}
/* bytes of a BF16 operand of [rows, cols] (padding included) */
static inline size_t fp8t_bf16_bytes(int rows, int cols) {
    return (size_t)fp8t_bf16_pad(rows) * (size_t)fp8t_bf16_pad(cols) * 2u;
}

/* ---- the operand path: one operand type, one op that makes it (make_operand) ----
 *
 * fp8t_operand is what a GEMM reads, in the spirit of Transformer Engine's quantized tensor:
 * the values of a [rows, cols] tensor as FP8 codes (E4M3 / E5M2, with a scale per tensor or
 * per block / row: fp8t_fp8_scaling) or as a BF16 operand (fp8t_bf16_operand's padded
 * layout), in row-major and/or transposed orientation, with the scale, scale_inv and amax that
 * go with them. The GEMM ops read the views fp8t_operand_fp8 / fp8t_operand_bf16 give. */
typedef enum {
    FP8T_OPERAND_E4M3 = FP8_E4M3,
    FP8T_OPERAND_E5M2 = FP8_E5M2,
    FP8T_OPERAND_BF16 = 2
} fp8t_operand_format;

typedef struct {
    void *data;         /* [rows, cols]: FP8 codes (uint8_t) or a BF16 operand (uint16_t,
                          [pad8(rows), pad8(cols)], padding zero); NULL: not made */
    void *data_t;       /* [cols, rows] FP8 codes (the transposed orientation), or NULL. BF16
                          has none: one padded copy serves both orientations of a GEMM */
    const float *scale; /* per-tensor FP8: device pointer to the scale the codes are made with
                          (known before the values: delayed, fixed, or computed beforehand) */
    float *scale_inv;   /* per-tensor FP8: the 1 float that dequantizes (read by the GEMM, not
                          written here); scaled FP8: written, scaling's layout for data */
    float *scale_inv_t; /* scaled FP8: written, scaling's layout for data_t [cols, rows] */
    float *amax;        /* device pointer or NULL: max-accumulated with the values' amax (NaN
                          wins), taken by the pass that makes the operand */
    fp8t_operand_format format;
    fp8t_fp8_scaling scaling; /* FP8 only: TENSOR, or VEC128 / BLK128 / ROW (each block with
                          the current-scaling scale of its own amax, epsilon 0) */
    int pow2;       /* scaled FP8: power-of-two block scales (fp8t_current_scale's pow2) */
    int rows, cols; /* of the values; data is [rows, cols] */
} fp8t_operand;

/* The producer step whose output the operand is made of, in the same pass (what a backend
 * does not fuse it composes, or the model runs the producer's own op first: see
 * make_operand_fuses). x, x2, bias are the step's inputs, all [rows, cols] but bias [cols]. */
typedef enum {
    FP8T_STEP_NONE = 0,     /* values = x */
    FP8T_STEP_BIAS,         /* x + bias (bias_add's arithmetic) */
    FP8T_STEP_GELU,         /* gelu(x (+ bias)): the linear after GELU takes GELU's input,
                                with the bias its producer left out (gelu_forward's values) */
    FP8T_STEP_DGELU,        /* gelu'(x2 (+ bias)) * x: x the gradient of GELU's output, x2 GELU's
                                input (gelu_backward / gelu_backward_bias's values) */
    FP8T_STEP_SWIGLU,       /* silu(x) * x2: x the gate, x2 up (swiglu_forward's) */
    FP8T_STEP_DSWIGLU_GATE, /* x * x3 * silu'(x2): the gate's gradient, x the gradient of SwiGLU's
                                output, x2 the gate, x3 up (swiglu_backward's dgate) */
    FP8T_STEP_DSWIGLU_UP,   /* x * silu(x2): up's gradient (swiglu_backward's dup) */
    FP8T_STEP_LAYERNORM,    /* LayerNorm(x; norm_w, norm_b) (layernorm_forward's values) */
    FP8T_STEP_RMSNORM,      /* RMSNorm(x; norm_w) (rmsnorm_forward's) */
    FP8T_STEP_ADD_LAYERNORM, /* s = x + (x2 (+ bias)) (add / add_bias's), then LayerNorm(s) */
    FP8T_STEP_ADD_RMSNORM,   /* the same with RMSNorm */
    FP8T_STEP_COUNT
} fp8t_operand_step;

/* One make_operand call: what to make (out: its data / data_t select the orientations, its
 * amax whether the amax is taken) of which producer step, and the side outputs. */
typedef struct {
    fp8t_operand out;
    fp8t_operand_step step;
    const float *x, *x2;  /* the step's inputs (above) */
    const uint16_t *x_16; /* SWIGLU, GELU (or NULL): x (SwiGLU's gate) as BF16 values [rows,
                             cols] packed, read instead of x (x NULL; SwiGLU's up then from
                             x2_16): a BF16 GEMM output */
    const float *bias;    /* [cols] or NULL: BIAS, GELU, DGELU (on GELU's input), ADD_* (on x2) */
    const float *norm_w, *norm_b; /* norms: weight [cols], LayerNorm bias [cols] (may be NULL) */
    float eps;                    /* norms */
    float *sum;         /* ADD_*: the residual sum s written here (may be NULL: not kept) */
    float *mean, *rstd; /* norms (may be NULL): the statistics layernorm_forward /
                             rmsnorm_forward keep (RMSNorm: rstd only) */
    float *colsum;      /* NULL, or += the values' column sums (bias_backward's: the bias
                             gradient from the pass that rounds dY) */
    uint16_t *sum16;    /* ADD_* (or NULL): the sum's BF16 copy [rows, cols] packed too
                             (bf16_pack's bits: a layer's save of the residual stream) */
    /* The activations' inputs kept for the backward in BF16 [rows, cols] packed (bf16_pack's
     * layout), so that neither direction needs a pass of its own over them: */
    uint16_t *save16;      /* GELU (or NULL): also write bf16_pack(x, bias) here; SWIGLU: x's */
    uint16_t *save16_2;    /* SWIGLU (or NULL): also write x2's BF16 copy here */
    const uint16_t *x2_16; /* DGELU, DSWIGLU_* (or NULL): GELU's input (the gate) as that copy,
                             read instead of x2 (bias then NULL: the copy holds it); SWIGLU
                             with x_16: up as BF16 values, read instead of x2 */
    const float *x3;       /* DSWIGLU_GATE: up (or NULL: x3_16) */
    const uint16_t *x3_16; /* DSWIGLU_GATE: up as its BF16 copy, read instead of x3 */
    float *values; /* GELU, DGELU into per-tensor FP8 (or NULL): the step's FP32 values [rows,
                      cols] packed written here too, what a read-only hook is shown (the
                      step's own op's bits); other requests with values are composed */
} fp8t_operand_req;

/* The GEMM views of an operand (gemm_fp8's and gemm_bf16_rounded's argument types). */
static inline fp8t_fp8_operand fp8t_operand_fp8(const fp8t_operand *o) {
    fp8t_fp8_operand q;
    q.data = (const uint8_t *)o->data;
    q.data_t = (const uint8_t *)o->data_t;
    q.scale_inv = o->scale_inv;
    q.fmt = (fp8_format)o->format;
    q.rows = o->rows;
    q.cols = o->cols;
    q.scaling = o->scaling;
    return q;
}
static inline fp8t_bf16_operand fp8t_operand_bf16(const fp8t_operand *o) {
    fp8t_bf16_operand h;
    h.data = (const uint16_t *)o->data;
    h.rows = o->rows;
    h.cols = o->cols;
    return h;
}

/* How a KV cache stores K and V (kv_cache_write, attention_decode). */
typedef enum { FP8T_KV_FP32 = 0, FP8T_KV_BF16 = 1, FP8T_KV_FP8 = 2 } fp8t_kv_kind;
static inline size_t fp8t_kv_align16(size_t n) { return (n + 15) / 16 * 16; }
/* bytes of one (sequence, K/V head) block of a cache of Tmax positions of HS values; in FP8 the
 * codes [Tmax, HS] then scale_inv [Tmax] floats at fp8t_kv_scale_offset */
static inline size_t fp8t_kv_scale_offset(int Tmax, int HS) {
    return fp8t_kv_align16((size_t)Tmax * (size_t)HS);
}
static inline size_t fp8t_kv_head_bytes(int kv, int Tmax, int HS) {
    const size_t n = (size_t)Tmax * (size_t)HS;
    if (kv == FP8T_KV_FP8)
        return fp8t_kv_scale_offset(Tmax, HS) + fp8t_kv_align16((size_t)Tmax * 4u);
    return n * (kv == FP8T_KV_BF16 ? 2u : 4u);
}

typedef struct fp8t_backend_ops {
    /* ---- memory ---- */
    void *(*malloc)(fp8t_backend *b, size_t bytes); /* zeroed; aborts with a message on OOM */
    void (*free)(fp8t_backend *b, void *p);
    void (*to_device)(fp8t_backend *b, void *dst, const void *src_host, size_t bytes);
    void (*to_host)(fp8t_backend *b, void *dst_host, const void *src, size_t bytes); /* waits */
    void (*copy)(fp8t_backend *b, void *dst, const void *src, size_t bytes);
    void (*zero)(fp8t_backend *b, void *dst, size_t bytes);
    void (*synchronize)(fp8t_backend *b);
    void (*destroy)(fp8t_backend *b); /* frees the backend itself (fp8t_backend_destroy) */

    /* ---- GEMMs: C[M,N] (=, or += when acc) op(A)[M,K] · op(B)[K,N], row-major.
     * transA: A is stored [K,M] instead of [M,K]; transB: B is stored [N,K] instead of [K,N].
     * The linear layer uses: Fprop Y=X·Wᵀ (transB), Dgrad dX=dY·W, Wgrad dW=dYᵀ·X (transA). */
    void (*gemm_f32)(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N,
                     int K, int transA, int transB, int acc);
    /* operands rounded to BF16 (round to nearest even), products accumulated in FP32.
     * amax_a / amax_b (device pointers, may be NULL): max-accumulated with amax(A) / amax(B)
     * (NaN propagates), taken by the pass that rounds the operands (a BF16 run records its
     * amaxes without reading the operands again). */
    void (*gemm_bf16)(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N,
                      int K, int transA, int transB, int acc, float *amax_a, float *amax_b);
    /* the BF16 GEMM on BF16 operands (make_operand; A, B: stored layouts, as for
     * gemm_fp8). bias (may be NULL; only with acc = 0): C[i,j] = product + bias[j], one FP32
     * rounding as in bias_add after the product (a GPU adds it in the GEMM's epilogue, where
     * the library may pick a kernel that sums the products in another order).
     * gemm_bf16(A, B) makes the BF16 operands of A and B, then runs this without bias.
     * ldc: C's row stride in elements (0: packed, N); with ldc >= fp8t_bf16_pad(N) and no
     * bias, the columns [N, pad(N)) of each row may be written too (zeros, or left as they
     * were with acc): that lets a GPU pad N without a copy-out of unaligned rows (the GPT-2
     * head's N = 50257). */
    void (*gemm_bf16_rounded)(fp8t_backend *b, float *C, const fp8t_bf16_operand *A,
                              const fp8t_bf16_operand *B, int M, int N, int K, int transA,
                              int transB, int acc, const float *bias, int ldc);
    /* FP8 operands; C = (A_codes·B_codes) * scale_inv_A * scale_inv_B, accumulated in FP32.
     * A->rows/cols and B->rows/cols describe the stored (untransposed) layout. fast_accum is a
     * hint (Hopper's reduced-precision accumulation); the CPU ignores it. Optionally records
     * amax of the result into *amax_out (device pointer, max-accumulate) when non-NULL. bias
     * (may be NULL; only with acc = 0): bias[j] added to every row of the result, as bias_add
     * after the product (a GPU may add it in the GEMM's epilogue, rounding once).
     * Block-scaled operands (scaling != TENSOR, from make_operand) only as
     * A [M,K] with transA = 0 and B [N,K] with transB = 1, not both BLK128, ROW only with ROW:
     * each product takes its blocks' scale_inv (the CPU decodes code * scale_inv and runs the
     * FP32 GEMM; Hopper's cuBLASLt applies them per 128-deep chunk, or per row and column for
     * ROW, where fp8_block_native says so). fast_accum is ignored but for ROW x ROW. */
    void (*gemm_fp8)(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                     const fp8t_fp8_operand *B, int M, int N, int K, int transA, int transB,
                     int acc, int fast_accum, float *amax_out, const float *bias);
    /* Y = X·Wᵀ as BF16 values: the product gemm_fp8 (A8 and B8 given, A16 and B16 NULL, with
     * fast_accum) or gemm_bf16_rounded (A16 and B16 given) computes for A [M,K] and B [N,K]
     * (both K-major: transA = 0, transB = 1), without accumulation or bias, written as the
     * nearest-even BF16 rounding of its FP32 result into C16 [M, N] packed (uint16_t bits). A GPU
     * rounds in the GEMM's epilogue, from the FP32 sum (the library may pick a kernel that sums
     * the products in another order than the FP32-output GEMM's). Where a linear's output is
     * only read by the next operand's producer (the inference model's MLP), it halves the
     * bytes written and read. */
    void (*gemm_tn_bf16_out)(fp8t_backend *b, uint16_t *C16, const fp8t_fp8_operand *A8,
                             const fp8t_fp8_operand *B8, const fp8t_bf16_operand *A16,
                             const fp8t_bf16_operand *B16, int M, int N, int K, int fast_accum);

    /* ---- quantization ---- */
    /* *amax_out = max(*amax_out, amax(x)); NaN propagates (device pointer) */
    void (*amax)(fp8t_backend *b, float *amax_out, const float *x, size_t n);
    /* The operand r->out of r->step's values: FP8 codes saturating (per tensor with
     * *out.scale, or scaled blocks whose scale_inv it writes) or a BF16 operand (round to
     * nearest even), in the orientations out.data / out.data_t ask for; amax, column sums and
     * the step's side outputs (sum, mean, rstd) as r says. The values themselves are not
     * written. Every combination gives the bits of its unfused ops (the producer's op into
     * FP32, bias_backward, amax, then the cast); a GPU may sum the column sums in another
     * (fixed) order. The only op that makes a GEMM operand, so that each fusion of a producer
     * into the cast is one request the backends agree on, not an op of its own. A combination
     * make_operand_fuses says 0 for is composed of its unfused ops by the CPU and refused by
     * the CUDA backend (it exits with a message). r is host memory, read before the op
     * returns. */
    void (*make_operand)(fp8t_backend *b, const fp8t_operand_req *r);
    /* 1 when make_operand does r's combination in one pass over its inputs (the model then
     * asks for it; otherwise it runs the producer's op into FP32 and makes the operand with
     * step NONE: model_make_operand). Depends on r's step, format, scaling and which outputs
     * it asks for, not on the pointers' values but for alignment where a GPU kernel needs it.
     * Step NONE without bias or side outputs, making codes (per tensor: row-major, the
     * transposed ones optional; scaled: either orientation or both) or a BF16 operand, is
     * always 1: the composition's last step. */
    int (*make_operand_fuses)(fp8t_backend *b, const fp8t_operand_req *r);
    /* current scaling from an amax on the device: scale, scale_inv (device pointers) */
    void (*compute_scale)(fp8t_backend *b, float *scale, float *scale_inv, const float *amax,
                          float fmt_max, float epsilon, int pow2);
    /* out = dequant(quant(x * *scale)) / *scale (saturating); out may alias x */
    void (*fake_quantize)(fp8t_backend *b, float *out, const float *x, size_t n, fp8_format fmt,
                          const float *scale);
    /* out = x quantized per tile_r x tile_c block (block scaling), dequantized; emulation
     * around a higher-precision GEMM. out may alias x. */
    void (*block_fake_quantize)(fp8t_backend *b, float *out, const float *x, int rows, int cols,
                                int tile_r, int tile_c, fp8_format fmt);
    /* out = x quantized as MXFP8 (32-element row blocks, E8M0 scales), dequantized */
    void (*mxfp8_fake_quantize)(fp8t_backend *b, float *out, const float *x, int rows, int cols);
    /* out = bf16 rounding of x; out may alias x */
    void (*bf16_round)(fp8t_backend *b, float *out, const float *x, size_t n);
    /* out [rows, cols] (packed BF16, no padding) = x + bias[c] rounded to BF16 (nearest even;
     * the sum in FP32, as bias_add's); bias may be NULL. An activation the forward keeps for
     * the backward in half the bytes (not a GEMM operand: no padding, no amax). */
    void (*bf16_pack)(fp8t_backend *b, uint16_t *out, const float *x, const float *bias, int rows,
                      int cols);
    /* out[n] (FP32) = x[n] (packed BF16): exact, BF16 widens to FP32 without rounding */
    void (*bf16_unpack)(fp8t_backend *b, float *out, const uint16_t *x, size_t n);
    /* delayed-scaling update of every tensor of the flat recipe state (one launch, no sync).
     * state is the device copy of the fp8t_recipe_state layout for (n, len). */
    void (*delayed_update)(fp8t_backend *b, float *state, int n, int len, fp8t_amax_algo algo,
                           int margin);

    /* ---- model ops (N = rows = B*T tokens, C = channels) ---- */
    /* out[N,C] = wte[tok] + (wpe ? wpe[t] : 0), t = i % T */
    void (*embedding_forward)(fp8t_backend *b, float *out, const int *tokens, const float *wte,
                              const float *wpe, int B, int T, int C);
    /* dwte[tok] += dout; dwpe[t] += dout (dwpe may be NULL) — deterministic order */
    void (*embedding_backward)(fp8t_backend *b, float *dwte, float *dwpe, const float *dout,
                               const int *tokens, int B, int T, int C);
    /* out = (x-mean)*rstd*w + bias; saves mean[N], rstd[N] */
    void (*layernorm_forward)(fp8t_backend *b, float *out, float *mean, float *rstd,
                              const float *x, const float *w, const float *bias, int N, int C,
                              float eps);
    /* dx += ..., dw += ..., dbias += ...; x16 (or NULL): the norm's input x as a BF16 copy
     * [N, C] packed (bf16_pack's), read instead of x (NULL then) */
    void (*layernorm_backward)(fp8t_backend *b, float *dx, float *dw, float *dbias,
                               const float *dout, const float *x, const uint16_t *x16,
                               const float *w, const float *mean, const float *rstd, int N,
                               int C);
    /* out = x * rstd * w, rstd = 1/sqrt(mean(x^2)+eps); saves rstd[N] */
    void (*rmsnorm_forward)(fp8t_backend *b, float *out, float *rstd, const float *x,
                            const float *w, int N, int C, float eps);
    /* dx += ..., dw += ...; x16 as layernorm_backward's */
    void (*rmsnorm_backward)(fp8t_backend *b, float *dx, float *dw, const float *dout,
                             const float *x, const uint16_t *x16, const float *w,
                             const float *rstd, int N, int C);
    /* out[N,OC] += bias[OC] broadcast */
    void (*bias_add)(fp8t_backend *b, float *out, const float *bias, int N, int OC);
    /* dbias[OC] += sum over rows of dout[N,OC] */
    void (*bias_backward)(fp8t_backend *b, float *dbias, const float *dout, int N, int OC);
    /* GELU, tanh approximation: out = gelu(x) */
    void (*gelu_forward)(fp8t_backend *b, float *out, const float *x, size_t n);
    /* dx = gelu'(x) * dout (overwrite; dx may alias dout or x: elementwise) */
    void (*gelu_backward)(fp8t_backend *b, float *dx, const float *x, const float *dout,
                          size_t n);
    /* dx = gelu'(x + bias) * dout, x [rows, cols], bias [cols] (the same bits as bias_add on a
     * copy of x, then gelu_backward); dx may alias dout */
    void (*gelu_backward_bias)(fp8t_backend *b, float *dx, const float *x, const float *bias,
                               const float *dout, int rows, int cols);
    /* out = silu(gate) * up. gate16, up16 (may be NULL): gate and up as packed BF16 too
     * (bf16_pack's bits, no bias), from the same read: the layer's saves for the backward */
    void (*swiglu_forward)(fp8t_backend *b, float *out, const float *gate, const float *up,
                           uint16_t *gate16, uint16_t *up16, size_t n);
    /* dgate, dup overwritten. gate (up) NULL: read from gate16 (up16), packed BF16 (the
     * saves swiglu_forward wrote; widening is exact, so the bits are those of bf16_unpack
     * followed by this op on the FP32 values) */
    void (*swiglu_backward)(fp8t_backend *b, float *dgate, float *dup, const float *dout,
                            const float *gate, const float *up, const uint16_t *gate16,
                            const uint16_t *up16, size_t n);
    /* One of swiglu_backward's outputs alone into out: which FP8T_STEP_DSWIGLU_GATE (dgate)
     * or FP8T_STEP_DSWIGLU_UP (dup; up is not read), the same bits; gate (up) NULL: read from
     * gate16 (up16). The composition of make_operand's DSWIGLU steps. */
    void (*swiglu_grad)(fp8t_backend *b, float *out, int which, const float *dout,
                        const float *gate, const uint16_t *gate16, const float *up,
                        const uint16_t *up16, size_t n);
    /* Causal multi-head self-attention of shape *s (fp8t_attn_shape: B, T, NH query heads,
     * NKV key/value heads, head size HS, RoPE). qkv[B,T,(NH+2NKV)*HS] holds q|k|v per token;
     * query head h attends with key/value head h / (NH/NKV). If s->rope_theta > 0, RoPE
     * (rotate-half pairs (i, i+HS/2), fp8t_rope_inv_freq) is applied to q and k inside the op.
     * out[B,T,NH*HS]; lse[B,NH,T] saves the softmax log-sum-exp for the backward
     * (flash-attention style: no [T,T] matrix is kept). Scale 1/sqrt(HS).
     * saved (may be NULL): attention_saved_bytes bytes where the forward keeps what its
     * backward would otherwise rebuild from qkv (the CUDA flash path: the BF16 q, k, v it
     * rounded, RoPE applied); the backend's own layout. */
    void (*attention_forward)(fp8t_backend *b, float *out, float *lse, void *saved,
                              const float *qkv, const fp8t_attn_shape *s);
    /* dqkv[B,T,(NH+2NKV)*HS] overwritten, from dout, the inputs and the saved out/lse; the
     * k and v gradients of a key/value head sum over the query heads of its group (in a fixed
     * order: deterministic). saved: what the forward that made out and lse kept there (the
     * same bits as rebuilding it), or NULL */
    void (*attention_backward)(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                               const void *saved, const float *out, const float *lse,
                               const fp8t_attn_shape *s);
    /* bytes attention_forward's saved wants for this shape; 0 when the backend keeps nothing
     * (then saved is ignored) */
    size_t (*attention_saved_bytes)(fp8t_backend *b, const fp8t_attn_shape *s);
    /* Fused softmax + cross-entropy over logits[N,V] with targets[N] (target < 0: ignored,
     * zero loss and zero gradient). losses[N] = -log softmax[target].
     * If dlogits != NULL: dlogits = (softmax - onehot) * dloss (dlogits may alias logits). */
    void (*softmax_xent)(fp8t_backend *b, float *losses, float *dlogits, const float *logits,
                         const int *targets, int N, int V, float dloss);
    /* softmax_xent's losses and dlogits, the gradient written as a BF16 operand (make_operand's
     * layout and rounding: [pad(N), pad(V)], padding zero) instead of FP32: softmax_xent then
     * its BF16 operand (the same bits on the CPU; a GPU may sum a row in another order) without
     * the FP32 gradient's round trip through memory. logits rows have stride ld >= V (the model
     * pads them to pad(V)); amax_out (may be NULL) is max-accumulated with the FP32 gradient's
     * amax, as make_operand's. dlogits32 (may be NULL, may alias logits): the FP32 gradient
     * too, rows of stride ld (columns V.. untouched), the same bits as softmax_xent's, for a
     * read-only hook that shows it (fp8t_model_set_observer). */
    void (*softmax_xent_bf16)(fp8t_backend *b, float *losses, uint16_t *dlogits, float *amax_out,
                              float *dlogits32, const float *logits, int ld, const int *targets,
                              int N, int V, float dloss);
    /* out = a + c (out may alias a or c) */
    void (*add)(fp8t_backend *b, float *out, const float *a, const float *c, size_t n);
    /* out[N,OC] = a + (y + bias[OC] broadcast): bias_add on y then add, without writing y (the
     * residual add taking the bias its linear left out); bias NULL: a + y (add's bits); out
     * may alias a. out16 (or NULL): out's BF16 copy [N, OC] packed (bf16_pack's bits) from the
     * same pass (a layer's BF16 save of the residual stream) */
    void (*add_bias)(fp8t_backend *b, float *out, uint16_t *out16, const float *a, const float *y,
                     const float *bias, int N, int OC);
    /* out += x */
    void (*accumulate)(fp8t_backend *b, float *out, const float *x, size_t n);
    /* out *= s */
    void (*scale)(fp8t_backend *b, float *out, float s, size_t n);
    /* *out += sum(x^2) in FP32 per block / double on CPU; device pointer */
    void (*sumsq)(fp8t_backend *b, float *out, const float *x, size_t n);
    /* *out += sum(x) (deterministic) */
    void (*sum)(fp8t_backend *b, float *out, const float *x, size_t n);
    /* AdamW on n params: g = grad * grad_scale (clipping/accumulation factor);
     * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mhat = m/(1-b1^t); vhat = v/(1-b2^t);
     * p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p). t is the 1-based step. */
    void (*adamw)(fp8t_backend *b, float *params, float *m, float *v, const float *grads,
                  size_t n, float lr, float beta1, float beta2, float eps, float wd, int t,
                  float grad_scale);

    /* ---- collectives over the data-parallel world (fp8train/dist.h) ----
     * Every rank calls them in the same order, in place on device memory, on the backend's
     * stream (MPI on the CPU backend, NCCL on the CUDA backend). In a world of one they leave
     * the data as it is (but for allreduce's BF16 rounding). The model never calls them: the
     * trainer does (src/train/dist_train.c). */
    /* join the world once (NCCL: a communicator from a unique id that rank 0 broadcasts over
     * MPI); 0 ok, -1 with err */
    int (*comm_init)(fp8t_backend *b, char *err, size_t errlen);
    /* x[n] = sum or max over ranks (max propagates NaN). bf16 (sum only): the values are
     * rounded to BF16 and summed in BF16 (half the traffic; each addition rounded to BF16),
     * then widened back to FP32 */
    void (*allreduce)(fp8t_backend *b, float *x, size_t n, fp8t_reduce_op op, int bf16);
    /* x[sum(counts)]: rank r's range (offset = sum of counts[0..r)) gets the sum over ranks of
     * that range; the rest of x is undefined afterwards */
    void (*reduce_scatter)(fp8t_backend *b, float *x, const size_t *counts);
    /* every rank gets every rank's range of x (ranges as reduce_scatter's) */
    void (*all_gather)(fp8t_backend *b, float *x, const size_t *counts);
    /* bytes of x from rank root to every rank */
    void (*broadcast)(fp8t_backend *b, void *x, size_t bytes, int root);
    /* ---- statistics (--inspect) ----
     * *out (device memory, one fp8t_stats_raw) = the statistics of x [rows, cols] and of the
     * FP8 images req asks for (stats.h), every reduction in a fixed order (the same bits run
     * to run). req is host memory, read before the op returns; its SCALE images' scale and
     * its block_list are device pointers. Asynchronous: to_host the struct to read it. The
     * CPU op is fp8t_stats_raw_compute, the reference. */
    void (*tensor_stats)(fp8t_backend *b, fp8t_stats_raw *out, const float *x, int rows, int cols,
                         const fp8t_stats_req *req);
    /* Pinned (page-locked) host memory for to_host_async (the CPU: plain malloc). host_alloc
     * aborts with a message on OOM; host_free may wait for the device. */
    void *(*host_alloc)(fp8t_backend *b, size_t bytes);
    void (*host_free)(fp8t_backend *b, void *p);
    /* dst_host (from host_alloc) = src, queued on the stream without waiting: the bytes are
     * there once a later to_host or synchronize has returned (the CPU copies at once). */
    void (*to_host_async)(fp8t_backend *b, void *dst_host, const void *src, size_t bytes);

    /* ---- the gradient reduction overlapped with the backward (dist_train.c's buckets) ----
     * reduce_start: the sum over ranks of x[n], in place, started after every op queued so far
     * and running alongside the ops queued after it: an all-reduce (counts NULL; bf16 as
     * allreduce's), or with counts[size] a reduce-scatter of x's ranges as reduce_scatter's.
     * x must not be read or written until reduce_wait. The same elementwise sums as allreduce /
     * reduce_scatter on the same x (the bits do not depend on how x is cut into buckets).
     * reduce_wait: every started reduction finished; ops queued afterwards see the results (the
     * host may wait here: it is where a backend watches for a dead peer). Either may be NULL
     * (a backend without them: the trainer reduces after the backward). */
    void (*reduce_start)(fp8t_backend *b, float *x, size_t n, const size_t *counts, int bf16);
    void (*reduce_wait)(fp8t_backend *b);
    /* ---- inference: the KV cache (src/model/infer*.c) ----
     * A layer's cache is kc, vc [B, NKV] blocks of fp8t_kv_head_bytes(kv, Tmax, HS) bytes each
     * (sequence b's blocks start at b * NKV * that: a cache of the sequences b0.. is the same
     * pointer moved on), K after RoPE. A block holds positions [Tmax, HS] as FP32 (kv =
     * FP8T_KV_FP32), BF16 (raw bits, round to nearest even) or E4M3 codes (FP8T_KV_FP8) followed
     * by one FP32 scale_inv per position (fp8t_kv_head_bytes says where): each position's
     * HS values are quantized with the current-scaling scale of their own amax
     * (fp8t_current_scale, E4M3 max, epsilon 0), the value being code * scale_inv. Attention
     * reads K and V back from the cache, so a BF16 or FP8 cache rounds them as it stores them. */
    /* the prefill's K and V: token t of sequence b (qkv [B, s->T, QKV] as attention_forward's)
     * goes to position t of b's cache, K rotated by RoPE at t when s->rope_theta > 0;
     * positions >= s->T are left alone. s->T <= Tmax. */
    void (*kv_cache_write)(fp8t_backend *b, void *kc, void *vc, int kv, const float *qkv,
                           const fp8t_attn_shape *s, int Tmax);
    /* One decode step: qkv [B, QKV] holds one new token per sequence, at position pos[b]
     * (device int [B], 0 <= pos[b] < Tmax; each sequence at its own). Its K (RoPE at pos[b])
     * and V are written to position pos[b] of the cache, then out[B, NH*HS] = the causal
     * attention of its q (RoPE at pos[b]) over the cache positions 0..pos[b] — the row
     * attention_forward would give that token, scale 1/sqrt(HS). s->T is ignored. Reads no
     * host memory and never waits (a decode step can be captured in a graph). */
    void (*attention_decode)(fp8t_backend *b, float *out, void *kc, void *vc, int kv,
                             const float *qkv, const int *pos, const fp8t_attn_shape *s,
                             int Tmax);
    /* embedding_forward from a BF16 table: out[N,C] = bf16 wte[tok] (widened) + (wpe ? wpe[t]
     * : 0), t = pos ? pos[i] : i % T (pos: device int [N], each row's own position, as a
     * decode step's sequences); wte rows are ld >= C elements apart (a BF16 operand's padded
     * rows: the inference model's table doubles as its tied head's operand) */
    void (*embedding_forward_bf16)(fp8t_backend *b, float *out, const int *tokens,
                                   const uint16_t *wte, int ld, const float *wpe, const int *pos,
                                   int B, int T, int C);
    /* ---- block- and row-scaled FP8 (the block and rowwise precisions) ---- */
    /* embedding_forward_bf16 from an E4M3 table: out[i, c] = decode(codes[tok_i * ld + c]) *
     * *scale_inv + (wpe ? wpe[t_i * C + c] : 0), t_i as embedding_forward_bf16's (the FP8
     * table doubles as a tied FP8 head's weight) */
    void (*embedding_forward_fp8)(fp8t_backend *b, float *out, const int *tokens,
                                  const uint8_t *codes, int ld, const float *scale_inv,
                                  const float *wpe, const int *pos, int B, int T, int C);
    /* ---- graphs: the ops of a step recorded once and replayed (a decode step) ----
     * graph_begin: the ops queued from here on are recorded instead of run, until graph_end,
     * which returns the recording (NULL when recording failed: then nothing ran either) to
     * replay with graph_launch (queued like one op: the recorded ops on the same device
     * pointers, reading those buffers' contents at replay time) and free with graph_destroy.
     * Between begin and end no op may wait for the device, allocate, grow a scratch buffer or
     * copy from or to the host (run the ops once before recording them, so every scratch
     * buffer they use has its size). graph_launch returns 0, or -1 without replaying when the
     * recording is stale: a scratch buffer it uses was reallocated since (by other ops that
     * needed more); then record again. graph_begin returns -1 where the backend cannot record
     * (then run the ops directly); the CPU backend has all four NULL. */
    int (*graph_begin)(fp8t_backend *b);
    void *(*graph_end)(fp8t_backend *b);
    int (*graph_launch)(fp8t_backend *b, void *graph);
    void (*graph_destroy)(fp8t_backend *b, void *graph);
    /* A hint, queued like an op: start bringing bytes [p, p + bytes) of device memory into the
     * device's L2 cache and return without waiting for them; it changes no value. A decode
     * step calls it for the next GEMM's weights, which a GEMM of a few rows reads at a fraction
     * of the memory's bandwidth. NULL where the backend has no such cache to fill (the CPU). */
    void (*prefetch_l2)(fp8t_backend *b, const void *p, size_t bytes);
} fp8t_backend_ops;

/* r's producer step composed of the unfused ops of the op table o (bias_add, gelu_forward,
 * gelu_backward(_bias), swiglu_forward, swiglu_grad, add_bias, layernorm_forward,
 * rmsnorm_forward, bf16_pack / bf16_unpack) into values [rows, cols] (the elementwise steps
 * may run in place: values == r->x), with its side outputs (the residual sum into r->sum, or
 * into sum_scratch where r keeps none; mean, rstd, the BF16 saves); returns the values (r->x
 * itself for NONE). The reference of make_operand's one-pass kernels: the CPU backend
 * composes every request this way, and the model a request a backend does not fuse. */
const float *fp8t_operand_step_values(const fp8t_backend_ops *o, fp8t_backend *be,
                                      const fp8t_operand_req *r, float *values,
                                      float *sum_scratch);

/* gemm_tn_bf16_out composed of the op table o: gemm_fp8 (A8, B8) or gemm_bf16_rounded (A16,
 * B16) into C32 [M, N] (the caller's scratch), then bf16_pack into C16: the CPU backend's op,
 * and a GPU's where no BF16-output kernel takes the shape. fp8t_gemm_tn_bf16_out_check exits
 * with a message unless exactly one of the two operand pairs is given (the composition checks
 * too). */
void fp8t_gemm_tn_bf16_out_check(const fp8t_fp8_operand *A8, const fp8t_fp8_operand *B8,
                                 const fp8t_bf16_operand *A16, const fp8t_bf16_operand *B16);
void fp8t_gemm_tn_bf16_out_composed(const fp8t_backend_ops *o, fp8t_backend *be, float *C32,
                                    uint16_t *C16, const fp8t_fp8_operand *A8,
                                    const fp8t_fp8_operand *B8, const fp8t_bf16_operand *A16,
                                    const fp8t_bf16_operand *B16, int M, int N, int K,
                                    int fast_accum);

/* Every op of fp8t_backend_ops by name, in the struct's order (src/backend/backend.c checks at
 * compile time that the list and the struct agree field for field): what must cover every op
 * (the profile backend's wrapper, the check that a backend left none unset) is generated from
 * it. A new op goes into the struct and here. */
/* clang-format off */
#define FP8T_BACKEND_OPS(X) X(malloc) X(free) X(to_device) X(to_host) X(copy) X(zero)            \
    X(synchronize) X(destroy) X(gemm_f32) X(gemm_bf16) X(gemm_bf16_rounded) X(gemm_fp8)          \
    X(gemm_tn_bf16_out) X(amax) X(make_operand) X(make_operand_fuses) X(compute_scale)           \
    X(fake_quantize) X(block_fake_quantize) X(mxfp8_fake_quantize) X(bf16_round) X(bf16_pack)    \
    X(bf16_unpack) X(delayed_update) X(embedding_forward) X(embedding_backward)                  \
    X(layernorm_forward) X(layernorm_backward) X(rmsnorm_forward) X(rmsnorm_backward)            \
    X(bias_add) X(bias_backward) X(gelu_forward) X(gelu_backward) X(gelu_backward_bias)          \
    X(swiglu_forward) X(swiglu_backward) X(swiglu_grad) X(attention_forward)                     \
    X(attention_backward) X(attention_saved_bytes) X(softmax_xent) X(softmax_xent_bf16) X(add)   \
    X(add_bias) X(accumulate) X(scale) X(sumsq) X(sum) X(adamw) X(comm_init) X(allreduce)        \
    X(reduce_scatter) X(all_gather) X(broadcast) X(tensor_stats) X(host_alloc) X(host_free)      \
    X(to_host_async) X(reduce_start) X(reduce_wait) X(kv_cache_write) X(attention_decode)        \
    X(embedding_forward_bf16) X(embedding_forward_fp8) X(graph_begin) X(graph_end)               \
    X(graph_launch) X(graph_destroy) X(prefetch_l2)
/* clang-format on */
/* The name of op i of fp8t_backend_ops (0-based, the struct's order), NULL past the last;
 * the number of ops. */
const char *fp8t_backend_op_name(int i);
int fp8t_backend_op_count(void);
/* Op i of ops as a generic function pointer (NULL when unset); whether op i may be unset (the
 * four graph ops, which a backend that cannot record leaves NULL, and prefetch_l2) */
typedef void (*fp8t_backend_op_fn)(void);
fp8t_backend_op_fn fp8t_backend_op(const fp8t_backend_ops *ops, int i);
int fp8t_backend_op_optional(int i);
/* The index of the first op of ops that is NULL but must be set, or -1 when none is. */
int fp8t_backend_first_unset_op(const fp8t_backend_ops *ops);

struct fp8t_backend {
    const fp8t_backend_ops *ops;
    const char *name;        /* "cpu", "cuda" */
    int fp8_wants_transpose; /* gemm_fp8 needs data_t for K-major access (Hopper TN) */
    int fp8_block_native;    /* gemm_fp8 runs block-scaled operands on hardware (Hopper's
                                 cuBLASLt); 0: the model keeps the block emulation */
    void *impl;              /* backend-private state */
};

/* The attention kernels a backend runs (the CPU backend has one). A new implementation is one
 * more value here and its name in backend.c's table. */
typedef enum {
    FP8T_ATTN_DEFAULT = 0, /* the backend's choice (CUDA: flash; cuDNN at head size 128) */
    FP8T_ATTN_FLASH,       /* BF16 tensor-core flash attention (head sizes 32, 64, 128) */
    FP8T_ATTN_GEMM,        /* cuBLASLt batched GEMMs around a softmax kernel */
    FP8T_ATTN_TILED,       /* FP32 tiled kernels: the CPU backend's arithmetic */
    FP8T_ATTN_SIMPLE,      /* the plain FP32 kernel */
    FP8T_ATTN_CUDNN, /* cuDNN's fused attention at head sizes 32, 64, 128 (flash fallback) */
    FP8T_ATTN_IMPL_COUNT
} fp8t_attn_impl;

/* "default", "flash", "gemm", "tiled", "simple"; NULL when out of range */
const char *fp8t_attn_impl_name(fp8t_attn_impl a);
/* 0 and *out set, or -1 for a name that is none of them */
int fp8t_attn_impl_parse(fp8t_attn_impl *out, const char *name);
/* "flash, gemm, tiled, simple": the choices, for messages and help */
const char *fp8t_attn_impl_names(void);

/* Given at creation; a zeroed struct (or NULL) is the default. The CPU backend has no fused
 * paths of its own and ignores every field. */
typedef struct {
    fp8t_attn_impl attn; /* attention kernels */
    int plain;           /* every fused or cached path off (simple attention, separate
                            cast/transpose/amax kernels, no GEMM algorithm cache, BF16 GEMMs at
                            their true sizes, the bias in its own pass) */
    int sync_each_op;    /* synchronize and check after every op (names the op that failed) */
    int no_lt_fp8;       /* FP8 GEMMs by an exact decode + FP32 GEMM, not cuBLASLt's FP8 */
} fp8t_backend_options;

/* Create a backend by name ("cpu" or "cuda") with options opt (NULL = defaults). On failure
 * returns NULL and writes a message naming the cause and the fix into err. */
fp8t_backend *fp8t_backend_create(const char *name, const fp8t_backend_options *opt, char *err,
                                  size_t errlen);
void fp8t_backend_destroy(fp8t_backend *b);

/* Implementations (the CUDA one exists only in builds with nvcc); opt is never NULL here. */
fp8t_backend *fp8t_cpu_backend_create(const fp8t_backend_options *opt, char *err, size_t errlen);
fp8t_backend *fp8t_cuda_backend_create(const fp8t_backend_options *opt, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
