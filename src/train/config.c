/* Training config defaults: a run that needs no options (tiny model, synthetic language, FP8
 * delayed scaling, hybrid format) and learns visibly within a few hundred steps on a CPU. */
#include <string.h>

#include "fp8train/train.h"

void fp8t_train_config_default(fp8t_train_config *c) {
    memset(c, 0, sizeof(*c));
    strcpy(c->preset, "tiny");
    if (fp8t_model_preset(&c->model, c->preset) != 0) memset(&c->model, 0, sizeof(c->model));
    strcpy(c->data, "synthetic");
    c->batch = 8;
    c->seq_len = 0; /* 0: the model's seq_len (resolved by fp8t_train_config_check) */
    c->grad_accum = 1;
    c->steps = 500;
    c->lr = 2e-3f;
    c->min_lr_frac = 0.1f;
    c->warmup = 20;
    c->weight_decay = 0.1f;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->adam_eps = 1e-8f;
    c->grad_clip = 1.0f;
    c->seed = 1337;
    fp8t_policy_default(&c->policy);
    strcpy(c->device, "cpu");
    strcpy(c->out_dir, "runs/train");
    c->ckpt_every = 0;
    c->keep_ckpts = 3;
    c->val_every = 50;
    c->inspect_dump_mb = 2048;
    c->val_batches = 4;
    c->progress_every = 10;
    c->drift_threshold = 0.01f;
    c->spike_window = 50;
    c->spike_z = 6.0f;
    c->detect_nan = 1;
    c->shadow_every = 0;
    strcpy(c->shadow_action, "warn");
    c->shadow_threshold = 0.02f;
    c->amax_reduce = 1;
    c->bucket_mb = 25.0f;
}
