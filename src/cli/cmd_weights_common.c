/* Helpers shared by eval, generate, export and import (see cmd_weights_common.h). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_weights_common.h"
#include "fp8train/data.h"
#include "fp8train/error.h"
#include "fp8train/recipe.h"
#include "fp8train/train_options.h" /* fp8t_options_debug_env */
#include "util/fs.h"

void cli_run_defaults_from(const fp8t_weights *w, cli_run_defaults *d) {
    memset(d, 0, sizeof(*d));
    snprintf(d->data, sizeof(d->data), "synthetic");
    d->batch = 8;
    d->seq_len = w->model.seq_len < 256 ? w->model.seq_len : 256;
    d->val_batches = 10;
    d->seed = w->step || !strcmp(w->kind, "checkpoint") ? w->seed : 1337;
    snprintf(d->device, sizeof(d->device), "cpu");
    cJSON *c = w->config_json ? cJSON_Parse(w->config_json) : NULL;
    if (!c) return;
    const cJSON *v;
    if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(c, "data")) && v->valuestring[0])
        snprintf(d->data, sizeof(d->data), "%s", v->valuestring);
    if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(c, "val_data")))
        snprintf(d->val_data, sizeof(d->val_data), "%s", v->valuestring);
    if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(c, "tokenizer")))
        snprintf(d->tokenizer, sizeof(d->tokenizer), "%s", v->valuestring);
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(c, "batch")) && v->valuedouble >= 1 &&
        v->valuedouble <= 1 << 20)
        d->batch = (int)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(c, "seq_len")) &&
        v->valuedouble >= 1 && v->valuedouble <= w->model.seq_len)
        d->seq_len = (int)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(c, "val_batches")) &&
        v->valuedouble >= 1 && v->valuedouble <= 1e6)
        d->val_batches = (int)v->valuedouble;
    if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(c, "device")) &&
        strlen(v->valuestring) < sizeof(d->device))
        snprintf(d->device, sizeof(d->device), "%s", v->valuestring);
    cJSON_Delete(c);
}

void cli_describe_weights(char *buf, size_t len, const fp8t_weights *w) {
    const fp8t_model_config *c = &w->model;
    int n = snprintf(buf, len, "%s, %s %d layers x %d wide (%d heads), vocab %d", w->kind,
                     fp8t_arch_name(c->arch), c->n_layer, c->n_embd, c->n_head, c->vocab_size);
    if (n < 0 || (size_t)n >= len) return;
    /* what sets Llama-3 / Qwen2 checkpoints apart, when present */
    if (c->n_kv_head > 0 && c->n_kv_head != c->n_head && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", %d K/V heads", c->n_kv_head);
    if (c->untied_head && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", untied head");
    if (c->qkv_bias && (size_t)n < len) n += snprintf(buf + n, len - (size_t)n, ", q/k/v biases");
    if (c->rope_scaling.type == FP8T_ROPE_LLAMA3 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", llama3 RoPE x%g",
                      (double)c->rope_scaling.factor);
    if (n < 0 || (size_t)n >= len) return;
    if (!strcmp(w->kind, "checkpoint"))
        snprintf(buf + n, len - (size_t)n, ", step %d", w->step);
    else
        snprintf(buf + n, len - (size_t)n, ", %s weights",
                 fp8t_export_dtype_name(w->stored_dtype));
}

int cli_calibrate(fp8t_evaluator *ev, fp8t_weights *w, const char *data, const char *val_data,
                  uint64_t seed, int batches, int quiet, char *err, size_t errlen) {
    return cli_calibrate_tok(ev, w, data, val_data, NULL, seed, batches, quiet, err, errlen);
}

int cli_calibrate_tok(fp8t_evaluator *ev, fp8t_weights *w, const char *data, const char *val_data,
                      const char *tokenizer, uint64_t seed, int batches, int quiet, char *err,
                      size_t errlen) {
    if (!fp8t_evaluator_needs_calibration(ev)) return 0;
    char e[FP8T_ERR_LEN];
    fp8t_data *d =
        fp8t_data_open_tok(data, val_data, tokenizer, FP8T_SPLIT_TRAIN, fp8t_evaluator_B(ev),
                           fp8t_evaluator_T(ev), w->model.vocab_size, seed, e, sizeof(e));
    if (!d) {
        return fp8t_errorf(err, errlen, "FP8 calibration data: %s", e);
    }
    fp8t_evaluator_calibrate(ev, d, batches);
    fp8t_data_close(d);
    int n = 3 * fp8t_model_num_linears(&w->model),
        len = fp8t_model_fp8_history_len(fp8t_evaluator_model(ev));
    float *st = malloc(fp8t_recipe_state_floats(n, len) * sizeof(float));
    if (!st) {
        return fp8t_errorf(err, errlen, "out of memory");
    }
    fp8t_evaluator_fp8_state(ev, st, &n, &len);
    free(w->fp8_state);
    w->fp8_state = st;
    w->fp8_n = n;
    w->fp8_len = len;
    if (!quiet)
        fprintf(stderr,
                "fp8train: the weights carry no FP8 amax history (%s); FP8 scales were "
                "calibrated on %d training micro-batch%s of %s\n",
                w->kind, batches, batches == 1 ? "" : "es", data);
    return 1;
}

