/* Which of a backend's one-pass kernels makes an operand request (make_operand), shared by the
 * CPU and CUDA backends so that both fuse the same combinations and the model takes the same
 * path on either: the CPU's reference of each kernel is the unfused ops' composition, bit for
 * bit, so a choice that depended on the backend would only make the two harder to compare.
 * Internal to src/backend (C and CUDA). */
#ifndef FP8TRAIN_OPERAND_KIND_H
#define FP8TRAIN_OPERAND_KIND_H

#include "fp8train/backend.h"

/* What a backend's scaled kernel (FP8T_OPK_SCALED) makes of one tensor x [rows, cols]: the
 * scaled FP8 operands of both orientations that GEMMs read it in, from one read of x. codes is
 * x's own layout (the operand whose K is x's cols: the Fprop's X and W, the Dgrad's dY),
 * codes_t its transpose (K = x's rows: the Wgrad's dYᵀ and Xᵀ, the Dgrad's Wᵀ). The values
 * quantized are x itself, or gelu(x (+ bias)) (gelu: the Fprop of the linear after GELU, step
 * GELU), or gelu'(gelu_x (+ bias)) * x (gelu_x: the Dgrad's dY of that linear, step DGELU), or
 * silu(x) * up (swiglu: the Fprop of Llama's down, step SWIGLU), or one of SwiGLU's gradients
 * with x the gradient of its output (dswiglu: the Dgrad's dY of gate or up, steps DSWIGLU_*).
 * Each orientation's codes and scale_inv are those of block quantizing the values (transposed
 * for codes_t) with the current-scaling scale of each block's own amax (fp8t_current_scale,
 * epsilon 0), fp8t_block_quantize_pow2's bit for bit; the amax as the amax op's, the column
 * sums as bias_backward's (a GPU: in a fixed order). */
typedef struct {
    uint8_t *codes;           /* [rows, cols] K-major along cols, or NULL (not wanted) */
    float *scale_inv;         /* codes' scale_inv, scaling's layout for [rows, cols] */
    uint8_t *codes_t;         /* [cols, rows] K-major along x's rows, or NULL */
    float *scale_inv_t;       /* codes_t's scale_inv, scaling's layout for [cols, rows] */
    float *amax_out;          /* may be NULL: max-accumulated with the values' amax (NaN wins) */
    float *colsum;            /* may be NULL: += the values' column sums (bias_backward's) */
    const float *x;           /* [rows, cols] */
    int gelu;                 /* the values are gelu(x (+ bias)) */
    uint16_t *gelu_save16;    /* with gelu (or NULL): bf16_pack(x, bias) written here too */
    const float *gelu_x;      /* or (NULL: neither) the values are gelu'(gelu_x (+ bias)) * x */
    const uint16_t *gelu_x16; /* or gelu_x as a BF16 copy [rows, cols] (gelu_x NULL, no bias) */
    const float *bias;        /* [cols], with gelu or gelu_x; may be NULL */
    int swiglu;               /* the values are silu(x) * up (x the gate) */
    uint16_t *swiglu_save16[2]; /* with swiglu (or NULL): x's / up's BF16 copy written too */
    int dswiglu;                /* 0, or the step (DSWIGLU_GATE / _UP) whose gradient the values
                                 are, x the gradient of SwiGLU's output */
    const float *gate;          /* dswiglu: the gate (or NULL: gate16) */
    const uint16_t *gate16;
    const float *up; /* swiglu, DSWIGLU_GATE: up (or NULL for the gradient: up16) */
    const uint16_t *up16;
    int rows, cols;
    fp8t_fp8_scaling scaling; /* VEC128, BLK128 or ROW */
    fp8_format fmt;
    int pow2; /* power-of-two scales (fp8t_current_scale's pow2) */
} fp8t_scaled_quant;

