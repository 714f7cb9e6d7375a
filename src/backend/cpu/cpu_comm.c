/* CPU backend: the data-parallel collectives. The CPU backend's device memory is host memory,
 * so the ops hand their buffers to the MPI layer (src/backend/dist.c) directly. */
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"

int cpu_comm_init(fp8t_backend *b, char *err, size_t errlen) {
    (void)b;
    return fp8t_dist_init(err, errlen);
}

void cpu_allreduce(fp8t_backend *b, float *x, size_t n, fp8t_reduce_op op, int bf16) {
    (void)b;
    if (!bf16 || op != FP8T_RED_SUM) {
        fp8t_dist_allreduce_f32(x, n, op);
        return;
    }
    uint16_t *h = CPU_ZALLOC(n * sizeof(uint16_t) + 1);
    bf16_encode_n(h, x, n);
    fp8t_dist_allreduce_bf16(h, n);
    bf16_decode_n(x, h, n);
    free(h);
}

void cpu_reduce_scatter(fp8t_backend *b, float *x, const size_t *counts) {
    (void)b;
    fp8t_dist_reduce_scatter_f32(x, counts);
}

void cpu_all_gather(fp8t_backend *b, float *x, const size_t *counts) {
    (void)b;
    fp8t_dist_allgather_f32(x, counts);
}

void cpu_broadcast(fp8t_backend *b, void *x, size_t bytes, int root) {
    (void)b;
    fp8t_dist_bcast(x, bytes, root);
}
