/* make_operand on the GPU: each combination fp8t_operand_kernel_of names goes to the one-pass
 * kernel that makes it (the same host functions, with the same arguments, that the fused ops
 * of the op table called before make_operand replaced them). A combination with no kernel is
 * refused: make_operand_fuses says 0 for it, and the model then runs the producer's own op into
 * FP32 and makes the operand with step NONE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/operand_kind.h"

void cuda_make_operand(fp8t_backend *b, const fp8t_operand_req *r) {
    const fp8t_operand *o = &r->out;
    const int rows = o->rows, cols = o->cols;
    const int bf16 = o->format == FP8T_OPERAND_BF16;
    const fp8_format fmt = bf16 ? FP8_E4M3 : (fp8_format)o->format;
    uint8_t *c = (uint8_t *)o->data, *ct = (uint8_t *)o->data_t;
    uint16_t *h = (uint16_t *)o->data;
    const fp8t_operand_kernel k = fp8t_operand_kernel_of(r);
    switch (k) {
    case FP8T_OPK_QUANTIZE:
        cuda_quantize(b, c, ct, o->amax, r->x, rows, cols, fmt, o->scale);
        return;
    case FP8T_OPK_QUANTIZE_COLSUM:
        cuda_quantize_colsum(b, c, ct, o->amax, r->colsum, r->x, rows, cols, fmt, o->scale);
        return;
    case FP8T_OPK_QUANTIZE_GELU:
        cuda_quantize_gelu(b, c, ct, o->amax, r->x, r->bias, rows, cols, fmt, o->scale);
        return;
    case FP8T_OPK_QUANTIZE_DGELU:
        cuda_gelu_backward_quantize_colsum(b, c, ct, o->amax, r->colsum, r->x, r->x2, r->bias,
                                           rows, cols, fmt, o->scale);
        return;
    case FP8T_OPK_BF16:
        cuda_to_bf16_operand(b, h, o->amax, r->x, rows, cols);
        return;
    case FP8T_OPK_BF16_COLSUM:
        cuda_to_bf16_colsum(b, h, o->amax, r->colsum, r->x, rows, cols);
        return;
    case FP8T_OPK_BF16_GELU:
        cuda_gelu_forward_bf16(b, h, o->amax, r->x, rows, cols);
        return;
    case FP8T_OPK_BF16_DGELU:
        cuda_gelu_backward_bf16_colsum(b, h, o->amax, r->colsum, r->x, r->x2, r->bias, rows,
                                       cols);
        return;
    case FP8T_OPK_BF16_LAYERNORM:
        cuda_layernorm_forward_bf16(b, h, o->amax, r->mean, r->rstd, r->x, r->norm_w, r->norm_b,
                                    rows, cols, r->eps);
        return;
    case FP8T_OPK_BF16_ADD_LAYERNORM:
        cuda_add_layernorm_forward_bf16(b, r->sum, h, o->amax, r->mean, r->rstd, r->x, r->x2,
                                        r->norm_w, r->norm_b, rows, cols, r->eps);
        return;
    case FP8T_OPK_NORM_OPERAND: {
        const int add = r->step == FP8T_STEP_ADD_LAYERNORM || r->step == FP8T_STEP_ADD_RMSNORM;
        const int rms = r->step == FP8T_STEP_RMSNORM || r->step == FP8T_STEP_ADD_RMSNORM;
        cuda_add_norm_operand(b, o->data, add ? r->sum : NULL, r->x, add ? r->x2 : NULL,
                              add ? r->bias : NULL, r->norm_w, r->norm_b, rms, rows, cols,
                              r->eps, bf16 ? NULL : o->scale, fmt);
        return;
    }
    case FP8T_OPK_SWIGLU_OPERAND:
        cuda_swiglu_operand(b, o->data, r->x, r->x2, rows, cols, bf16 ? NULL : o->scale, fmt);
        return;
    case FP8T_OPK_SCALED: {
        fp8t_scaled_quant q;
        memset(&q, 0, sizeof(q));
        q.codes = c;
        q.scale_inv = o->scale_inv;
        q.codes_t = ct;
        q.scale_inv_t = o->scale_inv_t;
        q.amax_out = o->amax;
        q.colsum = r->colsum;
        q.x = r->x;
        q.gelu = r->step == FP8T_STEP_GELU;
        q.gelu_x = r->step == FP8T_STEP_DGELU ? r->x2 : NULL;
        q.bias = q.gelu || q.gelu_x ? r->bias : NULL;
        q.rows = rows;
        q.cols = cols;
        q.scaling = o->scaling;
        q.fmt = fmt;
        q.pow2 = o->pow2;
        cuda_quantize_scaled(b, &q);
        return;
    }
    default:
        fprintf(stderr,
                "fp8train: make_operand: the CUDA backend has no one-pass kernel for step %d "
                "into format %d (scaling %d%s%s%s); ask make_operand_fuses first and run the "
                "producer's op, then make_operand with step NONE\n",
                (int)r->step, (int)o->format, (int)o->scaling, o->data_t ? ", transposed" : "",
                o->amax ? ", amax" : "", r->colsum ? ", column sums" : "");
        exit(1);
    }
}

int cuda_make_operand_fuses(fp8t_backend *b, const fp8t_operand_req *r) {
    (void)b;
    return fp8t_operand_kernel_of(r) != FP8T_OPK_COMPOSE;
}
