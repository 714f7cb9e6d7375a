/* CUDA backend — create/destroy, memory ops, scratch buffers, the op table.
 * Hopper (sm_90a) only: the FP8 GEMMs need its tensor cores, and the build targets it. */
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "backend/cuda/cuda_common.cuh"

#define CUDA_WORKSPACE_BYTES                                                                     \
    ((size_t)32 << 20) /* cuBLASLt workspace (Hopper recommends 32 MiB) */

void *cuda_scratch(fp8t_backend *b, int slot, size_t bytes) {
    cuda_state *s = cuda_of(b);
    if (s->scratch_bytes[slot] < bytes) {
        if (s->capturing) {
            /* growing waits for the stream, which a graph recording cannot do: the recorded
             * step must have run once before at the same sizes (graph_begin's contract) */
            FP8T_FATAL("scratch buffer %d would grow to %zu bytes while a graph "
                       "is recorded; run the step once before recording it",
                       slot, bytes);
        }
        /* the old buffer may still be in use by queued kernels */
        CUDA_CHECK(cudaStreamSynchronize(s->stream));
        if (s->scratch[slot]) {
            CUDA_CHECK(cudaFree(s->scratch[slot]));
            s->bytes_in_use -= s->scratch_bytes[slot];
        }
        /* grow geometrically so slightly larger requests do not thrash */
        size_t want = align_up(bytes + bytes / 4, 256);
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, want);
        if (e != cudaSuccess) {
            size_t free_b = 0, total_b = 0;
            cudaGetLastError();
            cudaMemGetInfo(&free_b, &total_b);
            FP8T_FATAL("out of GPU memory growing scratch buffer %d to %zu bytes (%zu of "
                       "%zu bytes free): use a smaller --batch or model",
                       slot, want, free_b, total_b);
        }
        s->scratch[slot] = p;
        s->scratch_bytes[slot] = want;
        s->scratch_gen++;
        s->bytes_in_use += want;
        if (s->bytes_in_use > s->bytes_peak) s->bytes_peak = s->bytes_in_use;
    }
    return s->scratch[slot];
}

/* ---- memory ops ---- */

/* Allocation sizes are remembered so bytes_in_use stays right; cudaMalloc's own bookkeeping is
 * not queryable per pointer. A small open-addressing table keyed by pointer. */
typedef struct {
    void *p;
    size_t bytes;
} alloc_rec;
static alloc_rec *g_allocs = NULL;
static size_t g_allocs_cap = 0, g_allocs_n = 0;

static size_t alloc_slot(void *p, size_t cap) {
    uintptr_t h = (uintptr_t)p >> 8;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h % cap);
}

static void alloc_insert(void *p, size_t bytes);
static void alloc_grow(void) {
    size_t old_cap = g_allocs_cap;
    alloc_rec *old = g_allocs;
    g_allocs_cap = old_cap ? old_cap * 2 : 1024;
    g_allocs = (alloc_rec *)calloc(g_allocs_cap, sizeof(alloc_rec));
    if (!g_allocs) {
        FP8T_FATAL("out of host memory");
    }
    g_allocs_n = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].p) alloc_insert(old[i].p, old[i].bytes);
    free(old);
}
static void alloc_insert(void *p, size_t bytes) {
    if ((g_allocs_n + 1) * 2 > g_allocs_cap) alloc_grow();
    size_t i = alloc_slot(p, g_allocs_cap);
    while (g_allocs[i].p) i = (i + 1) % g_allocs_cap;
    g_allocs[i].p = p;
    g_allocs[i].bytes = bytes;
    g_allocs_n++;
}
static size_t alloc_remove(void *p) {
    if (!g_allocs_cap) return 0;
    size_t i = alloc_slot(p, g_allocs_cap);
    while (g_allocs[i].p && g_allocs[i].p != p) i = (i + 1) % g_allocs_cap;
    if (!g_allocs[i].p) return 0;
    size_t bytes = g_allocs[i].bytes;
    g_allocs[i].p = NULL;
    g_allocs_n--;
    /* re-insert the rest of the cluster so lookups keep working */
    for (size_t j = (i + 1) % g_allocs_cap; g_allocs[j].p; j = (j + 1) % g_allocs_cap) {
        alloc_rec r = g_allocs[j];
        g_allocs[j].p = NULL;
        g_allocs_n--;
        alloc_insert(r.p, r.bytes);
    }
    return bytes;
}

