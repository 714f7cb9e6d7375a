/* fp8train — training checkpoints.
 *
 * A checkpoint is a directory OUT/checkpoints/step_NNNNNN/ holding
 *   model.safetensors      FP32 master weights, one tensor per fp8t_model_param_table entry
 *   optimizer.safetensors  AdamW moments "exp_avg.<name>", "exp_avg_sq.<name>" (FP32) and
 *                          "step" (I64 [1])
 *   fp8_meta.safetensors   "recipe_state": the flat FP8 recipe state (fp8t_recipe_state layout),
 *                          with metadata n and history_len
 *   state.json             format/version, step, data position, seed, model config, the run's
 *                          resolved config and the policy at that step
 * It is written into a hidden temporary directory next to its final name and renamed, so a
 * crash never leaves a half checkpoint under a step_* name. Loading checks every file and
 * names the file and the fix on any problem. */
#ifndef FP8TRAIN_CHECKPOINT_H
#define FP8TRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP8T_CKPT_VERSION 1

typedef struct {
    int step;                 /* optimizer steps completed */
    uint64_t data_position;   /* training stream position (micro-batches consumed) */
    uint64_t seed;            /* the run's seed (data order, init) */
    float loss;               /* training loss of `step` */
    fp8t_model_config model;
    size_t num_params;
    float *params;            /* [num_params] FP32 master weights (host) */
    float *adam_m, *adam_v;   /* [num_params] AdamW moments (host) */
    int fp8_n, fp8_len;       /* recipe state: n tensors, history length */
    float *fp8_state;         /* [(fp8_len + 3) * fp8_n] (host) */
    char *config_json;        /* the run's resolved config (JSON object text), may be NULL */
    char *policy_json;        /* fp8t_policy_to_json of the policy at this step, may be NULL */
} fp8t_checkpoint;

/* Write ck into directory `dir` atomically (a checkpoint already there is replaced). The
 * parent directory is created. When dir holds files fp8train did not write, they stay: the
 * checkpoint files are then moved in one by one (each rename atomic, state.json last).
 * 0 ok, -1 + err. */
int fp8t_checkpoint_save(const char *dir, const fp8t_checkpoint *ck, char *err, size_t errlen);

/* Read and validate a checkpoint directory. The model config comes from state.json; if
 * expect is non-NULL it must match it (err names the differing field). On success ck owns
 * malloc'd buffers (fp8t_checkpoint_free). */
int fp8t_checkpoint_load(const char *dir, const fp8t_model_config *expect, fp8t_checkpoint *ck,
                         char *err, size_t errlen);
/* state.json only: fills step, data_position, seed, loss, model, fp8_n, fp8_len, config_json,
 * policy_json (no tensors). */
int fp8t_checkpoint_read_state(const char *dir, fp8t_checkpoint *ck, char *err, size_t errlen);
void fp8t_checkpoint_free(fp8t_checkpoint *ck);

/* OUT/checkpoints/step_NNNNNN */
void fp8t_checkpoint_dir(char *buf, size_t len, const char *out_dir, int step);
/* The checkpoint with the highest step under OUT/checkpoints: its step (path into buf), or -1
 * when there is none. Only complete checkpoints of fp8train's count (the exact step_NNNNNN
 * name and a state.json with its format marker); hidden temporaries are ignored. */
int fp8t_checkpoint_latest(const char *out_dir, char *buf, size_t len);
/* Keep the `keep` most recent step_* checkpoints of OUT/checkpoints (keep <= 0: all) and
 * remove stale temporaries left by a crash. Returns how many were removed. Only checkpoints
 * fp8train wrote are counted or removed (fp8t_checkpoint_remove). */
int fp8t_checkpoint_prune(const char *out_dir, int keep);
/* The step of a checkpoint directory name exactly as fp8t_checkpoint_dir writes it
 * ("step_000020"), else -1 ("step_20", "step_000020.bak", "final" are somebody else's). */
int fp8t_checkpoint_step_of_name(const char *name);
/* Remove a checkpoint directory fp8train wrote (its state.json carries fp8train's format
 * marker): its checkpoint files, then the directory if nothing else is in it. Files fp8train
 * did not write are never deleted; their directory then stays (a note on stderr unless quiet).
 * 0 removed, 1 kept, -1 not a checkpoint of fp8train's (nothing touched). */
int fp8t_checkpoint_remove(const char *dir, int quiet);

/* The model config as a JSON object text (malloc'd) and back; from_json checks every field. */
char *fp8t_model_config_to_json(const fp8t_model_config *c);
int fp8t_model_config_from_json(fp8t_model_config *c, const char *json, char *err,
                                size_t errlen);
/* 0 if equal; else -1 and err says which field differs (a: "checkpoint", b: "this run"). */
int fp8t_model_config_diff(const fp8t_model_config *a, const fp8t_model_config *b, char *err,
                           size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