typedef enum {
    FP8T_OPK_COMPOSE = -1,       /* no one-pass kernel: the CPU composes, CUDA refuses */
    FP8T_OPK_QUANTIZE = 0,       /* per-tensor FP8 of x (codes, codes_t, amax) */
    FP8T_OPK_QUANTIZE_COLSUM,    /* ... and the column sums */
    FP8T_OPK_QUANTIZE_GELU,      /* per-tensor FP8 of gelu(x (+ bias)) */
    FP8T_OPK_QUANTIZE_DGELU,     /* per-tensor FP8 of gelu'(x2 (+ bias)) * x, colsum optional */
    FP8T_OPK_BF16,               /* BF16 operand of x */
    FP8T_OPK_BF16_COLSUM,        /* ... and the column sums */
    FP8T_OPK_BF16_GELU,          /* BF16 operand of gelu(x) */
    FP8T_OPK_BF16_DGELU,         /* BF16 operand of gelu'(x2 (+ bias)) * x, colsum optional */
    FP8T_OPK_BF16_LAYERNORM,     /* BF16 operand of LayerNorm(x), mean and rstd kept */
    FP8T_OPK_BF16_ADD_LAYERNORM, /* sum = x + x2, then the above */
    FP8T_OPK_BF16_RMSNORM,       /* BF16 operand of RMSNorm(x), rstd kept */
    FP8T_OPK_BF16_ADD_RMSNORM,   /* sum = x + x2, then the above */
    FP8T_OPK_NORM_OPERAND,       /* (residual add +) LayerNorm / RMSNorm into per-tensor FP8 or
                                  BF16, no amax, no statistics kept (the inference model's) */
    FP8T_OPK_SWIGLU_OPERAND,     /* SwiGLU into per-tensor FP8 or BF16 (FP32 gate and up: no
                                  amax; BF16 ones: amax optional, or the amax alone) */
    FP8T_OPK_GELU16_OPERAND,     /* GELU of BF16 x (+ bias) into per-tensor FP8 or BF16, amax
                                  optional, or the amax alone */
    FP8T_OPK_QUANTIZE_SWIGLU,    /* per-tensor FP8 of SwiGLU (with the saves) or one of its
                                  gradients (from FP32 or the saves): codes, codes_t optional,
                                  amax */
    FP8T_OPK_BF16_SWIGLU,        /* BF16 operand of the same, amax */
    FP8T_OPK_SCALED,             /* block / row scaled FP8 of x, gelu(x (+ bias)),
                                  gelu'(x2 (+ bias)) * x, SwiGLU or one of its gradients, both
                                  orientations, amax, colsum */
    FP8T_OPK_COUNT
} fp8t_operand_kernel;

static inline int fp8t_step_is_norm(fp8t_operand_step s) {
    return s == FP8T_STEP_LAYERNORM || s == FP8T_STEP_RMSNORM || s == FP8T_STEP_ADD_LAYERNORM ||
           s == FP8T_STEP_ADD_RMSNORM;
}