static void *cuda_malloc(fp8t_backend *b, size_t bytes) {
    cuda_state *s = cuda_of(b);
    /* never hand out NULL, even for 0 bytes; round up so vector loads at the end stay inside */
    size_t padded = align_up(bytes ? bytes : 1, 256);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, padded);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError(); /* clear the sticky-free error state */
        cudaMemGetInfo(&free_b, &total_b);
        FP8T_FATAL("out of GPU memory allocating %zu bytes (%zu of %zu bytes free, %zu in "
                   "use by fp8train): use a smaller --batch, --seq-len or model",
                   bytes, free_b, total_b, s->bytes_in_use);
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, padded, s->stream));
    alloc_insert(p, padded);
    s->bytes_in_use += padded;
    if (s->bytes_in_use > s->bytes_peak) s->bytes_peak = s->bytes_in_use;
    return p;
}

static void cuda_free(fp8t_backend *b, void *p) {
    if (!p) return;
    cuda_state *s = cuda_of(b);
    /* cudaFree waits for the device, so queued kernels that still read p finish first */
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    CUDA_CHECK(cudaFree(p));
    s->bytes_in_use -= alloc_remove(p);
}

static void cuda_to_device(fp8t_backend *b, void *dst, const void *src_host, size_t bytes) {
    if (!bytes) return;
    cuda_state *s = cuda_of(b);
    /* From pageable memory the copy is staged before the call returns, so the caller may reuse
     * src_host at once; it is ordered after every earlier op on the stream. */
    CUDA_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, s->stream));
    if (s->sync_each_op) CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

static void cuda_to_host(fp8t_backend *b, void *dst_host, const void *src, size_t bytes) {
    cuda_state *s = cuda_of(b);
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, s->stream));
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

static void *cuda_host_alloc(fp8t_backend *b, size_t bytes) {
    (void)b;
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        FP8T_FATAL("cannot allocate %zu bytes of pinned host memory (%s): dump fewer "
                   "tensors at once (inspect layers=, tensors=)",
                   bytes, cudaGetErrorString(e));
    }
    return p;
}

static void cuda_host_free(fp8t_backend *b, void *p) {
    if (!p) return;
    /* a copy into p may still be queued */
    CUDA_CHECK(cudaStreamSynchronize(cuda_of(b)->stream));
    CUDA_CHECK(cudaFreeHost(p));
}

/* From pinned memory the copy is a DMA that overlaps the kernels queued after it. */
static void cuda_to_host_async(fp8t_backend *b, void *dst_host, const void *src, size_t bytes) {
    if (!bytes) return;
    cuda_state *s = cuda_of(b);
    CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, s->stream));
    if (s->sync_each_op) CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

static void cuda_copy(fp8t_backend *b, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
    cuda_state *s = cuda_of(b);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s->stream));
    if (s->sync_each_op) CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

static void cuda_zero(fp8t_backend *b, void *dst, size_t bytes) {
    if (!bytes) return;
    cuda_state *s = cuda_of(b);
    CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, s->stream));
    if (s->sync_each_op) CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

static void cuda_synchronize(fp8t_backend *b) {
    cuda_state *s = cuda_of(b);
    cuda_prefetch_join(s);
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    CUDA_CHECK(cudaGetLastError());
}

/* ---- graphs (backend.h): stream capture into a CUDA graph, replayed as one launch ---- */

typedef struct {
    cudaGraphExec_t exec;
    unsigned long scratch_gen; /* the backend's scratch_gen when it was recorded */
} cuda_graph;

