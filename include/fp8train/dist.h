/* fp8train — the process group of a data-parallel run (MPI), and its host-side collectives.
 *
 * One process per device: `mpirun -np N fp8train train ...` starts N ranks. A process that no
 * launcher started is a world of one and never touches MPI, so a plain run behaves exactly as
 * before. The gradient and weight collectives themselves go through the backend op table
 * (MPI on the CPU backend, NCCL on the CUDA backend, see backend.h); the functions here carry
 * the control plane: losses, flags, NaN reports, the NCCL unique id.
 * Every rank must call the collectives in the same order. */
#ifndef FP8TRAIN_DIST_H
#define FP8TRAIN_DIST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FP8T_RED_SUM = 0, FP8T_RED_MAX = 1 } fp8t_reduce_op;

/* Did this build link MPI? */
int fp8t_dist_have_mpi(void);
/* What the launcher announced (its environment is read by the option layer,
 * fp8t_options_launch in train_options.h): the world size and this process's local rank, 1 / 0
 * without a launcher, and how long a collective may wait before the job is aborted. */
typedef struct {
    int size;
    int local_rank;
    double nccl_timeout_s; /* CUDA backend: a collective unfinished after this aborts (300) */
} fp8t_dist_launch;
/* Set once, before fp8t_dist_init and before a CUDA backend is created (which takes the GPU of
 * the local rank). Without it: a world of one, local rank 0, 300 s. */
void fp8t_dist_set_launch(const fp8t_dist_launch *l);
const fp8t_dist_launch *fp8t_dist_get_launch(void);
/* Join the job (MPI_Init_thread on the first call; finalized at exit). A world of one without
 * a launcher does not initialize MPI. 0 ok; -1 with err naming the cause and the fix (e.g. a
 * build without MPI started by mpirun with N > 1). */
int fp8t_dist_init(char *err, size_t errlen);
int fp8t_dist_rank(void); /* 0 before init */
int fp8t_dist_size(void); /* 1 before init */

/* Host collectives over the world (no-ops for a world of one). */
void fp8t_dist_barrier(void);
void fp8t_dist_bcast(void *buf, size_t bytes, int root);
/* all[r * bytes_each ...] = rank r's mine */
void fp8t_dist_allgather(const void *mine, void *all, size_t bytes_each);
/* x = op over ranks, in place; MAX propagates NaN (the amax semantics) */
void fp8t_dist_allreduce_f32(float *x, size_t n, fp8t_reduce_op op);
void fp8t_dist_allreduce_i32(int *x, size_t n, fp8t_reduce_op op);
/* BF16 values (raw bits) summed in FP32 and rounded back to BF16 (nearest even) per addition */
void fp8t_dist_allreduce_bf16(uint16_t *x, size_t n);
/* In place over x[sum(counts)]: rank r's range [offset_r, offset_r + counts[r]) (offset_r =
 * sum of the counts before r) receives the sum over ranks of that range; the rest of x is
 * undefined afterwards. */
void fp8t_dist_reduce_scatter_f32(float *x, const size_t *counts);
/* In place: every rank receives every rank's range of x (the ranges as above). */
void fp8t_dist_allgather_f32(float *x, const size_t *counts);
/* Non-blocking sums (the gradient buckets overlapped with the backward): started now, in
 * place, finished by fp8t_dist_wait; x must not be touched until then. Every rank starts the
 * same sequence. The results are those of the blocking calls above, bit for bit. */
void fp8t_dist_iallreduce_sum_f32(float *x, size_t n);
void fp8t_dist_iallreduce_bf16(uint16_t *x, size_t n);
void fp8t_dist_ireduce_scatter_f32(float *x, const size_t *counts);
/* Wait for every sum started above (reduce-scatter: each rank's range in place, as
 * fp8t_dist_reduce_scatter_f32 leaves it). */
void fp8t_dist_wait(void);
/* End every rank now (a rank that cannot go on while the others wait in a collective). */
void fp8t_dist_abort(int code);

#ifdef __cplusplus
}
#endif
#endif
