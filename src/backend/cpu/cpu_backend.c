/* CPU backend — memory, scratch buffers, the op table, create/destroy.
 * "Device" memory is host memory: 64-byte aligned (whole cache lines, aligned SIMD loads) and
 * zeroed, like the CUDA backend's cudaMalloc + memset. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

void *cpu_alloc_or_die(size_t bytes, const char *file, int line) {
    /* aligned_alloc wants a nonzero size that is a multiple of the alignment */
    size_t padded = bytes == 0 ? 64 : (bytes + 63) & ~(size_t)63;
    void *p = padded >= bytes ? aligned_alloc(64, padded) : NULL; /* padded < bytes: overflow */
    if (!p) {
        fp8t_fatal(file, line, "out of memory allocating %zu bytes", bytes);
    }
    memset(p, 0, padded);
    return p;
}

void *cpu_scratch(fp8t_backend *b, int slot, size_t bytes) {
    cpu_state *s = cpu_of(b);
    if (s->scratch_bytes[slot] < bytes) {
        free(s->scratch[slot]);
        /* grow geometrically so a sequence of slightly larger requests does not thrash */
        size_t want = bytes + bytes / 4;
        s->scratch[slot] = CPU_ZALLOC(want);
        s->scratch_bytes[slot] = want;
    }
    return s->scratch[slot];
}

/* ---- memory ops ---- */

static void *cpu_malloc(fp8t_backend *b, size_t bytes) {
    (void)b;
    return CPU_ZALLOC(bytes);
}

static void cpu_free(fp8t_backend *b, void *p) {
    (void)b;
    free(p);
}

static void cpu_to_device(fp8t_backend *b, void *dst, const void *src_host, size_t bytes) {
    (void)b;
    if (bytes) memmove(dst, src_host, bytes);
}

static void cpu_to_host(fp8t_backend *b, void *dst_host, const void *src, size_t bytes) {
    (void)b;
    if (bytes) memmove(dst_host, src, bytes);
}

static void cpu_copy(fp8t_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    if (bytes) memmove(dst, src, bytes);
}

static void cpu_zero(fp8t_backend *b, void *dst, size_t bytes) {
    (void)b;
    if (bytes) memset(dst, 0, bytes);
}

static void cpu_synchronize(fp8t_backend *b) { (void)b; /* every op is synchronous */ }

static void cpu_destroy(fp8t_backend *b) {
    if (!b) return;
    cpu_state *s = cpu_of(b);
    if (s) {
        for (int i = 0; i < CPU_SCRATCH_COUNT; i++) free(s->scratch[i]);
        free(s->rope);
        cpu_reduce_wait(b); /* nothing is in flight after a step; a stray start is finished */
        free(s->bf16_pending);
        free(s);
    }
    free(b);
}

/* The reference implementation: device memory is host memory here. */
static void cpu_tensor_stats(fp8t_backend *b, fp8t_stats_raw *out, const float *x, int rows,
                             int cols, const fp8t_stats_req *req) {
    (void)b;
    fp8t_stats_raw_compute(out, x, rows, cols, req);
}

/* Host memory is all the CPU has: pinned buffers are plain ones, an async copy is a copy. */
static void *cpu_host_alloc(fp8t_backend *b, size_t bytes) {
    (void)b;
    return CPU_ZALLOC(bytes ? bytes : 1);
}

static void cpu_host_free(fp8t_backend *b, void *p) {
    (void)b;
    free(p);
}

static void cpu_to_host_async(fp8t_backend *b, void *dst_host, const void *src, size_t bytes) {
    (void)b;
    if (bytes) memcpy(dst_host, src, bytes);
}

const fp8t_backend_ops cpu_backend_ops = {
    .malloc = cpu_malloc,
    .free = cpu_free,
    .to_device = cpu_to_device,
    .to_host = cpu_to_host,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .synchronize = cpu_synchronize,
    .destroy = cpu_destroy,
    .gemm_f32 = cpu_gemm_f32,
    .gemm_bf16 = cpu_gemm_bf16,
    .gemm_bf16_rounded = cpu_gemm_bf16_rounded,
    .gemm_fp8 = cpu_gemm_fp8,
    .gemm_tn_bf16_out = cpu_gemm_tn_bf16_out,
    .amax = cpu_amax,
    .make_operand = cpu_make_operand,
    .make_operand_fuses = cpu_make_operand_fuses,
    .compute_scale = cpu_compute_scale,
    .fake_quantize = cpu_fake_quantize,
    .block_fake_quantize = cpu_block_fake_quantize,
    .mxfp8_fake_quantize = cpu_mxfp8_fake_quantize,
    .bf16_round = cpu_bf16_round,
    .bf16_pack = cpu_bf16_pack,
    .bf16_unpack = cpu_bf16_unpack,
    .delayed_update = cpu_delayed_update,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .bias_add = cpu_bias_add,
    .bias_backward = cpu_bias_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .gelu_backward_bias = cpu_gelu_backward_bias,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .swiglu_grad = cpu_swiglu_grad,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_saved_bytes = cpu_attention_saved_bytes,
    .softmax_xent = cpu_softmax_xent,
    .softmax_xent_bf16 = cpu_softmax_xent_bf16,
    .add = cpu_add,
    .add_bias = cpu_add_bias,
    .accumulate = cpu_accumulate,
    .scale = cpu_scale,
    .sumsq = cpu_sumsq,
    .sum = cpu_sum,
    .adamw = cpu_adamw,
    .comm_init = cpu_comm_init,
    .allreduce = cpu_allreduce,
    .reduce_scatter = cpu_reduce_scatter,
    .all_gather = cpu_all_gather,
    .broadcast = cpu_broadcast,
    .tensor_stats = cpu_tensor_stats,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .to_host_async = cpu_to_host_async,
    .reduce_start = cpu_reduce_start,
    .reduce_wait = cpu_reduce_wait,
    .kv_cache_write = cpu_kv_cache_write,
    .attention_decode = cpu_attention_decode,
    .embedding_forward_bf16 = cpu_embedding_forward_bf16,
    .embedding_forward_fp8 = cpu_embedding_forward_fp8,
    /* no graphs: the CPU runs every op as it is called */
    .graph_begin = NULL,
    .graph_end = NULL,
    .graph_launch = NULL,
    .graph_destroy = NULL,
    .prefetch_l2 = NULL, /* no device cache to fill */
};

fp8t_backend *fp8t_cpu_backend_create(const fp8t_backend_options *opt, char *err, size_t errlen) {
    (void)opt; /* one attention, no fused or cached paths of its own: nothing to choose */
    (void)err;
    (void)errlen; /* the CPU backend cannot fail short of OOM, which exits with a message */
    fp8t_backend *b = CPU_ZALLOC(sizeof(fp8t_backend));
    cpu_state *s = CPU_ZALLOC(sizeof(cpu_state));
    b->ops = &cpu_backend_ops;
    b->name = "cpu";
    b->fp8_wants_transpose = 0;
    b->fp8_block_native = 0; /* the model keeps the exact block emulation here */
    b->impl = s;
    return b;
}
