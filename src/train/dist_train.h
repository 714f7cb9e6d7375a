/* The trainer's data-parallel part (dist_train.c): which micro-batches of the global batch a
 * rank runs, the gradient and amax all-reduces, ZeRO-1's sharded AdamW, the gathers a
 * checkpoint needs, and the agreement of all ranks on losses, NaN stops and errors.
 * With one process and no --dp-force none of it runs a collective: the plain path. */
#ifndef FP8TRAIN_DIST_TRAIN_H
#define FP8TRAIN_DIST_TRAIN_H

#include <stddef.h>

#include "fp8train/checkpoint.h"
#include "fp8train/train.h"

typedef struct dp_state {
    int rank, size;
    int active; /* collectives run: size > 1 or --dp-force */
    int zero;   /* ZeRO-1 */
    int bf16_reduce, amax_reduce;
    int first_micro, n_micro;  /* this rank's micro-batches of the step: [first, first + n) */
    size_t *counts;            /* [size] parameter shard sizes (floats) */
    size_t shard_lo, shard_hi; /* this rank's shard [lo, hi) */
    float *m_shard, *v_shard;  /* ZeRO-1: the AdamW moments of the shard (device) */
    float *scalar;             /* device scratch float (sumsq) */
    float *losses;             /* [accum] host: every micro-batch loss of the step */
    /* --bucket-mb: the gradient reduction in buckets of whole layers, started by the last
     * micro-batch's backward as it finishes them (fp8t_model_set_grads_ready), in the same
     * order on every rank: from the end of the parameter table (the head) to its start */
    double bucket_bytes; /* 0: one reduction after the backward */
    struct dp_bucket {
        size_t lo, hi;  /* the gradients [lo, hi) */
        int layer;      /* final once the backward reports this layer */
        size_t *counts; /* ZeRO-1: [size] each rank's part of [lo, hi) (its shard's) */
    } * buckets;
    int n_buckets, next_bucket;
    int started;      /* this step's buckets are under way: wait before reading grads */
    fp8t_backend *be; /* for the grads_ready callback */
    float *grads;
    int inspect_all;                  /* --inspect ranks=all */
    char inspect_spec[FP8T_PATH_MAX]; /* --inspect without ranks= (the inspector's spec) */
} dp_state;

/* Before the backend exists: join the world (MPI), check the batch split (grad_accum a
 * multiple of the world size), parse the inspect spec's ranks= (inspect_spec: the rest).
 * Ranks other than 0 turn quiet. 0 ok, -1 with err. */
int dp_setup(dp_state *d, fp8t_train_config *cfg, char *err, size_t errlen);
/* After the model exists: the backend joins the world, the shards, ZeRO's moments. */
int dp_attach(dp_state *d, fp8t_backend *be, fp8t_model *m, const fp8t_model_config *mc,
              char *err, size_t errlen);
void dp_free(dp_state *d, fp8t_backend *be);
/* Every rank's rc agreed on: the worst (non-zero) wins; a rank whose rc was fine while another
 * failed gets err saying which rank failed. Returns the agreed rc. */
int dp_agree(dp_state *d, int rc, char *err, size_t errlen);
/* The step's micro-batch losses from every rank (losses[j] for j in this rank's range are
 * given; NaN marks one not run); afterwards d->losses holds all accum of them. */
void dp_gather_losses(dp_state *d, int accum);
/* Buckets (--bucket-mb): before the backward of this rank's last micro-batch, which then
 * starts each bucket's reduction as soon as it has finished its layers. */
void dp_grads_arm(dp_state *d, fp8t_model *m);
/* After the micro-batches: every bucket not started yet is started (a backward that was cut
 * short or skipped on a NaN loss still takes part: every rank starts the same reductions). */
void dp_grads_flush(dp_state *d, fp8t_model *m);
/* The started buckets finished (before anything reads or writes the gradients again). */
void dp_grads_wait(dp_state *d);
/* Gradient all-reduce (or reduce-scatter with ZeRO-1), or the wait for the buckets that did
 * it, and the global gradient norm (waits). */
float dp_grad_norm(dp_state *d, fp8t_backend *be, fp8t_model *m);
/* AdamW (plain: the model's; ZeRO-1: the shard, then the all-gather of the weights). */
void dp_adamw(dp_state *d, fp8t_backend *be, fp8t_model *m, float lr, float beta1, float beta2,
              float eps, float weight_decay, int t, float grad_clip, float grad_norm);
/* Before the scale update: amax MAX over ranks (slot 0 of every tensor's history). */
void dp_reduce_amax(dp_state *d, fp8t_backend *be, fp8t_model *m);
/* The parameters [lo, hi) whose AdamW moments this rank holds: all n, or its ZeRO-1 shard
 * (known after dp_setup: a resume loads only these from the checkpoint). */
void dp_moment_range(const dp_state *d, size_t n, size_t *lo, size_t *hi);
/* This rank's AdamW moments (dp_moment_range) into host buffers of that many floats. */
void dp_adam_to_host(dp_state *d, fp8t_backend *be, fp8t_model *m, float *adam_m, float *adam_v);
/* The moments from a checkpoint's buffers, which hold parameters from lo on: all of them, or
 * (ZeRO-1) a range holding this rank's shard, which it takes (resharding on load). */
void dp_adam_to_device(dp_state *d, fp8t_backend *be, fp8t_model *m, const float *adam_m,
                       const float *adam_v, size_t lo);
/* A float / string from root to every rank. */
float dp_bcast_float(dp_state *d, float x, int root);
/* The first non-empty `where` over ranks in rank order (= micro-batch order), prefixed with its
 * rank when there are several; into where. */
void dp_first_where(dp_state *d, char *where, size_t len);
/* A line for the banner ("" in a world of one without --dp-force). */
void dp_describe(const dp_state *d, char *buf, size_t len);

#endif
