/* CPU backend: the data-parallel collectives. The CPU backend's device memory is host memory,
 * so the ops hand their buffers to the MPI layer (src/backend/dist.c) directly. */
#include <stdio.h>
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

/* The buckets: MPI's non-blocking collectives (src/backend/dist.c), waited in reduce_wait.
 * Host memory is device memory, so the backward's next ops (on other buffers) run while MPI
 * holds x. BF16: x is rounded into a copy now and widened back after the wait, the rounding
 * and the sums those of cpu_allreduce. */
void cpu_reduce_start(fp8t_backend *b, float *x, size_t n, const size_t *counts, int bf16) {
    cpu_state *s = cpu_of(b);
    if (!n) return;
    if (counts) {
        fp8t_dist_ireduce_scatter_f32(x, counts);
        return;
    }
    if (!bf16) {
        fp8t_dist_iallreduce_sum_f32(x, n);
        return;
    }
    if (s->n_bf16_pending == s->cap_bf16_pending) {
        int cap = s->cap_bf16_pending ? 2 * s->cap_bf16_pending : 16;
        struct cpu_bf16_pending *p = realloc(s->bf16_pending, (size_t)cap * sizeof(*p));
        if (!p) FP8T_FATAL("out of memory");
        s->bf16_pending = p, s->cap_bf16_pending = cap;
    }
    uint16_t *h = CPU_ZALLOC(n * sizeof(uint16_t) + 1);
    bf16_encode_n(h, x, n);
    s->bf16_pending[s->n_bf16_pending++] = (struct cpu_bf16_pending){x, h, n};
    fp8t_dist_iallreduce_bf16(h, n);
}

void cpu_reduce_wait(fp8t_backend *b) {
    cpu_state *s = cpu_of(b);
    fp8t_dist_wait();
    for (int i = 0; i < s->n_bf16_pending; i++) {
        struct cpu_bf16_pending *p = &s->bf16_pending[i];
        bf16_decode_n(p->x, p->h, p->n);
        free(p->h);
    }
    s->n_bf16_pending = 0;
}
