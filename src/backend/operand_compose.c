/* make_operand's producer steps composed of a backend's unfused ops (backend.h,
 * fp8t_operand_step_values): the one composition the CPU backend runs for every request and
 * the model for a request a backend does not fuse, so that both are the same by construction.
 * Likewise gemm_tn_bf16_out's (the FP32 GEMM, then the rounding), which the CPU runs and a GPU
 * falls back to. */
#include <stddef.h>

#include "fp8train/backend.h"
#include "util/check.h"

/* x (+ bias) into v (which may be x) */
static void bias_values(const fp8t_backend_ops *o, fp8t_backend *be, const fp8t_operand_req *r,
                        float *v) {
    const int rows = r->out.rows, cols = r->out.cols;
    if (v != r->x) o->copy(be, v, r->x, (size_t)rows * (size_t)cols * sizeof(float));
    if (r->bias) o->bias_add(be, v, r->bias, rows, cols);
}

/* the norms, after the residual add: into r->sum, else sum_scratch, when x2 is added */
static void norm_values(const fp8t_backend_ops *o, fp8t_backend *be, const fp8t_operand_req *r,
                        float *v, float *sum_scratch) {
    const int rows = r->out.rows, cols = r->out.cols;
    const int add = r->step == FP8T_STEP_ADD_LAYERNORM || r->step == FP8T_STEP_ADD_RMSNORM;
    const int rms = r->step == FP8T_STEP_RMSNORM || r->step == FP8T_STEP_ADD_RMSNORM;
    const float *s = r->x;
    if (add && r->x2) {
        float *sum = r->sum ? r->sum : sum_scratch;
        FP8T_CHECK(sum != NULL,
                   "make_operand: the residual add of step %d has nowhere to go "
                   "(neither the request's sum nor scratch)",
                   (int)r->step);
        o->add_bias(be, sum, r->sum16, r->x, r->x2, r->bias, rows, cols);
        s = sum;
    } else if (add) { /* the sum is x itself */
        if (r->sum) o->copy(be, r->sum, r->x, (size_t)rows * (size_t)cols * sizeof(float));
        if (r->sum16) o->bf16_pack(be, r->sum16, r->x, NULL, rows, cols);
    }
    if (rms)
        o->rmsnorm_forward(be, v, r->rstd, s, r->norm_w, rows, cols, r->eps);
    else
        o->layernorm_forward(be, v, r->mean, r->rstd, s, r->norm_w, r->norm_b, rows, cols,
                             r->eps);
}

const float *fp8t_operand_step_values(const fp8t_backend_ops *o, fp8t_backend *be,
                                      const fp8t_operand_req *r, float *values,
                                      float *sum_scratch) {
    const int rows = r->out.rows, cols = r->out.cols;
    const size_t n = (size_t)rows * (size_t)cols;
    FP8T_CHECK(!r->x_16,
               "make_operand: SwiGLU or GELU of BF16 inputs has no composition (their kernels "
               "make a per-tensor FP8 or BF16 operand, or the amax alone, without saves: ask "
               "make_operand_fuses first)");
    switch (r->step) {
    case FP8T_STEP_NONE: return r->x;
    case FP8T_STEP_BIAS: bias_values(o, be, r, values); break;
    case FP8T_STEP_GELU:
        if (r->save16) o->bf16_pack(be, r->save16, r->x, r->bias, rows, cols);
        if (r->bias) { /* the bias first (bias_add's sum), then GELU in place */
            bias_values(o, be, r, values);
            o->gelu_forward(be, values, values, n);
        } else {
            o->gelu_forward(be, values, r->x, n);
        }
        break;
    case FP8T_STEP_DGELU:
        if (r->x2_16) { /* GELU's input widened into values, then the backward in place */
            o->bf16_unpack(be, values, r->x2_16, n);
            o->gelu_backward(be, values, values, r->x, n);
        } else if (r->bias) {
            o->gelu_backward_bias(be, values, r->x2, r->bias, r->x, rows, cols);
        } else {
            o->gelu_backward(be, values, r->x2, r->x, n);
        }
        break;
    case FP8T_STEP_SWIGLU:
        o->swiglu_forward(be, values, r->x, r->x2, r->save16, r->save16_2, n);
        break;
    case FP8T_STEP_DSWIGLU_GATE:
    case FP8T_STEP_DSWIGLU_UP:
        o->swiglu_grad(be, values, (int)r->step, r->x, r->x2, r->x2_16, r->x3, r->x3_16, n);
        break;
    default: norm_values(o, be, r, values, sum_scratch); break;
    }
    return values;
}

void fp8t_gemm_tn_bf16_out_check(const fp8t_fp8_operand *A8, const fp8t_fp8_operand *B8,
                                 const fp8t_bf16_operand *A16, const fp8t_bf16_operand *B16) {
    if (!(A8 && B8 && !A16 && !B16) && !(A16 && B16 && !A8 && !B8)) {
        FP8T_FATAL("gemm_tn_bf16_out: give both operands in FP8 (A8, B8) or both in BF16 "
                   "(A16, B16)");
    }
}

void fp8t_gemm_tn_bf16_out_composed(const fp8t_backend_ops *o, fp8t_backend *be, float *C32,
                                    uint16_t *C16, const fp8t_fp8_operand *A8,
                                    const fp8t_fp8_operand *B8, const fp8t_bf16_operand *A16,
                                    const fp8t_bf16_operand *B16, int M, int N, int K,
                                    int fast_accum) {
    fp8t_gemm_tn_bf16_out_check(A8, B8, A16, B16);
    if (A8)
        o->gemm_fp8(be, C32, A8, B8, M, N, K, 0, 1, 0, fast_accum, NULL, NULL);
    else
        o->gemm_bf16_rounded(be, C32, A16, B16, M, N, K, 0, 1, 0, NULL, 0);
    o->bf16_pack(be, C16, C32, NULL, M, N);
}
