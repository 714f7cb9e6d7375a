/* fp8train — the options of `fp8train train`, shared by the command line, --config JSON files
 * and the config.json a run writes (which is itself a valid --config file).
 *
 * Every option has one name, used as --name on the command line and as "name" (or with '_'
 * for '-') in JSON. Precedence: defaults < config file < environment (FP8TRAIN_PRECISION,
 * FP8TRAIN_FPROP / _DGRAD / _WGRAD, the debugging switches of fp8t_options_debug_env) <
 * command line. This file is where fp8train reads its environment: the library takes every
 * setting as an argument. --preset is applied before the model tweaks (--layers, --dim, ...)
 * wherever they come from. */
#ifndef FP8TRAIN_TRAIN_OPTIONS_H
#define FP8TRAIN_TRAIN_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

#include "fp8train/dist.h"
#include "fp8train/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Set one option by name ("batch", "--batch", "seq_len" all work). 0 ok; -1 and err names
 * the option, the bad value and the expected values. Flags take "1"/"0"/"true"/"false". */
int fp8t_train_option_set(fp8t_train_config *c, const char *name, const char *value, char *err,
                          size_t errlen);

/* Parse `fp8train train` arguments (argv[0] is the first option, not the program name) on
 * top of the defaults, with the precedence above; then fp8t_train_config_check. Returns 0 ok,
 * 1 when --help was asked for, 2 for --list-options (nothing else done then), -1 on bad usage
 * with err filled. With
 * --resume and no model option anywhere, the model comes from the checkpoint's state.json. */
int fp8t_train_parse_args(fp8t_train_config *c, int argc, char **argv, char *err, size_t errlen);

/* Apply a JSON object of options (a --config file's text). 0 ok, -1 + err (naming the key). */
int fp8t_train_config_apply_json(fp8t_train_config *c, const char *json, char *err,
                                 size_t errlen);

/* Resolve and validate: seq_len 0 -> the model's; the model config; seq_len <= max; sizes
 * positive; the policy's fields; the shadow action. 0 ok, -1 + err naming the option. */
int fp8t_train_config_check(fp8t_train_config *c, char *err, size_t errlen);

/* The full resolved config as a JSON object (malloc'd): every option, "model" and "policy"
 * (fp8t_policy_to_json) and "policy_description". Readable back by apply_json. */
char *fp8t_train_config_to_json(const fp8t_train_config *c);

/* Every option with its argument, meaning and default, grouped (`fp8train train --help`). */
void fp8t_train_options_help(FILE *f);
/* `fp8train train --list-options`: "--name ARG" of every option, one a line. */
void fp8t_train_options_list(FILE *f);

/* The launcher's announcement (OpenMPI, PMIx, MPICH or Slurm variables: world size and local
 * rank; 1 / 0 without a launcher) and FP8TRAIN_NCCL_TIMEOUT (seconds, default 300), read from
 * the environment here, where fp8train reads its environment; the command hands it to
 * fp8t_dist_set_launch before anything starts. */
void fp8t_options_launch(fp8t_dist_launch *l);

/* The debugging switches as the environment spells them (FP8TRAIN_NO_FUSED_XENT=1 ...,
 * FP8TRAIN_CUDA_PLAIN / _NO_LT_FP8 / _SYNC=1, FP8TRAIN_CUDA_ATTN=IMPL: the variables of
 * --disable, --cuda-sync, --cuda-attn), added to *m and *b. `train` applies them between a
 * config file and the command line; the commands without those options (eval, generate,
 * inspect, export) and bench/gpu_bench take them as they are. 0 ok; -1 + err on a bad value. */
int fp8t_options_debug_env(fp8t_model_options *m, fp8t_backend_options *b, char *err,
                           size_t errlen);

/* Parsed --shadow-action: 0 warn, 1 fallback (M steps in *fallback_steps), 2 rollback;
 * -1 if malformed. */
int fp8t_shadow_action_parse(const char *s, int *fallback_steps);

#define FP8T_VERSION "0.1.0"

#ifdef __cplusplus
}
#endif
#endif