static int cuda_graph_begin(fp8t_backend *b) {
    cuda_state *s = cuda_of(b);
    if (s->sync_each_op || s->capturing) return -1; /* a sync per op cannot be recorded */
    cuda_prefetch_join(s); /* a recording cannot wait for work queued before it */
    /* thread-local mode: a call that would wait (from this thread) fails the recording
     * instead of waiting; other threads' work is unaffected */
    if (cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    s->capturing = 1;
    return 0;
}

static void *cuda_graph_end(fp8t_backend *b) {
    cuda_state *s = cuda_of(b);
    if (!s->capturing) return NULL;
    cuda_prefetch_join(s); /* every stream forked in a recording joins it before its end */
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(s->stream, &g);
    s->capturing = 0;
    if (e != cudaSuccess || !g) {
        cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        return NULL;
    }
    cuda_graph *r = (cuda_graph *)calloc(1, sizeof(cuda_graph));
    if (!r) {
        cudaGraphDestroy(g);
        return NULL;
    }
    e = cudaGraphInstantiate(&r->exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        free(r);
        return NULL;
    }
    r->scratch_gen = s->scratch_gen;
    return r;
}

static int cuda_graph_launch(fp8t_backend *b, void *graph) {
    cuda_state *s = cuda_of(b);
    const cuda_graph *r = (const cuda_graph *)graph;
    if (r->scratch_gen != s->scratch_gen) return -1; /* a scratch pointer in it may be freed */
    CUDA_CHECK(cudaGraphLaunch(r->exec, s->stream));
    if (s->sync_each_op) CUDA_CHECK(cudaStreamSynchronize(s->stream));
    return 0;
}

static void cuda_graph_destroy(fp8t_backend *b, void *graph) {
    if (!graph) return;
    /* a replay may still be queued */
    CUDA_CHECK(cudaStreamSynchronize(cuda_of(b)->stream));
    CUDA_CHECK(cudaGraphExecDestroy(((cuda_graph *)graph)->exec));
    free(graph);
}

/* ---- prefetch_l2 (backend.h) ---- */

/* Hopper's bulk L2 prefetch (the TMA unit fetches a span without a thread waiting or a
 * register receiving it): each thread issues spans of PF_SPAN bytes and exits; the transfers go
 * on after the kernel ends. Addresses and sizes are multiples of 16, as the instruction wants
 * (the bytes past the last whole 16 are left: a hint loses nothing). */
#define PF_SPAN (32u << 10)
__global__ void prefetch_l2_kernel(const char *p, size_t bytes) {
    const size_t step = (size_t)gridDim.x * blockDim.x * PF_SPAN;
    for (size_t off = (size_t)(blockIdx.x * blockDim.x + threadIdx.x) * PF_SPAN; off < bytes;
         off += step) {
        const unsigned n = (unsigned)(bytes - off < PF_SPAN ? bytes - off : PF_SPAN);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n)
                     : "memory");
    }
}

void cuda_prefetch_join(cuda_state *s) {
    if (!s->pf_pending) return;
    CUDA_CHECK(cudaStreamWaitEvent(s->stream, s->pf_done, 0));
    s->pf_pending = 0;
}

static void cuda_prefetch_l2(fp8t_backend *b, const void *p, size_t bytes) {
    cuda_state *s = cuda_of(b);
    const uintptr_t a = ((uintptr_t)p + 15) & ~(uintptr_t)15; /* the first whole 16 bytes */
    const uintptr_t e = ((uintptr_t)p + bytes) & ~(uintptr_t)15;
    if (!p || e <= a) return;
    if (!s->pf_stream) { /* first use; not while recording (a decode step runs once first) */
        if (s->capturing) return;
        CUDA_CHECK(cudaStreamCreateWithFlags(&s->pf_stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&s->pf_fork, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&s->pf_done, cudaEventDisableTiming));
    }
    /* forked from the main stream here; the main stream waits for it only at the end of a
     * recording or a synchronize: the kernel may not find an SM free until the GEMM beside it
     * ends, and a wait at the next GEMM would put that delay into every GEMM of the step
     * (bench/RESULTS.md, the twenty-eighth session: -20% decode tokens/s) */
    CUDA_CHECK(cudaEventRecord(s->pf_fork, s->stream));
    CUDA_CHECK(cudaStreamWaitEvent(s->pf_stream, s->pf_fork, 0));
    const size_t n = (size_t)(e - a), spans = (n + PF_SPAN - 1) / PF_SPAN;
    const unsigned blocks = (unsigned)(spans < 8 * 128 ? (spans + 127) / 128 : 8);
    prefetch_l2_kernel<<<blocks, 128, 0, s->pf_stream>>>((const char *)a, n);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventRecord(s->pf_done, s->pf_stream));
    s->pf_pending = 1;
    if (s->sync_each_op) {
        cuda_prefetch_join(s);
        CUDA_CHECK(cudaStreamSynchronize(s->stream));
    }
}

static void cuda_destroy(fp8t_backend *b) {
    if (!b) return;
    cuda_state *s = cuda_of(b);
    if (s) {
        cudaStreamSynchronize(s->stream);
        cuda_comm_destroy(s);
        cuda_attn_cudnn_destroy(s);
        if (s->pf_stream) {
            cudaStreamSynchronize(s->pf_stream);
            cudaStreamDestroy(s->pf_stream);
            cudaEventDestroy(s->pf_fork);
            cudaEventDestroy(s->pf_done);
        }
        for (int i = 0; i < SCR_COUNT; i++)
            if (s->scratch[i]) cudaFree(s->scratch[i]);
        if (s->rope_cos) cudaFree(s->rope_cos);
        if (s->rope_sin) cudaFree(s->rope_sin);
        if (s->workspace) cudaFree(s->workspace);
        if (s->fp8_scales) cudaFree(s->fp8_scales);
        if (s->lt) cublasLtDestroy(s->lt);
        if (s->stream) cudaStreamDestroy(s->stream);
        free(s);
    }
    free(b);
}

