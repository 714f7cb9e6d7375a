/* fp8train — per-op time profile of a backend.
 *
 * fp8t_profile_wrap returns a backend that forwards every op to `inner` and times it: it waits
 * for the device before and after each op, so the times are exact per op but the run is slower
 * than an unprofiled one (launch latency is no longer hidden). For finding where a training
 * step's time goes (`gpu_bench --profile`), not for production runs.
 *
 * Ownership: the wrapper owns inner; fp8t_backend_destroy(wrapper) destroys both. */
#ifndef FP8TRAIN_PROFILE_H
#define FP8TRAIN_PROFILE_H

#include <stdio.h>

#include "fp8train/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NULL if out of memory (inner is then left alone). */
fp8t_backend *fp8t_profile_wrap(fp8t_backend *inner);
/* The wrapped backend (for backend-specific queries such as fp8t_cuda_memory_info). */
fp8t_backend *fp8t_profile_inner(fp8t_backend *wrapper);
/* Forget the times recorded so far (e.g. after warm-up steps). */
void fp8t_profile_reset(fp8t_backend *wrapper);
/* Table of ops sorted by total time: calls, ms per step (total / steps), share of the total,
 * and for GEMMs the achieved TFLOP/s, then the 12 most expensive GEMM shapes. */
void fp8t_profile_report(fp8t_backend *wrapper, FILE *out, int steps);

#ifdef __cplusplus
}
#endif
#endif
