/* CUDA backend — attention core: gemm (placeholder until implemented: reports unsupported). */
#include "backend/cuda/cuda_common.cuh"

int cuda_attn_gemm_fwd(fp8t_backend *b, float *out, float *lse, const float *q, const float *k,
                       const float *v, int B, int T, int NH, int HS, float scale) {
    (void)b, (void)out, (void)lse, (void)q, (void)k, (void)v, (void)B, (void)T, (void)NH,
        (void)HS, (void)scale;
    return -1;
}

int cuda_attn_gemm_bwd(fp8t_backend *b, float *dq, float *dk, float *dv, const float *q,
                       const float *k, const float *v, const float *dout, const float *lse,
                       const float *Dv, int B, int T, int NH, int HS, float scale) {
    (void)b, (void)dq, (void)dk, (void)dv, (void)q, (void)k, (void)v, (void)dout, (void)lse,
        (void)Dv, (void)B, (void)T, (void)NH, (void)HS, (void)scale;
    return -1;
}
