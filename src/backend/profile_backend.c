/* A backend that times every op of another one (see include/fp8train/profile.h).
 *
 * Each op: synchronize inner, read the clock, run the op, synchronize, read the clock. The time
 * is charged to the op (and, for GEMMs, to its shape and precision, with the FLOPs it did), so
 * the report says which ops and which GEMM shapes a step spends its time in. Memory ops that
 * wait anyway (to_host, synchronize) are timed too; malloc/free are not ops of a step. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/operand_kind.h"
#include "fp8train/error.h"
#include "fp8train/profile.h"

enum {
    P_TO_DEVICE,
    P_TO_HOST,
    P_COPY,
    P_ZERO,
    P_SYNC,
    P_GEMM_F32,
    P_GEMM_BF16,
    P_GEMM_BF16_ROUNDED,
    P_GEMM_FP8,
    P_GEMM_TN_BF16_OUT,
    P_AMAX,
    /* make_operand, charged to the kernel that made the operand (operand_kind.h): index
     * P_OPERAND + 1 + the kernel, P_OPERAND itself for a composed request */
    P_OPERAND,
    P_OPERAND_LAST = P_OPERAND + FP8T_OPK_COUNT,
    P_COMPUTE_SCALE,
    P_FAKE_QUANT,
    P_BLOCK_FAKE_QUANT,
    P_MXFP8_FAKE_QUANT,
    P_BF16_ROUND,
    P_BF16_PACK,
    P_BF16_UNPACK,
    P_DELAYED_UPDATE,
    P_EMB_FWD,
    P_EMB_BWD,
    P_LN_FWD,
    P_LN_BWD,
    P_RMS_FWD,
    P_RMS_BWD,
    P_BIAS_ADD,
    P_BIAS_BWD,
    P_GELU_FWD,
    P_GELU_BWD,
    P_GELU_BWD_BIAS,
    P_SWIGLU_FWD,
    P_SWIGLU_BWD,
    P_SWIGLU_GRAD,
    P_ATTN_FWD,
    P_ATTN_BWD,
    P_XENT,
    P_XENT_BF16,
    P_ADD,
    P_ADD_BIAS,
    P_ACCUMULATE,
    P_SCALE,
    P_SUMSQ,
    P_SUM,
    P_ADAMW,
    P_TENSOR_STATS,
    P_TO_HOST_ASYNC,
    P_KV_CACHE_WRITE,
    P_ATTN_DECODE,
    P_EMB_FWD_BF16,
    P_EMB_FWD_FP8,
    P_COUNT
};

/* the operand range's names come from op_name */
static const char *const op_names[P_COUNT] = {
    "to_device",
    "to_host",
    "copy",
    "zero",
    "synchronize",
    "gemm_f32",
    "gemm_bf16",
    "gemm_bf16_rounded",
    "gemm_fp8",
    "gemm_tn_bf16_out",
    "amax",
    [P_COMPUTE_SCALE] = "compute_scale",
    "fake_quantize",
    "block_fake_quantize",
    "mxfp8_fake_quantize",
    "bf16_round",
    "bf16_pack",
    "bf16_unpack",
    "delayed_update",
    "embedding_forward",
    "embedding_backward",
    "layernorm_forward",
    "layernorm_backward",
    "rmsnorm_forward",
    "rmsnorm_backward",
    "bias_add",
    "bias_backward",
    "gelu_forward",
    "gelu_backward",
    "gelu_backward_bias",
    "swiglu_forward",
    "swiglu_backward",
    "swiglu_grad",
    "attention_forward",
    "attention_backward",
    "softmax_xent",
    "softmax_xent_bf16",
    "add",
    "add_bias",
    "accumulate",
    "scale",
    "sumsq",
    "sum",
    "adamw",
    "tensor_stats",
    "to_host_async",
    "kv_cache_write",
    "attention_decode",
    "embedding_forward_bf16",
    "embedding_forward_fp8",
};

