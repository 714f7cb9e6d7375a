/* CUDA backend: the data-parallel collectives over NCCL, bootstrapped through MPI (rank 0's
 * ncclUniqueId broadcast by fp8t_dist_bcast).
 *
 * Faults: NCCL reports a dead peer or a broken connection asynchronously, or not at all (a
 * collective whose peer was killed just never finishes). So each blocking collective is
 * followed by an event the host polls (the gradient buckets: one event for all of them, at
 * reduce_wait), checking ncclCommGetAsyncError meanwhile, with a timeout
 * (FP8TRAIN_NCCL_TIMEOUT seconds, default 300): on an error or the timeout the communicator is
 * aborted and the rank exits with a message naming the collective, instead of hanging. (The
 * launcher usually ends the job first: mpirun kills every rank when one dies.)
 * Without NCCL (a build where nccl.h was missing) a world of one still works: its collectives
 * are identities (BF16 all-reduce: the rounding). */
#include <math.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_common.cuh"
#include "fp8train/dist.h"
#include "fp8train/error.h"

#ifdef FP8T_HAVE_NCCL
#include <nccl.h>
#endif

/* x -> BF16 (nearest even) and back: the BF16 all-reduce's rounding of its input */
__global__ static void f32_to_bf16_kernel(__nv_bfloat16 *out, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(x[i]);
}
__global__ static void bf16_to_f32_kernel(float *out, const __nv_bfloat16 *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(x[i]);
}

static unsigned grid_for(size_t n) {
    size_t g = (n + 255) / 256;
    return (unsigned)(g > 65535 ? 65535 : (g ? g : 1));
}

#ifdef FP8T_HAVE_NCCL
static ncclComm_t comm_of(cuda_state *s) { return (ncclComm_t)s->nccl; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nccl_fail(cuda_state *s, const char *what, const char *why) {
    /* the communicator first (its abort returns what is queued on it), then the world */
    if (s->nccl) ncclCommAbort(comm_of(s));
    s->nccl = NULL;
    FP8T_FATAL("rank %d: NCCL %s failed: %s; another rank probably died (see its output "
               "above); this rank stops",
               s->comm_rank, what, why);
}

#define NCCL_CHECK(s, what, call)                                                                \
    do {                                                                                         \
        ncclResult_t nccl_r_ = (call);                                                           \
        if (nccl_r_ != ncclSuccess && nccl_r_ != ncclInProgress)                                 \
            nccl_fail((s), (what), ncclGetErrorString(nccl_r_));                                 \
    } while (0)

/* Wait on the host for ev, watching for NCCL's asynchronous errors, with the timeout. */
static void watch_event(cuda_state *s, cudaEvent_t ev, const char *what) {
    const double timeout = fp8t_dist_get_launch()->nccl_timeout_s;
    const double t0 = now_s();
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) CUDA_CHECK(e);
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm_of(s), &async);
        if (async != ncclSuccess && async != ncclInProgress)
            nccl_fail(s, what, ncclGetErrorString(async));
        if (now_s() - t0 > timeout) {
            char why[128];
            snprintf(why, sizeof(why), "no progress for %.0f s (FP8TRAIN_NCCL_TIMEOUT)", timeout);
            nccl_fail(s, what, why);
        }
        struct timespec ts = {0, 50000}; /* 50 us: a step's collectives are milliseconds */
        nanosleep(&ts, NULL);
    }
}

/* Wait for the collective just enqueued on the main stream. */
static void comm_wait(cuda_state *s, const char *what) {
    CUDA_CHECK(cudaEventRecord(s->comm_done, s->stream));
    watch_event(s, s->comm_done, what);
}
#endif

int cuda_comm_init(fp8t_backend *b, char *err, size_t errlen) {
    cuda_state *s = cuda_of(b);
    if (fp8t_dist_init(err, errlen) != 0) return -1;
    s->comm_rank = fp8t_dist_rank();
    s->comm_size = fp8t_dist_size();
#ifdef FP8T_HAVE_NCCL
    if (s->nccl) return 0;
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    ncclResult_t r = ncclSuccess;
    if (s->comm_rank == 0) r = ncclGetUniqueId(&id);
    int ok = r == ncclSuccess;
    fp8t_dist_allreduce_i32(&ok, 1, FP8T_RED_SUM);
    if (ok != s->comm_size) {
        return fp8t_errorf(err, errlen, "ncclGetUniqueId failed on rank 0 (%s)",
                           ncclGetErrorString(r));
    }
    fp8t_dist_bcast(&id, sizeof(id), 0);
    ncclComm_t comm;
    r = ncclCommInitRank(&comm, s->comm_size, id, s->comm_rank);
    if (r != ncclSuccess) {
        return fp8t_errorf(err, errlen,
                           "ncclCommInitRank (rank %d of %d, GPU %d) failed: %s; NCCL_DEBUG=INFO "
                           "says more",
                           s->comm_rank, s->comm_size, s->device, ncclGetErrorString(r));
    }
    s->nccl = comm;
    CUDA_CHECK(cudaEventCreateWithFlags(&s->comm_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->bucket_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->buckets_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->comm_stream, cudaStreamNonBlocking));
    return 0;
#else
    if (s->comm_size > 1) {
        return fp8t_errorf(
            err, errlen,
            "this fp8train was built without NCCL (nccl.h not found under "
            "CUDA_HOME), so the CUDA backend cannot join %d ranks: install NCCL and rebuild, "
            "or use --device cpu",
            s->comm_size);
    }
    return 0;
#endif
}

