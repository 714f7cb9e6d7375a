/* Helpers shared by tests/test_export.c and tests/test_eval.c: train a tiny model a few steps
 * with the model API (FP8 delayed scaling, so the checkpoint has a real amax history) and save
 * it as a training checkpoint. */
#ifndef FP8TRAIN_EXPORT_TEST_UTIL_H
#define FP8TRAIN_EXPORT_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp8train/backend.h"
#include "fp8train/checkpoint.h"
#include "fp8train/policy_json.h"
#include "fp8train/data.h"
#include "fp8train/export.h"
#include "fp8train/io.h"
#include "fp8train/model.h"
#include "fp8train/policy.h"
#include "fp8train/recipe.h"

#define TU_B 4
#define TU_T 32

/* A fresh scratch directory under /tmp (removed first if it exists). */
static void tu_tmpdir(char *buf, size_t len, const char *tag) {
    snprintf(buf, len, "/tmp/fp8t_%s_%ld", tag, (long)getpid());
    fp8t_rmtree(buf);
    fp8t_mkdirs(buf, NULL, 0);
}

/* Train `steps` optimizer steps of a 2-layer, 64-wide version of preset `preset` (FP8 delayed, history 16) on the synthetic
 * corpus and write the checkpoint to ckpt_dir. 0 ok. */
static int tu_train_checkpoint(const char *preset, int steps, const char *ckpt_dir) {
    char err[512];
    fp8t_model_config cfg;
    if (fp8t_model_preset(&cfg, preset) != 0) return -1;
    /* the preset, shrunk so the tests take seconds on two cores */
    cfg.n_layer = 2;
    cfg.n_embd = 64;
    cfg.n_head = 4;
    cfg.seq_len = 64;
    cfg.mlp_hidden = cfg.arch == FP8T_ARCH_GPT2 ? 256 : 192;
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    if (!be) {
        printf("  backend: %s\n", err);
        return -1;
    }
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.history_len = 16;
    fp8t_model *m = fp8t_model_create(be, &cfg, &pol, NULL, TU_B, TU_T, err, sizeof(err));
    fp8t_data *d = fp8t_data_open("synthetic", "", FP8T_SPLIT_TRAIN, TU_B, TU_T, cfg.vocab_size,
                                  1234, err, sizeof(err));
    if (!m || !d) {
        printf("  setup: %s\n", err);
        return -1;
    }
    fp8t_model_init_weights(m, 1234);
    int tok[TU_B * TU_T], tgt[TU_B * TU_T];
    float loss = 0.0f;
    for (int s = 1; s <= steps; s++) {
        fp8t_model_zero_grad(m);
        fp8t_data_next(d, tok, tgt);
        loss = fp8t_model_forward(m, tok, tgt);
        fp8t_model_backward(m, 1.0f);
        float gn = fp8t_model_grad_norm(m);
        fp8t_model_adamw(m, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 1.0f, gn);
        fp8t_model_end_step(m);
    }
    fp8t_checkpoint ck;
    memset(&ck, 0, sizeof(ck));
    ck.step = steps;
    ck.data_position = fp8t_data_position(d);
    ck.seed = 1234;
    ck.loss = loss;
    ck.model = cfg;
    ck.num_params = fp8t_model_num_params(m);
    size_t bytes = ck.num_params * sizeof(float);
    ck.params = malloc(bytes);
    ck.adam_m = malloc(bytes);
    ck.adam_v = malloc(bytes);
    ck.fp8_n = fp8t_model_fp8_count(m);
    ck.fp8_len = fp8t_model_fp8_history_len(m);
    size_t sb = fp8t_recipe_state_floats(ck.fp8_n, ck.fp8_len) * sizeof(float);
    ck.fp8_state = malloc(sb);
    be->ops->to_host(be, ck.params, fp8t_model_params(m), bytes);
    be->ops->to_host(be, ck.adam_m, fp8t_model_adam_m(m), bytes);
    be->ops->to_host(be, ck.adam_v, fp8t_model_adam_v(m), bytes);
    be->ops->to_host(be, ck.fp8_state, fp8t_model_fp8_state(m), sb);
    ck.policy_json = fp8t_policy_to_json(&pol);
    int rc = fp8t_checkpoint_save(ckpt_dir, &ck, err, sizeof(err));
    if (rc != 0) printf("  checkpoint save: %s\n", err);
    fp8t_checkpoint_free(&ck);
    fp8t_data_close(d);
    fp8t_model_destroy(m);
    fp8t_backend_destroy(be);
    return rc;
}

#endif