/* op i's name in the report (make_operand's with their kernel's, written into buf) */
static const char *op_name(int i, char *buf, size_t len) {
    if (i < P_OPERAND || i > P_OPERAND_LAST) return op_names[i];
    snprintf(buf, len, "make_operand %s",
             fp8t_operand_kernel_name((fp8t_operand_kernel)(i - P_OPERAND - 1)));
    return buf;
}

#define MAX_SHAPES 128

typedef struct {
    int op, M, N, K, transA, transB; /* GEMM shape (op: P_GEMM_*) */
    long calls;
    double seconds, flops;
} shape_stat;

typedef struct {
    fp8t_backend *inner;
    fp8t_backend_ops ops; /* this wrapper's table */
    long calls[P_COUNT];
    double seconds[P_COUNT], flops[P_COUNT];
    shape_stat shapes[MAX_SHAPES];
    int n_shapes;
} profiler;

static profiler *prof(fp8t_backend *b) { return (profiler *)b->impl; }
static fp8t_backend *in(fp8t_backend *b) { return prof(b)->inner; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Time one statement that calls the inner backend (`ib`) as op `id`; the seconds it took are
 * left in dt_ for the statements in `after` (the GEMMs' per-shape accounting). */
#define TIMED_THEN(id, stmt, after)                                                              \
    do {                                                                                         \
        fp8t_backend *ib = in(b);                                                                \
        ib->ops->synchronize(ib);                                                                \
        double t0_ = now_s();                                                                    \
        stmt;                                                                                    \
        ib->ops->synchronize(ib);                                                                \
        double dt_ = now_s() - t0_;                                                              \
        prof(b)->calls[id]++;                                                                    \
        prof(b)->seconds[id] += dt_;                                                             \
        after;                                                                                   \
    } while (0)
#define TIMED(id, stmt) TIMED_THEN(id, stmt, (void)dt_)

static void gemm_account(fp8t_backend *b, int op, int M, int N, int K, int ta, int tb,
                         double dt) {
    profiler *p = prof(b);
    double fl = 2.0 * M * N * (double)K;
    p->flops[op] += fl;
    for (int i = 0; i < p->n_shapes; i++) {
        shape_stat *s = &p->shapes[i];
        if (s->op == op && s->M == M && s->N == N && s->K == K && s->transA == ta &&
            s->transB == tb) {
            s->calls++, s->seconds += dt, s->flops += fl;
            return;
        }
    }
    if (p->n_shapes == MAX_SHAPES) return; /* the per-op totals still count it */
    shape_stat *s = &p->shapes[p->n_shapes++];
    *s = (shape_stat){op, M, N, K, ta, tb, 1, dt, fl};
}

/* ---- memory (malloc/free untimed) ---- */
static void *w_malloc(fp8t_backend *b, size_t n) { return in(b)->ops->malloc(in(b), n); }
static void w_free(fp8t_backend *b, void *p) { in(b)->ops->free(in(b), p); }
static void w_to_device(fp8t_backend *b, void *d, const void *s, size_t n) {
    TIMED(P_TO_DEVICE, ib->ops->to_device(ib, d, s, n));
}
static void w_to_host(fp8t_backend *b, void *d, const void *s, size_t n) {
    TIMED(P_TO_HOST, ib->ops->to_host(ib, d, s, n));
}
static void w_copy(fp8t_backend *b, void *d, const void *s, size_t n) {
    TIMED(P_COPY, ib->ops->copy(ib, d, s, n));
}
static void w_zero(fp8t_backend *b, void *d, size_t n) { TIMED(P_ZERO, ib->ops->zero(ib, d, n)); }
static void w_synchronize(fp8t_backend *b) { TIMED(P_SYNC, (void)0); }
static void w_destroy(fp8t_backend *b) {
    fp8t_backend *inner = in(b);
    inner->ops->destroy(inner);
    free(b->impl);
    free(b);
}

/* ---- GEMMs ---- */
static void w_gemm_f32(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N,
                       int K, int ta, int tb, int acc) {
    TIMED_THEN(P_GEMM_F32, ib->ops->gemm_f32(ib, C, A, B, M, N, K, ta, tb, acc),
               gemm_account(b, P_GEMM_F32, M, N, K, ta, tb, dt_));
}
static void w_gemm_bf16(fp8t_backend *b, float *C, const float *A, const float *B, int M, int N,
                        int K, int ta, int tb, int acc, float *amax_a, float *amax_b) {
    TIMED_THEN(P_GEMM_BF16, ib->ops->gemm_bf16(ib, C, A, B, M, N, K, ta, tb, acc, amax_a, amax_b),
               gemm_account(b, P_GEMM_BF16, M, N, K, ta, tb, dt_));
}
static void w_gemm_bf16_rounded(fp8t_backend *b, float *C, const fp8t_bf16_operand *A,
                                const fp8t_bf16_operand *B, int M, int N, int K, int ta, int tb,
                                int acc, const float *bias, int ldc) {
    TIMED_THEN(P_GEMM_BF16_ROUNDED,
               ib->ops->gemm_bf16_rounded(ib, C, A, B, M, N, K, ta, tb, acc, bias, ldc),
               gemm_account(b, P_GEMM_BF16_ROUNDED, M, N, K, ta, tb, dt_));
}
static void w_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                       const fp8t_fp8_operand *B, int M, int N, int K, int ta, int tb, int acc,
                       int fast, float *amax_out, const float *bias) {
    TIMED_THEN(P_GEMM_FP8,
               ib->ops->gemm_fp8(ib, C, A, B, M, N, K, ta, tb, acc, fast, amax_out, bias),
               gemm_account(b, P_GEMM_FP8, M, N, K, ta, tb, dt_));
}
static void w_gemm_tn_bf16_out(fp8t_backend *b, uint16_t *C16, const fp8t_fp8_operand *A8,
                               const fp8t_fp8_operand *B8, const fp8t_bf16_operand *A16,
                               const fp8t_bf16_operand *B16, int M, int N, int K, int fast) {
    TIMED_THEN(P_GEMM_TN_BF16_OUT,
               ib->ops->gemm_tn_bf16_out(ib, C16, A8, B8, A16, B16, M, N, K, fast),
               gemm_account(b, P_GEMM_TN_BF16_OUT, M, N, K, 0, 1, dt_));
}

/* ---- quantization ---- */
static void w_amax(fp8t_backend *b, float *o, const float *x, size_t n) {
    TIMED(P_AMAX, ib->ops->amax(ib, o, x, n));
}
static void w_make_operand(fp8t_backend *b, const fp8t_operand_req *r) {
    TIMED(P_OPERAND + 1 + fp8t_operand_kernel_of(r), ib->ops->make_operand(ib, r));
}
static int w_make_operand_fuses(fp8t_backend *b, const fp8t_operand_req *r) {
    return in(b)->ops->make_operand_fuses(in(b), r);
}
static void w_compute_scale(fp8t_backend *b, float *s, float *si, const float *a, float mx,
                            float eps, int pow2) {
    TIMED(P_COMPUTE_SCALE, ib->ops->compute_scale(ib, s, si, a, mx, eps, pow2));
}
static void w_fake_quantize(fp8t_backend *b, float *o, const float *x, size_t n, fp8_format f,
                            const float *s) {
    TIMED(P_FAKE_QUANT, ib->ops->fake_quantize(ib, o, x, n, f, s));
}
static void w_block_fake_quantize(fp8t_backend *b, float *o, const float *x, int r, int c, int tr,
                                  int tc, fp8_format f) {
    TIMED(P_BLOCK_FAKE_QUANT, ib->ops->block_fake_quantize(ib, o, x, r, c, tr, tc, f));
}
static void w_mxfp8_fake_quantize(fp8t_backend *b, float *o, const float *x, int r, int c) {
    TIMED(P_MXFP8_FAKE_QUANT, ib->ops->mxfp8_fake_quantize(ib, o, x, r, c));
}
static void w_bf16_round(fp8t_backend *b, float *o, const float *x, size_t n) {
    TIMED(P_BF16_ROUND, ib->ops->bf16_round(ib, o, x, n));
}
static void w_bf16_pack(fp8t_backend *b, uint16_t *o, const float *x, const float *bias, int r,
                        int c) {
    TIMED(P_BF16_PACK, ib->ops->bf16_pack(ib, o, x, bias, r, c));
}
static void w_bf16_unpack(fp8t_backend *b, float *o, const uint16_t *x, size_t n) {
    TIMED(P_BF16_UNPACK, ib->ops->bf16_unpack(ib, o, x, n));
}
static void w_delayed_update(fp8t_backend *b, float *st, int n, int len, fp8t_amax_algo a,
                             int margin) {
    TIMED(P_DELAYED_UPDATE, ib->ops->delayed_update(ib, st, n, len, a, margin));
}

/* ---- model ops ---- */
static void w_embedding_forward(fp8t_backend *b, float *o, const int *t, const float *wte,
                                const float *wpe, int B, int T, int C) {
    TIMED(P_EMB_FWD, ib->ops->embedding_forward(ib, o, t, wte, wpe, B, T, C));
}
static void w_embedding_backward(fp8t_backend *b, float *dwte, float *dwpe, const float *d,
                                 const int *t, int B, int T, int C) {
    TIMED(P_EMB_BWD, ib->ops->embedding_backward(ib, dwte, dwpe, d, t, B, T, C));
}
static void w_layernorm_forward(fp8t_backend *b, float *o, float *mean, float *rstd,
                                const float *x, const float *w, const float *bias, int N, int C,
                                float eps) {
    TIMED(P_LN_FWD, ib->ops->layernorm_forward(ib, o, mean, rstd, x, w, bias, N, C, eps));
}
static void w_layernorm_backward(fp8t_backend *b, float *dx, float *dw, float *db, const float *d,
                                 const float *x, const uint16_t *x16, const float *w,
                                 const float *mean, const float *rstd, int N, int C) {
    TIMED(P_LN_BWD, ib->ops->layernorm_backward(ib, dx, dw, db, d, x, x16, w, mean, rstd, N, C));
}
static void w_rmsnorm_forward(fp8t_backend *b, float *o, float *rstd, const float *x,
                              const float *w, int N, int C, float eps) {
    TIMED(P_RMS_FWD, ib->ops->rmsnorm_forward(ib, o, rstd, x, w, N, C, eps));
}
static void w_rmsnorm_backward(fp8t_backend *b, float *dx, float *dw, const float *d,
                               const float *x, const uint16_t *x16, const float *w,
                               const float *rstd, int N, int C) {
    TIMED(P_RMS_BWD, ib->ops->rmsnorm_backward(ib, dx, dw, d, x, x16, w, rstd, N, C));
}
static void w_bias_add(fp8t_backend *b, float *o, const float *bias, int N, int OC) {
    TIMED(P_BIAS_ADD, ib->ops->bias_add(ib, o, bias, N, OC));
}
static void w_bias_backward(fp8t_backend *b, float *db, const float *d, int N, int OC) {
    TIMED(P_BIAS_BWD, ib->ops->bias_backward(ib, db, d, N, OC));
}
static void w_gelu_forward(fp8t_backend *b, float *o, const float *x, size_t n) {
    TIMED(P_GELU_FWD, ib->ops->gelu_forward(ib, o, x, n));
}
static void w_gelu_backward(fp8t_backend *b, float *dx, const float *x, const float *d,
                            size_t n) {
    TIMED(P_GELU_BWD, ib->ops->gelu_backward(ib, dx, x, d, n));
}
static void w_gelu_backward_bias(fp8t_backend *b, float *dx, const float *x, const float *bias,
                                 const float *d, int r, int c) {
    TIMED(P_GELU_BWD_BIAS, ib->ops->gelu_backward_bias(ib, dx, x, bias, d, r, c));
}
static void w_swiglu_forward(fp8t_backend *b, float *o, const float *g, const float *u,
                             uint16_t *g16, uint16_t *u16, size_t n) {
    TIMED(P_SWIGLU_FWD, ib->ops->swiglu_forward(ib, o, g, u, g16, u16, n));
}
static void w_swiglu_backward(fp8t_backend *b, float *dg, float *du, const float *d,
                              const float *g, const float *u, const uint16_t *g16,
                              const uint16_t *u16, size_t n) {
    TIMED(P_SWIGLU_BWD, ib->ops->swiglu_backward(ib, dg, du, d, g, u, g16, u16, n));
}
static void w_swiglu_grad(fp8t_backend *b, float *o, int which, const float *d, const float *g,
                          const uint16_t *g16, const float *u, const uint16_t *u16, size_t n) {
    TIMED(P_SWIGLU_GRAD, ib->ops->swiglu_grad(ib, o, which, d, g, g16, u, u16, n));
}
static void w_attention_forward(fp8t_backend *b, float *o, float *lse, void *sv, const float *qkv,
                                const fp8t_attn_shape *s) {
    TIMED(P_ATTN_FWD, ib->ops->attention_forward(ib, o, lse, sv, qkv, s));
}
static void w_attention_backward(fp8t_backend *b, float *dqkv, const float *d, const float *qkv,
                                 const void *sv, const float *o, const float *lse,
                                 const fp8t_attn_shape *s) {
    TIMED(P_ATTN_BWD, ib->ops->attention_backward(ib, dqkv, d, qkv, sv, o, lse, s));
}
static size_t w_attention_saved_bytes(fp8t_backend *b, const fp8t_attn_shape *s) {
    return in(b)->ops->attention_saved_bytes(in(b), s);
}
static void w_softmax_xent(fp8t_backend *b, float *l, float *dl, const float *lg, const int *t,
                           int N, int V, float dloss) {
    TIMED(P_XENT, ib->ops->softmax_xent(ib, l, dl, lg, t, N, V, dloss));
}
static void w_softmax_xent_bf16(fp8t_backend *b, float *l, uint16_t *dl, float *amax, float *d32,
                                const float *lg, int ld, const int *t, int N, int V,
                                float dloss) {
    TIMED(P_XENT_BF16, ib->ops->softmax_xent_bf16(ib, l, dl, amax, d32, lg, ld, t, N, V, dloss));
}
static void w_add(fp8t_backend *b, float *o, const float *a, const float *c, size_t n) {
    TIMED(P_ADD, ib->ops->add(ib, o, a, c, n));
}
static void w_add_bias(fp8t_backend *b, float *o, uint16_t *o16, const float *a, const float *y,
                       const float *bias, int N, int OC) {
    TIMED(P_ADD_BIAS, ib->ops->add_bias(ib, o, o16, a, y, bias, N, OC));
}
static void w_accumulate(fp8t_backend *b, float *o, const float *x, size_t n) {
    TIMED(P_ACCUMULATE, ib->ops->accumulate(ib, o, x, n));
}
static void w_scale(fp8t_backend *b, float *o, float s, size_t n) {
    TIMED(P_SCALE, ib->ops->scale(ib, o, s, n));
}
static void w_sumsq(fp8t_backend *b, float *o, const float *x, size_t n) {
    TIMED(P_SUMSQ, ib->ops->sumsq(ib, o, x, n));
}
static void w_sum(fp8t_backend *b, float *o, const float *x, size_t n) {
    TIMED(P_SUM, ib->ops->sum(ib, o, x, n));
}
static void w_adamw(fp8t_backend *b, float *p, float *m, float *v, const float *g, size_t n,
                    float lr, float b1, float b2, float eps, float wd, int t, float gs) {
    TIMED(P_ADAMW, ib->ops->adamw(ib, p, m, v, g, n, lr, b1, b2, eps, wd, t, gs));
}
static void w_tensor_stats(fp8t_backend *b, fp8t_stats_raw *out, const float *x, int rows,
                           int cols, const fp8t_stats_req *req) {
    TIMED(P_TENSOR_STATS, ib->ops->tensor_stats(ib, out, x, rows, cols, req));
}
/* pinned allocations are not ops of a step (as malloc / free); the async copy is timed */
static void *w_host_alloc(fp8t_backend *b, size_t bytes) {
    return in(b)->ops->host_alloc(in(b), bytes);
}
static void w_host_free(fp8t_backend *b, void *p) { in(b)->ops->host_free(in(b), p); }
static void w_to_host_async(fp8t_backend *b, void *d, const void *s, size_t n) {
    TIMED(P_TO_HOST_ASYNC, ib->ops->to_host_async(ib, d, s, n));
}

static void w_kv_cache_write(fp8t_backend *b, void *kc, void *vc, int kv, const float *qkv,
                             const fp8t_attn_shape *s, int Tmax) {
    TIMED(P_KV_CACHE_WRITE, ib->ops->kv_cache_write(ib, kc, vc, kv, qkv, s, Tmax));
}
static void w_attention_decode(fp8t_backend *b, float *o, void *kc, void *vc, int kv,
                               const float *qkv, const int *pos, const fp8t_attn_shape *s,
                               int Tmax) {
    TIMED(P_ATTN_DECODE, ib->ops->attention_decode(ib, o, kc, vc, kv, qkv, pos, s, Tmax));
}

static void w_embedding_forward_bf16(fp8t_backend *b, float *o, const int *tok,
                                     const uint16_t *wte, int ld, const float *wpe,
                                     const int *pos, int B, int T, int C) {
    TIMED(P_EMB_FWD_BF16,
          ib->ops->embedding_forward_bf16(ib, o, tok, wte, ld, wpe, pos, B, T, C));
}
static void w_embedding_forward_fp8(fp8t_backend *b, float *o, const int *tok,
                                    const uint8_t *codes, int ld, const float *si,
                                    const float *wpe, const int *pos, int B, int T, int C) {
    TIMED(P_EMB_FWD_FP8,
          ib->ops->embedding_forward_fp8(ib, o, tok, codes, ld, si, wpe, pos, B, T, C));
}

/* the collectives pass through untimed: a step's time waiting for other ranks is not an op's */
static int w_comm_init(fp8t_backend *b, char *err, size_t errlen) {
    return in(b)->ops->comm_init(in(b), err, errlen);
}
static void w_allreduce(fp8t_backend *b, float *x, size_t n, fp8t_reduce_op op, int bf16) {
    in(b)->ops->allreduce(in(b), x, n, op, bf16);
}
static void w_reduce_scatter(fp8t_backend *b, float *x, const size_t *counts) {
    in(b)->ops->reduce_scatter(in(b), x, counts);
}
static void w_all_gather(fp8t_backend *b, float *x, const size_t *counts) {
    in(b)->ops->all_gather(in(b), x, counts);
}
static void w_broadcast(fp8t_backend *b, void *x, size_t bytes, int root) {
    in(b)->ops->broadcast(in(b), x, bytes, root);
}

static void w_reduce_start(fp8t_backend *b, float *x, size_t n, const size_t *counts, int bf16) {
    in(b)->ops->reduce_start(in(b), x, n, counts, bf16);
}
static void w_reduce_wait(fp8t_backend *b) { in(b)->ops->reduce_wait(in(b)); }

/* Every op wrapped (the graph ops stay unset: a profiled step runs op by op, each one timed,
 * and a recording would hide them); fp8t_profile_wrap checks that every op the inner
 * backend has is wrapped. */
static const fp8t_backend_ops wrapper_ops = {
    .malloc = w_malloc,
    .free = w_free,
    .to_device = w_to_device,
    .to_host = w_to_host,
    .copy = w_copy,
    .zero = w_zero,
    .synchronize = w_synchronize,
    .destroy = w_destroy,
    .gemm_f32 = w_gemm_f32,
    .gemm_bf16 = w_gemm_bf16,
    .gemm_bf16_rounded = w_gemm_bf16_rounded,
    .gemm_fp8 = w_gemm_fp8,
    .gemm_tn_bf16_out = w_gemm_tn_bf16_out,
    .amax = w_amax,
    .make_operand = w_make_operand,
    .make_operand_fuses = w_make_operand_fuses,
    .compute_scale = w_compute_scale,
    .fake_quantize = w_fake_quantize,
    .block_fake_quantize = w_block_fake_quantize,
    .mxfp8_fake_quantize = w_mxfp8_fake_quantize,
    .bf16_round = w_bf16_round,
    .bf16_pack = w_bf16_pack,
    .bf16_unpack = w_bf16_unpack,
    .delayed_update = w_delayed_update,
    .embedding_forward = w_embedding_forward,
    .embedding_backward = w_embedding_backward,
    .layernorm_forward = w_layernorm_forward,
    .layernorm_backward = w_layernorm_backward,
    .rmsnorm_forward = w_rmsnorm_forward,
    .rmsnorm_backward = w_rmsnorm_backward,
    .bias_add = w_bias_add,
    .bias_backward = w_bias_backward,
    .gelu_forward = w_gelu_forward,
    .gelu_backward = w_gelu_backward,
    .gelu_backward_bias = w_gelu_backward_bias,
    .swiglu_forward = w_swiglu_forward,
    .swiglu_backward = w_swiglu_backward,
    .swiglu_grad = w_swiglu_grad,
    .attention_forward = w_attention_forward,
    .attention_backward = w_attention_backward,
    .attention_saved_bytes = w_attention_saved_bytes,
    .softmax_xent = w_softmax_xent,
    .softmax_xent_bf16 = w_softmax_xent_bf16,
    .add = w_add,
    .add_bias = w_add_bias,
    .accumulate = w_accumulate,
    .scale = w_scale,
    .sumsq = w_sumsq,
    .sum = w_sum,
    .adamw = w_adamw,
    .comm_init = w_comm_init,
    .allreduce = w_allreduce,
    .reduce_scatter = w_reduce_scatter,
    .all_gather = w_all_gather,
    .broadcast = w_broadcast,
    .tensor_stats = w_tensor_stats,
    .host_alloc = w_host_alloc,
    .host_free = w_host_free,
    .to_host_async = w_to_host_async,
    .reduce_start = w_reduce_start,
    .reduce_wait = w_reduce_wait,
    .kv_cache_write = w_kv_cache_write,
    .attention_decode = w_attention_decode,
    .embedding_forward_bf16 = w_embedding_forward_bf16,
    .embedding_forward_fp8 = w_embedding_forward_fp8,
};
/* The first op inner has that the wrapper does not wrap, or -1 (the optional ops stay unset:
 * the graph ops (not recorded, run op by op) and prefetch_l2 (ops synchronized one by one
 * overlap nothing a prefetch could hide)); the names and the count are FP8T_BACKEND_OPS's, which
 * backend.c checks against the struct */
static int first_unwrapped(const fp8t_backend *inner) {
    for (int i = 0; i < fp8t_backend_op_count(); i++)
        if (fp8t_backend_op(inner->ops, i) && !fp8t_backend_op(&wrapper_ops, i) &&
            !fp8t_backend_op_optional(i))
            return i;
    return -1;
}

fp8t_backend *fp8t_profile_wrap(fp8t_backend *inner) {
    if (!inner) return NULL;
    const int u = first_unwrapped(inner);
    if (u >= 0) {
        fp8t_warnf("profile: op '%s' of the %s backend is not wrapped", fp8t_backend_op_name(u),
                   inner->name);
        return NULL;
    }
    profiler *p = calloc(1, sizeof(*p));
    fp8t_backend *b = calloc(1, sizeof(*b));
    if (!p || !b) {
        free(p);
        free(b);
        return NULL;
    }
    p->inner = inner;
    b->ops = &wrapper_ops;
    b->name = inner->name; /* the model keys nothing on the name; queries go to the inner one */
    b->fp8_wants_transpose = inner->fp8_wants_transpose;
    b->fp8_block_native = inner->fp8_block_native;
    b->impl = p;
    return b;
}

fp8t_backend *fp8t_profile_inner(fp8t_backend *w) { return w ? in(w) : NULL; }

void fp8t_profile_reset(fp8t_backend *w) {
    profiler *p = prof(w);
    memset(p->calls, 0, sizeof(p->calls));
    memset(p->seconds, 0, sizeof(p->seconds));
    memset(p->flops, 0, sizeof(p->flops));
    p->n_shapes = 0;
}

static const profiler *sort_ctx;
static int by_op_time(const void *a, const void *b) {
    double ta = sort_ctx->seconds[*(const int *)a], tb = sort_ctx->seconds[*(const int *)b];
    return ta < tb ? 1 : ta > tb ? -1 : 0;
}
static int by_shape_time(const void *a, const void *b) {
    double ta = ((const shape_stat *)a)->seconds, tb = ((const shape_stat *)b)->seconds;
    return ta < tb ? 1 : ta > tb ? -1 : 0;
}

void fp8t_profile_report(fp8t_backend *w, FILE *out, int steps) {
    profiler *p = prof(w);
    if (steps < 1) steps = 1;
    int order[P_COUNT];
    double total = 0;
    for (int i = 0; i < P_COUNT; i++) order[i] = i, total += p->seconds[i];
    sort_ctx = p;
    qsort(order, P_COUNT, sizeof(int), by_op_time);
    fprintf(out, "per-op time (device synchronized around each op), %d step(s), %.1f ms/step\n",
            steps, 1e3 * total / steps);
    fprintf(out, "  %-30s %8s %12s %7s %10s\n", "op", "calls", "ms/step", "share", "TFLOP/s");
    for (int j = 0; j < P_COUNT; j++) {
        int i = order[j];
        if (!p->calls[i]) continue;
        char name[48];
        fprintf(out, "  %-30s %8ld %12.3f %6.1f%%", op_name(i, name, sizeof(name)), p->calls[i],
                1e3 * p->seconds[i] / steps, total > 0 ? 100.0 * p->seconds[i] / total : 0.0);
        if (p->flops[i] > 0 && p->seconds[i] > 0)
            fprintf(out, " %10.1f", p->flops[i] / p->seconds[i] / 1e12);
        fputc('\n', out);
    }
    qsort(p->shapes, (size_t)p->n_shapes, sizeof(shape_stat), by_shape_time);
    if (p->n_shapes) {
        fprintf(out, "  GEMM shapes (C[M,N] = op(A)[M,K] op(B)[K,N]), most expensive first\n");
        fprintf(out, "  %-10s %7s %7s %7s %3s %6s %12s %10s\n", "precision", "M", "N", "K", "tr",
                "calls", "ms/step", "TFLOP/s");
    }
    for (int i = 0; i < p->n_shapes && i < 12; i++) {
        const shape_stat *s = &p->shapes[i];
        fprintf(out, "  %-10s %7d %7d %7d %c%c %6ld %12.3f %10.1f\n", op_names[s->op] + 5, s->M,
                s->N, s->K, s->transA ? 'T' : 'N', s->transB ? 'T' : 'N', s->calls,
                1e3 * s->seconds / steps, s->seconds > 0 ? s->flops / s->seconds / 1e12 : 0.0);
    }
}
