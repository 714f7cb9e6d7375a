/* Benchmark of the CPU backend's attention (GPT-2 124M shapes: T=1024, NH=12, HS=64) next to
 * an FP32 GEMM of the same model, so the two hot spots can be compared. Prints wall time,
 * GFLOP/s and the process CPU time (steadier than wall time on a shared machine).
 * usage: bench_cpu_attention [B [T]] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "fp8train/backend.h"

static double now(void) { return omp_get_wtime(); }
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv) {
    int B = argc > 1 ? atoi(argv[1]) : 1, T = argc > 2 ? atoi(argv[2]) : 1024;
    int NH = 12, HS = 64, C = NH * HS;
    char err[256];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof err);
    if (!be) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const fp8t_backend_ops *ops = be->ops;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *qkv = ops->malloc(be, nqkv * 4), *out = ops->malloc(be, nout * 4);
    float *lse = ops->malloc(be, (size_t)B * NH * T * 4), *dout = ops->malloc(be, nout * 4);
    float *dqkv = ops->malloc(be, nqkv * 4);
    srand(1);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < nout; i++) dout[i] = (float)rand() / RAND_MAX - 0.5f;
    /* useful flops of causal attention: two [T,T/2]x HS matmuls forward, four backward */
    double fwd_flops = 2.0 * 2.0 * B * NH * (double)T * T / 2 * HS, bwd_flops = 2 * fwd_flops;
    for (int rope = 0; rope < 2; rope++) {
        float theta = rope ? 10000.0f : 0.0f;
        const fp8t_attn_shape sh = {.B = B, .T = T, .NH = NH, .HS = HS, .rope_theta = theta};
        ops->attention_forward(be, out, lse, NULL, qkv, &sh); /* warm up */
        int reps = 3;
        double t0 = now(), c0 = cpu_now();
        for (int r = 0; r < reps; r++) ops->attention_forward(be, out, lse, NULL, qkv, &sh);
        double tf = (now() - t0) / reps, cf = (cpu_now() - c0) / reps;
        t0 = now();
        c0 = cpu_now();
        for (int r = 0; r < reps; r++)
            ops->attention_backward(be, dqkv, dout, qkv, NULL, out, lse, &sh);
        double tb = (now() - t0) / reps, cb = (cpu_now() - c0) / reps;
        printf(
            "attention B=%d T=%d NH=%d HS=%d rope=%d threads=%d: forward %.1f ms (%.1f GFLOP/s, "
            "cpu %.1f ms), backward %.1f ms (%.1f GFLOP/s, cpu %.1f ms)\n",
            B, T, NH, HS, rope, omp_get_max_threads(), tf * 1e3, fwd_flops / tf * 1e-9, cf * 1e3,
            tb * 1e3, bwd_flops / tb * 1e-9, cb * 1e3);
    }
    /* the fc1 GEMM of the same model for scale: [B*T, C] x [C, 4C] */
    int M = B * T, N = 4 * C, K = C;
    float *X = ops->malloc(be, (size_t)M * K * 4), *W = ops->malloc(be, (size_t)N * K * 4);
    float *Y = ops->malloc(be, (size_t)M * N * 4);
    ops->gemm_f32(be, Y, X, W, M, N, K, 0, 1, 0);
    double t0 = now(), c0 = cpu_now();
    ops->gemm_f32(be, Y, X, W, M, N, K, 0, 1, 0);
    double tg = now() - t0, cg = cpu_now() - c0;
    t0 = now();
    ops->gemm_bf16(be, Y, X, W, M, N, K, 0, 1, 0, NULL, NULL);
    double tg16 = now() - t0;
    printf("gemm %dx%dx%d: f32 %.1f ms (%.1f GFLOP/s, cpu %.1f ms), bf16 %.1f ms\n", M, N, K,
           tg * 1e3, 2.0 * M * N * K / tg * 1e-9, cg * 1e3, tg16 * 1e3);
    /* the other row-wise hot spots of a GPT-2 step: the LM-head softmax + cross-entropy, GELU */
    {
        int Nx = B * T, V = 50257;
        float *logits = ops->malloc(be, (size_t)Nx * V * 4), *losses = ops->malloc(be, Nx * 4);
        int *tg = ops->malloc(be, Nx * sizeof(int));
        for (size_t i = 0; i < (size_t)Nx * V; i++) logits[i] = (float)(i % 977) * 0.01f;
        for (int i = 0; i < Nx; i++) tg[i] = (i * 131) % V;
        t0 = now();
        c0 = cpu_now();
        ops->softmax_xent(be, losses, logits, logits, tg, Nx, V, 1.0f / Nx);
        printf("softmax_xent %dx%d (loss + in-place dlogits): %.1f ms (cpu %.1f ms)\n", Nx, V,
               (now() - t0) * 1e3, (cpu_now() - c0) * 1e3);
        size_t ng = (size_t)Nx * 4 * C;
        float *gx = ops->malloc(be, ng * 4), *gy = ops->malloc(be, ng * 4);
        t0 = now();
        c0 = cpu_now();
        ops->gelu_forward(be, gy, gx, ng);
        ops->gelu_backward(be, gy, gx, gy, ng);
        printf("gelu forward + backward, %zu elements: %.1f ms (cpu %.1f ms)\n", ng,
               (now() - t0) * 1e3, (cpu_now() - c0) * 1e3);
        ops->free(be, logits);
        ops->free(be, losses);
        ops->free(be, tg);
        ops->free(be, gx);
        ops->free(be, gy);
    }
    ops->free(be, qkv);
    ops->free(be, out);
    ops->free(be, lse);
    ops->free(be, dout);
    ops->free(be, dqkv);
    ops->free(be, X);
    ops->free(be, W);
    ops->free(be, Y);
    fp8t_backend_destroy(be);
    return 0;
}
