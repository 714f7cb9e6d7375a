/* make_operand on the GPU: each combination fp8t_operand_kernel_of names goes to the one-pass
 * kernel that makes it (the same host functions, with the same arguments, that the fused ops
 * of the op table called before make_operand replaced them). A combination with no kernel is
 * refused: make_operand_fuses says 0 for it, and the model then runs the producer's own op into
 * FP32 and makes the operand with step NONE. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/operand_kind.h"

const float *cuda_swiglu_values(fp8t_backend *b, const fp8t_operand_req *r) {
    const size_t n = (size_t)r->out.rows * (size_t)r->out.cols;
    float *v = (float *)cuda_scratch(b, SCR_ACT, n * sizeof(float));
    return fp8t_operand_step_values(&cuda_backend_ops, b, r, v, NULL);
}

/* QUANTIZE_SWIGLU and BF16_SWIGLU: the one entry, by the operand's format */
static void cuda_swiglu_step(fp8t_backend *b, const fp8t_operand_req *r) {
    if (r->out.format == FP8T_OPERAND_BF16)
        cuda_bf16_swiglu(b, r);
    else
        cuda_quantize_swiglu(b, r);
}

/* SCALED: the request as quantize_scaled's, its step applied in the kernel's prologue */
static void cuda_scaled_step(fp8t_backend *b, const fp8t_operand_req *r) {
    const fp8t_scaled_quant q = fp8t_operand_scaled_quant(r, r->x, 0);
    cuda_quantize_scaled(b, &q);
}

static fp8t_operand_kernels cuda_kernels(void) {
    fp8t_operand_kernels k;
    k.quantize = cuda_quantize;
    k.quantize_colsum = cuda_quantize_colsum;
    k.quantize_gelu = cuda_quantize_gelu;
    k.quantize_dgelu = cuda_gelu_backward_quantize_colsum;
    k.bf16 = cuda_to_bf16_operand;
    k.bf16_colsum = cuda_to_bf16_colsum;
    k.bf16_gelu = cuda_gelu_forward_bf16;
    k.bf16_dgelu = cuda_gelu_backward_bf16_colsum;
    k.bf16_layernorm = cuda_layernorm_forward_bf16;
    k.bf16_add_layernorm = cuda_add_layernorm_forward_bf16;
    k.bf16_rmsnorm = cuda_rmsnorm_forward_bf16;
    k.bf16_add_rmsnorm = cuda_add_rmsnorm_forward_bf16;
    k.norm_operand = cuda_add_norm_operand;
    k.swiglu_operand = cuda_swiglu_operand;
    k.gelu16_operand = cuda_gelu16_operand;
    k.swiglu_step = cuda_swiglu_step;
    k.scaled = cuda_scaled_step;
    return k;
}

void cuda_make_operand(fp8t_backend *b, const fp8t_operand_req *r) {
    static const fp8t_operand_kernels k = cuda_kernels();
    if (fp8t_operand_run(b, r, &k)) return;
    const fp8t_operand *o = &r->out;
    FP8T_FATAL(
        "make_operand: the CUDA backend has no one-pass kernel for step %d into "
        "format %d (scaling %d%s%s%s); ask make_operand_fuses first and run the producer's "
        "op, then make_operand with step NONE",
        (int)r->step, (int)o->format, (int)o->scaling, o->data_t ? ", transposed" : "",
        o->amax ? ", amax" : "", r->colsum ? ", column sums" : "");
}

int cuda_make_operand_fuses(fp8t_backend *b, const fp8t_operand_req *r) {
    (void)b;
    return fp8t_operand_kernel_of(r) != FP8T_OPK_COMPOSE;
}
