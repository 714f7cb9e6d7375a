/* The model's side of make_operand: the plain request, and the composition of a producer step
 * by its own ops where the backend has no one-pass kernel (model/operand.h). */
#include "model/operand.h"

#include <string.h>

#include "util/check.h"

fp8t_operand_req model_operand_req(void *data, const float *x, int rows, int cols,
                                   fp8t_operand_format format, const float *scale) {
    fp8t_operand_req r;
    memset(&r, 0, sizeof(r));
    r.out.data = data;
    r.out.scale = scale;
    r.out.format = format;
    r.out.scaling = FP8T_SCALING_TENSOR;
    r.out.rows = rows;
    r.out.cols = cols;
    r.step = FP8T_STEP_NONE;
    r.x = x;
    return r;
}

/* x (+ bias) into v (which may be x) */
static void bias_values(const fp8t_backend_ops *o, fp8t_backend *be, const fp8t_operand_req *r,
                        float *v) {
    const int rows = r->out.rows, cols = r->out.cols;
    if (v != r->x) o->copy(be, v, r->x, (size_t)rows * (size_t)cols * sizeof(float));
    if (r->bias) o->bias_add(be, v, r->bias, rows, cols);
}

/* the norms, after the residual add into r->sum (non-NULL where x2 is) */
static void norm_values(const fp8t_backend_ops *o, fp8t_backend *be, const fp8t_operand_req *r,
                        float *v) {
    const int rows = r->out.rows, cols = r->out.cols;
    const int add = r->step == FP8T_STEP_ADD_LAYERNORM || r->step == FP8T_STEP_ADD_RMSNORM;
    const int rms = r->step == FP8T_STEP_RMSNORM || r->step == FP8T_STEP_ADD_RMSNORM;
    const float *s = r->x;
    if (add && r->x2) {
        o->add_bias(be, r->sum, r->sum16, r->x, r->x2, r->bias, rows, cols);
        s = r->sum;
    } else if (add && r->sum16) {
        o->bf16_pack(be, r->sum16, r->x, NULL, rows, cols);
    }
    if (rms)
        o->rmsnorm_forward(be, v, r->rstd, s, r->norm_w, rows, cols, r->eps);
    else
        o->layernorm_forward(be, v, r->mean, r->rstd, s, r->norm_w, r->norm_b, rows, cols,
                             r->eps);
}

const float *model_step_values(const fp8t_backend_ops *o, fp8t_backend *be,
                               const fp8t_operand_req *r, float *values) {
    const int rows = r->out.rows, cols = r->out.cols;
    const size_t n = (size_t)rows * (size_t)cols;
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
        /* one of swiglu_backward's two outputs has no op of its own: the plan asks for these
         * steps only where make_operand makes them (linear_dswiglu_fused) */
        FP8T_FATAL("make_operand: no composition of SwiGLU's %s gradient into format %d "
                   "(scaling %d); the model asks for it only on the scaled path",
                   r->step == FP8T_STEP_DSWIGLU_GATE ? "gate" : "up", (int)r->out.format,
                   (int)r->out.scaling);
        break;
    default: norm_values(o, be, r, values); break;
    }
    return values;
}

void model_compose_operand(const fp8t_backend_ops *o, fp8t_backend *be, fp8t_operand_req *r,
                           float *values) {
    const float *v = model_step_values(o, be, r, values);
    const fp8t_operand_req plain = {
        .out = r->out, .step = FP8T_STEP_NONE, .x = v, .colsum = r->colsum};
    *r = plain;
    o->make_operand(be, r);
}

void model_make_operand(const fp8t_backend_ops *o, fp8t_backend *be, fp8t_operand_req *r,
                        float *values) {
    if (r->step != FP8T_STEP_NONE && !o->make_operand_fuses(be, r))
        model_compose_operand(o, be, r, values);
    else
        o->make_operand(be, r);
}
