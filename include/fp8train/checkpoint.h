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
 * or, written by a ZeRO-1 run of W ranks (version 2; "optimizer_shards": W in state.json),
 * instead of optimizer.safetensors one file per rank, written by that rank:
 *   optimizer.rank-RRRRR-of-WWWWW.safetensors  rank R's shard [lo, hi) of the flat moment
 *                          vectors (fp8t_checkpoint_shard): "exp_avg", "exp_avg_sq" (F32
 *                          [hi - lo]), "step" (I64 [1]); metadata offset, count, rank,
 *                          world_size, num_params
 * Loading reads the shards back into the flat layout (any range of it: a run at another N
 * takes its own slice, resharding on load).
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

#define FP8T_CKPT_VERSION 1         /* written without optimizer shards (the plain layout) */
#define FP8T_CKPT_VERSION_SHARDED 2 /* with them; a reader of version 1 refuses it by name */

typedef struct {
    int step;               /* optimizer steps completed */
    uint64_t data_position; /* training stream position (micro-batches consumed) */
    uint64_t seed;          /* the run's seed (data order, init) */
    float loss;             /* training loss of `step` */
    fp8t_model_config model;
    size_t num_params;
    float *params;           /* [num_params] FP32 master weights (host) */
    float *adam_m, *adam_v;  /* AdamW moments (host) of the parameters [adam_lo, adam_hi):
                                 [num_params] unless loaded by fp8t_checkpoint_load_range or
                                 set up for fp8t_checkpoint_write_shard */
    size_t adam_lo, adam_hi; /* adam_hi 0: all num_params (what a memset checkpoint means) */
    int shards;              /* ZeRO-1 optimizer shards it has (0: optimizer.safetensors) */
    int fp8_n, fp8_len;      /* recipe state: n tensors, history length */
    float *fp8_state;        /* [(fp8_len + 3) * fp8_n] (host) */
    char *config_json;       /* the run's resolved config (JSON object text), may be NULL */
    char *policy_json;       /* fp8t_policy_to_json of the policy at this step, may be NULL */
} fp8t_checkpoint;

/* Write ck into directory `dir` atomically (a checkpoint already there is replaced). The
 * parent directory is created. When dir holds files fp8train did not write, they stay: the
 * checkpoint files are then moved in one by one (each rename atomic, state.json last).
 * 0 ok, -1 + err. */
int fp8t_checkpoint_save(const char *dir, const fp8t_checkpoint *ck, char *err, size_t errlen);

/* The sharded save of a ZeRO-1 run, every rank taking part (the ranks in between agree that
 * every step succeeded everywhere; checkpoint.c knows nothing of them):
 *  1. rank 0: fp8t_checkpoint_begin makes the hidden temporary directory next to dir (its path
 *     into tmp, which rank 0 hands to the others);
 *  2. every rank R of W: fp8t_checkpoint_write_shard writes its moments ck->adam_m/adam_v of
 *     [ck->adam_lo, ck->adam_hi), which must be fp8t_checkpoint_shard(num_params, W, R);
 *  3. rank 0: fp8t_checkpoint_commit with ck->shards = W writes the replicated files
 *     (state.json last) and renames tmp to dir atomically, as fp8t_checkpoint_save; or, when
 *     a rank failed, fp8t_checkpoint_abandon removes tmp.
 * fp8t_checkpoint_save is begin + commit with the moments in one file. 0 ok, -1 + err. */
int fp8t_checkpoint_begin(const char *dir, char *tmp, size_t tmplen, char *err, size_t errlen);
int fp8t_checkpoint_write_shard(const char *tmp, const fp8t_checkpoint *ck, int rank, int world,
                                char *err, size_t errlen);
int fp8t_checkpoint_commit(const char *tmp, const char *dir, const fp8t_checkpoint *ck, char *err,
                           size_t errlen);
void fp8t_checkpoint_abandon(const char *tmp);
/* Rank `rank` of `world`'s shard [*lo, *hi) of n parameters: even shards, the first n % world
 * ranks one more (ZeRO-1's split, and the one the shard files are cut by). */
void fp8t_checkpoint_shard(size_t n, int world, int rank, size_t *lo, size_t *hi);
/* The optimizer shard file name of rank of world ("optimizer.rank-00001-of-00002.safetensors") */
void fp8t_checkpoint_shard_name(char *buf, size_t len, int rank, int world);

/* Read and validate a checkpoint directory. The model config comes from state.json; if
 * expect is non-NULL it must match it (err names the differing field). On success ck owns
 * malloc'd buffers (fp8t_checkpoint_free). */
int fp8t_checkpoint_load(const char *dir, const fp8t_model_config *expect, fp8t_checkpoint *ck,
                         char *err, size_t errlen);
/* fp8t_checkpoint_load with the moments of the parameters [lo, hi) only (hi <= num_params):
 * ck->adam_m/adam_v hold hi - lo floats, adam_lo/adam_hi say which. Of a sharded checkpoint
 * only the shard files that overlap the range are read. */
int fp8t_checkpoint_load_range(const char *dir, const fp8t_model_config *expect, size_t lo,
                               size_t hi, fp8t_checkpoint *ck, char *err, size_t errlen);
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
int fp8t_model_config_from_json(fp8t_model_config *c, const char *json, char *err, size_t errlen);
/* 0 if equal; else -1 and err says which field differs (a: "checkpoint", b: "this run"). */
int fp8t_model_config_diff(const fp8t_model_config *a, const fp8t_model_config *b, char *err,
                           size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