void cli_infer_opts_init(cli_infer_opts *o) {
    memset(o, 0, sizeof(*o));
    o->act = FP8T_ACT_SCALE_CURRENT;
    o->kv = -1;
    o->calib_batches = 4;
    o->prefetch_mb = -1;
}

const fp8t_opt_choice CLI_ACT_SCALES[] = {{"current", FP8T_ACT_SCALE_CURRENT},
                                          {"delayed", FP8T_ACT_SCALE_DELAYED},
                                          {"calibrated", FP8T_ACT_SCALE_CALIBRATED},
                                          {NULL, 0}};
const fp8t_opt_choice CLI_KV_CACHES[] = {
    {"bf16", FP8T_KV_BF16}, {"fp8", FP8T_KV_FP8}, {"fp32", FP8T_KV_FP32}, {NULL, 0}};
const fp8t_opt_choice CLI_EVAL_PRECISIONS[] = {
    {"bf16", FP8T_EVAL_BF16}, {"fp8", FP8T_EVAL_FP8}, {"fp32", FP8T_EVAL_FP32}, {NULL, 0}};

const char *cli_kv_name(int kv) {
    return kv == FP8T_KV_FP8 ? "fp8" : kv == FP8T_KV_BF16 ? "bf16" : "fp32";
}

void cli_infer_model_opts(const cli_infer_opts *o, fp8t_eval_precision prec,
                          fp8t_infer_opts *out) {
    fp8t_infer_opts_default(out, prec, o->act);
    out->kv = o->kv;
    out->rows = o->rows;
    out->mlp_rows = o->mlp_rows;
    out->prefetch_mb = o->prefetch_mb;
    out->no_graphs = o->no_graphs;
    out->fp8_head = o->fp8_head;
}

int cli_infer_calibrate(fp8t_infer *m, const char *data, const char *val_data,
                        const char *tokenizer, uint64_t seed, int batches, int nb, int T,
                        char *err, size_t errlen) {
    const fp8t_model_config *c = fp8t_infer_config(m);
    char e[FP8T_ERR_LEN];
    if (!fp8t_infer_needs_calibration(m)) return 0;
    fp8t_data *d = fp8t_data_open_tok(data, val_data, tokenizer, FP8T_SPLIT_TRAIN, nb, T,
                                      c->vocab_size, seed, e, sizeof(e));
    if (!d) {
        return fp8t_errorf(err, errlen, "FP8 calibration data: %s", e);
    }
    const size_t per = (size_t)nb * T;
    int *tok = malloc((size_t)batches * per * sizeof(int)), *tgt = malloc(per * sizeof(int));
    int rc = -1;
    if (!tok || !tgt) {
        fp8t_errorf(err, errlen, "FP8 calibration: out of memory");
    } else {
        for (int i = 0; i < batches; i++)
            fp8t_data_batch(d, tok + (size_t)i * per, tgt, (uint64_t)i);
        rc = fp8t_infer_calibrate(m, tok, batches, nb, T, e, sizeof(e));
        if (rc) fp8t_errorf(err, errlen, "FP8 calibration: %s", e);
    }
    free(tok);
    free(tgt);
    fp8t_data_close(d);
    return rc;
}

int cli_check_to(const char *cmd, const char *to, int dir_target, int overwrite,
                 const char *writes) {
    if (!fp8t_path_exists(to)) return 0;
    if (!dir_target) {
        if (fp8t_is_dir(to)) {
            fprintf(stderr, "fp8train %s: --to %s is a directory; give the file to write\n", cmd,
                    to);
            return 2;
        }
        if (overwrite) return 0;
        fprintf(stderr,
                "fp8train %s: --to %s exists; choose another name, or add --overwrite to "
                "replace it\n",
                cmd, to);
        return 2;
    }
    if (!fp8t_is_dir(to)) {
        fprintf(stderr,
                "fp8train %s: --to %s exists and is not a directory; give a new or empty "
                "directory\n",
                cmd, to);
        return 2;
    }
    DIR *d = opendir(to);
    if (!d) {
        fprintf(stderr, "fp8train %s: cannot read --to %s: %s\n", cmd, to, strerror(errno));
        return 2;
    }
    char first[256] = "";
    struct dirent *e;
    while (!first[0] && (e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            snprintf(first, sizeof(first), "%s", e->d_name);
    closedir(d);
    if (!first[0] || overwrite) return 0;
    fprintf(stderr,
            "fp8train %s: --to %s is not empty (it holds %s); give a new or empty "
            "directory, or add --overwrite to write %s into it (replacing those files only; "
            "nothing else there is touched)\n",
            cmd, to, first, writes);
    return 2;
}

int cli_debug_options(const char *cmd, cli_debug_opts *o) {
    char err[FP8T_ERR_LEN];
    memset(o, 0, sizeof(*o));
    if (fp8t_options_debug_env(&o->model, &o->backend, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train %s: environment: %s\n", cmd, err);
        return -1;
    }
    return 0;
}
