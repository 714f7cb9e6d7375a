/* make_operand on the CPU: each combination a GPU does in one pass goes to the CPU op that is
 * its reference (the unfused ops composed, bit for bit); every other combination is composed
 * here the same way (the producer step into FP32 scratch, the column sums as bias_backward,
 * then the cast), so the CPU backend makes any operand the request can describe. */

#include "backend/cpu/cpu_internal.h"
#include "backend/operand_kind.h"

/* The step's values in FP32 (scratch, or x itself for NONE), with its side outputs: the CPU's
 * own ops composed (fp8t_operand_step_values), the residual sum into scratch where the request
 * keeps none. */
static const float *step_values(fp8t_backend *b, const fp8t_operand_req *r) {
    if (r->step == FP8T_STEP_NONE) return r->x;
    const size_t n = (size_t)r->out.rows * (size_t)r->out.cols;
    float *v = cpu_scratch(b, CPU_SCRATCH_OPERAND, n * sizeof(float));
    const int add = r->step == FP8T_STEP_ADD_LAYERNORM || r->step == FP8T_STEP_ADD_RMSNORM;
    float *sum = add && r->x2 && !r->sum
                     ? cpu_scratch(b, CPU_SCRATCH_OPERAND_SUM, n * sizeof(float))
                     : NULL;
    return fp8t_operand_step_values(&cpu_backend_ops, b, r, v, sum);
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

/* The reference of a GPU's one-pass SwiGLU kernels (per-tensor FP8, BF16) and scaled kernels
 * (block, rowwise; any step) is the unfused ops' composition itself. */
static void cpu_step_composed(fp8t_backend *b, const fp8t_operand_req *r) { compose(b, r); }

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
    .bf16_rmsnorm = cpu_rmsnorm_forward_bf16,
    .bf16_add_rmsnorm = cpu_add_rmsnorm_forward_bf16,
    .norm_operand = cpu_add_norm_operand,
    .swiglu_operand = cpu_swiglu_operand,
    .gelu16_operand = cpu_gelu16_operand,
    .swiglu_step = cpu_step_composed,
    .scaled = cpu_step_composed,
};

void cpu_make_operand(fp8t_backend *b, const fp8t_operand_req *r) {
    if (r->out.rows <= 0 || r->out.cols <= 0) return;
    if (!fp8t_operand_run(b, r, &cpu_kernels)) compose(b, r);
}

int cpu_make_operand_fuses(fp8t_backend *b, const fp8t_operand_req *r) {
    (void)b;
    return fp8t_operand_kernel_of(r) != FP8T_OPK_COMPOSE;
}
