/* make_operand on the CPU: each combination a GPU does in one pass goes to the CPU op that is
 * its reference (the unfused ops composed, bit for bit); every other combination is composed
 * here the same way (the producer step into FP32 scratch, the column sums as bias_backward,
 * then the cast), so the CPU backend makes any operand the request can describe. */
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/operand_kind.h"

/* The step's values in FP32 (scratch, or x itself for NONE), with its side outputs. */
static const float *step_values(fp8t_backend *b, const fp8t_operand_req *r) {
    const int rows = r->out.rows, cols = r->out.cols;
    const size_t n = (size_t)rows * (size_t)cols;
    if (r->step == FP8T_STEP_NONE) return r->x;
    float *v = cpu_scratch(b, CPU_SCRATCH_OPERAND, n * sizeof(float));
    switch (r->step) {
    case FP8T_STEP_BIAS:
        memcpy(v, r->x, n * sizeof(float));
        if (r->bias) cpu_bias_add(b, v, r->bias, rows, cols);
        break;
    case FP8T_STEP_GELU:
        if (r->save16) cpu_bf16_pack(b, r->save16, r->x, r->bias, rows, cols);
        if (r->bias) { /* gelu_input's bits: x + bias, then GELU in place */
            memcpy(v, r->x, n * sizeof(float));
            cpu_bias_add(b, v, r->bias, rows, cols);
            cpu_gelu_forward(b, v, v, n);
        } else {
            cpu_gelu_forward(b, v, r->x, n);
        }
        break;
    case FP8T_STEP_DGELU:
        if (r->x2_16) { /* GELU's input widened into v, then the backward in place */
            cpu_bf16_unpack(b, v, r->x2_16, n);
            cpu_gelu_backward(b, v, v, r->x, n);
        } else if (r->bias) {
            cpu_gelu_backward_bias(b, v, r->x2, r->bias, r->x, rows, cols);
        } else {
            cpu_gelu_backward(b, v, r->x2, r->x, n);
        }
        break;
    case FP8T_STEP_SWIGLU:
        cpu_swiglu_forward(b, v, r->x, r->x2, r->save16, r->save16_2, n);
        break;
    case FP8T_STEP_DSWIGLU_GATE:
    case FP8T_STEP_DSWIGLU_UP:
        cpu_swiglu_grad(b, v, (int)r->step, r->x, r->x2, r->x2_16, r->x3, r->x3_16, n);
        break;
    default: { /* the norms, after the residual add */
        const int add = r->step == FP8T_STEP_ADD_LAYERNORM || r->step == FP8T_STEP_ADD_RMSNORM;
        const int rms = r->step == FP8T_STEP_RMSNORM || r->step == FP8T_STEP_ADD_RMSNORM;
        const float *s = r->x;
        if (add && r->x2) {
            float *sum =
                r->sum ? r->sum : cpu_scratch(b, CPU_SCRATCH_OPERAND_SUM, n * sizeof(float));
            cpu_add_bias(b, sum, r->sum16, r->x, r->x2, r->bias, rows, cols);
            s = sum;
        } else if (add) {
            if (r->sum) memcpy(r->sum, r->x, n * sizeof(float));
            if (r->sum16) cpu_bf16_pack(b, r->sum16, r->x, NULL, rows, cols);
        }
        if (rms)
            cpu_rmsnorm_forward(b, v, r->rstd, s, r->norm_w, rows, cols, r->eps);
        else
            cpu_layernorm_forward(b, v, r->mean, r->rstd, s, r->norm_w, r->norm_b, rows, cols,
                                  r->eps);
        break;
    }
    }
    return v;
}

static void compose(fp8t_backend *b, const fp8t_operand_req *r) {
    const fp8t_operand *o = &r->out;
    const int rows = o->rows, cols = o->cols;
    const float *v = step_values(b, r);
    if (o->format != FP8T_OPERAND_BF16 && o->scaling != FP8T_SCALING_TENSOR) {
        fp8t_scaled_quant q = fp8t_operand_scaled_quant(r, v, 1); /* colsum, amax there */
        cpu_quantize_scaled(b, &q);
        return;
    }
    if (r->colsum) cpu_bias_backward(b, r->colsum, v, rows, cols);
    if (o->format == FP8T_OPERAND_BF16) {
        if (o->data)
            cpu_to_bf16(b, (uint16_t *)o->data, o->amax, v, rows, cols);
        else if (o->amax)
            cpu_amax(b, o->amax, v, (size_t)rows * (size_t)cols);
        return;
    }
    if (o->data) {
        cpu_quantize(b, (uint8_t *)o->data, (uint8_t *)o->data_t, o->amax, v, rows, cols,
                     (fp8_format)o->format, o->scale);
    } else {
        /* only the transposed codes: the row-major ones in scratch, then dropped */
        uint8_t *c = cpu_scratch(b, CPU_SCRATCH_CODES, (size_t)rows * (size_t)cols);
        cpu_quantize(b, c, (uint8_t *)o->data_t, o->amax, v, rows, cols, (fp8_format)o->format,
                     o->scale);
    }
}

static const fp8t_operand_kernels cpu_kernels = {
    .quantize = cpu_quantize,
    .quantize_colsum = cpu_quantize_colsum,
    .quantize_gelu = cpu_quantize_gelu,
    .quantize_dgelu = cpu_gelu_backward_quantize_colsum,
    .bf16 = cpu_to_bf16,
    .bf16_colsum = cpu_to_bf16_colsum,
    .bf16_gelu = cpu_gelu_forward_bf16,
    .bf16_dgelu = cpu_gelu_backward_bf16_colsum,
    .bf16_layernorm = cpu_layernorm_forward_bf16,
    .bf16_add_layernorm = cpu_add_layernorm_forward_bf16,
    .norm_operand = cpu_add_norm_operand,
    .swiglu_operand = cpu_swiglu_operand,
    .scaled = cpu_quantize_scaled,
};

void cpu_make_operand(fp8t_backend *b, const fp8t_operand_req *r) {
    if (r->out.rows <= 0 || r->out.cols <= 0) return;
    if (!fp8t_operand_run(b, r, &cpu_kernels)) compose(b, r);
}

int cpu_make_operand_fuses(fp8t_backend *b, const fp8t_operand_req *r) {
    (void)b;
    return fp8t_operand_kernel_of(r) != FP8T_OPK_COMPOSE;
}
