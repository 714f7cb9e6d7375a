/* fp8train — the training loop: data, AdamW + warmup/cosine schedule, gradient accumulation
 * and clipping, validation, metrics, checkpoints, exact resume, and the debugging features
 * that ride on a run (inspect, detectors, shadow BF16, fault injection). */
#ifndef FP8TRAIN_TRAIN_H
#define FP8TRAIN_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/model.h"
#include "fp8train/policy.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP8T_PATH_MAX 1024

typedef struct {
    /* model */
    char preset[64];         /* --preset (default "tiny") */
    fp8t_model_config model; /* resolved from preset (+ --layers/--dim/... tweaks) */
    /* data */
    char data[FP8T_PATH_MAX];     /* "synthetic" | file.txt (bytes, or via `tokenizer`) | .jsonl
                                   (via `tokenizer`) | 'dir/x_*.bin' (llm.c shards) */
    char val_data[FP8T_PATH_MAX]; /* optional separate validation data; default: held-out split */
    char tokenizer
        [FP8T_PATH_MAX]; /* Hugging Face tokenizer.json for text/JSONL --data ("" = bytes) */
    int batch;           /* B: sequences per micro-batch */
    int seq_len;         /* T */
    int grad_accum;      /* micro-batches per optimizer step */
    int steps;           /* optimizer steps to reach (absolute: a resumed run stops at
                                   the same step an uninterrupted one would) */
    /* optimizer */
    float lr, min_lr_frac; /* peak LR; cosine decays to lr*min_lr_frac at `steps` */
    int warmup;            /* linear warmup steps */
    float weight_decay, beta1, beta2, adam_eps, grad_clip;
    uint64_t seed;
    /* precision */
    fp8t_policy policy;
    /* where */
    char device[16];             /* "cpu" | "cuda" */
    char out_dir[FP8T_PATH_MAX]; /* --out */
    int overwrite;               /* --overwrite: replace the run already in out_dir (its logs and
                                   checkpoints; never files fp8train did not write) */
    int ckpt_every;              /* 0: only at the end */
    int keep_ckpts;              /* keep the last K checkpoints (0 = all) */
    int val_every, val_batches;  /* validation every N steps on val_batches micro-batches */
    char resume[FP8T_PATH_MAX];  /* checkpoint directory to resume from */
    int resume_reset_fp8;        /* on resume, start the FP8 state fresh instead of restoring */
    char init[FP8T_PATH_MAX]; /* --init: weights to start from (any fp8t_weights_load source) */
    int quiet;                /* no progress lines (tests, bisect children) */
    int progress_every;       /* print a progress line every N steps */
    char tensorboard[FP8T_PATH_MAX]; /* --tensorboard DIR: TensorBoard event files; "" = off */
    /* debugging */
    char inspect
        [FP8T_PATH_MAX]; /* --inspect spec (see fp8train/debug.h: fp8t_inspector_create); "" = off */
    char omp_wait_policy[16];     /* OMP_WAIT_POLICY at start, for the banner (not an option) */
    int inspect_dump_mb;          /* --inspect-dump-mb: pinned MiB of dumps in flight (2048) */
    char inject[FP8T_PATH_MAX];   /* --inject spec (see fp8train/inject.h); "" = off */
    char baseline[FP8T_PATH_MAX]; /* --baseline RUN_DIR for the drift detector */
    float drift_threshold;        /* relative loss gap (default 0.01) */
    int spike_window;             /* robust z-score window (default 50) */
    float spike_z;                /* z threshold (default 6) */
    int detect_nan;               /* stop on NaN/Inf and name the first tensor (default 1) */
    int shadow_every;             /* --shadow-every K (0 = off) */
    char shadow_action[64];       /* warn | fallback:M | rollback */
    float shadow_threshold;       /* relative |loss_fp8 - loss_bf16| / loss_bf16 (default 0.02) */
    fp8t_model_options model_opts;     /* --disable: the model's plain paths; --head-chunk */
    fp8t_backend_options backend_opts; /* --cuda-attn, --cuda-sync, --disable cuda-fusion and
                                          cuda-lt-fp8 */
    /* data parallel (mpirun -np N; docs/parallel.md) */
    int zero;           /* 1: ZeRO-1 (AdamW moments sharded across ranks) */
    int dp_bf16_reduce; /* gradient all-reduce in BF16 instead of FP32 */
    int amax_reduce;    /* all-reduce (max) amaxes before the scale update (default 1) */
    int dp_force;       /* the data-parallel path even in one process (checks) */
    float bucket_mb;    /* gradient reduction buckets of at least this many MiB,
                                   started during the backward (default 25; 0: one reduction
                                   after it) */
} fp8t_train_config;

/* Defaults for everything (preset tiny, synthetic data, FP8 delayed policy, ...). */
void fp8t_train_config_default(fp8t_train_config *c);

typedef enum {
    FP8T_STOP_DONE = 0, /* reached `steps` */
    FP8T_STOP_NAN,      /* non-finite loss or tensor; see events.jsonl */
    FP8T_STOP_ERROR,    /* I/O or configuration error; see err */
} fp8t_stop_reason;

typedef struct {
    fp8t_stop_reason reason;
    int last_step;       /* last completed optimizer step */
    float last_loss;     /* training loss of the last step */
    float last_val_loss; /* last validation loss (NaN if none) */
    double tokens_per_s; /* mean over the run */
    int n_events;        /* detector events written */
} fp8t_train_result;

/* Run training per cfg; writes OUT/config.json, OUT/metrics.jsonl, OUT/events.jsonl,
 * OUT/checkpoints/step_NNNNNN/. 0 ok (result filled, also when stopped by a detector),
 * -1 on error with err filled. */
int fp8t_train_run(const fp8t_train_config *cfg, fp8t_train_result *res, char *err,
                   size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