void cuda_comm_destroy(cuda_state *s) {
#ifdef FP8T_HAVE_NCCL
    if (s->nccl) {
        if (s->comm_stream) cudaStreamSynchronize(s->comm_stream);
        ncclCommDestroy(comm_of(s));
        cudaEventDestroy(s->comm_done);
        cudaEventDestroy(s->bucket_ready);
        cudaEventDestroy(s->buckets_done);
        if (s->comm_stream) cudaStreamDestroy(s->comm_stream);
        if (s->bucket_bf16) cudaFree(s->bucket_bf16);
        s->comm_stream = NULL;
        s->bucket_bf16 = NULL;
        s->nccl = NULL;
    }
#else
    (void)s;
#endif
}

void cuda_allreduce(fp8t_backend *b, float *x, size_t n, fp8t_reduce_op op, int bf16) {
    cuda_state *s = cuda_of(b);
    if (!n) return;
    const int bf = bf16 && op == FP8T_RED_SUM;
    __nv_bfloat16 *h = NULL;
    if (bf) {
        h = (__nv_bfloat16 *)cuda_scratch(b, SCR_GEMM_A, n * sizeof(__nv_bfloat16));
        f32_to_bf16_kernel<<<grid_for(n), 256, 0, s->stream>>>(h, x, n);
        CUDA_LAUNCH_CHECK(s);
    }
#ifdef FP8T_HAVE_NCCL
    if (s->nccl) {
        /* ncclMax on floats may drop a NaN where the CPU backend keeps it; every rank still
         * gets the same value, and a NaN loss stops the run before the scale update anyway */
        NCCL_CHECK(s, "all-reduce",
                   ncclAllReduce(bf ? (const void *)h : (const void *)x,
                                 bf ? (void *)h : (void *)x, n, bf ? ncclBfloat16 : ncclFloat,
                                 op == FP8T_RED_MAX ? ncclMax : ncclSum, comm_of(s), s->stream));
        comm_wait(s, "all-reduce");
    }
#endif
    if (bf) {
        bf16_to_f32_kernel<<<grid_for(n), 256, 0, s->stream>>>(x, h, n);
        CUDA_LAUNCH_CHECK(s);
    }
}

void cuda_reduce_scatter(fp8t_backend *b, float *x, const size_t *counts) {
    cuda_state *s = cuda_of(b);
#ifdef FP8T_HAVE_NCCL
    if (!s->nccl || s->comm_size <= 1) return;
    /* uneven shards: one reduce per rank's range, rooted at that rank, in one group (NCCL's
     * reduce-scatter wants equal counts) */
    size_t off = 0;
    NCCL_CHECK(s, "reduce-scatter", ncclGroupStart());
    for (int r = 0; r < s->comm_size; r++) {
        if (counts[r])
            NCCL_CHECK(s, "reduce-scatter",
                       ncclReduce(x + off, x + off, counts[r], ncclFloat, ncclSum, r, comm_of(s),
                                  s->stream));
        off += counts[r];
    }
    NCCL_CHECK(s, "reduce-scatter", ncclGroupEnd());
    comm_wait(s, "reduce-scatter");
#else
    (void)s, (void)x, (void)counts;
#endif
}

void cuda_all_gather(fp8t_backend *b, float *x, const size_t *counts) {
    cuda_state *s = cuda_of(b);
#ifdef FP8T_HAVE_NCCL
    if (!s->nccl || s->comm_size <= 1) return;
    size_t off = 0;
    NCCL_CHECK(s, "all-gather", ncclGroupStart());
    for (int r = 0; r < s->comm_size; r++) {
        if (counts[r])
            NCCL_CHECK(
                s, "all-gather",
                ncclBroadcast(x + off, x + off, counts[r], ncclFloat, r, comm_of(s), s->stream));
        off += counts[r];
    }
    NCCL_CHECK(s, "all-gather", ncclGroupEnd());
    comm_wait(s, "all-gather");
#else
    (void)s, (void)x, (void)counts;
#endif
}

