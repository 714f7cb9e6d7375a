/* The one dispatch of a make_operand request to a backend's one-pass kernels
 * (operand_kind.h): the CPU and CUDA backends differ only in the kernels they pass. */
#include "backend/operand_kind.h"

#include <string.h>

fp8t_scaled_quant fp8t_operand_scaled_quant(const fp8t_operand_req *r, const float *x,
                                            int step_done) {
    const fp8t_operand *o = &r->out;
    fp8t_scaled_quant q;
    memset(&q, 0, sizeof(q));
    q.codes = (uint8_t *)o->data;
    q.scale_inv = o->scale_inv;
    q.codes_t = (uint8_t *)o->data_t;
    q.scale_inv_t = o->scale_inv_t;
    q.amax_out = o->amax;
    q.colsum = r->colsum;
    q.x = x;
    if (!step_done) {
        q.gelu = r->step == FP8T_STEP_GELU;
        if (q.gelu) q.gelu_save16 = r->save16;
        if (r->step == FP8T_STEP_DGELU) q.gelu_x = r->x2, q.gelu_x16 = r->x2_16;
        if (q.gelu || q.gelu_x || q.gelu_x16) q.bias = r->bias;
        if (r->step == FP8T_STEP_SWIGLU) {
            q.swiglu = 1, q.up = r->x2;
            q.swiglu_save16[0] = r->save16, q.swiglu_save16[1] = r->save16_2;
        }
        if (r->step == FP8T_STEP_DSWIGLU_GATE || r->step == FP8T_STEP_DSWIGLU_UP) {
            q.dswiglu = (int)r->step;
            q.gate = r->x2, q.gate16 = r->x2_16;
            q.up = r->x3, q.up16 = r->x3_16;
        }
    }
    q.rows = o->rows;
    q.cols = o->cols;
    q.scaling = o->scaling;
    q.fmt = (fp8_format)o->format;
    q.pow2 = o->pow2;
    return q;
}