static inline fp8t_operand_kernel fp8t_operand_kernel_of(const fp8t_operand_req *r) {
    const fp8t_operand *o = &r->out;
    const fp8t_operand_step st = r->step;
    const int bf16 = o->format == FP8T_OPERAND_BF16;
    const int norm = fp8t_step_is_norm(st);
    const int add = st == FP8T_STEP_ADD_LAYERNORM || st == FP8T_STEP_ADD_RMSNORM;
    const int rms = st == FP8T_STEP_RMSNORM || st == FP8T_STEP_ADD_RMSNORM;
    /* side outputs only where their step makes them */
    if (((r->sum || r->sum16) && !add) || ((r->mean || r->rstd) && !norm))
        return FP8T_OPK_COMPOSE;
    if (bf16 && o->data_t) return FP8T_OPK_COMPOSE; /* BF16 has one layout for both */
    /* the FP32 values too: the per-tensor FP8 GELU passes alone write them */
    if (r->values && (bf16 || o->scaling != FP8T_SCALING_TENSOR ||
                      (st != FP8T_STEP_GELU && st != FP8T_STEP_DGELU)))
        return FP8T_OPK_COMPOSE;
    const int dswiglu = st == FP8T_STEP_DSWIGLU_GATE || st == FP8T_STEP_DSWIGLU_UP;
    /* SwiGLU of BF16 gate and up, GELU of BF16 x (an inference model's GEMM outputs): the
     * inference model's kernels alone */
    const int swiglu16 = st == FP8T_STEP_SWIGLU && r->x_16;
    const int gelu16 = st == FP8T_STEP_GELU && r->x_16;
    if (r->x_16 && ((!swiglu16 && !gelu16) || (r->x2_16 != NULL) == gelu16 || r->x || r->x2 ||
                    r->save16 || r->save16_2 || r->values))
        return FP8T_OPK_COMPOSE;
    /* the BF16 copies of the activations' inputs: written by a GELU / SwiGLU pass, read by a
     * dGELU / dSwiGLU pass (alone) */
    if ((r->save16 && st != FP8T_STEP_GELU && st != FP8T_STEP_SWIGLU) ||
        (r->save16_2 && st != FP8T_STEP_SWIGLU) ||
        (r->x2_16 && ((st != FP8T_STEP_DGELU && !dswiglu && !swiglu16) || r->x2 || r->bias)) ||
        ((r->x3 || r->x3_16) && st != FP8T_STEP_DSWIGLU_GATE) || (r->x3 && r->x3_16))
        return FP8T_OPK_COMPOSE;
    if (swiglu16 || gelu16) { /* one layout, per tensor; no data: the amax alone (current
                                 scaling's first pass) */
        const fp8t_operand_kernel k =
            swiglu16 ? FP8T_OPK_SWIGLU_OPERAND : FP8T_OPK_GELU16_OPERAND;
        if (o->data_t || r->colsum || (swiglu16 && r->bias) ||
            (!bf16 && o->scaling != FP8T_SCALING_TENSOR))
            return FP8T_OPK_COMPOSE;
        if (!o->data) return !bf16 && o->amax ? k : FP8T_OPK_COMPOSE;
        return bf16 || o->scale ? k : FP8T_OPK_COMPOSE;
    }
    if (!bf16 && o->scaling != FP8T_SCALING_TENSOR) {
        if (st == FP8T_STEP_NONE && !r->bias) return FP8T_OPK_SCALED;
        if (st == FP8T_STEP_GELU || st == FP8T_STEP_DGELU) return FP8T_OPK_SCALED;
        /* SwiGLU's steps take no bias and give no column sums (Llama's MLP has neither) */
        if ((st == FP8T_STEP_SWIGLU || dswiglu) && !r->bias && !r->colsum) return FP8T_OPK_SCALED;
        return FP8T_OPK_COMPOSE;
    }
    /* only the transposed codes: the plain quantize kernel alone takes that */
    const int codes_t_only = !bf16 && !o->data && o->data_t;
    if (codes_t_only && (st != FP8T_STEP_NONE || r->colsum || r->bias)) return FP8T_OPK_COMPOSE;
    if (!bf16 && (!o->scale || (!o->data && !codes_t_only))) return FP8T_OPK_COMPOSE;
    if (bf16 && !o->data) return FP8T_OPK_COMPOSE;
    /* the inference model's producers: no amax (a fixed scale), no statistics, one layout */
    const int infer_ok = !o->data_t && !o->amax && !r->colsum;
    if (norm && (rms ? !r->norm_b : 1) && !r->mean && !r->rstd && infer_ok && (add || !r->bias) &&
        !r->sum16)
        return FP8T_OPK_NORM_OPERAND;
    /* SwiGLU's steps take no bias and give no column sums (Llama's MLP has neither); the
     * inference model's SwiGLU (no amax, no saves, one layout) has a kernel of its own */
    if (st == FP8T_STEP_SWIGLU || dswiglu) {
        if (r->bias || r->colsum) return FP8T_OPK_COMPOSE;
        if (st == FP8T_STEP_SWIGLU && infer_ok && !r->save16 && !r->save16_2)
            return FP8T_OPK_SWIGLU_OPERAND;
        return bf16 ? FP8T_OPK_BF16_SWIGLU : FP8T_OPK_QUANTIZE_SWIGLU;
    }
    switch (st) {
    case FP8T_STEP_NONE:
        if (r->bias) return FP8T_OPK_COMPOSE;
        if (bf16) return r->colsum ? FP8T_OPK_BF16_COLSUM : FP8T_OPK_BF16;
        return r->colsum ? FP8T_OPK_QUANTIZE_COLSUM : FP8T_OPK_QUANTIZE;
    case FP8T_STEP_GELU:
        if (r->colsum || (bf16 && r->bias)) return FP8T_OPK_COMPOSE;
        return bf16 ? FP8T_OPK_BF16_GELU : FP8T_OPK_QUANTIZE_GELU;
    case FP8T_STEP_DGELU: return bf16 ? FP8T_OPK_BF16_DGELU : FP8T_OPK_QUANTIZE_DGELU;
    case FP8T_STEP_LAYERNORM:
        if (bf16 && r->mean && r->rstd && !r->colsum && !r->bias) return FP8T_OPK_BF16_LAYERNORM;
        return FP8T_OPK_COMPOSE;
    case FP8T_STEP_ADD_LAYERNORM:
        if (bf16 && r->mean && r->rstd && r->sum && r->x2 && !r->bias && !r->colsum)
            return FP8T_OPK_BF16_ADD_LAYERNORM;
        return FP8T_OPK_COMPOSE;
    case FP8T_STEP_RMSNORM:
        if (bf16 && r->rstd && !r->mean && !r->norm_b && !r->colsum && !r->bias)
            return FP8T_OPK_BF16_RMSNORM;
        return FP8T_OPK_COMPOSE;
    case FP8T_STEP_ADD_RMSNORM:
        if (bf16 && r->rstd && !r->mean && !r->norm_b && r->sum && r->x2 && !r->bias &&
            !r->colsum)
            return FP8T_OPK_BF16_ADD_RMSNORM;
        return FP8T_OPK_COMPOSE;
    default: return FP8T_OPK_COMPOSE;
    }
}

/* A backend's one-pass kernels, one per fp8t_operand_kernel (each backend's internal
 * functions). fp8t_operand_run dispatches a request to them, so the mapping from a request to
 * a kernel's arguments is written once for every backend. */
