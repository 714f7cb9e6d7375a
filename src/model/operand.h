/* The model's side of make_operand (backend.h): the requests both models (the trainer's
 * linear.c, the inference model's infer_forward.c) send, and the composition they run where a
 * backend has no one-pass kernel for a producer step. */
#ifndef FP8TRAIN_MODEL_OPERAND_H
#define FP8TRAIN_MODEL_OPERAND_H

#include "fp8train/backend.h"

/* The request for the operand of x [rows, cols] itself (step NONE) into data: per-tensor FP8
 * codes made with *scale (format E4M3 / E5M2; scale a device pointer), or a BF16 operand
 * (format BF16, scale NULL). No transposed copy, amax or column sums: the caller sets them. */
fp8t_operand_req model_operand_req(void *data, const float *x, int rows, int cols,
                                   fp8t_operand_format format, const float *scale);

/* The operand r asks for, composed: the step's values into values (fp8t_operand_step_values,
 * the residual sum into r->sum), then
 * make_operand of those with step NONE (r is rewritten to that request), its column sums and
 * amax taken there: the bits of the one-pass kernel of r where there is one. */
void model_compose_operand(const fp8t_backend_ops *o, fp8t_backend *be, fp8t_operand_req *r,
                           float *values);

/* make_operand of r where the backend makes it in one pass (make_operand_fuses), else
 * model_compose_operand: the same bits either way. */
void model_make_operand(const fp8t_backend_ops *o, fp8t_backend *be, fp8t_operand_req *r,
                        float *values);

#endif