int fp8t_operand_run(fp8t_backend *b, const fp8t_operand_req *r, const fp8t_operand_kernels *k) {
    const fp8t_operand *o = &r->out;
    const int rows = o->rows, cols = o->cols;
    const int bf16 = o->format == FP8T_OPERAND_BF16;
    const fp8_format fmt = bf16 ? FP8_E4M3 : (fp8_format)o->format;
    uint8_t *c = (uint8_t *)o->data, *ct = (uint8_t *)o->data_t;
    uint16_t *h = (uint16_t *)o->data;
    switch (fp8t_operand_kernel_of(r)) {
    case FP8T_OPK_QUANTIZE:
        k->quantize(b, c, ct, o->amax, r->x, rows, cols, fmt, o->scale);
        return 1;
    case FP8T_OPK_QUANTIZE_COLSUM:
        k->quantize_colsum(b, c, ct, o->amax, r->colsum, r->x, rows, cols, fmt, o->scale);
        return 1;
    case FP8T_OPK_QUANTIZE_GELU:
        k->quantize_gelu(b, c, ct, o->amax, r->save16, r->x, r->bias, rows, cols, fmt, o->scale,
                         r->values);
        return 1;
    case FP8T_OPK_QUANTIZE_DGELU:
        k->quantize_dgelu(b, c, ct, o->amax, r->colsum, r->x, r->x2, r->x2_16, r->bias, rows,
                          cols, fmt, o->scale, r->values);
        return 1;
    case FP8T_OPK_BF16: k->bf16(b, h, o->amax, r->x, rows, cols); return 1;
    case FP8T_OPK_BF16_COLSUM:
        k->bf16_colsum(b, h, o->amax, r->colsum, r->x, rows, cols);
        return 1;
    case FP8T_OPK_BF16_GELU: k->bf16_gelu(b, h, o->amax, r->save16, r->x, rows, cols); return 1;
    case FP8T_OPK_BF16_DGELU:
        k->bf16_dgelu(b, h, o->amax, r->colsum, r->x, r->x2, r->x2_16, r->bias, rows, cols);
        return 1;
    case FP8T_OPK_BF16_LAYERNORM:
        k->bf16_layernorm(b, h, o->amax, r->mean, r->rstd, r->x, r->norm_w, r->norm_b, rows, cols,
                          r->eps);
        return 1;
    case FP8T_OPK_BF16_ADD_LAYERNORM:
        k->bf16_add_layernorm(b, r->sum, r->sum16, h, o->amax, r->mean, r->rstd, r->x, r->x2,
                              r->norm_w, r->norm_b, rows, cols, r->eps);
        return 1;
    case FP8T_OPK_BF16_RMSNORM:
        k->bf16_rmsnorm(b, h, o->amax, r->rstd, r->x, r->norm_w, rows, cols, r->eps);
        return 1;
    case FP8T_OPK_BF16_ADD_RMSNORM:
        k->bf16_add_rmsnorm(b, r->sum, r->sum16, h, o->amax, r->rstd, r->x, r->x2, r->norm_w,
                            rows, cols, r->eps);
        return 1;
    case FP8T_OPK_NORM_OPERAND: {
        const int add = r->step == FP8T_STEP_ADD_LAYERNORM || r->step == FP8T_STEP_ADD_RMSNORM;
        const int rms = r->step == FP8T_STEP_RMSNORM || r->step == FP8T_STEP_ADD_RMSNORM;
        k->norm_operand(b, o->data, add ? r->sum : NULL, r->x, add ? r->x2 : NULL,
                        add ? r->bias : NULL, r->norm_w, r->norm_b, rms, rows, cols, r->eps,
                        bf16 ? NULL : o->scale, fmt);
        return 1;
    }
    case FP8T_OPK_SWIGLU_OPERAND:
        k->swiglu_operand(b, o->data, r->x, r->x2, r->x_16, r->x2_16, rows, cols,
                          bf16 || !o->data ? NULL : o->scale, fmt, o->amax);
        return 1;
    case FP8T_OPK_GELU16_OPERAND:
        k->gelu16_operand(b, o->data, r->x_16, r->bias, rows, cols,
                          bf16 || !o->data ? NULL : o->scale, fmt, o->amax);
        return 1;
    case FP8T_OPK_QUANTIZE_SWIGLU:
    case FP8T_OPK_BF16_SWIGLU: k->swiglu_step(b, r); return 1;
    case FP8T_OPK_SCALED: k->scaled(b, r); return 1;
    default: return 0;
    }
}

const char *fp8t_operand_kernel_name(fp8t_operand_kernel k) {
    static const char *const names[FP8T_OPK_COUNT] = {
        [FP8T_OPK_QUANTIZE] = "quantize",
        [FP8T_OPK_QUANTIZE_COLSUM] = "quantize_colsum",
        [FP8T_OPK_QUANTIZE_GELU] = "quantize_gelu",
        [FP8T_OPK_QUANTIZE_DGELU] = "quantize_dgelu",
        [FP8T_OPK_BF16] = "bf16",
        [FP8T_OPK_BF16_COLSUM] = "bf16_colsum",
        [FP8T_OPK_BF16_GELU] = "bf16_gelu",
        [FP8T_OPK_BF16_DGELU] = "bf16_dgelu",
        [FP8T_OPK_BF16_LAYERNORM] = "bf16_layernorm",
        [FP8T_OPK_BF16_ADD_LAYERNORM] = "bf16_add_layernorm",
        [FP8T_OPK_BF16_RMSNORM] = "bf16_rmsnorm",
        [FP8T_OPK_BF16_ADD_RMSNORM] = "bf16_add_rmsnorm",
        [FP8T_OPK_NORM_OPERAND] = "norm",
        [FP8T_OPK_SWIGLU_OPERAND] = "swiglu",
        [FP8T_OPK_GELU16_OPERAND] = "gelu16",
        [FP8T_OPK_QUANTIZE_SWIGLU] = "quantize_swiglu",
        [FP8T_OPK_BF16_SWIGLU] = "bf16_swiglu",
        [FP8T_OPK_SCALED] = "scaled",
    };
    return k >= 0 && k < FP8T_OPK_COUNT ? names[k] : "composed";
}
