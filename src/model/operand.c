/* The model's side of make_operand: the plain request, and the composition of a producer step
 * by its own ops (fp8t_operand_step_values) where the backend has no one-pass kernel
 * (model/operand.h). */
#include "model/operand.h"

#include <string.h>

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

void model_compose_operand(const fp8t_backend_ops *o, fp8t_backend *be, fp8t_operand_req *r,
                           float *values) {
    /* the model's requests keep their residual sum (r->sum) */
    const float *v = fp8t_operand_step_values(o, be, r, values, NULL);
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