typedef struct {
    void (*quantize)(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                     const float *x, int rows, int cols, fp8_format fmt, const float *scale);
    void (*quantize_colsum)(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                            float *colsum, const float *x, int rows, int cols, fp8_format fmt,
                            const float *scale);
    /* save16 / x16: the request's save16 / x2_16 (x NULL when x16 is given); values: the
     * request's (may be NULL) */
    void (*quantize_gelu)(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                          uint16_t *save16, const float *x, const float *bias, int rows, int cols,
                          fp8_format fmt, const float *scale, float *values);
    void (*quantize_dgelu)(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                           float *colsum, const float *dout, const float *x, const uint16_t *x16,
                           const float *bias, int rows, int cols, fp8_format fmt,
                           const float *scale, float *values);
    void (*bf16)(fp8t_backend *b, uint16_t *out, float *amax_out, const float *x, int rows,
                 int cols);
    void (*bf16_colsum)(fp8t_backend *b, uint16_t *out, float *amax_out, float *colsum,
                        const float *x, int rows, int cols);
    void (*bf16_gelu)(fp8t_backend *b, uint16_t *out, float *amax_out, uint16_t *save16,
                      const float *x, int rows, int cols);
    void (*bf16_dgelu)(fp8t_backend *b, uint16_t *out, float *amax_out, float *colsum,
                       const float *dout, const float *x, const uint16_t *x16, const float *bias,
                       int rows, int cols);
    void (*bf16_layernorm)(fp8t_backend *b, uint16_t *out, float *amax_out, float *mean,
                           float *rstd, const float *x, const float *w, const float *bias, int N,
                           int C, float eps);
    void (*bf16_rmsnorm)(fp8t_backend *b, uint16_t *out, float *amax_out, float *rstd,
                         const float *x, const float *w, int N, int C, float eps);
    void (*bf16_add_rmsnorm)(fp8t_backend *b, float *sum, uint16_t *sum16, uint16_t *out,
                             float *amax_out, float *rstd, const float *a, const float *c,
                             const float *w, int N, int C, float eps);
    void (*bf16_add_layernorm)(fp8t_backend *b, float *sum, uint16_t *sum16, uint16_t *out,
                               float *amax_out, float *mean, float *rstd, const float *a,
                               const float *c, const float *w, const float *bias, int N, int C,
                               float eps);
    void (*norm_operand)(fp8t_backend *b, void *out, float *sum, const float *a, const float *y,
                         const float *ybias, const float *w, const float *bias, int rms, int rows,
                         int cols, float eps, const float *scale, fp8_format fmt);
    /* gate16 / up16: the request's x_16 / x2_16 (gate and up NULL then); out NULL: the amax
     * alone */
    void (*swiglu_operand)(fp8t_backend *b, void *out, const float *gate, const float *up,
                           const uint16_t *gate16, const uint16_t *up16, int rows, int cols,
                           const float *scale, fp8_format fmt, float *amax_out);
    /* x16: the request's x_16, bias its bias (may be NULL); out NULL: the amax alone */
    void (*gelu16_operand)(fp8t_backend *b, void *out, const uint16_t *x16, const float *bias,
                           int rows, int cols, const float *scale, fp8_format fmt,
                           float *amax_out);
    /* QUANTIZE_SWIGLU and BF16_SWIGLU: the request itself (its step, out, x, x2 / x2_16,
     * x3 / x3_16, save16 / save16_2 say everything; backend.h) */
    void (*swiglu_step)(fp8t_backend *b, const fp8t_operand_req *r);
    /* SCALED: the request itself, its step included (a backend's one-pass kernel takes it as
     * fp8t_operand_scaled_quant describes it; the CPU's is the composition) */
    void (*scaled)(fp8t_backend *b, const fp8t_operand_req *r);
} fp8t_operand_kernels;

#ifdef __cplusplus
extern "C" {
#endif
/* The scaled kernel's request for r's scaled operand of the values x; with step_done the step
 * (GELU / dGELU / SwiGLU / dSwiGLU) is taken as already applied to x */
fp8t_scaled_quant fp8t_operand_scaled_quant(const fp8t_operand_req *r, const float *x,
                                            int step_done);
/* r run by the kernel fp8t_operand_kernel_of names; 0 when it names none (FP8T_OPK_COMPOSE:
 * nothing was done) */
int fp8t_operand_run(fp8t_backend *b, const fp8t_operand_req *r, const fp8t_operand_kernels *k);
/* "quantize", "bf16_gelu", ...: kernel k's name for reports ("composed" for FP8T_OPK_COMPOSE) */
const char *fp8t_operand_kernel_name(fp8t_operand_kernel k);
#ifdef __cplusplus
}
#endif

#endif