/* designated initializers in the struct's order (nvcc rejects them out of order): a reordering
 * of fp8t_backend_ops cannot compile silently wrong, and a forgotten op is refused at create
 * (fp8t_backend_first_unset_op) */
const fp8t_backend_ops cuda_backend_ops = {
    .malloc = cuda_malloc,
    .free = cuda_free,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .synchronize = cuda_synchronize,
    .destroy = cuda_destroy,
    .gemm_f32 = cuda_gemm_f32,
    .gemm_bf16 = cuda_gemm_bf16,
    .gemm_bf16_rounded = cuda_gemm_bf16_rounded,
    .gemm_fp8 = cuda_gemm_fp8,
    .gemm_tn_bf16_out = cuda_gemm_tn_bf16_out,
    .amax = cuda_amax,
    .make_operand = cuda_make_operand,
    .make_operand_fuses = cuda_make_operand_fuses,
    .compute_scale = cuda_compute_scale,
    .fake_quantize = cuda_fake_quantize,
    .block_fake_quantize = cuda_block_fake_quantize,
    .mxfp8_fake_quantize = cuda_mxfp8_fake_quantize,
    .bf16_round = cuda_bf16_round,
    .bf16_pack = cuda_bf16_pack,
    .bf16_unpack = cuda_bf16_unpack,
    .delayed_update = cuda_delayed_update,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .bias_add = cuda_bias_add,
    .bias_backward = cuda_bias_backward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .gelu_backward_bias = cuda_gelu_backward_bias,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .swiglu_grad = cuda_swiglu_grad,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_saved_bytes = cuda_attention_saved_bytes,
    .softmax_xent = cuda_softmax_xent,
    .softmax_xent_bf16 = cuda_softmax_xent_bf16,
    .add = cuda_add,
    .add_bias = cuda_add_bias,
    .accumulate = cuda_accumulate,
    .scale = cuda_scale,
    .sumsq = cuda_sumsq,
    .sum = cuda_sum,
    .adamw = cuda_adamw,
    .comm_init = cuda_comm_init,
    .allreduce = cuda_allreduce,
    .reduce_scatter = cuda_reduce_scatter,
    .all_gather = cuda_all_gather,
    .broadcast = cuda_broadcast,
    .tensor_stats = cuda_tensor_stats,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .to_host_async = cuda_to_host_async,
    .reduce_start = cuda_reduce_start,
    .reduce_wait = cuda_reduce_wait,
    .kv_cache_write = cuda_kv_cache_write,
    .attention_decode = cuda_attention_decode,
    .embedding_forward_bf16 = cuda_embedding_forward_bf16,
    .embedding_forward_fp8 = cuda_embedding_forward_fp8,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .prefetch_l2 = cuda_prefetch_l2,
};

extern "C" fp8t_backend *fp8t_cuda_backend_create(const fp8t_backend_options *opt, char *err,
                                                  size_t errlen) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        fp8t_errorf(
            err, errlen,
            "no CUDA device visible (%s): check nvidia-smi and CUDA_VISIBLE_DEVICES, or use "
            "--device cpu",
            e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0");
        cudaGetLastError();
        return NULL;
    }
    /* one process per GPU: a data-parallel rank takes the GPU of its local rank (0 for a
     * process no launcher started) */
    const int dev = fp8t_dist_get_launch()->local_rank % count;
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
        fp8t_errorf(err, errlen, "cannot query CUDA device %d: %s", dev, cudaGetErrorString(e));
        return NULL;
    }
    if (prop.major != 9) {
        fp8t_errorf(
            err, errlen,
            "CUDA device %d (%s) has compute capability %d.%d; this build of fp8train targets "
            "Hopper (sm_90a: H100/H200) only. Use --device cpu, or rebuild with NVFLAGS for "
            "your GPU (FP8 GEMMs need sm_89 or newer)",
            dev, prop.name, prop.major, prop.minor);
        return NULL;
    }
    e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        fp8t_errorf(err, errlen, "cudaSetDevice(%d) failed: %s", dev, cudaGetErrorString(e));
        return NULL;
    }
    cuda_state *s = (cuda_state *)calloc(1, sizeof(cuda_state));
    fp8t_backend *b = (fp8t_backend *)calloc(1, sizeof(fp8t_backend));
    if (!s || !b) {
        free(s);
        free(b);
        fp8t_errorf(err, errlen, "out of host memory creating the CUDA backend");
        return NULL;
    }
    s->device = dev;
    s->num_sms = prop.multiProcessorCount;
    s->plain = opt->plain != 0;
    /* BF16 tensor-core flash attention by default, as training frameworks run it (4x the FP32
     * tiled kernels on an H200); `tiled` is the exact FP32 reference path */
    s->attn_mode = ATTN_FLASH;