void cuda_broadcast(fp8t_backend *b, void *x, size_t bytes, int root) {
    cuda_state *s = cuda_of(b);
#ifdef FP8T_HAVE_NCCL
    if (!s->nccl || s->comm_size <= 1 || !bytes) return;
    NCCL_CHECK(s, "broadcast",
               ncclBroadcast(x, x, bytes, ncclUint8, root, comm_of(s), s->stream));
    comm_wait(s, "broadcast");
#else
    (void)s, (void)x, (void)bytes, (void)root;
#endif
}

/* The gradient buckets. Each is enqueued on comm_stream behind an event recorded on the main
 * stream where the backward has finished its layers, so NCCL moves it while the backward's
 * next layers compute; nothing on the host waits per bucket. The main stream waits for all of
 * them at reduce_wait (an event, before the gradient norm), and that is also where the host
 * watches NCCL's asynchronous error and the timeout, once per step (a dead peer shows there:
 * the buckets never finish). */
void cuda_reduce_start(fp8t_backend *b, float *x, size_t n, const size_t *counts, int bf16) {
    cuda_state *s = cuda_of(b);
    if (!n) return;
#ifdef FP8T_HAVE_NCCL
    if (s->nccl) {
        if (counts && s->comm_size <= 1) return; /* as cuda_reduce_scatter: the identity */
        const int bf = bf16 && !counts;
        __nv_bfloat16 *h = NULL;
        if (bf && s->bucket_bf16_used + n > s->bucket_bf16_cap) {
            /* grows in the first step only: the buckets before this one are finished first
             * (their copies are no longer read), so the new buffer starts empty */
            CUDA_CHECK(cudaStreamSynchronize(s->comm_stream));
            if (s->bucket_bf16) CUDA_CHECK(cudaFree(s->bucket_bf16));
            size_t cap = 2 * s->bucket_bf16_cap > n ? 2 * s->bucket_bf16_cap : n;
            CUDA_CHECK(cudaMalloc((void **)&s->bucket_bf16, cap * sizeof(__nv_bfloat16)));
            s->bucket_bf16_cap = cap;
            s->bucket_bf16_used = 0;
        }
        CUDA_CHECK(cudaEventRecord(s->bucket_ready, s->stream));
        CUDA_CHECK(cudaStreamWaitEvent(s->comm_stream, s->bucket_ready, 0));
        s->buckets_pending = 1;
        if (bf) {
            h = s->bucket_bf16 + s->bucket_bf16_used;
            s->bucket_bf16_used += n;
            f32_to_bf16_kernel<<<grid_for(n), 256, 0, s->comm_stream>>>(h, x, n);
            CUDA_CHECK(cudaGetLastError());
            NCCL_CHECK(s, "gradient bucket all-reduce",
                       ncclAllReduce(h, h, n, ncclBfloat16, ncclSum, comm_of(s), s->comm_stream));
            bf16_to_f32_kernel<<<grid_for(n), 256, 0, s->comm_stream>>>(x, h, n);
            CUDA_CHECK(cudaGetLastError());
        } else if (!counts) {
            NCCL_CHECK(s, "gradient bucket all-reduce",
                       ncclAllReduce(x, x, n, ncclFloat, ncclSum, comm_of(s), s->comm_stream));
        } else { /* uneven parts: one reduce per rank's part, as cuda_reduce_scatter */
            size_t off = 0;
            NCCL_CHECK(s, "gradient bucket reduce-scatter", ncclGroupStart());
            for (int r = 0; r < s->comm_size; r++) {
                if (counts[r])
                    NCCL_CHECK(s, "gradient bucket reduce-scatter",
                               ncclReduce(x + off, x + off, counts[r], ncclFloat, ncclSum, r,
                                          comm_of(s), s->comm_stream));
                off += counts[r];
            }
            NCCL_CHECK(s, "gradient bucket reduce-scatter", ncclGroupEnd());
        }
        return;
    }
#endif
    /* no communicator (a build without NCCL, a world of one): what the blocking ops do */
    if (!counts) cuda_allreduce(b, x, n, FP8T_RED_SUM, bf16);
}

void cuda_reduce_wait(fp8t_backend *b) {
    cuda_state *s = cuda_of(b);
#ifdef FP8T_HAVE_NCCL
    if (!s->buckets_pending) return;
    CUDA_CHECK(cudaEventRecord(s->buckets_done, s->comm_stream));
    CUDA_CHECK(cudaStreamWaitEvent(s->stream, s->buckets_done, 0));
    s->buckets_pending = 0;
    s->bucket_bf16_used = 0; /* the next step's copies are enqueued after this wait */
    watch_event(s, s->buckets_done, "gradient buckets");
    if (s->sync_each_op) CUDA_CHECK(cudaStreamSynchronize(s->stream));
#else
    (void)s;
#endif
}