#ifdef FP8T_HAVE_CUDNN
    /* head size 128 through cuDNN's fused attention by default (~2x flash there); any explicit
     * choice but cudnn turns it off; cudnn keeps flash as the fallback */
    s->attn_cudnn = opt->attn == FP8T_ATTN_DEFAULT ? 1 : opt->attn == FP8T_ATTN_CUDNN ? 2 : 0;
#else
    s->attn_cudnn = 0;
    if (opt->attn == FP8T_ATTN_CUDNN)
        fp8t_warnf("attention cudnn: this build has no cuDNN; attention runs the "
                   "flash kernels");
#endif
    switch (opt->attn) {
    case FP8T_ATTN_TILED: s->attn_mode = ATTN_TILED; break;
    case FP8T_ATTN_SIMPLE: s->attn_mode = ATTN_SIMPLE; break;
    case FP8T_ATTN_GEMM: s->attn_mode = ATTN_GEMM; break;
    case FP8T_ATTN_CUDNN:
    case FP8T_ATTN_FLASH:
    case FP8T_ATTN_DEFAULT: s->attn_mode = ATTN_FLASH; break;
    default: /* a value this backend does not know (fp8t_backend_create checked the range) */
        fp8t_errorf(err, errlen, "attention implementation '%s' is not in the CUDA backend",
                    fp8t_attn_impl_name(opt->attn) ? fp8t_attn_impl_name(opt->attn) : "?");
        free(s);
        free(b);
        return NULL;
    }
    if (s->plain) s->attn_mode = ATTN_SIMPLE, s->attn_cudnn = 0;
    s->sync_each_op = opt->sync_each_op != 0;
    s->no_lt_fp8 = opt->no_lt_fp8 != 0;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&s->lt));
    s->workspace_bytes = CUDA_WORKSPACE_BYTES;
    e = cudaMalloc(&s->workspace, s->workspace_bytes);
    if (e != cudaSuccess) {
        fp8t_errorf(err, errlen, "cannot allocate the %zu-byte cuBLASLt workspace on %s: %s",
                    s->workspace_bytes, prop.name, cudaGetErrorString(e));
        cublasLtDestroy(s->lt);
        cudaStreamDestroy(s->stream);
        free(s);
        free(b);
        return NULL;
    }
    CUDA_CHECK(cudaMalloc(&s->fp8_scales, 8 * sizeof(float)));
    s->bytes_in_use = s->bytes_peak = s->workspace_bytes;
    b->ops = &cuda_backend_ops;
    b->name = "cuda";
    b->fp8_wants_transpose = 1; /* Hopper FP8 tensor cores read both operands K-major (TN) */
    /* block-scaled FP8 GEMMs (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / _BLK128x128_32F) exist
     * on Hopper only (Blackwell's cuBLASLt has the MX modes instead) and from cuBLASLt 12.9 */
    b->fp8_block_native = prop.major == 9 && cublasLtGetVersion() >= 120900 && !s->no_lt_fp8;
    b->impl = s;
    return b;
}

/* Device memory accounting for benchmarks (weakly referenced by bench/gpu_bench.c):
 * bytes fp8train holds now and at most so far (params, activations, scratch, workspace), and
 * the device's free/total as cudaMemGetInfo reports. 0 ok, -1 if b is not a CUDA backend. */
extern "C" int fp8t_cuda_memory_info(fp8t_backend *b, size_t *in_use, size_t *peak,
                                     size_t *dev_free, size_t *dev_total) {
    if (!b || !b->name || strcmp(b->name, "cuda") != 0) return -1;
    cuda_state *s = cuda_of(b);
    if (in_use) *in_use = s->bytes_in_use;
    if (peak) *peak = s->bytes_peak;
    size_t f = 0, t = 0;
    CUDA_CHECK(cudaMemGetInfo(&f, &t));
    if (dev_free) *dev_free = f;
    if (dev_total) *dev_total = t;
    return 0;
}
